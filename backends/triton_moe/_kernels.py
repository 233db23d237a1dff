"""Triton kernels of the fused W4A16 MoE: GEMM1 + activation, GEMM2 + router weight, top-k sum.

    x [T, H] bf16 ──gather rows by sorted pair──> GEMM1 (gate and up tiles, FP4 dequantized in
    registers) ──bias, activation──> h [padded pairs, I] bf16 ──> GEMM2 (FP4 in registers) ──bias,
    router weight──> per-pair rows [T*k, H] bf16 ──fixed-order fp32 sum over k──> y [T, H]

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
multiplier, so nothing is rounded that the format did not round until GEMM2's rows, which are stored in bf16 (as
vLLM's intermediate cache: half the bytes for the top-k sum) and summed in fp32.
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


def _e2m1_decode_ptx(word: str, out: tuple, scale_lo: str, scale_hi: str, folded: bool) -> str:
    """PTX turning 32-bit weight word `word` into 4 scaled bf16x2 registers `out` (a, b, c, d above), using
    scratch registers t, u and nz = 0x80008000 (and k126 = 2^126 per lane unless folded); scale_lo / scale_hi are
    bf16x2 registers holding the block scale twice. One text for every kernel that decodes words (_kernels and
    _gemv_kernels), so the bit trick has one definition."""
    a, b, c, d = out
    text = (f"and.b32 {a}, {word}, 0x81C081C0;\n"
            f"shl.b32 {b}, {word}, 3; and.b32 {b}, {b}, 0x81C081C0;\n"
            f"and.b32 {c}, {word}, 0x40074007; mul.lo.u32 {c}, {c}, 0x42; and.b32 {c}, {c}, 0x81C081C0;\n"
            f"and.b32 t, {word}, 0x2E002E00; shl.b32 u, t, 2; shr.u32 t, t, 3; or.b32 {d}, u, t; "
            f"and.b32 {d}, {d}, 0x81C081C0;\n")
    if not folded:  # unfolded (MXFP4 scales above 2, whose folded value 2^126 * scale leaves bf16's range): first
        # times 2^126, then the block scale itself (two exact FMAs)
        text += "".join(f"fma.rn.bf16x2 {r}, {r}, k126, nz; " for r in out) + "\n"
    return text + (f"fma.rn.bf16x2 {a}, {a}, {scale_lo}, nz; fma.rn.bf16x2 {b}, {b}, {scale_lo}, nz;\n"
                   f"fma.rn.bf16x2 {c}, {c}, {scale_hi}, nz; fma.rn.bf16x2 {d}, {d}, {scale_hi}, nz;\n")


def _e2m1_word_asm(folded: bool) -> str:
    return ("{\n.reg .b32 a, b, c, d, t, u, nz, slo, shi" + ("" if folded else ", k126") + ";\n"
            "mov.b32 nz, 0x80008000;\n" + ("" if folded else "mov.b32 k126, 0x7E807E80;\n")
            + "mov.b32 slo, {$9, $9};\nmov.b32 shi, {$10, $10};\n"
            + _e2m1_decode_ptx("$8", ("a", "b", "c", "d"), "slo", "shi", folded)
            + "mov.b32 {$0, $1}, a; mov.b32 {$2, $3}, b; mov.b32 {$4, $5}, c; mov.b32 {$6, $7}, d;\n}")


# The routines first waiting for the warpgroup's wgmmas (see _dequant_words, RETIRE_WGMMA).
_RETIRE_WGMMA_PTX = "wgmma.wait_group.sync.aligned 0;"
_E2M1_WORD_ASM = tl.constexpr(_e2m1_word_asm(folded=True))
_E2M1_WORD_UNFOLDED_ASM = tl.constexpr(_e2m1_word_asm(folded=False))
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
def _scale_pair(x, NVFP4: tl.constexpr, FOLDED: tl.constexpr, USE_ASM: tl.constexpr):
    """A scale word shifted so that its low byte is the low values' scale -> (low, high) bf16 factors that
    _dequant_words applies; the high values' scale is the byte 32 // SCALE_BLOCK further (NVFP4: 2, MXFP4: 1)."""
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
                 STORED_K_ORDER: tl.constexpr, RETIRE_WGMMA: tl.constexpr, USE_ASM: tl.constexpr):
    """One K step of ROWS weight rows -> (low, high) bf16 [ROWS, BLOCK_K/2]: column b of both matches the
    activation columns of _act_halves (K byte b: value k = k0 + 64*(b//32) + b%32, and k + 32; with
    STORED_K_ORDER the columns stay in the stored byte order and _act_halves permutes the activations alike).

    The weights load as int32 words [tiles, ROWS, words per tile] (layout: TILE_ROWS x TILE_BYTES tiles, so a
    warp's 16-byte copies cover consecutive rows of one tile: 512 contiguous bytes), viewed as [ROWS, words] for
    one asm routine per word; the scales as one word per (row, scale block of the low values), broadcast in
    registers (a stored 16-byte run lies inside one scale block, so either order sees the same scale per column).
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
    scale_lo, scale_hi = _scale_pair(scales >> (8 * scale_byte)[None, :], NVFP4, FOLDED, USE_ASM)
    e0, e1, e2, e3, e4, e5, e6, e7 = _dequant_words(
        words, _per_word(scale_lo, ROWS, NSUB, WORDS), _per_word(scale_hi, ROWS, NSUB, WORDS), FOLDED, USE_ASM,
        RETIRE_WGMMA)
    lo = tl.reshape(_words_to_bytes(e0, e1, e2, e3), (ROWS, HALF))
    hi = tl.reshape(_words_to_bytes(e4, e5, e6, e7), (ROWS, HALF))
    if not STORED_K_ORDER:
        lo = _to_k_order(lo, ROWS, HALF)
        hi = _to_k_order(hi, ROWS, HALF)
    return lo, hi


# W4A8 weights (layout: backends.layouts.triton_moe, W4A8 byte order): one asm instance per 32-bit word of 8 E2M1
# codes, the K values A_i = 32c + 4t + i and B_i = 32c + 16 + 4t + i of a 32-wide chunk c (i = 0..3): magnitudes
# A_i at bits 4i..4i+2 and B_i at 16+4i..16+4i+2 (4-bit prmt selectors with bit 3 clear once masked), signs A_i at
# bit 8i+7 and B_i at 8i+3 (already, resp. after one shift, at bit 7 of output byte i). Each prmt looks the 4
# magnitudes up in the 8-byte table of their scale block (backends.layouts.triton_moe.w4a8_lut_table: the E4M3 byte
# of each E2M1 magnitude times the block scale times 2^-r of the row, rounded once), one or-with-mask adds the
# signs: 8 ops per 8 values, and the 4 bytes of each output register are a thread's 4 consecutive K values of an
# FP8 wgmma operand. The asm reads the table row itself (ld.global.nc, an L1 hit: 2 KB), so that Triton's software
# pipeliner sees no load that depends on another load of the loop (such a chain cut the weights' cp.async buffers to
# one). pack=4: $2 holds the 4 weight bytes; the codes and the table's address come 4 times each.
def _e2m1_to_e4m3_asm(two_tables: bool, retire: bool, table_rows: bool = False) -> str:
    """table_rows: the table rows are operands, not read here ($3 la0, $7 la1, NVFP4's $11 lb0, $15 lb1: pack=4
    gives each 4 times), for a caller that loads them ahead (backends.triton_moe._ws_kernels)."""
    if table_rows:
        loads = "mov.b32 la0, $3; mov.b32 la1, $7;\n" + ("mov.b32 lb0, $11; mov.b32 lb1, $15;\n" if two_tables
                                                          else "")
    else:
        base = "$11" if two_tables else "$7"
        loads = f"mad.wide.u32 pa, $3, 8, {base}; ld.global.nc.v2.u32 {{la0, la1}}, [pa];\n"
        if two_tables:  # NVFP4: A and B lie in two 16-wide scale blocks
            loads += f"mad.wide.u32 pb, $7, 8, {base}; ld.global.nc.v2.u32 {{lb0, lb1}}, [pb];\n"
    b0, b1 = ("lb0", "lb1") if two_tables else ("la0", "la1")
    body = f"""
