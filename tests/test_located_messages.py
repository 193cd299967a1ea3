"""Refusals that said what is expected but not what was given, or where.

A review found messages that name neither the row nor the value:

* ``group_ids`` with a str, a None, a float among ints or an int beyond int64 gave
  "could not be read as a 1-D sequence of int64 labels (...)" for all of them; a list
  of Python floats gave "got dtype float64". Each now names the first offending row,
  its value and its type (a float *tensor* or array is still refused by its dtype, and
  the message says that the dtype is the problem, whatever the values);
* ``segment_sizes=[2.0, 2.0]`` or ``[True, 3]``: "must be a 1-D sequence or tensor of
  non-negative ints", whatever was given. Now the unit, its value and its type, or what
  the whole argument is;
* ``out_dtype="float32"`` or ``np.float32``: "got another dtype". Now the value, its
  type and the accepted torch dtypes (and the one it may have meant);
* a nested tensor was "a nested tensor (layout torch.strided); impl.gdpo reads dense
  (strided) tensors only" (torch reports a nested tensor's layout as strided);
* a weight of 2**1024 was "a number float64 cannot hold exactly": it is beyond
  float64's range, and the message says so (and eps=10**400 was reported as "eps=inf");
* rewards / values that torch cannot read ("must be a tensor or a sequence of floats")
  now name the entry (row, column, value) or the row of another length.

Under a process group the agreement carries integers: every rank's message names the
rank, the row and the type (tests/test_input_refusals.py runs them on real ranks);
the value itself, when it is text, is in the refusing rank's own (chained) error.
"""

from __future__ import annotations

import warnings
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch

from impl import adapters, gdpo
from impl import _problems as P
from impl.gdpo import GDPOError, GroupError, InputDtypeError, OutOfRangeError, SegmentError, WeightError

F64 = torch.float64
R = torch.tensor([[0.0, 1.0], [1.0, 0.0], [2.0, 2.0], [3.0, 5.0]], dtype=F64)  # N=4, K=2
V = torch.tensor([1.0, 2.0, 3.0, 5.0], dtype=F64)


def _refused(cls, pattern, fn, *args, **kwargs) -> str:
    with pytest.raises(cls, match=pattern) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, GDPOError) and type(info.value) is not GDPOError
    return str(info.value)


# --- group_ids: the first offending row, its value and its type ------------------------------------

_INT64 = r"; group labels are int64 integers \(Python ints, NumPy integers, or one integer tensor or array\)"
LABELS = [
    (["a", "a", "b", "b"], r"^group_ids\[0\] \(row 0\) is a str \('a'\)" + _INT64 + "$"),
    ([0, 0, None, None], r"^group_ids\[2\] \(row 2\) is None" + _INT64 + "$"),
    ([1, 1, 2 ** 63, 2 ** 63], r"^group_ids\[2\] \(row 2\) is an int beyond int64 \(9223372036854775808\)" + _INT64
     + r"; labels from 2\*\*63 to 2\*\*64 - 1 may be passed as a uint64 tensor$"),
    ([2 ** 64, 2 ** 64, 1, 1], r"^group_ids\[0\] \(row 0\) is an int beyond int64 \(18446744073709551616\)"),
    ([1, 1, -(2 ** 63) - 1, 0], r"^group_ids\[2\] \(row 2\) is an int beyond int64 \(-9223372036854775809\)"
     + _INT64 + "$"),  # no uint64 hint for a negative label
    ([0.0, 0.0, 1.0, 1.0], r"^group_ids\[0\] \(row 0\) is a float \(0.0\)" + _INT64 + "$"),
    ([0, 0, 1.5, 1], r"^group_ids\[2\] \(row 2\) is a float \(1.5\)"),
    ([True, True, False, False], r"^group_ids\[0\] \(row 0\) is a bool \(True\)"),
    ([0, 0, 1j, 1], r"^group_ids\[2\] \(row 2\) is a complex number \(1j\)"),
    ([0, [0], 1, 1], r"^group_ids\[1\] \(row 1\) is a list \(\[0\]\)"),
    (np.array(["a", "a", "b", "b"]), r"^group_ids\[0\] \(row 0\) is a str \(.*'a'.*\)"),
    (np.array([1, 1, None, 2], dtype=object), r"^group_ids\[2\] \(row 2\) is None"),
    ("aabb", r"^group_ids must be a 1-D sequence, tensor or array of integer labels; got a str \('aabb'\)$"),
    ({0: 1, 1: 1}, r"^group_ids must be .* integer labels; got a dict"),
]


