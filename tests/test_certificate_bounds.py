"""The certificate's bounds against the exact values (issue 27): every bound tier 0 and the
group-exact tier rely on, checked directly rather than through the outputs they round.

A correctly rounded output is weak evidence for a bound: the float64 result is usually far
from a rounding boundary, so a bound too small by a factor of ten would rarely change an output.
Here each bound is compared with the exact quantity it bounds, computed in mpmath at 200 bits
from the rewards (the spec's formulas, independently of impl and of the oracle):

* Eq. 4's own, column by column: |den - D*| <= dD and |z - z*| <= u zb + ddev + zb dD
  (:func:`impl._certify.bounds.eq4_column`);
* every row's |c - c*| <= e (:func:`impl._certify.bounds.eq47_rows`, Eq. 4 then Eq. 7);
* over each unit of whole groups, the root mean square of |c - c*| <= erms (the same
  function's second figure, which Eq. 6's denominator takes);
* each unit's |den - D*| <= dD (:func:`impl._certify.bounds.eq6_units`: the plain path's
  denominator and its bound), and |M - M*| <= dmean off units of whole groups;
* every row's |a - a*| <= alpha + beta |a| (tier 0's bound, the same function's);
* with labelled ragged groups, the longest group's row bound and tier 0's bound built on it.

On families that push each term: 0/1 and small integer rewards (exact sums), large offsets and
near-constant columns (inexact differences and means), float64 and bfloat16 rewards, groups of
2 to 16 rows, weights with a sign and a zero, units of whole groups and units that cut groups.
The bounds are worst cases; the exact quantities measured here are 1-15% of them. The negative controls
shrink a bound a thousandfold and must see it broken, so the comparisons are live.

Run: ``python3 -m pytest -q tests/test_certificate_bounds.py`` (about 10 s).
"""

from __future__ import annotations

import math
import os
import sys

import mpmath
import pytest
import torch

from impl import _certify, gdpo
from impl._certify import bounds as CB, tiers as CT

sys.path.insert(0, os.path.dirname(__file__))
from _eq4_statistics import eq4_statistics  # noqa: E402

EPS = 1e-6
_PREC = 200


