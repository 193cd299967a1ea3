"""Meta-tests of the oracle: is the certified result really the correctly rounded exact value?

The independent evaluation uses mpmath's high-level ``mp`` context at 1,200 bits
with the formulas written the plain way, and mpmath's own ``normalize`` for the
rounding (the oracle uses intervals and its own rounding routine).
"""

import math

import mpmath
import numpy as np
import pytest
from hypothesis import example, given, strategies as st
from mpmath import libmp

from oracle import exact as ex
from oracle import gdpo
from spec import DEFAULT_EPS

PREC = 1200
TINY = mpmath.mpf(2) ** -1100  # relative to a stage's scale: 100 bits above the 1200-bit residue of a true zero


def _independent(rewards, groups, weights, units, eps=DEFAULT_EPS):
    ctx = mpmath.MPContext()
    ctx.prec = PREC
    r = [[ctx.mpf(float(x)) for x in row] for row in rewards]
    N, K = len(r), len(r[0])
    e = ctx.mpf(eps)
    z = [[ctx.mpf(0)] * K for _ in range(N)]
    for g in set(groups):
        idx = [i for i in range(N) if groups[i] == g]
        n = len(idx)
        for k in range(K):
            m = ctx.fsum(r[i][k] for i in idx) / n
            sd = ctx.sqrt(ctx.fsum((r[i][k] - m) ** 2 for i in idx) / (n - 1))
            for i in idx:
                z[i][k] = (r[i][k] - m) / (sd + e)
    c = [ctx.fsum(ctx.mpf(float(w)) * z[i][k] for k, w in enumerate(weights)) for i in range(N)]
    a = [ctx.mpf(0)] * N
    for u in set(units):
        idx = [i for i in range(N) if units[i] == u]
        n = len(idx)
        m = ctx.fsum(c[i] for i in idx) / n
        sd = ctx.sqrt(ctx.fsum((c[i] - m) ** 2 for i in idx) / (n - 1))
        for i in idx:
            a[i] = (c[i] - m) / (sd + e)
    return z, c, a


def _round(x, bits):
    """Round-to-nearest of an mpf to ``bits`` significant bits (normal range only)."""
    v = x._mpf_
    if v == libmp.fzero:
        return 0.0
    return float(mpmath.mpf(libmp.normalize(v[0], v[1], v[2], v[3], bits, libmp.round_nearest)))


def _round_format(x, fmt):
    """Round-to-nearest-even of an mpf into an IEEE format with subnormals and overflow:
    the grid of spacing 2^(max(e, emin) - p + 1), with mpmath's own nint."""
    p, emin, emax = {"float16": (11, -14, 15), "bfloat16": (8, -126, 127)}[fmt]
    if x == 0:
        return 0.0
    m, e = mpmath.frexp(x)  # |x| = |m| 2^e, 1/2 <= |m| < 1
    step = mpmath.ldexp(mpmath.mpf(1), max(int(e) - 1, emin) - p + 1)
    r = mpmath.nint(x / step) * step
    return math.copysign(math.inf, float(x)) if abs(r) >= mpmath.ldexp(mpmath.mpf(1), emax + 1) else float(r)


def _check(res, z, c, a):
    for got, zero, vals in ((res.float64, res.exact_zero, a), (res.combined.float64, res.combined.exact_zero, c)):
        # a true zero evaluates to about 2^-1200 of the scale of its parts, which is O(1) here
        # (z, c and a are dimensionless, weights at most 3); a true nonzero far above. Not the
        # stage's own largest value: a stage of true zeros only has none (found by this test:
        # two groups of constant-sum columns [1, 0] / [0.5, 0.5], each whitened alone)
        tiny = TINY * max(max(abs(x) for x in vals), mpmath.mpf(1))
        for i, x in enumerate(vals):
            if zero[i]:
                assert abs(x) < tiny, f"oracle says exact zero, independent value {x}"
                assert got[i] == 0
            else:
                assert abs(x) > tiny, f"oracle says nonzero, independent value {x}"
                assert got[i] == _round(x, 53)
    for i, x in enumerate(a):
        if abs(x) > 2.0 ** -120 or x == 0:
            assert float(res.float32[i]) == _round(x, 24)
        assert float(res.float16[i]) == _round_format(x, "float16")  # a true zero's ~2^-1200 rounds to 0
        assert float(res.bfloat16[i]) == _round_format(x, "bfloat16")
    for i, row in enumerate(z):
        for k, x in enumerate(row):
            assert res.z.float64[i, k] == (0.0 if res.z.exact_zero[i, k] else _round(x, 53))


values = st.one_of(
    st.integers(-3, 3).map(float),
    st.floats(-1e3, 1e3, allow_nan=False, allow_subnormal=False),
    st.sampled_from([1e9, 1e13, 2.0 ** 52]).flatmap(lambda C: st.floats(C - 4, C + 4)),
)


@st.composite
def batches(draw):
    K = draw(st.integers(1, 3))
    sizes = draw(st.lists(st.integers(2, 5), min_size=1, max_size=3))
    rows = []
    groups = []
    for g, n in enumerate(sizes):
        col_kind = draw(st.lists(st.sampled_from(["free", "const", "sum"]), min_size=K, max_size=K))
        block = [[draw(values) for _ in range(K)] for _ in range(n)]
        for k, kind in enumerate(col_kind):
            if kind == "const":
                for row in block:
                    row[k] = block[0][k]
            elif kind == "sum" and k > 0:  # exact constant-sum partner of column 0
                C = draw(st.sampled_from([1.0, 1e6, 2.0 ** 40]))
                for row in block:
                    row[0] = C - abs(row[0]) % 1.0
                    row[k] = C - row[0]
        rows += block
        groups += [g] * n
    weights = draw(st.lists(st.sampled_from([1.0, 1.0, 0.5, 2.0, -1.0, 3.0]), min_size=K, max_size=K))
    if not any(weights):
        weights[0] = 1.0
    units = [0] * len(rows) if draw(st.booleans()) or len(sizes) < 2 else [g % 2 for g in groups]
    return np.array(rows), groups, weights, units


