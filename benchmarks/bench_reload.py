"""Hot reload under load (issue 28): how long an edit takes to serve while 8 threads select in tight loops, and
what the 8 threads' select throughput is, for the RuleStore of a baseline revision and of this checkout, in the
same run (interleaved, so both see the same machine load).

    python benchmarks/bench_reload.py --baseline f91136b --edits 30 --out benchmarks/results/<run>/

Every measurement runs in a process of its own with the oracle package of its variant: the baseline's whole
tree exported with `git archive`, or this checkout. Latency: from the end of a rule-file write (in place) to
the store serving the new generation: `installed` is the generation's own `installed_at` (the moment every
select reads it), `observed` the moment a thread checking every 2 ms sees it (so that thread's own wait for
the GIL is included); the store's watcher polls at `--interval`. Throughput: cached `select(prepared)` calls
per second of all threads together, with no watcher and with the watcher polling. Writes latency.csv,
throughput.csv and summary.md under --out, with the machine's load average before and after.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TREE = os.environ.get("BENCH_RELOAD_TREE", str(ROOT))  # the variant a worker process measures
sys.path.insert(0, TREE)

import oracle.store as current_store  # noqa: E402
from oracle.api import Oracle  # noqa: E402
from oracle.log import DecisionLog  # noqa: E402

# the two rule versions and the site profile of the store tests (tests/runtime_rules.py): A tries TRITON first, B MARLIN
sys.path.insert(0, str(ROOT / "tests"))
from runtime_rules import PROFILES, VERSION_A, VERSION_B  # noqa: E402

VERSIONS = [VERSION_A, VERSION_B]
SM90 = {"kind": "cuda", "capability": [9, 0]}
QUESTION = {"policy": "mxfp4-gpt-oss", "moe": {"activation": "swigluoai", "hidden_size": 2880}}


# Throughput in a process of its own, with the oracle package of `root` (the baseline revision exported whole,
# or this checkout): "before" is then exactly that revision's code, not its store on this checkout's modules.
THROUGHPUT = r"""
import sys, tempfile, threading, time
from pathlib import Path
root, threads, seconds, interval = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
sys.path.insert(0, root)
from oracle.log import DecisionLog
from oracle.store import RuleStore
profiles, policy, question = sys.argv[5], sys.argv[6], sys.argv[7]
with tempfile.TemporaryDirectory() as tmp:
    (Path(tmp) / "profiles.yaml").write_text(profiles)
    (Path(tmp) / "policy.yaml").write_text(policy)
    quiet = DecisionLog(log=__import__("logging").getLogger("bench-quiet"))
    store = RuleStore(tmp, plugins=False, platform={"kind": "cuda", "capability": [9, 0]},
                      packages={"triton_kernels": True}, env={}, decision_log=quiet)
    if interval > 0:
        store.watch(interval=interval)
    sc = store.prepare(__import__("json").loads(question))
    stop, calls = threading.Event(), [0] * threads
    def work(k):
        select, n = store.select, 0
        while not stop.is_set():
            for _ in range(200):
                select(sc)
            n += 200
            calls[k] = n
    pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    time.sleep(0.3)
    c0, t0, p0 = sum(calls), time.perf_counter(), time.process_time()
    time.sleep(seconds)
    c1, t1, p1 = sum(calls), time.perf_counter(), time.process_time()
    stop.set()
    for t in pool:
        t.join()
    store.close()
    print((c1 - c0) / (t1 - t0), (c1 - c0) / (p1 - p0))
"""


def export_revision(rev: str, into: Path) -> Path:
    """The whole tree of `rev` (git archive), for a baseline process."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "oracle", "rules", "schemas", "backends"],
                             capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def throughput_process(root: Path, threads: int, seconds: float, interval: float) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", THROUGHPUT, str(root), str(threads), str(seconds), str(interval),
                          PROFILES, VERSIONS[0], __import__("json").dumps(QUESTION)],
                         capture_output=True, text=True, check=True, timeout=seconds + 60)
    wall, cpu = out.stdout.split()
    return float(wall), float(cpu)


