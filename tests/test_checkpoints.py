"""backends.checkpoints: released layouts written, read lazily, sliced per rank, and refused with one clear error."""
from __future__ import annotations

import json

import pytest
import torch

from backends.checkpoints import (
    Checkpoint,
    CheckpointError,
    QuarkMoEWeights,
    detect_layout,
    gpt_oss,
    load_moe_weights,
    modelopt,
    moe_layers,
    quark,
    write_checkpoint,
)
from backends.checkpoints.quantize import dequantize_moe, quantize_moe, quantize_quark
from backends.emulation import moe_forward
from backends.weights import MoEWeights

from tolerances import tolerance

E, H, I, TOP_K = 6, 64, 64, 2  # noqa: E741 - the MoE literature's name for the intermediate size
PREFIX = "model.layers.{}.mlp.experts."
DENSE = {"model.embed_tokens.weight": torch.zeros(16, H), "model.layers.0.mlp.gate_proj.weight": torch.zeros(I, H),
         "model.layers.0.self_attn.q_proj.weight": torch.zeros(H, H), "lm_head.weight": torch.zeros(16, H)}


def _float_experts(seed: int, gate_up: str):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(E, 2 * I, H, generator=g) * H ** -0.5
    w2 = torch.randn(E, H, I, generator=g) * I ** -0.5
    b13 = (torch.randn(E, 2 * I, generator=g) * 0.1).bfloat16().float()  # released biases are bf16
    b2 = (torch.randn(E, H, generator=g) * 0.1).bfloat16().float()
    return w13, w2, b13, b2


def gpt_oss_weights(seed=0) -> MoEWeights:
    w13, w2, b13, b2 = _float_experts(seed, "interleaved")
    return quantize_moe(w13, w2, format="mxfp4", gate_up="interleaved", w13_bias=b13, w2_bias=b2)


def modelopt_weights(seed=0, *, exact_global=True) -> MoEWeights:
    w13, w2, _, _ = _float_experts(seed, "contiguous")
    weights = quantize_moe(w13, w2, format="nvfp4", gate_up="contiguous")
    g = torch.Generator().manual_seed(seed + 1)
    inputs = {"w13_input_scale": torch.rand(E, 2, generator=g) + 0.5, "w2_input_scale": torch.rand(E, generator=g) + 0.5}
    if exact_global:  # powers of two: 1 / (1 / s) == s, so the stored weight_scale_2 round-trips bit for bit
        pow2 = lambda t: torch.exp2(torch.round(torch.log2(t)))
        inputs.update(w13_global_scale=pow2(weights.w13_global_scale), w2_global_scale=pow2(weights.w2_global_scale))
    return weights.replace(**inputs)


QUARK_DTYPES = ("fp4", "fp6_e3m2", "fp6_e2m3")


def quark_layer_config(dtype, inputs=None):
    return {"weight": {"dtype": dtype, "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0"},
            "input_tensors": inputs}


def quark_weights(dtype="fp4", seed=0, static_fp8=False) -> QuarkMoEWeights:
    w13, w2, _, _ = _float_experts(seed, "contiguous")
    inputs = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False} if static_fp8 else None
    weights = quantize_quark(w13, w2, quark_layer_config(dtype, inputs))
    if static_fp8:
        g = torch.Generator().manual_seed(seed + 2)
        tensors = dict(weights.tensors, w13_input_scale=torch.rand(E, generator=g) + 0.1,
                       w2_input_scale=torch.rand(E, generator=g) + 0.1)
        weights = QuarkMoEWeights(**{**weights.__dict__, "tensors": tensors})
    return weights


def quant_config(layout, layer_config=None):
    if layout == gpt_oss.LAYOUT:
        return {"quant_method": "mxfp4"}
    if layout == modelopt.LAYOUT:
        return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
    return {"quant_method": "quark", "global_quant_config": layer_config, "exclude": ["lm_head"]}


