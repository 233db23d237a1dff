"""The vLLM plugin against vLLM 0.33 (renamed selectors, activation-key override, new probes).

Part 1 runs everywhere: 0.33's scenario fields built from vLLM-shaped fakes.
Part 2 runs only where vllm 0.33.x is installed: vLLM's real 0.33 selectors, on a simulated
platform, answer every MXFP4 / NVFP4 question of the 0.33 golden sample through the plugin
exactly as unpatched vLLM does (shipped rules), and follow an edited rule file exactly where
the oracle's answer changes. The recorded run: docs/vllm-plugin-run-0.33.log.
"""
from __future__ import annotations

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
    BEFORE_SELECTION,
    FakePlatform,
    SimulatedMachine,
    answer_of,
    assert_patched_then_restored,
    by_policy,
    fake_config,
    fake_platform,
    full_moe,
    golden_questions,
    patched_in_a_fresh_process,
    random_question_033,
    vllm_answer,
)

import oracle
from oracle.integrations import vllm as plugin
from oracle.integrations.vllm_scenario import build_scenario, moe_of, platform_of, to_vllm_answer

RELEASE = plugin.RELEASES["0.33"]
BY_POLICY = by_policy(RELEASE)


# ============================================================== part 1: 0.33's scenario fields, with fakes
def test_033_scenarios_built_from_vllm_objects_get_the_golden_questions_answers(oracle):
    """Golden 0.33 question -> vLLM-shaped objects (swiglu_limit, AMX, user key) -> plugin scenario: same decision."""
    questions = golden_questions(RELEASE)
    assert len(questions) > 450 and {q["scenario"]["policy"] for q in questions} == set(BY_POLICY)
    for q in questions:
        sc, moe = q["scenario"], full_moe(q["scenario"])
        sel = BY_POLICY[sc["policy"]]
        keys = {k: moe[k] for k in sel.key_args}
        if sel.user_key:
            keys["user_activation_key"] = moe["user_activation_key"]
        arch, amx = sc["platform"].get("gcn_arch", "") + ":xnack-", sc["platform"].get("amx", False)
        built = build_scenario(policy=sc["policy"], profile=RELEASE.profile,
                               platform=platform_of(fake_platform(sc["platform"]), lambda a=arch: a,
                                                    lambda x=amx: x),
                               packages=sc.get("packages", {}), env=sc.get("env", {}), config=fake_config(moe),
                               quant_keys=keys)
        assert answer_of(oracle.select(built)) == answer_of(oracle.select(sc)), sc


def test_amx_is_read_on_cpu_only_and_the_clamp_limit_passes_through():
    assert platform_of(FakePlatform("cpu"), lambda: "unused", lambda: True) == {"kind": "cpu", "amx": True}
    assert platform_of(FakePlatform("cpu"), lambda: "unused") == {"kind": "cpu"}  # 0.20: no AMX fact
    never = lambda: pytest.fail("AMX probed off the CPU")  # noqa: E731
    assert platform_of(FakePlatform("cuda", (9, 0)), lambda: "unused", never) == {"kind": "cuda", "capability": [9, 0]}
    moe = full_moe({"profile": "vllm-0.33", "moe": {"swiglu_limit": 7}})
    assert moe_of(fake_config(moe))["swiglu_limit"] == 7.0
    assert "swiglu_limit" not in moe_of(fake_config(full_moe({})))  # a config without the field (0.20)


def test_a_releases_own_exception_types_carry_the_refusals():
    class Refused(ValueError):
        pass
    decision = types.SimpleNamespace(outcome="invalid", backend=None, kernel=None, error="the oracle's message")
    with pytest.raises(Refused, match="the oracle's message"):
        to_vllm_answer(decision, None, None, {"invalid": Refused})
    assert dict(RELEASE.refusals) == {"invalid": ValueError, "unsupported": NotImplementedError}


