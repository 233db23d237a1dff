"""AITER (ROCm) MXFP4 W4A16 layout, as vLLM 0.20.0's AITER branch writes it for aiter's a16w4 MoE.

1. w13 rows de-interleaved to ``[gate; up]`` (gpt-oss ``(e, I, 2, k) -> permute(0, 2, 1, 3)``; a
   contiguous checkpoint is already there), the same for the w13 scales and the fp32 bias.
2. weights through aiter's ``shuffle_weight_a16w4(w, 16, gate_up)`` -- a pure reshape/permute in
   aiter's ``aiter/ops/shuffle.py`` (identical in the releases that carry the backward-compatible
   wrapper), NLane = 16, KLane = 4, KPack = 16 bytes:
   w13 (gate_up): ``view(E, 2, I/16, 16, K0, 4, 16).permute(0, 2, 1, 4, 5, 3, 6)``,
   w2: ``view(E, H/16, 16, K0, 4, 16).permute(0, 1, 3, 4, 2, 5)``, K0 = packed K / 64;
   weights are then viewed as ``torch.float4_e2m1fn_x2`` (same bytes).
3. scales through ``shuffle_scale_a16w4(s.view(E * rows, K/32), E, gate_up)``, N_Lane = 16,
   K_Lane = 4, K_Pack = N_Pack = 2, K1 = (K/32)/8, N1 = rows/32:
   w13: ``view(E, 2, N1, 16, K1, 2, 4).permute(0, 2, 4, 6, 3, 5, 1)``,
   w2: ``view(E, N1, 2, 16, K1, 2, 4).permute(0, 1, 4, 6, 3, 5, 2)``.
Padding, step 1 and the shuffles are one strided copy per tensor (`placement`).
Needs H and I multiples of 256 (the ROCm round-up rule already pads to 256). Biases stay fp32.
"""

from __future__ import annotations

import math

import torch

from backends.layouts.base import Layout, require_multiple, tile_unpermute
from backends.layouts.gate_up import gate_up_runs, invert_permutation, permute_rows, row_permutation, rows_runs
from backends.layouts.placement import RowCol, build, pad_matrix
from backends.weights import KernelWeights, MoEWeights

__all__ = ["AiterMxfp4Layout", "mxfp4"]

_W13_DIMS = (0, 2, 1, 4, 5, 3, 6)
_W2_DIMS = (0, 1, 3, 4, 2, 5)
_S13_DIMS = (0, 2, 4, 6, 3, 5, 1)
_S2_DIMS = (0, 1, 4, 6, 3, 5, 2)
_FP4X2 = getattr(torch, "float4_e2m1fn_x2", torch.uint8)


def _views(e: int, hidden: int, inter: int) -> dict:
    return {
        "w13": (e, 2, inter // 16, 16, (hidden // 2) // 64, 4, 16),
        "w2": (e, hidden // 16, 16, (inter // 2) // 64, 4, 16),
        "w13_scale": (e, 2, (2 * inter) // 32, 16, (hidden // 32) // 8, 2, 4),
        "w2_scale": (e, hidden // 32, 2, 16, (inter // 32) // 8, 2, 4),
    }


_DIMS = {"w13": _W13_DIMS, "w2": _W2_DIMS, "w13_scale": _S13_DIMS, "w2_scale": _S2_DIMS}
#: how many digits of each view (after E) split the rows; the rest split the columns
_ROW_DIGITS = {"w13": 3, "w2": 2, "w13_scale": 3, "w2_scale": 3}


def _shuffled(name: str, view: tuple, t: torch.Tensor, runs: list) -> torch.Tensor:
    """aiter's shuffle of the padded matrix `view` describes, written from t's rows by `runs` in one pass."""
    dims, row_digits = _DIMS[name], _ROW_DIGITS[name]
    inverse = tuple(sorted(range(len(dims)), key=lambda d: dims[d]))  # the shuffled position of view digit d
    stored = tuple(view[d] for d in dims)
    shape = (view[0], math.prod(view[1:1 + row_digits]), math.prod(view[1 + row_digits:]))
    return build(t, shape, lambda out: RowCol.of(out, stored[1:], tuple(i - 1 for i in inverse[1:]), row_digits),
                 runs, t.shape[-1])


class AiterMxfp4Layout(Layout):
    layout = "aiter_a16w4"
    formats = ("mxfp4",)

    def _check_sizes(self, w: MoEWeights, hidden: int, inter: int) -> None:
        for name, value in (("hidden_size", hidden), ("intermediate_size", inter)):
            require_multiple(self.layout, name, value, 256, "aiter's a16w4 tiles: 64-byte K lanes, K_Tile 256")

    def _to_kernel(self, w: MoEWeights, hidden: int, inter: int):
        views = _views(w.E, hidden, inter)

        def gate_up(t):
            return gate_up_runs(t, w.gate_up, "contiguous", inter)

        tensors = {
            "w13": _shuffled("w13", views["w13"], w.w13, gate_up(w.w13)).view(_FP4X2),
            "w2": _shuffled("w2", views["w2"], w.w2, rows_runs(w.w2, hidden)).view(_FP4X2),
            "w13_scale": _shuffled("w13_scale", views["w13_scale"], w.w13_scale, gate_up(w.w13_scale)),
            "w2_scale": _shuffled("w2_scale", views["w2_scale"], w.w2_scale, rows_runs(w.w2_scale, hidden)),
        }
        if w.w13_bias is not None:
            tensors["w13_bias"] = build(w.w13_bias, (w.E, 2 * inter), lambda out: RowCol.plain(out[..., None]),
                                        gate_up(w.w13_bias), 1)
        if w.w2_bias is not None:
            tensors["w2_bias"] = pad_matrix(w.w2_bias[..., None], hidden, 1)[..., 0]
        return tensors, {}

    def _from_kernel(self, kw: KernelWeights) -> MoEWeights:
        hidden, inter = kw.padded_hidden_size, kw.padded_intermediate_size
        inv = invert_permutation(row_permutation(kw.gate_up, "contiguous", inter))
        views = _views(kw.E, hidden, inter)
        bias13 = kw.tensors.get("w13_bias")
        return self._rebuild(
            kw,
            w13=permute_rows(tile_unpermute(kw["w13"].view(torch.uint8), views["w13"], _W13_DIMS), inv),
            w2=tile_unpermute(kw["w2"].view(torch.uint8), views["w2"], _W2_DIMS),
            w13_scale=permute_rows(tile_unpermute(kw["w13_scale"], views["w13_scale"], _S13_DIMS), inv),
            w2_scale=tile_unpermute(kw["w2_scale"], views["w2_scale"], _S2_DIMS),
            w13_bias=None if bias13 is None else permute_rows(bias13, inv), w2_bias=kw.tensors.get("w2_bias"))


#: MXFP4 backend AITER
mxfp4 = AiterMxfp4Layout()
