"""Where the embedded default rules and schemas live (wheel or source checkout)."""
from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _first_existing(*candidates: Path) -> Path:
    for path in candidates:
        if path.is_dir():
            return path
    return candidates[-1]


def rules_dir() -> Path:
    """The shipped rules: copied into the wheel under oracle/_embedded, or the checkout's rules/."""
    return _first_existing(_HERE / "_embedded" / "rules", _HERE.parent / "rules")


def schemas_dir() -> Path:
    return _first_existing(_HERE / "_embedded" / "schemas", _HERE.parent / "schemas")


def golden_dir() -> Path:
    """The shipped golden samples (`moe-oracle test builtin:NAME`): in the wheel under oracle/_embedded/golden,
    in a checkout tests/data."""
    return _first_existing(_HERE / "_embedded" / "golden", _HERE.parent / "tests" / "data")
