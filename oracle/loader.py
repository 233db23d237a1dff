"""Stage 3: find a profile's rule files, parse and schema-check each, merge them into one RuleSet.

Profiles extend profiles (`extends:`), and a rules directory may extend another one
(top-level `extends:` in profiles.yaml, a path relative to it, or `builtin` for the shipped
rules). A later file may replace a named entry only when the entry says `override: true`;
anything else defined twice is an error naming both places.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import Diagnostic, RuleError, did_you_mean
from .resources import rules_dir
from .schema import SECTIONS, schema_diagnostics
from .yamlio import Located, load_yaml_file


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


def load_profile_index(root: Path, _seen: tuple[Path, ...] = ()) -> ProfileIndex:
    """profiles.yaml of `root`, with every profile's files resolved (extends followed)."""
    index_file = root / "profiles.yaml"
    doc = load_yaml_file(str(index_file), display_name(index_file))
    problems = schema_diagnostics(doc, "profiles.schema.json")
    if problems:
        raise RuleError(problems)
    data = doc.data
    inherited: dict[str, Profile] = {}
    if "extends" in data:
        parent = rules_dir() if data["extends"] == "builtin" else (root / data["extends"])
        if parent.resolve() in _seen + (root.resolve(),) or not (parent / "profiles.yaml").is_file():
            why = "extends itself" if (parent / "profiles.yaml").is_file() else "has no profiles.yaml"
            raise RuleError([doc.diag(("extends",), f"rules directory '{data['extends']}' {why}; "
                                                    "name a rules directory with a profiles.yaml, or 'builtin'")])
        inherited = dict(load_profile_index(parent, _seen + (root.resolve(),)).profiles)
    raw = data["profiles"]
    profiles = dict(inherited)

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
            path = (root / f).resolve()
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
    return ProfileIndex(root, data["default"], profiles, doc)


def unlisted_rule_files(index: ProfileIndex) -> list[Diagnostic]:
    """Rule files under the index's directory that no profile lists: they would be ignored without a word.
    (A subdirectory with its own profiles.yaml is another rules directory and is left alone.)"""
    listed = {f for p in index.profiles.values() for f in p.files}
    root = index.root.resolve()
    nested = {d.parent for d in root.rglob("profiles.yaml") if d.parent != root}
    out = []
    for path in sorted(root.rglob("*.y*ml")):
        if path.name == "profiles.yaml" or path.resolve() in listed or any(path.is_relative_to(n) for n in nested):
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


FileCache = dict[tuple[str, int, int], Located]


def load_checked(path: Path, cache: FileCache | None = None) -> Located:
    """One rule file, parsed and schema-checked; `cache` reuses files shared by several profiles."""
    stat = path.stat() if cache is not None and path.exists() else None
    key = (str(path), stat.st_mtime_ns, stat.st_size) if stat else None
    if cache is not None and key is not None and key in cache:
        return cache[key]
    doc = load_yaml_file(str(path), display_name(path))
    found = schema_diagnostics(doc)
    if found:
        raise RuleError(found)
    if cache is not None and key is not None:
        cache[key] = doc
    return doc


def load_ruleset_collecting(paths: list[Path], name: str, description: str,
                            cache: FileCache | None = None) -> tuple[RuleSet, list[Diagnostic]]:
    """Every file merged, schema-valid or not (YAML that does not parse is left out), with all problems so far.

    Validation uses this so that schema and cross-reference problems are reported in one run: a file
    with a schema error still contributes its names, which keeps the cross-reference check quiet about them."""
    docs: list[Located] = []
    problems: list[Diagnostic] = []
    for p in paths:
        try:
            docs.append(load_checked(p, cache))
        except RuleError as exc:
            problems.extend(exc.diagnostics)
            try:
                doc = load_yaml_file(str(p), display_name(p))
            except RuleError:
                continue
            if isinstance(doc.data, dict):
                docs.append(doc)
    rs, merged = merge(docs, name, description)
    return rs, problems + merged


def load_ruleset(paths: list[Path], name: str, description: str, cache: FileCache | None = None) -> RuleSet:
    """Load, schema-check and merge a list of rule files; every problem of every file raised together."""
    rs, problems = load_ruleset_collecting(paths, name, description, cache)
    if problems:
        raise RuleError(problems)
    return rs