@given(batches())
@example((np.array([[0.0, 0.0]] * 5 + [[1.0, 0.0]] * 3 + [[0.5, 0.5], [1.0, 0.0]]), [0] * 5 + [1] * 5,
          [1.0, 1.0], [0] * 5 + [1] * 5))  # every c and a a true zero
@example((np.array([[1e15 - 0.1, 0.1], [1e15 - 0.2, 0.2], [1e15 - 0.3, 0.3], [1e15 - 0.7, 0.7]]),
          [0, 0, 0, 0], [1.0, 1.0], [0, 0, 0, 0]))
def test_certified_results_match_an_independent_evaluation(batch):
    r, groups, weights, units = batch
    if any(sum(1 for u in units if u == v) < 2 for v in set(units)):
        units = [0] * len(units)
    res = gdpo.gdpo_advantages(r, groups, weights=weights, unit_ids=units)
    _check(res, *_independent(r, groups, weights, units))


@pytest.mark.parametrize("C", [1e3, 1e9, 1e15])
def test_near_exact_cancellation_is_not_called_zero(C):
    d = np.array([0.1, 0.2, 0.3, 0.7])
    r1 = C - d
    r2 = C - r1
    r2[1] = np.nextafter(r2[1], np.inf)  # one ulp away from the exact constant sum
    r = np.stack([r1, r2], 1)
    res = gdpo.gdpo_advantages(r, [0] * 4)
    assert not res.combined.exact_zero.any() and not res.unit_collapsed.any()
    _check(res, *_independent(r, [0] * 4, [1.0, 1.0], [0] * 4))


def test_float32_is_rounded_once_from_the_exact_value():
    """verl's singleton rule gives z = r / (1 + 1e-6), a rational we can aim: pick r so
    that z is just off a float32 midpoint yet rounds to that midpoint in float64.
    Rounding through float64 then ties to even; the oracle must not."""
    eps = 1e-6
    rng = np.random.default_rng(7)
    ctx = mpmath.MPContext()
    ctx.prec = 300
    found = 0
    for _ in range(2000):
        f = np.float32(rng.uniform(1, 2))
        mid = (float(f) + float(np.nextafter(f, np.float32(3)))) / 2  # exact in float64
        r = mid * (1 + eps)
        q = ctx.mpf(r) / (1 + ctx.mpf(eps))
        if float(q) != mid or q == mid:
            continue
        res = gdpo.standardize_groups(np.array([[r]]), [0], convention="verl")
        twice = float(np.float32(res.float64[0, 0]))
        once = float(res.float32[0, 0])
        assert res.float64[0, 0] == mid
        assert once == (float(np.nextafter(f, np.float32(3))) if q > mid else float(f))
        found += once != twice
    assert found >= 5  # the construction really exercises double rounding


def test_round_mpf_subnormals_signed_zero_and_overflow():
    tiny = mpmath.mpf(2) ** -1075 * mpmath.mpf(1.5)  # between the two smallest subnormals' midpoint
    assert ex.round_mpf(tiny._mpf_, "float64") == 5e-324
    assert ex.round_mpf((-tiny)._mpf_, "float32") == 0.0
    assert math.copysign(1, ex.round_mpf((-tiny)._mpf_, "float32")) == -1
    assert ex.round_mpf(mpmath.mpf(2.0 ** 128)._mpf_, "float32") == math.inf
    fmax = mpmath.mpf(float(np.finfo(np.float32).max))
    assert ex.round_mpf((fmax + mpmath.mpf(2) ** 103)._mpf_, "float32") == math.inf  # the midpoint: ties to even
    big = fmax + mpmath.mpf(2) ** 102  # below the overflow midpoint
    assert ex.round_mpf(big._mpf_, "float32") == float(np.finfo(np.float32).max)
    assert ex.round_mpf((mpmath.mpf(2) ** -149 / 2)._mpf_, "float32") == 0.0  # tie to even: zero
    assert ex.round_mpf((mpmath.mpf(2) ** -149 * 1.5)._mpf_, "float32") == 2.0 ** -148


FLT_MAX = float(np.finfo(np.float32).max)
EXTREMES = {
    "float32_max": (np.array([[FLT_MAX]] * 10 + [[-FLT_MAX]]), [0] * 11, [1.0]),
    "beyond_float32": (np.array([[-1.7e308], [1.7e308], [1e308], [0.0]]), [0] * 4, [1.0]),
    "subnormal": (np.array([[5e-324], [1e-323], [0.0], [-5e-324]]), [0] * 4, [1.0]),
    "wide_exponents": (np.array([[1e-300, 1e300], [2e-300, -1e300], [0.0, 5.0], [1.0, 1e-300]]), [0, 0, 1, 1],
                       [1e300, 1e-300]),
    "weights_near_float64_max": (np.array([[0.0, 1.0], [1.0, 2.0], [2.0, 0.0]]), [0] * 3, [1.7e308, 1.7e308]),
}


@pytest.mark.parametrize("name", sorted(EXTREMES))
def test_extreme_magnitudes_match_the_independent_evaluation(name):
    r, g, w = EXTREMES[name]
    units = [0] * len(g)
    res = gdpo.gdpo_advantages(r, g, weights=w, unit_ids=units)
    assert np.all(np.isfinite(res.allowed("float64")))
    _check(res, *_independent(r, g, w, units))
