"""Exhaustive exploration of a Space by lazy forking, and the summary of one decision.

Views over facts, env and packages fork the exploration on first read (depth first, replaying the
choices before the fork point), so each run is one leaf: one class of the whole input space, with the
variables it never read left free. The leaves partition the space.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

from ..errors import EnvValueError
from ..facts import FACTS
from ..interpreter import UNSET, Result, Trace, round_sizes, run
from ..model import Ctx, Policy, RoundRow, Table
from .space import PLATFORM, PLATFORM_FACTS, Cls, Domain, Space

# ------------------------------------------------------------------ exploration

class Explorer:
    """Depth-first enumeration by replay: each run is one leaf; choices before the fork point replay."""

    __slots__ = ("space", "stack", "pos", "assigned", "log", "column")

    def __init__(self, space: Space):
        self.space = space
        self.stack: list[list[Any]] = []  # [domain, chosen index]
        self.pos = 0
        self.assigned: dict[str, int] = {}
        self.log: list[tuple[Any, Any]] | None = None  # a Memo's recording: (Domain, class) or (_PlatformFact, value)
        self.column: int | None = None  # a sweep column: this platform class is given, never forked

    def platform_fact(self, key: str) -> Any:
        """One platform fact of the sweep column (no fork), logged for a Memo as a variable of its own, so a
        decision that reads only platform.kind is shared by every column of that kind."""
        value = self.space.platform.classes[self.column].value[key]  # type: ignore[index]
        if self.log is not None:
            self.log.append((_PLATFORM_FACTS[key], value))
        return value

    def index(self, domain: Domain) -> int:
        """The class of `domain` in this run: replayed, or a new fork point (first class first)."""
        idx = self.assigned.get(domain.var)
        if idx is None:
            if len(domain.classes) == 1:
                return 0
            pos = self.pos
            if pos < len(self.stack):
                idx = self.stack[pos][1]
            else:
                self.stack.append([domain, 0])
                idx = 0
            self.pos = pos + 1
            self.assigned[domain.var] = idx
        if self.log is not None:
            self.log.append((domain, idx))
        return idx

    def choose(self, domain: Domain) -> Cls:
        return domain.classes[self.index(domain)]

    def leaf(self) -> dict[str, Cls]:
        return {d.var: d.classes[i] for d, i in self.stack[:self.pos]}

    def advance(self) -> bool:
        """Next leaf: bump the deepest choice that has classes left; False when the space is done."""
        del self.stack[self.pos:]
        while self.stack:
            top = self.stack[-1]
            if top[1] + 1 < len(top[0].classes):
                top[1] += 1
                break
            self.stack.pop()
        self.pos = 0
        self.assigned = {}
        return bool(self.stack)


class _Facts(dict[str, Any]):
    """The facts of one run: fixed ones given, forked ones filled in on first read (later reads are plain
    dict hits, so a run pays the explorer once per fact, not once per read). One per run and context."""

    __slots__ = ("x", "nullable")

    def __init__(self, x: Explorer, nullable: frozenset[str], fixed: Mapping[str, Any]):
        super().__init__(fixed)
        self.x, self.nullable = x, nullable

    def __missing__(self, key: str) -> Any:
        x = self.x
        if key in PLATFORM_FACTS:
            if x.column is not None:
                v = self[key] = x.platform_fact(key)
                return v
            platform = x.choose(x.space.platform).value
            self.update(platform)
            return platform[key]
        value = self[key] = x.choose(x.space.fact(key, key in self.nullable)).value
        return value

    def get(self, key: str, default: Any = None) -> Any:  # reads fork, as [] does
        return self[key]


class _Env(Mapping[str, str]):
    """The env of one context: a variable's class is asked of the explorer once, then kept (like _Facts)."""

    __slots__ = ("x", "seen")

    def __init__(self, x: Explorer):
        self.x = x
        self.seen: dict[str, str | None] = {}

    def _raw(self, key: str) -> str | None:
        try:
            return self.seen[key]
        except KeyError:
            v = self.x.choose(self.x.space.env(key)).value
            raw = self.seen[key] = None if v is None else str(v)
            return raw

    def __getitem__(self, key: str) -> str:
        v = self._raw(key)
        if v is None:
            raise KeyError(key)
        return v

    def get(self, key: str, default: Any = None) -> Any:
        v = self._raw(key)
        return default if v is None else v

    def __contains__(self, key: object) -> bool:
        return self._raw(str(key)) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


class _Packages:
    __slots__ = ("x", "seen")

    def __init__(self, x: Explorer):
        self.x = x
        self.seen: dict[str, bool] = {}

    def __contains__(self, name: object) -> bool:
        try:
            return self.seen[str(name)]
        except KeyError:
            v = self.seen[str(name)] = bool(self.x.choose(self.x.space.package(str(name))).value)
            return v


