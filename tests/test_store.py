"""RuleStore: detection once, cached answers, hot reload (broken edits keep the old rules), logging once, audit log."""
from __future__ import annotations

import json
import logging

import pytest
from runtime_rules import BROKEN, EXPECTED, QUESTION, VERSION_A, VERSION_B, make_rules, write

from oracle import Oracle
from oracle.log import DecisionLog, rejected_short
from oracle.store import RuleStore

SM90 = {"kind": "cuda", "capability": [9, 0]}


@pytest.fixture
def rules(tmp_path):
    return make_rules(tmp_path / "rules")


@pytest.fixture
def store(rules):
    s = RuleStore(rules, plugins=False, platform=SM90, packages={}, env={})
    yield s
    s.close()


def test_repeated_questions_return_the_same_answer_object(store):
    sc = store.prepare(QUESTION)
    first = store.select(sc)
    assert first.backend == EXPECTED["A"] and store.select(sc) is first
    assert store.select(QUESTION) is first, "a dict question is prepared, then hits the same cache entry"


def test_deployment_facts_fill_questions_that_do_not_give_them(rules):
    store = RuleStore(rules, plugins=False, platform=SM90, packages={"triton_kernels": True}, env={})
    d = store.select({"policy": "mxfp4-gpt-oss", "moe": {"activation": "swigluoai"}})
    assert d.backend == "TRITON"
    without = RuleStore(rules, plugins=False, platform=SM90, packages={"triton_kernels": False}, env={})
    assert without.select({"policy": "mxfp4-gpt-oss", "moe": {"activation": "swigluoai"}}).backend == "MARLIN"
    # the question's own facts win over the deployment's
    assert without.select({**QUESTION, "platform": {"kind": "cpu"}}).outcome != "selected"


def test_env_is_read_once_and_only_declared_variables(rules):
    store = RuleStore(rules, plugins=False, platform=SM90, packages={},
                      env={"VLLM_MXFP4_USE_MARLIN": "1", "UNRELATED": "x"})
    sc = store.prepare({"policy": "mxfp4-gpt-oss"})
    assert dict(sc.env) == {"VLLM_MXFP4_USE_MARLIN": "1"}


def test_platform_is_detected_once_when_not_given(rules, monkeypatch):
    import oracle.platform

    calls = []
    monkeypatch.setattr(oracle.platform, "detect_platform", lambda: calls.append(1) or {"kind": "cpu"})
    store = RuleStore(rules, plugins=False, packages={}, env={})
    for _ in range(3):
        store.select({"policy": "mxfp4-gpt-oss"})
    assert calls == [1] and store.platform == {"kind": "cpu"}


def test_an_edit_is_picked_up_by_poll_and_answers_move_to_the_new_rules(store, rules):
    sc = store.prepare(QUESTION)
    assert store.poll() is None, "nothing changed yet"
    write(rules / "policy.yaml", VERSION_B)
    result = store.poll()
    assert result is not None and result.ok and result.generation == 2
    d = store.select(sc)
    assert d.backend == EXPECTED["B"] and d.decided_by.step == "auto-b"
    assert store.poll() is None


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_edit_keeps_the_previous_rules_and_reports_file_line(store, rules, caplog, kind):
    before = store.select(QUESTION)
    write(rules / "policy.yaml", BROKEN[kind])
    with caplog.at_level(logging.ERROR, logger="moe_oracle"):
        result = store.poll()
        again = store.poll()
    assert result is not None and not result.ok and result.generation == 1
    assert result.diagnostics and all(d.file.endswith("policy.yaml") and d.line >= 1 for d in result.diagnostics)
    assert f"{result.diagnostics[0].file}:{result.diagnostics[0].line}:" in result.error
    assert again is not None and not again.ok, "still broken: polling keeps trying"
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, "the same failure is logged once, not at every poll"
    assert "still serving rules generation 1" in errors[0].getMessage()
    assert store.select(QUESTION) is before and store.last_error == result.error
    write(rules / "policy.yaml", VERSION_B)
    fixed = store.poll()
    assert fixed is not None and fixed.ok and store.select(QUESTION).backend == EXPECTED["B"]
    assert store.last_error is None


def test_reload_on_request_and_the_first_load_must_succeed(rules, tmp_path):
    write(rules / "policy.yaml", BROKEN["unknown backend"])
    with pytest.raises(Exception, match=r"policy.yaml:\d+:\d+: .*MARLINN"):
        RuleStore(rules, plugins=False, platform=SM90, packages={}, env={})
    write(rules / "policy.yaml", VERSION_A)
    store = RuleStore(rules, plugins=False, platform=SM90, packages={}, env={})
    assert store.reload().ok and store.generation.number == 2, "reload() reloads even when nothing changed"


