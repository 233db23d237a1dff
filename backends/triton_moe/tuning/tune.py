"""`moe-oracle tune`: time the candidate configs of one layer shape at the T buckets on this GPU and write the
fastest into the user's tuning table, which select_config reads before the shipped tables. CUDA only. The tables
hold tile configs, and on sm_90 name the warp-specialized prefill kernels where those timed faster than the best
tiles (times_warp_specialized; the entry keeps the tiles for W4A8 calls). Up to DECODE_KERNEL_TOKENS tokens W4A16
calls (and W4A8 ones on MXFP4 weights) run the decode kernels whatever the table says (their warps come from
tuning.decode_kernels), and the entries there serve the other W4A8 calls."""

from __future__ import annotations

import functools
import re
import sys
import time
from pathlib import Path

from backends.triton_moe.tuning import tables, writer
from backends.triton_moe.tuning.candidates import sweep_candidates
from backends.triton_moe.tuning.configs import MoEConfig, Problem, launch_dict
from backends.triton_moe.tuning.heuristics import DECODE_KERNEL_TOKENS

#: The T buckets tune measures by default (each entry then serves up to the geometric middle of the next).
TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 16384)
#: Rows per expert (T·k/E) from which tune also times the warp-specialized prefill kernels (their blocks are 64-256
#: rows; on an H200 they won from about 512: benchmarks/results/ws-prefill-h200-2026-11-28/).
WS_MIN_ROWS_PER_EXPERT = 128


def times_warp_specialized(arch_name: str, problem: Problem, runs_here: bool) -> bool:
    """Whether tune times the warp-specialized prefill kernels at this T beside the tiles: on sm_90, past the decode
    kernels' T, from WS_MIN_ROWS_PER_EXPERT rows an expert, where they run this shape here (runs_here:
    warp_specialized.ws_unsupported found nothing)."""
    return (arch_name == "sm90" and runs_here and problem.tokens > DECODE_KERNEL_TOKENS
            and problem.rows_per_expert >= WS_MIN_ROWS_PER_EXPERT)


