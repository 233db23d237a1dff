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
