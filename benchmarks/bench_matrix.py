"""The model matrix on one GPU, this project against the peers in the same run: one CSV per run.

Per matrix layer (backends/model_shapes.py) and T: this project's layer with its tuned config (table entry or,
where no table covers it, the heuristics) AND with the heuristics alone; the peers Humming (humming-kernels) and
OpenAI triton_kernels driven through their runners (backends/runners/, the code path `MoELayer` uses); the
memory floor (touched experts' bytes at the bandwidth measured in this run) and the bf16-matmul bound
(6·T·k·H·I FLOP at the 8192^3 matmul rate of this run). Method for every implementation: the whole layer
including routing captured as a CUDA graph, L2 flushed before each replay, median of --iters replays, the same
random weights and inputs. A peer that cannot run a shape gets a row saying why (µs empty).

    python benchmarks/bench_matrix.py --out benchmarks/results/<run> [--layers a,b] [--tokens 1,16] [--iters 10]
    python benchmarks/report_matrix.py        # README tables and plots from the latest run per GPU

Writes <out>/matrix.csv (appended row by row: a cut-off run keeps what it measured) and <out>/environment.json.
Peer packages are installed at benchmark time (humming-kernels wheel; triton_kernels on PYTHONPATH), never
committed.
"""

from __future__ import annotations

import argparse
import csv
import functools
import importlib
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from backends.gpu_timing import Flusher, measure_ceilings, memory_floor, time_graph_output  # noqa: E402
from backends.layouts.triton_moe import to_kernel_layout  # noqa: E402
from backends.model_shapes import MATRIX, SHAPES  # noqa: E402
from backends.triton_moe import moe_forward, tuning  # noqa: E402
from backends.triton_moe.testing import activation_kwargs, random_checkpoint  # noqa: E402

TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 16384)
COLUMNS = ("run_id", "date", "gpu", "commit", "shape", "format", "experts", "top_k", "hidden_size",
           "intermediate_size", "tokens", "implementation", "config", "us", "floor_fraction", "note")
OURS, OURS_HEURISTIC = "this project (tuned)", "this project (heuristic)"
FLOOR, MATMUL = "memory floor", "bf16 matmul bound"
#: A peer whose output is further than this (relative L2) from this project's is reported, not timed: both compute
#: the same layer to W4A16 accuracy (~3e-3 apart), so more means a misdriven or broken peer, and its time is moot.
CHECK_REL_L2 = 1e-2
#: peer name -> (runner module, class, converter "module:attr" or None for the checkpoint layout)
PEERS = {"Humming": ("backends.runners.humming", "HummingRunner", None),
         "triton_kernels": ("backends.runners.oai_triton", "OaiTritonRunner", "backends.layouts.oai_triton:mxfp4")}


def prepare_peer(name: str, shape, ckpt: dict):
    """(runner, None) or (None, why it cannot run this shape here)."""
    module, cls, converter = PEERS[name]
    try:
        base = importlib.import_module("backends.runners.base")
        runner_cls = getattr(importlib.import_module(module), cls)
    except ImportError as exc:
        return None, f"runner not importable: {exc}"
    from backends.weights import MoEWeights

    weights = MoEWeights(format=ckpt["format"], w13=ckpt["w13"], w13_scale=ckpt["w13_scale"], w2=ckpt["w2"],
                         w2_scale=ckpt["w2_scale"], gate_up=ckpt["gate_up_layout"], w13_bias=ckpt.get("w13_bias"),
                         w2_bias=ckpt.get("w2_bias"), w13_global_scale=ckpt.get("w13_global_scale"),
                         w2_global_scale=ckpt.get("w2_global_scale"))
    swiglu = ({"swiglu_alpha": 1.702, "swiglu_beta": 1.0, "swiglu_limit": 7.0}
              if shape.activation == "swigluoai" else {})
    spec = base.RunnerSpec(backend=name, profile="bench-matrix", format=shape.format, activation=shape.activation,
                           top_k=shape.top_k, renormalize=True, num_experts=shape.experts,
                           hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
                           padded_hidden_size=shape.hidden_size, padded_intermediate_size=shape.intermediate_size,
                           device=torch.device("cuda"), swiglu=swiglu, has_bias=shape.biases)
    try:
        if converter:
            mod, attr = converter.split(":")
            if shape.format != "mxfp4":
                return None, f"no {shape.format} layout for this peer (MXFP4 only)"
            weights = getattr(importlib.import_module(mod), attr).convert(weights, quant_config=swiglu or None)
        return runner_cls.prepare(spec, weights), None
    except base.RunnerUnavailableError as exc:
        return None, str(exc).split("cannot run this layer: ")[-1]
    except Exception as exc:  # noqa: BLE001  a library refusing the shape is a result, not a crash
        return None, f"{type(exc).__name__}: {exc}"[:300]


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _tails(launch: tuning.LaunchConfig) -> str:
    """A launch's tail widths as rows name them: 16, or 16+32 with a wide tail."""
    return f"{launch.tail_rows or 0}" + (f"+{launch.wide_tail_rows}" if launch.wide_tail_rows else "")


