"""The error model: how far a correct implementation may be from the exact result.

Every comparison in the project takes its tolerance from :func:`allowed_error`; nobody types
an ``rtol``. The model is a first-order running error bound of the prescribed algorithm,
evaluated on the oracle's exact intermediate quantities; every ``Δx`` bounds
``|computed x - exact x|`` in units of the working precision's unit roundoff u. spec/gdpo.md
section 7 states it: the bound per stage (:func:`standardize_groups_stage`,
:func:`combine_stage`, :func:`whiten_stage`), the allowance, the final cast, the zero
denominators at eps = 0 (:func:`noise_cap`, :func:`samuelson`), the condition estimate
(``rounding=False``) and a peer's own code (``Convention.algorithm``: ``mean_then_subtract``
measures ρ as max |r|, capped by :func:`noise_cap`; ``Convention.unit_roundoff``). Under a
peer's convention the allowance is also at least SAFETY times the condition estimate at the
working precision (backward error: a result that inputs SAFETY ulps away would give exactly;
``conformance.compare.native_allowed``), plus a float16 or bfloat16 output's rounding through
float32 (:func:`through_float32`).
"""

from __future__ import annotations

import math

import numpy as np

from spec.constants import FLOAT64_UNIT_ROUNDOFF

#: Covers the second-order terms that a first-order running bound drops.
SAFETY: float = 2.0

#: Underflow: an absolute 2^-1074 in units of u = 2^-53.
TAU: float = math.ldexp(1.0, -1021)


def underflow_tau(dtype: str = "float64") -> float:
    """τ of a working precision: its smallest subnormal in units of its unit roundoff
    (2^-1074 / 2^-53 = 2^-1021 for float64, 2^-149 / 2^-24 = 2^-125 for float32): a code
    computing in float32 rounds absolutely to 2^-149 among float32's subnormals."""
    p, emin, _ = _format(dtype)
    return math.ldexp(1.0, (emin - p + 1) - (-p))


#: IEEE binary formats an output may take: (precision p in bits, minimum normal
#: exponent, maximum exponent). bfloat16 is float32's exponent range with 8 bits.
FORMATS: dict[str, tuple[int, int, int]] = {
    "float64": (53, -1022, 1023),
    "float32": (24, -126, 127),
    "float16": (11, -14, 15),
    "bfloat16": (8, -126, 127),
}


def _format(dtype: str) -> tuple[int, int, int]:
    try:
        return FORMATS[str(dtype).replace("torch.", "")]
    except KeyError:
        raise ValueError(f"no error model for output dtype {dtype!r}; known: {sorted(FORMATS)}") from None


def largest_finite(dtype: str) -> float:
    """The largest finite value of ``dtype`` (65504 for float16)."""
    p, _, emax = _format(dtype)
    return math.ldexp(2.0 - math.ldexp(1.0, 1 - p), emax)


def overflow_threshold(dtype: str) -> float:
    """The smallest magnitude whose correct rounding into ``dtype`` is infinite: the
    largest finite value plus half its ulp (65520 for float16); inf for float64."""
    p, _, emax = _format(dtype)
    if p == 53:
        return math.inf
    return math.ldexp(2.0 - math.ldexp(1.0, -p), emax)


def round_to(values, dtype: str) -> np.ndarray:
    """Each float64 value correctly rounded into ``dtype`` (to nearest, ties to even,
    subnormals and signed zeros kept, overflow to +-inf), returned as float64 (exact)."""
    p, emin, _ = _format(dtype)
    x = np.asarray(values, dtype=np.float64)
    if p == 53:
        return x.copy()
    out = np.array(x, dtype=np.float64, copy=True)
    fin = np.isfinite(x) & (x != 0.0)
    mag = np.abs(x[fin])
    e = np.maximum(np.frexp(mag)[1], emin + 1)  # |x| < 2^e, subnormals share emin's spacing
    with np.errstate(over="ignore"):  # a rounding up past float64's top is an overflow anyway
        r = np.ldexp(np.rint(np.ldexp(mag, p - e)), e - p)  # rint: ties to even; both ldexp exact
    r = np.where(r >= overflow_threshold(dtype), np.inf, r)
    out[fin] = np.copysign(r, x[fin])  # a value rounding to zero keeps its sign
    return out


