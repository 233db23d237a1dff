"""Content hashes of the profiles a diff compares, so that `diff` with nothing changed answers at once.

Exploring both sides takes seconds to tens of seconds; two profiles whose rule files have the same bytes in
the same order decide every input alike, which a hash of those bytes shows without exploring anything.
Paths are left out of the hash, so a git revision extracted to a temporary directory and the working tree
compare equal when their content is.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from .sources import Profiled, Source


def profile_hash(p: Profiled) -> str:
    """sha256 of a profile's rule files' bytes, in the order the profile lists them."""
    h = hashlib.sha256()
    for name in p.rs.files:
        data = Path(name).read_bytes()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def unchanged(src_a: Source, src_b: Source, policy: str | None = None) -> bool:
    """Whether every profile pair the diff compares has identical content (and defines `policy`, when
    named: a misspelt policy still gets the full answer, which names it)."""
    from .diff import pairs

    compared = pairs(src_a, src_b)
    return bool(compared) and all(
        profile_hash(a) == profile_hash(b) and (policy is None or policy in a.table.policies)
        for a, b in compared)
