"""Rules away from the source tree (issue 14 item 6): a copied rules directory keeps editor modelines that
resolve, and `explain` of an installed package names the rule files where they really are. The same holds for
the other YAML that ships with a modeline: the triton_moe tuning tables and the example plugin."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from oracle.cli import main

ROOT = Path(__file__).resolve().parent.parent
RULES, SCHEMAS = ROOT / "rules", ROOT / "schemas"
MODELINE = re.compile(r"^# yaml-language-server: \$schema=(\S+)$")
LOCATION = re.compile(r"([^\s(),]+\.yaml):(\d+)")
EXPLAIN = ["explain", "--profile", "vllm-0.20", "--policy", "mxfp4-gpt-oss", "--platform", "cuda:9.0",
           "--package", "triton_kernels"]


def _schema_named_by(rule_file: Path) -> Path:
    first = rule_file.read_text(encoding="utf-8").splitlines()[0]
    found = MODELINE.match(first)
    assert found, f"{rule_file}: the first line is not a yaml-language-server modeline: {first!r}"
    return (rule_file.parent / found.group(1)).resolve()  # editors resolve a relative $schema from the file


#: schema copies shipped next to YAML outside rules/ (path in the checkout -> its source under schemas/); a copy
#: is refreshed with `moe-oracle schema NAME > PATH`
SCHEMA_COPIES = {
    "backends/triton_moe/tuning/tables/tuning.schema.json": "tuning.schema.json",
    "examples/acme_moe_plugin/acme_moe/plugin.schema.json": "plugin.schema.json",
    "examples/acme_moe_plugin/acme_moe/rules.schema.json": "rules.schema.json",
}
#: directories whose YAML files name those copies: directory -> {file pattern: schema under schemas/}
MODELINE_DIRECTORIES = {
    "backends/triton_moe/tuning/tables": {"*.yaml": "tuning.schema.json"},
    "examples/acme_moe_plugin/acme_moe": {"moe_oracle_plugin.yaml": "plugin.schema.json",
                                          "rules/*.yaml": "rules.schema.json"},
}


def _expected_schema(rule_file: Path) -> str:
    return "profiles.schema.json" if rule_file.name == "profiles.yaml" else "rules.schema.json"


@pytest.mark.parametrize("name", ["rules.schema.json", "profiles.schema.json"])
def test_the_rules_directory_ships_the_schemas_its_modelines_name(name):
    shipped, source = RULES / name, SCHEMAS / name
    assert shipped.read_bytes() == source.read_bytes(), (
        f"rules/{name} differs from schemas/{name}; copy it: moe-oracle schema --write rules")


def test_every_modeline_resolves_to_the_same_schema_in_a_copied_rules_directory(tmp_path):
    copy = tmp_path / "elsewhere" / "site-rules"
    shutil.copytree(RULES, copy)  # what `cp -r rules /somewhere` does
    files = sorted(copy.rglob("*.yaml"))
    assert len(files) >= 15
    for f in files:
        target = _schema_named_by(f)
        assert target.is_file() and target.is_relative_to(copy), f"{f}: $schema points outside the copy: {target}"
        assert json.loads(target.read_text()) == json.loads((SCHEMAS / _expected_schema(f)).read_text()), f


@pytest.mark.parametrize("copy", sorted(SCHEMA_COPIES))
def test_schema_copies_outside_rules_are_identical_to_schemas(copy):
    name = SCHEMA_COPIES[copy]
    assert (ROOT / copy).read_bytes() == (SCHEMAS / name).read_bytes(), (
        f"{copy} differs from schemas/{name}; copy it: moe-oracle schema {name.removesuffix('.schema.json')} > {copy}")


@pytest.mark.parametrize("directory", sorted(MODELINE_DIRECTORIES))
def test_modelines_resolve_inside_a_copy_of_their_directory(tmp_path, directory):
    """A copied (or installed) tuning-table directory or plugin package keeps modelines that resolve within it."""
    copy = tmp_path / "elsewhere" / Path(directory).name
    shutil.copytree(ROOT / directory, copy, ignore=shutil.ignore_patterns("__pycache__"))
    checked = set()
    for pattern, schema in MODELINE_DIRECTORIES[directory].items():
        files = sorted(copy.glob(pattern))
        assert files, f"{directory}: no file matches {pattern}"
        for f in files:
            target = _schema_named_by(f)
            assert target.is_file() and target.is_relative_to(copy), f"{f}: $schema points outside the copy: {target}"
            assert json.loads(target.read_text()) == json.loads((SCHEMAS / schema).read_text()), f
            checked.add(f)
    unchecked = sorted(str(f.relative_to(copy)) for f in copy.rglob("*.yaml") if f not in checked)
    assert not unchecked, f"{directory}: YAML files no pattern of MODELINE_DIRECTORIES covers: {unchecked}"


def test_a_written_user_table_carries_the_shipped_modeline(tmp_path):
    """`moe-oracle tune` writes tables with the shipped tables' first line; next to a copy of the schema it
    resolves (the tune command copies the schema into the user directory)."""
    from backends.triton_moe import tuning
    from backends.triton_moe.tuning import writer

    table = tuning.shipped_table("sm90-h200.yaml")
    out = writer.write_table(tmp_path / "t.yaml", {**table, "gpu": "H100"})
    assert out.read_text().splitlines()[0] + "\n" == tuning.MODELINE
    assert _schema_named_by(out) == (tmp_path / "tuning.schema.json").resolve() and _schema_named_by(out).is_file()
    assert tuning.read_table(out)["entries"] == table["entries"]


def test_schema_write_puts_the_modeline_schemas_into_a_directory(tmp_path, capsys):
    assert main(["schema", "--write", str(tmp_path)]) == 0
    for name in ("rules.schema.json", "profiles.schema.json"):
        assert (tmp_path / name).read_bytes() == (SCHEMAS / name).read_bytes()
    assert main(["schema", "--write", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err


def _locations_exist(out: str, cwd: Path, under: Path) -> list[str]:
    """Every file:line of explain's text names a line of a file (relative names: from the run's `cwd`) in `under`."""
    found = LOCATION.findall(out)
    assert len(found) > 10, out
    for name, line in found:
        path = cwd / name  # an absolute name stays absolute
        assert path.resolve().is_file(), f"{name}:{line} does not exist"
        assert path.resolve().is_relative_to(under.resolve()), f"{name} is not the installed copy under {under}"
        assert int(line) <= len(path.read_text().splitlines())
    return [name for name, _ in found]


def test_explain_names_the_embedded_rule_files_of_an_installed_layout(tmp_path):
    """The wheel's layout (pyproject's force-include), built by copying: oracle/ with _embedded/rules and schemas,
    run from an unrelated working directory."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "oracle", site / "oracle", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(RULES, site / "oracle" / "_embedded" / "rules")
    shutil.copytree(SCHEMAS, site / "oracle" / "_embedded" / "schemas")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    # the copied package first; whatever PYTHONPATH already held (e.g. where jsonschema lives) after it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(site), os.environ.get("PYTHONPATH"))))}
    code = "import sys; from oracle.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, *EXPLAIN], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    embedded = site / "oracle" / "_embedded" / "rules"
    names = _locations_exist(proc.stdout, cwd, embedded)
    assert any(n.endswith("common/mxfp4.yaml") for n in names)
    assert "decided by step 'auto' at " + str(embedded / "common" / "mxfp4.yaml") in proc.stdout


