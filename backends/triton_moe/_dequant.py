"""One K step of the fused MoE GEMMs: the weight tile dequantized from packed E2M1 and its block scales, and the
activation columns that match it (the order of the layout backends.layouts.triton_moe). The GEMM kernels in
`_kernels` call `_weight_tile` + `_act_halves` (two MMAs, low and high nibbles) or, for NVFP4 plain tiles,
`_weight_tile_nvfp4_k_order` + `_act_tile` (one MMA); tests/triton_moe_scale_probe.py probes the decoders.
"""

from __future__ import annotations

import triton
import triton.language as tl

# E2M1 -> bf16x2, 4 bytes (8 values) per asm instance. prmt moves byte j into the high byte of a 16-bit lane
# (t = b << 8). A low nibble (bits 8..11) becomes the bf16 pattern of value * 2^-126 (subnormal for 0.5) as
# ((t << 4) | (t >> 2)) & 0x81C081C0 (sign to bit 15, magnitude to bits 6..8; 3 SASS ops); a high nibble (bits
# 12..15) as (t & 0x80008000) | ((t >> 6) & 0x01C001C0) (3 ops; bit 8 of t belongs to the low nibble). One
# bf16x2 FMA then applies a "folded" scale, 2^126 * block scale (exact: <= 6 significant bits), built by
# _scale_pair. $0,$1: low nibbles of bytes 0-1, 2-3; $2,$3: high nibbles; $4: the 4 bytes; $5,$6 / $7,$8:
# the folded scales of the low / high values. ~2.25 SASS per value. (Tried in round 5, dd32ae9: (n & 7 | n & 8) via
# and / mul.lo by 2^6 + 2^12 / and, 14 -> 10 ALU-pipe ops per 8 values but equal total SASS, +0.4% on two MXFP4
# tiles; not kept, see benchmarks/gpu/moe-sass-sm90-triton36.md.)
_E2M1_BF16X2_ASM = tl.constexpr("""
{
.reg .b32 t01, t23, a, b, z, nz;
mov.b32 z, 0;
mov.b32 nz, 0x80008000;
prmt.b32 t01, $4, z, 0x1404;
prmt.b32 t23, $4, z, 0x3424;
shl.b32 a, t01, 4; shr.b32 b, t01, 2; or.b32 a, a, b; and.b32 a, a, 0x81C081C0; fma.rn.bf16x2 $0, a, $5, nz;
shl.b32 a, t23, 4; shr.b32 b, t23, 2; or.b32 a, a, b; and.b32 a, a, 0x81C081C0; fma.rn.bf16x2 $1, a, $6, nz;
shr.b32 a, t01, 6; and.b32 a, a, 0x01C001C0; and.b32 b, t01, 0x80008000; or.b32 a, a, b;
fma.rn.bf16x2 $2, a, $7, nz;
shr.b32 a, t23, 6; and.b32 a, a, 0x01C001C0; and.b32 b, t23, 0x80008000; or.b32 a, a, b;
fma.rn.bf16x2 $3, a, $8, nz;
}
""")
# Unfolded variant (MXFP4 scales above 2, whose folded value 2^126 * scale leaves bf16's range): first
# multiply by 2^126, then by the block scale itself (two exact FMAs).
_E2M1_BF16X2_UNFOLDED_ASM = tl.constexpr("""
{
.reg .b32 t01, t23, a, b, z, nz, k126;
mov.b32 z, 0;
mov.b32 nz, 0x80008000;
mov.b32 k126, 0x7E807E80;
prmt.b32 t01, $4, z, 0x1404;
prmt.b32 t23, $4, z, 0x3424;
shl.b32 a, t01, 4; shr.b32 b, t01, 2; or.b32 a, a, b; and.b32 a, a, 0x81C081C0; fma.rn.bf16x2 a, a, k126, nz;
fma.rn.bf16x2 $0, a, $5, nz;
shl.b32 a, t23, 4; shr.b32 b, t23, 2; or.b32 a, a, b; and.b32 a, a, 0x81C081C0; fma.rn.bf16x2 a, a, k126, nz;
fma.rn.bf16x2 $1, a, $6, nz;
shr.b32 a, t01, 6; and.b32 a, a, 0x01C001C0; and.b32 b, t01, 0x80008000; or.b32 a, a, b;
fma.rn.bf16x2 a, a, k126, nz; fma.rn.bf16x2 $2, a, $7, nz;
shr.b32 a, t23, 6; and.b32 a, a, 0x01C001C0; and.b32 b, t23, 0x80008000; or.b32 a, a, b;
fma.rn.bf16x2 a, a, k126, nz; fma.rn.bf16x2 $3, a, $8, nz;
}
""")

