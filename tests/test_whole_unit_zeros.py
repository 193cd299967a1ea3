"""Spec section 7: a group without signal gets exactly zero advantage after Eq. 6 too.

In a whitening unit made of whole groups (every group with a member in the unit has all
its members there, across all ranks) the combined values' mean is exactly 0, because
Eq. 4 centres every group column; so a structural zero of c (every column of its group
collapsed, or two columns cancelling structurally) whitens to exactly 0. The oracle marks
those samples ``required_zero`` at the advantage stage and impl.gdpo returns 0 there, bit
for bit, in every output dtype, with contiguous and with labelled groups, locally and
across gloo ranks. Where a unit boundary cuts a group the unit's mean is not structurally
zero, and nothing is demanded beyond the collapse rules.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

import oracle.gdpo as og
from impl import gdpo

OUT_DTYPES = (torch.float32, torch.float64)


def _batch(seed: int, max_units: int = 4):
    """Binary rewards: 16-64 groups of 4-16 rows, K = 2-3, 1-4 units of whole groups; about a
    third of the groups without signal (every column constant in the group)."""
    rng = np.random.default_rng(seed)
    groups, n, k = int(rng.integers(16, 65)), int(rng.integers(4, 17)), int(rng.integers(2, 4))
    r = rng.integers(0, 2, (groups * n, k)).astype(float)
    for g in rng.choice(groups, groups // 3, replace=False):
        r[g * n:(g + 1) * n] = rng.integers(0, 2, k)
    units = int(rng.integers(1, max_units + 1))
    cuts = sorted(rng.choice(np.arange(1, groups), units - 1, replace=False).tolist())
    per_unit = np.diff([0] + cuts + [groups])
    sizes = [int(u) * n for u in per_unit]
    weights = [float(w) for w in rng.choice([1.0, 0.5, 2.0, -1.0, 3.0], k)]
    if all(w < 0 for w in weights):
        weights[0] = 1.0
    return r, n, sizes, weights, rng


def _no_signal(r: np.ndarray, n: int) -> np.ndarray:
    g = r.reshape(-1, n, r.shape[1])
    return np.repeat((g.min(1) == g.max(1)).all(1), n)


def _labels_shuffled_within_units(groups: int, n: int, sizes: list[int], rng) -> tuple[np.ndarray, np.ndarray]:
    """Group labels in row order and a row permutation that keeps every row in its unit (the
    groups' rows are interleaved inside each unit: the labelled path's sorted layout)."""
    labels = np.repeat(rng.permutation(groups) * 3 + 7, n)
    perm, start = [], 0
    for s in sizes:
        perm.extend((start + rng.permutation(s)).tolist())
        start += s
    return labels, np.array(perm)


def _nonzero(a: torch.Tensor, mask: np.ndarray) -> list[int]:
    return np.flatnonzero(mask & (a.double().numpy() != 0.0)).tolist()


@pytest.mark.parametrize("seed", range(40))
def test_groups_without_signal_whiten_to_exact_zero(seed):
    r, n, sizes, w, rng = _batch(seed)
    quiet = _no_signal(r, n)
    assert quiet.any()
    labels, perm = _labels_shuffled_within_units(r.shape[0] // n, n, sizes, rng)
    rt = torch.tensor(r)
    for out in OUT_DTYPES:
        a = gdpo.gdpo_advantages(rt, group_size=n, weights=w, segment_sizes=sizes, out_dtype=out)
        bad = _nonzero(a, quiet)
        assert not bad, (f"seed {seed}, {out}, group_size={n}, units {sizes}: {len(bad)} of {int(quiet.sum())} "
                         f"samples of groups without signal are not 0, first row {bad[0]}: {float(a[bad[0]])!r}")
        by_runs = gdpo.gdpo_advantages(rt, group_ids=torch.tensor(labels), weights=w, segment_sizes=sizes,
                                       out_dtype=out)
        assert not _nonzero(by_runs, quiet), f"seed {seed}, {out}, labels in runs: not 0"
        mixed = gdpo.gdpo_advantages(rt[perm], group_ids=torch.tensor(labels[perm]), weights=w,
                                     segment_sizes=sizes, out_dtype=out)
        bad = _nonzero(mixed, quiet[perm])
        assert not bad, f"seed {seed}, {out}, labels shuffled within units: rows {bad[:5]} not 0"


@pytest.mark.parametrize("seed", range(6))
def test_oracle_requires_them(seed):
    """The oracle's required_zero at the advantage stage is exactly the structural zeros of c
    in units of whole groups (here: every unit), and impl meets the demand."""
    r, n, sizes, w, _ = _batch(seed)
    gids = np.repeat(np.arange(r.shape[0] // n), n)
    res = og.gdpo_advantages(r, gids, weights=w, unit_ids=np.repeat(np.arange(len(sizes)), sizes))
    assert np.array_equal(res.required_zero, res.combined.required_zero)
    assert np.array_equal(res.required_zero, _no_signal(r, n))
    a = gdpo.gdpo_advantages(torch.tensor(r), group_size=n, weights=w, segment_sizes=sizes)
    assert not _nonzero(a, res.required_zero)
    assert np.all(res.allowed("float32")[res.required_zero] == 0.0)


def test_a_unit_boundary_that_cuts_a_group_demands_nothing():
    """Rows 0-31 no signal, rows 32-63 one 1: a boundary at row 48 cuts the second group, so
    neither unit's mean is structurally zero (no demand there), while a boundary at 32 keeps
    both units whole (demanded); one unit holding both is whole too."""
    r = np.zeros((64, 1))
    r[37, 0] = 1.0
    gids = np.repeat([0, 1], 32)
    for sizes, demanded in (([64], True), ([32, 32], True), ([16, 48], False)):
        res = og.gdpo_advantages(r, gids, unit_ids=np.repeat(np.arange(len(sizes)), sizes))
        assert bool(res.required_zero[20]) is demanded, sizes  # row 20: group 0, no signal
        if not demanded:
            assert not res.required_zero[16:].any()  # unit 1: cut group 1, and group 0's rest
    a = gdpo.gdpo_advantages(torch.tensor(r), group_size=32, segment_sizes=[64])
    assert torch.all(a[:32] == 0.0), a[:3]


def test_structural_cancellation_whitens_to_exact_zero():
    """Columns r2 = C - r1 with equal weights cancel structurally (spec section 7): their
    groups' c is exactly 0, and so is a in a unit of whole groups beside live groups."""
    rng = np.random.default_rng(3)
    d = rng.integers(0, 1000, (32, 1)) + rng.integers(0, 8, (32, 1)) / 8  # C - d exact: equal up to shift and sign
    live = rng.standard_normal((32, 1))
    r = np.concatenate([np.concatenate([1e6 - d[:16], d[:16]], 1), np.concatenate([live[16:], -2 * live[16:]], 1)])
    res = og.gdpo_advantages(r, np.repeat(np.arange(4), 8))
    assert res.required_zero[:16].all() and not res.required_zero[16:].any()
    for out in OUT_DTYPES:
        a = gdpo.gdpo_advantages(torch.tensor(r), group_size=8, segment_sizes=[32], out_dtype=out)
        assert torch.all(a[:16] == 0.0), a[:4]


