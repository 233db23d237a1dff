"""Quark OCP-MX quant config by scheme (the ocp-mx policy's `quant_config` in the rules), per profile.

The facts, from the installed vLLM sources (QuarkOCP_MX_MoEMethod.get_fused_moe_quant_config, vLLM 0.20.0
quark_moe.py:1351-1406 and 0.33.0 quark_moe.py:1881-1948): with the backend NONE or EMULATION the config is chosen
by scheme: w_mxfp4 -> mxfp4_w4a16 (BF16 activations), w_mxfp4_a_fp8 -> mxfp4_w4a8 with the layer's static input
scales as a1/a2, w_mxfp6_*_a_fp8 -> NotImplementedError, else ocp_mx_moe_quant_config(quant_dtype=input dtype,
weight_dtype) - which fails an assertion for weight-only MXFP6 (no input dtype) in both versions. Profile
moe-oracle builds every scheme on its emulation.
"""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch

from backends import formats
from backends.layouts.quant_config import build_layer_quant_config
from backends.quark import QuarkOCPMXMoE
from oracle import RuleError
from oracle.cli import main

from conftest import edited_rules

ROOT = Path(__file__).resolve().parent.parent
CPU = {"kind": "cpu"}
E, H, I, TOP_K = 4, 64, 96, 2  # noqa: E741

#: scheme -> (Quark weight dtype, input dtype) as a checkpoint writes them
DTYPES = {
    "w_mxfp4": ("fp4", None), "w_mxfp4_a_mxfp4": ("fp4", "fp4"), "w_mxfp4_a_fp8": ("fp4", "fp8_e4m3"),
    "w_mxfp4_a_mxfp6_e3m2": ("fp4", "fp6_e3m2"), "w_mxfp4_a_mxfp6_e2m3": ("fp4", "fp6_e2m3"),
    "w_mxfp6_e3m2": ("fp6_e3m2", None), "w_mxfp6_e2m3": ("fp6_e2m3", None),
    "w_mxfp6_e3m2_a_mxfp6_e3m2": ("fp6_e3m2", "fp6_e3m2"), "w_mxfp6_e2m3_a_mxfp6_e2m3": ("fp6_e2m3", "fp6_e2m3"),
    "w_mxfp6_e3m2_a_fp8": ("fp6_e3m2", "fp8_e4m3"), "w_mxfp6_e2m3_a_fp8": ("fp6_e2m3", "fp8_e4m3"),
}
#: scheme -> (weight, activation, static a1/a2) of the config vLLM builds on NONE/EMULATION (module docstring)
VLLM_CONFIG = {
    "w_mxfp4": ("mxfp4", None, False), "w_mxfp4_a_fp8": ("mxfp4", "fp8", True),
    "w_mxfp4_a_mxfp4": ("mxfp4", "mxfp4", False), "w_mxfp4_a_mxfp6_e3m2": ("mxfp4", "mxfp6_e3m2", False),
    "w_mxfp4_a_mxfp6_e2m3": ("mxfp4", "mxfp6_e2m3", False),
    "w_mxfp6_e3m2_a_mxfp6_e3m2": ("mxfp6_e3m2", "mxfp6_e3m2", False),
    "w_mxfp6_e2m3_a_mxfp6_e2m3": ("mxfp6_e2m3", "mxfp6_e2m3", False),
}
#: schemes vLLM builds no config for: (NotImplementedError's or the failed assertion's words)
VLLM_NONE = {
    "w_mxfp6_e3m2_a_fp8": "no corresponding fused moe quant config", "w_mxfp6_e2m3_a_fp8":
    "no corresponding fused moe quant config", "w_mxfp6_e3m2": "AssertionError", "w_mxfp6_e2m3": "AssertionError",
}
assert set(VLLM_CONFIG) | set(VLLM_NONE) == set(DTYPES)
#: the schemes vLLM 0.33 hands to select_mxfp4_moe_backend (no EMULATION on CPU: the selector refuses)
NATIVE_033 = ("w_mxfp4", "w_mxfp4_a_mxfp4", "w_mxfp4_a_fp8")


def quark_config(scheme: str) -> dict:
    """The Quark layer config of a scheme: per_group/32/e8m0 weights; MX inputs dynamic per group, FP8 inputs
    static per tensor (the only FP8 input 0.33 recognises)."""
    weight, inp = DTYPES[scheme]
    config = {"weight": {"dtype": weight, "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0"},
              "input_tensors": None}
    if inp == "fp8_e4m3":
        config["input_tensors"] = {"dtype": inp, "is_dynamic": False, "qscheme": "per_tensor", "symmetric": True}
    elif inp is not None:
        config["input_tensors"] = {"dtype": inp, "is_dynamic": True, "qscheme": "per_group", "group_size": 32,
                                   "scale_format": "e8m0"}
    return config


