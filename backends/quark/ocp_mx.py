"""`QuarkOCPMXMoE`: the lifecycle of vLLM's `QuarkOCP_MX_MoEMethod`, driven by the oracle's `ocp-mx` policy.

    quant_config (Quark layer config) + (E, H, I) + platform ─oracle(profile, policy ocp-mx)─> Decision
      (scheme, emulate, static_input_scales, backend, rounded sizes; the seed's errors are its answers)
    create ─> zero parameters of the scheme at the rounded sizes      load_weights ─> checkpoint tensors placed
    process_weights_after_loading ─> static input scales (max over experts, fnuz ×2), then the backend:
      converter named (e.g. TRITON_MOE)  -> backends.layer.MoELayer's machinery (convert once, bind the runner)
      converter null (EMULATION)         -> the checkpoint layout kept, dequantized on every forward
    forward(x, router_logits) ─> y [T, H]

Which scheme, whether it emulates, which backend runs and which quant config it builds are the rules' answers:
on NONE/EMULATION the `ocp-mx` policy's `quant_config` picks the kind by scheme (vLLM's
`get_fused_moe_quant_config`): its formats drive the emulation (`emulated_activation` says how each GEMM input is
fake-quantized where vLLM's emulation differs from the format, e.g. FP8 per tensor; backends.quark.schemes reads
it), `input_scales: static` puts the processed static input scales in the config as a1/a2, and a
`not_implemented` kind (vLLM builds none, e.g. w_mxfp6_*_a_fp8) makes post-processing raise
NotImplementedError, as vLLM does; an `emulated_activation.not_implemented` makes forward raise it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from backends import formats
from backends.assembly import KernelAssembly, kernel_assembly
from backends.emulation import GATED_ACTIVATIONS, moe_forward
from backends.layer import (
    _DEVICE_KINDS,
    DEFAULT_PROFILE,
    LayerUnavailableError,
    MoELayer,
    build_runner,
    check_input,
    platform_for_device,
    question_for,
    require_runnable,
    select_logged,
    swiglu_for,
)
from backends.layouts.quant_config import build_layer_quant_config, gemm1_constants
from backends.quark.schemes import EmulatedInputs, emulated_inputs, platform_fp8_dtype, scheme_formats
from backends.weights import MoEWeights
from oracle import default_oracle
from oracle.log import LOGGER_NAME

__all__ = ["DEFAULT_PROFILE", "QuarkOCPMXMoE", "normalize_e4m3fn_to_e4m3fnuz"]

logger = logging.getLogger(LOGGER_NAME)

POLICY = "ocp-mx"
#: Quark layer-config keys the rules read (scenario `quark.weight` / `quark.input`); others (observer, round
#: method, ch_axis, ...) do not change the selection and are ignored
_WEIGHT_KEYS = ("dtype", "qscheme", "group_size", "scale_format")
_INPUT_KEYS = ("dtype", "is_dynamic", "qscheme", "group_size", "scale_format", "symmetric")
#: outcome of the decision -> the exception vLLM raises for it in QuarkOCP_MX_MoEMethod.__init__
_OUTCOME_ERRORS = {"invalid": ValueError, "unsupported": NotImplementedError, "error": ValueError}


def _fail(kind, message: str):
    raise kind(f"QuarkOCPMXMoE: {message}")


def _packed_cols(weight_format: str, k: int) -> int:
    """Bytes of one stored row of k elements: K/2 for MXFP4, 3K/4 for MXFP6 (4 values in 3 bytes)."""
    return k // 2 if weight_format == "mxfp4" else k * 3 // 4


def normalize_e4m3fn_to_e4m3fnuz(values: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3fn codes and their dequantization scale as e4m3fnuz (bias 8): same bits, scale ×2; -0 (0x80,
    NaN in fnuz) becomes +0. value_fnuz * scale_fnuz == value_fn * scale for every finite code."""
    if not isinstance(values, torch.Tensor) or values.dtype != torch.float8_e4m3fn:
        _fail(TypeError, f"values must be a torch.float8_e4m3fn tensor, got "
              f"{values.dtype if isinstance(values, torch.Tensor) else type(values).__name__}")
    bits = values.view(torch.int8).clone()
    bits[bits == -128] = 0
    return bits.view(torch.float8_e4m3fnuz), scale * 2.0


