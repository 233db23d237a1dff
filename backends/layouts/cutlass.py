"""FlashInfer CUTLASS fused-MoE layouts for MXFP4: FLASHINFER_CUTLASS_MXFP4_BF16 (SM90) and _MXFP8 (SM100).

Both (vLLM 0.20.0 / 0.33.0): w13 rows -> ``[up; gate]`` (= [w3; w1]; gpt-oss rows are de-interleaved
first), the same for the w13 scales and bias; biases are passed as **bf16** (vLLM casts fp32 -> bf16:
the round trip is exact for bf16-representable biases, e.g. every gpt-oss checkpoint, and rounds to
nearest otherwise); per-expert gpt-oss SwiGLU constants in the config. Then, per variant:

* ``mxfp4_mxfp8`` (SM100, MXFP8 activations): weights as they are, both scale tensors in the 128x4
  interleave (flashinfer ``block_scale_interleave``, same [E, rows, K/32] shape; needs rows % 128
  and K % 128). Matches vLLM 0.20.0 with flashinfer 0.6.x-0.7.2.
* ``mxfp4_bf16_sm90`` (SM90 W4A16, flashinfer >= 0.6.16, i.e. the 0.7.x this project supports, and
  vLLM 0.33.0): scales folded ``[E, rows, K/32] -> reshape(E, rows/64, 4, 16, K/128, 4)
  .permute(0, 1, 4, 3, 2, 5) -> [E, rows/64, K/128, 16, 16]`` (flashinfer
  ``interleave_moe_scales_for_sm90_mixed_gemm``, pure torch); weights through flashinfer's
  ``interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4")``, a CUDA kernel whose bit permutation
  flashinfer does not specify in Python: converting needs flashinfer on a CUDA device, and there is
  no inverse (`LayoutUnavailable` names this). On the meta device shapes are planned without it.
* ``mxfp4_bf16_sm90_legacy`` (flashinfer 0.2.13-0.6.9, exactly vLLM 0.20.0's
  ``_interleave_mxfp4_cutlass_sm90``): weights as they are, scales
  ``[E, rows, K/32] -> reshape(E, rows, K/128, 4).permute(0, 2, 1, 3) -> [E, K/128, rows * 4]``.
  Do not pair it with flashinfer >= 0.6.10 (wrong weights) or >= 0.6.16 (wrong scales too).
"""

from __future__ import annotations

import torch

from backends.layouts.base import (
    Layout,
    LayoutUnavailable,
    require_multiple,
    require_tensor,
    tile_permute,
    tile_unpermute,
)
from backends.layouts.gate_up import invert_permutation, permute_rows, row_permutation
from backends.layouts.quant_config import GPT_OSS_SWIGLU, swiglu_config
from backends.layouts.scales import deinterleave_128x4, interleave_128x4
from backends.weights import KernelWeights, MoEWeights

__all__ = ["CutlassMxfp4Layout", "mxfp4_bf16_sm90", "mxfp4_bf16_sm90_legacy", "mxfp4_bf16_sm90_scales_only",
           "mxfp4_mxfp8", "sm90_fold_scales", "sm90_unfold_scales"]

VARIANTS = ("sm100_mxfp8", "sm90_bf16", "sm90_bf16_legacy", "sm90_bf16_scales_only")


_FOLD_DIMS = (0, 1, 4, 3, 2, 5)
_LEGACY_DIMS = (0, 2, 1, 3)


