"""`moe-oracle diff A B`: every input class whose answer changes between two rule sets.

Both sides are explored over one shared partition (the classes of both rule sets' constants), so a
class is either unchanged everywhere inside it or changed everywhere inside it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .explore import Answer, call_hook, decide, describe, explore, nullable_facts, scenario_of
from .sources import Profiled, Source
from .space import Cls, Space


@dataclass
class Change:
    """One kind of change (same answer before, same answer after) and the classes it covers."""

    profile: str
    policy: str
    before: Answer
    after: Answer
    classes: list[dict[str, Cls]] = field(default_factory=list)

    def title(self) -> str:
        return f"{self.before.short()}  ->  {self.after.short()}"


@dataclass
class PolicyDiff:
    profile: str
    policy: str
    total: int
    changes: list[Change]
    only_in: str = ""  # "A" / "B" when the policy exists on one side only


def diff_policy(a: Profiled, b: Profiled, policy: str, vary: tuple[str, ...] = ()) -> PolicyDiff:
    pa, pb = a.table.policies[policy], b.table.policies[policy]
    space = Space.of([(a.rs, a.table), (b.rs, b.table)], vary)
    nullable = nullable_facts(pa, pb)
    hook_a, hook_b = call_hook(a.table), call_hook(b.table)

    def both(reader: Any) -> tuple[Answer, Answer]:
        return (decide(a.table, pa, reader.ctx(pa, nullable), hook_a),
                decide(b.table, pb, reader.ctx(pb, nullable), hook_b))

    groups: dict[tuple[Any, ...], Change] = {}
    total = 0
    for leaf, (x, y) in explore(space, both):
        total += 1
        if x.key() != y.key():
            k = (x.key(), y.key(), x.at, y.at)
            groups.setdefault(k, Change(a.name, policy, x, y)).classes.append(leaf)
    return PolicyDiff(a.name, policy, total, list(groups.values()))


def pairs(src_a: Source, src_b: Source) -> list[tuple[Profiled, Profiled]]:
    """Profiles compared: the named ones, else every profile both sides define."""
    if len(src_a.profiles) == 1 or len(src_b.profiles) == 1:
        return [(src_a.profiles[src_a.default], src_b.profiles[src_b.default])]
    return [(src_a.profiles[n], src_b.profiles[n]) for n in src_a.profiles if n in src_b.profiles]


def diff_sources(src_a: Source, src_b: Source, policy: str | None = None, vary: tuple[str, ...] = ()
                 ) -> list[PolicyDiff]:
    out: list[PolicyDiff] = []
    for a, b in pairs(src_a, src_b):
        names = [policy] if policy else list(dict.fromkeys([*a.table.policies, *b.table.policies]))
        for name in names:
            if name not in a.table.policies or name not in b.table.policies:
                out.append(PolicyDiff(a.name, name, 0, [], "A" if name in a.table.policies else "B"))
                continue
            out.append(diff_policy(a, b, name, vary))
    return out


def findings(diffs: list[PolicyDiff], src_a: Source, src_b: Source) -> list[dict[str, Any]]:
    """Changes as report findings (one per change group; its location is B's deciding rule)."""
    found: list[dict[str, Any]] = []
    for d in diffs:
        if d.only_in:
            found.append({"rule": "policy-only-in-" + d.only_in, "level": "warning", "at": None,
                          "message": f"profile {d.profile}: policy {d.policy} exists only in "
                                     f"{(src_a if d.only_in == 'A' else src_b).label}"})
        for c in d.changes:
            found.append({
                "rule": "decision-changed", "level": "warning", "at": src_b.where(c.after.at),
                "message": f"profile {d.profile}, policy {d.policy}: {len(c.classes)} input class(es) change "
                           f"{c.title()} (A decided at {src_a.where(c.before.at)}, B at {src_b.where(c.after.at)})",
                "classes": [describe(leaf) for leaf in c.classes],
                "example": scenario_of(c.classes[0], d.policy, d.profile),
            })
    return found


def render_text(diffs: list[PolicyDiff], src_a: Source, src_b: Source, limit: int = 8) -> str:
    lines = [f"diff A={src_a.label}  B={src_b.label}"]
    changed = 0
    for d in diffs:
        if d.only_in:
            lines.append(f"\n{d.profile} / {d.policy}: only in {d.only_in}")
            continue
        n = sum(len(c.classes) for c in d.changes)
        changed += n
        if not n:
            continue
        lines.append(f"\n{d.profile} / {d.policy}: {n} of {d.total} input classes change")
        for c in sorted(d.changes, key=lambda c: -len(c.classes)):
            lines.append(f"  {len(c.classes):>4} x  {c.title()}")
            lines.append(f"         A: step {c.before.step or '-'} at {src_a.where(c.before.at)}")
            lines.append(f"         B: step {c.after.step or '-'} at {src_b.where(c.after.at)}")
            for leaf in c.classes[:limit]:
                lines.append(f"         - {describe(leaf)}")
            if len(c.classes) > limit:
                lines.append(f"         ... and {len(c.classes) - limit} more (--format json lists all)")
    if changed == 0 and not any(d.only_in for d in diffs):
        lines.append("no input class changes its answer")
    return "\n".join(lines)
