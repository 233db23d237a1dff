"""Properties of the engine itself: purity, caching, errors, traces, vocabulary in one place."""
from __future__ import annotations

import json
import re
from pathlib import Path

from oracle import Oracle, Scenario
from oracle.facts import FACTS
from oracle.registry import resolve
from oracle.trace import CandidateEntry, StepEntry

from conftest import scenario

ROOT = Path(__file__).resolve().parent.parent


def test_schema_fact_enum_is_the_fact_table():
    schema = json.loads((ROOT / "schemas" / "rules.schema.json").read_text())
    assert schema["$defs"]["fact_name"]["enum"] == sorted(FACTS)


def test_select_never_reads_the_process_environment(oracle, monkeypatch):
    sc = scenario("mxfp4-gpt-oss", "cuda:10.0")
    before = oracle.select_uncached(oracle.prepare(sc)).backend
    monkeypatch.setenv("VLLM_USE_FLASHINFER_MOE_MXFP4_BF16", "0")
    monkeypatch.setenv("VLLM_MXFP4_USE_MARLIN", "1")
    assert oracle.select_uncached(oracle.prepare(sc)).backend == before == "FLASHINFER_TRTLLM_MXFP4_BF16"


def test_repeated_question_is_served_from_the_cache(oracle):
    prepared = oracle.prepare(scenario("mxfp4", "cuda:9.0"))
    assert isinstance(prepared, Scenario)
    first = oracle.select(prepared)
    assert oracle.select(prepared) is first
    assert oracle.select(oracle.prepare(scenario("mxfp4", "cuda:9.0"))) is first, "equal scenarios share the answer"
    fresh = oracle.select_uncached(prepared)
    assert fresh is not first and fresh.to_dict() == first.to_dict()


def test_answer_does_not_depend_on_key_order(oracle):
    sc = scenario("mxfp4-gpt-oss", "cuda:9.0", env={"VLLM_MXFP4_USE_MARLIN": "1", "VLLM_BATCH_INVARIANT": "0"},
                  activation="silu")
    reordered = json.loads(json.dumps(dict(reversed(list(sc.items())))))
    reordered["env"] = dict(reversed(list(sc["env"].items())))
    assert oracle.select(reordered).to_dict() == oracle.select(sc).to_dict()


def test_trace_lists_every_failing_check_with_its_rule(oracle):
    d = oracle.select(scenario("mxfp4-gpt-oss", "cuda:7.0", activation="relu2_no_mul", is_act_and_mul=False,
                               packages=()))
    assert d.backend == "EMULATION"
    rejected = [e for e in d.trace if isinstance(e, CandidateEntry) and not e.accepted]
    aiter = next(e for e in rejected if e.candidate == "AITER")
    assert [f.check for f in aiter.failed] == ["device", "act_and_mul", "activation", "quant_scheme"]
    assert all(re.search(r"(kernels|marlin)\.yaml:\d+$", e.at) for e in rejected)
    steps = [e for e in d.trace if isinstance(e, StepEntry)]
    assert steps and all(re.search(r"mxfp4\.yaml:\d+$", e.at) for e in steps)
    assert d.to_dict()["trace"] == [e.to_dict() for e in d.trace]
    assert d.to_dict()["decided_by"]["step"] == "auto"


def test_malformed_scenarios_are_errors_that_name_the_field(oracle):
    cases = {
        "moe.hiden_size: unknown field (did you mean 'hidden_size'?)": {"moe": {"hiden_size": 1}},
        "platform.kind: 'gpu' is not a platform": {"platform": {"kind": "gpu"}},
        "platform.capability: expected [major, minor]": {"platform": {"kind": "cuda", "capability": "9.0"}},
        "platform.gcn_arch: 'gfx1100' is not a known ROCm arch": {"platform": {"kind": "rocm", "gcn_arch": "gfx1100"}},
        "env.VLLM_MXFP4_USE_MARLIN: values are strings": {"env": {"VLLM_MXFP4_USE_MARLIN": 0}},
        "packages.flashinfr: unknown field (did you mean 'flashinfer'?)": {"packages": {"flashinfr": True}},
        "moe.activation: 'swiglu' is not an activation (did you mean 'swigluoai'?)": {"moe": {"activation": "swiglu"}},
        "moe.parallel.dp_size: expected an integer from 1 to 65536, got '2'": {"moe": {"parallel": {"dp_size": "2"}}},
    }
    for message, patch in cases.items():
        d = oracle.select({"policy": "mxfp4", **patch})
        assert d.outcome == "error", patch
        assert d.error.startswith(message), (d.error, message)
    assert oracle.select({"policy": "mxfp5"}).error.startswith("policy: unknown policy 'mxfp5' (did you mean 'mxfp4'?)")
    assert oracle.select({"policy": "mxfp4", "profile": "vllm-0.2"}).error.startswith("profile: unknown profile 'vllm-0.2'")


