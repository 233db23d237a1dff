"""W4A16 vs W4A8 (FP8 activations, backends.triton_moe act_quant) of this project's Triton MoE, same run, one GPU.

    python benchmarks/bench_w4a8.py --out DIR [--shapes gpt-oss-120b,deepseek-v3] [--tokens 256,4096,16384]

Every layer call is timed as in benchmarks/bench_moe.py (backends.gpu_timing: whole layer as a CUDA graph, L2
flushed before each replay, median of CUDA-event times). Each W4A8 row is checked against the emulation with
fp8_operands=True on the first 256 tokens before it is timed (rel_l2 column). The same run measures the ceilings:
bf16 8192^3 torch matmul and FP8 E4M3 8192^3 torch._scaled_mm (per-tensor scales, bf16 out). Writes
DIR/w4a8.csv (one row per shape, T, path) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import os

import torch

from backends import emulation
from backends.gpu_timing import Flusher, events_ms, measure_ceilings, time_graph
from backends.layouts.triton_moe import to_kernel_layout, w4a8_row_data
from backends.triton_moe import moe_forward
from backends.triton_moe.testing import SHAPES, activation_kwargs, random_checkpoint
from backends.triton_moe.tuning import LaunchConfig, MoEConfig

PATHS = ("w4a16", "fp8_per_tensor_static", "mxfp8")
#: --variants: launch configs tried for the W4A8 paths at T >= 4096 beside the W4A16 tables' choice (the tables
#: were tuned for bf16 dots): BLOCK_K 128 (two 64-wide FP8 dots per step), and plain tiles, whose activations are
#: the wgmma register operand, quantized in registers where they already are.
VARIANTS = {
    "swap-bk128": MoEConfig(LaunchConfig(128, 64, 128, 8, True, 4, 3, stack_gate_up=True),
                            LaunchConfig(128, 128, 128, 8, True, 4, 3), "variant"),
    "plain-128x128x64-w8": MoEConfig(LaunchConfig(128, 128, 64, 8, False, 8, 3),
                                     LaunchConfig(128, 128, 64, 8, False, 8, 3), "variant"),
    "plain-128x128x128-w8": MoEConfig(LaunchConfig(128, 128, 128, 8, False, 8, 3),
                                      LaunchConfig(128, 128, 128, 8, False, 8, 3), "variant"),
    "plain-64x128x128-w4": MoEConfig(LaunchConfig(64, 128, 128, 8, False, 4, 3),
                                     LaunchConfig(64, 128, 128, 8, False, 4, 3), "variant"),
}
COLUMNS = ("gpu", "shape", "format", "tokens", "path", "config", "us", "tflops", "speedup_vs_w4a16",
           "fraction_of_scaled_mm", "fraction_of_bf16_matmul", "rel_l2_vs_emulation", "scaled_mm_tflops",
           "bf16_matmul_tflops")


def scaled_mm_tflops(size: int = 8192) -> float:
    """FP8 E4M3 size^3 torch._scaled_mm TFLOP/s (per-tensor scales, bf16 output), median of 20 calls."""
    a = torch.randn(size, size, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(size, size, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
    one = torch.ones((), device="cuda")

    def mm():
        return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    for _ in range(3):
        mm()
    return 2 * size**3 / events_ms(mm, lambda: None, 20) / 1e9


def static_scales(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(a1, a2) as a calibrated checkpoint would hold them: a1 = amax(x) / 448; a2 a fixed 1/64 (h up to 7)."""
    return (x.float().abs().amax() / 448).reshape(1), torch.full((1,), 1 / 64, device=x.device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="gpt-oss-120b,deepseek-v3")
    p.add_argument("--tokens", default="256,4096,16384")
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default=None)
    p.add_argument("--variants", default="", help="comma-separated VARIANTS to time for the W4A8 paths at T >= 4096")
    args = p.parse_args()
    torch.manual_seed(0)
    gpu = torch.cuda.get_device_name()
    _, _, _, bf16 = measure_ceilings()
    fp8 = scaled_mm_tflops()
    print(f"# {gpu}: bf16 8192^3 matmul {bf16:.1f} TFLOP/s, FP8 8192^3 torch._scaled_mm {fp8:.1f} TFLOP/s",
          flush=True)
    print("| shape | T | path | µs | TFLOP/s | speedup vs W4A16 | of _scaled_mm | rel L2 vs emulation |", flush=True)
    flush, rows = Flusher(), []
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        ckpt = random_checkpoint(shape, device="cuda")
        weights = to_kernel_layout(**ckpt)
        weights = dataclasses.replace(weights, **w4a8_row_data(weights))
        act = activation_kwargs(shape)
        for tokens in map(int, args.tokens.split(",")):
            x = torch.randn(tokens, shape.hidden_size, device="cuda").bfloat16()
            logits = torch.randn(tokens, shape.experts, device="cuda")
            a1, a2 = static_scales(x)
            flops = 6 * tokens * shape.top_k * shape.hidden_size * shape.intermediate_size
            base_us = None
            runs = [(path, None) for path in args.paths.split(",")]
            if tokens >= 4096:
                runs += [(path, v) for v in filter(None, args.variants.split(",")) for path in args.paths.split(",")
                         if path != "w4a16"]
            for path, variant in runs:
                quant = {} if path == "w4a16" else {"act_quant": path}
                if path == "fp8_per_tensor_static":
                    quant.update(a1_scale=a1, a2_scale=a2)
                if variant:
                    quant["config"] = VARIANTS[variant]
                rel = ""
                if path != "w4a16":
                    n = min(tokens, 256)
                    schemes = (path, path)
                    ref = emulation.moe_forward(x[:n], **ckpt, router_logits=logits[:n], top_k=shape.top_k, **act,
                                                gemm_input_schemes=schemes, fp8_operands=True,
                                                **({"a1_scale": a1, "a2_scale": a2} if "a1_scale" in quant else {}))
                    out = moe_forward(x[:n], weights, router_logits=logits[:n], top_k=shape.top_k, **act, **quant)
                    rel = f"{((out.float() - ref.float()).norm() / ref.float().norm()).item():.2e}"
                call = dict(router_logits=logits, top_k=shape.top_k, **act, **quant)
                us = time_graph(functools.partial(moe_forward, x, weights, **call), flush, args.iters)
                base_us = us if path == "w4a16" else base_us
                tflops = flops / us / 1e6
                row = {"gpu": gpu, "shape": name, "format": shape.format, "tokens": tokens, "path": path,
                       "config": variant or "tuned",
                       "us": f"{us:.1f}", "tflops": f"{tflops:.1f}",
                       "speedup_vs_w4a16": f"{base_us / us:.3f}" if base_us else "",
                       "fraction_of_scaled_mm": f"{tflops / fp8:.3f}",
                       "fraction_of_bf16_matmul": f"{tflops / bf16:.3f}", "rel_l2_vs_emulation": rel,
                       "scaled_mm_tflops": f"{fp8:.1f}", "bf16_matmul_tflops": f"{bf16:.1f}"}
                rows.append(row)
                print(f"| {name} | {tokens} | {path} {variant or ''} | {us:.1f} | {tflops:.1f} | "
                      f"{row['speedup_vs_w4a16']} | {row['fraction_of_scaled_mm']} | {rel} |", flush=True)
                if args.out:
                    os.makedirs(args.out, exist_ok=True)
                    with open(os.path.join(args.out, "w4a8.csv"), "w", newline="") as f:
                        writer = csv.DictWriter(f, fieldnames=COLUMNS)
                        writer.writeheader()
                        writer.writerows(rows)


if __name__ == "__main__":
    main()
