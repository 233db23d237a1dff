"""backends.emulation.moe_forward against a dense per-token reference written independently here.

The reference loops over tokens and their k experts with already-dequantized fp32 weights, so it
shares no routing/grouping code with the implementation. Both sides accumulate in fp32; they differ
only in summation order (batched vs per-token matmuls, index_add order), worth a few fp32 ulps of
the O(1..10) outputs, so fp32 comparisons use rtol=atol=1e-4 (about 1000 ulps of headroom, still
far below the ~1e-1 change any wrong gate/up split, clamp, bias or routing weight produces).
"""

import math

import pytest
import torch

from backends import emulation, formats

from conftest import DEVICES
from tolerances import tolerance

HIDDEN = 64
INTERMEDIATE = 64
FP32_TOL = tolerance("fp32_reordered")


# --------------------------------------------------------------------------- independent dense reference


def _silu(v):
    return v / (1.0 + torch.exp(-v))


def _gelu_erf(v):
    return 0.5 * v * (1.0 + torch.erf(v / math.sqrt(2.0)))


def _reference_activation(h, activation, layout, alpha=1.702, beta=1.0, limit=7.0):
    """h: one token's GEMM1 output [rows] -> [I]."""
    if activation == "silu_no_mul":
        return _silu(h)
    if activation == "gelu_no_mul":
        return _gelu_erf(h)
    if activation == "relu2_no_mul":
        return torch.where(h > 0, h * h, torch.zeros_like(h))
    half = h.shape[0] // 2
    gate, up = (h[0::2], h[1::2]) if layout == "interleaved" else (h[:half], h[half:])
    if activation == "silu":
        return _silu(gate) * up
    if activation == "gelu":
        return _gelu_erf(gate) * up
    if activation == "swigluoai":  # gpt-oss
        gate = torch.minimum(gate, torch.tensor(limit))
        up = torch.maximum(torch.minimum(up, torch.tensor(limit)), torch.tensor(-limit))
        return (up + beta) * gate * (1.0 / (1.0 + torch.exp(-alpha * gate)))
    assert activation == "swiglustep"
    return torch.minimum(_silu(gate), torch.tensor(limit)) * up.clamp(-limit, limit)


def _reference_routing(logits, top_k, renormalize):
    ids, weights = [], []
    for row in logits.tolist():
        order = sorted(range(len(row)), key=lambda e: -row[e])[:top_k]
        if renormalize:  # softmax over the selected k logits
            exps = [math.exp(row[e] - row[order[0]]) for e in order]
            weights.append([v / sum(exps) for v in exps])
        else:  # softmax over all experts, keep the selected probabilities
            exps = [math.exp(v - max(row)) for v in row]
            weights.append([exps[e] / sum(exps) for e in order])
        ids.append(order)
    return torch.tensor(ids), torch.tensor(weights)


def _reference_moe(x, w13, w2, b13, b2, ids, weights, activation="swigluoai", layout="interleaved", scheme=None):
    """Dense per-token loop; w13 [E, R, H], w2 [E, H, I] float32 already dequantized."""
    out = torch.zeros(x.shape[0], w2.shape[1])
    for t in range(x.shape[0]):
        token = formats.qdq_activation(x[t:t + 1].float(), scheme)[0]
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = w13[e] @ token + (b13[e] if b13 is not None else 0.0)
            a = _reference_activation(h, activation, layout)
            a = formats.qdq_activation(a.unsqueeze(0), scheme)[0]
            y = w2[e] @ a + (b2[e] if b2 is not None else 0.0)
            out[t] += float(weights[t, j]) * y
    return out


# --------------------------------------------------------------------------- quantized random experts


