"""HUMMING as a runner: humming-kernels' indexed MoE GEMMs, driven as vLLM 0.33's HummingIndexedExperts drives them.

    prepare   per GEMM (w13: N = 2I, K = H; w2: N = H, K = I) one `humming.layer.HummingLayer` over all experts,
              loaded from the checkpoint tensors in the library's own schema (``mxfp4``: E2M1 + E8M0 per 32;
              ``modelopt`` NVFP4: E2M1 + E4M3 per 16 + the per-expert dequantization scale
              ``weight_scale_2 = 1 / global_scale``) and transformed by Humming itself (``transform()``: repack,
              pad N to 256 and K to 128 as vLLM's `_prepare_and_transform_sublayer` asks); the tuning table of
              each GEMM comes from `humming.tune.get_heuristics_config(..., gemm_type="indexed")`.
    apply     top-k routing as the emulation routes; pairs sorted by expert and padded to the tuning table's
              block size (vLLM's moe_align_block_size, here in torch with no host sync, so CUDA-graph capturable);
              GEMM1 (top_k = k, bias fused) -> the gated activation between the GEMMs (vLLM applies it in its own
              op; here the emulation's definition in bf16) -> GEMM2 (top_k = 1) -> router-weighted sum over k.

Activations: every gated one of `oracle.vocabulary` (swigluoai with the rules' gemm1 constants, silu, ...), in the
checkpoint's gate/up row order. CUDA only (compute capability 7.5+). Inputs stay BF16 (W4A16): no
VLLM_HUMMING_INPUT_QUANT_CONFIG equivalent is applied.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from backends.emulation import _activate, _route
from backends.runners.base import Routing, RunnerSpec, require_module
from backends.weights import MoEWeights

__all__ = ["HOW_TO_GET", "HummingRunner", "align_indexed"]

HOW_TO_GET = "pip install 'moe-oracle[humming]' (humming-kernels 0.1.19, the version vLLM 0.33 uses)"
#: vLLM's padding of both Humming GEMMs (fused_moe/oracle/humming.py, _prepare_and_transform_sublayer)
PAD_N, PAD_K = 256, 128
#: vLLM's block size when no tuning row covers the token count
DEFAULT_BLOCK = 64


def align_indexed(topk_ids: torch.Tensor, num_experts: int, block: int) -> tuple[torch.Tensor, ...]:
    """(sorted_ids, expert_ids, num_tokens_padded) of an indexed grouped GEMM, without a host sync.

    The pairs (flat index t*k + j of topk_ids) are grouped by expert, each group padded to a multiple of `block`
    with the sentinel T*k; expert_ids names the expert of every block; num_tokens_padded [1] is the used length.
    The buffers have the worst-case length T*k + E*(block-1) (what vLLM's moe_align_block_size allocates)."""
    flat = topk_ids.reshape(-1).long()
    pairs = flat.numel()
    device = flat.device
    counts = torch.zeros(num_experts, dtype=torch.long, device=device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block - 1) // block * block
    padded_end = padded.cumsum(0)
    start = padded_end - padded
    order = torch.sort(flat, stable=True).indices
    experts_sorted = flat[order]
    first_of_expert = counts.cumsum(0) - counts
    rank = torch.arange(pairs, device=device) - first_of_expert[experts_sorted]
    capacity = -(-(pairs + num_experts * (block - 1)) // block) * block
    sorted_ids = torch.full((capacity,), pairs, dtype=torch.int32, device=device)
    sorted_ids[start[experts_sorted] + rank] = order.to(torch.int32)
    block_starts = torch.arange(0, capacity, block, device=device)
    expert_ids = torch.searchsorted(padded_end, block_starts, right=True).clamp_(max=num_experts - 1)
    return sorted_ids, expert_ids.to(torch.int32), padded_end[-1:].to(torch.int32)


class HummingRunner:
    """W4A16 MoE through humming-kernels (see the module docstring)."""

    def __init__(self, spec: RunnerSpec, w13: Any, w2: Any, tuning: dict[str, list], gate_up: str):
        self.spec = spec
        self._w13, self._w2 = w13, w2
        self._tuning = tuning
        self._tuning_json = {name: json.dumps(rows) for name, rows in tuning.items()}
        self._compute = json.dumps({"use_batch_invariant": False, "use_f16_accum": False, "gemm_type": "indexed"})
        self._gate_up = gate_up
        self._swiglu = (spec.swiglu.get("swiglu_alpha", 1.702), spec.swiglu.get("swiglu_beta", 1.0),
                        spec.swiglu.get("swiglu_limit", 7.0))

    @classmethod
    def prepare(cls, spec: RunnerSpec, weights: MoEWeights) -> HummingRunner:
        from backends.emulation import GATED_ACTIVATIONS

        if not isinstance(weights, MoEWeights):
            raise spec.unavailable(f"Humming converts the checkpoint itself, but the rules give it a "
                                   f"{type(weights).__name__}", "set `converter: null` for this backend")
        if spec.activation not in GATED_ACTIVATIONS:
            raise spec.unavailable(f"activation {spec.activation!r} is not gated", f"use one of {GATED_ACTIVATIONS}")
        layer_module = require_module(spec, "humming.layer", HOW_TO_GET)
        tune = require_module(spec, "humming.tune", HOW_TO_GET)
        if spec.device.type != "cuda":
            raise spec.unavailable(f"humming-kernels runs on CUDA GPUs only, the layer is on {spec.device}",
                                   "build the layer with device='cuda', or force moe_backend='emulation'")
        capability = torch.cuda.get_device_capability(spec.device)
        if capability < (7, 5):
            raise spec.unavailable(f"humming-kernels needs compute capability 7.5+, this GPU has "
                                   f"{capability[0]}.{capability[1]}", "run on a newer GPU")
        config = ({"quant_method": "mxfp4"} if weights.format == "mxfp4"
                  else {"quant_method": "modelopt", "quant_algo": "NVFP4"})
        experts, hidden, inter = weights.E, weights.H, weights.I
        with torch.cuda.device(spec.device):
            gemms = {}
            for name, n, k, weight, scale, bias, global_scale in (
                    ("w13", 2 * inter, hidden, weights.w13, weights.w13_scale, weights.w13_bias,
                     weights.w13_global_scale),
                    ("w2", hidden, inter, weights.w2, weights.w2_scale, weights.w2_bias, weights.w2_global_scale)):
                layer = layer_module.HummingLayer(
                    shape_n=n, shape_k=k, weight_config=dict(config), num_experts=experts, has_bias=bias is not None,
                    pad_n_to_multiple=PAD_N, pad_k_to_multiple=PAD_K, torch_dtype=torch.bfloat16).to(spec.device)
                tensors = {"weight": weight, "weight_scale": scale}
                if bias is not None:
                    tensors["bias"] = bias.to(torch.bfloat16)
                if global_scale is not None:
                    tensors["weight_scale_2"] = 1.0 / global_scale
                shapes = {key: value.shape for key, value in layer.state_dict().items()}
                try:
                    layer.load_from_tensors({key: t.reshape(shapes[key]) for key, t in tensors.items()})
                    layer.transform()
                except (AssertionError, ValueError, RuntimeError, KeyError) as exc:
                    raise spec.unavailable(f"humming-kernels refused the {name} GEMM (N={n}, K={k}, E={experts}, "
                                           f"{weights.format}): {type(exc).__name__}: {exc}",
                                           "force another backend with moe_backend=") from exc
                gemms[name] = layer
            tuning = {name: tune.get_heuristics_config(layer_config=layer.humming_config, gemm_type="indexed",
                                                       device=spec.device) for name, layer in gemms.items()}
        return cls(spec, gemms["w13"], gemms["w2"], tuning, weights.gate_up)

    def _block_size(self, pairs: int) -> int:
        """vLLM's choice: the block_shape M of the w13 tuning row whose (min, max] holds the pair count."""
        for low, high, config in self._tuning["w13"]:
            if low < pairs <= high:
                return int(config["block_shape"][0])
        return DEFAULT_BLOCK

    def apply(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        spec = self.spec
        tokens = x.shape[0]
        ids, weights = _route(routing.router_logits, routing.topk_ids, routing.topk_weights, spec.top_k,
                              spec.renormalize, tokens, spec.num_experts, x.device)
        k = ids.shape[1]
        pairs = tokens * k
        sorted_ids, expert_ids, padded = align_indexed(ids, spec.num_experts, self._block_size(pairs))
        common = dict(sorted_ids=sorted_ids, expert_ids=expert_ids, num_tokens_padded=padded, valid_shape_m=pairs,
                      compute_config=self._compute)
        x16 = x.to(torch.bfloat16)
        gate_up = self._w13(x16, outputs=x16.new_empty(pairs, 2 * spec.padded_intermediate_size), top_k=k,
                            tuning_config=self._tuning_json["w13"], **common)
        hidden = _activate(gate_up.float(), spec.activation, self._gate_up, *self._swiglu).to(torch.bfloat16)
        down = self._w2(hidden, outputs=x16.new_empty(pairs, spec.padded_hidden_size), top_k=1,
                        tuning_config=self._tuning_json["w2"], **common)
        y = (down.view(tokens, k, -1).float() * weights.unsqueeze(-1)).sum(dim=1)
        return y.to(x.dtype)
