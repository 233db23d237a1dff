"""Why a kernel check failed, leaf by leaf: each false leaf with the fact's actual value and its rule location.

vLLM reports one generic reason per failed check ("kernel does not support current device cuda");
whether the capability, the package or both were wrong is left to the reader. Here the check's
condition tree is evaluated node by node (only when a trace is asked for: the fast path never
comes here) and every leaf that made it false is reported: `platform.capability 9.0 is not in
family 10.x`, `package flashinfer is not installed`. Derived facts (`{ref: cuda_sm10x}`) expand
to their own leaves, located in the file that defines them; under `not`, the leaves that held
(and must not) are reported.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from . import operators
from .compiler import Compiler
from .errors import EnvValueError
from .facts import CTX_FACTS
from .loader import Entry
from .model import Ctx, show
from .trace import Leaf

Explainer = Callable[[Ctx], tuple[Leaf, ...]]
Path = tuple[Any, ...]


def written(spec: Any) -> str:
    """A condition node as the rule file writes it (flow style), e.g. `{fact: platform.kind, eq: cuda}`."""
    if isinstance(spec, dict):
        return "{" + ", ".join(f"{k}: {written(v)}" for k, v in spec.items()) + "}"
    if isinstance(spec, list):
        return "[" + ", ".join(written(v) for v in spec) + "]"
    return show(spec)


class LeafExplainer:
    """Evaluates condition trees of one compiled table leaf by leaf (compiling each node once, lazily)."""

    def __init__(self, c: Compiler):
        self.c = c
        self._fns: dict[int, Callable[[Ctx], Any]] = {}
        self._parts: dict[tuple[int, str], dict[str, Any]] = {}

    def _single(self, spec: dict[str, Any], head: str, test: str) -> dict[str, Any]:
        """The leaf reduced to one of its tests (`{fact: x, ge: a, lt: b}` -> `{fact: x, ge: a}`), kept for reuse."""
        if len(spec) == 2:
            return spec
        key = (id(spec), test)
        found = self._parts.get(key)
        if found is None:
            found = self._parts[key] = {head: spec[head], test: spec[test]}
        return found

    def holds(self, spec: dict[str, Any], ctx: Ctx) -> bool:
        fn = self._fns.get(id(spec))
        if fn is None:
            cond = self.c.condition(spec)
            assert cond is not None
            fn = self._fns[id(spec)] = cond.fn
        return bool(fn(ctx))

    def leaves(self, spec: Any, entry: Entry, path: Path, ctx: Ctx, want: bool = True,
               via: tuple[str, ...] = ()) -> list[Leaf]:
        """The leaves that make `spec` differ from `want` (empty when it does not differ)."""
        head = operators.head_of(spec)
        if head is None:
            return []
        try:
            if self.holds(spec, ctx) == want:
                return []
        except EnvValueError as exc:
            return [Leaf(written(spec), "a parsable value", str(exc), entry.at(*path), via, str(exc))]
        if head.children == "one":
            return self.leaves(spec[head.key], entry, (*path, head.key), ctx, not want, via)
        if head.children == "list":
            out: list[Leaf] = []
            for i, sub in enumerate(spec[head.key]):
                out.extend(self.leaves(sub, entry, (*path, head.key, i), ctx, want, via))
            return out
        if head.key == "ref":
            name = spec["ref"]
            derived = self.c.rs.sections["derived"][name]
            return self.leaves(derived.data["when"], derived, ("when",), ctx, want, (*via, name))
        return [self.leaf(head, spec, entry, path, ctx, want, via)]

    # ------------------------------------------------------------ one leaf
    def leaf(self, head: operators.Head, spec: dict[str, Any], entry: Entry, path: Path, ctx: Ctx, want: bool,
             via: tuple[str, ...]) -> Leaf:
        at = entry.at(*path)
        name = spec[head.key]
        if head.key == "package":
            installed = name in ctx.packages
            actual = "installed" if installed else "not installed"
            expected = "installed" if want else "not installed"
            return Leaf(written(spec), expected, actual, at, via, f"package {name} is {actual}")
        subject, actual = self.subject(head.key, name, ctx)
        parts_failed, parts_expected = [], []
        for test in head.tests:
            given = [n for n in (test.name, *test.aliases) if n in spec]
            if not given:
                continue
            raw = spec[given[0]]
            shown = self.shown(test, raw, ctx)
            held_text, failed_text = _texts(head.key, test.name, raw)
            parts_expected.append((held_text if want else failed_text).format(shown=shown))
            if self.holds(self._single(spec, head.key, given[0]), ctx) != want:
                if want and actual == "null" and test.name in _NEEDS_A_VALUE:
                    parts_failed.append(f"cannot be compared (needs a value that {held_text.format(shown=shown)})")
                else:
                    parts_failed.append((failed_text if want else held_text).format(shown=shown))
        failed = " and ".join(parts_failed or parts_expected)
        suffix = "" if want else " (must not)"
        return Leaf(written(spec), " and ".join(parts_expected), actual, at, via, f"{subject} {failed}{suffix}")

    def subject(self, key: str, name: str, ctx: Ctx) -> tuple[str, str]:
        """How the tested thing and its actual value read: `platform.capability 9.0`, `VLLM_X='0'`."""
        if key == "fact":
            value = getattr(ctx, CTX_FACTS[name]) if name in CTX_FACTS else ctx.facts.get(name)
            return f"{name} {show(value)}", show(value)
        if key == "value":
            value = self.c.value(name)(ctx)
            return f"{name} {show(value)}", show(value)
        raw = ctx.env.get(name)
        if raw is None:
            default = self.c.env[name].default
            return f"{name} (unset, default {show(default)})", f"unset (default {show(default)})"
        return f"{name}={raw!r}", repr(raw)

    def shown(self, test: operators.Test, raw: Any, ctx: Ctx) -> str:
        if test.literal == "operand" and isinstance(raw, Mapping):
            other = str(raw.get("fact") or raw.get("value"))
            if "fact" in raw:
                value = getattr(ctx, CTX_FACTS[other]) if other in CTX_FACTS else ctx.facts.get(other)
            else:
                value = self.c.value(other)(ctx)
            return f"{other} ({show(value)})"
        return show(raw)


_NEEDS_A_VALUE = ("ge", "gt", "le", "lt", "family", "multiple_of")  # false for a missing value, whatever the bound


def _texts(head: str, test: str, raw: Any) -> tuple[str, str]:
    """(text when the test holds, text when it fails) for one test of a leaf, from the operator table."""
    held, failed = operators.LEAF_TEXTS[(head if head == "env" else "fact", test)]
    if isinstance(held, dict):  # boolean tests: the words depend on the rule's value
        return held[bool(raw)], failed[bool(raw)]
    return held, failed


# ------------------------------------------------------------------ kernel checks


def field_origin(kernels: Mapping[str, Entry], name: str, field: str) -> Entry:
    """The kernel entry whose own data defines `field` (following `extends`), else the kernel itself."""
    entry = kernels[name]
    seen = {name}
    while field not in entry.data and "extends" in entry.data and entry.data["extends"] not in seen:
        seen.add(entry.data["extends"])
        entry = kernels[entry.data["extends"]]
    return entry


def check_explainer(x: LeafExplainer, row: dict[str, Any], check: Entry, kernel: Entry, field: str,
                    value: Any) -> Explainer:
    """The failing leaves of one kernel_checks row applied to one kernel's field value."""
    defined = field in kernel.data
    if "requires" in row:
        return lambda ctx: tuple(x.leaves(row["requires"], check, ("requires",), ctx))
    if "requires_by_value" in row:
        key = str(value)
        return lambda ctx: tuple(x.leaves(row["requires_by_value"].get(key), check, ("requires_by_value", key), ctx))
    if row.get("field_is_condition"):
        return lambda ctx: tuple(x.leaves(value, kernel, (field,), ctx))
    if "fact_in_field" in row:
        fact = row["fact_in_field"]
        at = kernel.at(field) if defined else kernel.at()

        def in_field(ctx: Ctx) -> tuple[Leaf, ...]:
            actual = ctx.facts.get(fact)
            for i, item in enumerate(value):  # the value is listed, but only while a condition holds: why not
                if isinstance(item, dict) and item["is"] == actual:
                    return tuple(x.leaves(item["when"], kernel, (field, i, "when"), ctx))
            return (Leaf(f"{field}: {written(value)}", f"in {written(value)}", show(actual), at, (),
                         f"{fact} {show(actual)} is not in {written(value)}"),)
        return in_field
    return lambda ctx: _scheme_leaves(x, kernel, field, value, ctx)


