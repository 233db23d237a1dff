"""One rank's share of a checkpoint: a slice of I (tensor parallel) or a subset of the experts (expert parallel).

Both are views of `MoEWeights` built from the checkpoint model's own conventions, so every converter and runner
takes a shard exactly as it takes a whole layer:

* TP slices the intermediate dimension: w13's gate and up rows of [i0, i1) (interleaved: rows [2 i0, 2 i1);
  contiguous: gate rows [i0, i1) and up rows [I + i0, I + i1)), w2's packed columns [i0/2, i1/2) and its scale
  columns [i0/block, i1/block), the matching w13 bias entries. Each rank's partial outputs sum to the layer's,
  so w2's bias, added once per token and expert, stays on rank 0 only (vLLM's gpt-oss loader does the same).
  Per-expert NVFP4 global and input scales do not depend on I and are kept whole.
* EP keeps the experts a placement gives the rank (ascending global id = local id), every tensor indexed on E.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backends.parallel.group import ParallelConfigError
from backends.weights import MoEWeights

__all__ = ["contiguous_placement", "ep_shard", "local_experts", "tp_shard", "tp_slice"]

_PER_EXPERT = ("w13", "w13_scale", "w2", "w2_scale", "w13_bias", "w2_bias", "w13_global_scale", "w2_global_scale",
               "w13_input_scale", "w2_input_scale")


def _fail(message: str):
    raise ParallelConfigError(f"ParallelMoELayer: {message}")


def tp_slice(intermediate_size: int, world: int, rank: int, block: int, fmt: str) -> tuple[int, int]:
    """[i0, i1) of the intermediate dimension rank `rank` holds; the shard must hold whole format blocks."""
    if intermediate_size % world:
        _fail(f"tensor parallel over {world} ranks: intermediate size I={intermediate_size} is not divisible by "
              f"{world}; use a group size that divides I, or parallel='ep'")
    per_rank = intermediate_size // world
    if per_rank % block:
        _fail(f"tensor parallel over {world} ranks: the per-rank slice I/{world}={per_rank} is not a multiple of "
              f"the {fmt} block ({block} elements share one scale), so a scale block would straddle two ranks; "
              f"use a group size with I/size a multiple of {block} (here: "
              f"{[w for w in range(1, world + 1) if intermediate_size % (w * block) == 0]}), or parallel='ep'")
    return rank * per_rank, (rank + 1) * per_rank


def tp_shard(weights: MoEWeights, world: int, rank: int) -> MoEWeights:
    """Rank `rank`'s slice of I (see the module docstring)."""
    inter, block = weights.I, weights.block_size
    i0, i1 = tp_slice(inter, world, rank, block, weights.format)
    if weights.gate_up == "interleaved":
        blocks = [slice(2 * i0, 2 * i1)]
    else:
        blocks = [slice(i0, i1), slice(inter + i0, inter + i1)]

    def rows(t):
        if t is None:
            return None
        raw = t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t  # cat through bytes for float8
        return torch.cat([raw[:, b] for b in blocks], dim=1).view(t.dtype)

    w2_bias = weights.w2_bias
    if w2_bias is not None and rank != 0:
        w2_bias = torch.zeros_like(w2_bias)
    return weights.replace(
        w13=rows(weights.w13), w13_scale=rows(weights.w13_scale), w13_bias=rows(weights.w13_bias),
        w2=weights.w2[:, :, i0 // 2:i1 // 2].contiguous(),
        w2_scale=weights.w2_scale[:, :, i0 // block:i1 // block].contiguous(),
        w2_bias=w2_bias)


def contiguous_placement(num_experts: int, world: int) -> list[int]:
    """vLLM's default expert map: rank r owns experts [r E/world, (r+1) E/world)."""
    if num_experts % world:
        _fail(f"expert parallel over {world} ranks: the layer's E={num_experts} experts do not divide evenly over "
              f"{world} ranks; use a group size that divides E (here: "
              f"{[w for w in range(1, min(num_experts, 64) + 1) if num_experts % w == 0]}), pass "
              f"expert_placement= (the owning rank of each expert), or parallel='tp'")
    per_rank = num_experts // world
    return [e // per_rank for e in range(num_experts)]


def check_placement(placement: Sequence[int], num_experts: int, world: int) -> list[int]:
    """A placement as a list: one owning rank in [0, world) per expert, every rank owning at least one."""
    if isinstance(placement, torch.Tensor):
        placement = placement.tolist()
    if not isinstance(placement, Sequence) or isinstance(placement, str):
        _fail(f"expert_placement must be a sequence of {num_experts} ranks (the owner of each expert), got "
              f"{type(placement).__name__}")
    owners = list(placement)
    if len(owners) != num_experts or not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < world
                                             for r in owners):
        _fail(f"expert_placement must hold {num_experts} ints in [0, {world}) (the owning rank of each of the "
              f"E={num_experts} experts), got {owners[:16]}{'...' if len(owners) > 16 else ''}")
    empty = sorted(set(range(world)) - set(owners))
    if empty:
        _fail(f"expert_placement gives rank(s) {empty} no expert; every rank of the group must own at least one")
    return owners


def local_experts(placement: Sequence[int], rank: int) -> list[int]:
    """The global ids of the experts `rank` owns, ascending (their position is the local id)."""
    return [e for e, owner in enumerate(placement) if owner == rank]


def ep_shard(weights: MoEWeights, experts: Sequence[int]) -> MoEWeights:
    """The experts `experts` (global ids) of the layer, in that order."""
    index = torch.tensor(list(experts), dtype=torch.long, device=weights.w13.device)

    def take(t):  # through uint8: index kernels for float8 dtypes are not on every device
        return t.view(torch.uint8)[index].view(t.dtype) if t.dtype == torch.float8_e4m3fn else t[index]

    return weights.replace(**{name: take(getattr(weights, name)) for name in _PER_EXPERT
                              if getattr(weights, name) is not None})
