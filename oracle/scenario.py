"""Turn a scenario mapping (../spec contract) into a frozen, hashable Scenario.

Unknown fields, wrong types and out-of-range values raise ScenarioError naming the
field, what is expected and, for a misspelling, the close name.
"""
from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Mapping
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from .errors import ScenarioError, did_you_mean
from .facts import CAPABILITY_RANGES, FACTS, MAX_NUMBER, PLATFORM_KINDS, QUANT_KEY_FACTS, RANGES
from .limits import shown as _show
from .vocabulary import ACTIVATIONS, ALL2ALL_BACKENDS, ROUTING_METHODS

if TYPE_CHECKING:
    from .model import Table

# the fields each level of a scenario mapping allows, in the order messages list them (dicts: O(1) lookups and
# one C-level subset test for a mapping without unknown fields)
_TOP = dict.fromkeys("policy profile platform packages flashinfer env moe quark query backend".split())
_PLATFORM = dict.fromkeys(("kind", "capability", "gcn_arch", "amx"))
_MOE = dict.fromkeys([*(k.split(".", 1)[1] for k in FACTS
                        if k.startswith("moe.") and not k.startswith("moe.parallel.")), "parallel"])
_PARALLEL = dict.fromkeys(k.rsplit(".", 1)[1] for k in FACTS if k.startswith("moe.parallel."))
_QUARK = dict.fromkeys(("weight", "input", "input_dtype", "weight_dtype"))
_QUARK_WEIGHT = dict.fromkeys(k.rsplit(".", 1)[1] for k in FACTS if k.startswith("quark.weight."))
_QUARK_INPUT = dict.fromkeys(k.rsplit(".", 1)[1] for k in FACTS if k.startswith("quark.input."))
_FLASHINFER = dict.fromkeys(k.split(".", 1)[1] for k in FACTS if k.startswith("flashinfer."))
_MAJOR, _MINOR = CAPABILITY_RANGES
# the exact types a fact of each kind takes without further checks (ints also within their range)
_FAST_TYPES: dict[str, frozenset[type]] = {"int": frozenset({int}), "bool": frozenset({bool}),
                                           "str": frozenset({str}), "choice": frozenset({str}),
                                           "str?": frozenset({str, type(None)}), "bool?": frozenset({bool, type(None)})}


def _specs(prefix: str, keys: dict[str, None]) -> dict[str, tuple[str, frozenset[type], int, int | None, str]]:
    """key -> (fact path, exact types taken as is, lo, hi, kind) for the facts of one scenario level."""
    out = {}
    for key in keys:
        path = prefix + key
        if path in FACTS:
            kind = FACTS[path][0]
            lo, hi = RANGES.get(path, (0, None))
            out[key] = (path, _FAST_TYPES.get(kind, frozenset()), lo, hi, kind)
    return out


_MOE_SPECS = _specs("moe.", _MOE)
_PARALLEL_SPECS = _specs("moe.parallel.", _PARALLEL)
_FLASHINFER_SPECS = _specs("flashinfer.", _FLASHINFER)


