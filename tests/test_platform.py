"""Platform detection for real runs; it must work on a CPU-only machine."""
from __future__ import annotations

import importlib.util

from oracle.platform import detect_packages, detect_platform, env_snapshot


def test_detect_platform_gives_a_scenario_platform(oracle):
    plat = detect_platform()
    assert plat["kind"] in ("cuda", "rocm", "xpu", "cpu")
    d = oracle.select({"policy": "mxfp4-gpt-oss", "profile": "vllm-0.20", "platform": plat})
    assert d.outcome != "error", d.error


def test_detect_packages_uses_find_spec_only():
    found = detect_packages(["json", "surely_not_a_package_xyz", "flashinfer"])
    assert found["json"] is True and found["surely_not_a_package_xyz"] is False
    assert found["flashinfer"] is (importlib.util.find_spec("flashinfer") is not None)


def test_env_snapshot_keeps_zero_and_drops_unset():
    environ = {"VLLM_MXFP4_USE_MARLIN": "0", "UNRELATED": "1"}
    assert env_snapshot(["VLLM_MXFP4_USE_MARLIN", "VLLM_BATCH_INVARIANT"], environ) == {"VLLM_MXFP4_USE_MARLIN": "0"}


def test_cli_detect_env_reads_declared_variables(monkeypatch, capsys):
    from oracle.cli import main

    monkeypatch.setenv("VLLM_USE_FLASHINFER_MOE_MXFP4_BF16", "1")
    assert main(["select", "--profile", "vllm-0.20", "--policy", "mxfp4-gpt-oss", "--platform", "cuda:8.0",
                 "--detect-env"]) == 1
    assert "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1" in capsys.readouterr().out
    assert main(["select", "--profile", "vllm-0.20", "--policy", "mxfp4-gpt-oss", "--platform", "cuda:8.0"]) == 0, \
        "without --detect-env the env is not read"
