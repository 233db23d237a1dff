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
(fp16), kept in the config as g1/g2 alphas (the weight-only alphas `convert(..., quant_config=...)` passes
from the rules' kind). Biases: cast to the activation dtype and permuted by
``marlin_permute_bias`` (`SCALE_PERM_SINGLE` on runs of 32). The gate/up row order is the
checkpoint's (Marlin's activation reads either convention). Not covered: FP8-activation Marlin.
The layout needs N % 64 and K % 16 for both GEMMs (N = 2I, K = H for w13; N = H, K = I for w2);
the kernel's own tile limits are the rules' support checks and round-up sizes.

On CUDA the weight repack (padding included) is one Triton word gather (`_nibble_kernels`), derived from
`repack_weights_torch`, which stays the definition and the CPU/meta path; the inverse is pure torch.
"""

from __future__ import annotations

import functools

import torch

from backends.layouts import _nibble_kernels as kernels
from backends.layouts.base import (
    Layout,
    require_multiple,
    require_tensor,
    source_config,
)
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
_E8M0 = getattr(torch, "float8_e8m0fnu", torch.uint8)


# Steps 1-4 as ONE byte permutation: with n = 64 ntb + 16 j + 8 block + col and k = 16 kt + 8 r1 + 2 i4 + r0,
# Marlin's int32 [kt, 2N] holds, in order, (ntb, col, i4, j) x 8 codes (r0, block, r1) at bits 4 (4 r0 + 2 block
# + r1). The checkpoint byte k // 2 = 8 kt + 4 r1 + i4 holds r0 as its nibble, so the output byte (r0, block)
# combines nibble r0 of the two input bytes r1 = 0, 1: permute bytes to [kt, ntb, col, i4, j, block, r1], then
# mix nibbles. (This equals gathering every 1024 codes by WEIGHT_PERM; tests check it against vLLM's oracle.)
_W_VIEW_DIMS = (0, 5, 1, 4, 7, 2, 3, 6)  # [E, ntb, j, block, col, kt, r1, i4] -> [E, kt, ntb, col, i4, j, block, r1]


def _w_view(e: int, n: int, k: int) -> tuple:
    return (e, n // 64, 4, 2, 8, k // 16, 2, 4)


def repack_weights(w: torch.Tensor) -> torch.Tensor:
    """[E, N, K/2] packed FP4 -> int32 [E, K/16, 2N] in Marlin's layout (the Triton kernel on CUDA)."""
    e, n, half_k = w.shape
    if kernels.enabled(w):
        return _repack_fast(w, n, 2 * half_k, kernels.plain_rows(n, n))
    return repack_weights_torch(w)


