"""A corpus of broken rule files, each with the exact message it must produce.

The files in tests/bad_rules are one small valid rule file (valid.yaml) with one
mistake each; messages name file:line:col, the problem and, where possible, the fix.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from oracle.cli import main
from oracle.facts import FACTS
from oracle.validate import validate_paths
from oracle.vocabulary import ACTIVATIONS, ALL2ALL_BACKENDS, ROUTING_METHODS

BAD = Path(__file__).parent / "bad_rules"

EXPECTED = {
    "bad_capability": "14:41: kernels.TritonExperts.device.ge: 'nine' is not valid here; "
                      "expected a number or capability 'major.minor', e.g. \"9.0\"",
    "candidate_without_kernels": "43:26: candidate NONE has no kernel table; add kernels to it or remove it from the list",
    "conditional_last_step": "52:9: the last step must decide unconditionally (no 'when'; outcome, use or result)",
    "duplicate_step_id": "49:9: duplicate step id 'forced' (first at step 1)",
    "duplicate_yaml_key": "43:5: duplicate key 'description' (first defined at line 42); remove one of them",
    "kernel_extends_cycle": "13:3: kernels reference cycle: TritonExperts -> TritonExperts",
    "missing_why": "45:9: policies.pol.steps.0: missing required field 'why'",
    "misspelt_fact": "14:14: kernels.TritonExperts.device.fact: 'platform.knd' is not allowed (did you mean 'platform.kind'?); "
                     "expected one of " + ", ".join(sorted(FACTS)),
    "misspelt_step_field": "45:9: unknown field 'whn' in policies.pol.steps.0 (did you mean 'when'?)",
    "python_tag": "2:17: tag tag:yaml.org,2002:python/object/apply:os.system is not allowed in rule files (rules never build objects)",
    "runner_outside_backends": "25:81: runner 'os:system': module 'os' is outside the allowed packages (backends); "
                               "put the code under backends/, or in the package of a plugin (entry point group "
                               "moe_oracle.backends) whose fragments validate",
    "two_actions_in_step": "45:9: policies.pol.steps.0: give exactly one of the alternatives "
                           "(outcome, use, use_explicit, use_named_backend, drop, try, call, result, return_call_result, emit, "
                           "candidates, move, request_activation, prefer_activation)",
    "undeclared_env_var": "46:16: unknown environment variable 'VLLM_FORCE_TRITN' (did you mean 'VLLM_FORCE_TRITON'?)",
    "unknown_backend_in_candidates": "43:18: unknown backend 'TRITN' (did you mean 'TRITON'?)",
    "unknown_derived_ref": "46:16: unknown derived fact 'batched_activation_fmt' (did you mean 'batched_activation_format'?)",
    "unknown_operator": "14:5: unknown field 'equals' in kernels.TritonExperts.device; "
                        "allowed: fact, eq, ne, in, not_in, ge, gt, le, lt, family, is_null, multiple_of, same_as, "
                        "differs_from",
    "unknown_placeholder": "27:7: unknown placeholder '{reasn}' in message (did you mean 'reason'?)",
    "unknown_quant_config_kind": "26:42: unknown quant config kind 'w4a61' (did you mean 'w4a16'?)",
    "unknown_quant_key": "17:10: unknown quantization key 'kMxfp4Statc' (did you mean 'kMxfp4Static'?)",
    "yaml_syntax_error": "16:18: YAML syntax error: did not find expected ',' or ']'",
    # closed vocabularies: the values a scenario could give the fact (declared once, shared with the scenario side)
    "unknown_package": "14:54: unknown package 'triton_kernel' (did you mean 'triton_kernels'?)",
    "unknown_activation": "15:19: unknown activation 'swiglu' (did you mean 'swigluoai'?); moe.activation is one of "
                          + ", ".join(ACTIVATIONS),
    "unknown_rocm_arch": "14:52: unknown ROCm arch 'gfx905' (did you mean 'gfx950'?); platform.gcn_arch is one of "
                         "gfx942, gfx950",
    "unknown_routing_method": "16:23: unknown routing method 'Renormalise' (did you mean 'Renormalize'?); "
                              "moe.routing_method is one of " + ", ".join(ROUTING_METHODS),
    "unknown_all2all_backend": "10:92: unknown all2all backend 'deepep_low_latncy' (did you mean 'deepep_low_latency'?); "
                              "moe.parallel.all2all_backend is one of " + ", ".join(ALL2ALL_BACKENDS),
    # capabilities are 'major.minor' strings: anything else would crash at compile time or never compare
    "capability_not_major_minor": "14:41: capability 'sm_90' in 'eq' is not 'major.minor' (did you mean \"9.0\"?); "
                                  "write a quoted string such as \"9.0\" or \"10.0\"",
    "capability_major_only": "14:53: capability '9' in 'in' is not 'major.minor' (did you mean \"9.0\"?); "
                             "write a quoted string such as \"9.0\" or \"10.0\"",
    "capability_word": "14:41: capability 'ten' in 'ne' is not 'major.minor'; write a quoted string such as \"9.0\" "
                       "or \"10.0\"",
    "env_default_unparsable": "6:5: default 'no' of VLLM_FORCE_TRITON is not a value int_bool can produce "
                              "(it parses to true or false); write default: false",
    # closed vocabularies: a literal a fact can never take is an error, not a condition that never matches
    "unknown_moe_backend": "10:35: unknown moe_backend string 'auot' (did you mean 'auto'?); moe.moe_backend is one "
                           "of auto",
    "capability_two_digit_minor": "10:39: capability '7.50' in 'ge' is not a capability: the major is 1 to 20 and "
                                  "the minor one digit (did you mean \"7.5\"?); write e.g. \"9.0\" or \"10.3\"",
    "nan_literal": "10:36: nan in 'eq': a fact is never NaN or infinite (and NaN equals nothing); write a finite "
                   "number",
    "bool_fact_number": "10:28: moe.lora is true or false, never 1; write eq: true",
    "unknown_scale_format": "10:45: unknown Quark scale format 'e80m' (did you mean 'e8m0'?); "
                            "quark.weight.scale_format is one of e8m0, e4m3, float32, float16, bfloat16",
    # mistakes that would otherwise change nothing, silently
    "move_not_a_candidate": "50:9: move: NONE is not a candidate of policy 'pol' (neither in its candidates nor in a "
                            "step's candidates), so this step would change nothing; name a candidate or add it to the "
                            "candidates",
    "round_up_after_catch_all": "28:9: round_up row 2 is never used: the earlier row 1 at line 27 names no backends "
                                "and has no 'when', so it answers for every backend first; move this row above it or "
                                "delete it",
    "round_up_shadowed_row": "28:9: round_up row 2 is never used: an earlier row without 'when' answers first for "
                             "TRITON (row 1 at line 27); move this row above it or delete it",
    "round_up_not_block_multiple": "27:30: round_up intermediate alignment 100 is not a multiple of 32, the block size "
                                   "of kMxfp4Static weights (every 32 elements share a scale); use a multiple of 32 "
                                   "(e.g. 128) or 1 for the sizes as they are",
    "runner_attribute_missing": "25:81: runner 'backends.emulation:moe_forwrd': module 'backends.emulation' defines "
                                "no top-level 'moe_forwrd' (did you mean 'moe_forward'?); define it or fix the path",
}


def test_every_bad_file_has_an_expectation():
    names = {p.stem for p in BAD.glob("*.yaml")} - {"valid"}
    assert names == set(EXPECTED)


def test_the_base_file_is_valid():
    problems, checked = validate_paths([BAD / "valid.yaml"])
    assert problems == [] and checked == 1


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_rule_file_message(name):
    path = BAD / f"{name}.yaml"
    problems, _ = validate_paths([path])
    assert [f"{d.line}:{d.col}: {d.message}" for d in problems] == [EXPECTED[name]]
    assert all(Path(d.file).name == path.name for d in problems)


def test_cli_validate_exit_codes(capsys):
    assert main(["validate", str(BAD / "misspelt_step_field.yaml")]) == 3
    out = capsys.readouterr().out
    assert out.strip().endswith("unknown field 'whn' in policies.pol.steps.0 (did you mean 'when'?)")
    assert "misspelt_step_field.yaml:45:9:" in out
    assert main(["validate", str(BAD / "valid.yaml")]) == 0


def test_cli_validate_github_format(capsys):
    assert main(["validate", "--format", "github", str(BAD / "unknown_backend_in_candidates.yaml")]) == 3
    line = capsys.readouterr().out.strip()
    assert line.startswith("::error file=") and ",line=43,col=18::invalid-rules: unknown backend 'TRITN'" in line


def test_shipped_rules_are_valid():
    problems, checked = validate_paths(None)
    assert problems == []
    assert checked >= 6


def test_a_name_defined_in_two_files_of_a_profile(tmp_path):
    base = (BAD / "valid.yaml").read_text()
    (tmp_path / "a.yaml").write_text(base)
    (tmp_path / "b.yaml").write_text("kernels:\n  TritonExperts:\n    why: \"a second definition\"\n")
    (tmp_path / "profiles.yaml").write_text("default: p\nprofiles:\n  p: {description: 'two files', files: [a.yaml, b.yaml]}\n")
    problems, _ = validate_paths([tmp_path])
    assert [f"{Path(d.file).name}:{d.line}:{d.col}: {d.message}" for d in problems] == [
        f"b.yaml:2:3: kernels 'TritonExperts' is already defined at {tmp_path / 'a.yaml'}:13; each name is defined once per profile "
        "(add 'override: true' to replace it deliberately)"]


def test_a_scalar_with_a_tag_that_does_not_fit_is_a_located_error_and_loading_keeps_nothing():
    from oracle import yamlio
    from oracle.errors import RuleError

    with pytest.raises(RuleError) as caught:
        yamlio.load_yaml_text("a: 1\nb: !!int many\nc: !!bool maybe\n", "f.yaml")
    assert [str(d) for d in caught.value.diagnostics] == [
        "f.yaml:2:4: 'many' is not a valid int (tag !!int); remove the tag or fix the value",
        "f.yaml:3:4: 'maybe' is not a valid bool (tag !!bool); remove the tag or fix the value"]
    doc = yamlio.load_yaml_text("a: [1, 2.5, true, null, x]\n'7': {b: 0x10}\n", "f.yaml")
    assert doc.data == {"a": [1, 2.5, True, None, "x"], "7": {"b": 16}}
    assert doc.where(("a", 4)) == (1, 25) and doc.where(("7", "b")) == (2, 7)
    assert yamlio._scalar_constructor.constructed_objects == {}, "no node is kept after a load"


def test_profile_index_errors(tmp_path):
    (tmp_path / "profiles.yaml").write_text("default: q\nprofiles:\n  p: {description: 'x', files: [missing.yaml]}\n")
    problems, _ = validate_paths([tmp_path])
    assert [d.message for d in problems] == ["default profile 'q' is not defined"]
    (tmp_path / "profiles.yaml").write_text("default: p\nprofiles:\n  p: {description: 'x', files: [missing.yaml]}\n")
    problems, _ = validate_paths([tmp_path])
    assert len(problems) == 1 and problems[0].message.startswith("rule file 'missing.yaml' does not exist")
    assert problems[0].line == 3


def test_profiles_extend_profiles_and_override_only_on_purpose(tmp_path):
    base = (BAD / "valid.yaml").read_text()
    (tmp_path / "a.yaml").write_text(base)
    (tmp_path / "child.yaml").write_text(
        "kernels:\n  TritonExperts:\n    override: true\n    device: {fact: platform.kind, eq: rocm}\n"
        "    activations: [swigluoai]\n    why: \"runs on ROCm in the child profile\"\n")
    (tmp_path / "stray.yaml").write_text("kernels:\n  NoSuchKernel:\n    override: true\n    why: \"replaces nothing\"\n")
    (tmp_path / "profiles.yaml").write_text(
        "default: parent\nprofiles:\n"
        "  parent: {description: 'base', files: [a.yaml]}\n"
        "  child: {description: 'differences only', extends: parent, files: [child.yaml]}\n"
        "  stray: {description: 'bad override', extends: parent, files: [stray.yaml]}\n")
    problems, _ = validate_paths([tmp_path])
    assert [f"{Path(d.file).name}:{d.line}:{d.col}: {d.message}" for d in problems] == [
        "stray.yaml:3:5: kernels 'NoSuchKernel' overrides nothing: no earlier file of this profile defines it; "
        "remove 'override: true'"]
    from oracle import Oracle, RuleError

    with pytest.raises(RuleError, match="overrides nothing"):  # a broken profile fails the Oracle at construction
        Oracle(tmp_path)
    (tmp_path / "profiles.yaml").write_text(
        "default: parent\nprofiles:\n"
        "  parent: {description: 'base', files: [a.yaml]}\n"
        "  child: {description: 'differences only', extends: parent, files: [child.yaml]}\n")
    (tmp_path / "stray.yaml").unlink()
    o = Oracle(tmp_path)
    cuda = {"policy": "pol", "platform": {"kind": "cuda", "capability": [9, 0]}}
    assert o.select(cuda).backend == "TRITON" and o.select({**cuda, "profile": "child"}).outcome == "unsupported"
    assert [f.name for f in o.index.profiles["child"].files] == ["a.yaml", "child.yaml"]


def test_profile_extends_errors(tmp_path):
    (tmp_path / "a.yaml").write_text((BAD / "valid.yaml").read_text())
    (tmp_path / "profiles.yaml").write_text("default: p\nprofiles:\n  p: {description: 'x', extends: q, files: [a.yaml]}\n"
                                            "  q: {description: 'y', extends: p, files: [a.yaml]}\n")
    problems, _ = validate_paths([tmp_path])
    assert [d.message for d in problems] == ["extends 'p': profiles extend each other in a cycle (p -> q -> p)"]


def test_the_older_profile_holds_only_its_differences():
    """vllm-0.15 extends vllm-0.20: each of its entries overrides a different definition or adds a new one."""
    import yaml

    from oracle import Oracle

    o = Oracle()
    parent = o.table("vllm-0.20")
    assert o.index.profiles["vllm-0.15"].files[:len(parent.files)] == o.index.profiles["vllm-0.20"].files
    root = Path(__file__).resolve().parent.parent / "rules"
    parent_entries: dict = {}
    for f in o.index.profiles["vllm-0.20"].files:
        for section, items in yaml.safe_load(f.read_text()).items():
            parent_entries.update({(section, k): v for k, v in items.items()})
    for f in sorted((root / "vllm-0.15").glob("*.yaml")):
        for section, items in yaml.safe_load(f.read_text()).items():
            for key, value in items.items():
                same = {k: v for k, v in value.items() if k != "override"} == parent_entries.get((section, key))
                assert not same, f"{f.name}: {section}.{key} is a copy of vllm-0.20's; delete it"


def test_a_yaml_syntax_error_reports_only_itself(tmp_path):
    """The broken file contributes no names; the files that refer to them are not blamed (no ghost errors)."""
    case = BAD / "syntax_error_in_one_file"
    for f in case.iterdir():
        (tmp_path / f.name).write_text(f.read_text())
    problems, _ = validate_paths([tmp_path])
    assert [f"{Path(d.file).name}:{d.line}:{d.col}: {d.message}" for d in problems] == [
        "kernels.yaml:4:29: YAML syntax error: mapping values are not allowed in this context"]
    (tmp_path / "kernels.yaml").write_text((case / "kernels.yaml").read_text().replace("]: broken", "]"))
    assert validate_paths([tmp_path])[0] == []
