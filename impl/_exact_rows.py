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
    """(P, lo, hi, Q, d) of one group column: the numerators P_i = n (X_i - mean) in X's units
    (X = x 2**d, integers: every float is an integer over a power of two), the enclosure of
    the denominator std + eps in those units as (numerator, 2**shift) pairs of integers (None
    if the column is collapsed) and Q = n sum X**2 - S1**2, the exact variance times
    n (n - 1) 4**d."""
    n = len(vals)
    ratios = [v.as_integer_ratio() for v in vals]
    D = max(den for _, den in ratios)
    X = [num * (D // den) for num, den in ratios]
    S1 = sum(X)
    Q = n * sum(x * x for x in X) - S1 * S1
    P = [n * x - S1 for x in X]
    d = D.bit_length() - 1
    if Q == 0:
        return P, None, None, 0, d
    m = n * (n - 1)
    s = math.isqrt((Q << (2 * PREC)) // m)
    en, ee = _dyadic(eps)  # eps = en / 2**ee; eps X's units = en D / 2**ee
    sh = max(PREC, ee)
    e_part = (en * D) << (sh - ee)
    lo = ((s << (sh - PREC)) + e_part, sh)
    hi = (((s + 1) << (sh - PREC)) + e_part, sh)
    return P, lo, hi, Q, d


def combined(rows_of_group: list[list[float]], weights: list[float], eps: float, which=None):
    """For the rows ``which`` (default all) of one group (``rows_of_group``: n rows of K
    rewards, floats): (lo, hi, zero) with c* in [lo, hi] (Fractions) and zero True where
    c* = 0 exactly.

    Integers only until the two Fractions of each row: column k's exact variance is
    Q_k / (n (n - 1) 4**d_k), so columns of equal variance have equal Q_k 4**(dmax - d_k); a
    class's numerator sum_k w_k (x_k - mean_k) is, times n 2**(wshift + dmax), the integer
    sum_k W_k P_k 2**(dmax - d_k) (W_k = w_k 2**wshift)."""
    n = len(rows_of_group)
    K = len(weights)
    cols = [_column([float(rows_of_group[i][k]) for i in range(n)], eps) for k in range(K)]
    wd = [_dyadic(w) for w in weights]
    wshift = max(e for _, e in wd)
    dmax = max(col[4] for col in cols)
    keys = [col[3] << 2 * (dmax - col[4]) for col in cols]  # equal exactly where the variances are
    unit = 1 << (FIX + wshift)
    out = []
    for i in (range(n) if which is None else which):
        lo = hi = 0  # in units of 2**-(FIX + wshift)
        classes: dict = {}
        for k in range(K):
            P, dlo, dhi, _, d = cols[k]
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
            classes[keys[k]] = classes.get(keys[k], 0) + ((f * p) << (dmax - d))
        if not any(classes.values()):
            out.append((Fraction(0), Fraction(0), True))
        else:
            out.append((Fraction(lo, unit), Fraction(hi, unit), False))
    return out
