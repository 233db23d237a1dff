"""The tool verbs end to end: test (golden + coverage), sweep, fmt, schema, formats, global options."""
from __future__ import annotations

import json
from pathlib import Path

import yaml
from test_tools_space import _only_profile

from oracle.cli import main
from oracle.tools.fmt import format_text

CPU = {"policy": "mxfp4", "profile": "moe-oracle", "platform": {"kind": "cpu"}, "packages": {"triton": False}}


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _golden(tmp_path, expected):
    f = tmp_path / "golden.jsonl"
    f.write_text(json.dumps({"scenario": CPU, "expected": expected}) + "\n")
    return f


def test_golden_pass_with_coverage(capsys, tmp_path):
    f = _golden(tmp_path, {"outcome": "selected", "backend": "EMULATION"})
    code, out, _ = run(capsys, "test", str(f))
    assert code == 0 and "1/1 passed" in out
    assert "never: TRITON_MOE" in out  # the case never selected the Triton backend
    code, out, _ = run(capsys, "test", str(f), "--min-coverage", "99")
    assert code == 1 and "below --min-coverage 99%" in out


def test_golden_wrong_expectation_fails_and_shows_trace(capsys, tmp_path):
    f = _golden(tmp_path, {"outcome": "selected", "backend": "TRITON_MOE"})
    code, out, _ = run(capsys, "test", str(f))
    assert code == 1
    assert f"FAIL {f}:1" in out and 'backend: expected "TRITON_MOE", got "EMULATION"' in out
    assert "decided by step 'auto'" in out and "TritonMoeW4A16" in out  # the trace names the rejected kernel
    code, out, _ = run(capsys, "test", str(f), "--format", "github")
    assert code == 1 and out.startswith(f"::error file={f},line=1::golden-mismatch")


def test_sweep_formats(capsys, tmp_path):
    code, out, _ = run(capsys, "sweep", "--profile", "moe-oracle", "--policy", "mxfp4", "--format", "csv")
    rows = out.strip().splitlines()
    assert code == 0 and rows[0].startswith("profile,policy,configuration,platform,outcome,backend")
    cpu = [r for r in rows if ",cpu," in r]
    triton_on_cpu = [r for r in cpu if ",TRITON_MOE," in r]
    # on CPU the Triton kernels run only under the interpreter (rules/moe-oracle/w4a16.yaml triton_runs_here)
    assert triton_on_cpu and all("TRITON_INTERPRET=1" in r and "triton installed" in r for r in triton_on_cpu)
    assert any(",EMULATION," in r for r in cpu)
    html = tmp_path / "s.html"
    code, _, _ = run(capsys, "sweep", "--profile", "moe-oracle", "--format", "html", "-o", str(html))
    text = html.read_text()
    assert code == 0 and "http" not in text.replace("http-equiv", "")  # self-contained: no network reference
    assert "decided by step auto at" in text and "TRITON_MOE" in text


def test_fmt_is_idempotent_and_keeps_comments(capsys, tmp_path):
    messy = ("# yaml-language-server: $schema=../../schemas/rules.schema.json\n\n\n# header comment\n"
             "derived:\n    flag:   \n        # why it exists\n        when: {fact: moe.lora, eq: true}\n"
             "        why: \"x\"   \n\n\n\n")
    once = format_text(messy)
    assert format_text(once) == once
    assert "# header comment" in once and "    # why it exists" in once
    assert yaml.safe_load(once) == yaml.safe_load(messy)
    f = tmp_path / "r.yaml"
    f.write_text(messy)
    assert run(capsys, "fmt", "--check", str(f))[0] == 1 and f.read_text() == messy
    assert run(capsys, "fmt", str(f))[0] == 0 and f.read_text() == once
    assert run(capsys, "fmt", "--check", str(f))[0] == 0


def test_fmt_on_shipped_rules_keeps_meaning_and_comments():
    rules = Path(__file__).resolve().parent.parent / "rules"
    for f in sorted(rules.rglob("*.yaml")):
        text = f.read_text()
        once = format_text(text)
        assert format_text(once) == once, f
        assert yaml.safe_load(once) == yaml.safe_load(text), f
        comments = [line.strip() for line in text.splitlines() if line.strip().startswith("#")]
        assert comments == [line.strip() for line in once.splitlines() if line.strip().startswith("#")], f


def test_rules_option_after_the_verb_and_lint_formats(capsys, tmp_path):
    root = _only_profile(tmp_path, "moe-oracle")
    code, out, _ = run(capsys, "profiles", "--rules", str(root))
    assert code == 0 and out.startswith("moe-oracle") and "policies: mxfp4" in out
    code, out, _ = run(capsys, "lint", "--rules", str(root), "--format", "sarif")
    report = json.loads(out)
    assert report["version"] == "2.1.0"
    results = report["runs"][0]["results"]
    assert results and all(r.get("suppressions") for r in results)  # the shipped acknowledgements, as SARIF says
    assert code == 0


def test_schema_and_version(capsys):
    code, out, _ = run(capsys, "schema")
    assert code == 0 and json.loads(out)["$id"].endswith("rules.schema.json")
    code, _, err = run(capsys, "schema", "nope")
    assert code == 2 and "one of" in err


def test_quark_flags_reach_the_ocp_mx_policy(capsys):
    base = ["select", "--policy", "ocp-mx", "--profile", "vllm-0.20", "--platform", "rocm:gfx950", "--json"]
    quark = ["--quark", "weight.dtype=fp4", "--quark", "input.dtype=fp4", "--quark", "weight.qscheme=per_group",
             "--quark", "input.qscheme=per_group", "--quark", "input.is_dynamic=true"]
    _, without, _ = run(capsys, *base)
    code, with_quark, _ = run(capsys, *base, *quark)
    assert code == 0 and '"w_mxfp4_a_mxfp4"' in with_quark  # the Quark config picks the OCP-MX scheme
    assert "w_mxfp4_a_mxfp4" not in without
    code, _, err = run(capsys, "select", "--policy", "ocp-mx", "--quark", "nope")
    assert code == 2 and "--quark 'nope': expected FIELD=VALUE" in err
