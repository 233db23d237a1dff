"""benchmarks/probe_decode_bisect.py without a GPU: every variant's edits still find their text in the decode kernels
(else the probe would time the shipped kernels under a variant's name), a missing one is an error naming it, the
variant with every edit compiles for sm_90 within the probe's 64-register cap, and the CLI's messages."""

from __future__ import annotations

import pytest

from conftest import assert_exits_needing_a_gpu, load_benchmark

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")

probe = load_benchmark("probe_decode_bisect")


@pytest.mark.parametrize("name", [name for name, spec in probe.VARIANTS.items() if spec])
def test_each_variant_edits_the_kernels_and_imports(name, tmp_path):
    edits, _ = probe.VARIANTS[name]
    source = probe.variant_source(edits)
    for anchor, replacement in edits:
        assert replacement in source and source.count(anchor) == replacement.count(anchor)  # replaced, once
    module = probe.load_variant(name, edits, str(tmp_path))
    assert {"gemv1_act_kernel", "gemv2_sum_kernel"} <= set(vars(module))


def test_a_missing_anchor_is_an_error_naming_it(tmp_path, monkeypatch):
    changed = tmp_path / "_gemv_kernels.py"
    changed.write_text(probe.KERNELS.read_text().replace("x_lo8 = tl.load(first + 4", "x_lo8 = tl.load(first + 8"))
    monkeypatch.setattr(probe, "KERNELS", changed)
    with pytest.raises(ValueError, match=r"no longer has exactly one 'x_lo = tl.load\(first.*update"):
        probe.variant_source(probe.VARIANTS["loads only, weights alone"][0])


@pytest.mark.parametrize("gemv", [1, 2])
def test_the_variant_with_every_edit_compiles_for_sm90_within_its_register_cap(gemv, tmp_path, monkeypatch):
    """Both kernels as the probe launches them at gpt-oss-120b's T = 1 (its decode config, the variants' 64-register
    cap where a kernel does not load ahead): no local memory at the cap, so a variant's time is not a spill's."""
    from count_decode_sass import compile_gemv, resources

    from backends.triton_moe import forward

    edits, maxnreg = probe.VARIANTS["loads only, weights alone"]
    monkeypatch.setattr(forward, "DECODE_MAXNREG", maxnreg)
    module = probe.load_variant("every edit", edits, str(tmp_path))
    compiled, _, options = compile_gemv(gemv, "gpt-oss-120b", 1, module=module)
    used = resources(compiled)
    assert used["local_bytes"] == 0 and used["registers"] <= options["maxnreg"], used


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
def test_without_a_gpu_it_says_so(capsys, tmp_path):
    assert_exits_needing_a_gpu(probe.main, ["--out", str(tmp_path)], capsys)


def test_an_unknown_layer_is_named(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        probe.main(["--out", str(tmp_path), "--layers", "gpt-oss-120b,no-such-model"])
    assert exc.value.code == 2
    assert "unknown ['no-such-model']" in capsys.readouterr().err
