"""Split-K GEMM1 with the slice sum + activation fused into GEMM1 (the tile's last slice program, per-tile
tickets zeroed by the alignment launch) against the two-launch path (gemm1_split_epilogue_kernel), the reference.

The kernel cases run in one `TRITON_INTERPRET=1` subprocess (this file run as a script, one JSON line per case;
see test_triton_moe_interp.py for why). Every buffer the layer takes from torch.empty is poisoned there (NaN,
or a large integer), so an unzeroed ticket (no program draws SPLIT_K - 1: h stays NaN) or an epilogue that runs
before all slices are stored (it reads NaN) shows up in the output. The interpreter runs programs one after the
other (slices of a tile in order), so these cases prove the bits and the zeroing; concurrency is the GPU's part
(the CUDA cases in test_triton_moe.py run the default, fused, path).
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("triton", reason="triton is not installed; the Triton MoE kernels cannot run")

from conftest import interpreter_worker_rows, requires_cuda
from tolerances import w4a16_vs_emulation

POISON_INT = 0x2A2A2A2A  # far from any ticket count: a ticket left at it never reaches SPLIT_K - 1

# name -> (format, E, k, H, I, activation, biases, T, gemm1 split_k, routing, alignment path)
# H = 192 with 2 slices: K_SPLIT = 128, the second slice half past K; with 4: K_SPLIT = 64, slice 3 empty
# (an even K, 256 in 4 slices, is _check_order's). I = 64 with BLOCK_N = 32: two column
# tiles (two tickets) per row block. The torch alignment path's tickets: _check_alignment_zeroes_tickets.
BIT_CASES = {
    "mxfp4-bias-split2-k-tail": ("mxfp4", 4, 2, 192, 64, "swigluoai", True, 3, 2, "logits", None),
    "mxfp4-split4-empty-slice": ("mxfp4", 4, 2, 192, 64, "silu", False, 3, 4, "logits", None),
    "nvfp4-bias-split2-k-tail": ("nvfp4", 4, 2, 192, 64, "swigluoai", True, 3, 2, "ids", "one-program"),
    "nvfp4-split4-multi-program-align": ("nvfp4", 4, 2, 192, 64, "silu", False, 3, 4, "ids", "multi-program"),
}


def _config(split_k: int):
    from backends.triton_moe import tuning

    return tuning.MoEConfig(tuning.LaunchConfig(16, 32, 64, 1, True, 4, 2, split_k=split_k),
                            tuning.LaunchConfig(16, 64, 64, 1, False, 4, 2), "test")


class _Poisoned:
    """torch.empty returns NaN-filled floats and POISON_INT-filled integers while active."""

    def __enter__(self):
        import torch

        self.real = real = torch.empty

        def poisoned(*args, **kwargs):
            t = real(*args, **kwargs)
            if t.is_floating_point():
                t.fill_(float("nan"))
            elif t.dtype in (torch.int32, torch.int64):
                t.fill_(POISON_INT)
            return t

        torch.empty = poisoned
        return self

    def __exit__(self, *exc):
        import torch

        torch.empty = self.real


class _Spy:
    """Stands in for a kernel of backends.triton_moe._kernels: records each launch (name, LAST_SLICE_ACTIVATES)
    and, for gemm2_kernel, a copy of its input h (the activations GEMM1 wrote), then launches the real kernel."""

    def __init__(self, name, real, log):
        self.name, self.real, self.log = name, real, log

    def __getitem__(self, grid):
        launch = self.real[grid]

        def run(*args, **kwargs):
            self.log.append({"kernel": self.name, "fused": kwargs.get("LAST_SLICE_ACTIVATES"),
                             "h": args[0].clone() if self.name == "gemm2_kernel" else None})
            return launch(*args, **kwargs)

        return run


def _layer(split_epilogue, x, weights, route, act, config, align_path=None, env=None):
    """(output, h, launches) of one poisoned moe_forward call; h is GEMM2's input, launches the kernel names."""
    from backends.triton_moe import _kernels, _routing, moe_forward

    names = ("gemm1_act_kernel", "gemm1_split_epilogue_kernel", "gemm2_kernel")
    log: list = []
    reals = {name: getattr(_kernels, name) for name in names}
    limits = (_routing.SMALL_ALIGN_PAIRS, _routing.MULTI_ALIGN_PAIRS)
    if align_path == "multi-program":
        _routing.SMALL_ALIGN_PAIRS = 0
    elif align_path == "torch":
        _routing.SMALL_ALIGN_PAIRS = _routing.MULTI_ALIGN_PAIRS = 0
    saved_env = os.environ.pop("MOE_ORACLE_TRITON_SPLIT_EPILOGUE", None)
    if env is not None:
        os.environ["MOE_ORACLE_TRITON_SPLIT_EPILOGUE"] = env
    try:
        for name in names:
            setattr(_kernels, name, _Spy(name, reals[name], log))
        with _Poisoned():
            out = moe_forward(x, weights, **route, **act, config=config, split_epilogue=split_epilogue)
    finally:
        for name in names:
            setattr(_kernels, name, reals[name])
        _routing.SMALL_ALIGN_PAIRS, _routing.MULTI_ALIGN_PAIRS = limits
        os.environ.pop("MOE_ORACLE_TRITON_SPLIT_EPILOGUE", None)
        if saved_env is not None:
            os.environ["MOE_ORACLE_TRITON_SPLIT_EPILOGUE"] = saved_env
    h = next(entry["h"] for entry in log if entry["kernel"] == "gemm2_kernel")
    launches = [entry["kernel"] + ("[fused]" if entry["fused"] else "") for entry in log]
    return out, h, launches


