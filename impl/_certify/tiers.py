"""The certificate's tiers, in the order the driver runs them (``impl._certify.TIERS``).

Each is ``y, left = tier(ctx, y, left)``: the context (``impl._certify.Context``), the outputs
so far ``y`` (this call's own tensor in the output dtype) and the rows still to decide
(ascending int64 indices; None before the first tier: every row). A tier writes the rows it
decides into ``y`` and returns the rows it leaves.
"""

from __future__ import annotations

import bisect
import itertools
import math
import struct

import numpy as np
import torch

from impl._segments import constant, round_to, to_device
from impl._certify import bounds as B
from impl._certify import dd, exact as X
from impl._certify.dd import round_test

_F64, _I64 = torch.float64, torch.int64
#: output formats: half the spacing of their subnormals (the rounding interval of 0)
_ZERO = {torch.float32: 2.0 ** -150, torch.float16: 2.0 ** -25, torch.bfloat16: 2.0 ** -134}
_NAME = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", _F64: "float64"}
_GROW = 1 + 2.0 ** -40
#: at most this many rows per call go row by row to the group-exact tier (beyond, double-double)
ROWS_MAX = 256


def indices(mask: torch.Tensor) -> torch.Tensor:
    """The indices (int64, ascending) where the 1-D bool ``mask`` is true. On CPU through NumPy:
    torch's nonzero costs about 14 times as much on 65,536 rows (measured), where the rows sought
    are few."""
    if mask.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(mask.numpy()))
    return mask.nonzero().view(-1)


# --- the rounding tests -------------------------------------------------------------------------


def bits_test(a: torch.Tensor, y: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, out_dtype):
    """Tier 0's test: ok where every value within B = alpha + beta |a| of a rounds as a does, y
    being a rounded to ``out_dtype``; None where every row passes. ``alpha``, ``beta``: per row,
    or (S, 1) against a and y viewed (S, T).

    In a's binade [2**e, 2**(e+1)) the output format (m mantissa bits) has cells 2**(e - m)
    wide: h = 2**(e - m - 1) is half a cell, and p2 = 2**e is read from a's exponent bits (0 for
    a float64 zero or subnormal: never certified). r = a - y is exact (Sterbenz). The midpoint on
    r's side of y is h - |r| from a; on the other side h + |r|, except below y = 2**k with a at or
    above it, where the cell is half as wide: h/2 + |r|. Below the output's normal range the
    cells are wider than h says, and an output 0 (|r| = |a| > h) never passes. So a is certified
    where h - |r| > B and h/2 > B; with |a| < 2 p2 it suffices that

        p2 (2**-(m+1) - 2 beta) - |r| > alpha   and   p2 (2**-(m+2) - 2 beta) > alpha,

    tested as v = p2 - s |r| > A and p2 > P, s and P rounded up (2**-40 margins, which the test's
    own three roundings cannot use up). As v <= p2, v > max(A, P) implies both: one minimum
    decides the common case (every row certified; on CPU only: on CUDA it would be a host read of
    its own, and the verdict's one read follows anyway). A NaN fails the test."""
    h = 2.0 ** -(B.NARROW[out_dtype][0] + 1)
    k1, k2 = (h - 2 * beta) / _GROW, (h / 2 - 2 * beta) / _GROW  # lower bounds of the two factors of p2
    s = torch.where(k1 > 0, _GROW / k1, math.inf)
    A, P = alpha * s * _GROW, torch.where(k2 > 0, alpha / k2 * _GROW, math.inf)
    r = torch.sub(a, y).abs_()
    p2 = torch.bitwise_and(a.view(_I64), 0x7FF0000000000000).view(_F64)
    v = torch.sub(p2, torch.mul(r, s, out=r), out=r)  # two roundings, on any CPU
    if a.dim() == 2 and a.device.type == "cpu" and bool((v.amin(1, keepdim=True) > torch.maximum(A, P)).all()):
        return None
    return (v > A) & (p2 > P)


# --- what the tiers derive from the context (kept in ctx.memo) ----------------------------------


