"""The warp-specialized prefill path (backends.triton_moe.warp_specialized), W4A16 and W4A8 on FP8 tensor cores: its
weight order, block tables and sm_90 build on CPU; the layer against the emulation on a Hopper GPU."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import requires_cuda
from tolerances import tolerance, w4a16_vs_emulation

pytest.importorskip("triton", reason="triton is not installed; the Triton MoE kernels cannot run")

from backends import emulation
from backends.layouts.triton_moe import (
    _decode_words,
    _from_words,
    _untile_rows,
    from_kernel_layout,
    to_kernel_layout,
    w4a8_row_data,
)
from backends.triton_moe import moe_forward, warp_specialized
from backends.triton_moe._routing import align
from backends.triton_moe._ws_kernels import WORD_ORDERS
from backends.triton_moe.testing import SHAPES, Shape, activation_kwargs, random_checkpoint
from backends.triton_moe.warp_specialized import (
    W4A8_BLOCK_K,
    WHOLE_TAIL_MAX_ROWS,
    WS_CONFIG,
    code_steps,
    compile_sm90,
    ws_blocks,
    ws_row_order,
    ws_weights,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def unpack_words(words: torch.Tensor) -> torch.Tensor:
    """The checkpoint's bytes [rows, K/2] (element 2j in byte j's low nibble) of pack_words' "words" order, undone
    step by step: the bit slots (_decode_words), then each word's outputs j (low nibble of byte j) and j + 4 (high
    nibble) back to their K offsets WORD_ORDERS["words"][t][j] in the 32-wide block."""
    stored = _decode_words(words.view(torch.uint8))
    rows = stored.shape[0]
    by_word = stored.reshape(rows, -1, 4, 4)  # [row, block, word t, byte j]
    outputs = torch.cat([by_word & 15, by_word >> 4], dim=-1).reshape(rows, -1, 32)  # [row, block, 8 t + j]
    codes = torch.empty_like(outputs)
    codes[..., torch.tensor(WORD_ORDERS["words"]).flatten()] = outputs
    codes = codes.reshape(rows, -1)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def test_row_order_puts_each_channels_gate_and_up_rows_eight_apart():
    inter = 64
    order = ws_row_order(inter)
    assert sorted(order.tolist()) == list(range(2 * inter))
    for row in range(2 * inter):
        if row % 16 < 8:  # a gate row; the wgmma accumulator's row + 8 must be the same channel's up row
            assert int(order[row]) < inter and int(order[row + 8]) == int(order[row]) + inter, row


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_ws_weights_hold_the_checkpoints_codes_and_scales_in_the_kernels_order(fmt):
    shape = Shape("small", fmt, 4, 2, 128, 64, "swigluoai", True)
    kw = to_kernel_layout(**random_checkpoint(shape, generator=torch.Generator().manual_seed(1)))
    raw = from_kernel_layout(kw, gate_up_layout="stacked")
    ws = ws_weights(kw)
    order = ws_row_order(shape.intermediate_size)
    rows13 = raw["w13"][:, order].reshape(-1, shape.hidden_size // 2)
    assert torch.equal(unpack_words(ws.w13), rows13)
    assert torch.equal(unpack_words(ws.w2), raw["w2"].reshape(-1, shape.intermediate_size // 2))
    scale13 = raw["w13_scale"][:, order].reshape(ws.w13_scale.shape[0], -1)
    if fmt == "nvfp4":  # folded: each E4M3 block scale as bf16 s * 2^110, exactly, two blocks a word
        assert ws.w13_scale.dtype == torch.int32
        assert torch.equal(ws.w13_scale.view(torch.bfloat16).float(), scale13.float() * 2.0**110)
    else:
        assert torch.equal(ws.w13_scale, scale13.view(torch.uint8))
    assert torch.equal(ws.w13_bias, raw["w13_bias"][:, order])


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_ws_w4a8_weights_are_the_fp8_tiles_rows_in_the_kernels_order(fmt):
    """The W4A8 kernels' bytes, table codes and row exponents are the FP8 tile kernels' (w4a8_row_data, which the
    W4A8 tests hold to the emulation), row for row in the warp-specialized order."""
    shape = Shape("small", fmt, 4, 2, 128, 64, "swigluoai", True)
    kw = to_kernel_layout(**random_checkpoint(shape, generator=torch.Generator().manual_seed(2)))
    tiles = w4a8_row_data(kw)
    ws = ws_weights(kw, w4a8=True)
    assert ws.w4a8
    for name, order, k in (("w13", ws_row_order(shape.intermediate_size), shape.hidden_size),
                           ("w2", torch.arange(shape.hidden_size), shape.intermediate_size)):
        assert torch.equal(getattr(ws, name), _untile_rows(tiles[f"{name}_fp8"])[:, order].reshape(-1, k // 2))
        assert torch.equal(getattr(ws, f"{name}_row_exp"), tiles[f"{name}_row_exp"][:, order].reshape(-1))
        codes = _from_words(tiles[f"{name}_lut_code"], fmt, k)[:, order]
        codes = codes.reshape(-1, k // (16 if fmt == "nvfp4" else 32)).contiguous()
        if fmt == "nvfp4":  # a 32-wide chunk's two 16-wide blocks' codes as one int16, the first in the low byte
            codes = codes.view(torch.int16)
        stored = getattr(ws, f"{name}_scale")
        assert stored.shape[1] == -(-k // W4A8_BLOCK_K) * (W4A8_BLOCK_K // 32)  # whole K steps of the widest
        assert torch.equal(stored[:, :k // 32], codes)
        assert not stored[:, k // 32:].any()  # past K: the zero table row's code
        steps = code_steps(stored, W4A8_BLOCK_K)  # a row's K step as one integer, chunk h in its byte / half h
        h = 1 if k > 32 else 0
        shift = 16 * h if fmt == "nvfp4" else 8 * h
        mask = 0xFFFF if fmt == "nvfp4" else 0xFF
        assert torch.equal((steps[:, 0].long() >> shift) & mask, stored[:, h].long() & mask)


#: Run lengths that take every kind of block (with 256-row blocks: a quarter, a half, a half and its quarter tail,
#: a whole block, one and an eighth (a whole block's tail, `alignment_padding`'s eighth_tails), one and a quarter,
#: one and a half and a tail) and their edges.
RUN_LENGTHS = (1, 64, 65, 129, 192, 193, 270, 288, 320, 400)


def _stepped_ids(tokens: int, experts: int, k: int, device=None) -> torch.Tensor:
    """topk_ids [tokens, k] whose first experts take RUN_LENGTHS pairs and the others the rest about evenly: the
    pairs listed by expert, slot j of token t the (j * tokens + t)-th (an expert's pairs fewer than `tokens` fall in
    distinct tokens)."""
    rest = tokens * k - sum(RUN_LENGTHS)
    others = experts - len(RUN_LENGTHS)
    counts = list(RUN_LENGTHS) + [rest // others + (e < rest % others) for e in range(others)]
    assert max(counts) <= tokens, counts
    listed = torch.repeat_interleave(torch.arange(experts), torch.tensor(counts))
    return listed.view(k, tokens).t().contiguous().to(device)


def test_stepped_ids_take_the_run_lengths_with_distinct_experts_per_token():
    ids = _stepped_ids(1024, 32, 4)
    assert all(len(set(row)) == 4 for row in ids.tolist())
    assert torch.bincount(ids.view(-1).long(), minlength=32)[:len(RUN_LENGTHS)].tolist() == list(RUN_LENGTHS)


@pytest.mark.parametrize(("tokens", "experts", "k", "block_m", "eighth_tails"), [
    (37, 8, 2, 256, False), (500, 16, 4, 128, False), (1, 4, 1, 64, False), (300, 3, 3, 256, False),
    (1024, 32, 4, 256, False), (1024, 64, 8, 128, False), (1024, 32, 4, 256, True), (300, 3, 3, 256, True)])
def test_blocks_cover_each_experts_padded_run_once_in_the_alignments_order(tokens, experts, k, block_m, eighth_tails):
    from backends.triton_moe._routing import padded_runs
    from backends.triton_moe.warp_specialized import alignment_padding

    if tokens * k >= sum(RUN_LENGTHS) + experts:
        ids = _stepped_ids(tokens, experts, k)
    else:
        ids = torch.stack([torch.randperm(experts, generator=torch.Generator().manual_seed(t))[:k]
                           for t in range(tokens)])
    align_rows, coarse_pad = alignment_padding(block_m, eighth_tails)
    al = align(ids, experts, align_rows, coarse_pad=coarse_pad)
    sorted_pairs = al.sorted_pairs.tolist()
    covered, blocks_of = {}, Counter()
    for size, tail, expert, first, count, bound in ws_blocks(ids, experts, block_m, eighth_tails):
        assert int(count) <= bound and tail in (0, block_m // 4) + ((block_m // 8,) if eighth_tails else ())
        assert not tail or size == block_m // 2 or size <= WHOLE_TAIL_MAX_ROWS or tail == block_m // 8, (size, tail)
        for b in range(int(count)):
            e, row = int(expert[b]), int(first[b])
            blocks_of[e] += 1
            for r in range(row, row + size + tail):
                assert r not in covered, (size, b, r)
                covered[r] = e
    pairs_of = {e: sorted(p for p in range(tokens * k) if int(ids.view(-1)[p]) == e) for e in range(experts)}
    eighths = 0
    for e in range(experts):
        rows = sorted(r for r, owner in covered.items() if owner == e)
        padded = int(padded_runs(torch.tensor([len(pairs_of[e])]), align_rows, coarse_pad))
        assert len(rows) == padded and rows == list(range(rows[0], rows[0] + padded)) if padded else not rows
        real = [sorted_pairs[r] for r in rows if sorted_pairs[r] < tokens * k]
        assert sorted(real) == pairs_of[e], e
        # one program (one decode of the expert's weights) for the rows past its whole blocks, none where a lone
        # quarter (or with eighth_tails an eighth) rides with the last whole block
        whole, rest = divmod(padded, block_m)
        eighths += rest == block_m // 8
        rides_on_whole = whole > 0 and (rest == block_m // 4 and block_m <= WHOLE_TAIL_MAX_ROWS
                                        or rest == block_m // 8)
        assert blocks_of[e] == whole + (rest > 0 and not rides_on_whole), (e, padded)
    assert len(covered) == int(al.padded_total)
    if not eighth_tails:
        assert eighths == 0
    elif tokens * k >= sum(RUN_LENGTHS) + experts:  # RUN_LENGTHS' 270 and 288
        assert eighths >= 2


@pytest.mark.parametrize(("gemm", "block_m", "nvfp4", "has_bias", "activation", "tail"), [
    (1, 256, False, True, 1, 0), (2, 256, False, True, 1, 0), (1, 64, True, False, 0, 0), (2, 128, True, False, 0, 0),
    (1, 128, False, True, 1, 64), (2, 128, True, True, 0, 64), (2, 128, False, True, 1, 32)])
def test_sm90_build_keeps_the_weights_in_registers_without_spills(gemm, block_m, nvfp4, has_bias, activation, tail):
    from probe_gluon_w4a16 import sass_stats, weights_stay_in_registers

    stats = sass_stats(compile_sm90(gemm, block_m, nvfp4=nvfp4, has_bias=has_bias, activation=activation, tail=tail))
    # wgmmas, no shuffles, no spills, no in-flight operand rewritten; a tail's output tile is the second local store
    assert weights_stay_in_registers(stats, output_tiles=2 if tail else 1), stats
    assert stats["in_flight"] >= 1 and stats["shared_bytes"] <= 227 * 1024, stats


@pytest.mark.parametrize(("gemm", "block_m", "nvfp4", "act_quant", "tail"), [
    (1, 256, True, 3, 0), (2, 256, False, 3, 0), (1, 256, False, 4, 0), (1, 128, True, 4, 64), (2, 128, True, 4, 0)])
def test_sm90_w4a8_bf16_dot_build_keeps_w4a16s_k_loop(gemm, block_m, nvfp4, act_quant, tail):
    """W4A8 on bf16 dots (ACT_QUANT 3 static FP8, 4 MXFP8) runs W4A16's K loop on x's quantized values: the weights
    decoded into the wgmmas' registers, none rewritten in flight, no spills, within shared memory. Only MXFP8's GEMM1
    epilogue exchanges values between threads (each block's maximum over 32 channels)."""
    from probe_gluon_w4a16 import sass_stats, weights_stay_in_registers

    stats = sass_stats(compile_sm90(gemm, block_m, nvfp4=nvfp4, has_bias=not nvfp4, activation=int(not nvfp4),
                                    act_quant=act_quant, tail=tail))
    if act_quant == 4 and gemm == 1:
        assert stats["shuffles"] > 0 and stats["spills"] == 0 and stats["operand_rewrites"] == 0, stats
    else:
        assert weights_stay_in_registers(stats, output_tiles=2 if tail else 1), stats
    assert stats["in_flight"] >= 1 and stats["shared_bytes"] <= 227 * 1024, stats


def test_ring_stages_fit_shared_memory_and_keep_the_measured_depths_at_block_k_64():
    from backends.triton_moe.warp_specialized import (
        PARTIAL_BLOCK_STAGES,
        TAIL_BLOCK_STAGES,
        constexprs,
        ring_stages_that_fit,
    )

    def stages(gemm, block_m, tail=0, act_quant=0, block_k=64):
        config = WS_CONFIG[:2] + (block_k,) + WS_CONFIG[3:]
        return constexprs(gemm, block_m, nvfp4=False, has_bias=False, activation=0, top_k=4, config=config,
                          act_quant=act_quant, tail=tail)["STAGES"]

    for gemm in (1, 2):
        for act_quant in (0, 1, 2):
            assert stages(gemm, 256, act_quant=act_quant) == WS_CONFIG[3]
            assert stages(gemm, 128, act_quant=act_quant) == PARTIAL_BLOCK_STAGES
            assert stages(gemm, 128, tail=64, act_quant=act_quant) == TAIL_BLOCK_STAGES
    assert stages(2, 128, tail=64, act_quant=1, block_k=128) == 5 < TAIL_BLOCK_STAGES  # FP8 X tiles of 128 columns
    assert ring_stages_that_fit(2, 128 + 64, 128, 128, 1) == 5
    deep = WS_CONFIG[:3] + (8,) + WS_CONFIG[4:]  # a forced whole-block depth stays as asked (past 227 KiB: launch fails)
    assert constexprs(2, 256, nvfp4=False, has_bias=False, activation=0, top_k=4, config=deep)["STAGES"] == 8


@pytest.mark.parametrize(("gemm", "block_m", "nvfp4", "act_quant", "tail"), [
    (1, 256, False, 2, 0), (2, 256, True, 1, 0), (1, 64, True, 1, 0), (2, 128, False, 2, 0), (1, 128, True, 1, 64),
    (2, 128, False, 2, 64)])
def test_sm90_w4a8_build_keeps_fp8_operands_in_flight_without_spills_in_the_k_loop(gemm, block_m, nvfp4, act_quant,
                                                                                   tail):
    """The FP8 operands go from the table decode into the wgmma's registers and stay unwritten while it runs (the
    8-bit operand's registers kept live past the wait, `_kept`); MXFP8's per-row exponents may spill a few registers
    in the epilogue, never in the K loop."""
    import re

    from _cubin import cubin_tool, k_loop
    from probe_gluon_w4a16 import sass_stats

    compiled = compile_sm90(gemm, block_m, nvfp4=nvfp4, has_bias=True, activation=1, act_quant=act_quant, tail=tail)
    stats = sass_stats(compiled)
    assert stats["in_flight"] >= 1 and stats["operand_rewrites"] == 0 and stats["shuffles"] == 0, stats
    assert stats["warp_specialize"] > 0 and stats["shared_bytes"] <= 227 * 1024, stats
    loop = k_loop(cubin_tool(compiled, "nvdisasm", "-c"))
    assert any("QGMMA" in line for line in loop) and not any(re.search(r"\b(?:LDL|STL)\b", line) for line in loop)


@pytest.mark.parametrize(("gemm", "block_m", "nvfp4", "act_quant", "tail"), [
    (1, 256, False, 1, 0), (1, 256, True, 1, 0), (2, 256, True, 2, 0), (1, 128, False, 2, 0), (1, 128, True, 2, 64),
    (2, 64, False, 1, 0)])
def test_sm90_w4a8_wide_step_build_keeps_fp8_operands_in_flight_without_spills_in_the_k_loop(gemm, block_m, nvfp4,
                                                                                             act_quant, tail):
    """W4A8's 128-wide K steps (block_k_for) beside the gather loader's 64 registers. Not here: MXFP8's GEMM1 on
    256-row blocks, which spills 4-8 registers in its K loop (NVFP4 under triton 3.6, MXFP4 under 3.9; measured
    1.06x the 64-wide step on triton 3.6 all the same)."""
    import re

    from _cubin import cubin_tool, k_loop
    from probe_gluon_w4a16 import sass_stats

    config = WS_CONFIG[:2] + (warp_specialized.W4A8_BLOCK_K,) + WS_CONFIG[3:]
    compiled = compile_sm90(gemm, block_m, nvfp4=nvfp4, has_bias=True, activation=1, act_quant=act_quant, tail=tail,
                            config=config, k_size=2880 if gemm == 1 else 0)  # GEMM1: with the partial K step
    stats = sass_stats(compiled)
    assert stats["in_flight"] >= 1 and stats["operand_rewrites"] == 0 and stats["shared_bytes"] <= 227 * 1024, stats
    loop = k_loop(cubin_tool(compiled, "nvdisasm", "-c"))
    assert any("QGMMA" in line for line in loop) and not any(re.search(r"\b(?:LDL|STL)\b", line) for line in loop)


def test_w4a8_takes_the_wide_k_step_and_a_k_that_does_not_fill_it_ends_in_a_partial_one():
    from backends.triton_moe.warp_specialized import constexprs

    assert warp_specialized.block_k_for(fp8_dots=True) == warp_specialized.W4A8_BLOCK_K == 128
    assert warp_specialized.block_k_for(fp8_dots=False) == WS_CONFIG[2]
    wide = WS_CONFIG[:2] + (128,) + WS_CONFIG[3:]
    common = dict(nvfp4=False, has_bias=False, activation=0, top_k=4, act_quant=1)
    assert constexprs(1, 256, config=wide, k_size=2880, **common)["K_TAIL"]  # gpt-oss: 22.5 steps
    assert not constexprs(1, 256, config=wide, k_size=7168, **common)["K_TAIL"]
    assert not constexprs(1, 256, config=WS_CONFIG, k_size=2880, **common)["K_TAIL"]


def test_warp_specialized_w4a8_names_what_it_needs(monkeypatch):
    kw = to_kernel_layout(**random_checkpoint(Shape("small", "mxfp4", 4, 2, 128, 64, "swigluoai", True)))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(warp_specialized, "_triton_version", lambda: "3.6.0")
    cuda = torch.device("cuda")
    assert warp_specialized.ws_unsupported(kw, cuda, "mxfp8", "bf16", "wgmma") is None  # bf16 dots: W4A16's kernels
    assert "MOE_ORACLE_TRITON_FP8_ACCUMULATE=tensor-core" in warp_specialized.ws_unsupported(
        kw, cuda, "fp8_per_tensor_static", "fp8", "wgmma")
    assert warp_specialized.ws_unsupported(kw, cuda, "mxfp8", "fp8", "tensor-core") is None
    x = torch.randn(3, 128).bfloat16()
    with pytest.raises(ValueError, match=r"fp8_accumulate='tensor-core' is only read by a W4A8 call"):
        moe_forward(x, kw, router_logits=torch.randn(3, 4), top_k=2, fp8_accumulate="tensor-core")


def test_warp_specialized_off_sm90_names_the_reason_and_the_fix():
    shape = Shape("small", "mxfp4", 4, 2, 128, 64, "swigluoai", True)
    kw = to_kernel_layout(**random_checkpoint(shape))
    x = torch.randn(300, 128).bfloat16()
    with pytest.raises(ValueError, match=r"prefill_kernel='warp-specialized': it runs on sm_90 GPUs only .* "
                                         r"use prefill_kernel='tiles'"):
        moe_forward(x, kw, router_logits=torch.randn(300, 4), top_k=2, prefill_kernel="warp-specialized")
    with pytest.raises(ValueError, match=r"prefill_kernel='sideways' must be one of"):
        moe_forward(x, kw, router_logits=torch.randn(300, 4), top_k=2, prefill_kernel="sideways")


def test_ws_block_rows_steps_and_stages_come_from_the_environment_or_the_call(monkeypatch):
    from backends.triton_moe import forward

    for env in (forward.WS_BLOCK_M_ENV, forward.WS_STAGES_ENV, forward.WS_BLOCK_K_ENV):
        monkeypatch.delenv(env, raising=False)
    wide = WS_CONFIG[:2] + (128,) + WS_CONFIG[3:]
    many, few = 2 * warp_specialized.W4A8_SMALL_BLOCKS_UP_TO, warp_specialized.W4A8_SMALL_BLOCKS_UP_TO
    assert forward.ws_launch_config(fp8_dots=False, rows_per_expert=few) == WS_CONFIG
    assert forward.ws_launch_config(fp8_dots=True, rows_per_expert=many) == wide
    assert forward.ws_launch_config(fp8_dots=True, rows_per_expert=few) == (128,) + wide[1:]  # W4A8's smaller blocks
    monkeypatch.setenv(forward.WS_BLOCK_K_ENV, "128")
    assert forward.ws_launch_config(fp8_dots=False, rows_per_expert=many) == wide
    monkeypatch.setenv(forward.WS_BLOCK_K_ENV, "64")
    assert forward.ws_launch_config(fp8_dots=True, rows_per_expert=many) == WS_CONFIG
    monkeypatch.setenv(forward.WS_BLOCK_K_ENV, "96")
    with pytest.raises(ValueError, match=r"MOE_ORACLE_TRITON_WS_BLOCK_K='96' must be one of \('64', '128'\); set one "
                                         r"of them or unset it \(then the call's 128 decides\)"):
        forward.ws_launch_config(fp8_dots=True, rows_per_expert=many)
    monkeypatch.delenv(forward.WS_BLOCK_K_ENV)
    monkeypatch.setenv(forward.WS_BLOCK_M_ENV, "128")
    assert forward.ws_launch_config(fp8_dots=False, rows_per_expert=many) == (128,) + WS_CONFIG[1:]
    monkeypatch.setenv(forward.WS_STAGES_ENV, "6")
    assert forward.ws_launch_config(fp8_dots=False, rows_per_expert=many) == (128,) + WS_CONFIG[1:3] + (6, WS_CONFIG[4])
    monkeypatch.setenv(forward.WS_BLOCK_M_ENV, "256")
    assert forward.ws_launch_config(fp8_dots=True, rows_per_expert=few)[0] == 256
    monkeypatch.setenv(forward.WS_BLOCK_M_ENV, "96")
    with pytest.raises(ValueError, match=r"MOE_ORACLE_TRITON_WS_BLOCK_M='96' must be one of \('128', '256'\); set one "
                                         r"of them or unset it \(then the call's 256 decides\)"):
        forward.ws_launch_config(fp8_dots=False, rows_per_expert=many)
    monkeypatch.setenv(forward.WS_BLOCK_M_ENV, "256")
    monkeypatch.setenv(forward.WS_STAGES_ENV, "9")
    with pytest.raises(ValueError, match=r"MOE_ORACLE_TRITON_WS_STAGES='9' must be one of \('2', '3', .*'8'\); set "
                                         r"one of them or unset it \(then WS_CONFIG's 4 decides\)"):
        forward.ws_launch_config(fp8_dots=False, rows_per_expert=many)
    monkeypatch.delenv(forward.WS_PERSISTENT_ENV, raising=False)
    assert forward.ws_persistent(fp8_dots=True) and not forward.ws_persistent(fp8_dots=False)
    monkeypatch.setenv(forward.WS_PERSISTENT_ENV, "1")
    assert forward.ws_persistent(fp8_dots=False)
    monkeypatch.setenv(forward.WS_PERSISTENT_ENV, "0")
    assert not forward.ws_persistent(fp8_dots=True)
    monkeypatch.setenv(forward.WS_PERSISTENT_ENV, "yes")
    with pytest.raises(ValueError, match=r"MOE_ORACLE_TRITON_WS_PERSISTENT='yes' must be one of \('0', '1'\); set "
                                         r"one of them or unset it \(then persistent for W4A8 on FP8 dots, a program "
                                         r"per tile for the bf16 dots decides\)"):
        forward.ws_persistent(fp8_dots=False)


def test_sorted_x_where_w4a8_takes_its_small_blocks_unless_the_environment_says(monkeypatch):
    from backends.triton_moe import forward

    small = warp_specialized.W4A8_SMALL_BLOCK_ROWS
    monkeypatch.delenv(forward.WS_SORTED_X_ENV, raising=False)
    assert forward.ws_sorted_x(fp8_dots=True, block_m=small)
    assert not forward.ws_sorted_x(fp8_dots=True, block_m=WS_CONFIG[0])
    assert not forward.ws_sorted_x(fp8_dots=False, block_m=small)
    monkeypatch.setenv(forward.WS_SORTED_X_ENV, "1")
    assert forward.ws_sorted_x(fp8_dots=False, block_m=WS_CONFIG[0])
    monkeypatch.setenv(forward.WS_SORTED_X_ENV, "0")
    assert not forward.ws_sorted_x(fp8_dots=True, block_m=small)
    monkeypatch.setenv(forward.WS_SORTED_X_ENV, "2")
    with pytest.raises(ValueError, match=r"MOE_ORACLE_TRITON_WS_SORTED_X='2' must be one of \('0', '1'\)"):
        forward.ws_sorted_x(fp8_dots=True, block_m=small)


def test_sorted_x_launches_load_x_by_tma_with_one_loader_warp():
    from backends.triton_moe.warp_specialized import constexprs

    gathered = constexprs(1, 128, nvfp4=False, has_bias=False, activation=0, top_k=4)
    loaded = constexprs(1, 128, nvfp4=False, has_bias=False, activation=0, top_k=4, sorted_x=True)
    assert gathered["GATHER"] and not loaded["GATHER"]
    assert loaded["LOADER_WARPS"] == warp_specialized.TMA_LOADER_WARPS < gathered["LOADER_WARPS"]
    assert loaded["LOADER_REGS"] == warp_specialized.TMA_LOADER_REGS
    assert not constexprs(2, 128, nvfp4=False, has_bias=False, activation=0, top_k=4)["GATHER"]


@pytest.mark.parametrize(("nvfp4", "act_quant", "tail"), [(False, 1, 0), (True, 2, 0), (False, 2, 32), (True, 1, 32)])
def test_sm90_sorted_x_build_keeps_fp8_operands_in_flight_without_spills_in_the_k_loop(nvfp4, act_quant, tail):
    """GEMM1's launches that sorted_x_for gives x by TMA (W4A8's 128-row blocks, persistent, with and without their
    tail) keep the FP8 wgmmas in flight with nothing spilled in the K loop."""
    import re

    from _cubin import cubin_tool, k_loop
    from probe_gluon_w4a16 import sass_stats

    config = (warp_specialized.W4A8_SMALL_BLOCK_ROWS, WS_CONFIG[1], warp_specialized.W4A8_BLOCK_K) + WS_CONFIG[3:]
    compiled = compile_sm90(1, config[0], nvfp4=nvfp4, has_bias=not nvfp4, activation=0 if nvfp4 else 1,
                            act_quant=act_quant, tail=tail, config=config, persistent=True, sorted_x=True)
    stats = sass_stats(compiled)
    assert stats["in_flight"] >= 1 and stats["operand_rewrites"] == 0, stats
    assert stats["warp_specialize"] > 0 and stats["shared_bytes"] <= 227 * 1024, stats
    loop = k_loop(cubin_tool(compiled, "nvdisasm", "-c"))
    assert any("QGMMA" in line for line in loop) and not any(re.search(r"\b(?:LDL|STL)\b", line) for line in loop)


def test_eighth_tails_run_where_they_compile_and_the_environment_says(monkeypatch):
    from backends.triton_moe import forward

    monkeypatch.delenv(forward.WS_EIGHTH_TAILS_ENV, raising=False)
    assert all(forward.ws_eighth_tails(fmt, act_quant, 256) for fmt in ("mxfp4", "nvfp4") for act_quant in (1, 2))
    assert not any(forward.ws_eighth_tails(*args) for args in (("mxfp4", 0, 256), ("nvfp4", 4, 256),
                                                              ("mxfp4", 1, 128)))
    monkeypatch.setenv(forward.WS_EIGHTH_TAILS_ENV, "0")
    assert not forward.ws_eighth_tails("mxfp4", 1, 256)
    monkeypatch.setenv(forward.WS_EIGHTH_TAILS_ENV, "1")
    assert forward.ws_eighth_tails("nvfp4", 2, 256)
    with pytest.raises(ValueError, match=r"MOE_ORACLE_TRITON_WS_EIGHTH_TAILS=1: 128-row whole blocks carry a quarter "
                                         r"as their tail instead; unset it"):
        forward.ws_eighth_tails("nvfp4", 1, 128)
    with pytest.raises(ValueError, match=r"MOE_ORACLE_TRITON_WS_EIGHTH_TAILS=1: W4A16 and W4A8 on bf16 dots "
                                         r"serialize GEMM1's wgmmas"):
        forward.ws_eighth_tails("mxfp4", 0, 256)


def test_nvfp4_whole_blocks_with_an_eighth_tail_take_the_narrow_k_step_and_no_other_launch_does():
    from backends.triton_moe.warp_specialized import NVFP4_EIGHTH_TAIL_BLOCK_K, kind_config

    config = WS_CONFIG[:2] + (W4A8_BLOCK_K,) + WS_CONFIG[3:]
    assert kind_config(config, 256, 32, "nvfp4") == config[:2] + (NVFP4_EIGHTH_TAIL_BLOCK_K,) + config[3:]
    assert all(kind_config(config, *kind) == config for kind in (
        (256, 32, "mxfp4"), (256, 0, "nvfp4"), (128, 64, "nvfp4"), (64, 0, "nvfp4")))


@pytest.mark.parametrize(("gemm", "act_quant", "nvfp4"), [(1, 1, False), (2, 1, False), (1, 2, False), (2, 2, False),
                                                          (1, 1, True), (2, 2, True)])
def test_sm90_w4a8_whole_block_with_an_eighth_tail_keeps_its_wgmmas_in_flight_without_spills_in_the_k_loop(
        gemm, act_quant, nvfp4):
    """The 256-row W4A8 builds carrying a 32-row tail (`eighth_tails_unsupported` allows them; NVFP4's at its
    `kind_config` K step): both accumulators' wgmmas in flight across the decode, no local memory access in the
    K loop (MXFP8's MXFP4 GEMM1: one on triton 3.9, none on 3.6)."""
    import re

    from _cubin import cubin_tool, k_loop
    from probe_gluon_w4a16 import sass_stats

    from backends.triton_moe.warp_specialized import eighth_tails_unsupported, kind_config

    fmt = "nvfp4" if nvfp4 else "mxfp4"
    assert eighth_tails_unsupported(fmt, act_quant, 256) is None
    config = kind_config(WS_CONFIG[:2] + (W4A8_BLOCK_K,) + WS_CONFIG[3:], 256, 32, fmt)
    compiled = compile_sm90(gemm, 256, nvfp4=nvfp4, has_bias=not nvfp4, activation=0 if nvfp4 else 1,
                            act_quant=act_quant, tail=32, config=config, k_size=0 if nvfp4 else 2880)
    stats = sass_stats(compiled)
    assert stats["in_flight"] >= 2 and stats["operand_rewrites"] == 0 and stats["shared_bytes"] <= 227 * 1024, stats
    loop = k_loop(cubin_tool(compiled, "nvdisasm", "-c"))
    assert sum(bool(re.search(r"\b(?:LDL|STL)\b", line)) for line in loop) <= int((gemm, act_quant) == (1, 2))


def test_warp_specialized_on_sm90_names_an_older_triton(monkeypatch):
    kw = to_kernel_layout(**random_checkpoint(Shape("small", "mxfp4", 4, 2, 128, 64, "swigluoai", True)))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(warp_specialized, "_triton_version", lambda: "3.5.1")
    assert warp_specialized.ws_unsupported(kw, torch.device("cuda")) == "it needs triton >= 3.6 (Gluon), found 3.5.1"
    monkeypatch.setattr(warp_specialized, "_triton_version", lambda: "3.10.0+git1a2b")
    assert warp_specialized.ws_unsupported(kw, torch.device("cuda")) is None


def _on_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _cuda_routing(shape, tokens: int, routing: str, gen) -> dict:
    """moe_forward's routing arguments: router logits ("logits"), every token on experts 0..k-1 ("one_expert":
    each of those takes every token, the other experts none), or runs of every kind of block ("stepped",
    `_stepped_ids`)."""
    if routing == "logits":
        return {"router_logits": torch.randn(tokens, shape.experts, device="cuda", generator=gen),
                "top_k": shape.top_k}
    weights = torch.rand(tokens, shape.top_k, device="cuda", generator=gen)
    ids = (_stepped_ids(tokens, shape.experts, shape.top_k, "cuda") if routing == "stepped"
           else torch.arange(shape.top_k, device="cuda").repeat(tokens, 1))
    return {"topk_ids": ids, "topk_weights": weights / weights.sum(-1, keepdim=True)}


@requires_cuda
@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="the warp-specialized kernels are built for sm_90 (Hopper) only")
@pytest.mark.parametrize(("tokens", "routing"), [(64, "logits"), (700, "logits"), (4096, "logits"),
                                                 (1000, "one_expert"), (1024, "stepped")])
