"""One vocabulary for the formats and activations, torch-free so that oracle/ and backends/ share it.

The same format is spelled four ways: a vLLM QuantKey (`kMxfp4Static`), an OCP MX scheme dtype
(`mxfp4`, in scheme names like `w_mxfp4_a_fp8`), a Quark checkpoint dtype (`fp4`) and a codec
name of backends.formats / backends.emulation (`mxfp4`). Each row below ties them together with
the numerics that define the format: element type, block size, scale format, static/dynamic.
"""
from __future__ import annotations

from dataclasses import dataclass

GATED_ACTIVATIONS = ("swigluoai", "silu", "gelu", "swiglustep")
UNGATED_ACTIVATIONS = ("silu_no_mul", "gelu_no_mul", "relu2_no_mul")
# the scenario's moe.activation values (vLLM's MoEActivation names), in the scenario spec's order
ACTIVATIONS = ("silu", "gelu", "swigluoai", "swiglustep", "silu_no_mul", "gelu_no_mul", "relu2_no_mul",
               # members vLLM 0.33's MoEActivation adds
               "situ", "gelu_tanh", "swigluoai_uninterleave", "relu2", "gelu_tanh_no_mul")
# the scenario's moe.routing_method values (vLLM's RoutingMethodType names; the last four are 0.33's);
# rule files may name only these (kernels' routing_methods, conditions on moe.routing_method)
ROUTING_METHODS = ("Default", "Renormalize", "DeepSeekV3", "Llama4", "RenormalizeNaive", "TopK", "Custom", "Simulated",
                   "Unspecified", "SigmoidRenorm", "Sigmoid", "MiniMax2", "DeepseekV4")
# the scenario's moe.parallel.all2all_backend values (vLLM's --all2all-backend choices), shared with the rules
ALL2ALL_BACKENDS = ("allgather_reducescatter", "naive", "pplx", "deepep_high_throughput", "deepep_low_latency", "mori",
                    "nixl_ep", "flashinfer_all2allv", "flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided")

# a Quark checkpoint's quantization.*.qscheme and scale_format values (AMD Quark's QSchemeType; MX specs' scale
# format); rule literals compared with these facts must be one of them
QUARK_QSCHEMES = ("per_tensor", "per_channel", "per_group")
QUARK_SCALE_FORMATS = ("e8m0", "e4m3", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Format:
    """One quantized format under all its names."""

    quant_key: str | None  # vLLM QuantKey name; None where vLLM has none (MXFP6)
    codec: str | None  # backends.formats / emulation name; None where this project has no codec
    element: str  # e2m1 (FP4), e3m2 / e2m3 (FP6), e4m3 (FP8), int4, int8
    block: int | None  # elements sharing one scale; None = per tensor / channel / token
    scale: str  # e8m0 (MX), e4m3*fp32 (NVFP4: E4M3 block scale times an fp32 tensor scale), fp32
    dynamic: bool  # scales computed at run time from the data (activations), not stored
    ocp_dtype: str | None = None  # dtype name inside OCP MX scheme names (w_<ocp>_a_<ocp>)
    quark_dtype: str | None = None  # dtype of a Quark checkpoint's weight/input config


FORMATS: tuple[Format, ...] = (
    Format("kMxfp4Static", "mxfp4", "e2m1", 32, "e8m0", False, "mxfp4", "fp4"),
    Format(None, "mxfp6_e3m2", "e3m2", 32, "e8m0", False, "mxfp6_e3m2", "fp6_e3m2"),
    Format(None, "mxfp6_e2m3", "e2m3", 32, "e8m0", False, "mxfp6_e2m3", "fp6_e2m3"),
    Format("kMxfp8Static", "mxfp8", "e4m3", 32, "e8m0", False),
    # OCP-MX "fp8" activations are emulated as MXFP8 (E8M0 per 32), as vLLM's emulation does
    Format("kMxfp8Dynamic", "mxfp8", "e4m3", 32, "e8m0", True, "fp8", "fp8_e4m3"),
    Format("kNvfp4Static", "nvfp4", "e2m1", 16, "e4m3*fp32", False),
    Format("kNvfp4Dynamic", "nvfp4", "e2m1", 16, "e4m3*fp32", True),
    Format("kFp8Dynamic128Sym", "fp8_per_token_group", "e4m3", 128, "fp32", True),
    Format("kFp8StaticTensorSym", None, "e4m3", None, "fp32", False),
    Format("kFp8DynamicTensorSym", None, "e4m3", None, "fp32", True),
    Format("kFp8DynamicTokenSym", None, "e4m3", None, "fp32", True),
    Format("kFp8Static128BlockSym", None, "e4m3", 128 * 128, "fp32", False),
    Format("kFp8StaticChannelSym", None, "e4m3", None, "fp32", False),
    Format("kInt4Static", None, "int4", None, "fp32", False),
    Format("kInt8Static", None, "int8", None, "fp32", False),
)


def _index(attr: str) -> dict[str, Format]:
    out: dict[str, Format] = {}
    for f in FORMATS:
        name = getattr(f, attr)
        if name is not None:
            out.setdefault(name, f)
    return out


BY_QUANT_KEY = _index("quant_key")
BY_OCP_DTYPE = _index("ocp_dtype")
BY_QUARK_DTYPE = _index("quark_dtype")
CODECS = tuple(dict.fromkeys(f.codec for f in FORMATS if f.codec is not None))
#: Codecs a stored (static) sub-byte weight may use: what backends.weights / backends.emulation accept.
WEIGHT_CODECS = tuple(dict.fromkeys(f.codec for f in FORMATS if f.codec is not None and not f.dynamic
                                    and f.element in ("e2m1", "e3m2", "e2m3")))
#: Activation fake-quantization schemes of the emulation: the OCP MX dtype names, plus NVFP4 (which has none).
ACTIVATION_QDQ_SCHEMES = (*BY_OCP_DTYPE, "nvfp4")


def quark_to_ocp(quark_dtype: str) -> str | None:
    """The OCP MX scheme name of a Quark dtype (fp4 -> mxfp4), None when it has none."""
    found = BY_QUARK_DTYPE.get(quark_dtype)
    return found.ocp_dtype if found else None
