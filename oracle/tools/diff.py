"""`moe-oracle diff A B`: every input class whose answer changes between two rule sets.

Both sides are explored over one shared partition (the classes of both rule sets' constants), so a
class is either unchanged everywhere inside it or changed everywhere inside it.

Reading order: changes through a rule the edit touched (decided by a changed step or by a `try: candidates`
step of a reordered candidate list; to or from a backend or kernel whose definition changed; a new round_up
alignment where the family's rows changed) come first, those reached only through an env var the edit
declared (all their classes set it) after the others of their kind; classes of one change that differ only
by the value of such a new env var are shown as one (its values joined with `|`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .explore import Answer, call_hook, decide, describe, explore, nullable_facts, scenario_of
from .fingerprint import profile_hash
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
    edited: bool = False  # decided, on either side, by a step the edit touched
    through_new_env: bool = False  # every class sets an env var only B declares (not to its default)
    explored: int = 0  # classes before those differing only by a new env var's value were merged

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
    new_env = {"env:" + n for n in b.rs.sections["env_vars"]} - {"env:" + n for n in a.rs.sections["env_vars"]}
    edited_a, edited_b = edited_steps(a, b, policy)
    backends, kernels, round_up = edited_entries(a, b, pb.family.name)
    changes = list(groups.values())
    for c in changes:
        c.explored = len(c.classes)
        c.classes = collapse(c.classes, new_env, b)
        through_new = bool(new_env) and all(any(var in new_env and not _is_default(var, cl, b) for var, cl in
                                                leaf.items()) for leaf in c.classes)
        c.edited = (c.before.at in edited_a or c.after.at in edited_b
                    or bool({c.before.backend, c.after.backend} & backends)
                    or bool({c.before.kernel, c.after.kernel} & kernels)
                    or (round_up and (c.before.align_hidden, c.before.align_intermediate)
                        != (c.after.align_hidden, c.after.align_intermediate)))
        c.through_new_env = through_new
    changes.sort(key=lambda c: (not c.edited, c.through_new_env, -len(c.classes)))
    return PolicyDiff(a.name, policy, total, changes)


def edited_steps(a: Profiled, b: Profiled, policy: str) -> tuple[set[str], set[str]]:
    """Locations of the policy's steps that differ between the sides (changed, added or removed; matched by
    id), A's and B's: a change decided at one of them is the edit's own."""
    def steps(p: Profiled) -> dict[str, tuple[Any, str]]:
        entry = p.rs.sections["policies"].get(policy)
        raw = (entry.data.get("steps") or []) if entry is not None else []
        return {str(s.get("id")): (s, entry.at("steps", i)) for i, s in enumerate(raw)
                if isinstance(s, dict) and entry is not None}

    def candidates(p: Profiled) -> Any:
        entry = p.rs.sections["policies"].get(policy)
        return entry.data.get("candidates") if entry is not None else None

    sa, sb = steps(a), steps(b)
    reordered = candidates(a) != candidates(b)  # then every `try: candidates` step decides differently

    def edited(mine: dict[str, tuple[Any, str]], other: dict[str, tuple[Any, str]]) -> set[str]:
        return {at for sid, (s, at) in mine.items()
                if other.get(sid, (None,))[0] != s or (reordered and s.get("try") == "candidates")}
    return edited(sa, sb), edited(sb, sa)


def edited_entries(a: Profiled, b: Profiled, family: str) -> tuple[set[str], set[str], bool]:
    """What else the edit touched that an answer names: backends of the family (by enum value) and kernels
    (by name) whose definition differs between the sides, and whether the family's round_up rows differ."""
    def data(p: Profiled, section: str, name: str) -> Any:
        entry = p.rs.sections[section].get(name)
        return entry.data if entry is not None else None

    fa, fb = data(a, "families", family) or {}, data(b, "families", family) or {}
    ba, bb = fa.get("backends") or {}, fb.get("backends") or {}
    backends = {str((bb.get(n) or ba.get(n) or {}).get("value", n)) for n in {*ba, *bb} if ba.get(n) != bb.get(n)}
    names = {*a.rs.sections["kernels"], *b.rs.sections["kernels"]}
    kernels = {n for n in names if data(a, "kernels", n) != data(b, "kernels", n)}
    return backends, kernels, fa.get("round_up") != fb.get("round_up")


def _is_default(var: str, cl: Cls, b: Profiled) -> bool:
    """Whether an env var's class is its unset/default value."""
    entry = b.rs.sections["env_vars"].get(var[4:])
    return cl.value is None or (entry is not None and cl.value == entry.data.get("default"))


def collapse(classes: list[dict[str, Cls]], new_env: set[str], b: Profiled) -> list[dict[str, Cls]]:
    """Classes that are equal but for the value of an env var only B declares, merged into one whose class
    of that variable lists the values (`|`); others kept as they are, in order."""
    if not new_env:
        return classes
    merged: dict[tuple[Any, ...], dict[str, Cls]] = {}
    for leaf in classes:
        rest = tuple((var, cl.label) for var, cl in leaf.items() if var not in new_env)
        key = (rest, tuple(sorted(var for var in leaf if var in new_env)))
        found = merged.get(key)
        if found is None:
            merged[key] = dict(leaf)
            continue
        for var in key[1]:
            prefix = var[4:] + "="
            labels = found[var].label.removeprefix(prefix).split("|")
            label = leaf[var].label.removeprefix(prefix)
            if label not in labels:
                found[var] = Cls(prefix + "|".join([*labels, label]), found[var].value)
    return list(merged.values())


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
        same = profile_hash(a) == profile_hash(b)  # identical rule files: nothing to explore
        for name in names:
            if name not in a.table.policies or name not in b.table.policies:
                out.append(PolicyDiff(a.name, name, 0, [], "A" if name in a.table.policies else "B"))
                continue
            out.append(PolicyDiff(a.name, name, 0, []) if same else diff_policy(a, b, name, vary))
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
                "rule": "decision-changed", "level": "warning", "at": src_b.where(c.after.at) if c.after.at else None,
                "edited_rules": c.edited, "only_through_new_env_var": c.through_new_env,
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
        n = sum(c.explored for c in d.changes)
        changed += n
        if not n:
            continue
        lines.append(f"\n{d.profile} / {d.policy}: {n} of {d.total} input classes change")
        for c in d.changes:
            merged = f" ({c.explored} before merging values of new env vars)" if c.explored != len(c.classes) else ""
            tag = ("  [edited rules]" if c.edited else "") + ("  [new env var]" if c.through_new_env else "")
            lines.append(f"  {len(c.classes):>4} x  {c.title()}{tag}{merged}")
            lines.append(f"         A: step {c.before.step or '-'} at {src_a.where(c.before.at)}")
            lines.append(f"         B: step {c.after.step or '-'} at {src_b.where(c.after.at)}")
            for leaf in c.classes[:limit]:
                lines.append(f"         - {describe(leaf)}")
            if len(c.classes) > limit:
                lines.append(f"         ... and {len(c.classes) - limit} more (--format json lists all)")
    if changed == 0 and not any(d.only_in for d in diffs):
        lines.append("no input class changes its answer")
    return "\n".join(lines)
