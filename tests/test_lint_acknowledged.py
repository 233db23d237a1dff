"""Acknowledged lint findings (inline `lint_allow`, baselines), --fail-on, and the shipped rules passing their own
gates: validate, fmt --check, lint and the shipped pre-commit hooks, run on a fresh copy."""
from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml
from test_tools_space import _only_profile

from oracle.cli import main
from oracle.resources import rules_dir
from oracle.tools.lint import LEVELS

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _env_var_unused(root: Path) -> Path:
    """A moe-oracle-only copy with one env var no policy reads (an unused-env-var finding)."""
    path = root / "moe-oracle" / "w4a16.yaml"
    text = path.read_text()
    assert text.count("\nenv_vars:\n") == 1
    path.write_text(text.replace("\nenv_vars:\n", "\nenv_vars:\n  MOE_ORACLE_TEST_UNUSED:\n    parse: int_bool\n"
                                 "    default: false\n    why: \"declared for the test, read by nothing\"\n"))
    return path


def test_the_lint_rule_ids_are_the_schema_ids():
    schema = json.loads((ROOT / "schemas" / "rules.schema.json").read_text())
    assert schema["$defs"]["lint_allow"]["propertyNames"]["enum"] == list(LEVELS)


def test_inline_acknowledgement_needs_a_reason_and_silences_the_finding(capsys, tmp_path):
    root = _only_profile(tmp_path, "moe-oracle")
    path = _env_var_unused(root)
    code, out, _ = run(capsys, "lint", str(root))
    assert code == 1 and "[unused-env-var]" in out and "MOE_ORACLE_TEST_UNUSED" in out
    text = path.read_text()
    path.write_text(text.replace('read by nothing"\n', 'read by nothing"\n    lint_allow: {unused-env-var: ""}\n'))
    code, _, err = run(capsys, "validate", str(root))
    assert code == 3 and "lint_allow.unused-env-var" in err + _  # an empty reason is a schema error
    path.write_text(text.replace('read by nothing"\n', 'read by nothing"\n    lint_allow: {unused-env-vars: "a '
                                                        'typo in the rule id"}\n'))
    code, out, _ = run(capsys, "validate", str(root))
    assert code == 3 and "unused-env-vars" in out
    reason = "kept for the test: nothing reads it on purpose"
    path.write_text(text.replace('read by nothing"\n', f'read by nothing"\n    lint_allow: {{unused-env-var: "{reason}"}}\n'))
    code, out, _ = run(capsys, "lint", str(root))
    assert code == 0 and "MOE_ORACLE_TEST_UNUSED" not in out and "5 acknowledged" in out
    code, out, _ = run(capsys, "lint", str(root), "--format", "json")
    [found] = [f for f in json.loads(out)["findings"] if "MOE_ORACLE_TEST_UNUSED" in f["message"]]
    assert code == 0 and reason in found["acknowledged"]
    code, out, _ = run(capsys, "lint", str(root), "--format", "sarif")
    [result] = [r for r in json.loads(out)["runs"][0]["results"] if "MOE_ORACLE_TEST_UNUSED" in r["message"]["text"]]
    assert result["suppressions"][0]["kind"] == "inSource" and reason in result["suppressions"][0]["justification"]
    code, out, _ = run(capsys, "lint", str(root), "--format", "github")
    assert code == 0 and "MOE_ORACLE_TEST_UNUSED" not in out


def test_baseline_file_and_fail_on(capsys, tmp_path):
    root = _only_profile(tmp_path, "moe-oracle")
    _env_var_unused(root)
    code, _, _ = run(capsys, "lint", str(root), "--fail-on", "error")
    assert code == 0  # an unused env var is a warning
    code, _, _ = run(capsys, "lint", str(root), "--fail-on", "warning")
    assert code == 1
    baseline = tmp_path / "lint-baseline.yaml"
    code, out, err = run(capsys, "lint", str(root), "--write-baseline", str(baseline))
    assert code == 1 and f"wrote {baseline}" in err
    entries = yaml.safe_load(baseline.read_text())["findings"]
    assert [e["rule"] for e in entries] == ["unused-env-var"] and "MOE_ORACLE_TEST_UNUSED" in entries[0]["message"]
    code, out, err = run(capsys, "lint", str(root), "--baseline", str(baseline))
    assert code == 0 and out.startswith("ok: no findings; 5 acknowledged") and not err  # 4 shipped, 1 baseline
    # a line shift elsewhere keeps the baseline valid (entries match by rule and message, not line)
    path = root / "moe-oracle" / "w4a16.yaml"
    path.write_text("# a new first comment\n" + path.read_text())
    assert run(capsys, "lint", str(root), "--baseline", str(baseline))[0] == 0
    # an entry that matches nothing any more is named, and a malformed baseline is one clear error
    stale = {"findings": entries + [{"rule": "unreachable-step", "message": "step 'gone' of policy x is never "
                                     "reached: earlier steps decide every input", "reason": "was intended"}]}
    baseline.write_text(yaml.safe_dump(stale))
    code, _, err = run(capsys, "lint", str(root), "--baseline", str(baseline))
    assert code == 0 and "step 'gone'" in err and "matches no finding" in err
    baseline.write_text(yaml.safe_dump({"findings": [{"rule": "unused-env-var", "message": "x"}]}))
    code, _, err = run(capsys, "lint", str(root), "--baseline", str(baseline))
    assert code == 2 and "findings entry 1: expected exactly rule, message and reason" in err


