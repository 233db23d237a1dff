"""explain never shows a step that changed nothing as applied: a matched move/drop whose backends are no longer
candidates is marked, with the reason, in text and JSON traces."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from oracle.cli import main

BAD = Path(__file__).parent / "bad_rules"


def test_a_move_that_changes_nothing_is_marked_no_op(capsys, tmp_path):
    text = (BAD / "valid.yaml").read_text()
    text = text.replace('      TRITON: {kernels: [TritonExperts]',
                        '      TRITON2: {kernels: [TritonExperts], activation_key: null, converter: null, runner: null, '
                        'missing_why: "test rules run nothing", why: "a second triton"}\n'
                        '      TRITON: {kernels: [TritonExperts]')
    text = text.replace("    candidates: [TRITON]\n", "    candidates: [TRITON, TRITON2]\n")
    text = text.replace('''      - id: auto
        try: candidates''', '''      - id: narrow
        candidates: [TRITON]
        why: "only the first triton here"
      - id: second-first
        move: TRITON2
        before: TRITON
        why: "TRITON2 first (but narrow removed it)"
      - id: auto
        try: candidates''')
    (tmp_path / "r.yaml").write_text(text)
    (tmp_path / "profiles.yaml").write_text("default: p\nprofiles:\n  p: {description: 'x', files: [r.yaml]}\n")
    argv = ["--rules", str(tmp_path), "explain", "--policy", "pol", "--platform", "cuda:9.0"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "  ~ step second-first" in out and "* step second-first" not in out
    assert "matched, but changed nothing: TRITON2 is not among the candidates ['TRITON']" in out
    assert "  * step narrow" in out  # a step that did change the list is applied
    assert main([*argv, "--json"]) == 0
    trace = json.loads(capsys.readouterr().out)["trace"]
    [entry] = [e for e in trace if e.get("step") == "second-first"]
    assert entry["matched"] is True and "TRITON2 is not among the candidates" in entry["no_op"]
    assert main([*argv, "--json"]) == 0
    decision = json.loads(capsys.readouterr().out)
    schema = json.loads((Path(__file__).resolve().parents[1] / "schemas" / "decision.schema.json").read_text())
    jsonschema.validate(decision, schema)  # the documented answer shape carries no_op
