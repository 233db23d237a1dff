"""Routing (top-k + softmax) and sorting of (token, slot) pairs into per-expert row blocks.

Everything here is a fixed sequence of device ops whose sizes depend only on T, k, E and BLOCK_M
(never on the routing itself), so there is no host sync and the whole thing can be captured in a
CUDA graph. The numbers of blocks actually used lives on the device (`padded_total`); the GEMM
grids are launched for the static upper bound and surplus programs return at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool):
    """(topk_ids int32 [T, k], topk_weights fp32 [T, k]) exactly as the emulation backend routes.

    renormalize=True: top-k on the logits, then softmax over the k selected (gpt-oss, Renormalize);
    False: softmax over all experts, then the top-k probabilities as they are.
    """
    logits = router_logits.float()
    if renormalize:
        top_logits, ids = torch.topk(logits, top_k, dim=-1)
        return ids.to(torch.int32), torch.softmax(top_logits, dim=-1)
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    return ids.to(torch.int32), weights


def max_row_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Static bound on sum_e ceil(count_e / BLOCK_M): at most min(E, pairs) experts waste a partial block."""
    if num_pairs == 0:
        return 0
    return -(-(num_pairs + min(num_experts, num_pairs) * (block_m - 1)) // block_m)


@dataclass(frozen=True)
class Alignment:
    """Pairs (t*k + j) sorted by expert, each expert's run padded to a multiple of BLOCK_M.

    sorted_pairs: int32 [num_blocks * BLOCK_M], pad entries hold num_pairs (masked by the kernels);
    block_expert: int32 [num_blocks], the expert of each row block (unused past padded_total);
    padded_total: int32 [1] on the device, rows in use (a multiple of BLOCK_M).
    """

    sorted_pairs: torch.Tensor
    block_expert: torch.Tensor
    padded_total: torch.Tensor
    num_blocks: int
    block_m: int


def align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> Alignment:
    """Counting sort of the pairs by expert, with per-expert padding to BLOCK_M; stable in pair order."""
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    num_pairs = flat.numel()
    num_blocks = max_row_blocks(num_pairs, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    padded_start = padded_end - padded
    count_start = torch.cumsum(counts, 0) - counts
    order = torch.sort(flat, stable=True).indices
    sorted_expert = flat[order]
    rank = torch.arange(num_pairs, device=device) - count_start[sorted_expert]
    dest = padded_start[sorted_expert] + rank
    sorted_pairs = torch.full((num_blocks * block_m,), num_pairs, dtype=torch.int32, device=device)
    sorted_pairs.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange(num_blocks, device=device, dtype=torch.int64) * block_m
    block_expert = torch.searchsorted(padded_end, block_start, right=True).clamp_(max=num_experts - 1)
    padded_total = padded_end[-1:].to(torch.int32)
    return Alignment(sorted_pairs, block_expert.to(torch.int32), padded_total, num_blocks, block_m)
