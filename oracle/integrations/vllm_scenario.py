"""Translate between vLLM's selection objects and the oracle's scenario contract.

Kept free of any vLLM or torch import: every function takes vLLM's objects (or look-alikes)
as arguments, so the translation is tested in normal CI with fakes, and the plugin module
(`oracle.integrations.vllm`) only wires these functions to the real vLLM.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# vLLM's exception type for each refusal outcome (the README's outcome table).
REFUSALS: dict[str, type[Exception]] = {"invalid": ValueError, "unsupported": NotImplementedError}


class ScenarioMismatch(ValueError):
    """vLLM's configuration cannot be put as a question the rules answer (e.g. an activation
    the rule vocabulary lacks). A ValueError, like vLLM's own refusals, so a model load fails
    with this message instead of silently using vLLM's built-in choice."""


def platform_of(platform: Any, gcn_arch: Callable[[], str],
                amx: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Scenario `platform` of vLLM's `current_platform`.

    Only the platform kinds vLLM's MoE selectors test are distinguished: CUDA, ROCm, XPU;
    every other platform (CPU, TPU, out-of-tree) takes the same branches there as CPU.
    `gcn_arch` is called only on ROCm (vLLM derives ROCm's capability from that string);
    `amx` (releases whose CPU experts need x86 AMX) only on CPU, as `platform.amx`.
    """
    if platform.is_cuda():
        cap = platform.get_device_capability()
        if cap is None:
            raise ScenarioMismatch("current_platform: a CUDA platform reported no device capability; "
                                   "the oracle needs [major, minor] (is a GPU visible to this process?)")
        return {"kind": "cuda", "capability": [int(cap[0]), int(cap[1])]}
    if platform.is_rocm():
        return {"kind": "rocm", "gcn_arch": gcn_arch().split(":", 1)[0]}
    if platform.is_xpu():
        return {"kind": "xpu"}
    if amx is not None and platform.is_cpu():
        return {"kind": "cpu", "amx": bool(amx())}
    return {"kind": "cpu"}


def parallel_of(parallel: Any) -> dict[str, Any]:
    """Scenario `moe.parallel` of vLLM's FusedMoEParallelConfig."""
    return {"dp_size": int(parallel.dp_size), "ep_size": int(parallel.ep_size), "use_ep": bool(parallel.use_ep),
            "all2all_backend": str(parallel.all2all_backend), "eplb": bool(parallel.enable_eplb)}


def moe_of(config: Any) -> dict[str, Any]:
    """Scenario `moe` of vLLM's FusedMoEConfig (enum members become their value / name)."""
    activation = getattr(config.activation, "value", config.activation)
    routing = getattr(config.routing_method, "name", config.routing_method)
    moe = {
        "activation": str(activation),
        "is_act_and_mul": bool(config.is_act_and_mul),
        "moe_backend": str(config.moe_backend),
        "lora": bool(config.is_lora_enabled),
        "routing_method": str(routing),
        "hidden_size": int(config.hidden_dim),
        "intermediate_size": int(config.intermediate_size_per_partition),
        "num_experts": int(config.num_experts),
        "top_k": int(config.experts_per_token),
        "has_bias": bool(config.has_bias),
        "parallel": parallel_of(config.moe_parallel_config),
    }
    if hasattr(config, "swiglu_limit"):  # vLLM 0.33: NVFP4 keeps the backends that apply the SwiGLU clamp
        limit = config.swiglu_limit
        moe["swiglu_limit"] = None if limit is None else float(limit)
    return moe


def quant_key_name(key: Any, named_keys: Mapping[str, Any]) -> str | None:
    """vLLM's QuantKey as its constant's name (`kNvfp4Static`); None stays None (BF16)."""
    if key is None:
        return None
    for name, value in named_keys.items():
        if value == key:
            return name
    raise ScenarioMismatch(f"quant key {key!r} is none of vLLM's named QuantKey constants "
                           f"({', '.join(sorted(named_keys)) or 'none found'}); the rules name keys by those constants")


def env_of(environ: Mapping[str, str], prefix: str = "VLLM_") -> dict[str, str]:
    """vLLM's environment variables exactly as strings (unset and "0" stay different)."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith(prefix)}


def build_scenario(*, policy: str, profile: str, platform: Mapping[str, Any], packages: Mapping[str, bool],
                   env: Mapping[str, str], config: Any, quant_keys: Mapping[str, str | None] | None = None,
                   flashinfer: Mapping[str, bool] | None = None) -> dict[str, Any]:
    """The full scenario mapping for one selector call. `quant_keys` are the selector's QuantKey
    arguments by parameter name (`weight_key`, `activation_key`), already named (quant_key_name);
    `flashinfer` what vLLM's FlashInfer feature probes answer (feature -> bool), where they were read."""
    moe = moe_of(config)
    moe.update(quant_keys or {})
    scenario = {"policy": policy, "profile": profile, "platform": dict(platform), "packages": dict(packages),
                "env": dict(env), "moe": moe}
    if flashinfer:
        scenario["flashinfer"] = dict(flashinfer)
    return scenario


def to_vllm_answer(decision: Any, backend_enum: Any, kernel_classes: Callable[[Any], list],
                   refusals: Mapping[str, type[Exception]] = REFUSALS) -> tuple[Any, Any]:
    """vLLM's return value for an oracle decision, or vLLM's exception for a refusal.

    selected -> (enum member, experts class named by the rules, or the backend's first class
    when the rules took the backend unchecked, as vLLM does); none -> (the NONE member, None);
    invalid / unsupported -> the release's exception type (`refusals`; ValueError and
    NotImplementedError in every supported release); error -> ScenarioMismatch.
    """
    outcome = decision.outcome
    if outcome in refusals:
        raise refusals[outcome](decision.error)
    if outcome == "error":
        raise ScenarioMismatch(f"moe-oracle could not answer this vLLM configuration: {decision.error}")
    if outcome == "none":
        value = decision.backend if decision.backend is not None else "None"
        return _member(backend_enum, value), None
    member = _member(backend_enum, decision.backend)
    classes = kernel_classes(member)
    if decision.kernel is None:
        return member, classes[0]
    for cls in classes:
        if cls.__name__ == decision.kernel:
            return member, cls
    raise ScenarioMismatch(f"the rules chose kernel {decision.kernel!r} for {member.value}, but this vLLM's "
                           f"{member.value} has {', '.join(c.__name__ for c in classes)}; fix the rule's kernel list")


def _member(backend_enum: Any, value: str) -> Any:
    try:
        return backend_enum(value)
    except ValueError:
        known = ", ".join(m.value for m in backend_enum)
        raise ScenarioMismatch(f"the rules chose backend {value!r}, which this vLLM's {backend_enum.__name__} "
                               f"does not have (it has {known}); use a profile written for this vLLM") from None
