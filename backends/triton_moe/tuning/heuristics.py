"""Launch configs for any layer shape, from the work each expert gets: what serves every call no table covers.

The two GEMMs of an MoE layer are E small GEMMs of M = the pairs routed to each expert (T·k/E on average),
N = 2I (GEMM1) or H (GEMM2), K = H or I, over 4-bit weights dequantized in registers. What decides the best tile
is therefore not T but the rows per expert (and how unevenly they spread), and whether the tiles of all experts
fill the GPU's SMs. The rules below are the shape of the winners of the H100/H200 sweeps of gpt-oss-120b (E=128,
k=4) and a DeepSeek-V3 NVFP4 layer (E=256, k=8), re-expressed in those terms so that they carry to other shapes:

* few rows per expert (decode and small batches): 16-row swap-AB tiles, weights on the MMA's M side, one
  warpgroup (wgmma on SM90) over 128 weight rows; at about one row per touched expert (T = 1-2) 64x128 K steps
  with split-K, so that the few experts' tiles still give every SM several programs;
* tens of rows per expert: 64-row tiles that multiply only the half a short run fills (half_rows), gate and up
  rows stacked into one weight tile (stack_gate_up: the dequantized weights stay in registers);
* hundreds: 128-row tiles, half_rows while a run may still fill only half of one, and, where runs often end in a
  block of at most TAIL_ROWS pairs, that block multiplied by the block before it (tail_rows), which decodes its
  weights anyway.

Pure functions of (arch facts, SM count, problem): testable on CPU, no measurement at serving time.
"""

from __future__ import annotations

import math
from dataclasses import replace

from backends.triton_moe.tuning.arch import ArchFacts
from backends.triton_moe.tuning.configs import (
    DECODE_AHEAD_MAXNREG,
    GEMV1_COLUMNS_PER_WARP,
    GEMV1_ROW_GROUPS,
    GEMV2_COLUMNS_PER_WARP,
    GEMV2_ROW_GROUPS,
    GEMV_K_SLICES,
    GEMV_MAX_WARPS,
    DecodeConfig,
    GemvLaunch,
    LaunchConfig,
    MoEConfig,
    Problem,
    gemv2_slots,
)

