"""Quant config per backend as data: the rules name each backend's kind, the Decision carries it,
backends.layouts.quant_config builds it (issue 15, item 3; facts: vLLM's make_mxfp4_moe_quant_config
and make_nvfp4_moe_quant_config)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from backends.layouts.quant_config import build_quant_config
from oracle import Decision, Oracle
from oracle.cli import main

from conftest import scenario
from layout_cases import random_layer

ROOT = Path(__file__).resolve().parent.parent
GPT_OSS_GEMM1 = {"alpha": 1.702, "beta": 1.0, "clamp": 7.0}

# (scenario, backend, kind): the kinds vLLM 0.20's make_*_moe_quant_config builds for that backend
SELECTED = [
    (scenario("mxfp4-gpt-oss", "cuda:10.0", env={"VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": "1"}),
     "FLASHINFER_TRTLLM_MXFP4_MXFP8", "mxfp4-mxfp8"),
    (scenario("mxfp4-gpt-oss", "cuda:10.0"), "FLASHINFER_TRTLLM_MXFP4_BF16", "w4a16"),
    (scenario("mxfp4-gpt-oss", "cuda:9.0"), "TRITON", "w4a16"),
    (scenario("nvfp4", "cuda:10.0"), "FLASHINFER_CUTLASS", "nvfp4-shared"),
    (scenario("nvfp4", "cuda:10.0", packages=()), "VLLM_CUTLASS", "nvfp4-per-expert"),
    (scenario("nvfp4", "cuda:8.0"), "MARLIN", "nvfp4-w4a16"),
    (scenario("mxfp4", "cpu", profile="moe-oracle"), "EMULATION", "ocp-mx"),
    (scenario("mxfp4", "cuda:9.0", profile="moe-oracle", packages=("triton",)), "TRITON_MOE", "w4a16"),
]


@pytest.mark.parametrize("sc,backend,kind", SELECTED, ids=[f"{b}-{k}" for _, b, k in SELECTED])
def test_the_decision_carries_the_kind_the_rules_give(oracle, sc, backend, kind):
    d = oracle.select(sc)
    assert (d.outcome, d.backend, d.quant_config and d.quant_config["kind"]) == ("selected", backend, kind)
    out = d.to_dict(with_trace=False)
    assert out["quant_config"]["kind"] == kind
    assert Decision.from_dict(json.loads(json.dumps(out))).quant_config == d.quant_config


def test_every_mxfp4_kind_of_vllm_020(oracle):
    """make_mxfp4_moe_quant_config's four kinds, all with gpt-oss's gemm1 constants."""
    backends = oracle.table("vllm-0.20").families["mxfp4"].backends
    got = {name: (b.quant_config["kind"], b.quant_config["activation"], dict(b.quant_config["gemm1"]))
           for name, b in backends.items()}
    w4a16 = ("w4a16", None, GPT_OSS_GEMM1)
    ocp = ("ocp-mx", None, GPT_OSS_GEMM1)
    mxfp8 = ("mxfp4-mxfp8", "mxfp8", GPT_OSS_GEMM1)
    assert got == {"NONE": ocp, "XPU": ocp, "EMULATION": ocp, "DEEPGEMM_MXFP4": ("fp8-block-128", "fp8_block_128",
                                                                                 GPT_OSS_GEMM1),
                   "FLASHINFER_TRTLLM_MXFP4_MXFP8": mxfp8, "FLASHINFER_CUTLASS_MXFP4_MXFP8": mxfp8,
                   "FLASHINFER_TRTLLM_MXFP4_BF16": w4a16, "FLASHINFER_CUTLASS_MXFP4_BF16": w4a16, "MARLIN": w4a16,
                   "BATCHED_MARLIN": w4a16, "AITER": w4a16, "TRITON": w4a16, "TRITON_UNFUSED": w4a16}


@pytest.mark.parametrize("profile,shared", [
    ("vllm-0.20", ["FLASHINFER_CUTEDSL", "FLASHINFER_CUTEDSL_BATCHED", "FLASHINFER_CUTLASS", "FLASHINFER_TRTLLM"]),
    ("vllm-0.15", ["FLASHINFER_CUTEDSL", "FLASHINFER_CUTLASS", "FLASHINFER_TRTLLM"])])
def test_which_nvfp4_backends_share_one_global_scale(oracle, profile, shared):
    """vLLM: the FlashInfer backends take one input scale over all experts, VLLM_CUTLASS one per expert."""
    backends = oracle.table(profile).families["nvfp4"].backends
    scales = {n: b.quant_config["global_scale"] for n, b in backends.items() if b.quant_config}
    assert sorted(n for n, s in scales.items() if s == "shared") == shared
    assert (scales["VLLM_CUTLASS"], scales["MARLIN"]) == ("per_expert", "weight_only")
    assert backends["FLASHINFER_TRTLLM"].quant_config["g1_scale_c"] is True


def test_explain_prints_the_kind(capsys):
    assert main(["explain", "--profile", "vllm-0.20", "--policy", "nvfp4", "--platform", "cuda:10.0",
                 "--package", "flashinfer"]) == 0
    assert "quant_config nvfp4-shared (weight=nvfp4, activation=nvfp4, global_scale=shared)" in capsys.readouterr().out


def _nvfp4_by_hand(w, *, shared: bool) -> dict:
    """vLLM's formulas written out per expert (independent of nvfp4_w4a4_config's tensor code)."""
    E = w.E
    a13 = [float(w.w13_input_scale[e].max()) for e in range(E)]
    a2 = [float(w.w2_input_scale[e]) for e in range(E)]
    if shared:
        a13, a2 = [max(a13)] * E, [max(a2)] * E
    return {"g1_alphas": [a13[e] / float(w.w13_global_scale[e]) for e in range(E)],
            "g2_alphas": [a2[e] / float(w.w2_global_scale[e]) for e in range(E)],
            "a1_gscale": [1 / x for x in a13], "a2_gscale": [1 / x for x in a2]}


def _assert_values(config: dict, expected: dict) -> None:
    for name, values in expected.items():
        torch.testing.assert_close(config[name], torch.tensor(values, dtype=torch.float32), rtol=1e-6, atol=0)


def test_the_builder_follows_the_rules(tmp_path):
    """Change FLASHINFER_CUTLASS's kind in a copy of the rules: the built config changes with it."""
    w = random_layer("nvfp4", experts=4, seed=3, finite_scales=True)
    sc = scenario("nvfp4", "cuda:10.0")
    d = Oracle().select(sc)
    assert d.backend == "FLASHINFER_CUTLASS"
    shipped = build_quant_config(d, w)
    assert (shipped["kind"], "g1_scale_c" in shipped) == ("nvfp4-shared", False)
    _assert_values(shipped, _nvfp4_by_hand(w, shared=True))

    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules)
    path = rules / "vllm-0.20" / "nvfp4.yaml"
    text = path.read_text()
    entry = "      FLASHINFER_CUTLASS:\n        quant_config: nvfp4-shared\n"
    assert text.count(entry) == 1
    path.write_text(text.replace(entry, entry.replace("nvfp4-shared", "nvfp4-per-expert")))
    edited = build_quant_config(Oracle(rules).select(sc), w)
    assert edited["kind"] == "nvfp4-per-expert"
    _assert_values(edited, _nvfp4_by_hand(w, shared=False))
    assert not torch.equal(edited["g1_alphas"], shipped["g1_alphas"])


