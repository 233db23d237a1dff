"""Reference fused-MoE forward that runs on any torch device: dequantize weights, then plain fp32 GEMMs.

The EMULATION backend of the rule tables runs it (through "backends.runners.emulation:EmulationRunner"): slow but
portable, and the numerical yardstick the real kernels are compared against. It loops over the
experts that received at least one token (never over tokens), dequantizes each active expert's
weights once per call, and accumulates in fp32.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from backends import formats
from oracle import vocabulary
from oracle.vocabulary import GATED_ACTIVATIONS, UNGATED_ACTIVATIONS  # the one activation list (torch-free)

__all__ = ["moe_forward", "WEIGHT_FORMATS", "ACTIVATIONS", "GATE_UP_LAYOUTS", "GEMM_INPUT_SCHEMES"]

WEIGHT_FORMATS = (*vocabulary.WEIGHT_CODECS, "bf16")  # quantized codecs from oracle.vocabulary, or plain
ACTIVATIONS = GATED_ACTIVATIONS + UNGATED_ACTIVATIONS
GATE_UP_LAYOUTS = ("interleaved", "contiguous")
#: fake quantization of one GEMM input (`gemm_input_schemes`): formats.qdq_activation's schemes, "mxfp8" (its
#: "fp8"), and FP8 E4M3 with one scale per tensor, static (the a1/a2 scale given) or dynamic (amax of the whole
#: GEMM input over all routed tokens, as vLLM's scaled_fp8_quant(A, None))
GEMM_INPUT_SCHEMES = (*formats.ACTIVATION_SCHEMES, "mxfp8", "fp8_per_tensor_dynamic", "fp8_per_tensor_static")
_PER_TENSOR = ("fp8_per_tensor_dynamic", "fp8_per_tensor_static")

_FN = "moe_forward"
#: GEMM input schemes the W4A8 operand numerics (fp8_operands=True) define.
_FP8_OPERAND_SCHEMES = ("fp8_per_tensor_static", "mxfp8")


def _fail(kind, message: str):
    raise kind(f"{_FN}: {message}")


def _packed_cols(fmt: str, k: int) -> int:
    """Width of the stored weight row for a logical reduction length k."""
    if fmt in ("mxfp4", "nvfp4"):
        return k // 2
    if fmt.startswith("mxfp6"):
        return k * 3 // 4
    return k


def _scale_spec(fmt: str):
    """(block size, scale dtype) of a weight format's block scales; None for unquantized weights."""
    if fmt == "nvfp4":
        return formats.NVFP4_BLOCK_SIZE, torch.float8_e4m3fn
    if fmt == "bf16":
        return None
    return formats.MX_BLOCK_SIZE, torch.uint8


