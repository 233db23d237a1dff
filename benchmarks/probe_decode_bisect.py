"""Where do the decode kernels' microseconds go at T = 1? Variants of backends/triton_moe/_gemv_kernels.py with parts
of the work left out, each timed as the whole layer (issue 26: gpt-oss-120b at T = 1 needs 0.60 of the memory floor).

Each variant is the kernel module's own source with text edits (VARIANTS), written to the output directory and
imported in place of the module's two kernels for its timing, so it follows the kernels as they change; an edit
whose anchor text is gone stops the probe (tests/test_probe_decode_bisect.py checks every anchor on CPU):

    full                                 the kernels as shipped (also at a 64-register cap, as the variants run)
    loads only                           the decode and MMAs replaced by an XOR of every loaded word
    loads only, no activation / scale loads, weights alone
    full, no activation loads / no scale loads
    given ids                            full and loads-only with the top-k ids given, so GEMV1 does not route

Outputs of the left-out variants are wrong by design: timing only. Every variant runs with the layer's decode config
(tuning.decode_kernels), so a kernel that loads its next step ahead keeps tuning.DECODE_AHEAD_MAXNREG registers; the
others run at a 64-register cap, which every variant fits without spilling, so that none gets more warps than the
shipped kernels. Each row is
the layer as a CUDA graph after the 256 MiB read flush, the best of 3 alternating rounds of the median of 50
(`backends.gpu_timing`), plus each kernel's time under torch.profiler.

    python benchmarks/probe_decode_bisect.py --out DIR [--layers gpt-oss-120b,deepseek-v3]   # CUDA GPU

It writes DIR/decode_bisect.csv.
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from _decode_variants import KERNELS, import_kernels  # noqa: E402
from _decode_variants import swapped as swapped_kernels  # noqa: E402

from backends.model_shapes import SHAPES  # noqa: E402

_MMA_DOC = '''    """acc_a / acc_b += one K step of rows A / B (the loads of _step_loads) times the activations."""
'''
# The step's sums replaced by one bit of the XOR of every word it loaded (so no load is dropped); the original body
# stays behind as an unused function.
_LOADS_ONLY = _MMA_DOC + '''    v0, v1, v2, v3 = _split4(wa ^ wb ^ x_lo ^ x_lo8 ^ x_hi ^ x_hi8)
    f = ((v0 ^ v1 ^ v2 ^ v3 ^ sa ^ sb) & 1).to(tl.float32)
    return acc_a + f, acc_a1, acc_b + f, acc_b1


@triton.jit
def _step_mma_unused(acc_a, acc_a1, acc_b, acc_b1, k0, t, wa, wb, sa, sb, x_lo, x_lo8, x_hi, x_hi8,
                     SCALE_BLOCK: tl.constexpr, NVFP4: tl.constexpr, FOLDED: tl.constexpr, USE_ASM: tl.constexpr):
'''
_ACT_LOADS = '''    x_lo = tl.load(first)
    x_lo8 = tl.load(first + 4)
    x_hi = tl.load(first + 16)
    x_hi8 = tl.load(first + 20)
'''
_NO_ACT_LOADS = '''    x_lo = tl.zeros_like(wa)
    x_lo8 = x_lo
    x_hi = x_lo
    x_hi8 = x_lo
'''
_SCALE_LOADS = '''    sa = tl.load(sa_row + chunk * stride_sc)
    sb = tl.load(sb_row + chunk * stride_sc)
'''
_NO_SCALE_LOADS = '''    sa = chunk.to(tl.int32) * 0 + 0x7F7F7F7F
    sb = sa
'''
_LOADS = (_MMA_DOC, _LOADS_ONLY)
_NO_ACT = (_ACT_LOADS, _NO_ACT_LOADS)
_NO_SCALES = (_SCALE_LOADS, _NO_SCALE_LOADS)
#: variant -> (edits of the kernel source, register cap); None: the shipped module at forward.DECODE_MAXNREG.
VARIANTS = {
    "full": None,
    "full, maxnreg 64": ((), 64),
    "loads only": ((_LOADS,), 64),
    "loads only, no activation loads": ((_LOADS, _NO_ACT), 64),
    "loads only, no scale loads": ((_LOADS, _NO_SCALES), 64),
    "loads only, weights alone": ((_LOADS, _NO_ACT, _NO_SCALES), 64),
    "full, no activation loads": ((_NO_ACT,), 64),
    "full, no scale loads": ((_NO_SCALES,), 64),
}
#: The variants also timed with the top-k ids given (no routing in GEMV1).
GIVEN_IDS = ("full", "loads only", "loads only, weights alone")


def variant_source(edits) -> str:
    """The kernel module's source with each (anchor, replacement) applied once; a missing anchor is an error naming
    it, since the probe would otherwise time the shipped kernels under a variant's name."""
    source = KERNELS.read_text()
    for anchor, replacement in edits:
        if source.count(anchor) != 1:
            raise ValueError(f"{KERNELS.name} no longer has exactly one {anchor.strip().splitlines()[0]!r}: update "
                             f"{Path(__file__).name}'s VARIANTS to the kernels' current text")
        source = source.replace(anchor, replacement)
    return source


