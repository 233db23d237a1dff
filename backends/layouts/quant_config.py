"""Per-backend scalar configuration derived from the checkpoint (no weight tensors): one place for it.

NVFP4 (vLLM `prepare_nvfp4_moe_layer_for_fi_or_cutlass` + `make_nvfp4_moe_quant_config`):
with ``ws = 1 / global_scale`` (the checkpoint's ``weight_scale_2``) and ``a = input_scale``,

* FlashInfer backends share one input scale over all experts: ``a13 = max over experts and over
  (w1, w3)``, ``a2 = max over experts``, broadcast to [E]; VLLM_CUTLASS keeps one per expert,
  ``a13 = max(w1, w3)`` of that expert.
* ``g1_alphas = a13 * ws13``, ``g2_alphas = a2 * ws2``, ``a1_gscale = 1 / a13``,
  ``a2_gscale = 1 / a2``; TRT-LLM additionally ``g1_scale_c = g1_alphas / a2`` (and vLLM passes it
  no quant config: the values travel as layer attributes).

MXFP4 gated backends with the gpt-oss activation take per-expert fp32 ``swiglu_alpha``,
``swiglu_beta`` and ``swiglu_limit`` tensors (TRT-LLM's gemm1_alpha/beta/clamp_limit, FlashInfer
CUTLASS's swiglu_alpha/beta/limit): the kind's `gemm1` constants (1.702, 1.0, 7.0 for gpt-oss).

Which of these a backend builds, and every constant, is data: the backend's `quant_config:` kind in the
rules (a family's `quant_configs:`), carried as `Decision.quant_config`; `build_quant_config` reads it
and the converters take its result (`convert(..., quant_config=...)`): no layout holds a value of its own.
A policy may choose the kind by an answer field instead (the `ocp-mx` policy by OCP MX scheme on
NONE/EMULATION, as vLLM's Quark method does); such a kind may take the layer's static input scales as
a1/a2 (`input_scales: static`) or say that vLLM builds none (`not_implemented`: NotImplementedError here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from backends.weights import MoEWeights

__all__ = ["INPUT_SCALE_REDUCTIONS", "build_layer_quant_config", "build_quant_config", "gemm1_constants",
           "nvfp4_w4a4_config", "swiglu_config"]

INPUT_SCALE_REDUCTIONS = ("experts", "pair")

#: a kind's gemm1 field -> the keyword runners and kernels take it as
_GEMM1_NAMES = {"alpha": "swiglu_alpha", "beta": "swiglu_beta", "clamp": "swiglu_limit"}


def _kind(decision: Any) -> Mapping[str, Any] | None:
    """The quant-config kind of a Decision (its `quant_config`), or a kind mapping given as it is."""
    if isinstance(decision, Mapping):
        return decision
    spec: Mapping[str, Any] | None = getattr(decision, "quant_config", None)
    return spec


def gemm1_constants(decision: Any) -> dict[str, float]:
    """The kind's gemm1 constants as runner keywords (swiglu_alpha / swiglu_beta / swiglu_limit), only those
    the rules give; {} when the decision has no kind or the kind no gemm1."""
    spec = _kind(decision)
    gemm1 = (spec or {}).get("gemm1") or {}
    return {_GEMM1_NAMES[k]: float(v) for k, v in gemm1.items()}


def swiglu_config(w: MoEWeights, constants: Mapping[str, float]) -> dict:
    """Per-expert fp32 [E] tensors of the given SwiGLU constants (gemm1_constants), on the weights' device."""
    return _swiglu_tensors(w.E, w.w13.device, constants)


def _swiglu_tensors(experts: int, device: torch.device, constants: Mapping[str, float]) -> dict:
    return {name: torch.full((experts,), float(value), dtype=torch.float32, device=device)
            for name, value in constants.items()}


def _broadcast_max(t: torch.Tensor, experts: int) -> torch.Tensor:
    if experts == 0:
        return t.new_empty((0,))
    return t.amax().reshape(1).expand(experts).contiguous()


def nvfp4_w4a4_config(w: MoEWeights, *, layout: str, reduce: str, trtllm: bool = False) -> dict:
    """g1/g2 alphas and a1/a2 global scales of an NVFP4 W4A4 backend (see the module docstring)."""
    if reduce not in INPUT_SCALE_REDUCTIONS:
        raise ValueError(f"nvfp4_w4a4_config: reduce={reduce!r} must be one of {INPUT_SCALE_REDUCTIONS}")
    if w.w13_input_scale is None or w.w2_input_scale is None:
        raise ValueError(f"layout {layout!r} quantizes activations to NVFP4 and needs the checkpoint's input scales: "
                         f"pass MoEWeights(w13_input_scale=[E, 2] (w1, w3), w2_input_scale=[E]) as fp32")
    if reduce == "experts":
        a13 = _broadcast_max(w.w13_input_scale, w.E)
        a2 = _broadcast_max(w.w2_input_scale, w.E)
    else:
        a13 = w.w13_input_scale.amax(dim=1) if w.E else w.w13_input_scale.new_empty((0,))
        a2 = w.w2_input_scale
    g1_alphas = a13 * (1.0 / w.w13_global_scale)
    config = {"g1_alphas": g1_alphas, "g2_alphas": a2 * (1.0 / w.w2_global_scale),
              "a1_gscale": 1.0 / a13, "a2_gscale": 1.0 / a2}
    if trtllm:
        config["g1_scale_c"] = g1_alphas / a2
    return config