def _check_weight(name, weight, scale, global_scale, fmt, experts, rows, k, device):
    """Validate one weight tensor ([E, rows, packed k]) and its scales against the chosen format."""
    if not isinstance(weight, torch.Tensor):
        _fail(TypeError, f"{name} must be a torch.Tensor, got {type(weight).__name__}")
    expected = (experts, rows, _packed_cols(fmt, k))
    if fmt == "bf16":
        if not weight.dtype.is_floating_point or weight.dtype == torch.float8_e4m3fn:
            _fail(TypeError, f"{name}.dtype={weight.dtype} must be bfloat16/float16/float32 for format='bf16'; "
                  f"dequantize the weights first or pick the matching format")
    elif weight.dtype != torch.uint8:
        _fail(TypeError, f"{name}.dtype={weight.dtype} must be torch.uint8 (packed codes) for format={fmt!r}; "
              f"view the packed weights as uint8")
    if tuple(weight.shape) != expected:
        _fail(ValueError, f"{name}.shape={tuple(weight.shape)} must be {expected} ([E, rows, K stored as "
              f"{fmt}]) given x and the other weights; check the checkpoint layout and format")
    if weight.device != device:
        _fail(ValueError, f"{name} is on {weight.device} but x is on {device}; move it with .to(x.device)")
    spec = _scale_spec(fmt)
    scale_name = f"{name}_scale"
    if spec is None:
        if scale is not None:
            _fail(ValueError, f"{scale_name} must be None for format='bf16' (unquantized weights have no scales); "
                  f"drop it or pick the quantized format")
        return
    block, scale_dtype = spec
    if k % block != 0:
        _fail(ValueError, f"the reduction dim of {name} is {k}, which must be a multiple of {block} "
              f"(the {fmt} block size); pad the hidden/intermediate size")
    if not isinstance(scale, torch.Tensor):
        _fail(TypeError, f"{scale_name} must be a torch.Tensor of dtype {scale_dtype} for format={fmt!r}, "
              f"got {type(scale).__name__}")
    if scale.dtype != scale_dtype:
        _fail(TypeError, f"{scale_name}.dtype={scale.dtype} must be {scale_dtype} for format={fmt!r}; "
              f"view the scales with .view({scale_dtype})")
    expected_scale = (experts, rows, k // block)
    if tuple(scale.shape) != expected_scale:
        _fail(ValueError, f"{scale_name}.shape={tuple(scale.shape)} must be {expected_scale} (one scale per "
              f"{block} weights); pass the scales that belong to {name}")
    if fmt == "nvfp4":
        gs_name = f"{name}_global_scale"
        if not isinstance(global_scale, torch.Tensor) or tuple(global_scale.shape) != (experts,):
            got = tuple(global_scale.shape) if isinstance(global_scale, torch.Tensor) else type(global_scale).__name__
            _fail(ValueError, f"{gs_name} must be a float32 tensor of shape ({experts},) for format='nvfp4' "
                  f"(got {got}); pass the per-expert quantization multiplier 1/weight_scale_2")


def _dequantize_expert(fmt, weight, scale, global_scale, expert, fp8_operands=False):
    """One expert's weight matrix as float32 [rows, K]; fp8_operands: as the W4A8 kernels multiply it, each row
    rebased by 2^-r to E4M3 (formats.rebase_rows_to_e4m3, the NVFP4 global scale left out), times 2^r."""
    if fp8_operands:
        no_global = torch.ones((), device=weight.device)
        w = (formats.dequantize_mxfp4(weight[expert], scale[expert]) if fmt == "mxfp4"
             else formats.dequantize_nvfp4(weight[expert], scale[expert], no_global))
        w8, r = formats.rebase_rows_to_e4m3(w)
        w = torch.ldexp(w8, r.unsqueeze(-1).float())
        return w if fmt == "mxfp4" else w / global_scale[expert].float()
    if fmt == "bf16":
        return weight[expert].float()
    if fmt == "mxfp4":
        return formats.dequantize_mxfp4(weight[expert], scale[expert])
    if fmt == "nvfp4":
        return formats.dequantize_nvfp4(weight[expert], scale[expert], global_scale[expert].float())
    return formats.dequantize_mxfp6(weight[expert], scale[expert], kind=fmt.split("_")[1])


def _input_schemes(activation_scheme, gemm_input_schemes, a1_scale, a2_scale, fp8_dtype):
    """(gemm1 scheme, gemm2 scheme) after checking the per-GEMM schemes and the static scales they need."""
    if gemm_input_schemes is None:
        if activation_scheme not in formats.ACTIVATION_SCHEMES:
            _fail(ValueError, f"activation_scheme={activation_scheme!r} must be one of {formats.ACTIVATION_SCHEMES}")
        schemes = (activation_scheme, activation_scheme)
    else:
        if activation_scheme is not None:
            _fail(ValueError, "pass activation_scheme (both GEMM inputs) or gemm_input_schemes (one each), not both")
        if not isinstance(gemm_input_schemes, (tuple, list)) or len(gemm_input_schemes) != 2:
            _fail(ValueError, f"gemm_input_schemes={gemm_input_schemes!r} must be a pair (gemm1 input, gemm2 input)")
        schemes = tuple(gemm_input_schemes)
        for which, scheme in zip(("gemm1", "gemm2"), schemes, strict=True):
            if scheme not in GEMM_INPUT_SCHEMES:
                _fail(ValueError, f"gemm_input_schemes {which} input {scheme!r} must be one of {GEMM_INPUT_SCHEMES}")
    for which, scheme, name, scale in (("gemm1", schemes[0], "a1_scale", a1_scale),
                                       ("gemm2", schemes[1], "a2_scale", a2_scale)):
        if scheme == "fp8_per_tensor_static" and (not isinstance(scale, torch.Tensor) or scale.numel() != 1):
            _fail(ValueError, f"{name} must be a one-element fp32 tensor (the static per-tensor input scale) for the "
                  f"{which} input's 'fp8_per_tensor_static', got {scale!r}")
    if any(s in _PER_TENSOR for s in schemes) and fp8_dtype not in formats.FP8_PER_TENSOR_MAX:
        _fail(ValueError, f"fp8_dtype={fp8_dtype!r} must be torch.float8_e4m3fn or torch.float8_e4m3fnuz")
    return schemes


def _qdq_input(x, scheme, scale, fp8_dtype, fp8_operands=False):
    """Fake-quantize one GEMM input (fp32 [n, K]); `scale`: the per-tensor scale (None: dynamic, from this x);
    fp8_operands with 'mxfp8': x rounded to bf16 (the kernels' GEMM1 stores h in bf16: the row-wise rebase needs the
    whole row, which spans column tiles; x is bf16 already), then MXFP8 with each row rebased to one power of two
    (formats.mxfp8_row_rebased)."""
    if fp8_operands and scheme == "mxfp8":
        return formats.mxfp8_row_rebased(x.to(torch.bfloat16).float())
    if scheme in _PER_TENSOR:
        return formats.qdq_fp8_per_tensor(x, scale, fp8_dtype=fp8_dtype)
    return formats.qdq_activation(x, "fp8" if scheme == "mxfp8" else scheme)


def _route(router_logits, topk_ids, topk_weights, top_k, renormalize, tokens, experts, device):
    """Return (topk_ids int64 [T, k], topk_weights fp32 [T, k]) from exactly one routing input."""
    if (router_logits is None) == (topk_ids is None):
        _fail(ValueError, "pass exactly one routing input: router_logits (with top_k) or topk_ids "
              "(with topk_weights)")
    if router_logits is not None:
        if topk_weights is not None:
            _fail(ValueError, "topk_weights is only used with topk_ids; drop it when passing router_logits")
        if not isinstance(router_logits, torch.Tensor) or not router_logits.dtype.is_floating_point:
            _fail(TypeError, "router_logits must be a floating tensor [T, E]; convert with .float()")
        if tuple(router_logits.shape) != (tokens, experts):
            _fail(ValueError, f"router_logits.shape={tuple(router_logits.shape)} must be ({tokens}, {experts}) "
                  f"= (tokens of x, experts of w13)")
        if not isinstance(top_k, int) or not 1 <= top_k <= experts:
            _fail(ValueError, f"top_k={top_k!r} must be an int in [1, {experts}] when routing from router_logits; "
                  f"pass the model's experts-per-token")
        logits = router_logits.float()
        if renormalize:  # gpt-oss / Renormalize: top-k on logits, then softmax over the k selected
            top_logits, ids = torch.topk(logits, top_k, dim=-1)
            return ids, torch.softmax(top_logits, dim=-1)
        probs = torch.softmax(logits, dim=-1)  # softmax over all experts, keep the top-k probabilities as is
        weights, ids = torch.topk(probs, top_k, dim=-1)
        return ids, weights
    if topk_weights is None:
        _fail(ValueError, "topk_weights [T, k] is required together with topk_ids")
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype.is_floating_point or topk_ids.dtype == torch.bool:
        _fail(TypeError, "topk_ids must be an integer tensor [T, k]; convert with .long()")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != tokens:
        _fail(ValueError, f"topk_ids.shape={tuple(topk_ids.shape)} must be ({tokens}, k) with T = x.shape[0]")
    if not isinstance(topk_weights, torch.Tensor) or not topk_weights.dtype.is_floating_point:
        _fail(TypeError, "topk_weights must be a floating tensor [T, k]; convert with .float()")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        _fail(ValueError, f"topk_weights.shape={tuple(topk_weights.shape)} must equal topk_ids.shape="
              f"{tuple(topk_ids.shape)}")
    if top_k is not None and top_k != topk_ids.shape[1]:
        _fail(ValueError, f"top_k={top_k} disagrees with topk_ids.shape[1]={topk_ids.shape[1]}; drop top_k")
    if topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= experts):
        _fail(ValueError, f"topk_ids must lie in [0, {experts}) (E = w13.shape[0]); "
              f"got values in [{int(topk_ids.min())}, {int(topk_ids.max())}]")
    return topk_ids.to(device=device, dtype=torch.int64), topk_weights.to(device=device, dtype=torch.float32)


