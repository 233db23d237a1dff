"""Line references in the docs point at lines that exist and hold what they cite.

Every `PATH:LINE` in README.md, docs/*.md and the READMEs under rules/ and benchmarks/, where PATH is a
file of this repository, must be written in a form that says what the line holds, and that line must
hold it:

    step 'ID' at PATH:N      line N defines the step:                      `id: ID`
    via NAME, PATH:N         line N is inside the entry `NAME:` (a derived fact's `when`, as explain cites it)
    `TEXT` (PATH:N)          line N contains TEXT (also `TEXT` at PATH:N)

(the first two are how `explain` and the decision log cite rules, so pasted output is checked as is).
A bare PATH:N is refused: a number alone goes stale silently when the file above it changes.
PLACEHOLDERS are made-up paths used to show a message's shape; they are not checked.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "rules").glob("**/README.md"),
               *(ROOT / "benchmarks").glob("README*.md")])
PLACEHOLDERS = {"rules/x.yaml", "my-rules/x.yaml"}
_PATH = r"(?P<path>[\w.-]+(?:/[\w.-]+)+\.(?:py|yaml|yml|json|md|toml|sh)):(?P<line>\d+)"
REFERENCE = re.compile(_PATH)


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())


def _inside_entry(lines: list[str], number: int, name: str) -> bool:
    """Line `number` is the line `NAME:` or inside the block that line opens (every line between more indented)."""
    floor = None
    for i in range(number - 1, -1, -1):
        text = lines[i]
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        if floor is None or _indent(text) < floor:
            if text.strip().startswith(f"{name}:"):
                return True
            floor = _indent(text) if floor is None else min(floor, _indent(text))
            if floor == 0:
                return False
    return False


FORMS = [  # (pattern ending at the reference, what the cited line must hold, how it is tested)
    (re.compile(r"step '(?P<name>[\w.-]+)' at " + _PATH), lambda name: f"id: {name}",
     lambda lines, n, want: want in lines[n - 1]),
    (re.compile(r"via (?P<name>[\w.-]+), " + _PATH), lambda name: f"{name}:",
     lambda lines, n, want: _inside_entry(lines, n, want[:-1])),
    (re.compile(r"`(?P<name>[^`]+)`,? (?:at |in |\()" + _PATH), lambda name: name,
     lambda lines, n, want: want in lines[n - 1]),
]


def references() -> list[tuple[str, int, re.Match]]:
    found = []
    for doc in DOCS:
        for number, text in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            found += [(f"{doc.relative_to(ROOT)}:{number}", number, m) for m in REFERENCE.finditer(text)
                      if m.group("path").split("/")[0] in {p.name for p in ROOT.iterdir()}
                      or m.group("path") in PLACEHOLDERS]
    return found


def check(where: str, line_text: str, match: re.Match) -> str | None:
    """None when the reference holds, else what is wrong."""
    path, number = match.group("path"), int(match.group("line"))
    if path in PLACEHOLDERS:
        return None
    target = ROOT / path
    if not target.is_file():
        return f"{where}: {path} does not exist"
    lines = target.read_text(encoding="utf-8").splitlines()
    if not 1 <= number <= len(lines):
        return f"{where}: {path}:{number} is past the end ({len(lines)} lines)"
    for form, expected, holds_it in FORMS:
        for m in form.finditer(line_text):
            if m.end() == match.end() and m.group("path") == path:
                want = expected(m.group("name"))
                if not holds_it(lines, number, want):
                    holds = [i for i, t in enumerate(lines, 1) if want in t]
                    return (f"{where}: {path}:{number} does not hold {want!r} (it holds {lines[number - 1].strip()!r}"
                            f"{'; ' + want + ' is at line ' + ', '.join(map(str, holds)) if holds else ''})")
                return None
    return (f"{where}: bare reference {path}:{number}; say what it cites: step 'ID' at {path}:{number}, "
            f"via NAME, {path}:{number} or `TEXT` ({path}:{number})")


def test_the_docs_have_line_references():
    assert len(references()) >= 2, "the scan found nothing: the pattern or the doc list is wrong"


@pytest.mark.parametrize("where,number,match", references(), ids=[r[0] + " " + r[2].group(0) for r in references()])
def test_a_line_reference_points_at_what_it_cites(where, number, match):
    doc = ROOT / where.rsplit(":", 1)[0]
    problem = check(where, doc.read_text(encoding="utf-8").splitlines()[number - 1], match)
    assert problem is None, problem


def test_the_checker_catches_stale_and_bare_references():
    def problem(text: str) -> str | None:
        return check("doc.md:1", text, list(REFERENCE.finditer(text))[-1])

    assert problem("(via cuda_sm10x, rules/common/platform.yaml:1)") is not None        # the wrong line
    assert "past the end" in problem("step 'auto' at rules/vllm-0.33/mxfp4.yaml:99999")
    assert "does not exist" in problem("step 'auto' at rules/vllm-0.99/mxfp4.yaml:1")
    assert "bare reference" in problem("see rules/common/platform.yaml:1")
    text = (ROOT / "rules/common/platform.yaml").read_text().splitlines()
    line = next(i for i, t in enumerate(text, 1) if t.strip().startswith("cuda_sm10x:"))
    assert problem(f"(via cuda_sm10x, rules/common/platform.yaml:{line})") is None
    assert problem(f"(via cuda_sm10x, rules/common/platform.yaml:{line + 1})") is None  # its `when`, as explain cites
    assert problem(f"(via cuda_sm10x, rules/common/platform.yaml:{line + 3})") is not None  # the next entry


# ------------------------------------------------------------------ README's "What runs where" table
# column -> (profile, policy, layer, packages, env on ROCm), as the paragraph above the table says
_ALL_033 = ("flashinfer", "triton_kernels", "deep_gemm", "aiter", "humming", "quark")
COLUMNS = {
    "`moe-oracle` MXFP4": ("moe-oracle", "mxfp4-gpt-oss", "swigluoai", ("triton",), {}),
    "`moe-oracle` NVFP4": ("moe-oracle", "nvfp4", "silu", ("triton",), {}),
    "`vllm-0.33` MXFP4": ("vllm-0.33", "mxfp4", "swigluoai", _ALL_033, {"VLLM_ROCM_USE_AITER": "1"}),
    "`vllm-0.33` NVFP4": ("vllm-0.33", "nvfp4", "silu", _ALL_033, {"VLLM_ROCM_USE_AITER": "1"}),
}


def _table() -> tuple[list[str], list[list[str]]]:
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## What runs where", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines if line.startswith("|")]
    return rows[0], [r for r in rows[2:]]


def _platform(cell: str) -> dict:
    spec = re.search(r"\(`([^`]+)`\)", cell).group(1)
    kind, _, detail = spec.partition(":")
    if kind == "cuda":
        return {"kind": "cuda", "capability": [int(x) for x in detail.split(".")]}
    return {"kind": "rocm", "gcn_arch": detail} if kind == "rocm" else {"kind": kind}


def test_the_what_runs_where_table_is_what_the_rules_answer(oracle):
    header, rows = _table()
    assert set(COLUMNS) <= set(header) and len(rows) >= 5
    for row in rows:
        platform = _platform(row[0])
        for column, (profile, policy, activation, packages, rocm_env) in COLUMNS.items():
            cell = row[header.index(column)]
            d = oracle.select({"profile": profile, "policy": policy, "platform": platform,
                               "packages": dict.fromkeys(packages, True),
                               "env": rocm_env if platform["kind"] == "rocm" else {}, "moe": {"activation": activation}})
            shown = (d.backend if d.outcome == "selected" else d.outcome) + ("*" if d.outcome == "selected"
                                                                              and d.runner is None else "")
            assert cell == shown, f"README row {row[0]}, column {column}: says {cell}, the rules answer {shown}"
