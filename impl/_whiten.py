"""Eq. 6, batch whitening per unit: unit layouts (:class:`Layout`), local statistics, Chan merge,
application.

Each rank summarises each unit in one row of a (S, 7) float64 table (:meth:`Local.table`): values
scaled by 2**-e (exact), ``shift`` the first scaled value on this rank, ``mean_d`` the mean of
d = v 2**-e - shift, ``M2`` the two-pass sum of squared deviations, ``min``/``max`` raw (the exact
collapse test). The merge rescales every rank's row to the unit's global exponent, re-expresses
each mean against the first non-empty rank's shift and combines ranks along a fixed pairwise tree
(Chan): the same bits on every rank; one rank is the local two-pass, which a local call uses
directly.

A unit whose values are all equal takes mean -0, so every deviation is +0 and a = +0. A rank's
part of a unit made of whole groups has combined values of exact mean 0 (spec section 7): shift
and mean are +0, so a structural zero of c whitens to exactly 0."""

from __future__ import annotations

import dataclasses
import itertools
import math

import torch

from impl import _segments as seg_ops
from impl._segments import PAD_FACTOR, PAD_SLACK, TwoPass, denominator, two_pass

_F64 = torch.float64
_I64 = torch.int64
COLS = 7
_N, _E, _SHIFT, _MEAN, _M2, _MIN, _MAX = range(COLS)

constant = seg_ops.constant


@dataclasses.dataclass
class Layout:
    """Where each unit's rows sit: ``kind`` is "empty", "view", "padded" or "buckets"
    (units so ragged that one padded layout would exceed PAD_FACTOR x the rows: units of
    one power-of-two size class each share a padded layout, at most 2x their rows)."""

    sizes: list[int]
    kind: str
    device: torch.device
    width: int = 0
    slot: torch.Tensor | None = None  # (N,) row -> slot of the (S, width) padded layout
    starts: list[int] = dataclasses.field(default_factory=list)


def layout(sizes: list[int], rows: int, device, buckets: bool = True) -> Layout:
    """The unit layout; ``buckets=False`` (inside a bucket) never cuts into buckets."""
    units = len(sizes)
    longest = max(sizes, default=0)
    if rows == 0:
        return Layout(sizes, "empty", device)
    if all(s == longest for s in sizes):
        return Layout(sizes, "view", device, longest)
    starts = [0, *itertools.accumulate(sizes[:-1])]
    if buckets and units * longest > PAD_FACTOR * rows + PAD_SLACK:
        return Layout(sizes, "buckets", device, longest, starts=starts)
    base = constant(tuple(j * longest - o for j, o in enumerate(starts)) + tuple(sizes), _I64, device)
    offset = torch.repeat_interleave(base[:units], base[units:], output_size=rows)
    slot = offset.add_(torch.arange(rows, dtype=_I64, device=device))
    return Layout(sizes, "padded", device, longest, slot, starts)


@dataclasses.dataclass
class Local:
    """This rank's per-unit statistics ((S, 1) tensors) and its values in the unit layout."""

    lay: Layout
    tp: TwoPass | None = None  # None for an empty rank and for "buckets"
    x: torch.Tensor | None = None  # the values in the layout (caller dtype)
    parts: list | None = None  # "buckets": (unit indices, row indices, Local) per size class; "empty": []

    def finite(self) -> bool:
        """Host check: are all values finite? (nan and inf show in min or max.)"""
        if self.parts is not None:
            return all(p.finite() for _, _, p in self.parts)
        return self.tp.finite()

    def table(self, device) -> torch.Tensor:
        """(S, 7) float64: count, e, shift, mean_d, M2, min, max (empty units:
        count 0, e 0, min inf, max -inf)."""
        sizes = self.lay.sizes
        empty = constant((0.0, 0.0, 0.0, 0.0, 0.0, math.inf, -math.inf), _F64, device)
        if self.parts is not None:  # "buckets" and "empty": the empty units keep these rows
            table = empty.expand(len(sizes), COLS).clone()
            for units, _, p in self.parts:
                table.index_copy_(0, units.to(device), p.table(device))
            return table
        tp = self.tp
        cols = [constant(tuple(float(s) for s in sizes), _F64, device), seg_ops.scale_exponent(tp.f).to(_F64),
                tp.shift, tp.mean, tp.m2, tp.lo.to(_F64), tp.hi.to(_F64)]
        table = torch.cat([c.reshape(-1, 1).expand(len(sizes), 1) for c in cols], 1)
        if 0 in sizes:
            table = torch.where(constant(tuple(s > 0 for s in sizes), torch.bool, device)[:, None], table, empty)
        return table


