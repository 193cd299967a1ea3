"""Numerics of impl.gdpo against exact values, with the tolerance taken from the
error model (spec/error_model.py) evaluated on the exact intermediates.

The exact reference below is deliberately small: inputs become Fractions (every
float is a rational), means, deviations and variances are exact, and the one
irrational step (the square root) and the divisions run in 100-digit Decimal
arithmetic, far below any float64 rounding. Each property has a negative
control: a deliberately wrong algorithm the same comparison must reject.
"""

from __future__ import annotations

import math
import random
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
import torch

from impl import gdpo
from spec import error_model as em
from spec.constants import DEFAULT_EPS, FLOAT32_MAX

F64, F32 = torch.float64, torch.float32
EPS = Fraction(DEFAULT_EPS)  # the double nearest 1e-4, as the implementation holds it
PREC = 100


# --- exact reference -------------------------------------------------------------------


def _dec(x: Fraction) -> Decimal:
    return Decimal(x.numerator) / Decimal(x.denominator)


def _scaled_float(x, e: int) -> float:
    """float(x * 2**-e) for Fraction/Decimal x: error-model inputs in the group's
    own power-of-two frame (the bound is homogeneous, so the frame cannot matter,
    and huge rewards cannot overflow it)."""
    return float(Fraction(x) / Fraction(2) ** e) if e >= 0 else float(Fraction(x) * Fraction(2) ** -e)


def _frame(xs) -> int:
    """A power-of-two frame bringing the largest of the rationals ``xs`` near 1: the error
    model's inputs are rescaled into it (the bound is homogeneous once its underflow
    term tau is rescaled too), so squares of huge or tiny rewards cannot overflow it."""
    return max((x.numerator.bit_length() - x.denominator.bit_length() for x in map(Fraction, xs) if x), default=0)


def exact_gdpo(rewards, groups, weights=None, units=None, eps=EPS):
    """Exact Eq. 4, 7, 6 of float inputs. Returns z (N, K), c (N,), a (N,) as
    Decimals plus the error-model bounds dz, dc, da (units of u) per element."""
    with localcontext() as ctx:
        ctx.prec = PREC
        r = [[Fraction(float(x)) for x in row] for row in rewards]
        n_rows, k = len(r), len(r[0])
        w = [Fraction(float(x)) for x in (weights if weights is not None else [1.0] * k)]
        z = [[Decimal(0)] * k for _ in range(n_rows)]
        dz = np.zeros((n_rows, k))
        for g in dict.fromkeys(groups):
            rows = [i for i in range(n_rows) if groups[i] == g]
            n = len(rows)
            for col in range(k):
                vals = [r[i][col] for i in rows]
                mean = sum(vals) / n
                dev = [v - mean for v in vals]
                sigma = _dec(sum(d * d for d in dev) / (n - 1)).sqrt()
                denom = sigma + _dec(eps)
                zs = [_dec(d) / denom for d in dev]
                e = _frame([max(abs(v) for v in vals), Fraction(denom)])
                d_dev = em.model_dev_perturbation(_scaled_float(max(vals) - min(vals), e), n,
                                                  tau=math.ldexp(em.TAU, -e))
                dz[rows, col] = em.standardize_groups_stage([_scaled_float(d, e) for d in dev], d_dev,
                                                            _scaled_float(sigma, e), _scaled_float(denom, e),
                                                            [float(x) for x in zs], n, 1)
                for i, zi in zip(rows, zs):
                    z[i][col] = zi
        c = [sum((_dec(w[col]) * z[i][col] for col in range(k)), Decimal(0)) for i in range(n_rows)]
        zf = np.array([[float(x) for x in row] for row in z])
        dc = em.combine_stage(dz, zf, [float(x) for x in w])
        units = [0] * n_rows if units is None else units
        a = [Decimal(0)] * n_rows
        da = np.zeros(n_rows)
        for u in dict.fromkeys(units):
            rows = [i for i in range(n_rows) if units[i] == u]
            n = len(rows)
            cu = [c[i] for i in rows]
            mean = sum(cu) / n
            dev = [x - mean for x in cu]
            s = (sum(d * d for d in dev) / (n - 1)).sqrt()
            denom = s + _dec(eps)
            collapsed = all(x == cu[0] for x in cu)
            au = [Decimal(0) if collapsed else d / denom for d in dev]
            da[rows] = 0.0 if collapsed else em.whiten_stage(dc[rows], [float(x) for x in cu], float(mean),
                                                             [float(x) for x in au], float(s), float(denom), 1)
            for i, ai in zip(rows, au):
                a[i] = ai
    return {"z": z, "c": c, "a": a, "dz": dz, "dc": dc, "da": da}


