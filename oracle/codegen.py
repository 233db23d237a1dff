"""The only `eval` in moe-oracle: compiled rule expressions become Python functions here.

Why generate code: a condition tree of closures costs one Python call per node; one expression
per kernel or step costs one. Safety: the source is built only from the operator table's fixed
templates and constant-table references (`K[n]`); no text from a rule file ever becomes source,
and the namespace has no builtins. Rule values are data in K: compared, never run.
`source()` prints every generated function with the constants it reads, for debugging.
"""
from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

Fn = Callable[[Any], Any]
# what a lazy function runs until its first call compiles it: `pending` is (the function itself, its code)
_TRAMPOLINE = eval("lambda ctx, pending=None: _compile_pending(pending, ctx)").__code__  # noqa: S307 - fixed text


class CodeGen:
    """Constant table + compiler of `lambda ctx: <expression>` functions over it."""

    def __init__(self) -> None:
        self._consts: list[Any] = []
        self._ns: dict[str, Any] = {"K": self._consts, "__builtins__": {}, "_compile_pending": self._compile_pending}
        self._sources: list[str] = []

    def k(self, value: Any) -> str:
        """Reference to a constant: the only way rule data reaches generated code."""
        self._consts.append(value)
        return f"K[{len(self._consts) - 1}]"

    def function(self, code: str) -> Fn:
        source = f"lambda ctx: {code}"
        self._sources.append(source)
        fn: Fn = eval(source, self._ns)  # noqa: S307 - built from operator templates and K[n] references only
        return fn

    def lazy_function(self, code: str) -> Fn:
        """`function(code)`, compiled when first called (loading a table compiles nothing a question never runs).
        The returned function object stays the one callers hold: its first call swaps the compiled code into it,
        so later calls cost exactly what `function(code)` would."""
        fn = types.FunctionType(_TRAMPOLINE, self._ns, "generated")
        fn.__defaults__ = ((fn, code),)
        return fn

    def _compile_pending(self, pending: tuple[types.FunctionType, str], ctx: Any) -> Any:
        fn, code = pending
        compiled = self.function(code)
        fn.__code__ = compiled.__code__  # two threads may both get here: equal code, either one stays
        fn.__defaults__ = None
        return compiled(ctx)

    def source(self) -> str:
        """Every function compiled so far, then the constants they reference (compilation is lazy)."""
        lines = [f"f{i}: {src}" for i, src in enumerate(self._sources)]
        lines += [f"K[{i}] = {value!r}" for i, value in enumerate(self._consts)]
        return "\n".join(lines)
