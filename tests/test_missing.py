"""missing="unscored" (spec/gdpo.md section 2): NaN rewards its reward functions did not score.

impl.gdpo against the oracle on the option (each output within the oracle's
``allowed(out_dtype)``, every demanded zero bit for bit), on the edges the policy decides:
group columns with 0 or 1 scored members, rows with no scored reward, units left with 0 or
1 scored rows, several units, labelled and contiguous groups, two gloo ranks. The default
(missing="refuse") refuses as before, word for word; the option on NaN-free rewards returns
the default's bits; every unscored row is counted in ``impl.gdpo.Diagnostics``. Negative
controls: NaN read as 0 before Eq. 4, and unscored rows kept in Eq. 6, fail the same judge.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from impl import adapters
from impl import gdpo as impl
from oracle import gdpo as oracle
from spec.errors import GroupError, InputDtypeError, NonFiniteError, SegmentError
from tests import _dist
from tests.test_same_names import BY_NAME, grade

NAN = math.nan

#: (name, rewards, grouping keywords, extra keywords): the policy's edges, each decided in
#: spec/gdpo.md section 2.
CASES = [
    ("scattered_and_unscored_rows",
     [[1.0, NAN], [2.0, 0.5], [NAN, NAN], [4.0, 1.0], [NAN, 3.0], [0.0, NAN], [1.0, 2.0], [NAN, NAN]],
     {"group_size": 4}, {}),
    ("column_with_one_scored",  # column 1 of group 0 has one scored member: z = 0 there
     [[1.0, 5.0], [0.0, NAN], [3.0, NAN], [2.0, 1.0], [NAN, 4.0], [1.0, 0.0]], {"group_size": 3}, {}),
    ("column_with_none_scored",
     [[1.0, NAN], [0.0, NAN], [3.0, 2.0], [2.0, 1.0]], {"group_size": 2}, {"weights": [1.0, -2.0]}),
    ("whole_group_unscored",
     [[NAN, NAN], [NAN, NAN], [3.0, 2.0], [2.0, 1.0], [1.0, 1.0], [0.0, 7.0]], {"group_size": 2}, {}),
    ("unit_of_one_scored_row",  # the second unit keeps one scored row: 0 throughout
     [[1.0, 5.0], [0.0, NAN], [NAN, NAN], [3.0, 2.0], [NAN, 1.0], [NAN, NAN]], {"group_size": 2},
     {"segment_sizes": [4, 2], "weights": [1.0, -2.0]}),
    ("unit_of_no_scored_row",
     [[1.0, 5.0], [0.0, 2.0], [NAN, NAN], [NAN, NAN], [3.0, 2.0], [2.0, 1.0]], {"group_size": 2},
     {"segment_sizes": [2, 2, 2]}),
    ("units_cut_groups",
     [[1.0, NAN], [0.0, 2.0], [NAN, NAN], [3.0, 2.0], [NAN, 1.0], [5.0, NAN], [2.0, 2.0], [0.5, NAN]],
     {"group_size": 4}, {"segment_sizes": [3, 0, 5]}),
    ("labelled_ragged_environments",  # TRL's multi-environment batch: a group is scored by its columns only
     [[1.0, NAN], [NAN, 0.25], [0.0, NAN], [NAN, 0.75], [1.0, NAN], [NAN, NAN], [NAN, 0.5]],
     {"group_ids": [7, 3, 7, 3, 7, 7, 3]}, {}),
    ("everything_unscored", [[NAN], [NAN], [NAN], [NAN]], {"group_size": 2}, {}),
    ("constant_scored_eps_zero",
     [[2.0, NAN], [2.0, 1.0], [NAN, 3.0], [1.0, 3.0]], {"group_size": 2}, {"eps": 0.0}),
    ("structural_zero_in_whole_units",  # r2 = 1 - r1 with one mask: c = 0 exactly, a = 0 demanded
     [[1.0, 0.0], [0.0, 1.0], [NAN, NAN], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [1.0, NAN], [3.0, 4.0]],
     {"group_size": 4}, {"segment_sizes": [4, 4]}),
]
_IDS = [c[0] for c in CASES]


def _kw(grouping, extra, *, step):
    return {k: v for k, v in {**grouping, **extra, "missing": "unscored"}.items()
            if k in BY_NAME[step].keywords or k == "missing"}


@pytest.mark.parametrize("name, rewards, grouping, extra", CASES, ids=_IDS)
@pytest.mark.parametrize("out_dtype, dtype", [("float64", "float64"), ("float32", "float32"),
                                              ("float16", "float64"), ("bfloat16", "float16")])
def test_advantages_match_the_oracle(name, rewards, grouping, extra, out_dtype, dtype):
    x = np.array(rewards, dtype=np.float64)
    if dtype != "float64":  # the values are exact in every input dtype used here
        assert np.array_equal(torch.tensor(x).to(getattr(torch, dtype)).double().numpy(), x, equal_nan=True)
    kw = _kw(grouping, extra, step="gdpo_advantages")
    err = grade(BY_NAME["gdpo_advantages"], impl.gdpo_advantages, x, kw, out_dtype, dtype)
    assert err is None, err


@pytest.mark.parametrize("step", ["standardize_groups", "normalize_rewards"])
@pytest.mark.parametrize("name, rewards, grouping, extra", CASES, ids=_IDS)
def test_stages_match_the_oracle(step, name, rewards, grouping, extra):
    x = np.array(rewards, dtype=np.float64)
    err = grade(BY_NAME[step], getattr(impl, step), x, _kw(grouping, extra, step=step), "float64")
    assert err is None, err


@pytest.mark.parametrize("name, rewards, grouping, extra", CASES, ids=_IDS)
def test_unscored_rows_are_zero_and_counted(name, rewards, grouping, extra):
    r = torch.tensor(rewards, dtype=torch.float64)
    d = impl.Diagnostics()
    a = impl.gdpo_advantages(r, **grouping, **extra, missing="unscored", diagnostics=d, out_dtype=torch.float64)
    unscored = torch.isnan(r).all(1)
    assert d.unscored_rows == d.unscored_rows_all_ranks == int(unscored.sum())
    assert torch.equal(d.unscored, unscored)
    assert torch.all(a[unscored] == 0) and not torch.any(torch.signbit(a[unscored]))  # +0 exactly
    assert torch.isfinite(a).all()
    res = oracle.gdpo_advantages(r.numpy(), **grouping, **extra, missing="unscored")
    assert res.required_zero[unscored.numpy()].all(), "the oracle demands the unscored rows' zeros"


def test_the_controls_fail_the_same_judge():
    """Negative controls: NaN read as 0 before Eq. 4, and unscored rows kept in Eq. 6 (both
    computed with impl's own arithmetic), are rejected where the policy matters."""
    step = BY_NAME["gdpo_advantages"]

    def nan_as_zero(t, **kw):
        kw.pop("missing")
        return impl.gdpo_advantages(torch.nan_to_num(t, nan=0.0), **kw)

    def unscored_kept(t, *, segment_sizes=None, out_dtype, **kw):
        c = impl.normalize_rewards(t, **kw)  # unscored rows: c = 0, then whitened with the rest
        return impl.whiten(c, segment_sizes=segment_sizes, out_dtype=out_dtype)

    for bad in (nan_as_zero, unscored_kept):
        rejected = []
        for name, rewards, grouping, extra in CASES:
            if name == "everything_unscored":  # nothing left to whiten either way
                continue
            x = np.array(rewards, dtype=np.float64)
            if grade(step, bad, x, _kw(grouping, extra, step="gdpo_advantages"), "float64") is not None:
                rejected.append(name)
        assert "scattered_and_unscored_rows" in rejected and len(rejected) >= 5, (bad.__name__, rejected)


# --- the default and the bits -------------------------------------------------------------------


def test_the_default_refuses_nan_word_for_word():
    r = torch.tensor([[1.0, 0.0], [NAN, 1.0]])
    for call in (lambda: impl.gdpo_advantages(r, group_size=2),
                 lambda: impl.gdpo_advantages(r, group_size=2, missing="refuse"),
                 lambda: impl.normalize_rewards(r, group_size=2),
                 lambda: impl.standardize_groups(r, group_size=2)):
        with pytest.raises(NonFiniteError) as e:
            call()
        assert str(e.value) == ("rewards[1, 0] (row 1, reward column 0, group 0 (contiguous, group_size)) "
                                "is nan")
    with pytest.raises(NonFiniteError):
        oracle.gdpo_advantages(r.numpy(), group_size=2)


_FINITE = [
    (torch.randn(24, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)), {"group_size": 4}, {}),
    (torch.randn(24, 2, generator=torch.Generator().manual_seed(2)), {"group_size": 6},
     {"segment_sizes": [12, 0, 12], "weights": [1.0, -0.5]}),
    (torch.randn(9, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3)),
     {"group_ids": [5, 1, 5, 2, 1, 5, 2, 2, 1]}, {"segment_sizes": [5, 4]}),
    (torch.tensor([[1.0], [1.0], [0.0], [1.0]]).half(), {"group_size": 2}, {"out_dtype": torch.float16}),
]


