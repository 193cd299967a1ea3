"""GDPO-like advantage codes that compute another formula, written as a maintainer would,
without any declaration (tests/test_formulas.py asks conformance.diagnosis to name them).

Each takes ``(rewards (N, K) float64, labels (N,), weights (K,), units (N,) or None, eps,
tokens (N,) or None)`` and returns the advantages. They are written from the formulas'
own words (RLOO, Dr. GRPO, GRPO, PPO-style clipping, the peers' presets), per group with
plain loops, in float32 torch or float64 numpy, and share no code with the catalogue.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch


def _groups(labels):
    return [np.flatnonzero(labels == g) for g in np.unique(labels)]


def _units(units, n):
    return [np.arange(n)] if units is None else [np.flatnonzero(units == s) for s in np.unique(units)]


# ----------------------------------------------------------------- float64 numpy codes


def _combined(r, labels, w, eps):
    """Eq. 4 and 7 as the paper writes them, textbook float64: c."""
    z = np.zeros_like(r)
    for m in _groups(labels):
        x = r[m]
        z[m] = (x - x.mean(0)) / (x.std(0, ddof=1) + eps)
    c = z @ w
    return c


def paper64(r, labels, w, units, eps, tokens=None):
    """The paper's formula, textbook float64."""
    c = _combined(r, labels, w, eps)
    a = np.zeros_like(c)
    for m in _units(units, len(c)):
        a[m] = (c[m] - c[m].mean()) / (c[m].std(ddof=1) + eps)
    return a


def rloo_no_eps6(r, labels, w, units, eps, tokens=None):
    """RLOO's baseline (the mean of the others) over the group std, then whitening without eps."""
    z = np.zeros_like(r)
    for m in _groups(labels):
        x = r[m]
        n = len(m)
        others = (x.sum(0) - x) / (n - 1)
        z[m] = (x - others) / (x.std(0, ddof=1) + eps)
    c = z @ w
    a = np.zeros_like(c)
    for m in _units(units, len(c)):
        a[m] = (c[m] - c[m].mean()) / c[m].std(ddof=1)
    return a


def dr_grpo_no_eq6(r, labels, w, units, eps, tokens=None):
    """Dr. GRPO per reward (group mean subtracted, no std), weighted sum, nothing after."""
    d = np.zeros_like(r)
    for m in _groups(labels):
        d[m] = r[m] - r[m].mean(0)
    return d @ w


def batch_std(r, labels, w, units, eps, tokens=None):
    """Group mean, but each column divided by its std over the whole batch."""
    s = r.std(0, ddof=1)
    z = np.zeros_like(r)
    for m in _groups(labels):
        z[m] = (r[m] - r[m].mean(0)) / (s + eps)
    c = z @ w
    a = np.zeros_like(c)
    for m in _units(units, len(c)):
        a[m] = (c[m] - c[m].mean()) / (c[m].std(ddof=1) + eps)
    return a


def var_eps(r, labels, w, units, eps, tokens=None):
    """eps inside the square root at both equations."""
    z = np.zeros_like(r)
    for m in _groups(labels):
        x = r[m]
        z[m] = (x - x.mean(0)) / np.sqrt(x.var(0, ddof=1) + eps)
    c = z @ w
    a = np.zeros_like(c)
    for m in _units(units, len(c)):
        a[m] = (c[m] - c[m].mean()) / np.sqrt(c[m].var(ddof=1) + eps)
    return a


def fixed_eps(r, labels, w, units, eps, tokens=None):
    """Its own eps whatever the call passes: 1e-6 at Eq. 4, 1e-8 at Eq. 6."""
    z = np.zeros_like(r)
    for m in _groups(labels):
        x = r[m]
        z[m] = (x - x.mean(0)) / (x.std(0, ddof=1) + 1e-6)
    c = z @ w
    a = np.zeros_like(c)
    for m in _units(units, len(c)):
        a[m] = (c[m] - c[m].mean()) / (c[m].std(ddof=1) + 1e-8)
    return a


def grpo_weighted_sum(r, labels, w, units, eps, tokens=None):
    """GRPO on the weighted sum of the rewards (no per-reward normalisation, no Eq. 6)."""
    s = r @ w
    a = np.zeros_like(s)
    for m in _groups(labels):
        a[m] = (s[m] - s[m].mean()) / (s[m].std(ddof=1) + eps)
    return a


