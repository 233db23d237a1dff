"""vLLM's real selection code on a machine without a GPU, one golden question at a time.

Shared by tests/test_vllm_plugin.py (vLLM 0.20.0), tests/test_vllm_plugin_033.py (vLLM 0.33.0)
and the recorded runs (docs/vllm-plugin-run.log, docs/vllm-plugin-run-0.33.log). Needs that vLLM
for everything below `answer_of`; importing this module never imports vLLM.
"""
from __future__ import annotations

import enum
import importlib
import json
import os
import sys
import types
from pathlib import Path

import pytest

from oracle.integrations import vllm as plugin

ROOT = Path(__file__).resolve().parents[1]
RELEASE = plugin.RELEASES["0.20"]
BY_POLICY = {sel.policy: sel for sel in RELEASE.selectors}
# The executed golden sample of each release series.
SAMPLES = {"0.20": "golden-sample.jsonl", "0.33": "golden-sample-vllm-0.33.jsonl"}
# The scenario spec's documented defaults (shared/spec/scenario.md): a golden question leaves them out.
MOE_DEFAULTS = {"activation": "swigluoai", "is_act_and_mul": True, "moe_backend": "auto", "lora": False,
                "routing_method": "Renormalize", "hidden_size": 2880, "intermediate_size": 2880, "num_experts": 32,
                "top_k": 4, "has_bias": False, "weight_key": "kNvfp4Static", "activation_key": "kNvfp4Dynamic"}
PARALLEL_DEFAULTS = {"dp_size": 1, "ep_size": 1, "use_ep": False, "all2all_backend": "allgather_reducescatter",
                     "eplb": False}


def by_policy(release=RELEASE) -> dict:
    return {sel.policy: sel for sel in release.selectors}


def golden_questions(release=RELEASE) -> list[dict]:
    """Every MXFP4 / NVFP4 selection question of the release's golden sample, for its profile."""
    rows = [json.loads(line) for line in (ROOT / "tests/data" / SAMPLES[release.series]).read_text().splitlines()
            if line]
    return [r for r in rows if r["scenario"].get("profile") == release.profile
            and r["scenario"]["policy"] in by_policy(release) and r["scenario"].get("query", "select") == "select"]


# vLLM 0.33's extra layer facts (the spec's defaults for profile vllm-0.33).
MOE_DEFAULTS_033 = {"swiglu_limit": None, "user_activation_key": None}


def full_moe(scenario: dict) -> dict:
    extra = MOE_DEFAULTS_033 if scenario.get("profile") == "vllm-0.33" else {}
    moe = {**MOE_DEFAULTS, **extra, **scenario.get("moe", {})}
    moe["parallel"] = {**PARALLEL_DEFAULTS, **moe.get("parallel", {})}
    return moe


def fake_config(moe: dict) -> types.SimpleNamespace:
    """A FusedMoEConfig look-alike with vLLM's field names (enum members where vLLM has them)."""
    p = moe["parallel"]
    act = enum.Enum("MoEActivation", {"X": moe["activation"]})
    routing = enum.IntEnum("RoutingMethodType", {moe["routing_method"]: 1})
    parallel = types.SimpleNamespace(dp_size=p["dp_size"], ep_size=p["ep_size"], use_ep=p["use_ep"],
                                     all2all_backend=p["all2all_backend"], enable_eplb=p["eplb"])
    return types.SimpleNamespace(activation=act.X, routing_method=routing[moe["routing_method"]],
                                 is_act_and_mul=moe["is_act_and_mul"], moe_backend=moe["moe_backend"],
                                 is_lora_enabled=moe["lora"], hidden_dim=moe["hidden_size"],
                                 intermediate_size_per_partition=moe["intermediate_size"],
                                 num_experts=moe["num_experts"], experts_per_token=moe["top_k"],
                                 has_bias=moe["has_bias"], moe_parallel_config=parallel,
                                 **({"swiglu_limit": moe["swiglu_limit"]} if "swiglu_limit" in moe else {}))


