"""Exact power-of-two scaling, the canonical pairwise sum, and a correctly rounded sqrt.

Every reduction of Eq. 4 and Eq. 6 runs over a *segment* (a group column, a
whitening unit) laid along dimension 1 of a dense tensor: ``(K, n, G)`` for
Eq. 4 (members along dim 1, groups innermost, so every operation runs over
long contiguous rows), ``(S, m)`` for Eq. 6 (see ``_groups`` and
``_whiten``). Sums use one fixed tree, :func:`tree_sum`:

* level s pairs positions p and p + s (p a multiple of 2s) inside the segment;
  a position without a partner passes up unchanged. The tree depends only on
  the segment's own length, never on the layout, the device or the batch;
  along dim 1 of a ``(K, n, G)`` layout each level adds two sets of whole
  contiguous rows;
* every step is one correctly rounded IEEE addition of two float64 tensors
  (no atomics, no library reduction, no fused multiply-add), so the result is
  deterministic and the same bits on CPU and CUDA;
* padding a segment with values that are exactly zero in the summed quantity
  (see the callers) cannot change the sum: x + 0 == x except for the sign of
  a zero, and the root of a sum that contains the +0 of the segment's first
  member can never be -0;
* negating the input negates the output bit for bit (round-to-nearest is
  symmetric), which the exact constant-sum cancellation of Eq. 7 relies on.

Min and max come from torch's own reductions: they are exact, hence the same
on every device and in every order.

Scale factors are built from bit patterns (never ``pow``), so they are exact on
every device. Square roots are correctly rounded: CUDA's float64 ``sqrt`` is;
torch's vectorised CPU ``sqrt`` is only faithful (measured: about 0.2% of
random doubles are one ulp off), so on CPU the root comes from NumPy's (IEEE,
hardware) ``sqrt`` on the few group or unit statistics, with a Tuckerman
correction as the fallback where NumPy is absent.
"""

from __future__ import annotations

import math
import threading

import torch

from impl import _native

_F64 = torch.float64
_I64 = torch.int64

#: Exponent field of a float64.
_EXP_MASK = 0x7FF0000000000000
#: Largest power of two a scale may be built from: values up to 2**1024 then
#: scale below 4, so nothing downstream (differences, squares, sums) overflows.
_P_MAX_BITS = (1021 + 1023) << 52
#: 2**-(E + 1) from 2**E by bits: biased(2**-(E+1)) = 2045 - biased(2**E).
_F_FROM_P = 2045 << 52


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


def min_scale_bits(eps: float) -> int:
    """Bits of the smallest power of two a scale may be built from.

    2**-1022 keeps the factor 2**-e normal; with eps > 0, 2**(exponent(eps) - 1001)
    keeps the folded eps * 2**-e below 2**1000 (values far below eps are then
    scaled up less, which cannot matter since eps dominates their std).
    """
    e = -1022
    if eps > 0.0:
        e = max(e, math.frexp(eps)[1] - 1001)
    return (e + 1023) << 52


