"""Torch-free description of what backends.triton_moe accepts, for the rule tables and docs."""

ACTIVATIONS = ("swigluoai", "silu")
#: Oldest triton the kernels are written for (tl.dot with bf16 operands, inline PTX via
#: tl.inline_asm_elementwise, the 3.4+ interpreter); the rules can only say "triton installed".
MIN_TRITON = (3, 4)


def version_tuple(version: str) -> tuple[int, ...]:
    """(major, minor) of a version string, each piece's digits only ("3.6.0+git1a2b" -> (3, 6); none -> 0)."""
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def require_triton_version(version: str) -> None:
    """Refuse an older triton at import time with one clear message (the layer reports it as not runnable here)."""
    if version_tuple(version) < MIN_TRITON:
        raise ImportError(f"backends.triton_moe needs triton >= {'.'.join(map(str, MIN_TRITON))}, found {version}; "
                          f"pip install 'triton>={'.'.join(map(str, MIN_TRITON))}' or use the EMULATION backend")

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
    "packages": {"triton": ">=" + ".".join(map(str, MIN_TRITON))},
    "deterministic": True,
    "cuda_graphs": True,
    "routing": ["topk_softmax_renormalize", "softmax_topk", "given_ids"],
}

