"""Whole-layer timing of backends.triton_moe on a GPU, against the memory floor, bf16 matmul and torch baselines.

Per T: the layer (routing + alignment + both GEMMs + top-k sum) captured once in a CUDA graph and
replayed, L2 flushed (a 256 MiB read, gpu_timing.Flusher) before every replay, median of CUDA-event times. Same run:
memory bandwidth = the higher of a 2 GiB-per-side device copy (read + write bytes) and a read-only
reduction over 2 GiB; bf16 8192^3 torch.matmul TFLOP/s. Columns: µs; touched-expert bytes
(unique(topk_ids) x packed weights + block scales, biases not counted, as in kernels.md §9) / time
as a fraction of that bandwidth; 6·T·k·H·I FLOP / time as a fraction of the matmul rate; speedup
over the emulation backend (eager) and over a torch bf16 grouped-GEMM layer (bf16 weights,
torch._grouped_mm, as a CUDA graph).

    python benchmarks/bench_moe.py --out $OUT                 # per-layer detail (kernels, baselines)
    python benchmarks/bench_moe.py --sweep --out $OUT         # time candidate launch configs, write a table
    python benchmarks/bench_moe.py --merge-sweep SWEEP.json TABLE.yaml OUT.yaml   # fold a sweep into a table
The peers are timed in the same run by benchmarks/bench_matrix.py.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from backends import emulation, gpu_timing  # noqa: E402
from backends.gpu_timing import GIB, Flusher, events_ms, graph_of, measure_ceilings, profile_kernels  # noqa: E402
from backends.layouts.triton_moe import to_kernel_layout  # noqa: E402
from backends.triton_moe import moe_forward, tuning  # noqa: E402
from backends.triton_moe.testing import SHAPES, activation_kwargs, random_checkpoint  # noqa: E402
from backends.triton_moe.tuning import writer  # noqa: E402
from backends.triton_moe.tuning.candidates import sweep_candidates  # noqa: E402

TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 16384)
_events_ms = events_ms  # benchmarks/probe_weight_streaming.py's name for it
time_layer = gpu_timing.time_graph  # µs
__all__ = ["GIB", "Flusher", "_events_ms", "expert_bytes", "graph_of", "time_layer"]


def expert_bytes(shape) -> int:
    """Packed FP4 + block scales of one expert (both GEMMs) of a registry shape."""
    return gpu_timing.expert_bytes(shape.format, shape.hidden_size, shape.intermediate_size)


def _select(gpu_arch, shape, tokens, use_tables=True):
    arch, gpu = gpu_arch
    return tuning.select_config(arch, gpu, tuning.Problem(tokens=tokens, **shape.fields()), use_tables=use_tables)


class GroupedBf16Layer:
    """Torch baseline: bf16 weights, sort by expert, torch._grouped_mm twice, index_add over top-k."""

    def __init__(self, ckpt, shape):
        e = shape.experts
        w13 = torch.stack([emulation._dequantize_expert(ckpt["format"], ckpt["w13"], ckpt["w13_scale"],
                                                        ckpt.get("w13_global_scale"), j).bfloat16() for j in range(e)])
        w2 = torch.stack([emulation._dequantize_expert(ckpt["format"], ckpt["w2"], ckpt["w2_scale"],
                                                       ckpt.get("w2_global_scale"), j).bfloat16() for j in range(e)])
        self.w13_t = w13.transpose(1, 2)  # [E, H, 2I] (column-major view, as grouped_mm wants)
        self.w2_t = w2.transpose(1, 2)  # [E, I, H]
        self.b13, self.b2 = ckpt.get("w13_bias"), ckpt.get("w2_bias")
        self.shape, self.layout = shape, ckpt["gate_up_layout"]

    def __call__(self, x, logits):
        s = self.shape
        top, ids = torch.topk(logits, s.top_k, dim=-1)
        weights = torch.softmax(top, dim=-1)
        flat = ids.reshape(-1)
        order = torch.argsort(flat)
        counts = torch.zeros(s.experts, dtype=torch.int32, device=x.device).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        rows = x[order // s.top_k]
        h = torch._grouped_mm(rows, self.w13_t, offs=offs)
        if self.b13 is not None:
            h = h + self.b13[flat[order]].bfloat16()
        h = emulation._activate(h.float(), s.activation, self.layout, 1.702, 1.0, 7.0).bfloat16()
        y = torch._grouped_mm(h, self.w2_t, offs=offs).float()
        if self.b2 is not None:
            y = y + self.b2[flat[order]]
        y = y * weights.reshape(-1)[order, None]
        out = torch.zeros(x.shape[0], s.hidden_size, device=x.device, dtype=torch.float32)
        out.index_add_(0, order // s.top_k, y)
        return out.bfloat16()


def time_alignments(gpu: str, shapes: list, tokens_list: list, flush, iters: int) -> list:
    """µs of each alignment path (CUDA graph, L2 flushed) at the layer's pair count and tuned BLOCK_M, so the
    size thresholds of _routing.align rest on same-run numbers; every path's result is checked against torch's."""
    from backends.triton_moe import _kernels, _routing

    rows = []
    print("\n## alignment paths (µs, CUDA graph, L2 flushed)\n| shape | T | pairs | BLOCK_M | "
          + " | ".join(_routing.ALIGN_PATHS) + " | default |", flush=True)
    for name in shapes:
        shape = SHAPES[name]
        for tokens in tokens_list:
            logits = torch.randn(tokens, shape.experts, device="cuda")
            ids = torch.topk(logits, shape.top_k, dim=-1).indices.int()
            block_m = _select(tuning.device_gpu(torch.device("cuda")), shape, tokens).gemm1.block_m
            ref = _routing.align(ids, shape.experts, block_m, path="torch")
            row = {"shape": name, "tokens": tokens, "pairs": ids.numel(), "block_m": block_m}
            for path in _routing.ALIGN_PATHS:
                if path == "one-program" and ids.numel() > 4096:  # one program sorts at most 4096 pairs
                    continue
                got = _routing.align(ids, shape.experts, block_m, _kernels, path=path)
                if not (torch.equal(got.sorted_pairs, ref.sorted_pairs) and torch.equal(got.padded_total,
                                                                                         ref.padded_total)):
                    row[f"{path}_error"] = "differs from the torch path"
                    continue
                row[path] = time_layer(functools.partial(_routing.align, ids, shape.experts, block_m, _kernels,
                                                         path=path), flush, iters)
            row["default"] = _routing.align_path(ids.numel())
            rows.append(row)
            print(f"| {name} | {tokens} | {row['pairs']} | {block_m} | " + " | ".join(
                f"{row[p]:.1f}" if p in row else row.get(f"{p}_error", "-") for p in _routing.ALIGN_PATHS)
                + f" | {row['default']} |", flush=True)
    return rows


def best_entries(sweep: dict, run: str) -> list:
    """Table entries from sweep rows: per shape, the fastest config at each swept T (with the heuristic's µs of the
    same sweep), each serving up to the geometric middle of the next swept T. Shapes are the registry's names."""
    entries = []
    rows = [r for r in sweep["rows"] if r["gemm1"]["block_m"] == r["gemm2"]["block_m"]]
    for name in dict.fromkeys(r["shape"] for r in rows):
        swept = sorted({r["tokens"] for r in rows if r["shape"] == name})
        for (low, high), tokens in zip(writer.token_ranges(swept), swept, strict=True):
            at = [r for r in rows if r["shape"] == name and r["tokens"] == tokens]
            best = min(at, key=lambda r: r["us"])
            heuristic = next((r["us"] for r in at if r.get("heuristic")), None)
            entries.append(writer.entry(SHAPES[name].fields(), low, high, tokens, best["us"], run, best["gemm1"],
                                        best["gemm2"], heuristic))
    return entries


