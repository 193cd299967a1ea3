"""NumPy arrays torch cannot share (negative strides: ``a[::-1]``, ``np.flip``) or may not
write (read-only) are read by value, as the oracle reads them: the same results as their
contiguous copies, and no warning (impl never writes its inputs). Both used to be refused
("rewards must be a tensor or a sequence of floats") or to warn about non-writable tensors;
arrays in the other byte order (``a.astype('>f8')``) were refused the same way."""

import warnings

import numpy as np
import pytest
import torch

from impl import adapters, gdpo

RNG = np.random.default_rng(7)
A = RNG.random((8, 3))
LABELS = np.array([3, 3, 1, 1, 3, 1, 3, 1])


def _read_only(x):
    y = np.array(x)
    y.flags.writeable = False
    return y


VIEWS = {
    "reversed rows": lambda x: x[::-1],
    "reversed columns": lambda x: x[:, ::-1] if x.ndim == 2 else x[::-1],
    "np.flip": np.flip,
    "every other row": lambda x: np.concatenate([x, x])[::2],  # positive strides: shared as before
    "read-only": _read_only,
    "big-endian": lambda x: x.astype(x.dtype.newbyteorder(">")),  # refused as "a ndarray" (found by review)
    "big-endian reversed": lambda x: x.astype(x.dtype.newbyteorder(">"))[::-1],
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_rewards_and_labels_views_are_read_by_value(name):
    view = VIEWS[name]
    r, labels = view(A), view(LABELS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got_size = gdpo.gdpo_advantages(r, group_size=4, out_dtype=torch.float64)
        got_ids = gdpo.gdpo_advantages(r, group_ids=labels, out_dtype=torch.float64)
        got_whiten = gdpo.whiten(r[:, 0], out_dtype=torch.float64)
    assert torch.equal(got_size, gdpo.gdpo_advantages(np.ascontiguousarray(r), group_size=4, out_dtype=torch.float64))
    assert torch.equal(got_ids, gdpo.gdpo_advantages(np.ascontiguousarray(r), group_ids=labels.copy(),
                                                     out_dtype=torch.float64))
    assert torch.equal(got_whiten, gdpo.whiten(np.ascontiguousarray(r[:, 0]), out_dtype=torch.float64))


@pytest.mark.parametrize("name", list(VIEWS))
def test_adapters_read_views_by_value(name):
    view = VIEWS[name]
    r = view(A)
    cols = {"a": r[:, 0], "b": r[:, 1]}
    plain = {k: np.ascontiguousarray(v) for k, v in cols.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = adapters.labelled_advantages(cols, view(LABELS))
        trl = adapters.trl_advantages(r, 4)
    assert torch.equal(got, adapters.labelled_advantages(plain, np.ascontiguousarray(view(LABELS))))
    assert torch.equal(trl, adapters.trl_advantages(np.ascontiguousarray(r), 4))
    mask = view(np.ones((8, 5)))
    tokens = {k: view(np.ascontiguousarray(np.outer(v, np.ones(5)))) for k, v in plain.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        verl = adapters.verl_advantages(tokens, mask, view(LABELS))
    same = adapters.verl_advantages({k: np.ascontiguousarray(v) for k, v in tokens.items()},
                                    np.ascontiguousarray(mask), np.ascontiguousarray(view(LABELS)))
    assert torch.equal(verl, same)