def exact_whiten(values, eps=EPS):
    """Exact Eq. 6 of raw float values (one unit) with its error-model bound."""
    with localcontext() as ctx:
        ctx.prec = PREC
        fr = [Fraction(float(v)) for v in values]
        n = len(fr)
        mean = sum(fr) / n
        s = _dec(sum((x - mean) ** 2 for x in fr) / (n - 1)).sqrt()
        denom = s + _dec(eps)
        a = [_dec(x - mean) / denom for x in fr]
        e = _frame([max(abs(x) for x in fr), Fraction(denom)])
        da = np.zeros(n) if all(x == fr[0] for x in fr) else \
            em.whiten_stage(np.zeros(n), [_scaled_float(x, e) for x in fr], _scaled_float(mean, e),
                            [float(x) for x in a], _scaled_float(s, e), _scaled_float(denom, e), 1)
    return {"a": a, "da": da}


def assert_within(got, exact, delta, out_dtype, what):
    """|got - exact| <= em.allowed_error(delta, exact): the spec's tolerance, no bare rtol."""
    got = np.asarray(got, dtype=np.float64).reshape(-1)
    ex = np.array([float(x) for x in np.asarray(exact, dtype=object).reshape(-1)])
    allowed = em.allowed_error(np.asarray(delta).reshape(-1), ex, out_dtype)
    err = np.abs(got - ex)
    bad = np.flatnonzero(~(err <= allowed))
    assert bad.size == 0, (f"{what}: element {bad[0]}: got {got[bad[0]].hex()} ({got[bad[0]]!r}), exact "
                           f"{ex[bad[0]]!r}, error {err[bad[0]]:.3e} > allowed {allowed[bad[0]]:.3e}")
    return err


def _np(t):
    return t.to(F64).numpy()


def _bits(t: torch.Tensor) -> list[str]:
    return [float(x).hex() for x in t.to(F64).tolist()]


# --- negative controls: what a wrong implementation computes -----------------------------


def naive_z(r: torch.Tensor, group_size: int, eps=DEFAULT_EPS):
    """Mean first, then deviations, in float64 (not shift-invariant)."""
    g = r.to(F64).reshape(-1, group_size, r.shape[1])
    dev = g - g.mean(1, keepdim=True)
    std = (dev.pow(2).sum(1, keepdim=True) / (group_size - 1)).sqrt()
    return (dev / (std + eps)).reshape(r.shape)


def one_pass_z(r: torch.Tensor, group_size: int, dtype=F32, eps=DEFAULT_EPS):
    """E[x^2] - E[x]^2 variance in the input precision (the classic trap)."""
    g = r.to(dtype).reshape(-1, group_size, r.shape[1])
    n = group_size
    var = ((g * g).mean(1, keepdim=True) - g.mean(1, keepdim=True) ** 2).clamp(min=0) * n / (n - 1)
    return ((g - g.mean(1, keepdim=True)) / (var.sqrt() + eps)).reshape(r.shape).to(F64)


# --- hand values -------------------------------------------------------------------------

TWO_GROUP = [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]  # group A: one reward varies; B: both


@pytest.mark.parametrize("out_dtype", [F64, F32])
def test_two_group_example(out_dtype):
    r = torch.tensor(TWO_GROUP, dtype=F64)
    got = gdpo.gdpo_advantages(r, group_size=2, out_dtype=out_dtype)
    ex = exact_gdpo(TWO_GROUP, [0, 0, 1, 1])
    assert_within(_np(got), ex["a"], ex["da"], str(out_dtype).replace("torch.", ""), "two-group example")
    assert [round(float(x), 4) for x in got] == [-0.5477, 0.5477, -1.0954, 1.0954]
    # Eq. 6 maps the +-0.7071 of group A and the +-1.4142 of group B to +-sqrt(3/10), +-sqrt(6/5) (eps aside)
    assert abs(float(got[3]) - math.sqrt(6 / 5)) < 1e-3 and abs(float(got[1]) - math.sqrt(3 / 10)) < 1e-3


@pytest.mark.parametrize("pair", [(0.0, 1.0), (3.0, 1000.0), (-5e-3, 7e4), (1e6 + 0.5, 1e6)])
def test_pairs_standardize_to_0_7071(pair):
    """n_g = 2: any two distinct values give +-1/sqrt(2) (magnitudes are lost, a known limit)."""
    r = torch.tensor([[pair[0]], [pair[1]]], dtype=F64)
    z = gdpo.normalize_rewards(r, group_size=2)
    ex = exact_gdpo(r.tolist(), [0, 0])
    assert_within(_np(z), [row[0] for row in ex["z"]], ex["dz"][:, 0], "float64", f"pair {pair}")
    assert float(z[0]) == -float(z[1]) and abs(abs(float(z[0])) - 0.7071) < 1e-3 * (1 + 1 / abs(pair[1] - pair[0]))


