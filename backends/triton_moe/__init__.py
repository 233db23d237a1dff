"""This project's fused W4A16 MoE kernels on Triton (MXFP4 / NVFP4 weights, BF16 activations).

`backends.triton_moe:moe_forward` is the entry point (see forward.py); `CAPABILITIES` is importable
without torch or triton. Importing the package loads neither until moe_forward is touched.
"""

from backends.triton_moe.capabilities import ACTIVATIONS, CAPABILITIES

__all__ = ["ACTIVATIONS", "CAPABILITIES", "moe_forward"]


def __getattr__(name):
    if name == "moe_forward":
        from backends.triton_moe.forward import moe_forward

        return moe_forward
    raise AttributeError(f"module 'backends.triton_moe' has no attribute {name!r}")
