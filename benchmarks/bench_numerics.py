"""Throughput of the reference dequantizers and latency of the emulation MoE, as a markdown table.

Why: the emulation backend is the fallback on machines without a native kernel, so the rule tables
need a rough idea of what it costs. Dequantization GB/s counts bytes of packed data read + scales
read + bf16 output written. On CUDA the same run measures a device-to-device copy (read + write) and
reports each dequantizer as a fraction of it.

    python benchmarks/bench_numerics.py --device cpu --out benchmarks/README-numerics.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from backends import emulation, formats  # noqa: E402

GPT_OSS_20B = dict(hidden=2880, intermediate=2880, experts=32, top_k=4)


def median_seconds(fn, device: str, warmup: int, repeats: int) -> float:
    """Median wall time of fn(); CUDA events on GPU (after warmup), perf_counter on CPU."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            begin = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - begin)
    return statistics.median(samples)


def dequant_cases(rows: int, cols: int, device: str):
    """(name, callable, bytes moved) for each format on a [rows, cols] weight."""
    x = torch.randn(rows, cols, device=device)
    out_bytes = rows * cols * 2  # bf16 output
    cases = []
    packed, scales = formats.quantize_mxfp4(x)
    cases.append(("mxfp4", lambda: formats.dequantize_mxfp4(packed, scales, dtype=torch.bfloat16),
                  packed.numel() + scales.numel() + out_bytes))
    nv_packed, nv_scales, nv_gs = formats.quantize_nvfp4(x)
    cases.append(("nvfp4", lambda: formats.dequantize_nvfp4(nv_packed, nv_scales, nv_gs, dtype=torch.bfloat16),
                  nv_packed.numel() + nv_scales.numel() + 4 + out_bytes))
    for kind in formats.FP6_KINDS:
        p6, s6 = formats.quantize_mxfp6(x, kind=kind)
        cases.append((f"mxfp6_{kind}", lambda p6=p6, s6=s6, kind=kind: formats.dequantize_mxfp6(
            p6, s6, kind=kind, dtype=torch.bfloat16), p6.numel() + s6.numel() + out_bytes))
    d8, s8 = formats.quantize_mxfp8(x)
    cases.append(("mxfp8", lambda: formats.dequantize_mxfp8(d8, s8, dtype=torch.bfloat16),
                  d8.numel() + s8.numel() + out_bytes))
    return cases


def random_mxfp4_experts(device: str, hidden: int, intermediate: int, experts: int):
    """Random packed bytes and plausible E8M0 scales (2^-8 .. 2^-4); numerics don't matter for timing."""
    def weight(rows, k):
        packed = torch.randint(0, 256, (experts, rows, k // 2), dtype=torch.uint8, device=device)
        scales = torch.randint(119, 124, (experts, rows, k // 32), dtype=torch.uint8, device=device)
        return packed, scales

    w13, w13_scale = weight(2 * intermediate, hidden)
    w2, w2_scale = weight(hidden, intermediate)
    return dict(w13=w13, w13_scale=w13_scale, w2=w2, w2_scale=w2_scale, format="mxfp4")


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--out", help="append the markdown table to this file")
    args = parser.parse_args(argv)
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device (torch.cuda.is_available() is False)")
    on_gpu = device == "cuda"
    warmup, repeats = (5, 50) if on_gpu else (1, 5)
    rows, cols = (8192, 8192) if on_gpu else (2048, 4096)
    moe_repeats = 20 if on_gpu else 3

    if on_gpu:
        name = torch.cuda.get_device_name()
    else:
        name = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    lines = [f"### bench_numerics on {device} ({name}), torch {torch.__version__}", ""]

    copy_gbps = None
    if on_gpu:
        source = torch.empty(rows * cols * 2, dtype=torch.uint8, device=device)
        target = torch.empty_like(source)
        copy_s = median_seconds(lambda: target.copy_(source), device, warmup, repeats)
        copy_gbps = 2 * source.numel() / copy_s / 1e9
        lines += [f"Device-to-device copy: {copy_gbps:.1f} GB/s (read + write of {source.numel() / 2**20:.0f} MiB)", ""]

    lines += [f"Dequantization of a [{rows}, {cols}] weight to bf16 "
              "(GB/s = packed + scales read + bf16 output written):",
              ""]
    header = "| format | bytes moved (MiB) | median time (ms) | GB/s |" + (" fraction of copy |" if on_gpu else "")
    lines += [header, "|" + "---|" * (5 if on_gpu else 4)]
    for fmt, fn, nbytes in dequant_cases(rows, cols, device):
        seconds = median_seconds(fn, device, warmup, repeats)
        gbps = nbytes / seconds / 1e9
        row = f"| {fmt} | {nbytes / 2**20:.1f} | {seconds * 1e3:.2f} | {gbps:.2f} |"
        if copy_gbps:
            row += f" {gbps / copy_gbps:.2f} |"
        lines.append(row)

    shape = GPT_OSS_20B
    lines += ["", f"Emulation MoE latency, gpt-oss-20b MoE shape (H={shape['hidden']}, I={shape['intermediate']}, "
              f"E={shape['experts']}, top_k={shape['top_k']}), random mxfp4 weights, bf16 x, swigluoai:", "",
              "| T | active experts | median latency (ms) |", "|---|---|---|"]
    weights = random_mxfp4_experts(device, shape["hidden"], shape["intermediate"], shape["experts"])
    generator = torch.Generator(device=device).manual_seed(0)
    for tokens in (1, 64, 1024):
        x = torch.randn(tokens, shape["hidden"], device=device, generator=generator).bfloat16()
        logits = torch.randn(tokens, shape["experts"], device=device, generator=generator)
        active = torch.topk(logits, shape["top_k"], dim=-1).indices.unique().numel()
        seconds = median_seconds(
            lambda x=x, logits=logits: emulation.moe_forward(x, router_logits=logits, top_k=shape["top_k"], **weights),
            device, 1 if not on_gpu else 3, moe_repeats,
        )
        lines.append(f"| {tokens} | {active} | {seconds * 1e3:.1f} |")

    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as handle:
            handle.write("\n" + table)
    return table


if __name__ == "__main__":
    main()
