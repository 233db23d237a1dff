"""The vLLM plugin (oracle.integrations.vllm).

Part 1 runs everywhere: the translation between vLLM's objects and scenarios, with fakes.
Part 2 runs only where vllm==0.20.0 is installed: vLLM's real selector functions, on a
simulated platform, answer through the plugin exactly as unpatched vLLM does (shipped rules),
and follow an edited rule file exactly where the oracle's answer changes.
"""
from __future__ import annotations

import enum
import importlib
import importlib.metadata
import json
import logging
import shutil
import sys
import types
from pathlib import Path

import pytest

import oracle
from oracle.integrations import vllm as plugin
from oracle.integrations.vllm_scenario import (
    ScenarioMismatch,
    build_scenario,
    platform_of,
    to_vllm_answer,
)

ROOT = Path(__file__).resolve().parents[1]
RELEASE = plugin.RELEASES["0.20"]
BY_POLICY = {sel.policy: sel for sel in RELEASE.selectors}
# The scenario spec's documented defaults (shared/spec/scenario.md): a golden question leaves them out.
MOE_DEFAULTS = {"activation": "swigluoai", "is_act_and_mul": True, "moe_backend": "auto", "lora": False,
                "routing_method": "Renormalize", "hidden_size": 2880, "intermediate_size": 2880, "num_experts": 32,
                "top_k": 4, "has_bias": False, "weight_key": "kNvfp4Static", "activation_key": "kNvfp4Dynamic"}
PARALLEL_DEFAULTS = {"dp_size": 1, "ep_size": 1, "use_ep": False, "all2all_backend": "allgather_reducescatter",
                     "eplb": False}


def golden_questions() -> list[dict]:
    """Every vllm-0.20 MXFP4 / NVFP4 selection question of the golden sample."""
    rows = [json.loads(line) for line in (ROOT / "tests/data/golden-sample.jsonl").read_text().splitlines() if line]
    return [r for r in rows if r["scenario"].get("profile") == "vllm-0.20" and r["scenario"]["policy"] in BY_POLICY
            and r["scenario"].get("query", "select") == "select"]


def full_moe(scenario: dict) -> dict:
    moe = {**MOE_DEFAULTS, **scenario.get("moe", {})}
    moe["parallel"] = {**PARALLEL_DEFAULTS, **moe.get("parallel", {})}
    return moe


def answer_of(decision) -> tuple:
    """A decision as vLLM would report it: (outcome or exception type, backend value, kernel)."""
    if decision.outcome in ("invalid", "unsupported"):
        return ({"invalid": "ValueError", "unsupported": "NotImplementedError"}[decision.outcome], None, None)
    if decision.outcome == "none":
        return ("none", decision.backend or "None", None)
    return (decision.outcome, decision.backend, decision.kernel)


# ============================================================== part 1: translation, with fakes
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
                                 has_bias=moe["has_bias"], moe_parallel_config=parallel)


class FakePlatform:
    def __init__(self, kind: str, capability=None):
        self.kind, self.capability = kind, capability

    def is_cuda(self):
        return self.kind == "cuda"

    def is_rocm(self):
        return self.kind == "rocm"

    def is_xpu(self):
        return self.kind == "xpu"

    def get_device_capability(self):
        return self.capability


def fake_platform(plat: dict) -> FakePlatform:
    return FakePlatform(plat["kind"], tuple(plat["capability"]) if "capability" in plat else None)


def test_scenarios_built_from_vllm_objects_get_the_golden_questions_answers(oracle):
    """Round trip golden question -> vLLM-shaped objects -> plugin scenario: same decision, every question."""
    questions = golden_questions()
    assert len(questions) > 250
    for q in questions:
        sc, moe = q["scenario"], full_moe(q["scenario"])
        arch = sc["platform"].get("gcn_arch", "") + ":sramecc+:xnack-"
        built = build_scenario(policy=sc["policy"], profile="vllm-0.20",
                               platform=platform_of(fake_platform(sc["platform"]), lambda a=arch: a),
                               packages=sc.get("packages", {}), env=sc.get("env", {}), config=fake_config(moe),
                               quant_keys={k: moe[k] for k in BY_POLICY[sc["policy"]].key_args})
        assert answer_of(oracle.select(built)) == answer_of(oracle.select(sc)), sc


