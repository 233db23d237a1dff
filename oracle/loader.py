"""Stage 3: find a profile's rule files, parse and schema-check each, merge them into one RuleSet.

Profiles extend profiles (`extends:`), and a rules directory may extend another one
(top-level `extends:` in profiles.yaml, a path relative to it, or `builtin` for the shipped
rules). A later file may replace a named entry only when the entry says `override: true`;
anything else defined twice is an error naming both places.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import Diagnostic, RuleError, did_you_mean
from .resources import rules_dir
from .schema import SECTIONS, schema_diagnostics
from .yamlio import Located, load_yaml_file, load_yaml_text, read_rule_file


@dataclass
class Entry:
    """One named definition with where it came from."""

    name: str
    data: Any
    doc: Located
    path: tuple[Any, ...]

    def at(self, *sub: Any) -> str:
        line, _ = self.doc.where(self.path + sub)
        return f"{self.doc.file}:{line}"

    def diag(self, message: str, *sub: Any) -> Diagnostic:
        return self.doc.diag(self.path + sub, message)


def _empty_sections() -> dict[str, dict[str, Entry]]:
    return {s: {} for s in SECTIONS}


@dataclass
class RuleSet:
    """The merged, schema-valid definitions of one profile (or of one standalone file)."""

    name: str
    description: str
    files: list[str]
    sections: dict[str, dict[str, Entry]] = field(default_factory=_empty_sections)


def _overrides(value: Any) -> bool:
    return isinstance(value, dict) and value.get("override") is True


def merge(docs: list[Located], name: str, description: str) -> tuple[RuleSet, list[Diagnostic]]:
    rs = RuleSet(name, description, [d.file for d in docs])
    problems: list[Diagnostic] = []
    for doc in docs:
        for section, items in (doc.data or {}).items():
            if section not in rs.sections:
                continue
            if not isinstance(items, dict):
                continue
            for key, value in items.items():
                existing = rs.sections[section].get(key)
                if existing is not None and not _overrides(value):
                    problems.append(doc.diag((section, key),
                                             f"{section} '{key}' is already defined at {existing.at()}; "
                                                             "each name is defined once per profile (add "
                                                             "'override: true' to replace it deliberately)"))
                    continue
                if existing is None and _overrides(value):
                    problems.append(doc.diag((section, key, "override"),
                                             f"{section} '{key}' overrides nothing: no earlier file of this profile "
                                             "defines it; remove 'override: true'"))
                    continue
                rs.sections[section][key] = Entry(key, value, doc, (section, key))
    return rs, problems


# ----------------------------------------------------------------- profiles


@dataclass
class Profile:
    name: str
    description: str
    files: list[Path]  # absolute, parents' files first


@dataclass
class ProfileIndex:
    root: Path
    default: str
    profiles: dict[str, Profile]
    doc: Located
    index_files: tuple[Path, ...] = ()  # profiles.yaml of `root`, then of each rules directory it extends


def load_profile_index(root: Path, _seen: tuple[Path, ...] = ()) -> ProfileIndex:
    """profiles.yaml of `root`, with every profile's files resolved (extends followed)."""
    index_file = root / "profiles.yaml"
    doc = load_yaml_file(str(index_file), display_name(index_file))
    problems = schema_diagnostics(doc, "profiles.schema.json")
    if problems:
        raise RuleError(problems)
    data = doc.data
    inherited: dict[str, Profile] = {}
    parent_files: tuple[Path, ...] = ()
    if "extends" in data:
        parent = rules_dir() if data["extends"] == "builtin" else (root / data["extends"])
        try:
            seen_before = parent.resolve() in _seen + (root.resolve(),)
        except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
            seen_before = False
        if seen_before or not (parent / "profiles.yaml").is_file():
            why = "extends itself" if (parent / "profiles.yaml").is_file() else "has no profiles.yaml"
            raise RuleError([doc.diag(("extends",), f"rules directory '{data['extends']}' {why}; "
                                                    "name a rules directory with a profiles.yaml, or 'builtin'")])
        parent_index = load_profile_index(parent, _seen + (root.resolve(),))
        inherited, parent_files = dict(parent_index.profiles), parent_index.index_files
    raw = data["profiles"]
    profiles = dict(inherited)
    real_root = root.resolve()

    def resolve(name: str, stack: tuple[str, ...]) -> Profile:
        if name not in raw:
            return profiles[name]
        spec = raw[name]
        files: list[Path] = []
        parent = spec.get("extends")
        if parent is not None:
            chain = (*stack, name)
            if parent in chain or (parent not in raw and parent not in inherited):
                known = [*raw, *inherited]
                why = f"profiles extend each other in a cycle ({' -> '.join((*chain, parent))})" if parent in chain \
                    else f"no such profile{did_you_mean(parent, known)}; extend one of {', '.join(known)}"
                raise RuleError([doc.diag(("profiles", name, "extends"), f"extends '{parent}': {why}")])
            files = list(resolve(parent, chain).files)
        for i, f in enumerate(spec["files"]):
            try:
                path = (root / f).resolve()
            except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
                raise RuleError([doc.diag(("profiles", name, "files", i),
                                          f"rule file '{f}' is a symlink loop; make it a regular file")]) from None
            if not path.is_relative_to(real_root):
                raise RuleError([doc.diag(("profiles", name, "files", i),
                                          f"rule file '{f}' resolves to {path}, outside the rules directory "
                                          f"{display_name(root)}; list files inside it (a rules directory that "
                                          "builds on another one says `extends:` in profiles.yaml)")])
            if not path.is_file():
                raise RuleError([doc.diag(("profiles", name, "files", i),
                                          f"rule file '{f}' does not exist under {display_name(root)}")])
            files.append(path)
        return Profile(name, spec["description"], files)

    if data["default"] not in raw and data["default"] not in inherited:
        raise RuleError([doc.diag(("default",), f"default profile '{data['default']}' is not defined"
                                                f"{did_you_mean(data['default'], [*raw, *inherited])}")])
    for name in raw:
        profiles[name] = resolve(name, ())
    return ProfileIndex(root, data["default"], profiles, doc, (index_file, *parent_files))


