"""W4A8 (FP8 E4M3 activations) of backends.triton_moe against the emulation.

The numerics are defined once, in backends.formats and backends.emulation.moe_forward: its fake quantization for
bf16 dots (what moe_forward runs), its fp8_operands=True (rebase_rows_to_e4m3, mxfp8_row_rebased) for FP8 dots
(forced: w4a8_mma='fp8'); the kernels (act_quant='fp8_per_tensor_static' | 'mxfp8') are checked against the one
their tensor cores compute: under Triton's CPU interpreter at small shapes (a TRITON_INTERPRET=1 subprocess, as
test_triton_moe_interp.py: both formats, both schemes, both GEMMs, swap-AB and plain tiles, stacked gate/up, split-K
with both epilogues, given row data), and on CUDA at the gpt-oss-120b and DeepSeek-V3 layers.
"""

from __future__ import annotations

import json

import pytest
import torch

from backends import emulation, formats

from conftest import interpreter_worker_rows, requires_cuda
from tolerances import tolerance

SCHEMES = ("fp8_per_tensor_static", "mxfp8")


# --------------------------------------------------------------------------------------------
# The rebase math (backends.formats), no Triton
# --------------------------------------------------------------------------------------------

def test_rebase_exponent_is_the_smallest_that_fits_448():
    gen = torch.Generator().manual_seed(0)
    amax = torch.cat([torch.tensor([448.0, 449.0, 224.0, 224.00002, 2688.0, 1e-30, 3e38]),
                      torch.rand(2000, generator=gen) * 10.0 ** torch.randint(-20, 20, (2000,), generator=gen)])
    r = formats.fp8_row_rebase_exponent(amax).double()
    assert torch.all(amax.double() <= 448 * 2.0**r), "amax * 2^-r must not exceed 448"
    assert torch.all(amax.double() > 224 * 2.0**r), "a smaller r would fit too (r must be the smallest)"
    assert formats.fp8_row_rebase_exponent(torch.zeros(3)).tolist() == [0, 0, 0]  # all-zero rows: r = 0


