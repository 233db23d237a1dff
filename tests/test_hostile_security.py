"""Hostile input, security probes: no command runs and nothing is written outside what the user named.

Each probe plants a sentinel (a file that must not appear, or one whose content must not change) and
checks that the command refused with a message naming the argument or file, exit 2 or 3, no traceback.
"""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_plugins import _distribution, _fresh_registry, _package

from oracle import registry
from oracle.cli import main
from oracle.errors import OracleError, RuleError
from oracle.loader import load_profile_index
from oracle.resources import rules_dir
from oracle.safewrite import write_inside
from oracle.tools.sources import load_source

ROOT = Path(__file__).resolve().parent.parent


def _git_repo(path: Path) -> Path:
    """A throwaway repository holding a copy of the shipped rules (one commit)."""
    shutil.copytree(rules_dir(), path / "rules")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "rules"]):
        subprocess.run(["git", *args], cwd=path, check=True, capture_output=True, env=env)
    return path


@pytest.fixture
def repo(tmp_path, monkeypatch):
    path = _git_repo(tmp_path / "repo")
    monkeypatch.chdir(path)
    return path


def _probes(sentinel: Path, victim: Path) -> list[str]:
    cmd = f"touch {sentinel}"
    return [f"git:--remote=ext::sh -c {cmd}:--exec={cmd}",
            f"git:--exec={cmd}",
            f"git:--output={victim}",
            f"git:--output={victim}:rules",
            f"git:HEAD:--output={victim}",
            f"git:HEAD:{victim}",
            "git:HEAD:../..",
            "git:-h",
            "git::rules",
            f"git:HEAD --output={victim}"]


def test_a_git_revision_never_reaches_a_command_as_an_option(repo, tmp_path, capsys):
    sentinel, victim = tmp_path / "ran", tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    for probe in _probes(sentinel, victim):
        assert main(["diff", probe, "rules"]) == 2, probe
        err = capsys.readouterr().err
        assert err.startswith("moe-oracle: error: git:") and "Traceback" not in err, (probe, err)
        assert not sentinel.exists(), probe
        assert victim.read_text() == "keep me\n", probe


def test_a_git_revision_resolves_to_a_commit_and_is_then_read(repo, tmp_path):
    src = load_source("git:HEAD~0:rules", profile="moe-oracle")
    assert src.profiles["moe-oracle"].table.policies
    with pytest.raises(OracleError, match="cannot read that revision"):
        load_source("git:HEAD~5")  # the repository has one commit
    with pytest.raises(OracleError, match="starts with '-'"):
        load_source("git:--all")


def test_every_subprocess_argument_list_is_fixed_or_separated():
    """Every subprocess call in oracle/ is listed here with why user text cannot become an option."""
    calls = []
    for path in sorted((ROOT / "oracle").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in (
                    "subprocess", "os") and node.attr in ("run", "Popen", "call", "check_call", "check_output",
                                                          "system", "popen", "execv", "execvp", "spawnv"):
                calls.append(f"{path.relative_to(ROOT)}:{node.attr}")
    # platform: a constant nvidia-smi query; sources: one helper, its revision resolved and its path after `--`
    assert sorted(calls) == ["oracle/platform.py:run", "oracle/tools/sources.py:run"]
    text = (ROOT / "oracle/tools/sources.py").read_text(encoding="utf-8")
    assert '"--end-of-options"' in text and '"--", path]' in text


def test_fmt_refuses_a_symlink_leaving_the_directory_and_writes_nothing(tmp_path, capsys):
    outside = tmp_path / "outside.yaml"
    outside.write_text("a:    1\n")
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "ok.yaml").write_text("b:    2\n\n\n")
    (rules / "link.yaml").symlink_to(outside)
    assert main(["fmt", str(rules)]) == 2
    err = capsys.readouterr().err
    assert "refusing to write through the symlink" in err and "link.yaml" in err and "Traceback" not in err
    assert outside.read_text() == "a:    1\n"
    assert (rules / "ok.yaml").read_text() == "b:    2\n\n\n", "nothing is written when one file is refused"
    (rules / "link.yaml").unlink()
    (rules / "inner.yaml").write_text("c: 3\n\n")
    (rules / "link.yaml").symlink_to(rules / "inner.yaml")  # a link inside the directory is followed
    assert main(["fmt", str(rules)]) == 0
    assert (rules / "inner.yaml").read_text() == "c: 3\n" and (rules / "link.yaml").is_symlink()
    assert not list(rules.glob(".*.tmp")), "no temporary file is left behind"


def test_fmt_names_a_symlink_loop_and_a_non_utf8_file(tmp_path, capsys):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "loop.yaml").symlink_to(rules / "loop.yaml")
    assert main(["fmt", str(rules)]) == 2
    assert "loop.yaml" in capsys.readouterr().err
    (rules / "loop.yaml").unlink()
    (rules / "bad.yaml").write_bytes(b"a: \xff\n")
    assert main(["fmt", str(rules)]) == 2
    assert "bad.yaml:1:4: byte 0xff is not UTF-8" in capsys.readouterr().err


