"""benchmarks/probe_decode_stream_bound.py without a GPU: the bytes it reads are the layer's at T = 1, it refuses
to run without CUDA, and its kernels (the grid barrier's included) compile for sm_90."""

from __future__ import annotations

import pytest

from conftest import assert_exits_needing_a_gpu, load_benchmark

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")

probe = load_benchmark("probe_decode_stream_bound")


def test_the_words_are_the_top_k_experts_gemm_bytes():
    from backends.gpu_timing import expert_bytes
    from backends.model_shapes import SHAPES

    shape = SHAPES["gpt-oss-120b"]
    gemm1, gemm2 = probe.layer_words("gpt-oss-120b")
    # GEMM1 [2I, H] and GEMM2 [H, I] of 4 experts: packed FP4 plus one E8M0 byte per 32
    assert gemm1 * 4 == 4 * (2 * 2880 * 2880 // 2 + 2 * 2880 * 2880 // 32)
    assert gemm2 * 4 == 4 * (2880 * 2880 // 2 + 2880 * 2880 // 32)
    assert (gemm1 + gemm2) * 4 == shape.top_k * expert_bytes(shape.format, shape.hidden_size, shape.intermediate_size)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
def test_without_a_gpu_it_says_so(capsys, tmp_path):
    assert_exits_needing_a_gpu(probe.main, ["--out", str(tmp_path)], capsys)


@pytest.mark.parametrize("b_first", [True, False])
def test_the_persistent_kernel_compiles_for_sm90(b_first):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = probe._persistent
    signature = {name: "*i32" for name in ("a_ptr", "b_ptr", "counter_ptr", "out_ptr")}
    signature |= {"na": "i32", "a_total": "i32", "programs": "i32"}
    constexprs = {"BLOCK": probe.BLOCK, "HELD": probe.HELD, "B_FIRST": b_first}
    signature |= {name: "constexpr" for name in constexprs}
    names = kernel.arg_names
    source = ASTSource(fn=kernel, signature={name: signature[name] for name in names},
                       constexprs={(names.index(name),): value for name, value in constexprs.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 32})
    ptx = compiled.asm["ptx"]
    assert "atom.global" in ptx and "acquire" in ptx  # the grid barrier: a release add, acquire reads
