"""`moe-oracle test FILES`: golden decision files with coverage (which steps, kernels, backends and outcomes
the cases exercised, and which never), like `opa test --coverage`.

A file is JSONL or YAML: a list (or one per line) of {scenario, expected}; `expected` names only the answer
fields it pins (outcome, backend, kernel, ...). A failing case prints its trace. `--record` rewrites each
case's pinned fields with today's answers and lists what changed, so a deliberate rule edit is one command
plus a reviewed diff.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..api import Oracle
from ..decision import Decision
from ..errors import OracleError
from ..trace import CallEntry, CandidateEntry, StepEntry, render_lines

IGNORED = ("vllm_error",)  # fields of the shared golden sample that describe vLLM, not the answer
RECORDED_BY_DEFAULT = ("outcome", "backend", "kernel")  # what --record pins in a case that pins nothing yet
KINDS = ("steps", "kernels", "backends", "outcomes")


@dataclass
class Coverage:
    """What exists in the profiles the cases used, and what the cases exercised."""

    universe: dict[str, set[str]] = field(default_factory=lambda: {k: set() for k in KINDS})
    hit: dict[str, set[str]] = field(default_factory=lambda: {k: set() for k in KINDS})
    where: dict[str, str] = field(default_factory=dict)

    def percent(self) -> float:
        total = sum(len(v) for v in self.universe.values())
        return 100.0 * sum(len(self.hit[k] & self.universe[k]) for k in KINDS) / total if total else 100.0

    def missed(self) -> dict[str, list[str]]:
        return {k: sorted(self.universe[k] - self.hit[k]) for k in KINDS}


def read_cases(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(file:line, case) pairs; raises OracleError naming the file and line of a malformed case."""
    from ..limits import MAX_GOLDEN_BYTES
    from ..yamlio import load_yaml_text, read_limited

    _, text = read_limited(path, str(path), limit=MAX_GOLDEN_BYTES)
    cases: list[tuple[str, Any]] = []
    if path.suffix == ".jsonl":
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    cases.append((f"{path}:{i}", json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise OracleError(f"{path}:{i}:{exc.colno}: not valid JSON ({exc.msg})") from None
                except (RecursionError, ValueError) as exc:  # nested past the parser's depth, a 4,300-digit int
                    why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:120]
                    raise OracleError(f"{path}:{i}: not readable as JSON ({why})") from None
    else:
        data = load_yaml_text(text, str(path)).data
        items = data.get("cases") if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise OracleError(f"{path}: expected a list of {{scenario, expected}} (or a mapping with 'cases')")
        cases = [(f"{path}:case {i}", c) for i, c in enumerate(items, 1)]
    for where, case in cases:
        if not isinstance(case, dict) or "scenario" not in case or not isinstance(case.get("expected"), dict):
            raise OracleError(f"{where}: a case is a mapping with 'scenario' and 'expected' (a mapping of answer "
                              "fields, e.g. {outcome: selected, backend: MARLIN})")
    return cases


def _walk(entries: Any, cov: Coverage, policy: str) -> None:
    for e in entries:
        if isinstance(e, StepEntry) and e.matched:
            cov.hit["steps"].add(f"{policy}/{e.step}")
        elif isinstance(e, CandidateEntry) and e.accepted:
            cov.hit["kernels"].add(f"{e.candidate}/{e.kernel}")
        elif isinstance(e, CallEntry):
            _walk(e.trace, cov, e.call)


def _universe(oracle: Oracle, profile: str, cov: Coverage) -> None:
    table = oracle.table(profile)
    for pol in table.policies.values():
        for st in pol.steps:
            cov.universe["steps"].add(f"{pol.name}/{st.id}")
            cov.where[f"{pol.name}/{st.id}"] = st.at
    used = {pol.family.name for pol in table.policies.values()}
    for fam in table.families.values():
        if fam.name not in used:
            continue
        for b in fam.backends.values():
            cov.universe["backends"].add(b.value)
            cov.where[b.value] = b.at
            for k in b.kernels:
                cov.universe["kernels"].add(f"{b.name}/{k.name}")
                cov.where[f"{b.name}/{k.name}"] = k.at
    cov.universe["outcomes"] |= {"selected", "none", "invalid", "unsupported"}


def run_cases(oracle: Oracle, files: list[Path]) -> tuple[list[dict[str, Any]], int, Coverage]:
    """Failures (as findings), the number of cases, and the coverage."""
    cov = Coverage()
    failures: list[dict[str, Any]] = []
    profiles: set[str] = set()
    n = 0
    for path in files:
        for where, case in read_cases(path):
            n += 1
            d = oracle.select(case["scenario"])
            got = d.to_dict()
            expected = {k: v for k, v in case["expected"].items() if k not in IGNORED}
            if d.profile:
                profiles.add(d.profile)
            cov.hit["outcomes"].add(d.outcome)
            if d.outcome in ("selected", "none") and d.backend:
                cov.hit["backends"].add(d.backend)
            if d.outcome != "error":
                _walk(d.trace, cov, d.policy or "")
            wrong = {k: (v, got.get(k)) for k, v in expected.items() if got.get(k) != v}
            if wrong:
                failures.append({"rule": "golden-mismatch", "level": "error", "at": where,
                                 "message": _failure_text(d, wrong), "expected": expected,
                                 "got": {k: got.get(k) for k in expected}})
    for p in profiles:
        _universe(oracle, p, cov)
    return failures, n, cov


def _failure_text(d: Decision, wrong: dict[str, tuple[Any, Any]]) -> str:
    parts = [f"{k}: expected {json.dumps(e)}, got {json.dumps(g)}" for k, (e, g) in wrong.items()]
    lines = ["; ".join(parts)]
    if d.decided_by:
        lines.append(f"decided by step '{d.decided_by.step}' at {d.decided_by.at}")
    if d.error:
        lines.append(f"error: {d.error}")
    if d.outcome != "error":
        render_lines(d.trace, lines)
    return "\n".join(lines)


def coverage_text(cov: Coverage, limit: int = 20) -> str:
    lines = [f"coverage {cov.percent():.1f}%"]
    for k in KINDS:
        total = len(cov.universe[k])
        hit = len(cov.hit[k] & cov.universe[k])
        lines.append(f"  {k:<9} {hit}/{total}")
        missed = cov.missed()[k]
        for name in missed[:limit]:
            lines.append(f"    never: {name}" + (f"  ({cov.where[name]})" if name in cov.where else ""))
        if len(missed) > limit:
            lines.append(f"    ... and {len(missed) - limit} more")
    return "\n".join(lines)


def record_cases(oracle: Oracle, path: Path) -> tuple[list[str], int]:
    """Rewrites the file's `expected` fields with the answers the rules give now (the fields each case
    already pins; IGNORED ones kept as they are); returns one line per changed field and the number of cases.
    The file is replaced atomically, and only when something changed."""
    import os
    import tempfile

    import yaml

    cases = read_cases(path)
    changes: list[str] = []
    for where, case in cases:
        got = oracle.select(case["scenario"]).to_dict()
        old = case["expected"]
        fields = [k for k in old if k not in IGNORED] or list(RECORDED_BY_DEFAULT)
        new = {k: (old[k] if k in IGNORED else got.get(k)) for k in [*old, *(f for f in fields if f not in old)]}
        for k in fields:
            if old.get(k, _MISSING) != new[k]:
                before = json.dumps(old[k]) if k in old else "(not pinned)"
                changes.append(f"{where}: {k}: {before} -> {json.dumps(new[k])}")
        case["expected"] = new
    if not changes:
        return changes, len(cases)
    if path.suffix == ".jsonl":
        text = "".join(json.dumps(case) + "\n" for _, case in cases)
    else:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        items = [case for _, case in cases]
        text = yaml.safe_dump({**data, "cases": items} if isinstance(data, dict) else items, sort_keys=False)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return changes, len(cases)


_MISSING = object()
