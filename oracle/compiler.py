"""Stage 5: compile conditions, values and messages of a checked RuleSet into generated functions.

Conditions are compiled by filling the operator table's templates (operators.py); the code
is turned into functions only by codegen.py. `compile_ruleset` (tables.py) assembles the result.
"""
from __future__ import annotations

from typing import Any

from . import operators
from .codegen import CodeGen, Fn
from .envvars import EnvSpec
from .facts import CTX_FACTS, FACTS
from .loader import RuleSet
from .model import Cond, Ctx, Template, parse_capability, show
from .semantics import PLACEHOLDER

INLINE_DERIVED = 320  # characters of generated code up to which a derived fact is inlined where it is used


def _literal(fact: str, value: Any) -> Any:
    if FACTS.get(fact, ("",))[0] == "capability" and isinstance(value, str):
        return parse_capability(value)
    return value


def joined(codes: list[str], word: str) -> str:
    return codes[0] if len(codes) == 1 else "(" + f" {word} ".join(codes) + ")"


def memoized(key: str, inner: Fn, as_bool: bool = False) -> Fn:
    """Evaluate `inner` at most once per question: derived facts, values and env parses are shared.
    `as_bool`: keep bool(inner(ctx)) (a derived fact), without a wrapper call."""
    def fn(ctx: Ctx) -> Any:
        memo = ctx.memo
        if key in memo:
            return memo[key]
        v = memo[key] = inner(ctx)
        return v

    def flag(ctx: Ctx) -> Any:
        memo = ctx.memo
        if key in memo:
            return memo[key]
        v = memo[key] = bool(inner(ctx))
        return v
    return flag if as_bool else fn


