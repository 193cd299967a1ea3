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
