"""Named MoE layer shapes of released models, and a Hugging Face `config.json` reader: the one registry the
tuning sweep, the GPU tests, the benchmarks and `moe-oracle tune` read.

A shape is what the kernels see of one MoE layer: the weight format its released checkpoints use, E routed
experts, top-k, hidden size H, per-expert intermediate size I, the activation, the gate/up layout and whether
the experts have biases. Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    name: str
    format: str  # "mxfp4" | "nvfp4"
    experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    activation: str  # "swigluoai" | "silu"
    biases: bool
    gate_up_layout: str = "interleaved"  # "interleaved" (gpt-oss) | "contiguous" (the others)
    matrix: bool = True  # one of the benchmark matrix's layers (others: extra test and held-out shapes)

    def fields(self) -> dict:
        """The tuning-table `shape` mapping."""
        return {"format": self.format, "experts": self.experts, "top_k": self.top_k, "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size}


def _gpt_oss(name: str, experts: int) -> ModelShape:
    return ModelShape(name, "mxfp4", experts, 4, 2880, 2880, "swigluoai", True, "interleaved")


def _silu(name: str, experts: int, top_k: int, hidden: int, inter: int, fmt: str = "nvfp4", matrix: bool = True):
    return ModelShape(name, fmt, experts, top_k, hidden, inter, "silu", False, "contiguous", matrix)


#: The model matrix (each layer in the format its released 4-bit checkpoints use) and extra test shapes.
SHAPES: dict[str, ModelShape] = {s.name: s for s in (
    _gpt_oss("gpt-oss-120b", 128),
    _gpt_oss("gpt-oss-20b", 32),
    _silu("deepseek-v3", 256, 8, 7168, 2048),  # also DeepSeek-R1 (same MoE layers)
    _silu("kimi-k2", 384, 8, 7168, 2048),
    _silu("llama-4-maverick", 128, 1, 5120, 8192),
    _silu("glm-4.5", 160, 8, 5120, 1536),
    _silu("qwen3-next-80b-a3b", 512, 10, 2048, 512),
    _silu("minimax-m2", 256, 8, 3072, 1536),
    _silu("deepseek-v3-mxfp4", 256, 8, 7168, 2048, "mxfp4"),
    _silu("qwen3-30b-a3b", 128, 8, 2048, 768, "mxfp4", matrix=False),
    _silu("qwen3-30b-a3b-nvfp4", 128, 8, 2048, 768, "nvfp4", matrix=False),
)}
MATRIX = tuple(name for name, shape in SHAPES.items() if shape.matrix)


def shape_named(name: str) -> ModelShape:
    if name not in SHAPES:
        raise KeyError(f"unknown model shape {name!r}; known: {', '.join(SHAPES)}")
    return SHAPES[name]


class ModelConfigError(ValueError):
    """A config.json the reader cannot turn into a shape; the message names the file, the key and the fix."""


#: Key names per model family (config.json `model_type`): experts, top-k, hidden size, per-expert intermediate size.
_FAMILY_KEYS = {
    "gpt_oss": ("num_local_experts", "num_experts_per_tok", "hidden_size", "intermediate_size"),
    "qwen3_moe": ("num_experts", "num_experts_per_tok", "hidden_size", "moe_intermediate_size"),
    "qwen3_next": ("num_experts", "num_experts_per_tok", "hidden_size", "moe_intermediate_size"),
    "qwen2_moe": ("num_experts", "num_experts_per_tok", "hidden_size", "moe_intermediate_size"),
    "deepseek_v3": ("n_routed_experts", "num_experts_per_tok", "hidden_size", "moe_intermediate_size"),
    "deepseek_v2": ("n_routed_experts", "num_experts_per_tok", "hidden_size", "moe_intermediate_size"),
    "kimi_k2": ("n_routed_experts", "num_experts_per_tok", "hidden_size", "moe_intermediate_size"),
    "glm4_moe": ("n_routed_experts", "num_experts_per_tok", "hidden_size", "moe_intermediate_size"),
    "llama4": ("num_local_experts", "num_experts_per_tok", "hidden_size", "intermediate_size"),
    "llama4_text": ("num_local_experts", "num_experts_per_tok", "hidden_size", "intermediate_size"),
    "minimax_m2": ("num_local_experts", "num_experts_per_tok", "hidden_size", "intermediate_size"),
    "minimax": ("num_local_experts", "num_experts_per_tok", "hidden_size", "intermediate_size"),
}
#: Older gpt-oss configs name top-k this way.
_ALTERNATE_KEYS = {"num_experts_per_tok": ("experts_per_token",)}
FORMATS = ("mxfp4", "nvfp4")


def _format_of(config: dict, origin: str, requested: str | None) -> str:
    if requested is not None:
        if requested not in FORMATS:
            raise ModelConfigError(f"format {requested!r} must be one of {FORMATS}")
        return requested
    quant = config.get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower()
    algo = str(quant.get("quant_algo", "") or quant.get("format", "")).lower()
    if method == "mxfp4" or "mxfp4" in algo:
        return "mxfp4"
    if "nvfp4" in algo or method == "nvfp4" or "nvfp4" in json.dumps(quant).lower():
        return "nvfp4"
    found = f"quantization_config.quant_method {method!r}" if method else "no quantization_config"
    raise ModelConfigError(f"{origin}: {found}: cannot tell the 4-bit weight format; pass --format mxfp4 or "
                           f"--format nvfp4 (the format the checkpoint's experts will be converted to)")


def read_json(path: Path, error: type[Exception]) -> Any:
    """A model's JSON metadata file (config.json, a safetensors index), read no further than MAX_METADATA_BYTES;
    `error` naming the file when it cannot be read, is larger or is not JSON."""
    from oracle.errors import RuleError
    from oracle.limits import MAX_METADATA_BYTES
    from oracle.yamlio import read_limited

    try:
        text = read_limited(path, str(path), limit=MAX_METADATA_BYTES,
                            advice="a model's config.json or safetensors index is a few MB: name that file")[1]
        return json.loads(text)
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    except RuleError as exc:  # larger than the limit, or not UTF-8
        raise error(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not JSON: {exc}") from None


def shape_from_config(config: dict | str | Path, *, format: str | None = None, name: str | None = None) -> ModelShape:
    """The MoE layer shape of a Hugging Face config.json (a path or the parsed dict): experts, top-k, hidden and
    expert-intermediate sizes under the family's key names (gpt-oss, Qwen3-MoE/Next, DeepSeek-V3, Kimi-K2,
    Llama-4, GLM-4.5, MiniMax), the format from quantization_config unless `format` is given."""
    origin = "config"
    if not isinstance(config, dict):
        origin = str(config)
        config = read_json(Path(config), ModelConfigError)
        if not isinstance(config, dict):
            raise ModelConfigError(f"{origin}: a config.json is a JSON object, got {type(config).__name__}")
    outer = config
    if isinstance(config.get("text_config"), dict):  # multimodal configs (Llama-4) keep the LM under text_config
        config = {**config["text_config"], "quantization_config": outer.get("quantization_config")
                  or config["text_config"].get("quantization_config")}
    model_type = config.get("model_type") or outer.get("model_type")
    if model_type not in _FAMILY_KEYS:
        raise ModelConfigError(f"{origin}: model_type {model_type!r} is not a known MoE family "
                               f"({', '.join(sorted(_FAMILY_KEYS))}); give the shape instead: "
                               f"--shape E,k,H,I --format mxfp4|nvfp4")
    values = []
    for key in _FAMILY_KEYS[model_type]:
        for candidate in (key, *_ALTERNATE_KEYS.get(key, ())):
            if candidate in config:
                value = config[candidate]
                break
        else:
            raise ModelConfigError(f"{origin}: model_type {model_type!r} but key {key!r} is missing; a "
                                   f"{model_type} config.json names its MoE layer's {_MEANING[key]} so")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelConfigError(f"{origin}: {candidate} = {value!r} must be a positive integer")
        values.append(value)
    experts, top_k, hidden, inter = values
    if top_k > experts:
        raise ModelConfigError(f"{origin}: top-k {top_k} exceeds the {experts} experts")
    fmt = _format_of(outer if "quantization_config" in outer else config, origin, format)
    gpt_oss = model_type == "gpt_oss"
    return ModelShape(name or str(outer.get("_name_or_path") or model_type), fmt, experts, top_k, hidden, inter,
                      "swigluoai" if gpt_oss else "silu", gpt_oss, "interleaved" if gpt_oss else "contiguous",
                      matrix=False)


_MEANING = {"num_local_experts": "expert count", "num_experts": "expert count", "n_routed_experts": "expert count",
            "num_experts_per_tok": "top-k", "hidden_size": "hidden size",
            "intermediate_size": "expert intermediate size", "moe_intermediate_size": "expert intermediate size"}


def shape_from_args(spec: str, format: str, *, name: str | None = None, activation: str | None = None) -> ModelShape:
    """`E,k,H,I` (as --shape gives it) with a format; SiLU, contiguous, no biases unless activation says swigluoai
    (then gpt-oss's interleaved layout with biases)."""
    parts = spec.split(",")
    try:
        experts, top_k, hidden, inter = (int(p) for p in parts)
    except ValueError:
        raise ModelConfigError(f"--shape {spec!r} must be four integers E,k,H,I (experts, top-k, hidden size, "
                               f"expert intermediate size), e.g. 128,4,2880,2880") from None
    if min(experts, top_k, hidden, inter) < 1 or top_k > experts:
        raise ModelConfigError(f"--shape {spec!r}: every size must be positive and top-k at most E")
    if format not in FORMATS:
        raise ModelConfigError(f"--format {format!r} must be one of {FORMATS}")
    base = ModelShape(name or f"E{experts}-k{top_k}-H{hidden}-I{inter}-{format}", format, experts, top_k, hidden,
                      inter, "silu", False, "contiguous", matrix=False)
    if activation in (None, "silu"):
        return base
    if activation != "swigluoai":
        raise ModelConfigError(f"--activation {activation!r} must be silu or swigluoai")
    return replace(base, activation="swigluoai", biases=True, gate_up_layout="interleaved")
