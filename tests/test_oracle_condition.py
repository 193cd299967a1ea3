"""The oracle's ``cond`` against brute force: the exact first-order change, by central
finite differences of a straightforward mpmath implementation of Eq. 4, 7 and 6
written here (independent of oracle.condition and oracle.gdpo).

Slack, each from an argument:

* upper bound: ``cond >= brute``, exactly (as mpf). Where the reported value is the tight
  one it is fl(T + E) raised by 2^-50 with T + E >= the exact first-order change, E at least
  count u A (A the terms' absolute sum, the derivatives' scale); where it is the stage-wise
  bound, that bound's float64 value times 1 + (m + 2) u, m its roundings along a term (so at
  least 2u above the change). Either margin is far above the brute value's own error, 2^-240
  of the derivatives' scale (below); an exact 0 (an output that no input moves) is computed
  as exactly 0 by the differences. A tolerance here (it was 1 - 1e-12) hid a stage-wise
  value rounded to nearest 1e-16 below the change.
* sharp: ``cond <= brute (1 + 2^-19)(1 + 2^-48)``. Where ``cond_sharp``, E <= 2^-20 (T - E)
  and T - E <= exact, so T + E <= exact + 2E <= exact (1 + 2^-19); the reported value is
  fl(T + E) raised by 2^-50 (at most (1 + 2^-50)(1 + 2^-52)^2 <= 1 + 2^-48 more).
* brute: central differences with step h = 2^-120 ulp(x) at 1500 bits: the truncation
  error is h^2 |f'''| / 6, relative 2^-240 of the scale of the function's derivatives;
  the rounding error 2^-1500 |f| / h, far below 5e-324 once times ulp(x) = 2^120 h.
"""

from __future__ import annotations

import dataclasses
import math

import mpmath
import numpy as np
import pytest
from mpmath import mp, mpf

from oracle import condition as cn
from oracle import gdpo
from spec.conventions import CONVENTIONS, get_convention

PREC = 1500
STEP = 2.0 ** -120
SHARP = (1 + 2.0 ** -19) * (1 + 2.0 ** -48)


# ------------------------------------------------------------- brute force


def _standardize(vals, ddof, eps, placement):
    n = len(vals)
    m = mpmath.fsum(vals) / n
    d = [v - m for v in vals]
    var = mpmath.fsum(x * x for x in d) / (n - ddof)
    s = mpmath.sqrt(var)
    if placement in ("std", "std_if_positive"):
        h = s + eps
    elif placement == "var":
        h = mpmath.sqrt(var + eps)
    else:
        h = s
    return [x / h for x in d]


def reference(r, w, groups, units, conv, eps_g, eps_w):
    """z (N x K), c and a (N) of mpf inputs: Eq. 4 per group column, Eq. 7, Eq. 6 per unit."""
    N, K = len(r), len(w)
    z = [[mpf(0)] * K for _ in range(N)]
    for g in sorted(set(groups)):
        rows = [i for i in range(N) if groups[i] == g]
        for k in range(K):
            for i, v in zip(rows, _standardize([r[i][k] for i in rows], conv.group_ddof, eps_g,
                                               conv.group_eps_placement)):
                z[i][k] = v
    c = [mpmath.fsum(w[k] * z[i][k] for k in range(K)) for i in range(N)]
    if conv.whiten == "none":
        return z, c, list(c)
    a = [mpf(0)] * N
    for s in sorted(set(units)):
        rows = [i for i in range(N) if units[i] == s]
        for i, v in zip(rows, _standardize([c[i] for i in rows], conv.whiten_ddof, eps_w,
                                           conv.whiten_eps_placement)):
            a[i] = v
    return z, c, a


def _ulp(x: float) -> mpf:
    return mpf(math.ulp(x))  # ulp(0) = 5e-324 and ulp(DBL_MAX) = 2^971, as the oracle takes them


def brute(r, w, groups, units, conv, eps):
    """sum_x |d out / dx| ulp(x) over every reward and weight, for z, c and a."""
    eps_g = mpf(conv.group_eps if eps is None else eps)
    eps_w = mpf(conv.whiten_eps if eps is None else eps)
    N, K = r.shape
    with mp.workprec(PREC):
        R = [[mpf(float(v)) for v in row] for row in r]
        W = [mpf(float(v)) for v in w]
        bz = [[mpf(0)] * K for _ in range(N)]
        bc = [mpf(0)] * N
        ba = [mpf(0)] * N

        def add(plus, minus, h, ulp):
            for i in range(N):
                for k in range(K):
                    bz[i][k] += abs(plus[0][i][k] - minus[0][i][k]) / (2 * h) * ulp
                bc[i] += abs(plus[1][i] - minus[1][i]) / (2 * h) * ulp
                ba[i] += abs(plus[2][i] - minus[2][i]) / (2 * h) * ulp

        for j in range(N):
            for k in range(K):
                ulp = _ulp(float(r[j, k]))
                h = ulp * STEP
                x = R[j][k]
                R[j][k] = x + h
                plus = reference(R, W, groups, units, conv, eps_g, eps_w)
                R[j][k] = x - h
                minus = reference(R, W, groups, units, conv, eps_g, eps_w)
                R[j][k] = x
                add(plus, minus, h, ulp)
        for k in range(K):
            ulp = _ulp(float(w[k]))
            h = ulp * STEP
            x = W[k]
            W[k] = x + h
            plus = reference(R, W, groups, units, conv, eps_g, eps_w)
            W[k] = x - h
            minus = reference(R, W, groups, units, conv, eps_g, eps_w)
            W[k] = x
            add(plus, minus, h, ulp)
        return np.array(bz, dtype=object), np.array(bc, dtype=object), np.array(ba, dtype=object)


