"""Marlin MoE layouts (MARLIN and BATCHED_MARLIN for MXFP4, MARLIN for NVFP4), as pure-torch permutations.

vLLM repacks every expert with the CUDA op ``gptq_marlin_repack(w.view(int32).T, perm=[], size_k=K,
size_n=N, num_bits=4)``; vLLM's own test oracle for that op (``marlin_weights`` in
``marlin_utils_test.py``, unchanged from 0.15 to 0.33 for 16-bit activations) defines it as a
permutation, which is what this module computes for all experts at once:

1. codes ``q[k, n]`` = FP4 code of weight row n, column k (the int32 view packs 8 codes along K,
   code 8j+i at bits 4i -- exactly our low-nibble-first bytes);
2. 16x16 tiles: ``q.reshape(K/16, 16, N/16, 16).permute(0, 2, 1, 3).reshape(K/16, 16N)``;
3. each run of 1024 codes gathered by Marlin's ``get_weight_perm(4)`` (`WEIGHT_PERM`);
4. repacked 8 codes per int32 (code i at bits 4i): int32 [E, K/16, 2N].

Scales (``marlin_permute_scales`` with group < K, then ``*_marlin_process_scales`` for 16-bit
activations): transpose to [K/B, N], gather runs of 64 by `SCALE_PERM`, then swap the middle two of
every 4 (``[0, 2, 1, 3]``). MXFP4 keeps the E8M0 bytes (viewed as float8_e8m0fnu); NVFP4 turns each
E4M3 scale v into Marlin's unsigned FP8 S0E5M3 byte ``(bits(fp16(v) * 2^7) >> 7) & 0xFF`` (exact
for every non-negative finite E4M3; negative or NaN scales are refused, vLLM only warns) and the
per-expert global scale into ``(1 / global_scale).to(act) * 2^(bias - 7)``, bias 126 (bf16) or 14
(fp16), kept in the config as g1/g2 alphas. Biases: cast to the activation dtype and permuted by
``marlin_permute_bias`` (`SCALE_PERM_SINGLE` on runs of 32). The gate/up row order is the
checkpoint's (Marlin's activation reads either convention). Not covered: FP8-activation Marlin.
The layout needs N % 64 and K % 16 for both GEMMs (N = 2I, K = H for w13; N = H, K = I for w2);
the kernel's own tile limits are the rules' support checks and round-up sizes.
"""

from __future__ import annotations

import torch

from backends.layouts.base import (
    Layout,
    require_multiple,
    require_tensor,
    source_config,
)
from backends.layouts.gate_up import invert_permutation
from backends.weights import KernelWeights, MoEWeights

__all__ = ["SCALE_PERM", "SCALE_PERM_SINGLE", "WEIGHT_PERM", "MarlinLayout", "mxfp4", "nvfp4"]


