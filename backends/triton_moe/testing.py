"""Random MoE checkpoints at real model sizes, built directly in the packed formats (no fp32 detour).

Shared by tests/test_triton_moe*.py and benchmarks/bench_moe.py. Weights are random bytes (every
E2M1 code, both signs); scales are drawn so that dequantized weights have a realistic spread and
outputs stay O(1): E8M0 exponents in [118, 123) as FlashInfer's SM90 tests use, E4M3 scales from
|N(0,1)| (never the NaN code), NVFP4 global multipliers in [50, 150).
"""

from __future__ import annotations

import torch

from backends.model_shapes import SHAPES as MODEL_SHAPES
from backends.model_shapes import ModelShape

#: The layers of the model matrix and the extra test shapes (one registry: backends/model_shapes.py).
Shape = ModelShape
SHAPES = MODEL_SHAPES


def random_checkpoint(shape: Shape, *, device="cpu", generator: torch.Generator | None = None,
                      gate_up_layout: str | None = None) -> dict:
    """Keyword arguments of backends.emulation.moe_forward (weights only) for `shape` (gate_up_layout: the
    shape's own unless given)."""
    gate_up_layout = gate_up_layout or shape.gate_up_layout
    e, h, i = shape.experts, shape.hidden_size, shape.intermediate_size
    block = 32 if shape.format == "mxfp4" else 16

    def packed(rows, k):
        return torch.randint(0, 256, (e, rows, k // 2), dtype=torch.uint8, device=device, generator=generator)

    def scales(rows, k):
        if shape.format == "mxfp4":
            return torch.randint(118, 123, (e, rows, k // block), dtype=torch.uint8, device=device,
                                 generator=generator)
        s = torch.randn((e, rows, k // block), device=device, generator=generator).abs() + 0.05
        return s.to(torch.float8_e4m3fn)

    args = {"format": shape.format, "gate_up_layout": gate_up_layout,
            "w13": packed(2 * i, h), "w13_scale": scales(2 * i, h), "w2": packed(h, i), "w2_scale": scales(h, i)}
    if shape.format == "nvfp4":
        # global multipliers ~100 and E4M3 scales ~1: weights ~ fp4 / 100, outputs O(1) at H = 7168
        args["w13_global_scale"] = torch.rand(e, device=device, generator=generator) * 100 + 50
        args["w2_global_scale"] = torch.rand(e, device=device, generator=generator) * 100 + 50
    if shape.biases:
        args["w13_bias"] = torch.randn(e, 2 * i, device=device, generator=generator)
        args["w2_bias"] = torch.randn(e, h, device=device, generator=generator)
    return args


def activation_kwargs(shape: Shape) -> dict:
    """gpt-oss SwiGLU constants for swigluoai, nothing for silu."""
    if shape.activation == "swigluoai":
        return {"activation": "swigluoai", "swiglu_alpha": 1.702, "swiglu_beta": 1.0, "swiglu_limit": 7.0}
    return {"activation": shape.activation}


def compare(out: torch.Tensor, ref: torch.Tensor, *, rel_l2_tol: float, rtol: float, atol_rms_units: float) -> dict:
    """How far a kernel output is from the reference, in units of the allowed error (<= 1 passes).

    rel_l2 = ||out - ref|| / ||ref||; elementwise = max |out - ref| / (atol_rms_units * rms + rtol * |ref|), rms being
    the RMS of the reference's row (one token's output), because a token's error scales with its own activations:
    in one batch the rows' RMS spread 8x (qwen3-next at T = 1000), and a whole-tensor RMS over-allows the small rows
    and under-allows the large ones.
    """
    out32, ref32 = out.float(), ref.float()
    rel = ((out32 - ref32).norm() / ref32.norm().clamp_min(1e-30)).item()
    rms = ref32.pow(2).mean(dim=-1, keepdim=True).sqrt() if ref32.dim() else ref32.abs()
    allowed = atol_rms_units * rms + rtol * ref32.abs()
    elementwise = ((out32 - ref32).abs() / allowed.clamp_min(1e-30)).max().item() if out.numel() else 0.0
    return {"rel_l2": rel, "rel_l2_ratio": rel / rel_l2_tol, "elementwise_ratio": elementwise,
            "finite": bool(torch.isfinite(out32).all()), "shape_ok": out.shape == ref.shape and out.dtype == ref.dtype}
