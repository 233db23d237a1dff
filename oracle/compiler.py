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


class Cond:
    """A condition: Python source over `ctx`, its readable text, and (compiled on first use) the function.

    Compiling lazily matters at load time: most nodes only ever contribute their code to a parent."""

    __slots__ = ("code", "text", "_fn", "_compile")

    def __init__(self, code: str, text: str, compile_fn: Callable[[str], Fn], fn: Fn | None = None):
        self.code = code
        self.text = text
        self._fn = fn
        self._compile = compile_fn

    @property
    def fn(self) -> Fn:
        if self._fn is None:
            self._fn = self._compile(self.code)
        return self._fn


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


_COMPARE = {"eq": "==", "ne": "!=", "in": "in", "not_in": "not in"}
_ORDER = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
_OP_TEXT = {**_COMPARE, **_ORDER, "family": "in family", "is_null": "is null:"}


class Compiler:
    """Turns validated rule data into Python expressions and compiles each into one function.

    Why generate code: a condition tree of closures costs one Python call per node; one
    expression per kernel or step costs one. Safety: the generated source is built only from
    fixed templates and constant-table indices (K[n]); no text from a rule file ever becomes
    source, and the namespace has no builtins. Rule values are data in K, compared, never run.
    """

    def __init__(self, rs: RuleSet):
        self.rs = rs
        s = rs.sections
        self.env = {n: EnvSpec(n, e.data["parse"], e.data.get("default"), tuple(e.data.get("choices", ())), e.at())
                    for n, e in s["env_vars"].items()}
        self._consts: list[Any] = []
        self._ns: dict[str, Any] = {"K": self._consts, "__builtins__": {}}
        self._derived: dict[str, Cond] = {}
        self._values: dict[str, Fn] = {}
        self._env_values: dict[str, Fn] = {}

    def k(self, value: Any) -> str:
        """Reference to a constant: the only way rule data reaches generated code."""
        self._consts.append(value)
        return f"K[{len(self._consts) - 1}]"

    def function(self, code: str) -> Fn:
        return eval(f"lambda ctx: {code}", self._ns)  # noqa: S307 - code is built from templates only

    def cond(self, code: str, text: str) -> Cond:
        return Cond(code, text, self.function)

    # --- leaves
    def _getter(self, fact: str) -> str:
        if fact == "call.backend":
            return "ctx.call_backend"
        return f"ctx.facts[{self.k(fact)}]"

    def _compare(self, get: str, name: str, spec: dict) -> Cond:
        codes, texts = [], []
        for op in ("eq", "ne", "in", "not_in", "ge", "gt", "le", "lt", "family", "is_null"):
            if op not in spec:
                continue
            raw = spec[op]
            if op in ("in", "not_in"):
                code = f"({get} {_COMPARE[op]} {self.k(frozenset(_literal(name, x) for x in raw))})"
            elif op in _COMPARE:
                code = f"({get} {_COMPARE[op]} {self.k(_literal(name, raw))})"
            elif op in _ORDER:
                code = f"((_v := {get}) is not None and _v {_ORDER[op]} {self.k(_literal(name, raw))})"
            elif op == "family":
                majors = frozenset(int(f.split(".")[0]) for f in (raw if isinstance(raw, list) else [raw]))
                code = f"((_v := {get}) is not None and _v[0] in {self.k(majors)})"
            else:
                code = f"(({get} is None) == {self.k(bool(raw))})"
            codes.append(code)
            texts.append(f"{name} {_OP_TEXT[op]} {_show(raw)}")
        return self.cond(_joined(codes, "and"), " and ".join(texts))

    def env_value(self, name: str) -> Fn:
        """The parsed value of a declared variable (its default when unset), parsed once per question."""
        if name not in self._env_values:
            var = self.env[name]
            default = var.default
            parsed = _memoized("env:" + name, lambda ctx: var.value(ctx.env))
            self._env_values[name] = lambda ctx: parsed(ctx) if name in ctx.env else default
        return self._env_values[name]

    def _env(self, spec: dict) -> Cond:
        name = spec["env"]
        value = f"{self.k(self.env_value(name))}(ctx)"
        codes, texts = [], []
        if "set" in spec:
            codes.append(f"(({self.k(name)} in ctx.env) == {self.k(spec['set'])})")
            texts.append(f"{name} {'is set' if spec['set'] else 'is unset'}")
        if "is" in spec:
            codes.append(f"({value} is {self.k(spec['is'])})")
            texts.append(f"{name} is {_show(spec['is'])}")
        if "eq" in spec:
            codes.append(f"({value} == {self.k(spec['eq'])})")
            texts.append(f"{name} == {spec['eq']}")
        if "in" in spec:
            codes.append(f"({value} in {self.k(frozenset(spec['in']))})")
            texts.append(f"{name} in {_show(spec['in'])}")
        return self.cond(_joined(codes, "and"), " and ".join(texts))

    def condition(self, spec: dict | None) -> Cond | None:
        if spec is None:
            return None
        if "all" in spec or "any" in spec:
            word = "and" if "all" in spec else "or"
            parts = [self.condition(c) for c in spec["all" if word == "and" else "any"]]
            return self.cond(_joined([p.code for p in parts], word), "(" + f" {word} ".join(p.text for p in parts) + ")")
        if "not" in spec:
            inner = self.condition(spec["not"])
            return self.cond(f"(not {inner.code})", f"not {inner.text}")
        if "ref" in spec:
            return self.derived(spec["ref"])
        if "package" in spec:
            return self.cond(f"({self.k(spec['package'])} in ctx.packages)", f"package {spec['package']} installed")
        if "env" in spec:
            return self._env(spec)
        if "fact" in spec:
            return self._compare(self._getter(spec["fact"]), spec["fact"], spec)
        name = spec["value"]
        return self._compare(f"{self.k(self.value(name))}(ctx)", name, spec)

    def derived(self, name: str) -> Cond:
        """A named fact, evaluated at most once per question (memoized in ctx.memo)."""
        if name not in self._derived:
            entry = self.rs.sections["derived"][name]
            inner = self.condition(entry.data["when"]).fn
            fn = _memoized("ref:" + name, lambda ctx: bool(inner(ctx)))
            self._derived[name] = Cond(f"{self.k(fn)}(ctx)", name, self.function, fn)
        return self._derived[name]

    def operand(self, spec: dict) -> Fn:
        return self.function(self._getter(spec["fact"])) if "fact" in spec else self.value(spec["value"])

    def value(self, name: str) -> Fn:
        if name in self._values:
            return self._values[name]
        d = self.rs.sections["values"][name].data
        if "when" in d:
            test = self.condition(d["when"]).fn
            inner = lambda ctx: bool(test(ctx))  # noqa: E731
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
        fn = self._values[name] = _memoized("value:" + name, inner)
        return fn


