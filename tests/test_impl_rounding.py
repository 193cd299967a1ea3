"""Outputs narrower than float32 are rounded once, to nearest, from the float64 result.

torch converts a double to float16/bfloat16/float8 through float, which rounds
twice; impl._pipeline.round_to rounds to odd in float32 first, which makes the
second rounding the correct one. The reference here is exact rational arithmetic.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from impl import gdpo
from impl._pipeline import round_to

#: precision (bits, with the implicit one), smallest normal exponent, largest finite value
FORMATS = {torch.float16: (11, -14, 65504.0), torch.bfloat16: (8, -126, torch.finfo(torch.bfloat16).max)}
for _name, _p, _emin in (("float8_e4m3fn", 4, -6), ("float8_e5m2", 3, -14)):
    if hasattr(torch, _name):
        FORMATS[getattr(torch, _name)] = (_p, _emin, torch.finfo(getattr(torch, _name)).max)


def exact_round(x: float, dtype) -> float:
    """x rounded to nearest, ties to even, on the grid of ``dtype`` (no overflow handling)."""
    p, emin, _ = FORMATS[dtype]
    if x == 0.0:
        return x
    e = max(math.frexp(abs(x))[1] - 1, emin)
    q = Fraction(2) ** (e - p + 1)
    v = Fraction(x) / q
    lo = math.floor(v)
    rest = v - lo
    n = lo + (1 if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and lo % 2) else 0)
    return math.copysign(float(n * q), x)


def _values(dtype):
    p, emin, top = FORMATS[dtype]

    @st.composite
    def near_midpoints(draw):
        """Midpoints of the format's grid, nudged by a few float64 ulps (where double rounding bites)."""
        e = draw(st.integers(emin - p, math.frexp(top)[1] - 2))
        m = draw(st.integers(2 ** (p - 1), 2 ** p - 1))
        mid = math.ldexp(2 * m + 1, e - p)
        for _ in range(draw(st.integers(-3, 3)) % 7):
            mid = math.nextafter(mid, draw(st.sampled_from([0.0, math.inf])))
        return mid * draw(st.sampled_from([1.0, -1.0]))

    plain = st.floats(-top, top, allow_nan=False, allow_infinity=False)
    return st.one_of(near_midpoints(), plain)


@pytest.mark.parametrize("dtype", list(FORMATS), ids=str)
def test_round_to_is_correctly_rounded(dtype):
    @settings(max_examples=300, deadline=None)
    @given(xs=st.lists(_values(dtype), min_size=1, max_size=64))
    def check(xs):
        got = round_to(torch.tensor(xs, dtype=torch.float64), dtype).to(torch.float64).tolist()
        want = [exact_round(x, dtype) for x in xs]
        for x, g, w in zip(xs, got, want):
            assert g == w and math.copysign(1, g) == math.copysign(1, w), \
                f"{x.hex()} -> {dtype}: got {g.hex()}, correctly rounded {w.hex()}"

    check()


def test_torch_cast_rounds_twice_which_is_why_round_to_exists():
    x = torch.tensor([0.5002441480755806], dtype=torch.float64)  # just above a float16 midpoint
    assert exact_round(0.5002441480755806, torch.float16) == 0.50048828125
    assert x.to(torch.float16).item() == 0.5  # through float32: onto the midpoint, then to even
    assert round_to(x, torch.float16).item() == 0.50048828125


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_advantages_in_narrow_dtypes_are_the_float64_ones_rounded_once(dtype):
    gen = torch.Generator().manual_seed(7)
    r = torch.randn(4096, 3, generator=gen, dtype=torch.float64)
    kw = dict(group_size=8, weights=[1.0, 0.3, 2.0], segment_sizes=[1024, 3072])
    a64 = gdpo.gdpo_advantages(r, out_dtype=torch.float64, **kw)
    a = gdpo.gdpo_advantages(r, out_dtype=dtype, **kw)
    want = torch.tensor([exact_round(v, dtype) for v in a64.tolist()], dtype=torch.float64)
    assert torch.equal(a.to(torch.float64), want)
    w = gdpo.whiten(a64, segment_sizes=[1024, 3072], out_dtype=dtype)
    w64 = gdpo.whiten(a64, segment_sizes=[1024, 3072], out_dtype=torch.float64)
    assert torch.equal(w.to(torch.float64), torch.tensor([exact_round(v, dtype) for v in w64.tolist()],
                                                         dtype=torch.float64))
