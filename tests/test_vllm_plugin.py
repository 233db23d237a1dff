"""The vLLM plugin (oracle.integrations.vllm).

Part 1 runs everywhere: the translation between vLLM's objects and scenarios, with fakes.
Part 2 runs only where vllm==0.20.0 is installed: vLLM's real selector functions, on a
simulated platform, answer through the plugin exactly as unpatched vLLM does (shipped rules),
and follow an edited rule file exactly where the oracle's answer changes.
"""
from __future__ import annotations

import enum
import importlib
import importlib.metadata
import json
import logging
import random
import shutil
import sys
import types
from pathlib import Path

import pytest
import yaml
from vllm_simulation import (
    BY_POLICY,
    RELEASE,
    FakePlatform,
    SimulatedMachine,
    answer_of,
    assert_patched_then_restored,
    fake_config,
    fake_platform,
    full_moe,
    golden_questions,
    patched_in_a_fresh_process,
    random_question,
    vllm_answer,
)

import oracle
from oracle.integrations import vllm as plugin
from oracle.integrations.vllm_scenario import (
    ScenarioMismatch,
    build_scenario,
    platform_of,
    to_vllm_answer,
)


# ============================================================== part 1: translation, with fakes
def test_scenarios_built_from_vllm_objects_get_the_golden_questions_answers(oracle):
    """Round trip golden question -> vLLM-shaped objects -> plugin scenario: same decision, every question."""
    questions = golden_questions()
    assert len(questions) > 250
    for q in questions:
        sc, moe = q["scenario"], full_moe(q["scenario"])
        arch = sc["platform"].get("gcn_arch", "") + ":sramecc+:xnack-"
        built = build_scenario(policy=sc["policy"], profile="vllm-0.20",
                               platform=platform_of(fake_platform(sc["platform"]), lambda a=arch: a),
                               packages=sc.get("packages", {}), env=sc.get("env", {}), config=fake_config(moe),
                               quant_keys={k: moe[k] for k in BY_POLICY[sc["policy"]].key_args})
        assert answer_of(oracle.select(built)) == answer_of(oracle.select(sc)), sc


def test_platform_kinds_and_a_cuda_platform_without_capability():
    assert platform_of(FakePlatform("rocm"), lambda: "gfx942:sramecc+:xnack-") == {"kind": "rocm", "gcn_arch": "gfx942"}
    assert platform_of(FakePlatform("tpu"), lambda: "unused") == {"kind": "cpu"}
    with pytest.raises(ScenarioMismatch, match="no device capability"):
        platform_of(FakePlatform("cuda"), lambda: "unused")


class FakeBackend(enum.Enum):
    NONE = "None"
    TRITON = "TRITON"


class KernelA:
    pass


class KernelB:
    pass


def test_decisions_become_vllm_return_values_or_vllm_exceptions():
    def decision(outcome, backend=None, kernel=None, error=None):
        return types.SimpleNamespace(outcome=outcome, backend=backend, kernel=kernel, error=error)

    def classes(member):
        return [KernelA, KernelB]
    triton = FakeBackend.TRITON
    assert to_vllm_answer(decision("selected", "TRITON", "KernelB"), FakeBackend, classes) == (triton, KernelB)
    assert to_vllm_answer(decision("selected", "TRITON", None), FakeBackend, classes) == (triton, KernelA)
    assert to_vllm_answer(decision("none"), FakeBackend, classes) == (FakeBackend.NONE, None)
    for outcome, exc in (("invalid", ValueError), ("unsupported", NotImplementedError)):
        with pytest.raises(exc) as info:
            to_vllm_answer(decision(outcome, error="the oracle's message"), FakeBackend, classes)
        assert type(info.value) is exc and str(info.value) == "the oracle's message"
    with pytest.raises(ScenarioMismatch, match="could not answer.*moe.activation"):
        to_vllm_answer(decision("error", error="moe.activation: 'relu2' is not an activation"), FakeBackend, classes)
    with pytest.raises(ScenarioMismatch, match="'MARLIN', which this vLLM's FakeBackend does not have"):
        to_vllm_answer(decision("selected", "MARLIN", "KernelA"), FakeBackend, classes)
    with pytest.raises(ScenarioMismatch, match="kernel 'KernelC'.*KernelA, KernelB"):
        to_vllm_answer(decision("selected", "TRITON", "KernelC"), FakeBackend, classes)