class FakePlatform:
    """A vLLM platform look-alike: kind, capability and (CPU) AMX, for the CI tests without vLLM."""

    def __init__(self, kind: str, capability=None):
        self.kind, self.capability = kind, capability

    def is_cuda(self):
        return self.kind == "cuda"

    def is_rocm(self):
        return self.kind == "rocm"

    def is_xpu(self):
        return self.kind == "xpu"

    def is_cpu(self):
        return self.kind == "cpu"

    def get_device_capability(self):
        return self.capability


def fake_platform(plat: dict) -> FakePlatform:
    return FakePlatform(plat["kind"], tuple(plat["capability"]) if "capability" in plat else None)


def answer_of(decision) -> tuple:
    """A decision as vLLM would report it: (outcome or exception type, backend value, kernel)."""
    if decision.outcome in ("invalid", "unsupported"):
        return ({"invalid": "ValueError", "unsupported": "NotImplementedError"}[decision.outcome], None, None)
    if decision.outcome == "none":
        return ("none", decision.backend or "None", None)
    return (decision.outcome, decision.backend, decision.kernel)


PROBES = {"flashinfer": ("has_flashinfer", "has_flashinfer_moe", "has_flashinfer_cutedsl",
                         "has_flashinfer_trtllm_fused_moe", "has_flashinfer_cutlass_fused_moe",
                         "has_flashinfer_cutedsl_grouped_gemm_nt_masked", "has_flashinfer_cutedsl_moe_nvfp4"),
          "triton_kernels": ("has_triton_kernels",), "deep_gemm": ("has_deep_gemm",), "aiter": ("has_aiter",)}
PROBE_HOME = {"flashinfer": "vllm.utils.flashinfer", "triton_kernels": "vllm.utils.import_utils",
              "deep_gemm": "vllm.utils.import_utils", "aiter": "vllm.utils.import_utils",
              "humming": "vllm.utils.import_utils", "quark": "vllm.utils.import_utils", "b12x": "vllm.utils.b12x"}
# vLLM 0.33 probes more: every has_flashinfer* function answers the flashinfer package (the feature probes also the
# question's flashinfer: facts, FEATURES), and the new packages (humming, amd-quark, b12x; b12x's experts also ask
# get_b12x_fused_moe() for a loadable module).
PROBES_033 = {**PROBES, "humming": ("has_humming",), "quark": ("has_quark",), "b12x": ("has_b12x",)}
# FlashInfer features the scenario carries as `flashinfer:` facts (vLLM's has_flashinfer_<feature> probes)
FEATURES = ("trtllm_fused_moe", "cutlass_fused_moe", "cutedsl_grouped_gemm_nt_masked", "cutedsl_moe_nvfp4",
            "b12x_moe", "situ_activation")
# Native extensions whose import needs a GPU driver; selection never calls into them.
NATIVE_WITHOUT_DRIVER = ("vllm._C", "vllm._C_stable_libtorch", "vllm_xpu_kernels", "vllm_xpu_kernels._C",
                         "vllm_xpu_kernels._moe_C", "vllm_xpu_kernels._xpu_C")


def rebind_in_vllm(old, new) -> None:
    for name, module in list(sys.modules.items()):
        if module is not None and name.startswith("vllm"):
            for attr, value in list(vars(module).items()):
                if value is old:
                    setattr(module, attr, new)


def assert_patched_then_restored(release, originals: dict, uninstall) -> None:
    """Every selector of `release` is the plugin's wrapper wherever vLLM holds it, and `uninstall()` puts
    vLLM's own function back in each of those places."""
    for sel in release.selectors:
        for where in (sel.module, *sel.callers):
            assert getattr(sys.modules[where], sel.name)._moe_oracle_selector is sel, f"{where}.{sel.name}"
    uninstall()
    for sel in release.selectors:
        for where in (sel.module, *sel.callers):
            assert getattr(sys.modules[where], sel.name) is originals[sel.name], f"{where}.{sel.name}"