@pytest.mark.skipif(importlib.util.find_spec("hatchling") is None,
                    reason="hatchling (the build backend) is not installed here: a non-editable install needs it "
                           "without network access")
def test_explain_of_a_non_editable_install_names_its_rule_files(tmp_path):
    """`pip install .` into a fresh venv (no network: --no-deps --no-build-isolation); about 6 s."""
    env_dir = tmp_path / "venv"
    try:
        venv.create(env_dir, system_site_packages=True, with_pip=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot create a virtual environment here: {exc}")
    python = env_dir / "bin" / "python"
    build = tmp_path / "src"  # a clean copy: the build must not write into the checkout
    shutil.copytree(ROOT, build, ignore=shutil.ignore_patterns(".git", ".ci-venv", "__pycache__", ".snap-*", "*.egg-info",
                                                               "build", "dist"))
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", str(build)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = subprocess.run([str(env_dir / "bin" / "moe-oracle"), *EXPLAIN], cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    site = Path(subprocess.run([str(python), "-c", "import oracle, os; print(os.path.dirname(oracle.__file__))"],
                               cwd=cwd, capture_output=True, text=True, check=True).stdout.strip())
    assert site.is_relative_to(env_dir.resolve()) or site.is_relative_to(env_dir), site
    embedded = site / "_embedded" / "rules"
    _locations_exist(proc.stdout, cwd, embedded)
    for f in sorted(embedded.rglob("*.yaml")):  # the installed rules' modelines resolve there too
        assert _schema_named_by(f).is_file(), f
    proc = subprocess.run([str(env_dir / "bin" / "moe-oracle"), "test", "builtin:golden-sample"], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "passed" in proc.stdout, proc.stderr  # the samples the docs name are installed
    assert (site / "_embedded" / "golden" / "golden-sample.jsonl").is_file()
    tables = sorted((site.parent / "backends" / "triton_moe" / "tuning" / "tables").glob("*.yaml"))
    assert tables, "the wheel has no tuning tables"
    for f in tables:  # and so do the installed tuning tables'
        assert _schema_named_by(f) == (f.parent / "tuning.schema.json").resolve() and _schema_named_by(f).is_file(), f
