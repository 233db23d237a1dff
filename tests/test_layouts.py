"""Every layout converter: bit-exact round trips (CPU and meta, E = 0/1/odd, padded sizes), never in place,
clear errors, and a semantic check per backend that reads the converted tensors with the backend's
documented indexing (written here from the docs, not by calling the converter's helpers)."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from backends import formats
from backends.layouts import (
    aiter,
    cutlass,
    deepgemm,
    identity,
    marlin,
    nvfp4_cutlass,
    oai_triton,
    trtllm,
)
from backends.layouts.base import Converter
from backends.weights import KernelWeights

from conftest import DEVICES, requires_cuda, scenario
from layout_cases import assert_same_weights, random_layer
from tolerances import tolerance


@dataclass(frozen=True)
class Case:
    name: str
    converter: object
    fmt: str
    logical: tuple  # (H, I) of the checkpoint
    padded: tuple  # (H, I) the decision asks for
    bf16_bias: bool = False  # the layout stores biases as bf16
    finite_scales: bool = False  # the layout refuses negative/NaN scales


CASES = [
    Case("emulation-mxfp4", identity.emulation, "mxfp4", (64, 32), (64, 64)),
    Case("emulation-nvfp4", identity.emulation, "nvfp4", (48, 32), (64, 48)),
    Case("xpu", identity.xpu, "mxfp4", (64, 32), (64, 64)),
    Case("deepgemm", deepgemm.mxfp4, "mxfp4", (64, 32), (128, 128)),
    Case("trtllm-mxfp4", trtllm.mxfp4, "mxfp4", (64, 32), (128, 128)),
    Case("trtllm-nvfp4", trtllm.nvfp4, "nvfp4", (48, 32), (128, 64)),
    Case("cutlass-sm100", cutlass.mxfp4_mxfp8, "mxfp4", (64, 32), (128, 128), bf16_bias=True),
    Case("cutlass-sm90", cutlass.mxfp4_bf16_sm90, "mxfp4", (64, 32), (128, 128), bf16_bias=True),
    Case("cutlass-sm90-legacy", cutlass.mxfp4_bf16_sm90_legacy, "mxfp4", (64, 32), (128, 128), bf16_bias=True),
    Case("aiter", aiter.mxfp4, "mxfp4", (64, 32), (256, 256)),
    Case("oai-triton", oai_triton.mxfp4, "mxfp4", (64, 32), (64, 64)),
    Case("marlin-mxfp4", marlin.mxfp4, "mxfp4", (128, 64), (256, 128), bf16_bias=True),
    Case("marlin-nvfp4", marlin.nvfp4, "nvfp4", (128, 64), (256, 128), bf16_bias=True, finite_scales=True),
    Case("fi-cutlass-nvfp4", nvfp4_cutlass.flashinfer_cutlass, "nvfp4", (48, 32), (48, 64)),
    Case("cutedsl", nvfp4_cutlass.cutedsl, "nvfp4", (48, 32), (48, 64)),
    Case("cutedsl-0.15", nvfp4_cutlass.cutedsl_v015, "nvfp4", (48, 32), (48, 64)),
    Case("vllm-cutlass", nvfp4_cutlass.vllm_cutlass, "nvfp4", (48, 32), (48, 64)),
]
BY_NAME = {case.name: case for case in CASES}


def layer(case: Case, *, experts=3, gate_up="interleaved", device="cpu", seed=0, finite_scales=False):
    hidden, inter = case.logical
    return random_layer(case.fmt, experts=experts, hidden=hidden, inter=inter, gate_up=gate_up, device=device,
                        seed=seed, finite_scales=finite_scales or case.finite_scales, bf16_bias=case.bf16_bias)


def convert(case: Case, w):
    return case.converter.convert(w, hidden_size=case.padded[0], intermediate_size=case.padded[1])


# ---------------------------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("device", [*DEVICES, "meta"])
@pytest.mark.parametrize("experts", [0, 1, 3])
@pytest.mark.parametrize("gate_up", ["interleaved", "contiguous"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_round_trip_is_bit_exact_and_leaves_the_input_alone(case, gate_up, experts, device):
    w = layer(case, experts=experts, gate_up=gate_up, device=device)
    before = {name: t.clone() for name, t in vars(w).items() if isinstance(t, torch.Tensor)}
    kw = convert(case, w)
    assert isinstance(case.converter, Converter)
    assert (kw.hidden_size, kw.intermediate_size) == case.logical
    assert (kw.padded_hidden_size, kw.padded_intermediate_size) == case.padded
    assert all(t.device.type == device for t in kw.tensors.values())
    assert_same_weights(case.converter.invert(kw), w)
    for name, t in before.items():  # never in place
        if device != "meta" and t.numel():
            assert torch.equal(getattr(w, name).view(torch.uint8), t.view(torch.uint8)), name


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_cuda_conversion_writes_the_same_bytes_as_cpu(case):
    w = layer(case, experts=3, seed=5)
    on_cpu = convert(case, w)
    on_cuda = convert(case, layer(case, experts=3, seed=5, device="cuda"))
    assert sorted(on_cpu.tensors) == sorted(on_cuda.tensors)
    for name, t in on_cpu.tensors.items():
        assert torch.equal(on_cuda[name].cpu().contiguous().view(torch.uint8), t.contiguous().view(torch.uint8)), name


def test_unpadded_sizes_round_trip_too():
    case = BY_NAME["trtllm-mxfp4"]
    w = random_layer("mxfp4", experts=5, hidden=128, inter=128, seed=3)
    assert_same_weights(case.converter.invert(case.converter.convert(w)), w)


@pytest.mark.parametrize("name", ["cutlass-sm100", "marlin-mxfp4"])
def test_bf16_bias_layouts_round_biases_to_nearest_bf16(name):
    case = BY_NAME[name]
    w = random_layer(case.fmt, experts=2, hidden=case.logical[0], inter=case.logical[1], bf16_bias=False)
    back = case.converter.invert(convert(case, w))
    torch.testing.assert_close(back.w13_bias, w.w13_bias.bfloat16().float(), **tolerance("exact"))
    assert not torch.equal(back.w13_bias, w.w13_bias)  # the data really was not bf16-representable


# ---------------------------------------------------------------------------------------------- semantics
def dense(fmt, packed, scales, global_scale=None):
    """Dequantize [E, rows, K/2] with linear scales (uint8 E8M0 | e4m3 | fp32 already decoded)."""
    if scales.dtype == torch.float32:
        values = formats.decode_fp4(formats.unpack_fp4(packed))
        return values * scales.repeat_interleave(32, dim=-1)
    if fmt == "mxfp4":
        return formats.dequantize_mxfp4(packed, scales.view(torch.uint8))
    return formats.dequantize_nvfp4(packed, scales.view(torch.float8_e4m3fn), global_scale)


def checkpoint_halves(w, padded):
    """Padded dense (gate, up, w2) of the checkpoint, built with F.pad (independent of MoEWeights.pad)."""
    hidden, inter = padded
    d13 = dense(w.format, w.w13, w.w13_scale, w.w13_global_scale)
    gate, up = (d13[:, 0::2], d13[:, 1::2]) if w.gate_up == "interleaved" else d13.chunk(2, dim=1)
    pad13 = (0, hidden - w.H, 0, inter - w.I)
    d2 = dense(w.format, w.w2, w.w2_scale, w.w2_global_scale)
    return (torch.nn.functional.pad(gate, pad13), torch.nn.functional.pad(up, pad13),
            torch.nn.functional.pad(d2, (0, inter - w.I, 0, hidden - w.H)))


def read_128x4(stored, rows, cols):
    """Linear [E, rows, cols] from the cuBLAS 128x4 layout: offset of (r, c) as the docs give it."""
    e = stored.shape[0]
    flat = stored.reshape(e, -1)
    r = torch.arange(rows).reshape(-1, 1)
    c = torch.arange(cols).reshape(1, -1)
    tiles_per_row = -(-cols // 4)
    offset = ((r // 128) * tiles_per_row + c // 4) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + c % 4
    return flat[:, offset]


def read_sm90_folded(stored, rows, groups):
    r = torch.arange(rows).reshape(-1, 1)
    g = torch.arange(groups).reshape(1, -1)
    return stored[:, r // 64, g // 4, r % 16, ((r % 64) // 16) * 4 + g % 4]


def read_sm90_legacy(stored, rows, groups):
    r = torch.arange(rows).reshape(-1, 1)
    g = torch.arange(groups).reshape(1, -1)
    return stored[:, g // 4, r * 4 + g % 4]


def row_sources(order, inter):
    """(half, i) of every kernel row: half 0 = gate, 1 = up."""
    j = torch.arange(2 * inter)
    if order == "interleaved":
        return j % 2, j // 2
    if order == "contiguous":
        return (j >= inter).long(), j % inter
    if order == "up_gate":
        return (j < inter).long(), j % inter
    if order == "trtllm":  # inside 32-row blocks, kernel row p holds source row 4 (p % 8) + p // 8 of [w3_0, w1_0, ...]
        p = j % 32
        u = j - p + 4 * (p % 8) + p // 8
        return 1 - u % 2, u // 2
    if order == "groups64":
        q = j % 128
        return (q < 64).long(), (j // 128) * 64 + q % 64
    raise AssertionError(order)


ROW_ORDER = {"deepgemm": None, "emulation-mxfp4": None, "emulation-nvfp4": None, "xpu": None,
             "trtllm-mxfp4": "trtllm", "trtllm-nvfp4": "trtllm", "cutlass-sm100": "up_gate",
             "cutlass-sm90": "up_gate", "cutlass-sm90-legacy": "up_gate", "fi-cutlass-nvfp4": "up_gate",
             "cutedsl": "groups64", "cutedsl-0.15": "contiguous", "vllm-cutlass": "contiguous",
             "oai-triton": "interleaved"}


def linear_scales(name, stored, rows, cols):
    if name.startswith("trtllm") or name == "cutlass-sm100" or name in ("fi-cutlass-nvfp4", "cutedsl", "cutedsl-0.15",
                                                                          "vllm-cutlass"):
        return read_128x4(stored.view(torch.uint8), rows, cols)
    if name == "cutlass-sm90":
        return read_sm90_folded(stored, rows, cols)
    if name == "cutlass-sm90-legacy":
        return read_sm90_legacy(stored, rows, cols)
    if name == "oai-triton":
        return stored.transpose(-2, -1)
    return stored


@pytest.mark.parametrize("gate_up", ["interleaved", "contiguous"])
@pytest.mark.parametrize("name", sorted(ROW_ORDER))
def test_row_layouts_dequantize_to_the_checkpoint(name, gate_up):
    case = BY_NAME[name]
    w = layer(case, gate_up=gate_up, experts=2, seed=7, finite_scales=True)  # DeepGEMM: code 0 -> 0.0, 255 -> inf
    kw = convert(case, w)
    hidden, inter = case.padded
    block = 32 if case.fmt == "mxfp4" else 16
    gate, up, w2 = checkpoint_halves(w, case.padded)
    order = ROW_ORDER[name] or gate_up
    half, index = row_sources(order, inter)
    expected13 = torch.where((half == 0).reshape(1, -1, 1), gate[:, index], up[:, index])
    gs13 = kw.config.get("w13_global_scale")
    w13_rows, w2_rows = kw["w13"], kw["w2"]
    if name == "cutlass-sm90":  # bytes inside 16-row blocks are interleaved; checked on its own below
        w13_rows, w2_rows = cutlass.sm90_deinterleave_weights(w13_rows), cutlass.sm90_deinterleave_weights(w2_rows)
    if name == "oai-triton":  # K-major views: [E, K/2, N]
        w13_rows, w2_rows = w13_rows.transpose(-2, -1), w2_rows.transpose(-2, -1)
    got13 = dense(case.fmt, w13_rows, linear_scales(name, kw["w13_scale"], 2 * inter, hidden // block), gs13)
    exact = tolerance("exact")
    torch.testing.assert_close(got13, expected13, **exact, equal_nan=True)
    expected2 = w2
    if name.startswith("trtllm"):  # w2 gets the epilogue shuffle alone: source row of kernel row j
        j = torch.arange(hidden)
        p = j % 32
        expected2 = w2[:, j - p + 4 * (p % 8) + p // 8]
    got2 = dense(case.fmt, w2_rows, linear_scales(name, kw["w2_scale"], hidden, inter // block),
                 kw.config.get("w2_global_scale"))
    torch.testing.assert_close(got2, expected2, **exact, equal_nan=True)
    if "w13_bias" in kw.tensors:
        b13 = w.w13_bias
        gb, ub = (b13[:, 0::2], b13[:, 1::2]) if gate_up == "interleaved" else b13.chunk(2, dim=1)
        gb, ub = (torch.nn.functional.pad(t, (0, inter - w.I)) for t in (gb, ub))
        expected_bias = torch.where(half == 0, gb[:, index], ub[:, index])
        torch.testing.assert_close(kw["w13_bias"].float(), expected_bias, **exact)


def test_deepgemm_scale_upcast_maps_code_zero_to_zero():
    w = random_layer("mxfp4", experts=1, hidden=128, inter=128)
    # one w13 row per E8M0 code; 255 (NaN) is refused by MoEWeights, so the last row repeats 254
    codes = torch.arange(256, dtype=torch.int32).clamp(max=254).to(torch.uint8)
    w = w.replace(w13_scale=codes.reshape(1, 256, 1).expand(1, 256, 4).contiguous())
    s = deepgemm.mxfp4.convert(w)["w13_scale"][0, :, 0]
    assert s[0] == 0.0 and s[1] == 2.0**-126 and s[127] == 1.0 and s[254] == 2.0**127 and s[255] == 2.0**127


def test_aiter_weights_follow_the_documented_a16w4_view():
    case = BY_NAME["aiter"]
    w = layer(case, gate_up="interleaved", experts=2)
    kw = convert(case, w)
    p = w.pad(*case.padded)
    e, hidden, inter = 2, *case.padded
    k0 = hidden // 2 // 64
    gate_up_rows = torch.cat((p.w13[:, 0::2], p.w13[:, 1::2]), dim=1)  # [gate; up]
    # kernel dims [n0, half, k0, klane, nlane, kpack]
    kernel = kw["w13"].view(torch.uint8).reshape(e, inter // 16, 2, k0, 4, 16, 16)
    half, n0, nlane, kb, klane, kpack = torch.meshgrid(
        torch.arange(2), torch.arange(inter // 16), torch.arange(16), torch.arange(k0), torch.arange(4),
        torch.arange(16), indexing="ij")
    source = gate_up_rows[:, half * inter + n0 * 16 + nlane, kb * 64 + klane * 16 + kpack]
    assert torch.equal(kernel[:, n0, half, kb, klane, nlane, kpack], source)
    # scale dims [n1, k1, klane, nlane, kpack, npack]
    scale_kernel = kw["w13_scale"].reshape(e, inter // 16, hidden // 256, 4, 16, 2, 2)
    gate_up_scales = torch.cat((p.w13_scale[:, 0::2], p.w13_scale[:, 1::2]), dim=1)
    npack, n1, nl, k1, kp, kl = torch.meshgrid(torch.arange(2), torch.arange(inter // 16), torch.arange(16),
                                               torch.arange(hidden // 256), torch.arange(2), torch.arange(4),
                                               indexing="ij")
    assert torch.equal(scale_kernel[:, n1, k1, kl, nl, kp, npack],
                       gate_up_scales[:, npack * inter + n1 * 16 + nl, k1 * 8 + kp * 4 + kl])


def _marlin_reference(w_expert, scale_expert, fmt):
    """vLLM's test oracle for gptq_marlin_repack (marlin_weights) and marlin_permute_scales, loop by loop."""
    n, k = w_expert.shape[0], w_expert.shape[1] * 2
    perm = []
    for i in range(32):
        perm1 = [16 * row + i // 4 + 8 * block for block in (0, 1)
                 for row in (2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1)]
        for j in range(4):
            perm.extend(p + 256 * j for p in perm1)
    perm = torch.tensor(perm).reshape(-1, 8)[:, [0, 2, 4, 6, 1, 3, 5, 7]].reshape(-1)
    q = torch.stack((w_expert & 0xF, w_expert >> 4), -1).reshape(n, k).T.to(torch.int64)
    q = q.reshape(k // 16, 16, n // 16, 16).permute(0, 2, 1, 3).reshape(k // 16, n * 16)
    q = q.reshape(-1, 1024)[:, perm].reshape(q.shape)
    packed = torch.zeros(q.shape[0], q.shape[1] // 8, dtype=torch.int64)
    for i in range(8):
        packed |= q[:, i::8] << 4 * i
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    scale_perm = [i + 8 * j for i in range(8) for j in range(8)]
    s = scale_expert.T.contiguous().reshape(-1, 64)[:, scale_perm].reshape(-1, n)
    s = s.reshape(-1, 4)[:, [0, 2, 1, 3]].reshape(s.shape[0], -1)
    if fmt == "nvfp4":
        h = (s.view(torch.float8_e4m3fn).to(torch.float16) * 2**7).view(torch.int16) << 1
        s = h.view(torch.uint8).reshape(h.shape[0], -1)[:, 1::2]  # the high byte of each int16
    return packed, s


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_marlin_matches_vllms_python_oracle(fmt):
    case = BY_NAME[f"marlin-{fmt}"]
    w = layer(case, experts=2, seed=11).pad(*case.padded)
    kw = case.converter.convert(w)
    for e in range(2):
        for name in ("w13", "w2"):
            scale = getattr(w, f"{name}_scale")[e].view(torch.uint8)
            packed, scales = _marlin_reference(getattr(w, name)[e], scale, fmt)
            assert torch.equal(kw[name][e], packed), name
            assert torch.equal(kw[f"{name}_scale"][e].view(torch.uint8), scales), name


def test_marlin_bias_matches_marlin_permute_bias():
    case = BY_NAME["marlin-mxfp4"]
    w = layer(case, experts=2).pad(*case.padded)
    single = [2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)]  # marlin scale_perm_single
    kw = case.converter.convert(w)
    expected = w.w13_bias.bfloat16().reshape(2, -1, 32)[..., single].reshape(w.w13_bias.shape)
    assert torch.equal(kw["w13_bias"], expected)


def test_marlin_nvfp4_global_scale_and_s0e5m3_values():
    case = BY_NAME["marlin-nvfp4"]
    w = layer(case, experts=2)
    convert(case, w)  # the alphas come from the rules' kind: tests/test_quant_config_rules.py
    codes = torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn)  # every non-negative finite E4M3
    byte = marlin.e4m3_to_s0e5m3(codes).to(torch.int32)
    exponent, mantissa = byte >> 3, byte & 7  # S0E5M3 with bias 15, read as fp16 / 2^7
    value = torch.where(exponent > 0, (1 + mantissa / 8) * 2.0 ** (exponent - 15), mantissa / 8 * 2.0**-14) / 2**7
    torch.testing.assert_close(value, codes.float(), **tolerance("exact"))


