"""Findings rendered for people and CI: text, json, github (workflow annotations) and SARIF 2.1.0.

A finding is a dict with rule, level (error | warning | note), at ("file:line" or None) and message;
any other keys travel in json output only.
"""
from __future__ import annotations

import json
from typing import Any

FORMATS = ("text", "json", "github", "sarif")


def _split(at: str | None) -> tuple[str | None, int]:
    if not at:
        return None, 1
    file, _, line = at.rpartition(":")
    return (file, int(line)) if line.isdigit() and file else (at, 1)


def render(findings: list[dict[str, Any]], fmt: str, tool: str, summary: str = "") -> str:
    if fmt == "json":
        return json.dumps({"tool": f"moe-oracle {tool}", "summary": summary, "findings": findings}, indent=1,
                          default=str)
    if fmt == "github":
        lines = []
        for f in findings:
            file, line = _split(f.get("at"))
            where = f" file={file},line={line}," if file else " "
            level = {"error": "error", "warning": "warning"}.get(f.get("level", "warning"), "notice")
            lines.append(f"::{level}{where.rstrip(',')}::{f['rule']}: {_one_line(f['message'])}".replace(" ::", "::"))
        if summary:
            lines.append(summary)
        return "\n".join(lines)
    if fmt == "sarif":
        return json.dumps(sarif(findings, tool), indent=1)
    lines = [f"{f.get('at') or '-'}: {f.get('level', 'warning')} [{f['rule']}] {f['message']}" for f in findings]
    if summary:
        lines.append(summary)
    return "\n".join(lines)


def _one_line(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "").replace("\n", "%0A")


def sarif(findings: list[dict[str, Any]], tool: str) -> dict[str, Any]:
    rules = sorted({f["rule"] for f in findings})
    results = []
    for f in findings:
        file, line = _split(f.get("at"))
        r: dict[str, Any] = {"ruleId": f["rule"], "level": {"error": "error", "warning": "warning"}.get(
            f.get("level", "warning"), "note"), "message": {"text": f["message"]}}
        if file:
            r["locations"] = [{"physicalLocation": {"artifactLocation": {"uri": file},
                                                    "region": {"startLine": line}}}]
        results.append(r)
    return {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
            "runs": [{"tool": {"driver": {"name": f"moe-oracle {tool}", "informationUri":
                                          "https://github.com/moe-oracle/moe-oracle",
                                          "rules": [{"id": r} for r in rules]}},
                      "results": results}]}
