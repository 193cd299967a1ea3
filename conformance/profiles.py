"""The suite's hypothesis profiles, chosen explicitly (hypothesis would otherwise switch itself on
CI). ``ci`` (the default) is derandomized and bounded; ``grade`` (what ``gdpo check`` loads) draws
:data:`GRADE_MAX_EXAMPLES` cases per property first (``conformance.runner``), the same on any
machine whatever the graded code returns. Both keep no example database, write hypothesis's other
files under the system's temporary directory, and draw without the literal constants of the
modules loaded so far (:func:`drop_local_constants`: hypothesis mixes them into generation, so
draws would depend on the tests run before). ``deep`` (``gdpo check --deep``,
``GDPO_HYPOTHESIS_PROFILE=deep``) hunts long with hypothesis's own database and constants.
``HYPOTHESIS_STORAGE_DIRECTORY`` set by the user is always honoured."""

from __future__ import annotations

import contextlib
import getpass
import os
import tempfile

from hypothesis import HealthCheck, settings

#: The environment variable that picks a profile.
ENV = "GDPO_HYPOTHESIS_PROFILE"
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large]
#: The profiles with no database and no local constants (see the module docstring).
_BOUNDED = ("ci", "grade")
#: The profiles whose runs draw their cases first (``conformance.runner``).
DRAW_FIRST = ("grade",)
#: Generated examples per property under ``grade`` (``ci``: 40): it sets ``gdpo check``'s time.
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
    if name in _BOUNDED:  # the storage variable is read at hypothesis's first write: before every test
        drop_local_constants()
        os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY",
                              os.path.join(tempfile.gettempdir(), f"gdpo-spec-hypothesis-{_user()}"))
    return name


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
    """From now on in this process, hypothesis draws without the literal constants of the local
    modules (False where it has no such pool)."""
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
    """:func:`drop_local_constants` for a ``with`` block only (hypothesis's own pool after it)."""
    hp = got[0] if (got := _constants_pool()) else None
    original = hp and hp._get_local_constants
    drop_local_constants()
    try:
        yield
    finally:
        if hp is not None:
            hp._get_local_constants = original
            hp.CONSTANTS_CACHE.cache.clear()