#: NVFP4 scales are folded with an extra 2^-NVFP4_FOLD_SHIFT = 2^-16 (E4M3 up to 448 * 2^126 would overflow
#: bf16): the dequantized weights are W * 2^-16 (all normal: |W| in [2^-10, 2688]) and the GEMM epilogues
#: multiply by 2^16 = 65536.0 (exact).
NVFP4_FOLD_SHIFT = 16


@triton.jit
def _e2m1_value_f32(codes):
    """4-bit E2M1 codes (int32) -> fp32 values * 2^-126 (the asm's bf16 pattern), through fp16 (exact)."""
    bits = (((codes & 8) << 12) | ((codes & 7) << 9)).to(tl.int16)
    return bits.to(tl.float16, bitcast=True).to(tl.float32) * 16384.0 * 1.1754943508222875e-38  # * 2^14 * 2^-126


@triton.jit
def _dequant_pairs(packed, scale_lo, scale_hi, FOLDED: tl.constexpr, USE_ASM: tl.constexpr):
    """bytes (low nibble = value k, high nibble = value k+32 of its 64-wide group) -> (low, high) bf16."""
    if USE_ASM:
        if FOLDED:
            lo, hi = tl.inline_asm_elementwise(_E2M1_BF16X2_ASM, "=r,=r,=r,=r,r,r,r,r,r",
                                               [packed, scale_lo, scale_hi], dtype=(tl.bfloat16, tl.bfloat16),
                                               is_pure=True, pack=4)
        else:
            lo, hi = tl.inline_asm_elementwise(_E2M1_BF16X2_UNFOLDED_ASM, "=r,=r,=r,=r,r,r,r,r,r",
                                               [packed, scale_lo, scale_hi], dtype=(tl.bfloat16, tl.bfloat16),
                                               is_pure=True, pack=4)
    else:  # the CPU interpreter cannot run PTX: the same products in fp32 (each exact), rounded once
        b = packed.to(tl.int32)
        lo = _e2m1_value_f32(b & 15)
        hi = _e2m1_value_f32(b >> 4)
        if not FOLDED:
            lo = lo * 8.507059173023462e37  # 2^126
            hi = hi * 8.507059173023462e37
        lo = (lo * scale_lo.to(tl.float32)).to(tl.bfloat16)
        hi = (hi * scale_hi.to(tl.float32)).to(tl.bfloat16)
    return lo, hi


# NVFP4 block scales, both of a dequantization step's pair at once: $1 holds the low values' E4M3 byte in bits
# 0-7 and the high values' one in bits 16-23 (other bits ignored); $0 = bf16x2 (2^110 * low, 2^110 * high).
# The bf16 pattern (s & 0x80) << 8 | (s & 0x7F) << 4 is scale * 2^-120 for every E4M3 code, subnormals
# included (E4M3 and bf16 subnormals line up: both are m/8 of the smallest normal); two exact bf16x2 FMAs
# by 2^115 fold it. ~6 SASS per pair (the fp16 -> fp32 -> bf16 route took ~12).
_E4M3_PAIR_BF16X2_ASM = tl.constexpr("""
{
.reg .b32 a, b, k, nz;
mov.b32 nz, 0x80008000;
mov.b32 k, 0x79007900;
shl.b32 a, $1, 8; and.b32 a, a, 0x80008000;
shl.b32 b, $1, 4; and.b32 b, b, 0x07F007F0;
or.b32 a, a, b;
fma.rn.bf16x2 a, a, k, nz;
fma.rn.bf16x2 $0, a, k, nz;
}
""")