@pytest.mark.parametrize("base,step", [(1000.0, 0.01), (10000.0, 0.001), (10000.0, 0.005)])
def test_close_values_keep_their_signal(base, step):
    """[1000.0, 1000.01, 1000.02, 1000.03] has std 1.29e-2: real signal, not rounding."""
    vals = [base + i * step for i in range(4)]
    r = torch.tensor(vals, dtype=F64)
    z = gdpo.normalize_rewards(r, group_size=4)
    ex = exact_gdpo([[v] for v in vals], [0] * 4)
    assert_within(_np(z), [row[0] for row in ex["z"]], ex["dz"][:, 0], "float64", f"{vals}")
    if base == 1000.0:
        std = float(np.std(np.array(vals), ddof=1))
        assert abs(std - 1.29e-2) < 1e-4
    # negative control: one-pass float32 variance loses it entirely (variance 0 or garbage)
    mutant = one_pass_z(r[:, None], 4)[:, 0]
    with pytest.raises(AssertionError):
        assert_within(_np(mutant), [row[0] for row in ex["z"]], ex["dz"][:, 0], "float64", "one-pass")


D = [0.1, 0.2, 0.3, 0.7]
CS = [1e3, 1e6, 1e9, 1e11, 1e13, 1e15]


@pytest.mark.parametrize("C", CS)
def test_exact_constant_sum_cancels_bit_for_bit(C):
    """r2 = C - r1 exactly in floats, equal weights: z2 = -z1 bitwise and c = +0."""
    r1 = torch.tensor([C - d for d in D], dtype=F64)
    r2 = C - r1
    assert torch.equal(r1 + r2, torch.full_like(r1, C))  # the sum is exact
    r = torch.stack([r1, r2], 1)
    c = gdpo.normalize_rewards(r, group_size=4)
    assert _bits(c) == ["0x0.0p+0"] * 4
    weighted = gdpo.normalize_rewards(r, group_size=4, weights=[0.3, 0.3])
    assert _bits(weighted) == ["0x0.0p+0"] * 4
    # a unit made only of such groups whitens to exact zeros, not O(1) noise
    rb1 = torch.tensor([C / 2 - d for d in reversed(D)], dtype=F64)
    rb = torch.stack([rb1, C / 2 - rb1], 1)  # a second exact constant-sum group
    assert torch.equal(rb.sum(1), torch.full((4,), C / 2, dtype=F64))
    two = torch.cat([r, rb])
    a = gdpo.gdpo_advantages(two, group_size=4, out_dtype=F64)
    assert _bits(a) == ["0x0.0p+0"] * 8
    assert not gdpo.group_has_signal(two, group_size=4).any()


def test_naive_constant_sum_leaves_residue():
    """Negative control: mean-then-subtract float64 does not cancel exactly."""
    residues = []
    for C in CS:
        r1 = torch.tensor([C - d for d in D], dtype=F64)
        r = torch.stack([r1, C - r1], 1)
        residues.append(float(naive_z(r, 4).sum(1).abs().max()))
    assert max(residues) > 0, residues


@pytest.mark.parametrize("C", [1e9, 1e13, 1e15])
def test_c_minus_d_is_shift_invariant(C):
    """[C - d, d]: the float64 inputs do not sum to C, and their exact GDPO result is
    itself O(1) at large C (input quantization is real signal). impl agrees with the
    exact Eq. 4 within the error model; naive float64 is off by O(1) at C = 1e15."""
    rows = [[C - d, d] for d in D]
    r = torch.tensor(rows, dtype=F64)
    ex = exact_gdpo(rows, [0] * 4)
    z_impl = torch.stack([gdpo.normalize_rewards(r[:, k], group_size=4) for k in range(2)], 1)
    err = assert_within(_np(z_impl), ex["z"], ex["dz"], "float64", f"Eq. 4 at C={C:g}")
    assert_within(_np(gdpo.gdpo_advantages(r, group_size=4, out_dtype=F64)), ex["a"], ex["da"], "float64",
                  f"advantages at C={C:g}")
    naive_err = np.abs(_np(naive_z(r, 4)) - np.array([[float(x) for x in row] for row in ex["z"]]))
    if C == 1e15:
        assert err.max() < 1e-12 and naive_err.max() > 0.1, (err.max(), naive_err.max())


