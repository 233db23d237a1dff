"""Timing helpers shared by the CPU benchmarks (bench_select.py, bench_runtime.py).

Times are CPU time of this process (time.process_time): on the shared 2-core development VM the wall clock also
counts the time slices other jobs take (2x at a load average of 4-5), CPU time only what this code costs (it still
pays for the caches others evict). `each` also gives the wall time. Per-call times are the mean of n calls,
repeated for several rounds: report the best round (as timeit advises) and, where the spread matters, the median.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def rounds(fn: Callable[[], Any], n: int, count: int = 7) -> list[float]:
    """Mean seconds per call of `n` calls, for each of `count` rounds."""
    out = []
    for _ in range(count):
        t = time.process_time()
        for _ in range(n):
            fn()
        out.append((time.process_time() - t) / n)
    return out


def best(fn: Callable[[], Any], n: int, count: int = 7) -> float:
    """The best round of `rounds` (seconds per call)."""
    return min(rounds(fn, n, count))


def each(fn: Callable[[], Any], repeat: int) -> tuple[list[float], list[float]]:
    """CPU seconds and wall seconds of each of `repeat` single calls (things that take milliseconds: loads)."""
    cpu, wall = [], []
    for _ in range(repeat):
        c, t = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - t)
    return cpu, wall