def test_platform_kinds_and_a_cuda_platform_without_capability():
    assert platform_of(FakePlatform("rocm"), lambda: "gfx942:sramecc+:xnack-") == {"kind": "rocm", "gcn_arch": "gfx942"}
    assert platform_of(FakePlatform("tpu"), lambda: "unused") == {"kind": "cpu"}
    with pytest.raises(ScenarioMismatch, match="no device capability"):
        platform_of(FakePlatform("cuda"), lambda: "unused")


class FakeBackend(enum.Enum):
    NONE = "None"
    TRITON = "TRITON"


class KernelA:
    pass


class KernelB:
    pass


def test_decisions_become_vllm_return_values_or_vllm_exceptions():
    def decision(outcome, backend=None, kernel=None, error=None):
        return types.SimpleNamespace(outcome=outcome, backend=backend, kernel=kernel, error=error)

    def classes(member):
        return [KernelA, KernelB]
    assert to_vllm_answer(decision("selected", "TRITON", "KernelB"), FakeBackend, classes) == (FakeBackend.TRITON, KernelB)
    assert to_vllm_answer(decision("selected", "TRITON", None), FakeBackend, classes) == (FakeBackend.TRITON, KernelA)
    assert to_vllm_answer(decision("none"), FakeBackend, classes) == (FakeBackend.NONE, None)
    for outcome, exc in (("invalid", ValueError), ("unsupported", NotImplementedError)):
        with pytest.raises(exc) as info:
            to_vllm_answer(decision(outcome, error="the oracle's message"), FakeBackend, classes)
        assert type(info.value) is exc and str(info.value) == "the oracle's message"
    with pytest.raises(ScenarioMismatch, match="could not answer.*moe.activation"):
        to_vllm_answer(decision("error", error="moe.activation: 'relu2' is not an activation"), FakeBackend, classes)
    with pytest.raises(ScenarioMismatch, match="'MARLIN', which this vLLM's FakeBackend does not have"):
        to_vllm_answer(decision("selected", "MARLIN", "KernelA"), FakeBackend, classes)
    with pytest.raises(ScenarioMismatch, match="kernel 'KernelC'.*KernelA, KernelB"):
        to_vllm_answer(decision("selected", "TRITON", "KernelC"), FakeBackend, classes)


def test_without_the_opt_in_register_does_nothing(monkeypatch):
    monkeypatch.delenv(plugin.RULES_ENV, raising=False)
    monkeypatch.setattr(plugin, "install", lambda *a: pytest.fail("install() ran without MOE_ORACLE_RULES"))
    plugin.register()


@pytest.mark.parametrize("version", ["0.19.1", "0.21.0", "0.33.0", "unknown"])
def test_unsupported_vllm_versions_are_refused_naming_the_supported_ones(version):
    with pytest.raises(RuntimeError) as info:
        plugin.release_for(version)
    assert f"this is vLLM {version}" in str(info.value) and "supports vLLM 0.20.x only" in str(info.value)
    assert plugin.release_for("0.20.2") is RELEASE


def test_rules_spec_is_a_directory_or_a_shipped_profile(tmp_path):
    _, profile, source = plugin.open_rules("vllm-0.15", None, RELEASE)
    assert profile == "vllm-0.15" and source == "the shipped rules"
    shutil.copytree(oracle.Oracle().root, tmp_path / "rules")
    _, profile, source = plugin.open_rules(str(tmp_path / "rules"), None, RELEASE)
    assert profile == "vllm-0.20" and source == str((tmp_path / "rules").resolve())
    with pytest.raises(RuntimeError, match="neither a rules directory nor a shipped profile.*vllm-0.20"):
        plugin.open_rules("vllm-0.2O", None, RELEASE)
    with pytest.raises(RuntimeError, match="MOE_ORACLE_PROFILE='nope': no such profile"):
        plugin.open_rules(str(tmp_path / "rules"), "nope", RELEASE)


