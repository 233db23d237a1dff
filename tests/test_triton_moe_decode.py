"""The decode kernels (backends/triton_moe/_gemv_kernels.py, T = 1-2): when the tuning selects them, the warps it
gives them, the checks of a hand-made decode config, and, on a GPU, every matrix layer against the emulation (both
routings), as a CUDA graph, and against the tile kernels. Their interpreter cases live in test_triton_moe_interp.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_triton_moe import assert_matches_emulation, layer_and_reference

from backends.model_shapes import MATRIX, SHAPES
from backends.triton_moe import tuning

from conftest import requires_cuda

pytest.importorskip("triton", reason="triton is not installed; the Triton MoE kernels cannot run")


def _problem(name: str, tokens: int) -> tuning.Problem:
    return tuning.Problem(tokens=tokens, **SHAPES[name].fields())


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("tokens", [1, 2])
def test_decode_warps_fit_the_kernels(name, tokens):
    """Every registry shape gets row groups the kernels accept, at most GEMV_MAX_WARPS warps a program, and K slices
    no shorter than DECODE_MIN_STEPS steps unless K is too short to split at all."""
    from backends.triton_moe.tuning import heuristics

    problem = _problem(name, tokens)
    decode = tuning.decode_kernels(132, problem)
    slots = 1 << (problem.top_k - 1).bit_length()
    assert decode.gemv1.row_groups in tuning.GEMV1_ROW_GROUPS and decode.gemv2.row_groups in tuning.GEMV2_ROW_GROUPS
    assert decode.gemv1.row_groups * decode.gemv1.k_slices <= tuning.GEMV_MAX_WARPS
    assert decode.gemv2.row_groups * slots * decode.gemv2.k_slices <= tuning.GEMV_MAX_WARPS
    assert decode.gemv1.splits == 1 and decode.gemv2.splits in tuning.GEMV2_SPLITS
    for launch, k_size in ((decode.gemv1, problem.hidden_size), (decode.gemv2, problem.intermediate_size)):
        steps, slices = -(-k_size // 128), launch.k_slices * launch.splits
        assert slices == 1 or steps / slices >= heuristics.DECODE_MIN_STEPS



@pytest.mark.parametrize(("top_k", "slots"), [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8), (10, 16)])
def test_gemv2_has_a_power_of_two_of_slots_covering_top_k(top_k, slots):
    """GEMV2's warps per row group and K slice (one per top-k slot, rounded up) and the warps they make."""
    assert tuning.gemv2_slots(top_k) == slots
    assert tuning.GemvLaunch(2, 4).warps(tuning.gemv2_slots(top_k)) == 8 * slots


def test_decode_config_label_names_both_kernels_warps():
    """The benchmarks' name of a decode config (matrix and decode CSVs)."""
    label = tuning.DecodeConfig(tuning.GemvLaunch(4, 2), tuning.GemvLaunch(1, 8)).label
    assert label == "gemv1 4x2 gemv2 1x8"
    label = tuning.DecodeConfig(tuning.GemvLaunch(4, 2, loads_ahead=True), tuning.GemvLaunch(1, 8)).label
    assert label == "gemv1 4x2+ahead gemv2 1x8"
    label = tuning.DecodeConfig(tuning.GemvLaunch(4, 2), tuning.GemvLaunch(1, 2, True, splits=2)).label
    assert label == "gemv1 4x2 gemv2 1x2+ahead/2 programs"


@pytest.mark.parametrize(("name", "tokens", "sms", "splits"), [
    ("gpt-oss-120b", 1, 132, 2), ("minimax-m2", 1, 132, 2), ("gpt-oss-120b", 2, 132, 1), ("deepseek-v3", 1, 132, 1),
    ("qwen3-next-80b-a3b", 1, 132, 1), ("gpt-oss-120b", 1, 66, 1)])
