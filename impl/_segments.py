"""The arithmetic Eq. 4, 7 and 6 share (and the certificate): exact power-of-two scaling, the
canonical pairwise sum, a correctly rounded sqrt, the shift-invariant two-pass statistics
(spec/gdpo.md section 7), the one correct rounding into the output dtype, the non-finite finders.

Every reduction runs over a *segment* (a group column, a whitening unit) along dimension 1 of a
dense tensor: ``(K, n, G)`` for Eq. 4, ``(S, m)`` for Eq. 6. Sums use one fixed tree
(:func:`tree_sum`) that depends only on the segment's length, each step one correctly rounded
addition (no atomics, library reduction or FMA): the same bits on CPU and CUDA; padding that is
exactly zero cannot change a sum, and negating the input negates the output bit for bit (Eq. 7's
exact cancellation relies on it). Min and max are torch's (exact); scale factors are built from
bits. torch's vectorised CPU ``sqrt`` is only faithful, so on CPU NumPy's (IEEE) ``sqrt`` is used."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

_F64 = torch.float64
_I64 = torch.int64


#: Exponent field of a float64.
_EXP_MASK = 0x7FF0000000000000
#: Largest power of two a scale may be built from: values up to 2**1024 then
#: scale below 4, so nothing downstream (differences, squares, sums) overflows.
_P_MAX_BITS = (1021 + 1023) << 52
#: 2**-(E + 1) from 2**E by bits: biased(2**-(E+1)) = 2045 - biased(2**E).
_F_FROM_P = 2045 << 52


def ldexp_scalar(x: torch.Tensor, k: int) -> torch.Tensor:
    """x * 2**k for a Python int ``k``, in two steps (each a normal power of two)."""
    h = k // 2
    return x * math.ldexp(1.0, h) * math.ldexp(1.0, k - h)


def min_scale_bits(eps: float) -> int:
    """Bits of the smallest power of two a scale may be built from: 2**-1022 keeps the factor 2**-e
    normal; with eps > 0, 2**(exponent(eps) - 1001) keeps the folded eps * 2**-e below 2**1000
    (values far below eps are then scaled up less, which cannot matter: eps dominates their std)."""
    e = -1022
    if eps > 0.0:
        e = max(e, math.frexp(eps)[1] - 1001)
    return (e + 1023) << 52


def scale(absmax: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale factors f = 2**-e with |x| < 2**e for every x of the segment (``absmax`` its largest
    magnitude), and the folded eps * f. Exact: f is a normal power of two built from bits (2**E the
    leading power of two of absmax, clamped to [min_scale_bits(eps), 2**1021], f = 2**-(E+1))."""
    p_bits = (absmax.to(_F64).view(_I64) & _EXP_MASK).clamp_(min_scale_bits(eps), _P_MAX_BITS)
    f = (_F_FROM_P - p_bits).view(_F64)
    return f, f * eps


def scale_exponent(f: torch.Tensor) -> torch.Tensor:
    """e with f == 2**-e (int64), for a normal power of two f."""
    return 1023 - (f.view(_I64) >> 52)


def pow2_normal(e: torch.Tensor) -> torch.Tensor:
    """2**-e for int64 e with 2**-e normal (the inverse of :func:`scale_exponent`)."""
    return ((1023 - e) << 52).view(_F64)


