"""The hostile-input suite (a bounded sample of tests/hostile_corpus.py; `python benchmarks/hostile_input.py`
runs all of it and prints the figures): rule-file mutants are rejected with their place or change no answer,
Oracle.select and `select --batch` never raise and answer every line, out-of-range sizes are never selected,
and the security probes run no command and write nothing."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import hostile_corpus as corpus
import pytest

from oracle import Oracle
from oracle.decision import OUTCOMES
from oracle.facts import RANGES
from oracle.limits import shown
from oracle.validate import validate_paths

ORACLE = Oracle()
BAD_ENDINGS = ("changed", "unplaced", "crash", "hang")


def _assert_clean(tallies: dict[str, corpus.Tally]) -> None:
    for name, tally in tallies.items():
        bad = {e: tally.examples.get(e, []) for e in BAD_ENDINGS if tally.endings[e]}
        assert not bad, f"{tally.line(name)}: {bad}"


def test_every_mutant_of_the_base_rule_file_is_rejected_with_its_place_or_changes_nothing(tmp_path):
    mutants = corpus.rule_mutants(seed=0)
    assert len(mutants) > 500
    tallies = corpus.run_rule_mutants(tmp_path, mutants)
    _assert_clean(tallies)
    structural = tallies["rule mutants (structural)"]
    assert structural.endings["rejected"] > structural.tried // 2  # the corpus does reach the checks


def test_typo_like_edits_of_the_shipped_rules_are_rejected_or_change_no_golden_answer(tmp_path):
    tallies: dict[str, corpus.Tally] = {}
    corpus.run_shipped_mutants(tmp_path, corpus.shipped_literal_mutants(12, seed=1), tallies, questions=200)
    _assert_clean(tallies)


def test_the_known_typos_that_used_to_validate_are_rejected_at_their_place(tmp_path):
    """The issue's reproducers: each names file:line:col."""
    base = corpus.BASE.read_text(encoding="utf-8")
    cond = "when: {fact: moe.parallel.dp_size, gt: 1}"
    for edit, words in ((cond.replace("moe.parallel.dp_size, gt: 1", "moe.moe_backend, ne: auot"), "'auot'"),
                        (cond.replace("moe.parallel.dp_size, gt: 1", "quark.weight.scale_format, eq: e80m"), "e80m"),
                        (cond.replace("moe.parallel.dp_size, gt: 1", 'platform.capability, ge: "7.50"'), "7.50"),
                        (cond.replace("moe.parallel.dp_size, gt: 1", "moe.swiglu_limit, eq: .nan"), "NaN"),
                        (cond.replace("moe.parallel.dp_size, gt: 1", "moe.lora, eq: 1"), "true or false")):
        corpus._write_rules(tmp_path, base.replace(cond, edit))
        problems, _ = validate_paths([tmp_path])
        assert len(problems) == 1 and words in problems[0].message, (edit, problems)
        assert (problems[0].line, problems[0].col) > (1, 1)
    values = base.replace("derived:", "values:\n  fast:\n    when: {fact: moe.lora, eq: false}\n    why: \"a boolean "
                                      "value\"\nderived:").replace(cond, "when: {value: fast, eq: \"true\"}")
    corpus._write_rules(tmp_path, values)
    problems, _ = validate_paths([tmp_path])
    assert [p.message for p in problems] == ["value 'fast' is never 'true' (did you mean 'True'?); it is one of "
                                             "true, false"]
    corpus._write_rules(tmp_path, values.replace('eq: \"true\"', "eq: rue"))
    problems, _ = validate_paths([tmp_path])
    assert [p.message for p in problems] == ["'rue' reads as the text 'rue', one typo from YAML's true; write true, "
                                             "or quote it ('rue') if the text is meant"]
    defaults = base.replace("moe.activation: swigluoai", "moe.activation: swiguoai")
    corpus._write_rules(tmp_path, defaults)
    problems, _ = validate_paths([tmp_path])
    assert len(problems) == 1 and "unknown activation 'swiguoai'" in problems[0].message


def test_a_flood_of_schema_errors_is_reported_in_linear_time_first_100_and_a_count(tmp_path):
    many = "\n".join(f"  K{i}: {{devce: 1, why: 'a kernel of the error flood'}}" for i in range(3000))
    corpus._write_rules(tmp_path, corpus.BASE.read_text(encoding="utf-8").replace("kernels:\n", f"kernels:\n{many}\n", 1))
    problems, _ = validate_paths([tmp_path])
    schema = [p for p in problems if "devce" in p.message]
    assert len(schema) == 100
    assert any("2,900 more schema problems in this file (the first 100 are listed)" in p.message for p in problems)


