"""The one table of numeric tolerances used by the tests, each with the numerics that justify it.

Every comparison of two floating results in `tests/` reads its (rtol, atol) from here, so a
tolerance is argued once, next to the format it comes from, and never loosened in one test only.
"""

from __future__ import annotations

#: name -> dict(rtol=..., atol=...) suitable for ``torch.testing.assert_close(**TOLERANCES[name])``.
TOLERANCES: dict[str, dict[str, float]] = {
    # Two fp32 implementations of the same math that differ only in summation order (batched vs
    # per-token matmuls, index_add order): a few fp32 ulps of O(1..10) outputs. 1e-4 is ~1000 ulps of
    # headroom and still far below the ~1e-1 change a wrong gate/up split, clamp, bias or weight makes.
    "fp32_reordered": dict(rtol=1e-4, atol=1e-4),
    # A bf16 output of an fp32 computation: one rounding, at most half a bf16 ulp = 2^-9 relative;
    # rtol 2^-8 doubles it, atol covers outputs that cancel to near zero.
    "bf16_output_of_fp32": dict(rtol=2**-8, atol=1e-3),
    # Bit-exact: layout conversions, packing, round trips.
    "exact": dict(rtol=0.0, atol=0.0),
}


def tolerance(name: str) -> dict[str, float]:
    """The (rtol, atol) pair named `name`; a KeyError lists the known names."""
    try:
        return dict(TOLERANCES[name])
    except KeyError:
        raise KeyError(f"unknown tolerance {name!r}; known: {sorted(TOLERANCES)}") from None
