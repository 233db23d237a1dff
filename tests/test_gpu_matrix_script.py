"""benchmarks/gpu_matrix.sh: MATRIX_STEPS runs the named steps only, in the script's order, under one RUN_ID (a
stub python3 records each command instead of running it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_matrix.sh"


def _run(tmp_path: Path, steps: str | None) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls.log"
    log.unlink(missing_ok=True)
    stub = bin_dir / "python3"
    stub.write_text(f'#!/bin/sh\necho "$*" >> {log}\n[ "$1" = "-c" ] && echo "gpt-oss-120b deepseek-v3"\nexit 0\n')
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"), "RUN_ID": "H100-x"}
    if steps is not None:
        env["MATRIX_STEPS"] = steps
    done = subprocess.run(["bash", str(SCRIPT)], cwd=SCRIPT.parents[1], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return log.read_text().splitlines() if log.exists() else []


def test_default_runs_every_step_with_triton_kernels_before_hummings_layers(tmp_path):
    calls = _run(tmp_path, None)
    kinds = ["tests" if "-m pytest" in c else "humming" if "Humming" in c else "tk" if "triton_kernels" in c
             else "ours" if "bench_matrix.py" in c else "other" for c in calls]
    assert [k for k in kinds if k != "other"] == ["ours", "tk", "humming", "humming", "tests"]
    assert all("--run-id H100-x" in c for c in calls if "bench_matrix.py" in c)


def test_steps_pick_a_subset(tmp_path):
    calls = _run(tmp_path, "tk tests")
    assert len([c for c in calls if "triton_kernels" in c]) == 1 and len([c for c in calls if "-m pytest" in c]) == 1
    assert not [c for c in calls if "Humming" in c or "--peers " in c and "--no-ours" not in c]
