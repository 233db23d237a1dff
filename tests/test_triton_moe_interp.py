"""The Triton MoE kernels on CPU, through Triton's interpreter, against the emulation backend.

Triton fixes compiled-vs-interpreted when it is first imported, and other tests (or GPU cases) may
import it compiled, so the cases run in one `TRITON_INTERPRET=1` subprocess (this file run as a
script) that prints one JSON line per case; each test below checks its case's line. Shapes are tiny
(the interpreter runs numpy per tile) but cover both formats, both activations, biases, both gate/up
layouts, both routings, the K tail, swap-AB and plain tiles, both K orders of the K loop (stored and K order),
split-K (empty slices too), one expert taking every token,
folded and unfolded scales (same bits; MXFP4 block scales above 2), and
bit-identical repeated runs.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("triton", reason="triton is not installed; the Triton MoE kernels cannot run")

from conftest import interpreter_worker_rows
from tolerances import tolerance, w4a16_vs_emulation

# name -> (format, E, k, H, I, activation, biases, T, gate_up_layout, routing, config)
CASES = {
    "mxfp4-swigluoai-bias-swap": ("mxfp4", 8, 2, 128, 64, "swigluoai", True, 9, "interleaved", "logits", "swap"),
    "mxfp4-swigluoai-bias-plain": ("mxfp4", 8, 2, 128, 64, "swigluoai", True, 9, "interleaved", "logits", "plain"),
    "nvfp4-silu-k-tail-swap": ("nvfp4", 8, 3, 192, 64, "silu", False, 9, "contiguous", "logits", "swap"),
    "nvfp4-silu-k-tail-plain": ("nvfp4", 8, 3, 192, 64, "silu", False, 9, "contiguous", "logits", "plain"),
    # NVFP4 swap-AB with two 64-wide groups per K step, the second one past K in both GEMMs (192 = 128 + 64, 64)
    "nvfp4-silu-k-tail-swap-bk128": ("nvfp4", 8, 3, 192, 64, "silu", False, 9, "contiguous", "logits", "swap128"),
    "mxfp4-silu-top1-swap": ("mxfp4", 6, 1, 64, 192, "silu", True, 9, "contiguous", "softmax_topk", "swap"),
    "nvfp4-swigluoai-one-expert": ("nvfp4", 4, 3, 64, 64, "swigluoai", True, 20, "interleaved", "one_expert", "plain"),
    "mxfp4-swigluoai-bias-split-k": ("mxfp4", 8, 2, 128, 64, "swigluoai", True, 9, "interleaved", "logits", "split"),
    "nvfp4-silu-k-tail-split-k": ("nvfp4", 8, 3, 192, 64, "silu", False, 9, "contiguous", "logits", "split"),
    "mxfp4-silu-top1-split-k": ("mxfp4", 6, 1, 64, 192, "silu", True, 9, "contiguous", "softmax_topk", "split"),
    "mxfp4-default-config": ("mxfp4", 8, 2, 64, 64, "swigluoai", True, 5, "interleaved", "logits", None),
    # 1-2 warp tiles multiply in the weights' stored byte order (activations permuted to it; 4-8 warps: K order)
    "mxfp4-swigluoai-bias-swap-stored-order": ("mxfp4", 8, 2, 128, 64, "swigluoai", True, 9, "interleaved", "logits",
                                               "swap-2warps"),
    "nvfp4-silu-k-tail-swap-bk128-stored-order": ("nvfp4", 8, 3, 192, 64, "silu", False, 9, "contiguous", "logits",
                                                  "swap128-2warps"),
    # GEMM1 with gate and up stacked into one weight tile: wgmma swap-AB, a column tail (I = 192 in 128-wide tiles),
    # mma.sync with split-K, and the plain (weights on the N side) tile
    "mxfp4-swigluoai-bias-stacked-swap": ("mxfp4", 8, 2, 128, 192, "swigluoai", True, 9, "interleaved", "logits",
                                          "stacked-swap"),
    "nvfp4-silu-k-tail-stacked-split-k": ("nvfp4", 8, 3, 192, 64, "silu", False, 9, "contiguous", "logits",
                                          "stacked-split"),
    "mxfp4-silu-top1-stacked-plain": ("mxfp4", 6, 1, 64, 192, "silu", True, 9, "contiguous", "softmax_topk",
                                      "stacked-plain"),
    # half_rows: 32-row blocks of 1-20 pairs per expert, so some run their first 16 rows only and some run all 32
    "mxfp4-swigluoai-bias-half-rows": ("mxfp4", 8, 2, 128, 64, "swigluoai", True, 60, "interleaved", "logits",
                                       "half-rows"),
    "nvfp4-silu-k-tail-half-rows-split-k": ("nvfp4", 8, 3, 192, 64, "silu", False, 40, "contiguous", "logits",
                                            "half-rows-split"),
    # tail_rows: 32-row blocks, 76 tokens (about 38 pairs an expert): a run's last block of at most 16 pairs is
    # multiplied by the block before it, a longer one on its own (half_rows too)
    "mxfp4-swigluoai-bias-tail-rows": ("mxfp4", 4, 2, 128, 64, "swigluoai", True, 76, "interleaved", "logits",
                                       "tail-rows"),
    "nvfp4-silu-k-tail-tail-rows": ("nvfp4", 4, 2, 192, 64, "silu", False, 76, "contiguous", "logits", "tail-rows"),
    # wide_tail_rows: 64-row blocks, 320 tokens on 8 experts (about 80 pairs an expert): a run's last block of at most
    # 16 pairs rides on the block before it as a 16-row dot, one of 17-32 pairs as a 32-row dot
    "mxfp4-swigluoai-bias-wide-tails": ("mxfp4", 8, 2, 128, 64, "swigluoai", True, 320, "interleaved", "logits",
                                        "wide-tails"),
    "nvfp4-silu-k-tail-wide-tails": ("nvfp4", 8, 2, 192, 64, "silu", False, 320, "contiguous", "logits",
                                     "wide-tails"),
    # the decode kernels (_gemv_kernels, T = 1-2): routing in GEMV1 (both routings) or given ids, K tails (192 = 128 +
    # 64) and empty K slices (K = 64 in 4 slices), top-k not a power of two (dead slot warps), 1-8 row groups
    "mxfp4-swigluoai-bias-decode": ("mxfp4", 8, 2, 128, 64, "swigluoai", True, 1, "interleaved", "logits",
                                    "decode-wide"),
    "nvfp4-silu-k-tail-decode": ("nvfp4", 8, 3, 192, 128, "silu", False, 2, "contiguous", "logits", "decode-sliced"),
    "mxfp4-silu-top1-decode": ("mxfp4", 6, 1, 64, 192, "silu", True, 1, "contiguous", "softmax_topk", "decode-sliced"),
    "nvfp4-swigluoai-one-expert-decode": ("nvfp4", 16, 5, 320, 64, "swigluoai", True, 2, "interleaved", "one_expert",
                                          "decode-wide"),
    # GEMV2 split over programs (GemvLaunch.splits): biases added by the last program, K = 320 in 4 slices (one
    # empty), GEMV1 loading ahead over an odd number of steps; 4 splits of a one-step K (three empty) with a dead slot
    "mxfp4-swigluoai-bias-decode-split": ("mxfp4", 8, 2, 128, 320, "swigluoai", True, 2, "interleaved", "logits",
                                          "decode-split"),
    "nvfp4-silu-k-tail-decode-split4": ("nvfp4", 8, 3, 192, 128, "silu", False, 1, "contiguous", "logits",
                                        "decode-split4"),
}


def _run_case(name: str, spec) -> dict:
    import torch

    from backends import emulation
    from backends.layouts.triton_moe import to_kernel_layout
    from backends.triton_moe import moe_forward, tuning
    from backends.triton_moe.testing import (
        Shape,
        activation_kwargs,
        random_checkpoint,
    )

    fmt, e, k, h, i, act, biases, tokens, layout, routing, config_name = spec
    swap = tuning.LaunchConfig(16, 32, 64, 1, True, 4, 2)
    plain = tuning.LaunchConfig(32, 32, 128, 2, False, 4, 2)  # K tail: 192 = 128 + 64
    configs = {"swap": tuning.MoEConfig(swap, swap, "test"),
               "swap128": tuning.MoEConfig(tuning.LaunchConfig(16, 32, 128, 1, True, 4, 2),
                                           tuning.LaunchConfig(16, 32, 128, 1, True, 4, 2), "test"),
               "swap-2warps": tuning.MoEConfig(tuning.LaunchConfig(16, 32, 64, 1, True, 2, 2),
                                               tuning.LaunchConfig(16, 32, 64, 1, True, 1, 2), "test"),
               "swap128-2warps": tuning.MoEConfig(tuning.LaunchConfig(16, 32, 128, 1, True, 2, 2),
                                                  tuning.LaunchConfig(16, 32, 128, 1, True, 2, 2), "test"),
               "plain": tuning.MoEConfig(plain, tuning.LaunchConfig(32, 64, 64, 1, False, 4, 2), "test"),
               # split-K: K tails, empty slices (K=64 in 3 slices), bias only in slice 0
               "split": tuning.MoEConfig(tuning.LaunchConfig(16, 32, 64, 1, True, 2, 2, split_k=2),
                                         tuning.LaunchConfig(16, 32, 64, 1, False, 4, 2, split_k=3), "test"),
               "stacked-swap": tuning.MoEConfig(tuning.LaunchConfig(16, 128, 64, 1, True, 4, 2, stack_gate_up=True),
                                                swap, "test"),
               "stacked-split": tuning.MoEConfig(
                   tuning.LaunchConfig(16, 32, 64, 1, True, 2, 2, split_k=2, stack_gate_up=True),
                   tuning.LaunchConfig(16, 32, 64, 1, True, 2, 2), "test"),
               "stacked-plain": tuning.MoEConfig(dataclasses.replace(plain, stack_gate_up=True),
                                                 tuning.LaunchConfig(32, 64, 64, 1, False, 4, 2), "test"),
               "half-rows": tuning.MoEConfig(
                   tuning.LaunchConfig(32, 64, 64, 1, True, 4, 2, stack_gate_up=True, half_rows=True),
                   tuning.LaunchConfig(32, 32, 64, 1, True, 4, 2, half_rows=True), "test"),
               "half-rows-split": tuning.MoEConfig(
                   tuning.LaunchConfig(32, 32, 64, 1, True, 2, 2, split_k=2, half_rows=True),
                   tuning.LaunchConfig(32, 32, 64, 1, False, 4, 2, split_k=3, half_rows=True), "test"),
               "tail-rows": tuning.MoEConfig(
                   tuning.LaunchConfig(32, 32, 64, 1, True, 4, 2, stack_gate_up=True, half_rows=True, tail_rows=16),
                   tuning.LaunchConfig(32, 32, 64, 1, True, 4, 2, half_rows=True, tail_rows=16), "test"),
               "wide-tails": tuning.MoEConfig(
                   tuning.LaunchConfig(64, 32, 64, 1, True, 4, 2, stack_gate_up=True, half_rows=True, tail_rows=16,
                                       wide_tail_rows=32),
                   tuning.LaunchConfig(64, 32, 64, 1, True, 4, 2, half_rows=True, tail_rows=16, wide_tail_rows=32),
                   "test"),
               "decode-wide": tuning.MoEConfig(swap, swap, "test", tuning.DecodeConfig(
                   tuning.GemvLaunch(8, 1), tuning.GemvLaunch(4, 1))),
               "decode-sliced": tuning.MoEConfig(swap, swap, "test", tuning.DecodeConfig(
                   tuning.GemvLaunch(1, 4), tuning.GemvLaunch(1, 2))),
               "decode-split": tuning.MoEConfig(swap, swap, "test", tuning.DecodeConfig(
                   tuning.GemvLaunch(4, 2, True), tuning.GemvLaunch(1, 2, True, splits=2))),
               "decode-split4": tuning.MoEConfig(swap, swap, "test", tuning.DecodeConfig(
                   tuning.GemvLaunch(1, 4), tuning.GemvLaunch(1, 1, splits=4))),
               None: None}
    shape = Shape(name, fmt, e, k, h, i, act, biases)
    gen = torch.Generator().manual_seed(len(name))
    ckpt = random_checkpoint(shape, generator=gen, gate_up_layout=layout)
    x = torch.randn(tokens, h, generator=gen).bfloat16()
    if routing == "one_expert":  # slot 0 of every token on expert 0, the others on experts 1..k-1
        weights = torch.rand(tokens, k, generator=gen)
        route = {"topk_ids": torch.arange(k).repeat(tokens, 1), "topk_weights": weights / weights.sum(-1, keepdim=True)}
    else:
        route = {"router_logits": torch.randn(tokens, e, generator=gen), "top_k": k,
                 "renormalize": routing == "logits"}
    ref = emulation.moe_forward(x, **ckpt, **route, **activation_kwargs(shape))
    kw = to_kernel_layout(**ckpt)
    out = moe_forward(x, kw, **route, **activation_kwargs(shape), config=configs[config_name])
    again = moe_forward(x, kw, **route, **activation_kwargs(shape), config=configs[config_name], deterministic=True)
    stats = w4a16_vs_emulation(out, ref)
    stats["bit_identical_rerun"] = torch.equal(out.view(torch.int16), again.view(torch.int16))
    config = configs[config_name]
    if config is not None and config.gemm1.tail_rows:  # the blocks' own programs must give the same bits
        block_m, tail = config.gemm1.block_m, config.gemm1.tail_rows
        wide = config.gemm1.wide_tail_rows or tail
        counts = torch.bincount(torch.topk(route["router_logits"], k, dim=-1).indices.flatten(), minlength=e)
        rest = counts % block_m
        stats["absorbed_tails"] = int(((counts > block_m) & (rest > 0) & (rest <= wide)).sum())
        if wide > tail:
            stats["wide_tails"] = int(((counts > block_m) & (rest > tail) & (rest <= wide)).sum())
        blocks = tuning.MoEConfig(dataclasses.replace(config.gemm1, tail_rows=None, wide_tail_rows=None),
                                  dataclasses.replace(config.gemm2, tail_rows=None, wide_tail_rows=None), "test")
        unabsorbed = moe_forward(x, kw, **route, **activation_kwargs(shape), config=blocks)
        stats["bits_as_blocks"] = torch.equal(out.view(torch.int16), unabsorbed.view(torch.int16))
    return stats


# (T, E, k, BLOCK_M[, coarse_pad]); the multi-program path runs 128-pair chunks: 1 to 14 chunks here, the last ones
# partial; with coarse_pad the crowded expert's run (about T / 2 rows) and some others end just past a WHOLE multiple
ALIGN_CASES = [(1, 128, 4, 16), (3, 32, 4, 16), (37, 8, 3, 16), (64, 256, 8, 16), (120, 128, 8, 64), (9, 6, 1, 32),
               (300, 128, 4, 64), (222, 256, 8, 16), (130, 6, 2, 32), (140, 6, 2, 16, (32, 64)),
               (37, 8, 3, 8, (16, 32)), (300, 16, 4, 16, (32, 64)), (200, 4, 1, 8, (32, 64))]


def _check_fused_alignment() -> dict:
    """The one-launch and the two-launch (multi-program) alignments give exactly the torch path's blocks."""
    import torch

    from backends.triton_moe import _kernels, _routing

    gen = torch.Generator().manual_seed(5)
    mismatches = []
    fine_runs = 0
    for tokens, experts, k, block_m, *coarse_pad in ALIGN_CASES:
        coarse_pad = coarse_pad[0] if coarse_pad else None
        ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)]).int()
        ids[: tokens // 2, 0] = 1  # a crowded expert
        ref = _routing._align_torch(ids, experts, block_m, coarse_pad=coarse_pad)
        if coarse_pad:
            padded = _routing.padded_runs(torch.bincount(ids.reshape(-1).long(), minlength=experts), block_m,
                                          coarse_pad)
            fine_runs += int((padded % coarse_pad[0] != 0).sum())
        for path in ("one-program", "multi-program"):
            if path == "one-program" and ids.numel() > 4096:  # its sort holds every pair in one program
                continue
            got = _routing.align(ids, experts, block_m, _kernels, path=path, coarse_pad=coarse_pad)
            used = int(ref.padded_total) // block_m
            if not (int(got.padded_total) == int(ref.padded_total)
                    and torch.equal(got.sorted_pairs, ref.sorted_pairs)
                    and torch.equal(got.block_expert[:used], ref.block_expert[:used])):
                mismatches.append([tokens, experts, k, block_m, coarse_pad, path])
    return {"mismatches": mismatches, "fine_runs": fine_runs}


ROUTE_CASES = [(1, 128, 4, True), (7, 6, 1, True), (5, 256, 8, False), (33, 32, 3, False), (16, 20, 5, True)]


def _check_fused_routing() -> dict:
    """topk_route_kernel selects the same experts (same order) as the torch route and gives the same weights
    up to fp32 rounding, for both routings, non-power-of-2 E and k, bf16 and fp32 logits."""
    import torch

    from backends.triton_moe import _kernels, _routing

    gen = torch.Generator().manual_seed(9)
    mismatches, max_weight_error = [], 0.0
    for tokens, experts, k, renormalize in ROUTE_CASES:
        for dtype in (torch.float32, torch.bfloat16):
            logits = (torch.randn(tokens, experts, generator=gen) * 3).to(dtype)
            ref_ids, ref_w = _routing.route(logits, k, renormalize)
            ids, w = _routing.route(logits, k, renormalize, _kernels)
            if not torch.equal(ids.long(), ref_ids):
                mismatches.append([tokens, experts, k, renormalize, str(dtype)])
            max_weight_error = max(max_weight_error, (w - ref_w).abs().max().item())
    return {"mismatches": mismatches, "max_weight_error": max_weight_error}


def _check_routing_ties() -> dict:
    """Both routing kernels (topk_route_kernel, one token per program; route_and_align, the tokens of one
    alignment launch) pick by logit, break ties by the lower expert index, treat -0.0 as +0.0 and pick every expert
    at most once, also when fewer than k logits are finite; on rows made of a few repeated values."""
    import torch

    from backends.triton_moe import _kernels, _routing

    gen = torch.Generator().manual_seed(5)
    rows = [torch.tensor([0.0, -0.0, 1.0, 1.0, -2.0, float("-inf"), -0.0, 3.0]), torch.tensor([-0.0, 0.0, -0.0, 0.0]),
            torch.tensor([2.0, float("-inf"), float("-inf"), 1.0, float("-inf"), float("-inf")])]
    rows += [torch.randint(-3, 3, (experts,), generator=gen).float() for experts in (6, 16, 40, 128, 300)]
    mismatches = []
    for logits in rows:
        experts = logits.numel()
        for k in (1, 2, 3, 4, 8):
            if k > experts:
                continue
            expected = sorted(range(experts), key=lambda e: (-float(logits[e]), e))[:k]
            ids = torch.empty(1, k, dtype=torch.int32)
            weights = torch.empty(1, k)
            _kernels.topk_route_kernel[(1,)](logits[None], ids, weights, experts, E=experts,
                                             E_BLOCK=1 << (experts - 1).bit_length(), TOP_K=k,
                                             K_BLOCK=1 << (k - 1).bit_length(), RENORMALIZE=True)
            picked = [ids[0].tolist()]
            if 2 * experts <= 4096:  # two tokens in the alignment launch: the row and its negation
                both = torch.stack([logits, -logits])
                in_align, _, _ = _routing.route_and_align(both, k, True, experts, 16, _kernels)
                picked.append(in_align[0].tolist())
                negated = sorted(range(experts), key=lambda e: (float(logits[e]), e))[:k]
                if in_align[1].tolist() != negated:
                    mismatches.append([(-logits).tolist(), k, in_align[1].tolist(), negated])
            mismatches += [[logits.tolist(), k, got, expected] for got in picked if got != expected]
    return {"mismatches": mismatches}


def _check_route_in_align() -> dict:
    """route_and_align (routing inside the one-program alignment launch) selects topk_route_kernel's experts in
    its order (ties included: lowest index first; bf16 logits tie often), gives its weights up to fp32 rounding,
    and the alignment of those ids, for T <= 16."""
    import torch

    from backends.triton_moe import _kernels, _routing

    gen = torch.Generator().manual_seed(11)
    mismatches, max_weight_error = [], 0.0
    for tokens, experts, k, renormalize in [case for case in ROUTE_CASES if case[0] <= 16] + [(16, 128, 4, True)]:
        for dtype in (torch.float32, torch.bfloat16):
            logits = (torch.randn(tokens, experts, generator=gen) * 3).to(dtype)
            ref_ids, ref_w = _routing.route(logits, k, renormalize, _kernels)
            ids, w, al = _routing.route_and_align(logits, k, renormalize, experts, 16, _kernels)
            ref_al = _routing._align_torch(ref_ids, experts, 16)
            if not (torch.equal(ids, ref_ids) and torch.equal(al.sorted_pairs, ref_al.sorted_pairs)
                    and torch.equal(al.padded_total, ref_al.padded_total)):
                mismatches.append([tokens, experts, k, renormalize, str(dtype)])
            max_weight_error = max(max_weight_error, (w - ref_w).abs().max().item())
    return {"mismatches": mismatches, "max_weight_error": max_weight_error}


def _check_scale_folding() -> dict:
    """Folded (one FMA) and unfolded (two FMAs) dequantization give the same bits; MXFP4 exponents above 128
    (block scales > 2) take the unfolded path and still match the emulation; NVFP4 always folds."""
    import torch

    from backends import emulation
    from backends.layouts.triton_moe import to_kernel_layout
    from backends.triton_moe import forward, moe_forward, tuning
    from backends.triton_moe.testing import Shape, activation_kwargs, random_checkpoint

    shape = Shape("fold", "mxfp4", 4, 2, 64, 64, "swigluoai", True)
    gen = torch.Generator().manual_seed(11)
    ckpt = random_checkpoint(shape, generator=gen)
    x = torch.randn(5, 64, generator=gen).bfloat16()
    route = {"router_logits": torch.randn(5, 4, generator=gen), "top_k": 2}
    act = activation_kwargs(shape)
    swap = tuning.LaunchConfig(16, 32, 64, 1, True, 4, 2)
    config = tuning.MoEConfig(swap, swap, "test")
    weights = to_kernel_layout(**ckpt)
    folded_verdict = forward._scales_fold(weights)
    folded = moe_forward(x, weights, **route, **act, config=config)
    real_fold = forward._scales_fold
    forward._scales_fold = lambda w: False
    try:
        unfolded = moe_forward(x, weights, **route, **act, config=config)
    finally:
        forward._scales_fold = real_fold
    ckpt["w13_scale"] = ckpt["w13_scale"] + 9  # exponents 127..131: block scales up to 16
    ckpt["w2_scale"] = ckpt["w2_scale"] + 9
    large = to_kernel_layout(**ckpt)
    ref = emulation.moe_forward(x, **ckpt, **route, **act)
    stats = w4a16_vs_emulation(moe_forward(x, large, **route, **act, config=config), ref)
    nv = to_kernel_layout(**random_checkpoint(Shape("nv", "nvfp4", 4, 2, 64, 64, "silu", False), generator=gen))
    return {"folded_verdict": folded_verdict, "large_verdict": forward._scales_fold(large),
            "nvfp4_verdict": forward._scales_fold(nv),
            "same_bits": torch.equal(folded.view(torch.int16), unfolded.view(torch.int16)), **stats}


@pytest.fixture(scope="module")
def interpreter_results() -> dict:
    return interpreter_worker_rows(__file__)


@pytest.mark.parametrize("case", sorted(CASES))
def test_interpreter_matches_emulation(interpreter_results, case):
    stats = interpreter_results[case]
    assert "error" not in stats, stats.get("error")
    assert stats["shape_ok"] and stats["finite"], stats
    assert stats["rel_l2_ratio"] <= 1.0, f"relative L2 error {stats['rel_l2']:.3e} over the tolerance: {stats}"
    assert stats["elementwise_ratio"] <= 1.0, stats
    assert stats["bit_identical_rerun"], "two runs on the same input differ"
    if "absorbed_tails" in stats:  # tail_rows cases: some runs end in a block short enough to be absorbed
        assert stats["absorbed_tails"] >= 2 and stats["bits_as_blocks"], stats
    if "wide_tails" in stats:  # wide_tail_rows cases: both tail widths run
        assert 1 <= stats["wide_tails"] < stats["absorbed_tails"], stats


def test_interpreter_fused_alignment_matches_torch_path(interpreter_results):
    row = interpreter_results["fused-alignment"]
    assert "error" not in row, row.get("error")
    assert row["mismatches"] == [], f"(T, E, k, BLOCK_M, coarse_pad) cases that differ: {row['mismatches']}"
    assert row["fine_runs"] >= 2, row  # the coarse_pad cases have runs its exception pads finer


def test_interpreter_routing_breaks_ties_by_lower_index(interpreter_results):
    row = interpreter_results["routing-ties"]
    assert "error" not in row, row.get("error")
    assert row["mismatches"] == [], f"[logits, k, picked, expected] that differ: {row['mismatches']}"


def test_interpreter_fused_routing_matches_torch_route(interpreter_results):
    row = interpreter_results["fused-routing"]
    assert "error" not in row, row.get("error")
    assert row["mismatches"] == [], f"(T, E, k, renormalize, dtype) cases selecting other experts: {row['mismatches']}"
    assert row["max_weight_error"] <= tolerance("fp32_reordered")["atol"]  # same fp32 softmax, other exp and sum order, row


def test_interpreter_routing_inside_alignment_matches_route_then_align(interpreter_results):
    row = interpreter_results["route-in-align"]
    assert "error" not in row, row.get("error")
    assert row["mismatches"] == [], f"(T, E, k, renormalize, dtype) cases that differ: {row['mismatches']}"
    assert row["max_weight_error"] <= tolerance("fp32_reordered")["atol"]  # same fp32 softmax, other sum order


def test_interpreter_scale_folding_same_bits_and_large_scales(interpreter_results):
    row = interpreter_results["scale-folding"]
    assert "error" not in row, row.get("error")
    assert row["folded_verdict"] and row["nvfp4_verdict"] and not row["large_verdict"], row
    assert row["same_bits"], "folded and unfolded dequantization must give the same bits"
    assert row["finite"] and row["rel_l2_ratio"] <= 1.0 and row["elementwise_ratio"] <= 1.0, row


def _check_decode_loads_ahead() -> dict:
    """The decode kernels with each warp's next K step loaded ahead (GemvLaunch.loads_ahead) give the same bits as
    without: the same products in the same order. K tails (H = 320, I = 192: 2.5 and 1.5 steps of 128), GEMV1's
    first K slice ending before K (its last load ahead is the next slice's: masked), a dead GEMV2 slot (top-3 in 4
    slots), both formats; and against the emulation."""
    import torch

    from backends import emulation
    from backends.layouts.triton_moe import to_kernel_layout
    from backends.triton_moe import moe_forward, tuning
    from backends.triton_moe.testing import Shape, activation_kwargs, random_checkpoint

    swap = tuning.LaunchConfig(16, 32, 64, 1, True, 4, 2)
    rows = {}
    for fmt, act, biases in (("mxfp4", "swigluoai", True), ("nvfp4", "silu", False)):
        shape = Shape(f"ahead-{fmt}", fmt, 8, 3, 320, 192, act, biases)
        gen = torch.Generator().manual_seed(11)
        ckpt = random_checkpoint(shape, generator=gen)
        x = torch.randn(1, shape.hidden_size, generator=gen).bfloat16()
        logits = torch.randn(1, shape.experts, generator=gen)
        weights = to_kernel_layout(**ckpt)
        outs = [moe_forward(x, weights, router_logits=logits, top_k=shape.top_k, **activation_kwargs(shape),
                            config=tuning.MoEConfig(swap, swap, "test", tuning.DecodeConfig(
                                tuning.GemvLaunch(4, 2, ahead), tuning.GemvLaunch(4, 1, ahead))))
                for ahead in (False, True)]
        ref = emulation.moe_forward(x, **ckpt, router_logits=logits, top_k=shape.top_k, **activation_kwargs(shape))
        stats = w4a16_vs_emulation(outs[1], ref)
        rows[fmt] = {"same_bits": torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)),
                     "rel_l2_ratio": stats["rel_l2_ratio"],
                     "elementwise_ratio": stats["elementwise_ratio"]}
    return rows