@pytest.mark.parametrize("labels, pattern", LABELS, ids=[f"ids{i}" for i in range(len(LABELS))])
def test_a_bad_label_is_named_by_row_value_and_type(labels, pattern):
    """Each of these said "could not be read as a 1-D sequence of int64 labels (a label beyond
    int64, or values of mixed or non-numeric types)" or "got dtype float64/bool"."""
    for fn in (gdpo.gdpo_advantages, gdpo.normalize_rewards, gdpo.group_has_signal):
        _refused(GroupError, pattern, fn, R, group_ids=labels)


@pytest.mark.parametrize("labels", [torch.tensor([0.0, 0.0, 1.0, 1.0]), np.array([0.0, 0.0, 1.0, 1.0]),
                                    torch.tensor([0, 0, 1, 1], dtype=torch.bfloat16)], ids=["tensor", "numpy", "bf16"])
def test_float_labels_of_a_tensor_or_array_are_refused_by_their_dtype(labels):
    name = str(labels.dtype).replace("torch.", "")
    _refused(GroupError, rf"^group_ids must hold integer labels; got dtype {name}: float labels are refused by "
                         r"their dtype, whatever their values \(convert whole-number labels to an integer dtype\)$",
             gdpo.gdpo_advantages, R, group_ids=labels)


def test_integer_label_containers_still_work():
    want = gdpo.gdpo_advantages(R, group_ids=[5, 5, 6, 6], out_dtype=F64)
    for labels in ([np.int64(5), 5, 6, np.int32(6)], [torch.tensor(5), torch.tensor(5), 6, 6], np.array([5, 5, 6, 6]),
                   (5, 5, 6, 6)):  # a bool among them is refused (tests/test_input_refusals.py)
        got = gdpo.gdpo_advantages(R, group_ids=labels, out_dtype=F64)
        assert got.shape == want.shape


# --- segment_sizes: the unit, its value and its type ---------------------------------------------------

_SIZES = r"; segment_sizes must be a 1-D sequence or tensor of non-negative ints \(Python ints, NumPy integers\)$"
_RULE = r"^segment_sizes must be a 1-D sequence or tensor of non-negative ints"
SEGMENTS = [
    ([2.0, 2.0], r"^segment_sizes\[0\] \(unit 0\) is a float \(2.0\)" + _SIZES),
    ([True, 3], r"^segment_sizes\[0\] \(unit 0\) is a bool \(True\)" + _SIZES),
    ([2, None], r"^segment_sizes\[1\] \(unit 1\) is None" + _SIZES),
    ([2, "2"], r"^segment_sizes\[1\] \(unit 1\) is a str \('2'\)" + _SIZES),
    (np.array([2.0, 2.0]), r"^segment_sizes\[0\] \(unit 0\) is a float \(2.0\)" + _SIZES),
    (4, _RULE + r"; got an int \(4\), which is not iterable$"),
    ("22", _RULE + r"; got a string$"),
    ({0: 2, 1: 2}, _RULE + r"; got a mapping \(pass the sizes in unit order\)$"),
    ({2}, _RULE + r"; got a set \(\{2\}\): set-like, so its order is no order of units$"),
    ({2: 0, 3: 1}.keys(), _RULE + r"; got a dict_keys \(dict_keys\(\[2, 3\]\)\): set-like, so its order is no order "
                          r"of units$"),  # once said "a set, which has no order"
    (torch.tensor([2.0, 2.0]), _RULE + r"; got a tensor of dtype float32$"),
    (torch.tensor([[2, 2]]), _RULE + r"; got a 2-D tensor$"),
    ([2 ** 64, 4],
     r"^segment_sizes\[0\] \(unit 0\) is beyond int64 \(\|size\| >= 2\*\*63\): got 18446744073709551616$"),
]


