"""Triton MoE weight layout (round trip, gate/up de-interleaving), alignment and launch-config tables.

Pure torch / YAML: no Triton needed, so these run everywhere and fast.
"""

from __future__ import annotations

import copy

import pytest
import torch

from backends.layouts.triton_moe import (
    TILE_BYTES,
    TILE_ROWS,
    WORD_SLOTS,
    _from_words,
    _join_halves,
    _split_halves,
    _tile_rows,
    _to_words,
    _untile_rows,
    from_kernel_layout,
    to_kernel_layout,
)
from backends.triton_moe import _routing, tuning
from backends.triton_moe.testing import Shape, compare, random_checkpoint

from conftest import requires_cuda

SMALL_MX = Shape("mx", "mxfp4", 4, 2, 64, 64, "swigluoai", True)
SMALL_NV = Shape("nv", "nvfp4", 4, 2, 128, 64, "silu", True)


@pytest.mark.parametrize("layout", ["interleaved", "contiguous"])
@pytest.mark.parametrize("shape", [SMALL_MX, SMALL_NV], ids=["mxfp4", "nvfp4"])
def test_layout_round_trip_is_exact(shape, layout):
    ckpt = random_checkpoint(shape, generator=torch.Generator().manual_seed(0), gate_up_layout=layout)
    back = from_kernel_layout(to_kernel_layout(**ckpt), gate_up_layout=layout)
    assert set(back) == set(ckpt)
    for key, value in ckpt.items():
        if isinstance(value, torch.Tensor):
            assert back[key].dtype == value.dtype and torch.equal(back[key].view(torch.uint8), value.view(torch.uint8)), key
        else:
            assert back[key] == value, key


def test_interleaved_rows_become_gate_then_up():
    ckpt = random_checkpoint(SMALL_MX, generator=torch.Generator().manual_seed(1))
    kw = to_kernel_layout(**ckpt)
    inter = SMALL_MX.intermediate_size
    scale_bytes = _from_words(kw.w13_scale, "mxfp4", SMALL_MX.hidden_size)
    for src, dst in (("w13", _join_halves(_untile_rows(kw.w13))), ("w13_scale", scale_bytes), ("w13_bias", kw.w13_bias)):
        assert torch.equal(dst[:, :inter], ckpt[src][:, 0::2]) and torch.equal(dst[:, inter:], ckpt[src][:, 1::2]), src


