"""diff and the class partition: a priority swap changes exactly the classes brute force finds changed."""
from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest
import yaml

from oracle import Oracle
from oracle.resources import rules_dir
from oracle.tools.diff import diff_sources
from oracle.tools.sources import load_source
from oracle.tools.space import CUDA_CAPABILITIES, OTHER, members
from oracle.vocabulary import ACTIVATIONS


def _only_profile(tmp: Path, profile: str) -> Path:
    root = tmp / "rules"
    index = yaml.safe_load((rules_dir() / "profiles.yaml").read_text())
    index["profiles"] = {profile: index["profiles"][profile]}
    for f in index["profiles"][profile]["files"]:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(rules_dir() / f, root / f)
    index["default"] = profile
    (root / "profiles.yaml").write_text(yaml.safe_dump(index))
    return root


def _swap_candidates(root: Path, file: str, policy: str) -> None:
    path = root / file
    data = yaml.safe_load(path.read_text())
    cands = data["policies"][policy]["candidates"]  # the fast kernel and the emulation (first and last)
    cands[0], cands[-1] = cands[-1], cands[0]
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _answer(d):
    return (d.outcome, d.backend, d.kernel, d.activation_key, d.hidden_size, d.intermediate_size)


def _concrete_platforms(archs):
    out = [(f"cuda {a}.{b}", {"kind": "cuda", "capability": [a, b]}) for a, b in CUDA_CAPABILITIES]
    out += [(f"rocm {arch}", {"kind": "rocm", "gcn_arch": arch}) for arch in archs]
    return out + [("xpu", {"kind": "xpu"}), ("cpu", {"kind": "cpu"})]


def _in_class(leaf, label, sc, facts, domain_members):
    for var, cl in leaf.items():
        kind, _, name = var.partition(":")
        if var == "platform":
            if label not in members(cl.label):
                return False
        elif kind == "package":
            if bool((sc.get("packages") or {}).get(name, False)) != cl.value:
                return False
        elif kind == "env":
            raw = (sc.get("env") or {}).get(name)
            if ("unset" if raw is None else raw) not in [m.split("=", 1)[1] for m in members(cl.label)]:
                return False
        else:
            shown = facts[name]
            shown = "null" if shown is None else str(shown).lower() if isinstance(shown, bool) else str(shown)
            names = [m.split("=", 1)[1] for m in members(cl.label)]
            if shown not in domain_members.get(var, names) and OTHER in names:
                continue  # a string no rule names falls in the <other> class
            if shown not in names:
                return False
    return True


def test_priority_swap_diff_matches_brute_force(tmp_path):
    a_root = _only_profile(tmp_path / "a", "moe-oracle")
    b_root = _only_profile(tmp_path / "b", "moe-oracle")
    _swap_candidates(b_root, "moe-oracle/w4a16.yaml", "mxfp4")
    src_a, src_b = load_source(str(a_root)), load_source(str(b_root))
    diffs = [d for d in diff_sources(src_a, src_b) if d.policy == "mxfp4"]
    changed_leaves = [leaf for d in diffs for c in d.changes for leaf in c.classes]
    assert changed_leaves, "swapping the two candidates must change some classes"
    all_labels: dict[str, list[str]] = {}
    for leaf in changed_leaves:
        for var, cl in leaf.items():
            all_labels.setdefault(var, []).extend(m.split("=", 1)[-1] for m in members(cl.label))

    oa, ob = Oracle(a_root), Oracle(b_root)
    archs = list(oa.table().rocm_archs)
    brute_changed = 0
    for (label, plat), triton, interp, act, mb in itertools.product(
            _concrete_platforms(archs), (False, True), (None, "1"), ACTIVATIONS[:7], ("auto", "triton", "emulation",
                                                                                       "bogus")):
        sc = {"policy": "mxfp4", "platform": plat, "packages": {"triton": triton},
              "moe": {"activation": act, "moe_backend": mb}}
        if interp:
            sc["env"] = {"TRITON_INTERPRET": interp}
        changed = _answer(oa.select(sc)) != _answer(ob.select(sc))
        facts = oa.prepare(sc).facts
        claimed = any(_in_class(leaf, label, sc, facts, all_labels) for leaf in changed_leaves)
        assert changed == claimed, (sc, changed)
        brute_changed += changed
    assert brute_changed > 0


def test_every_changed_class_really_changes(tmp_path):
    """The representative of each reported class, asked through the public API, answers differently."""
    a_root = _only_profile(tmp_path / "a", "moe-oracle")
    b_root = _only_profile(tmp_path / "b", "moe-oracle")
    _swap_candidates(b_root, "moe-oracle/w4a16.yaml", "nvfp4")
    from oracle.tools.explore import scenario_of

    diffs = diff_sources(load_source(str(a_root)), load_source(str(b_root)))
    oa, ob = Oracle(a_root), Oracle(b_root)
    n = 0
    for d in diffs:
        assert d.policy == "nvfp4" or not d.changes, d.policy  # only the edited policy changes
        for c in d.changes:
            for leaf in c.classes:
                sc = scenario_of(leaf, d.policy)
                assert _answer(oa.select(sc)) != _answer(ob.select(sc)), sc
                n += 1
    assert n > 0


def test_identical_sources_have_no_changes():
    src = load_source("moe-oracle")
    assert all(not d.changes for d in diff_sources(src, src))


def test_unknown_source_names_the_fix():
    with pytest.raises(Exception, match="neither a rules directory"):
        load_source("no-such-profile")


def test_git_revision_source(capsys):
    src = load_source("git:HEAD:rules", profile="moe-oracle")
    assert list(src.profiles) == ["moe-oracle"]
    same = diff_sources(src, load_source("git:HEAD", profile="moe-oracle"))
    assert same and all(not d.changes for d in same)
    step_at = next(iter(src.profiles["moe-oracle"].table.policies.values())).steps[0].at
    assert src.where(step_at).startswith("git:HEAD:rules/moe-oracle/")  # where the rule is in that revision
    with pytest.raises(Exception, match="cannot read that revision"):
        load_source("git:no-such-revision-xyz")
