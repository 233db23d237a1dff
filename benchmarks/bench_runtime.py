"""Runtime benchmark (issue 12): RuleStore select (cached / uncached / from a dict), 8 threads vs 1,
reload and poll of the shipped rules, memory per compiled table.

Prints a markdown table. Baseline in the same run: the hand-written if/elif selector of
bench_select.py for the same gpt-oss SM90 question, so ratios compare across machines.
Per-call times: CPU time (benchmarks/_timing.py), the median over rounds of the mean of n calls (and the best
round, as timeit advises on a shared machine). Usage: python benchmarks/bench_runtime.py [--out FILE] [--quick]
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _timing import each, rounds  # noqa: E402
from bench_select import handwritten_gpt_oss  # noqa: E402

from oracle.api import Oracle, build_table  # noqa: E402
from oracle.log import DecisionLog  # noqa: E402
from oracle.store import ReloadResult, RuleStore  # noqa: E402

SM90 = {"kind": "cuda", "capability": [9, 0]}
PACKAGES = {"triton_kernels": True, "flashinfer": True}
QUESTION = {"policy": "mxfp4-gpt-oss", "profile": "vllm-0.20", "moe": {"activation": "swigluoai", "hidden_size": 2880,
                                               "intermediate_size": 2880}}
OVERRIDES = """\
overrides:
  - {id: draft, match: {role: draft}, backend: MARLIN, why: "draft model"}
  - {id: first-layers, match: {model: "acme/*", layers: {from: 0, to: 3}}, backend: EMULATION, why: "bisecting"}
"""


def threaded(fn, threads: int, calls: int) -> float:
    """Calls per second of `threads` threads doing `calls` calls in total (wall clock, started together)."""
    barrier = threading.Barrier(threads + 1)
    per = calls // threads
    errors: list[BaseException] = []

    def work() -> None:
        barrier.wait()
        try:
            for _ in range(per):
                fn()
        except BaseException as exc:  # noqa: BLE001 - counted below
            errors.append(exc)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} thread(s) failed: {errors[0]!r}")
    return per * threads / wall


def measure_reloads(quiet: DecisionLog) -> list[tuple[str, tuple[list[float], list[float]], str]]:
    """Loading and reloading a copy of the shipped rules: from scratch, with nothing changed, after a file was
    touched (mtime only), after an edit of one file (a comment line appended: that file is parsed again and
    the profiles listing it are checked and compiled again). (label, (CPU, wall) seconds of each run, target)."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "rules"
        shutil.copytree(ROOT / "rules", root)

        def store(**options: Any) -> RuleStore:
            # settle=0: the settle window is waiting, not work (bench_reload.py times reloads with it)
            return RuleStore(root, platform=SM90, packages=PACKAGES, env={}, plugins=False, decision_log=quiet,
                             settle=0, **options)

        cold = each(store, 7)
        s = store()
        everything = store(profiles=list(s.generation.oracle.profiles()))
        default = s.generation.oracle.default_profile
        touched, shared = root / default / "mxfp4.yaml", root / "common" / "platform.yaml"
        out.append((f"cold start: RuleStore() (read, parse and check every profile, compile {default})", cold,
                    "—"))
        out.append(("store.reload(), no file changed (every file read and hashed; nothing parsed or compiled)",
                    each(s.reload, 10), "≤ 50 ms"))
        out.append((f"store.reload() after `touch {default}/mxfp4.yaml` (mtime only: content unchanged)",
                    each(lambda: touch_and(touched, s.reload), 10), "≤ 50 ms"))
        out.append((f"store.reload() after an edit of {default}/mxfp4.yaml (it is parsed again; {default} checked "
                    "and compiled again)", each(lambda: edit_and(touched, s.reload), 10), "≤ 50 ms"))
        out.append((f"store.reload() after an edit of common/platform.yaml (every profile lists it: all checked "
                    f"again, {default} compiled again)", each(lambda: edit_and(shared, s.reload), 10), "≤ 50 ms"))
        everything.reload()  # takes in the edits made above
        n = len(everything.generation.oracle.snapshot.tables)
        out.append((f"all {n} profiles compiled: store.reload(), no file changed", each(everything.reload, 10),
                    "—"))
        out.append((f"all {n} profiles compiled: store.reload() after an edit of common/platform.yaml (all "
                    "compiled again)", each(lambda: edit_and(shared, everything.reload), 10), "—"))
    return out


def touch_and(path: Path, action: Callable[[], ReloadResult]) -> ReloadResult:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    return action()


def edit_and(path: Path, action: Callable[[], ReloadResult]) -> ReloadResult:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("# an edit\n")
    result = action()
    assert result.ok, result.error
    return result


