"""Exploration in coarse classes (lint): a leaf splits a variable only where a condition's answer differs.

The plain explorer (explore.py) forks a variable into all of its classes at the first read, so a variable
with many classes (vllm-0.33's activations) multiplies every later fork, although most conditions that read
it only ask whether it is in one list. Here the conditions the interpreter tests, step conditions and kernel
acceptance, are first evaluated for every combination of classes that the current leaf still leaves open for
the variables they read (a probe, memoized per condition on those variables' open classes); the leaf then
forks only into groups of classes that give the same answer after the same further reads. Any other read
splits the variable into single classes, as the plain explorer does.

Why this is exact: every condition is constant on a leaf and every other read sees one class, so all inputs
of a leaf run the same steps and get the same answer; the leaves still cover the input space once. What lint
collects per leaf therefore holds for each input in it: only the number of leaves (classes) is smaller.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from ..errors import EnvValueError
from ..model import Check, Cond, Ctx, Family, Fn, Kernel, Policy, Table
from .space import PLATFORM_FACTS, Cls, Domain, Space, _merge_label

Group = tuple[int, ...]  # the classes of one variable a leaf still allows, by index


class Refiner:
    """Depth-first enumeration by replay, where a fork chooses a group of classes of one variable."""

    def __init__(self, space: Space, read: set[str]):
        self.space = space
        self.stack: list[list[Any]] = []  # [domain, options (groups), chosen option]
        self.pos = 0
        self.groups: dict[str, Group] = {}  # this run: each split variable's group
        self.read = read  # variables (with more than one class) some decision read
        self._plans: dict[Any, Any] = {}  # (condition, ctx state) -> trie over the open groups it reads
        self._domains: dict[str, Domain] = {}

    # ---------------------------------------------------------- forks
    def split(self, domain: Domain, options: tuple[Group, ...]) -> int:
        """Which of `options` (groups covering what the leaf left open) this run takes: replayed, or a new fork."""
        pos = self.pos
        if pos < len(self.stack):
            entry = self.stack[pos]
            if entry[0].var != domain.var:
                raise RuntimeError(f"replay read {domain.var} where the first run split {entry[0].var}: "
                                   "a decision is not deterministic in its inputs; report this")
            k: int = entry[2]
        else:
            self.stack.append([domain, options, 0])
            k = 0
        self.pos = pos + 1
        self.groups[domain.var] = options[k]
        return k

    def value(self, domain: Domain) -> Any:
        """A plain read: the variable's class, splitting what the leaf leaves open into single classes."""
        classes = domain.classes
        if len(classes) == 1:
            return classes[0].value
        group = self.groups.get(domain.var)
        if group is None:
            self.read.add(domain.var)
            group = tuple(range(len(classes)))
        if len(group) > 1:
            return classes[group[self.split(domain, tuple((i,) for i in group))]].value
        return classes[group[0]].value

    def leaf(self) -> dict[str, Cls]:
        """The classes this leaf fixed: each variable it split, as the group of classes left."""
        out: dict[str, Cls] = {}
        for domain, _, _ in self.stack[:self.pos]:
            if domain.var not in out:
                out[domain.var] = _joined(domain, self.groups[domain.var])
        return out

    def advance(self) -> bool:
        more = _bump(self.stack, self.pos)
        self.pos, self.groups = 0, {}
        return more

    # ---------------------------------------------------------- conditions
    def decide(self, fn: Fn, ctx: Ctx) -> Any:
        """fn(ctx) (truth value) on this leaf, splitting the leaf where the answer differs."""
        state = (fn, ctx.weight_key, ctx.activation_key, ctx.requested_key, ctx.call_backend)
        plan = self._plans.get(state)
        groups = self.groups
        while type(plan) is list:  # [var, {group or None: node}]
            plan = plan[1].get(groups.get(plan[0]), _MISSING)
        if plan is None or plan is _MISSING:
            plan = self._probe(fn, ctx, state)
        while plan[0] == "N":  # ("N", var, options, plans): split the leaf
            plan = plan[3][self.split(self._domains[plan[1]], plan[2])]
        if plan[0] == "E":
            raise EnvValueError(plan[1])
        return plan[1]

    def _probe(self, fn: Fn, ctx: Ctx, state: tuple[Any, ...]) -> tuple[Any, ...]:
        """Evaluate fn for every open class combination it reads; store the reduced plan under the groups read."""
        probe = _Probe(self, ctx)
        tree: dict[Any, Any] = {}  # {var: {class: subtree}} or {"=": result}
        while True:
            try:
                result: tuple[Any, ...] = ("L", bool(fn(probe.ctx())))
            except EnvValueError as exc:
                result = ("E", str(exc))
            node = tree
            for var, idx in probe.path():
                node = node.setdefault(var, {}).setdefault(idx, {})
            node["="] = result
            if not probe.advance():
                break
        plan = _reduce(tree)
        self._domains.update(probe.domains)
        order = probe.order
        if not order:
            self._plans[state] = plan
            return plan
        trie: list[Any] = self._plans.get(state)  # type: ignore[assignment]
        if type(trie) is not list:
            trie = self._plans[state] = [order[0][0], {}]
        for k, (var, group) in enumerate(order):
            if trie[0] != var:
                raise RuntimeError(f"condition read {var} where an earlier probe read {trie[0]}; report this")
            if k + 1 == len(order):
                trie[1][group] = plan
            else:
                nxt = trie[1].get(group)
                if type(nxt) is not list:
                    nxt = trie[1][group] = [order[k + 1][0], {}]
                trie = nxt
        return plan


