"""What a tuning decision is: the launch config of each GEMM, and the problem it was chosen for."""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: half_rows runs half blocks, and an MMA tile has at least 16 rows.
MIN_HALF_ROWS_BLOCK_M = 32

#: Fields only GEMM1 reads; a table setting one on gemm2 is refused rather than silently ignored.
GEMM1_ONLY_FIELDS = ("split_epilogue", "stack_gate_up")

#: The fields of a layer shape, as tables, the model-shape registry and the sweep name them.
SHAPE_FIELDS = ("format", "experts", "top_k", "hidden_size", "intermediate_size")


@dataclass(frozen=True)
class LaunchConfig:
    """Tile shape and pipeline of one GEMM launch."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    swap_ab: bool
    num_warps: int
    num_stages: int
    split_k: int = 1  # K slices summed afterwards in fixed order (decode: more programs, shorter K loops)
    maxnreg: int | None = None  # register cap per thread: more resident blocks per SM, at the risk of spills
    split_epilogue: str | None = None  # gemm1, split_k > 1: "fused" (last slice program) or "launch" (the default)
    stack_gate_up: bool | None = None  # gemm1: gate and up rows as one weight tile, one dot per step (default: two)
    half_rows: bool | None = None  # blocks whose expert run fills at most half of BLOCK_M multiply only that half
    tail_rows: int | None = None  # a run's last block of at most this many rows is multiplied by the block before it
    wide_tail_rows: int | None = None  # ... and one of more than tail_rows, up to this many, with a wider second dot


def tail_rows_problem(config: LaunchConfig, gemm: int) -> str | None:
    """Why config cannot take its tail_rows and wide_tail_rows (None where it can, or sets none): the tail is a second
    dot on the same weight tile, so it needs one K slice, GEMM1's gate and up stacked into one tile, and
    16 <= tail_rows < wide_tail_rows <= half a block, powers of two (an MMA tile of whole 16-row groups, and a block's
    tail past half of it is a half block)."""
    rows, wide = config.tail_rows, config.wide_tail_rows
    if rows is None:
        return None if wide is None else f"wide_tail_rows={wide} needs tail_rows (the narrower tail); set both"
    for key, value in (("tail_rows", rows), ("wide_tail_rows", wide)):
        if value is not None and (value < 16 or value > config.block_m // 2 or value & (value - 1)):
            return (f"{key}={value} must be a power of two from 16 to block_m / 2 = {config.block_m // 2}; "
                    f"drop it or pick one in that range")
    if wide is not None and wide <= rows:
        return f"wide_tail_rows={wide} must be more than tail_rows={rows}; drop it or raise it"
    if config.split_k != 1:
        return f"tail_rows needs split_k 1 (got {config.split_k}): the tail shares the block's one K loop"
    if gemm == 1 and not config.stack_gate_up:
        return "gemm1.tail_rows needs stack_gate_up: the tail's rows share the stacked gate/up weight tile"
    return None


def launch_dict(config: LaunchConfig) -> dict:
    """The config as a tuning-table `gemm1`/`gemm2` mapping (unset optional fields left out, as tables write them)."""
    return {key: value for key, value in asdict(config).items() if value is not None}


@dataclass(frozen=True)
class GemvLaunch:
    """One decode kernel's warps (backends.triton_moe._gemv_kernels): row_groups of output columns (8 per group in
    GEMV1, 16 in GEMV2) times k_slices of K per program; GEMV2 adds one warp per top-k slot (a power of two).
    loads_ahead: each warp loads its next K step before working on this one, at DECODE_AHEAD_MAXNREG registers.
    splits (GEMV2 only): programs per row block, each with k_slices of the splits * k_slices slices of K; the last
    to finish adds the others' partial sums."""

    row_groups: int
    k_slices: int
    loads_ahead: bool = False
    splits: int = 1

    def warps(self, slots: int = 1) -> int:
        """Warps of one program: row groups x K slices (x GEMV2's top-k slots)."""
        return self.row_groups * slots * self.k_slices