def test_without_the_opt_in_register_does_nothing(monkeypatch):
    monkeypatch.delenv(plugin.RULES_ENV, raising=False)
    monkeypatch.setattr(plugin, "install", lambda *a: pytest.fail("install() ran without MOE_ORACLE_RULES"))
    plugin.register()


@pytest.mark.parametrize("version", ["0.19.1", "0.21.0", "0.32.9", "0.34.0", "unknown"])
def test_unsupported_vllm_versions_are_refused_naming_the_supported_ones(version):
    with pytest.raises(RuntimeError) as info:
        plugin.release_for(version)
    assert f"this is vLLM {version}" in str(info.value) and "supports vLLM 0.20.x, 0.33.x only" in str(info.value)
    assert plugin.release_for("0.20.2") is RELEASE
    assert plugin.release_for("0.33.1") is plugin.RELEASES["0.33"]


def test_rules_spec_is_a_directory_or_a_shipped_profile(tmp_path):
    _, profile, source = plugin.open_rules("vllm-0.15", None, RELEASE)
    assert profile == "vllm-0.15" and source == "the shipped rules"
    shutil.copytree(oracle.Oracle().root, tmp_path / "rules")
    _, profile, source = plugin.open_rules(str(tmp_path / "rules"), None, RELEASE)
    assert profile == "vllm-0.20" and source == str((tmp_path / "rules").resolve())  # not the default (vllm-0.33)
    _, profile, _ = plugin.open_rules(str(tmp_path / "rules"), None, plugin.RELEASES["0.33"])
    assert profile == "vllm-0.33"
    with pytest.raises(RuntimeError, match="neither a rules directory nor a shipped profile.*vllm-0.20"):
        plugin.open_rules("vllm-0.2O", None, RELEASE)
    with pytest.raises(RuntimeError, match="MOE_ORACLE_PROFILE='nope': no such profile"):
        plugin.open_rules(str(tmp_path / "rules"), "nope", RELEASE)


def test_a_selector_whose_name_or_signature_changed_is_refused(monkeypatch):
    module = types.ModuleType("fake_vllm_oracle")
    module.select_x = lambda config: None
    monkeypatch.setitem(sys.modules, "fake_vllm_oracle", module)
    sel = plugin.Selector("fake_vllm_oracle", "select_x", "nvfp4", "E", ("weight_key", "activation_key"), ())
    with pytest.raises(RuntimeError, match=r"select_x takes \(config\), but the plugin answers "
                                           r"\(config, weight_key, activation_key\)"):
        plugin._target(sel)
    with pytest.raises(RuntimeError, match="this vLLM has no fake_vllm_oracle.select_y"):
        plugin._target(plugin.Selector("fake_vllm_oracle", "select_y", "nvfp4", "E", (), ()))


def test_each_distinct_decision_is_logged_once_with_its_rule_file_and_step(oracle, caplog):
    """Through oracle.log.DecisionLog (the servers' log), labelled with the vLLM selector that asked."""
    active = plugin._Active(oracle, "vllm-0.20", "the shipped rules", RELEASE)
    sel, other = BY_POLICY["mxfp4-gpt-oss"], BY_POLICY["mxfp4"]
    hopper = {"policy": sel.policy, "profile": "vllm-0.20", "platform": {"kind": "cuda", "capability": [9, 0]},
              "packages": {"triton_kernels": True}}
    forced = {**hopper, "env": {"VLLM_MXFP4_USE_MARLIN": "1"}}
    with caplog.at_level(logging.INFO, logger="moe_oracle"):
        for question in (hopper, hopper, forced, hopper, forced):  # five MoE layers, two distinct decisions
            assert plugin._select_logged(sel, active, question) is oracle.select(question)
        plugin._select_logged(other, active, {**hopper, "policy": other.policy})  # another selector: its own line
        plugin._select_logged(other, active, {**hopper, "policy": other.policy})
        reinstalled = plugin._Active(oracle, "vllm-0.20", "the shipped rules", RELEASE)
        plugin._select_logged(sel, reinstalled, hopper)  # a new install logs anew
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4 and lines[3] == lines[0]
    assert lines[0].startswith(f"moe-oracle: vLLM's {sel.name}: mxfp4-gpt-oss [vllm-0.20] on cuda 9.0 -> TRITON "
                               "(kernel OAITritonMxfp4ExpertsMonolithic, activations bf16); decided by step 'auto' "
                               "at rules/common/mxfp4.yaml:")
    assert "; rejected " in lines[0] and "FLASHINFER_TRTLLM_MXFP4_BF16(" in lines[0]
    assert f"vLLM's {sel.name}: " in lines[1] and "-> MARLIN (kernel MarlinExperts" in lines[1]
    assert "decided by step 'marlin-forced'" in lines[1]
    assert lines[2].startswith(f"moe-oracle: vLLM's {other.name}: mxfp4 [vllm-0.20] on cuda 9.0 -> ")