def describe(config: tuning.MoEConfig, decode_kernels: bool = True) -> str:
    """The config as benchmark rows name it; decode_kernels: whether the call runs the decode kernels when the config
    has their warps (forward.takes_decode_kernels; a W4A16 call always does), whose warps are then all that applies.
    A config naming the warp-specialized prefill kernels says so after its tiles (a W4A16 call on sm_90 runs them,
    other calls the tiles)."""
    g1, g2 = config.gemm1, config.gemm2
    extra = "".join((f" split{g1.split_k}/{g2.split_k}" if g1.split_k > 1 or g2.split_k > 1 else "",
                     " stacked" if g1.stack_gate_up else "", " half" if g1.half_rows else "",
                     f" tail{_tails(g1)}/{_tails(g2)}" if g1.tail_rows or g2.tail_rows else "",
                     " + warp-specialized prefill" if config.prefill_kernel == "warp-specialized" else ""))
    if config.decode is not None and decode_kernels:
        return f"{config.source}: decode kernels {config.decode.label}"
    return (f"{config.source}: {g1.block_m}x{g1.block_n}x{g1.block_k}/{g2.block_n}x{g2.block_k} "
            f"w{g1.num_warps}/{g2.num_warps} s{g1.num_stages}/{g2.num_stages}{extra}")


def _emit(writer, out, base: dict, floor: float, impl: str, us, config: str = "", note: str = "") -> None:
    """One CSV row (flushed at once) and its markdown line on stdout."""
    row = {**base, "implementation": impl, "config": config, "us": f"{us:.1f}" if us is not None else "",
           "note": note, "floor_fraction": f"{floor / us:.3f}" if us else ""}
    writer.writerow(row)
    out.flush()
    print(f"| {base['shape']} | {base['tokens']} | {impl} | {row['us'] or '-'} | {row['floor_fraction'] or '-'} | "
          f"{config} | {note} |", flush=True)


