"""backends.triton_moe against the emulation backend: CPU interpreter at small shapes, real layers on CUDA.

The kernels run on CPU through Triton's interpreter (slow, so shapes stay tiny); the GPU cases cover
the layers of issue 16 (gpt-oss-20b/120b, DeepSeek-like NVFP4, Qwen3-30B-A3B-like) at T in
{1, 3, 64, 1000, 4096}, experts without tokens and all tokens on one expert.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import requires_cuda
from tolerances import w4a16_vs_emulation

pytest.importorskip("triton", reason="triton is not installed; the Triton MoE kernels cannot run")

from backends import emulation
from backends.layouts.triton_moe import to_kernel_layout
from backends.triton_moe import moe_forward
from backends.triton_moe.testing import (
    SHAPES,
    Shape,
    activation_kwargs,
    random_checkpoint,
)
from backends.triton_moe.tuning import LaunchConfig, MoEConfig


def assert_matches_emulation(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Relative L2 bound plus an element-wise bound whose atol is in units of the reference's RMS."""
    stats = w4a16_vs_emulation(out, ref)
    assert stats["shape_ok"] and stats["finite"], stats
    assert stats["rel_l2_ratio"] <= 1.0 and stats["elementwise_ratio"] <= 1.0, stats


def run_both(shape: Shape, tokens: int, *, device, seed=0, routing="logits", gate_up_layout="interleaved",
             renormalize=True, config=None):
    """(kernel output, emulation reference) of one random layer and input."""
    layer, ref = layer_and_reference(shape, tokens, device=device, seed=seed, routing=routing,
                                     gate_up_layout=gate_up_layout, renormalize=renormalize, config=config)
    return layer(), ref


