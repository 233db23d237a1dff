"""The compiled decision table: frozen records the interpreter walks, plus the per-question context.

Nothing here is dict-shaped rule data any more: conditions are generated functions (see
codegen.py), messages are templates with resolved getters, names are resolved to objects.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .codegen import CodeGen

Fn = Callable[["Ctx"], Any]
FROM_SCENARIO = "from_scenario"
REQUESTED = "requested"  # a backend that runs with the activation key the policy requests (Ctx.requested_key)


class Ctx:
    """Everything one question may read: facts, env strings, packages, and per-question memos."""

    __slots__ = ("facts", "env", "packages", "memo", "call_backend", "weight_key", "activation_key", "requested_key")

    def __init__(self, facts: Mapping[str, Any], env: Mapping[str, str], packages: frozenset[str]):
        self.facts = facts
        self.env = env
        self.packages = packages
        self.memo: dict[str, Any] = {}
        self.call_backend: str | None = None
        self.weight_key: str | None = None
        self.activation_key: str | None = None
        self.requested_key: str | None = None  # the activation key the running policy requests


def parse_capability(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def format_capability(cap: Any) -> str:
    return f"{cap[0]}.{cap[1]}" if isinstance(cap, tuple) else str(cap)


def show(value: Any) -> str:
    """A rule or fact value as explain and messages print it (capabilities as 9.0, YAML spellings)."""
    if isinstance(value, tuple):
        return format_capability(value)
    if isinstance(value, list):
        return "[" + ", ".join(show(v) for v in value) + "]"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


class Cond:
    """A condition: Python source over `ctx`, its readable text, and (compiled on first use) the function.

    Compiling lazily matters at load time: most nodes only ever contribute their code to a parent."""

    __slots__ = ("code", "text", "_fn", "_compile")

    def __init__(self, code: str, text: str, compile_fn: Callable[[str], Fn], fn: Fn | None = None):
        self.code = code
        self.text = text
        self._fn = fn
        self._compile = compile_fn

    @property
    def fn(self) -> Fn:
        if self._fn is None:
            self._fn = self._compile(self.code)
        return self._fn


_NO_WORDS: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class Template:
    """A message with {fact}, {value} and {word} placeholders; never str.format on rule text."""

    text: str
    getters: tuple[tuple[str, Fn | None], ...]

    def render(self, ctx: Ctx, words: Mapping[str, Any] = _NO_WORDS) -> str:
        out = self.text
        for name, get in self.getters:
            v = words.get(name) if get is None else get(ctx)
            out = out.replace("{" + name + "}", show(v))
        return out


@dataclass(frozen=True)
class Check:
    """One of a kernel's checks, in table order; its own function is compiled only for traces."""

    name: str
    cond: Cond
    reason: Template
    why_false: Callable[[Ctx], tuple[Any, ...]] | None = None  # each false leaf (trace.Leaf), for traces only

    @property
    def fn(self) -> Fn:
        return self.cond.fn

    @property
    def text(self) -> str:
        return self.cond.text


@dataclass(frozen=True)
class Kernel:
    name: str
    checks: tuple[Check, ...]
    accepts: Fn  # all checks as one short-circuit conjunction: the fast path
    monolithic: bool
    function_check: bool
    at: str

    def first_failure(self, ctx: Ctx) -> Check | None:
        for check in self.checks:
            if not check.fn(ctx):
                return check
        return None


@dataclass(frozen=True)
class Backend:
    name: str
    value: str
    kernels: tuple[Kernel, ...]
    activation_key: Any  # a key name, None (BF16), FROM_SCENARIO or REQUESTED
    converter: str | None  # module:attr resolved lazily by oracle.registry; None when there is none here
    runner: str | None
    missing_why: str | None  # why converter or runner is None
    at: str
    explicit_kernels: tuple[Kernel, ...] | None = None  # tried instead of `kernels` when named explicitly
    quant_config: Mapping[str, Any] | None = None  # {"kind": name, **the family's quant_configs[name]}
    assembly: Mapping[str, Any] | None = None  # the family's `assembly` with this backend's own over it (whys kept)


