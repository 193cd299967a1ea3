"""Double-double arithmetic, and Eq. 4, 7 and 6 in it: the certificate's first fallback.

A double-double (dd) is an unevaluated sum ``hi + lo`` of two float64 with |lo| <= ulp(hi)/2:
about 106 significant bits. Every operation here is an error-free transformation (Knuth's
TwoSum, Dekker's split and TwoProduct: no fused multiply-add, so the same bits on every
device) followed by a renormalisation; each rounds with a relative error of a few 2**-106
(Joldes, Muller, Popescu, *Tight and rigorous error bounds for basic building blocks of
double-word arithmetic*, ACM TOMS 2017: at most 3u**2 for a sum, 7u**2 for a product by a
dd, 15u**2 for a quotient, with u = 2**-53). :data:`UNIT` (2**-100) is taken as the unit
roundoff of every dd operation: above each of those bounds.

Used only by :mod:`impl._certify`, on the units whose float64 result its bound could not
certify. Its inputs must lie in a safe exponent range (:func:`safe`): there no split
overflows and no error term underflows, so the transformations are exact. Outside it the
certificate goes straight to exact arithmetic.
"""

from __future__ import annotations

import math

import torch

_F64 = torch.float64
_I64 = torch.int64

#: The unit roundoff assumed for every dd operation (above the proven 15 * 2**-106).
UNIT = 2.0 ** -100
_SPLIT = 134217729.0  # 2**27 + 1
#: Nonzero magnitudes of rewards, weights, eps and every intermediate stay within
#: [2**-SAFE, 2**SAFE] on this path (squares of deviations: 2**-2*SAFE-106 is normal).
SAFE = 300


def eps_safe(eps: float) -> bool:
    """eps is only ever added to a std (an exact two-sum at any magnitude): any eps up to
    2**SAFE (above it a z could fall below the range)."""
    return 0.0 <= eps <= 2.0 ** SAFE


def safe(*tensors_or_floats) -> bool:
    """Are every nonzero magnitude among these within [2**-SAFE, 2**SAFE] and finite?"""
    lo, hi = 2.0 ** -SAFE, 2.0 ** SAFE
    for x in tensors_or_floats:
        if isinstance(x, torch.Tensor):
            if x.numel() == 0:
                continue
            a = x.abs()
            big = float(a.amax())  # NaN or inf: not finite (NaN propagates through amax)
            if not big <= hi:
                return False
            small = float(torch.where(a == 0, math.inf, a).amin())  # inf: every value is 0
            if small < lo:
                return False
        else:
            a = abs(float(x))
            if not math.isfinite(a) or (a != 0 and not lo <= a <= hi):
                return False
    return True


# --- error-free transformations ---------------------------------------------------------------


def two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def fast_two_sum(a, b):
    """|a| >= |b| (or a == 0)."""
    s = a + b
    return s, b - (s - a)


def _split(a):
    c = _SPLIT * a
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a, b):
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


# --- dd operations (pairs of tensors) ---------------------------------------------------------


def add(x, y):
    """dd + dd (the accurate algorithm: relative error <= 3u**2)."""
    s, e = two_sum(x[0], y[0])
    t, f = two_sum(x[1], y[1])
    s, e = fast_two_sum(s, e + t)
    return fast_two_sum(s, e + f)


def neg(x):
    return -x[0], -x[1]


def add_f(x, b):
    """dd + float64."""
    s, e = two_sum(x[0], b)
    return fast_two_sum(s, e + x[1])


def mul(x, y):
    p, e = two_prod(x[0], y[0])
    e = e + (x[0] * y[1] + x[1] * y[0])
    return fast_two_sum(p, e)


def mul_f(x, b):
    p, e = two_prod(x[0], b)
    return fast_two_sum(p, e + x[1] * b)


def div(x, y):
    """dd / dd: three quotient digits (relative error well below 15u**2)."""
    q1 = x[0] / y[0]
    r = add(x, neg(mul_f(y, q1)))
    q2 = r[0] / y[0]
    r = add(r, neg(mul_f(y, q2)))
    q3 = r[0] / y[0]
    q = fast_two_sum(q1, q2)
    return add_f(q, q3)


def div_f(x, b):
    return div(x, (b, torch.zeros_like(b) if isinstance(b, torch.Tensor) else 0.0 * x[0]))


def sqrt(x):
    """sqrt of a dd >= 0 (Newton step from the float64 root; 0 stays 0)."""
    s = torch.sqrt(x[0])
    safe_s = torch.where(s > 0, s, 1.0)
    p = two_prod(safe_s, safe_s)
    r = add(x, neg(p))
    corr = r[0] / (2.0 * safe_s)
    out = fast_two_sum(safe_s, corr)
    zero = torch.zeros_like(s)
    return torch.where(s > 0, out[0], zero), torch.where(s > 0, out[1], zero)


