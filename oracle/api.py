"""The public selection API: Oracle (rules loaded once), Decision, select()."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterable, Mapping

from .compiler import Ctx, Table, compile_ruleset, format_capability
from .errors import EnvValueError, OracleError, RuleError, ScenarioError
from .interpreter import Result, map_explicit, round_sizes, run
from .resources import rules_dir
from .rules import did_you_mean, load_files, load_profile_index
from .scenario import Scenario, parse_scenario

OUTCOMES = ("selected", "none", "invalid", "unsupported", "error")


class Decision:
    """The answer to one question; `to_dict()` is the output contract of the scenario spec.

    The trace (every step and candidate, with all failing checks and their file:line) is
    computed on first access, so a server that only needs the backend pays nothing for it.
    """

    __slots__ = ("outcome", "backend", "kernel", "activation_key", "hidden_size", "intermediate_size",
                 "extras", "profile", "policy", "rule_files", "converter", "runner", "missing_why", "decided_by", "_trace", "_trace_fn",
                 "_error")

    def __init__(self, outcome: str, *, backend: str | None = None, kernel: str | None = None,
                 activation_key: str | None = None, hidden_size: int | None = None,
                 intermediate_size: int | None = None, error: str | None = None, extras: Mapping[str, Any] = (),
                 profile: str | None = None, policy: str | None = None, rule_files: tuple[str, ...] = (),
                 converter: str | None = None, runner: str | None = None, missing_why: str | None = None,
                 decided_by: Any = None, trace_fn=None):
        self.outcome = outcome
        self.backend = backend
        self.kernel = kernel
        self.activation_key = activation_key
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self._error = error
        self.extras = extras if isinstance(extras, dict) else dict(extras)
        self.profile = profile
        self.policy = policy
        self.rule_files = rule_files
        self.converter = converter
        self.runner = runner
        self.missing_why = missing_why
        self.decided_by = decided_by
        self._trace = None
        self._trace_fn = trace_fn

    @property
    def error(self) -> str | None:
        """Why the answer is not `selected`; for `unsupported` it lists every candidate (built on first access)."""
        if callable(self._error):
            self._error = self._error()
        return self._error

    @property
    def trace(self) -> list[dict]:
        if self._trace is None:
            self._trace = self._trace_fn() if self._trace_fn else []
        return self._trace

    def to_dict(self, *, with_trace: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"outcome": self.outcome}
        if self.outcome in ("selected", "none"):
            out["backend"] = self.backend
            if self.kernel is not None or self.outcome == "selected" or self.extras:
                out["kernel"] = self.kernel
        if self.activation_key is not None or self.outcome == "selected" and self.kernel is not None:
            out["activation_key"] = self.activation_key
        if self.outcome == "selected" and self.backend is not None:
            out["converter"] = self.converter
            out["runner"] = self.runner
        if self.hidden_size is not None:
            out["hidden_size"] = self.hidden_size
            out["intermediate_size"] = self.intermediate_size
        out.update(self.extras)
        if self.error is not None:
            out["error"] = self.error
        if self.decided_by is not None:
            step = self.decided_by
            out["decided_by"] = {"step": step.id, "at": step.at, "why": step.why}
        if self.profile is not None:
            out["profile"] = self.profile
            out["policy"] = self.policy
            out["rule_files"] = list(self.rule_files)
        if with_trace:
            out["trace"] = self.trace
        return out

    def __repr__(self) -> str:
        return f"Decision({self.outcome}, backend={self.backend!r}, kernel={self.kernel!r})"


def error_decision(message: str) -> Decision:
    return Decision("error", error=message)


class Oracle:
    """Rule tables of one rules directory, compiled once per profile and shared across threads."""

    CACHE_SIZE = 4096

    def __init__(self, rules: str | Path | None = None):
        self.root = Path(rules) if rules is not None else rules_dir()
        self.index = load_profile_index(self.root)
        self._tables: dict[str, Table] = {}
        self._cache: dict[Scenario, Decision] = {}
        self._calls: dict[str, Any] = {}
        self._resolved: dict[tuple, tuple] = {}
        self._files: dict = {}  # parsed rule files, shared by the profiles that list them
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- tables
    @property
    def default_profile(self) -> str:
        return self.index.default

    def profiles(self) -> dict[str, str]:
        return {name: desc for name, (desc, _) in self.index.profiles.items()}

    def table(self, profile: str | None = None) -> Table:
        name = profile or self.index.default
        table = self._tables.get(name)
        if table is None:
            if name not in self.index.profiles:
                raise ScenarioError(f"profile: unknown profile {name!r}{did_you_mean(name, self.index.profiles)}; "
                                    f"known: {', '.join(self.index.profiles)}")
            desc, files = self.index.profiles[name]
            rs, packages = load_files([self.root / f for f in files], name, desc, self._files)
            table = compile_ruleset(rs, packages)
            with self._lock:
                self._tables[name] = table
        return table

    def compile_all(self) -> None:
        for name in self.index.profiles:
            self.table(name)

    # ---------------------------------------------------------------- questions
    def prepare(self, raw: Mapping[str, Any], default_platform: Mapping[str, Any] | None = None) -> Scenario:
        """Validate and freeze a scenario mapping (raises ScenarioError)."""
        profile = raw.get("profile") if isinstance(raw, Mapping) else None
        table = self.table(profile if isinstance(profile, str) else None)
        return parse_scenario(raw, table.rocm_archs, table.packages, default_platform)

    def select(self, scenario: Scenario | Mapping[str, Any]) -> Decision:
        """Answer one question. Never raises for bad input: that is outcome 'error'."""
        if not isinstance(scenario, Scenario):
            try:
                scenario = self.prepare(scenario)
            except OracleError as exc:
                return error_decision(str(exc))
        cached = self._cache.get(scenario)
        if cached is not None:
            return cached
        decision = self._answer(scenario)
        if len(self._cache) >= self.CACHE_SIZE:
            self._cache.clear()
        self._cache[scenario] = decision
        return decision

    def select_uncached(self, scenario: Scenario) -> Decision:
        return self._answer(scenario)

    def _resolve(self, profile: str | None, policy_name: str) -> tuple[Table, Any]:
        """(table, policy) of a question, memoized: the lookup is on every uncached select."""
        key = (profile, policy_name)
        found = self._resolved.get(key)
        if found is None:
            table = self.table(profile)
            policy = table.policies.get(policy_name)
            if policy is None:
                raise ScenarioError(f"policy: unknown policy {policy_name!r}{did_you_mean(policy_name, table.policies)}; "
                                    f"profile {table.name} has {', '.join(table.policies)}")
            found = self._resolved[key] = (table, policy)
        return found

    def _answer(self, sc: Scenario) -> Decision:
        try:
            table, policy = self._resolve(sc.profile, sc.policy)
        except OracleError as exc:
            return error_decision(str(exc))
        meta = {"profile": table.name, "policy": policy.name, "rule_files": table.files}
        ctx = Ctx(sc.facts, sc.env, sc.packages)
        family = policy.family
        if sc.query == "round_up":
            backend = family.backends.get(sc.backend) or family.by_value.get(sc.backend)
            if backend is None:
                return Decision("invalid", error=f"backend: {sc.backend!r} is not a {family.name} backend"
                                f"{did_you_mean(sc.backend, family.backends)}; expected one of {', '.join(family.backends)}", **meta)
            h, i = round_sizes(family, backend.name, ctx)
            return Decision("selected", hidden_size=h, intermediate_size=i, **meta)
        if sc.query == "map_backend":
            name, refusal = map_explicit(family, ctx, table.batched)
            if name is None:
                return Decision("invalid", error=refusal, **meta)
            return Decision("selected", backend=family.backends[name].value, **meta)
        if sc.query == "ocp_mx_scheme":
            fn = policy.queries.get("ocp_mx_scheme")
            if fn is None:
                return error_decision(f"query: policy {policy.name} does not answer ocp_mx_scheme")
            scheme = fn(ctx)
            return Decision("selected" if scheme else "none", extras={"ocp_mx_scheme": scheme}, **meta)
        try:
            res = self._run(table, policy.name, ctx, None)
        except EnvValueError as exc:
            res = Result("invalid", error=str(exc))
        return self._decision(table, policy, res, sc, meta, ctx)

    def _run(self, table: Table, policy_name: str, ctx: Ctx, trace: list | None) -> Result:
        call = self._calls.get(table.name)
        if call is None:
            call = self._calls[table.name] = _call_hook(table)
        return run(table.policies[policy_name], ctx, trace, table.batched, call)

    def _decision(self, table: Table, policy, res: Result, sc: Scenario, meta: dict, ctx: Ctx) -> Decision:
        def trace() -> list[dict]:
            steps: list[dict] = []
            try:
                self._run(table, policy.name, Ctx(sc.facts, sc.env, sc.packages), steps)
            except EnvValueError as exc:
                steps.append({"error": str(exc)})
            return steps

        extras = res.emits
        if res.decided_by is not None:
            meta["decided_by"] = res.decided_by
        if res.outcome == "selected":
            h, i = round_sizes(res.family, res.backend.name, ctx)
            return Decision("selected", backend=res.backend.value,
                            kernel=res.kernel.name if res.kernel and res.report_kernel else None,
                            activation_key=res.activation_key, hidden_size=h, intermediate_size=i, extras=extras,
                            converter=res.backend.converter, runner=res.backend.runner,
                            missing_why=res.backend.missing_why, trace_fn=trace, **meta)
        if res.outcome == "none":
            return Decision("none", backend=res.reported_backend, extras=extras, trace_fn=trace, **meta)
        if res.outcome == "unsupported":
            decision = Decision("unsupported", extras=extras, trace_fn=trace, **meta)

            def error() -> str:
                message = res.error() if callable(res.error) else res.error
                rejected = _candidate_summary(decision.trace)
                return f"{message} Candidates: {rejected}." if rejected else message

            decision._error = error
            return decision
        return Decision(res.outcome, error=res.error, extras=extras, trace_fn=trace, **meta)

    # ---------------------------------------------------------------- batches
    def select_many(self, scenarios: Iterable[Any]) -> list[Decision]:
        return [self.select(s) for s in scenarios]


def _candidate_summary(trace: list[dict]) -> str:
    """'BACKEND: first failing check of its last kernel; ...' over every candidate tried (calls included)."""
    last: dict[str, str] = {}
    for entry in trace:
        if "trace" in entry:
            nested = _candidate_summary(entry["trace"] or [])
            if nested:
                last[f"{entry['call']} ->"] = nested
        elif "candidate" in entry and not entry["accepted"] and entry["failed"]:
            last[entry["candidate"]] = entry["failed"][0]["reason"]
    return "; ".join(f"{b}: {r}" for b, r in last.items())


def _call_hook(table: Table):
    """The `call` step's hook: run another policy of the same table on the same question."""
    def call(name: str, c: Ctx, t: list | None) -> Result:
        sub = Ctx(c.facts, c.env, c.packages)
        sub.memo = c.memo
        return run(table.policies[name], sub, t, table.batched, call)
    return call


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


__all__ = ["Decision", "Oracle", "Scenario", "select", "default_oracle", "RuleError", "ScenarioError", "OUTCOMES",
           "format_capability"]
