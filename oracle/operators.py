"""The condition language, once: one row per operator with its schema fragment, code and explain text.

Everything that reads conditions goes through this table: the JSON Schema's `$defs.condition`
is generated from it (`python -m oracle.operators` prints it; a test checks the shipped schema),
the semantic checks walk conditions with `children`/`references`, the compiler fills the code
templates, and explain renders the text templates.

A condition is a mapping introduced by one *head* key (`all`, `any`, `not`, `ref`, `package`,
`env`, `fact`, `value`); `env`, `fact` and `value` take *tests* beside the head
(`{fact: platform.capability, ge: "9.0"}`), all of which must hold.

Code templates: `{x}` is the subject expression (a fact read, a value call, a parsed env var),
`{k}` the constant the rule gives (always a reference into the constant table, never rule text),
`{present}` whether an env var is set. Text templates: `{subject}` and `{shown}` (the rule value).
"""
from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

NAME_PATTERN = "^[A-Za-z_][A-Za-z0-9_.-]*$"
_SCALAR: dict[str, Any] = {"type": ["string", "number", "boolean", "null"]}
_CAPABILITY: dict[str, Any] = {"anyOf": [
    {"type": "number"},
    {"type": "string", "pattern": "^[0-9]+\\.[0-9]+$", "description": "capability 'major.minor', e.g. \"9.0\""}]}
_OPERAND: dict[str, Any] = {"type": "object", "additionalProperties": False, "minProperties": 1, "maxProperties": 1,
                             "description": "another fact or named value to compare with",
                             "properties": {"fact": {"$ref": "#/$defs/fact_name"},
                                            "value": {"type": "string", "pattern": NAME_PATTERN}}}
_FAMILY_ONE: dict[str, Any] = {"type": "string", "pattern": "^[0-9]+\\.x$",
                               "description": "capability family 'major.x', e.g. \"10.x\""}


@dataclass(frozen=True)
class Test:
    """One test beside a head: `ge` in `{fact: platform.capability, ge: "9.0"}`."""

    name: str
    schema: dict[str, Any]
    code: str
    text: str
    literal: str = "scalar"  # how the rule value becomes a constant: scalar | set | majors | bool | raw | int
    # | operand: the rule value is another fact or value ({fact: ...} / {value: ...}), read, not a constant
    words: tuple[tuple[Any, str], ...] = ()  # text for particular rule values (set: true -> "is set")
    aliases: tuple[str, ...] = ()  # clearer names the schema also accepts

    def render(self, subject: str, raw: Any, shown: str) -> str:
        for value, word in self.words:
            if raw is value:
                return f"{subject} {word}"
        return self.text.format(subject=subject, shown=shown)


@dataclass(frozen=True)
class Head:
    """A condition kind, named by the key that introduces it."""

    key: str
    schema: dict[str, Any]
    code: str  # combinators: the word joining the parts; leaves: the template
    text: str
    children: str = ""  # "list" (all/any), "one" (not) or "" (a leaf)
    refers_to: str = ""  # rule section that must define the name (semantics), "" for none
    what: str = ""  # how that name is called in messages
    tests: tuple[Test, ...] = ()
    tests_required: bool = False

    def test(self, name: str) -> Test | None:
        for t in self.tests:
            if name == t.name or name in t.aliases:
                return t
        return None

    def test_names(self) -> tuple[str, ...]:
        return tuple(n for t in self.tests for n in (t.name, *t.aliases))




def _ORDER(op: str) -> str:
    """Order tests are false for a missing value (vLLM compares only known capabilities)."""
    return "((_v := {x}) is not None and _v " + op + " {k})"


