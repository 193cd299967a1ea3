"""Labelled groups take the cheapest layout that gives the same bits.

Routes (impl._eq47 lays the groups out and runs Eq. 4 on the layout): contiguous
runs of one length take the contiguous layout; on CPU labels already in order skip the sort, and groups whose single
padded layout would more than double the rows are cut into size buckets. Each
route is a speed decision only: these tests pin that it is taken where it
should be, not taken where it would be wrong, and that the bits are those of
the general path.
"""

from __future__ import annotations

import math

import pytest
import torch

import impl._eq47 as groups_mod
import impl._pipeline as pipeline_mod
from impl import gdpo

F64 = torch.float64


def _bits(t: torch.Tensor) -> list[int]:
    return t.contiguous().view(torch.int64).tolist()


def _forbid(monkeypatch, *where):
    def refuse(*_a, **_k):
        raise AssertionError("a layout this batch must not take")

    for mod, name in where:
        monkeypatch.setattr(mod, name, refuse)


def _rewards(n, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g, dtype=F64) * 1e3 + 1e9


def _all(r, **kw):
    w = [1.0, -0.5, 3.0][: r.shape[1]]
    return (_bits(gdpo.normalize_rewards(r, weights=w, **kw)),
            _bits(gdpo.gdpo_advantages(r, weights=w, segment_sizes=[r.shape[0] - 8, 8], out_dtype=F64, **kw)),
            gdpo.group_has_signal(r, weights=w, **kw).tolist())


@pytest.mark.parametrize("size", [2, 3, 16])
def test_contiguous_runs_of_one_length_take_the_contiguous_layout(size, monkeypatch):
    r = _rewards(size * 9)
    r[size: 2 * size] = 5.0  # one group without signal
    labels = torch.tensor([40, -3, 7, 2**40, 0, 1, 9, -8, 5]).repeat_interleave(size)  # out of order
    want = _all(r, group_size=size)
    _forbid(monkeypatch, (groups_mod, "_padded"), (groups_mod, "_bucketed"))
    assert _all(r, group_ids=labels) == want


def test_a_label_in_two_runs_is_not_taken_for_contiguous_groups():
    """[1, 2, 1, 2]: G * n_max == N, but each label is two runs: Eq. 4 must pair rows 0 and 2."""
    r = _rewards(12)
    labels = torch.tensor([1, 2, 3] * 4)
    perm = torch.argsort(labels, stable=True)
    ref = gdpo.normalize_rewards(r[perm], group_size=4, weights=[1.0, -0.5, 3.0])
    got = gdpo.normalize_rewards(r, group_ids=labels, weights=[1.0, -0.5, 3.0])
    assert _bits(got[perm]) == _bits(ref)


def test_sorted_labels_skip_the_sort_on_cpu_with_the_same_bits(monkeypatch):
    sizes = torch.tensor([3, 2, 7, 2, 5, 4])
    labels = torch.repeat_interleave(torch.tensor([-5, 0, 3, 4, 90, 91]), sizes)  # in order, ragged
    r = _rewards(int(sizes.sum()))
    sorted_once = _all(r, group_ids=labels)
    real_sort = torch.sort
    calls = []

    def spy(*a, **k):
        calls.append(a[0].numel())
        return real_sort(*a, **k)

    n = labels.numel()
    monkeypatch.setattr(torch, "sort", spy)
    assert _all(r, group_ids=labels) == sorted_once
    assert n not in calls, "labels in order were sorted"
    assert _all(r, group_ids=labels.flip(0)) is not None and n in calls, "labels out of order were not sorted"
    monkeypatch.setattr(pipeline_mod, "reads_free", lambda device: False)  # as on a device where reads cost
    calls.clear()
    assert _all(r, group_ids=labels) == sorted_once and n in calls


def test_labels_in_runs_of_one_length_never_sort_the_rows_on_cpu(monkeypatch):
    """verl's layout (each uid one run, uids in no order): the facts come from the
    run heads, and the contiguous layout needs no sort of the rows at all."""
    labels = torch.tensor([40, -3, 7, 2**40, 0, 1, 9, -8, 5]).repeat_interleave(4)
    r = _rewards(labels.numel())
    want = _all(r, group_size=4)
    real_sort = torch.sort
    calls = []
    monkeypatch.setattr(torch, "sort", lambda *a, **k: calls.append(a[0].numel()) or real_sort(*a, **k))
    assert _all(r, group_ids=labels) == want
    assert calls and max(calls) == 9, calls  # the heads only