def test_the_shipped_rules_acknowledge_every_finding_with_a_reason(capsys):
    code, out, _ = run(capsys, "lint", "--format", "json")
    found = json.loads(out)["findings"]
    assert code == 0 and found and all(f.get("acknowledged") for f in found)
    # vLLM's activation-key conflict step is reachable both ways once the two keys it compares vary
    assert not [f for f in found if f["rule"].startswith("always-")]


def test_shipped_pre_commit_hooks_pass_on_a_fresh_copy(capsys, tmp_path, monkeypatch):
    """Every hook of .pre-commit-hooks.yaml, its entry run as pre-commit would (files matching `files:` passed
    when pass_filenames) in a repository holding a copy of the shipped rules: all exit 0."""
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    shutil.copytree(rules_dir(), tmp_path / "rules")
    monkeypatch.chdir(tmp_path)
    files = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "rules").rglob("*"))
    assert {h["id"] for h in hooks} == {"moe-oracle-validate", "moe-oracle-fmt", "moe-oracle-lint"}
    for hook in hooks:
        argv = shlex.split(hook["entry"])
        assert argv[0] == "moe-oracle", hook
        matching = [f for f in files if re.search(hook["files"], f)]
        assert matching, hook["id"]
        code, out, err = run(capsys, *argv[1:], *(matching if hook.get("pass_filenames", True) else []))
        assert code == 0, f"hook {hook['id']} failed on a fresh copy of the shipped rules:\n{out}\n{err}"


@pytest.mark.parametrize("command", [["validate", "{copy}"], ["lint", "{copy}"], ["fmt", "--check", "{copy}"],
                                     ["--rules", "{copy}", "validate"], ["--rules", "{copy}", "lint"]])
def test_a_copied_rules_directory_passes_every_gate(capsys, tmp_path, command):
    copy = tmp_path / "my-rules"
    shutil.copytree(rules_dir(), copy)
    code, out, err = run(capsys, *(part.format(copy=copy) for part in command))
    assert code == 0, out + err


def test_an_acknowledgement_that_acknowledges_nothing_is_reported(capsys, tmp_path):
    root = _only_profile(tmp_path, "moe-oracle")
    path = root / "moe-oracle" / "w4a16.yaml"
    text = path.read_text()
    old = "      - id: auto\n"
    assert text.count(old) >= 1
    path.write_text(text.replace(old, old + '        lint_allow: {always-false: "it used to be false on every '
                                             'input"}\n', 1))
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "lint_allow: {always-false" in t)
    code, out, _ = run(capsys, "lint", str(root))
    assert code == 1 and f"w4a16.yaml:{line}: warning [unused-acknowledgement] lint_allow names always-false" in out
    code, out, _ = run(capsys, "lint", str(root), "--profile", "moe-oracle")
    assert code == 0 and "unused-acknowledgement" not in out  # one profile alone cannot tell


def test_write_baseline_never_writes_through_a_link_out_of_its_directory(capsys, tmp_path):
    root = _only_profile(tmp_path, "moe-oracle")
    _env_var_unused(root)
    out_dir, outside = tmp_path / "out", tmp_path / "outside.yaml"
    out_dir.mkdir()
    outside.write_text("precious\n")
    (out_dir / "lint-baseline.yaml").symlink_to(outside)
    code, _, err = run(capsys, "lint", str(root), "--write-baseline", str(out_dir / "lint-baseline.yaml"))
    assert code == 2 and "refusing to write through the symlink" in err and outside.read_text() == "precious\n"
