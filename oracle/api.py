"""The public selection API: Oracle (rules loaded once, one swappable snapshot), select().

    rules/*.yaml -> yamlio -> schema -> loader -> semantics -> compiler/kernels/tables -> Table (snapshot)
    scenario -> parse_scenario -> Scenario -> interpreter.run(Table) -> Decision (frozen)

Everything one version of the rules answers with (profile index, compiled tables, cached
answers) lives in one Snapshot (oracle.snapshot); `reload()` builds a new one and swaps the
reference, so a question is always answered from one consistent version.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .decision import OUTCOMES, Decision, error_decision, with_warnings
from .errors import EnvValueError, OracleError, RuleError, ScenarioError, did_you_mean
from .interpreter import UNSET, CallPolicy, Result, Trace, map_explicit, round_sizes, run, step_chain
from .loader import FileCache, ProfileIndex, load_profile_index
from .model import Ctx, Family, Fn, Policy, RoundRow, Table, format_capability
from .prepared import PreparedScenario, freeze, thaw
from .resources import rules_dir
from .scenario import Scenario, parse_scenario
from .snapshot import Snapshot, build_table, check_profile, rules_problems
from .trace import Entry, ErrorEntry, candidate_summary

PolicyRewrite = Callable[[Policy], Policy]  # hashable; e.g. oracle.overrides.Override
Plan = tuple[Table, Policy, CallPolicy, "Fn | None"]  # what answers a question: table, policy, call hook, step_chain



class Oracle:
    """Rule tables of one rules directory, compiled once per profile and shared across threads."""

    CACHE_SIZE = 4096

    def __init__(self, rules: str | Path | None = None, index: ProfileIndex | None = None,
                 files: FileCache | None = None, reuse: Snapshot | None = None):
        """`index`: a profile index built elsewhere (oracle.plugins adds plugin files to profiles); reload()
        reads `rules` again. `files`: parsed rule files to start from. `reuse`: a previous snapshot whose parsed
        files, validated profiles and compiled tables are reused where every file's content is unchanged
        (oracle.store passes the generation it replaces)."""
        self.root = Path(rules) if rules is not None else rules_dir()
        self._lock = threading.Lock()
        index = index if index is not None else load_profile_index(self.root)
        self._snapshot = Snapshot.start(index, files, reuse).check()

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def reload(self) -> None:
        """Re-read the rules directory; profiles compiled before are compiled again before the swap (reused when
        their files did not change), so broken rules raise RuleError here and the previous snapshot stays in use."""
        fresh = Snapshot.start(load_profile_index(self.root), reuse=self._snapshot).check()
        for name in self._snapshot.tables:
            if name in fresh.index.profiles:
                self._compile(fresh, name)
        self._snapshot = fresh

    # ---------------------------------------------------------------- tables
    @property
    def index(self) -> ProfileIndex:
        return self._snapshot.index

    @property
    def default_profile(self) -> str:
        return self._snapshot.index.default

    def profiles(self) -> dict[str, str]:
        return {name: p.description for name, p in self._snapshot.index.profiles.items()}

    def table(self, profile: str | None = None) -> Table:
        snap = self._snapshot
        return snap.tables.get(profile or snap.index.default) or self._compile(snap, profile or snap.index.default)

    def _compile(self, snap: Snapshot, name: str) -> Table:
        found = snap.index.profiles.get(name)
        if found is None:
            raise ScenarioError(f"profile: unknown profile {name!r}{did_you_mean(name, snap.index.profiles)}; "
                                f"known: {', '.join(snap.index.profiles)}")
        key, table = snap.compile(name)
        with self._lock:
            if key is not None:
                table = snap.compiled.setdefault(key, table)
            return snap.tables.setdefault(name, table)

    def compile_all(self) -> None:
        for name in self._snapshot.index.profiles:
            self.table(name)

    # ---------------------------------------------------------------- questions
    def prepare(self, raw: Mapping[str, Any], default_platform: Mapping[str, Any] | None = None,
                strict: bool = False) -> Scenario:
        """Validate and freeze a scenario mapping (raises ScenarioError; with `strict`, also for what would
        only be a warning, such as an env var that looks like a declared one).

        The Scenario remembers the question, so after `reload()` it is answered exactly as the same mapping
        would be: what the rules supplied (fact defaults, declared env vars) is resolved again against the rules
        serving then, never mixed with the version it was prepared under."""
        sc = self.scenario(raw, default_platform, strict)
        options = (freeze(default_platform) if default_platform is not None else None, strict)
        return PreparedScenario.of(sc, raw, self._snapshot, options)

    def scenario(self, raw: Mapping[str, Any], default_platform: Mapping[str, Any] | None = None,
                 strict: bool = False) -> Scenario:
        """`prepare` for one use now: the Scenario does not remember its question (nothing to re-resolve)."""
        profile = raw.get("profile") if isinstance(raw, Mapping) else None
        table = self.table(profile if isinstance(profile, str) else None)
        return parse_scenario(raw, table, default_platform, strict)

    def _current(self, prepared: PreparedScenario) -> Scenario:
        """A prepared question resolved against the serving snapshot (cached in the question per snapshot)."""
        snap = self._snapshot
        pair = prepared[11][0]
        if pair[0] is snap:
            return pair[1]  # type: ignore[no-any-return]
        frozen_platform, strict = prepared.options or (None, False)
        default_platform = thaw(frozen_platform) if frozen_platform is not None else None
        sc = self.scenario(prepared.question(), default_platform, strict)
        prepared[11][0] = (snap, sc)
        return sc

    def select(self, scenario: Scenario | Mapping[str, Any], rewrite: PolicyRewrite | None = None,
               strict: bool = False) -> Decision:
        """Answer one question. Never raises for bad input: that is outcome 'error'.

        `rewrite`: a deployment's change of the question's policy (oracle.overrides), part of the cache key.
        `strict`: a warning about the question (a look-alike env var) is answered `error` instead.
        The snapshot is read once, so the answer and its cache entry come from one version of the rules.
        Anything unforeseen (a bug, a Python limit) is an `error` answer too, naming the exception."""
        try:
            return self._select(scenario, rewrite, strict)
        except OracleError as exc:  # e.g. the rules of the profile a question names are broken
            return error_decision(str(exc))
        except Exception as exc:  # never raise: a server calls this per request
            return error_decision(internal_error(exc))

    def _select(self, scenario: Scenario | Mapping[str, Any], rewrite: PolicyRewrite | None,
                strict: bool) -> Decision:
        if type(scenario) is PreparedScenario:
            try:
                scenario = self._current(scenario)
            except OracleError as exc:
                return error_decision(str(exc))
        if not isinstance(scenario, Scenario):
            try:
                scenario = self.scenario(scenario, strict=strict)
            except OracleError as exc:
                return error_decision(str(exc))
        elif strict and scenario.warnings:
            return error_decision("; ".join(scenario.warnings) + " (an error under --strict)")
        snap = self._snapshot
        key: Hashable = scenario if rewrite is None else (scenario, rewrite)
        answers = snap.answers
        cached = answers.get(key)
        if cached is not None:
            return cached
        decision = with_warnings(self._answer(snap, scenario, rewrite), scenario.warnings)
        if len(answers) >= self.CACHE_SIZE:
            answers.clear()
        answers[key] = decision
        return decision

    def select_uncached(self, scenario: Scenario, rewrite: PolicyRewrite | None = None) -> Decision:
        if type(scenario) is PreparedScenario:
            try:
                scenario = self._current(scenario)
            except OracleError as exc:
                return error_decision(str(exc))
        return with_warnings(self._answer(self._snapshot, scenario, rewrite), scenario.warnings)

    def select_many(self, scenarios: Iterable[Any]) -> list[Decision]:
        return [self.select(s) for s in scenarios]

    def _plan(self, snap: Snapshot, profile: str | None, policy_name: str) -> Plan:
        """What answers a (profile, policy) question, found once per snapshot: every uncached select needs it."""
        key = (profile, policy_name)
        found: Plan | None = snap.plans.get(key)
        if found is None:
            table = snap.tables.get(profile or snap.index.default) or self._compile(snap, profile or snap.index.default)
            policy = table.policies.get(policy_name)
            if policy is None:
                close = did_you_mean(policy_name, table.policies)
                raise ScenarioError(f"policy: unknown policy {policy_name!r}{close}; "
                                    f"profile {table.name} has {', '.join(table.policies)}")
            call = snap.calls.get(table.name)
            if call is None:
                call = snap.calls[table.name] = _call_hook(table)
            found = snap.plans[key] = (table, policy, call, _first_step(table, policy))
        return found

    def _answer(self, snap: Snapshot, sc: Scenario, rewrite: PolicyRewrite | None = None) -> Decision:
        plan = snap.plans.get((sc.profile, sc.policy))
        if plan is None:
            try:
                plan = self._plan(snap, sc.profile, sc.policy)
            except OracleError as exc:
                return error_decision(str(exc))
        table, policy, call, first_step = plan
        if rewrite is not None:  # a deployment's policy: not the table's, so no step_chain of its own
            policy, first_step = rewrite(policy), None
        ctx = Ctx(sc.facts, sc.env, sc.packages)
        if sc.query == "select":
            try:
                res = run(policy, ctx, None, call, UNSET, first_step)
            except EnvValueError as exc:
                res = Result("invalid", error=str(exc))
            return self._decision(table, policy, call, res, sc, ctx)
        meta: dict[str, Any] = {"profile": table.name, "policy": policy.name, "rule_files": table.files}
        family = policy.family
        if sc.query == "round_up":
            backend = family.backends.get(sc.backend or "") or family.by_value.get(sc.backend or "")
            if backend is None:
                return Decision("invalid", error=f"backend: {sc.backend!r} is not a {family.name} backend"
                                f"{did_you_mean(sc.backend, family.backends)}; "
                                f"expected one of {', '.join(family.backends)}",
                                **meta)
            h, i = round_sizes(family.round_up, backend.name, ctx)
            return Decision("selected", hidden_size=h, intermediate_size=i, **meta)
        if sc.query == "map_backend":
            names, refusal = map_explicit(family, ctx, remap=not family.explicit_lists)
            if names is None:
                return Decision("invalid", error=refusal, **meta)
            if family.explicit_lists:  # the string names an ordered list (tried in turn): answer all of it
                return Decision("selected", extras={"backends": [family.backends[n].value for n in names]}, **meta)
            return Decision("selected", backend=family.backends[names[0]].value, **meta)
        fn = policy.queries.get(sc.query)
        if fn is None:
            return error_decision(f"query: policy {policy.name} does not answer {sc.query}; it answers "
                                  f"{', '.join(('select', 'round_up', 'map_backend', *policy.queries))}")
        answer = fn(ctx)
        return Decision("selected" if answer else "none", extras={sc.query: answer}, **meta)

    def _decision(self, table: Table, policy: Policy, call: CallPolicy, res: Result, sc: Scenario,
                  ctx: Ctx) -> Decision:
        computed: list[tuple[Entry, ...]] = []

        def trace() -> tuple[Entry, ...]:
            if not computed:
                steps: list[Entry] = []
                try:
                    run(policy, Ctx(sc.facts, sc.env, sc.packages), steps, call)
                except EnvValueError as exc:
                    steps.append(ErrorEntry(str(exc)))
                computed.append(tuple(steps))
            return computed[0]

        extras = res.emits
        if res.outcome == "selected":  # the common answer, built without keyword binding
            assert res.backend is not None and res.family is not None
            b = res.backend
            h, i = round_sizes(_round_rows(table, res.family, b.name), b.name, ctx)
            kernel = res.kernel.name if res.kernel and res.report_kernel else None
            return Decision.build_selected(b.value, kernel, res.activation_key, h, i, extras, table.name,
                                           policy.name, table.files, b.converter, b.runner,
                                           b.missing_why, res.decided_by.decided_by if res.decided_by else None,
                                           trace, b.quant_config if policy.quant_config is None
                                           else policy.quant_config.kind_for(b, extras))
        meta: dict[str, Any] = {"profile": table.name, "policy": policy.name, "rule_files": table.files}
        if res.decided_by is not None:
            meta["decided_by"] = res.decided_by.decided_by
        if res.outcome == "none":
            return Decision("none", backend=res.reported_backend, extras=extras, trace=trace, **meta)
        if res.outcome == "unsupported":
            def error() -> str:
                message = res.error() if callable(res.error) else res.error
                rejected = candidate_summary(trace())
                return f"{message} Candidates: {rejected}." if rejected else message

            return Decision("unsupported", error=error, extras=extras, trace=trace, **meta)
        return Decision(res.outcome, error=res.error, extras=extras, trace=trace, **meta)


def _round_rows(table: Table, family: Family, backend: str) -> tuple[RoundRow, ...]:
    """The family's round_up rows that can apply to `backend` (those naming other backends left out), once per
    table: the answer's sizes are computed on every uncached select."""
    by_backend = table.derived.get("round_rows")
    if by_backend is None:
        by_backend = table.derived.setdefault("round_rows", {})
    key = (family.name, backend)
    rows: tuple[RoundRow, ...] | None = by_backend.get(key)
    if rows is None:  # two threads may both build it: equal tuples, the last one stays
        rows = by_backend[key] = tuple(r for r in family.round_up if r.backends is None or backend in r.backends)
    return rows