def load_variant(name: str, edits, directory: str):
    """The variant's module, written to directory (so that Triton can read its source) and imported."""
    return import_kernels(name, variant_source(edits), directory)


def _run(out_dir: str, layers: list[str]) -> None:
    import torch

    import backends.triton_moe._gemv_kernels as shipped
    from backends.gpu_timing import Flusher, measure_ceilings, memory_floor, profile_kernels, time_graph_output
    from backends.layouts.triton_moe import to_kernel_layout
    from backends.triton_moe import _routing, forward, moe_forward, tuning
    from backends.triton_moe.testing import activation_kwargs, random_checkpoint

    os.makedirs(out_dir, exist_ok=True)
    modules = {name: (shipped, forward.DECODE_MAXNREG) if spec is None
               else (load_variant(name, spec[0], out_dir), spec[1]) for name, spec in VARIANTS.items()}
    flush, bandwidth = Flusher(), measure_ceilings()[0]
    arch, gpu_info = tuning.device_gpu(torch.device("cuda"))

    def swapped(name, fn):
        """fn() with the variant's kernels and register cap in place of the shipped ones."""
        with swapped_kernels(*modules[name]):
            return fn()

    with open(os.path.join(out_dir, "decode_bisect.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["gpu", "shape", "routing", "variant", "us", "floor_us", "floor_fraction", "gemv1_us",
                         "gemv2_us"])
        for layer in layers:
            shape = SHAPES[layer]
            gen = torch.Generator(device="cuda").manual_seed(0)
            weights = to_kernel_layout(**random_checkpoint(shape, device="cuda", generator=gen))
            act = activation_kwargs(shape)
            x = torch.randn(1, shape.hidden_size, device="cuda", generator=gen).bfloat16()
            logits = torch.randn(1, shape.experts, device="cuda", generator=gen)
            ids, route_w = _routing.route(logits, shape.top_k, True)  # the experts; their weights do not matter
            _, floor = memory_floor(logits, shape.top_k, shape.format, shape.hidden_size, shape.intermediate_size,
                                    bandwidth)
            config = tuning.select_config(arch, gpu_info, tuning.Problem(tokens=1, **shape.fields()))
            calls = {"logits": functools.partial(moe_forward, x, weights, router_logits=logits, top_k=shape.top_k,
                                                 config=config, **act),
                     "given ids": functools.partial(moe_forward, x, weights, topk_ids=ids.int(),
                                                    topk_weights=route_w.float(), config=config, **act)}
            runs = [(routing, name) for name in VARIANTS for routing in calls
                    if routing == "logits" or name in GIVEN_IDS]
            best: dict = {}
            for round_ in range(3):
                for routing, name in runs if round_ % 2 == 0 else runs[::-1]:
                    us, _ = swapped(name, functools.partial(time_graph_output, calls[routing], flush, 50))
                    best[routing, name] = min(best.get((routing, name), float("inf")), us)
            for (routing, name), us in best.items():
                per_kernel = dict(swapped(name, functools.partial(profile_kernels, calls[routing], flush)))
                writer.writerow([torch.cuda.get_device_name(), layer, routing, name, f"{us:.2f}", f"{floor:.2f}",
                                 f"{floor / us:.3f}", f"{per_kernel.get('gemv1_act_kernel', 0.0):.2f}",
                                 f"{per_kernel.get('gemv2_sum_kernel', 0.0):.2f}"])
                print(f"{layer} {routing} {name}: {us:.2f} µs", flush=True)
            f.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the results directory (benchmarks/results/<run>)")
    parser.add_argument("--layers", default="gpt-oss-120b,deepseek-v3",
                        help="comma-separated layers of backends.model_shapes.SHAPES")
    args = parser.parse_args(argv)
    layers = [name for name in args.layers.split(",") if name]
    unknown = [name for name in layers if name not in SHAPES]
    if unknown or not layers:
        parser.error(f"--layers {args.layers!r}: unknown {unknown or 'none given'}; choose from {sorted(SHAPES)}")
    import torch

    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (this machine has none)")
    _run(args.out, layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
