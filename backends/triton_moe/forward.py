"""This project's fused W4A16 MoE on Triton: MXFP4 / NVFP4 weights, BF16 activations.

    moe_forward(x, weights, router_logits=... | topk_ids=..., topk_weights=...)
      1. route      top-k (+ softmax) as the emulation selects, one launch          _routing.route
      2. align      pairs sorted by expert, padded to BLOCK_M, no host sync         _routing.align
                    (router logits with T * E <= 512: 1 + 2 in one launch, _routing.route_and_align)
      3. GEMM1      gate/up tiles, FP4 dequantized in registers, bias, activation   _kernels.gemm1_act_kernel
                    (split-K: fp32 slices, summed + activated by the tile's last slice program, or by an
                    epilogue launch: SPLIT_EPILOGUE_ENV / split_epilogue=)
      4. GEMM2      FP4 in registers, bias, router weight, one row per pair         _kernels.gemm2_kernel
      5. top-k sum  fixed order over the k slots, cast to x.dtype                   _kernels.topk_sum_kernel
                    (or by the GEMM2 program that stores a token tile's last pair slice, on tickets the
                    alignment zeroed: TOPK_SUM_ENV / topk_sum=)
    act_quant (W4A8): x quantized to FP8 once per row before GEMM1 (_kernels.act_quant_kernel), h by GEMM1's
    epilogue; the W4A16 kernels multiply the operands' bf16 values, or, forced (resolve_w4a8_mma), FP8 dots on
    operands rebased per row (MXFP8's h then by a second act_quant_kernel launch, as the rebase needs whole rows).
    decode (a config with .decode, W4A16, T = 1-2): two launches, no alignment, no split-K partials:
      GEMV1   per (token, slot) pair: routing in-program, gate/up rows, bias, activation  _gemv_kernels.gemv1_act_kernel
      GEMV2   per token: the k slots' rows, bias, router weight, summed in-program       _gemv_kernels.gemv2_sum_kernel
Tiles come from tuning.select_config (a measured table entry, else heuristics from the rows per expert); a
config's split_k > 1 splits a GEMM's K loop over programs (decode), the slices summed in a fixed order afterwards.
No atomics on data (a split-K tile's slices only count themselves in on a ticket the alignment launch zeroed):
every run gives the same bits (`deterministic=True` is therefore always honoured). CUDA-graph capturable.
"""

from __future__ import annotations

import functools
import os
import weakref
from importlib.metadata import version

import torch

from backends.formats import MX_BLOCK_SIZE
from backends.layouts.triton_moe import (
    FORMATS,
    SCALE_BLOCK,
    SCALE_CHUNK,
    TritonMoEWeights,
    given_w4a8_tensors,
    triton_weights,
    w4a8_lut_table,
    w4a8_row_data,
)
from backends.triton_moe import _routing, tuning, warp_specialized
from backends.triton_moe._routing import align, route, route_and_align
from backends.triton_moe.capabilities import ACTIVATIONS, require_triton_version
from backends.weights import KernelWeights

__all__ = ["moe_forward"]

require_triton_version(version("triton"))  # read from metadata: importing triton here would fix its mode early

_FN = "backends.triton_moe.moe_forward"

#: How a split-K GEMM1 (config gemm1.split_k > 1, decode sizes) sums its K slices and activates, same bits either
#: way: "fused" - the tile's last-finishing slice program does it inside GEMM1 (one launch fewer); "launch" - a
#: separate gemm1_split_epilogue_kernel launch (the reference, and the A/B baseline). moe_forward's split_epilogue=
#: wins over this environment variable (read at every call), which wins over the config's gemm1.split_epilogue
#: (the tuning tables say where fused measured faster), which wins over DEFAULT_SPLIT_EPILOGUE.
SPLIT_EPILOGUES = ("fused", "launch")
SPLIT_EPILOGUE_ENV = "MOE_ORACLE_TRITON_SPLIT_EPILOGUE"
DEFAULT_SPLIT_EPILOGUE = "launch"

#: Who sums a token's k pair rows (times GEMM2's split-K slices) into y, same bits either way: "fused" - the GEMM2
#: program whose row draws the last of the (token, column tile)'s k * split_k tickets (the alignment zeroes
#: T * ceil(H / gemm2.block_n) more tickets; one launch fewer); "launch" - topk_sum_kernel (the reference, and the
#: A/B baseline). moe_forward's topk_sum= wins over this environment variable, which wins over DEFAULT_TOPK_SUM:
#: "launch", because on an H100 at T = 1 the fused sum measured no faster on gpt-oss-120b (47.2 vs 47.5 µs) and
#: slower on DeepSeek-V3 (101.8 vs 97.6 µs): the saved launch (~2 µs) goes into GEMM2's per-row ticket atomics and
#: the summing program's dependent L2 loads (benchmarks/results/t1-h100-2026-11-26/); at T >= 4096 it is 1.07-1.36x
#: slower (benchmarks/results/w4a16-tail-rows-h100-2026-11-28/run3).
TOPK_SUMS = ("fused", "launch")
TOPK_SUM_ENV = "MOE_ORACLE_TRITON_TOPK_SUM"
DEFAULT_TOPK_SUM = "launch"
#: Which kernels run a call's GEMMs outside the decode kernels: "tiles" - the Triton tile kernels (every GPU, every
#: size); "warp-specialized" - the Gluon kernels of backends.triton_moe.warp_specialized (sm_90 only: a TMA loader
#: partition and register-decoded wgmma operands; W4A16, W4A8 on bf16 tensor cores, and W4A8 on FP8 ones with
#: tensor-core accumulation), which convert the layer's weights to their own order once (held beside the tile
#: layout's).
#: moe_forward's prefill_kernel= wins over this environment variable, which wins over the config's prefill_kernel (a
#: tuning-table entry names "warp-specialized" where it measured faster; tiles where
#: warp_specialized.ws_unsupported says why not).
PREFILL_KERNELS = ("tiles", "warp-specialized")
PREFILL_KERNEL_ENV = "MOE_ORACLE_TRITON_PREFILL_KERNEL"
#: The warp-specialized kernels' whole blocks, for A/B runs of their size and ring depth: rows
#: ($MOE_ORACLE_TRITON_WS_BLOCK_M, one of WS_BLOCK_MS) and ring stages ($MOE_ORACLE_TRITON_WS_STAGES, one of
#: WS_STAGES), each unset: warp_specialized.WS_CONFIG's. Stages past what shared memory holds fail at launch.
WS_BLOCK_M_ENV = "MOE_ORACLE_TRITON_WS_BLOCK_M"
WS_BLOCK_MS = ("128", "256")
WS_STAGES_ENV = "MOE_ORACLE_TRITON_WS_STAGES"
WS_STAGES = tuple(str(stages) for stages in range(2, 9))
#: The warp-specialized kernels' K step ($MOE_ORACLE_TRITON_WS_BLOCK_K, one of WS_BLOCK_KS; unset: the call's,
#: warp_specialized.block_k_for), for A/B runs (W4A16's operands at 128 spill).
WS_BLOCK_K_ENV = "MOE_ORACLE_TRITON_WS_BLOCK_K"
WS_BLOCK_KS = ("64", "128")
#: The warp-specialized launches' grids ($MOE_ORACLE_TRITON_WS_PERSISTENT, one of WS_PERSISTENT): "1" persistent
#: (a program per multiprocessor running on over the tiles of blocks up to warp_specialized.PERSISTENT_MAX_ROWS),
#: "0" a program per tile; unset: persistent for W4A8 on FP8 dots (1.00-1.04x on both layers and schemes at
#: T = 4096-16384), a program per tile for the bf16 dots (W4A16 0.97-1.03x; W4A8 on bf16 dots runs W4A16's launches),
#: benchmarks/results/ws-persistent-h200-2026-11-28/.
WS_PERSISTENT_ENV = "MOE_ORACLE_TRITON_WS_PERSISTENT"
WS_PERSISTENT = ("0", "1")
#: Whether GEMM1 loads x's rows copied to the sorted order by TMA ($MOE_ORACLE_TRITON_WS_SORTED_X, one of
#: WS_SORTED_X: "1") or gathers them by pair ("0"); unset: as warp_specialized.sorted_x_for says.
WS_SORTED_X_ENV = "MOE_ORACLE_TRITON_WS_SORTED_X"
WS_SORTED_X = ("0", "1")
#: Whether an expert's rows one eighth block past its whole blocks ride as the last one's tail
#: ($MOE_ORACLE_TRITON_WS_EIGHTH_TAILS, one of WS_EIGHTH_TAILS): "1" where warp_specialized.eighth_tails_unsupported
#: allows (an error elsewhere), "0" never (those rows then take a quarter block and a decode of their own); unset:
#: where it allows.
WS_EIGHTH_TAILS_ENV = "MOE_ORACLE_TRITON_WS_EIGHTH_TAILS"
WS_EIGHTH_TAILS = ("0", "1")
#: act_quant values: None is W4A16 (bf16 activations); the others run W4A8, both GEMM inputs FP8 E4M3:
#: "fp8_per_tensor_static" with the checkpoint's input scales a1_scale / a2_scale, "mxfp8" (dynamic, E8M0 per 32
#: along K). Their numerics: backends.emulation.moe_forward's fake quantization on bf16 tensor cores, its
#: fp8_operands=True on FP8 ones (W4A8_MMAS).
ACT_QUANTS = (None, "fp8_per_tensor_static", "mxfp8")
#: Where a W4A8 dot's FP8 products reach fp32: "wgmma" - every wgmma's K = 32 sum is added to the fp32 accumulator
#: (nearly the emulation's fp32 sums); "tensor-core" - all of K stays in the tensor core's accumulator, which keeps
#: fewer bits (Triton's SM90 default; faster). $MOE_ORACLE_TRITON_FP8_ACCUMULATE, else DEFAULT_FP8_ACCUMULATE.
FP8_ACCUMULATIONS = ("wgmma", "tensor-core")
FP8_ACCUMULATE_ENV = "MOE_ORACLE_TRITON_FP8_ACCUMULATE"
DEFAULT_FP8_ACCUMULATE = "wgmma"
#: Which tensor cores multiply a W4A8 call's operands: "bf16" - the W4A16 kernels (tiles, and the decode kernels up
#: to 2 tokens) on the bf16 values of the FP4 weights and of the fake-quantized inputs (backends.emulation's
#: numerics, vLLM's: MXFP8 per block of 32, static FP8's E4M3 values with the scales applied to the sums; each is a
#: bf16 value); "fp8" - FP8 dots (the W4A8 tiles) on operands rebased per row to one power of two (emulation's
#: fp8_operands=True): the weights rebased to E4M3 (rounded for NVFP4), MXFP8 inputs rebased per row. Unforced
#: (w4a8_mma=None, $MOE_ORACLE_TRITON_W4A8_MMA unset) calls take "bf16": on an H100 that is 1.04-1.62x the speed
#: of FP8 dots on MXFP4 weights (benchmarks/results/w4a8-bf16-operands-h100-2026-11-27/), whose W4A8 tiles do not
#: reach the FP8 tensor cores' rate yet, and 0.97-1.03x W4A16's at T >= 16 (w4a8-mx-blocks-h100-2026-11-27/).
W4A8_MMAS = ("bf16", "fp8")
W4A8_MMA_ENV = "MOE_ORACLE_TRITON_W4A8_MMA"
#: Register cap of the decode kernels (_gemv_kernels) without loads ahead. ptxas otherwise holds them to 64
#: registers, and with 128 the same loop measured 1-8% faster on an H100 (gpt-oss-120b T = 1: 42.1 -> 40.4 µs; it
#: takes 64-94 of them). A kernel that loads its next step ahead runs at tuning.DECODE_AHEAD_MAXNREG instead: more
#: registers than that cost it warps (benchmarks/results/decode-kernels-h100-2026-11-27/sweeps-register-pipelines/).
DECODE_MAXNREG = 128
#: The kernels' ACT_QUANT constexpr of each act_quant: on FP8 dots (the codes' scales and row exponents on the sums),
#: and on bf16 dots (static FP8: a1 / a2 on the sums and h's E4M3 values written by GEMM1; MXFP8: h's MXFP8 values
#: written by GEMM1, GEMM2 multiplying them as they are).
_ACT_QUANT_IDS = {None: 0, "fp8_per_tensor_static": 1, "mxfp8": 2}
_BF16_ACT_QUANT_IDS = {None: (0, 0), "fp8_per_tensor_static": (3, 3), "mxfp8": (4, 0)}  # (GEMM1, GEMM2)