@pytest.mark.parametrize("rewards, grouping, extra", _FINITE)
def test_the_option_on_finite_rewards_returns_the_default_bits(rewards, grouping, extra):
    for fn in ("gdpo_advantages", "normalize_rewards", "standardize_groups", "group_has_signal"):
        kw = dict(extra) if fn == "gdpo_advantages" else {k: v for k, v in extra.items() if k == "weights"
                                                          and fn != "standardize_groups"}
        a = getattr(impl, fn)(rewards, **grouping, **kw)
        b = getattr(impl, fn)(rewards, **grouping, **kw, missing="unscored")
        assert a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8),
                                                  b.contiguous().view(torch.uint8)), fn


def test_diagnostics_under_refuse_count_nothing():
    d = impl.Diagnostics(unscored_rows=5)
    impl.gdpo_advantages(torch.tensor([[1.0], [0.0]]), group_size=2, diagnostics=d)
    assert (d.unscored_rows, d.unscored_rows_all_ranks) == (0, 0) and not d.unscored.any()


def test_group_has_signal_reads_the_same_c():
    r = torch.tensor([[1.0, NAN], [1.0, NAN], [NAN, NAN], [NAN, 1.0], [2.0, NAN], [0.0, 1.0]])
    c = impl.normalize_rewards(r, group_size=3, missing="unscored").view(2, 3)
    has = impl.group_has_signal(r, group_size=3, missing="unscored")
    assert has.tolist() == (c.amin(1) != c.amax(1)).tolist() == [False, True]


