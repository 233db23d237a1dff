"""`moe-oracle bench` without a GPU: argument handling (every refusal one line naming the argument and the fix, exit
2), the plan of what would be timed, and the table / CSV / overrides writers over given rows. The timing itself
runs on a GPU (benchmarks/gpu_runners.sh)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
import torch

from backends import bench
from oracle import Oracle
from oracle.cli import main

RULES = Path(__file__).resolve().parents[1] / "rules"
SM90 = {"kind": "cuda", "capability": [9, 0]}
GPT_OSS = bench.layer_shape(128, 4, 2880, 2880, "mxfp4", "swigluoai", name="gpt-oss-120b")
DEEPSEEK = bench.layer_shape(256, 8, 7168, 2048, "nvfp4", "silu", name="deepseek-nvfp4")


@pytest.fixture(scope="module")
def oracle() -> Oracle:
    return Oracle(RULES)


def _bench(capsys, *argv: str) -> tuple[int, str]:
    code = main(["bench", *argv])
    return code, capsys.readouterr().err


# --------------------------------------------------------------------------- arguments
@pytest.mark.parametrize("argv, words", [
    (["--shape", "128,4,2880", "--format", "mxfp4"], "--shape '128,4,2880': give four positive integers E,k,H,I"),
    (["--shape", "128,x,2880,2880", "--format", "mxfp4"], "give four positive integers E,k,H,I"),
    (["--shape", "4,8,2880,2880", "--format", "mxfp4"], "top_k=8 exceeds the E=4 experts; give E,k,H,I in that order"),
    (["--shape", "128,4,2880,2000", "--format", "mxfp4"], "I=2000 must be a multiple of 32 (the mxfp4 block size"),
    (["--shape", "128,4,2888,2880", "--format", "nvfp4"], "H=2888 must be a multiple of 16 (the nvfp4 block size"),
    (["--shape", "0,4,2880,2880", "--format", "mxfp4"], "E=0 must be a positive integer"),
    (["--shape", "128,4,2880,2880", "--format", "mxfp4", "--tokens", "1,0"], "--tokens '1,0': give a comma-separated"),
    (["--shape", "128,4,2880,2880", "--format", "mxfp4", "--tokens", ""], "--tokens '': give a comma-separated"),
    (["--shape", "128,4,2880,2880", "--format", "mxfp4", "--iters", "0"], "--iters 0: must be at least 1"),
    (["--shape", "128,4,2880,2880", "--format", "mxfp4", "--profile", "vllm-9"],
     "--profile 'vllm-9': profile: unknown profile 'vllm-9'"),
    (["--shape", "128,4,2880,2880", "--format", "mxfp4", "--also", "moe-oracl"],
     "--also 'moe-oracl': profile: unknown profile 'moe-oracl'"),
    (["--shape", "128,4,2880,2880", "--format", "mxfp4", "--policy", "fp8"],
     "--policy 'fp8': profile vllm-0.33 has no such policy; it has mxfp4"),
    (["--shape", "128,4,2880,2880", "--format", "mxfp4", "--csv", "/nonexistent-dir/x.csv"],
     "--csv /nonexistent-dir/x.csv: directory /nonexistent-dir does not exist"),
    (["--shape", "128,4,2880,2880", "--format", "mxfp4", "--overrides-out", "/nonexistent-dir/o.yaml"],
     "--overrides-out /nonexistent-dir/o.yaml: directory /nonexistent-dir does not exist"),
])
def test_bad_arguments_are_one_line_naming_the_argument(capsys, argv, words):
    code, err = _bench(capsys, *argv)
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("moe-oracle: error: bench: "), err
    assert words in err, err


@pytest.mark.parametrize("argv, words", [
    (["--format", "mxfp4"], "the following arguments are required: --shape"),
    (["--shape", "1,1,32,32", "--format", "fp8"], "argument --format: invalid choice: 'fp8'"),
    (["--shape", "1,1,32,32", "--format", "mxfp4", "--activation", "relu2"], "argument --activation: invalid choice"),
])
def test_argparse_refusals_share_the_style(capsys, argv, words):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("moe-oracle: error: bench: ") and words in err, err


def test_the_output_path_must_not_be_a_directory(capsys, tmp_path):
    code, err = _bench(capsys, "--shape", "128,4,2880,2880", "--format", "mxfp4", "--csv", str(tmp_path))
    assert code == 2 and "is a directory; give a file name" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible: the no-GPU message cannot show")
def test_without_a_gpu_the_command_says_so_after_checking_the_arguments(capsys, tmp_path):
    code, err = _bench(capsys, "--shape", "128,4,2880,2880", "--format", "mxfp4", "--tokens", "1,37",
                       "--csv", str(tmp_path / "x.csv"))
    assert code == 2 and "timing kernels needs a CUDA GPU and torch sees none here" in err
    assert "`moe-oracle select` and `explain` answer the selection question without a GPU" in err
    assert not list(tmp_path.iterdir()), "nothing written"


def test_layer_shape_defaults_follow_the_activation():
    assert (GPT_OSS.gate_up, GPT_OSS.biases) == ("interleaved", True)
    assert (DEEPSEEK.gate_up, DEEPSEEK.biases) == ("contiguous", False)
    with pytest.raises(bench.BenchError, match="--activation 'relu2_no_mul': must be a gated activation"):
        bench.layer_shape(8, 2, 64, 64, "mxfp4", "relu2_no_mul")
    with pytest.raises(bench.BenchError, match="--gate-up 'rows'"):
        bench.layer_shape(8, 2, 64, 64, "mxfp4", "silu", gate_up="rows")


# --------------------------------------------------------------------------- the plan
def _plan(oracle, shape, packages, **kw):
    return {c.backend: c for c in bench.plan(shape, platform=SM90, packages=packages, env={}, oracle=oracle, **kw)}


def test_plan_on_an_h100_with_both_libraries(oracle):
    found = _plan(oracle, GPT_OSS, {"humming": True, "triton_kernels": True, "triton": True})
    assert found["TRITON"].default and found["TRITON"].moe_backend == "auto" and found["TRITON"].profile == "vllm-0.33"
    assert found["HUMMING"].moe_backend == "humming" and found["HUMMING"].not_timed is None
    assert found["TRITON_MOE"].profile == "moe-oracle" and not found["TRITON_MOE"].default
    assert found["EMULATION"].not_timed is None
    assert "MARLIN" in found and "no runner in this project" in found["MARLIN"].not_timed
    assert sum(c.default for c in found.values()) == 1


def test_plan_without_triton_kernels_times_humming_as_the_default_for_nvfp4(oracle):
    found = _plan(oracle, DEEPSEEK, {"humming": True, "triton": True})
    assert found["HUMMING"].default and "TRITON" not in found
    assert set(found) >= {"HUMMING", "TRITON_MOE", "EMULATION"}


def test_plan_lists_each_backend_once_and_only_the_chosen_profile_gives_the_default(oracle):
    found = bench.plan(GPT_OSS, platform=SM90, packages={"triton": True}, env={}, oracle=oracle)
    names = [c.backend for c in found]
    assert len(names) == len(set(names))
    (default,) = [c for c in found if c.default]
    assert (default.profile, default.backend) == ("vllm-0.33", "MARLIN") and default.not_timed
    only = bench.plan(GPT_OSS, platform=SM90, packages={"triton": True}, env={}, oracle=oracle, also=())
    assert {c.profile for c in only} == {"vllm-0.33"}


# --------------------------------------------------------------------------- output over given rows
FACTS = {"gpu": "NVIDIA H100 80GB HBM3", "bandwidth_gbs": 3000.0, "date": "2026-11-26"}


def _rows():
    R = bench.Row
    return [R("vllm-0.33", "TRITON", 1, us=100.0, floor_us=20.0, method="cuda graph", rel_l2=3e-3, default=True),
            R("vllm-0.33", "TRITON", 37, us=400.0, floor_us=200.0, method="cuda graph", rel_l2=3e-3, default=True),
            R("vllm-0.33", "HUMMING", 1, us=80.0, floor_us=20.0, method="cuda graph", rel_l2=2e-3),
            R("vllm-0.33", "HUMMING", 37, us=440.0, floor_us=200.0, method="cuda graph", rel_l2=2e-3),
            R("moe-oracle", "TRITON_MOE", 1, us=50.0, floor_us=20.0, method="cuda graph", rel_l2=2e-3),
            R("moe-oracle", "TRITON_MOE", 37, us=300.0, floor_us=200.0, method="cuda graph", rel_l2=2e-3),
            R("moe-oracle", "EMULATION", 1, us=9000.0, floor_us=20.0, method="eager", rel_l2=0.0),
            R("vllm-0.33", "MARLIN", None, note="not timed: no runner in this project")]


def test_the_table_shows_time_floor_fraction_and_ratio_to_the_default():
    text = bench.render(GPT_OSS, _rows(), FACTS, [1, 37])
    assert "| TRITON (default) | vllm-0.33 | 100.0 (0.20, 1.00x) | 400.0 (0.50, 1.00x) | 3.00e-03 |" in text
    assert "| HUMMING | vllm-0.33 | 80.0 (0.25, 0.80x) | 440.0 (0.45, 1.10x) |" in text
    assert "| EMULATION | moe-oracle | 9000.0 (0.00, 90.00x)* | - |" in text
    assert "MARLIN: not timed: no runner in this project" in text
    assert "EMULATION: * timed eagerly" in text


def test_csv_has_one_row_per_backend_and_t():
    rows = list(csv.DictReader(io.StringIO(bench.csv_text(GPT_OSS, _rows(), FACTS))))
    assert tuple(rows[0]) == bench.CSV_FIELDS and len(rows) == 8
    humming37 = next(r for r in rows if r["backend"] == "HUMMING" and r["tokens"] == "37")
    assert (humming37["us"], humming37["floor_fraction"], humming37["ratio_to_default"]) == ("440.00", "0.455",
                                                                                           "1.100")
    marlin = next(r for r in rows if r["backend"] == "MARLIN")
    assert marlin["us"] == "" and "no runner" in marlin["note"]


def test_overrides_pin_the_profiles_fastest_backend_and_select_reads_them(tmp_path, capsys, oracle):
    path = tmp_path / "pin.yaml"
    bench.write_overrides(str(path), GPT_OSS, _rows(), FACTS, [1, 37], profile="vllm-0.33", policy="mxfp4",
                          model="openai/gpt-oss-*", oracle=oracle)
    text = path.read_text()
    assert "backend: TRITON\n" in text, "TRITON (500 us summed over T) beats HUMMING (520 us)"
    assert "TRITON_MOE" not in text.split("backend:")[1], "a backend of another profile is never pinned"
    assert list(tmp_path.iterdir()) == [path], "no temporary file left"
    code = main(["select", "--profile", "vllm-0.33", "--policy", "mxfp4", "--platform", "cuda:9.0", "--package",
                 "triton_kernels", "--package", "humming", "--overrides", str(path), "--model", "openai/gpt-oss-120b",
                 "--activation", "swigluoai", "--json"])
    out = capsys.readouterr().out
    assert code == 0 and '"backend": "TRITON"' in out and "bench-gpt-oss-120b" in out


def test_overrides_say_when_the_default_pick_was_not_timed(tmp_path, oracle):
    rows = [r for r in _rows() if not (r.backend == "TRITON" and r.tokens == 37)]
    path = tmp_path / "pin.yaml"
    bench.write_overrides(str(path), GPT_OSS, rows, FACTS, [1, 37], profile="vllm-0.33", policy="mxfp4", model=None,
                          oracle=oracle)
    text = path.read_text()
    assert "backend: HUMMING" in text and "the default pick TRITON was not timed at every T" in text
    assert "nan" not in text


def test_overrides_refuse_when_nothing_was_timed_at_every_t(tmp_path):
    rows = [r for r in _rows() if r.profile == "vllm-0.33" and r.tokens != 37]
    with pytest.raises(bench.BenchError, match="no backend of profile vllm-0.33 was timed at every T"):
        bench.write_overrides(str(tmp_path / "o.yaml"), GPT_OSS, rows, FACTS, [1, 37], profile="vllm-0.33",
                              policy="mxfp4", model=None)
    assert not list(tmp_path.iterdir())


def test_bench_outputs_never_write_through_a_planted_symlink(tmp_path):
    """The CSV and overrides writers write as every command-line writer does (oracle.safewrite): a link planted at
    the output path that leaves its directory is refused, naming it, and a link at the temporary name the old
    writer used (<path>.tmp-<pid>) is never followed."""
    import os

    from oracle import OracleError

    out, outside = tmp_path / "out", tmp_path / "outside.txt"
    out.mkdir()
    outside.write_text("precious\n")
    (out / f"t.csv.tmp-{os.getpid()}").symlink_to(outside)
    bench.write_csv(str(out / "t.csv"), GPT_OSS, _rows(), FACTS)
    assert outside.read_text() == "precious\n" and (out / "t.csv").read_text().startswith(",".join(bench.CSV_FIELDS))
    (out / "pin.yaml").symlink_to(outside)
    with pytest.raises(OracleError, match=r"pin.yaml: refusing to write through the symlink"):
        bench.write_overrides(str(out / "pin.yaml"), GPT_OSS, _rows(), FACTS, [1, 37], profile="vllm-0.33",
                              policy="mxfp4", model=None)
    assert outside.read_text() == "precious\n"


def test_progress_bar_rewrites_one_line():
    stream = io.StringIO()
    bar = bench.Progress(4, stream=stream)
    bar.step("TRITON: T=1")
    bar.step("TRITON: T=37")
    bar.close()
    text = stream.getvalue()
    assert text.count("\r") == 2 and "2/4 TRITON: T=37" in text and text.endswith("\n")
