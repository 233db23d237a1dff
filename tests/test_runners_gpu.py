"""The library runners on a GPU against the emulation, at real model sizes: HUMMING (humming-kernels) on gpt-oss-120b
MXFP4 and a DeepSeek-V3-shaped NVFP4 layer, TRITON (OpenAI triton_kernels) forced on gpt-oss-120b, each through
MoELayer under profile vllm-0.33, at T in {1, 37, 1000}. Skipped without CUDA or without the library, with the
reason; benchmarks/gpu_runners.sh runs them on the device machine."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from backends import MoELayer, emulation
from backends.triton_moe.testing import SHAPES, random_checkpoint
from backends.weights import MoEWeights

from conftest import requires_cuda
from tolerances import w4a16_vs_emulation

pytestmark = [requires_cuda, pytest.mark.gpu]
requires_humming = pytest.mark.skipif(importlib.util.find_spec("humming") is None,
                                      reason="humming-kernels is not installed (pip install 'moe-oracle[humming]')")
requires_triton_kernels = pytest.mark.skipif(importlib.util.find_spec("triton_kernels") is None,
                                             reason="OpenAI triton_kernels is not importable (not on PyPI; see "
                                                    "backends/runners/oai_triton.py for how to get it)")
TOKENS = (1, 37, 1000)
#: (shape, gate/up rows as the model stores them)
LAYERS = {"gpt-oss-120b": "interleaved", "deepseek-v3": "contiguous"}


@pytest.fixture(scope="module", params=list(LAYERS))
def layer_case(request):
    name = request.param
    shape = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    ckpt = random_checkpoint(shape, device="cuda", generator=g, gate_up_layout=LAYERS[name])
    weights = MoEWeights(format=ckpt.pop("format"), gate_up=ckpt.pop("gate_up_layout"), **ckpt)
    yield name, shape, weights
    torch.cuda.empty_cache()


def _swiglu(shape) -> dict:
    return {"swiglu_alpha": 1.702, "swiglu_beta": 1.0, "swiglu_limit": 7.0} if shape.activation == "swigluoai" else {}


def _check(layer, shape, weights):
    for tokens in TOKENS:
        g = torch.Generator(device="cuda").manual_seed(tokens)
        x = torch.randn(tokens, shape.hidden_size, device="cuda", generator=g).bfloat16()
        logits = torch.randn(tokens, shape.experts, device="cuda", generator=g)
        out = layer(x, logits)
        ref = emulation.moe_forward(x.float(), **weights.emulation_kwargs(), router_logits=logits, top_k=shape.top_k,
                                    activation=shape.activation, **_swiglu(shape))
        stats = w4a16_vs_emulation(out, ref.to(out.dtype))
        print(f"{layer.decision.backend} {shape.name} T={tokens}: rel. L2 {stats['rel_l2']:.3e}, elementwise "
              f"{stats['elementwise_ratio']:.2f} of the allowed error")
        assert stats["finite"] and stats["shape_ok"], stats
        assert stats["rel_l2_ratio"] <= 1 and stats["elementwise_ratio"] <= 1, (tokens, stats)


@requires_humming
def test_humming_is_vllm033s_pick_without_triton_kernels_and_matches_the_emulation(layer_case):
    name, shape, weights = layer_case
    layer = MoELayer.from_checkpoint(weights, activation=shape.activation, top_k=shape.top_k, profile="vllm-0.33",
                                     policy=shape.format, packages={"humming": True}, device="cuda")
    assert layer.decision.backend == "HUMMING", layer.explain()
    assert type(layer.runner).__name__ == "HummingRunner"
    _check(layer, shape, weights)


@requires_triton_kernels
def test_triton_forced_matches_the_emulation_on_gpt_oss(layer_case):
    name, shape, weights = layer_case
    if shape.format != "mxfp4":
        pytest.skip("TRITON (matmul_ogs) is an MXFP4 backend")
    layer = MoELayer.from_checkpoint(weights, activation=shape.activation, top_k=shape.top_k, profile="vllm-0.33",
                                     policy="mxfp4", moe_backend="triton", device="cuda")
    assert layer.decision.backend == "TRITON", layer.explain()
    _check(layer, shape, weights)


@requires_humming
@requires_triton_kernels
def test_with_both_libraries_vllm033_picks_triton_for_gpt_oss(layer_case):
    name, shape, weights = layer_case
    if shape.format != "mxfp4":
        pytest.skip("the TRITON-first order is MXFP4's")
    layer = MoELayer.from_checkpoint(weights, activation=shape.activation, top_k=shape.top_k, profile="vllm-0.33",
                                     policy="mxfp4", device="cuda")
    assert layer.decision.backend == "TRITON", layer.explain()
