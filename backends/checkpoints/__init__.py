"""Checkpoint directories in the layouts models were released in -> one MoE layer's weights.

    load_moe_weights(path, layer=N, experts=None, tp_slice=None, w13_scales="refuse")
        -> MoEWeights        (gpt-oss MXFP4, ModelOpt NVFP4)
        -> QuarkMoEWeights   (AMD Quark OCP-MX: .layer(...) runs it, .moe_weights() for w_mxfp4)

Reads are lazy: the index (``model.safetensors.index.json``) says which shard holds each key, only the shards
holding the layer's expert tensors are opened, every header is checked (dtype, shape) before any data is read,
and only the asked experts / intermediate slice are read (safetensors slices of memory-mapped files).

A rank's subset (for expert or tensor parallelism):

* ``experts=[ids]``: only those experts, in that order (E of the result = len(ids));
* ``tp_slice=(start, stop)`` (or a ``slice``): only intermediate columns [start, stop) of every expert: gate and
  up rows start..stop, down columns start..stop. Bounds must be multiples of the format's block size (32 MX,
  16 NVFP4). A down-projection bias (gpt-oss) is kept only by the slice that starts at 0 and zero elsewhere, as
  vLLM does, so that the ranks' partial outputs sum to the layer's output.

The layout is recognised from the layer's key names (see `LAYOUTS`) and must agree with ``config.json``'s
``quantization_config`` (``quant_method`` mxfp4 / modelopt / quark); anything else is one `CheckpointError`.
The writers (`released_tensors` of each layout module, `write_checkpoint`) make checkpoints in the same
layouts, for tests and examples.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from backends.checkpoints import gpt_oss, modelopt, quark
from backends.checkpoints.quark import QuarkMoEWeights
from backends.checkpoints.store import Checkpoint, CheckpointError, write_checkpoint
from backends.weights import MoEWeights

__all__ = ["LAYOUTS", "Checkpoint", "CheckpointError", "QuarkMoEWeights", "detect_layout", "expert_prefix",
           "load_moe_weights", "moe_layers", "write_checkpoint"]

#: layout name -> what it is (the names the errors use)
LAYOUTS = {gpt_oss.LAYOUT: "gpt-oss MXFP4 (fused *_blocks/*_scales/*_bias, interleaved gate/up)",
           modelopt.LAYOUT: "NVIDIA ModelOpt NVFP4 (per-expert weight/weight_scale/weight_scale_2/input_scale)",
           quark.LAYOUT: "AMD Quark OCP-MX (per-expert weight/weight_scale, MXFP4 or MXFP6)"}
#: config.json quantization_config.quant_method -> the layout it announces
_QUANT_METHODS = {"mxfp4": gpt_oss.LAYOUT, "modelopt": modelopt.LAYOUT, "quark": quark.LAYOUT}
_BLOCK = {gpt_oss.LAYOUT: 32, modelopt.LAYOUT: 16, quark.LAYOUT: 32}

_EXPERT_KEY = re.compile(r"^(?P<prefix>(?:.*\.)?layers\.(?P<layer>\d+)\.(?:mlp|feed_forward|block_sparse_moe)"
                         r"\.experts\.)(?P<rest>.+)$")
_PER_EXPERT = re.compile(r"^(?P<expert>\d+)\.(?:gate_proj|up_proj|down_proj)\.(?P<name>\w+)$")


def _expert_keys(ckpt: Checkpoint) -> dict[int, tuple[str, list[str]]]:
    """layer -> (experts prefix, key rests) for every layer with expert tensors."""
    layers: dict[int, tuple[str, list[str]]] = {}
    for key in ckpt.keys():
        match = _EXPERT_KEY.match(key)
        if match:
            prefix, rests = layers.setdefault(int(match["layer"]), (match["prefix"], []))
            if match["prefix"] == prefix:
                rests.append(match["rest"])
    return layers


def moe_layers(path: str | os.PathLike) -> list[int]:
    """The layer indices of a checkpoint that hold experts."""
    return sorted(_expert_keys(Checkpoint(path)))


def expert_prefix(path: str | os.PathLike, layer: int) -> str:
    """The key prefix of a layer's experts (``model.layers.N.mlp.experts.``)."""
    ckpt = Checkpoint(path)
    return _layer_keys(ckpt, layer)[0]