def test_weights_beyond_float32_stay_distinct():
    """[16777216, 16777217]: float32 merges them; Eq. 7 keeps them (float64)."""
    r1 = torch.tensor([1.0, 4.0, 2.0, 9.0], dtype=F64)
    r = torch.stack([r1, 10.0 - r1], 1)  # z2 = -z1 exactly
    z1 = gdpo.normalize_rewards(r1, group_size=4)
    c = gdpo.normalize_rewards(r, group_size=4, weights=[16777216, 16777217])
    # 2**24 z1 + (2**24 + 1)(-z1) = -z1, up to the rounding of Eq. 7 itself (error model, dz = 0)
    zz = np.stack([_np(z1), -_np(z1)], 1)
    bound = em.SAFETY * 2.0 ** -53 * em.combine_stage(np.zeros_like(zz), zz, [16777216.0, 16777217.0])
    assert np.all(np.abs(_np(c) + _np(z1)) <= bound) and not torch.equal(c, torch.zeros_like(c))
    merged = gdpo.normalize_rewards(r, group_size=4, weights=torch.tensor([16777216.0, 16777217.0], dtype=F32))
    assert _bits(merged) == ["0x0.0p+0"] * 4  # negative control: float32 weights cancel
    assert gdpo.group_has_signal(r, group_size=4, weights=[16777216, 16777217]).all()


# --- magnitudes at the edges of the formats -----------------------------------------------

EXTREME = [
    ("flt_max_pair_f32", [-FLOAT32_MAX, FLOAT32_MAX], F32),
    ("flt_max_eleven_f32", [FLOAT32_MAX] * 10 + [-FLOAT32_MAX], F32),
    ("1e200_f64", [1e200, 3e200, -2e200, 1e200], F64),
    ("dbl_max_pair_f64", [-1.7e308, 1.7e308], F64),
    ("dbl_max_mixed_f64", [1.7e308, -1.7e308, 1e308, 0.0, -5e307], F64),
    ("subnormal_f64", [5e-324, 1e-323, 2e-323, 0.0], F64),
]


@pytest.mark.parametrize("name,vals,dtype", EXTREME, ids=[e[0] for e in EXTREME])
def test_extreme_magnitudes(name, vals, dtype):
    r = torch.tensor(vals, dtype=dtype)
    n = len(vals)
    ex = exact_gdpo([[float(v)] for v in r.tolist()], [0] * n)
    z = gdpo.normalize_rewards(r, group_size=n)
    assert torch.isfinite(z).all()
    assert_within(_np(z), [row[0] for row in ex["z"]], ex["dz"][:, 0], "float64", name)
    a = gdpo.gdpo_advantages(r, group_size=n)
    assert_within(_np(a), ex["a"], ex["da"], "float32", name)
    ew = exact_whiten(r.tolist())
    assert_within(_np(gdpo.whiten(r, out_dtype=F64)), ew["a"], ew["da"], "float64", f"Eq. 6 alone, {name}")
    if dtype == F32:  # negative control: float32 statistics overflow at FLT_MAX
        dev = r - r.sum() / n
        naive32 = dev / ((dev * dev).sum() / (n - 1)).sqrt()
        with pytest.raises(AssertionError):
            assert_within(_np(naive32), [row[0] for row in ex["z"]], ex["dz"][:, 0], "float64", "naive float32")


def test_huge_weights_cancel_without_overflow():
    """Products w*z beyond float64 that cancel exactly: c = 0, no inf, no error."""
    r1 = torch.tensor([1.0, 4.0, 2.0, 9.0, 3.0, 3.0, 5.0, 0.0], dtype=F64)
    r = torch.stack([r1, 7.0 - r1], 1)
    c = gdpo.normalize_rewards(r, group_size=8, weights=[1.7e308, 1.7e308])
    assert _bits(c) == ["0x0.0p+0"] * 8
    a = gdpo.gdpo_advantages(r, group_size=4, weights=[1e300, 1e-300])
    assert torch.isfinite(a).all()


# --- structure: grouping, units, determinism, dtypes ----------------------------------------


def _random_batch(seed, n_groups=6, k=3):
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(2, 7, (n_groups,), generator=g).tolist()
    n = sum(sizes)
    r = torch.randn(n, k, generator=g, dtype=F64) * 10.0 ** torch.randint(-3, 4, (k,), generator=g) \
        + 10.0 ** torch.randint(0, 8, (k,), generator=g)
    r[:, 0] = r[:, 0].round()  # ties and constant columns
    labels = [lab for lab, s in zip(random.Random(seed).sample(range(100), n_groups), sizes) for _ in range(s)]
    return r, sizes, labels


