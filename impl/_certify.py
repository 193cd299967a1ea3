"""The certificate: every narrow output is the exact advantage correctly rounded.

The pipeline computes each advantage in float64 (``a``). This stage bounds, per sample, how far
``a`` can be from the exact advantage, and rounds:

* tier 0, float64, from the plain path's own statistics. Where the groups are contiguous runs of
  rows, Eq. 4/7's error is bounded a posteriori (:func:`eq47_rows_bounds`: the rewards' dtype and
  magnitudes say whether every difference and every partial sum of the group means is exact,
  :func:`exact_sums`), and Eq. 6's from the whitening's two-pass statistics
  (:func:`eq6_alpha_beta`, :class:`UnitNumbers`): |a - a*| <= alpha + beta |a| per unit. A sample
  whose interval [a - B, a + B] holds no rounding boundary of the output format rounds as the
  exact value does (:func:`bits_certify`, on a's float64 bits). Elsewhere (labelled groups in a
  padded layout, the fused whitening, size buckets) the worst-case bound below and the units'
  recomputed statistics (:func:`unit_stats`, :func:`float64_bound`) play the same part.
* tier 1a, a row's group in exact integer arithmetic. First, vectorized over every row tier 0
  left in a unit of whole groups with |a| within its bound of 0 (:mod:`impl._exact_zeros`):
  c* = 0 exactly, hence a* = +0, where the row's deviations cancel within each class of columns
  of equal exact variance (0/1 rewards: about 3% of rows). Then, row by row
  (:mod:`impl._exact_rows`), the rows left (usually none, a few at most) get their exact
  combined value c* enclosed between two
  rationals 2**-128 apart, from their own group alone, and are whitened by their unit's float64
  statistics and those statistics' bounds, in exact rational interval arithmetic; c* = 0 is
  decided exactly. A row is certified where both ends of its interval round alike.
* tier 1b, double-double (:mod:`impl._dd`). What is left (a sample close to a boundary through
  the unit's denominator, whose bound spans every row's error) is recomputed with its whole unit
  (and the groups its rows belong to) in double-double, the same bounds in the dd unit
  roundoff (2**-100), and certified the same way.
* tier 2, exact. What tier 1b leaves (the exact value on a rounding midpoint, or within the dd
  bound of one; inputs outside the dd path's safe range) is decided by :mod:`oracle.gdpo`'s
  exact arithmetic, on this process's rows.

The result is the same bits whatever the layout (ranks, shards, group order, device, thread
count): the correctly rounded exact value is a function of the inputs alone. Diagnostics count
the samples each tier decided (``impl.gdpo.Diagnostics``).

Worst-case bounds (first order, times SAFETY = 2 for the second-order terms, as in
spec/error_model.py), used where the plain path's statistics are not at hand: u the unit
roundoff of the tier, n the largest group, L = ceil(log2 n), K columns, W = sum |w|:

    Eq. 4   |z - z*| <= u [(L + 4) sqrt(2 (n - 1)) (1 + |z| sqrt(n / (n - 1))) + |z| ((L + 1)/2 + 6)]
    Eq. 7   |c - c*| <= sum_k |w_k| |z_k - z_k*| + (K + 1) u sum_k |w_k z_k|     (E, per row)

since the range of a group column is at most sqrt(2 (n - 1)) times its std (Samuelson), and
|z| < sqrt(n). A row whose group has every column constant has z = 0 exactly (E = 0). Eq. 6, a
unit of T rows, its denominator D (std + eps, evaluated from c), R = (max a - min a):

    |a_j - a_j*| <= u [A + |a_j| rel + 2 |a_j|] + (E_j + E_m) / D + |a_j| (E_max + E_m) sqrt(T / (T - 1)) / D

with A = (L_T + 4) R and E_m = max E (the rounded mean, and the mean of the rows' errors)
except in a unit of whole groups, whose exact mean is 0 and whose algorithm uses 0 (A = 0,
E_m = 0); rel = sqrt(T / (T - 1)) A + (L_T + 1)/2 + 4. A unit whose rows all have E = 0 and
whose values are all equal is exactly collapsed (a = +0 exactly, bound 0). Where the a
posteriori Eq. 4/7 bound holds (contiguous groups), a unit of whole groups takes the rows'
root-mean-square bound in the denominator's term in place of E_max (:func:`eq47_rows_bounds`:
the denominator's error is the l2 norm of the rows' errors over sqrt(T - 1)).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import struct

import numpy as np
import torch

from impl import _dd
from impl._cast import round_to
from impl._problems import GROUPS as P_GROUPS, N_MAX as P_N_MAX
from impl import _segments as seg_ops
from impl._stats import denominator

_F64 = torch.float64
_I64 = torch.int64
U64 = 2.0 ** -53
SAFETY = 2.0
#: absolute underflow allowance (a few float64 subnormal steps)
_TAU = 2.0 ** -1070

#: What is certified: "narrow" (the default: every float32, bfloat16 and float16 output; a
#: float64 output is the plain path's one rounding, within the error model), "all" (float64
#: outputs too, faithful: the double-double tier on every call, about 25 times the plain
#: path at N = 65,536) or "off" (the plain path). ``GDPO_CERTIFIED`` in the environment before
#: impl is imported: 1/all, 0/off, narrow; or :func:`enabled_here` / :func:`disabled` around calls.
_MODES = {"1": "all", "all": "all", "true": "all", "yes": "all", "on": "all", "0": "off", "off": "off",
          "false": "off", "no": "off", "narrow": "narrow", "": "narrow"}
_MODE = [_MODES.get(os.environ.get("GDPO_CERTIFIED", "").strip().lower(), "narrow")]


def _scoped(mode: str):
    @contextlib.contextmanager
    def scope():
        old = _MODE[0]
        _MODE[0] = mode
        try:
            yield
        finally:
            _MODE[0] = old
    return scope


#: The plain path (one rounding of the float64 result, no certificate): benchmarks and the
#: negative control of the conformance property ``certified``.
disabled = _scoped("off")
#: Certified rounding of every output format, float64 included, for the calls inside.
enabled_here = _scoped("all")
#: The default: float32, bfloat16 and float16 outputs certified, float64 not.
narrow_here = _scoped("narrow")


def enabled(out_dtype=None) -> bool:
    """Is ``out_dtype``'s rounding certified (None: is any output format's)?"""
    mode = _MODE[0]
    if mode == "off":
        return False
    if out_dtype is None or mode == "all":
        return True
    return out_dtype in _NARROW


def declared():
    """What impl declares (``gdpo_certified``): True (every format, float64 faithful), the
    narrow formats' names, or False."""
    mode = _MODE[0]
    return True if mode == "all" else False if mode == "off" else ("float32", "bfloat16", "float16")


@dataclasses.dataclass
class Counts:
    """How many samples each tier decided."""

    float64: int = 0
    #: rows whose own group was recomputed in exact integer arithmetic (tier 1a)
    group_exact: int = 0
    double_double: int = 0
    exact: int = 0
    uncertified: int = 0


# --- rounding intervals ---------------------------------------------------------------------------

def _neighbours(y: torch.Tensor):
    """(pred, succ) of ``y`` in its own format, as float64 (beyond the largest finite value the
    format's next power of two, max + ulp(max), whose midpoint with max is where rounding
    overflows to infinity; at +-0 the smallest subnormals of either sign)."""
    inf = torch.full_like(y, math.inf)
    pred, succ = torch.nextafter(y, -inf).to(_F64), torch.nextafter(y, inf).to(_F64)
    top = 2.0 ** math.frexp(torch.finfo(y.dtype).max)[1]  # max + ulp(max)
    finite = torch.isfinite(y)
    succ = torch.where(torch.isinf(succ) & finite, top, succ)
    pred = torch.where(torch.isinf(pred) & finite, -top, pred)
    return pred, succ


def round_out(h: torch.Tensor, out_dtype) -> torch.Tensor:
    return round_to(h, out_dtype)


def certify(h: torch.Tensor, l: torch.Tensor, B: torch.Tensor, out_dtype):
    """Certify the dd value h + l with error bound B (float64 tensors): (ok, y) with y the
    output (the correct rounding of h + l; where ok, of every value within B of it)."""
    if out_dtype == _F64:
        y = h + l
        r = (h - y) + l  # h - y is exact (y is h or a neighbour of it)
        lo_n = torch.nextafter(y, torch.full_like(y, -math.inf))
        hi_n = torch.nextafter(y, torch.full_like(y, math.inf))
        gap = torch.minimum(y - lo_n, hi_n - y)
        margin = r.abs() + B * (1 + 2 ** -40) + 4 * U64 * (r.abs()) + _TAU
        ok = margin < gap
        exact_zero = (h == 0) & (l == 0) & (B == 0)
        y = torch.where(exact_zero, 0.0, y)
        return ok | exact_zero, y, margin < gap / 2
    exact_zero = (h == 0) & (l == 0) & (B == 0)

    def check(y):
        pred, succ = _neighbours(y)
        y64 = y.to(_F64)
        m_hi = (y64 + succ) * 0.5
        m_lo = (y64 + pred) * 0.5
        # h - m is exact where they are within a factor 2 (Sterbenz), else off by u |h - m|;
        # each further operation rounds by u of its result: 4 u (|h - m| + |l|) covers them
        t_hi, t_lo = h - m_hi, h - m_lo
        Bb = B * (1 + 2 ** -40) + _TAU
        ok = ((t_hi + l + (Bb + 4 * U64 * (t_hi.abs() + l.abs()))) < 0) & \
             ((t_lo + l - (Bb + 4 * U64 * (t_lo.abs() + l.abs()))) > 0)
        # an output zero carries the exact value's sign: certain only away from 0, or at an exact 0
        Bz = Bb + 4 * U64 * (h.abs() + l.abs())
        sign_known = ((h + l - Bz) > 0) | ((h + l + Bz) < 0)
        return ok & ((y64 != 0) | sign_known | exact_zero)

    y = round_out(h, out_dtype)
    ok = check(y)
    if not bool(ok.all()) and bool((l != 0).any()):
        # h itself on (or a float64 step from) a midpoint: h + l may round to the other side
        toward = torch.where(l > 0, math.inf, -math.inf)
        y2 = round_out(torch.where(l != 0, torch.nextafter(h, toward), h), out_dtype)
        ok2 = check(y2) & ~ok
        y = torch.where(ok2, y2, y)
        ok = ok | ok2
    y = torch.where(exact_zero, torch.zeros_like(y), y)
    return ok, y, ok


# --- bounds ------------------------------------------------------------------------------------------


def eq47_bound(u: float, n: int, k: int, weights: list[float]) -> float:
    """Worst-case |c - c*| of a row (Eq. 4 then Eq. 7) in absolute terms, groups of <= n rows."""
    if n < 2:
        return 0.0
    L = math.ceil(math.log2(n))
    zmax = math.sqrt(n)
    dz = u * ((L + 4) * math.sqrt(2 * (n - 1)) * (1 + zmax * math.sqrt(n / (n - 1))) + zmax * ((L + 1) / 2 + 6))
    wsum = sum(abs(w) for w in weights)
    return wsum * dz + (k + 1) * u * wsum * zmax


def eq47_bound_rows(u: float, z_abs: torch.Tensor, n: torch.Tensor, weights: list[float]) -> torch.Tensor:
    """Per row: the Eq. 4/7 bound with each row's own |z| (K columns) and group size n."""
    n = n.to(_F64).clamp(min=2.0)
    L = torch.ceil(torch.log2(n))
    s2 = torch.sqrt(2 * (n - 1))
    w = torch.tensor([abs(x) for x in weights], dtype=_F64, device=z_abs.device)
    dz = u * ((L + 4)[:, None] * s2[:, None] * (1 + z_abs * torch.sqrt(n / (n - 1))[:, None])
              + z_abs * ((L + 1) / 2 + 6)[:, None])
    k = z_abs.shape[1]
    return (dz * w).sum(1) + (k + 1) * u * (z_abs * w).sum(1)


