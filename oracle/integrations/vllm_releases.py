"""The vLLM releases the plugin supports: per release series, the selectors to patch, the
profile encoding that release, and where that release's package probes live.

Data only (no vLLM import): adding a release is one `Release` entry, checked against the
running vLLM by `oracle.integrations.vllm._target` (a renamed function or parameter is refused).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

RULES_ENV = "MOE_ORACLE_RULES"

_MXFP4 = "vllm.model_executor.layers.fused_moe.oracle.mxfp4"
_NVFP4 = "vllm.model_executor.layers.fused_moe.oracle.nvfp4"
_QUANT = "vllm.model_executor.layers.quantization"


@dataclass(frozen=True)
class Selector:
    """One vLLM selector function and the oracle policy that answers it."""

    module: str                 # the vLLM module that defines it (and the enum, backend_to_kernel_cls)
    name: str                   # the function's name, patched wherever vLLM bound it
    policy: str                 # the oracle policy of the same logic
    enum: str                   # the backend enum's name in `module`
    key_args: tuple[str, ...]   # its QuantKey parameters after `config`; each becomes moe.<name> of the scenario
    callers: tuple[str, ...]    # vLLM modules that import it by name (the proof test checks them)
    user_key: bool = False      # it reads the user's quantization_config.moe.activation (moe.user_activation_key)


@dataclass(frozen=True)
class Release:
    """A vLLM release series the plugin supports: its selectors, the profile encoding it and its probes."""

    series: str
    profile: str
    selectors: tuple[Selector, ...]
    # scenario package -> "module:attribute" of the vLLM probe (a function, or a bool constant)
    probes: tuple[tuple[str, str], ...]
    # scenario fact flashinfer.<feature> -> "module:function" of the vLLM probe that answers it for the installed
    # FlashInfer (the rules' fact_defaults hold what the FlashInfer this release pins answers)
    flashinfer_features: tuple[tuple[str, str], ...]
    cpu_amx: bool = False               # its CPU experts need x86 AMX: the scenario carries platform.amx
    # name of the selector module's function (backend, config) -> kernel classes of an explicitly requested
    # backend, where it has classes beyond backend_to_kernel_cls (0.33: TrtLlmMxfp4LoRAExperts)
    explicit_kernel_classes: str | None = None
    # vLLM's exception type for each refusal outcome (the README's outcome table)
    refusals: tuple[tuple[str, type[Exception]], ...] = (("invalid", ValueError),
                                                         ("unsupported", NotImplementedError))

    @property
    def refusals_by_outcome(self) -> dict[str, type[Exception]]:
        return dict(self.refusals)


_PROBES_020 = (("flashinfer", "vllm.utils.flashinfer:has_flashinfer"),
               ("triton_kernels", "vllm.utils.import_utils:has_triton_kernels"),
               ("deep_gemm", "vllm.utils.import_utils:has_deep_gemm"),
               ("aiter", "vllm._aiter_ops:IS_AITER_FOUND"))



def _features(*names: str) -> tuple[tuple[str, str], ...]:
    """FlashInfer features answered by vllm.utils.flashinfer's has_flashinfer_<name>()."""
    return tuple((name, f"vllm.utils.flashinfer:has_flashinfer_{name}") for name in names)


RELEASES: dict[str, Release] = {
    "0.20": Release("0.20", "vllm-0.20", (
        Selector(_MXFP4, "select_gpt_oss_mxfp4_moe_backend", "mxfp4-gpt-oss", "Mxfp4MoeBackend", (),
                 (f"{_QUANT}.mxfp4", f"{_QUANT}.quark.quark_moe")),
        Selector(_MXFP4, "select_mxfp4_moe_backend", "mxfp4", "Mxfp4MoeBackend", (), (f"{_QUANT}.mxfp4",)),
        Selector(_NVFP4, "select_nvfp4_moe_backend", "nvfp4", "NvFp4MoeBackend", ("weight_key", "activation_key"),
                 (f"{_QUANT}.modelopt",
                  f"{_QUANT}.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_nvfp4")),
    ), _PROBES_020, _features("trtllm_fused_moe", "cutlass_fused_moe", "cutedsl_grouped_gemm_nt_masked")),
    # 0.33 renamed the selectors: the gpt-oss logic is `select_mxfp4_moe_backend(config, activation_key)`
    # (plus the user's override), the former MXFP8-first one `select_deepseek_v4_mxfp4_moe_backend`.
    "0.33": Release("0.33", "vllm-0.33", (
        Selector(_MXFP4, "select_mxfp4_moe_backend", "mxfp4", "Mxfp4MoeBackend", ("activation_key",),
                 (f"{_QUANT}.mxfp4", f"{_QUANT}.quark.quark_moe", f"{_QUANT}.online.mxfp4",
                  f"{_QUANT}.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_mxfp4"),
                 user_key=True),
        Selector(_MXFP4, "select_deepseek_v4_mxfp4_moe_backend", "mxfp4-deepseek-v4", "Mxfp4MoeBackend", (),
                 (f"{_QUANT}.mxfp4",)),
        Selector(_NVFP4, "select_nvfp4_moe_backend", "nvfp4", "NvFp4MoeBackend", ("weight_key", "activation_key"),
                 (f"{_QUANT}.modelopt", f"{_QUANT}.online.nvfp4", f"{_QUANT}.quark.quark_moe",
                  f"{_QUANT}.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_nvfp4")),
    ), _PROBES_020 + (("humming", "vllm.utils.import_utils:has_humming"),
                      ("b12x", "vllm.utils.b12x:has_b12x"),
                      ("quark", "vllm.utils.import_utils:has_quark")),
        _features("trtllm_fused_moe", "cutlass_fused_moe", "cutedsl_grouped_gemm_nt_masked", "cutedsl_moe_nvfp4",
                  "b12x_moe")
        + (("situ_activation", f"{_QUANT}.utils.flashinfer_utils:has_flashinfer_situ_activation"),),
        cpu_amx=True, explicit_kernel_classes="_requested_kernel_cls"),
}


def release_for(version: str) -> Release:
    """The supported release series of a vLLM version string, or a RuntimeError naming them."""
    m = re.match(r"(\d+)\.(\d+)", version)
    release = RELEASES.get(f"{m.group(1)}.{m.group(2)}") if m else None
    if release is None:
        supported = ", ".join(f"{s}.x" for s in RELEASES)
        raise RuntimeError(f"{RULES_ENV} is set, but moe-oracle's vLLM plugin supports vLLM {supported} only and "
                           f"this is vLLM {version}; install a supported vLLM, or unset {RULES_ENV} to keep "
                           f"vLLM's built-in MoE backend selection")
    return release
