"""One version of a rules directory: every profile checked, tables compiled on demand, caches keyed by content.

    profiles.yaml -> ProfileIndex -> Snapshot.start -> check() every profile -> table(name) compiled once

A reload starts the next Snapshot from the previous one (`reuse`): parsed files, validated profiles and compiled
tables are keyed by the sha256 of every file they were built from (ProfileKey), so only what an edit touched is
parsed, checked and compiled again. The previous snapshot is never changed: it keeps serving until the swap.
"""
from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import registry
from .decision import Decision
from .errors import Diagnostic, RuleError
from .interpreter import CallPolicy
from .loader import (
    FileCache,
    FileKey,
    ProfileIndex,
    RuleSet,
    Source,
    load_ruleset,
    load_ruleset_collecting,
    read_source,
    unlisted_rule_files,
)
from .model import Table
from .semantics import semantic_diagnostics
from .tables import compile_ruleset

# one profile as loaded: its name and description, each file's content key, the plugin packages rules may name
ProfileKey = tuple[str, str, tuple[FileKey, ...], tuple[str, ...]]


def check_profile(files: list[Path], name: str, description: str, cache: FileCache | None = None,
                  sources: list[Source] | None = None) -> tuple[RuleSet, list[Diagnostic], set[str]]:
    """Load and check one profile's rule files: every schema, merge and cross-reference problem in one run,
    and the package vocabulary (declared, plus any the rules test). `sources`: the files as already read."""
    rs, problems = load_ruleset_collecting(files, name, description, cache, sources)
    if len(rs.files) < len(files):
        # a file that could not be read or parsed contributes no names: cross-references into it would be
        # ghost errors in untouched files, so its own error is the profile's only news until it parses
        return rs, problems, set(rs.sections["packages"])
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

    Keyed by content (ProfileKey), so a reload reuses them only for unchanged files: `files` (parsed,
    schema-checked), `valid` (profiles whose checks passed, with their package vocabulary) and `compiled`
    (tables). `sources` holds every rule file as read when the snapshot was built, so a profile compiled
    later is compiled from the text that was checked."""

    index: ProfileIndex
    tables: dict[str, Table] = field(default_factory=dict)
    answers: dict[Hashable, Decision] = field(default_factory=dict)  # Scenario, or (Scenario, PolicyRewrite)
    plans: dict[tuple[str | None, str], Any] = field(default_factory=dict)  # (profile, policy) -> oracle.api.Plan
    calls: dict[str, CallPolicy] = field(default_factory=dict)  # table name -> its `call` step hook
    files: FileCache = field(default_factory=dict)  # parsed rule files shared by the profiles listing them
    sources: dict[Path, Source] = field(default_factory=dict)
    valid: dict[ProfileKey, frozenset[str]] = field(default_factory=dict)
    compiled: dict[ProfileKey, Table] = field(default_factory=dict)

    @classmethod
    def start(cls, index: ProfileIndex, files: FileCache | None = None, reuse: Snapshot | None = None) -> Snapshot:
        """A new snapshot of `index` (not yet checked), starting from the content-keyed caches of `reuse`
        (copied: `reuse` keeps serving) and the parsed `files`."""
        start = dict(files if files is not None else reuse.files if reuse is not None else {})
        if reuse is None:
            return cls(index, files=start)
        return cls(index, files=start, valid=dict(reuse.valid), compiled=dict(reuse.compiled))

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

    def check(self) -> Snapshot:
        """Check every profile now (a server fails at start, not with `error` answers): one RuleError lists
        every problem. A profile whose files are unchanged since `reuse` is not checked again; what this
        version no longer lists is forgotten."""
        problems: list[Diagnostic] = []
        keys = set()
        for name, profile in self.index.profiles.items():
            key, sources = self.profile_sources(name)
            if key is not None and key in self.valid:
                keys.add(key)
                continue
            _, found, packages = check_profile(profile.files, name, profile.description, self.files, sources)
            problems.extend(found)
            if key is not None and not found:
                keys.add(key)
                self.valid[key] = frozenset(packages)
        problems.extend(unlisted_rule_files(self.index))
        if problems:
            raise RuleError(_sorted_problems(problems))
        used = {key for key, _ in self.sources.values()}
        for stale in [k for k in self.files if k not in used]:
            del self.files[stale]
        for cache in (self.valid, self.compiled):
            for stale_profile in [k for k in cache if k not in keys]:
                del cache[stale_profile]
        return self

    def compile(self, name: str) -> tuple[ProfileKey | None, Table]:
        """The table of profile `name` (known to the index): the one compiled before from the same files, or
        compiled now (RuleError if it does not check). The caller records it."""
        profile = self.index.profiles[name]
        key, sources = self.profile_sources(name)
        table = self.compiled.get(key) if key is not None else None
        if table is not None:
            return key, table
        packages = self.valid.get(key) if key is not None else None
        if packages is not None:  # checked by this snapshot (or unchanged since): merge and compile only
            rs = load_ruleset(profile.files, name, profile.description, self.files, sources)
            return key, compile_ruleset(rs, set(packages))
        return key, build_table(profile.files, name, profile.description, self.files, sources)
