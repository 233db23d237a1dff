"""A rule store for servers: one per process, cached, thread-safe, hot-reloadable, logged once.

    store = RuleStore("my-rules/", overrides="deploy/overrides.yaml", audit_log="decisions.jsonl")
    store.watch(interval=1.0)                     # or call store.poll() / store.reload() yourself
    d = store.select({"policy": "mxfp4-gpt-oss", "moe": {...}}, model="openai/gpt-oss-120b", layer=7)

Everything one version of the rules answers with is one immutable `Generation`: the Oracle (its
compiled tables), the overrides, the plugins in use, the content hashes of every file loaded
and the answer cache. `select` reads `self._generation` once and answers from that object only;
a reload builds a complete new Generation (every profile in use compiled, overrides cross-checked)
and then replaces the reference in one assignment. So no caller ever sees a half-loaded table, and
the cached path takes no lock: a dict lookup on (scenario, override) in the generation's cache.

A reload that fails keeps the previous generation, logs the error once (every problem as
file:line:col, logger `moe_oracle`) and returns it in the ReloadResult.

Change detection polls: it hashes the content of every file the generation was loaded from
(profiles.yaml, rule files, plugin fragments and manifests, the overrides file), ~0.5 ms for the
shipped rules. Why polling, not inotify: it is stdlib-only and portable (macOS, NFS, container
bind mounts, Kubernetes ConfigMaps, whose atomic `..data` symlink swap inotify watches on the
files miss), content hashes catch same-size edits within one mtime tick, and a server changes
rules rarely: a 1 s poll costs ~0.03% of one core. inotify would save that and some latency at the
price of a dependency (watchdog) or Linux-only ctypes code.
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from . import registry
from .api import Oracle, build_table
from .decision import Decision, error_decision
from .errors import Diagnostic, OracleError, RuleError, ScenarioError
from .loader import FileCache, ProfileIndex, display_name, load_profile_index
from .log import DecisionLog
from .overrides import Override, Overrides, load_overrides
from .plugins import Plugin, with_plugins
from .resources import rules_dir
from .scenario import Scenario

log = logging.getLogger("moe_oracle")
CACHE_SIZE = 8192  # answers per generation before the cache starts over


@dataclass(frozen=True)
class ReloadResult:
    """What a reload did: `ok` (the new rules serve), or the diagnostics of why the old ones still do."""

    ok: bool
    generation: int  # the generation serving after the call
    changed: bool  # a new generation was installed
    diagnostics: tuple[Diagnostic, ...] = ()
    error: str | None = None
    seconds: float = 0.0


@dataclass(eq=False)
class Generation:
    """One complete, consistent version of everything a question is answered from. Never modified after it is
    installed, except its caches (which only gain entries computed from this same generation)."""

    number: int
    oracle: Oracle
    overrides: Overrides | None
    plugins: tuple[Plugin, ...]
    hashes: Mapping[Path, str]  # every file loaded -> sha256 of the content loaded
    loaded_at: float
    # (scenario, model, layer, role) -> answer: the cached path, one lookup
    answers: dict[tuple[Scenario, str | None, int | None, str | None], Decision] = field(default_factory=dict)
    # (scenario, override) -> answer: layers that share an override share one computation and one audit line
    decided: dict[tuple[Scenario, Override | None], Decision] = field(default_factory=dict)
    packages: dict[str | None, dict[str, bool]] = field(default_factory=dict)  # profile -> detected packages
    prepared: dict[Any, Scenario] = field(default_factory=dict)  # frozen dict question -> its Scenario

    @cached_property
    def rules(self) -> dict[str, Any]:
        """The audit log's record of this version: generation number and each file's sha256."""
        return {"generation": self.number, "files": {display_name(p): h for p, h in self.hashes.items()}}


def _digest(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def _freeze(value: Any) -> Any:
    """A hashable copy of a JSON-like question (dicts as sorted item tuples), or None when it has other types:
    repeated dict questions then skip validation (the Scenario it gave is reused within the generation)."""
    if isinstance(value, Mapping):
        try:
            items = sorted(value.items())
        except TypeError:
            return None
        out = []
        for k, v in items:
            fv = _freeze(v)
            if fv is None and v is not None:
                return None
            out.append((k, fv))
        return (dict, tuple(out))
    if isinstance(value, (list, tuple)):
        parts = [_freeze(v) for v in value]
        if any(f is None and v is not None for f, v in zip(parts, value, strict=True)):
            return None
        return (list, tuple(parts))
    if value is None or isinstance(value, (str, int, float, bool)):
        return (type(value), value)  # the type keeps 1, 1.0 and True apart: validation treats them differently
    return None


def _index_files(index: ProfileIndex) -> list[Path]:
    """profiles.yaml of the root and of every directory it extends, then every rule file of every profile."""
    out = list(index.index_files or (index.root / "profiles.yaml",))
    for profile in index.profiles.values():
        out.extend(profile.files)
    return list(dict.fromkeys(out))


class RuleStore:
    """The oracle a server holds for its whole life (see the module docstring)."""

    def __init__(self, rules: str | Path | None = None, *, overrides: str | Path | None = None,
                 plugins: bool = True, platform: Mapping[str, Any] | None = None,
                 packages: Mapping[str, bool] | None = None, env: Mapping[str, str] | None = None,
                 profiles: Iterable[str] | None = None, audit_log: str | Path | None = None,
                 decision_log: DecisionLog | None = None):
        """`platform`, `packages`, `env`: the deployment facts filled into every question that does not give them;
        detected once here when None (packages per profile, from the ones its rules know). `profiles`: compiled
        (and so validated) at every load besides the default one. Raises RuleError when the first load fails."""
        self.root = Path(rules) if rules is not None else rules_dir()
        self.overrides_path = Path(overrides) if overrides is not None else None
        self.use_plugins = plugins
        self.decisions = decision_log or DecisionLog(audit_log)
        self._profiles = tuple(profiles or ())
        if platform is None:
            from .platform import detect_platform

            platform = detect_platform()
        self.platform = dict(platform)
        self._packages = dict(packages) if packages is not None else None
        self._environ = dict(env) if env is not None else dict(os.environ)
        self._reload_lock = threading.Lock()
        self._reported: set[str] = set()
        self.last_error: str | None = None
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()
        self._options: dict[str, Any] = {}  # what default_store() was called with
        self._generation = self._build(1, (), None)

    # ------------------------------------------------------------------ questions
    @property
    def generation(self) -> Generation:
        return self._generation

    def prepare(self, question: Mapping[str, Any]) -> Scenario:
        """The question with this deployment's platform, packages and env filled in, validated (ScenarioError)."""
        return self._prepare(self._generation, question)

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
        return gen.oracle.prepare(q)

    def select(self, question: Scenario | Mapping[str, Any], *, model: str | None = None, layer: int | None = None,
               role: str | None = None) -> Decision:
        """Answer one layer's question. Never raises for bad input (outcome 'error').

        `model`, `layer`, `role` pick a deployment override; the cached path is two dict lookups, no lock."""
        gen = self._generation
        if isinstance(question, Scenario):
            sc = question
        else:
            frozen = _freeze(question)
            found_sc = gen.prepared.get(frozen) if frozen is not None else None
            if found_sc is None:
                try:
                    found_sc = self._prepare(gen, question)
                except OracleError as exc:
                    return error_decision(str(exc))
                if frozen is not None:
                    if len(gen.prepared) >= CACHE_SIZE:
                        gen.prepared.clear()
                    gen.prepared[frozen] = found_sc
            sc = found_sc
        found = gen.answers.get((sc, model, layer, role))
        if found is not None:
            return found
        return self._answer(gen, sc, model, layer, role)

    def _answer(self, gen: Generation, sc: Scenario, model: str | None, layer: int | None,
                role: str | None) -> Decision:
        """The cache miss: find the override, answer (or reuse the answer of a layer with the same override),
        log a new decision."""
        override = gen.overrides.find(sc.policy, model, layer, role) if gen.overrides is not None else None
        decided = gen.decided
        decision = decided.get((sc, override))
        if decision is None:
            decision = gen.oracle.select_uncached(sc, override)
            if len(decided) >= CACHE_SIZE:
                decided.clear()
            decided[(sc, override)] = decision
            context = {k: v for k, v in (("model", model), ("layer", layer), ("role", role)) if v is not None}
            self.decisions.record(sc, decision, override=override.provenance if override else None,
                                  context=context, rules=gen.rules)
        answers = gen.answers
        if len(answers) >= CACHE_SIZE:
            answers.clear()
        answers[(sc, model, layer, role)] = decision
        return decision

    # ------------------------------------------------------------------ loading
    def _build(self, number: int, keep_profiles: Iterable[str], previous: Generation | None) -> Generation:
        """A complete generation: index (+ plugins), every profile in use compiled, overrides cross-checked.

        What `previous` parsed, validated and compiled is reused where every file's sha256 is unchanged: only
        edited files are parsed again, only the profiles listing them are checked and compiled again (mtime and
        size alone could miss an edit)."""
        started = time.time()
        reuse = previous.oracle.snapshot if previous is not None else None
        for _ in range(3):  # a file changed while it was read: read everything again
            index = load_profile_index(self.root)
            files = _index_files(index)
            before = {p: _digest(p) for p in files}
            cache: FileCache = dict(reuse.files) if reuse is not None else {}
            wanted = [n for n in dict.fromkeys([index.default, *self._profiles, *keep_profiles]) if n in index.profiles]
            plugins: list[Plugin] = []
            if self.use_plugins and registry.plugin_entry_points():
                for name in wanted:  # the rules alone must be valid, or a plugin would be blamed for them
                    p = index.profiles[name]
                    build_table(p.files, name, p.description, cache)
                index, plugins = with_plugins(index, build_table, cache)
                for plugin in plugins:
                    files.append(plugin.manifest)
                    for paths in plugin.files.values():
                        files.extend(paths)
            oracle = Oracle(self.root, index=index, files=cache, reuse=reuse)
            for name in wanted:
                oracle.table(name)  # compiled, so validated, before anyone can see it
            overrides = None
            if self.overrides_path is not None:
                files.append(self.overrides_path)
                overrides = load_overrides(self.overrides_path, oracle.snapshot.tables.values())
            hashes = {p: _digest(p) for p in dict.fromkeys(files) if p.is_file()}
            if all(hashes.get(k) == v for k, v in before.items()):
                return Generation(number, oracle, overrides, tuple(plugins), hashes, started)
        raise RuleError([Diagnostic(display_name(self.root), 1, 1, "rule files kept changing while they were "
                                                                    "loaded; the reload is retried at the next poll")])

    def _fingerprint(self) -> dict[Path, str]:
        """Content hashes of every file the serving generation was loaded from (missing files hash as '')."""
        out = {}
        for path in self._generation.hashes:
            try:
                out[path] = _digest(path)
            except OSError:
                out[path] = ""
        return out

    def changed(self) -> bool:
        """Whether any file the serving rules were loaded from changed since (content, not mtime)."""
        return self._fingerprint() != dict(self._generation.hashes)

    def reload(self) -> ReloadResult:
        """Load the rules again now; install them only if everything validates."""
        with self._reload_lock:
            return self._reload_locked()

    def poll(self) -> ReloadResult | None:
        """Reload if a file changed since the serving generation was loaded; None when nothing changed."""
        with self._reload_lock:
            if not self.changed():
                return None
            return self._reload_locked()

    def _reload_locked(self) -> ReloadResult:
        old = self._generation
        started = time.perf_counter()
        try:
            fresh = self._build(old.number + 1, old.oracle.snapshot.tables, old)
        except RuleError as exc:
            return self._failed(old, str(exc), tuple(exc.diagnostics), started)
        except (OracleError, OSError) as exc:
            return self._failed(old, f"{type(exc).__name__}: {exc}", (), started)
        self._generation = fresh  # the one place a new version becomes visible
        self.last_error = None
        log.info("moe-oracle: rules generation %d serving (%s, %d files, %d plugin(s)%s)", fresh.number,
                 display_name(self.root), len(fresh.hashes), len(fresh.plugins),
                 f", {len(fresh.overrides)} override(s)" if fresh.overrides is not None else "")
        return ReloadResult(True, fresh.number, True, seconds=time.perf_counter() - started)

    def _failed(self, old: Generation, message: str, diagnostics: tuple[Diagnostic, ...],
                started: float) -> ReloadResult:
        self.last_error = message
        if message not in self._reported:
            self._reported.add(message)
            log.error("moe-oracle: reload of %s failed; still serving rules generation %d:\n%s",
                      display_name(self.root), old.number, message)
        return ReloadResult(False, old.number, False, diagnostics, message, time.perf_counter() - started)

    # ------------------------------------------------------------------ watching
    def watch(self, interval: float = 1.0) -> None:
        """Poll for changed files every `interval` seconds in a daemon thread (idempotent)."""
        if self._watcher is not None and self._watcher.is_alive():
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    self.poll()
                except Exception:  # the watcher must outlive any surprise; the error is logged
                    log.exception("moe-oracle: rule watcher: unexpected error (still serving generation %d)",
                                  self._generation.number)

        self._watcher = threading.Thread(target=loop, name="moe-oracle-rule-watcher", daemon=True)
        self._watcher.start()

    def close(self) -> None:
        """Stop watching and close the audit log."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
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
