"""Stage 2: check one parsed rule file against its JSON Schema, with readable messages.

jsonschema-rs answers "valid?" fast; only an invalid file pays for the reference validator,
whose errors carry schema paths that become one message per location, with a did-you-mean.
"""
from __future__ import annotations

import json
from functools import cache
from typing import Any

from .errors import Diagnostic, did_you_mean
from .limits import MAX_REPORTED_ERRORS
from .resources import schemas_dir
from .yamlio import Located

SECTIONS = ("rocm_archs", "quant_keys", "packages", "env_vars", "derived", "values", "tables", "kernel_checks",
            "kernels", "families", "policies", "fact_defaults", "checkpoint_policies")


@cache
def _schema(schema_name: str) -> dict[str, Any]:
    with open(schemas_dir() / schema_name, encoding="utf-8") as fh:
        schema: dict[str, Any] = json.load(fh)
    return schema


def kernel_fields() -> tuple[str, ...]:
    """The fields a kernel may have (what a kernel check's `field` may read)."""
    props = _schema("rules.schema.json")["properties"]["kernels"]["additionalProperties"]["properties"]
    return tuple(k for k in props if k not in ("extends", "why", "override"))


@cache
def _fast_validator(schema_name: str) -> Any:
    """jsonschema-rs answers 'valid?' ~50x faster than jsonschema; None when it is not installed."""
    try:
        import jsonschema_rs
    except ImportError:
        return None
    return jsonschema_rs.validator_for(_schema(schema_name))


@cache
def _validator(schema_name: str) -> Any:
    """The reference validator, imported only to explain a failure: its errors carry schema paths."""
    import jsonschema

    schema = _schema(schema_name)
    return jsonschema.validators.validator_for(schema)(schema)


def _schema_message(err: Any) -> str:
    where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
    if err.validator == "additionalProperties":
        known = err.schema.get("properties", {})
        extra = [k for k in err.instance if k not in known] if isinstance(err.instance, dict) else []
        allowed = list(err.schema.get("properties", {}))
        if extra:
            key = extra[0]
            hint = did_you_mean(key, allowed) or (f"; allowed: {', '.join(allowed)}" if allowed else "")
            return f"unknown field '{key}' in {where}{hint}"
    if err.validator == "enum" and isinstance(err.instance, str):
        return (f"{where}: '{err.instance}' is not allowed{did_you_mean(err.instance, err.validator_value)}; "
                f"expected one of {', '.join(map(str, err.validator_value))}")
    if err.validator == "anyOf":
        expected = " or ".join(_describe(a) for a in err.validator_value)
        return f"{where}: {err.instance!r} is not valid here; expected {expected}"
    if err.validator == "required":
        return f"{where}: missing required field {err.message.split(' is a required')[0]}"
    if err.validator == "oneOf" and isinstance(err.instance, dict):
        return f"{where}: give exactly one of the alternatives ({_one_of_summary(err.validator_value)})"
    if err.validator == "pattern":
        return f"{where}: {err.instance!r} does not match the required pattern {err.validator_value}"
    return f"{where}: {err.message}"


def _describe(schema: Any) -> str:
    if not isinstance(schema, dict):
        return str(schema)
    if "description" in schema:
        return str(schema["description"])
    if "const" in schema:
        return repr(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(map(str, schema["enum"]))
    if "type" in schema:
        kind = schema["type"]
        return " or ".join(kind) if isinstance(kind, list) else f"a {kind}"
    if "anyOf" in schema:
        return " or ".join(_describe(a) for a in schema["anyOf"])
    return "a value matching the schema"


def _one_of_summary(alternatives: list[Any]) -> str:
    keys = [" + ".join(a.get("required", [])) for a in alternatives if isinstance(a, dict)]
    return ", ".join(k for k in keys if k) or "see the schema"


def _best_errors(errors: list[Any]) -> list[Any]:
    """One error per location: the deepest, most specific one."""
    by_path: dict[tuple[Any, ...], Any] = {}
    for err in errors:
        for leaf in _leaves(err):
            key = tuple(leaf.absolute_path)
            if key not in by_path or len(leaf.schema_path) > len(by_path[key].schema_path):
                by_path[key] = leaf
    # drop an error whose location is a strict prefix of another reported location
    paths = list(by_path)
    prefixes = {q[:k] for q in paths for k in range(len(q))}  # strict prefixes: linear in the paths' lengths
    keep = [p for p in paths if p not in prefixes]
    return [by_path[p] for p in sorted(keep, key=lambda p: [str(x) for x in p])]


def _leaves(err: Any) -> list[Any]:
    if err.validator == "anyOf" and err.context and all(list(sub.absolute_path) == list(err.absolute_path)
                                                        for sub in err.context):
        return [err]  # alternatives for this very value: one message naming them all
    if err.context and err.validator in ("anyOf", "allOf"):
        out: list[Any] = []
        for sub in err.context:
            out.extend(_leaves(sub))
        return out
    return [err]


def schema_diagnostics(doc: Located, schema_name: str = "rules.schema.json") -> list[Diagnostic]:
    if not isinstance(doc.data, dict):
        return [doc.diag((), "a rule file must be a mapping of sections (" + ", ".join(SECTIONS) + ")")]
    fast = _fast_validator(schema_name)
    if fast is not None and fast.is_valid(doc.data):
        return []
    validator = _validator(schema_name)
    best = _best_errors(list(validator.iter_errors(doc.data)))
    out = [doc.diag(tuple(e.absolute_path), _schema_message(e)) for e in best[:MAX_REPORTED_ERRORS]]
    if len(best) > MAX_REPORTED_ERRORS:
        out.append(doc.diag((), f"{len(best) - MAX_REPORTED_ERRORS:,} more schema problems in this file (the first "
                                f"{MAX_REPORTED_ERRORS} are listed); fix these and validate again"))
    return out