def _activate(hidden, activation, layout, alpha, beta, limit):
    """Apply the expert activation to GEMM1 output [n, rows] -> [n, I]."""
    if activation == "silu_no_mul":
        return F.silu(hidden)
    if activation == "gelu_no_mul":
        return F.gelu(hidden)
    if activation == "relu2_no_mul":
        return torch.relu(hidden).square()
    if layout == "interleaved":  # gpt-oss: even rows gate, odd rows up
        gate, up = hidden[:, 0::2], hidden[:, 1::2]
    else:  # [w1; w3]: first I rows gate, next I rows up
        gate, up = hidden.chunk(2, dim=-1)
    if activation == "silu":
        return F.silu(gate) * up
    if activation == "gelu":
        return F.gelu(gate) * up  # exact (erf) GELU
    if activation == "swigluoai":
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + beta) * gate * torch.sigmoid(alpha * gate)
    # swiglustep (this project's definition): clamp the SiLU output from above, and the up projection
    # symmetrically, then multiply: silu(gate).clamp(max=limit) * up.clamp(-limit, limit).
    return F.silu(gate).clamp(max=limit) * up.clamp(min=-limit, max=limit)


def moe_forward(
    x: torch.Tensor,
    *,
    w13: torch.Tensor,
    w13_scale: Optional[torch.Tensor],
    w2: torch.Tensor,
    w2_scale: Optional[torch.Tensor],
    w13_bias: Optional[torch.Tensor] = None,
    w2_bias: Optional[torch.Tensor] = None,
    router_logits: Optional[torch.Tensor] = None,
    topk_ids: Optional[torch.Tensor] = None,
    topk_weights: Optional[torch.Tensor] = None,
    top_k: Optional[int] = None,
    renormalize: bool = True,
    format: str = "mxfp4",
    w13_global_scale: Optional[torch.Tensor] = None,
    w2_global_scale: Optional[torch.Tensor] = None,
    activation: str = "swigluoai",
    swiglu_alpha: float = 1.702,
    swiglu_beta: float = 1.0,
    swiglu_limit: float = 7.0,
    gate_up_layout: str = "interleaved",
    activation_scheme: Optional[str] = None,
    gemm_input_schemes: Optional[tuple] = None,
    a1_scale: Optional[torch.Tensor] = None,
    a2_scale: Optional[torch.Tensor] = None,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    fp8_operands: bool = False,
) -> torch.Tensor:
    """Mixture-of-Experts MLP: out[t] = sum_j w[t,j] * (act(x[t] W13[e]^T + b13[e]) W2[e]^T + b2[e]).

    Shapes (E experts, H hidden, I intermediate, R = 2I for gated activations, I for *_no_mul):
      x [T, H] bf16/fp16/fp32; w13 [E, R, H/2] uint8 (mxfp4/nvfp4), [E, R, 3H/4] (mxfp6_*), [E, R, H] float (bf16);
      w13_scale [E, R, H/32] uint8 E8M0 (nvfp4: [E, R, H/16] float8_e4m3fn; bf16: None); w2 [E, H, I/2|3I/4|I],
      w2_scale [E, H, I/32] (nvfp4: I/16); w13_bias [E, R], w2_bias [E, H] (added in fp32 after each GEMM);
      w13_global_scale / w2_global_scale: NVFP4 per-expert fp32 [E] *quantization* multipliers (= 1/weight_scale_2).
    Routing: either router_logits [T, E] with top_k (renormalize=True: top-k on logits then softmax over the k;
    False: softmax over all E, then top-k weights as is), or topk_ids [T, k] with topk_weights [T, k].
    activation_scheme fake-quantizes both GEMM inputs (see formats.qdq_activation); gemm_input_schemes instead
    gives each its own (GEMM_INPUT_SCHEMES), with a1_scale / a2_scale for 'fp8_per_tensor_static' and fp8_dtype
    (e4m3fn, or e4m3fnuz with vLLM's 224 bound) for the per-tensor FP8 ones. Returns [T, H] in x.dtype.

    fp8_operands=True: the W4A8 numerics of backends.triton_moe (act_quant), both GEMMs as FP8 tensor-core dots
    with fp32 sums. Weights (mxfp4/nvfp4): per expert and output row n, r = ceil(log2(max_k |W[n, k]| / 448)) (0 for
    a zero row; W without the NVFP4 global scale), the operand e4m3_rn(W * 2^-r) (exact for MXFP4 rows spanning
    <= 14 binades, rounded for NVFP4), the result times 2^r (and / global scale). Inputs: each GEMM's scheme must
    be 'fp8_per_tensor_static' (e4m3(clamp(x / a, +-448)) * a, as without fp8_operands) or 'mxfp8' (the input
    rounded to bf16, MXFP8, then each row rebased to its largest block exponent ra: e4m3_rn(x_mx * 2^-ra) * 2^ra,
    formats.mxfp8_row_rebased).
    """
    if not isinstance(x, torch.Tensor):
        _fail(TypeError, f"x must be a torch.Tensor [T, H], got {type(x).__name__}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        _fail(TypeError, f"x.dtype={x.dtype} must be bfloat16, float16 or float32; convert with x.to(torch.bfloat16)")
    if x.dim() != 2:
        _fail(ValueError, f"x.shape={tuple(x.shape)} must be 2-D [T, H]; flatten the batch dims with x.reshape(-1, H)")
    if format not in WEIGHT_FORMATS:
        _fail(ValueError, f"format={format!r} must be one of {WEIGHT_FORMATS}")
    if activation not in ACTIVATIONS:
        _fail(ValueError, f"activation={activation!r} must be one of {ACTIVATIONS}")
    if gate_up_layout not in GATE_UP_LAYOUTS:
        _fail(ValueError, f"gate_up_layout={gate_up_layout!r} must be one of {GATE_UP_LAYOUTS}")
    schemes = _input_schemes(activation_scheme, gemm_input_schemes, a1_scale, a2_scale, fp8_dtype)
    if fp8_operands:
        if format not in ("mxfp4", "nvfp4"):
            _fail(ValueError, f"fp8_operands=True needs format 'mxfp4' or 'nvfp4' (the W4A8 kernels' weights), got "
                  f"{format!r}")
        if any(s not in _FP8_OPERAND_SCHEMES for s in schemes) or fp8_dtype != torch.float8_e4m3fn:
            _fail(ValueError, f"fp8_operands=True needs both GEMM input schemes in {_FP8_OPERAND_SCHEMES} and "
                  f"fp8_dtype=torch.float8_e4m3fn, got {schemes} and {fp8_dtype}; pass gemm_input_schemes=")
    if not isinstance(w13, torch.Tensor) or w13.dim() != 3:
        _fail(ValueError, "w13 must be a 3-D tensor [E, 2I (or I for *_no_mul), H stored in the format]")
    if not isinstance(w2, torch.Tensor) or w2.dim() != 3:
        _fail(ValueError, "w2 must be a 3-D tensor [E, H, I stored in the format]")

    tokens, hidden_size = x.shape
    experts, w13_rows = w13.shape[0], w13.shape[1]
    gated = activation in GATED_ACTIVATIONS
    if gated and w13_rows % 2 != 0:
        _fail(ValueError, f"w13.shape[1]={w13_rows} must be even (gate and up rows) for activation={activation!r}; "
              f"use a *_no_mul activation for non-gated experts")
    intermediate = w13_rows // 2 if gated else w13_rows
    _check_weight("w13", w13, w13_scale, w13_global_scale, format, experts, w13_rows, hidden_size, x.device)
    _check_weight("w2", w2, w2_scale, w2_global_scale, format, experts, hidden_size, intermediate, x.device)
    for bias_name, bias, rows in (("w13_bias", w13_bias, w13_rows), ("w2_bias", w2_bias, hidden_size)):
        if bias is None:
            continue
        if not isinstance(bias, torch.Tensor) or not bias.dtype.is_floating_point:
            _fail(TypeError, f"{bias_name} must be a floating tensor [{experts}, {rows}]")
        if tuple(bias.shape) != (experts, rows):
            _fail(ValueError, f"{bias_name}.shape={tuple(bias.shape)} must be ({experts}, {rows}) = (E, rows of the "
                  f"matching weight)")

    for scheme, dim_name, size in zip(schemes, ("hidden size H", "intermediate size I"), (hidden_size, intermediate),
                                      strict=True):
        act_block = formats.NVFP4_BLOCK_SIZE if scheme == "nvfp4" else formats.MX_BLOCK_SIZE
        if scheme is not None and scheme not in _PER_TENSOR and size % act_block != 0:
            _fail(ValueError, f"{dim_name}={size} must be a multiple of {act_block} to fake-quantize that GEMM's "
                  f"input as {scheme!r}; use no activation scheme")

    ids, weights = _route(router_logits, topk_ids, topk_weights, top_k, renormalize, tokens, experts, x.device)
    out = torch.zeros(tokens, hidden_size, dtype=torch.float32, device=x.device)
    if tokens == 0:
        return out.to(x.dtype)

    gemm1_input = _qdq_input(x.float(), schemes[0], a1_scale if schemes[0] == "fp8_per_tensor_static" else None,
                             fp8_dtype, fp8_operands)
    k = ids.shape[1]
    flat_experts = ids.reshape(-1)
    order = torch.argsort(flat_experts, stable=True)
    sorted_tokens = torch.div(order, k, rounding_mode="floor")
    sorted_weights = weights.reshape(-1)[order]
    active, counts = torch.unique_consecutive(flat_experts[order], return_counts=True)
    start, gemm2_inputs = 0, []
    for expert, count in zip(active.tolist(), counts.tolist(), strict=True):
        rows = sorted_tokens[start:start + count]
        route_weight = sorted_weights[start:start + count]
        start += count
        w13_e = _dequantize_expert(format, w13, w13_scale, w13_global_scale, expert, fp8_operands)
        hidden = gemm1_input[rows] @ w13_e.T
        if w13_bias is not None:
            hidden = hidden + w13_bias[expert].float()
        act = _activate(hidden, activation, gate_up_layout, swiglu_alpha, swiglu_beta, swiglu_limit)
        gemm2_inputs.append((expert, rows, route_weight, act))
    if schemes[1] == "fp8_per_tensor_dynamic":  # one scale over the whole GEMM2 input (all routed rows)
        a2_scale = formats.fp8_per_tensor_dynamic_scale(torch.cat([a for *_, a in gemm2_inputs]), fp8_dtype=fp8_dtype)
    elif schemes[1] != "fp8_per_tensor_static":
        a2_scale = None
    for expert, rows, route_weight, act in gemm2_inputs:
        w2_e = _dequantize_expert(format, w2, w2_scale, w2_global_scale, expert, fp8_operands)
        expert_out = _qdq_input(act, schemes[1], a2_scale, fp8_dtype, fp8_operands) @ w2_e.T
        if w2_bias is not None:
            expert_out = expert_out + w2_bias[expert].float()
        out.index_add_(0, rows, expert_out * route_weight.unsqueeze(-1))
    return out.to(x.dtype)
