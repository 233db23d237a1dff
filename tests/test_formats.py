"""Bit-level tests of backends.formats: code tables, packing, block scaling, rounding and error bounds.

Expected values are written out by hand from the format definitions (OCP MX v1.0, NVIDIA NVFP4), not
computed with the implementation under test.
"""

import math

import pytest
import torch

from backends import formats

from conftest import DEVICES

E2M1_TABLE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]

E3M2_TABLE = [
    0.0, 0.0625, 0.125, 0.1875, 0.25, 0.3125, 0.375, 0.4375,
    0.5, 0.625, 0.75, 0.875, 1.0, 1.25, 1.5, 1.75,
    2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0,
    8.0, 10.0, 12.0, 14.0, 16.0, 20.0, 24.0, 28.0,
    -0.0, -0.0625, -0.125, -0.1875, -0.25, -0.3125, -0.375, -0.4375,
    -0.5, -0.625, -0.75, -0.875, -1.0, -1.25, -1.5, -1.75,
    -2.0, -2.5, -3.0, -3.5, -4.0, -5.0, -6.0, -7.0,
    -8.0, -10.0, -12.0, -14.0, -16.0, -20.0, -24.0, -28.0,
]

E2M3_TABLE = [
    0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875,
    1.0, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875,
    2.0, 2.25, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75,
    4.0, 4.5, 5.0, 5.5, 6.0, 6.5, 7.0, 7.5,
    -0.0, -0.125, -0.25, -0.375, -0.5, -0.625, -0.75, -0.875,
    -1.0, -1.125, -1.25, -1.375, -1.5, -1.625, -1.75, -1.875,
    -2.0, -2.25, -2.5, -2.75, -3.0, -3.25, -3.5, -3.75,
    -4.0, -4.5, -5.0, -5.5, -6.0, -6.5, -7.0, -7.5,
]

# (code, value) of E8M0: 2^(code - 127); 255 is NaN per OCP MX v1.0.
E8M0_CASES = [
    (0, 5.877471754111438e-39),  # 2^-127, an fp32 subnormal
    (1, 1.1754943508222875e-38),  # 2^-126
    (120, 0.0078125),
    (126, 0.5),
    (127, 1.0),
    (128, 2.0),
    (137, 1024.0),
    (254, 1.7014118346046923e38),  # 2^127
]

# (bit pattern, value) of FP8 E4M3 (float8_e4m3fn: bias 7, no inf, 0x7F / 0xFF are NaN)
E4M3_CASES = [
    (0x00, 0.0), (0x01, 0.001953125), (0x07, 0.013671875), (0x08, 0.015625),
    (0x38, 1.0), (0x39, 1.125), (0x40, 2.0), (0x7E, 448.0), (0xB8, -1.0), (0xFE, -448.0),
]

# (emax of the element format, mantissa bits, minimum normal exponent, max value): used for error bounds
ELEMENT_NUMERICS = {"e2m1": (2, 1, 0, 6.0), "e3m2": (4, 2, -2, 28.0), "e2m3": (2, 3, 0, 7.5), "e4m3": (8, 3, -6, 448.0)}


def _assert_same_values(actual: torch.Tensor, expected: list) -> None:
    """Equal values AND equal signs (so -0.0 is distinguished from +0.0)."""
    expected_t = torch.tensor(expected, dtype=torch.float32)
    assert torch.equal(actual.cpu(), expected_t)
    assert torch.equal(torch.signbit(actual.cpu()), torch.signbit(expected_t))


# --------------------------------------------------------------------------- code tables


@pytest.mark.parametrize("device", DEVICES)
def test_e2m1_table_and_reencoding(device):
    codes = torch.arange(16, dtype=torch.uint8, device=device)
    values = formats.decode_fp4(codes)
    _assert_same_values(values, E2M1_TABLE)
    assert torch.equal(formats.encode_fp4(values), codes)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind, table", [("e3m2", E3M2_TABLE), ("e2m3", E2M3_TABLE)])
