"""Package features as scenario facts (`flashinfer:`): what vLLM's FlashInfer probes answer beyond
"installed", defaulting to what the FlashInfer each profile's vLLM pins answers (vllm-0.33:
flashinfer-python 0.7.2.post1, which has ActivationType.Situ). Expected backends are derived from
vLLM 0.33.0's experts classes (_supports_current_device / _supports_activation), not from the rules."""
from __future__ import annotations

import pytest

from oracle import ScenarioError

ALL = {p: True for p in ("flashinfer", "triton_kernels", "deep_gemm", "aiter", "humming", "b12x", "quark")}


def pick(oracle, policy, cap, *, profile="vllm-0.33", flashinfer=None, **moe):
    sc = {"profile": profile, "policy": policy, "platform": {"kind": "cuda", "capability": list(cap)},
          "packages": ALL, "moe": moe}
    if flashinfer is not None:
        sc["flashinfer"] = flashinfer
    d = oracle.select(sc)
    return d.outcome, d.backend, d.kernel


@pytest.mark.parametrize("cap", [(10, 0), (10, 3)])
def test_situ_on_sm10x_takes_trtllm_as_vllm_033_does(oracle, cap):
    """0.33.0's TRT-LLM classes accept SITU when has_flashinfer_situ_activation(): true for its pinned FlashInfer."""
    assert pick(oracle, "mxfp4", cap, activation="situ") == (
        "selected", "FLASHINFER_TRTLLM_MXFP4_BF16", "TrtLlmMxfp4ExpertsMonolithic")
    assert pick(oracle, "nvfp4", cap, activation="situ") == (
        "selected", "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsMonolithic")


@pytest.mark.parametrize("cap", [(10, 0), (10, 3)])
def test_a_flashinfer_without_situ_moves_situ_layers_off_trtllm(oracle, cap):
    without = {"situ_activation": False}
    # MXFP4: TRITON and FI CUTLASS lack SiTU, CUTLASS MXFP4xMXFP4 needs MXFP4 activations: Marlin is next
    assert pick(oracle, "mxfp4", cap, activation="situ", flashinfer=without) == ("selected", "MARLIN", "MarlinExperts")
    # NVFP4: CuteDSL takes SiTU without asking FlashInfer's activation enum
    assert pick(oracle, "nvfp4", cap, activation="situ", flashinfer=without) == (
        "selected", "FLASHINFER_CUTEDSL", "FlashInferCuteDSLExperts")
    # other activations do not care
    assert pick(oracle, "mxfp4", cap, activation="silu", flashinfer=without)[1] == "FLASHINFER_TRTLLM_MXFP4_BF16"


def test_feature_probes_gate_their_kernels(oracle):
    sm100 = (10, 0)
    assert pick(oracle, "nvfp4", sm100, activation="silu")[1] == "FLASHINFER_TRTLLM"
    assert pick(oracle, "nvfp4", sm100, activation="silu", flashinfer={"trtllm_fused_moe": False})[1] == \
        "FLASHINFER_CUTEDSL"
    assert pick(oracle, "nvfp4", sm100, activation="silu",
                flashinfer={"trtllm_fused_moe": False, "cutedsl_moe_nvfp4": False})[1] == "FLASHINFER_CUTLASS"
    assert pick(oracle, "nvfp4", sm100, activation="silu",
                flashinfer={"trtllm_fused_moe": False, "cutedsl_moe_nvfp4": False, "cutlass_fused_moe": False}
                )[1] == "VLLM_CUTLASS"
    # vllm-0.20 reads the same facts with its own defaults
    assert pick(oracle, "nvfp4", sm100, profile="vllm-0.20", activation="silu",
                activation_key="kNvfp4Dynamic")[1] == "FLASHINFER_TRTLLM"
    assert pick(oracle, "nvfp4", sm100, profile="vllm-0.20", activation="silu", activation_key="kNvfp4Dynamic",
                flashinfer={"trtllm_fused_moe": False})[1] != "FLASHINFER_TRTLLM"


def test_explain_names_the_missing_feature(oracle):
    d = oracle.select({"profile": "vllm-0.33", "policy": "mxfp4", "platform": {"kind": "cuda", "capability": [10, 0]},
                       "packages": ALL, "flashinfer": {"situ_activation": False}, "moe": {"activation": "situ"}})
    trtllm = [c for c in d.to_dict()["trace"] if "FLASHINFER_TRTLLM_MXFP4_BF16" in str(c)]
    assert trtllm and "flashinfer.situ_activation false is not true" in str(trtllm), trtllm


def test_the_scenario_names_a_misspelled_or_mistyped_feature(oracle):
    base = {"profile": "vllm-0.33", "policy": "mxfp4", "platform": {"kind": "cuda", "capability": [10, 0]}}
    with pytest.raises(ScenarioError, match=r"flashinfer.situ_activaton: unknown field \(did you mean 'situ_activation'\?\)"):
        oracle.prepare({**base, "flashinfer": {"situ_activaton": True}})
    with pytest.raises(ScenarioError, match=r"flashinfer.situ_activation: expected true or false, got 'yes'"):
        oracle.prepare({**base, "flashinfer": {"situ_activation": "yes"}})
    with pytest.raises(ScenarioError, match=r"flashinfer: expected a mapping"):
        oracle.prepare({**base, "flashinfer": True})


def test_every_vllm_profile_states_its_pinned_flashinfers_features(oracle):
    from oracle.facts import FACTS

    features = {f for f in FACTS if f.startswith("flashinfer.")}
    defaults = oracle.table("vllm-0.33").policies["mxfp4"].defaults
    assert {f for f in features if defaults.get(f) is True} == features  # 0.7.2.post1 has every one, Situ included
    defaults_020 = oracle.table("vllm-0.20").policies["nvfp4"].defaults
    assert defaults_020["flashinfer.trtllm_fused_moe"] is True
    assert defaults_020.get("flashinfer.situ_activation", FACTS["flashinfer.situ_activation"][1]) is False