def tree_sum(x, dim: int = 1):
    """Pairwise dd sum along ``dim`` (kept, length 1)."""
    h, l = x
    while h.shape[dim] > 1:
        m = h.shape[dim]
        if m % 2:
            pad = list(h.shape)
            pad[dim] = 1
            z = torch.zeros(pad, dtype=h.dtype, device=h.device)
            h, l = torch.cat([h, z], dim), torch.cat([l, z], dim)
            m += 1
        a = (h.narrow(dim, 0, m // 2 * 2).unflatten(dim, (m // 2, 2)).select(dim + 1, 0),
             l.narrow(dim, 0, m // 2 * 2).unflatten(dim, (m // 2, 2)).select(dim + 1, 0))
        b = (h.unflatten(dim, (m // 2, 2)).select(dim + 1, 1), l.unflatten(dim, (m // 2, 2)).select(dim + 1, 1))
        h, l = add(a, b)
    return h, l


def to_float(x):
    """The dd rounded to nearest float64 (hi + lo, one rounding)."""
    return x[0] + x[1]


# --- Eq. 4, 7 and 6 in dd on a padded segment layout ------------------------------------------


class Segments:
    """Rows gathered into a padded (S, width) layout by a segment index per row (any order);
    :meth:`equal`: segments of one size, in order (a view, no mask)."""

    mask: torch.Tensor | None  # (S, width) bool: the slots that hold a row (None: every slot)

    @classmethod
    def equal(cls, count: int, width: int, device) -> "Segments":
        """``count`` segments of ``width`` consecutive rows each: gather and rows are views, and
        :func:`standardize` skips the masks (the same arithmetic on the same slots, so the same
        bits as the general layout of these rows)."""
        self = cls.__new__(cls)
        self.width, self.count = width, count
        self.sizes = torch.full((count, 1), float(width), dtype=_F64, device=device)
        self.mask = self.slot = None
        return self

    def __init__(self, seg: torch.Tensor, count: int):
        n = seg.shape[0]
        device = seg.device
        order = torch.argsort(seg, stable=True)
        sizes = torch.bincount(seg, minlength=count)
        starts = torch.cumsum(sizes, 0) - sizes
        s_sorted = seg.index_select(0, order)
        pos = torch.arange(n, device=device) - starts.index_select(0, s_sorted)
        self.width = max(int(sizes.max()) if n else 1, 1)
        self.count = count
        self.sizes = sizes.to(_F64)[:, None]
        self.slot = torch.empty(n, dtype=_I64, device=device)
        self.slot[order] = s_sorted * self.width + pos  # row -> slot
        self.mask = torch.zeros(count * self.width, dtype=torch.bool, device=device)
        self.mask[self.slot] = True
        self.mask = self.mask.view(count, self.width)
        first = torch.full((count,), n, dtype=_I64, device=device)
        first.scatter_reduce_(0, seg, torch.arange(n, device=device), "amin")
        self.first = first.clamp_(max=max(n - 1, 0))

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) rows into (S, width, ...), the padding repeating each segment's first row."""
        tail = x.shape[1:]
        if self.mask is None:
            return x.reshape((self.count, self.width) + tail)
        buf = x.index_select(0, self.first)[:, None].expand((self.count, self.width) + tail).contiguous()
        buf.view((-1,) + tail).index_copy_(0, self.slot, x)
        return buf

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """(S, width, ...) back to (N, ...) rows."""
        if self.slot is None:
            return x.reshape((-1,) + x.shape[2:])
        return x.reshape((-1,) + x.shape[2:]).index_select(0, self.slot)


def standardize(xh, xl, segs: Segments, eps: float, zero_mean=None):
    """(x - mean) / (std + eps) per segment and column, in dd, ddof 1, in the padded layout
    (S, width, K): the same shift-invariant two-pass as the float64 path (differences from
    the first member, exact as a dd), exact collapse (a constant segment column gives +0).
    ``zero_mean`` (S,) bool: segments whose exact mean is 0 (a unit of whole groups). ``xl``
    None: the values are float64 (a low part of 0). Returns z (dd) and, per segment and column,
    the dd denominator and whether it collapsed.

    z is dev times the denominator's dd reciprocal (one quotient per segment and column, not
    one per value): relative error at most 15u**2 + 7u**2 + a third-order term, below
    :data:`UNIT` as every single operation's."""
    mask = None if segs.mask is None else segs.mask[:, :, None]

    def slots(x, fill=0.0):  # the padding's slots set to fill (none in an equal layout)
        return x if mask is None else torch.where(mask, x, fill)

    if xl is None:  # x - x0 of two float64: exact as the dd (s, e) of TwoSum
        d = two_sum(xh, -xh[:, :1])
    else:
        d = add((xh, xl), neg((xh[:, :1], xl[:, :1])))
    if zero_mean is not None:
        zm = zero_mean[:, None, None]
        d = (torch.where(zm, xh, d[0]), torch.where(zm, 0.0 if xl is None else xl, d[1]))
    d = (slots(d[0]), slots(d[1]))
    n = segs.sizes[:, :, None]
    mean = div_f(tree_sum(d), n.expand_as(d[0][:, :1]))
    if zero_mean is not None:
        mean = (torch.where(zm, 0.0, mean[0]), torch.where(zm, 0.0, mean[1]))
    dev = add(d, neg(mean))
    dev = (slots(dev[0]), slots(dev[1]))
    m2 = tree_sum(mul(dev, dev))
    nm1 = torch.clamp(n - 1.0, min=1.0).expand_as(m2[0])
    sd = sqrt(div_f(m2, nm1))
    den = add_f(sd, torch.full_like(sd[0], eps))
    big = torch.finfo(_F64).max
    hi_v = slots(xh, -big).amax(1, keepdim=True)
    lo_v = slots(xh, big).amin(1, keepdim=True)
    collapsed = hi_v == lo_v
    if xl is not None:
        collapsed &= slots(xl, -big).amax(1, keepdim=True) == slots(xl, big).amin(1, keepdim=True)
    safe_den = (torch.where(collapsed | (den[0] == 0), 1.0, den[0]), torch.where(collapsed | (den[0] == 0), 0.0, den[1]))
    inv = div((torch.ones_like(safe_den[0]), torch.zeros_like(safe_den[1])), safe_den)
    z = mul(dev, inv)
    keep = ~collapsed if mask is None else ~collapsed & mask
    z = (torch.where(keep, z[0], 0.0), torch.where(keep, z[1], 0.0))
    return z, den, collapsed
