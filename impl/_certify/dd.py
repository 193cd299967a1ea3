"""Double-double arithmetic, and Eq. 4, 7 and 6 in it: the certificate's tier 2, and its
statistics across ranks.

A double-double (dd) is an unevaluated sum ``hi + lo`` of two float64, |lo| <= ulp(hi)/2: about
106 bits. Each operation is error-free transformations (Knuth's TwoSum, Dekker's TwoProduct: no
FMA, the same bits on every device) and a renormalisation, with a relative error of at most
3u**2 (sum), 7u**2 (product by a dd), 15u**2 (quotient), u = 2**-53 (Joldes, Muller, Popescu,
ACM TOMS 2017); :data:`UNIT` = 2**-100 is above each. Inputs must lie in the safe exponent range
(:func:`safe`: no split overflows, no error term underflows); outside it the certificate goes to
exact arithmetic (locally) or leaves the samples uncertified (across ranks).
"""

from __future__ import annotations

import math

import torch

from impl._segments import round_to
from impl._certify import bounds as B

_F64, _I64 = torch.float64, torch.int64

#: The unit roundoff assumed for every dd operation (above the proven 15 * 2**-106).
UNIT = 2.0 ** -100
_SPLIT = 134217729.0  # 2**27 + 1
#: Nonzero magnitudes of rewards, weights, eps and every intermediate stay within
#: [2**-SAFE, 2**SAFE] on this path (squares of deviations: 2**-2*SAFE-106 is normal).
SAFE = 300


def eps_safe(eps: float) -> bool:
    """eps is only added to a std (exact at any magnitude): up to 2**SAFE (above, a z could
    fall below the range)."""
    return 0.0 <= eps <= 2.0 ** SAFE


def safe(*tensors_or_floats) -> bool:
    """Are every nonzero magnitude among these within [2**-SAFE, 2**SAFE] and finite?"""
    lo, hi = 2.0 ** -SAFE, 2.0 ** SAFE
    for x in tensors_or_floats:
        if isinstance(x, torch.Tensor):
            a = x.abs()  # (NaN propagates through amax; the least nonzero is inf where all are 0)
            if x.numel() and not (float(a.amax()) <= hi and float(torch.where(a == 0, math.inf, a).amin()) >= lo):
                return False
        elif not (x == 0 or lo <= abs(float(x)) <= hi):
            return False
    return True


# --- error-free transformations, then dd operations (pairs of tensors) ------------------------

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
    return add_f(fast_two_sum(q1, q2), r[0] / y[0])


def div_f(x, b):
    return div(x, (b, torch.zeros_like(b) if isinstance(b, torch.Tensor) else 0.0 * x[0]))


def sqrt(x):
    """sqrt of a dd >= 0 (Newton step from the float64 root; 0 stays 0)."""
    s = torch.sqrt(x[0])
    safe_s = torch.where(s > 0, s, 1.0)
    r = add(x, neg(two_prod(safe_s, safe_s)))
    return where(s > 0, fast_two_sum(safe_s, r[0] / (2.0 * safe_s)))


def where(cond, x, fill=(0.0, 0.0)):
    """The dd ``x`` where ``cond``, else ``fill`` (a dd or a pair of scalars)."""
    return torch.where(cond, x[0], fill[0]), torch.where(cond, x[1], fill[1])


def tree_sum(x):
    """Pairwise dd sum along dim 1 (kept, length 1): adjacent pairs, level by level."""
    h, l = x
    while h.shape[1] > 1:
        if h.shape[1] % 2:
            z = torch.zeros_like(h[:, :1])
            h, l = torch.cat([h, z], 1), torch.cat([l, z], 1)
        h, l = add((h[:, 0::2], l[:, 0::2]), (h[:, 1::2], l[:, 1::2]))
    return h, l


# --- Eq. 4, 7 and 6 in dd on a padded segment layout ------------------------------------------


