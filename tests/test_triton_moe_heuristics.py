"""Launch-config selection on CPU: the heuristics from the rows per expert, the table schema, the H100 table
extending the H200 one, user tables (precedence user > shipped > heuristic) and every error they raise."""

from __future__ import annotations

import copy

import pytest
import yaml

from backends.model_shapes import MATRIX, SHAPES
from backends.triton_moe import tuning
from backends.triton_moe.tuning import Gpu, Problem, heuristics

H100 = Gpu("NVIDIA H100 80GB HBM3", 132)
H200 = Gpu("NVIDIA H200", 132)
TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 16384)


def _problem(name: str, tokens: int) -> Problem:
    return Problem(tokens=tokens, **SHAPES[name].fields())


@pytest.fixture(autouse=True)
def _no_user_tables(tmp_path, monkeypatch):
    """Every test starts from an empty user directory of its own (never the developer's)."""
    monkeypatch.setenv(tuning.USER_DIR_ENV, str(tmp_path / "user-tables"))
    tuning.reload_user_tables()
    yield
    tuning.reload_user_tables()


@pytest.mark.parametrize("name", MATRIX)
@pytest.mark.parametrize("tokens", TOKENS)
def test_heuristic_configs_are_valid_table_entries(name, tokens):
    """Whatever the heuristics pick must pass the table rules (equal BLOCK_M, half_rows >= 32 rows, GEMM1-only
    fields on GEMM1, schema ranges), so that `tune` can write it and the kernels accept it."""
    cfg = tuning.heuristic_config(tuning.facts_by_name("sm90"), 132, _problem(name, tokens))
    entry = {"shape": SHAPES[name].fields(), "tokens": {"min": tokens, "max": tokens},
             "measured": {"tokens": tokens, "us": 1.0, "run": "t"}, "gemm1": tuning.launch_dict(cfg.gemm1),
             "gemm2": tuning.launch_dict(cfg.gemm2)}
    tuning.validate_table({"table": "triton-moe-tuning", "version": 1, "arch": "sm90", "gpu": "X", "why": "t",
                           "entries": [entry]}, "heuristic")


def test_tile_rows_follow_the_rows_per_expert_not_T():
    """gpt-oss-20b (32 experts) gets prefill tiles at a T where gpt-oss-120b (128 experts) still decodes: the
    rows per expert T·k/E decide, which is what the old T-keyed catch-all entries missed."""
    arch = tuning.facts_by_name("sm90")
    small = tuning.heuristic_config(arch, 132, _problem("gpt-oss-20b", 256))
    large = tuning.heuristic_config(arch, 132, _problem("gpt-oss-120b", 256))
    assert small.gemm1.block_m > large.gemm1.block_m == 16
    assert tuning.heuristic_config(arch, 132, _problem("gpt-oss-20b", 4096)).gemm1.block_m == 128
    assert tuning.heuristic_config(arch, 132, _problem("gpt-oss-120b", 64)).gemm1.block_m == 16


def test_decode_splits_k_until_the_sms_are_busy():
    """At T = 1 few experts' tiles underfill the GPU: split-K multiplies the programs up to about
    PROGRAMS_PER_SM per SM; a GPU with fewer SMs needs fewer slices."""
    arch = tuning.facts_by_name("sm90")
    cfg = tuning.heuristic_config(arch, 132, _problem("gpt-oss-120b", 1))
    assert cfg.gemm1.split_k == 4 and cfg.gemm1.split_epilogue == "fused" and cfg.gemm1.block_m == 16
    tiles = 4 * 2880 // cfg.gemm1.block_n  # 4 touched experts x column tiles
    assert tiles * cfg.gemm1.split_k >= heuristics.PROGRAMS_PER_SM * 132 > tiles * cfg.gemm1.split_k // 2
    assert tuning.heuristic_config(arch, 16, _problem("gpt-oss-120b", 1)).gemm1.split_k == 1
    many = tuning.heuristic_config(arch, 132, _problem("gpt-oss-120b", 64))
    assert many.gemm1.split_k == 1 and many.gemm2.split_k == 1


