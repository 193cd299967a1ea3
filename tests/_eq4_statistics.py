"""Eq. 4's two-pass statistics of a call, as the plain path computes them."""

from __future__ import annotations

import torch

from impl import _segments, gdpo


def eq4_statistics(r: torch.Tensor, g: int, eps: float = 1e-6) -> tuple:
    """(f, shift, mean, m2), (K, 1, G) each, of Eq. 4 on ``r`` in contiguous groups of ``g``
    (the two-pass statistics ``impl._segments.two_pass`` returns to Eq. 4)."""
    seen = []
    real = _segments.two_pass

    def spy(*a, **k):
        tp = real(*a, **k)
        seen.append(tuple(t.clone() for t in (tp.f, tp.shift, tp.mean, tp.m2)))
        return tp
    _segments.two_pass = spy
    try:
        import impl._eq47 as eq47
        eq47.two_pass = spy  # (imported by name there)
        gdpo.normalize_rewards(r, group_size=g, eps=eps)
    finally:
        _segments.two_pass = real
        eq47.two_pass = real
    return seen[0]
