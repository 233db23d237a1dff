"""The decode kernels of this tree against other versions of them, same run: what a kernel change buys, per layer.

Each version (--against REV: backends/triton_moe/_gemv_kernels.py at a git revision; --variant FILE: a module of
its own, such as an edited copy) replaces the tree's two kernels (benchmarks/_decode_variants.py) and is timed
against them on every layer asked, at each T (1-2: the decode kernels' range), with the heuristic's decode config
(or what a variant's own `adjust_config(config, shape, tokens)` returns):
the layer with router logits as a CUDA graph after the 256 MiB read flush, the best of 3 rounds in alternating
order of the median of 50 (backends.gpu_timing), and at T = 1 each kernel's own µs under torch.profiler. Every
output is checked against the emulation (rel L2) and bit for bit against the tree's kernels.

    python benchmarks/ab_decode_kernels.py --out benchmarks/results/<run> --against 94eda3a [--variant FILE]
        [--layers gpt-oss-120b,deepseek-v3] [--tokens 1,2]       # CUDA GPU

Writes <out>/ab_decode_kernels.csv (one row per layer, T and version; "tree" is this checkout's kernels).
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from _decode_variants import import_kernels, kernels_at, swapped  # noqa: E402

from backends.model_shapes import MATRIX, SHAPES  # noqa: E402
from backends.triton_moe.tuning import DECODE_KERNEL_TOKENS  # noqa: E402

TREE = "tree"
#: the T that take the decode kernels
DECODE_TOKENS = tuple(range(1, DECODE_KERNEL_TOKENS + 1))


def sources(against: list[str], variants: list[str]) -> dict:
    """Version name -> kernel module source: each revision's kernels ("at REV"), each variant file's (its name)."""
    found = {f"at {rev}": kernels_at(rev) for rev in against}
    for path in variants:
        found[Path(path).name] = Path(path).read_text()
    return found


def _run(out_dir: str, layers: list[str], tokens: list[int], modules: dict) -> None:
    import torch

    import backends.triton_moe._gemv_kernels as tree
    from backends import emulation
    from backends.gpu_timing import Flusher, measure_ceilings, memory_floor, profile_kernels, time_graph_output
    from backends.layouts.triton_moe import to_kernel_layout
    from backends.triton_moe import moe_forward, tuning
    from backends.triton_moe.testing import activation_kwargs, compare, random_checkpoint

    modules = {TREE: tree, **modules}
    flush, bandwidth = Flusher(), measure_ceilings()[0]
    arch, gpu_info = tuning.device_gpu(torch.device("cuda"))
    with open(os.path.join(out_dir, "ab_decode_kernels.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["gpu", "shape", "tokens", "version", "config", "us", "ratio_to_tree", "floor_us",
                         "floor_fraction", "rel_l2_vs_emulation", "same_bits_as_tree", "gemv1_us", "gemv2_us"])
        for layer in layers:
            shape = SHAPES[layer]
            gen = torch.Generator(device="cuda").manual_seed(0)
            checkpoint = random_checkpoint(shape, device="cuda", generator=gen)
            weights, act = to_kernel_layout(**checkpoint), activation_kwargs(shape)
            for t in tokens:
                x = torch.randn(t, shape.hidden_size, device="cuda", generator=gen).bfloat16()
                logits = torch.randn(t, shape.experts, device="cuda", generator=gen)
                _, floor = memory_floor(logits, shape.top_k, shape.format, shape.hidden_size,
                                        shape.intermediate_size, bandwidth)
                config = tuning.select_config(arch, gpu_info, tuning.Problem(tokens=t, **shape.fields()))
                configs = {name: _config_of(module, config, shape, t) for name, module in modules.items()}
                calls = {name: functools.partial(moe_forward, x, weights, router_logits=logits, top_k=shape.top_k,
                                                 config=configs[name], **act) for name in modules}
                reference = emulation.moe_forward(x, **checkpoint, router_logits=logits, top_k=shape.top_k, **act)
                best, outputs = {}, {}
                for round_ in range(3):
                    for name in list(modules) if round_ % 2 == 0 else list(modules)[::-1]:
                        with swapped(modules[name]):
                            us, out = time_graph_output(calls[name], flush, 50)
                        best[name], outputs[name] = min(best.get(name, float("inf")), us), out.clone()
                for name, module in modules.items():
                    kernels = {}
                    if t == 1:
                        with swapped(module):
                            kernels = dict(profile_kernels(calls[name], flush))
                    rel = compare(outputs[name], reference, rel_l2_tol=1.0, rtol=0.0, atol_rms_units=1.0)["rel_l2"]
                    same = torch.equal(outputs[name].view(torch.int16), outputs[TREE].view(torch.int16))
                    writer.writerow([torch.cuda.get_device_name(), layer, t, name, configs[name].decode.label,
                                     f"{best[name]:.2f}", f"{best[name] / best[TREE]:.3f}", f"{floor:.2f}",
                                     f"{floor / best[name]:.3f}", f"{rel:.2e}", same,
                                     f"{kernels.get('gemv1_act_kernel', 0.0):.2f}",
                                     f"{kernels.get('gemv2_sum_kernel', 0.0):.2f}"])
                f.flush()
                print(layer, t, {name: round(us, 2) for name, us in best.items()}, flush=True)


def _config_of(module, config, shape, tokens):
    """The config a version runs with: the heuristic's, or what the module's own adjust_config(config, shape, tokens)
    makes of it (a variant that times other warps with the same kernels)."""
    adjust = getattr(module, "adjust_config", None)
    return config if adjust is None else adjust(config, shape, tokens)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the results directory (benchmarks/results/<run>)")
    parser.add_argument("--against", action="append", default=[], metavar="REV",
                        help="a git revision whose decode kernels to time against the tree's (repeatable)")
    parser.add_argument("--variant", action="append", default=[], metavar="FILE",
                        help="a kernel module (an edited copy of _gemv_kernels.py) to time against the tree's")
    parser.add_argument("--layers", default=",".join(MATRIX), help="comma-separated layers of model_shapes.SHAPES")
    parser.add_argument("--tokens", default="1,2", help=f"comma-separated T, each in {DECODE_TOKENS}")
    args = parser.parse_args(argv)
    if not args.against and not args.variant:
        parser.error("nothing to compare: give --against REV or --variant FILE")
    layers = [name for name in args.layers.split(",") if name]
    unknown = [name for name in layers if name not in SHAPES]
    if unknown or not layers:
        parser.error(f"--layers {args.layers!r}: unknown {unknown or 'none given'}; choose from {sorted(SHAPES)}")
    try:
        tokens = [int(t) for t in args.tokens.split(",") if t]
    except ValueError:
        tokens = []
    if not tokens or any(t not in DECODE_TOKENS for t in tokens):
        parser.error(f"--tokens {args.tokens!r}: give T from {DECODE_TOKENS}, the decode kernels' range")
    missing = [path for path in args.variant if not os.path.isfile(path)]
    if missing:
        parser.error(f"--variant {missing[0]!r}: no such file")
    try:
        found = sources(args.against, args.variant)
    except ValueError as error:
        parser.error(str(error))
    import torch

    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (this machine has none)")
    os.makedirs(args.out, exist_ok=True)
    modules = {name: import_kernels(name, source, args.out) for name, source in found.items()}
    _run(args.out, layers, tokens, modules)
    return 0


if __name__ == "__main__":
    sys.exit(main())