def layer_and_reference(shape: Shape, tokens: int, *, device, seed=0, routing="logits", gate_up_layout="interleaved",
                        renormalize=True, config=None):
    """(a function running the kernels on one random layer and input, converted once; the emulation's output)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    ckpt = random_checkpoint(shape, device=device, generator=gen, gate_up_layout=gate_up_layout)
    x = torch.randn(tokens, shape.hidden_size, device=device, generator=gen).bfloat16()
    route: dict
    if routing == "logits":
        route = {"router_logits": torch.randn(tokens, shape.experts, device=device, generator=gen),
                 "top_k": shape.top_k, "renormalize": renormalize}
    else:  # "one_expert": every token sends slot 0 to expert 0, other slots to distinct experts 1..k-1
        ids = torch.arange(shape.top_k, device=device).repeat(tokens, 1)
        weights = torch.rand(tokens, shape.top_k, device=device, generator=gen)
        route = {"topk_ids": ids, "topk_weights": weights / weights.sum(-1, keepdim=True)}
    act = activation_kwargs(shape)
    ref = emulation.moe_forward(x, **ckpt, **route, **act)
    weights = to_kernel_layout(**ckpt)
    return (lambda: moe_forward(x, weights, **route, **act, config=config)), ref


# --------------------------------------------------------------------------------------------
# Argument checks (raised before any kernel launch; the interpreter cases live in
# test_triton_moe_interp.py, which runs them in a TRITON_INTERPRET=1 subprocess)
# --------------------------------------------------------------------------------------------

def test_bad_inputs_name_the_argument():
    shape = Shape("small-mx", "mxfp4", 8, 2, 128, 64, "swigluoai", True)
    kw = to_kernel_layout(**random_checkpoint(shape))
    x = torch.randn(4, shape.hidden_size).bfloat16()
    logits = torch.randn(4, shape.experts)
    with pytest.raises(TypeError, match="x.dtype"):
        moe_forward(x.float(), kw, router_logits=logits, top_k=2)
    with pytest.raises(ValueError, match="hidden size"):
        moe_forward(x[:, :64], kw, router_logits=logits, top_k=2)
    with pytest.raises(ValueError, match="exactly one routing input"):
        moe_forward(x, kw, router_logits=logits, topk_ids=torch.zeros(4, 2, dtype=torch.long), top_k=2)
    with pytest.raises(ValueError, match="activation"):
        moe_forward(x, kw, router_logits=logits, top_k=2, activation="gelu")
    with pytest.raises(ValueError, match=r"topk_ids must lie in \[0, 8\)"):
        moe_forward(x, kw, topk_ids=torch.full((4, 2), 8), topk_weights=torch.ones(4, 2))
    with pytest.raises(ValueError, match="top_k"):
        moe_forward(x, kw, router_logits=logits, top_k=9)
    with pytest.raises(TypeError, match="TritonMoEWeights"):
        moe_forward(x, random_checkpoint(shape), router_logits=logits, top_k=2)
    tile = LaunchConfig(64, 64, 64, 1, True, 4, 3)
    with pytest.raises(ValueError, match=r"config: gemm1.block_m=64 and gemm2.block_m=16 must be equal"):
        moe_forward(x, kw, router_logits=logits, top_k=2,
                    config=MoEConfig(tile, dataclasses.replace(tile, block_m=16), "test"))

def _hand_built(shape_format: str, **replace):
    shape = Shape("small", shape_format, 8, 2, 128, 64, "silu", True)
    weights = to_kernel_layout(**random_checkpoint(shape))
    return dataclasses.replace(weights, **replace), torch.randn(4, 128).bfloat16(), torch.randn(4, 8)


@pytest.mark.parametrize(("fmt", "field", "make", "message"), [
    # a strided view has the right shape but not the row length the kernels step by
    ("mxfp4", "w13", lambda w: w.w13.transpose(1, 2).contiguous().transpose(1, 2), r"weights.w13 has strides .* "
     r"contiguous tensor; pass weights.w13.contiguous\(\)"),
    ("mxfp4", "w2_scale", lambda w: w.w2_scale.float(), r"weights.w2_scale must be torch.int32 of shape \(8, 1, 128\)"),
    ("mxfp4", "w13_bias", lambda w: w.w13_bias[:, :64], r"weights.w13_bias must be torch.float32 of shape \(8, 128\)"),
    ("mxfp4", "w13_scale", lambda w: w.w13_scale.repeat_interleave(2, dim=-1)[..., ::2],
     r"weights.w13_scale has strides .* unit stride in the last dimension"),
    ("nvfp4", "w2_global_scale", lambda w: None, r"weights.w2_global_scale must be torch.float32 of shape \(8,\)"),
])
def test_hand_built_weights_the_kernels_cannot_address_are_refused(fmt, field, make, message):
    weights, x, logits = _hand_built(fmt)
    bad = dataclasses.replace(weights, **{field: make(weights)})
    with pytest.raises(ValueError, match=message):
        moe_forward(x, bad, router_logits=logits, top_k=2)


# --------------------------------------------------------------------------------------------
# CUDA: the real layers
# --------------------------------------------------------------------------------------------

GPU_TOKENS = (1, 3, 64, 1000, 4096)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", GPU_TOKENS)
@pytest.mark.parametrize("name", ["gpt-oss-20b", "gpt-oss-120b", "deepseek-v3", "qwen3-30b-a3b",
                                  "qwen3-30b-a3b-nvfp4"])
def test_cuda_layers_match_emulation(name, tokens):
    out, ref = run_both(SHAPES[name], tokens, device="cuda", seed=tokens)
    assert_matches_emulation(out, ref)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [64, 4096])
@pytest.mark.parametrize("name", ["gpt-oss-120b", "deepseek-v3"])
def test_cuda_all_tokens_on_one_expert(name, tokens):
    out, ref = run_both(SHAPES[name], tokens, device="cuda", routing="one_expert")
    assert_matches_emulation(out, ref)


def _table_entries():
    """(file#index, shape name, T, config) of every entry of the shipped tables whose shape is one of SHAPES."""
    from backends.triton_moe import tuning

    by_size = {tuple(s.fields().values()): name for name, s in SHAPES.items()}
    cases = []
    for file, index, entry in tuning.shipped_entries():
        name = by_size.get(tuple(entry["shape"][key] for key in tuning.SHAPE_FIELDS))
        if name:
            tokens = min(entry["measured"]["tokens"], 2048)  # the tile, not the size, is under test
            config = tuning.MoEConfig(tuning.LaunchConfig(**entry["gemm1"]), tuning.LaunchConfig(**entry["gemm2"]),
                                      f"{file}#{index}")
            cases.append(pytest.param(name, tokens, config, id=f"{file}#{index}-{name}-T{tokens}"))
    return cases


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("name, tokens, config", _table_entries())
def test_cuda_every_tuned_tile_matches_emulation_and_repeats_its_bits(name, tokens, config):
    """Each tile the tables ship (decode mma.sync, wgmma with the retiring wait, split-K, fused epilogue) against
    the emulation, and three runs bit-identical: a register race (see _kernels._dequant_words) shows as either."""
    layer, ref = layer_and_reference(SHAPES[name], tokens, device="cuda", seed=tokens, config=config)
    out = layer()
    assert_matches_emulation(out, ref)
    assert all(torch.equal(out.view(torch.int16), layer().view(torch.int16)) for _ in range(2))


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 1000])
def test_cuda_bit_identical_runs_and_graph_replay(tokens):
    shape = SHAPES["gpt-oss-120b"]
    ckpt = random_checkpoint(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    kw = to_kernel_layout(**ckpt)
    x = torch.randn(tokens, shape.hidden_size, device="cuda").bfloat16()
    logits = torch.randn(tokens, shape.experts, device="cuda")

    def run():
        return moe_forward(x, kw, router_logits=logits, top_k=shape.top_k, deterministic=True)

    first = run()
    assert all(torch.equal(first, run()) for _ in range(3))
    run()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, run()), "graph replay must follow the new input and match eager bits"


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 5, 64])
@pytest.mark.parametrize("name", ["gpt-oss-120b", "deepseek-v3"])
def test_cuda_split_k_matches_emulation_and_is_bit_identical(name, tokens):
    """Split-K decode tiles (fixed-order slice sums, no atomics): right values, same bits on every run."""
    from backends.triton_moe import tuning

    gemm1 = tuning.LaunchConfig(16, 64, 128, 1, True, 4, 4, split_k=4)
    gemm2 = tuning.LaunchConfig(16, 32, 128, 1, False, 4, 3, split_k=3)
    config = tuning.MoEConfig(gemm1, gemm2, "test")
    out, ref = run_both(SHAPES[name], tokens, device="cuda", seed=tokens, config=config)
    assert_matches_emulation(out, ref)
    again, _ = run_both(SHAPES[name], tokens, device="cuda", seed=tokens, config=config)
    assert torch.equal(out.view(torch.int16), again.view(torch.int16)), "split-K runs must be bit-identical"


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [3, 300])
def test_cuda_folded_and_unfolded_scales_give_the_same_bits(monkeypatch, tokens):
    """The one-FMA dequantization (2^126 folded into the E8M0 scale) and the two-FMA one agree bit for bit,
    and MXFP4 scales above 2 (exponent > 128), which take the two-FMA path, still match the emulation."""
    from backends.triton_moe import forward

    shape = SHAPES["gpt-oss-20b"]
    out_folded, ref = run_both(shape, tokens, device="cuda", seed=tokens)
    monkeypatch.setattr(forward, "_scales_fold", lambda weights: False)
    out_unfolded, _ = run_both(shape, tokens, device="cuda", seed=tokens)
    assert_matches_emulation(out_folded, ref)
    assert torch.equal(out_folded.view(torch.int16), out_unfolded.view(torch.int16))
    monkeypatch.undo()
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    ckpt = random_checkpoint(shape, device="cuda", generator=gen)
    ckpt["w13_scale"] = ckpt["w13_scale"] + 9  # exponents 127..131: block scales up to 16
    ckpt["w2_scale"] = ckpt["w2_scale"] + 9
    weights = to_kernel_layout(**ckpt)
    assert not forward._scales_fold(weights)
    x = torch.randn(tokens, shape.hidden_size, device="cuda", generator=gen).bfloat16()
    logits = torch.randn(tokens, shape.experts, device="cuda", generator=gen)
    act = activation_kwargs(shape)
    ref = emulation.moe_forward(x, **ckpt, router_logits=logits, top_k=shape.top_k, **act)
    assert_matches_emulation(moe_forward(x, weights, router_logits=logits, top_k=shape.top_k, **act), ref)