def _mxfp4_rows(span: int, rows: int = 64, seed: int = 0) -> torch.Tensor:
    """Dequantized MXFP4 rows [rows, 256] whose 8 block exponents lie in [120 - span, 120], both ends present."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (rows, 128), dtype=torch.uint8, generator=gen)
    exps = torch.randint(120 - span, 121, (rows, 8), generator=gen)
    exps[:, 0], exps[:, 1] = 120, 120 - span
    return formats.dequantize_mxfp4(codes, exps.to(torch.uint8))


def test_mxfp4_rebase_is_exact_within_14_binades():
    w = _mxfp4_rows(span=14)
    w8, r = formats.rebase_rows_to_e4m3(w)
    assert torch.equal(torch.ldexp(w8, r[:, None].float()), w), "MXFP4 rows spanning <= 14 binades must be exact"
    assert w8.abs().max() <= 448


def test_mxfp4_rebase_rounds_beyond_14_binades():
    """The bound is tight: 18 binades push the smallest blocks below E4M3's subnormals (this test shows the check
    above can fail)."""
    w = _mxfp4_rows(span=18)
    w8, r = formats.rebase_rows_to_e4m3(w)
    assert not torch.equal(torch.ldexp(w8, r[:, None].float()), w)


def test_nvfp4_rebase_rounds_to_e4m3_once():
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 256, (64, 128), dtype=torch.uint8, generator=gen)
    scales = (torch.rand(64, 16, generator=gen) * 400 + 0.02).to(torch.float8_e4m3fn)
    w = formats.dequantize_nvfp4(codes, scales, 1.0)
    w8, r = formats.rebase_rows_to_e4m3(w)
    back = torch.ldexp(w8, r[:, None].float())
    normal = w.abs() * torch.ldexp(torch.ones(()), -r[:, None].float()) >= 2.0**-6  # E4M3 normal range
    torch.testing.assert_close(back[normal], w[normal], **tolerance("e4m3_one_rounding"))
    assert not torch.equal(back, w), "NVFP4 products carry up to 5 significant bits: some must round"


def test_e4m3_rn_rounds_to_nearest_even_and_saturates():
    x = torch.tensor([1.0625, 1.1875, 17.0, 19.0, 500.0, -1e9, 2.0**-10, 3 * 2.0**-10])
    assert formats.e4m3_rn(x).tolist() == [1.0, 1.25, 16.0, 20.0, 448.0, -448.0, 0.0, 2.0**-8]


def test_mxfp8_row_rebase_keeps_rows_of_one_exponent_and_shifts_the_others():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(16, 128, generator=gen)
    same = x / x.abs().amax(dim=-1, keepdim=True) * 3.0  # every block's amax in [2, 4): one block exponent
    same[:, ::32] = 3.5
    assert torch.equal(formats.mxfp8_row_rebased(same), formats.qdq_activation(same, "fp8"))
    spread = x.clone()
    spread[:, :32] *= 2.0**12  # one block 12 binades up: the others lose bits to E4M3's subnormals
    rebased, mx = formats.mxfp8_row_rebased(spread), formats.qdq_activation(spread, "fp8")
    assert torch.equal(rebased[:, :32], mx[:, :32]) and not torch.equal(rebased, mx)


# --------------------------------------------------------------------------------------------
# Bad arguments: one message naming the argument and the fix, before any launch
# --------------------------------------------------------------------------------------------

def _small_layer(fmt="mxfp4"):
    from backends.layouts.triton_moe import to_kernel_layout
    from backends.triton_moe.testing import Shape, random_checkpoint

    shape = Shape("s", fmt, 8, 2, 128, 64, "swigluoai", True)
    ckpt = random_checkpoint(shape)
    return ckpt, to_kernel_layout(**ckpt), torch.randn(4, 128).bfloat16(), torch.randn(4, 8)


def test_unknown_fp8_accumulation_names_the_variable_and_the_choices(monkeypatch):
    pytest.importorskip("triton", reason="triton is not installed; the Triton MoE kernels cannot run")
    from backends.triton_moe import moe_forward
    from backends.triton_moe.forward import FP8_ACCUMULATE_ENV

    _, weights, x, logits = _small_layer()
    monkeypatch.setenv(FP8_ACCUMULATE_ENV, "fp16")
    with pytest.raises(ValueError, match=rf"{FP8_ACCUMULATE_ENV}='fp16' must be one of \('wgmma', 'tensor-core'\)"):
        moe_forward(x, weights, router_logits=logits, top_k=2, act_quant="mxfp8")


@pytest.mark.parametrize(("fmt", "choice", "env", "message"), [
    ("nvfp4", "fp16", None, r"w4a8_mma='fp16' must be one of \('bf16', 'fp8'\) or None"),
    ("mxfp4", "fp16", None, r"w4a8_mma='fp16' must be one of \('bf16', 'fp8'\) or None"),
    ("mxfp4", None, "tf32", r"environment variable MOE_ORACLE_TRITON_W4A8_MMA='tf32' must be one of \('bf16', 'fp8'\)"),
])
def test_w4a8_mma_that_cannot_be_honoured_names_the_choice_and_the_fix(fmt, choice, env, message, monkeypatch):
    pytest.importorskip("triton", reason="triton is not installed; the Triton MoE kernels cannot run")
    from backends.triton_moe import moe_forward
    from backends.triton_moe.forward import W4A8_MMA_ENV

    _, weights, x, logits = _small_layer(fmt)
    monkeypatch.delenv(W4A8_MMA_ENV, raising=False)
    if env:
        monkeypatch.setenv(W4A8_MMA_ENV, env)
    with pytest.raises(ValueError, match=message):
        moe_forward(x, weights, router_logits=logits, top_k=2, act_quant="mxfp8", w4a8_mma=choice)


@pytest.mark.parametrize(("kwargs", "kind", "message"), [
    ({"act_quant": "fp8"}, ValueError, r"act_quant='fp8' must be one of \(None, 'fp8_per_tensor_static', 'mxfp8'\)"),
    ({"act_quant": "fp8_per_tensor_static", "a2_scale": torch.ones(1)}, ValueError,
     r"a1_scale must be a one-element torch.float32 tensor .* got None"),
    ({"act_quant": "fp8_per_tensor_static", "a1_scale": torch.ones(1, dtype=torch.float64),
      "a2_scale": torch.ones(1)}, ValueError, r"a1_scale must be a one-element torch.float32 tensor .* got torch.float64"),
    ({"act_quant": "fp8_per_tensor_static", "a1_scale": torch.ones(1), "a2_scale": torch.ones(2)}, ValueError,
     r"a2_scale must be a one-element .* shape \(2,\)"),
    ({"a1_scale": torch.ones(1)}, ValueError, r"a1_scale is only read with act_quant='fp8_per_tensor_static'"),
    ({"act_quant": "mxfp8", "a2_scale": torch.ones(1)}, ValueError, r"a2_scale is only read with"),
])
def test_bad_act_quant_arguments_name_the_argument(kwargs, kind, message):
    pytest.importorskip("triton", reason="triton is not installed; the Triton MoE kernels cannot run")
    from backends.triton_moe import moe_forward

    _, weights, x, logits = _small_layer()
    with pytest.raises(kind, match=message):
        moe_forward(x, weights, router_logits=logits, top_k=2, **kwargs)


def test_mx_epilogue_config_gives_gemv1_whole_mx_blocks_and_keeps_its_warps():
    """GEMV1 quantizes h per 32 columns (4 row groups of 8) for MXFP8 on bf16 dots: fewer row groups are raised to 4,
    the K slices lowered so that a program keeps its warps; a config that has them already is returned as it is."""
    from backends.triton_moe.tuning import DecodeConfig, GemvLaunch, LaunchConfig, MoEConfig, mx_epilogue_config

    tile = LaunchConfig(16, 64, 128, 1, True, 4, 3)
    for given, wanted in ((GemvLaunch(2, 4, True), GemvLaunch(4, 2, True)), (GemvLaunch(1, 2), GemvLaunch(4, 1)),
                          (GemvLaunch(1, 16), GemvLaunch(4, 4))):
        config = MoEConfig(tile, tile, "t", DecodeConfig(given, GemvLaunch(1, 2)))
        got = mx_epilogue_config(config)
        assert got.decode.gemv1 == wanted and got.decode.gemv2 == config.decode.gemv2, got
        assert got.decode.gemv1.warps() == max(4, given.warps()), got
        assert got.source.startswith("t+mxfp8"), got.source
    for kept in (GemvLaunch(4, 2), GemvLaunch(8, 1)):
        config = MoEConfig(tile, tile, "t", DecodeConfig(kept, GemvLaunch(1, 2)))
        assert mx_epilogue_config(config) is config
    assert mx_epilogue_config(MoEConfig(tile, tile, "t")).decode is None


@pytest.mark.parametrize(("decode", "block_n", "message"), [
    (True, 64, r"config.decode.gemv1=GemvLaunch\(row_groups=2.*W4A8 MXFP8 quantizes h per 32 columns in GEMV1, which "
               r"needs row_groups 4 or 8 .* pass tuning.mx_epilogue_config\(config\)"),
    (False, 48, r"config.gemm1.block_n=48: W4A8 MXFP8 quantizes h per 32 columns in GEMM1's epilogue, which needs a "
                r"multiple of 32"),
])
def test_mxfp8_config_without_whole_mx_blocks_names_the_fix(decode, block_n, message):
    pytest.importorskip("triton", reason="triton is not installed; the Triton MoE kernels cannot run")
    from backends.triton_moe import moe_forward
    from backends.triton_moe.tuning import DecodeConfig, GemvLaunch, LaunchConfig, MoEConfig

    _, weights, x, logits = _small_layer()
    tile = LaunchConfig(16, block_n, 64, 1, True, 4, 2)
    config = MoEConfig(tile, tile, "t", DecodeConfig(GemvLaunch(2, 1), GemvLaunch(1, 2)) if decode else None)
    with pytest.raises(ValueError, match=message):
        moe_forward(x[:1], weights, router_logits=logits[:1], top_k=2, act_quant="mxfp8", w4a8_mma="bf16",
                    config=config)


def test_hand_built_row_data_of_the_wrong_shape_is_refused():
    pytest.importorskip("triton", reason="triton is not installed; the Triton MoE kernels cannot run")
    import dataclasses

    from backends.layouts.triton_moe import w4a8_row_data
    from backends.triton_moe import moe_forward

    _, weights, x, logits = _small_layer()
    data = w4a8_row_data(weights)
    bad = dataclasses.replace(weights, **{**data, "w2_row_exp": data["w2_row_exp"][:, :64]})
    with pytest.raises(ValueError, match=r"weights.w2_row_exp must be torch.int32 of shape \(8, 128\).*w4a8_row_data"):
        moe_forward(x, bad, router_logits=logits, top_k=2, act_quant="mxfp8")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"format": "bf16"}, r"fp8_operands=True needs format 'mxfp4' or 'nvfp4'"),
    ({"gemm_input_schemes": ("mxfp8", "fp8_per_tensor_dynamic")}, r"needs both GEMM input schemes in"),
])
def test_emulation_fp8_operands_refuses_what_the_kernels_do_not_define(kwargs, message):
    ckpt, _, x, logits = _small_layer()
    args = {**ckpt, "router_logits": logits, "top_k": 2, "gemm_input_schemes": ("mxfp8", "mxfp8"), **kwargs}
    if args["format"] == "bf16":
        args.update(w13=torch.randn(8, 128, 128), w2=torch.randn(8, 128, 64), w13_scale=None, w2_scale=None)
    with pytest.raises(ValueError, match=message):
        emulation.moe_forward(x, **args, fp8_operands=True)


# --------------------------------------------------------------------------------------------
# Interpreter: the kernels against the emulation (TRITON_INTERPRET=1 subprocess)
# --------------------------------------------------------------------------------------------

# name -> (format, E, k, H, I, activation, biases, T, gate_up_layout, scheme, config, w4a8_mma): both formats with
# moe_forward's choice of tensor cores (bf16) on every config, and with FP8 dots forced on every config but split
# (the stacked split-fused config covers split-K there)
CASES = {}
for _fmt, _act, _h, _i, _biases, _layout in (("mxfp4", "swigluoai", 128, 64, True, "interleaved"),
                                             ("nvfp4", "silu", 192, 64, False, "contiguous")):
    for _mma in (None, "fp8"):
        _tag = f"-{_mma}" if _mma else ""
        for _scheme in SCHEMES:
            for _config in ("swap", "plain", "split", "stacked-split-fused"):
                if not (_mma and _config == "split"):
                    CASES[f"{_fmt}-{_scheme}-{_config}{_tag}"] = (_fmt, 8, 2, _h, _i, _act, _biases, 9, _layout, _scheme,
                                                                  _config, _mma)
            if not _mma and _scheme == "mxfp8":  # GEMM1's MXFP8 blocks of h within warps (forward.mx_warps)
                CASES[f"{_fmt}-{_scheme}-swap-mx-warps"] = (_fmt, 8, 2, _h, _i, _act, _biases, 9, _layout, _scheme,
                                                            "swap-mx-warps", _mma)
            for _tokens in (1, 2) if not _mma else (1,):  # a config with decode kernels: bf16 tensor cores take them
                CASES[f"{_fmt}-{_scheme}-decode-T{_tokens}{_tag}"] = (_fmt, 8, 2, _h, _i, _act, _biases, _tokens,
                                                                      _layout, _scheme, "decode", _mma)


def _configs():
    from backends.triton_moe.tuning import DecodeConfig, GemvLaunch, LaunchConfig, MoEConfig

    swap = LaunchConfig(16, 32, 64, 1, True, 4, 2)
    swap_mx_warps = LaunchConfig(16, 64, 64, 1, True, 2, 2)  # 32 columns a warp: MX blocks in warps
    plain = LaunchConfig(32, 32, 128, 2, False, 4, 2)  # nvfp4: K tail (H = 192 = 128 + 64)
    split = LaunchConfig(16, 32, 64, 1, True, 4, 2, split_k=2)
    stacked = LaunchConfig(16, 32, 64, 1, True, 4, 2, split_k=3, stack_gate_up=True, split_epilogue="fused")
    decode = DecodeConfig(GemvLaunch(4, 1), GemvLaunch(1, 2))  # GEMV1: 32 columns, one MX block of h
    return {"swap": MoEConfig(swap, swap, "test"), "plain": MoEConfig(plain, plain, "test"),
            "split": MoEConfig(split, split, "test"), "stacked-split-fused": MoEConfig(stacked, split, "test"),
            "decode": MoEConfig(swap, swap, "test", decode),
            "swap-mx-warps": MoEConfig(swap_mx_warps, swap, "test")}


def _layer_inputs(spec, seed=0):
    from backends.triton_moe.testing import Shape, activation_kwargs, random_checkpoint

    fmt, e, k, h, i, act, biases, tokens, layout, scheme = spec[:10]
    shape = Shape("s", fmt, e, k, h, i, act, biases)
    gen = torch.Generator().manual_seed(seed)
    ckpt = random_checkpoint(shape, generator=gen, gate_up_layout=layout)
    x = torch.randn(tokens, h, generator=gen)
    x[:, 3] *= 200.0  # an outlier channel: the static scale and the MX blocks that hold it see it
    x = x.bfloat16()
    route = {"router_logits": torch.randn(tokens, e, generator=gen), "top_k": k, **activation_kwargs(shape)}
    scales = {}
    if scheme == "fp8_per_tensor_static":
        scales = {"a1_scale": (x.float().abs().amax() / 448).reshape(1), "a2_scale": torch.full((1,), 1 / 64)}
    return ckpt, x, route, scales


def _reference(ckpt, x, route, scheme, scales, fp8_dots):
    """The emulation of what the kernels compute: FP8 dots' rebased operands, or bf16 dots' fake-quantized ones."""
    return emulation.moe_forward(x, **ckpt, **route, gemm_input_schemes=(scheme, scheme), fp8_operands=fp8_dots,
                                 **scales)


def _compare_w4a8(out, ref, scheme) -> dict:
    from backends.triton_moe.testing import compare

    elementwise = tolerance("w4a8_mxfp8_moe_elementwise_rms_units" if scheme == "mxfp8"
                            else "w4a8_moe_elementwise_rms_units")
    return compare(out, ref, rel_l2_tol=tolerance("w4a8_moe_rel_l2")["rtol"], rtol=elementwise["rtol"],
                   atol_rms_units=elementwise["atol"])


def _run_case(spec) -> dict:
    import dataclasses

    from backends.layouts.triton_moe import to_kernel_layout, w4a8_row_data
    from backends.triton_moe import forward, moe_forward

    scheme, config, mma = spec[9], _configs()[spec[10]], spec[11]
    ckpt, x, route, scales = _layer_inputs(spec)
    ref = _reference(ckpt, x, route, scheme, scales, fp8_dots=mma == "fp8")
    weights = to_kernel_layout(**ckpt)
    decode_launches, launch_decode = [], forward._launch_decode
    quantize_launches, quantize_rows = [], forward._quantize_rows

    def counted(*args, **kwargs):
        decode_launches.append(kwargs)
        return launch_decode(*args, **kwargs)

    def counted_quantize(*args, **kwargs):
        quantize_launches.append(1)
        return quantize_rows(*args, **kwargs)

    forward._launch_decode, forward._quantize_rows = counted, counted_quantize
    try:
        out = moe_forward(x, weights, **route, config=config, act_quant=scheme, w4a8_mma=mma, **scales)
        row_data_computed = id(weights.w13) in forward._W4A8_CACHE
        quantizations = len(quantize_launches)
        converted = dataclasses.replace(weights, **w4a8_row_data(weights))  # given row data: the same bits
        again = moe_forward(x, converted, **route, config=config, act_quant=scheme, w4a8_mma=mma, **scales)
    finally:
        forward._launch_decode, forward._quantize_rows = launch_decode, quantize_rows
    w4a16 = emulation.moe_forward(x, **ckpt, **route)
    extra = {}
    if forward.mx_warps(config.gemm1, forward._BF16_ACT_QUANT_IDS[scheme][0]):
        mx_warps, forward.mx_warps = forward.mx_warps, lambda *_: 0
        try:  # the same sums per column: the blocks in warps must give the positional order's bits
            positional = moe_forward(x, weights, **route, config=config, act_quant=scheme, w4a8_mma=mma, **scales)
        finally:
            forward.mx_warps = mx_warps
        extra["same_bits_as_positional_mx_blocks"] = torch.equal(out.view(torch.int16), positional.view(torch.int16))
    return {**extra, **_compare_w4a8(out, ref, scheme), "bits_equal_reference": torch.equal(out, ref),
            "same_bits_with_converted_weights": torch.equal(out.view(torch.int16), again.view(torch.int16)),
            "differs_from_w4a16": not torch.equal(ref, w4a16), "decode_kernels": bool(decode_launches),
            "row_data_computed": row_data_computed, "quantize_launches": quantizations}


def _act_quant_rows() -> list[dict]:
    """act_quant_kernel (through forward._quantize_rows) against backends.formats, row by row: static FP8 is
    e4m3_rn(x / a1), MXFP8 for FP8 dots times 2^ra is formats.mxfp8_row_rebased(x), for bf16 dots plain MXFP8
    (formats.qdq_activation 'fp8'); rows spanning 6 decades, a zero row, an outlier, and K = 192 (not a power of two:
    the masked tail of the row's block)."""
    from backends.triton_moe import _kernels, forward

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 192, generator=gen) * torch.logspace(-3, 3, 6)[:, None]
    x[1] = 0.0
    x[2, 17] = 3e4
    x = x.bfloat16()
    a1 = (x.float().abs().amax() / 448).reshape(1)
    a2 = torch.full((1,), 0.3)  # 1 / 0.3 is inexact: the kernel's reciprocal must round as torch's does
    static, _, qscale = forward._quantize_rows(_kernels, x, 1, (a1, a2), None, True)
    mx, exps, _ = forward._quantize_rows(_kernels, x, 2, None, None, True)
    mx_values, _ = forward._operand_values(_kernels, x, "mxfp8", None)
    static_values, _ = forward._operand_values(_kernels, x, "fp8_per_tensor_static", (a1, a2))
    return [{"case": "act_quant-static", "equal": torch.equal(static.float(), formats.e4m3_rn(x.float() * (1.0 / a1)))
             and torch.equal(qscale, torch.cat([a1, 1.0 / a1, a2, 1.0 / a2]))},
            {"case": "act_quant-mxfp8", "equal": torch.equal(torch.ldexp(mx.float(), exps[:, None].float()),
                                                             formats.mxfp8_row_rebased(x.float()))},
            {"case": "act_quant-mxfp8-bf16-values", "equal": mx_values.dtype == torch.bfloat16
             and torch.equal(mx_values.float(), formats.qdq_activation(x.float(), "fp8"))},
            {"case": "act_quant-static-bf16-values", "equal": static_values.dtype == torch.bfloat16
             and torch.equal(static_values.float(), formats.e4m3_rn(x.float() * (1.0 / a1)))}]


