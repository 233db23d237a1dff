"""Hardware-counter profile of the Triton MoE layer's kernels with Nsight Compute (ncu): what limits each regime.

Issue 17 asks for a note per regime on what limits it (memory, launch, compute, occupancy) from measurement.
For each (shape, T) this runs ncu on one layer call (after a warm-up that compiles everything; only the call
between cudaProfilerStart/Stop is profiled, L2 flushed before each replayed pass as ncu does by default) and
condenses the counters per kernel: DRAM throughput, issue-slot use, achieved occupancy, ALU/FMA/tensor pipe
use and the top warp-stall reasons (warps stalled per issued instruction).

    python benchmarks/profile_moe_ncu.py --out DIR                      # ncu over the default cases (needs ncu)
    python benchmarks/profile_moe_ncu.py --cases gpt-oss-120b:1,deepseek-v3:256 --out DIR
    python benchmarks/profile_moe_ncu.py --cases deepseek-v3:4096 --sections MemoryWorkloadAnalysis_Tables --out DIR
                                          # also ncu's memory tables (shared-memory and L1 wavefronts), raw CSV only
    python benchmarks/profile_moe_ncu.py --report DIR                   # re-render the tables of a saved run
    python benchmarks/profile_moe_ncu.py --cases gpt-oss-120b:16384 --kernel ws_moe_gemm_kernel --out DIR
                                          # counters of that kernel's first --launches (8) launches only
    python benchmarks/profile_moe_ncu.py --cases deepseek-v3:4096 --source ws_moe_gemm_kernel --out DIR
                                          # where one kernel's warps stall, per SASS instruction (stalls-*.md),
                                          # and each launch's K loop split by opcode and stall reason
    MOE_ORACLE_TRITON_W4A8_MMA=fp8 python benchmarks/profile_moe_ncu.py --cases gpt-oss-120b:16384:mxfp8 --out DIR
                                          # a third field: the W4A8 layer with that act_quant (static FP8's input
                                          # scales from x and 1/64); the env variables pick its kernels

Clocks are left alone (`--clock-control none`), as the device notes ask; ncu's replay makes absolute times
somewhat longer than a CUDA graph's, so read the fractions, not the µs.
"""

from __future__ import annotations

import argparse
import csv
import glob
import io
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ("gpt-oss-120b:1", "gpt-oss-120b:64", "gpt-oss-120b:1024", "gpt-oss-120b:16384",
         "deepseek-v3:1", "deepseek-v3:16", "deepseek-v3:256", "deepseek-v3:4096")
#: ncu's own sections (their metric names are the tool's, so no name here can be unknown to it) ...
SECTIONS = ("SpeedOfLight", "Occupancy", "SchedulerStats", "WarpStateStats", "ComputeWorkloadAnalysis", "LaunchStats")
#: ... plus a few counters they may not hold (dropped again if this ncu does not know one of them).
EXTRA_METRICS = "dram__bytes_read.sum,smsp__warps_active.avg.per_cycle_active,smsp__warps_eligible.avg.per_cycle_active"
#: Stall reasons: warps stalled per issued instruction, or else program-counter samples per reason.
STALL = re.compile(r"smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)(?:_per_issue_active)?\.ratio$")
STALL_SAMPLES = re.compile(r"smsp__pcsamp_warps_issue_stalled_(\w+)$")
PIPE = re.compile(r"sm__inst_executed_pipe_(\w+)\.avg\.pct_of_peak_sustained_active$")


