"""TRITON_MOE as a runner: this project's fused W4A16 Triton kernels (`backends.triton_moe`)."""

from __future__ import annotations

from typing import Any

import torch

from backends.runners.base import Routing, RunnerSpec, require_layout
from backends.weights import KernelWeights

__all__ = ["TritonMoERunner"]


class TritonMoERunner:
    """Runs `backends.triton_moe.forward.moe_forward` over the triton_moe layout the rules' converter wrote."""

    def __init__(self, spec: RunnerSpec, weights: Any, forward: Any):
        self.spec = spec
        self._weights = weights
        self._forward = forward
        self._call = dict(top_k=spec.top_k, renormalize=spec.renormalize, activation=spec.activation,
                          deterministic=spec.deterministic, **spec.swiglu)

    @classmethod
    def prepare(cls, spec: RunnerSpec, weights: KernelWeights) -> TritonMoERunner:
        from backends.layouts.triton_moe import TritonMoELayout, triton_weights
        from backends.triton_moe.capabilities import ACTIVATIONS

        require_layout(spec, weights, TritonMoELayout.layout, reader="the kernels read",
                       converter="backends.layouts.triton_moe:converter")
        if spec.activation not in ACTIVATIONS:
            raise spec.unavailable(f"activation {spec.activation!r} is not one of the kernels' {ACTIVATIONS}",
                                   "pick another backend with moe_backend= or another profile")
        if spec.device.type not in ("cuda", "cpu"):
            raise spec.unavailable(f"the kernels run on CUDA (and on CPU under Triton's interpreter), not "
                                   f"{spec.device.type}", "use the EMULATION backend on this device")
        try:
            from backends.triton_moe.forward import moe_forward
        except ImportError as exc:  # triton missing, or older than the kernels need
            raise spec.unavailable(f"triton is not usable here ({exc})", "pip install 'triton>=3.6'") from exc
        return cls(spec, triton_weights(weights), moe_forward)

    def apply(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        return self._forward(x, self._weights, **routing.as_kwargs(), **self._call)