.reg .b32 s, m, t, la0, la1, lb0, lb1;
.reg .b64 pa, pb;
{loads}and.b32 s, $2, 0x7777;
prmt.b32 m, la0, la1, s;
and.b32 t, $2, 0x80808080;
or.b32 $0, m, t;
shr.u32 s, $2, 16;
and.b32 s, s, 0x7777;
prmt.b32 m, {b0}, {b1}, s;
shl.b32 t, $2, 4;
and.b32 t, t, 0x80808080;
or.b32 $1, m, t;
}}
"""
    return (_RETIRE_WGMMA_PTX if retire else "") + "{" + body


_E2M1_TO_E4M3_ASM = tl.constexpr(_e2m1_to_e4m3_asm(False, False))
_E2M1_TO_E4M3_RETIRING_ASM = tl.constexpr(_e2m1_to_e4m3_asm(False, True))
_E2M1_TO_E4M3_TWO_ASM = tl.constexpr(_e2m1_to_e4m3_asm(True, False))
_E2M1_TO_E4M3_TWO_RETIRING_ASM = tl.constexpr(_e2m1_to_e4m3_asm(True, True))
_E2M1_TO_E4M3_CONSTRAINTS: tl.constexpr = tl.constexpr("=r,=r,r," + ",".join(["r"] * 4 + ["l"] * 4))
_E2M1_TO_E4M3_TWO_CONSTRAINTS: tl.constexpr = tl.constexpr("=r,=r,r," + ",".join(["r"] * 8 + ["l"] * 4))
#: The routine on table rows given as operands (_e2m1_to_e4m3_asm's table_rows).
E2M1_TO_E4M3_ROWS_ASM = _e2m1_to_e4m3_asm(False, False, table_rows=True)
E2M1_TO_E4M3_TWO_ROWS_ASM = _e2m1_to_e4m3_asm(True, False, table_rows=True)


@triton.jit
def _lut_byte(l0, l1, sel):
    """Byte sel (0..7, int32) of the 8-byte table (l0: bytes 0-3, l1: 4-7): prmt's default mode."""
    return (tl.where(sel < 4, l0, l1) >> (8 * (sel & 3))) & 0xFF


@triton.jit
def _looked_up(l0, l1, w, MAG: tl.constexpr, SIGN: tl.constexpr):
    """The interpreter's value of one asm output byte: the table byte selected by w's magnitude bits MAG..MAG+2,
    with w's bit SIGN as its sign."""
    return _e4m3_byte_value(_lut_byte(l0, l1, (w >> MAG) & 7) | ((w >> SIGN) & 1) << 7)


@triton.jit
def _e4m3_byte_value(b):
    """E4M3 bit pattern (int32 0..255) -> its fp32 value (the interpreter's view of an FP8 operand)."""
    e = (b >> 3) & 15
    m = (b & 7).to(tl.float32)
    v = tl.where(e == 0, m * 0.001953125, (8.0 + m) * _pow2(e - 10))  # m * 2^-9, (1 + m/8) * 2^(e-7)
    v = tl.where((b & 0x7F) == 0x7F, float("nan"), v)
    return tl.where((b & 0x80) != 0, -v, v)