def eq6_bound(u: float, a: torch.Tensor, D: torch.Tensor, spread, T: torch.Tensor,
              whole: torch.Tensor, E: torch.Tensor, R: torch.Tensor, Emax: torch.Tensor, eps: float) -> torch.Tensor:
    """Per row j: the bound on |a_j - a_j*| in its unit (per unit: D, a lower bound of the
    computed values' std + eps; T rows; whole groups; R = range of a; Emax the largest E;
    ``spread`` maps per-unit values to rows); E per row. The exact values' denominator is at
    least D - Emax sqrt(T / (T - 1)) (and at least eps): the bound uses that."""
    Tf = T.to(_F64).clamp(min=2.0)
    L = torch.ceil(torch.log2(Tf))
    A = torch.where(whole, 0.0, (L + 4) * R)
    Em = torch.where(whole, 0.0, Emax)
    q = torch.sqrt(Tf / (Tf - 1))
    # the exact values' denominator, at least (and at least eps: their std is >= 0)
    Dx = torch.clamp(D - (Emax + Em) * q * (1 + 2 ** -40), min=eps * (1 - 2.0 ** -50))
    with np.errstate(all="ignore"):
        invD = torch.where(Dx > 0, 1.0 / Dx, math.inf)
    rel_u = q * A + (L + 1) / 2 + 4  # in units of u
    rel_e = (Emax + Em) * q * invD  # relative error of D from c's errors
    aj = a.abs()
    b = u * (spread(A) + aj * (spread(rel_u) + 2)) + (E + spread(Em)) * spread(invD) + aj * spread(rel_e)
    b = SAFETY * b + _TAU
    return torch.where(torch.isnan(b), math.inf, b)


class _Units:
    """Per-unit reductions of (N,) rows: (S, m) views where every unit has the same size (one
    unit, or S units of m rows), scatters otherwise. ``view(x)`` shapes rows for the per-unit
    broadcast ``bc(v)``; ``rows(y)`` flattens the result back."""

    def __init__(self, sizes: list[int], device):
        self.S = len(sizes)
        self.sizes = sizes
        self.device = device
        n = sum(sizes)
        self.equal = self.S > 0 and n > 0 and all(s == sizes[0] for s in sizes)
        self.unit = None if self.equal else _unit_index(sizes, device)
        self._T = None

    @property
    def T(self) -> torch.Tensor:
        if self._T is None:
            self._T = torch.tensor(self.sizes, dtype=_F64, device=self.device)
        return self._T

    def index(self) -> torch.Tensor:
        if self.unit is None:
            self.unit = _unit_index(self.sizes, self.device)
        return self.unit

    def view(self, x):
        return x.view(self.S, -1) if self.equal else x

    def bc(self, v):
        return v.view(self.S, 1) if self.equal else v.index_select(0, self.unit)

    def rows(self, y):
        return y.reshape(-1)

    def sum(self, x):
        """Per-unit sums; (S,), and the relative error bound of each (in units of u, times sum |x|)."""
        if self.equal:
            return seg_ops.tree_sum(x.view(self.S, -1)).view(self.S)
        return torch.zeros(self.S, dtype=x.dtype, device=x.device).index_add_(0, self.unit, x)

    def sum_error(self):
        """The sums' rounding, relative to the sum of magnitudes, in units of u: the pairwise tree's
        depth (views) or the row count (scatters, any order)."""
        if self.equal:
            return torch.full_like(self.T, float(math.ceil(math.log2(max(self.sizes[0], 2)))) + 1)
        return self.T + 1

    def amax(self, x):
        if self.equal:
            return x.view(self.S, -1).amax(1)
        return torch.full((self.S,), -math.inf, dtype=x.dtype, device=x.device).scatter_reduce_(0, self.unit, x, "amax")

    def amin(self, x):
        if self.equal:
            return x.view(self.S, -1).amin(1)
        return torch.full((self.S,), math.inf, dtype=x.dtype, device=x.device).scatter_reduce_(0, self.unit, x, "amin")

    def spread(self, v):
        """(S,) per unit -> (N,) per row."""
        if self.equal:
            return v.repeat_interleave(self.sizes[0])
        return v.index_select(0, self.unit)


@dataclasses.dataclass
class UnitStats:
    """Per unit, (S,) each: what the float64 tier knows of Eq. 6."""

    T: torch.Tensor
    whole: torch.Tensor
    flat: torch.Tensor  # every c equal
    mean: torch.Tensor  # the mean used (0 for whole units)
    dmean: torch.Tensor  # bound on |mean - mean(c*)|
    D: torch.Tensor  # std(c) + eps as computed (float64)
    dD: torch.Tensor  # relative bound on |D - (std(c*) + eps)| / Dx
    Dx: torch.Tensor  # lower bound of std(c*) + eps
    R: torch.Tensor  # range of a
    Emax: torch.Tensor
    L: torch.Tensor  # ceil(log2 T)


def unit_stats(c: torch.Tensor, a: torch.Tensor, E: torch.Tensor, units: _Units, whole: torch.Tensor,
               eps: float, erms: float | None = None) -> UnitStats:
    """The units' statistics of the float64 c, with rigorous bounds of how far they are from those
    of the exact c* (|c - c*| <= E per row; their root mean square at most ``erms`` over a unit
    of whole groups, where given)."""
    T = units.T
    Tc = T.clamp(min=2.0)
    L = torch.ceil(torch.log2(Tc))
    q = torch.sqrt(Tc / (Tc - 1))
    cmax, cmin = units.amax(c), units.amin(c)
    cabs = torch.maximum(cmax.abs(), cmin.abs())
    Emax = units.amax(E)
    se = units.sum_error()
    if bool(whole.all()):
        mean = torch.zeros_like(T)
        d = c
        excess = torch.zeros_like(T)
        dmean = torch.zeros_like(T)
    else:
        mean = torch.where(whole, 0.0, units.sum(c) / T.clamp(min=1))
        d = c - units.spread(mean)
        dm = (se + 1) * U64 * cabs  # the rounded mean's error: sum rounding, the division
        excess = torch.where(whole, 0.0, T * dm * dm)
        dmean = torch.where(whole, 0.0, dm + Emax)
    m2 = units.sum(d * d)
    # sum (c - m')^2 = sum (c - m)^2 + T (m' - m)^2 >= the true sum: take off that excess and the rounding
    m2_low = (m2 * (1 - (se + 2) * U64) - excess).clamp(min=0)
    sd = torch.sqrt(m2 / (T - 1).clamp(min=1))
    sd_low = torch.sqrt(m2_low / (T - 1).clamp(min=1)) * (1 - 2 * U64)
    D = sd + eps
    D_low = (sd_low + eps) * (1 - 2 * U64)
    # the exact values' std is within Emax q (2 Emax q off a rounded mean; the rows' root mean
    # square bound erms, where given, in a unit of whole groups) of the computed values'
    Ec = torch.where(whole, Emax if erms is None else torch.clamp(Emax, max=erms), 2 * Emax) * q
    Dx = torch.clamp(D_low - Ec * (1 + 2 ** -40), min=eps * (1 - 2.0 ** -50))
    with np.errstate(all="ignore"):
        dD = torch.where(Dx > 0, (2 * (D - D_low) + Ec) / Dx + 4 * U64, math.inf)
    R = ((units.amax(a) - units.amin(a)) * (1 + 2.0 ** -30)).clamp(min=0)
    return UnitStats(T, whole, cmax == cmin, mean, dmean, D, dD, Dx, R, Emax, L)


def float64_bound(st: UnitStats, units: _Units, a: torch.Tensor, E: torch.Tensor) -> torch.Tensor:
    """Per row: the bound on |a - a*| of the float64 result (per-unit alpha + beta |a|, E as
    Emax): the algorithm's rounding (A = (L + 4) R off whole units, the denominator's
    (L + 1)/2 + 6), the rows' own c error and the mean's, over the exact denominator's lower
    bound, and the relative error of the denominator."""
    with np.errstate(all="ignore"):
        invD = torch.where(st.Dx > 0, 1.0 / st.Dx, math.inf)
    A = torch.where(st.whole, 0.0, (st.L + 4) * st.R)
    alpha = SAFETY * (U64 * A + (st.Emax + st.dmean) * invD) + _TAU
    beta = SAFETY * (U64 * (A + (st.L + 1) / 2 + 8) + st.dD)
    alpha = torch.where(torch.isnan(alpha), math.inf, alpha)
    beta = torch.where(torch.isnan(beta), math.inf, beta)
    B = units.bc(alpha) + units.bc(beta) * units.view(a).abs()
    return units.rows(B)


def certify_float(a: torch.Tensor, B: torch.Tensor, out_dtype):
    """Tier 0's test for narrow formats: (ok, y). Rounding is monotone, so if the float64 ends
    of [a - B, a + B], rounded outward, round to one value, every value in between does."""
    Bp = B * (1 + 2 ** -40) + 2 * U64 * a.abs() + _TAU
    lo = round_out(a - Bp, out_dtype)
    hi = round_out(a + Bp, out_dtype)
    it = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[out_dtype]
    ok = (lo.view(it) == hi.view(it)) & torch.isfinite(B)  # bit for bit: +0 and -0 differ (the sign of a tiny value)
    return ok, lo


# --- tier 0 from the plain path's own statistics (a posteriori bounds) ------------------------------
#
# Every bound below is a sum of first-order rounding terms (each rounding's |delta| <= u of its
# result, a pairwise tree of depth L: L u of the sum of magnitudes), evaluated on the statistics the
# plain path computed, times (1 + 2**-30): the second-order terms (products of two roundings, gamma_m
# = m u / (1 - m u) instead of m u) are below 2**-40 of the first-order ones wherever a bound is used
# (each is used only where its relative size is below 1/4; elsewhere it is infinite).

_SLACK = 1.0 + 2.0 ** -30

#: input formats whose values are multiples of a quantum set by their smallest magnitude:
#: (mantissa bits, the exponent of the smallest normal)
_QUANTUM = {torch.float32: (23, -126), torch.float16: (10, -14), torch.bfloat16: (7, -126)}


#: integer views of the narrow reward formats: (the int dtype of their width, the NumPy unsigned
#: dtype, the mask of every bit but the sign)
_BITS = {torch.float32: (torch.int32, np.uint32, 0x7FFFFFFF), torch.float16: (torch.int16, np.uint16, 0x7FFF),
         torch.bfloat16: (torch.int16, np.uint16, 0x7FFF)}


def magnitudes(r: torch.Tensor, largest: float | None = None) -> tuple[float, float]:
    """The rewards' smallest nonzero magnitude (inf where every reward is 0) and their largest,
    over the whole batch (host floats), for rewards in a narrow format (:data:`_QUANTUM`).
    ``largest``: the largest magnitude where the caller has it (Eq. 4 read it), else None.

    On the bits: a finite float's magnitude orders as its bits without the sign, so the largest
    magnitude is the largest of those and the smallest nonzero one the smallest of those minus 1
    where 0 wraps to the top. On CPU in NumPy, where the sign is shifted out of an unsigned view
    (2 |bits|, then minus 2); on other devices in torch's signed integers (|bits| - 1 masked: 0
    goes to the mask). On CPU the read of :func:`batch_quantum` (the rewards once, in
    cache-sized blocks; ``largest`` given: the smallest alone); elsewhere four passes, no
    boolean pass, one host read."""
    if r.numel() == 0:
        return math.inf, 0.0
    if r.device.type == "cpu":  # (the same read as the batch's quantum)
        return batch_quantum(r, largest)[:2]
    lo, hi = _magnitude_bits_torch(r)
    return (math.inf if lo is None else _FROM_BITS[r.dtype](lo)), _FROM_BITS[r.dtype](hi)


def batch_quantum(r: torch.Tensor, largest: float | None = None) -> tuple[float, float, int]:
    """(smallest nonzero magnitude, largest, e): :func:`magnitudes` of the rewards ``r`` (a
    narrow format) and 2**e dividing every one of them. A nonzero value is an integer multiple
    of 2**(its exponent - mantissa bits + the trailing zeros of its mantissa field) (all of
    them when the field is 0: a power of two), so 2**e with e = :func:`_quantum` of the
    smallest magnitude plus the trailing zeros of the OR of every mantissa field (at most the
    field's width) divides them all: 0/1 rewards in float32 are multiples of 1, not just of
    2**-23. On CPU, where the OR rides along the magnitudes' pass; elsewhere without it."""
    if r.device.type != "cpu" or r.numel() == 0:
        small, large = magnitudes(r)
        return small, large, _quantum_of(r.dtype, small)
    value = _FROM_BITS[r.dtype]
    lo, hi, ored = _magnitude_bits_np(r, smallest_only=largest is not None)
    large = float(largest) if largest is not None else value(hi)
    if lo is None:  # every reward 0
        return math.inf, large, 0
    small = value(lo)
    mant, _ = _QUANTUM[r.dtype]
    field = ored & ((1 << mant) - 1)
    trail = mant if field == 0 else min((field & -field).bit_length() - 1, mant)
    return small, large, _quantum(r.dtype, small) + trail