def test_gemm1_constants_only_for_the_gpt_oss_activation(oracle):
    w = random_layer("mxfp4", experts=3, seed=5)
    d = oracle.select(scenario("mxfp4-gpt-oss", "cuda:10.0"))
    plain = build_quant_config(d, w)
    assert plain == {"kind": "w4a16", "weight": "mxfp4", "activation": None}
    gpt_oss = build_quant_config(d, w, activation="swigluoai")
    for name, value in (("swiglu_alpha", 1.702), ("swiglu_beta", 1.0), ("swiglu_limit", 7.0)):
        assert torch.equal(gpt_oss[name], torch.full((3,), value, dtype=torch.float32))


def test_weight_only_nvfp4_alphas_are_the_weight_global_scales(oracle):
    w = random_layer("nvfp4", experts=3, seed=7, finite_scales=True)
    config = build_quant_config(oracle.select(scenario("nvfp4", "cuda:8.0")), w)
    _assert_values(config, {"g1_alphas": [1 / float(s) for s in w.w13_global_scale],
                            "g2_alphas": [1 / float(s) for s in w.w2_global_scale]})
    assert "a1_gscale" not in config


def test_builder_errors_name_the_fix(oracle):
    nv = random_layer("nvfp4", experts=2, seed=1, finite_scales=True)
    with pytest.raises(ValueError, match="carries no quant_config kind; add `quant_config: <kind>`"):
        build_quant_config(Decision("selected", backend="X"), nv)
    with pytest.raises(ValueError, match="kind 'w4a16' is for mxfp4 weights but the layer's weights are nvfp4"):
        build_quant_config(oracle.select(scenario("mxfp4-gpt-oss", "cuda:10.0")), nv)
