"""Triton kernels of the fused W4A16 MoE: GEMM1 + activation, GEMM2 + router weight, top-k sum.

    x [T, H] bf16 ──gather rows by sorted pair──> GEMM1 (gate and up tiles, FP4 dequantized in
    registers) ──bias, activation──> h [padded pairs, I] bf16 ──> GEMM2 (FP4 in registers) ──bias,
    router weight──> per-pair rows [T*k, H] fp32 ──fixed-order sum over k──> y [T, H]

Every program works on one (row block, column block) tile of one expert; row blocks come from
`_routing.align` (pairs sorted by expert, padded to BLOCK_M), so no host sync is needed and the
grid is a static upper bound (programs past the padded end return at once): CUDA-graph safe.
No atomics touch data (the one atomic counts a split-K tile's finished slices), so the result is
bit-identical from run to run.

Weights stay packed E2M1 until the K loop (layout: backends.layouts.triton_moe; a byte holds
values k and k+32 of a 64-wide group, so the low and the high nibbles of a tile are two K halves
that meet the matching activation columns in two MMAs - no interleaving shuffle; each 16-byte run
stores K bytes 0,1,8,9, 2,3,10,11, ..., so that a thread's share of a wgmma register operand is one
word: wgmma tiles permute the bytes back to K order for free, mma.sync tiles multiply in the stored
order and permute the activations instead, see forward._runs_wgmma; within each 4-byte word the 8 codes sit
at bit slots that need no byte permutes, layout WORD_SLOTS). Rows are stored in 32 x 32-byte tiles; a K step loads its
weights tile by tile as int32 words (a warp's 16-byte copies read 512 contiguous bytes) and one scale word per
(row, block), broadcast in registers. On the GPU an inline-PTX routine turns each word into 8 scaled bf16
values: 1 to 4 integer ops per value pair build the bit pattern, one bf16x2 FMA applies the block scale,
which carries the 2^126 of the bit trick; the CPU interpreter computes the same values in fp32. Products
FP4 x block scale are exact in bf16; the fp32 accumulator is divided by the NVFP4 per-expert global
multiplier, so nothing is rounded that the format did not round.
"""

from __future__ import annotations

import triton
import triton.language as tl

from backends.layouts import triton_moe as _layout

#: The weights' contiguous tiles (backends.layouts.triton_moe._tile_rows): rows x bytes.
TILE_ROWS: tl.constexpr = tl.constexpr(_layout.TILE_ROWS)
TILE_BYTES: tl.constexpr = tl.constexpr(_layout.TILE_BYTES)

ACT_SILU = 0
ACT_SWIGLUOAI = 1


