"""AMD Quark OCP-MX: per-expert MXFP4 / MXFP6 projections with E8M0 block scales, quant config in config.json.

Per expert e of layer N, under ``model.layers.N.mlp.experts.e.`` and for ``gate_proj`` (w1), ``up_proj`` (w3),
``down_proj`` (w2), with rows x K = [I, H] for gate/up and [H, I] for down:

==================  =====  ==============================  =================================================
key                 dtype  shape                           meaning
==================  =====  ==============================  =================================================
``weight``          U8     [rows, K/2] (fp4),              E2M1 pairs (low nibble first), or four FP6 codes
                           [rows, 3K/4] (fp6_e3m2/e2m3)    in three bytes (`backends.formats.pack_fp6`)
``weight_scale``    U8     [rows, K/32]                    E8M0 exponent per 32 elements
``input_scale``     F32    [] or [1]                       static FP8 input scale (schemes ``*_a_fp8`` with
                                                           ``is_dynamic: false`` only)
==================  =====  ==============================  =================================================

``config.json``'s ``quantization_config`` is Quark's: ``{"quant_method": "quark", "global_quant_config":
{"weight": {"dtype": "fp4" | "fp6_e3m2" | "fp6_e2m3", "qscheme": "per_group", "group_size": 32,
"scale_format": "e8m0"}, "input_tensors": {...} | null}, "layer_quant_config": {pattern: config},
"exclude": [...]}``; the experts' config is the first ``layer_quant_config`` pattern (fnmatch) matching the
layer's expert names, else the global one. Sources: vLLM ``vllm/model_executor/layers/quantization/quark/
quark.py`` (``QuarkConfig._find_matched_config``, ``layer_quant_config`` by fnmatch, ``exclude``) and
``quark_moe.py`` (``QuarkOCP_MX_MoEMethod.create_weights``: w13_weight [E, 2I, H/2] uint8 (fp6: 3H/4),
w13_weight_scale [E, 2I, H/32] uint8, and per-expert [E] input scales for static FP8 inputs; checkpoint names
through ``FusedMoE.make_expert_params_mapping("gate_proj", "down_proj", "up_proj")``).

The result is a `QuarkMoEWeights`: the tensors under the names `backends.quark.QuarkOCPMXMoE.load_weights`
takes, plus the layer config; ``.layer(...)`` builds, loads and post-processes the Quark layer, and
``.moe_weights()`` gives a `MoEWeights` for ``w_mxfp4`` (W4A16) checkpoints.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from backends.checkpoints.store import Checkpoint, CheckpointError
from backends.weights import MoEWeights

LAYOUT = "quark-ocp-mx"
_BLOCK = 32
_PROJ = ("gate_proj", "up_proj", "down_proj")
_SCALAR = ((), (1,))
#: Quark weight dtype -> (this project's weight format, packed bytes of a K-element row)
WEIGHT_DTYPES = {"fp4": ("mxfp4", lambda k: k // 2), "fp6_e3m2": ("mxfp6_e3m2", lambda k: k * 3 // 4),
                 "fp6_e2m3": ("mxfp6_e2m3", lambda k: k * 3 // 4)}


@dataclass(frozen=True, eq=False)
class QuarkMoEWeights:
    """One Quark OCP-MX layer's checkpoint: vLLM parameter names -> unpadded tensors, and its layer config."""

    quant_config: Mapping[str, Any]
    tensors: Mapping[str, torch.Tensor]
    weight_format: str
    num_experts: int
    hidden_size: int
    intermediate_size: int
    gate_up: str = "contiguous"

    def layer(self, *, top_k: int, activation: str = "silu", **create_kwargs):
        """A `QuarkOCPMXMoE` for these weights: created (the oracle's ocp-mx decision), loaded, post-processed."""
        from backends.quark import QuarkOCPMXMoE

        layer = QuarkOCPMXMoE.create(self.quant_config, self.num_experts, self.hidden_size, self.intermediate_size,
                                     top_k=top_k, activation=activation, gate_up=self.gate_up,
                                     has_bias="w13_bias" in self.tensors, **create_kwargs)
        layer.load_weights(self.tensors)
        layer.process_weights_after_loading()
        return layer

    def moe_weights(self) -> MoEWeights:
        """The `MoEWeights` of a W4A16 (``w_mxfp4``, no input quantization) checkpoint."""
        if self.weight_format != "mxfp4" or self.quant_config.get("input_tensors"):
            raise ValueError(f"only w_mxfp4 (fp4 weights, unquantized inputs) maps onto MoEWeights; this layer has "
                             f"{self.weight_format} weights and inputs {self.quant_config.get('input_tensors')}; "
                             f"run it with .layer(...)")
        t = self.tensors
        return MoEWeights(format="mxfp4", gate_up=self.gate_up, w13=t["w13_weight"], w13_scale=t["w13_weight_scale"],
                          w2=t["w2_weight"], w2_scale=t["w2_weight_scale"], w13_bias=t.get("w13_bias"),
                          w2_bias=t.get("w2_bias"))


