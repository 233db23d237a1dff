"""Triton kernels of the fused W4A16 MoE: GEMM1 + activation, GEMM2 + router weight, top-k sum.

    x [T, H] bf16 ──gather rows by sorted pair──> GEMM1 (gate and up tiles, FP4 dequantized in
    registers) ──bias, activation──> h [padded pairs, I] bf16 ──> GEMM2 (FP4 in registers) ──bias,
    router weight──> per-pair rows [T*k, H] fp32 ──fixed-order sum over k──> y [T, H]

Every program works on one (row block, column block) tile of one expert; row blocks come from
`_routing.align` (pairs sorted by expert, padded to BLOCK_M), so no host sync is needed and the
grid is a static upper bound (programs past the padded end return at once): CUDA-graph safe.
There are no atomics anywhere, so the result is bit-identical from run to run.

Weights stay packed E2M1 until the K loop (layout: backends.layouts.triton_moe; the low and the high
nibbles of a tile's bytes are two K sets that meet the matching activation columns in two MMAs - no
interleaving shuffle: MXFP4 bytes hold values k and k+32 of a 64-wide group; NVFP4 uses the "shared K
order", where the 4 consecutive bytes an mma.sync thread holds carry one 16-value block, so a swap-AB
thread decodes one block scale per 16 values, and _act_columns gathers the activations in that order).
A K step loads its bytes as one tile of 16-byte row copies and the scales as words (MXFP4, plain NVFP4)
or bytes (swap-AB NVFP4), broadcast in registers. On the GPU an inline-PTX routine turns 4 bytes into 8
scaled bf16 values with one bf16x2 FMA per pair (~2.25 SASS per value: the block scale carries the 2^126
of the bit trick); the CPU interpreter computes the same values in fp32. Products FP4 x block scale
are exact in bf16; the fp32 accumulator is divided by the NVFP4 per-expert global multiplier,
so nothing is rounded that the format did not round.
"""

from __future__ import annotations

import triton
import triton.language as tl

from backends.triton_moe._dequant import (  # the K step's operands (see that module)
    _act_halves,
    _act_tile,
    _scale_rows,
    _weight_tile,
    _weight_tile_nvfp4_k_order,
)

ACT_SILU = 0
ACT_SWIGLUOAI = 1


@triton.jit
def _round_bf16(v, INTERPRETED: tl.constexpr):
    """fp32 -> bf16 rounded to nearest even; the CPU interpreter truncates casts, so round the bits there."""
    if INTERPRETED:
        bits = v.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        v = bits.to(tl.float32, bitcast=True)
    return v.to(tl.bfloat16)


@triton.jit
def _mma(acc, a, w, SWAP_AB: tl.constexpr, DOT_FP32: tl.constexpr):
    """acc += a @ w^T ([BM, BN]) or, swapped, w @ a^T ([BN, BM]) so weights fill the MMA's M side."""
    if DOT_FP32:  # CPU interpreter: its bf16 dot is wrong (triton 3.9); the operands are bf16-exact anyway
        a = a.to(tl.float32)
        w = w.to(tl.float32)
    if SWAP_AB:  # one return: triton 3.6 compiles both returns of an early-return constexpr branch
        acc = tl.dot(w, tl.trans(a), acc)
    else:
        acc = tl.dot(a, tl.trans(w), acc)
    return acc


@triton.jit
def _act_store(acc_g, acc_u, expert, offs_m, offs_n, col_ok, store_ok, gs_ptr, bias_ptr, h_ptr, N: tl.constexpr,
               stride_be, stride_hm, alpha, beta, limit, NVFP4: tl.constexpr, ACTIVATION: tl.constexpr,
               HAS_BIAS: tl.constexpr, INTERPRETED: tl.constexpr):
    """GEMM1's epilogue on full-K fp32 sums [rows, cols]: global scale, bias, activation, bf16 store to h."""
    if NVFP4:  # the dequantized weights carry 2^-NVFP4_FOLD_SHIFT (_dequant._scale_pair): undo it, exactly
        global_scale = tl.load(gs_ptr + expert)
        acc_g = acc_g * 65536.0 / global_scale
        acc_u = acc_u * 65536.0 / global_scale
    if HAS_BIAS:
        b_ptrs = bias_ptr + expert * stride_be + offs_n
        acc_g += tl.load(b_ptrs, mask=col_ok, other=0.0)[None, :]
        acc_u += tl.load(b_ptrs + N, mask=col_ok, other=0.0)[None, :]
    if ACTIVATION == 1:  # gpt-oss swigluoai: clamp gate from above, up both ways, (up + beta) * glu
        acc_g = tl.minimum(acc_g, limit)
        acc_u = tl.minimum(tl.maximum(acc_u, -limit), limit)
        h = (acc_u + beta) * acc_g / (1.0 + tl.exp(-alpha * acc_g))
    else:  # silu-and-mul
        h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    h_ptrs = h_ptr + offs_m.to(tl.int64)[:, None] * stride_hm + offs_n[None, :]
    tl.store(h_ptrs, _round_bf16(h, INTERPRETED), mask=store_ok)