@pytest.mark.parametrize("fmt,k", [("mxfp4", 2880), ("nvfp4", 7168), ("nvfp4", 96)])
def test_scale_words_hold_four_block_scales_little_endian(fmt, k):
    block = 32 if fmt == "mxfp4" else 16
    chunk = 4 * block  # K values per word: 128 (MXFP4), 64 (NVFP4)
    scales = torch.randint(0, 256, (2, 3, k // block), dtype=torch.uint8)
    words = _to_words(scales, fmt)
    assert words.dtype == torch.int32 and words.shape == (2, -(-k // chunk), 3)
    for word in range(words.shape[1]):
        for j in range(4):
            byte = (words[:, word, :] >> (8 * j)) & 0xFF
            g = word * 4 + j
            expected = scales[:, :, g].int() if g < k // block else torch.zeros(2, 3, dtype=torch.int32)
            assert torch.equal(byte, expected), (word, j)
    assert torch.equal(_from_words(words, fmt, k), scales)


@pytest.mark.parametrize("fmt,k", [("mxfp4", 64), ("nvfp4", 64), ("mxfp4", 256)])
def test_scale_words_invert_whatever_their_strides(fmt, k):
    """A copy of the words (loaded, cloned, moved) has standard strides; with one K chunk its size-1 dim's stride
    differs from _to_words' own, and the inverse must not depend on it."""
    block = 32 if fmt == "mxfp4" else 16
    scales = torch.randint(0, 256, (2, 3, k // block), dtype=torch.uint8)
    words = _to_words(scales, fmt)
    for copy_ in (words, words.clone(memory_format=torch.contiguous_format), torch.empty(words.shape,
                                                                                          dtype=torch.int32).copy_(words)):
        assert torch.equal(_from_words(copy_, fmt, k), scales)


def test_words_hold_k_and_k_plus_32_of_each_64_group_in_wgmma_order_at_their_slots():
    """Stored byte 16r + 4w + 2h + p of a 64-wide group holds K byte j = 16r + 8h + 2w + p (values j, j + 32), so
    K bytes 2w, 2w+1, 2w+8, 2w+9 of each 16-wide run (a wgmma register operand's share per thread) are one word;
    within its word, the code of byte b's low (high) value sits at WORD_SLOTS[b, 0] ([b, 1]): sign, magnitude."""
    packed = torch.randint(0, 256, (3, 128), dtype=torch.uint8)  # K = 256
    codes = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(3, 256)
    split = _split_halves(packed)
    words = split.view(torch.int32).long() & 0xFFFFFFFF
    for byte in range(128):
        g, stored = divmod(byte, 32)
        run, w, h, p = stored // 16, stored % 16 // 4, stored % 4 // 2, stored % 2
        j = 16 * run + 8 * h + 2 * w + p
        for nibble, k in ((0, 64 * g + j), (1, 64 * g + 32 + j)):
            sign, mag = WORD_SLOTS[byte % 4, nibble]
            word = words[:, byte // 4]
            assert torch.equal((((word >> sign) & 1) << 3) | ((word >> mag) & 7), codes[:, k].long()), (byte, nibble)
    assert sorted(b for sign, mag in WORD_SLOTS.values() for b in (sign, mag, mag + 1, mag + 2)) == list(range(32))
    assert torch.equal(_join_halves(split), packed)


def test_rows_are_stored_in_contiguous_tiles_and_the_tiling_inverts():
    """Byte (row n, K byte c) of the row-major kernel bytes sits at flat offset ((n // TILE_ROWS) * (K/2 //
    TILE_BYTES) + c // TILE_BYTES) * TILE_ROWS * TILE_BYTES + (n % TILE_ROWS) * TILE_BYTES + c % TILE_BYTES of its
    expert: every tile is TILE_ROWS x TILE_BYTES contiguous bytes, a row group's tiles in K order."""
    experts, rows, half = 2, 3 * TILE_ROWS, 4 * TILE_BYTES
    split = torch.randint(0, 256, (experts, rows, half), dtype=torch.uint8)
    tiled = _tile_rows(split)
    assert tiled.shape == split.shape
    flat = tiled.reshape(experts, -1)
    for n in range(rows):
        for c in range(half):
            at = ((n // TILE_ROWS) * (half // TILE_BYTES) + c // TILE_BYTES) * TILE_ROWS * TILE_BYTES \
                + (n % TILE_ROWS) * TILE_BYTES + c % TILE_BYTES
            assert torch.equal(flat[:, at], split[:, n, c]), (n, c)
    assert torch.equal(_untile_rows(tiled), split)


def test_layout_rejects_bad_checkpoints():
    ckpt = random_checkpoint(SMALL_NV)
    with pytest.raises(ValueError, match="w13_global_scale"):
        to_kernel_layout(**{**ckpt, "w13_global_scale": None})
    with pytest.raises(ValueError, match="format='mxfp6_e3m2'"):
        to_kernel_layout(**{**ckpt, "format": "mxfp6_e3m2"})
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        to_kernel_layout(**{**ckpt, "w13_scale": ckpt["w13_scale"].view(torch.uint8)})
    odd = random_checkpoint(Shape("odd", "mxfp4", 2, 1, 64, 96, "silu", False))
    with pytest.raises(ValueError, match="multiple of 64"):
        to_kernel_layout(**odd)


@pytest.mark.parametrize("block_m", [16, 64])
def test_alignment_groups_pairs_by_expert_with_padding(block_m):
    gen = torch.Generator().manual_seed(2)
    experts, tokens, k = 8, 37, 3
    ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])
    ids[:, 0] = 5  # a crowded expert; some experts may get nothing
    al = _routing.align(ids, experts, block_m)
    total = int(al.padded_total)
    assert total % block_m == 0 and al.num_blocks * block_m >= total
    assert al.num_blocks == _routing.max_row_blocks(tokens * k, experts, block_m)
    flat = ids.reshape(-1)
    seen = []
    for b in range(total // block_m):
        rows = al.sorted_pairs[b * block_m:(b + 1) * block_m]
        real = rows[rows < tokens * k]
        assert torch.all(flat[real.long()] == al.block_expert[b]), "a block mixes experts"
        assert torch.all(real[1:] > real[:-1]), "pairs of one expert keep their order (stable)"
        seen.append(real)
    assert torch.equal(torch.sort(torch.cat(seen)).values, torch.arange(tokens * k, dtype=torch.int32))
    assert torch.all(al.sorted_pairs[total:] == tokens * k), "rows past the padded end are sentinels"


def test_every_call_gets_a_config_without_any_table():
    """No catch-all entries: a GPU no table names and the interpreter take the heuristics, for any shape."""
    cfg = tuning.select_config("sm90", tuning.Gpu("Some Future GPU", 100),
                               tuning.Problem("nvfp4", 10**6, 3, 1, 64, 64))
    assert cfg.source.startswith("heuristic")
    arch, gpu = tuning.device_gpu(torch.device("cpu"))
    decode = tuning.select_config(arch, gpu, tuning.Problem("mxfp4", 1, 128, 4, 2880, 2880))
    assert decode.gemm1.block_m == decode.gemm2.block_m and decode.source.startswith("heuristic")


def test_bad_config_tables_are_rejected_with_the_place():
    table = tuning.shipped_table("sm90-h200.yaml")
    broken = copy.deepcopy(table)
    broken["entries"][0]["gemm1"]["block_k"] = 48
    with pytest.raises(ValueError, match=r"x.yaml: entries/0/gemm1/block_k"):
        tuning.validate_table(broken, "x.yaml")


@pytest.mark.parametrize("layout", ["interleaved", "contiguous"])
@pytest.mark.parametrize("shape", [SMALL_MX, SMALL_NV], ids=["mxfp4", "nvfp4"])
def test_converter_pads_converts_and_inverts_exactly(shape, layout):
    from backends.layouts.triton_moe import converter, triton_weights
    from backends.weights import MoEWeights

    ckpt = random_checkpoint(shape, generator=torch.Generator().manual_seed(4), gate_up_layout=layout)
    weights = MoEWeights(gate_up=layout, **{k: v for k, v in ckpt.items() if k != "gate_up_layout"})
    kw = converter.convert(weights, hidden_size=shape.hidden_size + 64, intermediate_size=shape.intermediate_size + 64)
    assert kw.layout == "triton_moe" and kw.padded_hidden_size == shape.hidden_size + 64
    view = triton_weights(kw)
    assert (view.hidden_size, view.intermediate_size) == (shape.hidden_size + 64, shape.intermediate_size + 64)
    back = converter.invert(kw)
    for name in ("w13", "w13_scale", "w2", "w2_scale", "w13_bias", "w2_bias", "w13_global_scale", "w2_global_scale"):
        a, b = getattr(weights, name), getattr(back, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
    with pytest.raises(ValueError, match="multiple of 64"):
        converter.convert(weights, hidden_size=shape.hidden_size + 32)


@pytest.mark.parametrize("found, ok", [("3.6.0", True), ("3.4.0", True), ("3.10.1", True), ("3.3.1", False),
                                       ("2.3.0", False), ("3.4.0+git1234", True), ("3.3.0rc1", False)])
def test_an_older_triton_is_refused_with_the_fix(found, ok):
    """The rules can only say 'triton installed'; the version floor is enforced when the runner is imported."""
    from backends.triton_moe.capabilities import CAPABILITIES, MIN_TRITON, require_triton_version

    assert CAPABILITIES["packages"]["triton"] == ">=" + ".".join(map(str, MIN_TRITON))
    if ok:
        require_triton_version(found)
    else:
        with pytest.raises(ImportError, match=rf"needs triton >= 3\.4, found {found}; pip install 'triton>=3\.4'"):
            require_triton_version(found)


def _on_cuda(w):
    """The same checkpoint with every tensor on the GPU."""
    import dataclasses

    return dataclasses.replace(w, **{f.name: getattr(w, f.name).cuda() for f in dataclasses.fields(w)
                                     if isinstance(getattr(w, f.name), torch.Tensor)})


@pytest.fixture
def poisoned_new_empty(monkeypatch):
    """Every buffer from Tensor.new_empty starts as 0xA5 bytes, so a converter that leaves padding unwritten fails."""
    allocate = torch.Tensor.new_empty

    def poisoned(self, *args, **kwargs):
        out = allocate(self, *args, **kwargs)
        out.view(torch.uint8).fill_(0xA5)
        return out

    monkeypatch.setattr(torch.Tensor, "new_empty", poisoned)


@pytest.mark.parametrize("gate_up", ["interleaved", "contiguous"])
@pytest.mark.parametrize("fmt, logical, padded", [
    ("mxfp4", (96, 32), (192, 64)),     # 3 and 1 scale bytes per row: tail words padded, rows padded
    ("nvfp4", (48, 80), (64, 128)),     # odd sizes padded up
    ("mxfp4", (64, 64), (64, 64)),      # unpadded, 2 bytes per row
    ("mxfp4", (2880, 192), (2944, 256)),  # gpt-oss's 90 bytes per row (not whole words), padded
    ("nvfp4", (192, 128), (192, 128)),  # whole words, unpadded
], ids=["mx-padded", "nv-odd", "mx-unpadded", "mx-90-bytes", "nv-whole-words"])
@pytest.mark.parametrize("experts", [0, 1, 3])
@requires_cuda
def test_one_pass_scale_words_match_the_definition(poisoned_new_empty, fmt, logical, padded, gate_up, experts):
    """The CUDA converter's one-pass scale words (`_scale_words_fast`, a Triton kernel; on CPU the same kernel
    runs under the interpreter in tests/test_layout_kernels.py) hold the bytes of `_to_words` of the padded,
    de-interleaved scales (the pure-torch converter), padding included, whatever the row pitch."""
    from backends.layouts.triton_moe import _scale_words_fast

    from layout_cases import random_layer

    w = random_layer(fmt, experts=experts, hidden=logical[0], inter=logical[1], gate_up=gate_up, seed=experts + 11)
    reference = to_kernel_layout(**w.pad(*padded).emulation_kwargs())
    words = {name: t.cpu() for name, t in _scale_words_fast(_on_cuda(w), *padded).items()}
    for name in ("w13_scale", "w2_scale"):
        expected = getattr(reference, name)
        assert words[name].dtype == expected.dtype and words[name].shape == expected.shape, name
        assert torch.equal(words[name].reshape(-1).view(torch.uint8), expected.reshape(-1).view(torch.uint8)), name


def test_compare_scales_the_elementwise_bound_by_each_rows_rms():
    """An error that is small against the whole tensor but large against its own (small) row fails, and the same
    error on a large row passes: the element-wise bound follows each token's magnitude."""
    ref = torch.cat([torch.full((1, 64), 0.01), torch.full((1, 64), 10.0)])
    small_row_off = ref.clone()
    small_row_off[0, 0] += 0.05  # 5x the small row's values, 0.5% of the tensor's RMS
    large_row_off = ref.clone()
    large_row_off[1, 0] += 0.05
    args = dict(rel_l2_tol=1.0, rtol=2**-6, atol_rms_units=2**-5)
    assert compare(small_row_off, ref, **args)["elementwise_ratio"] > 1.0
    assert compare(large_row_off, ref, **args)["elementwise_ratio"] < 1.0
