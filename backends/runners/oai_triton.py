"""TRITON as a runner: OpenAI triton_kernels' ``matmul_ogs`` with the gpt-oss SwiGLU fused, as vLLM's TRITON backend.

    prepare   the rules' converter (`backends.layouts.oai_triton`) wrote K-major views of the weights and scales,
              w13 rows in gpt-oss order; here triton_kernels' ``convert_layout`` applies the platform's default MX
              layouts (``HopperMXValueLayout`` / ``HopperMXScaleLayout`` on SM90, as vLLM's ``_swizzle_mxfp4``),
              once, and builds the two ``PrecisionConfig``s and the fused activation.
    apply     routing as the emulation routes, packed into the bitmatrix of a ``tensor.SparseMatrix`` as vLLM's
              ``make_routing_data`` does; ragged metadata; GEMM1 gathers the token rows, adds the bias and applies
              ``swiglu_fn(alpha, limit)``; GEMM2 scatters back and weighs by the router weights.

triton_kernels API of triton 3.6 (``triton_kernels.topk`` and ``tensor.SparseMatrix``, no ``routing`` module). It
is not on the package index: vLLM and SGLang ship a copy; without one `prepare` says how to get it.
Only ``swigluoai`` with beta 1 (``swiglu_fn`` computes gate * sigmoid(alpha * gate) * (up + 1)).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from backends.emulation import _route
from backends.runners.base import Routing, RunnerSpec, require_layout, require_module
from backends.weights import KernelWeights

__all__ = ["HOW_TO_GET", "OaiTritonRunner"]

HOW_TO_GET = ("triton_kernels is not on PyPI: put the `triton_kernels/` directory of an SGLang `sglang-kernel` "
              "0.4.3-0.4.6 wheel (or of triton's python/triton_kernels at tag v3.6.0) on PYTHONPATH, with triton 3.6")


def pack_bitmatrix(topk_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """[T, ceil(E/32)] uint32: bit e % 32 of word e // 32 set where a token routes to expert e (vLLM's pack_bitmatrix,
    in torch ops without a host sync)."""
    tokens = topk_ids.shape[0]
    words = -(-num_experts // 32)
    hot = torch.zeros(tokens, words * 32, dtype=torch.int64, device=topk_ids.device)
    hot.scatter_(1, topk_ids.long(), 1)
    bits = (hot.view(tokens, words, 32) << torch.arange(32, device=topk_ids.device)).sum(dim=-1)  # < 2**32
    low = bits.view(torch.int32).view(tokens, words, 2)[..., 0 if _LITTLE_ENDIAN else 1]
    return low.contiguous().view(torch.uint32)


_LITTLE_ENDIAN = sys.byteorder == "little"


class OaiTritonRunner:
    """W4A16 MXFP4 MoE through triton_kernels.matmul_ogs (see the module docstring)."""

    def __init__(self, spec: RunnerSpec, modules: dict[str, Any], w: dict[str, Any], act: Any):
        self.spec = spec
        self._words = -(-spec.num_experts // 32)
        self._m = modules
        self._w = w
        self._act = act

    @classmethod
    def prepare(cls, spec: RunnerSpec, weights: KernelWeights) -> OaiTritonRunner:
        from backends.layouts.oai_triton import OaiTritonLayout

        require_layout(spec, weights, OaiTritonLayout.layout, reader="matmul_ogs reads",
                       converter="backends.layouts.oai_triton:mxfp4")
        if spec.activation != "swigluoai":
            raise spec.unavailable(f"triton_kernels fuses only the gpt-oss SwiGLU (swigluoai), not "
                                   f"{spec.activation!r}", "force moe_backend='humming' or another backend")
        if spec.swiglu.get("swiglu_beta", 1.0) != 1.0:
            raise spec.unavailable(f"swiglu_fn adds 1 to the up projection, but swiglu_beta="
                                   f"{spec.swiglu['swiglu_beta']}", "pass swiglu_beta=1.0 or force another backend")
        names = ("triton_kernels.matmul_ogs", "triton_kernels.tensor", "triton_kernels.tensor_details.layout",
                 "triton_kernels.numerics", "triton_kernels.swiglu")
        m = {name.rsplit(".", 1)[-1]: require_module(spec, name, HOW_TO_GET) for name in names}
        ogs, tensor, layout, numerics = m["matmul_ogs"], m["tensor"], m["layout"], m["numerics"]
        if not hasattr(tensor, "SparseMatrix") or "reduction_n" not in getattr(ogs.FnSpecs, "__dataclass_fields__",
                                                                                  {}):
            raise spec.unavailable("the importable triton_kernels predates the triton 3.6 API (no "
                                   "tensor.SparseMatrix / FnSpecs.reduction_n)", HOW_TO_GET)
        if spec.device.type != "cuda":
            raise spec.unavailable(f"triton_kernels' matmul_ogs runs on GPUs, the layer is on {spec.device}",
                                   "build the layer with device='cuda', or force moe_backend='emulation'")
        with torch.cuda.device(spec.device):
            value_layout, value_opts = layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
            scale_layout, scale_opts = layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=8)
            w: dict[str, Any] = {}
            for gemm in ("w13", "w2"):
                value = tensor.convert_layout(tensor.wrap_torch_tensor(weights[gemm], dtype=tensor.FP4),
                                              value_layout, **value_opts)
                scale = tensor.convert_layout(tensor.wrap_torch_tensor(weights[f"{gemm}_scale"]),
                                              scale_layout, **scale_opts)
                w[gemm] = value
                w[f"{gemm}_pc"] = ogs.PrecisionConfig(weight_scale=scale,
                                                      flex_ctx=ogs.FlexCtx(rhs_data=numerics.InFlexData()))
                bias = weights.tensors.get(f"{gemm}_bias")
                w[f"{gemm}_bias"] = None if bias is None else bias.float().contiguous()
        alpha = float(weights.config.get("swiglu_alpha", spec.swiglu.get("swiglu_alpha", 1.702)))
        limit = float(weights.config.get("swiglu_limit", spec.swiglu.get("swiglu_limit", 7.0)))
        act = ogs.FusedActivation(ogs.FnSpecs("swiglu", m["swiglu"].swiglu_fn, ("alpha", "limit"), reduction_n=2),
                                  (alpha, limit))
        return cls(spec, m, w, act)

    def apply(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        spec, m, w = self.spec, self._m, self._w
        ogs, tensor = m["matmul_ogs"], m["tensor"]
        tokens = x.shape[0]
        ids, weights = _route(routing.router_logits, routing.topk_ids, routing.topk_weights, spec.top_k,
                              spec.renormalize, tokens, spec.num_experts, x.device)
        k = ids.shape[1]
        # vLLM's make_routing_data: the top-k ids packed into a [T, ceil(E/32)] bitmatrix, then the sparse matrix
        sparse = tensor.SparseMatrix(indx=ids.to(torch.int16), vals=weights.to(torch.bfloat16),
                                     mask=tensor.Bitmatrix(pack_bitmatrix(ids, spec.num_experts), dtype=tensor.BIT,
                                                           shape=[tokens, self._words * 32], shape_max=[tokens, None]))
        dispatch, combine = sparse.mask_metadata.row_sorted_indx, sparse.mask_metadata.col_sorted_indx
        # the bitmatrix has ceil(E/32)*32 columns: the histogram of the E experts only
        ragged = tensor.make_ragged_tensor_metadata(sparse.mask_metadata.col_sum[:spec.num_experts], dispatch.shape[0])
        route = ogs.RoutingData(sparse.vals.flatten()[combine], ragged.slice_sizes, spec.num_experts, k, ragged)
        x16 = x.to(torch.bfloat16)
        hidden = ogs.matmul_ogs(x16, w["w13"], w["w13_bias"], route, gather_indx=ogs.GatherIndx(combine, dispatch),
                                precision_config=w["w13_pc"], fused_activation=self._act)
        y = ogs.matmul_ogs(hidden, w["w2"], w["w2_bias"], route, scatter_indx=ogs.ScatterIndx(dispatch, combine),
                           precision_config=w["w2_pc"], gammas=route.gate_scal)
        if y.shape[0] == tokens * k:  # a release that leaves the k rows of a token unsummed
            y = y.view(tokens, k, -1).sum(dim=1)
        return y.to(x.dtype)
