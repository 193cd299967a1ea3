"""The oracle rounds every rational value exactly (ties to even, never a CertificationError)
and takes its inputs exactly or refuses them with the contract's class, naming where."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from mpmath import libmp

from oracle import exact as ex
from oracle import gdpo
from spec.errors import InputDtypeError, OutOfRangeError, ShapeError, WeightError

# ------------------------------------------------------------------------- ties


def test_rational_z_exactly_halfway_rounds_to_even():
    """multireward_grpo (ddof 0, eps 1e-8): a pair's std is half its gap, rational, so z is
    +-(1 - 2^-25), exactly halfway between two float32 values (and 511/512 for bfloat16)."""
    e = 1e-8
    res = gdpo.gdpo_advantages(np.array([[e * 2.0 ** 26], [2 * e]]), [0, 0], convention="multireward_grpo")
    assert res.z.float64[:, 0].tolist() == [1 - 2.0 ** -25, -(1 - 2.0 ** -25)]
    assert res.z.float32[:, 0].tolist() == [1.0, -1.0]  # ties to even
    assert res.float32.tolist() == [1.0, -1.0]  # whiten "none": a = c = z
    res = gdpo.gdpo_advantages(np.array([[e * 2.0 ** 10], [2 * e]]), [0, 0], convention="multireward_grpo")
    assert res.bfloat16.tolist() == [1.0, -1.0] and res.float32.tolist() == [511 / 512, -511 / 512]


def test_rational_z_tie_under_spec_eps():
    eps = 3 * 2.0 ** -30
    h = 511 * eps  # std h, D = h + eps = 512 eps: z = +-511/512, a bfloat16 midpoint
    z = gdpo.standardize_groups(np.array([[0.0], [h], [2 * h]]), [0, 0, 0], eps=eps)
    assert z.float64[:, 0].tolist() == [-511 / 512, 0.0, 511 / 512]
    assert z.bfloat16[:, 0].tolist() == [-1.0, 0.0, 1.0]
    a = gdpo.whiten(np.array([0.0, h, 2 * h]), eps=eps)
    assert a.bfloat16.tolist() == [-1.0, 0.0, 1.0]


def test_whitened_tie_of_irrational_combined_values():
    """Five groups of two (eps 0: z = +-1/sqrt(2), irrational), one live column each, weights
    with sum w^2 = 9/2: the unit's std is 1/sqrt(2) exactly and the first group's a is
    +-(1 + 2^-11), halfway between two float16 values. The forms are irrational, so this is
    decided by the exact tie test, not the rational path."""
    m = 1 + 2.0 ** -11
    w = [m] + [x / 2.0 ** 11 for x in (3830, 83, 13, 3)]
    assert sum(Fraction(x) ** 2 for x in w) == Fraction(9, 2)
    rows, gid = [], []
    for g in range(5):
        lo, hi = [0.0] * 5, [0.0] * 5
        hi[g] = 1.0
        rows += [lo, hi]
        gid += [g, g]
    res = gdpo.gdpo_advantages(np.array(rows), gid, weights=w, eps=0.0)
    assert not res.combined.exact_zero[:2].any()
    assert res.float64[:2].tolist() == [-m, m]
    assert res.float16[:2].tolist() == [-1.0, 1.0]  # ties to even: 1 + 2^-10 is odd


def test_round_fraction_matches_round_mpf_and_breaks_ties_to_even():
    rng = np.random.default_rng(5)
    for fmt in ex.ROUNDED:
        for _ in range(2000):
            q = Fraction(int(rng.integers(-2 ** 62, 2 ** 62)), int(rng.integers(1, 2 ** 62)))
            q *= Fraction(2) ** int(rng.integers(-1150, 1100))
            if q == 0:
                continue
            x = libmp.from_rational(q.numerator, q.denominator, 300, libmp.round_nearest)
            a, b = ex.round_fraction(q, fmt), ex.round_mpf(x, fmt)
            assert a == b and math.copysign(1, a) == math.copysign(1, b), (q, fmt)
    assert ex.round_fraction(Fraction(1 + 2 ** -53), "float64") == 1.0
    assert ex.round_fraction(Fraction(3, 2 ** 1075), "float64") == 2.0 ** -1073
    assert ex.round_fraction(Fraction(-1, 2 ** 1075), "float64") == 0.0
    assert math.copysign(1, ex.round_fraction(Fraction(-1, 2 ** 1075), "float64")) == -1
    assert ex.round_fraction(Fraction(65520), "float16") == math.inf  # the overflow threshold ties up


@pytest.mark.parametrize("q,fmt", [(Fraction(2 ** 25 - 1, 2 ** 25), "float32"), (Fraction(65520), "float16"),
                                   (Fraction(-3, 2 ** 1075), "float64"), (Fraction(1 + 2 ** -11), "float16")])
def test_boundaries_name_the_midpoint_an_interval_straddles(q, fmt):
    tiny = abs(q) * Fraction(1, 2 ** 200)
    iv = (ex.iv_rational(q - tiny, 300)[0], ex.iv_rational(q + tiny, 300)[1])
    assert ex.round_mpf(iv[0], fmt) != ex.round_mpf(iv[1], fmt)
    assert q in ex.boundaries(iv)


# ----------------------------------------------------------------------- inputs


def test_longdouble_rewards_are_exact_or_refused():
    x = np.array([[1.0], [1.0]], dtype=np.longdouble)
    assert gdpo.gdpo_advantages(x, [0, 0]).group_collapsed.all()  # float64 values: taken as they are
    if np.finfo(np.longdouble).nmant > 52:
        x[1, 0] += np.longdouble(2.0) ** -60
        with pytest.raises(InputDtypeError, match=r"row 1, column 0 .*cannot hold exactly"):
            gdpo.gdpo_advantages(x, [0, 0])


def test_python_numbers_float64_cannot_hold_are_refused_not_rounded():
    with pytest.raises(InputDtypeError, match=r"row 0, column 0 is 9007199254740993"):
        gdpo.gdpo_advantages([[2 ** 53 + 1], [2 ** 53]], [0, 0])
    with pytest.raises(InputDtypeError, match=r"row 1, column 1"):
        gdpo.gdpo_advantages([[0.0, 1.0], [1.0, Fraction(1, 3)]], [0, 0])
    with pytest.raises(InputDtypeError, match=r"row 1"):
        gdpo.whiten([0.0, True, 2.0])
    with pytest.raises(ShapeError):
        gdpo.gdpo_advantages([[0.0, 1.0], [1.0]], [0, 0])
    exact = gdpo.gdpo_advantages(np.array([[2.0 ** 53], [0.5]]), [0, 0])
    same = gdpo.gdpo_advantages([[2 ** 53], [Fraction(1, 2)]], [0, 0])  # exact ints and fractions are floats
    assert same.float64.tolist() == exact.float64.tolist()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_tensors_are_read_exactly(dtype):
    t = torch.tensor([[1.0, 0.5], [3.0, 0.0], [2.0, 1.0], [0.25, 4.0]], dtype=dtype)
    got = gdpo.gdpo_advantages(t, [0, 0, 1, 1])
    ref = gdpo.gdpo_advantages(t.double().numpy(), [0, 0, 1, 1])
    assert got.float64.tolist() == ref.float64.tolist()
    v = gdpo.whiten(t[:, 0])
    assert v.float64.tolist() == gdpo.whiten(t[:, 0].double().numpy()).float64.tolist()


def test_non_float_tensors_are_refused():
    with pytest.raises(InputDtypeError, match="int64"):
        gdpo.gdpo_advantages(torch.tensor([[1], [2]]), [0, 0])
    if hasattr(torch, "float8_e4m3fn"):
        with pytest.raises(InputDtypeError, match="float8"):
            gdpo.gdpo_advantages(torch.tensor([[1.0], [2.0]]).to(torch.float8_e4m3fn), [0, 0])


R = np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 0.5], [0.0, 2.0]])
G = [0, 0, 1, 1]


@pytest.mark.parametrize("eps,exc,pattern", [
    (-1e-4, OutOfRangeError, r"eps=-0\.0001 must be finite and >= 0"),
    (float("nan"), OutOfRangeError, "eps=nan"),
    (float("inf"), OutOfRangeError, "eps=inf"),
    (10 ** 400, OutOfRangeError, "beyond float64"),
    ("1e-4", InputDtypeError, "eps must be a real number"),
    (True, InputDtypeError, "eps must be a real number"),
    (1j, InputDtypeError, "eps must be a real number"),
    ([1e-4], InputDtypeError, "eps must be a real number"),
])
def test_bad_eps_is_refused_with_the_contract_class(eps, exc, pattern):
    for call in (lambda: gdpo.gdpo_advantages(R, G, eps=eps), lambda: gdpo.standardize_groups(R, G, eps=eps),
                 lambda: gdpo.whiten(R[:, 0], eps=eps)):
        with pytest.raises(exc, match=pattern):
            call()


def test_real_eps_of_any_type_is_its_float():
    ref = gdpo.gdpo_advantages(R, G, eps=0.25).float64.tolist()
    for eps in (np.float32(0.25), np.float64(0.25), Fraction(1, 4), torch.tensor(0.25)):
        assert gdpo.gdpo_advantages(R, G, eps=eps).float64.tolist() == ref
    assert gdpo.gdpo_advantages(R, G, eps=-0.0).float64.tolist() == gdpo.gdpo_advantages(R, G, eps=0.0).float64.tolist()


@pytest.mark.parametrize("weights,pattern", [
    ([1.0, 2 ** 53 + 1], r"weights\[1\] \(reward column 1\) is a number float64 cannot hold exactly"),
    ([Fraction(1, 3), 1.0], r"weights\[0\].*cannot hold exactly"),
    ([1.0, 10 ** 400], r"weights\[1\].*beyond float64's range"),
    ([True, 1.0], r"weights\[0\].*not a real number"),
    (["1", 1.0], r"weights\[0\].*not a real number"),
    ("11", "sequence or tensor of real numbers"),
])
def test_weights_float64_cannot_hold_are_refused(weights, pattern):
    with pytest.raises(WeightError, match=pattern):
        gdpo.gdpo_advantages(R, G, weights=weights)


def test_exact_weights_of_any_type_are_taken_exactly():
    ref = gdpo.gdpo_advantages(R, G, weights=[1.0, 0.5]).float64.tolist()
    for w in ([1, Fraction(1, 2)], np.array([1.0, 0.5], dtype=np.float32),
              torch.tensor([1.0, 0.5], dtype=torch.bfloat16), np.array([1.0, 0.5], dtype=np.longdouble),
              (np.int64(1), 0.5)):
        assert gdpo.gdpo_advantages(R, G, weights=w).float64.tolist() == ref
    if np.finfo(np.longdouble).nmant > 52:
        w = np.array([1.0, 1.0], dtype=np.longdouble)
        w[1] += np.longdouble(2.0) ** -60
        with pytest.raises(WeightError, match=r"weights\[1\]"):
            gdpo.gdpo_advantages(R, G, weights=w)


def test_inputs_impl_takes_the_oracle_takes_too():
    """A review found the oracle refusing two inputs impl accepts: eps as a 0-d NumPy array,
    rewards as lists of 0-d tensors (each exact in float64)."""
    import torch

    from oracle import gdpo as oracle_gdpo

    r = [[0.25, 1.0], [0.5, 3.0], [1.0, 2.0], [4.0, 0.5]]
    want = oracle_gdpo.gdpo_advantages(r, [0, 0, 1, 1], eps=1e-4).float64
    got = oracle_gdpo.gdpo_advantages(r, [0, 0, 1, 1], eps=np.array(1e-4)).float64
    assert np.array_equal(got, want)
    rows = [[torch.tensor(x, dtype=torch.float32) for x in row] for row in r]
    assert np.array_equal(oracle_gdpo.gdpo_advantages(rows, [0, 0, 1, 1], eps=1e-4).float64, want)
