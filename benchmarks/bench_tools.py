"""Speed of the tool verbs on the shipped rules (issue 14 budgets: lint <= 5 s, sweep >= 100k decisions/s).

Prints a Markdown table: per profile, the lint time (wall and CPU of this process), the number of input
classes lint explored, and the sweep's decisions per second (rows x platform classes / CPU time), with the
plain fast-path select of the same table as the in-run baseline (Oracle.select_uncached on prepared scenarios).

    python benchmarks/bench_tools.py
"""
from __future__ import annotations

import os
import platform
import time

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
          f"{platform.python_version()}\n")
    print("| profile | lint wall s | lint CPU s | classes explored | findings | sweep decisions | sweep CPU s "
          "| sweep decisions/s | baseline select/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    total_w = total_c = 0.0
    oracle = Oracle()
    for name in src.profiles:
        one = load_source(name)
        found, w, c = _timed(lambda one=one: lint_source(one))
        total_w, total_c = total_w + w, total_c + c
        leaves = found[0]["leaves"] if found else "-"
        p = one.profiles[name]
        ms, _, sc = _timed(lambda p=p: [sweep_policy(p, pol) for pol in p.table.policies])
        decisions = sum(m.decisions for m in ms)
        qs = [oracle.prepare({"policy": pol, "profile": name, "platform": plat})
              for pol in p.table.policies for plat in ({"kind": "cuda", "capability": [9, 0]},
                                                       {"kind": "cuda", "capability": [10, 0]}, {"kind": "cpu"})]
        reps = max(1, 20000 // len(qs))
        _, _, bc = _timed(lambda qs=qs, reps=reps: [oracle.select_uncached(q) for _ in range(reps) for q in qs])
        print(f"| {name} | {w:.2f} | {c:.2f} | {leaves} | {len(found)} | {decisions} | {sc:.2f} | "
              f"{decisions / sc:,.0f} | {reps * len(qs) / bc:,.0f} |")
    all_src, w, c = _timed(lambda: lint_source(src))
    print(f"\nfull `moe-oracle lint` of the shipped rules (all profiles, one process): {w:.2f} s wall, {c:.2f} s CPU, "
          f"{len(all_src)} findings")


if __name__ == "__main__":
    main()
