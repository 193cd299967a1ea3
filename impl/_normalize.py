"""Eq. 4 (per-reward group standardization) and Eq. 7 (weighted combination).

Layouts. Contiguous groups (``group_size``) are a view ``(G, n, K)`` of the
rewards: no copy, no index. Labelled groups (``group_ids``) are sorted once by
label (stable), and the rows scattered into a padded ``(G, n_max, K)`` layout
whose padding repeats each group's first member; ``G`` and ``n_max`` come from
the call's one host read (:func:`label_facts` puts them in the facts). Batches
so ragged that the padding would exceed a few times the batch are cut into
buckets of groups of similar size (lengths in (2**(b-1), 2**b]), each a padded
layout of its own (one more host read, for the bucket sizes).

All arithmetic is float64 and device-side; findings that refuse the input are
raw int64 scalars for the facts row (see ``_problems``), never raised here.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from impl import _problems as P
from impl import _segments as seg_ops
from impl._inputs import Rewards

_F64 = torch.float64
_I64 = torch.int64

#: Weights are scaled by a power of two before Eq. 7 only when their largest
#: magnitude exceeds 2**990: |z| < sqrt(n) < 2**32, so every product then stays
#: finite, and for ordinary weights Eq. 7 runs on the weights as given.
_WEIGHT_EXPONENT_CAP = 990

#: A padded layout may hold up to this many slots per row of the batch (plus
#: PAD_SLACK) before the groups are cut into size buckets instead.
PAD_FACTOR = 4
PAD_SLACK = 1 << 16


# --- the arithmetic ------------------------------------------------------------------------


@dataclasses.dataclass
class TwoPass:
    """Shift-invariant two-pass statistics of segments along dim 1 of x."""

    lo: torch.Tensor  # raw minimum (caller dtype), keepdim
    hi: torch.Tensor  # raw maximum
    f: torch.Tensor  # scale 2**-e, float64
    eps_f: torch.Tensor  # eps * f
    shift: torch.Tensor  # x[:, 0] * f: every difference is taken from it
    mean: torch.Tensor  # mean of the differences d = x * f - shift
    dev: torch.Tensor  # d - mean, the layout of x (float64)
    m2: torch.Tensor  # sum of dev**2 over the segment


def two_pass(x: torch.Tensor, count: torch.Tensor, eps: float, pad_mask: torch.Tensor | None = None,
             centre_collapsed: bool = False) -> TwoPass:
    """Statistics of the segments laid along dim 1 of ``x`` (caller dtype).

    Each segment is scaled by an exact power of two f (|x f| < 1, so nothing
    below overflows; the scale is folded into eps by the callers), its first
    member is subtracted (exact by Sterbenz for close values, and symmetric: a
    column C - r gives exactly the negated differences), then the mean of the
    differences and the deviations from it. Padding repeats the first member,
    so its difference is exactly +0 and the sum of d is that of the segment;
    ``pad_mask`` (1.0 on members, 0.0 on padding) clears the padding's squares.
    ``centre_collapsed``: a segment whose values are all equal (min == max) is
    centred on -0 instead of its mean (+0): its differences are +-0, so every
    deviation becomes +0 exactly (Eq. 6's exact collapse).
    """
    lo, hi = torch.aminmax(x, dim=1, keepdim=True)
    f, eps_f = seg_ops.scale(torch.maximum(hi, -lo), eps)
    d = x * f
    shift = d[:, :1].clone()
    d.sub_(shift)
    mean = seg_ops.tree_sum(d, 1).div_(count)
    if centre_collapsed:
        mean = torch.where(lo == hi, -0.0, mean)
    dev = d.sub_(mean)
    sq = dev * dev
    if pad_mask is not None:
        sq.mul_(pad_mask)
    return TwoPass(lo, hi, f, eps_f, shift, mean, dev, seg_ops.tree_sum(sq, 1))


def standardize(x: torch.Tensor, count: torch.Tensor, count_m1: torch.Tensor, eps: float,
                pad_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 4 on a (G, P, K) layout: z = dev / (std + eps), ddof 1, float64, in place.

    With the scale folded into eps (eps * f), z does not depend on the scale.
    A column whose values are all equal has all differences exactly 0, hence
    z = 0 (its denominator, 0 only when eps is 0, is then replaced by 1).
    """
    tp = two_pass(x, count, eps, pad_mask)
    den = seg_ops.sqrt_rn(tp.m2.div_(count_m1)).add_(tp.eps_f)
    den.masked_fill_(den == 0, 1.0)
    return tp.dev.div_(den)


def weight_plan(weights: list[float]) -> tuple[list[float], int]:
    """Weights as used in Eq. 7 (scaled by 2**-shift when above 2**990) and the shift."""
    top = max(math.frexp(w)[1] for w in weights if w != 0.0)
    shift = max(0, top - _WEIGHT_EXPONENT_CAP)
    return [math.ldexp(w, -shift) for w in weights], shift


def combine(z: torch.Tensor, weights: list[float]) -> torch.Tensor:
    """Eq. 7 on z (..., K): c = sum_k w_k z_k, products rounded one by one and
    summed left to right (no fused multiply-add, no BLAS), so equal weights on z
    and -z cancel to exactly 0 and the result is the same on every device."""
    scaled, shift = weight_plan(weights)
    k = z.shape[-1]
    if any(w != 1.0 for w in scaled):
        z = z.mul_(seg_ops.host_to_device(scaled, _F64, z.device))
    if k == 1:
        c = z[..., 0]
    else:
        c = torch.add(z[..., 0], z[..., 1])
        for j in range(2, k):
            c.add_(z[..., j])
    return seg_ops.ldexp_scalar(c, shift) if shift else c


def overflow_possible(weights: list[float], longest: int) -> bool:
    """Can Eq. 7 overflow float64? |z| <= (n-1)/sqrt(n) < sqrt(n) (Samuelson;
    eps only shrinks z), so |c| < sqrt(n_max) sum |w|; a factor 2 covers rounding."""
    total = sum(math.ldexp(abs(w), -64) for w in weights)  # scaled: no overflow
    return not 2.0 * math.sqrt(max(longest, 1)) * total < 2.0 ** (1023 - 64)


def _first_nonfinite(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(index, float64 bits of the value there) of the first non-finite entry of
    a 1-D tensor; index 0 and a finite value when there is none."""
    at = torch.argmax(torch.ne(x - x, 0).view(torch.uint8))  # x - x is NaN exactly for nan and +-inf
    return at, seg_ops.take(x, at).to(_F64).view(_I64)


def value_facts(v: torch.Tensor) -> dict[int, torch.Tensor]:
    """Raw facts of Eq. 6 input (N,): the first non-finite value and its bits."""
    if v.shape[0] == 0:
        return {}
    at, bits = _first_nonfinite(v)
    return {P.NF_VALUE: at, P.NF_VALUE_KIND: bits}


# --- layouts -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Labelled:
    """Phase one of labelled groups: the stable sort and the facts it yields."""

    perm: torch.Tensor  # sorted row -> input row
    gid: torch.Tensor  # sorted row -> group index (groups in label order)
    pos: torch.Tensor  # sorted row -> position inside its group
    first_row: torch.Tensor | None = None  # group -> its first input row (after the read)


@dataclasses.dataclass
class Prepared:
    """Eq. 4/7 input after phase one: what the facts row needs before any arithmetic."""

    inp: Rewards
    r: torch.Tensor  # (N, K) contiguous, caller dtype
    facts: dict[int, torch.Tensor]
    labelled: Labelled | None


def prepare(inp: Rewards) -> Prepared:
    """Phase one: raw facts (first non-finite reward; for labels the sort, the
    group count, the longest group and the first group of one)."""
    r = inp.rewards.contiguous()
    n, k = r.shape
    facts: dict[int, torch.Tensor] = {}
    lab = None
    if n:
        at, bits = _first_nonfinite(r.view(-1))
        facts[P.NF_REWARD], facts[P.NF_REWARD_KIND] = at, bits
        if inp.labels is not None:
            facts[P.NF_REWARD_GROUP] = seg_ops.take(inp.labels, torch.div(at, k, rounding_mode="floor"))
            lab, more = label_facts(inp.labels)
            facts.update(more)
    return Prepared(inp, r, facts, lab)


def label_facts(labels: torch.Tensor) -> tuple[Labelled, dict[int, torch.Tensor]]:
    n = labels.shape[0]
    device = labels.device
    sorted_labels, perm = torch.sort(labels, stable=True)
    first = torch.ones(n, dtype=torch.bool, device=device)
    last = torch.ones(n, dtype=torch.bool, device=device)
    change = sorted_labels[1:] != sorted_labels[:-1]
    first[1:] = change
    last[:-1] = change
    gid = torch.cumsum(first, 0).sub_(1)
    idx = torch.arange(n, dtype=_I64, device=device)
    pos = idx.sub_(torch.cummax(torch.where(first, idx, 0), 0).values)
    lonely = torch.where(first & last, perm, n).amin()  # first input row of a group of one
    facts = {P.GROUPS: gid[-1] + 1, P.N_MAX: pos.amax() + 1, P.SINGLETON: lonely,
             P.SINGLETON_LABEL: seg_ops.take(labels, lonely.clamp(max=n - 1))}
    return Labelled(perm, gid, pos), facts


@dataclasses.dataclass
class Normalized:
    """c in input order plus what group_has_signal and the facts row need."""

    c: torch.Tensor  # (N,) float64, input order
    facts: dict[int, torch.Tensor]  # raw facts of Eq. 7 (only where it can overflow)
    varies: torch.Tensor | None = None  # (G,) bool, groups by first appearance (if asked)


def finish(prep: Prepared, eps: float, groups: int = 0, longest: int = 0, *, signal: bool = False,
           read=None) -> Normalized:
    """Phase two: Eq. 4 and Eq. 7. For labelled groups ``groups`` and ``longest``
    come from the host read of phase one's facts; ``read`` reads a small device
    tensor to the host (used only for pathologically ragged groups)."""
    inp, r = prep.inp, prep.r
    n, k = r.shape
    if prep.labelled is None:
        g = inp.group_size
        count = seg_ops.host_to_device([float(g), float(g - 1)], _F64, r.device)
        z = standardize(r.view(n // g, g, k), count[:1], count[1:], eps)
        c = combine(z, inp.weights).reshape(n)
        varies = None
        if signal:
            lo, hi = torch.aminmax(c.view(n // g, g), dim=1)
            varies = lo != hi
        longest = g
    else:
        c, varies = _finish_labelled(prep, eps, groups, longest, signal, read)
    facts = {}
    if overflow_possible(inp.weights, longest):
        at, bits = _first_nonfinite(c)
        facts = {P.C_OVERFLOW: at, P.C_OVERFLOW_BITS: bits}
        if inp.labels is not None:
            facts[P.C_OVERFLOW_GROUP] = seg_ops.take(inp.labels, at)
    return Normalized(c, facts, varies)


def _padded_eq4(src: torch.Tensor, slot: torch.Tensor, first: torch.Tensor, groups: int, width: int,
                weights: list[float], eps: float, signal: bool):
    """Eq. 4/7 of ``src`` rows (M, K) placed at ``slot`` (M,) of a (groups, width)
    layout padded with each group's first member ``first`` (groups, K); slot
    groups * width is a sink for rows of other buckets. Returns c by slot
    (groups * width,) and, if asked, whether each group's c varies."""
    k = src.shape[1]
    total = groups * width
    buf = torch.empty(total + 1, k, dtype=src.dtype, device=src.device)
    buf[:total].view(groups, width, k).copy_(first[:, None, :])
    buf.index_copy_(0, slot, src)
    member = torch.zeros(total + 1, dtype=_F64, device=src.device).index_fill_(0, slot, 1.0)
    mask = member[:total].view(groups, width, 1)
    count = mask.sum(1, keepdim=True)  # integers: exact in any order
    z = standardize(buf[:total].view(groups, width, k), count, count - 1.0, eps, pad_mask=mask)
    c = combine(z, weights)  # (groups, width); padding repeats the first member's c
    varies = None
    if signal:
        lo, hi = torch.aminmax(c, dim=1)
        varies = lo != hi
    return c.reshape(total), varies


def _finish_labelled(prep: Prepared, eps: float, groups: int, longest: int, signal: bool, read):
    inp, r, lab = prep.inp, prep.r, prep.labelled
    n, k = r.shape
    device = r.device
    first_row = torch.full((groups,), n, dtype=_I64, device=device).scatter_reduce_(
        0, lab.gid, lab.perm, "amin", include_self=True)  # stable sort: the smallest input row
    first = r.index_select(0, first_row)
    if groups * longest <= PAD_FACTOR * n + PAD_SLACK:
        slot = torch.empty_like(lab.perm).index_copy_(0, lab.perm, lab.gid * longest + lab.pos)
        c_slot, varies = _padded_eq4(r, slot, first, groups, longest, inp.weights, eps, signal)
        c = c_slot.index_select(0, slot)
    else:
        c, varies = _bucketed(prep, eps, groups, first, signal, read)
    if varies is not None:
        varies = varies[torch.argsort(first_row)]  # groups in order of first appearance
    return c, varies


def _bucketed(prep: Prepared, eps: float, groups: int, first: torch.Tensor, signal: bool, read):
    """Groups cut into buckets of lengths (2**(b-1), 2**b], each padded to 2**b:
    the padding stays below the batch size, whatever the raggedness."""
    inp, r, lab = prep.inp, prep.r, prep.labelled
    n, k = r.shape
    device = r.device
    length = torch.zeros(groups, dtype=_I64, device=device).scatter_reduce_(
        0, lab.gid, lab.pos + 1, "amax", include_self=True)
    bucket = torch.frexp((length - 1).to(_F64)).exponent.to(_I64)  # ceil(log2(length)) for length >= 2
    per_bucket = read(torch.bincount(bucket, minlength=64))  # one more host read, ragged batches only
    order = torch.argsort(bucket, stable=True)  # groups by bucket, label order inside
    rank = torch.empty_like(order).index_copy_(0, order, torch.arange(groups, dtype=_I64, device=device))
    offsets = [0]
    for cnt in per_bucket:
        offsets.append(offsets[-1] + cnt)
    rank = rank - seg_ops.host_to_device(offsets[:64], _I64, device)[bucket]  # rank inside the bucket
    row_bucket = bucket[lab.gid]
    row_rank = rank[lab.gid]
    src = r.index_select(0, lab.perm)  # rows in sorted order
    c_sorted = torch.empty(n, dtype=_F64, device=device)
    varies = torch.empty(groups, dtype=torch.bool, device=device) if signal else None
    for b, cnt in enumerate(per_bucket):
        if not cnt:
            continue
        width = 1 << b
        sink = cnt * width
        inside = row_bucket == b
        slot = torch.where(inside, row_rank * width + lab.pos, sink)
        members = order[offsets[b]: offsets[b] + cnt]
        c_slot, v = _padded_eq4(src, slot, first.index_select(0, members), cnt, width, inp.weights, eps, signal)
        c_sorted = torch.where(inside, c_slot.index_select(0, slot.clamp(max=sink - 1)), c_sorted)
        if signal:
            varies.index_copy_(0, members, v)
    return torch.empty_like(c_sorted).index_copy_(0, lab.perm, c_sorted), varies
