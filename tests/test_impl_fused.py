"""The fused fast path (impl._fused, GDPO_FUSED): the plain path's bits, on every input drawn.

Without a GPU the kernels run in Triton's interpreter on CPU tensors
(GDPO_FUSED=interpret); with one, compiled on CUDA tensors (GDPO_FUSED=1), and
the plain path they are compared with runs on the same device. Either way the
claim is the same: the fused path returns exactly the plain path's bits, raises
the plain path's errors, and passes the conformance suite's equation properties
against the oracle.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CUDA = torch.cuda.is_available()
if not CUDA:  # the interpreter must be chosen before the kernels are defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton  # noqa: F401
except ImportError:
    if CUDA:  # on a GPU this file is the fused path's only proof: a skip there would pass unseen
        raise
    pytest.skip("the fused path needs Triton (pip install triton)", allow_module_level=True)

# A kernel that fails to compile turns the fused path off with a warning and the plain path
# answers: every comparison would still pass. Here that warning is an error (the tests that
# provoke a failure on purpose catch it with pytest.warns).
pytestmark = pytest.mark.filterwarnings("error:the fused path failed:RuntimeWarning")

from impl import _fused, gdpo  # noqa: E402
from spec.errors import GDPOError  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
MODE = "1" if CUDA else "interpret"



def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


def _call(monkeypatch, fused: bool, rewards, **kw):
    monkeypatch.setenv("GDPO_FUSED", MODE if fused else "0")
    before = _fused.stats["calls"]
    try:
        out = gdpo.gdpo_advantages(rewards, **kw)
    except GDPOError as exc:
        out = exc
    return out, _fused.stats["calls"] - before


def _same(monkeypatch, rewards, *, expect_fused=True, **kw):
    """Fused and plain results are the same bits (or the same error); returns the fused one."""
    a, took = _call(monkeypatch, True, rewards, **kw)
    b, _ = _call(monkeypatch, False, rewards, **kw)
    assert took == (1 if expect_fused else 0), f"fused path taken {took} times, expected {int(expect_fused)}"
    if isinstance(b, Exception):
        assert type(a) is type(b) and str(a) == str(b), f"fused raised {a!r}, plain raised {b!r}"
        return a
    assert not isinstance(a, Exception), f"fused raised {a!r}; plain returned values"
    assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
    diff = (_bits(a) != _bits(b)).nonzero().flatten()
    assert diff.numel() == 0, (
        f"{diff.numel()} of {a.numel()} outputs differ from the plain path, first at row {int(diff[0])}: "
        f"fused {float(a[diff[0]]).hex()} plain {float(b[diff[0]]).hex()}")
    return a


# --- inputs -----------------------------------------------------------------------------------

_KINDS = ("normal", "binary", "constant_cols", "cancel", "huge", "tiny", "mixed_scale", "ints", "subnormal")


@st.composite
def problems(draw):
    g = draw(st.integers(2, 40))
    groups = draw(st.integers(1, 12))
    k = draw(st.sampled_from([1, 2, 3, 4, 5, 11]))
    n = g * groups
    kind = draw(st.sampled_from(_KINDS))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    if kind == "normal":
        r = rng.standard_normal((n, k))
    elif kind == "binary":
        r = rng.integers(0, 2, (n, k)).astype(float)
    elif kind == "constant_cols":
        r = rng.standard_normal((n, k))
        r[:, 0] = 0.7
        r[: g, -1] = 3.0  # one group of the last column collapsed
    elif kind == "cancel":  # C - d and d: the columns' sum is exactly C in every row
        c = 10.0 ** draw(st.integers(3, 15))
        d = rng.integers(0, 1000, (n, 1)) + rng.random((n, 1))
        r = np.concatenate([c - d, d] + [rng.standard_normal((n, 1))] * (k - 2), 1)[:, :max(k, 2)]
        k = r.shape[1]
    elif kind == "huge":
        r = rng.standard_normal((n, k)) * 10.0 ** draw(st.integers(100, 307))
    elif kind == "tiny":
        r = rng.standard_normal((n, k)) * 10.0 ** -draw(st.integers(290, 320))
    elif kind in ("mixed_scale", "subnormal"):
        r = rng.standard_normal((n, k)) * 10.0 ** rng.integers(-300, 300, (1, k))
    else:
        r = rng.integers(-5, 6, (n, k)).astype(float)
    dtype = draw(st.sampled_from([torch.float64, torch.float32, torch.bfloat16, torch.float16]))
    if kind == "subnormal":  # around the smallest normal of the rewards' own format
        r = rng.uniform(-2.0, 2.0, (n, k)) * torch.finfo(dtype).tiny
    if dtype != torch.float64:
        with np.errstate(over="ignore"):
            r = np.clip(r, -1e30, 1e30) if dtype == torch.float32 else np.clip(r, -6e4, 6e4)
        if dtype == torch.bfloat16:
            r = np.clip(r, -1e30, 1e30)
    rewards = torch.tensor(r).to(dtype)
    if not torch.isfinite(rewards).all():
        rewards = torch.nan_to_num(rewards, posinf=1.0, neginf=-1.0)
    w = draw(st.lists(st.sampled_from([1.0, 0.5, -0.3, 2.0, 0.0, 1e-300, 3e200, 1.0 / 3]), min_size=k, max_size=k))
    if all(x == 0.0 for x in w):
        w[0] = 1.0
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=3)))
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [n])]
    if any(s == 1 for s in sizes):
        sizes = None
    eps = draw(st.sampled_from([1e-4, 0.0, 1e-8, 2.0 ** -60, 1e-300, 3.0]))
    out = draw(st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]))
    return rewards, dict(group_size=g, weights=w, segment_sizes=sizes, eps=eps, out_dtype=out)


@settings(max_examples=25 if CUDA else 60, deadline=None,  # compiled: a kernel per (K, group width)
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=problems(), block=st.sampled_from([None, None, 64] if CUDA else [None, None, 2, 16, 64]))
def test_fused_is_the_plain_path_bit_for_bit(problem, block, monkeypatch):
    """``block``: None is the default (a unit of up to 8192 rows whitened by one program);
    a size forces the blocked kernels with blocks that small (many blocks per unit)."""
    rewards, kw = problem
    if block is None:
        monkeypatch.delenv("GDPO_FUSED_BLOCK", raising=False)
    else:
        monkeypatch.setenv("GDPO_FUSED_BLOCK", str(block))
    _same(monkeypatch, rewards.to(DEVICE), **kw)


@pytest.mark.parametrize("n,g,sizes", [
    (4096 * 3 + 16 * 5, 16, None),  # one unit over 13 blocks of 1024 (the last one short)
    (2048, 8, [1024, 0, 1000, 24]),  # an empty unit and units of different block counts
    (64, 64, [64]),  # one group per program's worth
])
def test_several_blocks_per_unit(monkeypatch, n, g, sizes):
    gen = torch.Generator().manual_seed(n)
    r = torch.randn(n, 4, generator=gen, dtype=torch.float64) * 1e3 + 1e9
    _same(monkeypatch, r.to(DEVICE), group_size=g, weights=[1.0, -1.0, 0.5, 2.0], segment_sizes=sizes,
          eps=1e-4, out_dtype=torch.float32)


@pytest.mark.parametrize("block", [None, 16])
@pytest.mark.parametrize("sizes", [[96], [32, 64], [32, 30, 34], [44, 52]])  # all whole, mixed, none whole
@pytest.mark.parametrize("labelled", [False, True])
def test_units_of_whole_groups_are_the_plain_path(monkeypatch, block, sizes, labelled):
    """Units of whole groups take the structural mean 0 (spec section 7) on both paths: the
    mean's kernels skipped (every unit whole, blocked), per unit (mixed), or not at all."""
    if block is None:
        monkeypatch.delenv("GDPO_FUSED_BLOCK", raising=False)
    else:
        monkeypatch.setenv("GDPO_FUSED_BLOCK", str(block))
    gen = torch.Generator().manual_seed(len(sizes))
    r = torch.randint(0, 2, (96, 3), generator=gen).to(torch.float64)
    r[8:16] = r[8]  # a group without signal
    kw = dict(weights=[1.0, 0.5, 2.0], segment_sizes=sizes, eps=1e-4, out_dtype=torch.float32)
    if labelled:  # groups of 8 interleaved inside each unit of whole groups (the sorted layout)
        ids = torch.arange(96) // 8 * 5 + 1
        perm = torch.cat([torch.randperm(s, generator=gen) + o for s, o in zip(sizes, [0, *torch.tensor(sizes).cumsum(0).tolist()[:-1]])])
        a = _same(monkeypatch, r[perm].to(DEVICE), group_ids=ids[perm].to(DEVICE), **kw)
        quiet = (ids[perm] == ids[8]).to(a.device)
    else:
        a = _same(monkeypatch, r.to(DEVICE), group_size=8, **kw)
        quiet = (torch.arange(96) // 8 == 1).to(a.device)
    if sizes[0] % 8 == 0:  # the group without signal sits in a unit of whole groups
        assert torch.all(a[quiet] == 0.0)


def test_exact_constant_sum_cancels_to_zero(monkeypatch):
    c = 2.0 ** 40
    d = torch.arange(64, dtype=torch.float64) * 0.25
    r = torch.stack([c - d, d], 1)
    a = _same(monkeypatch, r.to(DEVICE), group_size=8, weights=[1.0, 1.0], eps=1e-4, out_dtype=torch.float64)
    assert torch.all(_bits(a) == 0), "C - d and d with equal weights must give +0 exactly"


@pytest.mark.parametrize("where,value", [(5, math.nan), (37, math.inf), (63, -math.inf)])
def test_nonfinite_reward_same_error(monkeypatch, where, value):
    r = torch.randn(64, 2, dtype=torch.float64)
    r.view(-1)[where] = value
    err = _same(monkeypatch, r.to(DEVICE), group_size=8, weights=None, eps=1e-4, out_dtype=torch.float32)
    assert isinstance(err, GDPOError) and "row" in str(err)


@pytest.mark.parametrize("case", ["group_too_large", "huge_weight"])
def test_not_eligible_takes_plain_path(monkeypatch, case):
    r = torch.randn(32, 2, dtype=torch.float64)
    kw = dict(group_size=4, weights=[1.0, 1.0], eps=1e-4, out_dtype=torch.float32)
    if case == "group_too_large":
        r = torch.randn(2 * (_fused.MAX_GROUP + 1), 2, dtype=torch.float64)
        kw["group_size"] = _fused.MAX_GROUP + 1
    else:
        kw["weights"] = [2.0 ** 1000, 1.0]
    _same(monkeypatch, r.to(DEVICE), expect_fused=False, **kw)


def test_off_unless_asked(monkeypatch):
    monkeypatch.delenv("GDPO_FUSED", raising=False)
    before = _fused.stats["calls"]
    gdpo.gdpo_advantages(torch.randn(16, 2, device=DEVICE), group_size=4)
    assert _fused.stats["calls"] == before


def test_without_triton_warns_once_and_falls_back(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_kernels(name, *args, **kwargs):
        if "_fused_kernels" in name or (args and args[2] and "_fused_kernels" in args[2]):
            raise ImportError("no triton here (test)")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(_fused, "_STATE", {})
    monkeypatch.setattr(builtins, "__import__", no_kernels)
    monkeypatch.setenv("GDPO_FUSED", MODE)
    r = torch.randn(16, 2, dtype=torch.float64, device=DEVICE)
    with pytest.warns(RuntimeWarning, match="fused path is unavailable"):
        a = gdpo.gdpo_advantages(r, group_size=4)
    b = gdpo.gdpo_advantages(r, group_size=4)  # no second warning (pytest would not fail on one; count below)
    assert torch.equal(a, b)
    assert _fused._STATE["kernels"] is None


def test_conformance_equations_through_the_fused_path(monkeypatch):
    """The conformance suite's equation properties (oracle-graded), with impl.gdpo on the fused path."""
    from conformance import properties as P
    from conformance import runner as R
    from conformance.subject import Subject

    monkeypatch.setenv("GDPO_FUSED", MODE)
    before = _fused.stats["calls"]
    subject = Subject("impl.gdpo:gdpo_advantages", shape="gdpo", convention="spec", device=DEVICE)
    for prop in P.of_section("equations"):
        R.run_for_pytest(prop, subject)
    assert _fused.stats["calls"] > before, "no conformance case reached the fused path"


def test_gpu_benchmark_harness_runs(monkeypatch):
    """benchmarks/gpu.py runs only on lent GPU time: its code is exercised here (CPU,
    interpreted kernels, tiny sizes) so that a run there cannot die of a plain bug."""
    from benchmarks import gpu as bench

    for k in ("GDPO_FUSED", "GDPO_CUDA_GRAPHS", "GDPO_FUSED_BLOCK"):
        monkeypatch.delenv(k, raising=False)
    res = bench.run(1, DEVICE, sizes=(256,), blocks=(1024,))
    (case,) = res["cases"]
    assert not [k for k in case if k.endswith("_error")], case
    assert all(v for k, v in case.items() if k.endswith("_same_bits")), case
    assert case["impl_1u_fused_paths"].get("fused_calls", 0) > 0, case
    assert os.environ.get("GDPO_FUSED") is None  # the harness leaves the knobs as it found them
    assert bench.problems(res) == [], bench.problems(res)
    if CUDA:  # the graphs modes replayed graphs (a failed capture runs eager, unseen otherwise)
        assert case["impl_1u_fused_graphs_paths"].get("graph_replays", 0) > 0, case
        assert case["impl_1u_graphs_paths"].get("graph_replays", 0) > 0, case


def test_gpu_benchmark_flags_unusable_figures():
    """The benchmark exits 1, naming the case, where its figures cannot be used: a raise,
    bits unlike the plain path's, a fused mode in which the fused path fell back, a graphs
    mode on CUDA that never replayed (its figures would be eager's under another name)."""
    from benchmarks import gpu as bench

    good = {"N": 8, "impl_1u_fused_same_bits": True, "impl_1u_fused_paths": {"fused_calls": 3},
            "impl_1u_graphs_paths": {"graph_captures": 1, "graph_replays": 50}}
    assert bench.problems({"device": "NVIDIA H200", "cases": [good]}) == []
    bad = {"N": 8, "impl_1u_eager_error": "RuntimeError('x')", "impl_1u_fused_same_bits": False,
           "impl_1u_fused_paths": {}, "impl_1u_graphs_paths": {"graph_fallbacks": 1}}
    found = bench.problems({"device": "NVIDIA H200", "cases": [bad]})
    assert found == ["N=8 impl_1u_eager: raised RuntimeError('x')", "N=8 impl_1u_fused: bits differ from the plain path",
                     "N=8 impl_1u_fused: no fused kernel ran (the fused path fell back)",
                     "N=8 impl_1u_graphs: no graph replayed (the capture failed: eager ran)"], found
    # on CPU (the smoke run) there are no graphs to replay
    assert bench.problems({"device": "cpu (smoke run)", "cases": [{"N": 8, "impl_1u_graphs_paths": {}}]}) == []


@settings(max_examples=25 if CUDA else 40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=problems(), block=st.sampled_from([None, 64 if CUDA else 16]))
def test_normalize_signal_and_whiten_fused_are_the_plain_path(problem, block, monkeypatch):
    """normalize_rewards and group_has_signal (Eq. 4/7 kernel) and whiten (Eq. 6 kernels) alone."""
    rewards, kw = problem
    rewards = rewards.to(DEVICE)
    if block is None:
        monkeypatch.delenv("GDPO_FUSED_BLOCK", raising=False)
    else:
        monkeypatch.setenv("GDPO_FUSED_BLOCK", str(block))
    results = {}
    for fused in (True, False):
        monkeypatch.setenv("GDPO_FUSED", MODE if fused else "0")
        before = dict(_fused.stats)
        got = []
        for fn in (lambda: gdpo.normalize_rewards(rewards, group_size=kw["group_size"], weights=kw["weights"],
                                                  eps=kw["eps"]),
                   lambda: gdpo.group_has_signal(rewards, group_size=kw["group_size"], weights=kw["weights"],
                                                 eps=kw["eps"]),
                   lambda: gdpo.whiten(rewards[:, 0], segment_sizes=kw["segment_sizes"], eps=kw["eps"],
                                       out_dtype=kw["out_dtype"])):
            try:
                got.append(fn())
            except GDPOError as exc:
                got.append(f"{type(exc).__name__}: {exc}")
        results[fused] = got
        if fused:
            assert _fused.stats["calls"] >= before["calls"] + 2, "normalize_rewards/group_has_signal: not fused"
            assert _fused.stats["whiten"] == before["whiten"] + 1 or isinstance(got[2], str), "whiten: not fused"
    for name, a, b in zip(("normalize_rewards", "group_has_signal", "whiten"), results[True], results[False]):
        if isinstance(b, str) or isinstance(a, str):
            assert a == b, f"{name}: fused {a!r}, plain {b!r}"
        else:
            assert a.dtype == b.dtype and torch.equal(_bits(a.contiguous()) if a.is_floating_point() else a,
                                                      _bits(b.contiguous()) if b.is_floating_point() else b), \
                f"{name}: fused and plain results differ"


def test_kernel_failure_falls_back_to_the_plain_path(monkeypatch):
    """A fused path that fails (a compiler missing on the machine, say) warns once and
    leaves the call to the plain path: same result, nothing raised."""
    monkeypatch.setenv("GDPO_FUSED", MODE)
    monkeypatch.setattr(_fused, "_STATE", dict(_fused._STATE))
    kernels = _fused.kernels()

    class Broken:
        def __getattr__(self, name):
            value = getattr(kernels, name)
            if name.endswith("_kernel"):
                raise RuntimeError("simulated compiler failure")
            return value

    monkeypatch.setitem(_fused._STATE, "kernels", Broken())
    r = torch.randn(64, 2, dtype=torch.float64, device=DEVICE)
    with pytest.warns(RuntimeWarning, match="simulated compiler failure"):
        a = gdpo.gdpo_advantages(r, group_size=8)
    assert _fused._STATE["kernels"] is None  # off for the rest of the process
    monkeypatch.setenv("GDPO_FUSED", "0")
    assert torch.equal(a, gdpo.gdpo_advantages(r, group_size=8))


def test_only_the_fused_paths_own_failures_fall_back(monkeypatch):
    """impl._pipeline.guard reruns a call on the plain path only after a FusedFailure (a fused
    stage's own failure, as above); an exception raised by the call's other code on a fused plan
    (a bug, say) propagates as it is: not retried, not reported as the fused path's, which stays on."""
    import warnings

    from impl import _pipeline

    monkeypatch.setenv("GDPO_FUSED", MODE)
    monkeypatch.setattr(_fused, "_STATE", dict(_fused._STATE))
    assert _fused.kernels() is not None

    def bug(plan, x, facts):
        raise ValueError("a bug outside the fused kernels (test)")

    monkeypatch.setattr(_pipeline, "through_stats", bug)
    r = torch.randn(64, 2, dtype=torch.float64, device=DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "the fused path failed" warning
        with pytest.raises(ValueError, match="a bug outside the fused kernels"):
            gdpo.gdpo_advantages(r, group_size=8)
    assert _fused._STATE["kernels"] is not None  # still on


@pytest.mark.distributed
def test_distributed_fused_is_the_plain_path(monkeypatch):
    """The distributed scenarios of tests/test_impl_distributed.py (two gloo ranks), run
    with and without the fused path: the same records (results bit for bit, errors
    word for word, collectives per call), and the fused path did run."""
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    import _dist
    from test_impl_distributed import DEADLINE_S, GROUP_TIMEOUT_S, scenarios

    if CUDA:
        pytest.skip("the gloo ranks hold CPU tensors; tests/test_impl_cuda.py covers CUDA tensors over gloo")
    scen = [s for s in scenarios(2) if s[0] != "err_mixed_api"]
    runs = {}
    for fused in (True, False):
        monkeypatch.setenv("GDPO_FUSED", MODE if fused else "0")
        runs[fused] = _dist.run_group(2, scen, group_timeout_s=GROUP_TIMEOUT_S, deadline_s=DEADLINE_S)
    took = 0
    for name, _, _ in scen:
        f, p = runs[True].by_rank(name), runs[False].by_rank(name)
        for r in range(2):
            keep = ("status", "result", "stats", "cls", "msg", "collectives")
            assert {k: f[r].get(k) for k in keep} == {k: p[r].get(k) for k in keep}, \
                f"{name}, rank {r}: fused {f[r].get('msg') or f[r].get('status')} vs plain {p[r].get('msg') or p[r].get('status')}"
            took += f[r]["fused_calls"]
    assert took > 0, "no distributed scenario reached the fused path"


@st.composite
def labelled_problems(draw):
    """Labelled groups of ragged sizes (at least 2 rows each), rows shuffled."""
    rewards, kw = draw(problems())
    n = rewards.shape[0]
    sizes, left = [], n
    while left:
        s = draw(st.integers(2, max(2, min(left, 30))))
        s = left if left - s < 2 else s
        sizes.append(s)
        left -= s
    labels = torch.tensor([draw(st.integers(-5, 10 ** 9)) for _ in sizes], dtype=torch.int64)
    if labels.unique().numel() < len(sizes):
        labels = torch.arange(len(sizes)) * 7 - 3
    ids = torch.repeat_interleave(labels, torch.tensor(sizes))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(draw(st.integers(0, 2 ** 31))))
    kw = dict(kw)
    kw.pop("group_size")
    return rewards[perm], ids[perm], kw


@settings(max_examples=25 if CUDA else 50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=labelled_problems())
def test_labelled_groups_fused_are_the_plain_path(problem, monkeypatch):
    """Labelled (ragged, shuffled) groups: the gather form of the Eq. 4/7 kernel, then Eq. 6."""
    rewards, ids, kw = problem
    monkeypatch.delenv("GDPO_FUSED_BLOCK", raising=False)
    rewards, ids = rewards.to(DEVICE), ids.to(DEVICE)
    _same(monkeypatch, rewards, group_ids=ids, **kw)
    results = []
    for fused in (True, False):
        monkeypatch.setenv("GDPO_FUSED", MODE if fused else "0")
        try:
            results.append(gdpo.normalize_rewards(rewards, group_ids=ids, weights=kw["weights"], eps=kw["eps"]))
        except GDPOError as exc:
            results.append(f"{type(exc).__name__}: {exc}")
    if isinstance(results[0], str) or isinstance(results[1], str):
        assert results[0] == results[1]
    else:
        assert torch.equal(_bits(results[0]), _bits(results[1])), "normalize_rewards (labels): fused differs"


def test_interpret_mode_after_triton_was_imported_says_why_and_runs_the_plain_path():
    """Triton picks interpreted library functions at its own import: GDPO_FUSED=interpret
    set after something imported Triton (torch._dynamo does) used to fail inside the first
    kernel with "Cannot call @triton.jit'd outside of the scope of a kernel"."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import os, warnings, torch, triton.language\n"
            "os.environ['GDPO_FUSED'] = 'interpret'\n"
            "from impl import gdpo, _fused\n"
            "r = torch.tensor([[1.0], [2.0], [4.0], [3.0]], dtype=torch.float64)\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    a = gdpo.gdpo_advantages(r, group_size=2, weights=[1.0], segment_sizes=[4])\n"
            "os.environ['GDPO_FUSED'] = '0'\n"
            "b = gdpo.gdpo_advantages(r, group_size=2, weights=[1.0], segment_sizes=[4])\n"
            "print(torch.equal(a, b), _fused.stats['calls'], '|'.join(str(x.message) for x in w))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "GDPO_FUSED")}
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    same, calls, messages = out.stdout.strip().split(" ", 2)
    assert same == "True" and calls == "0", out.stdout
    assert "needs TRITON_INTERPRET=1 in the environment before anything imports triton" in messages, messages
    assert "outside of the scope of a kernel" not in messages, messages
