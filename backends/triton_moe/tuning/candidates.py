"""The launch configs `moe-oracle tune` (and benchmarks/bench_moe.py --sweep) times at one T: the heuristic's
pick first, then the tiles the H100/H200 sweeps found competitive in the same rows-per-expert class and the
neighbouring class (the heuristic's class boundaries are where it is most likely wrong). Both GEMMs of a
candidate share BLOCK_M (they walk one alignment's row blocks)."""

from __future__ import annotations

from backends.triton_moe.tuning.configs import LaunchConfig, MoEConfig, Problem

L = LaunchConfig


def _decode(problem: Problem, base: MoEConfig) -> list:
    splits = sorted({1, 2, base.gemm1.split_k} | ({4} if problem.tokens <= 4 else set()))
    tiles = ((64, 128, 2, 3), (64, 128, 4, 3), (128, 64, 4, 4), (128, 64, 4, 3), (64, 64, 2, 4), (128, 128, 4, 3))
    group = 1 if problem.rows_per_expert < 4 else 8
    out = []
    for bn, bk, warps, stages in tiles:
        for s1 in splits:
            for s2 in sorted({1, base.gemm2.split_k}):
                epilogue = "fused" if s1 > 1 and problem.tokens <= 2 else None
                out.append((L(16, bn, bk, group, True, warps, stages, split_k=s1, split_epilogue=epilogue),
                            L(16, bn, bk, group, True, warps, stages, split_k=s2)))
    return out


def _mid() -> list:
    out = []
    for bm, bn1, bn2, stages in ((64, 64, 128, 4), (64, 128, 128, 4), (64, 128, 128, 5), (64, 64, 128, 3),
                                 (32, 64, 128, 4), (32, 128, 128, 4)):
        half = True if bm >= 64 else None
        out.append((L(bm, bn1, 64, 8, True, 4, stages, stack_gate_up=True, half_rows=half),
                    L(bm, bn2, 64, 8, True, 4, stages, half_rows=half)))
    out.append((L(64, 128, 64, 8, True, 4, 4, half_rows=True), L(64, 128, 64, 8, True, 4, 4, half_rows=True)))
    return out


def _prefill(problem: Problem) -> list:
    """128-row tiles with and without half_rows and, where runs may fill more than a block, with tail_rows (the
    H100 winners at T >= 4096: 16 rows on 4-warp tiles, 32 on the 8-warp GEMM1) and the 4-warp tiles with a wide
    tail as well (16 + 32 rows: 1.02-1.03x at T = 4096 on an H200, benchmarks/results/wide-tails-h200-2026-11-29/)."""
    out = []
    tails = ((None, None), (16, None), (32, None), (16, 32)) if problem.rows_per_touched_expert > 64 else \
        ((None, None),)
    for half in (True, None):
        for tail, wide in tails:
            out.append((L(128, 64, 64, 8, True, 4, 3, stack_gate_up=True, half_rows=half, tail_rows=tail,
                          wide_tail_rows=wide),
                        L(128, 128, 64, 8, True, 4, 3, half_rows=half, tail_rows=tail, wide_tail_rows=wide)))
            if wide is None:
                out.append((L(128, 128, 64, 8, True, 8, 3, stack_gate_up=True, half_rows=half, tail_rows=tail),
                            L(128, 128, 64, 8, True, 4, 3, half_rows=half, tail_rows=tail)))
        out.append((L(128, 64, 64, 8, True, 4, 4, stack_gate_up=True, half_rows=half),
                    L(128, 64, 64, 8, True, 4, 4, half_rows=half)))
    out.append((L(64, 128, 64, 8, True, 4, 5, stack_gate_up=True), L(64, 128, 64, 8, True, 4, 5)))
    return out


def sweep_candidates(problem: Problem, base: MoEConfig) -> list[tuple[LaunchConfig, LaunchConfig]]:
    """(gemm1, gemm2) pairs to time for `problem`, the heuristic's `base` first, without duplicates."""
    rows = problem.rows_per_expert
    found = [(base.gemm1, base.gemm2)]
    if base.gemm1.block_m == 16:
        found += _decode(problem, base) + (_mid() if rows >= 4 else [])
    elif base.gemm1.block_m <= 64:
        found += _mid() + _prefill(problem) + (_decode(problem, base) if rows <= 24 else [])
    else:
        found += _prefill(problem) + _mid()
    return list(dict.fromkeys(found))

