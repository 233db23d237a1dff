"""Hot reload a server can trust (issue 28): one rules version per answer, no partial install, symlink swaps,
honest health, never raising."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path

import pytest
from runtime_rules import EXPECTED, PROFILES, QUESTION, VERSION_A, VERSION_B, make_rules, write

from oracle import Oracle
from oracle.store import MANIFEST, RuleStore

SM90 = {"kind": "cuda", "capability": [9, 0]}

# version A: no fact default, no env var; version B: a policy default for the intermediate size, and an env var
# of this site that forces MARLIN (so a question prepared under A must be resolved again to be answered as B would)
SITE_A = VERSION_A
SITE_B = VERSION_B.replace('    candidates: [MARLIN, TRITON]\n', '''    candidates: [TRITON, MARLIN]
    defaults: {moe.intermediate_size: 2048}
''').replace("      - {id: auto-b,", '''      - {id: site-forced, when: {env: SITE_FORCE_MARLIN, parses_to: true}, use: MARLIN, why: "site switch"}
      - {id: auto-b,''') + '''env_vars:
  SITE_FORCE_MARLIN:
    parse: int_bool
    default: null
    why: "this site's switch to Marlin"
'''
SECOND_POLICY = """\
  second-policy:
    family: mxfp4
    description: "a second policy"
    candidates: [TRITON, MARLIN]
    steps:
      - {id: auto-2, try: candidates, why: "second"}
      - {id: none-2, outcome: unsupported, message: "neither fits", why: "a test profile"}