def test_gemv2_splits_only_a_grid_too_small_for_the_gpu(name, tokens, sms, splits, monkeypatch):
    """gpt-oss-120b's GEMV2 at T = 1 has 180 programs (16 rows each) for 132 SMs: below GEMV2_SPLIT_BELOW an SM, so
    each row block's K is split over two programs of half the K slices, loading ahead where the 360 fit at once. Not
    split: twice the tokens, a larger H, a GEMV2 of one K slice (nothing to share: Qwen3-Next's 16 slot warps), or
    half the SMs."""
    from backends.triton_moe.tuning import heuristics

    problem = _problem(name, tokens)
    decode = tuning.decode_kernels(sms, problem)
    below = heuristics.GEMV2_SPLIT_BELOW
    monkeypatch.setattr(heuristics, "GEMV2_SPLIT_BELOW", 0)
    unsplit = tuning.decode_kernels(sms, problem)
    assert decode.gemv2.splits == splits and decode.gemv1 == unsplit.gemv1
    assert decode.gemv2.k_slices * splits == unsplit.gemv2.k_slices
    assert decode.gemv2.row_groups == unsplit.gemv2.row_groups
    programs = problem.tokens * problem.hidden_size // (16 * decode.gemv2.row_groups)
    assert (programs < below * sms and unsplit.gemv2.k_slices > 1) == (splits > 1)


@pytest.mark.parametrize(("name", "ahead"), [("gpt-oss-120b", True), ("glm-4.5", True), ("deepseek-v3", False),
                                             ("llama-4-maverick", False)])
