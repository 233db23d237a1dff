"""TRITON_MOE and TRITON_MOE_W4A8 as runners: this project's fused Triton kernels (`backends.triton_moe`), with
BF16 activations (W4A16) or FP8 E4M3 ones (W4A8, the act scheme from the decision's quant config; the tensor cores
are moe_forward's choice, backends.triton_moe.forward.resolve_w4a8_mma)."""

from __future__ import annotations

from typing import Any

import torch

from backends.runners.base import Routing, RunnerSpec, require_layout
from backends.weights import KernelWeights

__all__ = ["TritonMoERunner", "TritonMoEW4A8Runner", "act_quant_of"]


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
        from backends.layouts.triton_moe import triton_weights

        forward = _checked_forward(spec, weights, "converter")
        return cls(spec, triton_weights(weights), forward)

    def apply(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        return self._forward(x, self._weights, **routing.as_kwargs(), **self._call)


def act_quant_of(quant_config: Any) -> str:
    """The kernels' act_quant for a W4A8 quant-config kind of the rules: activation 'mxfp8' (kMxfp8Dynamic) ->
    'mxfp8'; activation 'fp8' with `input_scales: static` (kFp8StaticTensorSym) -> 'fp8_per_tensor_static'."""
    activation = None if quant_config is None else quant_config.get("activation")
    if activation == "mxfp8":
        return "mxfp8"
    if activation == "fp8" and quant_config.get("input_scales") == "static":
        return "fp8_per_tensor_static"
    kind = None if quant_config is None else quant_config.get("kind")
    raise ValueError(f"quant-config kind {kind!r} (activation {activation!r}) is not an FP8 activation scheme of the "
                     f"W4A8 kernels: give TRITON_MOE_W4A8 a kind with activation 'mxfp8', or 'fp8' with "
                     f"input_scales: static, in the rules")


class TritonMoEW4A8Runner(TritonMoERunner):
    """Runs `moe_forward(..., act_quant=...)` over the converter_w4a8 layout: the act scheme is the decision's quant
    config (`act_quant_of`); static per-tensor FP8 takes a1/a2 from the config the converter kept (the checkpoint's
    input scales, `MoEWeights.static_input_scales`)."""

    #: the activation keys this runner quantizes to (backends.layer.require_runnable reads it)
    activation_keys = ("kMxfp8Dynamic", "kFp8StaticTensorSym")

    @classmethod
    def prepare(cls, spec: RunnerSpec, weights: KernelWeights) -> TritonMoEW4A8Runner:
        from backends.layouts.triton_moe import triton_weights

        quant_config = getattr(spec.decision, "quant_config", None)
        try:
            act_quant = act_quant_of(quant_config)
        except ValueError as exc:
            raise spec.unavailable(str(exc), "fix the backend's quant_config in the rules") from exc
        forward = _checked_forward(spec, weights, "converter_w4a8")
        if spec.device.type == "cuda" and torch.cuda.get_device_capability(spec.device) < (8, 9):
            raise spec.unavailable(f"W4A8 needs FP8 hardware (compute capability >= 8.9: E4M3 conversions, FP8 "
                                   f"dots), {spec.device} has "
                                   f"{torch.cuda.get_device_capability(spec.device)}",
                                   "ask BF16 activations, or run on an Ada/Hopper/Blackwell GPU")
        runner = cls(spec, triton_weights(weights), forward)
        runner._call["act_quant"] = act_quant
        if act_quant == "fp8_per_tensor_static":
            scales = [weights.config.get(name) for name in ("a1_scale", "a2_scale")]
            if not all(isinstance(s, torch.Tensor) for s in scales):
                raise spec.unavailable("static per-tensor FP8 activations need the checkpoint's input scales as "
                                       "a1_scale/a2_scale in the converted weights' config, and they are missing",
                                       "build the layer with MoELayer (it passes MoEWeights.static_input_scales to "
                                       "the quant config), or load w13_input_scale/w2_input_scale")
            runner._call.update(a1_scale=scales[0].reshape(1).float(), a2_scale=scales[1].reshape(1).float())
        return runner


def _checked_forward(spec: RunnerSpec, weights: KernelWeights, converter: str) -> Any:
    """The kernels' moe_forward once the layout, activation and device fit; the refusal otherwise."""
    from backends.layouts.triton_moe import TritonMoELayout
    from backends.triton_moe.capabilities import ACTIVATIONS

    require_layout(spec, weights, TritonMoELayout.layout, reader="the kernels read",
                   converter=f"backends.layouts.triton_moe:{converter}")
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
    return moe_forward