def brute_whiten(v, units, conv, eps):
    conv = get_convention(conv)
    eps_w = mpf(conv.whiten_eps if eps is None else eps)
    out = [mpf(0)] * len(v)
    with mp.workprec(PREC):
        V = [mpf(float(x)) for x in v]

        def whiten(vals):
            res = [mpf(0)] * len(vals)
            for s in sorted(set(units)):
                rows = [i for i in range(len(vals)) if units[i] == s]
                for i, a in zip(rows, _standardize([vals[i] for i in rows], conv.whiten_ddof, eps_w,
                                                   conv.whiten_eps_placement)):
                    res[i] = a
            return res

        for j in range(len(v)):
            ulp = _ulp(float(v[j]))
            h = ulp * STEP
            x = V[j]
            V[j] = x + h
            plus = whiten(V)
            V[j] = x - h
            minus = whiten(V)
            V[j] = x
            for i in range(len(v)):
                out[i] += abs(plus[i] - minus[i]) / (2 * h) * ulp
    return np.array(out, dtype=object)


STATS = {"cases": 0, "sharp": 0, "elements": 0, "max_ratio": 0.0}


def check_stage(cond, sharp, exact, what=""):
    """Upper bound everywhere; within (1 + 2^-19)(1 + 2^-48) where sharp. Returns the
    largest cond / brute where sharp."""
    cond = np.asarray(cond, dtype=np.float64).reshape(-1)
    sharp = np.asarray(sharp, bool).reshape(-1)
    exact = exact.reshape(-1)
    worst = 0.0
    for i, (cv, sv, ev) in enumerate(zip(cond, sharp, exact)):
        with mp.workprec(PREC):
            assert mpf(float(cv)) >= ev, f"{what}[{i}]: cond {cv!r} below the first-order change {ev}"
            if sv:
                assert mpf(float(cv)) <= ev * SHARP, f"{what}[{i}]: sharp cond {cv!r} above {ev} (1 + 2^-19)"
                if ev > 0:
                    worst = max(worst, float(mpf(float(cv)) / ev))
    STATS["elements"] += cond.size
    STATS["sharp"] += int(sharp.sum())
    return worst


def check_all(r, g, w=None, u=None, convention="spec", eps=None):
    r = np.asarray(r, dtype=np.float64)
    if r.ndim == 1:
        r = r[:, None]
    conv = get_convention(convention)
    w = np.ones(r.shape[1]) if w is None else np.asarray(w, dtype=np.float64)
    u = np.zeros(len(g), dtype=np.int64) if u is None else np.asarray(u)
    res = gdpo.gdpo_advantages(r, np.asarray(g), weights=w, unit_ids=u, eps=eps, convention=conv)
    bz, bc, ba = brute(r, w, list(np.asarray(g)), list(u), conv, eps)
    worst = max(check_stage(res.z.cond, res.z.cond_sharp, bz, "z"),
                check_stage(res.combined.cond, res.combined.cond_sharp, bc, "c"),
                check_stage(res.cond, res.cond_sharp, ba, "a"))
    STATS["cases"] += 1
    STATS["max_ratio"] = max(STATS["max_ratio"], worst)
    return res, (bz, bc, ba)


# ------------------------------------------------------------- cases


def _conventions():
    spec = CONVENTIONS["spec"]
    return [
        ("spec", None), ("spec", 1e-8), ("spec", 0.0), ("trl", None), ("nemo_rl", None),
        ("multireward_grpo", None), ("ms_swift", None), ("nvlabs", None),
        (dataclasses.replace(spec, name="var", group_eps_placement="var", whiten_eps_placement="var"), None),
        (dataclasses.replace(spec, name="ddof0", group_ddof=0, whiten_ddof=0), None),
        (dataclasses.replace(spec, name="skip", group_eps_placement="skip_if_zero",
                             whiten_eps_placement="skip_if_zero"), None),
    ]


def random_case(seed: int):
    """N <= 24, K <= 3, groups of 2-8, 1-3 units made of whole groups, no constant column in a
    group; rewards of several kinds (binary, small integers, normal, offset, huge, tiny)."""
    rng = np.random.default_rng(seed)
    K = int(rng.integers(1, 4))
    sizes = []
    while True:
        n = int(rng.integers(2, 9))
        if sum(sizes) + n > 24:
            break
        sizes.append(n)
        if len(sizes) >= 2 and rng.random() < 0.3:
            break
    G = len(sizes)
    S = int(rng.integers(1, min(3, G) + 1))
    gunit = np.concatenate([np.arange(S), rng.integers(0, S, size=G - S)])
    groups = np.repeat(np.arange(G), sizes)
    N = groups.size
    r = np.zeros((N, K))
    for k in range(K):
        kind = rng.choice(["binary", "int", "normal", "offset", "huge", "tiny"])
        for g in range(G):
            m = groups == g
            while True:
                if kind == "binary":
                    v = rng.integers(0, 2, size=m.sum()).astype(float)
                elif kind == "int":
                    v = rng.integers(-3, 4, size=m.sum()).astype(float)
                elif kind == "normal":
                    v = rng.normal(size=m.sum())
                elif kind == "offset":
                    v = 1e6 + rng.normal(size=m.sum()) * 1e-3
                elif kind == "huge":
                    v = rng.normal(size=m.sum()) * 1e300
                else:
                    v = rng.normal(size=m.sum()) * 1e-300
                if np.ptp(v) > 0:
                    break
            r[m, k] = v
    w = rng.choice([np.ones(K), rng.normal(size=K), rng.normal(size=K) * 1e300, rng.normal(size=K) * 1e-300],
                   axis=0) if rng.random() < 0.8 else np.ones(K)
    perm = rng.permutation(N)
    return r[perm], groups[perm], w, gunit[groups][perm]


CONVS = _conventions()


