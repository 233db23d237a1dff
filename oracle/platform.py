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
    """Platform mapping in scenario form: {kind, capability | gcn_arch}.

    Cheapest first: the CUDA driver library (a few ms, no torch), then `nvidia-smi`; torch (seconds to
    import) only where a ROCm or Intel GPU device node exists, since only torch names those archs."""
    found = _from_cuda_driver() or _from_nvidia_smi()
    if found is not None:
        return found
    if importlib.util.find_spec("torch") is not None and (os.path.exists("/dev/kfd") or os.path.exists("/dev/dri")):
        try:
            return _from_torch()
        except Exception:  # a broken driver must not break selection: answer for the CPU
            pass
    return {"kind": "cpu"}


_CU_MAJOR, _CU_MINOR = 75, 76  # CUdevice_attribute: COMPUTE_CAPABILITY_MAJOR / _MINOR


def _from_cuda_driver() -> dict[str, Any] | None:
    """Capability of device 0 through libcuda (honours CUDA_VISIBLE_DEVICES); None without a usable driver."""
    import ctypes

    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return None
    try:
        count, dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
            return None
        if (lib.cuDeviceGet(ctypes.byref(dev), 0) != 0
                or lib.cuDeviceGetAttribute(ctypes.byref(major), _CU_MAJOR, dev) != 0
                or lib.cuDeviceGetAttribute(ctypes.byref(minor), _CU_MINOR, dev) != 0):
            return None
    except (AttributeError, OSError):
        return None
    return {"kind": "cuda", "capability": [major.value, minor.value]}


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
