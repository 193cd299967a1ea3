"""The peers' float formulas, in one place: what users would otherwise run.

Two kinds, imported by the known-limit tables, audit, the benchmarks and the tests:

* ``formula(convention, ...)``: each convention's published formula evaluated the way it
  reads (mean, then deviations, then std), in the dtype asked for, with the convention's
  ddof, eps placement, singleton, NaN and whitening rules (spec/conventions.py): the formula
  catalogue's evaluator (``conformance.formulas``) on the preset's choices. In float64 on
  well-conditioned inputs it agrees with the oracle under the same convention
  (tests/test_oracle_presets.py); in float32 it is the faithful mirror of a peer.
  ``nemo_rl_one_pass`` is NeMo-RL's, whose one-pass variance is an algorithm, not a formula.
* eager torch mirrors of the peers' code shapes, there to be timed side by side
  (benchmarks/): ``trl_normalize_then_sum`` (TRL's normalize_then_sum, float32),
  ``verl_group_loop`` (verl's per-group Python loop), ``per_unit_protocol`` (the
  reviewed implementation's Eq. 6, four collectives per unit), ``numpy_gdpo`` (a
  vectorized numpy float64 version).

None of them is a peer's code: each is written from the formula its preset names
(spec section 8); the real packages are graded through impl/adapters.py-style adapters.
"""

from __future__ import annotations

import numpy as np
import torch

from spec.conventions import get_convention


def _members(labels: np.ndarray) -> list[np.ndarray]:
    """Each label's rows, ascending, in label order: one sort instead of a pass per group."""
    order = np.argsort(labels, kind="stable")
    edges = np.flatnonzero(labels[order][1:] != labels[order][:-1]) + 1
    return np.split(order, edges)


def formula(convention, rewards, group_ids, unit_ids=None, weights=None, token_counts=None,
            dtype=np.float64, eps=None):
    """``convention``'s formula as its code computes it (mean, then deviations, then std), in
    ``dtype``, per whitening unit of ``unit_ids`` (None: one): the formula catalogue's evaluator
    (``conformance.formulas``, the one place GDPO's variants are written) on the preset's choices,
    its eps placements kept as the code writes them; ``eps`` overrides both eps."""
    from conformance.formulas import _with, evaluate_arrays, from_convention

    v = from_convention(get_convention(convention), faithful=True)
    if eps is not None:
        v = _with(v, group_eps=float(eps), whiten_eps=float(eps))
    return evaluate_arrays(rewards, np.asarray(group_ids), v, units=unit_ids, weights=weights,
                           token_counts=token_counts, dtype=np.dtype(dtype).name)


def nemo_rl_one_pass(rewards, group_ids, unit_ids=None, weights=None, token_counts=None, dtype=np.float32):
    """NeMo-RL's GDPO estimator in ``dtype``: per group and column a one-pass
    variance ``(sum x^2 / n - (sum x / n)^2) * n / (n - 1)``, its square root with
    NaN (negative variance) mapped to 0 and inf to the largest finite value, then
    ``(x - mean) / (std + 1e-6)`` where std > 0, the bare deviation elsewhere;
    Eq. 7; Eq. 6 unbiased without eps, skipped where the unit's std is 0."""
    conv = get_convention("nemo_rl")
    dt = np.dtype(dtype)
    r = np.asarray(rewards, dtype=np.float64)
    r = (r[:, None] if r.ndim == 1 else r).astype(dt)
    n_rows, k_cols = r.shape
    w = np.ones(k_cols, dt) if weights is None else np.asarray(weights, dtype=np.float64).astype(dt)
    g = np.asarray(group_ids)
    eps = dt.type(conv.group_eps)
    z = np.zeros((n_rows, k_cols), dt)
    with np.errstate(all="ignore"):
        for m in _members(g):
            n = int(m.size)
            if n < 2:
                continue  # singleton: z = 0
            for k in range(k_cols):
                x = r[m, k]
                mean = x.sum(dtype=dt) / dt.type(n)
                mean_sq = (x * x).sum(dtype=dt) / dt.type(n)
                var = (mean_sq - mean * mean) * (dt.type(n) / dt.type(n - 1))
                std = np.nan_to_num(np.sqrt(var), nan=0.0)
                dev = x - mean
                z[m, k] = dev / (std + eps) if std > 0 else dev
        c = (z * w).sum(axis=1, dtype=dt)
        u = np.zeros(n_rows, np.int64) if unit_ids is None else np.asarray(unit_ids)
        a = np.zeros(n_rows, dt)
        for m in _members(u):
            cu = c[m]
            mean = cu.sum(dtype=dt) / dt.type(cu.size)
            dev = cu - mean
            std = np.sqrt((dev * dev).sum(dtype=dt) / dt.type(cu.size - 1))
            a[m] = cu if std == 0 else dev / std
    return a


