"""Deployment overrides: forced backends per model / layer range / role, with provenance; misfits are invalid."""
from __future__ import annotations

import pytest

from oracle import Oracle
from oracle.errors import RuleError
from oracle.loader import display_name
from oracle.overrides import load_overrides
from oracle.store import RuleStore
from oracle.trace import CandidateEntry, StepEntry

from conftest import scenario

OVERRIDES = """\
# yaml-language-server: $schema=../schemas/overrides.schema.json
overrides:
  - id: draft-on-marlin
    match: {role: draft}
    backend: MARLIN
    why: "the draft model runs at batch 1"
  - id: first-layers-emulated
    match: {model: "acme/moe-*", layers: {from: 0, to: 1}}
    backend: EMULATION
    why: "bisecting a numerics bug in the first layers"
  - id: trtllm-everywhere
    match: {model: "acme/trtllm-forced", policy: mxfp4-gpt-oss}
    backend: FLASHINFER_TRTLLM_MXFP4_BF16
    why: "benchmarking the TRTLLM kernel"
  - id: nvfp4-name-on-mxfp4
    match: {model: "acme/wrong-family"}
    backend: VLLM_CUTLASS
    why: "a backend of the nvfp4 family only"
"""

SM90 = scenario("mxfp4-gpt-oss", "cuda:9.0", packages=("triton_kernels", "flashinfer"), activation="swigluoai")


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.fixture
def files(tmp_path):
    path = tmp_path / "overrides.yaml"
    path.write_text(OVERRIDES)
    return path


@pytest.fixture
def loaded(files, oracle):
    return load_overrides(files, [oracle.table("vllm-0.20")])


def test_a_role_override_forces_its_backend_with_provenance_in_decision_and_trace(loaded, oracle, files):
    sc = oracle.prepare(SM90)
    plain = oracle.select(sc)
    ov = loaded.find(sc.policy, model="acme/moe-1", layer=5, role="draft")
    forced = oracle.select(sc, ov)
    assert plain.backend == "TRITON"  # what the rules pick without the override
    assert forced.outcome == "selected" and forced.backend == "MARLIN"
    at = f"{loaded.file}:{_line_of(OVERRIDES, 'id: draft-on-marlin')}"
    assert forced.decided_by.step == "override:draft-on-marlin" and forced.decided_by.at == at
    assert forced.decided_by.why == "the draft model runs at batch 1"
    first = forced.trace[0]
    assert isinstance(first, StepEntry) and first.step == "override:draft-on-marlin" and first.at == at
    assert any(isinstance(e, CandidateEntry) and e.candidate == "MARLIN" and e.accepted for e in forced.trace)
    assert oracle.select(sc) is plain, "the override is part of the cache key: the plain answer is unchanged"


@pytest.mark.parametrize("layer, expected", [(0, "EMULATION"), (1, "EMULATION"), (2, "TRITON"), (None, "TRITON")])
def test_a_layer_range_includes_both_ends_and_needs_a_layer(loaded, oracle, layer, expected):
    sc = oracle.prepare(SM90)
    assert oracle.select(sc, loaded.find(sc.policy, model="acme/moe-7", layer=layer)).backend == expected


def test_the_model_glob_must_match(loaded, oracle):
    sc = oracle.prepare(SM90)
    assert loaded.find(sc.policy, model="other/moe-7", layer=0) is None
    assert loaded.find(sc.policy, model="acme/moe-7", layer=0).id == "first-layers-emulated"


def test_a_forced_backend_that_does_not_fit_is_invalid_naming_the_override_file_and_line(loaded, oracle):
    sc = oracle.prepare(SM90)
    d = oracle.select(sc, loaded.find(sc.policy, model="acme/trtllm-forced"))
    at = f"{loaded.file}:{_line_of(OVERRIDES, 'id: trtllm-everywhere')}"
    assert d.outcome == "invalid", "never a silent swap to another backend"
    assert d.error.startswith(f"override 'trtllm-everywhere' at {at} forces FLASHINFER_TRTLLM_MXFP4_BF16")
    assert "does not support" in d.error, d.error  # the family's own refusal follows, with its reason
    assert d.backend is None


def test_a_backend_of_another_family_is_invalid_naming_the_override(loaded, oracle):
    sc = oracle.prepare(SM90)
    d = oracle.select(sc, loaded.find(sc.policy, model="acme/wrong-family"))
    at = f"{loaded.file}:{_line_of(OVERRIDES, 'id: nvfp4-name-on-mxfp4')}"
    assert d.outcome == "invalid" and d.error.startswith(f"override 'nvfp4-name-on-mxfp4' at {at} forces backend "
                                                         "'VLLM_CUTLASS', which is not a backend of family mxfp4")
    nvfp4 = oracle.prepare(scenario("nvfp4", "cuda:10.0", packages=("flashinfer",)))
    assert oracle.select(nvfp4, loaded.find("nvfp4", model="acme/wrong-family")).backend == "VLLM_CUTLASS"


