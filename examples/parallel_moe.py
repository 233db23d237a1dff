"""One MoE layer over two processes, tensor parallel and expert parallel, checked against one device.

    torchrun --nproc-per-node 2 examples/parallel_moe.py            # 2 GPUs (NCCL), or 2 CPU processes (gloo)

Runs on GPUs when each process sees one (this project's Triton kernels), else on CPU (the emulation). Every rank
builds the same small random gpt-oss-like MXFP4 layer, shards it, and compares its output with the whole layer
held by one device. Exit status 1 when a sharded output differs from one device's by more than bf16 rounding
(relative L2 above 1e-2).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends import MoELayer, formats  # noqa: E402
from backends.parallel import ParallelMoELayer  # noqa: E402
from backends.weights import MoEWeights  # noqa: E402


def small_gpt_oss_layer(experts=8, hidden=128, inter=256) -> MoEWeights:
    g = torch.Generator().manual_seed(0)  # the same weights on every rank
    w13, w13_scale = formats.quantize_mxfp4(torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5)
    w2, w2_scale = formats.quantize_mxfp4(torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5)
    return MoEWeights(format="mxfp4", gate_up="interleaved", w13=w13, w13_scale=w13_scale, w2=w2, w2_scale=w2_scale,
                      w13_bias=torch.randn(experts, 2 * inter, generator=g),
                      w2_bias=torch.randn(experts, hidden, generator=g))


def main() -> None:
    gpu = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if gpu else "gloo")
    rank = dist.get_rank()
    logging.basicConfig(level=logging.INFO, format=f"rank {rank}: %(message)s")  # each rank logs its decision once
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    weights = small_gpt_oss_layer()
    whole = MoELayer.from_checkpoint(weights, activation="swigluoai", top_k=2, device=device)

    g = torch.Generator().manual_seed(10 + rank)  # EP: every rank brings its own tokens
    x = torch.randn(6 + 3 * rank, weights.H, generator=g).to(device, torch.bfloat16)
    logits = torch.randn(x.shape[0], weights.E, generator=g).to(device)
    worst = 0.0
    for parallel, dispatch in (("tp", None), ("ep", "allgather_reducescatter"), ("ep", "deepep_high_throughput")):
        layer = ParallelMoELayer.from_checkpoint(weights, process_group=dist.group.WORLD, parallel=parallel,
                                                 all2all_backend=dispatch, activation="swigluoai", top_k=2,
                                                 device=device)
        tokens, router = (x, logits)
        if parallel == "tp":  # TP ranks share their tokens: take rank 0's
            tokens, router = x.clone(), logits.clone()
            size = torch.tensor([tokens.shape[0]], device=device)
            dist.broadcast(size, 0)
            tokens.resize_(int(size), weights.H)
            router.resize_(int(size), weights.E)
            dist.broadcast(tokens, 0)
            dist.broadcast(router, 0)
        y = layer(tokens, router)
        ref = whole(tokens, router)
        err = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
        print(f"rank {rank}: {layer!r}: {tokens.shape[0]} tokens, relative L2 to one device {err:.1e}", flush=True)
        worst = max(worst, err)
    dist.destroy_process_group()
    if not worst <= 1e-2:  # bf16 outputs: about 4e-3 of rounding; NaN fails too
        sys.exit(f"rank {rank}: error: a sharded layer's output differs from one device's (relative L2 {worst:.1e})")


if __name__ == "__main__":
    main()
