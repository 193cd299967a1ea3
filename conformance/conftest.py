"""The implementation under test as a fixture; its options (--impl, --convention, --call-shape)
are registered once by conformance/plugins.py, the plugin the root conftest.py loads."""

from __future__ import annotations

import pytest

from conformance import distributed, plugins, probes
from conformance.subject import Subject, parse_domain


@pytest.fixture(scope="session")
def subject(request) -> Subject:
    """The implementation named; another one than this checkout's own is judged at its own
    precision, told by the probes, unless --gdpo-strict."""
    opt = request.config.getoption
    s = Subject(opt("--impl"), opt("--call-shape"), opt("--convention"),
                domain=parse_domain(opt("--domain", default=None)))
    if plugins.grades_another(request.config) and s.convention == "spec" and not opt("--gdpo-strict"):
        s.profile = probes.profile(s)
        s.precision = s.profile.precision
    return s


@pytest.fixture(scope="session", autouse=True)
def _close_rank_pools():
    yield
    distributed.close_all()