# E2M1 words -> 8 bf16, one asm instance per 32-bit weight word (backends.layouts.triton_moe._encode_words):
# each 16-bit lane l holds the codes of 4 values, bits [s e1 e0 m] at
#   A (low half, word byte l):     s 15, e1e0m 8-6      -> and                                   (1 op)
#   B (low half, word byte 2+l):   s 12, e1e0m 5-3      -> shl 3, and                            (2 ops)
#   C (high half, word byte l):    s 14, e1e0m 2-0      -> and, mul by 2^1 + 2^6, and            (3 ops)
#   D (high half, word byte 2+l):  s 13, e1e0m 11-9     -> and, (t << 2 | t >> 3) & mask         (4 ops)
# so that every value lands as the bf16 pattern (s << 15) | (e1e0m << 6) = value * 2^-126 (subnormal for 0.5) in
# its lane of a bf16x2 without byte permutes; no shifted copy reaches a masked bit of the other lane or carries.
# One bf16x2 FMA per pair applies the "folded" scale (2^126 * block scale, exact: <= 6 significant bits).
# $0..$3: low-half values of word bytes 0, 1, 2, 3; $4..$7: the high-half ones; $8: the word; $9 / $10: the folded
# scales of the low / high values.
_E2M1_WORD_BODY = """
.reg .b32 a, b, c, d, t, u, nz, slo, shi;
mov.b32 nz, 0x80008000;
mov.b32 slo, {$9, $9};
mov.b32 shi, {$10, $10};
and.b32 a, $8, 0x81C081C0;
shl.b32 b, $8, 3; and.b32 b, b, 0x81C081C0;
and.b32 c, $8, 0x40074007; mul.lo.u32 c, c, 0x42; and.b32 c, c, 0x81C081C0;
and.b32 t, $8, 0x2E002E00; shl.b32 u, t, 2; shr.u32 t, t, 3; or.b32 d, u, t; and.b32 d, d, 0x81C081C0;
"""
_E2M1_WORD_FOLDED = """
fma.rn.bf16x2 a, a, slo, nz; fma.rn.bf16x2 b, b, slo, nz;
fma.rn.bf16x2 c, c, shi, nz; fma.rn.bf16x2 d, d, shi, nz;
"""
# Unfolded (MXFP4 scales above 2, whose folded value 2^126 * scale leaves bf16's range): first times 2^126, then
# the block scale itself (two exact FMAs).
_E2M1_WORD_UNFOLDED = """
.reg .b32 k126;
mov.b32 k126, 0x7E807E80;
fma.rn.bf16x2 a, a, k126, nz; fma.rn.bf16x2 b, b, k126, nz;
fma.rn.bf16x2 c, c, k126, nz; fma.rn.bf16x2 d, d, k126, nz;
""" + _E2M1_WORD_FOLDED
_E2M1_WORD_OUT = """
mov.b32 {$0, $1}, a; mov.b32 {$2, $3}, b; mov.b32 {$4, $5}, c; mov.b32 {$6, $7}, d;
"""
# The routines first waiting for the warpgroup's wgmmas (see _dequant_words, RETIRE_WGMMA).
_RETIRE_WGMMA_PTX = "wgmma.wait_group.sync.aligned 0;"
_E2M1_WORD_ASM = tl.constexpr("{" + _E2M1_WORD_BODY + _E2M1_WORD_FOLDED + _E2M1_WORD_OUT + "}")
_E2M1_WORD_UNFOLDED_ASM = tl.constexpr("{" + _E2M1_WORD_BODY + _E2M1_WORD_UNFOLDED + _E2M1_WORD_OUT + "}")
_E2M1_WORD_RETIRING_ASM = tl.constexpr(_RETIRE_WGMMA_PTX + _E2M1_WORD_ASM.value)
_E2M1_WORD_UNFOLDED_RETIRING_ASM = tl.constexpr(_RETIRE_WGMMA_PTX + _E2M1_WORD_UNFOLDED_ASM.value)

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
def _scaled_code(words, SIGN: tl.constexpr, MAG: tl.constexpr, scale, FOLDED: tl.constexpr):
    """The interpreter's decode of the word slot with sign bit SIGN and magnitude bits MAG..MAG+2 (layout:
    WORD_SLOTS): the asm's bf16 pattern as fp32, times 2^126 unless folded, times the scale, rounded once."""
    value = _e2m1_value_f32(((words >> (SIGN - 3)) & 8) | ((words >> MAG) & 7))
    if not FOLDED:
        value = value * 8.507059173023462e37  # 2^126
    return (value * scale.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def _e2m1_words_asm(words, scale_lo, scale_hi, ASM: tl.constexpr):
    return tl.inline_asm_elementwise(ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [words, scale_lo, scale_hi],
                                     dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)


@triton.jit
def _dequant_words(words, scale_lo, scale_hi, FOLDED: tl.constexpr, USE_ASM: tl.constexpr,
                   RETIRE_WGMMA: tl.constexpr = False):
    """int32 weight words -> 8 bf16 tensors: the low-half values of the word's bytes 0-3, then the high-half ones.

    RETIRE_WGMMA (register-operand wgmma tiles): each routine first waits for the warpgroup's wgmmas. Triton 3.6
    leaves a K step's last wgmma in flight into the next step, whose dequantization then rewrites the registers
    that wgmma reads (PTX: undefined; seen on an H200 as wrong, run-to-run varying sums): the wait puts every
    write of those registers after it. Only the first wait of a step waits; the others find nothing in flight.
    """
    if USE_ASM:
        if FOLDED:
            if RETIRE_WGMMA:
                e0, e1, e2, e3, e4, e5, e6, e7 = _e2m1_words_asm(words, scale_lo, scale_hi, _E2M1_WORD_RETIRING_ASM)
            else:
                e0, e1, e2, e3, e4, e5, e6, e7 = _e2m1_words_asm(words, scale_lo, scale_hi, _E2M1_WORD_ASM)
        elif RETIRE_WGMMA:
            e0, e1, e2, e3, e4, e5, e6, e7 = _e2m1_words_asm(words, scale_lo, scale_hi,
                                                             _E2M1_WORD_UNFOLDED_RETIRING_ASM)
        else:
            e0, e1, e2, e3, e4, e5, e6, e7 = _e2m1_words_asm(words, scale_lo, scale_hi, _E2M1_WORD_UNFOLDED_ASM)
    else:  # the CPU interpreter cannot run PTX: the same products in fp32 (each exact), rounded once; the
        # (sign, magnitude) bits are WORD_SLOTS' (triton_moe_scale_probe checks this path and the asm against it)
        e0 = _scaled_code(words, 15, 6, scale_lo, FOLDED)
        e1 = _scaled_code(words, 31, 22, scale_lo, FOLDED)
        e2 = _scaled_code(words, 12, 3, scale_lo, FOLDED)
        e3 = _scaled_code(words, 28, 19, scale_lo, FOLDED)
        e4 = _scaled_code(words, 14, 0, scale_hi, FOLDED)
        e5 = _scaled_code(words, 30, 16, scale_hi, FOLDED)
        e6 = _scaled_code(words, 13, 9, scale_hi, FOLDED)
        e7 = _scaled_code(words, 29, 25, scale_hi, FOLDED)
    return e0, e1, e2, e3, e4, e5, e6, e7


@triton.jit
def _weight_rows(w_expert, rows, stride_wn):
    """Byte pointers to each row's first tile (layout: TILE_ROWS x TILE_BYTES tiles, a row group's tiles in K
    order); _weight_tile adds the K offset. stride_wn: bytes per row (K/2)."""
    rows = rows.to(tl.int64)
    return w_expert + (rows // TILE_ROWS) * (TILE_ROWS * stride_wn) + (rows % TILE_ROWS) * TILE_BYTES


@triton.jit
def _per_word(scale, ROWS: tl.constexpr, NSUB: tl.constexpr, WORDS: tl.constexpr):
    """[ROWS, NSUB] block scales -> [ROWS, WORDS]: each word's (a stored 16-byte run lies inside one block)."""
    return tl.reshape(tl.broadcast_to(scale[:, :, None], (ROWS, NSUB, WORDS // NSUB)), (ROWS, WORDS))


@triton.jit
def _words_to_bytes(e0, e1, e2, e3):
    """Four [..., W] tensors (a word's bytes 0..3) -> [..., W, 2, 2], bytes 0..3 in row-major order (joins keep
    them in-thread)."""
    return tl.join(tl.join(e0, e2), tl.join(e1, e3))


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
def _scale_pair(x, NVFP4: tl.constexpr, FOLDED: tl.constexpr, USE_ASM: tl.constexpr, FP8: tl.constexpr = False,
                row_factor=1.0):
    """A scale word shifted so that its low byte is the low values' scale -> (low, high) bf16 factors that
    _dequant_words applies; the high values' scale is the byte 32 // SCALE_BLOCK further (NVFP4: 2, MXFP4: 1).

    FP8 (W4A8) NVFP4: the unfolded factor s * 2^-r of each row (row_factor [ROWS] = 2^(60 - r), see
    _e4m3_times_2_60), exact in bf16 (4 significant bits); MXFP4's rebased E8M0 bytes need nothing here."""
    if FP8 and NVFP4:
        lo = (_e4m3_times_2_60(x) * row_factor[:, None]).to(tl.bfloat16)
        hi = (_e4m3_times_2_60(x >> 16) * row_factor[:, None]).to(tl.bfloat16)
    elif NVFP4:
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
def _e4m3_times_2_60(s):
    """E4M3 byte (int32, bits above the low byte ignored) -> fp32 scale * 2^-60, exact (subnormals included): the
    bits as fp32 are scale * 2^-120."""
    bits = (((s & 0x80) << 24) | ((s & 0x7F) << 20)).to(tl.float32, bitcast=True)
    return bits * 1.152921504606847e18  # 2^60


@triton.jit
def _pow2(e):
    """2^e as fp32 for int32 e in [-126, 127], from the exponent bits (exact)."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _to_e4m3(v, INTERPRETED: tl.constexpr):
    """v rounded to FP8 E4M3, nearest even, saturated at +-448: float8e4nv on the GPU (cvt.rn.satfinite, which
    saturates by itself; a NaN stays NaN); the CPU interpreter's cast neither rounds nor saturates, so there the
    value is clamped and rounded in fp32 bits and returned as fp32 (its dots run in fp32 anyway, DOT_FP32)."""
    if INTERPRETED:
        v = tl.minimum(tl.maximum(v.to(tl.float32), -448.0), 448.0)
        bits = v.to(tl.int32, bitcast=True)
        normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576).to(tl.float32, bitcast=True)  # 3 mantissa bits
        sub = (tl.abs(v) + 16384.0) - 16384.0  # multiples of 2^-9 (the fp32 ulp of 2^14), nearest even
        out = tl.where(tl.abs(v) >= 0.015625, normal, tl.where(v < 0, -sub, sub))
    else:
        out = v.to(tl.float32).to(tl.float8e4nv)
    return out


@triton.jit
def _scale_bf16(s, FOLDED: tl.constexpr):
    """MXFP4 scale byte (int32, bits above the low byte ignored) -> the bf16 factor _dequant_words applies (exact).

    E8M0 e, scale 2^(e-127): folded 2^126 * scale = 2^(e-1), valid for e <= 128 (forward.py checks);
    unfolded 2^(e-127) (e = 0: the bf16 subnormal 2^-127; both give the same products).
    """
    s = s & 0xFF
    if FOLDED:
        return ((s + 126) << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return tl.where(s == 0, 0x40, s << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _to_k_order(t, ROWS: tl.constexpr, COLS: tl.constexpr):
    """[ROWS, COLS] in the stored byte order of backends.layouts.triton_moe (each 16-wide run holds K
    0,1,8,9, 2,3,10,11, ...) -> K order. On a wgmma operand this is free: it is the register layout."""
    return tl.reshape(tl.permute(tl.reshape(t, (ROWS, COLS // 16, 4, 2, 2)), (0, 1, 3, 2, 4)), (ROWS, COLS))


@triton.jit
def _to_stored_order(t, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Inverse of _to_k_order."""
    return tl.reshape(tl.permute(tl.reshape(t, (ROWS, COLS // 16, 2, 4, 2)), (0, 1, 3, 2, 4)), (ROWS, COLS))


@triton.jit
def _weight_tile(w_rows, words_ptr, stride_sc, k0, row_ok, K: tl.constexpr, BLOCK_K: tl.constexpr,
                 SCALE_BLOCK: tl.constexpr, NVFP4: tl.constexpr, FOLDED: tl.constexpr, EVEN_K: tl.constexpr,
                 STORED_K_ORDER: tl.constexpr, RETIRE_WGMMA: tl.constexpr, USE_ASM: tl.constexpr,
                 FP8: tl.constexpr = False, row_factor=1.0):
    """One K step of ROWS weight rows -> (low, high) bf16 [ROWS, BLOCK_K/2]: column b of both matches the
    activation columns of _act_halves (K byte b: value k = k0 + 64*(b//32) + b%32, and k + 32; with
    STORED_K_ORDER the columns stay in the stored byte order and _act_halves permutes the activations alike).

    The weights load as int32 words [tiles, ROWS, words per tile] (layout: TILE_ROWS x TILE_BYTES tiles, so a
    warp's 16-byte copies cover consecutive rows of one tile: 512 contiguous bytes), viewed as [ROWS, words] for
    one asm routine per word; the scales as one word per (row, scale block of the low values), broadcast in
    registers (a stored 16-byte run lies inside one scale block, so either order sees the same scale per column).
    FP8 (W4A8): the values are W * 2^-r (rebased scales, see _scale_pair), rounded to E4M3 (_to_e4m3).
    """
    HALF: tl.constexpr = BLOCK_K // 2
    NSUB: tl.constexpr = HALF // SCALE_BLOCK  # scale blocks among a step's low values
    WORDS: tl.constexpr = HALF // 4
    NKT: tl.constexpr = HALF // TILE_BYTES  # the weight tiles a row crosses in one step
    TILE_WORDS: tl.constexpr = TILE_BYTES // 4
    j = tl.arange(0, NSUB)
    kt = k0 // (2 * TILE_BYTES) + tl.arange(0, NKT)
    j_first = 64 * ((j * SCALE_BLOCK) // 32) + (j * SCALE_BLOCK) % 32  # sub-block j's first low value in the step
    k_first = k0 + j_first
    block_lo = k_first // SCALE_BLOCK  # its scale block; the high values' block is 32 // SCALE_BLOCK further
    if BLOCK_K % (4 * SCALE_BLOCK) == 0:  # steps start on scale words (k0 is a multiple of BLOCK_K): a known byte
        scale_byte = (j_first // SCALE_BLOCK) % 4
    else:  # MXFP4 with 64-wide steps: two steps share a word
        scale_byte = block_lo % 4
    # [tiles, rows, words]: the rows of one tile are contiguous in memory, so a warp's threads read one run
    w_ptrs = (w_rows.to(tl.pointer_type(tl.int32))[None, :, None] + (kt * (TILE_ROWS * TILE_WORDS))[:, None, None]
              + tl.arange(0, TILE_WORDS)[None, None, :])
    s_ptrs = words_ptr[:, None] + (block_lo // 4)[None, :] * stride_sc
    if EVEN_K:
        tiles = tl.load(w_ptrs, mask=row_ok[None, :, None], other=0)
        scales = tl.load(s_ptrs, mask=row_ok[:, None], other=0)
    else:
        tiles = tl.load(w_ptrs, mask=row_ok[None, :, None] & (kt < K // (2 * TILE_BYTES))[:, None, None], other=0)
        scales = tl.load(s_ptrs, mask=row_ok[:, None] & (k_first < K)[None, :], other=0)
    ROWS: tl.constexpr = tiles.shape[1]
    words = tl.reshape(tl.permute(tiles, (1, 0, 2)), (ROWS, WORDS))
    scale_lo, scale_hi = _scale_pair(scales >> (8 * scale_byte)[None, :], NVFP4, FOLDED, USE_ASM, FP8, row_factor)
    e0, e1, e2, e3, e4, e5, e6, e7 = _dequant_words(
        words, _per_word(scale_lo, ROWS, NSUB, WORDS), _per_word(scale_hi, ROWS, NSUB, WORDS), FOLDED, USE_ASM,
        RETIRE_WGMMA)
    lo = tl.reshape(_words_to_bytes(e0, e1, e2, e3), (ROWS, HALF))
    hi = tl.reshape(_words_to_bytes(e4, e5, e6, e7), (ROWS, HALF))
    if FP8:
        lo = _to_e4m3(lo, not USE_ASM)
        hi = _to_e4m3(hi, not USE_ASM)
    if not STORED_K_ORDER:
        lo = _to_k_order(lo, ROWS, HALF)
        hi = _to_k_order(hi, ROWS, HALF)
    return lo, hi


@triton.jit
def _act_halves(a_rows, k0, row_ok, K: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                STORED_K_ORDER: tl.constexpr):
    """Activation columns matching _weight_tile's (low, high) halves: [ROWS, BLOCK_K/2] each, loaded in K
    order (16-byte copies); STORED_K_ORDER permutes them in registers to the weights' stored order."""
    b = tl.arange(0, BLOCK_K // 2)
    col = k0 + 64 * (b // 32) + b % 32
    if EVEN_K:
        mask = row_ok[:, None]
    else:
        mask = row_ok[:, None] & (col < K)[None, :]
    lo = tl.load(a_rows[:, None] + col[None, :], mask=mask, other=0.0)
    hi = tl.load(a_rows[:, None] + (col + 32)[None, :], mask=mask, other=0.0)
    if STORED_K_ORDER:
        ROWS: tl.constexpr = lo.shape[0]
        lo = _to_stored_order(lo, ROWS, BLOCK_K // 2)
        hi = _to_stored_order(hi, ROWS, BLOCK_K // 2)
    return lo, hi


@triton.jit
def _row_factor(r_ptrs, ok, NEEDED: tl.constexpr):
    """2^(60 - r) per weight row ([rows] fp32), the factor _scale_pair puts into W4A8 NVFP4 block scales; 1.0 when
    not NEEDED (W4A16, or MXFP4 whose rebased E8M0 bytes carry 2^-r)."""
    factor = 1.0
    if NEEDED:
        factor = _pow2(60 - tl.load(r_ptrs, mask=ok, other=0))
    return factor


@triton.jit
def _mx_exp(amax):
    """MXFP8 block exponent of a block's fp32 amax: floor(log2(amax)) - 8 (E4M3's emax), clamped to [-127, 127], as
    formats.quantize_mxfp8 (the exponent field; 0 and subnormals count as -127)."""
    return tl.minimum(tl.maximum(((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 135, -127), 127)


@triton.jit
def _pow2_from_m127(e):
    """2^e as fp32 for int32 e in [-127, 126] (2^-127 is subnormal: built as 2^(e+1) / 2, exact)."""
    return _pow2(e + 1) * 0.5


@triton.jit
def _rescale_groups(t, shift, INTERPRETED: tl.constexpr):
    """[ROWS, G * 32] E4M3 values, each 32-column group times 2^shift[row, group] (shift <= 0; below -126 every
    value rounds to 0 anyway), rounded to E4M3: the per-row rebase of MXFP8 data."""
    ROWS: tl.constexpr = t.shape[0]
    COLS: tl.constexpr = t.shape[1]
    g = tl.reshape(t.to(tl.float32), (ROWS, COLS // 32, 32))
    g = g * _pow2(tl.maximum(shift, -126))[:, :, None]
    return tl.reshape(_to_e4m3(g, INTERPRETED), (ROWS, COLS))


@triton.jit
def _mx_quant_rebased(t, ra, INTERPRETED: tl.constexpr):
    """[ROWS, G * 32] activations (any float) -> the W4A8 'mxfp8' operand: each 32-column group (one MX block, in
    either K order: the stored order permutes within 16-column runs) quantized to MXFP8 (E4M3 of t / 2^se), then
    rebased to the row's exponent ra [ROWS] (formats.mxfp8_row_rebased)."""
    ROWS: tl.constexpr = t.shape[0]
    COLS: tl.constexpr = t.shape[1]
    g = tl.reshape(t.to(tl.float32), (ROWS, COLS // 32, 32))
    se = _mx_exp(tl.max(tl.abs(g), axis=2))
    elem = _to_e4m3(g * _pow2(-se)[:, :, None], INTERPRETED)
    return _rescale_groups(tl.reshape(elem, (ROWS, COLS)), se - ra[:, None], INTERPRETED)


@triton.jit
def _row_mx_exp(x_rows, row_ok, K: tl.constexpr):
    """ra [ROWS]: the largest MXFP8 block exponent of each activation row (= _mx_exp of the row's amax), the GEMM1
    prologue of act_quant 'mxfp8': one read of the tile's rows of x."""
    CHUNK: tl.constexpr = 256
    ROWS: tl.constexpr = x_rows.shape[0]
    amax = tl.zeros((ROWS,), dtype=tl.float32)
    for c0 in range(0, K, CHUNK):
        cols = c0 + tl.arange(0, CHUNK)
        v = tl.load(x_rows[:, None] + cols[None, :], mask=row_ok[:, None] & (cols < K)[None, :], other=0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(v.to(tl.float32)), axis=1))
    return _mx_exp(amax)


@triton.jit
def _row_scale_max(hs_rows, row_ok, NB: tl.constexpr):
    """ra [ROWS]: the largest E8M0 exponent among a row's NB block scales of h (GEMM2's prologue, act_quant
    'mxfp8'; the scales come from GEMM1's epilogue)."""
    CHUNK: tl.constexpr = 64
    ROWS: tl.constexpr = hs_rows.shape[0]
    top = tl.zeros((ROWS,), dtype=tl.int32)
    for c0 in range(0, NB, CHUNK):
        cols = c0 + tl.arange(0, CHUNK)
        b = tl.load(hs_rows[:, None] + cols[None, :], mask=row_ok[:, None] & (cols < NB)[None, :], other=0)
        top = tl.maximum(top, tl.max(b.to(tl.int32), axis=1))
    return top - 127


@triton.jit
def _quant_act(lo, hi, a_inv, A_QUANT: tl.constexpr, INTERPRETED: tl.constexpr, ra=0, hs_rows=None, k0=0,
               row_ok=None, K: tl.constexpr = 0):
    """The activation operand of a W4A8 dot, from the tile as loaded (no pass over the activations before):
    A_QUANT 1 (GEMM1, static per-tensor) e4m3(clamp(x * (1 / a1), +-448)); 2 (GEMM1, mxfp8) MXFP8 of x rebased to
    the row's exponent ra; 3 (GEMM2, mxfp8) the stored MXFP8 h (E4M3 codes, E8M0 bytes at hs_rows) rebased to ra;
    0: as loaded (W4A16, and GEMM2's static E4M3 h)."""
    if A_QUANT == 1:
        lo = _to_e4m3(lo.to(tl.float32) * a_inv, INTERPRETED)
        hi = _to_e4m3(hi.to(tl.float32) * a_inv, INTERPRETED)
    elif A_QUANT == 2:
        lo = _mx_quant_rebased(lo, ra, INTERPRETED)
        hi = _mx_quant_rebased(hi, ra, INTERPRETED)
    elif A_QUANT == 3:  # low half: the step's even 32-blocks (k0 / 32 + 2j), high half: the odd ones
        NBH: tl.constexpr = lo.shape[1] // 32
        blk = k0 // 32 + 2 * tl.arange(0, NBH)
        ok = row_ok[:, None] & (blk < K // 32)[None, :]
        s_lo = tl.load(hs_rows[:, None] + blk[None, :], mask=ok, other=0).to(tl.int32) - 127
        s_hi = tl.load(hs_rows[:, None] + (blk + 1)[None, :], mask=ok, other=0).to(tl.int32) - 127
        lo = _rescale_groups(lo, s_lo - ra[:, None], INTERPRETED)
        hi = _rescale_groups(hi, s_hi - ra[:, None], INTERPRETED)
    return lo, hi


@triton.jit
def _round_bf16(v, INTERPRETED: tl.constexpr):
    """fp32 -> bf16 rounded to nearest even; the CPU interpreter truncates casts, so round the bits there."""
    if INTERPRETED:
        bits = v.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        v = bits.to(tl.float32, bitcast=True)
    return v.to(tl.bfloat16)


#: W4A8 dots: K values a Hopper FP8 wgmma may sum in the tensor core's own accumulator before Triton adds its result
#: to the fp32 one (tl.dot's max_num_imprecise_acc). That accumulator keeps fewer bits than fp32; Triton's default on
#: SM90 (never promote) measured 0.6-1.8% relative L2 error against the fp32-summed emulation on the gpt-oss-120b and
#: DeepSeek-V3 layers of an H100. 32 (one wgmma K step) sums every step in fp32.
FP8_PROMOTE_EVERY: tl.constexpr = tl.constexpr(32)


@triton.jit
def _mma(acc, a, w, SWAP_AB: tl.constexpr, DOT_FP32: tl.constexpr):
    """acc += a @ w^T ([BM, BN]) or, swapped, w @ a^T ([BN, BM]) so weights fill the MMA's M side."""
    if DOT_FP32:  # CPU interpreter: its bf16 dot is wrong (triton 3.9); the operands are bf16-exact anyway
        a = a.to(tl.float32)
        w = w.to(tl.float32)
    if a.dtype == tl.float8e4nv:  # W4A8: every wgmma's sum added to the fp32 accumulator (FP8_PROMOTE_EVERY)
        if SWAP_AB:
            acc = tl.dot(w, tl.trans(a), acc, max_num_imprecise_acc=FP8_PROMOTE_EVERY)
        else:
            acc = tl.dot(a, tl.trans(w), acc, max_num_imprecise_acc=FP8_PROMOTE_EVERY)
    elif SWAP_AB:  # one return: triton 3.6 compiles both returns of an early-return constexpr branch
        acc = tl.dot(w, tl.trans(a), acc)
    else:
        acc = tl.dot(a, tl.trans(w), acc)
    return acc


@triton.jit
def _accumulate_k(a_rows, row_ok, w_rows, s_ptrs, w_ok, stride_sc, k_base, K: tl.constexpr, K_SPLIT: tl.constexpr,
                  BLOCK_M: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, SCALE_BLOCK: tl.constexpr,
                  NVFP4: tl.constexpr, FOLDED: tl.constexpr, EVEN_K: tl.constexpr, SWAP_AB: tl.constexpr,
                  STORED_K_ORDER: tl.constexpr, RETIRE_WGMMA: tl.constexpr, DOT_FP32: tl.constexpr,
                  USE_ASM: tl.constexpr, FP8: tl.constexpr = False, A_QUANT: tl.constexpr = 0, a_inv=1.0,
                  row_factor=1.0, ra=0, hs_rows=None):
    """fp32 [BLOCK_M, ROWS]: the activation rows times ROWS weight rows over this program's K slice, one weight tile
    per step (GEMM2, and GEMM1 with its gate and up rows stacked). FP8: E4M3 operands (_weight_tile, _quant_act)."""
    acc = _zero_acc(BLOCK_M, ROWS, SWAP_AB)
    for k_step in range(0, K_SPLIT, BLOCK_K):
        k0 = k_base + k_step
        a_lo, a_hi = _act_halves(a_rows, k0, row_ok, K, BLOCK_K, EVEN_K, STORED_K_ORDER)
        a_lo, a_hi = _quant_act(a_lo, a_hi, a_inv, A_QUANT, DOT_FP32, ra, hs_rows, k0, row_ok, K)
        w_lo, w_hi = _weight_tile(w_rows, s_ptrs, stride_sc, k0, w_ok, K, BLOCK_K,
                                  SCALE_BLOCK, NVFP4, FOLDED, EVEN_K, STORED_K_ORDER, RETIRE_WGMMA, USE_ASM,
                                  FP8, row_factor)
        acc = _mma(_mma(acc, a_lo, w_lo, SWAP_AB, DOT_FP32), a_hi, w_hi, SWAP_AB, DOT_FP32)
    if SWAP_AB:
        acc = tl.trans(acc)
    return acc


@triton.jit
def _act_store(acc_g, acc_u, expert, offs_m, offs_n, col_ok, store_ok, gs_ptr, bias_ptr, h_ptr, N: tl.constexpr,
               stride_be, stride_hm, alpha, beta, limit, NVFP4: tl.constexpr, ACTIVATION: tl.constexpr,
               HAS_BIAS: tl.constexpr, INTERPRETED: tl.constexpr, ACT_QUANT: tl.constexpr = 0, rexp_ptr=None,
               stride_re=0, qscale_ptr=None, hs_ptr=None, stride_hsm=0):
    """GEMM1's epilogue on full-K fp32 sums [rows, cols]: global scale, bias, activation, bf16 store to h.

    ACT_QUANT (W4A8): the FP8 dots' sums times 2^r of each weight row and the input scale a1 (qscale[0]), the NVFP4
    global scale; h stored as E4M3 codes of clamp(act * (1 / a2), +-448) (qscale[3]), GEMM2's operand. ACT_QUANT 2
    (mxfp8; the rows' 2^ra already applied): h stored as MXFP8, E4M3 codes and one E8M0 byte per 32 columns (hs)."""
    if ACT_QUANT != 0:
        r_ptrs = rexp_ptr + expert * stride_re + offs_n
        a1 = 1.0
        if ACT_QUANT == 1:
            a1 = tl.load(qscale_ptr)
        acc_g = acc_g * (_pow2(tl.load(r_ptrs, mask=col_ok, other=0)) * a1)[None, :]
        acc_u = acc_u * (_pow2(tl.load(r_ptrs + N, mask=col_ok, other=0)) * a1)[None, :]
        if NVFP4:
            global_scale = tl.load(gs_ptr + expert)
            acc_g = acc_g / global_scale
            acc_u = acc_u / global_scale
    elif NVFP4:  # the dequantized weights carry 2^-NVFP4_FOLD_SHIFT (see _scale_pair): undo it, exactly
        global_scale = tl.load(gs_ptr + expert)
        acc_g = acc_g * 65536.0 / global_scale
        acc_u = acc_u * 65536.0 / global_scale
    if HAS_BIAS:
        b_ptrs = bias_ptr + expert * stride_be + offs_n
        acc_g += tl.load(b_ptrs, mask=col_ok, other=0.0)[None, :]
        acc_u += tl.load(b_ptrs + N, mask=col_ok, other=0.0)[None, :]
    if ACTIVATION == 1:  # gpt-oss swigluoai: clamp gate from above, up both ways, (up + beta) * glu
        acc_g = tl.minimum(acc_g, limit)
        acc_u = tl.minimum(tl.maximum(acc_u, -limit), limit)
        h = (acc_u + beta) * acc_g / (1.0 + tl.exp(-alpha * acc_g))
    else:  # silu-and-mul
        h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    h_ptrs = h_ptr + offs_m.to(tl.int64)[:, None] * stride_hm + offs_n[None, :]
    if ACT_QUANT == 1:
        tl.store(h_ptrs, _to_e4m3(h * tl.load(qscale_ptr + 3), INTERPRETED).to(tl.float8e4nv), mask=store_ok)
    elif ACT_QUANT == 2:
        ROWS: tl.constexpr = h.shape[0]
        COLS: tl.constexpr = h.shape[1]
        g = tl.reshape(h, (ROWS, COLS // 32, 32))
        se = _mx_exp(tl.max(tl.abs(g), axis=2))
        elem = tl.reshape(_to_e4m3(g * _pow2(-se)[:, :, None], INTERPRETED), (ROWS, COLS))
        tl.store(h_ptrs, elem.to(tl.float8e4nv), mask=store_ok)
        blk = tl.max(tl.reshape(offs_n, (COLS // 32, 32)), axis=1) // 32
        tl.store(hs_ptr + offs_m.to(tl.int64)[:, None] * stride_hsm + blk[None, :], (se + 127).to(tl.uint8),
                 mask=(blk < N // 32)[None, :])
    else:
        tl.store(h_ptrs, _round_bf16(h, INTERPRETED), mask=store_ok)


@triton.jit
def _tile_ids(num_m_blocks, n_size, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped ordering: GROUP_M row blocks walk all column blocks together (weight tiles reused in L2)."""
    pid = tl.program_id(0)
    num_n = (n_size + BLOCK_N - 1) // BLOCK_N
    per_group = GROUP_M * num_n
    group = pid // per_group
    first_m = group * GROUP_M
    group_rows = tl.minimum(num_m_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def _block_rows(pid_m, pid_n, block_expert_ptr, sorted_pair_ptr, num_pairs, N: tl.constexpr, K_SPLIT: tl.constexpr,
                SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    """The GEMMs' shared prologue: expert, row indices and pairs, columns, and the K slice's start."""
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, ROWS)
    pair = tl.load(sorted_pair_ptr + offs_m)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_base = 0  # split-K: slice program_id(1), K_SPLIT wide (see _k_split in forward.py)
    if SPLIT_K > 1:
        k_base = tl.program_id(1) * K_SPLIT
    return expert, offs_m, pair, pair < num_pairs, offs_n, offs_n < N, k_base


@triton.jit
def _zero_acc(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr):
    if SWAP_AB:  # weights on the MMA's M side: the accumulator is [columns, rows] until the epilogue
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:  # one return (see _mma)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    return acc


@triton.jit
def _gemm1_tile(
    pid_m, pid_n, ROWS: tl.constexpr,
    x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, h_ptr, part_ptr, ticket_ptr,
    sorted_pair_ptr, block_expert_ptr, padded_total_ptr,
    num_pairs, num_m_blocks, K: tl.constexpr, N: tl.constexpr,
    stride_xm, stride_we, stride_wn, stride_se, stride_sc, stride_be, stride_hm, stride_ps, stride_pm,
    alpha, beta, limit, SPLIT_K: tl.constexpr, K_SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
    LAST_SLICE_ACTIVATES: tl.constexpr,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SCALE_BLOCK: tl.constexpr, NVFP4: tl.constexpr, FOLDED: tl.constexpr,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, SWAP_AB: tl.constexpr, STORED_K_ORDER: tl.constexpr,
    RETIRE_WGMMA: tl.constexpr, DOT_FP32: tl.constexpr, USE_ASM: tl.constexpr, STACK_GATE_UP: tl.constexpr,
    ACT_QUANT: tl.constexpr, rexp_ptr, stride_re, qscale_ptr, hs_ptr, stride_hsm,
):
    """gemm1_act_kernel's tile: the first ROWS rows of row block pid_m (ROWS = BLOCK_M, or half of it)."""
    expert, offs_m, pair, row_ok, offs_n, col_ok, k_base = _block_rows(
        pid_m, pid_n, block_expert_ptr, sorted_pair_ptr, num_pairs, N, K_SPLIT, SPLIT_K, BLOCK_M, BLOCK_N, ROWS)
    x_rows = x_ptr + (pair // TOP_K).to(tl.int64) * stride_xm
    FP8: tl.constexpr = ACT_QUANT != 0
    a_inv = 1.0
    if ACT_QUANT == 1:
        a_inv = tl.load(qscale_ptr + 1)
    ra = 0
    if ACT_QUANT == 2:
        ra = _row_mx_exp(x_rows, row_ok, K)
    if STACK_GATE_UP:
        # one [2 * BLOCK_N]-row weight tile: the tile's gate rows, then its up rows (one dot per half-step)
        r = tl.arange(0, 2 * BLOCK_N)
        w_col = pid_n * BLOCK_N + r % BLOCK_N
        w_row = w_col + (r // BLOCK_N) * N
        w_rows = _weight_rows(w_ptr + expert * stride_we, w_row, stride_wn)
        s_ptrs = s_ptr + expert * stride_se + w_row
        row_factor = _row_factor(rexp_ptr + expert * stride_re + w_row, w_col < N, FP8 and NVFP4)
        acc = _accumulate_k(x_rows, row_ok, w_rows, s_ptrs, w_col < N, stride_sc, k_base, K, K_SPLIT, ROWS,
                            2 * BLOCK_N, BLOCK_K, SCALE_BLOCK, NVFP4, FOLDED, EVEN_K, SWAP_AB, STORED_K_ORDER,
                            RETIRE_WGMMA, DOT_FP32, USE_ASM, FP8, ACT_QUANT, a_inv, row_factor, ra)
        acc_g, acc_u = tl.split(tl.permute(tl.reshape(acc, (ROWS, 2, BLOCK_N)), (0, 2, 1)))
    else:
        wg_rows = _weight_rows(w_ptr + expert * stride_we, offs_n, stride_wn)
        wu_rows = _weight_rows(w_ptr + expert * stride_we, offs_n + N, stride_wn)
        sg_ptrs = s_ptr + expert * stride_se + offs_n
        su_ptrs = sg_ptrs + N
        g_factor = _row_factor(rexp_ptr + expert * stride_re + offs_n, col_ok, FP8 and NVFP4)
        u_factor = _row_factor(rexp_ptr + expert * stride_re + N + offs_n, col_ok, FP8 and NVFP4)
        acc_g = _zero_acc(ROWS, BLOCK_N, SWAP_AB)
        acc_u = _zero_acc(ROWS, BLOCK_N, SWAP_AB)
        for k_step in range(0, K_SPLIT, BLOCK_K):
            k0 = k_base + k_step
            a_lo, a_hi = _act_halves(x_rows, k0, row_ok, K, BLOCK_K, EVEN_K, STORED_K_ORDER)
            a_lo, a_hi = _quant_act(a_lo, a_hi, a_inv, ACT_QUANT, DOT_FP32, ra)
            g_lo, g_hi = _weight_tile(wg_rows, sg_ptrs, stride_sc, k0, col_ok, K, BLOCK_K,
                                      SCALE_BLOCK, NVFP4, FOLDED, EVEN_K, STORED_K_ORDER, RETIRE_WGMMA, USE_ASM,
                                      FP8, g_factor)
            u_lo, u_hi = _weight_tile(wu_rows, su_ptrs, stride_sc, k0, col_ok, K, BLOCK_K,
                                      SCALE_BLOCK, NVFP4, FOLDED, EVEN_K, STORED_K_ORDER, RETIRE_WGMMA, USE_ASM,
                                      FP8, u_factor)
            acc_g = _mma(_mma(acc_g, a_lo, g_lo, SWAP_AB, DOT_FP32), a_hi, g_hi, SWAP_AB, DOT_FP32)
            acc_u = _mma(_mma(acc_u, a_lo, u_lo, SWAP_AB, DOT_FP32), a_hi, u_hi, SWAP_AB, DOT_FP32)
        if SWAP_AB:
            acc_g = tl.trans(acc_g)
            acc_u = tl.trans(acc_u)
    if ACT_QUANT == 2:  # the rows' 2^ra, exact, before any split-K slice is stored
        acc_g = acc_g * _pow2_from_m127(ra)[:, None]
        acc_u = acc_u * _pow2_from_m127(ra)[:, None]
    if SPLIT_K == 1:
        _act_store(acc_g, acc_u, expert, offs_m, offs_n, col_ok, col_ok[None, :], gs_ptr, bias_ptr, h_ptr, N,
                   stride_be, stride_hm, alpha, beta, limit, NVFP4, ACTIVATION, HAS_BIAS, DOT_FP32, ACT_QUANT,
                   rexp_ptr, stride_re, qscale_ptr, hs_ptr, stride_hsm)
    else:
        p_ptrs = (part_ptr + tl.program_id(1) * stride_ps + offs_m.to(tl.int64)[:, None] * stride_pm
                  + offs_n[None, :])
        ok = row_ok[:, None] & col_ok[None, :]
        tl.store(p_ptrs, acc_g, mask=ok)
        tl.store(p_ptrs + N, acc_u, mask=ok)
        if LAST_SLICE_ACTIVATES:
            # every thread's slice is stored (CTA barrier) before the tile's ticket is drawn (release at GPU scope);
            # the program that draws SPLIT_K - 1 comes after all the others' releases (acquire) and activates
            tl.debug_barrier()
            if tl.atomic_add(ticket_ptr + tl.program_id(0), 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1:
                acc_g, acc_u = _last_slice_sum(part_ptr + offs_m.to(tl.int64)[:, None] * stride_pm + offs_n[None, :],
                                               ok, stride_ps, N, SPLIT_K, ROWS, BLOCK_N)
                _act_store(acc_g, acc_u, expert, offs_m, offs_n, col_ok, ok, gs_ptr, bias_ptr, h_ptr, N,
                           stride_be, stride_hm, alpha, beta, limit, NVFP4, ACTIVATION, HAS_BIAS, DOT_FP32, ACT_QUANT,
                           rexp_ptr, stride_re, qscale_ptr, hs_ptr, stride_hsm)


@triton.jit
def gemm1_act_kernel(
    x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, h_ptr, part_ptr, ticket_ptr,
    sorted_pair_ptr, block_expert_ptr, padded_total_ptr, rexp_ptr, qscale_ptr, hs_ptr,
    num_pairs, num_m_blocks, K: tl.constexpr, N: tl.constexpr,
    stride_xm, stride_we, stride_wn, stride_se, stride_sc, stride_be, stride_hm, stride_ps, stride_pm, stride_re,
    stride_hsm,
    alpha, beta, limit, SPLIT_K: tl.constexpr, K_SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
    LAST_SLICE_ACTIVATES: tl.constexpr,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SCALE_BLOCK: tl.constexpr, NVFP4: tl.constexpr, FOLDED: tl.constexpr,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, SWAP_AB: tl.constexpr, STORED_K_ORDER: tl.constexpr,
    RETIRE_WGMMA: tl.constexpr, DOT_FP32: tl.constexpr, USE_ASM: tl.constexpr, STACK_GATE_UP: tl.constexpr,
    HALF_ROWS: tl.constexpr, ACT_QUANT: tl.constexpr,
):
    """h[row, n] = act(gate, up) for the N=I outputs; w rows [0, N) are gate, [N, 2N) are up.

    SPLIT_K > 1: program (tile, s) sums K slice s only and stores raw fp32 gate/up sums of its real rows
    to part[s, row, 0:N | N:2N]; gemm1_split_epilogue_kernel adds the slices in order s = 0, 1, ... or, with
    LAST_SLICE_ACTIVATES, the tile's program that finishes last does (_last_slice_sum: one launch fewer, same
    bits). Its tickets (int32, one per tile = program_id(0)) must be zero at launch: the alignment zeroes them.

    ACT_QUANT 1 (W4A8, static per-tensor FP8): E4M3 dots, x quantized with 1 / a1 = qscale[1] as it loads, the
    weights rebased per row (rexp: int32 [E, 2N] row exponents; MXFP4's rebased scale words come as s_ptr), h
    written as E4M3 codes (_act_store). 0: W4A16 (rexp_ptr and qscale_ptr unused).
    """
    pid_m, pid_n = _tile_ids(num_m_blocks, N, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(padded_total_ptr):
        return
    half = False  # a block whose expert run fills at most half of it multiplies only that half (HALF_ROWS)
    if HALF_ROWS:
        real = tl.sum((tl.load(sorted_pair_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) < num_pairs).to(tl.int32))
        half = real <= BLOCK_M // 2
    if half:
        _gemm1_tile(pid_m, pid_n, BLOCK_M // 2, x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, h_ptr, part_ptr, ticket_ptr,
            sorted_pair_ptr, block_expert_ptr, padded_total_ptr, num_pairs, num_m_blocks, K, N, stride_xm, stride_we,
            stride_wn, stride_se, stride_sc, stride_be, stride_hm, stride_ps, stride_pm, alpha, beta, limit, SPLIT_K,
            K_SPLIT, EVEN_K, LAST_SLICE_ACTIVATES, TOP_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SCALE_BLOCK, NVFP4,
            FOLDED, ACTIVATION, HAS_BIAS, SWAP_AB, STORED_K_ORDER, RETIRE_WGMMA, DOT_FP32, USE_ASM, STACK_GATE_UP,
            ACT_QUANT, rexp_ptr, stride_re, qscale_ptr, hs_ptr, stride_hsm)
    else:
        _gemm1_tile(pid_m, pid_n, BLOCK_M, x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, h_ptr, part_ptr, ticket_ptr,
            sorted_pair_ptr, block_expert_ptr, padded_total_ptr, num_pairs, num_m_blocks, K, N, stride_xm, stride_we,
            stride_wn, stride_se, stride_sc, stride_be, stride_hm, stride_ps, stride_pm, alpha, beta, limit, SPLIT_K,
            K_SPLIT, EVEN_K, LAST_SLICE_ACTIVATES, TOP_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SCALE_BLOCK, NVFP4,
            FOLDED, ACTIVATION, HAS_BIAS, SWAP_AB, STORED_K_ORDER, RETIRE_WGMMA, DOT_FP32, USE_ASM, STACK_GATE_UP,
            ACT_QUANT, rexp_ptr, stride_re, qscale_ptr, hs_ptr, stride_hsm)



@triton.jit
def _last_slice_sum(p_ptrs, ok, stride_ps, N: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    """(gate, up) = part[0] + part[1] + ... in the order s = 0 .. SPLIT_K - 1, from 0: gemm1_split_epilogue_kernel's
    sum, bit for bit (kept as its own copy there, so that the tests comparing the two paths catch a change of order).
    Loads bypass L1 (.cg): other SMs wrote the slices during this launch."""
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc_g += tl.load(p_ptrs + s * stride_ps, mask=ok, other=0.0, cache_modifier=".cg")
        acc_u += tl.load(p_ptrs + s * stride_ps + N, mask=ok, other=0.0, cache_modifier=".cg")
    return acc_g, acc_u


@triton.jit
def gemm1_split_epilogue_kernel(
    part_ptr, gs_ptr, bias_ptr, h_ptr, sorted_pair_ptr, block_expert_ptr, padded_total_ptr, rexp_ptr, qscale_ptr,
    hs_ptr, num_pairs, N: tl.constexpr, stride_ps, stride_pm, stride_be, stride_hm, stride_re, stride_hsm, alpha, beta,
    limit,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NVFP4: tl.constexpr,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, INTERPRETED: tl.constexpr, ACT_QUANT: tl.constexpr,
):
    """Split-K GEMM1: h = act(sum over s = 0..SPLIT_K-1 of part[s]) in that fixed order (deterministic)."""
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M >= tl.load(padded_total_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = tl.load(sorted_pair_ptr + offs_m) < num_pairs
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = offs_n < N
    ok = row_ok[:, None] & col_ok[None, :]
    p_ptrs = part_ptr + offs_m.to(tl.int64)[:, None] * stride_pm + offs_n[None, :]
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc_g += tl.load(p_ptrs + s * stride_ps, mask=ok, other=0.0)
        acc_u += tl.load(p_ptrs + s * stride_ps + N, mask=ok, other=0.0)
    _act_store(acc_g, acc_u, expert, offs_m, offs_n, col_ok, ok, gs_ptr, bias_ptr, h_ptr, N,
               stride_be, stride_hm, alpha, beta, limit, NVFP4, ACTIVATION, HAS_BIAS, INTERPRETED, ACT_QUANT,
               rexp_ptr, stride_re, qscale_ptr, hs_ptr, stride_hsm)


@triton.jit
def _gemm2_tile(
    pid_m, pid_n, ROWS: tl.constexpr,
    h_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, route_w_ptr, out_ptr, ticket_ptr, y_ptr,
    sorted_pair_ptr, block_expert_ptr, padded_total_ptr,
    num_pairs, num_m_blocks, K: tl.constexpr, N: tl.constexpr,
    stride_hm, stride_we, stride_wn, stride_se, stride_sc, stride_be, stride_om, stride_os, stride_ym,
    SPLIT_K: tl.constexpr, K_SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SCALE_BLOCK: tl.constexpr, NVFP4: tl.constexpr, FOLDED: tl.constexpr, HAS_BIAS: tl.constexpr,
    SWAP_AB: tl.constexpr, STORED_K_ORDER: tl.constexpr, RETIRE_WGMMA: tl.constexpr, DOT_FP32: tl.constexpr,
    USE_ASM: tl.constexpr, LAST_PAIR_SUMS: tl.constexpr, TOP_K: tl.constexpr, ACT_QUANT: tl.constexpr, rexp_ptr,
    stride_re, qscale_ptr, hs_ptr, stride_hsm,
):
    """gemm2_kernel's tile: the first ROWS rows of row block pid_m (ROWS = BLOCK_M, or half of it)."""
    expert, offs_m, pair, row_ok, offs_n, col_ok, k_base = _block_rows(
        pid_m, pid_n, block_expert_ptr, sorted_pair_ptr, num_pairs, N, K_SPLIT, SPLIT_K, BLOCK_M, BLOCK_N, ROWS)
    a_rows = h_ptr + offs_m.to(tl.int64) * stride_hm
    w_rows = _weight_rows(w_ptr + expert * stride_we, offs_n, stride_wn)
    s_ptrs = s_ptr + expert * stride_se + offs_n
    FP8: tl.constexpr = ACT_QUANT != 0
    r_ptrs = rexp_ptr + expert * stride_re + offs_n
    hs_rows = hs_ptr + offs_m.to(tl.int64) * stride_hsm
    ra = 0
    if ACT_QUANT == 2:
        ra = _row_scale_max(hs_rows, row_ok, K // 32)
    acc = _accumulate_k(a_rows, row_ok, w_rows, s_ptrs, col_ok, stride_sc, k_base, K, K_SPLIT, ROWS, BLOCK_N,
                        BLOCK_K, SCALE_BLOCK, NVFP4, FOLDED, EVEN_K, SWAP_AB, STORED_K_ORDER, RETIRE_WGMMA, DOT_FP32,
                        USE_ASM, FP8, 3 if ACT_QUANT == 2 else 0, 1.0, _row_factor(r_ptrs, col_ok, FP8 and NVFP4),
                        ra, hs_rows)
    if FP8:  # the FP8 dots' sums times 2^r of each weight row, the input scale (a2 = qscale[2], or the rows' 2^ra),
        # the global scale
        a2 = 1.0
        if ACT_QUANT == 1:
            a2 = tl.load(qscale_ptr + 2)
        acc = acc * (_pow2(tl.load(r_ptrs, mask=col_ok, other=0)) * a2)[None, :]
        if ACT_QUANT == 2:
            acc = acc * _pow2_from_m127(ra)[:, None]
        if NVFP4:
            acc = acc / tl.load(gs_ptr + expert)
    elif NVFP4:  # undo the 2^-NVFP4_FOLD_SHIFT of the dequantized weights (exact), then the global scale
        acc = acc * 65536.0 / tl.load(gs_ptr + expert)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + expert * stride_be + offs_n, mask=col_ok, other=0.0)
        if SPLIT_K > 1:  # the bias belongs to slice 0 only
            bias = tl.where(tl.program_id(1) == 0, bias, 0.0)
        acc += bias[None, :]
    route_w = tl.load(route_w_ptr + pair, mask=row_ok, other=0.0)
    acc = acc * route_w[:, None]
    out_ptrs = out_ptr + pair.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    if SPLIT_K > 1:
        out_ptrs += tl.program_id(1) * stride_os
    ok = row_ok[:, None] & col_ok[None, :]
    tl.store(out_ptrs, acc, mask=ok)
    if LAST_PAIR_SUMS:
        # every thread's rows are stored (CTA barrier) before each row draws its token's column-tile ticket (release
        # at GPU scope); a row that draws TOP_K * SPLIT_K - 1 comes after all of that token's other slices of this
        # column tile (acquire), so this program sums them: one launch fewer than topk_sum_kernel, the same bits.
        # A row block holds one expert, hence each token at most once: no two programs sum the same token tile.
        tl.debug_barrier()
        token = pair // TOP_K
        drawn = tl.atomic_add(ticket_ptr + token * tl.cdiv(N, BLOCK_N) + pid_n, 1, mask=row_ok, sem="acq_rel",
                              scope="gpu")
        last = row_ok & (drawn == TOP_K * SPLIT_K - 1)
        if tl.max(last.to(tl.int32), axis=0) > 0:
            tl.debug_barrier()
            _topk_sum_store(out_ptr, y_ptr, token, offs_n, last[:, None] & col_ok[None, :], stride_om, stride_os,
                            stride_ym, TOP_K, SPLIT_K, ROWS, BLOCK_N, DOT_FP32)


@triton.jit
def _topk_sum_store(pair_out_ptr, y_ptr, token, offs_n, ok, stride_pm, stride_ps, stride_ym, TOP_K: tl.constexpr,
                    SPLIT_K: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRETED: tl.constexpr):
    """y[token] = sum_j sum_s pair_out[s, token*k + j] for the rows in ok: topk_sum_kernel's order and rounding, bit
    for bit (its own copy there, so that the tests comparing the two paths catch a change of order). Loads bypass L1
    (.cg): other SMs wrote the slices during this launch."""
    first = token.to(tl.int64) * TOP_K
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        for s in tl.static_range(SPLIT_K):
            acc += tl.load(pair_out_ptr + s * stride_ps + (first + j)[:, None] * stride_pm + offs_n[None, :], mask=ok,
                           other=0.0, cache_modifier=".cg")
    tl.store(y_ptr + token.to(tl.int64)[:, None] * stride_ym + offs_n[None, :], _round_bf16(acc, INTERPRETED), mask=ok)


@triton.jit
def gemm2_kernel(
    h_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, route_w_ptr, out_ptr, ticket_ptr, y_ptr,
    sorted_pair_ptr, block_expert_ptr, padded_total_ptr, rexp_ptr, qscale_ptr, hs_ptr,
    num_pairs, num_m_blocks, K: tl.constexpr, N: tl.constexpr,
    stride_hm, stride_we, stride_wn, stride_se, stride_sc, stride_be, stride_om, stride_os, stride_ym, stride_re,
    stride_hsm,
    SPLIT_K: tl.constexpr, K_SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SCALE_BLOCK: tl.constexpr, NVFP4: tl.constexpr, FOLDED: tl.constexpr, HAS_BIAS: tl.constexpr,
    SWAP_AB: tl.constexpr, STORED_K_ORDER: tl.constexpr, RETIRE_WGMMA: tl.constexpr, DOT_FP32: tl.constexpr,
    USE_ASM: tl.constexpr, HALF_ROWS: tl.constexpr, LAST_PAIR_SUMS: tl.constexpr, TOP_K: tl.constexpr,
    ACT_QUANT: tl.constexpr,
):
    """out[pair, n] = route_weight[pair] * (h[row] @ W2[e]^T + b2[e]) for the N=H outputs, rows in pair order.

    SPLIT_K > 1: program (tile, s) writes its K slice's share to out[s] (bias in slice 0 only); the
    top-k sum kernel adds the slices in fixed order. LAST_PAIR_SUMS: the program whose row draws the last of a
    (token, column tile)'s TOP_K * SPLIT_K tickets (int32 [T * ceil(N / BLOCK_N)], zero at launch: the alignment
    zeroes them) writes y[token] for that tile itself (_topk_sum_store), and no top-k sum launch follows.
    ACT_QUANT != 0 (W4A8): h holds E4M3 codes, the weights are rebased per row (rexp int32 [E, N]) as in
    gemm1_act_kernel, and the sums are scaled by 2^r and a2 = qscale[2].
    """
    pid_m, pid_n = _tile_ids(num_m_blocks, N, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(padded_total_ptr):
        return
    half = False  # a block whose expert run fills at most half of it multiplies only that half (HALF_ROWS)
    if HALF_ROWS:
        real = tl.sum((tl.load(sorted_pair_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) < num_pairs).to(tl.int32))
        half = real <= BLOCK_M // 2
    if half:
        _gemm2_tile(pid_m, pid_n, BLOCK_M // 2, h_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, route_w_ptr, out_ptr,
            ticket_ptr, y_ptr, sorted_pair_ptr, block_expert_ptr, padded_total_ptr, num_pairs, num_m_blocks, K, N,
            stride_hm, stride_we, stride_wn, stride_se, stride_sc, stride_be, stride_om, stride_os, stride_ym, SPLIT_K,
            K_SPLIT, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SCALE_BLOCK, NVFP4, FOLDED, HAS_BIAS, SWAP_AB,
            STORED_K_ORDER, RETIRE_WGMMA, DOT_FP32, USE_ASM, LAST_PAIR_SUMS, TOP_K, ACT_QUANT, rexp_ptr, stride_re,
            qscale_ptr, hs_ptr, stride_hsm)
    else:
        _gemm2_tile(pid_m, pid_n, BLOCK_M, h_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, route_w_ptr, out_ptr,
            ticket_ptr, y_ptr, sorted_pair_ptr, block_expert_ptr, padded_total_ptr, num_pairs, num_m_blocks, K, N,
            stride_hm, stride_we, stride_wn, stride_se, stride_sc, stride_be, stride_om, stride_os, stride_ym, SPLIT_K,
            K_SPLIT, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SCALE_BLOCK, NVFP4, FOLDED, HAS_BIAS, SWAP_AB,
            STORED_K_ORDER, RETIRE_WGMMA, DOT_FP32, USE_ASM, LAST_PAIR_SUMS, TOP_K, ACT_QUANT, rexp_ptr, stride_re,
            qscale_ptr, hs_ptr, stride_hsm)


@triton.jit
def topk_sum_kernel(pair_out_ptr, out_ptr, N: tl.constexpr, stride_pm, stride_om, stride_ps,
                    TOP_K: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRETED: tl.constexpr):
    """y[t] = sum_j sum_s pair_out[s, t*k + j] in fixed order (j outer, split s inner; deterministic), bf16."""
    token = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = offs_n < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        for s in tl.static_range(SPLIT_K):
            acc += tl.load(pair_out_ptr + s * stride_ps + (token * TOP_K + j) * stride_pm + offs_n, mask=ok,
                           other=0.0)
    tl.store(out_ptr + token * stride_om + offs_n, _round_bf16(acc, INTERPRETED), mask=ok)


#: True when Triton's CPU interpreter runs these kernels (TRITON_INTERPRET=1 at triton's first import).
INTERPRETED = not isinstance(topk_sum_kernel, triton.runtime.jit.JITFunction)


# The routing and alignment kernels live in _routing_kernels.py; re-exported so that `kernels` (this module)
# is the one namespace forward.py and _routing.py launch from.
from backends.triton_moe._routing_kernels import (  # noqa: E402
    align_count_kernel,
    align_scatter_kernel,
    align_small_kernel,
    topk_route_kernel,
)

__all__ = ["align_count_kernel", "align_scatter_kernel", "align_small_kernel", "topk_route_kernel"]
