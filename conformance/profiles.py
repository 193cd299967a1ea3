"""The suite's hypothesis profiles, chosen explicitly (hypothesis would otherwise switch
itself when it detects CI). ``ci`` (the default) is derandomized, bounded and keeps no
example database; hypothesis's other files (its cache of the code's constants) go to a
folder under the system's temporary directory, so a run writes nothing into the
directory it runs from. ``deep`` hunts long and keeps its database in hypothesis's own
place (``.hypothesis/`` in the working directory), which a user asks for with
``GDPO_HYPOTHESIS_PROFILE=deep``; ``HYPOTHESIS_STORAGE_DIRECTORY`` set by the user is
always honoured."""

from __future__ import annotations

import getpass
import os
import tempfile

from hypothesis import HealthCheck, settings

#: The environment variable that picks a profile.
ENV = "GDPO_HYPOTHESIS_PROFILE"
#: hypothesis's own variable for where it keeps its files.
STORAGE = "HYPOTHESIS_STORAGE_DIRECTORY"
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large]


def register() -> None:
    settings.register_profile("ci", derandomize=True, max_examples=40, deadline=None, database=None,
                              suppress_health_check=_SUPPRESS)
    settings.register_profile("deep", max_examples=10_000, deadline=None, suppress_health_check=_SUPPRESS)


def load(name: str | None = None) -> str:
    """Register the profiles and load ``name`` (default: ``$GDPO_HYPOTHESIS_PROFILE`` or ``ci``)."""
    register()
    name = name or os.environ.get(ENV, "ci")
    settings.load_profile(name)
    if name == "ci":  # read by hypothesis at its first write, so this precedes every test
        os.environ.setdefault(STORAGE, os.path.join(tempfile.gettempdir(), f"gdpo-spec-hypothesis-{_user()}"))
    return name


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no user name (a container's anonymous uid)
        return str(os.getuid()) if hasattr(os, "getuid") else "user"
