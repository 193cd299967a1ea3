"""Eq. 4 (per-reward group standardization), in the groups' layout; Eq. 7 (the weighted
combination) then runs in that layout (``_eq7``).

Layout. Eq. 4 runs on a float64 ``(K, P, G)`` tensor: reward column, position
inside the group, group. Groups are innermost, so every elementwise step, the
min/max reductions and each level of the pairwise sums run over long
contiguous rows (a ``(G, n, K)`` view would put the short group and K = 4
dimensions innermost, several times slower on CPU).

* Contiguous groups (``group_size``): one strided copy of the rewards (which is
  also the cast to float64), P = n.
* Labelled groups (``group_ids``): one stable sort by label, then a gather into
  P = n_max positions, the padding repeating each group's first member (its
  difference from that member is +0, so sums are unchanged, and min/max too).
  G and n_max come from the call's one host read (:func:`label_facts`).
  Batches so ragged that the padding would exceed a few times the batch (on
  CPU, where a host read is free: twice the batch, for large batches) are cut into buckets of
  groups of similar length (in (2**(b-1), 2**b]), each a padded layout of its
  own (one more host read, for the bucket sizes). Labelled groups that are
  contiguous runs of one length take the contiguous layout, and on CPU labels
  already in order skip the sort.

All arithmetic is device-side; findings that refuse the input are raw int64
scalars for the facts row (see ``_problems``), never raised here. On CPU, where
a read costs nothing, the search for the first non-finite reward runs only when
the group minima and maxima (computed anyway) show one; on other devices it
runs in every call, without a branch.
"""

from __future__ import annotations

import dataclasses

import torch

from impl import _problems as P
from impl import _fused  # the optional fused kernels
from impl import _certify  # the certificate reads the two-pass statistics of Eq. 4
from impl import _segments as seg_ops
from impl._facts import rewards_nonfinite_facts
from impl._stats import PAD_FACTOR, PAD_SLACK, TwoPass, denominator, two_pass
from impl._inputs import Rewards

_F64 = torch.float64
_I64 = torch.int64


#: Where a host read is free (CPU), labelled groups are cut into buckets as soon
#: as one padded layout would hold more than this many slots per row (plus
#: PAD_SLACK): the buckets' layouts hold at most 2. Measured with sizes 5, 9, 16, 2,
#: 31, 17 (2.3 slots per row): 1.4x faster at N = 1M, even at 65,536, and 1.2x slower
#: at 8,192, where the buckets' fixed cost dominates.
CPU_PAD_FACTOR = 2


def lazy_checks(device: torch.device) -> bool:
    """Look for non-finite inputs only when the statistics show one (CPU: a read is free)."""
    return device.type == "cpu"


# --- the arithmetic ------------------------------------------------------------------------


def standardize_groups(tp: TwoPass, count_m1: torch.Tensor, eps: float) -> torch.Tensor:
    """Eq. 4 from the two-pass: z = dev / (std + eps), ddof 1, float64, in place.

    With the scale folded into eps (eps * f), z does not depend on the scale.
    A column whose values are all equal has all differences exactly 0, hence z = 0.
    """
    return tp.dev.div_(denominator(tp.m2.div_(count_m1), tp.eps_f, eps))


standardize = standardize_groups  # the old name (deprecated): Eq. 4 is standardize_groups everywhere


def standardize_scored(x: torch.Tensor, eps: float, lazy: bool, members: torch.Tensor | None = None):
    """Eq. 4 under ``missing="unscored"`` (spec/gdpo.md section 2) on a float64 (K, P, G)
    layout ``x`` (owned: computed in place), ``members`` (1, P, G) bool marking the group
    members where the layout is padded: each group column's statistics over its scored
    (non-NaN) members only, z = 0 where a reward is NaN, and z = 0 throughout a column with
    fewer than two scored members. Returns z and whether the scored rewards were finite.

    The same two-pass as :func:`standardize_groups`: every unscored slot is given the value
    of the column's first scored member, the shift, so its difference is exactly +0 and the
    sums are those of the scored members; its square is cleared by the member mask, and the
    mean divides by the scored count. On rewards without a NaN this is the plain path's
    arithmetic operation for operation (a mask of ones), hence its bits."""
    valid = x == x  # not NaN (an infinity is kept: it is refused, and shows in the largest magnitude)
    if members is not None:
        valid &= members
    first = torch.argmax(valid.to(torch.uint8), 1, keepdim=True)  # the first scored slot (0 if none)
    fill = torch.gather(x, 1, first)
    fill = torch.where(fill == fill, fill, 0.0)  # a column with no scored member: any finite value
    x = torch.where(valid, x, fill)
    mask = valid.to(_F64)
    count = mask.sum(1, keepdim=True)  # integers: exact in any order
    tp = two_pass(x, count.clamp(min=1.0), eps, pad_mask=mask, own=True)
    finite = not lazy or tp.finite()
    z = standardize_groups(tp, (count - 1.0).clamp_(min=1.0), eps)  # a column of one: dev 0, z 0
    return z.masked_fill_(~valid, 0.0), finite


