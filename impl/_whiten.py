"""Eq. 6, batch whitening per unit: local statistics, Chan merge, application.

Each rank summarises each of its S units in one row of a (S, 7) float64 table

    count, e, shift, mean_d, M2, min, max

where the unit's values v are scaled by 2**-e (|v| < 2**e, exact), ``shift``
is the first scaled value of the unit on this rank, ``mean_d`` the mean of the
differences d = v*2**-e - shift and ``M2`` the sum of squared deviations of d
from mean_d (two-pass). ``min``/``max`` are the raw values (exact collapse test).

The merge rescales every rank's row to the unit's global exponent E (exact
powers of two), re-expresses each rank's mean relative to the first non-empty
rank's shift, and combines ranks along a fixed pairwise tree with Chan's
formula. The merge is a pure function of the gathered table, so every rank
computes bitwise-identical statistics; with one rank it reduces to the local
two-pass (mean relative to the local shift is mean_d exactly).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from impl import _segments as seg_ops

_F64 = torch.float64
_I64 = torch.int64
COLS = 7
_N, _E, _SHIFT, _MEAN, _M2, _MIN, _MAX = range(COLS)


def host_to_device(values: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list on ``device`` without a host synchronisation (pinned,
    non-blocking copy on CUDA)."""
    return seg_ops.to_device(torch.tensor(values, dtype=dtype), device)


@dataclasses.dataclass
class Local:
    table: torch.Tensor  # (S, 7) float64
    unit: torch.Tensor  # (N,) int64 unit index of every row


def local_table(v: torch.Tensor, sizes: list[int], eps: float) -> Local:
    """This rank's (S, 7) summary of float64 values ``v`` cut into ``sizes``."""
    device = v.device
    rows = v.shape[0]
    sizes_dev = host_to_device(sizes, _I64, device)
    seg, unit = seg_ops.segments_from_sizes(sizes_dev, rows, max(sizes, default=0))
    empty = torch.zeros(COLS, dtype=_F64, device=device)
    empty[_MIN: _MIN + 1].fill_(math.inf)  # fill_ on a view: a kernel, not a host copy
    empty[_MAX: _MAX + 1].fill_(-math.inf)
    if rows == 0:
        return Local(empty.expand(len(sizes), COLS).clone(), unit)
    e = seg_ops.exponent(seg_ops.reduce(v.abs(), seg, torch.maximum), eps)
    vs = seg_ops.ldexp(v, -e)
    shift = vs[seg.start]
    d = vs - shift
    n = seg.length.to(_F64)
    mean_d = seg_ops.reduce(d, seg, torch.add) / n
    dev = d - mean_d
    m2 = seg_ops.reduce(dev * dev, seg, torch.add)
    lo = seg_ops.reduce(v, seg, torch.minimum)
    hi = seg_ops.reduce(v, seg, torch.maximum)
    per_row = torch.stack([n, e.to(_F64), shift, mean_d, m2, lo, hi], dim=1)
    first = (torch.cumsum(sizes_dev, 0) - sizes_dev).clamp(max=rows - 1)
    table = torch.where((sizes_dev > 0)[:, None], per_row[first], empty)
    return Local(table, unit)


@dataclasses.dataclass
class Stats:
    """Global statistics of every unit, (S,) each, identical on every rank."""

    n: torch.Tensor  # float64 sample count
    e: torch.Tensor  # int64 scale exponent: the unit's values are < 2**e in magnitude
    shift: torch.Tensor  # scaled value every deviation is taken from
    mean: torch.Tensor  # mean of (v * 2**-e - shift)
    m2: torch.Tensor  # sum of squared deviations, scaled by 2**-2e
    lo: torch.Tensor  # raw minimum
    hi: torch.Tensor  # raw maximum

    def as_table(self) -> torch.Tensor:
        return torch.stack([self.n, self.e.to(_F64), self.shift, self.mean, self.m2, self.lo, self.hi], 1)


def merge(tables: torch.Tensor) -> Stats:
    """Combine a (W, S, 7) table of per-rank summaries, ranks in order 0..W-1."""
    n = tables[..., _N]
    has = n > 0
    e = tables[..., _E].to(_I64)
    big = torch.full_like(e, -(1 << 20))
    top = torch.where(has, e, big).amax(0)
    top = torch.where(top == -(1 << 20), torch.zeros_like(top), top)
    k = torch.where(has, e - top, torch.zeros_like(e))  # <= 0: rescale to the global exponent
    shift = seg_ops.ldexp(tables[..., _SHIFT], k)
    mean_d = seg_ops.ldexp(tables[..., _MEAN], k)
    m2 = seg_ops.ldexp(seg_ops.ldexp(tables[..., _M2], k), k)
    first = torch.argmax(has.to(torch.int8), 0)  # first rank holding the unit
    shift_g = shift.gather(0, first[None]).squeeze(0)
    zero = torch.zeros_like(mean_d)
    mean = torch.where(has, (shift - shift_g) + mean_d, zero)
    m2 = torch.where(has, m2, zero)
    while n.shape[0] > 1:
        if n.shape[0] % 2:
            pad = torch.zeros_like(n[:1])
            n, mean, m2 = (torch.cat([x, pad]) for x in (n, mean, m2))
        na, nb = n[0::2], n[1::2]
        ma, mb = mean[0::2], mean[1::2]
        qa, qb = m2[0::2], m2[1::2]
        tot = na + nb
        safe = torch.where(tot > 0, tot, torch.ones_like(tot))
        delta = mb - ma
        both = (na > 0) & (nb > 0)
        mean = torch.where(both, ma + delta * (nb / safe), torch.where(na > 0, ma, mb))
        m2 = torch.where(both, qa + qb + delta * delta * (na * nb / safe), torch.where(na > 0, qa, qb))
        n = tot
    lo = torch.where(has, tables[..., _MIN], torch.full_like(zero, float("inf"))).amin(0)
    hi = torch.where(has, tables[..., _MAX], torch.full_like(zero, float("-inf"))).amax(0)
    return Stats(n[0], top, shift_g, mean[0], m2[0], lo, hi)


def apply(v: torch.Tensor, unit: torch.Tensor, st: Stats, eps: float) -> torch.Tensor:
    """a = (v - mean) / (std + eps) per unit, in the unit's 2**-e scale; a unit
    whose values are all exactly equal (min == max) gives exactly 0."""
    if v.shape[0] == 0:
        return v
    e = st.e[unit]
    d = seg_ops.ldexp(v, -e) - st.shift[unit]
    dev = d - st.mean[unit]
    n = st.n
    sigma = seg_ops.sqrt_rn(st.m2 / torch.where(n > 1, n - 1.0, torch.ones_like(n)))
    den = (sigma + seg_ops.ldexp(torch.full_like(sigma, eps), -st.e))[unit]
    a = torch.where(dev == 0, dev, dev / den)
    collapsed = (st.lo == st.hi)[unit]
    return torch.where(collapsed, torch.zeros_like(a), a)
