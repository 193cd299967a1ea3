"""Group labels in messages are the caller's own values.

uint64 labels at or beyond 2**63 travel as int64 (their bits: equal labels stay equal,
so the grouping is right) and used to be printed wrapped: a group of one labelled
2**64 - 1 was reported as "group label -1", a label the caller never passed. The facts
row carries whether a rank's labels are uint64 (``LABELS_UINT64``) and every message
built from it prints the caller's value, on that rank's row only."""

import math

import numpy as np
import pytest
import torch

from impl import _problems as P
from impl import adapters, gdpo
from impl._inputs import check_rewards
from spec.errors import GroupError, NonFiniteError, OutOfRangeError

TOP = 2 ** 64 - 1  # int64 bits: -1
HALF = 2 ** 63  # int64 bits: -2**63


def _row(uint64: bool, **fields) -> list[int]:
    row = [0] * P.ROW_WIDTH
    row[P.PRESENT], row[P.BY_LABEL], row[P.ROWS], row[P.K] = 1, 1, 4, 2
    row[P.SINGLETON] = 4  # no group of one unless a field says so
    row[P.LABELS_UINT64] = int(uint64)
    for name, value in fields.items():
        row[getattr(P, name)] = value
    return row


def _message(row) -> tuple[type, str]:
    with pytest.raises(P.GDPOError) as info:
        P.raise_local(row)
    return type(info.value), str(info.value)


# --- the facts row: every label field is printed as the caller's value -------------------------------


def test_group_of_one_names_the_uint64_label():
    cls, msg = _message(_row(True, SINGLETON=2, SINGLETON_LABEL=-1))
    assert cls is GroupError
    assert msg.startswith(f"group label {TOP} (first row 2) has 1 sample"), msg


def test_nonfinite_reward_names_the_uint64_label():
    row = _row(True, NF_REWARD=5, NF_REWARD_KIND=P.float_bits(math.nan), NF_REWARD_GROUP=-(2 ** 63))
    cls, msg = _message(row)
    assert cls is NonFiniteError
    assert msg == f"rewards[2, 1] (row 2, reward column 1, group label {HALF}) is nan"


def test_eq7_overflow_names_the_uint64_label():
    row = _row(True, C_OVERFLOW=3, C_OVERFLOW_BITS=P.float_bits(math.inf), C_OVERFLOW_GROUP=-2)
    cls, msg = _message(row)
    assert cls is OutOfRangeError
    assert f"at row 3 (group label {TOP - 1})" in msg, msg


def test_int64_labels_stay_signed():
    """A negative int64 label is the caller's own: printed as it is."""
    _, msg = _message(_row(False, SINGLETON=1, SINGLETON_LABEL=-1))
    assert msg.startswith("group label -1 (first row 1)"), msg


def test_each_ranks_row_is_read_with_its_own_label_dtype():
    """Across ranks every rank builds the message from the same table, so each rank's
    labels are decoded by the flag in its own row: rank 0 passed uint64, rank 1 int64."""
    table = [_row(True, SINGLETON=2, SINGLETON_LABEL=-1), _row(False, SINGLETON=3, SINGLETON_LABEL=-1)]
    reasons = P.table_problems(table)
    assert f"rank 0: GroupError: group label {TOP} (first row 2) has 1 sample" in reasons[0]
    assert "rank 1: GroupError: group label -1 (first row 3) has 1 sample" in reasons[1]


def test_the_flag_lives_in_a_host_column_of_the_row():
    """The flag is a host field (never overwritten by device facts) inside the row."""
    assert P.LABELS_UINT64 < P.COUNTS and P.LABELS_UINT64 not in P.DEVICE_FIELDS
    used = {getattr(P, n) for n in dir(P) if n.isupper() and isinstance(getattr(P, n), int)
            and getattr(P, n) < P.COUNTS and not n.startswith(("P_", "API_"))} - {P.LABELS_UINT64}
    assert P.LABELS_UINT64 not in used


# --- the host knows the labels' dtype at call time ------------------------------------------------------


@pytest.mark.parametrize("labels, flag", [
    (torch.tensor([TOP, TOP, 5, 5], dtype=torch.uint64), True),
    (np.array([TOP, TOP, 5, 5], dtype=np.uint64), True),
    (torch.tensor([1, 1, 5, 5], dtype=torch.uint64), True),  # uint64 whatever the values
    (torch.tensor([-1, -1, 5, 5]), False),
    ([3, 3, 5, 5], False),
    (torch.tensor([255, 255, 5, 5], dtype=torch.uint8), False),  # fits int64 exactly
], ids=["uint64_tensor", "uint64_ndarray", "uint64_small", "int64_tensor", "list", "uint8"])
def test_check_rewards_records_uint64_labels(labels, flag):
    inp = check_rewards(torch.rand(4, 2), labels, None, None, allow_empty_rows=False)
    assert inp.labels_uint64 is flag and inp.labels.dtype == torch.int64


def test_check_rewards_without_labels_has_no_uint64_flag():
    inp = check_rewards(torch.rand(4, 2), None, 2, None, allow_empty_rows=False)
    assert inp.labels_uint64 is False