def _layer_keys(ckpt: Checkpoint, layer: int) -> tuple[str, list[str]]:
    layers = _expert_keys(ckpt)
    if layer in layers:
        return layers[layer]
    with_experts = ", ".join(map(str, sorted(layers))) or "none"
    own = sorted(k for k in ckpt.keys() if re.search(rf"(^|\.)layers\.{layer}\.", k))
    if own:
        mlp = [k for k in own if ".mlp." in k or ".feed_forward." in k] or own
        raise CheckpointError(f"{ckpt.path}: layer {layer} has no experts (its MLP tensors: {', '.join(mlp[:4])}"
                              f"{', ...' if len(mlp) > 4 else ''}); layers with experts: {with_experts}")
    raise CheckpointError(f"{ckpt.path}: no layer {layer} in the checkpoint; layers with experts: {with_experts}")


def _classify(ckpt: Checkpoint, prefix: str, rests: Sequence[str]) -> dict[str, list[str]]:
    """layout (or a description of an unsupported one) -> example keys of the layer in it."""
    found: dict[str, list[str]] = {}
    per_expert: dict[str, set[str]] = {}
    for rest in rests:
        match = _PER_EXPERT.match(rest)
        if match:
            per_expert.setdefault(match["expert"], set()).add(match["name"])
        elif rest.endswith(("_blocks", "_scales")) or rest in ("gate_up_proj_bias", "down_proj_bias"):
            found.setdefault(gpt_oss.LAYOUT, []).append(prefix + rest)
        else:
            found.setdefault("unquantized or unknown", []).append(prefix + rest)
    for expert, names in sorted(per_expert.items(), key=lambda item: int(item[0])):
        scale_key = f"{prefix}{expert}.gate_proj.weight_scale"
        if "weight_scale_2" in names:
            layout = modelopt.LAYOUT
        elif "weight_scale" in names:  # the scale dtype tells NVFP4 (E4M3) from OCP-MX (E8M0 as U8)
            dtype = ckpt.spec(scale_key)[0] if scale_key in ckpt.weight_map else "U8"
            layout = {"U8": quark.LAYOUT, "F8_E4M3": modelopt.LAYOUT}.get(dtype, f"scaled by {dtype} weight_scale")
        elif "weight_scale_inv" in names:
            layout = "FP8 block-scaled (weight_scale_inv)"
        else:
            layout = "unquantized or unknown"
        found.setdefault(layout, []).append(f"{prefix}{expert}.*")
    return found


def detect_layout(path: str | os.PathLike, layer: int) -> str:
    """The layout name (a key of `LAYOUTS`) of a layer's experts; CheckpointError if none or mixed."""
    ckpt = Checkpoint(path)
    prefix, rests = _layer_keys(ckpt, layer)
    return _layout(ckpt, layer, prefix, rests)


def _layout(ckpt: Checkpoint, layer: int, prefix: str, rests: Sequence[str]) -> str:
    found = _classify(ckpt, prefix, rests)
    if len(found) > 1:
        parts = "; ".join(f"{name}: {', '.join(keys[:2])}{', ...' if len(keys) > 2 else ''}"
                          for name, keys in found.items())
        raise CheckpointError(f"{ckpt.path}: layer {layer} mixes expert formats ({parts}); one layer's experts "
                              f"must all be in one layout: re-export the checkpoint")
    (layout, keys), = found.items()
    if layout not in LAYOUTS:
        raise CheckpointError(f"{ckpt.path}: layer {layer}'s experts ({keys[0]}, ...) are {layout}; the loaders "
                              f"read {', '.join(f'{k} = {v}' for k, v in LAYOUTS.items())}")
    qc = ckpt.config.get("quantization_config")
    if isinstance(qc, dict) and "quant_method" in qc:
        announced = _QUANT_METHODS.get(str(qc["quant_method"]).lower())
        if announced != layout:
            raise CheckpointError(f"{ckpt.directory / 'config.json'}: quantization_config.quant_method="
                                  f"{qc['quant_method']!r} announces {announced or 'a layout not read here'}, but "
                                  f"layer {layer}'s experts are stored as {layout} ({keys[0]}); a mixed-format "
                                  f"checkpoint: fix config.json or re-export the weights")
    elif layout == quark.LAYOUT:
        raise CheckpointError(f"{ckpt.directory / 'config.json'}: Quark OCP-MX experts need the Quark "
                              f"quantization_config (quant_method 'quark') to say their scheme; none found")
    return layout


