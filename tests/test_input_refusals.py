"""Inputs a review found refused with a raw torch or Python error, accepted against the
messages' own rule, or refused with a message naming neither the place nor the cause:

* float8 rewards and values (torch has no CPU add or min for them: ``add_stub``,
  ``min_values_cpu``; finite ones were computed while the messages list float16,
  bfloat16, float32 and float64 as the input dtypes). They are refused, consistently
  with those messages, the adapters', the conformance suite's input dtypes and the
  oracle's formats: float8 is an output format, and ``.float()`` widens it exactly;
* a ``process_group`` that is no ProcessGroup (an AttributeError from deep inside
  torch.distributed), or a ProcessGroup without an initialized torch.distributed;
* sparse and nested tensors (``unsupported memory format option Contiguous``, ...);
* weights that are a str (read as a number by float()), a bool, a complex number or
  None; ``group_size`` given as a 0-d integer tensor while a NumPy integer was accepted.

Under a process group each of these joins the agreement like every other refusal:
all ranks raise the same DistributedError naming the rank.
"""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

from impl import gdpo
from impl.gdpo import (
    DistributedError,
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


# --- 2. process_group -----------------------------------------------------------------------------


@pytest.mark.parametrize("group, shown", [("world", r"str 'world'"), (object(), r"object <object object at"),
                                          (3, r"int 3"), (True, r"bool True"), ([None], r"list \[None\]")],
                         ids=["str", "object", "int", "bool", "list"])
@pytest.mark.parametrize("api", ["gdpo_advantages", "whiten"])
def test_a_process_group_that_is_no_group_is_refused_naming_it(api, group, shown):
    """It raised AttributeError ('str' object has no attribute ...) from distributed_c10d."""
    call = (lambda: gdpo.gdpo_advantages(R, group_size=2, process_group=group)) if api == "gdpo_advantages" \
        else (lambda: gdpo.whiten(V, process_group=group))
    err = _refused(InputDtypeError, rf"^{api}: process_group must be a torch.distributed ProcessGroup .*or None "
                                    rf"for a local call; got {shown}", call)
    assert isinstance(err, TypeError)


def test_a_non_member_rank_is_told_so():
    """torch.distributed.new_group returns GroupMember.NON_GROUP_MEMBER (-100) on the ranks
    outside the group."""
    _refused(DistributedError, r"process_group is GroupMember.NON_GROUP_MEMBER .*this rank is not a member",
             gdpo.gdpo_advantages, R, group_size=2, process_group=torch.distributed.GroupMember.NON_GROUP_MEMBER)


def test_world_before_init_is_none_and_runs_locally():
    assert not torch.distributed.is_initialized()
    assert torch.distributed.group.WORLD is None
    assert torch.equal(gdpo.whiten(V, process_group=torch.distributed.group.WORLD), gdpo.whiten(V))


def test_a_process_group_after_destroy_is_a_clear_error():
    """A ProcessGroup outliving its torch.distributed (destroyed) gave ValueError "Default
    process group has not been initialized", from torch; a destroyed subgroup "not registered"."""
    script = textwrap.dedent("""
        import tempfile, torch, torch.distributed as dist
        from impl import gdpo
        dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
        world, sub = dist.group.WORLD, dist.new_group([0])
        assert torch.equal(gdpo.whiten(torch.tensor([1.0, 2.0, 4.0]), process_group=sub),
                           gdpo.whiten(torch.tensor([1.0, 2.0, 4.0])))
        dist.destroy_process_group(sub)
        for group in (sub, world):
            try:
                gdpo.gdpo_advantages(torch.tensor([1.0, 2.0]), group_size=2, process_group=group)
            except gdpo.DistributedError as e:
                print(type(e).__name__, e)
            if group is sub:
                dist.destroy_process_group()
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2, out.stdout + out.stderr[-2000:]
    assert lines[0].startswith("DistributedError gdpo_advantages: process_group (ProcessGroup ")
    assert "cannot be used on this rank" in lines[0] and "not registered" in lines[0]
    assert lines[1] == ("DistributedError gdpo_advantages: process_group is a ProcessGroup but torch.distributed "
                        "is not initialized (call init_process_group first; was the group destroyed?)")


# --- 3. sparse and nested tensors -----------------------------------------------------------------


def _nested(values):
    return torch.nested.nested_tensor([values, values[:2]], layout=torch.jagged)


#: Stands for ``_nested(V)`` in LAYOUTS, made when its test runs: a jagged tensor imports
#: torch._dynamo (1.5 s), which every collection of this module would pay for otherwise.
NESTED_V = "nested V"


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
    ("rewards_nested", gdpo.gdpo_advantages, (NESTED_V,), {"group_size": 2}, InputDtypeError,
     r"rewards is a nested tensor \(layout torch.jagged\)"),
    ("values_sparse", gdpo.whiten, (V.to_sparse(),), {}, InputDtypeError, r"^values has layout torch.sparse_coo"),
    ("values_nested", gdpo.whiten, (NESTED_V,), {}, InputDtypeError, r"values is a nested tensor"),
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
    args = tuple(_nested(V) if a is NESTED_V else a for a in args)
    _refused(cls, pattern, fn, *args, **kwargs)


@pytest.mark.parametrize("ids, row, value", [([0, True, 0, True], 1, "a bool \\(True\\)"),
                                              ((1, 1, False, False), 2, "a bool \\(False\\)"),
                                              ([2, 2, 1, True], 3, "a bool \\(True\\)"),
                                              ([torch.tensor(1), torch.tensor(True), torch.tensor(0), torch.tensor(0)],
                                               1, "a tensor \\(shape \\(\\), dtype bool\\)")],
                         ids=["list", "tuple", "among_ones", "0d_tensors"])
def test_a_bool_among_integer_labels_is_refused_not_read_as_one(ids, row, value):
    """torch reads ``[1, True]`` as the int64 labels ``[1, 1]``: the bool joined group 1
    (and ``[2, 2, 1, True]`` grouped rows 2 and 3) with no word. A bool is no int64 label,
    nor is a 0-d bool tensor among 0-d integer ones (found by review)."""
    for fn in (gdpo.gdpo_advantages, gdpo.normalize_rewards, gdpo.group_has_signal):
        _refused(GroupError, rf"^group_ids\[{row}\] \(row {row}\) is {value}; group labels are int64",
                 fn, R, group_ids=ids)


# --- 4. weights and group_size: the index and the cause ------------------------------------------

_REAL = r"; weights are real numbers"
WEIGHTS = [
    (["1", 1.0], r"^weights\[0\] \(reward column 0\) is a str \('1'\)" + _REAL),  # said "cannot hold exactly"
    ([1.0, "nan"], r"^weights\[1\] \(reward column 1\) is a str \('nan'\)" + _REAL),  # float() read it as nan
    ([True, False], r"^weights\[0\] \(reward column 0\) is a bool \(True\)" + _REAL),
    ([1.0, np.False_], r"^weights\[1\] \(reward column 1\) is a bool \(False\)" + _REAL),
    ([1j, 1], r"^weights\[0\] \(reward column 0\) is a complex number \(1j\)" + _REAL),
    ([None, 1], r"^weights\[0\] \(reward column 0\) is None" + _REAL),
    ([1.0, b"1"], r"^weights\[1\] \(reward column 1\) is bytes \(b'1'\)" + _REAL),
    ([torch.tensor(1.0), 1.0], r"^weights\[0\] \(reward column 0\) is a tensor \(shape \(\), dtype float32\)"
     + _REAL + r".*pass the weights as one \(K,\) tensor"),
    ([1.0, [2.0]], r"^weights\[1\] \(reward column 1\) is a list \(\[2.0\]\)" + _REAL),
    ([np.array([1.0]), 1.0], r"^weights\[0\] \(reward column 0\) is an array \(shape \(1,\)\)" + _REAL),
    (1.0, r"^weights must be a 1-D sequence or tensor of real numbers; got a float \(1.0\), which is not iterable"),
    (torch.tensor([True, False]), r"^weights must be .* real numbers; got a tensor of dtype bool$"),
    (torch.ones(2, 1), r"^weights must be a 1-D sequence .*; got a 2-D tensor$"),
    (np.array([1j, 1.0]), r"^weights must be .*; got NumPy complex numbers$"),
]


@pytest.mark.parametrize("weights, pattern", WEIGHTS, ids=[f"w{i}" for i in range(len(WEIGHTS))])
def test_a_bad_weight_is_named_by_index_and_what_it_is(weights, pattern):
    _refused(WeightError, pattern, gdpo.gdpo_advantages, R, group_size=2, weights=weights)


@pytest.mark.parametrize("group_size", [np.int64(2), np.uint8(2), torch.tensor(2), torch.tensor(2, dtype=torch.int32),
                                        torch.tensor(2, dtype=torch.uint8), np.array(2)],
                         ids=["np_int64", "np_uint8", "tensor", "tensor_int32", "tensor_uint8", "np_0d_array"])
def test_group_size_may_be_any_integer_scalar(group_size):
    """np.int64(2) was accepted and torch.tensor(2) refused with "must be a Python int"."""
    want = gdpo.gdpo_advantages(R, group_size=2, out_dtype=F64)
    assert torch.equal(gdpo.gdpo_advantages(R, group_size=group_size, out_dtype=F64), want)
    assert torch.equal(gdpo.normalize_rewards(R, group_size=group_size), gdpo.normalize_rewards(R, group_size=2))


_GS = r"^group_size must be a Python int, a NumPy integer or a 0-d integer tensor \(not a bool\); got "
GROUP_SIZES = [
    (True, r"a bool \(True\)"), (np.True_, r"a bool \(True\)"),
    (torch.tensor(True), r"a tensor \(shape \(\), dtype bool\)"), (2.0, r"a float \(2.0\)"),
    (np.float32(2.0), r"a float \(2.0\)"), (torch.tensor(2.0), r"a tensor \(shape \(\), dtype float32\)"),
    (torch.tensor([2]), r"a tensor \(shape \(1,\), dtype int64\)"), (np.array([2]), r"an array \(shape \(1,\)\)"),
    ("2", r"a str \('2'\)"),
    ([2], r"a list \(\[2\]\)"), (2 + 0j, r"a complex number \(2\+0j\)"),
]


@pytest.mark.parametrize("group_size, got", GROUP_SIZES, ids=[f"gs{i}" for i in range(len(GROUP_SIZES))])
def test_group_size_refusals_say_the_rule_and_what_was_given(group_size, got):
    _refused(GroupError, _GS + got + "$", gdpo.gdpo_advantages, R, group_size=group_size)


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
        return fn(**{"out_dtype": F64, **self.kwargs}, process_group=dist.group.WORLD)


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
    ("err_weight_str", "gdpo", {"rewards": _REWARDS, "group_size": 2, "weights": [[1.0, 1.0], ["1", 1.0]]},
     r"rank 1: WeightError: weights\[0\] \(reward column 0\) is a str \('1'\); weights are real numbers"),
    ("err_weight_bool", "gdpo", {"rewards": _REWARDS, "group_size": 2, "weights": [[True, 1.0], [1.0, 1.0]]},
     r"rank 0: WeightError: weights\[0\] \(reward column 0\) is a bool \(True\)"),
    ("err_group_size_float", "gdpo", {"rewards": _REWARDS, "group_size": 2,
                                      "call": _OnRank(1, "gdpo", rewards=R, group_size=2.0)},
     r"rank 1: GroupError: group_size must be a Python int.*; got a float \(2.0\)"),
    # the place and the type travel in the agreement; a value that is text only in the rank's own error
    ("err_label_str", "gdpo", {"rewards": _REWARDS, "group_ids": [[0, 0, 1, 1], [0, 0, "b", "b"]]},
     r"rank 1: GroupError: group_ids\[2\] \(row 2\) is a str \('b'\); group labels are int64 integers"),
    ("err_label_beyond_int64", "gdpo", {"rewards": _REWARDS, "group_ids": [[2 ** 63] * 2 + [1, 1], [0, 0, 1, 1]]},
     r"rank 0: GroupError: group_ids\[0\] \(row 0\) is an int beyond int64 \(9223372036854775808\)"),
    ("err_segment_float", "whiten", {"values": _VALUES, "sizes": [[2, 2], [2.0, 2]]},
     r"rank 1: SegmentError: segment_sizes\[0\] \(unit 0\) is a float \(2.0\)"),
    ("err_out_dtype_str", "gdpo", {"rewards": _REWARDS, "group_size": 2,
                                   "call": _OnRank(0, "gdpo", rewards=R, group_size=2, out_dtype="float32")},
     r"rank 0: InputDtypeError: out_dtype must be one of torch.float64, .*; got 'float32' "
     r"\(a str, not a torch.dtype; pass torch.float32\)"),
    ("ok_group_size_tensor", "gdpo", {"rewards": _REWARDS, "group_size": torch.tensor(2)}, None),
    ("ok_group_size_int", "gdpo", {"rewards": _REWARDS, "group_size": 2}, None),
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
    if name == "err_weight_str":  # the refusing rank's own error, chained, names the value too
        assert any("is a str ('1')" in c for c in recs[1]["causes"]), recs[1]["causes"]
    if name == "err_label_str":
        assert any("group_ids[2] (row 2) is a str ('b')" in c for c in recs[1]["causes"]), recs[1]["causes"]
    if name == "err_out_dtype_str":
        assert any("got 'float32' (a str, not a torch.dtype; pass torch.float32)" in c for c in recs[0]["causes"]), \
            recs[0]["causes"]


@pytest.mark.distributed
def test_under_a_process_group_a_0d_tensor_group_size_computes():
    run = _dist_run()
    tensor, plain = run.by_rank("ok_group_size_tensor"), run.by_rank("ok_group_size_int")
    for r in range(2):
        assert tensor[r]["status"] == plain[r]["status"] == "ok", (tensor[r].get("msg"), plain[r].get("msg"))
        assert tensor[r]["result"] == plain[r]["result"]


@pytest.mark.parametrize("arg, kw", [
    ("group_ids", dict(group_ids=torch.tensor([0, 0, 1, 1], device="meta"))),
    ("weights", dict(group_size=2, weights=torch.tensor([1.0, 1.0], device="meta"))),
    ("segment_sizes", dict(group_size=2, segment_sizes=torch.tensor([4], device="meta"))),
    ("eps", dict(group_size=2, eps=torch.tensor(1e-6, device="meta"))),
])
def test_tensor_arguments_on_a_device_without_data_are_named(arg, kw):
    """They used to reach torch's "Cannot copy out of meta tensor" (NotImplementedError)."""
    with pytest.raises(InputDtypeError, match=rf"^{arg} is on a device of type other than CPU and CUDA"):
        gdpo.gdpo_advantages(R, **kw)
    if arg == "segment_sizes":
        with pytest.raises(InputDtypeError, match=r"^segment_sizes is on a device of type other than"):
            gdpo.whiten(V, segment_sizes=kw["segment_sizes"])


@pytest.mark.parametrize("labels", [[], np.array([]), torch.tensor([]), torch.tensor([], dtype=torch.float64),
                                    torch.tensor([], dtype=torch.int32), torch.tensor([], dtype=torch.bool),
                                    torch.tensor([], dtype=torch.complex64)],
                         ids=["list", "numpy", "tensor_float32", "tensor_float64", "tensor_int32", "tensor_bool",
                              "tensor_complex64"])
def test_an_empty_shards_labels_are_taken_however_they_come(labels):
    """Found by review: on a rank with no rows, [] and np.array([]) were taken but
    torch.tensor([]) (float32 by default) was refused as float labels, failing the step on
    every rank. An empty container holds no float label."""
    from impl._inputs import check_rewards

    inp = check_rewards(torch.zeros(0, 2), labels, None, None, allow_empty_rows=True)
    assert inp.labels.dtype == torch.int64 and inp.labels.shape == (0,)
    # a float label, where there is one, is still refused
    _refused(GroupError, r"^group_ids must hold integer labels; got dtype float32", gdpo.gdpo_advantages, R[:2],
             group_ids=torch.tensor([0.0, 0.0]))