def centred_eq6(r, labels, w, units, eps, tokens=None):
    """Eq. 4 and 7 as the paper; Eq. 6 subtracts the batch mean only."""
    z = np.zeros_like(r)
    for m in _groups(labels):
        x = r[m]
        z[m] = (x - x.mean(0)) / (x.std(0, ddof=1) + eps)
    c = z @ w
    a = np.zeros_like(c)
    for m in _units(units, len(c)):
        a[m] = c[m] - c[m].mean()
    return a


def whole_batch(r, labels, w, units, eps, tokens=None):
    """Eq. 6 over the whole call, whatever units the call names."""
    return paper64(r, labels, w, None, eps)


def unit_mean_batch_std(r, labels, w, units, eps, tokens=None):
    """Each unit centred on its own mean, divided by the std of the whole call (heldout8 m11)."""
    c = _combined(r, labels, w, eps)
    a = np.zeros_like(c)
    for m in _units(units, len(c)):
        a[m] = (c[m] - c[m].mean()) / (c.std(ddof=1) + eps)
    return a


def per_token(r, labels, w, units, eps, tokens=None):
    """Eq. 6 weighted by each sample's token count (each token a copy of its sample's value)."""
    c = _combined(r, labels, w, eps)
    a = np.zeros_like(c)
    t = np.asarray(tokens, dtype=np.float64)
    for m in _units(units, len(c)):
        mean = np.sum(t[m] * c[m]) / np.sum(t[m])
        var = np.sum(t[m] * (c[m] - mean) ** 2) / (np.sum(t[m]) - 1)
        a[m] = (c[m] - mean) / (np.sqrt(var) + eps)
    return a


def skip_zero_std(r, labels, w, units, eps, tokens=None):
    """No eps anywhere; a column or unit whose std is 0 is left as it is."""
    z = np.zeros_like(r)
    for m in _groups(labels):
        x = r[m]
        s = x.std(0, ddof=1)
        d = x - x.mean(0)
        z[m] = np.where(s > 0, d / np.where(s > 0, s, 1.0), d)
    c = z @ w
    a = np.zeros_like(c)
    for m in _units(units, len(c)):
        s = c[m].std(ddof=1)
        a[m] = c[m] if s == 0 else (c[m] - c[m].mean()) / s
    return a


def singleton_raw(r, labels, w, units, eps, tokens=None):
    """verl's rule for a group of one: mean 0, std 1."""
    z = np.zeros_like(r)
    for m in _groups(labels):
        x = r[m]
        if len(m) == 1:
            z[m] = x / (1.0 + eps)
        else:
            z[m] = (x - x.mean(0)) / (x.std(0, ddof=1) + eps)
    c = z @ w
    return (c - c.mean()) / (c.std(ddof=1) + eps)


def nan_skipped(r, labels, w, units, eps, tokens=None):
    """NaN rewards left out of their group's statistics, their z 0 (nanmean, nanstd)."""
    z = np.zeros_like(r)
    for m in _groups(labels):
        x = r[m]
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a column of one non-NaN value: its nanstd is NaN
            mu = np.nanmean(x, 0)
            sd = np.nanstd(x, 0, ddof=1)
            z[m] = np.nan_to_num((x - mu) / (sd + eps), nan=0.0)
    c = z @ w
    return (c - c.mean()) / (c.std(ddof=1) + eps)


def nan_as_zero(r, labels, w, units, eps, tokens=None):
    """NaN rewards read as 0."""
    return paper64(np.nan_to_num(r, nan=0.0), labels, w, None, eps)


# ----------------------------------------------------------------- float32 torch codes


def _t(x):
    return torch.as_tensor(np.asarray(x, dtype=np.float64)).to(torch.float32)


def paper32(r, labels, w, units, eps, tokens=None):
    """The paper's formula in float32 torch."""
    x = _t(r)
    z = torch.zeros_like(x)
    for m in _groups(labels):
        g = x[m]
        z[m] = (g - g.mean(0)) / (g.std(0) + eps)
    c = z @ _t(w)
    a = torch.zeros_like(c)
    for m in _units(units, len(c)):
        a[m] = (c[m] - c[m].mean()) / (c[m].std() + eps)
    return a.numpy()