def test_config_facts_the_rules_cannot_see_are_warned_about_once(caplog):
    situ = types.SimpleNamespace(value="situ")
    plugin._warned.clear()
    with caplog.at_level(logging.WARNING, logger="moe_oracle"):
        for _ in range(2):
            plugin._warn_once_if_unexpressed(types.SimpleNamespace(activation=situ, routing_method=None,
                                                                   has_hash_routing=True))
        plugin._warn_once_if_unexpressed(types.SimpleNamespace(activation=types.SimpleNamespace(value="silu"),
                                                               routing_method=None, has_hash_routing=False))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines  # SiTU is a fact now (flashinfer.situ_activation), not a warning
    assert "FusedMoEConfig.has_hash_routing is True" in lines[0]


def test_flashinfer_features_are_scenario_facts_the_plugin_reads_from_vllms_probes(monkeypatch, oracle):
    """Each FlashInfer feature probe of a release becomes flashinfer.<feature>; the plugin asks the probes (here
    stand-ins with vLLM's module layout) and passes their answers, which change the choice on SM 10.x."""
    from oracle.facts import FACTS

    for release in plugin.RELEASES.values():
        for feature, where in release.flashinfer_features:
            assert f"flashinfer.{feature}" in FACTS and ":has_flashinfer_" in where
    answers = {"situ_activation": False, "trtllm_fused_moe": True}
    homes = {}
    for feature, where in RELEASE.flashinfer_features:
        module, attr = where.split(":")
        homes.setdefault(module, types.ModuleType(module))
        setattr(homes[module], attr, lambda f=feature: answers.get(f, True))
    monkeypatch.setattr(plugin, "_PROBE_HOMES", {})
    for module, fake in homes.items():
        monkeypatch.setitem(sys.modules, module, fake)
    features = plugin.flashinfer_features(RELEASE)
    assert features["situ_activation"] is False and features["cutlass_fused_moe"] is True
    moe = full_moe({"profile": "vllm-0.33", "moe": {"activation": "situ"}})
    common = {"policy": "mxfp4", "profile": RELEASE.profile, "platform": {"kind": "cuda", "capability": [10, 0]},
              "packages": {"flashinfer": True, "triton_kernels": True}, "env": {}, "config": fake_config(moe),
              "quant_keys": {"activation_key": None, "user_activation_key": None}}
    pinned = oracle.select(build_scenario(**common))
    without = oracle.select(build_scenario(**common, flashinfer=features))
    assert pinned.backend == "FLASHINFER_TRTLLM_MXFP4_BF16"  # vLLM 0.33.0's pin has ActivationType.Situ
    assert without.outcome == "selected" and without.backend != pinned.backend


def test_033_selectors_are_the_renamed_ones_with_their_parameters():
    names = {sel.name: (sel.policy, sel.key_args, sel.user_key) for sel in RELEASE.selectors}
    assert names == {"select_mxfp4_moe_backend": ("mxfp4", ("activation_key",), True),
                     "select_deepseek_v4_mxfp4_moe_backend": ("mxfp4-deepseek-v4", (), False),
                     "select_nvfp4_moe_backend": ("nvfp4", ("weight_key", "activation_key"), False)}
    assert {p for p, _ in RELEASE.probes} == {"flashinfer", "triton_kernels", "deep_gemm", "aiter", "humming", "b12x",
                                              "quark"}


# ============================================================== part 2: the real vLLM 0.33
def _vllm_version() -> str | None:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


requires_vllm_033 = pytest.mark.skipif(
    not (_vllm_version() or "").startswith("0.33."),
    reason=f"needs vllm 0.33.x importable (found {_vllm_version() or 'no vllm'}); see docs/vllm-plugin-run-0.33.log")


@pytest.fixture(scope="module")
def machine():
    with pytest.MonkeyPatch.context() as mp:
        sim = SimulatedMachine(mp, RELEASE)
        try:
            yield sim
        finally:
            plugin.uninstall()
            sim.restore()