def test_slices_keep_a_minimum_k():
    arch = tuning.facts_by_name("sm90")
    cfg = tuning.heuristic_config(arch, 132, _problem("qwen3-next-80b-a3b", 1))  # I = 512: GEMM2 K is short
    assert 512 / cfg.gemm2.split_k >= heuristics.MIN_K_PER_SLICE / 2
    assert cfg.gemm2.split_k == 1


def test_long_k_gemm1_splits_at_every_decode_size():
    arch = tuning.facts_by_name("sm90")
    for tokens in (4, 64, 256):
        assert tuning.heuristic_config(arch, 132, _problem("deepseek-v3", tokens)).gemm1.split_k == 2
        assert tuning.heuristic_config(arch, 132, _problem("gpt-oss-120b", tokens)).gemm1.split_k == 1


def test_half_rows_while_a_run_may_fill_half_a_block():
    arch = tuning.facts_by_name("sm90")
    assert tuning.heuristic_config(arch, 132, _problem("deepseek-v3", 1024)).gemm2.half_rows
    assert tuning.heuristic_config(arch, 132, _problem("deepseek-v3", 4096)).gemm2.half_rows
    assert not tuning.heuristic_config(arch, 132, _problem("deepseek-v3", 16384)).gemm2.half_rows


def test_128_row_tiles_absorb_short_tails_and_64_row_tiles_do_not():
    """A run longer than one 128-row block ends in a short one about as often as not; 64-row tiles serve runs that
    mostly fit one block."""
    arch = tuning.facts_by_name("sm90")
    # 128 rows an expert: runs end 17-32 rows past a block often too (a wide tail); 512: a saved half block is a
    # small share of a run's four blocks, so no wide tail
    for name, tokens, wide in (("deepseek-v3", 4096, 32), ("gpt-oss-120b", 16384, None)):
        config = tuning.heuristic_config(arch, 132, _problem(name, tokens))
        assert (config.gemm1.block_m, config.gemm1.tail_rows, config.gemm2.tail_rows) == (128, 16, 16)
        assert config.gemm1.wide_tail_rows == config.gemm2.wide_tail_rows == wide
        assert tuning.tail_rows_problem(config.gemm1, 1) is None and tuning.tail_rows_problem(config.gemm2, 2) is None
    narrow = tuning.heuristic_config(arch, 132, _problem("qwen3-next-80b-a3b", 6144))  # 120 rows: few run past 144
    assert (narrow.gemm1.tail_rows, narrow.gemm1.wide_tail_rows, narrow.gemm2.wide_tail_rows) == (16, None, None)
    # 171 rows an expert: 2% of the runs end 1-16 past a block, 22% within 32: one 32-row tail
    past_sixteen = tuning.heuristic_config(arch, 132, _problem("kimi-k2", 8192))
    assert (past_sixteen.gemm1.tail_rows, past_sixteen.gemm1.wide_tail_rows, past_sixteen.gemm2.tail_rows) == \
        (32, None, 32)
    assert tuning.tail_rows_problem(past_sixteen.gemm1, 1) is None
    glm = tuning.heuristic_config(arch, 132, _problem("glm-4.5", 6144))  # 307 rows: as many, but 3 blocks a run
    assert (glm.gemm1.tail_rows, glm.gemm1.wide_tail_rows) == (None, None)
    mid = tuning.heuristic_config(arch, 132, _problem("deepseek-v3", 1024))
    assert mid.gemm1.block_m == 64 and mid.gemm1.tail_rows is None and mid.gemm2.tail_rows is None


def test_sm80_heuristics_use_no_wgmma_only_tiles():
    arch = tuning.facts_by_name("sm80")
    assert not arch.runs_wgmma(4) and tuning.facts_by_name("sm90").runs_wgmma(4)
    assert tuning.facts_for((8, 0)).name == "sm80" and tuning.facts_for((9, 0)).name == "sm90"
    assert tuning.facts_for(None).name == "sm90"  # the interpreter follows SM90's wgmma rule
    with pytest.raises(ValueError, match="unknown architecture 'sm70'"):
        tuning.facts_by_name("sm70")


