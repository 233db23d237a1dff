"""The W4A8 weight layout (backends.layouts.triton_moe: w4a8_row_data, w4a8_lut_codes, w4a8_lut_table,
decode_w4a8): the E4M3 operand the kernels decode with two byte lookups per 8 weights is formats.rebase_rows_to_e4m3
of the kernel rows, bit for bit (signed zeros and NaN included); the codes, the table and the word bits as the kernels
read them (written here from the layout's documentation, not by calling its helpers). CPU only, fast."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from random_weights import random_moe_weights

from backends import formats
from backends.layouts.triton_moe import (
    TILE_BYTES,
    TILE_ROWS,
    W4A8_LUT_NAN,
    W4A8_LUT_ZERO,
    W4A8_TENSORS,
    converter,
    converter_w4a8,
    decode_w4a8,
    given_w4a8_tensors,
    to_kernel_layout,
    triton_weights,
    w4a8_lut_codes,
    w4a8_lut_table,
    w4a8_row_data,
    w4a8_tensor_specs,
)

from layout_cases import random_layer

FORMATS = ("mxfp4", "nvfp4")
MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # E2M1 by 3-bit magnitude code


def _bits(x: torch.Tensor) -> torch.Tensor:
    """float32 bit patterns with every NaN made one pattern: equal bits = equal values, signed zeros included."""
    return torch.where(torch.isnan(x), float("nan"), x).view(torch.int32)


def _dequantize(fmt, packed, scale):
    if fmt == "mxfp4":
        return formats.dequantize_mxfp4(packed, scale)
    return formats.dequantize_nvfp4(packed, scale.view(torch.float8_e4m3fn), 1.0)


def _deinterleave(t: torch.Tensor) -> torch.Tensor:
    """gpt-oss rows (g0, u0, g1, u1, ...) -> the kernels' [gate; up]."""
    return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1)


def _with_edge_cases(fmt: str, packed: torch.Tensor, scale: torch.Tensor, g: torch.Generator):
    """A quantized tensor's copies with, in random blocks: all-zero and all-negative-zero codes, scales far below
    the row's largest (MXFP4: 10 to 25 binades, across E4M3's subnormals and the LUT's zero code), NVFP4 subnormal,
    zero and -0 scales. Every other block keeps its random codes (both signs in both halves of each 32-chunk)."""
    packed, scale = packed.clone(), scale.view(torch.uint8).clone()
    experts, rows, blocks = scale.shape
    block_bytes = packed.shape[-1] // blocks
    pick = torch.randint(0, 12, (experts, rows, blocks), generator=g)
    as_bytes = packed.reshape(experts, rows, blocks, block_bytes)
    as_bytes[pick == 0] = 0x00  # +0 codes
    as_bytes[pick == 1] = 0x88  # -0 codes
    if fmt == "mxfp4":
        top = scale.amax(dim=-1, keepdim=True).to(torch.int64)
        far = top - torch.tensor([10, 15, 17, 18, 19, 20, 25])[torch.randint(0, 7, scale.shape, generator=g)]
        scale = torch.where(pick == 2, far.clamp(min=0).to(torch.uint8), scale)
    else:
        tiny = torch.tensor([0x00, 0x80, 0x01, 0x02, 0x03, 0x05, 0x07, 0x08, 0x0F, 0x18], dtype=torch.uint8)
        scale = torch.where(pick == 2, tiny[torch.randint(0, len(tiny), scale.shape, generator=g)], scale)
    return packed, scale if fmt == "mxfp4" else scale.view(torch.float8_e4m3fn)