@pytest.mark.parametrize("name", ["gpt-oss-20b", "deepseek-v3", "qwen3-30b-a3b", "qwen3-30b-a3b-nvfp4"])
def test_cuda_warp_specialized_layer_matches_emulation(name, tokens, routing):
    """Every block size (a whole block, the half and quarter tails; one_expert: expert 0 takes every token, the
    others one slot each or none), GEMM2's column tile past H (gpt-oss: H = 2880), biases and both activations."""
    _check_layer_against_emulation(name, tokens, routing)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="the warp-specialized kernels are built for sm_90 (Hopper) only")
@pytest.mark.parametrize(("tokens", "routing"), [(4096, "logits"), (1024, "stepped")])
@pytest.mark.parametrize("name", ["gpt-oss-20b", "qwen3-30b-a3b-nvfp4"])
def test_cuda_warp_specialized_128_row_blocks_match_emulation(name, tokens, routing, monkeypatch):
    """128-row whole blocks ($MOE_ORACLE_TRITON_WS_BLOCK_M), whose last one carries a lone quarter as its tail."""
    from backends.triton_moe import forward

    monkeypatch.setenv(forward.WS_BLOCK_M_ENV, "128")
    _check_layer_against_emulation(name, tokens, routing)


def _check_layer_against_emulation(name: str, tokens: int, routing: str) -> None:
    shape = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    ckpt = random_checkpoint(shape, device="cuda", generator=gen)
    x = torch.randn(tokens, shape.hidden_size, device="cuda", generator=gen).bfloat16()
    route = _cuda_routing(shape, tokens, routing, gen)
    act = activation_kwargs(shape)
    ref = emulation.moe_forward(x, **ckpt, **route, **act)
    kw = to_kernel_layout(**ckpt)
    out = moe_forward(x, kw, **route, **act, prefill_kernel="warp-specialized")
    stats = w4a16_vs_emulation(out, ref)
    assert stats["shape_ok"] and stats["finite"], stats
    assert stats["rel_l2_ratio"] <= 1.0 and stats["elementwise_ratio"] <= 1.0, stats
    again = moe_forward(x, kw, **route, **act, prefill_kernel="warp-specialized")
    assert torch.equal(out.view(torch.int16), again.view(torch.int16))  # no atomics: the same bits every run


