"""MoEWeights: validation messages, padding (and its inverse), and running the reference on it."""
from __future__ import annotations

import pytest
import torch

from backends import formats
from backends.emulation import moe_forward
from backends.weights import KernelWeights, MoEWeights, global_scale_from_weight_scale_2

from layout_cases import assert_same_weights, random_layer
from tolerances import tolerance


def test_sizes_and_emulation_kwargs_run_the_reference():
    w = random_layer("mxfp4", experts=3, hidden=64, inter=32, finite_scales=True)
    assert (w.E, w.H, w.I) == (3, 64, 32)
    x = torch.randn(5, 64)
    out = moe_forward(x, router_logits=torch.randn(5, 3), top_k=2, **w.emulation_kwargs())
    assert out.shape == (5, 64) and torch.isfinite(out).all()


@pytest.mark.parametrize("field,value,needle", [
    ("w13", torch.zeros(3, 64, 32, dtype=torch.int8), "w13.dtype=torch.int8 must be torch.uint8"),
    ("w13_scale", torch.zeros(3, 64, 3, dtype=torch.uint8), "w13_scale.shape=(3, 64, 3) must be (3, 64, 2)"),
    ("w2_bias", torch.zeros(3, 64, dtype=torch.bfloat16), "w2_bias.dtype=torch.bfloat16 must be torch.float32"),
    ("gate_up", "rows", "gate_up='rows' must be one of"),
    ("format", "mxfp8", "format='mxfp8' must be one of"),
    ("w13_global_scale", torch.ones(3), "w13_global_scale must be None for format='mxfp4'"),
])
def test_bad_fields_name_the_tensor_and_the_fix(field, value, needle):
    w = random_layer("mxfp4", experts=3, hidden=64, inter=32)
    with pytest.raises((TypeError, ValueError), match="MoEWeights: ") as err:
        w.replace(**{field: value})
    assert needle in str(err.value)


def test_nvfp4_needs_global_scales():
    w = random_layer("nvfp4", experts=2, hidden=32, inter=16)
    with pytest.raises(TypeError, match="w2_global_scale must be a torch.Tensor of shape \\(2,\\)"):
        w.replace(w2_global_scale=None)


def test_block_size_divides_the_sizes():
    with pytest.raises(ValueError, match="intermediate size I .* must be a multiple of 32"):
        random_layer("mxfp4", experts=1, hidden=64, inter=16)


@pytest.mark.parametrize("gate_up", ["interleaved", "contiguous"])
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_pad_keeps_values_and_adds_zeros_and_unpad_inverts(fmt, gate_up):
    w = random_layer(fmt, experts=3, hidden=64, inter=32, gate_up=gate_up, finite_scales=True)
    p = w.pad(128, 96)
    assert (p.H, p.I) == (128, 96)
    assert_same_weights(p.unpad(64, 32), w)

    def dequant(t, s, gs):
        if fmt == "mxfp4":
            return formats.dequantize_mxfp4(t, s)
        return formats.dequantize_nvfp4(t, s, gs)

    dense = dequant(w.w13, w.w13_scale, w.w13_global_scale)
    dense_p = dequant(p.w13, p.w13_scale, p.w13_global_scale)
    if gate_up == "interleaved":
        gate, up = dense[:, 0::2], dense[:, 1::2]
        gate_p, up_p = dense_p[:, 0::2], dense_p[:, 1::2]
    else:
        gate, up = dense.chunk(2, dim=1)
        gate_p, up_p = dense_p.chunk(2, dim=1)
    exact = tolerance("exact")
    torch.testing.assert_close(gate_p[:, :32, :64], gate, **exact, equal_nan=True)
    torch.testing.assert_close(up_p[:, :32, :64], up, **exact, equal_nan=True)
    assert not gate_p[:, 32:].any() and not gate_p[:, :, 64:].any() and not up_p[:, 32:].any()
    b = p.w13_bias
    zero_bias_rows = b[:, 64:] if gate_up == "interleaved" else torch.cat((b[:, 32:96], b[:, 128:]), 1)
    assert zero_bias_rows.numel() == 3 * 128 and not zero_bias_rows.any()
    assert not p.w2_bias[:, 64:].any() and not p.w2[:, 64:].any() and not p.w2[:, :, 16:].any()


def test_padded_layer_computes_the_same_moe():
    w = random_layer("mxfp4", experts=4, hidden=64, inter=32, finite_scales=True)
    p = w.pad(96, 64)
    x = torch.randn(6, 64)
    logits = torch.randn(6, 4)
    ref = moe_forward(x, router_logits=logits, top_k=2, **w.emulation_kwargs())
    out = moe_forward(torch.nn.functional.pad(x, (0, 32)), router_logits=logits, top_k=2, **p.emulation_kwargs())
    torch.testing.assert_close(out[:, :64], ref, **tolerance("fp32_reordered"))
    assert not out[:, 64:].any()


