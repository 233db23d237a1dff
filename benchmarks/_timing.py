"""Timing helpers shared by the CPU benchmarks (bench_select.py, bench_runtime.py).

Per-call times are the mean of n calls, repeated for several rounds: report the best round (as timeit advises:
on a shared machine the slower rounds measure the neighbours) and, where the spread matters, the median.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def rounds(fn: Callable[[], Any], n: int, count: int = 7) -> list[float]:
    """Mean seconds per call of `n` calls, for each of `count` rounds."""
    out = []
    for _ in range(count):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t) / n)
    return out


def best(fn: Callable[[], Any], n: int, count: int = 7) -> float:
    """The best round of `rounds` (seconds per call)."""
    return min(rounds(fn, n, count))


def each(fn: Callable[[], Any], repeat: int) -> list[float]:
    """Seconds of each of `repeat` single calls (for things that take milliseconds: loads, reloads)."""
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out