def _memoized(key: str, inner: Fn) -> Fn:
    """Evaluate `inner` at most once per question: derived facts, values and env parses are shared."""
    def fn(ctx: Ctx) -> Any:
        memo = ctx.memo
        if key in memo:
            return memo[key]
        v = memo[key] = inner(ctx)
        return v
    return fn


def _joined(codes: list[str], word: str) -> str:
    return codes[0] if len(codes) == 1 else "(" + f" {word} ".join(codes) + ")"


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
            getters.append((name, compiler.function(compiler._getter(name))))
        elif name in compiler.rs.sections["values"]:
            getters.append((name, compiler.value(name)))
        else:
            getters.append((name, None))
    return Template(text, tuple(getters))


# ------------------------------------------------------------------ tables


@dataclass(frozen=True)
class Check:
    """One of a kernel's checks, in vLLM's order; its own function is compiled only for traces."""

    name: str
    cond: Cond
    reason: Template

    @property
    def fn(self) -> Fn:
        return self.cond.fn

    @property
    def text(self) -> str:
        return self.cond.text


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
    converter: str | None  # module:attr resolved lazily by oracle.registry; None when there is none here
    runner: str | None
    missing_why: str | None  # why converter or runner is None
    at: str


FROM_SCENARIO = "from_scenario"