# --- what stays refused -------------------------------------------------------------------------


def test_infinity_is_refused_under_both_policies():
    r = torch.tensor([[1.0, NAN], [NAN, 0.0], [2.0, -math.inf], [0.0, 1.0]])
    with pytest.raises(NonFiniteError, match=r"^rewards\[2, 1\] \(row 2, reward column 1, group 1 .*\) is -inf; "
                                             r"missing='unscored' reads a NaN reward as not scored"):
        impl.gdpo_advantages(r, group_size=2, missing="unscored")
    with pytest.raises(NonFiniteError, match=r"is -inf"):
        impl.gdpo_advantages(r, group_ids=[0, 0, 1, 1], missing="unscored")  # labelled: phase one's search
    with pytest.raises(NonFiniteError):
        oracle.gdpo_advantages(r.numpy(), group_size=2, missing="unscored")


@pytest.mark.parametrize("bad", ["skip", "Unscored", None, 1, b"unscored"])
def test_a_wrong_missing_is_a_clear_error(bad):
    r = torch.tensor([[1.0], [0.0]])
    for fn in (impl.gdpo_advantages, impl.normalize_rewards, impl.standardize_groups, impl.group_has_signal):
        with pytest.raises(InputDtypeError, match=r"^missing must be 'refuse' .* or 'unscored' .*; got "):
            fn(r, group_size=2, missing=bad)
    with pytest.raises(InputDtypeError, match="missing must be"):
        oracle.gdpo_advantages(r.numpy(), group_size=2, missing=bad)
    with pytest.raises(TypeError, match="diagnostics must be an impl.gdpo.Diagnostics"):
        impl.gdpo_advantages(r, group_size=2, diagnostics={})


