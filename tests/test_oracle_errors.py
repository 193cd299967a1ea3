"""Bad input to the oracle raises a clear error from the contract."""

import numpy as np
import pytest

from oracle import gdpo
from spec.errors import (GDPOError, GroupError, InputDtypeError, NonFiniteError, SegmentError,
                         ShapeError, WeightError)

R = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [0.0, 0.5]])
G = [0, 0, 1, 1]

CASES = [
    ("nan", dict(rewards=np.where(np.eye(4, 2) == 1, np.nan, R)), NonFiniteError, r"row 0, column 0 \(group 0\)"),
    ("inf", dict(rewards=np.array([[1.0, 0], [0, 1], [2, np.inf], [0, 0.5]])), NonFiniteError, r"row 2, column 1 \(group 1\)"),
    ("ints", dict(rewards=np.array([[1, 0], [0, 1], [2, 2], [0, 0]])), InputDtypeError, "floating"),
    ("empty", dict(rewards=np.zeros((0, 2)), group_ids=[]), ShapeError, "empty"),
    ("3d", dict(rewards=np.zeros((2, 2, 2))), ShapeError, r"\(N, K\)"),
    ("labels_length", dict(group_ids=[0, 0, 1]), ShapeError, "length-4"),
    ("float_labels", dict(group_ids=[0.0, 0.0, 1.0, 1.0]), InputDtypeError, "integers"),
    ("singleton", dict(group_ids=[0, 0, 0, 1]), GroupError, r"group 1 has 1 sample"),
    ("weights_length", dict(weights=[1.0]), WeightError, "one entry per reward column"),
    ("weights_nan", dict(weights=[1.0, np.nan]), WeightError, "column 1"),
    ("weights_zero", dict(weights=[0.0, 0.0]), WeightError, "all weights are zero"),
    ("unit_of_one", dict(unit_ids=[0, 0, 0, 1]), SegmentError, "whitening unit 1 has 1 sample"),
    ("unknown_convention", dict(convention="grpo"), ValueError, "unknown convention 'grpo'"),
]


@pytest.mark.parametrize("name,kw,exc,pattern", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises(name, kw, exc, pattern):
    args = dict(rewards=R, group_ids=G)
    args.update(kw)
    with pytest.raises(exc, match=pattern):
        gdpo.gdpo_advantages(**args)


def test_whiten_names_a_ragged_list_of_values():
    """A ragged list is the values' ShapeError, naming the row, not NumPy's ValueError."""
    with pytest.raises(ShapeError, match=r"values row 1 is a sequence"):
        gdpo.whiten([1.0, [2.0, 3.0]], segment_sizes=[2])


def test_errors_are_value_errors():
    assert issubclass(GDPOError, ValueError)
    with pytest.raises(ValueError):
        gdpo.gdpo_advantages(R, [0, 0, 0, 1])


def test_verl_needs_token_counts():
    with pytest.raises(ShapeError, match="token_counts is required"):
        gdpo.gdpo_advantages(R, G, convention="verl")
