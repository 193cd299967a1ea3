"""Costly test set-up made once per test run, however pytest-xdist spreads the tests.

A module-scoped fixture runs once per *process*: under ``pytest -n`` each worker that
gets one of the module's tests builds its own copy. :func:`once_per_run` builds into a
folder of the run's base temporary directory, which every worker of the run shares,
under a file lock: the first worker to ask builds it, any other waits for that build
and reuses it. (pytest-xdist's documented recipe for a session fixture made once.)
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

from filelock import FileLock  # a dependency of torch

DONE = ".built"


def run_root(tmp_path_factory) -> Path:
    """The run's base temporary directory: shared by every xdist worker of this run (each
    worker's own basetemp is a ``popen-gwN`` folder in it), this process's alone without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_run(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder ``name`` of this run, ``build(folder)`` called once for the whole run.

    A build that raises leaves nothing behind as built: the error is this test's, and the
    next process to ask builds again (so a failure is reported where it happens, not as a
    missing file elsewhere)."""
    root = run_root(tmp_path_factory)
    folder = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (folder / DONE).exists():
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir()
            build(folder)
            (folder / DONE).write_text("")
    return folder


def default_check(tmp_path_factory):
    """``gdpo check -k "test_property and plain" --json FILE`` of this checkout's own
    implementation, from the repository root, run once per test run: tests/test_cli.py (the
    suite runs and passes) and tests/test_grading_output.py (what its summary and JSON say)
    read the same run. The process (returncode, stdout, stderr) and the JSON, or None."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent

    def run(folder: Path) -> None:
        proc = subprocess.run([sys.executable, "-m", "gdpo_tools.cli", "check", "-k", "test_property and plain",
                               "--json", str(folder / "grading.json")],
                              capture_output=True, text=True, timeout=600, cwd=root)
        (folder / "returncode").write_text(str(proc.returncode))
        (folder / "stdout").write_text(proc.stdout)
        (folder / "stderr").write_text(proc.stderr)

    folder = once_per_run(tmp_path_factory, "default_check", run)
    proc = subprocess.CompletedProcess(["gdpo", "check"], int((folder / "returncode").read_text()),
                                       (folder / "stdout").read_text(), (folder / "stderr").read_text())
    out = folder / "grading.json"
    return proc, (json.loads(out.read_text()) if out.exists() else None)
