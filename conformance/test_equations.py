"""Spec sections 1 (the three equations) and 7 (the error model), end to end: every output against
the oracle's correctly rounded exact value (claims: conformance/properties.py)."""

import pytest

from conformance import properties as P
from conformance import runner as R
from conformance.subject import Subject


@pytest.mark.parametrize("prop", P.of_section("equations"), ids=lambda p: p.name)
def test_property(prop, subject):
    R.run_for_pytest(prop, subject)


@pytest.mark.parametrize("prop", [P.BY_NAME["plain"], P.BY_NAME["cancellation"]], ids=lambda p: p.name)
def test_trl_call_shape(prop, subject):
    """The TRL-like call shape works end to end (impl.gdpo behind conformance.subject:impl_trl_shape)."""
    if subject.target != "impl.gdpo:gdpo_advantages" or subject.convention != "spec":
        pytest.skip("self-test of the trl call shape with the project's implementation only")
    R.run_for_pytest(prop, Subject("conformance.subject:impl_trl_shape", "trl", "spec"))
