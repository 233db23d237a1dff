"""A question that remembers how it was asked: PreparedScenario (what Oracle.prepare and RuleStore.prepare return),
so a newer rules version answers it exactly as it would answer the same mapping (no mix of versions)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .scenario import Scenario

_FREEZE_DEPTH = 32  # deeper questions are not frozen (nor cached): no question of the rules is nested so deep


_SCALARS = frozenset({str, int, float, bool, type(None)})


def freeze(value: Any, _depth: int = 0) -> Any:
    """A hashable copy of a JSON-like question (dicts as sorted item tuples), or None when it has other types
    or is nested deeper than any real question. The type is kept with each value: validation treats 1, 1.0 and
    True differently."""
    kind = type(value)
    if kind in _SCALARS:
        return (kind, value)
    if _depth > _FREEZE_DEPTH:
        return None
    if kind is dict or isinstance(value, Mapping):
        try:
            items = sorted(value.items())
        except TypeError:
            return None
        out = []
        for k, v in items:
            fv = (type(v), v) if type(v) in _SCALARS else freeze(v, _depth + 1)
            if fv is None:
                return None
            out.append((k, fv))
        return (dict, tuple(out))
    if kind is list or kind is tuple:
        parts = []
        for v in value:
            fv = (type(v), v) if type(v) in _SCALARS else freeze(v, _depth + 1)
            if fv is None:
                return None
            parts.append(fv)
        return (list, tuple(parts))
    if isinstance(value, (str, int, float)):  # a subclass (an enum member): kept with its own type
        return (kind, value)
    return None


def thaw(frozen: Any) -> Any:
    """The JSON-like value `freeze` made `frozen` from (a fresh copy: nothing shared with the caller's)."""
    kind, value = frozen
    if kind is dict:
        return {k: thaw(v) for k, v in value}
    if kind is list:
        return [thaw(v) for v in value]
    return value


class PreparedScenario(Scenario):
    """A Scenario that remembers the question it was prepared from (`Oracle.prepare`, `RuleStore.prepare`).

    Its owner answers it from the question resolved against the rules serving now. It is a question, not a set
    of facts: equal only to a PreparedScenario of the same question and options (so answer caches keyed by it
    hold the answer of the question under their own rules version), never to a plain Scenario.
    Item 10: (frozen question or None, a copy of the question when it cannot be frozen, the owner's prepare
    options, frozen); item 11: a one-slot cell [(rules version token, Scenario resolved under it)], replaced in
    one assignment, so two threads racing store equal values; item 12: the hash."""

    __slots__ = ()

    @classmethod
    def of(cls, sc: Scenario, raw: Any, token: Any, options: Any = None) -> PreparedScenario:
        frozen = freeze(raw)
        copy = None
        if frozen is None:  # other types than JSON's: keep a copy of the mapping's top level; equal to itself only
            copy = dict(raw) if isinstance(raw, Mapping) else raw
        question = (frozen, copy, options)
        prepared: PreparedScenario = tuple.__new__(cls, (*sc[:10], question, [None], _question_hash(question)))
        prepared[11][0] = (token, sc)  # answered as the plain Scenario: it shares caches with the same mapping's
        return prepared

    def __hash__(self) -> int:
        return self[12]  # type: ignore[no-any-return]

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not PreparedScenario or self[10][0] is None:
            return False
        return bool(self[10][0] == other[10][0] and self[10][2] == other[10][2])

    def __ne__(self, other: object) -> bool:
        return not self == other

    @property
    def frozen(self) -> Any:
        """The question as `freeze` made it (hashable), or None when it holds other types than JSON's."""
        return self[10][0]

    @property
    def options(self) -> Any:
        return self[10][2]

    def question(self) -> Any:
        """A fresh copy of the question this Scenario was prepared from."""
        frozen, copy, _ = self[10]
        return thaw(frozen) if frozen is not None else copy

    def __reduce__(self) -> tuple[Any, ...]:  # a copy keeps the question; it is resolved again at first use
        return (_unpickle_prepared, (tuple(self[:9]), self[10]))


def _question_hash(question: tuple[Any, Any, Any]) -> int:
    """By the frozen question and options; a question that cannot be frozen is equal to itself only."""
    return hash((PreparedScenario, question[0], question[2])) if question[0] is not None else id(question)


def _unpickle_prepared(fields: tuple[Any, ...], question: Any) -> PreparedScenario:
    sc = tuple.__new__(Scenario, (*fields, [None, None]))
    prepared: PreparedScenario = tuple.__new__(PreparedScenario, (*sc, question, [None], _question_hash(question)))
    prepared[11][0] = (None, sc)
    return prepared