COMPARISONS: tuple[Test, ...] = (
    Test("eq", _SCALAR, "({x} == {k})", "{subject} == {shown}"),
    Test("ne", _SCALAR, "({x} != {k})", "{subject} != {shown}"),
    Test("in", {"type": "array", "items": _SCALAR, "minItems": 1}, "({x} in {k})", "{subject} in {shown}", "set"),
    Test("not_in", {"type": "array", "items": _SCALAR, "minItems": 1}, "({x} not in {k})", "{subject} not in {shown}",
         "set"),
    Test("ge", _CAPABILITY, _ORDER(">="), "{subject} >= {shown}"),
    Test("gt", _CAPABILITY, _ORDER(">"), "{subject} > {shown}"),
    Test("le", _CAPABILITY, _ORDER("<="), "{subject} <= {shown}"),
    Test("lt", _CAPABILITY, _ORDER("<"), "{subject} < {shown}"),
    Test("family", {"anyOf": [_FAMILY_ONE, {"type": "array", "items": _FAMILY_ONE, "minItems": 1}]},
         "((_v := {x}) is not None and _v[0] in {k})", "{subject} in family {shown}", "majors"),
    Test("is_null", {"type": "boolean"}, "(({x} is None) == {k})", "{subject} is null: {shown}", "bool"),
    Test("multiple_of", {"type": "integer", "minimum": 1, "description": "divisible by this integer"},
         "((_v := {x}) is not None and _v % {k} == 0)", "{subject} is a multiple of {shown}", "int"),
    Test("same_as", _OPERAND, "({x} == {k})", "{subject} == {shown}", "operand"),
    Test("differs_from", _OPERAND, "({x} != {k})", "{subject} != {shown}", "operand"),
)

ENV_TESTS: tuple[Test, ...] = (
    Test("set", {"type": "boolean", "description": "present in the environment (any value, even \"0\")"},
         "({present} == {k})", "{subject} is set", "bool", words=((True, "is set"), (False, "is unset")),
         aliases=("is_set",)),
    Test("is", {"type": ["boolean", "null"], "description": "parsed value (the declared default when unset)"},
         "({x} is {k})", "{subject} is {shown}", "raw", aliases=("parses_to",)),
    Test("eq", {"type": "string"}, "({x} == {k})", "{subject} == {shown}", "raw"),
    Test("in", {"type": "array", "items": {"type": "string"}, "minItems": 1}, "({x} in {k})", "{subject} in {shown}",
         "set"),
)

# How explain words one test of a leaf after the subject and its actual value ("platform.capability 9.0 ..."):
# (text when it holds, text when it fails); boolean tests give both per rule value. (`fact` rows serve `value` too.)
LEAF_TEXTS: dict[tuple[str, str], tuple[Any, Any]] = {
    ("fact", "eq"): ("is {shown}", "is not {shown}"),
    ("fact", "ne"): ("is not {shown}", "is {shown}"),
    ("fact", "in"): ("is in {shown}", "is not in {shown}"),
    ("fact", "not_in"): ("is not in {shown}", "is in {shown}"),
    ("fact", "ge"): ("is at least {shown}", "is below {shown}"),
    ("fact", "gt"): ("is above {shown}", "is not above {shown}"),
    ("fact", "le"): ("is at most {shown}", "is above {shown}"),
    ("fact", "lt"): ("is below {shown}", "is not below {shown}"),
    ("fact", "family"): ("is in family {shown}", "is not in family {shown}"),
    ("fact", "is_null"): ({True: "is null", False: "is not null"}, {True: "is not null", False: "is null"}),
    ("fact", "multiple_of"): ("is a multiple of {shown}", "is not a multiple of {shown}"),
    ("fact", "same_as"): ("equals {shown}", "differs from {shown}"),
    ("fact", "differs_from"): ("differs from {shown}", "equals {shown}"),
    ("env", "set"): ({True: "is set", False: "is unset"}, {True: "is unset", False: "is set"}),
    ("env", "is"): ("parses to {shown}", "does not parse to {shown}"),
    ("env", "eq"): ("is {shown}", "is not {shown}"),
    ("env", "in"): ("is in {shown}", "is not in {shown}"),
}

