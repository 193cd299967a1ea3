"""The certificate's bounds: how far the plain path's float64 values can be from the exact ones.

Pure functions of the sizes, the weights and the statistics the plain path computed; each is
held against the exact quantity it bounds in tests/test_certificate_bounds.py. Every bound is a
sum of first-order rounding terms (each rounding's |delta| <= u of its result, a pairwise tree
of depth L: L u of the sum of magnitudes) times a small slack for the second-order terms, which
are below 2**-40 of the first-order ones wherever a bound is used (each is used only where its
relative size is below 1/4; elsewhere it is infinite). The plain path's: :func:`eq47_rows`,
:func:`eq6_units`; the double-double tier's (any unit roundoff u, worst cases over the data):
:func:`eq47_worst`, :func:`eq6_worst`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import torch

_F64 = torch.float64
U64 = 2.0 ** -53
SAFETY = 2.0
_SLACK = 1.0 + 2.0 ** -30
#: absolute underflow allowance (a few float64 subnormal steps)
TAU = 2.0 ** -1070

#: narrow formats: (mantissa bits, the exponent of the smallest normal)
NARROW = {torch.float32: (23, -126), torch.float16: (10, -14), torch.bfloat16: (7, -126)}


# --- Eq. 4 and Eq. 7 as the plain path computes them ----------------------------------------


def exact_sums(dtype, small: float, large: float, n: int) -> bool:
    """Are every difference d = (x - x_first) f of a group column and every partial sum of its
    mean's tree exact in float64, in groups of up to ``n`` rows of rewards in ``dtype`` whose
    smallest nonzero magnitude is ``small`` (inf: every reward 0) and largest ``large``? A
    narrow format's values are multiples of q, the quantum of the smallest nonzero magnitude; d
    and the partial sums are multiples of q f of magnitude at most 2 n max|x| f, exact while that
    is at most 2**53 q f. Float64 rewards have no such quantum: False."""
    if dtype not in NARROW:
        return False
    if not math.isfinite(small):
        return True
    mant, emin = NARROW[dtype]
    e = max(math.frexp(small)[1] - 1, emin) - mant  # q = 2**e
    return 2 * n * large * (1 + 2.0 ** -50) <= math.ldexp(1.0, e + 53)


@functools.lru_cache(maxsize=256)
def eq47_rows(n: int, weights: tuple, exact: bool) -> tuple[float, float]:
    """(bound, rms): the bound on |c - c*| of a row of a group of up to ``n`` rows (Eq. 4 then
    Eq. 7 as the plain path computes them; ``exact``: every column's differences and sums are
    exact, :func:`exact_sums`), and on the root mean square of |c - c*| over the rows of whole
    groups. Both grow with n, so the longest group's serve every group.

    Scaled domain (the group column's power of two f, exact): d = x f - s (s the first
    member's), |d| <= rho, the range, rho <= sqrt(2 (n - 1)) sigma (Samuelson), the exact
    deviations |d - mean| <= (n - 1)/sqrt(n) sigma. Relative to D >= sigma, per column
    (:func:`eq4_column`): a deviation's error ddev and the denominator's relative error dD;
    zb = ((n - 1)/sqrt(n) + ddev) / (1 - dD) bounds |z| and |z*|, |z - z*| <= u zb + ddev + zb
    dD, and Eq. 7 adds K u sum_k |w_k| zb.

    Row by row the same terms read |z - z*| <= (ddev (1 + u) + |z*| (u + dD)) / (1 - dD), and
    Eq. 7's K u |z_k| <= K u (1 + u) (|z*_k| + ddev) / (1 - dD): |c - c*| <= sum_k |w_k| (a_k +
    b_k |z*_k|). Over a group column sum_j z*_j**2 = (n - 1) (s / (s + eps))**2 <= n - 1, so
    over the rows of whole groups the l2 norm of |z*_k| is at most sqrt((n - 1)/n) per row, and
    (Minkowski) the rows' root mean square error at most sum_k |w_k| (a_k + b_k sqrt((n - 1)/n))."""
    if n < 2:
        return 0.0, 0.0
    u, K = U64, len(weights)
    zmax = (n - 1) / math.sqrt(n) * (1 + 4 * u)
    zrms = math.sqrt((n - 1) / n) * (1 + 4 * u)
    ddev, dD = eq4_column(n, exact)
    if not dD < 0.25:
        return math.inf, math.inf
    total = rms = 0.0
    for w in weights:
        zb = (zmax + ddev) / (1 - dD)
        total += abs(w) * (u * zb + ddev + zb * dD + K * u * zb)
        a = ddev * (1 + u) * (1 + K * u) / (1 - dD)
        b = (u + dD + K * u * (1 + u)) / (1 - dD)
        rms += abs(w) * (a + b * zrms)
    bound = total * _SLACK + (K + 1) * TAU  # an underflowing product or sum: 2**-1075 each
    return bound, min(rms * _SLACK + (K + 1) * TAU, bound)


