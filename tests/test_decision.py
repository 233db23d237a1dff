"""Answers are immutable and come from one snapshot of the rules that a reload swaps whole."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from oracle import Decision, Oracle, RuleError
from oracle.trace import CandidateEntry

from conftest import scenario

ROOT = Path(__file__).resolve().parent.parent


def test_one_callers_edit_cannot_leak_into_later_answers(oracle):
    """The cache hands the same Decision to every caller; before Decision was frozen, a caller's
    `d.backend = ...` or `d.extras[...] = ...` changed every later answer to the same question."""
    sc = {**scenario("ocp-mx", "cuda:9.0"), "quark": {"weight": {"dtype": "fp4", "qscheme": "per_group"}}}
    first = oracle.select(sc)
    assert first.outcome == "selected" and "emulate" in first.extras, first.error
    before = first.to_dict()
    with pytest.raises(AttributeError):
        first.backend = "SOMETHING_ELSE"  # type: ignore[misc]
    with pytest.raises(TypeError):
        first.extras["emulate"] = False  # type: ignore[index]
    with pytest.raises(AttributeError):
        first.rule_files.append("mine.yaml")  # type: ignore[attr-defined]
    mutable_copy = first.to_dict()
    mutable_copy["backend"] = "EDITED"
    mutable_copy["trace"].clear()
    again = oracle.select(sc)
    assert again is first and again.to_dict() == before


def test_from_dict_reads_back_to_dict(oracle):
    for sc in (scenario("mxfp4-gpt-oss", "cuda:10.0"), scenario("mxfp4", "cpu"),
               scenario("nvfp4", "cuda:10.0", env={"VLLM_USE_FLASHINFER_MOE_FP4": "1"}, packages=())):
        d = oracle.select(sc)
        back = Decision.from_dict(d.to_dict())
        assert back.to_dict() == d.to_dict()
        assert back.decided_by == d.decided_by and back.trace == d.trace
        assert any(isinstance(e, CandidateEntry) for e in back.trace)
    with pytest.raises(ValueError, match="outcome: 'maybe' is not one of"):
        Decision.from_dict({"outcome": "maybe"})


def test_reload_swaps_the_whole_snapshot(tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    shutil.copy(ROOT / "tests" / "bad_rules" / "valid.yaml", rules)  # only listed files: a stray one is an error
    (rules / "profiles.yaml").write_text("default: p\nprofiles:\n  p: {description: 'test rules', files: [valid.yaml]}\n")
    o = Oracle(rules)
    cuda = {"policy": "pol", "platform": {"kind": "cuda", "capability": [8, 0]}}
    first = o.select(cuda)
    assert first.backend == "TRITON" and o.select(cuda) is first
    old = o.snapshot

    text = (rules / "valid.yaml").read_text()
    (rules / "valid.yaml").write_text(text.replace("device: {fact: platform.kind, eq: cuda}",
                                                   "device: {fact: platform.kind, eq: rocm}"))
    o.reload()
    assert o.snapshot is not old and o.snapshot.answers == {}, "tables and answers are replaced together"
    assert o.select(cuda).outcome == "unsupported", "answers come from the new rules"

    (rules / "valid.yaml").write_text(text.replace("why: \"triton kernel\"", "whyy: \"typo\""))
    current = o.snapshot
    with pytest.raises(RuleError, match="unknown field 'whyy'"):
        o.reload()
    assert o.snapshot is current, "broken rules never replace a working snapshot"