def test_a_deleted_rule_file_keeps_the_previous_rules(store, rules):
    (rules / "policy.yaml").unlink()
    result = store.poll()
    assert result is not None and not result.ok and "policy.yaml" in result.error
    assert store.select(QUESTION).backend == EXPECTED["A"]


def test_the_watcher_thread_reloads_by_itself(store, rules):
    import time

    store.watch(interval=0.02)
    write(rules / "policy.yaml", VERSION_B)
    deadline = time.monotonic() + 10
    while store.generation.number == 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.select(QUESTION).backend == EXPECTED["B"]
    store.close()
    assert store._watcher is None


def test_one_info_line_per_distinct_decision_with_rejections(rules, caplog):
    store = RuleStore(rules, plugins=False, platform=SM90, packages={"triton_kernels": False}, env={})
    with caplog.at_level(logging.INFO, logger="moe_oracle"):
        for layer in range(48):
            store.select({"policy": "mxfp4-gpt-oss", "moe": {"activation": "swigluoai", "hidden_size": 2880}},
                         model="m", layer=layer)
        store.select({"policy": "mxfp4-gpt-oss", "moe": {"activation": "swigluoai", "hidden_size": 4096}})
        store.select({"policy": "nvfp4"})
    lines = [r.getMessage() for r in caplog.records if r.name == "moe_oracle"]
    assert len(lines) == 2, lines  # 49 gpt-oss layers of two sizes are one decision; nvfp4 is another
    gpt = next(line for line in lines if line.startswith("moe-oracle: mxfp4-gpt-oss [mine] on cuda 9.0 -> MARLIN"))
    assert "decided by step 'auto-a' at " in gpt and "policy.yaml:8" in gpt
    assert "rejected TRITON(" in gpt, "the refused candidates, short form"


def test_rejected_short_names_each_refused_candidate_once_with_its_first_failing_check():
    d = Oracle().select({"policy": "mxfp4-gpt-oss", "profile": "vllm-0.20", "platform": SM90, "packages": {}})
    short = rejected_short(d.trace)
    assert short.startswith("FLASHINFER_TRTLLM_MXFP4_BF16(") and short.count("FLASHINFER_TRTLLM_MXFP4_BF16(") == 1
    assert d.backend not in [part.split("(")[0] for part in short.split(", ")]


def test_the_audit_log_records_each_distinct_question_with_rule_hashes(rules, tmp_path):
    import hashlib

    audit = tmp_path / "decisions.jsonl"
    store = RuleStore(rules, plugins=False, platform=SM90, packages={}, env={}, audit_log=audit)
    for layer in range(3):
        store.select(QUESTION, model="m", layer=layer)
    store.select({**QUESTION, "moe": {"activation": "swigluoai", "hidden_size": 4096}}, model="m", layer=3)
    store.close()
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert len(lines) == 2  # one per distinct (question, override) and rules generation: not one per layer
    assert lines[1]["scenario"]["facts"]["moe.hidden_size"] == 4096
    first = lines[0]
    assert first["decision"]["backend"] == EXPECTED["A"] and first["context"] == {"model": "m", "layer": 0}
    assert first["scenario"]["policy"] == "mxfp4-gpt-oss" and first["scenario"]["facts"]["platform.capability"] == [9, 0]
    files = first["rules"]["files"]
    policy_file = next(name for name in files if name.endswith("policy.yaml"))
    assert files[policy_file] == hashlib.sha256((rules / "policy.yaml").read_bytes()).hexdigest()
    assert first["rules"]["generation"] == 1 and len(files) > 2  # the shipped files this directory extends too


def test_a_decision_log_can_be_shared_and_forgets_on_request():
    log = DecisionLog()
    o = Oracle()
    sc = o.prepare({"policy": "mxfp4-gpt-oss", "profile": "vllm-0.20", "platform": SM90})
    d = o.select(sc)
    assert log.record(sc, d) and not log.record(sc, d)
    log.forget()
    assert log.record(sc, d)


def test_a_bad_question_is_an_error_answer_not_an_exception(rules):
    store = RuleStore(rules, plugins=False, platform=SM90, packages={"triton_kernels": True},
                      env={"VLLM_MXFP4_USE_MARLIN": "1"})
    d = store.select({"policy": "mxfp4-gpt-os"})
    assert d.outcome == "error" and "did you mean 'mxfp4-gpt-oss'" in d.error
    assert "packages: expected a mapping" in store.select({**QUESTION, "packages": ["flashinfer"]}).error
    assert "env: expected a mapping" in store.select({**QUESTION, "env": ["X=1"]}).error
    assert "scenario: expected a mapping" in store.select(None).error
    assert "profile: unknown profile 'nope'" in store.select({**QUESTION, "profile": "nope"}).error


def test_version_b_differs_from_version_a():
    """The fixture's premise: the two versions answer differently (else the reload tests prove nothing)."""
    assert VERSION_A != VERSION_B and EXPECTED["A"] != EXPECTED["B"]


