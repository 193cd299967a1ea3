"""pytest options of the conformance suite: which implementation, which convention,
which call shape (see conformance/plugins.py for the call shapes)."""

from __future__ import annotations

import pytest

from conformance.plugins import CALL_SHAPES, DEFAULT_IMPL, Subject


def pytest_addoption(parser):
    group = parser.getgroup("gdpo-conformance", "GDPO conformance suite")
    group.addoption("--impl", default=DEFAULT_IMPL,
                    help=f"implementation under test, package.module:function (default {DEFAULT_IMPL})")
    group.addoption("--convention", default="spec",
                    help="convention the implementation claims (a preset of spec/conventions.py; default spec)")
    group.addoption("--call-shape", default="gdpo", choices=CALL_SHAPES,
                    help="how to call it: gdpo (impl.gdpo's signature) or trl (rewards, num_generations, "
                         "reward_weights)")


@pytest.fixture(scope="session")
def subject(request) -> Subject:
    opt = request.config.getoption
    return Subject(opt("--impl"), opt("--call-shape"), opt("--convention"))


@pytest.fixture(scope="session", autouse=True)
def _close_rank_pools():
    yield
    from conformance import distributed

    distributed.close_all()
