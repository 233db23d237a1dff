"""Deployment overrides: force a backend per model name, layer index range or role, with provenance.

An operator writes (schemas/overrides.schema.json):

    overrides:
      - id: draft-on-marlin
        match: {role: draft}
        backend: MARLIN
        why: "the draft model is latency bound at batch 1"

The first entry whose `match` holds replaces the question's policy steps by one step that forces
the backend (`use`, checked): the answer is `selected` when one of its kernels accepts the layer,
else `invalid` with a message that starts with the entry's file:line. The step carries the entry's
id, file:line and why, so `explain`, the trace and `decided_by` say who forced it.

The policy's `emit` steps stay, in their order and with their conditions, before the forcing step: an
answer field such as ocp-mx's `ocp_mx_scheme` or `emulate` describes the layer whoever picks the backend.
They read `call.backend` as the forced backend, which stands where the policy's own selection would.
"""
from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .errors import Diagnostic, RuleError, did_you_mean
from .loader import display_name
from .model import Ctx, DecidedBy, Family, Fn, Policy, Step, Table, Template
from .schema import schema_diagnostics
from .yamlio import Located, load_yaml_file, load_yaml_text

SCHEMA = "overrides.schema.json"
_REJECTIONS = ("backend_rejected", "backend_rejected_no_reason")


@dataclass(frozen=True, eq=False)
class Override:
    """One entry of an overrides file. Hashable by identity: it is part of the answer cache key."""

    id: str
    backend: str
    why: str
    at: str  # file:line of the entry
    model: str | None = None
    first_layer: int | None = None
    last_layer: int | None = None
    role: str | None = None
    policy: str | None = None
    _rewritten: dict[int, tuple[Policy, Policy]] = field(default_factory=dict, repr=False)

    @property
    def provenance(self) -> str:
        return f"override '{self.id}' at {self.at}"

    def matches(self, policy: str, model: str | None, layer: int | None, role: str | None) -> bool:
        if self.policy is not None and self.policy != policy:
            return False
        if self.model is not None and (model is None or not fnmatch.fnmatchcase(model, self.model)):
            return False
        if self.role is not None and self.role != role:
            return False
        if self.first_layer is not None or self.last_layer is not None:
            if layer is None:
                return False
            if self.first_layer is not None and layer < self.first_layer:
                return False
            if self.last_layer is not None and layer > self.last_layer:
                return False
        return True

    def __call__(self, policy: Policy) -> Policy:
        """`policy` with its steps replaced by this override's forcing step (memoized per policy object)."""
        found = self._rewritten.get(id(policy))
        if found is None:
            found = self._rewritten.setdefault(id(policy), (policy, self._rewrite(policy)))
        return found[1]

    def _rewrite(self, policy: Policy) -> Policy:
        family = policy.family
        backend = family.backends.get(self.backend) or family.by_value.get(self.backend)
        decided_by = DecidedBy(f"override:{self.id}", self.at, self.why)
        if backend is None:
            message = (f"{self.provenance} forces backend '{self.backend}', which is not a backend of family "
                       f"{family.name} (policy {policy.name}){did_you_mean(self.backend, family.backends)}; "
                       f"expected one of {', '.join(family.backends)}, or narrow the match with 'policy:'")
            step = Step(f"override:{self.id}", None, None, "outcome", ("invalid", None), True, True,
                        Template(message.replace("{", "(").replace("}", ")"), ()), self.at, self.why, decided_by)
            return replace(policy, steps=(*_emits(policy, None), step))
        step = Step(f"override:{self.id}", None, None, "use", backend.name, True, True, None, self.at, self.why,
                    decided_by)
        return replace(policy, family=_blaming(family, self), steps=(*_emits(policy, backend.name), step))


def _emits(policy: Policy, backend: str | None) -> tuple[Step, ...]:
    """The policy's `emit` steps, reading `call.backend` as `backend` (the forced one; None when it is no backend)."""
    return tuple(replace(s, test=_as_if_selected(s.test, backend) if s.test is not None else None,
                         arg=tuple((name, _as_if_selected(fn, backend)) for name, fn in s.arg))
                 for s in policy.steps if s.action == "emit")


def _as_if_selected(fn: Fn, backend: str | None) -> Fn:
    def with_forced_backend(ctx: Ctx) -> Any:
        if ctx.call_backend != backend:
            ctx.call_backend = backend
            ctx.memo = {}  # a value memoized before may have read call.backend unset
        return fn(ctx)

    return with_forced_backend


