"""Error types. Every user-facing error names where (file:line:col or argument) and the fix."""
from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass


def did_you_mean(word: object, choices: Iterable[object]) -> str:
    """' (did you mean 'x'?)' for the closest choice, or '' when none is close."""
    if isinstance(word, int) and word.bit_length() > 256 or not isinstance(word, (str, int, float)):
        return ""  # a huge number has no text form (Python refuses), a container is no misspelt name
    text = str(word)
    if len(text) > 200:
        return ""
    close = difflib.get_close_matches(text, [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


@dataclass(frozen=True)
class Diagnostic:
    """One problem in a rule file, located at file:line:col (1-based)."""

    file: str
    line: int
    col: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.message}"


class OracleError(Exception):
    """Base class of every error the oracle raises on purpose."""


class RuleError(OracleError):
    """Rule files are broken; carries every diagnostic found, not just the first."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = list(diagnostics)
        super().__init__("\n".join(str(d) for d in self.diagnostics))


class ScenarioError(OracleError):
    """A scenario is malformed: names the field and what is expected."""


class EnvValueError(OracleError):
    """A declared environment variable holds a value its parser rejects."""
