"""Token dispatch and combine for expert parallelism, named by vLLM's `--all2all-backend` values.

Each rank holds its own tokens (data parallel) and some of the experts (expert parallel). A dispatch brings every
(token, expert) pair to the rank owning the expert; the local experts run on those pairs (one row per pair,
weighted by its top-k weight); the combine brings each pair's output back to the token's rank and sums them.

* ``allgather_reducescatter`` (vLLM's backend of that name): all-gather every rank's tokens, compute the local
  experts' pairs among all of them, reduce-scatter the outputs back. Traffic per rank: (world - 1) x T x H
  both ways, whatever the routing; two collectives (plus the token counts).
* ``deepep_high_throughput``: a true all-to-all. The counts of tokens for each destination are exchanged first
  (all_to_all_single of [world] ints, one host sync), then each token travels once to each rank owning at least
  one of its experts (with its top-k ids and weights), then its partial sums travel back. Traffic is only what
  the routing needs. This is DeepEP's "normal" (high-throughput) protocol - counts first, variable-length
  buffers, standard activation format on the receiver - implemented with torch.distributed's
  all_to_all_single instead of DeepEP's NVSHMEM kernels.

Payloads are packed into one uint8 row per token (activations, top-k ids as int32, top-k weights as fp32), so a
dispatch is one collective. Neither dispatch is CUDA-graph capturable: both read the exchanged token counts on
the host (`.tolist()`) to size buffers. vLLM's capturable path is the batched format with a fixed
max-tokens-per-rank buffer (deepep_low_latency), which the rules refuse for this project's runners.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from backends.parallel.group import GroupInfo

__all__ = ["DISPATCHES", "AllGatherReduceScatter", "AllToAllCounts", "Dispatched", "all_gather", "reduce_scatter"]

# torch >= 2.13 names the tensor collectives *_single; older releases (the GPU image's 2.11) *_tensor
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass
class Dispatched:
    """What a dispatch leaves on this rank: one row per (token, local expert) pair, and what combine needs."""

    x: torch.Tensor  # [P, H] the pair's token
    local_ids: torch.Tensor  # [P] int64, the expert's local id on this rank
    weights: torch.Tensor  # [P] fp32, the pair's top-k weight
    state: Any  # the dispatch's bookkeeping for combine


def _pack(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[N, H x esize + 8k] uint8: the rows, their top-k ids (int32) and weights (fp32) side by side."""
    return torch.cat([x.contiguous().view(torch.uint8), ids.to(torch.int32).contiguous().view(torch.uint8),
                      weights.to(torch.float32).contiguous().view(torch.uint8)], dim=1)


def _unpack(buf: torch.Tensor, hidden: int, dtype: torch.dtype, top_k: int):
    xb = hidden * torch.empty((), dtype=dtype).element_size()
    x = buf[:, :xb].contiguous().view(dtype)
    ids = buf[:, xb:xb + 4 * top_k].contiguous().view(torch.int32).long()
    weights = buf[:, xb + 4 * top_k:].contiguous().view(torch.float32)
    return x, ids, weights


class _Dispatch:
    """Shared by the dispatches: the expert placement as device tensors."""

    name = ""
    #: both read exchanged token counts on the host (see the module docstring)
    graph_capturable = False

    def __init__(self, info: GroupInfo, owner: torch.Tensor, to_local: torch.Tensor):
        self.info = info
        self.owner = owner  # [E] int64: owning rank of each global expert
        self.to_local = to_local  # [E] int64: local id on this rank, -1 elsewhere

    def _local_pairs(self, ids: torch.Tensor, weights: torch.Tensor, valid_rows: torch.Tensor | None = None):
        """(row, local expert id, weight) of every top-k slot of `ids` [N, k] whose expert this rank owns."""
        mine = self.owner[ids.clamp_min(0)] == self.info.rank
        if valid_rows is not None:
            mine &= valid_rows.unsqueeze(1)
        row, slot = mine.nonzero(as_tuple=True)
        return row, self.to_local[ids[row, slot]], weights[row, slot]

    def _counts(self, local: int, device) -> list[int]:
        mine = torch.tensor([local], dtype=torch.int64, device=device)
        every = torch.empty(self.info.world, dtype=torch.int64, device=device)
        all_gather(every, mine, group=self.info.group)
        return every.tolist()


