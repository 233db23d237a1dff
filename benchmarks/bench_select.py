"""Selection speed: load + validate + compile of the shipped rules, and select() per call.

Prints a markdown table. Baseline in the same run: a hand-written Python if/elif
selector for the same gpt-oss question (the shape of vLLM's code), so ratios are
comparable across machines. Reloads (no change, one file touched or edited) are in
bench_runtime.py. Usage: python benchmarks/bench_select.py [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _timing import best, each  # noqa: E402


def handwritten_gpt_oss(cap, kind, packages, env, activation, lora, batched):
    """An if/elif selector of the shape vLLM writes by hand (auto path only), as a baseline."""
    tk = "triton_kernels" in packages and cap is not None and (9, 0) <= cap < (11, 0)
    if lora:
        return "MARLIN"
    bf16 = env.get("VLLM_USE_FLASHINFER_MOE_MXFP4_BF16")
    order = ["TRTLLM", "AITER", "TRITON", "CUTLASS", "MARLIN", "BATCHED_MARLIN", "XPU", "EMULATION"]
    if bf16 == "0":
        order = [b for b in order if b not in ("TRTLLM", "CUTLASS")]
    for b in order:
        if (b == "TRTLLM" and kind == "cuda" and cap[0] == 10 and "flashinfer" in packages
                and activation in ("swigluoai", "silu") and not batched):
            return b
        if b == "TRITON" and tk and activation == "swigluoai" and not batched:
            return b
        if b == "CUTLASS" and kind == "cuda" and cap == (9, 0) and "flashinfer" in packages and not batched:
            return b
        if b == "MARLIN" and kind == "cuda" and cap >= (7, 5) and not batched:
            return b
        if b == "BATCHED_MARLIN" and kind == "cuda" and cap >= (7, 5) and batched:
            return b
        if b == "EMULATION" and kind in ("cuda", "rocm", "xpu"):
            return b
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()

    t0 = time.perf_counter()
    import oracle  # noqa: F401  (imports yaml, jsonschema-rs)
    from oracle import Oracle
    import_ms = (time.perf_counter() - t0) * 1e3

    # cold loads (each from scratch: files read, parsed, checked; generated code compiles on first use)
    construct = each(lambda: Oracle(), 15)  # every profile checked, none compiled
    load_default = each(lambda: Oracle().table(), 15)
    load = each(lambda: Oracle().compile_all(), 15)
    o = Oracle()
    o.compile_all()
    default = o.default_profile

    sample = (ROOT / "tests" / "data" / "golden-sample.jsonl").read_text().splitlines()
    golden = [json.loads(line)["scenario"] for line in sample]
    questions = [s for s in golden if s.get("query", "select") == "select"]
    selects = [o.prepare(s) for s in questions]
    first = []  # after a cold load, a question's first answer compiles the generated code it runs for the first time
    fresh = Oracle()
    fresh.compile_all()
    for sc in selects:
        t = time.process_time()
        fresh.select_uncached(sc)
        first.append(time.process_time() - t)
    uncached = [best(lambda sc=sc: o.select_uncached(sc), 200, 3) for sc in selects]
    from_dict = [best(lambda s=s: o.select_uncached(o.prepare(s)), 50, 3) for s in questions]
    gpt_hot = o.prepare({"policy": "mxfp4-gpt-oss", "profile": "vllm-0.20",
                         "platform": {"kind": "cuda", "capability": [9, 0]},
                         "packages": {"triton_kernels": True, "flashinfer": True}})
    o.select(gpt_hot)
    repeated = best(lambda: o.select(gpt_hot), 20000)
    with_trace = best(lambda: o.select_uncached(gpt_hot).trace, 2000)

    args_hw = ((9, 0), "cuda", frozenset({"triton_kernels", "flashinfer"}), {}, "swigluoai", False, False)
    hand = best(lambda: handwritten_gpt_oss(*args_hw), 20000)
    ours_same = best(lambda: o.select_uncached(gpt_hot), 5000)

    us = lambda s: f"{s * 1e6:.2f} µs"  # noqa: E731
    ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731

    def cpu_wall(samples: tuple[list[float], list[float]]) -> str:
        return f"{ms(statistics.median(samples[0]))} CPU ({ms(statistics.median(samples[1]))} wall), median"
    rows = [
        ("import oracle (yaml, jsonschema-rs), once per process", f"{import_ms:.0f} ms", "—"),
        (f"cold load: Oracle() (read, parse, check all {len(o.profiles())} profiles; none compiled)",
         cpu_wall(construct), "—"),
        (f"cold load + compile the default profile ({default})", cpu_wall(load_default), "—"),
        (f"cold load + compile all {len(o.profiles())} profiles (shared files parsed once)", cpu_wall(load), "—"),
        ("first select of each golden question after a cold load, in file order (compiles the code it runs "
         "first): median / max", f"{us(statistics.median(first))} / {ms(max(first))}", "—"),
        (f"select, uncached, prepared Scenario (median of {len(selects)} golden questions)",
         us(statistics.median(uncached)), "≤ 10 µs"),
        ("select, uncached, slowest golden question", us(max(uncached)), "—"),
        ("select from a dict (validate scenario + answer), median", us(statistics.median(from_dict)), "≤ 20 µs"),
        ("select, repeated identical question (cache hit)", us(repeated), "≤ 1 µs"),
        ("gpt-oss on SM90: select + full trace (trace is lazy, built on demand)", us(with_trace), "—"),
        ("gpt-oss on SM90: moe-oracle uncached", us(ours_same), "—"),
        ("gpt-oss on SM90: minimal if/elif baseline (no classes, logging, env parsing), same run", us(hand), "—"),
        ("ratio moe-oracle / hand-written baseline", f"{ours_same / hand:.1f}x", "—"),
    ]
    lines = [f"Machine: {platform.machine()}, {platform.processor() or 'cpu'}, Python {platform.python_version()}", "",
             "| measurement | result | target |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