def _same_bits(a, b) -> bool:
    import torch

    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def _inputs(spec, seed):
    import torch

    from backends.layouts.triton_moe import to_kernel_layout
    from backends.triton_moe.testing import Shape, activation_kwargs, random_checkpoint

    fmt, e, k, h, i, act, biases, tokens, _split, routing, _path = spec
    shape = Shape("fused-split", fmt, e, k, h, i, act, biases)
    gen = torch.Generator().manual_seed(seed)
    ckpt = random_checkpoint(shape, generator=gen)
    x = torch.randn(tokens, h, generator=gen).bfloat16()
    logits = torch.randn(tokens, e, generator=gen)
    if routing == "logits":
        route = {"router_logits": logits, "top_k": k}
    else:
        ids = torch.topk(logits, k, dim=-1).indices
        route = {"topk_ids": ids.int(), "topk_weights": torch.softmax(torch.rand(tokens, k, generator=gen), -1)}
    return ckpt, to_kernel_layout(**ckpt), x, route, activation_kwargs(shape)


def _compare_paths(spec, seed) -> dict:
    """Fused vs two-launch path on one input: same h (all rows, padding included), same output, the launches
    each path should make, and the fused output against the emulation."""
    from backends import emulation

    ckpt, weights, x, route, act = _inputs(spec, seed)
    config, path = _config(spec[8]), spec[10]
    ref_out, ref_h, ref_launches = _layer("launch", x, weights, route, act, config, path)
    out, h, launches = _layer("fused", x, weights, route, act, config, path)
    stats = w4a16_vs_emulation(out, emulation.moe_forward(x, **ckpt, **route, **act))
    return {"same_output": _same_bits(out, ref_out), "same_h": _same_bits(h, ref_h),
            "launches": launches, "ref_launches": ref_launches, **stats}


