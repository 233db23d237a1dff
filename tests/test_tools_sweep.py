"""sweep's fast path (one memoized decision per platform class) answers every cell as Oracle.select does.

Each cell of the matrix is asked again through the public API: the scenario is the row's class
representatives on the column's concrete platform, with the policy's default sizes.
"""
from __future__ import annotations

import pytest

from oracle import Oracle
from oracle.tools.explore import scenario_of
from oracle.tools.sources import load_source
from oracle.tools.space import Space
from oracle.tools.sweep import SWEEP_VARIED, sweep_policy


def _platform(label: str) -> dict:
    kind, _, rest = label.partition(" ")
    if kind == "cuda":
        major, minor = rest.split(".")
        return {"kind": "cuda", "capability": [int(major), int(minor)]}
    if kind == "rocm":
        return {"kind": "rocm", "gcn_arch": rest}
    return {"kind": kind, "amx": True} if rest == "amx" else {"kind": kind}


def _rounded(size: int | None, align: int | None) -> int | None:
    return size if size is None or align is None else -(-size // align) * align


def _check_matrix(oracle: Oracle, profile: str, policy: str, every: int) -> int:
    p = load_source(profile).profiles[profile]
    m = sweep_policy(p, policy)
    space = Space.of([(p.rs, p.table)], (), SWEEP_VARIED)
    leaves = [leaf for leaf, _ in _leaves(space, p, policy)]
    assert len(leaves) == len(m.rows)
    checked = 0
    for r in range(0, len(m.rows), every):
        sc = scenario_of({k: v for k, v in leaves[r].items() if k != "platform"}, policy, profile)
        for c, label in enumerate(m.columns):
            cell = m.cell(r, c)
            q = {**sc, "platform": _platform(label)}
            d = oracle.select(q)
            facts = oracle.prepare(q).facts
            got = (d.outcome, d.backend, d.kernel if cell.kernel else None, d.activation_key, d.hidden_size,
                   d.intermediate_size, d.decided_by.step if d.decided_by else None)
            want = (cell.outcome, cell.backend, cell.kernel, cell.activation_key,
                    _rounded(facts["moe.hidden_size"], cell.align_hidden) if cell.outcome == "selected" else None,
                    _rounded(facts["moe.intermediate_size"], cell.align_intermediate)
                    if cell.outcome == "selected" else None, None if cell.step == "env" else cell.step)
            if cell.outcome != "selected":
                got = (*got[:4], None, None, got[6])
            assert got == want, (profile, policy, m.rows[r][0], label)
            checked += 1
    return checked


def _leaves(space, p, policy_name):
    """The rows of the matrix as plain leaves: the same exploration, one plain decision per platform class."""
    from oracle.tools.explore import call_hook, decide, explore, nullable_facts

    policy = p.table.policies[policy_name]
    nullable = nullable_facts(policy)
    hook = call_hook(p.table)
    return explore(space, lambda reader: [decide(p.table, policy, reader.ctx(policy, nullable, cl.value), hook)
                                          for cl in space.platform.classes])


@pytest.mark.parametrize("profile,every", [("moe-oracle", 1), ("vllm-0.20", 3), ("vllm-0.33", 97)])
def test_sweep_cells_equal_plain_select(profile, every):
    oracle = Oracle()
    policies = list(load_source(profile).profiles[profile].table.policies)
    assert sum(_check_matrix(oracle, profile, pol, every) for pol in policies) > 100


def test_memoized_sweep_equals_the_plain_exploration():
    """The memo walks the explorer exactly as a real run would: same rows, same cells, same order."""
    p = load_source("vllm-0.20").profiles["vllm-0.20"]
    space = Space.of([(p.rs, p.table)], (), SWEEP_VARIED)
    for policy in p.table.policies:
        m = sweep_policy(p, policy)
        plain = list(_leaves(space, p, policy))
        assert len(plain) == len(m.rows)
        for (_, answers), (_, cells) in zip(plain, m.rows, strict=True):
            assert cells == answers
