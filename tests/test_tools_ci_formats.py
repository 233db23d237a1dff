"""CI output of every tool verb: json, github and SARIF also for broken rules; annotations only on files;
diff's reading order (the edit's own changes first, a new env var's values merged) and its no-change answer
from content hashes."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from test_tools_space import _only_profile

import oracle.tools.diff as diff_module
from oracle.cli import main

BAD = Path(__file__).parent / "bad_rules"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _broken_rules(tmp_path: Path) -> Path:
    root = _only_profile(tmp_path, "moe-oracle")
    path = root / "moe-oracle" / "w4a16.yaml"
    path.write_text(path.read_text().replace("candidates: [", "candidates: [TRITN, ", 1))
    return root


def _golden(tmp_path: Path) -> Path:
    f = tmp_path / "golden.jsonl"
    f.write_text(json.dumps({"scenario": {"policy": "mxfp4", "profile": "moe-oracle", "platform": {"kind": "cpu"}},
                             "expected": {"outcome": "selected"}}) + "\n")
    return f


def _commands(root: Path, golden: Path) -> dict[str, list[str]]:
    return {"validate": ["validate", str(root)], "lint": ["lint", str(root)],
            "diff": ["diff", str(root), str(root)], "test": ["--rules", str(root), "test", str(golden)]}


@pytest.mark.parametrize("verb", ["validate", "lint", "diff", "test"])
def test_broken_rules_in_every_format(capsys, tmp_path, verb):
    root = _broken_rules(tmp_path)
    argv = _commands(root, _golden(tmp_path))[verb]
    code, out, err = run(capsys, *argv, "--format", "sarif")
    assert code == 3 and ("unknown backend 'TRITN'" in err or verb == "validate")  # validate: the report is all
    report = json.loads(out)  # a complete SARIF log, not an empty file
    [result] = report["runs"][0]["results"]
    assert result["level"] == "error" and result["ruleId"] == "invalid-rules"
    assert "unknown backend 'TRITN'" in result["message"]["text"]
    location = result["locations"][0]["physicalLocation"]
    assert Path(location["artifactLocation"]["uri"]).name == "w4a16.yaml" and location["region"]["startLine"] > 1
    code, out, _ = run(capsys, *argv, "--format", "github")
    assert code == 3
    assert re.match(r"::error file=[^,]*w4a16\.yaml,line=\d+,col=\d+::invalid-rules: unknown backend 'TRITN'", out)
    code, out, _ = run(capsys, *argv, "--format", "json")
    assert code == 3 and json.loads(out)["findings"][0]["rule"] == "invalid-rules"


def test_a_usage_error_is_a_sarif_log_too(capsys, tmp_path):
    code, out, err = run(capsys, "test", str(tmp_path / "missing.jsonl"), "--format", "sarif")
    assert code == 2 and "no such file" in err
    [result] = json.loads(out)["runs"][0]["results"]
    assert result["ruleId"] == "usage" and "locations" not in result


def _edited_copy(tmp_path: Path) -> tuple[Path, Path]:
    """vllm-0.20 twice; B swaps two candidates (the intended change) and adds an env var with a step reading it."""
    a, b = _only_profile(tmp_path / "a", "vllm-0.20"), _only_profile(tmp_path / "b", "vllm-0.20")
    path = b / "vllm-0.20" / "nvfp4.yaml"
    text = path.read_text()
    for old, new in (("      - FLASHINFER_CUTLASS\n      - VLLM_CUTLASS\n", "      - VLLM_CUTLASS\n      - FLASHINFER_CUTLASS\n"),
                     ("      - id: flashinfer-disabled\n", "      - id: new-force-marlin\n        when: {env: "
                      "VLLM_NEW_NVFP4_PATH, eq: marlin}\n        use: MARLIN\n        why: \"a new switch\"\n"
                      "      - id: flashinfer-disabled\n"),
                     ("\nenv_vars:\n", "\nenv_vars:\n  VLLM_NEW_NVFP4_PATH:\n    parse: lower\n    default: auto\n"
                      "    why: \"a new switch\"\n")):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path.write_text(text)
    return a, b


def test_diff_puts_the_edit_first_and_merges_a_new_env_vars_values(capsys, tmp_path):
    a, b = _edited_copy(tmp_path)
    code, out, _ = run(capsys, "diff", str(a), str(b), "--policy", "nvfp4", "--format", "json")
    found = json.loads(out)["findings"]
    assert code == 1 and found
    first = found[0]
    # the candidate swap, decided by the `try: candidates` step, leads; it does not depend on the new env var
    assert "FLASHINFER_CUTLASS" in first["message"] and "->  VLLM_CUTLASS" in first["message"]
    assert first["edited_rules"] and not first["only_through_new_env_var"]
    # each of its classes holds for the new variable unset or set to anything but marlin: one class, not two
    assert all("VLLM_NEW_NVFP4_PATH=unset|<other>" in c or "VLLM_NEW_NVFP4_PATH" not in c for c in first["classes"])
    assert any("VLLM_NEW_NVFP4_PATH=unset|<other>" in c for c in first["classes"])
    ranks = [(not f["edited_rules"], f["only_through_new_env_var"]) for f in found]
    assert ranks == sorted(ranks)
    assert any(f["only_through_new_env_var"] for f in found)
    code, out, _ = run(capsys, "diff", str(a), str(b), "--policy", "nvfp4")
    assert code == 1 and "before merging values of new env vars" in out.splitlines()[3]


def test_diff_annotations_name_only_files(capsys, tmp_path):
    a, b = _edited_copy(tmp_path)
    code, out, _ = run(capsys, "diff", str(a), str(b), "--policy", "nvfp4", "--format", "github")
    annotations = [line for line in out.splitlines() if line.startswith("::")]
    assert code == 1 and annotations
    files = [m.group(1) for line in annotations for m in [re.match(r"::\w+ file=([^,]*),line=\d+::", line)] if m]
    assert files and all(Path(f).is_file() for f in files)
    assert "file=-" not in out
    assert any(line.startswith("::warning::") for line in annotations)  # a change decided where no rule is (env)
    code, out, _ = run(capsys, "diff", str(a), str(b), "--policy", "nvfp4", "--format", "sarif")
    uris = [loc["physicalLocation"]["artifactLocation"]["uri"] for r in json.loads(out)["runs"][0]["results"]
            for loc in r.get("locations", [])]
    assert uris and all(Path(u).is_file() for u in uris)


def test_diff_with_no_change_is_answered_from_content_hashes(capsys, tmp_path, monkeypatch):
    copy = tmp_path / "copy"
    shutil.copytree(_only_profile(tmp_path, "vllm-0.20"), copy)

    def explore_nothing(*args, **kwargs):
        raise AssertionError("identical rule files must not be explored")

    monkeypatch.setattr(diff_module, "diff_policy", explore_nothing)
    code, out, _ = run(capsys, "diff", str(tmp_path / "rules"), str(copy))
    assert code == 0 and "no input class changes its answer" in out
    code, out, _ = run(capsys, "diff", "git:HEAD", "rules", "--profile", "moe-oracle", "--format", "json")
    assert code in (0, 1)  # the working tree may differ from HEAD; when it does not, nothing was explored


def test_diff_tags_changes_through_an_edited_kernel(capsys, tmp_path):
    """A kernel edit changes answers through an unchanged `try` step: still the edit's own change."""
    a, b = _only_profile(tmp_path / "a", "moe-oracle"), _only_profile(tmp_path / "b", "moe-oracle")
    path = b / "moe-oracle" / "w4a16.yaml"
    text = path.read_text()
    old = "    device: {ref: triton_runs_here}\n    activations: [swigluoai, silu]\n"  # TritonMoeW4A16's
    assert text.count(old) == 1
    path.write_text(text.replace(old, "    device: {ref: triton_runs_here}\n    activations: [swigluoai]\n"))
    code, out, _ = run(capsys, "diff", str(a), str(b), "--format", "json")
    found = json.loads(out)["findings"]
    assert code == 1 and found and all(f["edited_rules"] for f in found)
    assert all("TRITON_MOE" in f["message"].split("->")[0] for f in found)


def test_fmt_check_in_ci_formats(capsys, tmp_path):
    path = tmp_path / "rules" / "r.yaml"
    path.parent.mkdir()
    path.write_text((BAD / "valid.yaml").read_text() + "\n\n")
    code, out, _ = run(capsys, "fmt", "--check", str(path.parent), "--format", "github")
    assert code == 1 and out.startswith(f"::error file={path},line=1::fmt: {path} is not in canonical layout")
    code, out, _ = run(capsys, "fmt", "--check", str(path.parent), "--format", "sarif")
    assert code == 1 and json.loads(out)["runs"][0]["results"][0]["ruleId"] == "fmt"
