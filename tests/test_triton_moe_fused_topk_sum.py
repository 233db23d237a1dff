"""The top-k sum folded into GEMM2 (the program whose row draws the last of a (token, column tile)'s k * split_k
tickets sums that tile; tickets zeroed by the alignment launch) against topk_sum_kernel, the reference.

The kernel cases run in one `TRITON_INTERPRET=1` subprocess (this file run as a script, one JSON line per case;
see test_triton_moe_interp.py for why). Every buffer the layer takes from torch.empty is poisoned there (NaN, or a
large integer), so an unzeroed ticket (no row draws k * split_k - 1: y keeps NaN) or a sum that runs before all
slices are stored (it reads NaN) shows up in the output. The interpreter runs programs one after the other, so
these cases prove the bits and the zeroing; concurrency is the CUDA cases' part.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="triton is not installed; the Triton MoE kernels cannot run")

from test_triton_moe_fused_split import _inputs, _Poisoned, _same_bits

from conftest import interpreter_worker_rows, requires_cuda
from tolerances import w4a16_vs_emulation

ENV = "MOE_ORACLE_TRITON_TOPK_SUM"

# name -> (format, E, k, H, I, activation, biases, T, (gemm1 split_k, gemm2 split_k, gemm2 block_n), routing,
# alignment path). H = 192 with GEMM2 BLOCK_N = 64: three column tiles per token (32: six; 128: a masked tail);
# I = 64 in 2 or 3 GEMM2 slices of K_SPLIT = BLOCK_K = 64: all slices but the first are empty (zeros still summed).
BIT_CASES = {
    "mxfp4-bias-split2-logits": ("mxfp4", 4, 2, 192, 64, "swigluoai", True, 3, (2, 2, 64), "logits", None),
    "nvfp4-nosplit-ids-one-program": ("nvfp4", 4, 2, 192, 64, "silu", False, 5, (1, 1, 64), "ids", "one-program"),
    "mxfp4-split3-multi-program": ("mxfp4", 8, 3, 192, 64, "silu", False, 6, (2, 3, 32), "ids", "multi-program"),
    "nvfp4-bias-split2-torch-align": ("nvfp4", 4, 2, 192, 64, "swigluoai", True, 3, (1, 2, 128), "ids", "torch"),
}


def _config(split1: int, split2: int, block_n2: int):
    from backends.triton_moe import tuning

    return tuning.MoEConfig(
        tuning.LaunchConfig(16, 32, 64, 1, True, 4, 2, split_k=split1,
                            split_epilogue="fused" if split1 > 1 else None),
        tuning.LaunchConfig(16, block_n2, 64, 1, False, 4, 2, split_k=split2), "test")


def _layer(topk_sum, x, weights, route, act, config, align_path=None, env=None):
    """(output, launched kernel names) of one poisoned moe_forward call."""
    import os

    from backends.triton_moe import _kernels, _routing, moe_forward

    names = ("gemm1_act_kernel", "gemm1_split_epilogue_kernel", "gemm2_kernel", "topk_sum_kernel")
    log: list = []
    reals = {name: getattr(_kernels, name) for name in names}

    class Spy:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            launch = reals[self.name][grid]

            def run(*args, **kwargs):
                log.append(self.name + ("[sums]" if kwargs.get("LAST_PAIR_SUMS") else ""))
                return launch(*args, **kwargs)

            return run

    limits = (_routing.SMALL_ALIGN_PAIRS, _routing.MULTI_ALIGN_PAIRS)
    if align_path == "multi-program":
        _routing.SMALL_ALIGN_PAIRS = 0
    elif align_path == "torch":
        _routing.SMALL_ALIGN_PAIRS = _routing.MULTI_ALIGN_PAIRS = 0
    saved_env = os.environ.pop(ENV, None)
    if env is not None:
        os.environ[ENV] = env
    try:
        for name in names:
            setattr(_kernels, name, Spy(name))
        with _Poisoned():
            out = moe_forward(x, weights, **route, **act, config=config, topk_sum=topk_sum)
    finally:
        for name in names:
            setattr(_kernels, name, reals[name])
        _routing.SMALL_ALIGN_PAIRS, _routing.MULTI_ALIGN_PAIRS = limits
        os.environ.pop(ENV, None)
        if saved_env is not None:
            os.environ[ENV] = saved_env
    return out, log


def _compare_paths(spec, seed) -> dict:
    """Folded vs launched top-k sum on one input: same output bits, the launches each makes, and the folded output
    against the emulation."""
    from backends import emulation

    ckpt, weights, x, route, act = _inputs(spec[:8] + (1,) + spec[9:], seed)
    config, path = _config(*spec[8]), spec[10]
    ref_out, ref_launches = _layer("launch", x, weights, route, act, config, path)
    out, launches = _layer("fused", x, weights, route, act, config, path)
    stats = w4a16_vs_emulation(out, emulation.moe_forward(x, **ckpt, **route, **act))
    return {"same_output": _same_bits(out, ref_out), "launches": launches, "ref_launches": ref_launches, **stats}


def _check_order() -> dict:
    """Inputs whose top-k sum shows the order: experts 0 and 1 are the same expert, token t routes to 0, 1, 2 with
    weights 1, -1, 2^-30, so its pair rows are P, -P (exactly) and a small t. From zero in the order j = 0, 1, 2:
    (P - P) + t = t; any order that adds t before the two cancel loses it to rounding (0 or a residue of P)."""
    import torch

    from backends.layouts.triton_moe import to_kernel_layout

    spec = ("mxfp4", 4, 3, 128, 64, "silu", False, 3, 1, "ids", None)
    ckpt, _weights, x, _route, act = _inputs(spec, 23)
    for name in ("w13", "w13_scale", "w2", "w2_scale"):
        ckpt[name][1] = ckpt[name][0]
    weights = to_kernel_layout(**ckpt)
    route = {"topk_ids": torch.tensor([[0, 1, 2]] * 3, dtype=torch.int32),
             "topk_weights": torch.tensor([[1.0, -1.0, 2.0**-30]] * 3)}
    config = _config(1, 1, 64)
    ref_out, _ = _layer("launch", x, weights, route, act, config)
    out, launches = _layer("fused", x, weights, route, act, config)
    return {"same_output": _same_bits(out, ref_out), "launches": launches,
            "small_term_kept": bool((ref_out != 0).any()) and bool(torch.isfinite(ref_out.float()).all())
            and float(ref_out.float().abs().max()) < 1e-3}


def _check_switch() -> dict:
    """The keyword wins over the environment variable, which wins over the default (the launched sum)."""
    spec = ("nvfp4", 4, 2, 128, 64, "silu", False, 2, 1, "ids", None)
    _ckpt, weights, x, route, act = _inputs(spec, 7)
    config = _config(2, 2, 64)
    return {"launches": {name: _layer(keyword, x, weights, route, act, config, env=env)[1]
                         for name, keyword, env in [("env-launch", None, "launch"), ("env-fused", None, "fused"),
                                                    ("keyword-over-env", "launch", "fused"),
                                                    ("default", None, None)]}}


CHECKS = {"order": _check_order, "switch": _check_switch}
LAUNCHED = ["gemm1_act_kernel", "gemm2_kernel", "topk_sum_kernel"]
FOLDED = ["gemm1_act_kernel", "gemm2_kernel[sums]"]


@pytest.fixture(scope="module")
def worker() -> dict:
    return interpreter_worker_rows(__file__, drop_env=(ENV, "MOE_ORACLE_TRITON_SPLIT_EPILOGUE"))


@pytest.mark.parametrize("case", sorted(BIT_CASES))
def test_folded_topk_sum_gives_the_launched_bits(worker, case):
    row = worker[case]
    assert "error" not in row, row.get("error")
    assert row["ref_launches"] == LAUNCHED, row
    assert row["launches"] == FOLDED, "the folded path must skip topk_sum_kernel"
    assert row["same_output"], "the output differs from the launched top-k sum's"
    assert row["finite"] and row["rel_l2_ratio"] <= 1.0 and row["elementwise_ratio"] <= 1.0, row


def test_folded_topk_sum_adds_pairs_in_fixed_order(worker):
    row = worker["order"]
    assert "error" not in row, row.get("error")
    assert row["small_term_kept"], "the inputs must be order-sensitive: the launched sum keeps the small pair"
    assert row["launches"] == FOLDED, row
    assert row["same_output"], "the folded sum is not j = 0, 1, 2 from zero"


def test_topk_sum_switch_env_and_keyword(worker):
    row = worker["switch"]
    assert "error" not in row, row.get("error")
    assert row["launches"] == {"env-launch": LAUNCHED, "env-fused": FOLDED, "keyword-over-env": LAUNCHED,
                               "default": LAUNCHED}


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gpt-oss-120b", "deepseek-v3"])
def test_cuda_folded_topk_sum_gives_the_launched_bits(name):
    """Same output as the launched sum, 5 folded runs each (poisoned allocations), at T = 1, 4 (route + align in one
    launch) and 64, with GEMM2 split 1, 2 and 4."""
    import torch
    from test_triton_moe_fused_split import _cuda_layer

    from backends.triton_moe import tuning

    shape, weights, act = _cuda_layer(name)
    gen = torch.Generator("cuda").manual_seed(1)
    for split2 in (1, 2, 4):
        config = tuning.MoEConfig(tuning.LaunchConfig(16, 64, 128, 1, True, 2, 3, split_k=4, split_epilogue="fused"),
                                  tuning.LaunchConfig(16, 64, 128, 1, True, 2, 3, split_k=split2), "test")
        for tokens in (1, 4, 64):
            x = torch.randn(tokens, shape.hidden_size, device="cuda", generator=gen).bfloat16()
            route = {"router_logits": torch.randn(tokens, shape.experts, device="cuda", generator=gen),
                     "top_k": shape.top_k}
            ref_out, ref_launches = _layer("launch", x, weights, route, act, config)
            assert ref_launches[-1] == "topk_sum_kernel", ref_launches
            for _ in range(5):
                out, launches = _layer("fused", x, weights, route, act, config)
                assert launches == ["gemm1_act_kernel", "gemm2_kernel[sums]"], launches
                assert _same_bits(out, ref_out), f"T={tokens}, split {split2}: folded bits differ"


@requires_cuda
@pytest.mark.gpu
def test_cuda_folded_topk_sum_graph_replays_zero_their_tickets():
    """Captured and replayed with new inputs: every replay matches the launched sum on them - each replay's
    alignment zeroes GEMM2's tickets again."""
    import torch
    from test_triton_moe_fused_split import _cuda_layer, assert_replays_match_launch

    from backends.triton_moe import moe_forward, tuning

    shape, weights, act = _cuda_layer("gpt-oss-120b")
    config = tuning.MoEConfig(tuning.LaunchConfig(16, 64, 128, 1, True, 2, 3, split_k=4, split_epilogue="fused"),
                              tuning.LaunchConfig(16, 64, 128, 1, True, 2, 3, split_k=4), "test")
    x = torch.randn(1, shape.hidden_size, device="cuda").bfloat16()
    logits = torch.randn(1, shape.experts, device="cuda")

    def run(topk_sum):
        return moe_forward(x, weights, router_logits=logits, top_k=shape.top_k, **act, config=config,
                           topk_sum=topk_sum)

    assert_replays_match_launch(run, x, logits)


if __name__ == "__main__":  # the worker: TRITON_INTERPRET=1 is set by the fixture above
    from test_triton_moe_fused_split import print_worker_rows

    print_worker_rows(BIT_CASES, CHECKS, _compare_paths)
