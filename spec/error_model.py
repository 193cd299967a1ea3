"""The error model: how far a correct implementation may be from the exact result.

Every comparison in the project (tests, conformance, tables) takes its tolerance
from :func:`allowed_error`; nobody types an ``rtol``.

The model is a first-order running error bound (Higham, *Accuracy and Stability
of Numerical Algorithms*, ch. 3) of the algorithm this specification prescribes,
evaluated on the *exact* intermediate quantities the oracle computes. Every
quantity ``Δx`` below is a bound on ``|computed x - exact x|`` in units of the
working precision's unit roundoff ``u`` (2^-53 for float64 internals).

Eq. 4, per group g and reward column k, n = n_g, ρ = max - min of the column
in the group (the *range*, not the magnitude, because the prescribed algorithm
is shift-invariant: it subtracts one member of the group first, and by Sterbenz
that difference is exact or carries a relative error u of at most ρ):

    Δdev  = (n + 3) (ρ + τ)                         subtraction, mean, centring
    ΔD    = Σ_j |dev_j| Δdev / ((n - ddof) σ) + (n + 3)/2 σ + 2 D
    Δz_j  = (Δdev + |z_j| ΔD) / D + 3 |z_j|

where D is the exact denominator (σ + eps, or sqrt(σ² + eps)) and τ = 2^-1021
accounts for underflow (an absolute 2^-1074 expressed in units of u). A collapsed
column (ρ = 0) gets Δz = 0: the specification demands an exact zero there.

Eq. 7, per sample, K rewards:

    Δc_j  = Σ_k |w_k| Δz_jk + (K + 1) (Σ_k |w_k z_jk| + τ)

Eq. 6, per unit S with sample weights t (1 per sample, or token counts),
T = Σ t, n = number of samples in the unit:

    Δm    = Σ t Δc / T + (n + 1) max |c|
    Δdev2 = Δc_j + Δm + |c_j - m|
    ΔD    = Σ t |dev2| Δdev2 / ((T - ddof) s) + (n + 3)/2 s + 2 D
    Δa_j  = (Δdev2_j + |a_j| ΔD) / D + 3 (|a_j| + τ)

A collapsed unit (all combined values exactly equal) gets Δa = 0. The bound on
the working-precision result is ``SAFETY * u * Δa`` (SAFETY = 2 covers the
second-order terms the first-order analysis drops), plus half an ulp of the
output dtype for the final cast, plus half an ulp of float64 because the
reference it is compared with is the correctly rounded float64 of the exact value.

``scale="magnitude"`` replaces ρ by max |r| of the column: the bound of a plain
(not shift-invariant) two-pass algorithm, used by the tables to show what the
naive algorithm is entitled to.
"""

from __future__ import annotations

import math

import numpy as np

from spec.constants import FLOAT64_UNIT_ROUNDOFF

#: Covers the second-order terms that a first-order running bound drops.
SAFETY: float = 2.0

#: Underflow: an absolute 2^-1074 in units of u = 2^-53.
TAU: float = math.ldexp(1.0, -1021)


def half_ulp(values: np.ndarray, dtype: str) -> np.ndarray:
    """Half an ulp of ``dtype`` at each |value| (the error of one correct rounding);
    a whole ulp at the bottom of float64's subnormals, where half of one is not a float."""
    np_dtype = np.dtype(dtype)
    with np.errstate(over="ignore"):
        mag = np.abs(np.asarray(values, dtype=np.float64)).astype(np_dtype)
    ulp = np.spacing(mag).astype(np.float64)
    half = 0.5 * ulp
    return np.where(half == 0.0, ulp, half)


