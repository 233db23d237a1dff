"""The warp-specialized W4A16 prefill GEMMs (Gluon, sm_90), and the word decode they share with the Gluon probe.

One kernel, `ws_moe_gemm_kernel`, runs both GEMMs of the layer over expert-sorted row blocks:

    loader partition (LOADER_WARPS warps): each K step's packed weight tile by TMA into a STAGES-deep ring, and the
        step's activation tile: GEMM1 gathers its x rows (token = pair // k of the block's sorted pairs) with cp.async
        or loads x's rows copied to the sorted order by TMA (GATHER), GEMM2 loads h's rows by TMA;
        mbarrier-signalled, slots released by the consumer
    default partition (NUM_WARPS, one warpgroup per 64 weight rows): the packed int32 words (`pack_words` "words"
        order) straight into the wgmma's A registers through the layer kernels' word routine (`_E2M1_WORD_ASM`, the
        block scales folded into its FMAs), an async wgmma of W x X^T into the accumulator, left in flight while
        the next tile is decoded into the other of two register sets
    epilogue: NVFP4's global scale, the bias, then GEMM1: the activation over gate/up rows that the weight order
        puts in one thread (`ws_row_order`), h's tile out by TMA; GEMM2: the router weight, each pair's bf16 row
        stored to its (token, slot) row for the top-k sum

so the weights never pass through shared memory after the TMA (benchmarks/probe_gluon_w4a16.py measured the GEMMs
alone at 0.70-0.83 of the bf16 matmul at T = 16384 on an H100, ahead of the Triton tile kernels there).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from backends.triton_moe._kernels import (
    _E2M1_WORD_ASM,
    ACT_SWIGLUOAI,
    E2M1_TO_E4M3_ROWS_ASM,
    E2M1_TO_E4M3_TWO_ROWS_ASM,
)
from backends.triton_moe.warp_specialized import fp8_dots

_SWIGLUOAI = gl.constexpr(ACT_SWIGLUOAI)
#: Whether an ACT_QUANT multiplies on FP8 tensor cores: warp_specialized.fp8_dots, the one definition.
_fp8_dots = gluon.constexpr_function(fp8_dots)

#: TMA load and store: `async_load` / `async_store` from triton 3.7 on, `async_copy_*` before (the GPU machines: 3.6).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
#: cp.async of a pointer tensor into shared memory: `async_load` from triton 3.9 on, `async_copy_global_to_shared`
#: before.
_cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
#: A barrier of the calling partition's warps: `gl.thread_barrier` in triton 3.6, `gl.barrier` from 3.9 on.
_partition_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

#: Per 32-wide K block, the K offset of output j (0..7) of word t (0..3) in each packed-words order: "smem" K order
#: (word t: offsets 8t..8t+7); "words" the wgmma A registers' order (word t: the thread of its quad that holds
#: offsets 2t + {0, 1, 8, 9, 16, 17, 24, 25}).
WORD_ORDERS = {"smem": [[8 * t + j for j in range(8)] for t in range(4)],
               "words": [[16 * (j >> 2) + 8 * ((j >> 1) & 1) + 2 * t + (j & 1) for j in range(8)] for t in range(4)]}


def pack_words(packed, form: str, chunk_rows: int = 16384):
    """MXFP4 / NVFP4 code bytes [rows, K/2] (element 2j in byte j's low nibble) as the int32 words [rows, K/8] a
    form decodes: output j of a word is the code at WORD_ORDERS[form]'s offset, placed where the word routine
    (`_E2M1_WORD_ASM`) yields output j (byte j % 4, low nibble for j < 4), in the layer's bit order
    (`_encode_words`). Converted chunk_rows rows at a time (`_encode_words` widens to int64)."""
    import torch

    from backends.layouts.triton_moe import _encode_words

    offsets = torch.tensor(WORD_ORDERS[form], device=packed.device)  # [word t, output j]
    out = torch.empty_like(packed)
    for first in range(0, packed.shape[0], chunk_rows):
        part = packed[first:first + chunk_rows]
        codes = torch.stack([part & 15, part >> 4], dim=-1).reshape(*part.shape[:-1], -1, 32)  # [.., block, offset]
        words = codes[..., offsets]  # [.., block, t, j]
        out[first:first + chunk_rows] = _encode_words((words[..., :4] | (words[..., 4:] << 4)).reshape(part.shape))
    return out.view(torch.int32)


@gluon.constexpr_function
def operand_words_layout(linear, shape):
    """The layout of the packed tile's int32 words [BLOCK_N, BLOCK_K / 8] (`pack_words`' "words" order) that puts
    each word in the thread whose wgmma A registers take its 8 values: the operand's linear layout (`linear`, over
    `shape` [BLOCK_N, BLOCK_K]) with its K bases 1, 8 and 16 (a word's values) dropped, K 2 and 4 (the thread in
    its quad) as words 1 and 2, and K 32, 64 (the 32-wide scale block) as words 4 and 8."""

    def bases(of):
        return [[row, {2: 1, 4: 2}.get(k, 4 * k // 32)] for row, k in of if k not in (1, 8, 16)]

    return gl.DistributedLinearLayout(reg_bases=bases(linear.reg_bases), lane_bases=bases(linear.lane_bases),
                                      warp_bases=bases(linear.warp_bases), block_bases=[],
                                      shape=[shape[0], shape[1] // 8])


@gluon.jit
def _word_routine(words, scale_lo, scale_hi):
    """The layer kernels' word routine (`_E2M1_WORD_ASM`) on int32 words: 8 bf16 tensors, outputs 0-3 (the word
    bytes' low halves, times scale_lo) then 4-7 (the high halves, times scale_hi)."""
    return gl.inline_asm_elementwise(_E2M1_WORD_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [words, scale_lo, scale_hi],
                                     dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)


