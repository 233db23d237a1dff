"""Nothing nonsensical is answered: out-of-range scenario values are `error` answers naming field, value and range;
an env var that looks like a declared one earns a warning (an error under --strict)."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from oracle import Oracle, ScenarioError
from oracle.cli import main
from oracle.facts import RANGES

ORACLE = Oracle()


def answer(**patch):
    return ORACLE.select({"policy": "mxfp4", "profile": "vllm-0.20", "platform": {"kind": "cuda", "capability": [9, 0]}, **patch})


@pytest.mark.parametrize("patch,message", [
    ({"moe": {"parallel": {"dp_size": 0}}}, "moe.parallel.dp_size: 0 is out of range; allowed: an integer from 1 to 65536"),
    ({"moe": {"parallel": {"ep_size": 0}}}, "moe.parallel.ep_size: 0 is out of range; allowed: an integer from 1 to 65536"),
    ({"moe": {"top_k": 0}}, "moe.top_k: 0 is out of range; allowed: an integer from 1 to 65536"),
    ({"moe": {"num_experts": 0}}, "moe.num_experts: 0 is out of range; allowed: an integer from 1 to 65536"),
    ({"moe": {"hidden_size": -2880}}, "moe.hidden_size: -2880 is out of range; allowed: an integer from 1 to 1048576"),
    ({"moe": {"intermediate_size": 0}}, "moe.intermediate_size: 0 is out of range; allowed: an integer from 1 to 1048576"),
    ({"moe": {"top_k": 8, "num_experts": 4}},
     "moe.top_k: 8 is out of range; allowed: 1 to moe.num_experts (4): each token is routed to top_k of the "
     "num_experts experts"),
    ({"moe": {"num_experts": 2}},  # the rules' default top_k (4) no longer fits
     "moe.top_k: 4 (the default) is out of range; allowed: 1 to moe.num_experts (2)"),
    ({"platform": {"kind": "cuda", "capability": [9, 10]}},
     "platform.capability: minor 10 of [9, 10] is out of range; allowed: minor 0 to 9"),
    ({"platform": {"kind": "cuda", "capability": [90, 0]}},
     "platform.capability: major 90 of [90, 0] is out of range; allowed: major 1 to 20"),
    ({"platform": {"kind": "cuda", "capability": [0, 0]}},
     "platform.capability: major 0 of [0, 0] is out of range; allowed: major 1 to 20"),
    ({"quark": {"weight": {"group_size": 0}}}, "quark.weight.group_size: 0 is out of range; allowed: an integer from 1 to 1048576"),
    ({"moe": {"hidden_size": 10 ** 30}}, "moe.hidden_size: an integer of about 31 digits is out of range; allowed: "
                                         "an integer from 1 to 1048576"),
    ({"moe": {"hidden_size": -10 ** 5000}}, "moe.hidden_size: a negative integer of about 5001 digits is out of "
                                            "range"),
    ({"moe": {"num_experts": 65537}}, "moe.num_experts: 65537 is out of range; allowed: an integer from 1 to 65536"),
    ({"moe": {"activation_key": "garbage"}}, "moe.activation_key: 'garbage' is not a quantization key of profile "
                                             "vllm-0.20; expected one of"),
    ({"moe": {"weight_key": "kMxfp4Statc"}}, "moe.weight_key: 'kMxfp4Statc' is not a quantization key of profile "
                                             "vllm-0.20 (did you mean 'kMxfp4Static'?)"),
    ({"moe": {"swiglu_limit": float("nan")}}, "moe.swiglu_limit: expected a finite non-negative number"),
    ({"moe": {"swiglu_limit": float("inf")}}, "moe.swiglu_limit: expected a finite non-negative number"),
])
def test_out_of_range_values_are_error_answers(patch, message):
    d = answer(**patch)
    assert d.outcome == "error" and d.error.startswith(message), d.error


def test_every_ranged_fact_is_checked():
    for fact, (lo, hi) in RANGES.items():
        assert hi is not None, f"{fact}: every size has an upper bound (a huge value is garbage, never a question)"
        for bad in (lo - 1, hi + 1):
            section, *middle, key = fact.split(".")
            value: dict = {key: bad}
            for part in reversed(middle):
                value = {part: value}
            d = ORACLE.select({"policy": "ocp-mx" if section == "quark" else "mxfp4", section: value})
            assert d.outcome == "error" and d.error.startswith(f"{fact}: {bad} is out of range"), (fact, d.error)


def test_values_at_the_edge_of_the_range_are_answered():
    d = answer(moe={"top_k": 1, "num_experts": 1, "parallel": {"dp_size": 1, "ep_size": 1}})
    assert d.outcome == "selected"
    assert answer(platform={"kind": "cuda", "capability": [12, 1]}).outcome != "error"


LOOKALIKE = {"VLLM_MXFP4_USE_MARLN": "1"}
WARNING = ("env.VLLM_MXFP4_USE_MARLN: not a variable these rules read (did you mean 'VLLM_MXFP4_USE_MARLIN'?); "
           "it has no effect")


def test_a_lookalike_env_var_is_a_warning_in_the_answer():
    d = answer(env=LOOKALIKE)
    assert d.outcome == "selected" and d.warnings == (WARNING,)
    assert d.backend == answer().backend  # the typo changes nothing, which is the point of warning
    out = d.to_dict()
    assert out["warnings"] == [WARNING]
    schema = json.loads((Path(__file__).resolve().parents[1] / "schemas" / "decision.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(out)


def test_unrelated_variables_earn_no_warning():
    assert answer(env={"HOME": "/root", "CUDA_VISIBLE_DEVICES": "0", "VLLM_LOGGING_LEVEL": "INFO"}).warnings == ()


def test_strict_makes_the_warning_an_error():
    d = ORACLE.select({"policy": "mxfp4", "profile": "vllm-0.20", "env": LOOKALIKE}, strict=True)
    assert d.outcome == "error" and d.error == WARNING + " (an error under --strict)"
    with pytest.raises(ScenarioError, match="did you mean 'VLLM_MXFP4_USE_MARLIN'"):
        ORACLE.prepare({"policy": "mxfp4", "profile": "vllm-0.20", "env": LOOKALIKE}, strict=True)
    prepared = ORACLE.prepare({"policy": "mxfp4", "profile": "vllm-0.20", "env": LOOKALIKE})
    assert ORACLE.select(prepared, strict=True).outcome == "error"


def test_cli_warns_in_select_and_explain_and_fails_under_strict(capsys):
    argv = ["--profile", "vllm-0.20", "--policy", "mxfp4", "--platform", "cuda:9.0", "--env", "VLLM_MXFP4_USE_MARLN=1"]
    assert main(["select", *argv]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("selected MARLIN") and f"warning: {WARNING}" in err
    assert main(["explain", *argv]) == 0
    assert f"   warning: {WARNING}" in capsys.readouterr().out
    assert main(["select", "--strict", *argv]) == 2
    assert "(an error under --strict)" in capsys.readouterr().err
    assert main(["select", "--policy", "mxfp4", "--platform", "cuda:9.10"]) == 2
    assert "minor 10 of [9, 10] is out of range" in capsys.readouterr().err
