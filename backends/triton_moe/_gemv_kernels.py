"""Decode kernels: one (token, expert) pair's rows per warp, FP4 decoded straight into tensor-core registers.

At one or two tokens each expert multiplies a single activation row, so the layer is a weight stream: the tile
kernels (_kernels.py) reach under half the memory bandwidth there, because Triton moves each dequantized tile
through shared memory into its MMA operand layout (STS, barrier, LDS and register moves: ~37 instructions per
4-byte weight word) and their shared memory caps residency at two warps per scheduler. Here every thread owns
fixed data, so the decoded registers are the MMA's operands as they are:

    lane (g, t) of a warp (g = lane // 4, t = lane % 4) loads 16 bytes of weight row A_g and 16 of row B_g
    (GEMV1: the gate and the up row of output column g; GEMV2: output rows g and g + 8) for each 128-wide K
    step: the step's 16-byte run t (layout backends.layouts.triton_moe: run t holds K values 64(t//2) + 16(t%2)
    + 0..15 in its low nibbles, + 32 in its high ones, word j of the run K 2j, 2j+1, 2j+8, 2j+9).
    One inline-PTX routine per two words (j, j + 1) of both rows decodes them (the tile kernels' E2M1 -> bf16 bit
    trick with the block scale) and runs four m16n8k16 MMAs, A = rows (A_g, B_g), B = the activation pairs of run
    t, which every lane of the same t loads alike, so all 8 MMA columns hold the same sums and every lane ends with
    its two rows' totals (c0 = A_g, c2 = B_g). Pairing words j and j + 1 makes each MMA's B operand two adjacent
    words of one 16-byte activation load (K 2j.. and 2j + 2..), used where they were loaded: pairing each word's own
    K 2j.. and 2j + 8.. took a register move for every activation word.

About 20 instructions per weight word (sm_90 SASS), no shared memory in the K loop, one LDG.128 per 16 weight
bytes. A program's warps are (row group, [k slot,] K slice); the K slices and (GEMV2) the k slots are summed across
warps once, at the end, in a fixed order (no atomics: the same bits every run). The CPU interpreter computes the same
products in fp32 (exact) and sums them per lane, then over the four lanes of a row (_lanes_total), in place of
the MMA's sums.

    gemv1_act_kernel   h[p] = act(x[t] W13[e]^T + b13[e]) for pair p = (t, j), routing in-program if asked
    gemv2_sum_kernel   y[t] = sum_j w[t,j] (h[t*k+j] W2[e_j]^T + b2[e_j]), the k slots summed in-program
"""

from __future__ import annotations

import triton
import triton.language as tl

from backends.layouts import triton_moe as _layout
from backends.triton_moe._kernels import (
    _act_operands,
    _act_store,
    _dequant_words,
    _e2m1_decode_ptx,
    _round_bf16,
    _scale_pair,
    _static_act_scales,
)
from backends.triton_moe._routing_kernels import _route_weights, _topk_picks

_TILE_ROWS: tl.constexpr = tl.constexpr(_layout.TILE_ROWS)
_TILE_BYTES: tl.constexpr = tl.constexpr(_layout.TILE_BYTES)


def _quad_mma_ptx(folded: bool) -> str:
    """Decode words j and j + 1 of row A ($4, $6) and of row B ($5, $7) with their (low, high) scales $8, $9 / $10,
    $11, then acc += four m16n8k16 bf16 MMAs, one per decoded part (a, b: low nibbles; c, d: high ones) of both
    words, each with the activation words of that part for j and j + 1 as B: ($12, $13) low K 2j.., ($14, $15) low
    K 2j+8.., ($16, $17) high, ($18, $19) high + 8; acc in $20..$23, out $0..$3 (A fragment order: row A word j,
    row B word j, row A word j + 1, row B word j + 1)."""
    parts = [f"{row}{part}{i}" for i in (0, 1) for row in "gu" for part in "abcd"]
    regs = ".reg .b32 " + ", ".join(parts) + ", t, u, nz, sgl, sgh, sul, suh" + ("" if folded else ", k126")
    text = (f"{{\n{regs};\nmov.b32 nz, 0x80008000;\n" + ("" if folded else "mov.b32 k126, 0x7E807E80;\n")
            + "mov.b32 sgl, {$8, $8}; mov.b32 sgh, {$9, $9}; mov.b32 sul, {$10, $10}; mov.b32 suh, {$11, $11};\n")
    for word, row, i, scale_lo, scale_hi in (("$4", "g", 0, "sgl", "sgh"), ("$5", "u", 0, "sul", "suh"),
                                             ("$6", "g", 1, "sgl", "sgh"), ("$7", "u", 1, "sul", "suh")):
        text += _e2m1_decode_ptx(word, tuple(f"{row}{part}{i}" for part in "abcd"), scale_lo, scale_hi, folded)
    mma = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
    acc = "{$20, $21, $22, $23}"
    for part, b in zip("abcd", ("$12, $13", "$14, $15", "$16, $17", "$18, $19"), strict=True):
        text += f"{mma} {{$0, $1, $2, $3}}, {{g{part}0, u{part}0, g{part}1, u{part}1}}, {{{b}}}, {acc};\n"
        acc = "{$0, $1, $2, $3}"
    return text + "}"


