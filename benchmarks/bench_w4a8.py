"""W4A16 vs W4A8 (both FP8 activation schemes) of this project's Triton MoE, one GPU, as model-matrix rows.

Per layer (default gpt-oss-120b and deepseek-v3 of backends/model_shapes.py) and T: this project's W4A16 layer with
its tuned config ("this project (tuned)", as benchmarks/bench_matrix.py), and the W4A8 layer as moe_forward runs
it (the W4A16 kernels on the operands' bf16 values, with the config tuning.w4a8_config derives from W4A16's;
forward.resolve_w4a8_mma), with dynamic MXFP8
activations ("this project W4A8 mxfp8", the rules' kMxfp8Dynamic) and with static per-tensor FP8 activations
("this project W4A8 fp8 static", kFp8StaticTensorSym; the input scales calibrated once on a 256-token batch, as a
checkpoint's input_scale); plus the memory floor, the
bf16-matmul bound (6·T·k·H·I FLOP at this run's 8192^3 bf16 matmul rate) and the FP8-matmul bound (the same FLOP
at this run's 8192^3 FP8 E4M3 torch._scaled_mm rate). --variants adds, at T >= 4096, A/B rows of the W4A8 layer
with other launch configs (VARIANTS: the W4A16 tables were tuned for bf16 dots), named "<scheme's row> [<variant>]";
--fp8-dots adds the W4A8 layer with FP8 dots forced (w4a8_mma="fp8"), "<scheme's row> [fp8 dots]"; --ws-fp8-dots
adds, at T >= WS_MIN_TOKENS, the warp-specialized kernels' W4A8 (FP8 dots whose sums accumulate in the tensor core,
forward.FP8_ACCUMULATIONS "tensor-core"), "<scheme's row> [fp8 dots, warp-specialized]".

Every W4A8 row is checked against the emulation of what its kernels compute on up to 256 tokens
before it is timed; its note gives that relative L2, the speedup over the W4A16 row of the same T and the fraction
of the FP8 `_scaled_mm` rate. Method as bench_matrix (backends.gpu_timing): the whole layer including routing
captured as a CUDA graph, L2 flushed before each replay, median of --iters replays.

    python benchmarks/bench_w4a8.py --out benchmarks/results/<run> [--layers a,b] [--tokens 1,16] [--iters 10]
                                    [--schemes mxfp8,fp8_per_tensor_static] [--variants swap-bk128,...] [--fp8-dots]
                                    [--ws-fp8-dots]
    python benchmarks/bench_w4a8.py --dry-run --out DIR     # CPU smoke: tiny layers, emulation, no timing
    python benchmarks/report_matrix.py                       # the W4A8 section beside the W4A16 rows

Writes <out>/matrix.csv (bench_matrix's COLUMNS, appended row by row: a cut-off run keeps what it measured) and
<out>/environment.json (with scaled_mm_tflops and the variants' configs). --dry-run runs the same rows on the CPU
with tiny layers of the same formats and activations, the emulation in place of the kernels and wall clock in
place of graph timing: its numbers are not measurements.
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

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

# torch-free imports only up to main(): --help and argument errors answer at once
from report_matrix import FLOOR, FP8_MATMUL, MATMUL, OURS, W4A8_SCHEMES, WARP_SPECIALIZED_FP8  # noqa: E402

from backends.model_shapes import SHAPES  # noqa: E402
from backends.triton_moe.tuning.configs import LaunchConfig, MoEConfig  # noqa: E402

TOKENS = (1, 16, 256, 1024, 4096, 16384)
DRY_RUN_TOKENS = (1, 16)
LAYERS = ("gpt-oss-120b", "deepseek-v3")
CHECK_TOKENS = 256
#: a W4A8 row whose output is further than this from the emulation (Layer.reference) is reported, not timed; twice
#: that for sums accumulated in the tensor core (tests/tolerances.py: w4a8_tensor_core_sums_rel_l2)
CHECK_REL_L2 = 2e-2
#: --ws-fp8-dots: from this T on (the warp-specialized kernels are prefill kernels)
WS_MIN_TOKENS = 1024
#: --variants: launch configs tried for the W4A8 layer beside the W4A16 tables' choice, from this T on (the tables
#: were tuned for bf16 dots): BLOCK_K 128 (two 64-wide FP8 dots per step), and plain tiles, whose activations are
#: the wgmma register operand, quantized in registers where they already are.
VARIANT_MIN_TOKENS = 4096
VARIANTS = {
    "swap-bk128": MoEConfig(LaunchConfig(128, 64, 128, 8, True, 4, 3, stack_gate_up=True),
                            LaunchConfig(128, 128, 128, 8, True, 4, 3), "variant swap-bk128"),
    "plain-128x128x64-w8": MoEConfig(LaunchConfig(128, 128, 64, 8, False, 8, 3),
                                     LaunchConfig(128, 128, 64, 8, False, 8, 3), "variant plain-128x128x64-w8"),
    "plain-128x128x128-w8": MoEConfig(LaunchConfig(128, 128, 128, 8, False, 8, 3),
                                      LaunchConfig(128, 128, 128, 8, False, 8, 3), "variant plain-128x128x128-w8"),
    "plain-64x128x128-w4": MoEConfig(LaunchConfig(64, 128, 128, 8, False, 4, 3),
                                     LaunchConfig(64, 128, 128, 8, False, 4, 3), "variant plain-64x128x128-w4"),
}


@dataclasses.dataclass(frozen=True)
class Run:
    """One timed row of a (layer, T) cell: the W4A16 layer (scheme None) or the W4A8 layer with one FP8 scheme,
    with the tuned config (variant None) or a VARIANTS config, on moe_forward's tensor cores (mma None) or forced
    ones (moe_forward's w4a8_mma)."""

    implementation: str
    scheme: str | None = None
    variant: str | None = None
    mma: str | None = None
    warp_specialized: bool = False

    def call(self) -> dict:
        """moe_forward's arguments that pick the row's kernels: the warp-specialized ones need tensor-core sums."""
        if not self.warp_specialized:
            return {}
        return {"prefill_kernel": "warp-specialized", "fp8_accumulate": "tensor-core"}


def runs_at(tokens: int, schemes: tuple[str, ...], variants: tuple[str, ...], fp8_dots: bool = False,
            ws_fp8_dots: bool = False) -> list[Run]:
    """The timed rows at T, W4A16 first: its time is every W4A8 row's baseline. fp8_dots: also each scheme with FP8
    dots forced (for MXFP4 layers, whose W4A8 runs bf16 dots unforced); ws_fp8_dots: and on the warp-specialized
    kernels from WS_MIN_TOKENS."""
    runs = [Run(OURS)] + [Run(W4A8_SCHEMES[s], s) for s in schemes]
    if fp8_dots:
        runs += [Run(f"{W4A8_SCHEMES[s]} [fp8 dots]", s, mma="fp8") for s in schemes]
    if ws_fp8_dots and tokens >= WS_MIN_TOKENS:
        runs += [Run(f"{W4A8_SCHEMES[s]} [{WARP_SPECIALIZED_FP8}]", s, mma="fp8", warp_specialized=True)
                 for s in schemes]
    if tokens >= VARIANT_MIN_TOKENS:
        runs += [Run(f"{W4A8_SCHEMES[s]} [{v}]", s, v) for v in variants for s in schemes]
    return runs


def bound_rows(tokens: int, top_k: int, hidden_size: int, intermediate_size: int, touched: int, expert_bytes: int,
               env: dict) -> list[tuple[str, float | None, str]]:
    """(implementation, µs, note) of the cell's bounds: the memory floor (the touched experts' bytes at the run's
    bandwidth), the bf16 and the FP8 matmul bounds (6·T·k·H·I FLOP at the run's 8192^3 rates)."""
    flop = 6 * tokens * top_k * hidden_size * intermediate_size
    fp8 = env["scaled_mm_tflops"]
    return [(FLOOR, touched * expert_bytes / (env["bandwidth_gbs"] * 1e3), f"{touched} experts touched"),
            (MATMUL, flop / (env["matmul_tflops"] * 1e6), ""),
            (FP8_MATMUL, flop / (fp8 * 1e6) if fp8 else None,
             f"6·T·k·H·I FLOP at the FP8 8192^3 torch._scaled_mm rate ({fp8:.0f} TFLOP/s)" if fp8 else
             "no FP8 torch._scaled_mm rate measured")]


def w4a8_note(rel_l2: float, us: float, w4a16_us: float | None, fp8_bound_us: float | None) -> str:
    """A timed W4A8 row's note: rel L2 vs the emulation, speedup over W4A16, fraction of the FP8 matmul rate."""
    note = f"rel L2 vs emulation {rel_l2:.1e}"
    if w4a16_us:
        note += f"; {w4a16_us / us:.2f}x W4A16"
    if fp8_bound_us:
        note += f"; {fp8_bound_us / us:.2f} of FP8 scaled_mm"
    return note


def _csv_list(text: str, what: str, allowed, p: argparse.ArgumentParser) -> tuple[str, ...]:
    items = tuple(item.strip() for item in text.split(",") if item.strip())
    unknown = [item for item in items if item not in allowed]
    if unknown or not items:
        p.error(f"{what}: {', '.join(unknown) or 'empty'} not known; choose from {', '.join(allowed)}")
    return items


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="run directory: matrix.csv and environment.json go here")
    p.add_argument("--layers", "--shapes", dest="layers", default=",".join(LAYERS),
                   help=f"comma-separated layers of backends/model_shapes.py (default {','.join(LAYERS)})")
    p.add_argument("--tokens", default=None, help=f"comma-separated T (default {','.join(map(str, TOKENS))}; "
                                                  f"dry run {','.join(map(str, DRY_RUN_TOKENS))})")
    p.add_argument("--schemes", default=",".join(W4A8_SCHEMES),
                   help=f"comma-separated FP8 activation schemes (default {','.join(W4A8_SCHEMES)})")
    p.add_argument("--variants", default="", help=f"comma-separated launch configs also timed for the W4A8 layer at "
                                                  f"T >= {VARIANT_MIN_TOKENS}: {', '.join(VARIANTS)}")
    p.add_argument("--fp8-dots", action="store_true",
                   help="also time each scheme with FP8 dots forced (w4a8_mma='fp8')")
    p.add_argument("--ws-fp8-dots", action="store_true",
                   help=f"also the W4A8 layer on the warp-specialized kernels' FP8 dots (tensor-core sums), at T >= "
                        f"{WS_MIN_TOKENS}")
    p.add_argument("--iters", type=int, default=10, help="graph replays per row (median)")
    p.add_argument("--run-id", default=None, help="default: <gpu>-w4a8-<UTC date and time>")
    p.add_argument("--commit", default=os.environ.get("MOE_ORACLE_COMMIT", "unknown"))
    p.add_argument("--dry-run", action="store_true", help="CPU smoke run: tiny layers, emulation, no GPU")
    args = p.parse_args(argv)
    args.layers = _csv_list(args.layers, "--layers", tuple(SHAPES), p)
    args.schemes = _csv_list(args.schemes, "--schemes", tuple(W4A8_SCHEMES), p)
    args.variants = _csv_list(args.variants, "--variants", tuple(VARIANTS), p) if args.variants else ()
    tokens = args.tokens or ",".join(map(str, DRY_RUN_TOKENS if args.dry_run else TOKENS))
    try:
        args.tokens = tuple(int(t) for t in tokens.split(","))
    except ValueError:
        p.error(f"--tokens: {tokens!r} is not a comma-separated list of whole numbers")
    if min(args.tokens) < 1 or args.iters < 1:
        p.error("--tokens and --iters must be at least 1")
    if os.path.exists(os.path.join(args.out, "matrix.csv")):
        p.error(f"--out {args.out} already holds a matrix.csv: give a new run directory")
    return args


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

    def time_us(self, fn, flush, iters: int) -> float:
        """Median µs of fn: a CUDA graph replayed after an L2 flush (GPU), or eager wall clock (dry run)."""
        if self.dry_run:
            from _timing import each

            return statistics.median(each(fn, min(iters, 3))[1]) * 1e6
        from backends.gpu_timing import time_graph

        return time_graph(fn, flush, iters)