@pytest.mark.parametrize("ci", range(len(CONVS)),
                         ids=[f"{getattr(c, 'name', c)}-eps{e}" for c, e in CONVS])
@pytest.mark.parametrize("seed", range(8))
def test_random_batches_against_brute_force(ci, seed):
    conv, eps = CONVS[ci]
    for attempt in range(20):
        r, g, w, u = random_case(100 * ci + seed + 10_000 * attempt)
        res = gdpo.gdpo_advantages(r, g, weights=w, unit_ids=u, eps=eps, convention=conv)
        if not res.unit_collapsed.any() and not _underflows(res):
            break
    else:
        pytest.fail("no usable case")
    check_all(r, g, w, u, conv, eps)


def _underflows(res) -> bool:
    """An exact c or a below float64's normal range (a tiny weight on a z that eps already made
    tiny): its first-order change is below 2^-1074, where no float64 bound says anything and the
    stage-wise fallback flushes to 0 (a collapsed unit has no first-order change at all)."""
    for st in (res.combined, res):
        x = np.abs(st.float64)
        if np.any(~st.exact_zero & (x < 2.0 ** -1000)):
            return True
    return False


# ------------------------------------------------------------- named cases


def test_group_of_two_cond_is_the_first_order_change():
    """[0, 1], eps 1e-4: z = +-(1/2) d / D, d = r_2 - r_1, D = |d| / sqrt(2) + eps, so
    |dz / dr_j| = eps / (2 D^2) exactly and the first-order change is eps (ulp(1) + ulp(0)) / (2 D^2)."""
    eps = 1e-4
    z = gdpo.standardize_groups(np.array([[0.0], [1.0]]), [0, 0], eps=eps)
    with mp.workprec(PREC):
        D = 1 / mpmath.sqrt(2) + mpf(eps)
        first = mpf(eps) * (mpf(math.ulp(1.0)) + mpf(5e-324)) / (2 * D * D)
        assert z.cond_sharp.all()
        for v in z.cond.ravel():
            assert first <= mpf(float(v)) <= first * SHARP
    assert 2.2e-20 < z.cond.max() < 2.3e-20
    check_all(np.array([0.0, 1.0]), [0, 0])
    for e in (1e-8, 1e-6):
        res, _ = check_all(np.array([0.0, 1.0]), [0, 0], eps=e)
        assert res.z.cond_sharp.all()


def test_eps_zero_group_of_two_has_no_first_order_change():
    """At eps = 0 a group of two is +-1/sqrt(2) whatever its inputs: the first-order change
    is 0, and cond is its error bound alone (2^-1074: its underflow term, flushed)."""
    res, (bz, _, _) = check_all(np.array([0.0, 1.0]), [0, 0], eps=0.0)
    assert all(v == 0 for v in bz.ravel())
    assert np.all(res.z.cond <= 5e-324)


@pytest.mark.parametrize("C", [1e9, 1e11, 1e13, 1e15])
def test_constant_sum_group_in_its_own_unit(C):
    """Spec section 7's [C - d, d]: every stage sharp, checked against brute force."""
    d = np.array([0.1, 0.2, 0.3, 0.7])
    res, _ = check_all(np.stack([C - d, d], 1), [0] * 4)
    assert res.z.cond_sharp.all() and res.combined.cond_sharp.all() and res.cond_sharp.all()


@pytest.mark.parametrize("rewards,weights,eps", [
    (np.array([[1e300, -3e299], [-2e300, 1e299], [5e299, 2e300], [1.7976931348623157e308, 0.0]]), [1.0, 1e308], None),
    (np.array([[1.7976931348623157e308], [-1.7976931348623157e308], [0.0]]), [1e-300], None),
    (np.array([[1e-300, 3e-300], [-2e-300, 5e-324], [4e-300, -1e-310], [0.0, 2e-300]]), [1e300, -2e300], 0.0),
    (np.array([[1e-300, 3e-300], [-2e-300, 5e-324], [4e-300, -1e-310], [0.0, 2e-300]]), [1e300, -2e300], None),
    (np.array([[1.0 + 2.0 ** -52 * k] for k in (0, 1, 3, 7)]), [1.0], 1e-20),
    (np.array([[0.0, 1.0], [1.0, 2.0], [3.0, 5.0], [7.0, 1.0]]), [1.0, -1.0], 2.0 ** 250),
])
def test_extreme_magnitudes(rewards, weights, eps):
    """Rewards up to DBL_MAX, weights up to 1e308, spreads of 1e-300 and of one ulp, eps far
    beyond the spread: the frames keep every evaluation in range; cond against brute force."""
    g = [0] * 2 + [1] * 2 if len(rewards) == 4 else [0] * len(rewards)
    res, _ = check_all(rewards, g, w=weights, u=None, eps=eps)
    assert np.all(np.isfinite(res.cond)) and np.all(np.isfinite(res.z.cond))


@pytest.mark.parametrize("ci", [0, 8, 9, 10], ids=["spec", "var", "ddof0", "skip"])
def test_whiten_units_against_brute_force(ci):
    conv, _ = CONVS[ci]
    v = np.array([0.5, -1.25, 3.0, 1e6, 1e6 + 0.5, 7.0, 7.0 + 2.0 ** -40, -3.0])
    units = [0, 0, 0, 1, 1, 2, 2, 2]
    st = gdpo.whiten(v, unit_ids=units, convention=conv)
    exact = brute_whiten(v, units, conv, None)
    check_stage(st.cond, st.cond_sharp, exact, "a")
    assert st.cond_sharp.any()