class Site:
    """A rules directory and the edit the benchmark makes to it. 'small': a site directory extending the shipped
    rules with one policy file (edits alternate two versions of it). 'shipped': a copy of the shipped rules with
    every profile in use (edits append a comment to common/platform.yaml, which every profile lists: all are
    checked and compiled again)."""

    def __init__(self, kind: str, root: Path):
        self.kind, self.root, self.edits = kind, root, 0
        self.question = QUESTION if kind == "small" else {**QUESTION, "policy": "mxfp4"}
        if kind == "small":
            root.mkdir(parents=True)
            (root / "profiles.yaml").write_text(PROFILES)
            self.target, self.original = root / "policy.yaml", VERSIONS[0]
        else:
            shutil.copytree(ROOT / "rules", root)
            self.target = root / "common" / "platform.yaml"
            self.original = self.target.read_text()
        self.target.write_text(self.original)

    def store(self, module: Any) -> Any:
        quiet = DecisionLog(log=__import__("logging").getLogger("bench-quiet"))
        options: dict[str, Any] = {}
        if self.kind == "shipped":
            options["profiles"] = list(Oracle(self.root).profiles())
            options["rules"] = self.root
        return module.RuleStore(self.root, plugins=False, platform=SM90, packages={"triton_kernels": True}, env={},
                                decision_log=quiet, **{k: v for k, v in options.items() if k != "rules"})

    def edit(self) -> None:
        self.edits += 1
        if self.kind == "small":
            self.target.write_text(VERSIONS[self.edits % 2])
        else:
            self.target.write_text(self.original + f"# edit {self.edits}\n")


class Load:
    """`threads` threads selecting one prepared question in a tight loop; counts calls."""

    def __init__(self, store: Any, threads: int, question: dict[str, Any] = QUESTION):
        self.store, self.stop, self.calls = store, threading.Event(), [0] * threads
        sc = store.prepare(question)
        self.pool = [threading.Thread(target=self.work, args=(k, sc), daemon=True) for k in range(threads)]

    def work(self, k: int, sc: Any) -> None:
        select, stop, n = self.store.select, self.stop, 0
        while not stop.is_set():
            for _ in range(200):
                select(sc)
            n += 200
            self.calls[k] = n

    def __enter__(self) -> Load:
        for t in self.pool:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.pool:
            t.join()


def latency(store: Any, site: Site, timeout: float) -> tuple[float, float]:
    """Seconds from the end of an edit to the store installing a new generation, and to a thread seeing it."""
    number = store.generation.number
    site.edit()
    t0 = time.time()
    while store.generation.number == number:
        if time.time() - t0 > timeout:
            return float("inf"), float("inf")
        time.sleep(0.002)
    seen = time.time() - t0
    return store.generation.installed_at - t0, seen


def latency_worker(kind: str, load: int, edits: int, interval: float, timeout: float) -> None:
    """One variant (the oracle package of BENCH_RELOAD_TREE), one rules directory, one load: prints a JSON list of
    (installed, observed) seconds per edit."""
    rows: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        site = Site(kind, Path(tmp) / kind)
        store = site.store(current_store)
        store.watch(interval=interval)
        with Load(store, load, site.question) if load else _nothing():
            time.sleep(0.3)
            for _ in range(edits):
                rows.append(latency(store, site, timeout))
                if rows[-1][0] == float("inf"):
                    break
                time.sleep(0.05)
        store.close()
    print(json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default="f91136b", help="git revision that is the 'before'")
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--sites", default="small,shipped", help="rules directories to time edits of (see Site)")
    ap.add_argument("--interval", type=float, default=0.25)
    ap.add_argument("--edits", type=int, default=30, help="timed edits per variant and load")
    ap.add_argument("--rounds", type=int, default=8, help="throughput rounds per variant (interleaved)")
    ap.add_argument("--seconds", type=float, default=1.0, help="length of one throughput round")
    ap.add_argument("--timeout", type=float, default=30.0, help="give up on one edit after this many seconds")
    ap.add_argument("--noise", type=int, default=0,
                    help="processes spinning on the CPU while edits are timed (other jobs on a shared machine)")
    ap.add_argument("--latency-worker", nargs=2, metavar=("SITE", "THREADS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.latency_worker:
        kind, load = args.latency_worker
        latency_worker(kind, int(load), args.edits, args.interval, args.timeout)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    lat_rows: list[tuple[str, str, int, int, float, float]] = []
    tp_rows: list[tuple[str, str, int, float, float]] = []
    sites = args.sites.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        trees = {f"before ({args.baseline})": export_revision(args.baseline, Path(tmp) / "baseline"),
                 "after (this checkout)": ROOT}
        for r in range(args.rounds):  # interleaved: both variants see the same machine load
            for interval in (0.0, args.interval):
                mode = f"watcher every {interval} s" if interval else "no watcher"
                for name, tree in trees.items():
                    tp_rows.append((name, mode, r, *throughput_process(tree, args.threads, args.seconds, interval)))
        noise = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.noise)]
        try:
            lat_rows += latencies(trees, sites, args)
        finally:
            for p in noise:
                p.kill()
                p.wait()
    load_after = os.getloadavg()
    write_results(out, args, trees, sites, lat_rows, tp_rows, load_before, load_after)


