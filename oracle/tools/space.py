"""The input space of a rule set as equivalence classes, explored exhaustively.

Why classes: the rules only ever compare a fact with constants they name (`ge: "9.0"`, `in: [...]`,
`multiple_of: 128`, a map's keys, a table's rows, the explicit moe_backend strings), so two values that
agree on every such comparison get the same answer. Each fact, env var and package is split into the
classes its comparisons distinguish (collected from the rule data of every rule set being compared).

Why lazy forking (explore.py): the cross product of all classes is astronomically large, but a decision reads only
a few of them. `explore` runs a decision with views over the facts, env and packages that fork on
first read (depth-first, replaying earlier choices), so every leaf is one class of the *whole* input
space (variables it never read are free) and the leaves partition the space: exhaustive, not sampled.
Lint explores coarser leaves of the same space (refine.py: a variable is split only where a condition's
answer differs); sweep and diff keep these fine ones.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, NamedTuple

from .. import facts as facts_module
from .. import operators
from ..envvars import EnvSpec
from ..errors import EnvValueError
from ..facts import FACTS
from ..loader import RuleSet
from ..model import Table, parse_capability
from ..vocabulary import ACTIVATIONS

# Every CUDA compute capability from Volta to Blackwell consumer parts (7.0-12.1), as shipped by NVIDIA.
CUDA_CAPABILITIES = ((7, 0), (7, 2), (7, 5), (8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (10, 1), (10, 3),
                     (11, 0), (12, 0), (12, 1))
PLATFORM = "platform"
PLATFORM_FACTS = ("platform.kind", "platform.capability", "platform.gcn_arch", "platform.amx")
OTHER = "<other>"  # a string no rule names
# The dimensions explored besides platform, packages and env (issue 14's input space): the layer's
# activation, parallel mode, LoRA, routing, the explicit backend string,
# the SwiGLU clamp and the Quark config. Every other fact (layer sizes, quant keys) keeps the policy's
# default; `vary` adds more (e.g. moe.weight_key).
VARIED = ("moe.activation", "moe.lora", "moe.moe_backend", "moe.parallel.dp_size", "moe.parallel.ep_size",
          "moe.parallel.use_ep", "moe.parallel.all2all_backend", "moe.parallel.eplb", "moe.routing_method",
          "moe.swiglu_limit",
          *(f for f in FACTS if f.startswith("quark.")))


class Cls(NamedTuple):
    """One equivalence class of a variable: a label for people and the representative value used."""

    label: str
    value: Any


@dataclass(frozen=True)
class Domain:
    var: str  # "platform", "fact:moe.activation", "env:NAME", "package:NAME"
    classes: tuple[Cls, ...]


# ------------------------------------------------------------------ constants the rules compare with

def _cap(value: Any) -> Any:
    if isinstance(value, str) and "." in value and value.replace(".", "").isdigit():
        return parse_capability(value)
    if isinstance(value, float):
        return parse_capability(f"{value:.1f}")
    return value


def _norm(fact: str, op: str, raw: Any) -> Any:
    is_cap = FACTS.get(fact, ("",))[0] == "capability"
    if op == "family":
        return frozenset(int(f.split(".")[0]) for f in (raw if isinstance(raw, list) else [raw]))
    if op in ("in", "not_in"):
        return frozenset(_cap(x) if is_cap else x for x in raw)
    return _cap(raw) if is_cap else raw


def _holds(op: str, const: Any, v: Any) -> bool:
    if op in ("eq", "ne", "key"):
        return bool(v == const)
    if op in ("in", "not_in"):
        return v in const
    if op == "is_null":
        return v is None
    if v is None:
        return False
    try:
        if op == "family":
            return bool(v[0] in const)
        if op == "multiple_of":
            return bool(v % const == 0)
        return bool({"ge": v >= const, "gt": v > const, "le": v <= const, "lt": v < const}[op])
    except (TypeError, KeyError):
        return False


@dataclass
class Constants:
    """Every (test, constant) the rules apply to each fact, and the strings each env var is compared with."""

    facts: dict[str, set[tuple[str, Any]]] = field(default_factory=dict)
    env: dict[str, set[str]] = field(default_factory=dict)
    env_specs: dict[str, EnvSpec] = field(default_factory=dict)
    env_presence: set[str] = field(default_factory=set)  # env vars some rule tests for being set at all
    packages: set[str] = field(default_factory=set)
    rocm_archs: dict[str, tuple[int, int]] = field(default_factory=dict)
    linked: set[str] = field(default_factory=set)  # facts a condition compares with another fact or value

    def add(self, fact: str, op: str, raw: Any) -> None:
        try:
            self.facts.setdefault(fact, set()).add((op, _norm(fact, op, raw)))
        except (TypeError, ValueError):
            pass  # an unhashable or odd constant: the schema accepted it, it just splits nothing

    def collect(self, rs: RuleSet, table: Table) -> None:
        s = rs.sections
        value_facts = {name: _facts_of(s["values"], name, set()) for name in s["values"]}
        links: list[tuple[str, str]] = []

        def operand_facts(op: Any) -> set[str]:
            if isinstance(op, dict) and "fact" in op:
                return {op["fact"]}
            if isinstance(op, dict) and "value" in op:
                return value_facts.get(op["value"], set())
            return set()

        def visit(d: dict[str, Any]) -> None:
            head = operators.head_of(d)
            if head is not None and head.tests and head.key in d:
                for t in head.tests:
                    name = next((n for n in (t.name, *t.aliases) if n in d), None)
                    if name is None:
                        continue
                    raw = d[name]
                    if head.key == "env":
                        if t.name == "set":
                            self.env_presence.add(d["env"])
                        if t.name in ("eq", "in"):
                            self.env.setdefault(d["env"], set()).update(raw if isinstance(raw, list) else [raw])
                        continue
                    subjects = {d["fact"]} if head.key == "fact" else value_facts.get(d["value"], set())
                    for subject in subjects:
                        if t.literal == "operand":
                            links.extend((subject, o) for o in operand_facts(raw))
                        else:
                            self.add(subject, t.name, raw)
            if "map" in d and "of" in d and isinstance(d["map"], dict):
                for f in operand_facts(d["of"]):
                    for k in d["map"]:
                        self.add(f, "key", k)
            if "lookup" in d and "keys" in d:
                rows = s["tables"][d["lookup"]].data["rows"] if d["lookup"] in s["tables"] else []
                for i, key in enumerate(d["keys"]):
                    for f in operand_facts(key):
                        for row in rows:
                            self.add(f, "key", row[i])
            if "weight" in d and "activation" in d:  # a kernel's quant scheme row
                for f, k in (("moe.weight_key", d["weight"]), ("moe.activation_key", d["activation"])):
                    if isinstance(k, list):
                        self.add(f, "in", k)
                    elif k != "any":
                        self.add(f, "key", k)

        for section in s.values():
            for entry in section.values():
                _walk(entry.data, visit)
        for entry in s["kernel_checks"].values():  # fact_in_field rows: the fact is one of each kernel's list
            row = entry.data
            if "fact_in_field" in row:
                lists = [k.data.get(row["field"]) for k in s["kernels"].values()] + [row.get("default")]
                for lst in lists:
                    if isinstance(lst, list):
                        self.add(row["fact_in_field"], "in", [v["is"] if isinstance(v, dict) else v for v in lst])
        for fam in table.families.values():
            for key in fam.explicit:
                self.add("moe.moe_backend", "key", key)
            for r in fam.round_up:
                self.add("moe.intermediate_size", "multiple_of", r.intermediate)
                if r.hidden:
                    self.add("moe.hidden_size", "multiple_of", r.hidden)
        for a, b in links:  # {fact: a, same_as: {fact: b}}: each side needs the other's constants
            self.linked.update((a, b))
            for f, g in ((a, b), (b, a)):
                for op, c in list(self.facts.get(g, ())):
                    if op in ("eq", "ne", "key"):
                        self.facts.setdefault(f, set()).add(("key", c))
        for name, e in s["env_vars"].items():
            d = e.data
            self.env_specs.setdefault(name, EnvSpec(name, d["parse"], d.get("default"), tuple(d.get("choices", ())),
                                                    e.at()))
        self.packages |= set(table.packages)
        self.rocm_archs.update(table.rocm_archs)


def _walk(node: Any, visit: Callable[[dict[str, Any]], None]) -> None:
    if isinstance(node, dict):
        visit(node)
        for v in node.values():
            _walk(v, visit)
    elif isinstance(node, list):
        for v in node:
            _walk(v, visit)


def _facts_of(values: Mapping[str, Any], name: str, seen: set[str]) -> set[str]:
    """The facts a named value reads, transitively through other values."""
    if name in seen or name not in values:
        return set()
    seen.add(name)
    found: set[str] = set()

    def visit(d: dict[str, Any]) -> None:
        if isinstance(d.get("fact"), str):
            found.add(d["fact"])
        if isinstance(d.get("value"), str):
            found.update(_facts_of(values, d["value"], seen))

    _walk(values[name].data, visit)
    return found


# ------------------------------------------------------------------ classes

def _group(candidates: list[tuple[str, Any]], sig: Callable[[Any], tuple[Any, ...]]) -> tuple[Cls, ...]:
    """Candidates with equal signatures form one class, labelled by all its members."""
    groups: dict[tuple[Any, ...], list[tuple[str, Any]]] = {}
    for label, value in candidates:
        groups.setdefault(sig(value), []).append((label, value))
    return tuple(Cls("|".join(lbl for lbl, _ in members), members[0][1]) for members in groups.values())


def _stable(pred: tuple[str, Any]) -> str:
    """A sort key for (test, constant) that is the same in every process (a frozenset's repr is not)."""
    op, k = pred
    return repr((op, sorted(map(repr, k)) if isinstance(k, frozenset) else k))


def _show(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, tuple):
        return f"{v[0]}.{v[1]}"
    return str(v).lower() if isinstance(v, bool) else str(v)


class Space:
    """The domains of every variable, built from the constants of one or more rule sets."""

    def __init__(self, constants: Constants, vary: tuple[str, ...] = (), base: tuple[str, ...] = VARIED):
        self.c = constants
        self.varied = frozenset(base + tuple(vary))
        self._facts: dict[tuple[str, bool], Domain] = {}
        self._env: dict[str, Domain] = {}
        self._packages: dict[str, Domain] = {}
        self.platform = self._platform()

    @classmethod
    def of(cls, pairs: list[tuple[RuleSet, Table]], vary: tuple[str, ...] = (), base: tuple[str, ...] = VARIED,
           vary_linked: bool = False) -> Space:
        """`vary_linked`: also split every fact a condition compares with another fact (`same_as`,
        `differs_from`): kept at their defaults, two such facts could never differ, and a condition on their
        difference would look constant."""
        c = Constants()
        for rs, table in pairs:
            c.collect(rs, table)
        return cls(c, (*vary, *sorted(c.linked)) if vary_linked else vary, base)

    def _platform(self) -> Domain:
        preds = [(f, op, k) for f in PLATFORM_FACTS for op, k in sorted(self.c.facts.get(f, ()), key=_stable)]
        cands: list[tuple[str, Any]] = []
        for cap in CUDA_CAPABILITIES:
            cands.append((f"cuda {_show(cap)}", {"platform.kind": "cuda", "platform.capability": cap,
                                                "platform.gcn_arch": None, "platform.amx": False}))
        for arch, cap in self.c.rocm_archs.items():
            cands.append((f"rocm {arch}", {"platform.kind": "rocm", "platform.capability": cap,
                                           "platform.gcn_arch": arch, "platform.amx": False}))
        cands.append(("xpu", {"platform.kind": "xpu", "platform.capability": None, "platform.gcn_arch": None,
                              "platform.amx": False}))
        for amx in (False, True):
            cands.append(("cpu amx" if amx else "cpu", {"platform.kind": "cpu", "platform.capability": None,
                                                        "platform.gcn_arch": None, "platform.amx": amx}))

        def sig(p: dict[str, Any]) -> tuple[Any, ...]:
            return (p["platform.kind"], *(_holds(op, k, p[f]) for f, op, k in preds))

        groups = _group(cands, sig)
        return Domain(PLATFORM, tuple(Cls(_merge_label(g.label), g.value) for g in groups))

    def platforms(self) -> list[tuple[str, int]]:
        """Every concrete platform (column of a sweep) with the index of its class."""
        out: list[tuple[str, int]] = []
        for i, cl in enumerate(self.platform.classes):
            out.extend((label, i) for label in cl.label.split("|"))
        return out

    def fact(self, name: str, nullable: bool) -> Domain:
        key = (name, nullable)
        dom = self._facts.get(key)
        if dom is None:
            dom = self._facts[key] = Domain("fact:" + name, self._fact_classes(name, nullable))
        return dom

    def _fact_classes(self, name: str, nullable: bool) -> tuple[Cls, ...]:
        kind = FACTS.get(name, ("str?", None))[0]
        preds = sorted(self.c.facts.get(name, ()), key=_stable)
        values: list[Any] = []
        if kind.startswith("bool"):
            values = [False, True]
        elif kind.startswith("int") or kind.startswith("num"):
            divisors = sorted({k for op, k in preds if op == "multiple_of"})
            points = {k for op, k in preds if op in ("eq", "ne", "key", "ge", "gt", "le", "lt")
                      and isinstance(k, (int, float)) and not isinstance(k, bool)}
            for op, k in preds:
                if op in ("in", "not_in"):
                    points |= {x for x in k if isinstance(x, (int, float)) and not isinstance(x, bool)}
            near = {p + d for p in points for d in (-1, 0, 1) if p + d >= 0}
            lcms = {math.lcm(*sub) for r in range(1, len(divisors) + 1) for sub in combinations(divisors, r)}
            lo, hi = getattr(facts_module, "RANGES", {}).get(name, (0, None))  # only values a scenario may give
            values = sorted(v for v in {0, 1, lo} | near | lcms if v >= lo and (hi is None or v <= hi))
        else:
            consts: list[Any] = []
            for _op, k in preds:
                for x in (sorted(k, key=repr) if isinstance(k, frozenset) else [k]):  # one order in every process
                    if isinstance(x, str) and x not in consts:
                        consts.append(x)
            if name == "moe.activation":
                consts = list(ACTIVATIONS)
            values = [*consts, OTHER] if name != "moe.activation" else consts
        if nullable or kind.endswith("?"):
            values = [None, *values]

        def sig(v: Any) -> tuple[Any, ...]:
            return tuple(_holds(op, k, v) for op, k in preds) + ((v,) if not preds and kind == "choice" else ())

        return tuple(Cls(f"{name}={_merge_label(c.label)}", c.value)
                     for c in _group([(_show(v), v) for v in values], sig))

    def env(self, name: str) -> Domain:
        dom = self._env.get(name)
        if dom is None:
            dom = self._env[name] = Domain("env:" + name, self._env_classes(name))
        return dom

    def _env_classes(self, name: str) -> tuple[Cls, ...]:
        spec = self.c.env_specs.get(name)
        consts = sorted(self.c.env.get(name, ()))
        cands: list[tuple[str, str | None]] = [("unset", None)]
        parse = spec.parse if spec else ""
        if parse == "int_bool":
            cands += [("0", "0"), ("1", "1"), ("x", "x")]
        elif parse in ("true_or_1", "true_or_1_stripped"):
            cands += [("0", "0"), ("1", "1")]
        elif parse == "choice" and spec is not None:
            cands += [(c, c) for c in spec.choices] + [("x", "x")]
        else:
            cands += [(c, c) for c in consts] + [(OTHER, OTHER)]
        if spec is not None and name not in self.c.env_presence:  # unset reads as the default: one class
            same = [c for c in cands[1:] if _parses_to(spec, c[1], spec.default)]
            if same:
                first = same[0]
                cands = [(f"unset|{first[0]}", first[1]), *(c for c in cands[1:] if c != first)]
        return tuple(Cls(f"{name}={lbl}", v) for lbl, v in cands)

    def package(self, name: str) -> Domain:
        dom = self._packages.get(name)
        if dom is None:
            dom = self._packages[name] = Domain("package:" + name,
                                                (Cls(f"{name} absent", False), Cls(f"{name} installed", True)))
        return dom


def _parses_to(spec: EnvSpec, raw: str | None, value: Any) -> bool:
    try:
        return raw is not None and spec.value({spec.name: raw}) == value
    except EnvValueError:
        return False


def members(label: str) -> list[str]:
    """The full labels a merged class label stands for: 'cuda 8.0|8.6' -> ['cuda 8.0', 'cuda 8.6']."""
    out: list[str] = []
    prefix = ""
    for part in label.split("|"):
        head = part.partition(" ")[0] if " " in part else ""
        if out and " " not in part and "=" not in part and prefix:
            out.append(prefix + part)
            continue
        prefix = (head + " ") if head else (part.split("=", 1)[0] + "=" if "=" in part else "")
        out.append(part)
    return out


def _merge_label(label: str) -> str:
    """'cuda 8.0|cuda 8.6' -> 'cuda 8.0|8.6' (the kind once)."""
    parts = label.split("|")
    out, last = [], None
    for p in parts:
        kind, _, rest = p.partition(" ")
        out.append(rest if kind == last and rest and kind in ("cuda", "rocm") else p)
        last = kind
    return "|".join(out)