_MISSING: Any = object()


def _reduce(tree: dict[Any, Any]) -> tuple[Any, ...]:
    """The probe's tree as a plan: classes with equal subtrees form one option; one option is no fork."""
    if "=" in tree:
        result: tuple[Any, ...] = tree["="]
        return result
    ((var, kids),) = tree.items()
    by_plan: dict[tuple[Any, ...], list[int]] = {}
    for idx, sub in kids.items():
        by_plan.setdefault(_reduce(sub), []).append(idx)
    if len(by_plan) == 1:
        return next(iter(by_plan))
    options = sorted((tuple(sorted(idxs)), plan) for plan, idxs in by_plan.items())
    return ("N", var, tuple(g for g, _ in options), tuple(p for _, p in options))


class _Probe:
    """Replays one condition over the open classes of what it reads (a small depth-first enumeration)."""

    def __init__(self, r: Refiner, ctx: Ctx):
        self.r = r
        self.src = ctx
        self.fixed: Mapping[str, Any] = ctx.facts.fixed if isinstance(ctx.facts, _Facts) else ctx.facts
        self.stack: list[list[Any]] = []  # [var, group, position in group]
        self.pos = 0
        self.chosen: dict[str, int] = {}
        self.order: list[tuple[str, Group | None]] = []  # every variable read, with the group it had, first read first
        self.seen: set[str] = set()
        self.domains: dict[str, Domain] = {}

    def ctx(self) -> Ctx:
        src = self.src
        c = Ctx(_Facts(self, src.facts.nullable if isinstance(src.facts, _Facts) else frozenset(), self.fixed),
                _Env(self), _Packages(self))  # type: ignore[arg-type]
        c.weight_key, c.activation_key = src.weight_key, src.activation_key
        c.requested_key, c.call_backend = src.requested_key, src.call_backend
        return c

    def value(self, domain: Domain) -> Any:
        classes = domain.classes
        if len(classes) == 1:
            return classes[0].value
        var = domain.var
        group = self.r.groups.get(var)
        if var not in self.seen:
            self.seen.add(var)
            self.order.append((var, group))
            self.domains[var] = domain
            self.r.read.add(var)
        if group is None:
            group = tuple(range(len(classes)))
        if len(group) == 1:
            return classes[group[0]].value
        idx = self.chosen.get(var)
        if idx is None:
            pos = self.pos
            if pos < len(self.stack):
                idx = self.stack[pos][1][self.stack[pos][2]]
            else:
                self.stack.append([var, group, 0])
                idx = group[0]
            self.pos = pos + 1
            self.chosen[var] = idx
        return classes[idx].value

    def path(self) -> list[tuple[str, int]]:
        return [(var, group[k]) for var, group, k in self.stack[:self.pos]]

    def advance(self) -> bool:
        more = _bump(self.stack, self.pos)
        self.pos, self.chosen = 0, {}
        return more


def _bump(stack: list[Any], depth: int) -> bool:
    """Next leaf of a depth-first walk whose entries are [variable, group, k]: drop the choices below
    `depth`, bump the deepest that has members left; False when the space is done."""
    del stack[depth:]
    while stack:
        top = stack[-1]
        if top[2] + 1 < len(top[1]):
            top[2] += 1
            return True
        stack.pop()
    return False


def _joined(domain: Domain, group: Group) -> Cls:
    """One class standing for a group: the members' labels (the variable's name once), the first's value."""
    if len(group) == len(domain.classes) or len(group) == 1:
        return domain.classes[group[0]] if len(group) == 1 else Cls(_label(domain, group), domain.classes[0].value)
    return Cls(_label(domain, group), domain.classes[group[0]].value)


def _label(domain: Domain, group: Group) -> str:
    labels = [domain.classes[i].label for i in group]
    if "=" in labels[0]:
        name = labels[0].split("=", 1)[0] + "="
        return name + "|".join(lbl.split("=", 1)[1] for lbl in labels)
    return _merge_label("|".join(labels))


# ------------------------------------------------------------------ views a run reads

