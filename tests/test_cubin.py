"""benchmarks/_cubin.py's SASS reading, on hand-written SASS lines: which loop is the K loop, and which writes hit
the A operand of a wgmma still in flight (the register hazard check_wgmma_hazard.py and probe_gluon_w4a16.py test
compiled kernels for)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")  # _cubin finds the disassembler in the triton wheel
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _cubin import in_flight_operand_writes, k_loop  # noqa: E402


def _sass(*lines: str) -> str:
    """nvdisasm -c text: labels as they are, instructions with an address."""
    return "\n".join(line if line.endswith(":") else f"        /*{4 * 16 * i:04x}*/   {line} ;"
                     for i, line in enumerate(lines))


def test_k_loop_is_the_innermost_predicated_loop_with_a_wgmma():
    wgmma = "HGMMA.64x128x16.F32.BF16 R24, R100, gdesc[UR4], R24, gsb0"
    loads = [f"LDS R{100 + i}, [R3+{4 * i:#x}]" for i in range(4)]
    sass = _sass(".L_x_0:", "MOV R1, R2",
                 ".L_x_1:", *loads, ".L_x_2:", "SYNCS.PHASECHK.TRANS64.TRYWAIT P2, [UR4], R0", wgmma,
                 "WARPGROUP.DEPBAR.LE gsb0, 0x0", "@P0 BRA `(.L_x_1)",  # the K loop
                 "@P1 BRA `(.L_x_0)",  # a loop around it
                 "BRA `(.L_x_2)")  # the barrier wait's retry path: unconditional, and shorter than the K loop
    expected = [*loads, "SYNCS.PHASECHK.TRANS64.TRYWAIT P2, [UR4], R0", wgmma, "WARPGROUP.DEPBAR.LE gsb0, 0x0",
                "@P0 BRA `(.L_x_1)"]
    assert [ins.strip() for ins in k_loop(sass)] == expected


def test_in_flight_operand_writes_follows_the_wgmma_groups_around_the_back_edge():
    issue = ("HGMMA.64x128x16.F32.BF16 R24, R100, gdesc[UR4], R24",
             "HGMMA.64x128x16.F32.BF16 R24, R104, gdesc[UR8], R24, gsb0")
    decode_into_the_operand = "PRMT R101, R36, 0x4140, RZ"  # the next tile's decode writes R100-R103
    # the group stays in flight across the back edge (LE 1) while the next step writes its registers: reported
    in_flight, writes = in_flight_operand_writes([decode_into_the_operand, *issue, "WARPGROUP.DEPBAR.LE gsb0, 0x1"])
    assert in_flight == 2 and writes == [decode_into_the_operand]
    # retired before the back edge (LE 0): nothing in flight, nothing reported
    assert in_flight_operand_writes([decode_into_the_operand, *issue, "WARPGROUP.DEPBAR.LE gsb0, 0x0"]) == (0, [])
    # a 64-bit result written to R99-R100 reaches the operand too
    wide = "IMAD.WIDE R99, R2, 0x4, R4"
    assert in_flight_operand_writes([wide, *issue, "WARPGROUP.DEPBAR.LE gsb0, 0x1"])[1] == [wide]
    # a write of another register, or a store reading the operand, is no hazard
    assert in_flight_operand_writes(["PRMT R90, R36, 0x4140, RZ", "STS [R1], R101", *issue,
                                     "WARPGROUP.DEPBAR.LE gsb0, 0x1"])[1] == []