class Compiler:
    """Turns validated rule data into Python expressions (operator templates) and functions (codegen)."""

    def __init__(self, rs: RuleSet):
        self.rs = rs
        s = rs.sections
        self.gen = CodeGen()
        self.env = {n: EnvSpec(n, e.data["parse"], e.data.get("default"), tuple(e.data.get("choices", ())), e.at())
                    for n, e in s["env_vars"].items()}
        self._derived: dict[str, Cond] = {}
        self._values: dict[str, Fn] = {}
        self._env_codes: dict[str, str] = {}

    def k(self, value: Any) -> str:
        return self.gen.k(value)

    def function(self, code: str) -> Fn:
        """The function of `code`, compiled on its first call (most of a table never runs in one process)."""
        return self.gen.lazy_function(code)

    def cond(self, code: str, text: str) -> Cond:
        return Cond(code, text, self.function)

    # --- leaves
    def getter(self, fact: str) -> str:
        if fact in CTX_FACTS:
            return f"ctx.{CTX_FACTS[fact]}"
        return f"ctx.facts[{self.k(fact)}]"

    def _constant(self, test: operators.Test, subject: str, raw: Any) -> Any:
        if test.literal == "set":
            return frozenset(_literal(subject, x) for x in raw)
        if test.literal == "majors":
            return frozenset(int(f.split(".")[0]) for f in (raw if isinstance(raw, list) else [raw]))
        if test.literal == "bool":
            return bool(raw)
        if test.literal == "raw":
            return raw
        if test.literal == "int":
            return int(raw)
        return _literal(subject, raw)

    def _tests(self, head: operators.Head, spec: dict[str, Any], subject: str, x: str, present: str = "") -> Cond:
        codes, texts = [], []
        for t in head.tests:
            names = [n for n in (t.name, *t.aliases) if n in spec]
            if not names:
                continue
            raw = spec[names[0]]
            if t.literal == "operand":  # another fact or value, read per question (never a constant)
                k, shown = self.operand_code(raw), raw.get("fact") or raw.get("value")
            else:
                k, shown = self.k(self._constant(t, subject, raw)), show(raw)
            codes.append(t.code.format(x=x, k=k, present=present))
            texts.append(t.render(subject, raw, shown))
        return self.cond(joined(codes, "and"), " and ".join(texts))

    def env_code(self, name: str) -> str:
        """Code reading the parsed value of a declared variable (its default when unset), parsed once per
        question. Inline, so an unset variable (the usual case) costs no function call."""
        if name not in self._env_codes:
            var = self.env[name]
            parsed = memoized("env:" + name, lambda ctx: var.value(ctx.env))
            self._env_codes[name] = f"({self.k(parsed)}(ctx) if {self.k(name)} in ctx.env else {self.k(var.default)})"
        return self._env_codes[name]

    def condition(self, spec: dict[str, Any] | None) -> Cond | None:
        if spec is None:
            return None
        head = operators.head_of(spec)
        if head is None:
            raise ValueError(f"not a condition: {spec!r}")  # unreachable after schema validation
        arg = spec[head.key]
        if head.children == "list":
            parts = [self.condition(c) for c in arg]
            return self.cond(joined([p.code for p in parts if p], head.code),
                             head.text.format(parts=f" {head.code} ".join(p.text for p in parts if p)))
        if head.children == "one":
            inner = self.condition(arg)
            assert inner is not None
            return self.cond(head.code.format(part=inner.code), head.text.format(part=inner.text))
        if head.key == "ref":
            return self.derived(arg)
        if head.key == "env":
            return self._tests(head, spec, arg, self.env_code(arg),
                               present=f"({self.k(arg)} in ctx.env)")
        if head.key == "fact":
            return self._tests(head, spec, arg, self.getter(arg))
        if head.key == "value":
            return self._tests(head, spec, arg, f"{self.k(self.value(arg))}(ctx)")
        return self.cond(head.code.format(k=self.k(arg)), head.text.format(name=arg))

    def derived(self, name: str) -> Cond:
        """A named fact, evaluated at most once per question (memoized in ctx.memo). A short one is written into
        the code that uses it instead: evaluating a few comparisons again costs less than a call and a memo lookup
        (what it calls is memoized itself, and it is pure, so the answer is the same). Called alone (a step's
        `when: {ref: ...}`), it is the memoized bool."""
        if name not in self._derived:
            entry = self.rs.sections["derived"][name]
            inner_cond = self.condition(entry.data["when"])
            assert inner_cond is not None
            fn = memoized("ref:" + name, inner_cond.fn, as_bool=True)
            inline = len(inner_cond.code) <= INLINE_DERIVED
            code = f"({inner_cond.code})" if inline else f"{self.k(fn)}(ctx)"
            self._derived[name] = Cond(code, name, self.function, fn)
        return self._derived[name]

    def operand_code(self, spec: dict[str, Any]) -> str:
        """Code reading an operand: a fact, or a named value's (memoized) function."""
        return self.getter(spec["fact"]) if "fact" in spec else f"{self.k(self.value(spec['value']))}(ctx)"

    def operand(self, spec: Any) -> Fn:
        """A fact, a named value, or (anything but a mapping) a literal constant."""
        if not isinstance(spec, dict):
            return lambda ctx: spec
        return self.function(self.getter(spec["fact"])) if "fact" in spec else self.value(spec["value"])

    def value(self, name: str) -> Fn:
        if name in self._values:
            return self._values[name]
        d = self.rs.sections["values"][name].data
        inner: Fn
        if "when" in d:
            test_cond = self.condition(d["when"])
            assert test_cond is not None
            test = test_cond.fn
            inner = lambda ctx: bool(test(ctx))  # noqa: E731
        elif "coalesce" in d:
            parts = tuple(self.operand(o) for o in d["coalesce"])
            inner = lambda ctx: next((v for v in (p(ctx) for p in parts) if v is not None), None)  # noqa: E731
        elif "cases" in d:
            cases = tuple((self._case_test(c["when"]), self.operand(c["is"])) for c in d["cases"])
            default = d.get("default")
            inner = lambda ctx: next((result(ctx) for test, result in cases if test(ctx)), default)  # noqa: E731
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
        fn = self._values[name] = memoized("value:" + name, inner)
        return fn

    def _case_test(self, spec: dict[str, Any]) -> Fn:
        cond = self.condition(spec)
        assert cond is not None
        return cond.fn

    def template(self, text: str) -> Template:
        getters: list[tuple[str, Fn | None]] = []
        for name in dict.fromkeys(PLACEHOLDER.findall(text)):
            if name in FACTS:
                getters.append((name, self.function(self.getter(name))))
            elif name in self.rs.sections["values"]:
                getters.append((name, self.value(name)))
            else:
                getters.append((name, None))
        return Template(text, tuple(getters))