@triton.jit
def _tile_ids(num_m_blocks, n_size, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped ordering: GROUP_M row blocks walk all column blocks together (weight tiles reused in L2)."""
    pid = tl.program_id(0)
    num_n = (n_size + BLOCK_N - 1) // BLOCK_N
    per_group = GROUP_M * num_n
    group = pid // per_group
    first_m = group * GROUP_M
    group_rows = tl.minimum(num_m_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def _block_rows(pid_m, pid_n, block_expert_ptr, sorted_pair_ptr, num_pairs, N: tl.constexpr, K_SPLIT: tl.constexpr,
                SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The GEMMs' shared prologue: expert, row indices and pairs, columns, and the K slice's start."""
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_pair_ptr + offs_m)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_base = 0  # split-K: slice program_id(1), K_SPLIT wide (see _k_split in forward.py)
    if SPLIT_K > 1:
        k_base = tl.program_id(1) * K_SPLIT
    return expert, offs_m, pair, pair < num_pairs, offs_n, offs_n < N, k_base


@triton.jit
def _zero_acc(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr):
    if SWAP_AB:  # weights on the MMA's M side: the accumulator is [columns, rows] until the epilogue
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:  # one return (see _mma)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    return acc


@triton.jit
def gemm1_act_kernel(
    x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, h_ptr, part_ptr,
    sorted_pair_ptr, block_expert_ptr, padded_total_ptr,
    num_pairs, num_m_blocks, K: tl.constexpr, N: tl.constexpr,
    stride_xm, stride_we, stride_wn, stride_se, stride_sc, stride_be, stride_hm, stride_ps, stride_pm,
    alpha, beta, limit, SPLIT_K: tl.constexpr, K_SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SCALE_BLOCK: tl.constexpr, NVFP4: tl.constexpr, FOLDED: tl.constexpr,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, SWAP_AB: tl.constexpr, DOT_FP32: tl.constexpr,
    USE_ASM: tl.constexpr,
):
    """h[row, n] = act(gate, up) for the N=I outputs; w rows [0, N) are gate, [N, 2N) are up.

    SPLIT_K > 1: program (tile, s) sums K slice s only and stores raw fp32 gate/up sums of its real rows
    to part[s, row, 0:N | N:2N]; gemm1_split_epilogue_kernel adds the slices in order s = 0, 1, ...
    """
    pid_m, pid_n = _tile_ids(num_m_blocks, N, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(padded_total_ptr):
        return
    expert, offs_m, pair, row_ok, offs_n, col_ok, k_base = _block_rows(
        pid_m, pid_n, block_expert_ptr, sorted_pair_ptr, num_pairs, N, K_SPLIT, SPLIT_K, BLOCK_M, BLOCK_N)
    x_rows = x_ptr + (pair // TOP_K).to(tl.int64) * stride_xm
    wg_rows = w_ptr + expert * stride_we + offs_n.to(tl.int64) * stride_wn
    wu_rows = wg_rows + N * stride_wn
    sg_ptrs = _scale_rows(s_ptr, expert * stride_se + offs_n, NVFP4 and SWAP_AB)
    su_ptrs = _scale_rows(s_ptr, expert * stride_se + offs_n + N, NVFP4 and SWAP_AB)
    acc_g = _zero_acc(BLOCK_M, BLOCK_N, SWAP_AB)
    acc_u = _zero_acc(BLOCK_M, BLOCK_N, SWAP_AB)
    for k_step in range(0, K_SPLIT, BLOCK_K):
        k0 = k_base + k_step
        if NVFP4 and not SWAP_AB:  # natural K order: one activation tile, one MMA per matrix
            a = _act_tile(x_rows, k0, row_ok, K, BLOCK_K, EVEN_K)
            g = _weight_tile_nvfp4_k_order(wg_rows, sg_ptrs, stride_sc, k0, col_ok, K, BLOCK_K, EVEN_K, USE_ASM)
            u = _weight_tile_nvfp4_k_order(wu_rows, su_ptrs, stride_sc, k0, col_ok, K, BLOCK_K, EVEN_K, USE_ASM)
            acc_g = _mma(acc_g, a, g, SWAP_AB, DOT_FP32)
            acc_u = _mma(acc_u, a, u, SWAP_AB, DOT_FP32)
        else:
            a_lo, a_hi = _act_halves(x_rows, k0, row_ok, K, BLOCK_K, EVEN_K, NVFP4)
            g_lo, g_hi = _weight_tile(wg_rows, sg_ptrs, stride_sc, k0, col_ok, K, BLOCK_K,
                                      SCALE_BLOCK, NVFP4, FOLDED, EVEN_K, USE_ASM)
            u_lo, u_hi = _weight_tile(wu_rows, su_ptrs, stride_sc, k0, col_ok, K, BLOCK_K,
                                      SCALE_BLOCK, NVFP4, FOLDED, EVEN_K, USE_ASM)
            acc_g = _mma(_mma(acc_g, a_lo, g_lo, SWAP_AB, DOT_FP32), a_hi, g_hi, SWAP_AB, DOT_FP32)
            acc_u = _mma(_mma(acc_u, a_lo, u_lo, SWAP_AB, DOT_FP32), a_hi, u_hi, SWAP_AB, DOT_FP32)
    if SWAP_AB:
        acc_g = tl.trans(acc_g)
        acc_u = tl.trans(acc_u)
    if SPLIT_K == 1:
        _act_store(acc_g, acc_u, expert, offs_m, offs_n, col_ok, col_ok[None, :], gs_ptr, bias_ptr, h_ptr, N,
                   stride_be, stride_hm, alpha, beta, limit, NVFP4, ACTIVATION, HAS_BIAS, DOT_FP32)
    else:
        p_ptrs = (part_ptr + tl.program_id(1) * stride_ps + offs_m.to(tl.int64)[:, None] * stride_pm
                  + offs_n[None, :])
        ok = row_ok[:, None] & col_ok[None, :]
        tl.store(p_ptrs, acc_g, mask=ok)
        tl.store(p_ptrs + N, acc_u, mask=ok)


@triton.jit
def gemm1_split_epilogue_kernel(
    part_ptr, gs_ptr, bias_ptr, h_ptr, sorted_pair_ptr, block_expert_ptr, padded_total_ptr,
    num_pairs, N: tl.constexpr, stride_ps, stride_pm, stride_be, stride_hm, alpha, beta, limit,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NVFP4: tl.constexpr,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, INTERPRETED: tl.constexpr,
):
    """Split-K GEMM1: h = act(sum over s = 0..SPLIT_K-1 of part[s]) in that fixed order (deterministic)."""
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M >= tl.load(padded_total_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = tl.load(sorted_pair_ptr + offs_m) < num_pairs
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = offs_n < N
    ok = row_ok[:, None] & col_ok[None, :]
    p_ptrs = part_ptr + offs_m.to(tl.int64)[:, None] * stride_pm + offs_n[None, :]
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc_g += tl.load(p_ptrs + s * stride_ps, mask=ok, other=0.0)
        acc_u += tl.load(p_ptrs + s * stride_ps + N, mask=ok, other=0.0)
    _act_store(acc_g, acc_u, expert, offs_m, offs_n, col_ok, ok, gs_ptr, bias_ptr, h_ptr, N,
               stride_be, stride_hm, alpha, beta, limit, NVFP4, ACTIVATION, HAS_BIAS, INTERPRETED)


@triton.jit
def gemm2_kernel(
    h_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, route_w_ptr, out_ptr,
    sorted_pair_ptr, block_expert_ptr, padded_total_ptr,
    num_pairs, num_m_blocks, K: tl.constexpr, N: tl.constexpr,
    stride_hm, stride_we, stride_wn, stride_se, stride_sc, stride_be, stride_om, stride_os,
    SPLIT_K: tl.constexpr, K_SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SCALE_BLOCK: tl.constexpr, NVFP4: tl.constexpr, FOLDED: tl.constexpr, HAS_BIAS: tl.constexpr,
    SWAP_AB: tl.constexpr, DOT_FP32: tl.constexpr, USE_ASM: tl.constexpr,
):
    """out[pair, n] = route_weight[pair] * (h[row] @ W2[e]^T + b2[e]) for the N=H outputs, rows in pair order.

    SPLIT_K > 1: program (tile, s) writes its K slice's share to out[s] (bias in slice 0 only); the
    top-k sum kernel adds the slices in fixed order.
    """
    pid_m, pid_n = _tile_ids(num_m_blocks, N, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(padded_total_ptr):
        return
    expert, offs_m, pair, row_ok, offs_n, col_ok, k_base = _block_rows(
        pid_m, pid_n, block_expert_ptr, sorted_pair_ptr, num_pairs, N, K_SPLIT, SPLIT_K, BLOCK_M, BLOCK_N)
    a_rows = h_ptr + offs_m.to(tl.int64) * stride_hm
    w_rows = w_ptr + expert * stride_we + offs_n.to(tl.int64) * stride_wn
    s_ptrs = _scale_rows(s_ptr, expert * stride_se + offs_n, NVFP4 and SWAP_AB)
    acc = _zero_acc(BLOCK_M, BLOCK_N, SWAP_AB)
    for k_step in range(0, K_SPLIT, BLOCK_K):
        k0 = k_base + k_step
        if NVFP4 and not SWAP_AB:  # natural K order (see GEMM1)
            w = _weight_tile_nvfp4_k_order(w_rows, s_ptrs, stride_sc, k0, col_ok, K, BLOCK_K, EVEN_K, USE_ASM)
            acc = _mma(acc, _act_tile(a_rows, k0, row_ok, K, BLOCK_K, EVEN_K), w, SWAP_AB, DOT_FP32)
        else:
            a_lo, a_hi = _act_halves(a_rows, k0, row_ok, K, BLOCK_K, EVEN_K, NVFP4)
            w_lo, w_hi = _weight_tile(w_rows, s_ptrs, stride_sc, k0, col_ok, K, BLOCK_K,
                                      SCALE_BLOCK, NVFP4, FOLDED, EVEN_K, USE_ASM)
            acc = _mma(_mma(acc, a_lo, w_lo, SWAP_AB, DOT_FP32), a_hi, w_hi, SWAP_AB, DOT_FP32)
    if SWAP_AB:
        acc = tl.trans(acc)
    if NVFP4:  # undo the 2^-NVFP4_FOLD_SHIFT of the dequantized weights (exact), then the global scale
        acc = acc * 65536.0 / tl.load(gs_ptr + expert)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + expert * stride_be + offs_n, mask=col_ok, other=0.0)
        if SPLIT_K > 1:  # the bias belongs to slice 0 only
            bias = tl.where(tl.program_id(1) == 0, bias, 0.0)
        acc += bias[None, :]
    route_w = tl.load(route_w_ptr + pair, mask=row_ok, other=0.0)
    acc = acc * route_w[:, None]
    out_ptrs = out_ptr + pair.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    if SPLIT_K > 1:
        out_ptrs += tl.program_id(1) * stride_os
    tl.store(out_ptrs, acc, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def topk_sum_kernel(pair_out_ptr, out_ptr, N: tl.constexpr, stride_pm, stride_om, stride_ps,
                    TOP_K: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRETED: tl.constexpr):
    """y[t] = sum_j sum_s pair_out[s, t*k + j] in fixed order (j outer, split s inner; deterministic), bf16."""
    token = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = offs_n < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        for s in tl.static_range(SPLIT_K):
            acc += tl.load(pair_out_ptr + s * stride_ps + (token * TOP_K + j) * stride_pm + offs_n, mask=ok,
                           other=0.0)
    tl.store(out_ptr + token * stride_om + offs_n, _round_bf16(acc, INTERPRETED), mask=ok)


#: True when Triton's CPU interpreter runs these kernels (TRITON_INTERPRET=1 at triton's first import).
INTERPRETED = not isinstance(topk_sum_kernel, triton.runtime.jit.JITFunction)


# The routing and alignment kernels live in _routing_kernels.py; re-exported so that `kernels` (this module)
# is the one namespace forward.py and _routing.py launch from.
from backends.triton_moe._routing_kernels import (  # noqa: E402
    align_count_kernel,
    align_scatter_kernel,
    align_small_kernel,
    topk_route_kernel,
)

__all__ = ["align_count_kernel", "align_scatter_kernel", "align_small_kernel", "topk_route_kernel"]
