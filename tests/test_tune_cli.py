"""`moe-oracle tune`: every refusal is one clear line (exit 2); on a GPU, the written table is what the next layer
on that GPU uses, and its outputs stay within tolerance of the emulation."""

from __future__ import annotations

import json

import pytest

from oracle.cli import main

from conftest import requires_cuda


def _run(capsys, *argv):
    code = main(["tune", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("argv", "message"), [
    (["--shape", "128,8,4096,1536"], r"--shape needs --format mxfp4 or --format nvfp4"),
    (["--shape", "128,8,4096", "--format", "nvfp4"], r"must be four integers E,k,H,I"),
    (["--shape", "8,2,64,64", "--format", "nvfp4", "--tokens", "1,x"], r"--tokens '1,x' must be comma-separated"),
    (["--shape", "8,2,64,64", "--format", "nvfp4", "--tokens", "0"], r"--tokens '0' must be"),
    (["--shape", "8,2,64,64", "--format", "nvfp4", "--iters", "0"], r"--iters 0 must be at least 1"),
])
def test_bad_arguments_are_one_line_errors(capsys, argv, message):
    code, _, err = _run(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert __import__("re").search(message, err), err


def test_a_bad_config_json_names_the_file(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mistral"}))
    code, _, err = _run(capsys, "--model-config", str(path))
    assert code == 2 and str(path) in err and "not a known MoE family" in err


def test_without_cuda_it_refuses_cleanly(capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err = _run(capsys, "--shape", "8,2,64,64", "--format", "nvfp4")
    assert code == 2 and "none is visible here" in err and len(err.strip().splitlines()) == 1


@requires_cuda
@pytest.mark.gpu
def test_a_tuned_table_is_picked_up_by_the_next_layer(capsys, tmp_path, monkeypatch):
    """tune a layer outside the matrix, then: select_config names the user table, and the layer (config chosen
    by the runtime, not passed) still matches the emulation."""
    import torch
    from test_triton_moe import assert_matches_emulation

    from backends import emulation
    from backends.layouts.triton_moe import to_kernel_layout
    from backends.model_shapes import shape_from_args
    from backends.triton_moe import moe_forward, tuning
    from backends.triton_moe.testing import activation_kwargs, random_checkpoint

    monkeypatch.setenv(tuning.USER_DIR_ENV, str(tmp_path))
    tuning.reload_user_tables()
    code, out, err = _run(capsys, "--shape", "24,3,1536,640", "--format", "nvfp4", "--tokens", "2,48", "--iters", "3")
    assert code == 0, err
    assert "->" in out and "wrote" in out
    written = list(tmp_path.glob("*.yaml"))
    assert len(written) == 1 and tuning.read_table(written[0])["entries"]
    shape = shape_from_args("24,3,1536,640", "nvfp4")
    arch, gpu = tuning.device_gpu(torch.device("cuda"))
    for tokens in (2, 48):
        chosen = tuning.select_config(arch, gpu, tuning.Problem(tokens=tokens, **shape.fields()))
        assert chosen.source.startswith(f"user:{written[0]}#"), chosen.source
        gen = torch.Generator(device="cuda").manual_seed(tokens)
        ckpt = random_checkpoint(shape, device="cuda", generator=gen)
        x = torch.randn(tokens, shape.hidden_size, device="cuda", generator=gen).bfloat16()
        logits = torch.randn(tokens, shape.experts, device="cuda", generator=gen)
        act = activation_kwargs(shape)
        ref = emulation.moe_forward(x, **ckpt, router_logits=logits, top_k=shape.top_k, **act)
        out = moe_forward(x, to_kernel_layout(**ckpt), router_logits=logits, top_k=shape.top_k, **act)
        assert_matches_emulation(out, ref)
    tuning.reload_user_tables()