def eq4_column(n: int, exact: bool) -> tuple[float, float]:
    """(ddev, dD) of a group column of ``n`` rows, relative to its exact denominator D* = std*
    + eps (as f scales it): |dev_j - dev*_j| <= ddev D* for every row, |den - D*| <= dD D* (inf
    where no bound holds).

    The mean's error dmu = u rho (exact sums: the division only) or (L + 2) u rho (the
    differences, the tree, the division); a deviation's ddev = dmu + u (rho + dmu) (+ eta = u rho
    for inexact differences); the denominator's ((L + 1)/2 + 2.5) u (the squares and their tree,
    the division, the root, eps) plus the std's error from the deviations' errors: the
    deviations are dev* - dmean + xi_j, and sum (dev* + xi - dmean)**2 = |dev* + xi|**2 + t with t
    = n dmean**2 - 2 dmean sum xi (sum dev* = 0): the mean's error enters to second order only;
    | |dev* + xi| - |dev*| | <= |xi|_2 <= sqrt(n) (1 + u) eta + u |dev*|_2 + u sqrt(n) dmu, and
    |sqrt(V**2 + t) - V| <= |t| / V, V >= |dev*| - |xi| (all in units of sigma <= D*)."""
    u = U64
    L = math.ceil(math.log2(n))
    rho = math.sqrt(2 * (n - 1)) * (1 + 8 * u)
    zmax = (n - 1) / math.sqrt(n) * (1 + 4 * u)
    q = math.sqrt(n / (n - 1))
    dmu = u * rho if exact else (L + 2) * u * rho
    eta = 0.0 if exact else u * rho  # a difference's own rounding
    ddev = dmu + u * (rho + dmu) + eta
    xi = (1 + u) * eta + u * (zmax + dmu)
    low = math.sqrt(n - 1) - math.sqrt(n) * xi
    if not low > 0:
        return ddev, math.inf
    dstd = q * (1 + u) * eta + u + q * u * dmu + n * (dmu * dmu + 2 * dmu * xi) / (math.sqrt(n - 1) * low)
    return ddev, u * ((L + 1) / 2 + 2.5) + dstd


# --- Eq. 6 from the plain path's statistics ---------------------------------------------------


@dataclasses.dataclass
class Units:
    """Per unit, (S,) float64 or bool arrays (NumPy, on the host): |a - a*| <= alpha + beta |a| for
    every row of the unit, ``exact0`` where every c is equal and exact (a = +0 exactly), and
    Eq. 6 as the plain path computed it (scaled domain: the unit's power of two f): a = ((c f - M)
    / den) rounded, with M = shift + mean (0 for a whole unit), and the exact a* = (c* f - M*) /
    D*, |M* - M| <= dmean, |D* - den| <= dD, D* >= eps f."""

    alpha: np.ndarray
    beta: np.ndarray
    exact0: np.ndarray
    flat: np.ndarray  # every computed c equal
    whole: np.ndarray
    f: np.ndarray
    shift: np.ndarray
    mean: np.ndarray
    dmean: np.ndarray
    den: np.ndarray
    dD: np.ndarray
    eps_f: np.ndarray


def eq6_units(table: np.ndarray, eps: float, whole: np.ndarray, emax: np.ndarray, erms: float) -> Units:
    """The bounds of every unit from the plain path's Eq. 6 statistics ``table`` ((S, 7): count,
    e, shift, mean, M2, min, max, as ``impl._whiten.Local.table`` gives them), ``whole`` (S,) the
    units of whole groups, ``emax`` (S,) the largest bound on a row's |c - c*| and ``erms`` their
    root mean square over a unit of whole groups (:func:`eq47_rows`). In NumPy on the host (a
    few values a unit), with the plain path's IEEE operations: the same denominator, bit for bit.

    A whole unit's mean is the structural 0 and d = c f exactly, so a deviation's error is the
    row's own, E f; elsewhere the mean adds its rounding ((L + 1) rho + |mean|) u and the mean
    of the rows' errors. The denominator: dD = ((L + 1)/2 + 2.5) u den + sqrt(T/(T-1)) droot,
    droot the rows' errors in l2 over sqrt(T - 1) (per row: ddev, or the rms bound of a whole
    unit); with rD = dD / den, |a - a*| <= u |a| + ddev / den + |a*| rD and |a*| <= (|a| (1 + u)
    + ddev / den) / (1 - rD). A unit whose computed c are all equal while the exact ones may not
    be has no bound from den."""
    u = U64
    T, e, shift, mean, m2, lo, hi = table.T
    with np.errstate(all="ignore"):
        f = ((1023 - e.astype(np.int64)) << 52).view(np.float64)  # 2**-e, exact
        eps_f = f * eps
        Tc = np.maximum(T, 2.0)
        L = np.ceil(np.log2(Tc))
        Ef = emax * f * (1 + 2 * u)
        rho = (hi - lo) * f * (1 + 4 * u)
        dm = ((L + 1) * rho + np.abs(mean)) * u
        ddev = np.where(whole, Ef, dm + u * (2 * rho + dm) + 2 * Ef)
        dmean = np.where(whole, 0.0, (dm + Ef) * (1 + 4 * u))
        droot = np.where(whole, erms * f * (1 + 2 * u), ddev)
        den = np.sqrt(m2 / np.maximum(T - 1, 1)) + eps_f  # std + eps as the plain path forms it
        if not eps >= 2.0 ** -52:
            den[den == 0] = 1.0
        dD = (den * (u * ((L + 1) / 2 + 2.5)) + np.sqrt(Tc / (Tc - 1)) * droot) * _SLACK
        rD = dD / den
        flat = lo == hi
        good = (rD < 0.25) & ~(flat & (emax > 0))
        alpha = np.where(good, ddev / den / (1 - rD) * _SLACK + TAU, np.inf)
        beta = np.where(good, (u + rD * (1 + u) / (1 - rD)) * _SLACK, np.inf)
    return Units(alpha, beta, flat & (emax == 0), flat, whole, f, np.where(whole, 0.0, shift),
                 np.where(whole, 0.0, mean), dmean, den, dD, eps_f)