def patched_in_a_fresh_process(tmp_path, release, rules: str, functions: tuple[str, ...]):
    """A fresh Python with MOE_ORACLE_RULES=`rules`: vLLM's plugins load first and the selectors' modules come
    later (as in a real server). Returns ([[function name, policy], ...] as the patched `functions` of vLLM's
    quantization modules `modelopt` / `mxfp4` report them, the process's stdout + stderr); fails if the plugin
    imported the selectors itself or the process failed."""
    import os
    import subprocess

    from oracle.integrations import vllm as plugin

    script = tmp_path / "fresh.py"
    script.write_text(
        "import sys, vllm.plugins\n"
        "vllm.plugins.load_general_plugins()\n"
        f"assert {release.selectors[0].module!r} not in sys.modules, 'the plugin imported the selectors'\n"
        "from vllm.model_executor.layers.quantization import modelopt, mxfp4\n"
        f"for fn in ({', '.join(functions)},):\n"
        "    print('PATCHED', fn.__name__, fn._moe_oracle_selector.policy)\n")
    env = {**os.environ, plugin.RULES_ENV: rules, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300,
                         check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    patched = [line.split()[1:] for line in run.stdout.splitlines() if line.startswith("PATCHED ")]
    return patched, run.stdout + run.stderr


class SimulatedMachine:
    """vLLM's real Python on a machine without a GPU; platform, package probes and env set per question.

    The platform is vLLM's one `current_platform` object, whose class becomes a subclass of
    vLLM's CUDA / ROCm / XPU / CPU platform overriding only `get_device_capability` (ROCm's
    arch string comes from a stand-in amdsmi, as vLLM reads it). Probes answer from the question.
    """

    def __init__(self, mp: pytest.MonkeyPatch, release=RELEASE):
        self.mp, self.packages, self.arch, self._restore, self.release = mp, {}, None, [], release
        self.features: dict = {}
        self.by_policy = by_policy(release)
        import vllm.platforms

        self.platform = vllm.platforms.current_platform  # resolved on the real machine, before any stand-in
        mp.setattr(self.platform, "__class__", type(self.platform))  # restored at teardown
        for name in NATIVE_WITHOUT_DRIVER:
            try:
                importlib.import_module(name)
            except ImportError:
                mp.setitem(sys.modules, name, types.ModuleType(name))
        amdsmi = types.ModuleType("amdsmi")
        amdsmi.AmdSmiException = RuntimeError
        amdsmi.AmdSmiMemoryType = types.SimpleNamespace(VRAM="VRAM")  # vLLM 0.33 imports it
        amdsmi.amdsmi_init = amdsmi.amdsmi_shut_down = lambda *a: None
        amdsmi.amdsmi_get_processor_handles = lambda: ["gpu0"]
        amdsmi.amdsmi_get_gpu_asic_info = lambda handle: {"target_graphics_version": self.arch}
        for fn in ("amdsmi_get_gpu_device_uuid", "amdsmi_topo_get_link_type", "amdsmi_topo_get_numa_node_number",
                   "amdsmi_get_gpu_memory_total"):
            setattr(amdsmi, fn, lambda *a: pytest.fail("selection asked amdsmi for more than the arch"))
        mp.setitem(sys.modules, "amdsmi", amdsmi)
        for sel in release.selectors:  # import every experts class before simulating (XPU's imports kernels)
            mod = importlib.import_module(sel.module)
            for member in getattr(mod, sel.enum):
                if member.value != "None":
                    mod.backend_to_kernel_cls(member)
            for caller in sel.callers:
                importlib.import_module(caller)
        import vllm._aiter_ops

        self.aiter_ops = vllm._aiter_ops
        probes = PROBES if release.series == "0.20" else self._probes_033()
        for package, names in probes.items():
            home = importlib.import_module(PROBE_HOME[package])
            for name in names:
                feature = name.removeprefix("has_flashinfer_")
                probe = self._feature(feature) if package == "flashinfer" and feature in FEATURES else \
                    self._probe(package)
                self._switch(getattr(home, name), probe)
        if release.cpu_amx:
            import torch

            mp.setattr(torch.cpu, "_is_amx_tile_supported", lambda: self.amx)
        self.amx = False
        self.originals = {sel.name: getattr(importlib.import_module(sel.module), sel.name) for sel in release.selectors}

    def _switch(self, original, switch) -> None:
        rebind_in_vllm(original, switch)
        self._restore.append((switch, original))

    def _probes_033(self) -> dict:
        from vllm.utils import b12x, flashinfer

        probes = {**PROBES_033, "flashinfer": tuple(n for n in vars(flashinfer) if n.startswith("has_flashinfer"))}
        # The compiled capability query of vLLM's CUDA build (torch.ops._C, absent without a GPU driver): the
        # 0.33.0 wheel's MXFP4 experts quantization kernels answer for the SM 10.x and 11.x families (as executed
        # in the golden sample; the CutlassExpertsMxfp4 row of rules/vllm-0.33/kernels.yaml).
        from vllm import _custom_ops

        self.mp.setattr(_custom_ops, "mxfp4_experts_quant_supported", lambda cap: 100 <= cap < 120)
        # FlashInfer's Situ activation type (TRT-LLM kernels) answers like the other FlashInfer feature probes
        from vllm.model_executor.layers.quantization.utils import flashinfer_utils

        self._switch(flashinfer_utils.has_flashinfer_situ_activation, self._feature("situ_activation"))
        fused_moe = types.SimpleNamespace(is_supported=lambda: True)
        self._switch(b12x.get_b12x_fused_moe, lambda: fused_moe if self.packages.get("b12x", False) else None)
        return probes

    def _probe(self, package: str):
        return lambda *args, **kwargs: self.packages.get(package, False)

    def _feature(self, feature: str):
        """A FlashInfer feature probe: False without flashinfer, else the question's `flashinfer:` value (unset:
        what the FlashInfer the release pins answers, as the profile's fact_defaults say: present)."""
        return lambda *args, **kwargs: bool(self.packages.get("flashinfer", False)
                                            and self.features.get(feature, True))

    def restore(self) -> None:
        for switch, original in self._restore:
            rebind_in_vllm(switch, original)

    def platform_class(self, plat: dict) -> type:
        from vllm.platforms.interface import DeviceCapability

        kind, cap = plat["kind"], None
        if kind == "cuda":
            from vllm.platforms.cuda import CudaPlatform as base
            cap = DeviceCapability(*plat["capability"])
        elif kind == "rocm":
            if self.arch != plat["gcn_arch"]:  # vLLM reads the arch once, at import: import it again
                self.arch = plat["gcn_arch"]
                loaded = sys.modules.get("vllm.platforms.rocm")
                rocm = importlib.reload(loaded) if loaded else importlib.import_module("vllm.platforms.rocm")
            rocm = sys.modules["vllm.platforms.rocm"]
            base, cap = rocm.RocmPlatform, DeviceCapability(*rocm._capability_from_gcn_arch(self.arch))
        elif kind == "xpu":
            from vllm.platforms.xpu import XPUPlatform as base
        else:
            from vllm.platforms.cpu import CpuPlatform as base
        return type(f"Simulated{base.__name__}", (base,),
                    {"get_device_capability": classmethod(lambda cls, device_id=0: cap)})

    def ask(self, scenario: dict):
        """Set platform, probes and env for one question; return (config, selector keyword arguments)."""

        from vllm.model_executor.layers.quantization.utils import quant_utils
        from vllm.utils.deep_gemm import is_deep_gemm_supported

        self.platform.__class__ = self.platform_class(scenario["platform"])
        self.amx = bool(scenario["platform"].get("amx", False))
        self.packages = dict(scenario.get("packages", {}))
        self.features = dict(scenario.get("flashinfer", {}))
        self.aiter_ops.IS_AITER_FOUND = self.packages.get("aiter", False)
        for name in [n for n in os.environ if n.startswith("VLLM_")]:
            self.mp.delenv(name)
        for name, value in scenario.get("env", {}).items():
            self.mp.setenv(name, value)
        is_deep_gemm_supported.cache_clear()
        self.aiter_ops.rocm_aiter_ops.refresh_env_variables()
        moe = full_moe(scenario)
        sel = self.by_policy[scenario["policy"]]
        try:
            kwargs = {"config": vllm_config(moe, self.release)}
        except NotImplementedError as exc:  # 0.33: vLLM refuses the layer (non-gated on CPU) before any selector
            return {BEFORE_SELECTION: exc}
        for key in sel.key_args:
            kwargs[key] = getattr(quant_utils, moe[key]) if moe[key] else None
        if sel.user_key:
            self._set_user_activation_key(moe.get("user_activation_key"))
        return kwargs

    def _set_user_activation_key(self, name: str | None) -> None:
        """The user's quantization_config.moe.activation, as the current vLLM config vLLM 0.33 reads it from."""
        import vllm.config.vllm as current
        from vllm.config.quantization import QuantizationConfigArgs, QuantSpec
        from vllm.model_executor.layers.quantization.utils import quant_utils

        args = QuantizationConfigArgs(moe=QuantSpec(activation=getattr(quant_utils, name))) if name else None
        model_config = types.SimpleNamespace(quantization_config=args)
        self.mp.setattr(current, "_current_vllm_config", types.SimpleNamespace(model_config=model_config))


def vllm_config(moe: dict, release=RELEASE):
    import torch
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig,
        FusedMoEParallelConfig,
        RoutingMethodType,
    )

    p = moe["parallel"]
    parallel = FusedMoEParallelConfig(tp_size=1, pcp_size=1, dp_size=p["dp_size"], ep_size=p["ep_size"], tp_rank=0,
                                      pcp_rank=0, dp_rank=0, ep_rank=0, sp_size=1, use_ep=p["use_ep"],
                                      all2all_backend=p["all2all_backend"], enable_eplb=p["eplb"])
    # 0.33: the full size (vLLM divides by TP), the SwiGLU clamp; gatedness is the activation's own (a property)
    sizes = ({"intermediate_size_per_partition": moe["intermediate_size"], "is_act_and_mul": moe["is_act_and_mul"]}
             if release.series == "0.20" else
             {"intermediate_size": moe["intermediate_size"], "swiglu_limit": moe.get("swiglu_limit")})
    return FusedMoEConfig(
        num_experts=moe["num_experts"], experts_per_token=moe["top_k"], hidden_dim=moe["hidden_size"],
        **sizes, num_local_experts=moe["num_experts"],
        num_logical_experts=moe["num_experts"], activation=MoEActivation(moe["activation"]), device="cuda",
        routing_method=RoutingMethodType[moe["routing_method"]], moe_parallel_config=parallel,
        in_dtype=torch.bfloat16, moe_backend=moe["moe_backend"], has_bias=moe["has_bias"],
        is_lora_enabled=moe["lora"])