@requires_cuda
@pytest.mark.gpu
def test_cuda_scale_decode_is_exact_for_every_code():
    """The PTX decodes are exact: all 254 E4M3 codes (NVFP4; integer bit moves + two bf16x2 FMAs, subnormals
    included, which the layer tests never draw), every E8M0 exponent of the folded MXFP4 path, and both E2M1
    codes of every byte (folded and unfolded scales)."""
    from triton_moe_scale_probe import e2m1_decode_mismatches, e4m3_decode_mismatches, e8m0_folded_decode_mismatches

    assert e4m3_decode_mismatches("cuda") == []
    assert e2m1_decode_mismatches("cuda") == []
    assert e8m0_folded_decode_mismatches("cuda") == []


def test_coarse_padding_leaves_only_a_whole_blocks_one_block_tail_fine():
    """coarse_pad (64, 256) on 32-row alignment: every run padded to 64 rows but those 257-288, 513-544, ... rows
    long, which stop at the 32 rows past their whole 256-row blocks (a whole block's tail)."""
    from backends.triton_moe._routing import align, max_row_blocks, padded_runs

    counts = torch.tensor([0, 1, 32, 33, 64, 65, 256, 257, 288, 289, 320, 513, 544, 545, 577])
    assert padded_runs(counts, 32, (64, 256)).tolist() == [0, 64, 64, 64, 64, 128, 256, 288, 288, 320, 320, 544, 544,
                                                           576, 640]
    assert padded_runs(counts, 32).tolist() == [0, 32, 32, 64, 64, 96, 256, 288, 288, 320, 320, 544, 544, 576, 608]
    ids = torch.repeat_interleave(torch.arange(len(counts)), counts).reshape(-1, 1)
    al = align(ids, len(counts), 32, coarse_pad=(64, 256))
    assert int(al.padded_total) == int(padded_runs(counts, 32, (64, 256)).sum()) <= al.num_blocks * 32
    assert al.num_blocks == max_row_blocks(ids.numel(), len(counts), 32, (64, 256))
    with pytest.raises(ValueError, match=r"coarse_pad=\(48, 256\) must be \(COARSE, WHOLE\) with COARSE a multiple "
                                         r"of block_m=32 and WHOLE a multiple of COARSE"):
        align(ids, len(counts), 32, coarse_pad=(48, 256))


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("tokens, experts, k, block_m, coarse_pad", [
    (1, 128, 4, 16, None), (256, 256, 8, 16, None), (1024, 128, 4, 64, None), (1024, 256, 8, 64, None),
    (4096, 128, 4, 128, None), (4096, 256, 8, 128, None), (2000, 6, 2, 32, None), (16384, 128, 4, 32, (64, 256)),
    (1024, 6, 2, 16, (32, 128))])
def test_cuda_alignment_paths_match_the_torch_path(tokens, experts, k, block_m, coarse_pad):
    """The one-program and the two-launch multi-program alignments give the torch path's exact blocks at layer
    sizes (up to 32768 pairs, one crowded expert)."""
    from backends.triton_moe import _kernels, _routing

    gen = torch.Generator(device="cuda").manual_seed(tokens)
    ids = torch.topk(torch.randn(tokens, experts, device="cuda", generator=gen), k, dim=-1).indices.int()
    ids[: tokens // 3, 0] = experts - 1
    ref = _routing.align(ids, experts, block_m, path="torch", coarse_pad=coarse_pad)
    used = int(ref.padded_total) // block_m
    for path in ("one-program", "multi-program"):
        if path == "one-program" and ids.numel() > 4096:
            continue
        got = _routing.align(ids, experts, block_m, _kernels, path=path, coarse_pad=coarse_pad)
        assert torch.equal(got.padded_total, ref.padded_total), path
        assert torch.equal(got.sorted_pairs, ref.sorted_pairs), path
        assert torch.equal(got.block_expert[:used], ref.block_expert[:used]), path
