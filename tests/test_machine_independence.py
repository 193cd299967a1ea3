"""What a grading checks does not depend on what the graded code returns (issue 24 part 1).

`gdpo check` (the ``grade`` profile) draws every property's cases first, with the property's
seed (conformance/runner.py), so two machines whose arithmetic differs in the last bits check
the same cases. Proved here by grading implementations that return very different things (the
correct base, a negative control wrong everywhere, one that refuses every call, one whose answers
depend on a process-wide coin) and comparing the cases each was checked on, as the grading's
JSON records them (a digest per property). The negative control of that comparison is
hypothesis's own search (the ``ci`` profile): there the cases checked follow the outcomes.
"""

from __future__ import annotations

import dataclasses

import pytest

from conformance import controls as C
from conformance import grading as G
from conformance import profiles
from conformance import properties as P
from conformance import runner as R
from conformance import strategies as S
from conformance.judge import ConformanceFailure
from conformance.subject import Subject

PROPS = ("plain", "range", "errors")
N = profiles.GRADE_MAX_EXAMPLES  # what gdpo check draws


def _refuses(rewards, *a, **k):
    raise RuntimeError("no")


def _garbage(rewards, *a, **k):
    out = C.baseline(rewards, *a, **k)
    return out * float("nan")


def _in_process(fn) -> Subject:
    fn.normalize_rewards, fn.whiten = C.baseline.normalize_rewards, C.baseline.whiten
    s = Subject(f"tests.test_machine_independence:{fn.__name__}")
    s._fn = fn
    return s


SUBJECTS = {
    "base": lambda: Subject(C.BASELINE.target),
    "float32_internals": lambda: Subject(C.CONTROLS["float32_internals"].target),
    "refuses": lambda: _in_process(_refuses),
    "garbage": lambda: _in_process(_garbage),
}


def _checked(prop, subject) -> list[str]:
    """The cases a drawn-first run of ``prop`` checked before its reduction, as exact JSON."""
    seen: list[str] = []
    cases = R.planned_cases(prop, subject, N)

    def check(case):
        seen.append(R.case_text(case))
        prop.check(subject, case, prop.name)

    try:
        R.grade_cases(subject, cases, check)
    except ConformanceFailure:
        pass
    return seen[:len(cases)]  # what follows is the reduction of a failure, which may follow outcomes


@pytest.mark.parametrize("name", PROPS)
def test_the_cases_checked_are_the_same_whatever_the_code_returns(name, monkeypatch):
    monkeypatch.setattr(R, "REDUCE_CALLS", 0)  # what follows a failure is not compared: not spent either
    prop = P.BY_NAME[name]
    runs = {who: _checked(prop, make()) for who, make in SUBJECTS.items()}
    base = runs.pop("base")
    assert len(base) >= N, (name, len(base))
    for who, seen in runs.items():
        assert seen == base, f"{name}: the cases checked for {who} differ from those for the correct base"


def test_the_digest_recorded_is_that_of_the_cases_checked():
    subject = SUBJECTS["float32_internals"]()
    row, found = G._check_row(subject, "plain")
    cases = R.row_cases("plain", subject, profiles.GRADE_MAX_EXAMPLES)
    assert row.digest == R.digest(cases) and row.cases == len(cases)
    assert row.failed == len(found) >= 1


def test_the_drawn_cases_do_not_depend_on_the_graded_codes_source():
    """hypothesis mixes the literal constants of loaded local modules into generation: the drawing
    empties that pool, so a graded module full of constants changes nothing."""
    prop = P.BY_NAME["plain"]
    before = R.digest(R.planned_cases(prop, SUBJECTS["base"](), 10))
    R._DRAWN.clear()
    import tests._native_impls  # noqa: F401 - a local module with many float literals
    assert R.digest(R.planned_cases(prop, SUBJECTS["base"](), 10)) == before



def test_the_drawn_cases_do_not_depend_on_strategies_built_before(monkeypatch):
    """Strategy factories are memoised on their arguments' exact values. Keyed on ``==`` (an
    lru_cache), ``pick((0, 0, 1))``, built first by a test of boundary.near_midpoint_cases, was
    handed back for ``pick((0.0, -0.0, 1.0))``: the ``missing`` row then drew 0 for -0.0 and
    rejected other controls than conformance/CONTROLS.md records, after that test only."""
    prop = P.BY_NAME["missing"]

    def drawn(*built) -> str:
        monkeypatch.setattr(S, "pick", S.cached(S.pick.__wrapped__))  # a memo that nothing filled
        monkeypatch.setattr(R, "_DRAWN", {})
        for values in built:
            S.pick(values)
        return R.digest(R.planned_cases(prop, SUBJECTS["base"](), N))

    assert drawn((0, 0, 1), (0.0, 1.0), (0.0,)) == drawn()


