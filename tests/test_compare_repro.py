"""The repro line printed with a conformance failure replays that failure.

For every property of the suite: a negative control (conformance/controls.py) that the
property rejects gives a failing case; the failure's message carries a repro line; that
line, handed to ``conformance.replay.main``, must report the same property's failure
(exit 1, the same headline, the same repro line), and the same line with the controls'
correct base as ``--impl`` must conform (exit 0). A repro line without ``--property``
replays a stage or error property's case under the end-to-end check (``values``): a
different claim, and the headline names ``values``, so this fails.
"""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from conformance import compare
from conformance import replay
from conformance import controls as C
from conformance import properties as P
from conformance import report
from conformance.subject import Subject

COMMITTED, _ = report.read_matrix()
PREFIX = ["python", "-m", "conformance.replay"]


def _failing_case(prop: P.Property):
    """(control, case, failure message): the first control of the committed table's row that the
    property rejects, its first failing case (ci settings, the report's seed), and the message of
    that case's failure, raised again outside hypothesis."""
    # local_raise is rejected by a hang, which costs the rank deadline on every run: tried last
    for name in sorted(COMMITTED.get(prop.name, ()), key=lambda n: n == "local_raise"):
        ok, case, _ = report.verdict(prop, C.CONTROLS[name].target)
        if not ok or case is None:
            continue
        with pytest.raises(AssertionError) as info:
            prop.check(Subject(C.CONTROLS[name].target), case, prop.name)
        return name, case, str(info.value)
    pytest.fail(f"no control of {COMMITTED.get(prop.name)} gives {prop.name} a failing case")


def _repro_argv(message: str) -> list[str]:
    lines = [ln.strip() for ln in message.splitlines() if ln.strip().startswith("repro: ")]
    assert len(lines) == 1, f"a failure carries one repro line:\n{message}"
    argv = shlex.split(lines[0][len("repro: "):])
    assert argv[:3] == PREFIX, lines[0]
    return argv[3:]


def _with(argv: list[str], opt: str, value: str) -> list[str]:
    i = argv.index(opt)
    return argv[:i + 1] + [value] + argv[i + 2:]


def _params():
    for prop in P.PROPERTIES:
        marks = [pytest.mark.distributed] if prop.world else []
        yield pytest.param(prop, id=prop.name, marks=marks)


@pytest.mark.parametrize("prop", list(_params()))
def test_repro_line_replays_the_same_property(prop, capsys):
    control, case, message = _failing_case(prop)
    argv = _repro_argv(message)
    assert argv[argv.index("--property") + 1] == prop.name, message
    capsys.readouterr()

    assert replay.main(argv) == 1, f"the repro of {control}'s {prop.name} failure does not fail:\n{message}"
    out = capsys.readouterr().out
    assert out.splitlines()[0] == message.splitlines()[0], (
        f"the repro replays another check than {prop.name}'s:\nfailure: {message}\nreplay: {out}")
    assert _repro_argv(out) == argv  # the replay's own repro line is the same command

    fixed = _with(argv, "--impl", C.BASELINE.target)
    assert replay.main(fixed) == 0, capsys.readouterr().out
    assert capsys.readouterr().out.startswith(f"[{prop.name}] conforms: ")


def test_repro_line_names_the_subjects_device_and_backend():
    case = P.regressions.load(P.regressions.EXAMPLES["plain"][0])
    line = compare.repro(Subject(C.BASELINE.target, device="cuda:1", backend="nccl"), case, "plain")
    argv = shlex.split(line)[3:]
    assert argv[argv.index("--device") + 1] == "cuda:1" and argv[argv.index("--backend") + 1] == "nccl"
    assert "--device" not in compare.repro(Subject(C.BASELINE.target), case, "plain")  # cpu/gloo: the defaults


def test_unknown_property_is_refused():
    case = P.regressions.load(P.regressions.EXAMPLES["plain"][0])
    with pytest.raises(SystemExit):
        replay.main(["--property", "stage_normalise", "--case", case.dumps()])


def test_error_case_without_property_goes_to_the_error_contract(capsys):
    """A repro line without --property (older ones) of an error case replays the error contract,
    not the end-to-end values check, which would call the broken case a refusal it cannot judge."""
    base = P.regressions.load(P.regressions.EXAMPLES["plain"][0])
    broken = dataclasses.replace(base, rewards=base.rewards[:3], group_size=None, group_ids=(1, 0, 0),
                                 note="error:group_of_one")
    assert replay._default_property(broken) == "errors"
    assert replay.main(["--impl", C.BASELINE.target, "--case", broken.dumps()]) == 0
    assert capsys.readouterr().out.startswith("[errors] conforms: ")
    assert replay.main(["--impl", C.CONTROLS["singleton_zero"].target, "--case", broken.dumps()]) == 1
    assert capsys.readouterr().out.startswith("[errors] [bad input accepted silently] error contract (group_of_one)")
    dist = P.regressions.load(P.regressions.EXAMPLES["dist_errors_2"][0])
    assert dist.note.startswith("error:") and replay._default_property(dist) == "dist_errors"