def _facts(labels, reads_free):
    lab, facts = groups_mod.label_facts(labels, reads_free=reads_free)
    return {k: int(v) for k, v in facts.items()}, lab


@pytest.mark.parametrize("seed", range(40))
def test_facts_from_the_run_heads_are_the_sorts_facts(seed):
    """Every label layout (runs of one length or ragged, a label split into several
    runs, groups of one, labels in and out of order): the CPU's facts and layout
    equal those of the full sort, whichever way CPU found them."""
    g = torch.Generator().manual_seed(seed)
    groups = int(torch.randint(1, 9, (1,), generator=g))
    sizes = torch.randint(1, 5, (groups,), generator=g) if seed % 3 else torch.full((groups,), 3)
    values = torch.randperm(50, generator=g)[:groups] * (1 - 2 * (seed % 2)) * 2**35
    labels = torch.repeat_interleave(values, sizes)
    if seed % 4 == 0:
        labels = labels[torch.randperm(labels.numel(), generator=g)]  # runs split
    elif seed % 4 == 1:
        labels = torch.sort(labels).values
    want, ref = _facts(labels, False)
    got, lab = _facts(labels, True)
    assert got == want, (labels.tolist(), got, want)
    for name in ("perm", "gid", "pos"):
        assert getattr(lab, name).tolist() == getattr(ref, name).tolist(), name


def test_cpu_cuts_groups_into_buckets_when_padding_would_double_the_rows(monkeypatch):
    """The slack of large batches set to 0: 11 groups padded to 8 rows hold 88 slots for 28
    rows, more than twice the rows (CPU's rule) but less than 4 times (every device's)."""
    sizes = torch.tensor([2] * 10 + [8])
    labels = torch.repeat_interleave(torch.arange(11), sizes)
    r = _rewards(int(sizes.sum()))
    monkeypatch.setattr(groups_mod, "PAD_SLACK", 0)
    monkeypatch.setattr(groups_mod, "CPU_PAD_FACTOR", math.inf)
    taken = []
    real = groups_mod._bucketed
    monkeypatch.setattr(groups_mod, "_bucketed", lambda *a, **k: taken.append(1) or real(*a, **k))
    padded = _all(r, group_ids=labels)
    assert not taken, "the reference (CPU_PAD_FACTOR inf) was cut into buckets: it pins nothing"
    monkeypatch.setattr(groups_mod, "CPU_PAD_FACTOR", 2)
    assert _all(r, group_ids=labels) == padded
    assert taken, "a batch padded to 3x its rows was not cut into buckets on CPU"
    taken.clear()
    monkeypatch.setattr(pipeline_mod, "reads_free", lambda device: False)  # a device where reads cost
    assert _all(r, group_ids=labels) == padded and not taken


def test_what_a_call_returns_survives_the_next_call():
    """No result is a view into work space a later call writes: normalize_rewards' c and
    standardize_groups' z keep their bits through a call on another batch, and so does c of
    one column and one group (Eq. 7's c is then z's row itself, a view of Eq. 4's layout)."""
    n = 1 << 15
    r, other = _rewards(n, seed=3), _rewards(n, seed=4) * -2.0
    c = gdpo.normalize_rewards(r, group_size=8, weights=[1.0, -0.5, 3.0])
    z = gdpo.standardize_groups(r, group_size=8)
    c_bits, z_bits = _bits(c), _bits(z)
    _all(other, group_size=8)
    assert _bits(c) == c_bits and _bits(z) == z_bits
    one = r[:, :1].contiguous()  # one column, one group of n rows
    c1 = gdpo.normalize_rewards(one, group_size=n)
    c1_bits = _bits(c1)
    gdpo.normalize_rewards(other[:, :1].contiguous(), group_size=n)
    assert _bits(c1) == c1_bits