# The quant values (NVFP4 alphas and global scales, SwiGLU constants) come from the rules' kinds, not from the
# layouts: tests/test_quant_config_rules.py checks them through build_quant_config.


# ---------------------------------------------------------------------------------------------- errors
def test_errors_name_the_layout_the_value_and_the_fix():
    w = random_layer("mxfp4", experts=2, hidden=64, inter=32)
    with pytest.raises(ValueError, match=r"'flashinfer_trtllm_mxfp4': hidden_size=64 must be a multiple of 128 .* pad"):
        trtllm.mxfp4.convert(w, intermediate_size=128)
    with pytest.raises(ValueError, match=r"converts \('nvfp4',\) weights, got format='mxfp4'"):
        nvfp4_cutlass.flashinfer_cutlass.convert(w)
    with pytest.raises(TypeError, match="convert takes a backends.weights.MoEWeights"):
        deepgemm.mxfp4.convert({"w13": w.w13})
    kw = deepgemm.mxfp4.convert(w)
    with pytest.raises(ValueError, match="cannot invert weights in layout 'deepgemm_mxfp4'"):
        trtllm.mxfp4.invert(kw)
    bad = KernelWeights(**{**{f: getattr(kw, f) for f in kw.__dataclass_fields__},
                           "tensors": {**kw.tensors, "w13_scale": kw["w13_scale"][:, :-1]}})
    with pytest.raises(ValueError, match=r"tensors\['w13_scale'\] is \(2, 63, 2\) torch.float32 but this layout"):
        deepgemm.mxfp4.invert(bad)