def table_memory(store: RuleStore) -> list[tuple[str, int]]:
    """Bytes allocated by compiling each profile from scratch (parsed files included), traced by tracemalloc."""
    out = []
    index = store.generation.oracle.index
    for name, profile in index.profiles.items():
        gc.collect()
        tracemalloc.start()
        table = build_table(profile.files, name, profile.description, {})
        gc.collect()
        size, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out.append((name, size))
        del table
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    args = ap.parse_args()
    scale = 10 if args.quick else 1
    quiet = DecisionLog(log=__import__("logging").getLogger("bench-quiet"))

    store = RuleStore(platform=SM90, packages=PACKAGES, env={}, plugins=False, decision_log=quiet)
    sc = store.prepare(QUESTION)
    first = store.select(sc)
    assert first.backend == "TRITON", first
    cached = rounds(lambda: store.select(sc), 50000 // scale)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "overrides.yaml"
        path.write_text(OVERRIDES)
        ov_store = RuleStore(platform=SM90, packages=PACKAGES, env={}, plugins=False, overrides=path,
                             decision_log=quiet)
        ov_sc = ov_store.prepare(QUESTION)
        assert ov_store.select(ov_sc, model="acme/x", layer=2).backend == "EMULATION"
        ov_store.select(ov_sc, model="acme/x", layer=7, role="target")
        cached_ov = rounds(lambda: ov_store.select(ov_sc, model="acme/x", layer=7, role="target"), 50000 // scale)

    oracle = store.generation.oracle
    uncached = rounds(lambda: oracle.select_uncached(sc), 5000 // scale)
    raw = {**QUESTION, "platform": SM90, "packages": PACKAGES}
    prepare = rounds(lambda: oracle.prepare(raw), 5000 // scale)
    from_dict = rounds(lambda: oracle.select_uncached(oracle.prepare(raw)), 5000 // scale)
    store_dict = rounds(lambda: store.select(QUESTION), 20000 // scale)  # validated once per generation

    def store_miss() -> None:
        gen = store.generation
        gen.answers.clear()
        gen.decided.clear()
        store.select(sc)

    store_uncached = rounds(store_miss, 5000 // scale)

    args_hw = ((9, 0), "cuda", frozenset({"triton_kernels", "flashinfer"}), {}, "swigluoai", False, False)
    hand = rounds(lambda: handwritten_gpt_oss(*args_hw), 50000 // scale)

    calls = 400000 // scale
    one = threaded(lambda: store.select(sc), 1, calls)
    eight = threaded(lambda: store.select(sc), 8, calls)
    one_unc = threaded(lambda: oracle.select_uncached(sc), 1, calls // 20)
    eight_unc = threaded(lambda: oracle.select_uncached(sc), 8, calls // 20)

    reloads = measure_reloads(quiet)
    poll = rounds(lambda: store.poll(), 50, count=5)
    index = store.generation.oracle.index
    default = index.profiles[index.default]
    construct = each(lambda: Oracle(), 5)  # parses and checks every profile
    build_default = each(lambda: build_table(default.files, index.default, default.description, {}), 5)
    memory = table_memory(store)

    us = lambda s: f"{s * 1e6:.2f} µs"  # noqa: E731
    ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
    med, best = statistics.median, min
    hand_med = med(hand)

    def row(name: str, samples: list[float], target: str) -> tuple[str, str, str, str]:
        return (name, f"{us(med(samples))} (best {us(best(samples))})", f"{med(samples) / hand_med:.1f}x", target)

    rows = [
        row("store.select, cached (prepared Scenario)", cached, "≤ 1 µs"),
        row("store.select, cached, with model/layer/role and an overrides file", cached_ov, "≤ 1 µs"),
        row("Oracle.select_uncached, prepared Scenario (gpt-oss SM90, flashinfer + triton_kernels)", uncached,
            "≤ 10 µs"),
        row("store.select, cache miss (override lookup + answer + decision-log check)", store_uncached, "—"),
        row("Oracle.prepare (scenario validation) from a dict", prepare, "—"),
        row("uncached from a dict (prepare + select_uncached)", from_dict, "≤ 20 µs"),
        row("store.select from a dict, repeated (frozen dict -> prepared Scenario -> cached answer)", store_dict,
            "—"),
        row("hand-written if/elif baseline (same question, same run)", hand, "—"),
    ]
    lines = [f"Machine: {platform.machine()}, {platform.processor() or 'cpu'}, Python {platform.python_version()}, "
             f"{__import__('os').cpu_count()} CPUs", "",
             "| measurement | median per call | vs baseline | target |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    lines += ["", "| concurrency (calls per second, all threads together) | 1 thread | 8 threads | 8 / 1 | target |",
              "|---|---|---|---|---|",
              f"| store.select, cached | {one:,.0f} | {eight:,.0f} | {eight / one:.2f} | ≥ 0.5 |",
              f"| Oracle.select_uncached | {one_unc:,.0f} | {eight_unc:,.0f} | {eight_unc / one_unc:.2f} | ≥ 0.5 |",
              "", "| load / reload of a copy of the shipped rules (default profile in use) | CPU median | CPU max | "
              "wall median | target |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {ms(med(cpu))} | {ms(max(cpu))} | {ms(med(wall))} | {target} |"
              for name, (cpu, wall), target in reloads]
    lines += [f"| store.poll(), nothing changed (sha256 of {len(store.generation.hashes)} files) | {ms(med(poll))} | "
              f"{ms(max(poll))} | — | — |",
              f"| for comparison, from scratch: Oracle() (parse + check every profile) | {ms(med(construct[0]))} | "
              f"{ms(max(construct[0]))} | {ms(med(construct[1]))} | — |",
              f"| for comparison, from scratch: build_table of the default profile (parse + check + compile) | "
              f"{ms(med(build_default[0]))} | {ms(max(build_default[0]))} | {ms(med(build_default[1]))} | — |",
              "", "| profile | memory of one compiled table (tracemalloc, parsed files included) |", "|---|---|"]
    lines += [f"| {name} | {size / 1024:,.0f} KiB |" for name, size in memory]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