def test_gemv1_loads_ahead_only_where_its_grid_still_fits_one_wave(name, ahead):
    """At DECODE_AHEAD_MAXNREG registers an H100 SM holds 25 warps: three 8-warp GEMV1 programs. gpt-oss-120b (360
    programs) and GLM-4.5 (384) fit on 132 SMs; DeepSeek-V3 and Llama-4-Maverick (512 each) would need a second wave,
    which the H100 measurements show costing more than the loads ahead win. On 66 SMs the K slices change and the
    same rule decides again."""
    from backends.triton_moe.tuning import heuristics

    problem = _problem(name, 1)
    decode = tuning.decode_kernels(132, problem)
    assert decode.gemv1.warps() == 8
    assert heuristics.REGISTERS_PER_SM // (32 * tuning.DECODE_AHEAD_MAXNREG) // decode.gemv1.warps() == 3
    assert decode.gemv1.loads_ahead is ahead
    half = tuning.decode_kernels(66, problem).gemv1
    programs = problem.top_k * problem.intermediate_size // (8 * half.row_groups)
    assert half.loads_ahead == (programs <= 66 * (25 // half.warps()))

def test_decode_warps_follow_the_work():
    """More pairs need fewer K slices to fill the GPU; fewer SMs too."""
    one, two = (tuning.decode_kernels(132, _problem("gpt-oss-120b", t)) for t in (1, 2))
    assert one.gemv1.k_slices > two.gemv1.k_slices
    assert tuning.decode_kernels(66, _problem("gpt-oss-120b", 1)).gemv1.k_slices < one.gemv1.k_slices


def test_a_top_k_beyond_the_warp_limit_keeps_the_tile_kernels():
    """GEMV2 needs a warp per top-k slot: a layer with more slots than GEMV_MAX_WARPS gets no decode config."""
    problem = tuning.Problem("nvfp4", 1, 256, 2 * tuning.GEMV_MAX_WARPS, 1024, 512)
    assert tuning.decode_kernels(132, problem) is None
    assert tuning.select_config("sm90", tuning.Gpu("NVIDIA H100 80GB HBM3", 132), problem).decode is None


@pytest.mark.parametrize("use_tables", [True, False])
def test_select_config_adds_decode_kernels_up_to_their_token_limit(use_tables):
    gpu = tuning.Gpu("NVIDIA H100 80GB HBM3", 132)
    for tokens in (1, tuning.DECODE_KERNEL_TOKENS, tuning.DECODE_KERNEL_TOKENS + 1, 64):
        config = tuning.select_config("sm90", gpu, _problem("gpt-oss-120b", tokens), use_tables=use_tables)
        assert (config.decode is not None) == (tokens <= tuning.DECODE_KERNEL_TOKENS), (tokens, config)
        if config.decode is not None:
            assert config.decode == tuning.decode_kernels(132, _problem("gpt-oss-120b", tokens))


@pytest.mark.parametrize("decode, message", [
    (tuning.DecodeConfig(tuning.GemvLaunch(3, 1), tuning.GemvLaunch(1, 1)), "gemv1=.*row_groups must be one of"),
    (tuning.DecodeConfig(tuning.GemvLaunch(1, 1), tuning.GemvLaunch(8, 1)), "gemv2=.*row_groups must be one of"),
    (tuning.DecodeConfig(tuning.GemvLaunch(1, 3), tuning.GemvLaunch(1, 1)), "k_slices one of"),
    (tuning.DecodeConfig(tuning.GemvLaunch(8, 8), tuning.GemvLaunch(1, 1)), "64 warps per program"),
    (tuning.DecodeConfig(tuning.GemvLaunch(1, 1), tuning.GemvLaunch(4, 4)), "64 warps per program .top_k=4"),
    (tuning.DecodeConfig(tuning.GemvLaunch(4, 2, splits=2), tuning.GemvLaunch(1, 1)), "gemv1.splits must be 1"),
    (tuning.DecodeConfig(tuning.GemvLaunch(4, 2), tuning.GemvLaunch(1, 1, splits=3)), r"gemv2.splits one of \(1, 2, 4\)"),
])
def test_bad_decode_config_is_one_clear_error(decode, message):
    """Checked before anything runs (also before the CPU-without-interpreter error), naming the field and limit."""
    from backends.layouts.triton_moe import to_kernel_layout
    from backends.triton_moe import moe_forward
    from backends.triton_moe.testing import Shape, random_checkpoint

    shape = Shape("tiny", "mxfp4", 8, 4, 64, 64, "silu", False)
    weights = to_kernel_layout(**random_checkpoint(shape, generator=torch.Generator().manual_seed(0)))
    tiles = tuning.select_config("sm90", tuning.Gpu("cpu", 132), _problem("gpt-oss-120b", 1))
    with pytest.raises(ValueError, match=message):
        moe_forward(torch.zeros(1, 64, dtype=torch.bfloat16), weights, router_logits=torch.zeros(1, 8), top_k=4,
                    activation="silu", config=dataclasses.replace(tiles, decode=decode))


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("routing", ["logits", "one_expert"])
@pytest.mark.parametrize("tokens", [1, 2])
@pytest.mark.parametrize("name", MATRIX)
def test_cuda_decode_kernels_match_emulation_and_tiles(name, tokens, routing):
    """The decode kernels (routing in GEMV1, or given int64 ids) against the emulation, the same as a CUDA graph
    replay (bit for bit), and close to the tile kernels on the same layer."""
    shape = SHAPES[name]
    arch, gpu = tuning.device_gpu(torch.device("cuda"))
    config = tuning.select_config(arch, gpu, _problem(name, tokens))
    assert config.decode is not None
    layer, ref = layer_and_reference(shape, tokens, device="cuda", seed=tokens, routing=routing,
                                     gate_up_layout=shape.gate_up_layout, config=config)
    out = layer()
    assert_matches_emulation(out, ref)
    graph = torch.cuda.CUDAGraph()
    layer()  # warm the allocator before capture
    with torch.cuda.graph(graph):
        replayed = layer()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed.view(torch.int16), out.view(torch.int16))
    tiles, _ = layer_and_reference(shape, tokens, device="cuda", seed=tokens, routing=routing,
                                   gate_up_layout=shape.gate_up_layout, config=dataclasses.replace(config, decode=None))
    assert_matches_emulation(tiles(), ref)