def test_float32_router_logits_are_warned_about_where_vllm_reads_them(caplog):
    class Float32:
        def __str__(self):
            return "torch.float32"
    plugin._warned.clear()
    routing = enum.IntEnum("RoutingMethodType", {"DeepSeekV3": 2, "Renormalize": 1})
    with caplog.at_level(logging.WARNING, logger="moe_oracle"):
        plugin._warn_once_if_unexpressed(types.SimpleNamespace(router_logits_dtype=Float32(),
                                                               routing_method=routing.DeepSeekV3))
        assert not caplog.records
        for _ in range(2):
            plugin._warn_once_if_unexpressed(types.SimpleNamespace(router_logits_dtype=Float32(),
                                                                   routing_method=routing.Renormalize))
    assert len(caplog.records) == 1 and "float32 with Renormalize routing" in caplog.records[0].getMessage()


# ============================================================== part 2: the real vLLM 0.20.0
def _vllm_version() -> str | None:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


requires_vllm_020 = pytest.mark.skipif(
    _vllm_version() != "0.20.0",
    reason=f"needs vllm==0.20.0 importable (found {_vllm_version() or 'no vllm'}); see docs/vllm-plugin-run.log")

# vLLM's optional-package probes, by the scenario package each one stands for.
@pytest.fixture(scope="module")
def machine():
    with pytest.MonkeyPatch.context() as mp:
        sim = SimulatedMachine(mp)
        try:
            yield sim
        finally:
            plugin.uninstall()
            sim.restore()


def through_plugin(machine, rules, scenarios=None) -> list[tuple]:
    """Every question (default: the golden ones) asked of vLLM's callers' selector names, plugin on `rules`."""
    plugin.install(rules)
    answers = []
    for scenario in scenarios if scenarios is not None else [q["scenario"] for q in golden_questions()]:
        sel = BY_POLICY[scenario["policy"]]
        kwargs = machine.ask(scenario)
        patched = getattr(sys.modules[sel.callers[0]], sel.name)
        assert getattr(patched, "_moe_oracle_selector", None) is sel, f"{sel.callers[0]}.{sel.name} is not patched"
        answers.append(vllm_answer(patched, kwargs))
    return answers


@requires_vllm_020
def test_shipped_rules_answer_every_golden_question_as_unpatched_vllm(machine, oracle, caplog):
    plugin.uninstall()
    questions = golden_questions()
    unpatched = [vllm_answer(machine.originals[BY_POLICY[q["scenario"]["policy"]].name], machine.ask(q["scenario"]))
                 for q in questions]
    for q, (answer, _) in zip(questions, unpatched, strict=True):  # the simulation reproduces the recorded vLLM answers
        assert answer == answer_of(types.SimpleNamespace(error=None, **{"backend": None, "kernel": None,
                                                                          **q["expected"]})), q["scenario"]
    with caplog.at_level(logging.INFO, logger="moe_oracle"):
        patched = through_plugin(machine, "vllm-0.20")
    for q, (vllm_own, _), (ours, message) in zip(questions, unpatched, patched, strict=True):
        assert ours == vllm_own, q["scenario"]
        if message is not None:
            assert message == oracle.select(q["scenario"]).error
    decisions = [r.getMessage() for r in caplog.records if "decided by step" in r.getMessage()]
    assert len(decisions) == len(set(decisions)) > 10, "one provenance line per distinct decision"
    assert any("rules/common/mxfp4.yaml:" in line and "-> TRITON (kernel OAITritonMxfp4ExpertsMonolithic" in line
               for line in decisions)