def test_fp6_tables_and_reencoding(device, kind, table):
    codes = torch.arange(64, dtype=torch.uint8, device=device)
    values = formats.decode_fp6(codes, kind=kind)
    _assert_same_values(values, table)
    assert torch.equal(formats.encode_fp6(values, kind=kind), codes)


@pytest.mark.parametrize("device", DEVICES)
def test_e8m0_selected_codes(device):
    codes = torch.tensor([c for c, _ in E8M0_CASES] + [255], dtype=torch.uint8, device=device)
    values = formats.decode_e8m0(codes).cpu()
    assert values[:-1].tolist() == [v for _, v in E8M0_CASES]
    assert math.isnan(values[-1].item())  # code 255: NaN per OCP (vLLM's reference would give 2^128)


@pytest.mark.parametrize("device", DEVICES)
def test_e4m3_codes_through_mxfp8_dequantize(device):
    bits = torch.tensor([b for b, _ in E4M3_CASES], dtype=torch.uint8, device=device)
    data = torch.zeros(32, dtype=torch.uint8, device=device)
    data[: len(E4M3_CASES)] = bits
    unit_scale = torch.tensor([127], dtype=torch.uint8, device=device)  # 2^0
    values = formats.dequantize_mxfp8(data.view(torch.float8_e4m3fn), unit_scale)
    assert values[: len(E4M3_CASES)].cpu().tolist() == [v for _, v in E4M3_CASES]


# --------------------------------------------------------------------------- rounding


@pytest.mark.parametrize("device", DEVICES)
def test_e2m1_ties_round_to_even_and_saturate(device):
    inputs = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, -0.25, 6.5, 100.0, float("inf"), -float("inf")]
    expected = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0, -0.0, 6.0, 6.0, 6.0, -6.0]
    codes = formats.encode_fp4(torch.tensor(inputs, device=device))
    _assert_same_values(formats.decode_fp4(codes), expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "kind, inputs, expected",
    [
        # midpoints between neighbours: the one with the even mantissa wins; beyond max saturates
        ("e3m2", [0.03125, 0.09375, 2.25, 2.75, 30.0, 26.0, -0.03], [0.0, 0.125, 2.0, 3.0, 28.0, 24.0, -0.0]),
        ("e2m3", [0.0625, 0.1875, 3.875, 7.75, 6.75, 1.0625], [0.0, 0.25, 4.0, 7.5, 7.0, 1.0]),
    ],
)
def test_fp6_ties_round_to_even(device, kind, inputs, expected):
    codes = formats.encode_fp6(torch.tensor(inputs, device=device), kind=kind)
    _assert_same_values(formats.decode_fp6(codes, kind=kind), expected)


# --------------------------------------------------------------------------- packing


@pytest.mark.parametrize("device", DEVICES)
def test_fp4_nibble_order(device):
    codes = torch.tensor([[1, 2, 3, 4], [15, 0, 0, 8]], dtype=torch.uint8, device=device)
    packed = formats.pack_fp4(codes)
    # element 2j -> low nibble, 2j+1 -> high nibble
    assert packed.cpu().tolist() == [[0x21, 0x43], [0x0F, 0x80]]
    assert torch.equal(formats.unpack_fp4(packed), codes)


@pytest.mark.parametrize("device", DEVICES)
def test_fp6_three_byte_packing(device):
    codes = torch.tensor([[1, 2, 3, 63, 0, 0, 0, 32]], dtype=torch.uint8, device=device)
    packed = formats.pack_fp6(codes)
    # W = 1 | 2<<6 | 3<<12 | 63<<18 = 0xFC3081 -> [0x81, 0x30, 0xFC];  W = 32<<18 = 0x800000 -> [0, 0, 0x80]
    assert packed.cpu().tolist() == [[0x81, 0x30, 0xFC, 0x00, 0x00, 0x80]]
    assert torch.equal(formats.unpack_fp6(packed), codes)


# --------------------------------------------------------------------------- MX block scaling


