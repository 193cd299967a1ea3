"""Findings of the conformance suite's deep profile (GDPO_HYPOTHESIS_PROFILE=deep), pinned.

Each test states the property the finding violated, on the smallest input that shows it;
the conformance replay of the same input lives in conformance/regressions.json.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from conformance import regressions
from conformance.subject import Subject
from conformance import properties as P
from oracle import gdpo
from spec import error_model as em

ALMOST = -float.fromhex("0x1.fffffffffffffp-127")  # -(2^-126 - 2^-179)


def _copies(tiny: bool) -> np.ndarray:
    """Column 0 constant (collapsed), columns 1 and 2 copies of one another."""
    a, b = (2.0 ** -148, 2.0 ** -149) if tiny else (1.0, 0.0)
    return np.array([[0.0, a, a], [0.0, b, b]])


@pytest.mark.parametrize("tiny", [True, False])
@pytest.mark.parametrize("w0", [2.0 ** 1022, 2.0 ** 600, 2.0, 2.0 ** -1000])
def test_bound_does_not_depend_on_the_weight_of_a_collapsed_column(w0, tiny):
    """The collapsed column contributes nothing to c, to its error or to a: the error model's
    bound must be the same whatever its weight. The oracle evaluated Eq. 7's bound in one
    frame for the batch, the largest weight's, where products 2^1074 below it underflowed
    and a sample's Δc became 0 (deep profile, testfloat property)."""
    r = _copies(tiny)
    w = [w0, 2.0 ** -126, ALMOST] if tiny else [w0, 1.0, -float.fromhex("0x1.fffffffffffffp-1")]
    ref = gdpo.gdpo_advantages(r, [0, 0], weights=[0.0] + w[1:])
    res = gdpo.gdpo_advantages(r, [0, 0], weights=w)
    assert np.array_equal(res.float64, ref.float64)
    assert np.all(res.combined.delta > 0)
    assert np.array_equal(res.combined.allowed("float64"), ref.combined.allowed("float64"))
    assert np.array_equal(res.allowed("float64"), ref.allowed("float64"))


def test_framed_combine_matches_combine_stage_where_nothing_underflows():
    rng = np.random.default_rng(0)
    dz, z = rng.uniform(0, 10, (7, 3)), rng.normal(size=(7, 3))
    w, dw = np.array([0.5, -3.0, 1e-3]), np.array([1e-16, 4e-16, 2e-19])
    for d_weights, rounding in ((None, True), (dw, False), (dw, True)):
        plain = em.combine_stage(dz, z, w, d_weights=d_weights, rounding=rounding)
        dc, frame = em.combine_stage_framed(dz, z, w, d_weights=d_weights, rounding=rounding)
        np.testing.assert_allclose(np.ldexp(dc, frame), plain, rtol=1e-14, atol=0)


def test_framed_combine_keeps_every_row_whatever_the_weights():
    """Weights 2^1023 and 2^-1074 together: no row's bound is 0, inf or NaN."""
    z = np.array([[0.0, 0.7], [0.0, -0.7], [1e-300, 0.0]])
    dz = np.array([[0.0, 5.0], [0.0, 5.0], [3.0, 0.0]])
    dc, frame = em.combine_stage_framed(dz, z, [math.ldexp(1.0, 1023), 5e-324])
    assert np.all(np.isfinite(dc)) and np.all(dc > 0)
    assert frame[0] < -1000 < frame[2]  # rows 0, 1 carry only the tiny weight's terms


def test_pinned_case_conforms():
    case = regressions.load(regressions.EXAMPLES["testfloat"][0])
    P.check_values(Subject("impl.gdpo:gdpo_advantages", "gdpo", "spec"), case)


