"""Spec section 5 (distributed protocol) on gloo: 2 ranks (a subgroup of a 4-rank pool, so group
ranks differ from global ranks) and 4; a rank that does not return in time is a failure (a hang).
"""

import pytest

from conformance import properties as P
from conformance import runner as R

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("prop", P.of_section("distributed"), ids=lambda p: p.name)
def test_property(prop, subject):
    R.run_for_pytest(prop, subject)