def _check_order() -> dict:
    """Inputs whose slice sum shows the order: slice 0 is P, slice 2 exactly -P (slice 0's activations, weights
    with every sign flipped), slices 1 and 3 are 2^-40 smaller (t1, t3). From zero in the order s = 0, 1, 2, 3:
    P + t1 rounds to P, P - P = 0, 0 + t3 = t3: h comes from slice 3 alone. Reversed or pairwise ((P + t1) +
    (-P + t3)) it is 0; other orders keep t1 + t3 or 0 - never the fixed order's bits."""
    import torch

    from backends.layouts.triton_moe import to_kernel_layout

    spec = ("mxfp4", 4, 1, 256, 64, "silu", False, 3, 4, "logits", None)
    ckpt, _weights, x, route, act = _inputs(spec, 21)
    ckpt["w13"][:, :, 64:96] = ckpt["w13"][:, :, 0:32] ^ 0x88  # K 128..191: K 0..63 with both signs flipped
    ckpt["w13_scale"][:, :, 4:6] = ckpt["w13_scale"][:, :, 0:2]
    x[:, 128:192] = x[:, 0:64]
    x[:, 64:128] = (x[:, 64:128].float() * 2.0**-40).bfloat16()
    x[:, 192:] = (x[:, 192:].float() * 2.0**-40).bfloat16()
    weights = to_kernel_layout(**ckpt)
    config = _config(4)
    ref_out, ref_h, _ = _layer("launch", x, weights, route, act, config)
    out, h, launches = _layer("fused", x, weights, route, act, config)
    return {"same_output": _same_bits(out, ref_out), "same_h": _same_bits(h, ref_h), "launches": launches,
            "small_slices_kept": bool((ref_out != 0).any()) and bool(torch.isfinite(ref_out.float()).all())}


def _check_consecutive_calls() -> dict:
    """Two fused calls in a row (new inputs and routing, the same layer): the second matches its two-launch run
    (without the alignment zeroing its tickets would start where the first call left them, had the allocator
    not poisoned them anyway), the first the emulation."""
    from backends import emulation

    spec = BIT_CASES["mxfp4-bias-split2-k-tail"]
    ckpt, weights, x1, route1, act = _inputs(spec, 4)
    _, _, x2, route2, _ = _inputs(spec, 5)
    config = _config(2)
    first, _, first_launches = _layer("fused", x1, weights, route1, act, config)
    out, h, launches = _layer("fused", x2, weights, route2, act, config)
    ref_out, ref_h, _ = _layer("launch", x2, weights, route2, act, config)
    stats = w4a16_vs_emulation(first, emulation.moe_forward(x1, **ckpt, **route1, **act))
    return {"same_output": _same_bits(out, ref_out), "same_h": _same_bits(h, ref_h),
            "launches": [first_launches, launches], "first_ok": stats["finite"] and stats["rel_l2_ratio"] <= 1.0
            and stats["elementwise_ratio"] <= 1.0}


def _check_switch() -> dict:
    """The keyword wins over the environment variable, which wins over the config's gemm1.split_epilogue, which
    wins over the default (the two-launch path)."""
    import dataclasses

    from backends.triton_moe import tuning

    spec = ("nvfp4", 4, 1, 128, 64, "silu", False, 2, 2, "ids", None)
    _ckpt, weights, x, route, act = _inputs(spec, 7)
    config = _config(2)
    fused_config = tuning.MoEConfig(dataclasses.replace(config.gemm1, split_epilogue="fused"), config.gemm2, "test")
    runs = {}
    for name, keyword, env, cfg in [("env-launch", None, "launch", fused_config), ("env-fused", None, "fused", config),
                                    ("keyword-over-env", "launch", "fused", config),
                                    ("config-fused", None, None, fused_config), ("default", None, None, config)]:
        runs[name] = _layer(keyword, x, weights, route, act, cfg, env=env)[2]
    return {"launches": runs}


