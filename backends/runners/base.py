"""The runner protocol: the one way a backend's code runs an MoE layer.

A rule's ``runner:`` is a ``module:attr`` path (resolved only through `oracle.registry`: the `backends`
package or a registered plugin) naming a `RunnerFactory`, usually a class. The layer calls it twice:

* ``prepare(spec, weights) -> Runner``, ONCE, when the layer is built: ``spec`` says what the decision
  and the layer fixed (backend, format, activation and its constants, top_k, sizes, device), ``weights``
  is what the rules' converter wrote (a `KernelWeights`) or, for ``converter: null``, the checkpoint
  padded to the decision's sizes (a `MoEWeights`). A library's own one-time weight processing (swizzles,
  repacking, its quant config) belongs here, never in `apply`.
* ``runner.apply(x, routing) -> y``, per batch: x [T, padded H] (the layer pads and slices H), routing
  the router logits or the top-k ids and weights (`Routing`), y [T, padded H] in x.dtype.

A runner that cannot run here (its package is missing, the library refuses the shape or activation, the
device is wrong) raises `RunnerUnavailableError` from `prepare` with the backend, the reason and the fix;
the layer re-raises it as `LayerUnavailableError` with the decision. Never fall back to other code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["Routing", "Runner", "RunnerFactory", "RunnerSpec", "RunnerUnavailableError", "require_module"]


class RunnerUnavailableError(RuntimeError):
    """A runner cannot run this layer here; the message names the backend, the reason and the fix."""


@dataclass(frozen=True)
class Routing:
    """One batch's routing: ``router_logits`` [T, E], or ``topk_ids`` and ``topk_weights`` [T, top_k]."""

    router_logits: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None
    topk_weights: torch.Tensor | None = None

    def as_kwargs(self) -> dict[str, torch.Tensor]:
        """The routing as the keyword arguments of the reference `moe_forward` functions (None left out)."""
        return {name: value for name, value in (("router_logits", self.router_logits), ("topk_ids", self.topk_ids),
                                                ("topk_weights", self.topk_weights)) if value is not None}


@dataclass(frozen=True)
class RunnerSpec:
    """What the decision and the layer fixed before any batch: everything `prepare` may read besides weights.

    hidden_size / intermediate_size are the checkpoint's; padded_* the decision's (what the weights have).
    swiglu holds swiglu_alpha / swiglu_beta / swiglu_limit (the rules' gemm1 constants, or the caller's).
    """

    backend: str
    profile: str
    format: str
    activation: str
    top_k: int
    renormalize: bool
    num_experts: int
    hidden_size: int
    intermediate_size: int
    padded_hidden_size: int
    padded_intermediate_size: int
    device: torch.device
    swiglu: Mapping[str, float] = field(default_factory=dict)
    deterministic: bool = False
    has_bias: bool = False
    decision: Any = None  # the full oracle.decision.Decision, for runners that need more of it

    def unavailable(self, reason: str, fix: str) -> RunnerUnavailableError:
        """The one message shape of a runner's refusal: backend, profile, reason, fix."""
        return RunnerUnavailableError(f"{self.backend} (profile {self.profile}) cannot run this layer: {reason}; "
                                      f"{fix}")


@runtime_checkable
class Runner(Protocol):
    """A prepared runner: weights processed, library state built; called once per batch."""

    def apply(self, x: torch.Tensor, routing: Routing) -> torch.Tensor: ...


@runtime_checkable
class RunnerFactory(Protocol):
    """What a rule's ``runner:`` path names: builds a `Runner` once per layer."""

    def prepare(self, spec: RunnerSpec, weights: Any) -> Runner: ...


def require_module(spec: RunnerSpec, module: str, how_to_get: str) -> Any:
    """Import `module` for a runner, or raise the runner's refusal naming how to get it (never a bare ImportError)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise spec.unavailable(f"the Python package {module!r} is not importable here ({exc})", how_to_get) from exc


def require_layout(spec: RunnerSpec, weights: Any, layout: str, *, reader: str, converter: str) -> None:
    """Refuse weights the rules converted to another layout than the one the runner's kernels read (`reader`
    says who reads it), naming the converter the backend's rules entry should set."""
    from backends.weights import KernelWeights

    if not isinstance(weights, KernelWeights) or weights.layout != layout:
        got = weights.layout if isinstance(weights, KernelWeights) else type(weights).__name__
        raise spec.unavailable(f"{reader} the {layout!r} layout, the rules give {got}",
                               f"set `converter: {converter}` for this backend")
