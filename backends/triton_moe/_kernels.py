"""Triton kernels of the fused W4A16 MoE: GEMM1 + activation, GEMM2 + router weight, top-k sum.

    x [T, H] bf16 ──gather rows by sorted pair──> GEMM1 (gate and up tiles, FP4 dequantized in
    registers) ──bias, activation──> h [padded pairs, I] bf16 ──> GEMM2 (FP4 in registers) ──bias,
    router weight──> per-pair rows [T*k, H] fp32 ──fixed-order sum over k──> y [T, H]

Every program works on one (row block, column block) tile of one expert; row blocks come from
`_routing.align` (pairs sorted by expert, padded to BLOCK_M), so no host sync is needed and the
grid is a static upper bound (programs past the padded end return at once): CUDA-graph safe.
There are no atomics anywhere, so the result is bit-identical from run to run.

Weights stay packed E2M1 (two codes per byte, low nibble first) until the K loop: a code is
turned into an fp16 bit pattern (sign<<15 | e m<<9) whose value is the E2M1 value times 2^-14,
so the constant 2^14 folds into the block scale (E8M0: exponent field + 14; E4M3: the same
fp16 trick, times 2^22). Products FP4 x block scale are exact in bf16; the fp32 accumulator is
divided by the NVFP4 per-expert global multiplier, so nothing is rounded that the format
did not round.
"""

from __future__ import annotations

import triton
import triton.language as tl

ACT_SILU = 0
ACT_SWIGLUOAI = 1


