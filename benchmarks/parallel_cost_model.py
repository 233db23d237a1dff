"""A short cost model of one parallel MoE layer: per-rank expert kernel time plus the collectives' time.

No torch: the model is arithmetic over the layer's sizes, a roofline of the expert kernels calibrated on this
project's single-GPU H100 table (benchmarks/README-moe.md), and a latency + bytes / bandwidth model of each NCCL
collective. `benchmarks/gpu_parallel.py` fits the collective terms and times the steps on 2 GPUs, then calls
`check` to print predicted against measured; `--table` prints the scale-out predictions of docs/parallel.md.

    python benchmarks/parallel_cost_model.py --table                     # EP 8..64 and TP 8 for DeepSeek-V3, Kimi-K2
    python benchmarks/parallel_cost_model.py --check DIR                 # DIR: a gpu_parallel.py run's CSVs
"""

from __future__ import annotations

import argparse
import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path

__all__ = ["LAYERS", "Kernels", "Link", "Network", "Layer", "check", "predict"]


@dataclass(frozen=True)
class Layer:
    name: str
    experts: int
    top_k: int
    hidden: int
    inter: int
    bits_per_weight: float  # packed FP4 plus its block scales: MXFP4 4 + 8/32, NVFP4 4 + 8/16

    @property
    def expert_bytes(self) -> float:
        return 3 * self.hidden * self.inter * self.bits_per_weight / 8


LAYERS = {  # routed experts of one layer (shared experts are a dense MLP outside this model)
    "gpt-oss-120b": Layer("gpt-oss-120b", 128, 4, 2880, 2880, 4.25),
    "deepseek-v3": Layer("deepseek-v3", 256, 8, 7168, 2048, 4.5),
    "kimi-k2": Layer("kimi-k2", 384, 8, 7168, 2048, 4.5),
}


@dataclass(frozen=True)
class Kernels:
    """Roofline of this project's fused W4A16 MoE on one GPU: a fixed cost (routing, alignment, launches), then
    the larger of streaming the touched experts' weights and the MMAs. Calibrated on the single-GPU H100 table
    (deepseek-v3: T = 1 108.7 µs with 65.3 µs floor -> t0 ~40 µs; T = 16-256 at
    0.93-0.94 of the 3036 GB/s floor; T = 4096 at 370 TFLOP/s, gpt-oss-120b at 418)."""

    fixed_us: float = 40.0
    bandwidth_gbs: float = 3036 * 0.93
    mma_tflops: float = 380.0

    def experts_us(self, layer: Layer, experts_here: int, inter_here: int, pairs: float, tokens_seen: float) -> float:
        """µs for `pairs` (token, expert) rows over `experts_here` experts of I = `inter_here`, the experts being
        picked by `tokens_seen` tokens (each choosing top_k distinct of E at random)."""
        touched = experts_here * (1 - (1 - layer.top_k / layer.experts) ** tokens_seen)
        weight_bytes = touched * 3 * layer.hidden * inter_here * layer.bits_per_weight / 8
        flops = 6 * pairs * layer.hidden * inter_here
        return self.fixed_us + max(weight_bytes / (self.bandwidth_gbs * 1e3), flops / (self.mma_tflops * 1e6))


@dataclass(frozen=True)
class Link:
    """One collective: t = latency + factor x bytes / bus bandwidth, with nccl-tests' bus-bandwidth factor."""

    latency_us: float
    busbw_gbs: float

    def us(self, factor_bytes: float) -> float:
        return self.latency_us + factor_bytes / (self.busbw_gbs * 1e3)


