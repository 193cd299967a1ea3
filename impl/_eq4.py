"""Eq. 4 (per-reward group standardization), in the groups' layout (``_groups``);
Eq. 7 (the weighted combination) then runs in that layout (``_eq7``).

Eq. 4 runs on a float64 ``(K, P, G)`` tensor: reward column, position inside the
group, group, one per part of the layout (see ``_groups``), with the shift-invariant
two-pass statistics (``_stats``), ddof 1. Padding repeats each group's first member:
its difference from that member is +0, so the sums are unchanged, and min/max too.

All arithmetic is device-side; findings that refuse the input are raw int64
scalars for the facts row (see ``_problems``), never raised here. On CPU, where
a read costs nothing, the search for the first non-finite reward runs only when
the group minima and maxima (computed anyway) show one; on other devices it
runs in every call, without a branch.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from impl import _groups as G
from impl import _problems as P
from impl import _segments as seg_ops
from impl._facts import rewards_nonfinite_facts
from impl._groups import Prepared
from impl._stats import TwoPass, denominator, two_pass

_F64 = torch.float64


# --- the arithmetic ------------------------------------------------------------------------


def standardize_groups(tp: TwoPass, count_m1: torch.Tensor, eps: float) -> torch.Tensor:
    """Eq. 4 from the two-pass: z = dev / (std + eps), ddof 1, float64, in place (over
    tp.dev; tp.m2 stays the sum of squares: the certificate's exact zeros read it).

    With the scale folded into eps (eps * f), z does not depend on the scale.
    A column whose values are all equal has all differences exactly 0, hence z = 0.
    """
    return tp.dev.div_(denominator(torch.div(tp.m2, count_m1), tp.eps_f, eps, inplace=True))


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


# --- phase two: Eq. 4, in its layout ---------------------------------------------------------


@dataclasses.dataclass
class Z:
    """Eq. 4's result, in its layout (Eq. 7 combines it there, see ``_eq7``)."""

    parts: list[torch.Tensor]  # z, float64 (K, P, G) per part of the layout (owned: Eq. 7 works in place)
    layout: G.GroupLayout
    longest: int  # P of the groups' layout (labelled: n_max): Eq. 7's overflow bound
    facts: dict[int, torch.Tensor]  # raw facts found here (non-finite rewards)
    #: groups of this many contiguous rows ran the two-pass of every scored column (the
    #: certificate's running bound on |c - c*| holds, ``impl._certify.stage``); 0 elsewhere
    #: (labelled layouts, "unscored"): the certificate's worst case
    err_rows: int = 0
    #: the batch's largest |reward| (host float) where Eq. 4 read it on the host anyway (the
    #: finiteness check of a lazy call: CPU), else None; the certificate's magnitudes reuse it
    largest: float | None = None
    #: contiguous groups (missing="refuse"): the two-pass's (f, shift, mean, m2), (K, 1, G)
    #: each, as Eq. 4 used them: the certificate's exact zeros read them
    #: (``impl._exact_zeros.zero_rows_eq4``)
    stats: tuple | None = None

    def rows(self) -> torch.Tensor:
        """z (N, K) in input order (``standardize_groups``)."""
        return self.layout.rows(self.parts)


def eq4(plan, r: torch.Tensor, facts) -> Z:
    """The Eq. 4 stage (``impl._plan.PLAIN``): z in the plan's layout, the facts found put into
    ``facts`` (contiguous groups' phase one runs here, in :func:`finish`; labelled groups ran it
    in the plan). ``r``: the rewards (phase one holds them)."""
    longest = plan.row[P.N_MAX] if plan.prep is not None else plan.inp.group_size
    z = finish(plan.prep, plan.eps, plan.layout, longest, inp=plan.inp, lazy=plan.lazy)
    facts.update(z.facts)
    return z


def finish(prep: Prepared | None, eps: float, layout: G.GroupLayout, longest: int, *, inp=None,
           lazy: bool = False) -> Z:
    """Phase two: Eq. 4, z in ``layout`` (``_eq7.eq7`` combines it there); ``longest``: the
    longest group (labelled: n_max, from the host read of phase one's facts). ``prep`` None:
    contiguous groups, whose phase one (``_groups.prepare`` of ``inp``, ``lazy``) runs first,
    here, its facts among z's."""
    found = {}
    if prep is None:
        prep = G.prepare(inp, lazy=lazy)
        found.update(prep.facts)
    inp, r = prep.inp, prep.r
    if layout.kind == "contiguous":
        x = layout.gather_contiguous(r)
        g = layout.parts[0].width
        if inp.missing == "unscored":
            z, finite = standardize_scored(x, eps, prep.lazy)  # (K, g, G)
        else:
            count = seg_ops.constant((float(g), float(g - 1)), _F64, r.device)
            tp = two_pass(x, count[:1], eps, own=True)
            largest = tp.largest() if prep.lazy else None
            finite = largest is None or math.isfinite(largest)
            z = standardize_groups(tp, count[1:], eps)  # (K, g, G)
        out = Z([z], layout, g, found, g if inp.missing != "unscored" else 0)
        if inp.missing != "unscored":
            out.largest = largest
            out.stats = (tp.f, tp.shift, tp.mean, tp.m2)
    else:
        finite = True
        zs = []
        for x, pad in layout.gather(r):
            z, ok = _padded_eq4(x, pad, eps, prep.lazy, inp.missing)
            finite = finite and ok
            zs.append(z)
        out = Z(zs, layout, longest, found)
    if not finite:
        out.facts.update(rewards_nonfinite_facts(inp, r))
    return out


def _padded_eq4(x: torch.Tensor, pad: torch.Tensor, eps: float, lazy: bool, missing: str = "refuse"):
    """Eq. 4 on a (K, width, groups) layout ``x`` gathered by ``_groups.GroupLayout.gather``,
    ``pad`` (width * groups,) marking padding that repeats the group's first member. Returns z
    (K, width, groups) (padding repeats the first member's z) and whether the inputs were finite."""
    _, width, groups = x.shape
    if missing == "unscored":
        return standardize_scored(x, eps, lazy, (~pad).view(1, width, groups))
    mask = (~pad).to(_F64).view(1, width, groups)
    count = mask.sum(1, keepdim=True)  # integers: exact in any order
    tp = two_pass(x, count, eps, pad_mask=mask, own=True)
    finite = not lazy or tp.finite()
    return standardize_groups(tp, count - 1.0, eps), finite
