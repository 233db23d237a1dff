"""lint: an edit that makes a backend unreachable is named with its file:line; the shipped profile is clean of it."""
from __future__ import annotations

from test_tools_space import _only_profile

from oracle.tools.lint import lint_source
from oracle.tools.sources import load_source


def _unreachable(findings):
    return {(f["message"].split("backend ", 1)[1].split(" ", 1)[0], f["at"].rsplit(":", 1)[1])
            for f in findings if f["rule"] == "unreachable-backend"}


def test_edit_makes_emulation_unreachable(tmp_path):
    root = _only_profile(tmp_path, "moe-oracle")
    before = _unreachable(lint_source(load_source(str(root))))
    assert not before
    path = root / "moe-oracle" / "w4a16.yaml"
    text = path.read_text()
    old = "device: {fact: platform.kind, in: [cuda, rocm, xpu, cpu]}"
    assert old in text
    path.write_text(text.replace(old, "device: {all: [{fact: platform.kind, eq: cuda}, {fact: platform.kind, eq: cpu}]}"))
    after = lint_source(load_source(str(root)))
    lines = {str(i) for i, t in enumerate(path.read_text().splitlines(), 1) if t.strip() == "EMULATION:"}
    new = _unreachable(after) - before
    # every policy that auto-selects or names EMULATION now fails its check; an unchecked `use` may still reach
    # the mxfp4 family's EMULATION (another rule file), so at least the nvfp4 family's entry is named
    assert new and {name for name, _ in new} == {"EMULATION"}
    assert {line for _, line in new} <= lines


def test_unused_env_var_and_always_false_step(tmp_path):
    root = _only_profile(tmp_path, "moe-oracle")
    path = root / "moe-oracle" / "w4a16.yaml"
    text = path.read_text()
    text = text.replace("env_vars:\n", "env_vars:\n  MOE_ORACLE_NEVER_READ:\n    parse: int_bool\n    default: false\n"
                        "    why: \"seeded: declared, consulted by nothing\"\n", 1)
    text = text.replace("when: {fact: moe.moe_backend, ne: auto}",
                        "when: {all: [{fact: moe.moe_backend, ne: auto}, {fact: moe.lora, eq: true}, "
                        "{fact: moe.lora, eq: false}]}", 1)
    path.write_text(text)
    found = lint_source(load_source(str(root)))
    assert any(f["rule"] == "unused-env-var" and "MOE_ORACLE_NEVER_READ" in f["message"] for f in found)
    assert any(f["rule"] == "always-false" and "step 'explicit-backend'" in f["message"] for f in found)
