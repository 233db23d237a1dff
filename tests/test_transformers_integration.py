"""Small real-architecture transformers models, experts from a released-layout checkpoint, patched with MoELayer:
the same logits (within fp32 reordering) and the same 16 greedy tokens as transformers' own forward on the
dequantized experts; and the errors that leave a model untouched."""
from __future__ import annotations

import copy
import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from hf_tiny_models import moe_experts, quantized_model, tiny_config  # noqa: E402

from backends.checkpoints import CheckpointError, gpt_oss, modelopt, quark  # noqa: E402
from backends.integrations.transformers import (  # noqa: E402
    SUPPORTED_ARCHITECTURES,
    IntegrationError,
    MoELayerExperts,
    patch_model,
)

from tolerances import tolerance  # noqa: E402

CASES = [("gpt_oss", gpt_oss.LAYOUT), ("qwen3_moe", modelopt.LAYOUT), ("deepseek_v3", modelopt.LAYOUT),
         ("qwen3_moe", quark.LAYOUT)]
PROMPT = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
STEPS = 16


@pytest.mark.parametrize("model_type, layout", CASES, ids=[f"{m}-{layout}" for m, layout in CASES])
def test_patched_model_matches_transformers_on_the_dequantized_experts(tmp_path, model_type, layout):
    reference, layers = quantized_model(model_type, layout, tmp_path / "ckpt")
    patched = copy.deepcopy(reference)
    built = patch_model(patched, tmp_path / "ckpt")
    assert sorted(built) == sorted(moe_experts(reference)) == sorted(layers)
    assert all(isinstance(patched.model.layers[n].mlp.experts, MoELayerExperts) for n in built)
    if model_type == "deepseek_v3":  # the dense first layer and the shared experts stay the model's own
        assert 0 not in built and patched.model.layers[1].mlp.shared_experts is not None
    reference_tokens = reference.generate(PROMPT[:1], max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False)
    tokens = patched.generate(PROMPT[:1], max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False)
    assert tokens.shape[1] == PROMPT.shape[1] + STEPS
    assert tokens.tolist() == reference_tokens.tolist()

    with torch.no_grad():
        expected, got = reference(PROMPT).logits, patched(PROMPT).logits
        for experts in moe_experts(reference).values():  # the experts matter: without them the logits move far
            experts.down_proj.zero_()
        without_experts = reference(PROMPT).logits
    torch.testing.assert_close(got, expected, **tolerance("fp32_reordered"))
    assert (without_experts - expected).abs().max() > 100 * tolerance("fp32_reordered")["atol"]


def test_unknown_architecture_names_the_supported_ones():
    import transformers

    config = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, num_local_experts=4)
    model = transformers.AutoModelForCausalLM.from_config(config)
    supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
    with pytest.raises(IntegrationError, match=rf"model_type='mixtral' \(MixtralForCausalLM\) is not supported; "
                       rf"the transformers integration patches {supported}"):
        patch_model(model, "unused")


def test_a_failing_layer_leaves_the_model_untouched(tmp_path):
    reference, _ = quantized_model("gpt_oss", gpt_oss.LAYOUT, tmp_path / "ckpt")
    index = tmp_path / "ckpt" / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    del data["weight_map"]["model.layers.1.mlp.experts.down_proj_bias"]  # layer 0 loads, layer 1 does not
    index.write_text(json.dumps(data))
    model = copy.deepcopy(reference)
    with pytest.raises(CheckpointError, match=r"'model.layers.1.mlp.experts.down_proj_bias' is missing"):
        patch_model(model, tmp_path / "ckpt")
    assert not any(isinstance(m, MoELayerExperts) for m in model.modules())


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    quantized_model("qwen3_moe", modelopt.LAYOUT, tmp_path / "ckpt", experts=8)
    import transformers

    other = transformers.AutoModelForCausalLM.from_config(tiny_config("qwen3_moe", experts=4))
    with pytest.raises(IntegrationError, match=r"layer 0: the checkpoint's experts \(E, H, I\)=\(8, 64, 32\) do not "
                       r"match the model's \(4, 64, 32\)"):
        patch_model(other, tmp_path / "ckpt")


def test_patching_chosen_layers_only(tmp_path):
    reference, _ = quantized_model("gpt_oss", gpt_oss.LAYOUT, tmp_path / "ckpt")
    model = copy.deepcopy(reference)
    assert sorted(patch_model(model, tmp_path / "ckpt", layers=[1])) == [1]
    assert type(model.model.layers[0].mlp.experts).__name__ == "GptOssExperts"
    assert isinstance(model.model.layers[1].mlp.experts, MoELayerExperts)
    with torch.no_grad():
        torch.testing.assert_close(model(PROMPT).logits, reference(PROMPT).logits, **tolerance("fp32_reordered"))
    with pytest.raises(IntegrationError, match=r"layers \[5\] have no experts in this gpt_oss model"):
        patch_model(copy.deepcopy(reference), tmp_path / "ckpt", layers=[5])
