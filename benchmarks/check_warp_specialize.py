"""Does this Triton warp-specialize an SM90 loop? The answer decides how W4A16 / W4A8 prefill can get more warps in
flight (docs/kernels.md, W4A8 speed): Triton's automatic `tl.range(..., warp_specialize=True)`, or Gluon's explicit
`gl.warp_specialize` (triton.experimental.gluon, its hopper module: TMA, mbarriers, wgmma).

Compiles a TMA-descriptor bf16 matmul ahead of time for sm_90, and for sm_100 as the control where Triton does
warp-specialize, with and without the flag, and counts the `ttg.warp_specialize` ops in the TTGIR. No GPU needed
(ptxas ships with the triton wheel). Triton 3.6 and 3.9: 0 ops on sm_90 either way; on sm_100 with the flag, 5
(3.6) or 1 (3.9).

    python benchmarks/check_warp_specialize.py      # one line per (arch, flag); exit 1 if sm_90 ignores the flag
"""

from __future__ import annotations

import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  WARP_SPECIALIZE: tl.constexpr):
    """c = a @ b^T by TMA-descriptor tiles, the K loop optionally warp-specialized."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [K, 1], [BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, [N, K], [K, 1], [BN, BK])
    acc = tl.zeros((BM, BN), tl.float32)
    for k in tl.range(0, K, BK, num_stages=3, warp_specialize=WARP_SPECIALIZE):
        acc = tl.dot(a_desc.load([pid_m * BM, k]), b_desc.load([pid_n * BN, k]).T, acc)
    c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [N, 1], [BM, BN])
    c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.bfloat16))


def warp_specialize_ops(flag: bool, capability: int = 90) -> int:
    names = matmul_kernel.arg_names
    signature = {name: "*bf16" for name in names[:3]} | {name: "i32" for name in names[3:6]}
    constexprs = {"BM": 128, "BN": 128, "BK": 64, "WARP_SPECIALIZE": flag}
    signature |= {name: "constexpr" for name in constexprs}
    source = ASTSource(fn=matmul_kernel, signature=signature,
                       constexprs={(names.index(name),): value for name, value in constexprs.items()},
                       attrs={(i,): [["tt.divisibility", 16]] for i in range(6)})
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32),
                              options={"num_warps": 8, "num_stages": 3})
    return compiled.asm["ttgir"].count("ttg.warp_specialize")


def main() -> int:
    counts = {(arch, flag): warp_specialize_ops(flag, arch) for arch in (90, 100) for flag in (False, True)}
    for (arch, flag), count in counts.items():
        print(f"triton {triton.__version__}, sm_{arch}, warp_specialize={flag}: {count} ttg.warp_specialize ops")
    return 0 if counts[90, True] > counts[90, False] else 1


if __name__ == "__main__":
    sys.exit(main())
