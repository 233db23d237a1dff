"""Two GPUs: the parallel MoE layers on NCCL - correctness against one GPU holding the whole layer, per-step timings,
and the NCCL bandwidth, in one run.

    torchrun --nproc-per-node 2 benchmarks/gpu_parallel.py OUT_DIR [--budget-s 300]

Writes into OUT_DIR (rank 0):
* nccl.csv: all_reduce / all_gather / reduce_scatter / all_to_all over the 2 GPUs, 1 KiB .. 128 MiB per rank:
  median µs, nccl-tests' bus bandwidth, and `factor_bytes` (the bytes the bus-bandwidth formula divides).
* correctness.csv: TP=2 and EP=2 (both dispatches) against the single-GPU layer (this project's Triton kernels,
  the same weights and tokens, tolerances w4a16_moe_* of tests/tolerances.py), T = 1, 64, 4096 per rank, plus
  tokens whose experts all live on rank 0 and a rank with no tokens; routing compared with the Triton router.
* steps.csv: median µs per step (route, dispatch, experts, combine, and the whole step) of each mode, the larger
  of the two ranks; steps_by_rank.csv: each rank's. Modes: single (one GPU, the rank's T tokens),
  single-all-tokens (one GPU, both ranks' tokens: what EP=2 serves), tp, allgather_reducescatter,
  deepep_high_throughput. Shapes gpt-oss-120b (MXFP4) and deepseek-v3 (DeepSeek-V3's routed experts).
* cuda_graph.csv: TP's forward captured as a CUDA graph (runner + NCCL all-reduce), replayed against eager.
* cost_model_check.md: benchmarks/parallel_cost_model.py's prediction against these measurements (also printed).
* log lines on stdout. Eager timing (no CUDA graph: the dispatches read token counts on the host), L2 flushed
  (gpu_timing.Flusher) and the ranks aligned by a barrier before every step.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from datetime import timedelta
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from parallel_cost_model import check  # noqa: E402

from backends import MoELayer  # noqa: E402
from backends.gpu_timing import Flusher  # noqa: E402
from backends.parallel import ParallelMoELayer  # noqa: E402
from backends.parallel.dispatch import all_gather, reduce_scatter  # noqa: E402
from backends.triton_moe.testing import SHAPES, Shape, activation_kwargs, compare, random_checkpoint  # noqa: E402
from backends.weights import MoEWeights  # noqa: E402

from tolerances import tolerance  # noqa: E402

SHAPE_NAMES = ("gpt-oss-120b", "deepseek-v3")
TOKENS = (1, 64, 4096)
#: --cpu-smoke: the same code paths on 2 CPU processes (gloo, emulation, tiny layers) to check the script itself
SMOKE_SHAPES = {"gpt-oss-120b": Shape("gpt-oss-120b", "mxfp4", 8, 2, 64, 128, "swigluoai", True),
                "deepseek-v3": Shape("deepseek-v3", "nvfp4", 8, 4, 64, 64, "silu", False)}
SMOKE_TOKENS = (1, 8, 64)
MODES = ("single", "single-all-tokens", "tp", "allgather_reducescatter", "deepep_high_throughput")
START = time.monotonic()


class CpuEvent:
    """torch.cuda.Event's timing interface on the host clock (--cpu-smoke)."""

    def __init__(self, enable_timing: bool = True):
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: CpuEvent) -> float:
        return (end.t - self.t) * 1e3


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def event(device):
    return torch.cuda.Event(enable_timing=True) if device.type == "cuda" else CpuEvent()


def log(*parts) -> None:
    if dist.get_rank() == 0:
        print(f"[{time.monotonic() - START:6.1f} s]", *parts, flush=True)


def write_csv(path: Path, rows: list[dict]) -> None:
    if dist.get_rank() != 0 or not rows:
        return
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


