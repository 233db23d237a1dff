"""Quark OCP-MX MoE layer (backends.quark): parameters per scheme, the seed's errors, static-scale processing,
and end-to-end forward of every emulated scheme against an fp32 per-token reference written here."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from backends import formats
from backends.layer import LayerUnavailableError
from backends.quark import QuarkOCPMXMoE, normalize_e4m3fn_to_e4m3fnuz, scheme_formats

from conftest import requires_cuda
from tolerances import tolerance

CPU = {"kind": "cpu"}
NO_PACKAGES = {"triton_kernels": False, "flashinfer": False, "deep_gemm": False, "aiter": False}
E, H, I, TOP_K = 4, 64, 96, 2  # noqa: E741 - I=96 is rounded to 128 on CPU (the rules' 64 alignment): padding is exercised

#: scheme -> (weight dtype, input dtype, is_dynamic) as a Quark checkpoint writes them
SCHEMES = {
    "w_mxfp4": ("fp4", None, None),
    "w_mxfp4_a_mxfp4": ("fp4", "fp4", True),
    "w_mxfp4_a_fp8": ("fp4", "fp8_e4m3", False),
    "w_mxfp4_a_mxfp6_e3m2": ("fp4", "fp6_e3m2", True),
    "w_mxfp4_a_mxfp6_e2m3": ("fp4", "fp6_e2m3", True),
    "w_mxfp6_e3m2": ("fp6_e3m2", None, None),
    "w_mxfp6_e2m3": ("fp6_e2m3", None, None),
    "w_mxfp6_e2m3_a_mxfp6_e2m3": ("fp6_e2m3", "fp6_e2m3", True),
    "w_mxfp6_e3m2_a_mxfp6_e3m2": ("fp6_e3m2", "fp6_e3m2", True),
    "w_mxfp6_e3m2_a_fp8": ("fp6_e3m2", "fp8_e4m3", False),
    "w_mxfp6_e2m3_a_fp8": ("fp6_e2m3", "fp8_e4m3", False),
}  # every OCP_MX_Scheme (vllm-oracle reference §6.1)


def quant_config(weight, inp=None, is_dynamic=None, qscheme="per_group"):
    config = {"weight": {"dtype": weight, "qscheme": qscheme, "group_size": 32, "scale_format": "e8m0"},
              "input_tensors": None}
    if inp is not None:
        config["input_tensors"] = {"dtype": inp, "is_dynamic": is_dynamic, "qscheme": "per_group", "group_size": 32}
    return config


def make(scheme, *, platform=CPU, has_bias=False, profile="vllm-0.20", **kw):
    """A layer under the seed's profile (vLLM 0.20.0: everything emulates on CPU, I rounded to 64)."""
    return QuarkOCPMXMoE.create(quant_config(*SCHEMES[scheme]), E, H, I, top_k=TOP_K, platform=platform,
                                packages=NO_PACKAGES, env={}, has_bias=has_bias, profile=profile, **kw)


