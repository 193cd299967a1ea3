"""The README's first command: `gdpo` prints the exact result of the built-in example."""

import subprocess
import sys

from conformance import cli


def test_default_prints_certified_two_group_example(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert "0.5476801283853052" in out and "-1.0953602567706104" in out
    assert "convention 'spec'" in out


def test_console_script_runs():
    proc = subprocess.run([sys.executable, "-m", "conformance.cli", "example", "correctness_length"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "1.0413683621779732" in proc.stdout


def test_unknown_example_is_refused():
    proc = subprocess.run([sys.executable, "-m", "conformance.cli", "example", "nope"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
