"""TRITON and TRITON_UNFUSED (OpenAI ``triton_kernels.matmul_ogs``): the torch side of vLLM 0.20.0's layout.

vLLM's ``_swizzle_mxfp4`` (gpt-oss path) hands ``matmul_ogs`` each weight and scale tensor transposed to
K-major, ``w.transpose(-2, -1)`` -- a strided view, [E, K/2, N] and [E, K/32, N] -- wrapped as a
triton_kernels FP4 tensor, then lets ``triton_kernels.tensor.convert_layout`` apply the platform's
default MX value/scale layouts (``HopperMXValueLayout`` / ``HopperMXScaleLayout`` on SM90, strided on
ROCm before gfx950, ...). Those swizzles are defined by the triton_kernels release the runner imports,
so this converter stops before them: it writes the K-major views, w13 rows in gpt-oss order
(``swiglu_fn`` reads gate = even, up = odd columns; a ``[w1; w3]`` checkpoint is interleaved here)
and fp32 biases, and the runner calls ``convert_layout`` with its own triton_kernels. Config: the scalar
``swiglu_alpha`` and ``swiglu_limit`` that ``FusedActivation`` takes, from the per-expert values
`convert(..., quant_config=...)` passes (the rules' gemm1 constants; no beta).
Not replicated: the last-dimension ``shuffle_weight`` of vLLM's non-gpt-oss TRITON path.
Unpadded tensors are views of the checkpoint (no copy); nothing is modified.
"""

from __future__ import annotations

import torch

from backends.layouts.base import Layout, require_tensor
from backends.layouts.gate_up import invert_permutation, permute_rows, row_permutation
from backends.weights import KernelWeights, MoEWeights

__all__ = ["OaiTritonLayout", "mxfp4"]


class OaiTritonLayout(Layout):
    layout = "oai_triton_kmajor"
    formats = ("mxfp4",)

    def _to_kernel(self, w: MoEWeights, hidden: int, inter: int):
        w = w.pad(hidden, inter)
        if w.gate_up == "interleaved":
            w13, s13, b13 = w.w13, w.w13_scale, w.w13_bias
        else:
            perm = row_permutation("contiguous", "interleaved", w.I)
            w13, s13 = permute_rows(w.w13, perm), permute_rows(w.w13_scale, perm)
            b13 = None if w.w13_bias is None else permute_rows(w.w13_bias, perm)
        tensors = {"w13": w13.transpose(-2, -1), "w13_scale": s13.transpose(-2, -1),
                   "w2": w.w2.transpose(-2, -1), "w2_scale": w.w2_scale.transpose(-2, -1)}
        if b13 is not None:
            tensors["w13_bias"] = b13
        if w.w2_bias is not None:
            tensors["w2_bias"] = w.w2_bias
        return tensors, {}

    def _quant_values(self, quant_config):
        """FusedActivation takes scalar swiglu_alpha and swiglu_limit (one value for all experts)."""
        out = {k: v for k, v in quant_config.items() if k not in ("swiglu_alpha", "swiglu_beta", "swiglu_limit")}
        for name in ("swiglu_alpha", "swiglu_limit"):
            if name in quant_config:
                values = torch.as_tensor(quant_config[name]).reshape(-1)
                if values.numel() and not bool((values == values[0]).all()):
                    raise ValueError(f"layout {self.layout!r}: quant_config[{name!r}] differs across experts, but "
                                     f"FusedActivation takes one value; give the kind one gemm1 constant")
                if values.numel():
                    out[name] = float(values[0])
        return out

    def _from_kernel(self, kw: KernelWeights) -> MoEWeights:
        e, hidden, inter = kw.E, kw.padded_hidden_size, kw.padded_intermediate_size

        def rows_major(name, shape):
            return require_tensor(self.layout, kw, name, shape, torch.uint8).transpose(-2, -1)

        w13 = rows_major("w13", (e, hidden // 2, 2 * inter))
        s13 = rows_major("w13_scale", (e, hidden // 32, 2 * inter))
        b13 = kw.tensors.get("w13_bias")
        if kw.gate_up == "contiguous":
            inv = invert_permutation(row_permutation("contiguous", "interleaved", inter))
            w13, s13 = permute_rows(w13.contiguous(), inv), permute_rows(s13.contiguous(), inv)
            b13 = None if b13 is None else permute_rows(b13, inv)
        return self._rebuild(kw, w13=w13, w13_scale=s13, w13_bias=b13, w2_bias=kw.tensors.get("w2_bias"),
                             w2=rows_major("w2", (e, inter // 2, hidden)),
                             w2_scale=rows_major("w2_scale", (e, inter // 32, hidden)))


#: MXFP4 backends TRITON and TRITON_UNFUSED (the runner applies triton_kernels' convert_layout)
mxfp4 = OaiTritonLayout()
