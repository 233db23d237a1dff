"""The model-shape registry and the config.json reader (one family per model the matrix names)."""

from __future__ import annotations

import json

import pytest

from backends.model_shapes import MATRIX, SHAPES, ModelConfigError, shape_from_args, shape_from_config

#: Trimmed config.json of each family: the keys the reader needs, under the names the released configs use.
CONFIGS = {
    "gpt-oss-120b": ({"model_type": "gpt_oss", "num_local_experts": 128, "num_experts_per_tok": 4, "hidden_size": 2880,
                      "intermediate_size": 2880, "quantization_config": {"quant_method": "mxfp4"}}, None),
    "gpt-oss-20b": ({"model_type": "gpt_oss", "num_local_experts": 32, "experts_per_token": 4, "hidden_size": 2880,
                     "intermediate_size": 2880, "quantization_config": {"quant_method": "mxfp4"}}, None),
    "deepseek-v3": ({"model_type": "deepseek_v3", "n_routed_experts": 256, "num_experts_per_tok": 8,
                     "hidden_size": 7168, "moe_intermediate_size": 2048, "intermediate_size": 18432,
                     "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}, None),
    "kimi-k2": ({"model_type": "kimi_k2", "n_routed_experts": 384, "num_experts_per_tok": 8, "hidden_size": 7168,
                 "moe_intermediate_size": 2048}, "nvfp4"),
    "llama-4-maverick": ({"model_type": "llama4", "text_config": {
        "model_type": "llama4_text", "num_local_experts": 128, "num_experts_per_tok": 1, "hidden_size": 5120,
        "intermediate_size": 8192, "intermediate_size_mlp": 16384}, "quantization_config": {
        "quant_method": "modelopt", "quant_algo": "NVFP4"}}, None),
    "glm-4.5": ({"model_type": "glm4_moe", "n_routed_experts": 160, "num_experts_per_tok": 8, "hidden_size": 5120,
                 "moe_intermediate_size": 1536, "intermediate_size": 12288}, "nvfp4"),
    "qwen3-next-80b-a3b": ({"model_type": "qwen3_next", "num_experts": 512, "num_experts_per_tok": 10,
                            "hidden_size": 2048, "moe_intermediate_size": 512, "intermediate_size": 5120}, "nvfp4"),
    "minimax-m2": ({"model_type": "minimax_m2", "num_local_experts": 256, "num_experts_per_tok": 8,
                    "hidden_size": 3072, "intermediate_size": 1536}, "nvfp4"),
    "qwen3-30b-a3b": ({"model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8, "hidden_size": 2048,
                       "moe_intermediate_size": 768, "intermediate_size": 6144}, "mxfp4"),
}


def test_the_matrix_is_the_issues_list():
    assert set(MATRIX) == {"gpt-oss-120b", "gpt-oss-20b", "deepseek-v3", "kimi-k2", "llama-4-maverick", "glm-4.5",
                           "qwen3-next-80b-a3b", "minimax-m2", "deepseek-v3-mxfp4"}
    for name in MATRIX:
        s = SHAPES[name]
        if name.startswith("gpt-oss"):
            assert (s.format, s.activation, s.gate_up_layout, s.biases) == ("mxfp4", "swigluoai", "interleaved", True)
        else:
            assert (s.activation, s.gate_up_layout, s.biases) == ("silu", "contiguous", False)
            assert s.format == ("mxfp4" if name == "deepseek-v3-mxfp4" else "nvfp4")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_each_family_config_gives_the_registry_shape(name, tmp_path):
    config, fmt = CONFIGS[name]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    got = shape_from_config(path, format=fmt)
    assert got.fields() == SHAPES[name].fields()
    assert (got.activation, got.gate_up_layout, got.biases) == (SHAPES[name].activation, SHAPES[name].gate_up_layout,
                                                                SHAPES[name].biases)


@pytest.mark.parametrize(("config", "message"), [
    ({"model_type": "llama", "hidden_size": 4096}, r"model_type 'llama' is not a known MoE family.*--shape E,k,H,I"),
    ({"hidden_size": 4096}, r"model_type None is not a known MoE family"),
    ({"model_type": "deepseek_v3", "num_experts_per_tok": 8, "hidden_size": 7168, "moe_intermediate_size": 2048},
     r"key 'n_routed_experts' is missing; a deepseek_v3 config.json names its MoE layer's expert count so"),
    ({"model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8, "hidden_size": "2048",
      "moe_intermediate_size": 768}, r"hidden_size = '2048' must be a positive integer"),
    ({"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 8, "hidden_size": 2048,
      "moe_intermediate_size": 768}, r"top-k 8 exceeds the 4 experts"),
    ({"model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8, "hidden_size": 2048,
      "moe_intermediate_size": 768}, r"no quantization_config: cannot tell the 4-bit weight format; pass --format"),
    ({"model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8, "hidden_size": 2048,
      "moe_intermediate_size": 768, "quantization_config": {"quant_method": "fp8"}},
     r"quantization_config.quant_method 'fp8': cannot tell"),
])
def test_config_errors_name_the_file_key_and_fix(config, message, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match=message) as err:
        shape_from_config(path)
    assert str(path) in str(err.value)


def test_unreadable_and_non_json_configs(tmp_path):
    with pytest.raises(ModelConfigError, match=r"missing.json: cannot read"):
        shape_from_config(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ModelConfigError, match=r"bad.json: not JSON"):
        shape_from_config(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ModelConfigError, match=r"bad.json: a config.json is a JSON object, got list"):
        shape_from_config(bad)


def test_a_config_over_the_metadata_limit_is_refused_before_it_is_read_whole(tmp_path, monkeypatch):
    """config.json and a checkpoint's index are read no further than oracle.limits.MAX_METADATA_BYTES (an endless
    file such as /dev/zero, or a huge one, costs no more); the message names the file and the limit."""
    from backends.checkpoints.store import Checkpoint, CheckpointError

    monkeypatch.setattr("oracle.limits.MAX_METADATA_BYTES", 100)
    big = tmp_path / "config.json"
    big.write_text('{"num_local_experts": 32' + " " * 200 + "}")
    with pytest.raises(ModelConfigError, match=r"config.json:1:1: the file is larger than 100 bytes \(the limit\)"):
        shape_from_config(big)
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {}' + " " * 200 + "}")
    with pytest.raises(CheckpointError, match=r"index.json:1:1: the file is larger than 100 bytes \(the limit\)"):
        Checkpoint(tmp_path)
    with pytest.raises(ModelConfigError, match=r"format 'int4' must be one of"):
        shape_from_config(CONFIGS["kimi-k2"][0], format="int4")


def test_shape_arguments():
    s = shape_from_args("128,8,4096,1536", "nvfp4")
    assert s.fields() == {"format": "nvfp4", "experts": 128, "top_k": 8, "hidden_size": 4096,
                          "intermediate_size": 1536} and s.gate_up_layout == "contiguous"
    assert shape_from_args("32,4,2880,2880", "mxfp4", activation="swigluoai").biases
    for spec, message in (("128,8,4096", r"must be four integers E,k,H,I"), ("1,8,64,64", r"top-k at most E"),
                          ("a,b,c,d", r"four integers")):
        with pytest.raises(ModelConfigError, match=message):
            shape_from_args(spec, "nvfp4")
    with pytest.raises(ModelConfigError, match=r"--format 'fp8'"):
        shape_from_args("8,2,64,64", "fp8")
    with pytest.raises(ModelConfigError, match=r"--activation 'gelu'"):
        shape_from_args("8,2,64,64", "nvfp4", activation="gelu")
