"""Launch configs that `bench_moe.py --sweep --candidates NAME` times at each T, after the committed entry.

`default` is the full sweep that produced the tuning tables; the others are the round-5 (issue 17) experiments,
kept so that their records in benchmarks/gpu/ can be reproduced. Both GEMMs of a candidate share BLOCK_M (they walk
one alignment's row blocks).
"""

from __future__ import annotations

import dataclasses

from backends.triton_moe import tuning


def _same_tile_for_both(tiles) -> list:
    """Swap-AB (bm, bn, bk, warps, stages) tiles, GROUP_M 8, the same config for GEMM1 and GEMM2."""
    return [(tuning.LaunchConfig(bm, bn, bk, 8, True, w, st),) * 2 for bm, bn, bk, w, st in tiles]


def decode_wide_candidates(tokens):
    """Round-5 additions for T <= 16, where the decode GEMMs run few warps per SM (latency-bound at T = 1): more
    split-K slices (8, 16) and 4-warp swap-AB tiles, so more warps share each expert's K loop."""
    L = tuning.LaunchConfig
    if tokens > 16:
        return []
    bases = (L(16, 64, 128, 1, True, 2, 3), L(16, 64, 64, 1, True, 2, 4), L(16, 32, 64, 1, True, 1, 4),
             L(16, 64, 64, 1, True, 4, 4), L(16, 64, 128, 1, True, 4, 3), L(16, 128, 64, 1, True, 4, 4))
    more_splits = ((8, 4), (8, 8)) if tokens <= 4 else ((4, 4), (8, 4))
    return [(dataclasses.replace(c, split_k=s1), dataclasses.replace(c, split_k=s2))
            for c in bases for s1, s2 in (((1, 1), (4, 4), (8, 4)) if c.num_warps == 4 else more_splits)]


def prefill_swap_candidates(tokens):
    """Round-5 additions for T >= 1024: swap-AB prefill tiles (weights as wgmma's A operand, straight from the
    dequantizing registers; the plain tiles store them to shared memory and wait at a barrier, which ncu shows as
    the top stall there). A first sweep (benchmarks/gpu/moe-sweep-h200-prefill-swap.*) found 64x128 and 128x64
    4-warp and 128x128x128 8-warp swap tiles 4-16% faster than the plain ones at T = 4096-16384; these are
    the tiles around them."""
    L = tuning.LaunchConfig
    if tokens < 1024:
        return []
    tiles = ((64, 128, 64, 4, 4), (64, 128, 64, 4, 5), (64, 128, 128, 4, 3), (64, 128, 128, 4, 4),
             (128, 64, 64, 4, 4), (128, 64, 64, 4, 5), (128, 64, 128, 4, 3), (128, 128, 128, 8, 3),
             (128, 128, 128, 8, 4), (64, 256, 64, 8, 3), (64, 256, 64, 8, 4), (64, 64, 64, 4, 4))
    pairs = _same_tile_for_both(tiles)
    # GEMM1 (two accumulators) and GEMM2 (one) may prefer different tiles of the same BLOCK_M (both walk one
    # alignment's row blocks)
    return pairs + [(L(128, 64, 64, 8, True, 4, 4), L(128, 128, 128, 8, True, 8, 3)),
                    (L(128, 128, 128, 8, True, 8, 3), L(128, 64, 64, 8, True, 4, 4)),
                    (L(64, 128, 64, 8, True, 4, 4), L(64, 256, 64, 8, True, 8, 4)),
                    (L(64, 256, 64, 8, True, 8, 4), L(64, 128, 64, 8, True, 4, 4))]


def mid_swap_candidates(tokens):
    """Round 5, 64 <= T <= 4096: swap-AB wgmma tiles with more warps per tile (ncu: the 4-warp 64x128 tile runs 2
    warps per scheduler at T = 1024, held by ~240 registers; 8 warps split its accumulators) and 32-token tiles."""
    if not 64 <= tokens <= 4096:
        return []
    tiles = ((64, 128, 64, 8, 3), (64, 128, 64, 8, 4), (64, 128, 128, 8, 3), (64, 64, 64, 4, 5), (32, 128, 64, 4, 4),
             (32, 128, 64, 8, 4), (32, 64, 64, 4, 4), (32, 64, 128, 4, 3), (128, 128, 64, 8, 4), (64, 256, 64, 8, 3))
    return _same_tile_for_both(tiles)