@requires_cuda
@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="the warp-specialized kernels are built for sm_90 (Hopper) only")
def test_cuda_warp_specialized_takes_a_strided_or_misaligned_x():
    """x as a column slice of a wider tensor (rows not 16-byte apart) or one element into its storage: the same
    bits as the contiguous x (the gather's 16-byte copies run on a copy)."""
    shape = SHAPES["gpt-oss-20b"]
    gen = torch.Generator(device="cuda").manual_seed(5)
    kw = to_kernel_layout(**random_checkpoint(shape, device="cuda", generator=gen))
    wide = torch.randn(300, shape.hidden_size + 8, device="cuda", generator=gen).bfloat16()
    route = {"router_logits": torch.randn(300, shape.experts, device="cuda", generator=gen), "top_k": shape.top_k}
    act = activation_kwargs(shape)
    want = moe_forward(wide[:, :shape.hidden_size].contiguous(), kw, **route, **act, prefill_kernel="warp-specialized")
    got = moe_forward(wide[:, :shape.hidden_size], kw, **route, **act, prefill_kernel="warp-specialized")
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    flat = wide.flatten()[1:1 + 300 * shape.hidden_size].view(300, shape.hidden_size)
    got = moe_forward(flat, kw, **route, **act, prefill_kernel="warp-specialized")
    want = moe_forward(flat.clone(), kw, **route, **act, prefill_kernel="warp-specialized")
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def _cuda_w4a8_layer(name, tokens: int, routing: str, scheme: str):
    """(checkpoint, x with an outlier channel, routing, activation kwargs, static scales or {}) of a W4A8 CUDA case."""
    shape = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    ckpt = random_checkpoint(shape, device="cuda", generator=gen)
    x = torch.randn(tokens, shape.hidden_size, device="cuda", generator=gen)
    x[:, 7] *= 100.0
    x = x.bfloat16()
    route = _cuda_routing(shape, tokens, routing, gen)
    scales = {}
    if scheme == "fp8_per_tensor_static":
        scales = {"a1_scale": (x.float().abs().amax() / 448).reshape(1),
                  "a2_scale": torch.full((1,), 1 / 64, device="cuda")}
    return ckpt, x, route, activation_kwargs(shape), scales


