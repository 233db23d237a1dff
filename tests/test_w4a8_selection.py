"""W4A8 in the moe-oracle profile: the rules pick TRITON_MOE_W4A8 only when the question asks FP8 activations
(moe.activation_key / moe.user_activation_key, or Quark's w_mxfp4_a_fp8), fall to EMULATION with the reason where
no FP8 tensor cores are, `explain` says why; MoELayer builds the W4A8 runner from the decision.

The runner's plumbing is checked with a recording fake kernel function; the real kernels run in a
TRITON_INTERPRET=1 worker."""

from __future__ import annotations

import json

import pytest
import torch

from backends import emulation, formats
from backends.layer import LayerUnavailableError, MoELayer
from backends.weights import MoEWeights
from oracle.cli import main

from conftest import interpreter_worker_rows, requires_cuda
from tolerances import tolerance

FP8_KEYS = {"kMxfp8Dynamic": "mxfp8", "kFp8StaticTensorSym": "fp8_per_tensor_static"}
KINDS = {("mxfp4", "kMxfp8Dynamic"): "w4a8-mxfp8", ("mxfp4", "kFp8StaticTensorSym"): "w4a8-fp8-static",
         ("nvfp4", "kMxfp8Dynamic"): "nvfp4-w4a8-mxfp8", ("nvfp4", "kFp8StaticTensorSym"): "nvfp4-w4a8-fp8-static"}
POLICY_FAMILY = {"mxfp4": "mxfp4", "mxfp4-gpt-oss": "mxfp4", "nvfp4": "nvfp4"}


def question(policy: str, capability=(9, 0), **moe) -> dict:
    platform = {"kind": "cpu"} if capability is None else {"kind": "cuda", "capability": list(capability)}
    return {"policy": policy, "profile": "moe-oracle", "platform": platform, "packages": {"triton": True},
            "moe": moe}


# --------------------------------------------------------------------------------------------
# The rules
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", sorted(POLICY_FAMILY))
@pytest.mark.parametrize("key", sorted(FP8_KEYS))
@pytest.mark.parametrize("field", ["activation_key", "user_activation_key"])
def test_an_fp8_key_selects_w4a8_with_its_kind(oracle, policy, key, field):
    d = oracle.select(question(policy, **{field: key}))
    assert (d.outcome, d.backend, d.kernel, d.activation_key) == ("selected", "TRITON_MOE_W4A8", "TritonMoeW4A8", key)
    assert d.quant_config["kind"] == KINDS[POLICY_FAMILY[policy], key]
    assert d.converter == "backends.layouts.triton_moe:converter_w4a8"
    assert d.runner == "backends.runners.triton_moe:TritonMoEW4A8Runner"
    assert d.extras["fp8_activations"] == key


@pytest.mark.parametrize("policy", sorted(POLICY_FAMILY))
@pytest.mark.parametrize("capability", [(8, 0), (9, 0), (10, 0), (12, 0)])
def test_bf16_questions_stay_w4a16(oracle, policy, capability):
    d = oracle.select(question(policy, capability))
    assert (d.backend, d.kernel, d.activation_key) == ("TRITON_MOE", "TritonMoeW4A16", None)
    assert "fp8_activations" not in d.extras and d.quant_config["activation"] is None


@pytest.mark.parametrize("capability", [(8, 0), (8, 6)])
@pytest.mark.parametrize("key", sorted(FP8_KEYS))
def test_fp8_without_fp8_tensor_cores_falls_to_emulation_with_the_reason(oracle, capability, key):
    d = oracle.select(question("nvfp4", capability, activation_key=key))
    assert (d.backend, d.activation_key, d.quant_config["kind"]) == ("EMULATION", key, KINDS["nvfp4", key])
    rejected = {e["candidate"]: e for e in d.to_dict()["trace"] if "candidate" in e and not e["accepted"]}
    assert "8.9" in json.dumps(rejected["TRITON_MOE_W4A8"]["failed"]), rejected["TRITON_MOE_W4A8"]
    assert [f["check"] for f in rejected["TRITON_MOE_W4A8"]["failed"]] == ["device"]
    assert key in json.dumps(rejected["TRITON_MOE"]), "W4A16 must be refused for the FP8 key, never run instead"


def test_sm89_has_fp8_tensor_cores(oracle):
    assert oracle.select(question("mxfp4", (8, 9), activation_key="kMxfp8Dynamic")).backend == "TRITON_MOE_W4A8"


