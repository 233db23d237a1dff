"""What does reading a T = 1 layer's weights cost as two launches, as one, and as one persistent launch with a grid
barrier? A bound for the decode kernels (issue 26: gpt-oss-120b at T = 1 needs 0.60 of the memory floor).

At T = 1 the layer reads its top-k experts' GEMM1 bytes (2/3 of each expert) in GEMV1, then their GEMM2 bytes in
GEMV2, which needs GEMV1's output. This probe streams int32 words of exactly those sizes with plain Triton loads
(an XOR of everything read, so that nothing is skipped), each variant as a CUDA graph replayed after the 256 MiB
read flush, the best of 3 medians of 50 (`backends.gpu_timing`, as every GPU benchmark here):

    GEMM1 bytes alone / GEMM2 bytes alone           what each kernel's read costs by itself
    GEMM2 bytes addressed through a word read first a dependent prologue's cost (a decode kernel reads ids first)
    two launches                                    the decode kernels' structure
    one launch, GEMM1 bytes then GEMM2 bytes        no boundary (what a single kernel could at best do)
    one persistent launch (a program per SM), a grid barrier between the two reads, the GEMM2 bytes loaded
        before the barrier (held in registers) or after it
    an empty kernel                                 the graph replay's own cost
    this project's layer at T = 1                   the decode kernels on the same bytes, in the same process
    each kernel's own time (torch.profiler)         the layer's kernels against the two plain reads

    python benchmarks/probe_decode_stream_bound.py --out DIR [--layer gpt-oss-120b]   # CUDA GPU

It writes DIR/stream_bound.csv (µs, and the fraction of the floor of the bytes read at the run's bandwidth).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from backends.gpu_timing import expert_bytes  # noqa: E402
from backends.model_shapes import SHAPES  # noqa: E402

BLOCK = 4096  # int32 words a program reads per loop step
HELD = 32768  # int32 words of GEMM2's bytes a persistent program holds: 128 KiB, 32 registers a thread at 32 warps
#: (a power of two: gpt-oss-120b's GEMM2 bytes are 133 KiB an SM of an H100, so that variant reads 2% fewer)


def layer_words(layer: str) -> tuple[int, int]:
    """(GEMM1 words, GEMM2 words): the int32 words of the layer's top-k experts' packed weights and scales at T = 1,
    GEMM1's [2I, H] being 2/3 of each expert and GEMM2's [H, I] 1/3."""
    shape = SHAPES[layer]
    per_expert = expert_bytes(shape.format, shape.hidden_size, shape.intermediate_size)
    return shape.top_k * per_expert * 2 // 3 // 4, shape.top_k * per_expert // 3 // 4


@triton.jit
def _read(acc, ptr, first, count, BLOCK: tl.constexpr):
    """acc XOR every word of ptr[first:first + count]: whole steps unmasked, then the rest masked."""
    base = ptr + first
    whole = count // BLOCK * BLOCK
    for i in range(0, whole, BLOCK):
        acc ^= tl.load(base + i + tl.arange(0, BLOCK))
    if whole < count:
        offs = whole + tl.arange(0, BLOCK)
        acc ^= tl.load(base + offs, mask=offs < count, other=0)
    return acc


@triton.jit
def _share(n_per_program, total):
    """(first word, words) of this program's share."""
    first = tl.program_id(0).to(tl.int64) * n_per_program
    return first, tl.maximum(tl.minimum(n_per_program, total - first), 0).to(tl.int32)


@triton.jit
def _stream(a_ptr, n_per_program, total, out_ptr, BLOCK: tl.constexpr):
    """Program p reads words p * n .. (p + 1) * n of the total."""
    first, count = _share(n_per_program, total)
    acc = _read(tl.zeros([BLOCK], tl.int32), a_ptr, first, count, BLOCK)
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(acc, 0))


@triton.jit
def _stream_indirect(a_ptr, id_ptr, n_per_program, total, out_ptr, BLOCK: tl.constexpr):
    """_stream with the program's words found through a word read first (it holds 0): a dependent prologue, as a
    decode kernel reads its expert's id before it can address that expert's weights."""
    first, count = _share(n_per_program, total)
    acc = _read(tl.zeros([BLOCK], tl.int32), a_ptr, first + tl.load(id_ptr), count, BLOCK)
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(acc, 0))


@triton.jit
def _stream_both(a_ptr, na, a_total, b_ptr, nb, b_total, out_ptr, BLOCK: tl.constexpr):
    """Program p reads its share of A, then its share of B: one launch, no boundary."""
    first, count = _share(na, a_total)
    acc = _read(tl.zeros([BLOCK], tl.int32), a_ptr, first, count, BLOCK)
    first, count = _share(nb, b_total)
    acc = _read(acc, b_ptr, first, count, BLOCK)
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(acc, 0))


