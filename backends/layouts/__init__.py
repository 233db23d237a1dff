"""Weight-layout converters, one module per layout family; the rules name one per backend.

Each converter is a module-level object with ``convert(MoEWeights, hidden_size=, intermediate_size=)
-> KernelWeights`` and ``invert(KernelWeights) -> MoEWeights`` (protocol in `base`). Modules are
imported lazily by the registry (``backends.layouts.<module>:<object>``), never here.
"""