def test_the_server_example_survives_a_broken_then_fixed_rule_edit():
    """examples/server.py --demo-edit: every layer of gpt-oss-120b answered before, during and after the edits."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, str(root / "examples" / "server.py"),
                          str(root / "examples" / "gpt-oss-120b.config.json"), "--demo-edit"],
                         capture_output=True, text=True, timeout=120, cwd=root, env=env)  # this checkout's oracle
    assert run.returncode == 0 and "survived a broken and a fixed rule edit" in run.stdout, run.stdout + run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("ERROR moe_oracle")]
    assert len(errors) == 1 and "still serving rules generation 1" in errors[0]
    assert "site.yaml:6:18: unknown backend 'MARLINN' (did you mean 'MARLIN'?)" in run.stderr
    decisions = [line for line in run.stderr.splitlines() if "-> " in line and line.startswith("INFO moe_oracle")]
    assert len(decisions) == 2, decisions  # 36 layers x many rounds: one line per distinct decision
    assert "-> TRITON" in decisions[0] and "-> MARLIN" in decisions[1]


def test_default_store_is_one_per_process(monkeypatch):
    import oracle.store as store_module

    monkeypatch.setattr(store_module, "_default", None)
    first = store_module.default_store(platform=SM90, packages={}, env={}, plugins=False)
    assert store_module.default_store() is first
    assert store_module.default_store(platform=SM90, packages={}, env={}, plugins=False) is first
    with pytest.raises(ValueError, match="already exists with other options"):
        store_module.default_store(platform={"kind": "cpu"})


def test_a_repeated_dict_question_is_validated_once_per_generation(store, rules, monkeypatch):
    calls = []
    real = store.generation.oracle.scenario
    monkeypatch.setattr(store.generation.oracle, "scenario", lambda q: calls.append(q) or real(q))
    for _ in range(5):
        assert store.select(dict(QUESTION)).backend == EXPECTED["A"]
    assert len(calls) == 1
    # True and 1 are different questions (validation treats them differently): not one cache entry
    bad = store.select({**QUESTION, "moe": {"lora": 1}})
    assert bad.outcome == "error" and store.select({**QUESTION, "moe": {"lora": True}}).outcome != "error"
    write(rules / "policy.yaml", VERSION_B)
    assert store.poll().ok and store.select(dict(QUESTION)).backend == EXPECTED["B"]


def test_an_edit_with_the_same_size_and_mtime_is_still_seen_and_parsed_again(store, rules):
    """Parsed files are reused across reloads only when their sha256 is unchanged, never by mtime and size."""
    import os

    path = rules / "policy.yaml"
    st = path.stat()
    assert len(VERSION_A) == len(VERSION_B)
    path.write_text(VERSION_B)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # as a coarse-timestamp filesystem would leave it
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size
    result = store.poll()
    assert result is not None and result.ok
    assert store.select(QUESTION).backend == EXPECTED["B"]
    reused = [key for key in store.generation.oracle.snapshot.files if key[0].endswith("common/mxfp4.yaml")]
    assert reused, "unchanged shipped files are reused, not parsed again"


def test_a_reload_reuses_what_did_not_change_and_redoes_what_did(store, rules):
    """Parsed files, validated profiles and compiled tables are keyed by content: a reload with no change
    reuses them all; an edit re-parses that file only and recompiles only the profiles listing it."""
    first = store.generation.oracle
    mine, builtin = first.table(), first.table("vllm-0.20")
    docs = dict(first.snapshot.files)
    assert store.reload().ok
    same = store.generation.oracle
    assert same is not first and same.table() is mine and same.table("vllm-0.20") is builtin
    assert all(same.snapshot.files[key] is doc for key, doc in docs.items())
    write(rules / "policy.yaml", VERSION_B)
    assert store.reload().ok
    edited = store.generation.oracle
    assert edited.table() is not mine and edited.table("vllm-0.20") is builtin
    assert store.select(QUESTION).backend == EXPECTED["B"]
    reparsed = [key for key in edited.snapshot.files if key not in docs]
    assert [key[0] for key in reparsed] == [str((rules / "policy.yaml").resolve())]
    assert len(edited.snapshot.files) == len(docs), "the parse of the old version is forgotten"


def test_a_profile_compiled_later_comes_from_the_text_validated_with_its_snapshot(rules):
    """A snapshot is one version of the rules: a profile first used after its file changed on disk is compiled
    from what was read and validated when the snapshot was built, never from a half-written edit."""
    oracle = Oracle(rules)
    write(rules / "policy.yaml", BROKEN["half-written file"])
    assert oracle.table("mine").policies["mxfp4-gpt-oss"].description == "gpt-oss, A"
    assert oracle.select({**QUESTION, "profile": "mine"}).backend == EXPECTED["A"]