def test_a_selector_whose_name_or_signature_changed_is_refused(monkeypatch):
    module = types.ModuleType("fake_vllm_oracle")
    module.select_x = lambda config: None
    monkeypatch.setitem(sys.modules, "fake_vllm_oracle", module)
    sel = plugin.Selector("fake_vllm_oracle", "select_x", "nvfp4", "E", ("weight_key", "activation_key"), ())
    with pytest.raises(RuntimeError, match=r"select_x takes \(config\), but the plugin answers "
                                           r"\(config, weight_key, activation_key\)"):
        plugin._target(sel)
    with pytest.raises(RuntimeError, match="this vLLM has no fake_vllm_oracle.select_y"):
        plugin._target(plugin.Selector("fake_vllm_oracle", "select_y", "nvfp4", "E", (), ()))


def test_each_distinct_decision_is_logged_once_with_its_rule_file_and_step(oracle, caplog):
    active = plugin._Active(oracle, "vllm-0.20", "the shipped rules", RELEASE)
    sel = BY_POLICY["mxfp4-gpt-oss"]
    hopper = {"policy": sel.policy, "platform": {"kind": "cuda", "capability": [9, 0]},
              "packages": {"triton_kernels": True}}
    forced = {**hopper, "env": {"VLLM_MXFP4_USE_MARLIN": "1"}}
    plugin._logged.clear()
    with caplog.at_level(logging.INFO, logger="moe_oracle"):
        for question in (hopper, hopper, forced, hopper, forced):  # five MoE layers, two distinct decisions
            plugin._log_once(sel, active, question, oracle.select(question))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "on cuda 9.0 -> TRITON / OAITritonMxfp4ExpertsMonolithic; decided by step 'auto' at rules/common/mxfp4.yaml:" in lines[0]
    assert "-> MARLIN / MarlinExperts; decided by step 'marlin-forced'" in lines[1]


def test_float32_router_logits_are_warned_about_where_vllm_reads_them(caplog):
    class Float32:
        def __str__(self):
            return "torch.float32"
    plugin._warned.clear()
    routing = enum.IntEnum("RoutingMethodType", {"DeepSeekV3": 2, "Renormalize": 1})
    with caplog.at_level(logging.WARNING, logger="moe_oracle"):
        plugin._warn_once_if_unexpressed(types.SimpleNamespace(router_logits_dtype=Float32(), routing_method=routing.DeepSeekV3))
        assert not caplog.records
        for _ in range(2):
            plugin._warn_once_if_unexpressed(types.SimpleNamespace(router_logits_dtype=Float32(),
                                                                   routing_method=routing.Renormalize))
    assert len(caplog.records) == 1 and "float32 with Renormalize routing" in caplog.records[0].getMessage()


# ============================================================== part 2: the real vLLM 0.20.0
def _vllm_version() -> str | None:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


requires_vllm_020 = pytest.mark.skipif(
    _vllm_version() != "0.20.0",
    reason=f"needs vllm==0.20.0 importable (found {_vllm_version() or 'no vllm'}); see docs/vllm-plugin-run.log")

# vLLM's optional-package probes, by the scenario package each one stands for.
PROBES = {"flashinfer": ("has_flashinfer", "has_flashinfer_moe", "has_flashinfer_cutedsl",
                         "has_flashinfer_trtllm_fused_moe", "has_flashinfer_cutlass_fused_moe",
                         "has_flashinfer_cutedsl_grouped_gemm_nt_masked", "has_flashinfer_cutedsl_moe_nvfp4"),
          "triton_kernels": ("has_triton_kernels",), "deep_gemm": ("has_deep_gemm",), "aiter": ("has_aiter",)}
