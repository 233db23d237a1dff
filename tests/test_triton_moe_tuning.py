"""Launch-config tables of backends.triton_moe: the optional register cap (maxnreg) and the table mapping."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed; the Triton MoE kernels cannot run")

from backends.layouts.triton_moe import to_kernel_layout
from backends.triton_moe import moe_forward, tuning
from backends.triton_moe.testing import SHAPES, activation_kwargs, random_checkpoint

from conftest import requires_cuda


def _default_table() -> dict:
    """A one-entry user table in the shipped format (the entries' launch fields are what these tests vary)."""
    launch = {"block_m": 16, "block_n": 64, "block_k": 64, "group_m": 8, "swap_ab": True, "num_warps": 2,
              "num_stages": 4}
    entry = {"shape": SHAPES["gpt-oss-120b"].fields(), "tokens": {"min": 1, "max": 8},
             "measured": {"tokens": 4, "us": 100.0, "run": "test"}, "gemm1": dict(launch), "gemm2": dict(launch)}
    return {"table": "triton-moe-tuning", "version": 1, "arch": "sm90", "gpu": "H100", "why": "test",
            "entries": [entry, copy.deepcopy({**entry, "tokens": {"min": 9}, "measured": {"tokens": 16, "us": 1.0,
                                                                                          "run": "test"}})]}


@pytest.mark.parametrize("name", sorted(p.name for p in tuning.TABLE_DIR.glob("*.yaml")))
def test_every_shipped_table_parses_and_validates(name):
    """The tables are read only when a CUDA layer selects a config, so a YAML or schema slip would reach a GPU
    first: parse and validate each one here."""
    table = tuning.shipped_table(name)
    assert table["entries"] or table.get("extends"), name


def test_a_register_cap_is_an_optional_launch_field():
    table = _default_table()
    table["entries"][0]["gemm1"]["maxnreg"] = 128
    tuning.validate_table(table, "x.yaml")
    capped = tuning.LaunchConfig(**table["entries"][0]["gemm1"])
    assert capped.maxnreg == 128
    assert tuning.launch_dict(capped)["maxnreg"] == 128
    assert tuning.LaunchConfig(**tuning.launch_dict(capped)) == capped
    uncapped = tuning.LaunchConfig(**table["entries"][0]["gemm2"])
    assert uncapped.maxnreg is None and "maxnreg" not in tuning.launch_dict(uncapped)  # a table has no nulls
    tuning.validate_table({**table, "entries": [{**table["entries"][0], "gemm1": tuning.launch_dict(capped),
                                                 "gemm2": tuning.launch_dict(uncapped)}]}, "written")


@pytest.mark.parametrize("bad", [16, 300, "many", None])
def test_a_bad_register_cap_names_the_place(bad):
    table = _default_table()
    table["entries"][0]["gemm2"]["maxnreg"] = bad
    with pytest.raises(ValueError, match=r"x.yaml: entries/0/gemm2/maxnreg"):
        tuning.validate_table(table, "x.yaml")


@requires_cuda
def test_a_register_cap_changes_no_bits_on_cuda():
    """ptxas may spill under the cap, but the arithmetic is the same: the layer's bits must not move."""
    shape = SHAPES["gpt-oss-120b"]
    gen = torch.Generator(device="cuda").manual_seed(3)
    weights = to_kernel_layout(**random_checkpoint(shape, device="cuda", generator=gen))
    for tokens in (4, 256):
        x = torch.randn(tokens, shape.hidden_size, device="cuda", generator=gen).bfloat16()
        logits = torch.randn(tokens, shape.experts, device="cuda", generator=gen)
        arch, gpu = tuning.device_gpu(torch.device("cuda"))
        config = tuning.select_config(arch, gpu, tuning.Problem(tokens=tokens, **shape.fields()))
        capped = tuning.MoEConfig(dataclasses.replace(config.gemm1, maxnreg=96),
                                  dataclasses.replace(config.gemm2, maxnreg=96), "capped")
        run = {"router_logits": logits, "top_k": shape.top_k, **activation_kwargs(shape)}
        assert torch.equal(moe_forward(x, weights, **run, config=capped), moe_forward(x, weights, **run, config=config))


def test_the_split_epilogue_is_an_optional_launch_field():
    table = _default_table()
    table["entries"][0]["gemm1"]["split_epilogue"] = "fused"
    tuning.validate_table(table, "x.yaml")
    fused = tuning.LaunchConfig(**table["entries"][0]["gemm1"])
    assert fused.split_epilogue == "fused" and tuning.launch_dict(fused)["split_epilogue"] == "fused"
    assert "split_epilogue" not in tuning.launch_dict(tuning.LaunchConfig(**table["entries"][0]["gemm2"]))


@pytest.mark.parametrize("bad", ["Fused", "auto", True, None])
def test_a_bad_split_epilogue_names_the_place(bad):
    table = _default_table()
    table["entries"][0]["gemm1"]["split_epilogue"] = bad
    with pytest.raises(ValueError, match=r"x.yaml: entries/0/gemm1/split_epilogue"):
        tuning.validate_table(table, "x.yaml")


def test_stacked_gate_up_is_an_optional_gemm1_field():
    table = _default_table()
    table["entries"][0]["gemm1"]["stack_gate_up"] = True
    tuning.validate_table(table, "x.yaml")
    stacked = tuning.LaunchConfig(**table["entries"][0]["gemm1"])
    assert stacked.stack_gate_up is True and tuning.launch_dict(stacked)["stack_gate_up"] is True
    assert "stack_gate_up" not in tuning.launch_dict(tuning.LaunchConfig(**table["entries"][0]["gemm2"]))


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_a_bad_stacked_gate_up_names_the_place(bad):
    table = _default_table()
    table["entries"][0]["gemm1"]["stack_gate_up"] = bad
    with pytest.raises(ValueError, match=r"x.yaml: entries/0/gemm1/stack_gate_up"):
        tuning.validate_table(table, "x.yaml")


@pytest.mark.parametrize(("field", "value"), [("stack_gate_up", True), ("split_epilogue", "fused")])
def test_a_gemm1_field_on_gemm2_is_refused_not_ignored(field, value):
    table = _default_table()
    table["entries"][0]["gemm2"][field] = value
    with pytest.raises(ValueError, match=rf"x.yaml: entries/0: gemm2.{field} is a GEMM1 setting.*move it to gemm1"):
        tuning.validate_table(table, "x.yaml")


def test_half_rows_needs_blocks_of_32_rows():
    table = _default_table()
    entry = table["entries"][-1]
    entry["gemm1"]["half_rows"] = entry["gemm2"]["half_rows"] = True
    entry["gemm1"]["block_m"] = entry["gemm2"]["block_m"] = 16
    with pytest.raises(ValueError, match=r"entries/\d+: gemm1.half_rows needs block_m >= 32"):
        tuning.validate_table(table, "x.yaml")
    entry["gemm1"]["block_m"] = entry["gemm2"]["block_m"] = 32
    tuning.validate_table(table, "x.yaml")
    assert tuning.LaunchConfig(**entry["gemm2"]).half_rows is True


@requires_cuda
@pytest.mark.parametrize("name", ["gpt-oss-120b", "deepseek-v3"])
def test_half_rows_change_no_bits_on_cuda(name):
    """A block that multiplies only its first half computes the same sums for its real rows."""
    shape = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(7)
    weights = to_kernel_layout(**random_checkpoint(shape, device="cuda", generator=gen))
    for tokens, gemm1, gemm2 in ((1024, tuning.LaunchConfig(64, 64, 64, 8, True, 4, 4, stack_gate_up=True),
                                  tuning.LaunchConfig(64, 128, 64, 8, True, 4, 4)),
                                 (2048, tuning.LaunchConfig(128, 64, 64, 8, True, 4, 3, stack_gate_up=True),
                                  tuning.LaunchConfig(128, 128, 64, 8, True, 4, 3))):
        x = torch.randn(tokens, shape.hidden_size, device="cuda", generator=gen).bfloat16()
        run = {"router_logits": torch.randn(tokens, shape.experts, device="cuda", generator=gen), "top_k": shape.top_k,
               **activation_kwargs(shape)}
        full = tuning.MoEConfig(gemm1, gemm2, "full")
        half = tuning.MoEConfig(dataclasses.replace(gemm1, half_rows=True), dataclasses.replace(gemm2, half_rows=True),
                                "half")
        assert torch.equal(moe_forward(x, weights, **run, config=half), moe_forward(x, weights, **run, config=full))


@pytest.mark.parametrize(("gemm", "edit", "message"), [
    ("gemm2", {"tail_rows": 48}, r"tail_rows=48 must be a power of two from 16 to block_m / 2 = 64"),
    ("gemm2", {"tail_rows": 128}, r"tail_rows=128 must be a power of two from 16 to block_m / 2 = 64"),
    ("gemm2", {"tail_rows": 32, "split_k": 2}, r"tail_rows needs split_k 1 \(got 2\)"),
    ("gemm1", {"tail_rows": 32, "stack_gate_up": False}, r"gemm1.tail_rows needs stack_gate_up"),
    ("gemm1", {"wide_tail_rows": 32}, r"wide_tail_rows=32 must be more than tail_rows=32"),
    ("gemm2", {"tail_rows": 16, "wide_tail_rows": 128},
     r"wide_tail_rows=128 must be a power of two from 16 to block_m / 2 = 64"),
    ("gemm2", {"tail_rows": None, "wide_tail_rows": 64}, r"wide_tail_rows=64 needs tail_rows"),
])
def test_tail_rows_outside_what_the_kernels_run_is_refused(gemm, edit, message):
    table = _default_table()
    entry = table["entries"][-1]
    for g in ("gemm1", "gemm2"):
        entry[g].update(block_m=128, split_k=1, tail_rows=32)
    entry["gemm1"]["stack_gate_up"] = True
    tuning.validate_table(table, "x.yaml")
    entry[gemm].update(edit)
    entry[gemm] = {key: value for key, value in entry[gemm].items() if value is not None}  # None: the key left out
    with pytest.raises(ValueError, match=rf"x.yaml: entries/\d+: {gemm}: {message}"):
        tuning.validate_table(table, "x.yaml")


def test_moe_forward_refuses_a_tail_it_cannot_run():
    from backends.triton_moe.testing import Shape

    shape = Shape("t", "mxfp4", 4, 2, 64, 64, "silu", False)
    weights = to_kernel_layout(**random_checkpoint(shape))
    tile = tuning.LaunchConfig(32, 32, 64, 1, True, 4, 2, tail_rows=16)
    with pytest.raises(ValueError, match=r"config: gemm1: gemm1.tail_rows needs stack_gate_up"):
        moe_forward(torch.zeros(3, 64, dtype=torch.bfloat16), weights, router_logits=torch.zeros(3, 4), top_k=2,
                    config=tuning.MoEConfig(tile, tile, "test"))


@requires_cuda
@pytest.mark.parametrize("name", ["gpt-oss-120b", "deepseek-v3"])
def test_tail_rows_change_no_bits_on_cuda(name):
    """A run's short last block multiplied by the program of the block before it gets the same sums (a second dot on
    the same weight tile, the same K order), with and without half_rows, on both tensor-core paths of W4A8 too."""
    shape = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(11)
    weights = to_kernel_layout(**random_checkpoint(shape, device="cuda", generator=gen))
    gemm1 = tuning.LaunchConfig(128, 64, 64, 8, True, 4, 3, stack_gate_up=True, half_rows=True)
    gemm2 = tuning.LaunchConfig(128, 128, 64, 8, True, 4, 3, half_rows=True)
    tokens = 128 * shape.experts // shape.top_k  # about 128 pairs an expert: half the runs end in a short block
    x = torch.randn(tokens, shape.hidden_size, device="cuda", generator=gen).bfloat16()
    logits = torch.randn(tokens, shape.experts, device="cuda", generator=gen)
    counts = torch.bincount(torch.topk(logits, shape.top_k, dim=-1).indices.flatten(), minlength=shape.experts)
    rest = counts % 128
    assert ((rest > 0) & (rest <= 32) & (counts > 128)).sum() >= 8  # the case has tails to absorb
    assert ((rest > 16) & (rest <= 32) & (counts > 128)).sum() >= 4  # ... some of them wide

    def tails(tail, wide=None):
        return tuning.MoEConfig(dataclasses.replace(gemm1, tail_rows=tail, wide_tail_rows=wide),
                                dataclasses.replace(gemm2, tail_rows=tail, wide_tail_rows=wide), "tail")

    run = {"router_logits": logits, "top_k": shape.top_k, **activation_kwargs(shape)}
    plain = tuning.MoEConfig(gemm1, gemm2, "blocks")
    blocks = moe_forward(x, weights, **run, config=plain)
    for tail, wide in ((16, None), (32, None), (16, 32)):
        assert torch.equal(moe_forward(x, weights, **run, config=tails(tail, wide)), blocks), (tail, wide)
    for act_quant in ("mxfp8",):
        for mma in ("bf16", "fp8"):
            quant = {"act_quant": act_quant, "w4a8_mma": mma}
            blocks = moe_forward(x, weights, **run, **quant, config=plain)
            for tail, wide in ((32, None), (16, 32)):
                assert torch.equal(moe_forward(x, weights, **run, **quant, config=tails(tail, wide)), blocks), \
                    (mma, tail, wide)


@requires_cuda
@pytest.mark.parametrize("name", ["gpt-oss-120b", "deepseek-v3"])
def test_stacking_gate_and_up_changes_no_bits_on_cuda(name):
    """One dot over the stacked rows sums every output in the order of the two dots it replaces."""
    shape = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(5)
    weights = to_kernel_layout(**random_checkpoint(shape, device="cuda", generator=gen))
    tiles = [tuning.LaunchConfig(128, 64, 64, 8, True, 4, 3), tuning.LaunchConfig(16, 64, 128, 1, True, 2, 3),
             tuning.LaunchConfig(64, 64, 64, 8, False, 4, 3)]
    for tokens, gemm1 in ((2048, tiles[0]), (16, tiles[1]), (1024, tiles[2])):
        x = torch.randn(tokens, shape.hidden_size, device="cuda", generator=gen).bfloat16()
        run = {"router_logits": torch.randn(tokens, shape.experts, device="cuda", generator=gen), "top_k": shape.top_k,
               **activation_kwargs(shape)}
        gemm2 = dataclasses.replace(gemm1, block_n=128) if gemm1.swap_ab else gemm1
        two_dots = tuning.MoEConfig(gemm1, gemm2, "two dots")
        stacked = tuning.MoEConfig(dataclasses.replace(gemm1, stack_gate_up=True), gemm2, "stacked")
        assert torch.equal(moe_forward(x, weights, **run, config=stacked), moe_forward(x, weights, **run,
                                                                                      config=two_dots)), gemm1