@pytest.mark.parametrize("seed", range(4))
def test_random_batches_within_error_model(seed):
    r, sizes, labels = _random_batch(seed)
    w = [1.0, -0.5, 2.0]
    units = [0] * (r.shape[0] // 2) + [1] * (r.shape[0] - r.shape[0] // 2)
    seg = [units.count(0), units.count(1)]
    ex = exact_gdpo(r.tolist(), labels, w, units)
    c = gdpo.normalize_rewards(r, group_ids=labels, weights=w)
    assert_within(_np(c), ex["c"], ex["dc"], "float64", f"Eq. 4+7 seed {seed}")
    for out_dtype in ("float64", "float32"):
        a = gdpo.gdpo_advantages(r, group_ids=labels, weights=w, segment_sizes=seg, out_dtype=getattr(torch, out_dtype))
        assert_within(_np(a), ex["a"], ex["da"], out_dtype, f"advantages seed {seed}")


def test_pipeline_is_whiten_of_normalize_bitwise():
    """The plain path's arithmetic (the certificate off: a certified float64 output is the exact
    advantage's faithful rounding, not whiten of the rounded c)."""
    r, sizes, labels = _random_batch(7)
    c = gdpo.normalize_rewards(r, group_ids=labels)
    seg = [5, r.shape[0] - 5]
    assert _bits(gdpo.gdpo_advantages(r, group_ids=labels, segment_sizes=seg, out_dtype=F64, certified="off")) == \
        _bits(gdpo.whiten(c, segment_sizes=seg, out_dtype=F64, certified="off"))


def test_contiguous_labels_equal_group_size_bitwise_and_order_follows_input():
    g = torch.Generator().manual_seed(3)
    r = torch.randn(12, 2, generator=g, dtype=F64) + 1e4
    by_size = gdpo.normalize_rewards(r, group_size=4)
    by_ids = gdpo.normalize_rewards(r, group_ids=[9, 9, 9, 9, 2, 2, 2, 2, 5, 5, 5, 5])
    assert _bits(by_size) == _bits(by_ids)
    perm = torch.randperm(12, generator=g)
    labels = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)[perm]
    shuffled = gdpo.normalize_rewards(r[perm], group_ids=labels)
    # same group members in a different order: the same values up to rounding, in the input order
    assert torch.allclose(shuffled, by_size[perm], rtol=0, atol=1e-12)
    inside = torch.tensor([0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11])  # interleaved, order kept within groups
    assert _bits(gdpo.normalize_rewards(r[inside], group_ids=[0, 1, 2] * 4)) == _bits(by_size[inside])


def test_determinism_same_bits_twice():
    r, sizes, labels = _random_batch(11)
    runs = [_bits(gdpo.gdpo_advantages(r, group_ids=labels, segment_sizes=[7, r.shape[0] - 7], out_dtype=F64))
            for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]


def test_segmented_whitening_is_a_different_objective():
    """Two optimizer batches whitened as one unit flip 4 of 8 signs (the seed's case)."""
    v = torch.tensor([1.0, 2.0, 3.0, 4.0, 11.0, 12.0, 13.0, 14.0], dtype=F64)
    per_unit = gdpo.whiten(v, segment_sizes=[4, 4], out_dtype=F64)
    merged = gdpo.whiten(v, out_dtype=F64)
    flips = int((torch.sign(per_unit) != torch.sign(merged)).sum())
    assert flips == 4
    assert torch.equal(per_unit[:4], per_unit[4:])  # shift invariance: unit 2 is unit 1 + 10
    with_empty = gdpo.whiten(v, segment_sizes=[4, 0, 4, 0], out_dtype=F64)
    assert torch.equal(with_empty, per_unit)


def test_whiten_collapse_is_exact_even_without_eps():
    v = torch.tensor([0.1] * 5 + [3.0, 4.0], dtype=F64)
    for eps in (DEFAULT_EPS, 0.0):
        out = gdpo.whiten(v, segment_sizes=[5, 2], eps=eps, out_dtype=F64)
        assert _bits(out[:5]) == ["0x0.0p+0"] * 5 and torch.isfinite(out).all()
    z = gdpo.normalize_rewards(torch.tensor([[0.1, 1.0]] * 3, dtype=F64), group_size=3, eps=0.0)
    assert _bits(z) == ["0x0.0p+0"] * 3
    assert gdpo.whiten(torch.empty(0)).shape == (0,)


@pytest.mark.parametrize("seed", range(6))
def test_group_has_signal_agrees_with_normalize(seed):
    r, sizes, labels = _random_batch(seed, n_groups=8, k=2)
    cut = sizes[0] + sizes[1]
    r[:cut, 1] = 1e9 - r[:cut, 0]  # constant-sum columns ...
    w = [1.0, 1.0]
    r[sizes[0]: cut, 0] = r[sizes[0], 0]  # ... and one group with both columns constant
    r[sizes[0]: cut, 1] = 1e9 - r[sizes[0]: cut, 0]
    c = gdpo.normalize_rewards(r, group_ids=labels, weights=w)
    sig = gdpo.group_has_signal(r, group_ids=labels, weights=w)
    order = list(dict.fromkeys(labels))
    expect = [bool(c[[i for i, l in enumerate(labels) if l == g]].min() != c[[i for i, l in enumerate(labels)
                                                                          if l == g]].max()) for g in order]
    assert sig.dtype == torch.bool and sig.tolist() == expect
    assert expect[0] is False and expect[1] is False and any(expect)
    muted = gdpo.group_has_signal(r, group_ids=labels, weights=[0.0, 1.0])  # a muted column
    assert muted.shape == (len(order),)


