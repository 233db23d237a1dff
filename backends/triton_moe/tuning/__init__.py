"""Launch-config selection of backends.triton_moe, all in this package.

    select_config(arch, gpu, problem)   a table entry if one covers the call, else the heuristics
      tables.py      user tables ($MOE_ORACLE_TUNING_DIR) > shipped tables (tables/*.yaml) - measured, structured
      heuristics.py  configs from the rows per expert (T·k/E), N, K, format and SM count - every other call
      arch/          architecture facts, one module per architecture (sm90.py, sm80.py)
      configs.py     LaunchConfig / MoEConfig / Problem / Gpu

Nothing is autotuned at serving time; `moe-oracle tune` measures and writes a user table.
"""

from __future__ import annotations

import dataclasses
import functools

from backends.triton_moe.tuning.arch import ArchFacts, facts_by_name, facts_for
from backends.triton_moe.tuning.configs import (
    DECODE_AHEAD_MAXNREG,
    GEMM1_ONLY_FIELDS,
    GEMV1_COLUMNS_PER_WARP,
    GEMV1_ROW_GROUPS,
    GEMV2_COLUMNS_PER_WARP,
    GEMV2_ROW_GROUPS,
    GEMV2_SPLITS,
    GEMV_K_SLICES,
    GEMV_MAX_WARPS,
    MIN_HALF_ROWS_BLOCK_M,
    SHAPE_FIELDS,
    DecodeConfig,
    GemvLaunch,
    Gpu,
    LaunchConfig,
    MoEConfig,
    Problem,
    gemv2_slots,
    launch_dict,
    tail_rows_problem,
)
from backends.triton_moe.tuning.heuristics import (
    DECODE_KERNEL_TOKENS,
    FP8_DOTS_WS_MIN_ROWS,
    decode_kernels,
    fp8_config,
    fp8_dots_prefill_config,
    heuristic_config,
    mx_epilogue_config,
    w4a8_config,
)
from backends.triton_moe.tuning.tables import (
    MODELINE,
    TABLE_DIR,
    USER_DIR_ENV,
    TuningTableError,
    read_table,
    reload_user_tables,
    shipped_entries,
    shipped_table,
    table_config,
    user_table_dir,
    validate_table,
)

__all__ = ["ArchFacts", "DECODE_AHEAD_MAXNREG", "DECODE_KERNEL_TOKENS", "DecodeConfig", "GEMM1_ONLY_FIELDS",
           "GEMV1_COLUMNS_PER_WARP", "GEMV1_ROW_GROUPS", "GEMV2_COLUMNS_PER_WARP", "GEMV2_ROW_GROUPS", "GEMV2_SPLITS",
           "GEMV_K_SLICES", "GEMV_MAX_WARPS", "GemvLaunch", "Gpu", "FP8_DOTS_WS_MIN_ROWS", "LaunchConfig",
           "MIN_HALF_ROWS_BLOCK_M", "MODELINE", "MoEConfig", "Problem", "SHAPE_FIELDS", "TABLE_DIR",
           "TuningTableError", "USER_DIR_ENV", "decode_kernels", "device_gpu", "facts_by_name", "facts_for",
           "fp8_config", "fp8_dots_prefill_config", "gemv2_slots", "heuristic_config", "launch_dict",
           "mx_epilogue_config", "read_table", "reload_user_tables", "select_config", "shipped_entries",
           "shipped_table", "table_config", "tail_rows_problem", "user_table_dir", "validate_table", "w4a8_config"]


def select_config(arch: ArchFacts | str, gpu: Gpu, problem: Problem, *, use_tables: bool = True) -> MoEConfig:
    """The launch config of one call: the first entry covering it in the user tables, then in the shipped table of
    this GPU (and the table it extends), else heuristic_config; up to DECODE_KERNEL_TOKENS tokens with the decode
    kernels' warps (decode_kernels) added. use_tables=False: the heuristics alone (benchmarks time both)."""
    facts = facts_by_name(arch) if isinstance(arch, str) else arch
    config = table_config(gpu.name, facts.name, problem) if use_tables else None
    if config is None:
        config = heuristic_config(facts, gpu.sm_count, problem)
    if problem.tokens <= DECODE_KERNEL_TOKENS:  # the calls forward.takes_decode_kernels names run them
        config = dataclasses.replace(config, decode=decode_kernels(gpu.sm_count, problem))  # None: tiles (top-k > 32)
    return config


@functools.lru_cache(maxsize=None)
def device_gpu(device) -> tuple[ArchFacts, Gpu]:
    """(arch facts, Gpu) of a torch device; a CPU device (the interpreter) gets SM90 facts and no table."""
    if getattr(device, "type", "cpu") != "cuda":
        facts = facts_for(None)
        return facts, Gpu("cpu", facts.default_sm_count)
    import torch

    props = torch.cuda.get_device_properties(device)
    return facts_for((props.major, props.minor)), Gpu(props.name, props.multi_processor_count)
