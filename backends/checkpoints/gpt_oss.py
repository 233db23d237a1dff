"""gpt-oss MXFP4: the fused expert tensors as OpenAI released them (openai/gpt-oss-20b, -120b).

Per MoE layer N, under ``model.layers.N.mlp.experts.`` (E experts, hidden H, expert intermediate I):

=========================  =====  ====================  =============================================
key                        dtype  shape                 meaning
=========================  =====  ====================  =============================================
``gate_up_proj_blocks``    U8     [E, 2I, H/32, 16]     E2M1 pairs, element 2j in the low nibble
``gate_up_proj_scales``    U8     [E, 2I, H/32]         E8M0 exponent per 32 elements of a row
``gate_up_proj_bias``      BF16   [E, 2I]
``down_proj_blocks``       U8     [E, H, I/32, 16]
``down_proj_scales``       U8     [E, H, I/32]
``down_proj_bias``         BF16   [E, H]
=========================  =====  ====================  =============================================

Rows of gate_up are interleaved: row 2i is gate_i, row 2i+1 is up_i (the "interleaved" convention of
`MoEWeights`). Sources: vLLM ``vllm/model_executor/models/gpt_oss.py`` (``_load_weights_mxfp4``: views the blocks
as [E, 2I, -1] / [E, -1, I/2], slices a TP rank as rows ``2*start:2*end`` of gate_up and columns
``start/2:end/2`` (blocks) / ``start/32:end/32`` (scales) of down, and keeps ``down_proj_bias`` on rank 0 only);
transformers ``integrations/mxfp4.py`` (``_convert_moe_packed_tensors``: low nibble -> element 2j, high -> 2j+1,
scale ``2^(code-127)``, output transposed to the model's [E, H, 2I] parameter).
"""

from __future__ import annotations

import torch

from backends.checkpoints.store import Checkpoint
from backends.weights import MoEWeights

LAYOUT = "gpt-oss-mxfp4"
#: the key suffixes that identify the layout inside a layer's ``experts.`` prefix
MARKERS = ("gate_up_proj_blocks", "down_proj_blocks")
_BLOCK = 32
_BIAS_DTYPES = ("BF16", "F32")


def expected(e: int, h: int, i: int) -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
    """key suffix -> (accepted dtypes, shape) of one layer."""
    return {"gate_up_proj_blocks": (("U8",), (e, 2 * i, h // _BLOCK, 16)),
            "gate_up_proj_scales": (("U8",), (e, 2 * i, h // _BLOCK)),
            "gate_up_proj_bias": (_BIAS_DTYPES, (e, 2 * i)),
            "down_proj_blocks": (("U8",), (e, h, i // _BLOCK, 16)),
            "down_proj_scales": (("U8",), (e, h, i // _BLOCK)),
            "down_proj_bias": (_BIAS_DTYPES, (e, h))}


def load(ckpt: Checkpoint, prefix: str, sizes: tuple[int, int, int], experts: list[int] | None,
         inter: slice) -> MoEWeights:
    """Read one layer (all experts or `experts`, intermediate rows `inter`) into an interleaved MXFP4 MoEWeights."""
    e, h, i = sizes
    specs = expected(e, h, i)
    for suffix, (dtypes, shape) in specs.items():  # every header checked before any data is read
        ckpt.require(prefix + suffix, dtypes, [shape], f"gpt-oss MXFP4 layout, E={e} H={h} I={i}")
    ex: list = [experts] if experts is not None else [slice(None)]
    rows13 = slice(2 * inter.start, 2 * inter.stop)
    cols2 = slice(inter.start // _BLOCK, inter.stop // _BLOCK)
    n_e = e if experts is None else len(experts)
    i_local = inter.stop - inter.start
    w13 = ckpt.read(prefix + "gate_up_proj_blocks", [*ex, rows13]).reshape(n_e, 2 * i_local, h // 2)
    w13_scale = ckpt.read(prefix + "gate_up_proj_scales", [*ex, rows13])
    w13_bias = ckpt.read(prefix + "gate_up_proj_bias", [*ex, rows13]).float()
    w2 = ckpt.read(prefix + "down_proj_blocks", [*ex, slice(None), cols2]).reshape(n_e, h, i_local // 2)
    w2_scale = ckpt.read(prefix + "down_proj_scales", [*ex, slice(None), cols2])
    w2_bias = ckpt.read(prefix + "down_proj_bias", ex).float()
    if inter.start:  # vLLM adds the down bias on TP rank 0 only: the ranks' partial sums add it once
        w2_bias = torch.zeros_like(w2_bias)
    return MoEWeights(format="mxfp4", gate_up="interleaved", w13=w13.contiguous(), w13_scale=w13_scale.contiguous(),
                      w2=w2.contiguous(), w2_scale=w2_scale.contiguous(), w13_bias=w13_bias, w2_bias=w2_bias)


def released_tensors(weights: MoEWeights, prefix: str, *, bias_dtype: torch.dtype = torch.bfloat16) -> dict:
    """The layer's tensors as released (the inverse of `load`); biases stored as `bias_dtype` (bf16 as released)."""
    if weights.format != "mxfp4" or weights.gate_up != "interleaved":
        raise ValueError(f"gpt-oss layout holds interleaved mxfp4 experts, got {weights.format} {weights.gate_up}")
    e, h, i = weights.E, weights.H, weights.I
    zeros = torch.zeros
    b13 = weights.w13_bias if weights.w13_bias is not None else zeros(e, 2 * i)
    b2 = weights.w2_bias if weights.w2_bias is not None else zeros(e, h)
    return {prefix + "gate_up_proj_blocks": weights.w13.reshape(e, 2 * i, h // _BLOCK, 16),
            prefix + "gate_up_proj_scales": weights.w13_scale,
            prefix + "gate_up_proj_bias": b13.to(bias_dtype),
            prefix + "down_proj_blocks": weights.w2.reshape(e, h, i // _BLOCK, 16),
            prefix + "down_proj_scales": weights.w2_scale,
            prefix + "down_proj_bias": b2.to(bias_dtype)}
