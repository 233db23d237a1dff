"""Row orders of the gated w13 (and its scales and bias), as index permutations applied in one batched gather.

A gated expert's 2I rows hold gate_i (w1) and up_i (w3) for i < I. The orders that occur:

=====================  ==========================================  ===================================
order                  row of gate_i / up_i                        who uses it
=====================  ==========================================  ===================================
``interleaved``        2i / 2i+1                                   gpt-oss checkpoints, triton_kernels
``contiguous``         i / I+i          ([w1; w3])                 generic checkpoints, AITER, VLLM_CUTLASS
``up_gate``            I+i / i          ([w3; w1])                 FlashInfer CUTLASS (MXFP4 and NVFP4)
``up_gate_interleaved`` 2i+1 / 2i        ([w3_0, w1_0, w3_1, ...])  FlashInfer TRT-LLM (before its shuffle)
``up_gate_groups64``   128(i//64)+64+i%64 / 128(i//64)+i%64        FlashInfer CuteDSL (vLLM 0.20):
                       ([w3; w1] then 64-row groups alternate,     ``interleave_linear_and_gate``
                       w3 group first)                             (group 64) after the [w3; w1] swap
=====================  ==========================================  ===================================

`row_permutation(source, target, I)` returns ``perm`` with ``target_rows = source_rows[perm]``, so a
conversion is one `permute_rows` over all experts (no loop), and ``invert_permutation`` undoes it.
"""

from __future__ import annotations

import functools

import torch

from backends.layouts.placement import Run

__all__ = ["LINEAR_ORDERS", "ROW_ORDERS", "compose", "gate_up_runs", "gate_up_sources", "invert_permutation",
           "permute_rows", "row_permutation", "rows_runs"]

ROW_ORDERS = ("interleaved", "contiguous", "up_gate", "up_gate_interleaved", "up_gate_groups64")


def _positions(order: str, inter: int) -> torch.Tensor:
    """[2, I] row index of (gate, up) x i in `order`."""
    i = torch.arange(inter)
    if order == "interleaved":
        return torch.stack((2 * i, 2 * i + 1))
    if order == "contiguous":
        return torch.stack((i, inter + i))
    if order == "up_gate":
        return torch.stack((inter + i, i))
    if order == "up_gate_interleaved":
        return torch.stack((2 * i + 1, 2 * i))
    if order == "up_gate_groups64":
        if inter % 64:
            raise ValueError(f"row order 'up_gate_groups64' needs I % 64 == 0, got I={inter}; pad the layer")
        base = (i // 64) * 128 + i % 64
        return torch.stack((base + 64, base))
    raise ValueError(f"row order {order!r} must be one of {ROW_ORDERS}")


@functools.lru_cache(maxsize=64)
def _row_permutation_cpu(source: str, target: str, inter: int) -> torch.Tensor:
    perm = torch.empty(2 * inter, dtype=torch.long)
    perm[_positions(target, inter).reshape(-1)] = _positions(source, inter).reshape(-1)
    return perm


def row_permutation(source: str, target: str, inter: int, device="cpu") -> torch.Tensor:
    """int64 [2I]: ``rows_in_target_order = rows_in_source_order[perm]``."""
    return _row_permutation_cpu(source, target, inter).to(device)


def invert_permutation(perm: torch.Tensor) -> torch.Tensor:
    """``inv`` with ``x[perm][inv] == x``."""
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device, dtype=perm.dtype)
    return inv


def compose(first: torch.Tensor, then: torch.Tensor) -> torch.Tensor:
    """The single gather equal to applying `first`, then `then`: ``x[first][then] == x[compose(first, then)]``."""
    return first[then]


