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

What a reload installs (docs/server.md, "Publishing rules"): a version whose files were unchanged over
the settle window (size and sha256, `settle` seconds), that validates, answers one question per policy
without raising, drops no profile, policy or backend the serving version has (unless `allow_removals`,
or a manifest `rules-manifest.json` with a new `version`), and whose manifest, when there is one, lists
the sha256 of the files on disk. Anything else keeps the previous generation serving; it is logged once
per content (every problem as file:line:col, logger `moe_oracle`), kept in `last_error` until the files
on disk are valid again or equal to the serving ones, and returned in the ReloadResult.

Change detection polls (every 0.25 s by default): the resolved target of the rules directory, every
symlink below it (a swapped `current -> v2` link or a ConfigMap's `..data`), and the sha256 of every rule
file below it and of every file the generation was loaded from. Why polling, not inotify: stdlib-only
and portable (macOS, NFS, container bind mounts, ConfigMaps), and content hashes catch same-size edits
within one mtime tick. Why selects pause while the store reads files: each read hands the GIL back, and
with busy selecting threads every hand-back cost the reader a whole scheduling round (an edit took ~20 s
to serve under 8 threads); a select waits at most `max_pause` seconds for it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from . import registry
from .api import Oracle, PreparedScenario, build_table, freeze
from .decision import Decision, error_decision, with_generation
from .errors import Diagnostic, OracleError, RuleError, ScenarioError
from .loader import FileCache, ProfileIndex, display_name, load_profile_index
from .log import DecisionLog
from .overrides import Override, Overrides, load_overrides
from .plugins import Plugin, with_plugins
from .resources import rules_dir
from .scenario import Scenario

log = logging.getLogger("moe_oracle")
CACHE_SIZE = 8192  # answers per generation before the cache starts over
POLL_INTERVAL = 0.25  # seconds between polls of watch(); an edit serves within two of them
SETTLE = 0.1  # seconds the files of a new version must stay unchanged before it is installed
MAX_PAUSE = 0.25  # the longest a select waits for the store reading files
MANIFEST = "rules-manifest.json"  # optional, written last: {"version": "...", "files": {"a.yaml": "<sha256>"}}
FAILED_OUTCOMES = ("error", "invalid", "unsupported")
_WATCHED_SUFFIXES = (".yaml", ".yml", ".json")
_MAX_WATCHED = 4096  # entries looked at under a rules directory per poll (a wrong root must not cost seconds)
_KEPT_STATS = 32  # generations whose answer counts stats() keeps

# path -> ("file", size, sha256, ends with a newline), ("link", target), ("dir", resolved path) or ("missing", why)
Observed = dict[str, tuple[Any, ...]]


@dataclass(frozen=True)
class ReloadResult:
    """What a reload did: `ok` (the new rules serve), or the diagnostics of why the old ones still do.
    `held_back`: the new files validate but were not installed (they drop what the serving rules have, or
    their manifest does not match them yet); `unsettled`: the files kept changing, tried again at the next poll."""

    ok: bool
    generation: int  # the generation serving after the call
    changed: bool  # a new generation was installed
    diagnostics: tuple[Diagnostic, ...] = ()
    error: str | None = None
    seconds: float = 0.0
    held_back: bool = False
    unsettled: bool = False


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
    observed: Observed = field(default_factory=dict)  # what the watched paths held when it was loaded
    watched_dirs: tuple[Path, ...] = ()
    manifest_version: str | None = None
    installed_at: float = 0.0  # time.time() when it started serving
    # (scenario, model, layer, role) -> answer: the cached path, one lookup ('selected' and 'none' answers only)
    answers: dict[tuple[Scenario, str | None, int | None, str | None], Decision] = field(default_factory=dict)
    # the other outcomes, kept apart so that each one given is counted (stats()) off the cached path
    failed: dict[tuple[Scenario, str | None, int | None, str | None], Decision] = field(default_factory=dict)
    # (scenario, override) -> answer: layers that share an override share one computation and one audit line
    decided: dict[tuple[Scenario, Override | None], Decision] = field(default_factory=dict)
    packages: dict[str | None, dict[str, bool]] = field(default_factory=dict)  # profile -> detected packages
    prepared: dict[Any, Scenario | Decision] = field(default_factory=dict)  # frozen question -> Scenario or error

    @cached_property
    def rules(self) -> dict[str, Any]:
        """The audit log's record of this version: generation number and each file's sha256."""
        return {"generation": self.number, "files": {display_name(p): h for p, h in self.hashes.items()}}


def _digest(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def _file_state(path: str) -> tuple[Any, ...]:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        return ("missing", exc.strerror or type(exc).__name__)
    return ("file", len(data), hashlib.sha256(data).hexdigest(), data.endswith(b"\n"))


def _observe(dirs: Iterable[Path], files: Iterable[Path]) -> Observed:
    """The state of everything a rules version is made of: each watched directory's resolved path, every
    symlink below it (its target, so a swapped link is seen even where both targets exist), every rule-like
    file below it and every file given (size and sha256). Hidden entries are skipped, but not symlinks such
    as a ConfigMap's `..data`."""
    out: Observed = {}
    budget = [_MAX_WATCHED]

    def walk(d: str, depth: int) -> None:
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError as exc:
            out[d] = ("missing", exc.strerror or type(exc).__name__)
            return
        for e in entries:
            budget[0] -= 1
            if budget[0] < 0:
                return
            try:
                if e.is_symlink():
                    out[e.path] = ("link", os.readlink(e.path))
                elif e.name.startswith("."):
                    continue
                elif e.is_dir(follow_symlinks=False):
                    if depth < 8:
                        walk(e.path, depth + 1)
                elif e.name.endswith(_WATCHED_SUFFIXES):
                    out[e.path] = _file_state(e.path)
            except OSError as exc:
                out[e.path] = ("missing", exc.strerror or type(exc).__name__)

    for d in dict.fromkeys(dirs):
        out["dir:" + str(d)] = ("dir", os.path.realpath(d))
        walk(str(d), 0)
    for f in files:
        key = str(f)
        if key not in out:
            out[key] = _file_state(key)
    return out


def _content_key(observed: Observed) -> str:
    """One sha256 of a version as observed: a broken version is reported once per content."""
    return hashlib.sha256(repr(sorted(observed.items())).encode()).hexdigest()


def _index_files(index: ProfileIndex) -> list[Path]:
    """profiles.yaml of the root and of every directory it extends, then every rule file of every profile."""
    out = list(index.index_files or (index.root / "profiles.yaml",))
    for profile in index.profiles.values():
        out.extend(profile.files)
    return list(dict.fromkeys(out))


class _HeldBack(Exception):
    """A version that validates but is not installed (see ReloadResult.held_back)."""


class RuleStore:
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
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()
        self._options: dict[str, Any] = {}  # what default_store() was called with
        self._pausing = False  # selects wait on _gate while the store reads files
        self._gate = threading.Event()
        self._gate.set()
        self._failed_answers: dict[int, dict[str, int]] = {}  # generation -> outcome -> answers given
        self._reloads = {"installed": 0, "failed": 0, "held_back": 0, "unsettled": 0}
        self._pending: tuple[Observed, float] | None = None  # files changed but not yet settled: (as seen, since)
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
        """A metrics snapshot: the serving generation, the last reload problem, reloads by result, and per
        generation the answers given with outcome error, invalid and unsupported (so an outage shows)."""
        gen = self._generation
        with self._stats_lock:
            answers = {n: dict(c) for n, c in self._failed_answers.items()}
            reloads = dict(self._reloads)
        return {"generation": gen.number, "serving_since": gen.loaded_at, "last_error": self.last_error,
                "manifest_version": gen.manifest_version, "reloads": reloads, "failed_answers": answers}

    # ------------------------------------------------------------------ loading
    @contextmanager
    def _reading(self) -> Iterator[None]:
        """Selects wait (at most max_pause each) while the store reads and builds: see the module docstring."""
        if self.max_pause <= 0:
            yield
            return
        self._gate.clear()
        self._pausing = True
        try:
            yield
        finally:
            self._pausing = False
            self._gate.set()

    def _watched(self, gen: Generation | None) -> tuple[tuple[Path, ...], list[Path]]:
        files = list(gen.hashes) if gen is not None else []
        if self.overrides_path is not None:
            files.append(self.overrides_path)
        dirs = gen.watched_dirs if gen is not None else (self.root,)
        return dirs, files

    def _build(self, number: int, keep_profiles: Iterable[str], previous: Generation | None) -> Generation:
        """A complete generation: index (+ plugins), every profile in use compiled, overrides cross-checked.

        What `previous` parsed, validated and compiled is reused where every file's sha256 is unchanged: only
        edited files are parsed again, only the profiles listing them are checked and compiled again (mtime and
        size alone could miss an edit). The files are observed before and after: a version that changed while
        it was read is read again."""
        started = time.time()
        reuse = previous.oracle.snapshot if previous is not None else None
        for _ in range(3):
            before = _observe(*self._watched(previous))
            index = load_profile_index(self.root)
            files = _index_files(index)
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
            manifest = self.root / MANIFEST
            if manifest.is_file():
                files.append(manifest)
            dirs = tuple(dict.fromkeys([self.root, *(f.parent for f in index.index_files)]))
            after = _observe(dirs, files)
            loaded = {Path(key[0]): key[2] for key, _ in oracle.snapshot.sources.values()}
            consistent = all(after.get(k) == v for k, v in before.items() if k in after) and all(
                after.get(str(p), ("", 0, ""))[2] == h for p, h in loaded.items())
            if consistent:
                listed = {str(f) for f in files}
                hashes = {Path(k): v[2] for k, v in after.items() if v[0] == "file" and k in listed}
                return Generation(number, oracle, overrides, tuple(plugins), hashes, started, after, dirs,
                                  self._manifest_version(manifest, after))
        raise RuleError([Diagnostic(display_name(self.root), 1, 1, "rule files kept changing while they were "
                                                                    "loaded; the reload is retried at the next poll")])

    def _manifest_version(self, manifest: Path, observed: Observed) -> str | None:
        """The manifest's `version`, once every file it lists holds the sha256 it gives (_HeldBack otherwise:
        the version is still being published). No manifest: None."""
        if str(manifest) not in observed or observed[str(manifest)][0] != "file":
            return None
        where = display_name(manifest)
        try:
            data = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise RuleError([Diagnostic(where, 1, 1, f"not a readable JSON manifest ({exc}); write "
                                                     '{"version": "...", "files": {"a.yaml": "<sha256>"}}')]) from None
        if not isinstance(data, dict) or not isinstance(data.get("version"), str) or \
                not isinstance(data.get("files", {}), dict):
            raise RuleError([Diagnostic(where, 1, 1, 'expected {"version": "<string>", "files": {"<path under the '
                                                     'rules directory>": "<sha256>"}} (files optional)')])
        for rel, digest in data.get("files", {}).items():
            path = (self.root / str(rel))
            state = _file_state(str(path))
            if state[0] != "file" or state[2] != digest:
                raise _HeldBack(f"{where} lists {rel} with sha256 {str(digest)[:12]}…, the file "
                                f"{'is missing' if state[0] != 'file' else 'has ' + state[2][:12] + '…'}: "
                                "the version is not completely published yet")
        return str(data["version"])

    def _check_fresh(self, old: Generation, fresh: Generation) -> None:
        """Held back (_HeldBack) when `fresh` drops a profile, policy or backend `old` serves, unless removals
        are allowed; then _smoke."""
        removed = [f"profile '{n}'" for n in old.oracle.index.profiles if n not in fresh.oracle.index.profiles]
        for name, table in old.oracle.snapshot.tables.items():
            new = fresh.oracle.snapshot.tables.get(name)
            if new is None or new is table:
                continue
            removed += [f"policy '{p}' of profile '{name}'" for p in table.policies if p not in new.policies]
            have = {b for f in new.families.values() for b in f.backends}
            removed += [f"backend '{b}' of profile '{name}'" for b in
                        sorted({b for f in table.families.values() for b in f.backends} - have)]
        new_version = fresh.manifest_version is not None and fresh.manifest_version != old.manifest_version
        if removed and not (self.allow_removals or new_version):
            raise _HeldBack(f"the new rules drop {', '.join(removed)} (a half-written file looks like this); not "
                            f"installed: if meant, publish {MANIFEST} with a new \"version\" (written last) or "
                            "pass RuleStore(allow_removals=True)")
        self._smoke(old, fresh)

    def _smoke(self, old: Generation | None, fresh: Generation) -> None:
        """RuleError when a policy of a newly compiled table raises on a plain question (rules that validate
        but cannot be evaluated, e.g. a condition nested too deep for Python's compiler): never installed."""
        for name, table in fresh.oracle.snapshot.tables.items():
            if old is not None and old.oracle.snapshot.tables.get(name) is table:
                continue
            for policy in table.policies:
                try:
                    sc = fresh.oracle.scenario({"policy": policy, "profile": name, "platform": self.platform})
                except OracleError:
                    continue
                try:
                    fresh.oracle.select_uncached(sc)
                except Exception as exc:  # noqa: BLE001 - the version must not serve
                    raise RuleError([Diagnostic(display_name(self.root), 1, 1,
                                                f"policy '{policy}' of profile '{name}' validates but fails when "
                                                f"answered ({type(exc).__name__}: {exc}); simplify it")]) from None

    def _fingerprint(self) -> Observed:
        """What the watched paths of the serving generation hold now."""
        return _observe(*self._watched(self._generation))

    def changed(self) -> bool:
        """Whether anything the serving rules were loaded from changed since (content, links, not mtime)."""
        with self._reading():
            return self._fingerprint() != self._generation.observed

    def reload(self) -> ReloadResult:
        """Load the rules again now (once their files were unchanged over the settle window); install them only
        if they pass every check. Never raises."""
        with self._reload_lock, self._reading():
            return self._reload_locked(None, wait=True)

    def poll(self, wait: bool = True) -> ReloadResult | None:
        """Reload if anything changed since the serving generation was loaded; None when nothing changed (then
        `last_error` is cleared: the files on disk are the serving ones). A change is built once the files were
        the same at two looks `settle` seconds apart: `wait` sleeps for the second look (selects wait meanwhile);
        without it (the watcher) a change seen for the first time is `unsettled` and the next poll looks again.
        Never raises."""
        with self._reload_lock, self._reading():
            try:
                now = self._fingerprint()
            except Exception as exc:  # noqa: BLE001 - poll never raises
                return self._failed(self._generation, f"{type(exc).__name__}: {exc}", (), time.perf_counter(), "")
            if now == self._generation.observed:
                self.last_error = None
                self._pending = None
                return None
            return self._reload_locked(now, wait)

    def _settle_for(self, observed: Observed | None) -> float:
        """Seconds the files must stay as observed: `settle`, or longer where a file looks cut short (empty, or
        not ending in a newline: a writer mid-line), so a writer that pauses mid-line is not taken as done.
        None: the longest it can be."""
        if self.settle > 0 and (observed is None or any(v[0] == "file" and not v[3] for v in observed.values())):
            return max(self.settle * 10, 1.0)
        return self.settle

    def _reload_locked(self, now: Observed | None, wait: bool) -> ReloadResult:
        """Wait for the files to settle, build, check, install (called with selects paused)."""
        old = self._generation
        started = time.perf_counter()
        content = ""
        give_up = time.monotonic() + max(4 * self.settle, 1.0) + self._settle_for(None)
        while time.monotonic() < give_up:  # a version that keeps changing: tried again at the next poll
            try:
                if now is None:
                    now = self._fingerprint()
                seen = time.monotonic()
                if self._pending is None or self._pending[0] != now:
                    self._pending = (now, seen)
                age, need = seen - self._pending[1], self._settle_for(now)
                if age < need:
                    if not wait:
                        return ReloadResult(False, old.number, False, seconds=time.perf_counter() - started,
                                            unsettled=True)
                    # look again soon (a writer that was mid-line is seen done), with selects waiting (max_pause
                    # each): this thread then wakes without a fight for the GIL
                    time.sleep(min(need - age, self.settle))
                    now = None
                    continue
            except Exception as exc:  # noqa: BLE001 - reload never raises
                return self._failed(old, f"{type(exc).__name__}: {exc}", (), started, "")
            try:
                fresh = self._build(old.number + 1, old.oracle.snapshot.tables, old)
                self._check_fresh(old, fresh)
                failure: tuple[str, tuple[Diagnostic, ...], bool] | None = None
            except RuleError as exc:
                failure = (str(exc), tuple(exc.diagnostics), False)
            except _HeldBack as exc:
                failure = (str(exc), (), True)
            except Exception as exc:  # noqa: BLE001 - reload never raises: unreadable or hostile files included
                failure = (f"{type(exc).__name__}: {exc}", (), False)
            try:  # what was read must be the settled version: else it changed meanwhile, and is looked at again
                if failure is None:
                    read_settled = all(fresh.observed.get(k, v) == v for k, v in now.items())
                else:
                    read_settled = self._fingerprint() == now
            except Exception:  # noqa: BLE001
                read_settled = False
            if read_settled:
                content = _content_key(now)
                break
            now = None
        else:
            with self._stats_lock:
                self._reloads["unsettled"] += 1
            return ReloadResult(False, old.number, False, (), "rule files kept changing; tried again at the next "
                                "poll", time.perf_counter() - started, unsettled=True)
        if failure is not None:
            message, diagnostics, held = failure
            return self._failed(old, message, diagnostics, started, content, held)
        fresh.installed_at = time.time()
        self._generation = fresh  # the one place a new version becomes visible
        self._pending = None
        self.last_error = None
        self._reported.clear()
        with self._stats_lock:
            self._reloads["installed"] += 1
        log.info("moe-oracle: rules generation %d serving (%s, %d files, %d plugin(s)%s%s)", fresh.number,
                 display_name(self.root), len(fresh.hashes), len(fresh.plugins),
                 f", {len(fresh.overrides)} override(s)" if fresh.overrides is not None else "",
                 f", manifest version {fresh.manifest_version}" if fresh.manifest_version else "")
        return ReloadResult(True, fresh.number, True, seconds=time.perf_counter() - started)

    def _failed(self, old: Generation, message: str, diagnostics: tuple[Diagnostic, ...], started: float,
                content: str, held_back: bool = False) -> ReloadResult:
        self.last_error = message
        with self._stats_lock:
            self._reloads["held_back" if held_back else "failed"] += 1
        key = content or message
        if key not in self._reported:
            self._reported.add(key)
            log.error("moe-oracle: reload of %s %s; still serving rules generation %d:\n%s",
                      display_name(self.root), "held back" if held_back else "failed", old.number, message)
        return ReloadResult(False, old.number, False, diagnostics, message, time.perf_counter() - started,
                            held_back=held_back)

    # ------------------------------------------------------------------ watching
    def watch(self, interval: float = POLL_INTERVAL) -> None:
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
