"""Kernels compiled ahead of time for sm_90 and what ptxas made of them, read with the NVIDIA tools that ship with the
triton wheel (no CUDA toolkit, no GPU): the SASS checks of check_wgmma_hazard.py, probe_gluon_w4a16.py and
count_decode_sass.py."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton


def cubin_tool(compiled, tool: str, *args: str) -> str:
    """stdout of triton's bundled `tool` (nvdisasm, cuobjdump) run with `args` on the compiled kernel's cubin."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        binary = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)
        return subprocess.run([binary, *args, path], capture_output=True, text=True, check=True).stdout


def compile_sm90(fn, constexprs: dict, pointers: dict, options: dict, unaligned: tuple = ()):
    """Triton kernel fn compiled for sm_90 with these constexprs and launch options: pointer arguments typed by
    `pointers` (name -> "*bf16", ...), alpha / beta / limit fp32, the rest i32, and every pointer and integer but
    `unaligned` declared 16-divisible, as the layer's tensors and strides are at launch. A constexpr parameter not
    in `constexprs` takes its default, as at a launch that leaves it out."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    constexprs = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}, **constexprs}
    signature = {name: "constexpr" if name in constexprs else pointers.get(
        name, "fp32" if name in ("alpha", "beta", "limit") else "i32") for name in fn.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
               if signature[name] not in ("constexpr", "fp32") and name not in unaligned}
    source = ASTSource(fn=fn, signature=signature, attrs=aligned,
                       constexprs={(fn.arg_names.index(name),): value for name, value in constexprs.items()})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def loops(sass: str) -> tuple[list[str], list[tuple[int, int]]]:
    """(the instructions of nvdisasm -c text, the loops among them as (first, last) index spans): a loop's back edge
    is a predicated branch to an earlier label (a barrier wait's retry path jumps back unconditionally from the
    kernel's end)."""
    code, labels = [], {}
    for line in sass.splitlines():
        label = re.match(r"^\s*(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(code)
        ins = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if ins:
            code.append(ins.group(1))
    return code, [(labels[m.group(1)], j) for j, ins in enumerate(code)
                  if ins.startswith("@") and (m := re.search(r"BRA `\((\.L_x_\d+)\)", ins))
                  and labels.get(m.group(1), j) < j]


def k_loop(sass: str) -> list[str]:
    """The instructions of the kernel's K loop: the shortest loop whose body issues a wgmma with its A operand in
    registers (a longer one is a loop around it, such as a warp-specialized kernel's partition dispatch)."""
    code, spans = loops(sass)
    spans = [(top, end) for top, end in spans if any(_WGMMA.search(ins) for ins in code[top:end + 1])]
    top, end = min(spans, key=lambda span: span[1] - span[0])
    return code[top:end + 1]


_WGMMA = re.compile(r"\b[HQ]GMMA\.\S+ R\d+, R(\d+),")  # a wgmma whose A operand is in registers (4 from R<n>)
_WRITE = re.compile(r"(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)\s+R(\d+)")  # an instruction and its first register operand
_NOT_A_WRITE = ("ST", "LDGSTS", "HGMMA", "QGMMA", "BAR", "RED", "ATOM")  # ops whose first operand is read, not written


def _written_registers(op: str) -> int:
    """How many consecutive registers an instruction writes from its first register operand."""
    if ".128" in op or (op.startswith("LDSM") and op.endswith(".4")):
        return 4
    return 2 if ".64" in op or ".WIDE" in op or (op.startswith("LDSM") and op.endswith(".2")) else 1


def in_flight_operand_writes(loop: list[str]) -> tuple[int, list[str]]:
    """(wgmmas in flight at the loop's back edge, writes of an A register of a wgmma still in flight).

    The registers of a wgmma's A operand must not be written until a wait retires it (PTX leaves it undefined;
    ptxas does not guard it). The loop is followed twice around its back edge: wgmmas form groups up to the one
    marked `gsb0`, `WARPGROUP.DEPBAR.LE gsb0, n` retires all but the newest n groups, and each write of a register
    of an unretired group is reported (second pass only: the first one sets up what enters from the last step)."""
    groups: list[tuple[int, set[int]]] = []  # committed groups, oldest first: (wgmmas, A registers)
    issuing: tuple[int, set[int]] = (0, set())  # wgmmas issued since the last commit
    writes: list[str] = []
    in_flight = 0
    for second in (False, True):
        for ins in loop:
            wait = re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x(\d+)", ins)
            a = _WGMMA.search(ins)
            dest = _WRITE.match(ins)
            if wait:
                keep = int(wait.group(1), 16)
                groups = groups[len(groups) - keep:] if keep else []
            elif a:
                issuing = (issuing[0] + 1, issuing[1] | set(range(int(a.group(1)), int(a.group(1)) + 4)))
                if "gsb0" in ins:
                    groups, issuing = groups + [issuing], (0, set())
            elif second and dest and not dest.group(2).startswith(_NOT_A_WRITE):
                width = _written_registers(dest.group(2))
                live = set().union(issuing[1], *(registers for _, registers in groups))
                if live & set(range(int(dest.group(3)), int(dest.group(3)) + width)):
                    writes.append(ins)
        if not second:
            in_flight = issuing[0] + sum(count for count, _ in groups)
    return in_flight, writes
