"""The arithmetic that Eq. 4 (``_eq4``), Eq. 7 (``_eq7``), Eq. 6 (``_whiten``) and the fused
kernels (``_fused``) share: the shift-invariant two-pass statistics and the denominator
(spec/gdpo.md section 7), the weights' power-of-two plan and the Eq. 7 overflow test, and
the padding budget of the padded layouts. One module, so that each of them imports
it and none imports another for it."""

from __future__ import annotations

import dataclasses
import math

import torch

from impl import _segments as seg_ops

_F64 = torch.float64


#: Weights are scaled by a power of two before Eq. 7 only when their largest
#: magnitude exceeds 2**990: |z| < sqrt(n) < 2**32, so every product then stays
#: finite, and for ordinary weights Eq. 7 runs on the weights as given.
_WEIGHT_EXPONENT_CAP = 990


#: A padded layout may hold up to this many slots per row of the batch (plus
#: PAD_SLACK) before the groups (or whitening units) are cut into size-class buckets.
PAD_FACTOR = 4
PAD_SLACK = 1 << 16


@dataclasses.dataclass
class TwoPass:
    """Shift-invariant two-pass statistics of the segments along dim 1 of x (keepdim)."""

    absmax: torch.Tensor  # largest magnitude (caller dtype)
    lo: torch.Tensor | None  # raw minimum and maximum (where computed: on CPU, or when asked for)
    hi: torch.Tensor | None
    f: torch.Tensor  # scale 2**-e, float64
    eps_f: torch.Tensor  # eps * f
    shift: torch.Tensor  # first member times f: every difference is taken from it
    mean: torch.Tensor  # mean of the differences d = x * f - shift
    dev: torch.Tensor  # d - mean, in the layout of x (float64)
    m2: torch.Tensor  # sum of dev**2 over the segment

    def largest(self) -> float:
        """The largest magnitude of every segment, on the host (nan or inf where an input is not
        finite: they show in it)."""
        return float(self.absmax.amax())

    def finite(self) -> bool:
        """Host check: are all inputs finite? (nan and inf show in the largest magnitude.)"""
        return math.isfinite(self.largest())


def two_pass(x: torch.Tensor, count: torch.Tensor, eps: float, *, pad_mask: torch.Tensor | None = None,
             own: bool = False, minmax: bool = False) -> TwoPass:
    """Statistics of the segments laid along dim 1 of ``x``.

    Each segment is scaled by an exact power of two f (|x f| < 4, so nothing
    below overflows; the scale is folded into eps by the callers), its first
    member is subtracted (exact by Sterbenz for close values, and symmetric: a
    column C - r gives exactly the negated differences), then the mean of the
    differences and the deviations from it. Padding repeats the first member,
    so its difference is exactly +0 and the sum of d is that of the segment;
    ``pad_mask`` (1.0 on members, 0.0 on padding) clears the padding's squares.
    ``own``: x is a float64 buffer this call owns (computed in place).
    ``minmax``: also the raw min and max, and a segment whose values are all
    equal (min == max) is centred on -0 instead of its mean (+0): its
    differences are +-0, so every deviation becomes +0 exactly (Eq. 6's exact
    collapse).
    """
    lo = hi = None
    if minmax or x.device.type == "cpu":  # no full-size temporary (CPU pages are not cached)
        lo, hi = x.amin(1, keepdim=True), x.amax(1, keepdim=True)
        absmax = torch.maximum(hi, -lo)
    else:  # two kernels instead of four
        absmax = x.abs().amax(1, keepdim=True)
    f, eps_f = seg_ops.scale(absmax, eps)
    d = x.mul_(f) if own else x * f
    shift = d[:, :1].clone()
    d.sub_(shift)
    mean = torch.div(seg_ops.tree_sum(d), count)
    if minmax:
        mean = torch.where(lo == hi, -0.0, mean)
    dev = d.sub_(mean)
    if pad_mask is None:
        m2 = seg_ops.tree_sum(dev, squares=True)
    else:
        m2 = seg_ops.tree_sum((dev * dev).mul_(pad_mask))
    return TwoPass(absmax, lo, hi, f, eps_f, shift, mean, dev, m2)


def denominator(var: torch.Tensor, eps_f: torch.Tensor, eps: float, inplace: bool = False) -> torch.Tensor:
    """std + eps in the segment's scale (``inplace``: in var's own buffer, which the caller
    owns; else a new one). It is 0 only for a collapsed segment without eps (eps * f > 0
    whenever eps >= 2**-52, as f >= 2**-1022); there 1 is used: the deviations are all zero
    anyway."""
    den = seg_ops.sqrt_rn(var, inplace).add_(eps_f)
    if not eps >= 2.0 ** -52:
        den.masked_fill_(den == 0, 1.0)
    return den


def weight_plan(weights: list[float]) -> tuple[list[float], int]:
    """Weights as used in Eq. 7 (scaled by 2**-shift when above 2**990) and the shift."""
    top = max(math.frexp(w)[1] for w in weights if w != 0.0)
    shift = max(0, top - _WEIGHT_EXPONENT_CAP)
    return [math.ldexp(w, -shift) for w in weights], shift


def overflow_possible(weights: list[float], longest: int) -> bool:
    """Can Eq. 7 overflow float64? |z| <= (n-1)/sqrt(n) < sqrt(n) (Samuelson;
    eps only shrinks z), so |c| < sqrt(n_max) sum |w|; a factor 2 covers rounding."""
    total = sum(math.ldexp(abs(w), -64) for w in weights)  # scaled: no overflow
    return not 2.0 * math.sqrt(max(longest, 1)) * total < 2.0 ** (1023 - 64)
