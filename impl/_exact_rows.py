"""Exact combined values of a few rows, from their groups alone (the certificate's tier 1a).

A row whose float64 advantage sits too close to a rounding boundary of the output format for
the float64 bound to decide gets its combined value c* = sum_k w_k z_k recomputed here, in
integer arithmetic: each reward column of its group is scaled to integers X (every float is
m 2**e), so that

    n mean = S1 = sum X,   n (X_i - mean) = P_i = n X_i - S1,   Q = n sum X**2 - S1**2,

are exact integers, the group column's std is sqrt(Q / (n (n - 1))) (ddof 1, in X's units;
Q = 0 is a collapsed column, whose z are exactly 0), and

    z_i = (P_i / n) / (sqrt(Q / (n (n - 1))) + eps X_scale).

The square root is enclosed between two rationals 2**-PREC apart (integer square root), so
c* is enclosed in an interval of exact rationals a few 2**-PREC wide (relative to the std).
c* = 0 is decided exactly where the columns whose exact variances are equal (the same
denominator) have numerators sum_k w_k (x_k - mean_k) that are exactly 0 class by class.

Python integers and fractions only: a few hundred microseconds a group, for the handful of rows
(per batch, usually none) the float64 bound leaves.
"""

from __future__ import annotations

import math
from fractions import Fraction

PREC = 128
#: the combined values' fixed point: c is enclosed between multiples of 2**-FIX of their scale
FIX = 256


def _dyadic(x: float) -> tuple[int, int]:
    """x = num / 2**e exactly (e >= 0)."""
    num, den = x.as_integer_ratio()
    return num, den.bit_length() - 1


def _column(vals: list[float], eps: float):
    """(P, n, den_lo, den_hi, V, D) of one group column: the numerators P_i = n (X_i - mean)
    in X's units (X = x D, integers), the enclosure of the denominator std + eps in those
    units as (numerator, 2**shift) pairs of integers, the exact variance V in the rewards'
    units (a Fraction; None if collapsed) and the scale D."""
    n = len(vals)
    ratios = [v.as_integer_ratio() for v in vals]
    D = max(d for _, d in ratios)
    X = [num * (D // d) for num, d in ratios]
    S1 = sum(X)
    Q = n * sum(x * x for x in X) - S1 * S1
    P = [n * x - S1 for x in X]
    if Q == 0:
        return P, n, None, None, None, D
    m = n * (n - 1)
    s = math.isqrt((Q << (2 * PREC)) // m)
    en, ee = _dyadic(eps)  # eps = en / 2**ee; eps X's units = en D / 2**ee
    sh = max(PREC, ee)
    e_part = (en * D) << (sh - ee)
    lo = ((s << (sh - PREC)) + e_part, sh)
    hi = (((s + 1) << (sh - PREC)) + e_part, sh)
    return P, n, lo, hi, Fraction(Q, m * D * D), D


def combined(rows_of_group: list[list[float]], weights: list[float], eps: float, which=None):
    """For the rows ``which`` (default all) of one group (``rows_of_group``: n rows of K
    rewards, floats): (lo, hi, zero) with c* in [lo, hi] (Fractions) and zero True where
    c* = 0 exactly."""
    n = len(rows_of_group)
    K = len(weights)
    cols = [_column([float(rows_of_group[i][k]) for i in range(n)], eps) for k in range(K)]
    wd = [_dyadic(w) for w in weights]
    wshift = max(e for _, e in wd)
    out = []
    for i in (range(n) if which is None else which):
        lo = hi = 0  # in units of 2**-(FIX + wshift)
        classes: dict = {}
        for k in range(K):
            P, nn, dlo, dhi, V, D = cols[k]
            p = P[i]
            wn, we = wd[k]
            if dlo is None or p == 0 or wn == 0:
                continue
            # z = (p / n) / den, den = num / 2**sh: z 2**FIX = p 2**(sh + FIX) / (n num)
            (nlo, sh), (nhi, _) = dlo, dhi
            top = p << (sh + FIX)
            z_a = -((-top) // (n * nhi)) if p < 0 else top // (n * nhi)  # toward 0: |z| lower
            z_b = top // (n * nlo) if p < 0 else -((-top) // (n * nlo))  # away from 0: |z| upper
            if p < 0:
                z_a, z_b = z_b, z_a  # z_a <= z_b
            f = wn << (wshift - we)
            if f >= 0:
                lo += f * z_a
                hi += f * z_b
            else:
                lo += f * z_b
                hi += f * z_a
            classes[V] = classes.get(V, Fraction(0)) + Fraction(wn * p, (1 << we) * nn * D)
        zero = all(v == 0 for v in classes.values())
        if zero:
            out.append((Fraction(0), Fraction(0), True))
        else:
            unit = 1 << (FIX + wshift)
            out.append((Fraction(lo, unit), Fraction(hi, unit), False))
    return out
