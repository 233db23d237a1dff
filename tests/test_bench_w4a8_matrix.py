"""benchmarks/bench_w4a8_matrix.py's CPU dry run writes matrix.csv rows that report_matrix.py shows in its W4A8
section, and the section's issue-32 verdicts follow the numbers."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module(name: str):
    sys.path[:0] = [str(ROOT / "benchmarks")]
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up by name
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_dry_run_rows_and_the_report_section(tmp_path):
    bench, report = _module("bench_w4a8_matrix"), _module("report_matrix")
    out = tmp_path / "dry"
    assert bench.main(["--dry-run", "--out", str(out), "--iters", "1", "--tokens", "1,16"]) == 0
    with open(out / "matrix.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == bench.COLUMNS  # bench_matrix's format
    impls = {(r["shape"], r["tokens"], r["implementation"]) for r in rows}
    for shape in bench.LAYERS:
        for tokens in ("1", "16"):
            for impl in (bench.OURS, *bench.W4A8.values(), bench.FLOOR, bench.MATMUL, bench.FP8_MATMUL):
                assert (shape, tokens, impl) in impls
    w4a8 = [r for r in rows if r["implementation"] in bench.W4A8.values()]
    assert all(r["us"] and "rel L2 vs emulation 0.0e+00" in r["note"] and "dry run" in r["note"] for r in w4a8)
    assert set(bench.W4A8.values()) == set(report.W4A8) and bench.FP8_MATMUL == report.FP8_MATMUL
    data = report.load(tmp_path)
    text = report.markdown("CPU", data)
    assert "## W4A8 (FP8 activations) beside W4A16" in text and "| this project W4A8 mxfp8 |" in text


def test_w4a8_verdicts_follow_the_numbers(tmp_path):
    report = _module("report_matrix")
    d = tmp_path / "run"
    d.mkdir()
    (d / "environment.json").write_text('{"run_id": "r", "date": "2026-11-26", "gpu": "NVIDIA H100", '
                                        '"commit": "abcdef12", "bandwidth_gbs": 3000.0, "matmul_tflops": 750.0}')
    rows = [(4096, report.OURS, "1000"), (4096, report.W4A8[0], "500"), (4096, report.W4A8[1], "700"),
            (4096, report.FP8_MATMUL, "300"), (16, report.OURS, "100"), (16, report.W4A8[0], "120"),
            (16, report.W4A8[1], "90"), (16, report.FP8_MATMUL, "1")]
    with open(d / "matrix.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ("run_id", "date", "gpu", "commit", "shape", "format", "experts", "top_k",
                               "hidden_size", "intermediate_size", "tokens", "implementation", "config", "us",
                               "floor_fraction", "note"))
        w.writeheader()
        for tokens, impl, us in rows:
            w.writerow({"run_id": "r", "date": "2026-11-26", "gpu": "NVIDIA H100", "commit": "abcdef12",
                        "shape": "gpt-oss-120b", "format": "mxfp4", "experts": 128, "top_k": 4, "hidden_size": 2880,
                        "intermediate_size": 2880, "tokens": tokens, "implementation": impl, "us": us})
    text = report.markdown("H100", report.load(tmp_path))
    assert "| T ≥ 4096: W4A8 ≥ 1.6x W4A16 | 1 / 2 |" in text  # 2.00x holds, 1.43x does not
    assert "| T ≥ 4096: W4A8 ≥ 0.55 of FP8 scaled_mm | 1 / 2 |" in text  # 0.60 holds, 0.43 does not
    assert "| T ≤ 256: W4A8 no slower than W4A16 | 1 / 2 |" in text
    assert "500.0 (2.00x; 0.60)" in text
