"""How fast can a Triton program stream FP4 weight bytes in the pattern the MoE kernels read them?

The decode-regime GEMMs (T = 4-256) reach only 0.5-0.65 of the memory floor while their instruction issue sits
well below its limit. This probe removes the arithmetic: each program of a [row blocks, K slices] grid reads a
[ROWS, STEP-byte] tile per K step, exactly as the GEMM tiles do (cp.async into shared memory, num_stages deep),
and folds it with xor. It compares layouts of the same bytes (LAYOUTS): row-major (a row's K bytes contiguous,
rows H/2 bytes apart: a step reads ROWS separate STEP-byte pieces), each program tile contiguous, and row groups
stored as 16-byte-wide tiles. Same run: the read-only reduction bandwidth of backends.gpu_timing.measure_ceilings.

    python benchmarks/probe_weight_streaming.py          # needs a CUDA GPU; prints a markdown table
"""

from __future__ import annotations

import functools
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from backends.gpu_timing import GIB, Flusher  # noqa: E402
from backends.gpu_timing import events_ms as _events_ms  # noqa: E402

#: (name, rows of the matrix, bytes per row): gpt-oss-120b w13 (K = 2880) and deepseek-v3 w13 (K = 7168)
MATRICES = (("gpt-oss-120b w13", 128 * 5760, 1440), ("deepseek-v3 w13", 128 * 4096, 3584))
#: (rows per tile, bytes per row per K step, warps, stages): the committed decode tiles' shapes and neighbours
TILES = ((64, 64, 2, 4), (64, 64, 4, 3), (64, 32, 2, 4), (32, 32, 1, 4), (128, 64, 4, 3), (64, 128, 4, 3))


#: Layouts compared: the kernels' old row-major weights, whole program tiles contiguous, and row groups of 32 or 64
#: rows stored as contiguous 16-byte-wide tiles (a K step reads one rows x STEP piece per group).
LAYOUTS = (("row-major", 0, 1), ("program tiles", 1, 1), ("32-row groups", 2, 32), ("64-row groups", 2, 64))


@triton.jit
def stream_kernel(w_ptr, out_ptr, row_words, steps, LAYOUT: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr,
                  STEP: tl.constexpr, STAGES: tl.constexpr):
    """Program (row block r, K slice s): xor of the row block's words over its `steps` K steps."""
    r = tl.program_id(0)
    s = tl.program_id(1)
    WORDS: tl.constexpr = STEP // 4
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, WORDS)
    acc = tl.zeros((ROWS, WORDS), dtype=tl.int32)
    for step in tl.range(0, steps, num_stages=STAGES):
        k = s * steps + step
        if LAYOUT == 1:  # tile (r, k) is ROWS * STEP contiguous bytes
            base = (r.to(tl.int64) * (row_words // WORDS) + k) * (ROWS * WORDS)
            ptrs = w_ptr + base + rows[:, None] * WORDS + cols[None, :]
        elif LAYOUT == 2:  # GROUP x 16-byte tiles, a group's tiles in K order
            n = r.to(tl.int64) * ROWS + rows
            w = k * WORDS + cols
            ptrs = w_ptr + (((n // GROUP) * (row_words // 4))[:, None] + (w // 4)[None, :]) * (GROUP * 4) \
                + ((n % GROUP) * 4)[:, None] + (w % 4)[None, :]
        else:
            base = r.to(tl.int64) * ROWS * row_words + k * WORDS
            ptrs = w_ptr + base + rows[:, None] * row_words + cols[None, :]
        acc ^= tl.load(ptrs)
    tl.store(out_ptr + (r * tl.num_programs(1) + s) * ROWS * WORDS + rows[:, None] * WORDS + cols[None, :], acc)


def main() -> None:
    flush = Flusher()
    src = torch.empty(2 * GIB, dtype=torch.uint8, device="cuda").random_()
    read_ms = min(_events_ms(src.view(torch.float32).sum, lambda: None, 10) for _ in range(2))
    read_gbs = 2 * GIB / read_ms / 1e6
    src = None
    print(f"# {torch.cuda.get_device_name()}: read-only reduction {read_gbs:.0f} GB/s (same run)\n")
    names = [name for name, _, _ in LAYOUTS]
    print("| matrix | MB | tile rows x bytes | warps | stages | K slices | " + " | ".join(f"{n} GB/s" for n in names)
          + " | " + " | ".join(f"{n} / read-only" for n in names) + " |")
    print("|---" * (6 + 2 * len(names)) + "|")
    for name, n_rows, row_bytes in MATRICES:
        w = torch.empty(n_rows * row_bytes, dtype=torch.uint8, device="cuda").random_().view(torch.int32)
        for rows, step, warps, stages in TILES:
            steps_total = row_bytes // step
            for slices in (1, 4):
                if steps_total % slices:
                    continue
                out = torch.empty((n_rows // rows) * slices * rows * (step // 4), dtype=torch.int32, device="cuda")
                result = []
                for _, layout, group in LAYOUTS:
                    run = functools.partial(stream_kernel[(n_rows // rows, slices)], w, out, row_bytes // 4,
                                            steps_total // slices, LAYOUT=layout, GROUP=group, ROWS=rows, STEP=step,
                                            STAGES=stages, num_warps=warps)
                    run()
                    ms = _events_ms(run, flush, 10)
                    result.append(n_rows * row_bytes / ms / 1e6)
                print(f"| {name} | {n_rows * row_bytes / 1e6:.0f} | {rows} x {step} | {warps} | {stages} | {slices} | "
                      + " | ".join(f"{g:.0f}" for g in result) + " | "
                      + " | ".join(f"{g / read_gbs:.2f}" for g in result) + " |")
        w = None


if __name__ == "__main__":
    main()