def test_output_dtypes_and_low_precision_inputs():
    r = torch.tensor(TWO_GROUP, dtype=F64)
    assert gdpo.normalize_rewards(r, group_size=2).dtype == F64
    assert gdpo.gdpo_advantages(r, group_size=2).dtype == F32
    assert gdpo.whiten(r[:, 0]).dtype == F32
    assert gdpo.gdpo_advantages(r, group_size=2, out_dtype=torch.bfloat16).dtype == torch.bfloat16
    ref = gdpo.gdpo_advantages(r, group_size=2, out_dtype=F64)
    for low in (torch.float16, torch.bfloat16, F32):
        # these values are exact in every format, so the results are the same bits
        assert _bits(gdpo.gdpo_advantages(r.to(low), group_size=2, out_dtype=F64)) == _bits(ref)
    assert _bits(gdpo.normalize_rewards(r[:, 0], group_size=2)) == \
        _bits(gdpo.normalize_rewards(r[:, :1], group_size=2))  # (N,) is K = 1
    assert _bits(gdpo.normalize_rewards([0.0, 1.0, 5.0, 2.0], group_size=2)) == \
        _bits(gdpo.normalize_rewards(torch.tensor([0.0, 1.0, 5.0, 2.0], dtype=F64), group_size=2))


def test_square_root_is_correctly_rounded():
    """Eq. 4 and Eq. 6 take one square root each; impl corrects torch.sqrt (only faithful on
    some CPU builds) to the correctly rounded root, so CPU and CUDA agree bit for bit."""
    from impl._segments import sqrt_rn

    g = torch.Generator().manual_seed(0)
    m = torch.randint(2 ** 52, 2 ** 53, (20000,), generator=g, dtype=torch.int64).to(F64)
    sq = m * m
    q = torch.cat([torch.rand(20000, dtype=F64, generator=g) * 10.0 ** torch.randint(-250, 250, (20000,), generator=g),
                   sq, torch.nextafter(sq, 2 * sq), torch.nextafter(sq, torch.zeros_like(sq)),
                   torch.tensor([0.0, 0.125, 2.0, 1.0, 3.0, 1e-300], dtype=F64)])
    ref = [math.sqrt(x).hex() for x in q.tolist()]
    assert [x.hex() for x in sqrt_rn(q).tolist()] == ref


# --- layouts: the pairwise tree depends on a segment's length only ---------------------------


def _ragged_labels(seed, n_groups=40, k=3):
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(2, 9, (n_groups,), generator=g)
    sizes[3] = 37  # one long group: padding everything to it would be wasteful
    n = int(sizes.sum())
    r = torch.randn(n, k, generator=g, dtype=F64) * 10.0 ** torch.randint(-3, 4, (k,), generator=g) \
        + 10.0 ** torch.randint(0, 9, (k,), generator=g)
    r[:, 0] = r[:, 0].round()
    labels = torch.repeat_interleave(torch.randperm(n_groups, generator=g) * 3 - 7, sizes)
    return r, labels[torch.randperm(n, generator=g)]


@pytest.mark.parametrize("seed", range(3))
def test_padded_bucketed_and_looped_layouts_agree_bit_for_bit(seed, monkeypatch):
    """Labelled groups padded to the longest group, cut into size buckets, and
    ragged units padded or taken one at a time: the same bits (the tree of a
    segment is fixed by its length, padding only adds zeros)."""
    import impl._eq47 as groups_mod
    import impl._whiten as whiten_mod

    r, labels = _ragged_labels(seed)
    n = r.shape[0]
    seg = [5, n - 5 - 40, 0, 40]
    w = [1.0, -0.5, 3.0]

    def run():
        return (_bits(gdpo.normalize_rewards(r, group_ids=labels, weights=w)),
                _bits(gdpo.gdpo_advantages(r, group_ids=labels, weights=w, segment_sizes=seg, out_dtype=F64)),
                gdpo.group_has_signal(r, group_ids=labels, weights=w).tolist(),
                _bits(gdpo.whiten(r[:, 1], segment_sizes=seg, out_dtype=F64)))

    real_bucketed, cut = groups_mod._bucketed, []

    def spy():  # the layout each run takes: the comparison pins nothing if both take the same
        monkeypatch.setattr(groups_mod, "_bucketed", lambda *a, **k: cut.append(1) or real_bucketed(*a, **k))

    spy()
    monkeypatch.setattr(groups_mod, "CPU_PAD_FACTOR", math.inf)  # one padded layout, even on CPU
    padded = run()
    assert not cut, "the padded reference was cut into buckets"
    monkeypatch.undo()
    spy()
    for mod in (groups_mod, whiten_mod):
        monkeypatch.setattr(mod, "PAD_FACTOR", 0)
        monkeypatch.setattr(mod, "PAD_SLACK", 0)
    assert run() == padded
    assert cut, "the bucketed run was not cut into buckets"
    # and a unit alone gives the bits it has among others
    alone = gdpo.whiten(r[5: n - 40, 1], out_dtype=F64)
    assert _bits(alone) == padded[3][5: n - 40]


