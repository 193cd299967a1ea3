"""Exact combined values of a few rows, from their groups alone, in integer arithmetic.

Every reward column of a group is scaled to integers X (every float is m 2**e), so that

    n mean = S1 = sum X,   n (X_i - mean) = P_i = n X_i - S1,   Q = n sum X**2 - S1**2

are exact integers; the column's std is sqrt(Q / (n (n - 1))) in X's units (Q = 0: a collapsed
column, whose z are exactly 0), the same for columns of equal Q, and

    c*_i = sum over classes of equal variance of  sum_{k in class} w_k (P_ik / n) / (std + eps).

* :func:`zero_rows`, vectorized over many rows: c* = 0 exactly where every class's integer sum
  sum_k W_k P_ik is 0 (the weights as integers W = w 2**s). A sufficient condition, decided
  without rounding: 0/1 rewards in groups of 8 with 4 columns have about 3% such rows, whose
  float64 c is a rounding residue (about 1e-17) and no float bound can call 0.
* :func:`combined`, row by row (a few hundred microseconds a group): c* enclosed between two
  rationals a few 2**-PREC apart (the square root between integers), and c* = 0 decided exactly.
"""

from __future__ import annotations

import math

import torch

from impl import _segments as seg_ops

_F64, _I64 = torch.float64, torch.int64
PREC = 128  # the square root's bits
FIX = 256  # c is enclosed between multiples of 2**-FIX of its scale


def integer_weights(weights: list[float]) -> list[int]:
    """The weights times 2**s as integers (exact: s the largest power of two in their denominators)."""
    ratios = [float(w).as_integer_ratio() for w in weights]
    s = max(d.bit_length() - 1 for _, d in ratios)
    return [num << (s - (d.bit_length() - 1)) for num, d in ratios]


def _integers(v: torch.Tensor) -> torch.Tensor | None:
    """float64 ``v`` as int64 X = v / 2**q, 2**q the largest power of two dividing every value;
    None where some |X| reaches 2**53 or the scaling leaves float64's range."""
    m, e = torch.frexp(v)  # v = m 2**e, |m| in [0.5, 1): m 2**53 an integer
    M = (m * 2.0 ** 53).to(_I64)
    nz = M != 0
    if not bool(nz.any()):
        return torch.zeros(v.shape, dtype=_I64, device=v.device)
    low = torch.frexp((M & -M).to(_F64))[1] - 1  # trailing zeros of M
    q = int(torch.where(nz, e.to(_I64) - 53 + low, 1 << 20).amin())
    if abs(q) > 1000:
        return None
    X = seg_ops.ldexp_scalar(v, -q)  # exact: a power of two, every X an integer
    return X.to(_I64) if bool(X.abs().amax() < 2.0 ** 53) else None


def zero_rows(v: torch.Tensor, mg: torch.Tensor, inv: torch.Tensor, at: torch.Tensor,
              weights: list[float]) -> torch.Tensor:
    """(R,) bool: c* = 0 exactly (the module's sufficient condition; False: undecided) for R rows,
    from ``v`` (M, K) the rewards of their U groups' members, ``mg`` (M,) each member's group,
    ``inv`` (R,) each row's group, ``at`` (R,) its place among the members. In int64 where
    n**2 max|X|**2 < 2**62; beyond, only rows of groups constant in every column (c* = +0)."""
    v = v.to(_F64)
    K = v.shape[1]
    n = torch.bincount(mg)
    U = n.numel()
    X = _integers(v)
    if X is None or float(X.abs().amax()) ** 2 * float(n.max()) ** 2 >= 2.0 ** 62:
        idx = mg[:, None].expand(-1, K)
        hi = torch.full((U, K), -math.inf, dtype=_F64, device=v.device).scatter_reduce_(0, idx, v, "amax")
        lo = torch.full((U, K), math.inf, dtype=_F64, device=v.device).scatter_reduce_(0, idx, v, "amin")
        return (hi == lo).all(1).index_select(0, inv)
    S1 = torch.zeros(U, K, dtype=_I64, device=v.device).index_add_(0, mg, X)
    Q = n[:, None] * torch.zeros(U, K, dtype=_I64, device=v.device).index_add_(0, mg, X * X) - S1 * S1
    P = n.index_select(0, inv)[:, None] * X.index_select(0, at) - S1.index_select(0, inv)
    return _cancel(P, Q.index_select(0, inv), weights)


def _cancel(P: torch.Tensor, Q: torch.Tensor, weights: list[float]) -> torch.Tensor:
    """(R,) bool: in each row, within every class of columns of equal Q, sum_k w_k P_k = 0 exactly,
    in int64 with integer weights W where K max|W| max|P| < 2**62; beyond, the classes are split
    further by |w| (a weaker, still exact, test)."""
    K = P.shape[1]
    W = integer_weights(weights)
    wmax = max(abs(x) for x in W)
    if wmax < 1 << 62 and int(P.abs().amax()) * wmax * K < 1 << 62:  # Python ints: no overflow
        terms, key = P * torch.tensor(W, dtype=_I64, device=P.device), [0] * K
    else:
        terms, key = P * torch.tensor([1 if w > 0 else -1 for w in weights], dtype=_I64, device=P.device), \
            [abs(w) for w in weights]
    live = [w != 0 for w in weights]
    pairs = torch.tensor([[live[j] and key[j] == key[k] for j in range(K)] for k in range(K)], dtype=torch.bool,
                         device=P.device)
    same = (Q[:, :, None] == Q[:, None, :]) & pairs  # (R, k, j)
    total = (same * terms[:, None, :]).sum(2)
    return ((total == 0) | ~torch.tensor(live, dtype=torch.bool, device=P.device)).all(1)


def _dyadic(x: float) -> tuple[int, int]:
    """x = num / 2**e exactly (e >= 0)."""
    num, den = x.as_integer_ratio()
    return num, den.bit_length() - 1


def _column(vals: list[float], eps: float):
    """(P, lo, hi, Q, d) of one group column: P_i = n (X_i - mean) (X = x 2**d, integers), the
    enclosure of std + eps in X's units as (numerator, shift) pairs (None: collapsed), and Q."""
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
    s = math.isqrt((Q << (2 * PREC)) // (n * (n - 1)))
    en, ee = _dyadic(eps)  # eps = en / 2**ee; eps in X's units = en D / 2**ee
    sh = max(PREC, ee)
    e_part = (en * D) << (sh - ee)
    return P, ((s << (sh - PREC)) + e_part, sh), (((s + 1) << (sh - PREC)) + e_part, sh), Q, d


def combined(rows_of_group: list[list[float]], weights: list[float], eps: float, which=None):
    """For the rows ``which`` (default all) of one group (n rows of K floats): (lo, hi, zero),
    c* in [lo, hi] (Fractions), zero where c* = 0 exactly. Integers until then: column k's
    variance is Q_k / (n (n - 1) 4**d_k), equal variances have equal Q_k 4**(dmax - d_k), and a
    class's numerator times n 2**(wshift + dmax) is the integer sum_k W_k P_k 2**(dmax - d_k)."""
    from fractions import Fraction  # (not at import: impl's import stays light)
    n, K = len(rows_of_group), len(weights)
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
            lo, hi = (lo + f * z_a, hi + f * z_b) if f >= 0 else (lo + f * z_b, hi + f * z_a)
            classes[keys[k]] = classes.get(keys[k], 0) + ((f * p) << (dmax - d))
        zero = not any(classes.values())
        out.append((Fraction(0), Fraction(0), True) if zero else (Fraction(lo, unit), Fraction(hi, unit), False))
    return out
