"""Architecture facts, one module per architecture: which tiles run wgmma, SM counts of known parts, and the
routing/alignment size thresholds. `facts_for(capability)` picks the module; everything else reads it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchFacts:
    name: str  # "sm90": the `arch` field of tuning tables
    wgmma_min_warps: int | None  # tiles of at least this many warps run wgmma; None: the arch has no wgmma
    default_sm_count: int  # for a part not in sm_counts (and for the CPU interpreter)
    sm_counts: dict  # device-name substring -> SMs of that part (a live device reports its own)
    route_in_align_logits: int  # routing runs inside the one-program alignment while T * E <= this
    small_align_pairs: int  # one-program alignment up to this many pairs
    multi_align_pairs: int  # then the two-launch multi-program path up to this many, then torch ops

    def runs_wgmma(self, num_warps: int) -> bool:
        return self.wgmma_min_warps is not None and num_warps >= self.wgmma_min_warps


def facts_for(capability: tuple[int, int] | None) -> ArchFacts:
    """The facts of a CUDA compute capability; None (CPU interpreter) follows SM90, so that CPU tests cover the
    wgmma branches the H100/H200 take."""
    from backends.triton_moe.tuning.arch import sm80, sm90

    if capability is None or capability[0] == 9:
        return sm90.FACTS
    return sm80.FACTS


def facts_by_name(name: str) -> ArchFacts:
    from backends.triton_moe.tuning.arch import sm80, sm90

    known = {f.name: f for f in (sm80.FACTS, sm90.FACTS)}
    if name not in known:
        raise ValueError(f"unknown architecture {name!r}; known: {sorted(known)}")
    return known[name]
