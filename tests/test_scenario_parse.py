"""Scenario parsing takes values of the usual shape inline; that path must agree with the general checks
(`_typed`, the one place that words a value's error) for every fact and every kind of value."""
from __future__ import annotations

import pytest

from oracle import Oracle, ScenarioError
from oracle.facts import FACTS
from oracle.scenario import _typed, parse_scenario


class Int(int):
    pass


class Str(str):
    pass


PROBES = [0, 1, -1, 2**40, True, False, None, "", "silu", Str("silu"), Int(4), 1.5, [1], {"a": 1}]
LEVELS = {"moe.parallel.": ("moe", "parallel"), "moe.": ("moe",)}
TABLE = Oracle().table("vllm-0.20")


def level_of(fact: str) -> tuple[str, ...] | None:
    return next((path + (fact[len(prefix):],) for prefix, path in LEVELS.items() if fact.startswith(prefix)), None)


def question(path: tuple[str, ...], value: object) -> dict:
    nested: object = value
    for part in reversed(path):
        nested = {part: nested}
    return {"policy": "mxfp4", "platform": {"kind": "cuda", "capability": [9, 0]}, **nested}  # type: ignore[dict-item]


@pytest.mark.parametrize("fact", [f for f in FACTS if level_of(f) is not None])
def test_the_inline_path_agrees_with_the_general_check(fact):
    path = level_of(fact)
    for value in PROBES:
        try:
            expected = ("ok", _typed(value, FACTS[fact][0], fact))
        except ScenarioError as exc:
            expected = ("error", str(exc))
        try:
            got = ("ok", parse_scenario(question(path, value), TABLE).facts[fact])
        except ScenarioError as exc:
            got = ("error", str(exc))
        if got[0] == "error" and expected[0] == "ok":  # a vocabulary check after the type check (activation, ...)
            assert not got[1].startswith(f"{fact}: expected"), (fact, value, got)
            continue
        assert got == expected and type(got[1]) is type(expected[1]), (fact, value, got, expected)


@pytest.mark.parametrize("capability", [[9, 0], (9, 0), [True, 0], [9.0, 0], [9], [9, 0, 0], "9.0", None, [21, 0],
                                        [Int(9), 0]])
def test_a_capability_is_taken_inline_only_in_its_usual_shape(capability):
    raw = {"policy": "mxfp4", "platform": {"kind": "cuda", "capability": capability}}
    try:
        got = parse_scenario(raw, TABLE).facts["platform.capability"]
    except ScenarioError as exc:
        assert str(exc).startswith("platform.capability: "), exc
        return
    assert got == (9, 0) and type(got) is tuple and all(type(x) is int or isinstance(x, Int) for x in got)


@pytest.mark.parametrize("packages,message", [
    ([], "packages: expected a mapping, got list"), ("", "packages: expected a mapping, got str"),
    ({"flashinfr": True}, "packages.flashinfr: unknown field (did you mean 'flashinfer'?)"),
    ({"flashinfer": 1}, "packages.flashinfer: expected true or false, got 1"),
])
def test_packages_errors(packages, message):
    with pytest.raises(ScenarioError) as caught:
        parse_scenario({"policy": "mxfp4", "packages": packages}, TABLE)
    assert str(caught.value).startswith(message)


def test_packages_present_and_absent():
    sc = parse_scenario({"policy": "mxfp4", "packages": {"flashinfer": True, "triton_kernels": False}}, TABLE)
    assert sc.packages == frozenset({"flashinfer"})
    assert parse_scenario({"policy": "mxfp4", "packages": {}}, TABLE).packages == frozenset()
