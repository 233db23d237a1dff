"""Quant config per backend as data: the rules name each backend's kind, the Decision carries it,
backends.layouts.quant_config builds it (issue 15, item 3; facts: vLLM's make_mxfp4_moe_quant_config
and make_nvfp4_moe_quant_config)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from backends.layouts.quant_config import build_quant_config
from oracle import Decision, Oracle
from oracle.cli import main

from conftest import edited_rules, scenario
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
    """make_mxfp4_moe_quant_config's four kinds, all with gpt-oss's gemm1 constants (vLLM 0.20.0)."""
    backends = oracle.table("vllm-0.20").families["mxfp4"].backends
    got = {name: (b.quant_config["kind"], b.quant_config["activation"], dict(b.quant_config["gemm1"]))
           for name, b in backends.items()}
    w4a16 = ("w4a16", None, GPT_OSS_GEMM1)
    ocp = ("ocp-mx", "mxfp4", GPT_OSS_GEMM1)  # ocp_mx_moe_quant_config(quant_dtype="mxfp4"): MXFP4 activations
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
    assert "quant_config nvfp4-shared (weight nvfp4, activation nvfp4, global_scale shared)" in capsys.readouterr().out


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

    entry = "      FLASHINFER_CUTLASS:\n        quant_config: nvfp4-shared\n"
    rules = edited_rules(tmp_path, ("vllm-0.20/nvfp4.yaml", entry, entry.replace("nvfp4-shared", "nvfp4-per-expert")))
    edited = build_quant_config(rules.select(sc), w)
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


# ------------------------------------------------------------------------------------------- vLLM 0.33
# vLLM 0.33.0's make_mxfp4_moe_quant_config, backend by backend (vllm-oracle reference §11; the 0.33 wheel)
W4A16, MXFP8, OCP = ("w4a16", None, GPT_OSS_GEMM1), ("mxfp4-mxfp8", "mxfp8", GPT_OSS_GEMM1), \
    ("ocp-mx", "mxfp4", GPT_OSS_GEMM1)
MXFP4_033 = {
    "NONE": OCP, "XPU": OCP, "EMULATION": OCP, "CUTLASS_MXFP4_MXFP4": OCP, "AITER_MXFP4_MXFP4": OCP,
    "AITER_TRITON_MXFP4_MXFP4": OCP,
    "B12X_MXFP4_MXFP8": MXFP8, "FLASHINFER_TRTLLM_MXFP4_MXFP8": MXFP8, "FLASHINFER_CUTLASS_MXFP4_MXFP8": MXFP8,
    "B12X_MXFP4_BF16": W4A16, "MARLIN": W4A16, "BATCHED_MARLIN": W4A16, "TRITON": W4A16, "TRITON_UNFUSED": W4A16,
    "FLASHINFER_TRTLLM_MXFP4_BF16": W4A16, "FLASHINFER_CUTLASS_MXFP4_BF16": W4A16, "AITER_MXFP4_BF16": W4A16,
    "AITER_TRITON_MXFP4_BF16": W4A16, "CPU": W4A16,
    "DEEPGEMM_MXFP4": ("fp8-block-128", "fp8_block_128", GPT_OSS_GEMM1),
    "AITER_MXFP4_FP8": ("mxfp4-w4a8", "fp8", {"clamp": 7.0}),  # mxfp4_w4a8_moe_quant_config: clamp only
    "HUMMING": ("humming", None, GPT_OSS_GEMM1),
    "FLASHINFER_MOE_EP_CUTEDSL": ("moe-ep", "nvfp4", None), "FLASHINFER_MOE_EP_DEEP_GEMM": ("moe-ep", "nvfp4", None),
}


def test_every_mxfp4_kind_of_vllm_033(oracle):
    backends = oracle.table("vllm-0.33").families["mxfp4"].backends
    got = {name: (b.quant_config["kind"], b.quant_config["activation"],
                  dict(b.quant_config["gemm1"]) if "gemm1" in b.quant_config else None)
           for name, b in backends.items()}
    assert got == MXFP4_033


def test_which_nvfp4_backends_of_vllm_033_share_one_global_scale(oracle):
    """0.33: is_global_sf_supported_for_nvfp4_backend = the FlashInfer backends; VLLM_CUTLASS and B12X keep one
    scale per expert; MARLIN none; Humming builds its own; EMULATION and MoE-EP get no kind (no facts)."""
    backends = oracle.table("vllm-0.33").families["nvfp4"].backends
    scales = {n: b.quant_config.get("global_scale") for n, b in backends.items() if b.quant_config}
    assert sorted(n for n, s in scales.items() if s == "shared") == [
        "FLASHINFER_B12X", "FLASHINFER_CUTEDSL", "FLASHINFER_CUTEDSL_BATCHED", "FLASHINFER_CUTLASS", "FLASHINFER_TRTLLM"]
    assert sorted(n for n, s in scales.items() if s == "per_expert") == ["B12X", "VLLM_CUTLASS"]
    assert (scales["MARLIN"], scales["HUMMING"]) == ("weight_only", None)
    assert backends["FLASHINFER_TRTLLM"].quant_config["g1_scale_c"] is True
    assert {n for n, b in backends.items() if b.quant_config is None} == {"EMULATION", "FLASHINFER_MOE_EP_CUTEDSL"}


SELECTED_033 = [
    (scenario("mxfp4", "cuda:9.0", profile="vllm-0.33", activation="swigluoai"), "TRITON", "w4a16"),
    (scenario("mxfp4", "cuda:10.0", profile="vllm-0.33", activation="swigluoai"), "FLASHINFER_TRTLLM_MXFP4_BF16",
     "w4a16"),
    (scenario("mxfp4-deepseek-v4", "cuda:10.0", profile="vllm-0.33"), "FLASHINFER_TRTLLM_MXFP4_MXFP8", "mxfp4-mxfp8"),
    (scenario("nvfp4", "cuda:10.0", profile="vllm-0.33", activation="silu"), "FLASHINFER_TRTLLM", "nvfp4-trtllm"),
    (scenario("nvfp4", "cuda:12.0", profile="vllm-0.33", activation="silu"), "FLASHINFER_CUTLASS", "nvfp4-shared"),
]


@pytest.mark.parametrize("sc,backend,kind", SELECTED_033, ids=[f"{b}-{k}" for _, b, k in SELECTED_033])
def test_vllm_033_decisions_carry_their_kind(oracle, sc, backend, kind):
    d = oracle.select(sc)
    assert (d.outcome, d.backend, d.quant_config and d.quant_config["kind"]) == ("selected", backend, kind)


def test_a_partial_gemm1_builds_only_what_the_kind_gives(oracle):
    """AITER W4A8 passes only the clamp: the built config has swiglu_limit and no alpha/beta; its a1/a2 are the
    layer's static input scales (`input_scales: static`), which it cannot be built without."""
    spec = oracle.table("vllm-0.33").families["mxfp4"].backends["AITER_MXFP4_FP8"].quant_config
    w = random_layer("mxfp4", experts=2, seed=2)
    a13, a2 = torch.tensor(0.5), torch.tensor(0.25)
    config = build_quant_config(spec, w, activation="swigluoai", input_scales=(a13, a2))
    assert (config["kind"], config["activation"]) == ("mxfp4-w4a8", "fp8")
    assert set(config) == {"kind", "weight", "activation", "swiglu_limit", "a1_scale", "a2_scale"}
    assert torch.equal(config["swiglu_limit"], torch.full((2,), 7.0))
    assert (config["a1_scale"], config["a2_scale"]) == (a13, a2)
    with pytest.raises(ValueError, match="takes the layer's static input scales as a1/a2; pass input_scales="):
        build_quant_config(spec, w)


