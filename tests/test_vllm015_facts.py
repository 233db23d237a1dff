"""The vllm-0.15 profile's NVFP4 experts classes, row by row, against vLLM 0.15.1's wheel facts.

Every expectation is derived by hand from shared/reference/vllm-oracle.md §2.3 (the classes as
0.15.1 ships them) and §5.4 (its TRTLLM support function), not from the golden sample. Each class
is isolated through a path that checks it alone:
  FlashInferExperts       VLLM_USE_FLASHINFER_MOE_FP4=1 + VLLM_FLASHINFER_MOE_BACKEND=throughput (forced)
  FlashInferCuteDSLExperts VLLM_USE_FLASHINFER_MOE_FP4=1 + VLLM_FLASHINFER_MOE_BACKEND=masked_gemm (forced)
  MarlinExperts           VLLM_TEST_FORCE_FP8_MARLIN=1 (forced)
  CutlassExpertsFp4       VLLM_USE_FLASHINFER_MOE_FP4=0: the first candidate tried (read from the trace)
  is_supported_config_trtllm  VLLM_FLASHINFER_MOE_BACKEND=latency on the SM100 family (forced)
0.15.1 has no routing-method (except TRTLLM's function), batch-invariance or LoRA check.
"""
from __future__ import annotations

import pytest

from oracle import Oracle
from oracle.trace import CandidateEntry

ORACLE = Oracle()
ALL_ACTIVATIONS = ("silu", "gelu", "swigluoai", "swiglustep", "silu_no_mul", "gelu_no_mul", "relu2_no_mul")
FORCE = {
    "FLASHINFER_CUTLASS": {"VLLM_USE_FLASHINFER_MOE_FP4": "1", "VLLM_FLASHINFER_MOE_BACKEND": "throughput"},
    "FLASHINFER_CUTEDSL": {"VLLM_USE_FLASHINFER_MOE_FP4": "1", "VLLM_FLASHINFER_MOE_BACKEND": "masked_gemm"},
    "MARLIN": {"VLLM_TEST_FORCE_FP8_MARLIN": "1"},
    "FLASHINFER_TRTLLM": {"VLLM_USE_FLASHINFER_MOE_FP4": "1", "VLLM_FLASHINFER_MOE_BACKEND": "latency"},
}
PPLX = {"dp_size": 2, "ep_size": 2, "use_ep": True, "all2all_backend": "pplx"}
NVLINK = {"dp_size": 2, "ep_size": 2, "use_ep": True, "all2all_backend": "flashinfer_nvlink_two_sided"}


def cuda(major: int, minor: int) -> dict:
    return {"kind": "cuda", "capability": [major, minor]}


def ask(platform: dict, env: dict, packages: dict | None = None, **moe):
    moe.setdefault("activation", "silu")
    moe.setdefault("is_act_and_mul", not moe["activation"].endswith("_no_mul"))
    return ORACLE.select({"policy": "nvfp4", "profile": "vllm-0.15", "platform": platform, "env": env,
                          "packages": {"flashinfer": True} if packages is None else packages, "moe": moe})


def forced(backend: str, platform: dict, **kw) -> bool:
    """Whether the forced backend's class accepts: selected, or invalid (refused); nothing else."""
    d = ask(platform, FORCE[backend], **kw)
    assert d.outcome in ("selected", "invalid"), d.to_dict(with_trace=False)
    if d.outcome == "selected":
        assert d.backend == backend
    return d.outcome == "selected"


def vllm_cutlass(platform: dict, **kw) -> bool:
    """CutlassExpertsFp4's verdict: with FlashInfer dropped it is the first candidate tried."""
    d = ask(platform, {"VLLM_USE_FLASHINFER_MOE_FP4": "0"}, **kw)
    (entry,) = [e for e in d.trace if isinstance(e, CandidateEntry) and e.candidate == "VLLM_CUTLASS"]
    assert entry.kernel == "CutlassExpertsFp4"
    assert (d.backend == "VLLM_CUTLASS") == entry.accepted
    return entry.accepted


# ------------------------------------------------------------------ FlashInferExperts (0.15.1)

@pytest.mark.parametrize("activation", ALL_ACTIVATIONS)
def test_flashinfer_experts_activations(activation):
    assert forced("FLASHINFER_CUTLASS", cuda(10, 0), activation=activation) == (activation in ("silu", "relu2_no_mul"))


@pytest.mark.parametrize("cap,ok", [((9, 0), False), ((8, 9), False), ((10, 0), True), ((10, 3), True),
                                    ((11, 0), True), ((12, 0), True), ((12, 1), True)])
def test_flashinfer_experts_devices_with_nvfp4_keys(cap, ok):
    # 9.0 is a supported device, but the NVFP4 row needs >= 10.0
    assert forced("FLASHINFER_CUTLASS", cuda(*cap)) == ok


