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

__all__ = ["DEFAULT_BUILD_TIMEOUT", "Arrivals", "GroupInfo", "ParallelConfigError", "agree", "group_info", "next_build"]

#: how long a rank waits at build for the others before naming the ones that did not arrive
DEFAULT_BUILD_TIMEOUT = timedelta(seconds=120)

#: per group (its global ranks), the count of agreements made: each build uses fresh store keys, and the ranks of a
#: group build its layers in one order
_builds: dict[tuple[int, ...], itertools.count] = {}


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


def next_build(global_ranks: tuple[int, ...]) -> int:
    """The number of this group's next agreement (a rank that skips a build must still count it)."""
    return next(_builds.setdefault(global_ranks, itertools.count()))


def agree(info: GroupInfo, parts: dict[str, Any], *, timeout: timedelta = DEFAULT_BUILD_TIMEOUT) -> None:
    """Every rank of the group publishes the digest of each part; every rank then reads all of them and raises
    the same ParallelConfigError when a part differs (naming the part and which ranks hold which value), or when
    a rank did not publish within `timeout` (naming it)."""
    store = dist.distributed_c10d._get_default_store()
    build = next_build(info.global_ranks)
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


class Arrivals:
    """A check, before each collective step of one layer, that every rank of the group arrived within `timeout`;
    a late rank is named instead of leaving the others blocked in a collective (NCCL and gloo time out without
    naming it). Debugging aid: it costs a store round trip per rank and step (~0.1-1 ms)."""

    def __init__(self, info: GroupInfo, timeout: timedelta):
        self.info, self.timeout = info, timeout
        ranks = "-".join(map(str, info.global_ranks))
        self.prefix = f"moe_oracle/parallel/{ranks}/steps{next_build(info.global_ranks)}/"
        self.step = 0

    def __call__(self, what: str) -> None:
        store = dist.distributed_c10d._get_default_store()
        step, self.step = self.step, self.step + 1
        keys = [f"{self.prefix}{step}/{r}" for r in range(self.info.world)]
        store.set(keys[self.info.rank], what)
        try:
            store.wait(keys, self.timeout)
        except RuntimeError as exc:  # DistStoreError: the wait timed out
            missing = [self.info.global_ranks[r] for r in range(self.info.world) if not store.check([keys[r]])]
            _fail(f"rank(s) {missing} of the group (global ranks) did not reach step {step} ({what}) within "
                  f"{self.timeout.total_seconds():.0f} s ({type(exc).__name__}); every rank of the group must call "
                  f"forward on this layer, each with its own tokens (zero tokens too)")
        if step >= 2:  # every rank has left step - 2's wait once all have set step - 1's key
            store.delete_key(f"{self.prefix}{step - 2}/{self.info.rank}")