def _make_experts(fmt, experts, rows, intermediate=INTERMEDIATE, hidden=HIDDEN, seed=0, weight_std=0.3):
    """Return (kwargs for moe_forward, dequantized w13 [E,R,H], dequantized w2 [E,H,I]) in format fmt."""
    generator = torch.Generator().manual_seed(seed)
    w13 = torch.randn(experts, rows, hidden, generator=generator) * weight_std
    w2 = torch.randn(experts, hidden, intermediate, generator=generator) * weight_std
    kwargs = {"format": fmt}
    if fmt == "bf16":
        kwargs.update(w13=w13.bfloat16(), w13_scale=None, w2=w2.bfloat16(), w2_scale=None)
        return kwargs, w13.bfloat16().float(), w2.bfloat16().float()
    if fmt == "mxfp4":
        q13, q2 = formats.quantize_mxfp4(w13), formats.quantize_mxfp4(w2)
        deq13, deq2 = formats.dequantize_mxfp4(*q13), formats.dequantize_mxfp4(*q2)
    elif fmt == "nvfp4":
        gs13 = 2688.0 / w13.abs().amax(dim=(1, 2))
        gs2 = 2688.0 / w2.abs().amax(dim=(1, 2))
        q13 = formats.quantize_nvfp4(w13, global_scale=gs13)
        q2 = formats.quantize_nvfp4(w2, global_scale=gs2)
        deq13, deq2 = formats.dequantize_nvfp4(*q13), formats.dequantize_nvfp4(*q2)
        kwargs.update(w13_global_scale=q13[2], w2_global_scale=q2[2])
        q13, q2 = q13[:2], q2[:2]
    else:
        kind = fmt.split("_")[1]
        q13, q2 = formats.quantize_mxfp6(w13, kind=kind), formats.quantize_mxfp6(w2, kind=kind)
        deq13 = formats.dequantize_mxfp6(*q13, kind=kind)
        deq2 = formats.dequantize_mxfp6(*q2, kind=kind)
    kwargs.update(w13=q13[0], w13_scale=q13[1], w2=q2[0], w2_scale=q2[1])
    return kwargs, deq13, deq2


def _to_device(kwargs, device):
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}


def _inputs(tokens, experts, rows, seed=1):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, generator=generator)
    logits = torch.randn(tokens, experts, generator=generator) * 2.0
    b13 = torch.randn(experts, rows, generator=generator) * 0.5
    b2 = torch.randn(experts, HIDDEN, generator=generator) * 0.5
    return x, logits, b13, b2


# --------------------------------------------------------------------------- semantics


@pytest.mark.parametrize("device", DEVICES)
def test_gpt_oss_semantics_with_clamp_active(device):
    experts, top_k, tokens = 4, 2, 6
    weights, w13, w2 = _make_experts("mxfp4", experts, 2 * INTERMEDIATE, weight_std=0.6)
    x, logits, b13, b2 = _inputs(tokens, experts, 2 * INTERMEDIATE)
    pre_activation = torch.einsum("th,erh->ter", x, w13)
    assert (pre_activation.abs() > 7.0).any(), "data must exercise the swiglu_limit clamp"
    out = emulation.moe_forward(
        x.to(device), router_logits=logits.to(device), top_k=top_k, w13_bias=b13.to(device),
        w2_bias=b2.to(device), **_to_device(weights, device),
    )
    ids, route_w = _reference_routing(logits, top_k, renormalize=True)
    expected = _reference_moe(x, w13, w2, b13, b2, ids, route_w)
    assert out.dtype == torch.float32 and out.shape == (tokens, HIDDEN)
    torch.testing.assert_close(out.cpu(), expected, **FP32_TOL)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", emulation.ACTIVATIONS)
@pytest.mark.parametrize("layout", emulation.GATE_UP_LAYOUTS)
def test_every_activation_and_layout(device, activation, layout):
    if activation.endswith("_no_mul") and layout == "contiguous":
        pytest.skip("non-gated activations have no gate/up split; covered by the interleaved case")
    experts, top_k, tokens = 4, 2, 5
    rows = INTERMEDIATE if activation.endswith("_no_mul") else 2 * INTERMEDIATE
    weights, w13, w2 = _make_experts("mxfp4", experts, rows, weight_std=0.5)
    x, logits, b13, b2 = _inputs(tokens, experts, rows)
    out = emulation.moe_forward(
        x.to(device), router_logits=logits.to(device), top_k=top_k, activation=activation,
        gate_up_layout=layout, w13_bias=b13.to(device), w2_bias=b2.to(device), **_to_device(weights, device),
    )
    ids, route_w = _reference_routing(logits, top_k, renormalize=True)
    expected = _reference_moe(x, w13, w2, b13, b2, ids, route_w, activation=activation, layout=layout)
    torch.testing.assert_close(out.cpu(), expected, **FP32_TOL)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", emulation.WEIGHT_FORMATS)
