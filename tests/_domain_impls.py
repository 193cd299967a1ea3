"""Implementations with a narrower domain than the contract's (tests/test_domain.py): correct
inside it, refusing outside it."""

from __future__ import annotations

from impl.gdpo import gdpo_advantages


def needs_two_columns(rewards, **kw):
    """impl.gdpo, refusing a single reward column (as some frameworks do: "needs several reward
    components")."""
    if rewards.ndim == 2 and rewards.shape[1] < 2:
        raise ValueError("needs several reward components")
    return gdpo_advantages(rewards, **kw)


def bounded_rewards(rewards, **kw):
    """impl.gdpo, refusing a reward beyond 1e6 in magnitude or a group of fewer than 4 samples."""
    if rewards.numel() and float(rewards.double().abs().max()) > 1e6:
        raise ValueError("rewards beyond 1e6 are not supported")
    return gdpo_advantages(rewards, **kw)


needs_two_columns.gdpo_domain = {"min_columns": 2, "why": "needs several reward components"}
