"""Timing on a CUDA GPU, the one method the tune command and the benchmarks share: the whole layer (routing,
alignment, both GEMMs, top-k sum) captured once as a CUDA graph and replayed, L2 flushed (a 256 MiB write)
before every replay, median of CUDA-event times. Imports torch; CUDA only."""

from __future__ import annotations

import functools
import statistics

import torch

GIB = 1 << 30


def events_ms(fn, flush, iters: int) -> float:
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


class Flusher:
    """Writes 256 MiB (several times any L2) so that every timed call streams its weights from memory."""

    def __init__(self):
        self.buf = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def __call__(self):
        self.buf.zero_()


def graph_of(fn):
    """fn captured in a CUDA graph, after two warm-up calls on a side stream (compiles, allocator)."""
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


def time_layer(fn, flush, iters: int) -> float:
    """Median µs of fn as a CUDA graph, L2 flushed before each replay."""
    graph = graph_of(fn)
    return events_ms(graph.replay, flush, iters) * 1e3


def measure_ceilings() -> dict:
    """bandwidth GB/s = max(2 GiB-per-side device copy counting read + write bytes, read-only reduction over
    2 GiB) - a small copy understates it - and the bf16 8192^3 matmul rate in TFLOP/s."""
    src = torch.empty(2 * GIB, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)

    def no_flush():  # the buffers are 40x the L2
        return None

    copy_ms = min(events_ms(functools.partial(dst.copy_, src), no_flush, 10) for _ in range(2))
    read_ms = min(events_ms(src.view(torch.float32).sum, no_flush, 10) for _ in range(2))
    del src, dst
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    mm_ms = events_ms(lambda: a @ b, no_flush, 20)
    copy, read = 2 * 2 * GIB / copy_ms / 1e6, 2 * GIB / read_ms / 1e6
    torch.cuda.empty_cache()
    return {"bandwidth_gbs": max(copy, read), "copy_gbs": copy, "read_gbs": read,
            "matmul_tflops": 2 * 8192**3 / mm_ms / 1e9}


def expert_bytes(shape) -> int:
    """Packed FP4 + block scales of one expert, both GEMMs (biases not counted)."""
    h, i, block = shape.hidden_size, shape.intermediate_size, 32 if shape.format == "mxfp4" else 16
    elems = 3 * h * i
    return elems // 2 + elems // block


def floor_us(shape, touched: int, bandwidth_gbs: float) -> float:
    """The memory floor: the touched experts' bytes at the measured bandwidth."""
    return touched * expert_bytes(shape) / (bandwidth_gbs * 1e3)
