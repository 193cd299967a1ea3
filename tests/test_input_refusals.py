"""Inputs a review found refused with a raw torch or Python error, accepted against the
messages' own rule, or refused with a message naming neither the place nor the cause:

* float8 rewards and values (torch has no CPU add or min for them: ``add_stub``,
  ``min_values_cpu``; finite ones were computed while the messages list float16,
  bfloat16, float32 and float64 as the input dtypes). They are refused, consistently
  with those messages, the adapters', the conformance suite's input dtypes and the
  oracle's formats: float8 is an output format, and ``.float()`` widens it exactly;
* sparse and nested tensors (``unsupported memory format option Contiguous``, ...).

Under a process group each of these joins the agreement like every other refusal:
all ranks raise the same DistributedError naming the rank.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import warnings

import pytest
import torch

from impl import gdpo
from impl.gdpo import (
    GDPOError,
    GroupError,
    InputDtypeError,
    SegmentError,
    WeightError,
)

F64 = torch.float64
R = torch.tensor([[0.0, 1.0], [1.0, 0.0], [2.0, 2.0], [3.0, 5.0]], dtype=F64)  # N=4, K=2
V = torch.tensor([1.0, 2.0, 3.0, 5.0])
FLOAT8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                                      "float8_e8m0fnu") if hasattr(torch, n)]
_ALLOWED = r"float16, bfloat16, float32 or float64"


def _refused(cls, pattern, fn, *args, **kwargs):
    with pytest.raises(cls, match=pattern) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, GDPOError) and type(info.value) is not GDPOError
    return info.value


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


# --- 1. float8 inputs ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT8, ids=_name)
@pytest.mark.parametrize("with_nan", [False, True], ids=["finite", "nan"])
def test_float8_rewards_are_refused_by_every_entry_point(dtype, with_nan):
    """Finite float8 rewards were computed, a NaN among them gave NotImplementedError
    ("add_stub"); the messages name the four input dtypes."""
    r = torch.tensor([1.0, math.nan if with_nan else 2.0, 3.0, 4.0]).to(dtype)
    pattern = rf"rewards has dtype {_name(dtype)}; Eq. 4 needs a real floating dtype \({_ALLOWED}\); .*\.float\(\)"
    for fn in (gdpo.gdpo_advantages, gdpo.normalize_rewards, gdpo.group_has_signal):
        _refused(InputDtypeError, pattern, fn, r, group_size=2)
        _refused(InputDtypeError, pattern, fn, r[:, None], group_ids=[0, 0, 1, 1])


@pytest.mark.parametrize("dtype", FLOAT8, ids=_name)
def test_float8_values_are_refused_by_whiten(dtype):
    """whiten(float8) raised NotImplementedError: "min_values_cpu" not implemented."""
    _refused(InputDtypeError, rf"values has dtype {_name(dtype)}; Eq. 6 needs a real floating dtype \({_ALLOWED}\)",
             gdpo.whiten, V.to(dtype))


def test_widening_float8_as_the_message_says_computes():
    r = torch.tensor([1.0, 2.0, 3.0, 5.0]).to(torch.float8_e4m3fn)
    got = gdpo.gdpo_advantages(r.float(), group_size=2, out_dtype=F64)
    assert torch.equal(got, gdpo.gdpo_advantages(r.double(), group_size=2, out_dtype=F64))  # exact widening


@pytest.mark.parametrize("out_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=_name)
def test_float8_outputs_still_work(out_dtype):
    a = gdpo.gdpo_advantages(R, group_size=2, out_dtype=out_dtype)
    w = gdpo.whiten(V, out_dtype=out_dtype)
    assert a.dtype == w.dtype == out_dtype and a.float().isfinite().all() and w.float().isfinite().all()


# --- 3. sparse and nested tensors -----------------------------------------------------------------


def _nested(values):
    return torch.nested.nested_tensor([values, values[:2]], layout=torch.jagged)


def _csr(x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Sparse CSR tensor support is in beta state"
        return x.to_sparse_csr()


LAYOUTS = [
    ("rewards_sparse_1d", gdpo.gdpo_advantages, (V.to_sparse(),), {"group_size": 2}, InputDtypeError,
     r"^rewards has layout torch.sparse_coo; impl.gdpo reads dense \(strided\) tensors only: convert it with "
     r"rewards.to_dense\(\)$"),
    ("rewards_sparse_2d", gdpo.normalize_rewards, (R.to_sparse(),), {"group_size": 2}, InputDtypeError,
     r"rewards has layout torch.sparse_coo"),
    ("rewards_csr", gdpo.group_has_signal, (_csr(R),), {"group_size": 2}, InputDtypeError,
     r"rewards has layout torch.sparse_csr"),
    ("rewards_nested", gdpo.gdpo_advantages, (_nested(V),), {"group_size": 2}, InputDtypeError,
     r"rewards is a nested tensor \(layout torch.jagged\)"),
    ("values_sparse", gdpo.whiten, (V.to_sparse(),), {}, InputDtypeError, r"^values has layout torch.sparse_coo"),
    ("values_nested", gdpo.whiten, (_nested(V),), {}, InputDtypeError, r"values is a nested tensor"),
    ("group_ids_sparse", gdpo.gdpo_advantages, (R,), {"group_ids": torch.tensor([0, 0, 1, 1]).to_sparse()},
     GroupError, r"^group_ids has layout torch.sparse_coo; .*group_ids.to_dense\(\)"),
    ("weights_sparse", gdpo.gdpo_advantages, (R,), {"group_size": 2, "weights": torch.ones(2).to_sparse()},
     WeightError, r"^weights has layout torch.sparse_coo"),
    ("segment_sizes_sparse", gdpo.whiten, (V,), {"segment_sizes": torch.tensor([2, 2]).to_sparse()},
     SegmentError, r"^segment_sizes has layout torch.sparse_coo"),
]


@pytest.mark.parametrize("case", LAYOUTS, ids=[c[0] for c in LAYOUTS])
def test_non_strided_tensors_are_refused_naming_the_argument_and_layout(case):
    _, fn, args, kwargs, cls, pattern = case
    _refused(cls, pattern, fn, *args, **kwargs)


# --- under a process group: every rank raises together ------------------------------------------


class _OnRank:
    """A scenario's ``call`` hook (tests/_dist.py): rank ``rank`` makes its own call,
    ``api`` with ``kwargs`` (tensors of any layout, any group_size), the others the
    scenario's. Pickled by reference into the spawned ranks."""

    def __init__(self, rank, api, **kwargs):
        self.rank, self.api, self.kwargs = rank, api, kwargs

    def __call__(self, planned):
        import torch.distributed as dist

        if dist.get_rank() != self.rank:
            return planned()
        fn = gdpo.whiten if self.api == "whiten" else gdpo.gdpo_advantages
        return fn(**self.kwargs, process_group=dist.group.WORLD, out_dtype=F64)


