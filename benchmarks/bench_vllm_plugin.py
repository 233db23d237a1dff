"""Plugin cost: one patched vLLM selector call against vLLM's own selector, same process, same questions.

Needs vLLM 0.33.x installed (CPU is enough): vLLM's real selectors run on the simulated platform of
tests/vllm_simulation.py (vLLM's own `current_platform` object with the question's capability, probes
answering the question's packages), once unpatched and once through the plugin (shipped rules, profile
vllm-0.33). Each question is timed in turn for both, per-call CPU time (benchmarks/_timing.py): the best
of `--rounds` rounds of `--calls` calls. Writes one CSV row per question and a summary row to
`--out DIR/vllm_plugin_cost.csv`, and prints the summary.

    python benchmarks/bench_vllm_plugin.py --out benchmarks/results/<run>
"""
from __future__ import annotations

import argparse
import csv
import json
import platform
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from _timing import best  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for vllm_plugin_cost.csv")
    ap.add_argument("--questions", type=int, default=60, help="golden questions timed (spread over the sample)")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    import pytest
    import vllm
    from vllm_simulation import BEFORE_SELECTION, SimulatedMachine, by_policy, golden_questions

    from oracle.integrations import vllm as plugin

    release = plugin.release_for(vllm.__version__)
    selectors = by_policy(release)
    questions = golden_questions(release)
    step = max(1, len(questions) // args.questions)
    picked = questions[::step][: args.questions]
    rows = []
    with pytest.MonkeyPatch.context() as mp:
        machine = SimulatedMachine(mp, release)
        try:
            plugin.install(release.profile)
            for i, q in enumerate(picked):
                sc = q["scenario"]
                sel = selectors[sc["policy"]]
                kwargs = machine.ask(sc)
                if BEFORE_SELECTION in kwargs:
                    continue
                own = machine.originals[sel.name]
                patched = getattr(sys.modules[sel.callers[0]], sel.name)

                def call(fn, kw=kwargs):
                    try:
                        fn(**kw)
                    except (ValueError, NotImplementedError):
                        pass

                call(patched)  # the first call of a question logs its decision: not what a layer pays later
                vllm_s = best(lambda fn=own: call(fn), args.calls, args.rounds)
                plugin_s = best(lambda fn=patched: call(fn), args.calls, args.rounds)
                rows.append({"question": i, "policy": sc["policy"], "platform": json.dumps(sc["platform"]),
                             "activation": sc.get("moe", {}).get("activation", "swigluoai"),
                             "vllm_us": round(vllm_s * 1e6, 2), "plugin_us": round(plugin_s * 1e6, 2),
                             "plugin_over_vllm": round(plugin_s / vllm_s, 3)})
        finally:
            plugin.uninstall()
            machine.restore()
    ratios = [r["plugin_over_vllm"] for r in rows]
    summary = {"question": "median", "policy": "all", "platform": f"{len(rows)} questions",
               "activation": f"vllm {vllm.__version__}, python {platform.python_version()}, {platform.machine()}",
               "vllm_us": round(statistics.median(r["vllm_us"] for r in rows), 2),
               "plugin_us": round(statistics.median(r["plugin_us"] for r in rows), 2),
               "plugin_over_vllm": round(statistics.median(ratios), 3)}
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "vllm_plugin_cost.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(summary))
        w.writeheader()
        w.writerows([*rows, summary])
    print(f"{len(rows)} questions: vLLM's own selector {summary['vllm_us']} us, through the plugin "
          f"{summary['plugin_us']} us (median per call); plugin/vLLM median {summary['plugin_over_vllm']}, "
          f"max {max(ratios)}")


if __name__ == "__main__":
    main()
