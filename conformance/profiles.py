"""The suite's hypothesis profiles, chosen explicitly (hypothesis would otherwise switch
itself when it detects CI). ``ci`` (the default) is derandomized, bounded and keeps no
example database; hypothesis's other files (its cache of the code's constants) go to a
folder under the system's temporary directory, so a run writes nothing into the
directory it runs from. ``grade`` (what ``gdpo check`` loads unless told otherwise) draws
its cases first (:data:`DRAW_FIRST`, ``conformance.runner``): :data:`GRADE_MAX_EXAMPLES`
per property, fixed by the property's seed alone, then every case checked and a failure
reduced by the judge, so that what a grading checks is the same on any machine and whatever
the graded code returns (every negative control of ``conformance/controls.py`` is still
rejected by ``gdpo check``, measured by ``python -m benchmarks.grading --controls`` into
``benchmarks/RESULTS.md``). ``deep`` hunts long and keeps its database in hypothesis's
own place (``.hypothesis/`` in the working directory), which a user asks for with
``GDPO_HYPOTHESIS_PROFILE=deep`` (``gdpo check --deep``);
``HYPOTHESIS_STORAGE_DIRECTORY`` set by the user is always honoured.

Under ``ci`` and ``grade`` the draws are also independent of which modules the process has
imported: hypothesis (6.1xx) mixes the literal constants of every local module loaded so far
into its generation, so a derandomized test's examples used to depend on the tests that ran
before it in the same process (an xdist worker's schedule, a file run alone or with others) and
on any literal added anywhere in the project. :func:`load` empties that pool for the process
(:func:`drop_local_constants`); ``deep`` keeps it, as a long hunt profits from it."""

from __future__ import annotations

import contextlib
import getpass
import os
import tempfile

from hypothesis import HealthCheck, settings

#: The environment variable that picks a profile.
ENV = "GDPO_HYPOTHESIS_PROFILE"
#: hypothesis's own variable for where it keeps its files.
STORAGE = "HYPOTHESIS_STORAGE_DIRECTORY"
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large]
#: The profiles that write no example database (their other files go to a temporary folder).
_TEMPORARY = ("ci", "grade")
#: The profiles whose draws do not depend on the modules imported (:func:`drop_local_constants`).
_NO_LOCAL_CONSTANTS = ("ci", "grade")
#: The profiles whose runs draw their cases first (``conformance.runner``): the cases checked are
#: a function of the property's seed and the call shape alone, never of what the graded code returns.
DRAW_FIRST = ("grade",)
#: Generated examples per property under ``grade`` (``ci``: 40): a passing implementation's
#: run is its examples' oracle calls, so this sets ``gdpo check``'s time on a conforming one.
GRADE_MAX_EXAMPLES = 25


def register() -> None:
    settings.register_profile("ci", derandomize=True, max_examples=40, deadline=None, database=None,
                              suppress_health_check=_SUPPRESS)
    settings.register_profile("grade", settings.get_profile("ci"), max_examples=GRADE_MAX_EXAMPLES)
    settings.register_profile("deep", max_examples=10_000, deadline=None, suppress_health_check=_SUPPRESS)


def load(name: str | None = None) -> str:
    """Register the profiles and load ``name`` (default: ``$GDPO_HYPOTHESIS_PROFILE`` or ``ci``)."""
    register()
    name = name or os.environ.get(ENV, "ci")
    settings.load_profile(name)
    if name in _NO_LOCAL_CONSTANTS:
        drop_local_constants()
    if name in _TEMPORARY:  # read by hypothesis at its first write, so this precedes every test
        os.environ.setdefault(STORAGE, os.path.join(tempfile.gettempdir(), f"gdpo-spec-hypothesis-{_user()}"))
    return name


def draws_first(name: str | None = None) -> bool:
    """Does profile ``name`` (default: the one ``load`` would load) draw its cases first?"""
    return (name or os.environ.get(ENV, "ci")) in DRAW_FIRST


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no user name (a container's anonymous uid)
        return str(os.getuid()) if hasattr(os, "getuid") else "user"


def _constants_pool():
    """(hypothesis's provider module, an empty pool of constants), or None where this version of
    hypothesis has no such pool (an internal of hypothesis: nothing is changed then)."""
    try:
        from hypothesis.internal.conjecture import providers as hp

        empty = hp.Constants(integers=hp.SortedSet(), floats=hp.SortedSet(key=hp.float_to_int),
                             bytes=hp.SortedSet(), strings=hp.SortedSet())
        hp._get_local_constants, hp.CONSTANTS_CACHE.cache  # noqa: B018 - both must exist
    except (ImportError, AttributeError):
        return None
    return hp, empty


#: hypothesis's own pool function, kept when :func:`drop_local_constants` replaces it (None before)
HYPOTHESIS_POOL = None


def drop_local_constants() -> bool:
    """Hypothesis draws without the literal constants of the process's local modules, from now
    on in this process: what a test draws then depends on its seed and hypothesis's version
    alone, not on what was imported before it. False where hypothesis has no such pool."""
    got = _constants_pool()
    if got is None:
        return False
    global HYPOTHESIS_POOL
    hp, empty = got
    if HYPOTHESIS_POOL is None:
        HYPOTHESIS_POOL = hp._get_local_constants
    hp.CONSTANTS_CACHE.cache.clear()  # what was drawn with the old pool is not reused
    hp._get_local_constants = lambda: empty
    return True


@contextlib.contextmanager
def no_local_constants():
    """:func:`drop_local_constants` for the duration of a ``with`` block only (hypothesis's own
    pool again after it, where a profile had not dropped it for the whole process)."""
    got = _constants_pool()
    if got is None:
        yield
        return
    hp, _ = got
    original = hp._get_local_constants
    drop_local_constants()
    try:
        yield
    finally:
        hp._get_local_constants = original
        hp.CONSTANTS_CACHE.cache.clear()
