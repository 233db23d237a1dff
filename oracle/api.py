"""The public selection API: Oracle (rules loaded once, one swappable snapshot), select().

    rules/*.yaml -> yamlio -> schema -> loader -> semantics -> compiler/kernels/tables -> Table
    scenario -> parse_scenario -> Scenario -> interpreter.run(Table) -> Decision (frozen)

Everything one version of the rules answers with (profile index, compiled tables, cached
answers) lives in one Snapshot; `reload()` builds a new one and swaps the reference, so a
question is always answered from one consistent version.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import registry
from .decision import OUTCOMES, Decision, error_decision, with_warnings
from .errors import Diagnostic, EnvValueError, OracleError, RuleError, ScenarioError, did_you_mean
from .interpreter import UNSET, CallPolicy, Result, Trace, map_explicit, round_sizes, run, step_chain
from .loader import (
    FileCache,
    FileKey,
    ProfileIndex,
    RuleSet,
    Source,
    load_profile_index,
    load_ruleset,
    load_ruleset_collecting,
    read_source,
    unlisted_rule_files,
)
from .model import Ctx, Fn, Policy, Table, format_capability
from .resources import rules_dir
from .scenario import Scenario, parse_scenario
from .semantics import semantic_diagnostics
from .tables import compile_ruleset
from .trace import Entry, ErrorEntry, candidate_summary

PolicyRewrite = Callable[[Policy], Policy]  # hashable; e.g. oracle.overrides.Override


# one profile as loaded: its name and description, each file's content key, the plugin packages rules may name
ProfileKey = tuple[str, str, tuple[FileKey, ...], tuple[str, ...]]


def check_profile(files: list[Path], name: str, description: str, cache: FileCache | None = None,
                  sources: list[Source] | None = None) -> tuple[RuleSet, list[Diagnostic], set[str]]:
    """Load and check one profile's rule files: every schema, merge and cross-reference problem in one run,
    and the package vocabulary (declared, plus any the rules test). `sources`: the files as already read."""
    rs, problems = load_ruleset_collecting(files, name, description, cache, sources)
    found, packages = semantic_diagnostics(rs)
    return rs, list(dict.fromkeys(problems + found)), packages | set(rs.sections["packages"])


def rules_problems(index: ProfileIndex, cache: FileCache | None = None) -> list[Diagnostic]:
    """Every problem of a rules directory in one run: each profile's schema, merge and cross-reference
    problems, and rule files no profile lists (deduplicated, in file order)."""
    problems: list[Diagnostic] = []
    for name, profile in index.profiles.items():
        problems.extend(check_profile(profile.files, name, profile.description, cache)[1])
    return _sorted_problems(problems + unlisted_rule_files(index))


def _sorted_problems(problems: list[Diagnostic]) -> list[Diagnostic]:
    return sorted(dict.fromkeys(problems), key=lambda d: (d.file, d.line, d.col))


def build_table(files: list[Path], name: str, description: str, cache: FileCache | None = None,
                sources: list[Source] | None = None) -> Table:
    """Load, check and compile one profile's rule files (RuleError lists every problem)."""
    rs, problems, packages = check_profile(files, name, description, cache, sources)
    if problems:
        raise RuleError(problems)
    return compile_ruleset(rs, packages)