def test_every_weight_format(device, fmt):
    experts, top_k, tokens = 4, 2, 5
    weights, w13, w2 = _make_experts(fmt, experts, 2 * INTERMEDIATE)
    x, logits, b13, b2 = _inputs(tokens, experts, 2 * INTERMEDIATE)
    out = emulation.moe_forward(
        x.to(device), router_logits=logits.to(device), top_k=top_k, w13_bias=b13.to(device),
        w2_bias=b2.to(device), **_to_device(weights, device),
    )
    ids, route_w = _reference_routing(logits, top_k, renormalize=True)
    torch.testing.assert_close(out.cpu(), _reference_moe(x, w13, w2, b13, b2, ids, route_w), **FP32_TOL)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scheme", ["mxfp4", "mxfp6_e3m2", "mxfp6_e2m3", "fp8"])
def test_activation_fake_quantization(device, scheme):
    experts, top_k, tokens = 4, 2, 5
    weights, w13, w2 = _make_experts("mxfp4", experts, 2 * INTERMEDIATE)
    x, logits, _, _ = _inputs(tokens, experts, 2 * INTERMEDIATE)
    out = emulation.moe_forward(
        x.to(device), router_logits=logits.to(device), top_k=top_k, activation_scheme=scheme,
        **_to_device(weights, device),
    )
    ids, route_w = _reference_routing(logits, top_k, renormalize=True)
    expected = _reference_moe(x, w13, w2, None, None, ids, route_w, scheme=scheme)
    unquantized = _reference_moe(x, w13, w2, None, None, ids, route_w)
    torch.testing.assert_close(out.cpu(), expected, **FP32_TOL)
    assert not torch.allclose(out.cpu(), unquantized, **FP32_TOL)  # the QDQ really happened


def test_nvfp4_activation_scheme_single_token():
    # NVFP4's dynamic global scale is per tensor, so the per-token reference only matches at T=1, k=1
    weights, w13, w2 = _make_experts("nvfp4", 3, 2 * INTERMEDIATE)
    x, _, _, _ = _inputs(1, 3, 2 * INTERMEDIATE)
    ids, route_w = torch.tensor([[2]]), torch.tensor([[1.0]])
    out = emulation.moe_forward(x, topk_ids=ids, topk_weights=route_w, activation_scheme="nvfp4", **weights)
    torch.testing.assert_close(out, _reference_moe(x, w13, w2, None, None, ids, route_w, scheme="nvfp4"), **FP32_TOL)