@dataclass(frozen=True)
class Network:
    """The collectives within a node (NVLink, NVLS off) and across nodes (one 400 Gb/s NIC per GPU). Defaults
    are nominal H100 SXM figures until a run measures them (gpu_parallel.py fits `intra` on 2 GPUs)."""

    all_reduce: Link = Link(20.0, 360.0)
    all_gather: Link = Link(20.0, 360.0)
    reduce_scatter: Link = Link(20.0, 360.0)
    all_to_all: Link = Link(20.0, 340.0)
    inter_node_gbs: float = 40.0  # 400 Gb/s NDR per GPU at ~80%
    inter_node_latency_us: float = 35.0
    gpus_per_node: int = 8
    host_sync_us: float = 15.0  # the dispatch reads exchanged counts on the host

    def link(self, kind: str, ranks: int) -> Link:
        """The collective over `ranks` GPUs: NVLink within a node; beyond, the NIC bounds a ring or an all-to-all."""
        own = getattr(self, kind)
        if ranks <= self.gpus_per_node:
            return own
        return Link(max(own.latency_us, self.inter_node_latency_us), min(own.busbw_gbs, self.inter_node_gbs))


def _distinct_ranks(layer: Layer, ranks: int) -> float:
    """Expected number of ranks holding at least one of a token's top_k experts (contiguous placement)."""
    per_rank = layer.experts // ranks
    miss = math.comb(layer.experts - per_rank, layer.top_k) / math.comb(layer.experts, layer.top_k)
    return ranks * (1 - miss)


