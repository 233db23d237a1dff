"""`MoELayer`: checkpoint tensors in, MoE output out, through the oracle's decision.

    MoEWeights ─┐
    platform (detected from the device, or given), packages, env ─> scenario ─oracle(profile)─> Decision
                └─ Decision.converter (padded to the decision's sizes, converted ONCE) ─> KernelWeights
                (``converter: null``: the checkpoint padded to those sizes, a MoEWeights)
    Decision.runner.prepare(RunnerSpec, weights) ─> Runner          (once, at build)
    x, router_logits | topk_ids + topk_weights ─ Runner.apply(x, Routing) ─> y [T, H]   (per batch)

The rules name the code (`converter`, `runner` as `module:attr`, resolved only through
`oracle.registry`); this module never names a backend. Every runner follows the one protocol of
`backends.runners.base`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from backends.assembly import KernelAssembly, describe_assembly, kernel_assembly
from backends.emulation import GATED_ACTIVATIONS
from backends.layouts.quant_config import build_quant_config, gemm1_constants
from backends.runners.base import Routing, Runner, RunnerSpec, RunnerUnavailableError
from backends.weights import MoEWeights
from oracle import OracleError, default_oracle
from oracle.decision import describe_quant_config
from oracle.log import LOGGER_NAME, DecisionLog
from oracle.platform import detect_packages, detect_platform, env_snapshot
from oracle.registry import RegistryError, resolve
from oracle.trace import render_lines

__all__ = ["DEFAULT_PROFILE", "LayerUnavailableError", "MoELayer", "build_runner", "check_input",
           "checkpoint_policies", "checkpoint_policy", "convert_with_quant_config", "platform_for_device",
           "question_for", "require_runnable", "resolve_named", "select_logged", "swiglu_for"]

logger = logging.getLogger(LOGGER_NAME)

DEFAULT_PROFILE = "moe-oracle"
#: The layer's checkpoints are W4A16: the scenario's weight key by format, activations unquantized.
_WEIGHT_KEY = {"mxfp4": "kMxfp4Static", "nvfp4": "kNvfp4Static"}
#: torch device type -> platform kinds the rules may describe it as
_DEVICE_KINDS = {"cpu": ("cpu",), "cuda": ("cuda", "rocm"), "xpu": ("xpu",)}
_ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

#: INFO once per distinct decision (layer 0 and layer 47 of one model are one line), as servers log them
_decision_log = DecisionLog()


class LayerUnavailableError(RuntimeError):
    """The rules select nothing this project can run for this layer here; the message names what can.

    `decision` and `assembly` (when known) are the full answer: what vLLM would run and how it is assembled."""

    def __init__(self, message: str, *, decision=None, assembly: KernelAssembly | None = None):
        super().__init__(message)
        self.decision = decision
        self.assembly = assembly


def _fail(kind, message: str):
    raise kind(f"MoELayer: {message}")


def _platform_text(platform: Mapping[str, Any]) -> str:
    kind = platform.get("kind", "?")
    if "capability" in platform:
        return f"{kind} {'.'.join(str(c) for c in platform['capability'])}"
    return f"{kind} {platform['gcn_arch']}" if "gcn_arch" in platform else str(kind)


def resolve_named(path: str, role: str, decision) -> Any:
    try:
        return resolve(path)
    except RegistryError as exc:
        raise LayerUnavailableError(f"MoELayer: the {role} of {decision.backend} (profile {decision.profile}) cannot "
                                    f"be loaded: {exc}") from exc
    except ImportError as exc:  # the module exists but a package it needs (e.g. triton) does not
        raise LayerUnavailableError(f"MoELayer: the {role} {path} of {decision.backend} cannot be imported here "
                                    f"({exc}); install the missing package or pick a profile that does not need "
                                    f"it") from exc


def _moved(weights: MoEWeights, device: torch.device) -> MoEWeights:
    """The same checkpoint on `device` (a no-op when it is there already)."""
    if weights.w13.device == device:
        return weights
    return weights.replace(**{name: getattr(weights, name).to(device) for name in weights.__dataclass_fields__
                              if isinstance(getattr(weights, name), torch.Tensor)})


class MoELayer:
    """One MoE layer bound to the backend the oracle selected; build it with `from_checkpoint`."""

    def __init__(self, *, decision, scenario: Mapping[str, Any], weights: MoEWeights, kernel_weights,
                 runner: Runner, top_k: int, renormalize: bool, activation: str, device: torch.device,
                 assembly: KernelAssembly | None = None):
        self.decision = decision
        self.assembly = assembly  # how the rules assemble the kernel (monolithic/modular, batched, in place)
        self.scenario = dict(scenario)
        self.format = weights.format
        self.num_experts, self.hidden_size, self.intermediate_size = weights.E, weights.H, weights.I
        self.padded_hidden_size = decision.hidden_size or weights.H
        self.padded_intermediate_size = decision.intermediate_size or weights.I
        self.top_k, self.renormalize, self.activation = top_k, renormalize, activation
        self.device = device
        self.kernel_weights = kernel_weights  # what the runner was prepared from (see build_runner)
        self.runner = runner

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_checkpoint(cls, weights: MoEWeights, *, activation: str, top_k: int, profile: str = DEFAULT_PROFILE,
                        platform: Mapping[str, Any] | None = None, device: Any = None, renormalize: bool = True,
                        swiglu_alpha: float | None = None, swiglu_beta: float | None = None,
                        swiglu_limit: float | None = None,
                        policy: str | None = None, moe_backend: str = "auto",
                        packages: Mapping[str, bool] | None = None, env: Mapping[str, str] | None = None,
                        deterministic: bool = False, max_num_batched_tokens: int | None = None,
                        activation_key: str | None = None, oracle=None) -> MoELayer:
        """Select a backend for these weights here, pad and convert them once, bind the runner.

        weights: a `backends.weights.MoEWeights` (gpt-oss interleaved or generic contiguous; MXFP4/NVFP4).
        activation: a gated activation (swigluoai for gpt-oss, silu, ...); top_k: experts per token.
        profile: the rules profile (default: this project's own, whose backends all run here).
        platform: a scenario platform mapping ({"kind": "cuda", "capability": [9, 0]}); default: detected
        for `device`. device: where the layer runs (default: where the weights are; they are moved).
        renormalize: True = top-k on logits then softmax over the k (gpt-oss); False = softmax then top-k.
        swiglu_alpha / swiglu_beta / swiglu_limit: override the gemm1 constants of the backend's quant-config
        kind in the rules (gpt-oss: 1.702, 1.0, 7.0); None takes the rules' value.
        policy / moe_backend / packages / env: override what the question asks (defaults: the
        checkpoint's policy, auto, the packages installed and the rules' env vars as set here).
        max_num_batched_tokens: the scheduler's token budget, the batched format's max tokens per rank (default:
        the rules'). activation_key: the activations the checkpoint (or user) asks, e.g. 'kMxfp8Dynamic' or
        'kFp8StaticTensorSym' for FP8 (W4A8, docs/w4a8.md); None = BF16 (W4A16). oracle: an `oracle.Oracle` over
        other rules (default: the shipped rules).
        A backend this project cannot run raises LayerUnavailableError carrying the decision and its assembly.
        """
        if not isinstance(weights, MoEWeights):
            _fail(TypeError, f"weights must be a backends.weights.MoEWeights, got {type(weights).__name__}; build "
                  f"one from the checkpoint tensors (MoEWeights(format=..., w13=..., w13_scale=..., ...))")
        if activation not in GATED_ACTIVATIONS:
            _fail(ValueError, f"activation={activation!r} must be one of {GATED_ACTIVATIONS} (MoEWeights holds gated "
                  f"experts: gate and up rows in w13)")
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= weights.E:
            _fail(ValueError, f"top_k={top_k!r} must be an int in [1, {weights.E}] (the layer has {weights.E} "
                  f"experts); pass the model's experts per token")
        if not isinstance(renormalize, bool):
            _fail(TypeError, f"renormalize={renormalize!r} must be True or False")
        try:
            device = weights.w13.device if device is None else torch.device(device)
        except (RuntimeError, TypeError) as exc:
            _fail(ValueError, f"device={device!r} is not a torch device ({exc}); pass e.g. 'cpu' or 'cuda:0'")
        if device.type not in _DEVICE_KINDS:
            _fail(ValueError, f"device={str(device)!r}: a layer runs on {', '.join(_DEVICE_KINDS)} devices")
        if device.type == "cuda" and not torch.cuda.is_available():
            _fail(RuntimeError, f"device={str(device)!r}, but torch finds no CUDA device on this machine (torch "
                  f"{torch.__version__}, CUDA build: {torch.version.cuda or 'none'}); run on a machine with a GPU "
                  f"and a CUDA build of torch, or pass device='cpu'")
        platform_detected = platform is None
        if platform is None:
            platform = platform_for_device(device)
        elif not isinstance(platform, Mapping):
            _fail(TypeError, f"platform={platform!r} must be a scenario platform mapping, e.g. "
                  f"{{'kind': 'cuda', 'capability': [9, 0]}}, or None to detect it")

        if oracle is None:
            oracle = default_oracle()
        chosen, served_by = (policy, None) if policy is not None else checkpoint_policy(oracle, profile, weights)
        question = _question(oracle, profile=profile, policy=chosen,
                             platform=platform, packages=packages, env=env, weights=weights, activation=activation,
                             top_k=top_k, renormalize=renormalize, moe_backend=moe_backend,
                             activation_key=activation_key)
        decision = select_logged(oracle, question)
        assembly = kernel_assembly(oracle, decision, question, max_num_batched_tokens=max_num_batched_tokens)
        require_runnable(oracle, decision, question, assembly=assembly, policies=served_by)
        if platform.get("kind") not in _DEVICE_KINDS[device.type]:
            if platform_detected:
                _fail(RuntimeError, f"device={str(device)!r}, but this machine was detected as {dict(platform)} "
                      f"(oracle.platform.detect_platform); pass platform= for the device, or device='cpu'")
            _fail(ValueError, f"platform={dict(platform)} does not describe device={str(device)!r}; the backend "
                  f"{decision.backend} was chosen for that platform but would run on this device. Drop platform= "
                  f"to detect it, or move the layer with device=")

        swiglu = swiglu_for(decision, activation, swiglu_alpha=swiglu_alpha, swiglu_beta=swiglu_beta,
                            swiglu_limit=swiglu_limit)
        weights = _moved(weights, device)
        device = weights.w13.device  # concrete: 'cuda' becomes 'cuda:0', which is what x.device reports
        kernel_weights, runner = build_runner(
            decision, weights, hidden=decision.hidden_size or weights.H,
            inter=decision.intermediate_size or weights.I, activation=activation, top_k=top_k,
            renormalize=renormalize, swiglu=swiglu, deterministic=deterministic, assembly=assembly)
        layer = cls(decision=decision, scenario=question, weights=weights, kernel_weights=kernel_weights,
                    runner=runner, top_k=top_k, renormalize=renormalize, activation=activation, device=device,
                    assembly=assembly)
        logger.debug("built %r", layer)
        return layer

    # ------------------------------------------------------------------ running
    def forward(self, x: torch.Tensor, router_logits: torch.Tensor | None = None, *,
                topk_ids: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
        """y [T, H] in x.dtype; route with router_logits [T, E], or pass topk_ids and topk_weights [T, top_k]."""
        tokens = self._check_x(x)
        routing = self._check_routing(tokens, router_logits, topk_ids, topk_weights)
        if tokens == 0:
            return x.new_zeros(0, self.hidden_size)
        pad = self.padded_hidden_size - self.hidden_size
        if pad:
            x = F.pad(x, (0, pad))
        y = self.runner.apply(x, routing)
        return y[:, :self.hidden_size].contiguous() if pad else y

    __call__ = forward

    def _check_x(self, x) -> int:
        return check_input(x, self.hidden_size, self.device, _fail)

    def _check_tensor(self, name: str, t, shape: tuple, floating: bool) -> None:
        kind = "floating" if floating else "integer"
        fix = ".float()" if floating else ".long()"
        if not isinstance(t, torch.Tensor):
            _fail(TypeError, f"{name} must be a {kind} torch.Tensor {shape}, got {type(t).__name__}")
        if t.dtype.is_floating_point != floating or t.dtype == torch.bool:
            _fail(TypeError, f"{name}.dtype={t.dtype} must be a {kind} dtype; convert with {name}{fix}")
        if tuple(t.shape) != shape:
            second = "experts" if name == "router_logits" else "top_k"
            _fail(ValueError, f"{name}.shape={tuple(t.shape)} must be {shape} = (tokens of x, {second} = "
                  f"{shape[1]}); pass the routing of these tokens")
        if t.device != self.device:
            _fail(ValueError, f"{name} is on {t.device} but the layer is on {self.device}; move it with "
                  f"{name}.to('{self.device}')")

    def _check_routing(self, tokens: int, router_logits, topk_ids, topk_weights) -> Routing:
        if router_logits is not None:
            if topk_ids is not None or topk_weights is not None:
                _fail(ValueError, "pass router_logits OR (topk_ids and topk_weights), not both")
            self._check_tensor("router_logits", router_logits, (tokens, self.num_experts), floating=True)
            return Routing(router_logits=router_logits)
        if topk_ids is None or topk_weights is None:
            _fail(ValueError, "pass router_logits [T, E], or both topk_ids and topk_weights [T, top_k]")
        self._check_tensor("topk_ids", topk_ids, (tokens, self.top_k), floating=False)
        self._check_tensor("topk_weights", topk_weights, (tokens, self.top_k), floating=True)
        return Routing(topk_ids=topk_ids, topk_weights=topk_weights)

    # ------------------------------------------------------------------ explaining
    def _summary(self) -> str:
        d = self.decision
        sizes = (f"H {self.hidden_size}->{self.padded_hidden_size}, "
                 f"I {self.intermediate_size}->{self.padded_intermediate_size}")
        return (f"MoELayer {self.format} E={self.num_experts} top_k={self.top_k} {self.activation} on {self.device}: "
                f"profile {d.profile}, policy {d.policy} -> {d.backend} / {d.kernel}; converter {d.converter or 'none'}"
                f", runner {d.runner}; {sizes}")

    def explain(self) -> str:
        """The layer and its question, then every step and candidate of the decision with the rule locations."""
        d, q = self.decision, self.scenario
        packages = ", ".join(name for name, present in sorted(q["packages"].items()) if present) or "(none)"
        env = ", ".join(f"{k}={v}" for k, v in sorted(q["env"].items())) or "(none)"
        lines = [self._summary(), f"platform {_platform_text(q['platform'])}   packages {packages}   env {env}",
                 "rules  " + ", ".join(d.rule_files)]
        if d.decided_by is not None:
            lines.append(f"decided by step '{d.decided_by.step}' at {d.decided_by.at}: {d.decided_by.why}")
        if d.converter is None and d.missing_why:
            lines.append(f"converter none ({d.missing_why})")
        if d.quant_config is not None:
            lines.append(describe_quant_config(d.quant_config))
        if self.assembly is not None:
            lines.append(describe_assembly(self.assembly))
        lines.append("")
        render_lines(d.trace, lines)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<{self._summary()}>"


# ---------------------------------------------------------------------- the rules' quant config
def swiglu_for(decision, activation: str, **given: float | None) -> dict[str, float]:
    """The SwiGLU keywords the runner gets: the gemm1 constants of the decision's quant-config kind (the rules),
    each replaced by a value given here. swigluoai needs all three; a kind without them is an error."""
    constants = {**gemm1_constants(decision), **{k: float(v) for k, v in given.items() if v is not None}}
    missing = [name for name in ("swiglu_alpha", "swiglu_beta", "swiglu_limit") if name not in constants]
    if activation == "swigluoai" and missing:
        kind = decision.quant_config["kind"] if decision.quant_config is not None else None
        _fail(ValueError, f"activation='swigluoai' needs {', '.join(missing)}: the quant-config kind {kind!r} of "
              f"{decision.backend} (profile {decision.profile}) gives no gemm1 constants for them; add `gemm1: "
              f"{{alpha: .., beta: .., clamp: ..}}` to that kind in the rules, or pass {missing[0]}=")
    return constants


def build_runner(decision, weights: MoEWeights, *, hidden: int, inter: int, activation: str, top_k: int,
                 renormalize: bool, swiglu: Mapping[str, float], deterministic: bool = False,
                 assembly: KernelAssembly | None = None) -> tuple[Any, Runner]:
    """(the weights the runner was prepared from, the prepared runner) for a decision with a runner: the rules'
    converter (or, with ``converter: null``, the checkpoint padded to hidden x inter), then the runner's one-time
    `prepare`. A refusal of the runner becomes LayerUnavailableError carrying the decision."""
    factory = resolve_named(decision.runner, "runner", decision)
    if not callable(getattr(factory, "prepare", None)):
        raise LayerUnavailableError(f"MoELayer: the runner {decision.runner} of {decision.backend} is not a runner "
                                    f"(it has no prepare(spec, weights)); name a class following the protocol of "
                                    f"backends/runners/base.py", decision=decision, assembly=assembly)
    if decision.converter is None:
        prepared = weights.pad(hidden, inter)
    else:
        prepared = convert_with_quant_config(decision, weights, activation, hidden, inter)
    spec = RunnerSpec(backend=decision.backend, profile=decision.profile, format=weights.format,
                      activation=activation, top_k=top_k, renormalize=renormalize, num_experts=weights.E,
                      hidden_size=weights.H, intermediate_size=weights.I, padded_hidden_size=hidden,
                      padded_intermediate_size=inter, device=weights.w13.device, swiglu=dict(swiglu),
                      deterministic=deterministic,
                      has_bias=weights.w13_bias is not None or weights.w2_bias is not None, decision=decision)
    try:
        runner = factory.prepare(spec, prepared)
    except RunnerUnavailableError as exc:
        raise LayerUnavailableError(f"MoELayer: {exc}", decision=decision, assembly=assembly) from exc
    return prepared, runner


def convert_with_quant_config(decision, weights: MoEWeights, activation: str, hidden: int, inter: int):
    """The decision's converter over the weights, with the quant config built from the rules' kind (none when
    the rules give the backend no kind)."""
    converter = resolve_named(decision.converter, "converter", decision)
    static = decision.quant_config is not None and decision.quant_config.get("input_scales") == "static"
    input_scales = (weights.static_input_scales(f"{decision.backend} (quant config {decision.quant_config['kind']})")
                    if static else None)
    quant_config = (None if decision.quant_config is None
                    else build_quant_config(decision, weights, activation=activation, input_scales=input_scales))
    return converter.convert(weights, hidden_size=hidden, intermediate_size=inter, quant_config=quant_config)


# ---------------------------------------------------------------------- the question and its answer
def check_input(x, hidden_size: int, device: torch.device, fail) -> int:
    """The token count of a layer input x [T, hidden_size] on `device`; `fail(kind, message)` names the layer."""
    if not isinstance(x, torch.Tensor):
        fail(TypeError, f"x must be a torch.Tensor [T, {hidden_size}], got {type(x).__name__}")
    if x.dim() != 2 or x.shape[1] != hidden_size:
        fail(ValueError, f"x.shape={tuple(x.shape)} must be (T, {hidden_size}) = (tokens, hidden size of the "
             f"checkpoint); flatten batch dims with x.reshape(-1, {hidden_size})")
    if x.dtype not in _ACTIVATION_DTYPES:
        fail(TypeError, f"x.dtype={x.dtype} must be one of {_ACTIVATION_DTYPES} (W4A16: activations stay "
             f"unquantized); convert with x.to(torch.bfloat16)")
    if x.device != device:
        fail(ValueError, f"x is on {x.device} but the layer is on {device}; move it with x.to('{device}')")
    return x.shape[0]


def platform_for_device(device: torch.device) -> dict:
    return {"kind": "cpu"} if device.type == "cpu" else detect_platform()


def question_for(oracle, *, policy: str, profile, platform: Mapping[str, Any], packages, env,
                 moe: Mapping[str, Any], **extra: Any) -> dict:
    """A layer's scenario mapping (the fields `moe-oracle select --scenario` reads): packages and env are
    detected for what the profile declares unless given. Shared by every layer kind (MoELayer, Quark)."""
    if not isinstance(profile, str):
        _fail(TypeError, f"profile={profile!r} must be a profile name; known: {', '.join(oracle.profiles())}")
    try:
        table = oracle.table(profile)
    except OracleError as exc:
        _fail(ValueError, f"profile={profile!r}: {exc}")
    return {
        "policy": policy, "profile": profile, "platform": dict(platform),
        "packages": dict(packages) if packages is not None else detect_packages(table.packages),
        "env": dict(env) if env is not None else env_snapshot(table.env_vars),
        "moe": dict(moe), **extra,
    }


def _question(oracle, *, profile, policy, platform, packages, env, weights: MoEWeights, activation, top_k,
              renormalize, moe_backend, activation_key: str | None = None) -> dict:
    """The scenario of a layer built from checkpoint weights (activation_key None: BF16 activations)."""
    return question_for(oracle, policy=policy, profile=profile, platform=platform, packages=packages, env=env, moe={
        "activation": activation, "is_act_and_mul": True, "moe_backend": moe_backend,
        "routing_method": "Renormalize" if renormalize else "Default",
        "hidden_size": weights.H, "intermediate_size": weights.I, "num_experts": weights.E, "top_k": top_k,
        "has_bias": weights.w13_bias is not None or weights.w2_bias is not None,
        "weight_key": _WEIGHT_KEY[weights.format], "activation_key": activation_key})


def select_logged(oracle, question: dict):
    """The oracle's answer, logged once per distinct decision."""
    try:
        scenario = oracle.prepare(question)
    except OracleError as exc:
        _fail(ValueError, f"the layer's question is malformed: {exc}")
    decision = oracle.select(scenario)
    _decision_log.record(scenario, decision)
    return decision


def checkpoint_policies(oracle, weights: MoEWeights) -> dict[str, str]:
    """profile -> the policy its rules name for this checkpoint's format and gate/up layout (checkpoint_policies),
    for every profile that names one."""
    out = {}
    for name in oracle.profiles():
        try:
            found = oracle.table(name).checkpoint_policies.get(weights.format, {}).get(weights.gate_up)
        except OracleError:
            continue
        if found is not None:
            out[name] = found
    return out


def checkpoint_policy(oracle, profile, weights: MoEWeights) -> tuple[str | None, dict[str, str]]:
    """(the policy `profile`'s rules name for this checkpoint, every profile's: checkpoint_policies); a known profile
    that names none raises LayerUnavailableError naming those that do (an unknown one is question_for's error)."""
    served_by = checkpoint_policies(oracle, weights)
    if profile not in served_by and profile in oracle.profiles():
        raise LayerUnavailableError(
            f"MoELayer: profile {profile!r} names no policy for {weights.format} checkpoints with "
            f"{weights.gate_up} gate/up rows (checkpoint_policies in its rules); pass policy=, or a profile "
            f"that does: {', '.join(served_by) or 'none'}")
    return served_by.get(profile), served_by


def require_runnable(oracle, decision, question: dict, *, assembly: KernelAssembly | None = None,
                     policies: Mapping[str, str] | None = None) -> None:
    """Raise LayerUnavailableError (carrying the decision and its assembly) unless the decision names a backend
    with a runner; say which profile can run."""
    where = (f"profile {question['profile']!r} (policy {question['policy']}, platform "
             f"{_platform_text(question['platform'])})")
    if decision.outcome != "selected" or decision.backend is None:
        problem = (f"{where} selects no backend: {decision.outcome}" +
                   (f": {decision.error}" if decision.error else ""))
    elif decision.runner is None:
        problem = (f"{where} selects {decision.backend} (kernel {decision.kernel}), which this project cannot run "
                   f"(not runnable here): "
                   f"{decision.missing_why or 'no runner'}")
    elif decision.activation_key is not None and not _runs_activation_key(decision):
        problem = (f"{where} selects {decision.backend}, which quantizes activations ({decision.activation_key}); "
                   f"its runner runs W4A16 (unquantized activations) only")
    else:
        return
    raise LayerUnavailableError(f"MoELayer: {problem}. {_who_can_run(oracle, question, policies)}", decision=decision,
                                assembly=assembly)


def _runs_activation_key(decision) -> bool:
    """Whether the decision's runner quantizes activations as asked: it declares the key (`activation_keys`) and the
    rules' quant-config kind quantizes to FP8 (mxfp8, or fp8 per tensor), the formats those runners implement."""
    factory = resolve_named(decision.runner, "runner", decision)
    kind = decision.quant_config or {}
    return decision.activation_key in getattr(factory, "activation_keys", ()) and kind.get("activation") in (
        "mxfp8", "fp8")


def _who_can_run(oracle, question: dict, policies: Mapping[str, str] | None = None) -> str:
    """The other profiles that select a backend with a runner for the same layer here, as advice; `policies`:
    each profile's own policy for the layer (checkpoint_policies), else the question's policy everywhere."""
    given = question["packages"]
    runnable = []
    for name in oracle.profiles():
        if name == question["profile"] or (policies is not None and name not in policies):
            continue
        try:
            known = oracle.table(name).packages
            packages = detect_packages(known - given.keys())
            packages.update({p: present for p, present in given.items() if p in known})
            other = dict(question, profile=name, packages=packages,
                         policy=policies[name] if policies is not None else question["policy"])
            d = oracle.select(oracle.prepare(other))
        except OracleError:
            continue
        if d.outcome == "selected" and d.runner is not None:
            runnable.append(f"profile={name!r} selects {d.backend} here")
    if not runnable:
        return "No profile of these rules selects a backend with a runner for this layer here."
    return "Runnable instead: " + "; ".join(runnable) + "."