class Segments:
    """Rows gathered into a padded (S, width) layout by a segment index per row (any order);
    ``mask``: the slots that hold a row."""

    def __init__(self, seg: torch.Tensor, count: int):
        n, device = seg.shape[0], seg.device
        order = torch.argsort(seg, stable=True)
        sizes = torch.bincount(seg, minlength=count)
        starts = torch.cumsum(sizes, 0) - sizes
        s_sorted = seg.index_select(0, order)
        pos = torch.arange(n, dtype=_I64, device=device) - starts.index_select(0, s_sorted)
        self.width = max(int(sizes.max()) if n else 1, 1)
        self.count = count
        self.sizes = sizes.to(_F64)[:, None]
        self.slot = torch.empty(n, dtype=_I64, device=device)
        self.slot[order] = s_sorted * self.width + pos  # row -> slot
        self.mask = torch.zeros(count * self.width, dtype=torch.bool, device=device)
        self.mask[self.slot] = True
        self.mask = self.mask.view(count, self.width)
        first = torch.full((count,), n, dtype=_I64, device=device)
        first.scatter_reduce_(0, seg, torch.arange(n, dtype=_I64, device=device), "amin")
        self.first = first.clamp_(max=max(n - 1, 0))

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) rows into (S, width, ...), the padding repeating each segment's first row."""
        tail = x.shape[1:]
        buf = x.index_select(0, self.first)[:, None].expand((self.count, self.width) + tail).contiguous()
        buf.view((-1,) + tail).index_copy_(0, self.slot, x)
        return buf

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """(S, width, ...) back to (N, ...) rows."""
        return x.reshape((-1,) + x.shape[2:]).index_select(0, self.slot)


def standardize(x, segs: Segments, eps: float):
    """Eq. 4 in dd per segment and column of float64 ``x`` (S, width, K), ddof 1, as the float64
    path computes it (two-pass from the first member, exact collapse: a constant column gives +0):
    z (dd), and per segment and column the dd denominator and whether it collapsed. z is dev
    times the denominator's reciprocal: error 15u**2 + 7u**2 + third order, below :data:`UNIT`."""
    mask = segs.mask[:, :, None]
    d = where(mask, two_sum(x, -x[:, :1]))  # x - x0 of two float64: exact as the dd of TwoSum
    n = segs.sizes[:, :, None]
    mean = div_f(tree_sum(d), n.expand_as(d[0][:, :1]))
    dev = where(mask, add(d, neg(mean)))
    m2 = tree_sum(mul(dev, dev))
    nm1 = torch.clamp(n - 1.0, min=1.0).expand_as(m2[0])
    sd = sqrt(div_f(m2, nm1))
    den = add_f(sd, torch.full_like(sd[0], eps))
    big = torch.finfo(_F64).max
    collapsed = torch.where(mask, x, -big).amax(1, keepdim=True) == torch.where(mask, x, big).amin(1, keepdim=True)
    safe_den = where(~(collapsed | (den[0] == 0)), den, (1.0, 0.0))
    inv = div((torch.ones_like(safe_den[0]), torch.zeros_like(safe_den[1])), safe_den)
    return where(~collapsed & mask, mul(dev, inv)), den, collapsed


# --- the rounding test of a dd value ------------------------------------------------------------

_GROW = 1 + 2.0 ** -40


def _neighbours(y: torch.Tensor):
    """(pred, succ) of ``y`` in its own format, as float64 (beyond max: the next power of two,
    whose midpoint with max is where rounding overflows)."""
    inf = torch.full_like(y, math.inf)
    pred, succ = torch.nextafter(y, -inf).to(_F64), torch.nextafter(y, inf).to(_F64)
    top = 2.0 ** math.frexp(torch.finfo(y.dtype).max)[1]  # max + ulp(max)
    finite = torch.isfinite(y)
    return (torch.where(torch.isinf(pred) & finite, -top, pred),
            torch.where(torch.isinf(succ) & finite, top, succ))


def round_test(h: torch.Tensor, l: torch.Tensor, Bd: torch.Tensor, out_dtype):
    """(ok, y): y the rounding of the dd h + l to ``out_dtype``, ok where every value within ``Bd``
    of it rounds alike (float64: where y is within one ulp of each, faithful)."""
    exact_zero = (h == 0) & (l == 0) & (Bd == 0)
    if out_dtype == _F64:
        y = h + l
        r = (h - y) + l  # h - y is exact (y is h or a neighbour of it)
        gap = torch.minimum(y - torch.nextafter(y, torch.full_like(y, -math.inf)),
                            torch.nextafter(y, torch.full_like(y, math.inf)) - y)
        ok = r.abs() * (1 + 4 * B.U64) + Bd * _GROW + B.TAU < gap
        return ok | exact_zero, torch.where(exact_zero, 0.0, y)

    def check(y):
        pred, succ = _neighbours(y)
        y64 = y.to(_F64)
        # h - m is exact where they are within a factor 2 (Sterbenz), else off by u |h - m|;
        # each further operation rounds by u of its result: 4 u (|h - m| + |l|) covers them
        t_hi, t_lo = h - (y64 + succ) * 0.5, h - (y64 + pred) * 0.5
        Bb = Bd * _GROW + B.TAU
        ok = ((t_hi + l + (Bb + 4 * B.U64 * (t_hi.abs() + l.abs()))) < 0) & \
             ((t_lo + l - (Bb + 4 * B.U64 * (t_lo.abs() + l.abs()))) > 0)
        # an output zero carries the exact value's sign: certain only away from 0, or at an exact 0
        Bz = Bb + 4 * B.U64 * (h.abs() + l.abs())
        return ok & ((y64 != 0) | ((h + l - Bz) > 0) | ((h + l + Bz) < 0) | exact_zero)

    y = round_to(h, out_dtype)
    ok = check(y)
    if not bool(ok.all()) and bool((l != 0).any()):  # h on (or a step from) a midpoint: h + l may round across
        y2 = round_to(torch.where(l != 0, torch.nextafter(h, torch.where(l > 0, math.inf, -math.inf)), h), out_dtype)
        ok2 = check(y2) & ~ok
        y, ok = torch.where(ok2, y2, y), ok | ok2
    return ok, torch.where(exact_zero, torch.zeros_like(y), y)


