"""Exact power-of-two scaling and deterministic segment reductions.

Both Eq. 4 (per group column) and Eq. 6 (per whitening unit) reduce over
*segments*: runs of consecutive rows. A segment reduction here is a pairwise
tree built from elementwise operations only (shift, add/min/max, select), so

* it is deterministic (no atomics, no data-dependent launch order) and gives
  the same bits on CPU and CUDA: every step is one correctly rounded IEEE
  operation, and the tree's shape depends only on the segment layout;
* it needs no host synchronisation (no ``unique``, ``nonzero``, ``bincount``);
* negating the input negates the output bit for bit (round-to-nearest is
  symmetric and the tree is the same for every column), which the exact
  constant-sum cancellation of Eq. 7 relies on.

Power-of-two factors are built from their bit patterns, never with ``pow``,
so they are exact on every device. The square root is corrected to the
correctly rounded one (:func:`sqrt_rn`): ``torch.sqrt`` of float64 on CPU is
only faithful in some builds (SIMD library), CUDA's is correctly rounded, and
bitwise agreement across devices needs the same rounding on both.
"""

from __future__ import annotations

import dataclasses
import math

import torch

_F64 = torch.float64
_I64 = torch.int64


def pow2(k: torch.Tensor) -> torch.Tensor:
    """2**k as float64 for an integer tensor ``k``, exact; clamped to [-1074, 1023]."""
    k = k.to(_I64).clamp(-1074, 1023)
    normal = (k + 1023).clamp(min=1) << 52  # biased exponent field, mantissa 0
    sub = torch.ones_like(k) << (k + 1074).clamp(0, 51)  # subnormal 2**k = 2**-1074 * 2**(k+1074)
    return torch.where(k >= -1022, normal, sub).view(_F64)


