"""The memory floor every benchmark divides by and the L2 flush before each timed call (backends.gpu_timing): CPU-only."""

from __future__ import annotations

import pytest
import torch

from backends.gpu_timing import Flusher, expert_bytes, memory_floor


def test_memory_floor_counts_each_touched_expert_once():
    """Two tokens sharing expert 2 touch 3 experts with top-2; the floor is their packed bytes at the bandwidth."""
    logits = torch.full((2, 8), -1.0)
    logits[0, [2, 5]] = 1.0
    logits[1, [2, 7]] = 1.0
    touched, floor_us = memory_floor(logits, 2, "mxfp4", 2880, 2880, bandwidth_gbs=3000.0)
    assert touched == 3
    assert floor_us == pytest.approx(3 * expert_bytes("mxfp4", 2880, 2880) / 3e6)


def test_expert_bytes_counts_packed_fp4_and_the_block_scales():
    """3 H x I weights of 4 bits, plus one scale byte per 32 (MXFP4) or 16 (NVFP4) of them."""
    elems = 3 * 7168 * 2048
    assert expert_bytes("mxfp4", 7168, 2048) == elems // 2 + elems // 32
    assert expert_bytes("nvfp4", 7168, 2048) == elems // 2 + elems // 16


def test_flusher_reads_its_buffer_and_leaves_it_unchanged():
    """The flush is a read (a write would leave dirty lines whose write-back the timed call pays): the buffer keeps
    its contents and the flush's only output is their sum."""
    flush = Flusher("cpu", nbytes=1 << 16)
    flush.words.copy_(torch.arange(flush.words.numel(), dtype=torch.float32))
    before = flush.words.clone()
    flush()
    assert torch.equal(flush.words, before)
    assert flush.total.item() == pytest.approx(before.sum().item())
