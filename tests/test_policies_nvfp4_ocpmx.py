"""Decision tests of the NVFP4 and Quark OCP-MX policies, for both shipped profiles.

Expected values are derived by hand from the vLLM reference (shared/reference/vllm-oracle.md:
sections 2.2, 5, 6 and 9), not copied from the golden sample: 0.20.0 has the explicit
moe_backend map, TRTLLM Monolithic/Modular classes, CuteDSL batched, emulation and the
ep_size == 1 rule for CutlassExpertsFp4; 0.15.1 checks TRTLLM with a free function
(kernel None), has pplx batching and returns (backend, None) from the FP4=1 loop.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from oracle import Oracle

ROOT = Path(__file__).resolve().parents[1]
ORACLE = Oracle()

P020 = "vllm-0.20"
P015 = "vllm-0.15"
PROFILES = (P020, P015)

SM80 = {"kind": "cuda", "capability": [8, 0]}
SM90 = {"kind": "cuda", "capability": [9, 0]}
SM100 = {"kind": "cuda", "capability": [10, 0]}
SM103 = {"kind": "cuda", "capability": [10, 3]}
SM120 = {"kind": "cuda", "capability": [12, 0]}
GFX942 = {"kind": "rocm", "gcn_arch": "gfx942"}
GFX950 = {"kind": "rocm", "gcn_arch": "gfx950"}
XPU = {"kind": "xpu"}
CPU = {"kind": "cpu"}

FI = {"flashinfer": True}
ALL_PKGS = {"flashinfer": True, "triton_kernels": True, "deep_gemm": True, "aiter": True}
NO_PKGS: dict = {}

BATCHED_DEEPEP = {"dp_size": 2, "ep_size": 2, "use_ep": True, "all2all_backend": "deepep_low_latency"}
BATCHED_PPLX = {"dp_size": 2, "ep_size": 2, "use_ep": True, "all2all_backend": "pplx"}
EP2_NO_DP = {"dp_size": 1, "ep_size": 2, "use_ep": True}


def nvfp4(profile, platform, env=None, packages=FI, **moe):
    moe.setdefault("activation", "silu")
    scenario = {"policy": "nvfp4", "profile": profile, "platform": platform, "packages": packages,
                "env": env or {}, "moe": moe}
    return ORACLE.select(scenario).to_dict(with_trace=False)


def ocp(profile, platform, weight="fp4", inp=None, qscheme="per_group", env=None, packages=ALL_PKGS, **moe):
    moe.setdefault("activation", "swigluoai")
    scenario = {"policy": "ocp-mx", "profile": profile, "platform": platform, "packages": packages,
                "env": env or {}, "moe": moe, "quark": {"weight": {"dtype": weight, "qscheme": qscheme}, "input": inp}}
    return ORACLE.select(scenario).to_dict(with_trace=False)


def check(d, outcome, backend=None, kernel="-"):
    assert d["outcome"] == outcome, d
    if outcome in ("selected", "none"):
        assert d["backend"] == backend, d
        if kernel != "-":
            assert d["kernel"] == kernel, d
    else:
        assert d.get("error"), d


# ------------------------------------------------------------------ NVFP4 env-var matrix

FP4 = {"unset": {}, "0": {"VLLM_USE_FLASHINFER_MOE_FP4": "0"}, "1": {"VLLM_USE_FLASHINFER_MOE_FP4": "1"}}
FIB = {"unset": {}, "throughput": {"VLLM_FLASHINFER_MOE_BACKEND": "throughput"},
       "latency": {"VLLM_FLASHINFER_MOE_BACKEND": "latency"},
       "masked_gemm": {"VLLM_FLASHINFER_MOE_BACKEND": "masked_gemm"}}

TRT_MONO = ("selected", "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsMonolithic")
TRT_FN = ("selected", "FLASHINFER_TRTLLM", None)          # 0.15: free function, kernel None
FI_CUTLASS = ("selected", "FLASHINFER_CUTLASS", "FlashInferExperts")
FI_CUTLASS_NOKERNEL = ("selected", "FLASHINFER_CUTLASS", None)
CUTEDSL = ("selected", "FLASHINFER_CUTEDSL", "FlashInferCuteDSLExperts")
VLLM_CUTLASS = ("selected", "VLLM_CUTLASS", "CutlassExpertsFp4")
MARLIN = ("selected", "MARLIN", "MarlinExperts")
EMULATION = ("selected", "EMULATION", "Nvfp4QuantizationEmulationTritonExperts")
UNSUPPORTED = ("unsupported", None, "-")
INVALID = ("invalid", None, "-")

# (profile, platform name) -> {(fp4, flashinfer_backend): expected}; flashinfer installed,
# gated SiLU, Renormalize, standard format, NVFP4 weight and activation keys.
MATRIX = {
    (P020, "SM100"): {
        ("unset", "*"): TRT_MONO, ("0", "*"): VLLM_CUTLASS, ("1", "unset"): TRT_MONO,
        ("1", "throughput"): FI_CUTLASS, ("1", "latency"): TRT_MONO, ("1", "masked_gemm"): CUTEDSL},
    (P020, "SM90"): {
        ("unset", "*"): MARLIN, ("0", "*"): MARLIN, ("1", "unset"): UNSUPPORTED,
        ("1", "throughput"): INVALID, ("1", "latency"): INVALID, ("1", "masked_gemm"): INVALID},
    (P020, "SM120"): {
        ("unset", "*"): FI_CUTLASS, ("0", "*"): VLLM_CUTLASS, ("1", "unset"): FI_CUTLASS,
        ("1", "throughput"): FI_CUTLASS, ("1", "latency"): FI_CUTLASS, ("1", "masked_gemm"): INVALID},
    (P015, "SM100"): {
        ("unset", "*"): TRT_FN, ("0", "*"): VLLM_CUTLASS, ("1", "unset"): TRT_FN,
        ("1", "throughput"): FI_CUTLASS, ("1", "latency"): TRT_FN,
        # 0.15's CuteDSL class is the batched masked GEMM: refused in the standard format
        ("1", "masked_gemm"): INVALID},
    (P015, "SM90"): {
        ("unset", "*"): MARLIN, ("0", "*"): MARLIN, ("1", "unset"): UNSUPPORTED,
        ("1", "throughput"): INVALID, ("1", "latency"): INVALID, ("1", "masked_gemm"): INVALID},
    (P015, "SM120"): {
        ("unset", "*"): FI_CUTLASS, ("0", "*"): VLLM_CUTLASS, ("1", "unset"): FI_CUTLASS_NOKERNEL,
        ("1", "throughput"): FI_CUTLASS, ("1", "latency"): FI_CUTLASS, ("1", "masked_gemm"): INVALID},
}
PLATFORMS = {"SM100": SM100, "SM90": SM90, "SM120": SM120}


def _matrix_cases():
    for (profile, pname), table in MATRIX.items():
        for fp4 in FP4:
            for fib in FIB:
                want = table.get((fp4, fib)) or table.get((fp4, "*"))
                yield pytest.param(profile, pname, fp4, fib, want, id=f"{profile}-{pname}-fp4_{fp4}-fib_{fib}")


@pytest.mark.parametrize("profile,pname,fp4,fib,want", list(_matrix_cases()))
def test_nvfp4_env_matrix(profile, pname, fp4, fib, want):
    d = nvfp4(profile, PLATFORMS[pname], env={**FP4[fp4], **FIB[fib]})
    check(d, *want)


def test_flashinfer_backend_ignored_unless_fp4_is_one():
    for profile in PROFILES:
        base = nvfp4(profile, SM120)
        for fp4 in ("unset", "0"):
            d = nvfp4(profile, SM120, env={**FP4[fp4], "VLLM_FLASHINFER_MOE_BACKEND": "masked_gemm"})
            assert d["outcome"] == "selected", d
        assert nvfp4(profile, SM120, env={"VLLM_FLASHINFER_MOE_BACKEND": "masked_gemm"})["backend"] == base["backend"]


def test_invalid_flashinfer_backend_value_only_when_read():
    bad = {"VLLM_FLASHINFER_MOE_BACKEND": "fastest"}
    for profile in PROFILES:
        check(nvfp4(profile, SM100, env={**bad, "VLLM_USE_FLASHINFER_MOE_FP4": "1"}), *INVALID)
        assert nvfp4(profile, SM100, env=bad)["outcome"] == "selected"   # FP4 unset: never read


def test_fp4_env_must_be_an_integer():
    for profile in PROFILES:
        d = nvfp4(profile, SM100, env={"VLLM_USE_FLASHINFER_MOE_FP4": "true"})
        check(d, *INVALID)
        assert "VLLM_USE_FLASHINFER_MOE_FP4" in d["error"]


def test_latency_falls_back_to_cutlass_off_sm10x_even_on_rocm():
    env = {"VLLM_USE_FLASHINFER_MOE_FP4": "1", "VLLM_FLASHINFER_MOE_BACKEND": "latency"}
    for profile in PROFILES:
        d = nvfp4(profile, GFX950, env=env)
        check(d, *INVALID)
        assert "FLASHINFER_CUTLASS" in d["error"]
    d = nvfp4(P020, GFX950, env=env)
    assert "current device rocm" in d["error"]
    d = nvfp4(P015, GFX950, env=env)
    assert "current device" in d["error"] and "current device rocm" not in d["error"]


def test_force_marlin():
    env = {"VLLM_TEST_FORCE_FP8_MARLIN": " TRUE "}   # parsed stripped and case-insensitive
    for profile in PROFILES:
        check(nvfp4(profile, SM100, env=env), *MARLIN)
        check(nvfp4(profile, SM100, env={**env, "VLLM_USE_FLASHINFER_MOE_FP4": "0"}), *MARLIN)
        check(nvfp4(profile, GFX942, env=env), *INVALID)
        # the FlashInfer switch comes first
        check(nvfp4(profile, SM100, env={**env, "VLLM_USE_FLASHINFER_MOE_FP4": "1"}),
              *(TRT_MONO if profile == P020 else TRT_FN))
    # non-gated: 0.20's Marlin accepts it, 0.15.1's refuses it
    check(nvfp4(P020, SM80, env=env, activation="relu2_no_mul", is_act_and_mul=False), *MARLIN)
    check(nvfp4(P015, SM80, env=env, activation="relu2_no_mul", is_act_and_mul=False), *INVALID)
    # Marlin has no batched variant for NVFP4
    check(nvfp4(P020, SM90, env=env, parallel=BATCHED_DEEPEP), *INVALID)


# ------------------------------------------------------------------ routing, activations, LoRA

@pytest.mark.parametrize("routing", ["DeepSeekV3", "Llama4", "Simulated", "Renormalize", "RenormalizeNaive"])
def test_trtllm_monolithic_routings_020(routing):
    check(nvfp4(P020, SM100, routing_method=routing), *TRT_MONO)


def test_trtllm_other_routing_uses_modular_020():
    check(nvfp4(P020, SM100, routing_method="Custom"), "selected", "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsModular")


@pytest.mark.parametrize("routing", ["DeepSeekV3", "Llama4", "Renormalize", "RenormalizeNaive"])
def test_trtllm_function_routings_015(routing):
    check(nvfp4(P015, SM100, routing_method=routing), *TRT_FN)


def test_trtllm_function_rejects_simulated_015():
    # CuteDSL (batched only in 0.15) refuses the standard format next, then FlashInfer CUTLASS wins
    check(nvfp4(P015, SM100, routing_method="Simulated"), *FI_CUTLASS)


def test_non_gated_relu2():
    kw = {"activation": "relu2_no_mul", "is_act_and_mul": False}
    check(nvfp4(P020, SM100, **kw), *TRT_MONO)                     # 0.20 TRTLLM supports relu2 non-gated
    check(nvfp4(P015, SM100, **kw), *FI_CUTLASS)                   # 0.15 TRTLLM function: gated SiLU only
    check(nvfp4(P020, SM100, packages=NO_PKGS, **kw), *VLLM_CUTLASS)
    check(nvfp4(P015, SM100, packages=NO_PKGS, **kw), *UNSUPPORTED)
    check(nvfp4(P020, SM80, **kw), *MARLIN)
    check(nvfp4(P015, SM80, **kw), *UNSUPPORTED)
    check(nvfp4(P020, {"kind": "cuda", "capability": [7, 0]}, **kw), *EMULATION)
    # FP4=1 loop in 0.15 returns (backend, None)
    check(nvfp4(P015, SM100, env=FP4["1"], **kw), *FI_CUTLASS_NOKERNEL)
    check(nvfp4(P020, SM100, env=FP4["1"], **kw), *TRT_MONO)


def test_gelu_only_vllm_cutlass_on_sm100_020():
    check(nvfp4(P020, SM100, activation="gelu"), *VLLM_CUTLASS)
    check(nvfp4(P015, SM100, activation="gelu"), *VLLM_CUTLASS)  # 0.15.1 CutlassExpertsFp4: silu, gelu, swigluoai (§2.3)


def test_lora():
    check(nvfp4(P020, SM100, lora=True), *MARLIN)
    # 0.15's is_supported_config_trtllm has no LoRA check
    check(nvfp4(P015, SM100, lora=True), *TRT_FN)
    check(nvfp4(P020, GFX942, lora=True), *EMULATION)


def test_bf16_activation_key_only_marlin():
    for profile in PROFILES:
        check(nvfp4(profile, SM100, activation_key=None), *MARLIN)


# ------------------------------------------------------------------ parallel modes

def test_batched_deepep_020():
    check(nvfp4(P020, SM100, parallel=BATCHED_DEEPEP), "selected", "FLASHINFER_CUTEDSL_BATCHED",
          "FlashInferCuteDSLBatchedExperts")
    check(nvfp4(P020, SM100, parallel=BATCHED_DEEPEP, env=FP4["0"]), *UNSUPPORTED)
    check(nvfp4(P020, SM90, parallel=BATCHED_DEEPEP), *UNSUPPORTED)


def test_pplx_is_batched_only_in_015():
    check(nvfp4(P015, SM100, parallel=BATCHED_PPLX), *CUTEDSL)
    check(nvfp4(P015, SM100, parallel=BATCHED_DEEPEP), *CUTEDSL)
    check(nvfp4(P015, SM103, parallel=BATCHED_PPLX, env=FP4["1"]), "selected", "FLASHINFER_CUTEDSL", None)
    # 0.20: pplx is plain all2all, so the TRTLLM Modular twin takes it
    check(nvfp4(P020, SM100, parallel=BATCHED_PPLX), "selected", "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsModular")


def test_all2all_and_eplb_need_modular_trtllm_020():
    modular = ("selected", "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsModular")
    check(nvfp4(P020, SM100, parallel={"dp_size": 2, "ep_size": 2, "use_ep": True}), *modular)
    check(nvfp4(P020, SM100, parallel={"eplb": True}), *modular)


def test_vllm_cutlass_needs_ep_size_one_in_020():
    no_fi = {"packages": NO_PKGS, "parallel": EP2_NO_DP}
    check(nvfp4(P020, SM120, **no_fi), *MARLIN)
    check(nvfp4(P015, SM120, **no_fi), *MARLIN)  # 0.15.1 CutlassExpertsFp4 already needs ep_size == 1 (§2.3)
    check(nvfp4(P020, SM120, packages=NO_PKGS), *VLLM_CUTLASS)
    d = nvfp4(P020, SM120, moe_backend="cutlass", parallel=EP2_NO_DP)
    check(d, *INVALID)
    assert "ep_size=2" in d["error"]


def test_flashinfer_nvlink_refuses_marlin_and_emulation_020():
    par = {"dp_size": 2, "ep_size": 2, "use_ep": True, "all2all_backend": "flashinfer_nvlink_two_sided"}
    check(nvfp4(P020, SM90, parallel=par), *UNSUPPORTED)
    check(nvfp4(P020, SM100, parallel=par), "selected", "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsModular")


def test_emulation_platforms_020():
    for platform in (GFX942, GFX950, XPU):
        check(nvfp4(P020, platform), *EMULATION)
        check(nvfp4(P015, platform), *UNSUPPORTED)
    for profile in PROFILES:
        check(nvfp4(profile, CPU), *UNSUPPORTED)
    check(nvfp4(P020, GFX942, env={"VLLM_BATCH_INVARIANT": "1"}), *EMULATION)
    check(nvfp4(P020, SM100, env={"VLLM_BATCH_INVARIANT": "1"}), *EMULATION)


# ------------------------------------------------------------------ explicit moe_backend (0.20)

@pytest.mark.parametrize("name,platform,want", [
    ("cutlass", SM100, VLLM_CUTLASS),
    ("flashinfer_trtllm", SM100, TRT_MONO),
    ("flashinfer_cutlass", SM100, FI_CUTLASS),
    ("flashinfer_cutedsl", SM100, CUTEDSL),
    ("marlin", SM100, MARLIN),
    ("emulation", SM90, EMULATION),
    ("flashinfer_trtllm", SM90, INVALID),
    ("cutlass", SM90, INVALID),
    ("marlin", GFX942, INVALID),
    ("MARLIN", SM100, INVALID),
    ("triton", SM100, INVALID),
    ("deep_gemm", SM100, INVALID),
    ("flashinfer_cutlass_afp8", SM100, INVALID),
])
def test_explicit_backend_020(name, platform, want):
    check(nvfp4(P020, platform, moe_backend=name), *want)


def test_explicit_backend_ignores_env_020():
    env = {"VLLM_USE_FLASHINFER_MOE_FP4": "1", "VLLM_FLASHINFER_MOE_BACKEND": "masked_gemm",
           "VLLM_TEST_FORCE_FP8_MARLIN": "1"}
    check(nvfp4(P020, SM100, moe_backend="cutlass", env=env), *VLLM_CUTLASS)


def test_explicit_cutedsl_batched_remap_020():
    check(nvfp4(P020, SM100, moe_backend="flashinfer_cutedsl", parallel=BATCHED_DEEPEP),
          "selected", "FLASHINFER_CUTEDSL_BATCHED", "FlashInferCuteDSLBatchedExperts")
    d = nvfp4(P020, SM100, moe_backend="emulation", parallel=BATCHED_DEEPEP)
    check(d, *INVALID)
    assert "batched" in d["error"]


def test_unknown_explicit_backend_message_lists_keys_020():
    d = nvfp4(P020, SM100, moe_backend="bogus")
    check(d, *INVALID)
    for key in ("cutlass", "flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_cutedsl", "marlin", "emulation"):
        assert f"'{key}'" in d["error"]


def test_map_backend_query_020():
    def q(name, parallel=None):
        s = {"policy": "nvfp4", "profile": P020, "query": "map_backend", "moe": {"moe_backend": name}}
        if parallel:
            s["moe"]["parallel"] = parallel
        return ORACLE.select(s).to_dict(with_trace=False)
    assert q("cutlass")["backend"] == "VLLM_CUTLASS"
    assert q("flashinfer_cutedsl")["backend"] == "FLASHINFER_CUTEDSL"
    assert q("flashinfer_cutedsl", BATCHED_DEEPEP)["backend"] == "FLASHINFER_CUTEDSL_BATCHED"
    assert q("triton")["outcome"] == "invalid"


def test_015_has_no_explicit_backend():
    # 0.15.1's NVFP4 selector reads no moe_backend: auto selection regardless
    check(nvfp4(P015, SM100, moe_backend="marlin"), *TRT_FN)


# ------------------------------------------------------------------ OCP MX scheme table

SCHEME_TABLE = {
    (None, "mxfp4"): "w_mxfp4", (None, "mxfp6_e3m2"): "w_mxfp6_e3m2", (None, "mxfp6_e2m3"): "w_mxfp6_e2m3",
    ("mxfp4", "mxfp4"): "w_mxfp4_a_mxfp4", ("mxfp4", "mxfp6_e3m2"): None, ("mxfp4", "mxfp6_e2m3"): None,
    ("mxfp6_e3m2", "mxfp4"): "w_mxfp4_a_mxfp6_e3m2", ("mxfp6_e3m2", "mxfp6_e3m2"): "w_mxfp6_e3m2_a_mxfp6_e3m2",
    ("mxfp6_e3m2", "mxfp6_e2m3"): None,
    ("mxfp6_e2m3", "mxfp4"): "w_mxfp4_a_mxfp6_e2m3", ("mxfp6_e2m3", "mxfp6_e3m2"): None,
    ("mxfp6_e2m3", "mxfp6_e2m3"): "w_mxfp6_e2m3_a_mxfp6_e2m3",
    ("fp8", "mxfp4"): "w_mxfp4_a_fp8", ("fp8", "mxfp6_e3m2"): "w_mxfp6_e3m2_a_fp8",
    ("fp8", "mxfp6_e2m3"): "w_mxfp6_e2m3_a_fp8",
    # pairs that name no scheme
    (None, None): None, ("mxfp4", None): None, ("fp8", None): None, ("mxfp4", "mxfp8_e4m3"): None,
    ("int8", "mxfp4"): None, ("mxfp4", "int8"): None, ("mxint8", "mxint8"): None, ("fp8", "fp8"): None,
}


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("inp,weight", list(SCHEME_TABLE))
def test_ocp_mx_scheme_query(profile, inp, weight):
    d = ORACLE.select({"policy": "ocp-mx", "profile": profile, "query": "ocp_mx_scheme",
                       "quark": {"input_dtype": inp, "weight_dtype": weight}}).to_dict(with_trace=False)
    want = SCHEME_TABLE[(inp, weight)]
    assert d["ocp_mx_scheme"] == want
    assert d["outcome"] == ("selected" if want else "none")


# ------------------------------------------------------------------ OCP MX checks

STATIC = {"is_dynamic": False}
DYNAMIC = {"is_dynamic": True}


@pytest.mark.parametrize("profile", PROFILES)
def test_ocp_mx_weight_qscheme_must_be_per_group(profile):
    d = ocp(profile, GFX950, qscheme="per_tensor")
    check(d, *INVALID)
    assert "per_tensor" in d["error"]
    check(ocp(profile, GFX950, qscheme="per_channel", inp={"dtype": "fp4", **DYNAMIC}), *INVALID)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("dtype", ["int8", "fp8_e5m2", "bf16", "mxfp4"])
def test_ocp_mx_incompatible_input_dtype(profile, dtype):
    d = ocp(profile, SM90, weight="fp6_e3m2", inp={"dtype": dtype, **DYNAMIC})
    check(d, *UNSUPPORTED)
    assert dtype in d["error"]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("weight,inp", [("fp6_e3m2", "fp4"), ("fp6_e2m3", "fp6_e3m2"), ("fp8_e4m3", "fp4"),
                                        ("int8", None), ("fp6_e3m2", "fp6_e2m3")])
def test_ocp_mx_unsupported_combination(profile, weight, inp):
    d = ocp(profile, GFX950, weight=weight, inp={"dtype": inp, **DYNAMIC} if inp else None)
    check(d, *INVALID)
    assert "combination" in d["error"]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("weight,inp,dynamic,ok", [
    ("fp4", "fp4", True, True), ("fp4", "fp4", False, False),
    ("fp4", "fp6_e3m2", False, False), ("fp4", "fp6_e2m3", False, False),
    ("fp6_e3m2", "fp6_e3m2", False, False), ("fp6_e2m3", "fp6_e2m3", True, True),
    ("fp4", "fp8_e4m3", False, True), ("fp4", "fp8_e4m3", True, False),
    ("fp6_e3m2", "fp8_e4m3", True, False), ("fp6_e2m3", "fp8_e4m3", False, True),
])
def test_ocp_mx_static_dynamic_rules(profile, weight, inp, dynamic, ok):
    d = ocp(profile, GFX942, weight=weight, inp={"dtype": inp, "is_dynamic": dynamic})
    if ok:
        assert d["outcome"] in ("selected", "none"), d
        assert d["static_input_scales"] is (not dynamic)
    else:
        check(d, *UNSUPPORTED)
        assert ("static" if not dynamic else "dynamic") in d["error"]


def test_ocp_mx_weight_only_has_no_static_scales():
    for profile in PROFILES:
        d = ocp(profile, XPU, weight="fp6_e2m3")
        assert d["static_input_scales"] is False and d["ocp_mx_scheme"] == "w_mxfp6_e2m3"


# ------------------------------------------------------------------ OCP MX emulate and backend, 0.20

OCP_EMU = ("selected", "EMULATION", "OCP_MXQuantizationEmulationTritonExperts")


@pytest.mark.parametrize("platform", [SM80, SM90, SM100, GFX942, XPU, CPU])
@pytest.mark.parametrize("weight,inp", [("fp4", None), ("fp4", {"dtype": "fp4", **DYNAMIC}),
                                        ("fp4", {"dtype": "fp8_e4m3", **STATIC}), ("fp6_e3m2", None),
                                        ("fp6_e2m3", {"dtype": "fp8_e4m3", **STATIC})])
def test_ocp_mx_020_emulates_without_native_mx(platform, weight, inp):
    d = ocp(P020, platform, weight=weight, inp=inp)
    check(d, *OCP_EMU)
    assert d["emulate"] is True


def test_ocp_mx_020_gfx950():
    d = ocp(P020, GFX950)
    check(d, "selected", "TRITON", "OAITritonMxfp4ExpertsMonolithic")
    assert (d["ocp_mx_scheme"], d["emulate"], d["static_input_scales"]) == ("w_mxfp4", False, False)
    d = ocp(P020, GFX950, env={"VLLM_ROCM_USE_AITER": "1"})
    check(d, "selected", "AITER", "AiterExperts")
    d = ocp(P020, GFX950, inp={"dtype": "fp6_e3m2", **DYNAMIC})
    check(d, "none", "None", None)
    assert (d["ocp_mx_scheme"], d["emulate"]) == ("w_mxfp4_a_mxfp6_e3m2", False)
    d = ocp(P020, GFX950, weight="fp6_e2m3", inp={"dtype": "fp6_e2m3", **DYNAMIC})
    check(d, *OCP_EMU)
    assert d["emulate"] is True


def test_ocp_mx_020_gpt_oss_refusal_is_final():
    # w_mxfp4 runs the gpt-oss selector first; its LoRA-not-on-ROCm refusal stands even though
    # the layer would be emulated afterwards
    check(ocp(P020, GFX942, lora=True), *UNSUPPORTED)
    check(ocp(P020, SM90, lora=True), *OCP_EMU)


# ------------------------------------------------------------------ OCP MX, 0.15 (seed order)

def test_ocp_mx_015_selects_first_with_generic_selector():
    d = ocp(P015, SM90)
    check(d, "selected", "MARLIN", "MarlinExperts")
    assert d["emulate"] is True
    # the generic selector has no ROCm/XPU/CPU candidate: w_mxfp4 is refused there
    for platform in (GFX950, GFX942, XPU, CPU):
        check(ocp(P015, platform), *UNSUPPORTED)


@pytest.mark.parametrize("platform,env,emulate", [
    (SM90, {}, True), (CPU, {}, True), (GFX942, {}, True),
    (GFX942, {"VLLM_ROCM_USE_AITER": "1"}, True),
    (GFX950, {}, False), (GFX950, {"VLLM_ROCM_USE_AITER": "1"}, False),
])
def test_ocp_mx_015_other_schemes_keep_backend_none(platform, env, emulate):
    d = ocp(P015, platform, inp={"dtype": "fp4", **DYNAMIC}, env=env)
    check(d, "none", "None", None)
    assert (d["ocp_mx_scheme"], d["emulate"]) == ("w_mxfp4_a_mxfp4", emulate)
    d = ocp(P015, platform, weight="fp6_e3m2", env=env)
    check(d, "none", "None", None)
    assert d["emulate"] is True


# ------------------------------------------------------------------ no profile branches in Python

_VERSIONISH = re.compile(r"vllm-|(?<![\d.])0\.(1\d|2\d?|3\d?)(?![\d])")


def _branch_strings(tree: ast.AST):
    """String constants that take part in a decision: conditions, comparisons, dict keys, subscripts, match cases."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert)):
            roots.append(node.test)
        elif isinstance(node, ast.comprehension):
            roots.extend(node.ifs)
        elif isinstance(node, ast.Compare):
            roots.append(node)
        elif isinstance(node, ast.Dict):
            roots.extend(k for k in node.keys if k is not None)
        elif isinstance(node, ast.Subscript):
            roots.append(node.slice)
        elif isinstance(node, ast.match_case):
            roots.append(node.pattern)
    for root in roots:
        for sub in ast.walk(root):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                yield sub