@triton.jit
def _weight_tile_fp8(w_rows, code_ptr, lut_ptr, stride_sc, k0, row_ok, K: tl.constexpr, BLOCK_K: tl.constexpr,
                     NVFP4: tl.constexpr, EVEN_K: tl.constexpr, RETIRE_WGMMA: tl.constexpr, USE_ASM: tl.constexpr):
    """One K step of ROWS W4A8 weight rows -> (A, B) E4M3 operands [ROWS, BLOCK_K/2] (fp32 values under the
    interpreter): column q of A is K value k0 + 32 * (q // 16) + q % 16, of B that + 16 (_act_fp8 loads the
    activations alike). The rows' bytes load as [ROWS, BLOCK_K/2] (a row's K step lies in one or two 32-byte tile
    rows: contiguous runs); each 32-wide chunk's lookup tables come from the code byte of its scale block(s) (code
    words: the scale words' layout) and the 256-entry table at lut_ptr (int32 [256, 2], L1-resident)."""
    HALF: tl.constexpr = BLOCK_K // 2
    NCH: tl.constexpr = BLOCK_K // 32
    ROWS: tl.constexpr = row_ok.shape[0]
    b = tl.arange(0, HALF)
    kt = k0 // (2 * TILE_BYTES) + b // TILE_BYTES
    ptrs = w_rows[:, None] + (kt * (TILE_ROWS * TILE_BYTES) + b % TILE_BYTES)[None, :]
    chunk = k0 // 32 + tl.arange(0, NCH)
    block = 2 * chunk if NVFP4 else chunk  # A's scale block (NVFP4: 16 wide, B's is the next one, same word)
    c_ptrs = code_ptr[:, None] + (block // 4)[None, :] * stride_sc
    if EVEN_K:
        codes = tl.load(ptrs, mask=row_ok[:, None], other=0)
        words = tl.load(c_ptrs, mask=row_ok[:, None], other=0)
    else:
        codes = tl.load(ptrs, mask=row_ok[:, None] & (kt < K // (2 * TILE_BYTES))[None, :], other=0)
        words = tl.load(c_ptrs, mask=row_ok[:, None] & (chunk < K // 32)[None, :], other=0)
    code_a = (words >> (8 * (block % 4))[None, :]) & 0xFF
    code_b = (words >> (8 * (block % 4) + 8)[None, :]) & 0xFF  # NVFP4: B's block, the next byte of the word
    if USE_ASM:
        code_a = _per_word(code_a, ROWS, NCH, HALF)
        table = tl.zeros((ROWS, HALF), dtype=tl.int64) + lut_ptr.to(tl.int64)
        if NVFP4:
            code_b = _per_word(code_b, ROWS, NCH, HALF)
            if RETIRE_WGMMA:  # see _dequant_words
                a, b = tl.inline_asm_elementwise(_E2M1_TO_E4M3_TWO_RETIRING_ASM, _E2M1_TO_E4M3_TWO_CONSTRAINTS,
                                                 [codes, code_a, code_b, table], dtype=(tl.int8, tl.int8),
                                                 is_pure=True, pack=4)
            else:
                a, b = tl.inline_asm_elementwise(_E2M1_TO_E4M3_TWO_ASM, _E2M1_TO_E4M3_TWO_CONSTRAINTS,
                                                 [codes, code_a, code_b, table], dtype=(tl.int8, tl.int8),
                                                 is_pure=True, pack=4)
        elif RETIRE_WGMMA:
            a, b = tl.inline_asm_elementwise(_E2M1_TO_E4M3_RETIRING_ASM, _E2M1_TO_E4M3_CONSTRAINTS,
                                             [codes, code_a, table], dtype=(tl.int8, tl.int8), is_pure=True, pack=4)
        else:
            a, b = tl.inline_asm_elementwise(_E2M1_TO_E4M3_ASM, _E2M1_TO_E4M3_CONSTRAINTS,
                                             [codes, code_a, table], dtype=(tl.int8, tl.int8), is_pure=True, pack=4)
        a = a.to(tl.float8e4nv, bitcast=True)
        b = b.to(tl.float8e4nv, bitcast=True)
    else:  # the asm's table reads and lookups in integer ops, on whole words
        la0 = tl.load(lut_ptr + 2 * code_a)
        la1 = tl.load(lut_ptr + 2 * code_a + 1)
        if NVFP4:
            lb0 = tl.load(lut_ptr + 2 * code_b)
            lb1 = tl.load(lut_ptr + 2 * code_b + 1)
        else:
            lb0 = la0
            lb1 = la1
        WORDS: tl.constexpr = HALF // 4
        quads = tl.reshape(codes.to(tl.int32), (ROWS, WORDS, 4))
        w = tl.sum(quads << (8 * tl.arange(0, 4))[None, None, :], axis=2)
        la0 = _per_word(la0, ROWS, NCH, WORDS)
        la1 = _per_word(la1, ROWS, NCH, WORDS)
        lb0 = _per_word(lb0, ROWS, NCH, WORDS)
        lb1 = _per_word(lb1, ROWS, NCH, WORDS)
        a = tl.reshape(_words_to_bytes(_looked_up(la0, la1, w, 0, 7), _looked_up(la0, la1, w, 4, 15),
                                       _looked_up(la0, la1, w, 8, 23), _looked_up(la0, la1, w, 12, 31)), (ROWS, HALF))
        b = tl.reshape(_words_to_bytes(_looked_up(lb0, lb1, w, 16, 3), _looked_up(lb0, lb1, w, 20, 11),
                                       _looked_up(lb0, lb1, w, 24, 19), _looked_up(lb0, lb1, w, 28, 27)), (ROWS, HALF))
    return a, b


@triton.jit
def _act_pair(a_rows, k0, row_ok, K: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, GROUP: tl.constexpr):
    """Two [ROWS, BLOCK_K/2] column sets of the activations, in K order: the first halves of the step's GROUP-wide K
    groups, then their second halves (16-byte runs or longer)."""
    HALF_GROUP: tl.constexpr = GROUP // 2
    b = tl.arange(0, BLOCK_K // 2)
    col = k0 + GROUP * (b // HALF_GROUP) + b % HALF_GROUP
    if EVEN_K:
        mask = row_ok[:, None]
    else:
        mask = row_ok[:, None] & (col < K)[None, :]
    first = tl.load(a_rows[:, None] + col[None, :], mask=mask, other=0.0)
    second = tl.load(a_rows[:, None] + (col + HALF_GROUP)[None, :], mask=mask, other=0.0)
    return first, second


@triton.jit
def _act_fp8(a_rows, k0, row_ok, K: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """The E4M3 activation columns matching _weight_tile_fp8's (A, B): 32-wide chunks' first and second 16."""
    return _act_pair(a_rows, k0, row_ok, K, BLOCK_K, EVEN_K, 32)


@triton.jit
def _act_halves(a_rows, k0, row_ok, K: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                STORED_K_ORDER: tl.constexpr):
    """Activation columns matching _weight_tile's (low, high) halves of 64-wide groups, loaded in K order;
    STORED_K_ORDER permutes them in registers to the weights' stored order."""
    lo, hi = _act_pair(a_rows, k0, row_ok, K, BLOCK_K, EVEN_K, 64)
    if STORED_K_ORDER:
        ROWS: tl.constexpr = lo.shape[0]
        lo = _to_stored_order(lo, ROWS, BLOCK_K // 2)
        hi = _to_stored_order(hi, ROWS, BLOCK_K // 2)
    return lo, hi


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
def _mx_blocks(t, ENTRIES: tl.constexpr, INTERPRETED: tl.constexpr):
    """[ROWS, G * ENTRIES] activations (any float) -> MXFP8 (formats.quantize_mxfp8) of each block of ENTRIES
    consecutive columns: (E4M3 elements of t / 2^se [ROWS, G, ENTRIES], E8M0 exponents se [ROWS, G]). ENTRIES is 32,
    or a multiple where each column is held more than once (the decode kernels' four lanes of a row)."""
    ROWS: tl.constexpr = t.shape[0]
    COLS: tl.constexpr = t.shape[1]
    g = tl.reshape(t.to(tl.float32), (ROWS, COLS // ENTRIES, ENTRIES))
    se = _mx_exp(tl.max(tl.abs(g), axis=2))
    return _to_e4m3(g * _pow2(-se)[:, :, None], INTERPRETED), se


@triton.jit
def _mx_values(t, ENTRIES: tl.constexpr, INTERPRETED: tl.constexpr):
    """[ROWS, COLS] activations -> their MXFP8 values in fp32 (_mx_blocks' elements times 2^se), the operand that
    bf16 dots multiply: the emulation's fake-quantized 'mxfp8' input (formats.qdq_activation 'fp8'), which is a
    bf16 value wherever it is 2^-133 or more."""
    ROWS: tl.constexpr = t.shape[0]
    COLS: tl.constexpr = t.shape[1]
    elem, se = _mx_blocks(t, ENTRIES, INTERPRETED)
    return tl.reshape(elem.to(tl.float32) * _pow2_from_m127(se)[:, :, None], (ROWS, COLS))


@triton.jit
def _mx_warp_columns(pid_n, BLOCK_N: tl.constexpr, MX_WARPS: tl.constexpr):
    """Tile pid_n's columns in the order that puts each MX block of 32 in one warp of a swapped (wgmma) accumulator
    of BLOCK_N = 32 * MX_WARPS weight rows: warp w holds rows 16w + j and 16 * MX_WARPS + 16w + j (j < 16), which
    take columns 32w + j and 32w + 16 + j, so a block's maxima need no exchange between warps (_mx_values_by_warp)."""
    r = tl.arange(0, BLOCK_N)
    return pid_n * BLOCK_N + 32 * ((r // 16) % MX_WARPS) + 16 * (r // (16 * MX_WARPS)) + r % 16


@triton.jit
def _mx_values_by_warp(t, MX_WARPS: tl.constexpr, INTERPRETED: tl.constexpr):
    """_mx_values of [ROWS, 32 * MX_WARPS] activations whose columns come in _mx_warp_columns' order: the same MXFP8
    values, each block's amax taken over the 2 x 16 columns one warp holds."""
    ROWS: tl.constexpr = t.shape[0]
    COLS: tl.constexpr = t.shape[1]
    g = tl.reshape(t.to(tl.float32), (ROWS, 2, MX_WARPS, 16))
    se = _mx_exp(tl.max(tl.max(tl.abs(g), axis=3), axis=1))[:, None, :, None]
    elem = _to_e4m3(g * _pow2(-se), INTERPRETED)
    return tl.reshape(elem.to(tl.float32) * _pow2_from_m127(se), (ROWS, COLS))


@triton.jit
def _mx_quant_rebased(t, ra, INTERPRETED: tl.constexpr):
    """[ROWS, G * 32] activations (any float) -> the FP8 dots' 'mxfp8' operand: each 32-column group (one MX block, in
    either K order: the stored order permutes within 16-column runs) quantized to MXFP8, then rebased to the row's
    exponent ra [ROWS] (formats.mxfp8_row_rebased)."""
    ROWS: tl.constexpr = t.shape[0]
    COLS: tl.constexpr = t.shape[1]
    elem, se = _mx_blocks(t, 32, INTERPRETED)
    return _rescale_groups(tl.reshape(elem, (ROWS, COLS)), se - ra[:, None], INTERPRETED)


@triton.jit
def _round_bf16(v, INTERPRETED: tl.constexpr):
    """fp32 -> bf16 rounded to nearest even; the CPU interpreter truncates casts, so round the bits there."""
    if INTERPRETED:
        bits = v.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        v = bits.to(tl.float32, bitcast=True)
    return v.to(tl.bfloat16)


@triton.jit
def _mma(acc, a, w, SWAP_AB: tl.constexpr, DOT_FP32: tl.constexpr, FP8_PROMOTE: tl.constexpr = False):
    """acc += a @ w^T ([BM, BN]) or, swapped, w @ a^T ([BN, BM]) so weights fill the MMA's M side.

    FP8 operands (W4A8): the tensor core's own accumulator keeps fewer bits than fp32; FP8_PROMOTE adds each wgmma's
    K = 32 sum to the fp32 accumulator (tl.dot's max_num_imprecise_acc), else all of K stays in the tensor core's
    (Triton's SM90 default; forward.FP8_ACCUMULATIONS)."""
    if DOT_FP32:  # CPU interpreter: its bf16 dot is wrong (triton 3.9); the operands are bf16-exact anyway
        a = a.to(tl.float32)
        w = w.to(tl.float32)
    if a.dtype == tl.float8e4nv and FP8_PROMOTE:
        if SWAP_AB:
            acc = tl.dot(w, tl.trans(a), acc, max_num_imprecise_acc=32)
        else:
            acc = tl.dot(a, tl.trans(w), acc, max_num_imprecise_acc=32)
    elif SWAP_AB:  # one return: triton 3.6 compiles both returns of an early-return constexpr branch
        acc = tl.dot(w, tl.trans(a), acc)
    else:
        acc = tl.dot(a, tl.trans(w), acc)
    return acc


@triton.jit
def _act_step(a_rows, row_ok, k0, K: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
              STORED_K_ORDER: tl.constexpr, FP8: tl.constexpr):
    """One K step's activation operands, two K halves: bf16 (_act_halves) or, FP8, E4M3 (_act_fp8)."""
    if FP8:
        a_lo, a_hi = _act_fp8(a_rows, k0, row_ok, K, BLOCK_K, EVEN_K)
    else:
        a_lo, a_hi = _act_halves(a_rows, k0, row_ok, K, BLOCK_K, EVEN_K, STORED_K_ORDER)
    return a_lo, a_hi


@triton.jit
def _step_operands(a_rows, row_ok, w_rows, s_ptrs, lut_ptr, w_ok, stride_sc, k0, K: tl.constexpr, BLOCK_K: tl.constexpr,
                   SCALE_BLOCK: tl.constexpr, NVFP4: tl.constexpr, FOLDED: tl.constexpr, EVEN_K: tl.constexpr,
                   STORED_K_ORDER: tl.constexpr, RETIRE_WGMMA: tl.constexpr, USE_ASM: tl.constexpr, FP8: tl.constexpr):
    """One K step's (activation, weight) operand pairs, two K halves: bf16 (_act_halves, _weight_tile) or, FP8
    (W4A8: E4M3 activations quantized before the GEMM, s_ptrs the weights' code words), E4M3 (_act_fp8,
    _weight_tile_fp8)."""
    a_lo, a_hi = _act_step(a_rows, row_ok, k0, K, BLOCK_K, EVEN_K, STORED_K_ORDER, FP8)
    if FP8:
        w_lo, w_hi = _weight_tile_fp8(w_rows, s_ptrs, lut_ptr, stride_sc, k0, w_ok, K, BLOCK_K, NVFP4, EVEN_K,
                                      RETIRE_WGMMA, USE_ASM)
    else:
        w_lo, w_hi = _weight_tile(w_rows, s_ptrs, stride_sc, k0, w_ok, K, BLOCK_K, SCALE_BLOCK, NVFP4, FOLDED, EVEN_K,
                                  STORED_K_ORDER, RETIRE_WGMMA, USE_ASM)
    return a_lo, a_hi, w_lo, w_hi


@triton.jit
def _accumulate_k(a_rows, row_ok, w_rows, s_ptrs, w_ok, stride_sc, k_base, K: tl.constexpr, K_SPLIT: tl.constexpr,
                  BLOCK_M: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, SCALE_BLOCK: tl.constexpr,
                  NVFP4: tl.constexpr, FOLDED: tl.constexpr, EVEN_K: tl.constexpr, SWAP_AB: tl.constexpr,
                  STORED_K_ORDER: tl.constexpr, RETIRE_WGMMA: tl.constexpr, DOT_FP32: tl.constexpr,
                  USE_ASM: tl.constexpr, FP8: tl.constexpr = False, lut_ptr=None,
                  FP8_PROMOTE: tl.constexpr = False, tail_rows=None, tail_ok=None, TAIL: tl.constexpr = 0):
    """(fp32 [BLOCK_M, ROWS], fp32 [TAIL, ROWS] or 0.0): the activation rows, and the TAIL rows of tail_rows (the next
    block's short run, TAIL_ROWS), times ROWS weight rows over this program's K slice, one weight tile per step
    decoded once for both (GEMM2, and GEMM1 with its gate and up rows stacked)."""
    acc = _zero_acc(BLOCK_M, ROWS, SWAP_AB)
    acc_t = 0.0
    if TAIL > 0:
        acc_t = _zero_acc(TAIL, ROWS, SWAP_AB)
    for k_step in range(0, K_SPLIT, BLOCK_K):
        a_lo, a_hi, w_lo, w_hi = _step_operands(a_rows, row_ok, w_rows, s_ptrs, lut_ptr, w_ok, stride_sc,
                                                k_base + k_step, K, BLOCK_K, SCALE_BLOCK, NVFP4, FOLDED, EVEN_K,
                                                STORED_K_ORDER, RETIRE_WGMMA, USE_ASM, FP8)
        acc = _mma(_mma(acc, a_lo, w_lo, SWAP_AB, DOT_FP32, FP8_PROMOTE), a_hi, w_hi, SWAP_AB, DOT_FP32,
                   FP8_PROMOTE)
        if TAIL > 0:
            t_lo, t_hi = _act_step(tail_rows, tail_ok, k_base + k_step, K, BLOCK_K, EVEN_K, STORED_K_ORDER, FP8)
            acc_t = _mma(_mma(acc_t, t_lo, w_lo, SWAP_AB, DOT_FP32, FP8_PROMOTE), t_hi, w_hi, SWAP_AB, DOT_FP32,
                         FP8_PROMOTE)
    if SWAP_AB:
        acc = tl.trans(acc)
        if TAIL > 0:
            acc_t = tl.trans(acc_t)
    return acc, acc_t


@triton.jit
def _act_operands(expert, offs_n, col_ok, gs_ptr, bias_ptr, N: tl.constexpr, stride_be, NVFP4: tl.constexpr,
                  HAS_BIAS: tl.constexpr):
    """(NVFP4 global scale, gate bias, up bias) of GEMM1's epilogue (1.0 / zeros where the layer has none)."""
    global_scale = 1.0
    if NVFP4:
        global_scale = tl.load(gs_ptr + expert)
    bias_g = tl.zeros(offs_n.shape, tl.float32)
    bias_u = tl.zeros(offs_n.shape, tl.float32)
    if HAS_BIAS:
        b_ptrs = bias_ptr + expert * stride_be + offs_n
        bias_g = tl.load(b_ptrs, mask=col_ok, other=0.0)
        bias_u = tl.load(b_ptrs + N, mask=col_ok, other=0.0)
    return global_scale, bias_g, bias_u


@triton.jit
def _act_store(acc_g, acc_u, expert, offs_m, offs_n, col_ok, store_ok, gs_ptr, bias_ptr, h_ptr, N: tl.constexpr,
               stride_be, stride_hm, alpha, beta, limit, NVFP4: tl.constexpr, ACTIVATION: tl.constexpr,
               HAS_BIAS: tl.constexpr, INTERPRETED: tl.constexpr, ACT_QUANT: tl.constexpr = 0, rexp_ptr=None,
               stride_re=0, qscale_ptr=None, loaded=None, act_scales=None, MX_ENTRIES: tl.constexpr = 32,
               MX_WARPS: tl.constexpr = 0):
    """GEMM1's epilogue on full-K fp32 sums [rows, cols]: global scale, bias, activation, bf16 store to h.

    ACT_QUANT (W4A8): the FP8 dots' sums times 2^r of each weight row and the input scale a1 (qscale[0]), the NVFP4
    global scale; ACT_QUANT 1: h stored as E4M3 codes of clamp(act * (1 / a2), +-448) (qscale[3]), GEMM2's operand;
    ACT_QUANT 2 (mxfp8; the rows' 2^ra already applied): h stored in bf16, quantized by act_quant_kernel (a row's
    MXFP8 rebase needs the whole row, which spans column tiles); ACT_QUANT 3 (static FP8 on bf16 dots of the E4M3
    values and the FP4 weights, which need no 2^r): the sums times a1 (and NVFP4's fold and global scale as W4A16's),
    h stored as the values of ACT_QUANT 1's codes in bf16; ACT_QUANT 4 (MXFP8 on bf16 dots): h stored as its MXFP8
    values in bf16, quantized from the fp32 activation per MX block of 32 columns, MX_ENTRIES entries of a row
    (_mx_values; the tile's columns hold whole blocks), or, MX_WARPS > 0, per block of _mx_warp_columns' order.
    loaded: (global scale, gate bias, up bias) as _act_operands loaded them, for a caller that loads them
    before its K loop; act_scales: mode 3's (a1, 1 / a2) (_static_act_scales), loaded by the caller, before its K
    loop where it has one: after it a load costs a memory latency at every program's end."""
    if loaded is None:
        loaded = _act_operands(expert, offs_n, col_ok, gs_ptr, bias_ptr, N, stride_be, NVFP4, HAS_BIAS)
    global_scale, bias_g, bias_u = loaded
    if ACT_QUANT == 3:
        acc_g = acc_g * act_scales[0]
        acc_u = acc_u * act_scales[0]
    if (ACT_QUANT == 1) | (ACT_QUANT == 2):
        r_ptrs = rexp_ptr + expert * stride_re + offs_n
        a1 = 1.0
        if ACT_QUANT == 1:
            a1 = tl.load(qscale_ptr)
        acc_g = acc_g * (_pow2(tl.load(r_ptrs, mask=col_ok, other=0)) * a1)[None, :]
        acc_u = acc_u * (_pow2(tl.load(r_ptrs + N, mask=col_ok, other=0)) * a1)[None, :]
        if NVFP4:
            acc_g = acc_g / global_scale
            acc_u = acc_u / global_scale
    elif NVFP4:  # the dequantized weights carry 2^-NVFP4_FOLD_SHIFT (see _scale_pair): undo it, exactly
        acc_g = acc_g * 65536.0 / global_scale
        acc_u = acc_u * 65536.0 / global_scale
    if HAS_BIAS:
        acc_g += bias_g[None, :]
        acc_u += bias_u[None, :]
    if ACTIVATION == 1:  # gpt-oss swigluoai: clamp gate from above, up both ways, (up + beta) * glu
        acc_g = tl.minimum(acc_g, limit)
        acc_u = tl.minimum(tl.maximum(acc_u, -limit), limit)
        h = (acc_u + beta) * acc_g / (1.0 + tl.exp(-alpha * acc_g))
    else:  # silu-and-mul
        h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    h_ptrs = h_ptr + offs_m.to(tl.int64)[:, None] * stride_hm + offs_n[None, :]
    if ACT_QUANT == 1:
        tl.store(h_ptrs, _to_e4m3(h * tl.load(qscale_ptr + 3), INTERPRETED).to(tl.float8e4nv), mask=store_ok)
    elif ACT_QUANT == 3:
        tl.store(h_ptrs, _round_bf16(_to_e4m3(h * act_scales[1], INTERPRETED).to(tl.float32), INTERPRETED),
                 mask=store_ok)
    elif ACT_QUANT == 4:
        if MX_WARPS > 0:
            h = _mx_values_by_warp(h, MX_WARPS, INTERPRETED)
        else:
            h = _mx_values(h, MX_ENTRIES, INTERPRETED)
        tl.store(h_ptrs, _round_bf16(h, INTERPRETED), mask=store_ok)
    else:
        tl.store(h_ptrs, _round_bf16(h, INTERPRETED), mask=store_ok)


@triton.jit
def _static_act_scales(qscale_ptr, ACT_QUANT: tl.constexpr):
    """_act_store's act_scales: (a1, 1 / a2) of qscale [a1, 1/a1, a2, 1/a2] for ACT_QUANT 3, else None."""
    scales = None
    if ACT_QUANT == 3:
        scales = (tl.load(qscale_ptr), tl.load(qscale_ptr + 3))
    return scales


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
def _gate_up(acc, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """(gate, up) [ROWS, BLOCK_N] of a stacked gate/up tile's sums [ROWS, 2 * BLOCK_N]."""
    return tl.split(tl.permute(tl.reshape(acc, (ROWS, 2, BLOCK_N)), (0, 2, 1)))


@triton.jit
def _x_row_exps(acc_g, acc_u, ra_ptr, pair, row_ok, TOP_K: tl.constexpr, ACT_QUANT: tl.constexpr):
    """ACT_QUANT 2: the sums times their x rows' 2^ra (act_quant_kernel), exact, before any split-K slice is stored."""
    if ACT_QUANT == 2:
        ra = _pow2_from_m127(tl.load(ra_ptr + pair // TOP_K, mask=row_ok, other=0))
        acc_g = acc_g * ra[:, None]
        acc_u = acc_u * ra[:, None]
    return acc_g, acc_u


@triton.jit
def _tail_rows(pid_m, sorted_pair_ptr, num_pairs, BLOCK_M: tl.constexpr, TAIL: tl.constexpr):
    """(rows, pairs, real-row mask) of the first TAIL rows of block pid_m + 1, which a TAIL_ROWS program multiplies
    with its own block."""
    offs_t = (pid_m + 1) * BLOCK_M + tl.arange(0, TAIL)
    pair_t = tl.load(sorted_pair_ptr + offs_t)
    return offs_t, pair_t, pair_t < num_pairs


@triton.jit
def _row_plan(pid_m, sorted_pair_ptr, block_expert_ptr, padded_total, num_pairs, BLOCK_M: tl.constexpr,
              HALF_ROWS: tl.constexpr, TAIL_ROWS: tl.constexpr, WIDE_TAIL_ROWS: tl.constexpr = 0):
    """(absorbed, half, tail, wide) of row block pid_m, what its program multiplies.

    half (HALF_ROWS): its expert run fills at most half of it, so it multiplies only that half. TAIL_ROWS: an expert
    run's last block that holds at most TAIL_ROWS real rows (a short tail, whose weight decode would otherwise cost a
    whole block's) is absorbed: the program of the run's block before it (tail) multiplies those rows too, with the
    weight tiles it decodes anyway, and the absorbed block's program does nothing. WIDE_TAIL_ROWS (> TAIL_ROWS): a
    last block of more than TAIL_ROWS and at most WIDE_TAIL_ROWS real rows is absorbed the same way, by a program
    whose second dot has WIDE_TAIL_ROWS rows (wide); a tail of at most TAIL_ROWS keeps the narrower dot, so no row
    is multiplied twice as wide as it need be. A run fills its blocks from the first row, so a block is short when its
    row TAIL_ROWS is padding, and a block followed by the same expert's is full."""
    half = False
    if HALF_ROWS:
        real = tl.sum((tl.load(sorted_pair_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) < num_pairs).to(tl.int32))
        half = real <= BLOCK_M // 2
    absorbed = False
    tail = False
    wide = False
    if TAIL_ROWS > 0:
        ABSORBS: tl.constexpr = WIDE_TAIL_ROWS if WIDE_TAIL_ROWS > TAIL_ROWS else TAIL_ROWS
        expert = tl.load(block_expert_ptr + pid_m)
        short = tl.load(sorted_pair_ptr + pid_m * BLOCK_M + ABSORBS) >= num_pairs
        absorbed = short & (pid_m > 0) & (tl.load(block_expert_ptr + tl.maximum(pid_m - 1, 0)) == expert)
        has_next = (pid_m + 1) * BLOCK_M < padded_total
        next_expert = tl.load(block_expert_ptr + pid_m + 1, mask=has_next, other=-1)
        next_short = tl.load(sorted_pair_ptr + (pid_m + 1) * BLOCK_M + TAIL_ROWS, mask=has_next, other=0) >= num_pairs
        tail = has_next & (next_expert == expert) & next_short
        if WIDE_TAIL_ROWS > TAIL_ROWS:
            next_fits = tl.load(sorted_pair_ptr + (pid_m + 1) * BLOCK_M + WIDE_TAIL_ROWS, mask=has_next,
                                other=0) >= num_pairs
            wide = has_next & (next_expert == expert) & next_fits & ~next_short
    return absorbed, half, tail, wide


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
    ACT_QUANT: tl.constexpr, rexp_ptr, stride_re, qscale_ptr, ra_ptr, lut_ptr, FP8_PROMOTE: tl.constexpr,
    TAIL: tl.constexpr = 0, MX_WARPS: tl.constexpr = 0,
):
    """gemm1_act_kernel's tile: the first ROWS rows of row block pid_m (ROWS = BLOCK_M, or half of it) and, TAIL > 0
    (stacked gate/up, one K slice), the first TAIL rows of block pid_m + 1 as well (TAIL_ROWS)."""
    expert, offs_m, pair, row_ok, offs_n, col_ok, k_base = _block_rows(
        pid_m, pid_n, block_expert_ptr, sorted_pair_ptr, num_pairs, N, K_SPLIT, SPLIT_K, BLOCK_M, BLOCK_N, ROWS)
    if MX_WARPS > 0:
        offs_n = _mx_warp_columns(pid_n, BLOCK_N, MX_WARPS)
        col_ok = offs_n < N
    x_rows = x_ptr + (pair // TOP_K).to(tl.int64) * stride_xm
    offs_t, pair_t, ok_t, x_rows_t = offs_m, pair, row_ok, x_rows  # the tail's rows where TAIL > 0 (else unused)
    if TAIL > 0:
        offs_t, pair_t, ok_t = _tail_rows(pid_m, sorted_pair_ptr, num_pairs, BLOCK_M, TAIL)
        x_rows_t = x_ptr + (pair_t // TOP_K).to(tl.int64) * stride_xm
    FP8: tl.constexpr = (ACT_QUANT == 1) | (ACT_QUANT == 2)  # E4M3 dots (3: bf16 dots of E4M3 values)
    act_scales = _static_act_scales(qscale_ptr, ACT_QUANT)
    if STACK_GATE_UP:
        # one [2 * BLOCK_N]-row weight tile: the tile's gate rows, then its up rows (one dot per half-step)
        r = tl.arange(0, 2 * BLOCK_N)
        w_col = pid_n * BLOCK_N + r % BLOCK_N
        w_row = w_col + (r // BLOCK_N) * N
        w_rows = _weight_rows(w_ptr + expert * stride_we, w_row, stride_wn)
        s_ptrs = s_ptr + expert * stride_se + w_row
        acc, acc_t = _accumulate_k(x_rows, row_ok, w_rows, s_ptrs, w_col < N, stride_sc, k_base, K, K_SPLIT, ROWS,
                                   2 * BLOCK_N, BLOCK_K, SCALE_BLOCK, NVFP4, FOLDED, EVEN_K, SWAP_AB, STORED_K_ORDER,
                                   RETIRE_WGMMA, DOT_FP32, USE_ASM, FP8, lut_ptr, FP8_PROMOTE, x_rows_t, ok_t, TAIL)
        acc_g, acc_u = _gate_up(acc, ROWS, BLOCK_N)
    else:
        wg_rows = _weight_rows(w_ptr + expert * stride_we, offs_n, stride_wn)
        wu_rows = _weight_rows(w_ptr + expert * stride_we, offs_n + N, stride_wn)
        sg_ptrs = s_ptr + expert * stride_se + offs_n
        su_ptrs = sg_ptrs + N
        acc_g = _zero_acc(ROWS, BLOCK_N, SWAP_AB)
        acc_u = _zero_acc(ROWS, BLOCK_N, SWAP_AB)
        for k_step in range(0, K_SPLIT, BLOCK_K):
            k0 = k_base + k_step
            a_lo, a_hi, g_lo, g_hi = _step_operands(x_rows, row_ok, wg_rows, sg_ptrs, lut_ptr, col_ok, stride_sc, k0,
                                                    K, BLOCK_K, SCALE_BLOCK, NVFP4, FOLDED, EVEN_K, STORED_K_ORDER,
                                                    RETIRE_WGMMA, USE_ASM, FP8)
            if FP8:
                u_lo, u_hi = _weight_tile_fp8(wu_rows, su_ptrs, lut_ptr, stride_sc, k0, col_ok, K, BLOCK_K, NVFP4,
                                              EVEN_K, RETIRE_WGMMA, USE_ASM)
            else:
                u_lo, u_hi = _weight_tile(wu_rows, su_ptrs, stride_sc, k0, col_ok, K, BLOCK_K, SCALE_BLOCK, NVFP4,
                                          FOLDED, EVEN_K, STORED_K_ORDER, RETIRE_WGMMA, USE_ASM)
            acc_g = _mma(_mma(acc_g, a_lo, g_lo, SWAP_AB, DOT_FP32, FP8_PROMOTE), a_hi, g_hi, SWAP_AB,
                         DOT_FP32, FP8_PROMOTE)
            acc_u = _mma(_mma(acc_u, a_lo, u_lo, SWAP_AB, DOT_FP32, FP8_PROMOTE), a_hi, u_hi, SWAP_AB,
                         DOT_FP32, FP8_PROMOTE)
        if SWAP_AB:
            acc_g = tl.trans(acc_g)
            acc_u = tl.trans(acc_u)
    acc_g, acc_u = _x_row_exps(acc_g, acc_u, ra_ptr, pair, row_ok, TOP_K, ACT_QUANT)
    if SPLIT_K == 1:
        _act_store(acc_g, acc_u, expert, offs_m, offs_n, col_ok, col_ok[None, :], gs_ptr, bias_ptr, h_ptr, N,
                   stride_be, stride_hm, alpha, beta, limit, NVFP4, ACTIVATION, HAS_BIAS, DOT_FP32, ACT_QUANT,
                   rexp_ptr, stride_re, qscale_ptr, act_scales=act_scales, MX_WARPS=MX_WARPS)
        if TAIL > 0:
            tail_g, tail_u = _gate_up(acc_t, TAIL, BLOCK_N)
            tail_g, tail_u = _x_row_exps(tail_g, tail_u, ra_ptr, pair_t, ok_t, TOP_K, ACT_QUANT)
            _act_store(tail_g, tail_u, expert, offs_t, offs_n, col_ok, col_ok[None, :], gs_ptr, bias_ptr, h_ptr, N,
                       stride_be, stride_hm, alpha, beta, limit, NVFP4, ACTIVATION, HAS_BIAS, DOT_FP32, ACT_QUANT,
                       rexp_ptr, stride_re, qscale_ptr, act_scales=act_scales)
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
                           rexp_ptr, stride_re, qscale_ptr, act_scales=act_scales)


@triton.jit
def gemm1_act_kernel(
    x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, h_ptr, part_ptr, ticket_ptr,
    sorted_pair_ptr, block_expert_ptr, padded_total_ptr, rexp_ptr, qscale_ptr, ra_ptr, lut_ptr,
    num_pairs, num_m_blocks, K: tl.constexpr, N: tl.constexpr,
    stride_xm, stride_we, stride_wn, stride_se, stride_sc, stride_be, stride_hm, stride_ps, stride_pm, stride_re,
    alpha, beta, limit, SPLIT_K: tl.constexpr, K_SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
    LAST_SLICE_ACTIVATES: tl.constexpr,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SCALE_BLOCK: tl.constexpr, NVFP4: tl.constexpr, FOLDED: tl.constexpr,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, SWAP_AB: tl.constexpr, STORED_K_ORDER: tl.constexpr,
    RETIRE_WGMMA: tl.constexpr, DOT_FP32: tl.constexpr, USE_ASM: tl.constexpr, STACK_GATE_UP: tl.constexpr,
    HALF_ROWS: tl.constexpr, ACT_QUANT: tl.constexpr, FP8_PROMOTE: tl.constexpr = False,
    TAIL_ROWS: tl.constexpr = 0, MX_WARPS: tl.constexpr = 0, PDL_WAIT: tl.constexpr = False,
    WIDE_TAIL_ROWS: tl.constexpr = 0,
):
    """h[row, n] = act(gate, up) for the N=I outputs; w rows [0, N) are gate, [N, 2N) are up.

    HALF_ROWS, TAIL_ROWS, WIDE_TAIL_ROWS (stacked gate/up, SPLIT_K 1): what each row block's program multiplies
    (_row_plan).

    SPLIT_K > 1: program (tile, s) sums K slice s only and stores raw fp32 gate/up sums of its real rows
    to part[s, row, 0:N | N:2N]; gemm1_split_epilogue_kernel adds the slices in order s = 0, 1, ... or, with
    LAST_SLICE_ACTIVATES, the tile's program that finishes last does (_last_slice_sum: one launch fewer, same
    bits). Its tickets (int32, one per tile = program_id(0)) must be zero at launch: the alignment zeroes them.

    ACT_QUANT 1, 2 (W4A8): E4M3 dots; x holds E4M3 codes (act_quant_kernel: 1 static per-tensor FP8, x / a1;
    2 MXFP8 rebased per row, its exponents at ra_ptr), w and s the W4A8 byte order and code words (lookup table at
    lut_ptr, _weight_tile_fp8), rexp the weight rows' exponents r (int32 [E, 2N]); h as _act_store writes it.
    0: W4A16 (rexp_ptr, qscale_ptr, ra_ptr, lut_ptr unused); 3 (W4A8 static FP8 on bf16 dots, MXFP4 weights): W4A16
    on x holding the E4M3 values of x / a1, qscale_ptr's scales in the epilogue (_act_store's mode 3).
    MX_WARPS > 0 (ACT_QUANT 4, swapped, unstacked, one K slice, BLOCK_N = 32 * num_warps = 32 * MX_WARPS): the tile's
    columns in _mx_warp_columns' order, so that the epilogue's MXFP8 blocks stay within warps.
    PDL_WAIT (W4A8, launched as the programmatic dependent of x's quantization, act_quant_kernel's PDL): the row
    plan, from the alignment before that launch, comes first, then griddepcontrol.wait for x and its scales.
    """
    pid_m, pid_n = _tile_ids(num_m_blocks, N, BLOCK_N, GROUP_M)
    padded_total = tl.load(padded_total_ptr)
    if pid_m * BLOCK_M >= padded_total:
        return
    absorbed, half, tail, wide = _row_plan(pid_m, sorted_pair_ptr, block_expert_ptr, padded_total, num_pairs,
                                           BLOCK_M, HALF_ROWS, TAIL_ROWS, WIDE_TAIL_ROWS)
    if absorbed:
        return
    if PDL_WAIT:
        tl.extra.cuda.gdc_wait()
    if tail:
        _gemm1_tile(pid_m, pid_n, BLOCK_M, x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, h_ptr, part_ptr, ticket_ptr,
            sorted_pair_ptr, block_expert_ptr, padded_total_ptr, num_pairs, num_m_blocks, K, N, stride_xm, stride_we,
            stride_wn, stride_se, stride_sc, stride_be, stride_hm, stride_ps, stride_pm, alpha, beta, limit, SPLIT_K,
            K_SPLIT, EVEN_K, LAST_SLICE_ACTIVATES, TOP_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SCALE_BLOCK, NVFP4,
            FOLDED, ACTIVATION, HAS_BIAS, SWAP_AB, STORED_K_ORDER, RETIRE_WGMMA, DOT_FP32, USE_ASM, STACK_GATE_UP,
            ACT_QUANT, rexp_ptr, stride_re, qscale_ptr, ra_ptr, lut_ptr, FP8_PROMOTE, TAIL_ROWS, MX_WARPS)
    elif wide:
        _gemm1_tile(pid_m, pid_n, BLOCK_M, x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, h_ptr, part_ptr, ticket_ptr,
            sorted_pair_ptr, block_expert_ptr, padded_total_ptr, num_pairs, num_m_blocks, K, N, stride_xm, stride_we,
            stride_wn, stride_se, stride_sc, stride_be, stride_hm, stride_ps, stride_pm, alpha, beta, limit, SPLIT_K,
            K_SPLIT, EVEN_K, LAST_SLICE_ACTIVATES, TOP_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SCALE_BLOCK, NVFP4,
            FOLDED, ACTIVATION, HAS_BIAS, SWAP_AB, STORED_K_ORDER, RETIRE_WGMMA, DOT_FP32, USE_ASM, STACK_GATE_UP,
            ACT_QUANT, rexp_ptr, stride_re, qscale_ptr, ra_ptr, lut_ptr, FP8_PROMOTE, WIDE_TAIL_ROWS, MX_WARPS)
    elif half:
        _gemm1_tile(pid_m, pid_n, BLOCK_M // 2, x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, h_ptr, part_ptr, ticket_ptr,
            sorted_pair_ptr, block_expert_ptr, padded_total_ptr, num_pairs, num_m_blocks, K, N, stride_xm, stride_we,
            stride_wn, stride_se, stride_sc, stride_be, stride_hm, stride_ps, stride_pm, alpha, beta, limit, SPLIT_K,
            K_SPLIT, EVEN_K, LAST_SLICE_ACTIVATES, TOP_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SCALE_BLOCK, NVFP4,
            FOLDED, ACTIVATION, HAS_BIAS, SWAP_AB, STORED_K_ORDER, RETIRE_WGMMA, DOT_FP32, USE_ASM, STACK_GATE_UP,
            ACT_QUANT, rexp_ptr, stride_re, qscale_ptr, ra_ptr, lut_ptr, FP8_PROMOTE, MX_WARPS=MX_WARPS)
    else:
        _gemm1_tile(pid_m, pid_n, BLOCK_M, x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, h_ptr, part_ptr, ticket_ptr,
            sorted_pair_ptr, block_expert_ptr, padded_total_ptr, num_pairs, num_m_blocks, K, N, stride_xm, stride_we,
            stride_wn, stride_se, stride_sc, stride_be, stride_hm, stride_ps, stride_pm, alpha, beta, limit, SPLIT_K,
            K_SPLIT, EVEN_K, LAST_SLICE_ACTIVATES, TOP_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SCALE_BLOCK, NVFP4,
            FOLDED, ACTIVATION, HAS_BIAS, SWAP_AB, STORED_K_ORDER, RETIRE_WGMMA, DOT_FP32, USE_ASM, STACK_GATE_UP,
            ACT_QUANT, rexp_ptr, stride_re, qscale_ptr, ra_ptr, lut_ptr, FP8_PROMOTE, MX_WARPS=MX_WARPS)



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
    num_pairs, N: tl.constexpr, stride_ps, stride_pm, stride_be, stride_hm, stride_re, alpha, beta, limit,
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
               rexp_ptr, stride_re, qscale_ptr, act_scales=_static_act_scales(qscale_ptr, ACT_QUANT))


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
    stride_re, qscale_ptr, ra_ptr, lut_ptr, FP8_PROMOTE: tl.constexpr, TAIL: tl.constexpr = 0,
):
    """gemm2_kernel's tile: the first ROWS rows of row block pid_m (ROWS = BLOCK_M, or half of it) and, TAIL > 0 (one
    K slice), the first TAIL rows of block pid_m + 1 as well (TAIL_ROWS)."""
    expert, offs_m, pair, row_ok, offs_n, col_ok, k_base = _block_rows(
        pid_m, pid_n, block_expert_ptr, sorted_pair_ptr, num_pairs, N, K_SPLIT, SPLIT_K, BLOCK_M, BLOCK_N, ROWS)
    a_rows = h_ptr + offs_m.to(tl.int64) * stride_hm
    offs_t, pair_t, ok_t, a_rows_t = offs_m, pair, row_ok, a_rows  # the tail's rows where TAIL > 0 (else unused)
    if TAIL > 0:
        offs_t, pair_t, ok_t = _tail_rows(pid_m, sorted_pair_ptr, num_pairs, BLOCK_M, TAIL)
        a_rows_t = h_ptr + offs_t.to(tl.int64) * stride_hm
    w_rows = _weight_rows(w_ptr + expert * stride_we, offs_n, stride_wn)
    s_ptrs = s_ptr + expert * stride_se + offs_n
    FP8: tl.constexpr = (ACT_QUANT == 1) | (ACT_QUANT == 2)  # E4M3 dots (3: bf16 dots of E4M3 values)
    a2 = 1.0
    if ACT_QUANT == 3:  # before the K loop: after it a load costs a memory latency at every program's end
        a2 = tl.load(qscale_ptr + 2)
    acc, acc_t = _accumulate_k(a_rows, row_ok, w_rows, s_ptrs, col_ok, stride_sc, k_base, K, K_SPLIT, ROWS, BLOCK_N,
                               BLOCK_K, SCALE_BLOCK, NVFP4, FOLDED, EVEN_K, SWAP_AB, STORED_K_ORDER, RETIRE_WGMMA,
                               DOT_FP32, USE_ASM, FP8, lut_ptr, FP8_PROMOTE, a_rows_t, ok_t, TAIL)
    _gemm2_rows_out(acc, expert, offs_m, pair, row_ok, offs_n, col_ok, pid_n, a2, gs_ptr, bias_ptr, route_w_ptr,
                    out_ptr, ticket_ptr, y_ptr, rexp_ptr, qscale_ptr, ra_ptr, N, stride_be, stride_om, stride_os,
                    stride_ym, stride_re, SPLIT_K, BLOCK_N, NVFP4, HAS_BIAS, DOT_FP32, LAST_PAIR_SUMS, TOP_K,
                    ACT_QUANT, ROWS)
    if TAIL > 0:
        _gemm2_rows_out(acc_t, expert, offs_t, pair_t, ok_t, offs_n, col_ok, pid_n, a2, gs_ptr, bias_ptr,
                        route_w_ptr, out_ptr, ticket_ptr, y_ptr, rexp_ptr, qscale_ptr, ra_ptr, N, stride_be,
                        stride_om, stride_os, stride_ym, stride_re, SPLIT_K, BLOCK_N, NVFP4, HAS_BIAS, DOT_FP32,
                        LAST_PAIR_SUMS, TOP_K, ACT_QUANT, TAIL)


@triton.jit
def _gemm2_rows_out(acc, expert, offs_m, pair, row_ok, offs_n, col_ok, pid_n, a2, gs_ptr, bias_ptr, route_w_ptr,
                    out_ptr, ticket_ptr, y_ptr, rexp_ptr, qscale_ptr, ra_ptr, N: tl.constexpr, stride_be, stride_om,
                    stride_os, stride_ym, stride_re, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr,
                    NVFP4: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_FP32: tl.constexpr, LAST_PAIR_SUMS: tl.constexpr,
                    TOP_K: tl.constexpr, ACT_QUANT: tl.constexpr, ROWS: tl.constexpr):
    """GEMM2's epilogue on the sums [ROWS, BLOCK_N] of rows offs_m: scales, bias, router weight, the store of each
    pair's row (or K slice's share), and with LAST_PAIR_SUMS the top-k sums this program completes. a2: static FP8's
    GEMM2 input scale for ACT_QUANT 3 (loaded before the K loop)."""
    FP8: tl.constexpr = (ACT_QUANT == 1) | (ACT_QUANT == 2)
    if FP8:  # the FP8 dots' sums times 2^r of each weight row, the input scale (a2 = qscale[2], or the h rows' 2^ra
        # from act_quant_kernel), the global scale
        a2_fp8 = 1.0
        if ACT_QUANT == 1:
            a2_fp8 = tl.load(qscale_ptr + 2)
        acc = acc * (_pow2(tl.load(rexp_ptr + expert * stride_re + offs_n, mask=col_ok, other=0)) * a2_fp8)[None, :]
        if ACT_QUANT == 2:
            acc = acc * _pow2_from_m127(tl.load(ra_ptr + offs_m, mask=row_ok, other=0))[:, None]
        if NVFP4:
            acc = acc / tl.load(gs_ptr + expert)
    elif NVFP4:  # undo the 2^-NVFP4_FOLD_SHIFT of the dequantized weights (exact), then the global scale
        acc = acc * 65536.0 / tl.load(gs_ptr + expert)
    if ACT_QUANT == 3:
        acc = acc * a2
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
    if out_ptr.dtype.element_ty == tl.bfloat16:  # forward._launch's pair_out: rows in bf16 unless split-K
        acc = _round_bf16(acc, DOT_FP32)
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
                           other=0.0, cache_modifier=".cg").to(tl.float32)
    tl.store(y_ptr + token.to(tl.int64)[:, None] * stride_ym + offs_n[None, :], _round_bf16(acc, INTERPRETED), mask=ok)


@triton.jit
def gemm2_kernel(
    h_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, route_w_ptr, out_ptr, ticket_ptr, y_ptr,
    sorted_pair_ptr, block_expert_ptr, padded_total_ptr, rexp_ptr, qscale_ptr, ra_ptr, lut_ptr,
    num_pairs, num_m_blocks, K: tl.constexpr, N: tl.constexpr,
    stride_hm, stride_we, stride_wn, stride_se, stride_sc, stride_be, stride_om, stride_os, stride_ym, stride_re,
    SPLIT_K: tl.constexpr, K_SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SCALE_BLOCK: tl.constexpr, NVFP4: tl.constexpr, FOLDED: tl.constexpr, HAS_BIAS: tl.constexpr,
    SWAP_AB: tl.constexpr, STORED_K_ORDER: tl.constexpr, RETIRE_WGMMA: tl.constexpr, DOT_FP32: tl.constexpr,
    USE_ASM: tl.constexpr, HALF_ROWS: tl.constexpr, LAST_PAIR_SUMS: tl.constexpr, TOP_K: tl.constexpr,
    ACT_QUANT: tl.constexpr, FP8_PROMOTE: tl.constexpr = False, TAIL_ROWS: tl.constexpr = 0,
    WIDE_TAIL_ROWS: tl.constexpr = 0,
):
    """out[pair, n] = route_weight[pair] * (h[row] @ W2[e]^T + b2[e]) for the N=H outputs, rows in pair order, in
    bf16 (the fp32 sums rounded to nearest even).

    HALF_ROWS, TAIL_ROWS, WIDE_TAIL_ROWS (SPLIT_K 1): what each row block's program multiplies (_row_plan).

    SPLIT_K > 1: program (tile, s) writes its K slice's share to out[s] in fp32 (bias in slice 0 only); the
    top-k sum kernel adds the slices in fixed order. LAST_PAIR_SUMS: the program whose row draws the last of a
    (token, column tile)'s TOP_K * SPLIT_K tickets (int32 [T * ceil(N / BLOCK_N)], zero at launch: the alignment
    zeroes them) writes y[token] for that tile itself (_topk_sum_store), and no top-k sum launch follows.
    ACT_QUANT 1, 2 (W4A8): h holds E4M3 codes (1: static, times a2 = qscale[2]; 2: MXFP8 rebased per row by
    act_quant_kernel, times the rows' 2^ra at ra_ptr), the weights in the W4A8 byte order as in gemm1_act_kernel,
    the sums times 2^r of each weight row (rexp int32 [E, N]). 3 (static FP8 on bf16 dots): W4A16 on h holding the
    E4M3 values of h / a2, the sums times a2 before the bias.
    """
    pid_m, pid_n = _tile_ids(num_m_blocks, N, BLOCK_N, GROUP_M)
    padded_total = tl.load(padded_total_ptr)
    if pid_m * BLOCK_M >= padded_total:
        return
    absorbed, half, tail, wide = _row_plan(pid_m, sorted_pair_ptr, block_expert_ptr, padded_total, num_pairs,
                                           BLOCK_M, HALF_ROWS, TAIL_ROWS, WIDE_TAIL_ROWS)
    if absorbed:
        return
    if tail:
        _gemm2_tile(pid_m, pid_n, BLOCK_M, h_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, route_w_ptr, out_ptr,
            ticket_ptr, y_ptr, sorted_pair_ptr, block_expert_ptr, padded_total_ptr, num_pairs, num_m_blocks, K, N,
            stride_hm, stride_we, stride_wn, stride_se, stride_sc, stride_be, stride_om, stride_os, stride_ym, SPLIT_K,
            K_SPLIT, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SCALE_BLOCK, NVFP4, FOLDED, HAS_BIAS, SWAP_AB,
            STORED_K_ORDER, RETIRE_WGMMA, DOT_FP32, USE_ASM, LAST_PAIR_SUMS, TOP_K, ACT_QUANT, rexp_ptr, stride_re,
            qscale_ptr, ra_ptr, lut_ptr, FP8_PROMOTE, TAIL_ROWS)
    elif wide:
        _gemm2_tile(pid_m, pid_n, BLOCK_M, h_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, route_w_ptr, out_ptr,
            ticket_ptr, y_ptr, sorted_pair_ptr, block_expert_ptr, padded_total_ptr, num_pairs, num_m_blocks, K, N,
            stride_hm, stride_we, stride_wn, stride_se, stride_sc, stride_be, stride_om, stride_os, stride_ym, SPLIT_K,
            K_SPLIT, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SCALE_BLOCK, NVFP4, FOLDED, HAS_BIAS, SWAP_AB,
            STORED_K_ORDER, RETIRE_WGMMA, DOT_FP32, USE_ASM, LAST_PAIR_SUMS, TOP_K, ACT_QUANT, rexp_ptr, stride_re,
            qscale_ptr, ra_ptr, lut_ptr, FP8_PROMOTE, WIDE_TAIL_ROWS)
    elif half:
        _gemm2_tile(pid_m, pid_n, BLOCK_M // 2, h_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, route_w_ptr, out_ptr,
            ticket_ptr, y_ptr, sorted_pair_ptr, block_expert_ptr, padded_total_ptr, num_pairs, num_m_blocks, K, N,
            stride_hm, stride_we, stride_wn, stride_se, stride_sc, stride_be, stride_om, stride_os, stride_ym, SPLIT_K,
            K_SPLIT, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SCALE_BLOCK, NVFP4, FOLDED, HAS_BIAS, SWAP_AB,
            STORED_K_ORDER, RETIRE_WGMMA, DOT_FP32, USE_ASM, LAST_PAIR_SUMS, TOP_K, ACT_QUANT, rexp_ptr, stride_re,
            qscale_ptr, ra_ptr, lut_ptr, FP8_PROMOTE)
    else:
        _gemm2_tile(pid_m, pid_n, BLOCK_M, h_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, route_w_ptr, out_ptr,
            ticket_ptr, y_ptr, sorted_pair_ptr, block_expert_ptr, padded_total_ptr, num_pairs, num_m_blocks, K, N,
            stride_hm, stride_we, stride_wn, stride_se, stride_sc, stride_be, stride_om, stride_os, stride_ym, SPLIT_K,
            K_SPLIT, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SCALE_BLOCK, NVFP4, FOLDED, HAS_BIAS, SWAP_AB,
            STORED_K_ORDER, RETIRE_WGMMA, DOT_FP32, USE_ASM, LAST_PAIR_SUMS, TOP_K, ACT_QUANT, rexp_ptr, stride_re,
            qscale_ptr, ra_ptr, lut_ptr, FP8_PROMOTE)


@triton.jit
def topk_sum_kernel(pair_out_ptr, out_ptr, N: tl.constexpr, stride_pm, stride_om, stride_ps,
                    TOP_K: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRETED: tl.constexpr):
    """y[t] = sum_j sum_s pair_out[s, t*k + j] in fp32 in fixed order (j outer, split s inner; deterministic), bf16."""
    token = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = offs_n < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        for s in tl.static_range(SPLIT_K):
            acc += tl.load(pair_out_ptr + s * stride_ps + (token * TOP_K + j) * stride_pm + offs_n, mask=ok,
                           other=0.0).to(tl.float32)
    tl.store(out_ptr + token * stride_om + offs_n, _round_bf16(acc, INTERPRETED), mask=ok)


@triton.jit
def act_quant_kernel(src_ptr, dst_ptr, exp_ptr, a1_ptr, a2_ptr, qscale_ptr, rows, padded_total_ptr, K: tl.constexpr,
                     stride_src, stride_dst, SCHEME: tl.constexpr, PADDED_ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                     INTERPRETED: tl.constexpr, VALUES_BF16: tl.constexpr = False, PDL: tl.constexpr = False):
    """A W4A8 GEMM input row as E4M3 codes, once per row rather than once per column tile of the GEMM that reads it
    (one program per row, the whole row in registers: BLOCK_K >= K): SCHEME 1 e4m3(clamp(v * (1 / a1), +-448))
    (GEMM1's static per-tensor FP8 input, a1 at a1_ptr; program 0 also writes qscale [a1, 1/a1, a2, 1/a2], the scales
    the GEMMs read, a2 at a2_ptr: in a CUDA graph torch's three small launches for them cost 3-5 µs at T = 1); 2 MXFP8
    rebased to the row's largest block exponent ra (_mx_quant_rebased; ra int32 to exp_ptr). The reciprocals are
    rounded to nearest, as torch's (formats.quantize_fp8_per_tensor). PADDED_ROWS (h, rows in GEMM1's padded row
    blocks): rows past the alignment's padded_total_ptr[0] are skipped. VALUES_BF16: for bf16 dots, the operand's
    values to a bf16 dst instead (an E4M3 value times a power of two is a bf16 value): SCHEME 1 its codes' values,
    SCHEME 2 plain MXFP8 (_mx_values), with no row rebase, which only FP8 dots need. PDL (sm_90): the next kernel,
    launched as this one's programmatic dependent (the decode path's GEMV1), may start at once."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0)
    if PADDED_ROWS:
        rows = tl.minimum(rows, tl.load(padded_total_ptr))
    if row >= rows:
        return
    if SCHEME == 1:
        a1 = tl.load(a1_ptr)
        inv_a1 = tl.math.div_rn(1.0, a1)
        if row == 0:
            a2 = tl.load(a2_ptr)
            i = tl.arange(0, 4)
            tl.store(qscale_ptr + i, tl.where(i == 0, a1, tl.where(i == 1, inv_a1, tl.where(i == 2, a2,
                                                                                             tl.math.div_rn(1.0, a2)))))
    cols = tl.arange(0, BLOCK_K)[None, :]
    ok = cols < K
    v = tl.load(src_ptr + row.to(tl.int64) * stride_src + cols, mask=ok, other=0.0).to(tl.float32)
    if SCHEME == 2:
        if VALUES_BF16:
            q = _mx_values(v, 32, INTERPRETED)
        else:
            ra = _mx_exp(tl.max(tl.abs(v), axis=1))
            tl.store(exp_ptr + row + tl.arange(0, 1), ra)
            q = _mx_quant_rebased(v, ra, INTERPRETED)
    else:
        q = _to_e4m3(v * inv_a1, INTERPRETED)
    if VALUES_BF16:
        tl.store(dst_ptr + row.to(tl.int64) * stride_dst + cols, _round_bf16(q.to(tl.float32), INTERPRETED), mask=ok)
    else:
        tl.store(dst_ptr + row.to(tl.int64) * stride_dst + cols, q.to(tl.float8e4nv), mask=ok)


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
