"""What one K step of the decode kernels costs in SASS, without a GPU: instructions per weight word by opcode.

At T = 1 the decode kernels' own work, not their memory traffic, stands between gpt-oss-120b and 0.60 of the memory
floor (benchmarks/results/decode-bisect-h100-2026-11-27/): this counts it. Each kernel is compiled for sm_90 with the
constexprs and launch options forward._launch_decode would pass (forward.gemv_constexprs) for a layer's decode
config (tuning.decode_kernels on 132 SMs), and its K loop (the loop holding the MMAs) is read from the SASS: each
m16n8k16 MMA takes one weight word a lane (8 a K step: two rows x 16 bytes), so instructions / MMAs is the cost of a
word.

    python benchmarks/count_decode_sass.py [--layers gpt-oss-120b,deepseek-v3] [--tokens 1] [--out DIR]

Prints a line per kernel and, with --out, writes DIR/decode_sass.csv. Needs triton with its CUDA backend (any
machine: nothing runs).
"""

from __future__ import annotations

import argparse
import collections
import csv
import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from _cubin import compile_sm90, cubin_tool, loops  # noqa: E402

from backends.model_shapes import SHAPES  # noqa: E402

#: The kernels' pointer arguments and their element types, as forward._launch_decode passes them.
POINTERS = {"x_ptr": "*bf16", "h_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*i32", "gs_ptr": "*fp32",
            "bias_ptr": "*fp32", "logits_ptr": "*fp32", "ids_ptr": "*i32", "route_w_ptr": "*fp32", "y_ptr": "*bf16",
            "qscale_ptr": "*fp32", "part_ptr": "*fp32", "ticket_ptr": "*i32"}
_OPCODE = re.compile(r"^(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def compile_gemv(gemv: int, layer: str, tokens: int, sm_count: int = 132, module=None):
    """The layer's GEMV1 (gemv=1, routing from router logits) or GEMV2 at `tokens`, compiled for sm_90 as
    forward._launch_decode launches it (the kernels of `module`, a variant of _gemv_kernels, if given); ->
    (compiled kernel, its GemvLaunch, its launch options)."""
    from backends.triton_moe import _gemv_kernels, _kernels, forward, tuning

    shape = SHAPES[layer]
    decode = tuning.decode_kernels(sm_count, tuning.Problem(tokens=tokens, **shape.fields()))
    launch = decode.gemv1 if gemv == 1 else decode.gemv2
    nvfp4 = shape.format == "nvfp4"
    act = _kernels.ACT_SWIGLUOAI if shape.activation == "swigluoai" else _kernels.ACT_SILU
    constexprs, options = forward.gemv_constexprs(
        gemv, launch, top_k=shape.top_k, nvfp4=nvfp4, folded=True, interpreted=False, has_bias=not nvfp4,
        route=True, experts=shape.experts, renormalize=True, act=act)
    k_size, n = ((shape.hidden_size, shape.intermediate_size) if gemv == 1
                 else (shape.intermediate_size, shape.hidden_size))
    constexprs.update(K=k_size, N=n, stride_wn=k_size // 2)  # the layout's bytes per weight row
    module = module or _gemv_kernels
    fn = module.gemv1_act_kernel if gemv == 1 else module.gemv2_sum_kernel
    return compile_sm90(fn, constexprs, POINTERS, options), launch, options


def k_loop_body(sass: str) -> list[str]:
    """The instructions of the loop that holds the most MMAs (the K loop; steps peeled after it hold fewer)."""
    code, spans = loops(sass)
    return max((code[top:end + 1] for top, end in spans), key=lambda body: (sum("HMMA" in ins for ins in body),
                                                                            -len(body)))


def resources(compiled) -> dict:
    """Registers per thread and local memory (spill) bytes of a compiled kernel."""
    usage = cubin_tool(compiled, "cuobjdump", "-res-usage")
    return {"registers": int(re.search(r"REG:(\d+)", usage).group(1)),
            "local_bytes": int(re.search(r"LOCAL:(\d+)", usage).group(1))}


def count(compiled) -> dict:
    """resources(), and the K loop's instructions per iteration, in all and by opcode."""
    body = k_loop_body(cubin_tool(compiled, "nvdisasm", "-c"))
    opcodes = collections.Counter(_OPCODE.search(line).group(1) for line in body)
    return {**resources(compiled), "per_iteration": len(body), "opcodes": dict(opcodes.most_common())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="gpt-oss-120b,deepseek-v3",
                        help="comma-separated layers of backends.model_shapes.SHAPES")
    parser.add_argument("--tokens", type=int, default=1, choices=(1, 2), help="tokens (the decode kernels serve 1-2)")
    parser.add_argument("--out", help="write DIR/decode_sass.csv")
    args = parser.parse_args(argv)
    layers = [name for name in args.layers.split(",") if name]
    unknown = [name for name in layers if name not in SHAPES]
    if unknown or not layers:
        parser.error(f"--layers {args.layers!r}: unknown {unknown or 'none given'}; choose from {sorted(SHAPES)}")
    rows = []
    for layer in layers:
        for gemv in (1, 2):
            compiled, launch, _ = compile_gemv(gemv, layer, args.tokens)
            c = count(compiled)
            words = c["opcodes"]["HMMA"]  # one MMA per weight word a lane
            per_word = c["per_iteration"] / words
            top = ", ".join(f"{op} {n / words:.1f}" for op, n in list(c["opcodes"].items())[:8])
            print(f"{layer} T={args.tokens} GEMV{gemv} {launch}: {per_word:.1f} instructions per weight word "
                  f"({c['registers']} registers, {c['local_bytes']} B local): {top}")
            opcodes = " ".join(f"{op}={n / words:g}" for op, n in c["opcodes"].items())
            rows.append({"layer": layer, "tokens": args.tokens, "kernel": f"gemv{gemv}",
                         "row_groups": launch.row_groups, "k_slices": launch.k_slices,
                         "loads_ahead": launch.loads_ahead, "registers": c["registers"],
                         "local_bytes": c["local_bytes"], "instructions_per_word": f"{per_word:.2f}",
                         "opcodes_per_word": opcodes})
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "decode_sass.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