def test_entry_points_carry_the_tight_value():
    r = np.array([[0.0, 2.0], [1.0, 3.5], [3.0, -1.0], [7.0, 0.25], [1.0, 1.0], [2.0, 0.0]])
    g = [0, 0, 0, 1, 1, 1]
    res = gdpo.gdpo_advantages(r, g, weights=[1.0, 0.5])
    z = gdpo.standardize_groups(r, g)
    c = gdpo.normalize_rewards(r, g, weights=[1.0, 0.5])
    assert np.array_equal(z.cond, res.z.cond) and np.array_equal(z.cond_sharp, res.z.cond_sharp)
    assert np.array_equal(c.cond, res.combined.cond) and np.array_equal(c.cond_sharp, res.combined.cond_sharp)
    assert z.cond_sharp.all() and c.cond_sharp.all() and res.cond_sharp.all()


# ------------------------------------------------------------- fallbacks


_old = cn.stagewise  # the stage-wise bound, as the oracle reported it before oracle.condition


def _same(new, old, mask):
    a, b = np.asarray(new)[mask], np.asarray(old)[mask]
    return np.array_equal(a, b, equal_nan=True)


def _fallback(new, old, mask):
    assert not np.asarray(new.cond_sharp)[mask].any()
    assert _same(new.cond, old.cond, mask)


HEALTHY = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0], [0.5, 0.25]])


def test_fallback_per_token_whitening():
    r = np.concatenate([HEALTHY, HEALTHY[::-1] * 2])
    g, tc = [0] * 4 + [1] * 4, np.arange(1, 9)
    new = gdpo.gdpo_advantages(r, g, convention="verl", token_counts=tc)
    old = _old(gdpo.gdpo_advantages, r, g, convention="verl", token_counts=tc)
    _fallback(new, old, np.ones(8, bool))
    assert new.z.cond_sharp.all() and new.combined.cond_sharp.all()  # Eq. 4 and Eq. 7 are sharp there


@pytest.mark.parametrize("convention", ["trl", "nvlabs", "ms_swift"])
def test_fallback_nan_entries(convention):
    r = np.concatenate([HEALTHY, HEALTHY[::-1] * 2])
    r[1, 0] = np.nan
    g, u = [0] * 4 + [1] * 4, [0] * 4 + [1] * 4
    new = gdpo.gdpo_advantages(r, g, unit_ids=u, convention=convention)
    old = _old(gdpo.gdpo_advantages, r, g, unit_ids=u, convention=convention)
    grp0 = np.arange(8) < 4
    zmask = np.zeros((8, 2), bool)
    zmask[:4, 0] = True
    _fallback(new.z, old.z, zmask)
    _fallback(new.combined, old.combined, grp0)
    _fallback(new, old, grp0)
    assert new.cond_sharp[~grp0].all()  # the other unit
    if get_convention(convention).nan != "propagate":  # ms_swift 4.6.0 skips NaN too (its preset, issue 20)
        assert new.z.cond_sharp[:4, 1].all()
    else:  # NaN flows through the group (and its unit): no cond at all there
        assert np.isnan(new.cond[grp0]).all() and np.isnan(new.z.cond[:4, 0]).all()


@pytest.mark.parametrize("convention", ["trl", "verl"])
def test_fallback_singleton_groups(convention):
    r = np.concatenate([HEALTHY, [[2.0, 3.0]]])
    g = [0] * 4 + [1]
    tc = np.ones(5, dtype=np.int64) if convention == "verl" else None
    new = gdpo.gdpo_advantages(r, g, convention=convention, token_counts=tc)
    old = _old(gdpo.gdpo_advantages, r, g, convention=convention, token_counts=tc)
    one = np.arange(5) == 4
    _fallback(new.z, old.z, np.broadcast_to(one[:, None], (5, 2)))
    _fallback(new.combined, old.combined, one)
    _fallback(new, old, np.ones(5, bool))  # the unit holds the singleton (and verl whitens per token)
    assert new.z.cond_sharp[:4].all() and new.combined.cond_sharp[:4].all()


_SKIP = dataclasses.replace(CONVENTIONS["spec"], name="skip", group_eps_placement="skip_if_zero",
                            whiten_eps_placement="skip_if_zero")


# This test ran under the spec convention (eps 1e-4), where a collapsed column and a collapsed
# unit now take the closed form with theta = 0 (z = d / h is differentiable at a zero std when
# eps > 0 is added to it: test_collapsed_column_takes_the_closed_form). The fallback remains
# where no first order exists or it exceeds Samuelson's cap: eps = 0, eps = 5e-324, no eps.
@pytest.mark.parametrize("conv,eps", [("spec", 0.0), ("spec", 5e-324), (_SKIP, None)],
                         ids=["eps0", "eps5e-324", "skip"])
