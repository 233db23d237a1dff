"""The condition language is one table (oracle/operators.py): the schema is generated from it, and the
generated code agrees with a plain reference evaluator written here, over random conditions and facts."""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from oracle import operators
from oracle.compiler import Compiler
from oracle.loader import load_ruleset
from oracle.model import Ctx

ROOT = Path(__file__).resolve().parent.parent


def test_the_schema_condition_is_generated_from_the_operator_table():
    schema = json.loads((ROOT / "schemas" / "rules.schema.json").read_text())
    assert schema["$defs"]["condition"] == operators.condition_schema(), \
        "run: python -m oracle.operators --write schemas/rules.schema.json"
    heads = schema["$defs"]["condition"]["allOf"][-1]["then"]["propertyNames"]["enum"]
    assert heads == [h.key for h in operators.HEADS]


def test_generated_code_is_evaluated_in_one_module_only():
    offenders = [p.name for p in (ROOT / "oracle").glob("*.py")
                 if re.search(r"(?<![\w.])(eval|exec)\(", p.read_text()) and p.name != "codegen.py"]
    assert offenders == []


def test_a_table_shows_its_generated_source(oracle):
    table = oracle.table()
    oracle.select({"policy": next(iter(table.policies)), "platform": {"kind": "cuda", "capability": [9, 0]}})
    source = table.source()
    assert "lambda ctx: " in source and re.search(r"^K\[0\] = ", source, re.M)


# ------------------------------------------------------------------ differential test

RULES = """
env_vars:
  FLAG: {parse: int_bool, default: false, why: "an int_bool switch"}
  TRI: {parse: int_bool, default: null, why: "a tri-state switch"}
  MODE: {parse: choice, choices: [fast, slow], default: slow, why: "a choice"}
derived:
  big_gpu:
    when: {fact: platform.capability, ge: "9.0"}
    why: "a derived fact"
values:
  act_kind:
    map: {silu: gated, gelu: gated, relu2_no_mul: plain}
    of: {fact: moe.activation}
    default: null
    why: "a mapped value"
"""
CAPS = [None, (7, 5), (9, 0), (10, 0), (10, 3), (12, 0)]
CAP_LITERALS = ["7.5", "9.0", "10.0", "11.0"]
FAMILIES = ["9.x", "10.x", "12.x"]
ACTS = ["silu", "gelu", "relu2_no_mul", "swigluoai"]
ENV_VALUES = {"FLAG": ["0", "1"], "TRI": ["0", "1"], "MODE": ["fast", "slow"]}


def _leaf(rng: random.Random) -> dict:
    kind = rng.choice(["cap", "hidden", "act", "lora", "value", "ref", "package", "env_flag", "env_mode"])
    if kind == "cap":
        op = rng.choice(["eq", "ne", "ge", "gt", "le", "lt", "family", "in", "not_in", "is_null"])
        if op == "family":
            return {"fact": "platform.capability", op: rng.choice([rng.choice(FAMILIES), rng.sample(FAMILIES, 2)])}
        if op in ("in", "not_in"):
            return {"fact": "platform.capability", op: rng.sample(CAP_LITERALS, 2)}
        if op == "is_null":
            return {"fact": "platform.capability", op: rng.random() < 0.5}
        return {"fact": "platform.capability", op: rng.choice(CAP_LITERALS)}
    if kind == "hidden":
        ops = rng.sample(["ge", "gt", "le", "lt", "eq", "ne"], rng.choice([1, 2]))
        return {"fact": "moe.hidden_size", **{op: rng.choice([1024, 2880, 4096]) for op in ops}}
    if kind == "act":
        op = rng.choice(["eq", "ne", "in", "not_in"])
        return {"fact": "moe.activation", op: rng.sample(ACTS, 2) if "in" in op else rng.choice(ACTS)}
    if kind == "lora":
        return {"fact": "moe.lora", "eq": rng.random() < 0.5}
    if kind == "value":
        op = rng.choice(["eq", "in", "is_null"])
        arg = {"eq": rng.choice(["gated", "plain"]), "in": ["gated", "plain"], "is_null": rng.random() < 0.5}[op]
        return {"value": "act_kind", op: arg}
    if kind == "ref":
        return {"ref": "big_gpu"}
    if kind == "package":
        return {"package": rng.choice(["flashinfer", "aiter"])}
    if kind == "env_flag":
        spec: dict = {"env": rng.choice(["FLAG", "TRI"])}
        for name, choices in (("set", [True, False]), ("is_set", [True, False]), ("is", [True, False, None]),
                              ("parses_to", [True, False])):
            if rng.random() < 0.4 and not ({"set", "is_set"} & set(spec) and name in ("set", "is_set")) \
                    and not ({"is", "parses_to"} & set(spec) and name in ("is", "parses_to")):
                spec[name] = rng.choice(choices)
        return spec if len(spec) > 1 else {**spec, "is": True}
    if rng.random() < 0.5:
        return {"env": "MODE", "eq": rng.choice(["fast", "slow"])}
    return {"env": "MODE", "in": rng.sample(["fast", "slow"], rng.choice([1, 2]))}


