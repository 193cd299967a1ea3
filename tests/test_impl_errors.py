"""Every refusal of the contract: the class (spec.errors) and that the message
names the place (group label, reward column, row, unit, rank).

Cases are data, ``(id, function, args, kwargs, error class, message regex)``,
in the manner of OpInfo's ``ErrorInput``."""

import math
import subprocess
import sys
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch

from impl import gdpo
from impl.gdpo import (
    GDPOError,
    GroupError,
    InputDtypeError,
    NonFiniteError,
    OutOfRangeError,
    SegmentError,
    ShapeError,
    WeightError,
)

F64 = torch.float64
R = torch.tensor([[0.0, 1.0], [1.0, 0.0], [2.0, 2.0], [3.0, 5.0]], dtype=F64)  # N=4, K=2


def _with(value, row, col, base=R):
    r = base.clone()
    r[row, col] = value
    return r


N = gdpo.normalize_rewards
A = gdpo.gdpo_advantages
S = gdpo.group_has_signal
Wh = gdpo.whiten

CASES = [
    # --- rewards: dtype, shape, emptiness, finiteness --------------------------------------
    ("int64_rewards", N, (R.long(),), {"group_size": 2}, InputDtypeError, r"rewards has dtype int64"),
    ("bool_rewards", N, (R > 0,), {"group_size": 2}, InputDtypeError, r"rewards has dtype bool"),
    ("complex_rewards", N, (R.to(torch.complex128),), {"group_size": 2}, InputDtypeError, r"complex128"),
    # a Python list has no dtype: its ints are values (issue 18, spec/errors.py); a bool in it is refused
    ("bool_in_list_rewards", A, ([1, 2, True, 4],), {"group_size": 2}, InputDtypeError, r"rewards\[2\].* a bool"),
    ("empty_rows", N, (torch.empty(0, 2, dtype=F64),), {"group_size": 2}, ShapeError, r"empty \(N=0 rows, K=2"),
    ("empty_columns", N, (torch.empty(4, 0, dtype=F64),), {"group_size": 2}, ShapeError, r"K=0"),
    ("empty_1d", A, (torch.empty(0),), {"group_size": 2}, ShapeError, r"empty"),
    ("three_d", N, (R[None],), {"group_size": 2}, ShapeError, r"3-D"),
    ("scalar", N, (torch.tensor(1.0),), {"group_size": 2}, ShapeError, r"0-D"),
    ("nan", N, (_with(math.nan, 2, 1),), {"group_size": 2}, NonFiniteError,
     r"rewards\[2, 1\] \(row 2, reward column 1, group 1 .*\) is nan"),
    ("inf", A, (_with(math.inf, 1, 0),), {"group_size": 2}, NonFiniteError,
     r"row 1, reward column 0, group 0 .* is inf"),
    ("neg_inf_labelled", S, (_with(-math.inf, 3, 1),), {"group_ids": [7, 9, 9, 7]}, NonFiniteError,
     r"row 3, reward column 1, group label 7\) is -inf"),
    ("first_of_two_nans", N, (_with(math.nan, 1, 1, _with(math.nan, 3, 0)),), {"group_size": 2},
     NonFiniteError, r"rewards\[1, 1\]"),
    ("float32_nan", A, (_with(math.nan, 0, 0).float(),), {"group_size": 4}, NonFiniteError, r"rewards\[0, 0\]"),
    # --- groups -------------------------------------------------------------------------------
    ("neither", N, (R,), {}, GroupError, r"exactly one of group_ids and group_size \(got neither\)"),
    ("both", N, (R,), {"group_size": 2, "group_ids": [0, 0, 1, 1]}, GroupError, r"not both"),
    ("group_size_one", N, (R,), {"group_size": 1}, GroupError, r"group_size=1: .* at least 2"),
    ("group_size_not_dividing", A, (R,), {"group_size": 3}, GroupError,
     r"N=4 rows is not a multiple of group_size=3: the last group would hold 1"),
    ("group_size_float", N, (R,), {"group_size": 2.0}, GroupError, r"group_size must be a Python int"),
    ("group_of_one_label", N, (R,), {"group_ids": [5, 5, 6, 8]}, GroupError,
     r"group label 6 \(first row 2\) has 1 sample"),
    ("group_of_one_gdpo", A, (R,), {"group_ids": torch.tensor([1, 2, 1, 1])}, GroupError, r"group label 2"),
    ("group_of_one_signal", S, (R,), {"group_ids": [3, 3, 3, -4]}, GroupError, r"group label -4"),
    ("ids_too_short", N, (R,), {"group_ids": [0, 0, 1]}, GroupError, r"3 labels but rewards has N=4 rows"),
    ("ids_too_long_is_shape", A, (R,), {"group_ids": [0, 0, 1, 1, 1]}, ShapeError,
     r"5 labels .* do not cover the batch"),
    ("ids_2d", N, (R,), {"group_ids": torch.zeros(2, 2, dtype=torch.long)}, GroupError, r"2-D"),
    ("ids_float", N, (R,), {"group_ids": [0, 0, 1.0, 1]}, GroupError,
     r"^group_ids\[2\] \(row 2\) is a float \(1.0\); group labels are int64 integers"),
    ("ids_float_tensor", N, (R,), {"group_ids": torch.tensor([0.0, 0.0, 1.0, 1.0])}, GroupError,
     r"integer labels; got dtype float32: float labels are refused by their dtype"),
    ("ids_bool", N, (R,), {"group_ids": torch.tensor([True, True, False, False])}, GroupError, r"dtype bool"),
    # --- weights ------------------------------------------------------------------------------
    ("weights_short", N, (R,), {"group_size": 2, "weights": [1.0]}, WeightError,
     r"weights has length 1 but rewards has K=2 reward columns"),
    ("weights_long_is_shape", A, (R,), {"group_size": 2, "weights": [1.0, 1.0, 1.0]}, ShapeError, r"length 3"),
    ("weights_nan", N, (R,), {"group_size": 2, "weights": [1.0, math.nan]}, WeightError,
     r"weights\[1\] \(reward column 1\) is nan"),
    ("weights_inf_tensor", A, (R,), {"group_size": 2, "weights": torch.tensor([-math.inf, 1.0])}, WeightError,
     r"weights\[0\] .* is -inf"),
    ("weights_zero", N, (R,), {"group_size": 2, "weights": [0.0, -0.0]}, WeightError, r"all 2 weights are zero"),
    ("weights_zero_int", S, (R,), {"group_size": 2, "weights": [0, 0]}, WeightError, r"all 2 weights are zero"),
    ("weights_bool", N, (R,), {"group_size": 2, "weights": [True, 1.0]}, WeightError, r"real numbers"),
    ("weights_inexact_int", N, (R,), {"group_size": 2, "weights": [1, 2 ** 53 + 1]}, WeightError,
     r"weights\[1\] .* a number float64 cannot hold exactly"),
    ("weights_huge_int", N, (R,), {"group_size": 2, "weights": [1, 10 ** 400]}, WeightError, r"weights\[1\]"),
    ("weights_2d", N, (R,), {"group_size": 2, "weights": torch.ones(2, 1)}, WeightError, r"1-D"),
    # --- Eq. 7 beyond float64 -----------------------------------------------------------------
    ("eq7_overflow", N, (R,), {"group_size": 2, "weights": [1.7e308, 1.7e308]}, OutOfRangeError,
     r"Eq. 7 .* overflows float64 at row 2 \(group 1 .*weights"),  # group 0 cancels exactly
    ("eq7_overflow_labelled", A, (R,), {"group_ids": [4, 4, 2, 2], "weights": [1.5e308, 1.5e308]},
     OutOfRangeError, r"row 2 \(group label 2\)"),
    # --- eps, out_dtype -------------------------------------------------------------------------
    ("eps_negative", N, (R,), {"group_size": 2, "eps": -1e-4}, OutOfRangeError, r"eps=-0.0001 must be finite"),
    ("eps_nan", Wh, (R[:, 0],), {"eps": math.nan}, OutOfRangeError, r"eps=nan"),
    ("out_dtype_int", A, (R,), {"group_size": 2, "out_dtype": torch.int32}, InputDtypeError, r"got int32"),
    ("out_dtype_complex", Wh, (R[:, 0],), {"out_dtype": torch.complex64}, InputDtypeError, r"complex64"),
    # --- whiten: values and units ---------------------------------------------------------------
    ("values_int", Wh, (torch.arange(4),), {}, InputDtypeError, r"values has dtype int64"),
    ("values_bool", Wh, (torch.ones(4, dtype=torch.bool),), {}, InputDtypeError, r"bool"),
    ("values_2d", Wh, (R,), {}, ShapeError, r"values must be 1-D \(N,\); got a 2-D"),
    ("values_nan", Wh, (torch.tensor([1.0, 2.0, 3.0, math.nan, 5.0]),), {"segment_sizes": [3, 2]},
     NonFiniteError, r"values\[3\] \(unit 1\) is nan"),
    ("values_inf", Wh, (torch.tensor([math.inf, 2.0, 3.0]),), {}, NonFiniteError, r"values\[0\] \(unit 0\) is inf"),
    ("segments_short", Wh, (torch.arange(6.0),), {"segment_sizes": [2, 3]}, SegmentError,
     r"segment_sizes sum to 5 but this rank holds 6 samples"),
    ("segments_long", A, (R,), {"group_size": 2, "segment_sizes": [4, 2]}, SegmentError, r"sum to 6 .* holds 4"),
    ("segments_negative", Wh, (torch.arange(6.0),), {"segment_sizes": [4, -1, 3]}, SegmentError,
     r"segment_sizes\[1\] \(unit 1\) is -1 < 0"),
    ("segments_float", Wh, (torch.arange(6.0),), {"segment_sizes": [3.0, 3.0]}, SegmentError, r"non-negative ints"),
    ("segments_float_tensor", Wh, (torch.arange(6.0),), {"segment_sizes": torch.tensor([3.0, 3.0])},
     SegmentError, r"non-negative ints"),
    ("unit_of_one", Wh, (torch.arange(6.0),), {"segment_sizes": [2, 1, 3]}, SegmentError,
     r"unit 1 holds a single sample"),
    ("unit_of_one_gdpo", A, (R,), {"group_size": 2, "segment_sizes": [3, 1]}, SegmentError, r"unit 1 holds"),
    ("whole_batch_of_one", Wh, (torch.tensor([1.0]),), {}, SegmentError, r"unit 0 holds a single sample"),
    # --- found by a review: containers read the wrong way, raw Python errors ------------------------
    ("weights_dict", A, (R,), {"group_size": 2, "weights": {0: 1.0, 1: 0.0}}, WeightError,
     r"got a mapping \(pass the weights in reward-column order\)"),  # iterating gave its keys, silently
    ("weights_string", A, (R,), {"group_size": 2, "weights": "12"}, WeightError, r"got a string"),
    ("weights_set", N, (R,), {"group_size": 2, "weights": {2.0, 1.0}}, WeightError, r"got a set \(\{.*\}\): set-like, so its order is no order of columns$"),
    ("weights_numpy_bool", A, (R,), {"group_size": 2, "weights": np.array([True, True])}, WeightError,
     r"real numbers"),
    ("weights_numpy_bool_items", N, (R,), {"group_size": 2, "weights": [np.True_, np.False_]}, WeightError,
     r"real numbers"),
    ("weights_inexact_fraction", A, (R,), {"group_size": 2, "weights": [Fraction(2 ** 53 + 1), 1]}, WeightError,
     r"weights\[0\] .* a number float64 cannot hold exactly"),  # was rounded silently
    ("weights_inexact_decimal", N, (R,), {"group_size": 2, "weights": [1.0, Decimal("0.1")]}, WeightError,
     r"weights\[1\]"),
    ("eps_huge_int", Wh, (R[:, 0],), {"eps": 10 ** 400}, OutOfRangeError,
     r"^eps is an int beyond float64's range \(\|eps\| > 1.8e308\); eps must be finite"),  # said "eps=inf"
    ("eps_none", A, (R,), {"group_size": 2, "eps": None}, InputDtypeError, r"eps must be a real number.*got None"),
    ("eps_list", N, (R,), {"group_size": 2, "eps": [1e-4]}, InputDtypeError, r"got a list \(\[0.0001\]\)"),
    ("eps_numpy_array", Wh, (R[:, 0],), {"eps": np.array([1e-4, 1e-4])}, InputDtypeError, r"an array"),
    ("eps_bool", Wh, (R[:, 0],), {"eps": True}, InputDtypeError, r"got a bool"),
    ("eps_numpy_bool", Wh, (R[:, 0],), {"eps": np.bool_(False)}, InputDtypeError, r"got a bool"),
    ("eps_string", A, (R,), {"group_size": 2, "eps": "0.0001"}, InputDtypeError, r"got a str \('0.0001'\)"),
    ("eps_complex", Wh, (R[:, 0],), {"eps": 1e-4 + 0j}, InputDtypeError, r"got a complex number"),
    ("eps_complex_tensor", Wh, (R[:, 0],), {"eps": torch.tensor(1e-4 + 0j)}, InputDtypeError, r"complex"),
    ("rewards_huge_int", A, ([[0.5], [10 ** 400]],), {"group_size": 2}, InputDtypeError,
     r"^rewards\[1, 0\] \(row 1, reward column 0\) is an int beyond float64's range \(about 1.00e\+400\)"),
    ("values_huge_int", Wh, ([0.5, -(10 ** 400)],), {}, InputDtypeError,
     r"^values\[1\] \(row 1\) is an int beyond float64's range \(about -1.00e\+400\)"),
    ("ids_python_floats_named_by_row", N, (R,), {"group_ids": [0.0, 0.0, 1.0, 1.0]}, GroupError,
     r"^group_ids\[0\] \(row 0\) is a float \(0.0\)"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_refusal_names_the_place(case):
    name, fn, args, kwargs, cls, pattern = case
    with pytest.raises(cls, match=pattern) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, GDPOError) and isinstance(info.value, ValueError)
    assert type(info.value) is not GDPOError, "a refusal must use a specific subclass"


def test_every_case_class_is_a_subclass_of_the_contract():
    from spec.errors import ERROR_CLASSES

    for case in CASES:
        assert case[4] in ERROR_CLASSES.values(), case[0]


@pytest.mark.parametrize("fn", [N, S, A], ids=["normalize_rewards", "group_has_signal", "gdpo_advantages"])
def test_length_errors_are_both_kinds(fn):
    """The contract files wrong-length labels under GroupError and ShapeError, and
    wrong-length weights under WeightError and ShapeError: both catches work."""
    with pytest.raises(GroupError):
        fn(R, group_ids=[0, 0, 1])
    with pytest.raises(ShapeError):
        fn(R, group_ids=[0, 0, 1])
    with pytest.raises(WeightError):
        fn(R, group_size=2, weights=[1.0])
    with pytest.raises(ShapeError):
        fn(R, group_size=2, weights=[1.0])


# --- the final cast ------------------------------------------------------------------------
#
# Reachable cast failures: a whitened value obeys |a| <= (n-1)/sqrt(n) (Samuelson), so float32,
# bfloat16 and float16 outputs cannot fail below ~4e9 samples; float64 inputs far beyond float32
# range whiten to bounded values and are *not* an error. Only float8 outputs can fail, and
# float8_e4m3fn does so silently in torch (it saturates at 448, it has no inf): we refuse instead.


def _outlier_batch(n):
    v = torch.zeros(n, dtype=F64)
    v[n // 2] = 1.0
    return v


def test_float8_cast_that_would_saturate_is_refused():
    v = _outlier_batch(250_000)  # a = (n-1)/sqrt(n) - eps effects ~ 500 > 448 + 16
    assert float(v.to(torch.float8_e4m3fn).float().max()) <= 448  # what a silent cast would do
    with pytest.raises(OutOfRangeError, match=r"at row 125000 does not survive the cast to float8_e4m3fn"):
        gdpo.whiten(v, out_dtype=torch.float8_e4m3fn)


def test_float8_cast_that_fits_is_accepted():
    out = gdpo.whiten(_outlier_batch(1000), out_dtype=torch.float8_e4m3fn)
    assert out.dtype == torch.float8_e4m3fn and torch.isfinite(out.float()).all()


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_values_beyond_float32_range_whiten_fine(out_dtype):
    v = torch.tensor([1e300, -1e300, 3e300, 0.0], dtype=F64)
    out = gdpo.whiten(v, out_dtype=out_dtype)
    assert out.dtype == out_dtype and torch.isfinite(out.float()).all()
    assert gdpo.gdpo_advantages(v[:, None], group_size=2, out_dtype=out_dtype).isfinite().all()


def test_import_is_light():
    """impl.gdpo imports torch, the standard library and spec, nothing heavier."""
    code = ("import sys; import torch; before = set(sys.modules); import impl.gdpo; "
            "print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert set(out) <= {"impl", "spec"}, out


def test_tensors_on_a_device_other_than_cpu_or_cuda_are_refused():
    """A meta tensor (no data) used to fail inside the computation with torch's own
    NotImplementedError; it is refused up front, naming the argument."""
    with pytest.raises(InputDtypeError, match=r"values is on a device of type other than CPU and CUDA"):
        gdpo.whiten(torch.zeros(4, device="meta"))
    with pytest.raises(InputDtypeError, match=r"rewards is on a device of type other than CPU and CUDA"):
        gdpo.gdpo_advantages(torch.zeros(4, 2, device="meta"), group_size=2)
    with pytest.raises(InputDtypeError, match=r"rewards is on a device"):
        gdpo.normalize_rewards(torch.zeros(4, 2, device="meta"), group_size=2)


@pytest.mark.parametrize("var, value", [("GDPO_CUDA_GRAPHS", "yes")])
def test_an_unknown_switch_value_warns_instead_of_meaning_off_silently(monkeypatch, var, value):
    """GDPO_CUDA_GRAPHS=yes used to mean "off" without a word."""
    from impl import _pipeline

    monkeypatch.setenv(var, value)
    monkeypatch.setattr(_pipeline, "_WARNED", set())
    with pytest.warns(RuntimeWarning, match=f"{var}='{value}' is not"):
        gdpo.gdpo_advantages(R, group_size=2)
    monkeypatch.setenv(var, "0")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gdpo.gdpo_advantages(R, group_size=2)  # 0 is a known value: silent
