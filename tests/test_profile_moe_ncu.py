"""benchmarks/profile_moe_ncu.py's source-level table: ncu's source page (one CSV block per launch) condensed to the
stall reasons' shares and the most-sampled SASS instructions."""

from __future__ import annotations

from conftest import load_benchmark

ncu = load_benchmark("profile_moe_ncu")

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
          '"stall_long_sb","stall_wait","stall_long_sb (Not Issued)"')


def _launch(rows):
    return '"Kernel Name","ws_moe_gemm_kernel",\n' + HEADER + "\n" + "".join(
        f'"0x{i:x}","{sass}","{total}","0","{long_sb}","{wait}","0"\n' for i, (sass, total, long_sb, wait)
        in enumerate(rows))


def test_each_launch_gets_its_reasons_shares_and_its_most_sampled_instructions_first(tmp_path):
    path = tmp_path / "stalls.csv"
    path.write_text(_launch([("LOP3.LUT R1, R2", "10", "0", "10"), ("FENCE.VIEW.ASYNC.S", "30", "30", "0")])
                    + _launch([("HGMMA.64x128x16", "4", "0", "4")]))
    table = ncu.render_source(str(path))
    first, second = table.split("### launch 1")
    assert "launch 0: ws_moe_gemm_kernel, 40 samples" in first
    assert "reasons: long_sb 75%, wait 25%" in first
    assert first.index("FENCE.VIEW.ASYNC.S") < first.index("LOP3.LUT")  # most sampled first
    assert "| 0.750 | `FENCE.VIEW.ASYNC.S` | long_sb 30 |" in first
    assert "4 samples" in second and "reasons: wait 100%" in second


def test_a_file_without_launches_says_so(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("")
    assert ncu.render_source(str(path)) == "(no source rows in empty.csv)"


def test_extra_sections_reach_ncu_beside_the_default_ones(tmp_path, monkeypatch):
    """--sections: each named section is asked of ncu as well as SECTIONS (what the memory tables need)."""
    calls = _ncu_calls(tmp_path, monkeypatch, more_sections=("MemoryWorkloadAnalysis_Tables",))
    asked = [args[i + 1] for args in calls for i, arg in enumerate(args) if arg == "--section"]
    assert "MemoryWorkloadAnalysis_Tables" in asked
    assert set(ncu.SECTIONS) <= set(asked)


def _ncu_calls(tmp_path, monkeypatch, **kwargs) -> list:
    """The argument lists profile() hands ncu for one case (ncu itself faked)."""
    calls = []

    def fake_run(args, **_):
        calls.append(args)
        return type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})()

    monkeypatch.setattr(ncu.shutil, "which", lambda name: "/usr/bin/ncu")
    monkeypatch.setattr(ncu.subprocess, "run", fake_run)
    ncu.profile(["gpt-oss-120b:16384"], str(tmp_path), **kwargs)
    return calls


def test_counters_of_one_kernel_ask_ncu_for_its_first_launches_only(tmp_path, monkeypatch):
    """--kernel: a large layer's counters restricted to one kernel's first --launches launches (without it every
    launch of the call is replayed, which at T = 16384 ran past a 200 s bound)."""
    for args in _ncu_calls(tmp_path, monkeypatch, kernel="ws_moe_gemm_kernel", launches=3):
        assert args[args.index("-k") + 1] == "ws_moe_gemm_kernel"
        assert args[args.index("--launch-count") + 1] == "3"
        assert args.index("--launch-count") < args.index("--run")  # ncu's option, not the profiled script's
    assert all("-k" not in args for args in _ncu_calls(tmp_path, monkeypatch))


def test_the_k_loop_is_the_shortest_heavy_wgmma_loop_and_gets_its_opcode_and_reason_shares(tmp_path):
    """A tile loop around a K loop: the K loop (its wgmma and a branch back to its start) is named with its share of
    the launch's samples and its leading (opcode, reason) pairs; a loop without a wgmma is not a K loop."""
    rows = [("MOV R1, R2", "5", "5", "0"),                      # 0x0: the tile loop's start
            ("LDS R4, [R1]", "10", "0", "10"),                  # 0x1: the K loop's start
            ("HGMMA.64x128x16.F32.BF16 R24, R4", "20", "0", "20"),
            ("@!P0 SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4]", "30", "30", "0"),
            ("@P1 BRA 0x1", "0", "0", "0"),                     # 0x4: back to the K loop's start
            ("FMUL R5, R6, R7", "15", "15", "0"),
            ("@P2 BRA 0x0", "0", "0", "0"),                     # 0x6: back to the tile loop's start
            ("@P3 BRA 0x5", "20", "20", "0")]                   # 0x7: a loop with no wgmma
    path = tmp_path / "stalls.csv"
    path.write_text(_launch(rows))
    table_rows = list(ncu.csv.DictReader(ncu.io.StringIO(_launch(rows).partition("\n")[2])))
    assert ncu.k_loop(table_rows) == (1, 4)
    table = ncu.render_source(str(path))
    assert "K loop: 4 SASS instructions, 60.0% of the samples" in table
    assert "SYNCS long_sb 50.0%, HGMMA wait 33.3%, LDS wait 16.7%" in table


def test_a_launch_without_a_wgmma_loop_names_no_k_loop():
    rows = list(ncu.csv.DictReader(ncu.io.StringIO(_launch([("FADD R1, R2", "3", "3", "0"),
                                                            ("@P0 BRA 0x0", "1", "1", "0")]).partition("\n")[2])))
    assert ncu.k_loop(rows) is None
