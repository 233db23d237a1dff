"""FlashInfer TRT-LLM-gen MoE layouts: FLASHINFER_TRTLLM_MXFP4_{BF16,MXFP8} and NVFP4 FLASHINFER_TRTLLM.

Matches vLLM 0.20.0 (`convert_gpt_oss_weight_to_mxfp4_moe_kernel_format`, TRTLLM branch, and
`prepare_nvfp4_moe_layer_for_fi_or_cutlass`) with flashinfer's pure-torch index helpers as of
flashinfer 0.6.x-0.7.2 (`get_shuffle_matrix_a_row_indices`, `get_shuffle_matrix_sf_a_row_indices`,
`get_reorder_rows_for_gated_act_gemm_row_indices`), all with ``epilogue_tile_m = 128``:

1. w13 rows -> ``[w3_0, w1_0, w3_1, w1_1, ...]`` (gpt-oss: swap every two rows; generic [w1; w3]:
   swap halves, then the gated-act row interleave; both give the same order);
2. every matrix (w13, w2 and their biases as column vectors) gets the epilogue row shuffle: inside
   each block of 32 rows, source row r goes to row ``8 * (r % 4) + r // 4`` (flashinfer's
   ``srcToDstBlk32RowMap``; block 16 with map ``8 * (r % 2) + r // 2`` for tiles not multiple of 128);
3. block scales follow the same rows and are then stored in the 128x4 interleave
   (`scales.interleave_128x4`, = ``nvfp4_block_scale_interleave``); MXFP4's E8M0 bytes are
   re-viewed as float8_e4m3fn, as vLLM does (same bytes).

Padding, steps 1 and 2 (and 3's 128x4 tiles) are one strided copy per tensor (`placement`): the output
is viewed with rows in checkpoint order, so each half (gate, up) is written once, as wide words where
the row pitch allows, and only the padding is zeroed. Biases stay fp32. Config: what
`convert(..., quant_config=build_quant_config(decision, weights))` passes, from the rules' kind (MXFP4:
the gpt-oss SwiGLU constants per expert; NVFP4: the global-SF values and g1_scale_c); NVFP4 also keeps
the checkpoint scalars so that invert is exact.
Sizes: 2I and H multiples of 128 (scale rows), H/B and I/B multiples of 4 (scale columns).
"""

from __future__ import annotations

import torch

from backends.layouts.base import (
    Layout,
    require_multiple,
    require_tensor,
    source_config,
)
from backends.layouts.gate_up import (
    compose,
    gate_up_runs,
    invert_permutation,
    permute_rows,
    row_permutation,
    rows_runs,
)
from backends.layouts.placement import RowCol, build
from backends.layouts.scales import build_128x4, deinterleave_128x4
from backends.weights import BLOCK_SIZE, KernelWeights, MoEWeights

__all__ = ["EPILOGUE_TILE_M", "TrtllmLayout", "epilogue_row_shuffle", "mxfp4", "nvfp4"]

EPILOGUE_TILE_M = 128


def epilogue_row_shuffle(rows: int, epilogue_tile_m: int = EPILOGUE_TILE_M) -> torch.Tensor:
    """flashinfer ``get_shuffle_matrix_a_row_indices``: ``shuffled = x[idx]`` (idx[new_row] = old_row)."""
    block = 32 if epilogue_tile_m % 128 == 0 else 16
    if rows % block:
        raise ValueError(f"epilogue_row_shuffle: rows={rows} must be a multiple of {block}")
    lanes = block // 8
    old = torch.arange(rows)
    in_block = old % block
    new = old - in_block + 8 * (in_block % lanes) + in_block // lanes
    idx = torch.empty_like(old)
    idx[new] = old
    return idx