BEFORE_SELECTION = "refused before selection"


def vllm_answer(fn, kwargs) -> tuple[tuple, str | None]:
    """What a vLLM selector did: ((outcome or exception type, backend value, kernel), message); a layer
    vLLM refused while building its FusedMoEConfig answers that refusal without calling `fn`."""
    if BEFORE_SELECTION in kwargs:
        exc = kwargs[BEFORE_SELECTION]
        return (type(exc).__name__, None, None), str(exc)
    try:
        backend, kernel = fn(**kwargs)
    except (ValueError, NotImplementedError) as exc:
        return (type(exc).__name__, None, None), str(exc)
    if kernel is None:
        return ("none", backend.value, None), None
    return ("selected", backend.value, kernel.__name__), None


# Vocabulary of random deployments beyond the golden sample (seeded; every value is one vLLM 0.20 accepts).
# Gated "relu2" is left out: the rules' activation vocabulary lacks it, so the plugin refuses it by name.
RANDOM_PLATFORMS = ([{"kind": "cuda", "capability": list(c)} for c in
                     ((7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1))]
                    + [{"kind": "rocm", "gcn_arch": a} for a in ("gfx90a", "gfx942", "gfx950")]
                    + [{"kind": "xpu"}, {"kind": "cpu"}])
RANDOM_ENV = {"VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": ("0", "1"), "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": ("0", "1"),
              "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS": ("0", "1"), "VLLM_MXFP4_USE_MARLIN": ("0", "1"),
              "VLLM_USE_DEEP_GEMM": ("0", "1"), "VLLM_BATCH_INVARIANT": ("0", "1"), "VLLM_ROCM_USE_AITER": ("0", "1"),
              "VLLM_ROCM_USE_AITER_MOE": ("0", "1"), "VLLM_USE_FLASHINFER_MOE_FP4": ("0", "1"),
              "VLLM_FLASHINFER_MOE_BACKEND": ("throughput", "latency", "masked_gemm"),
              "VLLM_TEST_FORCE_FP8_MARLIN": ("0", "1")}
