"""vLLM plugin: vLLM's own MoE backend selectors answer from moe-oracle's rule tables.

Registered under vLLM's `vllm.general_plugins` entry point (pyproject.toml), so vLLM calls
`register()` in every process it starts. It does nothing unless the operator opts in:

    MOE_ORACLE_RULES=vllm-0.33          # a shipped profile, or
    MOE_ORACLE_RULES=/etc/moe-rules     # a rules directory with a profiles.yaml
    MOE_ORACLE_PROFILE=my-profile       # optional: the profile inside that directory

Without MOE_ORACLE_PROFILE a directory answers with the profile named after the running vLLM
release (vllm-0.20 under vLLM 0.20.x, vllm-0.33 under 0.33.x; `vllm_releases.RELEASES`) when it
has one, else with its default profile (and a warning). A profile for another release is
allowed but warned about; a backend that release lacks is refused at selection.

Then every selector of the running vLLM release (RELEASES) is replaced, in the module that
defines it and in every vLLM module that imported it by name (at once if vLLM has imported it,
else the moment vLLM does), by a wrapper with vLLM's signature that builds the
oracle's scenario from vLLM's own objects (FusedMoEConfig, current_platform, the package
probes, the VLLM_* environment), asks the oracle and returns vLLM's enum member and experts
class; a refusal raises vLLM's exception type with the oracle's message. Each distinct
decision is logged once under the `moe_oracle` logger with the rule file and step that made it,
by oracle.log.DecisionLog (the servers' log) with the selector as the caller label.

vLLM is imported only inside these functions: importing `oracle` never needs it. What vLLM's
experts classes probe beyond "installed" (FlashInfer's sub-modules and its Situ activation type) is
read through vLLM's own probes into the scenario's `flashinfer:` facts.
Known gaps (warned once at run time): no router-logits dtype, hash routing or decomposed-backend
requirement in the scenario.

Cost per call: what a decision depends on (platform, probes, the environment variables the profile
declares, layer config, keys) is read as vLLM reads it on every call, but a question already asked
since install is answered from a per-install cache keyed by those inputs (the answer is a pure
function of them), so it is not built, validated or selected again (benchmarks/bench_vllm_plugin.py).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import inspect
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import OracleError
from ..log import DecisionLog
from ..log import logger as log
from .vllm_releases import RELEASES, RULES_ENV, Release, Selector, release_for
from .vllm_scenario import (
    build_scenario,
    env_of,
    moe_of,
    platform_of,
    quant_key_name,
    to_vllm_answer,
)

__all__ = ["RELEASES", "RULES_ENV", "PROFILE_ENV", "Release", "Selector", "install", "register", "release_for",
           "uninstall"]

PROFILE_ENV = "MOE_ORACLE_PROFILE"


@dataclass
class _Active:
    oracle: Any
    profile: str
    source: str
    release: Release
    decisions: DecisionLog = field(default_factory=DecisionLog)  # one per install: a new install logs anew
    # the inputs of one call (_call_key) -> vLLM's answer; per install, so new rules answer anew
    answers: dict = field(default_factory=dict)
    env_names: tuple[str, ...] | None = None  # the env vars the profile declares: the only ones a decision reads
    env_keys: tuple[bytes, ...] = ()          # the same, as os.environ stores them (POSIX)


_ANSWERS_KEPT = 4096  # distinct questions cached per install (a model asks a handful); beyond: start over


_active: _Active | None = None
_lock = threading.RLock()


# ------------------------------------------------------------------ entry point, install, uninstall
def register() -> None:
    """vLLM's plugin hook: opt-in through MOE_ORACLE_RULES; without it, nothing happens."""
    spec = os.environ.get(RULES_ENV, "").strip()
    if spec:
        install(spec, os.environ.get(PROFILE_ENV, "").strip() or None)


