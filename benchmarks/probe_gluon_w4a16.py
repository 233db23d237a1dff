"""Can a warp-specialized W4A16 GEMM reach issue 32's 0.70 of the bf16 matmul on Hopper? A Gluon probe.

The Triton tile kernels stop at 0.54-0.67 of bf16 at prefill: Triton moves every dequantized weight tile through
shared memory into the wgmma's operand layout, and two warps per scheduler cannot hide that (docs/kernels.md). Triton
does not warp-specialize an sm_90 loop (benchmarks/check_warp_specialize.py), so this probe is written in Gluon:

    loader partition (1 warp, 40 registers): TMA of the X tile [BM, BK] bf16 and the packed weight tile
        [BN, BK/2] (MXFP4 codes, low nibble = even k) into a STAGES-deep ring, mbarrier-signalled
    default partition (NUM_WARPS, one warpgroup per 64 weight rows): the packed tile from shared memory straight into
        the wgmma A-operand layout (DotOperandLayout k_width 1), fp4_to_fp to bf16 (k_width 2, the same registers),
        times the E8M0 block scale as an exact bf16 power of two, then an async wgmma of W (registers) x X^T
        (shared memory) into Y^T, left in flight while the next tile is decoded into the other of two register sets;
        the output tile goes out through shared memory by TMA

so the weights never pass through shared memory after the TMA. Two forms: dense (Y = X W^T, the ceiling) and
grouped (GROUPED: rows sorted by expert, each row block on its expert's weights: a MoE GEMM without the gather of X
rows and without the epilogue, which the layer kernel would add if this gets near the target), with each expert's
rows padded to whole BLOCK_M blocks or, with tails, to BLOCK_M / 4, the last rows in blocks of BLOCK_M / 2 and / 4.
FP8 runs the same with E4M3 activations and the decoded weights rounded to E4M3 into an FP8 wgmma: W4A8, whose issue 32
item 4 asks 1.6x of W4A16 and 0.55 of the FP8 `_scaled_mm` rate.

The words form (`--kernel words`, W4A16) decodes with the layer kernels' word routine instead of fp4_to_fp: the
weights are packed as int32 words holding the 8 codes one thread's A registers take (`pack_words`, WORD_ORDERS),
loaded in a layout derived from the operand's (`operand_words_layout`), so the routine's bf16 pairs are the operand
(benchmarks/results/gluon-word-decode-h100-2026-11-28/: 1.01-1.35x the register form); it alone also runs NVFP4
weights (`--format nvfp4`, NVFP4_LAYERS: a word's two E4M3 block scales feed the routine's two scale operands). The
flat form (`--kernel flat`) is the words form without the loader partition: its 4 warps issue the TMA loads, and two
CTAs share an SM. Both also run grouped GEMMs with absorbed tails (rows `<gemm> absorb`: an expert's last rows
multiplied by the program of its last whole block, a second wgmma on the weights it decodes, as the tile kernels'
`tail_rows`; benchmarks/results/gluon-absorbed-tails-h100-2026-11-28/). The smem-decode form
(`--kernel smem`, SMEM_DECODE_CONFIGS) moves the decode out of the MMA warps: a decoder partition decodes each
packed tile with the word routine into a second ring in shared memory, and one MMA warpgroup issues wgmmas with both
operands there (benchmarks/results/gluon-smem-decode-h100-2026-11-28/: slower, the decoded tile's round trip through
shared memory costs the bandwidth the wgmmas need).

    python benchmarks/probe_gluon_w4a16.py [--kernel words|flat|smem]                  # no GPU: compile, check SASS
    python benchmarks/probe_gluon_w4a16.py --run --out DIR [--kernel words|flat|smem]  # Hopper GPU: error, speed
    python benchmarks/probe_gluon_w4a16.py --run --out DIR --kernel words --format nvfp4

Without a GPU it prints, per launch config and form, what the compiled kernel does (wgmma count, shared-memory
stores, warp shuffles, register reallocation, spills, wgmmas in flight and writes of their operand registers) and
exits 1 if the weights would pass through shared memory, an in-flight operand be rewritten or registers spill.
With --run it writes DIR/gluon_w4a16.csv: for both GEMMs of gpt-oss-120b and DeepSeek-V3 (MXFP4) at T = 4096 and
16384, dense and grouped (whole blocks, with tails: `<gemm> tails`, absorbed: `<gemm> absorb`), W4A16 and W4A8
(the words and flat forms: W4A16; `--format nvfp4`: the NVFP4 layer), each config's relative L2
error against the fp32 product of the dequantized weights (backends.formats), µs, TFLOP/s of the useful products
(T * top-k * N * K * 2 when grouped) and their fraction of the same run's bf16 8192^3 matmul (W4A16) or FP8
`_scaled_mm` (W4A8), issue 32's measures.
"""

from __future__ import annotations

import argparse
import csv
import functools
import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from _cubin import cubin_tool, in_flight_operand_writes, k_loop  # noqa: E402

from backends.model_shapes import SHAPES  # noqa: E402
from backends.triton_moe._kernels import _E4M3_PAIR_BF16X2_ASM as _E4M3_PAIR_ASM  # noqa: E402
from backends.triton_moe._ws_kernels import (  # noqa: E402  the word decode the layer's Gluon kernels use too
    _kept,
    _mxfp4_folded,
    _operand_from_lut,
    _operand_from_words,
    _partition_barrier,
    _table_rows,
    _tma_load,
    _tma_store,
    _word_routine,
    lut_bytes_layout,
    lut_words_layout,
    operand_words_layout,
    pack_words,
)

#: (BLOCK_M tokens, BLOCK_N weight rows, BLOCK_K, STAGES, NUM_WARPS: one warpgroup per 64 weight rows); the ring and
#: the output tile fit sm_90's 227 KiB of shared memory.
CONFIGS = [(128, 128, 128, 4, 8), (128, 128, 64, 6, 8), (256, 64, 64, 4, 4), (256, 128, 64, 4, 8)]
ROWS = [4096, 16384]
#: The MoE layers whose GEMMs are timed: each GEMM dense (M = 4096 / 16384 rows, the ceiling) and grouped (the
#: experts' rows of T = 4096 / 16384 tokens sorted by expert, padded to BLOCK_M, each block on its expert's weights).
LAYERS = ["gpt-oss-120b", "deepseek-v3-mxfp4"]
#: With --format nvfp4 (words form): issue 32's NVFP4 layer.
NVFP4_LAYERS = ["deepseek-v3"]


def moe_gemms(layer: str) -> list[tuple[str, int, int, int, int]]:
    """(name, experts, top-k, N, K) of a layer's two GEMMs: gate and up [2I, H], down [H, I]."""
    shape = SHAPES[layer]
    return [(f"{layer} gemm1", shape.experts, shape.top_k, 2 * shape.intermediate_size, shape.hidden_size),
            (f"{layer} gemm2", shape.experts, shape.top_k, shape.hidden_size, shape.intermediate_size)]


