"""README tables and plots of the model matrix from the committed runs (benchmarks/results/*/matrix.csv).

Per GPU kind (the model word of the device name: H100, H200, ...) it writes benchmarks/results/<GPU>.md and
<GPU>.png. Every cell compares implementations of ONE run: for each (layer, T) the run that measured the most
implementations there (the latest on a tie). No GPU needed; the plot needs matplotlib.

    python benchmarks/report_matrix.py [--results benchmarks/results]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
try:
    from backends.model_shapes import MATRIX
except ImportError:  # run from another directory without the checkout on sys.path
    MATRIX = ()

OURS, HEURISTIC = "this project (tuned)", "this project (heuristic)"
FLOOR, MATMUL = "memory floor", "bf16 matmul bound"
PEERS = ("Humming", "triton_kernels")
#: benchmarks/bench_w4a8.py's rows: this project's W4A8 layer per FP8 activation scheme (act_quant value -> name),
#: and the FP8 bound. Its tile-variant A/B rows are named "<scheme's name> [<variant>]": not in this table's cells.
W4A8_SCHEMES = {"mxfp8": "this project W4A8 mxfp8", "fp8_per_tensor_static": "this project W4A8 fp8 static"}
W4A8 = tuple(W4A8_SCHEMES.values())
#: bench_w4a8.py --ws-fp8-dots: each scheme's layer on the warp-specialized FP8 kernels, "<scheme's name> [<this>]";
#: shown and judged beside the schemes' rows (an opt-in the user makes: w4a8_mma="fp8", fp8_accumulate="tensor-core")
WARP_SPECIALIZED_FP8 = "fp8 dots, warp-specialized"
W4A8_SHOWN = W4A8 + tuple(f"{name} [{WARP_SPECIALIZED_FP8}]" for name in W4A8)
FP8_MATMUL = "fp8 matmul bound"
#: issue 32's speed conditions: at T >= 4096 W4A8 >= 1.6x W4A16 and >= 0.55 of the FP8 torch._scaled_mm rate; at
#: T <= 256 no slower than W4A16
W4A8_SPEEDUP, W4A8_SCALED_MM, W4A8_PREFILL_T, W4A8_DECODE_T = 1.6, 0.55, 4096, 256
#: issue 32's W4A16 prefill condition: at T >= W4A8_PREFILL_T on these layers, >= 0.70 of the run's bf16 matmul rate
W4A16_OF_BF16, W4A16_PREFILL_LAYERS = 0.70, ("gpt-oss-120b", "deepseek-v3")
#: Done-when thresholds of the matrix (issue 26): peers within 3% count as parity where they run at >= 90% of the
#: floor; the heuristic within 10% of the tuned table; T = 1 at >= 0.60 of the floor on the two named layers.
PARITY, PARITY_FLOOR, HEURISTIC_SLACK, T1_FLOOR, T1_LAYERS = 0.03, 0.90, 0.10, 0.60, ("gpt-oss-120b", "deepseek-v3")


def gpu_kind(name: str) -> str:
    return name.removeprefix("NVIDIA ").split()[0]


def load(results: Path) -> dict:
    """{gpu kind: {(shape, T): {implementation: row}}} choosing, per (shape, T), one run."""
    by_cell: dict = defaultdict(lambda: defaultdict(dict))  # (kind, shape, T) -> run -> impl -> row
    envs = {}
    for path in sorted(results.glob("*/matrix.csv")):
        env = json.loads((path.parent / "environment.json").read_text())
        envs[env["run_id"]] = {**env, "dir": path.parent.name}
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                by_cell[(gpu_kind(row["gpu"]), row["shape"], int(row["tokens"]))][row["run_id"]][
                    row["implementation"]] = row
    out: dict = defaultdict(dict)
    w4a8: dict = defaultdict(dict)
    for (kind, shape, tokens), runs in by_cell.items():
        def score(run_id, runs=runs):
            measured = sum(1 for r in runs[run_id].values() if r["us"] and r["implementation"] not in (
                FLOOR, MATMUL, FP8_MATMUL))
            return measured, envs[run_id]["date"]
        # bench_w4a8.py's runs have a section of their own: the matrix's cells come from the other runs, so a T
        # that only a W4A8 run timed adds no column there
        matrix_runs = [r for r in runs if not any(impl.startswith(W4A8) for impl in runs[r])]
        if matrix_runs:
            best = max(matrix_runs, key=score)
            out[kind][(shape, tokens)] = {"run": best, **runs[best]}
        with_w4a8 = [r for r in runs if any(runs[r].get(impl, {}).get("us") for impl in W4A8)]
        if with_w4a8:  # the latest run that timed W4A8 here, with its own W4A16 row
            latest = max(with_w4a8, key=lambda r: envs[r]["date"])
            w4a8[kind][(shape, tokens)] = {"run": latest, **runs[latest]}
    return {"cells": out, "envs": envs, "w4a8": w4a8}


def _us(row) -> float | None:
    return float(row["us"]) if row and row.get("us") else None


def _peer_cell(row, ours: float | None) -> str:
    if row is None:
        return "not in this run"
    us = _us(row)
    if us is None:
        note = row["note"]
        if note.startswith("cannot run"):
            return "cannot run"
        if note.startswith("not timed"):
            return "wrong output"
        return "failed"
    return f"{us:.1f} ({us / ours:.2f}x)" if ours else f"{us:.1f}"


def verdicts(cell: dict, shape: str, tokens: int) -> dict:
    """The issue's done-when conditions at one (layer, T): None where they cannot be judged."""
    ours, heuristic, floor = _us(cell.get(OURS)), _us(cell.get(HEURISTIC)), _us(cell.get(FLOOR))
    peers = {p: _us(cell.get(p)) for p in PEERS if _us(cell.get(p))}
    beats = None
    if ours and peers:
        beats = all(ours <= us or (floor and floor / us >= PARITY_FLOOR and ours <= us * (1 + PARITY))
                    for us in peers.values())
    heuristic_ok = heuristic <= ours * (1 + HEURISTIC_SLACK) if ours and heuristic else None
    t1 = floor / ours >= T1_FLOOR if tokens == 1 and shape in T1_LAYERS and ours and floor else None
    return {"beats_peers": beats, "heuristic_within_10pct": heuristic_ok, "t1_floor": t1}