# --- Eq. 6 in dd: each rank's statistics (:func:`table`), merged (:func:`merged`), applied (:func:`eq6`) --
def _unit_index(sizes: list[int], device) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(sizes), dtype=_I64, device=device),
                                   torch.tensor(sizes, dtype=_I64, device=device))


def combined(r: torch.Tensor, gid: torch.Tensor, G: int, weights: list[float], eps: float):
    """Eq. 4 and 7 of every row in dd, grouped by ``gid``: (ch, cl, E), E each row's error bound;
    None outside the safe range (inputs, or combined values: a huge eps over a tiny std)."""
    r = r.to(_F64)
    if not (safe(r, *weights) and eps_safe(eps)):
        return None
    k = r.shape[1]
    segs = Segments(gid, G)
    z, _, collapsed = standardize(segs.gather(r), segs, eps)
    zh, zl = segs.rows(z[0]), segs.rows(z[1])
    ch = cl = None
    for j, w in enumerate(weights):
        term = mul_f((zh[:, j], zl[:, j]), torch.full_like(zh[:, j], w))
        ch, cl = term if ch is None else add((ch, cl), term)
    if not safe(ch):
        return None
    E = B.eq47_worst(UNIT, zh.abs(), segs.sizes.view(-1).index_select(0, gid), weights)
    return ch, cl, torch.where(collapsed.view(G, k).all(1).index_select(0, gid), 0.0, E)


#: Across ranks the dd statistics ride in collective 2 (a local call is one rank), per unit and rank:
#: count, shift, sum of (c - shift) (dd), sum of its squares (dd), max E, "this part is not whole
#: groups", min and max of c
DDC = 10


def values(v: torch.Tensor, eps: float):
    """Eq. 6's input (ch, cl, E) of ``whiten``'s values, exact (None outside the dd path's range)."""
    v64 = v.to(_F64)
    return (v64, torch.zeros_like(v64), torch.zeros_like(v64)) if safe(v64) and eps_safe(eps) else None


def rows(inp, eps: float):
    """This rank's combined values in dd and their bounds (ch, cl, E), or None outside the range."""
    if inp.n == 0:
        z = inp.rewards.new_zeros(0, dtype=_F64)
        return z, z, z
    if inp.labels is None:
        gid, G = torch.arange(inp.n, dtype=_I64, device=inp.rewards.device) // inp.group_size, inp.n // inp.group_size
    else:
        uniq, gid = torch.unique(inp.labels, return_inverse=True)
        gid, G = gid.view(-1), uniq.numel()
    return combined(inp.rewards, gid, G, inp.weights, eps)


def table(ch, cl, E, sizes: list[int], whole) -> torch.Tensor:
    """(S, DDC) float64: this rank's part of every unit (see :data:`DDC`)."""
    device, S = ch.device, len(sizes)
    empty = unsafe_table(sizes, device, unsafe=False)
    if ch.shape[0] == 0:
        return empty
    unit = _unit_index(sizes, device)
    wt = torch.zeros(S, dtype=torch.bool, device=device) if whole is None else \
        torch.as_tensor(whole, dtype=torch.bool, device=device).reshape(S)  # a host tuple or an (S,) tensor
    segs = Segments(unit, S)
    shift = torch.where(wt, 0.0, ch.index_select(0, segs.first))
    d = add_f((ch, cl), -shift.index_select(0, unit))
    Dh = segs.gather(torch.stack([d[0], d[1]], 1))
    D = where(segs.mask[:, :, None], (Dh[:, :, :1], Dh[:, :, 1:]))
    s1, q = tree_sum(D), tree_sum(mul(D, D))
    T = torch.bincount(unit, minlength=S).to(_F64)

    def per_unit(x, init, how):
        return torch.full((S,), init, dtype=_F64, device=device).scatter_reduce_(0, unit, x, how)

    out = torch.stack([T, shift, s1[0].view(S), s1[1].view(S), q[0].view(S), q[1].view(S), per_unit(E, 0.0, "amax"),
                       (~wt).to(_F64), per_unit(ch, math.inf, "amin"), per_unit(ch, -math.inf, "amax")], 1)
    return torch.where((T > 0)[:, None], out, empty)


