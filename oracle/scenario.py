"""Turn a scenario mapping (../spec contract) into a frozen, hashable Scenario.

Unknown fields, wrong types and out-of-range values raise ScenarioError naming the
field, what is expected and, for a misspelling, the close name.
"""
from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .errors import ScenarioError, did_you_mean
from .facts import CAPABILITY_RANGES, FACTS, PLATFORM_KINDS, RANGES
from .vocabulary import ACTIVATIONS, ALL2ALL_BACKENDS, ROUTING_METHODS

if TYPE_CHECKING:
    from .model import Table

_TOP = ("policy", "profile", "platform", "packages", "env", "moe", "quark", "query", "backend")
_PLATFORM = ("kind", "capability", "gcn_arch", "amx")
_MOE = tuple(k.split(".", 1)[1] for k in FACTS if k.startswith("moe.") and not k.startswith("moe.parallel."))
_PARALLEL = tuple(k.rsplit(".", 1)[1] for k in FACTS if k.startswith("moe.parallel."))
_QUARK = ("weight", "input", "input_dtype", "weight_dtype")
_QUARK_WEIGHT = tuple(k.rsplit(".", 1)[1] for k in FACTS if k.startswith("quark.weight."))
_QUARK_INPUT = tuple(k.rsplit(".", 1)[1] for k in FACTS if k.startswith("quark.input."))


class Scenario:
    """One normalized question. Immutable and hashable, so answers can be cached by it."""

    __slots__ = ("policy", "profile", "query", "backend", "facts", "env", "packages", "platform_given", "warnings",
                 "_key", "_hash")

    policy: str
    profile: str | None
    query: str
    backend: str | None
    facts: Mapping[str, Any]
    env: Mapping[str, str]
    packages: frozenset[str]
    platform_given: bool
    warnings: tuple[str, ...]  # e.g. an env var that looks like a declared one; not part of the key (env is)
    _key: tuple[Any, ...]
    _hash: int

    def __init__(self, policy: str, profile: str | None, query: str, backend: str | None, facts: dict[str, Any],
                 env: dict[str, str], packages: frozenset[str], platform_given: bool, warnings: tuple[str, ...] = ()):
        object.__setattr__(self, "policy", policy)
        object.__setattr__(self, "profile", profile)
        object.__setattr__(self, "query", query)
        object.__setattr__(self, "backend", backend)
        object.__setattr__(self, "facts", facts)
        object.__setattr__(self, "env", env)
        object.__setattr__(self, "packages", packages)
        object.__setattr__(self, "platform_given", platform_given)
        object.__setattr__(self, "warnings", warnings)
        key = (policy, profile, query, backend, tuple(facts.items()), tuple(sorted(env.items())), packages)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", hash(key))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Scenario is immutable")

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Scenario) and self._key == other._key

    def __repr__(self) -> str:
        return f"Scenario(policy={self.policy!r}, profile={self.profile!r}, query={self.query!r})"


def _fields(obj: Any, where: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    if obj is None:
        return {}
    if not isinstance(obj, Mapping):
        raise ScenarioError(f"{where}: expected a mapping, got {type(obj).__name__}")
    for key in obj:
        if key not in allowed:
            path = f"{where}.{key}" if where else str(key)
            raise ScenarioError(f"{path}: unknown field{did_you_mean(key, allowed)}; allowed: {', '.join(allowed)}")
    return obj


def _typed(value: Any, kind: str, where: str) -> Any:
    if kind == "bool":
        if not isinstance(value, bool):
            raise ScenarioError(f"{where}: expected true or false, got {value!r}")
    elif kind == "int" or kind == "int?" and value is not None:
        lo, hi = RANGES.get(where, (0, None))
        allowed = (f"an integer from {lo} to {hi}" if hi is not None else
                   "a non-negative integer" if lo == 0 else f"an integer >= {lo}")
        if not isinstance(value, int) or isinstance(value, bool):
            raise ScenarioError(f"{where}: expected {allowed}{' or null' if kind == 'int?' else ''}, got {value!r}")
        if value < lo or (hi is not None and value > hi):
            raise ScenarioError(f"{where}: {value} is out of range; allowed: {allowed}")
    elif kind in ("str", "choice"):
        if not isinstance(value, str):
            raise ScenarioError(f"{where}: expected a string, got {value!r}")
    elif kind == "str?":
        if value is not None and not isinstance(value, str):
            raise ScenarioError(f"{where}: expected a string or null, got {value!r}")
    elif kind == "bool?":
        if value is not None and not isinstance(value, bool):
            raise ScenarioError(f"{where}: expected true, false or null, got {value!r}")
    elif kind == "num?":
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0):
            raise ScenarioError(f"{where}: expected a non-negative number or null, got {value!r}")
    return value


