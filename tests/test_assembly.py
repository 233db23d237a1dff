"""Kernel assembly as data (issue 15 item 4; facts: vLLM 0.20.0 / 0.33.0 make_mxfp4_moe_kernel and
make_nvfp4_moe_kernel): monolithic vs modular in the rules' variant order, the batched format's max tokens per
rank, the in-place rule, shared experts only in the batched format; a layer this project cannot run still
answers with the decision and its assembly."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backends import MoELayer
from backends.assembly import describe_assembly, kernel_assembly
from backends.layer import LayerUnavailableError
from backends.quark import QuarkOCPMXMoE

from conftest import edited_rules, scenario
from layout_cases import random_layer

ROOT = Path(__file__).resolve().parent.parent
DEEPEP_LL = {"dp_size": 2, "ep_size": 2, "use_ep": True, "all2all_backend": "deepep_low_latency"}


def _assembly(oracle, sc, **kw):
    d = oracle.select(sc)
    assert d.outcome == "selected", d.error
    return kernel_assembly(oracle, d, sc, **kw)




def test_trtllm_is_monolithic_first_and_never_in_place(oracle):
    a = _assembly(oracle, scenario("mxfp4-gpt-oss", "cuda:10.0"))
    assert (a.backend, a.kernel, a.monolithic, a.stages) == (
        "FLASHINFER_TRTLLM_MXFP4_BF16", "TrtLlmMxfp4ExpertsMonolithic", True, ("monolithic",))
    assert a.variants == (("TrtLlmMxfp4ExpertsMonolithic", True), ("TrtLlmMxfp4ExpertsModular", False))
    assert (a.inplace, a.activation_format, a.max_tokens_per_rank, a.shared_experts) == (False, "standard", None,
                                                                                         False)
    assert any("TRTLLM_BACKENDS" in why for why in a.why)


def test_other_vllm_020_mxfp4_backends_may_run_in_place(oracle):
    a = _assembly(oracle, scenario("mxfp4-gpt-oss", "cuda:9.0"))
    assert (a.backend, a.inplace, a.monolithic) == ("TRITON", True, True)


def test_the_batched_format_gives_max_tokens_per_rank_and_the_shared_experts(oracle):
    """DeepEP low-latency all2all: batched experts (modular), 256 tokens per rank unless the layer gives its
    scheduler budget; 0.20's MXFP4 kernel then owns the shared experts."""
    sc = scenario("mxfp4-gpt-oss", "cuda:9.0", parallel=DEEPEP_LL)
    a = _assembly(oracle, sc)
    assert (a.backend, a.activation_format, a.max_tokens_per_rank, a.shared_experts) == (
        "BATCHED_MARLIN", "batched", 256, True)
    assert (a.monolithic, a.stages) == (False, ("prepare", "experts", "finalize"))
    assert describe_assembly(a) == ("assembly prepare -> experts -> finalize; variants in order: BatchedMarlinExperts; "
                                    "batched format, max 256 tokens per rank; may run in place; shared experts in "
                                    "the kernel")
    assert _assembly(oracle, sc, max_num_batched_tokens=1024).max_tokens_per_rank == 1024
    # the standard format ignores the budget: no max tokens per rank
    assert _assembly(oracle, scenario("mxfp4-gpt-oss", "cuda:9.0"), max_num_batched_tokens=1024
                     ).max_tokens_per_rank is None


@pytest.mark.parametrize("profile,shared", [("vllm-0.20", True), ("vllm-0.15", True), ("vllm-0.33", False)])
def test_nvfp4_kernels_never_run_in_place(oracle, profile, shared):
    """0.20 make_nvfp4_moe_kernel passes the shared experts as given and inplace=False; 0.33 takes neither."""
    for parallel in (None, DEEPEP_LL):
        a = _assembly(oracle, scenario("nvfp4", "cuda:10.0", profile=profile, activation="silu", parallel=parallel))
        assert (a.inplace, a.shared_experts) == (False, shared), (profile, parallel)
        assert (a.max_tokens_per_rank is not None) == (a.activation_format == "batched")


def test_vllm_033_kernels_own_neither_in_place_nor_shared_experts(oracle):
    a = _assembly(oracle, scenario("mxfp4", "cuda:9.0", profile="vllm-0.33", activation="swigluoai",
                                   parallel=DEEPEP_LL))
    assert (a.activation_format, a.max_tokens_per_rank, a.inplace, a.shared_experts) == ("batched", 256, False, False)


def test_the_in_place_rule_is_data(tmp_path, oracle):
    """Drop TRT-LLM's own `inplace: false` in a copy of the rules: it inherits the family's in-place."""
    sc = scenario("mxfp4-gpt-oss", "cuda:10.0")
    entry = "      FLASHINFER_TRTLLM_MXFP4_BF16:\n"
    own = '        assembly: {inplace: false, why: "TRTLLM_BACKENDS: the TRT-LLM kernels never write in place"}\n'
    edited = edited_rules(tmp_path, ("common/mxfp4.yaml", entry + own, entry))
    assert (_assembly(oracle, sc).inplace, _assembly(edited, sc).inplace) == (False, True)


