"""Cross-reference checks of a family's round_up rows (part of stage 4, oracle.semantics): rows that can never
be used and alignments that break the weight format's block, both silent until conversion otherwise."""
from __future__ import annotations

from typing import Any

from . import literals
from .loader import Entry


class RoundUpChecks:
    """Mixed into oracle.semantics.Semantics, whose `err` reports at a rule's place."""

    def err(self, entry: Entry, message: str, *sub: Any) -> None:
        raise NotImplementedError

    def round_up_rows(self, e: Entry, d: dict[str, Any]) -> None:
        """round_up rows are tried in order and the first that applies wins: a row that an earlier
        unconditional row covers for each of its backends is never used; an alignment other than 1 (the
        sizes as they are) must be a multiple of the weight format's block, or conversion fails later."""
        rows = [r for r in d.get("round_up") or [] if isinstance(r, dict)]
        backends = d.get("backends") or {}
        covered: dict[str, int] = {}  # backend -> the unconditional row (index) that answers for it first
        catch_all: int | None = None

        def row_at(k: int) -> str:
            return f"row {k + 1} at line {e.doc.where(e.path + ('round_up', k))[0]}"
        for i, row in enumerate(rows):
            names = row.get("backends")
            if catch_all is not None:
                self.err(e, f"round_up row {i + 1} is never used: the earlier {row_at(catch_all)} "
                            "names no backends and has no 'when', so it answers for every backend first; move this "
                            "row above it or delete it", "round_up", i)
                continue
            if isinstance(names, list):
                shadowed = [b for b in names if b in covered]
                if shadowed and len(shadowed) == len(names):
                    first = covered[shadowed[0]]
                    self.err(e, f"round_up row {i + 1} is never used: an earlier row without 'when' answers first "
                                f"for {', '.join(shadowed)} ({row_at(first)}); move this "
                                "row above it or delete it", "round_up", i)
                elif shadowed:
                    self.err(e, f"round_up row {i + 1} is never used for {', '.join(shadowed)}: an earlier row "
                                f"without 'when' answers first for them ({row_at(covered[shadowed[0]])}); remove them "
                                "from this row",
                             "round_up", i, "backends")
                if "when" not in row:
                    for b in names:
                        covered.setdefault(b, i)
            elif "when" not in row:
                catch_all = i
            for size in ("intermediate", "hidden"):
                align = row.get(size)
                if not isinstance(align, int) or align == 1:
                    continue
                for fmt_name, block in self.weight_blocks(d, backends, names):
                    if align % block:
                        self.err(e, f"round_up {size} alignment {align} is not a multiple of {block}, the block "
                                    f"size of {fmt_name} weights (every {block} elements share a scale); use a "
                                    f"multiple of {block} (e.g. {-(-align // block) * block}) or 1 for the sizes "
                                    "as they are", "round_up", i, size)
                        break

    def weight_blocks(self, d: dict[str, Any], backends: dict[str, Any], names: Any) -> list[tuple[str, int]]:
        """(format, block size) of the weights the named backends (all when None) convert: the family's
        weight_key, else each backend's quant config kind's weight format."""
        found = literals.weight_format(d.get("weight_key"))
        out = [found] if found else []
        kinds = d.get("quant_configs") or {}
        for name in (names if isinstance(names, list) else list(backends)):
            kind = kinds.get((backends.get(name) or {}).get("quant_config"))
            fmt = literals.weight_format(kind.get("weight")) if isinstance(kind, dict) else None
            if fmt and fmt not in out:
                out.append(fmt)
        return out
