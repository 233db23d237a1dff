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
    calls = []

    def fake_run(args, **kwargs):
        calls.append(args)
        return type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})()

    monkeypatch.setattr(ncu.shutil, "which", lambda name: "/usr/bin/ncu")
    monkeypatch.setattr(ncu.subprocess, "run", fake_run)
    ncu.profile(["gpt-oss-120b:4096"], str(tmp_path), more_sections=("MemoryWorkloadAnalysis_Tables",))
    asked = [args[i + 1] for args in calls for i, arg in enumerate(args) if arg == "--section"]
    assert "MemoryWorkloadAnalysis_Tables" in asked
    assert set(ncu.SECTIONS) <= set(asked)
