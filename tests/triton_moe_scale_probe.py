"""Probe of the block-scale decode of backends.triton_moe: every E4M3 code (NVFP4) and every E8M0 exponent that
the folded MXFP4 path takes, through the kernels' routine; and of GEMM1's MXFP8 blocks of h within warps.

Used by test_triton_moe_interp.py (CPU interpreter: the fp32 path) and test_triton_moe.py (CUDA: the PTX path).
Imported only where Triton's mode (compiled or interpreted) is already fixed for the process.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from backends.triton_moe import _kernels


@triton.jit
def _decode_kernel(codes_ptr, lo_ptr, hi_ptr, N: tl.constexpr, NVFP4: tl.constexpr, USE_ASM: tl.constexpr):
    """Code c as the low scale and 255 - c (NVFP4) / 128 - c (MXFP4) as the high one of a scale word (bytes 0
    and 2 / 0 and 1), junk in the other bytes."""
    offs = tl.arange(0, N)
    codes = tl.load(codes_ptr + offs)
    if NVFP4:
        word = codes | ((offs & 0x55) << 8) | ((255 - codes) << 16) | ((offs ^ 0x3C) << 24)
    else:
        word = codes | ((128 - codes) << 8) | ((offs & 0x55) << 16) | ((offs ^ 0x3C) << 24)
    lo, hi = _kernels._scale_pair(word, NVFP4, True, USE_ASM)
    tl.store(lo_ptr + offs, lo)
    tl.store(hi_ptr + offs, hi)


@triton.jit
def _e2m1_kernel(words_ptr, out_ptr, scale_bits, N: tl.constexpr, FOLDED: tl.constexpr, USE_ASM: tl.constexpr):
    """The 8 values of each stored word, as [N, 8] in the routine's order (low codes of bytes 0-3, then high)."""
    offs = tl.arange(0, N)
    words = tl.load(words_ptr + offs)
    scale = tl.full((N,), scale_bits, tl.int16).to(tl.bfloat16, bitcast=True)
    e0, e1, e2, e3, e4, e5, e6, e7 = _kernels._dequant_words(words, scale, scale, FOLDED, USE_ASM)
    tl.store(out_ptr + offs * 8, e0)
    tl.store(out_ptr + offs * 8 + 1, e1)
    tl.store(out_ptr + offs * 8 + 2, e2)
    tl.store(out_ptr + offs * 8 + 3, e3)
    tl.store(out_ptr + offs * 8 + 4, e4)
    tl.store(out_ptr + offs * 8 + 5, e5)
    tl.store(out_ptr + offs * 8 + 6, e6)
    tl.store(out_ptr + offs * 8 + 7, e7)


def e2m1_decode_mismatches(device: str) -> list[list[int]]:
    """[folded, word, value] for every value of the probe words that the kernels' dequantization (folded: scale
    2^126 * 1; unfolded: 1) does not turn into the exact E2M1 value (0, +-0.5 .. +-6, -0 for code 8). The words
    are the layout's encoding (backends.layouts.triton_moe._encode_words) of 256 byte quadruples that put every
    code pair in every byte (byte b of word i: i, 255 - i, i ^ 0x5A, 37 i mod 256)."""
    from backends.layouts.triton_moe import _encode_words

    table = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    i = torch.arange(256)
    quads = torch.stack([i, 255 - i, i ^ 0x5A, (37 * i) % 256], dim=1).to(torch.uint8)  # [word, byte]
    codes = torch.cat([quads & 15, quads >> 4], dim=1).long()  # [word, 8]: low codes of bytes 0-3, then high
    ref = table[codes].bfloat16()
    words = _encode_words(quads.reshape(1, -1)).view(torch.int32).reshape(256).to(device)
    bad = []
    for folded, bits in ((True, 0x7E80), (False, 0x3F80)):  # bf16 2^126, 1.0
        out = torch.empty((256, 8), dtype=torch.bfloat16, device=device)
        _e2m1_kernel[(1,)](words, out, bits, N=256, FOLDED=folded, USE_ASM=device != "cpu", num_warps=1)
        wrong = out.cpu().view(torch.int16) != ref.view(torch.int16)
        bad += [[int(folded), int(w), int(v)] for w, v in wrong.nonzero().tolist()]
    return bad