def _mx_codec(name):
    """(quantize, dequantize, element numerics key, random-code-range) of an MX format."""
    if name == "mxfp4":
        return formats.quantize_mxfp4, formats.dequantize_mxfp4, "e2m1"
    if name == "mxfp8":
        return formats.quantize_mxfp8, formats.dequantize_mxfp8, "e4m3"
    kind = name.split("_")[1]
    return (
        lambda x: formats.quantize_mxfp6(x, kind=kind),
        lambda p, s, dtype=torch.float32: formats.dequantize_mxfp6(p, s, kind=kind, dtype=dtype),
        kind,
    )


MX_FORMATS = ["mxfp4", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp8"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", MX_FORMATS)
def test_mx_scale_choice_follows_ocp(device, name):
    quantize, dequantize, element = _mx_codec(name)
    emax, _, _, max_value = ELEMENT_NUMERICS[element]
    blocks = torch.zeros(4, 32, device=device)
    blocks[0, 5] = max_value  # amax = max -> floor(log2) = emax -> shared_exp 0 -> code 127
    blocks[1, 0] = -1.0  # floor(log2 1) = 0 -> shared_exp -emax
    blocks[2, 31] = 3.0 * 2.0**20  # floor(log2) = 21
    # blocks[3] stays all zero -> code 0 and zero output
    _, scales = quantize(blocks.reshape(1, 128))
    assert scales.dtype == torch.uint8
    assert scales.cpu().tolist() == [[127, 127 - emax, 127 + 21 - emax, 0]]
    assert torch.equal(dequantize(*quantize(blocks.reshape(1, 128))).reshape(4, 32)[3], blocks[3])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", MX_FORMATS)
def test_mx_nan_block_gets_scale_255_and_dequantizes_to_nan(device, name):
    quantize, dequantize, _ = _mx_codec(name)
    x = torch.ones(2, 32, device=device)
    x[1, 3] = float("nan")
    data, scales = quantize(x)
    assert scales[:, 0].cpu().tolist() == [127 - ELEMENT_NUMERICS[_mx_codec(name)[2]][0], 255]
    out = dequantize(data, scales)
    assert torch.isnan(out[1]).all() and not torch.isnan(out[0]).any()