def through_plugin(machine, rules, questions) -> list[tuple]:
    """Every question asked of vLLM's callers' selector names, plugin on `rules`."""
    plugin.install(rules)
    answers = []
    for scenario in (q["scenario"] for q in questions):
        sel = BY_POLICY[scenario["policy"]]
        kwargs = machine.ask(scenario)
        patched = getattr(sys.modules[sel.callers[0]], sel.name)
        assert getattr(patched, "_moe_oracle_selector", None) is sel, f"{sel.callers[0]}.{sel.name} is not patched"
        answers.append(vllm_answer(patched, kwargs))
    return answers


def unpatched_answers(machine, questions) -> list[tuple]:
    plugin.uninstall()
    return [vllm_answer(machine.originals[BY_POLICY[q["scenario"]["policy"]].name], machine.ask(q["scenario"]))
            for q in questions]


def recorded(q) -> tuple:
    return answer_of(types.SimpleNamespace(error=None, **{"backend": None, "kernel": None, **q["expected"]}))


@requires_vllm_033
def test_033_shipped_rules_answer_every_golden_question_as_unpatched_vllm(machine, oracle, caplog):
    questions = golden_questions(RELEASE)
    unpatched = unpatched_answers(machine, questions)
    for q, (answer, _) in zip(questions, unpatched, strict=True):  # the simulation reproduces the recorded answers
        assert answer == recorded(q), q["scenario"]
    with caplog.at_level(logging.INFO, logger="moe_oracle"):
        patched = through_plugin(machine, RELEASE.profile, questions)
    before = {i for i, q in enumerate(questions) if BEFORE_SELECTION in machine.ask(q["scenario"])}
    assert len(before) < 10, "vLLM refuses only a few layers (non-gated on CPU) before its selector runs"
    for i, (q, (vllm_own, _), (ours, message)) in enumerate(zip(questions, unpatched, patched, strict=True)):
        assert ours == vllm_own, q["scenario"]
        if message is not None and i not in before:  # the selector ran: the plugin raised the oracle's message
            assert message == oracle.select(q["scenario"]).error
    decisions = [r.getMessage() for r in caplog.records if "decided by step" in r.getMessage()]
    assert len(decisions) == len(set(decisions)) > 10, "one provenance line per distinct decision"
    assert any("rules/vllm-0.33/mxfp4.yaml:" in line for line in decisions)


@requires_vllm_033
def test_033_random_deployments_beyond_the_sample_agree_with_unpatched_vllm(machine):
    """1500 seeded random 0.33 platform x package x env x layer questions: the plugin answers as vLLM does."""
    rng = random.Random(33)
    questions = [{"scenario": s} for s in sorted((random_question_033(rng) for _ in range(1500)),
                                                 key=lambda s: json.dumps(s["platform"]))]
    unpatched = [a for a, _ in unpatched_answers(machine, questions)]
    patched = [a for a, _ in through_plugin(machine, RELEASE.profile, questions)]
    assert len(set(unpatched)) > 20, "the sweep must reach many different answers"
    mismatches = [(q["scenario"], a, b) for q, a, b in zip(questions, unpatched, patched, strict=True) if a != b]
    assert not mismatches, mismatches[:3]


def edited_rules(tmp_path: Path) -> Path:
    """The shipped rules with two priority swaps: MARLIN before TRITON (mxfp4), CUTLASS before TRTLLM (NVFP4)."""
    rules = shutil.copytree(oracle.Oracle().root, tmp_path / "rules")
    for rel, policy, first, second in (("vllm-0.33/mxfp4.yaml", "mxfp4", "TRITON", "MARLIN"),
                                       ("vllm-0.33/nvfp4.yaml", "nvfp4", "FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS")):
        data = yaml.safe_load((rules / rel).read_text())
        candidates = data["policies"][policy]["candidates"]
        i, j = candidates.index(first), candidates.index(second)
        candidates[i], candidates[j] = second, first
        (rules / rel).write_text(yaml.safe_dump(data, sort_keys=False))
    return rules