def test_w4a16_layouts_need_no_input_scales():  # W4A4 kinds need them: tests/test_quant_config_rules.py
    assert marlin.nvfp4.convert(random_layer("nvfp4", experts=2, hidden=128, inter=128, finite_scales=True)
                                .replace(w13_input_scale=None)) is not None


def test_marlin_refuses_signed_nvfp4_scales():
    w = random_layer("nvfp4", experts=2, hidden=128, inter=128, finite_scales=True)
    scales = w.w2_scale.view(torch.uint8).clone()
    scales[1, 5, 0] = 0x80  # -0.0: a zero scale to MoEWeights (which refuses negative ones), signed to Marlin
    with pytest.raises(ValueError, match=r"w2_scale has a negative, -0.0 or NaN block scale \(first at expert 1, row"):
        marlin.nvfp4.convert(w.replace(w2_scale=scales.view(torch.float8_e4m3fn)))


def _sm90_kernel_transcription(w):
    """flashinfer's interleave_fp4_weights_for_sm90_mixed_gemm_kernel for one expert [n, k/2], thread by thread."""
    n, half = w.shape
    cols = 2 * half
    src, dst = w.reshape(-1).tolist(), [None] * w.numel()
    for block_id in range(n // 2):
        for partition in range(cols // 64):
            for lane in range(16):
                row, mma = block_id // 8 * 16 + block_id % 8, lane // 4
                col = partition * 32 + mma * 8 + lane % 4
                first, second = row * half + col, (row + 8) * half + col
                word = src[first] | src[second] << 8 | src[first + 4] << 16 | src[second + 4] << 24
                moved = 0
                for mask, shift in cutlass._SM90_BIT_MOVES:
                    moved |= (word & mask) << shift if shift >= 0 else (word & mask) >> -shift
                out = (row + (mma % 2) * 8) * half + partition * 32 + lane // 8 * 16 + (lane % 4) * 4
                for i in range(4):
                    dst[out + i] = (moved >> 8 * i) & 0xFF
    assert None not in dst  # every output byte written once
    return torch.tensor(dst, dtype=torch.uint8).reshape(n, half)


def test_sm90_weights_match_the_flashinfer_kernel_thread_by_thread():
    case = BY_NAME["cutlass-sm90"]
    w = layer(case, experts=2, gate_up="interleaved").pad(*case.padded)
    kw = case.converter.convert(w)
    up_gate = torch.cat((w.w13[:, 1::2], w.w13[:, 0::2]), dim=1)
    for e in range(2):
        assert torch.equal(kw["w13"][e], _sm90_kernel_transcription(up_gate[e]))
        assert torch.equal(kw["w2"][e], _sm90_kernel_transcription(w.w2[e]))


@requires_cuda
@pytest.mark.gpu
def test_sm90_weights_agree_with_flashinfer():
    fm = pytest.importorskip("flashinfer.fused_moe", reason="flashinfer is not installed (optional extra)")
    w = torch.randint(0, 256, (3, 128, 256), dtype=torch.uint8, device="cuda")
    assert torch.equal(cutlass.sm90_interleave_weights(w), fm.interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4"))


# ---------------------------------------------------------------------------------------------- flashinfer helpers
def test_trtllm_row_shuffle_agrees_with_flashinfer():
    fi_utils = pytest.importorskip("flashinfer.utils", reason="flashinfer is not installed (optional extra)")
    for rows in (128, 256, 512):
        x = torch.zeros(rows, 8, dtype=torch.uint8)
        assert torch.equal(trtllm.epilogue_row_shuffle(rows), fi_utils.get_shuffle_matrix_a_row_indices(x, 128))


def test_sm90_scale_fold_agrees_with_flashinfer():
    fm = pytest.importorskip("flashinfer.fused_moe", reason="flashinfer is not installed (optional extra)")
    s = torch.randint(0, 256, (2, 128, 8), dtype=torch.uint8)
    assert torch.equal(cutlass.sm90_fold_scales(s), fm.interleave_moe_scales_for_sm90_mixed_gemm(s, group_size=32))


# ---------------------------------------------------------------------------------------------- named by the rules
def _rule_backends() -> list:
    """(profile, family, backend) of every backend entry of every family in every shipped profile."""
    from oracle import Oracle

    shipped = Oracle()
    return [(profile, family, backend) for profile in shipped.profiles()
            for family in shipped.table(profile).families.values() for backend in family.backends.values()]


RULE_BACKENDS = _rule_backends()


def _family_format(family) -> str:
    """The weight codec a family converts: its weight key's codec, or (weight_key: from_scenario) its name."""
    from oracle.vocabulary import BY_QUANT_KEY, CODECS

    if isinstance(family.weight_key, str) and family.weight_key in BY_QUANT_KEY:
        return BY_QUANT_KEY[family.weight_key].codec
    assert family.name in CODECS, f"family {family.name}: no weight codec to convert (weight_key {family.weight_key})"
    return family.name


#: every distinct (weight format, converter path) the shipped rules name
NAMED_CONVERTERS = sorted({(_family_format(family), backend.converter)
                           for _, family, backend in RULE_BACKENDS if backend.converter is not None})


def test_every_backend_in_every_profile_names_a_converter_or_says_why_not():
    assert {p for p, _, _ in RULE_BACKENDS} >= {"vllm-0.20", "vllm-0.15", "vllm-0.33", "moe-oracle"}
    silent = [f"{p}/{f.name}/{b.name} ({b.at})" for p, f, b in RULE_BACKENDS
              if b.converter is None and not (b.missing_why and "conver" in b.missing_why)]  # convert/-er/-sion
    assert silent == [], "converter: null needs a missing_why that says why nothing converts"
    # every converter the layouts package ships for a backend is named by some rule
    assert {path for _, path in NAMED_CONVERTERS} >= {
        "backends.layouts.deepgemm:mxfp4", "backends.layouts.trtllm:mxfp4", "backends.layouts.trtllm:nvfp4",
        "backends.layouts.cutlass:mxfp4_mxfp8", "backends.layouts.cutlass:mxfp4_bf16_sm90",
        "backends.layouts.marlin:mxfp4", "backends.layouts.marlin:nvfp4", "backends.layouts.aiter:mxfp4",
        "backends.layouts.oai_triton:mxfp4", "backends.layouts.identity:xpu",
        "backends.layouts.nvfp4_cutlass:flashinfer_cutlass", "backends.layouts.nvfp4_cutlass:cutedsl",
        "backends.layouts.nvfp4_cutlass:cutedsl_v015", "backends.layouts.nvfp4_cutlass:vllm_cutlass"}


@pytest.mark.parametrize(("fmt", "path"), NAMED_CONVERTERS, ids=lambda v: v)
def test_proposed_converters_pass_the_registry_and_take_their_format(fmt, path):
    from oracle.registry import problem, resolve

    assert problem(path) is None, problem(path)
    converter = resolve(path)
    assert isinstance(converter, Converter) and fmt in converter.formats, (path, getattr(converter, "formats", None))


@pytest.mark.parametrize(("fmt", "path"), NAMED_CONVERTERS, ids=lambda v: v)
def test_every_converter_named_in_the_rules_resolves(fmt, path):
    """Each named converter resolves through the registry and round-trips a random layer bit-exactly.

    (64, 32) padded to (256, 256): a size every shipped layout's tiles accept (AITER needs 256)."""
    from oracle.registry import resolve

    converter = resolve(path)
    w = random_layer(fmt, experts=3, hidden=64, inter=32, seed=11, finite_scales=True, bf16_bias=True)
    kw = converter.convert(w, hidden_size=256, intermediate_size=256)
    assert (kw.padded_hidden_size, kw.padded_intermediate_size) == (256, 256)
    assert_same_weights(converter.invert(kw), w)


def test_decision_and_explain_carry_the_converter_the_rules_name(oracle, capsys):
    from oracle import Decision
    from oracle.cli import main

    d = oracle.select(scenario("mxfp4-gpt-oss", "cuda:10.0", packages=("flashinfer",)))
    named = oracle.table(d.profile).families["mxfp4"].backends[d.backend].converter
    assert (d.backend, d.converter, named) == ("FLASHINFER_TRTLLM_MXFP4_BF16",) + ("backends.layouts.trtllm:mxfp4",) * 2
    assert d.to_dict()["converter"] == named and Decision.from_dict(d.to_dict()).converter == named
    assert main(["explain", "--profile", "vllm-0.20", "--policy", "mxfp4-gpt-oss", "--platform", "cuda:10.0",
                 "--package", "flashinfer"]) == 0
    assert f"converter {named}" in capsys.readouterr().out
    assert main(["select", "--profile", "vllm-0.20", "--policy", "mxfp4-gpt-oss", "--platform", "cuda:10.0",
                 "--package", "flashinfer", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["converter"] == named


def test_a_backend_without_a_converter_says_why_in_explain(capsys):
    from oracle.cli import main

    assert main(["explain", "--policy", "mxfp4", "--profile", "vllm-0.33", "--platform", "cuda:12.0", "--package",
                 "flashinfer", "--package", "b12x", "--moe-backend", "b12x", "--activation", "silu"]) == 0
    out = capsys.readouterr().out
    assert "selected B12X_MXFP4_BF16" in out
    assert "converter none" in out and "no conversion facts for vLLM 0.33's layout yet" in out
