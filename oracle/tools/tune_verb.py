"""`moe-oracle tune`: measure the Triton MoE kernels' launch configs for one layer shape on this CUDA GPU and
write them to the user's tuning table (backends/triton_moe/tuning; shipped tables stay read-only).

    moe-oracle tune --model-config path/to/config.json [--format nvfp4]
    moe-oracle tune --shape 128,8,4096,1536 --format mxfp4 [--activation silu]

The table goes to $MOE_ORACLE_TUNING_DIR (default ~/.cache/moe-oracle/tuning, or $XDG_CACHE_HOME/moe-oracle/tuning)
as <gpu>.yaml; every later layer on that GPU kind picks it up. Needs torch with CUDA and triton.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

from ..errors import OracleError

DEFAULT_TOKENS = "1,4,16,64,256,1024,4096,16384"


def add_tune_parser(sub: Any) -> None:
    s = sub.add_parser("tune", help="measure launch configs of this project's Triton MoE kernels for one layer shape "
                                    "on this GPU and write them to the user tuning table (needs CUDA)")
    source = s.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-config", metavar="CONFIG_JSON",
                        help="a Hugging Face config.json (gpt-oss, Qwen3-MoE/Next, DeepSeek-V3, Kimi-K2, Llama-4, "
                             "GLM-4.5, MiniMax)")
    source.add_argument("--shape", metavar="E,k,H,I", help="experts, top-k, hidden size, expert intermediate size")
    s.add_argument("--format", choices=("mxfp4", "nvfp4"),
                   help="weight format (required with --shape; with --model-config: overrides quantization_config)")
    s.add_argument("--activation", choices=("silu", "swigluoai"), default=None,
                   help="with --shape: silu (default; contiguous gate/up, no biases) or swigluoai (gpt-oss layout)")
    s.add_argument("--tokens", default=DEFAULT_TOKENS, help=f"T buckets to measure (default {DEFAULT_TOKENS})")
    s.add_argument("--iters", type=int, default=10, help="timed graph replays per candidate (default 10)")
    s.add_argument("--out-dir", metavar="DIR", help="write here instead of the user tuning directory")


def _shape(args: argparse.Namespace) -> Any:
    shapes = importlib.import_module("backends.model_shapes")
    try:
        if args.model_config:
            return shapes.shape_from_config(args.model_config, format=args.format)
        if not args.format:
            raise OracleError("--shape needs --format mxfp4 or --format nvfp4")
        return shapes.shape_from_args(args.shape, args.format, activation=args.activation)
    except shapes.ModelConfigError as exc:
        raise OracleError(str(exc)) from None


def _tokens(text: str) -> list[int]:
    try:
        tokens = [int(t) for t in text.split(",")]
    except ValueError:
        raise OracleError(f"--tokens {text!r} must be comma-separated positive integers, e.g. 1,16,256") from None
    if not tokens or min(tokens) < 1:
        raise OracleError(f"--tokens {text!r} must be comma-separated positive integers, e.g. 1,16,256")
    return sorted(set(tokens))


def run_tune(args: argparse.Namespace) -> int:
    shape = _shape(args)
    tokens = _tokens(args.tokens)
    if args.iters < 1:
        raise OracleError(f"--iters {args.iters} must be at least 1")
    try:
        torch = importlib.import_module("torch")
        importlib.import_module("triton")
    except ImportError as exc:
        raise OracleError(f"tune needs torch with CUDA and triton ({exc}); pip install 'moe-oracle[triton]' on a "
                          f"machine with an NVIDIA GPU") from None
    if not torch.cuda.is_available():
        raise OracleError("tune measures kernels on a CUDA GPU and none is visible here (torch.cuda.is_available() "
                          "is False); run it on the machine that will serve the model")
    tuning = importlib.import_module("backends.triton_moe.tuning")
    tune = importlib.import_module("backends.triton_moe.tuning.tune")
    try:
        tune.run_tune(shape, tokens, iters=args.iters, out_dir=Path(args.out_dir) if args.out_dir else None,
                      out=sys.stdout)
    except tuning.TuningTableError as exc:
        raise OracleError(str(exc)) from None
    return 0
