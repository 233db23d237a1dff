"""The hostile-input corpus: rule-file mutants, hostile scenarios and batch lines, shared by the tests
(tests/test_hostile_input.py, a bounded sample) and the figures command (benchmarks/hostile_input.py, all of it).

Each item is classified the same way everywhere:
  rejected  - refused with its place (file:line:col for a rule file, the field or file:line for a question)
  unchanged - accepted, and the fixed question set is answered as by the unmutated rules (rule mutants only)
  changed   - accepted, and some answer (outcome, backend, kernel) differs: a typo that validates
  valid-edit - a structural edit (a deleted or moved line) that leaves valid rules meaning something else:
              reported, not a failure (deleting an optional restriction is a legitimate edit)
  crash     - an exception escaped, or an answer says `internal error`
  hang      - took more than HANG_SECONDS of CPU time (measured, so other processes on the machine do not count;
              nothing is killed)
"""
from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oracle import Oracle
from oracle.errors import RuleError
from oracle.validate import validate_paths

BASE = Path(__file__).resolve().parent / "bad_rules" / "valid.yaml"
HANG_SECONDS = 5.0
PLACE = re.compile(r":\d+:\d+")  # file:line:col
QUESTIONS: tuple[dict[str, Any], ...] = (
    {"policy": "pol"},
    {"policy": "pol", "platform": {"kind": "cuda", "capability": [8, 0]}},
    {"policy": "pol", "moe": {"parallel": {"dp_size": 2}}},
    {"policy": "pol", "moe": {"activation": "silu"}},
    {"policy": "pol", "moe": {"lora": True}},
    {"policy": "pol", "moe": {"is_act_and_mul": False}},
    {"policy": "pol", "env": {"VLLM_FORCE_TRITON": "1"}},
    {"policy": "pol", "platform": {"kind": "rocm", "gcn_arch": "gfx942"}},
)


@dataclass
class Tally:
    """Figures of one category: how many tried and how each ended, with examples of the bad endings."""

    tried: int = 0
    endings: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, ending: str, label: str) -> None:
        self.tried += 1
        self.endings[ending] += 1
        if ending in ("crash", "hang", "changed", "unplaced"):
            self.examples.setdefault(ending, []).append(label)

    def line(self, name: str) -> str:
        order = ("rejected", "unchanged", "valid-edit", "answered", "changed", "unplaced", "crash", "hang")
        parts = [f"{k} {self.endings[k]}" for k in order if self.endings[k]]
        return f"{name}: tried {self.tried}; " + ", ".join(parts)


# ------------------------------------------------------------------ rule-file mutants

_TYPO_TOKEN = re.compile(r"(?<=[\s{\[,:])([A-Za-z_][A-Za-z0-9_.]*)(?=[\s,}\]]|$)")
_BOOL = re.compile(r"\b(true|false)\b")
_NUMBER = re.compile(r"(?<=[\s\[,:])(-?\d+(?:\.\d+)?)(?=[\s,}\]]|$)")


def _typos(word: str, rng: random.Random) -> list[str]:
    """Typo-like edits of one word: a dropped, doubled or swapped character, a changed case."""
    out = []
    if len(word) > 2:
        i = rng.randrange(len(word))
        out.append(word[:i] + word[i + 1:])
        out.append(word[:i] + word[i] + word[i:])
        j = rng.randrange(len(word) - 1)
        out.append(word[:j] + word[j + 1] + word[j] + word[j + 2:])
    out.append(word.swapcase() if word.lower() != word else word.capitalize())
    return [w for w in out if w != word]