class Scenario(tuple):  # type: ignore[type-arg]
    """One normalized question. Immutable and hashable, so answers can be cached by it.

    A tuple underneath (like Decision): built in one step on every dict question. Equality and the hash use
    `key()`, computed on first use, so an uncached select of a fresh scenario never pays for them."""

    __slots__ = ()

    def __new__(cls, policy: str, profile: str | None, query: str, backend: str | None, facts: dict[str, Any],
                env: dict[str, str], packages: frozenset[str], platform_given: bool,
                warnings: tuple[str, ...] = ()) -> Scenario:
        return tuple.__new__(cls, (policy, profile, query, backend, facts, env, packages, platform_given, warnings,
                                   [None, None]))  # the last cell: [key, hash] once computed

    policy: str = property(itemgetter(0))  # type: ignore[assignment]
    profile: str | None = property(itemgetter(1))  # type: ignore[assignment]
    query: str = property(itemgetter(2))  # type: ignore[assignment]
    backend: str | None = property(itemgetter(3))  # type: ignore[assignment]
    facts: Mapping[str, Any] = property(itemgetter(4))  # type: ignore[assignment]
    env: Mapping[str, str] = property(itemgetter(5))  # type: ignore[assignment]
    packages: frozenset[str] = property(itemgetter(6))  # type: ignore[assignment]
    platform_given: bool = property(itemgetter(7))  # type: ignore[assignment]
    # e.g. an env var that looks like a declared one; not part of the key (env is)
    warnings: tuple[str, ...] = property(itemgetter(8))  # type: ignore[assignment]

    def __getnewargs__(self) -> tuple[Any, ...]:  # copy and pickle rebuild it through __new__
        return tuple(self[:9])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Scenario is immutable")

    def key(self) -> tuple[Any, ...]:
        """What equality and the hash are made of (everything but `warnings` and `platform_given`)."""
        cell = self[9]
        key: tuple[Any, ...] | None = cell[0]
        if key is None:  # computed once; two threads racing compute equal values
            key = (self[0], self[1], self[2], self[3], tuple(self[4].items()), tuple(sorted(self[5].items())),
                   self[6])
            cell[1] = hash(key)
            cell[0] = key
        return key

    def __hash__(self) -> int:  # on every cached select: one index and one test once computed
        h: int | None = self[9][1]
        if h is None:
            self.key()
            h = self[9][1]
            assert h is not None
        return h

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Scenario) and (self is other or self.key() == other.key())

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __repr__(self) -> str:
        return f"Scenario(policy={self.policy!r}, profile={self.profile!r}, query={self.query!r})"


def _fields(obj: Any, where: str, allowed: dict[str, None]) -> Mapping[str, Any]:
    if obj is None:
        return {}
    if type(obj) is dict:  # the common case first: isinstance(Mapping) is slow
        if obj.keys() <= allowed.keys():
            return obj
    elif not isinstance(obj, Mapping):
        raise ScenarioError(f"{where}: expected a mapping, got {type(obj).__name__}")
    for key in obj:
        if key not in allowed:
            path = f"{where}.{key}" if where else str(key)
            raise ScenarioError(f"{path}: unknown field{did_you_mean(key, allowed)}; allowed: {', '.join(allowed)}")
    fields: Mapping[str, Any] = obj
    return fields


def _typed(value: Any, kind: str, where: str) -> Any:
    if kind == "bool":
        if not isinstance(value, bool):
            raise ScenarioError(f"{where}: expected true or false, got {_show(value)}")
    elif kind == "int" or kind == "int?" and value is not None:
        lo, hi = RANGES.get(where, (0, None))
        if not isinstance(value, int) or isinstance(value, bool):
            raise ScenarioError(f"{where}: expected {_allowed_ints(lo, hi)}{' or null' if kind == 'int?' else ''}, "
                                f"got {_show(value)}")
        if value < lo or (hi is not None and value > hi):
            raise ScenarioError(f"{where}: {_show(value)} is out of range; allowed: {_allowed_ints(lo, hi)}")
    elif kind in ("str", "choice"):
        if not isinstance(value, str):
            raise ScenarioError(f"{where}: expected a string, got {_show(value)}")
    elif kind == "str?":
        if value is not None and not isinstance(value, str):
            raise ScenarioError(f"{where}: expected a string or null, got {_show(value)}")
    elif kind == "bool?":
        if value is not None and not isinstance(value, bool):
            raise ScenarioError(f"{where}: expected true, false or null, got {_show(value)}")
    elif kind == "num?":
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0
                                  or isinstance(value, float) and not math.isfinite(value) or value > MAX_NUMBER):
            raise ScenarioError(f"{where}: expected a finite non-negative number up to {MAX_NUMBER:g} or null, "
                                f"got {_show(value)}")
    return value


def _allowed_ints(lo: int, hi: int | None) -> str:
    return (f"an integer from {lo} to {hi}" if hi is not None else
            "a non-negative integer" if lo == 0 else f"an integer >= {lo}")


class _TableFacts:
    """What parsing needs from one compiled table, derived once per table (not per question): every
    policy's full fact defaults (neutral ones, then the policy's) and the sorted package names."""

    __slots__ = ("defaults", "package_names")

    def __init__(self, table: Table):
        neutral = {k: d for k, (_, d) in FACTS.items()}
        self.defaults = {name: {**neutral, **policy.defaults} for name, policy in table.policies.items()}
        self.package_names = dict.fromkeys(sorted(table.packages))


