"""Write a layout's tensor in one pass: padding, row order and tile permutation folded into strided copies.

A layout's tensor is the checkpoint matrix padded (rows and columns, zeros), rows reordered (gate/up
order) and tiled (epilogue shuffle, 128x4 interleave, ...). Done as separate passes (pad, gather,
tile permute) it moves the layer two or three times. Every one of those steps is a permutation of
mixed-radix digits of the row and column index, so the output buffer can be *viewed* in the
checkpoint's coordinates (`RowCol`: its dims are [E, row digits..., column digits...], each digit
a dim of the right stride), and each run of source rows copied into its slot of that view once,
as the widest machine words the strides allow. Only the padding is written besides (zeros), never
the whole buffer.

A run of source rows lands on a range of the view's row index (mixed radix, outer digit first),
after fixing some row digits (`Run.select`, e.g. the gate/up digit of an interleaved order). A
range that does not start or stop on a digit boundary is split into boxes, each one strided copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["RowCol", "Run", "boxes", "build", "copy_words", "pad_matrix", "place"]


def boxes(start: int, stop: int, radices: tuple) -> list:
    """[start, stop) of a mixed-radix index (outer digit first) as boxes ``(prefix, lo, hi)``.

    A box fixes the outer digits to ``prefix``, runs digit ``len(prefix)`` over [lo, hi) and every
    inner digit in full; the boxes are disjoint, in increasing order, and cover the range exactly.
    """
    if start >= stop:
        return []
    if len(radices) == 1:
        return [((), start, stop)]
    inner = math.prod(radices[1:])
    first, last = start // inner, (stop - 1) // inner
    if first == last:
        return [((first, *p), lo, hi) for p, lo, hi in boxes(start - first * inner, stop - first * inner, radices[1:])]
    head, tail = [], []
    full_lo, full_hi = first, last + 1
    if start % inner:
        head = [((first, *p), lo, hi) for p, lo, hi in boxes(start % inner, inner, radices[1:])]
        full_lo += 1
    if stop % inner:
        tail = [((last, *p), lo, hi) for p, lo, hi in boxes(0, stop % inner, radices[1:])]
        full_hi -= 1
    full = [((), full_lo, full_hi)] if full_lo < full_hi else []
    return head + full + tail


def _box_start(prefix: tuple, lo: int, radices: tuple) -> int:
    index = 0
    for level, radix in enumerate(radices):
        digit = prefix[level] if level < len(prefix) else (lo if level == len(prefix) else 0)
        index = index * radix + digit
    return index


def _box_shape(prefix: tuple, lo: int, hi: int, radices: tuple) -> tuple:
    return (1,) * len(prefix) + (hi - lo,) + tuple(radices[len(prefix) + 1:])


def _narrow(t: torch.Tensor, first_dim: int, prefix: tuple, lo: int, hi: int) -> torch.Tensor:
    for level, digit in enumerate(prefix):
        t = t.narrow(first_dim + level, digit, 1)
    return t.narrow(first_dim + len(prefix), lo, hi - lo)


#: word dtypes tried from the widest; a copy moves the same bytes as any of them. complex128 is only a
#: 16-byte carrier here: copy_ and zero_ move its bits as they are (no arithmetic touches them)
_WORDS = (torch.complex128, torch.int64, torch.int32, torch.int16)


def _as_words(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """t's bytes as `dtype` words (a view), or None when t's strides do not allow it."""
    ratio = torch.empty((), dtype=dtype).element_size() // t.element_size()
    if ratio <= 1 or t.dim() == 0 or t.stride(-1) != 1 or t.shape[-1] % ratio or t.storage_offset() % ratio:
        return None
    if any(stride % ratio for size, stride in zip(t.shape[:-1], t.stride()[:-1], strict=True) if size > 1):
        return None
    try:
        return t.view(dtype)
    except RuntimeError:
        return None


def copy_words(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst.copy_(src) (same shape), moved as the widest words both tensors' strides allow when the dtypes agree."""
    if dst.dtype == src.dtype and dst.numel():
        for dtype in _WORDS:
            wide_dst, wide_src = _as_words(dst, dtype), _as_words(src, dtype)
            if wide_dst is not None and wide_src is not None:
                wide_dst.copy_(wide_src)
                return
    dst.copy_(src)


def _zero(t: torch.Tensor) -> None:
    if t.numel():
        for dtype in _WORDS:
            wide = _as_words(t, dtype)
            if wide is not None:
                wide.zero_()
                return
        t.zero_()


