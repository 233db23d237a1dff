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


# ------------------------------------------------------------------------------------------------------------
# The one-pass converters against the step-by-step composition they replaced (pad, row gather, tile permute),
# built here from the helpers that were checked against flashinfer's own (docs/flashinfer-agreement.log).
def step_by_step(name, w, hidden, inter):
    from backends.layouts import aiter, cutlass, nvfp4_cutlass, trtllm
    from backends.layouts.gate_up import permute_rows, row_permutation
    from backends.layouts.scales import interleave_128x4

    p = w.pad(hidden, inter)
    e = w.E

    def rows(t, perm):
        return permute_rows(t, perm)

    if name.startswith("trtllm"):
        layout = trtllm.mxfp4 if name == "trtllm-mxfp4" else trtllm.nvfp4
        p13, p2 = layout._perms(w.gate_up, inter, hidden)
        swz = [interleave_128x4(rows(s.view(torch.uint8), q)).view(torch.float8_e4m3fn)
               for s, q in ((p.w13_scale, p13), (p.w2_scale, p2))]
        return {"w13": rows(p.w13, p13), "w2": rows(p.w2, p2), "w13_scale": swz[0], "w2_scale": swz[1],
                "w13_bias": rows(p.w13_bias, p13), "w2_bias": rows(p.w2_bias, p2)}
    if name.startswith("cutlass"):
        perm = row_permutation(w.gate_up, "up_gate", inter)
        w13, w2 = rows(p.w13, perm), p.w2
        s13, s2 = rows(p.w13_scale, perm), p.w2_scale
        if name == "cutlass-sm90":
            w13, w2 = cutlass.sm90_interleave_weights(w13), cutlass.sm90_interleave_weights(w2)
            s13, s2 = cutlass.sm90_fold_scales(s13), cutlass.sm90_fold_scales(s2)
        elif name == "cutlass-sm90-legacy":
            def legacy(s):
                n, groups = s.shape[1:]
                return tile_permute(s, (e, n, groups // 4, 4), (0, 2, 1, 3)).reshape(e, groups // 4, n * 4)
            s13, s2 = legacy(s13), legacy(s2)
        else:
            s13, s2 = interleave_128x4(s13), interleave_128x4(s2)
        return {"w13": w13, "w2": w2, "w13_scale": s13, "w2_scale": s2,
                "w13_bias": rows(p.w13_bias, perm).bfloat16(), "w2_bias": p.w2_bias.bfloat16()}
    if name == "aiter":
        perm = row_permutation(w.gate_up, "contiguous", inter)
        views = aiter._views(e, hidden, inter)
        fp4 = getattr(torch, "float4_e2m1fn_x2", torch.uint8)
        return {"w13": tile_permute(rows(p.w13, perm), views["w13"], aiter._W13_DIMS).view(fp4),
                "w2": tile_permute(p.w2, views["w2"], aiter._W2_DIMS).view(fp4),
                "w13_scale": tile_permute(rows(p.w13_scale, perm), views["w13_scale"], aiter._S13_DIMS),
                "w2_scale": tile_permute(p.w2_scale, views["w2_scale"], aiter._S2_DIMS),
                "w13_bias": rows(p.w13_bias, perm), "w2_bias": p.w2_bias}
    layout = {"fi-cutlass-nvfp4": nvfp4_cutlass.flashinfer_cutlass, "cutedsl": nvfp4_cutlass.cutedsl,
              "cutedsl-0.15": nvfp4_cutlass.cutedsl_v015, "vllm-cutlass": nvfp4_cutlass.vllm_cutlass}[name]
    perm = row_permutation(w.gate_up, layout.order, inter)
    return {"w13": rows(p.w13, perm), "w2": p.w2,
            "w13_scale": interleave_128x4(rows(p.w13_scale.view(torch.uint8), perm)).view(torch.float8_e4m3fn),
            "w2_scale": interleave_128x4(p.w2_scale.view(torch.uint8)).view(torch.float8_e4m3fn),
            "w13_bias": rows(p.w13_bias, perm), "w2_bias": p.w2_bias}


ONE_PASS = {  # name: (converter path, format, [(logical H, I), (padded H, I)] pairs, aligned and not)
    "trtllm-mxfp4": ("trtllm:mxfp4", "mxfp4", [((64, 32), (128, 128)), ((128, 192), (256, 256)), ((256, 128), (256, 128))]),
    "trtllm-nvfp4": ("trtllm:nvfp4", "nvfp4", [((48, 32), (128, 64)), ((128, 80), (256, 128))]),
    "cutlass-sm100": ("cutlass:mxfp4_mxfp8", "mxfp4", [((64, 32), (128, 128)), ((128, 96), (256, 384))]),
    "cutlass-sm90": ("cutlass:mxfp4_bf16_sm90", "mxfp4", [((64, 32), (128, 128)), ((128, 96), (256, 384))]),
    "cutlass-sm90-legacy": ("cutlass:mxfp4_bf16_sm90_legacy", "mxfp4", [((64, 32), (128, 128)),
                                                                         ((128, 96), (256, 384))]),
    "aiter": ("aiter:mxfp4", "mxfp4", [((64, 32), (256, 256)), ((256, 224), (512, 256))]),
    "fi-cutlass-nvfp4": ("nvfp4_cutlass:flashinfer_cutlass", "nvfp4", [((48, 32), (48, 64)), ((144, 192), (160, 192))]),
    "cutedsl": ("nvfp4_cutlass:cutedsl", "nvfp4", [((48, 32), (48, 64)), ((144, 192), (160, 192))]),
    "cutedsl-0.15": ("nvfp4_cutlass:cutedsl_v015", "nvfp4", [((48, 32), (48, 64))]),
    "vllm-cutlass": ("nvfp4_cutlass:vllm_cutlass", "nvfp4", [((48, 32), (48, 64)), ((144, 192), (160, 192))]),
}


@pytest.mark.parametrize("gate_up", ["interleaved", "contiguous"])
@pytest.mark.parametrize("name", sorted(ONE_PASS))
def test_one_pass_converters_equal_pad_gather_and_tile_step_by_step(name, gate_up):
    import importlib

    from layout_cases import random_layer

    path, fmt, sizes = ONE_PASS[name]
    module, attr = path.split(":")
    converter = getattr(importlib.import_module(f"backends.layouts.{module}"), attr)
    for seed, ((hidden, inter), (padded_h, padded_i)) in enumerate(sizes):
        w = random_layer(fmt, experts=3, hidden=hidden, inter=inter, gate_up=gate_up, seed=seed,
                         bf16_bias=name.startswith("cutlass"))
        kw = converter.convert(w, hidden_size=padded_h, intermediate_size=padded_i)
        expected = step_by_step(name, w, padded_h, padded_i)
        assert sorted(kw.tensors) == sorted(expected), name
        for key, want in expected.items():
            got = kw[key]
            assert (got.shape, got.dtype) == (want.shape, want.dtype), (key, got.shape, want.shape)
            assert torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)), (key, sizes)
