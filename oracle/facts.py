"""The closed vocabulary of scenario facts that rule conditions may test.

One place: the scenario normalizer fills exactly these keys, and the rule schema's
fact enum is checked against this table by a test.
"""
from __future__ import annotations

# fact path -> (type name, default when the scenario does not give it)
FACTS: dict[str, tuple[str, object]] = {
    "platform.kind": ("choice", "cuda"),
    "platform.capability": ("capability", None),
    "platform.gcn_arch": ("str", None),
    "moe.activation": ("choice", "swigluoai"),
    "moe.is_act_and_mul": ("bool", True),
    "moe.moe_backend": ("str", "auto"),
    "moe.lora": ("bool", False),
    "moe.routing_method": ("str", "Renormalize"),
    "moe.hidden_size": ("int", 2880),
    "moe.intermediate_size": ("int", 2880),
    "moe.num_experts": ("int", 32),
    "moe.top_k": ("int", 4),
    "moe.has_bias": ("bool", False),
    "moe.weight_key": ("str?", "kNvfp4Static"),
    "moe.activation_key": ("str?", "kNvfp4Dynamic"),
    "moe.parallel.dp_size": ("int", 1),
    "moe.parallel.ep_size": ("int", 1),
    "moe.parallel.use_ep": ("bool", False),
    "moe.parallel.all2all_backend": ("str", "allgather_reducescatter"),
    "moe.parallel.eplb": ("bool", False),
    "quark.weight.dtype": ("str?", None),
    "quark.weight.qscheme": ("str?", None),
    "quark.input.dtype": ("str?", None),
    "quark.input.is_dynamic": ("bool", False),
    "quark.input_dtype": ("str?", None),
    "quark.weight_dtype": ("str?", None),
    "call.backend": ("str?", None),
}

PLATFORM_KINDS = ("cuda", "rocm", "xpu", "cpu")
ACTIVATIONS = ("silu", "gelu", "swigluoai", "swiglustep", "silu_no_mul", "gelu_no_mul", "relu2_no_mul")
QUERIES = ("select", "round_up", "map_backend", "ocp_mx_scheme")
# Extra answer fields a policy may emit (the ocp-mx contract of the scenario spec).
EMIT_FIELDS = ("ocp_mx_scheme", "emulate", "static_input_scales")
# Placeholders a message may use besides fact paths and value names.
MESSAGE_WORDS = ("backend", "reason", "explicit_keys", "weight_key", "activation_key", "activation_format")
