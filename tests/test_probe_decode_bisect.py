"""benchmarks/probe_decode_bisect.py without a GPU: every variant's edits still find their text in the decode kernels
(else the probe would time the shipped kernels under a variant's name), a missing one is an error naming it, the
variant with every edit compiles for sm_90 within the probe's 64-register cap, and the CLI's messages."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from conftest import assert_exits_needing_a_gpu

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location("probe_decode_bisect", ROOT / "benchmarks" / "probe_decode_bisect.py")
probe = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = probe
_spec.loader.exec_module(probe)


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


def test_the_variant_with_every_edit_compiles_for_sm90_within_its_register_cap(tmp_path):
    """Both kernels at gpt-oss-120b's T = 1 warps (GEMV1 4 row groups x 2 K slices, GEMV2 4 slots x 4 K slices),
    one step of loads in flight: no local memory at the cap, so a variant's time is not a spill's."""
    from _cubin import cubin_tool
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    edits, maxnreg = probe.VARIANTS["loads only, weights alone"]
    module = probe.load_variant("every edit", edits, str(tmp_path))
    pointers = {"x_ptr": "*bf16", "h_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "gs_ptr": "*fp32",
                "bias_ptr": "*fp32", "logits_ptr": "*fp32", "ids_ptr": "*i32", "route_w_ptr": "*fp32", "y_ptr": "*bf16"}
    common = dict(K=2880, N=2880, TOP_K=4, SCALE_BLOCK=32, NVFP4=False, FOLDED=True, HAS_BIAS=True, USE_ASM=True,
                  INTERPRETED=False, LOADS_AHEAD=False)
    for kernel, constexprs, warps in (
            (module.gemv1_act_kernel, dict(common, ROUTE=True, E=128, E_BLOCK=128, K_BLOCK=4, RENORMALIZE=True,
                                           ROW_GROUPS=4, K_SLICES=2, ACTIVATION=1), 8),
            (module.gemv2_sum_kernel, dict(common, SLOTS=4, ROW_GROUPS=1, K_SLICES=4), 16)):
        names = kernel.arg_names
        signature = {name: "constexpr" if name in constexprs else pointers.get(
            name, "fp32" if name in ("alpha", "beta", "limit") else "i32") for name in names}
        source = ASTSource(fn=kernel, signature=signature,
                           constexprs={(names.index(name),): value for name, value in constexprs.items()})
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": warps, "maxnreg": maxnreg})
        usage = cubin_tool(compiled, "cuobjdump", "-res-usage")
        assert int(re.search(r"REG:(\d+)", usage).group(1)) <= maxnreg
        assert int(re.search(r"LOCAL:(\d+)", usage).group(1)) == 0, usage


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
def test_without_a_gpu_it_says_so(capsys, tmp_path):
    assert_exits_needing_a_gpu(probe.main, ["--out", str(tmp_path)], capsys)


def test_an_unknown_layer_is_named(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        probe.main(["--out", str(tmp_path), "--layers", "gpt-oss-120b,no-such-model"])
    assert exc.value.code == 2
    assert "unknown ['no-such-model']" in capsys.readouterr().err