# MXFP4 folded scales, both of a pair at once: $1 holds the low values' E8M0 exponent in bits 0-7 and the high
# values' one in bits 8-15 (e <= 128, see _scale_bf16); $0 = bf16x2 (2^(e_lo - 1), 2^(e_hi - 1)): prmt moves
# byte 1 to byte 2 (zeros elsewhere), then (e + 126) << 7 per 16-bit lane (no carry: e + 126 <= 254).
_E8M0_PAIR_BF16X2_ASM = tl.constexpr("""
{
.reg .b32 y, z;
mov.b32 z, 0;
prmt.b32 y, $1, z, 0x4140;
shl.b32 y, y, 7;
add.u32 $0, y, 0x3F003F00;
}
""")


@triton.jit
def _e4m3_folded_f32(s):
    """E4M3 byte (int32, bits above the low byte ignored) -> fp32 2^(126 - NVFP4_FOLD_SHIFT) * scale, exact: the
    asm's pattern as fp32 bits (the interpreter's bf16 -> fp32 loses subnormals), times 2^115 twice."""
    bits = (((s & 0x80) << 24) | ((s & 0x7F) << 20)).to(tl.float32, bitcast=True)
    return bits * 4.1538374868278621e34 * 4.1538374868278621e34


@triton.jit
def _scale_pair(x, NVFP4: tl.constexpr, FOLDED: tl.constexpr, USE_ASM: tl.constexpr):
    """A scale word shifted so that its low byte is the low values' scale -> (low, high) bf16 factors that
    _dequant_pairs applies; the high values' scale is the byte 32 // SCALE_BLOCK further (NVFP4: 2, MXFP4: 1)."""
    if NVFP4:
        if USE_ASM:
            pair = tl.inline_asm_elementwise(_E4M3_PAIR_BF16X2_ASM, "=r,r", [x], dtype=tl.int32, is_pure=True,
                                             pack=1)
            lo = (pair & 0xFFFF).to(tl.int16).to(tl.bfloat16, bitcast=True)
            hi = (pair >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
        else:
            lo = _e4m3_folded_f32(x).to(tl.bfloat16)
            hi = _e4m3_folded_f32(x >> 16).to(tl.bfloat16)
    elif FOLDED and USE_ASM:
        pair = tl.inline_asm_elementwise(_E8M0_PAIR_BF16X2_ASM, "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)
        lo = (pair & 0xFFFF).to(tl.int16).to(tl.bfloat16, bitcast=True)
        hi = (pair >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        lo = _scale_bf16(x, FOLDED)
        hi = _scale_bf16(x >> 8, FOLDED)
    return lo, hi


@triton.jit
def _e4m3_scales(x, USE_ASM: tl.constexpr):
    """E4M3 bytes (int32, bits 0-7; bits 8-15 ignored) -> bf16 2^(126 - NVFP4_FOLD_SHIFT) * scale, each element
    its own (the swap-AB NVFP4 tile's one scale per thread, row and group), two elements per asm."""
    if USE_ASM:
        scale = tl.inline_asm_elementwise(_E4M3_TWO_BF16X2_ASM, "=r,r,r", [x], dtype=tl.bfloat16, is_pure=True,
                                          pack=2)
    else:
        scale = _e4m3_folded_f32(x).to(tl.bfloat16)
    return scale


@triton.jit
def _scale_bf16(s, FOLDED: tl.constexpr):
    """MXFP4 scale byte (int32, bits above the low byte ignored) -> the bf16 factor _dequant_pairs applies (exact).

    E8M0 e, scale 2^(e-127): folded 2^126 * scale = 2^(e-1), valid for e <= 128 (forward.py checks);
    unfolded 2^(e-127) (e = 0: the bf16 subnormal 2^-127; both give the same products).
    """
    s = s & 0xFF
    if FOLDED:
        return ((s + 126) << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return tl.where(s == 0, 0x40, s << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)


# NVFP4 block scales of two fragment elements at once ("shared K order", see _weight_tile_nvfp4_swap): $1, $2 hold the
# E4M3 bytes (bits 0-7) of elements a and b (in the swap-AB fragments rows r and r + 8 of one thread); prmt puts
# them in bytes 0 and 2, then _E4M3_PAIR_BF16X2_ASM's decode: $0 = bf16x2 (2^110 * scale_a, 2^110 * scale_b).
_E4M3_TWO_BF16X2_ASM = tl.constexpr("""
{
.reg .b32 x, a, b, k, nz;
mov.b32 nz, 0x80008000;
mov.b32 k, 0x79007900;
prmt.b32 x, $1, $2, 0x5410;
shl.b32 a, x, 8; and.b32 a, a, 0x80008000;
shl.b32 b, x, 4; and.b32 b, b, 0x07F007F0;
or.b32 a, a, b;
fma.rn.bf16x2 a, a, k, nz;
fma.rn.bf16x2 $0, a, k, nz;
}
""")


@triton.jit
def _weight_tile(w_rows, words_ptr, stride_sc, k0, row_ok, K: tl.constexpr, BLOCK_K: tl.constexpr,
                 SCALE_BLOCK: tl.constexpr, NVFP4: tl.constexpr, FOLDED: tl.constexpr, EVEN_K: tl.constexpr,
                 USE_ASM: tl.constexpr):
    """One K step of ROWS weight rows -> (low, high) bf16 [ROWS, BLOCK_K/2]: column b of both matches the
    activation columns of _act_halves (_act_columns). The GEMMs call it for MXFP4 and for swap-AB NVFP4 tiles;
    plain NVFP4 tiles take _weight_tile_nvfp4_k_order + _act_tile (same values, one MMA)."""
    if NVFP4:
        lo, hi = _weight_tile_nvfp4_swap(w_rows, words_ptr, stride_sc, k0, row_ok, K, BLOCK_K, EVEN_K, USE_ASM)
    else:
        lo, hi = _weight_tile_mxfp4(w_rows, words_ptr, stride_sc, k0, row_ok, K, BLOCK_K, SCALE_BLOCK, FOLDED,
                                    EVEN_K, USE_ASM)
    return lo, hi


@triton.jit
def _weight_tile_mxfp4(w_rows, words_ptr, stride_sc, k0, row_ok, K: tl.constexpr, BLOCK_K: tl.constexpr,
                       SCALE_BLOCK: tl.constexpr, FOLDED: tl.constexpr, EVEN_K: tl.constexpr, USE_ASM: tl.constexpr):
    """MXFP4: value k = k0 + 64*(b//32) + b%32 (low) and k + 32 (high).

    The bytes load as one 2-D tile (each row's BLOCK_K/2 bytes contiguous: 16-byte copies); the scales as
    one word per (row, scale block of the low values), broadcast over its SCALE_BLOCK columns in registers.
    """
    HALF: tl.constexpr = BLOCK_K // 2
    NSUB: tl.constexpr = HALF // SCALE_BLOCK  # scale blocks among a step's low values
    j = tl.arange(0, NSUB)
    col = (k0 // 2 + j * SCALE_BLOCK)[:, None] + tl.arange(0, SCALE_BLOCK)[None, :]  # [NSUB, SCALE_BLOCK] bytes
    k_first = k0 + 64 * ((j * SCALE_BLOCK) // 32) + (j * SCALE_BLOCK) % 32  # first low value of sub-block j
    block_lo = k_first // SCALE_BLOCK  # its scale block; the high values' block is 32 // SCALE_BLOCK further
    w_ptrs = w_rows[:, None, None] + col[None, :, :]
    s_ptrs = words_ptr[:, None] + (block_lo // 4)[None, :] * stride_sc
    if EVEN_K:
        packed = tl.load(w_ptrs, mask=row_ok[:, None, None], other=0)
        words = tl.load(s_ptrs, mask=row_ok[:, None], other=0)
    else:
        packed = tl.load(w_ptrs, mask=row_ok[:, None, None] & (col < K // 2)[None, :, :], other=0)
        words = tl.load(s_ptrs, mask=row_ok[:, None] & (k_first < K)[None, :], other=0)
    scale_lo, scale_hi = _scale_pair(words >> (8 * (block_lo % 4))[None, :], False, FOLDED, USE_ASM)
    ROWS: tl.constexpr = packed.shape[0]
    lo, hi = _dequant_pairs(packed, tl.broadcast_to(scale_lo[:, :, None], (ROWS, NSUB, SCALE_BLOCK)),
                            tl.broadcast_to(scale_hi[:, :, None], (ROWS, NSUB, SCALE_BLOCK)), FOLDED, USE_ASM)
    return tl.reshape(lo, (ROWS, HALF)), tl.reshape(hi, (ROWS, HALF))


@triton.jit
def _weight_tile_nvfp4_swap(w_rows, words_ptr, stride_sc, k0, row_ok, K: tl.constexpr, BLOCK_K: tl.constexpr,
                            EVEN_K: tl.constexpr, USE_ASM: tl.constexpr):
    """NVFP4 in the "shared K order" (backends.layouts.triton_moe): byte 16j + 4c + i of 64-wide group g holds
    values 64g + 16c + 8j + i (low) and + 4 (high), so column b = 32g + 16j + 4c + i of both halves belongs to
    block scale c of group g (byte c of its scale word). The bytes load as [ROWS, G, 2, 16] (16-byte copies; a
    [.., 2, 4, 4] load lets Triton order shared memory by c before j and copy 4 bytes at a time) and are viewed
    as [ROWS, G, 2, 4, 4]; the scales load as bytes [ROWS, G, 4]: a thread of the mma fragments (4 consecutive
    bytes: 4c..4c+3 and 16+4c..) holds one block per (row, group), so it decodes one scale per 16 values, two rows
    per asm, instead of a (low, high) pair per 8 values in every thread of a quad.
    """
    HALF: tl.constexpr = BLOCK_K // 2
    G: tl.constexpr = BLOCK_K // 64
    g = tl.arange(0, G)
    c = tl.arange(0, 4)
    byte = ((k0 // 2 + 32 * g)[:, None, None] + (16 * tl.arange(0, 2))[None, :, None]
            + tl.arange(0, 16)[None, None, :])  # [G, 2, 16]: 16-byte runs, so that the copies stay 16 bytes wide
    w_ptrs = w_rows[:, None, None, None] + byte[None, :, :, :]
    s_ptrs = words_ptr[:, None, None] + (4 * stride_sc * (k0 // 64 + g))[None, :, None] + c[None, None, :]
    if EVEN_K:
        packed = tl.load(w_ptrs, mask=row_ok[:, None, None, None], other=0)
        scale_bytes = tl.load(s_ptrs, mask=row_ok[:, None, None], other=0)
    else:
        k_ok = k0 + 64 * g < K  # K is a multiple of 64: a group is in or out as a whole
        packed = tl.load(w_ptrs, mask=row_ok[:, None, None, None] & k_ok[None, :, None, None], other=0)
        scale_bytes = tl.load(s_ptrs, mask=row_ok[:, None, None] & k_ok[None, :, None], other=0)
    ROWS: tl.constexpr = packed.shape[0]
    packed = tl.reshape(packed, (ROWS, G, 2, 4, 4))  # [row, g, j, c, i]
    scale = _e4m3_scales(scale_bytes.to(tl.int32), USE_ASM)
    scale = tl.broadcast_to(scale[:, :, None, :, None], (ROWS, G, 2, 4, 4))
    lo, hi = _dequant_pairs(packed, scale, scale, True, USE_ASM)
    return tl.reshape(lo, (ROWS, HALF)), tl.reshape(hi, (ROWS, HALF))


@triton.jit
def _weight_tile_nvfp4_k_order(w_rows, words_ptr, stride_sc, k0, row_ok, K: tl.constexpr, BLOCK_K: tl.constexpr,
                               EVEN_K: tl.constexpr, USE_ASM: tl.constexpr):
    """NVFP4 for tiles whose weights reach the MMA through shared memory (plain tiles): bf16 [ROWS, BLOCK_K] in
    natural K order, so that the activations load as one contiguous tile and each matrix takes one MMA. A thread
    dequantizes whole 16-byte runs (4 block scales each): the bytes as [ROWS, G, 2, 16], one scale word per
    (row, group), decoded as the pairs (byte 0, byte 2) and (byte 1, byte 3) and picked per column; the low and
    the high values are then put back in K order (64g + 16c + 8j + 4h + i) in registers."""
    G: tl.constexpr = BLOCK_K // 64
    g = tl.arange(0, G)
    b = tl.arange(0, 16)
    byte = (k0 // 2 + 32 * g)[:, None, None] + (16 * tl.arange(0, 2))[None, :, None] + b[None, None, :]
    w_ptrs = w_rows[:, None, None, None] + byte[None, :, :, :]
    s_ptrs = words_ptr[:, None] + (stride_sc * (k0 // 64 + g))[None, :]
    if EVEN_K:
        packed = tl.load(w_ptrs, mask=row_ok[:, None, None, None], other=0)
        words = tl.load(s_ptrs, mask=row_ok[:, None], other=0)
    else:
        k_ok = k0 + 64 * g < K
        packed = tl.load(w_ptrs, mask=row_ok[:, None, None, None] & k_ok[None, :, None, None], other=0)
        words = tl.load(s_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0)
    ROWS: tl.constexpr = packed.shape[0]
    s0, s2 = _scale_pair(words, True, True, USE_ASM)
    s1, s3 = _scale_pair(words >> 8, True, True, USE_ASM)
    c = (b // 4)[None, None, None, :]
    scale = tl.where(c == 0, s0[:, :, None, None], s1[:, :, None, None])
    scale = tl.where(c == 2, s2[:, :, None, None], scale)
    scale = tl.where(c == 3, s3[:, :, None, None], scale)
    scale = tl.broadcast_to(scale, (ROWS, G, 2, 16))
    lo, hi = _dequant_pairs(packed, scale, scale, True, USE_ASM)
    w = tl.reshape(tl.join(lo, hi), (ROWS, G, 2, 4, 4, 2))  # [row, g, j, c, i, h]
    w = tl.reshape(tl.permute(w, (0, 1, 3, 2, 5, 4)), (ROWS, BLOCK_K))
    if USE_ASM:  # an identity: without it triton 3.6's OptimizeDotOperands folds the rank-6 reshape into the MMA's
        # shared-memory operand and aborts ("Illegal shared layout; expected collapsed shapePerCTA ...")
        w = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [w], dtype=tl.bfloat16, is_pure=True, pack=2)
    return w


@triton.jit
def _act_tile(a_rows, k0, row_ok, K: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """Activation columns k0 .. k0 + BLOCK_K in natural order: [ROWS, BLOCK_K]."""
    col = k0 + tl.arange(0, BLOCK_K)
    if EVEN_K:
        mask = row_ok[:, None]
    else:
        mask = row_ok[:, None] & (col < K)[None, :]
    return tl.load(a_rows[:, None] + col[None, :], mask=mask, other=0.0)


@triton.jit
def _scale_rows(s_ptr, word_index, AS_BYTES: tl.constexpr):
    """Pointers to the scale words of rows `word_index`: int32, or uint8 where _weight_tile_nvfp4_swap loads the
    block scales one by one."""
    if AS_BYTES:
        rows = s_ptr.to(tl.pointer_type(tl.uint8)) + 4 * word_index.to(tl.int64)
    else:
        rows = s_ptr + word_index
    return rows


@triton.jit
def _act_columns(k0, BLOCK_K: tl.constexpr, NVFP4: tl.constexpr):
    """K index of column b of _weight_tile's low half (the high half's is + 32 for MXFP4, + 4 for NVFP4)."""
    b = tl.arange(0, BLOCK_K // 2)
    if NVFP4:  # b = 32g + 16j + 4c + i -> 64g + 16c + 8j + i (runs of 4: 8-byte copies)
        col = k0 + 64 * (b // 32) + 16 * ((b // 4) % 4) + 8 * ((b // 16) % 2) + b % 4
    else:
        col = k0 + 64 * (b // 32) + b % 32
    return col


@triton.jit
def _act_halves(a_rows, k0, row_ok, K: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                NVFP4: tl.constexpr):
    """Activation columns matching _weight_tile's (low, high) halves: [ROWS, BLOCK_K/2] each."""
    col = _act_columns(k0, BLOCK_K, NVFP4)
    HI: tl.constexpr = 4 if NVFP4 else 32
    if EVEN_K:
        mask = row_ok[:, None]
    else:
        mask = row_ok[:, None] & (col < K)[None, :]
    lo = tl.load(a_rows[:, None] + col[None, :], mask=mask, other=0.0)
    hi = tl.load(a_rows[:, None] + (col + HI)[None, :], mask=mask, other=0.0)
    return lo, hi
