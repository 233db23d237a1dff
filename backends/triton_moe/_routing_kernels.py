"""Triton kernels of the routing step: top-k of the router logits, and the one-launch alignment.

Both are fixed-shape launches (no host sync, CUDA-graph safe). topk_route_kernel replaces torch's
top-k + softmax (three kernels at decode sizes: a gather, a bitonic sort and a softmax) by one program
per token; align_small_kernel sorts the (token, slot) pairs by expert in one program (at decode sizes
routing them first, in the same launch); align_count_kernel + align_scatter_kernel are the two-launch
multi-program alignment for more pairs. All sums are exact integer counts: the results never depend on timing.
The alignment launch also zeroes the split-K GEMM1's tile tickets of the same call (zero_tickets): it runs
before GEMM1 in the same stream on every call, captured or not, so no ticket outlives an aborted call.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _topk_keys(logits, e, E_BLOCK: tl.constexpr):
    """A key per expert that orders as top-k picks (larger logit first, then the lower index; -0.0 equals +0.0) and
    is unique, so that a pick is removed by equality. Masking the picked logit to -inf instead lets an expert whose
    logit is -inf tie with the picked ones, and one of those was picked twice."""
    bits = (logits + 0.0).to(tl.int32, bitcast=True)  # + 0.0: -0.0 -> +0.0
    return (tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64) << 32) | (E_BLOCK - 1 - e).to(tl.int64)


@triton.jit
def _key_logit(key):
    """The logit a key was made from."""
    ordered = (key >> 32).to(tl.int32)
    return tl.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered).to(tl.float32, bitcast=True)


@triton.jit
def _key_expert(key, E_BLOCK: tl.constexpr):
    return (E_BLOCK - 1 - (key & 0xFFFFFFFF)).to(tl.int32)


#: Below every key: what a picked key becomes.
_PICKED: tl.constexpr = tl.constexpr(-(1 << 63))


@triton.jit
def _topk_picks(logits_row_ptr, E: tl.constexpr, E_BLOCK: tl.constexpr, TOP_K: tl.constexpr, K_BLOCK: tl.constexpr,
                pick):
    """(logits fp32 [E_BLOCK], ids int32 [K_BLOCK], their logits fp32 [K_BLOCK], the expert of pick number `pick` as
    a scalar) of one token: its TOP_K experts by logit, largest first (the lowest index among equal logits); slots
    past TOP_K are unused. One reduction per pick: a decode program that needs only its own expert takes it from
    the picks rather than from a reduction over ids, and leaves the weights (_route_weights) to the program that
    stores them; each reduction over a program's warps is a barrier on the way to its first weight load."""
    e = tl.arange(0, E_BLOCK)
    logits = tl.load(logits_row_ptr + e, mask=e < E, other=-float("inf")).to(tl.float32)
    key = _topk_keys(logits, e, E_BLOCK)
    slot = tl.arange(0, K_BLOCK)
    top = tl.full([K_BLOCK], -float("inf"), tl.float32)
    ids = tl.zeros([K_BLOCK], tl.int32)
    chosen = _PICKED
    for j in tl.static_range(TOP_K):
        best = tl.max(key, 0)
        top = tl.where(slot == j, _key_logit(best), top)
        ids = tl.where(slot == j, _key_expert(best, E_BLOCK), ids)
        chosen = tl.where(pick == j, best, chosen)
        key = tl.where(key == best, _PICKED, key)
    return logits, ids, top, _key_expert(chosen, E_BLOCK)


@triton.jit
def _route_weights(logits, top, RENORMALIZE: tl.constexpr):
    """The picks' weights: softmax over the k selected logits `top` (RENORMALIZE) or the full softmax's
    probabilities of them. Same formulas as _routing.route's torch ops, in fp32."""
    if RENORMALIZE:
        w = tl.exp(top - tl.max(top, 0))  # unused slots hold -inf: weight 0
        w = w / tl.sum(w, 0)
    else:
        shift = tl.max(logits, 0)
        w = tl.exp(top - shift) / tl.sum(tl.exp(logits - shift), 0)
    return w


