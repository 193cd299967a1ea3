"""The suite's hypothesis profiles, chosen explicitly (hypothesis would otherwise switch
itself when it detects CI). ``ci`` (the default) is derandomized, bounded and keeps no
example database; hypothesis's other files (its cache of the code's constants) go to a
folder under the system's temporary directory, so a run writes nothing into the
directory it runs from. ``grade`` (what ``gdpo check`` loads unless told otherwise) is
``ci`` with fewer examples (:data:`GRADE_MAX_EXAMPLES`, derandomized, the pinned
examples of ``conformance/regressions.py`` all kept; every negative control of
``conformance/controls.py`` is still rejected by ``gdpo check``, measured by
``python -m benchmarks.grading --controls`` into ``benchmarks/RESULTS.md``) and shrinking
cut short, so that grading one implementation takes under a minute
on 2 cores where each failing property shrank for a minute or more: a shrink budget of
:data:`SHRINK_BUDGET_S` seconds where the suite stops shrinking at its budget
(``conformance.properties.SHRINK_STOPS_AT_BUDGET``), else no shrink phase at all (the
first failing case found is reported, unshrunk, and its repro line replays it: once the
budget is spent, ``run_for_pytest`` of today still lets hypothesis's shrinker draw up to
about 200 more cases unchecked, about a minute for the ``large`` property, before it
gives up and hypothesis reports the replay as Flaky). ``deep`` hunts long and keeps
its database in hypothesis's own place (``.hypothesis/`` in the working directory), which
a user asks for with ``GDPO_HYPOTHESIS_PROFILE=deep`` (``gdpo check --deep``);
``HYPOTHESIS_STORAGE_DIRECTORY`` set by the user is always honoured."""

from __future__ import annotations

import getpass
import os
import sys
import tempfile

from hypothesis import HealthCheck, Phase, settings

#: The environment variable that picks a profile.
ENV = "GDPO_HYPOTHESIS_PROFILE"
#: hypothesis's own variable for where it keeps its files.
STORAGE = "HYPOTHESIS_STORAGE_DIRECTORY"
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large]
#: The profiles that write no example database (their other files go to a temporary folder).
_TEMPORARY = ("ci", "grade")
#: Seconds into a property's run after which, once a case has failed, shrinking stops, per
#: profile (``conformance.properties.GRADE_SHRINK_BUDGET_S`` is the default, 60 s, for a
#: profile not named here). ``grade``: 30 s, a backstop behind its call budget (below), so that a failing
#: property costs its generation plus a bounded shrink (the smallest failing case found by then is reported,
#: and its repro line
#: replays it).
SHRINK_BUDGET_S: dict[str, float] = {"grade": 30.0}
#: Calls after a property's first failure after which shrinking stops, per profile: a bound that
#: does not depend on the machine's speed, so that the case (and so the category) a grading
#: reports is the same on a loaded CI machine; the time budget above is the backstop.
SHRINK_CALLS: dict[str, int] = {"grade": 60}
#: Generated examples per property under ``grade`` (``ci``: 40): a passing implementation's
#: run is its examples' oracle calls, so this sets ``gdpo check``'s time on a conforming one.
GRADE_MAX_EXAMPLES = 25


def register() -> None:
    settings.register_profile("ci", derandomize=True, max_examples=40, deadline=None, database=None,
                              suppress_health_check=_SUPPRESS)
    settings.register_profile("grade", settings.get_profile("ci"), max_examples=GRADE_MAX_EXAMPLES,
                              phases=grade_phases())
    settings.register_profile("deep", max_examples=10_000, deadline=None, suppress_health_check=_SUPPRESS)


def load(name: str | None = None) -> str:
    """Register the profiles and load ``name`` (default: ``$GDPO_HYPOTHESIS_PROFILE`` or ``ci``)."""
    register()
    name = name or os.environ.get(ENV, "ci")
    settings.load_profile(name)
    if name in _TEMPORARY:  # read by hypothesis at its first write, so this precedes every test
        os.environ.setdefault(STORAGE, os.path.join(tempfile.gettempdir(), f"gdpo-spec-hypothesis-{_user()}"))
    return name


def shrink_stops_at_budget() -> bool:
    """Does the loaded suite stop shrinking at once when its shrink budget is spent? (Read from
    ``conformance.properties`` if it is imported, as it is by the plugin before it loads a
    profile; never imported here, which would import torch to parse ``gdpo``'s options.)"""
    mod = sys.modules.get("conformance.properties")
    return bool(getattr(mod, "SHRINK_STOPS_AT_BUDGET", False))


def grade_phases() -> tuple:
    """The ``grade`` profile's phases: hypothesis's but its explain phase (extra runs of a failing
    case for the lines only failures ran: the repro line says more), and without shrinking where
    the suite cannot stop it at its budget (see the module docstring)."""
    drop = {"explain"} if shrink_stops_at_budget() else {"explain", "shrink"}
    return tuple(ph for ph in Phase if ph.name not in drop)


def shrink_calls(name: str | None = None) -> int | None:
    """The shrink call budget of profile ``name`` (default: the one ``load`` would load), or None."""
    return SHRINK_CALLS.get(name or os.environ.get(ENV, "ci"))


def shrink_budget_s(name: str | None = None) -> float | None:
    """The shrink budget of profile ``name`` (default: the one ``load`` would load), or None
    where the profile keeps the suite's default."""
    return SHRINK_BUDGET_S.get(name or os.environ.get(ENV, "ci"))


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no user name (a container's anonymous uid)
        return str(os.getuid()) if hasattr(os, "getuid") else "user"
