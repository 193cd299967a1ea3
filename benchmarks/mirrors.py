"""Code shapes of the peers' GDPO, timed beside impl.gdpo (benchmarks/cpu.py, distributed.py):
verl's per-group Python loop, the reviewed implementation's Eq. 6 (four collectives per
unit) and a vectorized NumPy float64 version. TRL's normalize_then_sum is
``gdpo_tools.peer_formulas.trl_normalize_then_sum`` (the known-limit tables grade it too).
None of them is a peer's code: each is written from the formula its preset names."""

from __future__ import annotations

import numpy as np
import torch


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
