"""Hopper (SM 9.0: H100, H200, H800, H20, GH200): the architecture the kernels are tuned for."""

from backends.triton_moe.tuning.arch import ArchFacts

FACTS = ArchFacts(
    name="sm90",
    # Triton runs a dot as wgmma on Hopper when the tile has at least one warpgroup (4 warps); 1-2 warp tiles
    # run mma.sync. The kernels pick their weight byte order by this (forward._runs_wgmma).
    wgmma_min_warps=4,
    default_sm_count=132,
    sm_counts={"H100 PCIe": 114, "H100 NVL": 132, "H100": 132, "H200": 132, "H800": 132, "H20": 78, "GH200": 132},
    # From bench_moe.py --align on an H200 (route + align kernel µs, separate -> fused: E=128 T=1 4.3 -> 3.6,
    # T=4 4.0 -> 3.2, T=16 5.4 -> 5.6; E=256 T=1 5.2 -> 5.2, T=4 6.3 -> 7.1, T=16 11.4 -> 16.4; each fused launch
    # also saves a launch gap, ~1 µs): the [T, E] logits tile fits one program while small.
    route_in_align_logits=512,
    # Alignment µs one-program / multi-program / torch on an H200: 256 pairs 9.8 / 11.1 / 81; 512 pairs
    # 20.1 / 11.8; 1024: 14.8 / 9.8; 4096: 53.2 / 10.9 / 99; 32768: multi 21.7 / torch 137 (beyond: not measured;
    # each pass-2 program re-reads every chunk's histogram, which grows with the pairs squared).
    small_align_pairs=256,
    multi_align_pairs=32768,
)