def unlisted_rule_files(index: ProfileIndex) -> list[Diagnostic]:
    """Rule files under the index's directory that no profile lists: they would be ignored without a word.
    (A subdirectory with its own profiles.yaml is another rules directory and is left alone.)"""
    listed = {f for p in index.profiles.values() for f in p.files}
    root = index.root.resolve()
    nested = {d.parent for d in root.rglob("profiles.yaml") if d.parent != root}
    out = []
    for path in sorted(root.rglob("*.y*ml")):
        try:
            real = path.resolve()
        except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
            out.append(Diagnostic(display_name(path), 1, 1, f"'{path.relative_to(root)}' is a symlink loop; "
                                                            "delete it or make it a regular file"))
            continue
        if path.name == "profiles.yaml" or real in listed or any(path.is_relative_to(n) for n in nested):
            continue
        out.append(Diagnostic(display_name(path), 1, 1, f"rule file '{path.relative_to(root)}' is listed by no "
                              f"profile of {display_name(root / 'profiles.yaml')}, so it is ignored; add it to a "
                              "profile's files or delete it"))
    return out


def display_name(path: Path) -> str:
    """How a rule file is named in messages and traces.

    Where the file really is, shipped rules included (an installed package's are under its
    oracle/_embedded/rules): relative to the working directory when below it (short, clickable),
    else absolute. In a source checkout run from its root that is rules/...
    """
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


# A rule file as read: (path, display name, sha256 of its bytes). The parse cache is keyed by content, never by
# mtime and size (an edit within one mtime tick, or a file replaced by one of the same size, is still seen).
FileKey = tuple[str, str, str]
FileCache = dict[FileKey, Located]  # parsed, schema-valid files: shared by the profiles listing them, and reloads
Source = tuple[FileKey, str]  # a file's key and its text, read once


def read_source(path: Path) -> Source:
    """One rule file's content key and text (RuleError naming the file when it cannot be read)."""
    name = display_name(path)
    raw, text = read_rule_file(path, name)
    return (str(path), name, hashlib.sha256(raw).hexdigest()), text


def load_checked(path: Path, cache: FileCache | None = None, source: Source | None = None) -> Located:
    """One rule file, parsed and schema-checked; `cache` reuses files whose content was parsed before.
    `source`: the file as already read (its key and text), so the key and the parse come from one read."""
    key, text = source if source is not None else read_source(path)
    if cache is not None:
        found = cache.get(key)
        if found is not None:
            return found
    doc = load_yaml_text(text, key[1])
    problems = schema_diagnostics(doc)
    if problems:
        raise RuleError(problems)
    if cache is not None:
        cache[key] = doc
    return doc


def load_ruleset_collecting(paths: list[Path], name: str, description: str, cache: FileCache | None = None,
                            sources: list[Source] | None = None) -> tuple[RuleSet, list[Diagnostic]]:
    """Every file merged, schema-valid or not (YAML that does not parse is left out), with all problems so far.

    Validation uses this so that schema and cross-reference problems are reported in one run: a file
    with a schema error still contributes its names, which keeps the cross-reference check quiet about them.
    `sources`: the files as already read, one per path."""
    docs: list[Located] = []
    problems: list[Diagnostic] = []
    for i, p in enumerate(paths):
        try:
            source = sources[i] if sources is not None else read_source(p)
        except RuleError as exc:
            problems.extend(exc.diagnostics)
            continue
        try:
            docs.append(load_checked(p, cache, source))
        except RuleError as exc:
            problems.extend(exc.diagnostics)
            try:
                doc = load_yaml_text(source[1], source[0][1])  # the names of a file with schema errors still count
            except RuleError:
                continue
            if isinstance(doc.data, dict):
                docs.append(doc)
    rs, merged = merge(docs, name, description)
    return rs, problems + merged


def load_ruleset(paths: list[Path], name: str, description: str, cache: FileCache | None = None,
                 sources: list[Source] | None = None) -> RuleSet:
    """Load, schema-check and merge a list of rule files; every problem of every file raised together."""
    rs, problems = load_ruleset_collecting(paths, name, description, cache, sources)
    if problems:
        raise RuleError(problems)
    return rs
