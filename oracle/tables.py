"""Stage 6: assemble a checked RuleSet into one immutable decision Table (families, policies, steps)."""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .compiler import Compiler
from .kernels import compile_kernel
from .loader import Entry, RuleSet
from .model import (
    FROM_SCENARIO,
    REQUESTED,
    Backend,
    DecidedBy,
    Family,
    Kernel,
    Policy,
    PolicyQuantConfig,
    RoundRow,
    Step,
    Table,
    parse_capability,
)

BUILTIN_QUERIES = ("select", "round_up", "map_backend")
# step actions, and the clearer spellings the schema also accepts for two of them
ACTIONS = ("outcome", "use", "use_explicit", "drop", "try", "call", "result", "emit", "candidates", "move",
           "prefer_activation", "request_activation")
ACTION_ALIASES = {"use_named_backend": "use_explicit", "return_call_result": "result"}


def _quant_config(fd: Mapping[str, Any], kind: str | None) -> Mapping[str, Any] | None:
    """The backend's quant-config kind with its fields, as the family declares them (validated by semantics)."""
    if kind is None:
        return None
    fields = {k: dict(v) if isinstance(v, dict) else v for k, v in fd["quant_configs"][kind].items() if k != "why"}
    return MappingProxyType({"kind": kind, **fields})


def _policy_quant_config(fd: Mapping[str, Any], pd: Mapping[str, Any], pe: Entry) -> PolicyQuantConfig | None:
    """The policy's kinds by answer field (validated by semantics), each with the family's fields."""
    spec = pd.get("quant_config")
    if spec is None:
        return None
    kinds: dict[Any, Mapping[str, Any]] = {}
    for value, kind in spec["kinds"].items():
        built = _quant_config(fd, kind)
        assert built is not None  # a kind name always builds
        kinds[value] = built
    return PolicyQuantConfig(spec["by"], frozenset(spec["backends"]), MappingProxyType(kinds),
                             pe.at("quant_config"), spec["why"])


def _assembly(fd: Mapping[str, Any], b: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """How the backend's kernel is assembled: the family's `assembly`, the backend's own keys over it; `why` lists
    the family's reason, then the backend's."""
    family, own = fd.get("assembly"), b.get("assembly")
    if family is None and own is None:
        return None
    merged = {**(family or {}), **(own or {})}
    merged["why"] = tuple(x["why"] for x in (family, own) if x is not None)
    return MappingProxyType(merged)


def _family(c: Compiler, fname: str, fe: Entry) -> Family:
    s = c.rs.sections
    fd = fe.data
    reasons = {name: c.template((fd.get("kernel_reasons") or {}).get(name, e.data["reason"]))
               for name, e in s["kernel_checks"].items()}
    act_default = fd["activation_key"] if fd.get("activation_key") in (FROM_SCENARIO, REQUESTED) else None

    def kernels(names: list[str]) -> tuple[Kernel, ...]:
        return tuple(compile_kernel(c, k, s["kernel_checks"], reasons) for k in names)

    backends = {
        bname: Backend(bname, b.get("value", bname), kernels(b["kernels"]),
                       b.get("activation_key", act_default), b.get("converter"), b.get("runner"),
                       b.get("missing_why"), fe.at("backends", bname),
                       kernels(b["explicit_kernels"]) if "explicit_kernels" in b else None,
                       _quant_config(fd, b.get("quant_config")), _assembly(fd, b))
        for bname, b in fd["backends"].items()}
    emap = fd.get("explicit_map") or {}
    entries = emap.get("entries") or {}
    rows = []
    for i, r in enumerate(fd.get("round_up") or []):
        when = c.condition(r.get("when"))
        rows.append(RoundRow(frozenset(r["backends"]) if "backends" in r else None, when.fn if when else None,
                             r["intermediate"], r.get("hidden"), fe.at("round_up", i)))
    batched = c.condition(fd.get("batched_when"))
    return Family(
        fname, fd["weight_key"], MappingProxyType(backends),
        MappingProxyType({b.value: b for b in backends.values()}),
        MappingProxyType({k: tuple(v) if isinstance(v, list) else (v,) for k, v in entries.items()}),
        MappingProxyType(dict(emap.get("batched") or {})),
        batched.fn if batched else None, tuple(rows),
        MappingProxyType({k: c.template(v) for k, v in fd["messages"].items()}), fe.at(),
        any(isinstance(v, list) for v in entries.values()))


def _step(c: Compiler, st: dict[str, Any], at: str) -> Step:
    key = next(a for a in (*ACTIONS, *ACTION_ALIASES) if a in st)
    action = ACTION_ALIASES.get(key, key)
    arg = st[key]
    if action == "emit":
        arg = tuple((k, c.operand(v)) for k, v in arg.items())
    elif action == "outcome":
        arg = (arg, st.get("backend"))
    elif action == "request_activation":
        arg = c.operand(arg)
    options: dict[str, Any] = {}
    if action == "move":
        options["where"] = ("before", st["before"]) if "before" in st else ("after", st["after"])
    if action == "use_explicit" and st.get("prefer_activation"):
        options["prefer_activation"] = True
    if action == "call" and "activation_key" in st:
        options["activation_key"] = c.operand(st["activation_key"])
    when = c.condition(st.get("when"))
    check = st.get("check", not st.get("skip_support_check", False))
    return Step(st["id"], when, when.fn if when else None, action, arg, check, st.get("report_kernel", True),
                c.template(st["message"]) if "message" in st else None, at, st["why"],
                DecidedBy(st["id"], at, st["why"]), MappingProxyType(options))


def compile_ruleset(rs: RuleSet, packages: set[str]) -> Table:
    c = Compiler(rs)
    s = rs.sections
    families = {fname: _family(c, fname, fe) for fname, fe in s["families"].items()}
    table_defaults = {name: e.data for name, e in s["fact_defaults"].items()}
    policies: dict[str, Policy] = {}
    queries: dict[str, None] = {}
    for pname, pe in s["policies"].items():
        pd = pe.data
        steps = tuple(_step(c, st, pe.at("steps", i)) for i, st in enumerate(pd["steps"]))
        pq = {q: c.value(spec["value"]) for q, spec in (pd.get("queries") or {}).items()}
        queries.update(dict.fromkeys(pq))
        policies[pname] = Policy(pname, pd["description"], families[pd["family"]], tuple(pd.get("candidates") or ()),
                                 steps, MappingProxyType(pq),
                                 MappingProxyType({**table_defaults, **(pd.get("defaults") or {})}), pe.at(),
                                 c.operand(pd["activation_key"]) if "activation_key" in pd else None,
                                 _policy_quant_config(s["families"][pd["family"]].data, pd, pe))
    archs = {k: parse_capability(v.data) for k, v in s["rocm_archs"].items()}
    return Table(rs.name, rs.description, tuple(rs.files), MappingProxyType(policies), MappingProxyType(families),
                 frozenset(packages), frozenset(c.env), MappingProxyType(archs),
                 BUILTIN_QUERIES + tuple(q for q in queries if q not in BUILTIN_QUERIES), c.gen,
                 frozenset(s["quant_keys"]),
                 MappingProxyType({fmt: MappingProxyType({k: e.data[k] for k in ("interleaved", "contiguous")})
                                   for fmt, e in s["checkpoint_policies"].items()}))
