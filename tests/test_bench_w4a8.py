"""benchmarks/bench_w4a8.py: its arguments, its row builders, and its CPU dry run, whose matrix.csv rows
report_matrix.py shows in its W4A8 section (tile-variant rows beside them, out of the tables); the section's issue-32
verdicts follow the numbers."""

from __future__ import annotations

import csv

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_w4a8")


def test_arguments_parse_into_checked_tuples(bench, tmp_path):
    args = bench.parse_args(["--out", str(tmp_path), "--shapes", "deepseek-v3", "--tokens", "1,4096",
                             "--schemes", "mxfp8", "--variants", "swap-bk128,plain-64x128x128-w4"])
    assert args.layers == ("deepseek-v3",) and args.tokens == (1, 4096) and args.schemes == ("mxfp8",)
    assert args.variants == ("swap-bk128", "plain-64x128x128-w4") and not args.dry_run
    defaults = bench.parse_args(["--out", str(tmp_path)])
    assert defaults.tokens == bench.TOKENS and defaults.layers == bench.LAYERS and defaults.variants == ()
    assert defaults.schemes == ("mxfp8", "fp8_per_tensor_static")
    assert bench.parse_args(["--out", str(tmp_path), "--dry-run"]).tokens == bench.DRY_RUN_TOKENS


@pytest.mark.parametrize(("argv", "says"), [
    (["--variants", "swap-bk64"], "--variants: swap-bk64 not known"),
    (["--schemes", "fp8"], "--schemes: fp8 not known"),
    (["--layers", "llama"], "--layers: llama not known"),
    (["--tokens", "1,x"], "--tokens: '1,x' is not a comma-separated list"),
    (["--tokens", "0"], "--tokens and --iters must be at least 1"),
])
def test_bad_arguments_get_one_message_and_exit_2(bench, tmp_path, capsys, argv, says):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--out", str(tmp_path), *argv])
    assert exc.value.code == 2 and says in capsys.readouterr().err


def test_an_existing_run_directory_is_refused(bench, tmp_path, capsys):
    (tmp_path / "matrix.csv").write_text("")
    with pytest.raises(SystemExit):
        bench.parse_args(["--out", str(tmp_path)])
    assert "already holds a matrix.csv" in capsys.readouterr().err


