"""The project installed as a maintainer's CI installs it: a built wheel (not this
checkout) in a fresh venv, every ``gdpo`` command run from an empty directory.

The venv reuses the running interpreter's packages (``--system-site-packages``: torch,
numpy, hypothesis, pytest), so nothing large is downloaded; the wheel itself goes in with
``--no-index --no-deps``. Each command must work from the installed files alone (nothing
read from this checkout by path), and leave the directory it ran in as it found it
(issue 17).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import _once  # noqa: E402

#: the slow tier (`python3 -m pytest -n auto -q -m slow`, run by .ci/run after the fast suite)
pytestmark = pytest.mark.slow

#: What the installed `gdpo check` grades: one property of values, the error contract and one
#: multi-process property (its gloo ranks import the installed package): every kind of module the
#: grader reads. The whole suite on impl.gdpo runs in-process in conformance/ (the same code).
SELECT = "plain"


class Installed:
    def __init__(self, venv: Path, theirs: Path, base: Path):
        self.venv, self.theirs, self.base = venv, theirs, base
        self.python = venv / "bin" / "python"
        self.gdpo = venv / "bin" / "gdpo"

    def env(self) -> dict:
        return _once.user_env(self.theirs)

    @functools.cache  # noqa: B019 - one per module: its python imports torch to answer (2 s)
    def site(self) -> Path:
        """Where the venv's python imports the project from (run outside this checkout)."""
        out = subprocess.run([str(self.python), "-c", "import impl, pathlib; print(pathlib.Path(impl.__file__).parent.parent)"],
                             cwd=self.base, env=self.env(), capture_output=True, text=True, timeout=120, check=True)
        return Path(out.stdout.strip())

    def run(self, *args: str, timeout: float = 900) -> tuple[subprocess.CompletedProcess, Path]:
        """``gdpo ARGS`` from a new empty directory; the process and that directory."""
        work = Path(subprocess.run(["mktemp", "-d", str(self.base / "work.XXXX")], capture_output=True, text=True,
                                   check=True).stdout.strip())
        proc = subprocess.run([str(self.gdpo), *args], cwd=work, env=self.env(), capture_output=True, text=True,
                              timeout=timeout)
        return proc, work


def _show(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout (end)\n{proc.stdout[-4000:]}\n--- stderr (end)\n{proc.stderr[-4000:]}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    # built once per test run: pytest-xdist workers that each get some of these tests share it
    base = _once.installed_wheel(tmp_path_factory)
    inst = Installed(base / "venv", base / "theirs", base)
    site = inst.site()
    assert site.is_relative_to(inst.venv), f"impl is imported from {site}, not from the venv's installed wheel"
    return inst


def test_the_wheel_holds_what_the_commands_read(installed):
    site = installed.site()
    for path in ("conformance/CONTROLS.md", "spec/generated/known_limits.md", "spec/generated/peers.md",
                 "spec/generated/limits/eps.png", "spec/gdpo.md",
                 "gdpo_tools/cli.py", "gdpo_tools/peer_formulas.py", "impl/integrations/verl.py"):
        assert (site / path).is_file(), f"the wheel does not install {path}"
    # verl loads its plugins by this entry point, in every process (docs/adopting.md, In verl)
    (meta,) = site.glob("gdpo_spec-*.dist-info")
    assert "[verl.plugins]\ngdpo_spec = impl.integrations.verl\n" in (meta / "entry_points.txt").read_text()
    assert not (site / "benchmarks").exists() and not (site / "tests").exists()


def test_check_passes_a_correct_outside_implementation(installed):
    proc, work = installed.run("check", "--impl", "theirpkg:advantages", "-k", SELECT)
    assert proc.returncode == 0, _show(proc)
    assert "conforms: no finding on the 1 properties graded" in proc.stdout and "passed (1): plain" in proc.stdout, \
        _show(proc)
    assert list(work.iterdir()) == [], f"gdpo check wrote into the directory it ran in: {list(work.iterdir())}"


def test_check_gives_a_verdict_on_one_a_thousandth_off(installed):
    proc, work = installed.run("check", "--impl", "theirpkg:off_by_a_thousandth", "-k", SELECT)
    assert proc.returncode == 1, _show(proc)  # a verdict, not a crash (3)
    assert "1 finding (1 at ordinary magnitudes)" in proc.stdout.splitlines()[0], _show(proc)
    assert "replay: python -m conformance.replay --impl theirpkg:off_by_a_thousandth" in proc.stdout, _show(proc)
    assert list(work.iterdir()) == [], f"gdpo check wrote into the directory it ran in: {list(work.iterdir())}"


def test_audit_and_the_example_run_installed(installed):
    from gdpo_tools import audit

    proc, work = installed.run("audit")
    assert proc.returncode == audit.main(None, out=open(os.devnull, "w")), _show(proc)  # as from the checkout
    assert "GDPO audit of built-in example" in proc.stdout, _show(proc)
    proc, _ = installed.run()
    assert proc.returncode == 0 and "exact and certified" in proc.stdout, _show(proc)
    assert list(work.iterdir()) == []


def test_limits_writes_where_it_is_told_and_never_into_site_packages(installed, tmp_path_factory):
    page = installed.site() / "spec" / "generated" / "known_limits.md"
    before = page.read_bytes()
    proc, work = installed.run("limits", "--fast", "--quiet")
    assert proc.returncode == 2 and "give --out DIR" in proc.stderr, _show(proc)
    # `gdpo limits --fast --quiet --out tables`, run once for this test and tests/test_limits.py
    ran = _once.wheel_limits(tmp_path_factory)
    proc = subprocess.CompletedProcess(["gdpo", "limits"], int((ran / "returncode").read_text()),
                                       (ran / "stdout").read_text(), (ran / "stderr").read_text())
    assert proc.returncode == 0, _show(proc)
    work = ran / "work"
    assert sorted(p.relative_to(work).as_posix() for p in work.rglob("*")) == [
        "tables", "tables/known_limits.md", "tables/limits", "tables/limits/cancellation.png",
        "tables/limits/eps.png", "tables/limits/variance.png"]
    text = (work / "tables" / "known_limits.md").read_text()
    assert "(limits/eps.png)" in text and "| commit | unknown |" in text
    assert page.read_bytes() == before
