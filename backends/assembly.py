"""How the selected experts kernel is assembled (vLLM's ``make_*_moe_kernel``), read from the rules.

    Decision (backend, kernel) + the family's `kernels` / `explicit_kernels` order + the `assembly` data
    + the question (batched activation format: the family's `batched_when`) ─> KernelAssembly

* monolithic (routing inside the kernel) vs modular (prepare -> experts -> finalize): the chosen kernel's
  `monolithic` flag, and every variant of the backend in the order the rules try them;
* the batched-experts format: the family's `batched_when` on this question; then the experts get a max
  tokens per rank (the layer's ``max_num_batched_tokens``, else the rules' `max_tokens_per_rank`);
* in place: the rules' `inplace` (the family's, a backend's own over it; e.g. never for TRT-LLM);
* shared experts: given to the kernel `always`, `never`, or only in the `batched` format.

Nothing here names a backend or a profile: every answer is the rules' data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oracle.model import Ctx

__all__ = ["KernelAssembly", "describe_assembly", "kernel_assembly"]


@dataclass(frozen=True)
class KernelAssembly:
    """The assembled kernel of one decision. None where the rules say nothing (no backend, no `assembly`)."""

    backend: str | None
    kernel: str | None
    monolithic: bool | None  # routing inside the kernel; False: prepare -> experts -> finalize
    variants: tuple[tuple[str, bool], ...]  # (kernel, monolithic) of the backend, in the rules' order
    activation_format: str  # "standard" | "batched"
    max_tokens_per_rank: int | None  # batched format only
    inplace: bool | None
    shared_experts: bool | None  # the kernel is given the layer's shared experts
    why: tuple[str, ...] = ()

    @property
    def stages(self) -> tuple[str, ...]:
        """The kernel's stages: one fused call when monolithic, else prepare -> experts -> finalize."""
        if self.monolithic is None:
            return ()
        return ("monolithic",) if self.monolithic else ("prepare", "experts", "finalize")

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "kernel": self.kernel, "monolithic": self.monolithic,
                "stages": list(self.stages), "variants": [{"kernel": k, "monolithic": m} for k, m in self.variants],
                "activation_format": self.activation_format, "max_tokens_per_rank": self.max_tokens_per_rank,
                "inplace": self.inplace, "shared_experts": self.shared_experts, "why": list(self.why)}


def describe_assembly(a: KernelAssembly) -> str:
    """One line for explain: stages, variants in order, format, in place, shared experts."""
    def word(flag: bool | None, yes: str, no: str) -> str:
        return "unknown" if flag is None else yes if flag else no

    variants = ", ".join(f"{k}{' (monolithic)' if m else ''}" for k, m in a.variants) or "none"
    tokens = f", max {a.max_tokens_per_rank} tokens per rank" if a.max_tokens_per_rank is not None else ""
    return (f"assembly {' -> '.join(a.stages) or 'none'}; variants in order: {variants}; {a.activation_format} "
            f"format{tokens}; {word(a.inplace, 'may run in place', 'never in place')}; shared experts "
            f"{word(a.shared_experts, 'in the kernel', 'outside the kernel')}")


def kernel_assembly(oracle, decision, question: Mapping[str, Any], *,
                    max_num_batched_tokens: int | None = None) -> KernelAssembly:
    """The assembly of `decision` (answered for `question` by `oracle`) from the rules of its profile.

    max_num_batched_tokens: the scheduler's token budget (vLLM's FusedMoEConfig.max_num_tokens); None takes the
    rules' `max_tokens_per_rank` default. Used only in the batched activation format."""
    if max_num_batched_tokens is not None and (not isinstance(max_num_batched_tokens, int)
                                               or isinstance(max_num_batched_tokens, bool)
                                               or max_num_batched_tokens < 1):
        raise ValueError(f"max_num_batched_tokens={max_num_batched_tokens!r} must be a positive int (the "
                         f"scheduler's max_num_batched_tokens) or None for the rules' default")
    table = oracle.table(decision.profile or question["profile"])
    policy = table.policies.get(decision.policy or question["policy"])
    if policy is None:  # the question names a policy this profile lacks: its answer is an error, nothing assembles
        return KernelAssembly(decision.backend, decision.kernel, None, (), "standard", None, None, None)
    family = policy.family
    scenario = oracle.prepare(question)
    batched = bool(family.batched(Ctx(scenario.facts, scenario.env, scenario.packages))) if family.batched else False
    backend = family.by_value.get(decision.backend) if decision.backend is not None else None
    if backend is None:
        return KernelAssembly(decision.backend, decision.kernel, None, (), "batched" if batched else "standard",
                              None, None, None)
    lists = [backend.kernels, *([backend.explicit_kernels] if backend.explicit_kernels else [])]
    variants = next((ks for ks in lists if any(k.name == decision.kernel for k in ks)), backend.kernels)
    chosen = next((k for k in variants if k.name == decision.kernel), None)
    rules: Mapping[str, Any] = backend.assembly or {}
    shared = rules.get("shared_experts")
    max_tokens = None
    if batched:
        max_tokens = max_num_batched_tokens if max_num_batched_tokens is not None else rules.get("max_tokens_per_rank")
    return KernelAssembly(
        backend=decision.backend, kernel=decision.kernel, monolithic=chosen.monolithic if chosen else None,
        variants=tuple((k.name, k.monolithic) for k in variants),
        activation_format="batched" if batched else "standard", max_tokens_per_rank=max_tokens,
        inplace=rules.get("inplace"),
        shared_experts=None if shared is None else shared == "always" or (shared == "batched" and batched),
        why=tuple(rules.get("why") or ()))