def install(rules: str | Path, profile: str | None = None) -> _Active:
    """Route this process's vLLM selectors through the oracle (idempotent; re-installing swaps rules)."""
    global _active
    import vllm

    release = release_for(vllm.__version__)
    oracle, chosen, source = open_rules(str(rules), profile, release)
    _ensure_log_output()
    with _lock:
        loaded = [sel for sel in release.selectors if sel.module in sys.modules]
        targets = [(sel, *_target(sel)) for sel in loaded]  # refuses before anything is patched
        _active = _Active(oracle, chosen, source, release)
        patched = [where for target in targets for where in _patch(*target)]
        for sel in release.selectors:
            if sel not in loaded:  # not imported yet: patched the moment vLLM imports it, so opting in costs no import
                _ON_IMPORT.expect(sel)
                patched.append(f"{sel.module}.{sel.name} (on import)")
    log.info("moe-oracle plugin active for vLLM %s: rules %s, profile %s; patched %s",
             vllm.__version__, source, chosen, ", ".join(patched))
    return _active


def uninstall() -> None:
    """Give every patched name its original vLLM function back."""
    global _active
    with _lock:
        _ON_IMPORT.waiting.clear()
        if _ON_IMPORT in sys.meta_path:
            sys.meta_path.remove(_ON_IMPORT)
        if _active is None:
            return
        for sel in _active.release.selectors:
            module = sys.modules.get(sel.module)
            current = getattr(module, sel.name, None) if module else None
            original = getattr(current, "__wrapped__", None)
            if original is not None:
                _rebind(current, original)
        _active = None


def open_rules(spec: str, profile: str | None, release: Release):
    """(Oracle, profile, description) for MOE_ORACLE_RULES: a rules directory or a shipped profile."""
    import oracle

    path = Path(spec).expanduser()
    if path.is_dir():
        engine = oracle.Oracle(path)
        source = str(path.resolve())
    else:
        engine = oracle.default_oracle()
        shipped = engine.profiles()
        if spec not in shipped:
            raise RuntimeError(f"{RULES_ENV}={spec!r} is neither a rules directory nor a shipped profile; "
                               f"give a directory holding profiles.yaml, or one of: {', '.join(shipped)}")
        source, profile = "the shipped rules", profile or spec
    known = engine.profiles()
    if profile is None:
        profile = release.profile if release.profile in known else engine.default_profile
    if profile not in known:
        raise RuntimeError(f"{PROFILE_ENV}={profile!r}: no such profile in {source}; known: {', '.join(known)}")
    if profile != release.profile:
        log.warning("moe-oracle: profile %s answers for vLLM %s.x (its own profile is %s); "
                    "backend names the running vLLM lacks are refused at selection", profile,
                    release.series, release.profile)
    for sel in release.selectors:  # fail at start-up, not at the first MoE layer, when a policy is missing
        probe = engine.select({"policy": sel.policy, "profile": profile, "platform": {"kind": "cpu"}})
        if probe.outcome == "error":
            raise RuntimeError(f"rules {source}, profile {profile} cannot answer vLLM's {sel.name}: {probe.error}")
    return engine, profile, source


def _target(sel: Selector) -> tuple[Any, Callable]:
    """(defining module, vLLM's function) of a selector, checked against the name and signature expected."""
    module = importlib.import_module(sel.module)
    current = getattr(module, sel.name, None)
    if current is None:
        raise RuntimeError(f"this vLLM has no {sel.module}.{sel.name}, which the plugin patches; "
                           "it differs from the release the plugin supports")
    original = getattr(current, "__wrapped__", current) if hasattr(current, "_moe_oracle_selector") else current
    params = tuple(inspect.signature(original).parameters)
    if params != ("config", *sel.key_args):
        raise RuntimeError(f"this vLLM's {sel.name} takes ({', '.join(params)}), but the plugin answers "
                           f"({', '.join(('config', *sel.key_args))}); it differs from the release the plugin supports")
    return module, current


def _patch(sel: Selector, module: Any, current: Callable) -> list[str]:
    """Replace `sel.name` in its defining module and wherever vLLM bound the original."""
    if getattr(current, "_moe_oracle_selector", None) is not None:
        return [f"{sel.name} (already)"]
    wrapper = _wrapper(sel, module, current)
    return [f"{where}.{sel.name}" for where in _rebind(current, wrapper)]


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches a selector's module right after its code runs, before any caller can import the name."""

    def __init__(self) -> None:
        self.waiting: dict[str, list[Selector]] = {}
        self._finding = False

    def expect(self, sel: Selector) -> None:
        if sel not in self.waiting.setdefault(sel.module, []):
            self.waiting[sel.module].append(sel)
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def find_spec(self, fullname, path, target=None):
        if self._finding or fullname not in self.waiting:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, self.waiting.pop(fullname))
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: Any, selectors: list[Selector]):
        self.inner, self.selectors = inner, selectors

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        with _lock:
            if _active is not None:
                for sel in self.selectors:
                    _patch(sel, *_target(sel))

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, ...: the real loader's
        return getattr(self.inner, name)


