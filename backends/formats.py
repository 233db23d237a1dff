"""Encode, decode, pack and block-scale the low-precision formats used by quantized MoE kernels.

Everything here is vectorised torch (no per-element Python), works on any leading dims and on CPU or
CUDA, and quantizes along the LAST dimension (the GEMM reduction dim K).

Formats and conventions
-----------------------
Element formats (sign-magnitude minifloats, no inf/NaN, subnormals when the exponent field is 0):

* E2M1 (FP4): 4-bit code = sign(bit 3) | exponent(bits 2-1, bias 1) | mantissa(bit 0).
  Codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6; codes 8..15 are the negatives (8 is -0.0).
* E3M2 (FP6): bias 3, max 28.   E2M3 (FP6): bias 1, max 7.5.  6-bit code = sign(bit 5) | low 5 bits.
* E4M3 (FP8): torch.float8_e4m3fn (max 448, has NaN); casts are done by torch (round-to-nearest-even).

Rounding onto a minifloat grid is round-to-nearest, ties-to-even (RTNE), with saturation to +-max
(the behaviour of the hardware cvt instructions). NaN elements encode as +-0; a NaN or infinite
block is instead flagged through its MX scale (code 255 = NaN), see below.

Block scales:

* MX (OCP Microscaling v1.0): one E8M0 uint8 scale per 32 consecutive elements, value 2^(e-127).
  Scale choice (OCP section 6.3): shared_exp = floor(log2(amax)) - emax_elem, clamped to [-127, 127],
  where floor(log2) is read from the float32 exponent field (as torchao's FLOOR mode does).
  - An all-zero block gets code 0 (2^-127); its elements are all 0 so they dequantize to 0.
  - A block containing NaN or +-inf gets code 255.
  - Code 255: the OCP spec defines it as NaN and ``dequantize_*`` here returns NaN for the whole
    block. (vLLM's Python reference instead computes 2^(255-127) = 2^128, i.e. +inf in fp32 for any
    non-zero element; quantizers never emit 255 for finite data, so this only matters for corrupt
    checkpoints, where NaN is the louder failure.)
* NVFP4: one FP8 E4M3 scale per 16 elements plus an fp32 global scale. ``global_scale`` here is the
  *quantization multiplier* (vLLM / flashinfer / torchao's ``1 / per_tensor_scale``):
  default 448 * 6 / amax(x), so the largest block scale lands at the top of the E4M3 range.
  A checkpoint's ``weight_scale_2`` is the *dequantization* multiplier, i.e. ``1 / global_scale``.
  Block scale s = e4m3(amax_blk * (1/6) * global_scale); elements are x * (1 / (s / global_scale))
  rounded RTNE to E2M1 (the reciprocal form of the flashinfer/vLLM cvt kernel); blocks whose scale
  underflows E4M3 to 0 store 0 (the kernels' reciprocal-of-zero guard), not torchao's min-subnormal.
  Dequantize: fp4 * float(s) / global_scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from oracle import vocabulary

__all__ = [
    "MX_BLOCK_SIZE",
    "NVFP4_BLOCK_SIZE",
    "FP8_GROUP_SIZE",
    "FP4_E2M1_MAX",
    "FP8_E4M3_MAX",
    "E8M0_BIAS",
    "E8M0_NAN_CODE",
    "FP6_KINDS",
    "ACTIVATION_SCHEMES",
    "decode_fp4",
    "encode_fp4",
    "decode_fp6",
    "encode_fp6",
    "decode_e8m0",
    "pack_fp4",
    "unpack_fp4",
    "pack_fp6",
    "unpack_fp6",
    "quantize_mxfp4",
    "dequantize_mxfp4",
    "quantize_nvfp4",
    "dequantize_nvfp4",
    "swizzle_nvfp4_scales",
    "unswizzle_nvfp4_scales",
    "quantize_mxfp6",
    "dequantize_mxfp6",
    "quantize_mxfp8",
    "dequantize_mxfp8",
    "quantize_fp8_per_token_group",
    "dequantize_fp8_per_token_group",
    "FP8_PER_TENSOR_MAX",
    "fp8_per_tensor_dynamic_scale",
    "quantize_fp8_per_tensor",
    "dequantize_fp8_per_tensor",
    "qdq_fp8_per_tensor",
    "qdq_activation",
    "e4m3_rn",
    "fp8_row_rebase_exponent",
    "rebase_rows_to_e4m3",
    "mxfp8_row_rebased",
]

MX_BLOCK_SIZE = 32
NVFP4_BLOCK_SIZE = 16
FP8_GROUP_SIZE = 128
FP4_E2M1_MAX = 6.0
FP8_E4M3_MAX = 448.0
E8M0_BIAS = 127
E8M0_NAN_CODE = 255
# Guards amax == 0 in per-token-group FP8 (same value as vLLM's per_token_group_quant_fp8): an
# all-zero group gets scale 1e-10/448 and stores zeros, instead of dividing by zero.
FP8_GROUP_AMAX_EPS = 1e-10
FP6_KINDS = ("e3m2", "e2m3")
ACTIVATION_SCHEMES = (None, *vocabulary.ACTIVATION_QDQ_SCHEMES)  # the names live in oracle.vocabulary

_NVFP4_GLOBAL_TARGET = FP8_E4M3_MAX * FP4_E2M1_MAX  # 2688: puts the largest block scale at 448


@dataclass(frozen=True)
class _MiniFloat:
    """A sign-magnitude minifloat without inf/NaN; all codes are finite."""

    name: str
    ebits: int
    mbits: int
    bias: int
    emax: int  # exponent of the largest power of two <= max value (OCP "emax_elem")

    @property
    def min_exponent(self) -> int:
        return 1 - self.bias

    @property
    def magnitude_bits(self) -> int:
        return self.ebits + self.mbits

    @property
    def max_magnitude_code(self) -> int:
        return (1 << self.magnitude_bits) - 1

    @property
    def max_value(self) -> float:
        top_exponent = (1 << self.ebits) - 1 - self.bias
        return (2.0 - 2.0 ** -self.mbits) * 2.0**top_exponent

    def code_values(self) -> list:
        """Value of every code 0 .. 2^(1+ebits+mbits)-1, built from the bit-field definition."""
        values = []
        for code in range(1 << (self.magnitude_bits + 1)):
            sign = -1.0 if code >> self.magnitude_bits else 1.0
            exponent_field = (code & self.max_magnitude_code) >> self.mbits
            mantissa = code & ((1 << self.mbits) - 1)
            if exponent_field == 0:
                magnitude = mantissa / (1 << self.mbits) * 2.0**self.min_exponent
            else:
                magnitude = (1.0 + mantissa / (1 << self.mbits)) * 2.0 ** (exponent_field - self.bias)
            values.append(sign * magnitude)
        return values


_E2M1 = _MiniFloat("e2m1", ebits=2, mbits=1, bias=1, emax=2)
_E3M2 = _MiniFloat("e3m2", ebits=3, mbits=2, bias=3, emax=4)
_E2M3 = _MiniFloat("e2m3", ebits=2, mbits=3, bias=1, emax=2)
_FP6_FORMATS = {"e3m2": _E3M2, "e2m3": _E2M3}
_E4M3_EMAX = 8  # 448 = 1.75 * 2^8

_TABLE_CACHE: dict = {}


def _value_table(fmt: _MiniFloat, device: torch.device) -> torch.Tensor:
    key = (fmt.name, str(device))
    if key not in _TABLE_CACHE:
        _TABLE_CACHE[key] = torch.tensor(fmt.code_values(), dtype=torch.float32, device=device)
    return _TABLE_CACHE[key]


def _e8m0_table(device: torch.device) -> torch.Tensor:
    key = ("e8m0", str(device))
    if key not in _TABLE_CACHE:
        values = [2.0 ** (code - E8M0_BIAS) for code in range(255)] + [float("nan")]
        _TABLE_CACHE[key] = torch.tensor(values, dtype=torch.float32, device=device)
    return _TABLE_CACHE[key]


# ----------------------------------------------------------------------------------------------
# input validation: one clear message naming the function, the argument, what was expected, the fix
# ----------------------------------------------------------------------------------------------


def _require_tensor(fn: str, name: str, value) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(value).__name__}; pass a tensor")


def _require_floating(fn: str, name: str, value) -> None:
    _require_tensor(fn, name, value)
    if not value.dtype.is_floating_point or value.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(
            f"{fn}: {name}.dtype={value.dtype} must be a floating dtype (float32, bfloat16 or float16); "
            f"convert with {name}.float()"
        )


def _require_dtype(fn: str, name: str, value, dtype: torch.dtype, fix: str) -> None:
    _require_tensor(fn, name, value)
    if value.dtype != dtype:
        raise TypeError(f"{fn}: {name}.dtype={value.dtype} must be {dtype}; {fix}")


def _require_last_dim_multiple(fn: str, name: str, value: torch.Tensor, multiple: int, why: str) -> None:
    if value.dim() == 0:
        raise ValueError(f"{fn}: {name} must have at least 1 dimension, got a 0-d tensor; reshape it to [..., K]")
    if value.shape[-1] % multiple != 0:
        raise ValueError(
            f"{fn}: {name}.shape[-1]={value.shape[-1]} must be a multiple of {multiple} ({why}); "
            f"pad K to a multiple of {multiple}"
        )


def _require_scales_match(
    fn: str, packed_name: str, packed: torch.Tensor, scales: torch.Tensor, num_blocks: int, block: int
) -> None:
    expected = tuple(packed.shape[:-1]) + (num_blocks,)
    if tuple(scales.shape) != expected:
        raise ValueError(
            f"{fn}: scales.shape={tuple(scales.shape)} must be {expected} (the leading dims of {packed_name} "
            f"and one scale per {block} elements); pass the scales that were produced with this {packed_name}"
        )


def _require_fp6_kind(fn: str, kind) -> _MiniFloat:
    if kind not in _FP6_FORMATS:
        raise ValueError(f"{fn}: kind={kind!r} must be one of {FP6_KINDS}; pick 'e3m2' or 'e2m3'")
    return _FP6_FORMATS[kind]


def _require_output_dtype(fn: str, dtype) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{fn}: dtype={dtype} must be a floating torch.dtype; pass e.g. dtype=torch.bfloat16")


# ----------------------------------------------------------------------------------------------
# element codecs
# ----------------------------------------------------------------------------------------------


def _power_of_two(exponent: torch.Tensor) -> torch.Tensor:
    """2^exponent as float32, built from the exponent bits so it is exact (normal range only)."""
    return ((exponent.to(torch.int32) + 127) << 23).view(torch.float32)


def _encode_minifloat(x: torch.Tensor, fmt: _MiniFloat) -> torch.Tensor:
    """RTNE + saturating float32 -> sign-magnitude code (uint8).

    Works per binade: the grid step inside binade e is 2^(e - mbits), so rounding |x| / step with
    torch.round (ties-to-even) is exact RTNE; the code is then (e - e_min) * 2^mbits + rounded, which
    also holds for subnormals and for a round-up that carries into the next binade.
    """
    x = x.float()
    magnitude = x.abs().nan_to_num(nan=0.0).clamp(max=fmt.max_value)
    _, frexp_exponent = torch.frexp(magnitude)
    # floor(log2|x|); subnormals and zero (frexp gives exponent 0 for it) share the subnormal binade e_min
    binade = torch.where(magnitude > 0, frexp_exponent - 1, fmt.min_exponent).clamp(min=fmt.min_exponent)
    step = _power_of_two(binade - fmt.mbits)
    rounded = torch.round(magnitude / step).to(torch.int32)
    code = ((binade - fmt.min_exponent) << fmt.mbits) + rounded
    code = code.clamp(max=fmt.max_magnitude_code)
    code = code | (torch.signbit(x).to(torch.int32) << fmt.magnitude_bits)
    return code.to(torch.uint8)


def _decode_minifloat(codes: torch.Tensor, fmt: _MiniFloat) -> torch.Tensor:
    return _value_table(fmt, codes.device)[codes.long()]


def decode_fp4(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, one code per byte, 0..15) -> float32 values."""
    _require_dtype("decode_fp4", "codes", codes, torch.uint8, "pass unpacked codes (see unpack_fp4)")
    return _decode_minifloat(codes & 0xF, _E2M1)


