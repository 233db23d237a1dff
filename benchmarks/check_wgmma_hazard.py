"""Ahead-of-time check, no GPU needed: do the register-operand wgmma tiles rewrite an in-flight wgmma's registers?

Triton 3.6 leaves the last wgmma of a K step in flight into the next step. In a swap-AB tile (weights as the
register A operand) the next step's dequantization then writes the registers that wgmma still reads, which PTX
leaves undefined; on an H200 it gave wrong, run-to-run varying sums (NVFP4 GEMM2 64x128x64, 4 warps, 3 stages).
The kernels therefore retire the warpgroup's wgmmas before each step's dequantization (`RETIRE_WGMMA`, see
`backends.triton_moe._kernels._dequant_words`). This script compiles every swap-AB wgmma entry of the tuning
tables for sm_90 and reads the SASS of the K loop (`_cubin.in_flight_operand_writes`): no register of a wgmma's
A operand may be written while that wgmma is in flight, followed around the loop's back edge.

    python benchmarks/check_wgmma_hazard.py               # every swap-AB 4-8 warp entry of the shipped tables
    python benchmarks/check_wgmma_hazard.py --no-retire   # the same kernels without the wait: shows the hazard
    python benchmarks/check_wgmma_hazard.py --w4a8        # the W4A8 kernels (E4M3 operands, LUT decode asm)

Exit status 1 when a checked kernel has the hazard. The verdict is for the installed triton and its ptxas; the
GPU machines run triton 3.6.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

from _cubin import compile_sm90, cubin_tool, in_flight_operand_writes, k_loop  # noqa: E402

from backends.triton_moe import _kernels as K  # noqa: E402
from backends.triton_moe import forward, tuning  # noqa: E402
from backends.triton_moe.testing import SHAPES  # noqa: E402

POINTERS = {"x_ptr": "*bf16", "h_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*i32", "gs_ptr": "*fp32", "bias_ptr": "*fp32",
            "part_ptr": "*fp32", "ticket_ptr": "*i32", "route_w_ptr": "*fp32", "out_ptr": "*fp32", "y_ptr": "*bf16",
            "sorted_pair_ptr": "*i32", "block_expert_ptr": "*i32", "padded_total_ptr": "*i32", "rexp_ptr": "*i32",
            "qscale_ptr": "*fp32", "ra_ptr": "*i32", "lut_ptr": "*i32"}


def compile_gemm(gemm: int, shape, c: tuning.LaunchConfig, retire: bool, act_quant: int = 0, promote: bool = False):
    """One GEMM of `shape` with launch config `c`, compiled for sm_90 as forward._launch would launch it (act_quant:
    the kernels' ACT_QUANT: 1 and 2 for the W4A8 tiles with E4M3 operands, 3 for static FP8 on bf16 dots; promote:
    its FP8_PROMOTE)."""
    fn = K.gemm1_act_kernel if gemm == 1 else K.gemm2_kernel
    k_size, n = (shape.hidden_size, shape.intermediate_size) if gemm == 1 else (shape.intermediate_size,
                                                                                 shape.hidden_size)
    nvfp4 = shape.format == "nvfp4"
    fp8 = act_quant in (1, 2)
    consts = forward.gemm_constexprs(gemm, c, k_size=k_size, nvfp4=nvfp4, wgmma=True, interpreted=False,
                                     folded=not fp8, has_bias=not nvfp4)
    consts.update(K=k_size, N=n, RETIRE_WGMMA=retire, ACT_QUANT=act_quant, FP8_PROMOTE=promote)
    if gemm == 1:
        consts.update(LAST_SLICE_ACTIVATES=False, TOP_K=shape.top_k, ACTIVATION=int(not nvfp4))
    else:
        consts.update(LAST_PAIR_SUMS=False, TOP_K=shape.top_k)
    pointers = {**POINTERS, "x_ptr": "*fp8e4nv", "h_ptr": "*fp8e4nv"} if fp8 else dict(POINTERS)
    if c.split_k == 1:  # GEMM2's pair rows are bf16 then (forward._launch's pair_out)
        pointers["out_ptr"] = "*bf16"
    options = {"num_warps": c.num_warps, "num_stages": c.num_stages}
    if c.maxnreg:
        options["maxnreg"] = c.maxnreg
    return compile_sm90(fn, consts, pointers, options, unaligned=("num_pairs", "num_m_blocks"))


def k_loop_hazards(compiled) -> tuple[int, list[str]]:
    """(wgmmas in flight at the K loop's back edge, writes of an A register of a wgmma in flight)."""
    return in_flight_operand_writes(k_loop(cubin_tool(compiled, "nvdisasm", "-c")))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-retire", action="store_true", help="compile without the wait (RETIRE_WGMMA=False)")
    p.add_argument("--w4a8", action="store_true", help="the W4A8 kernels (act_quant 1, E4M3 operands) instead, "
                   "with each FP8 accumulation (forward.FP8_ACCUMULATIONS)")
    args = p.parse_args()
    by_size = {(s.format, s.hidden_size, s.intermediate_size): s for s in SHAPES.values()}
    print("| table entry | GEMM | config | wgmmas in flight at the back edge | A-register writes while in flight |")
    print("|---|---|---|---|---|")
    bad = 0
    for file, index, entry in tuning.shipped_entries():
        when = entry["shape"]
        shape = by_size.get((when["format"], when["hidden_size"], when["intermediate_size"]))
        for gemm, promote in ((g, p) for g in (1, 2) for p in ((True, False) if args.w4a8 else (False,))):
            c = tuning.LaunchConfig(**entry[f"gemm{gemm}"])
            if shape is None or not (c.swap_ab and c.num_warps >= 4):
                continue
            in_flight, writes = k_loop_hazards(compile_gemm(gemm, shape, c, retire=not args.no_retire,
                                                            act_quant=int(args.w4a8), promote=promote))
            bad += bool(writes)
            tile = (f"{c.block_m}x{c.block_n}x{c.block_k}, {c.num_warps} warps, {c.num_stages} stages"
                    + (f", {'wgmma' if promote else 'tensor-core'} sums" if args.w4a8 else ""))
            print(f"| {file}#{index} ({shape.name}, T <= {entry['tokens'].get('max', 'any')}) | {gemm} | {tile} "
                  f"| {in_flight} | {len(writes)}{' (' + writes[0] + ', ...)' if writes else ''} |", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
