"""Lint baselines: a fork's accepted findings, kept in a file beside its rules instead of in vendored rule files.

A baseline is YAML (or JSON) `{findings: [{rule, message, reason}]}`. A finding matches an entry by its rule
and its message without the profile prefix (names of backends, steps and env vars, never line numbers, so
an edit elsewhere in the file does not invalidate the baseline). `lint --write-baseline FILE` writes one.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import OracleError
from .lint import RULES

Finding = dict[str, Any]
HEADER = ("# moe-oracle lint baseline: findings accepted as they are (`moe-oracle lint --baseline FILE`).\n"
          "# Each entry matches a finding by rule and message; give every entry the reason it is intended.\n")


def core(message: str) -> str:
    """A finding's message without its `profile(s) NAMES: ` prefix (the same finding in every profile)."""
    head, sep, rest = message.partition(": ")
    return rest if sep and head.startswith("profile") else message


def read_baseline(path: Path) -> dict[tuple[str, str], str]:
    """(rule, message) -> reason; OracleError naming the file and entry of anything malformed."""
    import yaml

    from ..yamlio import read_limited

    try:
        data = yaml.safe_load(read_limited(path, str(path))[1])
    except OSError as exc:
        raise OracleError(f"--baseline {path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise OracleError(f"{path}{where}: not valid YAML or JSON ({getattr(exc, 'problem', exc)})") from None
    items = data.get("findings") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise OracleError(f"{path}: a lint baseline is a mapping with 'findings', a list of {{rule, message, "
                          "reason}}; write one with `moe-oracle lint --write-baseline FILE`")
    out: dict[tuple[str, str], str] = {}
    for i, item in enumerate(items, 1):
        ok = isinstance(item, dict) and set(item) == {"rule", "message", "reason"} and all(
            isinstance(item[k], str) and item[k].strip() for k in item)
        if not ok:
            raise OracleError(f"{path}: findings entry {i}: expected exactly rule, message and reason, each a "
                              f"non-empty string (got {item!r})")
        if item["rule"] not in RULES:
            raise OracleError(f"{path}: findings entry {i}: unknown lint rule {item['rule']!r}; one of "
                              f"{', '.join(RULES)}")
        out[(item["rule"], core(item["message"]))] = item["reason"]
    return out


def apply_baseline(findings: list[Finding], baseline: dict[tuple[str, str], str], path: Path) -> list[str]:
    """Marks the findings the baseline accepts as acknowledged; returns the entries that matched nothing."""
    used: set[tuple[str, str]] = set()
    for f in findings:
        key = (f["rule"], core(f["message"]))
        if key in baseline and "acknowledged" not in f:
            f["acknowledged"] = f"baseline {path}: {baseline[key]}"
            used.add(key)
        elif key in baseline:
            used.add(key)
    return [f"{path}: baseline entry [{rule}] {message!r} matches no finding any more; remove it"
            for rule, message in baseline if (rule, message) not in used]


def baseline_text(findings: list[Finding]) -> str:
    """A baseline accepting every finding not acknowledged already (JSON strings: valid YAML)."""
    import json

    lines = [HEADER.rstrip("\n"), "findings:"]
    seen: set[tuple[str, str]] = set()
    for f in findings:
        key = (f["rule"], core(f["message"]))
        if "acknowledged" in f or key in seen:
            continue
        seen.add(key)
        lines += [f"  - rule: {f['rule']}", f"    message: {json.dumps(key[1])}",
                  f"    reason: {json.dumps('accepted as is at ' + str(f.get('at')) + '; say why it is intended')}"]
    if not seen:
        lines[-1] = "findings: []"
    return "\n".join(lines) + "\n"
