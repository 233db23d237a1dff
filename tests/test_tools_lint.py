"""lint: an edit that makes a backend unreachable is named with its file:line; the shipped profile is clean of it."""
from __future__ import annotations

import random

import pytest
from test_tools_space import _only_profile

from oracle.facts import FACTS
from oracle.tools.lint import lint_source
from oracle.tools.sources import load_source
from oracle.tools.space import OTHER


def _unreachable(findings):
    """Unacknowledged unreachable backends (a lint_allow says why the default layer cannot reach one)."""
    return {(f["message"].split("backend ", 1)[1].split(" ", 1)[0], f["at"].rsplit(":", 1)[1])
            for f in findings if f["rule"] == "unreachable-backend" and not f.get("acknowledged")}


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


def _coarse_leaves(profile: str):
    """lint's coarse exploration of each policy: (policy, the groups each leaf allows, what the run answered)."""
    from oracle.errors import EnvValueError
    from oracle.interpreter import run
    from oracle.tools.explore import call_hook, fixed_facts, nullable_facts
    from oracle.tools.refine import Coarse, explore_coarse
    from oracle.tools.space import Space

    p = load_source(profile).profiles[profile]
    space = Space.of([(p.rs, p.table)])
    coarse = Coarse(p.table)
    hook = call_hook(coarse.table)
    for name, policy in coarse.table.policies.items():
        nullable, fixed = nullable_facts(policy), fixed_facts(space, policy)

        def one(r, policy=policy, nullable=nullable, fixed=fixed):
            try:
                res = run(policy, coarse.ctx(r, nullable, fixed), None, hook)
            except EnvValueError:
                return dict(r.groups), None
            kernel = res.kernel.name if res.outcome == "selected" and res.kernel and res.report_kernel else None
            backend = res.backend.value if res.outcome == "selected" and res.backend else None
            return dict(r.groups), (res.outcome, backend, kernel, res.decided_by.id if res.decided_by else None)

        for _, (groups, answer) in explore_coarse(space, coarse, one):
            yield name, groups, answer
    yield space, None, None


@pytest.mark.parametrize("profile,every", [("moe-oracle", 1), ("vllm-0.20", 7), ("vllm-0.33", 29)])
def test_every_input_of_a_coarse_class_gets_its_answer(profile, every):
    """lint's classes are exact: inputs drawn at random inside a class (any class of each variable the class
    leaves open) get the class's answer from Oracle.select."""
    from oracle import Oracle
    from oracle.tools.explore import nullable_facts, scenario_of

    rows = list(_coarse_leaves(profile))
    space = rows.pop()[0]
    policies = load_source(profile).profiles[profile].table.policies
    oracle, rng, checked = Oracle(), random.Random(14), 0
    for name, groups, answer in rows[::every]:
        if answer is None:
            continue
        nullable = nullable_facts(policies[name])
        variables = {"platform": space.platform}
        variables.update({f"fact:{f}": space.fact(f, f in nullable) for f in sorted(space.varied) if f in FACTS})
        variables.update({f"env:{e}": space.env(e) for e in sorted(space.c.env_specs)})
        variables.update({f"package:{k}": space.package(k) for k in sorted(space.c.packages)})
        for _ in range(3):
            leaf = {}
            for var, domain in variables.items():
                # the API refuses a bad env string even where no rule reads it: unread env vars stay unset;
                # a string no rule names is not a valid choice for a choice fact
                if len(domain.classes) > 1 and (var in groups or not var.startswith("env:")):
                    group = [i for i in groups.get(var, range(len(domain.classes)))
                             if domain.classes[i].value != OTHER or not var.startswith("fact:")]
                    if not group and var in groups:
                        break  # the class needs a string no rule names: the API cannot be asked
                    if group:
                        leaf[var] = domain.classes[rng.choice(group)]
            else:
                d = oracle.select(scenario_of(leaf, name, profile))
                got = (d.outcome, d.backend if d.outcome == "selected" else None,
                       d.kernel if answer[2] else None, d.decided_by.step if d.decided_by else None)
                assert got == answer, (name, {v: c.label for v, c in leaf.items()})
                checked += 1
    assert checked > 100


def test_always_true_step_shadows_the_steps_after_it(tmp_path):
    root = _only_profile(tmp_path, "moe-oracle")
    path = root / "moe-oracle" / "w4a16.yaml"
    text = path.read_text()
    old = "      - id: explicit-backend\n        when: {fact: moe.moe_backend, ne: auto}"
    assert old in text
    path.write_text(text.replace(old, "      - id: explicit-backend\n        when: {fact: platform.kind, in: "
                                 "[cuda, rocm, xpu, cpu]}", 1))
    found = lint_source(load_source(str(root)))
    lines = path.read_text().splitlines()
    at = {f["rule"]: [] for f in found}
    for f in found:
        at[f["rule"]].append(lines[int(f["at"].rsplit(":", 1)[1]) - 1].strip())
    assert "- id: explicit-backend" in at.get("always-true", [])
    assert {"- id: auto", "- id: nothing-fits"} <= set(at.get("unreachable-step", []))