def make(scheme: str, profile: str, *, oracle=None, platform=CPU, **kw) -> QuarkOCPMXMoE:
    return QuarkOCPMXMoE.create(quark_config(scheme), E, H, I, top_k=TOP_K, platform=platform,
                                packages={"triton": False}, env={}, profile=profile, oracle=oracle, **kw)


def checkpoint(layer: QuarkOCPMXMoE, gen: torch.Generator) -> dict:
    """Unpadded random checkpoint tensors of the layer's scheme (+ static input scales when it has them)."""
    def quantize(w):
        if layer.weight_format == "mxfp4":
            return formats.quantize_mxfp4(w)
        return formats.quantize_mxfp6(w, kind=layer.weight_format.split("_")[1])
    w13, s13 = quantize(torch.randn(E, 2 * I, H, generator=gen) * 0.2)
    w2, s2 = quantize(torch.randn(E, H, I, generator=gen) * 0.2)
    ckpt = {"w13_weight": w13, "w13_weight_scale": s13, "w2_weight": w2, "w2_weight_scale": s2}
    if layer.static_input_scales:
        ckpt.update(w13_input_scale=torch.tensor([0.5, 0.25, 0.75, 0.5]), w2_input_scale=torch.full((E,), 2.0))
    return ckpt


def processed(layer: QuarkOCPMXMoE, seed: int = 0) -> QuarkOCPMXMoE:
    layer.load_weights(checkpoint(layer, torch.Generator().manual_seed(seed)))
    layer.process_weights_after_loading()
    return layer


def _assert_vllm_config(layer: QuarkOCPMXMoE, scheme: str) -> None:
    weight, activation, static = VLLM_CONFIG[scheme]
    config = layer.quant_config
    assert config is not None and (config["weight"], config["activation"]) == (weight, activation)
    assert "swiglu_alpha" not in config  # vLLM's Quark method passes no gemm1 constants on this path
    if static:  # the processed (max over experts) static scales, as vLLM's mxfp4_w4a8_moe_quant_config takes them
        assert (config["a1_scale"].item(), config["a2_scale"].item()) == (0.75, 2.0)
    else:
        assert "a1_scale" not in config


# ------------------------------------------------------------------------------- per scheme x profile
@pytest.mark.parametrize("scheme", sorted(DTYPES))
def test_vllm_020_builds_the_config_of_the_scheme_or_refuses(scheme):
    layer = make(scheme, "vllm-0.20")
    assert layer.decision.backend == "EMULATION"
    if scheme in VLLM_NONE:
        with pytest.raises(NotImplementedError, match=rf"scheme {scheme} has no fused-MoE quant config under profile "
                                                      rf"'vllm-0.20'.*{VLLM_NONE[scheme]}.*rules/vllm-0.20/ocp-mx"
                                                      rf".*Profile 'moe-oracle' builds it"):
            processed(layer)
    else:
        _assert_vllm_config(processed(layer), scheme)


@pytest.mark.parametrize("scheme", sorted(DTYPES))
def test_vllm_033_builds_the_config_of_the_scheme_or_refuses(scheme):
    if scheme in NATIVE_033:  # on CPU the MXFP4 selector refuses (its refusal is final): nothing to build
        with pytest.raises(NotImplementedError, match="No MXFP4 MoE backend supports"):
            make(scheme, "vllm-0.33")
        return
    layer = make(scheme, "vllm-0.33")
    assert layer.decision.backend == "EMULATION"
    if scheme in VLLM_NONE:
        with pytest.raises(NotImplementedError, match=rf"scheme {scheme} has no fused-MoE quant config under profile "
                                                      rf"'vllm-0.33'.*{VLLM_NONE[scheme]}"):
            processed(layer)
    else:
        _assert_vllm_config(processed(layer), scheme)


def test_vllm_033_native_schemes_on_emulation_get_their_scheme_kinds(oracle):
    """The three native schemes reach NONE/EMULATION only when the selector leaves NONE; the rules' kinds for them
    are still vLLM's (checked as data: no platform here gets there)."""
    policy = oracle.table("vllm-0.33").policies["ocp-mx"]
    assert policy.quant_config.backends == {"NONE", "EMULATION"}
    for scheme in NATIVE_033:
        kind = policy.quant_config.kinds[scheme]
        weight, activation, static = VLLM_CONFIG[scheme]
        assert (kind["weight"], kind["activation"], kind.get("input_scales") == "static") == (weight, activation,
                                                                                              static)
        assert "gemm1" not in kind
    # FP8 inputs: TritonExperts.apply quantizes both GEMM inputs per tensor with the static a1/a2 (0.33)
    assert policy.quant_config.kinds["w_mxfp4_a_fp8"]["emulated_activation"] == {
        "gemm1": "fp8_per_tensor_static", "gemm2": "fp8_per_tensor_static"}