@triton.jit
def _topk_row(logits_row_ptr, E: tl.constexpr, E_BLOCK: tl.constexpr, TOP_K: tl.constexpr, K_BLOCK: tl.constexpr,
              RENORMALIZE: tl.constexpr):
    """(ids int32 [K_BLOCK], weights fp32 [K_BLOCK]) of one token (_topk_picks, _route_weights)."""
    logits, ids, top, _ = _topk_picks(logits_row_ptr, E, E_BLOCK, TOP_K, K_BLOCK, 0)
    return ids, _route_weights(logits, top, RENORMALIZE)


@triton.jit
def topk_route_kernel(logits_ptr, ids_ptr, weights_ptr, stride_t, E: tl.constexpr, E_BLOCK: tl.constexpr,
                      TOP_K: tl.constexpr, K_BLOCK: tl.constexpr, RENORMALIZE: tl.constexpr):
    """Token program_id(0): its top-k experts and weights (_topk_row)."""
    t = tl.program_id(0).to(tl.int64)
    ids, w = _topk_row(logits_ptr + t * stride_t, E, E_BLOCK, TOP_K, K_BLOCK, RENORMALIZE)
    slot = tl.arange(0, K_BLOCK)
    ok = slot < TOP_K
    tl.store(ids_ptr + t * TOP_K + slot, ids, mask=ok)
    tl.store(weights_ptr + t * TOP_K + slot, w, mask=ok)


