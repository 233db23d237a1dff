"""Torch-free description of what backends.triton_moe accepts, for the rule tables and docs."""

ACTIVATIONS = ("swigluoai", "silu")

#: Torch-free facts for the rule tables (what this backend accepts).
CAPABILITIES = {
    "formats": ["mxfp4", "nvfp4"],
    "weight_dtype": "w4a16",
    "activation_dtypes": ["bfloat16"],
    "activations": list(ACTIVATIONS),
    "gate_up_layouts": ["interleaved", "contiguous"],
    "biases": True,
    "min_capability": [8, 0],
    "tuned_capabilities": [[9, 0]],
    "hidden_size_multiple": 64,
    "intermediate_size_multiple": 64,
    "packages": {"triton": ">=3.4"},
    "deterministic": True,
    "cuda_graphs": True,
    "routing": ["topk_softmax_renormalize", "softmax_topk", "given_ids"],
}

