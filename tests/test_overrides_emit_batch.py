"""Deployment overrides on policies whose steps emit answer fields (ocp-mx), and `select --batch --overrides`
(issue 12 item 4, the gaps its closing note left)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracle import Oracle
from oracle.cli import main
from oracle.overrides import load_overrides
from oracle.trace import StepEntry

DATA = Path(__file__).parent / "data"
PROFILES = ("vllm-0.15", "vllm-0.20", "vllm-0.33", "moe-oracle")
W_MXFP4 = {"weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0"}}


def _ocp_mx_questions() -> list[dict]:
    """Every ocp-mx selection question of the golden samples, asked under each profile."""
    out = []
    for name in ("golden-sample.jsonl", "golden-sample-vllm-0.33.jsonl"):
        for line in (DATA / name).read_text().splitlines():
            sc = json.loads(line)["scenario"]
            if sc["policy"] == "ocp-mx" and sc.get("query") in (None, "select"):
                out += [{**sc, "profile": p} for p in PROFILES]
    return out


@pytest.fixture(scope="module")
def forcing(tmp_path_factory):
    """An overrides file with one entry per backend of the mxfp4 families, matched by role = the backend's name."""
    oracle = Oracle()
    tables = [oracle.table(p) for p in PROFILES]
    names = sorted({b for t in tables for f in t.families.values() if f.name == "mxfp4" for b in f.backends})
    path = tmp_path_factory.mktemp("ov") / "force.yaml"
    path.write_text("overrides:\n" + "".join(
        f"  - {{id: force-{n.lower()}, match: {{policy: ocp-mx, role: {n}}}, backend: {n}, why: \"test\"}}\n"
        for n in names))
    return load_overrides(path, tables)


def test_forcing_the_backend_the_rules_pick_keeps_every_emitted_answer_field(oracle, forcing):
    """Where the rules select backend B, an override forcing B answers B with exactly the same answer fields
    (ocp_mx_scheme, emulate, static_input_scales): the emit steps still run, and call.backend reads B.
    (Not where the rules take B without its support check, e.g. EMULATION on CPU: a forced backend is checked.)"""
    checked = set()
    for sc in _ocp_mx_questions():
        plain = oracle.select(sc)
        policy = oracle.table(sc["profile"]).policies["ocp-mx"]
        if plain.outcome != "selected" or any(s.id == plain.decided_by.step and not s.check for s in policy.steps):
            continue
        family = policy.family
        name = family.by_value[plain.backend].name if plain.backend in family.by_value else plain.backend
        forced = oracle.select(sc, forcing.find("ocp-mx", role=name))
        assert forced.decided_by.step == f"override:force-{name.lower()}", sc
        assert (forced.outcome, forced.backend) == ("selected", plain.backend), sc
        assert dict(forced.extras) == dict(plain.extras) and plain.extras, sc
        checked.add((sc["profile"], tuple(sorted(plain.extras))))
    assert {p for p, _ in checked} == set(PROFILES), checked  # every profile's ocp-mx policy took part
    assert any("emulate" in fields for _, fields in checked)


def test_the_emit_steps_are_in_the_trace_before_the_forcing_step(oracle, forcing):
    sc = {"policy": "ocp-mx", "profile": "vllm-0.20", "platform": {"kind": "rocm", "gcn_arch": "gfx950"},
          "packages": {"aiter": True}, "env": {"VLLM_ROCM_USE_AITER": "1"}, "quark": W_MXFP4}
    d = oracle.select(sc, forcing.find("ocp-mx", role="EMULATION"))
    steps = [e.step for e in d.trace if isinstance(e, StepEntry)]
    assert steps == ["answer-fields", "override:force-emulation"]
    assert d.backend == "EMULATION" and d.extras["ocp_mx_scheme"] == "w_mxfp4"