RANDOM_ACTIVATIONS = ("silu", "gelu", "swigluoai", "swiglustep", "silu_no_mul", "gelu_no_mul", "relu2_no_mul")
RANDOM_BACKENDS = {"mxfp4": ("deep_gemm", "flashinfer_trtllm", "flashinfer_trtllm_afp8", "flashinfer_cutlass",
                             "flashinfer_cutlass_afp8", "triton", "triton_unfused", "marlin", "aiter", "xpu",
                             "emulation", "cutlass", "bogus"),
                   "nvfp4": ("cutlass", "flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_cutedsl", "marlin",
                             "emulation", "triton")}
RANDOM_PARALLEL = ({}, {"dp_size": 2, "ep_size": 1}, {"eplb": True}) + tuple(
    {"dp_size": 2, "ep_size": 2, "use_ep": True, "all2all_backend": b}
    for b in ("allgather_reducescatter", "deepep_low_latency", "deepep_high_throughput", "flashinfer_all2allv",
              "nixl_ep"))


def random_question(rng) -> dict:
    """One random deployment: policy, platform, packages, env and MoE layer, in scenario form."""
    policy = rng.choice(sorted(BY_POLICY))
    activation = rng.choice(RANDOM_ACTIVATIONS)
    backends = RANDOM_BACKENDS["nvfp4" if policy == "nvfp4" else "mxfp4"]
    moe = {"activation": activation, "is_act_and_mul": not activation.endswith("_no_mul"),
           "moe_backend": rng.choice(("auto",) * len(backends) + backends), "lora": rng.random() < 0.15,
           "routing_method": rng.choice(("Renormalize", "RenormalizeNaive", "DeepSeekV3", "Llama4", "Simulated",
                                         "TopK")),
           "hidden_size": rng.choice((2880, 4096, 7168)), "intermediate_size": rng.choice((2880, 1536, 2048)),
           "has_bias": rng.random() < 0.3, "parallel": dict(rng.choice(RANDOM_PARALLEL))}
    if policy == "nvfp4":
        moe["activation_key"] = rng.choice(("kNvfp4Dynamic", "kNvfp4Dynamic", "kNvfp4Dynamic", None))
    return {"profile": "vllm-0.20", "policy": policy, "platform": rng.choice(RANDOM_PLATFORMS),
            "packages": {p: rng.random() < 0.7 for p in ("flashinfer", "triton_kernels", "deep_gemm", "aiter")},
            "env": {k: rng.choice(v) for k, v in RANDOM_ENV.items() if rng.random() < 0.15}, "moe": moe}


