"""FP8 E4M3 per-tensor fake quantization (backends.formats, vLLM's scaled_fp8_quant) with hand-derived values, and
the emulation's per-GEMM input schemes that use it."""

from __future__ import annotations

import pytest
import torch

from backends import emulation, formats

from tolerances import tolerance

EXACT = tolerance("exact")


def test_dynamic_scale_is_amax_over_448_and_codes_round_to_nearest_even():
    # amax 7 -> scale 7/448 = 2^-6; x * 64 = [224, -448, 19.2, 0]: 224 and 448 are E4M3 values, 19.2 lies in
    # [16, 32) where the step is 2, so it rounds to 20 -> 20/64 = 0.3125
    x = torch.tensor([[3.5, -7.0, 0.3, 0.0]])
    data, scale = formats.quantize_fp8_per_tensor(x)
    torch.testing.assert_close(scale, torch.tensor([2.0**-6]), **EXACT)
    torch.testing.assert_close(data.float(), torch.tensor([[224.0, -448.0, 20.0, 0.0]]), **EXACT)
    torch.testing.assert_close(formats.qdq_fp8_per_tensor(x), torch.tensor([[3.5, -7.0, 0.3125, 0.0]]), **EXACT)


def test_static_scale_saturates_and_ties_go_to_even():
    # scale 1: 17 is halfway between 16 (mantissa 000) and 18 (001) -> 16; 19 between 18 (001) and 20 (010) -> 20;
    # 500 saturates to 448; scale 0.5: 300 / 0.5 = 600 -> 448 -> 224
    one = torch.tensor(1.0)
    torch.testing.assert_close(formats.qdq_fp8_per_tensor(torch.tensor([17.0, 19.0, 500.0, -500.0]), one),
                               torch.tensor([16.0, 20.0, 448.0, -448.0]), **EXACT)
    torch.testing.assert_close(formats.qdq_fp8_per_tensor(torch.tensor([300.0]), torch.tensor([0.5])),
                               torch.tensor([224.0]), **EXACT)


def test_fnuz_clamps_at_224_as_vllm_does():
    # e4m3fnuz: vLLM's bound is 224 (not torch's 240): amax 7 -> scale 7/224 = 2^-5; 7 * 32 = 224, -1 * 32 = -32
    x = torch.tensor([7.0, -1.0])
    data, scale = formats.quantize_fp8_per_tensor(x, fp8_dtype=torch.float8_e4m3fnuz)
    assert data.dtype == torch.float8_e4m3fnuz and scale.item() == 2.0**-5
    torch.testing.assert_close(formats.dequantize_fp8_per_tensor(data, scale), x, **EXACT)
    # static scale 1: 235 would round to 240 in fnuz, but the clamp at 224 comes first
    assert formats.qdq_fp8_per_tensor(torch.tensor([235.0]), torch.tensor(1.0),
                                      fp8_dtype=torch.float8_e4m3fnuz).item() == 224.0


def test_all_zero_input_gives_scale_zero_and_zeros():
    data, scale = formats.quantize_fp8_per_tensor(torch.zeros(2, 3))
    assert scale.item() == 0.0 and not torch.isnan(data.float()).any()
    torch.testing.assert_close(formats.dequantize_fp8_per_tensor(data, scale), torch.zeros(2, 3), **EXACT)


def test_keeps_dtype_and_names_bad_arguments():
    x = torch.tensor([1.0, 2.0]).bfloat16()
    assert formats.qdq_fp8_per_tensor(x).dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"quantize_fp8_per_tensor: scale must be one floating value"):
        formats.quantize_fp8_per_tensor(torch.ones(4), torch.ones(4))
    with pytest.raises(ValueError, match=r"fp8_dtype=torch.float8_e5m2 must be"):
        formats.quantize_fp8_per_tensor(torch.ones(4), fp8_dtype=torch.float8_e5m2)
    with pytest.raises(TypeError, match=r"dequantize_fp8_per_tensor: data.dtype=torch.float32"):
        formats.dequantize_fp8_per_tensor(torch.ones(4), torch.tensor(1.0))


# ---------------------------------------------------------------------- the emulation's per-GEMM input schemes
def _bf16_weights(experts=2, hidden=32, inter=32):
    gen = torch.Generator().manual_seed(0)
    return {"w13": torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.2, "w13_scale": None,
            "w2": torch.randn(experts, hidden, inter, generator=gen) * 0.2, "w2_scale": None, "format": "bf16",
            "activation": "silu", "gate_up_layout": "contiguous"}


def test_gemm1_static_per_tensor_input_is_the_fp8_grid():
    """The GEMM1 input the emulation uses is qdq(x, a1): the output equals the unquantized forward of the qdq'd x
    (bit for bit), and differs from the forward of x itself."""
    w = _bf16_weights()
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(1))
    ids, weights = torch.tensor([[0], [1], [0]]), torch.ones(3, 1)
    a1 = torch.tensor(2.0**-5)
    out = emulation.moe_forward(x, topk_ids=ids, topk_weights=weights, gemm_input_schemes=("fp8_per_tensor_static",
                                None), a1_scale=a1, **w)
    expected = emulation.moe_forward(formats.qdq_fp8_per_tensor(x, a1), topk_ids=ids, topk_weights=weights, **w)
    torch.testing.assert_close(out, expected, **EXACT)
    assert (out - emulation.moe_forward(x, topk_ids=ids, topk_weights=weights, **w)).abs().max() > 1e-3


def test_gemm_input_scheme_errors_are_named():
    w = _bf16_weights()
    x, ids, weights = torch.zeros(1, 32), torch.tensor([[0]]), torch.ones(1, 1)
    with pytest.raises(ValueError, match="a2_scale must be a one-element fp32 tensor"):
        emulation.moe_forward(x, topk_ids=ids, topk_weights=weights,
                              gemm_input_schemes=(None, "fp8_per_tensor_static"), **w)
    with pytest.raises(ValueError, match="not both"):
        emulation.moe_forward(x, topk_ids=ids, topk_weights=weights, activation_scheme="mxfp4",
                              gemm_input_schemes=("mxfp4", None), **w)
    with pytest.raises(ValueError, match=r"gemm2 input 'fp8x' must be one of"):
        emulation.moe_forward(x, topk_ids=ids, topk_weights=weights, gemm_input_schemes=(None, "fp8x"), **w)
