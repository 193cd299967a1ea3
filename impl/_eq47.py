"""Eq. 4 (per-reward group standardization) and Eq. 7 (the weighted combination) in the groups'
layout (:class:`GroupLayout`): a float64 ``(K, P, G)`` tensor (reward column, position in the
group, group), groups innermost so every step runs over long contiguous rows; labelled groups are
padded by repeating each group's first member (difference +0: sums, min and max unchanged).

Phase one (:func:`prepare`) finds the facts the host needs before any arithmetic. Eq. 7 combines
each part where it lies, then brings c back to input order. Findings are raw int64 scalars for the
facts row (``_problems``), never raised here.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import torch

from impl import _problems as P
from impl import _segments as seg_ops
from impl._inputs import Rewards
from impl._segments import PAD_FACTOR, PAD_SLACK, first_infinite, first_nonfinite, two_pass

_F64 = torch.float64
_I64 = torch.int64


def rewards_nonfinite_facts(inp, r: torch.Tensor) -> dict:
    """The first non-finite reward of ``r`` (N, K) (under ``missing="unscored"`` the first
    infinite one), its bits and, for labelled groups, its group's label."""
    at, bits = (first_infinite if inp.missing == "unscored" else first_nonfinite)(r.view(-1))
    facts = {P.NF_REWARD: at, P.NF_REWARD_KIND: bits}
    if inp.labels is not None:
        facts[P.NF_REWARD_GROUP] = seg_ops.take(inp.labels, torch.div(at, r.shape[1], rounding_mode="floor"))
    return facts


#: Where a host read is free (CPU), labelled groups are cut into buckets as soon as one padded
#: layout would hold more than this many slots per row (plus PAD_SLACK): measured 1.4x faster
#: at N = 65,536 to 1M with sizes 5, 9, 16, 2, 31, 17, 1.2x slower at 8,192.
CPU_PAD_FACTOR = 2


# --- phase one: facts before any arithmetic -------------------------------------------------


class Labelled:
    """The stable sort of labelled groups: ``perm`` (sorted row -> input row), ``gid`` (sorted row
    -> group, groups in label order), ``pos`` (sorted row -> position inside its group); made on
    first use where phase one found its facts without it."""

    def __init__(self, labels: torch.Tensor, layout: tuple[torch.Tensor, ...] | None = None):
        self._labels, self._layout = labels, layout

    def sorted_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._layout is None:
            self._layout = _sorted_layout(self._labels, reads_free=True)[:3]
        return self._layout

    perm = property(lambda self: self.sorted_rows()[0])
    gid = property(lambda self: self.sorted_rows()[1])
    pos = property(lambda self: self.sorted_rows()[2])


@dataclasses.dataclass
class Prepared:
    """Eq. 4/7 input after phase one."""

    inp: Rewards
    r: torch.Tensor  # (N, K) contiguous, caller dtype
    facts: dict[int, torch.Tensor]
    labelled: Labelled | None
    lazy: bool  # the non-finite search is left to rewards_nonfinite_facts, on demand


def prepare(inp: Rewards, *, lazy: bool) -> Prepared:
    """Phase one: raw facts (the first non-finite reward unless ``lazy``; for
    labels the sort, the group count, the longest group, the first group of one)."""
    r = inp.rewards.contiguous()
    n = r.shape[0]
    facts: dict[int, torch.Tensor] = {}
    lab = None
    if n:
        if not lazy:
            facts.update(rewards_nonfinite_facts(inp, r))
        if inp.labels is not None:
            lab, more = label_facts(inp.labels, reads_free=lazy)
            facts.update(more)
    return Prepared(inp, r, facts, lab, lazy and n > 0)


