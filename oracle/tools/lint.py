"""`moe-oracle lint`: what the rules do over the whole input space, not what they look like.

Every policy runs on every leaf of the exhaustive class partition (space.py) with its steps
instrumented, then: backends no input reaches, kernel alternatives never chosen, steps never reached
or never/always matching, `error` answers (a policy that ends without deciding), env vars no decision
reads, and derived facts that are constant over the space. Each finding carries the rule's file:line.

A finding that is true and intended (vLLM's own enum member no selector returns) is acknowledged next to
the rule, `lint_allow: {RULE: reason}` on the backend, step, policy, env var or derived fact it is about,
or in a baseline file (`lint --baseline`); acknowledged findings are reported as such and never fail.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from ..compiler import Compiler
from ..errors import EnvValueError
from ..interpreter import run
from ..loader import Entry, RuleSet
from ..model import Ctx, Policy, Step, Table
from .explore import call_hook, describe, explore, fixed_facts, nullable_facts, scenario_of
from .refine import Coarse, Refiner, explore_coarse
from .sources import Profiled, Source
from .space import Space, members

Finding = dict[str, Any]


class _Counts:
    def __init__(self) -> None:
        self.reached: Counter[tuple[str, str]] = Counter()
        self.matched: Counter[tuple[str, str]] = Counter()
        self.run_reached: set[tuple[str, str]] = set()
        self.run_matched: set[tuple[str, str]] = set()

    def end_run(self) -> None:
        self.reached.update(self.run_reached)
        self.matched.update(self.run_matched)
        self.run_reached, self.run_matched = set(), set()


def _instrument(table: Table, counts: _Counts) -> Table:
    """A copy of the table whose step tests record, per run, which steps were reached and matched."""
    def wrap(policy: Policy, step: Step) -> Step:
        key = (policy.name, step.id)
        test = step.test

        def recorded(ctx: Ctx) -> bool:
            counts.run_reached.add(key)
            ok = True if test is None else bool(test(ctx))
            if ok:
                counts.run_matched.add(key)
            return ok
        return replace(step, test=recorded)

    policies = {n: replace(p, steps=tuple(wrap(p, s) for s in p.steps)) for n, p in table.policies.items()}
    return replace(table, policies=MappingProxyType(policies))


def lint_profile(p: Profiled, vary: tuple[str, ...] = ()) -> list[Finding]:
    table, rs = p.table, p.rs
    space = Space.of([(rs, table)], vary)
    counts = _Counts()
    coarse = Coarse(table)
    inst = _instrument(coarse.table, counts)
    hook = call_hook(inst)
    selected: set[tuple[str, str]] = set()  # (family, backend name)
    kernels_chosen: set[int] = set()
    errors: dict[tuple[str, str], list[Any]] = {}
    leaves = 0
    for name in table.policies:
        policy = inst.policies[name]
        nullable = nullable_facts(policy)
        fixed = fixed_facts(space, policy)

        def one(r: Refiner, policy: Policy = policy, nullable: frozenset[str] = nullable,
                fixed: dict[str, Any] = fixed) -> Any:
            try:
                res = run(policy, coarse.ctx(r, nullable, fixed), None, hook)
            except EnvValueError:
                res = None
            counts.end_run()
            return res

        for refiner, res in explore_coarse(space, coarse, one):
            leaves += 1
            if res is None:
                continue
            if res.outcome == "selected" and res.backend is not None and res.family is not None:
                selected.add((res.family.name, res.backend.name))
                if res.kernel is not None:
                    kernels_chosen.add(id(coarse.kernel_of.get(id(res.kernel), res.kernel)))
            elif res.outcome == "error":
                errors.setdefault((name, str(res.error)), []).append(refiner.leaf())
    found: list[Finding] = []
    used = {pol.family.name for pol in table.policies.values()}
    for fam in table.families.values():
        if fam.name not in used:
            continue
        for b in fam.backends.values():
            allow = _allows(rs.sections["families"][fam.name], "backends", b.name)
            if (fam.name, b.name) not in selected:
                found.append(_f("unreachable-backend", b.at, f"profile {p.name}: backend {b.name} of family "
                                f"{fam.name} is selected by no input (no policy, env var or moe_backend reaches it)",
                                allow))
                continue
            for kernels in (b.kernels, b.explicit_kernels or ()):
                for k in kernels[1:]:
                    if id(k) not in kernels_chosen:
                        found.append(_f("shadowed-kernel", k.at, f"profile {p.name}: kernel alternative {k.name} of "
                                        f"backend {b.name} is never chosen: an earlier alternative accepts every "
                                        "input it accepts", allow))
    recheck = {(pol.name, st.id) for pol in table.policies.values() for i, st in enumerate(pol.steps)
               if st.when is not None and counts.reached[(pol.name, st.id)] and (
                   counts.matched[(pol.name, st.id)] in (0, counts.reached[(pol.name, st.id)]))}
    if recheck:
        _recheck_linked(p, vary, recheck, counts)
    for pol in table.policies.values():
        last = len(pol.steps) - 1
        raw_steps = rs.sections["policies"][pol.name].data.get("steps") or []
        for i, st in enumerate(pol.steps):
            key = (pol.name, st.id)
            r, m = counts.reached[key], counts.matched[key]
            allow = _allows(rs.sections["policies"][pol.name], "steps", i) if i < len(raw_steps) else {}
            if r == 0:
                found.append(_f("unreachable-step", st.at, f"profile {p.name}: step '{st.id}' of policy {pol.name} "
                                "is never reached: earlier steps decide every input", allow))
            elif st.when is not None and m == 0:
                found.append(_f("always-false", st.at, f"profile {p.name}: the condition of step '{st.id}' "
                                f"({st.when.text}) is false for every input that reaches it", allow))
            elif st.when is not None and m == r and i < last and st.action in _DECIDING:
                found.append(_f("always-true", st.at, f"profile {p.name}: the condition of step '{st.id}' "
                                f"({st.when.text}) is true for every input that reaches it; the steps after it "
                                "never run", allow))
    for (pol_name, message), err_leaves in errors.items():
        pol = table.policies[pol_name]
        platforms = sorted({m for leaf in err_leaves if "platform" in leaf for m in members(leaf["platform"].label)})
        found.append(_f("undeclared-error", pol.at, f"profile {p.name}: policy {pol_name} answers error for "
                        f"{len(err_leaves)} input class(es) (platforms: {', '.join(platforms) or 'any'}): {message}; "
                        f"e.g. {describe(err_leaves[0])}", _allows(rs.sections["policies"][pol_name]),
                        example=scenario_of(err_leaves[0], pol_name, p.name)))
    env_read = {v[4:] for v in coarse.read if v.startswith("env:")}
    for name, e in rs.sections["env_vars"].items():
        if name not in env_read:
            found.append(_f("unused-env-var", e.at(), f"profile {p.name}: env var {name} is declared but no "
                            "decision of any policy reads it", _allows(e)))
    found.extend(_derived_constants(p, space))
    for f in found:
        f["leaves"] = leaves
    return found


_DECIDING = ("outcome", "use", "use_explicit", "result")


class _Stop(Exception):
    """Ends a run once the steps being rechecked have been tested."""


def _recheck_linked(p: Profiled, vary: tuple[str, ...], steps: set[tuple[str, str]], counts: _Counts) -> None:
    """Counts again, over a space that also splits the facts conditions compare with each other (`same_as`,
    `differs_from`), how often the steps whose condition looked constant are reached and matched. Kept at
    their defaults two such facts never differ, so a condition on their difference would look always false;
    splitting them everywhere multiplies the whole exploration, so each run stops after the last such step."""
    space = Space.of([(p.rs, p.table)], vary, vary_linked=True)
    if not space.c.linked:
        return
    coarse = Coarse(p.table)
    again = _Counts()
    last = {name: max(i for i, st in enumerate(pol.steps) if (name, st.id) in steps)
            for name, pol in p.table.policies.items() if any((name, st.id) in steps for st in pol.steps)}

    def wrap(policy: Policy, step: Step, stop: bool) -> Step:
        key, test = (policy.name, step.id), step.test

        def recorded(ctx: Ctx) -> bool:
            again.run_reached.add(key)
            ok = True if test is None else bool(test(ctx))
            if ok:
                again.run_matched.add(key)
            if stop:
                raise _Stop
            return ok
        return replace(step, test=recorded)

    policies = {n: replace(pol, steps=tuple(wrap(pol, s, n in last and i == last[n]) for i, s in enumerate(pol.steps)))
                for n, pol in coarse.table.policies.items()}
    inst = replace(coarse.table, policies=MappingProxyType(policies))
    hook = call_hook(inst)
    for name in last:
        policy = inst.policies[name]
        nullable, fixed = nullable_facts(policy), fixed_facts(space, policy)

        def one(r: Refiner, policy: Policy = policy, nullable: frozenset[str] = nullable,
                fixed: dict[str, Any] = fixed) -> Any:
            try:
                run(policy, coarse.ctx(r, nullable, fixed), None, hook)
            except (EnvValueError, _Stop):
                pass
            again.end_run()
            return None

        for _ in explore_coarse(space, coarse, one):
            pass
    for key in steps:
        counts.reached[key], counts.matched[key] = again.reached[key], again.matched[key]


def _derived_constants(p: Profiled, space: Space) -> list[Finding]:
    """Derived facts that hold for every input, or for none (evaluated alone over the space)."""
    c = Compiler(p.rs)
    policy = next(iter(p.table.policies.values()), None)
    if policy is None:
        return []
    nullable = nullable_facts(policy)
    out = []
    for name, entry in p.rs.sections["derived"].items():
        fn = c.derived(name).fn

        def one(reader: Any, fn: Any = fn) -> Any:
            try:
                return bool(fn(reader.ctx(policy, nullable)))
            except EnvValueError:
                return None
        values = {v for _, v in explore(space, one)} - {None}
        if len(values) == 1:
            word = "true" if values.pop() else "false"
            out.append(_f("always-" + word, entry.at(), f"profile {p.name}: derived fact {name} is {word} "
                          "for every input", _allows(entry)))
    return out


#: every lint rule with its level: `error` where the rules are wrong for some input (a policy that ends without
#: deciding), `warning` where they are dead or redundant. schemas/rules.schema.json's `$defs.lint_allow` lists
#: the same ids (a test keeps them equal).
LEVELS = {"unreachable-backend": "warning", "shadowed-kernel": "warning", "unreachable-step": "warning",
          "always-false": "warning", "always-true": "warning", "undeclared-error": "error",
          "unused-env-var": "warning"}


#: every rule lint_source reports: LEVELS, and an acknowledgement that acknowledges nothing (a warning)
RULES = (*LEVELS, "unused-acknowledgement")
Allows = dict[str, tuple[str, str]]  # lint rule -> (reason, file:line of the acknowledgement)


def _allows(entry: Entry, *sub: Any) -> Allows:
    """The `lint_allow` of a rule entry (or of the item at `sub` inside it: a backend, a step)."""
    data = entry.data
    for key in sub:
        data = data.get(key) if isinstance(data, dict) else data[key] if isinstance(data, list) else None
    found = data.get("lint_allow") if isinstance(data, dict) else None
    if not isinstance(found, dict):
        return {}
    return {rule: (str(reason), entry.at(*sub, "lint_allow", rule)) for rule, reason in found.items()}


def _declared_allows(rs: RuleSet) -> dict[str, str]:
    """Every acknowledgement of a rule set: its file:line -> the lint rule it names."""
    s = rs.sections
    found: list[Allows] = [_allows(e) for sec in ("env_vars", "derived", "policies") for e in s[sec].values()]
    for fam in s["families"].values():
        found += [_allows(fam, "backends", b) for b in fam.data.get("backends") or {}]
    for pol in s["policies"].values():
        found += [_allows(pol, "steps", i) for i in range(len(pol.data.get("steps") or []))]
    return {where: rule for allows in found for rule, (_, where) in allows.items()}


def _f(rule: str, at: str, message: str, allow: Allows | None = None, **extra: Any) -> Finding:
    out: Finding = {"rule": rule, "level": LEVELS[rule], "at": at, "message": message, **extra}
    reason, where = (allow or {}).get(rule, ("", ""))
    if reason:
        out["acknowledged"] = f"lint_allow at {where}: {reason}"
        out["allowed_by"] = where
    return out


def lint_source(src: Source, vary: tuple[str, ...] = (), unused_allows: bool = False) -> list[Finding]:
    """Findings of every profile, each reported once (a shared file's entry is linted per profile;
    the same message at the same place from two profiles is merged). `unused_allows` (when `src` holds every
    profile of its directory): also an acknowledgement that acknowledges nothing in any profile."""
    seen: dict[tuple[str, str, str], Finding] = {}
    declared: dict[str, str] = {}
    for p in src.profiles.values():
        declared.update(_declared_allows(p.rs))
        for f in lint_profile(p, vary):
            key = (f["rule"], f["at"], f["message"].split(": ", 1)[-1])
            if key in seen:
                seen[key]["message"] = seen[key]["message"].replace("profile ", "profiles ", 1).replace(
                    ":", f", {p.name}:", 1) if p.name not in seen[key]["message"] else seen[key]["message"]
            else:
                seen[key] = f
    if unused_allows:
        used = {f.get("allowed_by") for f in seen.values()}
        for where, rule in declared.items():
            if where not in used:
                f = {"rule": "unused-acknowledgement", "level": "warning", "at": where, "message":
                     f"lint_allow names {rule}, but no profile has that finding here any more; remove it"}
                seen[("unused-acknowledgement", where, "")] = f
    return sorted(seen.values(), key=lambda f: (str(f["at"]), f["rule"]))