def latencies(trees: dict[str, Path], sites: list[str], args: argparse.Namespace) -> list[
        tuple[str, str, int, int, float, float]]:
    """Every variant's edits, each variant, rules directory and load in a worker process."""
    lat_rows: list[tuple[str, str, int, int, float, float]] = []
    for kind in sites:
        for load in (0, args.threads):
            for half in range(2):  # each variant's edits in two halves, interleaved
                for name, tree in trees.items():
                    n = args.edits // 2 + (args.edits % 2 if half else 0)
                    proc = subprocess.run([sys.executable, __file__, "--out", args.out, "--latency-worker", kind,
                                           str(load), "--edits", str(n), "--interval", str(args.interval),
                                           "--timeout", str(args.timeout)], env={**os.environ,
                                          "BENCH_RELOAD_TREE": str(tree)}, capture_output=True, text=True,
                                          check=True, timeout=n * (args.timeout + 2) + 60)
                    for installed, observed in json.loads(proc.stdout.splitlines()[-1]):
                        e = sum(1 for v, k, t, *_ in lat_rows if v == name and k == kind and t == load)
                        lat_rows.append((name, kind, load, e, installed, observed))
                        print(f"{name}, {kind}: {load} selecting threads, edit {e}: installed {installed:.3f} s, "
                              f"observed {observed:.3f} s", flush=True)
    return lat_rows


def write_results(out: Path, args: argparse.Namespace, trees: dict[str, Path], sites: list[str],
                  lat_rows: list[tuple[str, str, int, int, float, float]],
                  tp_rows: list[tuple[str, str, int, float, float]], load_before: tuple[float, float, float],
                  load_after: tuple[float, float, float]) -> None:
    with open(out / "latency.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["variant", "rules", "selecting_threads", "edit", "seconds_to_install", "seconds_to_observe"])
        w.writerows((a, b, c, d, round(e, 4), round(f, 4)) for a, b, c, d, e, f in lat_rows)
    with open(out / "throughput.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["variant", "watcher", "round", "selects_per_wall_second", "selects_per_cpu_second"])
        w.writerows((a, b, c, round(d), round(e)) for a, b, c, d, e in tp_rows)
    lines = [f"Machine: {platform.machine()}, {os.cpu_count()} CPUs (shared with other jobs), Python "
             f"{platform.python_version()}; load average (1, 5, 15 min) {', '.join(f'{x:.2f}' for x in load_before)} "
             f"before the run, {', '.join(f'{x:.2f}' for x in load_after)} after; {args.threads} selecting "
             f"threads, watcher interval {args.interval} s, settle {current_store.SETTLE} s; "
             f"{args.noise} processes spinning on the CPU while edits were timed", "",
             "Seconds from the end of an edit to the new generation installed (`installed_at`; observed: seen by "
             "a thread checking every 2 ms, its own wait for the GIL included).", "",
             "| rules | variant | selecting threads | edits | installed: median | p90 | max | observed: median | "
             "max | edits over target | target |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    target = 2 * args.interval
    for kind in sites:
        for load in (0, args.threads):
            for name in trees:
                xs = sorted(e for v, k, n, _, e, _ in lat_rows if v == name and k == kind and n == load)
                ys = [o for v, k, n, _, _, o in lat_rows if v == name and k == kind and n == load]
                lines.append(f"| {kind} | {name} | {load} | {len(xs)} | {statistics.median(xs):.3f} | "
                             f"{xs[int(0.9 * (len(xs) - 1))]:.3f} | {max(xs):.3f} | {statistics.median(ys):.3f} | "
                             f"{max(ys):.3f} | {sum(x > target for x in xs)} | ≤ {target:.2f} |")
    if tp_rows:
        lines += ["", f"| variant | watcher | median selects per CPU second ({args.threads} threads together) | "
                  "vs before | median selects per wall second | vs before |", "|---|---|---|---|---|---|"]
        for mode in sorted({m for _, m, _, _, _ in tp_rows}):
            cpu0 = statistics.median(x for v, m, _, _, x in tp_rows if m == mode and v.startswith("before"))
            wall0 = statistics.median(x for v, m, _, x, _ in tp_rows if m == mode and v.startswith("before"))
            for name in trees:
                cpu = statistics.median(x for v, m, _, _, x in tp_rows if m == mode and v == name)
                wall = statistics.median(x for v, m, _, x, _ in tp_rows if m == mode and v == name)
                lines.append(f"| {name} | {mode} | {cpu:,.0f} | {cpu / cpu0:.3f} | {wall:,.0f} | {wall / wall0:.3f} |")
    text = "\n".join(lines)
    print(text)
    (out / "summary.md").write_text(text + "\n")


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    main()
