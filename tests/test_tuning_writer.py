"""Writing tuning tables: T ranges around measured Ts, merging by shape and T range (never by text), the atomic
write, the maintainers' sweep merge, the tune command's table, and the candidate sets' validity."""

from __future__ import annotations

import json

import pytest

from backends.model_shapes import MATRIX, SHAPES
from backends.triton_moe import tuning
from backends.triton_moe.tuning import writer
from backends.triton_moe.tuning.candidates import sweep_candidates

from conftest import load_benchmark


def test_token_ranges_cover_every_t_once():
    ranges = writer.token_ranges([16, 1, 4, 4])
    assert ranges == [(1, 2), (3, 8), (9, None)]


def _launch(bn=64):
    return {"block_m": 16, "block_n": bn, "block_k": 64, "group_m": 1, "swap_ab": True, "num_warps": 4,
            "num_stages": 3}


def _table(entries):
    return {"table": "triton-moe-tuning", "version": 1, "arch": "sm90", "gpu": "H100", "why": "t", "entries": entries}


def test_merge_replaces_overlapping_entries_of_the_same_shape_only():
    shape = SHAPES["gpt-oss-120b"].fields()
    other = SHAPES["glm-4.5"].fields()
    old = [writer.entry(shape, 1, 8, 4, 10.0, "a", _launch(), _launch()),
           writer.entry(shape, 9, None, 16, 20.0, "a", _launch(), _launch()),
           writer.entry(other, 1, None, 1, 5.0, "a", _launch(), _launch())]
    new = [writer.entry(shape, 1, 2, 1, 7.0, "b", _launch(128), _launch(128))]
    merged = writer.merge_entries(_table(old), new)
    tuning.validate_table(merged, "merged")
    assert [e["measured"]["run"] for e in merged["entries"]] == ["a", "a", "b"]
    assert merged["entries"][0]["shape"] == shape and merged["entries"][0]["tokens"] == {"min": 9}


def test_write_is_validated_and_refuses_the_shipped_directory(tmp_path):
    bad = _table([writer.entry(SHAPES["gpt-oss-120b"].fields(), 1, None, 1, 1.0, "r", _launch(),
                               {**_launch(), "block_m": 32})])
    with pytest.raises(tuning.TuningTableError, match=r"entries/0: gemm1.block_m and gemm2.block_m"):
        writer.write_table(tmp_path / "t.yaml", bad)
    assert not (tmp_path / "t.yaml").exists() and not list(tmp_path.glob(".tmp-*"))  # never a partial write
    good = _table([writer.entry(SHAPES["gpt-oss-120b"].fields(), 1, None, 1, 1.0, "r", _launch(), _launch())])
    with pytest.raises(tuning.TuningTableError, match="shipped tables are read-only"):
        writer.write_table(tuning.TABLE_DIR / "mine.yaml", good)
    assert not (tuning.TABLE_DIR / "mine.yaml").exists()


def test_the_schema_beside_a_user_table_is_never_written_through_a_planted_link(tmp_path):
    """write_table puts tuning.schema.json beside the table for editors; a dangling link planted at that name that
    leaves the directory is refused (naming it), and its target is never created."""
    from oracle import OracleError

    good = _table([writer.entry(SHAPES["gpt-oss-120b"].fields(), 1, None, 1, 1.0, "r", _launch(), _launch())])
    tables, outside = tmp_path / "tables", tmp_path / "elsewhere" / "x.json"
    tables.mkdir()
    (tables / "tuning.schema.json").symlink_to(outside)
    with pytest.raises(OracleError, match=r"tuning.schema.json: refusing to write through the symlink"):
        writer.write_table(tables / "h100.yaml", good)
    assert not outside.exists()
    (tables / "tuning.schema.json").unlink()
    writer.write_table(tables / "h100.yaml", good)
    assert json.loads((tables / "tuning.schema.json").read_text()) == json.loads(
        (tuning.TABLE_DIR / "tuning.schema.json").read_text())