@dataclass(frozen=True)
class RoundRow:
    backends: frozenset | None
    when: Fn | None
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
    test: Fn | None  # when.fn, resolved at build time: the hot loop reads a plain attribute
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
    batch_inv = c.derived("batch_invariant_mode").fn if "batch_invariant_mode" in s["derived"] else None

    def kernel(name: str, reasons: Mapping[str, Template]) -> Kernel:
        d = _kernel_fields(s["kernels"], name)
        checks: list[Check] = []

        def add(check: str, code: str, text: str) -> None:
            checks.append(Check(check, c.cond(code, text), reasons[check]))

        device = c.condition(d.get("device"))
        if device is not None:
            add("device", device.code, device.text)
        if not d.get("non_gated", False):
            add("act_and_mul", f"ctx.facts[{c.k('moe.is_act_and_mul')}]", "moe.is_act_and_mul == true")
        if "activations" in d:
            add("activation", f"(ctx.facts[{c.k('moe.activation')}] in {c.k(frozenset(d['activations']))})",
                f"moe.activation in {_show(d['activations'])}")
        schemes = d.get("quant_schemes", "any")
        if schemes != "any":
            rows = [_scheme_row(c, r) for r in schemes]
            add("quant_scheme", _joined([code for code, _ in rows], "or"), " or ".join(text for _, text in rows))
        parallel = c.condition(d.get("parallel"))
        if parallel is not None:
            add("parallel", parallel.code, parallel.text)
        if "routing_methods" in d:
            add("routing", f"(ctx.facts[{c.k('moe.routing_method')}] in {c.k(frozenset(d['routing_methods']))})",
                f"moe.routing_method in {_show(d['routing_methods'])}")
        if batched is not None:
            want = d.get("format", "standard") == "batched"
            add("format", f"({c.k(batched)}(ctx) is {c.k(want)})", f"batched_activation_format is {_show(want)}")
        if not d.get("batch_invariant", False) and batch_inv is not None:
            add("batch_invariance", f"(not {c.k(batch_inv)}(ctx))", "not batch_invariant_mode")
        if not d.get("lora", False):
            add("lora", f"(not ctx.facts[{c.k('moe.lora')}])", "moe.lora == false")
        accepts = c.function(_joined([ch.cond.code for ch in checks], "and")) if checks else (lambda ctx: True)
        return Kernel(name, tuple(checks), accepts, bool(d.get("monolithic")), bool(d.get("function_check")),
                      s["kernels"][name].at())

    families: dict[str, Family] = {}
    for fname, fe in s["families"].items():
        fd = fe.data
        reasons = {k: template(c, v) for k, v in fd["kernel_reasons"].items()}
        act_default = FROM_SCENARIO if fd.get("activation_key") == FROM_SCENARIO else None
        backends = {
            bname: Backend(bname, b.get("value", bname), tuple(kernel(k, reasons) for k in b["kernels"]),
                           b.get("activation_key", act_default), b.get("converter"), b.get("runner"),
                           b.get("missing_why"), fe.at("backends", bname))
            for bname, b in fd["backends"].items()}
        emap = fd.get("explicit_map") or {}
        rows = tuple(RoundRow(frozenset(r["backends"]) if "backends" in r else None,
                              c.condition(r["when"]).fn if "when" in r else None,
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
            when = c.condition(st.get("when"))
            steps.append(Step(st["id"], when, when.fn if when else None, action, arg, st.get("check", True),
                              st.get("report_kernel", True), template(c, st["message"]) if "message" in st else None,
                              pe.at("steps", i), st["why"]))
        queries = {q: c.value(spec["value"]) for q, spec in (pd.get("queries") or {}).items()}
        policies[pname] = Policy(pname, pd["description"], families[pd["family"]], tuple(pd.get("candidates") or ()),
                                 tuple(steps), MappingProxyType(queries), pe.at())
    archs = {k: parse_capability(v.data) for k, v in s["rocm_archs"].items()}
    return Table(rs.name, rs.description, tuple(rs.files), MappingProxyType(policies), MappingProxyType(families),
                 frozenset(packages), frozenset(c.env), MappingProxyType(archs), batched)


def _key_test(c: Compiler, attr: str, spec: Any) -> tuple[str | None, str]:
    if spec == "any":
        return None, "any"
    if isinstance(spec, list):
        return f"(ctx.{attr} in {c.k(frozenset(spec))})", "{" + ",".join(_show(x) for x in spec) + "}"
    return f"(ctx.{attr} == {c.k(spec)})", _show(spec)


def _scheme_row(c: Compiler, row: dict) -> tuple[str, str]:
    w, wt = _key_test(c, "weight_key", row["weight"])
    a, at = _key_test(c, "activation_key", row["activation"])
    cond = c.condition(row.get("when"))
    codes = [x for x in (w, a, cond.code if cond else None) if x]
    text = f"({wt} x {at}" + (f" if {cond.text})" if cond else ")")
    return (_joined(codes, "and") if codes else "True"), text