def test_flashinfer_experts_quant_rows_by_capability():
    bf16 = {"weight_key": None, "activation_key": None}
    fp8_block = {"weight_key": "kFp8Static128BlockSym", "activation_key": "kFp8Dynamic128Sym"}
    fp8_tensor = {"weight_key": "kFp8StaticTensorSym", "activation_key": "kFp8StaticTensorSym"}
    assert forced("FLASHINFER_CUTLASS", cuda(9, 0), **bf16) and forced("FLASHINFER_CUTLASS", cuda(12, 0), **bf16)
    assert forced("FLASHINFER_CUTLASS", cuda(9, 0), **fp8_tensor) and forced("FLASHINFER_CUTLASS", cuda(10, 0), **fp8_tensor)
    assert forced("FLASHINFER_CUTLASS", cuda(9, 0), **fp8_block)
    assert not forced("FLASHINFER_CUTLASS", cuda(10, 0), **fp8_block)  # block-FP8 only on == 9.0
    # 0.15.1 has no MXFP4 rows in this class
    assert not forced("FLASHINFER_CUTLASS", cuda(10, 0), weight_key="kMxfp4Static", activation_key="kMxfp8Dynamic")


def test_flashinfer_experts_needs_the_package_and_cuda():
    assert not forced("FLASHINFER_CUTLASS", cuda(10, 0), packages={})
    assert not forced("FLASHINFER_CUTLASS", {"kind": "rocm", "gcn_arch": "gfx950"})


@pytest.mark.parametrize("parallel,ok", [
    ({"dp_size": 1, "ep_size": 2, "use_ep": True}, True),
    ({"dp_size": 2, "ep_size": 2, "use_ep": True}, True),
    ({"dp_size": 2, "ep_size": 1}, False),
    ({"dp_size": 4, "ep_size": 2, "use_ep": True}, False),
])
def test_flashinfer_experts_dp_size_one_or_equal_to_ep_size(parallel, ok):
    assert forced("FLASHINFER_CUTLASS", cuda(10, 0), parallel=parallel) == ok


def test_flashinfer_experts_has_no_lora_routing_or_batch_invariance_check():
    assert forced("FLASHINFER_CUTLASS", cuda(10, 0), lora=True)
    assert forced("FLASHINFER_CUTLASS", cuda(10, 0), routing_method="Simulated")
    d = ask(cuda(10, 0), {**FORCE["FLASHINFER_CUTLASS"], "VLLM_BATCH_INVARIANT": "1"})
    assert d.outcome == "selected" and d.kernel == "FlashInferExperts"


def test_flashinfer_experts_refuses_the_batched_format():
    assert not forced("FLASHINFER_CUTLASS", cuda(10, 0), parallel=PPLX)


# ------------------------------------------------------------------ CutlassExpertsFp4 (0.15.1)

@pytest.mark.parametrize("activation", ALL_ACTIVATIONS)
def test_cutlass_fp4_activations_gated_only(activation):
    # no act_and_mul support: the *_no_mul activations (is_act_and_mul false) are refused too
    assert vllm_cutlass(cuda(10, 0), activation=activation) == (activation in ("silu", "gelu", "swigluoai"))


def test_cutlass_fp4_gated_flag_alone_decides_act_and_mul():
    assert not vllm_cutlass(cuda(10, 0), activation="silu", is_act_and_mul=False)


@pytest.mark.parametrize("cap,ok", [((9, 0), False), ((10, 0), True), ((10, 3), True), ((11, 0), True),
                                    ((12, 0), True), ((12, 1), True)])
def test_cutlass_fp4_devices(cap, ok):
    assert vllm_cutlass(cuda(*cap)) == ok


@pytest.mark.parametrize("parallel,ok", [
    ({"dp_size": 1, "ep_size": 1}, True),
    ({"dp_size": 2, "ep_size": 1}, True),
    ({"dp_size": 1, "ep_size": 2, "use_ep": True}, False),
    ({"dp_size": 2, "ep_size": 2, "use_ep": True}, False),
])
def test_cutlass_fp4_needs_ep_size_one(parallel, ok):
    assert vllm_cutlass(cuda(12, 0), parallel=parallel) == ok


def test_cutlass_fp4_keys_exact_and_no_lora_check():
    assert not vllm_cutlass(cuda(10, 0), activation_key=None)
    assert vllm_cutlass(cuda(10, 0), lora=True)


# ------------------------------------------------------------------ MarlinExperts (0.15.1)

@pytest.mark.parametrize("activation", ALL_ACTIVATIONS)
def test_marlin_activations(activation):
    # every listed activation is accepted for a gated layer; swiglustep is not in 0.15.1's list
    assert forced("MARLIN", cuda(9, 0), activation=activation, is_act_and_mul=True) == (activation != "swiglustep")