#: Registers per consumer thread (ptxas caps the kernel at this: 12 warps x 32 x 168 fit the 64 Ki register file);
#: the loader warp hands all but 40 back to the consumers.
MAXNREG = 168
#: Smem-decode form (configs of 7: ..., DECODE_WARPS, DSTAGES): registers of a decoder thread (its 64-128 decoded
#: values and their codes); the MMA warpgroup takes what the loader and the decoders leave.
DECODER_REGS = gl.constexpr(128)
SMEM_DECODE_CONFIGS = [(128, 128, 64, 4, 4, 4, 3), (128, 128, 64, 4, 8, 4, 3), (128, 64, 128, 4, 4, 4, 2),
                       (128, 128, 128, 3, 4, 4, 2)]


#: The forms (`--kernel`) and their configs (the register-operand forms' may name a sixth entry, CTAs an SM: the
#: register cap fits them): "register" decodes MXFP4 bytes with fp4_to_fp into the wgmma's
#: register operand, "words" the same with the layer kernels' word routine from `pack_words` (W4A16 only), "flat"
#: the words form without warp specialization (its 4 warps issue the TMA loads; two CTAs an SM),
#: "smem" in a decoder partition into shared memory.
FORMS = {"register": CONFIGS, "words": CONFIGS + [(128, 64, 64, 3, 4, 2)], "smem": SMEM_DECODE_CONFIGS,
         "flat": [(128, 128, 64, 3, 4), (128, 128, 64, 4, 4), (128, 64, 64, 4, 4)]}


def kernel_of(form: str):
    return w4a16_smem_decode_kernel if form == "smem" else w4a16_ws_kernel


