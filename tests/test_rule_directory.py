"""A rules directory is checked as a whole: every problem in one run, stray files, and Oracle construction.

The per-file mistakes live in tests/bad_rules (test_rule_errors.py); here: schema and cross-reference
problems of different files reported together, a rule file no profile lists, Oracle(rules_dir) raising
one RuleError with every problem, and the command line answering exit 3 (never a traceback).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from oracle import Oracle, RuleError
from oracle.cli import main
from oracle.validate import validate_paths

BAD = Path(__file__).parent / "bad_rules"
VALID = (BAD / "valid.yaml").read_text()


def rules_dir(tmp_path: Path, files: dict[str, str], listed: list[str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "profiles.yaml").write_text(
        "default: p\nprofiles:\n  p: {description: 'test rules', files: [" + ", ".join(listed) + "]}\n")
    return tmp_path


def located(problems) -> list[str]:
    return [f"{Path(d.file).name}:{d.line}:{d.col}: {d.message}" for d in problems]


SCHEMA_ERROR = VALID.replace("      - id: auto\n", "      - id: auto\n        whn: {fact: moe.lora, eq: true}\n")
CROSS_REF_ERROR = "kernels:\n  Other:\n    extends: TritonExpert\n    why: \"a typo in extends\"\n"


def test_schema_and_cross_reference_problems_in_one_run(tmp_path):
    root = rules_dir(tmp_path, {"a.yaml": SCHEMA_ERROR, "b.yaml": CROSS_REF_ERROR}, ["a.yaml", "b.yaml"])
    problems, _ = validate_paths([root])
    assert located(problems) == [
        "a.yaml:49:9: unknown field 'whn' in policies.pol.steps.1 (did you mean 'when'?)",
        "b.yaml:3:5: unknown kernel 'TritonExpert' (did you mean 'TritonExperts'?)"]


def test_a_rule_file_no_profile_lists_is_an_error(tmp_path):
    root = rules_dir(tmp_path, {"a.yaml": VALID, "forgotten.yaml": CROSS_REF_ERROR}, ["a.yaml"])
    (root / "notes.md").write_text("not a rule file")
    problems, _ = validate_paths([root])
    assert located(problems) == [
        f"forgotten.yaml:1:1: rule file 'forgotten.yaml' is listed by no profile of {root / 'profiles.yaml'}, so it is "
        "ignored; add it to a profile's files or delete it"]


def test_the_shipped_rules_list_every_file():
    problems, _ = validate_paths(None)
    assert problems == []


def test_oracle_construction_raises_one_error_with_every_problem(tmp_path):
    root = rules_dir(tmp_path, {"a.yaml": SCHEMA_ERROR, "b.yaml": CROSS_REF_ERROR, "c.yaml": VALID.replace(
        "      - {weight: kMxfp4Static, activation: null}", "      - {weight: kMxfp4Statc, activation: null}")},
        ["a.yaml", "b.yaml"])
    with pytest.raises(RuleError) as caught:
        Oracle(root)
    assert [f"{Path(d.file).name}:{d.line}" for d in caught.value.diagnostics] == ["a.yaml:49", "b.yaml:3", "c.yaml:1"]
    assert len(str(caught.value).splitlines()) == 3


def test_reload_refuses_a_directory_that_became_broken(tmp_path):
    root = rules_dir(tmp_path, {"a.yaml": VALID}, ["a.yaml"])
    o = Oracle(root)
    before = o.snapshot
    (root / "stray.yaml").write_text(VALID)
    with pytest.raises(RuleError, match="listed by no profile"):
        o.reload()
    assert o.snapshot is before


@pytest.mark.parametrize("name", ["capability_not_major_minor", "unknown_package", "env_default_unparsable"])
def test_select_and_explain_on_broken_rules_exit_3_without_a_traceback(tmp_path, capsys, name):
    root = rules_dir(tmp_path, {"r.yaml": (BAD / f"{name}.yaml").read_text()}, ["r.yaml"])
    for command in ("select", "explain"):
        assert main(["--rules", str(root), command, "--policy", "pol", "--platform", "cuda:9.0"]) == 3
        out, err = capsys.readouterr()
        assert "Traceback" not in err and err.startswith(f"moe-oracle: error: {root / 'r.yaml'}:") and out == ""


def test_github_format_annotates_each_new_mistake(capsys):
    names = ["unknown_package", "unknown_activation", "unknown_rocm_arch", "unknown_routing_method", "unknown_all2all_backend",
             "capability_not_major_minor", "capability_major_only", "capability_word", "env_default_unparsable",
             "runner_attribute_missing"]
    assert main(["validate", "--format", "github", *(str(BAD / f"{n}.yaml") for n in names)]) == 3
    *lines, summary = capsys.readouterr().out.splitlines()
    assert len(lines) == len(names) and all(line.startswith("::error file=") for line in lines)
    assert summary == f"{len(names)} problem(s) in {len(names)} file(s)"
    assert {Path(line.split("file=")[1].split(",")[0]).stem for line in lines} == set(names)


def test_the_scenario_side_uses_the_same_vocabularies():
    o = Oracle()
    d = o.select({"policy": "nvfp4", "moe": {"routing_method": "Renormalise"}})
    assert d.outcome == "error" and "did you mean 'Renormalize'" in d.error
    d = o.select({"policy": "nvfp4", "packages": {"triton_kernel": True}})
    assert d.outcome == "error" and "did you mean 'triton_kernels'" in d.error
    d = o.select({"policy": "nvfp4", "moe": {"parallel": {"all2all_backend": "deepep_low_latncy"}}})
    assert d.outcome == "error" and "did you mean 'deepep_low_latency'" in d.error
