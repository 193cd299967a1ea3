"""A bad ``--impl`` stops at once, with one line saying why (module not found, no such
attribute, not callable), for ``gdpo check`` (exit 2, argparse's usage-error code) and
for ``pytest --impl`` (a pytest usage error, exit 4), before any property runs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import subject
from gdpo_tools import cli

ROOT = Path(__file__).resolve().parent.parent

#: (spec, what the one-line error says)
BAD_SPECS = (
    ("nonexist:fn", "module 'nonexist' not found"),
    ("nonexist.sub:fn", "module 'nonexist' not found"),
    ("impl.nonexist:fn", "module 'impl.nonexist' not found"),
    ("impl.gdpo:nope", "'impl.gdpo' has no attribute 'nope'"),
    ("impl.gdpo:gdpo_advantages.nope", "has no attribute 'nope'"),
    ("impl.gdpo:DEFAULT_EPS", "impl.gdpo:DEFAULT_EPS is a float, not callable"),
    ("impl.gdpo", "expected package.module:function"),
    ("impl.gdpo:", "expected package.module:function"),
)


def _env(extra=None):
    path = [str(ROOT)] + ([str(extra)] if extra else []) + [os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))


@pytest.mark.parametrize("spec,says", BAD_SPECS)
def test_resolve_impl_says_why_in_one_line(spec, says):
    with pytest.raises(subject.ImplSpecError) as info:
        subject.resolve_impl(spec)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_resolve_impl_returns_the_callable():
    from impl.gdpo import gdpo_advantages

    assert subject.resolve_impl("impl.gdpo:gdpo_advantages") is gdpo_advantages
    assert subject.resolve_impl("conformance.subject:Subject.call") is subject.Subject.call


def test_a_module_whose_import_fails_is_not_called_missing(tmp_path, monkeypatch):
    (tmp_path / "needs_missing_dep.py").write_text("import no_such_dependency_xyz\ndef fn(*a, **k): pass\n")
    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('boom\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(subject.ImplSpecError) as info:
        subject.resolve_impl("needs_missing_dep:fn")
    msg = str(info.value)
    assert "importing 'needs_missing_dep' failed" in msg and "no_such_dependency_xyz" in msg, msg
    assert "module 'needs_missing_dep' not found" not in msg
    with pytest.raises(subject.ImplSpecError, match=r"importing 'raises_on_import' raised RuntimeError: boom second"):
        subject.resolve_impl("raises_on_import:fn")


@pytest.mark.parametrize("spec,says", BAD_SPECS)
def test_check_refuses_a_bad_spec_before_running_anything(spec, says, monkeypatch, capsys):
    def no_suite(*a, **k):
        raise AssertionError(f"the suite was started for the bad spec {spec!r}: {a}")

    monkeypatch.setattr(subprocess, "call", no_suite)
    assert cli.main(["check", "--impl", spec, "-k", "plain"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gdpo check: error: ") and says in err and "\n" not in err, err


def test_check_exits_2_at_once_from_the_command_line():
    proc = subprocess.run([sys.executable, "-m", "gdpo_tools.cli", "check", "--impl", "nonexist:fn"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=_env())
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip() == ("gdpo check: error: --impl 'nonexist:fn': module 'nonexist' not found "
                                   "(not installed, or not on sys.path / PYTHONPATH)"), proc.stderr
    assert "running:" not in proc.stdout and "passed" not in proc.stdout and "failed" not in proc.stdout


def test_check_resolves_a_spec_on_the_suites_path(tmp_path, monkeypatch):
    """A module beside the caller's working directory is found, as the suite's pytest finds it."""
    (tmp_path / "beside_cwd_impl.py").write_text("def fn(*a, **k): pass\n")
    monkeypatch.chdir(tmp_path)
    assert cli.check_impl_spec("beside_cwd_impl:fn") is None
    assert cli.check_impl_spec(None) is None  # the default, impl.gdpo
    assert "beside_cwd_impl" in cli.check_impl_spec("beside_cwd_impl:nope")


@pytest.mark.parametrize("spec,says", [BAD_SPECS[0], BAD_SPECS[3], BAD_SPECS[5]])
def test_pytest_impl_is_a_usage_error_at_configuration(spec, says):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
                           "--impl", spec, "conformance/test_errors.py"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=_env())
    out = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, out[-3000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("ERROR: ")]
    assert len(lines) == 1 and lines[0].startswith(f"ERROR: --impl {spec!r}: ") and says in lines[0], out[-3000:]
    assert " passed" not in out and " failed" not in out and "ModuleNotFoundError" not in out, out[-3000:]
