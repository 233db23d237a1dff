"""EMULATION and XPU: the checkpoint layout itself (vLLM 0.20.0 converts nothing for either).

The emulation reads `MoEWeights` as `backends.emulation.moe_forward` documents it; vLLM's XPU
experts (`XPUExpertsMXFp4`) take the checkpoint's MXFP4 tensors as loaded. The converter still
pads to the decision's sizes and checks the weights, so "identity" never means "unchecked".
Tensors that need no padding are shared with the `MoEWeights` (no copy, nothing modified).
"""

from __future__ import annotations

from backends.layouts.base import Layout, source_config
from backends.weights import KernelWeights, MoEWeights

__all__ = ["IdentityLayout", "emulation", "xpu"]

_TENSORS = ("w13", "w13_scale", "w2", "w2_scale", "w13_bias", "w2_bias")


class IdentityLayout(Layout):
    def __init__(self, layout: str, formats: tuple):
        self.layout = layout
        self.formats = formats

    def _to_kernel(self, w: MoEWeights, hidden: int, inter: int):
        w = w.pad(hidden, inter)
        tensors = {name: getattr(w, name) for name in _TENSORS if getattr(w, name) is not None}
        return tensors, {"gate_up_layout": w.gate_up, **source_config(w)}

    def _from_kernel(self, kw: KernelWeights) -> MoEWeights:
        return self._rebuild(kw, **{name: kw.tensors.get(name) for name in _TENSORS})


#: backend EMULATION (MXFP4 and NVFP4 families): runs backends.emulation.moe_forward on these tensors
emulation = IdentityLayout("checkpoint", ("mxfp4", "nvfp4"))
#: backend XPU (MXFP4): XPUExpertsMXFp4 reads the checkpoint layout
xpu = IdentityLayout("xpu_checkpoint", ("mxfp4",))
