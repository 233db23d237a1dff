"""The runner protocol (backends/runners/base.py) on CPU: resolution through the registry, the layer's one call
path, the HUMMING alignment, and every refusal message of the runners (missing package, wrong layout,
activation, device). The GPU comparisons are in test_runners_gpu.py."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch
from test_layer import GENERIC_NVFP4, GPT_OSS, _checkpoint, _inputs  # the layer tests' checkpoints

from backends import LayerUnavailableError, MoELayer, emulation
from backends import layer as layer_module
from backends.runners import Routing, Runner, RunnerFactory, RunnerSpec, RunnerUnavailableError
from backends.runners.emulation import EmulationRunner
from backends.runners.humming import HOW_TO_GET as HUMMING_HOW
from backends.runners.humming import HummingRunner, align_indexed
from backends.runners.oai_triton import HOW_TO_GET as TRITON_KERNELS_HOW
from backends.runners.oai_triton import OaiTritonRunner
from backends.runners.triton_moe import TritonMoERunner
from oracle import Oracle, registry

from tolerances import tolerance

RULES = Path(__file__).resolve().parents[1] / "rules"
SM90 = {"kind": "cuda", "capability": [9, 0]}
HAS_HUMMING = importlib.util.find_spec("humming") is not None
HAS_TRITON_KERNELS = importlib.util.find_spec("triton_kernels") is not None


@pytest.fixture(scope="module")
def oracle() -> Oracle:
    return Oracle(RULES)


def _spec(**kw) -> RunnerSpec:
    base = dict(backend="B", profile="p", format="mxfp4", activation="swigluoai", top_k=2, renormalize=True,
                num_experts=4, hidden_size=64, intermediate_size=64, padded_hidden_size=64,
                padded_intermediate_size=64, device=torch.device("cpu"),
                swiglu={"swiglu_alpha": 1.702, "swiglu_beta": 1.0, "swiglu_limit": 7.0})
    base.update(kw)
    return RunnerSpec(**base)


# --------------------------------------------------------------------------- resolution through the registry
def test_every_shipped_runner_resolves_to_a_runner_factory_without_importing_its_library(oracle):
    before = set(sys.modules)
    paths = {b.runner for p in oracle.profiles() for f in oracle.table(p).families.values()
             for b in f.backends.values() if b.runner}
    assert {"backends.runners.emulation:EmulationRunner", "backends.runners.triton_moe:TritonMoERunner",
            "backends.runners.humming:HummingRunner", "backends.runners.oai_triton:OaiTritonRunner"} <= paths
    for path in paths:
        assert registry.problem(path) is None, path
        factory = registry.resolve(path)
        assert isinstance(factory, RunnerFactory), path
    loaded = set(sys.modules) - before
    assert not any(m.split(".")[0] in ("humming", "triton_kernels") for m in loaded), loaded


def test_vllm033_names_humming_and_triton_runners(oracle):
    for policy in ("mxfp4", "nvfp4"):
        family = oracle.table("vllm-0.33").policies[policy].family
        assert family.backends["HUMMING"].runner == "backends.runners.humming:HummingRunner"
        assert family.backends["HUMMING"].converter is None
    triton = oracle.table("vllm-0.33").policies["mxfp4"].family.backends["TRITON"]
    assert (triton.converter, triton.runner) == ("backends.layouts.oai_triton:mxfp4",
                                                 "backends.runners.oai_triton:OaiTritonRunner")
    assert not triton.missing_why


# --------------------------------------------------------------------------- the layer's one call path
@pytest.mark.parametrize("case", [GPT_OSS, GENERIC_NVFP4], ids=["mxfp4", "nvfp4"])
def test_the_layer_calls_its_prepared_runner(oracle, case):
    weights = _checkpoint(case["fmt"], case["gate_up"], bias=case["bias"])
    layer = MoELayer.from_checkpoint(weights, activation=case["activation"], top_k=2, platform={"kind": "cpu"},
                                     packages={}, env={}, oracle=oracle)
    assert isinstance(layer.runner, EmulationRunner) and isinstance(layer.runner, Runner)
    x, logits = _inputs(weights)
    direct = layer.runner.apply(x, Routing(router_logits=logits))
    torch.testing.assert_close(layer(x, logits), direct, **tolerance("exact"))
    expected = emulation.moe_forward(x, **weights.emulation_kwargs(), router_logits=logits, top_k=2,
                                     activation=case["activation"])
    torch.testing.assert_close(direct, expected, **tolerance("exact"))


def test_routing_kwargs_leave_out_what_is_not_given():
    ids, w = torch.zeros(3, 2, dtype=torch.long), torch.ones(3, 2)
    assert set(Routing(topk_ids=ids, topk_weights=w).as_kwargs()) == {"topk_ids", "topk_weights"}
    assert set(Routing(router_logits=torch.zeros(3, 4)).as_kwargs()) == {"router_logits"}


def test_a_path_that_is_not_a_runner_is_refused_with_the_protocol_named():
    decision = types.SimpleNamespace(runner="backends.emulation:moe_forward", backend="EMULATION",
                                     profile="moe-oracle", converter=None)
    weights = _checkpoint("mxfp4", "interleaved")
    with pytest.raises(LayerUnavailableError, match=r"backends.emulation:moe_forward of EMULATION is not a runner "
                                                    r".*prepare\(spec, weights\).*backends/runners/base.py"):
        layer_module.build_runner(decision, weights, hidden=64, inter=64, activation="silu", top_k=2,
                                  renormalize=True, swiglu={})


@pytest.mark.skipif(HAS_HUMMING, reason="humming-kernels is installed here: its missing-package message cannot show")
def test_a_runner_refusal_becomes_layer_unavailable_with_the_decision(oracle):
    weights = _checkpoint("nvfp4", "contiguous")
    question = layer_module._question(oracle, profile="vllm-0.33", policy="nvfp4", platform=SM90,
                                      packages={"humming": True}, env={}, weights=weights, activation="silu",
                                      top_k=2, renormalize=True, moe_backend="auto")
    decision = layer_module.select_logged(oracle, question)
    assert decision.backend == "HUMMING", decision.error
    with pytest.raises(LayerUnavailableError) as info:
        layer_module.build_runner(decision, weights, hidden=64, inter=64, activation="silu", top_k=2,
                                  renormalize=True, swiglu={})
    message = str(info.value)
    assert message.startswith("MoELayer: HUMMING (profile vllm-0.33) cannot run this layer: the Python package "
                              "'humming.layer' is not importable here")
    assert HUMMING_HOW in message and info.value.decision is decision


# --------------------------------------------------------------------------- refusals, one per runner and cause
def test_emulation_refuses_a_converted_layout():
    from backends.layouts.triton_moe import converter

    kw = converter.convert(_checkpoint("mxfp4", "interleaved"), hidden_size=64, intermediate_size=64)
    with pytest.raises(RunnerUnavailableError, match=r"^B \(profile p\) cannot run this layer: the emulation reads "
                                                     r"the checkpoint layout .*KernelWeights.*converter: null"):
        EmulationRunner.prepare(_spec(), kw)


def test_triton_moe_refuses_wrong_layout_activation_and_device():
    from backends.layouts.triton_moe import converter

    weights = _checkpoint("mxfp4", "interleaved")
    with pytest.raises(RunnerUnavailableError, match=r"read the 'triton_moe' layout, the rules give MoEWeights; "
                                                     r"set `converter: backends.layouts.triton_moe:converter`"):
        TritonMoERunner.prepare(_spec(), weights)
    kw = converter.convert(weights, hidden_size=64, intermediate_size=64)
    with pytest.raises(RunnerUnavailableError, match=r"activation 'gelu' is not one of the kernels'.*moe_backend="):
        TritonMoERunner.prepare(_spec(activation="gelu"), kw)
    with pytest.raises(RunnerUnavailableError, match=r"run on CUDA .* not meta; use the EMULATION backend"):
        TritonMoERunner.prepare(_spec(device=torch.device("meta")), kw)


@pytest.mark.skipif(HAS_HUMMING, reason="humming-kernels is installed here: its missing-package message cannot show")
def test_humming_names_how_to_get_it():
    with pytest.raises(RunnerUnavailableError, match=r"the Python package 'humming.layer' is not importable here "
                                                     r".*pip install 'moe-oracle\[humming\]'"):
        HummingRunner.prepare(_spec(), _checkpoint("mxfp4", "interleaved"))


def test_humming_refuses_a_converted_layout_an_ungated_activation_and_the_cpu(monkeypatch):
    from backends.layouts.triton_moe import converter

    weights = _checkpoint("mxfp4", "interleaved")
    kw = converter.convert(weights, hidden_size=64, intermediate_size=64)
    with pytest.raises(RunnerUnavailableError, match=r"Humming converts the checkpoint itself.*converter: null"):
        HummingRunner.prepare(_spec(), kw)
    with pytest.raises(RunnerUnavailableError, match=r"activation 'silu_no_mul' is not gated"):
        HummingRunner.prepare(_spec(activation="silu_no_mul"), weights)
    for name in ("humming", "humming.layer", "humming.tune"):  # the package present: the device is what refuses
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    with pytest.raises(RunnerUnavailableError, match=r"runs on CUDA GPUs only, the layer is on cpu; build the layer "
                                                     r"with device='cuda'"):
        HummingRunner.prepare(_spec(), weights)


def test_oai_triton_refuses_layout_activation_beta_and_names_how_to_get_it():
    from backends.layouts.oai_triton import mxfp4

    weights = _checkpoint("mxfp4", "interleaved")
    kw = mxfp4.convert(weights, hidden_size=64, intermediate_size=64)
    with pytest.raises(RunnerUnavailableError, match=r"reads the 'oai_triton_kmajor' layout, the rules give "
                                                     r"MoEWeights"):
        OaiTritonRunner.prepare(_spec(), weights)
    with pytest.raises(RunnerUnavailableError, match=r"fuses only the gpt-oss SwiGLU \(swigluoai\), not 'silu'"):
        OaiTritonRunner.prepare(_spec(activation="silu"), kw)
    with pytest.raises(RunnerUnavailableError, match=r"swiglu_beta=0.5; pass swiglu_beta=1.0"):
        OaiTritonRunner.prepare(_spec(swiglu={"swiglu_alpha": 1.702, "swiglu_beta": 0.5, "swiglu_limit": 7.0}), kw)
    if not HAS_TRITON_KERNELS:
        with pytest.raises(RunnerUnavailableError, match=r"'triton_kernels.matmul_ogs' is not importable here"):
            OaiTritonRunner.prepare(_spec(), kw)
        assert "not on PyPI" in TRITON_KERNELS_HOW and "sglang-kernel" in TRITON_KERNELS_HOW


def test_the_explanation_says_triton_kernels_is_missing(oracle):
    weights = _checkpoint("mxfp4", "interleaved")
    question = layer_module._question(oracle, profile="vllm-0.33", policy="mxfp4", platform=SM90,
                                      packages={"triton_kernels": False, "humming": False}, env={}, weights=weights,
                                      activation="swigluoai", top_k=2, renormalize=True, moe_backend="triton")
    decision = layer_module.select_logged(oracle, question)
    assert decision.backend is None or decision.outcome != "selected"
    from oracle.trace import render_lines

    lines: list[str] = []
    render_lines(decision.trace, lines)
    text = "\n".join(lines)
    assert "TRITON" in text and "triton_kernels" in text, text


# --------------------------------------------------------------------------- the HUMMING alignment
@pytest.mark.parametrize("tokens, top_k, experts, block", [(1, 4, 128, 16), (37, 4, 8, 16), (9, 8, 16, 64),
                                                            (5, 2, 3, 4)])
def test_indexed_alignment_groups_every_pair_once_by_expert(tokens, top_k, experts, block):
    g = torch.Generator().manual_seed(tokens * 31 + experts)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    sorted_ids, expert_ids, padded = align_indexed(ids, experts, block)
    pairs, used = tokens * top_k, int(padded[0])
    assert used % block == 0 and sorted_ids.numel() >= used and sorted_ids.numel() % block == 0
    assert expert_ids.numel() == sorted_ids.numel() // block
    live = sorted_ids[:used]
    real = live[live < pairs]
    assert sorted(real.tolist()) == list(range(pairs)), "each (token, slot) pair exactly once"
    assert bool((sorted_ids[used:] == pairs).all()), "the tail is the sentinel"
    flat = ids.reshape(-1)
    for b in range(used // block):
        chunk = sorted_ids[b * block:(b + 1) * block]
        chunk = chunk[chunk < pairs]
        assert chunk.numel() > 0, "no empty block inside the used length"
        assert bool((flat[chunk.long()] == expert_ids[b]).all()), "a block holds its expert's pairs only"
    counts = torch.bincount(flat, minlength=experts)
    assert used == int(((counts + block - 1) // block * block).sum())


# --------------------------------------------------------------------------- the TRITON routing bitmatrix
def test_pack_bitmatrix_sets_one_bit_per_routed_expert():
    from backends.runners.oai_triton import pack_bitmatrix

    ids = torch.tensor([[0, 31], [32, 5], [63, 33]])
    words = pack_bitmatrix(ids, 64)
    assert words.dtype == torch.uint32 and words.shape == (3, 2)
    as_ints = [[v & 0xFFFFFFFF for v in row] for row in words.view(torch.int32).tolist()]
    assert as_ints == [[1 | 1 << 31, 0], [1 << 5, 1], [0, 1 << 1 | 1 << 31]]
