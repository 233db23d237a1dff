"""Decision logging for servers: one INFO line per distinct decision, and an optional JSON-lines audit log.

A server asks once per MoE layer; the same answer for layer 0 and layer 47 is one line, not 48.
"Distinct" is what an operator reads: who asked (an optional caller label, e.g. the vLLM plugin's
"vLLM's select_mxfp4_moe_backend"), policy, profile and platform -> outcome, backend, kernel, the step
that decided and the override that forced it (sizes and layer numbers are not part of it).
The audit log (`DecisionLog(path)`) gets one JSON object per distinct question answered by each
rules version: time, scenario, decision, and the rule files with the sha256 of the content loaded.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from .decision import Decision
from .model import format_capability
from .scenario import Scenario
from .trace import CallEntry, CandidateEntry, Entry

LOGGER_NAME = "moe_oracle"
logger = logging.getLogger(LOGGER_NAME)


def platform_text(sc: Scenario) -> str:
    """'cuda 9.0', 'rocm gfx950', 'cpu': the platform as an operator reads it."""
    kind = sc.facts.get("platform.kind")
    if kind == "rocm":
        return f"rocm {sc.facts.get('platform.gcn_arch')}"
    if kind == "cuda":
        return f"cuda {format_capability(sc.facts.get('platform.capability'))}"
    return str(kind)


def rejected_short(trace: tuple[Entry, ...] | list[Entry]) -> str:
    """'BACKEND(first failing check)' for every candidate refused, nested calls included, in trace order."""
    last: dict[str, str] = {}

    def walk(entries: tuple[Entry, ...] | list[Entry]) -> None:
        for entry in entries:
            if isinstance(entry, CallEntry):
                walk(entry.trace)
            elif isinstance(entry, CandidateEntry):
                if entry.accepted:
                    last.pop(entry.candidate, None)
                elif entry.failed:
                    last[entry.candidate] = entry.failed[0].check

    walk(trace)
    return ", ".join(f"{backend}({check})" for backend, check in last.items())


def decision_key(sc: Scenario, d: Decision, override: str | None, caller: str | None = None) -> tuple[Any, ...]:
    """What makes two decisions 'the same' for the log: never layer numbers or sizes."""
    by = d.decided_by
    return (caller, d.policy or sc.policy, d.profile or sc.profile, platform_text(sc), d.outcome, d.backend,
            d.kernel, by.at if by is not None else None, override)


def summary_line(sc: Scenario, d: Decision, override: str | None, caller: str | None = None) -> str:
    """The INFO line: (caller:) question -> answer, who decided, what was refused on the way."""
    head = f"{caller + ': ' if caller else ''}{d.policy or sc.policy} [{d.profile or sc.profile or 'default'}] " \
           f"on {platform_text(sc)}"
    if d.outcome == "selected":
        answer = f"{d.backend} (kernel {d.kernel or '-'}, activations {d.activation_key or 'bf16'})"
    elif d.outcome == "none":
        answer = "no fused-MoE backend" + (f" (reports {d.backend})" if d.backend else "")
    else:
        answer = f"{d.outcome}: {d.error}"
    parts = [f"{head} -> {answer}"]
    if d.decided_by is not None:
        parts.append(f"decided by step '{d.decided_by.step}' at {d.decided_by.at}")
    if override is not None:
        parts.append(f"forced by {override}")
    rejected = rejected_short(d.trace) if d.outcome != "error" else ""
    if rejected:
        parts.append(f"rejected {rejected}")
    return "; ".join(parts)


def scenario_dict(sc: Scenario) -> dict[str, Any]:
    """A Scenario as JSON: every fact (capabilities as [major, minor]), env strings and packages present."""
    return {"policy": sc.policy, "profile": sc.profile, "query": sc.query, "backend": sc.backend,
            "facts": {k: list(v) if isinstance(v, tuple) else v for k, v in sc.facts.items()},
            "env": dict(sc.env), "packages": sorted(sc.packages)}


class DecisionLog:
    """INFO once per distinct decision under the `moe_oracle` logger, plus the optional JSON-lines audit file.

    `record` is called on a cache miss only (the store's cached path never reaches it); it takes a
    lock, so two threads answering the same new question still log one line."""

    def __init__(self, audit_path: str | Path | None = None, log: logging.Logger | None = None):
        self.logger = log or logger
        self.audit_path = Path(audit_path) if audit_path is not None else None
        self._seen: set[tuple[Any, ...]] = set()
        self._lock = threading.Lock()
        self._audit: IO[str] | None = None

    def record(self, sc: Scenario, d: Decision, *, override: str | None = None,
               context: Mapping[str, Any] | None = None, rules: Mapping[str, Any] | None = None,
               caller: str | None = None) -> bool:
        """Log `d` if it is new; append the audit line if an audit file is set. True when the INFO line was written.
        `caller`: who asked (a label the line starts with and that keeps callers apart), e.g. a vLLM selector."""
        key = decision_key(sc, d, override, caller)
        with self._lock:
            first = key not in self._seen
            if first:
                self._seen.add(key)
        if first and self.logger.isEnabledFor(logging.INFO):
            self.logger.info("moe-oracle: %s", summary_line(sc, d, override, caller))
        if self.audit_path is not None:
            line = json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "scenario": scenario_dict(sc),
                               "caller": caller, "context": dict(context or {}), "override": override,
                               "decision": d.to_dict(with_trace=False), "rules": dict(rules or {})},
                              sort_keys=False, default=str)
            with self._lock:
                if self._audit is None:
                    self._audit = open(self.audit_path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the process
                self._audit.write(line + "\n")
                self._audit.flush()
        return first

    def forget(self) -> None:
        """Log every decision again once (a new rules version may decide differently)."""
        with self._lock:
            self._seen.clear()

    def close(self) -> None:
        with self._lock:
            if self._audit is not None:
                self._audit.close()
                self._audit = None