def test_contiguous_and_labelled_groups_give_the_same_bits_for_every_group_size():
    g = torch.Generator().manual_seed(9)
    for size in (2, 3, 5, 8, 13, 16):
        r = torch.randn(size * 7, 3, generator=g, dtype=F64) * 1e3 + 1e9
        labels = torch.arange(size * 7) // size
        a = gdpo.gdpo_advantages(r, group_size=size, out_dtype=F64, segment_sizes=[size * 3, size * 4])
        b = gdpo.gdpo_advantages(r, group_ids=labels, out_dtype=F64, segment_sizes=[size * 3, size * 4])
        assert _bits(a) == _bits(b), size


def test_graphable_device_part_is_the_call():
    """The device part a CUDA graph captures (no host read, checks without
    branches) gives the call's bits and the facts that name a bad reward."""
    import dataclasses

    from impl import _certify, _inputs, _pipeline
    from impl import _problems as P

    def part(x):  # planned as on CUDA: no lazy search (every check without a branch)
        call = _inputs.check_local(rewards=x, group_size=8, weights=w, segment_sizes=[40, 56], eps=DEFAULT_EPS,
                                   out_dtype=F32)
        plan = dataclasses.replace(_pipeline.local(call, _pipeline.GDPO), lazy=False)
        return _pipeline.device_part(plan, call.inp.rewards)

    g = torch.Generator().manual_seed(4)
    r = torch.randn(96, 3, generator=g) * 5 + 1e4
    w = [1.0, -2.0, 0.5]
    dev = part(r)
    # float64 where the certificate decides the rounding (the default for float32): one rounding then
    assert dev.a.dtype == (F64 if F32 in _certify.CERTIFIES[_inputs.check_certified(None)] else F32)
    assert _bits(dev.a.to(F32)) == _bits(gdpo.gdpo_advantages(r, group_size=8, weights=w, segment_sizes=[40, 56]))
    bad = r.clone()
    bad[50, 1] = -math.inf
    facts = part(bad).facts
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in facts.values())  # the facts: 0-d tensors by column
    row = [0] * P.ROW_WIDTH
    row[P.PRESENT], row[P.K], row[P.ROWS], row[P.GROUP_SIZE] = 1, 3, 96, 8
    for col, v in facts.items():
        row[col] = int(v)
    with pytest.raises(gdpo.NonFiniteError, match=r"rewards\[50, 1\] \(row 50, reward column 1, group 6 .*\) is -inf"):
        P.raise_local(row)


def _tree_reference(vals):
    """The canonical pairwise tree, position by position: level s adds p + s into p."""
    vals = list(vals)
    s = 1
    while s < len(vals):
        for p in range(0, len(vals), 2 * s):
            if p + s < len(vals):
                vals[p] = vals[p] + vals[p + s]
        s *= 2
    return vals[0]


@pytest.mark.parametrize("m", [1, 2, 3, 5, 7, 8, 13, 16, 31, 100])
def test_tree_sum_is_the_canonical_tree(m):
    from impl import _segments as seg_ops

    g = torch.Generator().manual_seed(m)
    x = torch.randn(3, m, 5, generator=g, dtype=F64) * 10.0 ** torch.randint(-8, 9, (3, m, 5), generator=g)
    for squares in (False, True):
        plain = seg_ops.tree_sum(x, squares=squares)
        assert plain.shape == (3, 1, 5)
        src = x * x if squares else x
        ref = [_tree_reference(src[a, :, b].tolist()) for a in range(3) for b in range(5)]
        assert _bits(plain.reshape(-1)) == [float(v).hex() for v in ref]


def test_cached_constants_keep_the_sign_of_zero():
    """impl keeps small constants (weights, counts) on the device, keyed by value; 0.0 and
    -0.0 compare equal, yet a weight of -0.0 flips the sign of zero products, so a call with
    weights (1, -0.0) must not reuse the tensor of an earlier call with (1, 0.0)."""
    from impl import _segments

    plus = _segments.constant((1.0, 0.0), torch.float64, torch.device("cpu"))
    minus = _segments.constant((1.0, -0.0), torch.float64, torch.device("cpu"))
    assert math.copysign(1.0, float(plus[1])) == 1.0
    assert math.copysign(1.0, float(minus[1])) == -1.0


