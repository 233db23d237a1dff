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
def _source_row(prow, pcol, ok, seg, logical_rows, row_step, row_off0, row_off1, logical_cols):
    """The row map (`_nibble_kernels.RowMap`), one place for the three loads below: (checkpoint row, valid) of
    padded (row, col). Padded rows [k*seg, k*seg + logical_rows) of segment k come from checkpoint rows
    local * row_step + row_off_k; valid is False in the padding (and where not ok), where the loads read 0."""
    upper = prow >= seg
    local = prow - tl.where(upper, seg, 0)
    row = local * row_step + tl.where(upper, row_off1, row_off0)
    return row, ok & (local < logical_rows) & (pcol < logical_cols)


@triton.jit
def _source_byte(src_ptr, expert_base, prow, pcol, ok, src_row_stride, seg, logical_rows, row_step, row_off0,
                 row_off1, logical_cols):
    """The checkpoint byte at padded (row, col), 0 in the padding."""
    row, valid = _source_row(prow, pcol, ok, seg, logical_rows, row_step, row_off0, row_off1, logical_cols)
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


# ------------------------------------------------------------------------------------------------------------------
# The same gather with whole int32 source loads: four output words (`STRIDE` apart) read four aligned source words
# and pick their bytes by the constexpr SELECT (4 bits per (word l, byte b): source word k, byte p), so each
# source byte is loaded once, as part of a 4-byte word, instead of once per byte.

@triton.jit
def _source_word(src_ptr, expert_base, prow, pcol, ok, src_row_words, seg, logical_rows, row_step, row_off0,
                 row_off1, logical_cols):
    row, valid = _source_row(prow, pcol, ok, seg, logical_rows, row_step, row_off0, row_off1, logical_cols)
    value = tl.load(src_ptr + expert_base + row * src_row_words + (pcol >> 2), mask=valid, other=0)
    return value.to(tl.uint32, bitcast=True)


@triton.jit
def _byte_of(s0, s1, s2, s3, SEL: tl.constexpr):
    if (SEL & 3) == 0:
        word = s0
    elif (SEL & 3) == 1:
        word = s1
    elif (SEL & 3) == 2:
        word = s2
    else:
        word = s3
    return (word >> (8 * (SEL >> 2))) & 0xFF


@triton.jit
def _assembled(s0, s1, s2, s3, SELECT: tl.constexpr, L: tl.constexpr):
    word = _byte_of(s0, s1, s2, s3, (SELECT >> (16 * L)) & 15)
    word |= _byte_of(s0, s1, s2, s3, (SELECT >> (16 * L + 4)) & 15) << 8
    word |= _byte_of(s0, s1, s2, s3, (SELECT >> (16 * L + 8)) & 15) << 16
    word |= _byte_of(s0, s1, s2, s3, (SELECT >> (16 * L + 12)) & 15) << 24
    return word


@triton.jit
def _permuted(word, LEFT: tl.constexpr, RIGHT: tl.constexpr, NL: tl.constexpr, NR: tl.constexpr):
    """The bit moves as immediates: LEFT / RIGHT pack (mask, shift) per move in 38-bit slots."""
    out = tl.zeros_like(word)
    for m in tl.static_range(NL):
        out |= (word & ((LEFT >> (38 * m)) & 0xFFFFFFFF)) << ((LEFT >> (38 * m + 32)) & 63)
    for m in tl.static_range(NR):
        out |= (word & ((RIGHT >> (38 * m)) & 0xFFFFFFFF)) >> ((RIGHT >> (38 * m + 32)) & 63)
    return out


@triton.jit
def _source_pair(src_ptr, expert_base, prow, pcol, ok, src_row_pairs, seg, logical_rows, row_step, row_off0,
                 row_off1, logical_cols):
    """The 8 source bytes at padded (row, col), col % 8 == 0, as (low int32 word, high int32 word)."""
    row, valid = _source_row(prow, pcol, ok, seg, logical_rows, row_step, row_off0, row_off1, logical_cols)
    value = tl.load(src_ptr + expert_base + row * src_row_pairs + (pcol >> 3), mask=valid, other=0)
    value = value.to(tl.uint64, bitcast=True)
    return (value & 0xFFFFFFFF).to(tl.uint32), (value >> 32).to(tl.uint32)


