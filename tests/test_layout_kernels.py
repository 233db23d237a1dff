"""The Triton word-gather fast path of the nibble/bit layouts (Marlin, SM90 MXFP4 x BF16, triton_moe) writes
the same bytes as their pure-torch definitions, with both ways of reading the checkpoint (byte loads and
int32 word loads, MOE_ORACLE_LAYOUT_KERNEL_LOADS).

On CPU the kernel runs under Triton's interpreter: TRITON_INTERPRET=1 is fixed when triton is first imported,
so the cases run in subprocesses (this file as a script, one per loads variant, MOE_ORACLE_LAYOUT_KERNELS
switched per call between 'torch' and 'triton') that print one JSON line per case. On a GPU the same cases run compiled.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from backends.layouts import _nibble_kernels as kernels

from conftest import interpreter_worker_rows, requires_cuda

ROOT = Path(__file__).resolve().parents[1]

# name -> (module:converter, format, logical (H, I), padded (H, I)): odd, padded and unpadded sizes
CASES = {
    "marlin-mxfp4-padded": ("marlin:mxfp4", "mxfp4", (128, 64), (192, 128)),
    "marlin-mxfp4-unpadded": ("marlin:mxfp4", "mxfp4", (128, 64), (128, 64)),
    "marlin-nvfp4-odd": ("marlin:nvfp4", "nvfp4", (80, 48), (192, 64)),
    "marlin-nvfp4-unpadded": ("marlin:nvfp4", "nvfp4", (128, 64), (128, 64)),
    "sm90-padded": ("cutlass:mxfp4_bf16_sm90", "mxfp4", (96, 32), (128, 128)),
    "sm90-unpadded": ("cutlass:mxfp4_bf16_sm90", "mxfp4", (128, 128), (128, 128)),
    "sm90-wide": ("cutlass:mxfp4_bf16_sm90", "mxfp4", (320, 96), (384, 128)),
    "triton-moe-mxfp4-padded": ("triton_moe:converter", "mxfp4", (96, 32), (192, 64)),
    "triton-moe-nvfp4-odd": ("triton_moe:converter", "nvfp4", (48, 80), (64, 128)),
    "triton-moe-mxfp4-unpadded": ("triton_moe:converter", "mxfp4", (64, 64), (64, 64)),
}
EXPERTS = (0, 1, 3)
GATE_UP = ("interleaved", "contiguous")
#: the kernel's two ways of reading the checkpoint (MOE_ORACLE_LAYOUT_KERNEL_LOADS): byte loads, int32 word loads
LOADS = ("bytes", "words")


def _converter(path: str):
    import importlib

    module, attr = path.split(":")
    return getattr(importlib.import_module(f"backends.layouts.{module}"), attr)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def _differences(a, b) -> list:
    """Names of the tensors of two KernelWeights that differ in name, shape, dtype or any byte."""
    if sorted(a.tensors) != sorted(b.tensors):
        return [f"tensor names {sorted(a.tensors)} != {sorted(b.tensors)}"]
    return [name for name in a.tensors
            if (a[name].shape, a[name].dtype) != (b[name].shape, b[name].dtype)
            or not torch.equal(_bytes(a[name]), _bytes(b[name]))]


def _convert(path, w, padded, mode: str, loads: str = "bytes"):
    os.environ[kernels.ENV], os.environ[kernels.LOADS_ENV] = mode, loads
    try:
        return _converter(path).convert(w, hidden_size=padded[0], intermediate_size=padded[1])
    finally:
        del os.environ[kernels.ENV], os.environ[kernels.LOADS_ENV]


def _check_case(spec, device: str, kernel_mode: str, loads: str) -> dict:
    from layout_cases import random_layer

    path, fmt, logical, padded = spec
    mismatches = []
    for experts in EXPERTS:
        for gate_up in GATE_UP:
            w = random_layer(fmt, experts=experts, hidden=logical[0], inter=logical[1], gate_up=gate_up,
                             seed=experts, finite_scales=True, bf16_bias=True)
            reference = _convert(path, w, padded, "torch")
            fast = _convert(path, random_layer(fmt, experts=experts, hidden=logical[0], inter=logical[1],
                                               gate_up=gate_up, seed=experts, finite_scales=True, bf16_bias=True,
                                               device=device), padded, kernel_mode, loads)
            bad = _differences(reference, fast)
            if bad:
                mismatches.append([experts, gate_up, bad])
    return {"mismatches": mismatches}


def _poisoned_outputs(device: str, loads: str) -> dict:
    """Each kernel writes every word of a poisoned output buffer, padding included (zeros read for it)."""
    from backends.layouts import cutlass, marlin, triton_moe

    g = torch.Generator().manual_seed(7)
    src = torch.randint(0, 256, (2, 100, 40), dtype=torch.uint8, generator=g)  # 100 x 80 logical, padded below
    padded = torch.zeros((2, 128, 64), dtype=torch.uint8)
    padded[:, :100, :40] = src
    src = src.to(device)
    rows = kernels.plain_rows(100, 128)
    results = {}
    for name, spec, reference, out, geometry in (
        ("marlin", marlin._repack_spec(128), marlin.repack_weights_torch,
         torch.empty((2, 8, 256), dtype=torch.int32),
         {"n_slabs": 2, "slab_src": (64, 0), "dst_slab_stride": 128, "dst_row_stride": 256, "block": (8, 128)}),
        ("sm90", cutlass._sm90_spec(64), cutlass.sm90_interleave_weights_torch,
         torch.empty((2, 128, 64), dtype=torch.uint8),
         {"n_slabs": 8, "slab_src": (16, 0), "dst_slab_stride": 256, "dst_row_stride": 16, "block": (16, 16)}),
        ("triton_moe", triton_moe._split_spec(64), triton_moe._split_halves_torch,
         torch.empty((2, 128, 64), dtype=torch.uint8),
         {"n_slabs": 1, "slab_src": (0, 0), "dst_slab_stride": 0, "dst_row_stride": 16, "block": (128, 16)}),
    ):
        out = out.view(torch.uint8).fill_(0xA5).view(out.dtype).to(device)
        os.environ[kernels.LOADS_ENV] = loads
        try:
            kernels.gather_words(spec, src, out, rows=rows, logical_cols=40, **geometry)
        finally:
            del os.environ[kernels.LOADS_ENV]
        results[name] = bool(torch.equal(_bytes(out), _bytes(reference(padded))))
    return results


def _negative_scale_refused(device: str, loads: str) -> dict:
    """Marlin NVFP4's fast path finds a negative block scale in its scale pass and names the first one, like the
    pure-torch check (padded and unpadded sizes)."""
    from layout_cases import random_layer

    messages = []
    for padded in ((128, 64), (192, 128)):
        w = random_layer("nvfp4", experts=3, hidden=128, inter=64, gate_up="interleaved", seed=5,
                         finite_scales=True, device=device)
        w.w2_scale.view(torch.uint8)[1, 3, 2] = 0xB8  # -1.0 in E4M3
        try:
            _convert("marlin:nvfp4", w, padded, "triton" if device == "cpu" else "auto", loads)
            messages.append(None)
        except ValueError as error:
            messages.append(str(error))
    return {"messages": messages}


# ------------------------------------------------------------------------------------ CPU, through the interpreter
@pytest.fixture(scope="module")
def interpreter_results() -> dict:
    pytest.importorskip("triton", reason="triton is not installed; the layout kernels cannot run")
    return interpreter_worker_rows(__file__, *((loads,) for loads in LOADS), drop_env=(kernels.ENV,))  # one per core


@pytest.mark.parametrize("loads", LOADS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_interpreted_kernel_writes_the_torch_converters_bytes(interpreter_results, case, loads):
    row = interpreter_results[f"{case}/{loads}"]
    assert "error" not in row, row.get("error")
    assert row["mismatches"] == [], f"(experts, gate_up, tensors) that differ: {row['mismatches']}"


@pytest.mark.parametrize("loads", LOADS)
def test_interpreted_kernel_writes_every_word_of_a_poisoned_buffer(interpreter_results, loads):
    row = interpreter_results[f"poisoned/{loads}"]
    assert "error" not in row, row.get("error")
    assert row == {"case": f"poisoned/{loads}", "marlin": True, "sm90": True, "triton_moe": True}


@pytest.mark.parametrize("loads", LOADS)
def test_interpreted_marlin_nvfp4_refuses_a_negative_scale(interpreter_results, loads):
    row = interpreter_results[f"negative-scale/{loads}"]
    assert "error" not in row, row.get("error")
    assert len(row["messages"]) == 2
    for message in row["messages"]:
        assert message is not None and "w2_scale" in message and "expert 1, row 3" in message, message


def test_every_layout_reads_whole_source_words_in_the_words_variant():
    from backends.layouts import cutlass, marlin, triton_moe

    for spec in (marlin._repack_spec(128), cutlass._sm90_spec(64), triton_moe._split_spec(64)):
        assert spec.groups is not None and len(spec.groups.deltas) == 3


# ------------------------------------------------------------------------------------ CPU, no triton needed
def test_dispatch_uses_the_kernel_on_cuda_only_and_obeys_the_env(monkeypatch):
    cpu = torch.empty(1, dtype=torch.uint8)
    meta = torch.empty(1, dtype=torch.uint8, device="meta")
    monkeypatch.delenv(kernels.ENV, raising=False)
    assert not kernels.enabled(cpu) and not kernels.enabled(meta)
    monkeypatch.setenv(kernels.ENV, "torch")
    assert not kernels.enabled(cpu)
    monkeypatch.setenv(kernels.ENV, "fast")
    with pytest.raises(ValueError, match="MOE_ORACLE_LAYOUT_KERNELS='fast' must be one of"):
        kernels.enabled(cpu)


def test_derive_finds_the_structure_and_refuses_what_is_not_a_word_gather():
    from backends.layouts import cutlass

    spec = cutlass._sm90_spec(32)
    assert spec.tile == (16, 8) and spec.out_shape == (16, 8) and spec.moves.shape[0] > 4
    with pytest.raises(AssertionError, match="zeros or ones"):
        kernels.derive(lambda b: b + 1, (2, 32), (1, 8))
    with pytest.raises(AssertionError, match="4 source bytes"):  # nibbles of 8 bytes per word
        kernels.derive(lambda b: torch.cat([b[..., ::2] & 15 | b[..., 1::2] << 4,
                                            b[..., ::2] >> 4 | b[..., 1::2] & 0xF0], -1), (2, 32), (1, 8))


# ------------------------------------------------------------------------------------ GPU, compiled
@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("loads", LOADS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_kernel_writes_the_torch_converters_bytes(case, loads):
    assert _check_case(CASES[case], "cuda", "auto", loads)["mismatches"] == []


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("loads", LOADS)
def test_cuda_kernel_writes_every_word_of_a_poisoned_buffer(loads):
    assert _poisoned_outputs("cuda", loads) == {"marlin": True, "sm90": True, "triton_moe": True}


@requires_cuda
@pytest.mark.gpu
def test_cuda_marlin_nvfp4_refuses_a_negative_scale():
    for message in _negative_scale_refused("cuda", "words")["messages"]:
        assert message is not None and "w2_scale" in message and "expert 1, row 3" in message, message


if __name__ == "__main__":  # the worker (argv: the loads variants to run): TRITON_INTERPRET=1 is set by the fixture
    import traceback

    sys.path.insert(0, str(ROOT / "tests"))
    for load_kind in sys.argv[1:]:
        for case_name, case_spec in [*CASES.items(), ("poisoned", None), ("negative-scale", None)]:
            try:
                result = (_poisoned_outputs("cpu", load_kind) if case_name == "poisoned"
                          else _negative_scale_refused("cpu", load_kind) if case_name == "negative-scale"
                          else _check_case(case_spec, "cpu", "triton", load_kind))
            except Exception:  # noqa: BLE001  report and keep going: each test shows its own case's failure
                result = {"error": traceback.format_exc()[-3000:]}
            print(json.dumps({"case": f"{case_name}/{load_kind}", **result}), flush=True)