# Vocabulary of random vLLM 0.33 deployments (seeded; what 0.33 accepts, its new backends, keys and packages).
RANDOM_PLATFORMS_033 = ([{"kind": "cuda", "capability": list(c)} for c in
                         ((7, 0), (7, 5), (8, 0), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1))]
                        + [{"kind": "rocm", "gcn_arch": a} for a in ("gfx90a", "gfx942", "gfx950", "gfx1250")]
                        + [{"kind": "xpu"}, {"kind": "cpu", "amx": True}, {"kind": "cpu", "amx": False}])
RANDOM_ENV_033 = {"VLLM_ROCM_USE_AITER": ("0", "1"), "VLLM_ROCM_USE_AITER_MOE": ("0", "1"),
                  "VLLM_BATCH_INVARIANT": ("0", "1"), "VLLM_USE_DEEP_GEMM": ("0", "1"),
                  "VLLM_B12X_MOE_FP4_FORCE_A16": ("0", "1"), "VLLM_HUMMING_MOE_GEMM_TYPE": ("grouped", "indexed")}
RANDOM_BACKENDS_033 = {
    "mxfp4": ("deep_gemm", "flashinfer_trtllm", "flashinfer_trtllm_afp8", "flashinfer_cutlass", "flashinfer_cutlass_afp8",
              "triton", "triton_unfused", "marlin", "aiter", "xpu", "emulation", "humming", "b12x", "cpu",
              "aiter_mxfp4_fp8", "flashinfer_moe_ep_cutedsl"),
    "nvfp4": ("cutlass", "flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_cutedsl", "marlin", "emulation",
              "humming", "b12x", "flashinfer_b12x")}