def half_ulp(values: np.ndarray, dtype: str) -> np.ndarray:
    """Half an ulp of ``dtype`` at each |value| (one correct rounding's error), taken where the
    value rounds to; a whole ulp at the bottom of float64's subnormals (half is no float); beyond
    the format's range, the top binade's (the caller demands a refusal there)."""
    p, emin, emax = _format(dtype)
    mag = np.abs(round_to(np.abs(np.asarray(values, dtype=np.float64)), dtype))
    mag = np.where(np.isfinite(mag), mag, largest_finite(dtype))
    e = np.where(mag > 0.0, np.maximum(np.frexp(mag)[1] - 1, emin), emin)  # binade of the rounded value
    ulp = np.ldexp(1.0, e - p + 1)
    half = 0.5 * ulp
    return np.where(half == 0.0, ulp, half)


def samuelson(T: float, ddof: int, t=1.0) -> np.ndarray:
    """The largest |x_j - mean| / std over any values with weights t (T = Σ t, std with
    ``ddof``): sqrt((T - ddof)(T - t_j) / (T t_j)); (n - 1)/sqrt(n) for n samples, ddof 1."""
    t = np.asarray(t, dtype=np.float64)
    return np.sqrt(np.maximum(T - ddof, 0.0) * np.maximum(T - t, 0.0) / (T * t))


def noise_cap(T: float, ddof: int, t, n: int, a, unit_roundoff: float = FLOAT64_UNIT_ROUNDOFF) -> np.ndarray:
    """Δa (units of u) that no whitened output can exceed: SAFETY u Δ equals
    sqrt((T - ddof) / t_j) (1 + (n + 3) u) + |a_j| (the computed |a'_j| and the exact |a_j|)."""
    t = np.asarray(t, dtype=np.float64)
    top = np.sqrt(np.maximum(T - ddof, 0.0) / t) * (1.0 + (n + 3) * unit_roundoff)
    return (top + np.abs(np.asarray(a, dtype=np.float64))) / (SAFETY * unit_roundoff)


def standardize_groups_stage(dev, d_dev, sigma, denom, z, n, ddof, rounding=True, cap_u=None, tau=TAU):
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
    if not denom > 0.0:  # eps = 0 at a collapsed column: no first-order change exists
        if rounding:  # (unreachable for the oracle: a zero std is a collapse, Δz = 0 above)
            return noise_cap(n, ddof, 1.0, n, z) * np.ones_like(z)
        return samuelson(n, ddof) * np.ones_like(z)
    dz = _quotient(dev, d_dev, sigma, denom, z, n, n, ddof, 1.0, rounding)
    if not rounding:
        return dz
    with np.errstate(over="ignore"):
        dz = dz + 3.0 * (z + tau)  # τ: z itself may underflow (D > 2 (n + 3))
    # cap_u: the unit roundoff of a mean-then-subtract code dividing by its own std (+ eps), where
    # the first order overshoots: no z = d / (s + eps) exceeds sqrt(n - ddof) when s is the std of
    # the very deviations d it divides (Cauchy-Schwarz: d_j^2 <= (n - ddof) s^2), the bound
    # noise_cap gives a unit of n samples (at least one degree of freedom)
    return dz if cap_u is None else np.minimum(dz, noise_cap(max(n, ddof + 1), ddof, 1.0, n, z, cap_u))


