"""The checkpoint model of one MoE layer (`MoEWeights`) and a backend's converted layout (`KernelWeights`).

Every layout converter (`backends.layouts.*`) reads a `MoEWeights` and writes a `KernelWeights`; its
inverse goes back. `MoEWeights` is the one place that says what a checkpoint tensor means:

* ``w13`` [E, 2I, H/2] uint8, packed E2M1 codes (element 2j in the low nibble, as `backends.formats`);
  ``w2`` [E, H, I/2]. Only gated experts (two halves gate and up in w13) are modelled.
* ``w13_scale`` / ``w2_scale``: per-row block scales along K, *linear* (not swizzled):
  mxfp4 -> [E, rows, K/32] uint8 E8M0; nvfp4 -> [E, rows, K/16] float8_e4m3fn.
* ``gate_up``: the row order of w13. ``"interleaved"`` (gpt-oss): row 2i is gate_i, row 2i+1 is up_i.
  ``"contiguous"`` (generic ``[w1; w3]``): rows [0, I) are gate (w1), rows [I, 2I) are up (w3).
* ``w13_bias`` [E, 2I] / ``w2_bias`` [E, H]: optional fp32, rows in the same order as the weight.
* NVFP4 only: ``w13_global_scale`` / ``w2_global_scale`` [E] fp32 are the per-expert *quantization*
  multipliers, exactly `backends.emulation.moe_forward`'s arguments, i.e. ``1 / weight_scale_2`` of a
  ModelOpt checkpoint. A checkpoint stores w1 and w3 global scales separately ([E, 2]); the kernels
  take one per expert, so `global_scale_from_weight_scale_2` accepts [E, 2] only when both columns
  are equal (vLLM silently keeps column 0; a w3 quantized with another scale would be mis-scaled).
* ``w13_input_scale`` [E, 2] (w1, w3) / ``w2_input_scale`` [E] fp32 (both formats, optional) are the checkpoint's
  activation ``input_scale`` (dequantization multipliers): NVFP4 W4A4 backends take them for their quant config,
  and static per-tensor FP8 activations (W4A8, kFp8StaticTensorSym) take their max as a1 / a2
  (`static_input_scales`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from oracle import vocabulary

__all__ = [
    "BLOCK_SIZE",
    "GATE_UP_CONVENTIONS",
    "WEIGHT_FORMATS",
    "KernelWeights",
    "MoEWeights",
    "global_scale_from_weight_scale_2",
]

#: The FP4 (E2M1) weight codecs of oracle.vocabulary: the checkpoints this container models.
WEIGHT_FORMATS = tuple(dict.fromkeys(f.codec for f in vocabulary.FORMATS
                                    if f.codec is not None and f.element == "e2m1" and not f.dynamic))
GATE_UP_CONVENTIONS = ("interleaved", "contiguous")
#: elements per block scale along K
BLOCK_SIZE = {"mxfp4": 32, "nvfp4": 16}
_SCALE_DTYPE = {"mxfp4": torch.uint8, "nvfp4": torch.float8_e4m3fn}


def _shape(t) -> tuple:
    return tuple(t.shape)


def _described(t) -> str:
    return "None" if t is None else f"{tuple(t.shape)} {t.dtype}"


@dataclass(frozen=True, eq=False)
class MoEWeights:
    """One MoE layer's expert weights as stored in a checkpoint (see the module docstring).

    Construction checks shapes, dtypes, devices and the scale values (no NaN block scale, no negative E4M3 one,
    finite positive global and input scales: see `_check_scale_values`); it does not check activations for NaN
    (a NaN input gives NaN outputs, as in vLLM)."""

    format: str
    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    gate_up: str = "interleaved"
    w13_bias: torch.Tensor | None = None
    w2_bias: torch.Tensor | None = None
    w13_global_scale: torch.Tensor | None = None
    w2_global_scale: torch.Tensor | None = None
    w13_input_scale: torch.Tensor | None = None
    w2_input_scale: torch.Tensor | None = None

    # ------------------------------------------------------------------ validation
    def _fail(self, kind, message: str):
        raise kind(f"MoEWeights: {message}")

    def _check(self, name: str, dtype: torch.dtype, shape: tuple, fix: str) -> None:
        value = getattr(self, name)
        if not isinstance(value, torch.Tensor):
            self._fail(TypeError, f"{name} must be a torch.Tensor of shape {shape} and dtype {dtype}, "
                       f"got {type(value).__name__}; {fix}")
        if value.dtype != dtype:
            self._fail(TypeError, f"{name}.dtype={value.dtype} must be {dtype}; {fix}")
        if _shape(value) != shape:
            self._fail(ValueError, f"{name}.shape={_shape(value)} must be {shape}; {fix}")
        if value.device != self.w13.device:
            self._fail(ValueError, f"{name} is on {value.device} but w13 is on {self.w13.device}; "
                       f"move every tensor to one device with .to(device)")

    def __post_init__(self) -> None:
        if self.format not in WEIGHT_FORMATS:
            self._fail(ValueError, f"format={self.format!r} must be one of {WEIGHT_FORMATS}")
        if self.gate_up not in GATE_UP_CONVENTIONS:
            self._fail(ValueError, f"gate_up={self.gate_up!r} must be one of {GATE_UP_CONVENTIONS} "
                       f"('interleaved' = gpt-oss even/odd rows, 'contiguous' = [w1; w3])")
        for name in ("w13", "w2"):
            value = getattr(self, name)
            if not isinstance(value, torch.Tensor) or value.dim() != 3:
                self._fail(ValueError, f"{name} must be a 3-D uint8 tensor ([E, 2I, H/2] for w13, [E, H, I/2] "
                           f"for w2), got {_shape(value) if isinstance(value, torch.Tensor) else type(value).__name__}")
        experts, rows, _ = self.w13.shape
        hidden = self.w2.shape[1]
        block = BLOCK_SIZE[self.format]
        if rows % 2:
            self._fail(ValueError, f"w13.shape[1]={rows} must be even (gate and up rows of a gated expert)")
        inter = rows // 2
        sizes = (("hidden size H (w2.shape[1])", hidden), ("intermediate size I (w13.shape[1] / 2)", inter))
        for dim_name, size in sizes:
            if size % block:
                self._fail(ValueError, f"{dim_name}={size} must be a multiple of {block} (the {self.format} block "
                           f"size); pad the checkpoint with MoEWeights.pad")
        packed = "view the packed FP4 bytes as uint8 (t.view(torch.uint8))"
        self._check("w13", torch.uint8, (experts, 2 * inter, hidden // 2), packed)
        self._check("w2", torch.uint8, (experts, hidden, inter // 2), packed)
        scale_dtype = _SCALE_DTYPE[self.format]
        scale_fix = (f"pass the linear (unswizzled) {self.format} block scales of the matching weight, viewed as "
                     f"{scale_dtype}")
        self._check("w13_scale", scale_dtype, (experts, 2 * inter, hidden // block), scale_fix)
        self._check("w2_scale", scale_dtype, (experts, hidden, inter // block), scale_fix)
        for name, shape in (("w13_bias", (experts, 2 * inter)), ("w2_bias", (experts, hidden))):
            if getattr(self, name) is not None:
                self._check(name, torch.float32, shape,
                            "biases are fp32 in the weight's row order; convert with .float()")
        per_expert = {"w13_global_scale": (experts,), "w2_global_scale": (experts,),
                      "w13_input_scale": (experts, 2), "w2_input_scale": (experts,)}
        if self.format == "mxfp4":
            for name in ("w13_global_scale", "w2_global_scale"):
                if getattr(self, name) is not None:
                    self._fail(ValueError, f"{name} must be None for format='mxfp4' (E8M0 block scales need no "
                               f"global scale); drop it or use format='nvfp4'")
        else:
            for name in ("w13_global_scale", "w2_global_scale"):
                self._check(name, torch.float32, per_expert[name],
                            "pass the per-expert quantization multiplier 1/weight_scale_2 "
                            "(see global_scale_from_weight_scale_2)")
        for name in ("w13_input_scale", "w2_input_scale"):
            if getattr(self, name) is not None:
                self._check(name, torch.float32, per_expert[name],
                            "pass the checkpoint's activation input_scale ([E, 2] for w1/w3, [E] for w2) as fp32")
        self._check_scale_values()

    def _check_scale_values(self) -> None:
        """Refuse scales no correct checkpoint holds: one elementwise test and one reduction per tensor (the expert
        is located only on failure). A NaN block scale (E8M0 code 255, E4M3 0x7f/0xff) makes its block NaN, a
        negative E4M3 one flips its sign; a zero block scale is allowed (padding writes it, and an all-zero block
        quantizes to it: 0 * 0 = 0). Global and input scales must be finite and positive (a zero global scale
        divides by zero). Activations are not checked: NaN inputs give NaN outputs."""
        if self.w13.device.type == "meta":
            return
        tests = {"w13_scale": self._bad_block_scales, "w2_scale": self._bad_block_scales}
        for name in ("w13_global_scale", "w2_global_scale", "w13_input_scale", "w2_input_scale"):
            if getattr(self, name) is not None:
                tests[name] = _not_finite_positive
        for name, bad_of in tests.items():
            bad = bad_of(getattr(self, name))
            if bool(bad.any()):
                expert = int(bad.reshape(bad.shape[0], -1).any(dim=1).nonzero()[0, 0])
                value = getattr(self, name)[expert].reshape(-1)[bad[expert].reshape(-1).nonzero()[0, 0]]
                self._fail(ValueError, f"{name}[{expert}] (expert {expert}) holds {self._describe(name, value)}; "
                           f"{self._scale_fix(name)}")

    def _bad_block_scales(self, t: torch.Tensor) -> torch.Tensor:
        bits = t.view(torch.uint8)
        if self.format == "mxfp4":
            return bits == 255  # E8M0 NaN
        return ((bits & 0x7F) == 0x7F) | (bits > 0x80)  # E4M3 NaN, or negative (0x80 is -0: a zero scale)

    def _describe(self, name: str, value: torch.Tensor) -> str:
        if name.endswith("global_scale") or name.endswith("input_scale"):
            return f"{float(value)!r}, not a finite positive number"
        code = int(value.view(torch.uint8))
        if self.format == "mxfp4":
            return "E8M0 code 255 (NaN)"
        return f"E4M3 code 0x{code:02x} ({float(value.float())!r}), not a finite non-negative scale"

    def _scale_fix(self, name: str) -> str:
        if name.endswith("global_scale"):
            return ("pass 1/weight_scale_2 of the checkpoint, finite and > 0 (see global_scale_from_weight_scale_2); "
                    "a checkpoint holding this is corrupt or was quantized from NaN weights")
        if name.endswith("input_scale"):
            return "the checkpoint's input_scale must be finite and > 0; re-export or re-calibrate it"
        return ("the checkpoint's block scales are corrupt (or it was quantized from NaN/inf weights); re-quantize "
                "it, or check that the scales are read with the right dtype and layout")

    # ------------------------------------------------------------------ sizes
    @property
    def E(self) -> int:
        return self.w13.shape[0]

    @property
    def H(self) -> int:
        return self.w2.shape[1]

    @property
    def I(self) -> int:  # noqa: E743 - the MoE literature's name for the intermediate size
        return self.w13.shape[1] // 2

    @property
    def block_size(self) -> int:
        return BLOCK_SIZE[self.format]

    def replace(self, **changes) -> MoEWeights:
        """A copy with some fields replaced (validated again)."""
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        fields.update(changes)
        return MoEWeights(**fields)

    def static_input_scales(self, needed_by: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(a1, a2): one-element fp32 tensors, the max of the checkpoint's static activation input scales over experts
        (and w1/w3), as vLLM's W4A8 quant configs reduce them; `needed_by` names who asks, for the error."""
        if self.w13_input_scale is None or self.w2_input_scale is None:
            self._fail(ValueError, f"{needed_by} quantizes activations to FP8 per tensor with the checkpoint's static "
                       f"input scales, but these weights carry none (w13_input_scale="
                       f"{_described(self.w13_input_scale)}, w2_input_scale={_described(self.w2_input_scale)}); "
                       f"load them from the checkpoint's "
                       f"input_scale tensors (MoEWeights(w13_input_scale=[E, 2] for w1/w3, w2_input_scale=[E]) as "
                       f"fp32), or ask dynamic MXFP8 activations (activation_key='kMxfp8Dynamic')")
        if self.E == 0:
            self._fail(ValueError, f"{needed_by}: a layer with no experts has no static input scale")
        return self.w13_input_scale.amax().reshape(1), self.w2_input_scale.amax().reshape(1)

    def emulation_kwargs(self) -> dict:
        """Keyword arguments for `backends.emulation.moe_forward` that describe these weights."""
        return {"format": self.format, "w13": self.w13, "w13_scale": self.w13_scale, "w2": self.w2,
                "w2_scale": self.w2_scale,
                    "w13_bias": self.w13_bias, "w2_bias": self.w2_bias, "w13_global_scale": self.w13_global_scale,
                    "w2_global_scale": self.w2_global_scale, "gate_up_layout": self.gate_up}

    # ------------------------------------------------------------------ padding
    def _check_padded_sizes(self, fn: str, hidden_size, intermediate_size, *, growing: bool) -> tuple:
        hidden_size = self.H if hidden_size is None else hidden_size
        intermediate_size = self.I if intermediate_size is None else intermediate_size
        checks = (("hidden_size", hidden_size, self.H), ("intermediate_size", intermediate_size, self.I))
        for name, value, own in checks:
            if not isinstance(value, int) or isinstance(value, bool) or value % self.block_size:
                self._fail(ValueError, f"{fn}: {name}={value!r} must be an int multiple of {self.block_size} "
                           f"(the {self.format} block size); pass the decision's rounded size")
            if growing and value < own:
                self._fail(ValueError, f"{fn}: {name}={value} is smaller than the weights' {own}; padding only "
                           f"grows a layer, pass a size >= {own}")
            if not growing and value > own:
                self._fail(ValueError, f"{fn}: {name}={value} is larger than the padded weights' {own}; pass the "
                           f"logical size the layer was padded from")
        return hidden_size, intermediate_size

    def _w13_row_blocks(self, inter: int, padded_inter: int) -> list:
        """(logical rows, padded rows) slice pairs of w13: one block (interleaved) or gate and up (contiguous)."""
        if self.gate_up == "interleaved":  # zero (gate, up) pairs are appended at the end
            return [(slice(0, 2 * inter), slice(0, 2 * inter))]
        gate = (slice(0, inter), slice(0, inter))
        return [gate, (slice(inter, 2 * inter), slice(padded_inter, padded_inter + inter))]

    def padded_sizes(self, hidden_size: int | None = None, intermediate_size: int | None = None) -> tuple:
        """(H, I) after `pad(hidden_size, intermediate_size)`, checked the same way (None keeps a size)."""
        return self._check_padded_sizes("pad", hidden_size, intermediate_size, growing=True)

    def pad(self, hidden_size: int | None = None, intermediate_size: int | None = None) -> MoEWeights:
        """Zero-pad to the decision's rounded sizes; padded weights and scales dequantize to exactly 0.

        Padded codes are 0 (+0.0) and padded scales are 0 (E8M0 code 0 = 2^-127, E4M3 0.0): finite, so
        0 * scale = 0 (a NaN scale code such as E8M0 255 would turn the zeros into NaN). Biases pad with 0.
        In the contiguous convention gate and up are padded separately, so [gate; up] stays two halves.
        """
        hidden, inter = self._check_padded_sizes("pad", hidden_size, intermediate_size, growing=True)
        if (hidden, inter) == (self.H, self.I):
            return self
        blocks13 = self._w13_row_blocks(self.I, inter)
        blocks2 = [(slice(0, self.H), slice(0, self.H))]

        def grow(t, new_shape, blocks):
            """One pass: copy the blocks, zero only what they do not cover (no full memset first)."""
            if t is None:
                return None
            result = t.new_empty(new_shape)
            t, out = _as_words(t, result)
            cols = t.shape[-1]
            out[:, :, cols:] = 0
            covered = 0
            for src, dst in blocks:
                out[:, covered:dst.start] = 0
                out[:, dst, :cols] = t[:, src]
                covered = dst.stop
            out[:, covered:] = 0
            return result

        def grow_bias(t, new_len, blocks):
            return None if t is None else grow(t.unsqueeze(-1), (t.shape[0], new_len, 1), blocks).squeeze(-1)

        experts, block = self.E, self.block_size
        return self.replace(
            w13=grow(self.w13, (experts, 2 * inter, hidden // 2), blocks13),
            w13_scale=grow(self.w13_scale, (experts, 2 * inter, hidden // block), blocks13),
            w2=grow(self.w2, (experts, hidden, inter // 2), blocks2),
            w2_scale=grow(self.w2_scale, (experts, hidden, inter // block), blocks2),
            w13_bias=grow_bias(self.w13_bias, 2 * inter, blocks13),
            w2_bias=grow_bias(self.w2_bias, hidden, blocks2),
        )

    def unpad(self, hidden_size: int, intermediate_size: int) -> MoEWeights:
        """Slice a padded layer back to its logical sizes (the inverse of `pad`)."""
        hidden, inter = self._check_padded_sizes("unpad", hidden_size, intermediate_size, growing=False)
        if (hidden, inter) == (self.H, self.I):
            return self
        blocks13 = self._w13_row_blocks(inter, self.I)
        blocks2 = [(slice(0, hidden), slice(0, hidden))]

        def cut(t, cols, blocks):
            if t is None:
                return None
            if cols is not None:  # same bytes as wide words when both row pitches allow it
                dtype, narrow = t.dtype, t.new_empty((*t.shape[:-1], cols))
                words, narrow_words = _as_words(t, narrow)
                if words.dtype != dtype:
                    cols = narrow_words.shape[-1]
                    parts = [words[:, dst, :cols] for _, dst in blocks]
                    out = (parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)).contiguous()
                    return out.view(torch.uint8).view(dtype)
            parts = [t[:, dst] if cols is None else t[:, dst, :cols] for _, dst in blocks]
            return (parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)).contiguous()

        block = self.block_size
        return self.replace(
            w13=cut(self.w13, hidden // 2, blocks13),
            w13_scale=cut(self.w13_scale, hidden // block, blocks13),
            w2=cut(self.w2, inter // 2, blocks2),
            w2_scale=cut(self.w2_scale, inter // block, blocks2),
            w13_bias=cut(self.w13_bias, None, blocks13),
            w2_bias=cut(self.w2_bias, None, blocks2),
        )


def _not_finite_positive(t: torch.Tensor) -> torch.Tensor:
    return ~(torch.isfinite(t) & (t > 0))


def _as_words(small: torch.Tensor, large: torch.Tensor) -> tuple:
    """Views of two tensors' rows as the widest word (16/8/4/2 bytes) that divides both row lengths.

    Padding copies rows of one pitch into rows of another; copied as 1-byte elements that strided copy
    runs far below copy bandwidth, as 16-byte words (1440-byte rows into 1472-byte rows) near it. Same
    bytes either way (complex128 is only a 16-byte carrier: copy_ moves its bits untouched, as in
    `backends.layouts.placement`); tensors that cannot be viewed so (non-contiguous rows, 1-element
    rows) stay as they are.
    """
    size = small.element_size()
    row_bytes = (small.shape[-1] * size, large.shape[-1] * size)
    for dtype in (torch.complex128, torch.int64, torch.int32, torch.int16):
        width = torch.empty((), dtype=dtype).element_size()
        if width <= size or any(b % width for b in row_bytes) or small.dtype != large.dtype:
            continue
        try:
            return small.view(torch.uint8).view(dtype), large.view(torch.uint8).view(dtype)
        except RuntimeError:
            break
    return small, large


def global_scale_from_weight_scale_2(weight_scale_2: torch.Tensor) -> torch.Tensor:
    """A checkpoint's NVFP4 ``weight_scale_2`` ([E] or [E, 2] for w1/w3, dequant) -> [E] quantization multiplier."""
    fn = "global_scale_from_weight_scale_2"
    if not isinstance(weight_scale_2, torch.Tensor) or not weight_scale_2.dtype.is_floating_point:
        raise TypeError(f"{fn}: weight_scale_2 must be a floating tensor [E] or [E, 2]; convert with .float()")
    if weight_scale_2.dim() == 2 and weight_scale_2.shape[1] == 2:
        w1, w3 = weight_scale_2.float().unbind(1)
        if weight_scale_2.device.type != "meta" and not torch.equal(w1, w3):
            bad = int((w1 != w3).nonzero()[0, 0])
            raise ValueError(f"{fn}: weight_scale_2 differs between w1 and w3 (first at expert {bad}: "
                             f"{float(w1[bad])} vs {float(w3[bad])}); the kernels take one global scale per expert, "
                             f"so requantize w3 with w1's global scale (vLLM would silently use w1's)")
        weight_scale_2 = w1
    if weight_scale_2.dim() != 1:
        raise ValueError(f"{fn}: weight_scale_2.shape={_shape(weight_scale_2)} must be [E] or [E, 2] (w1, w3)")
    return (1.0 / weight_scale_2.float()).contiguous()


@dataclass(frozen=True, eq=False)
class KernelWeights:
    """A backend's layout of one MoE layer: named tensors plus the scalars its kernel call needs.

    ``hidden_size``/``intermediate_size`` are the logical sizes, ``padded_*`` the sizes the tensors
    have; ``gate_up`` is the convention of the `MoEWeights` it was converted from (the inverse returns
    to it); ``config`` holds per-backend values that are not weight tensors of the kernel's
    signature (NVFP4 alphas and global scales, swiglu alpha/beta/limit per expert, ...).
    """

    layout: str
    format: str
    tensors: Mapping[str, torch.Tensor]
    hidden_size: int
    intermediate_size: int
    padded_hidden_size: int
    padded_intermediate_size: int
    gate_up: str
    config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.layout, str) or not self.layout:
            raise ValueError("KernelWeights: layout must be a non-empty string naming the layout")
        if self.format not in WEIGHT_FORMATS:
            raise ValueError(f"KernelWeights: format={self.format!r} must be one of {WEIGHT_FORMATS}")
        if self.gate_up not in GATE_UP_CONVENTIONS:
            raise ValueError(f"KernelWeights: gate_up={self.gate_up!r} must be one of {GATE_UP_CONVENTIONS}")
        for name, value in self.tensors.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"KernelWeights: tensors[{name!r}] must be a torch.Tensor, got {type(value).__name__}")
        object.__setattr__(self, "tensors", MappingProxyType(dict(self.tensors)))
        object.__setattr__(self, "config", MappingProxyType(dict(self.config)))

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"layout {self.layout!r} has no tensor {name!r}; it has {sorted(self.tensors)}") from None

    @property
    def E(self) -> int:
        return self.tensors["w13"].shape[0]