def layer_config(quantization_config: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The Quark config that applies to the experts under `prefix` (layer_quant_config pattern, else global)."""
    name = prefix.rstrip(".")
    for pattern in quantization_config.get("exclude") or ():
        if fnmatch.fnmatch(name, pattern) or fnmatch.fnmatch(name + ".0.gate_proj", pattern):
            raise CheckpointError(f"config.json: the Quark config excludes {name} (pattern {pattern!r}); its experts "
                                  f"are not quantized, so they are not an OCP-MX layer")
    for pattern, config in (quantization_config.get("layer_quant_config") or {}).items():
        if fnmatch.fnmatch(name + ".0.gate_proj", pattern) or fnmatch.fnmatch(name, pattern):
            return dict(config)
    config = quantization_config.get("global_quant_config")
    if not isinstance(config, Mapping) or not isinstance(config.get("weight"), Mapping):
        raise CheckpointError("config.json: quantization_config (quant_method quark) has no global_quant_config with "
                              "a 'weight' mapping; re-export the checkpoint with Quark")
    return dict(config)


def expected(weight_dtype: str, h: int, i: int) -> dict[str, tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]]:
    packed = WEIGHT_DTYPES[weight_dtype][1]
    specs: dict[str, tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]] = {}
    for proj in _PROJ:
        rows, k = (h, i) if proj == "down_proj" else (i, h)
        specs[f"{proj}.weight"] = (("U8",), ((rows, packed(k)),))
        specs[f"{proj}.weight_scale"] = (("U8",), ((rows, k // _BLOCK),))
    return specs


def load(ckpt: Checkpoint, prefix: str, sizes: tuple[int, int, int], experts: list[int] | None,
         inter: slice) -> QuarkMoEWeights:
    e, h, i = sizes
    config = layer_config(ckpt.config["quantization_config"], prefix)
    weight_dtype = config["weight"].get("dtype")
    if weight_dtype not in WEIGHT_DTYPES:
        raise CheckpointError(f"config.json: Quark weight dtype {weight_dtype!r} for {prefix.rstrip('.')} is not an "
                              f"OCP-MX weight; expected one of {sorted(WEIGHT_DTYPES)}")
    fmt, packed = WEIGHT_DTYPES[weight_dtype]
    inputs = config.get("input_tensors") or {}
    static = bool(inputs) and inputs.get("is_dynamic") is False
    ids = list(range(e)) if experts is None else experts
    what = f"Quark OCP-MX {weight_dtype} expert layout, H={h} I={i}"
    for x in ids:
        for suffix, (dtypes, shapes) in expected(weight_dtype, h, i).items():
            ckpt.require(f"{prefix}{x}.{suffix}", dtypes, shapes, what)
        if static:
            for proj in _PROJ:
                ckpt.require(f"{prefix}{x}.{proj}.input_scale", ("F32",), _SCALAR, what + ", static input scales")
    rows = slice(inter.start, inter.stop)
    k_cols = slice(packed(inter.start), packed(inter.stop))
    s_cols = slice(inter.start // _BLOCK, inter.stop // _BLOCK)

    def per_expert(proj: str, name: str, index: tuple = ()) -> torch.Tensor:
        return torch.stack([ckpt.read(f"{prefix}{x}.{proj}.{name}", list(index)) for x in ids])

    tensors = {
        "w13_weight": torch.cat([per_expert("gate_proj", "weight", (rows,)),
                                 per_expert("up_proj", "weight", (rows,))], dim=1),
        "w13_weight_scale": torch.cat([per_expert("gate_proj", "weight_scale", (rows,)),
                                       per_expert("up_proj", "weight_scale", (rows,))], dim=1),
        "w2_weight": per_expert("down_proj", "weight", (slice(None), k_cols)),
        "w2_weight_scale": per_expert("down_proj", "weight_scale", (slice(None), s_cols))}
    if static:  # vLLM keeps one input scale per expert for w13; the larger of w1's and w3's is the safe one
        gate_in = per_expert("gate_proj", "input_scale").reshape(len(ids)).float()
        up_in = per_expert("up_proj", "input_scale").reshape(len(ids)).float()
        tensors["w13_input_scale"] = torch.maximum(gate_in, up_in)
        tensors["w2_input_scale"] = per_expert("down_proj", "input_scale").reshape(len(ids)).float()
    return QuarkMoEWeights(quant_config=config, tensors=tensors, weight_format=fmt, num_experts=len(ids),
                           hidden_size=h, intermediate_size=inter.stop - inter.start)


def released_tensors(weights: QuarkMoEWeights, prefix: str) -> dict:
    """Per-expert tensors as a Quark export stores them (the inverse of `load`)."""
    t, i = weights.tensors, weights.intermediate_size
    out: dict[str, torch.Tensor] = {}
    for x in range(weights.num_experts):
        parts = {"gate_proj": (t["w13_weight"][x, :i], t["w13_weight_scale"][x, :i], "w13_input_scale"),
                 "up_proj": (t["w13_weight"][x, i:], t["w13_weight_scale"][x, i:], "w13_input_scale"),
                 "down_proj": (t["w2_weight"][x], t["w2_weight_scale"][x], "w2_input_scale")}
        for proj, (w, s, input_name) in parts.items():
            out[f"{prefix}{x}.{proj}.weight"] = w.clone()
            out[f"{prefix}{x}.{proj}.weight_scale"] = s.clone()
            if input_name in t:
                out[f"{prefix}{x}.{proj}.input_scale"] = t[input_name][x].float().reshape(())
    return out