def _random_codes_with_block_max(name, shape, generator):
    """Random grid values per block with one max-magnitude element per block, so the OCP scale
    recomputed from amax equals the generating scale."""
    _, _, element = _mx_codec(name)
    max_value = ELEMENT_NUMERICS[element][3]
    table = {"e2m1": E2M1_TABLE, "e3m2": E3M2_TABLE, "e2m3": E2M3_TABLE}.get(element)
    if table is None:  # e4m3: every finite float8_e4m3fn pattern (exclude NaN 0x7F / 0xFF)
        bits = torch.randint(0, 256, shape, generator=generator, dtype=torch.int32)
        bits = torch.where((bits & 0x7F) == 0x7F, bits - 1, bits).to(torch.uint8)
        values = bits.view(torch.float8_e4m3fn).float()
    else:
        values = torch.tensor(table)[torch.randint(0, len(table), shape, generator=generator)]
    values = values.reshape(*shape[:-1], shape[-1] // 32, 32)
    values[..., 0] = max_value
    return values.reshape(shape)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", MX_FORMATS)
def test_mx_values_on_grid_round_trip_exactly(device, name):
    quantize, dequantize, _ = _mx_codec(name)
    generator = torch.Generator().manual_seed(0)
    grid = _random_codes_with_block_max(name, (3, 5, 128), generator)
    block_exponents = torch.randint(-20, 20, (3, 5, 4, 1), generator=generator).float()
    x = (grid.reshape(3, 5, 4, 32) * torch.exp2(block_exponents)).reshape(3, 5, 128).to(device)
    data, scales = quantize(x)
    assert torch.equal(scales.cpu(), (block_exponents.squeeze(-1) + 127).to(torch.uint8))
    assert torch.equal(dequantize(data, scales), x)  # exact, including the sign of zeros
    assert torch.equal(dequantize(data, scales, dtype=torch.bfloat16), x.bfloat16())


def _grid_error_bound(x: torch.Tensor, block_scale: torch.Tensor, element: str) -> torch.Tensor:
    """Largest |x - q(x)| allowed by RTNE with saturation at a block scale (float64):
    half a grid step of the element's binade (steps are 2^(max(floor(log2|v|), e_min) - mbits) for
    v = x / scale), or the overshoot |v| - max for values that saturate, times the block scale."""
    _, mbits, e_min, max_value = ELEMENT_NUMERICS[element]
    v = (x.double() / block_scale.double()).abs()
    binade = torch.floor(torch.log2(v.clamp(min=1e-300))).clamp(min=e_min)
    half_step = torch.exp2(binade - mbits) / 2
    return torch.maximum(half_step, v - max_value) * block_scale.double()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", MX_FORMATS)
def test_mx_random_error_within_half_step_at_block_scale(device, name):
    quantize, dequantize, element = _mx_codec(name)
    generator = torch.Generator().manual_seed(1)
    x = (torch.randn(16, 256, generator=generator) * torch.exp2(torch.randint(-8, 8, (16, 1), generator=generator))).to(device)
    data, scales = quantize(x)
    out = dequantize(data, scales).cpu().double()
    block_scale = formats.decode_e8m0(scales.cpu()).repeat_interleave(32, dim=-1)
    bound = _grid_error_bound(x.cpu(), block_scale, element)
    assert ((out - x.cpu().double()).abs() <= bound).all()
    # the bound is tight enough to catch a wrong scale: error is not trivially zero either
    assert (out != x.cpu().double()).any()


# --------------------------------------------------------------------------- NVFP4


@pytest.mark.parametrize("device", DEVICES)
def test_nvfp4_values_on_grid_round_trip_exactly(device):
    generator = torch.Generator().manual_seed(2)
    codes = torch.randint(0, 16, (6, 64), generator=generator, dtype=torch.uint8)
    codes.view(6, 4, 16)[..., 0] = 7  # a +6 in every block: block amax = 6 * s
    # block scales: arbitrary positive E4M3 normals (bit patterns 0x08..0x77)
    scale_bits = torch.randint(0x08, 0x78, (6, 4), generator=generator, dtype=torch.int32).to(torch.uint8)
    scales = scale_bits.view(torch.float8_e4m3fn)
    global_scale = 4.0  # a power of two keeps (fp4 * s) / global_scale exact
    x = (torch.tensor(E2M1_TABLE)[codes.long()].reshape(6, 4, 16) * scales.float().unsqueeze(-1) / 4.0).reshape(6, 64)
    packed, out_scales, out_gs = formats.quantize_nvfp4(x.to(device), global_scale=global_scale)
    assert out_gs.item() == 4.0
    assert torch.equal(out_scales.cpu().view(torch.uint8), scale_bits)
    assert torch.equal(formats.unpack_fp4(packed).cpu(), codes)
    assert torch.equal(formats.dequantize_nvfp4(packed, out_scales, out_gs).cpu(), x)


@pytest.mark.parametrize("device", DEVICES)
def test_nvfp4_default_global_scale_and_error_bound(device):
    generator = torch.Generator().manual_seed(3)
    x = (torch.randn(8, 128, generator=generator) * 3.0).to(device)
    packed, scales, global_scale = formats.quantize_nvfp4(x)
    assert packed.shape == (8, 64) and packed.dtype == torch.uint8
    assert scales.shape == (8, 8) and scales.dtype == torch.float8_e4m3fn
    assert global_scale.dtype == torch.float32
    assert global_scale.item() == pytest.approx(448.0 * 6.0 / x.abs().max().item(), rel=1e-6)
    # the largest block scale lands at the top of E4M3 (448 rounds to itself)
    assert scales.float().max().item() == 448.0
    out = formats.dequantize_nvfp4(packed, scales, global_scale).cpu().double()
    effective_scale = (scales.float().cpu().double() / global_scale.item()).repeat_interleave(16, dim=-1)
    # Bound: half an E2M1 step at the effective block scale s/global_scale, or the saturation
    # overshoot when rounding s down to E4M3 pushed |x|/s above 6; plus 1e-6 relative slack for the
    # fp32 reciprocal (1/(s/global_scale)) used before rounding, which can land 1 ulp off a midpoint.
    bound = _grid_error_bound(x.cpu(), effective_scale, "e2m1") + 1e-6 * x.cpu().double().abs()
    assert ((out - x.cpu().double()).abs() <= bound).all()


@pytest.mark.parametrize("device", DEVICES)
def test_nvfp4_per_expert_global_scale_and_zero_blocks(device):
    x = torch.zeros(2, 3, 32, device=device)
    x[0] = 1.0
    x[1, :, :16] = -2.0  # expert 1: second block of each row is all zero
    global_scale = torch.tensor([2688.0, 1344.0], device=device)
    packed, scales, gs = formats.quantize_nvfp4(x, global_scale=global_scale)
    assert torch.equal(gs, global_scale)
    # block scale = amax/6 * gs: expert 0 -> 1/6 * 2688 = 448; expert 1 -> 2/6 * 1344 = 448; zero block -> 0
    assert scales.float().cpu().tolist() == [[[448.0, 448.0]] * 3, [[448.0, 0.0]] * 3]
    assert torch.equal(formats.dequantize_nvfp4(packed, scales, gs), x)


def test_swizzle_hand_computed_positions_and_round_trip():
    scales = torch.arange(256 * 8, dtype=torch.int32).reshape(256, 8)
    swizzled = formats.swizzle_nvfp4_scales(scales)
    assert swizzled.shape == (256 * 8,)
    # tile (0,0), element (33, 2): (33 % 32) * 16 + (33 // 32) * 4 + 2 = 22
    assert swizzled[22].item() == scales[33, 2].item()
    # tile (row block 1, col block 1) is the 4th tile (1 * 2 + 1) -> base 3 * 512; element (130, 5) is
    # (2, 1) inside it: 2 * 16 + 0 * 4 + 1 = 33 -> 1569
    assert swizzled[1569].item() == scales[130, 5].item()
    assert torch.equal(formats.unswizzle_nvfp4_scales(swizzled, 256, 8), scales)


@pytest.mark.parametrize("device", DEVICES)
def test_swizzle_pads_and_inverts_for_ragged_shapes(device):
    scales = torch.randint(1, 120, (200, 10), dtype=torch.int32, device=device).to(torch.uint8).view(torch.float8_e4m3fn)
    swizzled = formats.swizzle_nvfp4_scales(scales)
    assert swizzled.numel() == 256 * 12  # rows padded to 256, cols to 12
    assert (swizzled.view(torch.uint8) == 0).sum().item() == 256 * 12 - 200 * 10  # padding is zero
    restored = formats.unswizzle_nvfp4_scales(swizzled, 200, 10)
    assert torch.equal(restored.view(torch.uint8), scales.view(torch.uint8))


# --------------------------------------------------------------------------- FP8 per-token-group


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_per_token_group(device):
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(3, 384, generator=generator).to(device)
    x[1, 128:256] = 0.0  # an all-zero group uses the eps-guarded scale and stays zero
    data, scales = formats.quantize_fp8_per_token_group(x)
    assert data.dtype == torch.float8_e4m3fn and scales.shape == (3, 3) and scales.dtype == torch.float32
    amax = x.reshape(3, 3, 128).abs().amax(-1)
    expected_scales = torch.where(amax > 0, amax, torch.full_like(amax, 1e-10)) / 448.0
    assert torch.equal(scales, expected_scales)
    out = formats.dequantize_fp8_per_token_group(data, scales, dtype=torch.float32)
    assert torch.equal(out[1, 128:256], x[1, 128:256])
    per_element_scale = scales.repeat_interleave(128, dim=-1)
    bound = _grid_error_bound(x.cpu(), per_element_scale.cpu(), "e4m3")  # half an E4M3 step (3 mantissa bits)
    assert ((out.cpu().double() - x.cpu().double()).abs() <= bound * (1 + 1e-6)).all()  # 1e-6: fp32 x/scale


# --------------------------------------------------------------------------- activation QDQ


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scheme", ["mxfp4", "mxfp6_e3m2", "mxfp6_e2m3", "fp8", "nvfp4"])
def test_qdq_activation_matches_quantize_then_dequantize(device, scheme):
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(4, 64, generator=generator).to(device=device, dtype=torch.bfloat16)
    out = formats.qdq_activation(x, scheme)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    if scheme == "nvfp4":
        expected = formats.dequantize_nvfp4(*formats.quantize_nvfp4(x), dtype=torch.bfloat16)
    elif scheme == "fp8":  # documented: MXFP8 (E8M0 per 32), as vLLM's OCP-MX emulation does
        expected = formats.dequantize_mxfp8(*formats.quantize_mxfp8(x), dtype=torch.bfloat16)
    elif scheme == "mxfp4":
        expected = formats.dequantize_mxfp4(*formats.quantize_mxfp4(x), dtype=torch.bfloat16)
    else:
        kind = scheme.split("_")[1]
        expected = formats.dequantize_mxfp6(*formats.quantize_mxfp6(x, kind=kind), kind=kind, dtype=torch.bfloat16)
    assert torch.equal(out, expected)
    assert not torch.equal(out, x)  # it really quantized
    assert formats.qdq_activation(x, None) is x


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: formats.quantize_mxfp4(torch.zeros(2, 30)), ValueError,
         r"quantize_mxfp4: x.shape\[-1\]=30 must be a multiple of 32 \(the MX block size\); pad K to a multiple of 32"),
        (lambda: formats.quantize_mxfp4(torch.zeros(2, 32, dtype=torch.int32)), TypeError,
         r"quantize_mxfp4: x.dtype=torch.int32 must be a floating dtype"),
        (lambda: formats.quantize_nvfp4(torch.zeros(2, 24)), ValueError,
         r"quantize_nvfp4: x.shape\[-1\]=24 must be a multiple of 16"),
        (lambda: formats.quantize_fp8_per_token_group(torch.zeros(2, 64)), ValueError,
         r"quantize_fp8_per_token_group: x.shape\[-1\]=64 must be a multiple of 128"),
        (lambda: formats.dequantize_mxfp4(torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(3, 1, dtype=torch.uint8)),
         ValueError, r"dequantize_mxfp4: scales.shape=\(3, 1\) must be \(2, 1\)"),
        (lambda: formats.dequantize_mxfp4(torch.zeros(2, 16), torch.zeros(2, 1, dtype=torch.uint8)), TypeError,
         r"dequantize_mxfp4: packed.dtype=torch.float32 must be torch.uint8"),
        (lambda: formats.dequantize_nvfp4(torch.zeros(2, 8, dtype=torch.uint8), torch.zeros(2, 1, dtype=torch.uint8), 1.0),
         TypeError, r"dequantize_nvfp4: scales.dtype=torch.uint8 must be torch.float8_e4m3fn"),
        (lambda: formats.quantize_nvfp4(torch.zeros(2, 3, 16), global_scale=torch.ones(3)), ValueError,
         r"quantize_nvfp4: global_scale.shape=\(3,\) must be \(\) or a prefix of the leading dims \(2, 3\)"),
        (lambda: formats.quantize_mxfp6(torch.zeros(2, 32), kind="e4m1"), ValueError,
         r"quantize_mxfp6: kind='e4m1' must be one of"),
        (lambda: formats.dequantize_mxfp6(torch.zeros(2, 20, dtype=torch.uint8), torch.zeros(2, 1, dtype=torch.uint8)),
         ValueError, r"dequantize_mxfp6: packed.shape\[-1\]=20 must be a multiple of 24"),
        (lambda: formats.pack_fp4(torch.tensor([16, 0], dtype=torch.uint8)), ValueError, r"pack_fp4: codes must be 4-bit"),
        (lambda: formats.swizzle_nvfp4_scales(torch.zeros(2, 3, 4)), ValueError, r"swizzle_nvfp4_scales: scales must be 2-D"),
        (lambda: formats.unswizzle_nvfp4_scales(torch.zeros(100), 128, 4), ValueError,
         r"unswizzle_nvfp4_scales: swizzled has 100 elements but rows=128, cols=4 need 512"),
        (lambda: formats.qdq_activation(torch.zeros(2, 32), "int8"), ValueError, r"qdq_activation: scheme='int8'"),
        (lambda: formats.quantize_mxfp8([1.0] * 32), TypeError, r"quantize_mxfp8: x must be a torch.Tensor"),
    ],
)
def test_bad_input_messages(call, error, message):
    with pytest.raises(error, match=message):
        call()