# ------------------------------------------------------------------ property-based fuzz of select and --batch
# Seeded random generation (no extra dependency): each test draws fresh structured values from a fixed seed, so
# a failure reproduces; the figures command draws more of them.

_MOE_FIELDS = ("hidden_size", "intermediate_size", "num_experts", "top_k", "activation", "activation_key",
               "weight_key", "moe_backend", "lora", "swiglu_limit", "routing_method", "is_act_and_mul")


def _leaf(rng: random.Random) -> Any:
    pick = rng.randrange(7)
    if pick == 0:
        return rng.randint(-10 ** rng.randint(1, 40), 10 ** rng.randint(1, 40))
    if pick == 1:
        return rng.choice(corpus.HUGE)
    if pick == 2:
        return rng.choice([float("nan"), float("inf"), -float("inf"), rng.uniform(-1e6, 1e6), 1e308, -0.0])
    if pick == 3:
        return "".join(rng.choice("aZ_.-9 \u00e9\x00\udcff") for _ in range(rng.randint(0, 12)))
    if pick == 4:
        return rng.choice([True, False, None])
    if pick == 5:
        return rng.choice(["kMxfp4Static", "kMxfp4Statc", "silu", "swigluoai", "auto", "garbage", "9.0", "e8m0"])
    return rng.randint(-5, 5000)


def _value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth < 3 and roll < 0.15:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 3 and roll < 0.3:
        return {_leaf(rng) if rng.random() < 0.2 and depth else shown(_leaf(rng))[:6]: _value(rng, depth + 1)
                for _ in range(rng.randint(0, 3))}
    return _leaf(rng)


def _scenario(rng: random.Random) -> dict[str, Any]:
    sc: dict[str, Any] = {"policy": rng.choice(["mxfp4", "nvfp4", "ocp-mx", "mxfp4-deepseek-v4", _leaf(rng)])}
    if rng.random() < 0.8:
        sc["moe"] = {rng.choice(_MOE_FIELDS) if rng.random() < 0.9 else shown(_leaf(rng))[:5]: _value(rng)
                     for _ in range(rng.randint(0, 4))}
    if rng.random() < 0.3:
        sc["platform"] = {"kind": rng.choice(["cuda", "rocm", "xpu", "cpu", _leaf(rng)]),
                          rng.choice(["capability", "gcn_arch", "amx"]): _value(rng)}
    for key in ("env", "quark", "profile", "query", "packages", "backend"):
        if rng.random() < 0.08:
            sc[key] = _value(rng)
    return sc


def _out_of_range(sc: dict[str, Any]) -> bool:
    moe = sc.get("moe")
    if not isinstance(moe, dict):
        return False
    for field in ("hidden_size", "intermediate_size", "num_experts", "top_k"):
        value = moe.get(field)
        lo, hi = RANGES[f"moe.{field}"]
        if isinstance(value, int) and not isinstance(value, bool) and not lo <= value <= hi:
            return True
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            return True
    return False


@pytest.mark.parametrize("seed", range(4))
def test_select_never_raises_and_never_selects_an_out_of_range_size(seed):
    rng = random.Random(seed)
    for _ in range(250):
        sc = _scenario(rng)
        d = ORACLE.select(sc)
        assert d.outcome in OUTCOMES and "internal error" not in (d.error or ""), (shown(sc), d.error)
        if _out_of_range(sc):
            assert d.outcome == "error", (shown(sc), d.outcome)