@triton.jit
def gather_groups_kernel(src_ptr, dst_ptr, table_ptr,
                         n_slabs, src_expert_words, src_row_words, slab_src_rows, slab_src_cols,
                         seg, logical_rows, row_step, row_off0, row_off1, logical_cols,
                         dst_expert_stride, dst_slab_stride, dst_row_stride, block_rows, block_groups,
                         step_r_row, step_r_col, step_c_row, step_c_col,
                         TR: tl.constexpr, TG: tl.constexpr, NL: tl.constexpr, NR: tl.constexpr,
                         LEFT: tl.constexpr, RIGHT: tl.constexpr,
                         G1R: tl.constexpr, G1C: tl.constexpr, G2R: tl.constexpr, G2C: tl.constexpr,
                         G3R: tl.constexpr, G3C: tl.constexpr, SELECT: tl.constexpr, STRIDE: tl.constexpr,
                         PAIRS: tl.constexpr, ROWS_FASTEST: tl.constexpr, BR: tl.constexpr, BG: tl.constexpr):
    """PAIRS: source words 0, 1 and 2, 3 are 8 contiguous bytes each (one 64-bit load per pair; src_ptr is then
    int64 and the strides count pairs). ROWS_FASTEST: consecutive threads take consecutive output rows (the
    order in which Marlin's source bytes are contiguous), else consecutive groups. Each program stores its
    [BR, 4 BG] output words as one contiguous run per row."""
    slab = tl.program_id(0)
    expert = slab // n_slabs
    s = slab % n_slabs
    r1 = tl.program_id(1) * BR + tl.arange(0, BR)
    q1 = tl.program_id(2) * BG + tl.arange(0, BG)
    if ROWS_FASTEST:  # work tensors are [BG, BR]
        r = r1[None, :]
        q = q1[:, None]
    else:  # [BR, BG]
        r = r1[:, None]
        q = q1[None, :]
    ok = (r < block_rows) & (q < block_groups)
    packed = tl.load(table_ptr + (r % TR) * TG + q % TG)
    prow = (packed >> 16) + s * slab_src_rows + (r // TR) * step_r_row + (q // TG) * step_c_row
    pcol = (packed & 0xFFFF) + s * slab_src_cols + (r // TR) * step_r_col + (q // TG) * step_c_col
    base = expert.to(tl.int64) * src_expert_words
    if PAIRS:
        s0, s1 = _source_pair(src_ptr, base, prow, pcol, ok, src_row_words, seg, logical_rows, row_step, row_off0,
                              row_off1, logical_cols)
        s2, s3 = _source_pair(src_ptr, base, prow + G2R, pcol + G2C, ok, src_row_words, seg, logical_rows,
                              row_step, row_off0, row_off1, logical_cols)
    else:
        s0 = _source_word(src_ptr, base, prow, pcol, ok, src_row_words, seg, logical_rows, row_step, row_off0,
                          row_off1, logical_cols)
        s1 = _source_word(src_ptr, base, prow + G1R, pcol + G1C, ok, src_row_words, seg, logical_rows, row_step,
                          row_off0, row_off1, logical_cols)
        s2 = _source_word(src_ptr, base, prow + G2R, pcol + G2C, ok, src_row_words, seg, logical_rows, row_step,
                          row_off0, row_off1, logical_cols)
        s3 = _source_word(src_ptr, base, prow + G3R, pcol + G3C, ok, src_row_words, seg, logical_rows, row_step,
                          row_off0, row_off1, logical_cols)
    o0 = _permuted(_assembled(s0, s1, s2, s3, SELECT, 0), LEFT, RIGHT, NL, NR)
    o1 = _permuted(_assembled(s0, s1, s2, s3, SELECT, 1), LEFT, RIGHT, NL, NR)
    o2 = _permuted(_assembled(s0, s1, s2, s3, SELECT, 2), LEFT, RIGHT, NL, NR)
    o3 = _permuted(_assembled(s0, s1, s2, s3, SELECT, 3), LEFT, RIGHT, NL, NR)
    if ROWS_FASTEST:
        o0 = tl.trans(o0)
        o1 = tl.trans(o1)
        o2 = tl.trans(o2)
        o3 = tl.trans(o3)
    # [BR, BG, (k, m)] = word l = 2 k + m of group q; group q's word l is output word
    # (q // STRIDE) * 4 STRIDE + l * STRIDE + q % STRIDE, so the program's words are 4 BG contiguous ones per row
    out = tl.reshape(tl.join(tl.join(o0, o2), tl.join(o1, o3)), (BR, BG, 4))
    if STRIDE != 1:
        out = tl.reshape(tl.permute(tl.reshape(out, (BR, BG // STRIDE, STRIDE, 4)), (0, 1, 3, 2)), (BR, BG, 4))
    out = tl.reshape(out, (BR, 4 * BG))
    word = tl.program_id(2) * (4 * BG) + tl.arange(0, 4 * BG)
    dst = dst_ptr + expert.to(tl.int64) * dst_expert_stride + s.to(tl.int64) * dst_slab_stride
    mask = (r1 < block_rows)[:, None] & (word < 4 * block_groups)[None, :]
    tl.store(dst + (r1 * dst_row_stride)[:, None] + word[None, :], out.to(tl.int32, bitcast=True), mask=mask)


# ------------------------------------------------------------------------------------------------------------------
# Marlin's block scales: [E, N, G] bytes -> [E, G, N], the columns of every 64 gathered by PERM (64 source rows per
# output position), each byte mapped through the 256-entry LUT when USE_LUT (NVFP4's E4M3 -> S0E5M3), and the
# largest source byte of each program stored in worst_ptr (the signed/NaN-scale check, one pass with the copy).

@triton.jit
def permute_scales_kernel(src_ptr, dst_ptr, perm_ptr, lut_ptr, worst_ptr, n, groups,
                          USE_LUT: tl.constexpr, BN: tl.constexpr, BGR: tl.constexpr):
    e = tl.program_id(0)
    p = tl.program_id(1) * BN + tl.arange(0, BN)
    g = tl.program_id(2) * BGR + tl.arange(0, BGR)
    source_row = p - p % 64 + tl.load(perm_ptr + p % 64)
    mask = (g < groups)[:, None] & (p < n)[None, :]
    base = e.to(tl.int64) * n * groups
    value = tl.load(src_ptr + base + (source_row * groups)[None, :] + g[:, None], mask=mask, other=0)
    if USE_LUT:
        worst = tl.max(tl.max(value.to(tl.int32), axis=1), axis=0)
        program = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2) + tl.program_id(2)
        tl.store(worst_ptr + program, worst)
        value = tl.load(lut_ptr + value.to(tl.int32), mask=mask, other=0)
    tl.store(dst_ptr + base + (g * n)[:, None] + p[None, :], value, mask=mask)


@triton.jit
def scale_words_kernel(src_ptr, dst_ptr, src_expert_stride, src_row_stride, seg, logical_rows, row_step, row_off0,
                       row_off1, logical_cols, rows, chunks, dst_expert_stride, BC: tl.constexpr, BR: tl.constexpr):
    """dst[e, c, r] (int32) = the padded scale bytes (r, 4c .. 4c + 3), little-endian: the transposed word
    buffer of triton_moe's layout in one pass (rows through the row map, zeros in the padding), whatever the
    row pitch (gpt-oss's 90-byte MXFP4 scale rows are no whole words); stores run along r."""
    expert = tl.program_id(0)
    r = (tl.program_id(1) * BR + tl.arange(0, BR))[None, :]
    c = (tl.program_id(2) * BC + tl.arange(0, BC))[:, None]
    ok = (c < chunks) & (r < rows)
    base = expert.to(tl.int64) * src_expert_stride
    word = _source_byte(src_ptr, base, r, 4 * c, ok, src_row_stride, seg, logical_rows, row_step, row_off0,
                        row_off1, logical_cols)
    for b in tl.static_range(1, 4):
        byte = _source_byte(src_ptr, base, r, 4 * c + b, ok, src_row_stride, seg, logical_rows, row_step,
                            row_off0, row_off1, logical_cols)
        word = word | (byte << (8 * b))
    dst = dst_ptr + expert.to(tl.int64) * dst_expert_stride + c * rows + r
    tl.store(dst, word.to(tl.int32, bitcast=True), mask=ok)
