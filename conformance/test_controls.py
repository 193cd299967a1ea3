"""Negative controls: each property rejects exactly the controls conformance/CONTROLS.md lists (on
its cases drawn first, conformance/runner.py), and the controls' base passes. Draws depend on
hypothesis's version: under another version than the table's, every control must still be rejected
by some property and every property reject some control (pinned examples hold the key rejections).
"""

import hypothesis
import pytest

from conformance import controls as C
from conformance import properties as P
from conformance import judge as J
from conformance import report
from conformance.subject import Subject

COMMITTED, VERSION = report.read_matrix()
EXACT = VERSION == hypothesis.__version__


@pytest.mark.parametrize("prop", P.PROPERTIES, ids=lambda p: p.name)
def test_property_rejects_its_controls(prop):
    rejected = sorted(c.name for c in C.CONTROLS.values() if report.verdict(prop, c.target)[0])
    if EXACT:
        assert rejected == COMMITTED.get(prop.name), (
            f"property {prop.name} now rejects {rejected}, CONTROLS.md says {COMMITTED.get(prop.name)}: "
            "regenerate it with `python -m conformance.report` (and say why it changed)")
    else:
        assert rejected, f"property {prop.name} rejects no negative control: it proves nothing"


@pytest.mark.parametrize("prop", P.PROPERTIES, ids=lambda p: p.name)
def test_baseline_passes(prop):
    """The base of every control is correct: a rejection is the flaw's, not the base's."""
    ok, case, first = report.verdict(prop, C.BASELINE.target)
    assert not ok, f"the controls' base fails {prop.name}: {first}\n{case.dumps() if case else ''}"


def test_table_version_is_read_exactly():
    """The version the rows were computed with is read without the sentence's full stop."""
    import re

    assert re.fullmatch(r"\d+(\.\d+)*", VERSION), VERSION
    assert f"hypothesis {VERSION}." in report.TABLE.read_text()


def test_table_lists_every_control_and_property():
    assert set(COMMITTED) == {p.name for p in P.PROPERTIES}
    for ctl in C.CONTROLS:
        assert any(ctl in rej for rej in COMMITTED.values()), f"control {ctl} is rejected by no property"
    for name, rej in COMMITTED.items():
        assert rej, f"property {name} rejects no control in CONTROLS.md"


def test_controls_are_importable_by_name():
    for ctl in C.CONTROLS.values():
        fn = Subject(ctl.target).fn
        assert fn is ctl.fn and callable(fn.normalize_rewards) and callable(fn.whiten)


@pytest.mark.parametrize("text", P.regressions.EXAMPLES["rounding"], ids=lambda t: P.regressions.load(t).out_dtype)
def test_rounding_controls_fail_the_pinned_midpoints(text):
    """The final cast, independent of generation: on each pinned advantage just off a
    midpoint, rounding through float32 first is rejected, truncating bfloat16 is rejected
    where it is written, and the base (one rounding, to odd through float32) conforms."""
    case = P.regressions.load(text)
    P.check_values(Subject(C.BASELINE.target), case)
    with pytest.raises(J.ConformanceFailure, match="outside the error model"):
        P.check_values(Subject(C.CONTROLS["double_rounding"].target), case)
    trunc = Subject(C.CONTROLS["truncated_bfloat16"].target)
    if case.out_dtype == "bfloat16":
        with pytest.raises(J.ConformanceFailure, match="outside the error model"):
            P.check_values(trunc, case)
    else:
        P.check_values(trunc, case)  # the flaw touches bfloat16 only
