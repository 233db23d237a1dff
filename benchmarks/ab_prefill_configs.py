"""A/B of the tile kernels' launch configs (W4A16 or W4A8 on bf16 dots) against the tables' choice, one GPU.

Per layer (backends/model_shapes.py) and T: the layer with the config moe_forward would choose ("tuned"), then with
each --variant, a named edit of that config, all in one process, each timed as bench_matrix times a layer (the whole
layer with routing as a CUDA graph, L2 flushed before each replay, median of --iters). With --rounds N every row's
graph is captured first and the rows are timed in turn N times (the clock's drift over a run then falls on all rows
alike); a row's µs is the median of its rounds, each round's in its round_us. A variant is
`NAME:FIELD=VALUE[,FIELD=VALUE...]`, LaunchConfig fields set on both GEMMs, or on one with a `g1.` / `g2.` prefix
(`tail32:tail_rows=32`, `w8:g1.num_warps=8,g1.tail_rows=64`); `none` clears an optional field; `topk_sum=fused`
(or `launch`) and `prefill_kernel=warp-specialized` are moe_forward's own arguments; `env.NAME=VALUE` sets an
environment variable while the variant runs (a kernel experiment's switch, read when its graph is captured). Each
row gives µs,
TFLOP/s (6·T·k·H·I), the fraction of this run's bf16 8192³ matmul rate, the relative L2 against the tuned row's
output and whether its bits are the tuned row's (a variant that only regroups rows keeps them). --kernels adds each
row's kernels (torch.profiler, eager, L2 flushed: mean µs per call) to DIR/kernels.csv. --routing: the routing of
each row, one or more of ROUTINGS: "logits" (random router logits, as bench_matrix) and "balanced" (every expert
exactly T·k/E pairs, `balanced_topk`): their ratio is what the experts' uneven row counts cost (their last, partial
row blocks).

    python benchmarks/ab_prefill_configs.py --out DIR [--layers gpt-oss-120b,deepseek-v3] [--tokens 4096,16384]
        [--act-quant mxfp8|fp8_per_tensor_static] [--routing logits,balanced] [--iters 10] [--rounds 1] [--kernels]
        --variant tail32:tail_rows=32 [...]

Writes DIR/ab.csv (appended row by row: a cut-off run keeps what it measured) and DIR/environment.json.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime
import functools
import itertools
import json
import math
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from backends.model_shapes import SHAPES  # noqa: E402
from backends.triton_moe.tuning.configs import LaunchConfig, MoEConfig  # noqa: E402

COLUMNS = ("run_id", "gpu", "commit", "shape", "tokens", "act_quant", "routing", "variant", "config", "us", "tflops",
           "of_bf16", "rel_l2_vs_tuned", "bits_as_tuned", "round_us", "note")
_FIELDS = {f.name: f.type for f in dataclasses.fields(LaunchConfig)}


#: --routing choices: random router logits, or every expert the same number of pairs (balanced_topk)
ROUTINGS = ("logits", "balanced")
#: --variant keys that are moe_forward arguments rather than LaunchConfig fields
CALL_KEYS = ("topk_sum", "prefill_kernel", "w4a8_mma", "fp8_accumulate")


def parse_variant(text: str) -> tuple[str, dict, dict, dict]:
    """(name, GEMM1 edits, GEMM2 edits, moe_forward arguments) of `NAME:FIELD=VALUE,...`; ValueError naming the bad
    part."""
    name, sep, body = text.partition(":")
    if not sep or not name or not body:
        raise ValueError(f"--variant {text!r}: write NAME:FIELD=VALUE[,FIELD=VALUE...]")
    edits: tuple[dict, dict] = ({}, {})
    call = {}
    for part in body.split(","):
        key, eq, value = part.partition("=")
        if key.startswith("env.") and eq:  # an environment variable set while the variant runs
            call.setdefault("env", {})[key[4:]] = value
            continue
        if key in CALL_KEYS and eq:
            call[key] = value
            continue
        gemms = (0, 1)
        if key.startswith(("g1.", "g2.")):
            gemms, key = (int(key[1]) - 1,), key[3:]
        if not eq or key not in _FIELDS:
            raise ValueError(f"--variant {text!r}: {part!r} is not FIELD=VALUE with FIELD one of "
                             f"{', '.join((*_FIELDS, *CALL_KEYS))}")
        edits_value = _value(value, text, part)
        for g in gemms:
            edits[g][key] = edits_value
    return name, edits[0], edits[1], call


def _value(value: str, text: str, part: str):
    if value in ("true", "false"):
        return value == "true"
    if value == "none":
        return None
    if value in ("fused", "launch"):
        return value
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"--variant {text!r}: {part!r}: the value is not a whole number, true, false or none") \
            from None


def balanced_topk(tokens: int, experts: int, top_k: int, device=None):
    """(topk_ids int32 [T, k], topk_weights fp32 [T, k] of 1/k) giving every expert exactly T·k/E pairs: pair
    (t, j) takes expert (t·k + j) mod E, so a token's k experts are distinct. ValueError where T·k is not a multiple
    of E or k > E."""
    import torch

    if (tokens * top_k) % experts or top_k > experts:
        raise ValueError(f"--routing balanced: T·k = {tokens}·{top_k} must be a multiple of the layer's {experts} "
                         f"experts (and k at most E); pick T a multiple of {experts // math.gcd(experts, top_k)}")
    ids = (torch.arange(tokens * top_k, device=device, dtype=torch.int32) % experts).reshape(tokens, top_k)
    return ids, torch.full((tokens, top_k), 1 / top_k, device=device)


def edited(config: MoEConfig, name: str, g1: dict, g2: dict) -> MoEConfig:
    return dataclasses.replace(config, gemm1=dataclasses.replace(config.gemm1, **g1),
                               gemm2=dataclasses.replace(config.gemm2, **g2), source=f"variant {name}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--layers", default="gpt-oss-120b,deepseek-v3")
    p.add_argument("--tokens", default="4096,16384")
    p.add_argument("--act-quant", default=None, choices=("mxfp8", "fp8_per_tensor_static"))
    p.add_argument("--routing", default="logits", help=f"comma-separated, of {', '.join(ROUTINGS)}")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--rounds", type=int, default=1,
                   help="time every variant once per round, rounds in turn; a row's µs is its rounds' median")
    p.add_argument("--variant", action="append", default=[])
    p.add_argument("--kernels", action="store_true", help="also each row's kernels' µs (torch.profiler)")
    p.add_argument("--commit", default=os.environ.get("MOE_ORACLE_COMMIT", "unknown"))
    args = p.parse_args(argv)
    args.layers = args.layers.split(",")
    for layer in args.layers:
        if layer not in SHAPES:
            p.error(f"--layers: {layer!r} is not one of {', '.join(SHAPES)}")
    for flag, value in (("--iters", args.iters), ("--rounds", args.rounds)):
        if value < 1:
            p.error(f"{flag} {value}: give 1 or more")
    args.routing = args.routing.split(",")
    for routing in args.routing:
        if routing not in ROUTINGS:
            p.error(f"--routing: {routing!r} is not one of {', '.join(ROUTINGS)}")
    try:
        args.tokens = [int(t) for t in args.tokens.split(",")]
        args.variant = [parse_variant(v) for v in args.variant]
    except ValueError as exc:
        p.error(str(exc) if "--variant" in str(exc) else f"--tokens: {args.tokens!r} is not a list of whole numbers")
    if "balanced" in args.routing:
        for layer in args.layers:
            shape = SHAPES[layer]
            for tokens in args.tokens:
                try:
                    balanced_topk(tokens, shape.experts, shape.top_k, device="meta")
                except ValueError as exc:
                    p.error(f"{layer}: {exc}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import triton
    from bench_matrix import describe, rel_l2

    from backends.gpu_timing import Flusher, events_ms, graph_with_output, measure_ceilings, profile_kernels
    from backends.layouts.triton_moe import to_kernel_layout
    from backends.triton_moe import moe_forward, tuning
    from backends.triton_moe.testing import activation_kwargs, random_checkpoint

    os.makedirs(args.out, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    bandwidth, _, _, matmul = measure_ceilings()
    stamp = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%dT%H:%M:%SZ}"
    run_id = f"{gpu.split()[1] if len(gpu.split()) > 1 else gpu}-{stamp}"
    env = {"run_id": run_id, "gpu": gpu, "commit": args.commit, "bandwidth_gbs": bandwidth, "matmul_tflops": matmul,
           "variants": {name: {"gemm1": g1, "gemm2": g2, **call} for name, g1, g2, call in args.variant},
           "triton": triton.__version__}
    Path(args.out, "environment.json").write_text(json.dumps(env, indent=1) + "\n")
    print(f"{gpu}: bf16 matmul {matmul:.0f} TFLOP/s", flush=True)
    flush = Flusher()
    arch, gpu_info = tuning.device_gpu(torch.device("cuda"))
    path = Path(args.out, "ab.csv")
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS)
        if handle.tell() == 0:
            writer.writeheader()
        for layer in args.layers:
            shape = SHAPES[layer]
            gen = torch.Generator(device="cuda").manual_seed(0)
            ckpt = random_checkpoint(shape, device="cuda", generator=gen)
            weights = to_kernel_layout(**ckpt)
            act = activation_kwargs(shape)
            quant = {}
            if args.act_quant == "fp8_per_tensor_static":
                one = torch.full((1,), 0.05, device="cuda")
                quant = {"act_quant": args.act_quant, "a1_scale": one, "a2_scale": one}
            elif args.act_quant:
                quant = {"act_quant": args.act_quant}
            for tokens, routing in itertools.product(args.tokens, args.routing):
                x = torch.randn(tokens, shape.hidden_size, device="cuda", generator=gen).bfloat16()
                logits = torch.randn(tokens, shape.experts, device="cuda", generator=gen)
                if routing == "balanced":
                    ids, route_w = balanced_topk(tokens, shape.experts, shape.top_k, device="cuda")
                    route = {"topk_ids": ids, "topk_weights": route_w}
                else:
                    route = {"router_logits": logits, "top_k": shape.top_k}
                problem = tuning.Problem(tokens=tokens, **shape.fields())
                tuned = tuning.select_config(arch, gpu_info, problem)
                if args.act_quant:
                    tuned = tuning.w4a8_config(arch, tuned, args.act_quant, "bf16")
                flop = 6 * tokens * shape.top_k * shape.hidden_size * shape.intermediate_size
                prepared = []  # (row, call, its environment, graph, the graph's output holder)
                for name, g1, g2, extra in [("tuned", {}, {}, {})] + args.variant:
                    row = {"run_id": run_id, "gpu": gpu, "commit": args.commit, "shape": layer, "tokens": tokens,
                           "act_quant": args.act_quant or "", "routing": routing, "variant": name}
                    extra = dict(extra)
                    variant_env = extra.pop("env", {})
                    with _environment(variant_env):
                        try:
                            config = tuned if name == "tuned" else edited(tuned, name, g1, g2)
                            row["config"] = describe(config, False) + f" | {config.gemm1} | {config.gemm2}"
                            call = functools.partial(moe_forward, x, weights, **route, config=config, **act, **quant,
                                                     **extra)
                            graph, holder = graph_with_output(call)
                        except Exception as exc:  # noqa: BLE001  one failing variant is a result
                            writer.writerow({**row, "note": f"failed: {type(exc).__name__}: {exc}"[:300]})
                            handle.flush()
                            print(f"{layer} T={tokens} {routing} {name}: failed {exc}"[:300], flush=True)
                            continue
                    prepared.append((row, call, variant_env, graph, holder))
                rounds = [[] for _ in prepared]  # each round times every variant once, in order
                for _ in range(args.rounds):
                    for times, (_, _, _, graph, _) in zip(rounds, prepared, strict=True):
                        times.append(events_ms(graph.replay, flush, args.iters) * 1e3)
                for times, (row, call, variant_env, _, holder) in zip(rounds, prepared, strict=True):
                    us, out, base = statistics.median(times), holder["out"], prepared[0][4]["out"]
                    tflops = flop / us / 1e6
                    row.update(us=f"{us:.1f}", tflops=f"{tflops:.1f}", of_bf16=f"{tflops / matmul:.3f}",
                               rel_l2_vs_tuned=f"{rel_l2(out, base):.1e}",
                               bits_as_tuned=torch.equal(out.view(torch.int16), base.view(torch.int16)),
                               round_us=" ".join(f"{t:.1f}" for t in times))
                    writer.writerow(row)
                    handle.flush()
                    if args.kernels:
                        with _environment(variant_env):
                            _write_kernels(Path(args.out, "kernels.csv"), row, profile_kernels(call, flush))
                    print(f"{layer} T={tokens} {routing} {row['variant']}: {us:.1f} us, {tflops / matmul:.3f} of "
                          f"bf16, bits as tuned {row['bits_as_tuned']}" + (f", rounds {row['round_us']}"
                                                                            if args.rounds > 1 else ""), flush=True)
                del prepared, rounds
    return 0


@contextlib.contextmanager
def _environment(env: dict):
    """The variables of a variant's `env.NAME=VALUE` edits set while it runs (launches read them when the graph is
    captured), the process's own restored after."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _write_kernels(path: Path, row: dict, kernels: list) -> None:
    """One kernels.csv row per kernel of the timed call (the flush's own reduction included, under its name)."""
    fresh = not path.exists()
    with path.open("a", newline="") as handle:
        writer = csv.writer(handle)
        if fresh:
            writer.writerow(["shape", "tokens", "act_quant", "routing", "variant", "kernel", "us"])
        for name, us in kernels:
            writer.writerow([row["shape"], row["tokens"], row["act_quant"], row["routing"], row["variant"], name[:120],
                             f"{us:.1f}"])


if __name__ == "__main__":
    sys.exit(main())