_ON_IMPORT = _PatchOnImport()


def _rebind(old: Callable, new: Callable) -> list[str]:
    """Point every vLLM module attribute bound to `old` at `new`; the module names changed."""
    changed = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "vllm" or name.startswith("vllm.")):
            continue
        for attr, value in list(vars(module).items()):
            if value is old:
                setattr(module, attr, new)
                changed.append(name)
    return changed


# ------------------------------------------------------------------ the wrapper
def _wrapper(sel: Selector, module: Any, original: Callable) -> Callable:
    backend_enum = getattr(module, sel.enum)
    signature = inspect.signature(original)
    explicit_name = _active.release.explicit_kernel_classes if _active else None
    explicit = getattr(module, explicit_name, None) if explicit_name else None

    bind = _binder(signature)

    def select(*args, **kwargs):
        arguments = bind(args, kwargs)  # vLLM's own calling convention, defaults included
        config = arguments["config"]
        return _answer(sel, backend_enum, lambda member: _kernel_classes(module, explicit, member, config),
                       arguments)

    select.__signature__ = signature
    select.__name__ = select.__qualname__ = sel.name
    select.__module__ = sel.module
    select.__doc__ = f"moe-oracle: answers vLLM's {sel.name} from the rule tables (policy {sel.policy})."
    select.__wrapped__ = original
    select._moe_oracle_selector = sel
    return select


def _binder(signature: inspect.Signature) -> Callable[[tuple, dict], dict]:
    """(args, kwargs) -> arguments by name, defaults included, as signature.bind would give them; a plain
    positional-or-keyword signature is bound without inspect's per-call cost, anything else by inspect."""
    params = signature.parameters.values()
    names = tuple(p.name for p in params)
    defaults = {p.name: p.default for p in params if p.default is not p.empty}

    def general(args: tuple, kwargs: dict) -> dict:
        bound = signature.bind(*args, **kwargs)  # the TypeError vLLM's own function would raise, if any
        bound.apply_defaults()
        return dict(bound.arguments)

    if any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in params):
        return general

    def fast(args: tuple, kwargs: dict) -> dict:
        if len(args) > len(names):
            return general(args, kwargs)
        out = dict(zip(names, args, strict=False))  # fewer args than names: defaults below
        if kwargs:
            if any(k in out or k not in names for k in kwargs):
                return general(args, kwargs)
            out.update(kwargs)
        if len(out) < len(names):
            for name in names:
                if name not in out:
                    if name not in defaults:
                        return general(args, kwargs)
                    out[name] = defaults[name]
        return {name: out[name] for name in names}
    return fast


def _kernel_classes(module: Any, explicit: Callable | None, member: Any, config: Any) -> list:
    """The experts classes vLLM may return for `member`: its table's, then those only an explicit request adds."""
    classes = list(module.backend_to_kernel_cls(member))
    if explicit is not None:
        try:
            classes += [cls for cls in explicit(member, config) if cls not in classes]
        except ValueError:  # vLLM refuses that explicit request; the table's classes are all there is
            pass
    return classes


