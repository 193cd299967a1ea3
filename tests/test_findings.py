"""Findings, not first failures (issue 25 part 1): a grading lists each cause once, with the
regime where it shows, the properties it showed in and the smallest example, and a second defect
beside a float32 overflow is not hidden by it.

The implementations are TRL's float32 formula (graded under the trl convention, at float32's
own precision: correct except where float32 overflows) and the same with one choice changed
(tests/_native_impls.py): each change must add a finding at ordinary magnitudes, and the
unchanged formula must have none there (the negative control of the regime's decision).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from conformance import findings as F
from conformance import profiles
from conformance import properties as P
from conformance import judge as J
from conformance import runner as R
from conformance.cases import Case
from conformance.subject import Subject

PROPS = ("plain", "testfloat", "range", "weights")


@functools.cache  # each implementation graded once per worker: several tests read its findings
def _findings(fn: str) -> list[dict]:
    subject = Subject(f"_native_impls:{fn}", "trl", "trl")
    records = []
    for name in PROPS:
        cases = R.planned_cases(P.BY_NAME[name], subject, profiles.GRADE_MAX_EXAMPLES)
        try:
            R.grade_cases(name, subject, cases, lambda c, n=name: P.BY_NAME[n].check(subject, c, n))
        except J.ConformanceFailure:
            pass
        records += R.RUNS.pop((name, "cpu"))["findings"]
    return F.group(records)


@pytest.fixture(scope="module")
def trl_float32():
    return _findings("trl_float32")


def test_a_float32_overflow_is_found_at_extreme_magnitudes_only(trl_float32):
    assert trl_float32, "TRL's float32 formula overflows on rewards near FLT_MAX: no finding"
    assert {f["regime"] for f in trl_float32} == {"extreme magnitudes"}, trl_float32
    assert not any(f["category"] == "formula" for f in trl_float32), trl_float32  # trl's own formula
    for f in trl_float32:
        assert f["category"] in ("silent_zero", "non_finite") and f["threshold"] >= 1e18, f
    merged = max(trl_float32, key=lambda f: len(f["properties"]))
    assert len(merged["properties"]) >= 2, "one cause showing in several properties is one finding"


@pytest.mark.parametrize("fn", ["trl_clipped", "trl_biased_std", "trl_eps_1e_2", "trl_leave_one_out"])
def test_a_second_defect_beside_the_overflow_gets_its_own_finding(fn, trl_float32):
    found = _findings(fn)
    ordinary = [f for f in found if f["regime"] == "ordinary magnitudes"]
    assert ordinary, f"{fn}: its own defect is not reported: {found}"
    assert any(f["regime"] == "extreme magnitudes" for f in found), f"{fn}: the overflow is no longer reported"
    small = min(ordinary, key=lambda f: f["size"])
    assert small["size"][0] <= 8 and small["size"][1] <= 3, small  # rows x columns of the example


#: What the diagnosis must name for each second defect (conformance/formulas.py's words).
NAMED = {"trl_clipped": "clipped", "trl_biased_std": "biased std", "trl_eps_1e_2": "eps",
         "trl_leave_one_out": "leave-one-out"}


@pytest.mark.parametrize("fn", sorted(NAMED))
def test_the_second_defect_is_named_as_a_formula(fn):
    """Issue 25 part 2: no declaration, and the finding at ordinary magnitudes is category formula
    naming the difference; the unchanged formula has no such finding (the negative control:
    test_a_float32_overflow_is_found_at_extreme_magnitudes_only)."""
    found = _findings(fn)
    formula = [f for f in found if f["category"] == "formula"]
    assert formula, f"{fn}: no formula finding: {found}"
    assert any(NAMED[fn] in (f["formula"] or "") for f in formula), formula
    assert all(f["regime"] == "ordinary magnitudes" for f in formula), formula
    assert any(f["regime"] == "extreme magnitudes" for f in found), f"{fn}: the overflow is no longer reported"


def test_the_regime_of_a_case():
    """The decision itself, on checks that fail only beyond a magnitude (or always)."""
    big = Case(((0.0,), (1e30,)), dtype="float64", group_size=2)

    def fails_beyond(limit):
        def check(case):
            if max(abs(v) for r in case.rewards for v in r) >= limit:
                e = J.ConformanceFailure("x")
                e.category = "silent_zero"
                raise e
        return check

    assert F.regime(fails_beyond(1e19), big, "silent_zero") == ("extreme magnitudes", 1e19)
    assert F.regime(fails_beyond(0.0), big, "silent_zero") == ("ordinary magnitudes", None)
    assert F.regime(fails_beyond(0.0), Case(((0.0,), (1.0,)), group_size=2), "precision")[0] == "ordinary magnitudes"
    assert F.regime(fails_beyond(0.0), Case(((0.0,), (1.0,)), group_size=2, note="error:nan_reward"),
                    "accepted")[0] == "bad input"
    # a value property's case whose reward rounded to inf in its dtype (offsets in float16) is bad input
    assert F.regime(fails_beyond(0.0), Case(((0.0,), (float("inf"),)), dtype="float16", group_size=2),
                    "accepted")[0] == "bad input"


def test_the_reduction_reaches_the_ends_of_float64():
    """Found by grading multireward-grpo: the power of ten above 1.7e308 is beyond float64, and
    computing it as 10.0 ** 309 raised OverflowError inside the reduction, which became the
    property's verdict. A value near either end of float64 has simpler values, none of them inf."""
    for v in (1.7976931348623157e308, -1e308, 5e-324, 3e-320):
        simpler = R._simpler(v, "float64")
        assert simpler and all(x == x and abs(x) != float("inf") for x in simpler), (v, simpler)


