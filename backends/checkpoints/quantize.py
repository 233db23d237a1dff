"""Float expert weights <-> a quantized layer, to make checkpoints in the released layouts (tests, examples).

`quantize_moe` is what a model-optimizer export does to one layer: MXFP4 (E8M0 per 32), NVFP4 (E4M3 per 16 and
one global scale per expert shared by w1 and w3, as ModelOpt exports fused experts) or, for Quark, MXFP6.
`dequantize_moe` gives back the float weights the quantized layer stands for (the reference a model runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from backends import formats
from backends.checkpoints.quark import WEIGHT_DTYPES, QuarkMoEWeights
from backends.weights import MoEWeights

__all__ = ["dequantize_moe", "quantize_moe", "quantize_quark"]


def _per_expert(fn, *tensors):
    """fn applied to each expert's slices, results stacked: the temporaries of one expert, not of the layer (a
    DeepSeek-V3 layer's float temporaries would not fit beside it on one GPU)."""
    results = [fn(*(t[e] if isinstance(t, torch.Tensor) else t for t in tensors)) for e in range(tensors[0].shape[0])]
    if isinstance(results[0], tuple):
        return tuple(torch.stack(parts) for parts in zip(*results, strict=True))
    return torch.stack(results)


def _nvfp4_global(w: torch.Tensor) -> torch.Tensor:
    amax = torch.stack([w[e].abs().amax().float() for e in range(w.shape[0])])
    return torch.where(amax > 0, formats.FP8_E4M3_MAX * formats.FP4_E2M1_MAX / amax, torch.ones_like(amax))


def quantize_moe(w13: torch.Tensor, w2: torch.Tensor, *, format: str, gate_up: str,
                 w13_bias: torch.Tensor | None = None, w2_bias: torch.Tensor | None = None) -> MoEWeights:
    """Float w13 [E, 2I, H] (rows in `gate_up` order) and w2 [E, H, I] -> a MoEWeights of `format`."""
    bias = {"w13_bias": None if w13_bias is None else w13_bias.float(),
            "w2_bias": None if w2_bias is None else w2_bias.float()}
    if format == "mxfp4":
        q13, s13 = _per_expert(formats.quantize_mxfp4, w13)
        q2, s2 = _per_expert(formats.quantize_mxfp4, w2)
        return MoEWeights(format="mxfp4", gate_up=gate_up, w13=q13, w13_scale=s13, w2=q2, w2_scale=s2, **bias)
    if format == "nvfp4":
        g13, g2 = _nvfp4_global(w13), _nvfp4_global(w2)
        q13, s13, _ = _per_expert(formats.quantize_nvfp4, w13, g13)
        q2, s2, _ = _per_expert(formats.quantize_nvfp4, w2, g2)
        return MoEWeights(format="nvfp4", gate_up=gate_up, w13=q13, w13_scale=s13, w2=q2, w2_scale=s2,
                          w13_global_scale=g13.float(), w2_global_scale=g2.float(), **bias)
    raise ValueError(f"format={format!r} must be 'mxfp4' or 'nvfp4'")


def dequantize_moe(weights: MoEWeights | QuarkMoEWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """(w13 [E, 2I, H], w2 [E, H, I]) float32 values of a quantized layer."""
    if isinstance(weights, QuarkMoEWeights):
        t, fmt = weights.tensors, weights.weight_format
        if fmt == "mxfp4":
            return (_per_expert(formats.dequantize_mxfp4, t["w13_weight"], t["w13_weight_scale"]),
                    _per_expert(formats.dequantize_mxfp4, t["w2_weight"], t["w2_weight_scale"]))
        kind = fmt.split("_")[1]

        def mxfp6(packed, scales):
            return formats.dequantize_mxfp6(packed, scales, kind=kind)
        return (_per_expert(mxfp6, t["w13_weight"], t["w13_weight_scale"]),
                _per_expert(mxfp6, t["w2_weight"], t["w2_weight_scale"]))
    if weights.format == "mxfp4":
        return (_per_expert(formats.dequantize_mxfp4, weights.w13, weights.w13_scale),
                _per_expert(formats.dequantize_mxfp4, weights.w2, weights.w2_scale))
    assert weights.w13_global_scale is not None and weights.w2_global_scale is not None
    return (_per_expert(formats.dequantize_nvfp4, weights.w13, weights.w13_scale, weights.w13_global_scale),
            _per_expert(formats.dequantize_nvfp4, weights.w2, weights.w2_scale, weights.w2_global_scale))


def quantize_quark(w13: torch.Tensor, w2: torch.Tensor, quant_config: Mapping[str, Any]) -> QuarkMoEWeights:
    """Float contiguous w13 [E, 2I, H] and w2 [E, H, I] -> the Quark layer of `quant_config` (weights only)."""
    fmt = WEIGHT_DTYPES[quant_config["weight"]["dtype"]][0]
    if fmt == "mxfp4":
        (q13, s13), (q2, s2) = _per_expert(formats.quantize_mxfp4, w13), _per_expert(formats.quantize_mxfp4, w2)
    else:
        kind = fmt.split("_")[1]

        def mxfp6(x):
            return formats.quantize_mxfp6(x, kind=kind)
        (q13, s13), (q2, s2) = _per_expert(mxfp6, w13), _per_expert(mxfp6, w2)
    e, rows, h = w13.shape
    return QuarkMoEWeights(quant_config=dict(quant_config), weight_format=fmt, num_experts=e, hidden_size=h,
                           intermediate_size=rows // 2,
                           tensors={"w13_weight": q13, "w13_weight_scale": s13, "w2_weight": q2, "w2_weight_scale": s2})
