"""W4A16 vs W4A8 (both FP8 activation schemes) of this project's Triton MoE, one GPU, rows in matrix.csv's format.

Per layer (default gpt-oss-120b and deepseek-v3 of backends/model_shapes.py) and T: this project's W4A16 layer
with its tuned config ("this project (tuned)", as benchmarks/bench_matrix.py), and the W4A8 layer with dynamic
MXFP8 activations ("this project W4A8 mxfp8", the rules' kMxfp8Dynamic) and with static per-tensor FP8 activations
("this project W4A8 fp8 static", kFp8StaticTensorSym; the input scales calibrated once on a 256-token batch, as a
checkpoint's input_scale), both over converter_w4a8's weights; plus the memory floor, the bf16-matmul bound
(6·T·k·H·I FLOP at this run's 8192^3 bf16 matmul rate) and the FP8-matmul bound (the same FLOP at this run's
8192^3 FP8 E4M3 torch._scaled_mm rate). Every W4A8 output is checked against the emulation with fp8_operands=True
(the kernels' numerics) on up to 256 tokens before it is timed. Method as bench_matrix: the whole layer including
routing captured as a CUDA graph, L2 flushed before each replay, median of --iters replays.

    python benchmarks/bench_w4a8_matrix.py --out benchmarks/results/<run> [--layers a,b] [--tokens 1,16] [--iters 10]
    python benchmarks/bench_w4a8_matrix.py --dry-run --out DIR     # CPU smoke: tiny layers, emulation, no timing
    python benchmarks/report_matrix.py      # the W4A8 section beside the W4A16 rows

Writes <out>/matrix.csv (bench_matrix's COLUMNS, appended row by row) and <out>/environment.json (with
scaled_mm_tflops). --dry-run runs the same row logic on the CPU with tiny layers of the same formats and activations,
the emulation in place of the kernels and wall-clock in place of graph timing: its numbers are not measurements.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from bench_matrix import COLUMNS, FLOOR, MATMUL, OURS, rel_l2  # noqa: E402
from w4a8_accuracy import static_scales  # noqa: E402

from backends import emulation  # noqa: E402
from backends.gpu_timing import expert_bytes  # noqa: E402
from backends.model_shapes import SHAPES  # noqa: E402

TOKENS = (1, 16, 256, 1024, 4096, 16384)
LAYERS = ("gpt-oss-120b", "deepseek-v3")
W4A8 = {"mxfp8": "this project W4A8 mxfp8", "fp8_per_tensor_static": "this project W4A8 fp8 static"}
FP8_MATMUL = "fp8 matmul bound"
CHECK_TOKENS = 256
#: a W4A8 row whose output is further than this from the emulation (fp8_operands=True) is reported, not timed
CHECK_REL_L2 = 2e-2


@dataclasses.dataclass(frozen=True)
class Device:
    """How a run executes and times: the GPU (kernels, CUDA graphs) or the CPU dry run (emulation, wall clock)."""

    dry_run: bool

    @property
    def name(self) -> str:
        return "cpu" if self.dry_run else "cuda"

    def shape(self, name: str):
        shape = SHAPES[name]
        if not self.dry_run:
            return shape
        return dataclasses.replace(shape, experts=4, top_k=2, hidden_size=128, intermediate_size=128)

    def time(self, fn, flush, iters: int) -> tuple[float, torch.Tensor]:
        """(µs, output): a CUDA graph of fn replayed after an L2 flush (GPU), or eager wall clock (dry run)."""
        if self.dry_run:
            times, y = [], None
            for _ in range(max(1, min(iters, 3))):
                start = time.perf_counter()
                y = fn()
                times.append(time.perf_counter() - start)
            return statistics.median(times) * 1e6, y
        from bench_matrix import timed

        return timed(fn, flush, iters)


def ceilings(device: Device) -> dict:
    if device.dry_run:
        return {"bandwidth_gbs": 10.0, "copy_gbs": 10.0, "read_gbs": 10.0, "matmul_tflops": 0.1,
                "scaled_mm_tflops": 0.0}
    from bench_w4a8 import scaled_mm_tflops

    from backends.gpu_timing import measure_ceilings

    names = ("bandwidth_gbs", "copy_gbs", "read_gbs", "matmul_tflops")
    return {**dict(zip(names, measure_ceilings(), strict=True)), "scaled_mm_tflops": scaled_mm_tflops()}


def layer_functions(device: Device, shape, ckpt: dict, act: dict, calib: torch.Tensor, calib_logits: torch.Tensor):
    """{implementation: fn(x, logits) -> y} and {scheme: reference fn}: the kernels (GPU) or the emulation (dry run)."""
    scales = static_scales(calib, ckpt, calib_logits, shape.top_k, act["activation"],
                           ckpt.get("gate_up_layout", "interleaved"))
    weights_kw = {k: v for k, v in ckpt.items()}
    call = dict(top_k=shape.top_k, **act)

    def reference(scheme, x, logits):
        extra = scales if scheme == "fp8_per_tensor_static" else {}
        return emulation.moe_forward(x, **weights_kw, router_logits=logits, gemm_input_schemes=(scheme, scheme),
                                     fp8_operands=True, **call, **extra)

    if device.dry_run:
        fns = {OURS: lambda x, logits: emulation.moe_forward(x, **weights_kw, router_logits=logits, **call)}
        for scheme, impl in W4A8.items():
            fns[impl] = functools.partial(reference, scheme)
        return fns, reference, "emulation (dry run)"
    from backends.layouts.triton_moe import to_kernel_layout, w4a8_row_data
    from backends.triton_moe import moe_forward, tuning

    w16 = to_kernel_layout(**ckpt)
    w8 = dataclasses.replace(w16, **w4a8_row_data(w16))
    arch, gpu_info = tuning.device_gpu(torch.device("cuda"))

    @functools.lru_cache(maxsize=None)
    def tuned(tokens: int):  # chosen before any graph capture: the same config bench_matrix times
        return tuning.select_config(arch, gpu_info, tuning.Problem(tokens=tokens, **shape.fields()))

    def ours(x, logits):
        return moe_forward(x, w16, router_logits=logits, config=tuned(x.shape[0]), **call)

    fns = {OURS: ours}
    for scheme, impl in W4A8.items():
        extra = scales if scheme == "fp8_per_tensor_static" else {}
        fns[impl] = functools.partial(_w4a8, moe_forward, w8, scheme, extra, call)
    return fns, reference, "kernels"


def _w4a8(moe_forward, weights, scheme, scales, call, x, logits):
    return moe_forward(x, weights, router_logits=logits, act_quant=scheme, **scales, **call)


def run_layer(name: str, device: Device, args, env: dict, writer, out, flush) -> None:
    from backends.triton_moe.testing import activation_kwargs, random_checkpoint

    shape = device.shape(name)
    gen = torch.Generator(device=device.name).manual_seed(0)
    ckpt = random_checkpoint(shape, device=device.name, generator=gen)
    act = activation_kwargs(shape)
    calib = torch.randn(CHECK_TOKENS, shape.hidden_size, device=device.name, generator=gen).bfloat16()
    calib_logits = torch.randn(CHECK_TOKENS, shape.experts, device=device.name, generator=gen)
    fns, reference, what = layer_functions(device, shape, ckpt, act, calib, calib_logits)
    base = {"run_id": env["run_id"], "date": env["date"], "gpu": env["gpu"], "commit": env["commit"], "shape": name,
            **shape.fields()}
    print(f"\n## {name} {shape.fields()} ({what})", flush=True)
    for tokens in map(int, args.tokens.split(",")):
        x = torch.randn(tokens, shape.hidden_size, device=device.name, generator=gen).bfloat16()
        logits = torch.randn(tokens, shape.experts, device=device.name, generator=gen)
        touched = torch.topk(logits, shape.top_k, dim=-1).indices.unique().numel()
        floor = touched * expert_bytes(shape.format, shape.hidden_size, shape.intermediate_size) / (
            env["bandwidth_gbs"] * 1e3)
        flop = 6 * tokens * shape.top_k * shape.hidden_size * shape.intermediate_size
        emit = functools.partial(_emit, writer, out, {**base, "tokens": tokens}, floor, args.dry_run)
        emit(FLOOR, floor, note=f"{touched} experts touched")
        emit(MATMUL, flop / (env["matmul_tflops"] * 1e6))
        emit(FP8_MATMUL, flop / (env["scaled_mm_tflops"] * 1e6) if env["scaled_mm_tflops"] else None,
             note=f"6·T·k·H·I FLOP at the FP8 8192^3 torch._scaled_mm rate ({env['scaled_mm_tflops']:.0f} TFLOP/s)")
        w4a16_us = None
        fns[OURS](x[:1], logits[:1])  # compile / pick configs outside any graph capture
        for impl, fn in fns.items():
            note = ""
            try:
                if impl != OURS:
                    scheme = next(s for s, name_ in W4A8.items() if name_ == impl)
                    n = min(tokens, CHECK_TOKENS)
                    check = rel_l2(fn(x[:n], logits[:n]), reference(scheme, x[:n], logits[:n]))
                    if not check <= CHECK_REL_L2:
                        emit(impl, None, note=f"not timed: rel L2 {check:.1e} vs the emulation (fp8_operands) > "
                                              f"{CHECK_REL_L2:g}")
                        continue
                    note = f"rel L2 vs emulation {check:.1e}"
                us, _ = device.time(functools.partial(fn, x, logits), flush, args.iters)
            except Exception as exc:  # noqa: BLE001  one failing path at one T is a result
                emit(impl, None, note=f"failed: {type(exc).__name__}: {exc}"[:300])
                continue
            if impl == OURS:
                w4a16_us = us
            elif w4a16_us:
                note += f"; {w4a16_us / us:.2f}x W4A16"
            if impl != OURS and env["scaled_mm_tflops"]:
                note += f"; {flop / (us * 1e6) / env['scaled_mm_tflops']:.2f} of FP8 scaled_mm"
            emit(impl, us, note=note)


def _emit(writer, out, base: dict, floor: float, dry_run: bool, impl: str, us, config: str = "",
          note: str = "") -> None:
    note = f"dry run (CPU emulation, not a measurement); {note}" if dry_run else note
    row = {**base, "implementation": impl, "config": config, "us": f"{us:.1f}" if us is not None else "",
           "note": note, "floor_fraction": f"{floor / us:.3f}" if us else ""}
    writer.writerow(row)
    out.flush()
    print(f"| {base['shape']} | {base['tokens']} | {impl} | {row['us'] or '-'} | {note} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="run directory: matrix.csv and environment.json go here")
    p.add_argument("--layers", default=",".join(LAYERS))
    p.add_argument("--tokens", default=None, help=f"comma-separated (default {','.join(map(str, TOKENS))}; "
                                                  f"dry run 1,16)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--run-id", default=None)
    p.add_argument("--commit", default=os.environ.get("MOE_ORACLE_COMMIT", "unknown"))
    p.add_argument("--dry-run", action="store_true", help="CPU smoke run: tiny layers, emulation, no GPU")
    args = p.parse_args(argv)
    device = Device(args.dry_run)
    args.tokens = args.tokens or ("1,16" if args.dry_run else ",".join(map(str, TOKENS)))
    if not args.dry_run and not torch.cuda.is_available():
        p.error("no CUDA device here: run on a GPU, or pass --dry-run for the CPU smoke run")
    started = time.perf_counter()
    torch.manual_seed(0)
    gpu = "CPU (dry run)" if args.dry_run else torch.cuda.get_device_name()
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run_id = args.run_id or f"{'dry-run' if args.dry_run else gpu.removeprefix('NVIDIA ').split()[0]}-w4a8-{date}"
    os.makedirs(args.out, exist_ok=True)
    env = {"run_id": run_id, "date": date, "gpu": gpu, "commit": args.commit, "torch": torch.__version__,
           "cuda": torch.version.cuda, **ceilings(device),
           "method": "dry run: CPU emulation, wall clock" if args.dry_run else
           "CUDA graph of the whole layer incl. routing, L2 flushed before each replay, median of "
           f"{args.iters}; W4A8 checked against the emulation (fp8_operands=True) on <= {CHECK_TOKENS} tokens"}
    with open(os.path.join(args.out, "environment.json"), "w") as f:
        json.dump(env, f, indent=1)
    print(f"# {run_id}: {json.dumps(env)}", flush=True)
    csv_path = os.path.join(args.out, "matrix.csv")
    new_file = not os.path.exists(csv_path)
    flush = None
    if not args.dry_run:
        from backends.gpu_timing import Flusher

        flush = Flusher()
    with open(csv_path, "a", newline="") as out:
        writer = csv.DictWriter(out, COLUMNS)
        if new_file:
            writer.writeheader()
        for name in args.layers.split(","):
            run_layer(name, device, args, env, writer, out, flush)
            if not args.dry_run:
                torch.cuda.empty_cache()
    print(f"# done in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