@pytest.mark.parametrize("activation", ["silu_no_mul", "gelu_no_mul", "relu2_no_mul"])
def test_marlin_refuses_non_gated_layers(activation):
    assert not forced("MARLIN", cuda(9, 0), activation=activation)


@pytest.mark.parametrize("cap,ok", [((7, 0), False), ((7, 5), True), ((8, 0), True), ((9, 0), True), ((12, 0), True)])
def test_marlin_devices(cap, ok):
    assert forced("MARLIN", cuda(*cap)) == ok


@pytest.mark.parametrize("weight,ok", [("kNvfp4Static", True), ("kFp8Static128BlockSym", True),
                                       ("kFp8StaticChannelSym", True), ("kFp8StaticTensorSym", True),
                                       ("kMxfp4Static", False), ("kMxfp8Static", False), ("kInt4Static", False)])
def test_marlin_weight_keys_activation_key_ignored(weight, ok):
    assert forced("MARLIN", cuda(9, 0), weight_key=weight, activation_key=None) == ok
    assert forced("MARLIN", cuda(9, 0), weight_key=weight, activation_key="kNvfp4Dynamic") == ok


def test_marlin_any_parallel_config_no_lora_or_batch_invariance_check():
    assert forced("MARLIN", cuda(9, 0), parallel=NVLINK)
    assert forced("MARLIN", cuda(9, 0), parallel={"dp_size": 2, "ep_size": 2, "use_ep": True})
    assert forced("MARLIN", cuda(9, 0), lora=True)
    assert ask(cuda(9, 0), {**FORCE["MARLIN"], "VLLM_BATCH_INVARIANT": "1"}).outcome == "selected"
    assert not forced("MARLIN", cuda(9, 0), parallel=PPLX)  # MarlinExperts is the standard-format class


# ------------------------------------------------------------------ FlashInferCuteDSLExperts (0.15.1)

def test_cutedsl_batched_format_only_and_no_package_check():
    assert forced("FLASHINFER_CUTEDSL", cuda(10, 0), parallel=PPLX, packages={})
    assert forced("FLASHINFER_CUTEDSL", cuda(10, 3), parallel=PPLX, lora=True)
    assert not forced("FLASHINFER_CUTEDSL", cuda(10, 0))  # standard format
    assert not forced("FLASHINFER_CUTEDSL", cuda(12, 0), parallel=PPLX)  # family 10x only


@pytest.mark.parametrize("activation", ALL_ACTIVATIONS)
def test_cutedsl_silu_only(activation):
    assert forced("FLASHINFER_CUTEDSL", cuda(10, 0), parallel=PPLX, activation=activation) == (activation == "silu")


# ------------------------------------------------------------------ is_supported_config_trtllm (§5.4)

def test_trtllm_function_has_no_lora_or_batch_invariance_check():
    assert forced("FLASHINFER_TRTLLM", cuda(10, 0), lora=True)
    assert forced("FLASHINFER_TRTLLM", cuda(10, 0), packages={})  # no flashinfer presence check
    assert ask(cuda(10, 0), {**FORCE["FLASHINFER_TRTLLM"], "VLLM_BATCH_INVARIANT": "1"}).outcome == "selected"
    assert not forced("FLASHINFER_TRTLLM", cuda(10, 0), routing_method="Simulated")
    assert not forced("FLASHINFER_TRTLLM", cuda(10, 0), activation="gelu")


# ------------------------------------------------------------------ end to end: the cases 0.15 used to get wrong

def test_auto_selection_follows_the_015_classes():
    # SM100 + flashinfer, swigluoai: TRTLLM (silu), CuteDSL (batched), FlashInferExperts (no swigluoai) refuse
    d = ask(cuda(10, 0), {}, activation="swigluoai")
    assert (d.backend, d.kernel) == ("VLLM_CUTLASS", "CutlassExpertsFp4")
    # SM120 with LoRA: 0.15.1 has no LoRA check, so FlashInfer CUTLASS keeps it
    d = ask(cuda(12, 0), {}, lora=True)
    assert (d.backend, d.kernel) == ("FLASHINFER_CUTLASS", "FlashInferExperts")
    # SM120, gelu: FlashInferExperts refuses gelu, CutlassExpertsFp4 takes it
    d = ask(cuda(12, 0), {}, activation="gelu")
    assert (d.backend, d.kernel) == ("VLLM_CUTLASS", "CutlassExpertsFp4")
    # SM120, expert parallel without DP: FlashInferExperts (dp_size 1) keeps it
    d = ask(cuda(12, 0), {}, parallel={"dp_size": 1, "ep_size": 2, "use_ep": True})
    assert d.backend == "FLASHINFER_CUTLASS"
    # SM120, swiglustep: nothing in 0.15.1 takes it
    assert ask(cuda(12, 0), {}, activation="swiglustep").outcome == "unsupported"