def scaled_mm_tflops(size: int = 8192) -> float:
    """FP8 E4M3 size^3 torch._scaled_mm TFLOP/s (per-tensor scales, bf16 output), median of 20 calls."""
    import torch

    from backends.gpu_timing import events_ms

    a = torch.randn(size, size, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(size, size, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
    one = torch.ones((), device="cuda")

    def mm():
        return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    for _ in range(3):
        mm()
    return 2 * size**3 / events_ms(mm, lambda: None, 20) / 1e9


def ceilings(device: Device) -> dict:
    if device.dry_run:
        return {"bandwidth_gbs": 10.0, "copy_gbs": 10.0, "read_gbs": 10.0, "matmul_tflops": 0.1,
                "scaled_mm_tflops": 0.0}
    from backends.gpu_timing import measure_ceilings

    names = ("bandwidth_gbs", "copy_gbs", "read_gbs", "matmul_tflops")
    return {**dict(zip(names, measure_ceilings(), strict=True)), "scaled_mm_tflops": scaled_mm_tflops()}


class Layer:
    """One layer's implementations: fn(run, x, logits) for the timed rows and the emulation reference per scheme."""

    def __init__(self, device: Device, shape, ckpt: dict, act: dict, scales: dict) -> None:
        self.device, self.shape, self.ckpt, self.scales = device, shape, ckpt, scales
        self.call = dict(top_k=shape.top_k, **act)
        self.what = "emulation (dry run)" if device.dry_run else "kernels"
        if device.dry_run:
            return
        import torch

        from backends.layouts.triton_moe import to_kernel_layout
        from backends.triton_moe import tuning

        # as converter_w4a8 holds them: forced FP8 dots compute their row data once, in the eager check call
        # that precedes the row's graph capture
        self.weights = to_kernel_layout(**ckpt)
        self.arch, self.gpu_info = tuning.device_gpu(torch.device(device.name))

    def _extra(self, scheme: str | None) -> dict:
        return self.scales if scheme == "fp8_per_tensor_static" else {}

    def reference(self, scheme: str, mma: str, x, logits):
        """The emulation of what the row's kernels compute: FP8 dots' rebased operands, or bf16 dots' fake-quantized
        ones (forward.resolve_w4a8_mma)."""
        from backends import emulation

        return emulation.moe_forward(x, **self.ckpt, router_logits=logits, gemm_input_schemes=(scheme, scheme),
                                     fp8_operands=mma == "fp8", **self.call, **self._extra(scheme))

    def mma(self, run: Run) -> str | None:
        """The tensor cores the row runs on (forward.resolve_w4a8_mma; None for W4A16)."""
        from backends.triton_moe.forward import resolve_w4a8_mma

        return resolve_w4a8_mma(run.scheme, run.mma)

    def config(self, run: Run, tokens: int):
        """The launch config (GPU; None in the dry run): a VARIANTS entry, else what moe_forward would choose (the
        tuned choice, as tuning.w4a8_config adapts it to the row's kernels)."""
        if run.variant:
            return VARIANTS[run.variant]
        if self.device.dry_run:
            return None
        from backends.triton_moe import tuning

        tuned = tuning.select_config(self.arch, self.gpu_info, tuning.Problem(tokens=tokens, **self.shape.fields()))
        return tuning.w4a8_config(self.arch, tuned, run.scheme, self.mma(run))

    def fn(self, run: Run, config):
        """fn(x, logits) -> y of one row: the kernels with `config` (GPU) or the emulation (dry run)."""
        if self.device.dry_run:
            if run.scheme is None:
                from backends import emulation

                return lambda x, logits: emulation.moe_forward(x, **self.ckpt, router_logits=logits, **self.call)
            return functools.partial(self.reference, run.scheme, self.mma(run))
        from backends.triton_moe import moe_forward

        quant = ({"act_quant": run.scheme, "w4a8_mma": run.mma, **self._extra(run.scheme), **run.call()}
                 if run.scheme else {})
        return lambda x, logits: moe_forward(x, self.weights, router_logits=logits, config=config, **self.call, **quant)


def run_layer(name: str, device: Device, args, env: dict, emit_row, flush) -> None:
    """Every row of one layer: per T the bounds, W4A16, then each W4A8 run checked against the emulation."""
    import torch
    from bench_matrix import describe, rel_l2
    from w4a8_accuracy import static_scales

    from backends.gpu_timing import expert_bytes
    from backends.triton_moe.forward import takes_decode_kernels
    from backends.triton_moe.testing import activation_kwargs, random_checkpoint

    shape = device.shape(name)
    gen = torch.Generator(device=device.name).manual_seed(0)
    ckpt = random_checkpoint(shape, device=device.name, generator=gen)
    act = activation_kwargs(shape)
    calib = torch.randn(CHECK_TOKENS, shape.hidden_size, device=device.name, generator=gen).bfloat16()
    calib_logits = torch.randn(CHECK_TOKENS, shape.experts, device=device.name, generator=gen)
    scales = static_scales(calib, ckpt, calib_logits, shape.top_k, act["activation"],
                           ckpt.get("gate_up_layout", "interleaved"))
    layer = Layer(device, shape, ckpt, act, scales)
    base = {"run_id": env["run_id"], "date": env["date"], "gpu": env["gpu"], "commit": env["commit"], "shape": name,
            **shape.fields()}
    print(f"\n## {name} {shape.fields()} ({layer.what})", flush=True)
    for tokens in args.tokens:
        x = torch.randn(tokens, shape.hidden_size, device=device.name, generator=gen).bfloat16()
        logits = torch.randn(tokens, shape.experts, device=device.name, generator=gen)
        touched = torch.topk(logits, shape.top_k, dim=-1).indices.unique().numel()
        bounds = bound_rows(tokens, shape.top_k, shape.hidden_size, shape.intermediate_size, touched,
                            expert_bytes(shape.format, shape.hidden_size, shape.intermediate_size), env)
        emit = functools.partial(emit_row, {**base, "tokens": tokens}, bounds[0][1])
        for impl, us, note in bounds:
            emit(impl, us, note=note)
        fp8_bound_us = bounds[2][1]
        n = min(tokens, CHECK_TOKENS)
        references: dict = {}
        w4a16_us = None
        for run in runs_at(tokens, args.schemes, args.variants, args.fp8_dots, args.ws_fp8_dots):
            described, check = "", 0.0
            try:
                config = layer.config(run, tokens)  # chosen before any graph capture
                mma = layer.mma(run)
                described = describe(config, takes_decode_kernels(config, mma)) if config else ""
                if mma and described:
                    described += f"; {mma} dots" + ("; warp-specialized kernels" if run.warp_specialized else "")
                fn = layer.fn(run, config)
                if run.scheme:
                    if (run.scheme, mma) not in references:
                        references[run.scheme, mma] = layer.reference(run.scheme, mma, x[:n], logits[:n])
                    check = rel_l2(fn(x[:n], logits[:n]), references[run.scheme, mma])
                    limit = CHECK_REL_L2 * (2 if run.warp_specialized else 1)
                    if not check <= limit:
                        emit(run.implementation, None, described, f"not timed: rel L2 {check:.1e} vs the emulation "
                                                                  f"> {limit:g}")
                        continue
                us = device.time_us(functools.partial(fn, x, logits), flush, args.iters)
            except Exception as exc:  # noqa: BLE001  one failing path at one T is a result
                emit(run.implementation, None, described, f"failed: {type(exc).__name__}: {exc}"[:300])
                continue
            if run.scheme is None:
                w4a16_us = us
            emit(run.implementation, us, described, w4a8_note(check, us, w4a16_us, fp8_bound_us) if run.scheme else "")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not args.dry_run:
        if not torch.cuda.is_available():
            print("bench_w4a8.py: error: no CUDA device here: run it on a GPU (SM89+), or pass --dry-run for the "
                  "CPU smoke run", file=sys.stderr)
            return 2
        if torch.cuda.get_device_capability() < (8, 9):
            print(f"bench_w4a8.py: error: {torch.cuda.get_device_name()} has no FP8 tensor cores (W4A8 needs SM89+)",
                  file=sys.stderr)
            return 2
    from bench_matrix import COLUMNS, _emit

    device = Device(args.dry_run)
    started = time.perf_counter()
    torch.manual_seed(0)
    gpu = "CPU (dry run)" if args.dry_run else torch.cuda.get_device_name()
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run_id = args.run_id or f"{'dry-run' if args.dry_run else gpu.removeprefix('NVIDIA ').split()[0]}-w4a8-{date}"
    os.makedirs(args.out, exist_ok=True)
    env = {"run_id": run_id, "date": date, "gpu": gpu, "commit": args.commit, "torch": torch.__version__,
           "cuda": torch.version.cuda, **ceilings(device), "schemes": list(args.schemes),
           "variants": {v: dataclasses.asdict(VARIANTS[v]) for v in args.variants},
           "method": "dry run: CPU emulation, wall clock" if args.dry_run else
           "CUDA graph of the whole layer incl. routing, L2 flushed before each replay, median of "
           f"{args.iters}; W4A8 checked against the emulation of its kernels' numerics on <= {CHECK_TOKENS} tokens"}
    with open(os.path.join(args.out, "environment.json"), "w") as f:
        json.dump(env, f, indent=1)
    print(f"# {run_id}: {json.dumps(env)}", flush=True)
    flush = None
    if not args.dry_run:
        from backends.gpu_timing import Flusher

        flush = Flusher()
    with open(os.path.join(args.out, "matrix.csv"), "w", newline="") as out:
        writer = csv.DictWriter(out, COLUMNS)
        writer.writeheader()

        def emit_row(base: dict, floor: float, impl: str, us, config: str = "", note: str = "") -> None:
            if args.dry_run:
                note = "; ".join(filter(None, ("dry run (CPU emulation, not a measurement)", note)))
            _emit(writer, out, base, floor, impl, us, config, note)

        for name in args.layers:
            run_layer(name, device, args, env, emit_row, flush)
            if not args.dry_run:
                torch.cuda.empty_cache()
    print(f"# done in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