class Reader:
    """What a decision function receives: builds contexts whose reads fork the exploration."""

    def __init__(self, x: Explorer):
        self.x = x
        self._fixed: dict[str, dict[str, Any]] = {}
        self._fixed_of: dict[str, Policy] = {}
        self._with_platform: dict[tuple[str, int], tuple[Mapping[str, Any], dict[str, Any], dict[str, Any]]] = {}

    def ctx(self, policy: Policy, nullable: frozenset[str], platform: Mapping[str, Any] | None = None) -> Ctx:
        """A context for `policy`: varied facts fork, the others hold the policy's defaults.
        `nullable`: facts that may be null (see nullable_facts); one set for every policy compared."""
        fixed = self._fixed.get(policy.name)
        if fixed is None or self._fixed_of.get(policy.name) is not policy:
            fixed = fixed_facts(self.x.space, policy)
            self._fixed[policy.name], self._fixed_of[policy.name] = fixed, policy
        if platform is not None:  # a sweep column: the platform is given, not forked
            key = (policy.name, id(platform))
            merged = self._with_platform.get(key)
            if merged is None or merged[0] is not platform or merged[1] is not fixed:
                merged = self._with_platform[key] = (platform, fixed, {**fixed, **platform})
            fixed = merged[2]
        x = self.x  # views per context: a context keeps what it read; a new one asks the explorer again
        return Ctx(_Facts(x, nullable, fixed), _Env(x), _Packages(x))  # type: ignore[arg-type]


class Memo:
    """One decision as a function of the forking reads it makes: a trie over (variable, class) in read order.

    The decision is deterministic given the classes it reads (everything else is fixed by the context the
    caller builds the same way every time), so once a path is recorded, later runs that reach the same
    classes get the recorded answer by walking the trie. The walk asks the explorer for each variable in the
    order the decision read it, so the explorer forks exactly as a real run would: leaves and their order
    stay the same. A miss runs the decision with the explorer logging its reads and records the path."""

    __slots__ = ("root", "runs", "hits")

    def __init__(self) -> None:
        # None (empty), _Done(value) or [is a platform fact, var, Domain or _PlatformFact, {class or value: node}]
        self.root: Any = None
        self.runs = self.hits = 0

    def __call__(self, x: Explorer, compute: Callable[[], Any]) -> Any:
        node = self.root
        assigned = x.assigned
        plain = x.log is None  # no enclosing memo is recording
        platform = x.space.platform.classes[x.column].value if x.column is not None else None
        children: dict[Any, Any] | None = None  # where the walk fell off the trie
        at: Any = None
        depth = 0
        while node is not None:
            if type(node) is _Done:
                self.hits += 1
                return node.value
            fact, var, read, children = node
            if fact:  # a fact of the column's platform
                at = platform[var] if plain else x.platform_fact(var)  # type: ignore[index]
            else:
                at = assigned.get(var)  # mostly chosen already by an earlier column of the row
                if at is None or not plain:
                    at = x.index(read)
            node = children.get(at)
            depth += 1
        outer, x.log = x.log, []
        try:
            value = compute()
            path = x.log
        finally:
            x.log = outer
        if outer is not None:
            outer.extend(path)
        self.runs += 1
        seen: set[str] = set()
        steps = []
        for read, idx in path:  # a variable read again (another context of the same run) adds no branch
            if read.var not in seen:
                seen.add(read.var)
                steps.append((read, idx))
        if children is None:
            self.root = self._chain(steps, value)
        elif len(steps) < depth or steps[depth - 1][1] != at:
            raise RuntimeError("a decision read other classes than the memo walked: it is not deterministic in "
                               "the classes it reads; report this")
        else:
            children[at] = self._chain(steps[depth:], value)
        return value

    @staticmethod
    def _chain(steps: list[tuple[Any, Any]], value: Any) -> Any:
        node: Any = _Done(value)
        for read, idx in reversed(steps):
            node = [type(read) is _PlatformFact, read.var, read, {idx: node}]
        return node


class _PlatformFact(NamedTuple):
    """A platform fact as a Memo variable (sweep columns): its value is the trie key."""

    var: str
    key: str


_PLATFORM_FACTS = {f: _PlatformFact(f, f) for f in PLATFORM_FACTS}


class _Done(NamedTuple):
    value: Any


def fixed_facts(space: Space, policy: Policy) -> dict[str, Any]:
    """The facts an exploration does not vary: the policy's defaults (the platform always varies)."""
    return {f: policy.defaults.get(f, d) for f, (_, d) in FACTS.items() if f not in space.varied
            and f not in PLATFORM_FACTS}


def nullable_facts(*policies: Policy) -> frozenset[str]:
    """Facts a scenario may leave null for any of these policies (no default, or a null default)."""
    out: set[str] = set()
    for policy in policies:
        out |= {f for f, (_, d) in FACTS.items() if policy.defaults.get(f, d) is None}
    return frozenset(out)


def explore(space: Space, fn: Callable[[Reader], Any], limit: int = 2_000_000) -> Iterator[tuple[dict[str, Cls], Any]]:
    """Every leaf (the classes it fixed, fn's result) of the input space; `limit` guards a runaway space."""
    x = Explorer(space)
    reader = Reader(x)
    for _ in range(limit):
        result = fn(reader)
        yield x.leaf(), result
        if not x.advance():
            return
    raise RuntimeError(f"input space exceeds {limit} classes; narrow it (--policy) or report the rules")


