"""Block-scale layouts shared by several backends, each with its exact inverse (batched over experts).

* E8M0 -> fp32 by bit placement (DeepGEMM): ``bits = code << 23``, i.e. 2^(code-127) for codes
  1..254, **code 0 -> 0.0** (not 2^-127, as vLLM's upcast does) and code 255 -> +inf. The inverse
  reads the exponent field back, so it is exact for every value the upcast produces.
* The cuBLAS/CUTLASS "128x4" interleave (flashinfer ``block_scale_interleave`` /
  ``nvfp4_block_scale_interleave``, vLLM ``swizzle_blockscale``): per expert, rows padded to 128 and
  columns to 4 with zeros, then tile (r // 128, c // 4) is stored contiguously and inside a tile
  element (r, c) sits at (r % 32) * 16 + (r // 32 % 4) * 4 + c % 4. This is `formats.swizzle_nvfp4_scales`
  applied to every expert at once; the output keeps the padded 2-D shape [E, Mp, Kp].
"""

from __future__ import annotations

import torch

from backends.layouts.base import tile_permute, tile_unpermute
from backends.layouts.placement import RowCol, Run, build

__all__ = ["build_128x4", "deinterleave_128x4", "e8m0_to_fp32", "fp32_to_e8m0", "interleave_128x4", "padded_128x4",
           "view_128x4"]


def e8m0_to_fp32(codes: torch.Tensor) -> torch.Tensor:
    """uint8 E8M0 codes -> float32 2^(code-127); code 0 -> 0.0 and 255 -> +inf (bit placement, as DeepGEMM)."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"e8m0_to_fp32: codes.dtype={codes.dtype} must be torch.uint8; view E8M0 scales as uint8")
    return (codes.to(torch.int32) << 23).view(torch.float32)


def fp32_to_e8m0(values: torch.Tensor) -> torch.Tensor:
    """Inverse of e8m0_to_fp32: the fp32 exponent field as uint8 (exact on every value e8m0_to_fp32 returns)."""
    if values.dtype != torch.float32:
        raise TypeError(f"fp32_to_e8m0: values.dtype={values.dtype} must be torch.float32")
    return ((values.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)


_TILE_DIMS = (0, 1, 4, 3, 2, 5)


def _TILES(experts: int, prow: int, pcol: int) -> tuple:
    return (experts, prow // 128, 4, 32, pcol // 4, 4)


def padded_128x4(rows: int, cols: int) -> tuple:
    return -(-rows // 128) * 128, -(-cols // 4) * 4


def interleave_128x4(scales: torch.Tensor) -> torch.Tensor:
    """[E, M, K] block scales -> [E, Mp, Kp] in the 128x4 tiled layout (zero padding), any 1-byte dtype."""
    if scales.dim() != 3:
        raise ValueError(f"interleave_128x4: scales must be 3-D [E, M, K], got {tuple(scales.shape)}")
    experts, rows, cols = scales.shape
    prow, pcol = padded_128x4(rows, cols)
    if (prow, pcol) != (rows, cols):
        padded = scales.new_zeros((experts, prow, pcol))
        padded[:, :rows, :cols] = scales
        scales = padded
    return tile_permute(scales, _TILES(experts, prow, pcol), _TILE_DIMS)


def deinterleave_128x4(swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Exact inverse of interleave_128x4: [E, Mp, Kp] tiled -> [E, rows, cols] linear (padding dropped)."""
    prow, pcol = padded_128x4(rows, cols)
    if swizzled.dim() != 3 or tuple(swizzled.shape[1:]) != (prow, pcol):
        raise ValueError(f"deinterleave_128x4: swizzled.shape={tuple(swizzled.shape)} must be [E, {prow}, {pcol}] "
                         f"for rows={rows}, cols={cols}; pass the sizes it was interleaved from")
    linear = tile_unpermute(swizzled, _TILES(swizzled.shape[0], prow, pcol), _TILE_DIMS)
    return linear if (prow, pcol) == (rows, cols) else linear[:, :rows, :cols].contiguous()


def view_128x4(out: torch.Tensor) -> RowCol:
    """A [E, Mp, Kp] buffer in the 128x4 layout seen row-major: [E, M/128, 4, 32, K/4, 4] (row = 128 t + 32 q + r)."""
    experts, prow, pcol = out.shape
    return RowCol.of(out, (prow // 128, pcol // 4, 32, 4, 4), (0, 3, 2, 1, 4), row_dims=3)


def build_128x4(scales: torch.Tensor, rows: int, cols: int, runs_of, rows_view=None) -> torch.Tensor:
    """The [E, Mp, Kp] 128x4 buffer (Mp, Kp = `padded_128x4(rows, cols)`) of 1-byte `scales` [E, R, C], written
    by the runs `runs_of(source)` returns (see `placement.build`); rows_view refines the row-major view's rows."""
    prow, pcol = padded_128x4(rows, cols)
    if prow != rows and rows_view is not None:
        raise ValueError(f"build_128x4: rows={rows} is not a multiple of 128 and a row order is given; pad "
                         f"the rows to a multiple of 128 first")

    def runs(source):  # the tile padding: zero rows after the last of `rows` in the row-major view
        return [*runs_of(source), *([Run(rows, rows=prow - rows)] if prow != rows else [])]

    view = view_128x4 if rows_view is None else (lambda out: rows_view(view_128x4(out)))
    return build(scales, (scales.shape[0], prow, pcol), view, runs, scales.shape[-1])
