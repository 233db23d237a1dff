"""FlashInfer CUTLASS fused-MoE layouts for MXFP4: FLASHINFER_CUTLASS_MXFP4_BF16 (SM90) and _MXFP8 (SM100).

Both (vLLM 0.20.0 / 0.33.0): w13 rows -> ``[up; gate]`` (= [w3; w1]; gpt-oss rows are de-interleaved
first), the same for the w13 scales and bias; biases are passed as **bf16** (vLLM casts fp32 -> bf16:
the round trip is exact for bf16-representable biases, e.g. every gpt-oss checkpoint, and rounds to
nearest otherwise); the config is what `convert(..., quant_config=...)` passes from the rules' kind (the
per-expert gpt-oss SwiGLU constants). Then, per variant:

Padding, the row order and the scale layouts are one strided copy per tensor (`placement`); the
SM90 weight interleave is a bit-level permutation done in further passes.

* ``mxfp4_mxfp8`` (SM100, MXFP8 activations): weights as they are, both scale tensors in the 128x4
  interleave (flashinfer ``block_scale_interleave``, same [E, rows, K/32] shape; needs rows % 128
  and K % 128). Matches vLLM 0.20.0 with flashinfer 0.6.x-0.7.2.
* ``mxfp4_bf16_sm90`` (SM90 W4A16, flashinfer >= 0.6.16, i.e. the 0.7.x this project supports, and
  vLLM 0.33.0): scales folded ``[E, rows, K/32] -> reshape(E, rows/64, 4, 16, K/128, 4)
  .permute(0, 1, 4, 3, 2, 5) -> [E, rows/64, K/128, 16, 16]`` (flashinfer
  ``interleave_moe_scales_for_sm90_mixed_gemm``, pure torch); weights as flashinfer's CUDA kernel
  ``interleave_fp4_weights_for_sm90_mixed_gemm`` (behind ``interleave_moe_weights_for_sm90_mixed_gemm(w,
  "fp4")``, per expert, rows = N, cols = K) writes them, here as one batched byte permutation plus a
  fixed 32-bit permutation (`sm90_interleave_weights`, exact inverse `sm90_deinterleave_weights`).
  Needs N % 16 and K % 64 (weights) and rows % 64, K % 128 (scales).
* ``mxfp4_bf16_sm90_legacy`` (flashinfer 0.2.13-0.6.9, exactly vLLM 0.20.0's
  ``_interleave_mxfp4_cutlass_sm90``): weights as they are, scales
  ``[E, rows, K/32] -> reshape(E, rows, K/128, 4).permute(0, 2, 1, 3) -> [E, K/128, rows * 4]``.
  Do not pair it with flashinfer >= 0.6.10 (wrong weights) or >= 0.6.16 (wrong scales too).

On CUDA the SM90 weight interleave, with padding and the [up; gate] row order, is one Triton word gather
(`_nibble_kernels`) derived from `sm90_interleave_weights_torch`, which stays the definition and the CPU/meta
path; the inverse is pure torch.
"""

from __future__ import annotations

import functools

import torch

from backends.layouts import _nibble_kernels as kernels
from backends.layouts.base import (
    Layout,
    require_multiple,
    require_tensor,
    tile_permute,
    tile_unpermute,
)
from backends.layouts.gate_up import gate_up_runs, invert_permutation, permute_rows, row_permutation, rows_runs
from backends.layouts.placement import RowCol, build, pad_matrix
from backends.layouts.scales import build_128x4, deinterleave_128x4
from backends.weights import KernelWeights, MoEWeights

__all__ = ["CutlassMxfp4Layout", "mxfp4_bf16_sm90", "mxfp4_bf16_sm90_legacy", "mxfp4_mxfp8",
           "sm90_deinterleave_weights", "sm90_fold_scales", "sm90_interleave_weights", "sm90_unfold_scales"]

VARIANTS = ("sm100_mxfp8", "sm90_bf16", "sm90_bf16_legacy")


_FOLD_DIMS = (0, 1, 4, 3, 2, 5)
_LEGACY_DIMS = (0, 2, 1, 3)