def test_metadata_rules_hold_whatever_is_scored():
    """A group of one row and a unit of one row are refused as without the option."""
    r = torch.tensor([[1.0], [NAN], [0.0]])
    with pytest.raises(GroupError):
        impl.gdpo_advantages(r, group_ids=[0, 0, 1], missing="unscored")
    with pytest.raises(GroupError):
        oracle.gdpo_advantages(r.numpy(), group_ids=[0, 0, 1], missing="unscored")
    r = torch.tensor([[1.0], [NAN], [0.0], [2.0], [NAN], [1.0]])
    for sizes in ([5, 1], [1, 5]):
        with pytest.raises(SegmentError):
            impl.gdpo_advantages(r, group_size=2, segment_sizes=sizes, missing="unscored")
        with pytest.raises(SegmentError):
            oracle.gdpo_advantages(r.numpy(), group_size=2, segment_sizes=sizes, missing="unscored")


# --- the adapters ------------------------------------------------------------------------------


def test_adapters_pass_the_policy_through():
    r = torch.tensor([[1.0, NAN], [2.0, 1.0], [NAN, NAN], [0.0, 0.0], [NAN, 3.0], [1.0, 2.0]])
    want = impl.gdpo_advantages(r, group_size=3, missing="unscored")
    d = impl.Diagnostics()
    got = adapters.trl_advantages(r, 3, missing="unscored", diagnostics=d)
    assert torch.equal(got, want) and d.unscored_rows == 1
    got = adapters.labelled_advantages({"a": r[:, 0], "b": r[:, 1]}, [0, 0, 0, 1, 1, 1], missing="unscored")
    assert torch.equal(got, want)
    with pytest.raises(NonFiniteError, match="rewards_per_func"):
        adapters.trl_advantages(r, 3)


# --- two gloo ranks -----------------------------------------------------------------------------

_R0 = [[1.0, NAN], [2.0, 0.5], [NAN, NAN], [4.0, 1.0]]
_R1 = [[NAN, 3.0], [0.0, NAN], [1.0, 2.0], [NAN, NAN], [5.0, 5.0], [NAN, NAN]]
#: more units than the agreement's count slots: unit 33 holds one row (refused), unit 34 one scored row of two
_MANY = [[[float(j), float(j % 3)] for j in range(2 * 40)], [[NAN, NAN]] * 2]
_MANY[0][2 * 34] = [NAN, NAN]
_SIZES_MANY = [[2] * 40, [2] + [0] * 39]
#: unit 33: one row over both ranks, and that row unscored (a count of scored rows would say 0, not 1)
_LONELY = [[2] * 33 + [1] + [2] * 6, [2] + [0] * 33 + [1] + [0] * 5]
_LONELY_R0 = [[1.0, 1.0]] * 66 + [[NAN, NAN]] + [[1.0, 1.0]] * 12


