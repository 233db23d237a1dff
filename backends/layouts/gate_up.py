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

__all__ = ["ROW_ORDERS", "compose", "invert_permutation", "permute_rows", "row_permutation"]

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