def test_other_conventions_keep_their_own_policy():
    """The peers' float codes subtract a rounded batch mean: under their presets the oracle
    holds these zeros to the error bound, as before (spec/conventions.py ``collapse``)."""
    r, n, sizes, w, _ = _batch(1)
    gids = np.repeat(np.arange(r.shape[0] // n), n)
    res = og.gdpo_advantages(r, gids, weights=w, unit_ids=np.repeat(np.arange(len(sizes)), sizes), convention="trl")
    assert not res.required_zero[_no_signal(r, n)].any()


# --- across ranks ------------------------------------------------------------------------------

GROUP_TIMEOUT_S = 20.0
DEADLINE_S = 240.0


def _shards(seed: int, world: int):
    """Per rank: whole groups of a batch cut into the same units; each unit's part on a rank
    is whole groups (possibly none)."""
    rng = np.random.default_rng(1000 + seed)
    n, k = int(rng.integers(4, 17)), int(rng.integers(2, 4))
    units = int(rng.integers(1, 5))
    rewards, sizes, labels, quiet = [], [], [], []
    for rank in range(world):
        per_unit = [int(rng.integers(0 if world > 2 else 1, 6)) for _ in range(units)]
        if sum(per_unit) < 2:
            per_unit[0] += 2
        groups = sum(per_unit)
        r = rng.integers(0, 2, (groups * n, k)).astype(float)
        for g in rng.choice(groups, max(1, groups // 3), replace=False):
            r[g * n:(g + 1) * n] = rng.integers(0, 2, k)
        rewards.append(r.tolist())
        sizes.append([p * n for p in per_unit])
        labels.append(np.repeat(np.arange(groups) + 100 * rank, n).tolist())
        quiet.append(_no_signal(r, n))
    weights = [float(x) for x in rng.choice([1.0, 0.5, 2.0], k)]
    return rewards, sizes, labels, quiet, n, weights


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 4])
def test_across_gloo_ranks(world):
    sys.path.insert(0, os.path.dirname(__file__))
    import _dist

    scen, expect = [], {}
    for seed in range(3):
        rewards, sizes, labels, quiet, n, w = _shards(seed, world)
        for out in ("float32", "float64"):
            for how, kw in (("size", {"group_size": n}), ("labels", {"group_ids": labels})):
                name = f"s{seed}_{out}_{how}"
                scen.append((name, "gdpo", dict(rewards=rewards, sizes=sizes, weights=[w] * world,
                                                out_dtype=out, **kw)))
                expect[name] = quiet
    run = _dist.run_group(world, scen, group_timeout_s=GROUP_TIMEOUT_S, deadline_s=DEADLINE_S)
    assert not run.hung, f"ranks {run.hung} hung"
    for name, quiet in expect.items():
        recs = run.by_rank(name)
        for rank in range(world):
            rec = recs[rank]
            assert rec["status"] == "ok", f"{name} rank {rank}: {rec.get('cls')}: {rec.get('msg')}"
            a = np.array([float.fromhex(h) for h in rec["result"]["hex"]])
            bad = np.flatnonzero(quiet[rank] & (a != 0.0))
            assert bad.size == 0, f"{name}, rank {rank}: rows {bad[:5].tolist()} of groups without signal not 0"


@pytest.mark.parametrize("seed", range(12))
def test_labels_and_group_size_agree_on_which_units_are_whole(seed):
    """Units cut anywhere (whole or not): labels in runs (phase one's unsorted route, boundary
    rows compared), labels in runs under a row order that needs the sort, and group_size all
    decide alike, so their bits agree."""
    rng = np.random.default_rng(500 + seed)
    n, groups = int(rng.integers(2, 9)), int(rng.integers(3, 30))
    r = rng.integers(0, 3, (n * groups, 2)).astype(float)
    cuts = sorted(set(rng.integers(2, n * groups - 1, int(rng.integers(0, 4))).tolist()))
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [n * groups])]
    if any(s < 2 for s in sizes):
        sizes = [n * groups]
    rt = torch.tensor(r)
    ref = gdpo.gdpo_advantages(rt, group_size=n, segment_sizes=sizes, out_dtype=torch.float64)
    runs = torch.arange(groups).repeat_interleave(n)
    assert torch.equal(gdpo.gdpo_advantages(rt, group_ids=runs * 11 - 4, segment_sizes=sizes,
                                            out_dtype=torch.float64).view(torch.int64), ref.view(torch.int64))
    down = (groups - 1 - runs) * 3  # labels decreasing: the sorted layout
    assert torch.equal(gdpo.gdpo_advantages(rt, group_ids=down, segment_sizes=sizes,
                                            out_dtype=torch.float64).view(torch.int64), ref.view(torch.int64))