#: Programs per SM a decode GEMM wants before split-K stops paying: the winners of the T = 1 sweeps launch
#: 3.9-5.5 programs per SM (gpt-oss-120b: 180 tiles x 4 slices on 132 SMs; DeepSeek NVFP4 GEMM1 256 x 2).
PROGRAMS_PER_SM = 3.8
#: A K slice shorter than this many K values loads more partial sums than weights (K = H or I, 4 bits each).
MIN_K_PER_SLICE = 512
MAX_SPLIT_K = 8
#: Rows per expert (mean + two standard deviations of uniform routing) up to which 16-row tiles waste least.
DECODE_ROWS = 16
#: Mean rows per expert up to which a 64-row tile (half_rows) beats 128 rows, and up to which 128-row tiles
#: keep half_rows (a run that fills at most half a block then multiplies only that half).
MID_ROWS = 64
HALF_ROWS_UP_TO = 256
#: The 128-row tiles' tail_rows: an H100 A/B at T = 4096 / 16384 (benchmarks/results/w4a16-tail-rows-h100-2026-11-28/):
#: 16 rows 1.10-1.14x faster at 4096 on gpt-oss-120b and DeepSeek-V3, where half the runs end in a short block; 32
#: within 2% of 16; 64 spills (255 registers and a stack).
TAIL_ROWS = 16
#: Share of runs ending in a block of at most TAIL_ROWS pairs (_short_tail_share) from which tail_rows pays: where
#: runs rarely do, its larger kernel and longer prologue cost up to 7% (Kimi-K2 and Qwen3-Next at T = 4096, no such
#: run: 0.93x); gpt-oss-20b at T = 16384 (0.14 of its runs): 1.08x; where a quarter to 0.4 do, 1.00-1.21x (same A/B).
TAIL_SHARE_MIN = 0.1
#: With tail_rows = TAIL_ROWS, a wide tail of WIDE_TAIL_ROWS where at least this share of runs ends more than
#: TAIL_ROWS and at most WIDE_TAIL_ROWS past a block, and, where few runs end within TAIL_ROWS, one tail of
#: WIDE_TAIL_ROWS; both only below WIDE_TAILS_BELOW mean rows a touched expert, where a run is one or two blocks and a
#: saved half block is a large share of its work. H200 A/Bs in interleaved rounds
#: (benchmarks/results/wide-tails-h200-2026-11-29/, heuristic-tails-h200-2026-11-29/): the wide tail 1.01-1.03x at
#: 128 rows (gpt-oss-120b, DeepSeek-V3, MiniMax-M2 at T = 4096), 1.06-1.08x at 160 (DeepSeek-V3 MXFP4 at 5120,
#: Qwen3-Next at 8192), 1.00x at 256, 0.99x at 512-2048 (MiniMax-M2, gpt-oss-20b at 16384); one 32-row tail 1.03x at
#: 171 rows (Kimi-K2 at 8192), 0.94x at 307 (GLM-4.5 at 6144).
WIDE_TAIL_ROWS = 32
WIDE_TAIL_SHARE_MIN = 0.05
WIDE_TAILS_BELOW = 256
#: GEMM1 K (= H) from which a decode GEMM1 splits K in two regardless of occupancy: its K loop is the longest
#: of the layer (DeepSeek H = 7168 kept split-K 2 at every decode T in the sweeps; gpt-oss H = 2880 did not).
LONG_K = 6144
#: Up to this many tokens a W4A16 call takes the decode kernels (one activation row per expert pair: no
#: alignment, no split-K partials; _gemv_kernels), whose weight stream wastes nothing while the pairs rarely share
#: an expert.
DECODE_KERNEL_TOKENS = 2
#: Warps per SM the decode kernels split K until they have (an H100 sweep at T = 1-2, gpt-oss-120b and DeepSeek-V3:
#: GEMV1 4 row groups x 2 K slices and GEMV2 1 x 4 / 1 x 1 fastest; 32 per SM split K twice as far and lost 3-8%
#: to the cross-warp sums and shorter loops).
DECODE_WARPS_PER_SM = 16
#: Fewer K steps (128 values) per K slice than this and the cross-warp sum costs more than the slice saves.
DECODE_MIN_STEPS = 4
#: Warps of one decode program (GEMV1: row groups x K slices).
DECODE_PROGRAM_WARPS = 8
#: GEMV2 programs an SM below which each row block's K is split over two programs. At fewer, the block scheduler gives
#: some SMs two programs and others one: gpt-oss-120b's 180 at T = 1 on an H100's 132 SMs. Split, its 360 programs of
#: half the warps load ahead, 2-3 an SM: the layer 1.7% faster (benchmarks/results/decode-quad-mma-h100-2026-11-27/).
GEMV2_SPLIT_BELOW = 2
#: 32-bit registers of one SM (every NVIDIA GPU since Kepler): what bounds the decode kernels' resident warps.
REGISTERS_PER_SM = 65536


def _split_k(programs: int, k_size: int, block_k: int, sm_count: int) -> int:
    """Smallest power-of-two split that gives PROGRAMS_PER_SM programs per SM, keeping slices >= MIN_K_PER_SLICE."""
    split = 1
    while (programs * split < PROGRAMS_PER_SM * sm_count and split < MAX_SPLIT_K
           and k_size / (2 * split) >= max(MIN_K_PER_SLICE, block_k)):
        split *= 2
    return split


def _rows_high(problem: Problem) -> float:
    """Mean rows of a touched expert plus two standard deviations (binomial routing): the runs a tile must hold."""
    mean = problem.rows_per_touched_expert
    return mean + 2.0 * math.sqrt(mean)