def label_facts(labels: torch.Tensor, *, reads_free: bool = False) -> tuple[Labelled, dict[int, torch.Tensor]]:
    """Sort the labels (stably) and find the facts the host needs. Where a host read is free
    (CPU), labels in order skip the sort, and labels whose groups are runs of rows (verl's
    layout) find their facts from the run heads alone, the sort left until a layout needs it."""
    if reads_free:
        found = _run_facts(labels)
        if found is not None:
            return Labelled(labels), found
    n = labels.shape[0]
    perm, gid, pos, first, last = _sorted_layout(labels, reads_free=reads_free)
    runs = (labels[1:] != labels[:-1]).sum() + 1  # == groups: each label one run of rows
    lonely = torch.where(first & last, perm, n).amin()  # first input row of a group of one
    facts = {P.GROUPS: gid[-1] + 1, P.N_MAX: pos.amax() + 1, P.RUNS: runs, P.SINGLETON: lonely,
             P.SINGLETON_LABEL: seg_ops.take(labels, lonely.clamp(max=n - 1)), P.SINGLETONS: (first & last).sum()}
    return Labelled(labels, (perm, gid, pos)), facts


def _sorted_layout(labels: torch.Tensor, *, reads_free: bool) -> tuple[torch.Tensor, ...]:
    """perm, gid, pos of the stable sort by label, and each sorted row's
    first/last-of-group flags."""
    n = labels.shape[0]
    device = labels.device
    if reads_free and bool((labels[1:] >= labels[:-1]).all()):
        sorted_labels, perm = labels, torch.arange(n, dtype=_I64, device=device)
    else:
        sorted_labels, perm = torch.sort(labels, stable=True)
    first = torch.ones(n, dtype=torch.bool, device=device)
    last = torch.ones(n, dtype=torch.bool, device=device)
    change = sorted_labels[1:] != sorted_labels[:-1]
    first[1:] = change
    last[:-1] = change
    gid = torch.cumsum(first, 0).sub_(1)
    idx = torch.arange(n, dtype=_I64, device=device)
    pos = idx.sub_(torch.cummax(torch.where(first, idx, 0), 0).values)
    return perm, gid, pos, first, last


def _run_facts(labels: torch.Tensor) -> dict[int, torch.Tensor] | None:
    """Phase one's facts when every label is one run of rows, from the runs' heads (a sort of G
    labels, not N); None when some label has several runs, or when more than half the rows
    start a run (then the full sort is as cheap)."""
    n = labels.shape[0]
    device = labels.device
    heads = torch.ones(n, dtype=torch.bool, device=device)
    heads[1:] = labels[1:] != labels[:-1]
    if 2 * int(heads.sum()) > n:  # mostly runs of one (shuffled, interleaved): the full sort it is
        return None
    start = heads.nonzero().view(-1)  # a host read: free here
    runs = start.shape[0]
    head_labels = torch.sort(labels.index_select(0, start)).values
    if bool((head_labels[1:] == head_labels[:-1]).any()):
        return None
    length = torch.diff(start, append=start.new_full((1,), n))
    lonely = torch.where(length == 1, start, n).amin()  # the first row of a group of one
    count = torch.tensor(runs, dtype=_I64, device=device)
    return {P.GROUPS: count, P.N_MAX: length.amax(), P.RUNS: count.clone(), P.SINGLETON: lonely,
            P.SINGLETON_LABEL: seg_ops.take(labels, lonely.clamp(max=n - 1)), P.SINGLETONS: (length == 1).sum()}


# --- the layout ------------------------------------------------------------------------------


@dataclasses.dataclass
class Part:
    """One padded (or contiguous) layout of ``count`` groups of up to ``width`` rows."""

    width: int  # P
    count: int  # G
    source: torch.Tensor | None = None  # slot -> input row, -1 - j: padding repeating row j; None: contiguous
    slot: torch.Tensor | None = None  # buckets: sorted row -> its slot here (clamped), where ``inside``
    inside: torch.Tensor | None = None  # buckets: sorted row -> whether its group is here
    members: torch.Tensor | None = None  # buckets: this part's groups (indices in label order)


