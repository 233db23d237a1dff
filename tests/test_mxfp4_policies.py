"""MXFP4 selection cases derived from vLLM 0.20.0's logic (reference §1-§3), not from the golden file."""
from __future__ import annotations

import pytest

from conftest import scenario

ALL = ("flashinfer", "triton_kernels", "deep_gemm", "aiter")
GPT, GEN = "mxfp4-gpt-oss", "mxfp4"
DEEPEP_LL = {"dp_size": 2, "ep_size": 2, "use_ep": True, "all2all_backend": "deepep_low_latency"}


def pick(oracle, *args, **kw):
    d = oracle.select(scenario(*args, **kw))
    return d.outcome, d.backend, d.kernel


@pytest.mark.parametrize("platform, gpt_oss, generic", [
    ("cuda:7.0", ("selected", "EMULATION", "OCP_MXQuantizationEmulationTritonExperts"), ("unsupported", None, None)),
    ("cuda:7.5", ("selected", "MARLIN", "MarlinExperts"), ("selected", "MARLIN", "MarlinExperts")),
    ("cuda:8.9", ("selected", "MARLIN", "MarlinExperts"), ("selected", "MARLIN", "MarlinExperts")),
    ("cuda:9.0", ("selected", "TRITON", "OAITritonMxfp4ExpertsMonolithic"), ("selected", "MARLIN", "MarlinExperts")),
    ("cuda:10.0", ("selected", "FLASHINFER_TRTLLM_MXFP4_BF16", "TrtLlmMxfp4ExpertsMonolithic"),
     ("selected", "FLASHINFER_TRTLLM_MXFP4_MXFP8", "TrtLlmMxfp4ExpertsMonolithic")),
    ("cuda:10.3", ("selected", "FLASHINFER_TRTLLM_MXFP4_BF16", "TrtLlmMxfp4ExpertsMonolithic"),
     ("selected", "FLASHINFER_TRTLLM_MXFP4_MXFP8", "TrtLlmMxfp4ExpertsMonolithic")),
    ("cuda:12.0", ("selected", "MARLIN", "MarlinExperts"), ("selected", "MARLIN", "MarlinExperts")),
    ("rocm:gfx90a", ("selected", "TRITON", "OAITritonMxfp4ExpertsMonolithic"), ("unsupported", None, None)),
    ("rocm:gfx942", ("selected", "TRITON", "OAITritonMxfp4ExpertsMonolithic"), ("unsupported", None, None)),
    ("xpu", ("selected", "XPU", "XPUExpertsMXFp4"), ("unsupported", None, None)),
    ("cpu", ("none", None, None), ("unsupported", None, None)),
])
def test_platform_fallbacks(oracle, platform, gpt_oss, generic):
    assert pick(oracle, GPT, platform) == gpt_oss
    assert pick(oracle, GEN, platform) == generic


@pytest.mark.parametrize("platform, backend", [("cuda:9.0", "MARLIN"), ("cuda:10.0", "MARLIN"), ("rocm:gfx950", "EMULATION")])
def test_without_optional_packages(oracle, platform, backend):
    assert pick(oracle, GPT, platform, packages=())[1] == backend


def test_rocm_aiter_switches(oracle):
    on = {"VLLM_ROCM_USE_AITER": "1"}
    assert pick(oracle, GPT, "rocm:gfx950", env=on)[1] == "AITER"
    assert pick(oracle, GPT, "rocm:gfx950", env={"VLLM_ROCM_USE_AITER": "TRUE"})[1] == "AITER"
    assert pick(oracle, GPT, "rocm:gfx942", env=on)[1] == "TRITON", "MXFP4 AITER needs gfx950"
    assert pick(oracle, GPT, "rocm:gfx950", env={**on, "VLLM_ROCM_USE_AITER_MOE": "0"})[1] == "TRITON"
    assert pick(oracle, GPT, "rocm:gfx950", env=on, packages=("triton_kernels",))[1] == "TRITON"


