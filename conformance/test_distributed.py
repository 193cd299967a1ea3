"""Spec section 5 (distributed protocol) on gloo: 2 ranks (a subgroup of a 4-rank
pool, so group ranks differ from global ranks) and 4 ranks.

One pool of spawned ranks per pytest worker serves every example (see
conformance/distributed.py); a rank that does not return within the deadline is a
failure (a hang), never a stuck test.
"""

import pytest

from conformance import properties as P
from conformance import runner as R

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("prop", P.of_section("distributed"), ids=lambda p: p.name)
def test_property(prop, subject):
    R.run_for_pytest(prop, subject)
