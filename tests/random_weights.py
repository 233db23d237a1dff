"""Random quantized MoE layers for the CPU tests: one builder, so that every test's layer has the same statistics."""

from __future__ import annotations

import torch

from backends import formats
from backends.weights import MoEWeights


def random_moe_weights(fmt: str, gate_up: str, *, experts=4, hidden=64, inter=64, bias=False, seed=0) -> MoEWeights:
    """A layer quantized from random fp32 weights (realistic codes and scales, no NaN): weights ~ N(0, 1/K) so that
    outputs stay O(1); NVFP4's global scale puts each expert's largest value at E4M3's 448 times FP4's 6."""
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5
    w2 = torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5
    fields: dict = {}
    if fmt == "mxfp4":
        fields["w13"], fields["w13_scale"] = formats.quantize_mxfp4(w13)
        fields["w2"], fields["w2_scale"] = formats.quantize_mxfp4(w2)
    else:
        fields["w13"], fields["w13_scale"], fields["w13_global_scale"] = formats.quantize_nvfp4(
            w13, 448 * 6 / w13.abs().amax(dim=(1, 2)))
        fields["w2"], fields["w2_scale"], fields["w2_global_scale"] = formats.quantize_nvfp4(
            w2, 448 * 6 / w2.abs().amax(dim=(1, 2)))
    if bias:
        fields["w13_bias"] = torch.randn(experts, 2 * inter, generator=g)
        fields["w2_bias"] = torch.randn(experts, hidden, generator=g)
    return MoEWeights(format=fmt, gate_up=gate_up, **fields)
