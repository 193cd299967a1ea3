"""impl.gdpo agrees with the exact oracle within the spec's error model.

Tolerances are ``Result.allowed(out_dtype)`` from spec/error_model.py; exact zeros
the specification demands must come out as zeros. A naive float64 evaluation
(mean, then deviations) serves as the negative control: the same comparison must
reject it where the brief says it fails ([C - d, d] at large C).
"""

import numpy as np
import pytest
import torch

from gdpo_tools.peer_formulas import formula
from oracle import gdpo as oracle
from oracle.examples import CORRECTNESS_LENGTH, TWO_GROUP
from impl import gdpo as impl


def _segments(unit_ids):
    """Consecutive unit labels -> segment_sizes."""
    u = np.asarray(unit_ids)
    cuts = np.flatnonzero(np.diff(u)) + 1
    return np.diff(np.concatenate([[0], cuts, [u.size]])).tolist()


def _impl(r, g, w=None, units=None, out_dtype=torch.float64):
    seg = None if units is None else _segments(units)
    return impl.gdpo_advantages(torch.as_tensor(r), group_ids=torch.as_tensor(np.asarray(g)), weights=w,
                                segment_sizes=seg, out_dtype=out_dtype).numpy().astype(np.float64)


def _assert_within(res, got, out_dtype, what):
    exact = res.float64
    allowed = res.allowed(out_dtype)
    zero = res.required_zero  # structural zeros: demanded bit for bit (spec/gdpo.md section 7)
    assert np.all(got[zero] == 0), f"{what}: required exact zeros came out as {got[zero]}"
    err = np.abs(got - exact)
    bad = np.flatnonzero(err > allowed)
    assert bad.size == 0, (
        f"{what} ({out_dtype}): sample {bad[0]}: got {got[bad[0]]!r}, exact {exact[bad[0]]!r}, "
        f"error {err[bad[0]]:.3e} > allowed {allowed[bad[0]]:.3e}")


@pytest.mark.parametrize("example", [TWO_GROUP, CORRECTNESS_LENGTH], ids=["two_group", "correctness_length"])
@pytest.mark.parametrize("out_dtype", ["float64", "float32"])
def test_brief_examples(example, out_dtype):
    r, g = example["rewards"], example["group_ids"]
    res = oracle.gdpo_advantages(r, g)
    got = _impl(r, g, out_dtype=getattr(torch, out_dtype))
    _assert_within(res, got, out_dtype, "brief example")


def _random_batch(seed):
    rng = np.random.default_rng(seed)
    K = int(rng.integers(1, 7))
    sizes = rng.integers(2, 9, size=int(rng.integers(2, 9)))
    offset = 10.0 ** rng.integers(-3, 12, size=K)
    scale = 10.0 ** rng.integers(-6, 4, size=K)
    r = offset + scale * rng.normal(size=(int(sizes.sum()), K))
    r[:, 0] = np.round(r[:, 0])  # ties and constant columns
    g = np.repeat(rng.permutation(sizes.size), sizes)  # labels not in order
    w = rng.choice([1.0, 0.5, 2.0, -1.0, 1e-3, 16777217.0], size=K)
    if not np.any(w):
        w[0] = 1.0
    n_units = int(rng.integers(1, 4))
    units = np.sort(rng.integers(0, n_units, size=r.shape[0]))
    for u in np.unique(units):  # every unit needs two samples
        if np.sum(units == u) < 2:
            units[units == u] = units[0]
    return r, g, w.tolist(), units


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("out_dtype", ["float64", "float32"])
def test_random_batches(seed, out_dtype):
    r, g, w, units = _random_batch(seed)
    res = oracle.gdpo_advantages(r, g, weights=w, unit_ids=units)
    got = _impl(r, g, w, units, out_dtype=getattr(torch, out_dtype))
    _assert_within(res, got, out_dtype, f"seed {seed}")


@pytest.mark.parametrize("seed", range(6))
def test_stages_separately(seed):
    r, g, w, units = _random_batch(seed)
    comb = oracle.normalize_rewards(r, g, weights=w)
    c = impl.normalize_rewards(torch.as_tensor(r), group_ids=torch.as_tensor(g), weights=w).numpy()
    _assert_within(comb, c, "float64", "Eq. 4 + Eq. 7")
    vals = np.round(c, 3) + 0.25  # exact floats, whitened on their own
    wres = oracle.whiten(vals, unit_ids=units)
    got = impl.whiten(torch.as_tensor(vals), segment_sizes=_segments(units), out_dtype=torch.float64).numpy()
    _assert_within(wres, got, "float64", "Eq. 6")


D = np.array([0.1, 0.2, 0.3, 0.7])
HEALTHY = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])


def _cd_case(C, shared):
    r = np.stack([C - D, D], 1)
    if shared:
        return np.vstack([r, HEALTHY]), [0] * 4 + [1] * 4
    return r, [0] * 4


@pytest.mark.parametrize("shared", [False, True], ids=["own_unit", "shared_unit"])
@pytest.mark.parametrize("C", [1e9, 1e11, 1e13, 1e15])
def test_c_minus_d_within_error_model(C, shared):
    r, g = _cd_case(C, shared)
    res = oracle.gdpo_advantages(r, g)
    got = _impl(r, g)
    _assert_within(res, got, "float64", f"[C - d, d] at C={C:g}")
    print(f"[C-d,d] C={C:g} {'shared' if shared else 'own'}: worst |impl - exact| = "
          f"{np.max(np.abs(got - res.float64)):.3e}, worst cond = {res.cond.max():.3g}")


@pytest.mark.parametrize("C", [1e13, 1e15])
def test_naive_float64_is_rejected_on_c_minus_d(C):
    """Negative control: mean-then-subtract float64 is off by O(1) where impl is not."""
    r, g = _cd_case(C, False)
    res = oracle.gdpo_advantages(r, g)
    naive = formula("spec", r, g)
    err = np.abs(naive - res.float64)
    assert np.any(err > res.allowed("float64")), "the error model failed to reject the naive algorithm"
    if C >= 1e15:
        assert err.max() > 0.1  # O(1): the brief's figure
    print(f"naive float64 on [C-d,d] C={C:g}: worst error {err.max():.3e}")


@pytest.mark.parametrize("C", [1e3, 1e9, 1e15, 2.0 ** 53])
def test_exact_constant_sum_is_bitwise_zero(C):
    r1 = C - D
    r = np.stack([r1, C - r1], 1)
    res = oracle.gdpo_advantages(r, [0] * 4)
    assert res.exact_zero.all()
    got = _impl(r, [0] * 4)
    assert np.all(got == 0)
    c = impl.normalize_rewards(torch.as_tensor(r), group_size=4).numpy()
    assert np.all(c == 0)
