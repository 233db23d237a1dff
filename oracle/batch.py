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
from typing import Any

from .api import Oracle
from .errors import OracleError
from .overrides import Overrides, load_overrides
from .tools.commands import EXIT_FINDINGS, EXIT_OK, to_stderr

DEPLOYMENT_KEYS = {"model": str, "layer": int, "role": str}  # what picks an --overrides entry


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
    try:
        line = json.loads(line_text)
    except json.JSONDecodeError as exc:
        return {"outcome": "error", "error": f"{where}:{exc.colno}: not valid JSON ({exc.msg})"}
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


def run_batch(args: argparse.Namespace, oracle: Oracle) -> int:
    overrides = None
    if args.overrides:
        overrides = load_overrides(args.overrides, [oracle.table(name) for name in oracle.profiles()])
    elif args.model or args.layer is not None or args.role:
        raise OracleError("--model, --layer and --role pick an entry of --overrides FILE; give the file too")
    try:
        fh = sys.stdin if args.batch == "-" else open(args.batch, encoding="utf-8")
    except OSError as exc:
        raise OracleError(f"--batch {args.batch}: cannot read ({exc.strerror})") from None
    unanswered, lines = [], 0
    with fh:
        for lineno, text in enumerate(fh, 1):
            if not text.strip():
                continue
            lines += 1
            out = _batch_answer(text, f"{args.batch}:{lineno}", args, oracle, overrides)
            if out["outcome"] not in ("selected", "none"):
                unanswered.append(lineno)
            sys.stdout.write(json.dumps(out) + "\n")
    if unanswered:
        shown = ", ".join(map(str, unanswered[:10])) + (", ..." if len(unanswered) > 10 else "")
        to_stderr(f"{len(unanswered)} of {lines} line(s) not answered selected/none (line {shown}); exit 1", "warning")
        return EXIT_FINDINGS
    return EXIT_OK
