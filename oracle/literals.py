"""Rule literals checked against the vocabularies the scenario side uses, so a typo is an error, never a silent false.

`{fact: moe.activation, eq: swiglu}` or `activations: [swiglu]` would simply never match; a
capability written `"sm_90"` would crash at compile time; `default: "no"` for an int_bool variable
is a value its parser can never produce. The vocabularies are the scenario's own (declared once):
activations and routing methods in oracle.vocabulary, platform kinds in oracle.facts, ROCm archs,
quantization keys and packages in the rules' own sections.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from .errors import did_you_mean
from .facts import CAPABILITY_RANGES, FACTS, PLATFORM_KINDS
from .vocabulary import (
    ACTIVATIONS,
    ALL2ALL_BACKENDS,
    BY_OCP_DTYPE,
    BY_QUANT_KEY,
    FORMATS,
    QUARK_QSCHEMES,
    QUARK_SCALE_FORMATS,
    ROUTING_METHODS,
)

CAPABILITY = re.compile(r"^[0-9]+\.[0-9]+$")
_EQUALITY = ("eq", "ne", "in", "not_in")
_ORDER = ("ge", "gt", "le", "lt")


def vocabularies(sections: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """fact -> (what its values are called, the values a scenario may give it)."""
    keys = ("quantization key", tuple(sections["quant_keys"]))
    # moe_backend strings: 'auto' and the names the families' explicit maps accept (what --moe-backend may say)
    backends, names = ["auto"], []
    for family in sections["families"].values():
        data = family.data if isinstance(family.data, dict) else {}
        emap = data.get("explicit_map")
        entries = emap.get("entries") if isinstance(emap, dict) else None
        backends += [k for k in entries or {} if k not in backends]
        names += [k for k in data.get("backends") or {} if k not in names]
    return {"moe.moe_backend": ("moe_backend string", tuple(backends)),
            "call.backend": ("backend", tuple(names)),
            "quark.weight.qscheme": ("Quark qscheme", QUARK_QSCHEMES),
            "quark.input.qscheme": ("Quark qscheme", QUARK_QSCHEMES),
            "quark.weight.scale_format": ("Quark scale format", QUARK_SCALE_FORMATS),
            "quark.input.scale_format": ("Quark scale format", QUARK_SCALE_FORMATS),
            "moe.activation": ("activation", ACTIVATIONS),
            "moe.routing_method": ("routing method", ROUTING_METHODS),
            "moe.parallel.all2all_backend": ("all2all backend", ALL2ALL_BACKENDS),
            "platform.kind": ("platform kind", PLATFORM_KINDS),
            "platform.gcn_arch": ("ROCm arch", tuple(sections["rocm_archs"])),
            "moe.weight_key": keys, "moe.activation_key": keys, "moe.user_activation_key": keys,
            "scheme.weight_key": keys, "scheme.activation_key": keys}


def unknown_value(vocab: tuple[str, tuple[str, ...]], fact: str, value: Any) -> str | None:
    """The message for a value outside `fact`'s vocabulary, or None (null never is: it means 'not given')."""
    what, known = vocab
    if value is None or value in known:
        return None
    return f"unknown {what} '{value}'{did_you_mean(value, known)}; {fact} is one of {', '.join(known)}"


def capability_problem(test: str, value: Any) -> str | None:
    """A capability literal must be the string 'major.minor' (numbers and 'sm_90' never compare as meant), with a
    major a scenario may give and a one-digit minor ('7.50' would compare as 7.50 > 7.5, which no GPU is)."""
    if isinstance(value, str) and CAPABILITY.match(value):
        major, minor = value.split(".")
        (lo, hi), _ = CAPABILITY_RANGES
        if len(minor) == 1 and lo <= int(major) <= hi:
            return None
        guess = f"{int(major)}.{int(minor) // 10 ** (len(minor) - 1) if minor.strip('0') else 0}"
        return (f"capability {value!r} in '{test}' is not a capability: the major is {lo} to {hi} and the minor one "
                f"digit (did you mean \"{guess}\"?); write e.g. \"9.0\" or \"10.3\"")
    if test in _ORDER and isinstance(value, str):
        return None  # the schema's pattern already reports a malformed string here
    hint = f" (did you mean \"{_guess(value)}\"?)" if _guess(value) else ""
    return (f"capability {value!r} in '{test}' is not 'major.minor'{hint}; write a quoted string such as \"9.0\" "
            "or \"10.0\"")


def _guess(value: Any) -> str:
    """'sm_90' -> '9.0', '9' -> '9.0', 100 -> '10.0', 9.0 -> '9.0'; '' when no digits."""
    digits = re.sub(r"[^0-9.]", "", str(value))
    if CAPABILITY.match(digits):
        return digits
    if digits.isdigit():
        return f"{digits[:-1]}.{digits[-1]}" if len(digits) > 1 else f"{digits}.0"
    return ""


