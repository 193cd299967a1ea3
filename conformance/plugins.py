"""The pytest plugin of the conformance suite: the options that choose the implementation under
test, its markers, the hypothesis profile, and what a run against another implementation keeps.

    pytest --impl package.module:function [--call-shape gdpo|trl|verl] [--convention NAME]

from the repository root runs the suite's properties against that implementation under
hypothesis's search (the ``ci`` profile: hill-climbing and shrinking steered by what the code
returns), one test per property, with the judge's full failure texts. ``gdpo check``
(:mod:`conformance.grading`) is the grading a maintainer reads: the same properties on cases drawn
first, the same on any machine, and the findings one per cause.

Naming another implementation (or call shape, or convention) keeps only the tests under
``conformance/`` that grade it: the repository's other tests and the suite's self-tests
(:data:`SELF_TESTS`, which grade the suite) are deselected. The implementation is judged at its
own precision, told by the probes (:mod:`conformance.probes`), unless ``--gdpo-strict`` holds it to the
specification's own error model, as the suite holds ``impl.gdpo`` and the negative controls.
``--single-process`` deselects the multi-process tests (marked ``distributed``).

The root ``conftest.py`` registers this module as a plugin (pytest registers a plugin once by name).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conformance import profiles, runner
from conformance import judge as J
from conformance.subject import CALL_SHAPES, DEFAULT_IMPL, ImplSpecError, parse_domain, resolve_impl, shape_mismatch

#: The suite's pytest markers, registered by the plugin itself, so that ``--strict-markers``
#: holds wherever the suite runs (an installed package has no pyproject.toml of ours).
MARKERS = {
    "slow": "the slow tier: deselected by the README's test command (-m \"not slow\"), run by .ci/run after it (-m slow)",
    "cuda": "needs a CUDA device (skipped without one)",
    "distributed": "spawns torch.distributed process groups",
}

#: The suite's tests of itself (every negative control against every property, the judge's
#: plumbing): they grade the suite, not the implementation named.
SELF_TESTS = ("test_controls.py", "test_suite_meta.py")


def pytest_configure(config):
    """Register the markers and load the hypothesis profile; a bad ``--impl`` is a usage error
    before collection, not a failure per property."""
    for name, what in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")
    if config.getoption("--strict-errors", default=False):
        os.environ[J.STRICT_ENV] = "1"  # read by J.strict_errors at each refusal
    loaded = profiles.load()
    runner.DRAW_FIRST = profiles.draws_first(loaded)
    try:
        parse_domain(config.getoption("--domain", default=None))
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    target = config.getoption("--impl", default=DEFAULT_IMPL)
    if target != DEFAULT_IMPL:
        try:
            fn = resolve_impl(target)
        except ImplSpecError as e:
            raise pytest.UsageError(str(e)) from None
        why = shape_mismatch(fn, config.getoption("--call-shape", default="gdpo"))
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
    """The suite's options (this module is a pytest plugin: see the module docstring)."""
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