def structural_mutants(text: str, rng: random.Random) -> Iterator[tuple[str, str]]:
    """(label, text) of edits that break the file's shape or reach a bound of oracle.limits."""
    lines = text.split("\n")
    n = len(lines)
    for i in range(1, n - 1):
        yield f"delete line {i + 1}", "\n".join(lines[:i] + lines[i + 1:])
        yield f"duplicate line {i + 1}", "\n".join(lines[:i + 1] + lines[i:])
        yield f"indent line {i + 1}", "\n".join(lines[:i] + ["  " + lines[i]] + lines[i + 1:])
        if lines[i].startswith("  "):
            yield f"dedent line {i + 1}", "\n".join(lines[:i] + [lines[i][2:]] + lines[i + 1:])
        yield f"swap lines {i + 1},{i + 2}", "\n".join(lines[:i] + [lines[i + 1], lines[i]] + lines[i + 2:])
    for i in rng.sample(range(1, n - 1), min(12, n - 2)):
        yield f"truncate at line {i + 1}", "\n".join(lines[:i])
        for junk in (":", "[", "{", "&a", "*a", "!!python/object:os.system", "\t", "'", "- "):
            col = rng.randrange(len(lines[i]) + 1)
            yield f"insert {junk!r} at line {i + 1}", "\n".join(
                lines[:i] + [lines[i][:col] + junk + lines[i][col:]] + lines[i + 1:])
    for key in ("on", "1", "true", "null", "~", "[a]"):
        yield f"top-level key {key}", text + f"\n{key}: 1\n"
    deep = "{fact: moe.lora, eq: true}"
    for _ in range(40):
        deep = "{not: " + deep + "}"
    yield "condition 40 deep", text.replace("when: {fact: moe.parallel.dp_size, gt: 1}", "when: " + deep)
    yield "flow 300 deep", text + "\nx: " + "[" * 300 + "]" * 300 + "\n"
    bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9))
    yield "alias bomb", text + "\n" + bomb
    yield "self alias", text + "\nloop: &l [*l]\n"
    yield "self alias map", text + "\nloop: &l {a: *l}\n"
    yield "4400-digit int", text + "\nbig: " + "9" * 4400 + "\n"
    yield "non-UTF-8 byte", text.replace("test family", "test f\udcffamily")
    yield "NUL byte", text.replace("test family", "test\x00family")
    yield "2 MiB file", text + "\n# " + "x" * (2 << 20) + "\n"
    many = "\n".join(f"  K{i}: {{devce: 1, why: 'a kernel of the error flood'}}" for i in range(3000))
    yield "3000 schema errors", text.replace("kernels:\n", "kernels:\n" + many + "\n", 1)