def test_emitted_fields_that_read_the_selected_backend_read_the_forced_one(oracle, forcing):
    """vllm-0.15's emulate = (no native MX or not an MXFP4 scheme) and (backend NONE or AITER MoE off): an MXFP6
    layer left to the rules keeps backend NONE and is emulated; with AITER forced and AITER MoE on it is not."""
    sc = {"policy": "ocp-mx", "profile": "vllm-0.15", "platform": {"kind": "rocm", "gcn_arch": "gfx950"},
          "packages": {"aiter": True}, "env": {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MOE": "1"},
          "quark": {"weight": {**W_MXFP4["weight"], "dtype": "fp6_e3m2"}}}
    plain = oracle.select(sc)
    assert (plain.outcome, plain.extras["ocp_mx_scheme"], plain.extras["emulate"]) == ("none", "w_mxfp6_e3m2", True)
    forced = oracle.select(sc, forcing.find("ocp-mx", role="AITER"))
    assert (forced.outcome, forced.backend) == ("selected", "AITER")
    assert forced.extras == {**plain.extras, "emulate": False}
    assert oracle.select(sc) is plain  # the plain answer is not touched by the forced one


def test_a_forced_backend_outside_the_family_still_answers_the_emitted_fields(oracle, tmp_path):
    path = tmp_path / "o.yaml"
    path.write_text("overrides:\n  - {id: nvfp4-name, match: {policy: ocp-mx}, backend: VLLM_CUTLASS, why: w}\n")
    found = load_overrides(path, [oracle.table("vllm-0.20")])
    sc = {"policy": "ocp-mx", "profile": "vllm-0.20", "platform": {"kind": "cuda", "capability": [9, 0]},
          "quark": W_MXFP4}
    d = oracle.select(sc, found.find("ocp-mx"))
    assert d.outcome == "invalid" and d.error.startswith(f"override 'nvfp4-name' at {found.file}:2 forces backend")
    assert d.extras["ocp_mx_scheme"] == "w_mxfp4"


OVERRIDES = """\
overrides:
  - id: draft-on-marlin
    match: {role: draft}
    backend: MARLIN
    why: "the draft model runs at batch 1"
  - id: first-layers-emulated
    match: {model: "acme/*", layers: {from: 0, to: 1}}
    backend: EMULATION
    why: "bisecting"
"""
SM90 = {"policy": "mxfp4-gpt-oss", "profile": "vllm-0.20", "platform": {"kind": "cuda", "capability": [9, 0]},
        "packages": {"triton_kernels": True}, "moe": {"activation": "swigluoai"}}


def test_batch_with_overrides_names_the_deciding_entry_in_each_answer(tmp_path, capsys):
    overrides = tmp_path / "deploy.yaml"
    overrides.write_text(OVERRIDES)
    batch = tmp_path / "layers.jsonl"
    batch.write_text("\n".join(json.dumps(x) for x in [
        SM90,                                              # no deployment keys: the --role default (draft)
        {"scenario": SM90, "model": "acme/moe", "layer": 0, "role": None},   # the layer range
        {"scenario": SM90, "model": "acme/moe", "layer": 5, "role": None},   # no entry: the rules decide
        {"scenario": SM90, "layer": "five"},               # a bad deployment key: an error answer, in order
    ]) + "\n")
    code = main(["select", "--batch", str(batch), "--overrides", str(overrides), "--role", "draft"])
    out, err = capsys.readouterr()
    answers = [json.loads(x) for x in out.splitlines()]
    assert code == 1 and len(answers) == 4
    assert (answers[0]["backend"], answers[0]["decided_by"]["step"]) == ("MARLIN", "override:draft-on-marlin")
    assert answers[0]["decided_by"]["at"] == f"{overrides}:2" or answers[0]["decided_by"]["at"].endswith("deploy.yaml:2")
    assert (answers[1]["backend"], answers[1]["decided_by"]["step"]) == ("EMULATION", "override:first-layers-emulated")
    assert answers[1]["decided_by"]["at"].endswith("deploy.yaml:6")
    assert answers[2]["backend"] == "TRITON" and not answers[2]["decided_by"]["step"].startswith("override:")
    assert answers[3]["outcome"] == "error" and answers[3]["error"] == (
        f"{batch}:4: layer: 'five' is not an integer (the layer an --overrides entry matches)")
    assert err == "moe-oracle: warning: 1 of 4 line(s) not answered selected/none (line 4); exit 1\n"


def test_batch_without_overrides_answers_as_before_and_refuses_deployment_flags(tmp_path, capsys):
    batch = tmp_path / "b.jsonl"
    batch.write_text(json.dumps({"scenario": SM90, "role": "draft"}) + "\n")
    assert main(["select", "--batch", str(batch)]) == 0
    assert json.loads(capsys.readouterr().out)["backend"] == "TRITON"  # role without --overrides picks nothing
    assert main(["select", "--batch", str(batch), "--role", "draft"]) == 2
    assert "give the file too" in capsys.readouterr().err