def write(tmp_path, layout, layers: dict, *, config_extra=None, shards=3, **kw):
    """A checkpoint of dense layer 0, the given MoE layers and a few other tensors, in `layout`, sharded."""
    module = {gpt_oss.LAYOUT: gpt_oss, modelopt.LAYOUT: modelopt, quark.LAYOUT: quark}[layout]
    tensors = dict(DENSE)
    for n, weights in layers.items():
        tensors.update(module.released_tensors(weights, PREFIX.format(n), **kw))
        tensors[f"model.layers.{n}.mlp.gate.weight"] = torch.zeros(E, H)
    first = next(iter(layers.values()))
    config = {"hidden_size": H, "num_local_experts": E, "intermediate_size": I, "model_type": "test",
              "quantization_config": quant_config(layout, getattr(first, "quant_config", None)), **(config_extra or {})}
    return write_checkpoint(tmp_path / "ckpt", tensors, config=config, shards=shards)


def assert_same_weights(a, b):
    if isinstance(a, QuarkMoEWeights):
        assert (a.weight_format, a.num_experts, a.hidden_size, a.intermediate_size, a.gate_up) == (
            b.weight_format, b.num_experts, b.hidden_size, b.intermediate_size, b.gate_up)
        assert dict(a.quant_config) == dict(b.quant_config)
        assert sorted(a.tensors) == sorted(b.tensors)
        for name in a.tensors:
            torch.testing.assert_close(a.tensors[name], b.tensors[name], **tolerance("exact"))
        return
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            assert x is not None and y is not None, name
            assert x.dtype == y.dtype, name
            torch.testing.assert_close(x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x,
                                       y.view(torch.uint8) if y.dtype == torch.float8_e4m3fn else y,
                                       **tolerance("exact"), msg=name)
        else:
            assert x == y, name