def take(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    """x[i] for a 0-d int64 tensor ``i``, without the host read Python indexing may do on CUDA."""
    return x.index_select(0, i.reshape(1)).reshape(())


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small CPU tensor on ``device`` without a host synchronisation (pinned, non-blocking)."""
    if device.type == "cuda" and x.device.type == "cpu":
        return x.contiguous().pin_memory().to(device, non_blocking=True)
    return x.to(device)


def host_to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list on ``device`` without a host synchronisation."""
    return to_device(torch.tensor(values, dtype=dtype, device="cpu"), device)


def tree_sum(x: torch.Tensor, *, squares: bool = False) -> torch.Tensor:
    """Sum along dim 1 by the canonical pairwise tree, keeping the dim (of the squares of x if
    ``squares``: each square rounded, then summed the same way). The levels run in place in one work
    copy (the first level, out of place, makes it). The squares of a large x are taken in slabs along
    dim 0: a call's peak memory stays low (at N = 65,536, K = 4 its pages are not handed back to the
    system and faulted in again each call)."""
    if squares and x.shape[0] > 1 and x.numel() > 1 << 16:
        return torch.cat([tree_sum(part, squares=True) for part in x.split(-(-x.shape[0] // 4))])
    m, h = x.shape[1], x.shape[1] // 2
    if squares or not h:
        y = x * x if squares else x.clone()
    else:
        y = x[:, 0:2 * h:2] + x[:, 1:2 * h:2]
        y = torch.cat([y, x[:, m - 1:]], 1) if m % 2 else y
    m, s = y.shape[1], 1
    while s < m:
        y[:, 0:m - s:2 * s].add_(y[:, s:m:2 * s])
        s *= 2
    return y[:, :1].clone()


_CONSTANTS: dict = {}


def cached_constants() -> list[torch.Tensor]:
    """Every constant tensor the cache holds now (a captured CUDA graph keeps those it read)."""
    return list(_CONSTANTS.values())


def constant(values: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small constant tensor on ``device``, made once (never modify it in place): a per-call
    host-to-device copy costs a kernel."""
    # floats keyed with their sign: 0.0 == -0.0 (and hash alike), but a weight of -0.0
    # gives products of the opposite sign, so the two must not share a tensor
    key = (tuple((v, math.copysign(1.0, v)) if isinstance(v, float) else v for v in values), dtype, str(device))
    t = _CONSTANTS.get(key)
    if t is None:
        if len(_CONSTANTS) > 256:
            _CONSTANTS.clear()
        t = _CONSTANTS[key] = host_to_device(list(values), dtype, device)
    return t


def sqrt_rn(q: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """Correctly rounded float64 square root on every device (CUDA's sqrt.rn.f64; on CPU NumPy's,
    the hardware one). ``inplace``: into q's own buffer (q contiguous, this caller's own)."""
    if q.device.type != "cpu":
        return q.sqrt_() if inplace else torch.sqrt(q)
    v = q.detach().numpy()
    return q if inplace and np.sqrt(v, out=v) is v else torch.from_numpy(np.sqrt(v))


# --- the two-pass statistics and the weights' plan ----------------------------------------------


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
    shift: torch.Tensor  # scaled value every difference is taken from (the first member's, or +0)
    mean: torch.Tensor  # mean of the differences d = x * f - shift
    dev: torch.Tensor  # d - mean, in the layout of x (float64)
    m2: torch.Tensor  # sum of dev**2 over the segment
    den: torch.Tensor  # std + eps in the segment's scale: sqrt(m2 / ddof) + eps f

    def finite(self) -> bool:
        """Host check: are all inputs finite? (nan and inf show in the largest magnitude.)"""
        return math.isfinite(float(self.absmax.amax()))


def two_pass(x: torch.Tensor, count: torch.Tensor, eps: float, *, ddof: torch.Tensor,
             pad_mask: torch.Tensor | None = None, own: bool = False, minmax: bool = False, whole=None) -> TwoPass:
    """Statistics of the segments laid along dim 1 of ``x`` (``count`` members each, the
    variance divided by ``ddof``).

    Each segment is scaled by an exact power of two f (|x f| < 4: nothing below overflows; eps folded
    in as eps f), its first member is subtracted (exact by Sterbenz for close values, and symmetric:
    a column C - r gives exactly the negated differences), then the mean of the differences and the
    deviations from it. Padding repeats the first member, so its difference is exactly +0;
    ``pad_mask`` (1.0 on members, 0.0 on padding) clears the padding's squares. ``own``: x is a
    float64 buffer this call owns (computed in place).

    ``minmax``: also the raw min and max, and a segment whose values are all equal is centred on -0
    instead of its mean, so every deviation is +0 exactly (Eq. 6's exact collapse). ``whole`` (with
    minmax; True: every segment, else an (S, 1) bool tensor): Eq. 6's units of whole groups, whose
    exact mean is the structural 0: shift +0 and mean +0, so the deviations are d = x f itself (with
    every unit whole the mean's pass is skipped)."""
    lo = hi = None
    if minmax or x.device.type == "cpu":  # no full-size temporary (CPU pages are not cached)
        lo, hi = x.amin(1, keepdim=True), x.amax(1, keepdim=True)
        absmax = torch.maximum(hi, -lo)
    else:  # two kernels instead of four
        absmax = x.abs().amax(1, keepdim=True)
    f, eps_f = scale(absmax, eps)
    d = x.mul_(f) if own else x * f
    if whole is True:
        collapsed = lo == hi
        shift = torch.where(collapsed, d[:, :1], 0.0)
        mean = torch.zeros_like(f).masked_fill_(collapsed, -0.0)
        dev = d.sub_(shift)  # == (d - shift) - mean, bit for bit, for either kind of unit
    else:
        live = None if whole is None else whole & (lo != hi)
        shift = d[:, :1].clone() if live is None else torch.where(live, 0.0, d[:, :1])
        d.sub_(shift)
        mean = torch.div(tree_sum(d), count)  # (a whole unit's padding is not +0 here: unused)
        if live is not None:
            mean = torch.where(lo == hi, -0.0, torch.where(live, 0.0, mean))
        elif minmax:
            mean = torch.where(lo == hi, -0.0, mean)
        dev = d.sub_(mean)
    m2 = tree_sum(dev, squares=True) if pad_mask is None else tree_sum((dev * dev).mul_(pad_mask))
    den = denominator(torch.div(m2, ddof), eps_f, eps, inplace=True)
    return TwoPass(absmax, lo, hi, f, shift, mean, dev, m2, den)


def denominator(var: torch.Tensor, eps_f: torch.Tensor, eps: float, inplace: bool = False) -> torch.Tensor:
    """std + eps in the segment's scale (``inplace``: in var's own buffer). It is 0 only for a collapsed
    segment without eps (eps f > 0 whenever eps >= 2**-52): there 1 is used, the deviations being 0."""
    den = sqrt_rn(var, inplace).add_(eps_f)
    if not eps >= 2.0 ** -52:
        den.masked_fill_(den == 0, 1.0)
    return den


# --- the one rounding into the output dtype -----------------------------------------------------


def round_to(a: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 ``a`` correctly rounded (to nearest, ties to even) to ``dtype``. torch's double ->
    half/bfloat16/float8 conversion rounds twice, through float (0.50024414807558 becomes 0.5 in
    float16, not 0.50048828125); here the first step rounds to *odd* (the float32 value truncated,
    its last bit set when inexact), and float32's two more bits make the second rounding correct."""
    if dtype in (_F64, torch.float32) or a.dtype != _F64:
        return a.to(dtype)
    y = a.to(torch.float32)
    back = y.to(_F64)
    bits = y.view(torch.int32)
    bits = torch.where(back.abs() > a.abs(), bits - 1, bits)  # one step toward zero: truncation
    bits = torch.where(back != a, bits | 1, bits)  # inexact: round to odd
    return bits.view(torch.float32).to(dtype)


# --- finders: device-side, no branch, no host read -----------------------------------------------


def first_nonfinite(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(index, float64 bits of the value there) of the first non-finite entry of a 1-D tensor; index 0
    and a finite value when there is none. No branch, no host read."""
    at = torch.argmax(torch.ne(x - x, 0).view(torch.uint8))  # x - x is nan exactly for nan and +-inf
    return at, take(x, at).to(_F64).view(_I64)


def first_infinite(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`first_nonfinite` for ``missing="unscored"``, where a NaN is data: the first infinite entry
    (index 0 and the bits of +0.0 when there is none)."""
    inf = torch.isinf(x)
    at = torch.argmax(inf.view(torch.uint8))
    return at, torch.where(take(inf, at), take(x, at).to(_F64), 0.0).view(_I64)


