"""Plugins (entry point group moe_oracle.backends): the example package installed as a fake distribution,
its rules validated like shipped ones, nothing imported; broken plugins reported once and skipped."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from oracle import plugins, registry
from oracle.store import RuleStore

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "acme_moe_plugin"
SM90 = {"kind": "cuda", "capability": [9, 0]}


def _distribution(site: Path, name: str, entry_points: dict[str, str]) -> None:
    """A minimal installed distribution: what pip leaves in site-packages (METADATA + entry_points.txt)."""
    info = site / f"{name}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[moe_oracle.backends]\n{lines}")


def _package(site: Path, name: str, manifest: str | None, fragment: str | None, init: str = "") -> None:
    pkg = site / name
    (pkg / "rules").mkdir(parents=True)
    (pkg / "__init__.py").write_text(init)
    (pkg / "runner.py").write_text("def run(*args):\n    return args\n")
    if manifest is not None:
        (pkg / "moe_oracle_plugin.yaml").write_text(manifest)
    if fragment is not None:
        (pkg / "rules" / "extra.yaml").write_text(fragment)


def _fresh_registry() -> None:
    registry.plugin_entry_points.cache_clear()
    registry.clear_cache()
    plugins._reported.clear()


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site directory on sys.path holding the example plugin's distribution metadata."""
    site = tmp_path / "site"
    _distribution(site, "acme_moe", {"acme": "acme_moe"})
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.syspath_prepend(str(site))
    _fresh_registry()
    yield site
    _fresh_registry()
    for name in [m for m in sys.modules if m == "acme_moe" or m.startswith("acme_moe.")]:
        del sys.modules[name]  # find_spec answers from sys.modules: the next test must see its own copy


def _store(**kw):
    kw.setdefault("packages", {"acme_moe": True, "triton_kernels": True})
    return RuleStore(platform=kw.pop("platform", SM90), env={}, **kw)


def test_the_example_plugin_is_found_and_selects_its_backend_without_being_imported(site):
    sys.modules.pop("acme_moe", None)
    sys.modules.pop("acme_moe.runner", None)
    assert ("acme", "acme_moe", "acme_moe") in registry.plugin_entry_points()
    store = _store()
    assert [p.name for p in store.generation.plugins] == ["acme"]
    d = store.select({"policy": "acme-mxfp4", "profile": "vllm-0.20", "moe": {"activation": "swigluoai"}})
    assert d.outcome == "selected" and d.backend == "ACME_MXFP4" and d.runner == "acme_moe.runner:AcmeRunner"
    assert d.decided_by.step == "acme-first" and d.decided_by.at.endswith("acme_moe/rules/acme.yaml:48")
    assert "acme_moe" not in sys.modules, "answering never imports the plugin"
    assert registry.resolve(d.runner).__name__ == "AcmeRunner"  # importing happens on request only
    # elsewhere the plugin's policy falls back to the shipped gpt-oss selector
    sm80 = store.select({"policy": "acme-mxfp4", "profile": "vllm-0.20", "platform": {"kind": "cuda", "capability": [8, 0]},
                         "moe": {"activation": "swigluoai"}})
    assert sm80.backend == "MARLIN"
    # and the shipped policies are unchanged by the plugin
    assert store.select({"policy": "mxfp4-gpt-oss", "profile": "vllm-0.20", "moe": {"activation": "swigluoai"}}).backend == "TRITON"


def test_the_plugin_package_is_detected_like_any_optional_package(site):
    store = RuleStore(platform=SM90, env={})
    sc = store.prepare({"policy": "acme-mxfp4", "profile": "vllm-0.20"})
    assert "acme_moe" in sc.packages, "find_spec finds the installed plugin package"


def test_without_plugins_the_policy_does_not_exist(site):
    d = _store(plugins=False, packages={}).select({"policy": "acme-mxfp4", "profile": "vllm-0.20"})
    assert d.outcome == "error" and "unknown policy 'acme-mxfp4'" in d.error


BAD_FRAGMENT = """\
kernels:
  BrokenExperts:
    extends: NoSuchKernel
    why: "refers to a kernel nobody defines"
"""
MANIFEST = "description: test plugin\nprofiles:\n  vllm-0.20: [rules/extra.yaml]\n"