HEADS: tuple[Head, ...] = (
    Head("all", {"type": "array", "items": {"$ref": "#/$defs/condition"}, "minItems": 1}, "and", "({parts})",
         children="list"),
    Head("any", {"type": "array", "items": {"$ref": "#/$defs/condition"}, "minItems": 1}, "or", "({parts})",
         children="list"),
    Head("not", {"$ref": "#/$defs/condition"}, "(not {part})", "not {part}", children="one"),
    Head("ref", {"type": "string", "pattern": NAME_PATTERN, "description": "name of a derived fact"},
         "{k}(ctx)", "{name}", refers_to="derived", what="derived fact"),
    Head("package",
         {"type": "string", "pattern": NAME_PATTERN, "description": "true when the optional package is installed"},
         "({k} in ctx.packages)", "package {name} installed"),
    Head("env", {"type": "string", "pattern": "^[A-Z][A-Z0-9_]*$", "description": "a declared environment variable"},
         "", "", refers_to="env_vars", what="environment variable", tests=ENV_TESTS, tests_required=True),
    Head("fact", {"$ref": "#/$defs/fact_name"}, "", "", tests=COMPARISONS, tests_required=True),
    Head("value", {"type": "string", "pattern": NAME_PATTERN, "description": "a named value (values: section)"},
         "", "", refers_to="values", what="value", tests=COMPARISONS, tests_required=True),
)
HEAD_BY_KEY = {h.key: h for h in HEADS}


def head_of(cond: Any) -> Head | None:
    """The head of a condition mapping (the first head key present), None for anything else."""
    if isinstance(cond, dict):
        for h in HEADS:
            if h.key in cond:
                return h
    return None


def children(cond: Any) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    """Direct sub-conditions with their path below `cond`."""
    h = head_of(cond)
    if h is None or not h.children:
        return
    if h.children == "one":
        yield cond[h.key], (h.key,)
        return
    for i, sub in enumerate(cond.get(h.key) or []):
        yield sub, (h.key, i)


def too_deep(cond: Any, limit: int) -> tuple[Any, ...] | None:
    """The path of the first sub-condition nested deeper than `limit` conditions, or None; iterative, so a
    condition of any depth is measured without reaching the recursion limit."""
    stack: list[tuple[Any, tuple[Any, ...], int]] = [(cond, (), 1)]
    while stack:
        node, path, depth = stack.pop()
        if depth > limit:
            return path
        stack.extend((sub, path + rel, depth + 1) for sub, rel in children(node))
    return None


def walk(cond: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[dict[str, Any], Head, tuple[Any, ...]]]:
    """Every node of a condition tree as (node, head, path), depth first."""
    h = head_of(cond)
    if h is None:
        return
    yield cond, h, path
    for sub, rel in children(cond):
        yield from walk(sub, path + rel)


def references(cond: Any, section: str) -> list[str]:
    """Names a condition tree refers to in one rule section (e.g. every `ref` to a derived fact)."""
    return [node[h.key] for node, h, _ in walk(cond) if h.refers_to == section]


# ------------------------------------------------------------------ schema


def condition_schema() -> dict[str, Any]:
    """`$defs.condition` of rules.schema.json, generated from the table."""
    branches: list[dict[str, Any]] = []
    for h in HEADS:
        props: dict[str, Any] = {h.key: h.schema}
        for t in h.tests:
            for name in (t.name, *t.aliases):
                props[name] = t.schema
        then: dict[str, Any] = {"properties": props, "additionalProperties": False}
        if h.tests_required:
            then["anyOf"] = [{"required": [n]} for n in h.test_names()]
        branches.append({"if": {"required": [h.key]}, "then": then})
    keys = [h.key for h in HEADS]
    branches.append({"if": {"not": {"anyOf": [{"required": [k]} for k in keys]}},
                     "then": {"propertyNames": {"enum": keys}}})
    return {"type": "object", "minProperties": 1,
            "description": "A condition: " + "/".join(keys[:3]) + ", " + ", ".join(keys[3:-1]) + " or " + keys[-1],
            "allOf": branches}


def main(argv: list[str]) -> int:
    """Print the generated `$defs.condition`; with --write PATH, replace it in that schema file."""
    generated = condition_schema()
    if len(argv) == 2 and argv[0] == "--write":
        with open(argv[1], encoding="utf-8") as fh:
            schema = json.load(fh)
        schema["$defs"]["condition"] = generated
        from pathlib import Path

        from .safewrite import write_inside

        write_inside(Path(argv[1]), json.dumps(schema, indent=1) + "\n")
        return 0
    print(json.dumps(generated, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