def predict(layer: Layer, mode: str, ranks: int, tokens: int, kernels: Kernels = Kernels(),
            net: Network = Network(), act_bytes: int = 2) -> dict:
    """µs of dispatch, experts and combine of one layer step on each rank, and their sum. `tokens` is per rank
    (TP: the same tokens on every rank; EP: each rank's own). mode: single, tp, allgather_reducescatter,
    deepep_high_throughput."""
    k, h = layer.top_k, layer.hidden
    row = h * act_bytes + 8 * k  # activations + top-k ids and weights, as backends.parallel.dispatch packs them
    if mode == "single":
        experts = kernels.experts_us(layer, layer.experts, layer.inter, tokens * k, tokens)
        return {"dispatch": 0.0, "experts": experts, "combine": 0.0, "total": experts}
    if mode == "tp":
        experts = kernels.experts_us(layer, layer.experts, layer.inter // ranks, tokens * k, tokens)
        combine = net.link("all_reduce", ranks).us(2 * (ranks - 1) / ranks * tokens * h * act_bytes)
        return {"dispatch": 0.0, "experts": experts, "combine": combine, "total": experts + combine}
    local = layer.experts // ranks
    experts = kernels.experts_us(layer, local, layer.inter, tokens * k, tokens * ranks)
    counts = net.link("all_gather", ranks).latency_us + net.host_sync_us
    if mode == "allgather_reducescatter":
        dispatch = counts + net.link("all_gather", ranks).us((ranks - 1) * tokens * row)
        combine = net.link("reduce_scatter", ranks).us((ranks - 1) * tokens * h * act_bytes)
    elif mode == "deepep_high_throughput":
        remote = _distinct_ranks(layer, ranks) * (ranks - 1) / ranks  # copies of a token that leave its rank
        a2a = net.link("all_to_all", ranks)
        dispatch = counts + a2a.us(remote * tokens * row)
        combine = a2a.us(remote * tokens * h * act_bytes)
    else:
        raise ValueError(f"mode={mode!r}: expected single, tp, allgather_reducescatter or deepep_high_throughput")
    return {"dispatch": dispatch, "experts": experts, "combine": combine, "total": dispatch + experts + combine}


# ------------------------------------------------------------------------------------------------- outputs
def table(tokens=(1, 64, 4096)) -> str:
    """The scale-out predictions of docs/parallel.md (markdown): per layer step, µs and, in parentheses, µs per
    1000 tokens of the whole group (TP ranks share their tokens; EP ranks each bring their own)."""
    runs = [("tp", 8)] + [(m, n) for n in (8, 16, 32, 64)
                          for m in ("allgather_reducescatter", "deepep_high_throughput")]
    short = {"tp": "TP", "allgather_reducescatter": "EP AG/RS", "deepep_high_throughput": "EP a2a"}
    lines = ["| layer | T per rank | " + " | ".join(f"{short[m]}={n}" for m, n in runs) + " |",
             "|---|---|" + "---|" * len(runs)]
    for name in ("deepseek-v3", "kimi-k2"):
        layer = LAYERS[name]
        for t in tokens:
            cells = []
            for mode, n in runs:
                total = predict(layer, mode, n, t)["total"]
                group_tokens = t if mode == "tp" else t * n
                cells.append(f"{total:.0f} ({1000 * total / group_tokens:.0f})")
            lines.append(f"| {name} | {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def steps_table(layer_name: str, tokens: int, ranks: int) -> str:
    """dispatch / experts / combine of each parallel mode at one size (markdown)."""
    layer = LAYERS[layer_name]
    lines = ["| mode | dispatch µs | experts µs | combine µs | layer µs |", "|---|---|---|---|---|"]
    for mode in ("tp", "allgather_reducescatter", "deepep_high_throughput"):
        p = predict(layer, mode, ranks, tokens)
        lines.append(f"| {mode} | {p['dispatch']:.0f} | {p['experts']:.0f} | {p['combine']:.0f} | {p['total']:.0f} |")
    return "\n".join(lines)


def fit_links(nccl_rows: list[dict]) -> dict[str, Link]:
    """Least-squares (latency, bus bandwidth) per collective from gpu_parallel.py's nccl.csv rows."""
    links = {}
    for kind in sorted({r["collective"] for r in nccl_rows}):
        pts = [(float(r["factor_bytes"]), float(r["us"])) for r in nccl_rows if r["collective"] == kind]
        n = len(pts)
        mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
        var = sum((x - mx) ** 2 for x, _ in pts)
        slope = sum((x - mx) * (y - my) for x, y in pts) / var if var else 0.0
        links[kind] = Link(max(my - slope * mx, 0.0), 1e-3 / slope if slope > 0 else float("inf"))
    return links


def check(run_dir: str | Path) -> str:
    """Predicted against measured for a gpu_parallel.py run: comm steps from the fitted 2-GPU links, the experts
    step from the roofline; the measured column is the run's median."""
    run_dir = Path(run_dir)
    with open(run_dir / "nccl.csv") as f:
        links = fit_links(list(csv.DictReader(f)))
    net = replace(Network(), **{k: v for k, v in links.items() if k in Network.__dataclass_fields__})
    with open(run_dir / "steps.csv") as f:
        steps = list(csv.DictReader(f))
    lines = ["fitted 2-GPU links: " + ", ".join(f"{k} {v.latency_us:.1f} µs + bytes / {v.busbw_gbs:.0f} GB/s"
                                                 for k, v in sorted(links.items())),
             "| shape | mode | T per rank | step | predicted µs | measured µs | measured / predicted |",
             "|---|---|---|---|---|---|---|"]
    shape_layer = {"gpt-oss-120b": LAYERS["gpt-oss-120b"], "deepseek-v3": LAYERS["deepseek-v3"]}
    for row in steps:
        layer = shape_layer[row["shape"]]
        mode = row["mode"]
        world = int(row["world"])
        tokens = int(row["tokens_per_rank"]) * (world if mode == "single-all-tokens" else 1)
        p = predict(layer, "single" if mode.startswith("single") else mode, world, tokens, net=net)
        for step in ("dispatch", "experts", "combine", "total"):
            measured = float(row[f"{step}_us"])
            if step != "total" and measured == 0 and p[step] == 0:
                continue
            ratio = measured / p[step] if p[step] else float("nan")
            lines.append(f"| {row['shape']} | {mode} | {row['tokens_per_rank']} | {step} | {p[step]:.1f} | "
                         f"{measured:.1f} | {ratio:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", action="store_true", help="print the scale-out predictions (markdown)")
    ap.add_argument("--check", metavar="DIR", help="print predicted vs measured for a gpu_parallel.py run")
    args = ap.parse_args()
    if not args.table and not args.check:
        ap.error("pass --table or --check DIR")
    if args.table:
        print(table())
    if args.check:
        print(check(args.check))


if __name__ == "__main__":
    main()