def _table_facts(table: Table) -> _TableFacts:
    found = table.derived.get("scenario")
    if found is None:  # two threads may both build it: equal values, the last one stays
        found = table.derived["scenario"] = _TableFacts(table)
    assert isinstance(found, _TableFacts)
    return found


def parse_scenario(raw: Any, table: Table, default_platform: Mapping[str, Any] | None = None,
                   strict: bool = False) -> Scenario:
    """Validate `raw` against the fact table and one compiled rule table (policies, queries, archs, packages).
    `strict`: a look-alike environment variable is an error instead of a warning.

    Values of the usual shape are accepted inline (one exact-type test per value, one subset test per mapping);
    anything else goes through the general checks, which word every error."""
    top = raw if type(raw) is dict and raw.keys() <= _TOP.keys() else _fields(raw, "", _TOP)
    if type(raw) is not dict and not isinstance(raw, Mapping):
        raise ScenarioError("scenario: expected a mapping with at least 'policy'")
    policy = top.get("policy")
    if not isinstance(policy, str) or policy not in table.policies:
        if not isinstance(policy, str):
            raise ScenarioError(f"policy: required; one of {', '.join(table.policies)}")
        raise ScenarioError(f"policy: unknown policy {_show(policy)}{did_you_mean(policy, table.policies)}; "
                            f"profile {table.name} has {', '.join(table.policies)}")
    profile = top.get("profile")
    if profile is not None and not isinstance(profile, str):
        raise ScenarioError(f"profile: expected a profile name string, got {_show(profile)}")
    query = top.get("query", "select")
    if query != "select" and query not in table.queries:
        raise ScenarioError(f"query: {_show(query)} is not a query{did_you_mean(query, table.queries)}; "
                            f"expected one of {', '.join(table.queries)}")
    backend = top.get("backend")
    if backend is not None and not isinstance(backend, str):
        raise ScenarioError(f"backend: expected a backend name string, got {_show(backend)}")
    if query == "round_up" and backend is None:
        raise ScenarioError("backend: the round_up query needs a backend name (or \"None\")")
    derived = table.derived.get("scenario") or _table_facts(table)

    facts: dict[str, Any] = derived.defaults[policy].copy()
    platform_given = "platform" in top
    given = top["platform"] if platform_given else default_platform
    platform = given if type(given) is dict and given.keys() <= _PLATFORM.keys() else \
        _fields(given, "platform", _PLATFORM)
    kind = platform.get("kind", "cuda")
    if kind == "cuda":
        cap = platform.get("capability", [9, 0] if not platform_given else None)
        if type(cap) is list and len(cap) == 2 and type(cap[0]) is int and type(cap[1]) is int \
                and _MAJOR[0] <= cap[0] <= _MAJOR[1] and _MINOR[0] <= cap[1] <= _MINOR[1]:
            facts["platform.capability"] = (cap[0], cap[1])  # the usual shape, tested inline
        else:
            facts["platform.capability"] = _capability(cap)
        if "gcn_arch" in platform:
            raise ScenarioError("platform.gcn_arch: only for kind rocm")
    else:
        _other_platform(platform, kind, table.rocm_archs, facts)
    facts["platform.kind"] = kind
    if "amx" in platform:
        if kind != "cpu":
            raise ScenarioError("platform.amx: only for kind cpu (whether the x86 processor has AMX tiles); remove it")
        facts["platform.amx"] = _typed(platform["amx"], "bool", "platform.amx")

    packages = _packages(top.get("packages"), derived.package_names)
    env_raw = top.get("env") or {}
    env: dict[str, str] = {}
    if env_raw:
        if type(env_raw) is not dict and not isinstance(env_raw, Mapping):
            raise ScenarioError("env: expected a mapping NAME: \"value\"")
        for name, value in env_raw.items():
            if not isinstance(value, str):
                raise ScenarioError(f"env.{name}: values are strings exactly as in the environment "
                                    f"(write \"{_as_env(value)}\", quoted)")
            env[str(name)] = value
    _moe(top.get("moe"), facts)
    for fact in QUANT_KEY_FACTS if table.quant_keys else ():  # only the keys the rules declare (or their default)
        if facts[fact] not in table.quant_keys and facts[fact] not in (None, derived.defaults[policy].get(fact)):
            raise ScenarioError(f"{fact}: {_show(facts[fact])} is not a quantization key of profile {table.name}"
                                f"{did_you_mean(facts[fact], table.quant_keys)}; expected one of "
                                f"{', '.join(sorted(table.quant_keys))} or null")

    if "flashinfer" in top:  # what the installed FlashInfer offers; unset: the FlashInfer the profile's vLLM pins
        _fill(_fields(top["flashinfer"], "flashinfer", _FLASHINFER), _FLASHINFER_SPECS, facts)
    if "quark" in top:
        _quark(top["quark"], facts)
    warnings = env_lookalikes(env, table.env_vars) if env else ()
    if strict and warnings:
        raise ScenarioError("; ".join(warnings) + " (an error under --strict)")
    return tuple.__new__(Scenario, (policy, profile, query, backend, facts, env, packages, platform_given, warnings,
                                    [None, None]))  # Scenario(...) without the call