def scored_rows(r: torch.Tensor) -> torch.Tensor:
    """(N,) bool: rows with at least one scored (non-NaN) reward (``missing="unscored"``)."""
    return (r == r).any(1)


# --- phase one: facts before any arithmetic -------------------------------------------------


class Labelled:
    """The stable sort of labelled groups and the layout it yields: ``perm``
    (sorted row -> input row), ``gid`` (sorted row -> group index, groups in
    label order) and ``pos`` (sorted row -> position inside its group).
    Computed on first use where phase one found its facts without the sort."""

    def __init__(self, labels: torch.Tensor, layout: tuple[torch.Tensor, ...] | None = None):
        self._labels = labels
        self._layout = layout

    def _get(self, i: int) -> torch.Tensor:
        if self._layout is None:
            self._layout = _sorted_layout(self._labels, reads_free=True)[:3]
        return self._layout[i]

    perm = property(lambda self: self._get(0))
    gid = property(lambda self: self._get(1))
    pos = property(lambda self: self._get(2))


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
    """Sort the labels (stably) and find the facts the host needs. Where a host
    read costs nothing (CPU), labels already in order skip the sort (its
    permutation is then the identity), and labels whose every group is one run
    of rows (verl's layout) find their facts from the run heads alone: the sort
    of all rows is left until a layout needs it."""
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
    """Phase one's facts when every label is one run of rows, from the runs'
    heads (a sort of G labels, not N); None when some label has several runs, or
    when more than half the rows start a run (the heads' sort would cost about what
    the full sort does, which would then run as well).
    The same facts as the sort's: a group is then its run."""
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


# --- phase two: Eq. 4, in its layout ---------------------------------------------------------