def _edge_case_layer(fmt: str, seed: int = 0):
    w = random_moe_weights(fmt, "interleaved", experts=3, hidden=128, inter=128, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    w13, s13 = _with_edge_cases(fmt, w.w13, w.w13_scale, g)
    w2, s2 = _with_edge_cases(fmt, w.w2, w.w2_scale, g)
    return dataclasses.replace(w, w13=w13, w13_scale=s13, w2=w2, w2_scale=s2)


def _decoded(kernel, name: str) -> torch.Tensor:
    k = kernel.hidden_size if name == "w13" else kernel.intermediate_size
    return decode_w4a8(getattr(kernel, f"{name}_fp8"), getattr(kernel, f"{name}_lut_code"),
                       w4a8_lut_table("cpu"), kernel.format, k)


# --------------------------------------------------------------------------------------------
# The decoded operand is the formats' rebase of each kernel row, bit for bit
# --------------------------------------------------------------------------------------------

def _with_row_data(w):
    """The kernel weights with the W4A8 row data that FP8 dots read (moe_forward computes it when they are
    forced)."""
    kernel = triton_weights(converter.convert(w))
    return dataclasses.replace(kernel, **w4a8_row_data(kernel))


@pytest.mark.parametrize("fmt", FORMATS)
def test_decoded_operand_is_the_rebase_of_each_kernel_row_bit_for_bit(fmt):
    w = _edge_case_layer(fmt)
    kernel = _with_row_data(w)
    for name, packed, scale in (("w13", _deinterleave(w.w13), _deinterleave(w.w13_scale)),
                                ("w2", w.w2, w.w2_scale)):
        want, r = formats.rebase_rows_to_e4m3(_dequantize(fmt, packed, scale))
        got = _decoded(kernel, name)
        assert torch.equal(getattr(kernel, f"{name}_row_exp"), r), name
        assert torch.equal(_bits(got), _bits(want)), (name, int((_bits(got) != _bits(want)).sum()))
        # the data reaches every case the layout must get right, in both halves (A, B) of the 32-chunks
        half_b = (torch.arange(want.shape[-1]) % 32 >= 16).expand_as(want)
        for half in (~half_b, half_b):
            assert bool((want[half] < 0).any()) and bool((want[half] > 0).any()), name
            assert bool((torch.signbit(want) & (want == 0))[half].any()), f"{name}: no -0 in a half"
        dequant = _dequantize(fmt, packed, scale)
        assert bool(((dequant != 0) & (want == 0)).any()), f"{name}: no value rounds to 0 in E4M3"
        assert bool(((want != 0) & (want.abs() < 2.0**-6)).any()), f"{name}: no E4M3 subnormal"


def test_nvfp4_subnormal_zero_and_negative_scales_decode_exactly():
    """Negative block scales (a checkpoint's, never the quantizer's) flip their block's signs, -0 included."""
    g = torch.Generator().manual_seed(7)
    experts, rows, hidden, inter = 2, 128, 128, 64
    scale_bytes = {}
    for name, (n, k) in {"w13": (rows, hidden), "w2": (hidden, inter)}.items():
        raw = torch.randint(0, 0x7F, (experts, n, k // 16), generator=g, dtype=torch.uint8)
        raw[..., 0] = torch.randint(0, 8, (experts, n), generator=g, dtype=torch.uint8)  # zero and subnormal
        raw[..., 1] |= 0x80  # negative (and -0)
        scale_bytes[name] = raw.view(torch.float8_e4m3fn)
    args = {"format": "nvfp4", "gate_up_layout": "contiguous",
            "w13": torch.randint(0, 256, (experts, rows, hidden // 2), generator=g, dtype=torch.uint8),
            "w2": torch.randint(0, 256, (experts, hidden, inter // 2), generator=g, dtype=torch.uint8),
            "w13_scale": scale_bytes["w13"], "w2_scale": scale_bytes["w2"],
            "w13_global_scale": torch.ones(experts), "w2_global_scale": torch.ones(experts)}
    kernel = to_kernel_layout(**args)
    kernel = dataclasses.replace(kernel, **w4a8_row_data(kernel))
    for name in ("w13", "w2"):
        want, _ = formats.rebase_rows_to_e4m3(_dequantize("nvfp4", args[name], args[f"{name}_scale"]))
        assert torch.equal(_bits(_decoded(kernel, name)), _bits(want)), name


@pytest.mark.parametrize(("fmt", "nan_byte"), [("mxfp4", 0xFF), ("nvfp4", 0x7F), ("nvfp4", 0xFF)])
def test_a_nan_block_scale_gives_nan_values_in_its_block_only(fmt, nan_byte):
    experts, rows, k = 1, 128, 128  # w13 [E, 2I, H] with H = I * 2 = 128: w2 is w13's first half of K
    block = 32 if fmt == "mxfp4" else 16
    g = torch.Generator().manual_seed(8)
    packed = torch.randint(0, 256, (experts, rows, k // 2), generator=g, dtype=torch.uint8)
    scale = (torch.randint(120, 125, (experts, rows, k // block), generator=g) if fmt == "mxfp4"
             else torch.randint(0x30, 0x50, (experts, rows, k // block), generator=g)).to(torch.uint8)
    scale[0, 5, 1] = nan_byte
    dtype = torch.uint8 if fmt == "mxfp4" else torch.float8_e4m3fn
    args = {"format": fmt, "gate_up_layout": "contiguous", "w13": packed, "w13_scale": scale.view(dtype),
            "w2": packed[:, :, :32].clone(), "w2_scale": scale[:, :, :64 // block].clone().view(dtype)}
    if fmt == "nvfp4":
        args.update(w13_global_scale=torch.ones(experts), w2_global_scale=torch.ones(experts))
    kernel = to_kernel_layout(**args)
    kernel = dataclasses.replace(kernel, **w4a8_row_data(kernel))
    got = _decoded(kernel, "w13")
    nan = torch.zeros_like(got, dtype=torch.bool)
    nan[0, 5, block:2 * block] = True
    assert torch.equal(torch.isnan(got), nan)
    want, _ = formats.rebase_rows_to_e4m3(_dequantize(fmt, packed, scale.view(dtype)))
    assert torch.equal(_bits(got), _bits(want))


# --------------------------------------------------------------------------------------------
# The equality above can fail: a layout off by its A/B signs or halves decodes to other values
# --------------------------------------------------------------------------------------------

def _swap_sign_bits(b: torch.Tensor) -> torch.Tensor:
    """Bits 7 and 3 of every byte exchanged: A_i's sign (word bit 8i+7) and B_i's (8i+3) trade places; tiling
    moves whole bytes, so this is the same on the tiled tensor."""
    return (b & 0x77) | ((b >> 4) & 0x08) | ((b << 4) & 0x80)


def _swap_halves(b: torch.Tensor) -> torch.Tensor:
    """Each 32-bit word's low and high 16 bits exchanged (A's and B's magnitude selectors); tiles are whole words."""
    words = b.reshape(*b.shape[:-1], -1, 2, 2)
    return words.flip(-2).reshape(b.shape)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mutation", [_swap_sign_bits, _swap_halves])
def test_a_misplaced_sign_or_half_fails_the_equality(fmt, mutation):
    w = _edge_case_layer(fmt, seed=1)
    kernel = _with_row_data(w)
    want, _ = formats.rebase_rows_to_e4m3(_dequantize(fmt, w.w2, w.w2_scale))
    assert torch.equal(_bits(_decoded(kernel, "w2")), _bits(want))
    broken = dataclasses.replace(kernel, w2_fp8=mutation(kernel.w2_fp8))
    assert not torch.equal(_bits(_decoded(broken, "w2")), _bits(want))


# --------------------------------------------------------------------------------------------
# Word bits and tiling as the kernels read them
# --------------------------------------------------------------------------------------------

def _expected_word(position: int, code: int) -> tuple:
    """(word t, 32-bit word) of a 32-chunk holding `code` at `position` and +0 elsewhere, from the layout's rule."""
    half, rest = divmod(position, 16)
    t, i = divmod(rest, 4)
    mag, sign = code & 7, code >> 3
    if half == 0:
        return t, (mag << (4 * i)) | (sign << (8 * i + 7))
    return t, (mag << (16 + 4 * i)) | (sign << (8 * i + 3))


@pytest.mark.parametrize("code", [0b0101, 0b1011, 0b1000])
def test_each_weight_lands_on_its_documented_bits_and_tile(code):
    """One nonzero E2M1 code per row, MXFP4 with scale 2^0: its bits in the stored (tiled) bytes, found with the
    documented tile indexing (n // TILE_ROWS, c // TILE_BYTES, n % TILE_ROWS, c % TILE_BYTES)."""
    experts, rows, k = 1, 128, 128  # w13 [E, 2I, H], I = 64
    codes = torch.zeros(experts, rows, k, dtype=torch.uint8)
    where = {n: (7 * n + 3) % k for n in range(rows)}
    for n, pos in where.items():
        codes[0, n, pos] = code
    args = {"format": "mxfp4", "gate_up_layout": "contiguous", "w13": formats.pack_fp4(codes),
            "w13_scale": torch.full((experts, rows, k // 32), 127, dtype=torch.uint8),
            "w2": torch.zeros(experts, k, rows // 4, dtype=torch.uint8),
            "w2_scale": torch.full((experts, k, rows // 64), 127, dtype=torch.uint8)}
    stored = w4a8_row_data(to_kernel_layout(**args))["w13_fp8"][0]
    tiles = stored.reshape(rows // TILE_ROWS, k // 2 // TILE_BYTES, TILE_ROWS, TILE_BYTES)
    for n, pos in where.items():
        row = torch.stack([tiles[n // TILE_ROWS, c // TILE_BYTES, n % TILE_ROWS, c % TILE_BYTES]
                           for c in range(k // 2)]).to(torch.int64)
        words = (row.reshape(-1, 4) << torch.tensor([0, 8, 16, 24])).sum(dim=-1)  # little-endian 32-bit words
        t, word = _expected_word(pos % 32, code)
        expected = torch.zeros_like(words)
        expected[(pos // 32) * 4 + t] = word
        assert torch.equal(words, expected), (n, pos)


# --------------------------------------------------------------------------------------------
# LUT codes and the table
# --------------------------------------------------------------------------------------------

def _code(exponent: int, eighths: int = 0) -> int:
    return ((exponent + 14) << 3) | eighths


@pytest.mark.parametrize(("e8m0", "r", "code"), [
    (127, 0, _code(0)),                       # v = 1
    (127 - 13, 0, _code(-13)),                # v = 2^-13: the smallest coded
    (127 - 14, 0, W4A8_LUT_ZERO),             # v = 2^-14: all products round to 0
    (127 + 10, 0, _code(10)),                 # v = 2^10: every nonzero entry saturates
    (127 + 16, 0, _code(16)),
    (127 + 17, 0, _code(16)),                 # clamped
    (254, -30, _code(16)),
    (0, 0, W4A8_LUT_ZERO),                    # 2^-127
    (127, 5, _code(-5)),                      # 2^-r applied
    (127, -3, _code(3)),
    (100, -40, _code(13)),
    (255, 0, W4A8_LUT_NAN),
    (255, 7, W4A8_LUT_NAN),
])
def test_mxfp4_lut_codes(e8m0, r, code):
    got = w4a8_lut_codes(torch.tensor([[e8m0]], dtype=torch.uint8), "mxfp4", torch.tensor([r], dtype=torch.int32))
    assert got.dtype == torch.uint8 and got.tolist() == [[code]]


@pytest.mark.parametrize(("e4m3", "r", "code"), [
    (0x38, 0, _code(0)),                      # 1.0
    (0x7E, 0, _code(8, 6)),                   # 448 = 1.75 * 2^8
    (0xFE, 0, _code(8, 6)),                   # -448: the sign goes to the weights
    (0x7E, -2, _code(10, 6)),                 # 1792
    (0x7E, -9, _code(16, 6)),                 # 1.75 * 2^17, clamped
    (0x01, 4, _code(-13)),                    # subnormal 2^-9 times 2^-4 = 2^-13
    (0x01, 5, W4A8_LUT_ZERO),                 # 2^-14
    (0x07, 0, _code(-7, 6)),                  # subnormal 7 * 2^-9 = 1.75 * 2^-7
    (0x07, 7, W4A8_LUT_ZERO),                 # 1.75 * 2^-14: just below 2^-13
    (0x05, 6, _code(-13, 2)),                 # 1.25 * 2^-13: just above
    (0x03, 0, _code(-8, 4)),                  # 3 * 2^-9
    (0x00, 0, W4A8_LUT_ZERO),
    (0x80, -20, W4A8_LUT_ZERO),               # -0
    (0x7F, 0, W4A8_LUT_NAN),
    (0xFF, 3, W4A8_LUT_NAN),
])
def test_nvfp4_lut_codes(e4m3, r, code):
    scale = torch.tensor([[e4m3]], dtype=torch.uint8)
    assert w4a8_lut_codes(scale, "nvfp4", torch.tensor([r], dtype=torch.int32)).tolist() == [[code]]


def _table_bytes(table: torch.Tensor) -> torch.Tensor:
    """[256, 8] bytes of the table's rows: byte j of word j // 4 (little-endian)."""
    t = table.to(torch.int64)
    return torch.stack([(t[:, j // 4] >> (8 * (j % 4))) & 0xFF for j in range(8)], dim=-1)


def test_lut_table_rows_are_the_e4m3_products_of_each_code():
    table = w4a8_lut_table("cpu")
    assert table.dtype == torch.int32 and tuple(table.shape) == (256, 2)
    assert w4a8_lut_table(torch.device("cpu")) is table  # cached per device
    rows = _table_bytes(table)
    mags = torch.tensor(MAGNITUDES, dtype=torch.float64)
    for c in range(256):
        if c == W4A8_LUT_NAN:
            assert rows[c].tolist() == [0x7F] * 8
        elif c < 8 or c > 247:  # the zero code and the unused ones
            assert rows[c].tolist() == [0] * 8, c
        else:
            v = (1 + (c & 7) / 8) * 2.0 ** ((c >> 3) - 14)
            want = (mags * v).clamp(max=448).float().to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int64)
            assert torch.equal(rows[c], want), c
    assert table[_code(0)].tolist() == [0x3C383000, 0x4C484440]  # 0, .5, 1, 1.5 | 2, 3, 4, 6 at v = 1
    assert rows[_code(-13)].tolist() == [0] * 8  # 6 * 2^-13 < 2^-10: rounds to 0
    assert rows[_code(-13, 7)].tolist() == [0, 0, 0, 0, 0, 0, 0, 0x01]  # 6 * 1.875 * 2^-13 rounds up to 2^-9
    for c in range(_code(10), _code(16, 7) + 1):  # the clamp of E at 16 changes no entry: all saturate from 2^10
        assert rows[c, 1:].tolist() == [0x7E] * 7, c


# --------------------------------------------------------------------------------------------
# converter_w4a8, the meta device, and hand-built tensors
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_converter_w4a8_holds_the_packed_weights_once(fmt):
    """W4A8 runs the W4A16 kernels on either format: its layer is W4A16's, with no second copy of the packed weights
    (FP8 dots, when forced, compute their row data once)."""
    w = random_layer(fmt, experts=2, hidden=128, inter=64, gate_up="interleaved", seed=4)
    plain, w4a8 = converter.convert(w), converter_w4a8.convert(w)
    assert set(w4a8.tensors) == set(plain.tensors) and not set(plain.tensors) & set(W4A8_TENSORS)
    assert all(torch.equal(w4a8[name], t) for name, t in plain.tensors.items() if t is not None)
    assert given_w4a8_tensors(triton_weights(w4a8)) is None


def test_row_data_has_the_documented_specs_and_is_taken_as_given():
    kernel = triton_weights(converter.convert(random_layer("nvfp4", experts=2, hidden=128, inter=64, seed=4)))
    data = w4a8_row_data(kernel)
    assert set(data) == set(W4A8_TENSORS)
    assert {name: (t.dtype, tuple(t.shape)) for name, t in data.items()} == w4a8_tensor_specs(kernel)
    given = given_w4a8_tensors(dataclasses.replace(kernel, **data))
    assert set(given) == set(W4A8_TENSORS) and all(given[name] is t for name, t in data.items())


@pytest.mark.parametrize(("device", "experts"), [("meta", 3), ("cpu", 0)])
def test_meta_and_empty_layers_get_w4a8_tensors_of_the_right_shapes(device, experts):
    w = random_layer("nvfp4", experts=experts, hidden=128, inter=64, device=device, seed=2)
    plain = triton_weights(converter.convert(w))
    kernel = dataclasses.replace(plain, **w4a8_row_data(plain))
    data = given_w4a8_tensors(kernel)
    assert data is not None
    assert {n: (t.dtype, tuple(t.shape)) for n, t in data.items()} == w4a8_tensor_specs(kernel)
    assert all(t.device.type == device for t in data.values())


def test_hand_built_w4a8_tensors_get_one_message_naming_the_tensor():
    plain = triton_weights(converter.convert(random_layer("nvfp4", experts=2, hidden=128, inter=64)))
    kernel = dataclasses.replace(plain, **w4a8_row_data(plain))
    sliced = dataclasses.replace(kernel, w2_lut_code=kernel.w2_lut_code[:, :, :64])
    with pytest.raises(ValueError, match=r"weights\.w2_lut_code must be torch\.int32 of shape \(2, 1, 128\) on cpu, "
                                         r"got torch\.int32 \(2, 1, 64\) on cpu; build them with .*w4a8_row_data"):
        given_w4a8_tensors(sliced)
    partial = dataclasses.replace(kernel, w13_fp8=None)
    with pytest.raises(ValueError, match=r"weights\.w13_fp8 must be torch\.uint8 of shape \(2, 128, 64\) on cpu, "
                                         r"got NoneType; build them with .*w4a8_row_data"):
        given_w4a8_tensors(partial)
    strided = dataclasses.replace(kernel, w2_fp8=kernel.w2_fp8.transpose(1, 2).contiguous().transpose(1, 2))
    with pytest.raises(ValueError, match=r"weights\.w2_fp8 has strides .* a contiguous tensor"):
        given_w4a8_tensors(strided)
