"""Compile a validated RuleSet into an immutable decision table of closures.

Conditions become plain Python closures over a per-question context, so a selection
is a walk over tuples with no dict-shaped rule data left to interpret.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

from .errors import EnvValueError
from .facts import FACTS
from .rules import RuleSet, Entry

Fn = Callable[["Ctx"], Any]


class Ctx:
    """Everything one question may read: facts, env strings, packages, and per-question memos."""

    __slots__ = ("facts", "env", "packages", "memo", "call_backend", "weight_key", "activation_key")

    def __init__(self, facts: Mapping[str, Any], env: Mapping[str, str], packages: frozenset):
        self.facts = facts
        self.env = env
        self.packages = packages
        self.memo: dict[str, Any] = {}
        self.call_backend: str | None = None
        self.weight_key: str | None = None
        self.activation_key: str | None = None


def parse_capability(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def format_capability(cap: Any) -> str:
    return f"{cap[0]}.{cap[1]}" if isinstance(cap, tuple) else str(cap)


# ------------------------------------------------------------------ env vars


@dataclass(frozen=True)
class EnvSpec:
    name: str
    parse: str
    default: Any
    choices: tuple[str, ...]
    at: str

    def value(self, env: Mapping[str, str]) -> Any:
        raw = env.get(self.name)
        if raw is None:
            return self.default
        if self.parse == "int_bool":
            try:
                return bool(int(raw))
            except ValueError:
                raise EnvValueError(
                    f"environment variable {self.name}={raw!r} is not an integer; it is read as bool(int(value)): "
                    f"set it to 0 or 1, or unset it (declared at {self.at})") from None
        if self.parse == "true_or_1":
            return raw.lower() in ("true", "1")
        if self.parse == "true_or_1_stripped":
            return raw.strip().lower() in ("true", "1")
        if raw not in self.choices:
            raise EnvValueError(
                f"environment variable {self.name}={raw!r} is not one of {', '.join(self.choices)}; "
                f"set one of those or unset it (declared at {self.at})")
        return raw


# ------------------------------------------------------------------ conditions


@dataclass(frozen=True)
class Cond:
    fn: Fn
    text: str


def _literal(fact: str, value: Any) -> Any:
    if FACTS.get(fact, ("",))[0] == "capability" and isinstance(value, str):
        return parse_capability(value)
    return value


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return format_capability(value)
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


class Compiler:
    def __init__(self, rs: RuleSet):
        self.rs = rs
        s = rs.sections
        self.env = {n: EnvSpec(n, e.data["parse"], e.data.get("default"), tuple(e.data.get("choices", ())), e.at())
                    for n, e in s["env_vars"].items()}
        self._derived: dict[str, Cond] = {}
        self._values: dict[str, Fn] = {}

    # --- leaves
    def _getter(self, fact: str) -> Fn:
        if fact == "call.backend":
            return lambda ctx: ctx.call_backend
        return lambda ctx: ctx.facts[fact]

    def _compare(self, get: Fn, name: str, spec: dict) -> Cond:
        tests: list[Cond] = []
        for op in ("eq", "ne", "in", "not_in", "ge", "gt", "le", "lt", "family", "is_null"):
            if op not in spec:
                continue
            raw = spec[op]
            if op in ("in", "not_in"):
                v: Any = frozenset(_literal(name, x) for x in raw)
            elif op == "family":
                v = frozenset(int(f.split(".")[0]) for f in (raw if isinstance(raw, list) else [raw]))
            else:
                v = _literal(name, raw)
            tests.append(Cond(_OPS[op](get, v), f"{name} {_OP_TEXT[op]} {_show(raw)}"))
        return _conj(tests)

    def _env(self, spec: dict) -> Cond:
        var = self.env[spec["env"]]
        name = var.name
        key = "env:" + name
        tests: list[Cond] = []
        if "set" in spec:
            want = spec["set"]
            tests.append(Cond(lambda ctx: (name in ctx.env) == want, f"{name} {'is set' if want else 'is unset'}"))

        default = var.default

        def value(ctx: Ctx) -> Any:
            if name not in ctx.env:
                return default
            memo = ctx.memo
            if key in memo:
                return memo[key]
            v = memo[key] = var.value(ctx.env)
            return v

        if "is" in spec:
            want_is = spec["is"]
            tests.append(Cond(lambda ctx: value(ctx) is want_is, f"{name} is {_show(want_is)}"))
        if "eq" in spec:
            want_eq = spec["eq"]
            tests.append(Cond(lambda ctx: value(ctx) == want_eq, f"{name} == {want_eq}"))
        if "in" in spec:
            want_in = frozenset(spec["in"])
            tests.append(Cond(lambda ctx: value(ctx) in want_in, f"{name} in {_show(spec['in'])}"))
        return _conj(tests)

    def condition(self, spec: dict | None) -> Cond | None:
        if spec is None:
            return None
        if "all" in spec:
            parts = tuple(self.condition(c) for c in spec["all"])
            return Cond(_all_of(tuple(p.fn for p in parts)), "(" + " and ".join(p.text for p in parts) + ")")
        if "any" in spec:
            parts = tuple(self.condition(c) for c in spec["any"])
            return Cond(_any_of(tuple(p.fn for p in parts)), "(" + " or ".join(p.text for p in parts) + ")")
        if "not" in spec:
            inner = self.condition(spec["not"])
            f = inner.fn
            return Cond(lambda ctx: not f(ctx), f"not {inner.text}")
        if "ref" in spec:
            return self.derived(spec["ref"])
        if "package" in spec:
            pkg = spec["package"]
            return Cond(lambda ctx: pkg in ctx.packages, f"package {pkg} installed")
        if "env" in spec:
            return self._env(spec)
        if "fact" in spec:
            return self._compare(self._getter(spec["fact"]), spec["fact"], spec)
        name = spec["value"]
        return self._compare(self.value(name), name, spec)

    def derived(self, name: str) -> Cond:
        if name not in self._derived:
            entry = self.rs.sections["derived"][name]
            inner = self.condition(entry.data["when"]).fn
            key = "ref:" + name

            def fn(ctx: Ctx) -> bool:
                memo = ctx.memo
                if key in memo:
                    return memo[key]
                v = memo[key] = inner(ctx)
                return v

            self._derived[name] = Cond(fn, name)
        return self._derived[name]

    def operand(self, spec: dict) -> Fn:
        return self._getter(spec["fact"]) if "fact" in spec else self.value(spec["value"])

    def value(self, name: str) -> Fn:
        if name in self._values:
            return self._values[name]
        d = self.rs.sections["values"][name].data
        key = "value:" + name
        if "when" in d:
            inner = self.condition(d["when"]).fn
        elif "map" in d:
            of = self.operand(d["of"])
            table = dict(d["map"])
            passthrough = d.get("passthrough", False)
            default = d.get("default")
            inner = lambda ctx: table.get(of(ctx), of(ctx) if passthrough else default)  # noqa: E731
        else:
            t = self.rs.sections["tables"][d["lookup"]].data
            rows = {tuple(r[:-1]): r[-1] for r in t["rows"]}
            keys = tuple(self.operand(k) for k in d["keys"])
            default = d.get("default")
            inner = lambda ctx: rows.get(tuple(k(ctx) for k in keys), default)  # noqa: E731

        def fn(ctx: Ctx) -> Any:
            memo = ctx.memo
            if key in memo:
                return memo[key]
            v = memo[key] = inner(ctx)
            return v

        self._values[name] = fn
        return fn


def _all_of(fns: tuple[Fn, ...]) -> Fn:
    """Short-circuit conjunction; a plain loop is ~2x faster than all() over a generator."""
    if len(fns) == 1:
        return fns[0]
    if len(fns) == 2:
        a, b = fns
        return lambda ctx: bool(a(ctx)) and bool(b(ctx))

    def fn(ctx: Ctx) -> bool:
        for f in fns:
            if not f(ctx):
                return False
        return True
    return fn


def _any_of(fns: tuple[Fn, ...]) -> Fn:
    if len(fns) == 1:
        return fns[0]

    def fn(ctx: Ctx) -> bool:
        for f in fns:
            if f(ctx):
                return True
        return False
    return fn


def _conj(tests: list[Cond]) -> Cond:
    if len(tests) == 1:
        return tests[0]
    return Cond(_all_of(tuple(t.fn for t in tests)), " and ".join(t.text for t in tests))


def _cmp(op: Callable[[Any, Any], bool]) -> Callable[[Fn, Any], Fn]:
    def make(get: Fn, v: Any) -> Fn:
        def fn(ctx: Ctx) -> bool:
            x = get(ctx)
            return x is not None and op(x, v)
        return fn
    return make


_OPS: dict[str, Callable[[Fn, Any], Fn]] = {
    "eq": lambda get, v: (lambda ctx: get(ctx) == v),
    "ne": lambda get, v: (lambda ctx: get(ctx) != v),
    "in": lambda get, v: (lambda ctx: get(ctx) in v),
    "not_in": lambda get, v: (lambda ctx: get(ctx) not in v),
    "ge": _cmp(lambda x, v: x >= v),
    "gt": _cmp(lambda x, v: x > v),
    "le": _cmp(lambda x, v: x <= v),
    "lt": _cmp(lambda x, v: x < v),
    "family": lambda get, v: (lambda ctx: (c := get(ctx)) is not None and c[0] in v),
    "is_null": lambda get, v: (lambda ctx: (get(ctx) is None) == v),
}
_OP_TEXT = {"eq": "==", "ne": "!=", "in": "in", "not_in": "not in", "ge": ">=", "gt": ">", "le": "<=",
            "lt": "<", "family": "in family", "is_null": "is null:"}


# ------------------------------------------------------------------ messages

_PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_.]+)\}")


@dataclass(frozen=True)
class Template:
    """A message with {fact}, {value} and {word} placeholders; never str.format on rule text."""

    text: str
    getters: tuple[tuple[str, Fn | None], ...]

    def render(self, ctx: Ctx, words: Mapping[str, Any] = MappingProxyType({})) -> str:
        out = self.text
        for name, get in self.getters:
            v = words.get(name) if get is None else get(ctx)
            out = out.replace("{" + name + "}", _show(v))
        return out


def template(compiler: Compiler, text: str) -> Template:
    getters = []
    for name in dict.fromkeys(_PLACEHOLDER.findall(text)):
        if name in FACTS:
            getters.append((name, compiler._getter(name)))
        elif name in compiler.rs.sections["values"]:
            getters.append((name, compiler.value(name)))
        else:
            getters.append((name, None))
    return Template(text, tuple(getters))


# ------------------------------------------------------------------ tables


@dataclass(frozen=True)
class Check:
    name: str
    fn: Fn
    text: str
    reason: Template


@dataclass(frozen=True)
class Kernel:
    name: str
    checks: tuple[Check, ...]
    accepts: Fn  # all checks as one short-circuit conjunction: the fast path
    monolithic: bool
    function_check: bool
    at: str

    def first_failure(self, ctx: "Ctx") -> Check | None:
        for check in self.checks:
            if not check.fn(ctx):
                return check
        return None


@dataclass(frozen=True)
class Backend:
    name: str
    value: str
    kernels: tuple[Kernel, ...]
    activation_key: Any  # a key name, None (BF16), or FROM_SCENARIO
    implementation: str | None
    at: str


FROM_SCENARIO = "from_scenario"


@dataclass(frozen=True)
class RoundRow:
    backends: frozenset | None
    when: Cond | None
    intermediate: int
    hidden: int | None
    at: str


@dataclass(frozen=True)
class Family:
    name: str
    weight_key: Any
    backends: Mapping[str, Backend]
    by_value: Mapping[str, Backend]
    explicit: Mapping[str, str]
    explicit_batched: Mapping[str, str]
    round_up: tuple[RoundRow, ...]
    messages: Mapping[str, Template]
    at: str


@dataclass(frozen=True)
class Step:
    id: str
    when: Cond | None
    action: str
    arg: Any
    check: bool
    report_kernel: bool
    message: Template | None
    at: str
    why: str


@dataclass(frozen=True)
class Policy:
    name: str
    description: str
    family: Family
    candidates: tuple[str, ...]
    steps: tuple[Step, ...]
    queries: Mapping[str, Fn]
    at: str


@dataclass(frozen=True)
class Table:
    """The compiled, immutable decision table of one profile."""

    name: str
    description: str
    files: tuple[str, ...]
    policies: Mapping[str, Policy]
    families: Mapping[str, Family]
    packages: frozenset
    env_vars: frozenset
    rocm_archs: Mapping[str, tuple[int, int]]
    batched: Fn | None


_ACTIONS = ("outcome", "use", "use_explicit", "drop", "try", "call", "result", "emit")


def _kernel_fields(kernels: Mapping[str, Entry], name: str) -> dict:
    d = dict(kernels[name].data)
    parent = d.pop("extends", None)
    if parent is None:
        return d
    merged = _kernel_fields(kernels, parent)
    merged.update(d)
    return merged


def compile_ruleset(rs: RuleSet, packages: set[str]) -> Table:
    c = Compiler(rs)
    s = rs.sections
    batched = c.derived("batched_activation_format").fn if "batched_activation_format" in s["derived"] else None
    batch_inv = c.derived("batch_invariant_mode").fn if "batch_invariant_mode" in s["derived"] else (lambda ctx: False)

    def kernel(name: str, reasons: Mapping[str, Template]) -> Kernel:
        d = _kernel_fields(s["kernels"], name)
        checks: list[Check] = []

        def add(check: str, fn: Fn, text: str) -> None:
            checks.append(Check(check, fn, text, reasons[check]))

        device = c.condition(d.get("device"))
        if device is not None:
            add("device", device.fn, device.text)
        if not d.get("non_gated", False):
            add("act_and_mul", lambda ctx: ctx.facts["moe.is_act_and_mul"], "moe.is_act_and_mul == true")
        if "activations" in d:
            acts = frozenset(d["activations"])
            add("activation", lambda ctx: ctx.facts["moe.activation"] in acts, f"moe.activation in {_show(d['activations'])}")
        schemes = d.get("quant_schemes", "any")
        if schemes != "any":
            rows = tuple(_scheme_row(c, r) for r in schemes)
            text = " or ".join(r[3] for r in rows)
            add("quant_scheme", lambda ctx: any(w(ctx.weight_key) and a(ctx.activation_key) and (cond is None or cond(ctx))
                                                for w, a, cond, _ in rows), text)
        parallel = c.condition(d.get("parallel"))
        if parallel is not None:
            add("parallel", parallel.fn, parallel.text)
        if "routing_methods" in d:
            methods = frozenset(d["routing_methods"])
            add("routing", lambda ctx: ctx.facts["moe.routing_method"] in methods, f"moe.routing_method in {_show(d['routing_methods'])}")
        if batched is not None:
            want = d.get("format", "standard") == "batched"
            add("format", lambda ctx: batched(ctx) == want, f"batched_activation_format is {_show(want)}")
        if not d.get("batch_invariant", False):
            add("batch_invariance", lambda ctx: not batch_inv(ctx), "not batch_invariant_mode")
        if not d.get("lora", False):
            add("lora", lambda ctx: not ctx.facts["moe.lora"], "moe.lora == false")
        e = s["kernels"][name]
        accepts = _all_of(tuple(c.fn for c in checks)) if checks else (lambda ctx: True)
        return Kernel(name, tuple(checks), accepts, bool(d.get("monolithic")), bool(d.get("function_check")), e.at())

    families: dict[str, Family] = {}
    for fname, fe in s["families"].items():
        fd = fe.data
        reasons = {k: template(c, v) for k, v in fd["kernel_reasons"].items()}
        act_default = FROM_SCENARIO if fd.get("activation_key") == FROM_SCENARIO else None
        backends = {
            bname: Backend(bname, b.get("value", bname), tuple(kernel(k, reasons) for k in b["kernels"]),
                           b.get("activation_key", act_default), b.get("implementation"), fe.at("backends", bname))
            for bname, b in fd["backends"].items()}
        emap = fd.get("explicit_map") or {}
        rows = tuple(RoundRow(frozenset(r["backends"]) if "backends" in r else None, c.condition(r.get("when")),
                              r["intermediate"], r.get("hidden"), fe.at("round_up", i))
                     for i, r in enumerate(fd.get("round_up") or []))
        families[fname] = Family(
            fname, fd["weight_key"], MappingProxyType(backends),
            MappingProxyType({b.value: b for b in backends.values()}),
            MappingProxyType(dict(emap.get("entries") or {})), MappingProxyType(dict(emap.get("batched") or {})),
            rows, MappingProxyType({k: template(c, v) for k, v in fd["messages"].items()}), fe.at())

    policies: dict[str, Policy] = {}
    for pname, pe in s["policies"].items():
        pd = pe.data
        steps = []
        for i, st in enumerate(pd["steps"]):
            action = next(a for a in _ACTIONS if a in st)
            arg = st[action]
            if action == "emit":
                arg = tuple((k, c.operand(v)) for k, v in arg.items())
            elif action == "outcome":
                arg = (arg, st.get("backend"))
            steps.append(Step(st["id"], c.condition(st.get("when")), action, arg, st.get("check", True),
                              st.get("report_kernel", True), template(c, st["message"]) if "message" in st else None,
                              pe.at("steps", i), st["why"]))
        queries = {q: c.value(spec["value"]) for q, spec in (pd.get("queries") or {}).items()}
        policies[pname] = Policy(pname, pd["description"], families[pd["family"]], tuple(pd.get("candidates") or ()),
                                 tuple(steps), MappingProxyType(queries), pe.at())
    archs = {k: parse_capability(v.data) for k, v in s["rocm_archs"].items()}
    return Table(rs.name, rs.description, tuple(rs.files), MappingProxyType(policies), MappingProxyType(families),
                 frozenset(packages), frozenset(c.env), MappingProxyType(archs), batched)


def _key_matcher(spec: Any) -> tuple[Callable[[Any], bool], str]:
    if spec == "any":
        return (lambda k: True), "any"
    if isinstance(spec, list):
        allowed = frozenset(spec)
        return (lambda k: k in allowed), "{" + ",".join(_show(x) for x in spec) + "}"
    return (lambda k: k == spec), _show(spec)


def _scheme_row(c: Compiler, row: dict) -> tuple:
    w, wt = _key_matcher(row["weight"])
    a, at = _key_matcher(row["activation"])
    cond = c.condition(row.get("when"))
    text = f"({wt} x {at}" + (f" if {cond.text})" if cond else ")")
    return w, a, (cond.fn if cond else None), text