@requires_vllm_033
def test_033_an_edited_rule_changes_vllm_exactly_where_the_oracle_changes(machine, oracle, tmp_path):
    questions = golden_questions(RELEASE)
    rules = edited_rules(tmp_path)
    edited = oracle.__class__(rules)
    oracle_changed = {i for i, q in enumerate(questions)
                      if answer_of(edited.select(q["scenario"])) != answer_of(oracle.select(q["scenario"]))}
    shipped = [a for a, _ in through_plugin(machine, RELEASE.profile, questions)]
    after_edit = [a for a, _ in through_plugin(machine, rules, questions)]
    vllm_changed = {i for i, (a, b) in enumerate(zip(shipped, after_edit, strict=True)) if a != b}
    assert 0 < len(oracle_changed) < len(questions), "the edit must change some answers and keep others"
    assert vllm_changed == oracle_changed
    assert {a[1] for i, a in enumerate(after_edit) if i in vllm_changed} >= {"MARLIN", "FLASHINFER_CUTLASS"}
    for q, ours in zip(questions, after_edit, strict=True):
        assert ours == answer_of(edited.select(q["scenario"])), q["scenario"]


@requires_vllm_033
def test_033_plugin_loader_activates_the_plugin_and_uninstall_restores_vllm(machine, monkeypatch):
    import vllm.plugins

    plugin.uninstall()
    monkeypatch.setenv(plugin.RULES_ENV, str(oracle.Oracle().root))  # a directory: the profile follows vLLM
    monkeypatch.delenv(plugin.PROFILE_ENV, raising=False)
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    vllm.plugins.load_general_plugins()
    assert plugin._active.profile == "vllm-0.33"
    assert_patched_then_restored(RELEASE, machine.originals, plugin.uninstall)


@requires_vllm_033
def test_033_opting_in_before_vllm_imports_its_selectors_patches_them_on_import(tmp_path):
    """A fresh vLLM 0.33 process: the plugin loads first, the renamed selectors are patched when vLLM imports them."""
    patched, output = patched_in_a_fresh_process(
        tmp_path, RELEASE, "vllm-0.33",
        ("mxfp4.select_mxfp4_moe_backend", "mxfp4.select_deepseek_v4_mxfp4_moe_backend", "modelopt.select_nvfp4_moe_backend"))
    assert patched == [["select_mxfp4_moe_backend", "mxfp4"],
                       ["select_deepseek_v4_mxfp4_moe_backend", "mxfp4-deepseek-v4"],
                       ["select_nvfp4_moe_backend", "nvfp4"]]
    assert "select_deepseek_v4_mxfp4_moe_backend (on import)" in output


@requires_vllm_033
def test_033_the_installed_flashinfers_features_are_what_the_plugin_passes(tmp_path):
    """Unsimulated (a fresh process): the plugin's flashinfer facts are vLLM's probes of the installed FlashInfer;
    with the flashinfer-python vLLM 0.33.0 pins, Situ is there (the profile's default)."""
    import subprocess

    code = ("import json; import vllm.model_executor.layers.fused_moe.oracle.mxfp4; "  # as at selection time
            "from oracle.integrations import vllm as p; "
            "from vllm.model_executor.layers.quantization.utils.flashinfer_utils import has_flashinfer_situ_activation;"
            "print(json.dumps([p.flashinfer_features(p.RELEASES['0.33']), has_flashinfer_situ_activation()]))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    features, situ = json.loads(run.stdout.strip().splitlines()[-1])
    assert features["situ_activation"] is situ
    if importlib.metadata.version("flashinfer-python") == "0.7.2.post1":
        assert situ is True


def test_the_call_cache_keys_on_the_declared_env_vars_only(monkeypatch, oracle):
    """A cached answer is reused exactly when nothing a decision reads changed: the declared VLLM_* variables are in
    the key, a variable no rule reads is not (it can only add a look-alike warning, on the first ask)."""
    active = plugin._Active(oracle, "vllm-0.33", "the shipped rules", RELEASE)
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    before = plugin._declared_env(active)
    assert "VLLM_BATCH_INVARIANT" in active.env_names and set(before) == {None}
    monkeypatch.setenv("VLLM_SOMETHING_UNREAD", "1")
    assert plugin._declared_env(active) == before
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    assert plugin._declared_env(active) != before
    assert set(active.env_names) == set(oracle.table("vllm-0.33").env_vars)