# ---------------------------------------------------------------------- round trips
CASES = {gpt_oss.LAYOUT: gpt_oss_weights, modelopt.LAYOUT: modelopt_weights,
         **{f"{quark.LAYOUT}:{d}": (lambda d=d: quark_weights(d)) for d in QUARK_DTYPES},
         f"{quark.LAYOUT}:fp4-static-fp8": lambda: quark_weights("fp4", static_fp8=True)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_released_layout_round_trips_to_the_same_weights(tmp_path, case):
    layout = case.split(":")[0]
    layers = {1: CASES[case](), 3: CASES[case]()}
    path = write(tmp_path, layout, layers)
    assert moe_layers(path) == [1, 3] and detect_layout(path, 3) == layout
    for n, weights in layers.items():
        assert_same_weights(load_moe_weights(path, layer=n), weights)


def test_modelopt_global_scales_round_trip_within_two_reciprocals(tmp_path):
    weights = modelopt_weights(exact_global=False)
    loaded = load_moe_weights(write(tmp_path, modelopt.LAYOUT, {1: weights}), layer=1)
    for name in ("w13_global_scale", "w2_global_scale"):
        torch.testing.assert_close(getattr(loaded, name), getattr(weights, name), **tolerance("fp32_reciprocals"))
    assert_same_weights(loaded.replace(w13_global_scale=weights.w13_global_scale,
                                       w2_global_scale=weights.w2_global_scale), weights)


def test_one_layer_reads_only_its_tensors_and_shards(tmp_path):
    layers = {n: modelopt_weights(seed=n) for n in (1, 2, 3)}
    path = write(tmp_path, modelopt.LAYOUT, layers, shards=6)
    ckpt = Checkpoint(path)
    load_moe_weights(ckpt, layer=2)
    prefix = PREFIX.format(2)
    assert ckpt.reads and all(key.startswith(prefix) for key in ckpt.reads)
    assert len(set(ckpt.reads)) == len(ckpt.reads) == E * 3 * 4  # weight, scale, scale_2, input_scale per projection
    holding = {ckpt.file_of(k) for k in ckpt.keys() if k.startswith(prefix)}
    assert set(ckpt.opened) == holding and len(holding) < 6


# ---------------------------------------------------------------------- per-rank subsets
def _sliced(weights: MoEWeights, ids, start, stop):
    """The expected subset, cut from the full layer the obvious way."""
    i, b = weights.I, weights.block_size
    rows13 = (torch.cat([torch.arange(2 * start, 2 * stop)]) if weights.gate_up == "interleaved"
              else torch.cat([torch.arange(start, stop), torch.arange(i + start, i + stop)]))
    fields = dict(w13=weights.w13[ids][:, rows13], w13_scale=weights.w13_scale[ids][:, rows13],
                  w2=weights.w2[ids][:, :, start // 2:stop // 2], w2_scale=weights.w2_scale[ids][:, :, start // b:stop // b])
    for name in ("w13_global_scale", "w2_global_scale", "w13_input_scale", "w2_input_scale", "w2_bias"):
        if getattr(weights, name) is not None:
            fields[name] = getattr(weights, name)[ids]
    if weights.w13_bias is not None:
        fields["w13_bias"] = weights.w13_bias[ids][:, rows13]
    if start and weights.w2_bias is not None:
        fields["w2_bias"] = torch.zeros_like(fields["w2_bias"])
    return weights.replace(**{k: v.contiguous() for k, v in fields.items()})


@pytest.mark.parametrize("layout", [gpt_oss.LAYOUT, modelopt.LAYOUT])
def test_a_rank_loads_its_experts_and_slice_without_the_rest(tmp_path, layout):
    weights = gpt_oss_weights() if layout == gpt_oss.LAYOUT else modelopt_weights()
    path = write(tmp_path, layout, {1: weights})
    ids = [4, 1, 2]
    ckpt = Checkpoint(path)
    subset = load_moe_weights(ckpt, layer=1, experts=ids, tp_slice=(32, 64))
    assert_same_weights(subset, _sliced(weights, ids, 32, 64))
    if layout == modelopt.LAYOUT:  # per-expert tensors: the other experts are never read
        assert {int(k.split(".")[5]) for k in ckpt.reads} == set(ids)


@pytest.mark.parametrize("layout", [gpt_oss.LAYOUT, modelopt.LAYOUT])
def test_tensor_parallel_slices_sum_to_the_whole_layer(tmp_path, layout):
    """Each TP rank's layer computes a partial output; their sum is the full layer's (down bias added once)."""
    weights = gpt_oss_weights() if layout == gpt_oss.LAYOUT else modelopt_weights()
    path = write(tmp_path, layout, {1: weights})
    act = "swigluoai" if layout == gpt_oss.LAYOUT else "silu"
    g = torch.Generator().manual_seed(3)
    x, logits = torch.randn(5, H, generator=g), torch.randn(5, E, generator=g)
    full = moe_forward(x, **weights.emulation_kwargs(), router_logits=logits, top_k=TOP_K, activation=act)
    parts = sum(moe_forward(x, **load_moe_weights(path, layer=1, tp_slice=(s, s + 32)).emulation_kwargs(),
                            router_logits=logits, top_k=TOP_K, activation=act) for s in (0, 32))
    torch.testing.assert_close(parts, full, **tolerance("fp32_reordered"))


# ---------------------------------------------------------------------- w1 / w3 global scales that differ
def _w3_scale_times(weights: MoEWeights, factor: float, path_dir, *, requantize: bool):
    """Released tensors whose up_proj weight_scale_2 is `factor` x larger and block scales `factor` x smaller."""
    tensors = dict(DENSE, **modelopt.released_tensors(weights, PREFIX.format(1)))
    for x in range(E):
        key = f"{PREFIX.format(1)}{x}.up_proj."
        tensors[key + "weight_scale_2"] = tensors[key + "weight_scale_2"] * factor
        tensors[key + "weight_scale"] = (tensors[key + "weight_scale"].float() / factor).to(torch.float8_e4m3fn)
    config = {"hidden_size": H, "num_local_experts": E, "intermediate_size": I,
              "quantization_config": quant_config(modelopt.LAYOUT)}
    path = write_checkpoint(path_dir, tensors, config=config)
    return load_moe_weights(path, layer=1, w13_scales="requantize" if requantize else "refuse")


def test_differing_w1_w3_global_scales_are_refused_with_the_reason(tmp_path):
    with pytest.raises(CheckpointError, match=r"layer 1 expert 0: gate_proj.weight_scale_2=.* differs from "
                       r"up_proj.weight_scale_2=.*6 of 6 experts differ.*w13_scales='requantize'"):
        _w3_scale_times(modelopt_weights(), 2.0, tmp_path / "c", requantize=False)


def test_requantize_onto_the_larger_scale_is_exact_for_a_power_of_two_ratio(tmp_path):
    weights = modelopt_weights()
    weights = weights.replace(w13_scale=(weights.w13_scale.float().clamp(2 ** -5, 224)).to(torch.float8_e4m3fn))
    loaded = _w3_scale_times(weights, 2.0, tmp_path / "c", requantize=True)  # w3's s2 larger: gate scales halve
    w13, _ = dequantize_moe(loaded)
    torch.testing.assert_close(w13, dequantize_moe(weights)[0], **tolerance("exact"))
    assert torch.equal(loaded.w13.view(torch.uint8), weights.w13)  # the codes are kept


def test_requantize_with_another_ratio_rounds_each_block_scale_once(tmp_path):
    weights = modelopt_weights()
    weights = weights.replace(w13_scale=(weights.w13_scale.float().clamp(2 ** -3, 256)).to(torch.float8_e4m3fn))
    loaded = _w3_scale_times(weights, 0.7, tmp_path / "c", requantize=True)
    up_now = loaded.w13_scale[:, I:].float() / loaded.w13_global_scale.view(-1, 1, 1)
    up_was = (weights.w13_scale[:, I:].float() / 0.7).to(torch.float8_e4m3fn).float() * 0.7 / \
        weights.w13_global_scale.view(-1, 1, 1)
    torch.testing.assert_close(up_now, up_was, **tolerance("e4m3_one_rounding"))
    assert not torch.equal(up_now, up_was)  # rounded, not exact


# ---------------------------------------------------------------------- bad input: one clear error each
def test_missing_key_names_it_and_the_index_searched(tmp_path):
    weights = gpt_oss_weights()
    tensors = dict(DENSE, **gpt_oss.released_tensors(weights, PREFIX.format(1)))
    del tensors[PREFIX.format(1) + "down_proj_scales"]
    path = write_checkpoint(tmp_path / "c", tensors, config={"hidden_size": H, "num_local_experts": E,
                                                             "intermediate_size": I,
                                                             "quantization_config": {"quant_method": "mxfp4"}})
    ckpt = Checkpoint(path)
    with pytest.raises(CheckpointError, match=r"'model.layers.1.mlp.experts.down_proj_scales' is missing from "
                       r".*model.safetensors.index.json \(gpt-oss MXFP4 layout"):
        load_moe_weights(ckpt, layer=1)
    assert ckpt.reads == []


@pytest.mark.parametrize("change, message", [
    (lambda t, k: t.__setitem__(k + "3.up_proj.weight_scale", t[k + "3.up_proj.weight_scale"].float()),
     r"'model.layers.1.mlp.experts.3.up_proj.weight_scale' in model-0000\d-of-00002.safetensors: dtype F32, "
     r"expected F8_E4M3"),
    (lambda t, k: t.__setitem__(k + "2.down_proj.weight", t[k + "2.down_proj.weight"][:, :16]),
     r"'model.layers.1.mlp.experts.2.down_proj.weight' in .*: shape \(64, 16\), expected \(64, 32\)"),
])
def test_wrong_dtype_or_shape_names_key_expected_and_found(tmp_path, change, message):
    tensors = dict(DENSE, **modelopt.released_tensors(modelopt_weights(), PREFIX.format(1)))
    change(tensors, PREFIX.format(1))
    path = write_checkpoint(tmp_path / "c", tensors, config={"hidden_size": H, "num_local_experts": E,
                                                             "intermediate_size": I,
                                                             "quantization_config": quant_config(modelopt.LAYOUT)})
    ckpt = Checkpoint(path)
    with pytest.raises(CheckpointError, match=message):
        load_moe_weights(ckpt, layer=1)
    assert ckpt.reads == []  # every header is checked before any data is read


def test_a_layer_without_experts_is_named_with_the_layers_that_have_them(tmp_path):
    path = write(tmp_path, gpt_oss.LAYOUT, {1: gpt_oss_weights(), 2: gpt_oss_weights()})
    with pytest.raises(CheckpointError, match=r"layer 0 has no experts \(its MLP tensors: "
                       r"model.layers.0.mlp.gate_proj.weight\); layers with experts: 1, 2"):
        load_moe_weights(path, layer=0)
    with pytest.raises(CheckpointError, match=r"no layer 7 in the checkpoint; layers with experts: 1, 2"):
        load_moe_weights(path, layer=7)


def test_mixed_formats_in_one_layer_are_refused(tmp_path):
    tensors = dict(DENSE, **modelopt.released_tensors(modelopt_weights(), PREFIX.format(1)))
    quark_tensors = quark.released_tensors(quark_weights("fp4"), PREFIX.format(1))
    for key in [k for k in tensors if k.startswith(PREFIX.format(1) + "5.")]:
        del tensors[key]
    tensors.update({k: v for k, v in quark_tensors.items() if k.startswith(PREFIX.format(1) + "5.")})
    path = write_checkpoint(tmp_path / "c", tensors, config={"quantization_config": quant_config(modelopt.LAYOUT)})
    with pytest.raises(CheckpointError, match=r"layer 1 mixes expert formats \(modelopt-nvfp4: "
                       r"model.layers.1.mlp.experts.0.\*, .*quark-ocp-mx: model.layers.1.mlp.experts.5.\*\)"):
        load_moe_weights(path, layer=1)


def test_config_announcing_another_format_is_refused(tmp_path):
    path = write(tmp_path, modelopt.LAYOUT, {1: modelopt_weights()})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config.json: quantization_config.quant_method='mxfp4' announces "
                       r"gpt-oss-mxfp4, but layer 1's experts are stored as modelopt-nvfp4"):
        load_moe_weights(path, layer=1)


def test_unquantized_experts_are_named_with_the_layouts_read(tmp_path):
    tensors = dict(DENSE, **{f"{PREFIX.format(1)}{x}.{p}.weight": torch.zeros(I, H).bfloat16()
                             for x in range(E) for p in ("gate_proj", "up_proj", "down_proj")})
    path = write_checkpoint(tmp_path / "c", tensors, config={})
    with pytest.raises(CheckpointError, match=r"layer 1's experts .* are unquantized or unknown; the loaders read "
                       r"gpt-oss-mxfp4 = .*, modelopt-nvfp4 = .*, quark-ocp-mx = "):
        load_moe_weights(path, layer=1)


@pytest.mark.parametrize("kwargs, message", [
    ({"experts": [0, 6]}, r"experts=\[0, 6\] must be distinct int expert ids in \[0, 6\)"),
    ({"experts": [1, 1]}, r"must be distinct"),
    ({"tp_slice": (16, 48)}, r"tp_slice=\(16, 48\) must be .* multiples of 32 \(the gpt-oss-mxfp4 block size"),
    ({"tp_slice": (32, 96)}, r"0 <= start < stop <= I=64"),
])
def test_bad_subset_arguments(tmp_path, kwargs, message):
    path = write(tmp_path, gpt_oss.LAYOUT, {1: gpt_oss_weights()})
    with pytest.raises(ValueError, match=message):
        load_moe_weights(path, layer=1, **kwargs)


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match=r"no model.safetensors.index.json and no model.safetensors"):
        load_moe_weights(tmp_path, layer=0)


# ---------------------------------------------------------------------- Quark: the layer the weights describe
def test_quark_w_mxfp4_maps_onto_moe_weights_and_mxfp6_runs_the_quark_layer(tmp_path):
    fp4 = load_moe_weights(write(tmp_path / "a", quark.LAYOUT, {1: quark_weights("fp4")}), layer=1)
    moe = fp4.moe_weights()
    assert (moe.format, moe.gate_up) == ("mxfp4", "contiguous")
    fp6 = load_moe_weights(write(tmp_path / "b", quark.LAYOUT, {1: quark_weights("fp6_e3m2")}), layer=1)
    with pytest.raises(ValueError, match=r"only w_mxfp4 .* maps onto MoEWeights; .* run it with .layer"):
        fp6.moe_weights()
    layer = fp6.layer(top_k=TOP_K, activation="silu")
    x, logits = torch.randn(4, H), torch.randn(4, E)
    w13, w2 = dequantize_moe(fp6)
    expected = moe_forward(x, w13=w13.bfloat16(), w13_scale=None, w2=w2.bfloat16(), w2_scale=None, format="bf16",
                           router_logits=logits, top_k=TOP_K, activation="silu", gate_up_layout="contiguous")
    torch.testing.assert_close(layer.forward(x, logits), expected, **tolerance("fp32_reordered"))


# ---------------------------------------------------------------------- where the config and tensors come from
def test_one_safetensors_file_and_modelopt_hf_quant_config(tmp_path):
    """A single model.safetensors (no index) and ModelOpt's older hf_quant_config.json read like the sharded form."""
    from safetensors.torch import save_file

    weights = modelopt_weights()
    tensors = {k: v.contiguous() for k, v in {**DENSE, **modelopt.released_tensors(weights, PREFIX.format(1))}.items()}
    (tmp_path / "c").mkdir()
    save_file(tensors, str(tmp_path / "c" / "model.safetensors"))
    (tmp_path / "c" / "config.json").write_text(json.dumps({"hidden_size": H, "num_local_experts": E,
                                                            "intermediate_size": I}))
    (tmp_path / "c" / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4"}}))
    assert_same_weights(load_moe_weights(tmp_path / "c", layer=1), weights)
    assert_same_weights(load_moe_weights(tmp_path / "c" / "model.safetensors", layer=1), weights)


def test_quark_layer_quant_config_pattern_overrides_the_global_scheme(tmp_path):
    """Quark's layer_quant_config (fnmatch on module names) gives the experts MXFP6 under a global MXFP4 config."""
    weights = quark_weights("fp6_e2m3")
    path = write(tmp_path, quark.LAYOUT, {1: weights})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "quark", "global_quant_config": quark_layer_config("fp4"),
                                     "layer_quant_config": {"*.mlp.experts.*": quark_layer_config("fp6_e2m3")},
                                     "exclude": ["lm_head"]}
    (path / "config.json").write_text(json.dumps(config))
    assert_same_weights(load_moe_weights(path, layer=1), weights)
    config["quantization_config"]["layer_quant_config"] = {}  # the global fp4 scheme: fp6 bytes have the wrong shape
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"'model.layers.1.mlp.experts.0.gate_proj.weight' in .*: shape "
                       r"\(64, 48\), expected \(64, 32\) \(Quark OCP-MX fp4 expert layout"):
        load_moe_weights(path, layer=1)


def test_write_checkpoint_never_writes_through_a_planted_temporary_name(tmp_path):
    """The writer stages its files in a fresh private directory: links planted at the temporary names an earlier
    writer used (config.json.tmp, the index's and each shard's .tmp) are never followed, and none is left."""
    target, outside = tmp_path / "c", tmp_path / "outside.txt"
    target.mkdir()
    outside.write_text("precious\n")
    planted = ["config.json.tmp", "model.safetensors.index.json.tmp", "model-00001-of-00001.safetensors.tmp"]
    for name in planted:
        (target / name).symlink_to(outside)
    path = write_checkpoint(target, {"a": torch.zeros(2)}, config={"hidden_size": 2}, shards=1)
    assert outside.read_text() == "precious\n"
    assert json.loads((path / "config.json").read_text()) == {"hidden_size": 2}
    assert sorted(p.name for p in path.iterdir()) == sorted([*planted, "config.json", "model.safetensors.index.json",
                                                              "model-00001-of-00001.safetensors"])
