"""8 threads selecting while the rules are reloaded, broken edits included: every answer comes from exactly one
of the two valid tables, and nothing raises."""
from __future__ import annotations

import threading
import time
from pathlib import Path

from runtime_rules import BROKEN, QUESTION, VERSION_A, VERSION_B, make_rules, write

from oracle import Oracle
from oracle.store import RuleStore

SM90 = {"kind": "cuda", "capability": [9, 0]}
THREADS = 8
PER_THREAD = 200_000  # a cap on what is kept for checking; the reloads normally end long before
# questions whose answers differ between A and B, plus ones that do not (they must stay right too)
QUESTIONS = [
    QUESTION,
    {**QUESTION, "moe": {"activation": "swigluoai", "hidden_size": 2880, "intermediate_size": 2880}},
    {**QUESTION, "packages": {"triton_kernels": False}},
    {**QUESTION, "platform": {"kind": "cuda", "capability": [8, 0]}},
    {"policy": "nvfp4", "platform": SM90, "packages": {"flashinfer": True}},
]


def _fingerprint(d):
    """What tells two tables' answers apart: the answer and the rule (file name and line) that decided it."""
    by = d.decided_by
    return (d.outcome, d.backend, d.kernel, d.hidden_size, d.intermediate_size, by.step if by else None,
            Path(by.at).name if by else None)


def _reference(tmp_path, text, name):
    """Answers of a fresh Oracle over a copy of the rules holding `text`: what that table alone says."""
    o = Oracle(make_rules(tmp_path / name, text))
    return [_fingerprint(o.select(q)) for q in QUESTIONS]


def test_eight_threads_select_while_reloads_happen(tmp_path):
    expected = {"A": _reference(tmp_path, VERSION_A, "ref-a"), "B": _reference(tmp_path, VERSION_B, "ref-b")}
    differing = [i for i in range(len(QUESTIONS)) if expected["A"][i] != expected["B"][i]]
    assert differing, "the two tables must disagree somewhere, or the test proves nothing"
    # the decided_by location tells the versions apart even where the backend is the same
    rules = make_rules(tmp_path / "live", VERSION_A)
    store = RuleStore(rules, plugins=False, platform=SM90, packages={}, env={})
    stop = threading.Event()
    seen: list[list[tuple[int, int, tuple]]] = [[] for _ in range(THREADS)]
    failures: list[BaseException] = []
    start = threading.Barrier(THREADS + 1)

    def worker(k: int) -> None:
        prepared = [store.prepare(q) for q in QUESTIONS]
        start.wait()
        i = k
        try:
            while not stop.is_set() and len(seen[k]) < PER_THREAD:
                j = i % len(QUESTIONS)
                question = prepared[j] if i % 3 else QUESTIONS[j]  # Scenario and dict paths both
                gen = store.generation.number
                seen[k].append((j, gen, _fingerprint(store.select(question, layer=i % 61))))
                i += 1
                if i % 64 == 0:
                    time.sleep(0)  # let the reloading thread in as a server's I/O waits would
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    start.wait()
    versions = ["B", "broken:unknown backend", "A", "broken:yaml syntax", "broken:half-written file", "B",
                "broken:schema", "A", "B"]
    outcomes = []
    try:
        for step in versions:
            text = BROKEN[step.split(":", 1)[1]] if step.startswith("broken:") else {"A": VERSION_A, "B": VERSION_B}[step]
            write(rules / "policy.yaml", text)
            outcomes.append((step, store.poll()))
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not failures, failures[:3]
    for step, result in outcomes:
        assert result is not None and result.ok == (not step.startswith("broken:")), (step, result)
    assert store.generation.number == 1 + sum(not s.startswith("broken:") for s in versions)

    total = 0
    from_a = from_b = 0
    for answers in seen:
        total += len(answers)
        for j, _, got in answers:
            assert got in (expected["A"][j], expected["B"][j]), (QUESTIONS[j], got)
            if j in differing:
                from_a += got == expected["A"][j]
                from_b += got == expected["B"][j]
    assert total > THREADS * len(versions), "the threads kept selecting during the reloads"
    generations = {g for answers in seen for _, g, _ in answers}
    assert len(generations) >= 3, f"selections ran across several generations, saw {sorted(generations)}"
    assert from_a and from_b, "answers from both tables were observed"
    # after the last reload every thread sees the final table
    for j, q in enumerate(QUESTIONS):
        assert _fingerprint(store.select(q)) == expected["B"][j]


def test_one_generation_answers_one_table_even_mid_swap(tmp_path):
    """An answer computed from generation N is cached in generation N only (never leaks into N+1)."""
    rules = make_rules(tmp_path / "r", VERSION_A)
    store = RuleStore(rules, plugins=False, platform=SM90, packages={}, env={})
    old = store.generation
    sc = store.prepare(QUESTION)
    assert store.select(sc).backend == "TRITON"
    write(rules / "policy.yaml", VERSION_B)
    assert store.poll().ok
    assert store.select(sc).backend == "MARLIN"
    assert all(d.backend == "TRITON" for d in old.answers.values())
    assert all(d.backend == "MARLIN" for d in store.generation.answers.values())