def scale(absmax: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale factors f = 2**-e with |x| < 2**e for every x of the segment
    (``absmax`` is its largest magnitude), and the folded eps * f.

    Exact: f is a normal power of two built from bits (2**E is the leading
    power of two of absmax, clamped to [min_scale_bits(eps), 2**1021]; then
    f = 2**-(E+1)), so x * f is exact wherever it is a normal number.
    """
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
    """x[i] for a 0-d int64 tensor ``i``, without the host read that Python
    indexing with a 0-d tensor may do on CUDA."""
    return x.index_select(0, i.reshape(1)).reshape(())


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Copy a small CPU tensor to ``device`` without a host synchronisation
    (pinned memory and a non-blocking copy on CUDA)."""
    if device.type == "cuda" and x.device.type == "cpu":
        return x.contiguous().pin_memory().to(device, non_blocking=True)
    return x.to(device)


def host_to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list on ``device`` without a host synchronisation."""
    return to_device(torch.tensor(values, dtype=dtype), device)


#: Tree levels go to two preallocated buffers only on CPU and from this many
#: elements on: there fresh large allocations cost page faults; elsewhere the
#: fewest dispatched operations per level win (CUDA caches its allocations).
SCRATCH_MIN = 1 << 15


#: scratch buffers kept between calls, per thread and name (see :func:`scratch`)
_KEPT = threading.local()


def scratch(x: torch.Tensor, keep: str | None = None):
    """Two buffers for the levels of :func:`tree_sum` on x (each at least as large as
    the first level), or None where plain allocation is cheaper. ``keep``: a name under
    which this thread keeps the two between calls (grown, never shrunk), for a caller
    whose sums (views into them) are dead before its next call with that name: a fresh
    pair costs its pages again each call (measured at N = 65,536, K = 4: Eq. 4's levels,
    2 MB, took about 500 minor page faults a call in about half the batches)."""
    if x.device.type != "cpu" or x.numel() < SCRATCH_MIN:
        return None
    m = x.shape[1]
    n = x.numel() // max(m, 1) * (m // 2 + m % 2)
    if keep is None:
        return (torch.empty(n, dtype=x.dtype, device=x.device), torch.empty(n, dtype=x.dtype, device=x.device))
    kept = getattr(_KEPT, "bufs", None)
    if kept is None:
        kept = _KEPT.bufs = {}
    got = kept.get((keep, x.dtype))
    if got is None or got[0].numel() < n:
        got = kept[(keep, x.dtype)] = (torch.empty(n, dtype=x.dtype), torch.empty(n, dtype=x.dtype))
    return got


#: :func:`kept` keeps tensors of at most this many elements (64 MB of float64)
KEPT_MAX = 1 << 23


def kept(name: str, shape, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialised work tensor of ``shape`` that this thread keeps between calls under
    ``name`` (its storage grown, never shrunk), on CPU from :data:`SCRATCH_MIN` elements on;
    elsewhere, or smaller, a fresh one. For a caller whose use of it ends before its next call
    with that name: on CPU a fresh large tensor costs its pages again every call (the labelled
    layouts' Eq. 4, N = 65,536, K = 4: about 2,500 minor page faults a call, measured). Beyond
    :data:`KEPT_MAX` elements, fresh too: a thread does not hold a huge batch's work space
    after its call (there the pages' cost is a small share of the call's)."""
    numel = math.prod(shape)
    if torch.device(device).type != "cpu" or not SCRATCH_MIN <= numel <= KEPT_MAX:
        return torch.empty(shape, dtype=dtype, device=device)
    store = getattr(_KEPT, "tensors", None)
    if store is None:
        store = _KEPT.tensors = {}
    got = store.get((name, dtype))
    if got is None or got.numel() < numel:
        got = store[(name, dtype)] = torch.empty(numel, dtype=dtype)
    return got[:numel].view(shape)


def tree_sum(x: torch.Tensor, bufs=None, *, squares: bool = False) -> torch.Tensor:
    """Sum along dim 1 by the canonical pairwise tree, keeping the dim (of the
    squares of x if ``squares``: each square rounded, then summed the same way).

    Level s pairs positions p and p + s (p a multiple of 2s); a position
    without a partner passes up unchanged. One elementwise addition per level:
    the pairs of a level are the even and odd entries of the previous level's
    partial sums (an odd one out is carried along). ``bufs`` (from
    :func:`scratch`) hold the levels; the result is then a view into them.

    On CPU, float64, the levels run in one C loop (``impl._native.tree_sum``, where built and
    :func:`impl._native.serial` holds): the same additions, the same bits, without three
    dispatched operations a level (sixteen levels for a unit of 65,536 rows).
    """
    if bufs is not None and _shares(x, bufs):  # x lies in them: its levels would overwrite it
        bufs = None
    if x.device.type == "cpu" and x.dtype == torch.float64 and _native.serial(x.numel()):
        out, work = (None, None) if bufs is None else bufs
        got = _native.tree_sum(x, squares, out, work)
        if got is not None:
            return got
    m = x.shape[1]
    first = squares
    while m > 1 or first:
        h, odd_one = m // 2, m % 2
        last = x[:, m - 1:] if odd_one else None
        if bufs is None:  # the fewest dispatched operations
            if h:
                even, odd = x[:, 0:2 * h:2], x[:, 1:2 * h:2]
                if first:
                    y = even * even
                    y += odd * odd
                else:
                    y = even + odd
            if odd_one:
                last = last * last if first else last
                y = torch.cat([y, last], 1) if h else last
        else:  # levels alternate between the two buffers
            shape = list(x.shape)
            shape[1] = h + odd_one
            y = bufs[0][: math.prod(shape)].view(shape)
            if h:
                even, odd = x[:, 0:2 * h:2], x[:, 1:2 * h:2]
                if first:
                    torch.mul(even, even, out=y[:, :h])
                    y[:, :h] += torch.mul(odd, odd, out=bufs[1][: even.numel()].view(even.shape))
                else:
                    torch.add(even, odd, out=y[:, :h])
            if odd_one:
                torch.mul(last, last, out=y[:, h:]) if first else y[:, h:].copy_(last)
            bufs = (bufs[1], bufs[0])
        x, m, first = y, h + odd_one, False
    return x


def _shares(x: torch.Tensor, bufs) -> bool:
    """May x share memory with either buffer (its sums would overwrite it)? By address ranges, not
    storage objects: two storages may view one allocation (torch.from_numpy of one array)."""
    return any(_native.overlaps(x, b) for b in bufs)


_CONSTANTS: dict = {}


def cached_constants() -> list[torch.Tensor]:
    """Every constant tensor the cache holds now (a captured CUDA graph keeps those it read)."""
    return list(_CONSTANTS.values())


def constant(values: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small constant tensor on ``device``, made once (never modify it in place):
    the per-call host-to-device copies of counts and weights cost a kernel each."""
    # floats keyed with their sign: 0.0 == -0.0 (and hash alike), but a weight of -0.0
    # gives products of the opposite sign, so the two must not share a tensor
    key = (tuple((v, math.copysign(1.0, v)) if isinstance(v, float) else v for v in values), dtype, str(device))
    t = _CONSTANTS.get(key)
    if t is None:
        if len(_CONSTANTS) > 256:
            _CONSTANTS.clear()
        t = _CONSTANTS[key] = host_to_device(list(values), dtype, device)
    return t


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


def sqrt_tuckerman(q: torch.Tensor) -> torch.Tensor:
    """Correctly rounded float64 square root from torch's faithful one.

    One Tuckerman test fixes it: with s+ and s- the neighbours of s, sqrt(q)
    rounds above s iff q > s*s+, below s iff q <= s*s- (exact products; q - p is
    exact by Sterbenz, so the sign of (q - p) - e is the sign of q - s*s+).
    Below 2**-900 the products could underflow, and there the faithful root is kept.
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


def _numpy_sqrt():
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy ships with every supported torch
        return None
    return numpy.sqrt


def sqrt_rn(q: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """Correctly rounded float64 square root on every device (IEEE 754's sqrt).

    CUDA's float64 sqrt is correctly rounded (sqrt.rn.f64). On CPU, NumPy's
    sqrt is the hardware one (correctly rounded) and costs one call on the few
    statistics this is applied to; without NumPy, the Tuckerman correction.
    ``inplace``: into q's own buffer (q contiguous, this caller's own), no new one.
    """
    if q.device.type == "cuda":
        return q.sqrt_() if inplace else torch.sqrt(q)
    if q.device.type == "cpu":
        np_sqrt = _numpy_sqrt()
        if np_sqrt is not None:
            v = q.detach().numpy()
            return q if inplace and np_sqrt(v, out=v) is v else torch.from_numpy(np_sqrt(v))
    return q.copy_(sqrt_tuckerman(q)) if inplace else sqrt_tuckerman(q)
