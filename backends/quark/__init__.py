"""Quark OCP-MX MoE layers: parameters from the quant config, checkpoint loading, post-processing and
forward, driven by the oracle's `ocp-mx` decision (see `backends.quark.ocp_mx`)."""

from backends.quark.ocp_mx import QuarkOCPMXMoE, normalize_e4m3fn_to_e4m3fnuz
from backends.quark.schemes import scheme_formats

__all__ = ["QuarkOCPMXMoE", "normalize_e4m3fn_to_e4m3fnuz", "scheme_formats"]
