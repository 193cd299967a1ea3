"""Spec section 6 (the error contract): every refusal raises its GDPOError subclass.

Parametrized from the table of error cases (conformance/error_cases.py, ERROR_CASES,
one id each); where the oracle can express a case, the oracle is asserted to refuse
it with the same class, so the table and the spec's own judge cannot drift apart.
The ``errors`` property's pinned examples (conformance/regressions.json) are replayed
first by the test of the error case each one names.
"""

import pytest
from hypothesis import example, given

from conformance import properties as P


from conformance import error_cases as EC
from conformance import runner as R
from conformance import regressions
from spec.errors import ERROR_CLASSES


def pinned(name: str, ctx) -> list:
    """The pinned examples of the ``errors`` property noted ``error:<name>`` that the call
    shape can express."""
    out = []
    for text in P.BY_NAME["errors"].examples:
        case = regressions.load(text)
        if case.note == f"error:{name}" and R.expressible(case, ctx):
            out.append(case)
    return out


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
