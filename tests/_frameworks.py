"""The real frameworks the integration tests run against (impl.integrations, issue 26).

Where a framework is not installed its tests skip, except under ``GDPO_REQUIRE_INTEGRATIONS=1``
(CI sets it, after installing the extras ``[trl]`` and ``[swift]``): there a missing framework
fails the run, so CI can never pass by skipping them."""

from __future__ import annotations

import importlib
import os

import pytest

REQUIRE = "GDPO_REQUIRE_INTEGRATIONS"


def required() -> bool:
    return os.environ.get(REQUIRE) == "1"


def import_framework(module: str, extra: str):
    """``module`` imported, or this test module skipped (failed under GDPO_REQUIRE_INTEGRATIONS=1)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        why = f"{module} cannot be imported ({type(exc).__name__}: {exc}); install it with pip install -e '.[{extra}]'"
        if required():
            pytest.fail(f"{REQUIRE}=1 and {why}", pytrace=False)
        pytest.skip(why, allow_module_level=True)
