"""How long `moe-oracle diff` takes when nothing changed (issue 29 budget: <= 2 s), end to end as CI runs it.

Runs the command line in a fresh process (start-up and imports included) for: the working tree against
git:HEAD, the shipped rules against a copy of them, and one profile against itself; wall and CPU seconds of
the child, and its exit code (0: no class changes). Writes diff-nochange.csv into the directory given
(default benchmarks/results/<date>-diff-nochange/) and prints it. To compare with older code:

    python benchmarks/bench_diff_nochange.py OUT_DIR
    PYTHONPATH=/path/to/old/checkout python benchmarks/bench_diff_nochange.py OUT_DIR_OLD

Run it from a checkout whose rules/ equals HEAD's (else the git case explores the real change).
"""
from __future__ import annotations

import csv
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _timed(argv: list[str]) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    w = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "oracle.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    wall = time.perf_counter() - w
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "benchmarks" / "results" / (
        time.strftime("%Y-%m-%d") + "-diff-nochange")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "rules"
        shutil.copytree(ROOT / "rules", copy)
        cases = {"git:HEAD vs working tree": ["diff", "git:HEAD", "rules"],
                 "rules vs a copy": ["diff", "rules", str(copy)],
                 "vllm-0.33 vs itself": ["diff", "vllm-0.33", "vllm-0.33"]}
        rows = []
        for name, argv in cases.items():
            wall, cpu, code = _timed(argv)
            rows.append({"case": name, "command": "moe-oracle " + " ".join(argv).replace(tmp, "TMP"),
                         "wall_s": f"{wall:.2f}", "cpu_s": f"{cpu:.2f}", "exit": code,
                         "load_avg": f"{os.getloadavg()[0]:.1f}"})
    path = out / "diff-nochange.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    sys.stdout.write(path.read_text())


if __name__ == "__main__":
    main()
