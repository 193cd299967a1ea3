"""The peers' float formulas, in one place: what users would otherwise run.

* :func:`formula`: a convention's published formula evaluated the way it reads (mean, then
  deviations, then std) in a given dtype: the formula catalogue's evaluator
  (``conformance.formulas``) on the preset's choices; in float32, the faithful mirror of a peer.
* :func:`trl_normalize_then_sum`: TRL's normalize_then_sum as TRL's eager torch float32 code
  computes it (its NaN-aware statistics), timed beside impl in benchmarks/ and graded in the
  known-limit tables.

None is a peer's code: each is written from the formula its preset names (spec section 8).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from conformance.formulas import evaluate_arrays, from_convention
from spec.conventions import get_convention


def formula(convention, rewards, group_ids, unit_ids=None, weights=None, token_counts=None, dtype=np.float64,
            one_pass=False):
    """``convention``'s formula as its code computes it, in ``dtype``, per whitening unit of
    ``unit_ids`` (None: one), its eps placements kept as the code writes them; ``one_pass``: its
    group variance one-pass, as NeMo-RL's code computes it."""
    v = from_convention(get_convention(convention), faithful=True)
    v = dataclasses.replace(v, group_variance="one_pass") if one_pass else v
    return evaluate_arrays(rewards, np.asarray(group_ids), v, units=unit_ids, weights=weights,
                           token_counts=token_counts, dtype=np.dtype(dtype).name)


def one_pass_variance(x: np.ndarray, dt: np.dtype):
    """The unbiased variance ``(sum x^2 / n - (sum x / n)^2) * n / (n - 1)`` in ``dt``: one
    pass over the data, cancelling catastrophically once the mean dwarfs the spread."""
    n = x.size
    mean = x.sum(dtype=dt) / dt.type(n)
    return ((x * x).sum(dtype=dt) / dt.type(n) - mean * mean) * (dt.type(n) / dt.type(n - 1))


def two_pass_variance(x: np.ndarray, dt: np.dtype):
    """The unbiased variance in ``dt``: the mean, then the squared deviations from it."""
    dev = x - x.sum(dtype=dt) / dt.type(x.size)
    return (dev * dev).sum(dtype=dt) / dt.type(x.size - 1)


def trl_normalize_then_sum(rewards: torch.Tensor, num_generations: int, weights: torch.Tensor,
                           eps: float = 1e-4) -> torch.Tensor:
    """TRL 1.16's normalize_then_sum: NaN-aware means, TRL's std (below), a row whose every reward
    is NaN (unscorable) given advantage 0."""
    r = rewards.to(torch.float32)
    n, k = r.shape
    unscorable = torch.isnan(r).all(dim=1)
    grouped = r.view(-1, num_generations, k)
    z = (grouped - torch.nanmean(grouped, dim=1, keepdim=True)) / (_trl_nanstd(grouped, dim=1) + eps)
    c = torch.nansum(z.view(n, k) * weights.to(torch.float32), dim=1)
    c[unscorable] = torch.nan
    return torch.nan_to_num((c - torch.nanmean(c)) / (_trl_nanstd(c) + eps), nan=0.0)


def _trl_nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """TRL's std, ignoring NaNs: the mean of the squared deviations, times count / (count - 1), in
    x's dtype. Its squares overflow float32 where a deviation passes 2**64 (the std is then inf and
    z a silent 0); ``Tensor.std`` on CPU would not."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    var = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True)
    var *= torch.where(count > 1, count / (count - 1), torch.nan)
    return var.sqrt()