def _check_alignment_zeroes_tickets() -> dict:
    """Every alignment path returns tickets_per_block * num_blocks zeroed tickets (poisoned allocations), and
    no tickets for tickets_per_block = 0."""
    import torch

    from backends.triton_moe import _kernels, _routing

    gen = torch.Generator().manual_seed(13)
    wrong = []
    for tokens, experts, k, block_m, per_block in [(1, 128, 4, 16, 45), (5, 8, 2, 16, 3), (200, 16, 2, 32, 7)]:
        logits = torch.randn(tokens, experts, generator=gen)
        ids = torch.topk(logits, k, dim=-1).indices.int()
        with _Poisoned():
            results = {path: _routing.align(ids, experts, block_m, _kernels, path=path, tickets_per_block=per_block)
                       for path in _routing.ALIGN_PATHS}
            results["route-and-align"] = _routing.route_and_align(logits, k, True, experts, block_m, _kernels,
                                                                  per_block)[2]
            results["none"] = _routing.align(ids, experts, block_m, _kernels, path="one-program")
        for path, al in results.items():
            want = 0 if path == "none" else al.num_blocks * per_block
            got = al.tickets
            if (got is None) != (want == 0) or (got is not None and not (
                    got.numel() == want and got.dtype == torch.int32 and bool((got == 0).all()))):
                wrong.append([tokens, experts, k, block_m, path])
    return {"wrong": wrong}


CHECKS = {"order": _check_order, "consecutive": _check_consecutive_calls, "switch": _check_switch,
          "align-tickets": _check_alignment_zeroes_tickets}


@pytest.fixture(scope="module")
def worker() -> dict:
    return interpreter_worker_rows(__file__, drop_env=("MOE_ORACLE_TRITON_SPLIT_EPILOGUE",))


@pytest.mark.parametrize("case", sorted(BIT_CASES))
def test_fused_split_epilogue_gives_the_two_launch_bits(worker, case):
    row = worker[case]
    assert "error" not in row, row.get("error")
    assert row["ref_launches"] == ["gemm1_act_kernel", "gemm1_split_epilogue_kernel", "gemm2_kernel"], row
    assert row["launches"] == ["gemm1_act_kernel[fused]", "gemm2_kernel"], "the fused path must skip the epilogue"
    assert row["same_h"], "h from the fused split epilogue differs from the two-launch path's"
    assert row["same_output"], "the output differs from the two-launch path's"
    assert row["finite"] and row["rel_l2_ratio"] <= 1.0 and row["elementwise_ratio"] <= 1.0, row


def test_fused_split_epilogue_sums_slices_in_fixed_order(worker):
    row = worker["order"]
    assert "error" not in row, row.get("error")
    assert row["small_slices_kept"], "the inputs must be order-sensitive: the two-launch path keeps slices 2-3"
    assert row["launches"] == ["gemm1_act_kernel[fused]", "gemm2_kernel"], row
    assert row["same_h"] and row["same_output"], "the fused sum is not s = 0, 1, 2, 3 from zero"


def test_fused_split_epilogue_consecutive_calls(worker):
    row = worker["consecutive"]
    assert "error" not in row, row.get("error")
    fused = ["gemm1_act_kernel[fused]", "gemm2_kernel"]
    assert row["launches"] == [fused, fused], row["launches"]
    assert row["first_ok"], "the first call must match the emulation"
    assert row["same_h"] and row["same_output"], "the second call must give its two-launch run's bits"


def test_split_epilogue_switch_env_and_keyword(worker):
    row = worker["switch"]
    assert "error" not in row, row.get("error")
    two_launch = ["gemm1_act_kernel", "gemm1_split_epilogue_kernel", "gemm2_kernel"]
    fused = ["gemm1_act_kernel[fused]", "gemm2_kernel"]
    assert row["launches"] == {"env-launch": two_launch, "env-fused": fused, "keyword-over-env": two_launch,
                               "config-fused": fused, "default": two_launch}


def test_alignment_zeroes_the_tickets_on_every_path(worker):
    row = worker["align-tickets"]
    assert "error" not in row, row.get("error")
    assert row["wrong"] == [], f"(T, E, k, BLOCK_M, path) with missing or non-zero tickets: {row['wrong']}"