PROBE_HOME = {"flashinfer": "vllm.utils.flashinfer", "triton_kernels": "vllm.utils.import_utils",
              "deep_gemm": "vllm.utils.import_utils", "aiter": "vllm.utils.import_utils"}
# Native extensions whose import needs a GPU driver; selection never calls into them.
NATIVE_WITHOUT_DRIVER = ("vllm._C", "vllm._C_stable_libtorch", "vllm_xpu_kernels", "vllm_xpu_kernels._C",
                         "vllm_xpu_kernels._moe_C", "vllm_xpu_kernels._xpu_C")


def rebind_in_vllm(old, new) -> None:
    for name, module in list(sys.modules.items()):
        if module is not None and name.startswith("vllm"):
            for attr, value in list(vars(module).items()):
                if value is old:
                    setattr(module, attr, new)


class SimulatedMachine:
    """vLLM's real Python on a machine without a GPU; platform, package probes and env set per question.

    The platform is vLLM's one `current_platform` object, whose class becomes a subclass of
    vLLM's CUDA / ROCm / XPU / CPU platform overriding only `get_device_capability` (ROCm's
    arch string comes from a stand-in amdsmi, as vLLM reads it). Probes answer from the question.
    """

    def __init__(self, mp: pytest.MonkeyPatch):
        self.mp, self.packages, self.arch, self._restore = mp, {}, None, []
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
        amdsmi.amdsmi_init = amdsmi.amdsmi_shut_down = lambda *a: None
        amdsmi.amdsmi_get_processor_handles = lambda: ["gpu0"]
        amdsmi.amdsmi_get_gpu_asic_info = lambda handle: {"target_graphics_version": self.arch}
        for fn in ("amdsmi_get_gpu_device_uuid", "amdsmi_topo_get_link_type", "amdsmi_topo_get_numa_node_number"):
            setattr(amdsmi, fn, lambda *a: pytest.fail("selection asked amdsmi for more than the arch"))
        mp.setitem(sys.modules, "amdsmi", amdsmi)
        for sel in RELEASE.selectors:  # import every experts class before simulating (XPU's imports kernels)
            mod = importlib.import_module(sel.module)
            for member in getattr(mod, sel.enum):
                if member.value != "None":
                    mod.backend_to_kernel_cls(member)
            for caller in sel.callers:
                importlib.import_module(caller)
        import vllm._aiter_ops

        self.aiter_ops = vllm._aiter_ops
        for package, names in PROBES.items():
            home = importlib.import_module(PROBE_HOME[package])
            for name in names:
                original = getattr(home, name)
                switch = self._probe(package)
                rebind_in_vllm(original, switch)
                self._restore.append((switch, original))
        self.originals = {sel.name: getattr(importlib.import_module(sel.module), sel.name) for sel in RELEASE.selectors}

    def _probe(self, package: str):
        return lambda *args, **kwargs: self.packages.get(package, False)

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
        import os

        from vllm.model_executor.layers.quantization.utils import quant_utils
        from vllm.utils.deep_gemm import is_deep_gemm_supported

        self.platform.__class__ = self.platform_class(scenario["platform"])
        self.packages = dict(scenario.get("packages", {}))
        self.aiter_ops.IS_AITER_FOUND = self.packages.get("aiter", False)
        for name in [n for n in os.environ if n.startswith("VLLM_")]:
            self.mp.delenv(name)
        for name, value in scenario.get("env", {}).items():
            self.mp.setenv(name, value)
        is_deep_gemm_supported.cache_clear()
        self.aiter_ops.rocm_aiter_ops.refresh_env_variables()
        moe = full_moe(scenario)
        kwargs = {"config": vllm_config(moe)}
        for key in BY_POLICY[scenario["policy"]].key_args:
            kwargs[key] = getattr(quant_utils, moe[key]) if moe[key] else None
        return kwargs


