"""The converter protocol and the one place that validates sizes and builds a `KernelWeights`.

    MoEWeights + decision sizes ──Layout._to_kernel──> KernelWeights   (padding included)
    KernelWeights ──Layout._from_kernel──> padded MoEWeights ──unpad──> MoEWeights

A converter is any object with ``layout`` (its name), ``convert`` and ``invert``; the rules name
one per backend as ``backends.layouts.<module>:<object>``. Concrete layouts subclass `Layout` and
write only the two middle arrows, as batched torch on whatever device the weights are on (CPU,
CUDA, meta), never modifying their input. `_to_kernel` gets the checkpoint's own (logical) tensors
and the padded sizes: layouts whose steps are strided copies write padding, row order and tiles in
one pass (`placement`); the others call ``w.pad(hidden, inter)`` first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from backends.weights import KernelWeights, MoEWeights

__all__ = ["Converter", "Layout", "reinterpret", "require_multiple", "require_tensor",
           "tile_permute", "tile_unpermute"]


@runtime_checkable
class Converter(Protocol):
    layout: str

    def convert(self, weights: MoEWeights, *, hidden_size: int | None = None,
                intermediate_size: int | None = None,
                quant_config: Mapping[str, Any] | None = None) -> KernelWeights: ...

    def invert(self, kw: KernelWeights) -> MoEWeights: ...


def require_multiple(layout: str, what: str, value: int, multiple: int, why: str) -> None:
    """One clear error when a (padded) size does not fit the layout's tiles."""
    if value % multiple:
        raise ValueError(f"layout {layout!r}: {what}={value} must be a multiple of {multiple} ({why}); pad the layer "
                         f"to the decision's rounded sizes (convert(..., hidden_size=..., intermediate_size=...))")