def _other_platform(platform: Mapping[str, Any], kind: Any, rocm_archs: Mapping[str, tuple[int, int]],
                    facts: dict[str, Any]) -> None:
    """The platform facts of a kind other than cuda."""
    if kind not in PLATFORM_KINDS:
        raise ScenarioError(f"platform.kind: {_show(kind)} is not a platform{did_you_mean(kind, PLATFORM_KINDS)}; "
                            f"expected one of {', '.join(PLATFORM_KINDS)}")
    if kind == "rocm":
        arch = platform.get("gcn_arch")
        if not isinstance(arch, str) or arch not in rocm_archs:
            raise ScenarioError(f"platform.gcn_arch: {_show(arch)} is not a known ROCm arch"
                                f"{did_you_mean(arch, rocm_archs)}; "
                                f"expected one of {', '.join(rocm_archs)}")
        facts["platform.gcn_arch"] = arch
        facts["platform.capability"] = rocm_archs[arch]
        if "capability" in platform:
            raise ScenarioError("platform.capability: derived from gcn_arch on rocm; remove it")
    elif "capability" in platform or "gcn_arch" in platform:
        raise ScenarioError(f"platform: {kind} takes no capability or gcn_arch")


def _packages(given: Any, names: dict[str, None]) -> frozenset[str]:
    """The names of the packages a scenario marks present (each must be a declared package, true or false)."""
    if not given:
        if given is None or type(given) is dict:
            return _NO_PACKAGES
        _fields(given, "packages", names)  # raises for anything but an empty mapping
    pk = given if type(given) is dict and given.keys() <= names.keys() else _fields(given, "packages", names)
    present = []
    for name, value in pk.items():
        if value is True:
            present.append(name)
        elif value is not False:
            _typed(value, "bool", f"packages.{name}")
    return frozenset(present)


_NO_PACKAGES: frozenset[str] = frozenset()


def _fill(given: Mapping[str, Any], specs: dict[str, tuple[str, frozenset[type], int, int | None, str]],
          facts: dict[str, Any]) -> None:
    """The facts of one scenario level: a value of an exact accepted type (and an int within its range) is taken
    as is; anything else is checked, and worded, by `_typed`. `specs`: key -> (fact, types, lo, hi, kind)."""
    for key, value in given.items():
        spec = specs.get(key)
        if spec is None:  # a nested level (moe.parallel), filled on its own
            continue
        path, types, lo, hi, kind = spec
        if type(value) in types and (kind != "int" or lo <= value and (hi is None or value <= hi)):
            facts[path] = value
        else:
            facts[path] = _typed(value, kind, path)


