"""Small models of real MoE architectures, their experts quantized into a released checkpoint layout.

Shared by the transformers integration tests and `benchmarks/gpu_transformers_decode.py`: a config of the real
architecture (few layers, small dims, the real expert layout), random weights, the experts quantized as a model
optimizer exports them, written as a sharded safetensors checkpoint with its index; the model itself gets the
dequantized expert weights, so transformers' own forward is the reference for the patched one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from backends.checkpoints import gpt_oss, modelopt, quark, write_checkpoint
from backends.checkpoints.quantize import dequantize_moe, quantize_moe, quantize_quark
from backends.integrations.transformers import GATE_UP, dense_expert_weights, set_dense_expert_weights

#: layout -> (quantization_config of config.json, weight format)
QUANT_CONFIGS: dict[str, dict[str, Any]] = {
    gpt_oss.LAYOUT: {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]},
    modelopt.LAYOUT: {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                      "exclude_modules": ["lm_head", "model.layers.*.self_attn*", "model.layers.*.mlp.gate"]},
}


def quark_config(weight_dtype: str) -> dict[str, Any]:
    layer = {"weight": {"dtype": weight_dtype, "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0",
                        "is_dynamic": False}, "input_tensors": None, "output_tensors": None}
    return {"quant_method": "quark", "global_quant_config": layer, "layer_quant_config": {},
            "exclude": ["lm_head", "*self_attn*", "*mlp.gate"]}


def tiny_config(model_type: str, **sizes):
    """A few-layer config of the real architecture (sizes: hidden, inter, experts, top_k, layers, vocab, and
    DeepSeek-V3's n_group / topk_group); attention stays small (2 heads): the experts are what is tested."""
    import transformers

    h, i = sizes.get("hidden", 64), sizes.get("inter", 32)
    e, k, n, vocab = sizes.get("experts", 8), sizes.get("top_k", 2), sizes.get("layers", 2), sizes.get("vocab", 128)
    common = dict(vocab_size=vocab, hidden_size=h, num_hidden_layers=n, max_position_embeddings=512,
                  num_experts_per_tok=k, tie_word_embeddings=False)
    if model_type == "gpt_oss":
        common["max_position_embeddings"] = 131072  # the release's YaRN context (4096 x 32)
        return transformers.GptOssConfig(**common, intermediate_size=i, num_local_experts=e, num_attention_heads=2,
                                         num_key_value_heads=1, head_dim=32, sliding_window=16,
                                         layer_types=["sliding_attention", "full_attention"] * (n // 2) +
                                         ["sliding_attention"] * (n % 2))
    if model_type == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**common, intermediate_size=2 * i, moe_intermediate_size=i, num_experts=e,
                                           num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                           norm_topk_prob=True)
    if model_type == "deepseek_v3":  # layer 0 dense (first_k_dense_replace), the rest MoE with a shared expert
        return transformers.DeepseekV3Config(**common, intermediate_size=2 * i, moe_intermediate_size=i,
                                             n_routed_experts=e, n_group=sizes.get("n_group", 2),
                                             topk_group=sizes.get("topk_group", 1), n_shared_experts=1,
                                             first_k_dense_replace=1, num_attention_heads=2, num_key_value_heads=2,
                                             q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                                             qk_nope_head_dim=16, v_head_dim=16, routed_scaling_factor=2.5,
                                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    raise ValueError(model_type)


def moe_experts(model) -> dict[int, torch.nn.Module]:
    return {n: layer.mlp.experts for n, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")}


@torch.no_grad()
def quantized_model(model_type: str, layout: str, directory: Path, *, seed: int = 0, dtype=torch.float32,
                    device="cpu", weight_dtype: str = "fp6_e3m2", **sizes):
    """(model with dequantized experts, {layer: quantized weights}) and `directory` holding the checkpoint."""
    import transformers

    torch.manual_seed(seed)
    config = tiny_config(model_type, **sizes)
    with torch.device(device):  # initialised where it runs (a real-size layer would be slow to init on the CPU)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    released, layers = {}, {}
    for name, tensor in model.state_dict().items():
        if ".experts." not in name:
            released[name] = tensor.to(dtype)
    for n, experts in moe_experts(model).items():
        h = config.hidden_size
        for p in experts.parameters():  # weights large enough that the experts move the logits
            p.normal_(0.0, h ** -0.5)
        router = getattr(model.model.layers[n].mlp, "gate", None)
        if router is not None and hasattr(router, "e_score_correction_bias"):
            router.e_score_correction_bias.normal_(0.0, 0.1)
            released[f"model.layers.{n}.mlp.gate.e_score_correction_bias"] = router.e_score_correction_bias.clone()
        dense = dense_expert_weights(model_type, experts)
        prefix = f"model.layers.{n}.mlp.experts."
        if layout == quark.LAYOUT:
            weights = quantize_quark(dense["w13"].float(), dense["w2"].float(), quark_config(weight_dtype)["global_quant_config"])
            released.update(quark.released_tensors(weights, prefix))
        else:
            biases = {k: None if v is None else v.to(torch.bfloat16).float() for k, v in dense.items() if "bias" in k}
            fmt = "mxfp4" if layout == gpt_oss.LAYOUT else "nvfp4"
            weights = quantize_moe(dense["w13"].float(), dense["w2"].float(), format=fmt, gate_up=GATE_UP[model_type],
                                   **biases)
            module = gpt_oss if layout == gpt_oss.LAYOUT else modelopt
            released.update(module.released_tensors(weights, prefix))
        w13, w2 = dequantize_moe(weights)
        set_dense_expert_weights(model_type, experts, w13, w2, getattr(weights, "w13_bias", None),
                                 getattr(weights, "w2_bias", None))
        layers[n] = weights
    cfg = json.loads(config.to_json_string())
    cfg["quantization_config"] = quark_config(weight_dtype) if layout == quark.LAYOUT else QUANT_CONFIGS[layout]
    write_checkpoint(directory, released, config=cfg, shards=3)
    return model.to(dtype), layers