def test_unit_frame_keeps_a_huge_delta_beside_tiny_values_finite():
    """A group whose c cancels exactly under weights 2^1000 and -2^1000 (Δc near 2^1000) in the unit
    of a group whose only live weight is 2^-1074: the unit's frame must hold both, not overflow the
    first's Δc into inf (and inf * 0 into a NaN bound) by taking the tiny values' frame."""
    r = np.array([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    with np.errstate(invalid="raise"):  # inf * 0 in the bound
        res = gdpo.gdpo_advantages(r, [0, 0, 1, 1], weights=[2.0 ** 1000, -2.0 ** 1000, 5e-324], eps=0.0)
    assert np.all(np.isfinite(res.delta)) and np.all(np.isfinite(res.allowed("float64")))


def test_impl_tiny_weight_beside_a_huge_one_on_a_collapsed_column():
    """Weights [2^-1023, 2^1000], the huge one on a collapsed column: unscaled float64 gets a exactly
    (checked here); impl.gdpo was 3.4e3 ulp off, 18.6 times the allowance, while its weight_plan
    scaled every weight by 2^-11 (deep profile, weights; fixed in impl by e964114)."""
    import torch

    case = regressions.load(regressions.EXAMPLES["weights"][-1])
    r = torch.tensor(case.rewards_array())
    z = (r - r.mean(0)) / (r.std(0) + 1e-4)  # column 1 is constant: its z is exactly 0
    c = z[:, 0] * case.weights[0] + z[:, 1] * case.weights[1]
    naive = ((c - c.mean()) / (c.std() + 1e-4)).numpy()
    res = gdpo.gdpo_advantages(case.rewards_array(), case.labels(), weights=list(case.weights))
    assert np.all(np.abs(naive - res.float64) <= res.allowed("float64"))
    P.check_values(Subject("impl.gdpo:gdpo_advantages", "gdpo", "spec"), case)


@pytest.mark.parametrize("w1", [2.0 ** 126, 1.0])
def test_bound_of_a_unit_whose_c_round_to_zero_does_not_depend_on_a_collapsed_weight(w1):
    """Only the 2^-1074 weight is live: every exact c rounds to 0 or to a subnormal. The unit's frame
    was taken from the condition estimate (large with w1 = 2^126: one ulp un-collapses column 1)
    and from c's float64 roundings (0), so the model's Δc underflowed in it and a correct 0 was
    failed (deep profile, testfloat). The model now has a frame of its own from the exact c."""
    r = np.array([[2.0 ** -23, 2.0 ** -24], [2.0 ** -15, 2.0 ** -24], [2.0 ** -24, 2.0 ** -24], [2.0 ** -24, 2.0 ** -24]])
    ref = gdpo.gdpo_advantages(r, [0, 0, 1, 1], weights=[5e-324, 0.0])
    res = gdpo.gdpo_advantages(r, [0, 0, 1, 1], weights=[5e-324, w1])
    assert np.array_equal(res.allowed("float64"), ref.allowed("float64"))
    assert np.all(res.allowed("float64") >= np.abs(res.float64))  # c = 0 (what float64 gives) is within


def _four_column_cancellation():
    return regressions.load(regressions.EXAMPLES["stage_normalize"][0])


def test_four_column_cancellation_is_not_structural():
    """c = z(1) + z(3) - z(3) - z(1) = 0 exactly: four contributing columns, so spec section 7 holds
    the zero to the error bound (required_zero False), and impl.gdpo's +-2^-53 is within it."""
    from conformance.cases import expected
    from conformance.judge import distance

    case = _four_column_cancellation()
    res = expected(case).result
    st = res.combined
    assert res.group_cancelled.all() and not st.required_zero.any()
    subject = Subject("impl.gdpo:gdpo_advantages", "gdpo", "spec")
    out = subject.outcome(subject.call_normalize, case)
    assert distance(out.values, st.float64, st.allowed("float64"), st.cond, "float64", must_be_zero=st.required_zero).ok


def test_normalize_judge_demands_only_structural_zeros():
    """check_normalize demanded an exact zero for every exactly cancelling group (deep profile,
    stage_normalize; the judge fixed in 0de4a4f)."""
    P.check_normalize(Subject("impl.gdpo:gdpo_advantages", "gdpo", "spec"), _four_column_cancellation())


def test_normalize_judge_permits_a_refusal_on_the_overflow_boundary():
    """z = 1.5 times w = 0x1.5555555555555p+1023 is exactly the midpoint between DBL_MAX and 2^1024:
    float64 rounds it to inf, so impl.gdpo (and any float64 code) refuses with OutOfRangeError,
    while the exact c, a hair smaller (eps), rounds to DBL_MAX. The allowance reaches 2^1024, so
    the refusal is permitted (deep profile, stage_normalize seed 103; the judge demanded a result)."""
    from conformance.cases import expected
    from spec import error_model as em

    case = regressions.load(regressions.EXAMPLES["stage_normalize"][1])
    st = expected(case).result.combined
    assert np.all(np.isfinite(st.float64)) and np.any(st.reach() >= em.overflow_threshold("float64"))
    subject = Subject("impl.gdpo:gdpo_advantages", "gdpo", "spec")
    out = subject.outcome(subject.call_normalize, case)
    assert out.error_type == "OutOfRangeError", out.describe()
    P.check_normalize(subject, case)
    P.check_values(subject, case)  # gdpo_advantages scales the weights: computed, and within the model