def encode_fp4(x: torch.Tensor) -> torch.Tensor:
    """Float values -> E2M1 codes (uint8, one per byte), RTNE with saturation to +-6."""
    _require_floating("encode_fp4", "x", x)
    return _encode_minifloat(x, _E2M1)


def decode_fp6(codes: torch.Tensor, *, kind: str) -> torch.Tensor:
    """FP6 codes (uint8, one per byte, 0..63) of the given kind ('e3m2' or 'e2m3') -> float32."""
    fmt = _require_fp6_kind("decode_fp6", kind)
    _require_dtype("decode_fp6", "codes", codes, torch.uint8, "pass unpacked codes (see unpack_fp6)")
    return _decode_minifloat(codes & 0x3F, fmt)


def encode_fp6(x: torch.Tensor, *, kind: str) -> torch.Tensor:
    """Float values -> FP6 codes (uint8, one per byte), RTNE with saturation to +-max of the kind."""
    fmt = _require_fp6_kind("encode_fp6", kind)
    _require_floating("encode_fp6", "x", x)
    return _encode_minifloat(x, fmt)


def decode_e8m0(scales: torch.Tensor) -> torch.Tensor:
    """E8M0 scale codes (uint8) -> float32 2^(code-127); code 255 -> NaN (OCP MX v1.0)."""
    _require_dtype("decode_e8m0", "scales", scales, torch.uint8, "view E8M0 scales as uint8 (scales.view(torch.uint8))")
    return _e8m0_table(scales.device)[scales.long()]


