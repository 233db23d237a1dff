"""Detect the real platform, optional packages and environment for a run-time question.

The only module that looks at the machine. torch is imported lazily and only here, so a
CPU-only machine without torch still gets an answer (kind: cpu).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from typing import Any


def detect_platform() -> dict[str, Any]:
    """Platform mapping in scenario form: {kind, capability | gcn_arch}."""
    if importlib.util.find_spec("torch") is not None:
        try:
            return _from_torch()
        except Exception:  # a broken driver must not break selection: fall through to the CLI probe
            pass
    return _from_nvidia_smi() or {"kind": "cpu"}


def _from_torch() -> dict[str, Any]:
    import torch

    if torch.cuda.is_available():
        if getattr(torch.version, "hip", None):
            arch = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
            return {"kind": "rocm", "gcn_arch": arch}
        major, minor = torch.cuda.get_device_capability(0)
        return {"kind": "cuda", "capability": [major, minor]}
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return {"kind": "xpu"}
    return {"kind": "cpu"}


def _from_nvidia_smi() -> dict[str, Any] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout.split()
        major, minor = out[0].split(".")
        return {"kind": "cuda", "capability": [int(major), int(minor)]}
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def detect_packages(names: Iterable[str]) -> dict[str, bool]:
    """Which optional packages are importable, without importing them (find_spec only)."""
    found = {}
    for name in sorted(names):
        try:
            found[name] = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found[name] = False
    return found


def env_snapshot(names: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The declared variables that are set, as strings: unset and "0" stay different."""
    environ = os.environ if environ is None else environ
    return {n: environ[n] for n in sorted(names) if n in environ}
