"""Which policy serves a checkpoint comes from each profile's rules (checkpoint_policies), and under every
shipped profile MoELayer either runs or raises LayerUnavailableError naming what can run."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backends import LayerUnavailableError, MoELayer, formats
from backends.layer import checkpoint_policies
from backends.weights import MoEWeights
from oracle import Oracle, RuleError

RULES = Path(__file__).resolve().parents[1] / "rules"
CHECKPOINTS = [("mxfp4", "interleaved", "swigluoai"), ("mxfp4", "contiguous", "silu"),
               ("nvfp4", "contiguous", "silu"), ("nvfp4", "interleaved", "silu")]


def _checkpoint(fmt: str, gate_up: str, experts=4, hidden=64, inter=64) -> MoEWeights:
    g = torch.Generator().manual_seed(0)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5
    w2 = torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5
    if fmt == "mxfp4":
        (a, sa), (b, sb) = formats.quantize_mxfp4(w13), formats.quantize_mxfp4(w2)
        return MoEWeights(format=fmt, gate_up=gate_up, w13=a, w13_scale=sa, w2=b, w2_scale=sb)
    a, sa, ga = formats.quantize_nvfp4(w13, 448 * 6 / w13.abs().amax(dim=(1, 2)))
    b, sb, gb = formats.quantize_nvfp4(w2, 448 * 6 / w2.abs().amax(dim=(1, 2)))
    return MoEWeights(format=fmt, gate_up=gate_up, w13=a, w13_scale=sa, w13_global_scale=ga, w2=b, w2_scale=sb,
                      w2_global_scale=gb)


def test_every_shipped_profile_names_a_policy_of_its_own_for_every_checkpoint(oracle):
    for fmt, gate_up, _ in CHECKPOINTS:
        served = checkpoint_policies(oracle, _checkpoint(fmt, gate_up))
        assert set(served) == set(oracle.profiles())
        for profile, policy in served.items():
            assert policy in oracle.table(profile).policies
    assert checkpoint_policies(oracle, _checkpoint("mxfp4", "interleaved"))["vllm-0.33"] == "mxfp4"  # renamed in 0.33
    assert checkpoint_policies(oracle, _checkpoint("mxfp4", "interleaved"))["vllm-0.20"] == "mxfp4-gpt-oss"


@pytest.mark.parametrize("checkpoint", CHECKPOINTS, ids=["-".join(c[:2]) for c in CHECKPOINTS])
@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.20", "vllm-0.15", "moe-oracle"])
def test_the_layer_runs_or_says_what_can_run_under_every_shipped_profile(oracle, profile, checkpoint):
    fmt, gate_up, activation = checkpoint
    weights = _checkpoint(fmt, gate_up)
    try:
        layer = MoELayer.from_checkpoint(weights, activation=activation, top_k=2, profile=profile, platform={"kind": "cpu"},
                                         device="cpu", packages={}, env={}, oracle=oracle)
    except LayerUnavailableError as exc:
        assert "Runnable instead: profile='moe-oracle'" in str(exc), str(exc)
        assert "malformed" not in str(exc)
        return
    x = torch.randn(3, weights.H).to(torch.bfloat16)
    assert layer.forward(x, torch.randn(3, weights.E)).shape == (3, weights.H)


def _rules_without_mapping(tmp_path: Path, broken: str | None = None) -> Path:
    import shutil

    root = shutil.copytree(RULES, tmp_path / "rules")
    text = (root / "moe-oracle" / "w4a16.yaml").read_text()
    start = text.index("checkpoint_policies:")
    end = text.index("\n\n", start)
    replacement = "" if broken is None else text[start:end].replace("contiguous: mxfp4", f"contiguous: {broken}")
    (root / "moe-oracle" / "w4a16.yaml").write_text(text[:start] + replacement + text[end:])
    return root


def test_a_profile_without_a_policy_for_the_checkpoint_is_unavailable_naming_those_with_one(tmp_path):
    o = Oracle(_rules_without_mapping(tmp_path))
    with pytest.raises(LayerUnavailableError, match=r"profile 'moe-oracle' names no policy for mxfp4 checkpoints "
                                                    r"with interleaved gate/up rows .*vllm-0.20"):
        MoELayer.from_checkpoint(_checkpoint("mxfp4", "interleaved"), activation="swigluoai", top_k=2,
                                 platform={"kind": "cpu"}, device="cpu", packages={}, env={}, oracle=o)
    layer = MoELayer.from_checkpoint(_checkpoint("mxfp4", "interleaved"), activation="swigluoai", top_k=2,
                                     platform={"kind": "cpu"}, device="cpu", packages={}, env={}, oracle=o,
                                     policy="mxfp4")  # an explicit policy needs no mapping
    assert layer.decision.policy == "mxfp4"


def test_a_mapping_to_an_unknown_policy_is_a_rule_error_at_its_line(tmp_path):
    with pytest.raises(RuleError, match=r"w4a16.yaml:\d+:\d+: unknown policy 'mxfp5'.*did you mean"):
        Oracle(_rules_without_mapping(tmp_path, broken="mxfp5")).table("moe-oracle")


def test_cuda_without_a_cuda_device_says_so(oracle, monkeypatch):
    """device='cuda' where torch sees no CUDA device names that cause, not the platform argument nobody passed."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"device='cuda', but torch finds no CUDA device on this machine") as info:
        MoELayer.from_checkpoint(_checkpoint("mxfp4", "interleaved"), activation="swigluoai", top_k=2, device="cuda",
                                 packages={}, env={}, oracle=oracle)
    assert "platform=" not in str(info.value).split(";")[0] and "Drop platform" not in str(info.value)


