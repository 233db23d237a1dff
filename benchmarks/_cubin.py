"""What ptxas made of a kernel compiled ahead of time, read with the NVIDIA tools that ship with the triton wheel
(no CUDA toolkit needed): the SASS checks check_wgmma_hazard.py and probe_gluon_w4a16.py."""

from __future__ import annotations

import os
import subprocess
import tempfile

import triton


def cubin_tool(compiled, tool: str, *args: str) -> str:
    """stdout of triton's bundled `tool` (nvdisasm, cuobjdump) run with `args` on the compiled kernel's cubin."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        binary = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)
        return subprocess.run([binary, *args, path], capture_output=True, text=True, check=True).stdout
