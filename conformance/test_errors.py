"""Spec section 6 (the error contract): every refusal raises its GDPOError subclass, one test per
error case of conformance/error_cases.py; the errors property's pinned examples replay first."""

import pytest
from hypothesis import example, given

from conformance import error_cases as EC
from conformance import properties as P
from conformance import runner as R
from conformance import regressions


def pinned(name: str, ctx) -> list:
    """The errors property's pinned examples noted ``error:<name>`` that the call shape expresses."""
    cases = (regressions.load(text) for text in P.BY_NAME["errors"].examples)
    return [c for c in cases if c.note == f"error:{name}" and R.expressible(c, ctx)]


@pytest.mark.parametrize("case", EC.ERROR_CASES, ids=lambda e: e.name)
def test_error_case(case, subject):
    why = subject.unsupported(P.BY_NAME["errors"].needs) or subject.unasked(case)
    if why:
        pytest.skip(why)

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