@requires_cuda
@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="the warp-specialized kernels are built for sm_90 (Hopper) only")
@pytest.mark.parametrize("scheme", ["fp8_per_tensor_static", "mxfp8"])
@pytest.mark.parametrize(("tokens", "routing"), [(700, "logits"), (4096, "logits"), (1000, "one_expert"),
                                                 (1024, "stepped")])
@pytest.mark.parametrize("name", ["gpt-oss-20b", "qwen3-30b-a3b-nvfp4"])
def test_cuda_warp_specialized_w4a8_matches_emulation(name, tokens, routing, scheme):
    """W4A8 on the warp-specialized kernels against the emulation of FP8 dots (fp8_operands=True), within the
    tolerance of sums accumulated in the tensor core; every block size, biases (gpt-oss), an outlier channel."""
    from backends.triton_moe.testing import compare

    ckpt, x, route, act, scales = _cuda_w4a8_layer(name, tokens, routing, scheme)
    ref = emulation.moe_forward(x, **ckpt, **route, **act, gemm_input_schemes=(scheme, scheme), fp8_operands=True,
                                **scales)
    kw = to_kernel_layout(**ckpt)
    call = dict(act_quant=scheme, w4a8_mma="fp8", fp8_accumulate="tensor-core", prefill_kernel="warp-specialized")
    out = moe_forward(x, kw, **route, **act, **call, **scales)
    stats = compare(out, ref, rel_l2_tol=tolerance("w4a8_tensor_core_sums_rel_l2")["rtol"], rtol=1.0,
                    atol_rms_units=1e9)
    assert stats["shape_ok"] and stats["finite"] and stats["rel_l2_ratio"] <= 1.0, stats
    again = moe_forward(x, kw, **route, **act, **call, **scales)
    assert torch.equal(out.view(torch.int16), again.view(torch.int16))


