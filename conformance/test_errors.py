"""Spec section 6 (the error contract): every refusal raises its GDPOError subclass, one test per
error case of conformance/error_cases.py; the errors property's pinned examples replay first."""

import pytest
from hypothesis import example, given

from conformance import error_cases as EC
from conformance import properties as P
from conformance import runner as R
from conformance import regressions
from spec.errors import ERROR_CLASSES


def pinned(name: str, ctx) -> list:
    """The errors property's pinned examples noted ``error:<name>`` that the call shape expresses."""
    cases = (regressions.load(text) for text in P.BY_NAME["errors"].examples)
    return [c for c in cases if c.note == f"error:{name}" and R.expressible(c, ctx)]


@pytest.mark.parametrize("case", EC.ERROR_CASES, ids=lambda e: e.name)
def test_error_case(case, subject):
    why = subject.unsupported(P.BY_NAME["errors"].needs)
    if why:
        pytest.skip(why)
    if subject.shape not in case.shapes:
        pytest.skip(f"call shape {subject.shape!r} cannot express {case.name}")

    def check(cases):
        P.check_error(subject, cases)

    strategy = EC.error_cases(subject.context(), subject.shape, names={case.name})
    if R.DRAW_FIRST:  # gdpo check: the cases drawn first, the same on any machine (conformance/runner.py)
        R.grade_cases(subject, R.row_cases(f"errors:{case.name}", subject), check)
        return
    run = given(cases=strategy)(check)
    for c in reversed(pinned(case.name, subject.context())):
        run = example(cases=(c,))(run)
    run()


def test_pinned_error_examples_reach_their_tests():
    """Every pinned example of the errors property names an error case, and the gdpo shape replays it."""
    from conformance.strategies import Context

    for text in P.BY_NAME["errors"].examples:
        case = regressions.load(text)
        name = case.note.split(":", 1)[1]
        assert name in EC.ERROR_BY_NAME, case.note
        assert any(c.dumps() == case.dumps() for c in pinned(name, Context())), text


def test_every_contract_class_is_exercised():
    """Each class of spec/errors.py is demanded by some error case or property."""
    demanded = {k.__name__ for e in EC.ERROR_CASES for c in e.expect for k in c.__mro__}  # GDPOError: every base
    demanded |= {"DistributedError", "OutOfRangeError"}  # dist_errors_*; the range property's refusal
    assert set(ERROR_CLASSES) <= demanded, sorted(set(ERROR_CLASSES) - demanded)