def test_uint64_labels_group_by_their_values():
    """Labels beyond int64 group exactly as their int64 bits, equal labels together."""
    r = torch.tensor([[1.0], [0.0], [3.0], [5.0], [2.0], [2.5]], dtype=torch.float64)
    big = torch.tensor([TOP, HALF, TOP, HALF, 7, 7], dtype=torch.uint64)
    want = gdpo.gdpo_advantages(r, group_ids=[0, 1, 0, 1, 2, 2], out_dtype=torch.float64)
    assert torch.equal(gdpo.gdpo_advantages(r, group_ids=big, out_dtype=torch.float64), want)


def test_direct_calls_name_the_uint64_label():
    r = torch.tensor([[1.0], [0.0], [3.0]], dtype=torch.float64)
    with pytest.raises(GroupError, match=rf"^group label {TOP} \(first row 2\) has 1 sample"):
        gdpo.gdpo_advantages(r, group_ids=torch.tensor([HALF, HALF, TOP], dtype=torch.uint64))


# --- through the adapters: they know the labels they were given --------------------------------------


UINT64_LABELS = [7, 7, HALF, HALF, TOP]


@pytest.mark.parametrize("form", [lambda x: torch.tensor(x, dtype=torch.uint64),
                                  lambda x: np.array(x, dtype=np.uint64)], ids=["tensor", "ndarray"])
def test_adapters_name_the_uint64_label_of_a_group_of_one(form):
    labels = form(UINT64_LABELS)
    with pytest.raises(GroupError) as info:
        adapters.labelled_advantages({"acc": torch.rand(5)}, labels)
    assert str(info.value).startswith(f"group label {TOP} (first sample 4) has 1 sample"), str(info.value)
    with pytest.raises(GroupError) as info:
        adapters.verl_advantages({"acc": torch.rand(5, 2)}, torch.ones(5, 2), labels)
    assert str(info.value).startswith(f"group label {TOP} (first sample 4) has 1 sample"), str(info.value)


def test_adapters_name_the_uint64_label_of_a_nonfinite_reward():
    fmt = torch.tensor([0.0, 1.0, math.nan, 2.0, 1.0])
    with pytest.raises(NonFiniteError) as info:
        adapters.labelled_advantages({"acc": torch.rand(5), "fmt": fmt},
                                     torch.tensor(UINT64_LABELS[:4] + [7], dtype=torch.uint64))
    assert str(info.value) == f"rewards['fmt'][2] (sample 2, group label {HALF}) is nan"
    tok = torch.rand(5, 2)
    tok[2, 1] = math.inf
    with pytest.raises(NonFiniteError) as info:
        adapters.verl_advantages({"acc": tok}, torch.ones(5, 2), torch.tensor(UINT64_LABELS[:4] + [7],
                                                                             dtype=torch.uint64))
    assert str(info.value) == f"token_level_rewards['acc'][2, 1] (sample 2, response token 1, group label {HALF}) is inf"


# --- groups of one: the first named, all counted -----------------------------------------------------

ONES = [  # (labels, first row, its label, how many groups of one); sorted and run layouts both
    ([0, 0, 0, 0, 1, 2, 2, 2, 2, 3, 4, 4, 4, 4], 4, 1, 2),  # runs, at most half the rows heads: run-head path
    ([0, 0, 1, 2, 2, 3, 4], 2, 1, 3),  # runs, but most rows heads: the full sort
    ([4, 0, 3, 0, 1, 1, 9], 0, 4, 3),  # interleaved: the full sort
    ([7, 5, 5, 6, 6], 0, 7, 1),
    ([0, 1, 2, 3], 0, 0, 4),  # every group of one
]


@pytest.mark.parametrize("labels, row, label, count", ONES)
def test_a_group_of_one_refusal_counts_the_others(labels, row, label, count):
    """It used to name the first group of one only: a batch with many read as one to fix."""
    others = {1: "", 2: ", as does 1 other group"}.get(count, f", as do {count - 1} other groups")
    want = f"group label {label} (first row {row}) has 1 sample{others}; Eq. 4 needs at least 2 (unbiased std)"
    r = torch.arange(len(labels) * 2, dtype=torch.float64).view(-1, 2)
    for fn in (gdpo.gdpo_advantages, gdpo.normalize_rewards, gdpo.group_has_signal):
        with pytest.raises(GroupError) as info:
            fn(r, group_ids=torch.tensor(labels))
        assert str(info.value) == want


def test_each_rank_counts_its_own_groups_of_one():
    table = [_row(False, SINGLETON=2, SINGLETON_LABEL=5, SINGLETONS=3), _row(False, SINGLETON=1, SINGLETON_LABEL=8,
                                                                            SINGLETONS=1)]
    reasons = P.table_problems(table)
    assert "rank 0: GroupError: group label 5 (first row 2) has 1 sample, as do 2 other groups; Eq. 4" in reasons[0]
    assert "rank 1: GroupError: group label 8 (first row 1) has 1 sample; Eq. 4" in reasons[1]