def fact_leaf(node: dict[str, Any], vocab: Mapping[str, tuple[str, tuple[str, ...]]],
              capability_facts: tuple[str, ...]) -> Iterator[tuple[tuple[Any, ...], str]]:
    """(path below the leaf, message) for every literal of a `{fact: ...}` leaf its fact can never take."""
    fact = str(node.get("fact"))
    kind = FACTS.get(fact, ("", None))[0]
    for test in (*_EQUALITY, *_ORDER):
        if test not in node:
            continue
        raw = node[test]
        values = list(enumerate(raw)) if isinstance(raw, list) else [(None, raw)]
        for i, value in values:
            where = (test,) if i is None else (test, i)
            if isinstance(value, float) and not math.isfinite(value):
                found: str | None = (f"{value!r} in '{test}': a fact is never NaN or infinite (and NaN equals "
                                     "nothing); write a finite number")
            elif kind in ("bool", "bool?") and not isinstance(value, bool) and not (value is None and kind == "bool?"):
                found = (f"{fact} is true or false{' (or null)' if kind == 'bool?' else ''}, never {value!r}; "
                         f"write {test}: {'true' if value else 'false'}" if test in _EQUALITY else
                         f"{fact} is true or false: test it with eq, not {test}")
            elif fact in capability_facts:
                found = capability_problem(test, value)
            elif fact in vocab and test in _EQUALITY:
                found = unknown_value(vocab[fact], fact, value)
            else:
                found = None
            if found:
                yield where, found


def value_results(name: str, values: Mapping[str, Any], tables: Mapping[str, Any],
                  _seen: frozenset[str] = frozenset()) -> tuple[Any, ...] | None:
    """Every result the `values` entry `name` can have, when the rules fix them: a `when` is true or false; a `map`
    (not passing its input through) one of its outputs or its default; `cases` one of their `is` results (literals,
    or values whose results are fixed) or the default; a `lookup` a last-column cell of its table or the default.
    None when open (a coalesce, a fact, a passthrough)."""
    entry = values.get(name)
    data = getattr(entry, "data", None)
    if not isinstance(data, dict) or name in _seen:
        return None
    seen = _seen | {name}
    results: list[Any]
    if "when" in data:
        return (True, False)
    if isinstance(data.get("map"), dict) and not data.get("passthrough"):
        results = [*data["map"].values(), data.get("default")]
    elif isinstance(data.get("cases"), list):
        results = [data.get("default")]
        for case in data["cases"]:
            result = case.get("is") if isinstance(case, dict) else None
            if isinstance(result, dict):
                inner = value_results(result["value"], values, tables, seen) if set(result) == {"value"} else None
                if inner is None:
                    return None
                results += inner
            else:
                results.append(result)
    elif isinstance(data.get("lookup"), str):
        rows = getattr(tables.get(data["lookup"]), "data", {}).get("rows")
        if not isinstance(rows, list) or not all(isinstance(r, list) and r for r in rows):
            return None
        results = [r[-1] for r in rows] + [data.get("default")]
    else:
        return None
    if all(r is None or isinstance(r, (str, int, float, bool)) for r in results):
        return tuple(dict.fromkeys(results))
    return None


def value_leaf(node: dict[str, Any], name: str, results: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], str]]:
    """(path below the leaf, message) for every literal a `{value: name, ...}` leaf compares that the value can
    never be (`eq: rue` on a true/false value never matches)."""
    for test in _EQUALITY:
        raw = node.get(test)
        if test not in node:
            continue
        for i, literal in list(enumerate(raw)) if isinstance(raw, list) else [(None, raw)]:
            if not any(literal == r and type(literal) is type(r) for r in results):
                shown = ", ".join("null" if r is None else str(r).lower() if isinstance(r, bool) else str(r)
                                  for r in results)
                yield ((test,) if i is None else (test, i),
                       f"value '{name}' is never {literal!r}{did_you_mean(literal, [str(r) for r in results])}; "
                       f"it is one of {shown}")


_BOOL_PARSERS = ("int_bool", "true_or_1", "true_or_1_stripped")
_FALSY = ("0", "no", "false", "off", "n", "f")


def env_default_problem(name: str, spec: Mapping[str, Any]) -> str | None:
    """Why `default` is not a value the variable's parser can produce (what reading it would give), or None."""
    parse, default = spec.get("parse"), spec.get("default")
    if parse in _BOOL_PARSERS:
        if default is None or isinstance(default, bool):  # null: a tri-state variable, None while unset
            return None
        guess = "false" if str(default).strip().lower() in _FALSY else "true"
        return (f"default {default!r} of {name} is not a value {parse} can produce (it parses to true or false); "
                f"write default: {guess}")
    if parse == "choice":
        choices = spec.get("choices") or []
        if default is None or default in choices:
            return None
        return (f"default {default!r} of {name} is not one of its choices{did_you_mean(default, choices)}; "
                f"choose one of {', '.join(map(str, choices))}")
    if parse == "lower" and default is not None and (not isinstance(default, str) or default != default.lower()):
        return (f"default {default!r} of {name} is not what 'lower' produces (a lower-case string); "
                f"write {str(default).lower()!r}")
    return None


def weight_format(name: Any) -> tuple[str, int] | None:
    """(name, block size) of a weight format named by its vLLM quant key (kMxfp4Static) or its OCP MX / codec
    name (mxfp4, nvfp4), None for a name with no block (per tensor or channel) or none known."""
    if not isinstance(name, str):
        return None
    fmt = BY_QUANT_KEY.get(name) or BY_OCP_DTYPE.get(name) or next((f for f in FORMATS if f.codec == name), None)
    return (name, fmt.block) if fmt is not None and fmt.block else None
