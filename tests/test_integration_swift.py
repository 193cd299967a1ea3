"""impl.integrations.swift against the real ms-swift 4.6.0 (issue 26); the cases are in
tests/_swift_cases.py.

ms-swift 4.6.0's trainers import ``trl.experimental.ppo``, which TRL 1.x no longer has (it
declares ``trl<1.0``), so it cannot share an environment with TRL 1.16 (tests/
test_integration_trl.py). Where ms-swift imports here, the cases run in this process. Where it
does not and ``GDPO_SWIFT_PYTHON`` names an interpreter that has it (CI builds one: .ci/run),
they run there, under pytest, and must all pass, none skipped. Otherwise they skip, or fail
under ``GDPO_REQUIRE_INTEGRATIONS=1``."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from _frameworks import import_framework  # noqa: E402

#: the slow tier (`python3 -m pytest -n auto -q -m slow`): the real frameworks, installed by .ci/run
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SWIFT_PYTHON = "GDPO_SWIFT_PYTHON"
CASES = "tests/_swift_cases.py"


def _swift_here() -> bool:
    try:
        return importlib.util.find_spec("swift.rlhf_trainers") is not None and bool(
            __import__("swift.rlhf_trainers.grpo_trainer"))
    except ImportError:
        return False


if _swift_here():
    from _swift_cases import *  # noqa: E402,F401,F403  (the cases and their fixture, collected here)
elif os.environ.get(SWIFT_PYTHON):
    def test_cases_in_the_swift_environment():
        python = os.environ[SWIFT_PYTHON]
        env = {**os.environ, "GDPO_REQUIRE_INTEGRATIONS": "1", "PYTHONPATH": str(ROOT)}
        out = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                              "-W", "ignore::FutureWarning", CASES], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=900)
        tail = out.stdout[-4000:] + out.stderr[-2000:]
        assert out.returncode == 0, f"{python} -m pytest {CASES} failed:\n{tail}"
        summary = out.stdout.strip().splitlines()[-1]
        assert re.search(r"\b\d+ passed\b", summary) and "skipped" not in summary, summary
else:
    import_framework("swift.rlhf_trainers.grpo_trainer",
                     "install it in an environment of its own (pip install -e '.[swift]' && pip install --no-deps "
                     f"ms-swift==4.6.0) and name its python in {SWIFT_PYTHON}, or run this file with that python")
