"""Random checkpoint layers for the layout tests: every byte random, so a misplaced byte is visible."""
from __future__ import annotations

import torch

from backends.weights import BLOCK_SIZE, MoEWeights


def random_bytes(shape, generator, device="cpu") -> torch.Tensor:
    if device == "meta":
        return torch.empty(shape, dtype=torch.uint8, device="meta")
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator).to(device)


def random_layer(fmt: str = "mxfp4", *, experts: int = 3, hidden: int = 64, inter: int = 32,
                 gate_up: str = "interleaved", bias: bool = True, seed: int = 0, device: str = "cpu",
                 finite_scales: bool = False, bf16_bias: bool = False) -> MoEWeights:
    """A random MoEWeights. Scale codes are any MoEWeights accepts (NVFP4 0x00..0x7e, MXFP4 0..254: no NaN, no
    negative scale); finite_scales keeps MXFP4 scales in 2^-7..2^0 (no overflow in a GEMM)."""
    g = torch.Generator().manual_seed(seed)
    block = BLOCK_SIZE[fmt]

    def scales(rows, k):
        raw = random_bytes((experts, rows, k // block), g, device)
        if device != "meta":
            raw = raw % 0x7F if fmt == "nvfp4" else 120 + raw % 8 if finite_scales else raw % 255
        return raw if fmt == "mxfp4" else raw.view(torch.float8_e4m3fn)

    def fp32(*shape):
        if device == "meta":
            return torch.empty(shape, device="meta")
        t = torch.randn(shape, generator=g)
        return (t.bfloat16().float() if bf16_bias else t).to(device)

    def positive(*shape):
        return fp32(*shape).abs() + 0.5 if device != "meta" else fp32(*shape)

    nv = fmt == "nvfp4"
    return MoEWeights(
        format=fmt, gate_up=gate_up,
        w13=random_bytes((experts, 2 * inter, hidden // 2), g, device), w13_scale=scales(2 * inter, hidden),
        w2=random_bytes((experts, hidden, inter // 2), g, device), w2_scale=scales(hidden, inter),
        w13_bias=fp32(experts, 2 * inter) if bias else None, w2_bias=fp32(experts, hidden) if bias else None,
        w13_global_scale=positive(experts) if nv else None, w2_global_scale=positive(experts) if nv else None,
        w13_input_scale=positive(experts, 2) if nv else None, w2_input_scale=positive(experts) if nv else None,
    )


def assert_same_weights(a: MoEWeights, b: MoEWeights) -> None:
    """Bit-exact equality of every field (tensors compared as bytes, so NaN scales compare equal)."""
    assert (a.format, a.gate_up) == (b.format, b.gate_up)
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if not isinstance(x, torch.Tensor):
            assert x == y, name
            continue
        assert isinstance(y, torch.Tensor), name
        assert (x.shape, x.dtype, x.device) == (y.shape, y.dtype, y.device), name
        if x.device.type != "meta" and x.numel():
            assert torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)), name
