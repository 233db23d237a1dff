"""`moe-oracle select --batch FILE`: one JSON answer line per scenario line, in order, never stopping.

A line is a scenario, or {"scenario": ..., "model": ..., "layer": ..., "role": ...} (golden-file lines,
with `expected`, are read too). With --overrides each line's model/layer/role (default: the flags) picks
a deployment override, whose provenance is the answer's `decided_by`. A bad line is an `error` answer
naming file:line; the exit code is 1 when any line is not selected/none, with a warning on stderr.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

from .api import Oracle, internal_error
from .errors import OracleError
from .limits import MAX_LINE_BYTES, MAX_SCENARIO_DEPTH, depth_over
from .overrides import Overrides, load_overrides
from .tools.commands import EXIT_FINDINGS, EXIT_OK, to_stderr

DEPLOYMENT_KEYS = {"model": str, "layer": int, "role": str}  # what picks an --overrides entry


class DuplicateKey(ValueError):
    """A JSON object names a key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return out


def _deployment(line: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """model/layer/role of a batch line ({"scenario": ..., "model": ..., "layer": ..., "role": ...}), each
    defaulting to the flag; ValueError names a field of the wrong type."""
    out = {"model": args.model, "layer": args.layer, "role": args.role}
    for key, kind in DEPLOYMENT_KEYS.items():
        if key in line:
            value = line[key]
            if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
                raise ValueError(f"{key}: {value!r} is not a{'n integer' if kind is int else ' string'} "
                                 f"(the {key} an --overrides entry matches)")
            out[key] = value
    return out


def _batch_answer(line_text: str, where: str, args: argparse.Namespace, oracle: Oracle,
                  overrides: Overrides | None) -> dict[str, Any]:
    """One batch line's answer as JSON; a bad line is an `error` answer naming file:line."""
    if len(line_text) > MAX_LINE_BYTES:
        return {"outcome": "error", "error": f"{where}: the line has {len(line_text):,} characters; the limit is "
                                             f"{MAX_LINE_BYTES:,} (a scenario is a few hundred)"}
    try:
        line = json.loads(line_text, object_pairs_hook=_unique_keys)
    except DuplicateKey as exc:
        return {"outcome": "error", "error": f"{where}: duplicate key {str(exc)!r} in a JSON object (JSON readers "
                                             "keep either one); give each key once"}
    except json.JSONDecodeError as exc:
        return {"outcome": "error", "error": f"{where}:{exc.colno}: not valid JSON ({exc.msg})"}
    except (RecursionError, ValueError) as exc:  # nesting past the parser's depth; an int past 4,300 digits
        why = f"nested deeper than {MAX_SCENARIO_DEPTH} levels (the limit)" if isinstance(exc, RecursionError) \
            else f"not readable as JSON ({str(exc)[:120]})"
        return {"outcome": "error", "error": f"{where}: {why}"}
    if depth_over(line, MAX_SCENARIO_DEPTH):
        return {"outcome": "error", "error": f"{where}: nested deeper than {MAX_SCENARIO_DEPTH} levels (the limit; "
                                             "a scenario nests 3)"}
    if not isinstance(line, dict):
        return {"outcome": "error", "error": f"{where}: a line is a JSON object: a scenario, or "
                                             "{\"scenario\": ..., \"model\"/\"layer\"/\"role\": ...}"}
    sc = line.get("scenario") if "scenario" in line and "policy" not in line else line  # golden lines too
    if not isinstance(sc, dict):
        return {"outcome": "error", "error": f"{where}: scenario: a scenario must be a JSON object"}
    override = None
    if overrides is not None and isinstance(sc.get("policy"), str):
        try:
            deployment = _deployment(line, args)
        except ValueError as exc:
            return {"outcome": "error", "error": f"{where}: {exc}"}
        override = overrides.find(sc["policy"], deployment["model"], deployment["layer"], deployment["role"])
    out = oracle.select(sc, override, strict=args.strict).to_dict(with_trace=args.trace)
    if out["outcome"] == "error":
        out["error"] = f"{where}: {out['error']}"
    return out


def _safe_answer(text: str, where: str, args: argparse.Namespace, oracle: Oracle,
                 overrides: Overrides | None) -> dict[str, Any]:
    """`_batch_answer`, and an `error` answer for anything unforeseen: one line never ends the batch."""
    try:
        return _batch_answer(text, where, args, oracle, overrides)
    except Exception as exc:
        return {"outcome": "error", "error": f"{where}: {internal_error(exc)}"}


def _lines(fh: Any) -> Iterator[bytes | str | None]:
    """The lines of `fh` (bytes, or text for a text stream), None for one past MAX_LINE_BYTES, yielded as soon as
    it is past (its answer comes out even if the line never ends, as on /dev/zero) and then skipped unread:
    memory stays bounded."""
    while True:
        raw = fh.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        newline = b"\n" if isinstance(raw, bytes) else "\n"
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(newline):
            yield None
            while True:
                rest = fh.readline(MAX_LINE_BYTES)
                if not rest or rest.endswith(newline):
                    break
        else:
            yield raw


def run_batch(args: argparse.Namespace, oracle: Oracle) -> int:
    overrides = None
    if args.overrides:
        overrides = load_overrides(args.overrides, [oracle.table(name) for name in oracle.profiles()])
    elif args.model or args.layer is not None or args.role:
        raise OracleError("--model, --layer and --role pick an entry of --overrides FILE; give the file too")
    try:
        fh = sys.stdin.buffer if args.batch == "-" and hasattr(sys.stdin, "buffer") else \
            sys.stdin if args.batch == "-" else open(args.batch, "rb")
    except OSError as exc:
        raise OracleError(f"--batch {args.batch}: cannot read ({exc.strerror})") from None
    unanswered, lines = [], 0
    with fh:
        for lineno, raw in enumerate(_lines(fh), 1):
            where = f"{args.batch}:{lineno}"
            if raw is None:
                out = {"outcome": "error", "error": f"{where}: the line is longer than {MAX_LINE_BYTES:,} bytes "
                                                    "(the limit; a scenario is a few hundred)"}
            else:
                try:
                    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
                except UnicodeDecodeError as exc:
                    bad = f"byte 0x{raw[exc.start]:02x} is not UTF-8 (a line is UTF-8 JSON)"
                    text, out = "", {"outcome": "error", "error": f"{where}:{exc.start + 1}: {bad}"}
                else:
                    if not text.strip():
                        continue
                    out = _safe_answer(text, where, args, oracle, overrides)
            lines += 1
            if out["outcome"] not in ("selected", "none"):
                unanswered.append(lineno)
            sys.stdout.write(json.dumps(out) + "\n")
            if raw is None:  # the rest of that line may never end: its answer goes out now
                sys.stdout.flush()
    if unanswered:
        shown = ", ".join(map(str, unanswered[:10])) + (", ..." if len(unanswered) > 10 else "")
        to_stderr(f"{len(unanswered)} of {lines} line(s) not answered selected/none (line {shown}); exit 1", "warning")
        return EXIT_FINDINGS
    return EXIT_OK
