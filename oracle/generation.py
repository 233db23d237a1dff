"""One version of the rules as a RuleStore serves it (Generation), what a reload did (ReloadResult), and how the
files a version is made of are observed (`observe`): the resolved rules directory, every symlink below it, every
rule-like file below it and every file given, by size and sha256.
"""
from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from .api import Oracle
from .decision import Decision
from .errors import Diagnostic
from .limits import MAX_FILE_BYTES
from .loader import ProfileIndex, display_name
from .overrides import Override, Overrides
from .plugins import Plugin
from .scenario import Scenario

MANIFEST = "rules-manifest.json"  # optional, written last: {"version": "...", "files": {"a.yaml": "<sha256>"}}
_WATCHED_SUFFIXES = (".yaml", ".yml", ".json")
_MAX_WATCHED = 4096  # entries looked at under a rules directory per poll (a wrong root must not cost seconds)

# path -> ("file", size, sha256, ends with a newline), ("over the limit", size, mtime), ("link", target),
# ("dir", resolved path) or ("missing", why)
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
    change_seen: float | None = None  # time.time() when a poll first saw the change it installs
    changed_at: float | None = None  # the filesystem's time of that change (None: timestamps not trusted)
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


def _file_state(path: str) -> tuple[Any, ...]:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:  # the loader refuses it: not read further (or hashed) at every poll
                stat = os.fstat(fh.fileno())
                return ("over the limit", stat.st_size, stat.st_mtime_ns)
    except OSError as exc:
        return ("missing", exc.strerror or type(exc).__name__)
    return ("file", len(data), hashlib.sha256(data).hexdigest(), data.endswith(b"\n"))


def observe(dirs: Iterable[Path], files: Iterable[Path]) -> Observed:
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


_CLOCK_SLACK = 0.02  # seconds a file timestamp may lag the write (Linux stamps with a coarse, per-tick clock)


def changed_at(old: Observed, now: Observed) -> float | None:
    """When the filesystem says the latest of the differences between `old` and `now` was made (time.time()
    scale): the newest mtime/ctime of every path that differs and of its directory (a rename or a removal
    stamps the directory). None where the stamps cannot be trusted: a path whose stamps are whole seconds (a
    coarse filesystem), or one stamped in the future (a skewed clock); the caller then waits the settle window
    from its own first sight."""
    newest = 0
    for key in {k for k in old.keys() | now.keys() if old.get(k) != now.get(k)}:
        path = key[4:] if key.startswith("dir:") else key
        for p in (path, os.path.dirname(path)):
            try:
                st = os.lstat(p)
            except OSError:
                continue
            stamp = max(st.st_mtime_ns, st.st_ctime_ns)
            if stamp % 1_000_000_000 == 0:
                return None
            newest = max(newest, stamp)
    if newest == 0:
        return None
    when = newest / 1e9 + _CLOCK_SLACK
    return when if when <= time.time() + _CLOCK_SLACK else None


def content_key(observed: Observed) -> str:
    """One sha256 of a version as observed: a broken version is reported once per content."""
    return hashlib.sha256(repr(sorted(observed.items())).encode()).hexdigest()


def _index_files(index: ProfileIndex) -> list[Path]:
    """profiles.yaml of the root and of every directory it extends, then every rule file of every profile."""
    out = list(index.index_files or (index.root / "profiles.yaml",))
    for profile in index.profiles.values():
        out.extend(profile.files)
    return list(dict.fromkeys(out))


class HeldBack(Exception):
    """A version that validates but is not installed (see ReloadResult.held_back)."""