# ------------------------------------------------------------------------ converters take the rules' values


def test_converters_hold_no_quant_values_of_their_own():
    """Without a quant config a converter writes only the checkpoint scalars it keeps for invert: no alpha, global
    scale or SwiGLU constant comes from a layout."""
    from backends.layouts import cutlass, marlin, nvfp4_cutlass, oai_triton, trtllm
    from backends.layouts.base import SOURCE_KEYS

    mx = random_layer("mxfp4", experts=2, hidden=128, inter=128, seed=4)
    nv = random_layer("nvfp4", experts=2, hidden=128, inter=128, seed=4, finite_scales=True)
    for converter, w in ((trtllm.mxfp4, mx), (cutlass.mxfp4_mxfp8, mx), (cutlass.mxfp4_bf16_sm90, mx),
                         (oai_triton.mxfp4, mx), (marlin.mxfp4, mx), (trtllm.nvfp4, nv),
                         (nvfp4_cutlass.flashinfer_cutlass, nv), (nvfp4_cutlass.vllm_cutlass, nv),
                         (nvfp4_cutlass.cutedsl, nv), (marlin.nvfp4, nv)):
        assert set(converter.convert(w).config) <= set(SOURCE_KEYS), converter


def test_nvfp4_converters_take_the_rules_values(oracle):
    """The FlashInfer, vLLM CUTLASS and TRT-LLM layouts get vLLM's alphas and global scales from their kinds."""
    from backends.layouts import nvfp4_cutlass, trtllm

    w = random_layer("nvfp4", experts=3, hidden=128, inter=64, seed=6, finite_scales=True)
    by_hand_shared, by_hand_pair = _nvfp4_by_hand(w, shared=True), _nvfp4_by_hand(w, shared=False)
    fi = oracle.select(scenario("nvfp4", "cuda:10.0"))
    vc = oracle.select(scenario("nvfp4", "cuda:10.0", packages=()))
    tr = oracle.select(scenario("nvfp4", "cuda:10.0", profile="vllm-0.33", activation="silu"))
    assert (fi.backend, vc.backend, tr.backend) == ("FLASHINFER_CUTLASS", "VLLM_CUTLASS", "FLASHINFER_TRTLLM")
    _assert_values(nvfp4_cutlass.flashinfer_cutlass.convert(w, quant_config=build_quant_config(fi, w)).config,
                   by_hand_shared)
    _assert_values(nvfp4_cutlass.vllm_cutlass.convert(w, quant_config=build_quant_config(vc, w)).config, by_hand_pair)
    config = trtllm.nvfp4.convert(w, quant_config=build_quant_config(tr, w)).config
    _assert_values(config, by_hand_shared)
    a13, a2 = by_hand_shared["g1_alphas"], by_hand_shared["a2_gscale"]
    _assert_values(config, {"g1_scale_c": [a13[e] * a2[e] for e in range(3)]})  # g1_alphas / a2 = g1_alphas * a2_gscale


