"""Stage 7: run a compiled policy against one question. Pure: reads only the Ctx it is given.

Two modes share one code path: the fast mode stops at the first failing check and keeps
no trace; the trace mode (used lazily by Decision.trace and by explain) evaluates every
check of every candidate so that all reasons are reported, not only vLLM's first one.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import EnvValueError
from .model import FROM_SCENARIO, REQUESTED, Backend, Check, Ctx, Family, Fn, Kernel, Policy, RoundRow, Step
from .trace import CallEntry, CandidateEntry, Entry, Failure, StepEntry

Trace = list[Entry] | None
CallPolicy = Callable[[str, Ctx, Trace, Any], "Result"]
UNSET: Any = object()  # `requested` not given: the policy's own activation_key decides


@dataclass(slots=True)  # one per question on the fast path: slots and no default factory keep it cheap
class Result:
    """What a policy run decided, before it becomes a Decision."""

    outcome: str
    backend: Backend | None = None
    kernel: Kernel | None = None
    report_kernel: bool = True
    activation_key: Any = None
    error: Any = None  # a message, or a function that renders it when first read
    emits: Mapping[str, Any] | None = None
    decided_by: Step | None = None
    reported_backend: str | None = None  # for outcome none: the backend value to report, if any
    family: Family | None = None  # the family of `backend`


def _keys(family: Family, backend: Backend, ctx: Ctx) -> None:
    wk = family.weight_key
    ctx.weight_key = ctx.facts["moe.weight_key"] if wk == FROM_SCENARIO else wk
    ak = backend.activation_key
    ctx.activation_key = (ctx.facts["moe.activation_key"] if ak == FROM_SCENARIO
                          else ctx.requested_key if ak == REQUESTED else ak)


def _words(ctx: Ctx, backend: Backend | None = None, reason: str | None = None) -> dict[str, Any]:
    return {"backend": backend.value if backend else None, "reason": reason, "weight_key": ctx.weight_key,
            "activation_key": ctx.activation_key}


def _reason(check: Check, ctx: Ctx, family: Family) -> str:
    fmt = "('batched_experts',)" if family.batched is not None and family.batched(ctx) else "standard"
    return check.reason.render(ctx, {**_words(ctx), "activation_format": fmt})


def try_backend(family: Family, backend: Backend, ctx: Ctx, trace: Trace, step: Step,
                explicit: bool = False) -> tuple[Kernel | None, Any]:
    """First kernel of `backend` that accepts the question, or (None, why the last kernel tried refused).

    `explicit`: the backend was named by the moe_backend string (its explicit_kernels, if any, are tried).
    In fast mode the refusal is the last refusing Kernel; its reason is rendered only if a message needs it."""
    _keys(family, backend, ctx)
    kernels = backend.explicit_kernels if explicit and backend.explicit_kernels is not None else backend.kernels
    if trace is None:
        last = None
        for kernel in kernels:
            if kernel.accepts(ctx):
                return kernel, None
            last = kernel
        return None, last
    reason = None
    for kernel in kernels:
        failures = []
        for check in kernel.checks:
            note: str | None = None
            try:
                ok = check.fn(ctx)
            except EnvValueError as exc:
                ok, note = False, str(exc)
            if not ok:
                why = () if note or check.why_false is None else check.why_false(ctx)
                failures.append(Failure(check.name, note or _reason(check, ctx, family), check.text, why))
        trace.append(CandidateEntry(backend.name, kernel.name, not failures, tuple(failures), step.id, kernel.at))
        if not failures:
            return kernel, None
        reason = failures[0].reason
    return None, reason


def _selected(family: Family, backend: Backend, kernel: Kernel | None, ctx: Ctx, step: Step,
              report: bool = True) -> Result:
    return Result("selected", backend, kernel, report and not (kernel and kernel.function_check),
                  ctx.activation_key, decided_by=step, family=family)


def _use(family: Family, backend: Backend, ctx: Ctx, trace: Trace, step: Step, explicit: bool = False) -> Result:
    """Force `backend`: selected if one of its kernels accepts (or unchecked), else invalid with the reason."""
    if not step.check:
        _keys(family, backend, ctx)
        first = backend.kernels[0] if backend.kernels else None
        if trace is not None:
            trace.append(CandidateEntry(backend.name, first.name if first else None, True, (), step.id, backend.at,
                                        unchecked=True))
        return _selected(family, backend, first, ctx, step, step.report_kernel)
    kernel, refusal = try_backend(family, backend, ctx, trace, step, explicit)
    if kernel is not None:
        return _selected(family, backend, kernel, ctx, step, step.report_kernel)
    if isinstance(refusal, Kernel):
        check = refusal.first_failure(ctx)
        reason = _reason(check, ctx, family) if check is not None else None
    else:
        reason = refusal
    key = "backend_rejected" if reason else "backend_rejected_no_reason"
    words = _words(ctx, backend, reason)
    return Result("invalid", backend, error=lambda: family.messages[key].render(ctx, words), decided_by=step)


def map_explicit(family: Family, ctx: Ctx, remap: bool = True) -> tuple[tuple[str, ...] | None, str | None]:
    """The backends an explicit moe_backend string names, in order (batched remap applied), or (None, why not)."""
    names = family.explicit.get(ctx.facts["moe.moe_backend"])
    if names is None:
        if not family.explicit:
            return None, f"family {family.name} takes no explicit moe_backend"
        keys = ", ".join(f"'{k}'" for k in family.explicit)
        return None, family.messages["unknown_moe_backend"].render(ctx, {"explicit_keys": keys})
    if remap and family.batched is not None and family.batched(ctx):
        names = tuple(family.explicit_batched.get(n, n) for n in names)
    return names, None


def prefer_activation(family: Family, names: list[str], key: str | None) -> list[str]:
    """Candidates whose own activation key is `key` (and those that take the requested key) first, then the
    BF16 ones; without a requested key the BF16 ones, or the list unchanged when it has none."""
    def own(name: str) -> Any:
        ak = family.backends[name].activation_key
        return None if ak in (REQUESTED, FROM_SCENARIO) else ak

    bf16 = [n for n in names if own(n) is None]
    if key is None:
        return bf16 or list(names)
    matching = [n for n in names if own(n) == key or family.backends[n].activation_key == REQUESTED]
    return matching + [n for n in bf16 if n not in matching]


def move(names: list[str], name: str, where: tuple[str, str]) -> list[str]:
    """`name` placed directly before or after another candidate; unchanged unless both are candidates."""
    side, anchor = where
    if name not in names or anchor not in names or name == anchor:
        return names
    out = [n for n in names if n != name]
    out.insert(out.index(anchor) + (side == "after"), name)
    return out


def _use_explicit(family: Family, ctx: Ctx, trace: Trace, step: Step) -> Result:
    """The backends the moe_backend string names, tried in turn (optionally filtered by the requested
    activation key): the first that accepts is selected, else the last refusal is the answer."""
    names, refusal = map_explicit(family, ctx)
    if names is None:
        return Result("invalid", error=refusal, decided_by=step)
    if step.options.get("prefer_activation"):
        names = tuple(prefer_activation(family, list(names), ctx.requested_key))
        if not names:
            words = {"activation_key": ctx.requested_key}
            return Result("invalid", error=lambda: family.messages["no_explicit_candidate"].render(ctx, words),
                          decided_by=step)
    res = Result("invalid", decided_by=step)
    for name in names:
        res = _use(family, family.backends[name], ctx, trace, step, explicit=True)
        if res.outcome == "selected":
            break
    return res


def step_chain(policy: Policy, function: Callable[[str], Fn]) -> Fn | None:
    """One generated expression giving the index of the first step whose condition holds (len(steps) if none),
    for the fast mode: the steps before it are skipped without a Python loop or a call per condition. The
    conditions are evaluated in the same order and stop at the same place as the loop would. `function`
    compiles code in the namespace the policy's conditions were compiled in (its table's CodeGen)."""
    parts = []
    for i, step in enumerate(policy.steps):
        if step.when is None:
            parts.append(str(i))
            break
        parts.append(f"{i} if ({step.when.code}) else")
    else:
        parts.append(str(len(policy.steps)))
    return function(" ".join(parts)) if len(parts) > 2 else None


def run(policy: Policy, ctx: Ctx, trace: Trace, call_policy: CallPolicy, requested: Any = UNSET,
        first_step: Fn | None = None) -> Result:
    """Walk the steps. `requested`: the activation key a calling step binds (else the policy's own).
    `first_step`: the policy's step_chain, for the fast mode only (a trace records every condition)."""
    family = policy.family
    candidates: tuple[str, ...] | list[str] = policy.candidates  # copied only by a step that changes it
    if requested is UNSET:
        requested = policy.activation_key(ctx) if policy.activation_key is not None else None
    ctx.requested_key = requested
    emits: dict[str, Any] = {}
    call_result: Result | None = None
    steps = policy.steps
    if first_step is not None and trace is None:
        start = first_step(ctx)  # that step's condition is tested once more below: pure, and memoized
        if start:
            steps = steps[start:]
    for step in steps:
        test = step.test
        if test is not None:
            matched = test(ctx)
            if trace is not None:
                when_text = step.when.text if step.when else None
                trace.append(StepEntry(step.id, bool(matched), step.at, step.why, when_text))
            if not matched:
                continue
        elif trace is not None:
            trace.append(StepEntry(step.id, True, step.at, step.why))
        action, arg = step.action, step.arg
        if action == "try":
            for name in (candidates if arg == "candidates" else arg):
                backend = family.backends[name]
                kernel, _ = try_backend(family, backend, ctx, trace, step)
                if kernel is not None:
                    return _finish(_selected(family, backend, kernel, ctx, step, step.report_kernel), emits)
            continue
        if action == "use":
            return _finish(_use(family, family.backends[arg], ctx, trace, step), emits)
        if action == "drop":
            dropped = set(arg)
            before = candidates
            candidates = [c for c in candidates if c not in dropped]
            if trace is not None and len(candidates) == len(before):
                _no_op(trace, f"none of {', '.join(arg)} is among the candidates {list(before)}")
            continue
        if action == "use_explicit":
            return _finish(_use_explicit(family, ctx, trace, step), emits)
        if action == "candidates":
            if trace is not None and list(arg) == list(candidates):
                _no_op(trace, f"the candidates are already {list(arg)}")
            candidates = list(arg)
            continue
        if action == "move":
            before = candidates
            candidates = move(list(candidates), arg, step.options["where"])
            if trace is not None and list(candidates) == list(before):
                side, anchor = step.options["where"]
                missing = [n for n in (arg, anchor) if n not in before]
                _no_op(trace, f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not among the "
                              f"candidates {list(before)}" if missing else f"{arg} is already {side} {anchor}")
            continue
        if action == "prefer_activation":
            before = candidates
            candidates = prefer_activation(family, list(candidates), ctx.requested_key)
            if trace is not None and list(candidates) == list(before):
                _no_op(trace, f"the candidates are already in preferred order for activation key "
                              f"{ctx.requested_key or 'bf16'}")
            continue
        if action == "request_activation":
            ctx.requested_key = arg(ctx)
            continue
        if action == "outcome":
            outcome, report = arg
            message = step.message
            res = Result(outcome, error=(lambda m=message: m.render(ctx, {})) if message else None, decided_by=step)
            if report is not None:
                res.reported_backend = family.backends[report].value
            return _finish(res, emits)
        if action == "emit":
            for name, fn in arg:
                emits[name] = fn(ctx)
            continue
        if action == "call":
            sub_trace: Trace = [] if trace is not None else None
            binding = step.options.get("activation_key")
            call_result = call_policy(arg, ctx, sub_trace, binding(ctx) if binding is not None else UNSET)
            if trace is not None:
                trace.append(CallEntry(step.id, arg, call_result.outcome, tuple(sub_trace or ()), step.at))
            if call_result.outcome in ("invalid", "unsupported", "error"):
                return _finish(call_result, emits)
            ctx.call_backend = call_result.backend.name if call_result.backend else None
            ctx.memo = {}  # anything memoized so far may have read call.backend before it was set
            continue
        if action == "result":
            if call_result is None:
                return Result("error",
                              error=f"step '{step.id}' ({step.at}) returns a call result but no call ran before it")
            return _finish(call_result, emits)
    return Result("error", error=f"policy '{policy.name}' ({policy.at}) ended without a decision")


def _no_op(trace: list[Entry], why: str) -> None:
    """Marks the step just traced (matched) as one that changed nothing, saying why."""
    last = trace[-1]
    if isinstance(last, StepEntry):
        trace[-1] = last._replace(no_op=why)


def _finish(res: Result, emits: dict[str, Any]) -> Result:
    if emits:
        res.emits = {**(res.emits or {}), **emits}
    return res


def round_sizes(rows: tuple[RoundRow, ...], backend_name: str, ctx: Ctx) -> tuple[int, int]:
    """Hidden and intermediate sizes after the first matching alignment row."""
    hidden = ctx.facts["moe.hidden_size"]
    inter = ctx.facts["moe.intermediate_size"]
    for row in rows:
        if row.backends is not None and backend_name not in row.backends:
            continue
        if row.when is not None and not row.when(ctx):
            continue
        if inter is not None:
            inter = -(-inter // row.intermediate) * row.intermediate
        if row.hidden and hidden is not None:
            hidden = -(-hidden // row.hidden) * row.hidden
        break
    return hidden, inter
