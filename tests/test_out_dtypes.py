"""float16 and bfloat16 outputs: the oracle's certified roundings, the error model's
allowance for them, the refusal of values beyond their range, and the one correct
rounding the controls' base performs (torch's own float64 cast rounds twice)."""

import math

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from conformance import boundary as B
from conformance import strategies as S
from conformance.cases import Case, expected
from conformance.controls import Flaws, _round
from conformance.judge import cast_overflow
from oracle import exact as ex
from oracle import gdpo
from spec import error_model as em

FORMATS = ("float64", "float32", "float16", "bfloat16")
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _round_independent(x: mpmath.mpf, fmt: str) -> float:
    """Round-to-nearest-even of an mpf into ``fmt`` with mpmath's own nint (not the
    oracle's routine): a fixed-point grid below the smallest normal, p bits above."""
    p, emin, emax = em.FORMATS[fmt]
    if x == 0:
        return 0.0
    e = max(int(mpmath.floor(mpmath.log(abs(x), 2))), emin)
    # floor(log2) at 200 bits can be off by one right at a power of two: correct it
    while abs(x) >= mpmath.mpf(2) ** (e + 1):
        e += 1
    while e > emin and abs(x) < mpmath.mpf(2) ** e:
        e -= 1
    step = mpmath.mpf(2) ** (e - p + 1)
    r = mpmath.nint(x / step) * step
    if abs(r) >= mpmath.mpf(2) ** (emax + 1):
        return math.copysign(math.inf, float(x))
    return float(r)


def test_round_mpf_float16_and_bfloat16_edges():
    two = mpmath.mpf(2)
    assert ex.round_mpf((two ** -24)._mpf_, "float16") == 2.0 ** -24  # the smallest subnormal
    assert ex.round_mpf((two ** -25)._mpf_, "float16") == 0.0  # half of it: a tie to even zero
    assert ex.round_mpf((two ** -25 * mpmath.mpf(1.0000001))._mpf_, "float16") == 2.0 ** -24
    assert math.copysign(1, ex.round_mpf((-two ** -26)._mpf_, "float16")) == -1  # a signed zero
    assert ex.round_mpf(mpmath.mpf(65519.99)._mpf_, "float16") == 65504.0
    assert ex.round_mpf(mpmath.mpf(65520)._mpf_, "float16") == math.inf  # the overflow midpoint ties up
    assert ex.round_mpf((two ** -133)._mpf_, "bfloat16") == 2.0 ** -133  # bfloat16's smallest subnormal
    assert ex.round_mpf((mpmath.mpf(float.fromhex("0x1.ffp+127")))._mpf_, "bfloat16") == math.inf
    assert ex.round_mpf((mpmath.mpf(1) + two ** -8)._mpf_, "bfloat16") == 1.0  # tie to even
    with mpmath.workprec(100):
        above = mpmath.mpf(1) + two ** -8 + two ** -60
    assert ex.round_mpf(above._mpf_, "bfloat16") == 1.0 + 2.0 ** -7


@given(B.near_midpoint_cases(S.Context()))
def test_oracle_rounds_once_where_a_double_rounding_differs(case):
    """Cases aimed just off a rounding midpoint: the oracle's float16/bfloat16 (and float32)
    value is the independent single rounding of the exact advantage, and for float16 and
    bfloat16 a rounding through float32 first is a different, wrong value."""
    out = case.out_dtype
    res = expected(case).result
    n = case.n
    col = case.rewards_array()[:, 0]
    at = int(np.flatnonzero(col)[0])
    a0, a1 = B.outlier_advantages(float(col[at]), n, 1e-4 if case.eps is None else case.eps)
    exact = [a1] * n
    exact[at] = a0
    for i in range(n):
        for fmt in FORMATS:
            assert res.rounded(fmt)[i] == _round_independent(exact[i], fmt), (fmt, i, case.dumps())
    mid = float.fromhex(case.note.split(":")[3])
    near = int(np.argmin(np.abs(np.abs(res.float64) - mid)))
    if out in TORCH:
        twice = em.round_to(res.float32[near:near + 1], out)[0]
        assert twice != res.rounded(out)[near]
        assert abs(twice - res.float64[near]) > res.allowed(out)[near]  # the model rejects it
    assert abs(res.rounded(out)[near] - res.float64[near]) <= res.allowed(out)[near]