# --------------------------------------------------------------------------- torchao agreement (bit-exact)


@pytest.fixture(scope="module")
def torchao_mx():
    pytest.importorskip("torchao.prototype.mx_formats", reason="torchao (with numpy) not installed")
    from torchao.prototype.mx_formats import kernels, mx_tensor, nvfp4_tensor, utils

    return mx_tensor, nvfp4_tensor, kernels, utils


def _torchao_input(seed=6):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(16, 256, generator=generator) * torch.exp2(torch.randint(-6, 6, (16, 1), generator=generator))


def test_torchao_mxfp4_bit_exact(torchao_mx):
    mx_tensor = torchao_mx[0]
    x = _torchao_input()
    ao_scales, ao_data = mx_tensor.to_mx(x, torch.float4_e2m1fn_x2, 32)
    packed, scales = formats.quantize_mxfp4(x)
    assert torch.equal(scales, ao_scales.view(torch.uint8))
    assert torch.equal(packed, ao_data.view(torch.uint8))


@pytest.mark.parametrize("kind", ["e3m2", "e2m3"])
def test_torchao_mxfp6_bit_exact(torchao_mx, kind):
    mx_tensor, _, kernels, _ = torchao_mx
    x = _torchao_input()
    ao_scales, ao_codes = mx_tensor.to_mx(x, f"fp6_{kind}", 32)
    to_float = kernels.f6_e3m2_unpacked_to_f32 if kind == "e3m2" else kernels.f6_e2m3_unpacked_to_f32
    packed, scales = formats.quantize_mxfp6(x, kind=kind)
    assert torch.equal(scales, ao_scales.view(torch.uint8))
    ours = formats.decode_fp6(formats.unpack_fp6(packed), kind=kind)
    assert torch.equal(ours, to_float(ao_codes))