def _tiny_layer():
    import torch

    from backends.layouts.triton_moe import to_kernel_layout
    from backends.triton_moe.testing import Shape, random_checkpoint

    shape = Shape("tiny", "mxfp4", 4, 2, 64, 64, "silu", False)
    gen = torch.Generator().manual_seed(0)
    weights = to_kernel_layout(**random_checkpoint(shape, generator=gen))
    x = torch.randn(2, 64, generator=gen).bfloat16()
    return x, weights, {"router_logits": torch.randn(2, 4, generator=gen), "top_k": 2, "activation": "silu"}


#: moe_forward's two path switches (keyword, environment variable), both read by forward._forced_choice
PATH_SWITCHES = [("split_epilogue", "MOE_ORACLE_TRITON_SPLIT_EPILOGUE"), ("topk_sum", "MOE_ORACLE_TRITON_TOPK_SUM")]


@pytest.mark.parametrize("keyword, env", PATH_SWITCHES)
@pytest.mark.parametrize("value", ["Fused", "", "two-launch", "1"])
def test_path_switch_env_value_is_parsed_strictly(monkeypatch, keyword, env, value):
    from backends.triton_moe import moe_forward

    x, weights, kw = _tiny_layer()
    monkeypatch.setenv(env, value)
    with pytest.raises(ValueError) as info:
        moe_forward(x, weights, **kw)
    message = str(info.value)
    assert env in message and repr(value) in message, message
    assert "'fused'" in message and "'launch'" in message, message


@pytest.mark.parametrize("keyword, env", PATH_SWITCHES)
@pytest.mark.parametrize("value", ["Launch", "auto", 1])
def test_path_switch_keyword_is_parsed_strictly(monkeypatch, keyword, env, value):
    from backends.triton_moe import moe_forward

    x, weights, kw = _tiny_layer()
    monkeypatch.setenv(env, "fused")
    with pytest.raises(ValueError) as info:
        moe_forward(x, weights, **kw, **{keyword: value})
    message = str(info.value)
    assert f"{keyword}={value!r}" in message and "'fused'" in message and "'launch'" in message, message


@pytest.mark.parametrize("argument", ["tickets_per_block", "extra_tickets"])
@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_align_ticket_counts_must_be_counts(argument, value):
    import torch

    from backends.triton_moe import _routing

    with pytest.raises(ValueError, match=argument):
        _routing.align(torch.zeros(2, 2, dtype=torch.int32), 4, 16, path="torch", **{argument: value})


def test_launch_refuses_tickets_sized_for_another_config():
    """The alignment's tickets must cover GEMM1's grid exactly: a mismatch is one clear error before any launch."""
    import torch

    from backends.triton_moe import _kernels, _routing, forward

    x, weights, _kw = _tiny_layer()  # TritonMoEWeights: I = 64
    ids = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    config = _config(2)  # gemm1 BLOCK_N = 32: I = 64 has 2 column tiles per row block
    al = _routing.align(ids, 4, 16, path="torch", tickets_per_block=1)
    with pytest.raises(ValueError, match=r"holds 4 tickets but GEMM1 launches 8 ticketed tiles"):
        forward._launch(_kernels, x, weights, al, torch.full((2, 2), 0.5), torch.empty_like(x), config, "silu",
                        (1.702, 1.0, 7.0), False, False, tickets_per_block=1)


# --------------------------------------------------------------------------------------------
# CUDA: concurrent slice programs (the last to arrive is whichever finishes last), real layer sizes
# --------------------------------------------------------------------------------------------

