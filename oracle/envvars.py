"""Declared environment variables and how their string values parse (vLLM's own parsers)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import EnvValueError


@dataclass(frozen=True)
class EnvSpec:
    name: str
    parse: str  # int_bool | true_or_1 | true_or_1_stripped | lower | choice
    default: Any
    choices: tuple[str, ...]
    at: str

    def value(self, env: Mapping[str, str]) -> Any:
        """The parsed value, the default when unset; EnvValueError names the fix for a bad string."""
        raw = env.get(self.name)
        if raw is None:
            return self.default
        if self.parse == "int_bool":
            try:
                return bool(int(raw))
            except ValueError:
                raise EnvValueError(
                    f"environment variable {self.name}={raw!r} is not an integer; it is read as bool(int(value)): "
                    f"set it to 0 or 1, or unset it (declared at {self.at})") from None
        if self.parse == "true_or_1":
            return raw.lower() in ("true", "1")
        if self.parse == "true_or_1_stripped":
            return raw.strip().lower() in ("true", "1")
        if self.parse == "lower":
            return raw.lower()
        if raw not in self.choices:
            raise EnvValueError(
                f"environment variable {self.name}={raw!r} is not one of {', '.join(self.choices)}; "
                f"set one of those or unset it (declared at {self.at})")
        return raw
