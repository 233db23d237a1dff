"""The bounds on what the oracle reads, in one place: every input is refused past them with its place, the
limit and how to stay under it, so that no input costs unbounded time or memory or reaches a Python limit
(the recursion limit, the int-to-str conversion limit, the parser's nesting limit) as an internal error.

Each bound is far above what a real rule file or question needs (the shipped rules: under 30 KB a file,
YAML nesting 16, conditions nested 6, a few dozen aliases, under 6,000 nodes a file).
"""
from __future__ import annotations

from typing import Any

MAX_FILE_BYTES = 1 << 20  # a rule, profiles, overrides, scenario or lint baseline file
MAX_GOLDEN_BYTES = 1 << 28  # a golden decision file of `moe-oracle test` (one line a case: 10^5-10^6 cases)
MAX_GIT_FILES = 4096  # files of a `diff git:REV:PATH` tree (a rules directory has a few dozen)
MAX_GIT_BYTES = 1 << 26  # their bytes together, checked before git archive reads any
MAX_METADATA_BYTES = 1 << 26  # a checkpoint's config.json or safetensors index (the largest real ones: a few MB)
MAX_YAML_DEPTH = 64  # nested mappings and sequences of a YAML document
MAX_ALIASES = 1000  # alias uses (*name) in one YAML document
MAX_EXPANDED_NODES = 200_000  # nodes of one YAML document once its aliases are expanded
MAX_INT_DIGITS = 20  # an integer literal (int64 has 19 digits)
MAX_CONDITION_DEPTH = 32  # conditions nested in conditions (all/any/not)
MAX_SCENARIO_DEPTH = 16  # nested objects and arrays of one scenario (a real one nests 3)
MAX_LINE_BYTES = 1 << 20  # one line of select --batch
MAX_REPORTED_ERRORS = 100  # problems listed per run; the rest are counted


def depth_over(value: Any, limit: int) -> bool:
    """Whether `value` (JSON-like data) nests deeper than `limit` containers; iterative, so never a
    RecursionError, and stops at the first path too deep."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def int_text(value: int) -> str:
    """An int as text for a message, shortened when it is too long to print (Python refuses to convert
    ints over 4,300 digits to text, and a message should not hold a megabyte of digits)."""
    if -10 ** MAX_INT_DIGITS < value < 10 ** MAX_INT_DIGITS:
        return str(value)
    return f"{'a negative' if value < 0 else 'an'} integer of about {int(abs(value).bit_length() * 0.30103) + 1} digits"


def shown(value: Any) -> str:
    """`value` as a message shows it: its repr, shortened; never an exception (a 5,000-digit int cannot become
    text, a 1,000-deep list reaches the recursion limit)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return int_text(value)
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"a {type(value).__name__} too large or deep to show"
    return text if len(text) <= 120 else text[:100] + f"... ({len(text):,} characters)"