def test_bf16_env_unset_and_zero_differ(oracle):
    assert pick(oracle, GPT, "cuda:10.0")[1] == "FLASHINFER_TRTLLM_MXFP4_BF16"
    # "0" removes both FlashInfer BF16 backends; TRITON (9.0 <= 10.0 < 11.0) is next
    assert pick(oracle, GPT, "cuda:10.0", env={"VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "0"})[1] == "TRITON"


@pytest.mark.parametrize("platform, expected", [
    ("cuda:9.0", ("selected", "FLASHINFER_CUTLASS_MXFP4_BF16", "FlashInferExperts")),
    ("cuda:10.3", ("selected", "FLASHINFER_TRTLLM_MXFP4_BF16", "TrtLlmMxfp4ExpertsMonolithic")),
    ("cuda:8.0", ("invalid", None, None)),
    ("cuda:12.0", ("invalid", None, None)),
    ("rocm:gfx950", ("invalid", None, None)),
    ("cpu", ("invalid", None, None)),
])
def test_bf16_forced(oracle, platform, expected):
    assert pick(oracle, GPT, platform, env={"VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "1"}) == expected


def test_env_precedence_bf16_then_mxfp8_then_cutlass_then_marlin(oracle):
    everything = {"VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "1", "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": "1",
                  "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS": "1", "VLLM_MXFP4_USE_MARLIN": "1"}
    assert pick(oracle, GPT, "cuda:10.0", env=everything)[1] == "FLASHINFER_TRTLLM_MXFP4_BF16"
    del everything["VLLM_USE_FLASHINFER_MOE_MXFP4_BF16"]
    assert pick(oracle, GPT, "cuda:10.0", env=everything)[1] == "FLASHINFER_TRTLLM_MXFP4_MXFP8"
    del everything["VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8"]
    assert pick(oracle, GPT, "cuda:10.0", env=everything)[1] == "FLASHINFER_CUTLASS_MXFP4_MXFP8"
    del everything["VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS"]
    assert pick(oracle, GPT, "cuda:10.0", env=everything)[1] == "MARLIN"


def test_zero_values_of_forcing_vars_have_no_effect(oracle):
    base = pick(oracle, GPT, "cuda:9.0")
    for var in ("VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8", "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS", "VLLM_MXFP4_USE_MARLIN"):
        assert pick(oracle, GPT, "cuda:9.0", env={var: "0"}) == base


def test_forced_backend_that_does_not_fit_is_invalid(oracle):
    d = oracle.select(scenario(GPT, "cuda:9.0", env={"VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": "1"}))
    assert d.outcome == "invalid"
    assert "FLASHINFER_TRTLLM_MXFP4_MXFP8" in d.error and "current device cuda" in d.error
    # Marlin forced is not remapped to BatchedMarlin: batched mode refuses it
    d = oracle.select(scenario(GPT, "cuda:9.0", env={"VLLM_MXFP4_USE_MARLIN": "1"}, parallel=DEEPEP_LL))
    assert d.outcome == "invalid" and "activation format" in d.error


def test_unparsable_env_value_is_invalid_and_named(oracle):
    d = oracle.select(scenario(GPT, "cuda:9.0", env={"VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "true"}))
    assert d.outcome == "invalid"
    assert "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16='true'" in d.error and "0 or 1" in d.error


@pytest.mark.parametrize("platform, env, expected", [
    ("cuda:9.0", {}, ("selected", "MARLIN", "MarlinExperts")),
    ("cuda:7.0", {}, ("selected", "MARLIN", "MarlinExperts")),  # unchecked, even below SM75
    ("cuda:9.0", {"VLLM_MXFP4_USE_MARLIN": "0"}, ("selected", "TRITON_UNFUSED", "UnfusedOAITritonExperts")),
    ("cuda:8.0", {"VLLM_MXFP4_USE_MARLIN": "0"}, ("selected", "MARLIN", "MarlinExperts")),
    ("cuda:10.0", {"VLLM_MXFP4_USE_MARLIN": "1"}, ("selected", "MARLIN", "MarlinExperts")),
    ("rocm:gfx950", {}, ("unsupported", None, None)),
    ("xpu", {}, ("unsupported", None, None)),
    ("cpu", {"VLLM_MXFP4_USE_MARLIN": "0"}, ("unsupported", None, None)),
])
def test_lora_branch(oracle, platform, env, expected):
    assert pick(oracle, GPT, platform, env=env, lora=True) == expected


def test_generic_selector_has_no_lora_branch_but_kernels_refuse_lora(oracle):
    assert pick(oracle, GEN, "cuda:10.0", lora=True)[1] == "MARLIN"
    assert pick(oracle, GEN, "cuda:10.0", env={"VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "1"}) == \
        pick(oracle, GEN, "cuda:10.0"), "the generic selector reads no env var"


def test_batched_activation_format(oracle):
    assert pick(oracle, GPT, "cuda:9.0", parallel=DEEPEP_LL) == ("selected", "BATCHED_MARLIN", "BatchedMarlinExperts")
    assert pick(oracle, GPT, "cuda:9.0", moe_backend="marlin", parallel=DEEPEP_LL)[1] == "BATCHED_MARLIN"
    nixl = {**DEEPEP_LL, "all2all_backend": "nixl_ep"}
    assert pick(oracle, GEN, "cuda:9.0", parallel=nixl)[1] == "BATCHED_MARLIN"
    no_ep = {**DEEPEP_LL, "use_ep": False}
    assert pick(oracle, GPT, "cuda:9.0", parallel=no_ep)[2] == "OAITritonExperts", "standard format, but dp>1 needs modular"


def test_monolithic_gives_way_to_modular(oracle):
    ht = {"dp_size": 2, "ep_size": 2, "use_ep": True, "all2all_backend": "deepep_high_throughput"}
    assert pick(oracle, GPT, "cuda:9.0", parallel=ht) == ("selected", "TRITON", "OAITritonExperts")
    assert pick(oracle, GPT, "cuda:9.0", parallel={"eplb": True})[2] == "OAITritonExperts"
    assert pick(oracle, GPT, "cuda:10.0", routing_method="DeepSeekV3")[2] == "TrtLlmMxfp4ExpertsModular"
    fi_nvl = {"dp_size": 2, "use_ep": True, "all2all_backend": "flashinfer_nvlink_one_sided"}
    assert pick(oracle, GEN, "cuda:8.0", parallel=fi_nvl)[0] == "unsupported", "Marlin refuses FlashInfer NVLink all2all"


def test_explicit_moe_backend(oracle):
    assert pick(oracle, GPT, "cuda:10.0", moe_backend="triton") == ("selected", "TRITON", "OAITritonMxfp4ExpertsMonolithic")
    assert pick(oracle, GPT, "cuda:7.5", moe_backend="marlin", env={"VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "1"})[1] == "MARLIN"
    for bad in ("MARLIN", "cutlass", "flashinfer_cutedsl", "auto "):
        d = oracle.select(scenario(GPT, "cuda:9.0", moe_backend=bad))
        assert d.outcome == "invalid" and f"moe_backend='{bad}'" in d.error and "'emulation'" in d.error
    d = oracle.select(scenario(GEN, "cuda:9.0", moe_backend="deep_gemm", activation="silu"))
    assert d.outcome == "invalid" and "DEEPGEMM_MXFP4" in d.error


def test_deep_gemm_activation_key_and_switch(oracle):
    d = oracle.select(scenario(GEN, "cuda:10.0", packages=("deep_gemm",), activation="silu"))
    assert (d.backend, d.kernel, d.activation_key) == ("DEEPGEMM_MXFP4", "DeepGemmFP4Experts", "kFp8Dynamic128Sym")
    assert (d.hidden_size, d.intermediate_size) == (2944, 2944)
    assert pick(oracle, GEN, "cuda:10.0", packages=("deep_gemm",), activation="swigluoai")[1] == "MARLIN"
    assert pick(oracle, GEN, "cuda:10.0", packages=("deep_gemm",), activation="silu",
                env={"VLLM_USE_DEEP_GEMM": "0"})[1] == "MARLIN"


def test_batch_invariance_leaves_only_emulation(oracle):
    assert pick(oracle, GPT, "cuda:9.0", env={"VLLM_BATCH_INVARIANT": "1"})[1] == "EMULATION"
    assert pick(oracle, GEN, "cuda:9.0", env={"VLLM_BATCH_INVARIANT": "1"})[0] == "unsupported"


@pytest.mark.parametrize("backend, platform, sizes, expected", [
    ("FLASHINFER_TRTLLM_MXFP4_BF16", "cuda:10.0", (2880, 2880), (3072, 3072)),
    ("MARLIN", "cuda:9.0", (2880, 2880), (3072, 2944)),
    ("MARLIN", "xpu", (2880, 2880), (2944, 2944)),
    ("FLASHINFER_CUTLASS_MXFP4_MXFP8", "cuda:10.0", (2880, 2880), (2944, 2944)),
    ("DEEPGEMM_MXFP4", "cuda:10.0", (2880, 2880), (2944, 2944)),
    ("TRITON", "cuda:9.0", (2880, 2880), (2880, 2880)),
    ("TRITON", "rocm:gfx942", (2880, 2880), (3072, 3072)),
    ("TRITON", "cuda:9.0", (2880, 720), (2880, 768)),
    ("None", "rocm:gfx950", (2880, 720), (3072, 768)),
    ("None", "cuda:9.0", (7168, 2048), (7168, 2048)),
])
def test_round_up(oracle, backend, platform, sizes, expected):
    sc = scenario(GEN, platform, hidden_size=sizes[0], intermediate_size=sizes[1])
    d = oracle.select({**sc, "query": "round_up", "backend": backend})
    assert (d.outcome, d.hidden_size, d.intermediate_size) == ("selected", *expected)


def test_selection_reports_rounded_sizes(oracle):
    d = oracle.select(scenario(GPT, "cuda:10.0", hidden_size=2880, intermediate_size=2880))
    assert (d.hidden_size, d.intermediate_size) == (3072, 3072)


def test_round_up_unknown_backend_is_invalid(oracle):
    d = oracle.select({**scenario(GEN, "cuda:9.0"), "query": "round_up", "backend": "TRITN"})
    assert d.outcome == "invalid" and "did you mean 'TRITON'" in d.error


def test_map_backend(oracle):
    q = {"query": "map_backend"}
    assert oracle.select({**scenario(GEN, "cuda:9.0", moe_backend="flashinfer_cutlass_afp8"), **q}).backend == \
        "FLASHINFER_CUTLASS_MXFP4_MXFP8"
    assert oracle.select({**scenario(GPT, "cuda:9.0", moe_backend="marlin", parallel=DEEPEP_LL), **q}).backend == "BATCHED_MARLIN"
    assert oracle.select({**scenario(GPT, "cuda:9.0", moe_backend="humming"), **q}).outcome == "invalid"
