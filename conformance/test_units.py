"""Spec section 4 (whitening units): Eq. 6 per unit, units of any layout, the whiten stage."""

import pytest

from conformance import properties as P
from conformance import runner as R


@pytest.mark.parametrize("prop", P.of_section("units"), ids=lambda p: p.name)
def test_property(prop, subject):
    R.run_for_pytest(prop, subject)