def _ordered(cells: dict) -> list:
    """Layers in the registry's matrix order, others after them by name."""
    names = {s for s, _ in cells}
    return [n for n in MATRIX if n in names] + sorted(names - set(MATRIX))


def markdown(kind: str, data: dict) -> str:
    cells = data["cells"][kind]
    shapes = _ordered(cells)
    runs = sorted({c["run"] for c in cells.values()})
    lines = [f"# Model matrix on {kind}", "",
             "Generated by `benchmarks/report_matrix.py` from `benchmarks/results/*/matrix.csv`; do not edit. Method: "
             "the whole layer including routing as a CUDA graph, L2 flushed before each replay, median; the same "
             "random weights for every implementation of a run. Cells: µs, and in brackets peer µs ÷ this project's "
             "tuned µs (> 1: this project is faster). Floor: the touched experts' bytes at the bandwidth measured in "
             "the same run. Peers are timed only where their output matches this project's (rel. L2 ≤ 1e-2).", "",
             "Runs: " + "; ".join(f"`{r}` ({data['envs'][r]['gpu']}, commit {data['envs'][r]['commit'][:8]}, "
                                  f"{data['envs'][r]['bandwidth_gbs']:.0f} GB/s, bf16 matmul "
                                  f"{data['envs'][r]['matmul_tflops']:.0f} TFLOP/s, humming "
                                  f"{data['envs'][r].get('humming')})" for r in runs), ""]
    summary = defaultdict(lambda: [0, 0])
    for shape in shapes:
        tokens = sorted(t for s, t in cells if s == shape)
        first = cells[(shape, tokens[0])]
        dims = first[OURS] if OURS in first else next(iter(v for k, v in first.items() if k != "run"))
        lines += [f"## {shape} ({dims['format']}, E={dims['experts']}, top-{dims['top_k']}, H={dims['hidden_size']}, "
                  f"I={dims['intermediate_size']})", "",
                  "| T | " + " | ".join(map(str, tokens)) + " |", "|---|" + "---|" * len(tokens)]

        def row(label, fn, tokens=tokens, shape=shape):
            return f"| {label} | " + " | ".join(fn(cells[(shape, t)], t) for t in tokens) + " |"

        def ours_cell(c, t):
            us, floor = _us(c.get(OURS)), _us(c.get(FLOOR))
            return f"**{us:.1f}** / {floor / us:.2f}" if us and floor else "-"

        def heuristic_cell(c, t):
            us, tuned = _us(c.get(HEURISTIC)), _us(c.get(OURS))
            return f"{us:.1f} ({us / tuned:.2f})" if us and tuned else "-"

        lines.append(row("this project (tuned) µs / fraction of floor", ours_cell))
        lines.append(row("heuristic only µs (÷ tuned)", heuristic_cell))
        for peer in PEERS:
            lines.append(row(peer, lambda c, t, peer=peer: _peer_cell(c.get(peer), _us(c.get(OURS)))))
        lines.append(row("memory floor µs", lambda c, t: f"{_us(c.get(FLOOR)):.1f}" if _us(c.get(FLOOR)) else "-"))
        lines.append(row("config (tuned)", lambda c, t: (c.get(OURS, {}).get("config", "-").split(":")[0] or "-")))
        lines.append("")
        for t in tokens:
            for key, value in verdicts(cells[(shape, t)], shape, t).items():
                if value is not None:
                    summary[key][0] += bool(value)
                    summary[key][1] += 1
    lines += ["## Done-when conditions over the cells measured", "",
              "| condition | cells that hold / cells judged |", "|---|---|",
              f"| faster than every peer that ran the cell with a matching output (or within 3% of one at ≥ 90% of "
              f"the floor) | {summary['beats_peers'][0]} / {summary['beats_peers'][1]} |",
              f"| heuristic alone within 10% of the tuned config | {summary['heuristic_within_10pct'][0]} / "
              f"{summary['heuristic_within_10pct'][1]} |",
              f"| T = 1 at ≥ 0.60 of the floor ({', '.join(T1_LAYERS)}) | {summary['t1_floor'][0]} / "
              f"{summary['t1_floor'][1]} |", "", f"![µs vs T per layer]({kind}.png)", ""]
    return "\n".join(lines + w4a8_markdown(kind, data))