def _rewards(family: str, n: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if family == "normal":
        return torch.randn(n, k, generator=gen)
    if family == "offset":  # differences inexact in the plain path's scaled domain, a large mean
        return 1e4 + 3 * torch.randn(n, k, generator=gen)
    if family == "near_constant":  # a spread of 1e-3 on values near 1: the mean's rounding counts
        return 1 + 1e-3 * torch.randn(n, k, generator=gen, dtype=torch.float64)
    if family == "wide":  # float64, magnitudes 1e-3 to 1e3 in one group: inexact differences, large ranges
        return torch.randn(n, k, generator=gen, dtype=torch.float64) * 10.0 ** (6 * torch.rand(n, k, generator=gen,
                                                                                              dtype=torch.float64) - 3)
    if family == "outlier":  # every eighth row far from the rest: Samuelson's extreme deviations
        r = 1e-3 * torch.randn(n, k, generator=gen, dtype=torch.float64)
        r[::8] += 1.0
        return r
    if family == "binary":
        return (torch.rand(n, k, generator=gen) < 0.5).float()
    if family == "integers":
        return torch.randint(-5, 6, (n, k), generator=gen).to(torch.bfloat16)
    raise ValueError(family)


def _exact_c(r: torch.Tensor, labels: list[int], weights: list[float]) -> list:
    """c* of every row (mpmath at _PREC bits), each row's group its label, ddof 1."""
    mpmath.mp.prec = _PREC
    x = r.to(torch.float64).tolist()
    out = [None] * len(x)
    members: dict = {}
    for i, q in enumerate(labels):
        members.setdefault(q, []).append(i)
    for rows in members.values():
        g = len(rows)
        z = []
        for k in range(len(weights)):
            col = [mpmath.mpf(x[i][k]) for i in rows]
            m = mpmath.fsum(col) / g
            sd = mpmath.sqrt(mpmath.fsum((v - m) ** 2 for v in col) / (g - 1))
            z.append([(v - m) / (sd + EPS) for v in col])
        for j, i in enumerate(rows):
            out[i] = mpmath.fsum(w * z[k][j] for k, w in enumerate(weights))
    return out


def _context(r: torch.Tensor, weights: list[float], sizes: list[int], **groups) -> _certify.Context:
    """The certified call's context (after its tiers ran: tier 0's bounds in ``ctx.units``);
    ``groups``: group_size= or group_ids=."""
    seen = []
    real = _certify.certify
    _certify.certify = lambda ctx, y: seen.append(ctx) or real(ctx, y)
    try:
        gdpo.gdpo_advantages(r, weights=weights, segment_sizes=sizes, eps=EPS, certified="narrow", **groups)
    finally:
        _certify.certify = real
    return seen[-1]


def _row_bound(ctx) -> tuple[float, float]:
    """(e, erms) of the call, as tier 0 takes them (``bounds.eq47_rows`` of its longest group)."""
    exact = CB.exact_sums(ctx.inp.rewards.dtype, *CT.magnitudes(ctx), ctx.n_max)
    return CB.eq47_rows(ctx.n_max, tuple(ctx.inp.weights), exact)


def _unit(ctx, j: int) -> dict:
    """Unit j's numbers (``bounds.Units``), host floats."""
    return {k: v[j].item() for k, v in vars(ctx.units).items()}


def _measure(family: str, g: int, sizes_kind: str, weights: list[float], seed: int = 0) -> dict:
    """Each bound's largest use (the exact quantity over its bound) over one batch."""
    n = 24 * g
    r = _rewards(family, n, len(weights), seed)
    sizes = [n // 2, n // 2] if sizes_kind == "whole" else [5 * g + 1, n - 5 * g - 1]
    ctx = _context(r, weights, sizes, group_size=g)
    e, erms = _row_bound(ctx)
    cs = _exact_c(r, [i // g for i in range(n)], weights)
    c = ctx.c.tolist()
    err = [abs(mpmath.mpf(a) - b) for a, b in zip(c, cs)]
    use = {"row": max(err) / e, "rms": 0.0, "den": 0.0, "mean": 0.0, "a": 0.0}
    a = ctx.a.tolist()
    start = 0
    for j, T in enumerate(sizes):
        cu = cs[start:start + T]
        M = mpmath.fsum(cu) / T
        D = mpmath.sqrt(mpmath.fsum((v - M) ** 2 for v in cu) / (T - 1)) + EPS
        un = _unit(ctx, j)
        assert math.isfinite(un["dD"]) and un["whole"] == (sizes_kind == "whole")
        if un["whole"]:
            rms = mpmath.sqrt(mpmath.fsum(x * x for x in err[start:start + T]) / T)
            use["rms"] = max(use["rms"], rms / erms)
        else:
            centre = mpmath.mpf(un["shift"]) + mpmath.mpf(un["mean"])  # M, exact, scaled
            use["mean"] = max(use["mean"], abs(centre - M * un["f"]) / un["dmean"])
        use["den"] = max(use["den"], abs(mpmath.mpf(un["den"]) - D * un["f"]) / un["dD"])
        al, be = un["alpha"], un["beta"]
        for i in range(start, start + T):
            exact_a = (cu[i - start] - M) / (D)
            use["a"] = max(use["a"], abs(mpmath.mpf(a[i]) - exact_a) / (al + be * abs(a[i])))
        start += T
    return {k: float(v) for k, v in use.items()}


CASES = [(f, g, s) for f in ("normal", "offset", "near_constant", "wide", "outlier", "binary", "integers")
         for g in (2, 3, 8, 16) for s in ("whole", "cut")]


@pytest.mark.parametrize("family,g,sizes_kind", CASES)
def test_bounds_hold_against_the_exact_values(family, g, sizes_kind):
    weights = [1.0, -0.5, 2.0] if g % 2 else [1.0, 0.0, 0.75]
    use = _measure(family, g, sizes_kind, weights, seed=g)
    assert all(v <= 1.0 for v in use.values()), use


def _labelled_case(family: str, seed: int, permuted: bool):
    """Ragged labelled groups (2 to 9 rows), in runs or with the rows shuffled: rewards, labels."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(2, 10, (30,), generator=gen).tolist()
    labels = torch.repeat_interleave(torch.arange(30), torch.tensor(sizes))
    if permuted:
        labels = labels[torch.randperm(labels.numel(), generator=gen)]
    return _rewards(family, labels.numel(), 3, seed), labels


@pytest.mark.parametrize("permuted", [False, True])
@pytest.mark.parametrize("family", ["normal", "offset", "wide", "binary", "integers"])
def test_labelled_groups_bounds_hold_against_the_exact_values(family, permuted):
    """Labelled ragged groups take the longest group's Eq. 4/7 bound per row (E = 0 on a row of a
    constant group) and tier 0's alpha + beta |a| from it (``eq6_units`` on the padded layout's
    statistics): both against the exact values, two units that cut groups."""
    weights = [1.0, -0.5, 2.0]
    r, labels = _labelled_case(family, seed=7, permuted=permuted)
    n = r.shape[0]
    sizes = [n // 3, n - n // 3]
    ctx = _context(r, weights, sizes, group_ids=labels)
    e, _ = _row_bound(ctx)
    cs = _exact_c(r, labels.tolist(), weights)
    c, a = ctx.c.tolist(), ctx.a.tolist()
    E = torch.where(CT.flat_rows(ctx), 0.0, e).tolist()
    use = {"row": max(float(abs(mpmath.mpf(ci) - cx) / x) for ci, cx, x in zip(c, cs, E) if x > 0), "a": 0.0}
    alpha, beta = ctx.units.alpha.tolist(), ctx.units.beta.tolist()
    unit = [u for u, T in enumerate(sizes) for _ in range(T)]
    B = [alpha[unit[i]] + beta[unit[i]] * abs(a[i]) for i in range(n)]
    start = 0
    for T in sizes:
        cu = cs[start:start + T]
        M = mpmath.fsum(cu) / T
        D = mpmath.sqrt(mpmath.fsum((v - M) ** 2 for v in cu) / (T - 1)) + EPS
        for i in range(start, start + T):
            use["a"] = max(use["a"], float(abs(mpmath.mpf(a[i]) - (cs[i] - M) / D) / B[i]))
        start += T
    assert use["row"] <= 1 and use["a"] <= 1, use
    assert use["row"] > 1e-3 and use["a"] > 1e-3, use  # live: a bound a thousandfold smaller would break


@pytest.mark.parametrize("family", ["normal", "offset", "near_constant", "wide", "outlier", "binary", "integers"])
def test_eq4_column_bounds_hold_against_the_exact_values(family):
    """Eq. 4's own bounds (:func:`impl._certify.bounds.eq4_column`), column by column: the
    plain path's denominator (Eq. 4's m2, its root and eps, as Eq. 4 forms it) within dD of the
    exact one, and every z within u zb + ddev + zb dD of the exact z*."""
    mpmath.mp.prec = _PREC
    worst = {"den": 0.0, "z": 0.0}
    for g in (2, 3, 8, 16):
        r = _rewards(family, 8 * g, 3, seed=g)
        f, _, _, m2 = (t.view(3, -1).tolist() for t in eq4_statistics(r, g, EPS))
        z = gdpo.standardize_groups(r, group_size=g, eps=EPS).tolist()
        m = r.double().abs()
        exact = CB.exact_sums(r.dtype, float(m[m > 0].min()), float(m.max()), g)
        ddev, dD = CB.eq4_column(g, exact)
        zmax = (g - 1) / math.sqrt(g)
        zb = (zmax + ddev) / (1 - dD)
        x = r.to(torch.float64).tolist()
        for q in range(len(x) // g):
            for k in range(3):
                col = [mpmath.mpf(x[q * g + i][k]) for i in range(g)]
                m = mpmath.fsum(col) / g
                D = mpmath.sqrt(mpmath.fsum((v - m) ** 2 for v in col) / (g - 1)) + EPS
                den = math.sqrt(m2[k][q] / (g - 1)) + EPS * f[k][q]
                worst["den"] = max(worst["den"], float(abs(den / mpmath.mpf(f[k][q]) - D) / (dD * D)))
                for i in range(g):
                    err = abs(mpmath.mpf(z[q * g + i][k]) - (col[i] - m) / D)
                    worst["z"] = max(worst["z"], float(err / (U * zb + ddev + zb * dD)))
    assert worst["den"] <= 1 and worst["z"] <= 1, worst


U = 2.0 ** -53


def test_erms_is_tighter_than_the_row_bound_where_groups_are_larger():
    """The rms bound is the row bound for groups of 2 (|z*| = sqrt(1/2) either way) and
    shrinks with the group: about 0.52 of it for groups of 8, 0.41 for 16 (four equal weights,
    exact sums)."""
    ratios = {}
    for n in (2, 8, 16):
        emax, erms = CB.eq47_rows(n, (1.0,) * 4, True)
        ratios[n] = erms / emax
    assert ratios[2] == pytest.approx(1.0, rel=1e-6)
    assert 0.45 < ratios[8] < 0.6 and 0.35 < ratios[16] < 0.45, ratios


def test_the_bounds_grow_with_the_group():
    """Labelled groups take the longest group's bounds (``eq47_rows`` of n_max) for every group:
    sound only because each term grows with n. Checked over n = 2 .. 4096, exact sums or not:
    the column's ddev and dD, the row bound and the rms bound, and the per-row terms a and b
    the rms bound sums over a unit of groups of mixed sizes."""
    u, K = U, 8
    for exact in (False, True):
        last = (0.0,) * 6
        for n in range(2, 4097):
            ddev, dD = CB.eq4_column(n, exact)
            bound, rms = CB.eq47_rows(n, (1.0,) * K, exact)
            a, b = ddev * (1 + u) * (1 + K * u) / (1 - dD), (u + dD + K * u * (1 + u)) / (1 - dD)
            now = (ddev, dD, bound, rms, a, b)
            assert all(x >= y for x, y in zip(now, last)), (n, exact, now, last)
            last = now


@pytest.mark.parametrize("which", ["row", "rms", "den", "a"])
def test_a_bound_shrunk_a_thousandfold_is_caught(monkeypatch, which):
    """Negative controls: each comparison above sees a bound 1000 times too small."""
    import dataclasses
    if which in ("row", "rms"):
        real = CB.eq47_rows
        i = 0 if which == "row" else 1

        def shrunk(*a):
            got = list(real(*a))
            got[i] *= 1e-3
            return tuple(got)
        monkeypatch.setattr(CB, "eq47_rows", shrunk)
    else:
        real_units = CB.eq6_units

        def shrunk_units(*a, **k):
            x = real_units(*a, **k)
            if which == "den":
                return dataclasses.replace(x, dD=x.dD * 1e-3)
            return dataclasses.replace(x, alpha=x.alpha * 1e-3, beta=x.beta * 1e-3)
        monkeypatch.setattr(CB, "eq6_units", shrunk_units)
    broken = 0
    for family in ("normal", "offset", "binary"):
        use = _measure(family, 8, "whole", [1.0, 0.0, 0.75], seed=8)
        broken += use[which] > 1.0
    assert broken >= 1
