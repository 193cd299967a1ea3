"""Spec section 8 and GDPO_BRIEF section 5, the traps: offsets, constant-sum cancellation up to
2^53, float32 overflow, float64 values beyond float32 (the brief's figures pinned in regressions.json)."""

import pytest

from conformance import properties as P
from conformance import runner as R


@pytest.mark.parametrize("prop", P.of_section("traps"), ids=lambda p: p.name)
def test_property(prop, subject):
    R.run_for_pytest(prop, subject)
