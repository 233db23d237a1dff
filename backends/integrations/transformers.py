"""Hugging Face transformers models with their experts computed by this project's `MoELayer`.

    model = AutoModelForCausalLM.from_pretrained(...)            # or any GptOss / Qwen3-MoE / DeepSeek-V3 model
    patch_model(model, "/path/to/checkpoint")                     # released MXFP4 / NVFP4 / OCP-MX experts

transformers (>= 5.17; 5.17 and 5.24 tested) splits each MoE block into the model's router and an ``experts``
module called as ``experts(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k]) -> [T, H]``. Only that
module is replaced, by `MoELayerExperts`, which hands the model's own routing to ``MoELayer.forward(x,
topk_ids=..., topk_weights=...)``. So every model keeps its router exactly as transformers computes it:

* gpt-oss: linear router with bias, top-k on the logits then softmax over the k; experts with biases and the
  clamped SwiGLU (``swigluoai``, alpha and limit from the model);
* Qwen3-MoE: softmax over all experts, top-k, renormalized when ``norm_topk_prob``; SiLU-gated experts;
* DeepSeek-V3: sigmoid scores, group-limited top-k with ``e_score_correction_bias``, ``routed_scaling_factor``;
  its shared experts and dense first layers stay the model's own modules.

The experts of layer N come from ``backends.checkpoints.load_moe_weights(checkpoint, layer=N)``; every layer is
loaded and its `MoELayer` built before any module is replaced, so a failure leaves the model untouched.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from backends.checkpoints import QuarkMoEWeights, load_moe_weights
from backends.layer import MoELayer

__all__ = ["GATE_UP", "SUPPORTED_ARCHITECTURES", "IntegrationError", "MoELayerExperts", "dense_expert_weights",
           "moe_layer_settings", "patch_model", "set_dense_expert_weights"]

#: config.model_type -> the transformers experts class that is replaced
SUPPORTED_ARCHITECTURES = {"gpt_oss": "GptOssExperts", "qwen3_moe": "Qwen3MoeExperts",
                           "deepseek_v3": "DeepseekV3Experts"}
_GATED = {"silu": "silu", "swish": "silu", "gelu": "gelu"}


class IntegrationError(ValueError):
    """A model or checkpoint this integration cannot patch; the message says which and why."""


class MoELayerExperts(torch.nn.Module):
    """A transformers experts module whose computation is a `MoELayer` (or a Quark OCP-MX layer)."""

    def __init__(self, layer: Any, layer_index: int):
        super().__init__()
        self.layer = layer
        self.layer_index = layer_index
        self.num_experts = layer.num_experts

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        return self.layer.forward(hidden_states, topk_ids=top_k_index, topk_weights=top_k_weights)

    def extra_repr(self) -> str:
        return f"layer {self.layer_index}: {self.layer!r}"


def _architecture(model: torch.nn.Module) -> str:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise IntegrationError(f"model_type={model_type!r} ({type(model).__name__}) is not supported; the "
                               f"transformers integration patches {', '.join(sorted(SUPPORTED_ARCHITECTURES))}")
    return str(model_type)


def _decoder_layers(model: torch.nn.Module) -> Iterable[tuple[int, torch.nn.Module]]:
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise IntegrationError(f"{type(model).__name__} has no decoder layers at .model.layers")
    return enumerate(layers)


def moe_layer_settings(model_type: str, config: Any, experts: torch.nn.Module) -> dict[str, Any]:
    """The `MoELayer.from_checkpoint` keywords that describe this architecture's experts.

    renormalize only shapes the oracle's question (routing method): the layer is always given the model's
    top-k ids and weights."""
    top_k = int(config.num_experts_per_tok)
    if model_type == "gpt_oss":
        return {"activation": "swigluoai", "top_k": top_k, "renormalize": True,
                "swiglu_alpha": float(getattr(experts, "alpha", 1.702)), "swiglu_beta": 1.0,
                "swiglu_limit": float(getattr(experts, "limit", 7.0))}
    act = _GATED.get(str(config.hidden_act))
    if act is None:
        raise IntegrationError(f"{model_type}: hidden_act={config.hidden_act!r} has no gated MoELayer activation; "
                               f"supported: {sorted(_GATED)}")
    renormalize = bool(getattr(config, "norm_topk_prob", True)) if model_type == "qwen3_moe" else False
    return {"activation": act, "top_k": top_k, "renormalize": renormalize}


def _expected_sizes(model_type: str, experts: torch.nn.Module) -> tuple[int, int, int]:
    if model_type == "gpt_oss":
        return experts.num_experts, experts.hidden_size, experts.intermediate_size
    return experts.num_experts, experts.hidden_dim, experts.intermediate_dim


def patch_model(model: torch.nn.Module, checkpoint: str | os.PathLike, *, layers: Iterable[int] | None = None,
                device: Any = None, w13_scales: str = "refuse",
                layer_kwargs: Mapping[str, Any] | None = None) -> dict[int, Any]:
    """Replace the experts of every MoE layer (or of `layers`) by a `MoELayer` over `checkpoint`'s experts.

    checkpoint: a directory in a released layout (`backends.checkpoints`). device: where the layers run (default:
    where the model's experts are). w13_scales: see `load_moe_weights`. layer_kwargs: passed to
    `MoELayer.from_checkpoint` (profile, platform, moe_backend, ...) or, for Quark, `QuarkOCPMXMoE.create`.
    Returns {layer index: the layer}. Raises IntegrationError / CheckpointError before touching the model.
    """
    model_type = _architecture(model)
    expected_class = SUPPORTED_ARCHITECTURES[model_type]
    wanted = None if layers is None else set(layers)
    built: dict[int, tuple[torch.nn.Module, Any]] = {}
    for index, decoder_layer in _decoder_layers(model):
        experts = getattr(getattr(decoder_layer, "mlp", None), "experts", None)
        if experts is None or (wanted is not None and index not in wanted):
            continue
        if type(experts).__name__ not in (expected_class, MoELayerExperts.__name__):
            raise IntegrationError(f"layer {index}: experts module {type(experts).__name__} is not transformers' "
                                   f"{expected_class}; this transformers version is not supported (>= 5.17)")
        if isinstance(experts, MoELayerExperts):
            raise IntegrationError(f"layer {index} is already patched; patch a fresh model")
        settings = moe_layer_settings(model_type, model.config, experts)
        weights = load_moe_weights(checkpoint, layer=index, w13_scales=w13_scales)
        sizes = (weights.num_experts, weights.hidden_size, weights.intermediate_size) \
            if isinstance(weights, QuarkMoEWeights) else (weights.E, weights.H, weights.I)
        if sizes != _expected_sizes(model_type, experts):
            raise IntegrationError(f"layer {index}: the checkpoint's experts (E, H, I)={sizes} do not match the "
                                   f"model's {_expected_sizes(model_type, experts)}; pass the checkpoint of this model")
        target = device if device is not None else next(experts.parameters()).device
        kwargs = dict(layer_kwargs or {})
        if isinstance(weights, QuarkMoEWeights):
            layer = weights.layer(device=target, **settings, **kwargs)
        else:
            layer = MoELayer.from_checkpoint(weights, device=target, **settings, **kwargs)
        built[index] = (decoder_layer, layer)
    if wanted is not None and wanted - set(built):
        raise IntegrationError(f"layers {sorted(wanted - set(built))} have no experts in this {model_type} model")
    for index, (decoder_layer, layer) in built.items():
        decoder_layer.mlp.experts = MoELayerExperts(layer, index)
    return {index: layer for index, (_, layer) in built.items()}


# ---------------------------------------------------------------------- the unpatched experts' float weights
#: model_type -> the w13 row order of its experts (gpt-oss interleaves gate/up columns of gate_up_proj)
GATE_UP = {"gpt_oss": "interleaved", "qwen3_moe": "contiguous", "deepseek_v3": "contiguous"}


def dense_expert_weights(model_type: str, experts: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    """A transformers experts module's float weights as w13 [E, 2I, H], w2 [E, H, I] (+ gpt-oss biases).

    gpt-oss stores x @ W ([E, H, 2I], [E, I, H]); Qwen3-MoE and DeepSeek-V3 store F.linear weights
    ([E, 2I, H] with gate rows first, [E, H, I])."""
    if model_type == "gpt_oss":
        return {"w13": experts.gate_up_proj.detach().transpose(1, 2), "w2": experts.down_proj.detach().transpose(1, 2),
                "w13_bias": experts.gate_up_proj_bias.detach(), "w2_bias": experts.down_proj_bias.detach()}
    return {"w13": experts.gate_up_proj.detach(), "w2": experts.down_proj.detach(), "w13_bias": None, "w2_bias": None}


@torch.no_grad()
def set_dense_expert_weights(model_type: str, experts: torch.nn.Module, w13: torch.Tensor, w2: torch.Tensor,
                             w13_bias: torch.Tensor | None = None, w2_bias: torch.Tensor | None = None) -> None:
    """Write float w13 [E, 2I, H] / w2 [E, H, I] (and biases) into a transformers experts module, in its dtype."""
    if model_type == "gpt_oss":
        experts.gate_up_proj.copy_(w13.transpose(1, 2))
        experts.down_proj.copy_(w2.transpose(1, 2))
        if w13_bias is not None:
            experts.gate_up_proj_bias.copy_(w13_bias)
        if w2_bias is not None:
            experts.down_proj_bias.copy_(w2_bias)
        return
    experts.gate_up_proj.copy_(w13)
    experts.down_proj.copy_(w2)
