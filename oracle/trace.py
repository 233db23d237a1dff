"""Typed trace entries: what explain, JSON output and `unsupported` summaries render from.

Each entry is a small immutable record (a NamedTuple: cheap to build) with `to_dict()` (the JSON
contract of decision.schema.json) and `from_dict()`; renderers dispatch on the type, never on
which keys a dict happens to have.
"""
from __future__ import annotations

from typing import Any, NamedTuple


class Leaf(NamedTuple):
    """One false leaf of a failed check: as written, what it expects, the actual value and where it is written.

    `via`: the derived facts it was reached through (`cuda_sm10x`); `text`: the sentence explain prints,
    e.g. `platform.capability 9.0 is not in family 10.x`."""

    leaf: str
    expected: str
    actual: str
    at: str
    via: tuple[str, ...]
    text: str

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"leaf": self.leaf, "expected": self.expected, "actual": self.actual, "at": self.at}
        if self.via:
            out["via"] = list(self.via)
        out["text"] = self.text
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Leaf:
        return cls(d["leaf"], d["expected"], d["actual"], d["at"], tuple(d.get("via") or ()), d["text"])


class Failure(NamedTuple):
    """One failing kernel check: its name, vLLM's reason, the condition it needed, and each false leaf."""

    check: str
    reason: str
    condition: str
    leaves: tuple[Leaf, ...] = ()

    @property
    def headline(self) -> str:
        """The failing leaves in one line (vLLM's generic reason when there are none, e.g. an env parse error)."""
        return "; ".join(dict.fromkeys(leaf.text for leaf in self.leaves)) or self.reason

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"check": self.check, "reason": self.reason, "condition": self.condition}
        if self.leaves:
            out["leaves"] = [leaf.to_dict() for leaf in self.leaves]
        return out


class StepEntry(NamedTuple):
    """A policy step was reached; `matched` says whether its `when` held; `no_op` why a matched step that
    edits the candidate list left it as it was (so explain never shows it as applied)."""

    step: str
    matched: bool
    at: str
    why: str
    when: str | None = None
    no_op: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "matched": self.matched}
        if self.when is not None:
            out["when"] = self.when
        if self.no_op is not None:
            out["no_op"] = self.no_op
        out.update(at=self.at, why=self.why)
        return out


class CandidateEntry(NamedTuple):
    """One kernel of a backend was checked (or taken unchecked) by a step."""

    candidate: str
    kernel: str | None
    accepted: bool
    failed: tuple[Failure, ...]
    step: str
    at: str
    unchecked: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"candidate": self.candidate, "kernel": self.kernel, "accepted": self.accepted,
                               "failed": [f.to_dict() for f in self.failed], "step": self.step}
        if self.unchecked:
            out["unchecked"] = True
        out["at"] = self.at
        return out


class CallEntry(NamedTuple):
    """A `call` step ran another policy; its own trace is nested."""

    step: str
    call: str
    outcome: str
    trace: tuple[Entry, ...]
    at: str

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "call": self.call, "outcome": self.outcome,
                "trace": [e.to_dict() for e in self.trace], "at": self.at}


class ErrorEntry(NamedTuple):
    """The question could not be traced to the end (an env value that does not parse)."""

    error: str

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.error}


Entry = StepEntry | CandidateEntry | CallEntry | ErrorEntry


def from_dict(d: dict[str, Any]) -> Entry:
    """The typed entry of one JSON trace item (the inverse of `to_dict`)."""
    if "candidate" in d:
        return CandidateEntry(d["candidate"], d.get("kernel"), d["accepted"],
                              tuple(Failure(f["check"], f["reason"], f["condition"],
                                            tuple(Leaf.from_dict(x) for x in f.get("leaves") or ()))
                                    for f in d.get("failed", ())),
                              d.get("step", ""), d.get("at", ""), d.get("unchecked", False))
    if "call" in d:
        return CallEntry(d.get("step", ""), d["call"], d.get("outcome", ""),
                         tuple(from_dict(e) for e in d.get("trace") or ()), d.get("at", ""))
    if "error" in d:
        return ErrorEntry(d["error"])
    return StepEntry(d["step"], d["matched"], d.get("at", ""), d.get("why", ""), d.get("when"), d.get("no_op"))


def candidate_summary(trace: tuple[Entry, ...] | list[Entry]) -> str:
    """'BACKEND: its last kernel's failing leaves, comma-separated; ...' over every candidate tried (calls included)."""
    last: dict[str, str] = {}
    for entry in trace:
        if isinstance(entry, CallEntry):
            nested = candidate_summary(entry.trace)
            if nested:
                last[f"{entry.call} ->"] = nested
        elif isinstance(entry, CandidateEntry) and not entry.accepted and entry.failed:
            texts = [leaf.text for f in entry.failed for leaf in f.leaves] or [f.reason for f in entry.failed]
            last[entry.candidate] = ", ".join(dict.fromkeys(texts))
    return "; ".join(f"{b}: {r}" for b, r in last.items())


def _where(leaf: Leaf) -> str:
    return (f"via {' -> '.join(leaf.via)}, " if leaf.via else "") + leaf.at


def render_lines(trace: tuple[Entry, ...] | list[Entry], lines: list[str], indent: str = "") -> None:
    """Explain's text form of a trace, appended to `lines`."""
    for entry in trace:
        if isinstance(entry, CandidateEntry):
            verdict = "taken unchecked" if entry.unchecked else "ACCEPTED" if entry.accepted else "rejected"
            lines.append(f"{indent}    {verdict:<16}{entry.candidate} / {entry.kernel}   ({entry.at})")
            for f in entry.failed:
                where = f"   ({_where(f.leaves[0])})" if len(f.leaves) == 1 else ""
                lines.append(f"{indent}        x {f.check}: {f.headline}{where}")
                for leaf in f.leaves if len(f.leaves) > 1 else ():
                    lines.append(f"{indent}            - {leaf.text}   ({_where(leaf)})")
                if f.leaves:
                    lines.append(f"{indent}          vLLM reason: {f.reason}")
                lines.append(f"{indent}          needs {f.condition}")
        elif isinstance(entry, CallEntry):
            lines.append(f"{indent}  step {entry.step}: calls policy {entry.call} -> {entry.outcome}   ({entry.at})")
            render_lines(entry.trace, lines, indent + "    ")
        elif isinstance(entry, ErrorEntry):
            lines.append(f"{indent}  error: {entry.error}")
        else:
            mark = "-" if not entry.matched else "~" if entry.no_op else "*"
            cond = f" when {entry.when}" if entry.when is not None else ""
            lines.append(f"{indent}  {mark} step {entry.step}{cond}   ({entry.at})")
            if entry.no_op:
                lines.append(f"{indent}      matched, but changed nothing: {entry.no_op}")