# ---------------------------------------------------------------------- parameters and errors
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_parameters_follow_the_scheme_at_the_rounded_sizes(scheme):
    layer = make(scheme, has_bias=True)
    assert (layer.scheme, layer.decision.backend, layer.emulate) == (scheme, "EMULATION", True)
    h, i = layer.padded_hidden_size, layer.padded_intermediate_size
    assert (h, i) == (layer.decision.hidden_size, layer.decision.intermediate_size) == (64, 128)
    weight = scheme.split("_a_")[0]
    packed = (lambda k: k // 2) if weight == "w_mxfp4" else (lambda k: 3 * k // 4)
    expected = {"w13_weight": ((E, 2 * i, packed(h)), torch.uint8), "w13_weight_scale": ((E, 2 * i, h // 32),
                torch.uint8), "w2_weight": ((E, h, packed(i)), torch.uint8), "w2_weight_scale": ((E, h, i // 32),
                torch.uint8), "w13_bias": ((E, 2 * i), torch.float32), "w2_bias": ((E, h), torch.float32)}
    if SCHEMES[scheme][2] is False:  # static fp8 input scales, one per expert
        expected.update(w13_input_scale=((E,), torch.float32), w2_input_scale=((E,), torch.float32))
    assert {n: (tuple(p.shape), p.dtype) for n, p in layer.params.items()} == expected


def test_rocm_rounding_comes_from_the_decision():
    """ROCm without an oracle backend rounds both sizes to 256 (vLLM's NONE row of the rounding table)."""
    layer = QuarkOCPMXMoE.create(quant_config("fp4"), E, 2880, 736, top_k=TOP_K,
                                 platform={"kind": "rocm", "gcn_arch": "gfx942"}, packages=NO_PACKAGES, env={},
                                 profile="vllm-0.20")
    assert (layer.padded_hidden_size, layer.padded_intermediate_size) == (3072, 768)
    assert layer.params["w13_weight"].shape == (E, 2 * 768, 3072 // 2)


@pytest.mark.parametrize("config, kind, words", [
    (quant_config("fp4", qscheme="per_tensor"), ValueError, "per-group weight scales"),
    (quant_config("fp4", "fp4", is_dynamic=False), NotImplementedError, "static input scales"),
    (quant_config("fp6_e3m2", "fp6_e3m2", is_dynamic=False), NotImplementedError, "static input scales"),
    (quant_config("fp4", "fp8_e4m3", is_dynamic=True), NotImplementedError, "dynamic input scales"),
    (quant_config("fp6_e3m2", "fp6_e2m3", is_dynamic=True), ValueError, "Unsupported OCP MX dtype combination"),
    (quant_config("fp4", "int8", is_dynamic=True), NotImplementedError, "not compatible"),
])
@pytest.mark.parametrize("profile", ["vllm-0.20", "moe-oracle"])
def test_the_seeds_errors(config, kind, words, profile):
    with pytest.raises(kind, match=words):
        QuarkOCPMXMoE.create(config, E, H, I, top_k=TOP_K, platform=CPU, packages=NO_PACKAGES, env={},
                             profile=profile)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="hidden_size=48 must be a multiple of 32"):
        QuarkOCPMXMoE.create(quant_config("fp4"), E, 48, I, top_k=TOP_K, platform=CPU)
    with pytest.raises(TypeError, match="'weight' mapping"):
        QuarkOCPMXMoE.create({"input_tensors": None}, E, H, I, top_k=TOP_K, platform=CPU)
    layer = make("w_mxfp4")
    with pytest.raises(ValueError, match=r"w2_weight must be torch.uint8 of shape \(4, 64, 48\)"):
        layer.load_weights({"w2_weight": torch.zeros(E, H, 64, dtype=torch.uint8)})
    with pytest.raises(KeyError, match="w13_input_scale"):
        layer.load_weights({"w13_input_scale": torch.ones(E)})
    with pytest.raises(RuntimeError, match="process_weights_after_loading"):
        layer.forward(torch.zeros(1, H), torch.zeros(1, E))


def test_native_mx_without_a_runner_answers_with_the_decision():
    """gfx950 w_mxfp4_a_mxfp4: no emulation and backend NONE (vLLM's legacy AITER path); not runnable here."""
    layer = QuarkOCPMXMoE.create(quant_config("fp4", "fp4", True), E, H, I, top_k=TOP_K,
                                 platform={"kind": "rocm", "gcn_arch": "gfx950"}, packages=NO_PACKAGES, env={},
                                 profile="vllm-0.20")
    assert (layer.emulate, layer.decision.outcome) == (False, "none")
    with pytest.raises(LayerUnavailableError, match="selects no backend"):
        layer.process_weights_after_loading()


def test_this_projects_profile_runs_weight_only_mxfp4_on_its_w4a16_selector():
    """Default profile moe-oracle: w_mxfp4 is a W4A16 layer (TRITON_MOE where Triton runs, padded by the rules),
    every other scheme emulates."""
    config = quant_config(*SCHEMES["w_mxfp4"])
    plain = QuarkOCPMXMoE.create(config, E, H, I, top_k=TOP_K, platform=CPU, packages={"triton": False}, env={})
    assert (plain.decision.profile, plain.decision.backend, plain.emulate) == ("moe-oracle", "EMULATION", False)
    triton = QuarkOCPMXMoE.create(config, E, H, I, top_k=TOP_K, platform={"kind": "cuda", "capability": [9, 0]},
                                  packages={"triton": True}, env={}, device="cpu")
    assert (triton.decision.backend, triton.decision.converter) == ("TRITON_MOE", "backends.layouts.triton_moe:converter")
    assert triton.padded_intermediate_size == triton.decision.intermediate_size == 128
    with pytest.raises(ValueError, match="chosen for platform 'cuda' but the layer is on cpu"):
        triton.process_weights_after_loading()
    emulated = QuarkOCPMXMoE.create(quant_config(*SCHEMES["w_mxfp4_a_mxfp4"]), E, H, I, top_k=TOP_K, platform=CPU,
                                    packages={"triton": True}, env={"TRITON_INTERPRET": "1"})
    assert (emulated.decision.backend, emulated.emulate) == ("EMULATION", True)


_INTERPRETED_RUN = """
import json, sys, torch
sys.path.insert(0, "tests")
import test_quark as t
gen = torch.Generator().manual_seed(7)
layer = t.QuarkOCPMXMoE.create(t.quant_config("fp4"), t.E, t.H, t.I, top_k=t.TOP_K, platform=t.CPU,
                               packages={"triton": True}, env={"TRITON_INTERPRET": "1"}, activation="swigluoai",
                               gate_up="interleaved", has_bias=True)
ckpt = t._random_checkpoint("mxfp4", gen, True)
layer.load_weights(ckpt)
layer.process_weights_after_loading()
x, logits = torch.randn(5, t.H, generator=gen), torch.randn(5, t.E, generator=gen)
out = layer.forward(x.bfloat16(), logits).float()
ref = t._reference(ckpt, "mxfp4", None, x.bfloat16().float(), logits, "swigluoai", "interleaved")
print(json.dumps({"backend": layer.decision.backend, "padded": layer.padded_intermediate_size,
                  "shape": list(out.shape), "rel_l2": float((out - ref).norm() / ref.norm())}))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_w_mxfp4_runs_the_triton_kernels_under_the_interpreter():
    """TRITON_INTERPRET=1 is read when triton is first imported, hence a subprocess: the layer converts its padded
    parameters through MoELayer's machinery and the Triton kernels match the fp32 reference (W4A16 tolerance)."""
    proc = subprocess.run([sys.executable, "-c", _INTERPRETED_RUN], cwd=Path(__file__).parent.parent,
                          env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads(proc.stdout.splitlines()[-1])
    assert (row["backend"], row["padded"], row["shape"]) == ("TRITON_MOE", 128, [5, H])
    assert row["rel_l2"] <= tolerance("w4a16_moe_rel_l2")["rtol"], row


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("activation, gate_up, has_bias", [("swigluoai", "interleaved", True),
                                                          ("silu", "contiguous", False)])
def test_w_mxfp4_on_the_gpu_runs_the_triton_kernels(activation, gate_up, has_bias):
    """Issue 15 item 6: a w_mxfp4 layer on CUDA, detected platform, default profile: the rules pick TRITON_MOE and
    the converted, padded layer matches the fp32 reference within the W4A16 tolerance."""
    gen = torch.Generator().manual_seed(11)
    layer = QuarkOCPMXMoE.create(quant_config("fp4"), E, H, I, top_k=TOP_K, device="cuda", activation=activation,
                                 gate_up=gate_up, has_bias=has_bias)
    assert (layer.decision.profile, layer.decision.backend) == ("moe-oracle", "TRITON_MOE")
    ckpt = _random_checkpoint("mxfp4", gen, has_bias)
    layer.load_weights({name: t.cuda() for name, t in ckpt.items()})
    layer.process_weights_after_loading()
    x, logits = torch.randn(33, H, generator=gen), torch.randn(33, E, generator=gen)
    out = layer.forward(x.bfloat16().cuda(), logits.cuda()).float().cpu()
    ref = _reference(ckpt, "mxfp4", None, x.bfloat16().float(), logits, activation, gate_up)
    assert out.shape == (33, H)
    assert float((out - ref).norm() / ref.norm()) <= tolerance("w4a16_moe_rel_l2")["rtol"]


def test_a_kernel_this_project_cannot_run_still_answers_with_the_full_decision():
    """gfx950 w_mxfp4 under vLLM 0.20: OAI Triton, monolithic first in the rules' order; parameters exist at
    the rounded sizes, and post-processing says it is not runnable here and which profile is."""
    layer = QuarkOCPMXMoE.create(quant_config("fp4"), E, 2880, 2880, top_k=TOP_K, activation="swigluoai",
                                 gate_up="interleaved", platform={"kind": "rocm", "gcn_arch": "gfx950"},
                                 packages={"triton_kernels": True}, env={}, profile="vllm-0.20")
    assert layer.params["w13_weight"].shape == (E, 2 * 3072, 3072 // 2)
    variants = layer.kernel_variants()
    assert (variants["backend"], variants["kernel"], variants["monolithic"]) == (
        "TRITON", "OAITritonMxfp4ExpertsMonolithic", True)
    assert [v["monolithic"] for v in variants["variants"]] == [True, False]
    with pytest.raises(LayerUnavailableError, match="cannot run.*Runnable instead: .*profile='moe-oracle'"):
        layer.process_weights_after_loading()


# ---------------------------------------------------------------------- static input scales
def test_static_scales_reduce_to_the_max_with_a_warning(caplog):
    layer = make("w_mxfp4_a_fp8")
    layer.load_weights({"w13_input_scale": torch.tensor([0.5, 0.25, 0.75, 0.5]), "w2_input_scale": torch.full((E,), 2.0)})
    with caplog.at_level(logging.WARNING):
        layer.process_weights_after_loading()
    assert layer.params["w13_input_scale"].item() == 0.75 and layer.params["w2_input_scale"].item() == 2.0
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "w13_input_scale" in warned[0] and "differ" in warned[0]


def test_static_scales_are_doubled_on_fnuz_platforms():
    layer = QuarkOCPMXMoE.create(quant_config("fp4", "fp8_e4m3", False), E, H, I, top_k=TOP_K,
                                 platform={"kind": "rocm", "gcn_arch": "gfx942"}, packages=NO_PACKAGES, env={},
                                 profile="vllm-0.20")
    layer.load_weights({"w13_input_scale": torch.full((E,), 0.5), "w2_input_scale": torch.full((E,), 3.0)})
    layer.process_weights_after_loading()
    assert layer.params["w13_input_scale"].item() == 1.0 and layer.params["w2_input_scale"].item() == 6.0


def test_missing_static_scales_are_the_seeds_error():
    layer = make("w_mxfp4_a_fp8")
    with pytest.raises(ValueError, match="found activation scales are None"):
        layer.process_weights_after_loading()


def test_e4m3fn_to_fnuz_keeps_every_value():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    finite = ~torch.isnan(codes.float())
    values, scale = normalize_e4m3fn_to_e4m3fnuz(codes, torch.tensor(0.375))
    assert values.dtype == torch.float8_e4m3fnuz and scale.item() == 0.75
    torch.testing.assert_close(values.float()[finite] * scale, codes.float()[finite] * 0.375, **tolerance("exact"))
    assert not torch.isnan(values.float()[finite]).any()  # -0 (0x80) is NaN in fnuz: it must become +0


# ---------------------------------------------------------------------- forward vs an fp32 reference
def _random_checkpoint(weight_format, gen, has_bias):
    """Unpadded checkpoint tensors (vLLM names) quantized from random fp32 weights with backends.formats."""
    def quantize(w):
        if weight_format == "mxfp4":
            return formats.quantize_mxfp4(w)
        return formats.quantize_mxfp6(w, kind=weight_format.split("_")[1])
    w13, w13_scale = quantize(torch.randn(E, 2 * I, H, generator=gen) * 0.2)
    w2, w2_scale = quantize(torch.randn(E, H, I, generator=gen) * 0.2)
    ckpt = {"w13_weight": w13, "w13_weight_scale": w13_scale, "w2_weight": w2, "w2_weight_scale": w2_scale}
    if has_bias:
        ckpt.update(w13_bias=torch.randn(E, 2 * I, generator=gen) * 0.1, w2_bias=torch.randn(E, H, generator=gen) * 0.1)
    return ckpt


def _dequantize(weight_format, packed, scales):
    if weight_format == "mxfp4":
        return formats.dequantize_mxfp4(packed, scales)
    return formats.dequantize_mxfp6(packed, scales, kind=weight_format.split("_")[1])


def _fp8_per_tensor(x, scale):
    """FP8 E4M3 with one scale (vLLM's scaled_fp8_quant): code = e4m3(clamp(x * (1/scale), +-448)), value = code
    * scale."""
    return (x * (1.0 / scale)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * scale


def _qdq(x, act, scale=None):
    """One GEMM input's fake quantization: MX formats per 32 along the last dim, FP8 per tensor with the given
    (static) scale or amax/448 of this x (dynamic)."""
    if act is None:
        return x
    if act == "fp8_per_tensor_static":
        return _fp8_per_tensor(x, scale)
    if act == "fp8_per_tensor_dynamic":
        return _fp8_per_tensor(x, x.abs().max() / 448.0)
    if act == "mxfp8":
        return formats.dequantize_mxfp8(*formats.quantize_mxfp8(x))
    if act == "mxfp4":
        return formats.dequantize_mxfp4(*formats.quantize_mxfp4(x))
    kind = act.split("_")[1]
    return formats.dequantize_mxfp6(*formats.quantize_mxfp6(x, kind=kind), kind=kind)


def _reference(ckpt, weight_format, inputs, x, logits, activation, gate_up, scales=(None, None)):
    """fp32 MoE on the unpadded checkpoint: top-k of logits, softmax over the k, gated MLP, token by token.

    inputs: the (gemm1, gemm2) input fake quantization, or one scheme for both; scales: the static (a1, a2).
    A per-tensor input is quantized as one tensor: x over all tokens, the GEMM2 input over all routed rows."""
    gemm1, gemm2 = inputs if isinstance(inputs, tuple) else (inputs, inputs)
    w13 = _dequantize(weight_format, ckpt["w13_weight"], ckpt["w13_weight_scale"])
    w2 = _dequantize(weight_format, ckpt["w2_weight"], ckpt["w2_weight_scale"])
    xq = _qdq(x.float(), gemm1, scales[0])
    routed = []  # (token, routing weight, expert, GEMM2 input)
    for t in range(x.shape[0]):
        top, ids = torch.topk(logits[t].float(), TOP_K)
        for weight, e in zip(torch.softmax(top, -1).tolist(), ids.tolist(), strict=True):
            h = xq[t:t + 1] @ w13[e].T + (ckpt["w13_bias"][e] if "w13_bias" in ckpt else 0)
            gate, up = (h[:, 0::2], h[:, 1::2]) if gate_up == "interleaved" else (h[:, :I], h[:, I:])
            if activation == "silu":
                a = F.silu(gate) * up
            else:  # swigluoai, gpt-oss constants
                gate, up = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
                a = (up + 1.0) * gate * torch.sigmoid(1.702 * gate)
            routed.append((t, weight, e, a))
    a2 = scales[1]
    if gemm2 == "fp8_per_tensor_dynamic":
        a2 = max(a.abs().max() for *_, a in routed) / 448.0
        gemm2 = "fp8_per_tensor_static"
    out = torch.zeros(x.shape[0], H)
    for t, weight, e, a in routed:
        y = _qdq(a, gemm2, a2) @ w2[e].T + (ckpt["w2_bias"][e] if "w2_bias" in ckpt else 0)
        out[t] += weight * y[0]
    return out


_FORWARD_CASES = [
    ("w_mxfp4", "swigluoai", "interleaved", True),
    ("w_mxfp4", "silu", "contiguous", False),
    ("w_mxfp4_a_mxfp4", "silu", "contiguous", True),
    ("w_mxfp4_a_fp8", "silu", "contiguous", False),
    ("w_mxfp4_a_mxfp6_e3m2", "silu", "contiguous", False),
    ("w_mxfp6_e3m2", "silu", "contiguous", True),
    ("w_mxfp6_e2m3", "swigluoai", "interleaved", False),
    ("w_mxfp6_e2m3_a_mxfp6_e2m3", "silu", "contiguous", False),
]
#: vLLM 0.20.0 builds no quant config for weight-only MXFP6 (an assertion fails in ocp_mx_moe_quant_config): its
#: profile refuses them at post-processing (tests/test_quark_quant_config.py); this project's profile runs them
_VLLM_020_BUILDS_NONE = ("w_mxfp6_e3m2", "w_mxfp6_e2m3")


#: vLLM 0.20.0's emulation of w_mxfp4_a_fp8 fails at forward (the second GEMM's input as 'mxfp8': NotImplementedError,
#: tests below); 0.33 and this project's profile quantize both GEMM inputs to FP8 per tensor with the static scales
_VLLM_020_FAILS_AT_FORWARD = ("w_mxfp4_a_fp8",)
#: static FP8 input scales (a1, a2): powers of two, so x / s and x * (1/s) agree; a2 = 2^-6 saturates the GEMM2 input
#: (|act| up to ~10 > 448 / 64 = 7) so the clamp is exercised
STATIC_SCALES = (2.0**-5, 2.0**-6)


def _expected_inputs(scheme, profile):
    """(gemm1, gemm2) input fake quantization of the emulation: the scheme's MX format on both, FP8 per tensor
    with the static scales for a_fp8 (vLLM 0.33's TritonExperts.apply); vLLM 0.20.0 leaves the second GEMM's input
    of MXFP6-activation schemes unquantized (its experts' quant_dtype 'mxfp6' matches no quantizer)."""
    act = scheme_formats(scheme)[1]
    if act == "fp8":
        return ("fp8_per_tensor_static",) * 2
    if profile == "vllm-0.20" and act is not None and act.startswith("mxfp6"):
        return (act, None)
    return (act, act)


def _load_and_process(layer, ckpt, scales=STATIC_SCALES):
    load = dict(ckpt)
    if layer.static_input_scales:  # per expert in the checkpoint: the layer keeps their max
        load.update(w13_input_scale=torch.tensor([scales[0] / 2, scales[0], scales[0] / 4, scales[0]]),
                    w2_input_scale=torch.full((E,), scales[1]))
    layer.load_weights(load)
    layer.process_weights_after_loading()
    return layer


@pytest.mark.parametrize("scheme, activation, gate_up, has_bias, profile", [
    (*case, profile) for profile in ("vllm-0.20", "moe-oracle") for case in _FORWARD_CASES
    if not (profile == "vllm-0.20" and case[0] in _VLLM_020_BUILDS_NONE + _VLLM_020_FAILS_AT_FORWARD)])
def test_forward_matches_the_fp32_reference(scheme, activation, gate_up, has_bias, profile):
    gen = torch.Generator().manual_seed(sum(map(ord, scheme + activation)))
    weight_format, act = scheme_formats(scheme)
    layer = make(scheme, has_bias=has_bias, activation=activation, gate_up=gate_up, profile=profile)
    inputs = _expected_inputs(scheme, profile)
    assert (layer.weight_format, layer.activation_scheme) == (weight_format, act)
    assert (layer.emulated_inputs.gemm1, layer.emulated_inputs.gemm2) == inputs
    ckpt = _random_checkpoint(weight_format, gen, has_bias)
    _load_and_process(layer, ckpt)
    x, logits = torch.randn(12, H, generator=gen), torch.randn(12, E, generator=gen)
    y = layer.forward(x, logits)
    ref = _reference(ckpt, weight_format, inputs, x, logits, activation, gate_up, STATIC_SCALES)
    assert y.shape == (12, H) and ref.abs().max() > 0.1
    torch.testing.assert_close(y, ref, **tolerance("fp32_reordered"))
    y_bf16 = layer.forward(x.bfloat16(), logits)
    assert y_bf16.dtype == torch.bfloat16


def test_forward_takes_given_routing_and_names_bad_inputs():
    layer = make("w_mxfp4_a_mxfp4")
    gen = torch.Generator().manual_seed(3)
    layer.load_weights(_random_checkpoint("mxfp4", gen, False))
    layer.process_weights_after_loading()
    x, logits = torch.randn(6, H, generator=gen), torch.randn(6, E, generator=gen)
    top, ids = torch.topk(logits, TOP_K)
    routed = layer.forward(x, topk_ids=ids, topk_weights=torch.softmax(top, -1))
    torch.testing.assert_close(routed, layer.forward(x, logits), **tolerance("fp32_reordered"))
    with pytest.raises(ValueError, match=r"QuarkOCPMXMoE: x.shape=\(6, 128\) must be \(T, 64\)"):
        layer.forward(torch.zeros(6, 128), logits)
    with pytest.raises(TypeError, match="x.dtype=torch.int64"):
        layer.forward(torch.zeros(6, H, dtype=torch.long), logits)


def test_this_projects_ocp_mx_checks_are_vllm_020s_word_for_word():
    """rules/moe-oracle/ocp-mx.yaml repeats vLLM 0.20.0's check steps (its policy differs only after them)."""
    import yaml

    rules = Path(__file__).parent.parent / "rules"

    def steps(path):
        return yaml.safe_load((rules / path).read_text())["policies"]["ocp-mx"]["steps"]

    seed, ours = steps("vllm-0.20/ocp-mx.yaml"), steps("moe-oracle/ocp-mx.yaml")
    checks = next(n for n, s in enumerate(seed) if s["id"] == "answer-fields") + 1
    assert ours[:checks] == seed[:checks]


# ---------------------------------------------------------------------- FP8 inputs: what each vLLM version runs
def _fp8_layer_and_inputs(profile, oracle=None, scales=STATIC_SCALES):
    gen = torch.Generator().manual_seed(23)
    layer = QuarkOCPMXMoE.create(quant_config(*SCHEMES["w_mxfp4_a_fp8"]), E, H, I, top_k=TOP_K, platform=CPU,
                                 packages=NO_PACKAGES, env={}, profile=profile, oracle=oracle)
    ckpt = _random_checkpoint("mxfp4", gen, False)
    _load_and_process(layer, ckpt, scales)
    return layer, ckpt, torch.randn(9, H, generator=gen), torch.randn(9, E, generator=gen)


def test_fp8_inputs_take_the_static_scales_per_tensor():
    """moe-oracle (vLLM 0.33's numerics): both GEMM inputs FP8 per tensor with the processed a1/a2; neither MXFP8
    nor other scales give the same output."""
    layer, ckpt, x, logits = _fp8_layer_and_inputs("moe-oracle")
    y = layer.forward(x, logits)
    per_tensor = ("fp8_per_tensor_static",) * 2
    torch.testing.assert_close(y, _reference(ckpt, "mxfp4", per_tensor, x, logits, "silu", "contiguous",
                                             STATIC_SCALES), **tolerance("fp32_reordered"))
    for other in (_reference(ckpt, "mxfp4", "mxfp8", x, logits, "silu", "contiguous"),
                  _reference(ckpt, "mxfp4", per_tensor, x, logits, "silu", "contiguous", (0.03, 0.03))):
        assert (y - other).abs().max() > 1e-2


def test_vllm_020_fp8_inputs_fail_at_forward_as_vllm_does():
    """vLLM 0.20.0 builds the w4a8 config, then its emulation refuses the second GEMM's 'mxfp8' input."""
    layer, _, x, logits = _fp8_layer_and_inputs("vllm-0.20")
    assert (layer.quant_config["a1_scale"].item(), layer.quant_config["a2_scale"].item()) == STATIC_SCALES
    with pytest.raises(NotImplementedError, match=r"w_mxfp4_a_fp8 under profile 'vllm-0.20'.*quant_dtype=mxfp8.*"
                                                  r"Profile 'moe-oracle' builds it"):
        layer.forward(x, logits)


def test_vllm_020_first_gemm_input_is_fp8_per_tensor_dynamic(tmp_path):
    """Give 0.20's kind a runnable second input (dynamic too): the first input is then FP8 per tensor with
    amax/448 of the whole batch, and the checkpoint's static scales change nothing."""
    import shutil

    from oracle import Oracle

    rules = tmp_path / "rules"
    shutil.copytree(Path(__file__).parent.parent / "rules", rules)
    path = rules / "common" / "mxfp4.yaml"
    text = path.read_text()
    start = text.index("gemm2: mxfp8, not_implemented: ")
    end = text.index('"}', start) + 1
    path.write_text(text[:start] + "gemm2: fp8_per_tensor_dynamic" + text[end:])
    edited = Oracle(rules)
    layer, ckpt, x, logits = _fp8_layer_and_inputs("vllm-0.20", edited)
    other_scales, *_ = _fp8_layer_and_inputs("vllm-0.20", edited, scales=(0.5, 0.25))
    y = layer.forward(x, logits)
    dynamic = ("fp8_per_tensor_dynamic",) * 2
    torch.testing.assert_close(y, _reference(ckpt, "mxfp4", dynamic, x, logits, "silu", "contiguous"),
                               **tolerance("fp32_reordered"))
    torch.testing.assert_close(other_scales.forward(x, logits), y, **tolerance("exact"))
    static = _reference(ckpt, "mxfp4", ("fp8_per_tensor_static",) * 2, x, logits, "silu", "contiguous",
                        STATIC_SCALES)
    assert (y - static).abs().max() > 1e-2
