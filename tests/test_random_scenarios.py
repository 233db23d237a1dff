"""Seeded random scenarios over the whole fact space: the oracle answers every one, and its two
code paths (fast selection, full trace) tell the same story."""
from __future__ import annotations

import json
import random

import pytest

from oracle import OUTCOMES

PLATFORMS = [{"kind": "cuda", "capability": [7, 0]}, {"kind": "cuda", "capability": [7, 5]},
             {"kind": "cuda", "capability": [8, 0]}, {"kind": "cuda", "capability": [9, 0]},
             {"kind": "cuda", "capability": [10, 0]}, {"kind": "cuda", "capability": [10, 3]},
             {"kind": "cuda", "capability": [11, 0]}, {"kind": "cuda", "capability": [12, 0]},
             {"kind": "rocm", "gcn_arch": "gfx90a"}, {"kind": "rocm", "gcn_arch": "gfx942"},
             {"kind": "rocm", "gcn_arch": "gfx950"}, {"kind": "xpu"}, {"kind": "cpu"}]
ENV_VALUES = {
    "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": ["0", "1", "true"], "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": ["0", "1"],
    "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS": ["0", "1"], "VLLM_MXFP4_USE_MARLIN": ["0", "1"],
    "VLLM_USE_FLASHINFER_MOE_FP4": ["0", "1"], "VLLM_FLASHINFER_MOE_BACKEND": ["throughput", "latency", "masked_gemm", "fast"],
    "VLLM_TEST_FORCE_FP8_MARLIN": ["1", " TRUE "], "VLLM_ROCM_USE_AITER": ["1", "True"], "VLLM_ROCM_USE_AITER_MOE": ["0"],
    "VLLM_BATCH_INVARIANT": ["1"], "VLLM_USE_DEEP_GEMM": ["0"],
}
ACTIVATIONS = ["silu", "gelu", "swigluoai", "swiglustep", "silu_no_mul", "gelu_no_mul", "relu2_no_mul"]
ALL2ALL = ["allgather_reducescatter", "deepep_low_latency", "deepep_high_throughput", "nixl_ep", "pplx",
           "flashinfer_all2allv", "flashinfer_nvlink_one_sided"]
BACKEND_STRINGS = ["auto", "auto", "auto", "triton", "marlin", "flashinfer_trtllm", "flashinfer_cutlass", "cutlass",
                   "deep_gemm", "emulation", "xpu", "aiter", "flashinfer_cutedsl", "bogus"]
QUARK_DTYPES = ["fp4", "fp6_e3m2", "fp6_e2m3", "fp8_e4m3", "int8"]


def random_scenario(rng: random.Random) -> dict:
    policy = rng.choice(["mxfp4-gpt-oss", "mxfp4", "nvfp4", "ocp-mx"])
    env = {k: rng.choice(v) for k, v in ENV_VALUES.items() if rng.random() < 0.15}
    act = rng.choice(ACTIVATIONS)
    moe = {"activation": act, "is_act_and_mul": not act.endswith("_no_mul"), "lora": rng.random() < 0.1,
           "moe_backend": rng.choice(BACKEND_STRINGS), "routing_method": rng.choice(["Renormalize", "DeepSeekV3", "Llama4"]),
           "hidden_size": rng.choice([2880, 4096, 7168]), "intermediate_size": rng.choice([720, 2880, 2048]),
           "parallel": {"dp_size": rng.choice([1, 2]), "ep_size": rng.choice([1, 2]), "use_ep": rng.random() < 0.5,
                        "all2all_backend": rng.choice(ALL2ALL), "eplb": rng.random() < 0.1}}
    sc = {"policy": policy, "profile": rng.choice(["vllm-0.20", "vllm-0.15"]), "platform": rng.choice(PLATFORMS),
          "packages": {p: rng.random() < 0.6 for p in ("flashinfer", "triton_kernels", "deep_gemm", "aiter")},
          "env": env, "moe": moe}
    if policy == "ocp-mx":
        sc["quark"] = {"weight": {"dtype": rng.choice(QUARK_DTYPES[:3]), "qscheme": rng.choice(["per_group"] * 4 + ["per_tensor"])},
                       "input": None if rng.random() < 0.3 else {"dtype": rng.choice(QUARK_DTYPES), "is_dynamic": rng.random() < 0.5}}
    return sc


SCENARIOS = [random_scenario(random.Random(seed)) for seed in range(4000)]


def _accepted(trace: list[dict]) -> list[dict]:
    out = []
    for entry in trace:
        if "trace" in entry:
            out.extend(_accepted(entry["trace"] or []))
        elif entry.get("candidate") and entry["accepted"]:
            out.append(entry)
    return out


@pytest.mark.parametrize("chunk", range(5))
def test_every_random_scenario_is_answered_consistently(oracle, chunk):
    for sc in SCENARIOS[chunk::5]:
        d = oracle.select(sc)
        out = d.to_dict()
        json.dumps(out)  # the answer is plain JSON
        assert out["outcome"] in OUTCOMES and out["outcome"] != "error", (sc, out.get("error"))
        if out["outcome"] in ("invalid", "unsupported"):
            assert out["error"]
        accepted = _accepted(out["trace"])
        if out["outcome"] == "selected":
            # the trace's last accepted candidate is the decision (fast path == trace path)
            assert accepted, sc
            assert accepted[-1]["candidate"] == d.backend, (sc, accepted[-1], d)
            assert d.kernel in (None, accepted[-1]["kernel"]), (sc, accepted[-1], d)
            assert d.hidden_size >= sc["moe"]["hidden_size"] and d.intermediate_size >= sc["moe"]["intermediate_size"]
        else:
            assert not accepted or sc["policy"] == "ocp-mx", (sc, out)
        assert oracle.select_uncached(oracle.prepare(sc)).to_dict() == out
