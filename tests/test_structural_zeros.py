"""Structural exact zeros (spec 7) are exactly those the specification lists.

A group whose two contributing columns cancel with weights of equal magnitude is a
structural zero (demanded bit for bit) only when the columns are equal up to shift and
sign: the shift-invariant algorithm then rounds both alike. At eps = 0 z is
scale-invariant, so affinely related columns (r2 = k r1 + b) cancel exactly too, but a
correct float64 code rounds them differently: that zero is held to the error bound (at
Eq. 6 the normalisation's own, sqrt(n - 1)), not demanded.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import oracle.gdpo as O
from conformance import properties as P
from conformance.cases import Case
from conformance.subject import Subject

IMPL = Subject("impl.gdpo:gdpo_advantages", "gdpo", "spec")

# (rewards, group size, weights, eps): exact cancellation that is NOT structural
AFFINE = [
    # r2 = -3 r1: scale-invariant z cancels exactly at eps = 0; impl's c is ~1e-16, whitened to O(1)
    (((0.0, 0.0), (1.0, -3.0), (3.0, -9.0)), 3, None, 0.0),
    # n = 2 at eps = 0: z = -+1/sqrt(2) whatever the two values, so any two columns cancel
    (((0.300000000001819, 2.3), (2.3, 0.3)), 2, None, 0.0),
]

# equal up to shift and sign with weights of equal magnitude: structural at any eps
SHIFT_AND_SIGN = [
    (((0.0, 5.0), (1.0, 4.0), (3.0, 2.0)), 3, None, 1e-4),  # r2 = 5 - r1, weights (1, 1)
    (((0.125, 7.125), (1.75, 8.75), (3.25, 10.25), (2.0, 9.0)), 4, (0.5, -0.5), 1e-4),  # r2 = r1 + 7 exactly
    (((0.0, 5.0), (1.0, 4.0), (3.0, 2.0)), 3, None, 0.0),  # eps = 0, still structural
]


def _oracle(rows, n, weights, eps):
    r = np.array(rows, dtype=np.float64)
    return O.gdpo_advantages(r, np.arange(len(rows)) // n, weights=weights, eps=eps)


def _case(rows, n, weights, eps):
    return Case(rewards=tuple(tuple(float(v) for v in row) for row in rows), dtype="float64",
                out_dtype="float64", group_size=n, weights=weights, eps=eps)


@pytest.mark.parametrize("rows,n,weights,eps", AFFINE)
def test_affine_cancellation_at_eps0_is_not_structural(rows, n, weights, eps):
    res = _oracle(rows, n, weights, eps)
    assert res.group_cancelled.all() and res.combined.exact_zero.all()  # the exact c is 0 ...
    assert not res.combined.required_zero.any()  # ... but not bit for bit
    assert not res.required_zero.any()
    allowed = res.allowed("float64")
    # the normalisation's own bound at eps = 0: sqrt(n - 1), finite and positive
    assert np.all(np.isfinite(allowed)) and np.all(allowed > 0)
    assert np.all(allowed <= math.sqrt(n - 1) * (1 + 1e-12))
    assert np.all(np.isfinite(res.cond))


@pytest.mark.parametrize("rows,n,weights,eps", AFFINE)
def test_impl_conforms_on_affine_cancellation(rows, n, weights, eps):
    P.check_values(IMPL, _case(rows, n, weights, eps))  # raises ConformanceFailure on the old oracle


@pytest.mark.parametrize("rows,n,weights,eps", SHIFT_AND_SIGN)
def test_shift_and_sign_cancellation_stays_structural(rows, n, weights, eps):
    res = _oracle(rows, n, weights, eps)
    assert res.combined.required_zero.all() and res.required_zero.all()
    assert np.all(res.allowed("float64") == 0.0) and np.all(res.float64 == 0.0)
    P.check_values(IMPL, _case(rows, n, weights, eps))


def test_scaled_columns_with_eps_do_not_cancel():
    """With eps > 0 z is not scale-invariant: r2 = 3 r1 does not cancel, nothing is demanded."""
    res = _oracle(((0.0, 0.0), (1.0, 3.0), (3.0, 9.0)), 3, (1.0, -1.0), 1e-4)
    assert not res.group_cancelled.any() and not res.combined.required_zero.any()


def test_cond_finite_at_zero_denominator_near_float16_max():
    """Spec 7: at a zero denominator cond is Samuelson's bound (n - 1)/sqrt(n), never NaN.
    Column 65504.001, 65505, 65504.001 in one group and a constant in the other, weight -1,
    eps = 5e-324: c is exactly equal within the unit only up to eps's share."""
    r = np.array([[65504.001], [65505.], [65504.001], [65504.], [65504.], [65504.]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no overflow on the way
        res = O.gdpo_advantages(r, [1, 1, 1, 0, 0, 0], weights=[-1.0], eps=5e-324)
    assert np.all(np.isfinite(res.cond)) and np.all(res.cond >= 0)
    assert np.allclose(res.z.cond[3:], 2 / math.sqrt(3))  # the collapsed column: (n - 1)/sqrt(n)
    assert np.all(np.isfinite(res.allowed("float64")))


def test_cond_finite_at_collapsed_unit_with_tiny_eps():
    """Three weighted copies of one column cancel (not structural) and eps = 5e-324: the
    unit's std is zero and its first-order cond an ulp over eps; Samuelson's bound caps it."""
    r = np.array([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [3.0, 3.0, 3.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        res = O.gdpo_advantages(r, [0, 0, 0], weights=[1.0, 1.0, -2.0], eps=5e-324)
    assert res.unit_collapsed.all() and not res.required_zero.any()
    assert np.allclose(res.cond, 2 / math.sqrt(3))  # (n - 1)/sqrt(n), n = 3
    assert np.all(np.isfinite(res.allowed("float64")))