#: :func:`_magnitude_bits_np` works through the rewards in blocks of this many values: each
#: block's transform stays in cache for its two reductions (in a call, where the rewards come
#: from memory: about 550 us instead of 850-950 at N = 65,536, K = 4, measured)
_MAG_BLOCK = 1 << 16


def _magnitude_bits_np(r: torch.Tensor, smallest_only: bool = False) -> tuple[int | None, int | None, int]:
    """:func:`magnitudes` as bits (None: every reward 0), in NumPy (CPU), block by block: v = 2 |bits|
    (the sign shifted out), its largest (unless ``smallest_only``: None), then v - 2 (a zero
    wraps to the top) and its smallest; third, the OR of every reward's bits (for
    :func:`batch_quantum`). One read of the rewards; each block three or four passes in cache."""
    idt, udt, _ = _BITS[r.dtype]
    top = (1 << 8 * np.dtype(udt).itemsize) - 2
    u = r.detach().reshape(-1).view(idt).numpy().view(udt)
    buf = np.empty(_MAG_BLOCK, dtype=udt)
    lo, hi, ored = top, 0, 0
    for s in range(0, u.size, _MAG_BLOCK):
        block = u[s:s + _MAG_BLOCK]
        v = np.left_shift(block, 1, out=buf[:block.size])
        if not smallest_only:
            hi = max(hi, int(v.max()))
        np.subtract(v, 2, out=v)
        lo = min(lo, int(v.min()))
        ored |= int(np.bitwise_or.reduce(block))
    return (None if lo == top else (lo >> 1) + 1), (None if smallest_only else hi >> 1), ored


def _magnitude_bits_torch(r: torch.Tensor) -> tuple[int | None, int]:
    """:func:`magnitudes` as bits (None: every reward 0), in torch (any device)."""
    idt, _, mask = _BITS[r.dtype]
    b = torch.bitwise_and(r.detach().view(idt), mask)
    hi_t = b.amax()
    lo_t = b.sub_(1).bitwise_and_(mask).amin()  # 0 - 1 = -1 masks to the top
    lo, hi = torch.stack([lo_t, hi_t]).tolist()
    return (None if lo == mask else lo + 1), hi


#: a narrow format's value of its bits (a non-negative int), as a host float
_FROM_BITS = {
    torch.float32: lambda b: struct.unpack("<f", struct.pack("<I", b))[0],
    torch.bfloat16: lambda b: struct.unpack("<f", struct.pack("<I", b << 16))[0],
    torch.float16: lambda b: float(np.uint16(b).view(np.float16)),
}


def exact_sums(dtype, mags: tuple[float, float], n: int, qexp: int | None = None) -> bool:
    """Are every difference d = (x - x_first) f of a group column and every partial sum of its
    mean's tree exact in float64, in every group of ``n`` rows? Rewards in a narrow format are
    multiples of q, the quantum of their smallest nonzero magnitude (``mags``, over the batch:
    :func:`magnitudes`); d and the partial sums are multiples of q f of magnitude at most
    n (hi - lo) f <= 2 n max|x| f, exact while that is at most 2**53 q f. ``qexp``: a larger
    q = 2**qexp known to divide every reward (:func:`batch_quantum`). Float64 rewards have no
    such quantum: False."""
    if dtype not in _QUANTUM:
        return False
    small, large = mags
    if not math.isfinite(small):  # every reward 0: nothing to sum
        return True
    e = _quantum(dtype, small) if qexp is None else qexp
    return 2 * n * large * (1 + 2.0 ** -50) <= math.ldexp(1.0, e + 53)


def _quantum(dtype, small: float) -> int:
    """e with q = 2**e the quantum of ``small`` (finite, nonzero) in the narrow format
    ``dtype``: 2**(floor(log2 small) - mantissa bits), at least the format's subnormal quantum.
    Every value of the format at least ``small`` in magnitude is a multiple of q."""
    mant, emin = _QUANTUM[dtype]
    return max(math.frexp(small)[1] - 1, emin) - mant


def quantum_exponent(r: torch.Tensor) -> int | None:
    """q = 2**e dividing every reward of ``r`` (a narrow format: :func:`_quantum` of its
    smallest nonzero magnitude, :func:`magnitudes`), or None."""
    if r.dtype not in _QUANTUM:
        return None
    return _quantum_of(r.dtype, magnitudes(r)[0])


def _quantum_of(dtype, small: float) -> int:
    """:func:`_quantum` of the smallest nonzero magnitude ``small`` (inf: every reward 0, which
    any power of two divides: 0)."""
    return _quantum(dtype, small) if math.isfinite(small) else 0


def eq4_error(r: torch.Tensor, n: int, weights: list[float],
              largest: float | None = None) -> tuple[float, int | None, float | None, float]:
    """(bound, e, top, rms): a bound on |c - c*| of every row, groups of ``n`` contiguous rows of
    the rewards ``r``, and on the root mean square of |c - c*| over the rows of any whole
    groups (:func:`eq47_rows_bounds`, the sums exact or not: :func:`exact_sums`); 2**e
    dividing every reward and top the largest |reward| (:func:`batch_quantum`; None: not
    known). The rewards are read once, only for a narrow reward format, which alone has a
    quantum. ``largest``: the rewards' largest magnitude, where Eq. 4 read it (else read here)."""
    if n < 2:
        return 0.0, None, None, 0.0
    if r.dtype not in _QUANTUM:
        bound, rms = eq47_rows_bounds(n, weights, [False] * len(weights))
        return bound, None, None, rms
    small, large, qexp = batch_quantum(r, largest)
    ex = exact_sums(r.dtype, (small, large), n, qexp)
    bound, rms = eq47_rows_bounds(n, weights, [ex] * len(weights))
    return bound, qexp, large, rms


def eq47_rows_bounds(n: int, weights: list[float], exact: list[bool]) -> tuple[float, float]:
    """(bound, rms): the bound on |c - c*| of a row of a group of ``n`` rows (Eq. 4 then Eq. 7
    as the plain path computes them), ``exact[k]``: column k's differences and sums are exact;
    and the bound on the root mean square of |c - c*| over the rows of whole groups of ``n``.

    Scaled domain (the group column's power of two f, exact): d = x f - s (s the first
    member's), |d| <= rho, the range, and rho <= sqrt(2 (n - 1)) sigma (Samuelson), the exact
    deviations |d - mean| <= (n - 1)/sqrt(n) sigma. Relative to D >= sigma: the mean's error
    dmu = u rho (exact sums: the division only) or (L + 2) u rho (the differences, the tree, the
    division); a deviation's ddev = dmu + u (rho + dmu) (+ eta = u rho for inexact
    differences); the denominator's dD = ((L + 1)/2 + 2.5) u (the squares and their tree, the
    division, the root, eps) plus the std's error from the deviations' errors: the std is
    1-Lipschitz in their l2 norm over sqrt(n - 1), but the mean's error is one shift of the
    whole column, which a sum of squared deviations from the mean feels to second order only
    (n dmu**2 + 2 dmu |sum xi|, over the norm), so only the rows' own roundings xi count to
    first order: sqrt(n/(n-1)) (1 + u) eta + u + sqrt(n/(n-1)) u dmu (half of sqrt(n/(n-1))
    ddev, or less, for exact sums); zb = ((n - 1)/sqrt(n) + ddev) / (1 - dD) bounds |z| and |z*|;
    |z - z*| <= u zb + ddev + zb dD; Eq. 7 adds K u sum_k |w_k| zb.

    Row by row the same terms read |z - z*| <= (ddev (1 + u) + |z*| (u + dD)) / (1 - dD) (z =
    (z* + delta)(1 + e) / (1 + theta), |delta| <= ddev, |theta| <= dD, |e| <= u) and Eq. 7's
    K u |z_k| <= K u (1 + u) (|z*_k| + ddev) / (1 - dD): |c - c*| <= sum_k |w_k| (a_k + b_k
    |z*_k|), a constant and a multiple of the row's own |z*|. Over a group column
    sum_j z*_j**2 = (n - 1) (s / (s + eps))**2 <= n - 1 exactly, so over the rows of whole
    groups the l2 norm of |z*_k| is at most sqrt((n - 1)/n) per row, and (Minkowski) the
    rows' root mean square error is at most sum_k |w_k| (a_k + b_k sqrt((n - 1)/n)): about
    half the bound for n = 8, where |z*| <= (n - 1)/sqrt(n). Eq. 6's denominator takes the rms
    (its error is the l2 norm of the rows' errors over sqrt(T - 1)); a row's own error, the
    bound. (Memoized: a pure function of its arguments, asked once a call.)"""
    return _eq47_rows_bounds(int(n), tuple(float(w) for w in weights), tuple(bool(x) for x in exact))


@functools.lru_cache(maxsize=256)
def _eq47_rows_bounds(n: int, weights: tuple, exact: tuple) -> tuple[float, float]:
    if n < 2:
        return 0.0, 0.0
    u = U64
    K = len(weights)
    zmax = (n - 1) / math.sqrt(n) * (1 + 4 * u)
    zrms = math.sqrt((n - 1) / n) * (1 + 4 * u)
    total = rms = 0.0
    for w, ex in zip(weights, exact):
        ddev, dD = eq4_column_bounds(n, ex)
        if not dD < 0.25:
            return math.inf, math.inf
        zb = (zmax + ddev) / (1 - dD)
        zeta = u * zb + ddev + zb * dD
        total += abs(w) * (zeta + K * u * zb)
        a = ddev * (1 + u) * (1 + K * u) / (1 - dD)
        b = (u + dD + K * u * (1 + u)) / (1 - dD)
        rms += abs(w) * (a + b * zrms)
    bound = total * _SLACK + (K + 1) * _TAU  # an underflowing product or sum: 2**-1075 each
    return bound, min(rms * _SLACK + (K + 1) * _TAU, bound)


def eq4_column_bounds(n: int, exact: bool) -> tuple[float, float]:
    """(ddev, dD) of a group column of ``n`` rows (:func:`eq47_rows_bounds`), relative to its
    exact denominator D* = std* + eps (as f scales it): |dev_j - dev*_j| <= ddev D* for every
    row, |den - D*| <= dD D* (inf where no bound holds)."""
    u = U64
    L = math.ceil(math.log2(n))
    rho = math.sqrt(2 * (n - 1)) * (1 + 8 * u)
    zmax = (n - 1) / math.sqrt(n) * (1 + 4 * u)
    q = math.sqrt(n / (n - 1))
    dmu = u * rho if exact else (L + 2) * u * rho
    eta = 0.0 if exact else u * rho  # a difference's own rounding
    ddev = dmu + u * (rho + dmu) + eta
    # the std's error: the deviations are dev* - dmean + xi_j (dmean the mean's error, one per
    # group column), and sum (dev* + xi - dmean)**2 = |dev* + xi|**2 + t with t = n dmean**2 -
    # 2 dmean sum xi (sum dev* = 0): the mean's error enters to second order only;
    # | |dev* + xi| - |dev*| | <= |xi|_2 <= sqrt(n) (1 + u) eta + u |dev*|_2 + u sqrt(n) dmu,
    # and |sqrt(V**2 + t) - V| <= |t| / V, V >= |dev*| - |xi| (all in units of sigma <= D*)
    xi = (1 + u) * eta + u * (zmax + dmu)
    low = math.sqrt(n - 1) - math.sqrt(n) * xi
    if not low > 0:
        return ddev, math.inf
    dstd = q * (1 + u) * eta + u + q * u * dmu + n * (dmu * dmu + 2 * dmu * xi) / (math.sqrt(n - 1) * low)
    return ddev, u * ((L + 1) / 2 + 2.5) + dstd


