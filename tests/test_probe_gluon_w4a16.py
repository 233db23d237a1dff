"""benchmarks/probe_gluon_w4a16.py compiles for sm_90 without a GPU: its warp-specialized kernel (W4A16 and W4A8,
dense and grouped) is built with the installed triton's Gluon, the decoded weights reach the wgmma without a layout
conversion or a shared-memory store, no operand of a wgmma in flight is rewritten (`_cubin.in_flight_operand_writes`,
tests/test_cubin.py), and nothing spills. The probe's speed question needs a Hopper GPU (`--run`)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton.experimental.gluon", reason="this triton has no Gluon")

from conftest import load_benchmark

probe = load_benchmark("probe_gluon_w4a16")

from backends.triton_moe._ws_kernels import WORD_ORDERS, pack_words  # noqa: E402


@pytest.mark.parametrize(("config", "grouped", "fp8"), [(probe.CONFIGS[0], False, False), (probe.CONFIGS[3], True, False),
                                                       (probe.CONFIGS[1], True, True)])
def test_probe_kernel_compiles_for_sm90_with_weights_in_registers(config, grouped, fp8):
    block_m, block_n, block_k, stages, warps = config
    stats = probe.sass_stats(probe.compile_for_sm90(config, grouped, fp8))
    assert stats["warp_specialize"] == 1, stats  # one region: the consumer warpgroups and the loader warp
    # one wgmma per K 16 (bf16) / 32 (FP8) of a tile, in three copies of the step: the loop unrolled by two, the tail
    assert stats["wgmma"] == 3 * block_k // (32 if fp8 else 16), stats
    assert stats["local_stores"] == 1, stats  # the output tile, for the TMA store
    # a wgmma stays in flight across the loop's back edge (W4A8's 8-bit operand kept live by `_kept`) and its operand
    # registers are never written meanwhile
    assert stats["operand_rewrites"] == 0 and stats["in_flight"] > 0, stats
    assert stats["setmaxnreg"] > 0, stats  # registers handed from the loader warp to the consumers
    assert probe.weights_stay_in_registers(stats), stats
    assert stats["shared_bytes"] <= 227 * 1024, stats  # the ring fits an sm_90 block


def test_the_check_refuses_a_kernel_that_converts_or_spills():
    good = {"wgmma": 8, "shuffles": 0, "local_stores": 1, "spills": 0, "warp_specialize": 1, "operand_rewrites": 0}
    assert probe.weights_stay_in_registers(good)
    for key, value in (("shuffles", 64), ("local_stores", 2), ("spills", 72), ("warp_specialize", 0),
                       ("wgmma", 0), ("operand_rewrites", 3)):
        assert not probe.weights_stay_in_registers(good | {key: value}), key


def test_run_needs_an_output_directory(capsys):
    with pytest.raises(SystemExit) as exc:
        probe.main(["--run"])
    assert exc.value.code == 2
    assert "--run needs --out DIR" in capsys.readouterr().err


def test_grouped_blocks_pad_each_expert_to_whole_blocks_or_to_tail_blocks():
    torch = pytest.importorskip("torch")
    counts = torch.tensor([0, 1, 128, 129, 300])
    expert, first, rows = probe.expert_blocks(counts, 128, tails=False)
    assert expert.dtype == first.dtype == rows.dtype == torch.int32
    assert expert.tolist() == [1, 2, 3, 3, 4, 4, 4]  # expert 0 has no rows, 129 rows take two blocks
    assert rows.tolist() == [128] * 7 and first.tolist() == list(range(0, 7 * 128, 128))
    expert, first, rows = probe.expert_blocks(counts, 128)  # padded to 32 rows, the last ones in smaller blocks
    assert expert.tolist() == [1, 2, 3, 3, 4, 4, 4]
    assert rows.tolist() == [32, 128, 128, 32, 128, 128, 64]  # 1 -> 32; 129 -> 128 + 32; 300 -> 2 x 128 + 64
    assert first.tolist() == [0, 32, 160, 288, 320, 448, 576]


def test_the_gemms_are_the_layers_shapes():
    assert probe.moe_gemms("gpt-oss-120b") == [("gpt-oss-120b gemm1", 128, 4, 5760, 2880),
                                               ("gpt-oss-120b gemm2", 128, 4, 2880, 2880)]
    assert all(probe.SHAPES[layer].format == "mxfp4" for layer in probe.LAYERS)  # the probe decodes MXFP4


@pytest.mark.parametrize(("config", "fp8"), [(probe.SMEM_DECODE_CONFIGS[0], False), (probe.SMEM_DECODE_CONFIGS[3], True)])
def test_smem_decode_form_compiles_for_sm90_with_both_operands_in_shared_memory(config, fp8):
    block_n, block_k = config[1:3]
    stats = probe.sass_stats(probe.compile_for_sm90(config, grouped=True, fp8=fp8, form="smem"))
    assert stats["warp_specialize"] == 1, stats  # the MMA warpgroup, the loader warp and the decoder warps
    assert stats["wgmma"] == (block_n // 64) * block_k // (32 if fp8 else 16), stats  # one K loop, not unrolled
    assert stats["local_stores"] == 2, stats  # the decoded tile and the output tile
    assert probe.decode_feeds_shared_memory(stats), stats
    assert stats["shared_bytes"] <= 227 * 1024, stats


def test_the_smem_check_refuses_a_kernel_that_shuffles_or_spills():
    good = {"wgmma": 8, "shuffles": 0, "local_stores": 2, "spills": 0, "warp_specialize": 1}
    assert probe.decode_feeds_shared_memory(good)
    for key, value in (("shuffles", 64), ("local_stores", 3), ("spills", 8), ("warp_specialize", 0), ("wgmma", 0)):
        assert not probe.decode_feeds_shared_memory(good | {key: value}), key


@pytest.mark.parametrize("form", ["smem", "words"])
def test_packed_words_give_the_word_routine_the_codes_of_their_form_order(form):
    torch = pytest.importorskip("torch")
    from backends.layouts.triton_moe import WORD_SLOTS

    packed = torch.randint(0, 256, (6, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    words = pack_words(packed, form, chunk_rows=4).to(torch.int64) & 0xFFFFFFFF  # two chunks
    assert words.shape == (6, 16)
    codes = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(6, 128).to(torch.int64)
    for word in range(16):
        block, t = divmod(word, 4)
        for j in range(8):  # the routine's output j: word byte j % 4, its low half for j < 4 (WORD_SLOTS' bits)
            sign, mag = WORD_SLOTS[(j % 4, j // 4)]
            output = (((words[:, word] >> sign) & 1) << 3) | ((words[:, word] >> mag) & 7)
            assert torch.equal(output, codes[:, 32 * block + WORD_ORDERS[form][t][j]]), (word, j)


def test_word_orders_cover_each_block_once():
    for form, order in WORD_ORDERS.items():
        assert sorted(k for word in order for k in word) == list(range(32)), form
    # the words form: a word holds the K offsets of one thread of a wgmma quad (pairs 2t, 2t + 1, every 8)
    assert WORD_ORDERS["words"][1] == [2, 3, 10, 11, 18, 19, 26, 27]


def test_words_form_compiles_for_sm90_with_the_decode_in_the_operand_registers():
    config = probe.CONFIGS[3]
    stats = probe.sass_stats(probe.compile_for_sm90(config, grouped=True, form="words"))
    assert stats["wgmma"] == 3 * config[2] // 16, stats  # the unrolled pair and the tail step, as the register form
    assert stats["in_flight"] > 0 and stats["operand_rewrites"] == 0, stats
    assert probe.weights_stay_in_registers(stats), stats  # no shuffles: the words' layout is the operand's


def test_the_register_cap_fits_every_warp_in_the_register_file():
    assert probe.maxnreg_of(probe.CONFIGS[0]) == probe.MAXNREG
    assert probe.maxnreg_of((128, 128, 64, 4, 4, 4, 3), "smem") == 168  # 4 + 4 (the loader's warpgroup) + 4 warps
    assert probe.maxnreg_of((128, 128, 64, 4, 8, 4, 3), "smem") == 128
    assert all(probe.maxnreg_of(c, "smem") * 32 * (c[4] + 4 + c[5]) <= 65536 for c in probe.SMEM_DECODE_CONFIGS)


def test_nvfp4_weights_compile_in_the_words_form_and_only_the_word_forms():
    config = probe.FORMS["words"][3]
    stats = probe.sass_stats(probe.compile_for_sm90(config, grouped=True, form="words", nvfp4=True))
    assert stats["operand_rewrites"] == 0 and probe.weights_stay_in_registers(stats), stats
    with pytest.raises(AssertionError, match="words and flat forms only"):
        probe.compile_for_sm90(config, form="register", nvfp4=True)


def test_nvfp4_needs_the_words_form(capsys):
    with pytest.raises(SystemExit) as exc:
        probe.main(["--format", "nvfp4"])
    assert exc.value.code == 2
    assert "--kernel words or --kernel flat" in capsys.readouterr().err


def test_two_ctas_an_sm_cap_the_registers_for_both():
    two = (128, 64, 64, 3, 4, 2)
    assert probe.maxnreg_of(two, "words") == 128  # 2 CTAs x (4 consumer + 4 loader warps) x 32 x 128 = 64 Ki
    assert probe.maxnreg_of(two[:5], "words") == probe.MAXNREG


def test_flat_form_loads_from_its_own_warps_and_keeps_the_wgmma_in_flight():
    config = probe.FORMS["flat"][0]
    stats = probe.sass_stats(probe.compile_for_sm90(config, grouped=True, form="flat"))
    assert stats["warp_specialize"] == 0 and stats["setmaxnreg"] == 0, stats  # no loader partition
    assert stats["in_flight"] > 0 and probe.weights_stay_in_registers(stats, specialized=False), stats
    assert not probe.weights_stay_in_registers(stats), stats  # the check tells the two kinds apart
    assert 2 * stats["shared_bytes"] <= 227 * 1024, stats  # two CTAs an SM


def test_absorbed_tails_join_the_last_whole_block_of_their_expert():
    torch = pytest.importorskip("torch")
    counts = torch.tensor([128 + 5, 128 + 40, 20, 256 + 32])
    expert, first, rows = probe.expert_blocks(counts, 128, mode="absorb")
    # 5 rows (padded to 32) ride with expert 0's block; 40 (padded to 64) do not fit a 32-row tail: a half block;
    # an expert with no whole block keeps its own small block; 32 rows after two blocks join the second
    assert expert.tolist() == [0, 1, 1, 2, 3, 3]
    assert rows.tolist() == [160, 128, 64, 32, 128, 160]
    assert first.tolist() == [0, 160, 288, 352, 384, 512]
    assert probe.expert_blocks(counts, 128, tails=False)[2].tolist() == [128] * 2 + [128] * 2 + [128] + [128] * 3


def test_absorbing_needs_the_tail_rings_to_fit_shared_memory():
    assert probe.absorb_fits((128, 128, 64, 6, 8), "words")
    assert not probe.absorb_fits((256, 128, 64, 4, 8), "words")  # 256-row blocks: no room for the tail's rings
    assert probe.absorb_fits((128, 128, 64, 3, 4), "flat") and not probe.absorb_fits((128, 128, 64, 4, 4), "flat")
    assert probe.grouped_modes("words", False, (128, 128, 64, 6, 8)) == ("whole", "tails", "absorb")
    assert probe.grouped_modes("words", True) == ("whole", "tails")  # W4A8 has no tail wgmma
    assert probe.grouped_modes("register", False) == ("whole", "tails")


def test_a_tail_compiles_as_a_second_wgmma_on_the_same_decoded_weights():
    config = probe.FORMS["words"][1]
    plain = probe.sass_stats(probe.compile_for_sm90(config, grouped=True, form="words"))
    tail = probe.sass_stats(probe.compile_for_sm90(config, grouped=True, form="words", tail=config[0] // 4))
    assert tail["wgmma"] == 2 * plain["wgmma"], (plain, tail)  # each step's wgmmas again, for the 32 tail rows
    assert tail["local_stores"] == 2 and tail["operand_rewrites"] == 0, tail  # the output tile and the tail's
    assert probe.weights_stay_in_registers(tail, output_tiles=2), tail
    assert not probe.weights_stay_in_registers(tail), tail  # one output tile more than a plain kernel's
    with pytest.raises(AssertionError, match="absorbed tails"):
        probe.compile_for_sm90(config, fp8=True, form="words", tail=32)
