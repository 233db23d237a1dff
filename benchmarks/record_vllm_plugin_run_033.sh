#!/usr/bin/env bash
# Re-record docs/vllm-plugin-run-0.33.log: the plugin's proof tests, the counts behind them and the plugin's cost,
# against the real vLLM 0.33.0 (CPU is enough; the platform is simulated by tests/vllm_simulation.py).
# Runs on a 'git archive' export of HEAD (the tested code is exactly the committed code).
#   usage: benchmarks/record_vllm_plugin_run_033.sh VLLM_VENV [OUT_LOG] [RESULTS_DIR]
#   VLLM_VENV: a venv with `pip install vllm==0.33.0` and `pip install --no-deps -e <this repo>` plus pytest
set -euo pipefail
venv=${1:?usage: $0 VLLM_VENV [OUT_LOG] [RESULTS_DIR]}
repo=$(git rev-parse --show-toplevel)
out=${2:-$repo/docs/vllm-plugin-run-0.33.log}
results=${3:-}
commit=$(git -C "$repo" rev-parse --short HEAD)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$repo" archive HEAD | tar -x -C "$work"
py="$venv/bin/python"
export PYTHONPATH="$work" PYTHONUNBUFFERED=1
noise='Failed to import from vllm._rocm_C|^No Mxfp4 MoE backend supports activation='
{
  echo "# moe-oracle vLLM plugin: proof run against the real vLLM 0.33.0"
  echo "# date: $(date -u '+%Y-%m-%d %H:%M UTC'); repo commit: $commit (run in a 'git archive' export of it, on PYTHONPATH,"
  echo "#   so the tested code is exactly the committed code); recorded by benchmarks/record_vllm_plugin_run_033.sh"
  echo "# machine: CPU only, no GPU, no GPU driver ($(uname -m), Python $("$py" -c 'import platform; print(platform.python_version())'))"
  echo "# how vLLM was installed (a venv outside the repo):"
  echo "#   python3 -m venv VENV && VENV/bin/pip install vllm==0.33.0      # torch 2.14.0, flashinfer-python 0.7.2.post1, ..."
  echo "#   VENV/bin/pip install pytest hypothesis hatchling editables && VENV/bin/pip install --no-deps --no-build-isolation -e ."
  echo "#   (the editable install registers the vllm.general_plugins entry point moe_oracle = oracle.integrations.vllm:register)"
  echo "# the simulation (tests/vllm_simulation.py, SimulatedMachine with RELEASES[\"0.33\"]): vLLM's one current_platform object"
  echo "#   takes a subclass of vLLM's Cuda/Rocm/XPU/Cpu platform overriding only get_device_capability (ROCm's arch from a"
  echo "#   stand-in amdsmi); vLLM's package probes answer from the question's packages; FlashInfer's feature probes"
  echo "#   (has_flashinfer_<feature>, has_flashinfer_situ_activation) answer the question's flashinfer: facts, unset = what"
  echo "#   the pinned flashinfer-python 0.7.2.post1 answers (present; Situ included); CPU AMX answers platform.amx; the"
  echo "#   user's quantization_config.moe.activation is set in the current vLLM config; env vars are set in os.environ."
  echo "#   Selectors, experts classes, FusedMoEConfig and is_supported_config are vLLM's own code."
  echo "# installed: $("$py" -c 'import importlib.metadata as m; print(";".join(f"{d} {m.version(d)}" for d in ("flashinfer-python", "humming-kernels", "moe-oracle", "torch", "triton", "vllm")))')"
  echo
  echo "\$ python -m pytest -v -rs -p no:cacheprovider tests/test_vllm_plugin_033.py tests/test_vllm_plugin.py tests/test_package_features.py"
  (cd "$work" && "$py" -m pytest -v -rs -p no:cacheprovider tests/test_vllm_plugin_033.py tests/test_vllm_plugin.py \
      tests/test_package_features.py 2>&1) | grep -Ev "$noise" || true
  echo
  echo "\$ python summary.py   # the counts behind the proof tests, same harness"
  cat > "$work/tests/summary.py" <<'EOF'
# The counts behind the 0.33 proof tests (same harness: tests/vllm_simulation.py, tests/test_vllm_plugin_033.py).
import collections, json, random
import pytest
import vllm_simulation as sim, test_vllm_plugin_033 as t
qs = sim.golden_questions(t.RELEASE)
print("golden questions:", len(qs), dict(collections.Counter(q["scenario"]["policy"] for q in qs)))
with pytest.MonkeyPatch.context() as mp:
    m = sim.SimulatedMachine(mp, t.RELEASE)
    own = [a for a, _ in t.unpatched_answers(m, qs)]
    print("unpatched vLLM == recorded golden answer:", sum(a == t.recorded(q) for a, q in zip(own, qs)), "of", len(qs))
    shipped = [a for a, _ in t.through_plugin(m, "vllm-0.33", qs)]
    print("plugin (shipped rules) == unpatched vLLM:", sum(a == b for a, b in zip(shipped, own)), "of", len(qs))
    rng = random.Random(33)
    sweep = [{"scenario": s} for s in sorted((sim.random_question_033(rng) for _ in range(1500)),
                                             key=lambda s: json.dumps(s["platform"]))]
    own = [a for a, _ in t.unpatched_answers(m, sweep)]
    ours = [a for a, _ in t.through_plugin(m, "vllm-0.33", sweep)]
    print("random 0.33 deployments (seed 33, as in the test):", len(sweep), "plugin == unpatched vLLM:",
          sum(a == b for a, b in zip(own, ours)), "distinct vLLM answers:", len(set(own)))
    # SiTU layers on SM 10.x: vLLM 0.33.0 with its pinned FlashInfer (Situ present), and with one that lacks it
    situ = []
    for cap in ([10, 0], [10, 3]):
        for policy in ("mxfp4", "nvfp4"):
            for features in ({}, {"situ_activation": False}):
                sc = {"profile": "vllm-0.33", "policy": policy, "platform": {"kind": "cuda", "capability": cap},
                      "packages": {p: True for p in ("flashinfer", "triton_kernels", "deep_gemm", "humming", "quark")},
                      "env": {}, "moe": {"activation": "situ", **({"activation_key": None, "user_activation_key": None}
                                                                   if policy == "mxfp4" else {})},
                      **({"flashinfer": features} if features else {})}
                situ.append({"scenario": sc})
    own = [a for a, _ in t.unpatched_answers(m, situ)]
    ours = [a for a, _ in t.through_plugin(m, "vllm-0.33", situ)]
    for q, a, b in zip(situ, own, ours):
        sc = q["scenario"]
        print("   situ", sc["policy"], sc["platform"]["capability"], "Situ in FlashInfer:",
              sc.get("flashinfer", {}).get("situ_activation", True), "vLLM:", a[1:], "plugin:", b[1:],
              "agree" if a == b else "DIFFER")
    m.restore()
EOF
  sed 's/^/    /' "$work/tests/summary.py"
  (cd "$work/tests" && "$py" summary.py 2>&1) | grep -Ev "$noise" | grep -v "^INFO .*\[moe_oracle\]" || true
  echo
  echo "\$ python benchmarks/bench_vllm_plugin.py --out RESULTS   # per-call cost, same process, same questions"
  bench_out=${results:-$work/results}
  (cd "$work" && "$py" benchmarks/bench_vllm_plugin.py --out "$bench_out" 2>&1) | grep -Ev "$noise" \
      | grep -v "^INFO\|^WARNING\|^W1\|^DEBUG" || true
} > "$out"
echo "wrote $out"
