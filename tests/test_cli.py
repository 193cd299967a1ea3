"""The README's first command: `gdpo` prints the exact result of the built-in example."""

import os
import subprocess
import sys
import time

import pytest

from gdpo_tools import cli

sys.path.insert(0, os.path.dirname(__file__))
import _once  # noqa: E402


def test_default_prints_certified_two_group_example(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert "0.5476801283853052" in out and "-1.0953602567706104" in out
    assert "convention 'spec'" in out


def test_console_script_runs():
    proc = subprocess.run([sys.executable, "-m", "gdpo_tools.cli", "example", "correctness_length"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "1.0413683621779732" in proc.stdout


def test_every_example_is_described_in_the_help():
    text = " ".join(cli.build_parser()._subparsers._group_actions[0].choices["example"].format_help().split())
    for name in ("two_group", "correctness_length"):
        assert f"{name} (the default):" in text or f"{name}: " in text, text


def test_unknown_example_is_refused():
    proc = subprocess.run([sys.executable, "-m", "gdpo_tools.cli", "example", "nope"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_check_runs_the_conformance_suite(tmp_path_factory):
    # `gdpo check -k plain` (with --json), run once for this test and tests/test_grading_output.py's,
    # which reads its screen and JSON (tests/_once.py)
    proc, _ = _once.default_check(tmp_path_factory)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "conforms: no finding on the 1 properties graded" in proc.stdout, proc.stdout
    assert "passed (1): plain" in proc.stdout, proc.stdout


def test_check_fails_a_wrong_implementation(tmp_path):
    (tmp_path / "wrong_gdpo.py").write_text(
        "from impl import gdpo\n"
        "def advantages(*args, **kwargs):\n"
        "    return gdpo.gdpo_advantages(*args, **kwargs) * 1.001  # off by 0.1%\n")
    env = dict(__import__("os").environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "gdpo_tools.cli", "check", "--impl", "wrong_gdpo:advantages",
                           "-k", "plain"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1. formula differs from the paper (ordinary magnitudes): " in proc.stdout, proc.stdout


def test_check_stops_with_a_message_when_a_call_in_its_process_hangs(tmp_path):
    """A call that never returns used to hang `gdpo check --single-process` for good: in one
    process the grader cannot take the call back, so it says which call hung and stops (exit 1)."""
    (tmp_path / "stuck_gdpo.py").write_text(
        "import time\n"
        "def advantages(*args, **kwargs):\n"
        "    time.sleep(3600)\n")
    env = dict(os.environ, GDPO_CONFORMANCE_DEADLINE="2",
               PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gdpo_tools.cli", "check", "--impl", "stuck_gdpo:advantages",
                           "--single-process", "-k", "plain"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "gdpo check: stuck_gdpo:advantages did not return within 2 s" in proc.stderr, proc.stderr[-2000:]
    assert time.monotonic() - t0 < 300


@pytest.mark.parametrize("args", [["--impl", "no_such_module:fn"], ["-k", "no_such_row"], ["--deep"]])
def test_a_usage_error_under_json_writes_the_error_over_an_earlier_grading(tmp_path, args):
    """A usage error wrote no JSON: CI reading the file found the last run's grading."""
    import json

    out = tmp_path / "grading.json"
    out.write_text('{"exit_status": 0, "verdict": "conforms (an earlier run)"}')
    proc = subprocess.run([sys.executable, "-m", "gdpo_tools.cli", "check", *args, "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    said = json.loads(out.read_text())
    assert proc.returncode == 2 and said["exit_status"] == 2 and said["verdict"] is None, (proc.stderr, said)
    assert said["error"] and f"gdpo check: error: {said['error']}" in proc.stderr, (proc.stderr, said)


@pytest.mark.parametrize("select", ["large,units", "errors:nan_reward", "plain, errors:group_of_one"])
def test_deep_takes_the_rows_as_check_does(select):
    """`gdpo check --deep -k large,units` handed pytest `-k large,units`, a usage error of its own
    (exit 4), and `-k errors:nan_reward` matched no test (exit 5): the words are now an expression."""
    a = cli.build_parser().parse_args(["check", "--deep", "-k", select])
    proc = subprocess.run(cli.pytest_command(a) + ["--collect-only", "-q"], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"))
    assert proc.returncode == 0, proc.stdout[-1000:] + proc.stderr[-1000:]
    collected = sum(int(ln.rsplit(": ", 1)[1]) for ln in proc.stdout.splitlines() if ln.startswith("conformance/"))
    assert 0 < collected <= 2 * len(select.split(",")) + 2, proc.stdout  # (a row on CPU, and on CUDA)


def test_check_call_shapes_are_the_suites():
    from conformance import subject

    assert cli.CHECK_CALL_SHAPES == subject.CALL_SHAPES


def test_check_grades_the_verl_call_shape(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gdpo_tools.cli", "check", "--impl", "impl.adapters:verl_advantages",
                           "--call-shape", "verl", "-k", "plain"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "passed (1): plain" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    (tmp_path / "unmasked_verl.py").write_text(
        "from impl import adapters\n"
        "def advantages(token_level_rewards, response_mask, index, weights=None):\n"
        "    adv = adapters.verl_advantages(token_level_rewards, response_mask, index, weights)\n"
        "    return adv[:, :1].expand(adv.shape).clone()  # padding tokens not masked\n")
    env = dict(__import__("os").environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "gdpo_tools.cli", "check", "--impl", "unmasked_verl:advantages",
                           "--call-shape", "verl", "-k", "plain"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 1 and "output breaks its call shape" in proc.stdout, proc.stdout[-2000:] + proc.stderr
    # the grader's own check of the output, not an exception of the code: "raised CallShapeViolation" misled
    assert "returned an output that breaks call shape 'verl': sample 0 has 3 response token(s) of 6" \
        in proc.stdout and "raised CallShapeViolation" not in proc.stdout, proc.stdout


def test_check_refuses_an_unknown_convention_before_the_suite(capsys):
    """Found by review: every property errored on it and the run exited 1, as a failed grade."""
    from gdpo_tools import cli

    assert cli.main(["check", "--convention", "nosuch"]) == 2
    assert "unknown convention 'nosuch'" in capsys.readouterr().err


def test_a_file_after_weights_is_named_as_such(tmp_path, capsys):
    """Found by review: `gdpo audit --weights 1 2 FILE` said only "invalid float value: 'FILE'"."""
    from gdpo_tools import cli

    p = tmp_path / "b.csv"
    p.write_text("group,a,b\n0,1,0\n0,0,1\n")
    with pytest.raises(SystemExit) as info:
        cli.main(["audit", "--weights", "1", "2", str(p)])
    assert info.value.code == 2
    assert "give the file before --weights" in capsys.readouterr().err
    assert cli.main(["audit", str(p), "--weights", "1", "2"]) in (0, 1)


def test_a_reader_that_stops_early_ends_the_command_quietly():
    """``gdpo audit | head -1`` where the reader has gone before the report is written: the closed
    pipe ends the command with the shell's status for it (141), without a BrokenPipeError
    traceback on stderr (there was one)."""
    proc = subprocess.Popen([sys.executable, "-m", "gdpo_tools.cli", "audit"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader goes away before the report (the audit takes a second to import and run)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141, (proc.returncode, err)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_audit_help_is_plain_text(capsys):
    """``gdpo audit --help`` tells the formats, without reST markup, and points to docs/audit.md."""
    with pytest.raises(SystemExit) as e:
        cli.main(["audit", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "'reward_<name>'" in out and ".jsonl" in out and "docs/audit.md" in out
    assert "``" not in out and ":func:" not in out
