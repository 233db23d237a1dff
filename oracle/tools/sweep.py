"""`moe-oracle sweep`: the decision matrix, platform x configuration -> outcome / backend / kernel.

Rows are the configuration classes (everything but the platform) of the exhaustive partition, fine
enough for every platform at once: each exploration run decides the policy on every platform class,
so a row's cells are exact for all inputs of the row. Columns are concrete platforms.
Speed: each platform class's decision is memoized on the classes it reads (explore.Memo), so a row runs
the engine only for the columns whose reads it has not seen yet; the other cells are walks of the memo.
Renderings: Markdown, CSV, JSON and one self-contained HTML page (no network) with a colour per
backend and a hover that shows the decision and the step that decided it.
"""
from __future__ import annotations

import colorsys
import csv
import hashlib
import html
import io
import json
from dataclasses import dataclass
from typing import Any

from .explore import Answer, Memo, call_hook, decide, describe, explore, nullable_facts
from .sources import Profiled
from .space import Space, members


@dataclass
class Matrix:
    profile: str
    policy: str
    columns: list[str]  # concrete platforms
    column_class: list[int]  # the platform class of each column
    rows: list[tuple[str, list[Answer]]]  # (configuration, answer per platform class)
    decisions: int  # answers of (row, platform class): rows x platform classes
    runs: int = 0  # of those, decisions the engine ran; the others came from the memo (same reads, same answer)

    @property
    def cells(self) -> int:
        """Answers in the matrix as rendered: rows x concrete platforms (platforms of one class share an answer)."""
        return len(self.rows) * len(self.columns)

    def cell(self, row: int, col: int) -> Answer:
        return self.rows[row][1][self.column_class[col]]


# A picture a person reads: by default rows vary packages, env vars and the explicit backend string;
# the layer keeps the policy's defaults (--vary FACT adds a dimension, --vary all explores like lint).
SWEEP_VARIED = ("moe.moe_backend",)


_SPACES: dict[tuple[int, int, tuple[str, ...]], tuple[Profiled, Space]] = {}


def _space(p: Profiled, vary: tuple[str, ...]) -> Space:
    """The space of one profile, built once for all its policies (the Profiled is kept, so its id stays its own)."""
    key = (id(p.rs), id(p.table), vary)
    hit = _SPACES.get(key)
    if hit is None or hit[0] is not p:
        if len(_SPACES) > 16:
            _SPACES.clear()
        space = Space.of([(p.rs, p.table)], vary) if "all" in vary else Space.of([(p.rs, p.table)], vary, SWEEP_VARIED)
        hit = _SPACES[key] = (p, space)
    return hit[1]


def sweep_policy(p: Profiled, policy_name: str, vary: tuple[str, ...] = ()) -> Matrix:
    policy = p.table.policies[policy_name]
    space = _space(p, vary)
    platforms = space.platform.classes
    nullable = nullable_facts(policy)
    hook = call_hook(p.table)

    # the decision as a function of the classes it reads, the column's platform class among them: a row whose
    # answer does not depend on the platform (or on part of it) runs the engine once for all those columns
    memo = Memo()

    def every_platform(reader: Any) -> list[Answer]:
        x = reader.x

        def one() -> Answer:
            return decide(p.table, policy, reader.ctx(policy, nullable), hook)
        out: list[Answer] = []
        try:
            for column in range(len(platforms)):
                x.column = column
                out.append(memo(x, one))
        finally:
            x.column = None
        return out

    rows = [(describe(leaf), answers) for leaf, answers in explore(space, every_platform)]
    columns, column_class = [], []
    for i, cl in enumerate(platforms):
        for m in members(cl.label):
            columns.append(m)
            column_class.append(i)
    return Matrix(p.name, policy_name, columns, column_class, rows, len(rows) * len(platforms), memo.runs)


def _cell_text(a: Answer) -> str:
    return a.backend if a.outcome == "selected" and a.backend else a.outcome


