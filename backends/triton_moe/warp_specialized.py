"""The warp-specialized prefill path (sm_90): the layer's two GEMMs on `_ws_kernels.ws_moe_gemm_kernel`, W4A16, W4A8
on bf16 tensor cores (W4A16's dots on the inputs' quantized values) and W4A8 on FP8 ones (act_quant with w4a8_mma
"fp8"), each with the tile kernels' numerics; FP8 dots on `ws_weights(kw, w4a8=True)`.

    route       top-k (+ softmax) as the tile path (_routing.route), unless the caller gave the ids
    align       pairs sorted by expert, each expert's run padded to BLOCK_M / 4 (_routing.align)
    ws_blocks   each run cut into BLOCK_M blocks, then at most one BLOCK_M / 2 and one BLOCK_M / 4 block: a table per
                size, on the device (no host sync; the grids are static bounds)
    GEMM1       per block size: x rows gathered by cp.async, gate/up, bias, activation -> h [padded pairs, I] bf16
    GEMM2       per block size: h rows by TMA, bias, router weight -> pair rows [T * k, H] bf16
    top-k sum   the tile path's topk_sum_kernel

The weights run in their own order (`ws_weights`: int32 words in the wgmma operand's order, GEMM1's gate and up
rows interleaved by 8 so the activation pairs meet in one thread; W4A8: `ws_w4a8_rows`, the tile kernels' W4A8 bytes
in that row order), converted once per layer from the tile layout and cached: a layer that takes this path
holds its packed weights twice.
W4A8 quantizes x per row first (act_quant_kernel, as the tile path). On bf16 dots GEMM1 writes h's quantized values
in bf16 (static FP8's E4M3 values, MXFP8's per block of 32 channels). On FP8 dots GEMM1 writes h in E4M3 (static
FP8) or bf16 (MXFP8, then quantized per row by act_quant_kernel), and both GEMMs multiply E4M3 operands on FP8 wgmmas
whose sums accumulate in the tensor core (the tile path's fp8_accumulate "tensor-core").
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from backends.layouts.triton_moe import (
    _KERNEL_TENSORS,
    W4A8_LUT_ZERO,
    TritonMoEWeights,
    from_kernel_layout,
    w4a8_rows,
)
from backends.triton_moe.capabilities import version_tuple

#: The launch config of both GEMMs: (BLOCK_M rows, BLOCK_N weight rows, BLOCK_K, STAGES of the BLOCK_M blocks,
#: NUM_WARPS: one warpgroup per 64 weight rows). The Gluon probe's best at T = 16384 on an H100
#: (benchmarks/probe_gluon_w4a16.py: 256 x 128, with each expert's last rows in BLOCK_M / 2 and / 4 blocks).
WS_CONFIG = (256, 128, 64, 4, 8)
#: W4A8's K step (`block_k_for`): an FP8 wgmma's step of 64 is half a bf16 one's work, and 128 was 1.05-1.06x
#: faster on DeepSeek-V3 (ws-w4a8-wide-k-h200-2026-11-28/). A K that is a multiple of 64 only (gpt-oss: 2880) ends
#: in a half step (the kernel's K_TAIL).
W4A8_BLOCK_K = 128
#: W4A8's whole blocks where experts average at most W4A8_SMALL_BLOCKS_UP_TO rows (`block_m_for`). On gpt-oss-120b
#: and DeepSeek-V3 (ws-w4a8-blocks-h200-2026-11-28/) 128-row blocks, all persistent, against the 256-row ones: at
#: 128 rows an expert 1.05-1.09x, at 144 0.99-1.03x, at 160-256 0.67-0.90x (an expert's rows past 128 then take a
#: second decode of its weights in a 64-row block, where the 256-row form carries them as a tail).
W4A8_SMALL_BLOCK_ROWS = 128
W4A8_SMALL_BLOCKS_UP_TO = 144


def sorted_x_for(fp8_dots: bool, block_m: int) -> bool:
    """Whether GEMM1 loads x's rows copied to the sorted rows' order by TMA (one loader warp, no proxy fence in the K
    loop) instead of gathering them by pair: W4A8 on FP8 dots with W4A8_SMALL_BLOCK_ROWS whole blocks. At T = 4096 on
    an H200 (benchmarks/results/ws-sorted-x-h200-2026-11-29/) 1.05-1.08x on DeepSeek-V3 (NVFP4, MXFP4; both
    schemes) and Kimi-K2, 0.99x on gpt-oss-120b; with 256-row blocks (T = 16384) 0.98-1.02x, and W4A16 0.99x."""
    return fp8_dots and block_m == W4A8_SMALL_BLOCK_ROWS


#: Ring stages of blocks under WS_CONFIG's rows (its BLOCK_M / 2 and / 4 blocks): their K steps are shorter, so the
#: ring must hold more of them to cover the gather's latency (ncu at T = 4096 on an H200 had their consumers waiting
#: for a slot's data while the loader waited for a free slot; 8 stages measured 2-9% faster than 4 there, and no
#: slower at T = 8192-16384).
PARTIAL_BLOCK_STAGES = 8
#: The largest block that carries a quarter block as its tail: a 256-row block's accumulator and a 64-row tail's
#: do not fit the consumers' registers beside the two operand sets.
WHOLE_TAIL_MAX_ROWS = 128
#: Ring stages of a block carrying a quarter as its tail: each stage holds both X tiles, and GEMM2's 6 stages
#: with its two output tiles fill 216 of the 227 KiB of shared memory (bf16).
TAIL_BLOCK_STAGES = 6
#: Loader warps: GEMM1's cp.async gather spreads its 16-byte copies over a warpgroup (the register file is counted
#: per warpgroup anyway); a loader of X rows in the sorted order (GEMM2's h, GEMM1's sorted x) only issues TMA copies.
GATHER_LOADER_WARPS = 4
TMA_LOADER_WARPS = 1
#: Registers of a loader thread: GEMM1's gather keeps a pointer per 16-byte copy of its share of the X tile (16 of
#: them); a TMA loader only issues copies. The gather's pointers also fit 64 registers, which leave GEMM1's
#: consumers 224 instead of 200: what W4A8's 128-wide K steps need (W4A8_BLOCK_K; at 200 they spill 34-54 in the
#: K loop). W4A16 keeps 96 (64 measured 0.98-1.00x).
GATHER_LOADER_REGS = 96
WIDE_STEP_GATHER_LOADER_REGS = 64
TMA_LOADER_REGS = 40
#: The largest block (with its tail) whose launches run persistent when asked (`launch`): a 256-row block's
#: accumulator leaves the tile loop too few registers (ptxas serializes GEMM1's wgmmas, GEMM2 spills), except W4A8
#: MXFP4's, whose persistent launches measured no faster (benchmarks/results/ws-persistent-whole-h200-2026-11-29/).
PERSISTENT_MAX_ROWS = 192
#: Register cap of every thread at launch (12 warps x 32 x 168 fit the 64 Ki register file); the warp_specialize
#: hands the loader its LOADER_REGS (`constexprs`) and the consumers the rest.
WS_MAXNREG = 168


@dataclass(frozen=True)
class WSWeights:
    """The layer's weights as `ws_moe_gemm_kernel` reads them: words [E * N, K / 8] int32, scales [E * N, K / 32]
    (uint8 E8M0, or NVFP4's two scales of a word folded: `fold_nvfp4_scales`), biases fp32 [E, N] or None, NVFP4
    global scales. W4A8 (`ws_w4a8_rows`, row exponents given): w13 / w2 the W4A8 bytes [E * N, K / 2] uint8,
    the scales the table codes per 32-wide chunk [E * N, K / 32 padded to whole CODE_CHUNKS] (uint8; NVFP4 int16:
    two blocks), the rows' exponents r int32 [E * N]."""

    format: str
    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    w13_bias: torch.Tensor | None
    w2_bias: torch.Tensor | None
    w13_global_scale: torch.Tensor | None
    w2_global_scale: torch.Tensor | None
    experts: int
    hidden: int
    inter: int
    w13_row_exp: torch.Tensor | None = None
    w2_row_exp: torch.Tensor | None = None

    @property
    def w4a8(self) -> bool:
        return self.w13_row_exp is not None


def ws_row_order(inter: int) -> torch.Tensor:
    """GEMM1's weight rows in the warp-specialized order, as indices into [gate rows; up rows]: per group of 8
    channels its 8 gate rows, then the same channels' 8 up rows (the wgmma accumulator holds rows r and r + 8 in
    one thread, so each channel's gate and up sums meet there)."""
    groups = torch.arange(inter // 8).repeat_interleave(8) * 8 + torch.arange(8).repeat(inter // 8)
    return torch.stack([groups.view(-1, 8), groups.view(-1, 8) + inter], dim=1).reshape(-1)


#: Packed bytes of w13 converted at a time by ws_weights: the tile layout's inverse (from_kernel_layout) widens each
#: word to int64, so a whole large layer at once would need several times its size in temporaries.
CONVERT_CHUNK_BYTES = 1 << 28


def ws_weights(kw: TritonMoEWeights, w4a8: bool = False) -> WSWeights:
    """The tile layout's weights (exact inverse: from_kernel_layout) in the warp-specialized order, a chunk of
    experts at a time (CONVERT_CHUNK_BYTES; W4A8's conversion widens further: a quarter of that); w4a8: as
    `ws_w4a8_rows` converts them."""
    from backends.triton_moe._ws_kernels import pack_words

    experts, hidden, inter = kw.num_experts, kw.hidden_size, kw.intermediate_size
    order = ws_row_order(inter).to(kw.device)
    chunk = max(1, CONVERT_CHUNK_BYTES // (4 if w4a8 else 1) // (kw.w13[0].numel() + kw.w2[0].numel()))
    names = ("w13", "w13_scale", "w2", "w2_scale") + (("w13_row_exp", "w2_row_exp") if w4a8 else ())
    parts: dict[str, list] = {name: [] for name in names}
    for first in range(0, experts, chunk):
        experts_in = slice(first, first + chunk)
        sub = dataclasses.replace(kw, **{name: getattr(kw, name)[experts_in] for name in _KERNEL_TENSORS
                                         if getattr(kw, name) is not None})
        raw = from_kernel_layout(sub, gate_up_layout="stacked")
        for name, rows, scale in (("w13", raw["w13"][:, order], raw["w13_scale"][:, order]),
                                  ("w2", raw["w2"], raw["w2_scale"])):
            rows = rows.reshape(-1, rows.shape[-1]).contiguous()  # [rows, K / 2] packed codes
            scale = scale.reshape(-1, scale.shape[-1]).contiguous()  # [rows, K / 32] E8M0 or [rows, K / 16] E4M3
            if w4a8:
                converted = ws_w4a8_rows(rows, scale, kw.format)
                for suffix, tensor in zip(("", "_scale", "_row_exp"), converted, strict=True):
                    parts[name + suffix].append(tensor)
                continue
            parts[name].append(pack_words(rows, "words"))
            parts[name + "_scale"].append(fold_nvfp4_scales(scale) if kw.format == "nvfp4" else scale.view(torch.uint8))
    return WSWeights(
        format=kw.format, experts=experts, hidden=hidden, inter=inter,
        **{name: torch.cat(tensors) for name, tensors in parts.items()},
        w13_bias=None if kw.w13_bias is None else kw.w13_bias[:, order].contiguous(), w2_bias=kw.w2_bias,
        w13_global_scale=kw.w13_global_scale, w2_global_scale=kw.w2_global_scale)


#: Chunks of 32 K values whose codes `ws_w4a8_rows` pads each row to a multiple of: those of the widest K step.
CODE_CHUNKS = W4A8_BLOCK_K // 32
#: A K step's codes of one row as one integer, by its bytes (chunks x 1 byte MXFP4 / 2 bytes NVFP4): its torch dtype
#: and the compiler's signature code.
_CODE_STEP_DTYPES = {2: (torch.int16, "i16"), 4: (torch.int32, "i32"), 8: (torch.int64, "i64")}


def code_steps(codes: torch.Tensor, block_k: int) -> torch.Tensor:
    """`ws_w4a8_rows`' table codes [rows, chunks] viewed as one integer per row and K step of block_k ([rows,
    chunks * 32 / block_k]): what the FP8 kernels load for a row's step (chunk h of the step in its bytes h, or
    NVFP4's 16-bit halves h)."""
    return codes.view(_CODE_STEP_DTYPES[block_k // 32 * codes.element_size()][0])


def ws_w4a8_rows(packed: torch.Tensor, scale: torch.Tensor, fmt: str):
    """Weight rows (packed codes [rows, K / 2], block scales [rows, K / B]) as the W4A8 kernels read them
    (layouts.triton_moe, W4A8: each row rebased by 2^-r to E4M3, decoded by table): (W4A8 bytes uint8 [rows, K / 2],
    table codes [rows, CODE_CHUNKS-padded K / 32] of each 32-wide chunk (MXFP4: uint8; NVFP4: int16, its first
    16-wide block's code in the low byte), exponents r int32 [rows]): `w4a8_rows`, which the tile path's
    w4a8_row_data converts with too. The codes past K are W4A8_LUT_ZERO's (a zero table row), so that a row's codes
    of one K step are one aligned word (`code_steps`): one load a row a step, bounded by whole steps only."""
    r, stored, codes = w4a8_rows(packed, scale.view(torch.uint8), fmt)
    if fmt == "nvfp4":
        codes = codes.contiguous().view(torch.int16)
    chunks = codes.shape[1]
    padded = torch.full((codes.shape[0], -(-chunks // CODE_CHUNKS) * CODE_CHUNKS), W4A8_LUT_ZERO, dtype=codes.dtype,
                        device=codes.device)
    padded[:, :chunks] = codes
    return stored, padded, r


def fold_nvfp4_scales(scale: torch.Tensor) -> torch.Tensor:
    """NVFP4's E4M3 block scales [rows, K / 16] as the word routine takes them, folded once here instead of per word
    in the K loop: bf16 s * 2^110 (its 2^126 bias times 2^-16, exact for every E4M3 value; the epilogue multiplies
    the sums by 2^16), a word's two blocks as one int32 [rows, K / 32], the first block in the low half."""
    folded = (scale.view(torch.float8_e4m3fn).float() * 2.0**110).to(torch.bfloat16)
    return folded.view(torch.int32)


#: The oldest triton whose Gluon builds these kernels as measured (the GPU machines' 3.6; CI compiles them with 3.9).
MIN_TRITON = (3, 6)


def ws_unsupported(kw: TritonMoEWeights, device: torch.device, act_quant: str | None = None,
                   mma: str | None = None, fp8_accumulate: str | None = None) -> str | None:
    """Why a call on these weights cannot take the warp-specialized path on `device` (None: it can): the kernels run
    W4A16 (act_quant None), W4A8 on bf16 tensor cores (mma "bf16": the W4A16 dots on the inputs' quantized values),
    and W4A8 on FP8 tensor cores (mma "fp8") with the FP8 sums accumulated in the tensor core (fp8_accumulate
    "tensor-core": promoting each wgmma's sum to fp32 would wait for every wgmma), on sm_90 with a triton of at least
    MIN_TRITON, for the shapes ws_shape_problem accepts."""
    if act_quant is not None and mma == "fp8" and fp8_accumulate != "tensor-core":
        return (f"its FP8 sums accumulate in the tensor core, and this call asks fp8_accumulate={fp8_accumulate!r}: "
                f"set MOE_ORACLE_TRITON_FP8_ACCUMULATE=tensor-core")
    if device.type != "cuda" or torch.cuda.get_device_capability(device) != (9, 0):
        return f"it runs on sm_90 GPUs only (x is on {device})"
    found = _triton_version()
    if version_tuple(found) < MIN_TRITON:
        return f"it needs triton >= {'.'.join(map(str, MIN_TRITON))} (Gluon), found {found}"
    return ws_shape_problem(kw.hidden_size, kw.intermediate_size)


@functools.cache
def _triton_version() -> str:
    """The installed triton's version, read once (moe_forward asks on every call the tables send here)."""
    from importlib.metadata import version

    return version("triton")


def block_k_for(fp8_dots: bool) -> int:
    """The K step of a layer's launches: W4A8_BLOCK_K for W4A8 on FP8 dots, else (bf16 dots) WS_CONFIG's."""
    return W4A8_BLOCK_K if fp8_dots else WS_CONFIG[2]


def block_m_for(fp8_dots: bool, rows_per_expert: float) -> int:
    """The whole blocks' rows of a call with rows_per_expert (T * k / E) pairs per expert on average: W4A8 on FP8
    dots takes W4A8_SMALL_BLOCK_ROWS up to W4A8_SMALL_BLOCKS_UP_TO of them, else (and bf16 dots) WS_CONFIG's."""
    return W4A8_SMALL_BLOCK_ROWS if fp8_dots and rows_per_expert <= W4A8_SMALL_BLOCKS_UP_TO else WS_CONFIG[0]


#: What H and I must be multiples of: a K step ends on a whole step of WS_CONFIG's (a wider step ends in a half one,
#: the kernel's K_TAIL), and I of 64 also makes 2I one of BLOCK_N (128), so every GEMM1 tile holds whole gate/up
#: channel groups for h's [BLOCK_M, BLOCK_N / 2] TMA boxes; GEMM2's last column tile may end past H (its store is
#: masked).
K_MULTIPLE = WS_CONFIG[2]


def ws_shape_problem(hidden: int, inter: int) -> str | None:
    """Why a layer shape cannot take the warp-specialized kernels (None: it can): K_MULTIPLE."""
    if hidden % K_MULTIPLE or inter % K_MULTIPLE:
        return f"H={hidden} and I={inter} must be multiples of {K_MULTIPLE}"
    return None


#: The K step of NVFP4's launches of whole blocks carrying an eighth tail: at W4A8_BLOCK_K their 256 + 32-row
#: builds spill in the K loop, at 64 they keep their wgmmas in flight with no spill (sm_90, triton 3.6).
NVFP4_EIGHTH_TAIL_BLOCK_K = 64


def eighth_tails_unsupported(fmt: str, act_quant: int, block_m: int) -> str | None:
    """Why whole blocks of block_m rows cannot carry an eighth block as their tail (None: they can): only W4A8's
    256-row blocks on FP8 dots compile with a 32-row tail and no serialized wgmma or spill in the K loop (sm_90,
    triton 3.6; NVFP4's at NVFP4_EIGHTH_TAIL_BLOCK_K: `kind_config`); W4A16's GEMM1 serializes its wgmmas."""
    if not fp8_dots(act_quant):
        return "W4A16 and W4A8 on bf16 dots serialize GEMM1's wgmmas with a tail on a whole block"
    if block_m != WS_CONFIG[0]:
        return f"{block_m}-row whole blocks carry a quarter as their tail instead"
    return None


def kind_config(config: tuple, size: int, tail: int, fmt: str) -> tuple:
    """The launch config of one kind of block (`ws_blocks`): the call's, but with NVFP4_EIGHTH_TAIL_BLOCK_K as the
    K step of NVFP4's whole blocks carrying an eighth tail."""
    if fmt == "nvfp4" and size == config[0] and tail == config[0] // 8:
        return config[:2] + (NVFP4_EIGHTH_TAIL_BLOCK_K,) + config[3:]
    return config


def alignment_padding(block_m: int, eighth_tails: bool) -> tuple[int, tuple[int, int] | None]:
    """The alignment of the pairs for blocks of block_m rows, as _routing.align's (block_m, coarse_pad): each run
    padded to BLOCK_M / 4, or with eighth_tails to BLOCK_M / 8 where that leaves a run one eighth past its whole
    blocks (the eighth rides as the last whole block's tail: `ws_blocks`)."""
    return (block_m // 8, (block_m // 4, block_m)) if eighth_tails else (block_m // 4, None)


def ws_blocks(topk_ids: torch.Tensor, experts: int, block_m: int,
              eighth_tails: bool = False) -> list[tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor, int]]:
    """The row blocks of the pairs sorted by expert with each run padded as `alignment_padding` says (_routing.align's
    order): per kind of block the tuple (size, tail, expert [bound] int32, first row [bound] int32, count [1] int32,
    bound), a block covering rows first .. first + size + tail. A run of P padded rows is P // BLOCK_M whole blocks,
    then a half and a quarter block where P's bits say; the quarter rides as the tail of the block before it (one
    decode of the expert's weights for both): the half, or the last whole block where BLOCK_M <= WHOLE_TAIL_MAX_ROWS.
    eighth_tails: a run one eighth past its whole blocks ends in its last whole block carrying that eighth.
    Device ops of static sizes only: entries past count are never read."""
    from backends.triton_moe._routing import padded_runs

    device = topk_ids.device
    half, quarter, eighth = block_m // 2, block_m // 4, block_m // 8
    counts = torch.zeros(experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, topk_ids.reshape(-1).long(), torch.ones(topk_ids.numel(), dtype=torch.int64, device=device))
    padded = padded_runs(counts, *alignment_padding(block_m, eighth_tails))
    start = torch.cumsum(padded, 0) - padded
    whole = padded // block_m
    has_half = (padded // half) % 2
    has_quarter = (padded // quarter) % 2
    on_whole_eighth = (padded // eighth) % 2  # padded to an eighth only one eighth past whole blocks
    lone_quarter = has_quarter * (1 - has_half)
    whole_tails = block_m <= WHOLE_TAIL_MAX_ROWS
    on_whole = lone_quarter * (whole > 0) * whole_tails
    after_whole = start + whole * block_m
    whole_bound = (topk_ids.numel() + experts * (quarter - 1)) // block_m
    tables = []
    for size, tail, per_expert, first_row, bound in (
            (block_m, 0, whole - on_whole - on_whole_eighth, start, whole_bound),
            (block_m, quarter, on_whole, after_whole - block_m, min(experts, whole_bound) * whole_tails),
            (block_m, eighth, on_whole_eighth, after_whole - block_m, min(experts, whole_bound) * eighth_tails),
            (half, quarter, has_half * has_quarter, after_whole, experts),
            (half, 0, has_half * (1 - has_quarter), after_whole, experts),
            (quarter, 0, lone_quarter - on_whole, after_whole, experts)):
        if bound == 0:
            continue
        ends = torch.cumsum(per_expert, 0)
        index = torch.arange(bound, device=device)
        expert = torch.searchsorted(ends, index, right=True).clamp_(max=experts - 1)
        first = first_row[expert] + (index - (ends[expert] - per_expert[expert])) * size
        tables.append((size, tail, expert.to(torch.int32), first.to(torch.int32), ends[-1:].to(torch.int32), bound))
    return tables


def _layouts(block_m: int, block_n: int, block_k: int, act_quant: int = 0):
    """Shared layouts of the packed weight tile (words [BLOCK_N, BLOCK_K / 8] int32; W4A8: bytes [BLOCK_N,
    BLOCK_K / 2]), X's [BLOCK_M, BLOCK_K] tile and the output tiles: h's [BLOCK_M, BLOCK_N / 2] (GEMM1) and the pair
    rows' [BLOCK_M, BLOCK_N] (GEMM2), in the dtypes of `ws_dtypes`."""
    from triton.experimental.gluon import language as gl

    x_dtype, w_dtype, h_dtype = (getattr(gl, name) for name in ws_dtypes(act_quant))
    return (gl.NVMMASharedLayout.get_default_for(packed_block(block_n, block_k, act_quant), w_dtype),
            gl.NVMMASharedLayout.get_default_for([block_m, block_k], x_dtype),
            {1: gl.NVMMASharedLayout.get_default_for([block_m, block_n // 2], h_dtype),
             2: gl.NVMMASharedLayout.get_default_for([block_m, block_n], gl.bfloat16)})


#: triton's dtype names (ws_dtypes) as (torch dtype, the compiler's signature code).
DTYPES = {"bfloat16": (torch.bfloat16, "bf16"), "float8e4nv": (torch.float8_e4m3fn, "fp8e4nv"),
          "int32": (torch.int32, "i32"), "uint8": (torch.uint8, "u8")}


def fp8_dots(act_quant: int) -> bool:
    """Whether the kernels' ACT_QUANT multiplies on FP8 tensor cores (1, 2: W4A8's E4M3 X and W4A8 bytes); 0 (W4A16)
    and 3, 4 (W4A8 on bf16 dots) multiply bf16 X by the W4A16 words."""
    return act_quant in (1, 2)


def packed_block(block_n: int, block_k: int, act_quant: int) -> list[int]:
    """The packed weight tile's TMA box: int32 words [BLOCK_N, BLOCK_K / 8] (8 codes each); FP8 dots' W4A8 bytes
    [BLOCK_N, BLOCK_K / 2]."""
    return [block_n, block_k // (2 if fp8_dots(act_quant) else 8)]


def ws_dtypes(act_quant: int) -> tuple[str, str, str]:
    """(X, packed weights, GEMM1's h) triton dtype names of the kernels' ACT_QUANT: bf16 dots bf16 X and h, int32
    words; FP8 dots E4M3 X, the W4A8 bytes, h in E4M3 (static FP8) or bf16 (MXFP8, quantized after)."""
    if not fp8_dots(act_quant):
        return "bfloat16", "int32", "bfloat16"
    return "float8e4nv", "uint8", "float8e4nv" if act_quant == 1 else "bfloat16"


def constexprs(gemm: int, block_m: int, *, nvfp4: bool, has_bias: bool, activation: int, top_k: int,
               config: tuple = WS_CONFIG, act_quant: int = 0, tail: int = 0, k_size: int = 0,
               persistent: bool = False, sorted_x: bool = False) -> dict:
    """The kernel's constexprs for one GEMM's launch over blocks of block_m rows (and tail rows after each), its K
    k_size (0: a multiple of the K step), persistent or a program per tile; sorted_x: GEMM1 loads x's rows copied
    to the sorted rows' order by TMA instead of gathering them."""
    _, block_n, block_k, stages, warps = config
    if tail or block_m < WS_CONFIG[0]:  # their fixed depths, as deep as shared memory holds (config's: as given)
        stages = min(TAIL_BLOCK_STAGES if tail else PARTIAL_BLOCK_STAGES,
                     ring_stages_that_fit(gemm, block_m + tail, block_n, block_k, act_quant))
    gather = gemm == 1 and not sorted_x
    loader_regs = TMA_LOADER_REGS if not gather else (
        WIDE_STEP_GATHER_LOADER_REGS if block_k > WS_CONFIG[2] else GATHER_LOADER_REGS)
    return dict(GEMM=gemm, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages, NUM_WARPS=warps,
                LOADER_WARPS=GATHER_LOADER_WARPS if gather else TMA_LOADER_WARPS, LOADER_REGS=loader_regs,
                NVFP4=nvfp4, HAS_BIAS=has_bias, ACTIVATION=activation, TOP_K=top_k, ACT_QUANT=act_quant, TAIL_M=tail,
                K_TAIL=k_size % block_k != 0, PERSISTENT=persistent, GATHER=gather)


#: Shared memory a program may take on sm_90 (227 KiB), less a KiB for the ring's barriers and alignment.
SHARED_BYTES = 227 * 1024 - 1024


def ring_stages_that_fit(gemm: int, rows: int, block_n: int, block_k: int, act_quant: int) -> int:
    """The most ring stages whose X tiles (`rows`: a block's and its tail's) and packed weight tile fit SHARED_BYTES
    beside the output tiles (GEMM1's h [rows, BLOCK_N / 2], GEMM2's bf16 [rows, BLOCK_N])."""
    x_bytes, _, h_bytes = (DTYPES[name][0].itemsize for name in ws_dtypes(act_quant))
    stage = rows * block_k * x_bytes + block_n * block_k // 2
    out = rows * block_n // 2 * h_bytes if gemm == 1 else rows * block_n * 2
    return (SHARED_BYTES - out) // stage


@dataclass(frozen=True)
class W4A8Inputs:
    """What a W4A8 launch reads besides its weights: x already quantized per row (act_quant_kernel) and its scheme
    (FP8 dots: ACT_QUANT 1 static FP8, 2 MXFP8; bf16 dots, x the quantized values in bf16: 3 static FP8, 4 MXFP8),
    x's rows' exponents (FP8 dots' MXFP8) and the static scales [a1, 1/a1, a2, 1/a2] (unused ones: any tensor of the
    dtype), and `quantize_h(h, padded_total) -> (h8, exponents)`, FP8 dots' per-row MXFP8 quantization of GEMM1's bf16
    h."""

    act_quant: int
    x_exp: torch.Tensor
    qscale: torch.Tensor
    quantize_h: object


def _row_boxes(gemm: int, rows: int, config: tuple, act_quant: int):
    """(box, layout) of a GEMM's X tile (x, GEMM1; h, GEMM2) and output tile (h; the pair rows) for blocks of
    `rows`: what launch's descriptors and compile_sm90's signature both name."""
    block_n, block_k = config[1:3]
    _, x_layout, y_layouts = _layouts(rows, block_n, block_k, act_quant)
    return ([rows, block_k], x_layout), ([rows, block_n // 2 if gemm == 1 else block_n], y_layouts[gemm])


def _row_descriptors(gemm: int, rows: int, x_in: torch.Tensor, y_out: torch.Tensor, config: tuple, act_quant: int):
    """The TMA descriptors of `_row_boxes` on X (x_in) and the output (y_out)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    (x_box, x_layout), (y_box, y_layout) = _row_boxes(gemm, rows, config, act_quant)
    return TensorDescriptor.from_tensor(x_in, x_box, x_layout), TensorDescriptor.from_tensor(y_out, y_box, y_layout)


def launch(kernels, x, ids, route_w, out, activation: int, swiglu, ws: WSWeights,
           config: tuple = WS_CONFIG, w4a8: W4A8Inputs | None = None, persistent: bool = False,
           eighth_tails: bool = False, sorted_x: bool = False) -> None:
    """GEMM1 over every block size, then GEMM2, then the top-k sum into out; x bf16 [T, H] (W4A8, as `w4a8` says: on
    FP8 dots E4M3, on `ws_weights(kw, w4a8=True)`; on bf16 dots its quantized values in bf16), ids [T, k], route_w
    fp32 [T, k], activation the tile kernels' id (ACT_SILU / ACT_SWIGLUOAI), swiglu (alpha, beta, limit).
    persistent: the launches of blocks up to PERSISTENT_MAX_ROWS run a program per multiprocessor at most
    (`launch_programs`), each on over several tiles; else a program per tile. eighth_tails: an expert's rows one
    eighth block past its whole blocks ride as the last one's tail (`ws_blocks`; `eighth_tails_unsupported`).
    sorted_x: x's rows are first copied to the sorted rows' order, which GEMM1 then loads by TMA as GEMM2 loads h."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from backends.layouts.triton_moe import w4a8_lut_table
    from backends.triton_moe._routing import align
    from backends.triton_moe._ws_kernels import ws_moe_gemm_kernel

    tokens, hidden = x.shape
    k = ids.shape[1]
    block_m, block_n = config[:2]
    inter, num_pairs = ws.inter, tokens * k
    act_quant = w4a8.act_quant if w4a8 is not None else 0
    if fp8_dots(act_quant) != ws.w4a8:
        raise ValueError(f"warp_specialized.launch: ACT_QUANT {act_quant} needs the weights of "
                         f"ws_weights(kw, w4a8={fp8_dots(act_quant)})")
    if not x.is_contiguous() or x.data_ptr() % 16:  # the gather's 16-byte copies need aligned rows
        x = x.clone(memory_format=torch.contiguous_format)
    align_rows, coarse_pad = alignment_padding(block_m, eighth_tails)
    al = align(ids, ws.experts, align_rows, kernels, coarse_pad=coarse_pad)
    h = torch.empty(al.sorted_pairs.numel(), inter, dtype=DTYPES[ws_dtypes(act_quant)[2]][0], device=x.device)
    h_in, h_exp = h, None
    pair_out = torch.empty(1, num_pairs, hidden, dtype=torch.bfloat16, device=x.device)
    unused = route_w  # any fp32 tensor stands in for an absent optional pointer (never read)
    lut = w4a8_lut_table(x.device).view(torch.int64)  # W4A8's table as int64 rows: a row's 8 bytes in one load
    tables = ws_blocks(ids, ws.experts, block_m, eighth_tails)
    if sorted_x:  # pad rows (and the rows past the blocks in use) copy token 0's row: their sums are never stored
        pairs = al.sorted_pairs.long()
        token = torch.where((pairs >= 0) & (pairs < num_pairs), pairs // k, 0)
        x_sorted = x.view(torch.uint8).index_select(0, token).view(x.dtype)
    for gemm, w, s, bias, gs, r, n, k_size in (
            (1, ws.w13, ws.w13_scale, ws.w13_bias, ws.w13_global_scale, ws.w13_row_exp, 2 * inter, hidden),
            (2, ws.w2, ws.w2_scale, ws.w2_bias, ws.w2_global_scale, ws.w2_row_exp, hidden, inter)):
        if gemm == 2 and act_quant == 2:  # MXFP8 rebases each h row as a whole: after all of GEMM1's column tiles
            h_in, h_exp = w4a8.quantize_h(h, al.padded_total)
        row_exps = (w4a8.x_exp if gemm == 1 else h_exp) if act_quant == 2 else al.sorted_pairs
        x_in, y_out = (x_sorted if sorted_x else x, h) if gemm == 1 else (h_in, pair_out[0])
        configs = [kind_config(config, size, tail, ws.format) for size, tail, *_ in tables]
        weight_steps = {step: (TensorDescriptor.from_tensor(w, packed_block(block_n, step, act_quant),
                                                            _layouts(block_m, block_n, step, act_quant)[0]),
                               code_steps(s, step) if ws.w4a8 else s) for step in {c[2] for c in configs}}
        for (size, tail, expert, first, count, bound), launch_config in zip(tables, configs, strict=True):
            w_desc, steps = weight_steps[launch_config[2]]
            x_desc, y_desc = _row_descriptors(gemm, size, x_in, y_out, launch_config, act_quant)
            xt_desc, yt_desc = (_row_descriptors(gemm, tail, x_in, y_out, launch_config, act_quant) if tail
                                else (x_desc, y_desc))
            runs_on = persistent and size + tail <= PERSISTENT_MAX_ROWS
            grid = (launch_programs(-(-n // block_n) * bound, x.device),) if runs_on else (-(-n // block_n), bound)
            ws_moe_gemm_kernel[grid](
                x, x.stride(0), x_desc, xt_desc, w_desc, steps, steps.stride(0), y_desc, yt_desc, pair_out[0],
                pair_out.stride(1), expert, first, count, al.sorted_pairs, num_pairs,
                unused if gs is None else gs, unused if bias is None else bias, 0 if bias is None else bias.stride(0),
                route_w, n, k_size, *swiglu, lut, al.sorted_pairs if r is None else r,
                w4a8.qscale if act_quant else unused, row_exps,
                **constexprs(gemm, size, nvfp4=ws.format == "nvfp4", has_bias=bias is not None,
                             activation=activation, top_k=k, config=launch_config, act_quant=act_quant, tail=tail,
                             k_size=k_size, persistent=runs_on, sorted_x=sorted_x),
                num_warps=config[4], maxnreg=WS_MAXNREG)
    sum_block = 1024
    kernels.topk_sum_kernel[(tokens, -(-hidden // sum_block))](
        pair_out, out, hidden, pair_out.stride(1), out.stride(0), pair_out.stride(0), TOP_K=k, SPLIT_K=1,
        BLOCK_N=sum_block, INTERPRETED=kernels.INTERPRETED)


def _scale_signature(nvfp4: bool, act_quant: int, block_k: int) -> str:
    """The compiler's type of s_ptr: FP8 dots' `code_steps` integers, NVFP4's folded int32 scale pairs, E8M0 bytes."""
    if fp8_dots(act_quant):
        return "*" + _CODE_STEP_DTYPES[block_k // 32 * (2 if nvfp4 else 1)][1]
    return "*i32" if nvfp4 else "*u8"


def launch_programs(tiles: int, device) -> int:
    """A persistent launch's programs over `tiles` (a static bound): one per multiprocessor (the kernels' shared
    memory holds one program per multiprocessor)."""
    return min(tiles, torch.cuda.get_device_properties(device).multi_processor_count)


def compile_sm90(gemm: int, block_m: int = WS_CONFIG[0], *, nvfp4: bool = False, has_bias: bool = False,
                 activation: int = 0, top_k: int = 4, config: tuple = WS_CONFIG, act_quant: int = 0, tail: int = 0,
                 k_size: int = 0, persistent: bool = False, sorted_x: bool = False):
    """One launch's kernel compiled ahead of time for sm_90 (no GPU needed: ptxas ships with triton), for the CPU
    checks of what it compiles to."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from backends.triton_moe._ws_kernels import ws_moe_gemm_kernel

    _, block_n, block_k = config[:3]
    values = constexprs(gemm, block_m, nvfp4=nvfp4, has_bias=has_bias, activation=activation, top_k=top_k,
                        config=config, act_quant=act_quant, tail=tail, k_size=k_size, persistent=persistent,
                        sorted_x=sorted_x)
    x_type, w_type, h_type = (DTYPES[name][1] for name in ws_dtypes(act_quant))
    y_type = h_type if gemm == 1 else "bf16"

    def descriptor_types(rows):  # X's and the output's descriptor types of blocks of `rows` rows
        (x_box, x_layout), (y_box, y_layout) = _row_boxes(gemm, rows, config, act_quant)
        return (f"tensordesc<{x_type}[{x_box[0]},{x_box[1]}],{x_layout!r}>",
                f"tensordesc<{y_type}[{y_box[0]},{y_box[1]}],{y_layout!r}>")

    x_desc, y_desc = descriptor_types(block_m)
    xt_desc, yt_desc = descriptor_types(tail) if tail else (x_desc, y_desc)
    w_layout = _layouts(block_m, block_n, block_k, act_quant)[0]
    packed = packed_block(block_n, block_k, act_quant)
    signature = {"x_ptr": f"*{x_type}", "stride_xm": "i32", "x_desc": x_desc, "xt_desc": xt_desc,
                 "w_desc": f"tensordesc<{w_type}[{packed[0]},{packed[1]}],{w_layout!r}>",
                 "s_ptr": _scale_signature(nvfp4, act_quant, block_k), "stride_sn": "i32",
                 "y_desc": y_desc, "yt_desc": yt_desc, "out_ptr": "*bf16",
                 "stride_om": "i32", "block_expert_ptr": "*i32", "block_first_ptr": "*i32",
                 "block_count_ptr": "*i32", "pair_ptr": "*i32", "num_pairs": "i32", "gs_ptr": "*fp32",
                 "bias_ptr": "*fp32", "stride_be": "i32", "route_w_ptr": "*fp32", "N": "i32", "K": "i32",
                 "alpha": "fp32", "beta": "fp32", "limit": "fp32", "lut_ptr": "*i64", "rexp_ptr": "*i32",
                 "qscale_ptr": "*fp32", "ra_ptr": "*i32"} | {name: "constexpr" for name in values}
    names = ws_moe_gemm_kernel.arg_names
    aligned = ("x_ptr", "stride_xm", "out_ptr", "stride_om", "N", "K")  # as launches specialize them (16 | value)
    source = GluonASTSource(fn=ws_moe_gemm_kernel, signature=signature,
                            constexprs={(names.index(name),): value for name, value in values.items()},
                            attrs={(names.index(name),): [["tt.divisibility", 16]] for name in aligned})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": config[4], "maxnreg": WS_MAXNREG})
