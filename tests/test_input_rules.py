"""Issue 18's input rules, decided once (spec/errors.py, spec section 6) and followed alike by
impl.gdpo and the oracle: a Python list has no dtype, so its ints and floats are values (each
exactly a float64); a bool in it, or an int no float64 equals, is refused naming its place;
a tensor or array of an integer dtype is refused by its dtype. (Float group labels: refused
everywhere, gdpo audit included: tests/test_audit_inputs.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import oracle.gdpo as og
from impl import gdpo
from spec.errors import InputDtypeError

FLOATS = [[1.0], [0.0], [1.0], [1.0]]


@pytest.mark.parametrize("rewards", [[[1], [0], [1], [1]], [1, 0, 1, 1], [[1], [0.0], [1], [1]], ((1,), (0,), (1,), (1,)),
                                     [[np.int64(1)], [0], [1], [1]]], ids=["ints", "ints_1d", "mixed", "tuples", "np_int"])
def test_python_numbers_are_values_whether_int_or_float(rewards):
    ref = gdpo.gdpo_advantages(torch.tensor(FLOATS, dtype=torch.float64), group_size=2)
    assert torch.equal(gdpo.gdpo_advantages(rewards, group_size=2), ref)
    assert torch.equal(gdpo.normalize_rewards(rewards, group_size=2),
                       gdpo.normalize_rewards(torch.tensor(FLOATS, dtype=torch.float64), group_size=2))
    res = og.gdpo_advantages(rewards, [0, 0, 1, 1])
    assert np.array_equal(res.float32, ref.numpy())


def test_whiten_takes_python_ints():
    assert torch.equal(gdpo.whiten([3, 1, 2, 2]), gdpo.whiten(torch.tensor([3.0, 1.0, 2.0, 2.0], dtype=torch.float64)))


def test_an_int_beyond_int64_that_is_a_float64_is_a_value():
    a = gdpo.gdpo_advantages([[2 ** 70], [0], [1], [1]], group_size=2)
    assert torch.equal(a, gdpo.gdpo_advantages(torch.tensor([[2.0 ** 70], [0.0], [1.0], [1.0]], dtype=torch.float64),
                                               group_size=2))


@pytest.mark.parametrize("rewards,where,what", [
    ([[True], [False], [1], [1]], r"rewards\[0, 0\] \(row 0, reward column 0\)", r"a bool \(True\)"),
    ([1, 0, True, 1], r"rewards\[2\] \(row 2\)", r"a bool \(True\)"),
    ([1.0, 0.5, True, 1.0], r"rewards\[2\] \(row 2\)", r"a bool \(True\)"),  # torch reads it as floats
    ([[0.5, 1.0], [0.0, False], [1.0, 0.0], [0.0, 1.0]], r"rewards\[1, 1\] \(row 1, reward column 1\)",
     r"a bool \(False\)"),
    ([[1], [2 ** 53 + 1], [1], [1]], r"rewards\[1, 0\]", r"an int that float64 cannot hold exactly \(9007199254740993\)"),
    ([1.0, 0.5, 2 ** 60 + 1, 3.0], r"rewards\[2\]", r"an int that float64 cannot hold exactly"),
    ([[10 ** 400], [0], [1], [1]], r"rewards\[0, 0\]", r"an int beyond float64's range"),
])
def test_a_bool_or_an_inexact_int_in_a_list_is_refused_by_its_place(rewards, where, what):
    with pytest.raises(InputDtypeError, match=where + r".* is " + what):
        gdpo.gdpo_advantages(rewards, group_size=2)
    with pytest.raises(InputDtypeError):  # the oracle takes its inputs exactly or refuses them
        og.gdpo_advantages(rewards, [0, 0, 1, 1])


@pytest.mark.parametrize("rewards", [torch.tensor([[1], [0], [1], [1]]), np.array([[1], [0], [1], [1]])],
                         ids=["tensor", "array"])
def test_an_integer_dtype_is_refused_by_its_dtype(rewards):
    with pytest.raises(InputDtypeError, match=r"rewards has dtype int64"):
        gdpo.gdpo_advantages(rewards, group_size=2)
    with pytest.raises(InputDtypeError, match=r"int64"):
        og.gdpo_advantages(rewards, [0, 0, 1, 1])


def test_a_bool_among_floats_is_refused_by_whiten_and_the_labelled_adapter():
    """torch reads [1.0, True] as two floats; the bool is refused all the same, named by its place."""
    from impl import adapters

    with pytest.raises(InputDtypeError, match=r"values\[1\] \(row 1\) is a bool \(True\)"):
        gdpo.whiten([1.0, True, 2.0])
    with pytest.raises(InputDtypeError, match=r"rewards\['acc'\]\[1\] is a bool \(True\)"):
        adapters.labelled_advantages({"acc": [1.0, True, 0.0, 1.0]}, [0, 0, 1, 1])
    with pytest.raises(InputDtypeError, match=r"token_level_rewards\['acc'\]\[1\]\[1\] is a bool \(False\)"):
        adapters.verl_advantages({"acc": [[1.0, 0.0], [0.5, False], [1.0, 1.0], [0.0, 0.0]]}, torch.ones(4, 2),
                                 [0, 0, 1, 1])