def _call_hook(table: Table) -> CallPolicy:
    """The `call` step's hook: run another policy of the same table on the same question."""
    def call(name: str, c: Ctx, t: Trace, requested: Any = UNSET) -> Result:
        sub = Ctx(c.facts, c.env, c.packages)
        sub.memo = c.memo
        policy = table.policies[name]
        return run(policy, sub, t, call, requested, _first_step(table, policy) if t is None else None)
    return call


def _first_step(table: Table, policy: Policy) -> Fn | None:
    """The policy's step_chain, compiled once per table; None for a policy the table does not hold (a
    deployment override's rewrite: the policy's emit steps then the forcing step, too few to skip)."""
    if table.policies.get(policy.name) is not policy:
        return None
    key = "first_step:" + policy.name
    found = table.derived.get(key)
    if found is None:  # two threads may both build it: equal functions, the last one stays
        found = table.derived[key] = (step_chain(policy, table.codegen.function),)
    fn: Fn | None = found[0]
    return fn


_default: Oracle | None = None
_default_lock = threading.Lock()


def internal_error(exc: BaseException) -> str:
    """The `error` text of a failure no check foresaw: the exception, and that it is a bug to report."""
    text = str(exc) if not isinstance(exc, RecursionError) else "nested too deeply"
    return (f"internal error {type(exc).__name__}: {text[:300]}; this is a bug of moe-oracle: please report it "
            "with the question")


def default_oracle() -> Oracle:
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Oracle()
    return _default


def select(scenario: Scenario | Mapping[str, Any]) -> Decision:
    """Select with the embedded default rules: `oracle.select({...}).to_dict()`."""
    return default_oracle().select(scenario)


__all__ = ["Decision", "Oracle", "Scenario", "PreparedScenario", "Snapshot", "select", "default_oracle", "RuleError",
           "ScenarioError", "OUTCOMES", "format_capability", "build_table", "check_profile", "rules_problems"]