def test_no_profile_or_version_branches_in_engine():
    names = set(ORACLE.profiles())
    assert names, "no profiles found"
    offenders = []
    for path in sorted((ROOT / "oracle").glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for const in _branch_strings(tree):
            if _VERSIONISH.search(const.value) or any(n in const.value for n in names):
                offenders.append(f"{path.name}:{const.lineno}: {const.value!r}")
    assert not offenders, "engine code branches on a profile/version:\n" + "\n".join(offenders)


def _rule_names() -> set[str]:
    """Every policy, backend (name and enum value) and policy-declared query of every shipped profile."""
    names: set[str] = set()
    for profile in ORACLE.profiles():
        table = ORACLE.table(profile)
        names |= set(table.policies)
        names |= {q for p in table.policies.values() for q in p.queries}
        for family in table.families.values():
            names |= set(family.backends) | set(family.by_value)
    return names - {"None"}  # the NONE backend's enum value is also Python's spelling of null


def _string_constants(tree: ast.AST):
    """String constants outside docstrings (f-string parts included)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node


def test_engine_python_names_no_policy_backend_or_query():
    """oracle/*.py reads policy, backend and query names from the compiled tables, never spells them.
    (vocabulary.py is the format vocabulary: its codec 'mxfp4' is a format that a policy is named after.)"""
    names = _rule_names()
    assert {"mxfp4-gpt-oss", "nvfp4", "FLASHINFER_TRTLLM", "EMULATION", "ocp_mx_scheme"} <= names
    pattern = re.compile(r"(?<![\w-])(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")(?![\w-])")
    offenders = []
    for path in sorted((ROOT / "oracle").glob("*.py")):
        if path.name == "vocabulary.py":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for const in _string_constants(tree):
            found = pattern.search(const.value)
            if found:
                offenders.append(f"{path.name}:{const.lineno}: {found.group(0)!r} in {const.value!r}")
    assert not offenders, "engine Python names rule entities:\n" + "\n".join(offenders)
