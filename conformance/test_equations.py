"""Spec section 1 (the three equations) and section 7 (the error model), end to end.

Each property draws inputs, calls the implementation under test (``--impl``) and
compares every output with the oracle's correctly rounded exact value under the
oracle's ``allowed(out_dtype)``; see conformance/properties.py for the claims.
"""

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