@pytest.mark.parametrize("seed", range(6))
def test_interleaved_labels_with_cut_units_stay_within_the_bound(seed):
    """Groups interleaved over the rows (the sorted route) and unit boundaries that cut some of
    them: a unit taken for whole where it is not would be centred on 0 instead of its mean."""
    rng = np.random.default_rng(900 + seed)
    n, groups = int(rng.integers(2, 7)), int(rng.integers(4, 12))
    r = rng.standard_normal((n * groups, 2)) + 3.0
    ids = rng.permutation(np.repeat(np.arange(groups), n))
    half = n * groups // 2
    sizes = [half, n * groups - half]
    res = og.gdpo_advantages(r, ids, unit_ids=np.repeat([0, 1], sizes))
    a = gdpo.gdpo_advantages(torch.tensor(r), group_ids=torch.tensor(ids), segment_sizes=sizes,
                             out_dtype=torch.float64).numpy()
    err = np.abs(a - res.float64)
    assert np.all(err <= res.allowed("float64")), (err.max(), sizes)


def test_bucketed_units_of_whole_groups():
    """Units so ragged that they are cut into size classes (the bucketed layout): each class
    takes its own units' flags (host indices for contiguous groups, no device read)."""
    from impl import _whiten as W

    n = 4
    sizes = [8] * 30 + [6, 2] + [40000]
    assert W.layout(sizes, sum(sizes), torch.device("cpu")).kind == "buckets"
    gen = torch.Generator().manual_seed(5)
    r = torch.randn(sum(sizes), 2, generator=gen, dtype=torch.float64)
    r[4:8] = 1.0  # a group without signal in a unit of two whole groups
    r[252:256] = 0.0  # one in the unit of 40000 rows (from row 248)
    a = gdpo.gdpo_advantages(r, group_size=n, segment_sizes=sizes, out_dtype=torch.float64)
    assert torch.all(a[4:8] == 0.0) and torch.all(a[252:256] == 0.0)
    labels = torch.arange(sum(sizes) // n).repeat_interleave(n)
    assert torch.equal(gdpo.gdpo_advantages(r, group_ids=labels, segment_sizes=sizes,
                                            out_dtype=torch.float64).view(torch.int64), a.view(torch.int64))