class AllGatherReduceScatter(_Dispatch):
    """vLLM's ``allgather_reducescatter``: every rank sees every token; outputs are reduce-scattered back."""

    name = "allgather_reducescatter"

    def dispatch(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> Dispatched:
        tokens, top_k = ids.shape
        counts = self._counts(tokens, x.device)  # ranks may hold different token counts: pad to the largest
        most = max(counts)
        payload = _pack(x, ids, weights)
        if tokens < most:
            payload = torch.cat([payload, payload.new_zeros(most - tokens, payload.shape[1])])
        gathered = payload.new_empty(self.info.world * most, payload.shape[1])
        all_gather(gathered, payload, group=self.info.group)
        every_x, every_ids, every_w = _unpack(gathered, x.shape[1], x.dtype, top_k)
        valid = (torch.arange(most, device=x.device) < torch.tensor(counts, device=x.device).unsqueeze(1)).reshape(-1)
        row, local_ids, pair_w = self._local_pairs(every_ids, every_w, valid)
        return Dispatched(every_x[row], local_ids, pair_w, (row, most, tokens))

    def combine(self, pair_out: torch.Tensor, d: Dispatched) -> torch.Tensor:
        row, most, tokens = d.state
        partial = torch.zeros(self.info.world * most, pair_out.shape[1], dtype=torch.float32, device=pair_out.device)
        partial.index_add_(0, row, pair_out.float())
        out = partial.new_empty(most, pair_out.shape[1], dtype=pair_out.dtype)
        reduce_scatter(out, partial.to(pair_out.dtype), group=self.info.group)
        return out[:tokens]


class AllToAllCounts(_Dispatch):
    """``deepep_high_throughput`` semantics over all_to_all_single: counts first, then only the needed tokens."""

    name = "deepep_high_throughput"

    def dispatch(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> Dispatched:
        tokens, top_k = ids.shape
        world, device = self.info.world, x.device
        wanted = torch.zeros(tokens, world, dtype=torch.bool, device=device)
        wanted.scatter_(1, self.owner[ids], True)  # rank r needs token t when it owns one of t's experts
        dest, send_tokens = wanted.t().nonzero(as_tuple=True)  # sorted by destination rank, then token
        send_counts = wanted.sum(0)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.info.group)
        counts = torch.stack([send_counts, recv_counts]).tolist()
        send_split, recv_split = counts[0], counts[1]
        payload = _pack(x[send_tokens], ids[send_tokens], weights[send_tokens])
        received = payload.new_empty(sum(recv_split), payload.shape[1])
        dist.all_to_all_single(received, payload, recv_split, send_split, group=self.info.group)
        recv_x, recv_ids, recv_w = _unpack(received, x.shape[1], x.dtype, top_k)
        row, local_ids, pair_w = self._local_pairs(recv_ids, recv_w)
        return Dispatched(recv_x[row], local_ids, pair_w, (row, send_tokens, send_split, recv_split, tokens))

    def combine(self, pair_out: torch.Tensor, d: Dispatched) -> torch.Tensor:
        row, send_tokens, send_split, recv_split, tokens = d.state
        hidden = pair_out.shape[1]
        partial = torch.zeros(sum(recv_split), hidden, dtype=torch.float32, device=pair_out.device)
        partial.index_add_(0, row, pair_out.float())
        back = pair_out.new_empty(sum(send_split), hidden)
        dist.all_to_all_single(back, partial.to(pair_out.dtype), send_split, recv_split, group=self.info.group)
        out = torch.zeros(tokens, hidden, dtype=torch.float32, device=pair_out.device)
        out.index_add_(0, send_tokens, back.float())
        return out.to(pair_out.dtype)


#: all2all_backend (vLLM's name) -> the dispatch implementing it
DISPATCHES: dict[str, type[_Dispatch]] = {cls.name: cls for cls in (AllGatherReduceScatter, AllToAllCounts)}