@pytest.fixture(scope="module")
def interpreter_results() -> dict:
    pytest.importorskip("triton", reason="triton is not installed; the Triton MoE kernels cannot run")
    from backends.triton_moe.forward import W4A8_MMA_ENV

    return interpreter_worker_rows(__file__, ("mxfp4",), ("mxfp4-fp8",), ("nvfp4",), ("nvfp4-fp8",), ("act_quant",),
                                   drop_env=(W4A8_MMA_ENV,))


@pytest.mark.parametrize("case", ["act_quant-static", "act_quant-mxfp8", "act_quant-mxfp8-bf16-values",
                                  "act_quant-static-bf16-values"])
def test_interpreter_act_quant_kernel_is_the_formats_quantization(interpreter_results, case):
    row = interpreter_results[case]
    assert "error" not in row, row.get("error")
    assert row["equal"], row


@pytest.mark.parametrize("case", sorted(CASES))
def test_interpreter_w4a8_matches_emulation(interpreter_results, case):
    row = interpreter_results[case]
    assert "error" not in row, row.get("error")
    assert row["shape_ok"] and row["finite"], row
    assert row["rel_l2_ratio"] <= 1.0 and row["elementwise_ratio"] <= 1.0, row
    assert row["same_bits_with_converted_weights"], "given row data must give the lazily computed bits"
    assert row["differs_from_w4a16"], "the FP8 numerics must differ from W4A16's (else the test compares nothing)"