def group_stage(dev, d_dev, sigma, denom, z, n, ddof, rounding=True):
    """Δz for one group column: arrays over its n samples (exact values as float64).

    ``d_dev`` is the perturbation of each deviation: ``(n + 3)(ρ + τ)`` for the
    error model, or the first-order effect of a one-ulp input change for the
    condition estimate (``rounding=False`` drops the algorithm's own rounding terms).
    """
    dev = np.abs(np.asarray(dev, dtype=np.float64))
    z = np.abs(np.asarray(z, dtype=np.float64))
    d_dev = np.broadcast_to(np.asarray(d_dev, dtype=np.float64), dev.shape)
    if rounding and not np.any(d_dev > 0.0):
        return np.zeros_like(z)  # collapsed column: the exact zero is demanded
    if sigma > 0.0 and n > ddof:
        d_sigma = float(np.sum(dev * d_dev) / ((n - ddof) * sigma))
    else:  # at collapse the std is not differentiable; it moves by at most the perturbation
        d_sigma = float(np.max(d_dev)) if d_dev.size else 0.0
    d_denom = d_sigma
    if rounding:
        d_denom += 0.5 * (n + 3) * sigma + 2.0 * denom
    dz = (d_dev + z * d_denom) / denom
    return dz + 3.0 * z if rounding else dz


def model_dev_perturbation(rho, n, tau=TAU):
    """The error model's Δdev for a group column of range ``rho`` and size ``n``
    (``tau``: the underflow term, scaled like ``rho`` when the caller rescales)."""
    return 0.0 if rho == 0.0 else (n + 3) * (rho + tau)


def combine_stage(dz, z, weights, d_weights=None, rounding=True, tau=TAU):
    """Δc for an (n, K) block of Δz and z with weights (K,); ``tau`` is the underflow
    term, scaled like the weights when the caller rescales them."""
    w = np.abs(np.asarray(weights, dtype=np.float64))
    K = w.shape[0]
    az = np.abs(np.asarray(z, dtype=np.float64))
    dc = np.asarray(dz, dtype=np.float64) @ w
    if d_weights is not None:
        dc = dc + az @ np.asarray(d_weights, dtype=np.float64)
    if rounding:
        dc = dc + (K + 1) * (az @ w + tau)
    return dc


def whiten_stage(dc, c, mean, a, sigma, denom, ddof, t=None, collapsed=False, rounding=True):
    """Δa for one unit: arrays over its samples (exact values as float64)."""
    dc = np.asarray(dc, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    a = np.abs(np.asarray(a, dtype=np.float64))
    if collapsed and rounding:
        return np.zeros_like(a)
    n = c.shape[0]
    t = np.ones(n) if t is None else np.asarray(t, dtype=np.float64)
    T = float(np.sum(t))
    d_mean = float(np.sum(t * dc) / T)
    if rounding:
        d_mean += (n + 1) * float(np.max(np.abs(c)))
    dev2 = np.abs(c - mean)
    d_dev2 = dc + d_mean
    if rounding:
        d_dev2 = d_dev2 + dev2
    if sigma > 0.0 and T > ddof:
        d_sigma = float(np.sum(t * dev2 * d_dev2) / ((T - ddof) * sigma))
    else:
        d_sigma = float(np.max(d_dev2))
    d_denom = d_sigma
    if rounding:
        d_denom += 0.5 * (n + 3) * sigma + 2.0 * denom
    da = (d_dev2 + a * d_denom) / denom
    return da + 3.0 * (a + TAU) if rounding else da


def allowed_error(delta, exact, out_dtype="float64", unit_roundoff=FLOAT64_UNIT_ROUNDOFF, frame=0):
    """Absolute tolerance per output from the running bound ``delta`` (units of u * 2**frame).

    ``exact`` is the reference (float64, correctly rounded) the result is compared with.
    Where ``delta`` is 0 the specification demands the exact value, so the allowance
    is 0 as well (no rounding slack: an exact zero must come out as zero).
    """
    delta = np.asarray(delta, dtype=np.float64)
    exact = np.asarray(exact, dtype=np.float64)
    with np.errstate(over="ignore"):  # a bound beyond float64 is no bound: inf says so
        bound = np.ldexp(SAFETY * unit_roundoff * delta, frame)
    bound = bound + half_ulp(exact, out_dtype) + half_ulp(exact, "float64")
    return np.where(delta == 0.0, np.where(exact == 0.0, 0.0, half_ulp(exact, out_dtype)), bound)