@triton.jit
def _dequant_tile(packed, scale_codes, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                  SCALE_BLOCK: tl.constexpr, NVFP4: tl.constexpr):
    """[ROWS, BLOCK_K/2] packed E2M1 + [ROWS, BLOCK_K/SCALE_BLOCK] scale codes -> bf16 [ROWS, BLOCK_K]."""
    b = packed.to(tl.int32)
    codes = tl.reshape(tl.join(b & 15, b >> 4), (ROWS, BLOCK_K))
    bits = (((codes & 8) << 12) | ((codes & 7) << 9)).to(tl.int16)
    values = bits.to(tl.float16, bitcast=True).to(tl.float32)  # E2M1 value * 2^-14, exact
    s = scale_codes.to(tl.int32)
    if NVFP4:  # E4M3 -> fp16 pattern (value * 2^-8), times 2^8 * 2^14
        sbits = (((s & 0x80) << 8) | ((s & 0x7F) << 7)).to(tl.int16)
        scale = sbits.to(tl.float16, bitcast=True).to(tl.float32) * 4194304.0
    else:  # E8M0 exponent e -> 2^(e-127) * 2^14 as an fp32 bit pattern
        scale = ((s + 14) << 23).to(tl.float32, bitcast=True)
    blocks = tl.reshape(values, (ROWS, BLOCK_K // SCALE_BLOCK, SCALE_BLOCK)) * scale[:, :, None]
    return tl.reshape(blocks, (ROWS, BLOCK_K)).to(tl.bfloat16)


@triton.jit
def _scale_codes(words, k0, BLOCK_K: tl.constexpr, SCALE_BLOCK: tl.constexpr):
    """[ROWS] scale words (all block scales of one 128-wide K chunk, little-endian bytes) -> this K tile's
    [ROWS, BLOCK_K/SCALE_BLOCK] codes. One 4- or 8-byte load per row keeps the scale loads wide enough
    for Triton's asynchronous (cp.async) pipelining; byte loads would stall every K step."""
    j = (k0 % 128) // SCALE_BLOCK + tl.arange(0, BLOCK_K // SCALE_BLOCK)
    return (words[:, None] >> (8 * j).to(words.dtype)[None, :]) & 0xFF


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
def gemm1_act_kernel(
    x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, h_ptr,
    sorted_pair_ptr, block_expert_ptr, padded_total_ptr,
    num_pairs, num_m_blocks, K: tl.constexpr, N: tl.constexpr,
    stride_xm, stride_we, stride_wn, stride_se, stride_sc, stride_be, stride_hm,
    alpha, beta, limit,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SCALE_BLOCK: tl.constexpr, NVFP4: tl.constexpr, ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr, SWAP_AB: tl.constexpr, DOT_FP32: tl.constexpr, EVEN_K: tl.constexpr,
):
    """h[row, n] = act(gate, up) for the N=I outputs; w rows [0, N) are gate, [N, 2N) are up."""
    pid_m, pid_n = _tile_ids(num_m_blocks, N, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(padded_total_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_pair_ptr + offs_m)
    row_ok = pair < num_pairs
    token = (pair // TOP_K).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = offs_n < N
    offs_kb = tl.arange(0, BLOCK_K // 2)
    offs_k = tl.arange(0, BLOCK_K)

    x_ptrs = x_ptr + token[:, None] * stride_xm + offs_k[None, :]
    wg_ptrs = w_ptr + expert * stride_we + offs_n[:, None] * stride_wn + offs_kb[None, :]
    wu_ptrs = wg_ptrs + N * stride_wn
    sg_ptrs = s_ptr + expert * stride_se + offs_n
    su_ptrs = sg_ptrs + N
    if SWAP_AB:
        acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            k_ok = offs_k < BLOCK_K
            kb_ok = offs_kb < BLOCK_K
        else:
            k_ok = offs_k < K - k0
            kb_ok = offs_kb < (K - k0) // 2
        a = tl.load(x_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        wg = tl.load(wg_ptrs, mask=col_ok[:, None] & kb_ok[None, :], other=0)
        wu = tl.load(wu_ptrs, mask=col_ok[:, None] & kb_ok[None, :], other=0)
        sg = _scale_codes(tl.load(sg_ptrs + (k0 // 128) * stride_sc, mask=col_ok, other=0), k0, BLOCK_K,
                          SCALE_BLOCK)
        su = _scale_codes(tl.load(su_ptrs + (k0 // 128) * stride_sc, mask=col_ok, other=0), k0, BLOCK_K,
                          SCALE_BLOCK)
        acc_g = _mma(acc_g, a, _dequant_tile(wg, sg, BLOCK_N, BLOCK_K, SCALE_BLOCK, NVFP4), SWAP_AB, DOT_FP32)
        acc_u = _mma(acc_u, a, _dequant_tile(wu, su, BLOCK_N, BLOCK_K, SCALE_BLOCK, NVFP4), SWAP_AB, DOT_FP32)
        x_ptrs += BLOCK_K
        wg_ptrs += BLOCK_K // 2
        wu_ptrs += BLOCK_K // 2
    if SWAP_AB:
        acc_g = tl.trans(acc_g)
        acc_u = tl.trans(acc_u)
    if NVFP4:
        global_scale = tl.load(gs_ptr + expert)
        acc_g = acc_g / global_scale
        acc_u = acc_u / global_scale
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
    tl.store(h_ptrs, _round_bf16(h, DOT_FP32), mask=col_ok[None, :])


@triton.jit
def gemm2_kernel(
    h_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, route_w_ptr, out_ptr,
    sorted_pair_ptr, block_expert_ptr, padded_total_ptr,
    num_pairs, num_m_blocks, K: tl.constexpr, N: tl.constexpr,
    stride_hm, stride_we, stride_wn, stride_se, stride_sc, stride_be, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SCALE_BLOCK: tl.constexpr, NVFP4: tl.constexpr, HAS_BIAS: tl.constexpr, SWAP_AB: tl.constexpr,
    DOT_FP32: tl.constexpr, EVEN_K: tl.constexpr,
):
    """out[pair, n] = route_weight[pair] * (h[row] @ W2[e]^T + b2[e]) for the N=H outputs, rows in pair order."""
    pid_m, pid_n = _tile_ids(num_m_blocks, N, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(padded_total_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_pair_ptr + offs_m)
    row_ok = pair < num_pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = offs_n < N
    offs_kb = tl.arange(0, BLOCK_K // 2)
    offs_k = tl.arange(0, BLOCK_K)

    a_ptrs = h_ptr + offs_m.to(tl.int64)[:, None] * stride_hm + offs_k[None, :]
    w_ptrs = w_ptr + expert * stride_we + offs_n[:, None] * stride_wn + offs_kb[None, :]
    s_ptrs = s_ptr + expert * stride_se + offs_n
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            k_ok = offs_k < BLOCK_K
            kb_ok = offs_kb < BLOCK_K
        else:
            k_ok = offs_k < K - k0
            kb_ok = offs_kb < (K - k0) // 2
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=col_ok[:, None] & kb_ok[None, :], other=0)
        s = _scale_codes(tl.load(s_ptrs + (k0 // 128) * stride_sc, mask=col_ok, other=0), k0, BLOCK_K, SCALE_BLOCK)
        acc = _mma(acc, a, _dequant_tile(w, s, BLOCK_N, BLOCK_K, SCALE_BLOCK, NVFP4), SWAP_AB, DOT_FP32)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K // 2
    if SWAP_AB:
        acc = tl.trans(acc)
    if NVFP4:
        acc = acc / tl.load(gs_ptr + expert)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + expert * stride_be + offs_n, mask=col_ok, other=0.0)[None, :]
    route_w = tl.load(route_w_ptr + pair, mask=row_ok, other=0.0)
    acc = acc * route_w[:, None]
    out_ptrs = out_ptr + pair.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def topk_sum_kernel(pair_out_ptr, out_ptr, N: tl.constexpr, stride_pm, stride_om,
                    TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRETED: tl.constexpr):
    """y[t] = sum_j pair_out[t*k + j] in fixed order j = 0..k-1 (deterministic), rounded to bf16."""
    token = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = offs_n < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(pair_out_ptr + (token * TOP_K + j) * stride_pm + offs_n, mask=ok, other=0.0)
    tl.store(out_ptr + token * stride_om + offs_n, _round_bf16(acc, INTERPRETED), mask=ok)


#: True when Triton's CPU interpreter runs these kernels (TRITON_INTERPRET=1 at triton's first import).
INTERPRETED = not isinstance(topk_sum_kernel, triton.runtime.jit.JITFunction)


@triton.jit
def align_small_kernel(ids_ptr, sorted_pairs_ptr, block_expert_ptr, padded_total_ptr, scratch_ptr, num_pairs,
                       num_blocks: tl.constexpr, E: tl.constexpr, E_BLOCK: tl.constexpr, P_BLOCK: tl.constexpr,
                       BLOCK_M: tl.constexpr, ROWS_CHUNK: tl.constexpr, BLOCKS_CHUNK: tl.constexpr):
    """_routing.align in one program (decode sizes: num_pairs <= P_BLOCK): one launch instead of ~20.

    Sorts keys expert * P_BLOCK + pair (unique, so the order inside an expert is the pair order),
    histograms the experts, and scatters each pair to padded_start[e] + its rank inside e.
    """
    offs = tl.arange(0, P_BLOCK)
    expert = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=E).to(tl.int32)
    bins = tl.arange(0, E_BLOCK)
    counts = tl.where(bins < E, tl.histogram(expert, E_BLOCK), 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, 0)
    delta = padded_end - padded - (tl.cumsum(counts, 0) - counts)  # padded start - unpadded start
    tl.store(scratch_ptr + bins, delta)
    tl.store(scratch_ptr + E_BLOCK + bins, padded_end)
    total = tl.sum(padded, 0)
    tl.store(padded_total_ptr, total)
    for r0 in range(0, num_blocks * BLOCK_M, ROWS_CHUNK):  # sentinel everywhere first
        rows = r0 + tl.arange(0, ROWS_CHUNK)
        tl.store(sorted_pairs_ptr + rows, num_pairs, mask=rows < num_blocks * BLOCK_M)
    tl.debug_barrier()
    key = tl.sort(expert * P_BLOCK + offs)
    sorted_expert = key // P_BLOCK
    real = sorted_expert < E
    dest = offs + tl.load(scratch_ptr + sorted_expert, mask=real, other=0)
    tl.store(sorted_pairs_ptr + dest, key % P_BLOCK, mask=real)
    for b0 in range(0, num_blocks, BLOCKS_CHUNK):  # expert of block b = #experts whose padded end <= b*BM
        blocks = b0 + tl.arange(0, BLOCKS_CHUNK)
        ends = tl.load(scratch_ptr + E_BLOCK + bins, mask=bins < E, other=2147483647)
        owner = tl.sum((ends[None, :] <= blocks[:, None] * BLOCK_M).to(tl.int32), 1)
        tl.store(block_expert_ptr + blocks, tl.minimum(owner, E - 1), mask=blocks < num_blocks)