# ----------------------------------------------------------------------------------------------
# packing
# ----------------------------------------------------------------------------------------------


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] uint8 codes (0..15) -> [..., K/2] bytes; element 2j in the low nibble, 2j+1 in the high."""
    _require_dtype("pack_fp4", "codes", codes, torch.uint8, "encode values first with encode_fp4")
    _require_last_dim_multiple("pack_fp4", "codes", codes, 2, "two FP4 codes per byte")
    if codes.numel() and bool((codes > 0xF).any()):
        raise ValueError("pack_fp4: codes must be 4-bit values 0..15; mask with codes & 0xF or use encode_fp4")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes -> [..., K] uint8 codes (inverse of pack_fp4)."""
    _require_dtype("unpack_fp4", "packed", packed, torch.uint8,
                   "view packed FP4 data as uint8 (packed.view(torch.uint8))")
    if packed.dim() == 0:
        raise ValueError("unpack_fp4: packed must have at least 1 dimension; reshape it to [..., K/2]")
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1)
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def pack_fp6(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] uint8 codes (0..63) -> [..., 3K/4] bytes.

    Four codes form W = v0 | v1<<6 | v2<<12 | v3<<18, stored little-endian as [W&0xFF, W>>8&0xFF, W>>16].
    """
    _require_dtype("pack_fp6", "codes", codes, torch.uint8, "encode values first with encode_fp6")
    _require_last_dim_multiple("pack_fp6", "codes", codes, 4, "four FP6 codes per 3 bytes")
    if codes.numel() and bool((codes > 0x3F).any()):
        raise ValueError("pack_fp6: codes must be 6-bit values 0..63; mask with codes & 0x3F or use encode_fp6")
    groups = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 4, 4).to(torch.int32)
    word = groups[..., 0] | (groups[..., 1] << 6) | (groups[..., 2] << 12) | (groups[..., 3] << 18)
    packed = torch.stack((word & 0xFF, (word >> 8) & 0xFF, (word >> 16) & 0xFF), dim=-1).to(torch.uint8)
    return packed.reshape(*codes.shape[:-1], codes.shape[-1] // 4 * 3)


def unpack_fp6(packed: torch.Tensor) -> torch.Tensor:
    """[..., 3K/4] bytes -> [..., K] uint8 codes (inverse of pack_fp6)."""
    _require_dtype("unpack_fp6", "packed", packed, torch.uint8,
                   "view packed FP6 data as uint8 (packed.view(torch.uint8))")
    _require_last_dim_multiple("unpack_fp6", "packed", packed, 3, "four FP6 codes per 3 bytes")
    triples = packed.reshape(*packed.shape[:-1], packed.shape[-1] // 3, 3).to(torch.int32)
    word = triples[..., 0] | (triples[..., 1] << 8) | (triples[..., 2] << 16)
    codes = torch.stack([(word >> shift) & 0x3F for shift in (0, 6, 12, 18)], dim=-1).to(torch.uint8)
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] // 3 * 4)


# ----------------------------------------------------------------------------------------------
# MX (E8M0 per 32) block scaling, shared by MXFP4 / MXFP6 / MXFP8
# ----------------------------------------------------------------------------------------------


def _mx_scale_and_divide(x: torch.Tensor, element_emax: int):
    """Return (x / 2^shared_exp as float32 [..., K], E8M0 codes uint8 [..., K/32]) per OCP 6.3."""
    blocks = x.float().reshape(*x.shape[:-1], x.shape[-1] // MX_BLOCK_SIZE, MX_BLOCK_SIZE)
    amax = blocks.abs().amax(dim=-1)
    floor_log2 = ((amax.view(torch.int32) >> 23) & 0xFF) - 127  # exponent field; 0 and subnormals -> -127
    shared_exp = (floor_log2 - element_emax).clamp(min=-E8M0_BIAS, max=E8M0_BIAS)
    codes = (shared_exp + E8M0_BIAS).to(torch.uint8)
    codes = torch.where(torch.isfinite(amax), codes, torch.full_like(codes, E8M0_NAN_CODE))
    scaled = blocks / _e8m0_table(x.device)[codes.long()].unsqueeze(-1)  # power-of-two division: exact
    return scaled.reshape(x.shape), codes


def _mx_apply_scales(values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    blocks = values.reshape(*values.shape[:-1], values.shape[-1] // MX_BLOCK_SIZE, MX_BLOCK_SIZE)
    out = blocks * decode_e8m0(scales).unsqueeze(-1)
    return out.reshape(values.shape).to(dtype)


_MX_WHY = "the MX block size"


def quantize_mxfp4(x: torch.Tensor):
    """x [..., K] float -> (packed uint8 [..., K/2], E8M0 scales uint8 [..., K/32])."""
    fn = "quantize_mxfp4"
    _require_floating(fn, "x", x)
    _require_last_dim_multiple(fn, "x", x, MX_BLOCK_SIZE, _MX_WHY)
    scaled, scales = _mx_scale_and_divide(x, _E2M1.emax)
    return pack_fp4(_encode_minifloat(scaled, _E2M1)), scales


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor, *, dtype: torch.dtype = torch.float32):
    """(packed [..., K/2], E8M0 scales [..., K/32]) -> values [..., K] in dtype."""
    fn = "dequantize_mxfp4"
    _require_dtype(fn, "packed", packed, torch.uint8, "view packed FP4 data as uint8 (packed.view(torch.uint8))")
    _require_dtype(fn, "scales", scales, torch.uint8, "view E8M0 scales as uint8 (scales.view(torch.uint8))")
    _require_output_dtype(fn, dtype)
    _require_last_dim_multiple(fn, "packed", packed, MX_BLOCK_SIZE // 2, "16 bytes hold one 32-element MX block")
    _require_scales_match(fn, "packed", packed, scales, packed.shape[-1] * 2 // MX_BLOCK_SIZE, MX_BLOCK_SIZE)
    return _mx_apply_scales(_decode_minifloat(unpack_fp4(packed), _E2M1), scales, dtype)


def quantize_mxfp6(x: torch.Tensor, *, kind: str = "e3m2"):
    """x [..., K] float -> (packed uint8 [..., 3K/4], E8M0 scales uint8 [..., K/32])."""
    fn = "quantize_mxfp6"
    fmt = _require_fp6_kind(fn, kind)
    _require_floating(fn, "x", x)
    _require_last_dim_multiple(fn, "x", x, MX_BLOCK_SIZE, _MX_WHY)
    scaled, scales = _mx_scale_and_divide(x, fmt.emax)
    return pack_fp6(_encode_minifloat(scaled, fmt)), scales


def dequantize_mxfp6(
    packed: torch.Tensor, scales: torch.Tensor, *, kind: str = "e3m2", dtype: torch.dtype = torch.float32
):
    """(packed [..., 3K/4], E8M0 scales [..., K/32]) -> values [..., K] in dtype."""
    fn = "dequantize_mxfp6"
    fmt = _require_fp6_kind(fn, kind)
    _require_dtype(fn, "packed", packed, torch.uint8, "view packed FP6 data as uint8 (packed.view(torch.uint8))")
    _require_dtype(fn, "scales", scales, torch.uint8, "view E8M0 scales as uint8 (scales.view(torch.uint8))")
    _require_output_dtype(fn, dtype)
    _require_last_dim_multiple(fn, "packed", packed, 24, "24 bytes hold one 32-element MX block of FP6")
    _require_scales_match(fn, "packed", packed, scales, packed.shape[-1] // 24, MX_BLOCK_SIZE)
    return _mx_apply_scales(_decode_minifloat(unpack_fp6(packed), fmt), scales, dtype)


def quantize_mxfp8(x: torch.Tensor):
    """x [..., K] float -> (float8_e4m3fn data [..., K], E8M0 scales uint8 [..., K/32]); saturates to +-448."""
    fn = "quantize_mxfp8"
    _require_floating(fn, "x", x)
    _require_last_dim_multiple(fn, "x", x, MX_BLOCK_SIZE, _MX_WHY)
    scaled, scales = _mx_scale_and_divide(x, _E4M3_EMAX)
    return scaled.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn), scales


def dequantize_mxfp8(data: torch.Tensor, scales: torch.Tensor, *, dtype: torch.dtype = torch.float32):
    """(float8_e4m3fn data [..., K], E8M0 scales [..., K/32]) -> values [..., K] in dtype."""
    fn = "dequantize_mxfp8"
    _require_dtype(fn, "data", data, torch.float8_e4m3fn, "pass the tensor returned by quantize_mxfp8")
    _require_dtype(fn, "scales", scales, torch.uint8, "view E8M0 scales as uint8 (scales.view(torch.uint8))")
    _require_output_dtype(fn, dtype)
    _require_last_dim_multiple(fn, "data", data, MX_BLOCK_SIZE, _MX_WHY)
    _require_scales_match(fn, "data", data, scales, data.shape[-1] // MX_BLOCK_SIZE, MX_BLOCK_SIZE)
    return _mx_apply_scales(data.float(), scales, dtype)


# ----------------------------------------------------------------------------------------------
# NVFP4 (E4M3 per 16 + fp32 global scale)
# ----------------------------------------------------------------------------------------------


def _global_scale_for_blocks(fn: str, global_scale, lead_shape: Sequence[int], device) -> torch.Tensor:
    """Turn a float / 0-d / prefix-shaped tensor into float32 broadcastable against [*lead, blocks]."""
    if isinstance(global_scale, (int, float)):
        global_scale = torch.tensor(float(global_scale), dtype=torch.float32, device=device)
    _require_floating(fn, "global_scale", global_scale)
    prefix = tuple(lead_shape[: global_scale.dim()])
    if tuple(global_scale.shape) != prefix:
        raise ValueError(
            f"{fn}: global_scale.shape={tuple(global_scale.shape)} must be () or a prefix of the leading dims "
            f"{tuple(lead_shape)} (e.g. [E] for per-expert weights [E, N, K]); pass one scale per tensor or per expert"
        )
    trailing = len(lead_shape) + 1 - global_scale.dim()  # the remaining leading dims plus the block dim
    return global_scale.to(device=device, dtype=torch.float32).reshape(*global_scale.shape, *([1] * trailing))


def quantize_nvfp4(x: torch.Tensor, global_scale: Optional[Union[float, torch.Tensor]] = None):
    """x [..., K] float -> (packed uint8 [..., K/2], scales float8_e4m3fn [..., K/16], global_scale fp32).

    global_scale is the quantization multiplier (default 448*6/amax(x), or 1.0 when x is all zero);
    it may be a float, a 0-d tensor, or a tensor shaped like a prefix of x's leading dims (per expert).
    """
    fn = "quantize_nvfp4"
    _require_floating(fn, "x", x)
    _require_last_dim_multiple(fn, "x", x, NVFP4_BLOCK_SIZE, "the NVFP4 block size")
    lead_shape = tuple(x.shape[:-1])
    blocks = x.float().reshape(*lead_shape, x.shape[-1] // NVFP4_BLOCK_SIZE, NVFP4_BLOCK_SIZE)
    if global_scale is None:
        amax = x.float().abs().amax() if x.numel() else torch.zeros((), device=x.device)
        global_scale = torch.where(amax > 0, _NVFP4_GLOBAL_TARGET / amax, torch.ones_like(amax))
    gs = _global_scale_for_blocks(fn, global_scale, lead_shape, x.device)
    block_amax = blocks.abs().amax(dim=-1)
    scales = (block_amax * (1.0 / FP4_E2M1_MAX) * gs).clamp(max=FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    scales_f32 = scales.float()
    reciprocal = torch.where(scales_f32 > 0, 1.0 / (scales_f32 * (1.0 / gs)), torch.zeros_like(scales_f32))
    scaled = (blocks * reciprocal.unsqueeze(-1)).reshape(x.shape)
    out_gs = global_scale if isinstance(global_scale, torch.Tensor) else torch.tensor(float(global_scale))
    return pack_fp4(_encode_minifloat(scaled, _E2M1)), scales, out_gs.to(device=x.device, dtype=torch.float32)


def dequantize_nvfp4(
    packed: torch.Tensor,
    scales: torch.Tensor,
    global_scale: Union[float, torch.Tensor],
    *,
    dtype: torch.dtype = torch.float32,
):
    """(packed [..., K/2], e4m3 scales [..., K/16], global_scale) -> fp4 * scale / global_scale [..., K]."""
    fn = "dequantize_nvfp4"
    _require_dtype(fn, "packed", packed, torch.uint8, "view packed FP4 data as uint8 (packed.view(torch.uint8))")
    _require_dtype(fn, "scales", scales, torch.float8_e4m3fn,
                   "NVFP4 block scales are FP8; view them with .view(torch.float8_e4m3fn)")
    _require_output_dtype(fn, dtype)
    _require_last_dim_multiple(fn, "packed", packed, NVFP4_BLOCK_SIZE // 2, "8 bytes hold one 16-element NVFP4 block")
    _require_scales_match(fn, "packed", packed, scales, packed.shape[-1] * 2 // NVFP4_BLOCK_SIZE, NVFP4_BLOCK_SIZE)
    lead_shape = tuple(packed.shape[:-1])
    gs = _global_scale_for_blocks(fn, global_scale, lead_shape, packed.device)
    values = _decode_minifloat(unpack_fp4(packed), _E2M1)
    blocks = values.reshape(*lead_shape, scales.shape[-1], NVFP4_BLOCK_SIZE)
    out = blocks * scales.float().unsqueeze(-1) / gs.unsqueeze(-1)
    return out.reshape(values.shape).to(dtype)


def swizzle_nvfp4_scales(scales: torch.Tensor) -> torch.Tensor:
    """[M, K/16] block scales -> flat 128x4-tiled layout that cuBLAS/CUTLASS block-scaled GEMMs read.

    Pads rows to a multiple of 128 and columns to a multiple of 4 with zeros; inside each 128x4 tile,
    element (r, c) lands at offset (r % 32) * 16 + (r // 32) * 4 + c; tiles are row-block major.
    """
    fn = "swizzle_nvfp4_scales"
    _require_tensor(fn, "scales", scales)
    if scales.dim() != 2:
        raise ValueError(
            f"{fn}: scales must be 2-D [M, K/16], got shape {tuple(scales.shape)}; reshape leading dims into M first"
        )
    rows, cols = scales.shape
    padded_rows = -(-rows // 128) * 128
    padded_cols = -(-cols // 4) * 4
    padded = scales.new_zeros((padded_rows, padded_cols))
    padded[:rows, :cols] = scales
    tiles = padded.reshape(padded_rows // 128, 4, 32, padded_cols // 4, 4)
    return tiles.permute(0, 3, 2, 1, 4).reshape(-1)


def unswizzle_nvfp4_scales(swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Exact inverse of swizzle_nvfp4_scales: flat tiled scales -> [rows, cols] (padding dropped)."""
    fn = "unswizzle_nvfp4_scales"
    _require_tensor(fn, "swizzled", swizzled)
    padded_rows = -(-rows // 128) * 128
    padded_cols = -(-cols // 4) * 4
    if swizzled.numel() != padded_rows * padded_cols:
        raise ValueError(
            f"{fn}: swizzled has {swizzled.numel()} elements but rows={rows}, cols={cols} need "
            f"{padded_rows * padded_cols} (padded to {padded_rows}x{padded_cols}); pass the original rows and cols"
        )
    tiles = swizzled.reshape(padded_rows // 128, padded_cols // 4, 32, 4, 4)
    padded = tiles.permute(0, 3, 2, 1, 4).reshape(padded_rows, padded_cols)
    return padded[:rows, :cols].contiguous()


# ----------------------------------------------------------------------------------------------
# FP8 E4M3 per-token-group dynamic activation quantization (DeepGEMM's kFp8Dynamic128Sym)
# ----------------------------------------------------------------------------------------------


def quantize_fp8_per_token_group(x: torch.Tensor, group_size: int = FP8_GROUP_SIZE):
    """x [..., K] float -> (float8_e4m3fn [..., K], fp32 scales [..., K/group_size]); scale = amax/448."""
    fn = "quantize_fp8_per_token_group"
    _require_floating(fn, "x", x)
    if not isinstance(group_size, int) or group_size <= 0:
        raise ValueError(f"{fn}: group_size={group_size!r} must be a positive int; DeepGEMM uses 128")
    _require_last_dim_multiple(fn, "x", x, group_size, f"group_size={group_size}")
    groups = x.float().reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)
    scales = groups.abs().amax(dim=-1).clamp(min=FP8_GROUP_AMAX_EPS) / FP8_E4M3_MAX
    data = (groups / scales.unsqueeze(-1)).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return data.reshape(x.shape), scales


def dequantize_fp8_per_token_group(
    data: torch.Tensor, scales: torch.Tensor, *, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """(float8_e4m3fn [..., K], fp32 scales [..., K/G]) -> values [..., K]; G is inferred from the shapes."""
    fn = "dequantize_fp8_per_token_group"
    _require_dtype(fn, "data", data, torch.float8_e4m3fn, "pass the tensor returned by quantize_fp8_per_token_group")
    _require_dtype(fn, "scales", scales, torch.float32, "per-token-group scales are fp32; convert with scales.float()")
    _require_output_dtype(fn, dtype)
    if data.dim() == 0 or scales.dim() != data.dim() or tuple(scales.shape[:-1]) != tuple(data.shape[:-1]) or (
        scales.shape[-1] == 0 or data.shape[-1] % scales.shape[-1] != 0
    ):
        raise ValueError(
            f"{fn}: scales.shape={tuple(scales.shape)} must be data.shape[:-1] + (K/group_size,) with "
            f"data.shape={tuple(data.shape)}; pass the scales produced with this data"
        )
    group_size = data.shape[-1] // scales.shape[-1]
    groups = data.float().reshape(*data.shape[:-1], scales.shape[-1], group_size)
    return (groups * scales.unsqueeze(-1)).reshape(data.shape).to(dtype)


# ----------------------------------------------------------------------------------------------
# FP8 E4M3 per-tensor activation quantization (vLLM's scaled_fp8_quant, static or dynamic)
# ----------------------------------------------------------------------------------------------

#: FP8 dtype -> the saturation bound vLLM's per-tensor kernels clamp to (quant_type_max_v): 448 for
#: e4m3fn; 224 (code 0x7E), not torch's 240, for the e4m3fnuz of ROCm MI300 ("accuracy issues" at 240).
FP8_PER_TENSOR_MAX = {torch.float8_e4m3fn: FP8_E4M3_MAX, torch.float8_e4m3fnuz: 224.0}


def _require_fp8_dtype(fn: str, fp8_dtype) -> float:
    if fp8_dtype not in FP8_PER_TENSOR_MAX:
        raise ValueError(f"{fn}: fp8_dtype={fp8_dtype!r} must be torch.float8_e4m3fn or torch.float8_e4m3fnuz "
                         f"(the platform's FP8, vLLM current_platform.fp8_dtype())")
    return FP8_PER_TENSOR_MAX[fp8_dtype]


def _require_tensor_scale(fn: str, scale) -> torch.Tensor:
    _require_tensor(fn, "scale", scale)
    if scale.numel() != 1 or not scale.dtype.is_floating_point:
        raise ValueError(f"{fn}: scale must be one floating value (per tensor), got {scale.dtype} of shape "
                         f"{tuple(scale.shape)}; reduce per-expert input scales with .max() first")
    return scale.float().reshape(1)


def fp8_per_tensor_dynamic_scale(x: torch.Tensor, *, fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """fp32 [1] scale = amax(|x|) / fp8 max (vLLM's dynamic_scaled_fp8_quant: no lower clamp, NaN ignored).

    All-zero x gives scale 0 (quantize_fp8_per_tensor then stores +max codes that dequantize to 0, as the
    kernel does). vLLM's torch-native QuantFP8 clamps the scale to >= 1/(448*512); its CUDA per-tensor
    kernel, the one the MoE emulation calls, does not."""
    fn = "fp8_per_tensor_dynamic_scale"
    _require_floating(fn, "x", x)
    fp8_max = _require_fp8_dtype(fn, fp8_dtype)
    magnitude = x.float().abs()
    amax = torch.where(torch.isnan(magnitude), 0.0, magnitude).amax() if x.numel() else magnitude.new_zeros(())
    return (amax / fp8_max).reshape(1)


def quantize_fp8_per_tensor(x: torch.Tensor, scale: Optional[torch.Tensor] = None, *,
                            fp8_dtype: torch.dtype = torch.float8_e4m3fn):
    """x [...] float -> (fp8 data [...], fp32 scale [1]); static with `scale`, dynamic (amax/max) without.

    vLLM's scaled_fp8_quant(x, scale, use_per_token_if_dynamic=False): code = fp8(clamp(x * (1/scale), +-max))
    in fp32, rounded to nearest even; the comparisons are fminf/fmaxf, so a NaN product (0 * inf for
    scale 0) saturates to +max."""
    fn = "quantize_fp8_per_tensor"
    _require_floating(fn, "x", x)
    fp8_max = _require_fp8_dtype(fn, fp8_dtype)
    scale = fp8_per_tensor_dynamic_scale(x, fp8_dtype=fp8_dtype) if scale is None else _require_tensor_scale(fn, scale)
    scaled = x.float() * (1.0 / scale)
    scaled = torch.where(torch.isnan(scaled), fp8_max, scaled.clamp(-fp8_max, fp8_max))
    return scaled.to(fp8_dtype), scale


def dequantize_fp8_per_tensor(data: torch.Tensor, scale: torch.Tensor, *, dtype: torch.dtype = torch.float32):
    """(fp8 data, fp32 scale [1]) -> data * scale in fp32, then dtype (vLLM's per_tensor_dequantize: the fp8
    code goes through fp16 exactly and the product is fp32)."""
    fn = "dequantize_fp8_per_tensor"
    _require_tensor(fn, "data", data)
    if data.dtype not in FP8_PER_TENSOR_MAX:
        raise TypeError(f"{fn}: data.dtype={data.dtype} must be float8_e4m3fn or float8_e4m3fnuz; pass the tensor "
                        f"returned by quantize_fp8_per_tensor")
    _require_output_dtype(fn, dtype)
    return (data.float() * _require_tensor_scale(fn, scale)).to(dtype)


def qdq_fp8_per_tensor(x: torch.Tensor, scale: Optional[torch.Tensor] = None, *,
                       fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """Quantize x to FP8 with one scale (given: static; None: dynamic from this x) and back, in x.dtype."""
    return dequantize_fp8_per_tensor(*quantize_fp8_per_tensor(x, scale, fp8_dtype=fp8_dtype), dtype=x.dtype)


# ----------------------------------------------------------------------------------------------
# activation fake-quantization
# ----------------------------------------------------------------------------------------------


def qdq_activation(x: torch.Tensor, scheme: Optional[str]) -> torch.Tensor:
    """Quantize then dequantize x along its last dim (same shape and dtype), to emulate low-precision GEMM inputs.

    Schemes: None (identity), "mxfp4", "mxfp6_e3m2", "mxfp6_e2m3", "nvfp4" (dynamic per-tensor global
    scale from this x), and "fp8", which is MXFP8 E4M3 with E8M0 per 32 (as vLLM's OCP-MX emulation
    does for fp8 activations), not per-tensor FP8.
    """
    fn = "qdq_activation"
    if scheme not in ACTIVATION_SCHEMES:
        raise ValueError(f"{fn}: scheme={scheme!r} must be one of {ACTIVATION_SCHEMES}; pick a supported scheme")
    _require_floating(fn, "x", x)
    if scheme is None:
        return x
    if scheme == "mxfp4":
        return dequantize_mxfp4(*quantize_mxfp4(x), dtype=x.dtype)
    if scheme in ("mxfp6_e3m2", "mxfp6_e2m3"):
        kind = scheme.split("_")[1]
        return dequantize_mxfp6(*quantize_mxfp6(x, kind=kind), kind=kind, dtype=x.dtype)
    if scheme == "fp8":
        return dequantize_mxfp8(*quantize_mxfp8(x), dtype=x.dtype)
    packed, scales, global_scale = quantize_nvfp4(x)
    return dequantize_nvfp4(packed, scales, global_scale, dtype=x.dtype)


# ----------------------------------------------------------------------------------------------
# W4A8: FP4 weights and FP8 activations as FP8 tensor-core operands, one power of two per row
# ----------------------------------------------------------------------------------------------


def e4m3_rn(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest FP8 E4M3 value (ties to even, subnormals kept), saturated at +-448, as float32."""
    return x.float().clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).float()


def fp8_row_rebase_exponent(amax: torch.Tensor) -> torch.Tensor:
    """r = ceil(log2(amax / 448)) as int32, exactly: the smallest r with amax <= 448 * 2^r (0 where amax == 0).

    With amax = m * 2^e (frexp, m in [0.5, 1)) and 448 = 0.875 * 2^9: r = e - 9 if m <= 0.875, else e - 8.
    A row multiplied by 2^-r then fits E4M3 without saturating, its largest value in (224, 448]."""
    mantissa, exponent = torch.frexp(amax.float())
    r = torch.where(mantissa <= 0.875, exponent - 9, exponent - 8)
    return torch.where(amax > 0, r, torch.zeros_like(r)).to(torch.int32)


def rebase_rows_to_e4m3(w: torch.Tensor):
    """w [..., K] float -> (w8 = e4m3_rn(w * 2^-r) as float32 [..., K], r int32 [...]), r per row (last dim).

    The W4A8 weight operand (backends.triton_moe, act_quant): w8 * 2^r is the weight the FP8 tensor cores
    multiply. Exact for MXFP4 rows whose nonzero blocks' exponents lie within 14 binades of the row's largest
    (every value times 2^-r is then a multiple of E4M3's smallest subnormal 2^-9, with at most 2 significant bits);
    NVFP4's fp4 x E4M3 products (up to 5 significant bits) are rounded to E4M3's 4."""
    r = fp8_row_rebase_exponent(w.float().abs().amax(dim=-1))
    return e4m3_rn(torch.ldexp(w.float(), -r.unsqueeze(-1).float())), r


def mxfp8_row_rebased(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] -> float32 values of the W4A8 'mxfp8' activation operand: MXFP8 (quantize_mxfp8: E4M3 elements,
    E8M0 per 32 along K), then one power of two per row, ra = the row's largest block exponent, and
    e4m3_rn(x_mx * 2^-ra) * 2^ra (exact unless a value falls below E4M3's normal range after the shift)."""
    data, scales = quantize_mxfp8(x)
    exps = scales.to(torch.int32) - E8M0_BIAS
    ra = exps.amax(dim=-1, keepdim=True) if exps.numel() else exps
    shift = (exps - ra).repeat_interleave(MX_BLOCK_SIZE, dim=-1).float()
    return torch.ldexp(e4m3_rn(torch.ldexp(data.float(), shift)), ra.float())