# --------------------------------------------------------------------------------------------------- NCCL
def nccl_bandwidth(device) -> list[dict]:
    world, rows = dist.get_world_size(), []
    for log2 in ((10, 13, 16, 19, 22, 25, 27) if device.type == "cuda" else (10, 13, 16)):
        size = 1 << log2  # bytes each rank contributes
        elems = size // 2
        x = torch.randn(elems, device=device).bfloat16()
        gathered = torch.empty(world * elems, device=device, dtype=torch.bfloat16)
        big = torch.randn(world * elems, device=device).bfloat16()
        part = torch.empty(elems, device=device, dtype=torch.bfloat16)
        ops = {
            "all_reduce": (partial(dist.all_reduce, x), 2 * (world - 1) / world * size),
            "all_gather": (partial(all_gather, gathered, x), (world - 1) * size),
            "reduce_scatter": (partial(reduce_scatter, part, big), (world - 1) * size),
            "all_to_all": (partial(dist.all_to_all_single, part, x), (world - 1) / world * size),
        }
        for name, (op, factor) in ops.items():
            for _ in range(3):
                op()
            times = []
            for _ in range(20):
                dist.barrier()
                start, end = event(device), event(device)
                start.record()
                op()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3)
            us = statistics.median(times)
            rows.append({"collective": name, "bytes_per_rank": size, "factor_bytes": factor, "us": round(us, 2),
                         "busbw_gbs": round(factor / us / 1e3, 1)})
    return rows


# --------------------------------------------------------------------------------------------------- layers
def checkpoint(shape, device) -> MoEWeights:
    """The same random checkpoint on every rank (same seed)."""
    gate_up = "interleaved" if shape.format == "mxfp4" else "contiguous"
    g = torch.Generator(device=device).manual_seed(1234)
    ckpt = random_checkpoint(shape, device=device, generator=g, gate_up_layout=gate_up)
    return MoEWeights(format=ckpt["format"], gate_up=ckpt["gate_up_layout"], w13=ckpt["w13"],
                      w13_scale=ckpt["w13_scale"], w2=ckpt["w2"], w2_scale=ckpt["w2_scale"],
                      w13_bias=ckpt.get("w13_bias"), w2_bias=ckpt.get("w2_bias"),
                      w13_global_scale=ckpt.get("w13_global_scale"), w2_global_scale=ckpt.get("w2_global_scale"))


def build(shape, weights, mode, device):
    act = activation_kwargs(shape)
    common = dict(activation=act["activation"], top_k=shape.top_k, renormalize=True, device=device)
    if mode == "single":
        return MoELayer.from_checkpoint(weights, **common)
    kw = {"parallel": "tp"} if mode == "tp" else {"parallel": "ep", "all2all_backend": mode}
    return ParallelMoELayer.from_checkpoint(weights, process_group=dist.group.WORLD, **kw, **common)