#: Output columns of one decode warp (the kernels' MMA fragments): GEMV1 pairs gate row g with up row g (8 columns),
#: GEMV2 rows g and g + 8 (16). A launch has one program per row_groups of them.
GEMV1_COLUMNS_PER_WARP = 8
GEMV2_COLUMNS_PER_WARP = 16

#: Register cap of a decode kernel with loads_ahead: its next step's loads take 26 more registers than the 64 the
#: kernels use otherwise; at 80 ptxas keeps them ahead of the MMAs without spilling, 25 warps to an SM.
DECODE_AHEAD_MAXNREG = 80


def gemv2_slots(top_k: int) -> int:
    """GEMV2's warps per row group and K slice: one per top-k slot, rounded up to a power of two."""
    return 1 << max(0, (top_k - 1).bit_length())


#: Row groups of one program: its columns (8 or 16 per group) must divide 64, which divides H and I.
GEMV1_ROW_GROUPS = (1, 2, 4, 8)
GEMV2_ROW_GROUPS = (1, 2, 4)
GEMV_K_SLICES = (1, 2, 4, 8, 16)
GEMV2_SPLITS = (1, 2, 4)
#: Warps a program may hold (1024 threads).
GEMV_MAX_WARPS = 32


@dataclass(frozen=True)
class DecodeConfig:
    """The decode path (one activation row per expert pair: T = 1-2): GEMV1 + activation, then GEMV2 with the top-k
    sum, no alignment (forward._launch_decode)."""

    gemv1: GemvLaunch
    gemv2: GemvLaunch

    @property
    def label(self) -> str:
        """How benchmarks name it: gemv1 <row groups>x<K slices>[+ahead] gemv2 <row groups>x<K slices>[+ahead][/<splits>
        programs]."""
        return " ".join(f"{name} {g.row_groups}x{g.k_slices}" + ("+ahead" if g.loads_ahead else "")
                        + (f"/{g.splits} programs" if g.splits > 1 else "")
                        for name, g in (("gemv1", self.gemv1), ("gemv2", self.gemv2)))


@dataclass(frozen=True)
class MoEConfig:
    gemm1: LaunchConfig
    gemm2: LaunchConfig
    source: str  # "table.yaml#entry-index" or "heuristic": shown in benchmarks and errors
    decode: DecodeConfig | None = None  # set: W4A16 calls and W4A8 ones on MXFP4 weights take the decode
    # kernels (forward.moe_forward); other W4A8 calls keep gemm1/gemm2
    prefill_kernel: str = "tiles"  # W4A16 calls off the decode kernels: "tiles" (gemm1/gemm2) or "warp-specialized"
    # (forward.PREFILL_KERNELS: where a table entry measured it faster)


@dataclass(frozen=True)
class Problem:
    """One MoE call as the tuning sees it: the layer shape and the number of tokens T."""

    format: str
    tokens: int
    experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int

    def shape(self) -> dict:
        return {key: getattr(self, key) for key in SHAPE_FIELDS}

    @property
    def rows_per_expert(self) -> float:
        """Mean (token, slot) pairs per expert, T·k/E: the M of each expert's two GEMMs."""
        return self.tokens * self.top_k / self.experts

    @property
    def experts_touched(self) -> float:
        """Expected experts with at least one pair under uniform routing, E·(1 - (1 - k/E)^T)."""
        return self.experts * (1.0 - (1.0 - self.top_k / self.experts) ** self.tokens)

    @property
    def rows_per_touched_expert(self) -> float:
        """Mean pairs of an expert that has any: at decode sizes 1, whatever E is."""
        return self.tokens * self.top_k / max(self.experts_touched, 1.0)


@dataclass(frozen=True)
class Gpu:
    """The device a config is chosen for: its name (tables match a substring of it) and SM count."""

    name: str
    sm_count: int
