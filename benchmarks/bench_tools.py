"""Speed of the tool verbs on the shipped rules (issue 14 budgets: lint <= 5 s, sweep >= 100k decisions/s).

Prints a Markdown table: per profile, the lint time (wall and CPU of this process), the number of input
classes lint explored, and the sweep: its rows, the cells it renders (rows x concrete platforms: each cell is
an answer that Oracle.select gives for that platform, tests/test_tools_sweep.py), the answers per platform
class (rows x platform classes: platforms of one class share every fact the rules read, so one answer serves
them all), how many of those the engine actually ran (the rest came from the memo), its CPU time, cells and
per-class answers per CPU second, with
the plain fast-path select of the same table as the in-run baseline (Oracle.select_uncached on prepared
scenarios). Runs against older code too (it reads only fields every version has), for before/after:

    python benchmarks/bench_tools.py
    PYTHONPATH=/path/to/old/checkout python benchmarks/bench_tools.py
"""
from __future__ import annotations

import os
import platform
import time

import oracle
from oracle import Oracle
from oracle.tools.lint import lint_source
from oracle.tools.sources import load_source
from oracle.tools.sweep import sweep_policy


def _timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main() -> None:
    src = load_source(str(Oracle().root))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f}; oracle from {oracle.__file__}\n")
    print("| profile | lint wall s | lint CPU s | classes explored | findings | sweep rows | sweep cells "
          "| per-class answers | engine runs | sweep CPU s | sweep cells/s | per-class answers/s | baseline select/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    oracle_ = Oracle()
    cells_all = answers_all = cpu_all = 0.0
    for name in src.profiles:
        one = load_source(name)
        found, w, c = _timed(lambda one=one: lint_source(one))
        leaves = found[0]["leaves"] if found else "-"
        p = one.profiles[name]
        ms, _, sc = _timed(lambda p=p: [sweep_policy(p, pol) for pol in p.table.policies])
        rows = sum(len(m.rows) for m in ms)
        cells = sum(len(m.rows) * len(m.columns) for m in ms)
        runs = sum(getattr(m, "runs", 0) for m in ms) or sum(m.decisions for m in ms)  # old code: every one ran
        answers = sum(m.decisions for m in ms)  # rows x platform classes
        cells_all, answers_all, cpu_all = cells_all + cells, answers_all + answers, cpu_all + sc
        qs = [oracle_.prepare({"policy": pol, "profile": name, "platform": plat})
              for pol in p.table.policies for plat in ({"kind": "cuda", "capability": [9, 0]},
                                                       {"kind": "cuda", "capability": [10, 0]}, {"kind": "cpu"})]
        reps = max(1, 20000 // len(qs))
        _, _, bc = _timed(lambda qs=qs, reps=reps: [oracle_.select_uncached(q) for _ in range(reps) for q in qs])
        print(f"| {name} | {w:.2f} | {c:.2f} | {leaves} | {len(found)} | {rows} | {cells} | {answers} | {runs} | "
              f"{sc:.3f} | {cells / sc:,.0f} | {answers / sc:,.0f} | {reps * len(qs) / bc:,.0f} |")
    print(f"\nsweep of every profile: {cells_all:,.0f} cells in {cpu_all:.2f} s CPU = {cells_all / cpu_all:,.0f} "
          f"cells/s, {answers_all / cpu_all:,.0f} per-class answers/s")
    all_src, w, c = _timed(lambda: lint_source(src))
    print(f"full `moe-oracle lint` of the shipped rules (all profiles, one process): {w:.2f} s wall, {c:.2f} s CPU, "
          f"{len(all_src)} findings")


if __name__ == "__main__":
    main()
