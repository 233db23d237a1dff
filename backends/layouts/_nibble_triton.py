"""The Triton kernel behind `_nibble_kernels` (imported only when that fast path runs, so importing the
layouts never imports triton). One program writes a [BR, BC] block of 32-bit output words; each word is
four source bytes (found through a small periodic table, zero outside the checkpoint's logical rows and
columns, which is how padding is written) assembled little-endian and bit-permuted by NL + NR (mask, shift)
moves (left shifts first).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _source_byte(src_ptr, expert_base, prow, pcol, ok, src_row_stride, seg, logical_rows, row_step, row_off0,
                 row_off1, logical_cols):
    """The checkpoint byte at padded (row, col), 0 in the padding: padded rows [k*seg, k*seg + logical_rows)
    of segment k come from checkpoint rows local * row_step + row_off_k."""
    upper = prow >= seg
    local = prow - tl.where(upper, seg, 0)
    row = local * row_step + tl.where(upper, row_off1, row_off0)
    valid = ok & (local < logical_rows) & (pcol < logical_cols)
    value = tl.load(src_ptr + expert_base + row * src_row_stride + pcol, mask=valid, other=0)
    return value.to(tl.uint32)


@triton.jit
def gather_words_kernel(src_ptr, dst_ptr, table_ptr, moves_ptr,
                        n_slabs, src_expert_stride, src_row_stride, slab_src_rows, slab_src_cols,
                        seg, logical_rows, row_step, row_off0, row_off1, logical_cols,
                        dst_expert_stride, dst_slab_stride, dst_row_stride, block_rows, block_cols,
                        step_r_row, step_r_col, step_c_row, step_c_col,
                        TR: tl.constexpr, TC: tl.constexpr, NL: tl.constexpr, NR: tl.constexpr,
                        D1R: tl.constexpr, D1C: tl.constexpr, D2R: tl.constexpr, D2C: tl.constexpr,
                        D3R: tl.constexpr, D3C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    slab = tl.program_id(0)
    expert = slab // n_slabs
    s = slab % n_slabs
    r = tl.program_id(1) * BR + tl.arange(0, BR)
    c = tl.program_id(2) * BC + tl.arange(0, BC)
    ok = (r < block_rows)[:, None] & (c < block_cols)[None, :]
    packed = tl.load(table_ptr + ((r % TR) * TC)[:, None] + (c % TC)[None, :])
    prow = (packed >> 16) + s * slab_src_rows + ((r // TR) * step_r_row)[:, None] + ((c // TC) * step_c_row)[None, :]
    pcol = (packed & 0xFFFF) + s * slab_src_cols + ((r // TR) * step_r_col)[:, None] + ((c // TC) * step_c_col)[None, :]
    base = expert.to(tl.int64) * src_expert_stride
    word = _source_byte(src_ptr, base, prow, pcol, ok, src_row_stride, seg, logical_rows, row_step, row_off0,
                        row_off1, logical_cols)
    word |= _source_byte(src_ptr, base, prow + D1R, pcol + D1C, ok, src_row_stride, seg, logical_rows, row_step,
                         row_off0, row_off1, logical_cols) << 8
    word |= _source_byte(src_ptr, base, prow + D2R, pcol + D2C, ok, src_row_stride, seg, logical_rows, row_step,
                         row_off0, row_off1, logical_cols) << 16
    word |= _source_byte(src_ptr, base, prow + D3R, pcol + D3C, ok, src_row_stride, seg, logical_rows, row_step,
                         row_off0, row_off1, logical_cols) << 24
    out = tl.zeros((BR, BC), dtype=tl.uint32)
    for m in tl.static_range(NL):  # moves to higher bits, then to lower bits: one shift each
        mask = tl.load(moves_ptr + 2 * m).to(tl.uint32, bitcast=True)
        out |= (word & mask) << tl.load(moves_ptr + 2 * m + 1).to(tl.uint32)
    for m in tl.static_range(NL, NL + NR):
        mask = tl.load(moves_ptr + 2 * m).to(tl.uint32, bitcast=True)
        out |= (word & mask) >> tl.load(moves_ptr + 2 * m + 1).to(tl.uint32)
    dst = expert.to(tl.int64) * dst_expert_stride + s.to(tl.int64) * dst_slab_stride
    offsets = (r * dst_row_stride)[:, None] + c[None, :]
    tl.store(dst_ptr + dst + offsets, out.to(tl.int32, bitcast=True), mask=ok)