def permute_rows(t: torch.Tensor, perm: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """A new tensor with ``t``'s slices along `dim` reordered by `perm` (one batched gather, never in place).

    Rows are moved as wide words when their byte length allows it (a uint8 row of 1440 bytes moves as
    180 int64), which is what makes the gather run near copy bandwidth on a GPU.
    """
    dim = dim % t.dim()
    perm = perm.to(t.device)
    if dim == t.dim() - 1 or not t.is_contiguous():
        return t.index_select(dim, perm)
    row_bytes = t.element_size()
    for size in t.shape[dim + 1:]:
        row_bytes *= size
    for wide in (torch.int64, torch.int32, torch.int16):
        width = torch.empty((), dtype=wide).element_size()
        if row_bytes % width == 0 and row_bytes >= width and t.dtype != wide and t.element_size() <= width:
            rows = t.reshape(*t.shape[: dim + 1], row_bytes // t.element_size())
            try:
                as_words = rows.view(torch.uint8).view(wide) if rows.dtype != torch.uint8 else rows.view(wide)
            except RuntimeError:
                break
            out = as_words.index_select(dim, perm)
            return out.view(torch.uint8).view(t.dtype).reshape(*t.shape[:dim], perm.numel(), *t.shape[dim + 1:])
    return t.index_select(dim, perm)


# ---------------------------------------------------------------------------- runs for `placement.place`
#: (gate slot, up slot): the half (linear orders) or the value of the gate/up row digit (the others)
_SLOTS = {"interleaved": (0, 1), "contiguous": (0, 1), "up_gate": (1, 0), "up_gate_interleaved": (1, 0),
          "up_gate_groups64": (1, 0)}
#: orders whose gate and up rows are two halves [0, I) and [I, 2I) (the rest alternate on a row digit)
LINEAR_ORDERS = ("contiguous", "up_gate")


def _matrix(t: torch.Tensor) -> torch.Tensor:
    """[E, R, ...] as [E, R, C] (a view; C = 1 for [E, R])."""
    cols = 1
    for size in t.shape[2:]:
        cols *= size
    return t.reshape(t.shape[0], t.shape[1], cols)


def gate_up_sources(t: torch.Tensor, convention: str) -> tuple:
    """(gate, up) rows of a checkpoint w13-like tensor [E, 2I, ...] as [E, I, C] views (a bias gets C = 1)."""
    matrix = _matrix(t)
    experts, rows = matrix.shape[:2]
    if convention == "interleaved":
        pairs = matrix.view(experts, rows // 2, 2, matrix.shape[-1])
        return pairs[:, :, 0], pairs[:, :, 1]
    return matrix[:, : rows // 2], matrix[:, rows // 2:]


def gate_up_runs(t: torch.Tensor, convention: str, order: str, padded_inter: int, digit: int | None = None) -> list:
    """`placement.Run`s writing checkpoint rows (`convention`) into a view whose rows are in `order`, padded to
    `padded_inter` per half with zero rows. Linear orders fill row ranges; the others select `digit`, the
    view's gate/up row digit, and fill the other digits' range."""
    if order not in _SLOTS:
        raise ValueError(f"row order {order!r} must be one of {tuple(_SLOTS)}")
    linear = order in LINEAR_ORDERS
    if not linear and digit is None:
        raise ValueError(f"row order {order!r} selects a gate/up row digit; pass digit=")
    runs = []
    for src, slot in zip(gate_up_sources(t, convention), _SLOTS[order], strict=True):
        inter = src.shape[1]
        if linear:
            runs += [Run(slot * padded_inter, src), Run(slot * padded_inter + inter, rows=padded_inter - inter)]
        else:
            select = ((digit, slot),)
            runs += [Run(0, src, select=select), Run(inter, rows=padded_inter - inter, select=select)]
    return runs


def rows_runs(t: torch.Tensor, padded_rows: int) -> list:
    """`placement.Run`s writing all rows of [E, R, ...] (a bias: C = 1) into rows [0, R), zeros up to padded_rows."""
    matrix = _matrix(t)
    return [Run(0, matrix), Run(matrix.shape[1], rows=padded_rows - matrix.shape[1])]