def _line(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.7:
        try:
            return json.dumps(_scenario(rng)).encode("utf-8", "surrogateescape")
        except ValueError:  # an int too long for Python to write: the same as JSON text
            return b'{"policy": "mxfp4", "moe": {"hidden_size": -' + b"9" * 5001 + b"}}"
    if roll < 0.85:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
    return rng.choice([b"[" * 100_000, b"\xff", b'{"policy": 1e999}', b"9" * 5000, b"{" * 3000, b"null"])


@pytest.mark.parametrize("seed", range(3))
def test_select_batch_answers_every_line(tmp_path, seed):
    rng = random.Random(seed)
    lines = [_line(rng).replace(b"\n", b" ").replace(b"\r", b" ") for _ in range(150)]
    tallies: dict[str, corpus.Tally] = {}
    answered, given_lines = corpus.run_batch(tmp_path, lines, tallies)
    assert answered == given_lines
    _assert_clean(tallies)


def test_the_hostile_batch_corpus_is_answered_line_by_line(tmp_path):
    tallies: dict[str, corpus.Tally] = {}
    answered, given_lines = corpus.run_batch(tmp_path, corpus.batch_lines(300), tallies)
    assert answered == given_lines > 300
    _assert_clean(tallies)


def test_the_hostile_scenario_corpus(tmp_path):
    tallies: dict[str, corpus.Tally] = {}
    corpus.run_scenarios(ORACLE, 1500, tallies)
    _assert_clean(tallies)


def test_the_security_probes_of_the_figures_hold(tmp_path):
    results = list(corpus.security_probes(tmp_path))
    assert len(results) >= 16 and all(held for _, held in results), [p for p, held in results if not held]


# ------------------------------------------------------------------ scenario files and lines: the issue's reproducers

def _cli(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    from oracle.cli import main

    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("text,words", [
    ("policy: mxfp4\nmoe:\n  hidden_size: 2880\n  hidden_size: 4096\n", "s.yaml:4:3: duplicate key 'hidden_size' "
                                                                        "(first defined at line 3)"),
    ('{"policy": "mxfp4", "policy": "nvfp4"}', "duplicate key 'policy'"),
    ("policy: mxfp4\non: 1\n", "s.yaml:2:1: key 'on' reads as a boolean in YAML (True), not as a name"),
    ("policy: mxfp4\nmoe: " + "[" * 30 + "]" * 30 + "\n", "the scenario nests deeper than 16 levels"),
    ("policy: mxfp4\nx: &a [*a]\n", "s.yaml:2:4: an alias refers to a node that contains it"),
    ("policy: mxfp4\nmoe: {hidden_size: " + "9" * 5000 + "}\n", "an integer of 5000 digits; the limit is 20 digits"),
])
def test_a_hostile_scenario_file_is_one_located_error(tmp_path, capsys, text, words):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    code, out, err = _cli(["select", "--scenario", str(path)], capsys)
    assert code == 2 and words in err and "Traceback" not in err, err


def test_a_non_utf8_scenario_file_names_the_byte(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_bytes(b"policy: mxfp4\nmoe: {activation: \xff}\n")
    code, _, err = _cli(["select", "--scenario", str(path)], capsys)
    assert code == 2 and "s.yaml:2:19: byte 0xff is not UTF-8" in err


def test_a_file_over_the_size_limit_is_one_error_naming_it_before_parsing(tmp_path, capsys, monkeypatch):
    """Every reader of an input file (a scenario from a path or stdin, a rule file through validate and fmt) stops
    at MAX_FILE_BYTES: one message naming the file, and an endless input (a device) is refused as soon as it is
    over, not read until memory runs out."""
    import io

    from oracle.limits import MAX_FILE_BYTES

    big = "policy: mxfp4\n" + "#" * MAX_FILE_BYTES + "\n"
    rules = tmp_path / "rules"
    rules.mkdir()
    scenario_path, rule_path = tmp_path / "s.yaml", rules / "big-rules.yaml"
    scenario_path.write_text(big)
    rule_path.write_text(big)
    limit = f"is larger than {MAX_FILE_BYTES:,} bytes (the limit); split it into several files"
    sources = [str(scenario_path)] + (["/dev/zero"] if Path("/dev/zero").exists() else [])
    for source in sources:
        code, _, err = _cli(["select", "--scenario", source], capsys)
        assert code == 2 and f"{Path(source).name}:1:1: the file {limit}" in err and "Traceback" not in err, err
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(big.encode())))
    code, _, err = _cli(["select", "--scenario", "-"], capsys)
    assert code == 2 and f"-:1:1: the file {limit}" in err, err
    problems, _ = validate_paths([rule_path])
    assert [(Path(p.file).name, p.message) for p in problems] == [("big-rules.yaml", "the file " + limit)]
    code, _, err = _cli(["fmt", str(rules)], capsys)
    assert code == 2 and f"big-rules.yaml:1:1: the file {limit}" in err and rule_path.read_text() == big, err
    monkeypatch.setattr("oracle.limits.MAX_GOLDEN_BYTES", 1000)  # golden files have a limit of their own
    golden = tmp_path / "golden.jsonl"
    golden.write_text('{"scenario": {"policy": "mxfp4"}, "expected": {}}\n' * 100)
    code, _, err = _cli(["test", str(golden)], capsys)
    assert code != 0 and "golden.jsonl:1:1: the file is larger than 1,000 bytes (the limit)" in err, err


def test_a_batch_line_that_never_ends_is_answered_as_soon_as_it_passes_the_limit():
    """select --batch on an endless line (/dev/zero, a stuck writer): its error answer comes after one bounded
    read, not after a skip that would never end."""
    from oracle.batch import _lines

    class Endless:
        reads = 0

        def readline(self, size):
            self.reads += 1
            if self.reads > 3:
                raise AssertionError("read on past the first line's limit before answering it")
            return b"\0" * size

    stream = Endless()
    assert next(_lines(stream)) is None and stream.reads == 1


def test_batch_lines_of_the_issue_are_each_answered(tmp_path, capsys):
    lines = [b'{"policy": "mxfp4", "profile": "vllm-0.20"}', b"[" * 1000 + b"]" * 1000,
             b'{"policy": "mxfp4", "moe": {"hidden_size": ' + b"9" * 4400 + b"}}",
             b'{"policy": "mxfp4", "policy": "nvfp4"}', b"\xff\xfe", b'{"policy": "mxfp4", "moe": ' + b'{"a": ' * 40
             + b"1" + b"}" * 41, b'{"policy": "mxfp4", "profile": "vllm-0.20"}']
    path = tmp_path / "b.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    code, out, _ = _cli(["select", "--batch", str(path)], capsys)
    answers = [json.loads(line) for line in out.splitlines()]
    assert code == 1 and [a["outcome"] for a in answers] == ["selected", "error", "error", "error", "error", "error",
                                                             "selected"]
    errors = [a["error"] for a in answers[1:-1]]
    assert all(e.startswith(f"{path}:{i}") for i, e in enumerate(errors, 2)), errors
    assert "nested deeper than 16 levels" in errors[0] and "duplicate key 'policy'" in errors[2]
    assert "byte 0xff is not UTF-8" in errors[3] and "nested deeper than 16" in errors[4]


def test_select_turns_an_unforeseen_failure_into_an_error_answer(monkeypatch):
    """The documented promise holds even for a bug: a RecursionError deep inside is an `error` answer."""
    oracle = Oracle()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(oracle, "_answer", broken)
    d = oracle.select({"policy": "mxfp4", "profile": "vllm-0.20"})
    assert d.outcome == "error" and d.error.startswith("internal error RecursionError: nested too deeply")


@pytest.mark.parametrize("rel,line,old,new", [
    ("vllm-0.33/ocp-mx.yaml", 101, "w_mxfp6_e3m2_a_fp8", "w_mxfp6_em32_a_fp8"),  # a table result
    ("vllm-0.33/ocp-mx.yaml", 93, "mxfp6_e3m2", "mxfp6e3m2"),  # a table key cell
    ("vllm-0.33/ocp-mx.yaml", 58, "kFp8DynamicTensorSym", "kFp8DynamicTensorySm"),  # a compared value result
    ("vllm-0.20/ocp-mx.yaml", 51, "w_mxfp4_a_mxfp6_e2m3", "w_mxfp4_a_mxfp6_em3"),  # a compared literal
    ("common/platform.yaml", 172, "batch_invariant", "bacth_invariant"),  # the kernel field a check reads
    ("vllm-0.33/ocp-mx.yaml", 79, "null", "nul"),  # a typo of YAML's null reads as text
])
def test_typos_in_tables_and_value_results_are_rejected(tmp_path, rel, line, old, new):
    """Typos in the shipped rules that once validated and changed answers: now each is a located error."""
    from oracle.resources import rules_dir

    text = (rules_dir() / rel).read_text(encoding="utf-8").split("\n")[line - 1]
    assert old in text
    tallies: dict[str, corpus.Tally] = {}
    corpus.run_shipped_mutants(tmp_path, [(rel, line - 1, f"{rel}:{line}", text.replace(old, new, 1))], tallies,
                               questions=50)
    assert tallies["rule mutants (literal, shipped rules)"].endings["rejected"] == 1, tallies