@given(S.cases(S.Context(), k_max=3))
def test_the_correct_rounding_is_always_allowed(case):
    """A correct answer is never rejected: the certified rounding of the exact value into
    every format lies within that format's allowance (a finite one, or a refusal)."""
    res = expected(case).result
    if res is None:
        return
    for fmt in FORMATS:
        ref = res.rounded(fmt)
        ok = np.isfinite(ref) & np.isfinite(res.float64)
        err = np.abs(ref - res.float64)
        allowed = res.allowed(fmt)
        assert np.all(err[ok] <= allowed[ok]), (fmt, case.dumps())
        assert np.all(res.overflows(fmt) == (~np.isfinite(ref) & np.isfinite(res.float64)))


def test_values_beyond_float16_are_a_refusal():
    """multireward_grpo does not whiten (a = c) and standardizes with ddof 0: a group [0, 1]
    gives z = -+1, weight 1e5 puts |a| beyond float16's 65504, so float16 output must be
    refused; float32 computes the same batch."""
    r = np.array([[0.0], [1.0], [1.0], [0.0]])
    res = gdpo.gdpo_advantages(r, [0, 0, 1, 1], weights=[1e5], convention="multireward_grpo")
    assert np.all(np.abs(res.float64) > em.overflow_threshold("float16"))
    assert np.all(res.overflows("float16")) and not np.any(res.overflows("float32"))
    assert np.all(np.isinf(res.float16)) and np.all(np.isfinite(res.bfloat16))
    assert cast_overflow(res, "float16") == (True, True)
    assert cast_overflow(res, "float32") == (False, False)
    spec = gdpo.gdpo_advantages(r, [0, 0, 1, 1], weights=[1e5])  # |a| <= (n - 1)/sqrt(n): never near 65504
    assert cast_overflow(spec, "float16") == (False, False)


def test_rounding_near_the_float16_overflow_may_be_refused():
    """Where a correct float64 value may reach 65520 the refusal is permitted, not required."""
    v = np.array([em.overflow_threshold("float16") * (1 - 2.0 ** -40), 0.0])
    stage = gdpo.whiten(v, convention="multireward_grpo")  # whiten none: a = v exactly
    assert stage.float16[0] == 65504.0  # rounds down, but only just
    must, may = cast_overflow(stage, "float16")
    assert not must and not may  # Δ = 0 (the value passes through exactly): no float64 error to reach it
    huge = gdpo.whiten(np.array([70000.0, 0.0]), convention="multireward_grpo")
    assert cast_overflow(huge, "float16") == (True, True)


def _midpoints(fmt: str, count: int, rng) -> np.ndarray:
    p, emin, _ = em.FORMATS[fmt]
    e = rng.integers(emin - p + 1, 5, count)  # subnormal bottom to 2^5
    m = rng.integers(1 << (p - 1), 1 << p, count)
    return (m + 0.5) * np.ldexp(1.0, np.maximum(e, emin) - p + 1)


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_controls_base_rounds_once_and_its_flaws_do_not(fmt):
    rng = np.random.default_rng(11)
    mids = _midpoints(fmt, 4000, rng)
    x = np.concatenate([mids * (1 + 2.0 ** -35), mids * (1 - 2.0 ** -35), mids, -mids * (1 + 2.0 ** -40),
                        rng.standard_normal(4000) * 10.0 ** rng.integers(-40, 5, 4000), [0.0, -0.0, 70000.0]])
    t = torch.tensor(x)
    right = em.round_to(x, fmt)
    base = _round(t, TORCH[fmt], Flaws()).double().numpy()
    assert np.array_equal(base, right) and np.array_equal(np.signbit(base), np.signbit(right))
    twice = _round(t, TORCH[fmt], Flaws(double_rounding=True)).double().numpy()
    assert np.sum(twice != right) >= 1000  # off a midpoint by less than a float32 half ulp: half go wrong
    assert np.array_equal(twice, t.to(TORCH[fmt]).double().numpy())  # what torch's own cast does
    if fmt == "bfloat16":
        trunc = _round(t, TORCH[fmt], Flaws(truncate_bfloat16=True)).double().numpy()
        fin = np.isfinite(right)
        assert np.all(np.abs(trunc[fin]) <= np.abs(x[fin]))  # toward zero
        assert np.sum(trunc != right) >= 4000


def test_case_grades_every_out_dtype():
    from conformance.cases import OUT_DTYPES

    assert set(OUT_DTYPES) == set(FORMATS) == set(S.Context().out_dtypes)
    c = Case(rewards=((1.0,), (0.0,)), dtype="float64", group_size=2, out_dtype="bfloat16")
    assert Case.from_json(c.to_json()).out_dtype == "bfloat16"
