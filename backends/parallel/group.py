"""The process group a parallel layer runs over, and the one agreement check every rank makes at build.

Ranks must agree on the question (shapes, dtypes, parallel fields), the rules' content and the decision before
any weight moves: a rank that silently runs another backend or another shard gives wrong outputs with no error.
The check goes through the group's key-value store (the TCPStore torchrun or init_process_group created), not a
collective, so a rank that never arrives is *named* after `timeout` instead of hanging everyone: NCCL collectives
cannot say which rank is missing, and gloo's monitored_barrier does not exist on NCCL groups.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

__all__ = ["DEFAULT_BUILD_TIMEOUT", "GroupInfo", "ParallelConfigError", "agree", "group_info"]

#: how long a rank waits at build for the others before naming the ones that did not arrive
DEFAULT_BUILD_TIMEOUT = timedelta(seconds=120)

#: per-process count of agreements, so each build uses fresh store keys (every rank builds layers in one order)
_builds = itertools.count()


class ParallelConfigError(ValueError):
    """A parallel layer cannot be built as asked; raised on every rank with the same message, naming the fix."""


def _fail(message: str):
    raise ParallelConfigError(f"ParallelMoELayer: {message}")


@dataclass(frozen=True)
class GroupInfo:
    """Where this process stands in the group: its rank in the group, the group size, and the global ranks."""

    group: Any
    rank: int
    world: int
    global_ranks: tuple[int, ...]
    backend: str


def group_info(process_group) -> GroupInfo:
    """The rank, size and member ranks of `process_group`; one clear error when there is none."""
    fix = ("start the processes with `torchrun --nproc-per-node N script.py`, call "
           "torch.distributed.init_process_group('nccl' or 'gloo') in each, then pass "
           "process_group=torch.distributed.group.WORLD (or a subgroup from torch.distributed.new_group)")
    if not dist.is_available():
        _fail(f"torch.distributed is not available in this torch build; {fix}")
    if not dist.is_initialized():
        _fail(f"torch.distributed is not initialized in this process; {fix}")
    if process_group is None:
        _fail(f"process_group=None: a parallel layer needs the group it is sharded over; {fix}")
    try:
        rank = dist.get_rank(process_group)
        world = dist.get_world_size(process_group)
        ranks = tuple(dist.get_process_group_ranks(process_group))
        backend = str(dist.get_backend(process_group))
    except (RuntimeError, ValueError, TypeError) as exc:
        _fail(f"process_group={process_group!r} is not a usable torch.distributed group ({exc}); {fix}")
    if rank < 0:
        _fail(f"this process (global rank {dist.get_rank()}) is not a member of process_group (ranks {ranks}); build "
              f"the layer only on the group's members")
    return GroupInfo(process_group, rank, world, ranks, backend)


def digest(payload: Any) -> str:
    """A short stable hash of a JSON-able payload (sorted keys)."""
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def agree(info: GroupInfo, parts: dict[str, Any], *, timeout: timedelta = DEFAULT_BUILD_TIMEOUT) -> None:
    """Every rank of the group publishes the digest of each part; every rank then reads all of them and raises
    the same ParallelConfigError when a part differs (naming the part and which ranks hold which value), or when
    a rank did not publish within `timeout` (naming it)."""
    store = dist.distributed_c10d._get_default_store()
    build = next(_builds)
    prefix = f"moe_oracle/parallel/{'-'.join(map(str, info.global_ranks))}/{build}/"
    mine = {name: digest(value) for name, value in parts.items()}
    store.set(prefix + str(info.rank), json.dumps(mine))
    keys = [prefix + str(r) for r in range(info.world)]
    try:
        store.wait(keys, timeout)
    except RuntimeError as exc:  # DistStoreError (a RuntimeError): the wait timed out
        missing = [info.global_ranks[r] for r in range(info.world) if not store.check([keys[r]])]
        _fail(f"rank(s) {missing} of the group (global ranks) did not reach the layer build within "
              f"{timeout.total_seconds():.0f} s ({type(exc).__name__}); every rank of the group must build the "
              f"same layers in the same order: check that rank's log for an earlier error, or raise build_timeout=")
    seen = [json.loads(store.get(key)) for key in keys]
    for name in parts:
        values = [s.get(name) for s in seen]
        if len(set(values)) > 1:
            groups: dict[str, list[int]] = {}
            for r, value in enumerate(values):
                groups.setdefault(str(value), []).append(info.global_ranks[r])
            held = "; ".join(f"ranks {ranks} hold {value}" for value, ranks in groups.items())
            _fail(f"the ranks disagree on the {name} ({held}): every rank must build the layer from the same "
                  f"checkpoint shapes, the same rules and the same arguments (this rank's {name}: "
                  f"{json.dumps(parts[name], sort_keys=True, default=str)[:400]})")