@pytest.mark.parametrize("call,needle", [
    (lambda w: w.pad(48, 32), "hidden_size=48 must be an int multiple of 32"),
    (lambda w: w.pad(32, 32), "hidden_size=32 is smaller than the weights' 64"),
    (lambda w: w.unpad(128, 32), "hidden_size=128 is larger than the padded weights' 64"),
])
def test_bad_pad_sizes(call, needle):
    with pytest.raises(ValueError, match="MoEWeights: ") as err:
        call(random_layer("mxfp4", experts=1, hidden=64, inter=32))
    assert needle in str(err.value)


def test_meta_device_and_zero_experts():
    w = random_layer("nvfp4", experts=0, hidden=32, inter=16, gate_up="contiguous")
    assert_same_weights(w.pad(64, 32).unpad(32, 16), w)
    m = random_layer("mxfp4", experts=2, hidden=64, inter=32, device="meta")
    p = m.pad(128, 64)
    assert p.w13.device.type == "meta" and p.w13.shape == (2, 128, 64)


def test_global_scale_from_weight_scale_2():
    ws2 = torch.tensor([[0.5, 0.5], [0.25, 0.25]])
    assert torch.equal(global_scale_from_weight_scale_2(ws2), torch.tensor([2.0, 4.0]))
    with pytest.raises(ValueError, match="differs between w1 and w3 \\(first at expert 1"):
        global_scale_from_weight_scale_2(torch.tensor([[0.5, 0.5], [0.25, 0.5]]))


def test_kernel_weights_is_read_only_and_names_missing_tensors():
    kw = KernelWeights(layout="x", format="mxfp4", tensors={"w13": torch.zeros(1, 2, 3)}, hidden_size=64,
                       intermediate_size=32, padded_hidden_size=64, padded_intermediate_size=32, gate_up="contiguous")
    with pytest.raises(TypeError):
        kw.tensors["w2"] = torch.zeros(1)
    with pytest.raises(KeyError, match="has no tensor 'w2'; it has \\['w13'\\]"):
        kw["w2"]
    assert isinstance(MoEWeights, type)


def _with_code(w: MoEWeights, name: str, expert: int, code: int) -> MoEWeights:
    """`w` with one byte of a block-scale tensor set to `code`."""
    scales = getattr(w, name).view(torch.uint8).clone()
    scales[expert, 1, 0] = code
    return w.replace(**{name: scales.view(getattr(w, name).dtype)})


@pytest.mark.parametrize("fmt,name,code,needle", [
    ("mxfp4", "w13_scale", 255, "w13_scale[1] (expert 1) holds E8M0 code 255 (NaN)"),
    ("mxfp4", "w2_scale", 255, "w2_scale[1] (expert 1) holds E8M0 code 255 (NaN)"),
    ("nvfp4", "w13_scale", 0x7F, "w13_scale[1] (expert 1) holds E4M3 code 0x7f (nan)"),
    ("nvfp4", "w2_scale", 0xFF, "w2_scale[1] (expert 1) holds E4M3 code 0xff (nan)"),
    ("nvfp4", "w2_scale", 0xB8, "w2_scale[1] (expert 1) holds E4M3 code 0xb8 (-1.0), not a finite non-negative"),
])
def test_a_nan_or_negative_block_scale_is_refused_naming_tensor_and_expert(fmt, name, code, needle):
    w = random_layer(fmt, experts=3, hidden=64, inter=32)
    with pytest.raises(ValueError, match="MoEWeights: ") as err:
        _with_code(w, name, 1, code)
    assert needle in str(err.value) and "re-quantize it" in str(err.value)


def test_zero_block_scales_are_accepted():
    """Padding writes zero scales, and an all-zero block quantizes to one: 0 * 0 = 0, not a corrupt value."""
    w = random_layer("nvfp4", experts=2, hidden=64, inter=32)
    for code in (0x00, 0x80):
        assert _with_code(w, "w13_scale", 0, code).E == 2
    assert _with_code(random_layer("mxfp4", experts=2, hidden=64, inter=32), "w2_scale", 0, 0).E == 2


@pytest.mark.parametrize("name", ["w13_global_scale", "w2_global_scale", "w2_input_scale"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -2.0])
def test_global_and_input_scales_must_be_finite_and_positive(name, value):
    w = random_layer("nvfp4", experts=3, hidden=64, inter=32)
    t = getattr(w, name).clone()
    t[2] = value
    with pytest.raises(ValueError, match=rf"MoEWeights: {name}\[2\] \(expert 2\) holds {value!r}, not a finite "
                                         "positive number"):
        w.replace(**{name: t})


def test_the_scale_check_is_one_reduction_per_tensor(monkeypatch):
    """Cheap at load: one `any` per scale tensor when the checkpoint is sound (no per-expert loop)."""
    w = random_layer("nvfp4", experts=4, hidden=64, inter=32)
    calls = []
    real_any = torch.Tensor.any

    def counting_any(self, *args, **kwargs):
        calls.append(tuple(self.shape))
        return real_any(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "any", counting_any)
    w.replace()
    assert len(calls) == 6  # two block-scale tensors, two global and two input scales


def test_the_docstring_says_activations_are_not_checked():
    assert "does not check activations for NaN" in " ".join((MoEWeights.__doc__ or "").split())
