"""Layout conversion of one gpt-oss-120b-sized MoE layer per backend, against the device's copy bandwidth.

Why: a server converts every MoE layer once at load time (36 layers for gpt-oss-120b); a converter
that runs near copy bandwidth costs milliseconds per layer, a per-expert Python loop (what vLLM
does for TRT-LLM and Marlin) costs far more. For each converter this times the batched conversion
(padding to the backend's sizes included) and the same work done expert by expert (convert one
expert, then concatenate), and reports the batched one as a fraction of a device-to-device copy
measured in the same run. Bytes counted: checkpoint tensors read once + kernel tensors written
once (the floor); copy bandwidth counts read + write likewise.

    python benchmarks/bench_layouts.py --device cuda --out benchmarks/README-layouts-table.md

`--only marlin,sm90,triton_moe` times only the converters whose layout name contains one of the words (the
copy baseline is always measured); `--torch-path` adds, for the layouts with a Triton fast path
(`backends.layouts._nibble_kernels`), a row timing their pure-torch path (MOE_ORACLE_LAYOUT_KERNELS=torch) in
the same run; `--byte-loads` adds a row with the kernel loading one source byte at a time
(MOE_ORACLE_LAYOUT_KERNEL_LOADS=bytes; the default reads whole int32 source words) for those layouts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from backends.layouts import (  # noqa: E402
    aiter,
    cutlass,
    deepgemm,
    identity,
    marlin,
    nvfp4_cutlass,
    oai_triton,
    triton_moe,
    trtllm,
)
from backends.layouts._nibble_kernels import ENV as KERNELS_ENV  # noqa: E402
from backends.layouts._nibble_kernels import GROUP_PROGRAM, LOADS_ENV  # noqa: E402
from backends.weights import KernelWeights, MoEWeights  # noqa: E402

from layout_cases import random_layer  # noqa: E402

GPT_OSS_120B = {"experts": 128, "hidden": 2880, "intermediate": 2880}
#: layouts whose weights go through the Triton word gather on CUDA (pure torch elsewhere)
KERNEL_LAYOUTS = ("flashinfer_cutlass_mxfp4_sm90", "marlin_mxfp4_bfloat16", "marlin_nvfp4_bfloat16", "triton_moe")

# (converter, backends it serves, format, padded (H, I)): MXFP4 sizes are the rules' round_up for the
# backend; NVFP4 has no round_up, so those layers are padded to the least each layout accepts.
ROWS = [
    (identity.emulation, "EMULATION, XPU", "mxfp4", (2880, 2880)),
    (deepgemm.mxfp4, "DEEPGEMM_MXFP4", "mxfp4", (2944, 2944)),
    (trtllm.mxfp4, "FLASHINFER_TRTLLM_MXFP4_*", "mxfp4", (3072, 3072)),
    (cutlass.mxfp4_mxfp8, "FLASHINFER_CUTLASS_MXFP4_MXFP8", "mxfp4", (2944, 2944)),
    (cutlass.mxfp4_bf16_sm90, "FLASHINFER_CUTLASS_MXFP4_BF16 (fi >= 0.6.16)", "mxfp4", (2944, 2944)),
    (cutlass.mxfp4_bf16_sm90_legacy, "FLASHINFER_CUTLASS_MXFP4_BF16 (fi <= 0.6.9)", "mxfp4", (2944, 2944)),
    (aiter.mxfp4, "AITER", "mxfp4", (3072, 3072)),
    (oai_triton.mxfp4, "TRITON, TRITON_UNFUSED (before convert_layout)", "mxfp4", (2880, 2880)),
    (marlin.mxfp4, "MARLIN, BATCHED_MARLIN", "mxfp4", (3072, 2944)),
    (trtllm.nvfp4, "FLASHINFER_TRTLLM (NVFP4)", "nvfp4", (2944, 2880)),
    (nvfp4_cutlass.flashinfer_cutlass, "FLASHINFER_CUTLASS (NVFP4)", "nvfp4", (2880, 2880)),
    (nvfp4_cutlass.cutedsl, "FLASHINFER_CUTEDSL(_BATCHED)", "nvfp4", (2880, 2880)),
    (nvfp4_cutlass.vllm_cutlass, "VLLM_CUTLASS", "nvfp4", (2880, 2880)),
    (marlin.nvfp4, "MARLIN (NVFP4)", "nvfp4", (2880, 2880)),
    (triton_moe.converter, "TRITON_MOE (moe-oracle)", "mxfp4", (2880, 2880)),
    (triton_moe.converter, "TRITON_MOE (moe-oracle, NVFP4)", "nvfp4", (2880, 2880)),
]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_ms(fn, device: str, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    sync(device)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def tensors_of(obj) -> list:
    if isinstance(obj, KernelWeights):
        return list(obj.tensors.values())
    return [v for v in vars(obj).values() if isinstance(v, torch.Tensor)]


def tensor_bytes(obj) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_of(obj))


def moved_bytes(w: MoEWeights, kw: KernelWeights) -> int:
    """The floor: checkpoint tensors read once and kernel tensors written once; tensors passed through
    unchanged (same storage) move nothing."""
    def storage(t):
        return t.untyped_storage().data_ptr()

    inputs, outputs = tensors_of(w), tensors_of(kw)
    shared = {storage(t) for t in inputs} & {storage(t) for t in outputs}
    return sum(t.numel() * t.element_size() for t in inputs + outputs if storage(t) not in shared)


def expert(w: MoEWeights, e: int) -> MoEWeights:
    fields = {name: getattr(w, name) for name in w.__dataclass_fields__}
    return MoEWeights(**{k: (v[e:e + 1] if isinstance(v, torch.Tensor) else v) for k, v in fields.items()})


def per_expert_loop(converter, w: MoEWeights, padded) -> dict:
    """The same conversion, one expert at a time, then stacked (vLLM's loops do the same)."""
    parts = [converter.convert(expert(w, e), hidden_size=padded[0], intermediate_size=padded[1]) for e in range(w.E)]
    return {name: torch.cat([p.tensors[name] for p in parts]) for name in parts[0].tensors}


def copy_gbps(device: str, nbytes: int, warmup: int, repeats: int) -> float:
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device, warmup, repeats)
    return 2 * nbytes / ms / 1e6