def to_markdown(ms: list[Matrix]) -> str:
    out = []
    for m in ms:
        out.append(f"### {m.profile} / {m.policy} ({len(m.rows)} configuration classes)\n")
        out.append("| configuration | " + " | ".join(m.columns) + " |")
        out.append("|---|" + "---|" * len(m.columns))
        for r, (conf, _) in enumerate(m.rows):
            cells = [_cell_text(m.cell(r, c)) for c in range(len(m.columns))]
            out.append(f"| {conf.replace('|', '/')} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


FIELDS = ("profile", "policy", "configuration", "platform", "outcome", "backend", "kernel", "activation_key",
          "align_hidden", "align_intermediate", "step", "at")


def records(ms: list[Matrix]) -> list[dict[str, Any]]:
    out = []
    for m in ms:
        for r, (conf, _) in enumerate(m.rows):
            for c, plat in enumerate(m.columns):
                a = m.cell(r, c)
                out.append({"profile": m.profile, "policy": m.policy, "configuration": conf, "platform": plat,
                            **a._asdict()})
    return out


def to_csv(ms: list[Matrix]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, FIELDS, lineterminator="\n")
    w.writeheader()
    w.writerows(records(ms))
    return buf.getvalue()


def to_json(ms: list[Matrix]) -> str:
    return json.dumps(records(ms), indent=None)


def colour(name: str) -> str:
    """A stable, distinct-enough colour per backend (hue from a hash of the name); refusals are grey shades."""
    fixed = {"none": "#d9d9d9", "invalid": "#f4cccc", "unsupported": "#9e9e9e", "error": "#000000"}
    if name in fixed:
        return fixed[name]
    h = int(hashlib.sha1(name.encode()).hexdigest()[:6], 16)
    r, g, b = colorsys.hls_to_rgb((h % 360) / 360, 0.55 + (h >> 9) % 20 / 100, 0.55 + (h >> 13) % 30 / 100)
    return "#%02x%02x%02x" % (int(r * 255), int(g * 255), int(b * 255))


_CSS = """body{font:13px system-ui,sans-serif;margin:16px;color:#222}table{border-collapse:collapse;margin-bottom:24px}
td,th{border:1px solid #fff;padding:0;height:16px;min-width:34px}th{font-weight:600;font-size:11px;padding:2px 4px;
background:#f3f3f3}td.conf{font-size:11px;padding:0 6px;white-space:nowrap;max-width:560px;overflow:hidden;
text-overflow:ellipsis;background:#fafafa}td.c:hover{outline:2px solid #000}.legend span{display:inline-block;
padding:2px 8px;margin:2px;border-radius:3px;font-size:12px}h2{font-size:15px;margin:18px 0 6px}"""


def to_html(ms: list[Matrix], title: str = "moe-oracle sweep") -> str:
    names = sorted({_cell_text(m.cell(r, c)) for m in ms for r in range(len(m.rows)) for c in range(len(m.columns))})
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_CSS}</style></head><body><h1 style='font-size:18px'>{html.escape(title)}</h1>",
             "<div class='legend'>" + "".join(
                 f"<span style='background:{colour(n)}'>{html.escape(n)}</span>" for n in names) + "</div>"]
    for m in ms:
        parts.append(f"<h2>{html.escape(m.profile)} / {html.escape(m.policy)} "
                     f"<small>({len(m.rows)} configuration classes x {len(m.columns)} platforms)</small></h2>")
        parts.append("<table><tr><th>configuration</th>" + "".join(
            f"<th>{html.escape(c)}</th>" for c in m.columns) + "</tr>")
        for r, (conf, _) in enumerate(m.rows):
            cells = []
            for c, plat in enumerate(m.columns):
                a = m.cell(r, c)
                tip = (f"{plat} | {conf}\n{a.outcome}: {a.short()}\ndecided by step {a.step or '-'} at {a.at or '-'}")
                cells.append(f"<td class='c' style='background:{colour(_cell_text(a))}' "
                             f"title='{html.escape(tip, quote=True)}'></td>")
            parts.append(f"<tr><td class='conf' title='{html.escape(conf, quote=True)}'>{html.escape(conf)}</td>"
                         + "".join(cells) + "</tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)
