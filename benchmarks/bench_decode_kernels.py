"""The decode kernels (backends/triton_moe/_gemv_kernels.py) against the tile kernels at T = 1 ... 8, same run.

For each layer and T: the layer with router logits as a CUDA graph (L2 flushed before each replay, median of
--iters), first with the tile kernels' config (table or heuristics, decode off), then with the decode kernels' warps
from the heuristics, then (--sweep-layers, T <= 2) the neighbouring GEMV1 / GEMV2 warps; each decode output checked
against the emulation (rel L2 and the tests' elementwise measure) and against the tile kernels' output. Per-kernel
eager µs (torch.profiler) of both paths at T = 1.

    python benchmarks/bench_decode_kernels.py --out benchmarks/results/<run> [--layers a,b] [--tokens 1,2,4,8]

Writes <out>/decode_kernels.csv, <out>/kernels.csv and <out>/environment.json.
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

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from backends import emulation  # noqa: E402
from backends.gpu_timing import (  # noqa: E402
    Flusher,
    measure_ceilings,
    memory_floor,
    profile_kernels,
    time_graph_output,
)
from backends.layouts.triton_moe import to_kernel_layout  # noqa: E402
from backends.model_shapes import MATRIX, SHAPES  # noqa: E402
from backends.triton_moe import moe_forward, tuning  # noqa: E402
from backends.triton_moe.testing import activation_kwargs, compare, random_checkpoint  # noqa: E402

COLUMNS = ("gpu", "shape", "tokens", "variant", "config", "us", "floor_us", "floor_fraction", "rel_l2_vs_emulation",
           "elementwise_ratio", "rel_l2_vs_tiles")
#: GEMV1 (row groups, K slices) and GEMV2 ones tried around the heuristic's on --sweep-layers.
GEMV1_SWEEP = ((8, 1), (4, 2), (2, 4), (1, 8), (4, 4))
GEMV2_SWEEP = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 2), (2, 1))


def describe(config: tuning.MoEConfig) -> str:
    if config.decode is None:
        g1, g2 = config.gemm1, config.gemm2
        return (f"tiles {g1.block_m}x{g1.block_n}x{g1.block_k}/{g2.block_n}x{g2.block_k} w{g1.num_warps}/"
                f"{g2.num_warps} split{g1.split_k}/{g2.split_k}")
    return config.decode.label


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--layers", default=",".join(MATRIX))
    p.add_argument("--tokens", default="1,2,4,8")
    p.add_argument("--sweep-layers", default="gpt-oss-120b,deepseek-v3")
    p.add_argument("--iters", type=int, default=50)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    arch, gpu_info = tuning.device_gpu(torch.device("cuda"))
    bandwidth, copy, read, matmul = measure_ceilings()
    env = {"gpu": gpu, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "commit": os.environ.get("MOE_ORACLE_COMMIT", ""),
           "bandwidth_gbs": bandwidth, "copy_gbs": copy, "read_gbs": read, "matmul_tflops": matmul}
    with open(os.path.join(args.out, "environment.json"), "w") as f:
        json.dump(env, f, indent=1)
    flush = Flusher()
    out = open(os.path.join(args.out, "decode_kernels.csv"), "w", newline="")
    writer = csv.DictWriter(out, COLUMNS)
    writer.writeheader()
    kernel_rows = []
    sweep_layers = set(filter(None, args.sweep_layers.split(",")))
    for name in args.layers.split(","):
        shape = SHAPES[name]
        gen = torch.Generator(device="cuda").manual_seed(0)
        ckpt = random_checkpoint(shape, device="cuda", generator=gen)
        weights = to_kernel_layout(**ckpt)
        act = activation_kwargs(shape)
        for tokens in map(int, args.tokens.split(",")):
            x = torch.randn(tokens, shape.hidden_size, device="cuda", generator=gen).bfloat16()
            logits = torch.randn(tokens, shape.experts, device="cuda", generator=gen)
            _, floor = memory_floor(logits, shape.top_k, shape.format, shape.hidden_size, shape.intermediate_size,
                                    bandwidth)
            problem = tuning.Problem(tokens=tokens, **shape.fields())
            selected = tuning.select_config(arch, gpu_info, problem)
            tiles = dataclasses.replace(selected, decode=None)
            decode = tuning.decode_kernels(gpu_info.sm_count, problem)
            call = functools.partial(moe_forward, x, weights, router_logits=logits, top_k=shape.top_k, **act)
            ref = emulation.moe_forward(x, **ckpt, router_logits=logits, top_k=shape.top_k, **act)
            variants = [("tiles", tiles), ("decode heuristic", dataclasses.replace(tiles, decode=decode))]
            if name in sweep_layers and tokens <= 2:
                slots = tuning.gemv2_slots(shape.top_k)
                for g1 in map(lambda g: tuning.GemvLaunch(*g), GEMV1_SWEEP):
                    if g1 != decode.gemv1:
                        variants.append(("decode sweep gemv1", dataclasses.replace(
                            tiles, decode=tuning.DecodeConfig(g1, decode.gemv2))))
                for g2 in map(lambda g: tuning.GemvLaunch(*g), GEMV2_SWEEP):
                    if g2 != decode.gemv2 and g2.warps(slots) <= tuning.GEMV_MAX_WARPS:
                        variants.append(("decode sweep gemv2", dataclasses.replace(
                            tiles, decode=tuning.DecodeConfig(decode.gemv1, g2))))
            tile_out = None
            for variant, config in variants:
                try:
                    us, y = time_graph_output(functools.partial(call, config=config), flush, args.iters)
                except Exception as exc:  # noqa: BLE001  a config that fails to compile or launch is a result
                    print(f"{name} T={tokens} {variant} {describe(config)} failed: {type(exc).__name__}: {exc}"[:400],
                          flush=True)
                    continue
                tile_out = y.clone() if tile_out is None else tile_out
                stats = compare(y, ref, rel_l2_tol=1.0, rtol=0.0, atol_rms_units=1.0)
                row = {"gpu": gpu, "shape": name, "tokens": tokens, "variant": variant, "config": describe(config),
                       "us": f"{us:.2f}", "floor_us": f"{floor:.2f}", "floor_fraction": f"{floor / us:.3f}",
                       "rel_l2_vs_emulation": f"{stats['rel_l2']:.2e}",
                       "elementwise_ratio": f"{stats['elementwise_ratio']:.3g}",
                       "rel_l2_vs_tiles": f"{((y.float() - tile_out.float()).norm() / tile_out.float().norm()):.2e}"}
                writer.writerow(row)
                out.flush()
                print(" | ".join(str(v) for v in row.values()), flush=True)
            if tokens == 1:
                for variant, config in variants[:2]:
                    for kernel, us in profile_kernels(functools.partial(call, config=config), flush):
                        kernel_rows.append({"gpu": gpu, "shape": name, "variant": variant, "kernel": kernel,
                                            "eager_kernel_us": f"{us:.2f}"})
    out.close()
    with open(os.path.join(args.out, "kernels.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, ("gpu", "shape", "variant", "kernel", "eager_kernel_us"))
        w.writeheader()
        w.writerows(kernel_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
