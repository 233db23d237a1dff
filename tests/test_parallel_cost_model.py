"""benchmarks/parallel_cost_model.py: the numbers docs/parallel.md quotes come from it, so its pieces are checked."""

from __future__ import annotations

import csv

import pytest

from conftest import load_benchmark

model = load_benchmark("parallel_cost_model")

#: the single-GPU H100 final table of benchmarks/README-moe.md (whole layer µs), which the roofline is calibrated on
H100_TABLE = {
    "gpt-oss-120b": {1: 47.5, 16: 257.7, 64: 556.5, 256: 628.4, 1024: 805.5, 4096: 1949.2},
    "deepseek-v3": {1: 108.7, 16: 898.5, 64: 1938.8, 256: 2226.9, 1024: 2893.5, 4096: 7805.8},
}


def test_the_expert_roofline_reproduces_the_single_gpu_table_within_the_documented_band():
    for name, row in H100_TABLE.items():
        for tokens, measured in row.items():
            predicted = model.predict(model.LAYERS[name], "single", 1, tokens)["total"]
            assert -0.22 <= predicted / measured - 1 <= 0.25, (name, tokens, predicted, measured)


def test_fit_links_recovers_latency_and_bandwidth():
    rows = [{"collective": "all_to_all", "factor_bytes": b, "us": 12.0 + b / (250.0 * 1e3)}
            for b in (1e3, 1e5, 1e7, 1e8)]
    link = model.fit_links(rows)["all_to_all"]
    assert link.latency_us == pytest.approx(12.0, rel=1e-6)
    assert link.busbw_gbs == pytest.approx(250.0, rel=1e-6)


def test_the_all_to_all_moves_less_than_the_all_gather_once_bandwidth_matters():
    layer = model.LAYERS["deepseek-v3"]
    for ranks in (8, 16, 32, 64):
        a2a = model.predict(layer, "deepep_high_throughput", ranks, 4096)
        agrs = model.predict(layer, "allgather_reducescatter", ranks, 4096)
        assert a2a["dispatch"] < agrs["dispatch"] and a2a["combine"] < agrs["combine"]
        assert a2a["experts"] == agrs["experts"]  # the same pairs reach the same experts either way
    # a token's copies: at most top_k ranks, never more than the group
    assert model._distinct_ranks(layer, 64) <= layer.top_k
    assert model._distinct_ranks(layer, 2) <= 2


def test_check_compares_a_run_with_the_model(tmp_path):
    net = model.Network()
    with open(tmp_path / "nccl.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["collective", "factor_bytes", "us"])
        w.writeheader()
        for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
            link = getattr(net, kind)
            w.writerows({"collective": kind, "factor_bytes": b, "us": link.us(b)} for b in (1e3, 1e6, 1e8))
    layer = model.LAYERS["deepseek-v3"]
    p = model.predict(layer, "tp", 2, 64, net=net)
    with open(tmp_path / "steps.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["shape", "mode", "world", "tokens_per_rank", "dispatch_us", "experts_us",
                                          "combine_us", "total_us"])
        w.writeheader()
        w.writerow({"shape": "deepseek-v3", "mode": "tp", "world": 2, "tokens_per_rank": 64,
                    **{f"{k}_us": p[k] * (2 if k == "experts" else 1) for k in ("dispatch", "experts", "combine",
                                                                                   "total")}})
    report = model.check(tmp_path)
    assert "| deepseek-v3 | tp | 64 | combine |" in report and "| 1.00 |" in report
    assert "| deepseek-v3 | tp | 64 | experts |" in report and "| 2.00 |" in report