def merge_sweep(sweep_json: str, table_path: str, out_path: str, *, min_gain: float = 0.02) -> list:
    """Fold a sweep into a table: at each swept (shape, T) the fastest config replaces the entry covering that T
    (keeping its T range) when it beats that entry's config, timed in the same sweep, by more than min_gain; where
    the table has no entry, it is added with the range around the swept T. Entries are found by shape and T range,
    never by text. Returns the changes as (T, shape, old µs or None, new µs)."""
    import yaml

    sweep = json.load(open(sweep_json))
    table = yaml.safe_load(open(table_path))
    tuning.validate_table(table, table_path)
    changes, kept = [], []
    for new in best_entries(sweep, sweep.get("run", sweep["gpu"])):
        problem = tuning.Problem(tokens=new["measured"]["tokens"], **new["shape"])
        current = next((e for e in table["entries"] if tuning.tables.entry_matches(e, problem)), None)
        current_us = None
        if current is not None:
            same = (tuning.LaunchConfig(**current["gemm1"]), tuning.LaunchConfig(**current["gemm2"]))
            current_us = next((r["us"] for r in sweep["rows"] if r["tokens"] == problem.tokens
                               and SHAPES[r["shape"]].fields() == new["shape"]
                               and (tuning.LaunchConfig(**r["gemm1"]), tuning.LaunchConfig(**r["gemm2"])) == same),
                              None)
            if current_us is None or new["measured"]["us"] >= current_us * (1 - min_gain):
                continue
            new = {**new, "tokens": dict(current["tokens"])}  # it takes over exactly the range it beat
        kept.append(new)
        changes.append((problem.tokens, new["shape"], current_us, new["measured"]["us"]))
    writer.write_table(out_path, writer.merge_entries(table, kept), shipped_ok=True)
    return changes