def test_the_tune_table_has_one_entry_per_tuned_t_with_both_times():
    from backends.triton_moe.tuning import tune

    shape = SHAPES["glm-4.5"]
    arch = tuning.facts_by_name("sm90")
    rows = []
    for tokens in (1, 64, 4096):
        base = tuning.heuristic_config(arch, 132, tuning.Problem(tokens=tokens, **shape.fields()))
        rows.append({"tokens": tokens, "heuristic": (base.gemm1, base.gemm2), "heuristic_us": 100.0,
                     "best": (base.gemm1, base.gemm2), "best_us": 90.0, "failures": 0})
    table = tune.table_from_tuning(shape, {"gpu": "NVIDIA H100 80GB HBM3", "arch": "sm90", "rows": rows}, "run", None)
    tuning.validate_table(table, "tuned")
    assert table["gpu"] == "H100" and [e["tokens"] for e in table["entries"]] == [
        {"min": 1, "max": 8}, {"min": 9, "max": 512}, {"min": 513}]
    assert all(e["measured"]["heuristic_us"] == 100.0 and e["measured"]["us"] == 90.0 for e in table["entries"])
    assert tune.gpu_table_name("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3.yaml"


def test_a_faster_warp_specialized_prefill_is_named_by_its_entry_and_selected():
    from backends.triton_moe.tuning import tune
    from backends.triton_moe.tuning.tables import config_of

    shape = SHAPES["deepseek-v3"]
    base = tuning.heuristic_config(tuning.facts_by_name("sm90"), 132, tuning.Problem(tokens=16384, **shape.fields()))
    rows = [{"tokens": tokens, "heuristic": (base.gemm1, base.gemm2), "heuristic_us": 100.0,
             "best": (base.gemm1, base.gemm2), "best_us": 90.0, "prefill_kernel": kernels, "failures": 0}
            for tokens, kernels in ((4096, "tiles"), (16384, "warp-specialized"))]
    table = tune.table_from_tuning(shape, {"gpu": "NVIDIA H200", "arch": "sm90", "rows": rows}, "run", None)
    tuning.validate_table(table, "tuned")
    assert ["prefill_kernel" in e for e in table["entries"]] == [False, True]  # the default stays unwritten
    assert [config_of(e, "tuned").prefill_kernel for e in table["entries"]] == ["tiles", "warp-specialized"]


@pytest.mark.parametrize(("arch", "tokens", "runs_here", "times"), [
    ("sm90", 4096, True, True), ("sm90", 1024, True, False), ("sm90", 2, True, False), ("sm80", 4096, True, False),
    ("sm90", 4096, False, False)])
def test_tune_times_the_warp_specialized_kernels_on_sm90_prefill_only(arch, tokens, runs_here, times):
    from backends.triton_moe.tuning import tune

    problem = tuning.Problem(tokens=tokens, **SHAPES["deepseek-v3"].fields())  # 256 experts, top-8: T / 32 rows each
    assert tune.times_warp_specialized(arch, problem, runs_here) is times


@pytest.mark.parametrize("name", MATRIX)
@pytest.mark.parametrize("tokens", [1, 16, 256, 1024, 16384])
def test_every_candidate_is_a_valid_entry(name, tokens):
    problem = tuning.Problem(tokens=tokens, **SHAPES[name].fields())
    base = tuning.heuristic_config(tuning.facts_by_name("sm90"), 132, problem)
    candidates = sweep_candidates(problem, base)
    assert candidates[0] == (base.gemm1, base.gemm2) and len(candidates) == len(set(candidates)) > 5
    entries = [writer.entry(SHAPES[name].fields(), i + 1, i + 1, i + 1, 1.0, "c", tuning.launch_dict(g1),
                            tuning.launch_dict(g2)) for i, (g1, g2) in enumerate(candidates)]
    tuning.validate_table(_table(entries), "candidates")


def test_a_prefill_sweep_times_tail_rows_where_runs_exceed_a_block():
    """tail_rows (and a wide tail) only pays where runs outgrow a 128-row block; a sweep times it there and nowhere
    else."""
    def tails(name, tokens):
        problem = tuning.Problem(tokens=tokens, **SHAPES[name].fields())
        base = tuning.heuristic_config(tuning.facts_by_name("sm90"), 132, problem)
        return {(g.tail_rows, g.wide_tail_rows) for pair in sweep_candidates(problem, base) for g in pair}

    assert tails("gpt-oss-120b", 16384) == {(None, None), (16, None), (32, None), (16, 32)}
    assert tails("deepseek-v3", 256) == {(None, None)}


def test_the_sweep_merge_finds_entries_by_shape_and_t(tmp_path):
    """benchmarks/bench_moe.py --merge-sweep: a faster swept config replaces the entry covering that (shape, T);
    one within min_gain, or a T whose current config the sweep did not time, changes nothing."""
    pytest.importorskip("torch", reason="benchmarks/bench_moe.py imports torch")
    bench = load_benchmark("bench_moe")
    table_path = tuning.TABLE_DIR / "sm90-h200.yaml"
    current = tuning.select_config("sm90", tuning.Gpu("NVIDIA H200", 132),
                                   tuning.Problem(tokens=16384, **SHAPES["gpt-oss-120b"].fields()))
    g1, g2 = tuning.launch_dict(current.gemm1), tuning.launch_dict(current.gemm2)
    faster = {**g1, "num_stages": g1["num_stages"] + 1}
    rows = [{"shape": "gpt-oss-120b", "tokens": 16384, "gemm1": g1, "gemm2": g2, "us": 100.0},
            {"shape": "gpt-oss-120b", "tokens": 16384, "gemm1": faster, "gemm2": g2, "us": 90.0},
            {"shape": "deepseek-v3", "tokens": 1, "gemm1": faster, "gemm2": g2, "us": 1.0}]  # current not timed
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"gpu": "NVIDIA H200", "run": "sweep-x", "rows": rows}))
    out = tmp_path / "merged.yaml"
    changes = bench.merge_sweep(str(sweep), str(table_path), str(out))
    assert [(t, before, after) for t, _, before, after in changes] == [(16384, 100.0, 90.0)]
    merged = tuning.read_table(out)
    hit = [e for e in merged["entries"] if e["measured"]["run"] == "sweep-x"]
    assert len(hit) == 1 and hit[0]["gemm1"] == faster and hit[0]["shape"] == SHAPES["gpt-oss-120b"].fields()
    assert len(merged["entries"]) == len(tuning.shipped_table("sm90-h200.yaml")["entries"])
    rows[1]["us"] = 99.0  # within min_gain (2%)
    sweep.write_text(json.dumps({"gpu": "NVIDIA H200", "rows": rows}))
    assert bench.merge_sweep(str(sweep), str(table_path), str(out)) == []