class GroupLayout:
    """Where Eq. 4's layout holds each row, and the way back. ``kind``: "contiguous"
    (groups of consecutive rows, one part), "padded" (labelled groups in one padded layout,
    ``at``: input row -> slot) or "buckets" (one padded layout per size bucket; ``perm``:
    sorted row -> input row). ``first_row``: labelled groups (label order) -> their first
    input row."""

    def __init__(self, n: int, kind: str, parts: list[Part], *, at=None, perm=None, groups: int = 0,
                 first_row=None):
        self.n, self.kind, self.parts = n, kind, parts
        self.at, self.perm, self.count, self.first_row = at, perm, groups, first_row

    def gather(self, r: torch.Tensor):
        """Each part's float64 (K, P, G) copy of the rewards ``r`` (N, K), with its padding:
        ``pad`` (P * G,) bool, None where the part has none. One part at a time (lazy)."""
        n, k = r.shape
        if self.kind == "contiguous":  # (K, g, G)
            g = self.parts[0].width
            x = torch.empty((k, g, n // g), dtype=_F64, device=r.device)
            yield x.copy_(r.view(n // g, g, k).permute(2, 1, 0)), None
            return
        rt = torch.empty(k, n, dtype=_F64, device=r.device).copy_(r.t())  # one transposing copy, gathered from
        for part in self.parts:
            pad = part.source < 0
            rows = torch.where(pad, -1 - part.source, part.source)
            # gather: ~2x index_select on dim 1 (CPU)
            yield torch.gather(rt, 1, rows.expand(k, -1)).view(k, part.width, part.count), pad

    def rows(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """Slot values of each part in input order: (N,) from (P, G) parts (as c),
        (N, K) from (K, P, G) parts (as z)."""
        z = parts[0].dim() == 3
        if self.kind == "contiguous":
            x = parts[0]
            return x.permute(2, 1, 0).reshape(self.n, x.shape[0]) if z else x.t().reshape(self.n)
        flat = [x.reshape(x.shape[0], -1) if z else x.reshape(-1) for x in parts]
        if self.kind == "padded":
            return flat[0].index_select(1, self.at).t() if z else flat[0].index_select(0, self.at)
        x0 = flat[0]
        by_sorted = torch.empty(x0.shape[:-1] + (self.n,), dtype=x0.dtype, device=x0.device)
        for x, part in zip(flat, self.parts):
            by_sorted = torch.where(part.inside, x.index_select(x.dim() - 1, part.slot), by_sorted)
        back = torch.empty_like(by_sorted).index_copy_(by_sorted.dim() - 1, self.perm, by_sorted)
        return back.t() if z else back

    def groups(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """(G,) in the groups' order of first appearance, from each part's (G_part,) values."""
        if self.kind == "contiguous":
            return parts[0]
        if self.kind == "padded":
            v = parts[0]
        else:
            v = torch.empty(self.count, dtype=parts[0].dtype, device=parts[0].device)
            for x, part in zip(parts, self.parts):
                v.index_copy_(0, part.members, x)
        return v[torch.argsort(self.first_row)]  # groups in order of first appearance


def contiguous(n: int, group_size: int) -> GroupLayout:
    """Groups of ``group_size`` consecutive rows."""
    return GroupLayout(n, "contiguous", [Part(group_size, n // group_size if group_size else 0)])


def layout(prep: Prepared, groups: int = 0, longest: int = 0, runs: int = 0, *,
           reads_free: bool = False) -> GroupLayout:
    """The layout of phase one's groups (labelled: ``groups``, ``longest``, ``runs`` from phase
    one's host read; ``reads_free``: CPU, ragged groups cut into buckets sooner). Labelled groups
    that are contiguous runs of one length take the contiguous layout: the same bits, no gather."""
    n = prep.r.shape[0]
    lab = prep.labelled
    if lab is None:
        return contiguous(n, prep.inp.group_size)
    if runs == groups and groups * longest == n:
        return contiguous(n, longest)
    device = prep.r.device
    first_row = torch.full((groups,), n, dtype=_I64, device=device).scatter_reduce_(
        0, lab.gid, lab.perm, "amin", include_self=True)  # stable sort: the smallest input row
    slots = groups * longest
    if slots <= PAD_FACTOR * n + PAD_SLACK and not (reads_free and slots > CPU_PAD_FACTOR * n + PAD_SLACK):
        return _padded(lab, n, groups, longest, first_row)
    return _bucketed(lab, n, groups, first_row)


def _padded(lab: Labelled, n: int, groups: int, longest: int, first_row: torch.Tensor) -> GroupLayout:
    """All groups padded to the longest."""
    slot = lab.pos * groups + lab.gid  # sorted row -> slot of the (longest, groups) layout
    source = (-1 - first_row).repeat(longest).index_copy_(0, slot, lab.perm)
    at = torch.empty_like(slot).index_copy_(0, lab.perm, slot)
    return GroupLayout(n, "padded", [Part(longest, groups, source)], at=at, first_row=first_row)


def _bucketed(lab: Labelled, n: int, groups: int, first_row: torch.Tensor) -> GroupLayout:
    """Groups cut into buckets of lengths (2**(b-1), 2**b], each padded to 2**b:
    the padding stays below the batch size, whatever the raggedness."""
    device = first_row.device
    length = torch.zeros(groups, dtype=_I64, device=device).scatter_reduce_(
        0, lab.gid, lab.pos + 1, "amax", include_self=True)
    bucket = torch.frexp((length - 1).to(_F64)).exponent.to(_I64)  # ceil(log2(length)) for length >= 2
    per_bucket = torch.bincount(bucket, minlength=64).tolist()  # one more host read, ragged batches only
    order = torch.argsort(bucket, stable=True)  # groups by bucket, label order inside
    offsets = list(itertools.accumulate(per_bucket, initial=0))
    rank = torch.empty_like(order).index_copy_(0, order, torch.arange(groups, dtype=_I64, device=device))
    rank = rank - seg_ops.host_to_device(offsets[:64], _I64, device)[bucket]  # rank inside the bucket
    row_bucket, row_rank = bucket[lab.gid], rank[lab.gid]
    parts = []
    for b, cnt in enumerate(per_bucket):
        if not cnt:
            continue
        width = 1 << b
        members = order[offsets[b]: offsets[b] + cnt]
        inside = row_bucket == b
        slot = torch.where(inside, lab.pos * cnt + row_rank, width * cnt)  # the last slot: a sink
        source = torch.cat([(-1 - first_row.index_select(0, members)).repeat(width),
                            torch.zeros(1, dtype=_I64, device=device)]).index_copy_(0, slot, lab.perm)
        parts.append(Part(width, cnt, source[:-1], slot.clamp(max=width * cnt - 1), inside, members))
    return GroupLayout(n, "buckets", parts, perm=lab.perm, groups=groups, first_row=first_row)


# --- the units of Eq. 6 that hold whole groups -------------------------------------------------


def whole_units(inp: Rewards, sizes: list[int], lab: Labelled) -> torch.Tensor:
    """(S,) bool: does each unit of these rows (``sizes``) hold whole labelled groups, no group with
    members in two units (``_whiten.local_stats``'s ``whole``: their mean is the structural 0)? No
    host read. Groups never span ranks, so each rank's part of a unit is judged alone. Where phase
    one found every group one run of rows without sorting, the rows on both sides of each unit
    boundary are compared instead (same answer, no sort). (Contiguous groups: ``impl._pipeline``
    tells from the sizes.)"""
    labels = inp.labels
    device = labels.device
    units = len(sizes)
    constant = seg_ops.constant
    bad = torch.zeros(units, dtype=_I64, device=device)
    if lab._layout is None:  # phase one found every group one run of rows, unsorted
        # a run crosses a unit boundary iff the rows on both sides carry one label: S - 1 reads
        nonempty = [j for j, s in enumerate(sizes) if s]
        left, right = nonempty[:-1], nonempty[1:]  # the units on both sides of each boundary
        if not right:
            return bad == 0
        starts = list(itertools.accumulate(sizes, initial=0))
        rows = constant(tuple(starts[j] for j in right), _I64, device)
        cut = (labels.index_select(0, rows) == labels.index_select(0, rows - 1)).to(_I64)
        for side in (left, right):
            bad.scatter_reduce_(0, constant(tuple(side), _I64, device), cut, "amax")
        return bad == 0
    unit = torch.repeat_interleave(constant(tuple(range(units)), _I64, device),
                                   constant(tuple(sizes), _I64, device), output_size=labels.shape[0])
    unit = unit.index_select(0, lab.perm)  # in label order, where each group is one run of rows
    cut = ((lab.gid[1:] == lab.gid[:-1]) & (unit[1:] != unit[:-1])).to(_I64)  # a group crosses a boundary here
    bad.scatter_reduce_(0, unit[1:], cut, "amax").scatter_reduce_(0, unit[:-1], cut, "amax")
    return bad == 0


# --- Eq. 4 ------------------------------------------------------------------------------------


def eq47(plan, facts):
    """The Eq. 4 and Eq. 7 stage: (c, varies). Eq. 4, z = (x - mean) /
    (std + eps) per group column, ddof 1, float64, in the plan's layout (contiguous groups: phase
    one and the layout made here): each part's two-pass (``_segments.two_pass``) is scaled by exact
    powers of two, so z does not depend on the scale, and a constant column has z = 0 exactly.
    Then, where the API combines, Eq. 7 on each part where it lies: c (N,) in input order and
    ``varies`` (G,) bool by first appearance (group_has_signal); else c is z (N, K). The facts found
    (a non-finite reward; c's overflow from weights beyond ~2**1000) go into ``facts``."""
    inp, prep, eps = plan.inp, plan.prep, plan.eps
    if prep is None:  # contiguous groups
        prep = prepare(inp, lazy=plan.lazy)
        facts.update(prep.facts)
        lay, longest = contiguous(inp.n, inp.group_size), inp.group_size
    else:
        lay, longest = plan.layout, plan.row[P.N_MAX]
    zs, finite = [], True  # z, float64 (K, P, G) per part of the layout (owned: Eq. 7 works in place)
    for x, pad in lay.gather(prep.r):  # one part at a time
        members = None if pad is None else (~pad).view(1, x.shape[1], x.shape[2])
        if inp.missing == "unscored":
            z, ok = _scored(x, eps, prep.lazy, members)
        else:
            mask = None if members is None else members.to(_F64)
            count = (seg_ops.constant((float(x.shape[1]),), _F64, x.device) if mask is None else
                     mask.sum(1, keepdim=True))  # integers: exact in any order
            tp = two_pass(x, count, eps, pad_mask=mask, own=True, ddof=count - 1.0)
            z, ok = tp.dev.div_(tp.den), not prep.lazy or tp.finite()
        zs.append(z)
        finite = finite and ok
    if not finite:
        facts.update(rewards_nonfinite_facts(inp, prep.r))
    if not plan.combined:
        return lay.rows(zs), None
    cs = [combine(z, inp.weights) for z in zs]  # (P, G) each; padding repeats the first member's c
    varies = lay.groups([c.amin(0) != c.amax(0) for c in cs]) if plan.signal else None
    c = lay.rows(cs)
    if overflow_possible(inp.weights, longest):
        at, bits = first_nonfinite(c)
        facts.update({P.C_OVERFLOW: at, P.C_OVERFLOW_BITS: bits})
        if inp.labels is not None:
            facts[P.C_OVERFLOW_GROUP] = seg_ops.take(inp.labels, at)
    return c, varies


def _scored(x: torch.Tensor, eps: float, lazy: bool, members: torch.Tensor | None = None):
    """Eq. 4 under ``missing="unscored"`` (spec/gdpo.md section 2) on a float64 (K, P, G) layout
    ``x`` (owned: computed in place), ``members`` (1, P, G) bool marking the group members where
    the layout is padded: each group column's statistics over its scored (non-NaN) members only,
    z = 0 where a reward is NaN, and z = 0 throughout a column with fewer than two scored
    members. Returns z and whether the scored rewards were finite.

    The same two-pass: every unscored slot is given the value of the column's first scored
    member, the shift, so its difference is exactly +0 and the sums are those of the scored
    members; its square is cleared by the member mask, and the mean divides by the scored
    count. On rewards without a NaN this is the plain path's arithmetic operation for
    operation (a mask of ones), hence its bits."""
    valid = x == x  # not NaN (an infinity is kept: it is refused, and shows in the largest magnitude)
    if members is not None:
        valid &= members
    first = torch.argmax(valid.to(torch.uint8), 1, keepdim=True)  # the first scored slot (0 if none)
    fill = torch.gather(x, 1, first)
    fill = torch.where(fill == fill, fill, 0.0)  # a column with no scored member: any finite value
    mask = valid.to(_F64)
    count = mask.sum(1, keepdim=True)  # integers: exact in any order
    tp = two_pass(torch.where(valid, x, fill), count.clamp(min=1.0), eps, pad_mask=mask, own=True,
                  ddof=(count - 1.0).clamp_(min=1.0))  # a column of one: dev 0, z 0
    return tp.dev.div_(tp.den).masked_fill_(~valid, 0.0), not lazy or tp.finite()


# --- Eq. 7 ------------------------------------------------------------------------------------

#: Weights are scaled by a power of two before Eq. 7 only when their largest magnitude exceeds
#: 2**990: |z| < sqrt(n) < 2**32, so every product then stays finite, and for ordinary weights
#: Eq. 7 runs on the weights as given.
_WEIGHT_EXPONENT_CAP = 990


def weight_plan(weights: list[float]) -> tuple[list[float], int]:
    """Weights as used in Eq. 7 (scaled by 2**-shift when above 2**990) and the shift."""
    top = max(math.frexp(w)[1] for w in weights if w != 0.0)
    shift = max(0, top - _WEIGHT_EXPONENT_CAP)
    return [math.ldexp(w, -shift) for w in weights], shift


def overflow_possible(weights: list[float], longest: int) -> bool:
    """Can Eq. 7 overflow float64? |z| <= (n-1)/sqrt(n) < sqrt(n) (Samuelson; eps only shrinks
    z), so |c| < sqrt(n_max) sum |w|; a factor 2 covers rounding."""
    total = sum(math.ldexp(abs(w), -64) for w in weights)  # scaled: no overflow
    return not 2.0 * math.sqrt(max(longest, 1)) * total < 2.0 ** (1023 - 64)


def combine(z: torch.Tensor, weights: list[float]) -> torch.Tensor:
    """Eq. 7 on z (K, ...): c = sum_k w_k z_k, products rounded one by one and summed left to
    right (no fused multiply-add, no BLAS): equal weights on z and -z cancel to exactly 0, the
    same on every device. With a weight above 2**990 a product may overflow on the way to a
    finite c; the sum is then also formed with the weights scaled by 2**-shift and scaled back,
    taken only where the plain sum is not finite (scaling every row would push small weights'
    products into the subnormals)."""
    scaled, shift = weight_plan(weights)
    if shift:
        plain = _weighted_sum(z, weights, in_place=False)
        rescued = seg_ops.ldexp_scalar(_weighted_sum(z, scaled, in_place=True), shift)
        return torch.where(torch.isfinite(plain), plain, rescued)
    return _weighted_sum(z, weights, in_place=True)


def _weighted_sum(z: torch.Tensor, weights: list[float], *, in_place: bool) -> torch.Tensor:
    """sum_k w_k z_k: each product rounded (a weight of 1 leaves z_k as it is), summed left to right."""
    terms = [z[k] if w == 1.0 else z[k].mul_(w) if in_place else z[k] * w for k, w in enumerate(weights)]
    if len(terms) == 1:
        return terms[0] if in_place or weights[0] != 1.0 else terms[0].clone()
    c = torch.add(terms[0], terms[1])
    for t in terms[2:]:
        c.add_(t)
    return c