def rloo32(r, labels, w, units, eps, tokens=None):
    """RLOO baseline in float32, the rest as the paper."""
    x = _t(r)
    z = torch.zeros_like(x)
    for m in _groups(labels):
        g = x[m]
        n = len(m)
        z[m] = (g - (g.sum(0) - g) / (n - 1)) / (g.std(0) + eps)
    c = z @ _t(w)
    return ((c - c.mean()) / (c.std() + eps)).numpy()


def dr_grpo32(r, labels, w, units, eps, tokens=None):
    """Dr. GRPO at Eq. 4 (no std), then the paper's Eq. 6, float32."""
    x = _t(r)
    z = torch.zeros_like(x)
    for m in _groups(labels):
        z[m] = x[m] - x[m].mean(0)
    c = z @ _t(w)
    return ((c - c.mean()) / (c.std() + eps)).numpy()


def biased32(r, labels, w, units, eps, tokens=None):
    """Biased std at both equations, float32."""
    x = _t(r)
    z = torch.zeros_like(x)
    for m in _groups(labels):
        g = x[m]
        z[m] = (g - g.mean(0)) / (g.std(0, unbiased=False) + eps)
    c = z @ _t(w)
    return ((c - c.mean()) / (c.std(unbiased=False) + eps)).numpy()


def no_eq6_32(r, labels, w, units, eps, tokens=None):
    """Eq. 4 and 7 only, float32."""
    x = _t(r)
    z = torch.zeros_like(x)
    for m in _groups(labels):
        g = x[m]
        z[m] = (g - g.mean(0)) / (g.std(0) + eps)
    return (z @ _t(w)).numpy()


def clipped32(r, labels, w, units, eps, tokens=None):
    """The paper's formula in float32, advantages clipped to [-1.5, 1.5]."""
    return np.clip(paper32(r, labels, w, units, eps), np.float32(-1.5), np.float32(1.5))


def batch_std_clipped32(r, labels, w, units, eps, tokens=None):
    """Batch-level std at Eq. 4 and a clip at 1.25, float32."""
    x = _t(r)
    s = x.std(0)
    z = torch.zeros_like(x)
    for m in _groups(labels):
        z[m] = (x[m] - x[m].mean(0)) / (s + eps)
    c = z @ _t(w)
    a = (c - c.mean()) / (c.std() + eps)
    return a.clamp(-1.25, 1.25).numpy()


def singleton_zero32(r, labels, w, units, eps, tokens=None):
    """A group of one gets z = 0 (its std is NaN, turned into 0), float32."""
    x = _t(r)
    z = torch.zeros_like(x)
    for m in _groups(labels):
        if len(m) > 1:
            g = x[m]
            z[m] = (g - g.mean(0)) / (g.std(0) + eps)
    c = z @ _t(w)
    return ((c - c.mean()) / (c.std() + eps)).numpy()


def noisy32(r, labels, w, units, eps, tokens=None):
    """The paper's formula with noise of 1e-3 (a defect no formula explains)."""
    a = paper64(r, labels, w, units, eps)
    rng = np.random.default_rng(len(a))
    return (a + 1e-3 * rng.standard_normal(a.shape)).astype(np.float32)


def unscored_left_out(r, labels, w, units, eps, tokens=None):
    """NaN rewards skipped in their group's statistics (z 0); a sample no reward function
    scored (every reward NaN) is left out of Eq. 6 and gets advantage 0."""
    c = np.zeros(len(r))
    z = np.zeros_like(r)
    for m in _groups(labels):
        for k in range(r.shape[1]):
            x = r[m, k]
            ok = ~np.isnan(x)
            if ok.sum() >= 2:
                d = x[ok] - x[ok].mean()
                col = np.zeros(len(m))
                col[ok] = d / (np.sqrt((d * d).sum() / (ok.sum() - 1)) + eps)
                z[m, k] = col
    c = z @ w
    scored = ~np.isnan(r).all(axis=1)
    a = np.zeros_like(c)
    s = c[scored]
    a[scored] = (s - s.mean()) / (s.std(ddof=1) + eps)
    return a


def nan_flows_no_eq6(r, labels, w, units, eps, tokens=None):
    """No NaN handling at all and no Eq. 6: a NaN reward makes its group's advantages NaN."""
    z = np.zeros_like(r)
    for m in _groups(labels):
        x = r[m]
        z[m] = (x - x.mean(0)) / (x.std(0, ddof=1) + eps)
    return z @ w
