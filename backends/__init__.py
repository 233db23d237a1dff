"""Tensor code: format codecs (formats), the reference MoE (emulation), checkpoint containers (weights),
released checkpoint layouts on disk (checkpoints), layouts, kernels, `MoELayer`, the runtime path from checkpoint
tensors to MoE output, and clients that put it in other projects' models (integrations).

`MoELayer` is loaded on first access, so importing a torch-free submodule (e.g. a kernel's
capability table) does not import torch through this package.
"""

__all__ = ["LayerUnavailableError", "MoELayer"]


def __getattr__(name):
    if name in __all__:
        try:
            from backends import layer
        except ModuleNotFoundError as exc:
            if exc.name != "torch":
                raise
            raise ModuleNotFoundError("backends.MoELayer needs torch, which is not installed: pip install "
                                      "'moe-oracle[torch]' (or '.[torch]' in a checkout; '.[triton]' for the Triton "
                                      "kernels on a GPU). Selection (import oracle) needs no torch.",
                                      name="torch") from None
        return getattr(layer, name)
    raise AttributeError(f"module 'backends' has no attribute {name!r}")