def _of_bf16(cell: dict) -> float | None:
    """W4A16's µs as a fraction of the same run's bf16 matmul rate: the bound's µs over the layer's."""
    ours, bound = _us(cell.get(OURS)), _us(cell.get(MATMUL))
    return bound / ours if ours and bound else None


def w4a8_markdown(kind: str, data: dict) -> list[str]:
    """W4A16 vs W4A8 per layer, each cell from one run of benchmarks/bench_w4a8.py, and issue 32's speed
    conditions over the cells measured."""
    cells = data.get("w4a8", {}).get(kind)
    if not cells:
        return []
    lines = ["## W4A8 (FP8 activations) beside W4A16", "",
             "From `benchmarks/bench_w4a8.py`: W4A16 and both W4A8 schemes (as moe_forward runs them, and on the "
             f"warp-specialized FP8 kernels: `[{WARP_SPECIALIZED_FP8}]`) timed in the same run. Cells: µs "
             "(W4A16 µs ÷ W4A8 µs; fraction of the run's FP8 8192³ `torch._scaled_mm` rate); W4A16's row as a "
             "fraction of the run's bf16 8192³ matmul rate below it.", ""]
    held = defaultdict(lambda: [0, 0])
    for shape in _ordered(cells):
        tokens = sorted(t for s, t in cells if s == shape)
        lines += [f"### {shape}", "", "| T | " + " | ".join(map(str, tokens)) + " |", "|---|" + "---|" * len(tokens)]
        lines.append("| this project W4A16 µs | " + " | ".join(
            f"{_us(cells[(shape, t)].get(OURS)):.1f}" if _us(cells[(shape, t)].get(OURS)) else "-" for t in tokens)
            + " |")
        lines.append("| W4A16 ÷ bf16 matmul rate | " + " | ".join(
            f"{f:.3f}" if (f := _of_bf16(cells[(shape, t)])) else "-" for t in tokens) + " |")
        for t in tokens:
            fraction = _of_bf16(cells[(shape, t)])
            if fraction and t >= W4A8_PREFILL_T and shape in W4A16_PREFILL_LAYERS:
                held["w4a16_of_bf16"][0] += fraction >= W4A16_OF_BF16
                held["w4a16_of_bf16"][1] += 1
        for impl in W4A8_SHOWN:
            row = []
            for t in tokens:
                c = cells[(shape, t)]
                us, w16, fp8 = _us(c.get(impl)), _us(c.get(OURS)), _us(c.get(FP8_MATMUL))
                if not us:
                    row.append("-")
                    continue
                speedup = w16 / us if w16 else None
                fraction = fp8 / us if fp8 else None
                parts = ([f"{speedup:.2f}x"] if speedup else []) + ([f"{fraction:.2f}"] if fraction else [])
                row.append(f"{us:.1f} ({'; '.join(parts)})" if parts else f"{us:.1f}")
                if speedup and t >= W4A8_PREFILL_T:
                    held["prefill_speedup"][0] += speedup >= W4A8_SPEEDUP
                    held["prefill_speedup"][1] += 1
                if fraction and t >= W4A8_PREFILL_T:
                    held["prefill_scaled_mm"][0] += fraction >= W4A8_SCALED_MM
                    held["prefill_scaled_mm"][1] += 1
                if speedup and t <= W4A8_DECODE_T:
                    held["decode_no_slower"][0] += speedup >= 1.0
                    held["decode_no_slower"][1] += 1
            if set(row) != {"-"}:
                lines.append(f"| {impl} | " + " | ".join(row) + " |")
        lines.append("")
    lines += ["| condition (issue 32) | cells that hold / cells judged |", "|---|---|",
              f"| T ≥ {W4A8_PREFILL_T}: W4A16 ≥ {W4A16_OF_BF16} of the bf16 matmul ({', '.join(W4A16_PREFILL_LAYERS)})"
              f" | {held['w4a16_of_bf16'][0]} / {held['w4a16_of_bf16'][1]} |",
              f"| T ≥ {W4A8_PREFILL_T}: W4A8 ≥ {W4A8_SPEEDUP}x W4A16 | {held['prefill_speedup'][0]} / "
              f"{held['prefill_speedup'][1]} |",
              f"| T ≥ {W4A8_PREFILL_T}: W4A8 ≥ {W4A8_SCALED_MM} of FP8 scaled_mm | {held['prefill_scaled_mm'][0]} / "
              f"{held['prefill_scaled_mm'][1]} |",
              f"| T ≤ {W4A8_DECODE_T}: W4A8 no slower than W4A16 | {held['decode_no_slower'][0]} / "
              f"{held['decode_no_slower'][1]} |", ""]
    return lines


