"""The command line: answers, explanations, batches and one-line errors (never a traceback)."""
from __future__ import annotations

import json

import pytest

from oracle.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_explain_shows_the_winner_and_every_rejected_candidate(capsys):
    code, out, _ = run(capsys, "explain", "--profile", "vllm-0.20", "--policy", "mxfp4-gpt-oss", "--platform", "cuda:9.0",
                       "--package", "triton_kernels")
    assert code == 0
    assert "=> selected TRITON, kernel OAITritonMxfp4ExpertsMonolithic" in out
    for rejected in ("FLASHINFER_TRTLLM_MXFP4_BF16 / TrtLlmMxfp4ExpertsMonolithic",
                     "FLASHINFER_TRTLLM_MXFP4_BF16 / TrtLlmMxfp4ExpertsModular", "AITER / AiterExperts"):
        assert f"rejected        {rejected}" in out
    # every false leaf with its actual value and location, then vLLM's own (generic) reason
    assert "x device: platform.capability 9.0 is not in family 10.x; package flashinfer is not installed" in out
    assert "- platform.capability 9.0 is not in family 10.x   (via cuda_sm10x, rules/common/platform.yaml:" in out
    assert "vLLM reason: kernel does not support current device cuda" in out
    assert "decided by step 'auto' at" in out and "mxfp4.yaml:" in out


def test_explain_json_has_the_trace(capsys):
    code, out, _ = run(capsys, "explain", "--json", "--profile", "vllm-0.20", "--policy", "mxfp4", "--platform", "cpu")
    data = json.loads(out)
    assert code == 1 and data["outcome"] == "unsupported" and data["trace"]
    assert data["profile"] == "vllm-0.20" and data["rule_files"]


def test_select_prints_a_summary_and_json(capsys):
    code, out, _ = run(capsys, "select", "--profile", "vllm-0.20", "--policy", "mxfp4-gpt-oss", "--platform", "cuda:10.0",
                       "--package", "flashinfer")
    assert code == 0 and out.startswith("selected FLASHINFER_TRTLLM_MXFP4_BF16, kernel TrtLlmMxfp4ExpertsMonolithic")
    code, out, _ = run(capsys, "select", "--json", "--profile", "vllm-0.20", "--policy", "mxfp4-gpt-oss",
                       "--platform", "cuda:10.0", "--env", "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=0", "--package", "triton_kernels")
    assert json.loads(out)["backend"] == "TRITON" and "trace" not in json.loads(out)


def test_select_scenario_file_and_flags_override_it(capsys, tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("policy: mxfp4\nplatform: {kind: cuda, capability: [9, 0]}\nmoe: {activation: silu}\n")
    code, out, _ = run(capsys, "select", "--json", "--scenario", str(f))
    assert json.loads(out)["backend"] == "MARLIN"
    code, out, _ = run(capsys, "select", "--json", "--scenario", str(f), "--platform", "cuda:7.0")
    assert code == 1 and json.loads(out)["outcome"] == "unsupported"


def test_round_up_query_from_flags(capsys):
    code, out, _ = run(capsys, "select", "--json", "--policy", "mxfp4", "--platform", "cuda:10.0", "--query", "round_up",
                       "--backend", "FLASHINFER_TRTLLM_MXFP4_BF16", "--hidden-size", "2880", "--intermediate-size", "720")
    assert json.loads(out)["hidden_size"] == 3072 and json.loads(out)["intermediate_size"] == 768


@pytest.mark.parametrize("argv, message", [
    (["select", "--policy", "mxfp4", "--platform", "cuda:nine"], "--platform 'cuda:nine': cuda needs a capability"),
    (["select", "--policy", "mxfp4", "--platform", "tpu"], "--platform 'tpu': kind must be one of"),
    (["select", "--policy", "mxfp4", "--platform", "cpu", "--env", "VLLM_X"], "--env 'VLLM_X': expected NAME=VALUE"),
    (["select", "--platform", "cpu"], "--policy is required"),
    (["select", "--scenario", "/nonexistent.yaml"], "--scenario /nonexistent.yaml: cannot read"),
    (["select", "--policy", "mxfp4", "--platform", "cpu", "--profile", "vllm-9"], "profile: unknown profile 'vllm-9'"),
])
def test_bad_arguments_give_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("moe-oracle: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_malformed_scenario_is_an_error_on_stderr_and_an_error_answer_in_json(capsys):
    code, out, err = run(capsys, "select", "--policy", "mxfp4", "--platform", "cpu", "--package", "flashinfr")
    assert code == 2 and out == ""
    assert err.startswith("moe-oracle: error: packages.flashinfr: unknown field (did you mean 'flashinfer'?)")
    code, out, err = run(capsys, "select", "--json", "--policy", "mxfp4", "--platform", "cpu", "--package", "flashinfr")
    assert code == 2 and json.loads(out)["outcome"] == "error" and err == ""


def test_batch_keeps_order_and_survives_bad_lines(capsys, tmp_path):
    f = tmp_path / "b.jsonl"
    f.write_text("\n".join([
        json.dumps({"policy": "mxfp4", "platform": {"kind": "cuda", "capability": [9, 0]}}),
        "{not json",
        json.dumps({"policy": "nope"}),
        json.dumps({"scenario": {"policy": "mxfp4-gpt-oss", "profile": "vllm-0.20", "platform": {"kind": "cpu"}},
                    "expected": {}}),
    ]) + "\n")
    code, out, _ = run(capsys, "select", "--batch", str(f))
    lines = [json.loads(x) for x in out.splitlines()]
    # every line is answered in order; exit 1 because two lines are not (issue 14: batch exit code)
    assert code == 1 and [x["outcome"] for x in lines] == ["selected", "error", "error", "none"]
    assert lines[1]["error"].startswith(f"{f}:2:2: not valid JSON")
    assert lines[2]["error"].startswith(f"{f}:3: policy: unknown policy 'nope'")


def test_profiles_command(capsys):
    code, out, _ = run(capsys, "profiles")
    assert code == 0 and "vllm-0.20" in out and "vllm-0.15" in out
    assert "(default)" in next(line for line in out.splitlines() if line.startswith("vllm-0.33"))
