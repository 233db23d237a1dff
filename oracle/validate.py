"""`moe-oracle validate`: check rule files and profiles, reporting every problem at file:line:col."""
from __future__ import annotations

from pathlib import Path

from .api import build_table
from .errors import Diagnostic, RuleError
from .loader import load_profile_index, unlisted_rule_files
from .resources import rules_dir


def _check_profiles(root: Path, only_with: Path | None = None) -> tuple[list[Diagnostic], set[Path]]:
    index = load_profile_index(root)
    problems: list[Diagnostic] = []
    files: set[Path] = set()
    for name, profile in index.profiles.items():
        paths = profile.files
        if only_with is not None and only_with.resolve() not in paths:
            continue
        files.update(paths)
        try:
            build_table(paths, name, profile.description)
        except RuleError as exc:
            problems.extend(exc.diagnostics)
    if only_with is None:
        problems.extend(unlisted_rule_files(index))
    return problems, files


def _profile_root(path: Path) -> Path | None:
    for parent in list(path.resolve().parents)[:3]:
        if (parent / "profiles.yaml").is_file():
            return parent
    return None


def validate_paths(paths: list[Path] | None, rules: str | None = None) -> tuple[list[Diagnostic], int]:
    """Diagnostics (deduplicated, in file order) and the number of files checked."""
    targets = paths or [Path(rules) if rules else rules_dir()]
    problems: list[Diagnostic] = []
    checked: set[Path] = set()
    for target in targets:
        try:
            if target.is_dir() and (target / "profiles.yaml").is_file():
                found, files = _check_profiles(target)
            elif target.is_dir():
                found, files = [], set()
                for f in sorted(target.rglob("*.y*ml")):
                    sub, sub_files = _validate_file(f)
                    found += sub
                    files |= sub_files
            elif target.is_file() or target.is_symlink():
                found, files = _validate_file(target)
            else:
                found, files = [Diagnostic(str(target), 1, 1, "no such file or directory")], set()
        except RuleError as exc:
            found, files = exc.diagnostics, {target}
        problems.extend(found)
        checked |= files
    unique = list(dict.fromkeys(problems))
    return sorted(unique, key=lambda d: (d.file, d.line, d.col)), len(checked)


def _validate_file(path: Path) -> tuple[list[Diagnostic], set[Path]]:
    try:
        path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python < 3.13)
        why = "is a symlink loop; make it a regular file" if path.is_symlink() else f"cannot be read ({exc})"
        return [Diagnostic(str(path), 1, 1, f"rule file {why}")], {path}
    if path.name == "profiles.yaml":
        return _check_profiles(path.parent)
    root = _profile_root(path)
    if root is not None:
        found, files = _check_profiles(root, only_with=path)
        if files:
            return found, files
    try:
        build_table([path], path.stem, "standalone file")
    except RuleError as exc:
        return exc.diagnostics, {path}
    return [], {path}