def test_torchao_mxfp8_bit_exact(torchao_mx):
    mx_tensor = torchao_mx[0]
    x = _torchao_input()
    ao_scales, ao_data = mx_tensor.to_mx(x, torch.float8_e4m3fn, 32)
    data, scales = formats.quantize_mxfp8(x)
    assert torch.equal(scales, ao_scales.view(torch.uint8))
    assert torch.equal(data.view(torch.uint8), ao_data.view(torch.uint8))


def test_torchao_nvfp4_bit_exact(torchao_mx):
    nvfp4_tensor = torchao_mx[1]
    x = _torchao_input()
    # torchao's per_tensor_scale is the dequant multiplier (1/global_scale); a power of two makes the
    # two reciprocal orders (torchao: (1/pts)/s, ours: 1/(s*(1/gs))) identical
    per_tensor_scale = torch.tensor(2.0**-7)
    ao_scales, ao_data = nvfp4_tensor.nvfp4_quantize(x, 16, per_tensor_scale)
    packed, scales, _ = formats.quantize_nvfp4(x, global_scale=2.0**7)
    assert torch.equal(scales.view(torch.uint8), ao_scales.view(torch.uint8))
    assert torch.equal(packed, ao_data.view(torch.uint8))


def test_torchao_pack_and_swizzle_agree(torchao_mx):
    _, _, kernels, utils = torchao_mx
    codes = torch.randint(0, 16, (6, 64), dtype=torch.uint8)
    assert torch.equal(formats.pack_fp4(codes), kernels.pack_uint4(codes))
    scales = torch.randint(0, 255, (300, 9), dtype=torch.uint8)
    assert torch.equal(formats.swizzle_nvfp4_scales(scales), utils.to_blocked(scales))
