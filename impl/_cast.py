"""The one correct rounding of a float64 result into an output dtype (shared by the pipeline
and the certificate, which imports nothing else of the pipeline)."""

from __future__ import annotations

import torch

_F64 = torch.float64


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