@pytest.mark.parametrize(("edit", "act_quant_id", "warps"), [
    ({}, 4, 4), ({"num_warps": 2, "block_n": 64}, 4, 2), ({}, 3, 0), ({}, 2, 0), ({"swap_ab": False}, 4, 0),
    ({"stack_gate_up": True}, 4, 0), ({"split_k": 2}, 4, 0), ({"block_n": 64}, 4, 0), ({"num_warps": 8}, 4, 0)])
def test_mx_blocks_lie_in_warps_only_where_a_warp_holds_32_columns_of_h(edit, act_quant_id, warps):
    """forward.mx_warps: GEMM1 orders its columns by warp only for MXFP8 on bf16 dots (ACT_QUANT 4) in a swapped,
    unstacked, one-slice tile of 32 columns a warp; everything else keeps the positional order (0)."""
    import dataclasses

    from backends.triton_moe import forward
    from backends.triton_moe.tuning import LaunchConfig

    tile = dataclasses.replace(LaunchConfig(16, 128, 64, 8, True, 4, 4), **edit)
    assert forward.mx_warps(tile, act_quant_id) == warps


def test_interpreter_mx_values_by_warp_are_the_formats_mxfp8(interpreter_results):
    """GEMM1's MXFP8 quantization of h with its blocks in warps (_kernels._mx_values_by_warp on columns in
    _mx_warp_columns' order) gives formats' MXFP8 per 32 consecutive columns, on blocks of unequal scales."""
    row = interpreter_results["mx-values-by-warp"]
    assert "error" not in row, row.get("error")
    assert row["mismatches"] == {"2": 0, "4": 0}, row


