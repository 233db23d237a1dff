"""Other versions of the decode kernels (backends/triton_moe/_gemv_kernels.py) run in place of the shipped ones, for
the benchmarks that time them against each other (probe_decode_bisect.py, ab_decode_kernels.py).

A version is a whole module source: the shipped file with text edits, the file at a git revision, or a file of its
own. It is written to a directory and imported from there (Triton reads a kernel's source from its file), and its
two kernels replace the shipped module's for the calls inside `swapped`, so that forward._launch_decode launches
them with the layer's usual arguments. It runs against the current tree's helper modules: a version that imports a
helper since removed fails at import, naming it."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "backends" / "triton_moe" / "_gemv_kernels.py"


def import_kernels(name: str, source: str, directory: str):
    """Module `source` written to directory as gemv_variant_<name>.py and imported."""
    module_name = "gemv_variant_" + "".join(c if c.isalnum() else "_" for c in name)
    path = os.path.join(directory, module_name + ".py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def kernels_at(revision: str) -> str:
    """The decode kernels' source at a git revision of this checkout."""
    relative = KERNELS.relative_to(ROOT).as_posix()
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{relative}"], capture_output=True,
                              text=True, check=False)
    except OSError as error:
        raise ValueError(f"revision {revision!r}: git could not run ({error}); give the kernels as a file") from None
    if done.returncode != 0:
        raise ValueError(f"revision {revision!r}: no {relative} there ({done.stderr.strip() or 'git show failed'}); "
                         f"give a commit of this checkout that has it")
    return done.stdout


@contextlib.contextmanager
def swapped(module, maxnreg: int | None = None):
    """The shipped module's two kernels replaced by `module`'s (and forward.DECODE_MAXNREG by maxnreg, if given)
    inside the block."""
    import backends.triton_moe._gemv_kernels as shipped
    from backends.triton_moe import forward

    saved = shipped.gemv1_act_kernel, shipped.gemv2_sum_kernel, forward.DECODE_MAXNREG
    shipped.gemv1_act_kernel, shipped.gemv2_sum_kernel = module.gemv1_act_kernel, module.gemv2_sum_kernel
    if maxnreg is not None:
        forward.DECODE_MAXNREG = maxnreg
    try:
        yield
    finally:
        shipped.gemv1_act_kernel, shipped.gemv2_sum_kernel, forward.DECODE_MAXNREG = saved
