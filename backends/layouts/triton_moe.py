"""Weight layout of this project's Triton MoE kernels (backends.triton_moe), and the way back.

Kernel layout (per expert e, rows K-major, two E2M1 codes per byte "split by halves": in each
64-wide K group g, K byte 32g+j holds value 64g+j in its low nibble and value 64g+32+j in its high
nibble, so a tile's low and high nibbles are two contiguous K halves; the checkpoint's bytes hold
values 2i, 2i+1). Each 16-byte run stores its K bytes in the order 0,1,8,9, 2,3,10,11, ... (the
wgmma register operand's order, `_wgmma_byte_order`), and each little-endian 4-byte word then has its 8 codes
moved to the bit slots WORD_SLOTS (`_encode_words`: a fixed bit permutation that the kernels' decode turns
into bf16 lanes without byte permutes). Rows are stored in tiles (`_tile_rows`): TILE_ROWS rows x TILE_BYTES
bytes contiguous, a row group's tiles in K order, and the kernels load a K step tile by tile, so a warp's 32
16-byte copies read 512 contiguous bytes. Row-major rows made each warp copy read 8 rows' short pieces, which
streamed at 0.26-0.66 of the read bandwidth (benchmarks/probe_weight_streaming.py; contiguous warp reads 0.85-1.00);
the tiles made the decode-regime layers 1.2-1.4x faster (same-run A/B on an H100):
    w13        uint8   [E, 2I, H/2]   rows 0..I-1 gate, I..2I-1 up (contiguous halves, never interleaved);
               row n, K byte c at (n // TILE_ROWS, c // TILE_BYTES, n % TILE_ROWS, c % TILE_BYTES), row-major
    w13_scale  int32 [E, ceil(H/C), 2I]: "scale words", one word per row and C-wide K chunk holding
               that chunk's 4 E8M0 exponents (MXFP4: B=32, C=128) or 4 E4M3 bytes (NVFP4: B=16, C=64),
               little-endian (byte j = sub-block j), chunk-major so a K step loads BN consecutive words;
               a K tail chunk is padded with zero bytes
    w2         uint8   [E, H, I/2];   w2_scale words [E, ceil(I/C), H]
    w13_bias   fp32    [E, 2I] (same row order) or None;  w2_bias fp32 [E, H] or None
    w13_global_scale, w2_global_scale  fp32 [E]: NVFP4 per-expert quantization multipliers (the
               kernels divide the fp32 accumulator by them, as the format defines); None for MXFP4
W4A8 forced onto FP8 dots (`w4a8_row_data`, section "W4A8" below; moe_forward computes them once per layer):
    w13_row_exp, w2_row_exp    int32 [E, rows]: each row's power of two r (W * 2^-r fits E4M3)
    w13_fp8, w2_fp8            uint8, the shape and row tiling of w13 / w2, each row's 32-wide K chunks in the
                               W4A8 byte order (W4A8_CHUNK) that two `prmt` byte selects decode to E4M3
    w13_lut_code, w2_lut_code  int32, the scale words' layout, each byte a block's code (w4a8_lut_codes) of a
                               row of w4a8_lut_table
The checkpoint's gpt-oss interleaving (even rows gate, odd rows up) is undone once here, with the
same permutation on scales and biases, so the kernel loads a gate tile and an up tile at rows n and I+n.
On CUDA the split halves (with padding and the [gate; up] order, in `TritonMoELayout`) are one Triton word
gather (`_nibble_kernels`) derived from `_split_halves_torch`, the definition and the CPU/meta path; the scale
words are one Triton pass per tensor into the final word buffer (`_scale_words_fast`; `_to_words` is the definition).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from backends import formats
from backends.layouts import _nibble_kernels as kernels
from backends.layouts.base import Layout, require_multiple, source_config
from backends.weights import KernelWeights, MoEWeights

FORMATS = ("mxfp4", "nvfp4")
SCALE_BLOCK = {"mxfp4": 32, "nvfp4": 16}
#: H and I must be multiples of this (the 64-wide nibble groups of the byte layout).
SIZE_ALIGNMENT = 64
#: Rows and bytes per row of the contiguous weight tiles (`_tile_rows`): 32 rows divide every tile the tuning
#: tables use (BLOCK_N >= 32) and 32 bytes every K step (BLOCK_K >= 64), so a step reads whole tiles; 16 rows x
#: 32 bytes are one warp's 512-byte read.
TILE_ROWS = 32
TILE_BYTES = 32
#: K elements covered by one 32-bit scale word (4 block scales).
SCALE_CHUNK = {"mxfp4": 128, "nvfp4": 64}


@dataclass(frozen=True)
class TritonMoEWeights:
    """Tensors in the kernel layout above; `format` is 'mxfp4' or 'nvfp4'."""

    format: str
    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    w13_bias: torch.Tensor | None = None
    w2_bias: torch.Tensor | None = None
    w13_global_scale: torch.Tensor | None = None
    w2_global_scale: torch.Tensor | None = None
    # W4A8 FP8-dot tensors, `w4a8_row_data`: given, or computed by moe_forward once FP8 dots are forced
    w13_row_exp: torch.Tensor | None = None
    w2_row_exp: torch.Tensor | None = None
    w13_fp8: torch.Tensor | None = None
    w2_fp8: torch.Tensor | None = None
    w13_lut_code: torch.Tensor | None = None
    w2_lut_code: torch.Tensor | None = None

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.w13.shape[2] * 2

    @property
    def intermediate_size(self) -> int:
        return self.w13.shape[1] // 2

    @property
    def device(self) -> torch.device:
        return self.w13.device


def _fail(message: str):
    raise ValueError(f"triton_moe layout: {message}")


def _deinterleave_rows(t: torch.Tensor | None) -> torch.Tensor | None:
    """[E, 2I, ...] with rows (g0, u0, g1, u1, ...) -> rows (g0..g_{I-1}, u0..u_{I-1})."""
    if t is None:
        return None
    return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1).contiguous()


def _interleave_rows(t: torch.Tensor | None) -> torch.Tensor | None:
    """Inverse of _deinterleave_rows."""
    if t is None:
        return None
    gate, up = t.chunk(2, dim=1)
    return torch.stack([gate, up], dim=2).reshape(t.shape).contiguous()


def _scale_bytes(scale: torch.Tensor, fmt: str, name: str) -> torch.Tensor:
    expected = torch.uint8 if fmt == "mxfp4" else torch.float8_e4m3fn
    if scale.dtype != expected:
        _fail(f"{name}.dtype={scale.dtype} must be {expected} for format={fmt!r}")
    return scale.contiguous().view(torch.uint8)


def _split_halves(packed: torch.Tensor) -> torch.Tensor:
    """Checkpoint bytes (values 2i | 2i+1 << 4) -> kernel bytes (64-wide groups: value j | value j+32 << 4);
    the Triton kernel (`_nibble_kernels`) on CUDA."""
    if kernels.enabled(packed) and packed.dim() == 3:
        rows = packed.shape[1]
        return _split_halves_fast(packed, rows, 2 * packed.shape[2], kernels.plain_rows(rows, rows))
    return _split_halves_torch(packed)


@functools.lru_cache(maxsize=16)
def _split_spec(half_k: int) -> kernels.WordGather:
    """_split_halves as a word gather: rows stay, every 8 output words read one 32-byte group of their row."""
    return kernels.derive(_split_halves_torch, (2, half_k), (1, 8))


def _split_halves_fast(src: torch.Tensor, rows: int, k: int, row_map: kernels.RowMap) -> torch.Tensor:
    """_split_halves of the padded [E, rows, k/2] matrix whose rows `row_map` maps to the checkpoint's `src`."""
    out = src.new_empty((src.shape[0], rows, k // 2))
    kernels.gather_words(_split_spec(k // 2), src, out, n_slabs=1, slab_src=(0, 0), dst_slab_stride=0,
                         dst_row_stride=k // 8, block=(rows, k // 8), rows=row_map, logical_cols=src.shape[-1])
    return out


def _split_halves_torch(packed: torch.Tensor) -> torch.Tensor:
    """The definition of _split_halves in pure torch (CPU, meta, and the reference of the kernel)."""
    groups = packed.shape[-1] // 32  # explicit, so that zero experts reshape too
    codes = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(*packed.shape[:-1], groups, 2, 32)
    stored = _wgmma_byte_order(codes[..., 0, :] | (codes[..., 1, :] << 4))
    return _encode_words(stored.reshape(packed.shape)).contiguous()


def _wgmma_byte_order(split: torch.Tensor) -> torch.Tensor:
    """[..., 32] bytes in K order -> each 16-byte run stored as K bytes 0,1,8,9, 2,3,10,11, 4,5,12,13, 6,7,14,15:
    a thread's share of a wgmma register operand (bytes 2t, 2t+1, 2t+8, 2t+9 of a 16-wide K step) is then one
    4-byte word (the wgmma tiles permute it back in registers: backends.triton_moe._kernels._to_k_order)."""
    runs = split.reshape(*split.shape[:-1], 2, 2, 4, 2)  # [run, h, w, p]: K byte 16 run + 8h + 2w + p
    return runs.transpose(-3, -2).reshape(split.shape)  # stored at 4w + 2h + p


#: Where each E2M1 code of a 4-byte word goes in the stored 32-bit word: (byte, nibble) -> (sign bit, lowest of the
#: 3 magnitude bits). Word byte l (0, 1) and 2 + l have their low (k) and high (k + 32) codes in 16-bit lane l at
#: slots A, B, C, D; the kernel's routine (_kernels._E2M1_WORD_BODY) turns each slot into a bf16 lane with
#: 1 to 4 integer ops and no byte permutes.
WORD_SLOTS = {(0, 0): (15, 6), (1, 0): (31, 22), (2, 0): (12, 3), (3, 0): (28, 19),
              (0, 1): (14, 0), (1, 1): (30, 16), (2, 1): (13, 9), (3, 1): (29, 25)}


def _encode_words(stored: torch.Tensor) -> torch.Tensor:
    """[..., n] bytes (two codes each, n % 4 == 0) -> the same bytes with every little-endian 4-byte word's
    8 codes moved to WORD_SLOTS (a bit permutation of each word)."""
    words = stored.reshape(*stored.shape[:-1], stored.shape[-1] // 4, 4).to(torch.int64)  # explicit: zero experts
    out = torch.zeros(words.shape[:-1], dtype=torch.int64, device=stored.device)
    for (byte, nibble), (sign, mag) in WORD_SLOTS.items():
        code = (words[..., byte] >> (4 * nibble)) & 15
        out |= ((code >> 3) << sign) | ((code & 7) << mag)
    return torch.stack([(out >> (8 * b)) & 0xFF for b in range(4)], dim=-1).to(torch.uint8).reshape(stored.shape)


def _decode_words(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of _encode_words."""
    raw = packed.reshape(*packed.shape[:-1], packed.shape[-1] // 4, 4).to(torch.int64)
    word = raw[..., 0] | (raw[..., 1] << 8) | (raw[..., 2] << 16) | (raw[..., 3] << 24)
    out = torch.zeros_like(raw)
    for (byte, nibble), (sign, mag) in WORD_SLOTS.items():
        code = (((word >> sign) & 1) << 3) | ((word >> mag) & 7)
        out[..., byte] |= code << (4 * nibble)
    return out.to(torch.uint8).reshape(packed.shape)


def _join_halves(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of _split_halves."""
    stored = _decode_words(packed).reshape(*packed.shape[:-1], packed.shape[-1] // 32, 2, 4, 2, 2)  # [run, w, h, p]
    groups = stored.transpose(-3, -2).reshape(*packed.shape[:-1], packed.shape[-1] // 32, 32)
    codes = torch.stack([groups & 15, groups >> 4], dim=-2).reshape(*packed.shape[:-1], packed.shape[-1], 2)
    return (codes[..., 0] | (codes[..., 1] << 4)).reshape(packed.shape).contiguous()


def _tile_rows(split: torch.Tensor) -> torch.Tensor:
    """[E, rows, K/2] row-major kernel bytes -> the same shape holding [E, rows/TILE_ROWS, K/2/TILE_BYTES,
    TILE_ROWS, TILE_BYTES]: each TILE_ROWS x TILE_BYTES tile contiguous, a row group's tiles in K order."""
    e, rows, half = split.shape
    tiles = split.reshape(e, rows // TILE_ROWS, TILE_ROWS, half // TILE_BYTES, TILE_BYTES)
    return tiles.transpose(2, 3).contiguous().reshape(e, rows, half)


def _untile_rows(tiled: torch.Tensor) -> torch.Tensor:
    """Inverse of _tile_rows."""
    e, rows, half = tiled.shape
    tiles = tiled.reshape(e, rows // TILE_ROWS, half // TILE_BYTES, TILE_ROWS, TILE_BYTES)
    return tiles.transpose(2, 3).contiguous().reshape(e, rows, half)


def _to_words(scale_bytes: torch.Tensor, fmt: str) -> torch.Tensor:
    """[E, rows, K/B] uint8 -> [E, ceil(K/C), rows] int32 words (zero bytes pad the last chunk)."""
    per_word = 4
    e, rows, groups = scale_bytes.shape
    chunks = -(-groups // per_word)
    padded = scale_bytes.new_zeros((e, rows, chunks * per_word))
    padded[..., :groups] = scale_bytes
    words = padded.view(torch.int32).reshape(e, rows, chunks)
    return words.transpose(1, 2).contiguous()


def _scale_words_fast(w: MoEWeights, hidden: int, inter: int) -> dict:
    """w13_scale and w2_scale words of ``w.pad(hidden, inter)`` in the [gate; up] order: one Triton pass each
    (`_nibble_kernels.scale_words`), byte for byte `_to_words` of the padded scales."""
    return {
        "w13_scale": kernels.scale_words(_scale_bytes(w.w13_scale, w.format, "w13_scale"),
                                         kernels.w13_rows(w.gate_up, "gate_up", w.I, inter), 2 * inter,
                                         -(-(hidden // SCALE_BLOCK[w.format]) // 4)),
        "w2_scale": kernels.scale_words(_scale_bytes(w.w2_scale, w.format, "w2_scale"),
                                        kernels.plain_rows(w.H, hidden), hidden,
                                        -(-(inter // SCALE_BLOCK[w.format]) // 4))}


def _from_words(words: torch.Tensor, fmt: str, k: int) -> torch.Tensor:
    """Inverse of _to_words: [E, chunks, rows] words -> [E, rows, K/B] uint8."""
    e, chunks, rows = words.shape
    # a fresh [E, rows, chunks] copy: .contiguous() keeps any stride on a size-1 dim, and a single chunk
    # (K <= 128 / 64) with standard strides then has stride(-1) == rows, which view(uint8) refuses
    row_major = words.new_empty((e, rows, chunks)).copy_(words.transpose(1, 2))
    return row_major.view(torch.uint8).reshape(e, rows, -1)[..., :k // SCALE_BLOCK[fmt]]


def to_kernel_layout(
    *, format: str, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
    w13_bias: torch.Tensor | None = None, w2_bias: torch.Tensor | None = None,
    w13_global_scale: torch.Tensor | None = None, w2_global_scale: torch.Tensor | None = None,
    gate_up_layout: str = "interleaved",
) -> TritonMoEWeights:
    """Checkpoint tensors (the emulation backend's arguments) -> kernel layout; done once at load."""
    if format not in FORMATS:
        _fail(f"format={format!r} must be one of {FORMATS}; other formats run on the EMULATION backend")
    if gate_up_layout not in ("interleaved", "contiguous"):
        _fail(f"gate_up_layout={gate_up_layout!r} must be 'interleaved' (gpt-oss) or 'contiguous' ([w1; w3])")
    for name, t in (("w13", w13), ("w2", w2)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 3:
            _fail(f"{name} must be a uint8 tensor [E, rows, K/2] of packed E2M1 codes")
    experts, rows, half_h = w13.shape
    hidden, inter = half_h * 2, rows // 2
    if rows % 2:
        _fail(f"w13.shape[1]={rows} must be even (gate and up rows); non-gated experts are not supported")
    if tuple(w2.shape) != (experts, hidden, inter // 2):
        _fail(f"w2.shape={tuple(w2.shape)} must be {(experts, hidden, inter // 2)} given w13.shape={tuple(w13.shape)}")
    for dim, size in (("hidden size H", hidden), ("intermediate size I", inter)):
        if size % SIZE_ALIGNMENT:
            _fail(f"{dim}={size} must be a multiple of {SIZE_ALIGNMENT}; pad it (backends round_up) first")
    block = SCALE_BLOCK[format]
    s13, s2 = _scale_bytes(w13_scale, format, "w13_scale"), _scale_bytes(w2_scale, format, "w2_scale")
    if tuple(s13.shape) != (experts, rows, hidden // block) or tuple(s2.shape) != (experts, hidden, inter // block):
        _fail(f"scales {tuple(s13.shape)}, {tuple(s2.shape)} must be {(experts, rows, hidden // block)}, "
              f"{(experts, hidden, inter // block)} (one per {block} weights)")
    gs13 = gs2 = None
    if format == "nvfp4":
        for name, gs in (("w13_global_scale", w13_global_scale), ("w2_global_scale", w2_global_scale)):
            if not isinstance(gs, torch.Tensor) or tuple(gs.shape) != (experts,):
                _fail(f"{name} must be a float32 tensor [{experts}] (per-expert quantization multiplier) for NVFP4")
        gs13, gs2 = w13_global_scale.float().contiguous(), w2_global_scale.float().contiguous()
    fix = _deinterleave_rows if gate_up_layout == "interleaved" else (lambda t: None if t is None else t.contiguous())
    return TritonMoEWeights(
        format=format,
        w13=_tile_rows(_split_halves(fix(w13))), w13_scale=_to_words(fix(s13), format),
        w2=_tile_rows(_split_halves(w2)),
        w2_scale=_to_words(s2, format),
        w13_bias=None if w13_bias is None else fix(w13_bias),
        w2_bias=None if w2_bias is None else w2_bias.contiguous(),
        w13_global_scale=gs13, w2_global_scale=gs2,
    )


def from_kernel_layout(kw: TritonMoEWeights, *, gate_up_layout: str = "interleaved") -> dict:
    """Kernel layout -> the emulation backend's keyword arguments (exact inverse of to_kernel_layout)."""
    fix = _interleave_rows if gate_up_layout == "interleaved" else (lambda t: t)
    scale_dtype = torch.uint8 if kw.format == "mxfp4" else torch.float8_e4m3fn
    s13 = _from_words(kw.w13_scale, kw.format, kw.hidden_size)
    s2 = _from_words(kw.w2_scale, kw.format, kw.intermediate_size)
    out = {"format": kw.format, "w13": fix(_join_halves(_untile_rows(kw.w13))), "w13_scale": fix(s13).view(scale_dtype),
           "w2": _join_halves(_untile_rows(kw.w2)), "w2_scale": s2.view(scale_dtype),
           "w13_bias": None if kw.w13_bias is None else fix(kw.w13_bias), "w2_bias": kw.w2_bias,
           "gate_up_layout": gate_up_layout}
    if kw.format == "nvfp4":
        out["w13_global_scale"] = kw.w13_global_scale
        out["w2_global_scale"] = kw.w2_global_scale
    return out


# ---------------------------------------------------------------------------------------------
# The converter the rules name (backends.layouts.triton_moe:converter), on MoEWeights / KernelWeights
# ---------------------------------------------------------------------------------------------

_KERNEL_TENSORS = ("w13", "w13_scale", "w2", "w2_scale", "w13_bias", "w2_bias", "w13_global_scale", "w2_global_scale")
#: The W4A8 tensors (w4a8_row_data) that FP8 dots read.
W4A8_TENSORS = ("w13_row_exp", "w2_row_exp", "w13_fp8", "w2_fp8", "w13_lut_code", "w2_lut_code")


class TritonMoELayout(Layout):
    """MoEWeights (padded to multiples of 64 by `Layout`) <-> the kernel layout above; invert is exact."""

    layout = "triton_moe"
    formats = FORMATS

    def _check_sizes(self, w: MoEWeights, hidden: int, inter: int) -> None:
        for what, value in (("hidden_size", hidden), ("intermediate_size", inter)):
            require_multiple(self.layout, what, value, SIZE_ALIGNMENT, "the kernels read K in 64-wide nibble groups")

    def _to_kernel(self, w: MoEWeights, hidden: int, inter: int):
        if kernels.enabled(w.w13):  # padding and the [gate; up] order read in place by the kernel
            side = kernels.padded_side_tensors(w, hidden, inter, "gate_up", scales=False)
            words = _scale_words_fast(w, hidden, inter)
            tensors = {
                "w13": _tile_rows(_split_halves_fast(w.w13, 2 * inter, hidden,
                                                     kernels.w13_rows(w.gate_up, "gate_up", w.I, inter))),
                "w13_scale": words["w13_scale"],
                "w2": _tile_rows(_split_halves_fast(w.w2, hidden, inter, kernels.plain_rows(w.H, hidden))),
                "w2_scale": words["w2_scale"],
                "w13_bias": side["w13_bias"], "w2_bias": side["w2_bias"],
                "w13_global_scale": None if w.w13_global_scale is None else w.w13_global_scale.float().contiguous(),
                "w2_global_scale": None if w.w2_global_scale is None else w.w2_global_scale.float().contiguous()}
            return {name: t for name, t in tensors.items() if t is not None}, source_config(w)
        w = w.pad(hidden, inter)
        kernel = to_kernel_layout(**w.emulation_kwargs())
        tensors = {name: getattr(kernel, name) for name in _KERNEL_TENSORS if getattr(kernel, name) is not None}
        return tensors, source_config(w)  # the checkpoint's NVFP4 scalars, kept so that invert is exact

    def _from_kernel(self, kw: KernelWeights) -> MoEWeights:
        back = from_kernel_layout(triton_weights(kw), gate_up_layout=kw.gate_up)
        return self._rebuild(kw, **{name: back[name] for name in ("w13", "w13_scale", "w2", "w2_scale", "w13_bias",
                                                                  "w2_bias")})


def triton_weights(kw: KernelWeights) -> TritonMoEWeights:
    """The kernels' typed view (no copy) of the KernelWeights that `converter` wrote."""
    if not isinstance(kw, KernelWeights) or kw.layout != TritonMoELayout.layout:
        got = kw.layout if isinstance(kw, KernelWeights) else type(kw).__name__
        raise TypeError(f"triton_moe layout: expected KernelWeights in layout 'triton_moe', got {got}; convert the "
                        f"checkpoint with backends.layouts.triton_moe:converter")
    return TritonMoEWeights(format=kw.format,
                            **{name: kw.tensors.get(name) for name in (*_KERNEL_TENSORS, *W4A8_TENSORS)})


# ---------------------------------------------------------------------------------------------
# W4A8: each weight row as an FP8 E4M3 operand, decoded by two byte lookups per 8 weights
# ---------------------------------------------------------------------------------------------
#
# The W4A8 kernels multiply w8[n, k] = e4m3_rn(W[n, k] * 2^-r[n]) (formats.rebase_rows_to_e4m3). With
# W = fp4 * s (s the block scale) and v = s * 2^-r, w8 = sign(fp4) * e4m3_rn(|fp4| * v): per (row, scale block)
# there are only 8 magnitudes, one per 3-bit E2M1 magnitude code. They are a row of w4a8_lut_table (8 E4M3 bytes),
# picked by the block's LUT code (w13_lut_code / w2_lut_code, addressed like the scale words), and the kernel turns
# 8 weights into 8 E4M3 bytes with two `prmt` byte selects (the magnitude codes are the selectors) and the signs
# with bit operations. The weights are stored for that (w13_fp8 / w2_fp8, W4A8_CHUNK below).

#: K values per W4A8 chunk: 16 bytes of a row = 4 little-endian 32-bit words; word t holds A_i = value 4t + i and
#: B_i = value 16 + 4t + i (i = 0..3) of the chunk: A_i's magnitude at bits 4i..4i+2 and sign at bit 8i+7, B_i's
#: magnitude at bits 16+4i..16+4i+2 and sign at bit 8i+3. The low and high 16 bits are then the selectors of one
#: `prmt` each (A, B) once bits 3 of every nibble are masked, and the signs land on bit 7 of their byte as
#: `w & 0x80808080` (A) and `(w << 4) & 0x80808080` (B).
W4A8_CHUNK = 32
#: LUT code of a block whose products all round to 0 (v == 0 or v < 2^-13: 6 v < 2^-10, half E4M3's smallest
#: subnormal); its table row is 8 zero bytes.
W4A8_LUT_ZERO = 0
#: LUT code of a NaN block scale (E8M0 255, E4M3 0x7F / 0xFF); its table row is 8 E4M3 NaN bytes (0x7F).
W4A8_LUT_NAN = 255
#: v = (1 + m/8) * 2^E has code ((E + _LUT_EXP_BIAS) << 3) | m for E in [_LUT_EXP_MIN, _LUT_EXP_MAX]: codes 8..247.
#: E is clamped to _LUT_EXP_MAX: from v >= 2^10 on, every nonzero entry (>= 0.5 v = 512) saturates to 448 anyway.
#: Codes 1..7 and 248..254 never occur; their table rows are zeros.
_LUT_EXP_BIAS = 14
_LUT_EXP_MIN = -13
_LUT_EXP_MAX = 16


def w4a8_lut_codes(scale_bytes: torch.Tensor, fmt: str, row_exp: torch.Tensor) -> torch.Tensor:
    """LUT code (uint8 [..., rows, K/B]) of v = |s| * 2^-r for each block scale byte s of [..., rows, K/B] (E8M0
    for MXFP4, E4M3 for NVFP4) and row exponent r [..., rows]. A negative NVFP4 scale's sign goes to the weights'
    sign bits instead (w4a8_rows), so the table holds magnitudes only."""
    if fmt == "mxfp4":
        s = formats.decode_e8m0(scale_bytes)
    else:
        s = scale_bytes.view(torch.float8_e4m3fn).float()
    nan = torch.isnan(s)
    # |s| = mantissa * 2^exponent exactly (frexp of a float32; no pow: CUDA's is not exact at every power of two),
    # and v = |s| * 2^-r only moves the exponent (2^-r spans 2^+-160, beyond float32)
    mantissa, exponent = torch.frexp(s.abs())  # mantissa in [0.5, 1)
    eighths = mantissa * 16 - 8  # v = (1 + eighths/8) * 2^(exponent - 1 - r)
    m = eighths.round()
    nonzero = (s != 0) & ~nan
    if bool((nonzero & (m != eighths)).any()):
        _fail("W4A8 LUT codes: a block scale has more than 3 mantissa bits; the scales must be E8M0 (MXFP4) or E4M3 "
              "(NVFP4) bytes")
    e = (exponent.to(torch.int64) - 1 - row_exp.to(torch.int64).unsqueeze(-1)).clamp(max=_LUT_EXP_MAX)
    code = ((e + _LUT_EXP_BIAS) << 3) | m.to(torch.int64)
    code = torch.where(nonzero & (e >= _LUT_EXP_MIN), code, W4A8_LUT_ZERO)
    return torch.where(nan, W4A8_LUT_NAN, code).to(torch.uint8)


def _lut_code_values() -> torch.Tensor:
    """v of every LUT code (float64 [256]); 0 for the zero code and the unused ones, NaN for W4A8_LUT_NAN."""
    code = torch.arange(256, dtype=torch.int64)
    exponent = (code >> 3) - _LUT_EXP_BIAS
    v = (1 + (code & 7).double() / 8) * torch.pow(2.0, exponent.double())
    used = (code >= (_LUT_EXP_MIN + _LUT_EXP_BIAS) << 3) & (code < (_LUT_EXP_MAX + _LUT_EXP_BIAS + 1) << 3)
    v = torch.where(used, v, 0.0)
    return torch.where(code == W4A8_LUT_NAN, float("nan"), v)


@functools.lru_cache(maxsize=8)
def _lut_table(device: torch.device) -> torch.Tensor:
    magnitudes = formats.decode_fp4(torch.arange(8, dtype=torch.uint8)).double()  # 0, 0.5, 1, 1.5, 2, 3, 4, 6
    values = formats.e4m3_rn(magnitudes[None, :] * _lut_code_values()[:, None])  # exact in fp32: <= 6 bits
    entries = values.to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int64)  # [256, 8]; NaN row 0x7F
    shifts = 8 * torch.arange(4, dtype=torch.int64)
    words = (entries.reshape(256, 2, 4) << shifts).sum(dim=-1)  # little-endian; < 2^31: no byte has bit 7 set
    return words.to(torch.int32).to(device)


def w4a8_lut_table(device: torch.device | str) -> torch.Tensor:
    """The W4A8 decode table, int32 [256, 2] (one per device, cached: do not modify it): row c holds the E4M3
    bytes t_j = e4m3_rn(MAG[j] * v(c)) of the 8 E2M1 magnitudes MAG = (0, 0.5, 1, 1.5, 2, 3, 4, 6), word 0 =
    t0 | t1 << 8 | t2 << 16 | t3 << 24, word 1 = t4..t7 (a `prmt` pair's two source registers). Code
    W4A8_LUT_ZERO and the unused codes 1..7, 248..254: zeros; W4A8_LUT_NAN: 0x7F (E4M3 NaN)."""
    return _lut_table(torch.device(device))


def _w4a8_bytes(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] E2M1 codes (uint8 0..15, K % W4A8_CHUNK == 0) -> [..., K/2] bytes in the W4A8 order (W4A8_CHUNK),
    before the row tiling."""
    k = codes.shape[-1]
    c = codes.to(torch.int64).reshape(*codes.shape[:-1], k // W4A8_CHUNK, 2, 4, 4)  # [chunk, A/B, t, i]
    a, b = c[..., 0, :, :], c[..., 1, :, :]
    i = torch.arange(4, dtype=torch.int64, device=codes.device)
    parts = ((a & 7) << (4 * i)) | ((a >> 3) << (8 * i + 7)) | ((b & 7) << (16 + 4 * i)) | ((b >> 3) << (8 * i + 3))
    word = parts.sum(dim=-1)  # the parts' bits are disjoint
    out = torch.stack([(word >> (8 * j)) & 0xFF for j in range(4)], dim=-1)  # [chunk, t, byte]
    return out.to(torch.uint8).reshape(*codes.shape[:-1], k // 2)


def decode_w4a8(fp8_words: torch.Tensor, lut_codes: torch.Tensor, table: torch.Tensor, fmt: str, k: int
                ) -> torch.Tensor:
    """The E4M3 weight operand the W4A8 kernels multiply (float32 [E, rows, K], without the row's 2^r), decoded
    from w13_fp8 / w2_fp8 (uint8 [E, rows, K/2], tiled), w13_lut_code / w2_lut_code (int32 scale-word layout) and
    w4a8_lut_table as the kernel's `prmt` does: A byte i of word t = lut_byte(LUT_A, (w >> 4i) & 7) | bit 8i+7 << 7,
    B byte i = lut_byte(LUT_B, (w >> 16+4i) & 7) | bit 8i+3 << 7; LUT_A / LUT_B the table rows of the scale blocks
    of the chunk's two halves (MXFP4: the same block; NVFP4: blocks 2c and 2c+1). The reference of the layout."""
    if fmt not in FORMATS:
        _fail(f"decode_w4a8: fmt={fmt!r} must be one of {FORMATS}")
    if fp8_words.dtype != torch.uint8 or fp8_words.dim() != 3 or fp8_words.shape[-1] * 2 != k:
        _fail(f"decode_w4a8: fp8_words must be uint8 [E, rows, {k // 2}] (w13_fp8 / w2_fp8 for K={k}), got "
              f"{fp8_words.dtype} {tuple(fp8_words.shape)}")
    experts, rows, _ = fp8_words.shape
    raw = _untile_rows(fp8_words).to(torch.int64).reshape(experts, rows, k // W4A8_CHUNK, 4, 4)  # [chunk, t, byte]
    word = (raw << (8 * torch.arange(4, dtype=torch.int64, device=raw.device))).sum(dim=-1)[..., None]
    codes = _from_words(lut_codes, fmt, k).to(torch.int64)  # [E, rows, K/B]
    code_a, code_b = (codes, codes) if fmt == "mxfp4" else (codes[..., 0::2], codes[..., 1::2])
    entries = table.to(device=raw.device, dtype=torch.int64)
    lut = torch.stack([(entries[:, j // 4] >> (8 * (j % 4))) & 0xFF for j in range(8)], dim=-1).reshape(-1)
    i = torch.arange(4, dtype=torch.int64, device=raw.device)
    byte_a = lut[code_a[..., None, None] * 8 + ((word >> (4 * i)) & 7)] | (((word >> (8 * i + 7)) & 1) << 7)
    byte_b = lut[code_b[..., None, None] * 8 + ((word >> (16 + 4 * i)) & 7)] | (((word >> (8 * i + 3)) & 1) << 7)
    out = torch.stack([byte_a, byte_b], dim=-3).to(torch.uint8)  # [E, rows, chunk, A/B, t, i]
    return out.reshape(experts, rows, k).view(torch.float8_e4m3fn).float()


def w4a8_rows(packed: torch.Tensor, scale_bytes: torch.Tensor, fmt: str):
    """Weight rows' (row exponents int32 [rows], W4A8 bytes uint8 [rows, K/2] untiled, LUT codes uint8 [rows, K/B])
    from their checkpoint-order bytes [rows, K/2] and scale bytes [rows, K/B] (uint8): per row, so any rows (an
    expert's here, the warp-specialized kernels' order in backends.triton_moe.warp_specialized)."""
    if fmt == "mxfp4":
        w = formats.dequantize_mxfp4(packed, scale_bytes)
    else:
        w = formats.dequantize_nvfp4(packed, scale_bytes.view(torch.float8_e4m3fn), 1.0)
    r = formats.fp8_row_rebase_exponent(w.abs().amax(dim=-1))
    codes = formats.unpack_fp4(packed)
    if fmt == "nvfp4":  # a negative scale flips its block's signs (-0 included): the table holds |s| only
        codes = codes ^ ((scale_bytes >> 7) << 3).repeat_interleave(SCALE_BLOCK[fmt], dim=-1)
    return r, _w4a8_bytes(codes), w4a8_lut_codes(scale_bytes, fmt, r)


def _row_data(words: torch.Tensor, scale_words: torch.Tensor, fmt: str, k: int):
    """One weight tensor's (row exponents int32 [E, rows], W4A8 bytes uint8 [E, rows, K/2] tiled, LUT code words
    int32 like scale_words), expert by expert (a dequantized expert is [rows, K] fp32; the whole layer at once
    would not fit)."""
    experts, rows = words.shape[0], words.shape[1]
    if words.device.type == "meta" or experts == 0:
        make = torch.empty if words.device.type == "meta" else torch.zeros
        return (make((experts, rows), dtype=torch.int32, device=words.device),
                make(words.shape, dtype=torch.uint8, device=words.device),
                make(scale_words.shape, dtype=torch.int32, device=words.device))
    exps, fp8, lut = [], [], []
    for e in range(experts):
        packed = _join_halves(_untile_rows(words[e:e + 1]))[0]
        r, stored, codes = w4a8_rows(packed, _from_words(scale_words[e:e + 1], fmt, k)[0], fmt)
        exps.append(r)
        fp8.append(_tile_rows(stored[None])[0])
        lut.append(_to_words(codes[None], fmt)[0])
    return torch.stack(exps), torch.stack(fp8), torch.stack(lut)


def w4a8_row_data(w: TritonMoEWeights) -> dict:
    """The W4A8 kernels' tensors (backends.formats.rebase_rows_to_e4m3 in kernel form), per weight tensor
    (w13: K = H, w2: K = I): *_row_exp int32 [E, rows], r = ceil(log2(max |W[row]| / 448)) of each kernel-layout
    row (W without the NVFP4 global scale); *_fp8 uint8 [E, rows, K/2], the E2M1 codes in the W4A8 order
    (W4A8_CHUNK) and the W4A16 row tiling; *_lut_code int32, each (row, scale block)'s w4a8_lut_codes in the
    scale words' layout. decode_w4a8 of them is e4m3_rn(W * 2^-r), bit for bit."""
    r13, f13, c13 = _row_data(w.w13, w.w13_scale, w.format, w.hidden_size)
    r2, f2, c2 = _row_data(w.w2, w.w2_scale, w.format, w.intermediate_size)
    return {"w13_row_exp": r13, "w2_row_exp": r2, "w13_fp8": f13, "w2_fp8": f2, "w13_lut_code": c13,
            "w2_lut_code": c2}


def w4a8_tensor_specs(w: TritonMoEWeights) -> dict:
    """name -> (dtype, shape) of the W4A8 tensors that go with w's W4A16 tensors."""
    experts, hidden, inter, chunk = w.num_experts, w.hidden_size, w.intermediate_size, SCALE_CHUNK[w.format]
    return {"w13_row_exp": (torch.int32, (experts, 2 * inter)), "w2_row_exp": (torch.int32, (experts, hidden)),
            "w13_fp8": (torch.uint8, (experts, 2 * inter, hidden // 2)),
            "w2_fp8": (torch.uint8, (experts, hidden, inter // 2)),
            "w13_lut_code": (torch.int32, (experts, -(-hidden // chunk), 2 * inter)),
            "w2_lut_code": (torch.int32, (experts, -(-inter // chunk), hidden))}


def given_w4a8_tensors(w: TritonMoEWeights) -> dict | None:
    """w's own W4A8 tensors (w4a8_row_data), checked as the kernels address them (the *_fp8 bytes contiguous, the
    others with unit inner stride, all on w13's device); None when it has none. Some but not all, or one of the
    wrong dtype, shape, stride or device: one ValueError naming the tensor and the fix."""
    given = {name: getattr(w, name) for name in W4A8_TENSORS}
    if all(t is None for t in given.values()):
        return None
    fix = "build them with backends.layouts.triton_moe.w4a8_row_data (or leave all W4A8 tensors out)"
    for name, (dtype, shape) in w4a8_tensor_specs(w).items():
        t = given[name]
        if not isinstance(t, torch.Tensor) or t.dtype != dtype or tuple(t.shape) != shape or t.device != w.device:
            got = f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
            _fail(f"weights.{name} must be {dtype} of shape {shape} on {w.device}, got {got}; {fix}")
        if (not t.is_contiguous()) if name.endswith("_fp8") else t.stride(-1) != 1:
            _fail(f"weights.{name} has strides {t.stride()}: the kernels need "
                  f"{'a contiguous tensor' if name.endswith('_fp8') else 'unit stride in the last dimension'}; "
                  f"pass weights.{name}.contiguous()")
    return given


#: converter of backend TRITON_MOE in the moe-oracle rules (profile moe-oracle)
converter = TritonMoELayout()
#: converter of TRITON_MOE_W4A8: the same converter, since W4A8 runs the W4A16 kernels on either format (a call that
#: forces FP8 dots computes their row data once, backends.triton_moe.forward._w4a8_data)
converter_w4a8 = converter
