"""The answer to one question: a frozen Decision, safe to share between every caller of the cache.

`to_dict()` is the JSON contract (schemas/decision.schema.json); `from_dict()` reads it back.
The trace and the `unsupported` summary are computed on first access (a server that only
needs the backend pays nothing for them); that is the only state that ever changes, once.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from operator import itemgetter
from types import MappingProxyType
from typing import Any

from . import trace as tr
from .model import DecidedBy

OUTCOMES = ("selected", "none", "invalid", "unsupported", "error")
# answer fields a Decision has as attributes; every other field of a dict is a policy's extra
_FIELDS = ("outcome", "backend", "kernel", "activation_key", "converter", "runner", "hidden_size", "intermediate_size",
           "quant_config", "error", "decided_by", "profile", "policy", "rule_files", "trace")


_EMPTY: Mapping[str, Any] = MappingProxyType({})


class Decision(tuple):  # type: ignore[type-arg]
    """Immutable answer (a tuple underneath: cheap to build, impossible to assign to).

    Attributes: outcome, backend, kernel, activation_key, hidden_size, intermediate_size, extras,
    profile, policy, rule_files, converter, runner, missing_why, decided_by, error, trace, quant_config
    (the backend's quant-config kind and its fields, from the rules; None when the rules give none)."""

    __slots__ = ()

    def __new__(cls, outcome: str, *, backend: str | None = None, kernel: str | None = None,
                activation_key: str | None = None, hidden_size: int | None = None,
                intermediate_size: int | None = None, error: str | Callable[[], str] | None = None,
                extras: Mapping[str, Any] | None = None, profile: str | None = None, policy: str | None = None,
                rule_files: tuple[str, ...] = (), converter: str | None = None, runner: str | None = None,
                missing_why: str | None = None, decided_by: DecidedBy | None = None,
                trace: tuple[tr.Entry, ...] | Callable[[], tuple[tr.Entry, ...]] | None = None,
                quant_config: Mapping[str, Any] | None = None) -> Decision:
        return tuple.__new__(cls, (outcome, backend, kernel, activation_key, hidden_size, intermediate_size,
                                   MappingProxyType(dict(extras)) if extras else _EMPTY, profile, policy,
                                   tuple(rule_files), converter, runner, missing_why, decided_by,
                                   [error, () if trace is None else trace],
                                   None if quant_config is None else MappingProxyType(dict(quant_config))))

    @classmethod
    def build_selected(cls, backend: str, kernel: str | None, activation_key: str | None, hidden_size: int | None,
                 intermediate_size: int | None, extras: Mapping[str, Any] | None, profile: str, policy: str,
                 rule_files: tuple[str, ...], converter: str | None, runner: str | None, missing_why: str | None,
                 decided_by: DecidedBy | None, trace: Callable[[], tuple[tr.Entry, ...]],
                 quant_config: Mapping[str, Any] | None = None) -> Decision:
        """Decision("selected", ...) without keyword binding: the uncached select builds one per question."""
        return tuple.__new__(cls, ("selected", backend, kernel, activation_key, hidden_size, intermediate_size,
                                   MappingProxyType(dict(extras)) if extras else _EMPTY, profile, policy,
                                   rule_files, converter, runner, missing_why, decided_by, [None, trace],
                                   quant_config))

    outcome: str = property(itemgetter(0))  # type: ignore[assignment]
    backend: str | None = property(itemgetter(1))  # type: ignore[assignment]
    kernel: str | None = property(itemgetter(2))  # type: ignore[assignment]
    activation_key: str | None = property(itemgetter(3))  # type: ignore[assignment]
    hidden_size: int | None = property(itemgetter(4))  # type: ignore[assignment]
    intermediate_size: int | None = property(itemgetter(5))  # type: ignore[assignment]
    extras: Mapping[str, Any] = property(itemgetter(6))  # type: ignore[assignment]
    profile: str | None = property(itemgetter(7))  # type: ignore[assignment]
    policy: str | None = property(itemgetter(8))  # type: ignore[assignment]
    rule_files: tuple[str, ...] = property(itemgetter(9))  # type: ignore[assignment]
    converter: str | None = property(itemgetter(10))  # type: ignore[assignment]
    runner: str | None = property(itemgetter(11))  # type: ignore[assignment]
    missing_why: str | None = property(itemgetter(12))  # type: ignore[assignment]
    decided_by: DecidedBy | None = property(itemgetter(13))  # type: ignore[assignment]
    quant_config: Mapping[str, Any] | None = property(itemgetter(15))  # type: ignore[assignment]

    @property
    def generation(self) -> int | None:
        """The rules generation of the oracle.store.RuleStore that gave this answer; None for an Oracle's."""
        return self[16] if len(self) > 16 else None

    @property
    def warnings(self) -> tuple[str, ...]:
        """Problems with the question that did not stop the answer (e.g. an env var that looks like a declared one)."""
        return tuple(self.extras.get("warnings") or ())

    @property
    def error(self) -> str | None:
        """Why the answer is not `selected`; for `unsupported` it lists every candidate (built on first access)."""
        lazy = self[14]
        if callable(lazy[0]):
            lazy[0] = lazy[0]()
        return lazy[0]  # type: ignore[no-any-return]

    @property
    def trace(self) -> tuple[tr.Entry, ...]:
        """Every step and candidate (typed entries, see oracle.trace), computed on first access."""
        lazy = self[14]
        if callable(lazy[1]):
            lazy[1] = tuple(lazy[1]())
        return lazy[1]  # type: ignore[no-any-return]

    def to_dict(self, *, with_trace: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"outcome": self.outcome}
        if self.outcome in ("selected", "none"):
            out["backend"] = self.backend
            if self.kernel is not None or self.outcome == "selected" or self.extras:
                out["kernel"] = self.kernel
        if self.activation_key is not None or self.outcome == "selected" and self.kernel is not None:
            out["activation_key"] = self.activation_key
        if self.outcome == "selected" and self.backend is not None:
            out["converter"] = self.converter
            out["runner"] = self.runner
        if self.quant_config is not None:
            out["quant_config"] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in self.quant_config.items()}
        if self.hidden_size is not None:
            out["hidden_size"] = self.hidden_size
            out["intermediate_size"] = self.intermediate_size
        out.update(self.extras)
        if self.error is not None:
            out["error"] = self.error
        if self.decided_by is not None:
            out["decided_by"] = self.decided_by.to_dict()
        if self.profile is not None:
            out["profile"] = self.profile
            out["policy"] = self.policy
            out["rule_files"] = list(self.rule_files)
        if with_trace:
            out["trace"] = [e.to_dict() for e in self.trace]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Decision:
        """The Decision a `to_dict()` answer (e.g. one line of `select --json`) describes."""
        if d.get("outcome") not in OUTCOMES:
            raise ValueError(f"outcome: {d.get('outcome')!r} is not one of {', '.join(OUTCOMES)}")
        by = d.get("decided_by")
        return cls(d["outcome"], backend=d.get("backend"), kernel=d.get("kernel"),
                   activation_key=d.get("activation_key"), hidden_size=d.get("hidden_size"),
                   intermediate_size=d.get("intermediate_size"), error=d.get("error"),
                   extras={k: v for k, v in d.items() if k not in _FIELDS}, profile=d.get("profile"),
                   policy=d.get("policy"), rule_files=tuple(d.get("rule_files") or ()), converter=d.get("converter"),
                   runner=d.get("runner"), decided_by=DecidedBy(by["step"], by["at"], by["why"]) if by else None,
                   trace=tuple(tr.from_dict(e) for e in d.get("trace") or ()), quant_config=d.get("quant_config"))

    def __repr__(self) -> str:
        return f"Decision({self.outcome}, backend={self.backend!r}, kernel={self.kernel!r})"


def with_warnings(d: Decision, warnings: tuple[str, ...]) -> Decision:
    """`d` with the question's warnings (answer field `warnings`), or `d` itself when there are none.
    The lazy error/trace cell is shared, so nothing computed twice."""
    if not warnings:
        return d
    extras = MappingProxyType({**d.extras, "warnings": list(warnings)})
    return tuple.__new__(Decision, (*d[:6], extras, *d[7:]))


def with_generation(d: Decision, number: int) -> Decision:
    """`d` stamped with the rules generation it came from (`generation`); the lazy cell is shared."""
    return tuple.__new__(Decision, (*d[:16], number))


def error_decision(message: str) -> Decision:
    return Decision("error", error=message)


def describe_quant_config(config: Mapping[str, Any]) -> str:
    """One line for explain (CLI and layers alike): the kind, then each field; no activation format reads as
    'unquantized' (weight-only kinds), not as None."""
    fields = ", ".join(f"{key} {'unquantized' if value is None and key == 'activation' else value}"
                       for key, value in config.items() if key != "kind")
    return f"quant_config {config['kind']} ({fields})"