def require_tensor(layout: str, kw: KernelWeights, name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """kw[name], checked to have the shape and dtype this layout writes (so invert fails loudly on foreign input)."""
    t = kw[name]
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
        raise ValueError(f"layout {layout!r}: tensors[{name!r}] is {tuple(t.shape)} {t.dtype} but this layout writes "
                         f"{tuple(shape)} {dtype}; pass the KernelWeights that {layout!r}.convert produced")
    return t


def reinterpret(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Same bytes, other dtype (a view; the bit pattern is kept exactly)."""
    return t if t.dtype == dtype else t.view(dtype)


def _widened(t: torch.Tensor, view_shape: tuple, dims: tuple):
    """When the innermost view dim stays innermost, move it as 8/4/2-byte words (same bytes, fewer elements)."""
    last = len(view_shape) - 1
    inner_bytes = view_shape[-1] * t.element_size()
    if dims[-1] != last or not t.is_contiguous():
        return t, view_shape
    for width, dtype in ((8, torch.int64), (4, torch.int32), (2, torch.int16)):
        if width > t.element_size() and inner_bytes % width == 0:
            flat = t.reshape(-1, inner_bytes // t.element_size())
            return flat.view(dtype), (*view_shape[:-1], inner_bytes // width)
    return t, view_shape


def tile_permute(t: torch.Tensor, view_shape: tuple, dims: tuple) -> torch.Tensor:
    """t viewed as `view_shape`, dims permuted, stored contiguously, returned in t's shape (one copy)."""
    wide, shape = _widened(t, view_shape, dims)
    out = wide.reshape(shape).permute(dims).contiguous()
    return out.view(t.dtype).reshape(t.shape) if wide.dtype != t.dtype else out.reshape(t.shape)


def tile_unpermute(t: torch.Tensor, view_shape: tuple, dims: tuple) -> torch.Tensor:
    """Exact inverse of tile_permute(., view_shape, dims)."""
    permuted_shape = tuple(view_shape[d] for d in dims)
    inverse = tuple(sorted(range(len(dims)), key=lambda d: dims[d]))
    return tile_permute(t, permuted_shape, inverse)


#: checkpoint values a layout keeps in ``KernelWeights.config`` unchanged, so that `invert` is exact
SOURCE_KEYS = ("w13_global_scale", "w2_global_scale", "w13_input_scale", "w2_input_scale")


def source_config(w: MoEWeights) -> dict:
    """The NVFP4 per-expert scalars of `w`, kept as they are (kernel-specific values derive from them)."""
    return {name: getattr(w, name) for name in SOURCE_KEYS if getattr(w, name) is not None}


class Layout:
    """Base of every converter: padding, format and layout checks live here, once."""

    layout: str = ""
    formats: tuple[str, ...] = ("mxfp4",)

    def __repr__(self) -> str:
        return f"<layout {self.layout} for {'/'.join(self.formats)}>"

    # subclasses implement these two: w is the checkpoint (logical sizes), hidden/inter the padded sizes
    def _to_kernel(self, w: MoEWeights, hidden: int, inter: int) -> tuple[Mapping[str, torch.Tensor],
                                                                            Mapping[str, Any]]:
        raise NotImplementedError

    def _from_kernel(self, kw: KernelWeights) -> MoEWeights:
        raise NotImplementedError

    def _rebuild(self, kw: KernelWeights, **tensors) -> MoEWeights:
        """The padded MoEWeights from checkpoint-layout tensors plus the scalars kept in kw.config."""
        kept = {name: kw.config[name] for name in SOURCE_KEYS if name in kw.config}
        return MoEWeights(format=kw.format, gate_up=kw.gate_up, **kept, **tensors)

    def _check_sizes(self, w: MoEWeights, hidden: int, inter: int) -> None:
        """Hook: tile constraints on the padded sizes hidden/inter (raise with require_multiple)."""

    def _quant_values(self, quant_config: Mapping[str, Any]) -> Mapping[str, Any]:
        """Hook: the built quant config in the form this kernel takes it (default: as built)."""
        return quant_config

    def convert(self, weights: MoEWeights, *, hidden_size: int | None = None,
                intermediate_size: int | None = None,
                quant_config: Mapping[str, Any] | None = None) -> KernelWeights:
        """The kernel layout at the padded sizes. quant_config: what `backends.layouts.quant_config.
        build_quant_config` built from the rules' kind (alphas, global scales, gemm1 constants); it lands in
        KernelWeights.config, reshaped by `_quant_values`. A layout holds no quant value of its own."""
        if not isinstance(weights, MoEWeights):
            raise TypeError(f"layout {self.layout!r}: convert takes a backends.weights.MoEWeights, got "
                            f"{type(weights).__name__}; build one from the checkpoint tensors first")
        if weights.format not in self.formats:
            raise ValueError(f"layout {self.layout!r} converts {self.formats} weights, got format={weights.format!r}; "
                             f"pick the converter the decision names for this format")
        hidden, inter = weights.padded_sizes(hidden_size, intermediate_size)
        self._check_sizes(weights, hidden, inter)
        tensors, config = self._to_kernel(weights, hidden, inter)
        if quant_config is not None:
            config = {**config, **self._quant_values(quant_config)}
        return KernelWeights(layout=self.layout, format=weights.format, tensors=tensors, hidden_size=weights.H,
                             intermediate_size=weights.I, padded_hidden_size=hidden,
                             padded_intermediate_size=inter, gate_up=weights.gate_up, config=config)

    def invert(self, kw: KernelWeights) -> MoEWeights:
        if not isinstance(kw, KernelWeights):
            raise TypeError(f"layout {self.layout!r}: invert takes a KernelWeights, got {type(kw).__name__}")
        if kw.layout != self.layout:
            raise ValueError(f"layout {self.layout!r} cannot invert weights in layout {kw.layout!r}; use the "
                             f"converter that produced them")
        padded = self._from_kernel(kw)
        return padded.unpad(kw.hidden_size, kw.intermediate_size)