def _quotient(dev, d_dev, sigma, denom, z, n, T, ddof, t, rounding):
    """(Δdev + |z| ΔD) / D, z = dev / D and D the std of ``dev`` (weights t, T = Σ t) plus eps; at a
    zero std without rounding, capped by Samuelson's bound (spec/gdpo.md section 7)."""
    if sigma > 0.0 and T > ddof:
        d_sigma = float(np.sum(t * dev * d_dev) / ((T - ddof) * sigma))
    else:  # at collapse the std is not differentiable; it moves by at most the perturbation
        d_sigma = float(np.max(d_dev)) if d_dev.size else 0.0
    if rounding:
        d_sigma += 0.5 * (n + 3) * sigma + 2.0 * denom
    with np.errstate(over="ignore"):  # a denominator near zero: the caller's cap is the bound
        dz = (d_dev + z * d_sigma) / denom
        return np.minimum(dz, samuelson(T, ddof, t) + z) if not rounding and not sigma > 0.0 else dz


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


def combine_stage_framed(dz, z, weights, d_weights=None, rounding=True, tau=TAU):
    """:func:`combine_stage` for weights of any magnitude: ``(dc, frame)`` with Δc_j (units of u)
    = dc_j * 2**frame_j, frame_j the exponent of row j's largest term. Every product is formed
    from its factors' significands and exponents, so nothing overflows, and a term underflows
    only below 2^-1074 of its row's largest (one frame for the batch would flush a row whose
    weights are 2^1074 below the largest to Δc = 0)."""
    w = np.abs(np.asarray(weights, dtype=np.float64))
    az = np.abs(np.asarray(z, dtype=np.float64))
    dz = np.asarray(dz, dtype=np.float64)
    K = w.shape[0]
    mw, xw = np.frexp(w)
    terms = [(np.frexp(dz), (mw, xw), 1.0)]  # Σ_k |w_k| Δz_jk
    if d_weights is not None:
        terms.append((np.frexp(az), np.frexp(np.asarray(d_weights, dtype=np.float64)), 1.0))
    if rounding:
        terms.append((np.frexp(az), (mw, xw), float(K + 1)))  # (K + 1) Σ_k |w_k z_jk|
    neg = np.iinfo(np.int64).min // 4
    top = np.full(az.shape[0], neg, dtype=np.int64)
    for (ma, xa), (mb, xb), _ in terms:
        live = (ma != 0) & (mb[None, :] != 0)
        e = np.where(live, xa.astype(np.int64) + xb[None, :].astype(np.int64), neg)
        top = np.maximum(top, e.max(axis=1, initial=neg))
    tau_e = math.frexp(tau)[1]
    if rounding:
        top = np.maximum(top, tau_e)  # the underflow term (K + 1) τ is always there
    frame = np.where(top == neg, 0, top)
    dc = np.zeros(az.shape[0])
    with np.errstate(over="ignore", invalid="ignore"):
        for (ma, xa), (mb, xb), factor in terms:
            prod = ma * mb[None, :]  # in [1/4, 1): exact scaling below
            sh = (xa.astype(np.int64) + xb[None, :].astype(np.int64) - frame[:, None])
            sh = np.clip(sh, -2200, 64)  # below -1100 the term is 0 whatever the significand
            dc = dc + factor * np.sum(np.ldexp(prod, sh.astype(np.int32)), axis=1)
        if rounding:
            dc = dc + (K + 1) * np.ldexp(0.5, (tau_e - frame).clip(-2200, 64).astype(np.int32))
    return dc, frame.astype(np.int64)


