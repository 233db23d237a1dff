"""Out-of-tree backends: packages registered under the entry point group `moe_oracle.backends`.

A plugin package holds, next to its code, a manifest `moe_oracle_plugin.yaml`
(schemas/plugin.schema.json) naming, per profile, rule fragment files that are loaded after the
profile's own files: new kernels, families (backends with `runner: plugin_pkg.module:fn`) and
policies (their candidates), or entries that replace shipped ones with `override: true`.

Nothing of a plugin is imported to use its rules (oracle.registry reads the entry points and
checks runner paths in the source). A fragment is validated exactly like a shipped rule file
(schema, cross-references, registry), on top of the profile it extends; it may name modules of
its own package and of `backends` only, and only an accepted plugin's package
may be named at all (oracle.registry). A broken plugin is reported once (logger `moe_oracle`,
WARNING, every problem with file:line) and skipped: the host keeps answering with the rest.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import registry
from .errors import Diagnostic, RuleError
from .loader import FileCache, Profile, ProfileIndex, display_name
from .schema import schema_diagnostics
from .yamlio import load_yaml_file

MANIFEST = "moe_oracle_plugin.yaml"
SCHEMA = "plugin.schema.json"
log = logging.getLogger("moe_oracle")
BuildTable = Callable[[list[Path], str, str, FileCache], Any]


@dataclass(frozen=True)
class Plugin:
    """One registered plugin and the fragment files it adds to each profile."""

    name: str  # the entry point name
    package: str
    distribution: str
    description: str
    manifest: Path
    files: dict[str, tuple[Path, ...]]  # profile -> fragments, in manifest order

    def __str__(self) -> str:
        return f"plugin '{self.name}' (package {self.package}, distribution {self.distribution})"


class PluginProblem(Exception):
    """A plugin cannot be used; the message names the plugin, the file:line and the fix."""


_reported: set[str] = set()
_reported_lock = threading.Lock()


def report_once(message: str) -> bool:
    """WARNING the first time `message` is seen in this process; True when it was logged."""
    with _reported_lock:
        if message in _reported:
            return False
        _reported.add(message)
    log.warning("moe-oracle: %s", message)
    return True


def discover() -> tuple[list[Plugin], list[str]]:
    """Every plugin registered under the group (manifests read and schema-checked), and the problems of those
    that cannot be read. Imports nothing."""
    plugins: list[Plugin] = []
    problems: list[str] = []
    for name, package, dist in registry.plugin_entry_points():
        try:
            plugins.append(_read(name, package, dist))
        except PluginProblem as exc:
            problems.append(str(exc))
        except Exception as exc:  # a plugin must never crash the host: anything unexpected is its problem too
            problems.append(f"plugin '{name}' (package {package}) skipped: {type(exc).__name__}: {exc}")
    return plugins, problems


def _read(name: str, package: str, dist: str) -> Plugin:
    where = f"plugin '{name}' (package {package}, distribution {dist})"
    root = registry.package_dir(package)
    if root is None:
        raise PluginProblem(f"{where} skipped: package '{package}' is not importable here (or is not a package "
                            f"directory); install it, or fix the entry point value of group {registry.GROUP}")
    manifest = Path(root) / MANIFEST
    if not manifest.is_file():
        raise PluginProblem(f"{where} skipped: it has no {MANIFEST} at {manifest}; add one naming its rule "
                            "fragments per profile (schemas/plugin.schema.json)")
    try:
        doc = load_yaml_file(str(manifest), display_name(manifest))
        found = schema_diagnostics(doc, SCHEMA)
    except RuleError as exc:
        found = exc.diagnostics
    if found:
        raise PluginProblem(_problem_text(where, found))
    files: dict[str, tuple[Path, ...]] = {}
    base = Path(root).resolve()
    for profile, names in doc.data["profiles"].items():
        paths = []
        for i, rel in enumerate(names):
            path = (base / rel).resolve()
            if not path.is_relative_to(base) or not path.is_file():
                why = "is outside the package" if not path.is_relative_to(base) else "does not exist"
                raise PluginProblem(_problem_text(where, [doc.diag(("profiles", profile, i),
                                                                   f"rule fragment '{rel}' {why}; list files of "
                                                                   f"the package directory {base}")]))
            paths.append(path)
        files[profile] = tuple(paths)
    return Plugin(name, package, dist, doc.data["description"], manifest, files)


def _problem_text(where: str, diagnostics: list[Diagnostic]) -> str:
    return f"{where} skipped:\n" + "\n".join(f"  {d}" for d in diagnostics)


def _foreign_modules(plugin: Plugin, cache: FileCache) -> list[Diagnostic]:
    """Converter/runner paths of the plugin's fragments outside its own package and `backends`."""
    from .loader import load_checked

    allowed = (plugin.package, registry.BUILTIN_PACKAGE)
    out = []
    for paths in plugin.files.values():
        for path in paths:
            doc = load_checked(path, cache)
            for family, fdata in (doc.data.get("families") or {}).items():
                for backend, bdata in (fdata.get("backends") or {}).items():
                    for role in ("converter", "runner"):
                        target = bdata.get(role) if isinstance(bdata, dict) else None
                        root = target.split(".")[0].split(":")[0] if isinstance(target, str) else None
                        if root is not None and root not in allowed:
                            out.append(doc.diag(("families", family, "backends", backend, role),
                                                f"{role} '{target}' names package '{root}'; {plugin} may name "
                                                f"only its own package or backends"))
    return out


def extend_index(index: ProfileIndex, plugins: list[Plugin], build: BuildTable, cache: FileCache | None = None,
                 report: Callable[[str], Any] = report_once) -> tuple[ProfileIndex, list[Plugin]]:
    """A new index whose profiles also load the fragments of every plugin that validates on top of them.

    Each plugin is checked against the profiles as extended by the plugins accepted before it
    (sorted by entry point name). One that fails is reported (once, by default) and left out;
    `index` is not changed."""
    cache = {} if cache is None else cache
    profiles = {name: Profile(p.name, p.description, list(p.files)) for name, p in index.profiles.items()}
    accepted: list[Plugin] = []
    for plugin in plugins:
        try:
            targets = {name: files for name, files in plugin.files.items() if name in profiles}
            for name in plugin.files:
                if name not in profiles:
                    report(f"{plugin}: profile '{name}' is not defined by the rules at "
                                f"{display_name(index.root)}; its fragments for it are not used")
            problems = _foreign_modules(plugin, cache)
            with registry.checking(plugin.package):
                for name, files in targets.items():
                    try:
                        build(profiles[name].files + list(files), name, profiles[name].description, cache)
                    except RuleError as exc:
                        problems.extend(exc.diagnostics)
        except RuleError as exc:
            problems = list(exc.diagnostics)
        except Exception as exc:  # never crash the host
            report(f"{plugin} skipped: {type(exc).__name__}: {exc}")
            continue
        if problems:
            report(_problem_text(str(plugin), list(dict.fromkeys(problems))))
            continue
        for name, files in targets.items():
            profiles[name] = Profile(name, profiles[name].description, profiles[name].files + list(files))
        registry.accept(plugin.package)
        accepted.append(plugin)
    return ProfileIndex(index.root, index.default, profiles, index.doc), accepted


def with_plugins(index: ProfileIndex, build: BuildTable, cache: FileCache | None = None) -> tuple[ProfileIndex,
                                                                                                    list[Plugin]]:
    """Discover the installed plugins, report the unreadable ones once, and extend `index` with the valid ones."""
    plugins, problems = discover()
    for message in problems:
        report_once(message)
    if not plugins:
        return index, []
    return extend_index(index, plugins, build, cache)
