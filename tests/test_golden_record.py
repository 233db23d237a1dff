"""`moe-oracle test --record`: a deliberate rule edit is one command plus a reviewed diff; the golden samples
ship with the package (builtin:NAME)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_tools_space import _only_profile

from oracle.cli import main
from oracle.resources import golden_dir

ROOT = Path(__file__).resolve().parents[1]
CPU = {"policy": "mxfp4", "profile": "moe-oracle", "platform": {"kind": "cpu"}, "packages": {"triton": True},
       "env": {"TRITON_INTERPRET": "1"}}


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_record_rewrites_the_pinned_fields_and_lists_the_changes(capsys, tmp_path):
    root = _only_profile(tmp_path, "moe-oracle")
    golden = tmp_path / "golden.jsonl"
    cases = [{"scenario": CPU, "expected": {"outcome": "selected", "backend": "TRITON_MOE", "vllm_error": None},
              "note": "kept"},
             {"scenario": {**CPU, "env": {}}, "expected": {}}]
    golden.write_text("".join(json.dumps(c) + "\n" for c in cases))
    code, out, _ = run(capsys, "--rules", str(root), "test", "--record", str(golden))
    assert code == 0
    assert f"{golden}:2: backend: (not pinned) -> \"EMULATION\"" in out  # an empty expectation gets the defaults
    recorded = [json.loads(line) for line in golden.read_text().splitlines()]
    assert recorded[0] == cases[0]  # already right: unchanged, extra keys and IGNORED fields kept
    assert recorded[1]["expected"]["backend"] == "EMULATION" and recorded[1]["expected"]["outcome"] == "selected"
    # the deliberate edit: the moe-oracle profile prefers the emulation over its Triton kernels
    path = root / "moe-oracle" / "w4a16.yaml"
    text = path.read_text()
    assert "candidates: [TRITON_MOE, TRITON_MOE_W4A8, EMULATION]" in text
    path.write_text(text.replace("candidates: [TRITON_MOE, TRITON_MOE_W4A8, EMULATION]",
                                 "candidates: [EMULATION, TRITON_MOE, TRITON_MOE_W4A8]"))
    code, out, _ = run(capsys, "--rules", str(root), "test", str(golden))
    assert code == 1 and f"FAIL {golden}:1" in out
    code, out, _ = run(capsys, "--rules", str(root), "test", "--record", str(golden))
    assert code == 0 and f'{golden}:1: backend: "TRITON_MOE" -> "EMULATION"' in out
    assert "1 expected field(s) changed" in out
    assert json.loads(golden.read_text().splitlines()[0])["expected"]["vllm_error"] is None
    assert run(capsys, "--rules", str(root), "test", str(golden))[0] == 0
    code, out, _ = run(capsys, "--rules", str(root), "test", "--record", str(golden))
    assert code == 0 and "0 expected field(s) changed" in out


def test_record_a_yaml_golden_file(capsys, tmp_path):
    golden = tmp_path / "golden.yaml"
    golden.write_text(f"cases:\n  - scenario: {json.dumps({**CPU, 'env': {}})}\n    expected: {{backend: TRITON_MOE}}\n")
    code, out, _ = run(capsys, "test", "--record", str(golden))
    assert code == 0 and f'{golden}:case 1: backend: "TRITON_MOE" -> "EMULATION"' in out
    assert run(capsys, "test", str(golden))[0] == 0


def test_the_shipped_samples_are_package_data_and_run_by_name(capsys):
    if sys.version_info < (3, 11):
        pytest.skip("tomllib is Python 3.11+")
    import tomllib

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"][
        "force-include"]
    shipped = {Path(target).name for source, target in include.items() if target.startswith("oracle/_embedded/golden/")}
    assert shipped == {p.name for p in golden_dir().glob("*.jsonl")} and shipped
    assert all((ROOT / source).is_file() for source in include if source.endswith(".jsonl"))
    code, out, _ = run(capsys, "test", "builtin:golden-sample")
    assert code == 0 and out.strip().splitlines()[-1].startswith("416/416 passed")
    code, _, err = run(capsys, "test", "--record", "builtin:golden-sample")
    assert code == 2 and "never the shipped samples; copy it first" in err