@triton.jit
def _route_tokens(logits_ptr, ids_ptr, weights_ptr, tokens, stride_t, E: tl.constexpr, T_BLOCK: tl.constexpr,
                  E_BLOCK: tl.constexpr, TOP_K: tl.constexpr, K_BLOCK: tl.constexpr, RENORMALIZE: tl.constexpr):
    """topk_route_kernel for T_BLOCK tokens at once (rows of a [T_BLOCK, E_BLOCK] tile): same selection
    (largest first, lowest index among equal logits) and formulas."""
    t = tl.arange(0, T_BLOCK)
    e = tl.arange(0, E_BLOCK)
    t_ok = t < tokens
    logits = tl.load(logits_ptr + t.to(tl.int64)[:, None] * stride_t + e[None, :],
                     mask=t_ok[:, None] & (e < E)[None, :], other=-float("inf")).to(tl.float32)
    logits = tl.where(t_ok[:, None], logits, 0.0)  # rows past T (never stored) stay finite: no inf - inf
    slot = tl.arange(0, K_BLOCK)
    key = _topk_keys(logits, e[None, :], E_BLOCK)
    top = tl.full([T_BLOCK, K_BLOCK], -float("inf"), tl.float32)
    ids = tl.zeros([T_BLOCK, K_BLOCK], tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(key, 1)
        top = tl.where(slot[None, :] == j, _key_logit(best)[:, None], top)
        ids = tl.where(slot[None, :] == j, _key_expert(best, E_BLOCK)[:, None], ids)
        key = tl.where(key == best[:, None], _PICKED, key)
    if RENORMALIZE:
        w = tl.exp(top - tl.max(top, 1)[:, None])  # unused slots hold -inf: weight 0
        w = w / tl.sum(w, 1)[:, None]
    else:
        shift = tl.max(logits, 1)
        w = tl.exp(top - shift[:, None]) / tl.sum(tl.exp(logits - shift[:, None]), 1)[:, None]
    ok = t_ok[:, None] & (slot < TOP_K)[None, :]
    where = t[:, None] * TOP_K + slot[None, :]
    tl.store(ids_ptr + where, ids, mask=ok)
    tl.store(weights_ptr + where, w, mask=ok)


@triton.jit
def _zero_tickets(tickets_ptr, first, count, end, CHUNK: tl.constexpr):
    """tickets[first : min(first + count, end)] = 0 (the split-K GEMM1's per-tile counters, see
    _kernels.gemm1_act_kernel); count = 0: nothing. Loops over runtime bounds are `while` loops in this module:
    triton 3.6's interpreter turns such a `range` bound into a 1-element array that numpy 2 refuses as an int."""
    t0 = 0
    while t0 < count:
        t = first + t0 + tl.arange(0, CHUNK)
        tl.store(tickets_ptr + t, 0, mask=(t < end) & (t < first + count))
        t0 += CHUNK


@triton.jit
def _padded_runs(counts, BLOCK_M: tl.constexpr, COARSE: tl.constexpr, WHOLE: tl.constexpr):
    """_routing.padded_runs: each run padded to BLOCK_M rows, or with WHOLE (> 0) to COARSE but for a run BLOCK_M
    past a multiple of WHOLE."""
    fine = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    if WHOLE:
        fine = tl.where((fine > WHOLE) & (fine % WHOLE == BLOCK_M), fine, (counts + COARSE - 1) // COARSE * COARSE)
    return fine


@triton.jit
def align_small_kernel(ids_ptr, sorted_pairs_ptr, block_expert_ptr, padded_total_ptr, scratch_ptr, tickets_ptr,
                       num_pairs, num_tickets, num_blocks: tl.constexpr, E: tl.constexpr, E_BLOCK: tl.constexpr,
                       P_BLOCK: tl.constexpr,
                       BLOCK_M: tl.constexpr, COARSE: tl.constexpr, WHOLE: tl.constexpr, ROWS_CHUNK: tl.constexpr,
                       BLOCKS_CHUNK: tl.constexpr,
                       logits_ptr, weights_ptr, stride_t, ROUTE: tl.constexpr, T_BLOCK: tl.constexpr,
                       LOGITS_BLOCK: tl.constexpr, TOP_K: tl.constexpr, K_BLOCK: tl.constexpr,
                       RENORMALIZE: tl.constexpr):
    """_routing.align in one program (decode sizes: num_pairs <= P_BLOCK): one launch instead of ~20.

    Sorts keys expert * P_BLOCK + pair (unique, so the order inside an expert is the pair order),
    histograms the experts, and scatters each pair to padded_start[e] + its rank inside e.
    ROUTE: first routes the num_pairs / TOP_K tokens from their logits as topk_route_kernel does (writing
    ids_ptr and weights_ptr), so decode takes one launch for routing and alignment together.
    Also zeroes tickets[0 : num_tickets] (GEMM1's split-K tile tickets; 0: none).
    """
    _zero_tickets(tickets_ptr, 0, num_tickets, num_tickets, ROWS_CHUNK)
    if ROUTE:
        _route_tokens(logits_ptr, ids_ptr, weights_ptr, num_pairs // TOP_K, stride_t, E, T_BLOCK, LOGITS_BLOCK,
                      TOP_K, K_BLOCK, RENORMALIZE)
        tl.debug_barrier()  # the ids just written are read back below, by other threads of this program
    offs = tl.arange(0, P_BLOCK)
    expert = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=E).to(tl.int32)
    bins = tl.arange(0, E_BLOCK)
    counts = tl.where(bins < E, tl.histogram(expert, E_BLOCK), 0)
    padded = _padded_runs(counts, BLOCK_M, COARSE, WHOLE)
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


@triton.jit
def align_count_kernel(ids_ptr, counts_ptr, sorted_pairs_ptr, tickets_ptr, num_pairs, total_rows, rows_per_program,
                       num_tickets, tickets_per_program,
                       E: tl.constexpr, E_BLOCK: tl.constexpr, CHUNK: tl.constexpr, ROWS_CHUNK: tl.constexpr):
    """Multi-program alignment, pass 1 (program c): the expert histogram of pairs [c*CHUNK, (c+1)*CHUNK) into
    counts[c], and the sentinel num_pairs into its share of sorted_pairs (pass 2 overwrites the real rows); zeroes
    its share of tickets[0 : num_tickets] (GEMM1's split-K tile tickets; 0: none)."""
    c = tl.program_id(0)
    _zero_tickets(tickets_ptr, c * tickets_per_program, tickets_per_program, num_tickets, ROWS_CHUNK)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    expert = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=E).to(tl.int32)
    bins = tl.arange(0, E_BLOCK)
    tl.store(counts_ptr + c * E_BLOCK + bins, tl.where(bins < E, tl.histogram(expert, E_BLOCK), 0))
    first = c * rows_per_program
    r0 = 0
    while r0 < rows_per_program:  # not a range over a runtime bound (see _zero_tickets)
        rows = first + r0 + tl.arange(0, ROWS_CHUNK)
        tl.store(sorted_pairs_ptr + rows, num_pairs, mask=(rows < total_rows) & (rows < first + rows_per_program))
        r0 += ROWS_CHUNK