def epilogue_rows(rc: RowCol) -> RowCol:
    """A view whose last row digit is memory rows in 32-row blocks, seen in the order before the epilogue
    shuffle: memory row 8 b + a of a block holds row 4 a + b (`epilogue_row_shuffle`)."""
    last = rc.row_dims - 1
    rc = rc.split(last, (rc.view.shape[1 + last] // 32, 4, 8))
    return rc.order((*range(last + 1), last + 2, last + 1))


def _w13_rows(rc: RowCol) -> RowCol:
    """w13 rows: before the shuffle, row 2 i + h holds up_i (h = 0) and gate_i (h = 1); h is the last digit."""
    rc = epilogue_rows(rc)
    return rc.split(rc.row_dims - 1, (2, 2))


class TrtllmLayout(Layout):
    """One class for both formats: they differ in the scale dtype and in the config."""

    def __init__(self, fmt: str):
        self.formats = (fmt,)
        self.layout = f"flashinfer_trtllm_{fmt}"

    def _check_sizes(self, w: MoEWeights, hidden: int, inter: int) -> None:
        block = BLOCK_SIZE[w.format]
        require_multiple(self.layout, "2 * intermediate_size", 2 * inter, 128, "w13 scale rows fill 128-row tiles")
        require_multiple(self.layout, "hidden_size", hidden, 128, "w2 scale rows fill 128-row tiles")
        require_multiple(self.layout, f"hidden_size / {block}", hidden // block, 4, "scale columns fill 4-column tiles")
        require_multiple(self.layout, f"intermediate_size / {block}", inter // block, 4,
                         "scale columns fill 4-column tiles")

    def _perms(self, gate_up: str, inter: int, hidden: int):
        p13 = compose(row_permutation(gate_up, "up_gate_interleaved", inter), epilogue_row_shuffle(2 * inter))
        return p13, epilogue_row_shuffle(hidden)

    def _to_kernel(self, w: MoEWeights, hidden: int, inter: int):
        e, block = w.E, BLOCK_SIZE[w.format]

        def w13_runs(t):
            return gate_up_runs(t, w.gate_up, "up_gate_interleaved", inter, digit=-1)

        def w2_runs(t):
            return rows_runs(t, hidden)

        def scales(s, rows, cols, runs_of, rows_view):
            return build_128x4(s, rows, cols, runs_of, rows_view).view(torch.float8_e4m3fn)

        s13, s2 = w.w13_scale.view(torch.uint8), w.w2_scale.view(torch.uint8)
        tensors = {
            "w13": build(w.w13, (e, 2 * inter, hidden // 2), lambda out: _w13_rows(RowCol.plain(out)),
                         w13_runs(w.w13), w.H // 2),
            "w2": build(w.w2, (e, hidden, inter // 2), lambda out: epilogue_rows(RowCol.plain(out)),
                        rows_runs(w.w2, hidden), w.I // 2),
            "w13_scale": scales(s13, 2 * inter, hidden // block, w13_runs, _w13_rows),
            "w2_scale": scales(s2, hidden, inter // block, w2_runs, epilogue_rows),
        }
        if w.w13_bias is not None:
            tensors["w13_bias"] = build(w.w13_bias, (e, 2 * inter), lambda out: _w13_rows(RowCol.plain(out[..., None])),
                                        w13_runs(w.w13_bias), 1)
        if w.w2_bias is not None:
            tensors["w2_bias"] = build(w.w2_bias, (e, hidden), lambda out: epilogue_rows(RowCol.plain(out[..., None])),
                                       rows_runs(w.w2_bias, hidden), 1)
        return tensors, source_config(w)

    def _from_kernel(self, kw: KernelWeights) -> MoEWeights:
        e, hidden, inter = kw.E, kw.padded_hidden_size, kw.padded_intermediate_size
        block = BLOCK_SIZE[kw.format]
        p13, p2 = (invert_permutation(p) for p in self._perms(kw.gate_up, inter, hidden))
        dtype = torch.uint8 if kw.format == "mxfp4" else torch.float8_e4m3fn

        def scales(name, rows, cols, perm):
            s = require_tensor(self.layout, kw, name, (e, rows, cols), torch.float8_e4m3fn)
            return permute_rows(deinterleave_128x4(s.view(torch.uint8), rows, cols), perm).view(dtype)

        def rows(name, perm):
            return None if name not in kw.tensors else permute_rows(kw[name], perm)

        return self._rebuild(kw, w13=rows("w13", p13), w2=rows("w2", p2),
                             w13_scale=scales("w13_scale", 2 * inter, hidden // block, p13),
                             w2_scale=scales("w2_scale", hidden, inter // block, p2),
                             w13_bias=rows("w13_bias", p13), w2_bias=rows("w2_bias", p2))


#: backends FLASHINFER_TRTLLM_MXFP4_BF16 and FLASHINFER_TRTLLM_MXFP4_MXFP8 (same weight layout)
mxfp4 = TrtllmLayout("mxfp4")
#: NVFP4 backend FLASHINFER_TRTLLM
nvfp4 = TrtllmLayout("nvfp4")