def test_fallback_collapsed_column_and_unit(conv, eps):
    r = np.array([[1.0, 0.0], [1.0, 2.0], [1.0, 5.0], [0.0, 1.0], [2.0, 0.0], [1.0, 3.0]])
    g, u = [0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 1]
    new = gdpo.gdpo_advantages(r, g, unit_ids=u, eps=eps, convention=conv)
    old = _old(gdpo.gdpo_advantages, r, g, unit_ids=u, eps=eps, convention=conv)
    assert new.group_collapsed[0, 0] and not new.group_collapsed[1].any()
    first = np.arange(6) < 3
    zmask = np.zeros((6, 2), bool)
    zmask[:3, 0] = True
    _fallback(new.z, old.z, zmask)
    _fallback(new.combined, old.combined, first)
    _fallback(new, old, first)
    assert new.z.cond_sharp[:3, 1].all() and new.cond_sharp[~first].all()
    # a unit whose combined values are equal in exact arithmetic (three weighted copies cancel)
    w = [float.fromhex(x) for x in ("0x1.1d0361dd0bf71p-2", "0x1.3b1b0f3282684p-3", "-0x1.ba90e9764d2b3p-2")]
    col = np.array([0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    rr = np.stack([col] * 3, 1)
    new = gdpo.gdpo_advantages(rr, [0, 0, 0, 1, 1, 1], weights=w, eps=eps, convention=conv)
    old = _old(gdpo.gdpo_advantages, rr, [0, 0, 0, 1, 1, 1], weights=w, eps=eps, convention=conv)
    assert new.unit_collapsed.all()
    _fallback(new, old, np.ones(6, bool))


def test_fallback_group_beyond_the_cap(monkeypatch):
    monkeypatch.setattr(cn, "CAP", 4)
    r = np.array([[0.0], [1.0], [3.0], [7.0], [2.0], [5.0], [1.0], [4.0]])
    g = [0] * 6 + [1] * 2
    new = gdpo.gdpo_advantages(r, g, unit_ids=[0] * 6 + [1] * 2)
    old = _old(gdpo.gdpo_advantages, r, g, unit_ids=[0] * 6 + [1] * 2)
    big = np.arange(8) < 6
    _fallback(new.z, old.z, big[:, None])
    _fallback(new.combined, old.combined, big)
    _fallback(new, old, big)
    assert new.z.cond_sharp[~big].all() and new.cond_sharp[~big].all()


def test_fallback_group_straddling_two_units():
    r = np.array([[0.0], [1.0], [3.0], [7.0], [2.0], [5.0], [1.0], [4.0], [0.5], [2.5]])
    g = [0, 0, 0, 1, 1, 1, 2, 2, 3, 3]
    u = [0, 0, 1, 1, 1, 1, 2, 2, 2, 2]  # group 0 straddles units 0 and 1
    new = gdpo.gdpo_advantages(r, g, unit_ids=u)
    old = _old(gdpo.gdpo_advantages, r, g, unit_ids=u)
    straddled = np.arange(10) < 6
    _fallback(new, old, straddled)
    assert new.z.cond_sharp.all() and new.combined.cond_sharp.all() and new.cond_sharp[~straddled].all()


def test_fallback_z_below_the_frames():
    """A column whose range (2^-1000) is far below eps (2^124): |z| < 2^-1100."""
    r = np.array([[2.0 ** -1000], [0.0], [3 * 2.0 ** -1000], [2.0 ** -1000]])
    new = gdpo.gdpo_advantages(r, [0, 0, 0, 0], eps=2.0 ** 124)
    old = _old(gdpo.gdpo_advantages, r, [0, 0, 0, 0], eps=2.0 ** 124)
    _fallback(new.z, old.z, np.ones((4, 1), bool))
    _fallback(new, old, np.ones(4, bool))


def test_no_whitening_is_the_combined_stage():
    r, g = HEALTHY, [0, 0, 1, 1]
    res = gdpo.gdpo_advantages(r, g, convention="multireward_grpo")
    assert np.array_equal(res.cond, res.combined.cond) and np.array_equal(res.cond_sharp, res.combined.cond_sharp)
    assert res.cond_sharp.all()


# ------------------------------------------------------------- negative controls


def _fixed_theta(value, theta_of=cn._theta):
    """oracle.condition._theta with theta = ``value`` and 1 - theta = 1 - ``value``: 1 drops the
    bracket's (1 - theta) y y^T term, 0 its whole theta y y^T term."""
    def theta(*args):
        t, om, hm, hx = theta_of(*args)
        return np.full_like(t, value), np.full_like(om, 1.0 - value), hm, hx
    return theta


def _finish_without_error_bound(T, E, x, ok, old):
    """oracle.condition.finish reporting the computed T alone, without its error bound."""
    old = np.asarray(old, dtype=np.float64)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        v = cn._ldexp(T, x)
        crit = 0.0 <= cn.SHARP * T
    ok = ok & np.isfinite(v)
    sharp = ok & crit & (v >= 2.0 ** -1022)
    return np.where(np.isnan(old), old, np.where(ok, v, old)), sharp & ~np.isnan(old)


#: the negative controls, never in production: what each replaces in oracle.condition
CONTROLS = {"one_minus_theta": ("_theta", _fixed_theta(1.0)), "theta": ("_theta", _fixed_theta(0.0)),
            "error_bound": ("finish", _finish_without_error_bound)}


@pytest.fixture
def control(monkeypatch):
    def set_(name):
        if name is None:
            monkeypatch.undo()
        else:
            monkeypatch.setattr(cn, *CONTROLS[name])
    return set_


def test_control_without_one_minus_theta_breaks_the_checks(control):
    """Dropping the bracket's (1 - theta) y y^T term: on [0, 1, 3, 7] the sharp value moves
    above the first-order change (an absolute value of a sum is no sum of absolute values);
    on [0, 1] (where the bracket is that term alone) cond falls below it."""
    control("one_minus_theta")
    with pytest.raises(AssertionError, match="sharp cond"):
        check_all(np.array([0.0, 1.0, 3.0, 7.0]), [0] * 4)
    with pytest.raises(AssertionError, match="below the first-order change"):
        check_all(np.array([0.0, 1.0]), [0, 0])


def test_control_without_theta_breaks_sharpness(control):
    control("theta")
    with pytest.raises(AssertionError, match="sharp cond"):
        check_all(np.array([0.0, 1.0, 3.0, 7.0]), [0] * 4)


def test_control_without_the_error_bound_breaks_the_upper_bound(control):
    """[0, 1, 1, 1] at eps 1e-8: the outlier's row of the projector vanishes exactly, its
    first-order change is (1 - theta) ~ eps / h of the terms, and the float64 evaluation of
    the cancelling bracket lands below it: only the error bound makes cond an upper bound."""
    control("error_bound")
    with pytest.raises(AssertionError, match="below the first-order change"):
        check_all(np.array([0.0, 1.0, 1.0, 1.0]), [0] * 4, eps=1e-8)
    control(None)
    check_all(np.array([0.0, 1.0, 1.0, 1.0]), [0] * 4, eps=1e-8)


def test_zz_report_statistics():
    """Not a check: prints what the brute-force runs above covered (run with -s)."""
    print(f"\nbrute force: {STATS['cases']} cases, {STATS['elements']} outputs, {STATS['sharp']} sharp, "
          f"max cond/brute where sharp {STATS['max_ratio']!r} (1 + {STATS['max_ratio'] - 1:.3g})")


# ------------------------------------------------------------- an upper bound, always


@pytest.mark.parametrize("rewards,eps", [
    (np.array([[1.0], [-1.0], [0.0]]), None),  # z[2]: the stage-wise 1.4801493512317522e-16 < 1.48014935123175221e-16
    (np.array([[0.0], [0.0], [1.0]]), 2.0 ** 250),  # z[0]: the stage-wise 4.0909112210814386e-92, 1 - 5e-17 below
])
def test_sharp_output_is_never_below_the_change(rewards, eps):
    """Where the stage-wise triangle inequalities are tight (z of a sample at its group's mean,
    whose own ulp is 2^-1074), the stage-wise bound equals the change up to its float64
    rounding: it was reported (the smaller of the two) and lay just below it. The tight value,
    an upper bound by construction, is reported wherever the closed form applies."""
    res, _ = check_all(rewards, [0, 0, 0], eps=eps)
    assert res.z.cond_sharp.all()


def test_first_order_change_below_float64_is_bounded_by_5e_324():
    """z of [0, 5e-324, 1e-323] with eps 1e10 moves by 6.6e-334 per ulp: below 2^-1074, yet
    positive; cond was 0.0. Every cond not NaN is now at least 5e-324 (an upper bound)."""
    r = np.array([[0.0], [5e-324], [1e-323]])
    z = gdpo.standardize_groups(r, [0, 0, 0], eps=1e10)
    assert np.all(z.cond >= 5e-324)
    check_all(r, [0, 0, 0], eps=1e10)


def test_underflowed_z_sensitivity_times_a_huge_weight():
    """c = 1e300 z with z ~ 5e-334 (below ZMIN: the stage-wise fallback): z's sensitivity
    flushed to 0 and 1e300 times it was 0, while c moves by 6.6e-34 per ulp. z's sensitivity
    is floored at 2^-1074 where it enters Eq. 7: 1e300 * 5e-324 = 4.9e-24."""
    r = np.array([[0.0], [5e-324], [1e-323]])
    c = gdpo.normalize_rewards(r, [0, 0, 0], weights=[1e300], eps=1e10)
    assert np.all(c.cond >= 4.9e-24)
    check_all(r, [0, 0, 0], w=[1e300], eps=1e10)


def test_unit_spread_below_float64_has_no_cap():
    """nemo_rl (no eps at Eq. 6): columns 1 and 2 cancel exactly, c is 1e-300 z_3 ~ 1e-618,
    beyond float64, with a nonzero std. One ulp of r_1 moves c by 1e-16: the first-order change
    of a is 6.6e601. The stage-wise bound, whose std flushed to 0 in its frame, took it for a
    zero std and reported Samuelson's cap 2/sqrt(3); the unit is live, so cond is a
    Cauchy-Schwarz bound there, inf where the denominator (that std) is not a float."""
    r = np.array([[1.0, -1.0, 0.0], [2.0, -2.0, 5e-324], [4.0, -4.0, 1.5e-323]])
    res, _ = check_all(r, [0, 0, 0], w=[1.0, 1.0, 1e-300], convention="nemo_rl")
    assert not res.unit_collapsed.any() and np.all(np.isinf(res.cond)) and not res.cond_sharp.any()


def test_structural_collapse_cond_follows_the_zero_std_rule():
    """A structurally collapsed unit (equal input values; two columns cancelled by weights
    [1, -1]) demands its zero bit for bit (delta 0, allowed 0), but one ulp of input
    un-collapses it: cond was 0 while one ulp moved a by 1.1e-12 (4.2e-13). cond follows spec
    section 7's rule for any zero std: the closed form where eps > 0 makes it differentiable,
    Samuelson's cap where no first order exists (eps = 0) or it exceeds the cap."""
    v = np.array([1.0, 1.0, 2.0, 3.0])
    st = gdpo.whiten(v, unit_ids=[0, 0, 1, 1])
    moved = gdpo.whiten(np.array([np.nextafter(1.0, 2.0), 1.0, 2.0, 3.0]), unit_ids=[0, 0, 1, 1])
    assert st.required_zero[:2].all() and np.all(st.delta[:2] == 0) and np.all(st.allowed()[:2] == 0)
    assert np.all(st.cond[:2] >= np.abs(moved.float64[:2])) and np.all(st.cond[:2] <= 1 / math.sqrt(2))
    r = np.array([[1.0, 1.0], [2.0, 2.0], [4.0, 4.0]])
    res = gdpo.gdpo_advantages(r, [0, 0, 0], weights=[1.0, -1.0])
    r2 = r.copy()
    r2[0, 0] = np.nextafter(1.0, 2.0)
    moved = gdpo.gdpo_advantages(r2, [0, 0, 0], weights=[1.0, -1.0])
    assert res.required_zero.all() and np.all(res.allowed() == 0) and res.unit_collapsed.all()
    assert np.all(res.cond >= np.abs(moved.float64)) and np.all(res.cond <= 2 / math.sqrt(3))
    # eps 1e-4 > 0 at Eq. 6: a = d / H is differentiable at the zero std, and cond is now its
    # closed form (Theta = 0), sharp; it was the stage-wise value under the cap, not sharp
    assert res.cond_sharp.all() and st.cond_sharp.all()
    for eps in (0.0, 5e-324):  # no first order there, or one beyond the cap: Samuelson's, not sharp
        res = gdpo.gdpo_advantages(r, [0, 0, 0], weights=[1.0, -1.0], eps=eps)
        assert np.all(res.cond >= np.abs(moved.float64)) and np.all(res.cond <= 2 / math.sqrt(3))
        assert not res.cond_sharp.any()


def test_interval_straddling_both_overflows_is_refined_not_a_crash():
    """An Eq. 6 value interval whose ends both round to infinity, of opposite signs, made
    exact.boundaries convert -inf to a Fraction (OverflowError); the precision is raised
    instead. c = 1e300 (z_1 + z_2) cancels to below float64's range and to +-2.4e-290,
    eps 2^250: a = 1.2e-569 and -+1.3e-365, which round to +0, -0 and +0."""
    r = np.array([[2.2987977977315063e279, -2.2987977977315063e279],
                  [0.0, -6.4555211051719361e-311],
                  [-8.7584252605599352e-311, 8.7584252605599352e-311]])
    res, _ = check_all(r, [0, 0, 0], w=[1e300, 1e300], eps=2.0 ** 250)
    assert np.all(res.float64 == 0.0) and list(np.signbit(res.float64)) == [False, True, False]
    assert not res.exact_zero.any()


def test_raw_singleton_cond_is_absolute():
    """A raw singleton column (verl: z = r / (1 + eps)) measured its ulp in the column's frame
    and reported it as absolute: cond 0.5 for r = 1e300, whose ulp moves z by 1.5e284."""
    z = gdpo.standardize_groups(np.array([[1.0], [2.0], [1e300]]), [0, 0, 1], convention="verl")
    eps = get_convention("verl").group_eps
    with mp.workprec(PREC):
        first = mpf(math.ulp(1e300)) / (1 + mpf(eps))
        assert first <= mpf(float(z.cond[2, 0])) <= first * (1 + mpf(2) ** -40)


# ------------------------------------------------------------- a zero std, eps > 0


#: conventions whose denominator is differentiable at a zero std: eps > 0 added to the std
#: ("std"; "std_if_positive", whose perturbed std is positive) or to the variance ("var")
VAR = dataclasses.replace(CONVENTIONS["spec"], name="var", group_eps_placement="var", whiten_eps_placement="var")
COLLAPSE_CONVS = [("spec", None), ("spec", 1e-8), ("trl", None), ("nemo_rl", None), (VAR, None)]


def _collapsed_first_order(n, value, eps, placement):
    """The first-order change of z_l in a collapsed column of n equal values: z = d / h with
    h -> h0 = eps (std) or sqrt(eps) (var) as d -> 0 (the std's share is |d|-sized, so second
    order in z = d / h), dz_l / dx_j = (delta_lj - 1/n) / h0, and with every ulp equal,
    sum_j |delta_lj - 1/n| ulp / h0 = 2 (n - 1) / n ulp / h0 (exact, as an mpf)."""
    with mp.workprec(PREC):
        h0 = mpf(eps) if placement in ("std", "std_if_positive") else mpmath.sqrt(mpf(eps))
        return 2 * mpf(n - 1) / n * _ulp(value) / h0


@pytest.mark.parametrize("ci", range(len(COLLAPSE_CONVS)),
                         ids=[f"{getattr(c, 'name', c)}-eps{e}" for c, e in COLLAPSE_CONVS])
@pytest.mark.parametrize("n", [2, 3, 16])
def test_collapsed_column_takes_the_closed_form(ci, n):
    """A group column of n equal rewards (z = 0 by the collapse rule) beside a live one, and a
    second group: with eps > 0 in the denominator, z = d / h is differentiable at d = 0 and
    its first-order change is the closed form with theta = 0. It was the stage-wise value
    capped by Samuelson, not sharp, and every c and a of its unit fell back with it."""
    conv, eps = COLLAPSE_CONVS[ci]
    conv = get_convention(conv)
    rng = np.random.default_rng(n)
    r = np.zeros((n + 3, 2))
    r[:n, 0] = 1.0  # collapsed, binary-like
    r[:n, 1] = rng.normal(size=n)  # live (generic: no cancelling bracket at eps 1e-8)
    r[n:, 0] = [0.0, 1.0, 1.0]
    r[n:, 1] = [0.5, -1.25, 2.0]
    g = [0] * n + [1] * 3
    res, (bz, _, _) = check_all(r, g, w=[1.0, 0.5], convention=conv, eps=eps)
    assert res.group_collapsed[0, 0] and not res.group_collapsed[0, 1] and not res.group_collapsed[1].any()
    assert res.z.cond_sharp.all() and res.combined.cond_sharp.all() and res.cond_sharp.all()
    e = conv.group_eps if eps is None else eps
    first = _collapsed_first_order(n, 1.0, e, conv.group_eps_placement)
    with mp.workprec(PREC):
        for i in range(n):
            # the brute force differentiates through the collapse: the central difference of
            # d / (s |delta| + eps) is (d / eps)(1 - s |delta| / eps), 2^-160 relative here
            assert abs(bz[i, 0] - first) <= first * mpf(2) ** -100
            assert first <= mpf(float(res.z.cond[i, 0])) <= first * SHARP
    assert res.z.cond[:n, 0].max() < 1e-6  # ulp / eps-sized, far below the cap (n - 1)/sqrt(n)


UNIT_CONVS = [c for c in COLLAPSE_CONVS if c[0] != "nemo_rl"]  # nemo_rl whitens with no eps


@pytest.mark.parametrize("ci", range(len(UNIT_CONVS)),
                         ids=[f"{getattr(c, 'name', c)}-eps{e}" for c, e in UNIT_CONVS])
def test_collapsed_unit_takes_the_closed_form(ci):
    """Units whose combined values are equal in exact arithmetic: three weighted copies of one
    column cancelling (not structural), and two equal columns with weights [1, -1] (a
    structural zero, demanded bit for bit: delta and allowance 0 unchanged). With eps > 0 at
    Eq. 6 a = d / H is differentiable at d = 0 (Theta = 0, H0 = eps or sqrt(eps)): sharp,
    where it was the stage-wise value capped by Samuelson."""
    conv, eps = UNIT_CONVS[ci]
    conv = get_convention(conv)
    w = [float.fromhex(x) for x in ("0x1.1d0361dd0bf71p-2", "0x1.3b1b0f3282684p-3", "-0x1.ba90e9764d2b3p-2")]
    col = np.array([0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    res, _ = check_all(np.stack([col] * 3, 1), [0, 0, 0, 1, 1, 1], w=w, convention=conv, eps=eps)
    assert res.unit_collapsed.all() and not res.required_zero.any()
    assert res.cond_sharp.all()
    r = np.array([[1.0, 1.0], [2.0, 2.0], [4.0, 4.0]])
    res, _ = check_all(r, [0, 0, 0], w=[1.0, -1.0], convention=conv, eps=eps)
    if conv.algorithm == "shift_invariant":
        assert res.unit_collapsed.all() and res.required_zero.all() and np.all(res.allowed() == 0)
        assert np.all(res.delta == 0)
    else:  # a peer's mean-then-subtract code is not held to bitwise zeros: its zeros get its bound
        assert res.unit_collapsed.all() and not res.required_zero.any() and np.all(res.delta > 0)
    assert res.cond_sharp.all()


def test_collapsed_column_in_a_unit_with_a_collapsed_group():
    """A unit of three groups, one of them collapsed in both columns (c = 0 there) and one in
    one column: every z, c and a matches brute force, and every one is sharp but the columns
    of zeros, whose first-order change 2 (n - 1)/n 2^-1074 / eps is a subnormal (not sharp by rule)."""
    r = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0],
                  [0.0, 1.0], [0.0, 2.0], [0.0, 5.0],
                  [0.0, 1.0], [1.0, 0.0], [1.0, 3.0], [0.0, 0.5]])
    g = [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    res, _ = check_all(r, g, w=[1.0, -0.75])
    assert res.group_collapsed[0].all() and res.group_collapsed[1, 0] and not res.group_collapsed[2].any()
    zeros = np.zeros((10, 2), bool)
    zeros[3:6, 0] = zeros[0:3, 1] = True
    assert res.z.cond_sharp[~zeros].all() and not res.z.cond_sharp[zeros].any()
    assert np.all(res.z.cond[zeros] < 1e-318)
    assert res.combined.cond_sharp.all() and res.cond_sharp.all()


def test_whiten_units_collapsed_unit_takes_the_closed_form():
    v = np.array([1.0, 1.0, 2.0, 3.0, 0.25, 0.25, 0.25])
    units = [0, 0, 1, 1, 2, 2, 2]
    for conv in ("spec", VAR):
        st = gdpo.whiten(v, unit_ids=units, convention=conv)
        assert st.cond_sharp.all() and st.required_zero[[0, 1, 4, 5, 6]].all()
        check_stage(st.cond, st.cond_sharp, brute_whiten(v, units, conv, None), "a")


@pytest.mark.parametrize("n", [2, 3, 16])
def test_collapsed_column_beyond_the_cap_keeps_the_cap(n):
    """eps = 5e-324: the first-order change of a collapsed column is an ulp over eps, beyond
    float64 and far beyond Samuelson's cap (n - 1)/sqrt(n), which one ulp cannot exceed: the
    cap (spec section 7), not sharp, and so are its c and a (as before). Likewise where the
    denominator has no eps (skip_if_zero) or eps = 0: no first order at a zero std. (There the
    stage-wise value divided by the collapse rule's placeholder denominator 1 and reported 1.0
    for n = 3 and 16, below the 1.15 and 3.75 that one ulp of one input moves z by.)"""
    r = np.zeros((n + 3, 1))
    r[:n, 0] = 1.0
    r[n:, 0] = [0.0, 1.0, 3.0]
    g = [0] * n + [1] * 3
    skip = dataclasses.replace(CONVENTIONS["spec"], name="skip", group_eps_placement="skip_if_zero",
                               whiten_eps_placement="skip_if_zero")
    cap = (n - 1) / math.sqrt(n)
    for conv, eps in (("spec", 5e-324), ("spec", 0.0), (skip, None), (VAR, 5e-324)):
        res = gdpo.gdpo_advantages(r, g, eps=eps, convention=conv)
        old = _old(gdpo.gdpo_advantages, r, g, eps=eps, convention=conv)
        assert res.group_collapsed[0, 0]
        first = np.arange(n + 3) < n
        assert np.allclose(res.z.cond[first, 0], cap, rtol=1e-15, atol=0)
        _fallback(res.z, old.z, first[:, None])
        _fallback(res.combined, old.combined, first)
        _fallback(res, old, np.ones(n + 3, bool))  # one unit, holding the collapsed column
    # a collapsed unit at eps = 5e-324: Samuelson's cap, as before
    w = [float.fromhex(x) for x in ("0x1.1d0361dd0bf71p-2", "0x1.3b1b0f3282684p-3", "-0x1.ba90e9764d2b3p-2")]
    rr = np.stack([np.array([0.0, 1.0, 0.0, 1.0, 1.0, 0.0])] * 3, 1)
    res = gdpo.gdpo_advantages(rr, [0, 0, 0, 1, 1, 1], weights=w, eps=5e-324)
    old = _old(gdpo.gdpo_advantages, rr, [0, 0, 0, 1, 1, 1], weights=w, eps=5e-324)
    assert res.unit_collapsed.all()
    _fallback(res, old, np.ones(6, bool))
    assert np.allclose(res.cond, 5 / math.sqrt(6), rtol=1e-15, atol=0)