@requires_cuda
@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="the warp-specialized kernels are built for sm_90 (Hopper) only")
@pytest.mark.parametrize("scheme", ["fp8_per_tensor_static", "mxfp8"])
@pytest.mark.parametrize(("tokens", "routing"), [(700, "logits"), (4096, "logits"), (1000, "one_expert")])
@pytest.mark.parametrize("name", ["gpt-oss-20b", "qwen3-30b-a3b-nvfp4"])
def test_cuda_warp_specialized_w4a8_on_bf16_dots_matches_emulation(name, tokens, routing, scheme):
    """W4A8 as moe_forward runs it by default (bf16 dots) on the warp-specialized kernels: W4A16's dots on x's
    quantized values, GEMM1 writing h's, against the emulation's fake quantization within the tile kernels' W4A8
    tolerances; every block size, biases (gpt-oss), an outlier channel."""
    from backends.triton_moe.testing import compare

    ckpt, x, route, act, scales = _cuda_w4a8_layer(name, tokens, routing, scheme)
    ref = emulation.moe_forward(x, **ckpt, **route, **act, gemm_input_schemes=(scheme, scheme), **scales)
    kw = to_kernel_layout(**ckpt)
    call = dict(act_quant=scheme, w4a8_mma="bf16", prefill_kernel="warp-specialized")
    out = moe_forward(x, kw, **route, **act, **call, **scales)
    elementwise = tolerance("w4a8_mxfp8_moe_elementwise_rms_units" if scheme == "mxfp8"
                            else "w4a8_moe_elementwise_rms_units")
    stats = compare(out, ref, rel_l2_tol=tolerance("w4a8_moe_rel_l2")["rtol"], rtol=elementwise["rtol"],
                    atol_rms_units=elementwise["atol"])
    assert stats["shape_ok"] and stats["finite"], stats
    assert stats["rel_l2_ratio"] <= 1.0 and stats["elementwise_ratio"] <= 1.0, stats
    w4a16 = moe_forward(x, kw, **route, **act, prefill_kernel="warp-specialized")
    assert not torch.equal(out, w4a16), "the W4A8 numerics must differ from W4A16's (else nothing is compared)"
    again = moe_forward(x, kw, **route, **act, **call, **scales)
    assert torch.equal(out.view(torch.int16), again.view(torch.int16))


