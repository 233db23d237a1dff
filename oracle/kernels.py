"""Kernel capability checks as data: the rules' `kernel_checks` table applied to each kernel.

Each row names a check (its reason key), the kernel field it reads and how that field becomes
a condition; rows run in table order (vLLM's order for the shipped rules). A kernel's own
`requires: [{check, when, reason}]` entries run after the table: new checks without an engine edit.

Row forms (exactly one of):
  field_is_condition: true      the field holds a condition (device, parallel)
  fact_in_field: FACT           FACT must be one of the field's list (activation, routing); an item
                                `{is: V, when: COND}` counts only while COND holds (a package feature)
  quant_scheme_rows: true       the field lists (weight key, activation key[, when]) rows
  requires: COND                COND must hold (e.g. `lora: false` kernels need moe.lora false)
  requires_by_value: {V: COND}  COND for the field's value V (e.g. the activation format)
with `default` (the field's value when the kernel omits it; no default: the row is skipped)
and `skip_if` (a field value that turns the check off: `non_gated: true`, `quant_schemes: any`).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .compiler import Compiler, joined
from .leaves import LeafExplainer, check_explainer, field_origin, requires_explainer
from .loader import Entry
from .model import Check, Kernel, Template, show


def kernel_fields(kernels: Mapping[str, Entry], name: str) -> dict[str, Any]:
    """A kernel's fields with `extends` applied (the child's fields win)."""
    d = dict(kernels[name].data)
    parent = d.pop("extends", None)
    d.pop("override", None)
    if parent is None:
        return d
    merged = kernel_fields(kernels, parent)
    merged.update(d)
    return merged


_MISSING = object()


def _row_condition(c: Compiler, row: dict[str, Any], value: Any) -> tuple[str, str] | None:
    """(code, text) of one table row for one kernel's field value; None when the row does not apply."""
    if "requires" in row:
        cond = c.condition(row["requires"])
    elif "requires_by_value" in row:
        cond = c.condition(row["requires_by_value"].get(str(value)))
    elif row.get("field_is_condition"):
        cond = c.condition(value)
    elif "fact_in_field" in row:
        return _in_field(c, row["fact_in_field"], value)
    else:  # quant_scheme_rows
        rows = [_scheme_row(c, r) for r in value]
        return joined([code for code, _ in rows], "or"), " or ".join(text for _, text in rows)
    return (cond.code, cond.text) if cond is not None else None


def field_values(items: list[Any]) -> tuple[list[Any], list[dict[str, Any]]]:
    """A fact_in_field list split into its plain values and its conditional `{is, when}` items."""
    return [v for v in items if not isinstance(v, dict)], [v for v in items if isinstance(v, dict)]


def _in_field(c: Compiler, fact: str, items: list[Any]) -> tuple[str, str]:
    plain, conditional = field_values(items)
    getter = c.getter(fact)
    codes, texts = [f"({getter} in {c.k(frozenset(plain))})"], [f"{fact} in {show(plain)}"]
    for item in conditional:
        cond = c.condition(item["when"])
        assert cond is not None
        codes.append(f"({getter} == {c.k(item['is'])} and {cond.code})")
        texts.append(f"{fact} == {show(item['is'])} if {cond.text}")
    return joined(codes, "or"), " or ".join(texts)


def compile_kernel(c: Compiler, name: str, checks: Mapping[str, Entry], reasons: Mapping[str, Template],
                   leaves: LeafExplainer | None = None) -> Kernel:
    kernels = c.rs.sections["kernels"]
    d = kernel_fields(kernels, name)
    x = leaves or LeafExplainer(c)
    out: list[Check] = []
    for check, entry in checks.items():
        row = entry.data
        value = d.get(row["field"], row.get("default", _MISSING))
        if value is _MISSING or ("skip_if" in row and value == row["skip_if"]):
            continue
        found = _row_condition(c, row, value)
        if found is not None:
            origin = field_origin(kernels, name, row["field"])
            out.append(Check(check, c.cond(*found), reasons[check],
                             check_explainer(x, row, entry, origin, row["field"], value)))
    for i, req in enumerate(d.get("requires") or []):
        cond = c.condition(req["when"])
        assert cond is not None
        out.append(Check(req["check"], cond, c.template(req["reason"]),
                         requires_explainer(x, req["when"], field_origin(kernels, name, "requires"), i)))
    accepts = c.function(joined([ch.cond.code for ch in out], "and")) if out else (lambda ctx: True)
    return Kernel(d.get("class", name), tuple(out), accepts, bool(d.get("monolithic")), bool(d.get("function_check")),
                  kernels[name].at())


def _key_test(c: Compiler, attr: str, spec: Any) -> tuple[str | None, str]:
    if spec == "any":
        return None, "any"
    if isinstance(spec, list):
        return f"(ctx.{attr} in {c.k(frozenset(spec))})", "{" + ",".join(show(x) for x in spec) + "}"
    return f"(ctx.{attr} == {c.k(spec)})", show(spec)


def _scheme_row(c: Compiler, row: dict[str, Any]) -> tuple[str, str]:
    w, wt = _key_test(c, "weight_key", row["weight"])
    a, at = _key_test(c, "activation_key", row["activation"])
    cond = c.condition(row.get("when"))
    codes = [x for x in (w, a, cond.code if cond else None) if x]
    text = f"({wt} x {at}" + (f" if {cond.text})" if cond else ")")
    return (joined(codes, "and") if codes else "True"), text