def eq6_alpha_beta(tp, sizes: list[int], width: int, whole: torch.Tensor, Emax: torch.Tensor, eps: float,
                   Erms: torch.Tensor | None = None):
    """(alpha, beta, exact0), (S, 1) each: |a - a*| <= alpha + beta |a| for every row of a unit,
    from the plain path's statistics ``tp`` of Eq. 6 ((S, width) view or padded layout) and
    the largest bound ``Emax`` (S,) of its rows' |c - c*|; exact0: the unit is exactly
    collapsed (every c equal and exact: a = +0 exactly).

    Scaled domain as in :func:`eq4_error`. A whole unit's mean is the structural 0 and
    d = c f exactly, so a deviation's error is the row's own, E f; elsewhere the mean adds its
    rounding ((L + 1) rho + |mean|) u and the mean of the rows' errors. The denominator:
    dD = ((L + 1)/2 + 2.5) u D + sqrt(T/(T-1)) ddev; with rD = dD / D,
    |a - a*| <= u |a| + ddev / D + |a*| rD, |a*| <= (|a| (1 + u) + ddev / D) / (1 - rD)."""
    u = U64
    device = tp.f.device
    T = torch.tensor([float(s) for s in sizes], dtype=_F64, device=device)[:, None]
    L = float(math.ceil(math.log2(max(width, 2))))
    f = tp.f
    Ef = Emax.view(-1, 1) * f * (1 + 2 * u)
    lo, hi = tp.lo.to(_F64), tp.hi.to(_F64)
    rho = (hi - lo) * f * (1 + 4 * u)
    wh = whole.view(-1, 1)
    dm = ((L + 1) * rho + tp.mean.abs()) * u
    ddev = torch.where(wh, Ef, dm + u * (2 * rho + dm) + 2 * Ef)
    # the denominator's error is the rows' errors in l2 (over sqrt(T - 1)): their root mean
    # square bound ``Erms`` where a unit is of whole groups
    droot = ddev if Erms is None else torch.where(wh, Erms.view(-1, 1) * f * (1 + 2 * u), ddev)
    den = denominator(tp.m2 / (T - 1).clamp(min=1), tp.eps_f, eps)
    q = torch.sqrt(T.clamp(min=2) / (T.clamp(min=2) - 1))
    with np.errstate(all="ignore"):
        dD = (den * (u * ((L + 1) / 2 + 2.5)) + q * droot) * _SLACK
        rD = dD / den
        alpha = ddev / den / (1 - rD) * _SLACK + _TAU
        beta = (u + rD * (1 + u) / (1 - rD)) * _SLACK
    # every computed c equal, the exact ones perhaps not: no bound from den
    good = (rD < 0.25) & ~((lo == hi) & (Emax.view(-1, 1) > 0))
    alpha = torch.where(good, alpha, math.inf)
    beta = torch.where(good, beta, math.inf)
    exact0 = (lo == hi) & (Emax.view(-1, 1) == 0)
    return alpha, beta, exact0


#: up to this many units, tier 0's per-unit bounds are evaluated on the host (one read)
_HOST_UNITS = 16


def _whole_list(whole, S: int) -> list[bool]:
    if whole is None:
        return [False] * S
    if isinstance(whole, torch.Tensor):
        return [bool(w) for w in whole.view(-1).tolist()]
    return [bool(w) for w in whole]


@dataclasses.dataclass
class UnitNumbers:
    """One unit's Eq. 6 as the plain path computed it (scaled domain: the unit's power of two
    f), with the bounds of :func:`eq6_alpha_beta`: a = ((c f - M) / den) rounded, the exact
    value a* = (c* f - M*) / D* with |M* - M| <= dmean (M = 0 = M* for a whole unit) and
    |D* - den| <= dD (and D* >= eps f)."""

    alpha: float
    beta: float
    exact0: bool  # every c equal and exact: a = +0 exactly
    f: float
    centre: tuple  # (shift, mean): M = shift + mean exactly (0 for a whole unit)
    dmean: float
    den: float
    dD: float
    eps_f: float
    whole: bool
    flat: bool  # every c equal

    @property
    def M(self):
        """The unit's computed centre as a Fraction (exact)."""
        from fractions import Fraction  # not at import: impl's import stays light
        return Fraction(self.centre[0]) + Fraction(self.centre[1])


def _unit_numbers(tp, sizes: list[int], width: int, wl: list[bool], emax: float, eps: float,
                  which: list[int], erms: float | None = None) -> list[UnitNumbers]:
    """:func:`eq6_alpha_beta` on the host for the units ``which``, every row's E at most
    ``emax`` (their root mean square over a unit of whole groups at most ``erms``): the same
    formulas in Python floats (IEEE 754 double, correctly rounded sqrt), so the denominator is
    the plain path's bit for bit."""
    S = len(sizes)
    cols = (tp.lo, tp.hi, tp.f, tp.mean, tp.m2, tp.eps_f, tp.shift)
    if tp.f.device.type == "cpu":  # a list each: no tensor to make (a tenth of the time, measured)
        parts = list(zip(*(t.reshape(-1).tolist() for t in cols)))
        parts = [parts[j] for j in which] if len(which) < S else parts
    else:  # one host read
        parts = torch.cat([t.to(_F64).view(S, 1) for t in cols], 1)
        if len(which) < S:
            parts = parts.index_select(0, torch.tensor(which, dtype=_I64, device=parts.device))
        parts = parts.tolist()
    u = U64
    L = float(math.ceil(math.log2(max(width, 2))))
    out = []
    for (lo, hi, f, mean, m2, eps_f, shift), j in zip(parts, which):
        T, wh = sizes[j], wl[j]
        Ef = emax * f * (1 + 2 * u)
        rho = (hi - lo) * f * (1 + 4 * u)
        if wh:
            ddev = Ef
            dmean = 0.0
            droot = Ef if erms is None else erms * f * (1 + 2 * u)  # the rows' errors in l2, per row
        else:
            dm = ((L + 1) * rho + abs(mean)) * u
            ddev = dm + u * (2 * rho + dm) + 2 * Ef
            dmean = (dm + Ef) * (1 + 4 * u)
            droot = ddev
        den = math.sqrt(m2 / max(T - 1, 1)) + eps_f
        if not eps >= 2.0 ** -52 and den == 0:
            den = 1.0
        Tq = max(T, 2)
        dD = (den * (u * ((L + 1) / 2 + 2.5)) + math.sqrt(Tq / (Tq - 1)) * droot) * _SLACK
        rD = dD / den if den > 0 else math.inf
        if lo == hi and emax > 0:
            rD = math.inf  # every computed c equal, the exact ones perhaps not: no bound from den
        if rD < 0.25:
            alpha = ddev / den / (1 - rD) * _SLACK + _TAU
            beta = (u + rD * (1 + u) / (1 - rD)) * _SLACK
        else:
            alpha = beta = math.inf
        centre = (0.0, 0.0) if wh else (shift, mean)
        out.append(UnitNumbers(alpha, beta, lo == hi and emax == 0, f, centre, dmean, den, dD, eps_f, wh, lo == hi))
    return out


def _eq6_host(tp, sizes: list[int], width: int, whole, emax: float, eps: float, device, erms: float | None = None):
    """(alpha, beta, exact0, nums) of every unit from :func:`_unit_numbers` (host scalars for
    one unit, (S, 1) tensors otherwise; nums: the units' :class:`UnitNumbers`, which the
    group-exact tier reads again)."""
    S = len(sizes)
    nums = _unit_numbers(tp, sizes, width, _whole_list(whole, S), emax, eps, list(range(S)), erms)
    if S == 1:  # host scalars: no tensors to make
        return nums[0].alpha, nums[0].beta, nums[0].exact0, nums
    t = torch.tensor([[x.alpha for x in nums], [x.beta for x in nums]], dtype=_F64).to(device)
    ex = torch.tensor([x.exact0 for x in nums], dtype=torch.bool).to(device).view(S, 1)
    return t[0].view(S, 1), t[1].view(S, 1), ex, nums


#: output formats: half the spacing of their subnormals (the rounding interval of 0)
_FORMAT = {torch.float32: (24, 2.0 ** -150), torch.float16: (11, 2.0 ** -25), torch.bfloat16: (8, 2.0 ** -134)}


#: output formats: (mantissa bits, the exponent of the smallest normal)
_NARROW = {torch.float32: (23, -126), torch.float16: (10, -14), torch.bfloat16: (7, -126)}
_NEVER = 1 << 62




def bits_certify(a: torch.Tensor, alpha, beta, out_dtype, y: torch.Tensor | None = None) -> torch.Tensor | None:
    """Tier 0's test: ok where every value within B = alpha + beta |a| of a rounds as a does
    (``alpha``, ``beta`` host floats, or tensors broadcast against a); None where every row is.
    ``y``: a rounded to ``out_dtype`` (:func:`round_out`), where the caller has it.

    In a's binade [2**e, 2**(e+1)) the output format (m mantissa bits) has cells 2**(e - m)
    wide: h = 2**(e - m - 1) is half a cell, and p2 = 2**e is read from a's exponent bits
    (exact; 0 for a float64 zero or subnormal: never certified). r = a - y is exact
    (Sterbenz: y is a rounded, of a's sign and within a factor 2 of it, or 0). The midpoint on
    r's side of y is h - |r| from a; on the other side h + |r|, except below y = 2**k with a at
    or above it, where the cell is half as wide: h/2 + |r|. Below the output's normal range
    the cells are wider than h says, and an output 0 (|r| = |a| > h) never passes. So a is
    certified where h - |r| > B and h/2 > B; with |a| < 2 p2 it suffices that

        p2 (2**-(m+1) - 2 beta) - |r| > alpha   and   p2 (2**-(m+2) - 2 beta) > alpha,

    tested as p2 - s |r| > alpha s and p2 > P, s and P rounded up (2**-40 margins, which
    the test's own three roundings cannot use up). Host alpha and beta: :func:`bits_left`'s
    verdicts (five passes over a in the common case, every row certified). Per-unit bounds
    of a (S, T) view: six passes, r, |r|, p2, its minimum, the difference, its minimum (the
    common case: no boolean pass)."""
    per_row = isinstance(alpha, torch.Tensor) or isinstance(beta, torch.Tensor)
    if not per_row:
        left = bits_left(a.reshape(-1), alpha, beta, out_dtype, None if y is None else y.reshape(-1))
        if left is None:
            return None
        return torch.ones(a.shape, dtype=torch.bool, device=a.device).view(-1).index_fill_(0, left, False).view(a.shape)
    mant, _ = _NARROW[out_dtype]
    h = 2.0 ** -(mant + 1)
    grow = 1 + 2.0 ** -40
    alpha = torch.as_tensor(alpha, dtype=_F64, device=a.device)
    beta = torch.as_tensor(beta, dtype=_F64, device=a.device)
    k1, k2 = (h - 2 * beta) / grow, (h / 2 - 2 * beta) / grow  # lower bounds of the two factors of p2
    s = torch.where(k1 > 0, grow / k1, math.inf)
    A = alpha * s * grow
    P = torch.where(k2 > 0, alpha / k2 * grow, math.inf)
    r, p2 = _margin_parts(a, out_dtype, y)
    if a.dim() == 2 and P.shape == (a.shape[0], 1):  # a unit a row: the same without a boolean pass
        big = bool((p2.amin(1, keepdim=True) > P).all())
        v = torch.sub(p2, torch.mul(r, s, out=r), out=r)  # (two roundings, on any CPU; into r's buffer)
        if big and bool((v.amin(1, keepdim=True) > A).all()):
            return None
    else:
        big, v = False, torch.sub(p2, torch.mul(r, s, out=r), out=r)
    return (v > A) if big else (v > A) & (p2 > P)


def _margin_parts(a: torch.Tensor, out_dtype, y: torch.Tensor | None):
    """(|a - y|, p2) of :func:`bits_certify`, in kept buffers: r exact (Sterbenz), p2 = 2**e
    from a's exponent bits (0 for a float64 zero or subnormal)."""
    y = round_out(a, out_dtype) if y is None else y
    r = torch.sub(a, y).abs_()  # |a - y|, exact
    p2 = torch.bitwise_and(a.view(_I64), 0x7FF0000000000000).view(_F64)
    return r, p2


