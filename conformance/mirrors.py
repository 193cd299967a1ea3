"""Straightforward array evaluations of each convention's published formula.

``formula(conv, ...)`` evaluates Eq. 4, Eq. 7 and Eq. 6 the way the formula reads
(mean, then deviations, then std), in the dtype asked for, with the convention's
ddof, eps placement, singleton, NaN and whitening rules. In float64 on
well-conditioned inputs it must agree with the oracle under the same convention
(tests/test_oracle_presets.py); in float32 it is the faithful mirror of a peer.
"""

from __future__ import annotations

import numpy as np

from spec.conventions import Convention, get_convention


def _divide(dev, std, var, eps, placement):
    if placement == "std":
        return dev / (std + eps)
    if placement == "var":
        return dev / np.sqrt(var + eps)
    if placement == "std_if_positive":
        return dev / (std + eps) if std > 0 else dev
    return dev / std if std > 0 else dev  # skip_if_zero


def formula(convention, rewards, group_ids, unit_ids=None, weights=None, token_counts=None,
            dtype=np.float64, eps=None):
    conv: Convention = get_convention(convention)
    dt = np.dtype(dtype)
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim == 1:
        r = r[:, None]
    r = r.astype(dt)
    N, K = r.shape
    w = np.ones(K, dt) if weights is None else np.asarray(weights, dtype=np.float64).astype(dt)
    g = np.asarray(group_ids)
    eg = dt.type(conv.group_eps if eps is None else eps)
    ew = dt.type(conv.whiten_eps if eps is None else eps)
    if conv.nan == "zero_first":
        r = np.where(np.isnan(r), dt.type(0), r)
    z = np.zeros((N, K), dt)
    for label in np.unique(g):
        m = g == label
        for k in range(K):
            x = r[m, k]
            if conv.nan == "nan_aware":
                ok = ~np.isnan(x)
                vals = x[ok]
            else:
                ok = np.ones(x.size, bool)
                vals = x
            n = vals.size
            if n < 2 and conv.group_ddof == 1:
                out = np.zeros(x.size, dt)
                if conv.singleton == "raw" and x.size == 1:
                    out = x / (dt.type(1) + eg)
                z[m, k] = out
                continue
            mean = vals.mean(dtype=dt)
            dev = vals - mean
            var = (dev * dev).sum(dtype=dt) / dt.type(n - conv.group_ddof)
            std = np.sqrt(var)
            zz = np.zeros(x.size, dt)
            zz[ok] = _divide(dev, std, var, eg, conv.group_eps_placement)
            z[m, k] = zz
    c = (z * w).sum(axis=1, dtype=dt)
    if conv.whiten == "none":
        return c
    u = np.zeros(N, np.int64) if unit_ids is None else np.asarray(unit_ids)
    t = np.ones(N, dt) if conv.whiten == "per_sample" else np.asarray(token_counts).astype(dt)
    a = np.zeros(N, dt)
    for label in np.unique(u):
        m = u == label
        cu, tu = c[m], t[m]
        T = tu.sum(dtype=dt)
        mean = (tu * cu).sum(dtype=dt) / T
        dev = cu - mean
        var = (tu * dev * dev).sum(dtype=dt) / (T - dt.type(conv.whiten_ddof))
        std = np.sqrt(var)
        if conv.whiten_eps_placement == "skip_if_zero" and std == 0:
            a[m] = cu
        else:
            a[m] = _divide(dev, std, var, ew, conv.whiten_eps_placement)
    return a
