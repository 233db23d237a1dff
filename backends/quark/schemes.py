"""What an OCP MX scheme means for the emulation: its weight format, and how each GEMM input is fake-quantized.

The scheme name gives the formats (`scheme_formats`); the rules' quant-config kind says how vLLM's EMULATION
actually quantizes the two GEMM inputs (`emulated_activation: {gemm1, gemm2, not_implemented}`), which for FP8
inputs is not the scheme name: vLLM 0.20 quantizes the first per tensor with a dynamic scale and fails at the
second, vLLM 0.33 quantizes both per tensor with the static a1/a2 scales. `emulated_inputs` reads that data;
nothing here names a profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import torch

from backends import formats
from backends.emulation import GEMM_INPUT_SCHEMES

__all__ = ["FNUZ_ARCHS", "EmulatedInputs", "emulated_inputs", "platform_fp8_dtype", "scheme_formats"]

#: ROCm architectures whose FP8 is e4m3fnuz (vLLM `is_fp8_fnuz`: MI300 family)
FNUZ_ARCHS = ("gfx940", "gfx941", "gfx942")


def _fail(kind: type[Exception], message: str) -> NoReturn:
    raise kind(f"QuarkOCPMXMoE: {message}")


def scheme_formats(scheme: str) -> tuple[str, str | None]:
    """(weight format of backends.emulation, input format) of an OCP_MX_Scheme name.

    ``w_mxfp4_a_fp8`` -> ("mxfp4", "fp8") (how fp8 inputs are emulated is the kind's `emulated_activation`);
    ``w_mxfp6_e3m2`` -> ("mxfp6_e3m2", None).
    """
    if not isinstance(scheme, str) or not scheme.startswith("w_"):
        _fail(ValueError, f"scheme={scheme!r} is not an OCP_MX_Scheme name (w_<weight>[_a_<input>])")
    weight, _, act = scheme[2:].partition("_a_")
    act_scheme = act or None
    if weight not in ("mxfp4", "mxfp6_e3m2", "mxfp6_e2m3") or act_scheme not in formats.ACTIVATION_SCHEMES:
        _fail(ValueError, f"scheme={scheme!r}: weight {weight!r} / input {act_scheme!r} has no emulation here")
    return weight, act_scheme


def platform_fp8_dtype(platform: Mapping[str, Any]) -> torch.dtype:
    """vLLM's current_platform.fp8_dtype(): e4m3fnuz on the MI300 family, e4m3fn elsewhere."""
    fnuz = platform.get("kind") == "rocm" and platform.get("gcn_arch") in FNUZ_ARCHS
    return torch.float8_e4m3fnuz if fnuz else torch.float8_e4m3fn


@dataclass(frozen=True)
class EmulatedInputs:
    """The input format of the kind, the fake quantization of each GEMM input, and vLLM's failure (or None)."""

    activation: str | None
    gemm1: str | None
    gemm2: str | None
    not_implemented: str | None = None

    @property
    def static_scales(self) -> bool:
        """Whether a GEMM input takes the layer's static a1/a2 scale."""
        return "fp8_per_tensor_static" in (self.gemm1, self.gemm2)


def emulated_inputs(kind: Mapping[str, Any] | None, scheme: str, weight_format: str) -> EmulatedInputs:
    """The kind's emulated inputs, its weights checked against the scheme's: `emulated_activation` where the
    kind gives it, else its `activation` for both GEMM inputs; without a kind, the scheme's own input format."""
    if kind is None:
        act = scheme_formats(scheme)[1]
        return EmulatedInputs(act, act, act)
    name = kind["kind"]
    if kind["weight"] != weight_format:
        _fail(ValueError, f"the rules' quant-config kind {name!r} is for {kind['weight']} weights but scheme "
              f"{scheme} has {weight_format} weights; fix the ocp-mx policy's quant_config kinds for {scheme}")
    spec = kind.get("emulated_activation")
    if spec is None:
        if kind["activation"] not in formats.ACTIVATION_SCHEMES:
            _fail(ValueError, f"the rules' quant-config kind {name!r} quantizes activations to "
                  f"{kind['activation']!r}, which the emulation cannot fake-quantize (it does "
                  f"{formats.ACTIVATION_SCHEMES}); give {scheme} an emulated kind in the ocp-mx policy's quant_config")
        return EmulatedInputs(kind["activation"], kind["activation"], kind["activation"])
    inputs = EmulatedInputs(kind["activation"], spec["gemm1"], spec["gemm2"], spec.get("not_implemented"))
    for which in ("gemm1", "gemm2"):
        if getattr(inputs, which) not in GEMM_INPUT_SCHEMES:
            _fail(ValueError, f"the rules' quant-config kind {name!r} emulates the {which} input as "
                  f"{getattr(inputs, which)!r}; the emulation does {GEMM_INPUT_SCHEMES}")
    if inputs.static_scales and kind.get("input_scales") != "static":
        _fail(ValueError, f"the rules' quant-config kind {name!r} quantizes with the static a1/a2 scales "
              f"(fp8_per_tensor_static) but has no `input_scales: static`; add it to the kind")
    return inputs