def literal_mutants(text: str, rng: random.Random) -> Iterator[tuple[str, str]]:
    """(label, text) of typo-like edits of names and values, and hostile numbers and booleans."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#") or "why:" in line or "description:" in line or "message" in line:
            continue  # prose: a typo there changes no answer by design
        for m in _TYPO_TOKEN.finditer(line):
            for typo in _typos(m.group(1), rng)[:2]:
                edited = line[:m.start(1)] + typo + line[m.end(1):]
                yield f"typo {m.group(1)!r}->{typo!r} line {i + 1}", "\n".join(lines[:i] + [edited] + lines[i + 1:])
        for m in _BOOL.finditer(line):
            for other in ("1", "0", "'true'", "'false'", "~", "tru"):
                edited = line[:m.start()] + other + line[m.end():]
                yield f"bool {m.group()}->{other} line {i + 1}", "\n".join(lines[:i] + [edited] + lines[i + 1:])
        for m in _NUMBER.finditer(line):
            for other in (".nan", ".inf", "-.inf", "1e400", str(10 ** 30), "'1'", "1.0.0", "0x"):
                edited = line[:m.start()] + other + line[m.end():]
                yield f"number {m.group()}->{other} line {i + 1}", "\n".join(lines[:i] + [edited] + lines[i + 1:])


def _answers(root: Path) -> tuple[tuple[Any, ...], ...]:
    oracle = Oracle(root)
    out = []
    for q in QUESTIONS:
        d = oracle.select(q)
        if d.outcome == "error" and "internal error" in (d.error or ""):
            raise RuntimeError(d.error)
        out.append((d.outcome, d.backend, d.kernel))
    return tuple(out)


def _write_rules(root: Path, text: str) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "r.yaml").write_bytes(text.encode("utf-8", "surrogateescape"))
    (root / "profiles.yaml").write_text("default: p\nprofiles:\n  p: {description: 'a mutant', files: [r.yaml]}\n")


def classify_rule_mutant(root: Path, text: str, expected: tuple[tuple[Any, ...], ...]) -> str:
    _write_rules(root, text)
    started = time.process_time()
    try:
        problems, _ = validate_paths([root])
        if problems:
            ending = "rejected" if all(p.line >= 1 and PLACE.search(str(p)) for p in problems) else "unplaced"
        else:
            ending = "unchanged" if _answers(root) == expected else "changed"
    except RuleError:
        ending = "rejected"
    except Exception:  # noqa: BLE001 - any escape is what the corpus counts
        ending = "crash"
    return "hang" if time.process_time() - started > HANG_SECONDS else ending


def rule_mutants(seed: int = 0) -> list[tuple[str, str, str]]:
    """(kind, label, text) of every mutant of the base rule file, structural then literal."""
    rng = random.Random(seed)
    text = BASE.read_text(encoding="utf-8")
    return ([("structural", label, t) for label, t in structural_mutants(text, rng)]
            + [("literal", label, t) for label, t in literal_mutants(text, rng)])


def run_rule_mutants(work: Path, mutants: list[tuple[str, str, str]],
                     tallies: dict[str, Tally] | None = None) -> dict[str, Tally]:
    tallies = {} if tallies is None else tallies
    _write_rules(work / "base", BASE.read_text(encoding="utf-8"))
    expected = _answers(work / "base")
    for i, (kind, label, text) in enumerate(mutants):
        ending = classify_rule_mutant(work / f"m{i}", text, expected)
        if kind == "structural" and ending == "changed":
            ending = "valid-edit"  # e.g. a deleted optional line: valid rules that mean something else
        tallies.setdefault(f"rule mutants ({kind})", Tally()).add(ending, label)
    return tallies


_PROSE = re.compile(r"^\s*(-\s*)?(why|description|message|reason|missing_why|not_implemented|[a-z_]*_why):|^\s*#")


def shipped_literal_mutants(count: int, seed: int = 0) -> list[tuple[str, int, str, str]]:
    """(file relative to rules/, line index, label, mutated line) of `count` typo-like edits of the shipped rules'
    names and values (prose lines left out: their words decide nothing)."""
    from oracle.resources import rules_dir

    rng = random.Random(seed)
    root = rules_dir()
    sites = []
    for path in sorted(root.rglob("*.yaml")):
        if path.name == "profiles.yaml":
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").split("\n")):
            if not _PROSE.search(line):
                sites += [(path.relative_to(root).as_posix(), i, m) for m in _TYPO_TOKEN.finditer(line)]
    out = []
    for rel, i, m in rng.sample(sites, min(count, len(sites))):
        line = m.string
        typo = rng.choice(_typos(m.group(1), rng))
        out.append((rel, i, f"{rel}:{i + 1} {m.group(1)!r}->{typo!r}", line[:m.start(1)] + typo + line[m.end(1):]))
    return out


def _golden_questions() -> list[dict[str, Any]]:
    data = Path(__file__).resolve().parent / "data"
    return [json.loads(line)["scenario"] for f in sorted(data.glob("golden-sample*.jsonl"))
            for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]


def _shipped_answers(root: Path, questions: list[dict[str, Any]]) -> tuple[tuple[Any, ...], ...]:
    oracle = Oracle(root)
    out = []
    for q in questions:
        d = oracle.select(q)
        if d.outcome == "error" and "internal error" in (d.error or ""):
            raise RuntimeError(d.error)
        out.append((d.outcome, d.backend, d.kernel, d.hidden_size, d.intermediate_size))
    return tuple(out)


def run_shipped_mutants(work: Path, mutants: list[tuple[str, int, str, str]], tallies: dict[str, Tally],
                        questions: int | None = None) -> None:
    """Each mutant edits one line of a copy of the shipped rules: validate, then answer the golden questions
    (the first `questions` of them; default all)."""
    import shutil

    from oracle.resources import rules_dir

    root = work / "shipped"
    shutil.copytree(rules_dir(), root)
    asked = _golden_questions()[:questions]
    expected = _shipped_answers(root, asked)
    tally = tallies.setdefault("rule mutants (literal, shipped rules)", Tally())
    for rel, i, label, mutated in mutants:
        path = root / rel
        original = path.read_text(encoding="utf-8")
        lines = original.split("\n")
        path.write_text("\n".join(lines[:i] + [mutated] + lines[i + 1:]), encoding="utf-8")
        started = time.process_time()
        try:
            problems, _ = validate_paths([root])
            if problems:
                ending = "rejected" if all(PLACE.search(str(p)) for p in problems) else "unplaced"
            else:
                ending = "unchanged" if _shipped_answers(root, asked) == expected else "changed"
        except RuleError:
            ending = "rejected"
        except Exception:  # noqa: BLE001
            ending = "crash"
        finally:
            path.write_text(original, encoding="utf-8")
        tally.add("hang" if time.process_time() - started > HANG_SECONDS else ending, label)


# ------------------------------------------------------------------ hostile scenarios

HUGE = (10 ** 30, -10 ** 30, 10 ** 5000, -10 ** 5000, 2 ** 63, -1, 0)
ODD = (float("nan"), float("inf"), -float("inf"), 1e308, -0.0, "", "x" * 10_000, "kMxfp4Statc", "garbage",
       True, None, [], {}, [[[[]]]], {"a": {"b": {}}}, "\udcff", "\x00")
SIZE_FIELDS = ("hidden_size", "intermediate_size", "num_experts", "top_k")


def nested(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def hostile_scenarios(count: int, seed: int = 0) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """(label, scenario, out_of_range) where out_of_range says a size field is outside its range (must be error)."""
    from oracle.facts import RANGES

    rng = random.Random(seed)
    fields = list(SIZE_FIELDS) + ["activation", "activation_key", "weight_key", "moe_backend", "lora", "swiglu_limit",
                                  "routing_method", "has_bias"]
    for i in range(count):
        moe: dict[str, Any] = {}
        out_of_range = False
        for name in rng.sample(fields, rng.randint(1, 3)):
            value = rng.choice(HUGE + ODD) if rng.random() < 0.8 else rng.randint(-5, 5000)
            moe[name] = value
            lo, hi = RANGES.get(f"moe.{name}", (None, None))
            if lo is not None and isinstance(value, int) and not isinstance(value, bool) and not lo <= value <= hi:
                out_of_range = True
        sc: dict[str, Any] = {"policy": rng.choice(["mxfp4", "nvfp4", "ocp-mx", "mxfp4", "nope"]), "moe": moe}
        roll = rng.random()
        if roll < 0.1:
            sc["platform"] = {"kind": "cuda", "capability": [rng.choice(HUGE), rng.choice(HUGE)]}
        elif roll < 0.2:
            sc["env"] = {"VLLM_MXFP4_USE_MARLIN": rng.choice(ODD)}
        elif roll < 0.25:
            sc["moe"] = nested(rng.choice((20, 200, 900)))
            out_of_range = False
        elif roll < 0.3:
            sc[rng.choice(["query", "profile", "backend", "packages"])] = rng.choice(HUGE + ODD)
        yield f"scenario {i}", sc, out_of_range


def classify_answer(d: Any, out_of_range: bool) -> str:
    if d.outcome == "error" and "internal error" in (d.error or ""):
        return "crash"
    if out_of_range and d.outcome != "error":
        return "changed"  # an out-of-range size answered: what the bounds must prevent
    return "rejected" if d.outcome == "error" else "answered"


def run_scenarios(oracle: Oracle, count: int, tallies: dict[str, Tally], seed: int = 0) -> None:
    tally = tallies.setdefault("hostile scenarios (Oracle.select)", Tally())
    for label, sc, out_of_range in hostile_scenarios(count, seed):
        started = time.process_time()
        try:
            ending = classify_answer(oracle.select(sc), out_of_range)
        except Exception:  # noqa: BLE001
            ending = "crash"
        tally.add("hang" if time.process_time() - started > HANG_SECONDS else ending, label)


def batch_lines(count: int, seed: int = 0) -> list[bytes]:
    """Hostile batch lines: hostile scenarios as JSON, and lines that are not JSON objects at all."""
    rng = random.Random(seed)
    raw = [b"[" * 100_000, b"{" * 5000, b'{"policy": "mxfp4", "moe": {"hidden_size": ' + b"9" * 5000 + b"}}",
           b"\xff\xfe not utf-8", b"null", b"42", b'"text"', b'{"policy": 1e999}', b'{"scenario": []}',
           b'{"policy": "mxfp4", "moe": {"top_k": NaN}}', b"{'single': 'quotes'}", b"\x00"]
    out = []
    for label, sc, _ in hostile_scenarios(count, seed + 1):
        try:
            out.append(json.dumps(sc, allow_nan=True).encode("utf-8", "surrogateescape"))
        except (ValueError, RecursionError):
            out.append(label.encode())
        if rng.random() < 0.1:
            out.append(rng.choice(raw))
    return out + raw


def run_batch(tmp: Path, lines: list[bytes], tallies: dict[str, Tally],
              main: Callable[[list[str]], int] | None = None) -> tuple[int, int]:
    """Feed `lines` to `select --batch`; (answers written, lines given). Each answer is tallied."""
    import contextlib
    import io

    from oracle.cli import main as cli_main

    run = main or cli_main
    path = tmp / "batch.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    out = io.StringIO()
    started = time.process_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            run(["select", "--batch", str(path)])
        except BaseException:  # noqa: BLE001
            pass
    per_line = (time.process_time() - started) / max(1, len(lines))
    answers = [json.loads(line) for line in out.getvalue().splitlines()]
    tally = tallies.setdefault("batch lines (select --batch)", Tally())
    for i, a in enumerate(answers):
        internal = a.get("outcome") == "error" and "internal error" in (a.get("error") or "")
        placed = a.get("outcome") != "error" or str(path) in (a.get("error") or "")
        tally.add("crash" if internal else "hang" if per_line > HANG_SECONDS else
                  ("rejected" if placed else "unplaced") if a.get("outcome") == "error" else "answered", f"line {i + 1}")
    for i in range(len(answers), sum(1 for line in lines if line.strip())):
        tally.add("crash", f"line {i + 1} unanswered")
    return len(answers), sum(1 for line in lines if line.strip())


# ------------------------------------------------------------------ security probes

def security_probes(tmp: Path) -> Iterator[tuple[str, bool]]:
    """(probe, held) for each attempt to run a command or write outside the named target: held means the
    command refused (exit 2 or 3) and the sentinel file neither appeared nor changed."""
    import contextlib
    import io
    import os
    import shutil
    import subprocess

    from oracle.cli import main
    from oracle.resources import rules_dir

    def quiet(argv: list[str]) -> int:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return main(argv)

    repo = tmp / "repo"
    shutil.copytree(rules_dir(), repo / "rules")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "rules"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, env=env)
    sentinel, victim = tmp / "ran", tmp / "victim.txt"
    victim.write_text("keep")
    cmd = f"touch {sentinel}"
    here = Path.cwd()
    os.chdir(repo)
    try:
        for rev in (f"--remote=ext::sh -c {cmd}:--exec={cmd}", f"--exec={cmd}", f"--output={victim}",
                    f"--output={victim}:rules", f"HEAD:--output={victim}", f"HEAD:{victim}", "HEAD:../..", "-h",
                    ":rules", f"HEAD --output={victim}"):
            code = quiet(["diff", f"git:{rev}", "rules"])
            yield f"diff git:{rev}", code == 2 and not sentinel.exists() and victim.read_text() == "keep"
    finally:
        os.chdir(here)
    outside = tmp / "outside.yaml"
    for argv_of, name in ((lambda d: ["fmt", str(d)], "link.yaml"),
                          (lambda d: ["schema", "--write", str(d)], "profiles.schema.json"),
                          (lambda d: ["sweep", "--policy", "mxfp4", "-o", str(d / "link.yaml")], "link.yaml")):
        outside.write_text("a:    1\n")
        target = tmp / f"target-{name}-{len(argv_of(tmp))}"
        target.mkdir()
        (target / name).symlink_to(outside)
        code = quiet(argv_of(target))
        yield f"{argv_of(target)[0]} through a symlink", code in (2, 3) and outside.read_text() == "a:    1\n"
    for listed in (str(outside), "../outside.yaml", "sub/../../outside.yaml"):
        rules = tmp / f"rules-{abs(hash(listed))}"
        rules.mkdir()
        (rules / "profiles.yaml").write_text(f"default: p\nprofiles:\n  p: {{description: d, files: ['{listed}']}}\n")
        yield f"profiles.yaml lists {listed}", quiet(["--rules", str(rules), "validate"]) == 3