def test_inputs_that_require_grad_are_read_as_values():
    """Advantages are data: every public function runs without autograd, so rewards or
    values that require grad give the detached input's bits, and no result requires grad
    (torch's out= kernels used to raise a RuntimeError on such input)."""
    gen = torch.Generator().manual_seed(7)
    r = torch.rand(12, 3, generator=gen, dtype=torch.float64)
    labels = torch.tensor([3, 3, 1, 1, 1, 9, 9, 3, 1, 9, 9, 3])
    calls = {
        "gdpo_advantages": lambda x: gdpo.gdpo_advantages(x, group_size=2, segment_sizes=[4, 8]),
        "gdpo_advantages_labels": lambda x: gdpo.gdpo_advantages(x, group_ids=labels, out_dtype=torch.float64),
        "normalize_rewards": lambda x: gdpo.normalize_rewards(x, group_size=3),
        "group_has_signal": lambda x: gdpo.group_has_signal(x, group_ids=labels),
        "whiten": lambda x: gdpo.whiten(x[:, 0], segment_sizes=[5, 7]),
    }
    for name, call in calls.items():
        want = call(r)
        for dtype in (torch.float64, torch.float32):
            leaf = r.to(dtype).requires_grad_(True)
            got = call(leaf)
            assert not got.requires_grad, name
            assert torch.equal(got, call(leaf.detach())), name
        assert torch.equal(call(r.clone().requires_grad_(True)), want), name


def test_very_ragged_units_share_a_padded_layout_per_size_class():
    """Units so ragged that one padded layout would exceed 4x the rows are cut into
    power-of-two size classes, one padded layout each: as many passes as classes, not
    units (20,000 units of 2 beside one of 70,000 took one pass per unit, about 4 s on
    CPU). Each unit keeps the bits it has alone, through the local path and through
    the statistics table and merge the distributed path uses."""
    import impl._whiten as W

    g = torch.Generator().manual_seed(11)
    sizes = [2] * 3000 + [0] * 50 + [3, 5, 7] * 40 + [9000]
    v = torch.randn(sum(sizes), generator=g, dtype=F64) * 1e3 + 1e7
    eps = 1e-4
    loc = W.local_stats(v, sizes, eps)
    assert loc.lay.kind == "buckets"
    assert len(loc.parts) == len({s.bit_length() for s in sizes if s})  # 4 classes, not 3,121 units
    got = gdpo.whiten(v, segment_sizes=sizes, out_dtype=F64)
    alone, at = [], 0
    for s in sizes:
        if s:
            alone.append(gdpo.whiten(v[at:at + s], out_dtype=F64))
        at += s
    assert _bits(got) == _bits(torch.cat(alone))
    merged = W.apply_global(loc, W.merge(loc.table(v.device)[None]), eps, F64)
    # the merge against the plain local path (the certificate reads neither)
    assert _bits(merged) == _bits(gdpo.whiten(v, segment_sizes=sizes, eps=eps, out_dtype=F64, certified="off"))


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("g", [8, 16])
def test_kept_scratch_never_reaches_a_result(k, g):
    """Eq. 4's tree levels live in scratch kept between calls (impl._segments.scratch, keep=):
    no result of any entry point may be a view of it. Each entry point's results of one call,
    float64 and narrow, stay as they were after later calls on other rewards reuse the scratch,
    and equal a recompute."""
    torch.manual_seed(g + k)
    calls = {
        "standardize_groups": lambda r: gdpo.standardize_groups(r, group_size=g),
        "normalize_rewards": lambda r: gdpo.normalize_rewards(r, group_size=g),
        "gdpo64": lambda r: gdpo.gdpo_advantages(r, group_size=g, out_dtype=torch.float64),
        "gdpo32": lambda r: gdpo.gdpo_advantages(r, group_size=g),
    }
    first = torch.randn(1 << 15, k)
    kept = {name: fn(first) for name, fn in calls.items()}
    saved = {name: out.clone() for name, out in kept.items()}
    for _ in range(2):
        for fn in calls.values():
            fn(torch.randn(1 << 15, k) * 3 + 1)
    for name, fn in calls.items():
        assert torch.equal(kept[name], saved[name]), name
        assert torch.equal(fn(first), saved[name]), name


def test_lazily_negated_tensors_are_read_as_their_values():
    """A tensor carrying torch's lazy negation (``torch._neg_view``, the imaginary part of a
    conjugate: its bits are the values' negatives) is read as its values: the same advantages
    as the negation resolved."""
    g = torch.Generator().manual_seed(0)
    r = torch._neg_view(torch.randint(-1, 2, (4096, 2), generator=g).to(torch.float32))
    assert r.is_neg()
    want = gdpo.gdpo_advantages(r.resolve_neg(), group_size=8)
    got = gdpo.gdpo_advantages(r, group_size=8)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
