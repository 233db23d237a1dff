"""Every example in examples/ runs in CI, and exits non-zero on any error.

Each entry of examples/ is listed here with how CI exercises it; a new example fails
test_every_example_is_exercised until it is added. Scripts run their documented commands
(the `python examples/...` lines of their docstring) exactly as written, from the repository root.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# example -> where CI exercises it
EXERCISED = {
    "server.py": "its documented commands (below), and tests/test_store.py (--demo-edit's log lines)",
    "gpt-oss-120b.config.json": "the model config server.py's documented commands read",
    "acme_moe_plugin": "tests/test_plugins.py (installed as a plugin: manifest, rules, runner)",
    "parallel_moe.py": "its documented torchrun command (two CPU processes over gloo here), below",
}


def _documented_commands(script: Path) -> list[list[str]]:
    """The `python examples/...` and `torchrun ... examples/...` lines of a script's docstring, as python arguments."""
    doc = script.read_text().split('"""')[1]
    commands = []
    for line in doc.splitlines():
        if not re.match(r"\s+(python|torchrun) ", line):
            continue
        words = shlex.split(line.split("#", 1)[0])
        if words[:1] == ["python"] and words[1:2] and words[1].startswith("examples/"):
            commands.append(words[1:])
        elif words[:1] == ["torchrun"]:
            commands.append(["-m", "torch.distributed.run", *words[1:]])
    return commands


def _run(args: list[str], extra_env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           **(extra_env or {})}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env,
                          check=False)


def test_every_example_is_exercised():
    present = {p.name for p in EXAMPLES.iterdir() if not p.name.startswith((".", "__"))}
    assert present == set(EXERCISED), f"add each example to EXERCISED with how CI runs it: {present ^ set(EXERCISED)}"
    for where in EXERCISED.values():
        for test_file in re.findall(r"tests/\w+\.py", where):
            assert (ROOT / test_file).is_file(), test_file


SERVER_COMMANDS = _documented_commands(EXAMPLES / "server.py")


@pytest.mark.parametrize("args", SERVER_COMMANDS, ids=[" ".join(a[1:]) for a in SERVER_COMMANDS])
def test_the_server_examples_documented_commands_run_and_exit_0(args):
    run = _run(args)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "error" not in run.stdout.lower(), run.stdout


def test_the_documented_commands_are_found():
    assert len(SERVER_COMMANDS) >= 2 and all(a[0] == "examples/server.py" for a in SERVER_COMMANDS)
    assert PARALLEL_COMMANDS == [["-m", "torch.distributed.run", "--nproc-per-node", "2", "examples/parallel_moe.py"]]


PARALLEL_COMMANDS = _documented_commands(EXAMPLES / "parallel_moe.py")


def test_the_parallel_example_runs_on_two_cpu_processes_and_checks_itself():
    env_cpu = {"CUDA_VISIBLE_DEVICES": ""}
    run = _run(PARALLEL_COMMANDS[0], extra_env=env_cpu, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert run.stdout.count("relative L2 to one device") == 6, run.stdout


def test_the_server_example_exits_1_when_a_layer_gets_no_backend():
    run = _run(["examples/server.py", "examples/gpt-oss-120b.config.json", "--platform", "cpu"])
    assert run.returncode == 1, run.stdout + run.stderr
    assert "example-server: error: 36 of 36 layers got no backend" in run.stderr


@pytest.mark.parametrize("rules", ["vllm-0.20", "vllm-0.15", "moe-oracle", "vllm-0.33"])
def test_the_server_example_asks_each_profiles_own_policy(tmp_path, rules):
    """The same config under every shipped profile: the policy comes from the profile's checkpoint_policies."""
    import shutil

    copy = shutil.copytree(ROOT / "rules", tmp_path / "rules")
    index = (copy / "profiles.yaml").read_text()
    (copy / "profiles.yaml").write_text(re.sub(r"(?m)^default: .*$", f"default: {rules}", index))
    run = _run(["examples/server.py", "examples/gpt-oss-120b.config.json", "--rules", str(copy),
                "--platform", "cuda:9.0", "--package", "triton_kernels"])
    assert run.returncode in (0, 1), run.stderr[-3000:]
    assert "malformed" not in run.stderr and "unknown policy" not in run.stderr and "Traceback" not in run.stderr
    assert "layers 0..35 (36)" in run.stdout + run.stderr
