"""The one registry of code that rules name: a backend's `converter` and `runner` (`module:attr`).

Allowed modules: the `backends` package, and packages registered as entry points of group
`moe_oracle.backends` (a plugin's entry point value names its package, e.g. `acme_moe`).

`problem(path)` validates a path WITHOUT importing anything (the oracle never pulls in torch):
it locates the module file through import specs and scans its source for a top-level
`def`/`class`/assignment/import of the attribute. `resolve(path)` imports it on first use.
"""
from __future__ import annotations

import contextlib
import contextvars
import importlib
import importlib.machinery
import importlib.util
import re
import threading
from collections.abc import Iterator
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from .errors import did_you_mean

GROUP = "moe_oracle.backends"
BUILTIN_PACKAGE = "backends"
_PATH = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*):([A-Za-z_][A-Za-z0-9_]*)$")


class RegistryError(LookupError):
    """A converter/runner path cannot be used; the message names the path and the fix."""


@cache
def plugin_entry_points() -> tuple[tuple[str, str, str], ...]:
    """(entry point name, package, distribution) of every registration in the group, from metadata only
    (nothing imported); oracle.plugins reads each package's rule fragments from these."""
    from importlib.metadata import entry_points

    found = {(ep.name, ep.value.split(":")[0].strip(), getattr(ep.dist, "name", None) or "?")
             for ep in entry_points(group=GROUP)}
    return tuple(sorted(found))


def plugin_packages() -> tuple[str, ...]:
    """Top-level packages registered under the entry point group (read from metadata, nothing imported)."""
    return tuple(sorted({package for _, package, _ in plugin_entry_points()}))


# Registering an entry point is not enough to let rules name a package's code: a plugin's package becomes
# nameable only once its fragments validated (oracle.plugins accepts it), and while they are being checked.
_accepted: set[str] = set()
_checking: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("moe_oracle_checking", default=())
_accepted_lock = threading.Lock()


def accept(package: str) -> None:
    """`package` (of a plugin whose fragments validated) may be named by rules from now on in this process."""
    with _accepted_lock:
        _accepted.add(package)


@contextlib.contextmanager
def checking(package: str) -> Iterator[None]:
    """While a plugin's fragments are validated, its own package may be named (in this thread only)."""
    token = _checking.set((*_checking.get(), package))
    try:
        yield
    finally:
        _checking.reset(token)


def allowed_packages() -> tuple[str, ...]:
    """`backends`, the packages of accepted plugins, and the one of a plugin being checked."""
    with _accepted_lock:
        extra = set(_accepted)
    registered = set(plugin_packages())
    return (BUILTIN_PACKAGE, *sorted((extra | set(_checking.get())) & registered))


def split(path: str) -> tuple[str, str]:
    """('module', 'attr') of 'module:attr'; RegistryError when it is not of that form."""
    found = _PATH.match(path) if isinstance(path, str) else None
    if found is None:
        raise RegistryError(f"{path!r} is not a 'module:attribute' path, e.g. "
                            f"backends.runners.emulation:EmulationRunner")
    return found.group(1), found.group(2)


def package_dir(package: str) -> str | None:
    """The directory of an installed package (where a plugin keeps its rule fragments), found without importing it."""
    origin = _module_file(package)
    return str(Path(origin).parent) if origin is not None and Path(origin).name == "__init__.py" else None


def _module_file(module: str) -> str | None:
    """The source file of `module`, found without executing any package __init__."""
    parts = module.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return None
    for part in parts[1:]:
        locations = spec.submodule_search_locations if spec is not None else None
        if not locations:
            return None
        spec = importlib.machinery.PathFinder.find_spec(part, list(locations))
    return spec.origin if spec is not None and spec.has_location else None


# top-level def/class names and assigned names: the candidates of a did-you-mean
_TOP_LEVEL = re.compile(r"^(?:(?:async\s+)?def|class)\s+([A-Za-z_]\w*)|^([A-Za-z_]\w*)\s*(?::[^=\n]*)?=(?!=)",
                        re.MULTILINE)


def _defines(source: str, attr: str) -> bool:
    name = re.escape(attr)
    top_level = re.compile(
        rf"^(?:(?:async\s+)?def\s+{name}\b|class\s+{name}\b|{name}\s*(?::[^=\n]*)?=(?!=)"
        rf"|from\s+\S+\s+import\s+(?:.*[\s,(])?{name}\b|import\s+\S+\s+as\s+{name}\b)", re.MULTILINE)
    return top_level.search(source) is not None


def problem(path: str) -> str | None:
    """Why `path` cannot name a converter/runner, or None when it can. Never imports the module."""
    return _problem(path, allowed_packages())


@lru_cache(maxsize=256)
def _problem(path: str, allowed: tuple[str, ...]) -> str | None:
    try:
        module, attr = split(path)
    except RegistryError as exc:
        return str(exc)
    if not any(module == root or module.startswith(root + ".") for root in allowed):
        return (f"'{path}': module '{module}' is outside the allowed packages ({', '.join(allowed)}); "
                f"put the code under backends/, or in the package of a plugin (entry point group {GROUP}) "
                "whose fragments validate")
    origin = _module_file(module)
    if origin is None:
        return f"'{path}': module '{module}' does not exist; create it or fix the path"
    try:
        with open(origin, encoding="utf-8") as fh:
            source = fh.read()
    except OSError as exc:
        return f"'{path}': cannot read {origin} ({exc.strerror})"
    if not _defines(source, attr):
        close = did_you_mean(attr, [a or b for a, b in _TOP_LEVEL.findall(source)])
        return f"'{path}': module '{module}' defines no top-level '{attr}'{close}; define it or fix the path"
    return None


def clear_cache() -> None:
    """Forget every answer of `problem` and every accepted plugin package (tests start from a clean process)."""
    _problem.cache_clear()
    with _accepted_lock:
        _accepted.clear()


def resolve(path: str) -> Any:
    """Import and return the object `path` names (this is where torch may be imported)."""
    found = problem(path)
    if found is not None:
        raise RegistryError(found)
    module, attr = split(path)
    obj = getattr(importlib.import_module(module), attr, None)
    if obj is None:
        raise RegistryError(f"'{path}': module '{module}' has no attribute '{attr}' after import")
    return obj
