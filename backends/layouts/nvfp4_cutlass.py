"""NVFP4 layouts with 128x4-swizzled block scales: FLASHINFER_CUTLASS, FLASHINFER_CUTEDSL(_BATCHED), VLLM_CUTLASS.

vLLM ``prepare_nvfp4_moe_layer_for_fi_or_cutlass`` (0.15.1 and 0.20.0) with flashinfer 0.6.x-0.7.2:

=================================  ==========================  =====================  =================
backend                            w13 row order               input-scale reduction  vLLM versions
=================================  ==========================  =====================  =================
FLASHINFER_CUTLASS                 ``up_gate`` ([w3; w1])      max over all experts   0.15, 0.20
FLASHINFER_CUTEDSL(_BATCHED)       ``up_gate_groups64``        max over all experts   0.20
FLASHINFER_CUTEDSL                 ``contiguous`` ([w1; w3])   max over all experts   0.15
VLLM_CUTLASS                       ``contiguous`` ([w1; w3])   max of (w1, w3) per    0.15, 0.20
                                                               expert
=================================  ==========================  =====================  =================

Weights are otherwise unchanged; both block-scale tensors are stored in the 128x4 interleave
(`scales.interleave_128x4`, = vLLM ``swizzle_blockscale``: rows padded to 128, columns to 4, shape
[E, Mp, Kp]; CuteDSL's ``convert_sf_to_mma_layout`` is a 6-D *view* of these same bytes). As in
vLLM, a gated w13 whose 2I is not a multiple of 128 is refused (the scale padding would need weight
rows it cannot pad). Padding, the row order and the 128x4 tiles are one strided copy per tensor
(`placement`); an unpadded w2 is passed through. Config: the g1/g2 alphas and a1/a2 global scales
that `convert(..., quant_config=...)` passes, built from the rules' kind (shared or per-expert input
scale), plus the checkpoint scalars.
"""

from __future__ import annotations

import torch

from backends.layouts.base import (
    Layout,
    require_multiple,
    require_tensor,
    source_config,
)
from backends.layouts.gate_up import (
    LINEAR_ORDERS,
    gate_up_runs,
    invert_permutation,
    permute_rows,
    row_permutation,
    rows_runs,
)
from backends.layouts.placement import RowCol, build, pad_matrix
from backends.layouts.scales import build_128x4, deinterleave_128x4, padded_128x4
from backends.weights import KernelWeights, MoEWeights

__all__ = ["Nvfp4SwizzledLayout", "cutedsl", "cutedsl_v015", "flashinfer_cutlass", "vllm_cutlass"]


class Nvfp4SwizzledLayout(Layout):
    formats = ("nvfp4",)

    def __init__(self, layout: str, order: str):
        self.layout, self.order = layout, order

    def _check_sizes(self, w: MoEWeights, hidden: int, inter: int) -> None:
        require_multiple(self.layout, "2 * intermediate_size", 2 * inter, 128,
                         "gated w13 scale rows fill 128-row tiles and vLLM does not pad gated weight rows")
        if self.order == "up_gate_groups64":
            require_multiple(self.layout, "intermediate_size", inter, 64,
                             "CuteDSL interleaves gate/up in 64-row groups")

    def _rows(self, rc: RowCol) -> RowCol:
        """The w13 view's rows in `order`: CuteDSL's row 128 g + 64 h + i (h = 0 up) gets digits (g, i, h)."""
        if self.order != "up_gate_groups64":
            return rc
        if rc.row_dims == 1:
            return rc.split(0, (rc.view.shape[1] // 128, 2, 64)).order((0, 2, 1))
        return rc.split(1, (2, 2)).order((0, 2, 3, 1))  # 128x4 digits (t, q, r): q = 2 h + q'

    def _to_kernel(self, w: MoEWeights, hidden: int, inter: int):
        e = w.E
        digit = None if self.order in LINEAR_ORDERS else -1

        def w13_runs(t):
            return gate_up_runs(t, w.gate_up, self.order, inter, digit)

        s13, s2 = w.w13_scale.view(torch.uint8), w.w2_scale.view(torch.uint8)
        tensors = {"w13": build(w.w13, (e, 2 * inter, hidden // 2), lambda out: self._rows(RowCol.plain(out)),
                                w13_runs(w.w13), w.H // 2),
                   "w2": pad_matrix(w.w2, hidden, inter // 2),
                   "w13_scale": build_128x4(s13, 2 * inter, hidden // 16, w13_runs,
                                            self._rows).view(torch.float8_e4m3fn),
                   "w2_scale": build_128x4(s2, hidden, inter // 16,
                                           lambda t: rows_runs(t, hidden)).view(torch.float8_e4m3fn)}
        if w.w13_bias is not None:
            tensors["w13_bias"] = build(w.w13_bias, (e, 2 * inter),
                                        lambda out: self._rows(RowCol.plain(out[..., None])), w13_runs(w.w13_bias), 1)
        if w.w2_bias is not None:
            tensors["w2_bias"] = pad_matrix(w.w2_bias[..., None], hidden, 1)[..., 0]
        return tensors, source_config(w)  # the alphas and global scales come with quant_config (from the rules)

    def _from_kernel(self, kw: KernelWeights) -> MoEWeights:
        e, hidden, inter = kw.E, kw.padded_hidden_size, kw.padded_intermediate_size
        inv = invert_permutation(row_permutation(kw.gate_up, self.order, inter))

        def scales(name, rows, cols):
            shape = (e, *padded_128x4(rows, cols))
            return deinterleave_128x4(require_tensor(self.layout, kw, name, shape, torch.float8_e4m3fn), rows, cols)

        bias13 = kw.tensors.get("w13_bias")
        return self._rebuild(kw, w13=permute_rows(kw["w13"], inv), w2=kw["w2"],
                             w13_scale=permute_rows(scales("w13_scale", 2 * inter, hidden // 16), inv),
                             w2_scale=scales("w2_scale", hidden, inter // 16),
                             w13_bias=None if bias13 is None else permute_rows(bias13, inv),
                             w2_bias=kw.tensors.get("w2_bias"))


#: NVFP4 backend FLASHINFER_CUTLASS (vllm-0.15 and vllm-0.20)
flashinfer_cutlass = Nvfp4SwizzledLayout("flashinfer_cutlass_nvfp4", "up_gate")
#: NVFP4 backends FLASHINFER_CUTEDSL and FLASHINFER_CUTEDSL_BATCHED of vllm-0.20
cutedsl = Nvfp4SwizzledLayout("flashinfer_cutedsl_nvfp4", "up_gate_groups64")
#: NVFP4 backend FLASHINFER_CUTEDSL of vllm-0.15 (no w1/w3 swap, no 64-row grouping in 0.15.1)
cutedsl_v015 = Nvfp4SwizzledLayout("flashinfer_cutedsl_nvfp4_v0.15", "contiguous")
#: NVFP4 backend VLLM_CUTLASS
vllm_cutlass = Nvfp4SwizzledLayout("vllm_cutlass_nvfp4", "contiguous")