def _short_tail_share(problem: Problem, block_m: int, tail_rows: int) -> float:
    """Share of the touched experts whose run is longer than one block and ends in one of at most tail_rows pairs
    (the run's pairs about normal around its mean, binomial routing)."""
    mean = problem.rows_per_touched_expert
    sd = max(math.sqrt(mean), 1e-9)

    def below(rows: float) -> float:
        return 0.5 * (1.0 + math.erf((rows - mean) / (sd * math.sqrt(2.0))))

    blocks = range(1, int((mean + 6 * sd) // block_m) + 2)
    return sum(below(n * block_m + tail_rows + 0.5) - below(n * block_m + 0.5) for n in blocks)


def _tails(problem: Problem, block_m: int) -> tuple[int | None, int | None]:
    """(tail_rows, wide_tail_rows) of 128-row tiles: TAIL_ROWS where enough runs end at most that far past a block,
    with a WIDE_TAIL_ROWS tail beside it where enough end between the two; where few runs end within TAIL_ROWS but
    enough within WIDE_TAIL_ROWS (runs averaging about 160-190 pairs), one tail of WIDE_TAIL_ROWS, as the H200
    table's entries at about 160 rows an expert (1.09-1.13x, benchmarks/results/tail-rows-h200-2026-11-28/); the
    WIDE_TAIL_ROWS forms only below WIDE_TAILS_BELOW rows a touched expert."""
    short = _short_tail_share(problem, block_m, TAIL_ROWS)
    if problem.rows_per_touched_expert >= WIDE_TAILS_BELOW:
        return (TAIL_ROWS, None) if short >= TAIL_SHARE_MIN else (None, None)
    within_wide = _short_tail_share(problem, block_m, WIDE_TAIL_ROWS)
    if short >= TAIL_SHARE_MIN:
        return TAIL_ROWS, WIDE_TAIL_ROWS if within_wide - short >= WIDE_TAIL_SHARE_MIN else None
    return (WIDE_TAIL_ROWS, None) if within_wide >= TAIL_SHARE_MIN else (None, None)


def heuristic_config(arch: ArchFacts, sm_count: int, problem: Problem) -> MoEConfig:
    """The launch config for `problem` from the rows per expert, N, K, the format and the SM count (no table)."""
    mean_rows = problem.rows_per_expert
    wgmma_warps = arch.wgmma_min_warps or 4
    if _rows_high(problem) <= DECODE_ROWS:
        return MoEConfig(*_decode(arch, sm_count, problem), "heuristic:decode")
    if mean_rows <= MID_ROWS:
        gemm1 = LaunchConfig(64, 64 if problem.format == "mxfp4" else 128, 64, 8, True, wgmma_warps, 4,
                             stack_gate_up=True, half_rows=True)
        gemm2 = LaunchConfig(64, 128, 64, 8, True, wgmma_warps, 4, half_rows=True)
        return MoEConfig(gemm1, gemm2, "heuristic:mid")
    block_m = 128
    half = True if mean_rows <= HALF_ROWS_UP_TO else None
    tail, wide = _tails(problem, block_m)
    gemm1 = LaunchConfig(block_m, 64, 64, 8, True, wgmma_warps, 3, stack_gate_up=True, half_rows=half,
                         tail_rows=tail, wide_tail_rows=wide)
    gemm2 = LaunchConfig(block_m, 128, 64, 8, True, wgmma_warps, 3, half_rows=half, tail_rows=tail,
                         wide_tail_rows=wide)
    return MoEConfig(gemm1, gemm2, "heuristic:prefill")


def _decode(arch: ArchFacts, sm_count: int, problem: Problem) -> tuple[LaunchConfig, LaunchConfig]:
    """16-row swap-AB tiles. While the touched experts' tiles underfill the GPU (T = 1-2 on 128-256 experts):
    64 weight rows by 128 K values and split-K up to PROGRAMS_PER_SM (the fused split epilogue saves GEMM1 a
    launch); MXFP4 with 2 warps (mma.sync), NVFP4 (twice the scale bytes per weight to decode) with a warpgroup.
    Otherwise 128 weight rows by 64 K, one warpgroup, split-K only for a long GEMM1 K (LONG_K)."""
    touched = max(1, math.ceil(problem.experts_touched))
    blocks = touched  # one 16-row block per touched expert at these sizes
    group_m = 1 if problem.rows_per_expert < 4 else 8
    # underfilled: even 64-wide tiles of the touched experts give the SMs fewer than PROGRAMS_PER_SM programs
    single = blocks * math.ceil(problem.intermediate_size / 64) < PROGRAMS_PER_SM * sm_count
    if single:
        block_n, block_k, stages = 64, 128, 3
        warps = 2 if problem.format == "mxfp4" or not arch.wgmma_min_warps else arch.wgmma_min_warps
    else:
        block_n, block_k, stages = 128, 64, 4
        warps = arch.wgmma_min_warps or 2
    split1 = _split_k(blocks * math.ceil(problem.intermediate_size / block_n), problem.hidden_size, block_k, sm_count)
    split2 = _split_k(blocks * math.ceil(problem.hidden_size / block_n), problem.intermediate_size, block_k,
                      sm_count)
    if problem.hidden_size >= LONG_K:
        split1 = max(split1, 2)
    if not single:  # enough tiles at these sizes; only the long-K rule splits
        split2 = 1
        split1 = 2 if problem.hidden_size >= LONG_K else 1
    gemm1 = LaunchConfig(16, block_n, block_k, group_m, True, warps, stages, split_k=split1,
                         split_epilogue="fused" if split1 > 1 and single else None)
    gemm2 = LaunchConfig(16, block_n, block_k, group_m, True, warps, stages, split_k=split2)
    return gemm1, gemm2


def _k_slices(warps_per_slice: int, k_size: int, sm_count: int) -> int:
    """K slices (a power of two) giving DECODE_WARPS_PER_SM warps per SM, each slice >= DECODE_MIN_STEPS steps."""
    slices, steps = 1, -(-k_size // 128)
    while (warps_per_slice * slices < DECODE_WARPS_PER_SM * sm_count and slices < GEMV_K_SLICES[-1]
           and steps / (2 * slices) >= DECODE_MIN_STEPS):
        slices *= 2
    return slices


def decode_kernels(sm_count: int, problem: Problem) -> DecodeConfig | None:
    """Warps of the decode kernels: K slices until the GPU holds DECODE_WARPS_PER_SM warps per SM, row groups up to
    DECODE_PROGRAM_WARPS warps a program (GEMV2 also has one warp per top-k slot, a power of two), each loading its
    next K step ahead where its grid allows (_one_wave_ahead); None when the top-k slots alone pass GEMV_MAX_WARPS
    (the tile kernels serve such a layer). A GEMV2 grid of fewer than GEMV2_SPLIT_BELOW programs an SM, with K
    slices to share, splits each row block's K over two programs (GemvLaunch.splits)."""
    pairs = problem.tokens * problem.top_k
    slots = gemv2_slots(problem.top_k)
    if slots > GEMV_MAX_WARPS:
        return None
    slices1 = _k_slices(pairs * problem.intermediate_size // GEMV1_COLUMNS_PER_WARP, problem.hidden_size, sm_count)
    groups1 = max(1, min(GEMV1_ROW_GROUPS[-1], DECODE_PROGRAM_WARPS // slices1))
    slices2 = _k_slices(problem.tokens * problem.hidden_size // GEMV2_COLUMNS_PER_WARP * slots,
                        problem.intermediate_size, sm_count)
    slices2 = min(slices2, max(1, GEMV_MAX_WARPS // slots))
    groups2 = max(1, min(GEMV2_ROW_GROUPS[-1], DECODE_PROGRAM_WARPS // (slices2 * slots)))
    # the programs of forward._launch_decode's grids
    programs1 = pairs * problem.intermediate_size // (GEMV1_COLUMNS_PER_WARP * groups1)
    programs2 = problem.tokens * problem.hidden_size // (GEMV2_COLUMNS_PER_WARP * groups2)
    splits2 = 2 if programs2 < GEMV2_SPLIT_BELOW * sm_count and slices2 > 1 else 1
    slices2 //= splits2
    programs2 *= splits2
    return DecodeConfig(GemvLaunch(groups1, slices1, _one_wave_ahead(programs1, groups1 * slices1, sm_count)),
                        GemvLaunch(groups2, slices2, _one_wave_ahead(programs2, groups2 * slices2 * slots, sm_count),
                                   splits2))


def _one_wave_ahead(programs: int, warps: int, sm_count: int) -> bool:
    """Whether a decode kernel loads its next K step ahead: when its grid still fits on the GPU at once at
    DECODE_AHEAD_MAXNREG registers. On an H100 (benchmarks/results/decode-loads-ahead-h100-2026-11-27/) GEMV1
    ahead was 1-3% faster on the matrix layers whose grid fits (gpt-oss, GLM-4.5, Qwen3-Next, MiniMax-M2: 320-384
    programs of 8 warps, 3 an SM) and 3-14% slower on those whose 512 programs then need a second wave; with the
    GEMV2s that fit ahead too, the layers that fit are 1-4.5% faster at T = 1-2."""
    per_sm = REGISTERS_PER_SM // (32 * DECODE_AHEAD_MAXNREG) // warps
    return programs <= per_sm * sm_count


#: W4A8 calls on FP8 dots with tensor-core sums take the warp-specialized kernels from this many rows an expert on
#: (Problem.rows_per_expert), also where a table entry, measured for W4A16, keeps the tile kernels: on
#: gpt-oss-120b and DeepSeek-V3 at 128 and 512 rows (T = 4096, 16384) they were 1.4-2.1x the FP8 tile kernels in one
#: H200 process (benchmarks/results/w4a8-wide-k-h200-2026-11-28/); fewer rows were not measured.
FP8_DOTS_WS_MIN_ROWS = 128


def fp8_dots_prefill_config(config: MoEConfig, problem: Problem, mma: str | None,
                            fp8_accumulate: str | None) -> MoEConfig:
    """The config of a call on FP8 dots with tensor-core sums (the warp-specialized kernels' W4A8) from
    FP8_DOTS_WS_MIN_ROWS rows an expert on: its prefill kernels the warp-specialized ones (where they cannot run,
    forward falls back to the tiles as for any entry); every other call's config as it is."""
    if (mma != "fp8" or fp8_accumulate != "tensor-core" or config.prefill_kernel == "warp-specialized"
            or problem.rows_per_expert < FP8_DOTS_WS_MIN_ROWS):
        return config
    return replace(config, prefill_kernel="warp-specialized", source=f"{config.source}+fp8 dots: warp-specialized")


def w4a8_config(arch: ArchFacts, config: MoEConfig, act_quant: str | None, mma: str | None) -> MoEConfig:
    """The launch config of a W4A8 call (act_quant, on the tensor cores `mma` of forward.resolve_w4a8_mma) from the
    W4A16 one that the tables and heuristics give: fp8_config for FP8 dots, mx_epilogue_config for MXFP8 on bf16
    dots; W4A16 and static FP8 on bf16 dots run it as it is."""
    if mma == "fp8":
        return fp8_config(arch, config)
    if act_quant == "mxfp8":
        return mx_epilogue_config(config)
    return config


def mx_epilogue_config(config: MoEConfig) -> MoEConfig:
    """The W4A8 MXFP8 launch config on bf16 dots from a W4A16 one: GEMV1 quantizes h per MX block of 32 columns in its
    epilogue, so a program needs 4 or 8 row groups (8 columns each); fewer are raised to 4, the K slices lowered so
    that a program keeps its warps. The tiles' block_n (64 or 128) holds whole blocks already. A config whose GEMV1
    holds whole blocks is returned as it is (forward._check_mx_epilogue relies on that)."""
    decode = config.decode
    if decode is None or decode.gemv1.row_groups * GEMV1_COLUMNS_PER_WARP % 32 == 0:  # formats.MX_BLOCK_SIZE
        return config
    gemv1 = decode.gemv1
    k_slices = max(1, gemv1.k_slices * gemv1.row_groups // 4)
    return replace(config, decode=replace(decode, gemv1=replace(gemv1, row_groups=4, k_slices=k_slices)),
                   source=f"{config.source}+mxfp8:gemv1 4x{k_slices}")


def fp8_config(arch: ArchFacts, config: MoEConfig) -> MoEConfig:
    """The W4A8 (FP8 activations) launch config from a W4A16 one (tables and heuristics were measured with bf16
    dots): a GEMM tile of fewer warps than a wgmma warpgroup gets one, because Triton runs an FP8 dot of fewer warps
    as fp16 mma.sync, converting every operand (gpt-oss-120b at T = 1 on an H100: 81-85 µs with 2 warps, 64-70 µs
    with 4; benchmarks/results/w4a8-lut-h100-2026-11-27/)."""
    warps = arch.wgmma_min_warps
    if warps is None:
        return config
    gemm1, gemm2 = (replace(c, num_warps=warps) if c.num_warps < warps else c for c in (config.gemm1, config.gemm2))
    if (gemm1, gemm2) == (config.gemm1, config.gemm2):
        return config
    return replace(config, gemm1=gemm1, gemm2=gemm2, source=f"{config.source}+fp8:{warps} warps")  # decode kept
