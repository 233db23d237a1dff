"""The closed vocabulary of scenario facts that rule conditions may test.

One place: the scenario normalizer fills exactly these keys, and the rule schema's
fact enum is checked against this table by a test. Defaults here are only the neutral
ones (nothing installed, no parallelism, no explicit backend); the model-specific defaults
(activation, layer sizes, quantization keys) come from the rules' `fact_defaults` and each
policy's `defaults`.
"""
from __future__ import annotations

# fact path -> (type name, neutral default when neither the scenario nor the rules give it)
FACTS: dict[str, tuple[str, object]] = {
    "platform.kind": ("choice", "cuda"),
    "platform.capability": ("capability", None),
    "platform.gcn_arch": ("str", None),
    "platform.amx": ("bool", False),
    "moe.activation": ("choice", None),
    "moe.is_act_and_mul": ("bool", True),
    "moe.moe_backend": ("str", "auto"),
    "moe.lora": ("bool", False),
    "moe.routing_method": ("str", None),
    "moe.hidden_size": ("int", None),
    "moe.intermediate_size": ("int", None),
    "moe.num_experts": ("int", None),
    "moe.top_k": ("int", None),
    "moe.has_bias": ("bool", False),
    "moe.weight_key": ("str?", None),
    "moe.activation_key": ("str?", None),
    "moe.user_activation_key": ("str?", None),
    "moe.swiglu_limit": ("num?", None),
    "moe.parallel.dp_size": ("int", 1),
    "moe.parallel.ep_size": ("int", 1),
    "moe.parallel.use_ep": ("bool", False),
    "moe.parallel.all2all_backend": ("str", None),
    "moe.parallel.eplb": ("bool", False),
    "quark.weight.dtype": ("str?", None),
    "quark.weight.qscheme": ("str?", None),
    "quark.weight.group_size": ("int?", None),
    "quark.weight.scale_format": ("str?", None),
    "quark.input.dtype": ("str?", None),
    "quark.input.is_dynamic": ("bool", False),
    "quark.input.qscheme": ("str?", None),
    "quark.input.group_size": ("int?", None),
    "quark.input.scale_format": ("str?", None),
    "quark.input.symmetric": ("bool?", None),
    "quark.input_dtype": ("str?", None),
    "quark.weight_dtype": ("str?", None),
    # what vLLM's FlashInfer probes answer beyond "installed" (has_flashinfer_<name>(); situ_activation:
    # ActivationType.Situ exists). Neutral: absent; each profile's fact_defaults give the FlashInfer its vLLM pins.
    "flashinfer.situ_activation": ("bool", False),
    "flashinfer.trtllm_fused_moe": ("bool", False),
    "flashinfer.cutlass_fused_moe": ("bool", False),
    "flashinfer.cutedsl_grouped_gemm_nt_masked": ("bool", False),
    "flashinfer.cutedsl_moe_nvfp4": ("bool", False),
    "flashinfer.b12x_moe": ("bool", False),
    "call.backend": ("str?", None),
    "scheme.weight_key": ("str?", None),
    "scheme.activation_key": ("str?", None),
}
# facts that live on the per-question context rather than in the scenario (set while a policy runs);
# scheme.*: the (weight, activation) QuantKey pair of the backend whose kernels are being checked
CTX_FACTS = {"call.backend": "call_backend", "scheme.weight_key": "weight_key",
             "scheme.activation_key": "activation_key"}

PLATFORM_KINDS = ("cuda", "rocm", "xpu", "cpu")

# Upper bounds far above any model (hidden sizes are at most tens of thousands, experts a few hundred): a larger
# value is a typo or garbage, never a question to answer with a size rounded from it.
_SIZE = 1 << 20
_COUNT = 1 << 16
# Allowed ranges (inclusive; None = unbounded) of the numeric facts a scenario gives: anything outside is
# answered `error` naming the field, the value and the range, never selected on. Unlisted ints: >= 0.
RANGES: dict[str, tuple[int, int | None]] = {
    "moe.hidden_size": (1, _SIZE), "moe.intermediate_size": (1, _SIZE), "moe.num_experts": (1, _COUNT),
    "moe.top_k": (1, _COUNT), "moe.parallel.dp_size": (1, _COUNT), "moe.parallel.ep_size": (1, _COUNT),
    "quark.weight.group_size": (1, _SIZE), "quark.input.group_size": (1, _SIZE),
}
MAX_NUMBER = 1e9  # a number fact (moe.swiglu_limit): finite, and far above any real one
# the facts whose values are quantization keys: a scenario may give only the keys the rules declare (quant_keys)
QUANT_KEY_FACTS = ("moe.weight_key", "moe.activation_key", "moe.user_activation_key")
# CUDA compute capability [major, minor]: majors so far 3..12 (a major above 20 is a typo such as [90, 0]
# for 9.0), minors are one digit (sm_XY)
CAPABILITY_RANGES = ((1, 20), (0, 9))
# Placeholders a message may use besides fact paths and value names.
MESSAGE_WORDS = ("backend", "reason", "explicit_keys", "weight_key", "activation_key", "activation_format")