@pytest.mark.parametrize("case", sorted(c for c in CASES if c.endswith("-mx-warps")))
def test_interpreter_mx_blocks_in_warps_give_the_positional_bits(interpreter_results, case):
    """GEMM1 ordering its columns so that each MXFP8 block of h lies in one warp (forward.mx_warps) only moves
    where a column is computed: h, and so the layer, must keep the bits of the positional order."""
    row = interpreter_results[case]
    assert "error" not in row, row.get("error")
    assert row["same_bits_as_positional_mx_blocks"], row


@pytest.mark.parametrize("case", sorted(CASES))
def test_interpreter_w4a8_takes_fp8_dots_only_when_forced(interpreter_results, case):
    """Unforced calls run the W4A16 kernels (the decode kernels where the config has them) on the operands' bf16
    values, on either format; calls forced to FP8 dots the W4A8 tiles whatever the config says. Only those need the
    W4A8 row data: the others leave it uncomputed."""
    row = interpreter_results[case]
    assert "error" not in row, row.get("error")
    fp8_dots = case.endswith("-fp8")
    assert row["row_data_computed"] == fp8_dots, row
    assert row["decode_kernels"] == ("-decode-" in case and not fp8_dots), row


@pytest.mark.parametrize("case", sorted(CASES))
def test_interpreter_w4a8_quantizes_h_in_gemm1_except_for_fp8_dots_mxfp8(interpreter_results, case):
    """x is quantized by one launch; h by GEMM1's (GEMV1's) epilogue, except with MXFP8 on FP8 dots, whose per-row
    rebase needs whole rows of h and so a second launch."""
    row = interpreter_results[case]
    assert "error" not in row, row.get("error")
    fp8_dots = case.endswith("-fp8")
    assert row["quantize_launches"] == (2 if fp8_dots and "-mxfp8-" in case else 1), row


