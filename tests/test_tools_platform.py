"""Platform detection is cheap: on a machine without a CUDA driver it answers without importing torch."""
from __future__ import annotations

import os
import subprocess
import sys


def test_detect_platform_does_not_import_torch_without_gpu_device_nodes():
    if os.path.exists("/dev/kfd") or os.path.exists("/dev/dri"):
        import pytest

        pytest.skip("a ROCm/Intel GPU device node exists here, where torch is the documented fallback")
    code = ("import sys, oracle.platform as p; plat = p.detect_platform(); "
            "print(plat['kind'], 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[1] == "False", out
    assert out[0] in ("cuda", "cpu")