def test_no_gpu_is_one_line_and_exit_2(bench, tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA device" in err and "--dry-run" in err
    assert not (tmp_path / "run").exists()


def test_rows_at_put_w4a16_first_and_variants_from_4096_on(bench):
    schemes, variants = ("mxfp8", "fp8_per_tensor_static"), ("swap-bk128",)
    small = bench.runs_at(256, schemes, variants)
    assert [r.implementation for r in small] == [bench.OURS, *bench.W4A8_SCHEMES.values()]
    large = bench.runs_at(bench.VARIANT_MIN_TOKENS, schemes, variants)
    assert large[:3] == small and [(r.implementation, r.scheme, r.variant) for r in large[3:]] == [
        ("this project W4A8 mxfp8 [swap-bk128]", "mxfp8", "swap-bk128"),
        ("this project W4A8 fp8 static [swap-bk128]", "fp8_per_tensor_static", "swap-bk128")]


def test_warp_specialized_fp8_rows_ask_for_tensor_core_sums_from_ws_min_tokens(bench):
    schemes = ("mxfp8", "fp8_per_tensor_static")
    assert not any(r.warp_specialized for r in bench.runs_at(bench.WS_MIN_TOKENS - 1, schemes, (), ws_fp8_dots=True))
    ws = [r for r in bench.runs_at(bench.WS_MIN_TOKENS, schemes, (), ws_fp8_dots=True) if r.warp_specialized]
    assert [r.implementation for r in ws] == [f"{name} [fp8 dots, warp-specialized]"
                                              for name in bench.W4A8_SCHEMES.values()]
    assert all(r.mma == "fp8" for r in ws)
    assert ws[0].call() == {"prefill_kernel": "warp-specialized", "fp8_accumulate": "tensor-core"}
    assert bench.Run(bench.OURS).call() == {}


def test_bound_rows_and_the_w4a8_note(bench):
    env = {"bandwidth_gbs": 2000.0, "matmul_tflops": 600.0, "scaled_mm_tflops": 1200.0}
    rows = bench.bound_rows(100, 4, 1000, 500, 3, 2_000_000, env)
    flop = 6 * 100 * 4 * 1000 * 500
    assert [impl for impl, _, _ in rows] == [bench.FLOOR, bench.MATMUL, bench.FP8_MATMUL]
    assert rows[0][1] == pytest.approx(3 * 2_000_000 / 2e6) and rows[0][2] == "3 experts touched"
    assert rows[1][1] == pytest.approx(flop / 600e6) and rows[2][1] == pytest.approx(flop / 1200e6)
    assert "(1200 TFLOP/s)" in rows[2][2]
    assert bench.bound_rows(1, 1, 1, 1, 1, 1, {**env, "scaled_mm_tflops": 0.0})[2][1] is None
    assert bench.w4a8_note(1.5e-3, 50.0, 100.0, 10.0) == "rel L2 vs emulation 1.5e-03; 2.00x W4A16; 0.20 of FP8 scaled_mm"
    assert bench.w4a8_note(1.5e-3, 50.0, None, None) == "rel L2 vs emulation 1.5e-03"


def test_dry_run_rows_and_the_report_section(bench, tmp_path, monkeypatch):
    report = load_benchmark("report_matrix")
    monkeypatch.setattr(bench, "VARIANT_MIN_TOKENS", 16)  # variant rows at the dry run's small T
    out = tmp_path / "dry"
    assert bench.main(["--dry-run", "--out", str(out), "--iters", "1", "--tokens", "1,16",
                       "--variants", "swap-bk128"]) == 0
    with open(out / "matrix.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    from bench_matrix import COLUMNS

    assert tuple(rows[0]) == COLUMNS  # bench_matrix's format
    impls = {(r["shape"], r["tokens"], r["implementation"]) for r in rows}
    for shape in bench.LAYERS:
        for tokens in ("1", "16"):
            for impl in (bench.OURS, *bench.W4A8_SCHEMES.values(), bench.FLOOR, bench.MATMUL, bench.FP8_MATMUL):
                assert (shape, tokens, impl) in impls
        assert (shape, "16", "this project W4A8 mxfp8 [swap-bk128]") in impls
        assert (shape, "1", "this project W4A8 mxfp8 [swap-bk128]") not in impls
    w4a8 = [r for r in rows if r["implementation"].startswith(report.W4A8)]
    assert all(r["us"] and "rel L2 vs emulation 0.0e+00" in r["note"] and "dry run" in r["note"] for r in w4a8)
    assert all(r["config"].startswith("variant swap-bk128: ") for r in w4a8 if "[" in r["implementation"])
    data = report.load(tmp_path)
    text = report.markdown("CPU", data)
    assert "## W4A8 (FP8 activations) beside W4A16" in text and "| this project W4A8 mxfp8 |" in text
    assert "[swap-bk128]" not in text


def test_variant_rows_do_not_pick_the_run_of_a_matrix_cell(tmp_path):
    """A W4A8 run with many variant rows must not outscore the matrix run of the same cell."""
    report = load_benchmark("report_matrix")
    header = ("run_id", "date", "gpu", "commit", "shape", "format", "experts", "top_k", "hidden_size",
              "intermediate_size", "tokens", "implementation", "config", "us", "floor_fraction", "note")
    for run, date, impls in (("matrix", "2026-11-26", (report.OURS, "Humming")),
                             ("w4a8", "2026-11-27", (report.OURS, report.W4A8[0], f"{report.W4A8[0]} [a]",
                                                     f"{report.W4A8[1]} [a]", f"{report.W4A8[0]} [b]"))):
        d = tmp_path / run
        d.mkdir()
        (d / "environment.json").write_text(f'{{"run_id": "{run}", "date": "{date}"}}')
        with open(d / "matrix.csv", "w", newline="") as f:
            w = csv.DictWriter(f, header)
            w.writeheader()
            for impl in impls:
                w.writerow({"run_id": run, "gpu": "NVIDIA H100", "shape": "gpt-oss-120b", "tokens": 4096,
                            "implementation": impl, "us": "100"})
    data = report.load(tmp_path)
    assert data["cells"]["H100"][("gpt-oss-120b", 4096)]["run"] == "matrix"
    assert data["w4a8"]["H100"][("gpt-oss-120b", 4096)]["run"] == "w4a8"


def test_w4a8_verdicts_follow_the_numbers(tmp_path):
    report = load_benchmark("report_matrix")
    d = tmp_path / "run"
    d.mkdir()
    (d / "environment.json").write_text('{"run_id": "r", "date": "2026-11-26", "gpu": "NVIDIA H100", '
                                        '"commit": "abcdef12", "bandwidth_gbs": 3000.0, "matmul_tflops": 750.0}')
    rows = [(4096, report.OURS, "1000"), (4096, report.W4A8[0], "500"), (4096, report.W4A8[1], "700"),
            (4096, report.FP8_MATMUL, "300"), (16, report.OURS, "100"), (16, report.W4A8[0], "120"),
            (16, report.W4A8[1], "90"), (16, report.FP8_MATMUL, "1"), (4096, report.MATMUL, "690"),
            (16384, report.OURS, "1000"), (16384, report.MATMUL, "710"), (16384, report.W4A8[0], "400"),
            (16384, report.W4A8_SHOWN[2], "500")]
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
    # 2.00x and 2.50x hold, 1.43x does not; the warp-specialized row's 2.00x counts too
    assert "| T ≥ 4096: W4A8 ≥ 1.6x W4A16 | 3 / 4 |" in text
    assert "| this project W4A8 mxfp8 [fp8 dots, warp-specialized] | - | - | 500.0 (2.00x) |" in text
    assert "fp8 static [fp8 dots, warp-specialized]" not in text  # a row with no cell is left out
    assert "| T ≥ 4096: W4A8 ≥ 0.55 of FP8 scaled_mm | 1 / 2 |" in text  # 0.60 holds, 0.43 does not
    assert "| T ≤ 256: W4A8 no slower than W4A16 | 1 / 2 |" in text
    assert "500.0 (2.00x; 0.60)" in text
    # W4A16 at 0.69 and 0.71 of the bf16 matmul at T >= 4096: one of two holds; T = 16 has no bound row
    assert "| T ≥ 4096: W4A16 ≥ 0.7 of the bf16 matmul (gpt-oss-120b, deepseek-v3) | 1 / 2 |" in text
    assert "| W4A16 ÷ bf16 matmul rate | - | 0.690 | 0.710 |" in text