class Progress:
    """One self-overwriting line on stderr: [#####.....] done/total and what is being timed."""

    def __init__(self, total: int, stream=sys.stderr, width: int = 30):
        self.total, self.done, self.stream, self.width = max(total, 1), 0, stream, width
        self.tty = hasattr(stream, "isatty") and stream.isatty()

    def step(self, what: str) -> None:
        self.done += 1
        filled = self.width * self.done // self.total
        line = f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {what}"
        self.stream.write(("\r" + line.ljust(100)) if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")


def gpu_table_name(gpu_name: str) -> str:
    """The user table file of a GPU: its name without the vendor, lower-case words joined by '-'."""
    words = re.sub(r"^NVIDIA\s+", "", gpu_name, flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", words.lower()).strip("-") + ".yaml"


def table_gpu_word(gpu_name: str) -> str:
    """The `gpu` field a table written on this device gets: the model word (H100, H200, A100-SXM4-80GB, ...)."""
    words = re.sub(r"^NVIDIA\s+", "", gpu_name, flags=re.IGNORECASE).split()
    return words[0] if words else gpu_name


def tune_shape(shape, tokens_list=TOKENS, *, iters: int = 10, progress_stream=sys.stderr, seed: int = 0) -> dict:
    """Time the heuristic config and every candidate at each T; returns {"gpu", "arch", "rows": [per T: tokens,
    heuristic config/µs, best config/µs, tile candidates and failures, the warp-specialized µs or why it failed
    where timed]}. Weights are random in the shape's format (speed does not depend on the values)."""
    import torch

    from backends.gpu_timing import Flusher
    from backends.gpu_timing import time_graph as time_layer
    from backends.layouts.triton_moe import to_kernel_layout
    from backends.triton_moe import moe_forward
    from backends.triton_moe.testing import activation_kwargs, random_checkpoint
    from backends.triton_moe.tuning import device_gpu, heuristic_config
    from backends.triton_moe.warp_specialized import ws_unsupported

    device = torch.device("cuda")
    arch, gpu = device_gpu(device)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    weights = to_kernel_layout(**random_checkpoint(shape, device="cuda", generator=gen))
    ws_runs = ws_unsupported(weights, device) is None
    act = activation_kwargs(shape)
    flush = Flusher()
    plans = []
    for tokens in tokens_list:
        problem = Problem(tokens=tokens, **shape.fields())
        base = heuristic_config(arch, gpu.sm_count, problem)
        plans.append((tokens, base, sweep_candidates(problem, base)))
    progress = Progress(sum(len(c) for _, _, c in plans), progress_stream)
    rows = []
    for tokens, base, candidates in plans:
        x = torch.randn(tokens, shape.hidden_size, device="cuda", generator=gen).bfloat16()
        logits = torch.randn(tokens, shape.experts, device="cuda", generator=gen)
        timed, failures = [], 0
        for index, (gemm1, gemm2) in enumerate(candidates):
            progress.step(f"T={tokens} candidate {index + 1}/{len(candidates)}")
            config = MoEConfig(gemm1, gemm2, "candidate")
            try:
                us = time_layer(functools.partial(moe_forward, x, weights, router_logits=logits, top_k=shape.top_k,
                                                  config=config, **act), flush, iters)
            except Exception:  # noqa: BLE001  a tile that does not fit this GPU (shared memory, registers)
                failures += 1
                torch.cuda.synchronize()
                continue
            timed.append((us, gemm1, gemm2))
        if not timed:
            raise RuntimeError(f"tune: every candidate failed at T={tokens} on {gpu.name}")
        heuristic_us = next((us for us, g1, g2 in timed if (g1, g2) == (base.gemm1, base.gemm2)), None)
        best = min(timed, key=lambda t: t[0])
        prefill_kernel, best_us, ws_us, ws_error = "tiles", best[0], None, None
        if times_warp_specialized(arch.name, Problem(tokens=tokens, **shape.fields()), ws_runs):
            # the entry keeps the best tiles (W4A8 calls and other GPUs run them); a faster prefill names its kernels
            config = MoEConfig(best[1], best[2], "candidate", prefill_kernel="warp-specialized")
            try:
                ws_us = time_layer(functools.partial(moe_forward, x, weights, router_logits=logits,
                                                     top_k=shape.top_k, config=config, **act), flush, iters)
            except Exception as exc:  # noqa: BLE001  reported beside the tiles (e.g. no memory for its weights)
                torch.cuda.synchronize()
                ws_error = f"{type(exc).__name__}: {exc}"
            if ws_us is not None and ws_us < best_us:
                prefill_kernel, best_us = "warp-specialized", ws_us
        rows.append({"tokens": tokens, "heuristic": (base.gemm1, base.gemm2), "heuristic_us": heuristic_us,
                     "best": (best[1], best[2]), "best_us": best_us, "prefill_kernel": prefill_kernel,
                     "failures": failures, "candidates": len(candidates), "ws_us": ws_us, "ws_error": ws_error})
    progress.close()
    return {"gpu": gpu.name, "arch": arch.name, "rows": rows}


def table_from_tuning(shape, result: dict, run: str, existing: dict | None) -> dict:
    """The user table of this GPU with entries for `shape` at every tuned T (replacing its older entries)."""
    tokens = [r["tokens"] for r in result["rows"]]
    new = []
    for (low, high), row in zip(writer.token_ranges(tokens), result["rows"], strict=True):
        gemm1, gemm2 = row["best"]
        new.append(writer.entry(shape.fields(), low, high, row["tokens"], row["best_us"], run, launch_dict(gemm1),
                                launch_dict(gemm2), row["heuristic_us"], row.get("prefill_kernel", "tiles")))
    base = existing or {"table": tables.TABLE_KIND, "version": tables.TABLE_VERSION, "arch": result["arch"],
                        "gpu": table_gpu_word(result["gpu"]),
                        "why": f"Measured by `moe-oracle tune` on {result['gpu']}: the fastest candidate per T.",
                        "entries": []}
    return writer.merge_entries(base, new)


def run_tune(shape, tokens_list=TOKENS, *, iters: int = 10, out_dir: Path | None = None, out=sys.stdout) -> Path:
    """tune_shape, then merge into <user dir>/<gpu>.yaml (an existing broken file is an error naming it) and print
    µs before (heuristic) -> after per T."""
    directory = out_dir or tables.user_table_dir()
    result = tune_shape(shape, tokens_list, iters=iters)
    path = directory / gpu_table_name(result["gpu"])
    existing = tables.read_table(path) if path.exists() else None
    run = time.strftime("tune-%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    writer.write_table(path, table_from_tuning(shape, result, run, existing))
    tables.reload_user_tables()
    for line in report_lines(shape, result):
        print(line, file=out)
    print(f"wrote {path}", file=out)
    return path


def report_lines(shape, result: dict) -> list[str]:
    """What tune prints per T: µs before (heuristic) -> after, the kernels chosen, the candidates that could not run
    and, where timed, the warp-specialized prefill kernels' µs or why they failed."""
    lines = [f"{shape.name} ({shape.format}, E={shape.experts}, k={shape.top_k}, H={shape.hidden_size}, "
             f"I={shape.intermediate_size}) on {result['gpu']}: µs heuristic -> tuned"]
    for row in result["rows"]:
        before = f"{row['heuristic_us']:.1f}" if row["heuristic_us"] is not None else "failed"
        gain = f" ({row['heuristic_us'] / row['best_us']:.2f}x)" if row["heuristic_us"] else ""
        g1 = row["best"][0]
        decode = "  (W4A16 runs the decode kernels at this T; the entry serves W4A8 calls off them)" \
            if row["tokens"] <= DECODE_KERNEL_TOKENS else ""
        kernels = ("warp-specialized prefill kernels" if row.get("prefill_kernel") == "warp-specialized" else
                   f"gemm1 {g1.block_m}x{g1.block_n}x{g1.block_k} w{g1.num_warps} s{g1.num_stages} split {g1.split_k}")
        notes = []
        if row.get("failures"):
            notes.append(f"{row['failures']} of {row.get('candidates', '?')} tile candidates could not run here")
        if row.get("ws_us") is not None:
            notes.append(f"warp-specialized prefill {row['ws_us']:.1f}")
        if row.get("ws_error"):
            notes.append(f"warp-specialized prefill failed ({row['ws_error'][:200]}); the entry keeps the tiles")
        lines.append(f"  T={row['tokens']:>6}: {before} -> {row['best_us']:.1f}{gain}  {kernels}{decode}"
                     + "".join(f"; {note}" for note in notes))
    return lines