RANDOM_KEYS_033 = (None, None, "kMxfp8Dynamic", "kMxfp4Dynamic", "kFp8StaticTensorSym", "kFp8Dynamic128Sym")


def random_question_033(rng) -> dict:
    """One random vLLM 0.33 deployment: policy, platform (AMX), packages, env and MoE layer, in scenario form."""
    policy = rng.choice(sorted(by_policy(plugin.RELEASES["0.33"])))
    backends = RANDOM_BACKENDS_033["nvfp4" if policy == "nvfp4" else "mxfp4"]
    moe = {"activation": rng.choice(("silu", "gelu", "swigluoai", "silu_no_mul", "relu2_no_mul", "situ")),
           "moe_backend": rng.choice(("auto",) * len(backends) + backends), "lora": rng.random() < 0.15,
           "routing_method": rng.choice(("Renormalize", "DeepSeekV3", "Llama4", "DeepseekV4")),
           "hidden_size": rng.choice((2880, 4096, 7168)), "intermediate_size": rng.choice((2880, 1536, 2048)),
           "has_bias": rng.random() < 0.3,
           "parallel": dict(rng.choice(({}, {"eplb": True}, {"dp_size": 2, "ep_size": 2, "use_ep": True,
                                                              "all2all_backend": "deepep_low_latency"})))}
    if policy == "mxfp4":
        moe["activation_key"] = rng.choice(RANDOM_KEYS_033)
        moe["user_activation_key"] = rng.choice((None,) * 4 + RANDOM_KEYS_033[2:])
    if policy == "nvfp4":
        moe["swiglu_limit"] = rng.choice((None, None, 7.0))
        moe["activation_key"] = rng.choice(("kNvfp4Dynamic", "kNvfp4Dynamic", None))
    return {"profile": "vllm-0.33", "policy": policy, "platform": rng.choice(RANDOM_PLATFORMS_033),
            "packages": {p: rng.random() < 0.7
                         for p in ("flashinfer", "triton_kernels", "deep_gemm", "aiter", "humming", "b12x", "quark")},
            "env": {k: rng.choice(v) for k, v in RANDOM_ENV_033.items() if rng.random() < 0.15}, "moe": moe,
            **({"flashinfer": {f: rng.random() < 0.5 for f in FEATURES}} if rng.random() < 0.3 else {})}