# ------------------------------------------------ eager torch mirrors (timed in benchmarks/)


def trl_normalize_then_sum(rewards: torch.Tensor, num_generations: int, weights: torch.Tensor,
                           eps: float = 1e-4) -> torch.Tensor:
    r = rewards.to(torch.float32)
    n, k = r.shape
    grouped = r.view(-1, num_generations, k)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True)
    z = ((grouped - mean) / (std + eps)).view(n, k)
    c = torch.nansum(z * weights.to(torch.float32), dim=1)
    return (c - c.mean()) / (c.std() + eps)


def verl_group_loop(rewards: torch.Tensor, index: list, weights: list, eps: float = 1e-6) -> torch.Tensor:
    n, k = rewards.shape
    out = torch.zeros(n, dtype=torch.float32)
    for col in range(k):
        scores = rewards[:, col].to(torch.float32)
        id2score: dict = {}
        for i in range(n):
            id2score.setdefault(index[i], []).append(scores[i])
        id2mean, id2std = {}, {}
        for key, vals in id2score.items():
            if len(vals) == 1:
                id2mean[key], id2std[key] = torch.tensor(0.0), torch.tensor(1.0)
            else:
                t = torch.stack(vals)
                id2mean[key], id2std[key] = t.mean(), t.std()
        for i in range(n):
            out[i] += weights[col] * (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + eps)
    return out


def per_unit_protocol(values: torch.Tensor, segment_sizes: list, group=None, eps: float = 1e-4) -> torch.Tensor:
    import torch.distributed as dist

    def reduce(t, op=None):
        if group is not None:
            dist.all_reduce(t, op=op or dist.ReduceOp.SUM, group=group)
        return t

    v = values.to(torch.float64)
    out = torch.empty_like(v)
    start = 0
    for size in segment_sizes:
        seg = v[start:start + size]
        bad = reduce(torch.tensor([float(not torch.isfinite(seg).all())], dtype=torch.float64),
                     dist.ReduceOp.MAX if group is not None else None)
        if bad.item():
            raise ValueError("non-finite values")
        cnt = reduce(torch.tensor([float(size)], dtype=torch.float64))
        mean = reduce(seg.sum().reshape(1)) / cnt
        m2 = reduce(((seg - mean) ** 2).sum().reshape(1))
        std = torch.sqrt(m2 / (cnt - 1))
        out[start:start + size] = (seg - mean) / (std + eps)
        start += size
    return out.to(torch.float32)


def numpy_gdpo(rewards: np.ndarray, group_size: int, weights: np.ndarray, unit_sizes: list,
               eps: float = 1e-4) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    n, k = r.shape
    g = r.reshape(-1, group_size, k)
    dev = g - g.mean(axis=1, keepdims=True)
    std = np.sqrt((dev * dev).sum(axis=1, keepdims=True) / (group_size - 1))
    c = ((dev / (std + eps)).reshape(n, k) * weights).sum(axis=1)
    out = np.empty(n)
    start = 0
    for size in unit_sizes:
        seg = c[start:start + size]
        out[start:start + size] = (seg - seg.mean()) / (seg.std(ddof=1) + eps)
        start += size
    return out.astype(np.float32)
