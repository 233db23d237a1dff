"""One error style on the command line (issue 14 item 6): every stderr line of every failing path is
`moe-oracle: error: ...` or `moe-oracle: warning: ...`, with the documented exit code, never a traceback."""
from __future__ import annotations

import json
import re

import pytest
from test_rule_directory import BAD, rules_dir

import oracle.cli as cli
from oracle.cli import main

STYLE = re.compile(r"^moe-oracle: (error|warning): \S")
SM90 = ["--policy", "mxfp4", "--platform", "cuda:9.0"]
OVERRIDES_UNKNOWN_BACKEND = """\
overrides:
  - id: typo
    match: {role: draft}
    backend: MARLN
    why: "a typo"
"""
OVERRIDES_SCHEMA_ERROR = "overrides:\n  - id: x\n    mach: {role: draft}\n    backend: MARLIN\n    why: w\n"


def _cases(tmp_path):
    (tmp_path / "broken").mkdir()
    broken = rules_dir(tmp_path / "broken", {"r.yaml": (BAD / "unknown_package.yaml").read_text()}, ["r.yaml"])
    bad_backend = tmp_path / "o1.yaml"
    bad_backend.write_text(OVERRIDES_UNKNOWN_BACKEND)
    bad_schema = tmp_path / "o2.yaml"
    bad_schema.write_text(OVERRIDES_SCHEMA_ERROR)
    batch = tmp_path / "b.jsonl"
    batch.write_text(json.dumps({"policy": "mxfp4", "profile": "moe-oracle", "platform": {"kind": "cpu"},
                                 "packages": {"triton": False}}) + "\n{not json\n")
    bad_scenario = tmp_path / "s.yaml"
    bad_scenario.write_text("policy: [unclosed\n")
    # (argv, exit code, a phrase the message must contain)
    return [
        (["select", *SM90, "--hidden-size", "x"], 2, "argument --hidden-size: invalid int value"),
        (["select", *SM90, "--activation", "silux"], 2, "argument --activation: invalid choice"),
        (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
        ([], 2, "required: command"),
        (["select", "--policy", "mxfp4", "--platform", "cuda:nine"], 2, "--platform 'cuda:nine'"),
        (["select", "--scenario", str(tmp_path / "missing.yaml")], 2, "missing.yaml: cannot read"),
        (["select", "--scenario", str(bad_scenario)], 2, "s.yaml:2:1: not valid JSON or YAML"),
        (["select", "--batch", str(tmp_path / "missing.jsonl")], 2, "missing.jsonl: cannot read"),
        (["fmt", str(tmp_path / "missing.yaml")], 2, "no such file or directory"),
        (["test", str(tmp_path / "missing.jsonl")], 2, "no such file or directory"),
        (["lint", str(tmp_path / "missing")], 2, "neither a rules directory"),
        (["diff", "vllm-0.2", "vllm-0.33"], 2, "did you mean 'vllm-0.20'?"),
        (["sweep", "--profile", "moe-oracle", "--policy", "mxfp5"], 2, "did you mean 'mxfp4'?"),
        (["schema", "rule"], 2, "did you mean 'rules'?"),
        (["select", "--policy", "mxfp5", "--platform", "cpu"], 2, "unknown policy 'mxfp5'"),
        (["select", *SM90, "--package", "flashinfr"], 2, "did you mean 'flashinfer'?"),
        (["select", *SM90, "--role", "draft"], 2, "give the file too"),
        (["--rules", str(broken), "select", *SM90], 3, "r.yaml:"),
        (["--rules", str(broken), "explain", *SM90], 3, "r.yaml:"),
        (["validate", str(broken)], 3, "problem(s) in"),
        (["select", *SM90, "--overrides", str(bad_backend), "--role", "draft"], 3, "did you mean 'MARLIN'?"),
        (["select", "--batch", str(batch), "--overrides", str(bad_schema)], 3, "unknown field 'mach'"),
        (["select", *SM90, "--overrides", str(tmp_path / "missing-o.yaml")], 3, "cannot read"),
        (["select", "--batch", str(batch)], 1, "1 of 2 line(s) not answered"),
        (["select", "--profile", "vllm-0.20", *SM90, "--env", "VLLM_MXFP4_USE_MARLN=1"], 0, "did you mean"),
    ]


def test_every_failing_path_writes_one_style_to_stderr(tmp_path, capsys):
    for argv, expected_code, phrase in _cases(tmp_path):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own errors leave through sys.exit
            code = exc.code
        err = capsys.readouterr().err
        assert code == expected_code, (argv, err)
        lines = err.splitlines()
        assert lines and all(STYLE.match(line) for line in lines), (argv, err)
        assert phrase in err and "Traceback" not in err, (argv, err)


def test_a_broken_rule_file_is_one_prefixed_line_per_problem_with_its_location(tmp_path, capsys):
    (tmp_path / "r").mkdir()
    root = rules_dir(tmp_path / "r", {"r.yaml": (BAD / "unknown_package.yaml").read_text()}, ["r.yaml"])
    assert main(["--rules", str(root), "select", *SM90]) == 3
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(re.match(rf"^moe-oracle: error: {re.escape(str(root / 'r.yaml'))}:\d+:\d+: ", ln)
                         for ln in lines)


def test_an_internal_error_is_one_line_not_a_traceback(monkeypatch, capsys):
    def broken(oracle):
        raise KeyError("boom")

    monkeypatch.setattr(cli, "_cmd_profiles", broken)
    assert main(["profiles"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("moe-oracle: error: internal error: KeyError: 'boom'")
    monkeypatch.setenv("MOE_ORACLE_DEBUG", "1")
    with pytest.raises(KeyError):
        main(["profiles"])