def _sizes(ckpt: Checkpoint, layout: str, prefix: str) -> tuple[int, int, int]:
    """(E, H, I) from config.json, falling back on the tensors' headers where the config is silent."""
    cfg = ckpt.config
    e = next((cfg[k] for k in ("num_local_experts", "num_experts", "n_routed_experts") if k in cfg), None)
    h = cfg.get("hidden_size")
    i = next((cfg[k] for k in ("moe_intermediate_size", "intermediate_size") if k in cfg), None)
    if None not in (e, h, i):
        return int(e), int(h), int(i)  # type: ignore[arg-type]
    if layout == gpt_oss.LAYOUT:
        _, (e2, rows, groups, _) = ckpt.spec(prefix + "gate_up_proj_blocks")
        return e2, groups * 32, rows // 2
    experts = {int(m["expert"]) for k in ckpt.keys() if k.startswith(prefix)
               for m in [_PER_EXPERT.match(k[len(prefix):])] if m}
    block = _BLOCK[layout]
    _, (rows, h_blocks) = ckpt.spec(prefix + "0.gate_proj.weight_scale")
    return len(experts), h_blocks * block, rows


def _check_subset(layout: str, sizes: tuple[int, int, int], experts, tp_slice) -> tuple[list[int] | None, slice]:
    e, _, i = sizes
    if experts is not None:
        ids = list(experts)
        if not ids or any(not isinstance(x, int) or isinstance(x, bool) or not 0 <= x < e for x in ids) \
                or len(set(ids)) != len(ids):
            raise ValueError(f"experts={experts!r} must be distinct int expert ids in [0, {e}) (the layer has {e} "
                             f"experts), at least one")
        experts = ids
    block = _BLOCK[layout]
    if tp_slice is None:
        return experts, slice(0, i)
    start, stop = (tp_slice.start, tp_slice.stop) if isinstance(tp_slice, slice) else tuple(tp_slice)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, stop)) or not 0 <= start < stop <= i \
            or start % block or stop % block:
        raise ValueError(f"tp_slice={tp_slice!r} must be (start, stop) with 0 <= start < stop <= I={i}, both "
                         f"multiples of {block} (the {layout} block size along I)")
    return experts, slice(start, stop)


def load_moe_weights(path: str | os.PathLike | Checkpoint, layer: int, *, experts: Sequence[int] | None = None,
                     tp_slice: slice | tuple[int, int] | None = None,
                     w13_scales: str = "refuse") -> MoEWeights | QuarkMoEWeights:
    """One MoE layer of a checkpoint directory: a `MoEWeights` (gpt-oss, ModelOpt) or `QuarkMoEWeights` (Quark).

    path: the checkpoint directory (or one .safetensors file, or an open `Checkpoint`, whose `reads` and `opened`
    then show what was read); layer: the decoder layer index.
    experts / tp_slice: the subset a rank holds (see the module docstring); w13_scales: ModelOpt checkpoints whose
    w1 and w3 global scales differ, ``"refuse"`` (default) or ``"requantize"`` (see `backends.checkpoints.modelopt`).
    """
    if not isinstance(layer, int) or isinstance(layer, bool) or layer < 0:
        raise ValueError(f"layer={layer!r} must be a non-negative int (the decoder layer index)")
    ckpt = path if isinstance(path, Checkpoint) else Checkpoint(path)
    try:
        prefix, rests = _layer_keys(ckpt, layer)
        layout = _layout(ckpt, layer, prefix, rests)
        sizes = _sizes(ckpt, layout, prefix)
        ids, inter = _check_subset(layout, sizes, experts, tp_slice)
        if layout == gpt_oss.LAYOUT:
            return gpt_oss.load(ckpt, prefix, sizes, ids, inter)
        if layout == modelopt.LAYOUT:
            return modelopt.load(ckpt, prefix, sizes, ids, inter, w13_scales=w13_scales, layer=layer)
        return quark.load(ckpt, prefix, sizes, ids, inter)
    finally:
        ckpt.close()
