"""Shared fixtures: one Oracle over the shipped rules for the whole session."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from oracle import Oracle

SHIPPED_RULES = Path(__file__).resolve().parent.parent / "rules"
REPO_ROOT = SHIPPED_RULES.parent
BENCHMARKS = REPO_ROOT / "benchmarks"


def load_benchmark(name: str):
    """benchmarks/<name>.py imported as module `name`, registered in sys.modules (dataclasses look their module up
    by name while it executes), with benchmarks/ on sys.path for the helpers it imports (_cubin, _timing, ...);
    one module object per name, also when another benchmark imported it first."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def interpreter_worker_rows(script: str, *arg_sets: tuple[str, ...], drop_env: tuple[str, ...] = ()) -> dict:
    """Run the test file `script` as a TRITON_INTERPRET=1 subprocess (one per argument set, in parallel) and key
    the JSON lines it prints by their "case". Triton fixes compiled vs interpreted at its first import, and other
    tests may import it compiled, so interpreter cases run in a fresh process. drop_env: variables the worker
    must not inherit."""
    path = [str(REPO_ROOT), str(REPO_ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {key: value for key, value in os.environ.items() if key not in drop_env}
    env.update(TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(path))
    workers = [subprocess.Popen([sys.executable, script, *args], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for args in (arg_sets or ((),))]
    rows = {}
    for worker in workers:
        out, err = worker.communicate(timeout=600)
        assert worker.returncode == 0, f"interpreter worker failed:\n{err[-4000:]}"
        rows.update((row["case"], row) for row in map(json.loads, out.splitlines()))
    return rows


def assert_exits_needing_a_gpu(main, argv: list[str], capsys) -> None:
    """A GPU-only benchmark's CLI run where torch sees no CUDA: argparse's exit status 2, saying so."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def edited_rules(tmp_path: Path, *edits: tuple[str, str, str]) -> Oracle:
    """An Oracle over a copy of the shipped rules with each (file, old, new) edit made; `old` must occur
    exactly once in that file, so a test never edits a line it did not mean to."""
    rules = tmp_path / "rules"
    shutil.copytree(SHIPPED_RULES, rules)
    for rel, old, new in edits:
        target = rules / rel
        text = target.read_text()
        assert text.count(old) == 1, f"{rel}: {old!r} occurs {text.count(old)} times"
        target.write_text(text.replace(old, new))
    return Oracle(rules)


@pytest.fixture(scope="session")
def oracle() -> Oracle:
    return Oracle()


def scenario(policy: str, platform: str = "cuda:9.0", *, packages=("flashinfer", "triton_kernels", "deep_gemm", "aiter"),
             env=None, profile="vllm-0.20", **moe) -> dict:
    """A scenario dict from short arguments: platform 'cuda:9.0' | 'rocm:gfx950' | 'xpu' | 'cpu'.

    Pinned to the vllm-0.20 profile the tests using it were written for (profile=None: the default profile)."""
    kind, _, detail = platform.partition(":")
    plat: dict = {"kind": kind}
    if kind == "cuda":
        plat["capability"] = [int(x) for x in detail.split(".")]
    elif kind == "rocm":
        plat["gcn_arch"] = detail
    parallel = moe.pop("parallel", None)
    sc: dict = {"policy": policy, "platform": plat, "packages": {p: True for p in packages}, "env": dict(env or {}),
                "moe": dict(moe)}
    if parallel:
        sc["moe"]["parallel"] = parallel
    if profile:
        sc["profile"] = profile
    return sc


def _cuda_skip_reason() -> str | None:
    """The oracle's own word on why GPU tests cannot run here (None when a CUDA device is present)."""
    from oracle.platform import detect_platform

    plat = detect_platform()
    if plat["kind"] == "cuda":
        return None
    answer = Oracle().select({"policy": "mxfp4-gpt-oss", "profile": "vllm-0.20", "platform": plat})
    return (f"moe-oracle detected platform '{plat['kind']}' (no CUDA device); "
            f"mxfp4-gpt-oss selects {answer.backend or answer.outcome} here")


CUDA_SKIP_REASON = _cuda_skip_reason()
requires_cuda = pytest.mark.skipif(CUDA_SKIP_REASON is not None, reason=CUDA_SKIP_REASON or "")
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=[requires_cuda, pytest.mark.gpu])]
