"""benchmarks/count_decode_sass.py without a GPU: it reads the K loop from SASS text, and on the shipped decode
kernels (compiled for sm_90 as forward._launch_decode launches them) it finds the loop's 8 MMAs a step, spill-free within
the launch's register cap, and its CLI names an unknown layer."""

from __future__ import annotations

import pytest

from conftest import load_benchmark

triton = pytest.importorskip("triton")
tool = load_benchmark("count_decode_sass")


def test_the_k_loop_is_the_loop_around_the_mmas():
    sass = "\n".join([
        "        /*0000*/  LDG.E R2, desc[UR4][R2.64] ;",
        ".L_x_0:",
        "        /*0010*/  LDG.E.128 R8, desc[UR4][R4.64] ;",
        "        /*0020*/  HMMA.16816.F32.BF16 R12, R8, R10, R12 ;",
        "        /*0030*/  @P0 BRA `(.L_x_0) ;",
        ".L_x_1:",
        "        /*0040*/  BAR.SYNC.DEFER_BLOCKING 0x0 ;",
        "        /*0050*/  @P1 BRA `(.L_x_1) ;"])
    body = tool.k_loop_body(sass)
    assert [ins.split()[0] for ins in body] == ["LDG.E.128", "HMMA.16816.F32.BF16", "@P0"]


@pytest.mark.parametrize("gemv", [1, 2])
def test_the_shipped_decode_kernels_loop_holds_8_mmas_a_step_without_spilling(gemv):
    """gpt-oss-120b at T = 1: a lane's 8 weight words a step are 2 x 2 word pairs of four m16n8k16 MMAs each, and a
    kernel that loads ahead (both do there) takes two steps a loop iteration."""
    compiled, launch, options = tool.compile_gemv(gemv, "gpt-oss-120b", 1)
    counted = tool.count(compiled)
    steps = 2 if launch.loads_ahead else 1
    assert counted["opcodes"]["HMMA"] == 8 * steps
    assert counted["local_bytes"] == 0 and counted["registers"] <= options["maxnreg"]
    assert 10 <= counted["per_iteration"] / (8 * steps) <= 40  # the decode's bit trick alone is ~10 a word


def test_an_unknown_layer_is_named(capsys):
    with pytest.raises(SystemExit) as exc:
        tool.main(["--layers", "no-such-model"])
    assert exc.value.code == 2
    assert "unknown ['no-such-model']" in capsys.readouterr().err
