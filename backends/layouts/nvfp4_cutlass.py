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
rows it cannot pad). Config: the g1/g2 alphas and a1/a2 global scales that `convert(..., quant_config=...)`
passes, built from the rules' kind (shared or per-expert input scale), plus the checkpoint scalars.
"""

from __future__ import annotations

import torch

from backends.layouts.base import (
    Layout,
    require_multiple,
    require_tensor,
    source_config,
)
from backends.layouts.gate_up import invert_permutation, permute_rows, row_permutation
from backends.layouts.scales import deinterleave_128x4, interleave_128x4, padded_128x4
from backends.weights import KernelWeights, MoEWeights

__all__ = ["Nvfp4SwizzledLayout", "cutedsl", "cutedsl_v015", "flashinfer_cutlass", "vllm_cutlass"]


class Nvfp4SwizzledLayout(Layout):
    formats = ("nvfp4",)

    def __init__(self, layout: str, order: str):
        self.layout, self.order = layout, order

    def _check_sizes(self, w: MoEWeights) -> None:
        require_multiple(self.layout, "2 * intermediate_size", 2 * w.I, 128,
                         "gated w13 scale rows fill 128-row tiles and vLLM does not pad gated weight rows")
        if self.order == "up_gate_groups64":
            require_multiple(self.layout, "intermediate_size", w.I, 64, "CuteDSL interleaves gate/up in 64-row groups")

    def _to_kernel(self, w: MoEWeights):
        perm = row_permutation(w.gate_up, self.order, w.I)
        tensors = {"w13": permute_rows(w.w13, perm), "w2": w.w2,
                   "w13_scale": interleave_128x4(permute_rows(w.w13_scale, perm)),
                   "w2_scale": interleave_128x4(w.w2_scale)}
        if w.w13_bias is not None:
            tensors["w13_bias"] = permute_rows(w.w13_bias, perm)
        if w.w2_bias is not None:
            tensors["w2_bias"] = w.w2_bias
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