def _condition(rng: random.Random, depth: int = 0) -> dict:
    if depth >= 3 or rng.random() < 0.4:
        return _leaf(rng)
    head = rng.choice(["all", "any", "not"])
    if head == "not":
        return {"not": _condition(rng, depth + 1)}
    return {head: [_condition(rng, depth + 1) for _ in range(rng.choice([1, 2, 3]))]}


def _cap(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def _compare(value, op: str, arg, capability: bool) -> bool:
    """The meaning of each test, written plainly (independent of the operator table's templates)."""
    lit = (lambda x: _cap(x) if capability and isinstance(x, str) else x)
    if op == "eq":
        return value == lit(arg)
    if op == "ne":
        return value != lit(arg)
    if op == "in":
        return value in [lit(x) for x in arg]
    if op == "not_in":
        return value not in [lit(x) for x in arg]
    if op == "is_null":
        return (value is None) == arg
    if value is None:
        return False
    if op == "family":
        return value[0] in [int(f.split(".")[0]) for f in (arg if isinstance(arg, list) else [arg])]
    return {"ge": value >= lit(arg), "gt": value > lit(arg), "le": value <= lit(arg), "lt": value < lit(arg)}[op]


def _env_parsed(name: str, env: dict) -> object:
    if name not in env:
        return {"FLAG": False, "TRI": None, "MODE": "slow"}[name]
    return bool(int(env[name])) if name in ("FLAG", "TRI") else env[name]


def reference(cond: dict, facts: dict, env: dict, packages: set) -> bool:
    if "all" in cond:
        return all(reference(c, facts, env, packages) for c in cond["all"])
    if "any" in cond:
        return any(reference(c, facts, env, packages) for c in cond["any"])
    if "not" in cond:
        return not reference(cond["not"], facts, env, packages)
    if "ref" in cond:
        return facts["platform.capability"] is not None and facts["platform.capability"] >= (9, 0)
    if "package" in cond:
        return cond["package"] in packages
    if "env" in cond:
        name, ok = cond["env"], True
        for key, arg in cond.items():
            if key in ("set", "is_set"):
                ok = ok and (name in env) == arg
            elif key in ("is", "parses_to"):
                ok = ok and _env_parsed(name, env) is arg
            elif key == "eq":
                ok = ok and _env_parsed(name, env) == arg
            elif key == "in":
                ok = ok and _env_parsed(name, env) in arg
        return ok
    if "value" in cond:
        value = {"silu": "gated", "gelu": "gated", "relu2_no_mul": "plain"}.get(facts["moe.activation"])
        return all(_compare(value, op, arg, False) for op, arg in cond.items() if op != "value")
    fact = cond["fact"]
    return all(_compare(facts[fact], op, arg, fact == "platform.capability") for op, arg in cond.items() if op != "fact")


@pytest.fixture(scope="module")
def compiler(tmp_path_factory) -> Compiler:
    path = tmp_path_factory.mktemp("ops") / "rules.yaml"
    path.write_text(RULES)
    return Compiler(load_ruleset([path], "ops", "differential test"))


def test_generated_code_agrees_with_a_reference_evaluator(compiler):
    rng = random.Random(20261122)
    worlds = []
    for _ in range(24):
        facts = {"platform.capability": rng.choice(CAPS), "moe.hidden_size": rng.choice([None, 1024, 2880, 4096]),
                 "moe.activation": rng.choice(ACTS), "moe.lora": rng.random() < 0.5}
        env = {k: rng.choice(v) for k, v in ENV_VALUES.items() if rng.random() < 0.5}
        packages = {p for p in ("flashinfer", "aiter") if rng.random() < 0.5}
        worlds.append((facts, env, packages))
    outcomes = set()
    for _ in range(400):
        cond = _condition(rng)
        compiled = compiler.condition(cond)
        assert compiled is not None and compiled.text
        for facts, env, packages in worlds:
            got = bool(compiled.fn(Ctx(facts, env, frozenset(packages))))
            assert got == reference(cond, facts, env, packages), (cond, facts, env, packages, compiled.code)
            outcomes.add(got)
    assert outcomes == {True, False}


def test_explain_text_comes_from_the_table(compiler):
    cond = {"all": [{"fact": "platform.capability", "ge": "9.0", "lt": "11.0"}, {"env": "FLAG", "is_set": False},
                    {"not": {"package": "aiter"}}]}
    text = compiler.condition(cond).text
    assert text == "(platform.capability >= 9.0 and platform.capability < 11.0 and FLAG is unset " \
                   "and not package aiter installed)"
