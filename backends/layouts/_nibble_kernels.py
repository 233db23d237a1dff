"""One Triton "tiled word gather" for the layouts that move nibbles and bits (Marlin, the SM90 MXFP4 x BF16
interleave, triton_moe's split halves), with the pure-torch converters as its definition.

Why: eager torch has no op that moves 4-bit codes or single bits, so those layouts cost a byte gather plus
several full elementwise passes (4% of copy bandwidth on an H200). Each of them is a bit permutation with a
periodic tile structure: every 32-bit output word is four source bytes, at fixed (row, col) distances from a
base, assembled little-endian and bit-permuted the same way for every word; and the bases repeat over a small
[TR, TC] tile of output words, stepping by a fixed (row, col) per tile. `derive` finds all of that by running
the pure-torch function on bit-index probes of one slab (bit j of source byte p set to bit k of 8p + j, one
probe per k), checks the structure over the whole probe, and `gather_words` launches one kernel program per
block of output words, reading the checkpoint's logical tensor directly (rows and columns outside it read as
zeros, so padding and the gate/up row order cost no pass of their own).

Dispatch (`enabled`): CUDA tensors use the kernel when triton is importable; CPU and meta use the pure-torch
code. ``MOE_ORACLE_LAYOUT_KERNELS=torch`` forces the pure-torch path everywhere (debugging, bisecting);
``=triton`` forces the kernel on CPU too, which needs ``TRITON_INTERPRET=1`` set before triton is imported
(the tests do this in a subprocess). The outputs are byte-identical either way (tests/test_layout_kernels.py).

Two ways to read the checkpoint, same bytes out: ``MOE_ORACLE_LAYOUT_KERNEL_LOADS=words`` (default): when four
output words read exactly four aligned source int32 words (true of all three layouts, `WordGroups`), each int32
is loaded once (two 8-byte loads where the words pair up) and the bytes are picked in registers, with the bit
moves as immediates, and each program stores its words as contiguous runs (the kernels alone at 66-76% of copy
bandwidth on an H200); or ``=bytes``: one load per source byte (14-25%; benchmarks/README-layouts.md). A layout
or row width that does not fit whole words falls back to byte loads.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import torch

__all__ = ["ENV", "GROUP_PROGRAM", "LOADS_ENV", "RowMap", "WordGather", "WordGroups", "derive", "enabled",
           "gather_words",
           "padded_side_tensors", "plain_rows", "w13_rows"]

ENV = "MOE_ORACLE_LAYOUT_KERNELS"
_MODES = ("auto", "torch", "triton")
#: how the kernel reads the checkpoint: 'words' (whole int32 source words shared by four output words; the
#: faster on an H200) or 'bytes' (one load per source byte); same bytes out
LOADS_ENV = "MOE_ORACLE_LAYOUT_KERNEL_LOADS"
_LOADS = ("bytes", "words")


def _loads() -> str:
    loads = os.environ.get(LOADS_ENV, "words")
    if loads not in _LOADS:
        raise ValueError(f"{LOADS_ENV}={loads!r} must be one of {_LOADS} (bytes: a load per source byte; words: "
                         f"whole int32 source words)")
    return loads


#: output words per kernel program
_BLOCK_WORDS = 2048


@functools.lru_cache(maxsize=1)
def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def enabled(t: torch.Tensor) -> bool:
    """Whether the conversion of `t` runs the Triton kernel (see the module docstring)."""
    mode = os.environ.get(ENV, "auto")
    if mode not in _MODES:
        raise ValueError(f"{ENV}={mode!r} must be one of {_MODES} (auto: Triton on CUDA tensors; torch: always the "
                         f"pure-torch path; triton: the kernel on CPU too, under TRITON_INTERPRET=1)")
    if mode == "torch" or t.device.type == "meta":
        return False
    if mode == "triton":
        if not _triton_importable():
            raise RuntimeError(f"{ENV}=triton but triton is not installed; pip install triton or unset {ENV}")
        return True
    return t.device.type == "cuda" and _triton_importable()


@dataclass(frozen=True)
class RowMap:
    """Padded source rows -> checkpoint rows: padded row p in segment k = (p >= seg) has local index
    l = p - k * seg; it is checkpoint row ``l * step + offsets[k]`` when l < logical, else a zero row."""

    seg: int
    logical: int
    step: int = 1
    offsets: tuple = (0, 0)


def plain_rows(logical: int, padded: int) -> RowMap:
    """Rows kept in order, zero rows appended up to `padded`."""
    return RowMap(padded, logical)


def w13_rows(gate_up: str, order: str, inter: int, padded_inter: int) -> RowMap:
    """w13's padded rows in `order` ('checkpoint' keeps the convention, 'gate_up' = [gate; up], 'up_gate' =
    [up; gate]) from a checkpoint in convention `gate_up` with `inter` logical rows per half."""
    if order == "checkpoint":
        if gate_up == "interleaved":  # MoEWeights.pad appends zero (gate, up) pairs
            return plain_rows(2 * inter, 2 * padded_inter)
        return RowMap(padded_inter, inter, 1, (0, inter))
    gate, up = (0, 1) if gate_up == "interleaved" else (0, inter)
    step = 2 if gate_up == "interleaved" else 1
    return RowMap(padded_inter, inter, step, (gate, up) if order == "gate_up" else (up, gate))


@dataclass(frozen=True, eq=False)
class WordGather:
    """What `derive` found: table [TR * TC] int32 of base (row << 16 | col) per tile word, the (row, col)
    steps per tile row and tile column, the other three bytes' (row, col) offsets from the base, and the
    bit moves [NM, 2] int32 (mask, shift) of the assembled word: the first `left_moves` shift left, the rest
    right."""

    table: torch.Tensor
    tile: tuple
    step_r: tuple
    step_c: tuple
    deltas: tuple
    moves: torch.Tensor
    left_moves: int
    out_shape: tuple  # the probe's output block, [rows, words]
    groups: WordGroups | None = None  # set when 4 consecutive words read 4 whole source int32 words
    _copies: dict = field(default_factory=dict, repr=False)

    def packed_moves(self) -> tuple:
        """The left and the right moves as one int each, (mask | shift << 32) in 38-bit slots (kernel immediates)."""
        packed = [0, 0]
        slots = [0, 0]
        for index, (mask, shift) in enumerate(self.moves.tolist()):
            side = 0 if index < self.left_moves else 1
            packed[side] |= ((mask & 0xFFFFFFFF) | shift << 32) << (38 * slots[side])
            slots[side] += 1
        return packed[0], packed[1]

    def group_table_on(self, device: torch.device) -> torch.Tensor:
        key = f"groups:{device}"
        if key not in self._copies:
            self._copies[key] = self.groups.table.to(device)
        return self._copies[key]

    def on(self, device: torch.device) -> tuple:
        """(table, moves) on `device`, copied there once."""
        key = str(device)
        if key not in self._copies:
            self._copies[key] = (self.table.to(device), self.moves.to(device))
        return self._copies[key]


def _fail(what: str) -> None:
    raise AssertionError(f"_nibble_kernels.derive: {what}; this function is not a periodic word gather")


def derive(fn, src_shape: tuple, tile: tuple) -> WordGather:
    """The word-gather structure of `fn` (uint8 [1, R, C] -> any tensor whose bytes are a bit permutation of
    the input's) on a probe slab of ``src_shape = (R, C)``, with output word tiles of ``tile = (TR, TC)``."""
    rows, cols = src_shape
    nbytes = rows * cols
    position = torch.arange(8 * nbytes, dtype=torch.int64)
    weights = torch.arange(8, dtype=torch.int64)

    def run(bits: torch.Tensor) -> torch.Tensor:
        probe = (bits.view(nbytes, 8) << weights).sum(1).to(torch.uint8).view(1, rows, cols)
        out = fn(probe).contiguous().view(torch.uint8).reshape(-1)
        return ((out.to(torch.int64)[:, None] >> weights) & 1).reshape(-1)

    if run(torch.zeros_like(position)).any() or not run(torch.ones_like(position)).all():
        _fail("zeros or ones do not map to zeros or ones")
    source_bit = torch.zeros_like(position)
    for k in range(max(1, (8 * nbytes - 1).bit_length())):
        source_bit |= run((position >> k) & 1) << k
    if source_bit.numel() != position.numel() or not torch.equal(source_bit.sort().values, position):
        _fail("the output bits are not a permutation of the input bits")
    per_word = source_bit.view(-1, 32)
    src_byte = per_word // 8
    ordered = src_byte.sort(dim=1).values
    bytes4 = ordered[:, ::8]
    if not torch.equal(ordered, bytes4.repeat_interleave(8, dim=1)):
        _fail("an output word does not take all 8 bits of 4 source bytes")
    row, col = bytes4 // cols, bytes4 % cols
    d_row, d_col = row - row[:, :1], col - col[:, :1]
    if not (torch.equal(d_row, d_row[:1].expand_as(d_row)) and torch.equal(d_col, d_col[:1].expand_as(d_col))):
        _fail("the four source bytes of a word are not at fixed distances")
    rank = (src_byte[:, :, None] == bytes4[:, None, :]).int().argmax(dim=2)
    assembled = rank * 8 + per_word % 8  # bit of the little-endian word of the 4 bytes
    shift = torch.arange(32) - assembled
    if not torch.equal(shift, shift[:1].expand_as(shift)):
        _fail("words are bit-permuted differently")
    moves = []
    for s in sorted(set(shift[0].tolist()), key=lambda s: (s < 0, abs(s))):  # left shifts (and 0) first
        mask = sum(1 << int(a) for a, sh in zip(assembled[0].tolist(), shift[0].tolist(), strict=True) if sh == s)
        moves.append((mask - (1 << 32) if mask >= 1 << 31 else mask, abs(s)))
    left_moves = sum(1 for s in set(shift[0].tolist()) if s >= 0)
    # the block's words as [rows, words]: the caller's `tile` says how the bases repeat
    shape = fn(torch.zeros((1, rows, cols), dtype=torch.uint8)).shape
    block_rows = shape[1] if len(shape) == 3 else 1
    base_row, base_col = row[:, 0].view(block_rows, -1), col[:, 0].view(block_rows, -1)
    tr, tc = tile
    words = base_row.shape[1]
    step_r = (int(base_row[tr, 0] - base_row[0, 0]), int(base_col[tr, 0] - base_col[0, 0])) if block_rows > tr \
        else (0, 0)
    step_c = (int(base_row[0, tc] - base_row[0, 0]), int(base_col[0, tc] - base_col[0, 0])) if words > tc else (0, 0)
    r = torch.arange(block_rows)[:, None]
    c = torch.arange(words)[None, :]
    t_row, t_col = base_row[:tr, :tc], base_col[:tr, :tc]
    want_row = t_row[r % tr, c % tc] + (r // tr) * step_r[0] + (c // tc) * step_c[0]
    want_col = t_col[r % tr, c % tc] + (r // tr) * step_r[1] + (c // tc) * step_c[1]
    if not (torch.equal(want_row, base_row) and torch.equal(want_col, base_col)):
        _fail(f"the word bases do not repeat over {tile} tiles")
    if int(t_col.max()) >= 1 << 16 or int(t_row.max()) >= 1 << 15 or int(t_col.min()) < 0:
        _fail("a tile's base (row, col) does not fit the packed table")
    table = (t_row * (1 << 16) + t_col).to(torch.int32).reshape(-1).contiguous()
    deltas = tuple((int(d_row[0, b]), int(d_col[0, b])) for b in range(1, 4))
    groups = _word_groups(row.view(block_rows, words, 4), col.view(block_rows, words, 4), cols, tile, step_r, step_c)
    return WordGather(table, tile, step_r, step_c, deltas, torch.tensor(moves, dtype=torch.int32), left_moves,
                      (block_rows, words), groups)


@dataclass(frozen=True, eq=False)
class WordGroups:
    """Four consecutive output words whose 16 source bytes are four aligned source int32 words: table
    [TR * TC/4] int32 of the first word's (row << 16 | col), the other three words' (row, col) offsets, and
    `select`, 4 bits per (output word l, byte b) at bit 4 (4 l + b): source word k (low 2 bits), byte p."""

    table: torch.Tensor
    deltas: tuple
    select: int
    stride: int  # the group's words are word (q // stride) * 4 stride + q % stride + l * stride, l < 4


def _word_groups(row: torch.Tensor, col: torch.Tensor, cols: int, tile: tuple, step_r: tuple, step_c: tuple):
    """The `WordGroups` of a probe whose output word (r, c) takes byte b from (row, col)[r, c, b], or None when
    the words do not group so (then the kernel loads single bytes). Groups are 4 words `stride` apart."""
    for stride in (1, 4):
        found = _word_groups_at(row, col, cols, tile, step_r, step_c, stride)
        if found is not None:
            return found
    return None


def _word_groups_at(row, col, cols: int, tile: tuple, step_r: tuple, step_c: tuple, stride: int):
    block_rows, words, _ = row.shape
    tr, tc = tile
    if words % (4 * stride) or tc % (4 * stride) or cols % 4:
        return None

    def grouped(t):  # [rows, words, 4 bytes] -> [rows, groups, 16 = (l, b)], group q = outer * stride + g
        t = t.view(block_rows, words // (4 * stride), 4, stride, 4).permute(0, 1, 3, 2, 4)
        return t.reshape(block_rows, words // 4, 16)

    g_row, g_col = grouped(row), grouped(col)
    word_id = g_row * cols + (g_col & ~3)
    distinct = word_id.sort(dim=2).values
    firsts = torch.cat([torch.ones_like(distinct[..., :1], dtype=torch.bool), distinct[..., 1:] != distinct[..., :-1]],
                       dim=2)
    if not torch.equal(firsts.sum(dim=2), torch.full_like(firsts.sum(dim=2), 4)):
        return None
    ids = distinct[firsts].view(block_rows, words // 4, 4)
    w_row, w_col = ids // cols, ids % cols
    o_row, o_col = w_row - w_row[..., :1], w_col - w_col[..., :1]
    if not (torch.equal(o_row, o_row[:1, :1].expand_as(o_row)) and torch.equal(o_col, o_col[:1, :1].expand_as(o_col))):
        return None
    k = (word_id[..., :, None] == ids[..., None, :]).int().argmax(dim=3)
    selector = k + 4 * (g_col & 3)
    if not torch.equal(selector, selector[:1, :1].expand_as(selector)):
        return None
    base_row, base_col = w_row[..., 0], w_col[..., 0]
    gc = tc // 4
    r = torch.arange(block_rows)[:, None]
    c = torch.arange(words // 4)[None, :]
    t_row, t_col = base_row[:tr, :gc], base_col[:tr, :gc]
    want_row = t_row[r % tr, c % gc] + (r // tr) * step_r[0] + (c // gc) * step_c[0]
    want_col = t_col[r % tr, c % gc] + (r // tr) * step_r[1] + (c // gc) * step_c[1]
    if not (torch.equal(want_row, base_row) and torch.equal(want_col, base_col)):
        return None
    select = sum(int(v) << (4 * i) for i, v in enumerate(selector[0, 0].tolist()))
    table = (t_row * (1 << 16) + t_col).to(torch.int32).reshape(-1).contiguous()
    deltas = tuple((int(o_row[0, 0, i]), int(o_col[0, 0, i])) for i in range(1, 4))
    return WordGroups(table, deltas, select, stride)


#: the grouped kernel's program: groups (4 output words each) per program and warps; per-layout block shapes
#: follow from the work order (benchmarks/README-layouts.md)
GROUP_PROGRAM = {"groups": 512, "warps": 4, "rows_fastest_rows": 32}


def _fitting_block(n: int, cap: int) -> int:
    """The largest power of two <= cap whose multiple covers n with <= 7% waste, else the least wasteful."""
    options = [1 << k for k in range(max(0, cap.bit_length() - 1), -1, -1)]
    options = [b for b in options if b <= max(1, 1 << max(0, (n - 1).bit_length()))] or [1]
    fitting = [b for b in options if -(-n // b) * b <= 1.07 * n]
    return fitting[0] if fitting else min(options, key=lambda b: (-(-n // b) * b, -b))


def _pairs(spec: WordGather, src: torch.Tensor, slab_src: tuple) -> bool:
    """Whether the grouped kernel can read each group's source words 0, 1 and 2, 3 as two 8-byte loads."""
    g = spec.groups
    (g1r, g1c), (g2r, g2c), (g3r, g3c) = g.deltas
    cols = [int(c) for c in (g.table & 0xFFFF).tolist()] + [g2c, spec.step_r[1], spec.step_c[1], slab_src[1]]
    return ((g1r, g1c) == (0, 4) and (g3r, g3c) == (g2r, g2c + 4) and all(c % 8 == 0 for c in cols)
            and src.shape[-1] % 8 == 0 and src.data_ptr() % 8 == 0)


def _rows_fastest(spec: WordGather, cols: int) -> bool:
    """Whether consecutive output rows read closer source bytes than consecutive groups (Marlin: 8 bytes apart
    versus 16 source rows), which decides the order of the program's threads."""
    table = spec.groups.table.tolist()
    if spec.tile[0] != 1 or len(table) < 2:
        return False
    row_step = abs(spec.step_r[0] * cols + spec.step_r[1])
    group_step = abs(((table[1] >> 16) - (table[0] >> 16)) * cols + (table[1] & 0xFFFF) - (table[0] & 0xFFFF))
    return 0 < row_step < group_step


def _gather_groups(spec, src, words, n_slabs, slab_src, dst_slab_stride, dst_row_stride, block, rows,
                   logical_cols) -> None:
    from backends.layouts._nibble_triton import gather_groups_kernel

    groups = spec.groups
    group_table = spec.group_table_on(src.device)
    block_rows, n_groups = block[0], block[1] // 4
    per_program = GROUP_PROGRAM["groups"]
    if _rows_fastest(spec, src.shape[-1]):
        br = _fitting_block(block_rows, GROUP_PROGRAM["rows_fastest_rows"])
        bg = max(groups.stride, _fitting_block(n_groups, max(1, per_program // br)))
        rows_fastest = True
    else:
        bg = max(groups.stride, _fitting_block(n_groups, min(64, per_program)))
        br = _fitting_block(block_rows, max(1, per_program // bg))
        rows_fastest = False
    pairs = _pairs(spec, src, slab_src)
    unit = 8 if pairs else 4
    (g1r, g1c), (g2r, g2c), (g3r, g3c) = groups.deltas
    left, right = spec.packed_moves()
    gather_groups_kernel[(src.shape[0] * n_slabs, -(-block_rows // br), -(-n_groups // bg))](
        src.view(torch.int64 if pairs else torch.int32), words, group_table,
        n_slabs, src[0].numel() // unit, src.shape[-1] // unit, slab_src[0], slab_src[1],
        rows.seg, rows.logical, rows.step, rows.offsets[0], rows.offsets[1], logical_cols,
        words[0].numel(), dst_slab_stride, dst_row_stride, block_rows, n_groups,
        spec.step_r[0], spec.step_r[1], spec.step_c[0], spec.step_c[1],
        TR=spec.tile[0], TG=spec.tile[1] // 4, NL=spec.left_moves, NR=spec.moves.shape[0] - spec.left_moves,
        LEFT=left, RIGHT=right,
        G1R=g1r, G1C=g1c, G2R=g2r, G2C=g2c, G3R=g3r, G3C=g3c, SELECT=groups.select, STRIDE=groups.stride,
        PAIRS=pairs, ROWS_FASTEST=rows_fastest, BR=br, BG=bg, num_warps=GROUP_PROGRAM["warps"])


def gather_words(spec: WordGather, src: torch.Tensor, out: torch.Tensor, *, n_slabs: int, slab_src: tuple,
                 dst_slab_stride: int, dst_row_stride: int, block: tuple, rows: RowMap, logical_cols: int) -> None:
    """Write `out` (any dtype; [E, ...] contiguous, its bytes read as int32 words) from the checkpoint tensor
    `src` [E, R, C] uint8 through `spec`: slab s of expert e writes the [block rows, block words] block at
    word offset ``e * out[0].numel_words + s * dst_slab_stride`` (rows `dst_row_stride` words apart), reading
    padded source rows/cols shifted by ``s * slab_src``."""
    experts = src.shape[0]
    if experts == 0 or out.numel() == 0:
        return
    from backends.layouts._nibble_triton import gather_words_kernel

    src = src.contiguous()
    words = out.view(torch.uint8).view(torch.int32) if out.dtype != torch.int32 else out
    table, moves = spec.on(src.device)
    block_rows, block_cols = block
    if spec.groups is not None and _loads() == "words" and src.shape[-1] % 4 == 0 and \
            (block_cols // 4) % spec.groups.stride == 0:
        _gather_groups(spec, src, words, n_slabs, slab_src, dst_slab_stride, dst_row_stride, block, rows,
                       logical_cols)
        return
    bc = min(128, 1 << max(0, (block_cols - 1).bit_length()))
    br = max(1, min(_BLOCK_WORDS // bc, 1 << max(0, (block_rows - 1).bit_length())))
    grid = (experts * n_slabs, -(-block_rows // br), -(-block_cols // bc))
    (d1r, d1c), (d2r, d2c), (d3r, d3c) = spec.deltas
    gather_words_kernel[grid](
        src, words, table, moves,
        n_slabs, src[0].numel(), src.shape[-1], slab_src[0], slab_src[1],
        rows.seg, rows.logical, rows.step, rows.offsets[0], rows.offsets[1], logical_cols,
        words[0].numel(), dst_slab_stride, dst_row_stride, block_rows, block_cols,
        spec.step_r[0], spec.step_r[1], spec.step_c[0], spec.step_c[1],
        TR=spec.tile[0], TC=spec.tile[1], NL=spec.left_moves, NR=spec.moves.shape[0] - spec.left_moves,
        D1R=d1r, D1C=d1c, D2R=d2r, D2C=d2c, D3R=d3r, D3C=d3c, BR=br, BC=bc, num_warps=8)


def scale_words(src: torch.Tensor, rows: RowMap, out_rows: int, chunks: int) -> torch.Tensor:
    """triton_moe's scale words: [E, R, G] uint8 checkpoint scale bytes -> [E, chunks, out_rows] int32, word
    (c, r) = padded bytes (r, 4c .. 4c + 3) with rows through `rows` and zero padding, in one pass (the
    definition is triton_moe._to_words of the padded scales)."""
    from backends.layouts._nibble_triton import scale_words_kernel

    src = src.contiguous()
    experts = src.shape[0]
    out = src.new_empty((experts, chunks, out_rows), dtype=torch.int32)
    if experts == 0 or out.numel() == 0:
        return out
    bc = min(32, 1 << max(0, (chunks - 1).bit_length()))
    br = 128
    grid = (experts, -(-out_rows // br), -(-chunks // bc))
    scale_words_kernel[grid](src, out, src[0].numel(), src.shape[-1], rows.seg, rows.logical, rows.step,
                             rows.offsets[0], rows.offsets[1], src.shape[-1], out_rows, chunks, out[0].numel(),
                             BC=bc, BR=br, num_warps=4)
    return out


def padded_side_tensors(w, hidden: int, inter: int, order: str, *, scales: bool = True) -> dict:
    """The block scales and biases of ``w.pad(hidden, inter)``, w13's rows in `order` ('checkpoint', 'gate_up'
    or 'up_gate'), without padding the weights (the kernel reads those unpadded): one strided copy each
    (`scales=False`: the biases only, the scales None)."""
    from backends.layouts.gate_up import gate_up_runs, rows_runs
    from backends.layouts.placement import RowCol, build

    def w13_runs(t):
        if order == "checkpoint":
            if w.gate_up == "interleaved":
                return rows_runs(t, 2 * inter)
            return gate_up_runs(t, "contiguous", "contiguous", inter)
        return gate_up_runs(t, w.gate_up, "contiguous" if order == "gate_up" else "up_gate", inter)

    def vector(out):
        return RowCol.plain(out[..., None])

    e, block = w.E, w.block_size
    side = {"w13_scale": None, "w2_scale": None, "w13_bias": None, "w2_bias": None}
    if scales:
        side["w13_scale"] = build(w.w13_scale, (e, 2 * inter, hidden // block), RowCol.plain,
                                  w13_runs(w.w13_scale), w.H // block)
        side["w2_scale"] = build(w.w2_scale, (e, hidden, inter // block), RowCol.plain,
                                 rows_runs(w.w2_scale, hidden), w.I // block)
    if w.w13_bias is not None:
        side["w13_bias"] = build(w.w13_bias, (e, 2 * inter), vector, w13_runs(w.w13_bias), 1)
    if w.w2_bias is not None:
        side["w2_bias"] = build(w.w2_bias, (e, hidden), vector, rows_runs(w.w2_bias, hidden), 1)
    return side