def maxnreg_of(config, form: str = "register") -> int:
    """ptxas' register cap: every warp of the kernel at the cap must fit the 64 Ki register file (the launch
    counts each worker partition in whole warpgroups: the loader warp as four)."""
    if form == "flat":  # 4 warps, no loader: ptxas' own cap, and two CTAs an SM still fit
        return 255
    if form != "smem":
        ctas = config[5] if len(config) == 6 else 1
        return min(MAXNREG, 65536 // (32 * (config[4] + 4) * ctas) // 8 * 8)
    warps = config[4] + 4 + config[5]
    return min(256, 65536 // (32 * warps) // 8 * 8)


@gluon.jit
def _loader(x_desc, w_desc, x_bufs, w_bufs, ready, empty, off_m, w_row, k_tiles, tail_in, BLOCK_K: gl.constexpr,
            BLOCK_M: gl.constexpr, TAIL: gl.constexpr):
    """TMA of each K tile's X and packed W into the ring; waits until the consumer has released the slot."""
    STAGES: gl.constexpr = x_bufs.type.shape[0]
    for i in range(k_tiles):
        mbarrier.wait(empty.index(i % STAGES), ((i // STAGES) & 1) ^ 1)  # a fresh barrier counts as released
        _load_tile(x_desc, w_desc, x_bufs, w_bufs, ready, i, off_m, w_row, tail_in, BLOCK_K, BLOCK_M, TAIL)


@gluon.jit
def _load_tile(x_desc, w_desc, x_bufs, w_bufs, ready, i, off_m, w_row, tail_in, BLOCK_K: gl.constexpr,
               BLOCK_M: gl.constexpr, TAIL: gl.constexpr, pred=True):
    """TMA of K tile i's X and packed W into ring slot i % STAGES, signalled on its ready barrier; with TAIL, also
    the TAIL rows after the block (`tail_in`: their descriptor and ring), which the block's program multiplies too."""
    slot = i % x_bufs.type.shape[0]
    xt_desc, xt_bufs = tail_in
    nbytes: gl.constexpr = x_desc.block_type.nbytes + w_desc.block_type.nbytes + (xt_desc.block_type.nbytes if TAIL
                                                                                  else 0)
    mbarrier.expect(ready.index(slot), nbytes, pred=pred)
    _tma_load(x_desc, [off_m, i * BLOCK_K], ready.index(slot), x_bufs.index(slot), pred=pred)
    _tma_load(w_desc, [w_row, i * w_desc.block_type.shape[1]], ready.index(slot), w_bufs.index(slot), pred=pred)
    if TAIL:
        _tma_load(xt_desc, [off_m + BLOCK_M, i * BLOCK_K], ready.index(slot), xt_bufs.index(slot), pred=pred)


@gluon.jit
def _nvfp4_folded(pair):
    """A word's two E4M3 scales (int16: the first 16-wide block's in the low byte) as the word routine's folded bf16
    scales s * 2^126 * 2^-16, exact, by the layer kernels' pair routine (`_E4M3_PAIR_BF16X2_ASM`, bytes 0 and 2);
    the epilogue multiplies the sums by 2^16. (The layer's kernels read the pair folded already: `ws_weights`.)"""
    v = pair.to(gl.int32)
    folded = gl.inline_asm_elementwise(_E4M3_PAIR_ASM, "=r,r", [(v & 0xFF) | ((v & 0xFF00) << 8)], dtype=gl.int32,
                                       is_pure=True, pack=1)
    return ((folded & 0xFFFF).to(gl.int16).to(gl.bfloat16, bitcast=True),
            (folded >> 16).to(gl.int16).to(gl.bfloat16, bitcast=True))


@gluon.jit
def _step(i, acc, acc_t, w_keep, x_bufs, w_bufs, ready, empty, scale_ptrs, pairs, K, loads, tail_in, lut_ptr,
          BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, FP8: gl.constexpr, WORDS: gl.constexpr,
          NVFP4: gl.constexpr, FLAT: gl.constexpr, TAIL: gl.constexpr):
    """K tile i: decode the packed tile into the wgmma's A registers, issue the wgmma, then release a slot: to the
    loader partition, or FLAT (no loader; `loads` = the descriptors, tile origin and K tiles) by loading K tile
    i + STAGES - 1 into it. TAIL: a second wgmma multiplies the same decoded weights with the tail rows into acc_t.
    W4A16 leaves this wgmma in flight while the next tile is decoded: the wait retires the previous one, whose operand
    w_keep stays alive until then, so the two operands never share registers (the caller alternates them; W4A8
    through `_kept`). WORDS and FP8: the W4A8 table decode (`_operand_from_lut`; scale_ptrs: each word's codes)."""
    STAGES: gl.constexpr = x_bufs.type.shape[0]
    slot = i % STAGES
    if WORDS and FP8:
        block = i * (BLOCK_K // 32) + pairs // 4
        code = gl.load(scale_ptrs + i * (BLOCK_K // 32), mask=(block < K // 32)[None, :], other=0).to(gl.int32)
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        bytes_layout: gl.constexpr = lut_bytes_layout(gl.to_linear_layout(w_keep.type.layout, [BLOCK_N, BLOCK_K]),
                                                      [BLOCK_N, BLOCK_K])
        rows = _table_rows(lut_ptr, code, NVFP4)
        w = gl.convert_layout(_operand_from_lut(w_bufs.index(slot).load(bytes_layout), rows, NVFP4, BLOCK_N, BLOCK_K),
                              w_keep.type.layout, assert_trivial=True)
    elif WORDS:  # pairs: the word indices; scale_ptrs: each word's scales
        block = i * (BLOCK_K // 32) + pairs // 4
        if NVFP4:  # two E4M3 scales as one int16
            pair = gl.load(scale_ptrs + i * (BLOCK_K // 32), mask=(block < K // 32)[None, :], other=0)
            scale_lo, scale_hi = _nvfp4_folded(pair)
        else:  # one E8M0 scale
            scale_lo = _mxfp4_folded(gl.load(scale_ptrs + i * (BLOCK_K // 32), mask=(block < K // 32)[None, :],
                                             other=127))
            scale_hi = scale_lo
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        w = gl.convert_layout(_operand_from_words(w_bufs.index(slot).load(pairs.type.layout.parent), scale_lo,
                                                  scale_hi, BLOCK_N, BLOCK_K), w_keep.type.layout, assert_trivial=True)
    else:
        block = i * (BLOCK_K // 32) + pairs // 16  # past K (the last tile of K = 2880): TMA reads zeros there
        scale = gl.load(scale_ptrs + i * (BLOCK_K // 32), mask=(block < K // 32)[None, :], other=127)
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        w = gl.fp4_to_fp(w_bufs.index(slot).load(pairs.type.layout.parent), gl.bfloat16, 1)
        s16 = (scale.to(gl.int16) << 7).to(gl.bfloat16, bitcast=True)  # 2^(s - 127), exact for 1 <= s <= 254
        s16 = gl.convert_layout(gl.reshape(gl.join(s16, s16), [BLOCK_N, BLOCK_K]), w.type.layout)  # same registers
        w = w * s16
    if FP8 and not WORDS:
        w = w.to(gl.float8e4nv)
    w = gl.convert_layout(w, w_keep.type.layout)  # the decode's result is this layout already: no data moves
    acc = warpgroup_mma(w, x_bufs.index(slot).permute((1, 0)), acc, is_async=True)
    if TAIL:  # two wgmma groups a step: waiting down to 2 retires tile i - 1's pair
        acc_t = warpgroup_mma(w, tail_in[1].index(slot).permute((1, 0)), acc_t, is_async=True)
        acc, acc_t, w_keep = warpgroup_mma_wait(num_outstanding=2, deps=[acc, acc_t, w_keep])
    elif FP8:
        acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
        w_keep = _kept(w_keep)
    else:
        acc, w_keep = warpgroup_mma_wait(num_outstanding=1, deps=[acc, w_keep])
    if FLAT:  # tile i - 1's wgmma is done: its slot takes tile i + STAGES - 1
        x_desc, w_desc, off_m, w_row, k_tiles = loads
        _load_tile(x_desc, w_desc, x_bufs, w_bufs, ready, i + STAGES - 1, off_m, w_row, tail_in, BLOCK_K,
                   BLOCK_M, TAIL, pred=i + STAGES - 1 < k_tiles)
    else:
        mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1, pred=i > 0)  # tile i - 1's is done
    return acc, acc_t, w


@gluon.jit
def _consumer(x_bufs, w_bufs, y_smem, ready, empty, y_desc, s_ptr, stride_sn, K, off_m, off_n, w_row, k_tiles,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, NUM_WARPS: gl.constexpr,
              FP8: gl.constexpr, WORDS: gl.constexpr, NVFP4: gl.constexpr, loads, FLAT: gl.constexpr, tail_in,
              yt_desc, TAIL: gl.constexpr, lut):
    """W (decoded into registers) x X^T (shared memory) into Y^T's tile, stored through shared memory by TMA.
    The K loop is unrolled by two so that consecutive tiles' operands alternate between two register sets with no
    copies: a single loop-carried operand would be copied into the register the wgmma in flight reads. (Kept alive
    across the wait this way, ptxas leaves the wgmmas asynchronous; in two consumer partitions of one warpgroup
    each, it serialized them, C7512.) FP8 (W4A8): the decoded weights are rounded to E4M3 and the wgmma is an FP8
    one (K 32 per instruction); the packed tile is then loaded two bytes (four codes) per register so that the
    E4M3 bytes land in its A layout. WORDS and FP8 (W4A8's table decode): s_ptr holds each 32-wide chunk's table
    codes (`lut` = (table, row exponents r)) and the sums are scaled by 2^r of their weight row."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                 instr_shape=[16, BLOCK_M, 32 if FP8 else 16])
    packed: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2 if FP8 else 1)
    operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4 if FP8 else 2)
    lut_ptr, rexp_ptr = lut
    if WORDS and FP8:  # "pairs" are word indices, 4 words a 32-wide chunk: its code(s) in s_ptr
        words: gl.constexpr = lut_words_layout(gl.to_linear_layout(
            lut_bytes_layout(gl.to_linear_layout(operand, [BLOCK_N, BLOCK_K]), [BLOCK_N, BLOCK_K]),
            [BLOCK_N, BLOCK_K // 2]), [BLOCK_N, BLOCK_K // 2])
        rows = w_row + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, words))
        pairs = gl.arange(0, BLOCK_K // 8, layout=gl.SliceLayout(0, words))
        scale_ptrs = s_ptr + rows[:, None].to(gl.int64) * stride_sn + (pairs // 4)[None, :]
    elif WORDS:  # the words form: "pairs" are word indices, 4 words a 32-wide scale block
        words: gl.constexpr = operand_words_layout(gl.to_linear_layout(operand, [BLOCK_N, BLOCK_K]), [BLOCK_N, BLOCK_K])
        rows = w_row + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, words))
        pairs = gl.arange(0, BLOCK_K // 8, layout=gl.SliceLayout(0, words))
        # a word's scales: MXFP4's E8M0 byte, or NVFP4's two E4M3 bytes as one int16 (s_ptr is *i16 then)
        scale_ptrs = s_ptr + rows[:, None].to(gl.int64) * stride_sn + (pairs // 4)[None, :]
    else:
        rows = w_row + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, packed))
        pairs = gl.arange(0, BLOCK_K // 2, layout=gl.SliceLayout(0, packed))
        scale_ptrs = s_ptr + rows[:, None].to(gl.int64) * stride_sn + (pairs // 16)[None, :]  # E8M0 per 32 K = 16 B
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, mma)
    TAIL_ROWS: gl.constexpr = tail_in[1].type.shape[1]  # TAIL, or the unused ring's 8 rows
    acc_t = gl.zeros([BLOCK_N, TAIL_ROWS], gl.float32,
                     gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                               instr_shape=[16, TAIL_ROWS, 32 if FP8 else 16]))
    w_odd = gl.zeros([BLOCK_N, BLOCK_K], gl.float8e4nv if FP8 else gl.bfloat16, operand)
    for j in range(k_tiles // 2):
        acc, acc_t, w_even = _step(2 * j, acc, acc_t, w_odd, x_bufs, w_bufs, ready, empty, scale_ptrs, pairs, K, loads,
                                   tail_in, lut_ptr, BLOCK_M, BLOCK_N, BLOCK_K, FP8, WORDS, NVFP4, FLAT, TAIL)
        acc, acc_t, w_odd = _step(2 * j + 1, acc, acc_t, w_even, x_bufs, w_bufs, ready, empty, scale_ptrs, pairs, K,
                                  loads, tail_in, lut_ptr, BLOCK_M, BLOCK_N, BLOCK_K, FP8, WORDS, NVFP4, FLAT, TAIL)
    if k_tiles % 2:
        acc, acc_t, w_odd = _step(k_tiles - 1, acc, acc_t, w_odd, x_bufs, w_bufs, ready, empty, scale_ptrs, pairs, K,
                                  loads, tail_in, lut_ptr, BLOCK_M, BLOCK_N, BLOCK_K, FP8, WORDS, NVFP4, FLAT, TAIL)
    acc, acc_t = warpgroup_mma_wait(num_outstanding=0, deps=[acc, acc_t])
    if WORDS and FP8:  # 2^r of each weight row, built from its bits (exact; |r| < 127)
        r = gl.load(rexp_ptr + w_row + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma)))
        acc = acc * ((r + 127) << 23).to(gl.float32, bitcast=True)[:, None]
    _store_tile(acc, y_smem, y_desc, off_m, off_n, NVFP4 and not FP8)
    if TAIL:  # through the output tile's first rows, free again after its store
        _store_tile(acc_t, y_smem.slice(0, TAIL), yt_desc, off_m + BLOCK_M, off_n, NVFP4)


@gluon.jit
def _store_tile(acc, y_smem, y_desc, off_m, off_n, NVFP4: gl.constexpr):
    """Y^T's accumulator out as Y's [rows, BLOCK_N] tile, through shared memory by TMA (which clips rows past M)."""
    if NVFP4:
        acc = acc * 65536.0  # the folded scales' 2^-16
    y_smem.store(gl.permute(acc.to(gl.bfloat16), (1, 0)))
    fence_async_shared()
    _tma_store(y_desc, [off_m, off_n], y_smem)
    tma.store_wait(0)


@gluon.jit
def _tile_origin(block_expert_ptr, block_row_ptr, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 GROUPED: gl.constexpr):
    """Program (n, m)'s first X row, first output column and first weight row (GROUPED: its block's expert's)."""
    off_n = gl.program_id(0) * BLOCK_N
    off_m = gl.program_id(1) * BLOCK_M
    w_row = off_n
    if GROUPED:
        off_m = gl.load(block_row_ptr + gl.program_id(1))
        w_row = gl.load(block_expert_ptr + gl.program_id(1)) * N + off_n
    return off_m, off_n, w_row


@gluon.jit
def w4a16_ws_kernel(x_desc, w_desc, y_desc, s_ptr, stride_sn, block_expert_ptr, block_row_ptr, N, K, xt_desc,
                    yt_desc, lut_ptr, rexp_ptr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                    STAGES: gl.constexpr, NUM_WARPS: gl.constexpr, GROUPED: gl.constexpr, FP8: gl.constexpr,
                    WORDS: gl.constexpr, NVFP4: gl.constexpr, FLAT: gl.constexpr, TAIL: gl.constexpr):
    """Y[M, N] = X[M, K] (bf16) W[N, K]^T (MXFP4: packed codes [N, K/2], E8M0 scales [N, K/32]; NVFP4, words form
    only: E4M3 scales [N, K/16], the global scale left to the caller); program (n, m).
    GROUPED (a MoE GEMM over expert-sorted rows): W holds E experts' rows [E * N, K/2], and program m multiplies
    rows block_row[m] .. + BLOCK_M by expert block_expert[m]'s weights (one launch per block size:
    `expert_blocks`). FP8: X is E4M3 and the weights are rounded to E4M3 (W4A8). TAIL (W4A16): the program also
    multiplies the TAIL rows after its block (an expert's last rows, absorbed: `expert_blocks(mode="absorb")`) with
    the weights it decodes anyway, through xt_desc / yt_desc (blocks [TAIL, BLOCK_K] / [TAIL, BLOCK_N]; with TAIL 0
    they are 8-row placeholders, never read)."""
    off_m, off_n, w_row = _tile_origin(block_expert_ptr, block_row_ptr, N, BLOCK_M, BLOCK_N, GROUPED)
    k_tiles = gl.cdiv(K, BLOCK_K)
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    y_smem = gl.allocate_shared_memory(y_desc.dtype, y_desc.block_type.shape, y_desc.layout)
    tail_in = (xt_desc, gl.allocate_shared_memory(xt_desc.dtype, [STAGES] + xt_desc.block_type.shape, xt_desc.layout))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    loads = (x_desc, w_desc, off_m, w_row, k_tiles)
    if FLAT:  # no loader partition: the first STAGES - 1 tiles now, each step then loads one (two CTAs an SM fit)
        for s in gl.static_range(STAGES - 1):
            _load_tile(x_desc, w_desc, x_bufs, w_bufs, ready, s, off_m, w_row, tail_in, BLOCK_K, BLOCK_M, TAIL,
                       pred=s < k_tiles)
        _consumer(x_bufs, w_bufs, y_smem, ready, empty, y_desc, s_ptr, stride_sn, K, off_m, off_n, w_row, k_tiles,
                  BLOCK_M, BLOCK_N, BLOCK_K, NUM_WARPS, FP8, WORDS, NVFP4, loads, FLAT, tail_in, yt_desc, TAIL,
                  (lut_ptr, rexp_ptr))
    else:
        gl.warp_specialize([
            (_consumer, (x_bufs, w_bufs, y_smem, ready, empty, y_desc, s_ptr, stride_sn, K, off_m, off_n, w_row,
                         k_tiles, BLOCK_M, BLOCK_N, BLOCK_K, NUM_WARPS, FP8, WORDS, NVFP4, loads, FLAT, tail_in,
                         yt_desc, TAIL, (lut_ptr, rexp_ptr))),
            (_loader, (x_desc, w_desc, x_bufs, w_bufs, ready, empty, off_m, w_row, k_tiles, tail_in, BLOCK_K, BLOCK_M,
                       TAIL)),
        ], [1], [40])


@gluon.jit
def _decoder(w_bufs, wd_bufs, ready, empty, decoded, decoded_free, s_ptr, stride_sn, K, w_row, k_tiles,
             BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, DECODE_WARPS: gl.constexpr, FP8: gl.constexpr):
    """Smem-decode form: each packed K tile from the ring (32-bit words of 8 codes in the layer's word order,
    `pack_words`), decoded by the layer kernels' word routine (`_kernels._E2M1_WORD_ASM`, about 18
    instructions a word, the E8M0 block scale folded into its bf16x2 FMAs; W4A8: then rounded to E4M3) into the
    decoded ring in shared memory, so that the MMA warpgroup only issues wgmmas. The packed slot is released
    with the decoded one: by then every decoder thread has read it (the barrier before the arrivals, which one
    thread makes)."""
    STAGES: gl.constexpr = w_bufs.type.shape[0]
    DSTAGES: gl.constexpr = wd_bufs.type.shape[0]
    WORD_COUNT: gl.constexpr = BLOCK_K // 8
    words: gl.constexpr = gl.BlockedLayout([1, 2], [64 // WORD_COUNT, WORD_COUNT // 2], [DECODE_WARPS, 1], [1, 0])
    rows = w_row + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, words))
    word = gl.arange(0, WORD_COUNT, layout=gl.SliceLayout(0, words))
    scale_ptrs = s_ptr + rows[:, None].to(gl.int64) * stride_sn + (word // 4)[None, :]  # E8M0 per 32 K = 4 words
    for i in range(k_tiles):
        slot = i % STAGES
        dslot = i % DSTAGES
        block = i * (BLOCK_K // 32) + word // 4
        folded = _mxfp4_folded(gl.load(scale_ptrs + i * (BLOCK_K // 32), mask=(block < K // 32)[None, :], other=127))
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        e0, e1, e2, e3, e4, e5, e6, e7 = _word_routine(w_bufs.index(slot).load(words), folded, folded)
        # the routine's outputs are K offsets 0, 1, 2, 3 (low halves) and 4, 5, 6, 7 (high halves) of the word
        w = gl.join(gl.join(gl.join(e0, e4), gl.join(e2, e6)), gl.join(gl.join(e1, e5), gl.join(e3, e7)))
        w = gl.reshape(w, [BLOCK_N, BLOCK_K])
        if FP8:
            w = w.to(gl.float8e4nv)
        mbarrier.wait(decoded_free.index(dslot), ((i // DSTAGES) & 1) ^ 1)
        wd_bufs.index(dslot).store(w)
        fence_async_shared()
        _partition_barrier()
        mbarrier.arrive(decoded.index(dslot), count=1)
        mbarrier.arrive(empty.index(slot), count=1)


@gluon.jit
def _smem_mma(x_bufs, wd_bufs, y_smem, ready, empty, decoded, decoded_free, y_desc, off_m, off_n, k_tiles,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_WARPS: gl.constexpr, FP8: gl.constexpr):
    """Smem-decode form's MMA warpgroup: W (decoded, shared memory) x X^T (shared memory) into Y^T, one wgmma in
    flight; a step's slots are released when its wgmma has retired (the next step's wait)."""
    STAGES: gl.constexpr = x_bufs.type.shape[0]
    DSTAGES: gl.constexpr = wd_bufs.type.shape[0]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                 instr_shape=[16, BLOCK_M, 32 if FP8 else 16])
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, mma)
    for i in range(k_tiles):
        slot = i % STAGES
        dslot = i % DSTAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        mbarrier.wait(decoded.index(dslot), (i // DSTAGES) & 1)
        acc = warpgroup_mma(wd_bufs.index(dslot), x_bufs.index(slot).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
        mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1, pred=i > 0)
        mbarrier.arrive(decoded_free.index((i + DSTAGES - 1) % DSTAGES), count=1, pred=i > 0)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    _store_tile(acc, y_smem, y_desc, off_m, off_n, False)


@gluon.jit
def w4a16_smem_decode_kernel(x_desc, w_desc, y_desc, s_ptr, stride_sn, block_expert_ptr, block_row_ptr, N, K,
                             BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                             STAGES: gl.constexpr, NUM_WARPS: gl.constexpr, GROUPED: gl.constexpr,
                             FP8: gl.constexpr, DECODE_WARPS: gl.constexpr, DSTAGES: gl.constexpr):
    """w4a16_ws_kernel's product with the decode in a partition of its own: loader warp (TMA) -> decoder warps
    (packed -> decoded ring in shared memory) -> one MMA warpgroup (both wgmma operands from shared memory). The
    decode overlaps the wgmmas instead of preceding them in the same warps; shared-memory traffic per K tile is
    the decoded tile's store and the wgmma's reads of it."""
    off_m, off_n, w_row = _tile_origin(block_expert_ptr, block_row_ptr, N, BLOCK_M, BLOCK_N, GROUPED)
    k_tiles = gl.cdiv(K, BLOCK_K)
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    wd_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K],
                                                                  gl.float8e4nv if FP8 else gl.bfloat16)
    wd_bufs = gl.allocate_shared_memory(gl.float8e4nv if FP8 else gl.bfloat16, [DSTAGES, BLOCK_N, BLOCK_K], wd_layout)
    y_smem = gl.allocate_shared_memory(y_desc.dtype, y_desc.block_type.shape, y_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    decoded = gl.allocate_shared_memory(gl.int64, [DSTAGES, 1], mbarrier.MBarrierLayout())
    decoded_free = gl.allocate_shared_memory(gl.int64, [DSTAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # the decoder (packed tile read) and the MMA warpgroup (X tile read)
    for i in gl.static_range(DSTAGES):
        mbarrier.init(decoded.index(i), count=1)
        mbarrier.init(decoded_free.index(i), count=1)
    gl.warp_specialize([
        (_smem_mma, (x_bufs, wd_bufs, y_smem, ready, empty, decoded, decoded_free, y_desc, off_m, off_n, k_tiles,
                     BLOCK_M, BLOCK_N, NUM_WARPS, FP8)),
        (_loader, (x_desc, w_desc, x_bufs, w_bufs, ready, empty, off_m, w_row, k_tiles, (x_desc, x_bufs), BLOCK_K,
                   BLOCK_M, 0)),  # no tail: (x_desc, x_bufs) only fills the tail slot
        (_decoder, (w_bufs, wd_bufs, ready, empty, decoded, decoded_free, s_ptr, stride_sn, K, w_row, k_tiles,
                    BLOCK_N, BLOCK_K, DECODE_WARPS, FP8)),
    ], [1, DECODE_WARPS], [40, DECODER_REGS])


def _layouts(block_m: int, block_n: int, block_k: int, fp8: bool, words: bool = False):
    """Shared layouts of the X tile, the packed W tile (bytes, or with `words` int32 words of 8 codes) and the
    bf16 output tile (for a tail's tiles: block_m its rows)."""
    packed = [block_n, block_k // 8] if words else [block_n, block_k // 2]
    return (gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.float8e4nv if fp8 else gl.bfloat16),
            gl.NVMMASharedLayout.get_default_for(packed, gl.int32 if words else gl.uint8),
            gl.NVMMASharedLayout.get_default_for([block_m, block_n], gl.bfloat16))


def packs_words(form: str, fp8: bool) -> bool:
    """Whether a form's packed tile is int32 words of the word routine (`pack_words`); W4A8 in the words and flat
    forms reads the W4A8 bytes instead (`table_decode`), the register form MXFP4 bytes."""
    return form == "smem" or (form in ("words", "flat") and not fp8)


def table_decode(form: str, fp8: bool) -> bool:
    """W4A8 in the words and flat forms: the W4A8 bytes decoded by table (`_operand_from_lut`)."""
    return form in ("words", "flat") and fp8


def tail_rows_of(tail: int) -> int:
    """Rows of the tail tiles a kernel declares: TAIL, or 8 (the smallest wgmma N) for unused placeholders."""
    return tail or 8


def _constexprs(config: tuple[int, ...], grouped: bool, fp8: bool, form: str = "register", nvfp4: bool = False,
                tail: int = 0) -> dict:
    block_m, block_n, block_k, stages, warps = config[:5]
    assert not nvfp4 or form in ("words", "flat"), "NVFP4 weights run in the words and flat forms only"
    assert not tail or (form in ("words", "flat") and not fp8), "absorbed tails run in W4A16's words and flat forms"
    extra = (dict(DECODE_WARPS=config[5], DSTAGES=config[6]) if form == "smem"
             else dict(WORDS=form in ("words", "flat"), NVFP4=nvfp4, FLAT=form == "flat", TAIL=tail))
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages, NUM_WARPS=warps,
                GROUPED=grouped, FP8=fp8) | extra


def compile_for_sm90(config: tuple[int, ...], grouped: bool = False, fp8: bool = False, form: str = "register",
                     nvfp4: bool = False, tail: int = 0):
    """The kernel compiled ahead of time for sm_90 (no GPU needed: ptxas ships with triton)."""
    block_m, block_n, block_k, stages, warps = config[:5]
    kernel = kernel_of(form)
    words = packs_words(form, fp8)
    x_layout, w_layout, y_layout = _layouts(block_m, block_n, block_k, fp8, words)
    constexprs = _constexprs(config, grouped, fp8, form, nvfp4, tail)
    packed = f"i32[{block_n},{block_k // 8}]" if words else f"u8[{block_n},{block_k // 2}]"
    signature = {"x_desc": f"tensordesc<{'fp8e4nv' if fp8 else 'bf16'}[{block_m},{block_k}],{x_layout!r}>",
                 "w_desc": f"tensordesc<{packed},{w_layout!r}>",
                 "y_desc": f"tensordesc<bf16[{block_m},{block_n}],{y_layout!r}>",
                 "s_ptr": "*i16" if nvfp4 else "*u8", "stride_sn": "i32", "block_expert_ptr": "*i32",
                 "block_row_ptr": "*i32", "N": "i32", "K": "i32"} | {name: "constexpr" for name in constexprs}
    if form != "smem":
        rows = tail_rows_of(tail)
        xt_layout, _, yt_layout = _layouts(rows, block_n, block_k, fp8, words)
        signature |= {"xt_desc": f"tensordesc<{'fp8e4nv' if fp8 else 'bf16'}[{rows},{block_k}],{xt_layout!r}>",
                      "yt_desc": f"tensordesc<bf16[{rows},{block_n}],{yt_layout!r}>", "lut_ptr": "*i64",
                      "rexp_ptr": "*i32"}
    names = kernel.arg_names
    source = GluonASTSource(fn=kernel, signature=signature,
                            constexprs={(names.index(name),): value for name, value in constexprs.items()})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "maxnreg": maxnreg_of(config, form)})


def sass_stats(compiled) -> dict:
    """What the compiled kernel does: wgmma instructions, shared-memory stores, warp shuffles, register
    reallocation between partitions, local-memory (spill) loads and stores, the K loop's wgmmas in flight at its
    back edge and writes of their A registers before they are retired, and the TTGIR's warp_specialize and
    local_store ops (one is expected: the output tile on its way to the TMA store)."""
    sass = cubin_tool(compiled, "nvdisasm", "-c")
    ttgir = compiled.asm["ttgir"]
    register_operand = re.search(r"\b[HQ]GMMA\.\S+ R\d+, R\d+,", sass)  # smem-decode: both operands in shared memory
    in_flight, rewrites = in_flight_operand_writes(k_loop(sass)) if register_operand else (0, [])
    return {"in_flight": in_flight, "operand_rewrites": len(rewrites),
            "wgmma": len(re.findall(r"\b[HQ]GMMA\b", sass)), "shared_stores": len(re.findall(r"\bSTS\b", sass)),
            "shuffles": len(re.findall(r"\bSHFL\b", sass)), "setmaxnreg": len(re.findall(r"USETMAXREG", sass)),
            "spills": len(re.findall(r"\b(?:LDL|STL)\b", sass)),
            "warp_specialize": ttgir.count("ttg.warp_specialize"), "local_stores": ttgir.count("ttg.local_store"),
            "shared_bytes": compiled.metadata.shared}


def weights_stay_in_registers(stats: dict, specialized: bool = True, output_tiles: int = 1) -> bool:
    """The decode feeds the wgmma without a layout conversion (no shuffles, no local_store but the output tiles':
    two with an absorbed tail), never rewrites the operand of a wgmma in flight, nothing spills, and the kernel is
    warp-specialized unless `specialized` is False (the flat form)."""
    return (stats["wgmma"] > 0 and stats["shuffles"] == 0 and stats["local_stores"] <= output_tiles
            and stats["operand_rewrites"] == 0 and stats["spills"] == 0
            and (stats["warp_specialize"] > 0) == specialized)


def decode_feeds_shared_memory(stats: dict) -> bool:
    """Smem-decode form: warp-specialized, wgmmas on shared operands, no shuffles (the decoded words go to shared
    memory as they are), two local stores (the decoded tile and the output tile) and nothing spills."""
    return (stats["wgmma"] > 0 and stats["shuffles"] == 0 and stats["local_stores"] == 2 and stats["spills"] == 0
            and stats["warp_specialize"] > 0)


def expert_blocks(counts, block_m: int, tails: bool = True, mode: str | None = None):
    """The row blocks of expert-sorted rows (what the layer's alignment gives its GEMMs): int32 (expert, first row,
    rows) per block. mode "whole" (tails False): each expert's rows padded to whole BLOCK_M blocks; "tails" (the
    default): to a multiple of BLOCK_M / 4, split into BLOCK_M blocks and one or two smaller ones (BLOCK_M / 2 and /
    or BLOCK_M / 4); "absorb": as "tails", but a remainder of at most BLOCK_M / 4 after a whole block joins that
    block, which becomes BLOCK_M + BLOCK_M / 4 rows (run as a BLOCK_M block with a TAIL, `size_launches`)."""
    import torch

    mode = mode or ("tails" if tails else "whole")
    quarter = block_m // 4
    granule = block_m if mode == "whole" else quarter
    padded = (counts + granule - 1) // granule * granule
    experts, firsts, sizes = [], [], []
    first = 0
    for expert, rows in enumerate(padded.tolist()):
        parts = [block_m] * (rows // block_m) + [size for size in (block_m // 2, quarter) if rows % block_m & size]
        if mode == "absorb" and rows > block_m and rows % block_m == quarter:
            parts = parts[:-2] + [block_m + quarter]
        for size in parts:
            experts.append(expert)
            firsts.append(first)
            sizes.append(size)
            first += size
    table = torch.tensor([experts, firsts, sizes], dtype=torch.int32, device=counts.device)
    return table[0], table[1], table[2]


def grouped_modes(form: str, fp8: bool, config=None) -> tuple[str, ...]:
    """`expert_blocks` modes a form's grouped GEMMs run: absorbed tails where the kernel has TAIL (W4A16, words and
    flat forms) and the config's rings with the tail rows' still fit shared memory (`absorb_fits`)."""
    absorb = form in ("words", "flat") and not fp8 and (config is None or absorb_fits(config, form))
    return ("whole", "tails", "absorb") if absorb else ("whole", "tails")


def absorb_fits(config, form: str) -> bool:
    """Whether a config's shared memory with a BLOCK_M / 4 tail (each stage's X, packed W and tail X tiles, and the
    output tile) fits its CTAs an SM: one, or two for the flat form and a two-CTA config (the 227 KiB an SM, 1 KiB
    of it reserved a CTA)."""
    block_m, block_n, block_k, stages = config[:4]
    stage = block_m * block_k * 2 + block_n * block_k // 2 + block_m // 4 * block_k * 2
    ctas = 2 if form == "flat" or len(config) == 6 else 1
    return ctas * (stages * stage + block_m * block_n * 2 + 1024) <= 227 * 1024


def activation_schemes(form: str) -> tuple[bool, ...]:
    """FP8 flags a form runs: W4A16 and W4A8 (the words form's by table decode); the flat form W4A16 only."""
    return (False,) if form == "flat" else (False, True)


def _config_name(config) -> str:
    return "x".join(map(str, config))


def _run(out_dir: str | None, configs, form: str = "register", smoke: bool = False, nvfp4: bool = False) -> None:
    """Time configs on the GPU into out_dir; smoke: one small dense and grouped product per config and form, an
    AssertionError if any is wrong (the --run driver runs this first, in a process of its own per config, so that a
    config that hangs or faults costs a timeout, not the run)."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from backends.formats import dequantize_mxfp4, dequantize_nvfp4, rebase_rows_to_e4m3  # 2j: the low nibble
    from backends.layouts.triton_moe import w4a8_lut_table, w4a8_rows

    def dequant(packed, scales, fp8=False):
        """The weights the kernel multiplies: NVFP4 without its global scale (the probe has no epilogue for it);
        the table decode's rebased E4M3 rows times their 2^r (exact for these MXFP4 scales; NVFP4 rounds)."""
        if nvfp4:
            w = dequantize_nvfp4(packed, scales.view(torch.float8_e4m3fn), 1.0)
        else:
            w = dequantize_mxfp4(packed, scales)
        if table_decode(form, fp8):
            w8, r = rebase_rows_to_e4m3(w)
            w = torch.ldexp(w8, r[:, None].float())
        return w

    def table_weights(packed, scales, chunk=16384):
        """The table decode's tensors: W4A8 bytes [rows, K/2], table codes per (row, scale block) (NVFP4: a chunk's
        two as one int16) and row exponents r [rows], a chunk of rows at a time (the conversion widens to int64)."""
        parts = [w4a8_rows(packed[i:i + chunk], scales[i:i + chunk], "nvfp4" if nvfp4 else "mxfp4")
                 for i in range(0, packed.shape[0], chunk)]
        r, stored, codes = (torch.cat(t) for t in zip(*parts, strict=True))
        return stored, codes.view(torch.int16) if nvfp4 else codes, r

    def size_launches(config, blocks):
        """(config, tail, expert, first row, programs) per block size of `expert_blocks`' blocks: one launch each, the
        config's BLOCK_M replaced by that size (two block sizes in one kernel crash triton 3.6's lowering), or for a
        block of BLOCK_M + BLOCK_M / 4 rows the config with a TAIL of BLOCK_M / 4."""
        expert, first, rows = blocks
        block_m = config[0]
        sizes = (block_m + block_m // 4, block_m, block_m // 2, block_m // 4)
        return [(((min(size, block_m),) + tuple(config[1:])), max(size - block_m, 0), expert[rows == size],
                 first[rows == size], int((rows == size).sum())) for size in sizes if bool((rows == size).any())]

    converted = {}

    def launch(x, packed, scales, n, config, launches=None):
        """Y = X W^T, or with launches (`size_launches`) the grouped GEMM over their blocks."""
        block_n, block_k = config[1:3]
        fp8 = x.dtype == torch.float8_e4m3fn
        words, lut = packs_words(form, fp8), table_decode(form, fp8)
        if converted.get("source") is not packed or converted.get("lut") != lut:  # once per weight tensor, untimed
            converted.update(source=packed, lut=lut, tile=packed, scales=scales.view(torch.int16) if nvfp4 else scales,
                             rexp=torch.zeros(packed.shape[0], dtype=torch.int32, device=packed.device))
            if lut:
                converted.update(zip(("tile", "scales", "rexp"), table_weights(packed, scales), strict=True))
            elif words:
                converted.update(tile=pack_words(packed, "smem" if form == "smem" else "words"))
        y = torch.empty(x.shape[0], n, dtype=torch.bfloat16, device=x.device)
        kernel_scales = converted["scales"]  # NVFP4: a word's two blocks (or table codes) as one int16 load
        dense = [(config, 0, scales, scales, triton.cdiv(x.shape[0], config[0]))]  # the pointers are not read
        for sub_config, tail, expert, first, count in launches or dense:
            x_layout, w_layout, y_layout = _layouts(sub_config[0], block_n, block_k, fp8, words)
            tail_descs = ()
            if form != "smem":
                xt_layout, _, yt_layout = _layouts(tail_rows_of(tail), block_n, block_k, fp8, words)
                tail_descs = (TensorDescriptor.from_tensor(x, [tail_rows_of(tail), block_k], xt_layout),
                              TensorDescriptor.from_tensor(y, [tail_rows_of(tail), block_n], yt_layout),
                              w4a8_lut_table(x.device).view(torch.int64), converted["rexp"])
            kernel_of(form)[(triton.cdiv(n, block_n), count)](
                TensorDescriptor.from_tensor(x, [sub_config[0], block_k], x_layout),
                TensorDescriptor.from_tensor(converted["tile"],
                                             [block_n, block_k // (8 if words else 2)], w_layout),
                TensorDescriptor.from_tensor(y, [sub_config[0], block_n], y_layout),
                kernel_scales, kernel_scales.stride(0), expert, first, n, x.shape[1], *tail_descs,
                **_constexprs(sub_config, launches is not None, fp8, form, nvfp4, tail), num_warps=config[4],
                maxnreg=maxnreg_of(config, form))
        return y

    def grouped_error(x, y, packed, scales, n, blocks, checked):
        """Relative L2 error of the grouped product's rows in the blocks `checked` (indices into blocks)."""
        err = ref_norm = 0.0
        for b in checked:
            expert, first, rows = (int(t[b]) for t in blocks)
            w = slice(expert * n, (expert + 1) * n)
            ref = x[first:first + rows].float() @ dequant(packed[w], scales[w], x.dtype == torch.float8_e4m3fn).T
            err += float((y[first:first + rows].float() - ref).norm() ** 2)
            ref_norm += float(ref.norm() ** 2)
        return (err / ref_norm) ** 0.5

    def ms(fn, iters=20):
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / iters

    def weights(rows, k):
        """Random codes and scales: E8M0 2^-7..1 per 32, or E4M3 0.25..3.75 (bytes 0x28..0x47) per 16."""
        packed = torch.randint(0, 256, (rows, k // 2), device="cuda", generator=gen, dtype=torch.uint8)
        low, high, block = (0x28, 0x48, 16) if nvfp4 else (120, 128, 32)
        return packed, torch.randint(low, high, (rows, k // block), device="cuda", generator=gen, dtype=torch.uint8)

    def activations(rows, k, fp8):
        x = torch.randn(rows, k, device="cuda", generator=gen)
        return x.to(torch.float8_e4m3fn) if fp8 else x.bfloat16()

    gen = torch.Generator(device="cuda").manual_seed(0)
    if smoke:
        for config, fp8 in itertools.product(configs, activation_schemes(form)):
            block_m, block_n = config[:2]
            x, (packed, scales) = activations(2 * block_m, 640, fp8), weights(3 * block_n, 640)
            y = launch(x, packed, scales, 3 * block_n, config).float()
            ref = x.float() @ dequant(packed, scales, fp8).T
            rel = ((y - ref).norm() / ref.norm()).item()
            assert rel < 1e-2, f"{config} fp8={fp8} dense: rel L2 {rel:.2e}"
            # one block of each size: BLOCK_M and a quarter (expert 0), a half (expert 1), a quarter (expert 2)
            blocks = expert_blocks(torch.tensor([block_m + 1, block_m // 2, 3], device="cuda"), block_m)
            x = activations(int(blocks[1][-1] + blocks[2][-1]), 640, fp8)
            y = launch(x, packed, scales, block_n, config, size_launches(config, blocks))
            rel = grouped_error(x, y, packed, scales, block_n, blocks, range(blocks[0].numel()))
            assert rel < 1e-2, f"{config} fp8={fp8} grouped: rel L2 {rel:.2e}"
            if "absorb" in grouped_modes(form, fp8, config):  # expert 0's last 5 rows ride with its first block
                blocks = expert_blocks(torch.tensor([block_m + 5, 3], device="cuda"), block_m, mode="absorb")
                x = activations(int(blocks[1][-1] + blocks[2][-1]), 640, fp8)
                y = launch(x, packed, scales, block_n, config, size_launches(config, blocks))
                rel = grouped_error(x, y, packed, scales, block_n, blocks, range(blocks[0].numel()))
                assert rel < 1e-2, f"{config} fp8={fp8} grouped, absorbed tail: rel L2 {rel:.2e}"
        return
    os.makedirs(out_dir, exist_ok=True)
    square = torch.randn(8192, 8192, device="cuda", generator=gen).bfloat16()
    square8, one = square.to(torch.float8_e4m3fn), torch.ones((), device="cuda")
    bound = {False: 2 * 8192**3 / (ms(functools.partial(torch.matmul, square, square)) * 1e9),
             True: 2 * 8192**3 / (ms(functools.partial(torch._scaled_mm, square8, square8.t(), scale_a=one, scale_b=one,
                                                       out_dtype=torch.bfloat16)) * 1e9)}
    with open(os.path.join(out_dir, "gluon_w4a16.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["gpu", "triton", "gemm", "weights", "activations", "tokens", "M", "N", "K", "config", "rel_l2",
                         "us", "tflops", "bound", "bound_tflops", "fraction_of_bound"])

        def record(gemm, fp8, tokens, m, n, k, config, rel, us, flops):
            tflops = flops / (us * 1e6)
            writer.writerow([torch.cuda.get_device_name(), triton.__version__, gemm, "nvfp4" if nvfp4 else "mxfp4",
                             "fp8" if fp8 else "bf16", tokens,
                             m, n, k, _config_name(config), f"{rel:.2e}", f"{us:.1f}", f"{tflops:.0f}",
                             "fp8 _scaled_mm 8192^3" if fp8 else "bf16 matmul 8192^3", f"{bound[fp8]:.0f}",
                             f"{tflops / bound[fp8]:.3f}"])
            f.flush()
            print(f"{gemm} {'W4A8' if fp8 else 'W4A16'} T={tokens} M={m} N={n} K={k} {config}: rel L2 {rel:.1e}, "
                  f"{us:.0f} µs, {tflops:.0f} TFLOP/s, {tflops / bound[fp8]:.2f} of the bound", flush=True)

        gemms = [gemm for layer in (NVFP4_LAYERS if nvfp4 else LAYERS) for gemm in moe_gemms(layer)]
        for (_, _, _, n, k), m, fp8 in itertools.product(gemms, ROWS, activation_schemes(form)):  # dense: the ceiling
            x = activations(m, k, fp8)
            packed, scales = weights(n, k)
            ref = x.float() @ dequant(packed, scales, fp8).T  # exact products (E4M3 holds these weights too), fp32 sums
            for config in configs:
                y = launch(x, packed, scales, n, config)
                rel = ((y.float() - ref).norm() / ref.norm()).item()
                us = ms(functools.partial(launch, x, packed, scales, n, config)) * 1e3
                record("dense", fp8, m, m, n, k, config, rel, us, 2 * m * n * k)
        for (name, experts, top_k, n, k), tokens, fp8 in itertools.product(gemms, ROWS, activation_schemes(form)):
            counts = torch.bincount(torch.topk(torch.randn(tokens, experts, device="cuda", generator=gen), top_k)
                                    .indices.flatten(), minlength=experts)
            packed, scales = weights(experts * n, k)
            for config, mode in ((c, m) for c in configs for m in grouped_modes(form, fp8, c)):
                blocks = expert_blocks(counts, config[0], mode=mode)
                launches = size_launches(config, blocks)
                x = activations(int(blocks[1][-1] + blocks[2][-1]), k, fp8)
                y = launch(x, packed, scales, n, config, launches)
                checked = torch.randperm(blocks[0].numel(), device="cuda", generator=gen)[:4].tolist()
                rel = grouped_error(x, y, packed, scales, n, blocks, checked)
                us = ms(functools.partial(launch, x, packed, scales, n, config, launches)) * 1e3
                record(f"{name}{'' if mode == 'whole' else ' ' + mode}", fp8, tokens, x.shape[0], n, k, config, rel,
                       us, 2 * tokens * top_k * n * k)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="store_true", help="run and time on this machine's Hopper GPU")
    parser.add_argument("--out", help="with --run: the results directory (benchmarks/results/<run>)")
    parser.add_argument("--kernel", choices=tuple(FORMS), default="register",
                        help="register: fp4_to_fp into the wgmma's register operand; words: the layer kernels' word "
                             "routine into it (W4A16); smem: a decoder partition writes the decoded tile to shared "
                             "memory (FORMS has each form's configs)")
    parser.add_argument("--format", choices=("mxfp4", "nvfp4"), default="mxfp4",
                        help="the weights' format (nvfp4: the words form only, on NVFP4_LAYERS)")
    parser.add_argument("--config", action="append", metavar="CONFIG",
                        help="only this config of the form (as the CSV names it, e.g. 128x128x128x4x8); repeatable")
    parser.add_argument("--smoke", metavar="CONFIG", help=argparse.SUPPRESS)  # one config's check, for --run
    args = parser.parse_args(argv)
    configs = FORMS[args.kernel]
    if args.config:
        unknown = sorted(set(args.config) - {_config_name(c) for c in configs})
        if unknown:
            parser.error(f"--config {', '.join(unknown)}: the {args.kernel} form's configs are "
                         f"{', '.join(map(_config_name, configs))}")
        configs = [c for c in configs if _config_name(c) in args.config]
    nvfp4 = args.format == "nvfp4"
    if nvfp4 and args.kernel not in ("words", "flat"):
        parser.error("--format nvfp4 runs in the words and flat forms only: add --kernel words or --kernel flat")
    if args.smoke:
        _run(None, [next(c for c in configs if _config_name(c) == args.smoke)], args.kernel, smoke=True, nvfp4=nvfp4)
        return 0
    if args.run:
        if not args.out:
            parser.error("--run needs --out DIR")
        passing = []
        for config in configs:
            try:
                check = subprocess.run([sys.executable, __file__, "--kernel", args.kernel, "--format", args.format,
                                        "--smoke", _config_name(config)], timeout=180, capture_output=True, text=True)
                verdict = "ok" if check.returncode == 0 else check.stderr.strip().splitlines()[-1]
            except subprocess.TimeoutExpired:
                verdict = "hung (killed after 180 s)"
            print(f"{_config_name(config)}: {verdict}", flush=True)
            passing += [config] if verdict == "ok" else []
        _run(args.out, passing, args.kernel, nvfp4=nvfp4)
        return 0
    ok = True
    for config, grouped, fp8 in itertools.product(configs, (False, True), activation_schemes(args.kernel)):
        stats = sass_stats(compile_for_sm90(config, grouped, fp8, args.kernel, nvfp4))
        ok &= (decode_feeds_shared_memory(stats) if args.kernel == "smem"
               else weights_stay_in_registers(stats, specialized=args.kernel != "flat"))
        print(f"triton {triton.__version__}, sm_90, {args.kernel} {args.format} {config}, "
              f"{'grouped' if grouped else 'dense'}, "
              f"{'W4A8' if fp8 else 'W4A16'}: {stats}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
