"""Hand-derived values, checked against the oracle's certified results."""

import math
from fractions import Fraction

import numpy as np
import pytest

from oracle import gdpo
from oracle.examples import CORRECTNESS_LENGTH, TWO_GROUP, grpo_reference
from spec import DEFAULT_EPS


def test_two_group_example_keeps_group_b_twice_as_strong():
    res = gdpo.gdpo_advantages(TWO_GROUP["rewards"], TWO_GROUP["group_ids"])
    # n_g = 2: each varying column standardizes to +-1/sqrt(2) / (1 + eps*sqrt(2)) exactly
    z = (1 / math.sqrt(2)) / (1 / math.sqrt(2) * math.sqrt(2) + DEFAULT_EPS) * math.sqrt(2) / 2 * math.sqrt(2)
    assert res.z.float64[0, 0] == pytest.approx(0.5 / (math.sqrt(0.5) + DEFAULT_EPS), rel=1e-15)
    c = res.combined.float64
    assert c[2] == pytest.approx(2 * c[0], rel=1e-15)
    # Eq. 6 on c = [x, -x, 2x, -2x]: std = x*sqrt(10/3), so a = +-sqrt(3/10), +-2 sqrt(3/10) up to eps
    a = res.float64
    assert a[0] == pytest.approx(0.5477, abs=5e-5) and a[1] == pytest.approx(-0.5477, abs=5e-5)
    assert a[2] == pytest.approx(1.0954, abs=5e-5) and a[3] == pytest.approx(-1.0954, abs=5e-5)
    assert a[2] == pytest.approx(2 * a[0], rel=1e-15)
    grpo = grpo_reference(TWO_GROUP["rewards"], TWO_GROUP["group_ids"])
    assert np.allclose(np.abs(grpo), 0.7071, atol=1e-4)  # GRPO cannot tell the groups apart
    assert z > 0


def test_correctness_beats_length_under_gdpo_but_not_grpo():
    r, g = CORRECTNESS_LENGTH["rewards"], CORRECTNESS_LENGTH["group_ids"]
    res = gdpo.gdpo_advantages(r, g)
    best = int(np.argmax(res.float64))
    assert r[best, 0] == 1.0  # GDPO's best advantage goes to a correct response
    assert r[int(np.argmax(grpo_reference(r, g))), 0] == 0.0  # GRPO's goes to the long wrong one


@pytest.mark.parametrize("pair", [(0.0, 1.0), (3.0, -7.5), (1e-300, 2e-300), (1e15, 1e15 + 2)])
def test_group_of_two_standardizes_to_plus_minus_one_over_sqrt2(pair):
    res = gdpo.standardize_groups(np.array(pair)[:, None], [0, 0], eps=0.0, convention="spec")
    # sqrt(0.5) is correctly rounded; 1 / math.sqrt(2) rounds twice and is one ulp low
    h = math.sqrt(0.5)
    assert res.float64[:, 0].tolist() == sorted([-h, h], reverse=pair[0] > pair[1])


def test_thousand_offset_column_has_std_1_29e_2():
    r = np.array([1000.0, 1000.01, 1000.02, 1000.03])
    res = gdpo.standardize_groups(r[:, None], [0] * 4)
    # exact std of the float inputs, independently from Fractions
    q = [Fraction(x) for x in r]
    m = sum(q) / 4
    std = math.sqrt(float(sum((x - m) ** 2 for x in q) / 3))
    assert f"{std:.3g}" == "0.0129"
    expected = [float((x - m)) / (std + DEFAULT_EPS) for x in q]
    assert np.allclose(res.float64[:, 0], expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("C", [1e3, 1e6, 1e9, 1e12, 1e15, 2.0 ** 53])
def test_constant_sum_columns_cancel_to_exact_zero(C):
    d = np.array([0.1, 0.2, 0.3, 0.7])
    r1 = C - d
    r2 = C - r1  # exact in float64 (Sterbenz), so r1 + r2 == C exactly
    assert np.all(r1 + r2 == C)
    res = gdpo.gdpo_advantages(np.stack([r1, r2], 1), [0] * 4)
    assert res.combined.exact_zero.all() and res.exact_zero.all()
    assert res.unit_collapsed.all() and res.group_cancelled.all()
    assert np.all(res.float64 == 0) and np.all(res.float32 == 0)


def test_constant_sum_group_shares_a_unit_with_a_healthy_group():
    C = 1e9
    d = np.array([0.1, 0.2, 0.3, 0.7])
    r1 = C - d
    bad = np.stack([r1, C - r1], 1)
    good = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    res = gdpo.gdpo_advantages(np.vstack([bad, good]), [0] * 4 + [1] * 4)
    assert res.combined.exact_zero[:4].all()
    # the cancelled group sits exactly at the unit mean, which is exactly zero
    assert res.exact_zero[:4].all() and not res.unit_collapsed.any()


def test_weights_closer_than_float32_stay_distinct():
    w = [16777216.0, 16777217.0]
    assert np.float32(w[0]) == np.float32(w[1])
    r = np.array([[0.0, 1.0], [1.0, 0.0], [0.5, 0.5]])  # columns standardize to z2 = -z1
    res = gdpo.gdpo_advantages(r, [0, 0, 0], weights=w)
    assert not res.combined.exact_zero[:2].any()
    merged = gdpo.gdpo_advantages(r, [0, 0, 0], weights=[w[0], w[0]])
    assert merged.combined.exact_zero.all()
    assert abs(res.float64[0]) > 0.99


def test_merging_units_flips_signs_not_just_scale():
    r = np.arange(1.0, 9.0)[:, None]  # one group of 8 split over two training batches
    units = [0, 0, 0, 0, 1, 1, 1, 1]
    per_unit = gdpo.gdpo_advantages(r, [0] * 8, unit_ids=units).float64
    merged = gdpo.gdpo_advantages(r, [0] * 8).float64
    assert int(np.sum(np.sign(per_unit) != np.sign(merged))) == 4


def test_single_reward_is_not_grpo():
    r = np.array([[0.0], [1.0], [3.0], [7.0], [1.0], [2.0], [2.0], [9.0]])
    g = [0] * 4 + [1] * 4
    a = gdpo.gdpo_advantages(r, g).float64
    assert not np.allclose(a, grpo_reference(r, g), atol=1e-6)