def unit_of(ctx, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Each row's unit (int64), of ``rows`` (None: every row)."""
    if rows is None:
        if "unit" not in ctx.memo:
            sizes = constant(tuple(ctx.sizes), _I64, ctx.a.device)
            units = torch.arange(len(ctx.sizes), dtype=_I64, device=ctx.a.device)
            ctx.memo["unit"] = torch.repeat_interleave(units, sizes, output_size=ctx.a.shape[0])
        return ctx.memo["unit"]
    ends = torch.tensor(ctx.sizes, dtype=_I64, device="cpu").cumsum(0).to(rows.device)
    return torch.searchsorted(ends, rows, right=True)


def groups(ctx) -> tuple[torch.Tensor, int]:
    """(gid, G): each row's group (0..G-1; labelled groups in label order) and the group count."""
    if "groups" not in ctx.memo:
        inp, n = ctx.inp, ctx.a.shape[0]
        if inp.labels is None:
            g = inp.group_size
            got = torch.arange(n, dtype=_I64, device=ctx.a.device) // g, n // g
        else:  # phase one's sort of the labels (the plan keeps it where it certifies): sorted row -> input row
            perm, sgid, _ = ctx.sort
            got = torch.empty_like(sgid).scatter_(0, perm, sgid), int(sgid[-1]) + 1
        ctx.memo["groups"] = got
    return ctx.memo["groups"]


def group_rows(ctx, rows: torch.Tensor):
    """The groups of ``rows`` (ascending): (mem, mg, inv, at): every row of those groups (grouped,
    ascending within each), each one's group (0..U-1), each of ``rows``' group and its place in
    ``mem``. Contiguous groups from the rows' numbers alone; labelled ones from each row's group."""
    inp = ctx.inp
    if inp.labels is None:
        g = inp.group_size
        ug, inv = torch.unique(torch.div(rows, g, rounding_mode="floor"), return_inverse=True)
        mem = (ug[:, None] * g + torch.arange(g, dtype=_I64, device=rows.device)).view(-1)
        mg = torch.arange(ug.numel(), dtype=_I64, device=rows.device).repeat_interleave(g)
        return mem, mg, inv, inv * g + rows % g
    gid, G = groups(ctx)
    ug, inv = torch.unique(gid.index_select(0, rows), return_inverse=True)
    sel = torch.zeros(G, dtype=torch.bool, device=gid.device).index_fill_(0, ug, True)
    mem = sel.index_select(0, gid).nonzero().view(-1)  # ascending
    pos = torch.searchsorted(mem, rows)
    mg = torch.searchsorted(ug, gid.index_select(0, mem))
    order = torch.argsort(mg, stable=True)  # grouped, ascending within each group
    return mem.index_select(0, order), mg.index_select(0, order), inv, torch.argsort(order).index_select(0, pos)


def flat_rows(ctx) -> torch.Tensor:
    """(N,) bool: the row's group has every reward column constant (z = 0 exactly, c = +0: E = 0)."""
    r = ctx.inp.rewards
    n, k = r.shape
    if ctx.inp.labels is None:
        v = r.view(n // ctx.inp.group_size, -1, k)
        return (v.amax(1) == v.amin(1)).all(1).repeat_interleave(ctx.inp.group_size)
    gid, G = groups(ctx)
    idx = gid[:, None].expand(n, k)
    hi = torch.full((G, k), -math.inf, dtype=r.dtype, device=r.device).scatter_reduce_(0, idx, r, "amax")
    lo = torch.full((G, k), math.inf, dtype=r.dtype, device=r.device).scatter_reduce_(0, idx, r, "amin")
    return (hi == lo).all(1).index_select(0, gid)


def magnitudes(ctx) -> tuple[float, float]:
    """The rewards' smallest nonzero magnitude (inf where every reward is 0) and their largest, for
    rewards in a narrow format; (inf, 0) for others (whose sums are never taken as exact). One
    pass where no reward is 0; else the smallest nonzero one on the bits (:func:`_nonzero_bits`).
    On CUDA the numbers come with the Eq. 6 table, in the certificate's one read (``memo``)."""
    r = ctx.inp.rewards
    if r.dtype not in B.NARROW:
        return math.inf, 0.0
    read = ctx.memo.get("magnitudes")
    if read is None:
        m = r.abs()
        small, large = torch.stack(torch.aminmax(m)).tolist()
    else:
        small, large, lo = read
    if small == 0:
        idt = _BITS[r.dtype]
        lo = int(_nonzero_bits(m) if read is None else lo)
        small = math.inf if lo == torch.iinfo(idt).max else \
            torch.tensor([lo + 1], dtype=idt, device="cpu").view(r.dtype).item()
    return small, large


_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _nonzero_bits(m: torch.Tensor) -> torch.Tensor:
    """The bits of the smallest nonzero value of ``m`` (magnitudes, overwritten) less one: |x|
    orders as its bits without the sign, and a zero wraps to the top (no nonzero: the top)."""
    idt = _BITS[m.dtype]
    return m.view(idt).sub_(1).bitwise_and_(torch.iinfo(idt).max).amin()


def magnitude_reads(r: torch.Tensor) -> torch.Tensor:
    """What :func:`magnitudes` reads of narrow rewards ``r``, on their device ((3,) float64: the
    smallest magnitude, the largest, :func:`_nonzero_bits`), to be read with the Eq. 6 table."""
    m = r.abs()
    ends = torch.stack(torch.aminmax(m)).to(_F64)  # as the direct read takes them
    return torch.cat([ends, _nonzero_bits(m).reshape(1).to(_F64)])


def varied(ctx) -> np.ndarray:
    """(S,) bool: does the unit hold a row of a group that is not constant in every column (E > 0
    there)? Where its c vary, some row's does; only units whose c are all equal read the rows."""
    out = ctx.table[:, 5] != ctx.table[:, 6]
    if ctx.inp is None or out.all():
        return out
    live = (~flat_rows(ctx)).to(torch.int64)
    per_unit = torch.zeros(len(ctx.sizes), dtype=torch.int64, device=live.device).index_add_(0, unit_of(ctx), live)
    return out | (per_unit > 0).cpu().numpy()


def _own(y: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """y, never the caller's a (the tiers write into y; float64 outputs are a itself)."""
    return y.clone() if y.data_ptr() == a.data_ptr() else y


# --- the tiers ----------------------------------------------------------------------------------


def float64(ctx, y: torch.Tensor, left):
    """Tier 0: the rows whose interval [a - B, a + B] (``bounds.eq6_units``) holds no rounding
    boundary of the output format; outputs that round to 0 are certified where the interval lies
    on one side of 0 within the rounding interval of 0, or where the unit is exactly collapsed."""
    a, out_dtype, S = ctx.a, ctx.out_dtype, len(ctx.sizes)
    some, (small, large) = varied(ctx), magnitudes(ctx) if ctx.inp is not None else (math.inf, 0.0)
    e, erms = 0.0, 0.0  # whiten: the values are c, exact
    if ctx.inp is not None:  # |c - c*| <= e on every row but those of constant groups (E = 0), rms erms
        exact = B.exact_sums(ctx.inp.rewards.dtype, small, large, ctx.n_max)
        e, erms = B.eq47_rows(ctx.n_max, tuple(ctx.inp.weights), exact)
    u = ctx.units = B.eq6_units(ctx.table, ctx.eps, ctx.whole, np.where(some, e, 0.0), erms)  # (E's largest)
    alpha, beta, exact0 = to_device(torch.from_numpy(np.stack([u.alpha, u.beta, u.exact0])), a.device)
    exact0 = exact0 != 0
    if out_dtype == _F64:
        unit = unit_of(ctx)
        Bd = torch.where(exact0.index_select(0, unit), 0.0,
                         alpha.index_select(0, unit) + beta.index_select(0, unit) * a.abs())
        ok, y1 = round_test(a, torch.zeros_like(a), Bd, _F64)
        return _own(y, a).copy_(y1), indices(~ok)
    if all(s == ctx.sizes[0] for s in ctx.sizes):
        ok = bits_test(a.view(S, -1), y.view(S, -1), alpha[:, None], beta[:, None], out_dtype)
    else:
        unit = unit_of(ctx)
        ok = bits_test(a, y, alpha.index_select(0, unit), beta.index_select(0, unit), out_dtype)
    if ok is None:
        return y, a.new_empty(0, dtype=_I64)
    left = indices(~ok.view(-1))
    zero = indices(y.index_select(0, left) == 0) if left.numel() else left  # their places among the rows left
    if zero.numel():
        rows = left.index_select(0, zero)
        ar, unit = a.index_select(0, rows), unit_of(ctx, rows)
        ab = (alpha.index_select(0, unit) + beta.index_select(0, unit) * ar.abs()) * _GROW
        sure = (ar.abs() > ab) & (ar.abs() + ab < _ZERO[out_dtype])  # a zero of a's sign
        collapsed = exact0.index_select(0, unit) & (ar == 0)  # c exact, equal: a = +0
        y.index_fill_(0, rows[collapsed], 0.0)
        keep = torch.ones(left.shape, dtype=torch.bool, device=a.device).index_fill_(0, zero[sure | collapsed], False)
        left = left[keep]
    return y, left


def group_exact(ctx, y: torch.Tensor, left: torch.Tensor):
    """Tier 1: the rows' own groups in exact integer arithmetic. Up to :data:`ROWS_MAX` rows (narrow
    outputs) one by one on the host: their exact c* whitened in interval arithmetic, an exact zero
    (c* = 0 in a unit of whole groups: a* = +0, the unit's exact mean being 0) included. More rows,
    or float64 outputs: first the exact zeros among them, vectorized (0/1 rewards leave many)."""
    y = _own(y, ctx.a)
    u = ctx.units
    if ctx.inp is not None and u.whole.any() and (ctx.out_dtype == _F64 or left.numel() > ROWS_MAX):
        unit = unit_of(ctx, left)
        reach, whole = to_device(torch.from_numpy(np.stack([B.zero_reach(u.alpha, u.beta), u.whole])), left.device)
        whole = whole != 0
        near = ctx.a.index_select(0, left).abs() <= reach.index_select(0, unit)
        cand = indices(whole.index_select(0, unit) & near)  # places among the rows left
        if cand.numel():
            rows = left.index_select(0, cand)
            mem, mg, inv, at = group_rows(ctx, rows)
            ok = X.zero_rows(ctx.inp.rewards.index_select(0, mem), mg, inv, at, ctx.inp.weights)
            y.index_fill_(0, rows[ok], 0.0)
            left = left[torch.ones(left.shape, dtype=torch.bool, device=left.device).index_fill_(0, cand[ok], False)]
    if ctx.out_dtype != _F64 and 0 < left.numel() <= ROWS_MAX:
        left = _rows(ctx, y, left)
    return y, left


def _rows(ctx, y: torch.Tensor, left: torch.Tensor) -> torch.Tensor:
    """The rows ``left`` with their exact c* (from their groups; whiten: the values themselves)
    whitened by their unit's numbers in interval arithmetic (:func:`interval`), on the host (a few
    rows: Python's numbers cost less than many small tensors); those whose interval rounds to one
    output are written into y. Returns the rows still left."""
    u, rows = ctx.units, left.tolist()
    ends = list(itertools.accumulate(ctx.sizes))
    cols = ("alpha", "flat", "whole", "f", "shift", "mean", "dmean", "den", "dD", "eps_f")
    table = [getattr(u, k).tolist() for k in cols]
    done, vals, kept = [], [], []
    for row, (lo, hi, zero) in zip(rows, _exact_c(ctx, rows)):
        alpha, flat, whole, *un = (col[bisect.bisect_right(ends, row)] for col in table)
        if zero and whole:  # a* = +0 exactly, whatever the bounds
            got = 0.0
        elif not math.isfinite(alpha) or flat:
            got = None
        else:
            got = interval(lo, hi, un, whole, ctx.out_dtype)
        if got is None:
            kept.append(row)
        else:
            done.append(row)
            vals.append(got)
    if done:
        at = torch.tensor(done, dtype=_I64, device="cpu").to(y.device)
        y.index_copy_(0, at, torch.tensor(vals, dtype=_F64, device="cpu").to(y.device, y.dtype))
    return left if not done else torch.tensor(kept, dtype=_I64, device="cpu").to(left.device)


def _exact_c(ctx, rows: list[int]) -> list[tuple]:
    """(lo, hi, zero) of each row's c* (``exact.combined``, from its group; whiten: the value)."""
    from fractions import Fraction  # (not at import: impl's import stays light)
    if ctx.inp is None:
        at = torch.tensor(rows, dtype=_I64, device=ctx.c.device)
        return [(Fraction(v), Fraction(v), False) for v in ctx.c.index_select(0, at).tolist()]
    if ctx.inp.labels is None:  # contiguous groups: each row's group from its number alone
        g = ctx.inp.group_size
        first = sorted({row - row % g for row in rows})
        mem = torch.tensor([q + j for q in first for j in range(g)], dtype=_I64, device="cpu")
        start = {q: i * g for i, q in enumerate(first)}
        groups_at = [(start[row - row % g], g, row % g) for row in rows]
    else:
        mem, mg, inv, at = group_rows(ctx, torch.tensor(rows, dtype=_I64, device=ctx.a.device))
        size = torch.bincount(mg).tolist()
        starts = [0, *itertools.accumulate(size)]  # each group's first place in mem (grouped, in order)
        groups_at = [(starts[q], size[q], p - starts[q]) for q, p in zip(inv.tolist(), at.tolist())]
    vals = ctx.inp.rewards.index_select(0, mem.to(ctx.inp.rewards.device)).to("cpu", _F64).tolist()
    asked: dict[int, list[int]] = {}  # a group's first place in mem -> the rows asked for (places in ``rows``)
    for j, (s, _, _) in enumerate(groups_at):
        asked.setdefault(s, []).append(j)
    out = [None] * len(rows)
    for s, js in asked.items():
        n = groups_at[js[0]][1]
        got = X.combined(vals[s:s + n], list(ctx.inp.weights), ctx.eps, [groups_at[j][2] for j in js])
        for j, res in zip(js, got):
            out[j] = res
    return out


def interval(lo, hi, un: list, whole: bool, out_dtype) -> float | None:
    """a* = (c* f - M*) / D* for c* in [lo, hi], |M* - M| <= dmean (M = shift + mean exactly; 0
    for a whole unit), |D* - den| <= dD, D* >= eps f (``un``: f, shift, mean, dmean, den, dD,
    eps_f): its correct rounding to ``out_dtype`` where both ends of the interval round to one
    output, sign included, else None. First in float64 rounded outward (many times cheaper),
    then in exact rationals where that leaves a boundary inside."""
    got = interval_float(lo, hi, un, whole, out_dtype)
    return got if got is not None else interval_exact(lo, hi, un, whole, out_dtype)


def _down(x: float) -> float:
    return math.nextafter(x, -math.inf)


def _up(x: float) -> float:
    return math.nextafter(x, math.inf)


def interval_float(lo, hi, un: list, whole: bool, out_dtype) -> float | None:
    """:func:`interval` in float64, every operation rounded outward (a step of one float to each
    side after each round-to-nearest result): where both ends round to one output, the value the
    exact interval would give (a* lies inside; the correct rounding is unique)."""
    f, shift, mean, dmean, den, dD, eps_f = un
    clo, chi = _down(float(lo)), _up(float(hi))  # float(Fraction): correctly rounded
    m = shift + mean
    mlo, mhi = (0.0, 0.0) if whole else (_down(_down(m) - dmean), _up(_up(m) + dmean))
    nlo, nhi = _down(_down(clo * f) - mhi), _up(_up(chi * f) - mlo)
    dlo, dhi = max(_down(den - dD), eps_f), _up(den + dD)
    if not (dlo > 0 and math.isfinite(dhi) and math.isfinite(nlo) and math.isfinite(nhi)):
        return None
    return _same_rounding(_down(nlo / dhi) if nlo >= 0 else _down(nlo / dlo),
                          _up(nhi / dlo) if nhi >= 0 else _up(nhi / dhi), out_dtype)


def interval_exact(lo, hi, un: list, whole: bool, out_dtype) -> float | None:
    """:func:`interval` in exact rational arithmetic (``lo``, ``hi``: Fractions)."""
    from fractions import Fraction
    f, shift, mean, dmean, den, dD, eps_f = (Fraction(x) for x in un)
    M = Fraction(0) if whole else shift + mean
    nlo, nhi = lo * f - (M + dmean), hi * f - (M - dmean)
    dlo, dhi = max(den - dD, eps_f), den + dD
    if dlo <= 0:
        return None
    return _same_rounding(nlo / dhi if nlo >= 0 else nlo / dlo, nhi / dlo if nhi >= 0 else nhi / dhi, out_dtype)


def _same_rounding(lo, hi, out_dtype) -> float | None:
    """The rounding of both ends (floats or Fractions) to ``out_dtype`` where they agree, sign
    included; else None."""
    from fractions import Fraction

    from oracle.exact import round_fraction  # (exact arithmetic: where the fast path leaves a row)
    code = {torch.float32: "f", torch.float16: "e"}.get(out_dtype)
    try:
        if code is None or isinstance(lo, Fraction):  # bfloat16 has no host format; Fractions: exact
            ylo, yhi = (round_fraction(Fraction(x), _NAME[out_dtype]) for x in (lo, hi))
        else:  # the host's IEEE conversion: round to nearest, ties to even
            ylo, yhi = (struct.unpack(code, struct.pack(code, x))[0] for x in (lo, hi))
    except OverflowError:  # beyond the format's overflow midpoint: the rationals decide
        return None
    return ylo if ylo == yhi and math.copysign(1.0, ylo) == math.copysign(1.0, yhi) else None


def double_double(ctx, y: torch.Tensor, left: torch.Tensor):
    """Tier 2: Eq. 4, 7 and 6 of the whole call again in double-double (its units' statistics need
    every row), the rows left tested against their dd bound."""
    if ctx.inp is None:
        rows = dd.values(ctx.c, ctx.eps)
    else:
        rows = dd.combined(ctx.inp.rewards, *groups(ctx), ctx.inp.weights, ctx.eps)
    if rows is None:  # outside the dd path's range
        return y, left
    whole = None if ctx.inp is None else ctx.units.whole.tolist()
    got = dd.eq6(dd.merged(dd.table(*rows, ctx.sizes, whole)[None], ctx.eps), *rows, ctx.sizes, ctx.eps)
    ok, y1 = round_test(*(t.index_select(0, left) for t in got), ctx.out_dtype)
    y = _own(y, ctx.a)
    y.index_copy_(0, left[ok], y1[ok])
    return y, left[~ok]


def exact(ctx, y: torch.Tensor, left: torch.Tensor):
    """Tier 3: the exact advantages, correctly rounded (``oracle.gdpo``) on this process's rows."""
    from oracle import gdpo as og  # (exact arithmetic: only where every faster tier left a row)
    name = _NAME[ctx.out_dtype]
    if ctx.inp is None:
        res = og.whiten(ctx.c.detach().cpu().numpy(), segment_sizes=list(ctx.sizes), eps=ctx.eps)
    else:
        inp = ctx.inp
        labels = None if inp.labels is None else inp.labels.detach().cpu().numpy()
        res = og.gdpo_advantages(inp.rewards.detach().to("cpu", _F64).numpy(), group_ids=labels,
                                 weights=list(inp.weights), eps=ctx.eps,
                                 group_size=inp.group_size if labels is None else None,
                                 segment_sizes=list(ctx.sizes), missing=inp.missing)
    want = torch.from_numpy(np.ascontiguousarray(res.rounded(name), dtype=np.float64)).to(y.device)
    y = _own(y, ctx.a)
    y.index_copy_(0, left, round_to(want.index_select(0, left), ctx.out_dtype))
    return y, left[:0]
