"""Eq. 4's two-pass statistics of a call, as the pipeline hands them to the certificate."""

from __future__ import annotations

import torch

from impl import _eq4, gdpo


def eq4_statistics(r: torch.Tensor, g: int, eps: float = 1e-6) -> tuple:
    """(f, shift, mean, m2), (K, 1, G) each, of Eq. 4 on ``r`` in contiguous groups of ``g``
    (``impl._eq4.Z.stats``; copied: m2 lives in this thread's scratch until the next call)."""
    seen = {}
    real = _eq4.finish

    def spy(*a, **k):
        z = real(*a, **k)
        seen["stats"] = tuple(t.clone() for t in z.stats)
        return z
    _eq4.finish = spy
    try:
        gdpo.normalize_rewards(r, group_size=g, eps=eps)
    finally:
        _eq4.finish = real
    return seen["stats"]
