"""Issue 20: a peer is judged at its own working precision, by the error model of the
algorithm its convention names, and every failure says what it means (its category).

The converse holds too: a float32 code wrong by more than float32's precision, and a
float64 code with a noise floor, still fail, and so does a refusal of another class
under the strict error contract."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import seed

from conformance import properties as P

from conformance import judge as J

from conformance import runner as R
from conformance import report
from conformance.judge import distance
from conformance.subject import Subject
from spec.conventions import CONVENTIONS, differences


def _grade(prop: str, target: str, shape: str = "gdpo", convention: str = "spec"):
    """The failure of property ``prop`` on ``target`` (ci budget, fixed seed), or None."""
    p = P.BY_NAME[prop]
    subject = Subject(target, shape, convention)
    why = subject.unsupported(p.needs)
    assert why is None, why
    test = seed(R.property_seed(p))(R.build_test(p, subject, R.control_settings()))
    try:
        with R.no_local_constants():  # generation independent of which modules are loaded
            test()
    except J.ConformanceFailure as e:
        return e
    return None


def test_a_correct_float32_code_passes_at_float32():
    """TRL's formula in eager float32 torch: held to float64's unit roundoff it failed on
    binary rewards in pairs (1.47x its allowance); at its own precision it passes there, and
    on the near-midpoint property. (It fails range: float32 overflow of its statistics silently
    zeroes a column, as TRL's own code does, a real defect, categorised silent_zero.)"""
    assert _grade("rounding", "_native_impls:trl_float32", "trl", "trl") is None
    from conformance.cases import Case

    subject = Subject("_native_impls:trl_float32", "trl", "trl")
    binary = Case(rewards=((0.0,), (1.0,), (0.0,), (1.0,)), group_size=2, dtype="float32", out_dtype="float32")
    P.check_values(subject, binary, "plain")  # raises ConformanceFailure if it fails
    e = _grade("range", "_native_impls:trl_float32", "trl", "trl")
    assert e is not None and e.category == "silent_zero", e


def test_a_float32_code_wrong_beyond_float32_fails_with_its_category():
    e = _grade("plain", "_native_impls:trl_bfloat16_deviations", "trl", "trl")
    assert e is not None and e.category == "precision", e
    assert e.worst_dtype == "float32" and e.worst_ulps > 8, (e.worst_ulps, e.worst_dtype)
    assert "float32 arithmetic" in str(e) and "unit roundoff 2^-24" in str(e)


def test_a_float64_code_of_its_convention_passes_and_a_noise_floor_fails():
    assert _grade("plain", "_native_impls:multireward_float64", convention="multireward_grpo") is None
    e = _grade("plain", "_native_impls:multireward_noise_floor", convention="multireward_grpo")
    assert e is not None and e.category == "precision" and e.worst_dtype == "float64", e
    assert e.worst_ulps > 1000, e.worst_ulps


def test_graded_against_spec_a_peer_formula_is_named_a_formula_difference():
    e = _grade("plain", "_native_impls:multireward_float64")
    assert e is not None and e.category == "formula", e
    text = str(e)
    assert "formula difference from spec" in text and "biased std (ddof 0)" in text and "no Eq. 6" in text, text


def test_a_clear_refusal_of_another_class_passes_and_is_noted_unless_strict(monkeypatch):
    J.NOTES.clear()
    monkeypatch.delenv(J.STRICT_ENV, raising=False)
    assert _grade("errors", "_native_impls:plain_value_errors") is None
    assert any(cls == "ValueError" for _, cls in J.NOTES.get("errors", ())), J.NOTES
    monkeypatch.setenv(J.STRICT_ENV, "1")
    e = _grade("errors", "_native_impls:plain_value_errors")
    assert e is not None and e.category == "wrong_class" and "raised ValueError" in str(e), e


def test_nan_on_a_padding_token_is_a_non_finite_output():
    e = _grade("plain", "_native_impls:verl_nan_everywhere", "verl", "verl")
    assert e is not None and e.category == "non_finite", e
    assert "returned non-finite values (call shape 'verl': sample 0" in str(e) and "raised" not in str(e), str(e)


def test_categories_of_the_judge():
    one = np.ones(2)
    cond = np.ones(2)
    exact = np.array([1.0, -1.0])
    zero = distance(np.zeros(2), exact, one * 1e-7, cond, "float32", native_dtype="float32")
    assert zero.category == "silent_zero"
    nan = distance(np.array([math.nan, -1.0]), exact, one * 1e-7, cond, "float32", native_dtype="float32")
    assert nan.category == "non_finite" and nan.worst_ulps == math.inf
    off = distance(np.array([1.0 + 2 ** -20, -1.0]), exact, one * 1e-7, cond, "float32", native_dtype="float32")
    assert off.category == "precision" and off.worst_ulps == pytest.approx(8.0)  # 2^-20 / ulp32(1) = 2^-20 / 2^-23
    demanded = distance(np.array([1e-30, 0.0]), np.zeros(2), np.zeros(2), cond, "float32")
    assert demanded.category == "exact_zero"
    # a float32 code returning float64 is measured in float32 ulps, a float64 code's float32 output in float32's
    assert distance(exact, exact, one, cond, "float64", native_dtype="float32").judged_dtype == "float32"
    assert distance(exact, exact, one, cond, "float32", native_dtype="float64").judged_dtype == "float32"


def test_the_error_model_of_a_peer_is_its_own_algorithm_at_its_own_precision():
    """A constant column of large magnitude: spec's shift-invariant code must return 0 exactly;
    a mean-then-subtract float32 code is entitled to its rounded mean's residue, capped by
    Cauchy-Schwarz (not the residue over a tiny eps: 1e36)."""
    from oracle.gdpo import gdpo_advantages as advantages

    r = np.array([[3e38], [3e38], [3e38], [0.0], [1.0], [0.0]])
    g = [0, 0, 0, 1, 1, 1]
    spec = advantages(r, g, convention="spec")
    assert np.all(spec.allowed("float32")[:3] == 0.0)
    trl = advantages(r, g, convention="trl")
    allowed = trl.allowed("float32", CONVENTIONS["trl"].unit_roundoff)
    assert np.all(allowed[:3] > 0.0) and np.all(allowed < 3.0), allowed
    assert CONVENTIONS["spec"].algorithm == "shift_invariant"
    assert all(c.algorithm == "mean_then_subtract" for n, c in CONVENTIONS.items() if n != "spec")


def test_differences_name_each_equation():
    assert differences("spec") == []
    d = differences("verl")
    assert any(x.startswith("Eq. 6: Eq. 6 weighted by token counts") for x in d), d
    assert any("float32" in x for x in d), d


def test_a_column_zeroed_by_float32_overflow_is_a_silent_zero_with_its_explanation():
    """[[1e20], [0], [0], [1]] in groups of 2: the first group's squared deviations overflow
    float32, its z is silently 0 and Eq. 6 moves the other group too (TRL and ms-swift 4.6.0
    do this): reported as a silent zero, naming the group column."""
    from conformance.cases import Case

    subject = Subject("_native_impls:trl_squares_overflow", "trl", "trl")
    case = Case(rewards=((1e20,), (0.0,), (0.0,), (1.0,)), group_size=2, dtype="float32", out_dtype="float32")
    with pytest.raises(J.ConformanceFailure) as info:
        P.check_values(subject, case, "range")
    e = info.value
    assert e.category == "silent_zero", e
    assert "group 0 column 0 set to 0" in str(e) and "overflow float32" in str(e), e
    # the same code on rewards that fit: within float32's precision
    P.check_values(subject, Case(rewards=((3.0,), (0.0,), (0.0,), (1.0,)), group_size=2), "plain")


def test_several_ranks_are_judged_at_the_found_precision_too():
    """A code found to compute in float32 is held to float32's error model on several ranks as on
    one: the distributed rows used the specification's float64 model (a correct float32 code was
    told "accuracy beyond its own precision (several ranks)"). Held to float64, it still fails."""
    subject = Subject("_native_impls:impl_float32_rounding", "gdpo", "spec")
    p = P.BY_NAME["dist_values_2"]
    test = lambda: seed(R.property_seed(p))(R.build_test(p, subject, R.control_settings()))()
    subject.precision = "float32"
    test()  # raises ConformanceFailure if it fails
    subject.precision = "float64"
    with pytest.raises(J.ConformanceFailure) as e:
        test()
    assert e.value.category == "precision" and "of a correct float64 code" in str(e.value), e.value