def register_cap_candidates(tokens, entry):
    """Round 5: the committed entry with a register cap (maxnreg) and one stage fewer. ncu showed the decode and
    prefill GEMMs at 2-3 resident warps per scheduler, held there by registers and shared memory, with warps
    stalled on the math pipe, the barrier or each other: more resident blocks may hide more of that."""
    c1, c2 = entry
    out = []
    for cap in (96, 128, 168):
        for fewer in (0, 1):
            out.append(tuple(dataclasses.replace(c, maxnreg=cap, num_stages=max(2, c.num_stages - fewer))
                             for c in (c1, c2)))
    return out


def sweep_candidates(tokens):
    """Launch configs worth timing at this T. Decode: swap-AB 16-token tiles; 1-2 warps (mma.sync) beat
    4-8 (wgmma) there, with split-K for the few-token sizes; middle: swap-AB and 32-64-row tiles;
    prefill: 64-128-row tiles, deeper pipelines."""
    L = tuning.LaunchConfig
    if tokens <= 64:
        bases = (L(16, 64, 64, 1, True, 2, 4), L(16, 64, 128, 1, True, 2, 4), L(16, 64, 64, 1, True, 2, 6),
                 L(16, 64, 128, 1, True, 2, 3), L(16, 64, 64, 1, True, 1, 4), L(16, 32, 64, 1, True, 1, 4),
                 L(16, 32, 128, 1, True, 1, 4))
        splits = ((1, 1), (2, 1), (2, 2), (4, 2), (4, 4)) if tokens <= 4 else ((1, 1), (2, 1), (2, 2)) \
            if tokens <= 16 else ((1, 1), (2, 1))
        return [(dataclasses.replace(c, split_k=s1), dataclasses.replace(c, split_k=s2))
                for c in bases for s1, s2 in splits]
    if tokens <= 1024:
        tiles = (L(16, 64, 64, 8, True, 2, 4), L(16, 64, 128, 8, True, 2, 4), L(16, 64, 64, 8, True, 1, 4),
                 L(16, 32, 64, 8, True, 1, 4), L(32, 64, 64, 8, True, 2, 4), L(32, 32, 64, 8, True, 1, 4),
                 L(32, 64, 128, 8, True, 2, 3), L(32, 128, 64, 8, True, 4, 4), L(64, 64, 64, 8, True, 2, 4),
                 L(64, 64, 64, 8, True, 4, 4), L(64, 128, 64, 8, True, 4, 3), L(64, 128, 64, 8, False, 4, 4),
                 L(128, 128, 64, 8, False, 8, 3))
        return [(c, c) for c in tiles]
    return [(L(bm, bn, bk, 8, False, w, st), L(bm, bn2, bk, 8, False, w, st))
            for bm, bn, bn2, bk, w, st in ((128, 128, 128, 64, 8, 3), (128, 128, 128, 64, 8, 4),
                                           (128, 128, 128, 128, 8, 3), (128, 256, 128, 64, 8, 3),
                                           (128, 128, 256, 64, 8, 3), (64, 128, 128, 64, 4, 4),
                                           (128, 64, 128, 128, 4, 3), (64, 256, 256, 64, 8, 3),
                                           (128, 128, 128, 64, 4, 4), (64, 128, 128, 128, 4, 3),
                                           (256, 64, 128, 64, 8, 3), (256, 64, 128, 64, 8, 4))]


def wgmma_decode_candidates(tokens):
    """Round 6, T <= 256: 4-warp swap-AB tiles (wgmma, 16-32 tokens) now that the weights' stored byte order makes
    their register operand one word per thread (round 5's wgmma tiles assembled it from 2-byte loads, and lost to
    the 1-2 warp mma.sync tiles here); with split-K where few tokens leave the GPU idle."""
    L = tuning.LaunchConfig
    if tokens > 256:
        return []
    tiles = (L(16, 64, 64, 1, True, 4, 3), L(16, 64, 64, 1, True, 4, 4), L(16, 128, 64, 1, True, 4, 3),
             L(16, 128, 64, 1, True, 4, 4), L(16, 64, 128, 1, True, 4, 3), L(16, 128, 128, 1, True, 4, 3))
    if tokens >= 64:
        tiles += (L(32, 128, 64, 1, True, 4, 4), L(16, 256, 64, 1, True, 8, 3))
    splits = ((1, 1), (2, 1), (4, 2)) if tokens <= 16 else ((1, 1), (2, 1))
    group = 1 if tokens <= 64 else 8
    return [(dataclasses.replace(c, split_k=s1, group_m=group), dataclasses.replace(c, split_k=s2, group_m=group))
            for c in tiles for s1, s2 in splits]


