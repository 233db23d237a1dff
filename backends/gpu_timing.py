"""GPU timing shared by `moe-oracle bench` and benchmarks/bench_moe.py: one method, so their figures compare.

A layer call is captured once in a CUDA graph and replayed; a 256 MiB read flushes the L2 before every replay; the
time is the median of CUDA-event times. The memory floor of a call is the bytes of the experts it touches (packed
FP4 + block scales of both GEMMs; biases not counted, as in the kernels reference) at the bandwidth measured in the
same run: the higher of a 2 GiB-per-side device copy (read + write bytes) and a read-only reduction over 2 GiB.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["BLOCK_SIZE", "GIB", "Flusher", "events_ms", "expert_bytes", "graph_of", "graph_with_output",
           "measure_ceilings", "memory_floor", "time_eager", "time_graph", "time_graph_output"]

GIB = 1 << 30
#: elements per block scale along K, per weight format
BLOCK_SIZE = {"mxfp4": 32, "nvfp4": 16}


def events_ms(fn: Callable[[], Any], flush: Callable[[], Any], iters: int) -> float:
    """Median milliseconds of `iters` calls of fn, each after flush(), timed by CUDA events."""
    samples = []
    for _ in range(iters):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def measure_ceilings() -> tuple[float, float, float, float]:
    """(bandwidth GB/s = max(copy, read-only reduction), copy GB/s, read GB/s, bf16 matmul TFLOP/s)."""
    src = torch.empty(2 * GIB, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)

    def no_flush() -> None:  # the buffers are 40x the L2
        return None

    copy_ms = min(events_ms(functools.partial(dst.copy_, src), no_flush, 10) for _ in range(2))
    read_ms = min(events_ms(src.view(torch.float32).sum, no_flush, 10) for _ in range(2))
    del src, dst
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    mm_ms = events_ms(lambda: a @ b, no_flush, 20)
    copy = 2 * 2 * GIB / copy_ms / 1e6
    read = 2 * GIB / read_ms / 1e6
    return max(copy, read), copy, read, 2 * 8192**3 / mm_ms / 1e9


class Flusher:
    """Reads 256 MiB (several times any L2) so that each timed call reads its weights from memory.

    A read, not a write: a written buffer leaves the L2 full of dirty lines, and the timed call's reads then pay for
    writing them back, bytes the memory floor does not count (on an H100 up to 7 µs of gpt-oss-120b's 40 µs at T = 1,
    0-3% at T >= 16: benchmarks/results/decode-l2-bulk-prefetch-h100-2026-11-27/ab_flush.csv). A layer in a server
    follows kernels that mostly read (weights, KV cache), not an L2 of someone else's dirty lines."""

    def __init__(self, device: torch.device | str = "cuda", nbytes: int = 256 << 20) -> None:
        self.words = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        self.total = torch.empty((), dtype=torch.float32, device=device)

    def __call__(self) -> None:
        torch.sum(self.words, dim=0, out=self.total)


def expert_bytes(fmt: str, hidden_size: int, intermediate_size: int) -> int:
    """Packed FP4 + block scales of one expert (both GEMMs)."""
    elems = 3 * hidden_size * intermediate_size
    return elems // 2 + elems // BLOCK_SIZE[fmt]


def memory_floor(logits: torch.Tensor, top_k: int, fmt: str, hidden_size: int, intermediate_size: int,
                 bandwidth_gbs: float) -> tuple[int, float]:
    """(experts touched by the routing of `logits`, µs to read their packed weights at bandwidth_gbs): the memory
    floor every benchmark divides by."""
    touched = torch.topk(logits, top_k, dim=-1).indices.unique().numel()
    return touched, touched * expert_bytes(fmt, hidden_size, intermediate_size) / (bandwidth_gbs * 1e3)


def graph_of(fn: Callable[[], Any]) -> torch.cuda.CUDAGraph:
    """fn captured in a CUDA graph, after two warm-up calls on a side stream (compilation, allocator)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def time_graph(fn: Callable[[], Any], flush: Callable[[], Any], iters: int) -> float:
    """Median µs of fn replayed as a CUDA graph, L2 flushed before each replay."""
    return time_graph_output(fn, flush, iters)[0]


def graph_with_output(fn: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, dict]:
    """(graph_of fn, a dict whose "out" is fn's output as the graph's last replay left it): for timing a graph
    apart from its capture and still checking what it computed."""
    holder = {}

    def run() -> None:
        holder["out"] = fn()

    return graph_of(run), holder


def time_graph_output(fn: Callable[[], Any], flush: Callable[[], Any], iters: int) -> tuple[float, Any]:
    """(time_graph's µs, fn's output as the last replay left it): benchmarks check what they timed."""
    graph, holder = graph_with_output(fn)
    return events_ms(graph.replay, flush, iters) * 1e3, holder["out"]


def time_eager(fn: Callable[[], Any], flush: Callable[[], Any], iters: int) -> float:
    """Median µs of fn called eagerly (one warm-up call), L2 flushed before each call: for code that syncs with
    the host (the emulation), which a graph cannot capture."""
    fn()
    torch.cuda.synchronize()
    return events_ms(fn, flush, iters) * 1e3


def profile_kernels(fn: Callable[[], Any], flush: Callable[[], Any], iters: int = 10) -> list:
    """(kernel name, mean µs per call) of fn run eagerly under torch.profiler, L2 flushed before each call (the
    flush's memset and fill kernels left out): the graph's time minus their sum is what launches and gaps cost."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            flush()
            fn()
        torch.cuda.synchronize()
    totals: dict = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and "zero_" not in event.name \
                and "fill" not in event.name.lower():
            totals[event.name] = totals.get(event.name, 0.0) + event.device_time / iters
    return sorted(totals.items(), key=lambda kv: -kv[1])