def test_a_detected_platform_that_does_not_match_the_device_names_the_detection(oracle, monkeypatch):
    from backends import layer as layer_module

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(layer_module, "platform_for_device", lambda device: {"kind": "cpu"})
    with pytest.raises(RuntimeError, match=r"device='cuda', but this machine was detected as \{'kind': 'cpu'\}") as info:
        MoELayer.from_checkpoint(_checkpoint("mxfp4", "interleaved"), activation="swigluoai", top_k=2, device="cuda",
                                 packages={}, env={}, oracle=oracle)
    assert "Drop platform" not in str(info.value)


def test_without_torch_the_layer_names_its_install_step(tmp_path):
    """`from backends import MoELayer` where torch is missing: one message with the install command."""
    import subprocess
    import sys

    blocker = tmp_path / "torch.py"  # a torch that cannot be imported, ahead of the real one
    blocker.write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-c", "from backends import MoELayer"], capture_output=True, text=True,
                         env={"PYTHONPATH": f"{tmp_path}:{root}", "PATH": ""}, cwd=tmp_path, timeout=60, check=False)
    assert run.returncode == 1
    assert "backends.MoELayer needs torch, which is not installed: pip install 'moe-oracle[torch]'" in run.stderr


@pytest.mark.parametrize("platform", [{"kind": "cuda", "capability": [9, 0]}, {"kind": "cuda", "capability": [10, 0]},
                                      {"kind": "rocm", "gcn_arch": "gfx950"}], ids=["sm90", "sm100", "gfx950"])
@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.20", "vllm-0.15", "moe-oracle"])
def test_on_gpu_platforms_the_layer_is_runnable_or_says_what_can_run(oracle, profile, platform):
    """Selection for a GPU platform, checked on this machine: either a backend with a runner (the layer then refuses
    only because the weights sit on the CPU) or LayerUnavailableError naming a profile that runs here."""
    for fmt, gate_up, activation in CHECKPOINTS:
        try:
            MoELayer.from_checkpoint(_checkpoint(fmt, gate_up), activation=activation, top_k=2, profile=profile,
                                     platform=platform, device="cpu", packages={}, env={}, oracle=oracle)
        except LayerUnavailableError as exc:
            assert "Runnable instead: profile=" in str(exc), str(exc)
        except ValueError as exc:
            assert "does not describe device='cpu'" in str(exc), str(exc)  # runnable there, not on this CPU
        else:
            pytest.fail("a GPU platform's layer was built on the CPU")
