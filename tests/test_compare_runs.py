"""benchmarks/compare_runs.py: base against changed matrix cells, the --fail-below verdict, and its refusals."""

from __future__ import annotations

import csv

from conftest import load_benchmark

compare_runs = load_benchmark("compare_runs")

COLUMNS = ("run_id", "date", "gpu", "commit", "shape", "tokens", "implementation", "config", "us", "note")
H100 = "NVIDIA H100 80GB HBM3"


def _csv(path, run_id, cells, gpu=H100, implementation=compare_runs.OURS):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for (shape, tokens), us in cells.items():
            w.writerow({"run_id": run_id, "date": "2026-11-28", "gpu": gpu, "commit": f"{run_id}0000000",
                        "shape": shape, "tokens": tokens, "implementation": implementation, "config": "",
                        "us": us, "note": ""})
            w.writerow({"run_id": run_id, "date": "2026-11-28", "gpu": gpu, "commit": f"{run_id}0000000",
                        "shape": shape, "tokens": tokens, "implementation": "memory floor", "config": "",
                        "us": 1.0, "note": ""})
    return path


def test_speedups_per_cell_and_the_threshold(tmp_path, capsys):
    base = _csv(tmp_path / "base.csv", "b", {("gpt-oss-120b", 1): 30.0, ("gpt-oss-120b", 4096): 2000.0,
                                             ("deepseek-v3", 1): 80.0})
    changed = _csv(tmp_path / "head.csv", "h", {("gpt-oss-120b", 1): 31.5, ("gpt-oss-120b", 4096): 1600.0,
                                                ("kimi-k2", 1): 81.0})
    assert compare_runs.main([str(base), str(changed)]) == 0
    out = capsys.readouterr().out
    assert "| gpt-oss-120b | 4096 | 2000.0 | 1600.0 | 1.250 |" in out
    assert "| gpt-oss-120b | 1 | 30.0 | 31.5 | 0.952 |" in out
    assert "2 cells: speed-up 0.952 to 1.250." in out and "1 base cells, 1 changed cells" in out
    assert compare_runs.main([str(base), str(changed), "--fail-below", "0.97"]) == 1
    err = capsys.readouterr().err
    assert "gpt-oss-120b at T = 1 is slower: speed-up 0.952 < 0.97" in err and "4096" not in err
    assert compare_runs.main([str(base), str(changed), "--fail-below", "0.95"]) == 0


def test_out_is_written_whole_and_never_through_a_link_that_leaves(tmp_path, capsys):
    base = _csv(tmp_path / "base.csv", "b", {("gpt-oss-120b", 1): 30.0})
    changed = _csv(tmp_path / "head.csv", "h", {("gpt-oss-120b", 1): 30.0})
    table = tmp_path / "table.md"
    assert compare_runs.main([str(base), str(changed), "--out", str(table)]) == 0
    assert "| gpt-oss-120b | 1 | 30.0 | 30.0 | 1.000 |" in table.read_text()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.md").write_text("keep")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "table.md").symlink_to(outside / "victim.md")
    assert compare_runs.main([str(base), str(changed), "--out", str(tmp_path / "runs" / "table.md")]) == 2
    assert "refusing to write through the symlink" in capsys.readouterr().err
    assert (outside / "victim.md").read_text() == "keep"


def test_refusals_name_the_file_and_the_fix(tmp_path, capsys):
    base = _csv(tmp_path / "base.csv", "b", {("gpt-oss-120b", 1): 30.0})
    h200 = _csv(tmp_path / "h200.csv", "h", {("gpt-oss-120b", 1): 25.0}, gpu="NVIDIA H200")
    assert compare_runs.main([str(base), str(h200)]) == 2
    assert "compare runs of one GPU" in capsys.readouterr().err
    other = _csv(tmp_path / "other.csv", "o", {("gpt-oss-120b", 1): 25.0}, implementation="Humming")
    assert compare_runs.main([str(base), str(other)]) == 2
    err = capsys.readouterr().err
    assert str(other) in err and "--implementation" in err
    (tmp_path / "notes.csv").write_text("a,b\n1,2\n")
    assert compare_runs.main([str(base), str(tmp_path / "notes.csv")]) == 2
    assert "not a bench_matrix.py CSV" in capsys.readouterr().err
    assert compare_runs.main([str(base), str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv: cannot read it" in capsys.readouterr().err
    disjoint = _csv(tmp_path / "disjoint.csv", "d", {("kimi-k2", 1): 80.0})
    assert compare_runs.main([str(base), str(disjoint)]) == 2
    assert "share no (layer, T) cell" in capsys.readouterr().err
