"""Ampere and Ada (SM 8.x): mma.sync only; no measured table, the heuristics with SM90's thresholds serve it."""

from backends.triton_moe.tuning.arch import ArchFacts

FACTS = ArchFacts(
    name="sm80",
    wgmma_min_warps=None,
    default_sm_count=108,
    sm_counts={"A100": 108, "A10": 72, "L40": 142, "L4": 58, "RTX 4090": 128},
    route_in_align_logits=512,
    small_align_pairs=256,
    multi_align_pairs=32768,
)
