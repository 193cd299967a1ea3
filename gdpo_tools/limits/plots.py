"""Plots of the known-limit tables (matplotlib, Agg backend, PNG without a date stamp)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from gdpo_tools.limits import tables as T

#: Exact zeros cannot sit on a log axis: they are drawn on this floor, and the legend says so.
FLOOR = 1e-20
#: The ranges real rewards live in, shaded on the plots: rewards from 0/1 correctness up to
#: response lengths in tokens (4,096 here), and the smallest std a binary reward column with
#: signal has in a group of up to 16 samples (one sample differing from the other 15).
REAL_MAX_REWARD = 4096.0
REAL_MIN_BINARY_STD = float(np.std([1.0] + [0.0] * 15, ddof=1))
_SHADE = dict(color="tab:green", alpha=0.08, lw=0)


def _pyplot():
    import matplotlib  # optional (the [limits] extra): imported only when a plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _floored(values) -> np.ndarray:
    """Zeros (and infinities) on the floor; NaN stays NaN, a gap in the line (nothing to plot)."""
    v = np.asarray(values, dtype=np.float64)
    return np.where(np.isnan(v), np.nan, np.where(np.isfinite(v) & (v > 0), v, FLOOR))


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    _pyplot().close(fig)
    return path


def cancellation(grid, path: Path) -> Path:
    """Per C of ``grid``, `[C - d, d]` and constant-sum groups in their own unit."""
    plt = _pyplot()
    c = np.asarray(grid)
    cd, cs = ([T.measure_cancellation(*T.cancellation_case(x, kind, "own")) for x in grid] for kind in ("cd", "cs"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 6.2))
    blue, red = dict(color="tab:blue", ms=3), dict(color="tab:red", ms=3)
    green, olive = dict(color="tab:green", ms=3), dict(color="tab:olive", ms=3)
    for ax, rows, key, style, kw, label in (
        (left, cd, "exact_max", "k-", dict(lw=2), "exact max |a| (the problem)"),
        (left, cd, "cond_max", "k:", dict(lw=1.5), "max cond (one ulp of every input)"),
        (left, cd, "naive_err", "o-", red, "naive float64 error"),
        (left, cd, "impl_err", "s-", blue, "impl error (out float64)"),
        (left, cd, "trl_err", "^-", green, "TRL float32 mirror error (vs exact of its float32 inputs)"),
        (left, cd, "trl_vs_f64", "^--", olive, "TRL float32 mirror vs exact of the float64 inputs"),
        (right, cs, "naive_max", "o-", red, "naive float64 max |a|"),
        (right, cs, "impl_max", "s-", blue, "impl max |a|"),
        (right, cs, "peer_exact_max", "k--", dict(lw=1.5), "exact max |a| of the float32-rounded inputs"),
        (right, cs, "trl_err", "^-", green, "TRL float32 mirror error (vs exact of its inputs)"),
    ):
        ax.loglog(c, _floored([m[key] for m in rows]), style, label=label, **kw)
    left.set_title("[C - d, d], d = 0.1, 0.2, 0.3, 0.7, own unit")
    right.set_title("exact constant sum r2 = C - r1, own unit (exact result: 0)")
    for ax in (left, right):
        ax.axvspan(c.min(), REAL_MAX_REWARD, **_SHADE)
        ax.text(c.min() * 1.3, 1e4, f"real rewards\n(0/1 to {REAL_MAX_REWARD:,.0f}-token\nlengths)", fontsize=7,
                color="tab:green", va="top")
        ax.set_xlabel(f"C (constructed families; real rewards stay below {REAL_MAX_REWARD:,.0f})")
        ax.set_ylim(FLOOR / 3, 1e6)
        ax.grid(True, which="major", alpha=0.3)
        ax.axhline(FLOOR, color="gray", lw=0.5)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    left.set_ylabel(f"absolute error / magnitude (exact 0 drawn at {FLOOR:g})")
    fig.suptitle("GDPO cancellation: implementation error vs the problem's own conditioning")
    fig.tight_layout()
    return _save(fig, path)


def variance(offsets, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    cap = 1e3
    for dname, color in (("float64", "tab:blue"), ("float32", "tab:red")):
        cases = [T.variance_case(off, np.dtype(dname)) for off in offsets]
        for aname, style in zip(T.VARIANCE_ALGORITHMS, ("o-", "s-", "^-")):
            rel = []
            for ex, variances in cases:
                var = float(variances[aname])
                if ex == 0.0:
                    rel.append(math.nan)
                elif not var > 0.0:
                    rel.append(cap)  # negative variance or silent zero: total loss
                else:
                    rel.append(min(cap, abs(math.sqrt(var) - ex) / ex))
            ax.loglog(offsets, _floored(rel), style, color=color, ms=3, label=f"{aname} {dname}")
    ax.axhline(cap, color="gray", lw=0.5)
    ax.axvspan(min(offsets), REAL_MAX_REWARD, **_SHADE)
    ax.text(1.02, 0.12, f"shaded: offsets of real\nrewards (up to {REAL_MAX_REWARD:,.0f}-token\nlengths), whose spread "
            "is\nfar above the 0.01 drawn\nhere", fontsize=7, color="tab:green", va="top", transform=ax.transAxes)
    ax.set_xlabel("offset of the group offset + [0, 0.01, 0.02, 0.03] (a constructed family)")
    ax.set_ylabel("relative error of the std")
    ax.set_ylim(FLOOR / 3, cap * 3)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.set_title(f"Variance algorithms against offset\n(no error: drawn at {FLOOR:g}; std 0 or NaN where the "
                 f"exact is not: at {cap:g}; inputs collapsed: gap)", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def eps(stds, path: Path) -> Path:
    plt = _pyplot()
    _, d4, d6 = zip(*(T.eps_effect(s) for s in stds))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.loglog(stds, _floored(d4), "o-", label="eps 1e-4 vs 1e-8")
    ax.loglog(stds, _floored(d6), "s-", label="eps 1e-6 vs 1e-8")
    ax.set_xlim(min(stds) / 1.5, 1.0)
    ax.axvspan(REAL_MIN_BINARY_STD, 1.0, **_SHADE)
    ax.text(REAL_MIN_BINARY_STD * 0.9, 0.5, "shaded: binary rewards with\nsignal (groups up to 16);\ncontinuous scores "
            "can lie\nanywhere", fontsize=7, color="tab:green", ha="right", va="top")
    ax.set_xlabel("std of one group column")
    ax.set_ylabel("largest change of an advantage (exact)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title("How eps moves GDPO advantages as a column's std shrinks")
    fig.tight_layout()
    return _save(fig, path)
