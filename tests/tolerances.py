"""The one table of numeric tolerances used by the tests, each with the numerics that justify it.

Every comparison of two floating results in `tests/` reads its (rtol, atol) from here, so a
tolerance is argued once, next to the format it comes from, and never loosened in one test only.
"""

from __future__ import annotations

#: name -> dict(rtol=..., atol=...) suitable for ``torch.testing.assert_close(**TOLERANCES[name])``.
TOLERANCES: dict[str, dict[str, float]] = {
    # Two fp32 implementations of the same math that differ only in summation order (batched vs
    # per-token matmuls, index_add order): a few fp32 ulps of O(1..10) outputs. 1e-4 is ~1000 ulps of
    # headroom and still far below the ~1e-1 change a wrong gate/up split, clamp, bias or weight makes.
    "fp32_reordered": dict(rtol=1e-4, atol=1e-4),
    # A bf16 output of an fp32 computation: one rounding, at most half a bf16 ulp = 2^-9 relative;
    # rtol 2^-8 doubles it, atol covers outputs that cancel to near zero.
    "bf16_output_of_fp32": dict(rtol=2**-8, atol=1e-3),
    # Bit-exact: layout conversions, packing, round trips.
    "exact": dict(rtol=0.0, atol=0.0),
    # W4A16 kernels (backends.triton_moe) vs the fp32 emulation. FP4 x block scale and bf16 x are exact
    # in bf16, the MMAs accumulate in fp32, so only two roundings differ from the reference: the
    # activation h stored as bf16 for GEMM2 and the bf16 output, each a relative RMS error of about
    # 2^-8/sqrt(3) (~1.7e-3 measured per rounding), together ~2.4e-3 of the output norm (the kernels
    # match the emulation bit for bit when it rounds at the same two points). rtol bounds the
    # relative L2 error ||out - ref|| / ||ref|| at 1e-2 (4x headroom; a wrong scale, clamp, bias or
    # gate/up split gives > 1e-1).
    "w4a16_moe_rel_l2": dict(rtol=1e-2, atol=0.0),
    # Same comparison element by element: the error of one output is ~N(0, (2.4e-3 rms)^2), rms being
    # that token's output RMS (its error scales with its own activations), so the largest of 10^7
    # outputs sits near 6 sigma = 1.5e-2 rms. atol is in units of the reference row's RMS (scale it
    # before use): 2^-5 = 3.1e-2, 13 sigma; rtol 2^-6 covers large outputs.
    "w4a16_moe_elementwise_rms_units": dict(rtol=2**-6, atol=2**-5),
    # W4A8 kernels (backends.triton_moe, act_quant) vs the emulation with fp8_operands=True: both multiply the same
    # E4M3 operands (weights rebased per row, activations quantized alike), every product exact in fp32, so only the
    # fp32 summation order differs (and, on Hopper, the FP8 tensor cores' accumulation, which keeps fewer bits
    # than fp32 between its K=32 steps; under the interpreter the kernels match the emulation bit for bit). That
    # order can move an fp32 sum across an E4M3 rounding boundary of h (GEMM2's FP8 input): such an h element
    # changes by one E4M3 ulp (2^-3 relative), and across a bf16 boundary of the output (2^-8). Flips are rare
    # (an fp32 reordering error of ~1e-6 relative against an E4M3 step of ~6e-2), so the relative L2 bound is 5e-3:
    # far above a few flips, far below the ~3e-2 that the FP8 quantization itself costs (vs W4A16), which a wrong
    # scale, rebase or K order would exceed many times over.
    "w4a8_moe_rel_l2": dict(rtol=5e-3, atol=0.0),
    # Same element by element, atol in units of the reference's RMS: one flipped h element moves an output by its
    # weight times an E4M3 ulp of h; 2^-4 rms (and rtol 2^-5) bounds that with room and still fails a wrong tile.
    "w4a8_moe_elementwise_rms_units": dict(rtol=2**-5, atol=2**-4),
    # MOE_ORACLE_TRITON_FP8_ACCUMULATE=tensor-core: all of K summed in the Hopper FP8 tensor core's own accumulator,
    # which keeps fewer bits than fp32 (the error grows with K): measured 5.8e-3 / 8.3e-3 relative L2 at K = 2880
    # (gpt-oss-120b, static / MXFP8) and 9.2e-3 / 1.9e-2 at K = 7168 (DeepSeek-V3) against the fp32-summed emulation
    # on an H100 (benchmarks/results/w4a8-lut-h100-2026-11-27/pytest-tensor-core.txt). 4e-2 is twice the largest
    # and still 25x below what a wrong scale, rebase or K order costs (O(1)).
    "w4a8_tensor_core_sums_rel_l2": dict(rtol=4e-2, atol=0.0),
    # act_quant 'mxfp8' element by element: an MXFP8 block's scale is a step function of its amax (floor(log2)), and
    # values in [448, 512) of the scaled block saturate to 448. When an fp32 reordering moves a block's amax across
    # a power of two, the block's largest element moves by up to 1 - 448/512 = 2^-3 of itself, and with heavy-tailed
    # h (an outlier input channel through SiLU) that one element can carry a third of an output: measured 0.34 rms
    # on the DeepSeek-V3 layer of an H100 (rel L2 stayed at 4e-3, under w4a8_moe_rel_l2), and the emulation alone
    # moves by 0.19 rms when its fp32 activations are perturbed by 1e-4 relative. Hence 2^-1 rms and rtol 2^-3.
    "w4a8_mxfp8_moe_elementwise_rms_units": dict(rtol=2**-3, atol=2**-1),
    # A checkpoint's NVFP4 weight_scale_2 is the reciprocal of the layer's global scale: writing 1/s and reading
    # 1/(1/s) rounds twice, each correctly rounded (half an fp32 ulp, 2^-24 relative), so 2^-23 bounds both.
    "fp32_reciprocals": dict(rtol=2**-23, atol=0.0),
    # One rounding of a positive normal value to FP8 E4M3 (3 mantissa bits): at most half an ulp, 2^-4 relative.
    "e4m3_one_rounding": dict(rtol=2**-4, atol=0.0),
}


def tolerance(name: str) -> dict[str, float]:
    """The (rtol, atol) pair named `name`; a KeyError lists the known names."""
    try:
        return dict(TOLERANCES[name])
    except KeyError:
        raise KeyError(f"unknown tolerance {name!r}; known: {sorted(TOLERANCES)}") from None


def w4a16_vs_emulation(out, ref) -> dict:
    """backends.triton_moe.testing.compare of a W4A16 layer's output with the emulation's, at the W4A16 MoE
    tolerances (relative L2 and elementwise in RMS units): the stats, each *_ratio <= 1 when within them."""
    from backends.triton_moe.testing import compare

    elementwise = tolerance("w4a16_moe_elementwise_rms_units")
    return compare(out, ref, rel_l2_tol=tolerance("w4a16_moe_rel_l2")["rtol"], rtol=elementwise["rtol"],
                   atol_rms_units=elementwise["atol"])