def run_case(shape_name: str, tokens: int, act_quant: str | None = None) -> None:
    """Build the layer, warm it up, then run one call inside cudaProfilerStart/Stop (what ncu captures); act_quant:
    the W4A8 layer."""
    import torch

    sys.path.insert(0, os.path.join(HERE, ".."))
    from backends.layouts.triton_moe import to_kernel_layout
    from backends.triton_moe import moe_forward
    from backends.triton_moe.testing import SHAPES, activation_kwargs, random_checkpoint

    torch.manual_seed(0)
    shape = SHAPES[shape_name]
    weights = to_kernel_layout(**random_checkpoint(shape, device="cuda"))
    x = torch.randn(tokens, shape.hidden_size, device="cuda").bfloat16()
    logits = torch.randn(tokens, shape.experts, device="cuda")
    quant = {"act_quant": act_quant} if act_quant else {}
    if act_quant == "fp8_per_tensor_static":
        quant |= {"a1_scale": (x.float().abs().amax() / 448).reshape(1),
                  "a2_scale": torch.full((1,), 1 / 64, device="cuda")}
    for _ in range(2):
        moe_forward(x, weights, router_logits=logits, top_k=shape.top_k, **activation_kwargs(shape), **quant)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    moe_forward(x, weights, router_logits=logits, top_k=shape.top_k, **activation_kwargs(shape), **quant)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def _kernel_filter(kernel: str | None, launches: int) -> list[str]:
    """ncu's arguments that profile only the first `launches` launches of `kernel` (none: every launch of the call;
    a large layer's counters, every kernel replayed once per pass, can take minutes)."""
    return [] if kernel is None else ["-k", kernel, "--launch-count", str(launches)]