@requires_vllm_020
def test_random_deployments_beyond_the_sample_agree_with_unpatched_vllm(machine):
    """1500 seeded random platform x package x env x layer questions: the plugin answers as vLLM does."""
    rng = random.Random(20)
    scenarios = sorted((random_question(rng) for _ in range(1500)), key=lambda s: json.dumps(s["platform"]))
    plugin.uninstall()
    unpatched = [vllm_answer(machine.originals[BY_POLICY[s["policy"]].name], machine.ask(s))[0] for s in scenarios]
    patched = [a for a, _ in through_plugin(machine, "vllm-0.20", scenarios)]
    assert len(set(unpatched)) > 20, "the sweep must reach many different answers"
    mismatches = [(s, a, b) for s, a, b in zip(scenarios, unpatched, patched, strict=True) if a != b]
    assert not mismatches, mismatches[:3]


def edited_rules(tmp_path: Path) -> Path:
    """The shipped rules with two priority swaps: MARLIN before TRITON (gpt-oss), CUTLASS before TRTLLM (NVFP4)."""
    rules = shutil.copytree(oracle.Oracle().root, tmp_path / "rules")
    for rel, policy, first, second in (("common/mxfp4.yaml", "mxfp4-gpt-oss", "TRITON", "MARLIN"),
                                       ("vllm-0.20/nvfp4.yaml", "nvfp4", "FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS")):
        data = yaml.safe_load((rules / rel).read_text())
        candidates = data["policies"][policy]["candidates"]
        i, j = candidates.index(first), candidates.index(second)
        candidates[i], candidates[j] = second, first
        (rules / rel).write_text(yaml.safe_dump(data, sort_keys=False))
    return rules


@requires_vllm_020
def test_an_edited_rule_changes_vllm_exactly_where_the_oracle_changes(machine, oracle, tmp_path):
    questions = golden_questions()
    rules = edited_rules(tmp_path)
    edited = oracle.__class__(rules)
    oracle_changed = {i for i, q in enumerate(questions)
                      if answer_of(edited.select(q["scenario"])) != answer_of(oracle.select(q["scenario"]))}
    shipped = [a for a, _ in through_plugin(machine, "vllm-0.20")]
    after_edit = [a for a, _ in through_plugin(machine, rules)]
    vllm_changed = {i for i, (a, b) in enumerate(zip(shipped, after_edit, strict=True)) if a != b}
    assert 0 < len(oracle_changed) < len(questions), "the edit must change some answers and keep others"
    assert vllm_changed == oracle_changed
    assert {a[1] for i, a in enumerate(after_edit) if i in vllm_changed} >= {"MARLIN", "FLASHINFER_CUTLASS"}
    for q, ours in zip(questions, after_edit, strict=True):
        assert ours == answer_of(edited.select(q["scenario"])), q["scenario"]


@requires_vllm_020
def test_vllms_plugin_loader_activates_the_plugin_and_uninstall_restores_vllm(machine, monkeypatch):
    import vllm.plugins

    plugin.uninstall()
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert eps.get("moe_oracle") == "oracle.integrations.vllm:register", eps
    monkeypatch.setenv(plugin.RULES_ENV, "vllm-0.20")
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    vllm.plugins.load_general_plugins()
    assert_patched_then_restored(RELEASE, machine.originals, plugin.uninstall)


@requires_vllm_020
def test_opting_in_before_vllm_imports_its_selectors_patches_them_on_import(tmp_path):
    """A fresh vLLM process: the plugin loads first, the selector modules come later (as in a real server)."""
    patched, output = patched_in_a_fresh_process(
        tmp_path, RELEASE, "vllm-0.20",
        ("mxfp4.select_gpt_oss_mxfp4_moe_backend", "mxfp4.select_mxfp4_moe_backend", "modelopt.select_nvfp4_moe_backend"))
    assert patched == [["select_gpt_oss_mxfp4_moe_backend", "mxfp4-gpt-oss"], ["select_mxfp4_moe_backend", "mxfp4"],
                       ["select_nvfp4_moe_backend", "nvfp4"]]
    assert "select_nvfp4_moe_backend (on import)" in output
