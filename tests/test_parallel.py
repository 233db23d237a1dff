"""Tensor- and expert-parallel MoE layers on 2 CPU processes (gloo, emulation backend) equal the single-device layer.

One spawn of two ranks runs every case and saves what each rank got (outputs, routing, or the error it raised);
the tests then compare against a single-device MoELayer on the same weights and tokens, built here. Spawning
once keeps the file to one torch start-up per rank (the whole file is ~10-20 s on two busy cores); every
collective runs under a 60 s process-group timeout and the spawn under a hard deadline, so nothing hangs.
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from random_weights import random_moe_weights

from backends import MoELayer, emulation
from backends.weights import MoEWeights
from oracle import Oracle

from tolerances import tolerance

RULES = Path(__file__).resolve().parents[1] / "rules"
CPU = {"kind": "cpu"}
WORLD = 2
SPAWN_DEADLINE_S = 120
FP32_TOL = tolerance("fp32_reordered")

#: small layers with each model's conventions: gpt-oss (MXFP4, interleaved gate/up, biases, SwiGLU, renormalized
#: top-k) and DeepSeek-like (NVFP4 with per-expert global scales, [w1; w3], SiLU, softmax then top-k)
SHAPES = {
    "mxfp4-gpt-oss": dict(fmt="mxfp4", gate_up="interleaved", bias=True, activation="swigluoai", renormalize=True,
                          experts=8, hidden=64, inter=128, top_k=2),
    "nvfp4-deepseek": dict(fmt="nvfp4", gate_up="contiguous", bias=False, activation="silu", renormalize=False,
                           experts=8, hidden=64, inter=64, top_k=4),
}
#: mode -> ParallelMoELayer.from_checkpoint arguments
MODES = {
    "tp": dict(parallel="tp"),
    "tp-reduce-scatter": dict(parallel="tp", tp_output="reduce_scatter"),
    "ep-allgather-reducescatter": dict(parallel="ep", all2all_backend="allgather_reducescatter"),
    "ep-all-to-all": dict(parallel="ep", all2all_backend="deepep_high_throughput"),
}
#: (tokens on rank 0, tokens on rank 1, routing): "random" logits; "rank0-experts": every token's experts live on
#: rank 0 under EP (rank 1 receives nothing); "split": each token's experts all live on one rank, both ranks used
TOKENS = [(1, 1, "random"), (64, 64, "random"), (4096, 4096, "random"), (5, 0, "random"),
          (16, 16, "rank0-experts"), (16, 16, "split")]


def checkpoint(fmt, gate_up, bias, experts, hidden, inter, seed=0, **_) -> MoEWeights:
    """A case's layer, from its fields (the extra fields of a case are the parallel settings)."""
    return random_moe_weights(fmt, gate_up, experts=experts, hidden=hidden, inter=inter, bias=bias, seed=seed)


