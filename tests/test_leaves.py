"""Explain reports every false leaf of a failed check: the fact's actual value and where the leaf is written."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from oracle import Decision, Oracle, operators
from oracle.cli import main
from oracle.trace import CallEntry, CandidateEntry, Failure

ROOT = Path(__file__).resolve().parents[1]
ORACLE = Oracle()


def failures(decision: Decision, candidate: str, kernel: str | None = None) -> dict[str, Failure]:
    """check name -> Failure of the (first) trace entry of this candidate / kernel."""
    def walk(trace):
        for e in trace:
            if isinstance(e, CallEntry):
                yield from walk(e.trace)
            elif isinstance(e, CandidateEntry):
                yield e
    for e in walk(decision.trace):
        if e.candidate == candidate and (kernel is None or e.kernel == kernel):
            return {f.check: f for f in e.failed}
    raise AssertionError(f"{candidate} / {kernel} not in the trace")


def line_of(at: str) -> str:
    file, line = at.rsplit(":", 1)
    return (ROOT / file).read_text().splitlines()[int(line) - 1]


def nvfp4(platform, packages=None, env=None, profile="vllm-0.20", **moe):
    moe.setdefault("activation", "silu")
    return ORACLE.select({"policy": "nvfp4", "profile": profile, "platform": platform, "packages": packages or {},
                          "env": env or {}, "moe": moe})


SM90 = {"kind": "cuda", "capability": [9, 0]}


def test_each_false_leaf_of_the_device_check_with_its_actual_value():
    device = failures(nvfp4(SM90), "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsMonolithic")["device"]
    assert [leaf.text for leaf in device.leaves] == ["platform.capability 9.0 is not in family 10.x",
                                                     "package flashinfer is not installed"]
    cap, pkg = device.leaves
    assert (cap.leaf, cap.expected, cap.actual, cap.via) == ("{fact: platform.capability, family: 10.x}",
                                                             "is in family 10.x", "9.0", ("cuda_sm10x",))
    assert (pkg.leaf, pkg.expected, pkg.actual, pkg.via) == ("{package: flashinfer}", "installed", "not installed", ())
    # the locations are where each leaf is written: the derived fact's file, then the kernel's own
    assert cap.at.startswith("rules/common/platform.yaml:") and "10.x" in line_of(cap.at)
    assert pkg.at.startswith("rules/vllm-0.20/nvfp4.yaml:") and "package: flashinfer" in line_of(pkg.at)
    assert device.headline == "platform.capability 9.0 is not in family 10.x; package flashinfer is not installed"
    assert device.reason == "kernel does not support current device cuda"  # vLLM's words stay available


def test_with_flashinfer_only_the_capability_leaf_fails():
    device = failures(nvfp4(SM90, packages={"flashinfer": True}), "FLASHINFER_TRTLLM")["device"]
    assert [leaf.text for leaf in device.leaves] == ["platform.capability 9.0 is not in family 10.x"]


def test_derived_facts_expand_to_their_own_leaves():
    d = ORACLE.select({"policy": "mxfp4-gpt-oss", "profile": "vllm-0.20", "platform": {"kind": "rocm", "gcn_arch": "gfx942"},
                       "packages": {"aiter": True}, "env": {"VLLM_ROCM_USE_AITER_MOE": "0"}})
    device = failures(d, "AITER")["device"]
    assert [(leaf.text, leaf.via) for leaf in device.leaves] == [
        ("VLLM_ROCM_USE_AITER (unset, default false) does not parse to true", ("aiter_moe_enabled",)),
        ("VLLM_ROCM_USE_AITER_MOE='0' does not parse to true", ("aiter_moe_enabled",))]
    assert device.leaves[1].actual == "'0'"


def test_leaves_that_hold_under_not_are_reported_as_must_not():
    batched = {"dp_size": 2, "ep_size": 2, "use_ep": True, "all2all_backend": "deepep_low_latency"}
    fmt = failures(nvfp4({"kind": "cuda", "capability": [10, 0]}, packages={"flashinfer": True}, parallel=batched),
                   "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsModular")["format"]
    texts = [leaf.text for leaf in fmt.leaves]
    assert texts == ["moe.parallel.dp_size 2 is above 1 (must not)", "moe.parallel.use_ep true is true (must not)",
                     "moe.parallel.all2all_backend deepep_low_latency is in [deepep_low_latency, nixl_ep] (must not)"]
    assert all(leaf.via == ("batched_activation_format", "all2all") or leaf.via == ("batched_activation_format",)
               for leaf in fmt.leaves)


def test_a_quant_scheme_row_explains_its_failing_when():
    d = nvfp4(SM90, packages={"flashinfer": True}, profile="vllm-0.15",
              env={"VLLM_USE_FLASHINFER_MOE_FP4": "1", "VLLM_FLASHINFER_MOE_BACKEND": "throughput"})
    scheme = failures(d, "FLASHINFER_CUTLASS")["quant_scheme"]
    (leaf,) = scheme.leaves
    assert leaf.text == "platform.capability 9.0 is below 10.0" and "10.0" in line_of(leaf.at)


def test_a_pair_in_no_row_names_the_rows():
    d = nvfp4(SM90, profile="vllm-0.15", env={"VLLM_TEST_FORCE_FP8_MARLIN": "1"}, weight_key="kMxfp4Static")
    (leaf,) = failures(d, "MARLIN")["quant_scheme"].leaves
    assert leaf.actual == "kMxfp4Static x kNvfp4Dynamic"
    assert leaf.text.startswith("quantization scheme kMxfp4Static x kNvfp4Dynamic is not among [[kFp8Static128BlockSym")


def test_activation_leaf_points_at_the_kernels_list():
    (leaf,) = failures(nvfp4(SM90, activation="gelu"), "FLASHINFER_CUTEDSL")["activation"].leaves
    assert leaf.text == "moe.activation gelu is not in [silu]" and "activations" in line_of(leaf.at)


def test_unsupported_lists_each_candidates_leaves_on_one_line():
    d = nvfp4({"kind": "cuda", "capability": [7, 0]}, profile="vllm-0.15")
    rejected = dict(part.split(": ", 1) for part in d.error.split("Candidates: ", 1)[1].rstrip(".").split("; "))
    assert rejected["MARLIN"] == "platform.capability 7.0 is below 7.5"
    assert rejected["VLLM_CUTLASS"] == "platform.capability 7.0 is not in family [10.x, 11.x, 12.x]"
    assert "\n" not in d.error


def test_explain_text_and_json(capsys):
    argv = ["--profile", "vllm-0.20", "--policy", "nvfp4", "--platform", "cuda:9.0"]
    assert main(["explain", *argv]) == 0
    out = capsys.readouterr().out
    assert "x device: platform.capability 9.0 is not in family 10.x; package flashinfer is not installed" in out
    assert "- package flashinfer is not installed   (rules/vllm-0.20/nvfp4.yaml:" in out
    assert main(["explain", "--json", *argv]) == 0
    data = json.loads(capsys.readouterr().out)
    schema = json.loads((ROOT / "schemas" / "decision.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(data)
    trtllm = next(e for e in data["trace"] if e.get("candidate") == "FLASHINFER_TRTLLM")
    device = next(f for f in trtllm["failed"] if f["check"] == "device")
    assert device["leaves"][0] == {"leaf": "{fact: platform.capability, family: 10.x}", "expected": "is in family 10.x",
                                   "actual": "9.0", "at": device["leaves"][0]["at"], "via": ["cuda_sm10x"],
                                   "text": "platform.capability 9.0 is not in family 10.x"}
    assert Decision.from_dict(data).trace == nvfp4(SM90, activation="swigluoai").trace  # leaves round-trip


def test_every_test_of_the_operator_table_has_leaf_texts():
    for head in operators.HEADS:
        for test in head.tests:
            held, failed = operators.LEAF_TEXTS[("env" if head.key == "env" else "fact", test.name)]
            assert type(held) is type(failed)