def test_renormalize_false_uses_full_softmax():
    experts, top_k, tokens = 6, 2, 4
    weights, w13, w2 = _make_experts("mxfp4", experts, 2 * INTERMEDIATE)
    x, logits, _, _ = _inputs(tokens, experts, 2 * INTERMEDIATE)
    out = emulation.moe_forward(x, router_logits=logits, top_k=top_k, renormalize=False, **weights)
    ids, route_w = _reference_routing(logits, top_k, renormalize=False)
    assert (route_w.sum(-1) < 0.999).all()  # weights really are not renormalized in this data
    torch.testing.assert_close(out, _reference_moe(x, w13, w2, None, None, ids, route_w), **FP32_TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_topk_ids_path_empty_experts_and_dequantize_once(device, monkeypatch):
    experts, tokens = 8, 5
    weights, w13, w2 = _make_experts("mxfp4", experts, 2 * INTERMEDIATE)
    x, _, _, _ = _inputs(tokens, experts, 2 * INTERMEDIATE)
    ids = torch.tensor([[3, 0], [0, 3], [3, 3], [0, 5], [5, 3]])  # experts 1, 2, 4, 6, 7 receive nothing
    route_w = torch.tensor([[0.7, 0.3], [0.5, 0.5], [0.2, 0.8], [1.0, 0.0], [0.25, 0.75]])
    calls = []
    real = formats.dequantize_mxfp4
    monkeypatch.setattr(formats, "dequantize_mxfp4", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = emulation.moe_forward(
        x.to(device), topk_ids=ids.to(device), topk_weights=route_w.to(device), **_to_device(weights, device)
    )
    assert len(calls) == 2 * 3  # w13 and w2 of the 3 active experts, once each
    torch.testing.assert_close(out.cpu(), _reference_moe(x, w13, w2, None, None, ids, route_w), **FP32_TOL)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tokens, experts, top_k", [(1, 4, 2), (3, 1, 1), (4, 3, 3), (0, 4, 2)])
def test_edge_shapes(device, tokens, experts, top_k):
    weights, w13, w2 = _make_experts("mxfp4", experts, 2 * INTERMEDIATE)
    x, logits, b13, b2 = _inputs(tokens, experts, 2 * INTERMEDIATE)
    out = emulation.moe_forward(
        x.to(device).bfloat16(), router_logits=logits.to(device), top_k=top_k, w13_bias=b13.to(device),
        w2_bias=b2.to(device), **_to_device(weights, device),
    )
    assert out.shape == (tokens, HIDDEN) and out.dtype == torch.bfloat16
    ids, route_w = _reference_routing(logits, top_k, renormalize=True)
    expected = _reference_moe(x.bfloat16().float(), w13, w2, b13, b2, ids, route_w)
    # bf16 output: one rounding of the fp32 result, at most half a bf16 ulp = 2^-9 relative; rtol 2^-8 adds headroom
    torch.testing.assert_close(out.cpu().float(), expected, **tolerance("bf16_output_of_fp32"))


# --------------------------------------------------------------------------- bad input


def _good_call_kwargs():
    weights, _, _ = _make_experts("mxfp4", 2, 2 * INTERMEDIATE)
    x, logits, _, _ = _inputs(3, 2, 2 * INTERMEDIATE)
    return dict(x=x, router_logits=logits, top_k=1, **weights)


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda kw: kw.update(x=kw["x"][:, :32]), ValueError,
         r"moe_forward: w13.shape=\(2, 128, 32\) must be \(2, 128, 16\)"),
        (lambda kw: kw.update(x=kw["x"].double()), TypeError, r"moe_forward: x.dtype=torch.float64 must be bfloat16"),
        (lambda kw: kw.update(x=kw["x"][None]), ValueError, r"moe_forward: x.shape=\(1, 3, 64\) must be 2-D"),
        (lambda kw: kw.update(w13_scale=kw["w13_scale"][:, :, :1]), ValueError,
         r"moe_forward: w13_scale.shape=\(2, 128, 1\) must be \(2, 128, 2\)"),
        (lambda kw: kw.update(w2_scale=kw["w2_scale"].float()), TypeError,
         r"moe_forward: w2_scale.dtype=torch.float32 must be torch.uint8"),
        (lambda kw: kw.update(topk_ids=torch.zeros(3, 1, dtype=torch.long), topk_weights=torch.ones(3, 1)), ValueError,
         r"moe_forward: pass exactly one routing input"),
        (lambda kw: kw.pop("router_logits"), ValueError, r"moe_forward: pass exactly one routing input"),
        (lambda kw: kw.update(top_k=3), ValueError, r"moe_forward: top_k=3 must be an int in \[1, 2\]"),
        (lambda kw: kw.update(router_logits=None, topk_ids=torch.full((3, 1), 2), topk_weights=torch.ones(3, 1)),
         ValueError, r"moe_forward: topk_ids must lie in \[0, 2\)"),
        (lambda kw: kw.update(format="nvfp4"), TypeError, r"moe_forward: w13_scale.dtype=torch.uint8 must be torch.float8_e4m3fn"),
        (lambda kw: kw.update(activation="swish"), ValueError, r"moe_forward: activation='swish' must be one of"),
        (lambda kw: kw.update(gate_up_layout="rows"), ValueError, r"moe_forward: gate_up_layout='rows' must be one of"),
        (lambda kw: kw.update(w2_bias=torch.zeros(2, 63)), ValueError, r"moe_forward: w2_bias.shape=\(2, 63\) must be \(2, 64\)"),
        (lambda kw: kw.update(activation_scheme="int4"), ValueError, r"moe_forward: activation_scheme='int4' must be one of"),
    ],
)
def test_bad_input_messages(change, error, message):
    kwargs = _good_call_kwargs()
    change(kwargs)
    x = kwargs.pop("x")
    with pytest.raises(error, match=message):
        emulation.moe_forward(x, **kwargs)


def test_nvfp4_requires_per_expert_global_scales():
    weights, _, _ = _make_experts("nvfp4", 2, 2 * INTERMEDIATE)
    weights["w2_global_scale"] = None
    x, logits, _, _ = _inputs(3, 2, 2 * INTERMEDIATE)
    with pytest.raises(ValueError, match=r"moe_forward: w2_global_scale must be a float32 tensor of shape \(2,\)"):
        emulation.moe_forward(x, router_logits=logits, top_k=1, **weights)
