"""backends.MoELayer: checkpoint -> decision under a profile -> padded/converted weights -> output.

The layer adds selection, padding and argument checks around the runner the rules name, so its
output is compared with `backends.emulation.moe_forward` called directly on the unpadded
checkpoint: exactly equal when nothing is padded (same function, same arguments), within
`fp32_reordered` when zero rows/columns were padded in (the GEMMs sum more, zero, terms).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from random_weights import random_moe_weights

from backends import LayerUnavailableError, MoELayer, emulation
from backends import layer as layer_module
from backends.weights import MoEWeights
from oracle import Oracle
from oracle.log import DecisionLog

from conftest import requires_cuda
from tolerances import tolerance

RULES = Path(__file__).resolve().parents[1] / "rules"
NATIVE_FILE = RULES / "moe-oracle" / "w4a16.yaml"
CPU = {"kind": "cpu"}
NO_PACKAGES: dict = {}  # a deterministic question: nothing optional installed, no env var set
EXACT = tolerance("exact")
FP32_TOL = tolerance("fp32_reordered")


# --------------------------------------------------------------------------- rules under test
def _rules_copy(root: Path, extra_profiles: dict) -> Path:
    """The shipped rules plus `extra_profiles` ({name: (description, {relative file: text})})."""
    shutil.copytree(RULES, root)
    index = yaml.safe_load((root / "profiles.yaml").read_text())
    for name, (description, files) in extra_profiles.items():
        for rel, text in files.items():
            (root / rel).write_text(text)
        index["profiles"][name] = {"description": description,
                                   "files": ["common/platform.yaml", *files]}
    (root / "profiles.yaml").write_text(yaml.safe_dump(index, sort_keys=False))
    return root


@pytest.fixture(scope="module")
def rules(tmp_path_factory) -> Oracle:
    """The shipped rules, plus 'padded': the native profile where EMULATION pads like TRITON_MOE."""
    native = NATIVE_FILE.read_text()
    anchor = "- {backends: [TRITON_MOE, TRITON_MOE_W4A8], "
    assert native.count(anchor) == 2, "the native round_up rows changed; update this fixture"
    padded = native.replace(anchor, "- {backends: [TRITON_MOE, TRITON_MOE_W4A8, EMULATION], ")
    extra = {"padded": ("native rules, EMULATION padded like TRITON_MOE", {"moe-oracle/padded.yaml": padded})}
    return Oracle(_rules_copy(tmp_path_factory.mktemp("rules") / "rules", extra))


# --------------------------------------------------------------------------- checkpoints
_checkpoint = random_moe_weights


def _inputs(weights: MoEWeights, tokens=7, dtype=torch.bfloat16, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, weights.H, generator=g).to(dtype)
    logits = torch.randn(tokens, weights.E, generator=g)
    return x, logits


def _build(rules, weights, *, profile="moe-oracle", activation="swigluoai", top_k=2, **kw) -> MoELayer:
    kw.setdefault("platform", CPU)
    kw.setdefault("packages", NO_PACKAGES)
    kw.setdefault("env", {})
    return MoELayer.from_checkpoint(weights, activation=activation, top_k=top_k, profile=profile, oracle=rules, **kw)


GPT_OSS = {"fmt": "mxfp4", "gate_up": "interleaved", "bias": True, "activation": "swigluoai"}
GENERIC_NVFP4 = {"fmt": "nvfp4", "gate_up": "contiguous", "bias": False, "activation": "silu"}


# --------------------------------------------------------------------------- output equals the emulation
@pytest.mark.parametrize("case", [GPT_OSS, GENERIC_NVFP4], ids=["gpt-oss-mxfp4-swigluoai", "generic-nvfp4-silu"])
@pytest.mark.parametrize("renormalize", [True, False])
def test_forward_equals_emulation_on_the_checkpoint(rules, case, renormalize):
    weights = _checkpoint(case["fmt"], case["gate_up"], bias=case["bias"])
    layer = _build(rules, weights, activation=case["activation"], top_k=2, renormalize=renormalize,
                   swiglu_alpha=1.5, swiglu_limit=3.0)
    assert (layer.decision.backend, layer.decision.runner) == ("EMULATION", "backends.runners.emulation:EmulationRunner")
    x, logits = _inputs(weights)
    expected = emulation.moe_forward(x, **weights.emulation_kwargs(), router_logits=logits, top_k=2,
                                     renormalize=renormalize, activation=case["activation"], swiglu_alpha=1.5,
                                     swiglu_limit=3.0)
    torch.testing.assert_close(layer.forward(x, logits), expected, **EXACT)
    # given routing (the same top-k and weights, computed here) gives the same output
    if renormalize:
        top_logits, ids = torch.topk(logits, 2, dim=-1)
        w = torch.softmax(top_logits, dim=-1)
    else:
        w, ids = torch.topk(torch.softmax(logits, dim=-1), 2, dim=-1)
    torch.testing.assert_close(layer(x, topk_ids=ids, topk_weights=w), expected, **EXACT)


def test_swiglu_parameters_reach_the_runner(rules):
    weights = _checkpoint("mxfp4", "interleaved", bias=True)
    x, logits = _inputs(weights)
    default = _build(rules, weights).forward(x, logits)
    clamped = _build(rules, weights, swiglu_limit=0.25).forward(x, logits)
    assert (default.float() - clamped.float()).abs().max() > 1e-2


def test_zero_tokens_give_an_empty_output(rules):
    weights = _checkpoint("nvfp4", "contiguous")
    layer = _build(rules, weights, activation="silu")
    out = layer.forward(torch.zeros(0, weights.H, dtype=torch.bfloat16), torch.zeros(0, weights.E))
    assert out.shape == (0, weights.H) and out.dtype == torch.bfloat16


# --------------------------------------------------------------------------- padding
@pytest.mark.parametrize("case, hidden, inter", [(GPT_OSS, 96, 96), (GENERIC_NVFP4, 48, 80)],
                         ids=["gpt-oss-mxfp4", "generic-nvfp4"])
def test_padding_to_the_decision_sizes_is_applied_and_sliced(rules, case, hidden, inter):
    weights = _checkpoint(case["fmt"], case["gate_up"], hidden=hidden, inter=inter, bias=case["bias"])
    layer = _build(rules, weights, profile="padded", activation=case["activation"], top_k=3)
    family = yaml.safe_load(NATIVE_FILE.read_text())["families"][case["fmt"]]
    (row,) = family["round_up"]  # TRITON_MOE's alignment, which the 'padded' profile also gives EMULATION
    padded_h = -(-hidden // row["hidden"]) * row["hidden"]
    padded_i = -(-inter // row["intermediate"]) * row["intermediate"]
    assert (padded_h, padded_i) != (hidden, inter)
    assert (layer.decision.hidden_size, layer.decision.intermediate_size) == (padded_h, padded_i)
    assert (layer.kernel_weights.H, layer.kernel_weights.I) == (padded_h, padded_i)  # converted once, at build
    assert (layer.hidden_size, layer.intermediate_size) == (hidden, inter)
    x, logits = _inputs(weights, dtype=torch.float32)
    out = layer.forward(x, logits)
    assert out.shape == (x.shape[0], hidden)
    expected = emulation.moe_forward(x, **weights.emulation_kwargs(), router_logits=logits, top_k=3,
                                     activation=case["activation"])
    torch.testing.assert_close(out, expected, **FP32_TOL)


# --------------------------------------------------------------------------- explain and logging
def test_explain_shows_decision_converter_runner_and_rule_locations(rules):
    layer = _build(rules, _checkpoint("mxfp4", "interleaved", bias=True))
    text = layer.explain()
    assert "profile moe-oracle" in text and "mxfp4-gpt-oss" in text
    assert "converter none" in text and "runner backends.runners.emulation:EmulationRunner" in text
    assert "EMULATION" in text and "moe-oracle/w4a16.yaml:" in text  # the trace locates its rules
    assert layer.decision.to_dict(with_trace=False)["runner"] == "backends.runners.emulation:EmulationRunner"


def test_decision_is_logged_once_per_distinct_decision(rules, caplog, monkeypatch):
    """A model asks once per layer: the same decision for every layer is one INFO line (oracle.log.DecisionLog)."""
    monkeypatch.setattr(layer_module, "_decision_log", DecisionLog())
    mxfp4, nvfp4 = _checkpoint("mxfp4", "interleaved"), _checkpoint("nvfp4", "contiguous")
    with caplog.at_level(logging.INFO, logger="moe_oracle"):
        for _ in range(3):
            _build(rules, mxfp4)
        _build(rules, nvfp4, activation="silu")
    lines = [r.getMessage() for r in caplog.records if r.name == "moe_oracle" and r.levelno == logging.INFO]
    assert len(lines) == 2, lines
    assert "mxfp4-gpt-oss [moe-oracle] on cpu -> EMULATION" in lines[0]
    assert "nvfp4 [moe-oracle] on cpu -> EMULATION" in lines[1]


def test_platform_is_detected_for_the_device(rules):
    layer = MoELayer.from_checkpoint(_checkpoint("mxfp4", "interleaved"), activation="swigluoai", top_k=2,
                                     oracle=rules, packages=NO_PACKAGES, env={})
    assert layer.scenario["platform"] == CPU and layer.device == torch.device("cpu")


def test_device_is_normalized_to_where_the_tensors_are(rules):
    """'cuda' holds tensors on 'cuda:0' (and 'cpu:0' on 'cpu'): the layer compares x with the concrete device."""
    weights = _checkpoint("mxfp4", "interleaved")
    layer = _build(rules, weights, device="cpu:0")
    assert layer.device == torch.device("cpu")
    x, logits = _inputs(weights)
    assert layer.forward(x, logits).shape == x.shape


# --------------------------------------------------------------------------- errors
@pytest.fixture(scope="module")
def gpt_oss_layer(rules) -> MoELayer:
    return _build(rules, _checkpoint("mxfp4", "interleaved", bias=True))


@pytest.mark.parametrize("x, kind, words", [
    (torch.zeros(3, 2, 64, dtype=torch.bfloat16), ValueError, "x.shape=(3, 2, 64) must be (T, 64)"),
    (torch.zeros(3, 32, dtype=torch.bfloat16), ValueError, "x.shape=(3, 32) must be (T, 64)"),
    (torch.zeros(3, 64, dtype=torch.float64), TypeError, "x.dtype=torch.float64"),
    (torch.zeros(3, 64, dtype=torch.int32), TypeError, "convert with x.to(torch.bfloat16)"),
    (torch.zeros(3, 64, dtype=torch.bfloat16, device="meta"), ValueError, "x is on meta but the layer is on cpu"),
    ([[0.0] * 64] * 3, TypeError, "x must be a torch.Tensor"),
], ids=["3-d", "wrong-hidden", "float64", "int32", "other-device", "not-a-tensor"])
def test_bad_x_is_one_clear_error(gpt_oss_layer, x, kind, words):
    with pytest.raises(kind, match="^MoELayer: ") as err:
        gpt_oss_layer.forward(x, torch.zeros(3, 4))
    assert words in str(err.value)


@pytest.mark.parametrize("routing, kind, words", [
    ({"router_logits": torch.zeros(3, 5)}, ValueError, "router_logits.shape=(3, 5) must be (3, 4)"),
    ({"router_logits": torch.zeros(2, 4)}, ValueError, "router_logits.shape=(2, 4) must be (3, 4)"),
    ({"router_logits": torch.zeros(3, 4, dtype=torch.int64)}, TypeError, "router_logits.dtype=torch.int64"),
    ({"router_logits": torch.zeros(3, 4, device="meta")}, ValueError, "router_logits is on meta"),
    ({}, ValueError, "pass router_logits [T, E], or both topk_ids and topk_weights"),
    ({"router_logits": torch.zeros(3, 4), "topk_ids": torch.zeros(3, 2, dtype=torch.long)}, ValueError, "not both"),
    ({"topk_ids": torch.zeros(3, 2, dtype=torch.long)}, ValueError, "both topk_ids and topk_weights"),
    ({"topk_ids": torch.zeros(3, 3, dtype=torch.long), "topk_weights": torch.ones(3, 3)}, ValueError,
     "topk_ids.shape=(3, 3) must be (3, 2)"),
    ({"topk_ids": torch.zeros(3, 2), "topk_weights": torch.ones(3, 2)}, TypeError, "topk_ids.dtype=torch.float32"),
], ids=["experts", "tokens", "int-logits", "device", "none", "both", "ids-only", "k", "float-ids"])
def test_bad_routing_is_one_clear_error(gpt_oss_layer, routing, kind, words):
    x = torch.zeros(3, 64, dtype=torch.bfloat16)
    with pytest.raises(kind, match="^MoELayer: ") as err:
        gpt_oss_layer.forward(x, **routing)
    assert words in str(err.value)


def test_unknown_profile_names_the_known_ones(rules):
    with pytest.raises(ValueError, match="profile='moe-orcale'") as err:
        _build(rules, _checkpoint("mxfp4", "interleaved"), profile="moe-orcale")
    assert "did you mean 'moe-oracle'" in str(err.value).lower() or "moe-oracle" in str(err.value)


def test_backend_without_runner_names_the_profile_that_runs_here(rules):
    """vllm-0.20 picks a library backend on Hopper that this project does not implement."""
    with pytest.raises(LayerUnavailableError) as err:
        _build(rules, _checkpoint("mxfp4", "interleaved"), profile="vllm-0.20",
               platform={"kind": "cuda", "capability": [9, 0]}, packages={"triton_kernels": True})
    message = str(err.value)
    assert "profile 'vllm-0.20'" in message and "which this project cannot run" in message
    assert "profile='moe-oracle' selects" in message


def test_no_backend_under_a_vllm_profile_names_the_profile_that_runs_here(rules):
    with pytest.raises(LayerUnavailableError) as err:  # vLLM's gpt-oss selector answers none on CPU
        _build(rules, _checkpoint("mxfp4", "interleaved"), profile="vllm-0.20")
    assert "selects no backend: none" in str(err.value)
    assert "profile='moe-oracle' selects EMULATION here" in str(err.value)


def test_unsupported_layer_is_one_clear_error(rules):
    """Neither native backend is batch invariant, so asking for it leaves nothing to run."""
    with pytest.raises(LayerUnavailableError, match="No moe-oracle backend runs this NVFP4 layer here"):
        _build(rules, _checkpoint("nvfp4", "contiguous"), activation="silu", env={"VLLM_BATCH_INVARIANT": "1"})


def test_explicit_backend_the_profile_lacks_is_refused(rules):
    with pytest.raises(LayerUnavailableError, match="moe_backend='marlin' is not a backend of profile moe-oracle"):
        _build(rules, _checkpoint("mxfp4", "interleaved"), moe_backend="marlin")


def test_platform_that_is_not_the_device_is_refused(rules):
    with pytest.raises(ValueError, match="does not describe device='cpu'"):
        _build(rules, _checkpoint("mxfp4", "interleaved"), platform={"kind": "cuda", "capability": [7, 5]})


@pytest.mark.parametrize("kw, kind, words", [
    ({"weights": {"w13": None}}, TypeError, "weights must be a backends.weights.MoEWeights"),
    ({"activation": "relu2_no_mul"}, ValueError, "activation='relu2_no_mul' must be one of"),
    ({"top_k": 5}, ValueError, "top_k=5 must be an int in [1, 4]"),
    ({"top_k": True}, ValueError, "top_k=True"),
    ({"device": "gpu"}, ValueError, "device='gpu' is not a torch device"),
    ({"platform": "cuda:9.0"}, TypeError, "platform='cuda:9.0' must be a scenario platform mapping"),
    ({"platform": {"kind": "tpu"}}, ValueError, "platform.kind: 'tpu' is not a platform"),
    ({"packages": {"tritn": True}}, ValueError, "packages.tritn: unknown field"),
], ids=["weights", "activation", "top_k", "bool-top_k", "device", "platform-string", "platform-kind", "package"])
def test_bad_from_checkpoint_arguments_are_one_clear_error(rules, kw, kind, words):
    args = {"weights": _checkpoint("mxfp4", "interleaved"), "activation": "swigluoai", "top_k": 2}
    args.update(kw)
    weights = args.pop("weights")
    with pytest.raises(kind, match="^MoELayer: ") as err:
        _build(rules, weights, **args)
    assert words in str(err.value)


# --------------------------------------------------------------------------- the native profile is honest
def test_native_capability_table_matches_the_triton_backend():
    """The rules' TritonMoeW4A16 row says what backends/triton_moe/capabilities.py says the code does."""
    from backends.triton_moe import CAPABILITIES

    rules = yaml.safe_load(NATIVE_FILE.read_text())
    kernel = rules["kernels"]["TritonMoeW4A16"]
    assert sorted(kernel["activations"]) == sorted(CAPABILITIES["activations"])
    weight_keys = {"kMxfp4Static": "mxfp4", "kNvfp4Static": "nvfp4"}
    formats_in_rules = sorted(weight_keys[k] for s in kernel["quant_schemes"] for k in s["weight"])
    assert formats_in_rules == sorted(CAPABILITIES["formats"])
    assert all(s["activation"] is None for s in kernel["quant_schemes"])  # W4A16
    device = rules["derived"]["triton_runs_here"]["when"]["all"]
    assert {"package": "triton"} in device
    cuda = device[1]["any"][0]["all"]
    assert {"fact": "platform.capability", "ge": ".".join(map(str, CAPABILITIES["min_capability"]))} in cuda
    for family in rules["families"].values():
        (row,) = [r for r in family["round_up"] if "TRITON_MOE" in r["backends"]]
        assert row["hidden"] % CAPABILITIES["hidden_size_multiple"] == 0
        assert row["intermediate"] % CAPABILITIES["intermediate_size_multiple"] == 0