def e4m3_decode_mismatches(device: str) -> list[int]:
    """E4M3 codes (all 254 non-NaN ones, subnormals and negatives included, as the low and as the high scale
    of a word) whose decoded bf16 is not 2^(126 - NVFP4_FOLD_SHIFT) * scale exactly (torch's float8_e4m3fn is
    the reference)."""
    codes = torch.arange(256, dtype=torch.int32, device=device)
    lo = torch.empty(256, dtype=torch.bfloat16, device=device)
    hi = torch.empty_like(lo)
    _decode_kernel[(1,)](codes, lo, hi, N=256, NVFP4=True, USE_ASM=device != "cpu")
    fold = 2.0 ** (126 - _kernels.NVFP4_FOLD_SHIFT)
    ref = (codes.to(torch.uint8).view(torch.float8_e4m3fn).float() * fold).bfloat16()
    real = ~torch.isnan(ref.float())
    bad_lo = real & (lo.view(torch.int16) != ref.view(torch.int16))
    bad_hi = real.flip(0) & (hi.view(torch.int16) != ref.flip(0).view(torch.int16))
    return sorted(set(bad_lo.nonzero().flatten().tolist()) | set((255 - bad_hi.nonzero().flatten()).tolist()))


def e8m0_folded_decode_mismatches(device: str) -> list[int]:
    """E8M0 exponents e in [0, 128] (the folded path's range), as the low and as the high scale of a word, whose
    decoded bf16 is not 2^126 * 2^(e - 127) = 2^(e - 1) exactly."""
    codes = torch.arange(256, dtype=torch.int32, device=device).clamp(max=128)
    lo = torch.empty(256, dtype=torch.bfloat16, device=device)
    hi = torch.empty_like(lo)
    _decode_kernel[(1,)](codes, lo, hi, N=256, NVFP4=False, USE_ASM=device != "cpu")
    ref_lo = torch.exp2(codes.double() - 1).bfloat16()
    ref_hi = torch.exp2(127 - codes.double()).bfloat16()
    bad = (lo.view(torch.int16) != ref_lo.view(torch.int16)) | (hi.view(torch.int16) != ref_hi.view(torch.int16))
    return sorted(set(codes[bad].tolist()))


@triton.jit
def _mx_warp_values_kernel(src_ptr, dst_ptr, ROWS: tl.constexpr, MX_WARPS: tl.constexpr, INTERPRETED: tl.constexpr):
    """Rows of 32 * MX_WARPS activations loaded in _mx_warp_columns' order, their MXFP8 values stored back in place."""
    cols = _kernels._mx_warp_columns(0, 32 * MX_WARPS, MX_WARPS)
    ptrs = tl.arange(0, ROWS)[:, None] * (32 * MX_WARPS) + cols[None, :]
    tl.store(dst_ptr + ptrs, _kernels._mx_values_by_warp(tl.load(src_ptr + ptrs), MX_WARPS, INTERPRETED))


def mx_warp_block_mismatches(device: str) -> dict[int, int]:
    """{MX_WARPS: elements where _mx_values_by_warp on columns in _mx_warp_columns' order is not
    formats.qdq_activation(t, 'fp8'), MXFP8 per 32 consecutive columns}. Each MX block of the fp32 rows is gaussian
    times its own 2^e (e in [-30, 30]), so a column grouped into another block gets another scale."""
    from backends import formats

    gen = torch.Generator().manual_seed(0)
    bad = {}
    for warps in (2, 4):
        rows = 16
        scale = torch.exp2(torch.randint(-30, 31, (rows, warps, 1), generator=gen).float())
        t = (torch.randn(rows, warps, 32, generator=gen) * scale).reshape(rows, 32 * warps)
        out = torch.empty_like(t, device=device)
        _mx_warp_values_kernel[(1,)](t.to(device), out, ROWS=rows, MX_WARPS=warps, INTERPRETED=device == "cpu")
        bad[warps] = int((out.cpu() != formats.qdq_activation(t, "fp8")).sum())
    return bad