def test_refusals_always_explain_themselves(oracle):
    """Each refusal names its cause (and, where one exists, the way out), not just some text."""
    cases = {
        ("unsupported", "No MXFP4 MoE backend supports the deployment configuration."):
            scenario("mxfp4", "cpu"),
        ("unsupported", "Mxfp4 LoRA is currently only supported on CUDA (platform is rocm); disable LoRA"):
            scenario("mxfp4-gpt-oss", "rocm:gfx950", lora=True),
        ("invalid", "Mxfp4 MoE backend 'XPU' does not support the deployment configuration since kernel does "
                    "not support current device cuda."):
            scenario("mxfp4-gpt-oss", "cuda:8.0", moe_backend="xpu"),
    }
    for (outcome, words), sc in cases.items():
        d = oracle.select(sc)
        assert d.outcome == outcome and words in d.error, d.error


def test_profiles_are_listed_with_a_description(oracle):
    profiles = oracle.profiles()
    assert {"vllm-0.20", "vllm-0.15", "vllm-0.33"} <= set(profiles) and oracle.default_profile == "vllm-0.33"
    assert "vLLM 0.20.0" in profiles["vllm-0.20"] and "vLLM 0.15.1" in profiles["vllm-0.15"]


def test_a_user_rules_directory_replaces_the_shipped_one(tmp_path):
    (tmp_path / "p.yaml").write_text((ROOT / "tests" / "bad_rules" / "valid.yaml").read_text())
    (tmp_path / "profiles.yaml").write_text("default: mine\nprofiles:\n  mine: {description: 'my rules', files: [p.yaml]}\n")
    o = Oracle(tmp_path)
    assert o.select({"policy": "pol", "platform": {"kind": "cuda", "capability": [8, 0]}}).backend == "TRITON"
    assert o.select({"policy": "pol", "platform": {"kind": "cpu"}}).outcome == "unsupported"
    d = o.select({"policy": "pol", "platform": {"kind": "cpu"}, "env": {"VLLM_FORCE_TRITON": "1"}})
    assert d.outcome == "invalid" and d.error == "backend 'TRITON' rejected: device cpu"


def test_oracle_modules_never_import_torch_at_module_level():
    for path in (ROOT / "oracle").glob("*.py"):
        top_level = [line for line in path.read_text().splitlines() if line.startswith(("import ", "from "))]
        assert not any("torch" in line or "triton" in line for line in top_level), path.name


def test_unsupported_names_every_candidate_with_its_first_failing_check(oracle):
    d = oracle.select(scenario("mxfp4", "cpu"))
    assert d.outcome == "unsupported"
    summary = dict(part.split(": ", 1) for part in d.error.split("Candidates: ", 1)[1].rstrip(".").split("; "))
    assert list(summary) == ["FLASHINFER_TRTLLM_MXFP4_MXFP8", "DEEPGEMM_MXFP4", "MARLIN", "BATCHED_MARLIN"]
    # each candidate's false leaves, not a generic reason
    assert summary["MARLIN"] == ("platform.kind cpu is not cuda, "
                                  "platform.capability null cannot be compared (needs a value that is at least 7.5)")
    assert summary["DEEPGEMM_MXFP4"].startswith("platform.kind cpu is not cuda, platform.capability null is not 9.0")
    lora = oracle.select(scenario("mxfp4-gpt-oss", "xpu", lora=True))
    assert lora.outcome == "unsupported" and "Candidates" not in lora.error, "no candidate was tried"