def test_marlin_takes_the_weight_only_alphas_of_its_kind(oracle):
    """Marlin stores the kind's g1/g2 alphas (1 / global scale) as bf16 times 2^(126 - 7)."""
    from backends.layouts import marlin

    w = random_layer("nvfp4", experts=2, hidden=128, inter=64, seed=8, finite_scales=True)
    d = oracle.select(scenario("nvfp4", "cuda:8.0"))
    assert (d.backend, d.quant_config["global_scale"]) == ("MARLIN", "weight_only")
    config = marlin.nvfp4.convert(w, quant_config=build_quant_config(d, w)).config
    for alpha, name in (("g1_alphas", "w13_global_scale"), ("g2_alphas", "w2_global_scale")):
        expected = [float(torch.tensor(1 / float(s)).to(torch.bfloat16)) * 2.0**119 for s in getattr(w, name)]
        torch.testing.assert_close(config[alpha], torch.tensor(expected, dtype=torch.bfloat16), rtol=0, atol=0)


def test_a_gemm1_edit_in_the_rules_reaches_the_converters(tmp_path, oracle):
    """Edit gpt-oss's SwiGLU alpha in a copy of the rules: TRT-LLM's per-expert tensors and OAI Triton's scalar
    follow it."""
    from backends.layouts import oai_triton, trtllm

    w = random_layer("mxfp4", experts=3, hidden=128, inter=128, seed=9)
    sc = scenario("mxfp4-gpt-oss", "cuda:10.0")
    old = 'w4a16: {weight: mxfp4, activation: null, gemm1: {alpha: 1.702,'
    edited = edited_rules(tmp_path, ("common/mxfp4.yaml", old, old.replace("1.702", "1.25")))
    for rules, alpha in ((oracle, 1.702), (edited, 1.25)):
        d = rules.select(sc)
        assert d.backend == "FLASHINFER_TRTLLM_MXFP4_BF16"
        built = build_quant_config(d, w, activation="swigluoai")
        config = trtllm.mxfp4.convert(w, quant_config=built).config
        assert torch.equal(config["swiglu_alpha"], torch.full((3,), alpha))
        assert torch.equal(config["swiglu_limit"], torch.full((3,), 7.0))
        scalars = oai_triton.mxfp4.convert(w, quant_config=built).config
        fp32_alpha = float(torch.tensor(alpha, dtype=torch.float32))  # the per-expert fp32 value, as a scalar
        assert (scalars["swiglu_alpha"], scalars["swiglu_limit"], "swiglu_beta" in scalars) == (fp32_alpha, 7.0, False)