# --------------------------------------------------------------------------- Triton, on CPU through its interpreter
_INTERPRETED_RUN = """
import json, sys
sys.path.insert(0, "tests")
import test_layer as t
from backends import MoELayer, emulation
for name, case, hidden, inter in [("gpt-oss", t.GPT_OSS, 96, 64), ("nvfp4", t.GENERIC_NVFP4, 48, 80)]:
    w = t._checkpoint(case["fmt"], case["gate_up"], hidden=hidden, inter=inter, bias=case["bias"])
    layer = MoELayer.from_checkpoint(w, activation=case["activation"], top_k=2)  # platform, packages, env detected
    x, logits = t._inputs(w, tokens=5)
    out = layer.forward(x, logits)
    ref = emulation.moe_forward(x.float(), **w.emulation_kwargs(), router_logits=logits, top_k=2,
                                activation=case["activation"])
    print(json.dumps({"name": name, "backend": layer.decision.backend, "runner": type(layer.runner).__name__,
                      "shape": list(out.shape),
                      "padded": [layer.padded_hidden_size, layer.padded_intermediate_size],
                      "rel_l2": float((out.float() - ref).norm() / ref.norm())}))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_layer_runs_the_triton_kernels_under_the_interpreter():
    """With TRITON_INTERPRET=1 (fixed when triton is first imported, hence a subprocess) moe-oracle picks
    TRITON_MOE on CPU: the layer pads to the kernels' alignment, converts once and matches the emulation."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _INTERPRETED_RUN], cwd=RULES.parent, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["name"]: r for r in map(json.loads, proc.stdout.splitlines())}
    families = yaml.safe_load(NATIVE_FILE.read_text())["families"]
    for name, fmt, hidden, inter in [("gpt-oss", "mxfp4", 96, 64), ("nvfp4", "nvfp4", 48, 80)]:
        row, (align,) = rows[name], families[fmt]["round_up"]
        assert row["backend"] == "TRITON_MOE" and row["shape"] == [5, hidden]
        assert row["runner"] == "TritonMoERunner"  # the protocol, under the interpreter
        assert row["padded"] == [-(-hidden // align["hidden"]) * align["hidden"],
                                 -(-inter // align["intermediate"]) * align["intermediate"]]
        assert row["rel_l2"] <= tolerance("w4a16_moe_rel_l2")["rtol"], row


# --------------------------------------------------------------------------- GPU
@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("case", [GPT_OSS, GENERIC_NVFP4], ids=["gpt-oss-mxfp4-swigluoai", "generic-nvfp4-silu"])
def test_gpu_layer_under_the_native_profile_matches_the_emulation(case):
    """Detected platform and packages: with triton on an SM80+ GPU moe-oracle runs its Triton kernels, padded
    (H 224 -> 256, I 160 -> 192), converted once, routed from logits or given ids, against the fp32 emulation."""
    weights = _checkpoint(case["fmt"], case["gate_up"], experts=8, hidden=224, inter=160, bias=case["bias"])
    layer = MoELayer.from_checkpoint(weights, activation=case["activation"], top_k=2, device="cuda")
    if importlib.util.find_spec("triton") is not None and torch.cuda.get_device_capability() >= (8, 0):
        assert layer.decision.backend == "TRITON_MOE", layer.explain()
        assert (layer.padded_hidden_size, layer.padded_intermediate_size) == (256, 192)
    assert layer.decision.outcome == "selected" and layer.decision.runner is not None
    x, logits = _inputs(weights, tokens=33)
    ref = emulation.moe_forward(x.float(), **weights.emulation_kwargs(), router_logits=logits, top_k=2,
                                activation=case["activation"])
    top_logits, ids = torch.topk(logits, 2, dim=-1)
    for out in (layer.forward(x.cuda(), logits.cuda()),
                layer.forward(x.cuda(), topk_ids=ids.cuda(), topk_weights=torch.softmax(top_logits, -1).cuda())):
        assert out.shape == (33, 224) and out.device.type == "cuda"
        rel = (out.float().cpu() - ref).norm() / ref.norm()
        assert rel <= tolerance("w4a16_moe_rel_l2")["rtol"], (layer.decision.backend, float(rel))
