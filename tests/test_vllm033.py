"""The vllm-0.33 profile: every case of the executed 0.33.0 golden sample, and hand-derived
cases for each numbered change of the reference's §11 (derived from the 0.33.0 source, not
from the golden file), plus NVFP4 and Quark.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracle import Oracle

PROFILE = "vllm-0.33"
ALL = ("flashinfer", "triton_kernels", "deep_gemm", "aiter", "humming", "b12x", "quark")
CASES = [json.loads(line) for line in
         (Path(__file__).parent / "data" / "golden-sample-vllm-0.33.jsonl").read_text().splitlines() if line.strip()]
DEEPEP_LL = {"dp_size": 2, "ep_size": 2, "use_ep": True, "all2all_backend": "deepep_low_latency"}


def ask(oracle, policy: str, platform: str = "cuda:9.0", *, packages=ALL, env=None, query=None, backend=None,
        quark=None, **moe):
    """One 0.33 question from short arguments: platform 'cuda:9.0' | 'rocm:gfx950' | 'xpu' | 'cpu' | 'cpu+amx'."""
    kind, _, detail = platform.partition(":")
    plat: dict = {"kind": kind.replace("+amx", "")}
    if kind == "cuda":
        plat["capability"] = [int(x) for x in detail.split(".")]
    elif kind == "rocm":
        plat["gcn_arch"] = detail
    elif kind.startswith("cpu"):
        plat["amx"] = kind.endswith("+amx")
    sc: dict = {"profile": PROFILE, "policy": policy, "platform": plat, "packages": {p: True for p in packages},
                "env": dict(env or {}), "moe": dict(moe)}
    for key, value in (("query", query), ("backend", backend), ("quark", quark)):
        if value is not None:
            sc[key] = value
    return oracle.select(sc)


def pick(oracle, *args, **kw):
    d = ask(oracle, *args, **kw)
    return d.outcome, d.backend, d.kernel


# ------------------------------------------------------------------ the executed sample


def _id(i: int, case: dict) -> str:
    s = case["scenario"]
    return f"{i}-{s['policy']}-{s.get('query', 'select')}-{case['expected']['outcome']}"


@pytest.mark.parametrize("case", CASES, ids=[_id(i, c) for i, c in enumerate(CASES)])
def test_golden_033_case(oracle, case):
    got = oracle.select(case["scenario"]).to_dict(with_trace=False)
    expected = {k: v for k, v in case["expected"].items() if k != "vllm_error"}
    assert {k: got.get(k) for k in expected} == expected, got.get("error")
    if expected["outcome"] in ("invalid", "unsupported"):
        assert got["error"], "a refusal must say why"


def test_sample_covers_every_033_policy_and_query():
    assert {c["scenario"]["policy"] for c in CASES} == {"mxfp4", "mxfp4-deepseek-v4", "nvfp4", "ocp-mx"}
    assert {c["scenario"].get("query", "select") for c in CASES} == {"select", "round_up", "map_backend", "ocp_mx_scheme"}


def test_every_033_answer_matches_the_decision_schema(oracle):
    import jsonschema

    schema = json.loads((Path(__file__).resolve().parent.parent / "schemas" / "decision.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    for case in CASES[::7]:
        out = oracle.select(case["scenario"]).to_dict()
        errors = [e.message for e in validator.iter_errors(out)]
        assert not errors, (case["scenario"], errors[:3])


# ------------------------------------------------------------------ §11.1 renames


def test_1_gpt_oss_policy_is_renamed_mxfp4(oracle):
    d = ask(oracle, "mxfp4-gpt-oss")
    assert d.outcome == "error" and "mxfp4" in d.error.replace("mxfp4-gpt-oss", "")
    # the former gpt-oss logic is the default path now: BF16-activation Triton on Hopper
    assert pick(oracle, "mxfp4", "cuda:9.0", activation_key=None) == ("selected", "TRITON", "OAITritonMxfp4ExpertsMonolithic")
    # the former MXFP8-first selector is the DeepSeek-V4 one
    assert pick(oracle, "mxfp4-deepseek-v4", "cuda:10.0")[1] == "FLASHINFER_TRTLLM_MXFP4_MXFP8"


# ------------------------------------------------------------------ §11.2 LoRA is a kernel property


@pytest.mark.parametrize("platform, backend", [
    ("cuda:7.0", "EMULATION"),   # Marlin needs 7.5; emulation supports LoRA
    ("cuda:9.0", "MARLIN"),      # OAI Triton (fused) refuses LoRA; Marlin is the first LoRA-capable candidate
    ("cuda:10.0", "MARLIN"),     # TRT-LLM kernels refuse LoRA in auto selection
    ("rocm:gfx942", "EMULATION"),
    ("xpu", "EMULATION"),        # XPU experts refuse LoRA; emulation comes before the XPU fallback
])
def test_2_lora_is_filtered_by_kernel_support(oracle, platform, backend):
    assert pick(oracle, "mxfp4", platform, lora=True, activation_key=None)[1] == backend


def test_2_explicit_trtllm_with_lora_uses_the_lora_experts(oracle):
    assert pick(oracle, "mxfp4", "cuda:10.0", lora=True, moe_backend="flashinfer_trtllm") == \
        ("selected", "FLASHINFER_TRTLLM_MXFP4_BF16", "TrtLlmMxfp4LoRAExperts")
    # without LoRA the explicit request keeps the Monolithic kernel
    assert pick(oracle, "mxfp4", "cuda:10.0", moe_backend="flashinfer_trtllm")[2] == "TrtLlmMxfp4ExpertsMonolithic"
    assert ask(oracle, "mxfp4", "cuda:10.0", lora=True, moe_backend="flashinfer_trtllm_afp8").outcome == "invalid"


# ------------------------------------------------------------------ §11.3 env vars


@pytest.mark.parametrize("env", [{"VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "1"}, {"VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": "1"},
                                 {"VLLM_MXFP4_USE_MARLIN": "1"}, {"VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "0"}])
def test_3_removed_env_vars_change_nothing(oracle, env):
    assert pick(oracle, "mxfp4", "cuda:9.0", env=env)[1] == "TRITON"
    assert pick(oracle, "mxfp4", "cuda:10.0", env=env)[1] == "FLASHINFER_TRTLLM_MXFP4_BF16"


def test_3_b12x_force_a16(oracle):
    # hidden 3072 = 12 x 256 so that the W4A8 variant's shape rule holds
    assert pick(oracle, "mxfp4", "cuda:12.0", moe_backend="b12x", activation="silu", hidden_size=3072)[1] == "B12X_MXFP4_MXFP8"
    assert pick(oracle, "mxfp4", "cuda:12.0", moe_backend="b12x", activation="silu", hidden_size=3072,
                env={"VLLM_B12X_MOE_FP4_FORCE_A16": "1"})[1] == "B12X_MXFP4_BF16"
    # the default 2880 hidden size is not a multiple of 256: W4A8 refuses, W4A16 is tried next
    assert pick(oracle, "mxfp4", "cuda:12.0", moe_backend="b12x", activation="silu")[1] == "B12X_MXFP4_BF16"


def test_3_humming_gemm_type_env_picks_the_class(oracle):
    assert pick(oracle, "mxfp4-deepseek-v4", "cuda:9.0")[2] == "HummingIndexedExperts"
    assert pick(oracle, "mxfp4-deepseek-v4", "cuda:9.0", env={"VLLM_HUMMING_MOE_GEMM_TYPE": "GROUPED"})[2] == \
        "HummingGroupedExperts"
    assert pick(oracle, "mxfp4-deepseek-v4", "cuda:9.0", parallel={"dp_size": 1, "ep_size": 2, "use_ep": True})[2] == \
        "HummingGroupedExperts"


# ------------------------------------------------------------------ §11.4 / §11.8 backends and explicit lists


@pytest.mark.parametrize("string, backends", [
    ("aiter", ["AITER_MXFP4_BF16", "AITER_TRITON_MXFP4_BF16", "AITER_MXFP4_FP8", "AITER_MXFP4_MXFP4", "AITER_TRITON_MXFP4_MXFP4"]),
    ("b12x", ["B12X_MXFP4_MXFP8", "B12X_MXFP4_BF16"]),
    ("flashinfer_cutlass", ["FLASHINFER_CUTLASS_MXFP4_BF16", "FLASHINFER_CUTLASS_MXFP4_MXFP8"]),
    ("humming", ["HUMMING"]), ("cpu", ["CPU"]), ("flashinfer_moe_ep_mega_deep_gemm", ["FLASHINFER_MOE_EP_DEEP_GEMM"]),
])
def test_4_8_map_backend_answers_an_ordered_list(oracle, string, backends):
    d = ask(oracle, "mxfp4", query="map_backend", moe_backend=string)
    assert (d.outcome, d.extras.get("backends")) == ("selected", backends)


def test_8_explicit_variants_are_tried_in_turn(oracle):
    # DeepSeek-V4 tries every variant: CUTLASS BF16 is SM90-only, the MXFP8 variant fits SM100
    assert pick(oracle, "mxfp4-deepseek-v4", "cuda:10.0", moe_backend="flashinfer_cutlass")[1] == "FLASHINFER_CUTLASS_MXFP4_MXFP8"
    # the default path filters by the requested activation key first: BF16 only, which SM100 refuses
    assert ask(oracle, "mxfp4", "cuda:10.0", moe_backend="flashinfer_cutlass").outcome == "invalid"
    assert pick(oracle, "mxfp4", "cuda:10.0", moe_backend="flashinfer_cutlass", activation_key="kMxfp8Dynamic")[1] == \
        "FLASHINFER_CUTLASS_MXFP4_MXFP8"
    # no variant of the string carries the requested key, and none is BF16: nothing to try
    assert ask(oracle, "mxfp4", "cuda:10.0", moe_backend="deep_gemm", activation_key="kMxfp8Dynamic").outcome == "invalid"
    assert ask(oracle, "mxfp4", moe_backend="cutlass").outcome == "invalid"


# ------------------------------------------------------------------ §11.5 priority of the default path


def test_5_priority_list_by_platform(oracle):
    assert pick(oracle, "mxfp4", "cuda:10.0")[1] == "FLASHINFER_TRTLLM_MXFP4_BF16"
    assert pick(oracle, "mxfp4", "cuda:11.0")[1] == "TRITON"           # OAI Triton runs below 13.0 now
    assert pick(oracle, "mxfp4", "cuda:12.0")[1] == "MARLIN"           # TRITON demoted after BATCHED_MARLIN on SM12x
    assert pick(oracle, "mxfp4", "cuda:8.0")[1] == "MARLIN"


def test_5_humming_moves_ahead_of_marlin_on_sm90_only(oracle):
    no_triton = tuple(p for p in ALL if p not in ("triton_kernels", "flashinfer"))  # FI CUTLASS BF16 would win on SM90
    assert pick(oracle, "mxfp4", "cuda:9.0", packages=no_triton)[1] == "HUMMING"
    assert pick(oracle, "mxfp4", "cuda:8.0", packages=no_triton)[1] == "MARLIN"
    assert pick(oracle, "mxfp4", "cuda:9.0", packages=("humming",))[1] == "HUMMING"


def test_5_activation_key_filter(oracle):
    assert pick(oracle, "mxfp4", "cuda:10.0", activation_key="kMxfp8Dynamic")[1] == "FLASHINFER_TRTLLM_MXFP4_MXFP8"
    # matching variants (and EMULATION) come before the BF16 ones: on Hopper nothing native matches MXFP4 activations
    assert pick(oracle, "mxfp4", "cuda:9.0", activation_key="kMxfp4Dynamic")[1] == "EMULATION"
    assert pick(oracle, "mxfp4", "cuda:10.0", activation_key="kMxfp4Dynamic")[1] == "CUTLASS_MXFP4_MXFP4"
    d = ask(oracle, "mxfp4", "cuda:9.0", activation_key="kMxfp4Dynamic")
    assert d.activation_key == "kMxfp4Dynamic"  # emulation fake-quantizes to the requested key


# ------------------------------------------------------------------ §11.6 DeepSeek-V4 path


@pytest.mark.parametrize("platform, packages, moe, backend", [
    ("rocm:gfx942", ALL, {}, "EMULATION"),                                  # AITER CK MXFP4 needs gfx950
    ("rocm:gfx942", ALL, {"routing_method": "DeepseekV4"}, "TRITON_UNFUSED"),
    ("rocm:gfx950", ALL, {"activation": "silu"}, "EMULATION"),             # AITER off without VLLM_ROCM_USE_AITER
    ("xpu", ALL, {}, "XPU"),
    ("cpu+amx", ALL, {}, "CPU"),
    ("cuda:9.0", ALL, {}, "HUMMING"),                                      # Humming ahead of Marlin on SM90
    ("cuda:8.0", ALL, {}, "MARLIN"),
    ("cuda:12.0", ALL, {"activation": "silu"}, "DEEPGEMM_MXFP4"),          # DeepGEMM FP4 on the SM120 family now
])
def test_6_deepseek_v4_priority_by_platform(oracle, platform, packages, moe, backend):
    assert pick(oracle, "mxfp4-deepseek-v4", platform, packages=packages, **moe)[1] == backend


def test_6_deepseek_v4_aiter_on_gfx950(oracle):
    assert pick(oracle, "mxfp4-deepseek-v4", "rocm:gfx950", env={"VLLM_ROCM_USE_AITER": "1"})[1] == "AITER_MXFP4_BF16"
    assert pick(oracle, "mxfp4-deepseek-v4", "cpu")[0] == "unsupported"


# ------------------------------------------------------------------ §11.7 activation key resolution


def test_7_user_override_and_conflict(oracle):
    assert pick(oracle, "mxfp4", "cuda:10.0", user_activation_key="kMxfp8Dynamic")[1] == "FLASHINFER_TRTLLM_MXFP4_MXFP8"
    assert pick(oracle, "mxfp4", "cuda:10.0", activation_key="kMxfp8Dynamic", user_activation_key="kMxfp8Dynamic")[1] == \
        "FLASHINFER_TRTLLM_MXFP4_MXFP8"
    d = ask(oracle, "mxfp4", "cuda:10.0", activation_key="kMxfp8Dynamic", user_activation_key="kMxfp4Dynamic")
    assert d.outcome == "invalid" and "kMxfp4Dynamic" in d.error


# ------------------------------------------------------------------ §11.9 no platform fallback but XPU


def test_9_fallbacks(oracle):
    assert pick(oracle, "mxfp4", "cpu")[0] == "unsupported"               # no (NONE, None) any more
    assert pick(oracle, "mxfp4", "cpu+amx")[1] == "CPU"
    assert pick(oracle, "mxfp4", "xpu")[1] == "XPU"
    # EMULATION needs amd-quark: SM70 without it has nothing left
    assert pick(oracle, "mxfp4", "cuda:7.0", packages=())[0] == "unsupported"
    assert pick(oracle, "mxfp4", "cuda:7.0")[1] == "EMULATION"
    d = ask(oracle, "mxfp4", "cpu")
    assert "CPU" in d.error  # the unsupported answer lists the candidates and why each refused


# ------------------------------------------------------------------ §11.10 capabilities


@pytest.mark.parametrize("platform, env, moe, backend", [
    ("rocm:gfx942", {"VLLM_ROCM_USE_AITER": "1"}, {}, "AITER_TRITON_MXFP4_BF16"),  # AITER Triton W4A16 on gfx942
    ("rocm:gfx950", {"VLLM_ROCM_USE_AITER": "1"}, {}, "AITER_MXFP4_BF16"),         # AITER CK on gfx950
    ("rocm:gfx950", {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MOE": "0"}, {}, "AITER_TRITON_MXFP4_BF16"),
    ("rocm:gfx1250", {}, {}, "EMULATION"),                                         # no OAI Triton on gfx1250
    ("rocm:gfx950", {"VLLM_ROCM_USE_AITER": "1"}, {"activation_key": "kFp8StaticTensorSym"}, "AITER_MXFP4_FP8"),
    ("rocm:gfx942", {"VLLM_ROCM_USE_AITER": "1"}, {"activation_key": "kFp8StaticTensorSym"}, "EMULATION"),
    ("rocm:gfx1250", {"VLLM_ROCM_USE_AITER": "1"}, {"activation_key": "kMxfp4Dynamic"}, "EMULATION"),
])
def test_10_rocm_capabilities(oracle, platform, env, moe, backend):
    assert pick(oracle, "mxfp4", platform, env=env, **moe)[1] == backend


def test_10_aiter_w4a4_on_gfx1250_is_explicit_or_deepseek(oracle):
    assert pick(oracle, "mxfp4", "rocm:gfx1250", env={"VLLM_ROCM_USE_AITER": "1"}, activation_key="kMxfp4Dynamic",
                moe_backend="aiter_triton_mxfp4_mxfp4")[1] == "AITER_TRITON_MXFP4_MXFP4"


# ------------------------------------------------------------------ §11.11 round-up


@pytest.mark.parametrize("platform, backend, moe, sizes", [
    ("cuda:10.0", "FLASHINFER_TRTLLM_MXFP4_BF16", {}, (3072, 2944)),   # intermediate 128 now (0.20: 256)
    ("cuda:10.0", "EMULATION", {"hidden_size": 2900, "intermediate_size": 700}, (2912, 704)),
    ("cuda:10.0", "CUTLASS_MXFP4_MXFP4", {}, (2944, 2944)),
    ("cuda:12.0", "B12X_MXFP4_MXFP8", {"hidden_size": 2900, "intermediate_size": 700}, (2900, 700)),
    ("cpu+amx", "CPU", {"hidden_size": 2900, "intermediate_size": 700}, (2912, 704)),
    ("xpu", "MARLIN", {}, (2944, 2944)),
    ("rocm:gfx950", "AITER_MXFP4_BF16", {"activation": "silu"}, (2944, 2944)),
    ("rocm:gfx950", "AITER_MXFP4_BF16", {"activation": "swigluoai"}, (3072, 3072)),
    ("rocm:gfx942", "TRITON_UNFUSED", {"activation": "silu"}, (2944, 2944)),
    ("rocm:gfx950", "TRITON_UNFUSED", {"activation": "silu"}, (3072, 3072)),
    ("rocm:gfx950", "AITER_MXFP4_MXFP4", {}, (3072, 2944)),
    ("cuda:9.0", "TRITON", {"intermediate_size": 720}, (2880, 768)),
])
def test_11_round_up(oracle, platform, backend, moe, sizes):
    d = ask(oracle, "mxfp4", platform, query="round_up", backend=backend, **moe)
    assert (d.outcome, d.hidden_size, d.intermediate_size) == ("selected", *sizes)


# ------------------------------------------------------------------ NVFP4


NV = {"weight_key": "kNvfp4Static", "activation_key": "kNvfp4Dynamic", "activation": "silu"}


@pytest.mark.parametrize("platform, backend", [
    ("cuda:9.0", "HUMMING"), ("cuda:10.0", "FLASHINFER_TRTLLM"), ("cuda:11.0", "VLLM_CUTLASS"),
    ("cuda:12.0", "FLASHINFER_CUTLASS"), ("cuda:8.0", "MARLIN"), ("rocm:gfx942", "EMULATION"), ("xpu", "EMULATION"),
])
def test_nvfp4_platforms(oracle, platform, backend):
    assert pick(oracle, "nvfp4", platform, **NV)[1] == backend


def test_nvfp4_keys_default_to_the_nvfp4_pair(oracle):
    assert pick(oracle, "nvfp4", "cuda:10.0", activation="silu") == \
        ("selected", "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsMonolithic")
    d = ask(oracle, "nvfp4", "cuda:10.0", activation="silu", moe_backend="b12x", weight_key="kNvfp4Static",
            activation_key=None)
    assert d.outcome == "invalid"  # b12x is SM120 only, whatever the keys


def test_nvfp4_cpu_and_removed_env_vars(oracle):
    assert pick(oracle, "nvfp4", "cpu", **NV)[0] == "unsupported"
    assert pick(oracle, "nvfp4", "cuda:10.0", env={"VLLM_USE_FLASHINFER_MOE_FP4": "0"}, **NV)[1] == "FLASHINFER_TRTLLM"
    assert pick(oracle, "nvfp4", "cuda:10.0", env={"VLLM_TEST_FORCE_FP8_MARLIN": "1"}, **NV)[1] == "FLASHINFER_TRTLLM"


def test_nvfp4_swiglu_limit_keeps_clamping_backends(oracle):
    batched = {**NV, "parallel": DEEPEP_LL}
    assert pick(oracle, "nvfp4", "cuda:10.0", **batched)[1] == "FLASHINFER_CUTEDSL_BATCHED"
    # the batched CuteDSL backend does not clamp; no other candidate takes the batched format with EP here
    assert pick(oracle, "nvfp4", "cuda:10.0", swiglu_limit=7.0, **batched) == ("unsupported", None, None)
    assert ask(oracle, "nvfp4", "cuda:12.0", swiglu_limit=7.0, moe_backend="flashinfer_b12x", **NV).outcome == "invalid"
    assert pick(oracle, "nvfp4", "cuda:12.0", moe_backend="flashinfer_b12x", **NV)[1] == "FLASHINFER_B12X"


def test_nvfp4_b12x_force_a16_drops_the_activation_key(oracle):
    d = ask(oracle, "nvfp4", "cuda:12.0", moe_backend="b12x", env={"VLLM_B12X_MOE_FP4_FORCE_A16": "1"}, **NV)
    assert (d.outcome, d.backend, d.activation_key) == ("selected", "B12X", None)
    assert ask(oracle, "nvfp4", "cuda:12.0", moe_backend="b12x", **NV).activation_key == "kNvfp4Dynamic"


def test_nvfp4_map_backend_is_one_backend(oracle):
    d = ask(oracle, "nvfp4", query="map_backend", moe_backend="humming")
    assert (d.outcome, d.backend) == ("selected", "HUMMING")


# ------------------------------------------------------------------ Quark OCP MX


MX_W = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0"}
MX_IN = {"dtype": "fp4", "is_dynamic": True, "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0"}


def test_quark_recognition_and_schemes(oracle):
    d = ask(oracle, "ocp-mx", "cuda:10.0", quark={"weight": MX_W, "input": MX_IN})
    assert (d.outcome, d.backend, d.extras["ocp_mx_scheme"]) == ("selected", "CUTLASS_MXFP4_MXFP4", "w_mxfp4_a_mxfp4")
    d = ask(oracle, "ocp-mx", "rocm:gfx950", env={"VLLM_ROCM_USE_AITER": "1"}, quark={"weight": MX_W, "input": None})
    assert (d.outcome, d.backend, d.extras["ocp_mx_scheme"]) == ("selected", "AITER_MXFP4_BF16", "w_mxfp4")
    # group size 16 or non-e8m0 scales: not OCP MX for 0.33
    for weight in ({**MX_W, "group_size": 16}, {**MX_W, "scale_format": "fp8"}):
        d = ask(oracle, "ocp-mx", "cuda:10.0", quark={"weight": weight, "input": None})
        assert (d.outcome, d.extras.get("ocp_mx_scheme")) == ("none", None)
    # MXFP6 weights always emulate; there is no `emulate` field any more
    d = ask(oracle, "ocp-mx", "cuda:10.0", quark={"weight": {**MX_W, "dtype": "fp6_e3m2"}, "input": None})
    assert (d.backend, d.extras["ocp_mx_scheme"], "emulate" in d.extras) == ("EMULATION", "w_mxfp6_e3m2", False)


def test_quark_static_fp8_inputs(oracle):
    static_fp8 = {"dtype": "fp8_e4m3", "is_dynamic": False, "qscheme": "per_tensor", "symmetric": True}
    d = ask(oracle, "ocp-mx", "rocm:gfx950", env={"VLLM_ROCM_USE_AITER": "1"}, quark={"weight": MX_W, "input": static_fp8})
    assert (d.backend, d.extras["static_input_scales"]) == ("AITER_MXFP4_FP8", True)
    dynamic_fp8 = {**static_fp8, "is_dynamic": True}
    assert ask(oracle, "ocp-mx", "cuda:10.0", quark={"weight": MX_W, "input": dynamic_fp8}).outcome == "unsupported"
    unknown = {"dtype": "int8", "is_dynamic": True, "qscheme": "per_tensor"}
    assert ask(oracle, "ocp-mx", "cuda:10.0", quark={"weight": MX_W, "input": unknown}).outcome == "invalid"


# ------------------------------------------------------------------ scenario fields of the profile


def test_new_scenario_fields_are_validated(oracle):
    assert ask(oracle, "mxfp4", "cuda:9.0", swiglu_limit="high").outcome == "error"
    bad = oracle.select({"profile": PROFILE, "policy": "mxfp4", "platform": {"kind": "cuda", "capability": [9, 0], "amx": True}})
    assert bad.outcome == "error" and "amx" in bad.error
    ok = oracle.select({"profile": PROFILE, "policy": "mxfp4", "platform": {"kind": "rocm", "gcn_arch": "gfx1250"},
                        "packages": {"quark": True}})
    assert ok.outcome == "selected" and ok.backend == "EMULATION"


def test_the_profile_is_listed():
    assert PROFILE in Oracle().profiles()