def primitives(device: str, experts: int, repeats: int) -> list:
    """The copies a converter is made of, on the w13 of the same layer, against the plain copy of it.

    Each row is one strided copy as `placement` issues it (or the gather it replaced), with the element
    type it is moved as; "exact" says the bytes came out equal to the same copy done byte by byte."""
    rows, row_bytes = 2 * GPT_OSS_120B["intermediate"], GPT_OSS_120B["hidden"] // 2
    g = torch.Generator(device=device).manual_seed(0)
    src = torch.randint(0, 256, (experts, rows, row_bytes), dtype=torch.uint8, device=device, generator=g)
    plain = torch.empty_like(src)
    copy_ms = median_ms(lambda: plain.copy_(src), device, 3, repeats)
    nbytes = 2 * src.numel()
    lines = ["| copy | moved as | GB/s | % of copy | exact |", "|---|---|---|---|---|",
             f"| contiguous copy of w13 ({src.numel() / 1e9:.2f} GB) | uint8 | {nbytes / copy_ms / 1e6:.0f} "
             f"| 100% | - |"]

    def row(name, kind, fn, moved, check=None):
        out = fn()
        ms = median_ms(fn, device, 2, repeats)
        exact = "-" if check is None else str(bool(torch.equal(out.view(torch.uint8), check.view(torch.uint8))))
        lines.append(f"| {name} | {kind} | {moved / ms / 1e6:.0f} | {100 * copy_ms * moved / nbytes / ms:.0f}% "
                     f"| {exact} |")
        print(lines[-1], flush=True)

    half = src.view(experts, rows // 2, 2, row_bytes)[:, :, 0]
    padded = torch.empty((experts, rows + 384, row_bytes + 96), dtype=torch.uint8, device=device)
    reference_half = half.contiguous()
    words = {"uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64, "complex128": torch.complex128}
    for kind, dtype in words.items():
        out_half = torch.empty((experts, rows // 2, row_bytes), dtype=torch.uint8, device=device)
        row("every other row (gate half of gpt-oss w13)", kind,
            lambda o=out_half, d=dtype: (o.view(d).copy_(half.view(d)), o)[1], 2 * half.numel(), reference_half)
    for kind, dtype in words.items():
        def pad_copy(d=dtype):
            padded.view(d)[:, :rows, : row_bytes * 1 // torch.empty((), dtype=d).element_size()].copy_(src.view(d))
            return padded[:, :rows, :row_bytes]
        row("rows into a wider padded buffer (1440 -> 1536 bytes)", kind, pad_copy, nbytes, src)
    perm = torch.randperm(rows, device=device)
    row("index_select of rows (the gather placement replaced)", "int64",
        lambda: src.view(torch.int64).index_select(1, perm), nbytes)
    from backends.layouts import cutlass, marlin
    w = src[:, :, :].contiguous()
    for name, fn in (("marlin.repack_weights", marlin.repack_weights),
                     ("cutlass.sm90_interleave_weights", cutlass.sm90_interleave_weights)):
        eager = fn(w)
        row(f"{name} (eager)", "uint8 / int32", lambda f=fn: f(w), nbytes)
        try:
            compiled = torch.compile(fn, dynamic=False)
            start = time.perf_counter()
            compiled(w)
            sync(device)
            compile_s = time.perf_counter() - start
            row(f"{name} under torch.compile (compile {compile_s:.0f} s)", "generated", lambda c=compiled: c(w), nbytes,
                eager)
        except Exception as error:  # noqa: BLE001 - a measurement that could not be taken is reported, not fatal
            lines.append(f"| {name} under torch.compile | failed: {type(error).__name__}: {str(error)[:80]} | | | |")
        del eager
    return lines


def time_row(converter, label, backends, fmt, padded, w, copy, device, args, loop=True) -> str:
    """One table row: the batched conversion (and, with `loop`, the per-expert loop, checked to write the same
    bytes) against the same-run copy bandwidth `copy`."""
    kw = converter.convert(w, hidden_size=padded[0], intermediate_size=padded[1])
    if loop:
        looped_out = per_expert_loop(converter, w, padded)
        for key, t in kw.tensors.items():  # the loop does the same work: same bytes (NVFP4 config aside)
            assert torch.equal(looped_out[key].contiguous().view(torch.uint8), t.contiguous().view(torch.uint8)), key
        del looped_out
    moved = moved_bytes(w, kw)
    del kw

    def batched():
        return converter.convert(w, hidden_size=padded[0], intermediate_size=padded[1])

    ms = median_ms(batched, device, 2, args.repeats)
    loop_ms = median_ms(lambda: per_expert_loop(converter, w, padded), device, 1, args.loop_repeats) if loop else None
    gbps = moved / ms / 1e6
    share = f"{100 * gbps / copy:.0f}%" if moved else "no copy"
    loop_cells = f"{loop_ms:.1f} | {loop_ms / ms:.1f}x" if loop else "- | -"
    return (f"| {label} | {backends} | {fmt} | {padded[0]} x {padded[1]} | {moved / 1e9:.2f} "
            f"| {ms:.2f} | {gbps:.0f} | {share} | {loop_cells} |")


def weight_kernel_rows(layers: dict, copy: float, device: str, args) -> list:
    """The word-gather kernel alone (w13 and w2, padding and row order included) per kernel layout: what the
    converters spend outside it (scales, biases, checks) is the difference to their batched row."""
    from backends.layouts import _nibble_kernels as kernels

    def marlin_weights(w, hidden, inter):
        return (marlin._repack_fast(w.w13, 2 * inter, hidden, kernels.w13_rows(w.gate_up, "checkpoint", w.I, inter)),
                marlin._repack_fast(w.w2, hidden, inter, kernels.plain_rows(w.H, hidden)))

    def sm90_weights(w, hidden, inter):
        return (cutlass._sm90_interleave_fast(w.w13, 2 * inter, hidden,
                                              kernels.w13_rows(w.gate_up, "up_gate", w.I, inter)),
                cutlass._sm90_interleave_fast(w.w2, hidden, inter, kernels.plain_rows(w.H, hidden)))

    def triton_moe_weights(w, hidden, inter):
        return (triton_moe._split_halves_fast(w.w13, 2 * inter, hidden,
                                              kernels.w13_rows(w.gate_up, "gate_up", w.I, inter)),
                triton_moe._split_halves_fast(w.w2, hidden, inter, kernels.plain_rows(w.H, hidden)))

    lines = ["| weight kernel alone | format | padded H x I | GB moved | ms | GB/s | % of copy |",
             "|---|---|---|---|---|---|---|"]
    for label, fn, fmt, (hidden, inter) in (("Marlin repack", marlin_weights, "mxfp4", (3072, 2944)),
                                            ("Marlin repack", marlin_weights, "nvfp4", (2880, 2880)),
                                            ("SM90 interleave", sm90_weights, "mxfp4", (2944, 2944)),
                                            ("triton_moe split halves", triton_moe_weights, "mxfp4", (2880, 2880))):
        w = layers[fmt]
        outs = fn(w, hidden, inter)
        moved = w.w13.numel() + w.w2.numel() + sum(o.numel() * o.element_size() for o in outs)
        del outs
        ms = median_ms(lambda w=w, fn=fn, h=hidden, i=inter: fn(w, h, i), device, 2, args.repeats)
        gbps = moved / ms / 1e6
        lines.append(f"| {label} | {fmt} | {hidden} x {inter} | {moved / 1e9:.2f} | {ms:.2f} | {gbps:.0f} "
                     f"| {100 * gbps / copy:.0f}% |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--experts", type=int, default=GPT_OSS_120B["experts"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--loop-repeats", type=int, default=3)
    parser.add_argument("--out", help="also write the table (markdown) to this file")
    parser.add_argument("--primitives", help="also time the copies the converters are made of; table to this file")
    parser.add_argument("--only", help="comma-separated words: time only converters whose layout contains one")
    parser.add_argument("--torch-path", action="store_true",
                        help="also time the pure-torch path of the layouts that have a Triton fast path")
    parser.add_argument("--byte-loads", action="store_true",
                        help="also time the Triton fast path loading one source byte at a time (the default "
                             "reads whole int32 words)")
    parser.add_argument("--group-programs", default="",
                        help="also time the grouped word kernel with these program shapes, comma-separated "
                             "GROUPS:WARPS:ROWS (groups of 4 output words per program, warps, the most output rows "
                             "per program when threads walk rows; see _nibble_kernels.GROUP_PROGRAM)")
    parser.add_argument("--weight-kernels", help="also time the word-gather kernels alone; table to this file")
    args = parser.parse_args()
    device = args.device
    if args.primitives:
        table = "\n".join(primitives(device, args.experts, args.repeats))
        print(table)
        with open(args.primitives, "w") as f:
            f.write(table + "\n")
        if device == "cuda":
            torch.cuda.empty_cache()
    hidden, inter = GPT_OSS_120B["hidden"], GPT_OSS_120B["intermediate"]
    layers = {fmt: random_layer(fmt, experts=args.experts, hidden=hidden, inter=inter, device=device, seed=1,
                                finite_scales=True) for fmt in ("mxfp4", "nvfp4")}
    copy = copy_gbps(device, tensor_bytes(layers["mxfp4"]), 3, args.repeats)
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({os.cpu_count()} threads)"
    lines = [f"Device: {name}; torch {torch.__version__}; E={args.experts}, H=I={hidden} before padding; "
             f"device copy (read+write) {copy:.0f} GB/s.", "",
             "| converter | backends | format | padded H x I | GB moved | batched ms | GB/s | % of copy "
             "| per-expert loop ms | loop / batched |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    words = args.only.split(",") if args.only else None
    for converter, backends, fmt, padded in ROWS:
        if words and not any(word in converter.layout for word in words):
            continue
        variants = [("", {}, None)]  # (label suffix, environment, grouped kernel program)
        if converter.layout in KERNEL_LAYOUTS:
            variants += [(" (byte loads)", {LOADS_ENV: "bytes"}, None)] if args.byte_loads else []
            variants += [(" (pure torch)", {KERNELS_ENV: "torch"}, None)] if args.torch_path else []
            for shape in filter(None, args.group_programs.split(",")):
                groups, warps, rows = (int(x) for x in shape.split(":"))
                variants.append((f" (program {groups} groups, {warps} warps, {rows} rows)", {},
                                 {"groups": groups, "warps": warps, "rows_fastest_rows": rows}))
        default_program = dict(GROUP_PROGRAM)
        for suffix, environment, program in variants:
            os.environ.update(environment)
            GROUP_PROGRAM.update(program or {})
            try:
                lines.append(time_row(converter, f"`{converter.layout}`{suffix}", backends, fmt, padded, layers[fmt],
                                      copy, device, args, loop=not suffix))
            finally:
                for name in environment:
                    os.environ.pop(name, None)
                GROUP_PROGRAM.update(default_program)
            print(lines[-1], flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    if args.weight_kernels:
        with open(args.weight_kernels, "w") as f:
            f.write("\n".join(weight_kernel_rows(layers, copy, device, args)) + "\n")


if __name__ == "__main__":
    main()
