"""The one registry of converter/runner paths: allowed packages only, checked without importing."""
from __future__ import annotations

import sys

import pytest

from oracle import registry

from conftest import scenario


def test_a_defined_backends_function_is_accepted_without_importing_it():
    sys.modules.pop("backends.emulation", None)
    assert registry.problem("backends.emulation:moe_forward") is None
    assert "backends.emulation" not in sys.modules, "validation must not import the module (it imports torch)"


@pytest.mark.parametrize("path, words", [
    ("os:system", "outside the allowed packages"),
    ("backends.nosuchmodule:run", "does not exist"),
    ("backends.emulation:no_such_function", "defines no top-level 'no_such_function'"),
    ("backends.emulation", "is not a 'module:attribute' path"),
])
def test_bad_paths_name_the_problem_and_the_fix(path, words):
    found = registry.problem(path)
    assert found is not None and words in found and path in found


def test_resolve_refuses_what_validation_refuses():
    with pytest.raises(registry.RegistryError, match="outside the allowed packages"):
        registry.resolve("os:system")


def test_decisions_name_their_runner_and_converter(oracle):
    trtllm = oracle.select(scenario("mxfp4-gpt-oss", "cuda:10.0"))
    assert trtllm.backend == "FLASHINFER_TRTLLM_MXFP4_BF16" and trtllm.runner is None
    assert trtllm.missing_why and trtllm.to_dict()["runner"] is None
    none = oracle.select(scenario("mxfp4-gpt-oss", "cpu"))
    assert none.outcome == "none" and "runner" not in none.to_dict()


def test_every_shipped_backend_states_what_runs_it(oracle):
    for profile in oracle.profiles():
        for family in oracle.table(profile).families.values():
            for backend in family.backends.values():
                if backend.kernels:
                    assert backend.runner or backend.missing_why, (profile, backend.name)
                    for path in (backend.converter, backend.runner):
                        assert path is None or registry.problem(path) is None, path


def test_explain_prints_the_runner(capsys):
    from oracle.cli import main

    assert main(["explain", "--profile", "vllm-0.20", "--policy", "nvfp4", "--platform", "cuda:7.0",
                 "--env", "VLLM_BATCH_INVARIANT=1"]) == 0
    out = capsys.readouterr().out
    assert "selected EMULATION" in out and "runner backends.runners.emulation:EmulationRunner" in out
    assert "converter none" in out and "reads the checkpoint layout" in out


def test_a_registered_plugin_package_is_allowed(tmp_path, monkeypatch):
    """Packages named by entry points of group moe_oracle.backends may hold converters and runners too."""
    pkg = tmp_path / "acme_moe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('validation must not import the plugin')\n")
    (pkg / "runner.py").write_text("import torch  # never imported by validation\n\ndef apply(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.clear_cache()
    assert "outside the allowed packages" in registry.problem("acme_moe.runner:apply")
    monkeypatch.setattr(registry, "plugin_packages", lambda: ("acme_moe",))
    registry.clear_cache()
    # registered is not enough: only a plugin being checked, or accepted, widens what rules may name
    assert "outside the allowed packages" in registry.problem("acme_moe.runner:apply")
    with registry.checking("acme_moe"):
        assert registry.problem("acme_moe.runner:apply") is None
    assert "outside the allowed packages" in registry.problem("acme_moe.runner:apply")
    registry.accept("acme_moe")
    assert registry.problem("acme_moe.runner:apply") is None
    assert "defines no top-level 'run'" in registry.problem("acme_moe.runner:run")
    registry.accept("subprocess")  # accepting a package that no entry point registers widens nothing
    assert "outside the allowed packages" in registry.problem("subprocess:run")
    registry.clear_cache()