def plot(kind: str, data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = data["cells"][kind]
    shapes = _ordered(cells)
    cols = 3
    rows = -(-len(shapes) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    styles = {OURS: ("C0", "-", "o"), HEURISTIC: ("C0", ":", "x"), "Humming": ("C1", "-", "s"),
              "triton_kernels": ("C2", "-", "^"), FLOOR: ("0.5", "--", None)}
    for ax, shape in zip(axes.flat, shapes, strict=False):
        tokens = sorted(t for s, t in cells if s == shape)
        for impl, (color, line, marker) in styles.items():
            points = [(t, _us(cells[(shape, t)].get(impl))) for t in tokens]
            points = [(t, us) for t, us in points if us]
            if points:
                ax.plot(*zip(*points, strict=True), color=color, linestyle=line, marker=marker, label=impl,
                        markersize=4)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(shape, fontsize=10)
        ax.set_xlabel("T (tokens)")
        ax.set_ylabel("µs")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(shapes):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9)
    fig.suptitle(f"MoE layer µs vs T on {kind} (CUDA graph, L2 flushed)")
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args()
    results = Path(args.results)
    if not args.no_plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("report_matrix.py: the plots need matplotlib (pip install matplotlib); or pass --no-plot",
                  file=sys.stderr)
            return 2
    data = load(results)
    for kind in sorted(data["cells"]):
        (results / f"{kind}.md").write_text(markdown(kind, data))
        if not args.no_plot:
            plot(kind, data, results / f"{kind}.png")
        print(f"wrote {results / (kind + '.md')}" + ("" if args.no_plot else f" and {kind}.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