"""


def _store(rules: Path, **options) -> RuleStore:
    options = {"plugins": False, "platform": SM90, "packages": {}, "env": {}, "settle": 0.0, **options}
    return RuleStore(rules, **options)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------- 1. one rules version per answer
def test_a_prepared_question_after_a_reload_is_answered_exactly_as_the_dict(tmp_path):
    rules = make_rules(tmp_path / "r", SITE_A)
    audit = tmp_path / "audit.jsonl"
    store = _store(rules, env={"SITE_FORCE_MARLIN": "1"}, packages={"triton_kernels": True}, audit_log=audit)
    question = {"policy": "mxfp4-gpt-oss", "moe": {"activation": "swigluoai", "hidden_size": 2880}}
    prepared = store.prepare(question)
    before = store.select(prepared)
    assert before.backend == "TRITON" and before.generation == 1 and before.intermediate_size != 2048
    assert "SITE_FORCE_MARLIN" not in prepared.env, "version A does not declare it"
    write(rules / "policy.yaml", SITE_B)
    assert store.poll().ok
    as_dict, as_prepared = store.select(dict(question)), store.select(prepared)
    assert as_dict.backend == "MARLIN" and as_dict.decided_by.step == "site-forced"
    assert as_dict.intermediate_size == 2048, "version B's fact default"
    assert as_prepared is as_dict and as_prepared.generation == 2
    store.close()
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(line["rules"]["generation"], line["decision"]["backend"]) for line in lines] == [(1, "TRITON"),
                                                                                          (2, "MARLIN")]


def test_oracle_prepare_is_resolved_again_after_the_oracle_reloads(tmp_path):
    rules = make_rules(tmp_path / "r", SITE_A)
    oracle = Oracle(rules)
    question = {**QUESTION, "moe": {"activation": "swigluoai", "hidden_size": 2880}}
    prepared = oracle.prepare(question)
    assert oracle.select(prepared).intermediate_size != 2048
    write(rules / "policy.yaml", SITE_B)
    oracle.reload()
    assert oracle.select(prepared) == oracle.select(dict(question))
    assert oracle.select(prepared).intermediate_size == 2048
    import pickle

    again = pickle.loads(pickle.dumps(prepared))
    assert again == prepared and oracle.select(again).intermediate_size == 2048


def test_a_question_prepared_by_one_version_that_the_next_refuses_is_an_error_answer(tmp_path):
    rules = make_rules(tmp_path / "r", VERSION_A)
    store = _store(rules, allow_removals=True)
    prepared = store.prepare({**QUESTION, "profile": "mine"})
    (rules / "profiles.yaml").write_text(PROFILES.replace("mine", "theirs"))
    assert store.poll().ok
    d = store.select(prepared)
    assert d.outcome == "error" and "unknown profile 'mine'" in d.error and d.generation == 2


# ---------------------------------------------------------------- 2. no partial install
def test_a_slowly_written_file_is_never_installed_half_written(tmp_path):
    rules = make_rules(tmp_path / "r", VERSION_A)
    store = _store(rules, settle=0.15)
    valid = {hashlib.sha256(v.encode()).hexdigest() for v in (VERSION_A, VERSION_B)}
    installed: list[str] = []
    stop = threading.Event()

    def poller() -> None:
        while not stop.is_set():
            store.poll()
            installed.append(store.generation.hashes[(rules / "policy.yaml").resolve()])

    t = threading.Thread(target=poller)
    t.start()
    try:
        for text in (VERSION_B, VERSION_A, VERSION_B):
            with open(rules / "policy.yaml", "w") as fh:  # truncate, then write in pieces with pauses
                for i in range(0, len(text), 40):
                    fh.write(text[i:i + 40])
                    fh.flush()
                    time.sleep(0.03)
            time.sleep(0.4)
    finally:
        stop.set()
        t.join()
    assert set(installed) <= valid, "a partial file was installed"
    assert store.select(QUESTION).backend == EXPECTED["B"]


def test_a_version_that_drops_a_policy_is_held_back_and_reported_once(tmp_path, caplog):
    rules = make_rules(tmp_path / "r", VERSION_A + SECOND_POLICY)
    store = _store(rules)
    assert store.select({"policy": "second-policy"}).outcome != "error"
    with caplog.at_level(logging.ERROR, logger="moe_oracle"):
        write(rules / "policy.yaml", VERSION_B)  # valid alone, but second-policy is gone
        first, again = store.poll(), store.poll()
    assert first is not None and not first.ok and first.held_back and again.held_back
    assert "drop policy 'second-policy' of profile 'mine'" in first.error and store.last_error == first.error
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1
    assert store.select(QUESTION).backend == EXPECTED["A"], "the previous rules keep serving"
    assert store.stats()["reloads"]["held_back"] == 2
    # a manifest with a new version, written last, says the removal is meant
    (rules / MANIFEST).write_text(json.dumps({"version": "2"}))
    result = store.poll()
    assert result.ok and store.select(QUESTION).backend == EXPECTED["B"] and store.last_error is None
    assert store.generation.manifest_version == "2"


def test_allow_removals_installs_a_smaller_version(tmp_path):
    rules = make_rules(tmp_path / "r", VERSION_A + SECOND_POLICY)
    store = _store(rules, allow_removals=True)
    write(rules / "policy.yaml", VERSION_B)
    assert store.poll().ok and store.select({"policy": "second-policy"}).outcome == "error"


def test_a_manifest_holds_a_version_back_until_every_file_it_lists_is_there(tmp_path):
    rules = make_rules(tmp_path / "r", VERSION_A)
    store = _store(rules)
    digest = hashlib.sha256(VERSION_B.encode()).hexdigest()
    (rules / MANIFEST).write_text(json.dumps({"version": "b", "files": {"policy.yaml": digest}}))
    result = store.poll()
    assert result.held_back and "policy.yaml" in result.error and "not completely published" in result.error
    assert store.select(QUESTION).backend == EXPECTED["A"]
    write(rules / "policy.yaml", VERSION_B)
    assert store.poll().ok and store.select(QUESTION).backend == EXPECTED["B"]
    (rules / MANIFEST).write_text("{not json")
    broken = store.poll()
    assert not broken.ok and MANIFEST in broken.error


# ---------------------------------------------------------------- 3. symlink swaps
def test_a_swapped_directory_symlink_is_picked_up_while_the_old_target_stays(tmp_path):
    v1, v2 = make_rules(tmp_path / "v1", VERSION_A), make_rules(tmp_path / "v2", VERSION_B)
    current = tmp_path / "current"
    current.symlink_to(v1)
    store = _store(current)
    assert store.select(QUESTION).backend == EXPECTED["A"]
    assert store.poll() is None
    new = tmp_path / "current.new"
    new.symlink_to(v2)
    os.replace(new, current)  # the atomic swap of a release layout
    assert store.poll().ok and store.select(QUESTION).backend == EXPECTED["B"]
    assert v1.exists() and store.poll() is None


def test_a_configmap_style_data_swap_and_a_file_symlink_swap_are_picked_up(tmp_path):
    root = tmp_path / "mount"
    root.mkdir()
    for name, text in (("..2024_a", VERSION_A), ("..2024_b", VERSION_B)):
        make_rules(root / name, text)
    (root / "..data").symlink_to("..2024_a")
    for f in ("profiles.yaml", "policy.yaml"):
        (root / f).symlink_to(f"..data/{f}")
    store = _store(root)
    assert store.select(QUESTION).backend == EXPECTED["A"]
    tmp_link = root / "..data_tmp"
    tmp_link.symlink_to("..2024_b")
    os.replace(tmp_link, root / "..data")
    assert store.poll().ok and store.select(QUESTION).backend == EXPECTED["B"]
    # a single file's link swapped to another file
    (root / "policy-a.yaml").write_text(VERSION_A)
    (root / "policy.yaml").unlink()
    (root / "policy.yaml").symlink_to("policy-a.yaml")
    (root / "profiles.yaml").unlink()
    (root / "profiles.yaml").symlink_to("..data/profiles.yaml")
    result = store.poll()
    assert result is not None and result.ok and store.select(QUESTION).backend == EXPECTED["A"]


def test_the_watcher_picks_up_a_swapped_link_within_one_interval(tmp_path):
    v1, v2 = make_rules(tmp_path / "v1", VERSION_A), make_rules(tmp_path / "v2", VERSION_B)
    current = tmp_path / "current"
    current.symlink_to(v1)
    store = _store(current, settle=0.05)
    store.watch(interval=0.1)
    try:
        new = tmp_path / "current.new"
        new.symlink_to(v2)
        os.replace(new, current)
        deadline = time.monotonic() + 10
        while store.generation.number == 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.select(QUESTION).backend == EXPECTED["B"]
    finally:
        store.close()


# ---------------------------------------------------------------- 5. honest health
def test_last_error_clears_when_a_broken_edit_is_reverted_and_a_new_break_is_logged_again(tmp_path, caplog):
    rules = make_rules(tmp_path / "r", VERSION_A)
    store = _store(rules)
    broken = VERSION_B.replace("[MARLIN, TRITON]", "[MARLINN, TRITON]")
    with caplog.at_level(logging.ERROR, logger="moe_oracle"):
        write(rules / "policy.yaml", broken)
        assert not store.poll().ok and "MARLINN" in store.last_error
        write(rules / "policy.yaml", VERSION_A)  # reverted: the files are the serving ones again
        assert store.poll() is None and store.last_error is None
        write(rules / "policy.yaml", broken)
        assert not store.poll().ok
        write(rules / "policy.yaml", VERSION_B)
        assert store.poll().ok
        write(rules / "policy.yaml", broken)  # the same mistake after a good version: a new outage, logged
        assert not store.poll().ok
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2, [r.getMessage() for r in errors]
    stats = store.stats()
    assert stats["generation"] == 2 and stats["reloads"]["failed"] == 3 and "MARLINN" in stats["last_error"]


def test_failed_answers_are_counted_per_generation(tmp_path):
    rules = make_rules(tmp_path / "r", VERSION_A)
    store = _store(rules)
    for _ in range(3):
        assert store.select({"policy": "nope"}).outcome == "error"
    assert store.select({**QUESTION, "platform": {"kind": "cpu"}}).outcome in ("unsupported", "invalid")
    store.select(QUESTION)
    counts = store.stats()["failed_answers"][1]
    assert counts["error"] == 3 and counts["unsupported"] + counts["invalid"] == 1
    write(rules / "policy.yaml", VERSION_B)
    assert store.poll().ok
    store.select({"policy": "nope"})
    assert store.stats()["failed_answers"][2]["error"] == 1 and store.stats()["failed_answers"][1]["error"] == 3


# ---------------------------------------------------------------- never raises
HOSTILE = {
    "non-UTF-8 byte": b"policies:\n  x: \xff\n",
    "integer key": b"1: [a]\n",
    "self-referential alias": b"loop: &l [*l]\n",
    "binary": bytes(range(256)),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_poll_and_reload_never_raise_on_hostile_files(tmp_path, kind):
    rules = make_rules(tmp_path / "r", VERSION_A)
    store = _store(rules)
    (rules / "policy.yaml").write_bytes(HOSTILE[kind])
    for result in (store.poll(), store.reload()):
        assert result is not None and not result.ok and result.error
    assert store.last_error and store.select(QUESTION).backend == EXPECTED["A"]


def test_a_rule_file_over_the_size_limit_is_not_read_past_it_and_the_old_version_keeps_serving(tmp_path,
                                                                                                 monkeypatch):
    """The watcher hashes a watched file only up to MAX_FILE_BYTES (a huge or endless file dropped into the rules
    directory costs no more at each poll); the reload refuses it naming the file, and the old version serves."""
    from oracle import generation
    from oracle.limits import MAX_FILE_BYTES

    rules = make_rules(tmp_path / "r", VERSION_A)
    store = _store(rules)
    big = rules / "policy.yaml"
    big.write_bytes(b"#" * (MAX_FILE_BYTES + 4096))
    reads: list = []
    monkeypatch.setattr(generation, "open", lambda *a, **k: _Counted(open(*a, **k), reads), raising=False)
    state = generation._file_state(str(big))
    monkeypatch.undo()
    assert state[:2] == ("over the limit", MAX_FILE_BYTES + 4096) and reads == [MAX_FILE_BYTES + 1], (state, reads)
    result = store.poll()
    assert result is not None and not result.ok and "policy.yaml" in result.error and "the limit" in result.error
    assert store.select(QUESTION).backend == EXPECTED["A"]


class _Counted:
    """A file whose reads are recorded (size asked), to show what a reader asked for."""

    def __init__(self, real, reads):
        self.real, self.reads = real, reads

    def read(self, n=-1):
        self.reads.append(n)
        return self.real.read(n)

    def fileno(self):
        return self.real.fileno()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.real.close()


def test_a_profiles_file_that_is_a_symlink_loop_is_an_error_not_an_exception(tmp_path):
    rules = make_rules(tmp_path / "r", VERSION_A)
    store = _store(rules)
    (rules / "profiles.yaml").unlink()
    (rules / "profiles.yaml").symlink_to("profiles.yaml")
    result = store.poll()
    assert result is not None and not result.ok and store.select(QUESTION).backend == EXPECTED["A"]


def _deep(depth: int) -> str:
    """A condition nested `depth` deep (all/any alternating, so nothing flattens it)."""
    cond = "{fact: moe.lora, eq: true}"
    for i in range(depth):
        cond = "{%s: [%s, {fact: moe.hidden_size, eq: %d}]}" % ("all" if i % 2 else "any", cond, i)
    return cond


def test_rules_that_validate_but_raise_when_answered_are_never_installed(tmp_path):
    rules = make_rules(tmp_path / "r", VERSION_A)
    store = _store(rules)
    deep = VERSION_B.replace("      - {id: auto-b,", "      - {id: deep, when: " + _deep(200)
                             + ", use: MARLIN, why: \"deep\"}\n      - {id: auto-b,")
    write(rules / "policy.yaml", deep)
    result = store.poll()
    assert result is not None and not result.ok and store.last_error
    assert store.select(QUESTION).backend == EXPECTED["A"]


def test_a_question_nested_far_too_deep_is_an_error_answer(tmp_path):
    store = _store(make_rules(tmp_path / "r", VERSION_A))
    deep: dict = {}
    for _ in range(5000):
        deep = {"x": deep}
    d = store.select({**QUESTION, "moe": deep})
    assert d.outcome == "error" and store.stats()["failed_answers"][1]["error"] == 1


def test_select_answers_error_when_the_rules_raise(tmp_path, monkeypatch):
    rules = make_rules(tmp_path / "r", VERSION_A)
    store = _store(rules)

    def boom(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(store.generation.oracle, "select_uncached", boom)
    d = store.select(QUESTION)
    assert d.outcome == "error" and "rules generation 1 failed on this question (RecursionError" in d.error
    assert store.select(QUESTION) is d and store.stats()["failed_answers"][1]["error"] == 2
