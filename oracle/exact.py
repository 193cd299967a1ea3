"""Exact arithmetic for the oracle: quadratic forms, certified intervals, correct rounding.

Every GDPO quantity up to Eq. 7 is a *form* ``q0 + sum_c p_c * sqrt(x_c)`` over square-root
classes (``1 / (sqrt(V) + eps) = (sqrt(V) - eps) / (V - eps^2)``, ``1 / sqrt(V + eps) =
sqrt(V + eps) / (V + eps)``); spec/gdpo.md section 10 states why its zeros and roundings are
exact (Besicovitch; libmp intervals raised in precision until both ends round alike).
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np
from mpmath import libmp

from spec import error_model as em
from spec.errors import GDPOError

_FLOOR = libmp.round_floor
_CEIL = libmp.round_ceiling
ZERO = libmp.fzero

#: Ziv's loop: the working precisions (bits) tried in turn, from START_PREC doubling up to MAX_PREC.
START_PREC = 96
MAX_PREC = 1 << 16
PRECISIONS = tuple(p for p in (START_PREC << k for k in range(16)) if p <= MAX_PREC)


class CertificationError(GDPOError):
    """The oracle could not certify a rounding within its precision cap."""


# --------------------------------------------------------------------------- forms


class Form:
    """``q0 + sum_c terms[c] * sqrt(x_c)``; coefficients are Fractions, class ids ints."""

    __slots__ = ("q0", "terms")

    def __init__(self, q0: Fraction = Fraction(0), terms: dict | None = None):
        self.q0, self.terms = q0, {} if terms is None else terms

    def is_zero(self) -> bool:
        return self.q0 == 0 and not self.terms

    def support(self) -> int:
        return len(self.terms) + (self.q0 != 0)

    def add_scaled(self, other: "Form", scale: Fraction) -> None:
        """In place: self += scale * other."""
        if scale == 0:
            return
        one = scale == 1
        if other.q0:
            self.q0 += other.q0 if one else scale * other.q0
        for cid, p in other.terms.items():
            v = self.terms.get(cid, 0) + (p if one else scale * p)
            if v:
                self.terms[cid] = v
            else:
                self.terms.pop(cid, None)

    def scaled(self, scale: Fraction) -> "Form":
        return Form(self.q0 * scale, {c: p * scale for c, p in self.terms.items()}) if scale else Form()

    def is_rational(self) -> bool:
        """No square-root term: the form is its rational part (Besicovitch: a form with a
        term is irrational, so it is never a midpoint between two floats)."""
        return not self.terms

    def times(self, other: "Form", classes: "SqrtClasses") -> "Form":
        """The exact product (sqrt(x_a) sqrt(x_b) = sqrt(x_a x_b), re-registered in
        ``classes``, which may grow)."""
        out = Form(self.q0 * other.q0)
        out.add_scaled(Form(Fraction(0), other.terms), self.q0)
        out.add_scaled(Form(Fraction(0), self.terms), other.q0)
        for ca, pa in self.terms.items():
            for cb, pb in other.terms.items():
                out.add_scaled(classes.sqrt(Fraction(classes.radicands[ca] * classes.radicands[cb])), pa * pb)
        return out

    def minus(self, other: "Form") -> "Form":
        out = Form(self.q0, dict(self.terms))
        out.add_scaled(other, Fraction(-1))
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Form) and self.q0 == other.q0 and self.terms == other.terms

    def __repr__(self) -> str:
        return f"Form({self.q0}, {self.terms})"


_SMALL_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47)
_LEGENDRE_PRIMES = (53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 101, 103, 107, 109, 113,
                    127, 131, 137, 139, 149, 151, 157, 163, 167, 173, 179, 181, 191)


def _fingerprint(n: int) -> tuple:
    """Equal for two integers whose product is a perfect square (a necessary test)."""
    parity = []
    for p in _SMALL_PRIMES + _LEGENDRE_PRIMES:
        e = 0
        while n % p == 0:
            n //= p
            e += 1
        parity.append(e & 1)
    symbols = tuple(pow(n % p, (p - 1) // 2, p) for p in _LEGENDRE_PRIMES)
    return tuple(parity), symbols


class SqrtClasses:
    """Registry of square-root classes: ``sqrt(V)`` as a form over canonical radicands."""

    def __init__(self) -> None:
        self.radicands: list[int] = []
        self._buckets: dict[tuple, list[int]] = {}
        self._cache: dict[Fraction, Form] = {}
        self._sqrt_iv: dict[tuple[int, int], tuple] = {}

    def sqrt(self, v: Fraction) -> Form:
        """Exact form of sqrt(v) for a rational v >= 0."""
        hit = self._cache.get(v)
        if hit is not None:
            return hit
        num, den = v.numerator, v.denominator
        rn, rd = math.isqrt(num), math.isqrt(den)
        if rn * rn == num and rd * rd == den:
            form = Form(Fraction(rn, rd))
        else:
            n = num * den  # sqrt(v) = sqrt(n) / den
            key = _fingerprint(n)
            bucket = self._buckets.setdefault(key, [])
            for cid in bucket:
                x = self.radicands[cid]
                prod = n * x
                r = math.isqrt(prod)
                if r * r == prod:  # sqrt(n) = r / x * sqrt(x)
                    form = Form(Fraction(0), {cid: Fraction(r, x * den)})
                    break
            else:
                cid = len(self.radicands)
                self.radicands.append(n)
                bucket.append(cid)
                form = Form(Fraction(0), {cid: Fraction(1, den)})
        self._cache[v] = form
        return form

    def sqrt_interval(self, cid: int, prec: int) -> tuple:
        if (cid, prec) not in self._sqrt_iv:
            x = libmp.from_int(self.radicands[cid])
            self._sqrt_iv[cid, prec] = (libmp.mpf_sqrt(x, prec, _FLOOR), libmp.mpf_sqrt(x, prec, _CEIL))
        return self._sqrt_iv[cid, prec]


# ----------------------------------------------------------------------- intervals


def iv_rational(q: Fraction, prec: int) -> tuple:
    return tuple(libmp.from_rational(q.numerator, q.denominator, prec, rnd) if q else ZERO for rnd in (_FLOOR, _CEIL))


def iv_add(a: tuple, b: tuple, prec: int) -> tuple:
    return (libmp.mpf_add(a[0], b[0], prec, _FLOOR), libmp.mpf_add(a[1], b[1], prec, _CEIL))


def iv_sub(a: tuple, b: tuple, prec: int) -> tuple:
    return (libmp.mpf_sub(a[0], b[1], prec, _FLOOR), libmp.mpf_sub(a[1], b[0], prec, _CEIL))


#: mpf values in exact order (``min(..., key=_EXACTLY)``): an interval's ends never go through a float.
_EXACTLY = functools.cmp_to_key(libmp.mpf_cmp)


def iv_square(a: tuple, prec: int) -> tuple:
    lo, hi = a
    if libmp.mpf_sign(lo) >= 0:
        return (libmp.mpf_mul(lo, lo, prec, _FLOOR), libmp.mpf_mul(hi, hi, prec, _CEIL))
    if libmp.mpf_sign(hi) <= 0:
        return (libmp.mpf_mul(hi, hi, prec, _FLOOR), libmp.mpf_mul(lo, lo, prec, _CEIL))
    return (ZERO, max(libmp.mpf_mul(lo, lo, prec, _CEIL), libmp.mpf_mul(hi, hi, prec, _CEIL), key=_EXACTLY))


def iv_div(a: tuple, b: tuple, prec: int) -> tuple:
    if libmp.mpf_sign(b[0]) <= 0 <= libmp.mpf_sign(b[1]):
        raise CertificationError("interval division by an interval containing zero")
    lo = [libmp.mpf_div(x, y, prec, _FLOOR) for x in a for y in b]
    hi = [libmp.mpf_div(x, y, prec, _CEIL) for x in a for y in b]
    return (min(lo, key=_EXACTLY), max(hi, key=_EXACTLY))


def iv_sqrt(a: tuple, prec: int) -> tuple:
    lo = a[0] if libmp.mpf_sign(a[0]) > 0 else ZERO
    return (libmp.mpf_sqrt(lo, prec, _FLOOR), libmp.mpf_sqrt(a[1], prec, _CEIL))


def iv_scale_rational(a: tuple, q: Fraction, prec: int) -> tuple:
    """q * [lo, hi] for an exact rational q: multiply by the numerator, divide by the
    denominator, each end rounded outward (cheaper than a general interval product)."""
    num = q.numerator
    if num == 0:
        return (ZERO, ZERO)
    n, d = libmp.from_int(num), libmp.from_int(q.denominator)
    wide = prec + num.bit_length() + 2  # the product is exact at this precision
    return tuple(libmp.mpf_div(libmp.mpf_mul(x, n, wide, rnd), d, prec, rnd)
                 for x, rnd in zip(a[::-1] if num < 0 else a, (_FLOOR, _CEIL)))


def iv_form(form: Form, classes: SqrtClasses, prec: int) -> tuple:
    acc = iv_rational(form.q0, prec)
    for cid, p in form.terms.items():
        acc = iv_add(acc, iv_scale_rational(classes.sqrt_interval(cid, prec), p, prec), prec)
    return acc


def iv_contains_zero(a: tuple) -> bool:
    return libmp.mpf_sign(a[0]) <= 0 <= libmp.mpf_sign(a[1])


# ------------------------------------------------------------------ correct rounding

#: Every format the oracle certifies a rounding in (the error model's ``FORMATS``: precision in
#: bits, minimum normal exponent, maximum exponent), each rounded once from the exact value.
ROUNDED = tuple(em.FORMATS)


def round_mpf(x: tuple, fmt: str) -> float:
    """Round an mpf to the nearest value of ``fmt`` (ties to even), subnormals and
    overflow to infinity included; returned as a Python float (exact for both formats)."""
    sign, man, exp, bc = x
    man = int(man)
    if not man:
        if x == ZERO:
            return 0.0
        raise CertificationError(f"cannot round special value {x}")
    return _round_scaled(sign, man, 1, exp, exp + bc - 1, fmt)


def _round_scaled(neg, n: int, d: int, s: int, e: int, fmt: str) -> float:
    """(-1)^neg (n / d) 2^s (n, d > 0; 2^e <= n / d 2^s < 2^(e + 1)) rounded to the nearest value
    of ``fmt`` (ties to even) in integer arithmetic: a signed zero, the value, or an infinity."""
    p, emin, emax = em.FORMATS[fmt]
    k = max(e - p + 1, emin - p + 1) - s  # the value's last bit: 2^(k + s)
    num, den = (n, d << k) if k >= 0 else (n << -k, d)
    m, rem = divmod(num, den)
    if 2 * rem > den or (2 * rem == den and m & 1):
        m += 1
    v = math.inf if m.bit_length() + k + s > emax + 1 else math.ldexp(m, k + s)
    return -v if neg else v


def round_all(iv: tuple) -> tuple[float, ...] | None:
    """The value of every format of :data:`ROUNDED` (in that order) both ends of ``iv``
    round to (each rounded once from the interval, never float16 through float32 or
    float64), or None while any differs (a zero's sign included)."""
    every = []
    for fmt in ROUNDED:
        lo, hi = round_mpf(iv[0], fmt), round_mpf(iv[1], fmt)
        if lo != hi or math.copysign(1.0, lo) != math.copysign(1.0, hi):
            return None
        every.append(lo)
    return tuple(every)


def round_fraction(q: Fraction, fmt: str) -> float:
    """Round an exact rational to the nearest value of ``fmt`` (ties to even), subnormals and
    overflow to infinity included, in integer arithmetic: never through an interval, whose ends
    would never certify a value exactly halfway between two floats."""
    if q == 0:
        return 0.0
    return _round_scaled(q < 0, abs(q.numerator), q.denominator, 0, _floor_log2(abs(q)), fmt)


def round_all_fraction(q: Fraction) -> tuple[float, ...]:
    """:func:`round_fraction` to every format of :data:`ROUNDED` (in that order)."""
    return tuple(round_fraction(q, fmt) for fmt in ROUNDED)


def boundaries(iv: tuple) -> list[Fraction]:
    """The rounding boundaries that keep ``iv`` from certifying: for each format of
    :data:`ROUNDED` whose two ends round to *adjacent* values, the midpoint between them
    (or the overflow threshold, between the largest finite value and infinity). Empty
    where every end rounds alike or the interval is still wide. An exact value equal to
    one of them is a tie, which the caller rounds exactly (to even)."""
    out = []
    for fmt in ROUNDED:
        lo, hi = round_mpf(iv[0], fmt), round_mpf(iv[1], fmt)
        if lo == hi:
            continue  # certified, or only the sign of a zero differs (no midpoint there)
        p, _, emax = em.FORMATS[fmt]
        top = Fraction(em.largest_finite(fmt))
        threshold = top + Fraction(2) ** (emax - p)
        if math.isinf(hi) and math.isfinite(lo) and Fraction(lo) == top:
            out.append(threshold)
        elif math.isinf(lo) and math.isfinite(hi) and Fraction(hi) == -top:
            out.append(-threshold)
        elif math.isfinite(lo) and math.isfinite(hi) and _adjacent(Fraction(lo), Fraction(hi), fmt):
            out.append((Fraction(lo) + Fraction(hi)) / 2)
    return out


def _adjacent(lo: Fraction, hi: Fraction, fmt: str) -> bool:
    """Are the values lo < hi of ``fmt`` neighbours? Their gap is then the spacing at the smaller
    magnitude (the binade below where one is a power of two; the subnormals' below 2^emin)."""
    p, emin, _ = em.FORMATS[fmt]
    x = min(abs(lo), abs(hi))
    e = emin if x == 0 else max(_floor_log2(x), emin)
    return hi - lo == Fraction(2) ** (e - p + 1)


def _floor_log2(x: Fraction) -> int:
    n, d = x.numerator, x.denominator
    e = n.bit_length() - d.bit_length()
    if (n << max(0, -e)) < (d << max(0, e)):
        e -= 1
    return e


def round_form(form: Form, classes: SqrtClasses) -> tuple[float, ...]:
    """Certified roundings of an exact form to every format of :data:`ROUNDED` (Ziv's loop)."""
    if form.is_rational():
        return round_all_fraction(form.q0)
    for prec in PRECISIONS:
        every = round_all(iv_form(form, classes, prec))
        if every is not None:
            return every
    raise CertificationError(f"could not certify {form!r} within {MAX_PREC} bits")


def pow2(e: int) -> Fraction:
    return Fraction(2) ** e if e >= 0 else Fraction(1, 2 ** -e)


def exact_std(values) -> float:
    """The unbiased std of float values: :func:`float_sqrt` of their exact rational variance."""
    q = [Fraction(float(v)) for v in values]
    m = sum(q) / len(q)
    return float_sqrt(sum((v - m) ** 2 for v in q) / (len(q) - 1))


def float_sqrt(v: Fraction) -> float:
    """sqrt(v) to float64 (through 80 bits: an input of the error model, not a certified value)."""
    if v == 0:
        return 0.0
    x = libmp.from_rational(v.numerator, v.denominator, 80, libmp.round_nearest)
    return round_mpf(libmp.mpf_sqrt(x, 80, libmp.round_nearest), "float64")


class Values:
    """A stage's values while they are computed, per output element: the certified rounding
    to each format of :data:`ROUNDED`, exact zeros, the condition estimate ``cond`` and the
    error model's ``delta``, the zeros the specification demands bit for bit (``required``);
    of Eq. 7's c, which Eq. 6 reads, also the exact forms (None on a NaN row), the NaN rows and
    the per-sample frames of the deltas (cond 2^cond_frame, delta 2^frame)."""

    def __init__(self, shape, required: bool = False):
        n = shape if isinstance(shape, int) else shape[0]
        self.rounded = {fmt: np.zeros(shape) for fmt in ROUNDED}
        self.zero, self.required = np.zeros(shape, bool), np.full(shape, required)
        self.cond, self.delta = np.zeros(shape), np.zeros(shape)
        self.frame, self.cond_frame = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        self.forms, self.nan = [None] * n, np.zeros(n, bool)

    def put(self, at, values) -> None:
        """One certified value per format (a tuple in :data:`ROUNDED` order, or one value for
        every format) at index ``at``."""
        for i, fmt in enumerate(ROUNDED):
            self.rounded[fmt][at] = values[i] if isinstance(values, tuple) else values


# ------------------------------------------------------------------- frames of the error model


def eps_floor(eps: Fraction, placement: str) -> int:
    """The lowest frame 2^f of an Eq. 4 (group column) or Eq. 6 (unit) bound: -900, raised where
    eps's share of the denominator (eps 2^-f added to the std; sqrt(eps) 2^-f to the variance)
    would exceed 2^960 in it (never for eps below 2^60, or 2^120 added to the variance).

    Where the floor lifts a frame above the column's range (the unit's largest |c|), the
    denominator there is at least 2^959: a deviation, std, product, τ 2^-f or input ulp that
    flushes to 0 there enters Δz (Δa) divided by it, or times |z| < 2^-959: below 2^-2000, far
    below the model's own underflow term. A range that flushes is kept at 2^-1074 (an upper
    bound), so that the model never takes a live column for a collapsed one."""
    if eps <= 0 or placement == "skip_if_zero":
        return -900
    x = math.frexp(float(eps))[1]  # eps < 2^x (eps is a float: exact)
    top = -(-x // 2) if placement == "var" else x  # sqrt(eps) < 2^ceil(x/2)
    return max(-900, top - 960)


def collapsed_denominator(eps: Fraction, placement: str, e: int) -> float:
    """The denominator at a zero std measured in the frame 2^e, where its first order exists:
    eps 2^-e ("std", "std_if_positive": a perturbed std is positive) or sqrt(eps) 2^-e ("var");
    0 (no closed form: Samuelson's cap) for "skip_if_zero" or eps = 0."""
    if eps <= 0:
        return 0.0
    if placement in ("std", "std_if_positive"):
        return float(eps * pow2(-e))
    if placement == "var":
        return float_sqrt(eps * pow2(-2 * e))
    return 0.0
