"""benchmarks/probe_gluon_w4a16.py compiles for sm_90 without a GPU: its warp-specialized kernel is built with the
installed triton's Gluon, the decoded weights reach the wgmma without a layout conversion or a shared-memory store,
and nothing spills. The probe's speed question needs a Hopper GPU (`--run`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.experimental.gluon", reason="this triton has no Gluon")

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("probe_gluon_w4a16", ROOT / "benchmarks" / "probe_gluon_w4a16.py")
probe = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = probe
_spec.loader.exec_module(probe)


@pytest.mark.parametrize("config", [probe.CONFIGS[0], probe.CONFIGS[3]])
def test_probe_kernel_compiles_for_sm90_with_weights_in_registers(config):
    block_m, block_n, block_k, stages, warps = config
    stats = probe.sass_stats(probe.compile_for_sm90(config))
    assert stats["warp_specialize"] == 1, stats  # a loader partition and the default (consumer) partition
    assert stats["wgmma"] == block_k // 16, stats  # one m64nBMk16 wgmma per 16 K of a tile, per warpgroup
    assert stats["setmaxnreg"] > 0, stats  # registers handed from the loader warp to the consumers
    assert probe.weights_stay_in_registers(stats), stats
    assert stats["shared_bytes"] <= 227 * 1024, stats  # the ring fits an sm_90 block


def test_the_check_refuses_a_kernel_that_converts_or_spills():
    good = {"wgmma": 8, "shuffles": 0, "local_stores": 0, "spill_bytes": 0, "warp_specialize": 1}
    assert probe.weights_stay_in_registers(good)
    for key, value in (("shuffles", 64), ("local_stores", 1), ("spill_bytes", 72), ("warp_specialize", 0),
                       ("wgmma", 0)):
        assert not probe.weights_stay_in_registers(good | {key: value}), key


def test_run_needs_an_output_directory(capsys):
    with pytest.raises(SystemExit) as exc:
        probe.main(["--run"])
    assert exc.value.code == 2
    assert "--run needs --out DIR" in capsys.readouterr().err