def ldexp(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """x * 2**k for integer tensor ``k`` with |k| up to about 2100.

    Split into two equal-sign halves so that each factor is a representable
    power of two; the intermediate lies between x and the result, so the
    product is exact whenever the result is a normal number.
    """
    k = k.to(_I64)
    h = torch.div(k, 2, rounding_mode="floor")
    return x * pow2(h) * pow2(k - h)


def ldexp_scalar(x: torch.Tensor, k: int) -> torch.Tensor:
    """x * 2**k for a Python int ``k`` (same two-step rule as :func:`ldexp`)."""
    h = k // 2
    return x * math.ldexp(1.0, h) * math.ldexp(1.0, k - h)


def take(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    """x[i] for a 0-d int64 tensor ``i``, without the host read that Python
    indexing with a 0-d tensor may do on CUDA."""
    return x.index_select(0, i.reshape(1)).reshape(())


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Copy a small CPU tensor to ``device`` without a host synchronisation
    (pinned memory and a non-blocking copy on CUDA)."""
    if device.type == "cuda" and x.device.type == "cpu":
        return x.contiguous().pin_memory().to(device, non_blocking=True)
    return x.to(device)


_SPLIT = 134217729.0  # 2**27 + 1, Veltkamp's splitting constant for float64


def _two_product(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """p + e == a * b exactly (Dekker, no fused multiply-add needed; |a|, |b| < 2**996
    and no underflow of the partial products)."""
    p = a * b
    ca, cb = _SPLIT * a, _SPLIT * b
    ah = ca - (ca - a)
    bh = cb - (cb - b)
    al, bl = a - ah, b - bh
    e = (((ah * bh - p) + ah * bl) + al * bh) + al * bl
    return p, e


def sqrt_rn(q: torch.Tensor) -> torch.Tensor:
    """Correctly rounded float64 square root on every device.

    ``torch.sqrt`` is within one ulp everywhere; one Tuckerman test fixes it:
    with s+ and s- the neighbours of s, sqrt(q) rounds above s iff q > s*s+,
    below s iff q <= s*s- (exact products; q - p is exact by Sterbenz, so the
    sign of (q - p) - e is the sign of q - s*s+). Below 2**-900 the products
    could underflow, and there the faithful root is kept.
    """
    s = torch.sqrt(q)
    up = torch.nextafter(s, torch.full_like(s, math.inf))
    down = torch.nextafter(s, torch.zeros_like(s))
    p, e = _two_product(s, up)
    above = ((q - p) - e) > 0
    p, e = _two_product(s, down)
    below = ((q - p) - e) <= 0
    ok = (q >= 2.0 ** -900) & (q < 2.0 ** 990)
    return torch.where(ok & above, up, torch.where(ok & below & (s > 0), down, s))


def exponent(x: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """A scale exponent e with |x| < 2**e (frexp exponent, int64; 0 for x == 0).

    With eps > 0, e is raised to at least exponent(eps) - 1000, so that the
    folded eps * 2**-e stays finite (below 2**1000): values far below eps are
    then scaled up less, which cannot matter since eps dominates their std.
    """
    e = torch.frexp(x)[1].to(_I64)
    if eps > 0.0:
        e = e.clamp(min=math.frexp(eps)[1] - 1000)
    return e


@dataclasses.dataclass(frozen=True)
class Segments:
    """Layout of M rows cut into consecutive segments (all int64, shape (M,)).

    ``pos``: position of the row inside its segment; ``length``: length of its
    segment; ``start``: row index of its segment's first row; ``steps``: number
    of tree levels, ceil(log2(longest segment)) or an upper bound of it.
    """

    pos: torch.Tensor
    length: torch.Tensor
    start: torch.Tensor
    steps: int

    @property
    def rows(self) -> int:
        return self.pos.shape[0]


def _levels(longest: int) -> int:
    return max(0, int(longest - 1).bit_length())


def equal_segments(rows: int, size: int, device) -> Segments:
    """Contiguous segments of ``size`` rows each (``rows`` a multiple of size)."""
    idx = torch.arange(rows, dtype=_I64, device=device)
    pos = torch.remainder(idx, size)
    return Segments(pos, torch.full_like(idx, size), idx - pos, _levels(size))


def segments_from_sizes(sizes_dev: torch.Tensor, rows: int, longest: int) -> tuple[Segments, torch.Tensor]:
    """Consecutive segments of the given sizes (int64 tensor on the data device,
    non-negative, summing to ``rows``; empty segments hold no rows), and the
    segment index of every row."""
    device = sizes_dev.device
    idx = torch.arange(rows, dtype=_I64, device=device)
    ends = torch.cumsum(sizes_dev, 0)
    unit = torch.searchsorted(ends, idx, right=True)
    start = (ends - sizes_dev)[unit] if rows else idx
    length = sizes_dev[unit] if rows else idx
    return Segments(idx - start, length, start, _levels(longest)), unit


def segments_from_sorted_labels(labels_sorted: torch.Tensor) -> Segments:
    """Segments of equal consecutive labels (labels already sorted, stable).

    The longest segment is unknown on the host without a synchronisation, so
    the tree depth is bounded by the row count instead (extra levels are no-ops).
    """
    rows = labels_sorted.shape[0]
    device = labels_sorted.device
    idx = torch.arange(rows, dtype=_I64, device=device)
    first = torch.ones(rows, dtype=torch.bool, device=device)
    last = torch.ones(rows, dtype=torch.bool, device=device)
    if rows > 1:
        change = labels_sorted[1:] != labels_sorted[:-1]
        first[1:] = change
        last[:-1] = change
    start = torch.cummax(torch.where(first, idx, torch.zeros_like(idx)), 0).values
    end_marks = torch.where(last, idx, torch.full_like(idx, rows))
    end = torch.flip(torch.cummin(torch.flip(end_marks, (0,)), 0).values, (0,))
    return Segments(idx - start, end - start + 1, start, _levels(rows))


def reduce(x: torch.Tensor, seg: Segments, op) -> torch.Tensor:
    """Reduce ``x`` (M,) or (M, K) over each segment with the binary ``op``
    (torch.add, torch.minimum, torch.maximum) along a pairwise tree, and return
    the segment's result broadcast to every row of the segment."""
    rows = seg.rows
    if rows == 0:
        return x
    pos, length = seg.pos, seg.length
    if x.dim() == 2:
        pos, length = pos[:, None], length[:, None]
    for level in range(seg.steps):
        s = 1 << level
        if s >= rows:
            break
        partner = torch.roll(x, -s, 0)
        take = ((pos & (2 * s - 1)) == 0) & (pos + s < length)
        x = torch.where(take, op(x, partner), x)
    return x[seg.start]