@pytest.mark.parametrize("name, manifest, fragment, words", [
    ("broken_rules", MANIFEST, BAD_FRAGMENT, "extra.yaml:3:"),
    ("no_manifest", None, None, "has no moe_oracle_plugin.yaml"),
    ("bad_manifest", "description: x\nprofile: {}\n", None, "unknown field 'profile' in (top level) (did you mean 'profiles'?)"),
    ("escaping", "description: x\nprofiles:\n  vllm-0.20: [rules/../../../etc/x.yaml]\n", None, "is outside the package"),
    ("foreign_runner", MANIFEST,
     "families:\n  f:\n    description: d\n    weight_key: kMxfp4Static\n    backends:\n      B:\n"
     "        kernels: []\n        runner: acme_moe.runner:moe_forward\n        converter: null\n        missing_why: none\n"
     "        why: \"borrows another plugin's runner\"\n"
     "    messages: {backend_rejected: r, backend_rejected_no_reason: r, unknown_moe_backend: r}\n", "may name only its own package or backends"),
])
def test_a_broken_plugin_is_reported_once_and_skipped(site, caplog, name, manifest, fragment, words):
    _distribution(site, name, {name: name})
    _package(site, name, manifest, fragment, init="raise RuntimeError('never imported')\n")
    _fresh_registry()
    with caplog.at_level(logging.WARNING, logger="moe_oracle"):
        store = _store()
        again = _store()
        assert again.reload().ok
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    mine = [w for w in warnings if f"plugin '{name}'" in w]
    assert len(mine) == 1, warnings  # once per process, not per store or reload
    assert words in mine[0] and "skipped" in mine[0]
    assert [p.name for p in store.generation.plugins] == ["acme"], "the good plugin still serves"
    assert store.select({"policy": "acme-mxfp4", "profile": "vllm-0.20", "moe": {"activation": "swigluoai"}}).backend == "ACME_MXFP4"
    assert name not in sys.modules


def test_a_registered_package_that_is_not_installed_is_reported(site, caplog):
    _distribution(site, "ghost", {"ghost": "ghost_moe"})
    _fresh_registry()
    with caplog.at_level(logging.WARNING, logger="moe_oracle"):
        store = _store()
    assert any("package 'ghost_moe' is not importable" in r.getMessage() for r in caplog.records)
    assert store.select({"policy": "acme-mxfp4", "profile": "vllm-0.20", "moe": {"activation": "swigluoai"}}).backend == "ACME_MXFP4"


def test_a_plugin_fragment_is_watched_like_a_rule_file(site, tmp_path, monkeypatch):
    """Editing an installed plugin's fragment reloads like editing the rules (its hash is in the generation)."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(EXAMPLE, copy)
    monkeypatch.syspath_prepend(str(copy))
    _fresh_registry()
    store = _store()
    fragment = copy / "acme_moe" / "rules" / "acme.yaml"
    assert fragment.resolve() in store.generation.hashes
    fragment.write_text(fragment.read_text().replace('lt: "11.0"', 'lt: "9.1"'))
    assert store.poll().ok
    sm100 = store.select({"policy": "acme-mxfp4", "profile": "vllm-0.20", "platform": {"kind": "cuda", "capability": [10, 0]},
                          "packages": {"flashinfer": True}, "moe": {"activation": "swigluoai"}})
    assert sm100.backend != "ACME_MXFP4"


def test_the_plugins_command_lists_good_plugins_and_fails_on_broken_ones(site, capsys):
    from oracle.cli import EXIT_OK, EXIT_RULES, main

    assert main(["plugins"]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith("ok: plugin 'acme' (package acme_moe") and "extends vllm-0.20 (+1 file(s))" in out
    _distribution(site, "broken_rules", {"broken_rules": "broken_rules"})
    _package(site, "broken_rules", MANIFEST, BAD_FRAGMENT)
    _fresh_registry()
    assert main(["plugins"]) == EXIT_RULES
    out = capsys.readouterr().out
    assert "plugin 'broken_rules'" in out and "extra.yaml:3:" in out and "ok: plugin 'acme'" in out
