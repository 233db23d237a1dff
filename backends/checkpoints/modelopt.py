"""NVIDIA ModelOpt NVFP4: per-expert projections as the ModelOpt releases store them (nvidia/DeepSeek-R1-FP4,
nvidia/DeepSeek-V3-0324-FP4, nvidia/Qwen3-30B-A3B-FP4, nvidia/Kimi-K2-Thinking-NVFP4, ...).

Per expert e of layer N, under ``model.layers.N.mlp.experts.e.`` and for each of ``gate_proj`` (w1),
``up_proj`` (w3) and ``down_proj`` (w2), with rows x K = [I, H] for gate/up and [H, I] for down:

=====================  =======  ===========  ==================================================================
key                    dtype    shape        meaning
=====================  =======  ===========  ==================================================================
``weight``             U8       [rows, K/2]  E2M1 pairs, element 2j in the low nibble
``weight_scale``       F8_E4M3  [rows, K/16] block scale per 16 elements (linear, not swizzled)
``weight_scale_2``     F32      [] or [1]    per-tensor *dequantization* multiplier (value = fp4 * s * s2)
``input_scale``        F32      [] or [1]    static activation scale (W4A4 kernels only; optional here)
=====================  =======  ===========  ==================================================================

The quant config is ``config.json``'s ``quantization_config`` ({"quant_method": "modelopt", "quant_algo":
"NVFP4", "group_size": 16}) or the older ``hf_quant_config.json`` ({"quantization": {"quant_algo": "NVFP4"}}).
Sources: vLLM ``vllm/model_executor/layers/quantization/modelopt.py`` (``ModelOptNvFp4FusedMoE.create_weights``:
w13_weight [E, 2I, H/2] uint8, w13_weight_scale [E, 2I, H/16] float8_e4m3fn, w13_weight_scale_2 [E, 2] and
w13_input_scale [E, 2] (w1, w3), w2_* [E]; ``process_weights_after_loading`` warns "w1_weight_scale_2 must
match w3_weight_scale_2" and keeps column 0) and ``FusedMoE.make_expert_params_mapping("gate_proj",
"down_proj", "up_proj")`` (w1 rows first, then w3).

w1 and w3 global scales that differ (``w13_scales``):

* ``"refuse"`` (default): `CheckpointError` naming the layer and expert; the kernels take one global scale per
  expert and vLLM's silent choice of w1's mis-scales every w3 weight by s2_w3 / s2_w1.
* ``"requantize"``: both halves move to the per-expert max of the two ``weight_scale_2``; the E2M1 codes are
  kept and only the E4M3 block scales of the half with the smaller s2 are multiplied by s2_half / s2_max (<= 1,
  so nothing overflows). Exact when that ratio is a power of two and the block scales stay normal; otherwise
  each rescaled block scale is rounded once to E4M3 (relative error <= 2^-4 per block).
"""

from __future__ import annotations

import torch

from backends.checkpoints.store import Checkpoint, CheckpointError
from backends.weights import MoEWeights

LAYOUT = "modelopt-nvfp4"
W13_SCALE_POLICIES = ("refuse", "requantize")
_BLOCK = 16
_PROJ = ("gate_proj", "up_proj", "down_proj")
_SCALAR = ((), (1,))