def test_cpu_runs_w4a8_only_under_the_interpreter(oracle):
    q = question("mxfp4", None, activation_key="kMxfp8Dynamic")
    assert oracle.select(q).backend == "EMULATION"
    assert oracle.select({**q, "env": {"TRITON_INTERPRET": "1"}}).backend == "TRITON_MOE_W4A8"


def test_conflicting_keys_are_invalid_and_other_keys_unsupported(oracle):
    d = oracle.select(question("mxfp4", activation_key="kMxfp8Dynamic", user_activation_key="kFp8StaticTensorSym"))
    assert d.outcome == "invalid" and "quantization_config.moe.activation" in d.error
    d = oracle.select(question("nvfp4", activation_key="kNvfp4Dynamic"))
    assert d.outcome == "unsupported" and "kNvfp4Dynamic" in d.error


def test_explicit_backends_are_refused_for_the_other_activations(oracle):
    d = oracle.select(question("mxfp4", activation_key="kMxfp8Dynamic", moe_backend="triton"))
    assert d.outcome == "invalid" and "kMxfp8Dynamic" in d.error
    d = oracle.select(question("mxfp4", moe_backend="triton_w4a8"))
    assert d.outcome == "invalid" and "TRITON_MOE_W4A8" in d.error
    d = oracle.select(question("mxfp4", activation_key="kFp8StaticTensorSym", moe_backend="triton_w4a8"))
    assert d.backend == "TRITON_MOE_W4A8" and d.quant_config["kind"] == "w4a8-fp8-static"


QUARK_W4A8 = {"weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0"},
              "input": {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False}}


@pytest.mark.parametrize("capability,backend", [((9, 0), "TRITON_MOE_W4A8"), ((8, 0), "EMULATION")])
def test_quark_w_mxfp4_a_fp8_runs_w4a8_where_fp8_tensor_cores_are(oracle, capability, backend):
    d = oracle.select({**question("ocp-mx", capability), "quark": QUARK_W4A8})
    assert (d.backend, d.activation_key) == (backend, "kFp8StaticTensorSym")
    assert d.extras["ocp_mx_scheme"] == "w_mxfp4_a_fp8" and d.extras["static_input_scales"] is True
    assert d.quant_config["kind"] == "ocp-mx-w4a8" and d.quant_config["input_scales"] == "static"


# --------------------------------------------------------------------------------------------
# explain
# --------------------------------------------------------------------------------------------

