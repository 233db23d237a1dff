"""Measured launch configs as data: shipped tables (read-only, in tables/) and the user's (written by
`moe-oracle tune`), schema-checked, keyed by structured fields - the layer shape, a T range, the µs measured and
the run that measured it.

A table serves the GPUs whose device name contains its `gpu` (as a word: "H100" serves "NVIDIA H100 80GB HBM3",
not "GH100"). A shipped table may `extends` another shipped table of the same architecture: it lists only the
entries where its GPU differs, and every other entry comes from the parent, so the two cannot drift apart.
Lookup order: user tables, then the shipped table and its parents, then the heuristics (heuristics.py).
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

from backends.triton_moe.tuning.configs import (
    GEMM1_ONLY_FIELDS,
    MIN_HALF_ROWS_BLOCK_M,
    SHAPE_FIELDS,
    LaunchConfig,
    MoEConfig,
    Problem,
    tail_rows_problem,
)

TABLE_DIR = Path(__file__).resolve().parent / "tables"
TABLE_KIND = "triton-moe-tuning"
TABLE_VERSION = 1
#: Where `moe-oracle tune` writes and the runtime reads user tables; default USER_DIR_DEFAULT.
USER_DIR_ENV = "MOE_ORACLE_TUNING_DIR"
USER_DIR_DEFAULT = "~/.cache/moe-oracle/tuning"  # under $XDG_CACHE_HOME when that is set
#: First line of every table: the schema ships next to the shipped tables (a copy of schemas/, tested identical).
MODELINE = "# yaml-language-server: $schema=./tuning.schema.json\n"


class TuningTableError(ValueError):
    """A broken or foreign tuning table; the message names the file and the entry."""


def user_table_dir() -> Path:
    """$MOE_ORACLE_TUNING_DIR, else $XDG_CACHE_HOME/moe-oracle/tuning, else ~/.cache/moe-oracle/tuning."""
    if os.environ.get(USER_DIR_ENV):
        return Path(os.environ[USER_DIR_ENV]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "moe-oracle" / "tuning"
    return Path(USER_DIR_DEFAULT).expanduser()


def _schema_path() -> Path:
    here = Path(__file__).resolve()
    for candidate in (TABLE_DIR, here.parents[3] / "schemas", here.parents[3] / "oracle" / "_embedded" / "schemas"):
        if (candidate / "tuning.schema.json").is_file():
            return candidate / "tuning.schema.json"
    raise FileNotFoundError("tuning.schema.json not found next to the tables (tuning/tables/ or schemas/)")


@functools.cache
def _validator():
    import jsonschema

    return jsonschema.Draft202012Validator(json.loads(_schema_path().read_text()))


def validate_table(table, origin: str) -> None:
    """Schema check plus what a schema cannot say; raises TuningTableError naming `origin` and the entry."""
    if not isinstance(table, dict) or table.get("table") != TABLE_KIND:
        raise TuningTableError(f"{origin}: not a moe-oracle tuning table (it needs `table: {TABLE_KIND}` at the top; "
                               f"tables are written by `moe-oracle tune`); move the file out of the tuning directory")
    if table.get("version") != TABLE_VERSION:
        raise TuningTableError(f"{origin}: version {table.get('version')!r} is not {TABLE_VERSION}, the version this "
                               f"moe-oracle reads; re-run `moe-oracle tune` to rewrite it")
    errors = sorted(_validator().iter_errors(table), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        raise TuningTableError(f"{origin}: {where}: {first.message} (schema tuning.schema.json)")
    spans: dict = {}
    for index, entry in enumerate(table["entries"]):
        place = f"{origin}: entries/{index}"
        if entry["gemm1"]["block_m"] != entry["gemm2"]["block_m"]:
            raise TuningTableError(f"{place}: gemm1.block_m and gemm2.block_m must be equal (both GEMMs walk the "
                                   f"same per-expert row blocks)")
        for gemm in ("gemm1", "gemm2"):
            if entry[gemm].get("half_rows") and entry[gemm]["block_m"] < MIN_HALF_ROWS_BLOCK_M:
                raise TuningTableError(f"{place}: {gemm}.half_rows needs block_m >= {MIN_HALF_ROWS_BLOCK_M} (half a "
                                       f"block must still be a 16-row MMA tile); drop it or raise block_m")
            problem = tail_rows_problem(LaunchConfig(**entry[gemm]), 1 if gemm == "gemm1" else 2)
            if problem:
                raise TuningTableError(f"{place}: {gemm}: {problem}")
        for field in GEMM1_ONLY_FIELDS:
            if field in entry["gemm2"]:
                raise TuningTableError(f"{place}: gemm2.{field} is a GEMM1 setting (GEMM2 has no split epilogue and "
                                       f"no gate/up halves); move it to gemm1 or drop it")
        if entry.get("prefill_kernel") == "warp-specialized":
            from backends.triton_moe.warp_specialized import ws_shape_problem

            problem = ws_shape_problem(entry["shape"]["hidden_size"], entry["shape"]["intermediate_size"])
            if problem:
                raise TuningTableError(f"{place}: prefill_kernel warp-specialized: {problem}; drop the field (the "
                                       f"tile kernels then run)")
        low, high = _token_range(entry)
        if high < low:
            raise TuningTableError(f"{place}: tokens.max {high} is below tokens.min {low}")
        if not low <= entry["measured"]["tokens"] <= high:
            raise TuningTableError(f"{place}: measured.tokens {entry['measured']['tokens']} lies outside the entry's "
                                   f"T range [{low}, {high}]")
        shape = tuple(entry["shape"][key] for key in SHAPE_FIELDS)
        for other, (olow, ohigh) in spans.get(shape, []):
            if low <= ohigh and olow <= high:
                raise TuningTableError(f"{place}: its T range [{low}, {high}] overlaps entries/{other} "
                                       f"[{olow}, {ohigh}] of the same shape; one T has one entry")
        spans.setdefault(shape, []).append((index, (low, high)))


def _token_range(entry: dict) -> tuple[int, float]:
    return entry["tokens"]["min"], entry["tokens"].get("max", float("inf"))


def read_table(path: Path) -> dict:
    """A table file, parsed safely and validated (TuningTableError names the file on any problem). It is read as
    rule files are (oracle.yamlio): no further than MAX_FILE_BYTES, aliases and nesting bounded, duplicate keys
    refused, since a user table directory is read by every layer built on this GPU."""
    from oracle.errors import RuleError
    from oracle.yamlio import load_yaml_text, read_limited

    try:
        table = load_yaml_text(read_limited(path, str(path))[1], str(path)).data
    except (OSError, RuleError) as exc:  # unreadable, over the limit, not UTF-8, not YAML, a duplicate key, ...
        raise TuningTableError(f"{path}: cannot be read as YAML: {exc}".splitlines()[0]) from None
    validate_table(table, str(path))
    return table


@functools.cache
def shipped_table(name: str) -> dict:
    path = TABLE_DIR / name
    table = read_table(path)
    if table.get("extends"):
        parent = table["extends"]
        if not (TABLE_DIR / parent).is_file() or parent == name:
            raise TuningTableError(f"{path}: extends {parent!r}, which is no other shipped table in {TABLE_DIR}")
        if shipped_table(parent)["arch"] != table["arch"]:
            raise TuningTableError(f"{path}: extends {parent!r} of another architecture")
    return table


def gpu_matches(table_gpu: str, device_name: str | None) -> bool:
    """`gpu` as a whole word of the device name, case-insensitive."""
    if not device_name:
        return False
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(table_gpu)}(?![A-Za-z0-9])", device_name, re.IGNORECASE) is not None


def shipped_chain(device_name: str | None, arch: str) -> list[tuple[str, dict]]:
    """(file name, table) of the shipped table naming this device (the longest `gpu` wins), then its parents."""
    found = []
    for path in sorted(TABLE_DIR.glob("*.yaml")):
        table = shipped_table(path.name)
        if table["arch"] == arch and gpu_matches(table["gpu"], device_name):
            found.append((len(table["gpu"]), path.name, table))
    if not found:
        return []
    _, name, table = max(found, key=lambda f: f[0])
    chain = [(name, table)]
    while table.get("extends"):
        name = table["extends"]
        table = shipped_table(name)
        chain.append((name, table))
    return chain


@functools.cache
def _user_tables(directory: str) -> tuple:
    """Every table in the user directory, validated: ((path, table), ...). Cached per process;
    reload_user_tables() forgets them (the tune command calls it after writing)."""
    path = Path(directory)
    if not path.is_dir():
        return ()
    return tuple((str(f), read_table(f)) for f in sorted(path.glob("*.yaml")))


def reload_user_tables() -> None:
    _user_tables.cache_clear()
    _select_table_entry.cache_clear()


def user_chain(device_name: str | None, arch: str) -> list[tuple[str, dict]]:
    """User tables for this device, the longest `gpu` first; a table for this device but another architecture is
    foreign: an error naming it, never skipped."""
    found = []
    for path, table in _user_tables(str(user_table_dir())):
        if gpu_matches(table["gpu"], device_name):
            if table["arch"] != arch:
                raise TuningTableError(f"{path}: written for arch {table['arch']!r} but this GPU ({device_name}) is "
                                       f"{arch!r}; delete it or re-run `moe-oracle tune` on this GPU")
            if table.get("extends"):
                raise TuningTableError(f"{path}: `extends` is for shipped tables only; drop it (user entries come "
                                       f"first, the shipped table serves the rest)")
            found.append((len(table["gpu"]), path, table))
    return [(p, t) for _, p, t in sorted(found, key=lambda f: -f[0])]


def entry_matches(entry: dict, problem: Problem) -> bool:
    low, high = _token_range(entry)
    return low <= problem.tokens <= high and all(entry["shape"][key] == getattr(problem, key) for key in SHAPE_FIELDS)


def config_of(entry: dict, source: str) -> MoEConfig:
    return MoEConfig(LaunchConfig(**entry["gemm1"]), LaunchConfig(**entry["gemm2"]), source,
                     prefill_kernel=entry.get("prefill_kernel", "tiles"))


def table_config(device_name: str | None, arch: str, problem: Problem) -> MoEConfig | None:
    """The first matching entry of the user tables, then of the shipped chain; None when no table covers it."""
    return _select_table_entry(device_name, arch, problem)


@functools.lru_cache(maxsize=4096)
def _select_table_entry(device_name, arch, problem) -> MoEConfig | None:
    for origin, chain in (("user", user_chain(device_name, arch)), ("shipped", shipped_chain(device_name, arch))):
        for name, table in chain:
            for index, entry in enumerate(table["entries"]):
                if entry_matches(entry, problem):
                    label = name if origin == "shipped" else f"user:{name}"
                    return config_of(entry, f"{label}#{index}")
    return None


def shipped_entries() -> list[tuple[str, int, dict]]:
    """(file name, index, entry) of every entry of every shipped table (tests compile and run each one)."""
    return [(path.name, index, entry) for path in sorted(TABLE_DIR.glob("*.yaml"))
            for index, entry in enumerate(shipped_table(path.name)["entries"])]