def _answer(sel: Selector, backend_enum: Any, kernel_classes: Callable, arguments: dict) -> tuple:
    from vllm.platforms import current_platform

    active = _active
    if active is None:  # uninstalled while a reference to the wrapper survived somewhere
        raise RuntimeError(f"moe-oracle plugin was uninstalled; call vLLM's original {sel.name}")
    release, config = active.release, arguments["config"]
    _warn_once_if_unexpressed(config)
    quant_keys = {k: _key_name(arguments[k]) for k in sel.key_args}
    if sel.user_key:
        quant_keys["user_activation_key"] = _key_name(_user_activation_key())
    platform = platform_of(current_platform, _gcn_arch, _has_amx if release.cpu_amx else None)
    packages = package_probes(release)
    features = flashinfer_features(release) if packages.get("flashinfer") else None
    moe = moe_of(config)
    key = _call_key(sel, platform, packages, features, _declared_env(active), moe, quant_keys)
    answer = active.answers.get(key)
    if answer is None:  # every VLLM_* variable goes into the question: a look-alike of a declared one is warned about
        scenario = build_scenario(policy=sel.policy, profile=active.profile, platform=platform, packages=packages,
                                  env=_vllm_env(), config=config, quant_keys=quant_keys, flashinfer=features)
        decision = _select_logged(sel, active, scenario)
        try:  # vLLM's answer is a function of the decision and the key (LoRA picks explicit kernel classes)
            answer = (to_vllm_answer(decision, backend_enum, kernel_classes, release.refusals_by_outcome), None)
        except (ValueError, NotImplementedError) as exc:
            answer = (None, exc)
        if len(active.answers) >= _ANSWERS_KEPT:
            active.answers.clear()
        active.answers[key] = answer
    value, refusal = answer
    if refusal is not None:
        raise type(refusal)(*refusal.args)  # a fresh exception per call, as vLLM raises
    return value


def _call_key(sel: Selector, platform: dict, packages: dict, features: dict | None, env: tuple, moe: dict,
              quant_keys: dict) -> tuple:
    """Everything the decision depends on, as one hashable tuple (mappings whose keys are fixed per selector and
    release contribute their values in order; env: the declared variables' values)."""
    parallel = moe["parallel"]
    return (sel.name, *(v if type(v) is not list else tuple(v) for v in platform.values()), len(platform),
            *packages.values(), features and tuple(features.values()), env,
            tuple(v for v in moe.values() if v is not parallel), tuple(parallel.values()),
            tuple(quant_keys.values()), len(moe))


def _declared_env(active: _Active) -> tuple:
    """The values of the environment variables the profile declares (None: unset), in a fixed order."""
    names = active.env_names
    if names is None:
        names = active.env_names = tuple(sorted(active.oracle.table(active.profile).env_vars))
        active.env_keys = tuple(os.fsencode(n) for n in names) if os.name == "posix" else ()
    data = getattr(os.environ, "_data", None)
    if active.env_keys and isinstance(data, dict):
        return tuple(data.get(k) for k in active.env_keys)
    return tuple(os.environ.get(n) for n in names)


def _vllm_env() -> dict[str, str]:
    """The VLLM_* environment as vLLM reads it, without decoding every other variable on each call."""
    data = getattr(os.environ, "_data", None)
    if os.name != "posix" or not isinstance(data, dict):
        return env_of(os.environ)
    return {os.fsdecode(k): os.fsdecode(v) for k, v in data.items() if k.startswith(b"VLLM_")}


# ------------------------------------------------------------------ vLLM's probes
def package_probes(release: Release) -> dict[str, bool]:
    """The scenario's packages, read from the probes this vLLM release's experts classes consult."""
    return {package: bool(p() if callable(p := getattr(module, attr)) else p)
            for package, (module, attr) in _probes(release.probes)}


def flashinfer_features(release: Release) -> dict[str, bool]:
    """The scenario's `flashinfer:` facts: what this release's FlashInfer feature probes answer for the installed
    FlashInfer (sub-modules present, the Situ activation type); asked only where flashinfer is installed."""
    return {feature: bool(getattr(module, attr)()) for feature, (module, attr) in _probes(release.flashinfer_features)}


_PROBE_HOMES: dict[tuple, list] = {}


def _probes(table: tuple[tuple[str, str], ...]) -> list[tuple[str, tuple[Any, str]]]:
    """(name, (module, attribute)) of a probe table; modules imported once, the attribute read on every call so
    that a probe vLLM (or a test) rebinds is the one asked."""
    found = _PROBE_HOMES.get(table)
    if found is None:
        found = []
        for name, where in table:
            module, attr = where.split(":")
            found.append((name, (importlib.import_module(module), attr)))
        _PROBE_HOMES[table] = found
    return found


