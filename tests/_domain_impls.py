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


def equal_groups_only(rewards, *, group_ids=None, group_size=None, **kw):
    """impl.gdpo, refusing labelled groups of unequal sizes (a framework that reshapes (G, n, K))."""
    import torch

    if group_ids is not None:
        sizes = torch.unique(torch.as_tensor(group_ids), return_counts=True)[1]
        if sizes.numel() and bool((sizes != sizes[0]).any()):
            raise ValueError("groups of equal size only")
    return gdpo_advantages(rewards, group_ids=group_ids, group_size=group_size, **kw)


def integer_rewards_computed(rewards, **kw):
    """impl.gdpo on integer and bool rewards too, read as their values (a framework whose reward
    functions return counts)."""
    import torch

    if not rewards.is_floating_point() and not rewards.is_complex():
        rewards = rewards.to(torch.float64)
    return gdpo_advantages(rewards, **kw)


def trl_float64(rewards, num_generations, reward_weights):
    """The trl shape computed in float64 and returned in float64."""
    r = rewards.double()
    g = r.view(-1, int(num_generations), r.shape[1])
    z = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)).view(r.shape)
    c = (z * reward_weights.double()).sum(1)
    return (c - c.mean()) / (c.std() + 1e-4)
