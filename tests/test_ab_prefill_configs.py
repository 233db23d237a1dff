"""benchmarks/ab_prefill_configs.py's --variant grammar: the edits it makes, and one clear error for a bad one."""

from __future__ import annotations

import re

import pytest

from backends.triton_moe import tuning

from conftest import load_benchmark

ab = load_benchmark("ab_prefill_configs")


def test_a_variant_edits_both_gemms_one_gemm_or_the_call():
    name, g1, g2, call = ab.parse_variant("t:tail_rows=16,g1.num_warps=8,g2.half_rows=none,topk_sum=fused")
    assert name == "t" and call == {"topk_sum": "fused"}
    assert g1 == {"tail_rows": 16, "num_warps": 8} and g2 == {"tail_rows": 16, "half_rows": None}
    base = tuning.MoEConfig(tuning.LaunchConfig(128, 64, 64, 8, True, 4, 3, half_rows=True),
                            tuning.LaunchConfig(128, 128, 64, 8, True, 4, 3, half_rows=True), "tables")
    edited = ab.edited(base, name, g1, g2)
    assert (edited.gemm1.num_warps, edited.gemm1.half_rows, edited.gemm2.num_warps, edited.gemm2.half_rows) == \
        (8, True, 4, None)
    assert edited.source == "variant t"


@pytest.mark.parametrize(("text", "message"), [
    ("tail16", r"write NAME:FIELD=VALUE"),
    ("t:warps=8", r"'warps=8' is not FIELD=VALUE with FIELD one of block_m, .*tail_rows, topk_sum"),
    ("t:tail_rows=many", r"'tail_rows=many': the value is not a whole number, true, false or none"),
])
def test_a_bad_variant_is_one_message_naming_it(text, message):
    with pytest.raises(ValueError, match=message):
        ab.parse_variant(text)
    with pytest.raises(SystemExit):
        ab.parse_args(["--out", "x", "--variant", text])


def test_a_variants_environment_is_set_while_it_runs_and_the_processs_own_comes_back(monkeypatch):
    name, g1, g2, call = ab.parse_variant("e:prefill_kernel=warp-specialized,env.MOE_ORACLE_T_A=1,env.MOE_ORACLE_T_B=2")
    assert (g1, g2) == ({}, {}) and call == {"prefill_kernel": "warp-specialized",
                                             "env": {"MOE_ORACLE_T_A": "1", "MOE_ORACLE_T_B": "2"}}
    import os

    monkeypatch.setenv("MOE_ORACLE_T_A", "own")
    monkeypatch.delenv("MOE_ORACLE_T_B", raising=False)
    with pytest.raises(RuntimeError), ab._environment(call["env"]):
        assert (os.environ["MOE_ORACLE_T_A"], os.environ["MOE_ORACLE_T_B"]) == ("1", "2")
        raise RuntimeError  # a failing variant restores them too
    assert os.environ["MOE_ORACLE_T_A"] == "own" and "MOE_ORACLE_T_B" not in os.environ


def test_a_config_naming_the_warp_specialized_prefill_says_so_in_benchmark_rows():
    import dataclasses

    bench_matrix = load_benchmark("bench_matrix")
    tiles = tuning.MoEConfig(tuning.LaunchConfig(128, 64, 64, 8, True, 4, 3, tail_rows=16),
                             tuning.LaunchConfig(128, 128, 64, 8, True, 4, 3, tail_rows=16), "sm90-h200.yaml#7")
    assert bench_matrix.describe(tiles) == "sm90-h200.yaml#7: 128x64x64/128x64 w4/4 s3/3 tail16/16"
    wide = tuning.MoEConfig(dataclasses.replace(tiles.gemm1, wide_tail_rows=32), tiles.gemm2, "t")
    assert bench_matrix.describe(wide) == "t: 128x64x64/128x64 w4/4 s3/3 tail16+32/16"
    ws = dataclasses.replace(tiles, prefill_kernel="warp-specialized")
    assert bench_matrix.describe(ws) == "sm90-h200.yaml#7: 128x64x64/128x64 w4/4 s3/3 tail16/16 + warp-specialized prefill"


def test_balanced_routing_gives_every_expert_the_same_pairs_and_each_token_distinct_experts():
    import torch

    ids, weights = ab.balanced_topk(4096, 128, 4)
    assert ids.shape == (4096, 4) and ids.dtype == torch.int32
    assert torch.equal(torch.bincount(ids.reshape(-1).long(), minlength=128), torch.full((128,), 128))
    assert all(len(set(row)) == 4 for row in ids.tolist())
    assert torch.equal(weights, torch.full((4096, 4), 0.25))


@pytest.mark.parametrize(("argv", "message"), [
    (["--routing", "skewed"], r"--routing: 'skewed' is not one of logits, balanced"),
    (["--rounds", "0"], r"--rounds 0: give 1 or more"),
    (["--routing", "logits,balanced", "--layers", "deepseek-v3", "--tokens", "4100"],
     r"deepseek-v3: --routing balanced: T·k = 4100·8 must be a multiple of the layer's 256 experts .*T a multiple "
     r"of 32"),
])
def test_arguments_the_run_cannot_take_are_one_message_before_any_gpu_work(argv, message, capsys):
    with pytest.raises(SystemExit):
        ab.parse_args(["--out", "x", *argv])
    assert re.search(message, capsys.readouterr().err)


def test_both_routings_are_parsed_in_order():
    assert ab.parse_args(["--out", "x", "--routing", "balanced,logits"]).routing == ["balanced", "logits"]
