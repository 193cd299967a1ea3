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
    """``gdpo check -k plain --json FILE`` of this checkout's own
    implementation, from the repository root, run once per test run: tests/test_cli.py (the
    suite runs and passes) and tests/test_grading_output.py (what its summary and JSON say)
    read the same run. The process (returncode, stdout, stderr) and the JSON, or None."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent

    def run(folder: Path) -> None:
        proc = subprocess.run([sys.executable, "-m", "gdpo_tools.cli", "check", "-k", "plain",
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


# ------------------------------------------------------------ the installed wheel

ROOT = Path(__file__).resolve().parent.parent
#: What the source tree copy leaves out (build outputs, caches, this checkout's venvs).
IGNORED = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                 ".hypothesis", ".venv", ".whl", ".benchmarks", "*.pyc")

#: An outside implementation, in its own folder on PYTHONPATH (never the working directory):
#: one that computes the contract (it calls the installed impl.gdpo), one 0.1% off.
THEIRS = """\
import torch
from impl import gdpo


def advantages(rewards, **kw):
    return gdpo.gdpo_advantages(rewards, **kw)


def off_by_a_thousandth(rewards, **kw):
    out = gdpo.gdpo_advantages(rewards, **kw)
    return out * torch.tensor(1.001, dtype=out.dtype)
"""


def _build_wheel(base: Path) -> None:
    """The wheel of a copy of this checkout, installed in a fresh venv under ``base``, and the
    outside implementation's folder."""
    import subprocess
    import sys

    src, wheels, venv, theirs = base / "src", base / "wheels", base / "venv", base / "theirs"
    shutil.copytree(ROOT, src, ignore=IGNORED)  # building writes build/ into its source tree: not ours
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(src)], check=True, timeout=600, capture_output=True)
    (wheel,) = wheels.glob("gdpo_spec-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--force-reinstall", str(wheel)], check=True, timeout=600, capture_output=True)
    theirs.mkdir()
    (theirs / "theirpkg.py").write_text(THEIRS)


def installed_wheel(tmp_path_factory) -> Path:
    """The folder holding ``venv/`` (this checkout's wheel installed in a fresh venv that reuses
    the running interpreter's packages) and ``theirs/`` (an outside implementation), built
    once per run (tests/test_installed_wheel.py)."""
    return once_per_run(tmp_path_factory, "wheel", _build_wheel)


def user_env(theirs: Path) -> dict:
    """The environment of a user's shell: none of this run's pytest, gdpo or hypothesis
    settings, and only the outside implementation's folder on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GDPO_", "HYPOTHESIS_"))}
    env["PYTHONPATH"] = str(theirs)
    return env


def wheel_limits(tmp_path_factory) -> Path:
    """``gdpo limits --fast --quiet --out tables`` run once per run by the installed wheel, from an
    empty folder ``work/`` (its output, and ``returncode``, ``stdout``, ``stderr`` beside it).

    One run serves two tests: tests/test_installed_wheel.py (the command writes where it is told,
    from the installed files alone) and tests/test_limits.py (a fresh fast run agrees with the
    committed spec/generated/known_limits.md): the wheel is this checkout's code, so its tables are the
    checkout's, and the minute the fast subset takes is spent once."""
    import subprocess

    base = installed_wheel(tmp_path_factory)

    def run(folder: Path) -> None:
        work = folder / "work"
        work.mkdir()
        proc = subprocess.run([str(base / "venv" / "bin" / "gdpo"), "limits", "--fast", "--quiet", "--out", "tables"],
                              cwd=work, env=user_env(base / "theirs"), capture_output=True, text=True, timeout=900)
        (folder / "returncode").write_text(str(proc.returncode))
        (folder / "stdout").write_text(proc.stdout)
        (folder / "stderr").write_text(proc.stderr)

    return once_per_run(tmp_path_factory, "wheel_limits", run)