# --------------------------------------------------------------------------------------------
# CUDA: the real layers
# --------------------------------------------------------------------------------------------

_CUDA_LAYERS: dict = {}


def _cuda_layer(name):
    """(checkpoint, kernel weights with the FP8 dots' row data) of a registry layer, built once per module."""
    import dataclasses

    from backends.layouts.triton_moe import to_kernel_layout, w4a8_row_data
    from backends.triton_moe.testing import SHAPES, random_checkpoint

    if name not in _CUDA_LAYERS:
        ckpt = random_checkpoint(SHAPES[name], device="cuda", generator=torch.Generator("cuda").manual_seed(0))
        weights = to_kernel_layout(**ckpt)
        _CUDA_LAYERS.clear()  # one layer on the GPU at a time
        _CUDA_LAYERS[name] = ckpt, dataclasses.replace(weights, **w4a8_row_data(weights))
    return _CUDA_LAYERS[name]


def _cuda_inputs(name, tokens, scheme):
    from backends.triton_moe.testing import SHAPES, activation_kwargs

    shape = SHAPES[name]
    gen = torch.Generator("cuda").manual_seed(tokens)
    x = torch.randn(tokens, shape.hidden_size, device="cuda", generator=gen)
    x[:, 7] *= 100.0  # an outlier channel
    x = x.bfloat16()
    route = {"router_logits": torch.randn(tokens, shape.experts, device="cuda", generator=gen),
             "top_k": shape.top_k, **activation_kwargs(shape)}
    scales = {}
    if scheme == "fp8_per_tensor_static":
        scales = {"a1_scale": (x.float().abs().amax() / 448).reshape(1),
                  "a2_scale": torch.full((1,), 1 / 64, device="cuda")}
    return x, route, scales


