"""Triton kernels of the routing step: top-k of the router logits, and the one-launch alignment.

Both are fixed-shape launches (no host sync, CUDA-graph safe). topk_route_kernel replaces torch's
top-k + softmax (three kernels at decode sizes: a gather, a bitonic sort and a softmax) by one program
per token; align_small_kernel sorts the (token, slot) pairs by expert in one program.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def topk_route_kernel(logits_ptr, ids_ptr, weights_ptr, stride_t, E: tl.constexpr, E_BLOCK: tl.constexpr,
                      TOP_K: tl.constexpr, K_BLOCK: tl.constexpr, RENORMALIZE: tl.constexpr):
    """Token program_id(0): its TOP_K experts by logit, largest first (the lowest index among equal logits),
    and their weights - softmax over the k selected logits (RENORMALIZE) or the full softmax's probabilities.
    Same selection and formulas as _routing.route's torch ops, in fp32."""
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, E_BLOCK)
    logits = tl.load(logits_ptr + t * stride_t + e, mask=e < E, other=-float("inf")).to(tl.float32)
    slot = tl.arange(0, K_BLOCK)
    top = tl.full([K_BLOCK], -float("inf"), tl.float32)
    ids = tl.zeros([K_BLOCK], tl.int32)
    work = logits
    for j in tl.static_range(TOP_K):
        best = tl.max(work, 0)
        idx = tl.min(tl.where(work == best, e, E_BLOCK), 0)
        top = tl.where(slot == j, best, top)
        ids = tl.where(slot == j, idx, ids)
        work = tl.where(e == idx, -float("inf"), work)
    if RENORMALIZE:
        w = tl.exp(top - tl.max(top, 0))  # unused slots hold -inf: weight 0
        w = w / tl.sum(w, 0)
    else:
        shift = tl.max(logits, 0)
        w = tl.exp(top - shift) / tl.sum(tl.exp(logits - shift), 0)
    ok = slot < TOP_K
    tl.store(ids_ptr + t * TOP_K + slot, ids, mask=ok)
    tl.store(weights_ptr + t * TOP_K + slot, w, mask=ok)


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
