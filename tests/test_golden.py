"""Every case of the golden sample (answers of vLLM's own executed selection code).

Outcome, backend, kernel, sizes and the OCP-MX fields must agree exactly; vLLM's error
text need not (ours names the cause and the fix), so `vllm_error` is not compared.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

CASES = [json.loads(line) for line in (Path(__file__).parent / "data" / "golden-sample.jsonl").read_text().splitlines()
         if line.strip()]


def _id(i: int, case: dict) -> str:
    s = case["scenario"]
    return f"{i}-{s.get('profile')}-{s['policy']}-{s.get('query', 'select')}-{case['expected']['outcome']}"


@pytest.mark.parametrize("case", CASES, ids=[_id(i, c) for i, c in enumerate(CASES)])
def test_golden_case(oracle, case):
    got = oracle.select(case["scenario"]).to_dict(with_trace=False)
    expected = {k: v for k, v in case["expected"].items() if k != "vllm_error"}
    assert {k: got.get(k) for k in expected} == expected, got.get("error")
    if expected["outcome"] in ("invalid", "unsupported"):
        assert got["error"], "a refusal must say why"


def test_sample_covers_every_policy():
    assert {c["scenario"]["policy"] for c in CASES} == {"mxfp4-gpt-oss", "mxfp4", "nvfp4", "ocp-mx"}


def test_every_answer_matches_the_decision_schema(oracle):
    import jsonschema

    schema = json.loads((Path(__file__).resolve().parent.parent / "schemas" / "decision.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    for case in CASES:
        out = oracle.select(case["scenario"]).to_dict()
        errors = [e.message for e in validator.iter_errors(out)]
        assert not errors, (case["scenario"], errors[:3])
    bad = oracle.select({"policy": "mxfp4", "moe": {"hiden_size": 1}}).to_dict()
    assert not list(validator.iter_errors(bad))
