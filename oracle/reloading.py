"""How a RuleStore loads, checks and installs a version of the rules (oracle.store's reload machinery).

A version is observed (`observe`: the resolved rules directory, every symlink below it, every rule-like file
below it and every file the serving generation was loaded from, by size and sha256), built once it has been
unchanged over the settle window (by the filesystem's stamp of the change, or by two looks), checked
(validation, removals, a smoke answer per new policy, the manifest) and installed in one assignment. Selects
wait (at most `max_pause` each) while this runs: see oracle/store.py's docstring for why.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import registry
from .api import Oracle, build_table
from .errors import Diagnostic, OracleError, RuleError
from .generation import (
    MANIFEST,
    Generation,
    HeldBack,
    Observed,
    ReloadResult,
    _file_state,
    _index_files,
    changed_at,
    content_key,
    observe,
)
from .loader import FileCache, display_name, load_profile_index
from .overrides import load_overrides
from .plugins import Plugin, with_plugins
from .yamlio import read_limited

log = logging.getLogger("moe_oracle")
SETTLE = 0.1  # seconds the files of a new version must stay unchanged before it is installed
_KEPT_STATS = 32  # generations whose numbers stats() keeps


class Reloading:
    """RuleStore's loading and reloading (a mixin: the settings and state live on the store)."""

    root: Path
    overrides_path: Path | None
    use_plugins: bool
    _profiles: tuple[str, ...]
    platform: dict[str, Any]
    settle: float
    allow_removals: bool
    max_pause: float
    last_error: str | None
    _generation: Generation
    _pending: tuple[Observed, float, float, float | None] | None
    _latencies: dict[int, dict[str, float | None]]
    _reported: set[str]
    _reload_lock: threading.Lock
    _stats_lock: threading.Lock
    _reloads: dict[str, int]
    _pausing: bool
    _gate: threading.Event

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
            before = observe(*self._watched(previous))
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
            after = observe(dirs, files)
            loaded = {Path(key[0]): key[2] for key, _ in oracle.snapshot.sources.values()}
            consistent = all(after.get(k) == v for k, v in before.items() if k in after) and all(
                after.get(str(p), ("missing",))[0] == "file" and after[str(p)][2] == h for p, h in loaded.items())
            if consistent:
                listed = {str(f) for f in files}
                hashes = {Path(k): v[2] for k, v in after.items() if v[0] == "file" and k in listed}
                return Generation(number, oracle, overrides, tuple(plugins), hashes, started, after, dirs,
                                  self._manifest_version(manifest, after))
        raise RuleError([Diagnostic(display_name(self.root), 1, 1, "rule files kept changing while they were "
                                                                    "loaded; the reload is retried at the next poll")])

    def _manifest_version(self, manifest: Path, observed: Observed) -> str | None:
        """The manifest's `version`, once every file it lists holds the sha256 it gives (HeldBack otherwise:
        the version is still being published). No manifest: None."""
        if str(manifest) not in observed or observed[str(manifest)][0] != "file":
            return None
        where = display_name(manifest)
        try:
            data = json.loads(read_limited(manifest, where)[1])  # over the limit or not UTF-8: its own RuleError
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
                raise HeldBack(f"{where} lists {rel} with sha256 {str(digest)[:12]}…, the file "
                                f"{'is missing' if state[0] != 'file' else 'has ' + state[2][:12] + '…'}: "
                                "the version is not completely published yet")
        return str(data["version"])

    def _check_fresh(self, old: Generation, fresh: Generation) -> None:
        """Held back (HeldBack) when `fresh` drops a profile, policy or backend `old` serves, unless removals
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
            raise HeldBack(f"the new rules drop {', '.join(removed)} (a half-written file looks like this); not "
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
        return observe(*self._watched(self._generation))

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
        `last_error` is cleared: the files on disk are the serving ones). A change is built once the files have
        been as seen for `settle` seconds: since the filesystem stamped the change (a change seen late is built
        at once), or since the first look that saw them so. Before that, `wait` (the watcher's way) sleeps until
        the window ends and looks again, with selects waiting; without it the result is `unsettled` and the next
        poll looks again. Never raises."""
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

    @staticmethod
    def _quiet_for(pending: tuple[Observed, float, float, float | None], seen: float) -> float:
        """Seconds the files have been as `pending` observed them, at monotonic time `seen`: since the first
        look that saw them so, or since the filesystem stamped the change, whichever is longer. The stamp is
        why a change first seen late (a poll delayed by a busy machine) is built at once instead of after one
        more window; the first look is what holds where stamps are not trusted (see generation.changed_at)."""
        _, first_look, first_wall, stamp = pending
        since_look = seen - first_look
        if stamp is None:
            return since_look
        return max(since_look, first_wall + since_look - stamp)

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
                    self._pending = (now, seen, time.time(), changed_at(old.observed, now))
                quiet, need = self._quiet_for(self._pending, seen), self._settle_for(now)
                if quiet < need:
                    if not wait:
                        return ReloadResult(False, old.number, False, seconds=time.perf_counter() - started,
                                            unsettled=True)
                    # look again once the window has passed (a writer that was mid-line is seen done), with
                    # selects waiting (max_pause each): this thread then wakes without a fight for the GIL
                    time.sleep(min(need - quiet, self.settle))
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
            except HeldBack as exc:
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
                content = content_key(now)
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
        if self._pending is not None:
            fresh.change_seen, fresh.changed_at = self._pending[2], self._pending[3]
        self._generation = fresh  # the one place a new version becomes visible
        self._pending = None
        self.last_error = None
        self._reported.clear()
        with self._stats_lock:
            self._reloads["installed"] += 1
            self._latencies[fresh.number] = {
                "seen_to_install": None if fresh.change_seen is None else fresh.installed_at - fresh.change_seen,
                "change_to_install": None if fresh.changed_at is None else fresh.installed_at - fresh.changed_at}
            for number in sorted(self._latencies)[:-_KEPT_STATS]:
                del self._latencies[number]
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
