"""Eq. 4 (per-reward group standardization) and Eq. 7 (weighted combination).

All arithmetic is float64 and device-side; findings that refuse the input are
returned as int64 scalars for the facts row (see ``_problems``), never raised
here, so the caller decides when to read them (one host read per call).
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


def standardize_groups(r: torch.Tensor, seg: seg_ops.Segments, eps: float) -> torch.Tensor:
    """Eq. 4 on rows already in group order: z = (r - mean) / (std + eps), ddof 1.

    Shift-invariant two-pass: each group column is scaled by 2**-e (exact,
    |r| < 2**e) so nothing below overflows, its first sample is subtracted
    (exact by Sterbenz for close values, and symmetric: a column C - r gives
    exactly the negated differences), then the mean of the differences and the
    deviations from it. The scale is folded into eps, so z does not depend on it.
    A column whose values are all equal has all differences exactly 0, hence z = 0.
    """
    e = seg_ops.exponent(seg_ops.reduce(r.abs(), seg, torch.maximum), eps)
    rs = seg_ops.ldexp(r, -e)
    d = rs - rs[seg.start]
    n = seg.length.to(_F64)[:, None]
    dev = d - seg_ops.reduce(d, seg, torch.add) / n
    sigma = seg_ops.sqrt_rn(seg_ops.reduce(dev * dev, seg, torch.add) / (n - 1.0))
    den = sigma + seg_ops.ldexp(torch.full_like(sigma, eps), -e)
    return torch.where(dev == 0, dev, dev / den)


def combine(z: torch.Tensor, weights: list[float]) -> torch.Tensor:
    """Eq. 7: c = sum_k w_k z_k, products rounded one by one and summed left to
    right (no fused multiply-add, no BLAS), so equal weights on z and -z cancel
    to exactly 0 and the result is the same on every device."""
    top = max(math.frexp(w)[1] for w in weights if w != 0.0)
    shift = max(0, top - _WEIGHT_EXPONENT_CAP)
    c = None
    for k, w in enumerate(weights):
        term = z[:, k] * math.ldexp(w, -shift)
        c = term if c is None else c + term
    return seg_ops.ldexp_scalar(c, shift) if shift else c


def first_true(mask: torch.Tensor) -> torch.Tensor:
    """Index of the first True of a 1-D mask as a 0-d int64 tensor (numel if none)."""
    n = mask.shape[0]
    idx = torch.arange(n, dtype=_I64, device=mask.device)
    if n == 0:
        return torch.zeros((), dtype=_I64, device=mask.device)
    return torch.where(mask, idx, torch.full_like(idx, n)).amin()


def kind_of(x: torch.Tensor) -> torch.Tensor:
    """1 nan, 2 +inf, 3 -inf (as int64) for a 0-d float tensor."""
    return torch.where(torch.isnan(x), 1, torch.where(x > 0, 2, 3)).to(_I64)


@dataclasses.dataclass
class Normalized:
    """c in input order plus what group_has_signal and the facts row need."""

    c: torch.Tensor  # (N,) float64, input order
    facts: dict[int, torch.Tensor]  # facts-row column -> 0-d int64 tensor
    seg: seg_ops.Segments  # group layout of the (sorted) rows
    perm: torch.Tensor | None  # sorted row -> input row (labelled groups)
    c_sorted: torch.Tensor


def normalize(inp: Rewards, eps: float) -> Normalized:
    r = inp.rewards.to(_F64)  # exact for every floating input dtype
    n, k = r.shape
    device = r.device
    zero = torch.zeros((), dtype=_I64, device=device)
    if inp.labels is None:
        seg = seg_ops.equal_segments(n, inp.group_size, device)
        perm, rs = None, r
    else:
        sorted_labels, perm = torch.sort(inp.labels, stable=True)
        seg = seg_ops.segments_from_sorted_labels(sorted_labels)
        rs = r[perm]

    c_sorted = combine(standardize_groups(rs, seg, eps), inp.weights)
    if perm is None:
        c = c_sorted
    else:
        c = torch.empty_like(c_sorted)
        c[perm] = c_sorted

    def group_of(row: torch.Tensor) -> torch.Tensor:
        if n == 0:
            return zero
        row = row.clamp(max=n - 1)
        return seg_ops.take(inp.labels, row) if inp.labels is not None else torch.div(row, inp.group_size, rounding_mode="floor")

    facts = {P.GROUPS: (seg.pos == 0).sum().to(_I64) if n else zero}
    flat = r.reshape(-1)
    bad = first_true(~torch.isfinite(flat))
    facts[P.NF_REWARD] = torch.where(bad < n * k, bad + 1, 0)
    if n:
        facts[P.NF_REWARD_KIND] = kind_of(seg_ops.take(flat, bad.clamp(max=n * k - 1)))
        facts[P.NF_REWARD_GROUP] = group_of(torch.div(bad, k, rounding_mode="floor"))
    if perm is not None and n:
        lonely = torch.where(seg.length < 2, perm, torch.full_like(perm, n)).amin()
        facts[P.SINGLETON] = torch.where(lonely < n, lonely + 1, 0)
        facts[P.SINGLETON_LABEL] = group_of(lonely)
    over = first_true(~torch.isfinite(c))
    facts[P.C_OVERFLOW] = torch.where(over < n, over + 1, 0)
    facts[P.C_OVERFLOW_GROUP] = group_of(over)
    return Normalized(c, facts, seg, perm, c_sorted)


def group_signal(norm: Normalized, groups: int) -> torch.Tensor:
    """(G,) bool: min != max of c per group, groups in order of first appearance."""
    seg, cs = norm.seg, norm.c_sorted
    lo = seg_ops.reduce(cs, seg, torch.minimum)
    hi = seg_ops.reduce(cs, seg, torch.maximum)
    varies = lo != hi
    rows = seg.rows
    idx = torch.arange(rows, dtype=_I64, device=cs.device)
    # Order the group starts by the input row of their first sample; every
    # other row sorts after them, so the first G entries are the groups.
    first_row = norm.perm[seg.start] if norm.perm is not None else seg.start
    key = torch.where(seg.pos == 0, first_row, rows + idx)
    order = torch.sort(key).indices[:groups]
    return varies[order]