@requires_cuda
@pytest.mark.gpu
def test_cuda_mx_values_by_warp_are_the_formats_mxfp8():
    from triton_moe_scale_probe import mx_warp_block_mismatches

    assert mx_warp_block_mismatches("cuda") == {2: 0, 4: 0}


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("tokens", [1, 37, 1000, 4096])
@pytest.mark.parametrize("name", ["gpt-oss-120b", "deepseek-v3"])
def test_cuda_w4a8_layers_match_emulation(name, tokens, scheme):
    _check_cuda_layer(name, tokens, scheme, None)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("tokens", [1, 1000])
@pytest.mark.parametrize("name", ["gpt-oss-120b", "deepseek-v3"])
def test_cuda_w4a8_forced_fp8_dots_match_emulation(name, tokens, scheme):
    """moe_forward runs bf16 dots unless FP8 dots are forced: those must stay right too."""
    _check_cuda_layer(name, tokens, scheme, "fp8")


def _check_cuda_layer(name, tokens, scheme, mma):
    from backends.triton_moe import moe_forward

    ckpt, weights = _cuda_layer(name)
    x, route, scales = _cuda_inputs(name, tokens, scheme)
    out = moe_forward(x, weights, **route, act_quant=scheme, w4a8_mma=mma, **scales)
    fp8_dots = mma == "fp8"
    stats = _compare_w4a8(out, _reference(ckpt, x, route, scheme, scales, fp8_dots), scheme)
    print(json.dumps({"layer": name, "tokens": tokens, "scheme": scheme, "w4a8_mma": mma, **stats}))
    assert stats["shape_ok"] and stats["finite"], stats
    assert stats["rel_l2_ratio"] <= 1.0 and stats["elementwise_ratio"] <= 1.0, stats


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("name", ["gpt-oss-120b", "deepseek-v3"])
def test_cuda_w4a8_tensor_core_sums_stay_near_the_emulation(name, scheme, monkeypatch):
    from backends.triton_moe import moe_forward
    from backends.triton_moe.forward import FP8_ACCUMULATE_ENV
    from backends.triton_moe.testing import compare

    ckpt, weights = _cuda_layer(name)
    x, route, scales = _cuda_inputs(name, 1000, scheme)
    monkeypatch.setenv(FP8_ACCUMULATE_ENV, "tensor-core")
    out = moe_forward(x, weights, **route, act_quant=scheme, w4a8_mma="fp8", **scales)
    stats = compare(out, _reference(ckpt, x, route, scheme, scales, fp8_dots=True),
                    rel_l2_tol=tolerance("w4a8_tensor_core_sums_rel_l2")["rtol"], rtol=1.0, atol_rms_units=1e9)
    print(json.dumps({"layer": name, "scheme": scheme, **stats}))
    assert stats["shape_ok"] and stats["finite"] and stats["rel_l2_ratio"] <= 1.0, stats


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("scheme", SCHEMES)
def test_cuda_w4a8_graph_replay_gives_the_eager_bits(scheme):
    from backends.triton_moe import moe_forward

    _, weights = _cuda_layer("gpt-oss-120b")
    x, route, scales = _cuda_inputs("gpt-oss-120b", 256, scheme)
    eager = moe_forward(x, weights, **route, act_quant=scheme, **scales)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        moe_forward(x, weights, **route, act_quant=scheme, **scales)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = moe_forward(x, weights, **route, act_quant=scheme, **scales)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(eager.view(torch.int16), captured.view(torch.int16))