def _blaming(family: Family, override: Override) -> Family:
    """The family with its 'backend rejected' messages prefixed by the override's provenance."""
    messages = dict(family.messages)
    prefix = f"{override.provenance} forces {override.backend}, which does not fit: "
    for key in _REJECTIONS:
        if key in messages:
            messages[key] = Template(prefix + messages[key].text, messages[key].getters)
    return replace(family, messages=MappingProxyType(messages))


class Overrides:
    """The entries of one overrides file, in order, with a memo of (policy, model, layer, role) -> entry."""

    def __init__(self, entries: tuple[Override, ...], file: str):
        self.entries = entries
        self.file = file
        self._found: dict[tuple[Any, ...], Override | None] = {}

    def find(self, policy: str, model: str | None = None, layer: int | None = None,
             role: str | None = None) -> Override | None:
        """The first entry that matches, or None. Lock-free: the memo only ever gains equal values."""
        key = (policy, model, layer, role)
        try:
            return self._found[key]
        except KeyError:
            pass
        hit = next((o for o in self.entries if o.matches(policy, model, layer, role)), None)
        if len(self._found) > 65536:
            self._found.clear()
        self._found[key] = hit
        return hit

    def __len__(self) -> int:
        return len(self.entries)


def load_overrides(path: str | Path, tables: Iterable[Table]) -> Overrides:
    """Parse, schema-check and cross-check an overrides file against the compiled tables in use.

    RuleError lists every problem at file:line:col: a backend no family has, a policy no table has,
    a layer range whose end is before its start."""
    return _overrides_from_doc(load_yaml_file(str(path), display_name(Path(path))), tables)


def overrides_from_text(text: str, name: str, tables: Iterable[Table]) -> Overrides:
    """load_overrides of text not yet written (named `name` in messages): a writer checks what it will write."""
    return _overrides_from_doc(load_yaml_text(text, name), tables)


def _overrides_from_doc(doc: Located, tables: Iterable[Table]) -> Overrides:
    problems = schema_diagnostics(doc, SCHEMA)
    if problems:
        raise RuleError(problems)
    tables = list(tables)
    backends = {name for t in tables for f in t.families.values() for name in (*f.backends, *f.by_value)}
    policies = {name for t in tables for name in t.policies}
    entries: list[Override] = []
    problems = []
    seen: dict[str, str] = {}
    for i, raw in enumerate(doc.data["overrides"]):
        entries.append(_entry(doc, i, raw, backends, policies, seen, problems))
    if problems:
        raise RuleError(problems)
    return Overrides(tuple(entries), doc.file)


def _entry(doc: Located, i: int, raw: Mapping[str, Any], backends: set[str], policies: set[str],
           seen: dict[str, str], problems: list[Diagnostic]) -> Override:
    at = f"{doc.file}:{doc.where(('overrides', i))[0]}"
    match = raw["match"]
    layers = match.get("layers") or {}
    first, last = layers.get("from"), layers.get("to")
    if raw["id"] in seen:
        problems.append(doc.diag(("overrides", i, "id"), f"override id '{raw['id']}' is already used at "
                                                         f"{seen[raw['id']]}; give each entry its own id"))
    seen.setdefault(raw["id"], at)
    if first is not None and last is not None and last < first:
        problems.append(doc.diag(("overrides", i, "match", "layers"),
                                 f"layers: 'to' ({last}) is before 'from' ({first}); both ends are included, "
                                 "write {from: A, to: B} with A <= B"))
    if raw["backend"] not in backends:
        problems.append(doc.diag(("overrides", i, "backend"),
                                 f"backend '{raw['backend']}' is not a backend of any family in use"
                                 f"{did_you_mean(raw['backend'], backends)}; expected one of "
                                 f"{', '.join(sorted(backends))}"))
    policy = match.get("policy")
    if policy is not None and policy not in policies:
        problems.append(doc.diag(("overrides", i, "match", "policy"),
                                 f"policy '{policy}' is not a policy in use{did_you_mean(policy, policies)}; "
                                 f"expected one of {', '.join(sorted(policies))}"))
    return Override(raw["id"], raw["backend"], raw["why"], at, match.get("model"), first, last, match.get("role"),
                    policy)