def _fail(kind, message: str):
    raise kind(f"{_FN}: {message}")


def _kernels_for(device: torch.device):
    """The kernel module; on CPU only under Triton's interpreter, which must be on from triton's first import.

    Triton decides compiled vs interpreted when each @jit function (its own library included) is
    decorated, so a process cannot switch later: CPU runs (tests, CI) need TRITON_INTERPRET=1 set at start.
    """
    from backends.triton_moe import _kernels

    if device.type == "cpu" and not _kernels.INTERPRETED:
        _fail(RuntimeError, "x is on the CPU but Triton's interpreter is off in this process; start it with "
              "TRITON_INTERPRET=1 (before triton is imported), run on CUDA, or use the EMULATION backend")
    return _kernels


def _check_weights(w: TritonMoEWeights) -> None:
    """The tensors as the kernels address them: packed rows contiguous (the kernels step through the weight tiles
    with the row length K/2 as stride), scale words and biases with unit inner stride. The converter's output
    always passes; a hand-built TritonMoEWeights (a slice, a transposed copy) gets one message, not wrong sums."""
    if w.format not in FORMATS:
        _fail(ValueError, f"weights.format={w.format!r} must be one of {FORMATS}")
    if not isinstance(w.w13, torch.Tensor) or w.w13.dim() != 3:
        _fail(ValueError, "weights.w13 must be a uint8 tensor [E, 2I, H/2] in the triton_moe layout; convert the "
              "checkpoint with backends.layouts.triton_moe:converter")
    experts, hidden, inter, chunk = w.num_experts, w.hidden_size, w.intermediate_size, SCALE_CHUNK[w.format]
    expected = {"w13": (torch.uint8, (experts, 2 * inter, hidden // 2)),
                "w2": (torch.uint8, (experts, hidden, inter // 2)),
                "w13_scale": (torch.int32, (experts, -(-hidden // chunk), 2 * inter)),
                "w2_scale": (torch.int32, (experts, -(-inter // chunk), hidden)),
                "w13_bias": (torch.float32, (experts, 2 * inter)), "w2_bias": (torch.float32, (experts, hidden))}
    if w.format == "nvfp4":
        expected.update(w13_global_scale=(torch.float32, (experts,)), w2_global_scale=(torch.float32, (experts,)))
    for name, (dtype, shape) in expected.items():
        t = getattr(w, name)
        if t is None and name.endswith("bias"):
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != dtype or tuple(t.shape) != shape:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            _fail(ValueError, f"weights.{name} must be {dtype} of shape {shape} (E={experts}, H={hidden}, I={inter}), "
                  f"got {got}; convert the checkpoint with backends.layouts.triton_moe:converter")
        if (not t.is_contiguous()) if name in ("w13", "w2") else t.stride(-1) != 1:
            _fail(ValueError, f"weights.{name} has strides {t.stride()}: the kernels need "
                  f"{'a contiguous tensor' if name in ('w13', 'w2') else 'unit stride in the last dimension'}; "
                  f"pass weights.{name}.contiguous()")
        if t.device != w.device:
            _fail(ValueError, f"weights.{name} is on {t.device} but weights.w13 on {w.device}; keep them together")


def _check_inputs(x, w: TritonMoEWeights, activation):
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        _fail(ValueError, "x must be a 2-D tensor [T, H]; flatten batch dims with x.reshape(-1, H)")
    if x.dtype != torch.bfloat16:
        _fail(TypeError, f"x.dtype={x.dtype} must be torch.bfloat16 (W4A16 kernels); convert with x.bfloat16()")
    if x.shape[1] != w.hidden_size:
        _fail(ValueError, f"x.shape[1]={x.shape[1]} must equal the weights' hidden size {w.hidden_size}")
    if x.device != w.device:
        _fail(ValueError, f"x is on {x.device} but the weights are on {w.device}; move x with .to({w.device})")
    if x.device.type not in ("cuda", "cpu"):
        _fail(ValueError, f"x is on {x.device}: these Triton kernels run on CUDA (and, slowly, on CPU through "
              f"Triton's interpreter, for tests); use the EMULATION backend on other devices")
    if activation not in ACTIVATIONS:
        _fail(ValueError, f"activation={activation!r} must be one of {ACTIVATIONS}")


def _routing_inputs(x, w, router_logits, topk_ids, topk_weights, top_k, renormalize):
    """(topk_ids, fp32 topk_weights, k), checked; (None, None, k) for router_logits, routed later by the path that
    runs (_route_for_tiles, or in-program by the decode kernels)."""
    tokens, experts = x.shape[0], w.num_experts
    if (router_logits is None) == (topk_ids is None):
        _fail(ValueError, "pass exactly one routing input: router_logits (with top_k) or topk_ids (with topk_weights)")
    if router_logits is not None:
        if topk_weights is not None:
            _fail(ValueError, "topk_weights is only used with topk_ids; drop it when passing router_logits")
        if not isinstance(router_logits, torch.Tensor) or tuple(router_logits.shape) != (tokens, experts):
            got = (tuple(router_logits.shape) if isinstance(router_logits, torch.Tensor)
                   else type(router_logits).__name__)
            _fail(ValueError, f"router_logits must be a tensor of shape ({tokens}, {experts}) = (T, E), got {got}")
        if router_logits.device != x.device:
            _fail(ValueError, f"router_logits is on {router_logits.device} but x is on {x.device}")
        if not isinstance(top_k, int) or not 1 <= top_k <= experts:
            _fail(ValueError, f"top_k={top_k!r} must be an int in [1, {experts}] when routing from router_logits")
        if not router_logits.dtype.is_floating_point:
            _fail(TypeError, f"router_logits.dtype={router_logits.dtype} must be floating point (logits)")
        return None, None, top_k  # routed once the path is known (_route_for_tiles, or the decode kernels)
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype.is_floating_point or topk_ids.dim() != 2 \
            or topk_ids.shape[0] != tokens:
        _fail(ValueError, f"topk_ids must be an integer tensor [T={tokens}, k]")
    if not isinstance(topk_weights, torch.Tensor) or tuple(topk_weights.shape) != tuple(topk_ids.shape):
        _fail(ValueError, f"topk_weights must be a floating tensor of shape {tuple(topk_ids.shape)} (= topk_ids)")
    if top_k is not None and top_k != topk_ids.shape[1]:
        _fail(ValueError, f"top_k={top_k} disagrees with topk_ids.shape[1]={topk_ids.shape[1]}; drop top_k")
    if topk_ids.device != x.device or topk_weights.device != x.device:
        _fail(ValueError, f"topk_ids/topk_weights must be on x's device {x.device}")
    capturing = x.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if not capturing and topk_ids.numel():  # range check syncs, so it is skipped inside graph capture
        low, high = int(topk_ids.min()), int(topk_ids.max())
        if low < 0 or high >= experts:
            _fail(ValueError, f"topk_ids must lie in [0, {experts}); got values in [{low}, {high}]")
    return topk_ids, topk_weights.float(), topk_ids.shape[1]  # any integer dtype: the alignment reads it as is


def moe_forward(
    x: torch.Tensor,
    weights: KernelWeights | TritonMoEWeights,
    *,
    router_logits: torch.Tensor | None = None,
    topk_ids: torch.Tensor | None = None,
    topk_weights: torch.Tensor | None = None,
    top_k: int | None = None,
    renormalize: bool = True,
    activation: str = "swigluoai",
    swiglu_alpha: float = 1.702,
    swiglu_beta: float = 1.0,
    swiglu_limit: float = 7.0,
    deterministic: bool = False,
    config: tuning.MoEConfig | None = None,
    split_epilogue: str | None = None,
    topk_sum: str | None = None,
    act_quant: str | None = None,
    a1_scale: torch.Tensor | None = None,
    a2_scale: torch.Tensor | None = None,
    w4a8_mma: str | None = None,
    prefill_kernel: str | None = None,
    fp8_accumulate: str | None = None,
) -> torch.Tensor:
    """y[t] = sum_j w[t,j] * (act(x[t] W13[e]^T + b13[e]) W2[e]^T + b2[e]); same contract as the emulation.

    deterministic: accepted for the rules' sake; no atomics touch data, so runs are always bit-identical.
    config: override the tuned launch config (benchmark sweeps). split_epilogue: "fused" or "launch", where a
    split-K GEMM1 sums its slices (SPLIT_EPILOGUES; None: $MOE_ORACLE_TRITON_SPLIT_EPILOGUE, else the config's
    gemm1.split_epilogue, else DEFAULT_SPLIT_EPILOGUE). topk_sum: "fused" or "launch", who sums the k pairs (TOPK_SUMS;
    None: $MOE_ORACLE_TRITON_TOPK_SUM, else DEFAULT_TOPK_SUM).
    act_quant (ACT_QUANTS): None runs W4A16; "fp8_per_tensor_static" (needs a1_scale, a2_scale: one-element fp32
    tensors, the checkpoint's static input scales of GEMM1 and GEMM2) or "mxfp8" run W4A8 (compute capability
    >= 8.9) on the tensor cores w4a8_mma names: "bf16" or "fp8" (W4A8_MMAS; None: $MOE_ORACLE_TRITON_W4A8_MMA, else
    "bf16"; "fp8" reads the weights' per-row rebase, w4a8_row_data, given or computed once here), their FP8 sums
    accumulated as fp8_accumulate says (FP8_ACCUMULATIONS; None: $MOE_ORACLE_TRITON_FP8_ACCUMULATE, else
    DEFAULT_FP8_ACCUMULATE).
    prefill_kernel: "tiles" or "warp-specialized", the kernels of a call that does not take the decode kernels
    (PREFILL_KERNELS; None: $MOE_ORACLE_TRITON_PREFILL_KERNEL, else the config's prefill_kernel where it can run).
    """
    if isinstance(weights, KernelWeights):
        weights = triton_weights(weights)
    elif not isinstance(weights, TritonMoEWeights):
        _fail(TypeError, f"weights must be the KernelWeights of backends.layouts.triton_moe:converter (or its "
              f"TritonMoEWeights view), got {type(weights).__name__}; convert the checkpoint once with it")
    _check_weights(weights)
    _check_inputs(x, weights, activation)
    forced_epilogue = _forced_choice("split_epilogue", split_epilogue, SPLIT_EPILOGUES, SPLIT_EPILOGUE_ENV,
                                     "the config's gemm1.split_epilogue")
    forced_topk_sum = _forced_choice("topk_sum", topk_sum, TOPK_SUMS, TOPK_SUM_ENV,
                                     f"DEFAULT_TOPK_SUM={DEFAULT_TOPK_SUM!r}")
    static_scales = _check_act_quant(x, act_quant, a1_scale, a2_scale)
    forced_prefill = _forced_choice("prefill_kernel", prefill_kernel, PREFILL_KERNELS, PREFILL_KERNEL_ENV,
                                    "the config's prefill_kernel")
    mma = resolve_w4a8_mma(act_quant, w4a8_mma)
    w4a8_given = given_w4a8_tensors(weights) if act_quant is not None else None  # checked whichever kernels run
    if act_quant is not None:  # read only where it applies: a W4A16 call never fails on it
        fp8_accumulate = _forced_choice("fp8_accumulate", fp8_accumulate, FP8_ACCUMULATIONS, FP8_ACCUMULATE_ENV,
                                        f"DEFAULT_FP8_ACCUMULATE={DEFAULT_FP8_ACCUMULATE!r}") or DEFAULT_FP8_ACCUMULATE
    elif fp8_accumulate is not None:
        _fail(ValueError, f"fp8_accumulate={fp8_accumulate!r} is only read by a W4A8 call (act_quant set); drop it "
              f"or pass act_quant")
    else:
        fp8_accumulate = DEFAULT_FP8_ACCUMULATE
    if config is not None and config.gemm1.block_m != config.gemm2.block_m:
        _fail(ValueError, f"config: gemm1.block_m={config.gemm1.block_m} and gemm2.block_m={config.gemm2.block_m} "
              f"must be equal (both GEMMs walk the same per-expert row blocks); give both GEMMs one BLOCK_M")
    if config is not None and (config.gemm1.half_rows or config.gemm2.half_rows) \
            and config.gemm1.block_m < tuning.MIN_HALF_ROWS_BLOCK_M:
        _fail(ValueError, f"config: half_rows needs block_m >= {tuning.MIN_HALF_ROWS_BLOCK_M} (got "
              f"{config.gemm1.block_m}): half a block must still be a 16-row MMA tile")
    for gemm, launch in ((1, config.gemm1), (2, config.gemm2)) if config is not None else ():
        problem = tuning.tail_rows_problem(launch, gemm)
        if problem:
            _fail(ValueError, f"config: gemm{gemm}: {problem}")
    ids, route_w, k = _routing_inputs(x, weights, router_logits, topk_ids, topk_weights, top_k, renormalize)
    tokens, hidden = x.shape
    inter, experts = weights.intermediate_size, weights.num_experts
    out = torch.empty_like(x)
    if tokens == 0:
        return out
    if config is None:
        arch, gpu = tuning.device_gpu(x.device)
        problem = tuning.Problem(weights.format, tokens, experts, k, hidden, inter)
        config = tuning.select_config(arch, gpu, problem)
        config = tuning.fp8_dots_prefill_config(tuning.w4a8_config(arch, config, act_quant, mma), problem, mma,
                                                fp8_accumulate)
    decode = takes_decode_kernels(config, mma)
    if decode:
        _check_decode(config.decode, k)
    if act_quant == "mxfp8" and mma == "bf16":
        _check_mx_epilogue(config, decode)
    w4a8_call = (act_quant, mma, fp8_accumulate)
    prefill = forced_prefill or _config_prefill_kernel(config, x, weights, *w4a8_call)
    if forced_prefill == "warp-specialized" and not decode:
        _check_warp_specialized(x, weights, *w4a8_call)
    kernels = _kernels_for(x.device)
    if decode:
        _launch_decode(kernels, x, weights, router_logits, ids, route_w, k, renormalize, out, config.decode,
                       activation, (float(swiglu_alpha), float(swiglu_beta), float(swiglu_limit)),
                       _scales_fold(weights), act_quant=act_quant, static_scales=static_scales)
        return out
    if prefill == "warp-specialized":
        if ids is None:
            ids, route_w = route(router_logits, k, renormalize, kernels)
        w4a8 = None
        fp8_dots = act_quant is not None and mma == "fp8"
        if fp8_dots:  # x quantized once per row, as the FP8 tiles read it
            scheme = _ACT_QUANT_IDS[act_quant]
            x, x_exp, qscale = _quantize_rows(kernels, x, scheme, static_scales, None, kernels.INTERPRETED)
            w4a8 = warp_specialized.W4A8Inputs(
                scheme, x_exp, route_w if qscale is None else qscale,
                lambda h, padded_total: _quantize_rows(kernels, h, scheme, None, padded_total, kernels.INTERPRETED)[:2])
        elif act_quant is not None:  # the W4A16 kernels on x's quantized values, GEMM1 writing h's (as the tiles)
            x, qscale = _operand_values(kernels, x, act_quant, static_scales)
            w4a8 = warp_specialized.W4A8Inputs(_BF16_ACT_QUANT_IDS[act_quant][0], route_w,
                                               route_w if qscale is None else qscale, None)
        ws_config = ws_launch_config(fp8_dots, tokens * k / experts)
        warp_specialized.launch(kernels, x, ids, route_w.contiguous(), out, _activation_id(kernels, activation),
                                (float(swiglu_alpha), float(swiglu_beta), float(swiglu_limit)),
                                _ws_weights(weights, fp8_dots), w4a8=w4a8, config=ws_config,
                                persistent=ws_persistent(fp8_dots),
                                sorted_x=ws_sorted_x(fp8_dots, ws_config[0]),
                                eighth_tails=ws_eighth_tails(weights.format, w4a8.act_quant if w4a8 else 0,
                                                             ws_config[0]))
        return out
    fp8 = _w4a8_data(weights, w4a8_given) if mma == "fp8" else None  # the FP8 tiles' operands (bf16: the FP4 ones)
    ids, route_w = _route_for_tiles(kernels, router_logits, ids, route_w, k, renormalize)
    c1 = config.gemm1
    fused_epilogue = (forced_epilogue or c1.split_epilogue or DEFAULT_SPLIT_EPILOGUE) == "fused"
    # the fused split epilogue's tile tickets (one per GEMM1 column tile of each row block), zeroed by the alignment
    tickets_per_block = _cdiv(inter, c1.block_n) if fused_epilogue and c1.split_k > 1 else 0
    fused_topk_sum = (forced_topk_sum or DEFAULT_TOPK_SUM) == "fused"
    sum_tickets = tokens * _cdiv(hidden, config.gemm2.block_n) if fused_topk_sum else 0
    if ids is None:  # decode with router logits: routing and alignment in one launch
        ids, route_w, al = route_and_align(router_logits, k, renormalize, experts, c1.block_m, kernels,
                                           tickets_per_block, sum_tickets)
    else:
        al = align(ids, experts, c1.block_m, kernels, tickets_per_block=tickets_per_block, extra_tickets=sum_tickets)
    _launch(kernels, x, weights, al, route_w, out, config, activation,
            (float(swiglu_alpha), float(swiglu_beta), float(swiglu_limit)), kernels.INTERPRETED,
            fp8 is None and _scales_fold(weights), tickets_per_block, sum_tickets, act_quant, fp8, static_scales,
            fp8_accumulate)
    return out


def resolve_w4a8_mma(act_quant: str | None, choice: str | None = None) -> str | None:
    """The tensor cores of a W4A8 call (W4A8_MMAS; None for W4A16): `choice`, else $MOE_ORACLE_TRITON_W4A8_MMA, else
    "bf16", the faster on either format."""
    if act_quant is None:
        return None
    return _forced_choice("w4a8_mma", choice, W4A8_MMAS, W4A8_MMA_ENV, "'bf16'") or "bf16"


def takes_decode_kernels(config: tuning.MoEConfig, mma: str | None) -> bool:
    """Whether moe_forward runs the decode kernels with `config`: whenever it has their warps and the call multiplies
    bf16 operands (W4A16, and W4A8 on "bf16" tensor cores: resolve_w4a8_mma)."""
    return config.decode is not None and mma != "fp8"


def _check_act_quant(x, act_quant, a1_scale, a2_scale):
    """The checked activation quantization: for 'fp8_per_tensor_static' its input scales (a1, a2) as one-element fp32
    tensors (act_quant_kernel derives what the kernels read from them), else None."""
    if act_quant not in ACT_QUANTS:
        _fail(ValueError, f"act_quant={act_quant!r} must be one of {ACT_QUANTS}")
    static = act_quant == "fp8_per_tensor_static"
    for name, scale in (("a1_scale", a1_scale), ("a2_scale", a2_scale)):
        if not static:
            if scale is not None:
                _fail(ValueError, f"{name} is only read with act_quant='fp8_per_tensor_static' (got act_quant="
                      f"{act_quant!r}); drop {name} or pass that act_quant")
            continue
        if not isinstance(scale, torch.Tensor) or scale.numel() != 1 or scale.dtype != torch.float32:
            got = f"{scale.dtype} of shape {tuple(scale.shape)}" if isinstance(scale, torch.Tensor) else repr(scale)
            _fail(ValueError, f"{name} must be a one-element torch.float32 tensor (the checkpoint's static input scale "
                  f"of GEMM{name[1]}) for act_quant='fp8_per_tensor_static', got {got}; pass e.g. "
                  f"layer.{name.replace('a', 'w', 1)[:2]}_input_scale.float().max().reshape(1)")
        if scale.device != x.device:
            _fail(ValueError, f"{name} is on {scale.device} but x is on {x.device}; move it with .to(x.device)")
    if act_quant is not None and x.device.type == "cuda" and torch.cuda.get_device_capability(x.device) < (8, 9):
        _fail(ValueError, f"act_quant={act_quant!r} needs FP8 hardware (compute capability >= 8.9: E4M3 "
              f"conversions, FP8 dots); "
              f"{torch.cuda.get_device_name(x.device)} has {torch.cuda.get_device_capability(x.device)}: "
              f"use act_quant=None")
    if not static:
        return None
    return a1_scale.reshape(1), a2_scale.reshape(1)


#: id(w13) -> (weakref to it, (w13, w13_scale, w2, w2_scale) versions, the w4a8_row_data) of _w4a8_data.
_W4A8_CACHE: dict = {}


def _w4a8_data(w: TritonMoEWeights, given: dict | None) -> dict:
    """The W4A8 data (w4a8_row_data: the weights in the W4A8 byte order, their lookup-table codes, the rows'
    exponents): the weights' own (`given`, as given_w4a8_tensors checked them), else computed once
    per weight tensor and cached (outside graph capture; inside a capture an uncached layer is an error, never a
    silent recompute). Either way a layer that runs FP8 dots holds its packed weights twice, in the W4A16 and the
    W4A8 byte order."""
    if given is not None:
        return given
    return _once_per_tensor(_W4A8_CACHE, w.w13, (w.w13, w.w13_scale, w.w2, w.w2_scale), lambda: w4a8_row_data(w),
                            _w4a8_data_in_capture)


#: W4A8 (True / False) -> id(w13) -> (weakref, versions, WSWeights) of _ws_weights.
_WS_CACHES: dict = {False: {}, True: {}}


def _ws_weights(w: TritonMoEWeights, w4a8: bool = False):
    """The warp-specialized kernels' weights (warp_specialized.ws_weights; W4A8's of the FP8 kernels), converted once
    per weight tensor."""
    return _once_per_tensor(_WS_CACHES[w4a8], w.w13, (w.w13, w.w13_scale, w.w2, w.w2_scale),
                            lambda: warp_specialized.ws_weights(w, w4a8), _ws_weights_in_capture)


def _ws_weights_in_capture():
    _fail(RuntimeError, "the warp-specialized kernels' weights are not converted yet and cannot be inside CUDA graph "
          "capture; run the layer once with prefill_kernel='warp-specialized' before capture")


def _config_prefill_kernel(config: tuning.MoEConfig, x, w: TritonMoEWeights, act_quant, mma=None,
                           fp8_accumulate=None) -> str:
    """The config's prefill kernels for this call: a table's "warp-specialized" serves the calls those kernels run
    (warp_specialized.ws_unsupported: W4A16, W4A8 on bf16 tensor cores, and on FP8 ones accumulating there), the
    tile kernels every other call."""
    if config.prefill_kernel == "warp-specialized" and warp_specialized.ws_unsupported(
            w, x.device, act_quant, mma, fp8_accumulate) is None:
        return "warp-specialized"
    return "tiles"


def ws_launch_config(fp8_dots: bool, rows_per_expert: float) -> tuple:
    """warp_specialized.WS_CONFIG with the whole blocks' rows of `warp_specialized.block_m_for` (rows_per_expert: the
    call's T * k / E) and the K step of `block_k_for`, and the whole blocks' rows, K step and ring stages of
    $MOE_ORACLE_TRITON_WS_BLOCK_M, _WS_BLOCK_K and _WS_STAGES where they are set."""
    _, block_n, _, stages, warps = warp_specialized.WS_CONFIG
    block_m = warp_specialized.block_m_for(fp8_dots, rows_per_expert)
    block_k = warp_specialized.block_k_for(fp8_dots)
    rows = _forced_choice("block rows", None, WS_BLOCK_MS, WS_BLOCK_M_ENV, f"the call's {block_m}")
    step = _forced_choice("K step", None, WS_BLOCK_KS, WS_BLOCK_K_ENV, f"the call's {block_k}")
    ring = _forced_choice("ring stages", None, WS_STAGES, WS_STAGES_ENV, f"WS_CONFIG's {stages}")
    return int(rows or block_m), block_n, int(step or block_k), int(ring or stages), warps


def ws_persistent(fp8_dots: bool) -> bool:
    """Whether the warp-specialized launches run persistent: $MOE_ORACLE_TRITON_WS_PERSISTENT, else for W4A8 on FP8
    dots (the bf16 dots' launches are W4A16's)."""
    forced = _forced_choice("persistent grid", None, WS_PERSISTENT, WS_PERSISTENT_ENV,
                            "persistent for W4A8 on FP8 dots, a program per tile for the bf16 dots")
    return fp8_dots if forced is None else forced == "1"


def ws_sorted_x(fp8_dots: bool, block_m: int) -> bool:
    """Whether GEMM1 loads x copied to the sorted rows' order: $MOE_ORACLE_TRITON_WS_SORTED_X, else
    warp_specialized.sorted_x_for."""
    forced = _forced_choice("sorted x", None, WS_SORTED_X, WS_SORTED_X_ENV, "warp_specialized.sorted_x_for")
    return warp_specialized.sorted_x_for(fp8_dots, block_m) if forced is None else forced == "1"


def ws_eighth_tails(fmt: str, act_quant: int, block_m: int) -> bool:
    """Whether the warp-specialized launches' whole blocks carry an expert's last eighth block as their tail:
    $MOE_ORACLE_TRITON_WS_EIGHTH_TAILS, else where warp_specialized.eighth_tails_unsupported allows."""
    why = warp_specialized.eighth_tails_unsupported(fmt, act_quant, block_m)
    forced = _forced_choice("eighth tails", None, WS_EIGHTH_TAILS, WS_EIGHTH_TAILS_ENV, "where they compile")
    if forced == "1" and why:
        _fail(ValueError, f"environment variable {WS_EIGHTH_TAILS_ENV}=1: {why}; unset it for this call")
    return why is None if forced is None else forced == "1"


def _check_warp_specialized(x, w: TritonMoEWeights, act_quant, mma, fp8_accumulate) -> None:
    why = warp_specialized.ws_unsupported(w, x.device, act_quant, mma, fp8_accumulate)
    if why:
        _fail(ValueError, f"prefill_kernel='warp-specialized': {why}; use prefill_kernel='tiles'")


def _activation_id(kernels, activation: str) -> int:
    """The kernels' ACTIVATION constexpr of an ACTIVATIONS name."""
    return kernels.ACT_SWIGLUOAI if activation == "swigluoai" else kernels.ACT_SILU


def _w4a8_data_in_capture():
    _fail(RuntimeError, "the W4A8 row data of these weights is not computed yet and cannot be inside CUDA graph "
          "capture; add backends.layouts.triton_moe.w4a8_row_data(weights) to the weights, or run the layer once "
          "before capture")


def _once_per_tensor(cache: dict, anchor: torch.Tensor, watched: tuple, compute, in_capture):
    """compute() once per anchor tensor, again when a watched tensor changed in place (its version moved); the entry
    goes with the anchor (weakref). Inside CUDA-graph capture an uncached anchor gets in_capture() instead, since
    compute() may sync the device."""
    key = id(anchor)
    versions = tuple(t._version for t in watched)
    cached = cache.get(key)
    if cached is not None and cached[0]() is anchor and cached[1] == versions:
        return cached[2]
    if anchor.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return in_capture()
    value = compute()
    cache[key] = (weakref.ref(anchor, lambda _ref, k=key: cache.pop(k, None)), versions, value)
    return value


def _forced_choice(arg: str, choice: str | None, choices: tuple, env: str, otherwise: str) -> str | None:
    """The path the caller forces (one of choices): the argument, else the environment variable, else None (then
    `otherwise` decides); an unknown value of either is an error, never a fallback."""
    if choice is not None:
        if choice not in choices:
            _fail(ValueError, f"{arg}={choice!r} must be one of {choices} or None (then ${env}, else {otherwise})")
        return choice
    from_env = os.environ.get(env)
    if from_env is not None and from_env not in choices:
        _fail(ValueError, f"environment variable {env}={from_env!r} must be one of {choices}; "
              f"set one of them or unset it (then {otherwise} decides)")
    return from_env


#: id(w13_scale) -> (weakref to it, w13/w2 scale versions, verdict) of _scales_fold's one-time check.
_FOLD_VERDICTS: dict = {}


def _scales_fold(w: TritonMoEWeights) -> bool:
    """Whether the dequantization may fold 2^126 into the block scale (one FMA per value pair, not two).

    Always for NVFP4 (E4M3 <= 448, folded with a 2^-16 the epilogues undo). MXFP4: when no E8M0 exponent
    exceeds 128 (block scales <= 2, so 2^126 * scale fits bf16; real checkpoints sit far below). Checked
    once per scale tensor (one device sync, outside graph capture; inside a capture an unchecked tensor runs
    the unfolded path, which gives the same bits).
    """
    if w.format == "nvfp4":
        return True
    return _once_per_tensor(_FOLD_VERDICTS, w.w13_scale, (w.w13_scale, w.w2_scale), lambda: max(
        int(w.w13_scale.view(torch.uint8).max()), int(w.w2_scale.view(torch.uint8).max())) <= 128, lambda: False)


def _launch(kernels, x, weights, al, route_w, out, config, activation, swiglu, interpreted, folded,
            tickets_per_block=0, sum_tickets=0, act_quant=None, fp8=None, static_scales=None, fp8_accumulate="wgmma"):
    """GEMM1 + activation, GEMM2 + router weight, top-k sum: three launches over static grids. A split-K GEMM1
    sums its fp32 slices in fixed order and activates either in the tile's last slice program (tickets_per_block:
    the alignment zeroed one ticket per GEMM1 tile) or, without tickets, in a fourth launch, the separate epilogue.
    Likewise GEMM2 sums each token's pair slices in the program that stores a token tile's last one (sum_tickets:
    the alignment zeroed them after GEMM1's), or topk_sum_kernel does.
    (Folding that epilogue into GEMM2's activation loads gave the same bits but an 8.4x slower GEMM2 on an H200,
    because every GEMM2 column program re-reads the fp32 slices.) act_quant (W4A8; static_scales (a1, a2)):
    act_quant_kernel quantizes x once per row; with fp8 (the weights' W4A8 data, _w4a8_data) to E4M3 codes, which FP8
    dots multiply as loaded (MXFP8: GEMM1's bf16 h too, rebased per row), else to their bf16 values, which the W4A16
    tiles multiply, GEMM1's epilogue writing h's (static FP8: ACT_QUANT 3, its scales on the sums; MXFP8: 4); on sm_90
    GEMM1 is that launch's programmatic dependent (_programmatic_launch), which hides the gap between the two."""
    tokens, hidden = x.shape
    inter, k = weights.intermediate_size, route_w.shape[1]
    num_pairs = tokens * k
    c1, c2 = config.gemm1, config.gemm2
    wgmma1, wgmma2 = _runs_wgmma(c1, x.device), _runs_wgmma(c2, x.device)
    nvfp4 = weights.format == "nvfp4"
    unused = route_w  # any fp32 tensor stands in for an absent optional pointer (never read)
    gs13 = weights.w13_global_scale if nvfp4 else unused
    gs2 = weights.w2_global_scale if nvfp4 else unused
    b13 = weights.w13_bias if weights.w13_bias is not None else unused
    b2 = weights.w2_bias if weights.w2_bias is not None else unused
    w13, w2, s13, s2 = weights.w13, weights.w2, weights.w13_scale, weights.w2_scale
    r13 = r2 = x_exp = h_exp = lut = al.padded_total  # any int32 tensor when unused (never read)
    qscale = None
    act_id = _activation_id(kernels, activation)
    rows = al.num_blocks * c1.block_m
    # x's quantization (bf16 dots) is the last launch before GEMM1, which (pdl) plans its rows before it waits
    pdl = fp8 is None and act_quant is not None and not interpreted and _programmatic_launch(x.device)
    if fp8 is not None:
        act_quant_id = gemm2_act_quant_id = _ACT_QUANT_IDS[act_quant]
        w13, w2, s13, s2 = fp8["w13_fp8"], fp8["w2_fp8"], fp8["w13_lut_code"], fp8["w2_lut_code"]
        r13, r2 = fp8["w13_row_exp"], fp8["w2_row_exp"]
        lut = w4a8_lut_table(x.device)
        x, x_exp, qscale = _quantize_rows(kernels, x, act_quant_id, static_scales, None, interpreted)
    else:
        act_quant_id, gemm2_act_quant_id = _BF16_ACT_QUANT_IDS[act_quant]
        if act_quant is not None:
            x, qscale = _operand_values(kernels, x, act_quant, static_scales, pdl=pdl)
    qs = qscale if qscale is not None else unused
    stride_r13, stride_r2 = (r13.stride(0), r2.stride(0)) if fp8 is not None else (0, 0)
    h = torch.empty(rows, inter, dtype=torch.float8_e4m3fn if act_quant_id == 1 else torch.bfloat16,
                    device=x.device)
    # split-K partials: fp32 gate|up sums per K slice (rows of padding are never written nor read)
    part = (torch.empty(c1.split_k, rows, 2 * inter, dtype=torch.float32, device=x.device) if c1.split_k > 1
            else h.new_empty(1, 1, 1, dtype=torch.float32))
    tiles = al.num_blocks * _cdiv(inter, c1.block_n)
    last_slice_activates = c1.split_k > 1 and tickets_per_block > 0
    gemm1_tickets = tiles if last_slice_activates else 0
    held = 0 if al.tickets is None else al.tickets.numel()
    if held != gemm1_tickets + sum_tickets:  # the alignment was sized for another config
        _fail(ValueError, f"the alignment holds {held} tickets but GEMM1 launches {gemm1_tickets} ticketed tiles and "
              f"GEMM2 sums on {sum_tickets}; align with tickets_per_block = ceil(I / gemm1.block_n) (0 without the "
              f"fused split epilogue) and extra_tickets = T * ceil(H / gemm2.block_n) (0 without the fused top-k sum)")
    unused_int = al.padded_total  # any int32 tensor when unused (never read)
    tickets = al.tickets[:tiles] if last_slice_activates else unused_int
    kernels.gemm1_act_kernel[(tiles, c1.split_k)](
        x, w13, s13, gs13, b13, h, part, tickets,
        al.sorted_pairs, al.block_expert, al.padded_total, r13, qs, x_exp, lut,
        num_pairs, al.num_blocks, hidden, inter,
        x.stride(0), w13.stride(0), w13.stride(1), s13.stride(0),
        s13.stride(1), b13.stride(0), h.stride(0), part.stride(0), part.stride(1), stride_r13, *swiglu,
        **gemm_constexprs(1, c1, k_size=hidden, nvfp4=nvfp4, wgmma=wgmma1, interpreted=interpreted, folded=folded,
                          has_bias=weights.w13_bias is not None),
        LAST_SLICE_ACTIVATES=last_slice_activates, TOP_K=k, ACTIVATION=act_id, ACT_QUANT=act_quant_id,
        FP8_PROMOTE=fp8_accumulate == "wgmma", MX_WARPS=mx_warps(c1, act_quant_id), PDL_WAIT=pdl,
        num_warps=c1.num_warps, num_stages=c1.num_stages, maxnreg=c1.maxnreg, **({"launch_pdl": True} if pdl else {}),
    )
    if c1.split_k > 1 and not last_slice_activates:
        epi_n = 256
        kernels.gemm1_split_epilogue_kernel[(al.num_blocks, _cdiv(inter, epi_n))](
            part, gs13, b13, h, al.sorted_pairs, al.block_expert, al.padded_total, r13, qs, num_pairs, inter,
            part.stride(0), part.stride(1), b13.stride(0), h.stride(0), stride_r13, *swiglu,
            SPLIT_K=c1.split_k, BLOCK_M=c1.block_m, BLOCK_N=epi_n, NVFP4=nvfp4, ACTIVATION=act_id,
            HAS_BIAS=weights.w13_bias is not None, INTERPRETED=interpreted, ACT_QUANT=act_quant_id, num_warps=4,
        )
    if act_quant == "mxfp8" and fp8 is not None:  # rebased per h row, which spans GEMM1's column tiles
        h, h_exp, _ = _quantize_rows(kernels, h, act_quant_id, None, al.padded_total, interpreted)
    # a pair's rows in bf16, as vLLM's intermediate cache (half the bytes for GEMM2 to write and the top-k sum to
    # read); a split GEMM2's K slices' partial sums stay fp32 until that sum adds them. GEMM2 rounds to this dtype.
    pair_out = torch.empty(c2.split_k, num_pairs, hidden, dtype=torch.bfloat16 if c2.split_k == 1 else torch.float32,
                           device=x.device)
    last_pair_sums = sum_tickets > 0
    kernels.gemm2_kernel[(al.num_blocks * _cdiv(hidden, c2.block_n), c2.split_k)](
        h, w2, s2, gs2, b2, route_w, pair_out,
        al.tickets[gemm1_tickets:] if last_pair_sums else unused_int, out,
        al.sorted_pairs, al.block_expert, al.padded_total, r2, qs, h_exp, lut,
        num_pairs, al.num_blocks, inter, hidden,
        h.stride(0), w2.stride(0), w2.stride(1), s2.stride(0),
        s2.stride(1), b2.stride(0), pair_out.stride(1), pair_out.stride(0), out.stride(0), stride_r2,
        **gemm_constexprs(2, c2, k_size=inter, nvfp4=nvfp4, wgmma=wgmma2, interpreted=interpreted, folded=folded,
                          has_bias=weights.w2_bias is not None),
        LAST_PAIR_SUMS=last_pair_sums, TOP_K=k, ACT_QUANT=gemm2_act_quant_id,
        FP8_PROMOTE=fp8_accumulate == "wgmma",
        num_warps=c2.num_warps, num_stages=c2.num_stages, maxnreg=c2.maxnreg,
    )
    if last_pair_sums:
        return
    sum_block = 1024
    kernels.topk_sum_kernel[(tokens, _cdiv(hidden, sum_block))](
        pair_out, out, hidden, pair_out.stride(1), out.stride(0), pair_out.stride(0), TOP_K=k,
        SPLIT_K=c2.split_k, BLOCK_N=sum_block,
        INTERPRETED=interpreted,
    )


def mx_warps(c: tuning.LaunchConfig, act_quant_id: int) -> int:
    """GEMM1's MX_WARPS: its warps where the tile's columns can be ordered so that every MXFP8 block of h (ACT_QUANT 4)
    lies in one warp's rows of the swapped accumulator (_kernels._mx_warp_columns: unstacked, one K slice, 32
    columns a warp), else 0. Without it each block's maxima pass between two warps through shared memory, which
    cost GEMM1 4.5% on gpt-oss-120b at T = 256 (benchmarks/results/w4a8-small-t-kernels-h200-2026-11-28/)."""
    in_warps = (act_quant_id == 4 and c.swap_ab and not c.stack_gate_up and c.split_k == 1
                and c.block_n == 32 * c.num_warps)
    return c.num_warps if in_warps else 0


def _check_decode(decode: tuning.DecodeConfig, top_k: int) -> None:
    """The decode config's warps fit the kernels (row groups divide 64 columns, at most GEMV_MAX_WARPS per program)
    and only GEMV2 splits its row blocks' K over programs."""
    g1, g2 = decode.gemv1, decode.gemv2
    if g1.splits != 1 or g2.splits not in tuning.GEMV2_SPLITS:
        _fail(ValueError, f"config.decode={decode}: gemv1.splits must be 1 and gemv2.splits one of "
              f"{tuning.GEMV2_SPLITS}")
    for name, g, groups, warps in (("gemv1", g1, tuning.GEMV1_ROW_GROUPS, g1.warps()),
                                   ("gemv2", g2, tuning.GEMV2_ROW_GROUPS, g2.warps(tuning.gemv2_slots(top_k)))):
        if g.row_groups not in groups or g.k_slices not in tuning.GEMV_K_SLICES:
            _fail(ValueError, f"config.decode.{name}={g}: row_groups must be one of {groups} and k_slices one of "
                  f"{tuning.GEMV_K_SLICES}")
        if warps > tuning.GEMV_MAX_WARPS:
            _fail(ValueError, f"config.decode.{name}={g} gives {warps} warps per program (top_k={top_k}); at most "
                  f"{tuning.GEMV_MAX_WARPS}: lower row_groups or k_slices")


def _check_mx_epilogue(config: tuning.MoEConfig, decode: bool) -> None:
    """MXFP8 on bf16 dots quantizes h in GEMM1's epilogue: each GEMM1 tile, or GEMV1 program, must hold whole MX blocks
    of h's columns (tuning.mx_epilogue_config makes a selected config so)."""
    block = MX_BLOCK_SIZE
    if decode and tuning.mx_epilogue_config(config) is not config:
        _fail(ValueError, f"config.decode.gemv1={config.decode.gemv1}: W4A8 MXFP8 quantizes h per {block} columns "
              f"in GEMV1, which needs row_groups 4 or 8 ({tuning.GEMV1_COLUMNS_PER_WARP} columns each); pass "
              f"tuning.mx_epilogue_config(config)")
    if not decode and config.gemm1.block_n % block:
        _fail(ValueError, f"config.gemm1.block_n={config.gemm1.block_n}: W4A8 MXFP8 quantizes h per {block} "
              f"columns in GEMM1's epilogue, which needs a multiple of {block}")


def _route_for_tiles(kernels, router_logits, ids, route_w, k, renormalize):
    """(ids, weights) for the tile path: as given, or None (router logits at T * E <= ROUTE_IN_ALIGN_LOGITS: routed
    inside the alignment launch, _routing.route_and_align), or routed now."""
    if ids is not None:
        return ids, route_w
    tokens, experts = router_logits.shape
    if tokens * experts <= _routing.ROUTE_IN_ALIGN_LOGITS:
        return None, None
    return route(router_logits, k, renormalize, kernels)


def _launch_decode(kernels, x, weights, router_logits, ids, route_w, k, renormalize, out, decode, activation,
                   swiglu, folded, act_quant=None, static_scales=None):
    """GEMV1 + activation per pair, then GEMV2 + router weight + top-k sum per token (_gemv_kernels). With
    router_logits (ids None) GEMV1 routes in-program and writes the ids and weights GEMV2 reads. W4A8 (act_quant):
    each GEMV reads its input as the operand's values in bf16 (x: _operand_values; h: GEMV1's epilogue; static FP8
    scales each GEMV's sums by its input scale, static_scales (a1, a2))."""
    from backends.triton_moe import _gemv_kernels as gemv

    static = act_quant == "fp8_per_tensor_static"
    tokens, hidden = x.shape
    inter, experts = weights.intermediate_size, weights.num_experts
    nvfp4 = weights.format == "nvfp4"
    if router_logits is not None:
        logits = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
        ids = torch.empty(tokens, k, dtype=torch.int32, device=x.device)
        route_w = torch.empty(tokens, k, dtype=torch.float32, device=x.device)
    else:
        logits = route_w  # any tensor: never read without routing
        ids, route_w = ids.contiguous(), route_w.contiguous()
    # x's quantization is the last launch before GEMV1, which (pdl) reads the routing inputs above before it waits
    pdl = not kernels.INTERPRETED and _programmatic_launch(x.device)
    qscale = None
    if act_quant is not None:
        x, qscale = _operand_values(kernels, x, act_quant, static_scales, pdl=pdl)
    unused = route_w
    qscale = qscale if static else unused  # [a1, 1/a1, a2, 1/a2], written by x's quantization
    gs13 = weights.w13_global_scale if nvfp4 else unused
    gs2 = weights.w2_global_scale if nvfp4 else unused
    b13 = weights.w13_bias if weights.w13_bias is not None else unused
    b2 = weights.w2_bias if weights.w2_bias is not None else unused
    w13, w2, s13, s2 = weights.w13, weights.w2, weights.w13_scale, weights.w2_scale
    h = torch.empty(tokens * k, inter, dtype=torch.bfloat16, device=x.device)
    shared = dict(top_k=k, nvfp4=nvfp4, folded=folded, interpreted=kernels.INTERPRETED)
    g1, g2 = decode.gemv1, decode.gemv2
    shared["pdl"] = pdl
    row_blocks = hidden // (tuning.GEMV2_COLUMNS_PER_WARP * g2.row_groups)
    part, tickets = unused, unused  # a split GEMV2's partial sums and tickets (GEMV1 zeroes them)
    if g2.splits > 1:
        part = torch.empty(g2.splits, tokens, hidden, dtype=torch.float32, device=x.device)
        tickets = torch.empty(tokens * row_blocks, dtype=torch.int32, device=x.device)
    constexprs, options = gemv_constexprs(
        1, g1, **shared, has_bias=weights.w13_bias is not None, route=router_logits is not None, experts=experts,
        renormalize=renormalize, act=_activation_id(kernels, activation),
        act_quant=act_quant)
    gemv.gemv1_act_kernel[(tokens * k, inter // (tuning.GEMV1_COLUMNS_PER_WARP * g1.row_groups))](
        x, w13, s13, gs13, b13, h, logits, ids, route_w,
        hidden, inter, x.stride(0), w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1), b13.stride(0),
        h.stride(0), logits.stride(0), *swiglu, qscale, tickets, tickets.numel() if g2.splits > 1 else 0,
        **constexprs, **options)
    constexprs, options = gemv_constexprs(2, g2, **shared, has_bias=weights.w2_bias is not None, act_quant=act_quant)
    gemv.gemv2_sum_kernel[(tokens, row_blocks, g2.splits)](
        h, w2, s2, gs2, b2, ids, route_w, out,
        inter, hidden, h.stride(0), w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), b2.stride(0),
        out.stride(0), qscale, part, tickets, **constexprs, **options)


def gemv_constexprs(gemv: int, launch: tuning.GemvLaunch, *, top_k: int, nvfp4: bool, folded: bool,
                    interpreted: bool, has_bias: bool, route: bool = False, experts: int = 0,
                    renormalize: bool = False, act: int = 0, act_quant: str | None = None,
                    pdl: bool = False) -> tuple[dict, dict]:
    """(compile-time arguments, launch options) of GEMV1 (gemv=1: routing from `experts` router logits when route,
    activation id act) or GEMV2 (gemv=2) with warps `launch`, K and N aside: _launch_decode launches with them and
    benchmarks/count_decode_sass.py compiles the same set. act_quant (W4A8): the tiles' bf16-dot ACT_QUANT of that
    GEMV (_BF16_ACT_QUANT_IDS: static FP8's scales on the sums, GEMV1 writing h's FP8 values). pdl: GEMV2 launched
    as GEMV1's programmatic dependent (_programmatic_launch), and with act_quant GEMV1 as that of x's quantization."""
    constexprs = dict(TOP_K=top_k, ROW_GROUPS=launch.row_groups, K_SLICES=launch.k_slices, HAS_BIAS=has_bias,
                      ACT_QUANT=_BF16_ACT_QUANT_IDS[act_quant][gemv - 1],
                      LOADS_AHEAD=launch.loads_ahead, SCALE_BLOCK=SCALE_BLOCK["nvfp4" if nvfp4 else "mxfp4"],
                      NVFP4=nvfp4, FOLDED=folded, USE_ASM=not interpreted, INTERPRETED=interpreted, PDL=pdl)
    if gemv == 1:
        constexprs.update(ROUTE=route, E=experts, E_BLOCK=_routing._pow2(experts), K_BLOCK=_routing._pow2(top_k),
                          RENORMALIZE=bool(renormalize), ACTIVATION=act, PDL_WAIT=pdl and act_quant is not None)
        warps = launch.warps()
    else:
        constexprs.update(SLOTS=tuning.gemv2_slots(top_k), SPLITS=launch.splits)
        warps = launch.warps(constexprs["SLOTS"])
    options = dict(num_warps=warps, maxnreg=tuning.DECODE_AHEAD_MAXNREG if launch.loads_ahead else DECODE_MAXNREG)
    if pdl and (gemv == 2 or act_quant is not None):
        options["launch_pdl"] = True
    return constexprs, options


@functools.lru_cache(maxsize=None)
def _programmatic_launch(device) -> bool:
    """Whether launches chain as programmatic dependents (PDL: GEMV2 of GEMV1, GEMV1 and the tiles' GEMM1 of W4A8's x
    quantization): griddepcontrol needs sm_90, and Triton's gdc ops (triton.language.extra.cuda) must be there."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (9, 0):
        return False
    import triton.language as tl

    return hasattr(getattr(tl.extra, "cuda", None), "gdc_wait")


def _quantize_rows(kernels, src, scheme, static_scales, padded_total, interpreted, values_bf16=False, pdl=False):
    """(E4M3 codes [R, K] of src, their int32 exponents ra [R] for 'mxfp8', the fp32 [a1, 1/a1, a2, 1/a2] for static
    FP8 or None) of act_quant_kernel's scheme (_ACT_QUANT_IDS): static FP8 (GEMM1's input) times 1 / a1 of
    static_scales (a1, a2), or MXFP8 rebased per row; with padded_total (h) only the alignment's padded rows.
    values_bf16: the bf16 dots' operand in bf16 in place of the codes (act_quant_kernel's VALUES_BF16)."""
    dst = torch.empty(src.shape, dtype=torch.bfloat16 if values_bf16 else torch.float8_e4m3fn, device=src.device)
    exps = torch.empty(max(src.shape[0], 1), dtype=torch.int32, device=src.device)
    qscale = torch.empty(4, dtype=torch.float32, device=src.device) if static_scales is not None else None
    a1, a2 = static_scales if static_scales is not None else (exps, exps)  # any tensors when unused (never read)
    block_k = 1 << (src.shape[1] - 1).bit_length()
    kernels.act_quant_kernel[(src.shape[0],)](
        src, dst, exps, a1, a2, exps if qscale is None else qscale, src.shape[0],
        exps if padded_total is None else padded_total, src.shape[1], src.stride(0), dst.stride(0), SCHEME=scheme,
        PADDED_ROWS=padded_total is not None, BLOCK_K=block_k, INTERPRETED=interpreted, VALUES_BF16=values_bf16,
        PDL=pdl, num_warps=4 if block_k <= 4096 else 8)
    return dst, exps, qscale


def _operand_values(kernels, src, act_quant, static_scales, pdl=False):
    """(src [R, K] as the bf16 values of the W4A8 GEMM input, which the W4A16 kernels multiply; static FP8's
    [a1, 1/a1, a2, 1/a2] or None), one launch: 'mxfp8' its MXFP8 values (formats.qdq_activation 'fp8'), static FP8
    the E4M3 values of src / a1 (its scale goes on the sums). pdl: the next kernel is its programmatic dependent."""
    values, _, qscale = _quantize_rows(kernels, src, _ACT_QUANT_IDS[act_quant], static_scales, None,
                                       kernels.INTERPRETED, values_bf16=True, pdl=pdl)
    return values, qscale


def gemm_constexprs(gemm: int, c, *, k_size: int, nvfp4: bool, wgmma: bool, interpreted: bool, folded: bool,
                    has_bias: bool) -> dict:
    """The compile-time arguments that GEMM1 (gemm=1, its K = H) or GEMM2 (gemm=2, K = I) shares with every launch of
    config c: tiles, split-K, the weights' byte order and wgmma handling, and which decode runs. _launch adds GEMM1's
    own (the activation, top-k, the fused split epilogue); benchmarks/check_wgmma_hazard.py compiles the same set."""
    constexprs = dict(
        SPLIT_K=c.split_k, K_SPLIT=_k_split(k_size, c), EVEN_K=_even_k(k_size, c),
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
        SCALE_BLOCK=SCALE_BLOCK["nvfp4" if nvfp4 else "mxfp4"], NVFP4=nvfp4, FOLDED=folded, HAS_BIAS=has_bias,
        SWAP_AB=c.swap_ab, STORED_K_ORDER=not wgmma, RETIRE_WGMMA=wgmma and c.swap_ab, DOT_FP32=interpreted,
        USE_ASM=not interpreted, HALF_ROWS=bool(c.half_rows), TAIL_ROWS=c.tail_rows or 0,
        WIDE_TAIL_ROWS=c.wide_tail_rows or 0)
    if gemm == 1:
        constexprs["STACK_GATE_UP"] = bool(c.stack_gate_up)
    return constexprs


def _runs_wgmma(c, device: torch.device) -> bool:
    """Whether Triton runs this GEMM's dots as wgmma (the architecture's rule, tuning/arch/; the interpreter
    follows SM90's, so that CPU tests cover both branches below).

    wgmma tiles multiply in K order: their register operand wants K bytes 2t, 2t+1, 2t+8, 2t+9 per thread, which
    the stored byte order makes one 4-byte word (the layout's point), and a swap-AB tile, whose weights are that
    register operand, retires its wgmmas before each step's dequantization (_kernels._dequant_words). Other tiles
    (mma.sync) multiply in the stored order: their operands take any K order both share and give each thread 4
    consecutive tile bytes, so only the activations are permuted, which is cheap."""
    return tuning.device_gpu(device)[0].runs_wgmma(c.num_warps)


def _k_split(k_size: int, c) -> int:
    """K values per split-K slice: K / split_k rounded up to whole BLOCK_K steps (1 slice: all of K).

    A multiple of BLOCK_K, so every slice starts on a whole 64-wide nibble group and runs a constexpr number
    of K steps; steps past K are fully masked (the last slice may be short, or empty).
    """
    return _cdiv(_cdiv(k_size, c.split_k), c.block_k) * c.block_k


def _even_k(k_size: int, c) -> bool:
    """True when every K step of every slice lies inside K: the kernels then load without K masks."""
    return _k_split(k_size, c) * c.split_k == k_size


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