def sm90_fold_scales(s: torch.Tensor) -> torch.Tensor:
    """[E, rows, K/32] -> [E, rows/64, K/128, 16, 16] (flashinfer >= 0.6.16 SM90 mixed-GEMM scales)."""
    e, rows, groups = s.shape
    folded = tile_permute(s, (e, rows // 64, 4, 16, groups // 4, 4), _FOLD_DIMS)
    return folded.reshape(e, rows // 64, groups // 4, 16, 16)


def sm90_unfold_scales(folded: torch.Tensor, rows: int, groups: int) -> torch.Tensor:
    """Exact inverse of sm90_fold_scales."""
    e = folded.shape[0]
    flat = folded.reshape(e, rows, groups)
    return tile_unpermute(flat, (e, rows // 64, 4, 16, groups // 4, 4), _FOLD_DIMS)


def _flashinfer_sm90_weight_interleave(layout: str, w: torch.Tensor) -> torch.Tensor:
    if w.device.type == "meta":
        return torch.empty_like(w)
    try:
        from flashinfer.fused_moe import interleave_moe_weights_for_sm90_mixed_gemm
    except ImportError as err:
        raise LayoutUnavailable(
            f"layout {layout!r}: the SM90 W4A16 weight interleave is flashinfer's CUDA kernel "
            f"interleave_moe_weights_for_sm90_mixed_gemm (flashinfer-python >= 0.6.16), which is not importable "
            f"here ({err}); install moe-oracle[flashinfer] and convert on a CUDA device") from None
    if w.device.type != "cuda":
        raise LayoutUnavailable(f"layout {layout!r}: flashinfer's SM90 weight interleave runs on CUDA only; "
                                f"move the MoEWeights to a CUDA device before converting")
    return interleave_moe_weights_for_sm90_mixed_gemm(w.contiguous(), "fp4")


class CutlassMxfp4Layout(Layout):
    formats = ("mxfp4",)

    def __init__(self, layout: str, variant: str, swiglu: dict | None = None):
        if variant not in VARIANTS:
            raise ValueError(f"CutlassMxfp4Layout: variant={variant!r} must be one of {VARIANTS}")
        self.layout = layout
        self.variant = variant
        self.swiglu = dict(GPT_OSS_SWIGLU if swiglu is None else swiglu)

    def _check_sizes(self, w: MoEWeights) -> None:
        tile = 64 if self.variant.startswith("sm90_bf16") and self.variant != "sm90_bf16_legacy" else 128
        if self.variant != "sm90_bf16_legacy":
            require_multiple(self.layout, "2 * intermediate_size", 2 * w.I, tile, f"scale rows fill {tile}-row tiles")
            require_multiple(self.layout, "hidden_size (w2 rows)", w.H, tile, f"scale rows fill {tile}-row tiles")
        require_multiple(self.layout, "hidden_size", w.H, 128, "4 scale groups of 32 per 128-wide K tile")
        require_multiple(self.layout, "intermediate_size", w.I, 128, "4 scale groups of 32 per 128-wide K tile")

    def _scales(self, s: torch.Tensor) -> torch.Tensor:
        if self.variant == "sm100_mxfp8":
            return interleave_128x4(s)
        if self.variant == "sm90_bf16_legacy":
            e, rows, groups = s.shape
            return tile_permute(s, (e, rows, groups // 4, 4), _LEGACY_DIMS).reshape(e, groups // 4, rows * 4)
        return sm90_fold_scales(s)

    def _unscales(self, s: torch.Tensor, rows: int, groups: int) -> torch.Tensor:
        if self.variant == "sm100_mxfp8":
            return deinterleave_128x4(s, rows, groups)
        if self.variant == "sm90_bf16_legacy":
            e = s.shape[0]
            return tile_unpermute(s.reshape(e, rows, groups), (e, rows, groups // 4, 4), _LEGACY_DIMS)
        return sm90_unfold_scales(s, rows, groups)

    def _to_kernel(self, w: MoEWeights):
        perm = row_permutation(w.gate_up, "up_gate", w.I)
        w13, w2 = permute_rows(w.w13, perm), w.w2
        if self.variant == "sm90_bf16":
            w13, w2 = (_flashinfer_sm90_weight_interleave(self.layout, t) for t in (w13, w2))
        tensors = {"w13": w13, "w2": w2, "w13_scale": self._scales(permute_rows(w.w13_scale, perm)),
                   "w2_scale": self._scales(w.w2_scale)}
        if w.w13_bias is not None:
            tensors["w13_bias"] = permute_rows(w.w13_bias, perm).to(torch.bfloat16)
        if w.w2_bias is not None:
            tensors["w2_bias"] = w.w2_bias.to(torch.bfloat16)
        return tensors, swiglu_config(w, **{k.removeprefix("swiglu_"): v for k, v in self.swiglu.items()})

    def _from_kernel(self, kw: KernelWeights) -> MoEWeights:
        if self.variant == "sm90_bf16":
            raise LayoutUnavailable(
                f"layout {self.layout!r} cannot be inverted: flashinfer's SM90 weight interleave is a CUDA kernel "
                f"without a published inverse; keep the MoEWeights it was converted from")
        e, hidden, inter = kw.E, kw.padded_hidden_size, kw.padded_intermediate_size
        inv = invert_permutation(row_permutation(kw.gate_up, "up_gate", inter))
        w13 = require_tensor(self.layout, kw, "w13", (e, 2 * inter, hidden // 2), torch.uint8)
        bias13, bias2 = kw.tensors.get("w13_bias"), kw.tensors.get("w2_bias")
        return self._rebuild(
            kw, w13=permute_rows(w13, inv), w2=kw["w2"],
            w13_scale=permute_rows(self._unscales(kw["w13_scale"], 2 * inter, hidden // 32), inv),
            w2_scale=self._unscales(kw["w2_scale"], hidden, inter // 32),
            w13_bias=None if bias13 is None else permute_rows(bias13, inv).float(),
            w2_bias=None if bias2 is None else bias2.float())


#: MXFP4 backend FLASHINFER_CUTLASS_MXFP4_MXFP8 (SM100)
mxfp4_mxfp8 = CutlassMxfp4Layout("flashinfer_cutlass_mxfp4_sm100", "sm100_mxfp8")
#: MXFP4 backend FLASHINFER_CUTLASS_MXFP4_BF16 (SM90) with flashinfer >= 0.6.16 (0.7.x)
mxfp4_bf16_sm90 = CutlassMxfp4Layout("flashinfer_cutlass_mxfp4_sm90", "sm90_bf16")
#: FLASHINFER_CUTLASS_MXFP4_BF16 for flashinfer <= 0.6.9 (what vLLM 0.20.0's code writes)
mxfp4_bf16_sm90_legacy = CutlassMxfp4Layout("flashinfer_cutlass_mxfp4_sm90_legacy", "sm90_bf16_legacy")
#: the pure-torch stages of mxfp4_bf16_sm90 (row order, folded scales; weights not interleaved): for tests
#: and for a runner that applies flashinfer's weight interleave itself
mxfp4_bf16_sm90_scales_only = CutlassMxfp4Layout("flashinfer_cutlass_mxfp4_sm90_scales_only", "sm90_bf16_scales_only")