@functools.lru_cache(maxsize=None)
def _run():
    return _dist.run_group(2, [
        ("one_unit", "gdpo", {"rewards": [_R0, _R1], "group_size": 2, "missing": "unscored"}),
        ("units", "gdpo", {"rewards": [_R0, _R1], "group_size": 2, "missing": "unscored",
                           "sizes": [[2, 2], [4, 2]]}),
        ("labelled", "gdpo", {"rewards": [_R0, _R1], "group_ids": [[0, 0, 1, 1], [5, 6, 5, 6, 9, 9]],
                              "missing": "unscored"}),
        ("default", "gdpo", {"rewards": [[[1.0, 0.0], [2.0, 1.0]], [[0.0, 1.0], [3.0, 3.0]]], "group_size": 2}),
        ("disagree", "gdpo", {"rewards": [[[1.0], [0.0]], [[2.0], [1.0]]], "group_size": 2,
                              "missing": ["unscored", "refuse"]}),
        ("many_units", "gdpo", {"rewards": _MANY, "group_size": 2, "missing": "unscored", "sizes": _SIZES_MANY}),
        ("many_units_lonely", "gdpo", {"rewards": [_LONELY_R0, [[1.0, 2.0]] * 3], "group_ids":
                                       [[j // 2 for j in range(78)] + [38], [100, 100, 100]],
                                       "missing": "unscored", "sizes": _LONELY}),
    ], group_timeout_s=20.0, deadline_s=150.0)


def _gathered(name):
    recs = _run().by_rank(name)
    assert not _run().hung
    for r, rec in recs.items():
        assert rec["status"] == "ok", (name, r, rec.get("msg"))
    return recs, [float.fromhex(h) for r in sorted(recs) for h in recs[r]["result"]["hex"]]


@pytest.mark.parametrize("name, oracle_kw", [
    ("one_unit", {"group_size": 2}),
    ("units", {"group_size": 2, "unit_ids": [0, 0, 1, 1, 0, 0, 0, 0, 1, 1]}),
    ("labelled", {"group_ids": [0, 0, 1, 1, 5, 6, 5, 6, 9, 9]}),
])
def test_two_ranks_match_the_oracle_with_the_same_collectives(name, oracle_kw):
    recs, got = _gathered(name)
    res = oracle.gdpo_advantages(np.array(_R0 + _R1), missing="unscored", **oracle_kw)
    assert np.all(np.abs(np.array(got) - res.float64) <= res.allowed("float64")), (got, res.float64.tolist())
    assert np.all(np.array(got)[res.required_zero] == 0)
    plain, _ = _gathered("default")
    for r, rec in recs.items():
        assert rec["collectives"] == plain[r]["collectives"] == {"all_reduce": 2}
        assert rec["stats"][:2] == [[1, 2][r], 3]  # this rank's unscored rows, all ranks'
        assert rec["stats"][2:] == [bool(np.isnan(row).all()) for row in ([_R0, _R1][r])]


def test_ranks_must_agree_on_the_policy():
    for rec in _run().by_rank("disagree").values():
        assert rec["status"] == "error" and rec["cls"] == "DistributedError"
        assert "the missing policy differs across ranks (rank 0: 'unscored'; rank 1: 'refuse')" in rec["msg"]


def test_units_beyond_the_count_slots_keep_the_row_rule():
    """With more units than the agreement's count slots the statistics count scored rows, so
    the row counts ride beside them: a unit of one scored row of two computes (0), a unit of
    one row is refused, as within the slots."""
    _, got = _gathered("many_units")
    rows = np.array(_MANY[0] + _MANY[1])
    units = np.repeat(np.arange(41), [2] * 40 + [2])
    units[-2:] = 0  # rank 1's rows belong to its first unit
    res = oracle.gdpo_advantages(rows, group_ids=np.arange(rows.shape[0]) // 2, unit_ids=units, missing="unscored")
    assert np.all(np.abs(np.array(got) - res.float64) <= res.allowed("float64"))
    assert got[2 * 34] == got[2 * 34 + 1] == 0.0
    for rec in _run().by_rank("many_units_lonely").values():
        assert rec["status"] == "error" and rec["cls"] == "DistributedSegmentError", rec.get("msg")
        assert "unit 33 holds a single sample across all ranks" in rec["msg"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (tests/test_impl_cuda.py's rule)")
@pytest.mark.parametrize("name, rewards, grouping, extra", CASES, ids=_IDS)
def test_cuda_gives_the_cpu_bits(name, rewards, grouping, extra):
    """On CUDA the option takes its one more host read: the CPU's bits, and the same
    diagnostics."""
    r = torch.tensor(rewards, dtype=torch.float64)
    d_cpu, d_gpu = impl.Diagnostics(), impl.Diagnostics()
    a = impl.gdpo_advantages(r, **grouping, **extra, missing="unscored", diagnostics=d_cpu)
    b = impl.gdpo_advantages(r.cuda(), **grouping, **extra, missing="unscored", diagnostics=d_gpu)
    assert torch.equal(a.view(torch.int32), b.cpu().view(torch.int32))
    assert d_gpu.unscored_rows == d_cpu.unscored_rows and d_gpu.unscored.is_cuda


def test_a_refused_call_leaves_the_diagnostics_as_they_were():
    for missing, r in (("refuse", [[1.0], [NAN]]), ("unscored", [[1.0], [math.inf]])):
        d = impl.Diagnostics(unscored_rows=7)
        with pytest.raises(NonFiniteError):
            impl.gdpo_advantages(torch.tensor(r), group_size=2, missing=missing, diagnostics=d)
        assert d.unscored_rows == 7 and d.unscored is None
