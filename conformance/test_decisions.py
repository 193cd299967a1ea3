"""Spec section 2 (decisions): exact collapse without tolerance, float64 weights, eps
added to the std at both equations."""

import pytest

from conformance import properties as P
from conformance import runner as R


@pytest.mark.parametrize("prop", P.of_section("decisions"), ids=lambda p: p.name)
def test_property(prop, subject):
    R.run_for_pytest(prop, subject)