class _Facts(dict[str, Any]):
    """Facts of one run (or probe): fixed ones given, others resolved on first read and then kept."""

    __slots__ = ("r", "nullable", "fixed")

    def __init__(self, r: Refiner | _Probe, nullable: frozenset[str], fixed: Mapping[str, Any]):
        super().__init__(fixed)
        self.r, self.nullable, self.fixed = r, nullable, fixed

    def __missing__(self, key: str) -> Any:
        r = self.r
        space = r.r.space if isinstance(r, _Probe) else r.space
        if key in PLATFORM_FACTS:
            platform = r.value(space.platform)
            self.update(platform)
            return platform[key]
        value = self[key] = r.value(space.fact(key, key in self.nullable))
        return value

    def get(self, key: str, default: Any = None) -> Any:  # reads split, as [] does
        return self[key]


class _Env(Mapping[str, str]):
    __slots__ = ("r",)

    def __init__(self, r: Refiner | _Probe):
        self.r = r

    def _space(self) -> Space:
        r = self.r
        return r.r.space if isinstance(r, _Probe) else r.space

    def __getitem__(self, key: str) -> str:
        v = self.r.value(self._space().env(key))
        if v is None:
            raise KeyError(key)
        return str(v)

    def get(self, key: str, default: Any = None) -> Any:
        v = self.r.value(self._space().env(key))
        return default if v is None else str(v)

    def __contains__(self, key: object) -> bool:
        return self.r.value(self._space().env(str(key))) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


class _Packages:
    __slots__ = ("r",)

    def __init__(self, r: Refiner | _Probe):
        self.r = r

    def __contains__(self, name: object) -> bool:
        r = self.r
        space = r.r.space if isinstance(r, _Probe) else r.space
        return bool(r.value(space.package(str(name))))


# ------------------------------------------------------------------ the table lint runs

class Coarse:
    """A copy of a table whose step conditions and kernel acceptance split the current Refiner's leaves by
    answer; `kernel_of` maps each copied kernel back to the table's own."""

    def __init__(self, table: Table):
        self.refiner: Refiner | None = None
        self.read: set[str] = set()  # variables (with more than one class) some run read
        self.kernel_of: dict[int, Kernel] = {}
        copies: dict[int, Kernel] = {}

        def wrap(fn: Fn) -> Fn:
            def coarse(ctx: Ctx) -> Any:
                r = self.refiner
                return fn(ctx) if r is None else r.decide(fn, ctx)
            return coarse

        def check(c: Check) -> Check:
            # lint reads no refusal text: the reason keeps its words but reads no facts (no split for a message)
            reason = replace(c.reason, getters=tuple((name, None) for name, _ in c.reason.getters))
            return replace(c, cond=Cond(c.cond.code, c.cond.text, c.cond._compile, wrap(c.cond.fn)), reason=reason)

        def kernel(k: Kernel) -> Kernel:
            copy = copies.get(id(k))
            if copy is None:
                checks = tuple(check(c) for c in k.checks)
                tests = tuple(c.cond.fn for c in checks)

                def accepts(ctx: Ctx, tests: tuple[Fn, ...] = tests) -> bool:  # k.accepts, one check at a time
                    for test in tests:
                        if not test(ctx):
                            return False
                    return True
                copy = copies[id(k)] = replace(k, checks=checks, accepts=accepts)
                self.kernel_of[id(copy)] = k
            return copy

        families: dict[str, Family] = {}
        for name, fam in table.families.items():
            backends = {n: replace(b, kernels=tuple(kernel(k) for k in b.kernels),
                                   explicit_kernels=None if b.explicit_kernels is None
                                   else tuple(kernel(k) for k in b.explicit_kernels))
                        for n, b in fam.backends.items()}
            by_value = {v: backends[b.name] for v, b in fam.by_value.items()}
            families[name] = replace(fam, backends=MappingProxyType(backends), by_value=MappingProxyType(by_value),
                                     batched=None if fam.batched is None else wrap(fam.batched))
        policies: dict[str, Policy] = {
            n: replace(p, family=families[p.family.name],
                       steps=tuple(s if s.test is None else replace(s, test=wrap(s.test)) for s in p.steps))
            for n, p in table.policies.items()}
        self.table = replace(table, policies=MappingProxyType(policies), families=MappingProxyType(families))

    def ctx(self, r: Refiner, nullable: frozenset[str], fixed: Mapping[str, Any]) -> Ctx:
        return Ctx(_Facts(r, nullable, fixed), _Env(r), _Packages(r))  # type: ignore[arg-type]


def explore_coarse(space: Space, coarse: Coarse, fn: Callable[[Refiner], Any], limit: int = 2_000_000
                   ) -> Iterator[tuple[Refiner, Any]]:
    """Every coarse leaf: the refiner standing on it (r.leaf() names its classes, until the next leaf) and fn's
    result; `limit` guards a runaway space."""
    r = Refiner(space, coarse.read)
    coarse.refiner = r
    try:
        for _ in range(limit):
            result = fn(r)
            yield r, result
            if not r.advance():
                return
    finally:
        coarse.refiner = None
    raise RuntimeError(f"input space exceeds {limit} classes; narrow it (--policy) or report the rules")