if __name__ == "__main__":  # the worker: TRITON_INTERPRET=1 is set by the fixture above
    import sys
    import traceback

    if sys.argv[1] == "act_quant":
        try:
            for quant_row in _act_quant_rows():
                print(json.dumps(quant_row), flush=True)
        except Exception:  # noqa: BLE001
            for quant_case in ("act_quant-static", "act_quant-mxfp8", "act_quant-mxfp8-bf16-values",
                               "act_quant-static-bf16-values"):
                print(json.dumps({"case": quant_case, "error": traceback.format_exc()[-3000:]}), flush=True)
        try:
            from triton_moe_scale_probe import mx_warp_block_mismatches

            print(json.dumps({"case": "mx-values-by-warp", "mismatches": mx_warp_block_mismatches("cpu")}), flush=True)
        except Exception:  # noqa: BLE001
            print(json.dumps({"case": "mx-values-by-warp", "error": traceback.format_exc()[-3000:]}), flush=True)
    for case_name, case_spec in CASES.items():
        if "-".join(filter(None, (case_spec[0], case_spec[11]))) != sys.argv[1]:
            continue
        try:
            result = _run_case(case_spec)
        except Exception:  # noqa: BLE001  report and keep going: each test shows its own case's failure
            result = {"error": traceback.format_exc()[-3000:]}
        print(json.dumps({"case": case_name, **result}), flush=True)