def test_interpreter_decode_loads_ahead_changes_no_bit(interpreter_results):
    row = interpreter_results["decode-loads-ahead"]
    assert "error" not in row, row.get("error")
    for fmt in ("mxfp4", "nvfp4"):
        assert row[fmt]["same_bits"], f"{fmt}: loads ahead changed the output"
        assert row[fmt]["rel_l2_ratio"] <= 1.0 and row[fmt]["elementwise_ratio"] <= 1.0, row[fmt]


def _check_e4m3_scale_decode() -> dict:
    from triton_moe_scale_probe import e2m1_decode_mismatches, e4m3_decode_mismatches, e8m0_folded_decode_mismatches

    return {"mismatches": e4m3_decode_mismatches("cpu"), "e8m0_mismatches": e8m0_folded_decode_mismatches("cpu"),
            "e2m1_mismatches": e2m1_decode_mismatches("cpu")}


def test_interpreter_scale_decode_is_exact_for_every_code(interpreter_results):
    row = interpreter_results["e4m3-scale-decode"]
    assert "error" not in row, row.get("error")
    assert row["mismatches"] == [], f"E4M3 codes decoded wrong: {row['mismatches']}"
    assert row["e8m0_mismatches"] == [], f"E8M0 exponents decoded wrong (folded): {row['e8m0_mismatches']}"
    assert row["e2m1_mismatches"] == [], f"[folded, byte] of E2M1 bytes decoded wrong: {row['e2m1_mismatches']}"


CHECKS = {"fused-alignment": _check_fused_alignment, "scale-folding": _check_scale_folding,
          "fused-routing": _check_fused_routing, "e4m3-scale-decode": _check_e4m3_scale_decode,
          "route-in-align": _check_route_in_align, "routing-ties": _check_routing_ties,
          "decode-loads-ahead": _check_decode_loads_ahead}

if __name__ == "__main__":  # the worker: TRITON_INTERPRET=1 is set by the fixture above
    import traceback

    for case_name, case_spec in [*CASES.items(), *((name, None) for name in CHECKS)]:
        try:
            row = CHECKS[case_name]() if case_spec is None else _run_case(case_name, case_spec)
        except Exception:  # noqa: BLE001  report and keep going: each test shows its own case's failure
            row = {"error": traceback.format_exc()[-3000:]}
        print(json.dumps({"case": case_name, **row}), flush=True)
