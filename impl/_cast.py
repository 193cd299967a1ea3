"""The cast stage: the output dtype's range, and the one correct rounding of a float64 result
into it (:func:`round_to`, shared by the pipeline and the certificate, which imports nothing
else of the pipeline).

A whitened value is bounded by sqrt(N) (Samuelson), so only a float8 output of more than
~2e5 samples can fail the cast (:func:`cast_reachable`); :func:`output` then refuses the
first value beyond the range before it rounds."""

from __future__ import annotations

import math

import torch

from impl import _problems as P

_F64 = torch.float64

#: Output dtypes the division writes directly (one rounding of the float64 quotient).
#: float16, bfloat16 and float8 are not among them: torch converts a double to
#: those through float (two roundings); they are written by :func:`round_to`.
_DIRECT = (torch.float32,)


def cast_limit(dtype: torch.dtype) -> float:
    """Smallest magnitude that no longer rounds to a finite value of ``dtype``
    (max + half an ulp at max); inf for float64."""
    if dtype == _F64:
        return math.inf
    fi = torch.finfo(dtype)
    return fi.max + math.ldexp(1.0, math.frexp(fi.max)[1] - 1) * fi.eps / 2


def cast_reachable(dtype: torch.dtype, total_rows: int) -> bool:
    """Can a whitened value fail the cast? |a| <= (n-1)/sqrt(n) < sqrt(N)
    (Samuelson's inequality; eps only shrinks a), with a margin for rounding."""
    return math.sqrt(max(total_rows, 0)) * (1.0 + 2.0 ** -20) >= cast_limit(dtype)


def check_range(a: torch.Tensor, dtype: torch.dtype) -> None:
    """Refuse (``OutOfRangeError``) the first value of ``a`` that does not survive the cast to
    ``dtype``; only where one can fail (:func:`cast_reachable`), with a second host read then."""
    if cast_reachable(dtype, a.shape[0]):
        limit = cast_limit(dtype)
        at = int(torch.argmax((a.abs() >= limit).view(torch.uint8)))  # a second host read, only here
        if a.shape[0] and abs(float(a[at])) >= limit:
            raise P.OutOfRangeError(
                f"whitened value {float(a[at])!r} at row {at} does not survive the cast to "
                f"{P.dtype_name(P.dtype_code(dtype))} (largest finite {torch.finfo(dtype).max!r}); "
                "choose a wider out_dtype")


def output(a: torch.Tensor, dtype: torch.dtype, checked: bool = False) -> torch.Tensor:
    """The output in ``dtype``: ``a`` refused where a value does not survive the cast (unless
    ``checked``: the caller checked the range, e.g. across ranks), then rounded once."""
    if not checked:
        check_range(a, dtype)
    return round_to(a, dtype)


def round_to(a: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 ``a`` correctly rounded (to nearest, ties to even) to ``dtype``.

    torch's double -> half/bfloat16/float8 conversion rounds to float first and
    then again (measured: 0.50024414807558 becomes 0.5 in float16, not the
    nearest 0.50048828125). Here the first step rounds to *odd* instead: the
    float32 value truncated toward zero, its last bit set when inexact. float32
    carries at least two more bits than each of these formats over their whole
    range, so the second rounding is then the correct one (round-to-odd).
    """
    if dtype in (_F64, torch.float32) or a.dtype != _F64:
        return a.to(dtype)
    y = a.to(torch.float32)
    back = y.to(_F64)
    bits = y.view(torch.int32)
    bits = torch.where(back.abs() > a.abs(), bits - 1, bits)  # one step toward zero: truncation
    bits = torch.where(back != a, bits | 1, bits)  # inexact: round to odd
    return bits.view(torch.float32).to(dtype)