def profile(cases, out: str, source: str | None = None, more_sections: tuple = (), kernel: str | None = None,
            launches: int = 8) -> None:
    ncu = shutil.which("ncu") or next(iter(sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"))), None)
    if ncu is None:
        sys.exit("profile_moe_ncu: ncu not found on PATH or under /opt/nvidia/nsight-compute; install Nsight Compute")
    os.makedirs(out, exist_ok=True)
    for case in cases:
        shape_name, tokens, *scheme = case.split(":")
        target = [sys.executable, os.path.abspath(__file__), "--run", case]
        name = f"{shape_name}-T{tokens}" + "".join(f"-{s}" for s in scheme)
        if source:
            print(profile_source(ncu, target, source, os.path.join(out, f"stalls-{name}"), launches), flush=True)
            continue
        path = os.path.join(out, f"ncu-{name}.csv")
        base = [ncu, "--clock-control", "none", "--profile-from-start", "off", *_kernel_filter(kernel, launches),
                "--csv", "--page", "raw"]
        sections = [arg for name in SECTIONS + tuple(more_sections) for arg in ("--section", name)]
        for what in (sections + ["--metrics", EXTRA_METRICS], sections):
            done = subprocess.run(base + what + target, capture_output=True, text=True)
            with open(path, "w") as f:
                f.write(done.stdout)
            if done.returncode == 0 and _rows(path):
                break
            print(f"# {case}: ncu exited {done.returncode} ({len(what)} args): {done.stderr[-1500:]}", flush=True)
        print(render(case, path), flush=True)


def profile_source(ncu: str, target: list, kernel: str, stem: str, launches: int = 8) -> str:
    """Per-instruction warp-stall samples of the first `launches` launches of `kernel` (ncu's SourceCounters): the
    SASS rows as ncu's source page CSV (stem.csv, kept for later reports) and their table (stem.md)."""
    report = stem + ".ncu-rep"
    done = subprocess.run([ncu, "--clock-control", "none", "--profile-from-start", "off",
                           *_kernel_filter(kernel, launches), "--section", "SourceCounters", "-f", "-o", report]
                          + target, capture_output=True, text=True)
    if done.returncode:
        return f"# {stem}: ncu exited {done.returncode}: {done.stderr[-1500:]}"
    page = subprocess.run([ncu, "-i", report, "--page", "source", "--csv", "--print-source", "sass"],
                          capture_output=True, text=True)
    os.remove(report)
    with open(stem + ".csv", "w") as f:
        f.write(page.stdout)
    table = render_source(stem + ".csv")
    with open(stem + ".md", "w") as f:
        f.write(table + "\n")
    return table


def render_source(path: str, top: int = 12) -> str:
    """ncu's source page (one CSV block per launch): per launch its stall reasons' shares of all warp samples, then
    the `top` most-sampled SASS instructions with their leading reasons."""
    text = open(path).read()
    lines = []
    for launch, block in enumerate(text.split('"Kernel Name",')[1:]):
        name, _, body = block.partition("\n")
        rows = list(csv.DictReader(io.StringIO(body)))
        reasons = [k for k in (rows[0] if rows else {}) if k.startswith("stall_") and "Not Issued" not in k]
        samples = [(_samples(r), r) for r in rows]
        total = sum(v for v, _ in samples) or 1.0
        share = sorted(((sum(_num(r, k) or 0.0 for r in rows) / total, k[6:]) for k in reasons), reverse=True)
        lines += [f"\n### launch {launch}: {name.strip(chr(34) + ',')}, {total:.0f} samples\n",
                  "reasons: " + ", ".join(f"{k} {v:.0%}" for v, k in share[:6] if v >= 0.01) + "\n",
                  "| share | SASS | leading reasons (samples) |", "|---|---|---|"]
        for value, r in sorted(samples, key=lambda vr: -vr[0])[:top]:
            lead = sorted(((_num(r, k) or 0.0, k[6:]) for k in reasons), reverse=True)[:3]
            sass = " ".join(r.get("Source", "").split()).replace("|", "/")
            lines.append(f"| {value / total:.3f} | `{sass}` | " + ", ".join(f"{k} {v:.0f}" for v, k in lead if v)
                         + " |")
        lines += _k_loop_lines(rows, reasons, total)
    return "\n".join(lines) if lines else f"(no source rows in {os.path.basename(path)})"


#: A branch in ncu's SASS text, with its target address.
BRANCH = re.compile(r"\bBRA(?:\.\w+)*\s+(0x[0-9a-fA-F]+)")


def k_loop(rows: list[dict]) -> tuple[int, int] | None:
    """(first, last) row of a launch's K loop: of the loops (a branch back to an earlier address) that hold a wgmma
    (`GMMA`) and at least a quarter of the samples of the most-sampled such loop, the shortest (the branches of a
    tile's loop around it and of its epilogue also jump back over it); None without one."""
    address = {int(r["Address"], 16): i for i, r in enumerate(rows) if str(r.get("Address", "")).startswith("0x")}
    loops = []
    for i, r in enumerate(rows):
        target = BRANCH.search(r.get("Source", ""))
        start = address.get(int(target.group(1), 16)) if target else None
        if start is not None and start < i and any("GMMA" in rows[k].get("Source", "") for k in range(start, i + 1)):
            loops.append((start, i))
    weight = {(a, b): sum(_samples(r) for r in rows[a:b + 1]) for a, b in loops}
    heavy = [(b - a, (a, b)) for (a, b), w in weight.items() if w >= max(weight.values()) / 4]
    return min(heavy)[1] if heavy else None


def _k_loop_lines(rows: list[dict], reasons: list[str], total: float, top: int = 8) -> list[str]:
    """The K loop's (`k_loop`) share of the launch's samples and its leading (opcode, stall reason) pairs."""
    span = k_loop(rows)
    if span is None:
        return []
    first, last = span
    pairs: dict[tuple[str, str], float] = {}
    for r in rows[first:last + 1]:
        words = r.get("Source", "").split()
        opcode = (words[1] if words and words[0].startswith("@") and len(words) > 1 else (words or ["?"])[0])
        for k in reasons:
            key = (opcode.split(".")[0], k[6:])
            pairs[key] = pairs.get(key, 0.0) + (_num(r, k) or 0.0)
    in_loop = sum(_samples(r) for r in rows[first:last + 1])
    leading = sorted(((v, op, k) for (op, k), v in pairs.items() if v), reverse=True)[:top]
    return ["", f"K loop: {last - first + 1} SASS instructions, {in_loop / total:.1%} of the samples; by opcode and "
            "reason (share of the loop's samples): " + ", ".join(f"{op} {k} {v / (in_loop or 1):.1%}"
                                                                 for v, op, k in leading)]


def _samples(row: dict) -> float:
    """A source-page row's warp samples (all reasons)."""
    return _num(row, "Warp Stall Sampling (All Samples)") or 0.0


def _rows(path: str) -> list[dict]:
    """ncu --csv --page raw: a header row, a units row, then one row per profiled kernel launch."""
    text = open(path).read()
    start = text.find('"ID"')
    if start < 0:
        return []
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    return [r for r in rows[1:] if r.get("Kernel Name")]


def _num(row: dict, key: str) -> float | None:
    try:
        return float(str(row.get(key, "")).replace(",", ""))
    except ValueError:
        return None


def render(case: str, path: str) -> str:
    rows = _rows(path)
    if not rows:
        return f"\n### {case}\n\n(no ncu rows in {os.path.basename(path)})"
    pipes = [("alu", "ALU"), ("fma", "FMA"), ("fmaheavy", "FMA-heavy"), ("fp16", "FP16"), ("lsu", "LSU"),
             ("tensor_op_hmma", "mma.sync"), ("tensor_op_gmma", "wgmma")]
    head = ["kernel", "grid", "block", "regs", "µs (ncu)", "DRAM % peak", "GB read", "SM % peak", "issue % active",
            "occupancy %", "warps active / eligible per scheduler", "pipes % (of active cycles)", "top stalls"]
    lines = [f"\n### {case}\n", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        stalls = [(m.group(1), _num(r, k)) for k in r if (m := STALL.match(k)) and _num(r, k) is not None]
        unit = "warps per issue"
        if not stalls:  # sampled: share of the samples per reason
            samples = [(m.group(1), _num(r, k)) for k in r if (m := STALL_SAMPLES.match(k)) and _num(r, k)]
            total = sum(v for _, v in samples) or 1.0
            stalls, unit = [(name, v / total) for name, v in samples], "share of samples"
        stalls.sort(key=lambda kv: -kv[1])
        pipe_use = {m.group(1): _num(r, k) for k in r if (m := PIPE.match(k))}
        pipe_cells = [f"{label} {pipe_use[key]:.0f}" for key, label in pipes
                      if pipe_use.get(key) is not None and pipe_use[key] >= 1.0]

        def fmt(key, scale=1.0, digits=1, row=r):
            v = _num(row, key)
            return "-" if v is None else f"{v * scale:.{digits}f}"

        lines.append("| " + " | ".join([
            r["Kernel Name"][:28], r.get("launch__grid_size", "-"), r.get("launch__block_size", "-"),
            r.get("launch__registers_per_thread", "-"), fmt("gpu__time_duration.sum", 1e-3),
            fmt("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", 1, 0), fmt("dram__bytes_read.sum", 1e-9, 3),
            fmt("sm__throughput.avg.pct_of_peak_sustained_elapsed", 1, 0),
            fmt("smsp__issue_active.avg.pct_of_peak_sustained_active", 1, 0),
            fmt("sm__warps_active.avg.pct_of_peak_sustained_active", 1, 0),
            fmt("smsp__warps_active.avg.per_cycle_active") + " / "
            + fmt("smsp__warps_eligible.avg.per_cycle_active", 1, 2),
            ", ".join(pipe_cells) or "-",
            (", ".join(f"{name} {v:.2f}" for name, v in stalls[:4] if v >= 0.05) + f" ({unit})") if stalls else "-",
        ]) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated SHAPE:T[:ACT_QUANT]")
    p.add_argument("--out", default=None, help="directory for the raw ncu CSV per case")
    p.add_argument("--report", metavar="DIR", help="render the tables of a saved run (no GPU needed)")
    p.add_argument("--source", metavar="KERNEL", help="instead: per-instruction stall samples of KERNEL's launches "
                   "(stalls-*.md and the source page CSV per case)")
    p.add_argument("--sections", default="", help="comma-separated ncu sections to collect beside SECTIONS (e.g. "
                   "MemoryWorkloadAnalysis_Tables: shared-memory and L1 wavefronts; kept in the raw CSV)")
    p.add_argument("--kernel", metavar="KERNEL", help="counters of KERNEL's launches only (the first --launches): "
                   "what a large layer's run needs to finish in minutes")
    p.add_argument("--launches", type=int, default=8, help="launches profiled with --kernel or --source (default 8)")
    p.add_argument("--run", metavar="SHAPE:T", help=argparse.SUPPRESS)  # the process ncu profiles
    args = p.parse_args()
    if args.run:
        shape_name, tokens, *scheme = args.run.split(":")
        run_case(shape_name, int(tokens), *scheme)
    elif args.report:
        for path in sorted(glob.glob(os.path.join(args.report, "ncu-*.csv"))):
            case = os.path.basename(path)[4:-4].replace("-T", ":")
            print(render(case, path))
        for path in sorted(glob.glob(os.path.join(args.report, "stalls-*.csv"))):
            print(render_source(path))
    else:
        if not args.out:
            p.error("--out DIR is required to profile (the raw CSVs are kept there)")
        if args.launches < 1:
            p.error(f"--launches must be at least 1, got {args.launches}")
        profile(args.cases.split(","), args.out, args.source, tuple(filter(None, args.sections.split(","))),
                args.kernel, args.launches)


if __name__ == "__main__":
    main()
