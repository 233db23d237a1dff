"""DEEPGEMM_MXFP4 (vLLM 0.20.0 `convert_gpt_oss_weight_to_mxfp4_moe_kernel_format`): weights as loaded,
E8M0 scales upcast to fp32 by bit placement.

``scale_fp32 = (code << 23).view(float32)``: 2^(code-127) for codes 1..254, **code 0 -> 0.0** (vLLM's
upcast does not produce 2^-127; a block with scale code 0 therefore contributes nothing, which
only differs from the OCP value for blocks whose weights are already below 2^-126) and code
255 -> +inf. The inverse reads the exponent field back and is exact. Gate/up rows keep the
checkpoint's order (`KernelWeights.gate_up`); DeepGEMM's activation reads that convention.
"""

from __future__ import annotations

import torch

from backends.layouts.base import Layout, require_tensor
from backends.layouts.scales import e8m0_to_fp32, fp32_to_e8m0
from backends.weights import KernelWeights, MoEWeights

__all__ = ["DeepGemmMxfp4Layout", "mxfp4"]


class DeepGemmMxfp4Layout(Layout):
    layout = "deepgemm_mxfp4"
    formats = ("mxfp4",)

    def _to_kernel(self, w: MoEWeights, hidden: int, inter: int):
        w = w.pad(hidden, inter)
        tensors = {"w13": w.w13, "w2": w.w2, "w13_scale": e8m0_to_fp32(w.w13_scale),
                   "w2_scale": e8m0_to_fp32(w.w2_scale)}
        tensors.update({name: getattr(w, name) for name in ("w13_bias", "w2_bias") if getattr(w, name) is not None})
        return tensors, {"gate_up_layout": w.gate_up}

    def _from_kernel(self, kw: KernelWeights) -> MoEWeights:
        e, hidden, inter = kw.E, kw.padded_hidden_size, kw.padded_intermediate_size
        s13 = require_tensor(self.layout, kw, "w13_scale", (e, 2 * inter, hidden // 32), torch.float32)
        s2 = require_tensor(self.layout, kw, "w2_scale", (e, hidden, inter // 32), torch.float32)
        return self._rebuild(kw, w13=kw["w13"], w2=kw["w2"], w13_scale=fp32_to_e8m0(s13), w2_scale=fp32_to_e8m0(s2),
                             w13_bias=kw.tensors.get("w13_bias"), w2_bias=kw.tensors.get("w2_bias"))


#: backend DEEPGEMM_MXFP4
mxfp4 = DeepGemmMxfp4Layout()
