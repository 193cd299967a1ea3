"""The implementation under test as a fixture. The options it reads (--impl,
--convention, --call-shape) are registered by conformance/plugins.py, a pytest plugin
the root conftest.py loads (and `gdpo check` passes with -p), so that they work from
the repository root with no path and are registered once."""

from __future__ import annotations

import pytest

from conformance.subject import Subject, parse_domain
from conformance import distributed


@pytest.fixture(scope="session")
def subject(request) -> Subject:
    """The implementation named; another one than this checkout's own is judged at its own
    precision, told by the probes (conformance/probes.py), unless --gdpo-strict."""
    from conformance import plugins, probes

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