def _layer(name, args, arch, gpu_info, ceilings, writer, out, flush, peers, run_id, date, gpu) -> None:
    """All rows of one matrix layer."""
    shape = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    ckpt = random_checkpoint(shape, device="cuda", generator=gen)
    ours_weights = to_kernel_layout(**ckpt)
    act = activation_kwargs(shape)
    runners = {peer: prepare_peer(peer, shape, ckpt) for peer in peers}
    base_row = {"run_id": run_id, "date": date, "gpu": gpu, "commit": args.commit, "shape": name,
                **shape.fields()}
    print(f"\n## {name} {shape.fields()} peers: " + ", ".join(f"{k}: {'ok' if r else why}"
                                                               for k, (r, why) in runners.items()), flush=True)
    for tokens in map(int, args.tokens.split(",")):
        x = torch.randn(tokens, shape.hidden_size, device="cuda", generator=gen).bfloat16()
        logits = torch.randn(tokens, shape.experts, device="cuda", generator=gen)
        touched, floor = memory_floor(logits, shape.top_k, shape.format, shape.hidden_size, shape.intermediate_size,
                                      ceilings["bandwidth_gbs"])
        problem = tuning.Problem(tokens=tokens, **shape.fields())

        emit = functools.partial(_emit, writer, out, {**base_row, "tokens": tokens}, floor)

        if not args.no_ours:
            emit(FLOOR, floor, note=f"{touched} experts touched")
            emit(MATMUL, 6 * tokens * shape.top_k * shape.hidden_size * shape.intermediate_size
                 / (ceilings["matmul_tflops"] * 1e6))
        tuned = tuning.select_config(arch, gpu_info, problem)
        heuristic = tuning.select_config(arch, gpu_info, problem, use_tables=False)
        ours_out = ours_us = None
        call = functools.partial(moe_forward, x, ours_weights, router_logits=logits, top_k=shape.top_k, **act)
        if args.no_ours:  # peers only (another process timed this project): its output, untimed, for the check
            ours_out = call(config=tuned)
        for impl, config in () if args.no_ours else ((OURS, tuned), (OURS_HEURISTIC, heuristic)):
            runs_as_tuned = (config.decode == tuned.decode if config.decode is not None
                             else (config.gemm1, config.gemm2, config.prefill_kernel)
                             == (tuned.gemm1, tuned.gemm2, tuned.prefill_kernel))
            if impl == OURS_HEURISTIC and runs_as_tuned:
                emit(impl, ours_us, describe(config), "same config as the tuned row (timed once)")
                continue
            try:
                ours_us, y = time_graph_output(functools.partial(call, config=config), flush, args.iters)
            except Exception as exc:  # noqa: BLE001
                emit(impl, None, describe(config), f"failed: {type(exc).__name__}: {exc}"[:300])
                ours_us = None
                continue
            ours_out = y.clone() if ours_out is None else ours_out
            emit(impl, ours_us, describe(config), "" if impl == OURS else f"rel L2 vs tuned "
                                                                            f"{rel_l2(y, ours_out):.1e}")
        for peer, (runner, why) in runners.items():
            if runner is None:
                emit(peer, None, note=f"cannot run: {why}")
                continue
            routing = importlib.import_module("backends.runners.base").Routing(router_logits=logits)
            try:
                check = rel_l2(runner.apply(x, routing), ours_out) if ours_out is not None else float("nan")
                if not check <= CHECK_REL_L2:
                    emit(peer, None, note=f"not timed: output differs from this project's by rel L2 {check:.1e} "
                                          f"(> {CHECK_REL_L2:g}: the peer is misdriven or wrong here)")
                    continue
                us, _ = time_graph_output(functools.partial(runner.apply, x, routing), flush, args.iters)
            except Exception as exc:  # noqa: BLE001  a peer failing at one T is a result
                emit(peer, None, note=f"failed: {type(exc).__name__}: {exc}"[:300])
                traceback.print_exc()
                torch.cuda.synchronize()
                continue
            emit(peer, us, note=f"rel L2 vs this project {check:.1e}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="run directory: matrix.csv and environment.json go here")
    p.add_argument("--layers", default=",".join(MATRIX), help=f"comma-separated (default: {','.join(MATRIX)})")
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--peers", default=",".join(PEERS), help="comma-separated subset of " + ",".join(PEERS))
    p.add_argument("--run-id", default=None, help="default: <gpu>-<UTC date and time>")
    p.add_argument("--commit", default=os.environ.get("MOE_ORACLE_COMMIT", "unknown"))
    p.add_argument("--no-ours", action="store_true", help="time only the peers: a peer that may crash the CUDA "
                   "context runs in a process of its own, appending to the same CSV (pass the same --run-id)")
    p.add_argument("--budget-s", type=float, default=1e9, help="stop starting layers after this many seconds")
    args = p.parse_args()
    started = time.perf_counter()
    torch.manual_seed(0)
    gpu = torch.cuda.get_device_name()
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run_id = args.run_id or f"{gpu.removeprefix('NVIDIA ').split()[0]}-{date}"
    os.makedirs(args.out, exist_ok=True)
    env_path = os.path.join(args.out, "environment.json")
    if os.path.exists(env_path):  # a later process of the same run (--no-ours): the first one's ceilings
        with open(env_path) as f:
            env = json.load(f)
        ceilings = {key: env[key] for key in ("bandwidth_gbs", "copy_gbs", "read_gbs", "matmul_tflops")}
        arch, gpu_info = tuning.device_gpu(torch.device("cuda"))
    else:
        ceilings = dict(zip(("bandwidth_gbs", "copy_gbs", "read_gbs", "matmul_tflops"), measure_ceilings(),
                            strict=True))
        arch, gpu_info = tuning.device_gpu(torch.device("cuda"))
        env = {"run_id": run_id, "date": date, "gpu": gpu, "sm_count": gpu_info.sm_count, "arch": arch.name,
               "commit": args.commit, "torch": torch.__version__, "cuda": torch.version.cuda,
               "triton": importlib.import_module("triton").__version__, **ceilings,
               "method": "CUDA graph of the whole layer incl. routing, L2 flushed (256 MiB read) before each replay, "
                         f"median of {args.iters}; floor = touched experts' packed bytes / bandwidth_gbs"}
        for package in ("humming", "triton_kernels"):
            try:
                mod = importlib.import_module(package)
                env[package] = getattr(mod, "__version__", os.path.dirname(mod.__file__))
            except ImportError as exc:
                env[package] = f"not importable: {exc}"
        with open(env_path, "w") as f:
            json.dump(env, f, indent=1)
    print(f"# {run_id}: {json.dumps(env)}", flush=True)
    csv_path = os.path.join(args.out, "matrix.csv")
    new_file = not os.path.exists(csv_path)
    out = open(csv_path, "a", newline="")
    writer = csv.DictWriter(out, COLUMNS)
    if new_file:
        writer.writeheader()
    flush = Flusher()
    peers = [p for p in args.peers.split(",") if p]
    for name in args.layers.split(","):
        if time.perf_counter() - started > args.budget_s:
            print(f"# budget spent: {name} and later layers not measured", flush=True)
            break
        try:
            _layer(name, args, arch, gpu_info, ceilings, writer, out, flush, peers, run_id, date, gpu)
        except Exception:  # noqa: BLE001  one layer failing (memory, a library) must not lose the others
            traceback.print_exc()
        torch.cuda.empty_cache()
    out.close()
    print(f"# done in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