@pytest.mark.parametrize("scheme", sorted(DTYPES))
def test_moe_oracle_builds_every_scheme_on_its_emulation(scheme):
    layer = processed(make(scheme, "moe-oracle"))
    weight, activation = layer.weight_format, layer.activation_scheme
    assert (layer.quant_config["weight"], layer.quant_config["activation"]) == (weight, activation)
    assert layer.quant_config["kind"] == layer.decision.quant_config["kind"]
    if scheme.endswith("a_fp8"):
        assert (layer.quant_config["a1_scale"].item(), layer.quant_config["a2_scale"].item()) == (0.75, 2.0)


def test_a_native_backend_keeps_its_own_kind(oracle):
    """vLLM 0.33 w_mxfp4 on CUDA selects MARLIN: its make_mxfp4_moe_quant_config kind, not the scheme's."""
    layer = make("w_mxfp4", "vllm-0.33", platform={"kind": "cuda", "capability": [9, 0]})
    assert (layer.decision.backend, layer.quant_config_kind["kind"]) == ("MARLIN", "w4a16")


def test_static_scales_in_the_config_are_doubled_on_fnuz():
    layer = processed(make("w_mxfp4_a_fp8", "vllm-0.20", platform={"kind": "rocm", "gcn_arch": "gfx942"}))
    assert layer.decision.backend == "EMULATION"
    assert (layer.quant_config["a1_scale"].item(), layer.quant_config["a2_scale"].item()) == (1.5, 4.0)


# ------------------------------------------------------------------------------- the answer carries the kind
def test_the_answer_and_explain_carry_the_scheme_kind(capsys, oracle):
    d = make("w_mxfp6_e3m2_a_fp8", "vllm-0.20").decision
    out = d.to_dict()
    assert out["quant_config"]["kind"] == "ocp-mx-w6a8-e3m2"
    assert "no corresponding fused moe quant config" in out["quant_config"]["not_implemented"]
    schema = json.loads((ROOT / "schemas" / "decision.schema.json").read_text())
    assert not list(jsonschema.Draft202012Validator(schema).iter_errors(out))
    assert main(["explain", "--profile", "vllm-0.20", "--policy", "ocp-mx", "--platform", "cpu",
                 "--quark", "weight.dtype=fp4", "--quark", "weight.qscheme=per_group",
                 "--quark", "input.dtype=fp8_e4m3", "--quark", "input.is_dynamic=false"]) == 0
    assert ("quant_config ocp-mx-w4a8 (weight mxfp4, activation fp8, input_scales static, emulated_activation "
            "{'gemm1': 'fp8_per_tensor_dynamic', 'gemm2': 'mxfp8', 'not_implemented': ") in capsys.readouterr().out


# ------------------------------------------------------------------------------- the rules decide


def test_a_rule_edit_makes_vllm_020_build_a_refused_scheme(tmp_path):
    """Drop `not_implemented` from 0.20's w_mxfp6_e3m2_a_fp8 kind: the same layer now builds it and runs."""
    line = next(x for x in (ROOT / "rules/common/mxfp4.yaml").read_text().splitlines()
                if x.strip().startswith("ocp-mx-w6a8-e3m2:"))
    start = line.index(", not_implemented: ")
    end = line.index('", why: ', start) + 1
    edited = edited_rules(tmp_path, ("common/mxfp4.yaml", line, line[:start] + line[end:]))
    layer = processed(make("w_mxfp6_e3m2_a_fp8", "vllm-0.20", oracle=edited))
    assert (layer.quant_config["kind"], layer.quant_config["activation"]) == ("ocp-mx-w6a8-e3m2", "fp8")
    y = layer.forward(torch.randn(3, H, generator=torch.Generator().manual_seed(1)), torch.randn(3, E))
    assert y.shape == (3, H) and torch.isfinite(y).all()
    with pytest.raises(NotImplementedError):
        processed(make("w_mxfp6_e3m2_a_fp8", "vllm-0.20"))  # the shipped rules still refuse it