def test_schema_write_refuses_a_symlink_leaving_the_directory(tmp_path, capsys):
    outside = tmp_path / "victim.json"
    outside.write_text("{}")
    target = tmp_path / "rules"
    target.mkdir()
    (target / "profiles.schema.json").symlink_to(outside)
    assert main(["schema", "--write", str(target)]) == 2
    assert "profiles.schema.json" in capsys.readouterr().err
    assert outside.read_text() == "{}" and not (target / "rules.schema.json").exists()


def test_sweep_output_refuses_a_symlink_leaving_its_directory(tmp_path, capsys):
    outside = tmp_path / "victim.md"
    outside.write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    (out / "sweep.md").symlink_to(outside)
    assert main(["sweep", "--policy", "mxfp4", "--profile", "moe-oracle", "-o", str(out / "sweep.md")]) == 2
    assert "sweep.md" in capsys.readouterr().err and outside.read_text() == "keep"


def test_write_inside_is_atomic(tmp_path, monkeypatch):
    target = tmp_path / "f.txt"
    target.write_text("old")
    target.chmod(0o640)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        write_inside(target, "new")
    assert target.read_text() == "old" and not list(tmp_path.glob(".*.tmp"))
    monkeypatch.undo()
    write_inside(target, "new")
    assert target.read_text() == "new" and (target.stat().st_mode & 0o777) == 0o640


@pytest.mark.parametrize("listed", ["ABSOLUTE", "../outside.yaml", "sub/../../outside.yaml", "link.yaml"])
def test_profile_rule_paths_must_stay_inside_the_rules_directory(tmp_path, listed):
    listed = str(tmp_path / "outside.yaml") if listed == "ABSOLUTE" else listed
    (tmp_path / "outside.yaml").write_text("values: {}\n")
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "link.yaml").symlink_to(tmp_path / "outside.yaml")
    (rules / "profiles.yaml").write_text(f"default: p\nprofiles:\n  p:\n    description: d\n    files:\n"
                                         f"      - {listed}\n")
    with pytest.raises(RuleError, match="outside the rules directory") as info:
        load_profile_index(rules)
    assert str(info.value).startswith(f"{rules / 'profiles.yaml'}:6:")


def test_a_rule_file_that_is_a_symlink_to_itself_is_named(tmp_path, capsys):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "loop.yaml").symlink_to(rules / "loop.yaml")
    (rules / "profiles.yaml").write_text("default: p\nprofiles:\n  p:\n    description: d\n    files:\n"
                                         "      - loop.yaml\n")
    assert main(["--rules", str(rules), "validate"]) == 3
    out = capsys.readouterr()
    assert "profiles.yaml:6:9: rule file 'loop.yaml' is a symlink loop" in out.out + out.err
    assert "Traceback" not in out.out + out.err


def test_validate_names_a_rule_file_that_is_a_symlink_loop(tmp_path, capsys):
    (tmp_path / "a.yaml").symlink_to(tmp_path / "a.yaml")
    for target in (tmp_path / "a.yaml", tmp_path):
        assert main(["validate", str(target)]) == 3
        out = capsys.readouterr()
        assert f"{tmp_path / 'a.yaml'}:1:1: rule file is a symlink loop; make it a regular file" in out.out
        assert "internal error" not in out.err


def test_a_rejected_plugin_widens_nothing(tmp_path, monkeypatch):
    """A package registered under moe_oracle.backends, whose plugin is rejected, stays unnameable."""
    site = tmp_path / "site"
    _distribution(site, "rogue", {"rogue": "subprocess:run", "acme": "acme_broken"})
    _package(site, "acme_broken", "description: broken\nprofiles:\n  vllm-0.20: [rules/extra.yaml]\n",
             "families: {oops: 1}\n")
    monkeypatch.syspath_prepend(str(site))
    _fresh_registry()
    try:
        from oracle.api import build_table
        from oracle.plugins import discover, extend_index

        found, problems = discover()
        index = load_profile_index(rules_dir())
        _, accepted = extend_index(index, found, build_table, report=problems.append)
        assert accepted == [] and problems
        assert "subprocess" in registry.plugin_packages() and "acme_broken" in registry.plugin_packages()
        for runner in ("subprocess:run", "acme_broken.runner:run"):
            assert "outside the allowed packages" in (registry.problem(runner) or ""), runner
    finally:
        _fresh_registry()
        for name in [m for m in sys.modules if m.startswith("acme_broken")]:
            del sys.modules[name]


def test_a_git_tree_past_the_size_bounds_is_refused_before_it_is_archived(repo, monkeypatch):
    """`diff git:REV:PATH` lists the tree first: one with more files or bytes than oracle.limits allows is refused,
    naming both, before git archive reads it into memory."""
    files = sum(1 for p in (repo / "rules").rglob("*") if p.is_file())
    size = sum(p.stat().st_size for p in (repo / "rules").rglob("*") if p.is_file())
    assert load_source("git:HEAD:rules", profile="moe-oracle").profiles
    monkeypatch.setattr("oracle.limits.MAX_GIT_BYTES", size - 1)
    with pytest.raises(OracleError, match=rf"rules holds {files:,} files of {size:,} bytes there; .* up to "):
        load_source("git:HEAD:rules")
    monkeypatch.setattr("oracle.limits.MAX_GIT_BYTES", size)
    monkeypatch.setattr("oracle.limits.MAX_GIT_FILES", files - 1)
    with pytest.raises(OracleError, match=rf"rules holds {files:,} files"):
        load_source("git:HEAD:rules")