def test_tunes_report_names_failed_candidates_and_the_warp_specialized_time_or_why_it_failed():
    from backends.triton_moe.tuning import tune

    shape = SHAPES["deepseek-v3"]
    base = tuning.heuristic_config(tuning.facts_by_name("sm90"), 132, tuning.Problem(tokens=16384, **shape.fields()))
    row = {"heuristic": (base.gemm1, base.gemm2), "heuristic_us": 100.0, "best": (base.gemm1, base.gemm2),
           "best_us": 90.0, "candidates": 22}
    result = {"gpu": "NVIDIA H200", "rows": [
        row | {"tokens": 1024, "failures": 0, "ws_us": None, "ws_error": None},
        row | {"tokens": 8192, "failures": 3, "ws_us": 95.5, "ws_error": None, "prefill_kernel": "tiles"},
        row | {"tokens": 16384, "failures": 0, "ws_us": None, "ws_error": "OutOfMemoryError: CUDA out of memory"}]}
    head, plain, timed, failed = tune.report_lines(shape, result)
    assert "on NVIDIA H200" in head and "could not run" not in plain and "warp-specialized" not in plain
    assert timed.endswith("; 3 of 22 tile candidates could not run here; warp-specialized prefill 95.5")
    assert failed.endswith("; warp-specialized prefill failed (OutOfMemoryError: CUDA out of memory); the entry "
                           "keeps the tiles")