class GroupLayout:
    """Where Eq. 4's layout holds each row, and the way back: ``rows`` brings slot values
    of every part ((P, G): one value a slot, as c; (K, P, G): as z) to input order,
    ``groups`` brings one value a group of every part to the groups' order of first
    appearance. ``kind``: "contiguous" (groups of consecutive rows, one part), "padded"
    (labelled groups in one padded layout, ``at``: input row -> slot) or "buckets" (one
    padded layout per size bucket, ``slots``: each bucket's (slot of each sorted row,
    clamped; whether the row is in the bucket), ``members``: each bucket's groups, ``perm``:
    sorted row -> input row). ``first_row``: labelled groups (label order) -> first input row."""

    def __init__(self, n: int, kind: str, *, at=None, perm=None, slots=(), members=(), groups=0,
                 first_row=None):
        self.n, self.kind, self.at, self.perm = n, kind, at, perm
        self.slots, self.members, self.count, self.first_row = list(slots), list(members), groups, first_row

    def rows(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """(N,) from (P, G) parts, (N, K) from (K, P, G) parts, in input order."""
        z = parts[0].dim() == 3
        if self.kind == "contiguous":
            x = parts[0]
            return x.permute(2, 1, 0).reshape(self.n, x.shape[0]) if z else x.t().reshape(self.n)
        flat = [x.reshape(x.shape[0], -1) if z else x.reshape(-1) for x in parts]
        if self.kind == "padded":
            return flat[0].index_select(1, self.at).t() if z else flat[0].index_select(0, self.at)
        x0 = flat[0]
        by_sorted = torch.empty(x0.shape[:-1] + (self.n,), dtype=x0.dtype, device=x0.device)
        for x, (slot, inside) in zip(flat, self.slots):
            by_sorted = torch.where(inside, x.index_select(x.dim() - 1, slot), by_sorted)
        back = torch.empty_like(by_sorted).index_copy_(by_sorted.dim() - 1, self.perm, by_sorted)
        return back.t() if z else back

    def groups(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """(G,) in the groups' order of first appearance, from (G_part,) parts in layout order."""
        if self.kind == "contiguous":
            return parts[0]
        if self.kind == "padded":
            v = parts[0]
        else:
            v = torch.empty(self.count, dtype=parts[0].dtype, device=parts[0].device)
            for part, members in zip(parts, self.members):
                v.index_copy_(0, members, part)
        return v[torch.argsort(self.first_row)]  # groups in order of first appearance


@dataclasses.dataclass
class Z:
    """Eq. 4's result, in its layout (Eq. 7 combines it there, see ``_eq7``)."""

    parts: list[torch.Tensor]  # z, float64 (K, P, G) per part of the layout (owned: Eq. 7 works in place)
    layout: GroupLayout
    longest: int  # P of the groups' layout (labelled: n_max): Eq. 7's overflow bound
    facts: dict[int, torch.Tensor]  # raw facts found here (non-finite rewards)
    #: the certificate's bound on |c - c*| of every row, groups of ``err_rows`` contiguous rows
    #: (certifying only, contiguous layouts only; elsewhere None: the certificate's worst case)
    err: float | None = None
    err_rows: int = 0
    c: torch.Tensor | None = None  # the fused kernel's c (Eq. 4 and 7 in one), input order; parts empty

    def rows(self) -> torch.Tensor:
        """z (N, K) in input order (``standardize_groups``)."""
        return self.layout.rows(self.parts)


@dataclasses.dataclass
class Normalized:
    """c in input order plus what group_has_signal and the facts row need."""

    c: torch.Tensor  # (N,) float64, input order; z (N, K) where Eq. 7 did not run
    facts: dict[int, torch.Tensor]  # raw facts found in phase two (non-finite, Eq. 7 overflow)
    varies: torch.Tensor | None = None  # (G,) bool, groups by first appearance (if asked)
    #: the certificate's bound on |c - c*| of every row, groups of ``err_rows`` contiguous rows
    #: (certifying only, contiguous layouts only; elsewhere None: the certificate's worst case)
    err: float | None = None
    err_rows: int = 0


def finish(prep: Prepared, eps: float, groups: int = 0, longest: int = 0, runs: int = 0, *,
           read=None, fuse: bool = False) -> Z:
    """Phase two: Eq. 4, z in its layout (``_eq7.eq7`` combines it there). For labelled
    groups ``groups``, ``longest`` and ``runs`` come from the host read of phase one's facts;
    ``read`` reads a small device tensor to the host (used only for pathologically ragged
    groups). ``fuse``: Eq. 7 follows without ``group_has_signal``, so the fused kernel may run
    both (``Z.c``).

    Labelled groups that are contiguous runs of one length (``runs == groups``
    and ``groups * longest == N``, the usual layout of a rollout batch) take the
    contiguous layout: the same per-group arithmetic, hence the same bits,
    without the gather into a padded layout."""
    inp, r = prep.inp, prep.r
    n, k = r.shape
    err = None
    as_runs = (prep.labelled is not None and runs == groups and groups * longest == n
               and (not fuse or not _fused_padded(r, longest, inp)))  # fused: gathers anyway
    if prep.labelled is None or as_runs:
        g = longest if as_runs else inp.group_size
        x = torch.empty(k, g, n // g, dtype=_F64, device=r.device)
        x.copy_(r.view(n // g, g, k).permute(2, 1, 0))
        if inp.missing == "unscored":
            z, finite = standardize_scored(x, eps, prep.lazy)  # (K, g, G)
        else:
            count = seg_ops.constant((float(g), float(g - 1)), _F64, r.device)
            tp = two_pass(x, count[:1], eps, own=True)
            finite = not prep.lazy or tp.finite()
            z = standardize_groups(tp, count[1:], eps)  # (K, g, G)
            if fuse and finite and n and _certify.enabled():  # the certificate's bound on c
                err = _certify.eq4_error(r, g, inp.weights)
        out = Z([z], GroupLayout(n, "contiguous"), g, {}, err, g if err is not None else 0)
    else:
        out, finite = _finish_labelled(prep, eps, groups, longest, read, fuse)
    if not finite:
        out.facts.update(rewards_nonfinite_facts(inp, r))
    return out


def _fused_padded(r: torch.Tensor, width: int, inp: Rewards) -> bool:
    return inp.missing == "refuse" and _fused.padded_eligible(r, width, inp.weights)


def _columns(r: torch.Tensor) -> torch.Tensor:
    """The rewards as float64 columns (K, N): one transposing copy, gathered from after."""
    rt = torch.empty(r.shape[1], r.shape[0], dtype=_F64, device=r.device)
    return rt.copy_(r.t())


def _padded_eq4(rt: torch.Tensor, source: torch.Tensor, groups: int, width: int, eps: float, lazy: bool,
                missing: str = "refuse"):
    """Eq. 4 on a (K, width, groups) layout gathered from the reward columns
    ``rt`` (K, N) at rows ``source`` (width * groups,), a negative entry -1 - j
    marking padding that repeats row j (the group's first member). Returns z
    (K, width, groups) (padding repeats the first member's z) and whether the inputs
    were finite."""
    k = rt.shape[0]
    pad = source < 0
    rows = torch.where(pad, -1 - source, source)
    x = torch.gather(rt, 1, rows.expand(k, -1)).view(k, width, groups)  # gather: ~2x index_select on dim 1 (CPU)
    if missing == "unscored":
        return standardize_scored(x, eps, lazy, (~pad).view(1, width, groups))
    mask = (~pad).to(_F64).view(1, width, groups)
    count = mask.sum(1, keepdim=True)  # integers: exact in any order
    tp = two_pass(x, count, eps, pad_mask=mask, own=True)
    finite = not lazy or tp.finite()
    return standardize_groups(tp, count - 1.0, eps), finite


def _finish_labelled(prep: Prepared, eps: float, groups: int, longest: int, read, fuse: bool):
    inp, r, lab = prep.inp, prep.r, prep.labelled
    n = r.shape[0]
    device = r.device
    first_row = torch.full((groups,), n, dtype=_I64, device=device).scatter_reduce_(
        0, lab.gid, lab.perm, "amin", include_self=True)  # stable sort: the smallest input row
    slots = groups * longest
    fused = fuse and _fused_padded(r, longest, inp)
    cheap_read = lazy_checks(device) and not fused
    if slots <= PAD_FACTOR * n + PAD_SLACK and not (cheap_read and slots > CPU_PAD_FACTOR * n + PAD_SLACK):
        slot = lab.pos * groups + lab.gid  # sorted row -> slot of the (longest, groups) layout
        source = (-1 - first_row).repeat(longest).index_copy_(0, slot, lab.perm)
        c = None
        if fused:
            c = _fused.guarded(lambda: _fused.eq47_padded(r, source, groups, longest, inp.weights, eps),
                               lambda: None)
        if c is not None:
            finite = not prep.lazy or bool(torch.isfinite(r).all())  # lazy: CPU, where a read is free
            return Z([], GroupLayout(n, "padded"), longest, {}, c=c), finite
        z, finite = _padded_eq4(_columns(r), source, groups, longest, eps, prep.lazy, inp.missing)
        at = torch.empty_like(slot).index_copy_(0, lab.perm, slot)
        layout = GroupLayout(n, "padded", at=at, first_row=first_row)
        return Z([z], layout, longest, {}), finite
    parts, layout, finite = _bucketed(prep, eps, groups, first_row, read)
    return Z(parts, layout, longest, {}), finite


def _bucketed(prep: Prepared, eps: float, groups: int, first_row: torch.Tensor, read):
    """Groups cut into buckets of lengths (2**(b-1), 2**b], each padded to 2**b:
    the padding stays below the batch size, whatever the raggedness. z of each bucket,
    their layout, and whether the inputs were finite."""
    inp, r, lab = prep.inp, prep.r, prep.labelled
    device = r.device
    length = torch.zeros(groups, dtype=_I64, device=device).scatter_reduce_(
        0, lab.gid, lab.pos + 1, "amax", include_self=True)
    bucket = torch.frexp((length - 1).to(_F64)).exponent.to(_I64)  # ceil(log2(length)) for length >= 2
    per_bucket = read(torch.bincount(bucket, minlength=64))  # one more host read, ragged batches only
    order = torch.argsort(bucket, stable=True)  # groups by bucket, label order inside
    offsets = [0]
    for cnt in per_bucket:
        offsets.append(offsets[-1] + cnt)
    rank = torch.empty_like(order).index_copy_(0, order, torch.arange(groups, dtype=_I64, device=device))
    rank = rank - seg_ops.host_to_device(offsets[:64], _I64, device)[bucket]  # rank inside the bucket
    row_bucket, row_rank = bucket[lab.gid], rank[lab.gid]
    parts, slots, members_of = [], [], []
    finite = True
    rt = _columns(r)
    for b, cnt in enumerate(per_bucket):
        if not cnt:
            continue
        width = 1 << b
        members = order[offsets[b]: offsets[b] + cnt]
        inside = row_bucket == b
        slot = torch.where(inside, lab.pos * cnt + row_rank, width * cnt)  # the last slot: a sink
        source = torch.cat([(-1 - first_row.index_select(0, members)).repeat(width),
                            torch.zeros(1, dtype=_I64, device=device)]).index_copy_(0, slot, lab.perm)
        z, ok = _padded_eq4(rt, source[:-1], cnt, width, eps, prep.lazy, inp.missing)
        finite = finite and ok
        parts.append(z)
        slots.append((slot.clamp(max=width * cnt - 1), inside))
        members_of.append(members)
    layout = GroupLayout(r.shape[0], "buckets", perm=lab.perm, slots=slots, members=members_of, groups=groups,
                         first_row=first_row)
    return parts, layout, finite