_QUAD_MMA_FOLDED: tl.constexpr = tl.constexpr(_quad_mma_ptx(True))
_QUAD_MMA_UNFOLDED: tl.constexpr = tl.constexpr(_quad_mma_ptx(False))


@triton.jit
def _bf16_lo(w):
    """The bf16 in bits 0-15 of an int32 word, as fp32 (exact)."""
    return (w << 16).to(tl.float32, bitcast=True)


@triton.jit
def _bf16_hi(w):
    return (w & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _dot8(word, s_lo, s_hi, xa, xb, xc, xd, FOLDED: tl.constexpr):
    """The interpreter's share of one lane in the MMAs: its word's 8 decoded weights times their activations,
    each product exact in fp32, summed."""
    e0, e1, e2, e3, e4, e5, e6, e7 = _dequant_words(word, s_lo, s_hi, FOLDED, False)
    return (e0.to(tl.float32) * _bf16_lo(xa) + e1.to(tl.float32) * _bf16_hi(xa)
            + e2.to(tl.float32) * _bf16_lo(xb) + e3.to(tl.float32) * _bf16_hi(xb)
            + e4.to(tl.float32) * _bf16_lo(xc) + e5.to(tl.float32) * _bf16_hi(xc)
            + e6.to(tl.float32) * _bf16_lo(xd) + e7.to(tl.float32) * _bf16_hi(xd))


@triton.jit
def _quad_mma(acc_a, acc_a1, acc_b, acc_b1, wa0, wb0, wa1, wb1, sal, sah, sbl, sbh, xa0, xa1, xb0, xb1, xc0, xc1,
              xd0, xd1, FOLDED: tl.constexpr, USE_ASM: tl.constexpr):
    """(acc_a, acc_b) += rows A and B of words j and j + 1 (wa0, wb0 / wa1, wb1) times their activations (xa0 and
    xa1 the x_lo words j and j + 1, ...): on the GPU the MMAs over the row's 4 lanes (every lane gets the sum), in
    the interpreter this lane's own products, word j first (summed over lanes by _lanes_total)."""
    if USE_ASM:
        if FOLDED:
            asm: tl.constexpr = _QUAD_MMA_FOLDED
        else:
            asm: tl.constexpr = _QUAD_MMA_UNFOLDED
        c0, c1, c2, c3 = tl.inline_asm_elementwise(
            asm, "=f,=f,=f,=f,r,r,r,r,h,h,h,h,r,r,r,r,r,r,r,r,f,f,f,f",
            [wa0, wb0, wa1, wb1, sal, sah, sbl, sbh, xa0, xa1, xb0, xb1, xc0, xc1, xd0, xd1, acc_a, acc_a1, acc_b,
             acc_b1], dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
    else:
        c0 = acc_a + _dot8(wa0, sal, sah, xa0, xb0, xc0, xd0, FOLDED)
        c0 = c0 + _dot8(wa1, sal, sah, xa1, xb1, xc1, xd1, FOLDED)
        c2 = acc_b + _dot8(wb0, sbl, sbh, xa0, xb0, xc0, xd0, FOLDED)
        c2 = c2 + _dot8(wb1, sbl, sbh, xa1, xb1, xc1, xd1, FOLDED)
        c1 = c0
        c3 = c2
    return c0, c1, c2, c3


@triton.jit
def _split4(v):
    """[N, 4] -> its four columns as [N] tensors (in-thread: a lane's 16-byte load)."""
    N: tl.constexpr = v.shape[0]
    even, odd = tl.split(tl.reshape(v, (N, 2, 2)))
    v0, v2 = tl.split(even)
    v1, v3 = tl.split(odd)
    return v0, v1, v2, v3


@triton.jit
def _step_loads(wa_row, sa_row, wb_row, sb_row, a_row, k0, k_stop, t, stride_sc, K: tl.constexpr,
                SCALE_BLOCK: tl.constexpr):
    """A lane's loads of the K step at k0: rows A and B's run t ([THREADS, 4] int32 words each, by the layout's
    tiles: TILE_ROWS x TILE_BYTES, a row group's tiles in K order; *_row point at the row's first tile and its
    chunk-0 scale word), their scale words, and the activation pairs of the run: low nibbles' K 0..15 (pairs 0-3,
    4-7), high nibbles' K 32..47, each pair (2i, 2i+1) one int32 word. Past K, and from k_stop on (the next K
    slice's steps), the weight words are zeros and not read; the scales and activations are read at the last run
    within K instead, finite values that the zero weights cancel exactly. Only the weights masked: masking all
    26 registers cost 13 register-zeroing instructions a step (1.5 a weight word)."""
    ok = (k0 + 64 * (t // 2) < K) & (k0 < k_stop)
    run = (k0 // 64 + t // 2) * (_TILE_ROWS * _TILE_BYTES) + (t % 2) * 16
    words = tl.arange(0, 4)[None, :]
    wa = tl.load((wa_row + run).to(tl.pointer_type(tl.int32))[:, None] + words, mask=ok[:, None], other=0)
    wb = tl.load((wb_row + run).to(tl.pointer_type(tl.int32))[:, None] + words, mask=ok[:, None], other=0)
    k_run = tl.minimum(k0 + 64 * (t // 2) + 16 * (t % 2), K - 48)  # K % 64 == 0: the run's last pair is K - 1
    chunk = k_run // SCALE_BLOCK // 4
    sa = tl.load(sa_row + chunk * stride_sc)
    sb = tl.load(sb_row + chunk * stride_sc)
    first = (a_row + k_run).to(tl.pointer_type(tl.int32))[:, None] + words
    x_lo = tl.load(first)
    x_lo8 = tl.load(first + 4)
    x_hi = tl.load(first + 16)
    x_hi8 = tl.load(first + 20)
    return wa, wb, sa, sb, x_lo, x_lo8, x_hi, x_hi8


@triton.jit
def _step_mma(acc_a, acc_a1, acc_b, acc_b1, k0, t, wa, wb, sa, sb, x_lo, x_lo8, x_hi, x_hi8, SCALE_BLOCK: tl.constexpr,
              NVFP4: tl.constexpr, FOLDED: tl.constexpr, USE_ASM: tl.constexpr):
    """acc_a / acc_b += one K step of rows A / B (the loads of _step_loads) times the activations."""
    block_lo = (k0 + 64 * (t // 2) + 16 * (t % 2)) // SCALE_BLOCK  # the run's low values' scale block
    sal, sah = _scale_pair(sa >> (8 * (block_lo % 4)), NVFP4, FOLDED, USE_ASM)
    sbl, sbh = _scale_pair(sb >> (8 * (block_lo % 4)), NVFP4, FOLDED, USE_ASM)
    wa0, wa1, wa2, wa3 = _split4(wa)
    wb0, wb1, wb2, wb3 = _split4(wb)
    xa0, xa1, xa2, xa3 = _split4(x_lo)
    xb0, xb1, xb2, xb3 = _split4(x_lo8)
    xc0, xc1, xc2, xc3 = _split4(x_hi)
    xd0, xd1, xd2, xd3 = _split4(x_hi8)
    acc_a, acc_a1, acc_b, acc_b1 = _quad_mma(acc_a, acc_a1, acc_b, acc_b1, wa0, wb0, wa1, wb1, sal, sah, sbl, sbh,
                                             xa0, xa1, xb0, xb1, xc0, xc1, xd0, xd1, FOLDED, USE_ASM)
    acc_a, acc_a1, acc_b, acc_b1 = _quad_mma(acc_a, acc_a1, acc_b, acc_b1, wa2, wb2, wa3, wb3, sal, sah, sbl, sbh,
                                             xa2, xa3, xb2, xb3, xc2, xc3, xd2, xd3, FOLDED, USE_ASM)
    return acc_a, acc_a1, acc_b, acc_b1


@triton.jit
def _k_slice(acc_a, acc_b, wa_row, sa_row, wb_row, sb_row, a_row, k_first, t, STEPS: tl.constexpr,
             K: tl.constexpr, stride_sc, SCALE_BLOCK: tl.constexpr, NVFP4: tl.constexpr, FOLDED: tl.constexpr,
             USE_ASM: tl.constexpr, LOADS_AHEAD: tl.constexpr):
    """acc_a / acc_b += rows A / B times the activation row over STEPS K steps from k_first (lanes' own K).

    LOADS_AHEAD: every load of the next step (weights, scales, activations) is issued before this step's decode and
    MMAs, in 26 more registers (tuning.DECODE_AHEAD_MAXNREG). Measured on an H100 that pays only where the grid still
    fits one wave at that register count (tuning.decode_kernels decides): 1-4.5% faster there at T = 1-2, 3-14%
    slower where it does not. Loading only the weights and scales ahead is slower: each step then waits on its
    activations (ncu stall samples); so is a prefetch of the activations into L1. Without LOADS_AHEAD, one step of
    loads is in flight per warp. The loop takes two steps an iteration, each step's loads landing in the registers
    the step before last has finished with: one step a loop iteration took a move for each of the 26 (3 a weight
    word); with the MMAs' adjacent operands (_quad_mma) and only the weights masked (_step_loads), gpt-oss-120b's
    GEMV1 issues 20 instructions a weight word instead of 24 (benchmarks/count_decode_sass.py).
    Other ways to keep more in flight were slower (docs/kernels.md lists the records): Triton's cp.async
    pipelining (5-7x), L2 prefetches 1-4 steps ahead (0-10%), bulk L2 prefetches of the program's rows (10-25%), two
    row pairs per lane (3-14%); as were one launch for both GEMVs (1-23%) and GEMV2 launched early (PDL) with its
    weights loaded before it waits for h (up to 35%). The decode and MMAs cost issue time: without them gpt-oss-120b's
    layer took 27.6 µs instead of 32.1 (benchmarks/probe_decode_bisect.py)."""
    k_stop = k_first + STEPS * 128
    acc_a1 = acc_a  # the MMAs' c1 / c3 (the same sums as c0 / c2), carried so that each MMA reads its own output
    acc_b1 = acc_b
    if LOADS_AHEAD:
        wa, wb, sa, sb, x_lo, x_lo8, x_hi, x_hi8 = _step_loads(wa_row, sa_row, wb_row, sb_row, a_row, k_first, k_stop,
                                                               t, stride_sc, K, SCALE_BLOCK)
        for step in range(0, STEPS - 1, 2):
            k0 = k_first + step * 128
            # each step's loads (past the slice: no weights) before the step before it is worked on
            n_wa, n_wb, n_sa, n_sb, n_lo, n_lo8, n_hi, n_hi8 = _step_loads(wa_row, sa_row, wb_row, sb_row, a_row,
                                                                           k0 + 128, k_stop, t, stride_sc, K,
                                                                           SCALE_BLOCK)
            acc_a, acc_a1, acc_b, acc_b1 = _step_mma(acc_a, acc_a1, acc_b, acc_b1, k0, t, wa, wb, sa, sb, x_lo, x_lo8,
                                                     x_hi, x_hi8, SCALE_BLOCK, NVFP4, FOLDED, USE_ASM)
            wa, wb, sa, sb, x_lo, x_lo8, x_hi, x_hi8 = _step_loads(wa_row, sa_row, wb_row, sb_row, a_row, k0 + 256,
                                                                   k_stop, t, stride_sc, K, SCALE_BLOCK)
            acc_a, acc_a1, acc_b, acc_b1 = _step_mma(acc_a, acc_a1, acc_b, acc_b1, k0 + 128, t, n_wa, n_wb, n_sa,
                                                     n_sb, n_lo, n_lo8, n_hi, n_hi8, SCALE_BLOCK, NVFP4, FOLDED,
                                                     USE_ASM)
        if STEPS % 2 == 1:  # the last step, loaded by the loop's last iteration (or before it)
            acc_a, acc_a1, acc_b, acc_b1 = _step_mma(acc_a, acc_a1, acc_b, acc_b1, k_first + (STEPS - 1) * 128, t, wa,
                                                     wb, sa, sb, x_lo, x_lo8, x_hi, x_hi8, SCALE_BLOCK, NVFP4, FOLDED,
                                                     USE_ASM)
    else:
        for step in range(STEPS):
            k0 = k_first + step * 128
            wa, wb, sa, sb, x_lo, x_lo8, x_hi, x_hi8 = _step_loads(wa_row, sa_row, wb_row, sb_row, a_row, k0, k_stop,
                                                                   t, stride_sc, K, SCALE_BLOCK)
            acc_a, acc_a1, acc_b, acc_b1 = _step_mma(acc_a, acc_a1, acc_b, acc_b1, k0, t, wa, wb, sa, sb, x_lo, x_lo8,
                                                     x_hi, x_hi8, SCALE_BLOCK, NVFP4, FOLDED, USE_ASM)
    return acc_a, acc_b


@triton.jit
def _lanes_total(acc, THREADS: tl.constexpr, USE_ASM: tl.constexpr):
    """Every lane's row total: the MMA already summed the 4 lanes of a row; the interpreter's per-lane sums are
    added here."""
    if not USE_ASM:
        per_row = tl.sum(tl.reshape(acc, (THREADS // 4, 4)), axis=1)
        acc = tl.reshape(tl.broadcast_to(per_row[:, None], (THREADS // 4, 4)), (THREADS,))
    return acc


@triton.jit
def _add_pairs(a0, b0, a1, b1):
    """tl.reduce's combine of two sums at once: one pass over the program's warps (one barrier) where two tl.sum
    calls take two; each sum adds in the order tl.sum would."""
    return a0 + a1, b0 + b1


@triton.jit
def _weighted_slot_sums(a, b, route_w, slot_ok):
    """GEMV2's [groups, slots, 32] a and b times the router weights, summed over the top-k slots in one pass (slots
    past TOP_K add 0) -> [groups, 32] each."""
    return tl.reduce((tl.where(slot_ok, a * route_w, 0.0), tl.where(slot_ok, b * route_w, 0.0)), 1, _add_pairs)


@triton.jit
def _row_pointer(w_expert, n, stride_wn):
    """Byte pointer to row n's first tile (stride_wn = K/2 bytes per row)."""
    n = n.to(tl.int64)
    return w_expert + (n // _TILE_ROWS) * (_TILE_ROWS * stride_wn) + (n % _TILE_ROWS) * _TILE_BYTES


@triton.jit
def gemv1_act_kernel(
    x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, h_ptr, logits_ptr, ids_ptr, route_w_ptr,
    K: tl.constexpr, N: tl.constexpr, stride_xm, stride_we, stride_wn: tl.constexpr, stride_se, stride_sc, stride_be,
    stride_hm,
    stride_lt, alpha, beta, limit, qscale_ptr, ticket_ptr, tickets,
    TOP_K: tl.constexpr, ROUTE: tl.constexpr, E: tl.constexpr, E_BLOCK: tl.constexpr, K_BLOCK: tl.constexpr,
    RENORMALIZE: tl.constexpr, ROW_GROUPS: tl.constexpr, K_SLICES: tl.constexpr,
    SCALE_BLOCK: tl.constexpr,
    NVFP4: tl.constexpr, FOLDED: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
    LOADS_AHEAD: tl.constexpr, USE_ASM: tl.constexpr, INTERPRETED: tl.constexpr, ACT_QUANT: tl.constexpr,
    PDL: tl.constexpr, PDL_WAIT: tl.constexpr,
):
    """h[p, n] = act(x[t] W13[e]^T + b13[e]) for pair p = program_id(0) = t * TOP_K + j, columns n of program_id(1)
    (8 per row group). ROUTE: the token's top-k of its router logits, picked by each of its programs as
    topk_route_kernel picks them; the (j = 0, first columns) program alone weighs them as topk_route_kernel does and
    stores ids and weights for GEMV2; else ids_ptr holds the pairs' experts (any integer dtype). ACT_QUANT 3 (W4A8
    static FP8, x the E4M3 values of x / a1): _act_store's mode 3 with qscale_ptr's [a1, 1/a1, a2, 1/a2]; ACT_QUANT 4
    (W4A8 MXFP8, x its MXFP8 values): h stored as its MXFP8 values, a block of 32 columns per 4 row groups
    (ROW_GROUPS 4 or 8). One program zeroes GEMV2's `tickets` int32 at ticket_ptr (a split GEMV2's; 0: none).
    PDL (sm_90): GEMV2, launched as this kernel's programmatic dependent, may start at once (see gemv2_sum_kernel).
    PDL_WAIT (W4A8, launched as the programmatic dependent of x's quantization): the routing and the epilogue's
    operands come first, then griddepcontrol.wait for x and its scales, so the quantization launch overlaps them."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    pair = tl.program_id(0)
    token = pair // TOP_K
    if ROUTE:
        logits, ids, top, expert = _topk_picks(logits_ptr + token.to(tl.int64) * stride_lt, E, E_BLOCK, TOP_K,
                                               K_BLOCK, pair % TOP_K)
        expert = expert.to(tl.int64)
        if (pair % TOP_K == 0) & (tl.program_id(1) == 0):
            slot = tl.arange(0, K_BLOCK)
            tl.store(ids_ptr + token * TOP_K + slot, ids, mask=slot < TOP_K)
            tl.store(route_w_ptr + token * TOP_K + slot, _route_weights(logits, top, RENORMALIZE), mask=slot < TOP_K)
    else:
        expert = tl.load(ids_ptr + pair).to(tl.int64)
    THREADS: tl.constexpr = 32 * ROW_GROUPS * K_SLICES
    i = tl.arange(0, THREADS)
    lane = i % 32
    warp = i // 32
    g = lane // 4
    t = lane % 4
    group = warp // K_SLICES
    col = tl.program_id(1) * (8 * ROW_GROUPS) + group * 8 + g  # < N: N is a multiple of 64 >= 8 * ROW_GROUPS
    STEPS: tl.constexpr = ((K + 127) // 128 + K_SLICES - 1) // K_SLICES
    k_first = (warp % K_SLICES) * (STEPS * 128)
    w_expert = w_ptr + expert * stride_we
    s_expert = s_ptr + expert * stride_se
    j = tl.arange(0, 32 * ROW_GROUPS)
    offs_n = tl.program_id(1) * (8 * ROW_GROUPS) + (j // 32) * 8 + (j % 32) // 4
    # The epilogue's bias and global scale are loaded before the K loop: after it they cost a memory latency at
    # the end of every program (gpt-oss-120b at T = 1: 0.8 µs of 33 on an H100).
    loaded = _act_operands(expert, offs_n, offs_n < N, gs_ptr, bias_ptr, N, stride_be, NVFP4, HAS_BIAS)
    if PDL_WAIT:
        tl.extra.cuda.gdc_wait()
    act_scales = _static_act_scales(qscale_ptr, ACT_QUANT)  # before the K loop too
    acc_g = tl.zeros((THREADS,), tl.float32)
    acc_u = tl.zeros((THREADS,), tl.float32)
    # The up rows sit N rows (whole tiles: N % 64 == 0) after the gate rows. As a compile-time offset from the gate
    # row's pointer their loads need no pointer registers or address arithmetic of their own: up to 2.4% faster at
    # T = 1-2 on an H100 than a second pointer (benchmarks/results/decode-rows-b-offset-h100-2026-11-27/).
    gate_row = _row_pointer(w_expert, col, stride_wn)
    acc_g, acc_u = _k_slice(acc_g, acc_u, gate_row, s_expert + col, gate_row + N * stride_wn, s_expert + col + N,
                            x_ptr + token.to(tl.int64) * stride_xm, k_first, t, STEPS, K, stride_sc, SCALE_BLOCK,
                            NVFP4, FOLDED, USE_ASM, LOADS_AHEAD)
    acc_g, acc_u = tl.reduce((tl.reshape(_lanes_total(acc_g, THREADS, USE_ASM), (ROW_GROUPS, K_SLICES, 32)),
                              tl.reshape(_lanes_total(acc_u, THREADS, USE_ASM), (ROW_GROUPS, K_SLICES, 32))), 1,
                             _add_pairs)
    first_lane = (j % 4) == 0
    _act_store(tl.reshape(acc_g, (1, 32 * ROW_GROUPS)), tl.reshape(acc_u, (1, 32 * ROW_GROUPS)), expert,
               pair + tl.arange(0, 1), offs_n, offs_n < N, first_lane[None, :], gs_ptr, bias_ptr, h_ptr, N,
               stride_be, stride_hm, alpha, beta, limit, NVFP4, ACTIVATION, HAS_BIAS, INTERPRETED, ACT_QUANT=ACT_QUANT,
               loaded=loaded, act_scales=act_scales, MX_ENTRIES=4 * 32)  # a row's 4 lanes: 4 entries per column
    if (pair == 0) & (tl.program_id(1) == 0):  # GEMV2's `tickets` split tickets (gemv2_sum_kernel), zero before it
        for first in range(0, tickets, THREADS):
            tl.store(ticket_ptr + first + i, 0, mask=first + i < tickets)


@triton.jit
def gemv2_sum_kernel(
    h_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, ids_ptr, route_w_ptr, y_ptr,
    K: tl.constexpr, N: tl.constexpr, stride_hm, stride_we, stride_wn: tl.constexpr, stride_se, stride_sc, stride_be,
    stride_ym, qscale_ptr, part_ptr, ticket_ptr,
    TOP_K: tl.constexpr, SLOTS: tl.constexpr, ROW_GROUPS: tl.constexpr, K_SLICES: tl.constexpr,
    SPLITS: tl.constexpr, SCALE_BLOCK: tl.constexpr, NVFP4: tl.constexpr, FOLDED: tl.constexpr,
    HAS_BIAS: tl.constexpr, LOADS_AHEAD: tl.constexpr, USE_ASM: tl.constexpr, INTERPRETED: tl.constexpr,
    ACT_QUANT: tl.constexpr, PDL: tl.constexpr,
):
    """y[t, n] = sum_j route_w[t, j] * (h[t * TOP_K + j] W2[e_j]^T + b2[e_j])[n], bf16, for token program_id(0) and
    16 columns per row group of program_id(1). The warps are (row group, slot j < SLOTS = TOP_K rounded up to a
    power of two, K slice); slots past TOP_K load nothing and add 0. ACT_QUANT 3 (W4A8 static FP8, h the E4M3
    values of h / a2): the sums times a2 (qscale_ptr[2]) before the bias.

    SPLITS > 1: program_id(2) of SPLITS programs per (token, row block) takes its share of the K slices and stores
    sum_j route_w[t, j] * its sums in part_ptr (fp32 [SPLITS, T, N]); the one that draws the last of the block's
    tickets (int32 [T, N / (16 ROW_GROUPS)], zero at launch: GEMV1 zeroes them) adds the SPLITS partial sums in
    split order, then sum_j route_w[t, j] * b2[e_j], and stores y: the same bits whichever program finishes last. It
    doubles the programs of a grid too small for the GPU: gpt-oss-120b's 180 at T = 1 on 132 SMs, 2 an SM on some
    and 1 on the others (tuning.decode_kernels decides).

    PDL (sm_90, launched with launch_pdl): the programs take the SMs that GEMV1's leave as soon as GEMV1 lets them
    and wait for GEMV1's completion and memory (griddepcontrol.wait) before any read, so the launch gap between the
    kernels is hidden: 0-2.4% faster on the matrix layers of an H100, the same bits
    (benchmarks/results/decode-quad-mma-h100-2026-11-27/)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    token = tl.program_id(0).to(tl.int64)
    THREADS: tl.constexpr = 32 * ROW_GROUPS * SLOTS * K_SLICES
    i = tl.arange(0, THREADS)
    lane = i % 32
    warp = i // 32
    g = lane // 4
    t = lane % 4
    slot = (warp // K_SLICES) % SLOTS
    group = warp // (K_SLICES * SLOTS)
    live = slot < TOP_K
    expert = tl.load(ids_ptr + token * TOP_K + slot, mask=live, other=0).to(tl.int64)
    row = tl.program_id(1) * (16 * ROW_GROUPS) + group * 16 + g
    STEPS: tl.constexpr = ((K + 127) // 128 + K_SLICES * SPLITS - 1) // (K_SLICES * SPLITS)
    k_slice = warp % K_SLICES
    if SPLITS > 1:  # (unsplit, the K range is known at compile time: a slice within K loads unmasked)
        k_slice += tl.program_id(2) * K_SLICES
    k_first = tl.where(live, k_slice * (STEPS * 128), K)  # dead slots start past K: no weights loaded
    w_expert = w_ptr + expert * stride_we
    s_expert = s_ptr + expert * stride_se
    # The epilogue's operands (router weights, global scales, biases, static FP8's a2) before the K loop, as in GEMV1.
    j = tl.arange(0, SLOTS)[None, :, None]
    n = tl.program_id(1) * (16 * ROW_GROUPS) + tl.arange(0, ROW_GROUPS)[:, None] * 16 + tl.arange(0, 32)[None, :] // 4
    slot_ok = j < TOP_K
    e = tl.load(ids_ptr + token * TOP_K + j, mask=slot_ok, other=0).to(tl.int64)
    route_w = tl.load(route_w_ptr + token * TOP_K + j, mask=slot_ok, other=0.0)
    if NVFP4:
        gs = tl.load(gs_ptr + e, mask=slot_ok, other=1.0)
    if HAS_BIAS:
        bias_a = tl.load(bias_ptr + e * stride_be + n[:, None, :], mask=slot_ok, other=0.0)
        bias_b = tl.load(bias_ptr + e * stride_be + n[:, None, :] + 8, mask=slot_ok, other=0.0)
    if ACT_QUANT == 3:
        a2 = tl.load(qscale_ptr + 2)
    acc_a = tl.zeros((THREADS,), tl.float32)
    acc_b = tl.zeros((THREADS,), tl.float32)
    row_a = _row_pointer(w_expert, row, stride_wn)  # row + 8 shares row's tile (g < 8): a fixed offset, as in GEMV1
    h_row = h_ptr + (token * TOP_K + tl.where(live, slot, 0)) * stride_hm  # a dead slot reads slot 0's (no weights)
    acc_a, acc_b = _k_slice(acc_a, acc_b, row_a, s_expert + row, row_a + 8 * _TILE_BYTES, s_expert + row + 8, h_row,
                            k_first, t, STEPS, K, stride_sc, SCALE_BLOCK, NVFP4, FOLDED, USE_ASM, LOADS_AHEAD)
    SHAPE: tl.constexpr = (ROW_GROUPS, SLOTS, K_SLICES, 32)
    acc_a, acc_b = tl.reduce((tl.reshape(_lanes_total(acc_a, THREADS, USE_ASM), SHAPE),  # -> [groups, slots, 32]
                              tl.reshape(_lanes_total(acc_b, THREADS, USE_ASM), SHAPE)), 2, _add_pairs)
    if NVFP4:  # undo the dequantization's 2^-16 (exact), then the expert's global scale
        acc_a = acc_a * 65536.0 / gs
        acc_b = acc_b * 65536.0 / gs
    if ACT_QUANT == 3:
        acc_a = acc_a * a2
        acc_b = acc_b * a2
    store = (tl.arange(0, 32)[None, :] % 4) == 0
    y_row = y_ptr + token * stride_ym
    if SPLITS == 1:
        if HAS_BIAS:
            acc_a += bias_a
            acc_b += bias_b
        y_a, y_b = _weighted_slot_sums(acc_a, acc_b, route_w, slot_ok)
        tl.store(y_row + n, _round_bf16(y_a, INTERPRETED), mask=store)
        tl.store(y_row + n + 8, _round_bf16(y_b, INTERPRETED), mask=store)
    else:
        part_a, part_b = _weighted_slot_sums(acc_a, acc_b, route_w, slot_ok)
        tokens = tl.num_programs(0)
        part_row = part_ptr + token * N + n
        tl.store(part_row + tl.program_id(2) * tokens * N, part_a, mask=store)
        tl.store(part_row + tl.program_id(2) * tokens * N + 8, part_b, mask=store)
        # every thread's sums are stored (CTA barrier) before the block's ticket is drawn (release at GPU scope); the
        # program that draws SPLITS - 1 comes after the others' releases (acquire) and reads their sums past L1
        tl.debug_barrier()
        drawn = tl.atomic_add(ticket_ptr + token * tl.num_programs(1) + tl.program_id(1), 1, sem="acq_rel",
                              scope="gpu")
        if drawn == SPLITS - 1:
            y_a = tl.zeros((ROW_GROUPS, 32), tl.float32)
            y_b = tl.zeros((ROW_GROUPS, 32), tl.float32)
            for split in tl.static_range(SPLITS):
                y_a += tl.load(part_row + split * tokens * N, mask=store, other=0.0, cache_modifier=".cg")
                y_b += tl.load(part_row + split * tokens * N + 8, mask=store, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                bias_wa, bias_wb = _weighted_slot_sums(bias_a, bias_b, route_w, slot_ok)
                y_a += bias_wa
                y_b += bias_wb
            tl.store(y_row + n, _round_bf16(y_a, INTERPRETED), mask=store)
            tl.store(y_row + n + 8, _round_bf16(y_b, INTERPRETED), mask=store)