def tokens(shape, count, routing, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(count, shape.hidden_size, device=device, generator=g).bfloat16()
    logits = torch.randn(count, shape.experts, device=device, generator=g)
    if routing == "rank0-experts":
        logits[:, :shape.experts // 2] += 20
    return x, logits


def correctness(shape, layers, device, token_counts) -> list[dict]:
    rank, rows = dist.get_rank(), []
    rel, elem = tolerance("w4a16_moe_rel_l2"), tolerance("w4a16_moe_elementwise_rms_units")
    router = None
    if device.type == "cuda":  # the single-GPU layer's own router (one Triton launch)
        from backends.triton_moe import _routing
        from backends.triton_moe.forward import _kernels_for
        router = (lambda logits: _routing.route(logits, shape.top_k, True, _kernels_for(device)))
    cases = [(t, t, "random") for t in token_counts] + [(16, 16, "rank0-experts"), (5, 0, "random")]
    for mode in ("tp", "allgather_reducescatter", "deepep_high_throughput"):
        for t0, t1, routing in cases:
            if mode == "tp" and t1 == 0:
                continue
            count, seed = (t0, 7) if mode == "tp" or rank == 0 else (t1, 8)
            x, logits = tokens(shape, count, routing, seed, device)
            y = layers[mode](x, logits)
            ref = layers["single"](x, logits)
            ids, _ = layers[mode].route(logits)
            same_routing = None
            if router is not None and count:
                ref_ids, _ = router(logits)
                same_routing = bool(torch.equal(ids.sort(dim=1).values, ref_ids.long().sort(dim=1).values))
            if count:
                c = compare(y, ref, rel_l2_tol=rel["rtol"], rtol=elem["rtol"], atol_rms_units=elem["atol"])
                ok = c["finite"] and c["shape_ok"] and c["rel_l2_ratio"] <= 1 and c["elementwise_ratio"] <= 1
            else:
                c, ok = {"rel_l2": 0.0, "elementwise_ratio": 0.0}, tuple(y.shape) == (0, shape.hidden_size)
            rows.append({"shape": shape.name, "mode": mode, "rank": rank, "tokens_rank0": t0, "tokens_rank1": t1,
                         "routing": routing, "tokens_here": count, "same_routing": same_routing,
                         "rel_l2": f"{c['rel_l2']:.2e}", "elementwise_ratio": f"{c['elementwise_ratio']:.3f}",
                         "ok": ok and same_routing is not False})
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, rows)
    return [r for part in every for r in part]


def tp_graph_check(shape, layer, device) -> dict:
    """docs/parallel.md says TP is CUDA-graph capturable: capture forward (runner + NCCL all-reduce) at T = 64 and
    compare a replay with the eager output. Replayed only when every rank captured (a lone replay would wait in
    the all-reduce)."""
    x, logits = tokens(shape, 64, "random", 7, device)
    eager = layer(x, logits)
    error = ""
    try:
        dist.barrier()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            layer(x, logits)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = layer(x, logits)
    except Exception as exc:  # noqa: BLE001 - recorded: where capture fails is what this row reports
        error = f"capture: {type(exc).__name__}: {exc}"[:300]
    errors: list = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    if any(errors):
        return {"ok": False, "max_abs_diff": float("nan"), "error": error or "another rank failed to capture"}
    graph.replay()
    torch.cuda.synchronize()
    diff = (y.float() - eager.float()).abs().max().item()
    return {"ok": diff == 0.0, "max_abs_diff": diff, "error": ""}


def time_steps(shape, mode, layer, count, device, flush, iters) -> dict:
    """Median µs of each step over `iters` eager steps (after 3 warm-up steps that also compile)."""
    x, logits = tokens(shape, count, "random", 11 + dist.get_rank(), device)
    samples: dict = {k: [] for k in ("route", "dispatch", "experts", "combine", "total")}
    for i in range(3 + iters):
        flush()
        dist.barrier()
        sync(device)
        ev = [event(device) for _ in range(5)]
        ev[0].record()
        if mode.startswith("single"):
            ev[1].record()
            ev[2].record()
            layer(x, logits)
            ev[3].record()
        elif mode == "tp":  # the slice's runner routes, as forward does; then the all-reduce
            ev[1].record()
            ev[2].record()
            out = layer.local(x, logits)
            ev[3].record()
            layer.combine(out, None)
        else:
            ids, w = layer.route(logits)
            ev[1].record()
            d = layer.dispatch(x, ids, w)
            ev[2].record()
            out = layer.experts(d)
            ev[3].record()
            layer.combine(out, d)
        ev[4].record()
        ev[4].synchronize()
        if i >= 3:
            for key, (a, b) in {"route": (0, 1), "dispatch": (1, 2), "experts": (2, 3), "combine": (3, 4),
                                "total": (0, 4)}.items():
                samples[key].append(ev[a].elapsed_time(ev[b]) * 1e3)
    return {f"{k}_us": round(statistics.median(v), 1) for k, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="directory for the CSVs")
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="stop starting new timings after this many seconds (what ran is written)")
    ap.add_argument("--iters", type=int, default=None,
                    help="timed steps per cell (default 20 at T <= 64, 8 above)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run the script's code paths on CPU processes (gloo, emulation, tiny layers)")
    args = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.cpu_smoke:
        device, shapes, token_counts = torch.device("cpu"), SMOKE_SHAPES, SMOKE_TOKENS
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    else:
        torch.cuda.set_device(local)
        device, shapes, token_counts = torch.device("cuda", local), SHAPES, TOKENS
        dist.init_process_group("nccl", timeout=timedelta(seconds=120), device_id=device)
    world = dist.get_world_size()
    out = Path(args.out)
    if dist.get_rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
    if device.type == "cuda":
        nccl_version = torch.cuda.nccl.version()
        log(f"{world} x {torch.cuda.get_device_name(device)}, torch {torch.__version__}, NCCL "
            f"{'.'.join(map(str, nccl_version)) if isinstance(nccl_version, tuple) else nccl_version}, "
            f"NCCL_* env: {sorted(k for k in os.environ if k.startswith('NCCL_'))}")
    else:
        log(f"{world} CPU processes (gloo), torch {torch.__version__}: smoke run of the script, timings meaningless")
    nccl = nccl_bandwidth(device)
    write_csv(out / "nccl.csv", nccl)
    for r in nccl:
        if r["bytes_per_rank"] in (1 << 10, 1 << 22, 1 << 27):
            log(f"nccl {r['collective']:>14} {r['bytes_per_rank']:>10} B/rank {r['us']:>9.1f} µs "
                f"busbw {r['busbw_gbs']:.1f} GB/s")

    flush = Flusher(device) if device.type == "cuda" else (lambda: None)
    correct, steps, by_rank, skipped, graphs = [], [], [], [], []
    for name in SHAPE_NAMES:
        shape = shapes[name]
        weights = checkpoint(shape, device)
        layers = {mode: build(shape, weights, mode, device) for mode in ("single", "tp", "allgather_reducescatter",
                                                                          "deepep_high_throughput")}
        del weights
        log(f"{name}: built; rank 0: {layers['tp']!r}, {layers['deepep_high_throughput']!r}")
        correct += correctness(shape, layers, device, token_counts)
        if device.type == "cuda":
            graph = tp_graph_check(shape, layers["tp"], device)
            every_graph: list = [None] * world
            dist.all_gather_object(every_graph, graph)
            graphs += [{"shape": name, "mode": "tp", "tokens": 64, "rank": r, **g} for r, g in enumerate(every_graph)]
            write_csv(out / "cuda_graph.csv", graphs)
            log(f"{name}: TP forward as a CUDA graph: " + "; ".join(
                f"rank {r} {'OK' if g['ok'] else 'FAILED'} {g['error']}" for r, g in enumerate(every_graph)))
        write_csv(out / "correctness.csv", correct)
        bad = [r for r in correct if r["shape"] == name and not r["ok"]]
        log(f"{name}: correctness {'OK' if not bad else 'FAILED ' + str(len(bad)) + ' rows'}")
        for count in token_counts:
            for mode in MODES:
                if time.monotonic() - START > args.budget_s:
                    skipped.append(f"{name} {mode} T={count}")
                    continue
                layer = layers["single" if mode.startswith("single") else mode]
                n = count * (world if mode == "single-all-tokens" else 1)
                mine = time_steps(shape, mode, layer, n, device, flush,
                                  iters=args.iters or (20 if count <= 64 else 8))
                every: list = [None] * world
                dist.all_gather_object(every, mine)
                for r, m in enumerate(every):
                    by_rank.append({"shape": name, "mode": mode, "world": world, "tokens_per_rank": count, "rank": r,
                                    **m})
                row = {"shape": name, "mode": mode, "world": world, "tokens_per_rank": count,
                       **{k: max(m[k] for m in every) for k in mine}}
                steps.append(row)
                log(f"{name} T={count:>5} {mode:>24}: " + " ".join(f"{k[:-3]} {v:>8.1f}" for k, v in row.items()
                                                                      if k.endswith("_us")))
                write_csv(out / "steps.csv", steps)
                write_csv(out / "steps_by_rank.csv", by_rank)
        del layers
        torch.cuda.empty_cache()
    if skipped:
        log(f"over the {args.budget_s:.0f} s budget, not timed: {', '.join(skipped)}")
    if dist.get_rank() == 0:
        report = check(out)
        (out / "cost_model_check.md").write_text(report + "\n")
        print(report, flush=True)
        failed = sum(not r["ok"] for r in correct)
        print(f"correctness: {len(correct) - failed} of {len(correct)} rows OK", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