def parse_scenario(raw: Any, table: Table, default_platform: Mapping[str, Any] | None = None,
                   strict: bool = False) -> Scenario:
    """Validate `raw` against the fact table and one compiled rule table (policies, queries, archs, packages).
    `strict`: a look-alike environment variable is an error instead of a warning."""
    top = _fields(raw, "", _TOP)
    if not isinstance(raw, Mapping):
        raise ScenarioError("scenario: expected a mapping with at least 'policy'")
    policy = top.get("policy")
    if not isinstance(policy, str):
        raise ScenarioError(f"policy: required; one of {', '.join(table.policies)}")
    if policy not in table.policies:
        raise ScenarioError(f"policy: unknown policy {policy!r}{did_you_mean(policy, table.policies)}; "
                            f"profile {table.name} has {', '.join(table.policies)}")
    profile = top.get("profile")
    if profile is not None and not isinstance(profile, str):
        raise ScenarioError(f"profile: expected a profile name string, got {profile!r}")
    query = top.get("query", "select")
    if query not in table.queries:
        raise ScenarioError(f"query: {query!r} is not a query{did_you_mean(query, table.queries)}; "
                            f"expected one of {', '.join(table.queries)}")
    backend = top.get("backend")
    if backend is not None and not isinstance(backend, str):
        raise ScenarioError(f"backend: expected a backend name string, got {backend!r}")
    if query == "round_up" and backend is None:
        raise ScenarioError("backend: the round_up query needs a backend name (or \"None\")")
    rocm_archs, packages_known = table.rocm_archs, table.packages

    facts: dict[str, Any] = {k: d for k, (_, d) in FACTS.items()}
    facts.update(table.policies[policy].defaults)
    platform_given = "platform" in top
    platform = _fields(top.get("platform") if platform_given else default_platform, "platform", _PLATFORM)
    kind = platform.get("kind", "cuda")
    if kind not in PLATFORM_KINDS:
        raise ScenarioError(f"platform.kind: {kind!r} is not a platform{did_you_mean(kind, PLATFORM_KINDS)}; "
                            f"expected one of {', '.join(PLATFORM_KINDS)}")
    facts["platform.kind"] = kind
    if kind == "cuda":
        cap = platform.get("capability", [9, 0] if not platform_given else None)
        if (not isinstance(cap, (list, tuple)) or len(cap) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in cap)):
            raise ScenarioError(f"platform.capability: expected [major, minor] for cuda, e.g. [9, 0]; got {cap!r}")
        for part, number, (lo, hi) in zip(("major", "minor"), cap, CAPABILITY_RANGES, strict=True):
            if not lo <= number <= hi:
                raise ScenarioError(f"platform.capability: {part} {number} of {list(cap)} is out of range; allowed: "
                                    f"{part} {lo} to {hi} (e.g. [9, 0] for sm_90, [10, 3] for sm_103)")
        facts["platform.capability"] = (cap[0], cap[1])
        if "gcn_arch" in platform:
            raise ScenarioError("platform.gcn_arch: only for kind rocm")
    elif kind == "rocm":
        arch = platform.get("gcn_arch")
        if not isinstance(arch, str) or arch not in rocm_archs:
            raise ScenarioError(f"platform.gcn_arch: {arch!r} is not a known ROCm arch"
                                f"{did_you_mean(arch, rocm_archs)}; "
                                f"expected one of {', '.join(rocm_archs)}")
        facts["platform.gcn_arch"] = arch
        facts["platform.capability"] = rocm_archs[arch]
        if "capability" in platform:
            raise ScenarioError("platform.capability: derived from gcn_arch on rocm; remove it")
    else:
        if "capability" in platform or "gcn_arch" in platform:
            raise ScenarioError(f"platform: {kind} takes no capability or gcn_arch")
    if "amx" in platform:
        if kind != "cpu":
            raise ScenarioError("platform.amx: only for kind cpu (whether the x86 processor has AMX tiles); remove it")
        facts["platform.amx"] = _typed(platform["amx"], "bool", "platform.amx")

    pk = _fields(top.get("packages"), "packages", tuple(sorted(packages_known)))
    for name, present in pk.items():
        _typed(present, "bool", f"packages.{name}")
    packages = frozenset(n for n, present in pk.items() if present)

    env_raw = top.get("env") or {}
    if not isinstance(env_raw, Mapping):
        raise ScenarioError("env: expected a mapping NAME: \"value\"")
    env: dict[str, str] = {}
    for name, value in env_raw.items():
        if not isinstance(value, str):
            raise ScenarioError(f"env.{name}: values are strings exactly as in the environment "
                                f"(write \"{_as_env(value)}\", quoted)")
        env[str(name)] = value

    moe = _fields(top.get("moe"), "moe", _MOE + ("parallel",))
    for key, value in moe.items():
        if key == "parallel":
            continue
        path = "moe." + key
        facts[path] = _typed(value, FACTS[path][0], path)
    if facts["moe.activation"] is not None and facts["moe.activation"] not in ACTIVATIONS:
        a = facts["moe.activation"]
        raise ScenarioError(f"moe.activation: {a!r} is not an activation{did_you_mean(a, ACTIVATIONS)}; "
                            f"expected one of {', '.join(ACTIVATIONS)}")
    routing = facts["moe.routing_method"]
    if routing is not None and routing not in ROUTING_METHODS:
        raise ScenarioError(f"moe.routing_method: {routing!r} is not a routing method"
                            f"{did_you_mean(routing, ROUTING_METHODS)}; expected one of {', '.join(ROUTING_METHODS)}")
    parallel = _fields(moe.get("parallel"), "moe.parallel", _PARALLEL)
    for key, value in parallel.items():
        path = "moe.parallel." + key
        facts[path] = _typed(value, FACTS[path][0], path)
    a2a = facts["moe.parallel.all2all_backend"]
    if a2a is not None and a2a not in ALL2ALL_BACKENDS:
        raise ScenarioError(f"moe.parallel.all2all_backend: {a2a!r} is not an all2all backend"
                            f"{did_you_mean(a2a, ALL2ALL_BACKENDS)}; expected one of {', '.join(ALL2ALL_BACKENDS)}")
    top_k, experts = facts["moe.top_k"], facts["moe.num_experts"]
    if top_k is not None and experts is not None and top_k > experts:
        given = "" if "top_k" in moe else " (the default)"
        raise ScenarioError(f"moe.top_k: {top_k}{given} is out of range; allowed: 1 to moe.num_experts ({experts}): "
                            "each token is routed to top_k of the num_experts experts")

    quark = _fields(top.get("quark"), "quark", _QUARK)
    for key in ("input_dtype", "weight_dtype"):
        if key in quark:
            facts["quark." + key] = _typed(quark[key], "str?", "quark." + key)
    weight = _fields(quark.get("weight"), "quark.weight", _QUARK_WEIGHT)
    for key, value in weight.items():
        facts["quark.weight." + key] = _typed(value, FACTS["quark.weight." + key][0], "quark.weight." + key)
    inp = _fields(quark.get("input"), "quark.input", _QUARK_INPUT)
    for key, value in inp.items():
        facts["quark.input." + key] = _typed(value, FACTS["quark.input." + key][0], "quark.input." + key)
    warnings = env_lookalikes(env, table.env_vars)
    if strict and warnings:
        raise ScenarioError("; ".join(warnings) + " (an error under --strict)")
    return Scenario(policy, profile, query, backend, facts, env, packages, platform_given, warnings)


def env_lookalikes(env: Mapping[str, str], declared: frozenset[str]) -> tuple[str, ...]:
    """A warning per scenario variable that is not declared but looks like a declared one (a typo has no effect:
    the variable it meant stays at its default). Unrelated variables are normal in a real environment: no warning."""
    out = []
    for name in env:
        if name not in declared:
            close = difflib.get_close_matches(name, declared, n=1, cutoff=0.85)
            if close:
                out.append(f"env.{name}: not a variable these rules read (did you mean '{close[0]}'?); "
                           "it has no effect")
    return tuple(out)


def _as_env(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)