# a kind's `global_scale` -> the input-scale reduction of nvfp4_w4a4_config
_GLOBAL_SCALE_REDUCE = {"shared": "experts", "per_expert": "pair"}


def _required_kind(decision: Any, weight_format: str, caller: str) -> Mapping[str, Any]:
    """The decision's kind, for weights of `weight_format`; NotImplementedError when the rules say vLLM builds none."""
    spec = _kind(decision)
    backend = getattr(decision, "backend", None)
    if spec is None:
        raise ValueError(f"{caller}: the decision for backend {backend!r} carries "
                         "no quant_config kind; add `quant_config: <kind>` to the backend's entry in the rules "
                         "(a kind declared in its family's quant_configs)")
    if spec.get("not_implemented"):
        raise NotImplementedError(f"quant-config kind {spec['kind']!r} of backend {backend} (profile "
                                  f"{getattr(decision, 'profile', None)}): {spec['not_implemented']}")
    if spec["weight"] != weight_format:
        raise ValueError(f"{caller}: kind {spec['kind']!r} is for {spec['weight']} weights but the layer's "
                         f"weights are {weight_format}; select with the layer's weight format")
    return spec


def _base_config(spec: Mapping[str, Any], *, experts: int, device: torch.device, activation: str,
                 input_scales: tuple[torch.Tensor, torch.Tensor] | None, caller: str) -> dict[str, Any]:
    """kind/weight/activation, gemm1 tensors for swigluoai, and the static a1/a2 scales of `input_scales: static`."""
    config: dict[str, Any] = {"kind": spec["kind"], "weight": spec["weight"], "activation": spec["activation"]}
    if activation == "swigluoai":
        config.update(_swiglu_tensors(experts, device, gemm1_constants(spec)))
    if spec.get("input_scales") == "static":
        if input_scales is None or len(input_scales) != 2 or not all(isinstance(s, torch.Tensor)
                                                                    for s in input_scales):
            raise ValueError(f"{caller}: kind {spec['kind']!r} takes the layer's static input scales as a1/a2; pass "
                             f"input_scales=(w13_input_scale, w2_input_scale) as fp32 tensors (after the max over "
                             f"experts), got {input_scales!r}")
        config.update(a1_scale=input_scales[0], a2_scale=input_scales[1])
    return config


def build_quant_config(decision: Any, w: MoEWeights, *, activation: str = "silu",
                       input_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict:
    """The selected backend's quant config, built from the kind the rules give it (`decision.quant_config`,
    or that kind mapping itself).

    Always kind/weight/activation; the kind's gemm1 constants as per-expert swiglu tensors when the
    layer's activation is gpt-oss's `swigluoai`; NVFP4 alphas and global scales per its `global_scale`;
    a1_scale / a2_scale = `input_scales` for a kind with `input_scales: static`. NotImplementedError for a
    kind the rules mark `not_implemented`. A converter takes the result (`convert(weights, ..., quant_config=...)`)."""
    spec = _required_kind(decision, w.format, "build_quant_config")
    config = _base_config(spec, experts=w.E, device=w.w13.device, activation=activation, input_scales=input_scales,
                          caller="build_quant_config")
    scale = spec.get("global_scale")
    if scale == "weight_only":
        config.update(g1_alphas=1.0 / w.w13_global_scale, g2_alphas=1.0 / w.w2_global_scale)
    elif scale is not None:
        config.update(nvfp4_w4a4_config(w, layout=str(getattr(decision, "backend", spec["kind"])),
                                        reduce=_GLOBAL_SCALE_REDUCE[scale], trtllm=bool(spec.get("g1_scale_c"))))
    return config


def build_layer_quant_config(decision: Any, *, weight_format: str, experts: int, device: Any = "cpu",
                             activation: str = "silu",
                             input_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict:
    """build_quant_config for a layer whose weights are no MoEWeights (the Quark layer's MXFP4/MXFP6 checkpoint
    kept for the emulation): the same kind, gemm1 and static-scale rules; a kind with NVFP4 global scales needs
    MoEWeights (use build_quant_config)."""
    spec = _required_kind(decision, weight_format, "build_layer_quant_config")
    if spec.get("global_scale") is not None:
        raise ValueError(f"build_layer_quant_config: kind {spec['kind']!r} derives NVFP4 global scales from the "
                         f"weights; build it with build_quant_config(decision, MoEWeights(...))")
    return _base_config(spec, experts=experts, device=torch.device(device), activation=activation,
                        input_scales=input_scales, caller="build_layer_quant_config")
