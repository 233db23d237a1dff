"""benchmarks/report_matrix.py: one run per cell, the peer cells, and the done-when verdicts from the CSV alone."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from conftest import load_benchmark

report = load_benchmark("report_matrix")

COLUMNS = ("run_id", "date", "gpu", "commit", "shape", "format", "experts", "top_k", "hidden_size",
           "intermediate_size", "tokens", "implementation", "config", "us", "floor_fraction", "note")


def _run(results: Path, run_id: str, date: str, rows: list) -> None:
    d = results / run_id
    d.mkdir(parents=True)
    (d / "environment.json").write_text(json.dumps({"run_id": run_id, "date": date, "gpu": "NVIDIA H100 80GB HBM3",
                                                    "commit": "abcdef12", "bandwidth_gbs": 3000.0,
                                                    "matmul_tflops": 750.0, "humming": "0.1.19"}))
    with open(d / "matrix.csv", "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for shape, tokens, impl, us, note in rows:
            w.writerow({"run_id": run_id, "date": date, "gpu": "NVIDIA H100 80GB HBM3", "commit": "abcdef12",
                        "shape": shape, "format": "mxfp4", "experts": 128, "top_k": 4, "hidden_size": 2880,
                        "intermediate_size": 2880, "tokens": tokens, "implementation": impl, "config": "x#0: tile",
                        "us": us, "floor_fraction": "", "note": note})


def test_cells_come_from_one_run_and_verdicts_follow_the_numbers(tmp_path):
    _run(tmp_path, "a", "2026-01-01", [
        ("gpt-oss-120b", 1, report.FLOOR, "30.0", ""), ("gpt-oss-120b", 1, report.OURS, "50.0", ""),
        ("gpt-oss-120b", 1, report.HEURISTIC, "60.0", ""), ("gpt-oss-120b", 1, "Humming", "49.0", ""),
        ("gpt-oss-120b", 1, "triton_kernels", "", "not timed: output differs"),
        ("gpt-oss-120b", 16, report.FLOOR, "100.0", ""), ("gpt-oss-120b", 16, report.OURS, "103.0", ""),
        ("gpt-oss-120b", 16, "Humming", "101.0", "")])
    _run(tmp_path, "b", "2026-01-02", [  # newer, but fewer implementations at T = 1: run a keeps that cell
        ("gpt-oss-120b", 1, report.FLOOR, "30.0", ""), ("gpt-oss-120b", 1, report.OURS, "10.0", "")])
    data = report.load(tmp_path)
    cell = data["cells"]["H100"][("gpt-oss-120b", 1)]
    assert cell["run"] == "a"
    v = report.verdicts(cell, "gpt-oss-120b", 1)
    assert v == {"beats_peers": False, "heuristic_within_10pct": False, "t1_floor": True}
    # T = 16: Humming 2% faster but at >= 90% of the floor: parity counts
    assert report.verdicts(data["cells"]["H100"][("gpt-oss-120b", 16)], "gpt-oss-120b", 16)["beats_peers"] is True
    text = report.markdown("H100", data)
    assert "wrong output" in text and "49.0 (0.98x)" in text and "| 0 / 1 |" in text


def test_a_w4a8_run_fills_its_own_section_not_the_matrix(tmp_path):
    """bench_w4a8.py's rows (its W4A16 row too) stay out of the matrix's cells: a T only it timed is no column there."""
    _run(tmp_path, "matrix", "2026-01-01", [
        ("gpt-oss-120b", 1, report.FLOOR, "30.0", ""), ("gpt-oss-120b", 1, report.OURS, "50.0", "")])
    _run(tmp_path, "w4a8", "2026-01-02", [
        ("gpt-oss-120b", tokens, impl, us, "") for tokens in (1, 2)
        for impl, us in ((report.FLOOR, "30.0"), (report.OURS, "40.0"), (report.W4A8[0], "45.0"))])
    data = report.load(tmp_path)
    assert set(data["cells"]["H100"]) == {("gpt-oss-120b", 1)}
    assert data["cells"]["H100"][("gpt-oss-120b", 1)]["run"] == "matrix"
    assert {cell: row["run"] for cell, row in data["w4a8"]["H100"].items()} == {
        ("gpt-oss-120b", 1): "w4a8", ("gpt-oss-120b", 2): "w4a8"}
