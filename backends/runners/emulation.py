"""EMULATION as a runner: the reference `backends.emulation.moe_forward` over the padded checkpoint."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from backends import emulation
from backends.runners.base import Routing, RunnerSpec
from backends.weights import MoEWeights

__all__ = ["EmulationRunner", "fp8_input_schemes"]


def fp8_input_schemes(quant_config: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """How the emulation fake-quantizes each GEMM input for an FP8-activation kind of the rules (the kind's
    `emulated_activation`, or MXFP8 for both with activation 'mxfp8'); None for BF16 activations and for kinds
    whose activation formats this runner leaves to the layers that build them (the Quark OCP-MX layer)."""
    if quant_config is None:
        return None
    emulated = quant_config.get("emulated_activation")
    if quant_config.get("activation") == "mxfp8":
        return ("mxfp8", "mxfp8") if emulated is None else (emulated["gemm1"], emulated["gemm2"])
    if quant_config.get("activation") == "fp8" and emulated is not None:
        return emulated["gemm1"], emulated["gemm2"]
    return None


class EmulationRunner:
    """Dequantize-and-run in fp32 on any device; reads the checkpoint layout as it is (``converter: null``). An FP8
    activation kind (W4A8 questions where no FP8 kernel runs) fake-quantizes both GEMM inputs as vLLM's emulation
    does (`fp8_input_schemes`), with the checkpoint's static input scales for per-tensor FP8."""

    #: the activation keys this runner fake-quantizes to (backends.layer.require_runnable reads it)
    activation_keys = ("kMxfp8Dynamic", "kFp8StaticTensorSym")

    def __init__(self, spec: RunnerSpec, weights: MoEWeights):
        self.spec = spec
        self._weights = weights.emulation_kwargs()
        self._call: dict[str, Any] = dict(top_k=spec.top_k, renormalize=spec.renormalize,
                                          activation=spec.activation, **spec.swiglu)
        schemes = fp8_input_schemes(getattr(spec.decision, "quant_config", None))
        if schemes is not None:
            self._call["gemm_input_schemes"] = schemes
            if "fp8_per_tensor_static" in schemes:
                kind = spec.decision.quant_config["kind"]
                a1, a2 = weights.static_input_scales(f"{spec.backend} (quant config {kind})")
                self._call.update(a1_scale=a1, a2_scale=a2)

    @classmethod
    def prepare(cls, spec: RunnerSpec, weights: MoEWeights) -> EmulationRunner:
        if not isinstance(weights, MoEWeights):
            raise spec.unavailable(f"the emulation reads the checkpoint layout (a MoEWeights), but the rules give it "
                                   f"a {type(weights).__name__} from their converter",
                                   "set `converter: null` for this backend in the rules")
        return cls(spec, weights)

    def apply(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        return emulation.moe_forward(x, **self._weights, **routing.as_kwargs(), **self._call)
