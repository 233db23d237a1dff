"""EMULATION as a runner: the reference `backends.emulation.moe_forward` over the padded checkpoint."""

from __future__ import annotations

import torch

from backends import emulation
from backends.runners.base import Routing, RunnerSpec
from backends.weights import MoEWeights

__all__ = ["EmulationRunner"]


class EmulationRunner:
    """Dequantize-and-run in fp32 on any device; reads the checkpoint layout as it is (``converter: null``)."""

    def __init__(self, spec: RunnerSpec, weights: MoEWeights):
        self.spec = spec
        self._weights = weights.emulation_kwargs()
        self._call = dict(top_k=spec.top_k, renormalize=spec.renormalize, activation=spec.activation,
                          **spec.swiglu)

    @classmethod
    def prepare(cls, spec: RunnerSpec, weights: MoEWeights) -> EmulationRunner:
        if not isinstance(weights, MoEWeights):
            raise spec.unavailable(f"the emulation reads the checkpoint layout (a MoEWeights), but the rules give it "
                                   f"a {type(weights).__name__} from their converter",
                                   "set `converter: null` for this backend in the rules")
        return cls(spec, weights)

    def apply(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        return emulation.moe_forward(x, **self._weights, **routing.as_kwargs(), **self._call)