def vllm_config(moe: dict):
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
    return FusedMoEConfig(num_experts=moe["num_experts"], experts_per_token=moe["top_k"], hidden_dim=moe["hidden_size"],
                          intermediate_size_per_partition=moe["intermediate_size"], num_local_experts=moe["num_experts"],
                          num_logical_experts=moe["num_experts"], activation=MoEActivation(moe["activation"]),
                          device="cuda", routing_method=RoutingMethodType[moe["routing_method"]],
                          moe_parallel_config=parallel, in_dtype=torch.bfloat16, moe_backend=moe["moe_backend"],
                          has_bias=moe["has_bias"], is_act_and_mul=moe["is_act_and_mul"], is_lora_enabled=moe["lora"])


def vllm_answer(fn, kwargs) -> tuple[tuple, str | None]:
    """What a vLLM selector did: ((outcome or exception type, backend value, kernel), message)."""
    try:
        backend, kernel = fn(**kwargs)
    except (ValueError, NotImplementedError) as exc:
        return (type(exc).__name__, None, None), str(exc)
    if kernel is None:
        return ("none", backend.value, None), None
    return ("selected", backend.value, kernel.__name__), None


@pytest.fixture(scope="module")
def machine():
    with pytest.MonkeyPatch.context() as mp:
        sim = SimulatedMachine(mp)
        try:
            yield sim
        finally:
            plugin.uninstall()
            sim.restore()


def through_plugin(machine, rules) -> list[tuple]:
    """Every golden question asked of vLLM's callers' selector names with the plugin on `rules`."""
    plugin.install(rules)
    answers = []
    for q in golden_questions():
        sel = BY_POLICY[q["scenario"]["policy"]]
        kwargs = machine.ask(q["scenario"])
        patched = getattr(sys.modules[sel.callers[0]], sel.name)
        assert getattr(patched, "_moe_oracle_selector", None) is sel, f"{sel.callers[0]}.{sel.name} is not patched"
        answers.append(vllm_answer(patched, kwargs))
    return answers


@requires_vllm_020
def test_shipped_rules_answer_every_golden_question_as_unpatched_vllm(machine, oracle, caplog):
    plugin.uninstall()
    questions = golden_questions()
    unpatched = [vllm_answer(machine.originals[BY_POLICY[q["scenario"]["policy"]].name], machine.ask(q["scenario"]))
                 for q in questions]
    for q, (answer, _) in zip(questions, unpatched):  # the simulation reproduces the recorded vLLM answers
        assert answer == answer_of(types.SimpleNamespace(error=None, **{"backend": None, "kernel": None,
                                                                          **q["expected"]})), q["scenario"]
    with caplog.at_level(logging.INFO, logger="moe_oracle"):
        patched = through_plugin(machine, "vllm-0.20")
    for q, (vllm_own, _), (ours, message) in zip(questions, unpatched, patched):
        assert ours == vllm_own, q["scenario"]
        if message is not None:
            assert message == oracle.select(q["scenario"]).error
    decisions = [r.getMessage() for r in caplog.records if "decided by step" in r.getMessage()]
    assert len(decisions) == len(set(decisions)) > 10, "one provenance line per distinct decision"
    assert any("rules/common/mxfp4.yaml:" in line and "-> TRITON / OAITritonMxfp4ExpertsMonolithic" in line
               for line in decisions)


def edited_rules(tmp_path: Path) -> Path:
    """The shipped rules with two priority swaps: MARLIN before TRITON (gpt-oss), CUTLASS before TRTLLM (NVFP4)."""
    rules = shutil.copytree(oracle.Oracle().root, tmp_path / "rules")
    nvfp4_old = "candidates: [FLASHINFER_TRTLLM, FLASHINFER_CUTEDSL, FLASHINFER_CUTEDSL_BATCHED, FLASHINFER_CUTLASS,"
    nvfp4_new = "candidates: [FLASHINFER_CUTLASS, FLASHINFER_CUTEDSL, FLASHINFER_CUTEDSL_BATCHED, FLASHINFER_TRTLLM,"
    for rel, old, new in (("common/mxfp4.yaml", "AITER, TRITON, FLASHINFER_CUTLASS_MXFP4_BF16, MARLIN,",
                           "AITER, MARLIN, FLASHINFER_CUTLASS_MXFP4_BF16, TRITON,"),
                          ("vllm-0.20/nvfp4.yaml", nvfp4_old, nvfp4_new)):
        text = (rules / rel).read_text()
        assert text.count(old) == 1, f"the shipped {rel} changed: update this edit"
        (rules / rel).write_text(text.replace(old, new))
    return rules