def zero_reach(alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """How far from 0 a float64 a may lie and its a* still be 0, for |a - a*| <= alpha + beta |a|:
    |a| <= alpha / (1 - beta), raised by a 2**-30 margin (its own roundings)."""
    with np.errstate(all="ignore"):
        return np.where(beta < 1, alpha / (1 - beta), np.inf) * (1 + 2.0 ** -30)


# --- the double-double tier's worst cases -------------------------------------------------------


def eq47_worst(u: float, z_abs: torch.Tensor, n: torch.Tensor, weights: list[float]) -> torch.Tensor:
    """Per row, |c - c*| (Eq. 4 then Eq. 7 at unit roundoff u) from the row's own |z| (K columns)
    and its group's size n: the range of a group column is at most sqrt(2 (n - 1)) times its std
    (Samuelson), so with L = ceil(log2 n)

        |z - z*| <= u [(L + 4) sqrt(2 (n - 1)) (1 + |z| sqrt(n / (n - 1))) + |z| ((L + 1)/2 + 6)]
        |c - c*| <= sum_k |w_k| |z_k - z_k*| + (K + 1) u sum_k |w_k z_k|."""
    n = n.to(_F64).clamp(min=2.0)
    L = torch.ceil(torch.log2(n))
    w = torch.tensor([abs(x) for x in weights], dtype=_F64, device=z_abs.device)
    dz = u * ((L + 4)[:, None] * torch.sqrt(2 * (n - 1))[:, None] * (1 + z_abs * torch.sqrt(n / (n - 1))[:, None])
              + z_abs * ((L + 1) / 2 + 6)[:, None])
    return (dz * w).sum(1) + (z_abs.shape[1] + 1) * u * (z_abs * w).sum(1)


def eq6_worst(u: float, a: torch.Tensor, D: torch.Tensor, T: torch.Tensor, whole: torch.Tensor, E: torch.Tensor,
              R: torch.Tensor, Emax: torch.Tensor, eps: float) -> torch.Tensor:
    """Per row j of a unit (unit values (S,) already spread to rows: D a lower bound of the
    computed std + eps, T rows, whole groups, R the range of a, Emax the largest E; E per row
    the bound on |c_j - c*_j|): the bound on |a_j - a*_j|, Eq. 6 at unit roundoff u,

        u [A + |a_j| rel + 2 |a_j|] + (E_j + E_m) / D + |a_j| (E_max + E_m) sqrt(T / (T - 1)) / D

    with A = (L_T + 4) R and E_m = Emax (the rounded mean, and the mean of the rows' errors)
    except in a unit of whole groups (A = 0, E_m = 0: its exact mean is 0 and its algorithm uses
    0), rel = sqrt(T / (T - 1)) A + (L_T + 1)/2 + 4, and D no less than the exact values'
    denominator's lower bound D - Emax sqrt(T / (T - 1)) (and eps)."""
    Tf = T.to(_F64).clamp(min=2.0)
    L = torch.ceil(torch.log2(Tf))
    A = torch.where(whole, 0.0, (L + 4) * R)
    Em = torch.where(whole, 0.0, Emax)
    q = torch.sqrt(Tf / (Tf - 1))
    Dx = torch.clamp(D - (Emax + Em) * q * (1 + 2 ** -40), min=eps * (1 - 2.0 ** -50))
    invD = torch.where(Dx > 0, 1.0 / Dx, math.inf)
    aj = a.abs()
    b = u * (A + aj * (q * A + (L + 1) / 2 + 6)) + (E + Em) * invD + aj * (Emax + Em) * q * invD
    b = SAFETY * b + TAU
    return torch.where(torch.isnan(b), math.inf, b)