def stacked_prefill_candidates(tokens):
    """Round 8, T >= 1024: GEMM1 with its gate and up rows stacked into one weight tile (stack_gate_up). Without it a
    swap-AB tile of 64 weight rows per half sends its dequantized weights through shared memory (Triton's layout
    propagation gives up; SASS: STS + LDSM in the K loop), so 128-token tiles lost to 64-token ones although they
    dequantize each weight for twice the tokens (K loop: 269 vs 419 instructions for the same MMA work); stacked, the
    128 rows stay in registers. GEMM2 pairs with 128-row weight tiles of the same BLOCK_M."""
    L = tuning.LaunchConfig
    if tokens < 1024:
        return []
    pairs = []
    for bm, bn1, bk1, w1, st1, bn2, bk2, w2, st2 in (
            (64, 128, 64, 4, 5, 128, 64, 4, 5), (128, 64, 64, 4, 3, 128, 64, 4, 3), (128, 64, 64, 4, 4, 128, 64, 4, 4),
            (128, 64, 64, 4, 4, 64, 64, 4, 4), (128, 64, 128, 4, 3, 128, 64, 4, 3), (128, 128, 64, 8, 3, 128, 64, 4, 3),
            (128, 64, 64, 4, 3, 128, 128, 8, 3), (256, 64, 64, 8, 3, 128, 64, 8, 3),
            (256, 64, 64, 8, 2, 128, 64, 8, 2)):
        pairs.append((L(bm, bn1, bk1, 8, True, w1, st1, stack_gate_up=True), L(bm, bn2, bk2, 8, True, w2, st2)))
    if tokens <= 2048:  # ~32 pairs per expert at T = 1024: tiles of 32-64 tokens waste less padding
        for bm, bn1, bn2, st in ((32, 128, 128, 4), (32, 64, 128, 4), (64, 64, 128, 4), (64, 128, 128, 4)):
            pairs.append((L(bm, bn1, 64, 8, True, 4, st, stack_gate_up=True), L(bm, bn2, 64, 8, True, 4, st)))
    return pairs


def stacked_t1024_candidates(tokens):
    """Round 8, 512 < T <= 2048 (about 32 pairs per expert for deepseek-nvfp4 at T = 1024): 64-token stacked GEMM1
    tiles with more warps or a longer K step, against GEMM2 tiles of 128-256 weight rows (ncu: GEMM1 runs 2 warps
    per scheduler at 246 registers there, GEMM2 3 at 159)."""
    L = tuning.LaunchConfig
    if not 512 < tokens <= 2048:
        return []
    gemm1 = (L(64, 128, 64, 8, True, 4, 4, stack_gate_up=True), L(64, 128, 64, 8, True, 8, 4, stack_gate_up=True),
             L(64, 64, 128, 8, True, 4, 3, stack_gate_up=True), L(64, 128, 128, 8, True, 4, 3, stack_gate_up=True),
             L(64, 64, 64, 8, True, 4, 5, stack_gate_up=True))
    gemm2 = (L(64, 128, 64, 8, True, 4, 4), L(64, 256, 64, 8, True, 8, 4), L(64, 128, 128, 8, True, 4, 3))
    return [(c1, c2) for c1 in gemm1 for c2 in gemm2]


#: --candidates: what a sweep times at each T after the committed entry (which is always timed first).
CANDIDATES = {"default": lambda tokens, entry: sweep_candidates(tokens),
              "decode-wide": lambda tokens, entry: decode_wide_candidates(tokens),
              "prefill-swap": lambda tokens, entry: prefill_swap_candidates(tokens),
              "register-cap": register_cap_candidates,
              "mid-swap": lambda tokens, entry: mid_swap_candidates(tokens),
              "wgmma-decode": lambda tokens, entry: wgmma_decode_candidates(tokens),
              "stacked-prefill": lambda tokens, entry: stacked_prefill_candidates(tokens),
              "stacked-t1024": lambda tokens, entry: stacked_t1024_candidates(tokens)}