# ------------------------------------------------------------------ one decision, summarised

class Answer(NamedTuple):
    """What diff and sweep compare: the answer fields that matter, and where each side decided."""

    outcome: str
    backend: str | None = None
    kernel: str | None = None
    activation_key: str | None = None
    align_hidden: int | None = None  # the round_up alignment applied (sizes round up to a multiple of it)
    align_intermediate: int | None = None
    step: str | None = None
    at: str | None = None

    def key(self) -> tuple[Any, ...]:
        return self[:6]

    def short(self) -> str:
        if self.outcome != "selected":
            return self.outcome + (f" ({self.backend})" if self.backend else "")
        parts = [self.backend or "?"]
        if self.kernel:
            parts.append(self.kernel)
        if self.activation_key:
            parts.append(f"act {self.activation_key}")
        if self.align_hidden != 1 or self.align_intermediate != 1:
            parts.append(f"round_up {self.align_hidden}/{self.align_intermediate}")
        return " ".join(parts)


_UNIT_SIZES = {"moe.hidden_size": 1, "moe.intermediate_size": 1}
_UNIT_CTX = Ctx(_UNIT_SIZES, {}, frozenset())
_STATIC_ROUNDING: dict[tuple[int, str], tuple[tuple[RoundRow, ...], bool]] = {}


def _reads_only_sizes(rows: tuple[RoundRow, ...], backend: str) -> bool:
    """round_sizes stops for `backend` at a row without a condition (it reads nothing but the sizes)."""
    hit = _STATIC_ROUNDING.get((id(rows), backend))
    if hit is None or hit[0] is not rows:
        first = next((r for r in rows if r.backends is None or backend in r.backends), None)
        hit = _STATIC_ROUNDING[(id(rows), backend)] = (rows, first is None or first.when is None)
    return hit[1]


def call_hook(table: Table) -> Callable[..., Result]:
    def call(name: str, c: Ctx, t: Trace, requested: Any = UNSET) -> Result:
        sub = Ctx(c.facts, c.env, c.packages)
        sub.memo = c.memo
        return run(table.policies[name], sub, t, call, requested)
    return call


def decide(table: Table, policy: Policy, ctx: Ctx, hook: Callable[..., Result] | None = None,
           trace: Trace = None) -> Answer:
    """The fast-path decision of one policy on one (possibly forking) context."""
    try:
        res = run(policy, ctx, trace, hook or call_hook(table))
    except EnvValueError:
        return Answer("invalid", step="env", at=None)
    step = res.decided_by
    where = (step.id, step.at) if step is not None else (None, None)
    if res.outcome == "selected" and res.backend is not None and res.family is not None:
        # sizes of 1 round up to the alignment itself: the rounding rule, without forking on every size class;
        # every other fact is the question's own (a sweep column's platform, a policy's default activation)
        rows, name = res.family.round_up, res.backend.name
        if _reads_only_sizes(rows, name):  # the backend's rounding row has no condition: no context to build
            unit = _UNIT_CTX
        elif isinstance(ctx.facts, _Facts):
            facts = ctx.facts
            unit_facts = _Facts(facts.x, facts.nullable, facts)
            unit_facts.update(_UNIT_SIZES)
            unit = Ctx(unit_facts, ctx.env, ctx.packages)
        else:
            unit = Ctx({**ctx.facts, **_UNIT_SIZES}, ctx.env, ctx.packages)
        h, i = round_sizes(rows, name, unit)
        kernel = res.kernel.name if res.kernel and res.report_kernel else None
        ak = res.activation_key
        return Answer("selected", res.backend.value, kernel, ak if isinstance(ak, str) else None, h, i, *where)
    return Answer(res.outcome, res.reported_backend, None, None, None, None, *where)


def scenario_of(leaf: Mapping[str, Cls], policy: str, profile: str | None = None) -> dict[str, Any]:
    """A concrete scenario (the contract's shape) inside a class: the representatives of what it fixed."""
    sc: dict[str, Any] = {"policy": policy}
    if profile:
        sc["profile"] = profile
    for var, cl in leaf.items():
        kind, _, name = var.partition(":")
        if var == PLATFORM:
            p = cl.value
            plat: dict[str, Any] = {"kind": p["platform.kind"]}
            if p["platform.kind"] == "cuda":
                plat["capability"] = list(p["platform.capability"])
            elif p["platform.kind"] == "rocm":
                plat["gcn_arch"] = p["platform.gcn_arch"]
            elif p["platform.amx"]:
                plat["amx"] = True
            sc["platform"] = plat
        elif kind == "env" and cl.value is not None:
            sc.setdefault("env", {})[name] = cl.value
        elif kind == "package":
            sc.setdefault("packages", {})[name] = cl.value
        elif kind == "fact":
            *path, last = name.split(".")
            node = sc
            for part in path:
                node = node.setdefault(part, {})
            node[last] = list(cl.value) if isinstance(cl.value, tuple) else cl.value
    return sc


def describe(leaf: Mapping[str, Cls]) -> str:
    """One line naming the classes a leaf fixed (everything else: any value)."""
    return "; ".join(cl.label for cl in leaf.values()) or "every input"
