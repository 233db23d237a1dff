"""A user rules directory for the runtime tests: two valid versions (A, B) of one policy and broken edits.

Version A tries TRITON before MARLIN, version B the reverse, so the gpt-oss question on SM90 with
triton_kernels answers TRITON from A and MARLIN from B, each decided at its own file:line.
"""
from __future__ import annotations

import os
from pathlib import Path

POLICY = """\
policies:
  mxfp4-gpt-oss:
    override: true
    family: mxfp4
    description: "gpt-oss, {name}"
    candidates: [{first}, {second}]
    steps:
      - {{id: auto-{lower}, try: candidates, why: "version {name}"}}
      - {{id: none-fits, outcome: unsupported, message: "neither fits", why: "a test profile"}}
"""
VERSION_A = POLICY.format(name="A", lower="a", first="TRITON", second="MARLIN")
VERSION_B = POLICY.format(name="B", lower="b", first="MARLIN", second="TRITON")
BROKEN = {
    "unknown backend": VERSION_B.replace("[MARLIN, TRITON]", "[MARLINN, TRITON]"),
    "yaml syntax": VERSION_B.replace("candidates: [MARLIN, TRITON]", "candidates: [MARLIN, TRITON"),
    "half-written file": VERSION_B[: len(VERSION_B) // 2],
    "schema": VERSION_B.replace("try: candidates", "tri: candidates"),
}
PROFILES = ("extends: builtin\ndefault: mine\nprofiles:\n"
            "  mine: {description: 'vllm-0.20 with one policy edited', extends: vllm-0.20, files: [policy.yaml]}\n")
QUESTION = {"policy": "mxfp4-gpt-oss", "platform": {"kind": "cuda", "capability": [9, 0]},
            "packages": {"triton_kernels": True}, "moe": {"activation": "swigluoai"}}
EXPECTED = {"A": "TRITON", "B": "MARLIN"}


def make_rules(root: Path, text: str = VERSION_A) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "profiles.yaml").write_text(PROFILES)
    write(root / "policy.yaml", text)
    return root


def write(path: Path, text: str) -> None:
    """Overwrite in place (as an editor without atomic save does) and move the mtime on, so even a
    filesystem with coarse timestamps shows a change (the store compares content anyway)."""
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
