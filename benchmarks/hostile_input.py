"""The hostile-input figures: how the CLI, the API and the rule loader end on hostile or careless input.

    python benchmarks/hostile_input.py [--scenarios N] [--batch N] [--shipped N] [--questions N] [--seed S]

Runs the whole corpus of tests/hostile_corpus.py (the tests run a bounded sample of it): every rule-file
mutant (structural and literal) of tests/bad_rules/valid.yaml against a fixed question set, hostile
scenarios through Oracle.select, hostile lines through `select --batch`, and the security probes; prints
one line per category (tried / rejected with place / accepted unchanged / answered / changed / crashes /
hangs) and exits 1 when anything crashed, hung, changed an answer silently or was refused without a place.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import hostile_corpus as corpus  # noqa: E402

from oracle import Oracle  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", type=int, default=12_000, help="hostile scenarios through Oracle.select")
    ap.add_argument("--batch", type=int, default=3_000, help="hostile lines through select --batch")
    ap.add_argument("--shipped", type=int, default=200, help="typo-like edits of the shipped rules")
    ap.add_argument("--questions", type=int, default=400, help="golden questions asked of each shipped mutant")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    started = time.perf_counter()
    tallies: dict[str, corpus.Tally] = {}
    with tempfile.TemporaryDirectory(prefix="moe-oracle-hostile-") as tmp_name:
        tmp = Path(tmp_name)
        corpus.run_rule_mutants(tmp / "rules", corpus.rule_mutants(args.seed), tallies)
        corpus.run_shipped_mutants(tmp, corpus.shipped_literal_mutants(args.shipped, args.seed), tallies,
                                   args.questions)
        corpus.run_scenarios(Oracle(), args.scenarios, tallies, args.seed)
        (tmp / "batch").mkdir()
        corpus.run_batch(tmp / "batch", corpus.batch_lines(args.batch, args.seed), tallies)
        probes = corpus.Tally()
        (tmp / "probes").mkdir()
        for label, held in corpus.security_probes(tmp / "probes"):
            probes.add("rejected" if held else "crash", label)
        tallies["security probes (no command run, no stray write)"] = probes
    bad = 0
    for name, tally in tallies.items():
        print(tally.line(name))
        for ending, labels in tally.examples.items():
            bad += len(labels)
            print(f"  {ending}: " + "; ".join(labels[:5]) + (" ..." if len(labels) > 5 else ""))
    total = sum(t.tried for t in tallies.values())
    print(f"total: tried {total} in {time.perf_counter() - started:.0f} s; "
          f"{bad} crashed, hung, changed an answer silently or were refused without a place")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