def explain(capsys, tmp_path, q) -> str:
    path = tmp_path / "q.json"
    path.write_text(json.dumps(q))
    code = main(["explain", "--scenario", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_explain_names_the_key_that_asked_fp8(capsys, tmp_path):
    out = explain(capsys, tmp_path, question("mxfp4", user_activation_key="kMxfp8Dynamic"))
    assert "=> selected TRITON_MOE_W4A8, kernel TritonMoeW4A8, activations kMxfp8Dynamic" in out
    assert "* step fp8-activations" in out and "quant_config w4a8-mxfp8" in out
    assert "it does not run kMxfp4Static weights with kMxfp8Dynamic activations" in out  # why not W4A16


def test_explain_names_why_w4a8_was_rejected(capsys, tmp_path):
    out = explain(capsys, tmp_path, question("nvfp4", (8, 0), activation_key="kFp8StaticTensorSym"))
    assert "=> selected EMULATION" in out and "activations kFp8StaticTensorSym" in out
    block = out[out.index("TRITON_MOE_W4A8 / TritonMoeW4A8"):out.index("EMULATION / EmulationMoe")]
    assert "rejected" in out[out.index("TRITON_MOE_W4A8 / TritonMoeW4A8") - 30:][:40]
    assert "platform.capability 8.0 is below 8.9" in block and "triton_fp8_runs_here" in block


def test_explain_of_a_bf16_question_says_no_fp8_was_asked(capsys, tmp_path):
    out = explain(capsys, tmp_path, question("mxfp4"))
    assert "=> selected TRITON_MOE, kernel TritonMoeW4A16, activations bf16" in out
    assert "- step fp8-activations when requested_activation_key is null: false" in out


# --------------------------------------------------------------------------------------------
# MoELayer -> TritonMoEW4A8Runner (fake kernel function) and the EMULATION fallback
# --------------------------------------------------------------------------------------------

E, H, INTER, TOP_K = 4, 64, 64, 2


def layer_weights(fmt: str, *, input_scales: bool = True, seed: int = 0) -> MoEWeights:
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(E, 2 * INTER, H, generator=gen) / H ** 0.5
    w2 = torch.randn(E, H, INTER, generator=gen) / INTER ** 0.5
    scales = {}
    if input_scales:
        scales = {"w13_input_scale": torch.rand(E, 2, generator=gen) * 0.02 + 0.01,
                  "w2_input_scale": torch.rand(E, generator=gen) * 0.02 + 0.01}
    if fmt == "mxfp4":
        (q13, s13), (q2, s2) = formats.quantize_mxfp4(w13), formats.quantize_mxfp4(w2)
        return MoEWeights(format="mxfp4", w13=q13, w13_scale=s13, w2=q2, w2_scale=s2, **scales)
    g13 = (448 * 6 / w13.abs().amax(dim=(1, 2))).float()
    g2 = (448 * 6 / w2.abs().amax(dim=(1, 2))).float()
    (q13, s13, g13), (q2, s2, g2) = formats.quantize_nvfp4(w13, g13), formats.quantize_nvfp4(w2, g2)
    return MoEWeights(format="nvfp4", w13=q13, w13_scale=s13, w2=q2, w2_scale=s2, w13_global_scale=g13,
                      w2_global_scale=g2, **scales)


def build(weights: MoEWeights, key: str | None, *, interpret: bool) -> MoELayer:
    return MoELayer.from_checkpoint(weights, activation="swigluoai", top_k=TOP_K, device="cpu",
                                    platform={"kind": "cpu"}, packages={"triton": True},
                                    env={"TRITON_INTERPRET": "1"} if interpret else {}, activation_key=key)


@pytest.fixture
def fake_kernel(monkeypatch):
    """backends.triton_moe.forward.moe_forward replaced by a recorder with the agreed signature."""
    pytest.importorskip("triton", reason="the W4A8 runner imports backends.triton_moe")
    import backends.triton_moe.forward as forward

    calls = []

    def moe_forward(x, weights, *, router_logits=None, topk_ids=None, topk_weights=None, top_k=None,
                    renormalize=True, activation="swigluoai", swiglu_alpha=1.702, swiglu_beta=1.0, swiglu_limit=7.0,
                    deterministic=False, act_quant=None, a1_scale=None, a2_scale=None):
        calls.append(dict(act_quant=act_quant, a1_scale=a1_scale, a2_scale=a2_scale, weights=weights))
        return torch.zeros_like(x)

    monkeypatch.setattr(forward, "moe_forward", moe_forward)
    return calls


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("key", sorted(FP8_KEYS))
def test_moelayer_runs_w4a8_with_the_scheme_and_scales_of_the_decision(fake_kernel, fmt, key):
    weights = layer_weights(fmt)
    layer = build(weights, key, interpret=True)
    assert layer.decision.backend == "TRITON_MOE_W4A8" and "TRITON_MOE_W4A8" in layer.explain()
    x = torch.randn(3, H, dtype=torch.bfloat16)
    layer.forward(x, torch.randn(3, E))
    (call,) = fake_kernel
    assert call["act_quant"] == FP8_KEYS[key]
    # W4A8 runs the W4A16 kernels on either format: the layer holds no FP8-dot row data (a second weight copy)
    assert call["weights"].w13_row_exp is None and call["weights"].w13_fp8 is None
    if key == "kFp8StaticTensorSym":
        assert float(call["a1_scale"]) == float(weights.w13_input_scale.max())
        assert float(call["a2_scale"]) == float(weights.w2_input_scale.max())
        assert call["a1_scale"].shape == (1,) and call["a1_scale"].dtype == torch.float32
    else:
        assert call["a1_scale"] is None and call["a2_scale"] is None


def test_static_fp8_without_input_scales_is_one_clear_error(fake_kernel):
    weights = layer_weights("mxfp4", input_scales=False)
    for interpret in (True, False):  # TRITON_MOE_W4A8, then EMULATION: both need the scales
        with pytest.raises(ValueError, match="static input scales.*w13_input_scale=None.*kMxfp8Dynamic"):
            build(weights, "kFp8StaticTensorSym", interpret=interpret)
    assert build(weights, "kMxfp8Dynamic", interpret=True).decision.backend == "TRITON_MOE_W4A8"


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("key", sorted(FP8_KEYS))
def test_emulation_fallback_fake_quantizes_fp8(fmt, key):
    weights = layer_weights(fmt)
    layer = build(weights, key, interpret=False)
    assert layer.decision.backend == "EMULATION"
    gen = torch.Generator().manual_seed(1)
    x, logits = torch.randn(5, H, generator=gen), torch.randn(5, E, generator=gen)
    y = layer.forward(x, logits)
    scheme = FP8_KEYS[key]
    scales = {}
    if scheme == "fp8_per_tensor_static":
        scales = dict(a1_scale=weights.w13_input_scale.max().reshape(1), a2_scale=weights.w2_input_scale.max().reshape(1))
    ref = emulation.moe_forward(x, **weights.emulation_kwargs(), router_logits=logits, top_k=TOP_K,
                                activation="swigluoai", gemm_input_schemes=(scheme, scheme), **scales)
    w4a16 = emulation.moe_forward(x, **weights.emulation_kwargs(), router_logits=logits, top_k=TOP_K,
                                  activation="swigluoai")
    assert torch.equal(y, ref)
    assert not torch.equal(y, w4a16), "FP8 activations must change the output (else nothing was quantized)"


# --------------------------------------------------------------------------------------------
# The real kernels under Triton's interpreter, through MoELayer
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_interpreter_moelayer_w4a8_matches_the_emulation(fmt):
    """Against the emulation's fake quantization, which the kernels compute on bf16 tensor cores for either format
    (forward.resolve_w4a8_mma)."""
    pytest.importorskip("triton", reason="triton is not installed; the Triton MoE kernels cannot run")
    rows = interpreter_worker_rows(__file__, (fmt,))
    for key in FP8_KEYS:
        row = rows[f"{fmt}-{key}"]
        assert "error" not in row, row.get("error")
        assert row["backend"] == "TRITON_MOE_W4A8"
        assert row["rel_l2"] <= tolerance("w4a8_moe_rel_l2")["rtol"], row
        assert row["differs_from_w4a16"], row


def _worker(fmt: str) -> None:
    for key, scheme in FP8_KEYS.items():
        weights = layer_weights(fmt)
        layer = build(weights, key, interpret=True)
        gen = torch.Generator().manual_seed(2)
        x = torch.randn(6, H, generator=gen).to(torch.bfloat16)
        logits = torch.randn(6, E, generator=gen)
        y = layer.forward(x, logits).float()
        scales = {}
        if scheme == "fp8_per_tensor_static":
            scales = dict(a1_scale=weights.w13_input_scale.max().reshape(1),
                          a2_scale=weights.w2_input_scale.max().reshape(1))
        ref = emulation.moe_forward(x, **weights.emulation_kwargs(), router_logits=logits, top_k=TOP_K,
                                    activation="swigluoai", gemm_input_schemes=(scheme, scheme),
                                    **scales).float()
        w4a16 = emulation.moe_forward(x, **weights.emulation_kwargs(), router_logits=logits, top_k=TOP_K,
                                      activation="swigluoai").float()
        rel = float((y - ref).norm() / ref.norm().clamp_min(1e-30))
        print(json.dumps({"case": f"{fmt}-{key}", "backend": layer.decision.backend, "rel_l2": rel,
                          "differs_from_w4a16": not torch.equal(ref, w4a16)}), flush=True)


if __name__ == "__main__":  # the TRITON_INTERPRET=1 worker of test_interpreter_moelayer_w4a8_matches_the_emulation
    import sys

    _worker(sys.argv[1])


def test_quark_w_mxfp4_a_fp8_layer_runs_the_w4a8_runner_with_its_static_scales(fake_kernel):
    """A Quark w_mxfp4_a_fp8 layer where TRITON_MOE_W4A8 is selected (CPU + interpreter): the runner gets
    act_quant='fp8_per_tensor_static' and the layer's reduced static input scales as a1/a2."""
    import test_quark as q

    layer = q.QuarkOCPMXMoE.create(q.quant_config(*q.SCHEMES["w_mxfp4_a_fp8"]), q.E, q.H, q.I, top_k=q.TOP_K,
                                   platform=q.CPU, packages={**q.NO_PACKAGES, "triton": True},
                                   env={"TRITON_INTERPRET": "1"}, profile="moe-oracle")
    assert layer.decision.backend == "TRITON_MOE_W4A8"
    gen = torch.Generator().manual_seed(5)
    q._load_and_process(layer, q._random_checkpoint("mxfp4", gen, False), q.STATIC_SCALES)
    layer.forward(torch.randn(3, q.H, generator=gen), torch.randn(3, q.E, generator=gen))
    (call,) = fake_kernel
    assert call["act_quant"] == "fp8_per_tensor_static"
    assert (float(call["a1_scale"]), float(call["a2_scale"])) == q.STATIC_SCALES


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("key", sorted(FP8_KEYS))
def test_cuda_moelayer_w4a8_matches_the_emulation(fmt, key):
    """On an SM89+ GPU the rules give an FP8 question TRITON_MOE_W4A8 and MoELayer runs the real kernels."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tensor cores need compute capability >= 8.9")
    weights = layer_weights(fmt)
    layer = MoELayer.from_checkpoint(weights, activation="swigluoai", top_k=TOP_K, device="cuda",
                                     activation_key=key)
    assert layer.decision.backend == "TRITON_MOE_W4A8"
    gen = torch.Generator().manual_seed(3)
    x, logits = torch.randn(40, H, generator=gen).bfloat16(), torch.randn(40, E, generator=gen)
    y = layer.forward(x.cuda(), logits.cuda()).float().cpu()
    scheme = FP8_KEYS[key]
    scales = {}
    if scheme == "fp8_per_tensor_static":
        scales = dict(a1_scale=weights.w13_input_scale.max().reshape(1), a2_scale=weights.w2_input_scale.max().reshape(1))
    ref = emulation.moe_forward(x, **weights.emulation_kwargs(), router_logits=logits, top_k=TOP_K,
                                activation="swigluoai", gemm_input_schemes=(scheme, scheme),
                                **scales).float()
    assert float((y - ref).norm() / ref.norm()) <= tolerance("w4a8_moe_rel_l2")["rtol"]


def test_the_act_scheme_comes_from_the_quant_config_kind():
    from backends.runners.emulation import fp8_input_schemes
    from backends.runners.triton_moe import act_quant_of

    mxfp8 = {"kind": "w4a8-mxfp8", "activation": "mxfp8"}
    static = {"kind": "w4a8-fp8-static", "activation": "fp8", "input_scales": "static",
              "emulated_activation": {"gemm1": "fp8_per_tensor_static", "gemm2": "fp8_per_tensor_static"}}
    assert (act_quant_of(mxfp8), act_quant_of(static)) == ("mxfp8", "fp8_per_tensor_static")
    assert fp8_input_schemes(mxfp8) == ("mxfp8", "mxfp8")
    assert fp8_input_schemes(static) == ("fp8_per_tensor_static", "fp8_per_tensor_static")
    for not_fp8 in (None, {"kind": "w4a16", "activation": None}, {"kind": "ocp-mx", "activation": "mxfp4"}):
        assert fp8_input_schemes(not_fp8) is None
        with pytest.raises(ValueError, match="not an FP8 activation scheme of the W4A8 kernels"):
            act_quant_of(not_fp8)
    with pytest.raises(ValueError, match="not an FP8 activation scheme"):  # fp8 without static scales: no kernel
        act_quant_of({"kind": "dynamic-fp8", "activation": "fp8"})


def test_a_runner_without_fp8_refuses_an_fp8_decision(oracle):
    """vLLM 0.33's EMULATION kind quantizes to MXFP4, not FP8: a layer refuses its FP8 question (never runs W4A16);
    moe-oracle's EMULATION kind for the same question is FP8 and runs."""
    from backends.layer import require_runnable

    q = {"policy": "mxfp4", "profile": "vllm-0.33", "platform": {"kind": "cuda", "capability": [8, 0]},
         "packages": {"quark": True}, "moe": {"activation_key": "kMxfp8Dynamic"}}
    d = oracle.select(q)
    assert (d.backend, d.activation_key, d.quant_config["activation"]) == ("EMULATION", "kMxfp8Dynamic", "mxfp4")
    with pytest.raises(LayerUnavailableError, match="quantizes activations \\(kMxfp8Dynamic\\); its runner runs W4A16"):
        require_runnable(oracle, d, q)
    ours = {**question("mxfp4", (8, 0), activation_key="kMxfp8Dynamic")}
    require_runnable(oracle, oracle.select(ours), ours)