def test_rule_values_are_data_never_code(tmp_path):
    """Generated conditions reference constants by index: a rule value that looks like code is only compared."""
    text = (ROOT / "tests" / "bad_rules" / "valid.yaml").read_text().replace(
        "device: {fact: platform.kind, eq: cuda}",
        "device: {fact: quark.weight.dtype, eq: \"__import__('os').system('exit 3')\"}")  # an open-vocabulary fact
    (tmp_path / "p.yaml").write_text(text)
    (tmp_path / "profiles.yaml").write_text("default: x\nprofiles:\n  x: {description: 'code as data', files: [p.yaml]}\n")
    o = Oracle(tmp_path)
    d = o.select({"policy": "pol", "platform": {"kind": "cuda", "capability": [9, 0]},
                  "quark": {"weight": {"dtype": "__import__('os').system('exit 3')"}}})
    assert d.backend == "TRITON", "the string matched as a value"
    assert o.select({"policy": "pol", "platform": {"kind": "cuda", "capability": [9, 0]}}).outcome == "unsupported"


def test_emulation_backends_name_the_reference_implementation(oracle):
    from backends.runners.emulation import EmulationRunner

    for policy, platform in (("mxfp4-gpt-oss", "cuda:7.0"), ("nvfp4", "cuda:7.0")):
        d = oracle.select(scenario(policy, platform, packages=(), env={"VLLM_BATCH_INVARIANT": "1"},
                                   activation="silu"))
        assert d.backend == "EMULATION", d.error
        assert d.converter is None and "converter" in d.missing_why
        assert resolve(d.runner) is EmulationRunner


def test_engine_modules_stay_small():
    """One stage per module (see the layout in oracle/api.py's docstring); none over ~400 lines."""
    sizes = {p.name: len(p.read_text().splitlines()) for p in (ROOT / "oracle").glob("*.py")}
    assert {n: s for n, s in sizes.items() if s > 400} == {}


def test_a_kernel_check_is_a_data_edit(tmp_path):
    """A kernel's own `requires` adds a check (name, condition, reason) that explain, refusals and the
    fast path all honour, with no engine edit."""
    text = (ROOT / "tests" / "bad_rules" / "valid.yaml").read_text().replace(
        '    why: "triton kernel"\n',
        '    requires:\n'
        '      - {check: hidden_alignment, when: {fact: moe.hidden_size, ge: 256}, reason: "hidden {moe.hidden_size} < 256"}\n'
        '    why: "triton kernel"\n', 1)
    (tmp_path / "p.yaml").write_text(text)
    (tmp_path / "profiles.yaml").write_text("default: x\nprofiles:\n  x: {description: 'extra check', files: [p.yaml]}\n")
    o = Oracle(tmp_path)
    base = {"policy": "pol", "platform": {"kind": "cuda", "capability": [9, 0]}}
    assert o.select({**base, "moe": {"hidden_size": 512}}).backend == "TRITON"
    small = o.select({**base, "moe": {"hidden_size": 128}, "env": {"VLLM_FORCE_TRITON": "1"}})
    assert small.outcome == "invalid" and small.error == "backend 'TRITON' rejected: hidden 128 < 256"
    refused = [e for e in small.trace if isinstance(e, CandidateEntry)]
    assert [(f.check, f.condition) for f in refused[0].failed] == [("hidden_alignment", "moe.hidden_size >= 256")]


def test_a_rules_directory_extends_the_shipped_rules(tmp_path):
    """A user directory adds one profile on top of the shipped ones: differences only, overrides explicit."""
    (tmp_path / "no-trtllm.yaml").write_text(
        "policies:\n  mxfp4-gpt-oss:\n    override: true\n    family: mxfp4\n"
        "    description: \"gpt-oss without TRT-LLM\"\n    candidates: [TRITON, MARLIN]\n"
        "    steps:\n      - {id: auto, try: candidates, why: \"only these two\"}\n"
        "      - {id: none-fits, outcome: unsupported, message: \"neither fits\", why: \"a test profile\"}\n")
    (tmp_path / "profiles.yaml").write_text(
        "extends: builtin\ndefault: mine\nprofiles:\n"
        "  mine: {description: 'vllm-0.20 without TRT-LLM', extends: vllm-0.20, files: [no-trtllm.yaml]}\n")
    o = Oracle(tmp_path)
    assert {"vllm-0.20", "vllm-0.15", "mine"} <= set(o.profiles())
    sm100 = scenario("mxfp4-gpt-oss", "cuda:10.0", profile=None)
    assert o.select({**sm100, "profile": "vllm-0.20"}).backend == "FLASHINFER_TRTLLM_MXFP4_BF16"
    mine = o.select(sm100)
    assert mine.profile == "mine" and mine.backend == "TRITON" and mine.decided_by.at.endswith("no-trtllm.yaml:8")