def test_strategies_equal_only_by_value_are_not_shared():
    assert S.pick((0, 0, 1)) is not S.pick((0.0, -0.0, 1.0))
    assert S.pick((0.0,)) is not S.pick((-0.0,)) and S.pick((1,)) is not S.pick((True,))
    assert S.pick([0.5, -0.0]) is S.pick((0.5, -0.0))  # a list is memoised as its tuple
    assert S.ints(0, 1) is S.ints(0, 1)

def test_hypothesis_search_follows_the_outcomes():
    """The negative control: under hypothesis's search (the ci profile, as `pytest conformance/`
    runs), the cases a failing implementation is checked on are not those a correct one is, so
    the comparison above can fail."""
    prop = P.BY_NAME["plain"]

    def searched(subject) -> list[str]:
        seen: list[str] = []
        real = prop.check

        def check(s, case, name):
            seen.append(R.case_text(case))
            return real(s, case, name)

        probe = dataclasses.replace(prop, check=check)
        try:
            R.build_test(probe, subject, R.control_settings())()
        except Exception:  # noqa: BLE001 - the failing one fails
            pass
        return seen

    assert searched(SUBJECTS["base"]()) != searched(SUBJECTS["float32_internals"]())


def _draws(n: int = 300) -> list[float]:
    """What a derandomized hypothesis test of the suite draws (the loaded profile's settings)."""
    from hypothesis import given, settings, strategies as st

    seen: list[float] = []

    @settings(max_examples=n, database=None, derandomize=True)
    @given(st.floats(allow_nan=False))
    def probe(x):
        seen.append(x)

    probe()
    return seen


#: float literals of the modules written for the tests (each its own: a module imported stays
#: in the process): hypothesis would draw them once the module is imported
_LITERALS = {"gdpo_literals_a": (7.123456789e-5, -3.3330517e11, 0.0421337, 6.02e-300, 1.5e-310),
             "gdpo_literals_b": (8.2469134e-5, -4.4441628e11, 0.0532448, 7.13e-300, 2.5e-310)}


def _import_module_of_literals(tmp_path, monkeypatch, name) -> set[float]:
    (tmp_path / f"{name}.py").write_text("".join(f"V{i} = {v!r}\n" for i, v in enumerate(_LITERALS[name])))
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__(name)
    return set(_LITERALS[name])


def test_the_suites_draws_do_not_depend_on_what_was_imported(tmp_path, monkeypatch):
    """Under the suite's profile (ci) a derandomized test draws the same examples whatever local
    modules the process imported before it (conformance/profiles.py drop_local_constants): an
    xdist worker's schedule, or a literal added anywhere in the project, changes no test's draws."""
    from hypothesis.internal.conjecture import providers as hp

    monkeypatch.setattr(hp, "_get_local_constants", hp._get_local_constants)  # restored after the test
    assert profiles.drop_local_constants()  # as profiles.load does for the ci profile
    before = _draws()
    literals = _import_module_of_literals(tmp_path, monkeypatch, "gdpo_literals_a")
    after = _draws()
    assert after == before and not literals & set(after)


def test_hypothesis_own_pool_draws_what_was_imported(tmp_path, monkeypatch):
    """The negative control: with hypothesis's own pool of local constants, importing a module
    changes what the same derandomized test draws (its literals appear among the examples)."""
    from hypothesis.internal.conjecture import providers as hp

    assert profiles.drop_local_constants() and profiles.HYPOTHESIS_POOL is not None
    monkeypatch.setattr(hp, "_get_local_constants", profiles.HYPOTHESIS_POOL)
    hp.CONSTANTS_CACHE.cache.clear()
    try:
        before = _draws()
        literals = _import_module_of_literals(tmp_path, monkeypatch, "gdpo_literals_b")
        after = _draws()
    finally:
        hp.CONSTANTS_CACHE.cache.clear()
    assert after != before and literals & set(after) and not literals & set(before)
