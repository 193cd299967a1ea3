"""Huge but finite eps: valid input (spec: eps must be finite and >= 0, else OutOfRangeError;
impl/_inputs.py check_eps has no upper limit), drawn by no conformance property (the ``eps``
property stops at 100).

* The oracle computes such cases without an exception and with finite bounds: Eq. 4's
  bound is evaluated in a frame of the column's range, and where eps 2^-e would exceed
  2^960 there the frame is lifted (oracle/exact.py ``eps_floor``); it raised OverflowError
  for eps above about 2^123 on a column whose range sits at the bottom of float64.
* impl.gdpo (advantages, normalize_rewards, whiten) is graded against the oracle with the
  conformance checks themselves (conformance/properties.py, conformance/judge.py), tolerances
  from the spec's error model, on rewards down to the subnormals, up to DBL_MAX, and collapsed groups.
* The verl mirror (tests/verl_mirror.py) is right in float64 in tiny frames, where its eps
  in the frame used to be capped at 2^1023 (a too large by about 2^88 at c ~ 2^-600).
* Eq. 4's error model covers the underflow of z itself (the term 3 (|z| + τ); it had only
  3 |z|, which rejected a correct float64 code once eps above about 10 pushed z below 2^-1074
  and a large weight magnified it): the cases that found it are tests below.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given

from conformance import subject as shapes
from conformance import properties as P
from conformance import judge as J
from conformance import runner as R
from conformance import strategies as S
from conformance.cases import Case
from conformance.judge import distance
from conformance.subject import Subject
from oracle import gdpo as og
from spec.conventions import CONVENTIONS

if str(Path(__file__).resolve().parent) not in sys.path:  # tests/verl_mirror.py (pytest puts it there too)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import verl_mirror  # noqa: E402

DBL_MAX = sys.float_info.max
HUGE_EPS = (2.0 ** 60, 2.0 ** 120, 1e200, 1e300, DBL_MAX)
IMPL = Subject("impl.gdpo:gdpo_advantages", "gdpo", "spec")

# ------------------------------------------------------------------ the oracle

#: Columns at the bottom and the top of float64, ordinary ones, and collapsed ones (a
#: constant zero column's frame comes from its ulp, 2^-1074: clamped at 2^-900 like a
#: subnormal range, where eps * 2^900 overflowed for eps >= 2^124).
ORACLE_REWARDS = {
    "subnormal": [[0.0, 1.0], [5e-324, 2.0], [1e-323, 1.0], [3e-323, 5.0]],
    "zeros": [[0.0, 0.0], [0.0, 0.0], [0.0, 3.0], [0.0, 1.0]],
    "tiny_normal": [[2.0 ** -1000, 1.0], [0.0, 0.0], [3 * 2.0 ** -1000, 1.0], [2.0 ** -1000, 0.0]],
    "huge": [[1e308, 1.0], [-1e308, 2.0], [DBL_MAX, 1.0], [0.0, 5.0]],
    "plain": [[0.0, 1.0], [1.0, 2.0], [3.0, 1.0], [7.0, 5.0]],
}


def _conventions():
    out = list(CONVENTIONS.values())
    for placement in ("var", "std_if_positive", "skip_if_zero"):  # every placement of Eq. 4's eps
        out.append(dataclasses.replace(CONVENTIONS["spec"], name=f"eq4_{placement}",
                                       group_eps_placement=placement))
    return out


@pytest.mark.parametrize("conv", _conventions(), ids=lambda c: c.name)
@pytest.mark.parametrize("eps", HUGE_EPS + (2.0 ** 124, 2.0 ** 250))
def test_oracle_computes_a_huge_eps_on_every_column(conv, eps):
    """No OverflowError, and every stage's bound, condition and allowance finite (units of 2
    samples: every unit has a spread)."""
    tc = np.array([1, 2, 3, 4]) if conv.whiten == "per_token" else None
    for name, r in ORACLE_REWARDS.items():
        res = og.gdpo_advantages(np.array(r), [0, 0, 1, 1], weights=[1.0, -2.0], eps=eps, convention=conv,
                            token_counts=tc)
        for stage in (res.z, res.combined, res):
            for what in ("delta", "cond"):
                assert np.all(np.isfinite(getattr(stage, what))), (name, what, getattr(stage, what))
            assert np.all(np.isfinite(stage.allowed("float64"))), (name, stage.allowed("float64"))
        # eps dwarfs every deviation: z is 0 up to rounding, never larger than (r - mean) / eps
        assert np.all(np.abs(res.z.float64) <= 1.0), (name, res.z.float64)


def test_oracle_z_bound_of_a_live_column_in_a_lifted_frame():
    """A column whose range is far below eps (2^-1000 against 2^124, its frame lifted from
    2^-900 to 2^-835): its z is certified (correctly rounded) and the column is live, not
    collapsed (a structural zero, demanded bit for bit)."""
    r = np.array([[2.0 ** -1000], [0.0], [3 * 2.0 ** -1000], [2.0 ** -1000]])
    res = og.gdpo_advantages(r, [0, 0, 0, 0], eps=2.0 ** 124)
    assert not res.group_collapsed.any() and not res.z.required_zero.any()
    assert np.all(res.z.float64 == 0.0)  # |z| < 2^-1100
    res = og.gdpo_advantages(r * 2.0 ** 900, [0, 0, 0, 0], eps=2.0 ** 124)  # range 2^-100: z ~ 2^-224
    assert np.all(res.z.float64 != 0.0) and np.all(res.z.delta > 0.0)


# ------------------------------------------------------------------ impl.gdpo

KINDS = ("binary", "plain", "tiny", "huge", "beyond32", "constant", "runs", "testfloat", "offset",
         "near_constant")

#: The conformance checks with eps drawn from HUGE_EPS, every weight mode included (extreme
#: weights magnify an underflowed z: test_eq4_bound_covers_z_underflow_under_large_weights).
HUGE_EPS_PROPERTIES = (
    P.Property("huge_eps_values", "decisions", "Eq. 4, 7, 6", "eps from 2^60 to DBL_MAX",
               P._values(kinds=KINDS, eps_values=HUGE_EPS), P.check_values, frozenset({"values", "eps"})),
    P.Property("huge_eps_normalize", "equations", "Eq. 4 + 7", "normalize_rewards, eps from 2^60 to DBL_MAX",
               P._values(kinds=KINDS, eps_values=HUGE_EPS, unit_modes=()), P.check_normalize, frozenset({"values", "stages", "eps"})),
    P.Property("huge_eps_whiten", "units", "Eq. 6", "whiten, eps from 2^60 to DBL_MAX",
               P._values(kinds=("plain", "testfloat", "constant", "runs", "near_constant", "huge", "tiny"),
                         pairs=(), k_max=1, eps_values=HUGE_EPS, unit_modes=("none", "groups", "free")),
               P.check_whiten, frozenset({"values", "stages", "eps"})),
)


@pytest.mark.parametrize("prop", HUGE_EPS_PROPERTIES, ids=lambda p: p.name)
def test_impl_within_the_error_model_at_huge_eps(prop):
    R.build_test(prop, IMPL)()


def _case(rewards, eps, out_dtype="float64", weights=None, group_size=2):
    return Case(rewards=tuple(tuple(row) for row in rewards), dtype="float64", group_size=group_size,
                weights=weights, eps=eps, out_dtype=out_dtype)


#: Inputs the oracle could not judge before its Eq. 4 frame was lifted (OverflowError).
PINNED = [
    ((0.0,), (0.0,)),  # a collapsed zero column
    ((5e-324,), (0.0,), (1e-323,), (3e-323,)),  # a subnormal range
    ((2.0 ** -1000, 1.0), (0.0, 0.0), (3 * 2.0 ** -1000, 1.0), (2.0 ** -1000, 0.0)),
    ((DBL_MAX, 1.0), (-DBL_MAX, 2.0), (1e308, 1.0), (0.0, 5.0)),
]


@pytest.mark.parametrize("eps", HUGE_EPS[1:])
@pytest.mark.parametrize("rows", PINNED, ids=["zeros", "subnormal", "tiny_normal", "dbl_max"])
def test_impl_on_pinned_huge_eps_inputs(rows, eps):
    for out_dtype in ("float64", "float32"):
        case = _case(rows, eps, out_dtype)
        P.check_values(IMPL, case)
        P.check_normalize(IMPL, case)
        if len(rows[0]) == 1:
            P.check_whiten(IMPL, dataclasses.replace(case, group_size=None, group_ids=(0,) * len(rows)))


#: A correct float64 code rounds z once; where that rounding underflows (|z| near or below
#: 2^-1074: a range far below the denominator) its absolute error, up to 2^-1075, is covered
#: by Eq. 4's model only through (n + 3) τ / D, so not once D > 2 (n + 3); Eq. 7 then
#: multiplies it by |w|, and c (and a, when Eq. 6's eps does not swamp c) falls outside its
#: bound. Eq. 6's model has the term 3 (|a| + τ); Eq. 4's had only 3 |z| until these cases
#: (within the suite's draws: eps 100, extreme weights, subnormal rewards; and beyond them:
#: huge eps) showed the gap. Now 3 (|z| + τ), as Eq. 6.
EQ4_GAP = [
    ("values", _case(((2.0 ** -1068,), (0.0,)), 100.0, weights=(2.0 ** 1000,))),
    ("values", _case(((2.0 ** -1068,), (0.0,)), 100.0, out_dtype="float32", weights=(2.0 ** 1000,))),
    ("normalize", _case(((2.0 ** -1068,), (0.0,)), 100.0, weights=(64.0,))),
    ("normalize", _case(((5e-324,), (5e-324,), (5e-324,), (0.0,)), 2.0 ** 60, weights=(2.0 ** 99,))),
    ("normalize", _case(((2.0 ** -1055,), (0.0,)), 1e300, weights=(2.0 ** 1000,))),
]


@pytest.mark.parametrize("check, case", EQ4_GAP, ids=lambda x: x if isinstance(x, str) else "")
def test_eq4_bound_covers_z_underflow_under_large_weights(check, case):
    # impl's z is the correctly rounded quotient (the oracle's own rounding of z): the
    # error is the rounding's, not the implementation's
    z = og.standardize_groups(case.rewards_array(), case.labels(), eps=case.eps)
    got = IMPL.stage("normalize_rewards")(torch.tensor(case.rewards_array()), group_size=case.group_size,
                                          weights=[1.0], eps=case.eps)
    assert np.array_equal(got.numpy(), z.float64[:, 0]), (got, z.float64)
    (P.check_values if check == "values" else P.check_normalize)(IMPL, case)


# ------------------------------------------------------------------ the verl mirror


#: Convention verl with the mirror's working precision: the mirror runs verl's algorithm in
#: float64, and the oracle's bound is in units of the convention's own u, its caps included
#: (spec/error_model.py noise_cap: the normalisation bound over SAFETY u). Under
#: verl itself (float32) a capped bound read with float64's u (allowed("float64")) is that
#: bound times 2^-29: tighter than any float64 code can be (weights cancelling to 2^-30).
VERL_FLOAT64 = dataclasses.replace(CONVENTIONS["verl"], name="verl_float64", native_dtype="float64")


def _mirror_float64(case: Case) -> None:
    """The mirror's arithmetic with a float64 final cast, graded against the oracle under
    convention verl (its call's token counts) at float64 precision, with the float64 allowance."""
    subject = Subject("verl_mirror:gdpo_advantages", "verl", "verl")
    kw = subject.verl_arguments(case)
    tc = shapes.verl_lengths(case.n)
    exp = J.oracle_verdict(case, VERL_FLOAT64, tc)
    assert exp.error is None, exp.error
    res = exp.result
    out = verl_mirror._advantages(**kw, out_dtype=torch.float64)
    assert out.dtype == torch.float64
    got = shapes.verl_per_sample(out, tc).numpy()
    v = distance(got, res.float64, res.allowed("float64"), res.cond, "float64", must_be_zero=res.required_zero)
    assert v.ok, f"{case.dumps()}\n" + "\n".join(v.rows)


@pytest.mark.parametrize("k", [-1074, -1000, -700, -600, -520, -490, -100, 0, 300, 1000])
def test_verl_mirror_right_in_float64_in_every_frame(k):
    """c ~ 2^k: below about 2^-493 eps 1e-8 in c's frame is beyond 2^960; the mirror used to
    cap it at 2^1023 (a too large by 2^88 at 2^-600), hidden by its float32 cast."""
    case = Case(rewards=((1.0, 0.5), (0.0, 0.25), (1.0, 0.0), (0.0, 1.0), (3.0, -2.0), (0.5, 0.5)), group_size=3,
                weights=(math.ldexp(1.0, k), math.ldexp(1.0, k - 3)))
    _mirror_float64(case)


def _finite(case: Case) -> bool:
    """Valid input (spec: finite rewards and weights; a non-finite one is refused, which is the
    error contract's to grade). The value strategies can step past the top of the range: a
    pair's second weight beside an extreme weight DBL_MAX (strategies._pair_weight: near,
    f32) and a near_constant column at float32's largest value are inf."""
    return all(math.isfinite(x) for x in (case.weights or ())) and \
        all(math.isfinite(v) for row in case.rewards for v in row)


@given(case=S.cases(Subject("verl_mirror:gdpo_advantages", "verl", "verl").context(),
                    kinds=("binary", "plain", "ints", "testfloat", "tiny", "constant", "runs", "near_constant"),
                    weight_modes=("extreme", "testfloat", "random", "ones")).filter(_finite))
def test_verl_mirror_right_in_float64(case):
    _mirror_float64(case)