def repack_weights_torch(w: torch.Tensor) -> torch.Tensor:
    """The definition of repack_weights in pure torch (CPU, meta, and the reference of the kernel)."""
    e, n, half_k = w.shape
    k = 2 * half_k
    a = w.reshape(_w_view(e, n, k)).permute(_W_VIEW_DIMS).contiguous()
    lo, hi = a[..., 0], a[..., 1]  # input bytes r1 = 0 and r1 = 1, [E, kt, ntb, col, i4, j, block]
    r0_is_0 = (lo & 0xF) | (hi << 4)
    r0_is_1 = (lo >> 4) | (hi & 0xF0)
    out = torch.stack((r0_is_0, r0_is_1), dim=-2)  # [..., r0, block]
    return out.reshape(e, k // 16, 8 * n).view(torch.int32)


@functools.lru_cache(maxsize=16)
def _repack_spec(k: int) -> kernels.WordGather:
    """repack_weights as a word gather: one 64-row slab writes a [K/16, 128]-word column block of the output."""
    return kernels.derive(repack_weights_torch, (64, k // 2), (1, 128))


def _repack_fast(src: torch.Tensor, n: int, k: int, rows: kernels.RowMap) -> torch.Tensor:
    """repack_weights of the padded [E, n, k/2] matrix whose rows `rows` maps to the checkpoint's `src`."""
    out = src.new_empty((src.shape[0], k // 16, 2 * n), dtype=torch.int32)
    kernels.gather_words(_repack_spec(k), src, out, n_slabs=n // 64, slab_src=(64, 0), dst_slab_stride=128,
                         dst_row_stride=2 * n, block=(k // 16, 128), rows=rows, logical_cols=src.shape[-1])
    return out


def unpack_weights(q: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Exact inverse of repack_weights: int32 [E, K/16, 2N] -> [E, N, K/2] uint8."""
    e = q.shape[0]
    b = q.contiguous().view(torch.uint8).reshape(e, k // 16, n // 64, 8, 4, 4, 2, 2)  # [..., j, r0, block]
    r0_is_0, r0_is_1 = b[..., 0, :], b[..., 1, :]
    lo = (r0_is_0 & 0xF) | (r0_is_1 << 4)
    hi = (r0_is_0 >> 4) | (r0_is_1 & 0xF0)
    a = torch.stack((lo, hi), dim=-1)  # [E, kt, ntb, col, i4, j, block, r1]
    inverse = tuple(sorted(range(8), key=lambda d: _W_VIEW_DIMS[d]))
    return a.permute(inverse).contiguous().reshape(e, n, k // 2)


# Scales: transpose, SCALE_PERM on runs of 64 and [0, 2, 1, 3] on runs of 4 are one permutation: with
# n = 64 nb + 32 jh + 16 a + 8 b + i, Marlin's [G, N] holds, per 64 columns, (i, jh, b, a).
_S_VIEW_DIMS = (0, 6, 1, 5, 2, 4, 3)  # [E, nb, jh, a, b, i, G] -> [E, G, nb, i, jh, b, a]
# marlin_permute_bias (SCALE_PERM_SINGLE on runs of 32): with r = 8 q + 2 i + p, (i, q, p).
_B_VIEW_DIMS = (0, 1, 3, 2, 4)  # [E, runs, q, i, p] -> [E, runs, i, q, p]


def _permute_scales(s: torch.Tensor) -> torch.Tensor:
    """[E, N, K/B] -> [E, K/B, N] permuted (bytes of any 1-byte dtype)."""
    e, n, groups = s.shape
    out = s.reshape(e, n // 64, 2, 2, 2, 8, groups).permute(_S_VIEW_DIMS).contiguous()
    return out.reshape(e, groups, n)


def _unpermute_scales(s: torch.Tensor) -> torch.Tensor:
    e, groups, n = s.shape
    inverse = tuple(sorted(range(7), key=lambda d: _S_VIEW_DIMS[d]))
    return s.reshape(e, groups, n // 64, 8, 2, 2, 2).permute(inverse).contiguous().reshape(e, n, groups)


def _permute_bias(b: torch.Tensor) -> torch.Tensor:
    e, rows = b.shape
    return b.reshape(e, rows // 32, 4, 4, 2).permute(_B_VIEW_DIMS).contiguous().reshape(e, rows)


def _unpermute_bias(b: torch.Tensor) -> torch.Tensor:
    e, rows = b.shape
    return b.reshape(e, rows // 32, 4, 4, 2).permute(_B_VIEW_DIMS).contiguous().reshape(e, rows)  # a swap: self-inverse


@functools.lru_cache(maxsize=8)
def _scale_tables(device: torch.device) -> tuple:
    """(the 64-entry source row of each output position of `_permute_scales`, the 256-entry byte map of
    `e4m3_to_s0e5m3`), both read off the pure-torch definitions, on `device`."""
    perm = _permute_scales(torch.arange(64, dtype=torch.uint8).view(1, 64, 1)).reshape(64).to(torch.int32)
    codes = torch.arange(128, dtype=torch.uint8).view(torch.float8_e4m3fn)  # bytes >= 0x7F are refused anyway
    lut = torch.cat([e4m3_to_s0e5m3(codes), torch.zeros(128, dtype=torch.uint8)])
    return perm.to(device), lut.to(device)


def _permute_scales_fast(s: torch.Tensor, fmt: str) -> tuple:
    """`_permute_scales` (and for NVFP4 `e4m3_to_s0e5m3`) of [E, N, G] scales as one Triton pass, with the
    largest source byte (a 0-dim tensor; >= 0x7F means a negative, -0.0 or NaN NVFP4 scale) from the same pass."""
    from backends.layouts._nibble_triton import permute_scales_kernel

    e, n, groups = s.shape
    src = s.contiguous().view(torch.uint8)
    out = torch.empty((e, groups, n), dtype=torch.uint8, device=s.device)
    perm, lut = _scale_tables(s.device)
    bn, bg = 128, 32
    grid = (e, -(-n // bn), -(-groups // bg))
    worst = torch.zeros(max(1, grid[0] * grid[1] * grid[2]), dtype=torch.int32, device=s.device)
    if out.numel():
        permute_scales_kernel[grid](src, out, perm, lut, worst, n, groups, USE_LUT=fmt == "nvfp4", BN=bn, BGR=bg,
                                    num_warps=4)
    return out.view(_E8M0 if fmt == "mxfp4" else torch.float8_e4m3fn), worst.max()


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

    def _check_sizes(self, w: MoEWeights, hidden: int, inter: int) -> None:
        for what, n, k in (("w13", 2 * inter, hidden), ("w2", hidden, inter)):
            require_multiple(self.layout, f"{what} output rows", n, 64, "Marlin's 64-wide thread tiles and permutation")
            require_multiple(self.layout, f"{what} reduction size", k, 16, "Marlin's 16x16 weight tiles")
        if w.format == "nvfp4" and w.w13.device.type != "meta" and not kernels.enabled(w.w13):  # else: _to_kernel
            self._check_scales(w)

    def _check_scales(self, w: MoEWeights) -> None:
        """Refuse negative, -0.0 and NaN NVFP4 block scales, naming the first one."""
        for name in ("w13_scale", "w2_scale"):
            bad = getattr(w, name).view(torch.uint8) >= 0x7F
            if bool(bad.any()):
                expert, row, _ = (int(x) for x in bad.nonzero()[0])
                raise ValueError(f"layout {self.layout!r}: {name} has a negative, -0.0 or NaN block scale "
                                 f"(first at "
                                 f"expert {expert}, row {row}); Marlin stores NVFP4 scales unsigned (S0E5M3), so "
                                 f"requantize with non-negative scales")

    def _to_kernel(self, w: MoEWeights, hidden: int, inter: int):
        if kernels.enabled(w.w13):  # padding read in place by the kernel; scales and biases padded alone
            tensors = {"w13": _repack_fast(w.w13, 2 * inter, hidden, kernels.w13_rows(w.gate_up, "checkpoint", w.I,
                                                                                        inter)),
                       "w2": _repack_fast(w.w2, hidden, inter, kernels.plain_rows(w.H, hidden))}
            side = kernels.padded_side_tensors(w, hidden, inter, "checkpoint",
                                               scales=(hidden, inter) != (w.H, w.I))
            if (hidden, inter) == (w.H, w.I):  # nothing to pad: the scale kernel reads the checkpoint's
                side["w13_scale"], side["w2_scale"] = w.w13_scale, w.w2_scale
            worst = []
            for name in ("w13_scale", "w2_scale"):
                tensors[name], worst_byte = _permute_scales_fast(side[name], w.format)
                worst.append(worst_byte)
            if w.format == "nvfp4" and int(torch.stack(worst).max()) >= 0x7F:  # one sync for both
                self._check_scales(w)
        else:
            padded = w.pad(hidden, inter)
            tensors = {"w13": repack_weights_torch(padded.w13), "w2": repack_weights_torch(padded.w2)}
            side = {name: getattr(padded, name) for name in ("w13_scale", "w2_scale", "w13_bias", "w2_bias")}
        for name in ("w13_scale", "w2_scale"):
            if name in tensors:
                continue
            s = _permute_scales(side[name].view(torch.uint8))
            if w.format == "mxfp4":
                tensors[name] = s.view(_E8M0)
            else:
                tensors[name] = e4m3_to_s0e5m3(s.view(torch.float8_e4m3fn)).view(torch.float8_e4m3fn)
        for name in ("w13_bias", "w2_bias"):
            if side[name] is not None:
                tensors[name] = _permute_bias(side[name].to(self.act_dtype))
        return tensors, source_config(w) if w.format == "nvfp4" else {}

    def _quant_values(self, quant_config):
        """The kind's g1/g2 alphas (weight-only NVFP4: 1 / global scale) in Marlin's form: activation dtype
        times 2^(bias - 7), bias 126 (bf16) or 14 (fp16)."""
        exponent_bias = 126 if self.act_dtype == torch.bfloat16 else 14
        return {k: v.to(self.act_dtype) * 2.0 ** (exponent_bias - 7) if k in ("g1_alphas", "g2_alphas") else v
                for k, v in quant_config.items()}

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
                out[name] = _unpermute_bias(kw[name]).float()
        return self._rebuild(kw, **out)


#: MXFP4 backends MARLIN and BATCHED_MARLIN (bf16 activations; MarlinLayout("mxfp4", torch.float16) for fp16)
mxfp4 = MarlinLayout("mxfp4")
#: NVFP4 backend MARLIN (bf16 activations)
nvfp4 = MarlinLayout("nvfp4")