@requires_vllm_020
def test_an_edited_rule_changes_vllm_exactly_where_the_oracle_changes(machine, oracle, tmp_path):
    questions = golden_questions()
    rules = edited_rules(tmp_path)
    edited = oracle.__class__(rules)
    oracle_changed = {i for i, q in enumerate(questions)
                      if answer_of(edited.select(q["scenario"])) != answer_of(oracle.select(q["scenario"]))}
    shipped = [a for a, _ in through_plugin(machine, "vllm-0.20")]
    after_edit = [a for a, _ in through_plugin(machine, rules)]
    vllm_changed = {i for i, (a, b) in enumerate(zip(shipped, after_edit)) if a != b}
    assert 0 < len(oracle_changed) < len(questions), "the edit must change some answers and keep others"
    assert vllm_changed == oracle_changed
    assert {a[1] for i, a in enumerate(after_edit) if i in vllm_changed} >= {"MARLIN", "FLASHINFER_CUTLASS"}
    for q, ours in zip(questions, after_edit):
        assert ours == answer_of(edited.select(q["scenario"])), q["scenario"]


@requires_vllm_020
def test_vllms_plugin_loader_activates_the_plugin_and_uninstall_restores_vllm(machine, monkeypatch):
    import vllm.plugins

    plugin.uninstall()
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert eps.get("moe_oracle") == "oracle.integrations.vllm:register", eps
    monkeypatch.setenv(plugin.RULES_ENV, "vllm-0.20")
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    vllm.plugins.load_general_plugins()
    for sel in RELEASE.selectors:
        for where in (sel.module, *sel.callers):
            assert getattr(sys.modules[where], sel.name)._moe_oracle_selector is sel, f"{where}.{sel.name}"
    plugin.uninstall()
    for sel in RELEASE.selectors:
        for where in (sel.module, *sel.callers):
            assert getattr(sys.modules[where], sel.name) is machine.originals[sel.name], f"{where}.{sel.name}"


@requires_vllm_020
def test_opting_in_before_vllm_imports_its_selectors_patches_them_on_import(tmp_path):
    """A fresh vLLM process: the plugin loads first, the selector modules come later (as in a real server)."""
    import os
    import subprocess

    script = tmp_path / "fresh.py"
    script.write_text(
        "import sys, vllm.plugins\n"
        "vllm.plugins.load_general_plugins()\n"
        f"assert {RELEASE.selectors[0].module!r} not in sys.modules, 'the plugin imported the selectors'\n"
        "from vllm.model_executor.layers.quantization import modelopt, mxfp4\n"
        "for fn in (mxfp4.select_gpt_oss_mxfp4_moe_backend, mxfp4.select_mxfp4_moe_backend,\n"
        "           modelopt.select_nvfp4_moe_backend):\n"
        "    print('PATCHED', fn.__name__, fn._moe_oracle_selector.policy)\n")
    env = {**os.environ, plugin.RULES_ENV: "vllm-0.20", "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300,
                         check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    patched = [line.split()[1:] for line in run.stdout.splitlines() if line.startswith("PATCHED ")]
    assert patched == [["select_gpt_oss_mxfp4_moe_backend", "mxfp4-gpt-oss"], ["select_mxfp4_moe_backend", "mxfp4"],
                       ["select_nvfp4_moe_backend", "nvfp4"]]
    assert "select_nvfp4_moe_backend (on import)" in run.stdout + run.stderr
