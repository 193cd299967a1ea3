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
hardware) ``sqrt`` on the few group or unit statistics.
"""

from __future__ import annotations

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


def tree_sum(x: torch.Tensor, *, squares: bool = False) -> torch.Tensor:
    """Sum along dim 1 by the canonical pairwise tree, keeping the dim (of the
    squares of x if ``squares``: each square rounded, then summed the same way).

    Level s pairs positions p and p + s (p a multiple of 2s); a position
    without a partner passes up unchanged. One elementwise addition per level:
    the pairs of a level are the even and odd entries of the previous level's
    partial sums (an odd one out is carried along).
    """
    m = x.shape[1]
    first = squares
    while m > 1 or first:
        h, odd_one = m // 2, m % 2
        if h:
            even, odd = x[:, 0:2 * h:2], x[:, 1:2 * h:2]
            y = even * even + odd * odd if first else even + odd
        if odd_one:
            last = x[:, m - 1:]
            last = last * last if first else last
            y = torch.cat([y, last], 1) if h else last
        x, m, first = y, h + odd_one, False
    return x


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


def sqrt_rn(q: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """Correctly rounded float64 square root on every device (IEEE 754's sqrt).

    CUDA's float64 sqrt is correctly rounded (sqrt.rn.f64). On CPU, NumPy's
    sqrt is the hardware one (correctly rounded) and costs one call on the few
    statistics this is applied to. ``inplace``: into q's own buffer (q
    contiguous, this caller's own), no new one.
    """
    if q.device.type != "cpu":
        return q.sqrt_() if inplace else torch.sqrt(q)
    v = q.detach().numpy()
    return q if inplace and np.sqrt(v, out=v) is v else torch.from_numpy(np.sqrt(v))
