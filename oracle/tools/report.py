"""Findings rendered for people and CI: text, json, github (workflow annotations) and SARIF 2.1.0.

A finding is a dict with rule, level (error | warning | note), at ("file:line" or None) and message;
`acknowledged` (the reason, where the rules or a baseline accept it) keeps it out of text and github output
and marks it suppressed in SARIF; any other keys travel in json output only.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FORMATS = ("text", "json", "github", "sarif")


def _split(at: str | None) -> tuple[str | None, int]:
    """(file, line) of a location; file None unless it names a file that exists here (a git revision's file,
    `-` or a rule location of a temporary copy is no file a CI annotation or SARIF result can point at)."""
    if not at:
        return None, 1
    file, _, line = at.rpartition(":")
    file, number = (file, int(line)) if line.isdigit() and file else (at, 1)
    return (file, number) if Path(file).is_file() else (None, 1)


def render(findings: list[dict[str, Any]], fmt: str, tool: str, summary: str = "") -> str:
    if fmt == "json":
        return json.dumps({"tool": f"moe-oracle {tool}", "summary": summary, "findings": findings}, indent=1,
                          default=str)
    if fmt == "github":
        lines = []
        for f in findings:
            if f.get("acknowledged"):
                continue
            file, line = _split(f.get("at"))
            col = f",col={f['col']}" if file and isinstance(f.get("col"), int) else ""
            where = f" file={_prop(file)},line={line}{col}" if file else ""
            level = {"error": "error", "warning": "warning"}.get(f.get("level", "warning"), "notice")
            elsewhere = f" ({f['at']})" if f.get("at") and not file and f["at"] not in f["message"] else ""
            lines.append(f"::{level}{where}::{f['rule']}: {_one_line(f['message'] + elsewhere)}")
        if summary:
            lines.append(summary)
        return "\n".join(lines)
    if fmt == "sarif":
        return json.dumps(sarif(findings, tool), indent=1)
    lines = [f"{f.get('at') or '-'}: {f.get('level', 'warning')} [{f['rule']}] {f['message']}" for f in findings
             if not f.get("acknowledged")]
    if summary:
        lines.append(summary)
    return "\n".join(lines)


def _one_line(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "").replace("\n", "%0A")


def _prop(text: str) -> str:
    """A workflow-command property value, escaped as GitHub's toolkit does."""
    return _one_line(text).replace(":", "%3A").replace(",", "%2C")


def sarif(findings: list[dict[str, Any]], tool: str) -> dict[str, Any]:
    rules = sorted({f["rule"] for f in findings})
    results = []
    for f in findings:
        file, line = _split(f.get("at"))
        r: dict[str, Any] = {"ruleId": f["rule"], "level": {"error": "error", "warning": "warning"}.get(
            f.get("level", "warning"), "note"), "message": {"text": f["message"]}}
        if file:
            r["locations"] = [{"physicalLocation": {"artifactLocation": {"uri": file},
                                                    "region": {"startLine": line, **(
                                                        {"startColumn": f["col"]} if isinstance(f.get("col"), int)
                                                        else {})}}}]
        if f.get("acknowledged"):
            r["suppressions"] = [{"kind": "inSource" if str(f["acknowledged"]).startswith("lint_allow") else
                                  "external", "justification": str(f["acknowledged"])}]
        results.append(r)
    return {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
            "runs": [{"tool": {"driver": {"name": f"moe-oracle {tool}", "informationUri":
                                          "https://github.com/moe-oracle/moe-oracle",
                                          "rules": [{"id": r} for r in rules]}},
                      "results": results}]}


def problem_findings(exc: Exception) -> list[dict[str, Any]]:
    """What stopped a command, as findings: one per located problem of broken rule files (rule
    `invalid-rules`, file:line with the column), else the one message (rule `usage`), so that CI formats
    still carry a complete report (valid SARIF, annotations) when nothing could be checked."""
    diagnostics = getattr(exc, "diagnostics", None)
    if diagnostics:
        return [{"rule": "invalid-rules", "level": "error", "at": f"{d.file}:{d.line}", "col": d.col,
                 "message": d.message} for d in diagnostics]
    return [{"rule": "usage", "level": "error", "at": None, "message": str(exc)}]
