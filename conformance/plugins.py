"""The pytest plugin of the conformance suite: the options that choose the implementation
under test, and what a run keeps, deselects and reports (the implementation itself and
its call shapes: :mod:`conformance.subject`).

Pointing the suite at any implementation, without editing it::

    pytest --impl package.module:function [--convention NAME] [--call-shape gdpo|trl|verl]

from the repository root (a path such as ``conformance/`` may follow). When the
options name anything other than the defaults, only the tests under ``conformance/``
run (the rest test this checkout, not the implementation named): the others are
deselected, so the verdict is the implementation's alone, as ``gdpo check``'s; so are
the suite's self-tests (``SELF_TESTS``: ``conformance/test_controls.py``, every negative
control against every property, and ``conformance/test_suite_meta.py``, the judge's
plumbing), which grade the suite, not the implementation named; the report header and
summary say so. The options are this module's ``pytest_addoption``:
the root ``conftest.py`` registers this module as a pytest plugin, and ``gdpo check``
passes ``-p conformance.plugins`` (pytest registers a plugin once by name, so the
two never add the options twice).

Defaults: ``--impl impl.gdpo:gdpo_advantages --convention spec --call-shape gdpo``.

``--single-process`` (``gdpo check --single-process``) grades an implementation for
one process, one that takes no ``process_group`` (or refuses one): the multi-process
properties (``conformance/test_distributed.py``: ``dist_values_2``, ``dist_values_4``,
``dist_errors_2``, ``dist_errors_4``, which spawn gloo ranks and pass each a process
group) are deselected, not skipped, and the report header and summary say that they
were deselected by the option and so were not graded: the verdict is then the
single-process contract's only (spec sections 1-4, 6, 7), never the distributed
protocol's (section 5). Without it such an implementation fails them ("rank 0
raised ...; the contract computes this batch"). The trl and verl call shapes pass no
process group, and skip those properties with that reason.

``--convention`` names a preset of ``spec/conventions.py``; the oracle computes
that convention's mathematics exactly, so a peer is graded against its own
intended formula (the error contract and the distributed protocol are graded
under ``spec`` only).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance import profiles, properties
from conformance.subject import CALL_SHAPES, DEFAULT_IMPL, ImplSpecError, resolve_impl


#: The suite's pytest markers, registered by the plugin itself, so that ``--strict-markers``
#: holds wherever the suite runs (an installed package has no pyproject.toml of ours).
MARKERS = {
    "slow": "long-running (still part of CI)",
    "cuda": "needs a CUDA device (skipped without one)",
    "distributed": "spawns torch.distributed process groups",
}


def pytest_configure(config):
    """Register the markers and load the hypothesis profile (``conformance.profiles``);
    a bad ``--impl`` is a usage error before collection, not a failure per property.
    Only a spec other than the default is resolved here: ``impl.gdpo`` is this checkout's
    own, and the tests that use it import it themselves."""
    for name, what in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")
    profiles.load()
    target = config.getoption("--impl", default=DEFAULT_IMPL)
    if target != DEFAULT_IMPL:
        try:
            resolve_impl(target)
        except ImplSpecError as e:
            raise pytest.UsageError(str(e)) from None


def grades_another(config) -> bool:
    """Do the options name anything but this checkout's own defaults?"""
    return (config.getoption("--impl", default=DEFAULT_IMPL) != DEFAULT_IMPL
            or config.getoption("--call-shape", default="gdpo") != "gdpo"
            or config.getoption("--convention", default="spec") != "spec")


def single_process(config) -> bool:
    return bool(config.getoption("--single-process", default=False))


def multi_process_properties() -> list[str]:
    """The properties that spawn ranks (deselected by ``--single-process``)."""
    return [p.name for p in properties.PROPERTIES if p.world > 0]


#: The suite's tests of itself (every negative control against every property, the judge's
#: plumbing): they grade the suite, not the implementation named, take most of a run's time,
#: and a failure there is no fault of that implementation; grading another one deselects them.
SELF_TESTS = ("test_controls.py", "test_suite_meta.py")