@functools.cache
def tokens(shape_name: str, count: int, routing: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x fp32 [count, H], router logits [count, E]) for one rank; the routing kinds push the logits of the
    experts of one half of the layer (rank 0's or rank 1's under a contiguous placement) far above the rest."""
    shape = SHAPES[shape_name]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(count, shape["hidden"], generator=g)
    logits = torch.randn(count, shape["experts"], generator=g)
    half = shape["experts"] // 2
    if routing == "rank0-experts":
        logits[:, :half] += 20
    elif routing == "split":
        logits[0::2, :half] += 20
        logits[1::2, half:] += 20
    return x, logits


def rank_tokens(mode: str, t0: int, t1: int, rank: int) -> tuple[int, int]:
    """(count, seed) of a rank's tokens: TP ranks all hold rank 0's (replicated), EP ranks their own."""
    return (t0, 100) if MODES[mode]["parallel"] == "tp" or rank == 0 else (t1, 101)


def case_tokens(shape_name: str, mode: str, t0: int, t1: int, routing: str, rank: int):
    count, seed = rank_tokens(mode, t0, t1, rank)
    return tokens(shape_name, count, routing, seed)


def correctness_cases() -> list[tuple]:
    cases = [(s, m, t0, t1, r, None) for s in SHAPES for m in MODES for t0, t1, r in TOKENS]
    # a given placement: rank 1 holds 5 of 8 experts, interleaved with rank 0's
    cases += [(s, "ep-all-to-all", 33, 7, "random", [0, 1, 1, 0, 1, 1, 0, 1]) for s in SHAPES]
    return cases


def _case_id(case) -> str:
    s, m, t0, t1, r, placement = case
    return f"{s}-{m}-{t0}+{t1}-{r}" + ("-placement" if placement else "")


# ---------------------------------------------------------------------------------------------- the two ranks
def _build(weights, shape, oracle, group, **kw):
    from backends.parallel import ParallelMoELayer
    return ParallelMoELayer.from_checkpoint(
        weights, process_group=group, activation=shape["activation"], top_k=shape["top_k"],
        renormalize=shape["renormalize"], platform=CPU, packages={}, env={}, oracle=oracle, **kw)


def _error(exc: BaseException) -> dict:
    return {"error": type(exc).__name__, "message": str(exc)}


def _bad_input_cases(rank: int, oracle: Oracle, edited: dict, group) -> dict:
    """Each case: what this rank got when building (an error, normally)."""
    import torch.distributed as dist

    from backends.parallel import group as group_module

    gpt = SHAPES["mxfp4-gpt-oss"]
    out = {}

    def attempt(name, fn):
        try:
            fn()
            out[name] = {"error": None}
        except Exception as exc:  # noqa: BLE001 - the test inspects what each rank raised
            out[name] = _error(exc)

    w = checkpoint(**gpt)
    attempt("ep-experts-not-divisible",
            lambda: _build(checkpoint(**{**gpt, "experts": 5}), gpt, oracle, group, parallel="ep"))
    attempt("tp-shard-breaks-block",
            lambda: _build(checkpoint(**{**gpt, "inter": 96}), gpt, oracle, group, parallel="tp"))
    attempt("no-process-group", lambda: _build(w, gpt, oracle, None, parallel="tp"))
    attempt("ranks-disagree-on-shapes",
            lambda: _build(checkpoint(**{**gpt, "inter": 128 if rank == 0 else 64}), gpt, oracle, group,
                           parallel="ep"))
    attempt("ranks-disagree-on-rules",
            lambda: _build(w, gpt, oracle if rank == 0 else edited["why"], group, parallel="ep"))
    attempt("rules-refuse-the-dispatch",
            lambda: _build(w, gpt, edited["no_a2a"], group, parallel="ep", all2all_backend="deepep_high_throughput"))
    attempt("unknown-dispatch", lambda: _build(w, gpt, oracle, group, parallel="ep", all2all_backend="pplx"))
    # rank 1 skips a forward (as if it were stuck elsewhere): rank 0 names it instead of waiting in a collective
    def stuck():
        layer = _build(w, gpt, oracle, group, parallel="ep", arrival_timeout=timedelta(seconds=2))
        layer(*tokens("mxfp4-gpt-oss", 3, "random", 5)) if rank == 0 else time.sleep(3)
    attempt("rank-late-for-forward", stuck)
    dist.barrier(group)
    # the last case: rank 1 never builds (as if it had crashed); rank 0 names it after the build timeout
    if rank == 0:
        attempt("rank-missing", lambda: _build(w, gpt, oracle, group, parallel="ep",
                                               build_timeout=timedelta(seconds=3)))
    else:
        group_module.next_build(tuple(range(WORLD)))  # stay in step with rank 0's store keys
        out["rank-missing"] = {"error": None}
        time.sleep(4)  # keep the store's host alive while rank 0 waits
    dist.barrier(group)
    return out


def _worker(rank: int, port: int, out_dir: str, rules_dirs: dict) -> None:
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    group = dist.group.WORLD
    oracle = Oracle(RULES)
    edited = {name: Oracle(path) for name, path in rules_dirs.items()}
    results: dict = {"correct": {}, "bad": {}}
    built: dict = {}
    for case in correctness_cases():
        shape_name, mode, t0, t1, routing, placement = case
        shape = SHAPES[shape_name]
        key = (shape_name, mode, tuple(placement) if placement else None)
        try:
            if key not in built:
                kw = dict(MODES[mode])
                if placement:
                    kw["expert_placement"] = placement
                built[key] = _build(checkpoint(**shape), shape, oracle, group, **kw)
            layer = built[key]
            x, logits = case_tokens(shape_name, mode, t0, t1, routing, rank)
            ids, weights = layer.route(logits)
            results["correct"][_case_id(case)] = {"y": layer(x, logits), "ids": ids, "weights": weights,
                                                  "explain": layer.explain().splitlines()[0]}
        except Exception as exc:  # noqa: BLE001 - recorded; the test names it
            results["correct"][_case_id(case)] = _error(exc)
    # an already-sharded checkpoint (a per-rank loader's output) builds the same layer
    from backends.parallel.shard import ep_shard, local_experts, tp_shard
    for shape_name, shape in SHAPES.items():
        full = checkpoint(**shape)
        for mode, part in (("tp", tp_shard(full, WORLD, rank)),
                           ("ep-all-to-all", ep_shard(full, local_experts([e * WORLD // shape["experts"]
                                                                             for e in range(shape["experts"])], rank)))):
            name = f"presharded-{shape_name}-{mode}"
            try:
                layer = _build(part, shape, oracle, group, weights_are_sharded=True, **MODES[mode])
                x, logits = case_tokens(shape_name, mode, 9, 3, "random", rank)
                results["correct"][name] = {"y": layer(x, logits)}
            except Exception as exc:  # noqa: BLE001
                results["correct"][name] = _error(exc)
    # rules that pad the emulation like the Triton kernels: the rounding applies to the per-rank I (NVFP4 64 / 2 =
    # 32 -> 64), as vLLM rounds intermediate_size_per_partition
    shape = SHAPES["nvfp4-deepseek"]
    try:
        layer = _build(checkpoint(**shape), shape, edited["padded"], group, parallel="tp")
        x, logits = case_tokens("nvfp4-deepseek", "tp", 9, 9, "random", rank)
        results["correct"]["padded-tp"] = {"y": layer(x, logits), "asked": layer.scenario["moe"]["intermediate_size"],
                                           "padded": layer.local.padded_intermediate_size}
    except Exception as exc:  # noqa: BLE001
        results["correct"]["padded-tp"] = _error(exc)
    results["bad"] = _bad_input_cases(rank, oracle, edited, group)
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _edited_rules(root: Path, name: str, old: str, new: str, count: int = 1) -> str:
    target = root / name
    shutil.copytree(RULES, target)
    path = target / "moe-oracle" / "w4a16.yaml"
    text = path.read_text()
    assert text.count(old) == count, f"the fixture's anchor {old!r} moved; update it"
    path.write_text(text.replace(old, new))
    return str(target)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """What each of the two ranks got, for every case."""
    import torch.multiprocessing as mp
    root = tmp_path_factory.mktemp("parallel")
    rules_dirs = {
        "why": _edited_rules(root, "why", "gated experts (what MoEWeights models)",
                             "gated experts (edited on one rank)"),
        "no_a2a": _edited_rules(root, "no_a2a", "in: [allgather_reducescatter, deepep_high_throughput]",
                                "in: [allgather_reducescatter]"),
        "padded": _edited_rules(root, "padded", "- {backends: [TRITON_MOE, TRITON_MOE_W4A8], hidden: 64",
                                "- {backends: [TRITON_MOE, TRITON_MOE_W4A8, EMULATION], hidden: 64", count=2),
    }
    ctx = mp.start_processes(_worker, args=(_free_port(), str(root), rules_dirs), nprocs=WORLD, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + SPAWN_DEADLINE_S
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"the two ranks did not finish within {SPAWN_DEADLINE_S} s")
    finally:
        for process in ctx.processes:
            if process.is_alive():
                process.kill()
    return [torch.load(root / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


# ---------------------------------------------------------------------------------------------- the checks
@functools.cache
def _reference(shape_name: str, count: int, routing: str, seed: int) -> torch.Tensor:
    """The single-device layer's output on one rank's tokens (shared by the modes that see the same tokens)."""
    return _single_device(shape_name)(*tokens(shape_name, count, routing, seed))


@functools.cache
def _single_device(shape_name: str) -> MoELayer:
    shape = SHAPES[shape_name]
    return MoELayer.from_checkpoint(checkpoint(**shape), activation=shape["activation"], top_k=shape["top_k"],
                                    renormalize=shape["renormalize"], platform=CPU, packages={}, env={},
                                    oracle=Oracle(RULES))


def _got(ranks, group: str, name: str) -> list[dict]:
    got = [r[group][name] for r in ranks]
    for rank, g in enumerate(got):
        assert g.get("error") is None, f"rank {rank} raised {g['error']}: {g['message']}"
    return got


@pytest.mark.parametrize("case", correctness_cases(), ids=_case_id)
def test_parallel_layer_equals_the_single_device_layer(ranks, case):
    shape_name, mode, t0, t1, routing, _ = case
    shape = SHAPES[shape_name]
    got = _got(ranks, "correct", _case_id(case))
    per_rank = [case_tokens(shape_name, mode, t0, t1, routing, r) for r in range(WORLD)]
    for rank, ((x, logits), g) in enumerate(zip(per_rank, got, strict=True)):
        ids, weights = emulation._route(logits, None, None, shape["top_k"], shape["renormalize"], x.shape[0],
                                        shape["experts"], x.device)
        assert torch.equal(g["ids"], ids), f"rank {rank}: routing differs from the single-device layer's"
        torch.testing.assert_close(g["weights"], weights, **tolerance("exact"))
        count, seed = rank_tokens(mode, t0, t1, rank)
        ref = _reference(shape_name, count, routing, seed)
        if mode == "tp-reduce-scatter":
            chunk = -(-x.shape[0] // WORLD)
            ref = ref[rank * chunk:(rank + 1) * chunk]
        assert g["y"].shape == ref.shape
        torch.testing.assert_close(g["y"], ref, **FP32_TOL)
    if routing == "rank0-experts" and MODES[mode]["parallel"] == "ep":
        assert all(ids.lt(shape["experts"] // 2).all() for ids in (g["ids"] for g in got))


@pytest.mark.parametrize("shape_name", list(SHAPES))
@pytest.mark.parametrize("mode", ["tp", "ep-all-to-all"])
def test_an_already_sharded_checkpoint_builds_the_same_layer(ranks, shape_name, mode):
    got = _got(ranks, "correct", f"presharded-{shape_name}-{mode}")
    for rank, g in enumerate(got):
        count, seed = rank_tokens(mode, 9, 3, rank)
        torch.testing.assert_close(g["y"], _reference(shape_name, count, "random", seed), **FP32_TOL)


def test_the_rules_round_the_per_rank_intermediate_size(ranks):
    got = _got(ranks, "correct", "padded-tp")
    for rank, g in enumerate(got):
        assert (g["asked"], g["padded"]) == (32, 64), f"rank {rank}: asked I={g['asked']}, padded to {g['padded']}"
        count, seed = rank_tokens("tp", 9, 9, rank)
        torch.testing.assert_close(g["y"], _reference("nvfp4-deepseek", count, "random", seed), **FP32_TOL)


def test_each_rank_asks_with_the_groups_parallel_fields(ranks):
    tp = ranks[1]["correct"][_case_id(("mxfp4-gpt-oss", "tp", 1, 1, "random", None))]["explain"]
    ep = ranks[1]["correct"][_case_id(("nvfp4-deepseek", "ep-all-to-all", 1, 1, "random", None))]["explain"]
    assert "rank 1 of 2" in tp and "I 128 -> 64 per rank" in tp
    assert "4 of 8 experts here, dispatch deepep_high_throughput" in ep


BAD = {  # case -> words every rank's message must contain
    "ep-experts-not-divisible": ("E=5", "group size that divides E", "expert_placement="),
    "tp-shard-breaks-block": ("I/2=48", "mxfp4 block", "parallel='ep'"),
    "no-process-group": ("process_group=None", "torchrun", "group.WORLD"),
    "ranks-disagree-on-shapes": ("disagree on the question", "ranks [0] hold", "ranks [1] hold"),
    "ranks-disagree-on-rules": ("disagree on the rules", "same rules"),
    "rules-refuse-the-dispatch": ("deepep_high_throughput is not in [allgather_reducescatter]",),
    "unknown-dispatch": ("all2all_backend='pplx'", "allgather_reducescatter", "deepep_high_throughput"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_parallel_input_is_one_clear_error_on_every_rank(ranks, name):
    messages = []
    for rank, r in enumerate(ranks):
        got = r["bad"][name]
        assert got["error"] is not None, f"rank {rank} built a layer for the bad case {name}"
        for words in BAD[name]:
            assert words in got["message"], f"rank {rank}: {words!r} not in: {got['message']}"
        messages.append(got["message"])
    if name != "rules-refuse-the-dispatch":  # the refusal carries each rank's own trace text; the rest are equal
        assert messages[0] == messages[1] or name.startswith("ranks-disagree")


def test_a_rank_late_for_a_forward_is_named_not_waited_for(ranks):
    got = ranks[0]["bad"]["rank-late-for-forward"]
    assert got["error"] == "ParallelConfigError"
    assert "rank(s) [1]" in got["message"] and "did not reach step 0 (forward of 3 tokens) within 2 s" in got["message"]
    assert ranks[1]["bad"]["rank-late-for-forward"]["error"] is None


def test_a_rank_that_never_builds_is_named_not_waited_for(ranks):
    got = ranks[0]["bad"]["rank-missing"]
    assert got["error"] == "ParallelConfigError"
    assert "rank(s) [1]" in got["message"] and "did not reach the layer build within 3 s" in got["message"]