@requires_cuda
@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="the warp-specialized kernels are built for sm_90 (Hopper) only")
@pytest.mark.parametrize("scheme", ["fp8_per_tensor_static", "mxfp8"])
@pytest.mark.parametrize(("name", "tokens", "routing"), [
    ("gpt-oss-20b", 4096, "logits"), ("gpt-oss-20b", 2048, "stepped"), ("gpt-oss-20b", 16384, "logits"),
    ("qwen3-30b-a3b-nvfp4", 4096, "logits"), ("qwen3-30b-a3b-nvfp4", 4096, "stepped")])
def test_cuda_eighth_tails_give_a_quarter_blocks_bits(name, tokens, routing, scheme, monkeypatch):
    """$MOE_ORACLE_TRITON_WS_EIGHTH_TAILS: an expert's rows one eighth past its whole blocks ride on the last one
    (the same wgmmas for each row, into a second accumulator) instead of a quarter block of their own: the same
    bits (256-row blocks from 145 rows an expert on: gpt-oss-20b from T = 2048, Qwen3-30B-A3B NVFP4, whose tailed
    launches step K by 64, from T = 4096; stepped: RUN_LENGTHS' 270 and 288 rows end one eighth past a whole
    block)."""
    from backends.triton_moe import forward

    _assert_same_bits_under(forward.WS_EIGHTH_TAILS_ENV, ("0", "1"), name, tokens, routing, scheme, monkeypatch)