def test_policy_match_limits_the_override(loaded):
    assert loaded.find("mxfp4-gpt-oss", model="acme/trtllm-forced").id == "trtllm-everywhere"
    assert loaded.find("nvfp4", model="acme/trtllm-forced") is None


@pytest.mark.parametrize("entry, key, words", [
    ('  - {id: a, match: {role: draft}, backend: MARLINN, why: "x"}\n', "backend:",
     "backend 'MARLINN' is not a backend of any family in use (did you mean 'MARLIN'?)"),
    ('  - {id: a, match: {role: draft}, backend: MARLIN, why: "x", bakend: 1}\n', "{id",
     "unknown field 'bakend' in overrides.0 (did you mean 'backend'?)"),
    ('  - {id: a, match: {layers: {from: 4, to: 2}}, backend: MARLIN, why: "x"}\n', "layers:",
     "layers: 'to' (2) is before 'from' (4)"),
    ('  - {id: a, match: {policy: mxfp5}, backend: MARLIN, why: "x"}\n', "policy:",
     "policy 'mxfp5' is not a policy in use (did you mean 'mxfp4'?)"),
    ('  - {id: a, match: {}, backend: MARLIN, why: "x"}\n', "match:", "overrides.0.match"),
])
def test_a_broken_overrides_file_is_refused_at_file_line_col(tmp_path, oracle, entry, key, words):
    """The location is the line of the entry and the column of the offending key."""
    path = tmp_path / "bad.yaml"
    path.write_text("# overrides\noverrides:\n" + entry)
    with pytest.raises(RuleError) as info:
        load_overrides(path, [oracle.table("vllm-0.20")])
    found = info.value.diagnostics
    assert len(found) == 1 and words in found[0].message, found
    assert (found[0].line, found[0].col) == (3, entry.index(key) + 1) and found[0].file.endswith("bad.yaml")


def test_duplicate_ids_are_refused(tmp_path, oracle):
    path = tmp_path / "dup.yaml"
    path.write_text("overrides:\n  - {id: a, match: {role: x}, backend: MARLIN, why: w}\n"
                    "  - {id: a, match: {role: y}, backend: MARLIN, why: w}\n")
    with pytest.raises(RuleError, match=r"dup.yaml:3:\d+: override id 'a' is already used at .*dup.yaml:2"):
        load_overrides(path, [oracle.table("vllm-0.20")])


def test_the_store_applies_overrides_per_layer_and_logs_the_provenance(files, caplog):
    store = RuleStore(overrides=files, plugins=False, profiles=["vllm-0.20"], platform={"kind": "cuda", "capability": [9, 0]},
                      packages={"triton_kernels": True, "flashinfer": True}, env={})
    question = {"policy": "mxfp4-gpt-oss", "profile": "vllm-0.20", "moe": {"activation": "swigluoai"}}
    with caplog.at_level("INFO", logger="moe_oracle"):
        answers = [store.select(question, model="acme/moe-a", layer=i).backend for i in range(4)]
    assert answers == ["EMULATION", "EMULATION", "TRITON", "TRITON"]
    lines = [r.getMessage() for r in caplog.records if r.name == "moe_oracle"]
    assert len(lines) == 2, lines  # one per distinct decision, not one per layer
    assert any("EMULATION" in line and "forced by override 'first-layers-emulated' at" in line for line in lines)


def test_explain_prints_the_override_that_decided(files, capsys):
    from oracle.cli import main

    code = main(["explain", "--profile", "vllm-0.20", "--policy", "mxfp4-gpt-oss", "--platform", "cuda:9.0",
                 "--package", "triton_kernels", "--activation", "swigluoai", "--overrides", str(files), "--role", "draft"])
    out = capsys.readouterr().out
    assert code == 0 and "selected MARLIN" in out
    at = f"{display_name(files)}:{_line_of(OVERRIDES, 'id: draft-on-marlin')}"
    assert f"decided by step 'override:draft-on-marlin' at {at}: the draft model runs at batch 1" in out
    assert f"* step override:draft-on-marlin   ({at})" in out


def test_explain_refuses_a_forced_misfit_with_exit_1(files, capsys):
    from oracle.cli import main

    code = main(["select", "--profile", "vllm-0.20", "--policy", "mxfp4-gpt-oss", "--platform", "cuda:9.0",
                 "--package", "triton_kernels", "--overrides", str(files), "--model", "acme/trtllm-forced"])
    out = capsys.readouterr().out
    assert code == 1 and out.startswith("invalid: override 'trtllm-everywhere' at ")


def test_an_override_on_a_user_rules_directory_is_checked_against_its_tables(tmp_path):
    """Only the tables in use count: a backend of a profile that is not loaded is unknown."""
    o = Oracle()
    path = tmp_path / "o.yaml"
    path.write_text("overrides:\n  - {id: a, match: {role: x}, backend: TRITON_MOE, why: w}\n")
    with pytest.raises(RuleError, match="TRITON_MOE"):
        load_overrides(path, [o.table("vllm-0.20")])
    assert len(load_overrides(path, [o.table("moe-oracle")])) == 1
