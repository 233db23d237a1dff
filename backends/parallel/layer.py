"""`ParallelMoELayer`: one MoE layer sharded over a torch.distributed process group (NCCL on GPUs, gloo on CPU).

    MoEWeights (whole, or this rank's shard) ─ shard ─┐
    group (rank, size) + parallel="tp"|"ep" + all2all_backend ─> scenario.moe.parallel ─oracle─> Decision
                                                      └─ converter, runner (as MoELayer) ─> this rank's MoELayer
    x, router_logits ─ route ─ dispatch ─ local experts ─ combine ─> y

* ``parallel="tp"`` (vLLM's default): every rank holds a slice of I of every expert and the same tokens; the
  question asks for I/size (vLLM's intermediate_size_per_partition), so the rules' rounding applies per rank;
  the partial outputs end in an all-reduce, or a reduce-scatter (`tp_output="reduce_scatter"`: rank r keeps
  rows [r c, (r+1) c) of c = ceil(T/size)). The question's parallel fields are dp_size = ep_size = 1.
* ``parallel="ep"`` (vLLM's ``--enable-expert-parallel`` with data-parallel attention): every rank holds its own
  tokens and E/size experts (or those `expert_placement` gives it); tokens move with the dispatch the scenario's
  all2all_backend names (backends.parallel.dispatch). The question's parallel fields are dp_size = ep_size = size,
  use_ep = true.

Every rank asks the oracle, logs its decision once, and compares the digest of its question, rules and decision
with the other ranks' before any weight is sharded or moved (group.agree): disagreeing ranks or a missing rank are
one clear ParallelConfigError on every rank, never a hang or a wrong answer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from backends.assembly import kernel_assembly
from backends.emulation import GATED_ACTIVATIONS
from backends.layer import (  # the single-device layer's question and answer helpers, shared
    _WEIGHT_KEY,
    DEFAULT_PROFILE,
    MoELayer,
    build_runner,
    check_input,
    checkpoint_policy,
    platform_for_device,
    question_for,
    require_runnable,
    select_logged,
    swiglu_for,
)
from backends.parallel import shard as sharding
from backends.parallel.dispatch import DISPATCHES, Dispatched, reduce_scatter
from backends.parallel.group import DEFAULT_BUILD_TIMEOUT, Arrivals, GroupInfo, ParallelConfigError, agree, group_info
from backends.triton_moe._routing import route  # torch top-k + softmax, the emulation's routing (no triton import)
from backends.weights import MoEWeights
from oracle import default_oracle
from oracle.log import LOGGER_NAME

__all__ = ["DEFAULT_ALL2ALL_BACKEND", "PARALLEL_MODES", "TP_OUTPUTS", "ParallelMoELayer"]

logger = logging.getLogger(LOGGER_NAME)

PARALLEL_MODES = ("tp", "ep")
TP_OUTPUTS = ("all_reduce", "reduce_scatter")
#: vLLM's default --all2all-backend
DEFAULT_ALL2ALL_BACKEND = "allgather_reducescatter"
_logged: set[str] = set()


def _fail(message: str, kind=ParallelConfigError):
    raise kind(f"ParallelMoELayer: {message}")


def _fail_typed(kind, message: str):  # check_input's fail(kind, message) convention
    raise kind(f"ParallelMoELayer: {message}")


class ParallelMoELayer:
    """This rank's part of one MoE layer sharded over a process group; build it with `from_checkpoint`."""

    def __init__(self, *, info: GroupInfo, parallel: str, decision, scenario: Mapping[str, Any], local: MoELayer,
                 num_experts: int, hidden_size: int, intermediate_size: int, top_k: int, renormalize: bool,
                 placement: list[int] | None, all2all_backend: str | None, tp_output: str,
                 arrival_timeout: timedelta | None = None):
        self.info, self.parallel = info, parallel
        self.decision, self.scenario = decision, dict(scenario)
        self.local = local  # this rank's shard as a single-device MoELayer (EP: top_k 1 over the local experts)
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.top_k, self.renormalize = top_k, renormalize
        self.placement, self.all2all_backend, self.tp_output = placement, all2all_backend, tp_output
        self.device = local.device
        self._dispatch = None
        self._arrivals = None if arrival_timeout is None else Arrivals(info, arrival_timeout)
        if parallel == "ep":
            assert placement is not None and all2all_backend is not None
            owner = torch.tensor(placement, dtype=torch.int64, device=self.device)
            to_local = torch.full((num_experts,), -1, dtype=torch.int64, device=self.device)
            mine = sharding.local_experts(placement, info.rank)
            to_local[mine] = torch.arange(len(mine), device=self.device)
            self._dispatch = DISPATCHES[all2all_backend](info, owner, to_local)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_checkpoint(cls, weights: MoEWeights, *, process_group, parallel: str, activation: str, top_k: int,
                        all2all_backend: str | None = None, expert_placement: Sequence[int] | None = None,
                        weights_are_sharded: bool = False, tp_output: str = "all_reduce",
                        profile: str = DEFAULT_PROFILE, platform: Mapping[str, Any] | None = None, device: Any = None,
                        renormalize: bool = True, swiglu_alpha: float | None = None,
                        swiglu_beta: float | None = None, swiglu_limit: float | None = None,
                        policy: str | None = None, moe_backend: str = "auto",
                        packages: Mapping[str, bool] | None = None, env: Mapping[str, str] | None = None,
                        deterministic: bool = False, build_timeout: timedelta = DEFAULT_BUILD_TIMEOUT,
                        arrival_timeout: timedelta | None = None, oracle=None) -> ParallelMoELayer:
        """Ask the oracle with the group's parallel fields, agree with the other ranks, then shard, convert once
        and bind the runner on this rank.

        process_group: the torch.distributed group to shard over (torch.distributed.group.WORLD under torchrun).
        parallel: "tp" (slice I, all-reduce) or "ep" (split the experts, dispatch the tokens).
        all2all_backend (EP): vLLM's name of the dispatch, one of backends.parallel.DISPATCHES (default
        allgather_reducescatter, vLLM's default); it goes into the question, and the rules accept or refuse it.
        expert_placement (EP): the owning rank of each expert (default contiguous: E/size experts per rank).
        weights_are_sharded: `weights` already hold this rank's shard (a checkpoint loader read only this rank's
        tensors): E_local experts of the placement (EP) or I/size (TP).
        tp_output (TP): "all_reduce" (every rank gets y [T, H]) or "reduce_scatter" (sequence-sharded rows).
        build_timeout: how long to wait at build for the other ranks before naming the missing ones.
        arrival_timeout: when set, every forward first checks (through the store) that every rank arrived within
        it, and names the ones that did not (a debugging aid for hangs; it adds a store round trip per step).
        The other arguments are MoELayer.from_checkpoint's; the question describes the whole layer (global E, the
        per-rank I under TP, the real top_k).
        """
        info = group_info(process_group)
        if not isinstance(weights, MoEWeights):
            _fail(f"weights must be a backends.weights.MoEWeights, got {type(weights).__name__}", TypeError)
        if parallel not in PARALLEL_MODES:
            _fail(f"parallel={parallel!r} must be one of {PARALLEL_MODES} ('tp': every rank holds a slice of every "
                  f"expert; 'ep': every rank holds some experts)")
        if tp_output not in TP_OUTPUTS:
            _fail(f"tp_output={tp_output!r} must be one of {TP_OUTPUTS}")
        if activation not in GATED_ACTIVATIONS:
            _fail(f"activation={activation!r} must be one of {GATED_ACTIVATIONS}")
        if parallel == "tp" and (all2all_backend is not None or expert_placement is not None):
            _fail("all2all_backend= and expert_placement= are expert-parallel arguments; drop them or use "
                  "parallel='ep'")
        if all2all_backend is not None and all2all_backend not in DISPATCHES:
            _fail(f"all2all_backend={all2all_backend!r}: backends.parallel implements {sorted(DISPATCHES)} "
                  f"(vLLM's names); pick one of them")

        world = info.world
        experts = weights.E * world if parallel == "ep" and weights_are_sharded and expert_placement is None \
            else weights.E
        inter = weights.I * world if parallel == "tp" and weights_are_sharded else weights.I
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= experts:
            _fail(f"top_k={top_k!r} must be an int in [1, {experts}]", ValueError)
        placement = None
        if parallel == "ep":
            placement = (sharding.contiguous_placement(experts, world) if expert_placement is None
                         else sharding.check_placement(expert_placement, len(expert_placement), world))
            experts = len(placement)
            mine = sharding.local_experts(placement, info.rank)
            if weights_are_sharded and weights.E != len(mine):
                _fail(f"weights_are_sharded=True but this rank holds {weights.E} experts where the placement gives "
                      f"it {len(mine)} ({mine[:8]}...); load exactly this rank's experts, in ascending global id")
            per_rank_inter = inter
        else:
            i0, i1 = sharding.tp_slice(inter, world, info.rank, weights.block_size, weights.format)
            per_rank_inter = i1 - i0

        try:
            device = weights.w13.device if device is None else torch.device(device)
        except (RuntimeError, TypeError) as exc:
            _fail(f"device={device!r} is not a torch device ({exc})", ValueError)
        if platform is None:
            platform = platform_for_device(device)
        if oracle is None:
            oracle = default_oracle()
        fields = ({"dp_size": 1, "ep_size": 1, "use_ep": False} if parallel == "tp" else
                  {"dp_size": world, "ep_size": world, "use_ep": True})
        if parallel == "ep":
            fields["all2all_backend"] = all2all_backend or DEFAULT_ALL2ALL_BACKEND
        policy = policy or checkpoint_policy(oracle, profile, weights)[0]  # the profile's own, from its rules
        question = question_for(oracle, policy=policy, profile=profile, platform=platform, packages=packages,
                                env=env, moe={
            "activation": activation, "is_act_and_mul": True, "moe_backend": moe_backend,
            "routing_method": "Renormalize" if renormalize else "Default",
            "hidden_size": weights.H, "intermediate_size": per_rank_inter, "num_experts": experts, "top_k": top_k,
            "has_bias": weights.w13_bias is not None or weights.w2_bias is not None,
            "weight_key": _WEIGHT_KEY[weights.format], "activation_key": None, "parallel": fields})
        decision = select_logged(oracle, question)
        chosen = fields.get("all2all_backend")
        snapshot = oracle.snapshot.profile_sources(profile)[0]
        rules = [list(key[1:]) for key in snapshot[2]] if snapshot is not None else None
        summary = {k: getattr(decision, k) for k in ("outcome", "backend", "kernel", "converter", "runner",
                                                       "hidden_size", "intermediate_size", "error")}
        agree(info, {"question": question, "rules": rules, "decision": summary,
                     "placement": placement, "all2all_backend": chosen,
                     "weights": [weights.format, weights.gate_up, str(weights.w13.dtype), weights.H, inter,
                                 experts, weights.w13_bias is not None, weights.w2_bias is not None]},
              timeout=build_timeout)
        assembly = kernel_assembly(oracle, decision, question)
        require_runnable(oracle, decision, question, assembly=assembly)
        line = (f"moe-oracle: rank {info.rank}/{world} {parallel}{f' ({chosen})' if chosen else ''}: "
                f"{decision.backend} / {decision.kernel}, I per rank {decision.intermediate_size or per_rank_inter}")
        if line not in _logged:  # once per distinct decision, as backends.layer logs (not once per layer)
            _logged.add(line)
            logger.info("%s", line)

        # only now do weights move: shard, then convert this rank's part once
        if not weights_are_sharded:
            weights = (sharding.ep_shard(weights, mine) if parallel == "ep"
                       else sharding.tp_shard(weights, world, info.rank))
        if weights.w13.device != device:
            weights = weights.replace(**{name: value.to(device) for name in weights.__dataclass_fields__
                                         if isinstance(value := getattr(weights, name), torch.Tensor)})
        device = weights.w13.device
        hidden, padded_inter = decision.hidden_size or weights.H, decision.intermediate_size or weights.I
        swiglu = swiglu_for(decision, activation, swiglu_alpha=swiglu_alpha, swiglu_beta=swiglu_beta,
                            swiglu_limit=swiglu_limit)
        local_top_k = top_k if parallel == "tp" else 1  # EP: each dispatched (token, expert) pair is one row
        kernel_weights, runner = build_runner(decision, weights, hidden=hidden, inter=padded_inter,
                                              activation=activation, top_k=local_top_k, renormalize=renormalize,
                                              swiglu=swiglu, deterministic=deterministic, assembly=assembly)
        local = MoELayer(decision=decision, scenario=question, weights=weights, kernel_weights=kernel_weights,
                         runner=runner, top_k=local_top_k, renormalize=renormalize, activation=activation,
                         device=device, assembly=assembly)
        return cls(info=info, parallel=parallel, decision=decision, scenario=question, local=local,
                   num_experts=experts, hidden_size=weights.H, intermediate_size=inter, top_k=top_k,
                   renormalize=renormalize, placement=placement, all2all_backend=chosen, tp_output=tp_output,
                   arrival_timeout=arrival_timeout)

    # ------------------------------------------------------------------ running, step by step
    def route(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(topk_ids, topk_weights) [T, top_k] of this rank's tokens, exactly as the single-device layer routes."""
        return route(router_logits, self.top_k, self.renormalize)

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        """EP: bring each (token, expert) pair to this rank when it owns the expert. TP: every rank has the tokens."""
        if self._dispatch is None:
            return Dispatched(x, topk_ids, topk_weights, None)
        return self._dispatch.dispatch(x, topk_ids, topk_weights)

    def experts(self, d: Dispatched) -> torch.Tensor:
        """This rank's experts on what the dispatch left here: TP [T, H] partial sums, EP [P, H] weighted pairs."""
        if self._dispatch is None:
            return self.local.forward(d.x, topk_ids=d.local_ids, topk_weights=d.weights)
        return self.local.forward(d.x, topk_ids=d.local_ids.unsqueeze(1), topk_weights=d.weights.unsqueeze(1))

    def combine(self, out: torch.Tensor, d: Dispatched | None) -> torch.Tensor:
        """EP: sum each token's pairs back on its rank. TP: all-reduce (or reduce-scatter) the partial sums."""
        if self._dispatch is not None:
            assert d is not None, "expert parallel: pass what dispatch returned"
            return self._dispatch.combine(out, d)
        if self.tp_output == "all_reduce":
            dist.all_reduce(out, group=self.info.group)
            return out
        tokens, world = out.shape[0], self.info.world
        chunk = -(-tokens // world)
        if chunk * world != tokens:
            out = torch.cat([out, out.new_zeros(chunk * world - tokens, out.shape[1])])
        mine = out.new_empty(chunk, out.shape[1])
        reduce_scatter(mine, out.contiguous(), group=self.info.group)
        start = self.info.rank * chunk
        return mine[:max(0, min(tokens - start, chunk))]

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor | None = None, *,
                topk_ids: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
        """y for this rank's tokens x [T, H] (TP: the same x on every rank). A collective: every rank of the group
        calls it, each with its own tokens (any count, zero included)."""
        check_input(x, self.hidden_size, self.device, _fail_typed)
        if router_logits is not None:
            if topk_ids is not None or topk_weights is not None:
                _fail("pass router_logits OR (topk_ids and topk_weights), not both", ValueError)
            if tuple(router_logits.shape) != (x.shape[0], self.num_experts):
                _fail(f"router_logits.shape={tuple(router_logits.shape)} must be ({x.shape[0]}, {self.num_experts}) "
                      f"= (tokens of x, global experts)", ValueError)
            if self._dispatch is None:  # TP: the runner routes, as on one device (fused on the Triton kernels)
                if self._arrivals is not None:
                    self._arrivals(f"forward of {x.shape[0]} tokens")
                return self.combine(self.local.forward(x, router_logits), None)
            topk_ids, topk_weights = self.route(router_logits)
        elif topk_ids is None or topk_weights is None:
            _fail("pass router_logits [T, E], or both topk_ids and topk_weights [T, top_k]", ValueError)
        elif tuple(topk_ids.shape) != (x.shape[0], self.top_k) or tuple(topk_weights.shape) != tuple(topk_ids.shape):
            _fail(f"topk_ids / topk_weights must both be ({x.shape[0]}, {self.top_k}), got "
                  f"{tuple(topk_ids.shape)} / {tuple(topk_weights.shape)}", ValueError)
        if self._arrivals is not None:
            self._arrivals(f"forward of {x.shape[0]} tokens")
        d = self.dispatch(x, topk_ids.long(), topk_weights.float())
        return self.combine(self.experts(d), d)

    __call__ = forward

    def explain(self) -> str:
        where = f"rank {self.info.rank} of {self.info.world} ({self.info.backend})"
        how = (f"tp: I {self.intermediate_size} -> {self.intermediate_size // self.info.world} per rank, "
               f"{self.tp_output}" if self.parallel == "tp" else
               f"ep: {self.local.num_experts} of {self.num_experts} experts here, dispatch {self.all2all_backend}")
        return f"ParallelMoELayer {where}, {how}\n{self.local.explain()}"

    def __repr__(self) -> str:
        return (f"<ParallelMoELayer {self.parallel} rank {self.info.rank}/{self.info.world} "
                f"{self.decision.backend} {self.all2all_backend or self.tp_output}>")