@requires_cuda
@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="the warp-specialized kernels are built for sm_90 (Hopper) only")
@pytest.mark.parametrize("scheme", [None, "fp8_per_tensor_static", "mxfp8"])
@pytest.mark.parametrize(("tokens", "routing"), [(4096, "logits"), (1000, "one_expert"), (1024, "stepped")])
@pytest.mark.parametrize("name", ["gpt-oss-20b", "qwen3-30b-a3b-nvfp4"])
@pytest.mark.parametrize("switch", ["WS_PERSISTENT_ENV", "WS_SORTED_X_ENV"])
def test_cuda_launch_forms_give_the_same_bits(switch, name, tokens, routing, scheme, monkeypatch):
    """Two forms of the same sums, so the same bits either way: $MOE_ORACLE_TRITON_WS_PERSISTENT (the partial and
    tail blocks' programs run on over several tiles each, the ring and the h store carried across) and
    $MOE_ORACLE_TRITON_WS_SORTED_X (GEMM1 loads x's rows copied to the sorted order by TMA instead of gathering
    them by pair: the same rows in the same ring)."""
    from backends.triton_moe import forward

    _assert_same_bits_under(getattr(forward, switch), ("0", "1"), name, tokens, routing, scheme, monkeypatch)


def _assert_same_bits_under(env: str, values: tuple, name: str, tokens: int, routing: str, scheme, monkeypatch):
    """The warp-specialized layer (W4A16, or W4A8 on FP8 dots: `scheme`) gives the same bits under each value of
    the environment variable `env`."""
    shape = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    kw = to_kernel_layout(**random_checkpoint(shape, device="cuda", generator=gen))
    x = torch.randn(tokens, shape.hidden_size, device="cuda", generator=gen).bfloat16()
    route = _cuda_routing(shape, tokens, routing, gen)
    call = {"prefill_kernel": "warp-specialized", **activation_kwargs(shape)}
    if scheme is not None:
        call.update(act_quant=scheme, w4a8_mma="fp8", fp8_accumulate="tensor-core")
        if scheme == "fp8_per_tensor_static":
            call.update(a1_scale=(x.float().abs().amax() / 448).reshape(1),
                        a2_scale=torch.full((1,), 1 / 64, device="cuda"))
    outs = []
    for value in values:
        monkeypatch.setenv(env, value)
        outs.append(moe_forward(x, kw, **route, **call))
    assert torch.isfinite(outs[0].float()).all()
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))


def test_persistent_grids_are_a_program_per_multiprocessor_at_most(monkeypatch):
    from backends.triton_moe.warp_specialized import launch_programs

    class Props:
        multi_processor_count = 132

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props())
    assert launch_programs(5000, "cuda") == 132
    assert launch_programs(100, "cuda") == 100