def test_the_h100_table_lists_only_its_differences_from_the_h200_one():
    h100, h200 = tuning.shipped_table("sm90-h100.yaml"), tuning.shipped_table("sm90-h200.yaml")
    assert h100["extends"] == "sm90-h200.yaml" and "extends" not in h200
    assert 0 < len(h100["entries"]) < len(h200["entries"])
    for entry in h100["entries"]:  # every entry it lists changes a config the H200 table gives somewhere in its range
        low, high = entry["tokens"]["min"], entry["tokens"].get("max", 1 << 20)
        points = {low, high, entry["measured"]["tokens"]} | {
            other["tokens"]["min"] for other in h200["entries"]
            if other["shape"] == entry["shape"] and low <= other["tokens"]["min"] <= high}
        own = (entry["gemm1"], entry["gemm2"], entry.get("prefill_kernel", "tiles"))
        parents = [tuning.select_config("sm90", H200, Problem(tokens=t, **entry["shape"])) for t in sorted(points)]
        assert any((tuning.launch_dict(p.gemm1), tuning.launch_dict(p.gemm2), p.prefill_kernel) != own
                   for p in parents), entry
    # a T the H100 table does not list comes from the H200 table
    assert tuning.select_config("sm90", H100, _problem("gpt-oss-120b", 1)).source.startswith("sm90-h200.yaml#")
    assert tuning.select_config("sm90", H100, _problem("gpt-oss-120b", 4)).source.startswith("sm90-h100.yaml#")


def test_tables_name_gpus_as_words():
    assert tuning.select_config("sm90", Gpu("NVIDIA GH200 480GB", 132), _problem("gpt-oss-120b", 1)).source \
        .startswith("heuristic")  # GH200 is not an H200
    assert tuning.select_config("sm90", H200, _problem("gpt-oss-120b", 1)).source.startswith("sm90-h200.yaml#")
    assert tuning.select_config("sm90", H200, _problem("glm-4.5", 1)).source.startswith("heuristic")


def _user_table(gpu="H100", tokens=(1, 1), **launch) -> dict:
    base = {"block_m": 16, "block_n": 32, "block_k": 64, "group_m": 1, "swap_ab": True, "num_warps": 1,
            "num_stages": 2, **launch}
    return {"table": "triton-moe-tuning", "version": 1, "arch": "sm90", "gpu": gpu, "why": "tuned here",
            "entries": [{"shape": SHAPES["gpt-oss-120b"].fields(), "tokens": {"min": tokens[0], "max": tokens[1]},
                         "measured": {"tokens": tokens[0], "us": 10.0, "run": "mine"}, "gemm1": base,
                         "gemm2": dict(base)}]}


def _write_user(table, name="h100.yaml"):
    directory = tuning.user_table_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(tuning.MODELINE + (yaml.safe_dump(table) if isinstance(table, dict) else table))
    tuning.reload_user_tables()
    return path


def test_a_user_table_wins_over_the_shipped_one_which_wins_over_the_heuristic():
    problem = _problem("gpt-oss-120b", 1)
    assert tuning.select_config("sm90", H100, problem).source.startswith("sm90-h200.yaml#")
    path = _write_user(_user_table())
    chosen = tuning.select_config("sm90", H100, problem)
    assert chosen.source == f"user:{path}#0" and chosen.gemm1.block_n == 32
    assert tuning.select_config("sm90", H100, _problem("gpt-oss-120b", 2)).source.startswith("sm90-h200.yaml#")
    assert tuning.select_config("sm90", H100, _problem("glm-4.5", 2)).source.startswith("heuristic")
    assert tuning.select_config("sm90", H200, problem).source.startswith("sm90-h200.yaml#")  # not its GPU
    assert tuning.select_config("sm90", H100, problem, use_tables=False).source.startswith("heuristic")


