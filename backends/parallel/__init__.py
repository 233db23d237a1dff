"""MoE layers over a torch.distributed process group: tensor parallel (slices of I) and expert parallel (experts
split over ranks, tokens dispatched as vLLM's all2all backends do). See docs/parallel.md."""

from backends.parallel.dispatch import DISPATCHES
from backends.parallel.group import ParallelConfigError
from backends.parallel.layer import PARALLEL_MODES, ParallelMoELayer

__all__ = ["DISPATCHES", "PARALLEL_MODES", "ParallelConfigError", "ParallelMoELayer"]