@pytest.mark.parametrize(("gemm", "block_m", "nvfp4", "act_quant", "tail"), [
    (1, 128, False, 0, 64), (2, 128, True, 0, 0), (1, 64, True, 1, 0), (2, 128, False, 2, 64)])
def test_sm90_persistent_build_keeps_operands_in_flight_without_spills_in_the_k_loop(gemm, block_m, nvfp4, act_quant,
                                                                                     tail):
    """The tile loop around the K loop leaves blocks of up to PERSISTENT_MAX_ROWS (with their tail) the registers
    to keep their wgmmas in flight with nothing spilled in the K loop (a tail block's epilogue may spill a few under
    triton 3.9)."""
    import re

    from _cubin import cubin_tool, k_loop
    from probe_gluon_w4a16 import sass_stats

    assert block_m + tail <= warp_specialized.PERSISTENT_MAX_ROWS
    config = WS_CONFIG[:2] + (warp_specialized.block_k_for(act_quant != 0),) + WS_CONFIG[3:]
    compiled = compile_sm90(gemm, block_m, nvfp4=nvfp4, has_bias=not nvfp4, activation=0 if nvfp4 else 1,
                            act_quant=act_quant, tail=tail, config=config, persistent=True)
    stats = sass_stats(compiled)
    assert stats["in_flight"] >= 1 and stats["operand_rewrites"] == 0, stats
    assert stats["warp_specialize"] > 0 and stats["shared_bytes"] <= 227 * 1024, stats
    loop = k_loop(cubin_tool(compiled, "nvdisasm", "-c"))
    assert any(re.search(r"\b[HQ]GMMA\b", line) for line in loop)
    assert not any(re.search(r"\b(?:LDL|STL)\b", line) for line in loop)


def test_config_is_one_the_probe_measured():
    from probe_gluon_w4a16 import FORMS

    assert WS_CONFIG in FORMS["words"]


def _one_entry_table(shape: dict, prefill_kernel: str) -> dict:
    launch = {"block_m": 128, "block_n": 128, "block_k": 64, "group_m": 8, "swap_ab": True, "num_warps": 4,
              "num_stages": 3}
    return {"table": "triton-moe-tuning", "version": 1, "arch": "sm90", "gpu": "H200", "why": "test",
            "entries": [{"shape": shape, "tokens": {"min": 16384}, "measured": {"tokens": 16384, "us": 1.0,
                                                                               "run": "test"},
                         "prefill_kernel": prefill_kernel, "gemm1": dict(launch), "gemm2": dict(launch)}]}


def test_a_table_entry_names_the_prefill_kernels_and_selection_reads_it():
    from backends.triton_moe import tuning
    from backends.triton_moe.tuning.tables import config_of

    table = _one_entry_table(SHAPES["deepseek-v3"].fields(), "warp-specialized")
    tuning.validate_table(table, "x.yaml")
    assert config_of(table["entries"][0], "x.yaml#0").prefill_kernel == "warp-specialized"
    del table["entries"][0]["prefill_kernel"]
    assert config_of(table["entries"][0], "x.yaml#0").prefill_kernel == "tiles"
    with pytest.raises(ValueError, match=r"x.yaml: entries/0/prefill_kernel"):
        tuning.validate_table(_one_entry_table(SHAPES["deepseek-v3"].fields(), "fast"), "x.yaml")
    odd = SHAPES["deepseek-v3"].fields() | {"intermediate_size": 160}  # GEMM2's K is not a multiple of 64
    with pytest.raises(ValueError, match=r"x.yaml: entries/0: prefill_kernel warp-specialized: H=7168 and I=160 must "
                                         r"be multiples of 64; drop the field"):
        tuning.validate_table(_one_entry_table(odd, "warp-specialized"), "x.yaml")


def test_the_h200_table_takes_the_warp_specialized_kernels_only_where_it_measured_them_faster():
    from backends.triton_moe import tuning
    from backends.triton_moe.tuning.configs import Problem

    arch, _ = tuning.device_gpu("cpu")
    h200 = tuning.Gpu("NVIDIA H200", 132)

    def kernels(name, tokens):
        return tuning.select_config(arch, h200, Problem(tokens=tokens, **SHAPES[name].fields())).prefill_kernel

    assert kernels("deepseek-v3", 6144) == kernels("deepseek-v3", 8192) == kernels("deepseek-v3", 16384) \
        == kernels("deepseek-v3-mxfp4", 6144) == kernels("deepseek-v3-mxfp4", 12288) \
        == kernels("deepseek-v3-mxfp4", 32768) == kernels("gpt-oss-120b", 12288) == kernels("gpt-oss-120b", 16384) \
        == "warp-specialized"
    assert kernels("deepseek-v3", 5120) == kernels("deepseek-v3-mxfp4", 5120) == kernels("gpt-oss-120b", 8192) \
        == kernels("gpt-oss-120b", 10240) == kernels("qwen3-30b-a3b", 16384) == "tiles"


def test_a_tables_warp_specialized_choice_serves_the_calls_those_kernels_run_on_sm90_cuda_only(monkeypatch):
    import dataclasses

    from backends.triton_moe.forward import _config_prefill_kernel
    from backends.triton_moe.tuning.configs import LaunchConfig, MoEConfig

    tile = LaunchConfig(128, 128, 64, 8, True, 4, 3)
    config = dataclasses.replace(MoEConfig(tile, tile, "test"), prefill_kernel="warp-specialized")
    kw = to_kernel_layout(**random_checkpoint(Shape("small", "mxfp4", 4, 2, 128, 64, "swigluoai", True)))
    x = torch.randn(4, 128).bfloat16()
    assert _config_prefill_kernel(config, x, kw, None) == "tiles"  # on the CPU the interpreter runs the tiles
    assert _config_prefill_kernel(config, x, kw, "mxfp8") == "tiles"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(warp_specialized, "_triton_version", lambda: "3.6.0")
    on_sm90 = SimpleNamespace(device=torch.device("cuda"))  # all it reads of x
    for act_quant, mma, accumulate in ((None, None, None), ("mxfp8", "bf16", None),
                                       ("fp8_per_tensor_static", "fp8", "tensor-core")):
        assert _config_prefill_kernel(config, on_sm90, kw, act_quant, mma, accumulate) == "warp-specialized"
    assert _config_prefill_kernel(config, on_sm90, kw, "mxfp8", "fp8", "wgmma") == "tiles"
    monkeypatch.undo()
    if _on_hopper():
        assert _config_prefill_kernel(config, x.cuda(), dataclasses.replace(
            kw, **{name: getattr(kw, name).cuda() for name in ("w13", "w13_scale", "w2", "w2_scale")}),
            None) == "warp-specialized"