def pytest_collection_modifyitems(config, items):
    """Grading another implementation (or call shape, or convention): keep the
    conformance suite's tests of that implementation only. The repository's other tests
    never call ``--impl``; run with it, they would only mix this checkout's verdict into
    it; the suite's self-tests (``SELF_TESTS``) grade the suite, not it.
    ``--single-process``: deselect the tests that spawn ranks (marked ``distributed``)."""
    suite = Path(__file__).resolve().parent
    keep, drop, own, multi = [], [], [], []
    for item in items:
        path = Path(str(item.path)).resolve()
        if grades_another(config) and suite not in path.parents:
            drop.append(item)
        elif grades_another(config) and path.parent == suite and path.name in SELF_TESTS:
            own.append(item)
        elif single_process(config) and item.get_closest_marker("distributed") is not None:
            multi.append(item)
        else:
            keep.append(item)
    config._gdpo_single_process_deselected = [item.nodeid for item in multi]
    config._gdpo_self_tests_deselected = [item.nodeid for item in own]
    if drop or own or multi:
        config.hook.pytest_deselected(items=drop + own + multi)
        items[:] = keep


def _self_tests() -> str:
    return ", ".join(f"conformance/{name}" for name in SELF_TESTS)


def pytest_report_header(config):
    lines = []
    if grades_another(config):
        lines.append(f"gdpo conformance: grading {config.getoption('--impl')} (call shape "
                     f"{config.getoption('--call-shape')}, convention {config.getoption('--convention')}); "
                     f"tests outside conformance/ are deselected, and so are the suite's self-tests ({_self_tests()}: "
                     "they grade the suite, not this implementation)")
    if single_process(config):
        lines.append("gdpo conformance: --single-process: the multi-process properties ("
                     + ", ".join(multi_process_properties()) + ", and every test marked distributed) are "
                     "deselected by this option and so are NOT graded: this verdict does not cover the "
                     "distributed protocol (spec section 5)")
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if grades_another(config):
        own = getattr(config, "_gdpo_self_tests_deselected", None)
        count = "the" if own is None else f"{len(own)}"  # None: collected elsewhere (pytest-xdist's workers)
        terminalreporter.write_line(
            f"gdpo conformance: {count} self-test(s) of the suite ({_self_tests()}) deselected: they grade the "
            f"suite, not {config.getoption('--impl')}")
    if not single_process(config):
        return
    gone = getattr(config, "_gdpo_single_process_deselected", None)
    if gone is None:  # collected elsewhere (pytest-xdist's workers): name the properties
        terminalreporter.write_line("gdpo conformance: the multi-process properties (" +
                                    ", ".join(multi_process_properties()) +
                                    ") were deselected by --single-process, not graded")
        return
    terminalreporter.write_line(
        f"gdpo conformance: {len(gone)} multi-process test(s) deselected by --single-process, "
        "not graded" + (": " + ", ".join(gone) if gone else ""))


def pytest_addoption(parser):
    """The suite's options (this module is a pytest plugin: see the module docstring)."""
    group = parser.getgroup("gdpo-conformance", "GDPO conformance suite")
    group.addoption("--impl", default=DEFAULT_IMPL,
                    help=f"implementation under test, package.module:function (default {DEFAULT_IMPL})")
    group.addoption("--convention", default="spec",
                    help="convention the implementation claims (a preset of spec/conventions.py; default spec)")
    group.addoption("--call-shape", default="gdpo", choices=CALL_SHAPES,
                    help="how to call it: gdpo (impl.gdpo's signature), trl (rewards, num_generations, "
                         "reward_weights) or verl (token_level_rewards, response_mask, index, weights -> "
                         "(B, T)); see conformance/plugins.py")
    group.addoption("--single-process", action="store_true", default=False,
                    help="grade an implementation for one process (no process_group): deselect the "
                         "multi-process properties (conformance/test_distributed.py), reported as not graded")
