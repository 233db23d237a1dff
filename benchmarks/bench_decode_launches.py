"""Decode latency (T = 1, 4, 16) of this project's layer: the top-k sum as its own launch (the reference) against
the sum folded into GEMM2 (moe_forward(topk_sum=...)), A/B in the same run, plus the per-kernel split at T = 1 and
sweeps of configs around the T = 1 table configs (--sweeps, --sweep-topk-sum). Method as bench_matrix.py: whole
layer with routing as a CUDA graph, L2 flushed before each replay, median of --iters replays (best of --rounds, A
and B alternating).

    python benchmarks/bench_decode_launches.py --out benchmarks/results/<run> [--layers a,b] [--budget-s 150]

Writes <out>/decode.csv (appended row by row), <out>/kernels.csv (eager per-kernel µs under torch.profiler) and
<out>/environment.json (GPU, versions, $MOE_ORACLE_COMMIT, the bandwidth the floors use).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import functools
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from backends.gpu_timing import (  # noqa: E402
    Flusher,
    events_ms,
    graph_of,
    measure_ceilings,
    memory_floor,
    profile_kernels,
)
from backends.layouts.triton_moe import to_kernel_layout  # noqa: E402
from backends.model_shapes import SHAPES  # noqa: E402
from backends.triton_moe import moe_forward, tuning  # noqa: E402
from backends.triton_moe.testing import activation_kwargs, random_checkpoint  # noqa: E402

COLUMNS = ("gpu", "shape", "tokens", "variant", "config", "us", "floor_us", "floor_fraction", "note")


def describe(c: tuning.MoEConfig) -> str:
    g1, g2 = c.gemm1, c.gemm2
    return (f"{g1.block_m}x{g1.block_n}x{g1.block_k}/{g2.block_n}x{g2.block_k} w{g1.num_warps}/{g2.num_warps} "
            f"s{g1.num_stages}/{g2.num_stages} split{g1.split_k}/{g2.split_k} {g1.split_epilogue or 'launch'}")


#: (gemm1 split_k, gemm2 split_k, block_n, warps, stages) around the T = 1 configs: "neighbours" (split-K, column
#: tile, warps), "in-flight" (more bytes in flight per program: wider tiles, more warps and stages at split 4).
SWEEPS = {
    "neighbours": ((2, 2, 64, 2, 3), (8, 4, 64, 2, 3), (4, 8, 64, 2, 3), (8, 8, 64, 2, 3), (4, 4, 32, 2, 3),
                   (4, 4, 128, 4, 3), (4, 4, 64, 4, 3), (8, 8, 32, 2, 3), (2, 4, 32, 2, 3), (4, 2, 64, 2, 3)),
    "in-flight": ((4, 4, 64, 2, 4), (4, 4, 64, 2, 5), (4, 4, 128, 4, 4), (4, 4, 128, 4, 5), (4, 4, 128, 8, 4),
                  (4, 4, 256, 8, 3), (2, 2, 128, 4, 5), (2, 2, 256, 8, 4), (4, 2, 128, 4, 4), (4, 4, 128, 2, 4)),
}


def neighbours(base: tuning.MoEConfig, sweep: str) -> list:
    """Configs of one SWEEPS list around the T = 1 config (fused split epilogue)."""
    out = []
    for s1, s2, bn, warps, stages in SWEEPS[sweep]:
        g1 = dataclasses.replace(base.gemm1, split_k=s1, block_n=bn, num_warps=warps, num_stages=stages,
                                 split_epilogue="fused")
        g2 = dataclasses.replace(base.gemm2, split_k=s2, block_n=bn, num_warps=warps, num_stages=stages)
        out.append(tuning.MoEConfig(g1, g2, sweep))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--layers", default="gpt-oss-120b,deepseek-v3")
    p.add_argument("--tokens", default="1,4,16")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=1e9, help="skip the sweep after this many seconds")
    p.add_argument("--sweep-topk-sum", default="launch", choices=("launch", "fused"))
    p.add_argument("--sweeps", default="neighbours", help=f"comma-separated subset of {','.join(SWEEPS)} ('' for none)")
    args = p.parse_args()
    start = time.time()
    os.makedirs(args.out, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    bandwidth = measure_ceilings()[0]
    import triton

    with open(os.path.join(args.out, "environment.json"), "w") as env:
        json.dump({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "gpu": gpu,
                   "torch": torch.__version__, "triton": triton.__version__,
                   "commit": os.environ.get("MOE_ORACLE_COMMIT", "unknown"), "bandwidth_gbs": round(bandwidth, 1),
                   "args": vars(args)}, env, indent=1)
    flush = Flusher()
    arch, gpu_info = tuning.device_gpu(torch.device("cuda"))
    f = open(os.path.join(args.out, "decode.csv"), "w", newline="")
    w = csv.DictWriter(f, COLUMNS)
    w.writeheader()
    kf = open(os.path.join(args.out, "kernels.csv"), "w", newline="")
    kw = csv.writer(kf)
    kw.writerow(("gpu", "shape", "tokens", "variant", "graph_us", "kernel", "eager_kernel_us"))

    def emit(**row):
        row["floor_fraction"] = f"{row['floor_us'] / row['us']:.3f}" if row.get("us") else ""
        row["us"] = f"{row['us']:.2f}" if row.get("us") else ""
        row["floor_us"] = f"{row['floor_us']:.2f}"
        w.writerow({"gpu": gpu, **row})
        f.flush()
        print(row, flush=True)

    def graph_us(fn):
        graph = graph_of(fn)
        return events_ms(graph.replay, flush, args.iters) * 1e3

    setups = {}
    for name in args.layers.split(","):
        shape = SHAPES[name]
        gen = torch.Generator(device="cuda").manual_seed(0)
        weights = to_kernel_layout(**random_checkpoint(shape, device="cuda", generator=gen))
        act = activation_kwargs(shape)
        for tokens in map(int, args.tokens.split(",")):
            x = torch.randn(tokens, shape.hidden_size, device="cuda", generator=gen).bfloat16()
            logits = torch.randn(tokens, shape.experts, device="cuda", generator=gen)
            _, floor = memory_floor(logits, shape.top_k, shape.format, shape.hidden_size, shape.intermediate_size,
                                    bandwidth)
            config = tuning.select_config(arch, gpu_info, tuning.Problem(tokens=tokens, **shape.fields()))
            call = functools.partial(moe_forward, x, weights, router_logits=logits, top_k=shape.top_k, **act)
            ref = call(config=config, topk_sum="launch")
            same = torch.equal(ref.view(torch.int16), call(config=config, topk_sum="fused").view(torch.int16))
            best = {"launch": float("inf"), "fused": float("inf")}
            for _ in range(args.rounds):
                for variant in best:
                    best[variant] = min(best[variant], graph_us(functools.partial(call, config=config,
                                                                                  topk_sum=variant)))
            for variant, us in best.items():
                emit(shape=name, tokens=tokens, variant=f"top-k sum {variant}", config=describe(config), us=us,
                     floor_us=floor, note=f"bits equal to launch: {same}")
                if tokens == 1:
                    for kernel, kus in profile_kernels(functools.partial(call, config=config, topk_sum=variant),
                                                       flush):
                        kw.writerow((gpu, name, tokens, variant, f"{us:.2f}", kernel[:80], f"{kus:.2f}"))
                    kf.flush()
            if tokens == 1:
                setups[name] = (call, floor, config)
    for name, (call, floor, config) in setups.items():
        for cand in [c for sweep in filter(None, args.sweeps.split(",")) for c in neighbours(config, sweep)]:
            if time.time() - start > args.budget_s:
                print("budget reached: sweep cut", flush=True)
                return 0
            try:
                us = min(graph_us(functools.partial(call, config=cand, topk_sum=args.sweep_topk_sum)) for _ in range(2))
                emit(shape=name, tokens=1, variant=f"sweep {cand.source}", config=describe(cand), us=us,
                     floor_us=floor, note=f"top-k sum {args.sweep_topk_sum}")
            except Exception as exc:  # noqa: BLE001  a config that does not compile is a result
                emit(shape=name, tokens=1, variant=f"sweep {cand.source}", config=describe(cand), us=None,
                     floor_us=floor, note=f"failed: {type(exc).__name__}: {exc}"[:200])
    return 0


if __name__ == "__main__":
    sys.exit(main())