def _category_only(check, case, failure):
    """The judge's reduction before it kept a formula's name and its ambiguity: any smaller case
    failing in the same category was kept (the negative control below)."""
    try:
        check(case)
    except J.ConformanceFailure as exc:
        return exc if exc.category == failure.category else None
    except Exception:  # noqa: BLE001
        return None
    return None


def test_a_missing_whitening_is_named_once_not_guessed(monkeypatch):
    """A float32 TRL code without Eq. 6 (found by a new-user review): its first failures name
    "Eq. 6: none" on cases of several groups, but one group of two rewards, where the judge's
    reduction used to end, is reproduced alike by 47 variants, among them an Eq. 4 without its
    division by the std, which the finding then named. The reduction keeps a smaller case only
    where it names the same formula no more ambiguously, and a record whose case names another
    guess among the variants it cannot tell apart joins the finding that names one of them with
    fewer alike: one formula finding, Eq. 6's, its example a case that names it. The negative
    control (the reduction by category alone) names Eq. 4 and shows one group of two."""
    want = "Eq. 6: none (no batch whitening)"
    found = [f for f in _findings("trl_no_whitening") if f["category"] == "formula"]
    assert [f["formula"] for f in found] == [want], found
    assert found[0]["size"][0] > 2, found  # not one group of two rewards
    assert "cannot tell it from" in F.cause(found[0])  # its cases still leave variants alike: said
    _findings.cache_clear()
    monkeypatch.setattr(R, "_same", _category_only)
    try:
        old = [f for f in _findings("trl_no_whitening") if f["category"] == "formula"]
    finally:
        _findings.cache_clear()
    assert [f["formula"] for f in old] != [want] and old[0]["size"][0] == 2, old


def test_an_example_shows_the_rows_that_differ():
    """A finding's example collapses runs of equal rows, so the rows that matter show (a case of
    eight zero rows, then 1e+20, read '[[0], [0], ... (1 more rows)]' before: zeros only)."""
    from conformance.cases import Case
    big = float(np.float32(1e20))  # (a float32 case holds float32 values)
    case = Case(rewards=((0.0,),) * 8 + ((big,),) + ((0.0,),) * 3, group_size=12)
    text = F.describe(case)
    assert text.startswith("`[[0] (x8), [1e+20], [0] (x3)]`"), text
    plain = Case(rewards=((1.0,), (0.0,), (2.0,)), group_size=3)
    assert F.describe(plain).startswith("`[[1], [0], [2]]`")
    many = Case(rewards=tuple((float(i),) for i in range(12)), group_size=12)
    assert "... (4 more rows)" in F.describe(many)