def merged(tables: torch.Tensor, eps: float):
    """Per unit (T, mean (dd), den (dd), whole, Emax, cmin, cmax) from every rank's :func:`table`
    (W, S, DDC), merged in rank order: the same on every rank."""
    W, S, _ = tables.shape
    n = tables[..., 0]
    T = n.sum(0)
    whole = tables[..., 7].sum(0) == 0
    tot = (torch.zeros(S, dtype=_F64, device=tables.device),) * 2
    for r in range(W):  # the sum of every value: n shift + s1 per rank
        tot = add(tot, add(add_f((tables[r, :, 2], tables[r, :, 3]), 0.0), two_prod(n[r], tables[r, :, 1])))
    mean = where(~whole, div_f(tot, torch.where(T > 0, T, 1.0)))
    m2 = (torch.zeros(S, dtype=_F64, device=tables.device),) * 2
    for r in range(W):
        s1, q = (tables[r, :, 2], tables[r, :, 3]), (tables[r, :, 4], tables[r, :, 5])
        delta = add_f(neg(mean), tables[r, :, 1])  # shift_r - mean
        t1 = mul(mul_f(delta, torch.full_like(n[r], 2.0)), s1)
        m2 = add(m2, where(n[r] > 0, add(q, add(t1, mul_f(mul(delta, delta), n[r])))))
    m2 = (m2[0].clamp(min=0), torch.where(m2[0] > 0, m2[1], 0.0))
    sd = sqrt(div_f(m2, torch.clamp(T - 1.0, min=1.0)))
    den = add_f(sd, torch.full_like(sd[0], eps))
    return T, mean, den, whole, tables[..., 6].amax(0), tables[..., 8].amin(0), tables[..., 9].amax(0)


def eq6(merged, ch, cl, E, sizes: list[int], eps: float):
    """Eq. 6 in dd of this rank's rows from the merged statistics: (h, l, Bd), Bd the bound on
    |h + l - a*| (0 where a* is exactly 0)."""
    T, mean, den, whole, Emax, cmin, cmax = merged
    unit = _unit_index(sizes, ch.device)
    flat = (cmin == cmax) & (Emax == 0) & (T > 0)
    Dsafe = where(~(flat | (den[0] == 0)), den, (1.0, 0.0))
    per_row = [t.index_select(0, unit) for t in (*mean, *Dsafe)]
    fu = flat.index_select(0, unit)
    h, l = where(~fu, div(add((ch, cl), neg(per_row[:2])), per_row[2:]))
    D = torch.where(flat, torch.full_like(den[0], eps), den[0]) * (1 - 2.0 ** -60)
    R = torch.where(D > 0, (cmax - cmin) / D, math.inf) * (1 + 2.0 ** -30) + 2 * Emax / D
    R = torch.where(torch.isnan(R), math.inf, R)
    Bd = B.eq6_worst(UNIT, h, *(t.index_select(0, unit) for t in (D, T, whole)), E,
                     *(t.index_select(0, unit) for t in (R, Emax)), eps)
    exact0 = fu | ((ch == 0) & (cl == 0) & (E == 0) & whole.index_select(0, unit))
    return h, l, torch.where(exact0, 0.0, Bd)


def finish(merged, ch, cl, E, sizes: list[int], eps: float, out_dtype, counts: dict,
           plain: torch.Tensor) -> torch.Tensor:
    """This rank's outputs from the merged statistics: certified where the bound allows, else
    ``plain`` (float64) rounded once, counted uncertified."""
    if ch.shape[0] == 0:
        return torch.empty(0, dtype=out_dtype, device=ch.device)
    ok, y = round_test(*eq6(merged, ch, cl, E, sizes, eps), out_dtype)
    counts["double_double"] += int(ok.sum())
    bad = ~ok
    if bool(bad.any()):
        counts["uncertified"] += int(bad.sum())
        y = torch.where(bad, round_to(plain, out_dtype), y)
    return y


def unsafe_table(sizes: list[int], device, unsafe: bool = True) -> torch.Tensor:
    """The parts of a rank outside the safe range: E = inf, so no sample of its units is certified
    on any rank; not ``unsafe``: the parts of a rank holding no row of them."""
    row = (0.0,) * 6 + ((math.inf, 1.0) if unsafe else (0.0, 0.0)) + (math.inf, -math.inf)
    return torch.tensor(row, dtype=_F64, device=device).repeat(len(sizes), 1)
