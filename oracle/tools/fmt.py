"""`moe-oracle fmt`: canonical layout of rule files, comments kept, meaning provably unchanged.

Why no YAML round trip: dumping a parsed file (PyYAML) drops every comment, and the comments are
the rules' documentation. The formatter therefore edits lines: two-space indentation per nesting
level (sequences indented under their key), no trailing whitespace or tabs, at most one blank line in a
row, none at the start, one final newline, and the editor-schema modeline first. Block scalars and
multi-line flow collections move with their opening line. The result is parsed and compared with the
original data; if they differ (a layout the line rules do not understand) only the whitespace-only
rules apply, so formatting can never change what a file means. It is idempotent (tested).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import RuleError
from ..yamlio import load_yaml_text

MODELINE = "# yaml-language-server: $schema="
_BLOCK = re.compile(r"(:|^-|\s-)\s*[|>][-+0-9]*\s*(#.*)?$")


def _opens_flow(text: str) -> int:
    """Unclosed [ or { on a line (outside quotes and comments): > 0 while a flow collection continues."""
    depth, quote = 0, ""
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] == " "):
            break
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
    return depth


def reindent(lines: list[str]) -> list[str]:
    out: list[str] = []
    stack = [-1]
    new_of: dict[int, int] = {}
    delta = 0
    carry_until = -1  # lines that move with an opener (block scalar or flow continuation)
    flow = 0
    pending_comments: list[int] = []
    for line in lines:
        stripped = line.lstrip(" ")
        indent = len(line) - len(stripped)
        if not stripped:
            out.append("")
            continue
        if flow > 0 or (carry_until >= 0 and indent > carry_until):
            out.append(" " * max(0, indent + delta) + stripped)
            flow += _opens_flow(stripped) if flow > 0 else 0
            continue
        carry_until = -1
        if stripped.startswith("#"):
            pending_comments.append(len(out))
            out.append(line)
            new_of[len(out) - 1] = indent
            continue
        while indent < stack[-1]:
            stack.pop()
        if indent > stack[-1]:
            stack.append(indent)
        new = 2 * (len(stack) - 2)
        for i in pending_comments:  # a comment block sits at the level of the line it precedes
            if new_of[i] == indent:
                out[i] = " " * new + out[i].lstrip(" ")
        pending_comments = []
        delta = new - indent
        out.append(" " * new + stripped)
        if stripped.startswith("- "):  # a sequence item's content (e.g. `- any:`) nests one level deeper
            stack.append(indent + 2)
        if _BLOCK.search(stripped):
            carry_until = indent
        flow = max(0, _opens_flow(stripped))
    return out


def whitespace(lines: list[str]) -> list[str]:
    out: list[str] = []
    for line in lines:
        line = line.rstrip()
        if not line and (not out or not out[-1]):
            continue
        out.append(line)
    while out and not out[-1]:
        out.pop()
    return out


def format_text(text: str, schema_ref: str | None = None, name: str = "<text>") -> str:
    """The canonical layout of `text`; RuleError (file:line:col) when it is not YAML a rule file may hold."""
    original = load_yaml_text(text, name).data
    lines = text.replace("\r\n", "\n").expandtabs(2).split("\n")
    if schema_ref and not any(line.startswith(MODELINE) for line in lines[:3]):
        lines.insert(0, MODELINE + schema_ref)
    candidate = "\n".join(whitespace(reindent(lines))) + "\n"
    if _same(original, candidate):
        return candidate
    return "\n".join(whitespace(lines)) + "\n"


def _same(data: Any, text: str) -> bool:
    try:
        return bool(load_yaml_text(text, "<formatted>").data == data)
    except RuleError:
        return False


def _rule_files(paths: list[Path]) -> list[tuple[Path, Path]]:
    """(file, the directory its real file must stay in): a named directory, or a named file's directory."""
    out: list[tuple[Path, Path]] = []
    for p in paths:
        if p.is_dir():
            out += [(f, p) for f in sorted(p.rglob("*.y*ml"))]
        else:
            out.append((p, p.parent))
    return out


def format_paths(paths: list[Path], check: bool = False) -> list[Path]:
    """Files whose layout is not canonical; rewritten (atomically) unless `check`.

    Every file is checked before any is written: a symlink leaving its directory, a file that is not
    UTF-8 or not YAML stops the command with nothing changed."""
    from ..errors import OracleError
    from ..safewrite import resolve_inside, write_inside
    from ..yamlio import read_limited

    planned: list[tuple[Path, Path, str]] = []
    for f, root in _rule_files(paths):
        resolve_inside(f, root)
        try:
            _, text = read_limited(f, str(f))
        except RuleError as exc:  # larger than the limit, or not UTF-8: nothing written, exit 2 as for other input
            raise OracleError(str(exc)) from None
        except OSError as exc:
            raise OracleError(f"{f}: cannot read ({exc.strerror}); name readable rule files") from None
        new = format_text(text, name=str(f))
        if new != text:
            planned.append((f, root, new))
    if not check:
        for f, root, new in planned:
            write_inside(f, new, root)
    return [f for f, _, _ in planned]