def _tier0_params(alpha: float, beta: float, out_dtype) -> tuple[float, float, float, float] | None:
    """(s, A, P, top) of :func:`bits_left`'s test for host ``alpha`` and ``beta``, or None where
    no row can pass it (beta too large, alpha infinite)."""
    mant, _ = _NARROW[out_dtype]
    h = 2.0 ** -(mant + 1)
    grow = 1 + 2.0 ** -40
    k1, k2 = (h - 2 * beta) / grow, (h / 2 - 2 * beta) / grow  # lower bounds of the two factors of p2
    if not (k1 > 0 and k2 > 0 and alpha < math.inf):
        return None
    s = grow / k1
    A, P = alpha * s * grow, alpha / k2 * grow
    return s, A, P, max(A, P)


def bits_left(a: torch.Tensor, alpha: float, beta: float, out_dtype, y: torch.Tensor | None = None):
    """:func:`bits_certify` for host ``alpha`` and ``beta`` on a 1-D ``a``, as the indices
    (int64, ascending) of the rows it does not certify; None where it certifies every row.
    Its verdicts, in fewer passes: a row passes where v = p2 - s |r| > A and p2 > P, and
    as v <= p2, v > max(A, P) implies both. So one minimum of v decides the common case
    (every row certified: five passes over a, not six), and where it does not, one comparison
    finds the rows that may fail (near a rounding boundary, or small in magnitude), on which
    alone the two conditions are tested; no boolean mask of every row is inverted."""
    got = _tier0_params(alpha, beta, out_dtype)
    if got is None:
        return torch.arange(a.shape[0], device=a.device)
    s, A, P, top = got
    if a.shape[0] == 0:
        return None
    r, p2 = _margin_parts(a, out_dtype, y)
    # v = p2 - s r in two roundings, as the C loop (torch's sub with alpha may fuse them into one
    # on some CPUs, and its verdicts at the boundary would then depend on the CPU)
    v = torch.sub(p2, torch.mul(r, s, out=r), out=r)
    if bool(v.amin() > top):  # (a NaN would fail it, and every test below)
        return None
    if a.device.type == "cpu":  # NumPy: a tenth of torch's time on the few rows
        vn, pn = v.numpy(), p2.numpy()
        cand = np.flatnonzero(~(vn > top))
        keep = (vn[cand] > A) & (pn[cand] > P)
        return torch.from_numpy(cand[~keep])
    cand = indices(~(v > top))
    keep = (v.index_select(0, cand) > A) & (p2.index_select(0, cand) > P)
    return cand[~keep]


# --- the tiers --------------------------------------------------------------------------------------


def indices(mask: torch.Tensor) -> torch.Tensor:
    """The indices (int64, ascending) where the 1-D bool ``mask`` is true. On CPU through
    NumPy: torch's nonzero makes two passes and costs about 14 times as much on 65,536 rows
    (measured), where the rows sought are few."""
    if mask.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(mask.numpy()))
    return mask.nonzero().view(-1)


def _unit_index(sizes: list[int], device) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(sizes), device=device),
                                   torch.tensor(sizes, dtype=_I64, device=device))


def _whole_tensor(whole, S: int, device) -> torch.Tensor:
    if whole is None:
        return torch.zeros(S, dtype=torch.bool, device=device)
    if isinstance(whole, torch.Tensor):
        return whole.to(device=device, dtype=torch.bool).reshape(S)
    return torch.tensor([bool(w) for w in whole], dtype=torch.bool, device=device).reshape(S)


@dataclasses.dataclass
class Problem:
    """What the tiers need to know of a call (local rows only)."""

    a: torch.Tensor  # (N,) float64 result of the plain path
    c: object  # (N,) float64 values Eq. 6 whitened, or a callable making them (see :meth:`values`)
    sizes: list[int]  # unit sizes
    eps: float
    whole: object  # per unit: made of whole groups (exact mean 0)
    E: object  # (N,) bound on |c - c*|, or a callable making it (see :meth:`rows_E`)
    dd: object = None  # () -> (h, l, B) over every row, or None (no dd tier)
    exact: object = None  # (name) -> np.ndarray float64 of the correctly rounded outputs, or None
    #: (rows (M,) int64) -> (ch, cl, E) of those rows' combined values in dd (their groups
    #: recomputed), or None: the targeted tier (1a)
    dd_rows: object = None
    #: the plain path's Eq. 6 statistics (``impl._whiten.Local``), or None: tier 0 then
    #: recomputes the units' statistics
    loc: object = None
    #: a bound on every row's E (host float), or None
    emax: float | None = None
    #: (rows: list of int) -> [(lo, hi, zero)] enclosing each row's exact c* (Fractions; zero:
    #: c* = 0 exactly), from its group alone (:mod:`impl._exact_rows`), or None
    exact_rows: object = None
    #: (rows (R,) int64) -> (R,) bool: c* = 0 exactly (:mod:`impl._exact_zeros`; False: not
    #: decided there), or None
    zero_rows: object = None
    #: tier 0's bound |a - a*| <= alpha + beta |a| per unit ((alpha, beta): host floats for one
    #: unit, (S, 1) tensors otherwise), once tier 0 ran
    ab: object = None
    #: every unit's :class:`UnitNumbers` for ``emax``, where tier 0 made them on the host
    nums: list | None = None
    #: with ``emax``: a bound on the root mean square of the rows' E over a unit of whole groups
    #: (:func:`eq47_rows_bounds`; Eq. 6's denominator takes it), or None (emax serves)
    erms: float | None = None
    #: without ``emax``: every row's E is this or 0 (0: its group's columns all constant), or None
    e_rows: float | None = None
    #: each unit's largest E (S,), where tier 0 found it
    unit_emax: torch.Tensor | None = None

    def values(self) -> torch.Tensor:
        """c (computed again where the plain path used its buffer as work space)."""
        if callable(self.c):
            self.c = self.c()
        return self.c

    def rows_E(self) -> torch.Tensor:
        if callable(self.E):
            self.E = self.E()
        return self.E


def finish(p: Problem, out_dtype, counts: Counts | None = None, y: torch.Tensor | None = None) -> torch.Tensor:
    """The certified output of ``p`` in ``out_dtype``. ``y``: p.a rounded to ``out_dtype``
    (a tensor of this call's own), where the caller has it."""
    counts = counts if counts is not None else Counts()
    a = p.a
    n = a.shape[0]
    if n == 0 or not enabled():
        return round_out(a, out_dtype) if y is None else y
    device = a.device
    S = len(p.sizes)
    units = _Units(p.sizes, device)
    st = None
    got0 = _tier0_loc(p, units, out_dtype, y) if out_dtype != _F64 else None
    zeros = 0
    if got0 is not None and got0[2] is None:  # every row certified
        counts.float64 += n - zeros
        return got0[1]
    left = None  # the rows still to decide, as indices (few, as a rule: no full-length passes below)
    if got0 is not None:  # (todo, the rows left as a mask, and whole, per unit, made where a tier needs them)
        todo, y, left = got0
        whole = _whole_tensor(p.whole, S, device) if S > 1 else None
    else:
        whole = _whole_tensor(p.whole, S, device)
        st = unit_stats(p.values(), a, p.rows_E(), units, whole, p.eps, p.erms)
        B = float64_bound(st, units, a, p.rows_E())
        zeroE = p.rows_E() == 0
        if bool(zeroE.any()):  # exact zeros: a unit of equal exact values, or c* = 0 in a whole unit
            flat_u = st.flat & (st.Emax == 0)
            exact0 = units.rows(units.bc(flat_u) | (units.view(zeroE & (p.values() == 0)) & units.bc(whole)))
            B = torch.where(exact0, 0.0, B)
        if out_dtype == _F64:
            ok, y, _ = certify(a, torch.zeros_like(a), B, out_dtype)
        else:
            ok, y = certify_float(a, B, out_dtype)
        todo = ~ok
        left = indices(todo)
    counts.float64 += n - left.numel() - zeros
    if left.numel() == 0:
        return y
    if y.data_ptr() == a.data_ptr():  # the tiers below write into y: never into the caller's a
        y = y.clone()
    if p.zero_rows is not None:  # tier 1a, vectorized: c* = 0 exactly in a unit of whole groups
        y, got, left = _exact_zeros(p, y, units, whole, left)
        k = int(got.numel())
        counts.group_exact += k
        if k:
            if left.numel() == 0:
                return y
            if todo is not None:
                todo.index_fill_(0, got, False)
    if todo is None:
        todo = torch.zeros(a.shape, dtype=torch.bool, device=device).index_fill_(0, left, True)
    if whole is None:
        whole = _whole_tensor(p.whole, S, device)
    if got0 is not None and p.exact_rows is not None and left.numel() <= _EXACT_ROWS_MAX:
        y, todo, k = _group_exact(p, todo, y, out_dtype, units, rows=left)
        counts.group_exact += k
        if k:
            left = left[todo.index_select(0, left)]
            if left.numel() == 0:
                return y
    if st is None:
        st = unit_stats(p.values(), a, p.rows_E(), units, whole, p.eps, p.erms)
    if p.dd_rows is not None and not _dd_needed_everywhere(todo, n):  # tier 1a: the rows' own c in dd
        rows = indices(todo)
        got1 = _targeted(p, rows, units, st)
        if got1 is not None:
            h, l, Bd = got1
            ok1, y1, _ = certify(h, l, Bd, out_dtype)
            y.index_copy_(0, rows, torch.where(ok1, y1, y.index_select(0, rows)))
            counts.double_double += int(ok1.sum())
            todo.index_fill_(0, rows[ok1], False)
            if not bool(todo.any()):
                return y
    got = None
    if p.dd is not None:
        got = p.dd()
        if got is not None:
            h, l, Bd = got
            ok1, y1, _ = certify(h, l, Bd, out_dtype)
            take = todo & ok1
            y = torch.where(take, y1, y)
            counts.double_double += int(take.sum())
            todo = todo & ~ok1
            if not bool(todo.any()):
                return y
    left = int(todo.sum())
    if p.exact is not None:
        ex = p.exact(str(out_dtype).replace("torch.", ""))
        if ex is not None:
            exact_vals = torch.from_numpy(np.ascontiguousarray(ex, dtype=np.float64)).to(device)
            y = torch.where(todo, round_out(exact_vals, out_dtype), y)
            counts.exact += left
            return y
    counts.uncertified += left
    if p.dd is not None and got is not None:
        y = torch.where(todo, round_out(h + l, out_dtype) if out_dtype != _F64 else h + l, y)
    return y