_REWARDS = [[[0.0, 1.0], [1.0, 0.0], [2.0, 2.0], [3.0, 5.0]]] * 2
_VALUES = [[1.0, 2.0, 3.0, 5.0]] * 2
DIST = [
    ("err_float8_rewards", "gdpo", {"rewards": _REWARDS, "group_size": 2, "dtype": ["float64", "float8_e4m3fn"]},
     r"rank 1: InputDtypeError: rewards has dtype float8_e4m3fn; Eq. 4 needs a real floating dtype"),
    ("err_float8_values", "whiten", {"values": _VALUES, "dtype": ["float8_e5m2", "float64"]},
     r"rank 0: InputDtypeError: values has dtype float8_e5m2"),
    ("err_sparse_rewards", "gdpo", {"rewards": _REWARDS, "group_size": 2,
                                    "call": _OnRank(1, "gdpo", rewards=R.to_sparse(), group_size=2)},
     r"rank 1: InputDtypeError: rewards has layout torch.sparse_coo"),
    ("err_sparse_values", "whiten", {"values": _VALUES, "call": _OnRank(0, "whiten", values=V.double().to_sparse())},
     r"rank 0: InputDtypeError: values has layout torch.sparse_coo"),
    ("err_sparse_group_ids", "gdpo", {"rewards": _REWARDS, "group_ids": [[0, 0, 1, 1]] * 2, "call": _OnRank(
        1, "gdpo", rewards=R, group_ids=torch.tensor([0, 0, 1, 1]).to_sparse())},
     r"rank 1: GroupError: group_ids has layout torch.sparse_coo"),
]


@functools.lru_cache(maxsize=None)
def _dist_run():
    sys.path.insert(0, os.path.dirname(__file__))
    import _dist

    return _dist.run_group(2, [d[:3] for d in DIST], group_timeout_s=20.0, deadline_s=150.0)


@pytest.mark.distributed
@pytest.mark.parametrize("name, pattern", [(d[0], d[3]) for d in DIST if d[3]], ids=[d[0] for d in DIST if d[3]])
def test_under_a_process_group_every_rank_raises_the_same_error(name, pattern):
    import re

    run = _dist_run()
    assert not run.hung, f"ranks {run.hung} hung"
    recs = run.by_rank(name)
    msgs = {rec.get("msg") for rec in recs.values()}
    for r, rec in recs.items():
        assert rec["status"] == "error", f"{name}: rank {r} returned instead of raising"
        assert rec["cls"] == "DistributedError", (r, rec["cls"], rec["msg"])
        assert re.search(pattern, rec["msg"]), f"rank {r}: {rec['msg']}"
    assert len(msgs) == 1, msgs
