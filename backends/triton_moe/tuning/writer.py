"""Writing tuning tables: entries from measurements, merged by structured keys (shape, T range), written whole
(validated first, then an atomic rename: never a partial file)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml

from backends.triton_moe.tuning.configs import SHAPE_FIELDS
from backends.triton_moe.tuning.tables import MODELINE, TABLE_DIR, TuningTableError, validate_table


def token_ranges(tokens: list[int]) -> list[tuple[int, int | None]]:
    """T ranges around measured Ts: each serves up to the geometric middle of the next (the last: every larger T)."""
    ordered = sorted(set(tokens))
    ranges = []
    low = 1
    for index, t in enumerate(ordered):
        high = int((t * ordered[index + 1]) ** 0.5) if index + 1 < len(ordered) else None
        if high is not None:
            high = max(high, t)
        ranges.append((low, high))
        low = (high or t) + 1
    return ranges


def entry(shape: dict, low: int, high: int | None, tokens: int, us: float, run: str, gemm1: dict, gemm2: dict,
          heuristic_us: float | None = None, prefill_kernel: str = "tiles") -> dict:
    measured = {"tokens": tokens, "us": round(us, 1), "run": run}
    if heuristic_us is not None:
        measured["heuristic_us"] = round(heuristic_us, 1)
    kernels = {} if prefill_kernel == "tiles" else {"prefill_kernel": prefill_kernel}  # the default stays unwritten
    return {"shape": {key: shape[key] for key in SHAPE_FIELDS},
            "tokens": {"min": low} if high is None else {"min": low, "max": high},
            "measured": measured, **kernels, "gemm1": gemm1, "gemm2": gemm2}


def merge_entries(table: dict, new: list[dict]) -> dict:
    """`table` with `new` entries in place of every entry of the same shape whose T range they overlap."""
    def overlaps(a, b):
        a_hi, b_hi = a["tokens"].get("max", float("inf")), b["tokens"].get("max", float("inf"))
        return a["shape"] == b["shape"] and a["tokens"]["min"] <= b_hi and b["tokens"]["min"] <= a_hi

    kept = [e for e in table["entries"] if not any(overlaps(e, n) for n in new)]
    return {**table, "entries": kept + new}


def write_table(path: str | Path, table: dict, *, shipped_ok: bool = False) -> Path:
    """Validate, then write atomically with the modeline, and put the schema next to it (editors resolve it).
    shipped_ok: the maintainers' merge (benchmarks/bench_moe.py --merge-sweep) may rewrite a shipped table."""
    path = Path(path)
    if not shipped_ok and path.resolve().parent == TABLE_DIR.resolve():
        raise TuningTableError(f"{path}: shipped tables are read-only; write user tables to the tuning directory")
    validate_table(table, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".yaml", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write(MODELINE)
            yaml.safe_dump(table, f, sort_keys=False, width=120, default_flow_style=None)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    schema = path.parent / "tuning.schema.json"
    if not schema.exists():  # oracle.safewrite: never through a (dangling) link that leaves the directory
        from oracle.safewrite import write_inside

        write_inside(schema, (TABLE_DIR / "tuning.schema.json").read_text(encoding="utf-8"))
    return path