def _cuda_layer(name):
    import torch

    from backends.layouts.triton_moe import to_kernel_layout
    from backends.triton_moe.testing import SHAPES, activation_kwargs, random_checkpoint

    shape = SHAPES[name]
    ckpt = random_checkpoint(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    return shape, to_kernel_layout(**ckpt), activation_kwargs(shape)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("split_k", [2, 4, 8])
@pytest.mark.parametrize("name", ["gpt-oss-120b", "deepseek-v3"])
def test_cuda_fused_split_epilogue_gives_the_two_launch_bits(name, split_k):
    """Same h and output as the two-launch path, 5 fused runs each (poisoned allocations), at T = 1, 4, 8
    (route + align in one launch) and 64 (one-program or multi-program alignment)."""
    import torch

    from backends.triton_moe import tuning

    shape, weights, act = _cuda_layer(name)
    config = tuning.MoEConfig(tuning.LaunchConfig(16, 64, 128, 1, True, 4, 4, split_k=split_k),
                              tuning.LaunchConfig(16, 32, 128, 1, False, 4, 3, split_k=2), "test")
    gen = torch.Generator("cuda").manual_seed(split_k)
    for tokens in (1, 4, 8, 64):
        x = torch.randn(tokens, shape.hidden_size, device="cuda", generator=gen).bfloat16()
        route = {"router_logits": torch.randn(tokens, shape.experts, device="cuda", generator=gen),
                 "top_k": shape.top_k}
        ref_out, ref_h, _ = _layer("launch", x, weights, route, act, config)
        for _ in range(5):
            out, h, launches = _layer("fused", x, weights, route, act, config)
            assert launches == ["gemm1_act_kernel[fused]", "gemm2_kernel"], launches
            assert _same_bits(h, ref_h) and _same_bits(out, ref_out), f"T={tokens}: fused bits differ"


@requires_cuda
@pytest.mark.gpu
def test_cuda_fused_split_epilogue_graph_replays_zero_their_tickets():
    """Captured (the capture being the fused path's first call on its stream) and replayed with new inputs:
    every replay matches the two-launch path on them - each replay's alignment zeroes its tickets again."""
    import torch

    from backends.triton_moe import moe_forward, tuning

    shape, weights, act = _cuda_layer("gpt-oss-120b")
    config = tuning.MoEConfig(tuning.LaunchConfig(16, 64, 128, 1, True, 4, 4, split_k=4),
                              tuning.LaunchConfig(16, 32, 128, 1, False, 4, 3), "test")
    x = torch.randn(4, shape.hidden_size, device="cuda").bfloat16()
    logits = torch.randn(4, shape.experts, device="cuda")

    def run(split_epilogue):
        return moe_forward(x, weights, router_logits=logits, top_k=shape.top_k, **act, config=config,
                           split_epilogue=split_epilogue)

    assert_replays_match_launch(run, x, logits)


def assert_replays_match_launch(run, x, logits) -> None:
    """run("fused") captured as a CUDA graph (its first call on the stream compiles outside the capture), replayed on
    new x and logits written in place: each replay equals run("launch") on those inputs, bit for bit."""
    import torch

    run("fused")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run("fused")
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        logits.copy_(torch.randn_like(logits))
        graph.replay()
        torch.cuda.synchronize()
        assert _same_bits(captured, run("launch")), "a replay differs from the launched path on its inputs"


def print_worker_rows(bit_cases: dict, checks: dict, compare_paths) -> None:
    """The interpreter worker's output: one JSON row per case (compare_paths(spec, seed) for a bit case, the check's
    own dict otherwise), an exception reported as that case's row so that each test shows its own failure."""
    import traceback

    for case_name in [*bit_cases, *checks]:
        try:
            if case_name in checks:
                result = checks[case_name]()
            else:
                result = compare_paths(bit_cases[case_name], seed=len(case_name))
        except Exception:  # noqa: BLE001  report and keep going: each test shows its own case's failure
            result = {"error": traceback.format_exc()[-3000:]}
        print(json.dumps({"case": case_name, **result}), flush=True)


if __name__ == "__main__":  # the worker: TRITON_INTERPRET=1 is set by the fixture above
    print_worker_rows(BIT_CASES, CHECKS, _compare_paths)