@dataclass(frozen=True)
class Snapshot:
    """One version of the rules and everything derived from it. The fields never change; the
    dicts only grow (lazy compilation, memoized lookups, the answer cache).

    Keyed by content (ProfileKey: each file's sha256), so a reload reuses them only for unchanged files:
    `files` (parsed, schema-checked), `valid` (profiles whose cross-reference check passed, with their package
    vocabulary) and `compiled` (tables). `sources` holds every rule file as read when the snapshot was built,
    so a profile compiled later is compiled from the text that was validated."""

    index: ProfileIndex
    tables: dict[str, Table] = field(default_factory=dict)
    answers: dict[Hashable, Decision] = field(default_factory=dict)  # Scenario, or (Scenario, PolicyRewrite)
    resolved: dict[tuple[str | None, str], tuple[Table, Policy]] = field(default_factory=dict)
    calls: dict[str, CallPolicy] = field(default_factory=dict)
    files: FileCache = field(default_factory=dict)  # parsed rule files shared by the profiles listing them
    sources: dict[Path, Source] = field(default_factory=dict)
    valid: dict[ProfileKey, frozenset[str]] = field(default_factory=dict)
    compiled: dict[ProfileKey, Table] = field(default_factory=dict)

    def profile_sources(self, name: str) -> tuple[ProfileKey | None, list[Source] | None]:
        """The key and files of profile `name` as this snapshot read them; (None, None) when one cannot be read
        (the full check then reports it)."""
        profile = self.index.profiles[name]
        out = []
        for path in profile.files:
            found = self.sources.get(path)
            if found is None:
                try:
                    found = self.sources[path] = read_source(path)
                except RuleError:
                    return None, None
            out.append(found)
        return (name, profile.description, tuple(key for key, _ in out), registry.allowed_packages()), out


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
        self._snapshot = self._checked(_fresh_snapshot(index, files, reuse))

    @staticmethod
    def _checked(snap: Snapshot) -> Snapshot:
        """Validate every profile of the snapshot now (a server fails at start, not with `error` answers):
        one RuleError lists every problem. A profile whose files are unchanged since `reuse` is not checked
        again; what this version no longer lists is forgotten."""
        problems: list[Diagnostic] = []
        keys = []
        for name, profile in snap.index.profiles.items():
            key, sources = snap.profile_sources(name)
            if key is not None and key in snap.valid:
                keys.append(key)
                continue
            _, found, packages = check_profile(profile.files, name, profile.description, snap.files, sources)
            problems.extend(found)
            if key is not None and not found:
                keys.append(key)
                snap.valid[key] = frozenset(packages)
        problems.extend(unlisted_rule_files(snap.index))
        if problems:
            raise RuleError(_sorted_problems(problems))
        used = {key for key, _ in snap.sources.values()}
        for stale in [k for k in snap.files if k not in used]:
            del snap.files[stale]
        for cache in (snap.valid, snap.compiled):
            for stale_profile in [k for k in cache if k not in keys]:
                del cache[stale_profile]
        return snap

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def reload(self) -> None:
        """Re-read the rules directory; profiles compiled before are compiled again before the swap (reused when
        their files did not change), so broken rules raise RuleError here and the previous snapshot stays in use."""
        fresh = self._checked(_fresh_snapshot(load_profile_index(self.root), None, self._snapshot))
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
        key, sources = snap.profile_sources(name)
        table = snap.compiled.get(key) if key is not None else None
        if table is None:
            packages = snap.valid.get(key) if key is not None else None
            if packages is not None:  # validated by this snapshot (or unchanged since): merge and compile only
                rs = load_ruleset(found.files, name, found.description, snap.files, sources)
                table = compile_ruleset(rs, set(packages))
            else:
                table = build_table(found.files, name, found.description, snap.files, sources)
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
        only be a warning, such as an env var that looks like a declared one)."""
        profile = raw.get("profile") if isinstance(raw, Mapping) else None
        table = self.table(profile if isinstance(profile, str) else None)
        return parse_scenario(raw, table, default_platform, strict)

    def select(self, scenario: Scenario | Mapping[str, Any], rewrite: PolicyRewrite | None = None,
               strict: bool = False) -> Decision:
        """Answer one question. Never raises for bad input: that is outcome 'error'.

        `rewrite`: a deployment's change of the question's policy (oracle.overrides), part of the cache key.
        `strict`: a warning about the question (a look-alike env var) is answered `error` instead.
        The snapshot is read once, so the answer and its cache entry come from one version of the rules."""
        if not isinstance(scenario, Scenario):
            try:
                scenario = self.prepare(scenario, strict=strict)
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
        return with_warnings(self._answer(self._snapshot, scenario, rewrite), scenario.warnings)

    def select_many(self, scenarios: Iterable[Any]) -> list[Decision]:
        return [self.select(s) for s in scenarios]

    def _resolve(self, snap: Snapshot, profile: str | None, policy_name: str) -> tuple[Table, Policy]:
        """(table, policy) of a question, memoized: the lookup is on every uncached select."""
        key = (profile, policy_name)
        found = snap.resolved.get(key)
        if found is None:
            table = snap.tables.get(profile or snap.index.default) or self._compile(snap, profile or snap.index.default)
            policy = table.policies.get(policy_name)
            if policy is None:
                close = did_you_mean(policy_name, table.policies)
                raise ScenarioError(f"policy: unknown policy {policy_name!r}{close}; "
                                    f"profile {table.name} has {', '.join(table.policies)}")
            found = snap.resolved[key] = (table, policy)
        return found

    def _answer(self, snap: Snapshot, sc: Scenario, rewrite: PolicyRewrite | None = None) -> Decision:
        try:
            table, policy = self._resolve(snap, sc.profile, sc.policy)
        except OracleError as exc:
            return error_decision(str(exc))
        if rewrite is not None:
            policy = rewrite(policy)
        meta: dict[str, Any] = {"profile": table.name, "policy": policy.name, "rule_files": table.files}
        ctx = Ctx(sc.facts, sc.env, sc.packages)
        family = policy.family
        if sc.query == "select":
            try:
                res = self._run(snap, table, policy, ctx, None)
            except EnvValueError as exc:
                res = Result("invalid", error=str(exc))
            return self._decision(snap, table, policy, res, sc, meta, ctx)
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

    def _run(self, snap: Snapshot, table: Table, policy: Policy, ctx: Ctx, trace: Trace) -> Result:
        call = snap.calls.get(table.name)
        if call is None:
            call = snap.calls[table.name] = _call_hook(table)
        return run(policy, ctx, trace, call, first_step=_first_step(table, policy) if trace is None else None)

    def _decision(self, snap: Snapshot, table: Table, policy: Policy, res: Result, sc: Scenario,
                  meta: dict[str, Any], ctx: Ctx) -> Decision:
        computed: list[tuple[Entry, ...]] = []

        def trace() -> tuple[Entry, ...]:
            if not computed:
                steps: list[Entry] = []
                try:
                    self._run(snap, table, policy, Ctx(sc.facts, sc.env, sc.packages), steps)
                except EnvValueError as exc:
                    steps.append(ErrorEntry(str(exc)))
                computed.append(tuple(steps))
            return computed[0]

        extras = res.emits
        if res.outcome == "selected":  # the common answer, built without keyword binding
            assert res.backend is not None and res.family is not None
            h, i = round_sizes(res.family.round_up, res.backend.name, ctx)
            b = res.backend
            kernel = res.kernel.name if res.kernel and res.report_kernel else None
            return Decision.build_selected(b.value, kernel, res.activation_key, h, i, extras, meta["profile"],
                                           meta["policy"], meta["rule_files"], b.converter, b.runner,
                                           b.missing_why, res.decided_by.decided_by if res.decided_by else None,
                                           trace, b.quant_config)
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


def _fresh_snapshot(index: ProfileIndex, files: FileCache | None, reuse: Snapshot | None) -> Snapshot:
    """A new snapshot of `index`, starting from the content-keyed caches of `reuse` (copied: it keeps serving)."""
    start = dict(files if files is not None else reuse.files if reuse is not None else {})
    if reuse is None:
        return Snapshot(index, files=start)
    return Snapshot(index, files=start, valid=dict(reuse.valid), compiled=dict(reuse.compiled))


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
    deployment override's rewrite: one unconditional step, nothing to skip)."""
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


__all__ = ["Decision", "Oracle", "Scenario", "Snapshot", "select", "default_oracle", "RuleError", "ScenarioError",
           "OUTCOMES", "format_capability"]