def test_a_rule_edit_changes_what_the_emulation_runs(tmp_path):
    """Map moe-oracle's w_mxfp4_a_mxfp4 to the weight-only kind: no activation fake-quantization any more, so the
    layer's output equals the w_mxfp4 layer's on the same checkpoint; and a `not_implemented` kind refuses."""
    edited = edited_rules(tmp_path, ("moe-oracle/ocp-mx.yaml", "        w_mxfp4_a_mxfp4: ocp-mx-w4a4\n",
                                "        w_mxfp4_a_mxfp4: ocp-mx-w4a16\n"),
                     ("moe-oracle/w4a16.yaml", 'ocp-mx-w6a6-e2m3: {weight: mxfp6_e2m3, activation: mxfp6_e2m3, ',
                      'ocp-mx-w6a6-e2m3: {weight: mxfp6_e2m3, activation: mxfp6_e2m3, not_implemented: "edited", '))
    gen = torch.Generator().manual_seed(5)
    x, logits = torch.randn(6, H, generator=gen), torch.randn(6, E, generator=gen)
    shipped = processed(make("w_mxfp4_a_mxfp4", "moe-oracle"), seed=2)
    weight_only = processed(make("w_mxfp4_a_mxfp4", "moe-oracle", oracle=edited), seed=2)
    reference = processed(make("w_mxfp4", "moe-oracle"), seed=2)
    assert (shipped.activation_scheme, weight_only.activation_scheme) == ("mxfp4", None)
    torch.testing.assert_close(weight_only(x, logits), reference(x, logits), rtol=0, atol=0)
    assert not torch.equal(shipped(x, logits), reference(x, logits))
    with pytest.raises(NotImplementedError, match="under profile 'moe-oracle'.*edited.*buildable kind"):
        processed(make("w_mxfp6_e2m3_a_mxfp6_e2m3", "moe-oracle", oracle=edited))


def test_unknown_kinds_and_fields_are_validation_errors(tmp_path):
    with pytest.raises(RuleError) as err:
        edited_rules(tmp_path, ("vllm-0.20/ocp-mx.yaml", "        w_mxfp4_a_fp8: ocp-mx-w4a8\n",
                           "        w_mxfp4_a_fp8: ocp-mx-w4a9\n"),
                ("vllm-0.20/ocp-mx.yaml", "      by: ocp_mx_scheme\n      backends: [NONE, EMULATION]\n",
                 "      by: ocp_mx_schem\n      backends: [NONE, EMULATOR]\n"))
    text = str(err.value)
    assert "unknown quant config kind 'ocp-mx-w4a9' (did you mean 'ocp-mx-w4a8'?)" in text
    assert "unknown backend 'EMULATOR' (did you mean 'EMULATION'?)" in text
    assert "quant_config.by names answer field 'ocp_mx_schem', which no emit step of this policy gives" in text


def test_the_builder_names_what_a_static_kind_needs(oracle):
    d = make("w_mxfp4_a_fp8", "vllm-0.20").decision
    with pytest.raises(ValueError, match=r"takes the layer's static input scales as a1/a2; pass "
                                         r"input_scales=\(w13_input_scale, w2_input_scale\)"):
        build_layer_quant_config(d, weight_format="mxfp4", experts=E)
    with pytest.raises(ValueError, match="kind 'ocp-mx-w4a8' is for mxfp4 weights but the layer's weights are "
                                         "mxfp6_e3m2"):
        build_layer_quant_config(d, weight_format="mxfp6_e3m2", experts=E)
    nv = oracle.table("vllm-0.20").families["nvfp4"].backends["FLASHINFER_CUTLASS"].quant_config
    with pytest.raises(ValueError, match="derives NVFP4 global scales from the weights"):
        build_layer_quant_config(nv, weight_format="nvfp4", experts=E)


def test_emulated_fp8_inputs_need_static_scales(tmp_path):
    """A kind that quantizes with the static a1/a2 needs `input_scales: static` and a checkpoint that has them."""
    no_scales = edited_rules(tmp_path / "a", ("moe-oracle/ocp-mx.yaml", "        w_mxfp4_a_mxfp4: ocp-mx-w4a4\n",
                                         "        w_mxfp4_a_mxfp4: ocp-mx-w4a8\n"))
    with pytest.raises(ValueError, match="ocp-mx-w4a8' quantizes with static input scales but the checkpoint of "
                                         "w_mxfp4_a_mxfp4 has none"):
        make("w_mxfp4_a_mxfp4", "moe-oracle", oracle=no_scales)
    kind_line = next(x for x in (ROOT / "rules/moe-oracle/w4a16.yaml").read_text().splitlines()
                     if x.strip().startswith("ocp-mx-w4a8:"))
    unstatic = edited_rules(tmp_path / "b", ("moe-oracle/w4a16.yaml", kind_line,
                                        kind_line.replace("input_scales: static, ", "")))
    with pytest.raises(ValueError, match="fp8_per_tensor_static\\) but has no `input_scales: static`"):
        make("w_mxfp4_a_fp8", "moe-oracle", oracle=unstatic)