@dataclass(frozen=True)
class RoundRow:
    backends: frozenset[str] | None
    when: Fn | None
    intermediate: int
    hidden: int | None
    at: str


@dataclass(frozen=True)
class Family:
    name: str
    weight_key: Any
    backends: Mapping[str, Backend]
    by_value: Mapping[str, Backend]
    explicit: Mapping[str, tuple[str, ...]]  # moe_backend string -> the backends it names, tried in turn
    explicit_batched: Mapping[str, str]
    batched: Fn | None  # the family's batched_when: the batched activation format is in use
    round_up: tuple[RoundRow, ...]
    messages: Mapping[str, Template]
    at: str
    explicit_lists: bool = False  # the map names lists: the map_backend query answers `backends`


@dataclass(frozen=True)
class DecidedBy:
    """The step that decided, where it is written and why it exists (part of every answer)."""

    step: str
    at: str
    why: str

    def to_dict(self) -> dict[str, str]:
        return {"step": self.step, "at": self.at, "why": self.why}


@dataclass(frozen=True)
class Step:
    id: str
    when: Cond | None
    test: Fn | None  # when.fn, resolved at build time: the hot loop reads a plain attribute
    action: str  # outcome | use | use_explicit | drop | try | call | result | emit | candidates | move
    #              | prefer_activation | request_activation
    arg: Any
    check: bool
    report_kernel: bool
    message: Template | None
    at: str
    why: str
    decided_by: DecidedBy  # the same record for every answer this step decides
    options: Mapping[str, Any] = field(default_factory=dict)  # move: where; use_explicit: prefer_activation;
    #                                                           call: activation_key (Fn)


@dataclass(frozen=True)
class PolicyQuantConfig:
    """A policy's quant-config kind by answer field (its `quant_config:`), replacing the kind of the listed backends:
    e.g. vLLM's Quark OCP-MX method builds its config by scheme for some backends (rules/*/ocp-mx.yaml)."""

    by: str  # the answer field (emitted by the policy) whose value picks the kind, e.g. ocp_mx_scheme
    backends: frozenset[str]  # backend names whose own kind is replaced
    kinds: Mapping[Any, Mapping[str, Any]]  # field value -> {"kind": name, **the family's quant_configs[name]}
    at: str
    why: str

    def kind_for(self, backend: Backend, emits: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """The kind the answer carries: the one for the field's value when `backend` is listed, else the backend's
        own (also when the value is not listed)."""
        if backend.name in self.backends and emits:
            chosen = self.kinds.get(emits.get(self.by))
            if chosen is not None:
                return chosen
        return backend.quant_config


@dataclass(frozen=True)
class Policy:
    name: str
    description: str
    family: Family
    candidates: tuple[str, ...]
    steps: tuple[Step, ...]
    queries: Mapping[str, Fn]
    defaults: Mapping[str, Any]  # fact defaults of this policy (the table's, then its own)
    at: str
    activation_key: Fn | None = None  # the activation key the policy requests (None: none requested)
    quant_config: PolicyQuantConfig | None = None  # kinds by answer field, over some backends' own


@dataclass(frozen=True)
class Table:
    """The compiled, immutable decision table of one profile."""

    name: str
    description: str
    files: tuple[str, ...]
    policies: Mapping[str, Policy]
    families: Mapping[str, Family]
    packages: frozenset[str]
    env_vars: frozenset[str]
    rocm_archs: Mapping[str, tuple[int, int]]
    queries: tuple[str, ...]  # names of the queries some policy declares
    codegen: CodeGen
    quant_keys: frozenset[str] = frozenset()  # the rules' quant_keys: what a scenario's *_key facts may name
    # weight format -> gate/up layout -> the policy that serves such a checkpoint (backends.MoELayer's question)
    checkpoint_policies: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # values derived from this table once and reused per question (oracle.scenario's per-policy fact defaults)
    derived: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def source(self) -> str:
        """The generated code of this table (what `eval` compiled so far), for debugging."""
        return self.codegen.source()