def local_stats(v: torch.Tensor, sizes: list[int], eps: float, own: bool = False, whole=None) -> Local:
    """This rank's statistics of values ``v`` (N,) cut into units of ``sizes``
    (``own``: v is a float64 tensor of this call's, used as work space). ``whole``: the
    units made of whole groups (a host tuple of bools or an (S,) bool tensor; None: none),
    whose mean is the structural 0 (module docstring)."""
    lay = layout(sizes, v.shape[0], v.device)
    if lay.kind == "empty":
        return Local(lay, parts=[])
    if lay.kind == "buckets":
        return Local(lay, parts=[(units, rows, _stats_in(v.index_select(0, rows), part, eps, own,
                                                         _whole_part(whole, units, host)))
                                 for host, units, rows, part in _buckets(lay, v.device)])
    return _stats_in(v, lay, eps, own, whole)


def _whole_part(whole, units: torch.Tensor, host: list[int]):
    """``whole`` of a bucket's units (``units`` on the device, ``host`` the same indices)."""
    if whole is None or isinstance(whole, tuple):
        return None if whole is None else tuple(whole[j] for j in host)
    return whole.index_select(0, units.to(whole.device))


def _buckets(lay: Layout, device):
    """(unit indices on the host and on ``device``, row indices, layout of those units) per
    power-of-two size class of the non-empty units: within a class the longest unit is less than
    twice the shortest, so its padded layout holds less than 2x its rows. Each unit's sums keep
    their tree (it depends on the unit's length only): the bits of any other layout."""
    classes: dict[int, list[int]] = {}
    for j, s in enumerate(lay.sizes):
        if s:
            classes.setdefault(s.bit_length(), []).append(j)
    out = []
    for _, units in sorted(classes.items()):
        sizes = [lay.sizes[j] for j in units]
        count = torch.tensor(sizes, dtype=_I64, device="cpu")
        starts = torch.tensor([lay.starts[j] for j in units], dtype=_I64, device="cpu")
        begin = starts - (torch.cumsum(count, 0) - count)
        total = sum(sizes)
        rows = torch.repeat_interleave(begin, count, output_size=total) + torch.arange(total, dtype=_I64, device="cpu")
        out.append((units, torch.tensor(units, dtype=_I64, device=device), rows.to(device),
                    layout(sizes, total, device, buckets=False)))
    return out


def _stats_in(v: torch.Tensor, lay: Layout, eps: float, own: bool, whole=None) -> Local:
    """The statistics of values ``v`` in the unit layout ``lay`` ("view", or "padded": each unit
    padded with its first value, a mask of 1.0 on members and 0.0 on padding)."""
    sizes, units, width, loc = lay.sizes, len(lay.sizes), lay.width, Local(lay)
    padded = lay.kind == "padded"
    counts = tuple(float(s) for s in sizes) if padded else (float(width),)
    ddof = tuple(float(max(s - 1, 1)) for s in sizes)  # unbiased; units of 0 or 1 samples divide by 1
    firsts = tuple(min(o, v.shape[0] - 1) for o in lay.starts) if padded else ()
    if isinstance(whole, tuple):
        whole = True if all(whole) else None if not any(whole) else constant(whole, torch.bool, v.device)[:, None]
    elif whole is not None:
        whole = whole.to(v.device)[:, None]
    numbers = constant(counts + ddof, _F64, v.device)
    count, ddof = numbers[:len(counts), None] if padded else numbers[:1], numbers[len(counts):, None]
    if padded:
        x = v.index_select(0, constant(firsts, _I64, v.device))[:, None].expand(units, width).contiguous()
        x.view(-1).index_copy_(0, lay.slot, v)
        mask = torch.zeros(units * width, dtype=_F64, device=v.device).index_fill_(0, lay.slot, 1.0).view(units, width)
    else:
        x, mask = v.view(units, width), None
    inplace = own and x.dtype == _F64  # the values are not needed again (no merge across ranks)
    loc.tp = two_pass(x, count, eps, pad_mask=mask, minmax=True, own=inplace, whole=whole, ddof=ddof)
    loc.x = None if inplace else x
    return loc


