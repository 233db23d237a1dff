"""`moe-oracle bench`: the command line of backends.bench (imported only when the command runs: the oracle itself
never imports torch). Arguments are checked before the GPU is touched; every refusal is one `moe-oracle: error:`
line naming the argument or backend and the fix."""
from __future__ import annotations

import argparse
import importlib
from typing import Any

from ..vocabulary import GATED_ACTIVATIONS

__all__ = ["add_bench_parser", "run_bench"]

EXIT_OK, EXIT_NOTHING_TIMED, EXIT_USAGE = 0, 1, 2


def add_bench_parser(sub: Any) -> None:
    s = sub.add_parser("bench", help="time, on this GPU, every backend the rules could select here that has a runner "
                                     "(forced in turn), after checking each against the emulation")
    s.add_argument("--shape", required=True, metavar="E,k,H,I",
                   help="experts, experts per token, hidden size, intermediate size, e.g. 128,4,2880,2880")
    s.add_argument("--format", required=True, choices=("mxfp4", "nvfp4"), help="the checkpoint's weight format")
    s.add_argument("--activation", choices=GATED_ACTIVATIONS,
                   help="the experts' gated activation (default: swigluoai for mxfp4, silu for nvfp4)")
    s.add_argument("--gate-up", choices=("interleaved", "contiguous"),
                   help="w13 row order (default: interleaved for swigluoai as gpt-oss, else contiguous [w1; w3])")
    s.add_argument("--bias", action=argparse.BooleanOptionalAction, default=None,
                   help="expert biases (default: with swigluoai, as gpt-oss)")
    s.add_argument("--tokens", default="1,4,16,64,256,1024,4096", help="token counts to time, comma-separated")
    s.add_argument("--profile", default="vllm-0.33", help="the profile whose default pick is the baseline")
    s.add_argument("--also", default="moe-oracle",
                   help="more profiles whose backends are timed too, comma-separated ('' for none)")
    s.add_argument("--policy", help="the policy asked (default: the format's, mxfp4 or nvfp4)")
    s.add_argument("--iters", type=int, default=30, help="replays per timing (median)")
    s.add_argument("--check-tokens", type=int, default=8, help="tokens of the check against the emulation")
    s.add_argument("--csv", metavar="FILE", help="also write the rows as CSV")
    s.add_argument("--overrides-out", metavar="FILE",
                   help="also write a deployment-overrides file pinning the profile's fastest backend")
    s.add_argument("--model", help="model name (glob) the overrides entry matches (default: any model)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def run_bench(args: argparse.Namespace) -> int:
    from .commands import to_stderr

    bench = importlib.import_module("backends.bench")
    try:
        return int(_run(bench, args))
    except bench.BenchError as exc:
        to_stderr(f"bench: {exc}")
        return EXIT_USAGE


def _run(bench: Any, args: argparse.Namespace) -> int:
    from .commands import to_stderr

    e, k, h, i = bench.parse_shape(args.shape)
    activation = args.activation or ("swigluoai" if args.format == "mxfp4" else "silu")
    shape = bench.layer_shape(e, k, h, i, args.format, activation, gate_up=args.gate_up, biases=args.bias)
    tokens = bench.parse_tokens(args.tokens)
    for flag, value, low in (("--iters", args.iters, 1), ("--check-tokens", args.check_tokens, 1)):
        if value < low:
            raise bench.BenchError(f"{flag} {value}: must be at least {low}")
    bench.check_output_path("--csv", args.csv)
    bench.check_output_path("--overrides-out", args.overrides_out)
    also = [p.strip() for p in args.also.split(",") if p.strip()]
    candidates = bench.plan(shape, profile=args.profile, also=also, policy=args.policy)
    gpu = bench.require_cuda()
    runnable = [c for c in candidates if c.not_timed is None]
    print(f"# {shape.describe()} on {gpu}: timing {', '.join(c.backend for c in runnable) or 'nothing'}", flush=True)
    rows, facts = bench.run(shape, candidates, tokens, policy=args.policy, iters=args.iters,
                            check_tokens=args.check_tokens, progress=not args.no_progress)
    print(bench.render(shape, rows, facts, tokens), flush=True)
    if args.csv:
        bench.write_csv(args.csv, shape, rows, facts)
    if args.overrides_out:
        bench.write_overrides(args.overrides_out, shape, rows, facts, tokens, profile=args.profile,
                              policy=args.policy or shape.format, model=args.model)
    if not any(r.us is not None for r in rows):
        to_stderr("bench: no backend was timed; the table's notes say why", level="warning")
        return EXIT_NOTHING_TIMED
    return EXIT_OK
