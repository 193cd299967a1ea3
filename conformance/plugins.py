"""The conformance suite's pytest plugin (registered by the root ``conftest.py``): the options that
choose the implementation under test (``pytest --impl package.module:function``: docs/grading.md,
"The run"), the markers, the hypothesis profile; another implementation is graded by the tests
under ``conformance/`` alone (:func:`pytest_collection_modifyitems`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conformance import profiles, runner
from conformance import judge as J
from conformance.subject import CALL_SHAPES, DEFAULT_IMPL, parse_domain, resolve_impl, shape_mismatch

#: The suite's markers, registered here so that ``--strict-markers`` holds wherever it runs.
MARKERS = {
    "slow": "the slow tier: deselected by the README's test command (-m \"not slow\"), run by .ci/run after it (-m slow)",
    "cuda": "needs a CUDA device (skipped without one)",
    "distributed": "spawns torch.distributed process groups",
}

#: The suite's tests of itself (its negative controls): they grade the suite, not the implementation
#: named. The tests of its machinery are the project's own (tests/test_suite_meta.py).
SELF_TESTS = ("test_controls.py",)


def pytest_configure(config):
    """Register the markers and load the hypothesis profile; a bad ``--impl`` is a usage error
    before collection, not a failure per property."""
    for name, what in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")
    if config.getoption("--strict-errors", default=False):
        os.environ[J.STRICT_ENV] = "1"  # read by J.strict_errors at each refusal
    runner.DRAW_FIRST = profiles.load() in profiles.DRAW_FIRST
    target = config.getoption("--impl", default=DEFAULT_IMPL)
    try:  # a bad --domain or --impl (an ImplSpecError is a ValueError)
        parse_domain(config.getoption("--domain", default=None))
        why = None if target == DEFAULT_IMPL else \
            shape_mismatch(resolve_impl(target), config.getoption("--call-shape", default="gdpo"))
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    if why is not None:  # else every call raises a TypeError, graded as refusals
        raise pytest.UsageError(f"--impl {target!r}: {why}")


def grades_another(config) -> bool:
    """Do the options name anything but this checkout's own implementation, shape and convention?"""
    return (config.getoption("--impl", default=DEFAULT_IMPL) != DEFAULT_IMPL
            or config.getoption("--call-shape", default="gdpo") != "gdpo"
            or config.getoption("--convention", default="spec") != "spec")


def pytest_collection_modifyitems(config, items):
    """Grading another implementation: only the tests under ``conformance/`` that grade it;
    ``--single-process``: not the tests that spawn ranks."""
    suite = Path(__file__).resolve().parent
    keep, drop = [], []
    for item in items:
        path = Path(str(item.path)).resolve()
        other = grades_another(config) and (suite not in path.parents or path.name in SELF_TESTS)
        ranks = config.getoption("--single-process", default=False) and item.get_closest_marker("distributed")
        (drop if other or ranks else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_header(config):
    if not grades_another(config):
        return []
    how = "the specification's own error model (--gdpo-strict)" if config.getoption("--gdpo-strict", default=False) else \
        "its own precision, told by the probes (conformance/probes.py)"
    return [f"gdpo conformance: grading {config.getoption('--impl')} (call shape {config.getoption('--call-shape')}, "
            f"convention {config.getoption('--convention')}) at {how}; only the tests under conformance/ that grade "
            "it run (gdpo check prints the findings, one per cause)"]


def pytest_addoption(parser):
    group = parser.getgroup("gdpo-conformance", "GDPO conformance suite")
    group.addoption("--impl", default=DEFAULT_IMPL,
                    help=f"implementation under test, package.module:function (default {DEFAULT_IMPL})")
    group.addoption("--convention", default="spec",
                    help="convention the implementation claims (a preset of spec/conventions.py; default spec)")
    group.addoption("--call-shape", default="gdpo", choices=CALL_SHAPES,
                    help="how to call it: gdpo (impl.gdpo's signature), trl (rewards, num_generations, "
                         "reward_weights) or verl (token_level_rewards, response_mask, index, weights -> (B, T))")
    group.addoption("--gdpo-strict", action="store_true", default=False,
                    help="hold another implementation to the specification's own error model instead of its "
                         "own precision (impl.gdpo and the controls always are)")
    group.addoption("--strict-errors", action="store_true", default=False,
                    help="the strict error contract: a refusal must raise the spec.errors class the contract "
                         "names (without it a clear refusal of another class passes, noted wrong_class)")
    group.addoption("--domain", action="append", default=[], metavar="KEY=VALUE",
                    help="declare the implementation's domain or deliberate limits (docs/grading.md)")
    group.addoption("--single-process", action="store_true", default=False,
                    help="grade an implementation for one process (no process_group): deselect the "
                         "multi-process properties")