@pytest.mark.parametrize("sizes, pattern", SEGMENTS, ids=[f"seg{i}" for i in range(len(SEGMENTS))])
def test_bad_segment_sizes_name_the_unit_and_what_was_given(sizes, pattern):
    """Each of these said "segment_sizes must be a 1-D sequence or tensor of non-negative ints" and no more."""
    _refused(SegmentError, pattern, gdpo.gdpo_advantages, R, group_size=2, segment_sizes=sizes)
    _refused(SegmentError, pattern, gdpo.whiten, V, segment_sizes=sizes)


def test_numpy_integer_sizes_still_work():
    want = gdpo.whiten(V, segment_sizes=[2, 2], out_dtype=F64)
    assert torch.equal(gdpo.whiten(V, segment_sizes=[np.int64(2), np.uint8(2)], out_dtype=F64), want)
    assert torch.equal(gdpo.whiten(V, segment_sizes=np.array([2, 2]), out_dtype=F64), want)


# --- out_dtype: the value, its type, the accepted dtypes ------------------------------------------------

_ACCEPTED = ", ".join(f"torch.{n}" for n in ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn",
                                              "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, n))
_OUT = r"^out_dtype must be one of " + _ACCEPTED.replace(".", r"\.") + "; got "
OUT_DTYPES = [
    ("float32", r"'float32' \(a str, not a torch\.dtype; pass torch\.float32\)$"),
    ("torch.bfloat16", r"'torch\.bfloat16' \(a str, not a torch\.dtype; pass torch\.bfloat16\)$"),
    (np.float32, r"<class 'numpy\.float32'> \(a type, not a torch\.dtype; pass torch\.float32\)$"),
    (np.dtype("float16"), r"dtype\('float16'\) \(a NumPy dtype, not a torch\.dtype; pass torch\.float16\)$"),
    ("int32", r"'int32' \(a str, not a torch\.dtype\)$"),
    (None, r"None, not a torch\.dtype$"),
    (torch.int32, r"int32$"),
    (torch.complex64, r"complex64$"),
]


@pytest.mark.parametrize("out_dtype, got", OUT_DTYPES, ids=[f"out{i}" for i in range(len(OUT_DTYPES))])
def test_a_bad_out_dtype_is_shown_with_the_accepted_ones(out_dtype, got):
    """"float32" and np.float32 said "got another dtype"."""
    _refused(InputDtypeError, _OUT + got, gdpo.gdpo_advantages, R, group_size=2, out_dtype=out_dtype)
    _refused(InputDtypeError, _OUT + got, gdpo.whiten, V, out_dtype=out_dtype)


# --- nested tensors: no self-contradictory layout -------------------------------------------------------


def test_a_nested_tensor_is_called_nested_without_a_strided_layout():
    """Said "is a nested tensor (layout torch.strided); ... reads dense (strided) tensors only"."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "The PyTorch API of nested tensors is in prototype stage"
        nested = torch.nested.nested_tensor([torch.tensor([0, 0]), torch.tensor([1, 1])])  # layout strided
        values = torch.nested.nested_tensor([torch.tensor([1.0, 2.0]), torch.tensor([3.0])])
    assert nested.layout == torch.strided and nested.is_nested
    msg = _refused(GroupError, r"^group_ids is a nested tensor; impl\.gdpo reads ordinary dense tensors only, not "
                               r"nested ones: pass one dense tensor$", gdpo.gdpo_advantages, R, group_ids=nested)
    assert "strided" not in msg
    assert "strided" not in _refused(InputDtypeError, r"^values is a nested tensor; ", gdpo.whiten, values)


# --- numbers beyond float64's range are named as such ---------------------------------------------------

_RANGE = r", beyond float64's range \(\|w\| <= 1\.797e308\)$"


@pytest.mark.parametrize("weight, shown", [
    (2 ** 1024, r"about 1\.80e\+308"), (-(2 ** 1024), r"about -1\.80e\+308"), (10 ** 5000, r"about 1\.00e\+5000"),
    (Fraction(10 ** 400), r"a Fraction \(Fraction\(1000.*\)"),
    (Decimal("1e400"), r"a Decimal \(Decimal\('1E\+400'\)\)"),
], ids=["2**1024", "-2**1024", "10**5000", "fraction", "decimal"])
def test_a_weight_beyond_float64_is_named_out_of_range(weight, shown):
    """2**1024 said "a number float64 cannot hold exactly"; Fraction(10**400) "is a Fraction", no more;
    Decimal("1e400") "is inf", a value the caller never passed."""
    _refused(WeightError, r"^weights\[1\] \(reward column 1\) is " + shown + _RANGE, gdpo.gdpo_advantages, R,
             group_size=2, weights=[1.0, weight])


def test_weights_float64_cannot_hold_exactly_and_infinities_keep_their_messages():
    _refused(WeightError, r"^weights\[0\] \(reward column 0\) is a number float64 cannot hold exactly$",
             gdpo.gdpo_advantages, R, group_size=2, weights=[2 ** 53 + 1, 1])
    _refused(WeightError, r"^weights\[0\] \(reward column 0\) is inf$", gdpo.gdpo_advantages, R, group_size=2,
             weights=[Decimal("Infinity"), 1])


def test_an_eps_beyond_float64_is_not_called_inf():
    _refused(OutOfRangeError, r"^eps is an int beyond float64's range \(\|eps\| > 1\.8e308\); eps must be finite "
                              r"and >= 0$", gdpo.whiten, V, eps=10 ** 400)


def test_group_size_beyond_int64_shows_the_value():
    _refused(GroupError, r"^group_size is beyond int64 \(\|group_size\| >= 2\*\*63\): got 1180591620717411303424$",
             gdpo.gdpo_advantages, R, group_size=2 ** 70)


# --- rewards and values torch cannot read: the entry or the row ----------------------------------------

_REAL = r"; rewards must be a tensor or a sequence of real numbers$"
ENTRIES = [
    ([[1.0, 0.0], [0.0, None], [1.0, 1.0], [0.0, 0.0]], r"^rewards\[1, 1\] \(row 1, reward column 1\) is None" + _REAL),
    ([[1.0, 0.0], [0.0], [1.0, 1.0], [0.0, 0.0]],
     r"^rewards\[1\] \(row 1\) has 1 entries but rewards\[0\] has 2: the rows of rewards must be sequences of one "
     r"length$"),
    ([[1.0, 0.0], 2.0, [1.0, 1.0], [0.0, 0.0]], r"^rewards\[1\] \(row 1\) is a float \(2\.0\) but rewards\[0\] has 2"),
    ([1.0, "x", 1.0, 0.0], r"^rewards\[1\] \(row 1\) is a str \('x'\)" + _REAL),
    ([1.0, [2.0], 1.0, 0.0], r"^rewards\[1\] \(row 1\) is a list \(\[2\.0\]\)" + _REAL),
    ([[0.5, 0.0], [0.0, 10 ** 400], [1.0, 1.0], [0.0, 0.0]],
     r"^rewards\[1, 1\] \(row 1, reward column 1\) is an int beyond float64's range \(about 1\.00e\+400\)" + _REAL),
    ([1.0, Fraction(1, 2), 1.0, 0.0], r"^rewards\[1\] \(row 1\) is a Fraction \(Fraction\(1, 2\)\)" + _REAL),
    ("1,2", r"^rewards must be a tensor or a sequence of floats; got a str \('1,2'\)$"),
]


@pytest.mark.parametrize("rewards, pattern", ENTRIES, ids=[f"r{i}" for i in range(len(ENTRIES))])
def test_rewards_torch_cannot_read_name_the_entry(rewards, pattern):
    """Each of these said "rewards must be a tensor or a sequence of floats" (and at most that
    some value does not fit float64)."""
    _refused(InputDtypeError, pattern, gdpo.gdpo_advantages, rewards, group_size=2)


def test_values_torch_cannot_read_name_the_entry():
    _refused(InputDtypeError, r"^values\[2\] \(row 2\) is a str \('3'\); values must be a tensor or a sequence of real "
                              r"numbers$", gdpo.whiten, [1.0, 2.0, "3"])


def test_the_adapters_name_the_entry_in_their_own_terms():
    _refused(InputDtypeError, r"^token_level_rewards\['acc'\]\[1, 1\] \(sample 1, response token 1\) is a str \('x'\); "
                              r"token_level_rewards\['acc'\] must be a tensor or a sequence of real numbers$",
             adapters.verl_advantages, {"acc": [[0.0, 1.0], [0.0, "x"], [1.0, 0.0], [0.0, 0.0]]}, torch.ones(4, 2),
             [0, 0, 1, 1])
    _refused(InputDtypeError, r"^rewards\['acc'\]\[2\] \(sample 2\) is a list \(\[1\]\)",
             adapters.labelled_advantages, {"acc": [1.0, 0.0, [1], 0.0]}, ["a", "a", "b", "b"])


# --- what the other ranks read: the agreement's integers alone ------------------------------------------


@pytest.mark.parametrize("code, abc, want", [
    ("P_GROUP_IDS_ITEM", (2, "K_STR", 0), "group_ids[2] (row 2) is a str; group labels are int64 integers"),
    ("P_GROUP_IDS_ITEM", (0, "K_BEYOND_INT64", 1), "group_ids[0] (row 0) is an int beyond int64 (|x| >= 2**63)"),
    ("P_GROUP_IDS_ITEM", (3, "K_FLOAT", P.float_bits(1.5)), "group_ids[3] (row 3) is a float (1.5)"),
    ("P_SEGMENTS_ITEM", (1, "K_FLOAT", P.float_bits(2.0)), "segment_sizes[1] (unit 1) is a float (2.0)"),
    ("P_SEGMENTS_ITEM", (0, "K_BOOL", 1), "segment_sizes[0] (unit 0) is a bool (True)"),
    ("P_OUT_DTYPE", (0, 0, 0), "; got a value that is not a torch.dtype"),
    ("P_WEIGHTS_INEXACT", (1, 1, 0), "weights[1] (reward column 1) is a number, beyond float64's range"),
    ("P_REWARDS_ENTRY", (1, 0, "K_NONE"), "rewards[1, 0] (row 1, reward column 0) is None"),
    ("P_REWARDS_ENTRY", (1, -1, "K_BEYOND_FLOAT64"), "rewards[1] (row 1) is an int beyond float64's range"),
    ("P_REWARDS_RAGGED", (2, 1, 3), "rewards[2] (row 2) has 1 entries but rewards[0] has 3"),
], ids=lambda x: x if isinstance(x, str) and x.startswith("P_") else None)
def test_messages_without_the_local_value_still_name_the_place(code, abc, want):
    """Under a process group every rank builds the message from the agreed integers; the refusing rank's own
    words travel in one more exchange, and where that fails these are what every rank says."""
    row = [0] * P.ROW_WIDTH
    row[P.PRESENT], row[P.HOST_CODE] = 1, getattr(P, code)
    row[P.HOST_A], row[P.HOST_B], row[P.HOST_C] = (getattr(P, x) if isinstance(x, str) else x for x in abc)
    (_, msg), = P.row_problems(row)
    assert want in msg, msg