@gluon.jit
def _operand_from_words(words, scale_lo, scale_hi, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    """The packed words decoded by the word routine (about 18 instructions a word, the folded block scales in its
    bf16x2 FMAs: scale_lo for outputs 0-3, scale_hi for 4-7, one 16-wide block each) into the [BLOCK_N, BLOCK_K]
    tile the wgmma's A registers hold already (the caller's conversion to the operand layout moves nothing):
    output j of word 4 h + t of a row is K = 32 h + 16 (j >> 2) + 8 ((j >> 1) & 1) + 2 t + (j & 1)
    (WORD_ORDERS["words"])."""
    e0, e1, e2, e3, e4, e5, e6, e7 = _word_routine(words, scale_lo, scale_hi)
    w = gl.join(gl.join(gl.join(e0, e4), gl.join(e2, e6)), gl.join(gl.join(e1, e5), gl.join(e3, e7)))  # [.., x, y, z]
    w = gl.reshape(w, [BLOCK_N, BLOCK_K // 32, 4, 2, 2, 2])  # [row, h, t, x, y, z]
    return gl.reshape(gl.permute(w, [0, 1, 3, 4, 2, 5]), [BLOCK_N, BLOCK_K])  # K = 32 h + 16 x + 8 y + 2 t + z


@gluon.jit
def _mxfp4_folded(scale):
    """An E8M0 scale byte as the word routine's folded bf16 scale 2^126 * 2^(s - 127), exact for s <= 128."""
    return ((scale.to(gl.int16) + 126) << 7).to(gl.bfloat16, bitcast=True)


@gluon.jit
def _scale_load(scale_ptrs, row_ok, i, words, K, BLOCK_K: gl.constexpr, PAD: gl.constexpr):
    """K tile i's block scales of each word (scale_ptrs: a word's E8M0 byte, or NVFP4's two scales folded already,
    `ws_weights`: bf16 s * 2^110 of the first 16-wide block in the low half of an int32); rows past the expert's N
    (row_ok False) and tiles past K read PAD."""
    ok = row_ok[:, None] & (i * (BLOCK_K // 32) + words // 4 < K // 32)[None, :]
    return gl.load(scale_ptrs + i * (BLOCK_K // 32), mask=ok, other=PAD)


@gluon.jit
def _step_scales(scale_ptrs, row_ok, i, words, K, BLOCK_K: gl.constexpr, PAD: gl.constexpr, FP8: gl.constexpr):
    """K step i's scales as the K loop carries them: FP8 dots' rows' step codes (`_code_load`), else each word's
    block scales (`_scale_load`)."""
    if FP8:
        loaded = _code_load(scale_ptrs, row_ok, i, K, BLOCK_K)
    else:
        loaded = _scale_load(scale_ptrs, row_ok, i, words, K, BLOCK_K, PAD)
    return loaded


@gluon.jit
def _pow2(e):
    """2^e as fp32 for int32 e in [-126, 127], from the exponent bits (exact; the tile kernels' _pow2)."""
    return ((e + 127) << 23).to(gl.float32, bitcast=True)


@gluon.jit
def _pow2_from_m127(e):
    """2^e for int32 e in [-127, 126] (2^-127 is subnormal: 2^(e + 1) / 2, exact; MXFP8 rows' exponents)."""
    return _pow2(e + 1) * 0.5


@gluon.jit
def _folded_scales(loaded, NVFP4: gl.constexpr):
    """_scale_load's scales as the word routine's two folded bf16 operands (for outputs 0-3, for outputs 4-7)."""
    if NVFP4:
        return ((loaded & 0xFFFF).to(gl.int16).to(gl.bfloat16, bitcast=True),
                (loaded >> 16).to(gl.int16).to(gl.bfloat16, bitcast=True))
    folded = _mxfp4_folded(loaded)
    return folded, folded


@gluon.constexpr_function
def lut_bytes_layout(linear, shape):
    """The layout of the W4A8 bytes [BLOCK_N, BLOCK_K / 2] (`layouts.triton_moe.W4A8_CHUNK` order: per 32-wide K
    chunk h, word t holds values 32 h + 4 t + q (A) and 32 h + 16 + 4 t + q (B), q = 0..3) that puts each word's 4
    bytes in the registers of the thread whose FP8 wgmma A registers take its values: the operand's linear layout
    (k_width 4, over `shape` [BLOCK_N, BLOCK_K]) with K base 16 (A or B) dropped and K bases from 32 on halved."""

    def bases(of):
        return [[row, k if k < 16 else k // 2] for row, k in of if k != 16]

    return gl.DistributedLinearLayout(reg_bases=bases(linear.reg_bases), lane_bases=bases(linear.lane_bases),
                                      warp_bases=bases(linear.warp_bases), block_bases=[],
                                      shape=[shape[0], shape[1] // 2])


@gluon.constexpr_function
def lut_words_layout(linear, shape):
    """lut_bytes_layout's (`linear` over `shape` [BLOCK_N, BLOCK_K / 2]) words [BLOCK_N, BLOCK_K / 8]: its byte
    bases 1 and 2 dropped, the others divided by 4 (word 4 h + t of a row)."""

    def bases(of):
        return [[row, k // 4] for row, k in of if k not in (1, 2)]

    return gl.DistributedLinearLayout(reg_bases=bases(linear.reg_bases), lane_bases=bases(linear.lane_bases),
                                      warp_bases=bases(linear.warp_bases), block_bases=[],
                                      shape=[shape[0], shape[1] // 4])


@gluon.jit
def _per_byte(word_values, w8):
    """Each word's value [BLOCK_N, BLOCK_K / 8] repeated for its 4 bytes, in w8's layout (the same registers)."""
    both = gl.join(word_values, word_values)
    return gl.convert_layout(gl.reshape(gl.join(both, both), w8.shape), w8.type.layout, assert_trivial=True)


_ROWS_ASM = gl.constexpr(E2M1_TO_E4M3_ROWS_ASM)
_TWO_ROWS_ASM = gl.constexpr(E2M1_TO_E4M3_TWO_ROWS_ASM)
#: Their operands (pack=4): two E4M3 registers out, the 4 weight bytes, each table word once per byte.
_ROWS_CONSTRAINTS = gl.constexpr("=r,=r,r," + ",".join(["r"] * 8))
_TWO_ROWS_CONSTRAINTS = gl.constexpr("=r,=r,r," + ",".join(["r"] * 16))


@gluon.jit
def _code_load(code_ptrs, row_ok, i, K, BLOCK_K: gl.constexpr):
    """K step i's table codes of each row (code_ptrs [BLOCK_N]: the row's `code_steps` integers, one a step; rows
    past the expert's N and steps past K read 0, never decoded)."""
    return gl.load(code_ptrs + i, mask=row_ok & (i * BLOCK_K < K), other=0)


@gluon.jit
def _word_codes(step_codes, words, NVFP4: gl.constexpr, BLOCK_K: gl.constexpr):
    """Each word's table code (int32 [BLOCK_N, BLOCK_K / 8]; word 4 h + t of a row lies in 32-wide chunk h) from
    the rows' step codes (`_code_load`: chunk h in byte h, NVFP4 in 16-bit half h)."""
    h = (words // 4)[None, :]
    if NVFP4:
        if BLOCK_K == 128:  # four 16-bit chunk codes in an int64: its low word holds chunks 0-1, the high 2-3
            low = gl.expand_dims(step_codes.to(gl.int32), 1)
            high = gl.expand_dims((step_codes >> 32).to(gl.int32), 1)
            codes = (gl.where(h < 2, low, high) >> (16 * (h % 2))) & 0xFFFF
        else:
            codes = (gl.expand_dims(step_codes, 1) >> (16 * h)) & 0xFFFF
    else:
        codes = (gl.expand_dims(step_codes.to(gl.int32), 1) >> (8 * h)) & 0xFF
    return codes


@gluon.jit
def _table_rows(lut_ptr, code, NVFP4: gl.constexpr):
    """Each word's 8-byte table rows (w4a8_lut_table viewed as int64 [256] at lut_ptr; L1-resident) for its code
    (int32: MXFP4 its block's; NVFP4 A's block in the low byte, B's in the next): (A's, B's), B's = A's for MXFP4."""
    if NVFP4:
        return gl.load(lut_ptr + (code & 0xFF)), gl.load(lut_ptr + ((code >> 8) & 0xFF))
    row = gl.load(lut_ptr + code)
    return row, row


@gluon.jit
def _operand_from_lut(w8, rows, NVFP4: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    """W4A8 bytes (lut_bytes_layout) and each word's table rows (`_table_rows`) -> the FP8 wgmma's E4M3 A operand
    [BLOCK_N, BLOCK_K], by the tile kernels' routine (two `prmt` lookups in the 8-byte rows, 8 ops per 8 weights)."""
    row_a, row_b = rows
    la0 = _per_byte(row_a.to(gl.int32), w8)
    la1 = _per_byte((row_a >> 32).to(gl.int32), w8)
    if NVFP4:
        a, b = gl.inline_asm_elementwise(_TWO_ROWS_ASM, _TWO_ROWS_CONSTRAINTS,
                                         [w8, la0, la1, _per_byte(row_b.to(gl.int32), w8),
                                          _per_byte((row_b >> 32).to(gl.int32), w8)],
                                         dtype=(gl.int8, gl.int8), is_pure=True, pack=4)
    else:
        a, b = gl.inline_asm_elementwise(_ROWS_ASM, _ROWS_CONSTRAINTS, [w8, la0, la1],
                                         dtype=(gl.int8, gl.int8), is_pure=True, pack=4)
    w = gl.join(a.to(gl.float8e4nv, bitcast=True), b.to(gl.float8e4nv, bitcast=True))  # byte 16 h + 4 t + q, A / B
    w = gl.permute(gl.reshape(w, [BLOCK_N, BLOCK_K // 32, 16, 2]), [0, 1, 3, 2])
    return gl.reshape(w, [BLOCK_N, BLOCK_K])  # K = 32 h + 16 (B) + 4 t + q


@gluon.jit
def _kept(w):
    """An 8-bit wgmma operand read again (a copy nobody uses) after the wait that retires its wgmma: its registers
    stay live, so the next decode cannot write them while that wgmma may read them. The wait's own deps would do
    this, but triton 3.6 lowers only 16- and 32-bit deps ("Unexpected bitwidth in WGMMAWaitGroupOp: 8")."""
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [w.to(gl.int8, bitcast=True)], dtype=gl.int8,
                                     is_pure=False, pack=4).to(w.dtype, bitcast=True)


# ---------------------------------------------------------------------------------------------
# The layer's GEMMs
# ---------------------------------------------------------------------------------------------


@gluon.jit
def _gathered_rows(x_ptr, stride_xm, pair_ptr, num_pairs, first, ROWS: gl.constexpr, rows: gl.constexpr,
                   TOP_K: gl.constexpr, BLOCK_K: gl.constexpr):
    """Pointers [ROWS, BLOCK_K] of K tile 0 of the x rows of sorted pairs first .. first + ROWS (token = pair //
    TOP_K); a padding row reads token 0's row: its sums are never stored."""
    pair = gl.load(pair_ptr + first + gl.arange(0, ROWS, layout=gl.SliceLayout(1, rows)))
    token = gl.where(pair < num_pairs, pair // TOP_K, 0)
    return (x_ptr + token.to(gl.int64)[:, None] * stride_xm
            + gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, rows))[None, :])


@gluon.jit
def _in_k(i, K, ROWS: gl.constexpr, BLOCK_K: gl.constexpr, rows: gl.constexpr):
    """[ROWS, BLOCK_K] mask of K step i's columns that are under K."""
    cols = i * BLOCK_K + gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, rows))
    return (gl.zeros([ROWS, BLOCK_K], gl.int32, rows) + cols[None, :]) < K


@gluon.jit
def _gather_loader(x_ptr, stride_xm, pair_ptr, num_pairs, w_desc, x_bufs, xt_bufs, w_bufs, ready, empty, tiles, this, N,
                   k_tiles, K, TOP_K: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   BLOCK_K: gl.constexpr, LOADER_WARPS: gl.constexpr, TAIL_M: gl.constexpr, K_TAIL: gl.constexpr,
                   PERSISTENT: gl.constexpr):
    """GEMM1's loader over the program's tiles (`tiles`; a program per tile: `this`): `_gather_tile`."""
    if PERSISTENT:
        for tile in range(gl.program_id(0), tiles[0] * tiles[1], gl.num_programs(0)):
            _, first, _, w_row = _tile_at(tile // tiles[0], tile % tiles[0], tiles, N, BLOCK_N)
            _gather_tile(first, w_row, _ring_base(tile, k_tiles), x_ptr, stride_xm, pair_ptr, num_pairs, w_desc,
                         x_bufs, xt_bufs, w_bufs, ready, empty, k_tiles, K, TOP_K, BLOCK_M, BLOCK_K, LOADER_WARPS,
                         TAIL_M, K_TAIL)
    else:
        _gather_tile(this[1], this[3], 0, x_ptr, stride_xm, pair_ptr, num_pairs, w_desc, x_bufs, xt_bufs, w_bufs, ready,
                     empty, k_tiles, K, TOP_K, BLOCK_M, BLOCK_K, LOADER_WARPS, TAIL_M, K_TAIL)


@gluon.jit
def _gather_tile(first, w_row, base, x_ptr, stride_xm, pair_ptr, num_pairs, w_desc, x_bufs, xt_bufs, w_bufs, ready,
                 empty, k_tiles, K, TOP_K: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_K: gl.constexpr,
                 LOADER_WARPS: gl.constexpr, TAIL_M: gl.constexpr, K_TAIL: gl.constexpr):
    """GEMM1's loads of one tile (`_tile_at`'s first and w_row) from the ring's step `base` on: per K step the packed
    weight tile by TMA and the block's x rows by cp.async (sm_90's TMA cannot gather rows), and the tail's (TAIL_M rows
    after them) into xt_bufs, each thread's copies arriving on the slot's ready barrier as they land. K_TAIL: the last
    step's columns past K are zero-filled, not read (they would be the next row's, or past x's end); TMA fills the
    weight tile's with zeros."""
    STAGES: gl.constexpr = x_bufs.type.shape[0]
    VEC: gl.constexpr = 128 // x_bufs.dtype.primitive_bitwidth  # elements of one 16-byte copy
    rows: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // (BLOCK_K // VEC), BLOCK_K // VEC], [LOADER_WARPS, 1],
                                          [1, 0])
    ptrs = _gathered_rows(x_ptr, stride_xm, pair_ptr, num_pairs, first, BLOCK_M, rows, TOP_K, BLOCK_K)
    if TAIL_M:
        tail_ptrs = _gathered_rows(x_ptr, stride_xm, pair_ptr, num_pairs, first + BLOCK_M, TAIL_M, rows, TOP_K,
                                   BLOCK_K)
    for i in range(k_tiles):
        slot = (base + i) % STAGES
        mbarrier.wait(empty.index(slot), (((base + i) // STAGES) & 1) ^ 1)  # a fresh barrier counts as released
        mbarrier.expect(ready.index(slot), w_desc.block_type.nbytes)
        _tma_load(w_desc, [w_row, i * w_desc.block_type.shape[1]], ready.index(slot), w_bufs.index(slot))
        _cp_async(x_bufs.index(slot), ptrs + i * BLOCK_K, mask=_in_k(i, K, BLOCK_M, BLOCK_K, rows) if K_TAIL else None)
        if TAIL_M:
            _cp_async(xt_bufs.index(slot), tail_ptrs + i * BLOCK_K,
                      mask=_in_k(i, K, TAIL_M, BLOCK_K, rows) if K_TAIL else None)
        async_copy.mbarrier_arrive(ready.index(slot), increment_count=False)


@gluon.jit
def _tma_loader(x_desc, xt_desc, w_desc, x_bufs, xt_bufs, w_bufs, ready, empty, tiles, this, N, k_tiles,
                BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, TAIL_M: gl.constexpr, PERSISTENT: gl.constexpr):
    """GEMM2's loader over the program's tiles: `_tma_tile`."""
    if PERSISTENT:
        for tile in range(gl.program_id(0), tiles[0] * tiles[1], gl.num_programs(0)):
            _, first, _, w_row = _tile_at(tile // tiles[0], tile % tiles[0], tiles, N, BLOCK_N)
            _tma_tile(first, w_row, _ring_base(tile, k_tiles), x_desc, xt_desc, w_desc, x_bufs, xt_bufs, w_bufs,
                      ready, empty, k_tiles, BLOCK_K, TAIL_M)
    else:
        _tma_tile(this[1], this[3], 0, x_desc, xt_desc, w_desc, x_bufs, xt_bufs, w_bufs, ready, empty, k_tiles, BLOCK_K,
                  TAIL_M)


@gluon.jit
def _tma_tile(first, w_row, base, x_desc, xt_desc, w_desc, x_bufs, xt_bufs, w_bufs, ready, empty, k_tiles,
              BLOCK_K: gl.constexpr, TAIL_M: gl.constexpr):
    """GEMM2's loads of one tile (`_tile_at`'s first and w_row) from the ring's step `base` on: per K step the packed
    weight tile and h's rows [first, first + BLOCK_M) by TMA, and the tail's TAIL_M rows after them (xt_desc's box) into
    xt_bufs."""
    STAGES: gl.constexpr = x_bufs.type.shape[0]
    if TAIL_M:
        nbytes: gl.constexpr = x_desc.block_type.nbytes + w_desc.block_type.nbytes + xt_desc.block_type.nbytes
    else:
        nbytes: gl.constexpr = x_desc.block_type.nbytes + w_desc.block_type.nbytes
    for i in range(k_tiles):
        slot = (base + i) % STAGES
        mbarrier.wait(empty.index(slot), (((base + i) // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(slot), nbytes)
        _tma_load(x_desc, [first, i * BLOCK_K], ready.index(slot), x_bufs.index(slot))
        if TAIL_M:
            _tma_load(xt_desc, [first + x_desc.block_type.shape[0], i * BLOCK_K], ready.index(slot),
                      xt_bufs.index(slot))
        _tma_load(w_desc, [w_row, i * w_desc.block_type.shape[1]], ready.index(slot), w_bufs.index(slot))


@gluon.jit
def _ring_base(tile, k_tiles):
    """The ring's step at which a persistent program's tile starts: its earlier tiles' K steps."""
    return (tile - gl.program_id(0)) // gl.num_programs(0) * k_tiles


@gluon.jit
def _tile_at(b, n, tiles, N, BLOCK_N: gl.constexpr):
    """Column tile n of block b (`tiles`: the kernel's; `ws_blocks`' tables): (expert, first sorted row, first
    weight row of the expert's N, first row of the layer's weights)."""
    expert = gl.load(tiles[2] + b)
    first = gl.load(tiles[3] + b)
    off_n = n * BLOCK_N
    return expert, first, off_n, expert * N + off_n


@gluon.jit
def _step(i, g, acc, acc_t, w_keep, scales, x_bufs, xt_bufs, w_bufs, ready, empty, scale_ptrs, row_ok, words, K,
          lut_ptr, rows, next_codes, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, NVFP4: gl.constexpr,
          GATHERED: gl.constexpr, FP8: gl.constexpr, PAD: gl.constexpr, TAIL_M: gl.constexpr):
    """K tile i at the ring's step g (its scales loaded two steps ahead: `scales`): decode the packed tile into the
    wgmma's A registers, issue the wgmma (and, with TAIL_M, a second one of the same operand into the tail's
    accumulator acc_t), wait for tile i - 1's (whose operand w_keep stays alive until then, so the two operands never
    share registers; W4A8's through `_kept`) and release its slot; returns tile i + 2's scales and `rows`' next.
    FP8 (W4A8): the W4A8 bytes by table into an FP8 wgmma's operand (`_operand_from_lut`): `scales` are the rows'
    step codes (`_code_load`, one integer a row), `rows` tile i's table rows, loaded a step ahead from `next_codes`
    (tile i + 1's), so that neither load is waited for in the step that needs it (ncu: the code-to-row-to-decode
    chain in one step stalled the K loop); unused by W4A16.
    GATHERED: the X tile was written by cp.async, which the wgmma's async proxy sees only after a proxy fence; the
    fence also waits for the thread's loads in flight, so there the scale loads are issued after it (a fence behind
    them waits for them at once: ncu counted 7-10% of GEMM1's warp samples on it)."""
    STAGES: gl.constexpr = x_bufs.type.shape[0]
    slot = g % STAGES
    if not GATHERED:
        next_scales = _step_scales(scale_ptrs, row_ok, i + 2, words, K, BLOCK_K, PAD, FP8)
    if not FP8:
        scale_lo, scale_hi = _folded_scales(scales, NVFP4)
    mbarrier.wait(ready.index(slot), (g // STAGES) & 1)
    if GATHERED:
        fence_async_shared()
        next_scales = _step_scales(scale_ptrs, row_ok, i + 2, words, K, BLOCK_K, PAD, FP8)
    if FP8:
        bytes_layout: gl.constexpr = lut_bytes_layout(gl.to_linear_layout(w_keep.type.layout, [BLOCK_N, BLOCK_K]),
                                                      [BLOCK_N, BLOCK_K])
        w = gl.convert_layout(_operand_from_lut(w_bufs.index(slot).load(bytes_layout), rows, NVFP4, BLOCK_N, BLOCK_K),
                              w_keep.type.layout, assert_trivial=True)
    else:
        w = gl.convert_layout(_operand_from_words(w_bufs.index(slot).load(words.type.layout.parent), scale_lo,
                                                  scale_hi, BLOCK_N, BLOCK_K), w_keep.type.layout, assert_trivial=True)
    acc = warpgroup_mma(w, x_bufs.index(slot).permute((1, 0)), acc, is_async=True)
    if TAIL_M:  # the same registers as the tail's operand: the A layout does not depend on the wgmma's N
        tail_operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_t.type.layout,
                                                         k_width=4 if FP8 else 2)
        acc_t = warpgroup_mma(gl.convert_layout(w, tail_operand, assert_trivial=True),
                              xt_bufs.index(slot).permute((1, 0)), acc_t, is_async=True)
    if FP8:
        next_rows = _table_rows(lut_ptr, _word_codes(next_codes, words, NVFP4, BLOCK_K), NVFP4)
        if TAIL_M:
            acc, acc_t = warpgroup_mma_wait(num_outstanding=2, deps=[acc, acc_t])
        else:
            acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
        _kept(w_keep)
    else:
        next_rows = rows
        if TAIL_M:
            acc, acc_t, w_keep = warpgroup_mma_wait(num_outstanding=2, deps=[acc, acc_t, w_keep])
        else:
            acc, w_keep = warpgroup_mma_wait(num_outstanding=1, deps=[acc, w_keep])
    mbarrier.arrive(empty.index((g + STAGES - 1) % STAGES), count=1, pred=i > 0)
    return acc, acc_t, w, next_scales, next_rows


@gluon.jit
def _consumer(x_bufs, xt_bufs, w_bufs, y_smem, yt_smem, ready, empty, y_desc, yt_desc, s_ptr, stride_sn, out_ptr,
              stride_om, pair_ptr, num_pairs, gs_ptr, bias_ptr, stride_be, route_w_ptr, tiles, this, N, K, k_tiles,
              alpha, beta, limit, w4a8, GEMM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              BLOCK_K: gl.constexpr, NUM_WARPS: gl.constexpr, NVFP4: gl.constexpr, HAS_BIAS: gl.constexpr,
              ACTIVATION: gl.constexpr, ACT_QUANT: gl.constexpr, TOP_K: gl.constexpr, TAIL_M: gl.constexpr,
              PERSISTENT: gl.constexpr, GATHER: gl.constexpr):
    """The consumers over the program's tiles (`tiles`; a program per tile: `this`): `_consumer_tile`."""
    if PERSISTENT:
        for tile in range(gl.program_id(0), tiles[0] * tiles[1], gl.num_programs(0)):
            expert, first, off_n, w_row = _tile_at(tile // tiles[0], tile % tiles[0], tiles, N, BLOCK_N)
            _consumer_tile(expert, first, off_n, w_row, _ring_base(tile, k_tiles), x_bufs, xt_bufs, w_bufs, y_smem,
                           yt_smem, ready, empty, y_desc, yt_desc, s_ptr, stride_sn, out_ptr, stride_om, pair_ptr,
                           num_pairs, gs_ptr, bias_ptr, stride_be, route_w_ptr, N, K, k_tiles, alpha, beta, limit,
                           w4a8, GEMM, BLOCK_M, BLOCK_N, BLOCK_K, NUM_WARPS, NVFP4, HAS_BIAS, ACTIVATION, ACT_QUANT,
                           TOP_K, TAIL_M, PERSISTENT, GATHER)
        if GEMM == 1:
            tma.store_wait(0)  # h's last tiles read out of shared memory before the program ends
    else:
        _consumer_tile(this[0], this[1], this[2], this[3], 0, x_bufs, xt_bufs, w_bufs, y_smem, yt_smem, ready, empty,
                       y_desc, yt_desc, s_ptr, stride_sn, out_ptr, stride_om, pair_ptr, num_pairs, gs_ptr, bias_ptr,
                       stride_be, route_w_ptr, N, K, k_tiles, alpha, beta, limit, w4a8, GEMM, BLOCK_M, BLOCK_N,
                       BLOCK_K, NUM_WARPS, NVFP4, HAS_BIAS, ACTIVATION, ACT_QUANT, TOP_K, TAIL_M, PERSISTENT, GATHER)


@gluon.jit
def _consumer_tile(expert, first, off_n, w_row, base, x_bufs, xt_bufs, w_bufs, y_smem, yt_smem, ready, empty, y_desc,
                   yt_desc, s_ptr, stride_sn, out_ptr, stride_om, pair_ptr, num_pairs, gs_ptr, bias_ptr, stride_be,
                   route_w_ptr, N, K, k_tiles, alpha, beta, limit, w4a8, GEMM: gl.constexpr, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, NUM_WARPS: gl.constexpr, NVFP4: gl.constexpr,
                   HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr, ACT_QUANT: gl.constexpr, TOP_K: gl.constexpr,
                   TAIL_M: gl.constexpr, PERSISTENT: gl.constexpr, GATHER: gl.constexpr):
    """One tile (`_tile_at`'s values) from the ring's step `base` on: W (decoded into registers) x X^T (shared memory)
    into the [BLOCK_N weight rows, BLOCK_M rows] accumulator, then the GEMM's epilogue. The K loop is unrolled by two so
    that consecutive tiles' operands alternate between two register sets with no copies (a single loop-carried operand
    would be copied into the registers the wgmma in flight reads). PERSISTENT: the last step's slot is released too, for
    the program's next tile. ACT_QUANT (W4A8, `w4a8` = (table, row exponents, static scales, rows' exponents)): E4M3 X,
    FP8 wgmmas (K 32 each, their sums accumulated in the tensor core) and the sums scaled as the tile kernels'. TAIL_M:
    the TAIL_M rows after the block (xt_bufs) multiply the same decoded operand into a second accumulator and take the
    same epilogue (yt_smem, yt_desc): an expert's last rows cost a wgmma, not a second decode."""
    FP8: gl.constexpr = _fp8_dots(ACT_QUANT)
    STAGES: gl.constexpr = x_bufs.type.shape[0]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                 instr_shape=[16, BLOCK_M, 32 if FP8 else 16])
    operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4 if FP8 else 2)
    if FP8:
        word_layout: gl.constexpr = lut_words_layout(gl.to_linear_layout(
            lut_bytes_layout(gl.to_linear_layout(operand, [BLOCK_N, BLOCK_K]), [BLOCK_N, BLOCK_K]),
            [BLOCK_N, BLOCK_K // 2]), [BLOCK_N, BLOCK_K // 2])
    else:
        word_layout: gl.constexpr = operand_words_layout(gl.to_linear_layout(operand, [BLOCK_N, BLOCK_K]),
                                                         [BLOCK_N, BLOCK_K])
    PAD: gl.constexpr = 127 if not (NVFP4 or FP8) else 0  # E8M0 1.0; NVFP4's and the table's zero
    lut_ptr = w4a8[0]
    rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, word_layout))
    row_ok = off_n + rows < N  # a last tile past N decodes the next expert's rows (or TMA's zeros): never stored
    words = gl.arange(0, BLOCK_K // 8, layout=gl.SliceLayout(0, word_layout))
    if FP8:  # a row's `code_steps` integers
        scale_ptrs = s_ptr + (w_row + rows).to(gl.int64) * stride_sn
    else:
        scale_ptrs = s_ptr + (w_row + rows)[:, None].to(gl.int64) * stride_sn + (words // 4)[None, :]
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, mma)
    if TAIL_M:
        tail_mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                          instr_shape=[16, TAIL_M, 32 if FP8 else 16])
        acc_t = gl.zeros([BLOCK_N, TAIL_M], gl.float32, tail_mma)
    else:
        acc_t = 0.0  # no tail: a placeholder the loop carries unchanged
    w_odd = gl.zeros([BLOCK_N, BLOCK_K], gl.float8e4nv if FP8 else gl.bfloat16, operand)
    s_even = _step_scales(scale_ptrs, row_ok, 0, words, K, BLOCK_K, PAD, FP8)
    s_odd = _step_scales(scale_ptrs, row_ok, 1, words, K, BLOCK_K, PAD, FP8)
    epilogue_args = (out_ptr, stride_om, pair_ptr, num_pairs, gs_ptr, bias_ptr, stride_be, route_w_ptr, expert, off_n,
                     N, alpha, beta, limit, w4a8)
    row_values = _row_values(epilogue_args, BLOCK_N, mma, FP8, HAS_BIAS)
    # W4A16: a placeholder
    rows = _table_rows(lut_ptr, _word_codes(s_even, words, NVFP4, BLOCK_K), NVFP4) if FP8 else s_even
    for j in range(k_tiles // 2):
        acc, acc_t, w_even, s_even, rows = _step(2 * j, base + 2 * j, acc, acc_t, w_odd, s_even, x_bufs, xt_bufs,
                                                 w_bufs, ready, empty, scale_ptrs, row_ok, words, K, lut_ptr, rows,
                                                 s_odd, BLOCK_N, BLOCK_K, NVFP4, GATHER, FP8, PAD, TAIL_M)
        acc, acc_t, w_odd, s_odd, rows = _step(2 * j + 1, base + 2 * j + 1, acc, acc_t, w_even, s_odd, x_bufs,
                                               xt_bufs, w_bufs, ready, empty, scale_ptrs, row_ok, words, K, lut_ptr,
                                               rows, s_even, BLOCK_N, BLOCK_K, NVFP4, GATHER, FP8, PAD, TAIL_M)
    if k_tiles % 2:
        acc, acc_t, w_odd, s_even, rows = _step(k_tiles - 1, base + k_tiles - 1, acc, acc_t, w_odd, s_even, x_bufs,
                                                xt_bufs, w_bufs, ready, empty, scale_ptrs, row_ok, words, K, lut_ptr,
                                                rows, s_odd, BLOCK_N, BLOCK_K, NVFP4, GATHER, FP8, PAD, TAIL_M)
    if TAIL_M:
        acc, acc_t = warpgroup_mma_wait(num_outstanding=0, deps=[acc, acc_t])
    else:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    if PERSISTENT:
        mbarrier.arrive(empty.index((base + k_tiles - 1) % STAGES), count=1)  # the last step's slot
    _epilogue(acc, y_smem, y_desc, first, epilogue_args, row_values, GEMM, BLOCK_M, BLOCK_N, NUM_WARPS, NVFP4,
              HAS_BIAS, ACTIVATION, ACT_QUANT, TOP_K, mma, PERSISTENT)
    if TAIL_M:
        _epilogue(acc_t, yt_smem, yt_desc, first + BLOCK_M, epilogue_args, row_values, GEMM, TAIL_M, BLOCK_N,
                  NUM_WARPS, NVFP4, HAS_BIAS, ACTIVATION, ACT_QUANT, TOP_K, tail_mma, PERSISTENT)


@gluon.jit
def _row_values(args, BLOCK_N: gl.constexpr, mma: gl.constexpr, FP8: gl.constexpr, HAS_BIAS: gl.constexpr):
    """The epilogue's values of the tile's weight rows (in SliceLayout(1, mma): two a thread), loaded as the tile
    starts so that they land during its K loop (loaded in the epilogue, ncu had the consumers waiting on them there):
    W4A8's rows' exponents r (FP8 dots) and the bias; 0 where the call has none. (The values of the tile's rows of X,
    GEMM2's pairs and router weights, stay in the epilogue: in the accumulator's layout they take a register per
    column a thread holds.)"""
    (_, _, _, _, _, bias_ptr, stride_be, _, expert, off_n, N, _, _, _, w4a8) = args
    n_rows = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
    rexp = 0
    if FP8:
        rexp = gl.load(w4a8[1] + expert * N + n_rows, mask=n_rows < N, other=0)
    bias = 0.0
    if HAS_BIAS:
        bias = gl.load(bias_ptr + expert * stride_be + n_rows, mask=n_rows < N, other=0.0)
    return rexp, bias


@gluon.jit
def _epilogue(acc, y_smem, y_desc, first, args, row_values, GEMM: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, NUM_WARPS: gl.constexpr, NVFP4: gl.constexpr, HAS_BIAS: gl.constexpr,
              ACTIVATION: gl.constexpr, ACT_QUANT: gl.constexpr, TOP_K: gl.constexpr, mma: gl.constexpr,
              PERSISTENT: gl.constexpr):
    """The sums [BLOCK_N weight rows, BLOCK_M rows from sorted row first] (in `mma`) scaled (W4A8: `_w4a8_scales`;
    NVFP4: the global scale), biased (`_row_values`' values), then GEMM1's activation and h store or GEMM2's pair
    rows."""
    (out_ptr, stride_om, pair_ptr, num_pairs, gs_ptr, _, _, route_w_ptr, expert, off_n, N, alpha, beta, limit,
     w4a8) = args
    _, _, qscale_ptr, ra_ptr = w4a8
    rexp, bias = row_values
    if _fp8_dots(ACT_QUANT):
        acc = _w4a8_scales(acc, gl.convert_layout(rexp, gl.SliceLayout(1, mma), assert_trivial=True), qscale_ptr,
                           ra_ptr, pair_ptr, num_pairs, first, GEMM, BLOCK_M, ACT_QUANT, TOP_K, mma)
        if NVFP4:
            acc = acc / gl.load(gs_ptr + expert)
    else:  # bf16 dots: static FP8's input scale where the tile kernels apply it (_act_store, _gemm2_rows_out)
        if (ACT_QUANT == 3) & (GEMM == 1):
            acc = acc * gl.load(qscale_ptr)
        if NVFP4:  # the folded scales' 2^-16 (exact: 2^110 = 2^126 * 2^-16), then the global scale, as the tiles
            acc = acc * 65536.0 / gl.load(gs_ptr + expert)
        if (ACT_QUANT == 3) & (GEMM == 2):
            acc = acc * gl.load(qscale_ptr + 2)
    if HAS_BIAS:
        acc += gl.convert_layout(bias, gl.SliceLayout(1, mma), assert_trivial=True)[:, None]
    if GEMM == 1:
        h_scale = 1.0
        if (ACT_QUANT == 1) | (ACT_QUANT == 3):  # h as static FP8's E4M3 of act * (1 / a2), GEMM2's operand
            h_scale = gl.load(qscale_ptr + 3)
        _activate_store(acc, y_smem, y_desc, first, off_n, alpha, beta, limit, h_scale, BLOCK_M, BLOCK_N, ACTIVATION,
                        ACT_QUANT, PERSISTENT)
    else:
        _pair_rows_store(acc, y_smem, out_ptr, stride_om, pair_ptr, num_pairs, route_w_ptr, first, off_n, N,
                         BLOCK_M, BLOCK_N, NUM_WARPS, mma, PERSISTENT)


@gluon.jit
def _w4a8_scales(acc, rexp, qscale_ptr, ra_ptr, pair_ptr, num_pairs, first, GEMM: gl.constexpr, BLOCK_M: gl.constexpr,
                 ACT_QUANT: gl.constexpr, TOP_K: gl.constexpr, mma: gl.constexpr):
    """The FP8 sums [weight rows, rows] scaled as the tile kernels' (_x_row_exps, _act_store, _gemm2_rows_out): times
    each weight row's 2^r (rexp: the rows' exponents of `ws_weights(kw, w4a8=True)`) and the static input scale
    (a1 = qscale[0] for GEMM1, a2 = qscale[2] for GEMM2); MXFP8: times each X row's 2^ra, GEMM1's before (x's row
    of the pair's token), GEMM2's after (h's row)."""
    a = 1.0
    if ACT_QUANT == 1:
        a = gl.load(qscale_ptr + (0 if GEMM == 1 else 2))
    row_scale = _pow2(rexp) * a
    if ACT_QUANT == 2:
        m = first + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma))
        if GEMM == 1:
            pair = gl.load(pair_ptr + m)
            ra = _pow2_from_m127(gl.load(ra_ptr + pair // TOP_K, mask=pair < num_pairs, other=0))
            return acc * ra[None, :] * row_scale[:, None]
        return acc * row_scale[:, None] * _pow2_from_m127(gl.load(ra_ptr + m))[None, :]
    return acc * row_scale[:, None]


@gluon.jit
def _activate_store(acc, y_smem, y_desc, first, off_n, alpha, beta, limit, h_scale, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, ACTIVATION: gl.constexpr, ACT_QUANT: gl.constexpr,
                    PERSISTENT: gl.constexpr):
    """GEMM1's epilogue: weight rows 16 g .. 16 g + 7 are gate rows and the next 8 the same channels' up rows
    (`ws_row_order`), which the wgmma accumulator keeps in one thread (rows r and r + 8); the activation of each
    pair times h_scale, h's [BLOCK_M, BLOCK_N / 2] tile in h's dtype (bf16, or static FP8's E4M3: rounded to
    nearest, saturated) out by TMA at channel off_n / 2. On bf16 dots (ACT_QUANT 3, 4) h is stored as the values
    GEMM2 multiplies, as the tile kernels' _act_store: static FP8's E4M3 values, MXFP8's per block of 32 channels."""
    t = gl.permute(gl.reshape(acc, [BLOCK_N // 16, 2, 8, BLOCK_M]), [0, 2, 3, 1])
    gate, up = gl.split(t)
    gate = gl.reshape(gate, [BLOCK_N // 2, BLOCK_M])
    up = gl.reshape(up, [BLOCK_N // 2, BLOCK_M])
    if ACTIVATION == _SWIGLUOAI:  # gpt-oss swigluoai: clamp gate from above, up both ways, (up + beta) * glu
        gate = gl.minimum(gate, limit)
        up = gl.minimum(gl.maximum(up, -limit), limit)
        h = (up + beta) * gate / (1.0 + gl.exp(-alpha * gate))
    else:  # silu-and-mul
        h = gate / (1.0 + gl.exp(-gate)) * up
    h = h * h_scale
    if ACT_QUANT == 3:
        h = h.to(gl.float8e4nv).to(gl.float32)
    elif ACT_QUANT == 4:
        h = _mx_values(h, BLOCK_N // 2, BLOCK_M)
    if PERSISTENT:  # the program's last h store has read its tile out of shared memory (the wait is the issuing
        tma.store_wait(0)  # thread's) before any thread writes there again; the store overlaps the next tile
        _partition_barrier()
    y_smem.store(gl.permute(h.to(y_smem.dtype), (1, 0)))
    fence_async_shared()
    _tma_store(y_desc, [first, off_n // 2], y_smem)
    if not PERSISTENT:
        tma.store_wait(0)


@gluon.jit
def _mx_values(h, CHANNELS: gl.constexpr, ROWS: gl.constexpr):
    """h [CHANNELS, ROWS] (fp32) -> its MXFP8 values per block of 32 consecutive channels, E4M3 elements times E8M0
    2^se, se = floor(log2(amax)) - 8 clamped to [-127, 127]: the tile kernels' _mx_values, bit for bit."""
    g = gl.reshape(h, [CHANNELS // 32, 32, ROWS])
    amax = gl.max(gl.abs(g), axis=1)
    se = gl.minimum(gl.maximum(((amax.to(gl.int32, bitcast=True) >> 23) & 0xFF) - 135, -127), 127)
    se = gl.expand_dims(se, 1)
    elem = (g * _pow2(-se)).to(gl.float8e4nv).to(gl.float32)
    return gl.reshape(elem * _pow2_from_m127(se), [CHANNELS, ROWS])


@gluon.jit
def _pair_rows_store(acc, y_smem, out_ptr, stride_om, pair_ptr, num_pairs, route_w_ptr, first, off_n, N,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_WARPS: gl.constexpr, mma: gl.constexpr,
                     PERSISTENT: gl.constexpr):
    """GEMM2's epilogue: the router weight of each row's pair, the tile rounded to bf16 (as the tile kernels' pair
    rows), turned to [rows, columns] through shared memory and each real row stored whole to its pair's row."""
    pair = gl.load(pair_ptr + first + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma)))
    acc = acc * gl.load(route_w_ptr + pair, mask=pair < num_pairs, other=0.0)[None, :]
    if PERSISTENT:
        _partition_barrier()  # every thread has read the program's last tile out of y_smem
    y_smem.store(gl.permute(acc.to(gl.bfloat16), (1, 0)))
    _partition_barrier()
    rows: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BLOCK_N // 8), BLOCK_N // 8], [NUM_WARPS, 1], [1, 0])
    pair = gl.load(pair_ptr + first + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, rows)))
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, rows))
    gl.store(out_ptr + pair.to(gl.int64)[:, None] * stride_om + cols[None, :], y_smem.load(rows),
             mask=(pair < num_pairs)[:, None] & (cols < N)[None, :])


@gluon.jit
def ws_moe_gemm_kernel(x_ptr, stride_xm, x_desc, xt_desc, w_desc, s_ptr, stride_sn, y_desc, yt_desc, out_ptr, stride_om,
                       block_expert_ptr, block_first_ptr, block_count_ptr, pair_ptr, num_pairs, gs_ptr, bias_ptr,
                       stride_be, route_w_ptr, N, K, alpha, beta, limit, lut_ptr, rexp_ptr, qscale_ptr, ra_ptr,
                       GEMM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                       STAGES: gl.constexpr, NUM_WARPS: gl.constexpr, LOADER_WARPS: gl.constexpr,
                       LOADER_REGS: gl.constexpr, NVFP4: gl.constexpr, HAS_BIAS: gl.constexpr,
                       ACTIVATION: gl.constexpr, TOP_K: gl.constexpr, ACT_QUANT: gl.constexpr, TAIL_M: gl.constexpr,
                       K_TAIL: gl.constexpr, PERSISTENT: gl.constexpr, GATHER: gl.constexpr):
    """One GEMM of the layer over the row blocks of one size (BLOCK_M): tile (b, n) multiplies block b's rows
    (block_first[b] ..; `ws_blocks`) by weight rows n * BLOCK_N .. of expert block_expert[b] (W: E experts' N rows
    of int32 words [E * N, K / 8], `ws_weights`; s: a row's E8M0 bytes [E * N, K / 32], or NVFP4's folded bf16
    scale pairs as int32), up to the device's block count (block_count[0]; the grid is a static bound): program
    (n, b) takes tile (b, n), or PERSISTENT, program p takes tiles p, p + programs, .. of the order b * n_tiles + n
    with its ring running on from one tile into the next (the loader fills the next tile's first steps during this
    one's epilogue, and GEMM1's h store overlaps the next tile). `tiles` = (n_tiles, block count, block_expert,
    block_first).
    GEMM 1: X = x's rows gathered by pair (x_ptr), h out by TMA (y_desc, [BLOCK_M, BLOCK_N / 2] boxes); GEMM 2:
    X = h's rows by TMA (x_desc), each pair's row of y_smem to out (pair rows [T * k, H], bf16).
    ACT_QUANT 1 (static FP8), 2 (MXFP8): W4A8, the tile kernels' ids and numerics on FP8 tensor cores: X in E4M3 (x
    quantized per row by act_quant_kernel; h by GEMM1 (1) or by act_quant_kernel after it (2)), the weights as W4A8
    bytes [E * N, K / 2] with table codes per 32-wide chunk and row exponents (`ws_weights(kw, w4a8=True)`, lut_ptr
    the table), qscale_ptr static FP8's [a1, 1/a1, a2, 1/a2], ra_ptr the X rows' MXFP8 exponents.
    TAIL_M > 0: each block carries the TAIL_M rows after it (an expert's last rows, `ws_blocks`) in a second
    accumulator: GEMM2 loads them by xt_desc, GEMM1 stores their h by yt_desc (unused without a tail).
    K_TAIL: K is not a multiple of BLOCK_K (but of 32): the last K step is partial, its columns past K zeros.
    GATHER: X's rows are gathered by pair (GEMM1 on x); else X is already in the sorted rows' order (GEMM2's h, or
    GEMM1's x copied to them) and loaded by TMA."""
    if PERSISTENT:
        tiles = ((N + BLOCK_N - 1) // BLOCK_N, gl.load(block_count_ptr), block_expert_ptr, block_first_ptr)
        this = (0, 0, 0, 0)  # unused
    else:  # a program per tile: its tile, or none past the count
        b = gl.program_id(1)
        if b >= gl.load(block_count_ptr):
            return
        tiles = 0  # unused
        # `_tile_at` written out in the order the program-per-tile kernel was measured with (the same PTX)
        expert = gl.load(block_expert_ptr + b)
        first = gl.load(block_first_ptr + b)
        off_n = gl.program_id(0) * BLOCK_N
        this = (expert, first, off_n, expert * N + off_n)
    k_tiles = (K + BLOCK_K - 1) // BLOCK_K if K_TAIL else K // BLOCK_K
    x_dtype: gl.constexpr = gl.float8e4nv if _fp8_dots(ACT_QUANT) else gl.bfloat16
    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], x_dtype)
    x_bufs = gl.allocate_shared_memory(x_dtype, [STAGES, BLOCK_M, BLOCK_K], x_layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    y_smem = gl.allocate_shared_memory(y_desc.dtype, y_desc.block_type.shape, y_desc.layout)
    if TAIL_M:
        xt_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TAIL_M, BLOCK_K], x_dtype)
        xt_bufs = gl.allocate_shared_memory(x_dtype, [STAGES, TAIL_M, BLOCK_K], xt_layout)
        yt_smem = gl.allocate_shared_memory(yt_desc.dtype, yt_desc.block_type.shape, yt_desc.layout)
    else:
        xt_bufs = x_bufs
        yt_smem = y_smem
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        # the weight TMA's expect, and with GATHER every loader thread's cp.async arrival
        mbarrier.init(ready.index(i), count=1 + (LOADER_WARPS * 32 if GATHER else 0))
        mbarrier.init(empty.index(i), count=1)
    if GATHER:
        gl.warp_specialize([
            (_consumer, (x_bufs, xt_bufs, w_bufs, y_smem, yt_smem, ready, empty, y_desc, yt_desc, s_ptr, stride_sn,
                         out_ptr, stride_om, pair_ptr, num_pairs, gs_ptr, bias_ptr, stride_be, route_w_ptr, tiles,
                         this, N, K, k_tiles, alpha, beta, limit, (lut_ptr, rexp_ptr, qscale_ptr, ra_ptr), GEMM,
                         BLOCK_M, BLOCK_N, BLOCK_K, NUM_WARPS, NVFP4, HAS_BIAS, ACTIVATION, ACT_QUANT, TOP_K, TAIL_M,
                         PERSISTENT, GATHER)),
            (_gather_loader, (x_ptr, stride_xm, pair_ptr, num_pairs, w_desc, x_bufs, xt_bufs, w_bufs, ready, empty,
                              tiles, this, N, k_tiles, K, TOP_K, BLOCK_M, BLOCK_N, BLOCK_K, LOADER_WARPS, TAIL_M,
                              K_TAIL, PERSISTENT)),
        ], [LOADER_WARPS], [LOADER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (x_bufs, xt_bufs, w_bufs, y_smem, yt_smem, ready, empty, y_desc, yt_desc, s_ptr, stride_sn,
                         out_ptr, stride_om, pair_ptr, num_pairs, gs_ptr, bias_ptr, stride_be, route_w_ptr, tiles,
                         this, N, K, k_tiles, alpha, beta, limit, (lut_ptr, rexp_ptr, qscale_ptr, ra_ptr), GEMM,
                         BLOCK_M, BLOCK_N, BLOCK_K, NUM_WARPS, NVFP4, HAS_BIAS, ACTIVATION, ACT_QUANT, TOP_K, TAIL_M,
                         PERSISTENT, GATHER)),
            (_tma_loader, (x_desc, xt_desc, w_desc, x_bufs, xt_bufs, w_bufs, ready, empty, tiles, this, N, k_tiles,
                           BLOCK_N, BLOCK_K, TAIL_M, PERSISTENT)),
        ], [LOADER_WARPS], [LOADER_REGS])