class QuarkOCPMXMoE:
    """One Quark OCP-MX MoE layer; build it with `create`, then `load_weights`, `process_weights_after_loading`."""

    def __init__(self, *, decision, scenario: dict, num_experts: int, hidden_size: int, intermediate_size: int,
                 top_k: int, activation: str, gate_up: str, has_bias: bool, renormalize: bool,
                 swiglu: Mapping[str, float], device: torch.device, oracle,
                 assembly: KernelAssembly | None = None):
        self.decision, self.scenario = decision, scenario
        self.assembly = assembly  # how the rules assemble the selected kernel, runnable here or not
        if "ocp_mx_scheme" not in decision.extras:
            _fail(LayerUnavailableError, f"the decision names no OCP MX scheme (outcome {decision.outcome}, backend "
                  f"{decision.backend}); the profile's ocp-mx policy must emit ocp_mx_scheme")
        self.scheme = decision.extras["ocp_mx_scheme"]
        self.emulate = bool(decision.extras.get("emulate"))
        self.static_input_scales = bool(decision.extras.get("static_input_scales"))
        self.weight_format, self.activation_scheme = scheme_formats(self.scheme)
        self.quant_config_kind = decision.quant_config  # the rules' kind (by scheme on NONE/EMULATION)
        act = self.activation_scheme
        self.emulated_inputs = EmulatedInputs(act, act, act)
        if decision.converter is None and decision.runner is not None:  # the emulation runs the kind's formats
            self.emulated_inputs = emulated_inputs(self.quant_config_kind, self.scheme, self.weight_format)
            self.activation_scheme = self.emulated_inputs.activation
            if self.emulated_inputs.static_scales and not self.static_input_scales:
                _fail(ValueError, f"the rules' kind {self.quant_config_kind['kind']!r} quantizes with static input "
                      f"scales but the checkpoint of {self.scheme} has none; map {self.scheme} to a kind without "
                      f"fp8_per_tensor_static in the ocp-mx policy's quant_config")
        self.quant_config: dict[str, Any] | None = None  # built by process_weights_after_loading
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.padded_hidden_size = decision.hidden_size or hidden_size
        self.padded_intermediate_size = decision.intermediate_size or intermediate_size
        self.top_k, self.activation, self.gate_up, self.renormalize = top_k, activation, gate_up, renormalize
        self.swiglu = dict(swiglu)
        self.device = device
        self._oracle = oracle
        self.params: dict[str, torch.Tensor] = {
            name: torch.zeros(shape, dtype=dtype, device=device) for name, (shape, dtype) in self.param_specs(
                has_bias).items()}
        self.device = self.params["w13_weight"].device  # concrete: 'cuda' becomes 'cuda:0', as x.device reports
        if self.static_input_scales:  # vLLM creates them as ones; a checkpoint must overwrite them
            for name in ("w13_input_scale", "w2_input_scale"):
                self.params[name].fill_(1.0)
        self._loaded: set[str] = set()
        self._kernel_layer: MoELayer | None = None
        self._processed = False

    # ------------------------------------------------------------------ parameters from the scheme
    @classmethod
    def create(cls, quant_config: Mapping[str, Any], num_experts: int, hidden_size: int, intermediate_size: int, *,
               top_k: int, activation: str = "silu", gate_up: str = "contiguous", has_bias: bool = False,
               renormalize: bool = True, profile: str = DEFAULT_PROFILE, platform: Mapping[str, Any] | None = None,
               packages: Mapping[str, bool] | None = None, env: Mapping[str, str] | None = None,
               device: Any = "cpu", swiglu_alpha: float | None = None, swiglu_beta: float | None = None,
               swiglu_limit: float | None = None, max_num_batched_tokens: int | None = None,
               oracle=None) -> QuarkOCPMXMoE:
        """Ask the oracle (policy ocp-mx) and allocate the scheme's parameters at its rounded sizes.

        quant_config: the Quark layer config: {"weight": {"dtype": "fp4", "qscheme": "per_group", ...},
        "input_tensors": {"dtype": "fp8_e4m3", "is_dynamic": False, ...} or None}.
        gate_up: row order of w13 ("contiguous" [w1; w3], or "interleaved" as gpt-oss).
        The seed's errors: ValueError for a non per-group weight qscheme or an unknown dtype pair,
        NotImplementedError for an unusable input dtype or static/dynamic input-scale combination.
        swiglu_alpha / swiglu_beta / swiglu_limit: override the gemm1 constants of the rules' quant-config kind (the
        layer's own constants, as vLLM 0.33 reads them from the layer). On the emulation a kind without gemm1 (vLLM's
        Quark method passes none) leaves the swigluoai op's own constants: backends.emulation's 1.702, 1.0, 7.0.
        max_num_batched_tokens: the batched format's max tokens per rank (default: the rules').
        A backend this project cannot run still gives a layer with its decision and `assembly`; post-processing
        then raises LayerUnavailableError.
        """
        sizes = {"num_experts": num_experts, "hidden_size": hidden_size, "intermediate_size": intermediate_size,
                 "top_k": top_k}
        for name, value in sizes.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                _fail(ValueError, f"{name}={value!r} must be a positive int")
        for name in ("hidden_size", "intermediate_size"):
            if sizes[name] % formats.MX_BLOCK_SIZE:
                _fail(ValueError, f"{name}={sizes[name]} must be a multiple of {formats.MX_BLOCK_SIZE} (one E8M0 "
                      f"scale per 32 elements along K); pad the checkpoint")
        if top_k > num_experts:
            _fail(ValueError, f"top_k={top_k} must be <= num_experts={num_experts}")
        if activation not in GATED_ACTIVATIONS:
            _fail(ValueError, f"activation={activation!r} must be one of {GATED_ACTIVATIONS} (gated experts)")
        if gate_up not in ("contiguous", "interleaved"):
            _fail(ValueError, f"gate_up={gate_up!r} must be 'contiguous' ([w1; w3]) or 'interleaved' (gpt-oss)")
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            _fail(ValueError, f"device={device!r} is not a torch device ({exc}); pass e.g. 'cpu' or 'cuda:0'")
        if platform is None:
            platform = platform_for_device(device)
        elif not isinstance(platform, Mapping):
            _fail(TypeError, f"platform={platform!r} must be a scenario platform mapping, e.g. {{'kind': 'cpu'}}")
        oracle = default_oracle() if oracle is None else oracle
        question = _question(oracle, quant_config, profile=profile, platform=platform, packages=packages, env=env,
                             num_experts=num_experts, hidden_size=hidden_size, intermediate_size=intermediate_size,
                             top_k=top_k, activation=activation, has_bias=has_bias, renormalize=renormalize)
        decision = select_logged(oracle, question)
        if decision.outcome in _OUTCOME_ERRORS:
            _fail(_OUTCOME_ERRORS[decision.outcome], f"{decision.error} (profile {profile}, decided at "
                  f"{decision.decided_by.at if decision.decided_by else '?'})")
        given = {"swiglu_alpha": swiglu_alpha, "swiglu_beta": swiglu_beta, "swiglu_limit": swiglu_limit}
        runnable = decision.outcome == "selected" and decision.runner is not None  # else processing says why not
        if runnable and decision.converter is not None:  # a kernel layer: every constant from the kind or given
            swiglu = swiglu_for(decision, activation, **given)
        elif runnable:  # the emulation: a kind without gemm1 (vLLM passes none) leaves the swigluoai op's own
            swiglu = {**gemm1_constants(decision), **{k: float(v) for k, v in given.items() if v is not None}}
        else:
            swiglu = {}
        assembly = kernel_assembly(oracle, decision, question, max_num_batched_tokens=max_num_batched_tokens)
        return cls(assembly=assembly, decision=decision, scenario=question, num_experts=num_experts,
                   hidden_size=hidden_size, intermediate_size=intermediate_size, top_k=top_k, activation=activation,
                   gate_up=gate_up, has_bias=has_bias, renormalize=renormalize, swiglu=swiglu, device=device,
                   oracle=oracle)

    def param_specs(self, has_bias: bool) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """name -> (shape, dtype) of every parameter at the decision's rounded sizes (vLLM's names)."""
        e, h, i, fmt = self.num_experts, self.padded_hidden_size, self.padded_intermediate_size, self.weight_format
        block = formats.MX_BLOCK_SIZE
        specs = {"w13_weight": ((e, 2 * i, _packed_cols(fmt, h)), torch.uint8),
                 "w13_weight_scale": ((e, 2 * i, h // block), torch.uint8),
                 "w2_weight": ((e, h, _packed_cols(fmt, i)), torch.uint8),
                 "w2_weight_scale": ((e, h, i // block), torch.uint8)}
        if has_bias:
            specs.update(w13_bias=((e, 2 * i), torch.float32), w2_bias=((e, h), torch.float32))
        if self.static_input_scales:
            specs.update(w13_input_scale=((e,), torch.float32), w2_input_scale=((e,), torch.float32))
        return specs

    # ------------------------------------------------------------------ loading
    def _checkpoint_shape(self, name: str) -> tuple[int, ...]:
        e, h, i, fmt = self.num_experts, self.hidden_size, self.intermediate_size, self.weight_format
        block = formats.MX_BLOCK_SIZE
        return {"w13_weight": (e, 2 * i, _packed_cols(fmt, h)), "w13_weight_scale": (e, 2 * i, h // block),
                "w2_weight": (e, h, _packed_cols(fmt, i)), "w2_weight_scale": (e, h, i // block),
                "w13_bias": (e, 2 * i), "w2_bias": (e, h), "w13_input_scale": (e,), "w2_input_scale": (e,)}[name]

    def load_weights(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy unpadded checkpoint tensors (vLLM names, w13 rows in `gate_up` order) into the padded parameters."""
        if self._processed:
            _fail(RuntimeError, "load_weights after process_weights_after_loading; create a new layer")
        for name, value in tensors.items():
            if name not in self.params:
                _fail(KeyError, f"{name!r} is not a parameter of scheme {self.scheme} here; expected one of "
                      f"{sorted(self.params)}")
            param = self.params[name]
            shape = self._checkpoint_shape(name)
            if not isinstance(value, torch.Tensor) or value.dtype != param.dtype or tuple(value.shape) != shape:
                got = (f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor)
                       else type(value).__name__)
                _fail(ValueError, f"{name} must be {param.dtype} of shape {shape} (the checkpoint's unpadded "
                      f"E={self.num_experts}, H={self.hidden_size}, I={self.intermediate_size}), got {got}")
            value = value.to(self.device)
            cols = (slice(None, value.shape[2]),) if value.dim() == 3 else ()  # packed K: zero bytes = zero codes
            if name.startswith("w13") and value.dim() > 1 and self.gate_up == "contiguous":  # [w1; w3] halves
                inter, padded = self.intermediate_size, self.padded_intermediate_size
                param[(slice(None), slice(None, inter), *cols)] = value[:, :inter]
                param[(slice(None), slice(padded, padded + inter), *cols)] = value[:, inter:]
            elif value.dim() > 1:  # interleaved pairs and w2 rows: padding appends rows
                param[(slice(None), slice(None, value.shape[1]), *cols)] = value
            else:
                param.copy_(value)
            self._loaded.add(name)

    # ------------------------------------------------------------------ post-processing
    def process_weights_after_loading(self) -> None:
        """Static input scales -> one max over experts (fnuz: ×2); then the backend's converter, or none."""
        if self._processed:
            return
        if self.static_input_scales:
            self._reduce_static_input_scales()
        require_runnable(self._oracle, self.decision, self.scenario, assembly=self.assembly)
        if self.decision.converter is not None:
            self._kernel_layer = self._kernel_layer_from_decision()
        elif self.quant_config_kind is not None:
            self.quant_config = self._emulated_quant_config()
        self._processed = True

    def _emulated_quant_config(self) -> dict[str, Any]:
        """vLLM's get_fused_moe_quant_config on EMULATION: the rules' kind for the scheme, with the processed static
        input scales as a1/a2 where the kind takes them; NotImplementedError where the rules say vLLM builds none."""
        scales = ((self.params["w13_input_scale"], self.params["w2_input_scale"]) if self.static_input_scales
                  else None)
        try:
            return build_layer_quant_config(self.decision, weight_format=self.weight_format,
                                            experts=self.num_experts, device=self.device, activation=self.activation,
                                            input_scales=scales)
        except NotImplementedError as exc:
            _fail(NotImplementedError, f"OCP MX scheme {self.scheme} has no fused-MoE quant config under profile "
                  f"{self.decision.profile!r}: {exc} (rules: {self._quant_config_rule()}). "
                  f"{self._profile_that_builds_it()}")
        raise AssertionError("unreachable")  # _fail raises

    def _quant_config_rule(self) -> str:
        """file:line of the policy's `quant_config` selection that chose the kind (or of the backend's kind)."""
        policy = self._oracle.table(self.decision.profile).policies.get(self.decision.policy)
        if policy is not None and policy.quant_config is not None:
            return policy.quant_config.at
        backend = policy.family.by_value.get(self.decision.backend) if policy is not None else None
        return backend.at if backend is not None else "?"

    def _profile_that_builds_it(self) -> str:
        """Advice: the default profile, when its rules build (and run) a kind for this layer."""
        if self.decision.profile == DEFAULT_PROFILE:
            return "Give the scheme a buildable kind in this profile's rules to run it."
        other = self._oracle.select({**self.scenario, "profile": DEFAULT_PROFILE})
        kind = other.quant_config
        refused = kind and (kind.get("not_implemented") or (kind.get("emulated_activation") or {}).get(
            "not_implemented"))
        if other.outcome == "selected" and other.runner is not None and kind and not refused:
            return (f"Profile {DEFAULT_PROFILE!r} builds it (kind {kind['kind']!r} on {other.backend}): create the "
                    f"layer with profile={DEFAULT_PROFILE!r}.")
        return "No quant config is built for it by the default profile either."

    def _reduce_static_input_scales(self) -> None:
        fnuz = platform_fp8_dtype(self.scenario["platform"]) == torch.float8_e4m3fnuz
        for name in ("w13_input_scale", "w2_input_scale"):
            if name not in self._loaded:
                _fail(ValueError, f"QuantConfig has static quantization, but found activation scales are None: "
                      f"{name} was not loaded; load the checkpoint's per-expert input scales with load_weights")
            scales = self.params[name]
            if not torch.all(scales == scales[0]):
                logger.warning("%s: the static input scales differ across experts (min %g, max %g); using their max "
                               "for all experts", name, scales.min().item(), scales.max().item())
            reduced = scales.max()
            if fnuz:  # the values an FP8 kernel will see are e4m3fnuz: same bits, half the value
                reduced = reduced * 2.0
            self.params[name] = reduced

    def _kernel_layer_from_decision(self) -> MoELayer:
        """A MoELayer over the padded MXFP4 parameters for a backend with a converter (e.g. TRITON_MOE)."""
        d = self.decision
        kind = self.scenario["platform"].get("kind")
        if kind not in _DEVICE_KINDS[self.device.type]:
            _fail(ValueError, f"{d.backend} was chosen for platform {kind!r} but the layer is on {self.device}; "
                  f"create it without platform= to detect it, or with device= on that platform")
        if self.weight_format != "mxfp4":
            _fail(LayerUnavailableError, f"{d.backend} was selected for {self.scheme}, but converters take MXFP4 "
                  f"weights only")
        p = self.params
        scales = {}
        if self.static_input_scales:  # already one max over experts: every expert (and w1, w3) gets it
            e = self.num_experts
            scales = {"w13_input_scale": p["w13_input_scale"].float().reshape(1, 1).expand(e, 2).contiguous(),
                      "w2_input_scale": p["w2_input_scale"].float().reshape(1).expand(e).contiguous()}
        weights = MoEWeights(format="mxfp4", w13=p["w13_weight"], w13_scale=p["w13_weight_scale"], w2=p["w2_weight"],
                             w2_scale=p["w2_weight_scale"], gate_up=self.gate_up, w13_bias=p.get("w13_bias"),
                             w2_bias=p.get("w2_bias"), **scales)
        kernel_weights, runner = build_runner(d, weights, hidden=weights.H, inter=weights.I,
                                              activation=self.activation, top_k=self.top_k,
                                              renormalize=self.renormalize, swiglu=self.swiglu,
                                              assembly=self.assembly)
        return MoELayer(decision=d, scenario=self.scenario, weights=weights, kernel_weights=kernel_weights,
                        runner=runner, top_k=self.top_k, renormalize=self.renormalize, activation=self.activation,
                        device=weights.w13.device, assembly=self.assembly)

    def kernel_variants(self) -> dict[str, Any]:
        """The decision's kernel and how it assembles (see `assembly`): monolithic (routing inside the kernel) or
        modular (prepare -> experts -> finalize), and the backend's variants in the rules' order."""
        a = self.assembly
        if a is None:
            return {"backend": self.decision.backend, "kernel": self.decision.kernel, "monolithic": None,
                    "variants": None}
        return {"backend": a.backend, "kernel": a.kernel, "monolithic": a.monolithic,
                "variants": [{"kernel": k, "monolithic": m} for k, m in a.variants] or None}

    # ------------------------------------------------------------------ apply
    def forward(self, x: torch.Tensor, router_logits: torch.Tensor | None = None, *,
                topk_ids: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
        """y [T, H] in x.dtype; route with router_logits [T, E] or topk_ids + topk_weights [T, top_k]."""
        if not self._processed:
            _fail(RuntimeError, "call process_weights_after_loading() before forward")
        check_input(x, self.hidden_size, self.device, _fail)
        pad = self.padded_hidden_size - self.hidden_size
        xp = F.pad(x, (0, pad)) if pad else x
        if self._kernel_layer is not None:
            y = self._kernel_layer.forward(xp, router_logits, topk_ids=topk_ids, topk_weights=topk_weights)
        else:
            ei, p = self.emulated_inputs, self.params
            if ei.not_implemented:
                _fail(NotImplementedError, f"OCP MX scheme {self.scheme} under profile {self.decision.profile!r}: "
                      f"vLLM's emulation fails at forward: {ei.not_implemented} (rules: kind "
                      f"{self.quant_config_kind['kind']!r}, {self._quant_config_rule()}). "
                      f"{self._profile_that_builds_it()}")
            y = moe_forward(xp, w13=p["w13_weight"], w13_scale=p["w13_weight_scale"], w2=p["w2_weight"],
                            w2_scale=p["w2_weight_scale"], w13_bias=p.get("w13_bias"), w2_bias=p.get("w2_bias"),
                            router_logits=router_logits, topk_ids=topk_ids, topk_weights=topk_weights,
                            top_k=self.top_k, renormalize=self.renormalize, format=self.weight_format,
                            activation=self.activation, gate_up_layout=self.gate_up,
                            gemm_input_schemes=(ei.gemm1, ei.gemm2), a1_scale=p.get("w13_input_scale"),
                            a2_scale=p.get("w2_input_scale"), fp8_dtype=platform_fp8_dtype(self.scenario["platform"]),
                            **self.swiglu)
        return y[:, :self.hidden_size].contiguous() if pad else y

    __call__ = forward

    def __repr__(self) -> str:
        d = self.decision
        kind = self.quant_config_kind["kind"] if self.quant_config_kind else None
        return (f"<QuarkOCPMXMoE {self.scheme} E={self.num_experts} H {self.hidden_size}->{self.padded_hidden_size} "
                f"I {self.intermediate_size}->{self.padded_intermediate_size}: profile {d.profile} -> {d.backend} "
                f"(emulate={self.emulate}, static_input_scales={self.static_input_scales}, quant_config={kind})>")


def _question(oracle, quant_config, *, profile, platform, packages, env, num_experts, hidden_size, intermediate_size,
              top_k, activation, has_bias, renormalize) -> dict:
    """The scenario of this layer: the moe block and the Quark config as the `ocp-mx` policy reads it."""
    if not isinstance(quant_config, Mapping) or not isinstance(quant_config.get("weight"), Mapping):
        _fail(TypeError, f"quant_config must be a Quark layer config mapping with a 'weight' mapping (and "
              f"'input_tensors' or None), got {quant_config!r}")
    inputs = quant_config.get("input_tensors")
    if inputs is not None and not isinstance(inputs, Mapping):
        _fail(TypeError, f"quant_config['input_tensors'] must be a mapping or None, got {inputs!r}")
    quark = {"weight": {k: quant_config["weight"][k] for k in _WEIGHT_KEYS if k in quant_config["weight"]},
             "input": {k: inputs[k] for k in _INPUT_KEYS if k in inputs} if inputs else {}}
    return question_for(oracle, policy=POLICY, profile=profile, platform=platform, packages=packages, env=env, moe={
        "activation": activation, "is_act_and_mul": True, "routing_method": "Renormalize" if renormalize else "Default",
        "hidden_size": hidden_size, "intermediate_size": intermediate_size, "num_experts": num_experts,
        "top_k": top_k, "has_bias": has_bias}, quark=quark)
