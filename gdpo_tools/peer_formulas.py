"""The peers' float formulas, in one place: what users would otherwise run.

* :func:`formula`: a convention's published formula evaluated the way it reads (mean, then
  deviations, then std) in a given dtype: the formula catalogue's evaluator
  (``conformance.formulas``) on the preset's choices; in float32, the faithful mirror of a peer.
* :func:`nemo_rl_one_pass`: NeMo-RL's, whose one-pass variance is an algorithm, not a formula.
* :func:`trl_normalize_then_sum`: TRL's normalize_then_sum as TRL's eager torch float32 code
  computes it (its NaN-aware statistics), timed beside impl in benchmarks/ and graded in the
  known-limit tables.

None is a peer's code: each is written from the formula its preset names (spec section 8).
"""

from __future__ import annotations

import numpy as np
import torch

from conformance.formulas import evaluate_arrays, from_convention
from spec.conventions import get_convention


def _members(labels: np.ndarray) -> list[np.ndarray]:
    """Each label's rows, ascending, in label order: one sort instead of a pass per group."""
    order = np.argsort(labels, kind="stable")
    edges = np.flatnonzero(labels[order][1:] != labels[order][:-1]) + 1
    return np.split(order, edges)


def formula(convention, rewards, group_ids, unit_ids=None, weights=None, token_counts=None, dtype=np.float64):
    """``convention``'s formula as its code computes it, in ``dtype``, per whitening unit of
    ``unit_ids`` (None: one), its eps placements kept as the code writes them."""
    v = from_convention(get_convention(convention), faithful=True)
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


def nemo_rl_one_pass(rewards, group_ids, unit_ids=None, weights=None, token_counts=None, dtype=np.float32):
    """NeMo-RL's GDPO estimator in ``dtype``: per group and column the one-pass std (NaN, from a
    negative variance, mapped to 0, inf to the largest finite), then ``(x - mean) / (std + 1e-6)``
    where std > 0, the bare deviation elsewhere; Eq. 7; Eq. 6 unbiased without eps, skipped where
    the unit's std is 0."""
    dt = np.dtype(dtype)
    r = np.asarray(rewards, dtype=np.float64)
    r = (r[:, None] if r.ndim == 1 else r).astype(dt)
    n_rows, k_cols = r.shape
    w = np.ones(k_cols, dt) if weights is None else np.asarray(weights, dtype=np.float64).astype(dt)
    eps = dt.type(get_convention("nemo_rl").group_eps)
    z = np.zeros((n_rows, k_cols), dt)
    with np.errstate(all="ignore"):
        for m in _members(np.asarray(group_ids)):
            n = int(m.size)
            if n < 2:
                continue  # singleton: z = 0
            for k in range(k_cols):
                x = r[m, k]
                std = np.nan_to_num(np.sqrt(one_pass_variance(x, dt)), nan=0.0)
                dev = x - x.sum(dtype=dt) / dt.type(n)
                z[m, k] = dev / (std + eps) if std > 0 else dev
        c = (z * w).sum(axis=1, dtype=dt)
        u = np.zeros(n_rows, np.int64) if unit_ids is None else np.asarray(unit_ids)
        a = np.zeros(n_rows, dt)
        for m in _members(u):
            cu = c[m]
            std = np.sqrt(two_pass_variance(cu, dt))
            a[m] = cu if std == 0 else (cu - cu.sum(dtype=dt) / dt.type(cu.size)) / std
    return a


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