def test_shared_experts_follow_the_rule(tmp_path, oracle):
    sc = scenario("mxfp4-gpt-oss", "cuda:10.0")
    edited = edited_rules(tmp_path, ("common/mxfp4.yaml", "inplace: true, shared_experts: batched,",
                                     "inplace: true, shared_experts: always,"))
    assert (_assembly(oracle, sc).shared_experts, _assembly(edited, sc).shared_experts) == (False, True)


def test_variant_order_is_the_rules(tmp_path, oracle):
    """Swap TRT-LLM's two variants in a copy of the rules: the modular one is chosen and assembles in three stages."""
    sc = scenario("mxfp4-gpt-oss", "cuda:10.0")
    old = ("      FLASHINFER_TRTLLM_MXFP4_BF16:\n"
           '        assembly: {inplace: false, why: "TRTLLM_BACKENDS: the TRT-LLM kernels never write in place"}\n'
           "        quant_config: w4a16\n"
           "        kernels: [TrtLlmMxfp4ExpertsMonolithic, TrtLlmMxfp4ExpertsModular]\n")
    edited = edited_rules(tmp_path, ("common/mxfp4.yaml", old,
                                     old.replace("[TrtLlmMxfp4ExpertsMonolithic, TrtLlmMxfp4ExpertsModular]",
                                                 "[TrtLlmMxfp4ExpertsModular, TrtLlmMxfp4ExpertsMonolithic]")))
    a = _assembly(edited, sc)
    assert (a.kernel, a.monolithic, a.stages) == ("TrtLlmMxfp4ExpertsModular", False, ("prepare", "experts",
                                                                                       "finalize"))
    assert [m for _, m in a.variants] == [False, True]


def test_a_layer_this_project_cannot_run_answers_with_the_decision_and_its_assembly():
    w = random_layer("mxfp4", experts=4, hidden=128, inter=128, seed=1)
    with pytest.raises(LayerUnavailableError, match="cannot run") as info:
        MoELayer.from_checkpoint(w, activation="swigluoai", top_k=2, profile="vllm-0.20",
                                 platform={"kind": "cuda", "capability": [10, 0]}, packages={"flashinfer": True},
                                 env={}, device="cpu")
    err = info.value
    assert "not runnable here" in str(err)
    assert (err.decision.backend, err.decision.quant_config["kind"]) == ("FLASHINFER_TRTLLM_MXFP4_BF16", "w4a16")
    assert (err.assembly.kernel, err.assembly.monolithic, err.assembly.inplace) == (
        "TrtLlmMxfp4ExpertsMonolithic", True, False)


def test_nothing_selected_is_still_the_layers_clear_error():
    """vLLM 0.33 on a CPU without AMX selects nothing (unsupported): the error carries an empty assembly."""
    w = random_layer("mxfp4", experts=4, hidden=128, inter=128, seed=1, gate_up="contiguous")
    with pytest.raises(LayerUnavailableError, match="selects no backend: unsupported") as info:
        MoELayer.from_checkpoint(w, activation="silu", top_k=2, profile="vllm-0.33", platform={"kind": "cpu"},
                                 packages={}, env={}, device="cpu")
    assert info.value.decision.outcome == "unsupported"
    assert (info.value.assembly.backend, info.value.assembly.monolithic, info.value.assembly.variants) == (
        None, None, ())


def test_a_runnable_layer_carries_its_assembly():
    w = random_layer("mxfp4", experts=4, hidden=64, inter=32, seed=1, finite_scales=True)
    layer = MoELayer.from_checkpoint(w, activation="swigluoai", top_k=2, platform={"kind": "cpu"}, packages={},
                                     env={})
    a = layer.assembly
    assert (a.backend, a.kernel, a.inplace, a.shared_experts, a.activation_format) == (
        "EMULATION", "EmulationMoe", False, False, "standard")
    text = layer.explain()
    assert "quant_config ocp-mx (weight mxfp4, activation unquantized" in text
    assert "standard format; never in place; shared experts outside the kernel" in text
    assert layer.forward(torch.zeros(1, 64), torch.zeros(1, 4)).shape == (1, 64)


def test_quark_layer_keeps_the_assembly_of_a_kernel_it_cannot_run():
    cfg = {"weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0"},
           "input_tensors": None}
    layer = QuarkOCPMXMoE.create(cfg, 4, 256, 256, top_k=2, activation="swigluoai", gate_up="interleaved",
                                 profile="vllm-0.33", platform={"kind": "cuda", "capability": [10, 0]},
                                 packages={"flashinfer": True}, env={})
    assert (layer.assembly.backend, layer.assembly.monolithic) == ("FLASHINFER_TRTLLM_MXFP4_BF16", True)
    assert layer.assembly.to_dict()["stages"] == ["monolithic"]
    with pytest.raises(LayerUnavailableError, match="cannot run") as info:
        layer.process_weights_after_loading()
    assert info.value.assembly is layer.assembly and info.value.decision is layer.decision


def test_a_bad_token_budget_is_one_clear_error(oracle):
    sc = scenario("mxfp4-gpt-oss", "cuda:9.0", parallel=DEEPEP_LL)
    with pytest.raises(ValueError, match=r"max_num_batched_tokens=0 must be a positive int"):
        _assembly(oracle, sc, max_num_batched_tokens=0)
