"""`backends.layouts.placement`: the one-pass writer every padded layout uses, against pad-then-permute."""
from __future__ import annotations

import math
import random

import pytest
import torch

from backends.layouts.base import tile_permute
from backends.layouts.placement import RowCol, Run, _as_words, boxes, copy_words, place

from conftest import DEVICES


def box_indices(box, radices):
    prefix, lo, hi = box
    inner = math.prod(radices[len(prefix) + 1:])
    base = 0
    for level, digit in enumerate(prefix):
        base += digit * math.prod(radices[level + 1:])
    return list(range(base + lo * inner, base + hi * inner))


@pytest.mark.parametrize("seed", range(40))
def test_boxes_cover_the_range_exactly_once_in_order(seed):
    rng = random.Random(seed)
    radices = tuple(rng.choice([1, 2, 3, 4, 8]) for _ in range(rng.randint(1, 4)))
    total = math.prod(radices)
    start = rng.randint(0, total)
    stop = rng.randint(start, total)
    covered = [i for box in boxes(start, stop, radices) for i in box_indices(box, radices)]
    assert covered == list(range(start, stop))


def random_factors(n, rng):
    factors = []
    for p in (2, 3, 2, 4):
        if n % p == 0 and rng.random() < 0.6:
            factors.append(p)
            n //= p
    return [n, *factors]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(30))
def test_place_equals_pad_then_tile_permute_and_writes_every_byte(seed, device):
    """Random row/column digits, a random digit order and random logical sizes: `place` with one data run and
    one zero run gives the bytes of F.pad followed by `tile_permute`; the buffer starts poisoned."""
    rng = random.Random(seed)
    row_digits = random_factors(rng.choice([4, 8, 12, 16, 24]), rng)
    col_digits = random_factors(rng.choice([8, 16, 24, 48]), rng)
    padded_rows, padded_cols = math.prod(row_digits), math.prod(col_digits)
    rows, cols = rng.randint(0, padded_rows), rng.randint(1, padded_cols)
    dtype = rng.choice([torch.uint8, torch.float8_e4m3fn, torch.float32])
    experts = rng.choice([0, 1, 3])
    src = torch.randint(0, 256, (experts, rows, cols * torch.empty((), dtype=dtype).element_size()),
                        dtype=torch.uint8).view(dtype).to(device)
    digits = (*row_digits, *col_digits)
    order = list(range(len(digits)))
    rng.shuffle(order)
    padded = torch.nn.functional.pad(src.view(torch.uint8), (0, (padded_cols - cols) * src.element_size(),
                                                             0, padded_rows - rows))
    expected = tile_permute(padded.view(dtype), (experts, *digits), (0, *(1 + d for d in order)))
    out = torch.full((experts, padded_rows, padded_cols * src.element_size()), 0xAB, dtype=torch.uint8,
                     device=device).view(dtype)
    stored = tuple(digits[d] for d in order)
    back = tuple(sorted(range(len(order)), key=lambda j: order[j]))
    rc = RowCol.of(out, stored, back, len(row_digits))
    place(rc, [Run(0, src), Run(rows, rows=padded_rows - rows)], cols)
    assert torch.equal(out.view(torch.uint8), expected.contiguous().view(torch.uint8))


def test_selected_digit_runs_fill_their_slot_only():
    """Two runs on a selected row digit (gate/up style) interleave rows; the zero runs pad each slot."""
    a = torch.arange(1, 7, dtype=torch.int32).reshape(1, 3, 2)
    b = -a
    out = torch.full((1, 8, 3), 99, dtype=torch.int32)
    rc = RowCol.plain(out).split(0, (4, 2))
    runs = [Run(0, a, select=((1, 0),)), Run(3, rows=1, select=((1, 0),)),
            Run(0, b, select=((-1, 1),)), Run(3, rows=1, select=((-1, 1),))]
    place(rc, runs, 2)
    expected = torch.tensor([[1, 2, 0], [-1, -2, 0], [3, 4, 0], [-3, -4, 0], [5, 6, 0], [-5, -6, 0],
                             [0, 0, 0], [0, 0, 0]], dtype=torch.int32)
    assert torch.equal(out[0], expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset, width", [(16, 80), (8, 64), (2, 50), (1, 49)])
def test_copy_words_moves_bytes_as_wide_words_and_keeps_nan_payloads(device, offset, width):
    """16-, 8-, 2- and 1-byte alignments: every byte arrives unchanged, signalling-NaN payloads included."""
    src = torch.randint(0, 256, (3, 5, 48), dtype=torch.uint8)
    nan_payloads = torch.tensor([1, 0, 0, 0, 0, 0, 0xF0, 0x7F, 0, 0, 0, 0, 0, 0, 0xF8, 0xFF], dtype=torch.uint8)
    src[:, :, :16] = nan_payloads  # a signalling and a quiet NaN if read as doubles (or complex128)
    src = src.to(device)
    dst = torch.zeros(3, 7, width, dtype=torch.uint8, device=device)
    target = dst[:, 1:6, offset:offset + 48]
    copy_words(target, src)
    assert torch.equal(target, src)
    assert int(dst.sum()) == int(src.sum(dtype=torch.int64))
    if offset == 16:  # the widest carrier really was used
        assert _as_words(target, torch.complex128) is not None