@triton.jit
def _persistent(a_ptr, na, a_total, b_ptr, counter_ptr, out_ptr, programs, BLOCK: tl.constexpr, HELD: tl.constexpr,
                B_FIRST: tl.constexpr):
    """A program per SM (all resident): its share of A, a grid barrier, then its HELD words of B, loaded before the
    barrier (B_FIRST: their read overlaps A's) or after it. The counter is never reset: each launch's programs wait
    for the next multiple of `programs`, so graph replays need no memset."""
    pid = tl.program_id(0)
    if B_FIRST:
        held = tl.load(b_ptr + pid.to(tl.int64) * HELD + tl.arange(0, HELD))
    first, count = _share(na, a_total)
    acc = _read(tl.zeros([BLOCK], tl.int32), a_ptr, first, count, BLOCK)
    ticket = tl.atomic_add(counter_ptr, 1, sem="release")
    end = (ticket // programs + 1) * programs
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire")
    while seen < end:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire")
    if not B_FIRST:
        held = tl.load(b_ptr + pid.to(tl.int64) * HELD + tl.arange(0, HELD))
    tl.store(out_ptr + pid, tl.xor_sum(acc, 0) ^ tl.xor_sum(held, 0))


def _run(out_dir: str, layer: str) -> None:
    import torch

    from backends.gpu_timing import Flusher, events_ms, graph_of, measure_ceilings, profile_kernels

    bandwidth = measure_ceilings()[0]
    flush = Flusher()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    words1, words2 = layer_words(layer)
    a = torch.randint(0, 1 << 30, (words1,), dtype=torch.int32, device="cuda")
    b = torch.randint(0, 1 << 30, (max(words2, sms * HELD),), dtype=torch.int32, device="cuda")
    out = torch.zeros(8 * sms, dtype=torch.int32, device="cuda")
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    zero_id = torch.zeros(1, dtype=torch.int32, device="cuda")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "stream_bound.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["gpu", "layer", "variant", "programs", "warps", "MB", "us", "floor_us", "floor_fraction"])

        def record(variant, fn, words, programs, warps):
            us = min(events_ms(graph_of(fn).replay, flush, 50) for _ in range(3)) * 1e3
            floor = words * 4 / bandwidth / 1e3  # bandwidth in GB/s
            writer.writerow([torch.cuda.get_device_name(), layer, variant, programs, warps, f"{words * 4 / 1e6:.1f}",
                             f"{us:.1f}", f"{floor:.1f}", f"{floor / us:.2f}" if words else ""])
            f.flush()
            print(f"{variant}, {programs} programs of {warps} warps: {us:.1f} µs", flush=True)

        def read(buf, words, programs=sms, warps=32):
            """A launch of the plain read of buf's words."""
            return lambda: _stream[(programs,)](buf, -(-words // programs), words, out, BLOCK=BLOCK, num_warps=warps)

        for programs, warps in ((sms, 32), (4 * sms, 8), (8 * sms, 4)):
            read1, read2 = read(a, words1, programs, warps), read(b, words2, programs, warps)
            record("GEMM1 bytes alone", read1, words1, programs, warps)
            record("GEMM2 bytes alone", read2, words2, programs, warps)
            record("GEMM2 bytes alone, addressed through a word read first", lambda programs=programs, warps=warps:
                   _stream_indirect[(programs,)](b, zero_id, -(-words2 // programs), words2, out, BLOCK=BLOCK,
                                                 num_warps=warps), words2, programs, warps)
            record("two launches", lambda read1=read1, read2=read2: (read1(), read2()), words1 + words2, programs,
                   warps)
            record("one launch", lambda programs=programs, warps=warps: _stream_both[(programs,)](
                a, -(-words1 // programs), words1, b, -(-words2 // programs), words2, out, BLOCK=BLOCK,
                num_warps=warps), words1 + words2, programs, warps)
        for b_first in (True, False) if words2 <= 1.05 * sms * HELD else ():  # what a program can hold in registers
            def persistent(b_first=b_first):
                _persistent[(sms,)](a, -(-words1 // sms), words1, b, counter, out, sms, BLOCK=BLOCK, HELD=HELD,
                                    B_FIRST=b_first, num_warps=32)
            when = "held from the start" if b_first else "read after the barrier"
            record(f"one persistent launch, GEMM2 bytes {when}", persistent, words1 + sms * HELD, sms, 32)
        record("an empty kernel", read(a, 0, 1, 4), 0, 1, 4)
        layer_call = _layer_at_t1(layer)
        record("this project's layer at T = 1 (routing, both GEMMs, top-k sum)", layer_call, words1 + words2, 0, 0)
        # each kernel's own time (torch.profiler, eager, flushed): the layer's kernels against the plain reads'
        for label, fn in (("GEMM1 bytes alone", read(a, words1)), ("GEMM2 bytes alone", read(b, words2)),
                          ("this project's layer", layer_call)):
            for kernel, us in profile_kernels(fn, flush):
                if "reduce" not in kernel and "Memset" not in kernel:  # the flush's read and its output's memset
                    writer.writerow([torch.cuda.get_device_name(), layer, f"{label}: kernel {kernel[:60]}", "", "",
                                     "", f"{us:.1f}", "", ""])
                    print(f"{label}: kernel {kernel[:60]}: {us:.1f} µs (profiler)", flush=True)


def _layer_at_t1(layer: str):
    """A call of this project's Triton layer on one token (random weights of the layer's shape, router logits),
    which reads the same bytes as the two-launch variants: the decode kernels' own cost beside the bound."""
    import torch

    from backends.layouts.triton_moe import to_kernel_layout
    from backends.triton_moe import moe_forward
    from backends.triton_moe.testing import activation_kwargs, random_checkpoint

    shape = SHAPES[layer]
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = to_kernel_layout(**random_checkpoint(shape, device="cuda", generator=gen))
    x = torch.randn(1, shape.hidden_size, device="cuda", generator=gen).bfloat16()
    logits = torch.randn(1, shape.experts, device="cuda", generator=gen)
    return lambda: moe_forward(x, weights, router_logits=logits, top_k=shape.top_k, **activation_kwargs(shape))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the results directory (benchmarks/results/<run>)")
    parser.add_argument("--layer", default="gpt-oss-120b", choices=sorted(SHAPES), help="the layer whose bytes to read")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (this machine has none)")
    _run(args.out, args.layer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
