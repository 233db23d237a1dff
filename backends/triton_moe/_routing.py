"""Routing (top-k + softmax) and sorting of (token, slot) pairs into per-expert row blocks.

Everything here is a fixed sequence of device ops whose sizes depend only on T, k, E and BLOCK_M
(never on the routing itself), so there is no host sync and the whole thing can be captured in a
CUDA graph. The numbers of blocks actually used lives on the device (`padded_total`); the GEMM
grids are launched for the static upper bound and surplus programs return at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backends.triton_moe.tuning.arch import sm90

#: The thresholds below were measured on SM90; other architectures reuse them (not measured there).
_ARCH = sm90.FACTS


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool, kernels=None):
    """(topk_ids [T, k], topk_weights fp32 [T, k]), selected as the emulation backend routes.

    renormalize=True: top-k on the logits, then softmax over the k selected (gpt-oss, Renormalize);
    False: softmax over all experts, then the top-k probabilities as they are. With `kernels` (the Triton
    module): one launch of topk_route_kernel (int32 ids; torch's top-k + softmax take three at decode
    sizes); without: torch ops (int64 ids).
    """
    if kernels is not None and router_logits.shape[0] > 0:
        return _route_fused(router_logits, top_k, renormalize, kernels)
    logits = router_logits.float()
    if renormalize:
        top_logits, ids = torch.topk(logits, top_k, dim=-1)
        return ids, torch.softmax(top_logits, dim=-1)  # ids stay int64: no conversion launch
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    return ids, weights


def _route_fused(router_logits, top_k, renormalize, kernels):
    tokens, experts = router_logits.shape
    logits = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
    ids = torch.empty(tokens, top_k, dtype=torch.int32, device=logits.device)
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=logits.device)
    e_block = _pow2(experts)
    kernels.topk_route_kernel[(tokens,)](logits, ids, weights, logits.stride(0), E=experts, E_BLOCK=e_block,
                                         TOP_K=top_k, K_BLOCK=_pow2(top_k), RENORMALIZE=bool(renormalize),
                                         num_warps=1 if e_block <= 256 else 4)
    return ids, weights


def max_row_blocks(num_pairs: int, num_experts: int, block_m: int, coarse_pad: tuple[int, int] | None = None) -> int:
    """Static bound on the padded rows / BLOCK_M: at most min(E, pairs) experts pad, each by less than BLOCK_M rows
    (with coarse_pad, `padded_runs`: less than its COARSE)."""
    if num_pairs == 0:
        return 0
    pad = coarse_pad[0] if coarse_pad else block_m
    return -(-(num_pairs + min(num_experts, num_pairs) * (pad - 1)) // block_m)


def padded_runs(counts: torch.Tensor, block_m: int, coarse_pad: tuple[int, int] | None = None) -> torch.Tensor:
    """Each expert's run of `counts` pairs padded to a multiple of BLOCK_M rows: the alignment's definition (its
    kernels compute the same). coarse_pad = (COARSE, WHOLE): to a multiple of COARSE (a multiple of BLOCK_M)
    instead, except a run of more than WHOLE rows that BLOCK_M-padding leaves one BLOCK_M past a multiple of WHOLE:
    the rows a WHOLE-row block can carry as its tail (warp_specialized.ws_blocks) are not padded further."""
    fine = (counts + block_m - 1) // block_m * block_m
    if coarse_pad is None:
        return fine
    coarse, whole = coarse_pad
    return torch.where((fine > whole) & (fine % whole == block_m), fine, (counts + coarse - 1) // coarse * coarse)


@dataclass(frozen=True)
class Alignment:
    """Pairs (t*k + j) sorted by expert, each expert's run padded to a multiple of BLOCK_M.

    sorted_pairs: int32 [num_blocks * BLOCK_M], pad entries hold num_pairs (masked by the kernels);
    block_expert: int32 [num_blocks], the expert of each row block (unused past padded_total);
    padded_total: int32 [1] on the device, rows in use (a multiple of BLOCK_M);
    tickets: int32 [num_blocks * tickets_per_block + extra_tickets] zeroes written by the alignment launch itself
    (None when both are 0): first the split-K GEMM1's per-tile counters of this call (_kernels.gemm1_act_kernel,
    LAST_SLICE_ACTIVATES), then GEMM2's per-(token, column tile) counters (_kernels.gemm2_kernel, LAST_PAIR_SUMS).
    Allocated per call like the other outputs, so every call, stream and CUDA-graph replay gets zeroed tickets
    before its GEMMs, whatever an earlier (perhaps aborted) call left.
    """

    sorted_pairs: torch.Tensor
    block_expert: torch.Tensor
    padded_total: torch.Tensor
    num_blocks: int
    block_m: int
    tickets: torch.Tensor | None = None


#: Up to this many (token, slot) pairs the alignment runs as one Triton program (one launch); above, the
#: two-launch multi-program path up to MULTI_ALIGN_PAIRS, then torch ops (measurements: tuning/arch/sm90.py).
SMALL_ALIGN_PAIRS = _ARCH.small_align_pairs
MULTI_ALIGN_PAIRS = _ARCH.multi_align_pairs
MULTI_ALIGN_CHUNK = 128
ALIGN_PATHS = ("one-program", "multi-program", "torch")


def align_path(num_pairs: int, have_kernels: bool = True) -> str:
    """The alignment path `align` takes by default for this many pairs (one of ALIGN_PATHS)."""
    if not have_kernels or num_pairs == 0:
        return "torch"
    return ("one-program" if num_pairs <= SMALL_ALIGN_PAIRS else "multi-program" if num_pairs <= MULTI_ALIGN_PAIRS
            else "torch")


def align(topk_ids: torch.Tensor, num_experts: int, block_m: int, kernels=None, path: str | None = None,
          tickets_per_block: int = 0, extra_tickets: int = 0, coarse_pad: tuple[int, int] | None = None) -> Alignment:
    """Counting sort of the pairs by expert, with per-expert padding to BLOCK_M (coarse_pad: as `padded_runs`
    says); stable in pair order.

    With `kernels` (the Triton module): one launch for few pairs, two (histograms per chunk, then scatter)
    up to MULTI_ALIGN_PAIRS; otherwise a fixed sequence of torch ops. All give the same result without a
    host sync. path: force one of ALIGN_PATHS (tests, benchmarks). tickets_per_block: also return that many
    zeroed tickets per row block (Alignment.tickets; GEMM1's column tiles per row block), zeroed in the same launch;
    extra_tickets: that many more after them (GEMM2's top-k sum tickets: T * its column tiles).
    """
    _check_tickets_per_block("align", tickets_per_block, extra_tickets)
    if coarse_pad is not None and not (coarse_pad[0] % block_m == 0 and coarse_pad[1] % coarse_pad[0] == 0):
        raise ValueError(f"align: coarse_pad={coarse_pad!r} must be (COARSE, WHOLE) with COARSE a multiple of "
                         f"block_m={block_m} and WHOLE a multiple of COARSE")
    num_pairs = topk_ids.numel()
    if path is None:
        path = align_path(num_pairs, kernels is not None)
    if path not in ALIGN_PATHS:
        raise ValueError(f"align: path={path!r} must be one of {ALIGN_PATHS} (or None to choose by size)")
    if path != "torch" and (kernels is None or num_pairs == 0):
        raise ValueError(f"align: path={path!r} needs the Triton kernels module and at least one pair")
    tickets = (tickets_per_block, extra_tickets)
    if path == "one-program":
        return _align_fused(topk_ids, num_experts, block_m, kernels, tickets, coarse_pad=coarse_pad)
    if path == "multi-program":
        return _align_multi(topk_ids, num_experts, block_m, kernels, tickets, coarse_pad)
    return _align_torch(topk_ids, num_experts, block_m, tickets, coarse_pad)


def _check_tickets_per_block(caller: str, tickets_per_block, extra_tickets=0) -> None:
    if isinstance(tickets_per_block, bool) or not isinstance(tickets_per_block, int) or tickets_per_block < 0:
        raise ValueError(f"{caller}: tickets_per_block={tickets_per_block!r} must be an int >= 0 (GEMM1's column "
                         f"tiles per row block when its split-K slices activate in-kernel, else 0)")
    if isinstance(extra_tickets, bool) or not isinstance(extra_tickets, int) or extra_tickets < 0:
        raise ValueError(f"{caller}: extra_tickets={extra_tickets!r} must be an int >= 0 (GEMM2's top-k sum tickets, "
                         f"T * its column tiles, when its last program per token tile sums the pairs, else 0)")


def _num_tickets(num_blocks: int, tickets) -> int:
    """tickets = (per row block, extra): the ticket count an alignment zeroes."""
    per_block, extra = tickets
    return num_blocks * per_block + extra


def _empty_tickets(num_blocks: int, tickets, device) -> torch.Tensor | None:
    """The uninitialized ticket buffer an alignment kernel zeroes (None for none)."""
    count = _num_tickets(num_blocks, tickets)
    if not count:
        return None
    return torch.empty(count, dtype=torch.int32, device=device)


def _coarse_pad_constexprs(coarse_pad: tuple[int, int] | None) -> dict:
    """The alignment kernels' COARSE and WHOLE for `padded_runs`' coarse_pad (0 and 0: plain BLOCK_M padding)."""
    coarse, whole = coarse_pad or (0, 0)
    return {"COARSE": coarse, "WHOLE": whole}


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _align_fused(topk_ids, num_experts, block_m, kernels, tickets=(0, 0), routing=None,
                 coarse_pad=None) -> Alignment:
    """One launch; routing = (router_logits, top_k, renormalize, route_weights): route first, in the same program,
    writing topk_ids (int32 [T, k]) and route_weights (fp32 [T, k])."""
    device = topk_ids.device
    num_pairs = topk_ids.numel()
    num_blocks = max_row_blocks(num_pairs, num_experts, block_m, coarse_pad)
    e_block = _pow2(num_experts + 1)  # one spare bin for the padding lanes (expert id E)
    sorted_pairs = torch.empty(num_blocks * block_m, dtype=torch.int32, device=device)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=device)
    padded_total = torch.empty(1, dtype=torch.int32, device=device)
    scratch = torch.empty(2 * e_block, dtype=torch.int32, device=device)
    tickets = _empty_tickets(num_blocks, tickets, device)
    logits, top_k, renormalize, route_weights = routing or (scratch, 1, True, scratch)
    kernels.align_small_kernel[(1,)](
        topk_ids.reshape(-1), sorted_pairs, block_expert, padded_total, scratch,
        scratch if tickets is None else tickets, num_pairs, 0 if tickets is None else tickets.numel(), num_blocks,
        E=num_experts, E_BLOCK=e_block, P_BLOCK=max(16, _pow2(num_pairs)), BLOCK_M=block_m,
        **_coarse_pad_constexprs(coarse_pad), ROWS_CHUNK=1024, BLOCKS_CHUNK=max(16, min(64, 8192 // e_block)),
        logits_ptr=logits, weights_ptr=route_weights, stride_t=logits.stride(0), ROUTE=routing is not None,
        T_BLOCK=max(2, _pow2(num_pairs // top_k)) if routing else 2, LOGITS_BLOCK=_pow2(num_experts), TOP_K=top_k,
        K_BLOCK=_pow2(top_k), RENORMALIZE=bool(renormalize),
        num_warps=4 if num_pairs <= 512 else 8 if num_pairs <= 1024 else 16,  # one program sorts all pairs
    )
    return Alignment(sorted_pairs, block_expert, padded_total, num_blocks, block_m, tickets)


#: Routing runs inside the one-program alignment (route_and_align: one launch, not two) while T * E <= this: its
#: [T, E] logits tile lives in one program (measurements: tuning/arch/sm90.py).
ROUTE_IN_ALIGN_LOGITS = _ARCH.route_in_align_logits


def route_and_align(router_logits: torch.Tensor, top_k: int, renormalize: bool, num_experts: int, block_m: int,
                    kernels, tickets_per_block: int = 0, extra_tickets: int = 0):
    """(topk_ids int32 [T, k], topk_weights fp32 [T, k], Alignment) in one launch: `route` then `align`, with
    route's selection and formulas, for T >= 1 with T * E <= 4096 (one program holds the logits; by default
    only T * E <= ROUTE_IN_ALIGN_LOGITS takes this path: see there). tickets_per_block, extra_tickets: as in
    `align`."""
    _check_tickets_per_block("route_and_align", tickets_per_block, extra_tickets)
    tokens = router_logits.shape[0]
    if not 1 <= tokens or tokens * num_experts > 4096:
        raise ValueError(f"route_and_align: T={tokens} with E={num_experts} must have 1 <= T and T * E <= 4096; "
                         f"call route and align separately for other sizes")
    logits = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
    ids = torch.empty(tokens, top_k, dtype=torch.int32, device=logits.device)
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=logits.device)
    al = _align_fused(ids, num_experts, block_m, kernels, (tickets_per_block, extra_tickets),
                      (logits, top_k, renormalize, weights))
    return ids, weights, al


def _align_multi(topk_ids, num_experts, block_m, kernels, tickets=(0, 0), coarse_pad=None) -> Alignment:
    device = topk_ids.device
    num_pairs = topk_ids.numel()
    num_blocks = max_row_blocks(num_pairs, num_experts, block_m, coarse_pad)
    num_chunks = -(-num_pairs // MULTI_ALIGN_CHUNK)
    e_block = _pow2(num_experts + 1)  # one spare bin for the padding lanes (expert id E)
    flat = topk_ids.reshape(-1)
    sorted_pairs = torch.empty(num_blocks * block_m, dtype=torch.int32, device=device)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=device)
    padded_total = torch.empty(1, dtype=torch.int32, device=device)
    counts = torch.empty(num_chunks, e_block, dtype=torch.int32, device=device)
    scratch = torch.empty(num_chunks, e_block, dtype=torch.int32, device=device)
    tickets = _empty_tickets(num_blocks, tickets, device)
    num_tickets = 0 if tickets is None else tickets.numel()
    rows = num_blocks * block_m
    kernels.align_count_kernel[(num_chunks,)](
        flat, counts, sorted_pairs, counts if tickets is None else tickets, num_pairs, rows, -(-rows // num_chunks),
        num_tickets, -(-num_tickets // num_chunks),
        E=num_experts, E_BLOCK=e_block, CHUNK=MULTI_ALIGN_CHUNK, ROWS_CHUNK=256, num_warps=4)
    kernels.align_scatter_kernel[(num_chunks,)](
        flat, counts, scratch, sorted_pairs, block_expert, padded_total, num_pairs, num_chunks, num_blocks,
        -(-num_blocks // num_chunks), E=num_experts, E_BLOCK=e_block, CHUNK=MULTI_ALIGN_CHUNK,
        C_STEP=max(1, min(16, 4096 // e_block)), BLOCK_M=block_m, **_coarse_pad_constexprs(coarse_pad),
        BLOCKS_CHUNK=max(16, min(64, 8192 // e_block)), num_warps=4)
    return Alignment(sorted_pairs, block_expert, padded_total, num_blocks, block_m, tickets)


def _align_torch(topk_ids: torch.Tensor, num_experts: int, block_m: int, tickets=(0, 0),
                 coarse_pad=None) -> Alignment:
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    num_pairs = flat.numel()
    num_blocks = max_row_blocks(num_pairs, num_experts, block_m, coarse_pad)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = padded_runs(counts, block_m, coarse_pad)
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
    count = _num_tickets(num_blocks, tickets)
    tickets = torch.zeros(count, dtype=torch.int32, device=device) if count else None
    return Alignment(sorted_pairs, block_expert.to(torch.int32), padded_total, num_blocks, block_m, tickets)