def sm90_fold_scales(s: torch.Tensor) -> torch.Tensor:
    """[E, rows, K/32] -> [E, rows/64, K/128, 16, 16] (flashinfer >= 0.6.16 SM90 mixed-GEMM scales)."""
    e, rows, groups = s.shape
    folded = tile_permute(s, (e, rows // 64, 4, 16, groups // 4, 4), _FOLD_DIMS)
    return folded.reshape(e, rows // 64, groups // 4, 16, 16)


def sm90_unfold_scales(folded: torch.Tensor, rows: int, groups: int) -> torch.Tensor:
    """Exact inverse of sm90_fold_scales."""
    e = folded.shape[0]
    flat = folded.reshape(e, rows, groups)
    return tile_unpermute(flat, (e, rows // 64, 4, 16, groups // 4, 4), _FOLD_DIMS)


# The SM90 W4A16 weight interleave. Per expert, rows in groups of 16 (g, h = row // 8 % 2, r = row % 8) and
# byte columns in partitions of 32 (p, m, c4, l4 with col = 32 p + 8 m + 4 c4 + l4). Four source bytes
# (h, c4) = (0,0), (1,0), (0,1), (1,1) form one little-endian 32-bit word, whose bits are permuted by
# _SM90_BIT_MOVES, and the word's bytes land in row 16 g + 8 (m % 2) + r at columns 32 p + 16 (m // 2) + 4 l4 + i.
_SM90_SRC_VIEW = (2, 8, 4, 2, 4)  # per 16 rows x 32 bytes: h, r | m, c4, l4 (after g and p)
_SM90_TO_WORDS = (0, 1, 3, 4, 5, 7, 6, 2)  # [E, g, h, r, p, m, c4, l4] -> [E, g, r, p, m, l4, c4, h]
_SM90_FROM_WORDS = (0, 1, 5, 2, 3, 4, 6, 7)  # [E, g, r, p, mh, hd, l4, i] -> [E, g, hd, r, p, mh, l4, i]
#: (source bit mask, left shift; negative = right) of the 32-bit permutation, from the flashinfer kernel
_SM90_BIT_MOVES = (
    (0x00000080, 24), (0x00000070, 18), (0x00000008, 12), (0x00000007, 6),
    (0x00008000, 13), (0x00007000, 7), (0x00000800, 1), (0x00000700, -5),
    (0x00800000, 2), (0x00700000, -4), (0x00080000, -10), (0x00070000, -16),
    (0x80000000, -1), (0x10000000, 1), (0x60000000, -3), (0x08000000, -13),
    (0x01000000, -11), (0x06000000, -15),
)


def _bit_destinations() -> list:
    dest = [None] * 32
    for mask, shift in _SM90_BIT_MOVES:
        for bit in range(32):
            if mask >> bit & 1:
                dest[bit] = bit + shift
    if sorted(dest) != list(range(32)):
        raise AssertionError("_SM90_BIT_MOVES is not a permutation of 32 bits")
    return dest


def _byte_tables(dest: list) -> torch.Tensor:
    """int32 [4, 256]: the bits of the permuted word that source byte b holding value v contributes."""
    values = torch.arange(256)
    tables = torch.zeros(4, 256, dtype=torch.int64)
    for byte in range(4):
        for bit in range(8):
            tables[byte] |= ((values >> bit) & 1) << dest[8 * byte + bit]
    return torch.where(tables >= 2**31, tables - 2**32, tables).to(torch.int32)  # same 32 bits, signed


_SM90_DEST = _bit_destinations()
_SM90_FORWARD = _byte_tables(_SM90_DEST)
_SM90_BACKWARD = _byte_tables([_SM90_DEST.index(bit) for bit in range(32)])


def _permute_words(words: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """[..., 4] bytes of little-endian words -> [..., 4] bytes of the bit-permuted words (4 table lookups)."""
    tables = tables.to(words.device)
    flat = words.reshape(-1, 4)
    out = tables[0].index_select(0, flat[:, 0].to(torch.int32))
    for byte in range(1, 4):
        out |= tables[byte].index_select(0, flat[:, byte].to(torch.int32))
    return out.view(torch.uint8).reshape(words.shape)


def sm90_interleave_weights(w: torch.Tensor) -> torch.Tensor:
    """[E, N, K/2] packed FP4 -> the same shape in the SM90 mixed-GEMM order (N % 16, K % 64); the Triton
    kernel (`_nibble_kernels`) on CUDA."""
    if kernels.enabled(w):
        return _sm90_interleave_fast(w, w.shape[1], 2 * w.shape[2], kernels.plain_rows(w.shape[1], w.shape[1]))
    return sm90_interleave_weights_torch(w)


@functools.lru_cache(maxsize=16)
def _sm90_spec(half_k: int) -> kernels.WordGather:
    """The SM90 interleave as a word gather: each 16-row slab writes its own 16 rows, in 8-word tiles."""
    return kernels.derive(sm90_interleave_weights_torch, (16, half_k), (16, 8))


def _sm90_interleave_fast(src: torch.Tensor, n: int, k: int, rows: kernels.RowMap) -> torch.Tensor:
    """sm90_interleave_weights of the padded [E, n, k/2] matrix whose rows `rows` maps to the checkpoint's `src`."""
    out = src.new_empty((src.shape[0], n, k // 2))
    kernels.gather_words(_sm90_spec(k // 2), src, out, n_slabs=n // 16, slab_src=(16, 0), dst_slab_stride=2 * k,
                         dst_row_stride=k // 8, block=(16, k // 8), rows=rows, logical_cols=src.shape[-1])
    return out


def sm90_interleave_weights_torch(w: torch.Tensor) -> torch.Tensor:
    """The definition of sm90_interleave_weights in pure torch (CPU, meta, and the reference of the kernel)."""
    e, n, half_k = w.shape
    words = w.reshape(e, n // 16, *_SM90_SRC_VIEW[:2], half_k // 32, *_SM90_SRC_VIEW[2:])
    words = words.permute(_SM90_TO_WORDS).reshape(e, n // 16, 8, half_k // 32, 4, 4, 4)
    out = _permute_words(words, _SM90_FORWARD)  # [E, g, r, p, m, l4, i]
    out = out.reshape(e, n // 16, 8, half_k // 32, 2, 2, 4, 4).permute(_SM90_FROM_WORDS)
    return out.contiguous().reshape(e, n, half_k)


def sm90_deinterleave_weights(w: torch.Tensor) -> torch.Tensor:
    """Exact inverse of sm90_interleave_weights."""
    e, n, half_k = w.shape
    inverse_from = tuple(sorted(range(8), key=lambda d: _SM90_FROM_WORDS[d]))
    out = w.reshape(e, n // 16, 2, 8, half_k // 32, 2, 4, 4).permute(inverse_from)  # [E, g, r, p, mh, hd, l4, i]
    words = _permute_words(out.reshape(e, n // 16, 8, half_k // 32, 4, 4, 4), _SM90_BACKWARD)
    inverse_to = tuple(sorted(range(8), key=lambda d: _SM90_TO_WORDS[d]))
    words = words.reshape(e, n // 16, 8, half_k // 32, 4, 4, 2, 2).permute(inverse_to)
    return words.contiguous().reshape(e, n, half_k)


class CutlassMxfp4Layout(Layout):
    formats = ("mxfp4",)

    def __init__(self, layout: str, variant: str):
        if variant not in VARIANTS:
            raise ValueError(f"CutlassMxfp4Layout: variant={variant!r} must be one of {VARIANTS}")
        self.layout = layout
        self.variant = variant

    def _check_sizes(self, w: MoEWeights, hidden: int, inter: int) -> None:
        tile = 64 if self.variant == "sm90_bf16" else 128
        if self.variant != "sm90_bf16_legacy":
            require_multiple(self.layout, "2 * intermediate_size", 2 * inter, tile, f"scale rows fill {tile}-row tiles")
            require_multiple(self.layout, "hidden_size (w2 rows)", hidden, tile, f"scale rows fill {tile}-row tiles")
        require_multiple(self.layout, "hidden_size", hidden, 128, "4 scale groups of 32 per 128-wide K tile")
        require_multiple(self.layout, "intermediate_size", inter, 128, "4 scale groups of 32 per 128-wide K tile")

    def _scales(self, s: torch.Tensor, rows: int, groups: int, runs) -> torch.Tensor:
        """The variant's scale layout of [E, rows, groups] (padded) scales, written by `runs(s)` (`placement.build`)."""
        if self.variant == "sm100_mxfp8":
            return build_128x4(s, rows, groups, runs)
        e, logical = s.shape[0], s.shape[-1]
        if self.variant == "sm90_bf16_legacy":  # [E, groups/4, rows * 4]: (group tile, row, group % 4)
            return build(s, (e, groups // 4, rows * 4),
                         lambda out: RowCol.of(out, (groups // 4, rows, 4), (1, 0, 2), 1), runs, logical)
        # [E, rows/64, groups/4, 16, 16]: (row tile, group tile, row % 16, row // 16 % 4, group % 4)
        return build(s, (e, rows // 64, groups // 4, 16, 16),
                     lambda out: RowCol.of(out, (rows // 64, groups // 4, 16, 4, 4), (0, 3, 2, 1, 4), 3), runs, logical)

    def _unscales(self, s: torch.Tensor, rows: int, groups: int) -> torch.Tensor:
        if self.variant == "sm100_mxfp8":
            return deinterleave_128x4(s, rows, groups)
        if self.variant == "sm90_bf16_legacy":
            e = s.shape[0]
            return tile_unpermute(s.reshape(e, rows, groups), (e, rows, groups // 4, 4), _LEGACY_DIMS)
        return sm90_unfold_scales(s, rows, groups)

    def _to_kernel(self, w: MoEWeights, hidden: int, inter: int):
        e = w.E

        def up_gate(t):
            return gate_up_runs(t, w.gate_up, "up_gate", inter)

        if self.variant == "sm90_bf16" and kernels.enabled(w.w13):  # pad, row order and interleave: one kernel
            w13 = _sm90_interleave_fast(w.w13, 2 * inter, hidden, kernels.w13_rows(w.gate_up, "up_gate", w.I, inter))
            w2 = _sm90_interleave_fast(w.w2, hidden, inter, kernels.plain_rows(w.H, hidden))
        else:
            w13 = build(w.w13, (e, 2 * inter, hidden // 2), RowCol.plain, up_gate(w.w13), w.H // 2)
            w2 = pad_matrix(w.w2, hidden, inter // 2)
            if self.variant == "sm90_bf16":
                w13, w2 = sm90_interleave_weights_torch(w13), sm90_interleave_weights_torch(w2)
        tensors = {"w13": w13, "w2": w2,
                   "w13_scale": self._scales(w.w13_scale, 2 * inter, hidden // 32, up_gate),
                   "w2_scale": self._scales(w.w2_scale, hidden, inter // 32, lambda t: rows_runs(t, hidden))}
        if w.w13_bias is not None:
            tensors["w13_bias"] = build(w.w13_bias, (e, 2 * inter), lambda out: RowCol.plain(out[..., None]),
                                        up_gate(w.w13_bias), 1, dtype=torch.bfloat16)
        if w.w2_bias is not None:
            tensors["w2_bias"] = build(w.w2_bias, (e, hidden), lambda out: RowCol.plain(out[..., None]),
                                       rows_runs(w.w2_bias, hidden), 1, dtype=torch.bfloat16)
        return tensors, {}

    def _from_kernel(self, kw: KernelWeights) -> MoEWeights:
        e, hidden, inter = kw.E, kw.padded_hidden_size, kw.padded_intermediate_size
        inv = invert_permutation(row_permutation(kw.gate_up, "up_gate", inter))
        w13 = require_tensor(self.layout, kw, "w13", (e, 2 * inter, hidden // 2), torch.uint8)
        w2 = require_tensor(self.layout, kw, "w2", (e, hidden, inter // 2), torch.uint8)
        if self.variant == "sm90_bf16":
            w13, w2 = sm90_deinterleave_weights(w13), sm90_deinterleave_weights(w2)
        bias13, bias2 = kw.tensors.get("w13_bias"), kw.tensors.get("w2_bias")
        return self._rebuild(
            kw, w13=permute_rows(w13, inv), w2=w2,
            w13_scale=permute_rows(self._unscales(kw["w13_scale"], 2 * inter, hidden // 32), inv),
            w2_scale=self._unscales(kw["w2_scale"], hidden, inter // 32),
            w13_bias=None if bias13 is None else permute_rows(bias13, inv).float(),
            w2_bias=None if bias2 is None else bias2.float())


#: MXFP4 backend FLASHINFER_CUTLASS_MXFP4_MXFP8 (SM100)
mxfp4_mxfp8 = CutlassMxfp4Layout("flashinfer_cutlass_mxfp4_sm100", "sm100_mxfp8")
#: MXFP4 backend FLASHINFER_CUTLASS_MXFP4_BF16 (SM90) with flashinfer >= 0.6.16 (0.7.x)
mxfp4_bf16_sm90 = CutlassMxfp4Layout("flashinfer_cutlass_mxfp4_sm90", "sm90_bf16")
#: FLASHINFER_CUTLASS_MXFP4_BF16 for flashinfer <= 0.6.9 (what vLLM 0.20.0's code writes)
mxfp4_bf16_sm90_legacy = CutlassMxfp4Layout("flashinfer_cutlass_mxfp4_sm90_legacy", "sm90_bf16_legacy")