def _output(dev: torch.Tensor, den: torch.Tensor, lay: Layout, out_dtype) -> torch.Tensor:
    """a = dev / den in row order; written in ``out_dtype`` directly (one rounding
    from the float64 quotient, as a cast would), or float64 when it is None."""
    if lay.kind == "padded":
        a = dev.div_(den).view(-1).index_select(0, lay.slot)
        return a if out_dtype is None else a.to(out_dtype)
    if out_dtype is None or out_dtype == _F64:
        return dev.div_(den).view(-1)
    out = torch.empty(dev.shape, dtype=out_dtype, device=dev.device)
    return torch.div(dev, den, out=out).view(-1)


def apply_local(loc: Local, eps: float, out_dtype=None) -> torch.Tensor:
    """Eq. 6 from one rank's own statistics (no process group): the deviations
    of the two-pass are those of the merged statistics of a single rank."""
    if loc.parts is not None:  # "buckets", "empty"
        return _scatter(loc.lay, [(rows, apply_local(p, eps, out_dtype)) for _, rows, p in loc.parts], out_dtype)
    return _output(loc.tp.dev, loc.tp.den, loc.lay, out_dtype)


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


def merge(tables: torch.Tensor) -> Stats:
    """Combine a (W, S, 7) table of per-rank summaries, ranks in order 0..W-1."""
    n = tables[..., _N]
    has = n > 0
    e = tables[..., _E].to(_I64)
    big = torch.full_like(e, -(1 << 20))
    top = torch.where(has, e, big).amax(0)
    top = torch.where(top == -(1 << 20), torch.zeros_like(top), top)
    k = torch.where(has, e - top, torch.zeros_like(e))  # in [-2043, 0]: rescale to the global exponent
    # x * 2**k in two exact steps, 2**h and 2**(k - h) (h = floor(k / 2)): both normal powers of two
    h = torch.div(k, 2, rounding_mode="floor")
    up, down = seg_ops.pow2_normal(-h), seg_ops.pow2_normal(h - k)
    shift = tables[..., _SHIFT] * up * down
    mean_d = tables[..., _MEAN] * up * down
    m2 = tables[..., _M2] * up * down * up * down
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


def apply_global(loc: Local, st: Stats, eps: float, out_dtype=None) -> torch.Tensor:
    """Eq. 6 of this rank's rows from the merged statistics of every rank: per unit f, shift,
    mean and den, a = ((v f - shift) - mean) / den."""
    f = seg_ops.pow2_normal(st.e)
    mean = torch.where(st.lo == st.hi, -0.0, st.mean)  # collapsed across ranks: deviations +0
    var = st.m2 / torch.where(st.n > 1, st.n - 1.0, 1.0)  # unbiased; units of 0 or 1 samples divide by 1
    terms = (f, st.shift, mean, denominator(var, f * eps, eps))
    if loc.parts is None:
        return _apply_x(loc, *terms, out_dtype)
    return _scatter(loc.lay, [(rows, _apply_x(p, *(t.index_select(0, units) for t in terms), out_dtype))
                              for units, rows, p in loc.parts], out_dtype)  # "buckets", "empty"


def _scatter(lay: Layout, pieces, out_dtype) -> torch.Tensor:
    """Each bucket's results back in row order."""
    out = torch.empty(sum(lay.sizes), dtype=out_dtype or _F64, device=lay.device)
    for rows, a in pieces:
        out.index_copy_(0, rows, a)
    return out


def _apply_x(loc: Local, f, shift, mean, den, out_dtype):
    dev = (loc.x * f[:, None]).sub_(shift[:, None]).sub_(mean[:, None])
    return _output(dev, den[:, None], loc.lay, out_dtype)


# --- the Eq. 6 stages (the spine calls them, impl._pipeline) -------------------------------------


def eq6_stats(plan, c: torch.Tensor) -> Local:
    """This process's Eq. 6 statistics of c (N,): of the scored rows under "unscored"
    (``plan.scored``), whole-group units centred on their structural 0 (``plan.whole``);
    ``plan.own``: c is work space (false where the certificate reads c after Eq. 6)."""
    scored = plan.scored
    if scored is not None:
        c = c if scored.rows is None else c.index_select(0, scored.rows)
    return local_stats(c, plan.sizes if scored is None else scored.sizes, plan.eps, own=plan.own, whole=plan.whole)


def eq6_apply(plan, loc: Local, merged: Stats | None, write) -> torch.Tensor:
    """Eq. 6 in ``write`` (None: float64) from this process's own statistics (``merged`` None)
    or the merged statistics of every rank; the unscored rows +0 (``plan.scored``)."""
    a = apply_local(loc, plan.eps, write) if merged is None else apply_global(loc, merged, plan.eps, write)
    return a if plan.scored is None else plan.scored.scatter(a, plan.inp.n)
