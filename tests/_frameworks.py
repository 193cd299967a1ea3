"""The real frameworks the integration tests run against (impl.integrations, issue 26).

Where a framework is not installed its tests skip, except under ``GDPO_REQUIRE_INTEGRATIONS=1``
(CI sets it, after installing the extra ``[trl]``, and ``[swift]`` in an environment of its own): there a missing framework
fails the run, so CI can never pass by skipping them."""

from __future__ import annotations

import importlib
import os

import pytest

REQUIRE = "GDPO_REQUIRE_INTEGRATIONS"


def required() -> bool:
    return os.environ.get(REQUIRE) == "1"


def import_framework(module: str, how: str):
    """``module`` imported, or this test module skipped (failed under GDPO_REQUIRE_INTEGRATIONS=1);
    ``how`` says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        why = f"{module} cannot be imported ({type(exc).__name__}: {exc}); {how}"
        if required():
            pytest.fail(f"{REQUIRE}=1 and {why}", pytrace=False)
        pytest.skip(why, allow_module_level=True)