@dataclass(frozen=True)
class RowCol:
    """An output buffer viewed in checkpoint coordinates: ``view`` is [E, *row digits, *column digits]."""

    view: torch.Tensor
    row_dims: int  # how many dims after E are row digits; the rest are column digits

    @classmethod
    def of(cls, out: torch.Tensor, sizes: tuple, dims: tuple, row_dims: int) -> RowCol:
        """`out` viewed as [E, *sizes] (its memory order), dims after E permuted by `dims`; the first
        `row_dims` of them are the row digits (outer first), the rest the column digits."""
        return cls(out.view(out.shape[0], *sizes).permute(0, *(1 + d for d in dims)), row_dims)

    @classmethod
    def plain(cls, out: torch.Tensor) -> RowCol:
        """A row-major [E, R, C] buffer: one row digit, one column digit."""
        return cls(out, 1)

    def split(self, digit: int, sizes: tuple) -> RowCol:
        """Row digit `digit` as several digits (outer first) of the given sizes."""
        return RowCol(self.view.unflatten(1 + digit, sizes), self.row_dims + len(sizes) - 1)

    def order(self, digits: tuple) -> RowCol:
        """Row digits reordered: new digit j is old digit digits[j] (the row index reads them outer first)."""
        perm = (0, *(1 + d for d in digits), *range(1 + self.row_dims, self.view.dim()))
        return RowCol(self.view.permute(perm), self.row_dims)


@dataclass(frozen=True)
class Run:
    """Source rows ``src`` [E, n, C] written to rows [start, start + n) of the view, after fixing `select`
    ((row digit, value) pairs; digits counted from the first row digit, negative from the last), or zeros
    in ``rows`` rows when src is None."""

    start: int
    src: torch.Tensor | None = None
    rows: int = 0
    select: tuple = ()


def place(rc: RowCol, runs: list, cols: int) -> None:
    """Copy every run into `rc.view`; zero the view's columns >= `cols` of those rows, and the zero runs.

    Every position of the view must be covered by exactly one run (data or zeros): that is how the
    layout's padding is written without a memset of the whole buffer.
    """
    view = rc.view
    col_radices = tuple(view.shape[1 + rc.row_dims:])
    col_boxes = boxes(0, cols, col_radices)
    pad_boxes = boxes(cols, math.prod(col_radices), col_radices)
    for run in runs:
        target = view
        selected = sorted(((dim if dim >= 0 else rc.row_dims + dim), value) for dim, value in run.select)
        for dim, value in reversed(selected):  # the last digit first, so the earlier dims keep their place
            target = target.select(1 + dim, value)
        n_rows = run.rows if run.src is None else run.src.shape[1]
        radices = tuple(target.shape[1:1 + rc.row_dims - len(selected)])
        col_dim = 1 + len(radices)
        for prefix, lo, hi in boxes(run.start, run.start + n_rows, radices):
            rows = _narrow(target, 1, prefix, lo, hi)
            if run.src is None:
                _zero(rows)
                continue
            offset = _box_start(prefix, lo, radices) - run.start
            shape = _box_shape(prefix, lo, hi, radices)
            src_rows = run.src.narrow(1, offset, math.prod(shape))
            src_rows = src_rows.view(src_rows.shape[0], *shape, src_rows.shape[-1])
            for c_prefix, c_lo, c_hi in col_boxes:
                c_offset = _box_start(c_prefix, c_lo, col_radices)
                c_shape = _box_shape(c_prefix, c_lo, c_hi, col_radices)
                piece = src_rows.narrow(-1, c_offset, math.prod(c_shape))
                copy_words(_narrow(rows, col_dim, c_prefix, c_lo, c_hi), piece.view(*piece.shape[:-1], *c_shape))
            for c_prefix, c_lo, c_hi in pad_boxes:
                _zero(_narrow(rows, col_dim, c_prefix, c_lo, c_hi))


def build(like: torch.Tensor, shape: tuple, view, runs, cols: int, dtype: torch.dtype | None = None):
    """A new buffer of `shape` (like's device, `dtype` or like's), written by `place(view(buffer), runs, cols)`.

    `runs` may be a function of the [E, R, C] source `like` instead: then, when `cols` does not fill the
    view's innermost column digit (MXFP4 scale rows of 90 bytes into 4-byte 128x4 columns), the source's
    rows are first padded to whole digits (one small contiguous pass), so that the permuting copy moves
    aligned 4-byte words rather than 2-byte ones, which runs several times faster on a GPU.
    """
    out = like.new_empty(shape, dtype=like.dtype if dtype is None else dtype)
    rc = view(out)
    if callable(runs):
        inner = rc.view.shape[-1] if rc.view.dim() > 1 + rc.row_dims else 1
        if inner > 1 and cols % inner and like.dim() == 3:
            aligned = -(-cols // inner) * inner
            like, cols = pad_matrix(like, like.shape[1], aligned), aligned
        runs = runs(like)
    place(rc, runs, cols)
    return out


def pad_matrix(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """[E, R, C] zero-padded to [E, rows, cols] in one pass; t itself (no copy) when nothing is padded."""
    if tuple(t.shape[1:]) == (rows, cols):
        return t
    runs = [Run(0, t), Run(t.shape[1], rows=rows - t.shape[1])]
    return build(t, (t.shape[0], rows, cols), RowCol.plain, runs, t.shape[-1])