def test_a_gemm1_edit_in_the_rules_reaches_the_layer(tmp_path):
    """MoELayer runs with the gemm1 constants of its backend's kind: an edited clamp changes the output exactly as
    passing the same clamp by hand does."""
    from backends import MoELayer

    w = random_layer("mxfp4", experts=4, hidden=64, inter=32, seed=10, finite_scales=True)
    old = 'ocp-mx: {weight: mxfp4, activation: null, gemm1: {alpha: 1.702, beta: 1.0, clamp: 7.0}'
    edited = edited_rules(tmp_path, ("moe-oracle/w4a16.yaml", old, old.replace("clamp: 7.0", "clamp: 0.25")))
    args = {"activation": "swigluoai", "top_k": 2, "platform": {"kind": "cpu"}, "packages": {}, "env": {}}
    g = torch.Generator().manual_seed(11)
    x, logits = torch.randn(5, 64, generator=g), torch.randn(5, 4, generator=g)
    shipped = MoELayer.from_checkpoint(w, oracle=Oracle(), **args)
    rules = MoELayer.from_checkpoint(w, oracle=edited, **args)
    by_hand = MoELayer.from_checkpoint(w, oracle=Oracle(), swiglu_limit=0.25, **args)
    assert rules.decision.backend == shipped.decision.backend == "EMULATION"
    torch.testing.assert_close(rules(x, logits), by_hand(x, logits), rtol=0, atol=0)
    assert not torch.equal(rules(x, logits), shipped(x, logits))


def test_swigluoai_without_gemm1_constants_is_one_clear_error(tmp_path):
    from backends import MoELayer

    w = random_layer("mxfp4", experts=4, hidden=64, inter=32, seed=10, finite_scales=True)
    old = 'ocp-mx: {weight: mxfp4, activation: null, gemm1: {alpha: 1.702, beta: 1.0, clamp: 7.0}, '
    edited = edited_rules(tmp_path, ("moe-oracle/w4a16.yaml", old, 'ocp-mx: {weight: mxfp4, activation: null, '))
    with pytest.raises(ValueError, match=r"needs swiglu_alpha, swiglu_beta, swiglu_limit: the quant-config kind "
                                         r"'ocp-mx' of EMULATION .* add `gemm1: "):
        MoELayer.from_checkpoint(w, activation="swigluoai", top_k=2, platform={"kind": "cpu"}, packages={}, env={},
                                 oracle=edited)
    # silu needs no SwiGLU constants
    MoELayer.from_checkpoint(w, activation="silu", top_k=2, platform={"kind": "cpu"}, packages={}, env={},
                             oracle=edited)


def test_w4a4_kinds_need_the_input_scales(oracle):
    w = random_layer("nvfp4", experts=2, hidden=48, inter=64).replace(w13_input_scale=None)
    d = oracle.select(scenario("nvfp4", "cuda:10.0", packages=()))
    assert d.quant_config["global_scale"] == "per_expert"
    with pytest.raises(ValueError, match="quantizes activations to NVFP4 and needs the checkpoint's input scales"):
        build_quant_config(d, w)