def requires_explainer(x: LeafExplainer, spec: dict[str, Any], kernel: Entry, i: int) -> Explainer:
    """The failing leaves of a kernel's own `requires[i].when`."""
    return lambda ctx: tuple(x.leaves(spec, kernel, ("requires", i, "when"), ctx))


def _key_matches(spec: Any, key: Any) -> bool:
    return spec == "any" or (key in spec if isinstance(spec, list) else key == spec)


def _scheme_leaves(x: LeafExplainer, kernel: Entry, field: str, rows: list[dict[str, Any]],
                   ctx: Ctx) -> tuple[Leaf, ...]:
    """Rows whose keys match but whose `when` fails explain themselves; otherwise the pair matches no row."""
    out: list[Leaf] = []
    for i, row in enumerate(rows):
        if _key_matches(row["weight"], ctx.weight_key) and _key_matches(row["activation"], ctx.activation_key):
            if "when" in row:
                out.extend(x.leaves(row["when"], kernel, (field, i, "when"), ctx))
    if out:
        return tuple(out)
    pair = f"{show(ctx.weight_key)} x {show(ctx.activation_key)}"
    listed = ", ".join(f"{written(r['weight'])} x {written(r['activation'])}" for r in rows)
    return (Leaf(f"{field}: [{listed}]", f"one of [{listed}]", pair, kernel.at(field), (),
                 f"quantization scheme {pair} is not among [{listed}]"),)