def _save(out, tag, gpu, ceilings, rows) -> None:
    """DIR/moe-<tag>.json: the run's ceilings and its rows so far (nothing without --out)."""
    if not out:
        return
    bw, copy, read, mm = ceilings
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"moe-{tag}.json"), "w") as f:
        json.dump({"gpu": gpu, "bandwidth_gbs": bw, "copy_gbs": copy, "read_gbs": read, "matmul_tflops": mm,
                   "rows": rows}, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="gpt-oss-120b,deepseek-v3")
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--sweep", action="store_true", help="time the tuned config, the heuristic's and "
                   "tuning.candidates.sweep_candidates per T; write the sweep JSON")
    p.add_argument("--no-baselines", action="store_true")
    p.add_argument("--budget-s", type=float, default=1e9, help="sweep: stop starting candidates after this")
    p.add_argument("--out", default=None, help="directory for the JSON rows (and the sweep's YAML)")
    p.add_argument("--profile", action="store_true", help="also list each kernel's µs per layer call (eager)")
    p.add_argument("--align", action="store_true", help="only time the alignment paths at each shape and T")
    p.add_argument("--merge-sweep", nargs=3, metavar=("SWEEP_JSON", "TABLE_YAML", "OUT_YAML"),
                   help="fold a sweep into a table (entries it beat in the same run), write OUT_YAML; no GPU")
    args = p.parse_args()
    if args.merge_sweep:
        for tokens, shape, before, after in merge_sweep(*args.merge_sweep):
            print(f"{shape} T={tokens}: {before if before is None else f'{before:.1f}'} -> {after:.1f} us")
        return
    tag = "bench"
    torch.manual_seed(0)
    started = time.perf_counter()
    gpu = torch.cuda.get_device_name()
    bw, copy, read, mm = measure_ceilings()
    gpu_arch = tuning.device_gpu(torch.device("cuda"))
    print(f"# {gpu}: copy {copy:.0f} GB/s, read-only {read:.0f} GB/s -> bandwidth {bw:.0f} GB/s; "
          f"bf16 8192^3 matmul {mm:.1f} TFLOP/s", flush=True)
    flush = Flusher()
    if args.align:
        rows = time_alignments(gpu, args.shapes.split(","), list(map(int, args.tokens.split(","))), flush, args.iters)
        if args.out:
            _save(args.out, "align", gpu, (bw, copy, read, mm), rows)
        return
    rows = []
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        ckpt = random_checkpoint(shape, device="cuda")
        kw = to_kernel_layout(**ckpt)
        act = activation_kwargs(shape)
        baseline = None if args.no_baselines or args.sweep else GroupedBf16Layer(ckpt, shape)
        print(f"\n## {name} ({shape.format}, E={shape.experts}, k={shape.top_k}, H={shape.hidden_size}, "
              f"I={shape.intermediate_size}, {shape.activation})", flush=True)
        print("| T | experts touched | µs | fraction of memory floor | TFLOP/s | fraction of bf16 matmul "
              "| config | vs emulation | vs torch bf16 grouped |" if not args.sweep else
              "| T | config | µs |", flush=True)
        for tokens in map(int, args.tokens.split(",")):
            x = torch.randn(tokens, shape.hidden_size, device="cuda").bfloat16()
            logits = torch.randn(tokens, shape.experts, device="cuda")
            touched, floor_us = gpu_timing.memory_floor(logits, shape.top_k, shape.format, shape.hidden_size,
                                                        shape.intermediate_size, bw)
            flops = 6 * tokens * shape.top_k * shape.hidden_size * shape.intermediate_size
            if args.sweep:
                best = None
                table_cfg = _select(gpu_arch, shape, tokens)
                heuristic = _select(gpu_arch, shape, tokens, use_tables=False)
                # the table's config first: merge_sweep compares every candidate against it in the same run
                problem = tuning.Problem(tokens=tokens, **shape.fields())
                candidates = sweep_candidates(problem, heuristic)
                for c1, c2 in dict.fromkeys([(table_cfg.gemm1, table_cfg.gemm2), *candidates]):
                    if time.perf_counter() - started > args.budget_s:
                        break
                    cfg = tuning.MoEConfig(c1, c2, "sweep")
                    layer = functools.partial(moe_forward, x, kw, router_logits=logits, top_k=shape.top_k,
                                              config=cfg, **act)
                    try:
                        us = time_layer(layer, flush, 10)
                    except Exception as exc:  # noqa: BLE001  a tile that does not fit (shared memory, registers)
                        print(f"| {tokens} | {c1} / {c2} | failed: {type(exc).__name__} |", flush=True)
                        continue
                    rows.append({"shape": name, "tokens": tokens, "gemm1": tuning.launch_dict(c1),
                                 "gemm2": tuning.launch_dict(c2), "us": us, "floor_fraction": floor_us / us,
                                 "heuristic": (c1, c2) == (heuristic.gemm1, heuristic.gemm2)})
                    print(f"#   T={tokens} {c1} / {c2}: {us:.1f} us", flush=True)
                    _save(args.out, "sweep", gpu, (bw, copy, read, mm), rows)  # a cut-off sweep keeps its rows
                    if best is None or us < best[0]:
                        best = (us, c1, c2)
                if best:
                    print(f"| {tokens} | best {best[1]} / {best[2]} | {best[0]:.1f} ({floor_us / best[0]:.2f} of "
                          f"floor) |", flush=True)
                continue
            default_cfg = _select(gpu_arch, shape, tokens)
            layer = functools.partial(moe_forward, x, kw, router_logits=logits, top_k=shape.top_k, **act)
            us = time_layer(layer, flush, args.iters)
            row = {"shape": name, "gpu": gpu, "tokens": tokens, "touched": touched, "us": us,
                   "floor_us": floor_us, "floor_fraction": floor_us / us, "tflops": flops / us / 1e6,
                   "matmul_fraction": flops / us / 1e6 / mm, "config": default_cfg.source}
            if baseline is not None:
                emulation.moe_forward(x, router_logits=logits, top_k=shape.top_k, **ckpt, **act)  # warm-up
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(2):
                    emulation.moe_forward(x, router_logits=logits, top_k=shape.top_k, **ckpt, **act)
                torch.cuda.synchronize()
                row["emulation_us"] = (time.perf_counter() - t0) / 2 * 1e6
                try:
                    row["grouped_bf16_us"] = time_layer(functools.partial(baseline, x, logits), flush,
                                                        max(5, args.iters // 3))
                except Exception as exc:  # noqa: BLE001  recorded in the row: the baseline is optional
                    row["grouped_bf16_error"] = f"{type(exc).__name__}: {exc}"[:200]
            if args.profile:
                row["kernels_us"] = profile_kernels(layer, flush)
                print(f"#   T={tokens} kernels (eager, µs): " + ", ".join(
                    f"{name[:40]} {us:.1f}" for name, us in row["kernels_us"]) + f"; sum "
                    f"{sum(us for _, us in row['kernels_us']):.1f} vs graph {us:.1f}", flush=True)
            rows.append(row)
            _save(args.out, tag, gpu, (bw, copy, read, mm), rows)  # after every row: a cut-off run keeps its rows
            emu = f"{row['emulation_us'] / us:.1f}x" if "emulation_us" in row else "-"
            grp = f"{row['grouped_bf16_us'] / us:.2f}x" if "grouped_bf16_us" in row else "-"
            print(f"| {tokens} | {touched} | {us:.1f} | {row['floor_fraction']:.2f} | {row['tflops']:.1f} | "
                  f"{row['matmul_fraction']:.2f} | {row['config']} | {emu} | {grp} |", flush=True)
        kw = ckpt = baseline = None
        torch.cuda.empty_cache()
    if args.out:
        _save(args.out, "sweep" if args.sweep else tag, gpu, (bw, copy, read, mm), rows)
        if args.sweep and rows:
            sweep = {"gpu": gpu, "run": f"sweep-{time.strftime('%Y-%m-%d')}-{gpu}", "rows": rows}
            table = {"table": "triton-moe-tuning", "version": 1, "arch": gpu_arch[0].name,
                     "gpu": gpu.split()[1] if gpu.startswith("NVIDIA ") else gpu,
                     "why": f"Fastest swept configs on {gpu} (benchmarks/bench_moe.py --sweep).",
                     "entries": best_entries(sweep, sweep["run"])}
            writer.write_table(os.path.join(args.out, gpu.lower().replace(" ", "-") + ".yaml"), table)


if __name__ == "__main__":
    main()
