"""Did a change make any matrix cell slower? Two runs of benchmarks/bench_matrix.py, one per commit, side by side.

Run the matrix at the base commit and at the change in ONE machine session (a copy of the base checkout beside the
working tree), then compare the CSVs here: per (layer, T) the base and changed µs of one implementation and the
speed-up (base µs / changed µs, > 1: the change is faster). Writes the table as markdown (stdout, or --out) and
exits 1 when a cell's speed-up is below --fail-below, so a "no slower anywhere" claim is a command, not prose.

    python benchmarks/compare_runs.py BASE/matrix.csv HEAD/matrix.csv --fail-below 0.97 --out DIR/README-table.md

Runs on different GPUs are refused; the timing noise between two runs of one session is a few percent, so pick the
threshold from a run compared with itself.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from oracle.errors import OracleError  # noqa: E402
from oracle.safewrite import write_inside  # noqa: E402

OURS = "this project (tuned)"


class CompareError(ValueError):
    """A CSV that cannot be compared: the message names the file and the fix."""


def load(path: Path, implementation: str) -> tuple[dict, dict]:
    """({(layer, T): µs} of `implementation`, the run's {run_id, gpu, commit}) from one bench_matrix CSV."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise CompareError(f"{path}: cannot read it ({exc.strerror}); pass a bench_matrix.py matrix.csv") from None
    needed = {"run_id", "gpu", "commit", "shape", "tokens", "implementation", "us"}
    if not rows or not needed <= set(rows[0]):
        raise CompareError(f"{path}: not a bench_matrix.py CSV (needs the columns {', '.join(sorted(needed))})")
    runs = {(r["run_id"], r["gpu"], r["commit"]) for r in rows}
    if len(runs) != 1:
        raise CompareError(f"{path}: holds {len(runs)} runs; compare one run with one run")
    run_id, gpu, commit = runs.pop()
    cells = {}
    for r in rows:
        if r["implementation"] == implementation and r["us"]:
            cells[(r["shape"], int(r["tokens"]))] = float(r["us"])
    if not cells:
        raise CompareError(f"{path}: no timed '{implementation}' rows (pick one with --implementation)")
    return cells, {"run_id": run_id, "gpu": gpu, "commit": commit}


def compare(base: dict, changed: dict) -> list[tuple[str, int, float, float, float]]:
    """(layer, T, base µs, changed µs, speed-up) for every cell both runs timed, in layer then T order."""
    layers = list(dict.fromkeys(layer for layer, _ in changed))
    return [(layer, t, base[(layer, t)], changed[(layer, t)], base[(layer, t)] / changed[(layer, t)])
            for layer, t in sorted(set(base) & set(changed), key=lambda c: (layers.index(c[0]), c[1]))]


def markdown(rows: list, base_run: dict, changed_run: dict, implementation: str, only: tuple) -> str:
    lines = [f"`{implementation}`: base `{base_run['run_id']}` (commit {base_run['commit'][:8]}) against "
             f"`{changed_run['run_id']}` (commit {changed_run['commit'][:8]}), {changed_run['gpu']}; speed-up = base "
             "µs ÷ changed µs (> 1: the change is faster).", "",
             "| layer | T | base µs | changed µs | speed-up |", "|---|---|---|---|---|"]
    lines += [f"| {layer} | {t} | {b:.1f} | {c:.1f} | {s:.3f} |" for layer, t, b, c, s in rows]
    speedups = [s for *_, s in rows]
    lines += ["", f"{len(rows)} cells: speed-up {min(speedups):.3f} to {max(speedups):.3f}."]
    if only[0] or only[1]:
        lines.append(f"Timed in one run only: {len(only[0])} base cells, {len(only[1])} changed cells.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("base", type=Path, help="the base commit's matrix.csv")
    p.add_argument("changed", type=Path, help="the changed commit's matrix.csv, from the same machine session")
    p.add_argument("--implementation", default=OURS, help=f"the rows to compare (default: {OURS!r})")
    p.add_argument("--fail-below", type=float, default=None,
                   help="exit 1 when a cell's speed-up is below this (e.g. 0.97: 3%% slower)")
    p.add_argument("--out", type=Path, help="write the markdown table here instead of stdout")
    args = p.parse_args(argv)
    if args.fail_below is not None and not 0 < args.fail_below <= 2:
        p.error(f"--fail-below {args.fail_below}: give a speed-up ratio in (0, 2], e.g. 0.97")
    try:
        base, base_run = load(args.base, args.implementation)
        changed, changed_run = load(args.changed, args.implementation)
    except CompareError as exc:
        print(f"compare_runs.py: {exc}", file=sys.stderr)
        return 2
    if base_run["gpu"] != changed_run["gpu"]:
        print(f"compare_runs.py: {args.base} ran on {base_run['gpu']}, {args.changed} on {changed_run['gpu']}; "
              "compare runs of one GPU (one machine session)", file=sys.stderr)
        return 2
    rows = compare(base, changed)
    if not rows:
        print(f"compare_runs.py: {args.base} and {args.changed} share no (layer, T) cell", file=sys.stderr)
        return 2
    text = markdown(rows, base_run, changed_run, args.implementation,
                    (sorted(set(base) - set(changed)), sorted(set(changed) - set(base))))
    if args.out:
        try:
            write_inside(args.out, text)  # atomically, never through a symlink that leaves its directory
        except (OracleError, OSError) as exc:
            print(f"compare_runs.py: --out {exc}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    slower = [(layer, t, s) for layer, t, _, _, s in rows if args.fail_below is not None and s < args.fail_below]
    for layer, t, s in slower:
        print(f"compare_runs.py: {layer} at T = {t} is slower: speed-up {s:.3f} < {args.fail_below}", file=sys.stderr)
    return 1 if slower else 0


if __name__ == "__main__":
    raise SystemExit(main())