def _tier0_loc(p: Problem, units: _Units, out_dtype, y: torch.Tensor | None = None):
    """Tier 0 from the plain path's own Eq. 6 statistics (``p.loc``): (None, y, left), left the
    rows not certified as ascending indices (None: every row is certified; their mask is made by
    the caller, only where a later tier needs it), or None where those statistics are not at
    hand (buckets, the fused whitening, a device without the raw extremes)."""
    loc = p.loc
    if loc is None or loc.tp is None or loc.tp.lo is None or loc.lay.kind not in ("view", "padded"):
        return None
    a = p.a
    lay = loc.lay
    S = len(p.sizes)
    emax, Emax = p.emax, None
    if emax is None and p.e_rows is not None and S <= _HOST_UNITS:  # labelled groups: the worst case
        Emax = p.unit_emax = _units_emax(p, units, loc.tp)
        if bool((Emax == p.e_rows).all()):  # in every unit: the host's numbers, as for a bound of every row
            emax = p.e_rows
    if emax is not None and S <= _HOST_UNITS:
        alpha, beta, exact0, p.nums = _eq6_host(loc.tp, p.sizes, lay.width, p.whole, emax, p.eps, a.device,
                                                p.erms)
    else:
        if Emax is None:
            Emax = torch.full((S,), p.emax, dtype=_F64, device=a.device) if p.emax is not None else \
                _units_emax(p, units, loc.tp)
            p.unit_emax = Emax
        Erms = torch.full((S,), p.erms, dtype=_F64, device=a.device) if p.erms is not None else None
        alpha, beta, exact0 = eq6_alpha_beta(loc.tp, p.sizes, lay.width, _whole_tensor(p.whole, S, a.device), Emax,
                                             p.eps, Erms)
    p.ab = (alpha, beta)
    # can a unit's rows be exact zeros here (a unit of equal exact values; c* = 0 in a whole unit
    # where no exact-zero tier follows)? Else only zeros of a certain sign are decided below
    exact_here = p.zero_rows is None or (p.nums is None or any(x.exact0 for x in p.nums))
    y = round_out(a, out_dtype) if y is None else y
    if S == 1 and not isinstance(alpha, torch.Tensor):  # host scalars: the rows left at once
        left = bits_left(a, alpha, beta, out_dtype, y)
    else:
        if lay.kind == "view":
            ok = bits_certify(a.view(S, -1), alpha, beta, out_dtype, y.view(S, -1))
        else:
            idx = units.index()
            ok = bits_certify(a, alpha.view(-1).index_select(0, idx), beta.view(-1).index_select(0, idx),
                              out_dtype, y)
        left = None if ok is None else indices(~ok.view(-1))  # the rows not certified (few, as a rule)
    if left is None:
        return None, y, None
    if left.numel():
        # rows whose output is 0: exact zeros (a unit of equal exact values; c* = 0 in a whole
        # unit where no exact-zero tier follows), and zeros whose sign is certain (|a| > B: the
        # whole interval rounds to a zero of a's sign); worked out on those rows alone
        if a.device.type == "cpu" and y.dtype != torch.bfloat16:  # NumPy: torch's index_select ~5x on so few
            ln = left.numpy()
            zn = y.numpy()[ln] == 0
            if not exact_here:  # (0/1 rewards: a = 0 is left to the next tier)
                zn &= a.numpy()[ln] != 0
            at = torch.from_numpy(np.flatnonzero(zn))
        else:
            zero = y.index_select(0, left) == 0
            if not exact_here:
                zero &= a.index_select(0, left) != 0
            at = indices(zero)  # their places among the rows left
        if at.numel():
            rows = left.index_select(0, at)
            ar = a.index_select(0, rows)
            u = torch.zeros_like(rows) if S == 1 else units.index().index_select(0, rows)
            if isinstance(alpha, torch.Tensor):
                ab = alpha.view(-1).index_select(0, u) + beta.view(-1).index_select(0, u) * ar.abs()
            else:
                ab = alpha + beta * ar.abs()
            _, th = _FORMAT[out_dtype]
            fix = (ar.abs() > ab * (1 + 2.0 ** -40)) & (ar.abs() + ab * (1 + 2.0 ** -40) < th)
            if exact_here:
                exact = exact0.view(-1).index_select(0, u) if isinstance(exact0, torch.Tensor) else \
                    torch.full_like(fix, bool(exact0))
                if p.zero_rows is None:  # (else the exact-zero tier decides them, constant groups included)
                    whole = _whole_tensor(p.whole, S, a.device)
                    exact = exact | (whole.index_select(0, u) & (p.rows_E().index_select(0, rows) == 0))  # c = +0
                fix = fix | (exact & (ar == 0))
                y.index_fill_(0, _keep(rows, fix & (ar == 0)), 0.0)  # y: this call's own tensor
            gone = torch.zeros(left.shape, dtype=torch.bool, device=a.device).index_fill_(0, _keep(at, fix), True)
            left = _keep(left, ~gone)
    return None, y, left  # (the mask of the rows left is made by the caller, where a tier needs it)


def _units_emax(p: Problem, units: _Units, tp) -> torch.Tensor:
    """Each unit's largest E (S,), from Eq. 6's statistics ``tp`` where it can be: a row of a
    group whose columns are all constant has c = +0 and E = 0, every other row E = p.e_rows; so
    where a unit's c vary (its raw minimum below its maximum) some row is of the second kind,
    and the unit's largest E is p.e_rows without reading E (its making, the rows of constant
    groups, cost about 4 ms at N = 65,536 of ragged labelled groups). Only units whose c are all
    equal (rare) read E."""
    if p.e_rows is None:
        return units.amax(p.rows_E())
    varies = (tp.lo != tp.hi).reshape(-1)
    full = torch.full(varies.shape, p.e_rows, dtype=_F64, device=varies.device)
    if bool(varies.all()):
        return full
    return torch.where(varies, full, units.amax(p.rows_E()))


def _exact_zeros(p: Problem, y: torch.Tensor, units: _Units, whole: torch.Tensor | None, left: torch.Tensor):
    """The rows left (``left``, ascending indices) in units of whole groups (``whole``, per unit;
    None where there is one unit: read from ``p.whole``) whose c* is exactly 0
    (:mod:`impl._exact_zeros`) get a* = +0 exactly (the unit's exact mean is 0). Returns (y,
    the rows decided, the rows still left), both ascending. On CPU the few thousand rows go
    through NumPy as places among ``left`` (torch's indexing costs several times as much on
    arrays this small), and what is left is ``left`` without the places decided."""
    cpu = left.device.type == "cpu"
    none = left[:0]
    if len(p.sizes) == 1:
        if not _whole_list(p.whole, 1)[0]:
            return y, none, left
        at = None  # every place of left
    else:
        at = indices(whole.index_select(0, units.index().index_select(0, left)))
    if left.numel() and p.ab is not None:
        # a* = 0 needs |a| <= alpha + beta |a|, i.e. |a| <= alpha / (1 - beta): the others are not zeros
        alpha, beta = p.ab
        rows = left if at is None else left.index_select(0, at)
        if isinstance(alpha, torch.Tensor):
            u = torch.zeros_like(rows) if len(p.sizes) == 1 else units.index().index_select(0, rows)
            alpha, beta = alpha.view(-1).index_select(0, u), beta.view(-1).index_select(0, u)
            reach = torch.where(beta < 1, alpha / (1 - beta), math.inf)
            near = p.a.index_select(0, rows).abs() <= reach * (1 + 2.0 ** -30)
        else:
            reach = _zero_reach(alpha, beta)
            near = (torch.from_numpy(np.abs(p.a.numpy()[rows.numpy()]) <= reach) if cpu else
                    p.a.index_select(0, rows).abs() <= reach)
        at = _keep(torch.arange(left.numel()) if at is None else at, near) if cpu else \
            indices(near) if at is None else at[near]
    if at is not None and at.numel() == 0 or left.numel() == 0:
        return y, none, left
    rows = left if at is None else left.index_select(0, at)
    ok = p.zero_rows(rows)
    if cpu:
        okn = ok.numpy()
        if not okn.any():
            return y, none, left
        got = rows.numpy()[okn]
        keep = np.ones(left.numel(), dtype=bool)
        keep[okn.nonzero()[0] if at is None else at.numpy()[okn]] = False
        got, rest = torch.from_numpy(got), torch.from_numpy(left.numpy()[keep])
    else:
        got = rows[ok]
        if got.numel() == 0:
            return y, none, left
        keep = torch.ones(left.shape, dtype=torch.bool, device=left.device)
        keep.index_fill_(0, indices(ok) if at is None else at[ok], False)
        rest = left[keep]
    return y.index_fill_(0, got, 0.0), got, rest


def _zero_reach(alpha: float, beta: float) -> float:
    """How far from 0 a float64 a may lie and its a* still be 0, for host bounds |a - a*| <= alpha +
    beta |a|: |a| <= alpha / (1 - beta), raised by a 2**-30 margin (its own roundings)."""
    return (alpha / (1 - beta) if beta < 1 else math.inf) * (1 + 2.0 ** -30)


