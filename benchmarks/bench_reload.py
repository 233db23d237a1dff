"""Hot reload under load (issue 28): how long an edit takes to serve while 8 threads select in tight loops, and
what the 8 threads' select throughput is, for the RuleStore of a baseline revision and of this checkout, in the
same run (interleaved, so both see the same machine load).

    python benchmarks/bench_reload.py --baseline ab69865 --out benchmarks/results/<run>/

Throughput: each variant in a process of its own, the baseline from its whole exported tree. Latency: the
baseline's oracle/store.py on this checkout's other modules (it loads rules the same way), from the end of a
rule-file write (in place, alternating two valid versions) to the store serving the
new generation, seen by a thread that checks every 2 ms (so it includes that thread's own wait for the GIL);
the store's watcher polls at `--interval`. Throughput: cached `select(prepared)` calls per second of all threads
together (wall clock), with no watcher and with the watcher polling. Writes latency.csv, throughput.csv and
summary.md under --out.
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
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
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import oracle.store as current_store  # noqa: E402
from oracle.api import Oracle  # noqa: E402
from oracle.log import DecisionLog  # noqa: E402

POLICY = """\
policies:
  mxfp4-gpt-oss:
    override: true
    family: mxfp4
    description: "gpt-oss, {name}"
    candidates: [{first}, {second}]
    steps:
      - {{id: auto-{lower}, try: candidates, why: "version {name}"}}
      - {{id: none-fits, outcome: unsupported, message: "neither fits", why: "a benchmark profile"}}
"""
VERSIONS = [POLICY.format(name="A", lower="a", first="TRITON", second="MARLIN"),
            POLICY.format(name="B", lower="b", first="MARLIN", second="TRITON")]
PROFILES = ("extends: builtin\ndefault: mine\nprofiles:\n"
            "  mine: {description: 'vllm-0.20 with one policy edited', extends: vllm-0.20, files: [policy.yaml]}\n")
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


def baseline_module(rev: str) -> ModuleType:
    """oracle/store.py as of `rev`, imported as oracle._store_baseline (it runs on this checkout's other modules)."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:oracle/store.py"], capture_output=True, text=True,
                         check=True).stdout
    spec = importlib.util.spec_from_loader("oracle._store_baseline", loader=None)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "oracle"
    sys.modules[spec.name] = mod
    exec(compile(src, f"{rev}:oracle/store.py", "exec"), mod.__dict__)  # noqa: S102 - this repository's own code
    return mod


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

    def store(self, module: ModuleType) -> Any:
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


def latency(store: Any, site: Site, timeout: float) -> float:
    """Seconds from the end of an edit to the store serving a new generation."""
    number = store.generation.number
    site.edit()
    t0 = time.perf_counter()
    while store.generation.number == number:
        if time.perf_counter() - t0 > timeout:
            return float("inf")
        time.sleep(0.002)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default="ab69865", help="git revision whose oracle/store.py is the 'before'")
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--sites", default="small,shipped", help="rules directories to time edits of (see Site)")
    ap.add_argument("--interval", type=float, default=0.25)
    ap.add_argument("--edits", type=int, default=6, help="timed edits per variant and load")
    ap.add_argument("--rounds", type=int, default=8, help="throughput rounds per variant (interleaved)")
    ap.add_argument("--seconds", type=float, default=1.0, help="length of one throughput round")
    ap.add_argument("--timeout", type=float, default=30.0, help="give up on one edit after this many seconds")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    variants = {f"before ({args.baseline})": baseline_module(args.baseline), "after (this checkout)": current_store}
    lat_rows: list[tuple[str, str, int, int, float]] = []
    tp_rows: list[tuple[str, str, int, float, float]] = []
    sites = args.sites.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        trees = dict(zip(variants, (export_revision(args.baseline, Path(tmp) / "baseline"), ROOT), strict=True))
        for r in range(args.rounds):  # interleaved: both variants see the same machine load
            for interval in (0.0, args.interval):
                mode = f"watcher every {interval} s" if interval else "no watcher"
                for name, tree in trees.items():
                    tp_rows.append((name, mode, r, *throughput_process(tree, args.threads, args.seconds, interval)))
        for kind in sites:
            for load in (0, args.threads):
                for i, (name, mod) in enumerate(variants.items()):
                    site = Site(kind, Path(tmp) / f"{kind}-{load}-{i}")
                    store = site.store(mod)
                    store.watch(interval=args.interval)
                    with Load(store, load, site.question) if load else _nothing():
                        time.sleep(0.3)
                        for e in range(args.edits):
                            seconds = latency(store, site, args.timeout)
                            lat_rows.append((name, kind, load, e, seconds))
                            print(f"{name}, {kind}: {load} selecting threads, edit {e}: {seconds:.3f} s", flush=True)
                            if seconds == float("inf"):
                                break
                            time.sleep(0.05)
                    store.close()
    with open(out / "latency.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["variant", "rules", "selecting_threads", "edit", "seconds_to_serve"])
        w.writerows(lat_rows)
    with open(out / "throughput.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["variant", "watcher", "round", "selects_per_wall_second", "selects_per_cpu_second"])
        w.writerows((a, b, c, round(d), round(e)) for a, b, c, d, e in tp_rows)
    lines = [f"Machine: {platform.machine()}, {os.cpu_count()} CPUs (shared), Python {platform.python_version()}; "
             f"{args.threads} selecting threads, watcher interval {args.interval} s, settle "
             f"{current_store.SETTLE} s (after only)", "",
             "| rules | variant | selecting threads | edits | median s to serve | max s to serve | target |",
             "|---|---|---|---|---|---|---|"]
    for kind in sites:
        for load in (0, args.threads):
            for name in variants:
                xs = [s for v, k, n, _, s in lat_rows if v == name and k == kind and n == load]
                lines.append(f"| {kind} | {name} | {load} | {len(xs)} | {statistics.median(xs):.3f} | {max(xs):.3f} | "
                             f"≤ {2 * args.interval:.2f} |")
    lines += ["", "| variant | watcher | median selects per CPU second (8 threads together) | vs before | median "
              "selects per wall second | vs before |", "|---|---|---|---|---|---|"]
    for mode in sorted({m for _, m, _, _, _ in tp_rows}):
        cpu0 = statistics.median(x for v, m, _, _, x in tp_rows if m == mode and v.startswith("before"))
        wall0 = statistics.median(x for v, m, _, x, _ in tp_rows if m == mode and v.startswith("before"))
        for name in variants:
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