def expected(h: int, i: int) -> dict[str, tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]]:
    """key suffix after ``experts.<e>.`` -> (dtypes, shape or shapes) of one expert."""
    specs: dict[str, tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]] = {}
    for proj in _PROJ:
        rows, k = (h, i) if proj == "down_proj" else (i, h)
        specs[f"{proj}.weight"] = (("U8",), ((rows, k // 2),))
        specs[f"{proj}.weight_scale"] = (("F8_E4M3",), ((rows, k // _BLOCK),))
        specs[f"{proj}.weight_scale_2"] = (("F32",), _SCALAR)
    return specs


def load(ckpt: Checkpoint, prefix: str, sizes: tuple[int, int, int], experts: list[int] | None, inter: slice, *,
         w13_scales: str = "refuse", layer: int = -1) -> MoEWeights:
    """Read one layer (all experts or `experts`, intermediate slice `inter`) into a contiguous NVFP4 MoEWeights."""
    if w13_scales not in W13_SCALE_POLICIES:
        raise ValueError(f"w13_scales={w13_scales!r} must be one of {W13_SCALE_POLICIES}")
    e, h, i = sizes
    ids = list(range(e)) if experts is None else experts
    specs = expected(h, i)
    what = f"ModelOpt NVFP4 expert layout, H={h} I={i}"
    with_input = prefix + f"{ids[0]}.gate_proj.input_scale" in ckpt.weight_map
    for x in ids:  # every header checked before any data is read
        for suffix, (dtypes, shapes) in specs.items():
            ckpt.require(f"{prefix}{x}.{suffix}", dtypes, shapes, what)
        if with_input:
            for proj in _PROJ:
                ckpt.require(f"{prefix}{x}.{proj}.input_scale", ("F32",), _SCALAR, what)
    rows, k_cols = slice(inter.start, inter.stop), slice(inter.start // 2, inter.stop // 2)
    s_cols = slice(inter.start // _BLOCK, inter.stop // _BLOCK)

    def per_expert(proj: str, name: str, index: tuple = ()) -> torch.Tensor:
        return torch.stack([ckpt.read(f"{prefix}{x}.{proj}.{name}", list(index)) for x in ids])

    def scalar(proj: str, name: str) -> torch.Tensor:
        return per_expert(proj, name).reshape(len(ids)).float()

    gate, up = per_expert("gate_proj", "weight", (rows,)), per_expert("up_proj", "weight", (rows,))
    gate_s, up_s = per_expert("gate_proj", "weight_scale", (rows,)), per_expert("up_proj", "weight_scale", (rows,))
    down = per_expert("down_proj", "weight", (slice(None), k_cols))
    down_s = per_expert("down_proj", "weight_scale", (slice(None), s_cols))
    s2_gate, s2_up, s2_down = (scalar(p, "weight_scale_2") for p in _PROJ)
    differ = (s2_gate != s2_up).nonzero()
    if len(differ):
        first = int(differ[0, 0])
        if w13_scales == "refuse":
            raise CheckpointError(
                f"layer {layer} expert {ids[first]}: gate_proj.weight_scale_2={float(s2_gate[first])} differs from "
                f"up_proj.weight_scale_2={float(s2_up[first])} ({len(differ)} of {len(ids)} experts differ); the "
                f"kernels take one global scale per expert (vLLM would silently dequantize up_proj with gate_proj's "
                f"scale). Pass w13_scales='requantize' to rescale the block scales onto the larger of the two")
        shared = torch.maximum(s2_gate, s2_up)
        gate_s = _rescaled(gate_s, s2_gate / shared)
        up_s = _rescaled(up_s, s2_up / shared)
        s2_gate = shared
    input_scales = {}
    if with_input:
        input_scales = {"w13_input_scale": torch.stack([scalar("gate_proj", "input_scale"),
                                                        scalar("up_proj", "input_scale")], dim=1),
                        "w2_input_scale": scalar("down_proj", "input_scale")}
    return MoEWeights(format="nvfp4", gate_up="contiguous", w13=torch.cat([gate, up], dim=1),
                      w13_scale=torch.cat([gate_s, up_s], dim=1), w2=down, w2_scale=down_s,
                      w13_global_scale=(1.0 / s2_gate).contiguous(), w2_global_scale=(1.0 / s2_down).contiguous(),
                      **input_scales)


def _rescaled(scales: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """E4M3 block scales [E, rows, K/16] times a per-expert ratio <= 1, rounded once to E4M3."""
    if bool((ratio == 1).all()):
        return scales
    return (scales.float() * ratio.view(-1, 1, 1)).to(torch.float8_e4m3fn)


def released_tensors(weights: MoEWeights, prefix: str, *, input_scale: float | None = None) -> dict:
    """Per-expert tensors as released (the inverse of `load`); `input_scale` fills absent input scales."""
    if weights.format != "nvfp4" or weights.gate_up != "contiguous":
        raise ValueError(f"ModelOpt layout holds contiguous nvfp4 experts, got {weights.format} {weights.gate_up}")
    assert weights.w13_global_scale is not None and weights.w2_global_scale is not None
    i = weights.I
    out: dict[str, torch.Tensor] = {}
    for x in range(weights.E):
        parts = {"gate_proj": (weights.w13[x, :i], weights.w13_scale[x, :i], weights.w13_global_scale[x], 0),
                 "up_proj": (weights.w13[x, i:], weights.w13_scale[x, i:], weights.w13_global_scale[x], 1),
                 "down_proj": (weights.w2[x], weights.w2_scale[x], weights.w2_global_scale[x], None)}
        for proj, (w, s, gs, col) in parts.items():
            key = f"{prefix}{x}.{proj}."
            out[key + "weight"] = w.clone()
            out[key + "weight_scale"] = s.clone()
            out[key + "weight_scale_2"] = (1.0 / gs.float()).reshape(())
            given = weights.w2_input_scale if col is None else weights.w13_input_scale
            if given is not None:
                out[key + "input_scale"] = (given[x] if col is None else given[x, col]).float().reshape(())
            elif input_scale is not None:
                out[key + "input_scale"] = torch.tensor(float(input_scale))
    return out