@triton.jit
def align_scatter_kernel(ids_ptr, counts_ptr, scratch_ptr, sorted_pairs_ptr, block_expert_ptr, padded_total_ptr,
                         num_pairs, num_chunks, num_blocks, blocks_per_program,
                         E: tl.constexpr, E_BLOCK: tl.constexpr, CHUNK: tl.constexpr, C_STEP: tl.constexpr,
                         BLOCK_M: tl.constexpr, COARSE: tl.constexpr, WHOLE: tl.constexpr,
                         BLOCKS_CHUNK: tl.constexpr):
    """Multi-program alignment, pass 2 (program c): pair p of chunk c goes to padded_start[e] + (pairs of e in
    chunks before c) + (pairs of e before p inside c) - the stable counting sort of _routing._align_torch, each
    count an exact integer sum. Program c also writes the experts of its share of row blocks; program 0 the total."""
    c = tl.program_id(0)
    bins = tl.arange(0, E_BLOCK)
    total = tl.zeros([E_BLOCK], tl.int32)
    before = tl.zeros([E_BLOCK], tl.int32)
    c0 = 0
    while c0 < num_chunks:  # runtime bounds loop as `while` (see _zero_tickets)
        cs = c0 + tl.arange(0, C_STEP)
        tile = tl.load(counts_ptr + cs[:, None] * E_BLOCK + bins[None, :], mask=(cs < num_chunks)[:, None], other=0)
        total += tl.sum(tile, 0)
        before += tl.sum(tl.where((cs < c)[:, None], tile, 0), 0)
        c0 += C_STEP
    padded = _padded_runs(total, BLOCK_M, COARSE, WHOLE)
    padded_end = tl.cumsum(padded, 0)
    tl.store(scratch_ptr + c * E_BLOCK + bins, padded_end - padded + before)  # first row of chunk c's pairs of e
    if c == 0:
        tl.store(padded_total_ptr, tl.sum(padded, 0))
    tl.debug_barrier()
    local = tl.arange(0, CHUNK)
    offs = c * CHUNK + local
    real = offs < num_pairs
    expert = tl.load(ids_ptr + offs, mask=real, other=E).to(tl.int32)
    same_before = (expert[:, None] == expert[None, :]) & (local[None, :] < local[:, None])
    rank = tl.sum(same_before.to(tl.int32), 1)
    dest = tl.load(scratch_ptr + c * E_BLOCK + expert, mask=real, other=0) + rank
    tl.store(sorted_pairs_ptr + dest, offs, mask=real)
    ends = tl.where(bins < E, padded_end, 2147483647)
    first = c * blocks_per_program
    b0 = 0
    while b0 < blocks_per_program:  # expert of block b = #experts whose padded end <= b*BM
        blocks = first + b0 + tl.arange(0, BLOCKS_CHUNK)
        owner = tl.sum((ends[None, :] <= blocks[:, None] * BLOCK_M).to(tl.int32), 1)
        tl.store(block_expert_ptr + blocks, tl.minimum(owner, E - 1),
                 mask=(blocks < num_blocks) & (blocks < first + blocks_per_program))
        b0 += BLOCKS_CHUNK