def _keep(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x[mask] for 1-D ``x`` and ``mask`` (a few thousand rows at most, as a rule); on CPU through
    NumPy, where torch's boolean indexing costs several times as much on arrays this small."""
    if x.device.type == "cpu":
        return torch.from_numpy(x.numpy()[mask.numpy()])
    return x[mask]


#: at most this many rows per call go to the group-exact tier (beyond, the double-double tiers)
_EXACT_ROWS_MAX = 256

_FMT_NAME = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _group_exact(p: Problem, todo: torch.Tensor, y: torch.Tensor, out_dtype, units: _Units,
                 rows: torch.Tensor | None = None):
    """Tier 1a: the rows left get their exact c* from their own groups (:mod:`impl._exact_rows`),
    whitened by their unit's float64 statistics with those statistics' bounds
    (:class:`UnitNumbers`), in interval arithmetic (floats rounded outward, then exact rationals
    where those leave a boundary inside: :func:`_interval_float`, :func:`_interval_exact`); a row is certified where both
    ends of its interval round to the same output (sign included), or where c* = 0 exactly in a
    unit of whole groups (a* = +0). ``rows``: todo's, as indices. Returns (y, todo, how many
    were certified)."""
    rows = indices(todo) if rows is None else rows
    rl = rows.tolist()
    S = len(p.sizes)
    ul = [0] * len(rl) if S == 1 else units.index().index_select(0, rows).tolist()
    need = sorted(set(ul))
    if p.nums is not None:  # tier 0's, for the same emax
        nums = {u: p.nums[u] for u in need}
    else:
        emax = p.emax if p.emax is not None else \
            float((p.rows_E() if p.unit_emax is None else p.unit_emax).max())
        loc = p.loc
        nums = dict(zip(need, _unit_numbers(loc.tp, p.sizes, loc.lay.width, _whole_list(p.whole, S), emax,
                                             p.eps, need, p.erms if p.emax is not None else None)))
    got_rows, got_vals = [], []
    for r, u, (lo, hi, zero) in zip(rl, ul, p.exact_rows(rl)):
        un = nums[u]
        if not math.isfinite(un.alpha) or un.flat:
            continue
        if zero and un.whole:
            got_rows.append(r)
            got_vals.append(0.0)
            continue
        got = _interval_float(lo, hi, un, out_dtype)
        if got is None:
            got = _interval_exact(lo, hi, un, out_dtype)
        if got is not None:
            got_rows.append(r)
            got_vals.append(got)
    if not got_rows:
        return y, todo, 0
    at = torch.tensor(got_rows, dtype=_I64, device=y.device)
    y.index_copy_(0, at, torch.tensor(got_vals, dtype=_F64).to(y.device, y.dtype))
    return y, todo.index_fill_(0, at, False), len(got_rows)


def _interval_exact(lo, hi, un: UnitNumbers, out_dtype) -> float | None:
    """a* = (c* f - M*) / D* for c* in [lo, hi] (Fractions), |M* - M| <= dmean, |D* - den| <= dD
    (D* >= eps f), in exact rational interval arithmetic: its correct rounding to ``out_dtype``
    where both ends of the interval round to one output, sign included, else None."""
    from fractions import Fraction

    from oracle.exact import round_fraction
    f = Fraction(un.f)
    dm = Fraction(un.dmean)
    M = un.M
    nlo, nhi = lo * f - (M + dm), hi * f - (M - dm)
    dlo = max(Fraction(un.den) - Fraction(un.dD), Fraction(un.eps_f))
    dhi = Fraction(un.den) + Fraction(un.dD)
    if dlo <= 0:
        return None
    alo = nlo / dhi if nlo >= 0 else nlo / dlo
    ahi = nhi / dlo if nhi >= 0 else nhi / dhi
    fmt = _FMT_NAME[out_dtype]
    ylo, yhi = round_fraction(alo, fmt), round_fraction(ahi, fmt)
    if ylo == yhi and math.copysign(1.0, ylo) == math.copysign(1.0, yhi):
        return ylo
    return None


def _down(x: float) -> float:
    return math.nextafter(x, -math.inf)


def _up(x: float) -> float:
    return math.nextafter(x, math.inf)


_PACK = {torch.float32: "f", torch.float16: "e"}


def _interval_float(lo, hi, un: UnitNumbers, out_dtype) -> float | None:
    """:func:`_group_exact`'s interval of a* in float64 with every operation rounded outward (a
    step of one float to each side after each round-to-nearest result): its rounding where
    both ends round to one output, sign included (the same value as the exact interval would
    give: a* lies inside, the correct rounding is unique), else None (the caller goes on in
    rationals). Many times cheaper than the rationals."""
    clo, chi = _down(float(lo)), _up(float(hi))  # float(Fraction): correctly rounded
    if un.whole:
        mlo = mhi = 0.0
    else:
        m = un.centre[0] + un.centre[1]
        mlo, mhi = _down(_down(m) - un.dmean), _up(_up(m) + un.dmean)
    nlo, nhi = _down(_down(clo * un.f) - mhi), _up(_up(chi * un.f) - mlo)
    dlo, dhi = max(_down(un.den - un.dD), un.eps_f), _up(un.den + un.dD)
    if not (dlo > 0 and math.isfinite(dhi) and math.isfinite(nlo) and math.isfinite(nhi)):
        return None
    alo = _down(nlo / dhi) if nlo >= 0 else _down(nlo / dlo)
    ahi = _up(nhi / dlo) if nhi >= 0 else _up(nhi / dhi)
    code = _PACK.get(out_dtype)
    try:
        if code is None:  # bfloat16: no host format of its own
            from fractions import Fraction

            from oracle.exact import round_fraction
            ylo, yhi = (round_fraction(Fraction(x), _FMT_NAME[out_dtype]) for x in (alo, ahi))
        else:  # the host's IEEE conversion: round to nearest, ties to even
            ylo, yhi = (struct.unpack(code, struct.pack(code, x))[0] for x in (alo, ahi))
    except OverflowError:  # beyond the format's overflow midpoint: the rationals decide
        return None
    if ylo == yhi and math.copysign(1.0, ylo) == math.copysign(1.0, yhi):
        return ylo
    return None


def _dd_needed_everywhere(todo: torch.Tensor, n: int) -> bool:
    """Skip the targeted tier when most rows are left (float64 outputs): the whole call in dd is
    then cheaper than row by row."""
    return int(todo.sum()) * 4 > n


def _targeted(p: Problem, rows: torch.Tensor, units: _Units, st: UnitStats):
    """Tier 1a: the rows' own c in dd (their groups recomputed), whitened by the units' float64
    statistics, whose distance to the exact values' the bound carries. (h, l, B) for ``rows``,
    or None."""
    got = p.dd_rows(rows)
    if got is None:
        return None
    ch, cl, Er = got
    ur = units.index().index_select(0, rows)
    mean, D = st.mean.index_select(0, ur), st.D.index_select(0, ur)
    ok_den = D > 0
    num = _dd.add_f((ch, cl), -mean)
    Dsafe = torch.where(ok_den, D, 1.0)
    a = _dd.div(num, (Dsafe, torch.zeros_like(Dsafe)))
    with np.errstate(all="ignore"):
        invD = torch.where(st.Dx > 0, 1.0 / st.Dx, math.inf).index_select(0, ur)
    aj = a[0].abs()
    B = SAFETY * (_dd.UNIT * (aj * 8 + 4) + 2 * U64 * mean.abs() * invD
                  + (Er + st.dmean.index_select(0, ur)) * invD + aj * st.dD.index_select(0, ur)) + _TAU
    B = torch.where(torch.isnan(B) | ~ok_den, math.inf, B)
    return a[0], a[1], B


# --- the dd tier on a whole call -------------------------------------------------------------------


def dd_gdpo(r: torch.Tensor, gid: torch.Tensor, G: int, weights: list[float], eps: float,
            sizes: list[int], whole, group_size: int | None = None) -> tuple | None:
    """Eq. 4, 7 and 6 of every row in double-double: (h, l, B) per row, or None where the
    inputs leave the dd path's safe range. ``group_size``: the groups are contiguous, of that
    size (the equal layout: views, no masks)."""
    got = _dd_combined(r, gid, G, weights, eps, group_size)
    return None if got is None else dd_whiten(*got, eps, sizes, whole)


def dd_whiten(ch: torch.Tensor, cl: torch.Tensor, E: torch.Tensor, eps: float, sizes: list[int], whole):
    """Eq. 6 in double-double of dd values (ch, cl) whose errors are bounded by E per row."""
    if not (_dd.safe(ch) and _dd.eps_safe(eps)):
        return None
    device = ch.device
    S = len(sizes)
    unit = _unit_index(sizes, device)
    wt = _whole_tensor(whole, S, device)
    segs = _dd.Segments.equal(S, sizes[0], device) if len(set(sizes)) == 1 and sizes[0] else _dd.Segments(unit, S)
    C = segs.gather(torch.stack([ch, cl], 1))
    a, den, flat = _dd.standardize(C[:, :, :1], C[:, :, 1:], segs, eps, zero_mean=wt)
    h, l = segs.rows(a[0]).view(-1), segs.rows(a[1]).view(-1)
    units = _Units(sizes, device)
    R = ((units.amax(h) - units.amin(h)) * (1 + 2.0 ** -30)).clamp(min=0)
    D = den[0].view(S) * (1 - 2.0 ** -60)
    D = torch.where(flat.view(S), torch.full_like(D, eps), D)
    Emax = units.amax(E)
    B = eq6_bound(_dd.UNIT, h, D, units.spread, units.T, wt, E, R, Emax, eps)
    exact0 = units.spread(flat.view(S) & (Emax == 0)) | ((h == 0) & (l == 0) & (E == 0) & units.spread(wt) & (ch == 0) & (cl == 0))
    B = torch.where(exact0, 0.0, B)
    return h, l, B


# --- the problems of the API calls ----------------------------------------------------------------


def _group_index(inp) -> tuple[torch.Tensor, int]:
    """Per row its group's index (0..G-1) and G."""
    n = inp.n
    device = inp.rewards.device
    if inp.labels is None:
        g = inp.group_size
        return torch.arange(n, device=device) // g, n // g
    uniq, inv = torch.unique(inp.labels, return_inverse=True)
    return inv.view(-1), int(uniq.shape[0])


def _flat_rows(inp, gid_G=None, labelled=None) -> torch.Tensor:
    """(N,) bool: the row's group has every reward column constant (z = 0 exactly, c = 0).
    ``labelled``: (perm, gid, pos) of phase one's sort of the labels, where at hand: each sorted
    row against its group's first, no scatter over the rewards."""
    r = inp.rewards
    n, k = r.shape
    if inp.labels is None:
        g = inp.group_size
        v = r.view(n // g, g, k)
        flat = (v.amax(1) == v.amin(1)).all(1)
        return flat.repeat_interleave(g)
    gid, G = gid_G or _group_index(inp)
    if labelled is not None:
        perm, sgid, pos = labelled  # sorted row -> input row, its group, its place there
        rs = r.index_select(0, perm)
        first = torch.arange(n, dtype=_I64, device=r.device).sub_(pos)  # its group's first sorted row
        odd = ~(rs == rs.index_select(0, first)).all(1)
        bad = torch.zeros(G, dtype=torch.bool, device=r.device).index_fill_(0, sgid[odd], True)
        return ~bad.index_select(0, gid)
    idx = gid[:, None].expand(n, k)
    hi = torch.full((G, k), -math.inf, dtype=r.dtype, device=r.device).scatter_reduce_(0, idx, r, "amax")
    lo = torch.full((G, k), math.inf, dtype=r.dtype, device=r.device).scatter_reduce_(0, idx, r, "amin")
    return (hi == lo).all(1).index_select(0, gid)


def _longest(inp, gid_G=None, n_max: int | None = None) -> int:
    if inp.labels is None:
        return inp.group_size
    if n_max is not None:
        return n_max
    gid, G = gid_G or _group_index(inp)
    return int(torch.bincount(gid, minlength=G).max())


def _oracle_gdpo(inp, sizes, eps):
    def run(name):
        from oracle import gdpo as og
        r = inp.rewards.detach().to("cpu", _F64).numpy()
        labels = None if inp.labels is None else inp.labels.detach().cpu().numpy()
        res = og.gdpo_advantages(r, group_ids=labels, weights=list(inp.weights), eps=eps,
                                 group_size=inp.group_size if labels is None else None,
                                 segment_sizes=list(sizes), missing=inp.missing)
        return res.rounded(name)
    return run


def for_gdpo(inp, a: torch.Tensor, c: torch.Tensor, sizes: list[int], eps: float, whole, emax=None,
             loc=None, qexp: int | None = None, top: float | None = None, erms: float | None = None,
             eq4_stats: tuple | None = None, labelled=None) -> Problem:
    """The certificate's view of a local gdpo_advantages call (missing="refuse"). ``emax``: the
    bound on |c - c*| of every row from :func:`eq4_error`, where the plain path had contiguous
    groups (None: the worst case); ``loc``: its Eq. 6 statistics; ``qexp``: 2**qexp divides
    every reward (None: read where needed, :func:`quantum_exponent`), ``top``: none exceeds it
    in magnitude (None: not known); ``erms``: with ``emax``, the bound on the root mean square
    of |c - c*| over a unit of whole groups (None: emax); ``eq4_stats``: Eq. 4's two-pass
    statistics of contiguous groups (``impl._eq4.Z.stats``), for the exact zeros, or None;
    ``labelled``: labelled groups' ((perm, gid, pos) of phase one's sort, group count, longest
    group), where at hand (``impl._plan.Plan.sort``: each row's group from that sort, not a
    second one)."""
    gid_G = lab = n_max = None
    if inp.labels is not None:
        if labelled is not None:  # input row -> group (label order): the sort's, scattered back
            lab, groups, n_max = labelled
            perm, gid, _ = lab
            gid_G = (torch.empty_like(gid).scatter_(0, perm, gid), groups)
        else:
            gid_G = _group_index(inp)
    if emax is not None:
        def E():  # rows of groups whose columns are all constant: z = 0 exactly, c = +0 (E = 0)
            return torch.where(_flat_rows(inp, gid_G, lab), 0.0, torch.full_like(a, emax))
    else:
        e = eq47_bound(U64, _longest(inp, gid_G, n_max), inp.k, inp.weights)

        def E():  # as above, the worst-case bound elsewhere
            return torch.where(_flat_rows(inp, gid_G, lab), 0.0, torch.full_like(a, e))

    def dd():
        gid, G = gid_G or _group_index(inp)
        return dd_gdpo(inp.rewards, gid, G, inp.weights, eps, sizes, whole,
                       inp.group_size if inp.labels is None else None)

    def dd_rows(rows):
        gid, G = gid_G or _group_index(inp)
        gsel = torch.zeros(G, dtype=torch.bool, device=gid.device)
        gsel[gid.index_select(0, rows)] = True
        mine = gsel.index_select(0, gid).nonzero().view(-1)  # every row of those groups
        sub = dataclasses.replace(inp, rewards=inp.rewards.index_select(0, mine), group_size=None,
                                  labels=gid.index_select(0, mine))
        got = dd_rows_gdpo(sub, eps)
        if got is None:
            return None
        at = torch.searchsorted(mine, rows)  # rows within the selection (mine is sorted)
        return tuple(t.index_select(0, at) for t in got)
    def exact_rows(rows: list[int]):
        from impl import _exact_rows
        r = inp.rewards
        if inp.labels is None:
            g = inp.group_size
            members = {}
            for row in rows:
                members.setdefault(row // g, None)
            groups = {q: list(range(q * g, (q + 1) * g)) for q in members}
            key = [row // g for row in rows]
        else:
            gid, _ = gid_G or _group_index(inp)
            key = gid.index_select(0, torch.tensor(rows, dtype=_I64, device=gid.device)).tolist()
            groups = {q: (gid == q).nonzero().view(-1).tolist() for q in set(key)}
        out = {}
        for q, mem in groups.items():
            vals = r.index_select(0, torch.tensor(mem, dtype=_I64, device=r.device)).to("cpu", _F64).tolist()
            pos = {m: i for i, m in enumerate(mem)}
            mine = [row for row, kq in zip(rows, key) if kq == q]
            for row, res in zip(mine, _exact_rows.combined(vals, list(inp.weights), eps, [pos[m] for m in mine])):
                out[row] = res
        return [out[row] for row in rows]

    known = None if qexp is None or top is None else (qexp, top)

    @functools.cache
    def eq4_route() -> bool:  # (asked only where some row needs the exact zeros)
        from impl import _exact_zeros
        return (inp.labels is None and eq4_stats is not None
                and _exact_zeros.eq4_route(inp.group_size, list(inp.weights), known))

    def zero_rows(rows: torch.Tensor) -> torch.Tensor:
        from impl import _exact_zeros
        if inp.labels is None:
            if eq4_route():
                return _exact_zeros.zero_rows_eq4(rows, inp.rewards, inp.group_size, list(inp.weights), eq4_stats)
            return _exact_zeros.zero_rows_contiguous(rows, inp.rewards, inp.group_size, list(inp.weights),
                                                     quantum_exponent if qexp is None else lambda _: qexp,
                                                     known=known)
        gid, G = gid_G or _group_index(inp)
        return _exact_zeros.zero_rows_labelled(rows, gid, G, inp.rewards, list(inp.weights), quantum_exponent,
                                               sort=lab)
    return Problem(a, c, sizes, eps, whole, E, dd, _oracle_gdpo(inp, sizes, eps), dd_rows, loc, emax, exact_rows,
                   zero_rows, erms=erms if emax is not None else None, e_rows=None if emax is not None else e)


def stage(plan, call, dev, y: torch.Tensor) -> tuple[torch.Tensor, Counts]:
    """The certify stage of a local call (``plan.certify``): the output in ``plan.out_dtype``, every
    sample's rounding decided by the tiers, and their counts, from ``y``, the cast's output (a
    refused where out of range, rounded once; float64: a itself). It reads the device part's results
    (``impl._pipeline.Device``): a (float64), c as Eq. 6 found it (the plan keeps Eq. 6 off c's
    buffer where it certifies), Eq. 6's statistics where the plain backend kept them (tier 0; else
    recomputed from c) and whether Eq. 4 ran the two-pass of contiguous groups (``dev.z.err_rows``:
    the running bound; else the worst case)."""
    a, out_dtype = dev.a, plan.out_dtype
    counts = Counts()
    if call.inp is None:  # whiten: the values are c, exact
        return finish(for_whiten(dev.c, a, plan.sizes, plan.eps), out_dtype, counts, y), counts
    rows = getattr(dev.z, "err_rows", 0)  # (None: a graph replay, which keeps no z)
    emax, qexp, top, erms = (eq4_error(call.inp.rewards.contiguous(), rows, call.inp.weights,
                                       getattr(dev.z, "largest", None))
                             if rows else (None, None, None, None))
    loc = dev.loc if getattr(dev.loc, "tp", None) is not None else None  # the plain backend's statistics
    sort = getattr(plan, "sort", None)  # labelled groups: phase one's sort, where the plan kept it
    labelled = None if sort is None else (sort, int(plan.row[P_GROUPS]), int(plan.row[P_N_MAX]))
    p = for_gdpo(call.inp, a, dev.c, plan.sizes, plan.eps, plan.whole, emax, loc, qexp, top, erms,
                 getattr(dev.z, "stats", None), labelled)
    return finish(p, out_dtype, counts, y), counts


def for_whiten(v: torch.Tensor, a: torch.Tensor, sizes: list[int], eps: float) -> Problem:
    c = v.to(_F64)
    E = torch.zeros_like(a)

    def dd():
        return dd_whiten(c, torch.zeros_like(c), E, eps, sizes, None)

    def exact(name):
        from oracle import gdpo as og
        return og.whiten(c.detach().cpu().numpy(), segment_sizes=list(sizes), eps=eps).rounded(name)
    return Problem(a, c, sizes, eps, None, E, dd, exact)


#: the output formats the certificate covers (float8 is rounded once, uncertified)
FORMATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


# --- across ranks: the dd statistics ride in collective 2 ---------------------------------------------

#: per unit and rank: count, shift, sum of (c - shift) (dd), sum of its squares (dd), max E,
#: "this part is not whole groups", min and max of c
DDC = 10


def dd_rows_gdpo(inp, eps: float):
    """This rank's combined values in double-double, and their bounds: (ch, cl, E), or None
    outside the dd path's safe range."""
    if inp.n == 0:
        z = inp.rewards.new_zeros(0, dtype=_F64)
        return z, z, z
    gid, G = _group_index(inp)
    return _dd_combined(inp.rewards, gid, G, inp.weights, eps)


def _dd_combined(r: torch.Tensor, gid: torch.Tensor, G: int, weights: list[float], eps: float,
                 group_size: int | None = None):
    """Eq. 4 and 7 of every row in double-double, rows grouped by ``gid`` (contiguous groups of
    ``group_size`` where given): (ch, cl, E), E the bound on each row's error; None outside the
    dd path's safe range (inputs, or combined values: a huge eps over a tiny std)."""
    r = r.to(_F64)
    if not (_dd.safe(r, *weights) and _dd.eps_safe(eps)):
        return None
    k = r.shape[1]
    segs = _dd.Segments.equal(G, group_size, r.device) if group_size and r.shape[0] else _dd.Segments(gid, G)
    X = segs.gather(r)
    z, _, collapsed = _dd.standardize(X, None, segs, eps)
    zh, zl = segs.rows(z[0]), segs.rows(z[1])
    ch = cl = None
    for j, w in enumerate(weights):
        term = _dd.mul_f((zh[:, j], zl[:, j]), torch.full_like(zh[:, j], w))
        ch, cl = term if ch is None else _dd.add((ch, cl), term)
    if not _dd.safe(ch):
        return None
    nrow = segs.sizes.view(-1).index_select(0, gid)
    E = eq47_bound_rows(_dd.UNIT, zh.abs(), nrow, weights)
    E = torch.where(collapsed.view(G, k).all(1).index_select(0, gid), 0.0, E)
    return ch, cl, E


def dd_table(ch, cl, E, sizes: list[int], whole) -> torch.Tensor:
    """(S, DDC) float64: this rank's part of every unit (see :data:`DDC`)."""
    device = ch.device
    S = len(sizes)
    out = torch.zeros(S, DDC, dtype=_F64, device=device)
    out[:, 8] = math.inf
    out[:, 9] = -math.inf
    if ch.shape[0] == 0:
        return out
    unit = _unit_index(sizes, device)
    wt = _whole_tensor(whole, S, device)
    segs = _dd.Segments(unit, S)
    firsts = ch.index_select(0, segs.first)
    shift = torch.where(wt, 0.0, firsts)
    sh = shift.index_select(0, unit)
    d = _dd.add_f((ch, cl), -sh)
    Dh = segs.gather(torch.stack([d[0], d[1]], 1))
    m = segs.mask[:, :, None]
    Dh0 = torch.where(m, Dh[:, :, :1], 0.0)
    Dl0 = torch.where(m, Dh[:, :, 1:], 0.0)
    s1 = _dd.tree_sum((Dh0, Dl0))
    q = _dd.tree_sum(_dd.mul((Dh0, Dl0), (Dh0, Dl0)))
    T = torch.bincount(unit, minlength=S).to(_F64)
    out[:, 0] = T
    out[:, 1] = shift
    out[:, 2], out[:, 3] = s1[0].view(S), s1[1].view(S)
    out[:, 4], out[:, 5] = q[0].view(S), q[1].view(S)
    out[:, 6] = torch.zeros(S, dtype=_F64, device=device).scatter_reduce_(0, unit, E, "amax", include_self=True)
    out[:, 7] = (~wt).to(_F64)
    out[:, 8] = torch.full((S,), math.inf, dtype=_F64, device=device).scatter_reduce_(0, unit, ch, "amin")
    out[:, 9] = torch.full((S,), -math.inf, dtype=_F64, device=device).scatter_reduce_(0, unit, ch, "amax")
    return torch.where((T > 0)[:, None], out, torch.tensor([0, 0, 0, 0, 0, 0, 0, 0, math.inf, -math.inf],
                                                          dtype=_F64, device=device))


def dd_merged(tables: torch.Tensor, eps: float):
    """The units' global dd statistics from every rank's :func:`dd_table` (W, S, DDC), ranks
    in order: (T, mean (dd), den (dd), whole, Emax, cmin, cmax) per unit, the same on every rank."""
    W, S, _ = tables.shape
    n = tables[..., 0]
    T = n.sum(0)
    whole = tables[..., 7].sum(0) == 0
    # the sum of every value: n shift + s1 per rank
    tot = (torch.zeros(S, dtype=_F64, device=tables.device),) * 2
    for r in range(W):
        part = _dd.add_f((tables[r, :, 2], tables[r, :, 3]), 0.0)
        ns = _dd.two_prod(n[r], tables[r, :, 1])
        tot = _dd.add(tot, _dd.add(part, ns))
    Tsafe = torch.where(T > 0, T, 1.0)
    mean = _dd.div_f(tot, Tsafe)
    mean = (torch.where(whole, 0.0, mean[0]), torch.where(whole, 0.0, mean[1]))
    m2 = (torch.zeros(S, dtype=_F64, device=tables.device),) * 2
    for r in range(W):
        s1 = (tables[r, :, 2], tables[r, :, 3])
        q = (tables[r, :, 4], tables[r, :, 5])
        delta = _dd.add_f(_dd.neg(mean), tables[r, :, 1])  # shift_r - mean
        t1 = _dd.mul(_dd.mul_f(delta, torch.full_like(n[r], 2.0)), s1)
        t2 = _dd.mul_f(_dd.mul(delta, delta), n[r])
        part = _dd.add(q, _dd.add(t1, t2))
        has = n[r] > 0
        part = (torch.where(has, part[0], 0.0), torch.where(has, part[1], 0.0))
        m2 = _dd.add(m2, part)
    m2 = (m2[0].clamp(min=0), torch.where(m2[0] > 0, m2[1], 0.0))
    nm1 = torch.clamp(T - 1.0, min=1.0)
    sd = _dd.sqrt(_dd.div_f(m2, nm1))
    den = _dd.add_f(sd, torch.full_like(sd[0], eps))
    Emax = tables[..., 6].amax(0)
    cmin = tables[..., 8].amin(0)
    cmax = tables[..., 9].amax(0)
    return T, mean, den, whole, Emax, cmin, cmax


def dd_finish(merged, ch, cl, E, sizes: list[int], eps: float, out_dtype, counts: Counts,
              plain: torch.Tensor) -> torch.Tensor:
    """This rank's outputs from the merged dd statistics: certified where the bound allows,
    elsewhere the plain float64 result ``plain`` rounded once (counted as uncertified)."""
    T, mean, den, whole, Emax, cmin, cmax = merged
    device = ch.device
    if ch.shape[0] == 0:
        return torch.empty(0, dtype=out_dtype, device=device)
    unit = _unit_index(sizes, device)
    flat = (cmin == cmax) & (Emax == 0) & (T > 0)
    Dsafe = (torch.where(flat | (den[0] == 0), 1.0, den[0]), torch.where(flat | (den[0] == 0), 0.0, den[1]))
    m = (mean[0].index_select(0, unit), mean[1].index_select(0, unit))
    Du = (Dsafe[0].index_select(0, unit), Dsafe[1].index_select(0, unit))
    a = _dd.div(_dd.add((ch, cl), _dd.neg(m)), Du)
    fu = flat.index_select(0, unit)
    h = torch.where(fu, 0.0, a[0])
    l = torch.where(fu, 0.0, a[1])
    D = torch.where(flat, torch.full_like(den[0], eps), den[0]) * (1 - 2.0 ** -60)
    with np.errstate(all="ignore"):
        R = torch.where(D > 0, (cmax - cmin) / D, math.inf) * (1 + 2.0 ** -30) + 2 * Emax / D
    R = torch.where(torch.isnan(R), math.inf, R)
    B = eq6_bound(_dd.UNIT, h, D, lambda v: v.index_select(0, unit), T, whole, E, R, Emax, eps)
    exact0 = fu | ((ch == 0) & (cl == 0) & (E == 0) & whole.index_select(0, unit))
    B = torch.where(exact0, 0.0, B)
    ok, y, _ = certify(h, l, B, out_dtype)
    counts.double_double += int(ok.sum())
    bad = ~ok
    if bool(bad.any()):
        counts.uncertified += int(bad.sum())
        y = torch.where(bad, round_out(plain, out_dtype), y)
    return y


def dd_unsafe_table(sizes: list[int], device) -> torch.Tensor:
    """A rank whose inputs leave the dd path's safe range: its parts carry E = inf, so no
    sample of those units is certified on any rank (each rounds its plain result)."""
    out = torch.zeros(len(sizes), DDC, dtype=_F64, device=device)
    out[:, 6] = math.inf
    out[:, 7] = 1.0
    out[:, 8] = math.inf
    out[:, 9] = -math.inf
    return out