def whiten_stage(dc, c, mean, a, sigma, denom, ddof, t=None, rounding=True, tau=TAU,
                 unit_roundoff=FLOAT64_UNIT_ROUNDOFF):
    """Δa for one unit: arrays over its samples (exact values as float64). ``tau``: the
    underflow term, scaled like ``c`` when the caller rescales (as at Eq. 4: a code that
    does not rescale rounds the mean and deviations of subnormal c absolutely)."""
    dc = np.asarray(dc, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    a = np.abs(np.asarray(a, dtype=np.float64))
    n = c.shape[0]
    t = np.ones(n) if t is None else np.asarray(t, dtype=np.float64)
    T = float(np.sum(t))
    if not denom > 0.0:  # eps = 0 and a zero std: the unit's outputs are whitened rounding noise
        return noise_cap(T, ddof, t, n, a, unit_roundoff) if rounding else samuelson(T, ddof, t)
    d_mean = float(np.sum(t * dc) / T)
    if rounding:
        d_mean += (n + 1) * (float(np.max(np.abs(c))) + tau)
    dev2 = np.abs(c - mean)
    d_dev2 = dc + d_mean
    if rounding:
        d_dev2 = d_dev2 + dev2 + tau
    da = _quotient(dev2, d_dev2, sigma, denom, a, n, T, ddof, t, rounding)
    if not rounding:
        return da
    with np.errstate(over="ignore"):
        return np.minimum(da + 3.0 * (a + underflow_tau(dtype_of(unit_roundoff))),
                          noise_cap(T, ddof, t, n, a, unit_roundoff))


def dtype_of(unit_roundoff: float) -> str:
    """The working precision whose unit roundoff this is (float64 unless float32's)."""
    return "float32" if unit_roundoff == math.ldexp(1.0, -24) else "float64"


def computed_bound(delta, unit_roundoff=FLOAT64_UNIT_ROUNDOFF, frame=0) -> np.ndarray:
    """B = SAFETY u Δ 2**frame: how far a correct float64 result is from the exact value
    (before the final cast); inf where it is beyond float64 (no bound)."""
    with np.errstate(over="ignore"):
        return np.ldexp(SAFETY * unit_roundoff * np.asarray(delta, dtype=np.float64), frame)


def reach(delta, exact, unit_roundoff=FLOAT64_UNIT_ROUNDOFF, frame=0) -> np.ndarray:
    """|exact| + B: the largest magnitude a correct float64 result can have (whether its
    final cast can overflow, and where the output format's half ulp is taken)."""
    with np.errstate(over="ignore"):
        return np.abs(np.asarray(exact, dtype=np.float64)) + computed_bound(delta, unit_roundoff, frame)


def through_float32(reach_, out_dtype: str) -> np.ndarray:
    """The second rounding of a float16 or bfloat16 output written through float32 (torch's
    float64 ``.to(float16)``): half an ulp of float32 at the reach (|exact| + B), 0 for any other
    output. A code graded at its own precision (or under a peer's convention) is allowed it on top
    of :func:`allowed_error`; the specification's own model (``gdpo check --strict``) is not."""
    reach_ = np.asarray(reach_, dtype=np.float64)
    if _format(out_dtype)[0] >= _format("float32")[0]:
        return np.zeros_like(reach_)
    return half_ulp(reach_, "float32")


def allowed_error(delta, exact, out_dtype="float64", unit_roundoff=FLOAT64_UNIT_ROUNDOFF, frame=0):
    """Absolute tolerance per output from the running bound ``delta`` (units of u * 2**frame):
    B + half_ulp_out(|exact| + B) + half_ulp_64(exact), B = SAFETY u Δ, ``exact`` the correctly
    rounded float64 reference. Where ``delta`` is 0 the exact value is demanded: 0 for an exact
    zero, else the output format's rounding of it (plus float64's, unless that is the output)."""
    delta = np.asarray(delta, dtype=np.float64)
    exact = np.asarray(exact, dtype=np.float64)
    bound = computed_bound(delta, unit_roundoff, frame)  # a bound beyond float64 is no bound: inf says so
    h64 = half_ulp(exact, "float64")
    bound = bound + half_ulp(reach(delta, exact, unit_roundoff, frame), out_dtype) + h64
    exact_demanded = half_ulp(exact, out_dtype) + (0.0 if _format(out_dtype)[0] == 53 else h64)
    return np.where(delta == 0.0, np.where(exact == 0.0, 0.0, exact_demanded), bound)