def test_the_user_directory_has_a_default_and_an_override(monkeypatch, tmp_path):
    monkeypatch.delenv(tuning.USER_DIR_ENV)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert tuning.user_table_dir() == tmp_path / ".cache" / "moe-oracle" / "tuning"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tuning.user_table_dir() == tmp_path / "xdg" / "moe-oracle" / "tuning"
    monkeypatch.setenv(tuning.USER_DIR_ENV, str(tmp_path / "mine"))
    assert tuning.user_table_dir() == tmp_path / "mine"


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda t: t.pop("table"), r"not a moe-oracle tuning table"),
    (lambda t: t.update(version=2), r"version 2 is not 1"),
    (lambda t: t["entries"][0]["gemm1"].update(block_k=48), r"entries/0/gemm1/block_k"),
    (lambda t: t["entries"][0]["gemm2"].update(block_m=32), r"entries/0: gemm1.block_m and gemm2.block_m"),
    (lambda t: t["entries"][0]["gemm2"].update(stack_gate_up=True), r"entries/0: gemm2.stack_gate_up is a GEMM1"),
    (lambda t: t["entries"][0]["tokens"].update(min=5, max=2), r"entries/0: tokens.max 2 is below tokens.min 5"),
    (lambda t: t["entries"][0]["measured"].update(tokens=9), r"entries/0: measured.tokens 9 lies outside"),
    (lambda t: t["entries"].append(copy.deepcopy(t["entries"][0])), r"entries/1: its T range \[1, 1\] overlaps"),
    (lambda t: t["entries"][0].update(why_not="x"), r"entries/0: Additional properties"),
    (lambda t: t.update(extends="sm90-h200.yaml"), r"`extends` is for shipped tables only"),
])
def test_a_broken_user_table_is_an_error_naming_file_and_entry(mutate, message):
    table = _user_table()
    mutate(table)
    path = _write_user(table)
    with pytest.raises(tuning.TuningTableError, match=message) as err:
        tuning.select_config("sm90", H100, _problem("gpt-oss-120b", 1))
    assert str(path) in str(err.value)


def test_a_user_table_that_is_not_yaml_or_of_another_arch_is_an_error():
    path = _write_user("entries: [\n", "broken.yaml")
    with pytest.raises(tuning.TuningTableError, match=rf"{path}: cannot be read as YAML"):
        tuning.select_config("sm90", H100, _problem("gpt-oss-120b", 1))
    path.unlink()
    path = _write_user({**_user_table(), "arch": "sm80"}, "foreign.yaml")
    with pytest.raises(tuning.TuningTableError, match=rf"{path}: written for arch 'sm80' but this GPU"):
        tuning.select_config("sm90", H100, _problem("gpt-oss-120b", 1))


def test_a_hostile_user_table_is_refused_at_once_naming_it():
    """The user table directory is read by every layer built on the GPU: a table is read as rule files are, so an
    alias bomb, a duplicate key or a file past the size limit is one error naming the file."""
    from oracle.limits import MAX_FILE_BYTES

    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    cases = [(bomb, "bomb.yaml", "expanded"), ("arch: sm90\narch: sm90\n", "twice.yaml", "duplicate key 'arch'"),
             ("#" * (MAX_FILE_BYTES + 1), "huge.yaml", "larger than")]
    for text, name, words in cases:
        path = _write_user(text, name)
        with pytest.raises(tuning.TuningTableError, match=rf"{path}: cannot be read as YAML: .*{words}"):
            tuning.select_config("sm90", H100, _problem("gpt-oss-120b", 1))
        path.unlink()


def test_problem_measures_the_work_per_expert():
    p = _problem("gpt-oss-120b", 1)
    assert p.rows_per_expert == 4 / 128 and abs(p.experts_touched - 4) < 0.1
    assert abs(p.rows_per_touched_expert - 1) < 0.05
    assert _problem("gpt-oss-20b", 4096).rows_per_expert == 512