def _weight_perm() -> torch.Tensor:
    """Marlin's get_weight_perm(num_bits=4) for 16-bit activations, built from its definition."""
    i = torch.arange(32).reshape(32, 1, 1, 1)
    j = torch.arange(4).reshape(1, 4, 1, 1)
    block = torch.arange(2).reshape(1, 1, 2, 1)
    r = torch.arange(4).reshape(1, 1, 1, 4)
    row = 2 * (i % 4) + (r % 2) + 8 * (r // 2)  # rows 2(i%4), 2(i%4)+1, 2(i%4+4), 2(i%4+4)+1
    perm = (16 * row + i // 4 + 8 * block + 256 * j).reshape(-1, 8)
    return perm[:, torch.tensor([0, 2, 4, 6, 1, 3, 5, 7])].reshape(-1)


WEIGHT_PERM = _weight_perm()
#: marlin scale_perm: [i + 8 j for i in 0..7 for j in 0..7]
SCALE_PERM = (torch.arange(8).reshape(8, 1) + 8 * torch.arange(8).reshape(1, 8)).reshape(-1)
#: marlin scale_perm_single: [2 i + j for i in 0..3 for j in (0, 1, 8, 9, 16, 17, 24, 25)]
SCALE_PERM_SINGLE = (2 * torch.arange(4).reshape(4, 1) + torch.tensor([0, 1, 8, 9, 16, 17, 24, 25])).reshape(-1)
_SWAP_MIDDLE = torch.tensor([0, 2, 1, 3])
_E8M0 = getattr(torch, "float8_e8m0fnu", torch.uint8)


def _gather_runs(t: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Apply `perm` to every run of len(perm) consecutive elements of each expert's flattened tensor."""
    e = t.shape[0]
    runs = t.shape[1:].numel() // perm.numel()
    return t.reshape(e, runs, perm.numel()).index_select(2, perm.to(t.device)).reshape(t.shape)


def repack_weights(w: torch.Tensor) -> torch.Tensor:
    """[E, N, K/2] packed FP4 -> int32 [E, K/16, 2N] in Marlin's layout."""
    e, n, half_k = w.shape
    k = 2 * half_k
    codes = torch.stack((w & 0xF, w >> 4), dim=-1).reshape(e, n, k).transpose(1, 2)
    tiles = codes.reshape(e, k // 16, 16, n // 16, 16).permute(0, 1, 3, 2, 4).reshape(e, k // 16, n * 16)
    tiles = _gather_runs(tiles, WEIGHT_PERM).reshape(e, k // 16, n * 8, 2)
    return (tiles[..., 0] | (tiles[..., 1] << 4)).contiguous().view(torch.int32)


def unpack_weights(q: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Exact inverse of repack_weights: int32 [E, K/16, 2N] -> [E, N, K/2] uint8."""
    e = q.shape[0]
    b = q.contiguous().view(torch.uint8).reshape(e, k // 16, n * 8)
    tiles = torch.stack((b & 0xF, b >> 4), dim=-1).reshape(e, k // 16, n * 16)
    tiles = _gather_runs(tiles, invert_permutation(WEIGHT_PERM))
    codes = tiles.reshape(e, k // 16, n // 16, 16, 16).permute(0, 1, 3, 2, 4).reshape(e, k, n).transpose(1, 2)
    codes = codes.reshape(e, n, half := k // 2, 2)
    return (codes[..., 0] | (codes[..., 1] << 4)).reshape(e, n, half).contiguous()


def _permute_scales(s: torch.Tensor) -> torch.Tensor:
    """[E, N, K/B] -> [E, K/B, N] permuted (bytes of any 1-byte dtype)."""
    return _gather_runs(_gather_runs(s.transpose(1, 2).contiguous(), SCALE_PERM), _SWAP_MIDDLE)


def _unpermute_scales(s: torch.Tensor) -> torch.Tensor:
    back = _gather_runs(_gather_runs(s, _SWAP_MIDDLE), invert_permutation(SCALE_PERM))
    return back.transpose(1, 2).contiguous()


def e4m3_to_s0e5m3(s: torch.Tensor) -> torch.Tensor:
    """Non-negative E4M3 scales -> Marlin's S0E5M3 bytes (uint8)."""
    half_bits = (s.to(torch.float16) * 128.0).view(torch.int16)
    return ((half_bits >> 7) & 0xFF).to(torch.uint8)


def s0e5m3_to_e4m3(b: torch.Tensor) -> torch.Tensor:
    """Exact inverse of e4m3_to_s0e5m3."""
    return ((b.to(torch.int16) << 7).view(torch.float16) / 128.0).to(torch.float8_e4m3fn)


class MarlinLayout(Layout):
    def __init__(self, fmt: str, act_dtype: torch.dtype = torch.bfloat16):
        if act_dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"MarlinLayout: act_dtype={act_dtype} must be torch.bfloat16 or torch.float16 "
                             f"(FP8-activation Marlin is not covered)")
        self.formats = (fmt,)
        self.act_dtype = act_dtype
        self.layout = f"marlin_{fmt}_{str(act_dtype).removeprefix('torch.')}"

    def _check_sizes(self, w: MoEWeights) -> None:
        for what, n, k in (("w13", 2 * w.I, w.H), ("w2", w.H, w.I)):
            require_multiple(self.layout, f"{what} output rows", n, 64, "Marlin's 64-wide thread tiles and permutation")
            require_multiple(self.layout, f"{what} reduction size", k, 16, "Marlin's 16x16 weight tiles")
        if w.format == "nvfp4" and w.w13.device.type != "meta":
            for name in ("w13_scale", "w2_scale"):
                bad = getattr(w, name).view(torch.uint8) >= 0x7F
                if bool(bad.any()):
                    expert, row, _ = (int(x) for x in bad.nonzero()[0])
                    raise ValueError(f"layout {self.layout!r}: {name} has a negative, -0.0 or NaN block scale (first at "
                                     f"expert {expert}, row {row}); Marlin stores NVFP4 scales unsigned (S0E5M3), so "
                                     f"requantize with non-negative scales")

    def _to_kernel(self, w: MoEWeights):
        tensors = {"w13": repack_weights(w.w13), "w2": repack_weights(w.w2)}
        for name in ("w13_scale", "w2_scale"):
            s = _permute_scales(getattr(w, name).view(torch.uint8))
            if w.format == "mxfp4":
                tensors[name] = s.view(_E8M0)
            else:
                tensors[name] = e4m3_to_s0e5m3(s.view(torch.float8_e4m3fn)).view(torch.float8_e4m3fn)
        for name in ("w13_bias", "w2_bias"):
            if getattr(w, name) is not None:
                tensors[name] = _gather_runs(getattr(w, name).to(self.act_dtype), SCALE_PERM_SINGLE)
        config = {}
        if w.format == "nvfp4":
            exponent_bias = 126 if self.act_dtype == torch.bfloat16 else 14
            for alpha, name in (("g1_alphas", "w13_global_scale"), ("g2_alphas", "w2_global_scale")):
                config[alpha] = (1.0 / getattr(w, name)).to(self.act_dtype) * 2.0 ** (exponent_bias - 7)
            config.update(source_config(w))
        return tensors, config

    def _from_kernel(self, kw: KernelWeights) -> MoEWeights:
        e, hidden, inter = kw.E, kw.padded_hidden_size, kw.padded_intermediate_size
        out = {
            "w13": unpack_weights(require_tensor(self.layout, kw, "w13", (e, hidden // 16, 4 * inter), torch.int32),
                                  2 * inter, hidden),
            "w2": unpack_weights(require_tensor(self.layout, kw, "w2", (e, inter // 16, 2 * hidden), torch.int32),
                                 hidden, inter),
        }
        for name in ("w13_scale", "w2_scale"):
            s = _unpermute_scales(kw[name].view(torch.uint8))
            out[name] = s if kw.format == "mxfp4" else s0e5m3_to_e4m3(s)
        for name in ("w13_bias", "w2_bias"):
            if name in kw.tensors:
                out[name] = _gather_runs(kw[name], invert_permutation(SCALE_PERM_SINGLE)).float()
        return self._rebuild(kw, **out)


#: MXFP4 backends MARLIN and BATCHED_MARLIN (bf16 activations; MarlinLayout("mxfp4", torch.float16) for fp16)
mxfp4 = MarlinLayout("mxfp4")
#: NVFP4 backend MARLIN (bf16 activations)
nvfp4 = MarlinLayout("nvfp4")