def _moe(given: Any, facts: dict[str, Any]) -> None:
    """The moe facts, in the order their errors are reported: the fields, the activation and routing vocabularies,
    the parallel fields, the all2all vocabulary, then top_k within num_experts."""
    moe = {} if given is None else given if type(given) is dict and given.keys() <= _MOE.keys() else \
        _fields(given, "moe", _MOE)
    _fill(moe, _MOE_SPECS, facts)
    activation = facts["moe.activation"]
    if activation is not None and activation not in ACTIVATIONS:
        raise ScenarioError(f"moe.activation: {_show(activation)} is not an activation"
                            f"{did_you_mean(activation, ACTIVATIONS)}; expected one of {', '.join(ACTIVATIONS)}")
    routing = facts["moe.routing_method"]
    if routing is not None and routing not in ROUTING_METHODS:
        raise ScenarioError(f"moe.routing_method: {_show(routing)} is not a routing method"
                            f"{did_you_mean(routing, ROUTING_METHODS)}; expected one of {', '.join(ROUTING_METHODS)}")
    if "parallel" in moe:
        _fill(_fields(moe["parallel"], "moe.parallel", _PARALLEL), _PARALLEL_SPECS, facts)
    a2a = facts["moe.parallel.all2all_backend"]
    if a2a is not None and a2a not in ALL2ALL_BACKENDS:
        raise ScenarioError(f"moe.parallel.all2all_backend: {_show(a2a)} is not an all2all backend"
                            f"{did_you_mean(a2a, ALL2ALL_BACKENDS)}; expected one of {', '.join(ALL2ALL_BACKENDS)}")
    top_k, experts = facts["moe.top_k"], facts["moe.num_experts"]
    if top_k is not None and experts is not None and top_k > experts:
        default = "" if "top_k" in moe else " (the default)"
        raise ScenarioError(f"moe.top_k: {top_k}{default} is out of range; allowed: 1 to moe.num_experts ({experts}): "
                            "each token is routed to top_k of the num_experts experts")


def _capability(cap: Any) -> tuple[int, int]:
    """A CUDA capability [major, minor] as a tuple, or ScenarioError naming what is wrong with it."""
    if type(cap) is list or type(cap) is tuple:  # the common case: two plain ints in range
        if len(cap) == 2 and type(cap[0]) is int and type(cap[1]) is int:
            major, minor = cap
            if _MAJOR[0] <= major <= _MAJOR[1] and _MINOR[0] <= minor <= _MINOR[1]:
                return major, minor
    if (not isinstance(cap, (list, tuple)) or len(cap) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in cap)):
        raise ScenarioError(f"platform.capability: expected [major, minor] for cuda, e.g. [9, 0]; got {_show(cap)}")
    for part, number, (lo, hi) in zip(("major", "minor"), cap, CAPABILITY_RANGES, strict=True):
        if not lo <= number <= hi:
            raise ScenarioError(f"platform.capability: {part} {_show(number)} of {_show(list(cap))} is out of "
                                f"range; allowed: {part} {lo} to {hi} (e.g. [9, 0] for sm_90, [10, 3] for sm_103)")
    return cap[0], cap[1]


def _quark(raw: Any, facts: dict[str, Any]) -> None:
    quark = _fields(raw, "quark", _QUARK)
    for key in ("input_dtype", "weight_dtype"):
        if key in quark:
            facts["quark." + key] = _typed(quark[key], "str?", "quark." + key)
    for level, allowed in (("weight", _QUARK_WEIGHT), ("input", _QUARK_INPUT)):
        for key, value in _fields(quark.get(level), f"quark.{level}", allowed).items():
            facts[f"quark.{level}.{key}"] = _typed(value, FACTS[f"quark.{level}.{key}"][0], f"quark.{level}.{key}")


def env_lookalikes(env: Mapping[str, str], declared: frozenset[str]) -> tuple[str, ...]:
    """A warning per scenario variable that is not declared but looks like a declared one (a typo has no effect:
    the variable it meant stays at its default). Unrelated variables are normal in a real environment: no warning."""
    out = []
    for name in env:
        if name not in declared:
            close = _lookalike(name, declared)
            if close is not None:
                out.append(f"env.{name}: not a variable these rules read (did you mean '{close}'?); it has no effect")
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _lookalike(name: str, declared: frozenset[str]) -> str | None:
    """The declared variable `name` looks like, if any. Memoized: a server passes the same environment (often
    with many unrelated variables) on every question, and difflib costs tens of µs per name."""
    close = difflib.get_close_matches(name, sorted(declared), n=1, cutoff=0.85)
    return close[0] if close else None


def _as_env(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)
