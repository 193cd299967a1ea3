"""The error model where eps = 0 meets a zero std, and its final-cast term per output format.

Everything here is derived by hand from the error model in spec/gdpo.md section 7; no tolerance
is picked. The warning tests run with ``warnings.simplefilter("error")``, so a
RuntimeWarning (division by zero, inf * 0, overflow) fails them: before the model
decided the eps = 0 cases, these exact calls divided by zero and returned NaN or inf
bounds.
"""

import math
import warnings

import numpy as np
import pytest

from conformance.judge import distance
from oracle import gdpo
from spec import error_model as em

U = em.FLOAT64_UNIT_ROUNDOFF

#: three weighted copies of one column with w1 + w2 + w3 = 0 exactly: every combined value
#: is 0 in exact arithmetic (a collapsed unit), but not structurally (three live columns),
#: so a correct float64 code whitens its own rounding noise (conformance/regressions.json, "eps")
NOISE_W = [float.fromhex(x) for x in ("0x1.1d0361dd0bf71p-2", "0x1.3b1b0f3282684p-3", "-0x1.ba90e9764d2b3p-2")]
NOISE_COL = np.array([0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
NOISE_R = np.stack([NOISE_COL] * 3, 1)
NOISE_G = [0, 0, 0, 1, 1, 1]

#: a column constant in both groups (collapsed) beside a live one
COLLAPSED_R = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
COLLAPSED_G = [0, 0, 1, 1]


def _all_finite(stage) -> bool:
    return all(np.all(np.isfinite(x)) for x in (stage.delta, stage.cond, stage.allowed("float64")))


def test_the_harness_turns_runtime_warnings_into_failures():
    """The tests below rely on this: numpy's 0-division is an exception under the filter."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning):
            np.array([1.0]) / np.array([0.0])


@pytest.mark.parametrize("out_dtype", ["float64", "float32", "float16", "bfloat16"])
def test_eps_zero_paths_emit_no_runtime_warning(out_dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = gdpo.gdpo_advantages(COLLAPSED_R, COLLAPSED_G, eps=0.0)
        for stage in (res, res.z, res.combined):
            assert _all_finite(stage)
            stage.allowed(out_dtype)
        res = gdpo.gdpo_advantages(NOISE_R, NOISE_G, weights=NOISE_W, eps=0.0)
        assert res.unit_collapsed.all() and not res.required_zero.any()
        assert _all_finite(res) and np.all(np.isfinite(res.allowed(out_dtype)))
        const = gdpo.whiten(np.array([0.5, 0.5, 2.0, 2.0]), unit_ids=[0, 0, 1, 1], eps=0.0)
        assert _all_finite(const) and np.all(const.allowed(out_dtype) == 0.0)
        # the model's stage functions themselves at a zero denominator, both modes
        for rounding in (True, False):
            for dev, d_dev in (([0.0, 0.0], 0.0), ([0.5, 0.5], 1.0)):
                dz = em.standardize_groups_stage(dev, d_dev, 0.0, 0.0, [0.0, 0.0], 2, 1, rounding)
                assert np.all(np.isfinite(dz))
            assert np.all(np.isfinite(em.whiten_stage(np.ones(3), np.ones(3), 1.0, np.zeros(3), 0.0, 0.0, 1,
                                                      rounding=rounding)))
        # and the final-cast term at the formats' edges (zero, subnormals, the top, beyond)
        edges = np.array([0.0, -0.0, 5e-324, 2.0 ** -1022, 2.0 ** -149, 2.0 ** -24, 6e-8, 65504.0, 65520.0,
                          3.4e38, 1.7976931348623157e308])
        assert np.all(np.isfinite(em.allowed_error(np.ones(edges.size), edges, out_dtype)))
        assert np.all(np.isfinite(em.half_ulp(edges, out_dtype)))


def test_eps_zero_collapsed_column_is_an_exact_zero_with_allowance_zero():
    """Eq. 4 with eps = 0 divides 0 by 0 at a collapsed column; the collapse rule decides
    it: z = 0 exactly (required), Δz = 0, allowance 0 in every format; its cond is the jump
    one ulp of input causes, Samuelson's (n - 1)/sqrt(n) = 1/sqrt(2) for n = 2."""
    res = gdpo.gdpo_advantages(COLLAPSED_R, COLLAPSED_G, eps=0.0)
    z = res.z
    assert np.all(z.required_zero[:, 0]) and np.all(z.float64[:, 0] == 0.0)
    assert np.all(z.delta[:, 0] == 0.0)
    for out_dtype in ("float64", "float32", "float16", "bfloat16"):
        assert np.all(z.allowed(out_dtype)[:, 0] == 0.0)
    assert np.all(z.cond[:, 0] == em.samuelson(2, 1)) and em.samuelson(2, 1) == math.sqrt(0.5)


def test_eps_zero_noise_unit_bound_is_the_normalisations_own():
    """Eq. 6 with eps = 0 on a unit that is constant in exact arithmetic only: the bound is
    |a'| <= sqrt((T - ddof)/t_j) (1 + (n + 3) u) plus |a| = 0, here n = T = 6, ddof 1:
    sqrt(5) (1 + 9u), then float64's half ulp at that reach (the exact value is 0)."""
    res = gdpo.gdpo_advantages(NOISE_R, NOISE_G, weights=NOISE_W, eps=0.0)
    assert np.all(res.float64 == 0.0) and res.exact_zero.all() and not res.required_zero.any()
    B = math.sqrt(5.0) * (1.0 + 9 * U)
    expected = B + em.half_ulp(np.array([B]), "float64")[0] + 5e-324  # half of 2^-1074 is not a float: a whole one
    allowed = res.allowed("float64")
    assert np.all(allowed == pytest.approx(expected, rel=4 * U))
    assert np.all(allowed >= 5 / math.sqrt(6))  # Samuelson: what noise whitening can really reach
    # the bound judges: an output beyond it, or NaN, is rejected; the largest reachable one is not
    cond = res.cond
    assert distance(np.full(6, 5 / math.sqrt(6)), res.float64, allowed, cond, "float64").ok
    assert not distance(np.full(6, 2.3), res.float64, allowed, cond, "float64").ok
    assert not distance(np.full(6, np.nan), res.float64, allowed, cond, "float64").ok
    # with a positive eps the first-order bound is below the cap (the cap only binds at eps -> 0)
    pos = gdpo.gdpo_advantages(NOISE_R, NOISE_G, weights=NOISE_W, eps=1e-4)
    assert np.all(pos.allowed("float64") < allowed)


def test_whiten_stage_cap_and_samuelson_by_hand():
    t = np.array([1.0, 3.0])
    T = 4.0
    # weighted: sqrt((T - ddof)(T - t_j)/(T t_j)) = sqrt(3 * 3 / 4), sqrt(3 * 1 / 12)
    assert np.allclose(em.samuelson(T, 1, t), [1.5, 0.5], rtol=0, atol=0)
    cap = em.whiten_stage(np.zeros(2), np.zeros(2), 0.0, np.zeros(2), 0.0, 0.0, 1, t=t)
    assert np.array_equal(cap, em.noise_cap(T, 1, t, 2, np.zeros(2)))
    assert em.SAFETY * U * cap[0] == pytest.approx(math.sqrt(3.0) * (1 + 5 * U), rel=2 * U)


def test_final_cast_term_by_hand():
    """B + half_ulp_out(|a| + B) + half_ulp_64(a), each half ulp worked out by hand."""
    delta, a = np.array([10.0]), np.array([0.3])  # 0.3 in [2^-2, 2^-1)
    B = em.SAFETY * U * 10.0
    assert em.allowed_error(delta, a, "float64")[0] == B + 2.0 ** -55 + 2.0 ** -55
    assert em.allowed_error(delta, a, "float32")[0] == B + 2.0 ** -26 + 2.0 ** -55
    assert em.allowed_error(delta, a, "float16")[0] == B + 2.0 ** -13 + 2.0 ** -55
    assert em.allowed_error(delta, a, "bfloat16")[0] == B + 2.0 ** -10 + 2.0 ** -55
    # float16 subnormals (below 2^-14) share the spacing 2^-24
    assert em.half_ulp(np.array([1e-6, 2.0 ** -15, 0.0]), "float16").tolist() == [2.0 ** -25] * 3
    # bfloat16 keeps float32's exponent range: its subnormal spacing is 2^-133
    assert em.half_ulp(np.array([1e-39]), "bfloat16")[0] == 2.0 ** -134
    # a value that rounds up to a power of two takes the binade above; so does a reach past it
    assert em.half_ulp(np.array([1.0 - 2.0 ** -13]), "float16")[0] == 2.0 ** -11
    just_below = np.array([1.0 - 2.0 ** -30])
    far = em.allowed_error(np.array([2.0 ** 30]), just_below, "float16")[0]  # B = 2^-22 reaches past 1
    assert far == em.SAFETY * U * 2.0 ** 30 + 2.0 ** -11 + 2.0 ** -54
    # a demanded exact value (Δ = 0): the format's rounding of it, and float64's
    assert em.allowed_error(np.array([0.0]), a, "float16")[0] == 2.0 ** -13 + 2.0 ** -55
    assert em.allowed_error(np.array([0.0]), a, "float64")[0] == 2.0 ** -55
    assert em.allowed_error(np.array([0.0]), np.array([0.0]), "float16")[0] == 0.0


def test_format_limits():
    assert em.largest_finite("float16") == 65504.0 and em.overflow_threshold("float16") == 65520.0
    assert em.largest_finite("bfloat16") == float.fromhex("0x1.fep+127")
    assert em.overflow_threshold("bfloat16") == float.fromhex("0x1.ffp+127")
    assert em.largest_finite("float32") == float.fromhex("0x1.fffffep+127")
    assert em.overflow_threshold("float64") == math.inf
    r = em.round_to(np.array([65519.99, 65520.0, -65520.0, 2.0 ** -25, 3 * 2.0 ** -26, -1e-9]), "float16")
    assert r[0] == 65504.0 and r[1] == math.inf and r[2] == -math.inf
    assert r[3] == 0.0 and r[4] == 2.0 ** -24  # a tie to even, then just above the tie
    assert r[5] == 0.0 and math.copysign(1.0, r[5]) == -1.0  # a signed zero
    with pytest.raises(ValueError, match="no error model"):
        em.half_ulp(np.array([1.0]), "float8_e4m3fn")
