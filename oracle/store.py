"""A rule store for servers: one per process, cached, thread-safe, hot-reloadable, logged once.

    store = RuleStore("my-rules/", overrides="deploy/overrides.yaml", audit_log="decisions.jsonl")
    store.watch()                                 # or call store.poll() / store.reload() yourself
    d = store.select({"policy": "mxfp4-gpt-oss", "moe": {...}}, model="openai/gpt-oss-120b", layer=7)

Everything one version of the rules answers with is one immutable `Generation`: the Oracle (its
compiled tables), the overrides, the plugins in use, the content hashes of every file loaded
and the answer cache. `select` reads `self._generation` once and answers from that object only
(a Scenario from `prepare` is resolved again against it: one rules version per answer, and the
answer's `generation` says which); a reload builds a complete new Generation and replaces the
reference in one assignment. The cached path takes no lock: a dict lookup in the generation's cache.

What a reload installs (oracle/reloading.py; docs/server.md, "Publishing rules"): a version whose
files were unchanged over the settle window (size and sha256, `settle` seconds), that validates,
answers one question per policy without raising, drops no profile, policy or backend the serving
version has (unless `allow_removals`, or a manifest `rules-manifest.json` with a new `version`), and
whose manifest, when there is one, lists the sha256 of the files on disk. Anything else keeps the
previous generation serving; it is logged once per content (every problem as file:line:col, logger
`moe_oracle`), kept in `last_error` until the files on disk are valid again or equal to the serving
ones, and returned in the ReloadResult.

Change detection polls (every 0.25 s by default): the resolved target of the rules directory, every
symlink below it (a swapped `current -> v2` link or a ConfigMap's `..data`), and the sha256 of every rule
file below it and of every file the generation was loaded from. Why polling, not inotify: stdlib-only
and portable (macOS, NFS, container bind mounts, ConfigMaps), and content hashes catch same-size edits
within one mtime tick. Why selects pause while the store reads files: each read hands the GIL back, and
with busy selecting threads every hand-back cost the reader a whole scheduling round (an edit took ~20 s
to serve under 8 threads); a select waits at most `max_pause` seconds for it.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .decision import Decision, error_decision, with_generation
from .errors import OracleError, ScenarioError
from .generation import MANIFEST, Generation, Observed, ReloadResult
from .log import DecisionLog
from .prepared import PreparedScenario, freeze
from .reloading import _KEPT_STATS, SETTLE, Reloading
from .resources import rules_dir
from .scenario import Scenario

log = logging.getLogger("moe_oracle")
CACHE_SIZE = 8192  # answers per generation before the cache starts over
POLL_INTERVAL = 0.25  # seconds between polls of watch(); an edit serves within two of them
WAKERS = 2  # threads of watch() that race to make each poll (see watch)
MAX_PAUSE = 0.25  # the longest a select waits for the store reading files
FAILED_OUTCOMES = ("error", "invalid", "unsupported")



class RuleStore(Reloading):
    """The oracle a server holds for its whole life (see the module docstring)."""

    def __init__(self, rules: str | Path | None = None, *, overrides: str | Path | None = None,
                 plugins: bool = True, platform: Mapping[str, Any] | None = None,
                 packages: Mapping[str, bool] | None = None, env: Mapping[str, str] | None = None,
                 profiles: Iterable[str] | None = None, audit_log: str | Path | None = None,
                 decision_log: DecisionLog | None = None, settle: float = SETTLE,
                 allow_removals: bool = False, max_pause: float = MAX_PAUSE):
        """`platform`, `packages`, `env`: the deployment facts filled into every question that does not give them;
        detected once here when None (packages per profile, from the ones its rules know). `profiles`: compiled
        (and so validated) at every load besides the default one. `settle`: seconds a new version's files must
        stay unchanged before a reload installs it (0: no wait). `allow_removals`: install a version that drops
        a profile, policy or backend of the serving one (else it is held back unless its manifest has a new
        version). `max_pause`: the longest a select waits while the store reads files (0: never waits).
        Raises RuleError when the first load fails."""
        self.root = Path(rules) if rules is not None else rules_dir()
        self.overrides_path = Path(overrides) if overrides is not None else None
        self.use_plugins = plugins
        self.decisions = decision_log or DecisionLog(audit_log)
        self.settle = settle
        self.allow_removals = allow_removals
        self.max_pause = max_pause
        self._profiles = tuple(profiles or ())
        if platform is None:
            from .platform import detect_platform

            platform = detect_platform()
        self.platform = dict(platform)
        self._packages = dict(packages) if packages is not None else None
        self._environ = dict(env) if env is not None else dict(os.environ)
        self._reload_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._reported: set[str] = set()  # content keys of broken versions logged since the last install
        self.last_error: str | None = None
        self._watcher: tuple[threading.Thread, ...] | None = None
        self._due = 0.0  # monotonic time the next poll of watch() is due
        self._wake_lock = threading.Lock()
        self._stop = threading.Event()
        self._options: dict[str, Any] = {}  # what default_store() was called with
        self._pausing = False  # selects wait on _gate while the store reads files
        self._gate = threading.Event()
        self._gate.set()
        self._failed_answers: dict[int, dict[str, int]] = {}  # generation -> outcome -> answers given
        self._reloads = {"installed": 0, "failed": 0, "held_back": 0, "unsettled": 0}
        # files changed but not yet settled: (as seen, first look (monotonic), first look (wall), filesystem stamp)
        self._pending: tuple[Observed, float, float, float | None] | None = None
        self._latencies: dict[int, dict[str, float | None]] = {}  # generation -> seconds to install it
        first = self._build(1, (), None)
        self._smoke(None, first)
        first.installed_at = time.time()
        self._generation = first

    # ------------------------------------------------------------------ questions
    @property
    def generation(self) -> Generation:
        return self._generation

    def prepare(self, question: Mapping[str, Any]) -> Scenario:
        """The question with this deployment's platform, packages and env filled in, validated (ScenarioError).
        After a reload it is answered as the same mapping would be then (resolved again against the rules
        serving)."""
        gen = self._generation
        return PreparedScenario.of(self._prepare(gen, question), question, gen)

    def _prepare(self, gen: Generation, question: Mapping[str, Any]) -> Scenario:
        if not isinstance(question, Mapping):
            raise ScenarioError(f"scenario: expected a mapping with at least 'policy', got {type(question).__name__}")
        q = dict(question)
        profile = q.get("profile") if isinstance(q.get("profile"), str) else None
        table = gen.oracle.table(profile)
        if "platform" not in q:
            q["platform"] = self.platform
        packages = gen.packages.get(profile)
        if packages is None:
            if self._packages is not None:
                packages = {n: v for n, v in self._packages.items() if n in table.packages}
            else:
                from .platform import detect_packages

                packages = detect_packages(table.packages)
            gen.packages[profile] = packages
        given = q.get("packages") or {}
        if packages and isinstance(given, Mapping):  # anything else: parse_scenario names the field
            q["packages"] = {**packages, **given}
        env = {n: self._environ[n] for n in table.env_vars if n in self._environ}
        given = q.get("env") or {}
        if env and isinstance(given, Mapping):
            q["env"] = {**env, **given}
        return gen.oracle.scenario(q)

    def select(self, question: Scenario | Mapping[str, Any], *, model: str | None = None, layer: int | None = None,
               role: str | None = None) -> Decision:
        """Answer one layer's question from one rules version (the answer's `generation`). Never raises: a bad
        question, or rules that fail on it, is outcome 'error'.

        `model`, `layer`, `role` pick a deployment override; the cached path is two dict lookups, no lock."""
        if self._pausing:
            self._gate.wait(self.max_pause)
        gen = self._generation
        if isinstance(question, Scenario):  # a prepared one is keyed by its question: see PreparedScenario
            key = (question, model, layer, role)
            found = gen.answers.get(key)
            if found is not None:
                return found
            if type(question) is PreparedScenario:
                pair = question[11][0]
                resolved = pair[1] if pair[0] is gen else self._resolve(gen, question)
                if isinstance(resolved, Decision):
                    return self._count(gen, resolved)
                return self._answer(gen, key, resolved, model, layer, role)
            return self._answer(gen, key, question, model, layer, role)
        else:
            frozen = freeze(question)
            found_sc = gen.prepared.get(frozen) if frozen is not None else None
            if found_sc is None:
                found_sc = self._prepare_or_error(gen, question)
                if frozen is not None:
                    if len(gen.prepared) >= CACHE_SIZE:
                        gen.prepared.clear()
                    gen.prepared[frozen] = found_sc
            if isinstance(found_sc, Decision):
                return self._count(gen, found_sc)
            key = (found_sc, model, layer, role)
            found = gen.answers.get(key)
            if found is not None:
                return found
            return self._answer(gen, key, found_sc, model, layer, role)

    def _prepare_or_error(self, gen: Generation, question: Any) -> Scenario | Decision:
        try:
            return self._prepare(gen, question)
        except OracleError as exc:
            return with_generation(error_decision(str(exc)), gen.number)
        except Exception as exc:  # noqa: BLE001 - select never raises; the rules' fault, worded as such
            return with_generation(error_decision(self._internal(gen, exc)), gen.number)

    def _resolve(self, gen: Generation, prepared: PreparedScenario) -> Scenario | Decision:
        """A prepared question under generation `gen`: what the rules supplied is resolved again, once per
        generation (kept in the question and in the generation's cache of questions)."""
        frozen = prepared.frozen
        found = gen.prepared.get(frozen) if frozen is not None else None
        if found is None:
            found = self._prepare_or_error(gen, prepared.question())
            if frozen is not None:
                gen.prepared[frozen] = found
        if isinstance(found, Scenario):
            prepared[11][0] = (gen, found)
        return found

    @staticmethod
    def _internal(gen: Generation, exc: BaseException) -> str:
        return (f"rules generation {gen.number} failed on this question ({type(exc).__name__}: {exc}); the rules "
                "validate but cannot be evaluated here: report it with the question")

    def _count(self, gen: Generation, decision: Decision) -> Decision:
        """Count an answer whose outcome is error, invalid or unsupported (stats()), and return it."""
        with self._stats_lock:
            counts = self._failed_answers.get(gen.number)
            if counts is None:
                counts = self._failed_answers[gen.number] = dict.fromkeys(FAILED_OUTCOMES, 0)
                for old in sorted(self._failed_answers)[:-_KEPT_STATS]:
                    del self._failed_answers[old]
            counts[decision.outcome] = counts.get(decision.outcome, 0) + 1
        return decision

    def _answer(self, gen: Generation, key: tuple[Scenario, str | None, int | None, str | None], sc: Scenario,
                model: str | None, layer: int | None, role: str | None) -> Decision:
        """The cache miss: find the override, answer (or reuse the answer of a layer with the same override),
        log a new decision. `key`: the cache key (the question as asked), `sc` the Scenario it is answered as."""
        failed = gen.failed.get(key)
        if failed is not None:
            return self._count(gen, failed)
        override = gen.overrides.find(sc.policy, model, layer, role) if gen.overrides is not None else None
        decided = gen.decided
        decision = decided.get((sc, override))
        if decision is None:
            try:
                decision = with_generation(gen.oracle.select_uncached(sc, override), gen.number)
            except Exception as exc:  # noqa: BLE001 - select never raises
                decision = with_generation(error_decision(self._internal(gen, exc)), gen.number)
            if len(decided) >= CACHE_SIZE:
                decided.clear()
            decided[(sc, override)] = decision
            context = {k: v for k, v in (("model", model), ("layer", layer), ("role", role)) if v is not None}
            self.decisions.record(sc, decision, override=override.provenance if override else None,
                                  context=context, rules=gen.rules)
        cache = gen.answers if decision.outcome in ("selected", "none") else gen.failed
        if len(cache) >= CACHE_SIZE:
            cache.clear()
        cache[key] = decision
        return decision if cache is gen.answers else self._count(gen, decision)

    def stats(self) -> dict[str, Any]:
        """A metrics snapshot: the serving generation, the last reload problem, reloads by result, per
        generation the answers given with outcome error, invalid and unsupported (so an outage shows), and per
        installed generation how long it took to serve: `seen_to_install` (from the first poll that saw its
        files to the install) and `change_to_install` (from the filesystem's stamp of the change, so the wait
        for that poll included; None where stamps are not trusted)."""
        gen = self._generation
        with self._stats_lock:
            answers = {n: dict(c) for n, c in self._failed_answers.items()}
            reloads = dict(self._reloads)
            latencies = {n: dict(x) for n, x in self._latencies.items()}
        return {"generation": gen.number, "serving_since": gen.loaded_at, "last_error": self.last_error,
                "manifest_version": gen.manifest_version, "reloads": reloads, "failed_answers": answers,
                "reload_seconds": latencies}


    # ------------------------------------------------------------------ watching
    def watch(self, interval: float = POLL_INTERVAL) -> None:
        """Poll for changed files every `interval` seconds in daemon threads (idempotent)."""
        if self._watcher is not None and any(t.is_alive() for t in self._watcher):
            return
        self._stop.clear()
        self._due = time.monotonic() + interval

        def loop() -> None:
            # Polls start at most `interval` apart (start to start), made by whichever of WAKERS threads wakes
            # first. Waking costs a wait for the GIL, long when threads select in tight loops (one of 9
            # contenders, a handoff per switch interval, and now and then a far longer wait): each waker sets
            # its timer that much early (the longest of its last 16 waits, at most 0.6 interval), and a poll
            # needs only one of them in time, so one long wait does not make the poll late.
            lateness = deque([0.0], maxlen=16)
            while True:
                lead = min(max(lateness), 0.6 * interval)
                timer = self._due - lead
                if self._stop.wait(max(0.0, timer - time.monotonic())):
                    return
                woke = time.monotonic()
                lateness.append(max(0.0, woke - timer))
                with self._wake_lock:
                    if woke < self._due - 0.6 * interval:
                        continue  # another waker polled meanwhile
                    self._due = woke + interval
                try:
                    self.poll()
                except Exception:  # the watcher must outlive any surprise; the error is logged
                    log.exception("moe-oracle: rule watcher: unexpected error (still serving generation %d)",
                                  self._generation.number)

        self._watcher = tuple(threading.Thread(target=loop, name=f"moe-oracle-rule-watcher-{k}", daemon=True)
                              for k in range(WAKERS))
        for t in self._watcher:
            t.start()

    def close(self) -> None:
        """Stop watching and close the audit log."""
        self._stop.set()
        for t in self._watcher or ():
            t.join(timeout=5)
        self._watcher = None
        self.decisions.close()

    def __enter__(self) -> RuleStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_default: RuleStore | None = None
_default_lock = threading.Lock()


def default_store(**options: Any) -> RuleStore:
    """The process's one RuleStore (the shipped rules and detected facts unless `options` say otherwise on
    the first call); later calls return the same store and refuse different options."""
    global _default
    with _default_lock:
        if _default is None:
            _default = RuleStore(**options)
            _default._options = options
        elif options and options != getattr(_default, "_options", None):
            raise ValueError("default_store: the process's store already exists with other options "
                             f"({getattr(_default, '_options', {})}); pass none to get it, or build a RuleStore")
        return _default


__all__ = ["CACHE_SIZE", "FAILED_OUTCOMES", "MANIFEST", "MAX_PAUSE", "POLL_INTERVAL", "SETTLE", "Generation",
           "ReloadResult", "RuleStore", "default_store"]