def test_fp8_config_gives_sub_warpgroup_tiles_a_warpgroup_and_keeps_the_rest():
    from backends.triton_moe.tuning import LaunchConfig, MoEConfig, facts_by_name, fp8_config

    small = LaunchConfig(16, 64, 128, 8, True, 2, 4, split_k=4)
    big = LaunchConfig(128, 64, 64, 8, True, 4, 3)
    sm90 = facts_by_name("sm90")
    got = fp8_config(sm90, MoEConfig(small, big, "t.yaml#0"))
    assert (got.gemm1.num_warps, got.gemm1.split_k, got.gemm2) == (sm90.wgmma_min_warps, 4, big)
    assert got.source == f"t.yaml#0+fp8:{sm90.wgmma_min_warps} warps"
    unchanged = MoEConfig(big, big, "t.yaml#1")
    assert fp8_config(sm90, unchanged) is unchanged
    no_wgmma = MoEConfig(small, big, "t.yaml#0")
    assert fp8_config(facts_by_name("sm80"), no_wgmma) is no_wgmma


def test_fp8_dots_with_tensor_core_sums_take_the_warp_specialized_prefill_from_enough_rows_an_expert():
    from backends.triton_moe.tuning import FP8_DOTS_WS_MIN_ROWS, LaunchConfig, MoEConfig, fp8_dots_prefill_config

    tiles = MoEConfig(LaunchConfig(128, 64, 64, 8, True, 4, 3), LaunchConfig(128, 64, 64, 8, True, 4, 3), "t.yaml#3")
    many = _problem("gpt-oss-120b", 4096)  # 128 rows an expert
    few = _problem("gpt-oss-120b", 2048)
    assert many.rows_per_expert >= FP8_DOTS_WS_MIN_ROWS > few.rows_per_expert
    got = fp8_dots_prefill_config(tiles, many, "fp8", "tensor-core")
    assert got.prefill_kernel == "warp-specialized" and got.gemm1 == tiles.gemm1
    assert got.source == "t.yaml#3+fp8 dots: warp-specialized"
    for call in ((few, "fp8", "tensor-core"), (many, "fp8", "wgmma"), (many, "bf16", None), (many, None, None)):
        assert fp8_dots_prefill_config(tiles, *call) is tiles, call


def test_fp8_config_keeps_the_decode_kernels_warps():
    """W4A8 calls on MXFP4 weights run the decode kernels with them (forward.moe_forward)."""
    from backends.triton_moe.tuning import DecodeConfig, GemvLaunch, LaunchConfig, MoEConfig, facts_by_name, fp8_config

    small = LaunchConfig(16, 64, 128, 8, True, 2, 4, split_k=4)
    decode = DecodeConfig(GemvLaunch(4, 2, True), GemvLaunch(1, 4))
    got = fp8_config(facts_by_name("sm90"), MoEConfig(small, small, "t.yaml#0", decode))
    assert got.gemm1.num_warps == facts_by_name("sm90").wgmma_min_warps and got.decode == decode


def test_w4a16_and_w4a8_take_the_decode_kernels_unless_fp8_dots_are_forced(monkeypatch):
    from backends.triton_moe.forward import W4A8_MMA_ENV, resolve_w4a8_mma, takes_decode_kernels
    from backends.triton_moe.tuning import DecodeConfig, GemvLaunch, LaunchConfig, MoEConfig

    monkeypatch.delenv(W4A8_MMA_ENV, raising=False)
    tiles = LaunchConfig(16, 64, 128, 8, True, 4, 4)
    with_decode = MoEConfig(tiles, tiles, "t", DecodeConfig(GemvLaunch(4, 2), GemvLaunch(1, 4)))
    taken = {act_quant: takes_decode_kernels(with_decode, resolve_w4a8_mma(act_quant))
             for act_quant in (None, "mxfp8", "fp8_per_tensor_static")}
    assert taken == {None: True, "mxfp8": True, "fp8_per_tensor_static": True}
    assert not takes_decode_kernels(with_decode, resolve_w4a8_mma("mxfp8", "fp8"))  # FP8 dots forced
    monkeypatch.setenv(W4A8_MMA_ENV, "fp8")
    assert resolve_w4a8_mma("mxfp8") == "fp8" and resolve_w4a8_mma(None) is None
    assert not takes_decode_kernels(MoEConfig(tiles, tiles, "t"), None)