def _has_amx() -> bool:
    """vLLM 0.33's CPU experts test: an x86 CPU with AMX tiles (called only on a CPU platform)."""
    import torch
    from vllm.platforms import current_platform
    from vllm.platforms.interface import CpuArchEnum

    return (current_platform.get_cpu_architecture() == CpuArchEnum.X86
            and bool(torch.cpu._is_amx_tile_supported()))


_CONFIG_API: tuple[Callable[[], Any], type] | None = None


def _user_activation_key() -> Any:
    """The user's MoE activation override (quantization_config.moe.activation), read as vLLM 0.33 reads it."""
    global _CONFIG_API
    if _CONFIG_API is None:  # vllm.config resolves names lazily, at a cost per `from` import: look them up once
        from vllm.config import get_current_vllm_config
        from vllm.config.quantization import QuantizationConfigArgs

        _CONFIG_API = (get_current_vllm_config, QuantizationConfigArgs)
    current, args_type = _CONFIG_API
    args = current().model_config.quantization_config
    if not isinstance(args, args_type) or args.moe is None:
        return None
    return args.moe.activation


# vLLM config fields the scenario cannot carry: (attribute, value that matters, what vLLM does with it).
_UNEXPRESSED = (("has_hash_routing", True, "kernels without hash-routing support refuse it"),
                ("require_decomposed_backend", True, "monolithic kernels refuse it"))


def _warn_once_if_unexpressed(config: Any) -> None:
    """Say so when vLLM's config holds a fact the scenario cannot carry and a kernel would read."""
    routing = getattr(config.routing_method, "name", "")
    if str(getattr(config, "router_logits_dtype", None)) == "torch.float32" and routing not in ("DeepSeekV3",
                                                                                                 "Simulated"):
        _warn_once(f"router_logits_dtype is float32 with {routing} routing; the rules cannot see the router dtype "
                   "(vLLM's TRTLLM NVFP4 monolithic kernel refuses float32 logits except with DeepSeekV3/Simulated "
                   "routing), so an NVFP4 choice may differ from vLLM's own here")
    for attr, value, effect in _UNEXPRESSED:
        if getattr(config, attr, None) is value:
            _warn_once(f"FusedMoEConfig.{attr} is {value} ({effect}); the rules cannot see it, so the choice may "
                       "differ from vLLM's own here")


_warned: set = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("moe-oracle: %s", message)


def _gcn_arch() -> str:
    """The ROCm arch string vLLM's own ROCm checks (on_mi3xx, supports_mx) read."""
    from vllm.platforms import rocm

    return rocm._GCN_ARCH


_KEY_NAMES: dict[str, Any] | None = None
_NAME_OF_KEY: dict[Any, str | None] = {None: None}


def _quant_key_names() -> dict[str, Any]:
    global _KEY_NAMES
    if _KEY_NAMES is None:
        from vllm.model_executor.layers.quantization.utils import quant_utils as q

        _KEY_NAMES = {n: v for n, v in vars(q).items() if n.startswith("k") and isinstance(v, q.QuantKey)}
    return _KEY_NAMES


def _key_name(key: Any) -> str | None:
    """quant_key_name, remembered per key value (QuantKey is a frozen dataclass: hashable)."""
    try:
        return _NAME_OF_KEY[key]
    except KeyError:
        name = _NAME_OF_KEY[key] = quant_key_name(key, _quant_key_names())
        return name
    except TypeError:  # an unhashable look-alike
        return quant_key_name(key, _quant_key_names())


# ------------------------------------------------------------------ provenance
def _select_logged(sel: Selector, active: _Active, scenario: dict) -> Any:
    """The oracle's answer, each distinct decision logged once with the selector that asked."""
    try:
        prepared = active.oracle.prepare(scenario)
    except OracleError:
        return active.oracle.select(scenario)  # the `error` answer; vLLM gets it as its exception, nothing to log
    decision = active.oracle.select(prepared)
    active.decisions.record(prepared, decision, caller=f"vLLM's {sel.name}")
    return decision


def _ensure_log_output() -> None:
    """Make the provenance lines visible when nobody configured logging for `moe_oracle`."""
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [moe_oracle] %(message)s"))
        log.addHandler(handler)
        log.propagate = False
