"""What a maintainer reads after ``gdpo check`` (issue 20 part 5): the summary table first
(property, verdict, category, worst error), one line and a repro line per failure, counts that
leave the suite's own checks out, ``--json`` for machines, and no hypothesis "Flaky" for a
deterministic implementation whose shrinking stopped at the time budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis.errors import FlakyFailure

from conformance import plugins
from conformance.judge import ConformanceFailure
from gdpo_tools import cli

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import _once  # noqa: E402


def _check(tmp_path, *args):
    out = tmp_path / "grading.json"
    proc = subprocess.run([sys.executable, "-m", "gdpo_tools.cli", "check", *args, "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    data = json.loads(out.read_text()) if out.exists() else None
    return proc, data


def _table(stdout: str) -> list[str]:
    """The summary table's lines (header, rule, rows)."""
    lines = stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if "gdpo conformance summary" in ln) + 1
    start = next(i for i in range(start, len(lines)) if lines[i].split()[:2] == ["property", "verdict"])
    end = next(i for i in range(start, len(lines)) if not lines[i].strip() or lines[i].startswith("gdpo conformance:"))
    return lines[start:end]


def test_a_negative_control_fails_with_its_row_a_repro_and_json(tmp_path):
    proc, data = _check(tmp_path, "--impl", "conformance.controls:float32_internals", "-k", "test_property and plain")
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:] + proc.stderr[-2000:]
    table = _table(out)
    assert table[0].split() == ["property", "verdict", "category", "worst", "error"], table
    row = next(ln for ln in table if ln.split()[0] == "plain")
    assert row.split()[1] == "failed", row
    # the table comes before pytest's own summary line, and the failure's one line and repro follow it
    assert out.index("gdpo conformance summary") < out.index("* plain: [plain]") < out.rindex("1 failed")
    assert "repro: python -m conformance.replay --impl conformance.controls:float32_internals" in out
    assert "allowed" in out  # the worst listed output, as the judge wrote it
    assert "Traceback" not in out and "Flaky" not in out  # the table is what one reads; --details for the rest
    assert data["impl"] == "conformance.controls:float32_internals" and data["convention"] == "spec"
    assert data["call_shape"] == "gdpo" and data["peer"] is None and data["profile"] == cli.CHECK_PROFILE
    plain = next(p for p in data["properties"] if p["name"] == "plain")
    assert plain["verdict"] == "failed" and plain["repro"].startswith("python -m conformance.replay ")
    assert plain["headline"].startswith("[plain] ") and plain["calls_impl"] is True
    assert set(plain) >= {"category", "worst_ulps", "worst_dtype", "skip_reason", "seconds", "note"}
    assert data["counts"]["failed"] == 1 and data["counts"]["called_impl"] == 1, data["counts"]
    # the findings come first: one per category and regime, with the properties and the smallest example
    summary = out.split("gdpo conformance summary", 1)[1]
    assert summary.index("findings (one per cause") < summary.index("property  ") < summary.index("* plain: ")
    assert data["findings"] and all(f["properties"] == ["plain"] for f in data["findings"]), data["findings"]
    assert "precision" in {f["category"] for f in data["findings"]}  # float32 internals, at ordinary magnitudes
    assert all(f["regime"] in ("ordinary magnitudes", "extreme magnitudes") and f["example"].startswith("`[[")
               for f in data["findings"]), data["findings"]


def test_the_projects_implementation_passes_and_self_tests_are_not_counted(tmp_path_factory):
    # "test_property and plain" also matches conformance/test_controls.py's
    # test_property_rejects_its_controls[plain]: a self-test, deselected by gdpo check.
    # The run is _check(tmp_path, "-k", "test_property and plain"), made once for this test and
    # tests/test_cli.py's (tests/_once.py)
    proc, data = _once.default_check(tmp_path_factory)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    names = [p["nodeid"] for p in data["properties"]]
    assert not any("test_controls" in n or "test_suite_meta" in n for n in names), names
    assert any("test_controls.py::test_property_rejects_its_controls[plain]" in n
               for n in data["self_tests_deselected"]), data["self_tests_deselected"]
    assert data["counts"] == {"passed": 1, "failed": 0, "error": 0, "skipped": 1, "called_impl": 1,
                              "suite_checks": 0}, data["counts"]
    assert "1 property called impl.gdpo:gdpo_advantages: 1 passed; " in proc.stdout  # no "0 failed"
    assert "self-test(s) of the suite deselected" in proc.stdout
    row = next(ln for ln in _table(proc.stdout) if ln.split()[0] == "plain")
    assert row.split()[1:] == ["passed", "-", "-"], row


def test_details_prints_the_full_failure_texts_after_the_table():
    short = cli.check_command("m:f", None, None, None)
    full = cli.check_command("m:f", None, None, None, details=True)
    assert "--tb=no" in short and "--gdpo-grade" in short and "--tb=short" in full
    assert "--gdpo-json" in cli.check_command("m:f", None, None, None, json_path="x.json")
    assert "--gdpo-grade" not in cli.check_command("m:f", None, None, None, self_tests=True)


# ----------------------------------------------------------------------------- the rows


def _failure(text, category=None, ulps=None, dtype=None):
    exc = ConformanceFailure(text)
    exc.category, exc.worst_ulps, exc.worst_dtype = category, ulps, dtype
    return exc


TEXT = ("[plain] Eq. 4, 7, 6 (advantages) of m:f (call shape gdpo, convention 'spec'): 1 of 2 advantages outside\n"
        "  [0] observed 0x1p+0 (1), exact 0x1.8p+0 (1.5), error 5.0e-01, allowed 1e-16\n"
        "  inputs: rewards (float64, 2x1) [[0x0.0p+0], [0x1.0p+0]]\n"
        "  repro: python -m conformance.replay --impl m:f --property plain --case '{}'")


def test_a_failure_shows_its_category_and_worst_error_and_dash_without():
    info = plugins.failure_info(_failure(TEXT, "precision", 4.5, "float32"))
    assert info["category"] == "precision" and info["worst_ulps"] == 4.5 and info["worst_dtype"] == "float32"
    assert info["headline"].startswith("[plain] ") and info["detail"].startswith("[0] observed")
    assert info["repro"] == "python -m conformance.replay --impl m:f --property plain --case '{}'"
    row = {"name": "plain", "nodeid": "t.py::test_property[plain]", "verdict": "failed", "skip_reason": None,
           "calls_impl": True, **info}
    assert plugins.table_rows([row]) == [("plain", "failed", "precision", "4.5 ulp(float32)")]
    bare = {**row, **plugins.failure_info(_failure(TEXT))}
    assert plugins.table_rows([bare]) == [("plain", "failed", "-", "-")]


def test_a_failure_wrapped_by_hypothesis_or_the_shrink_budget_keeps_its_category():
    inner = _failure(TEXT, "silent_zero", 1e15, "float64")
    group = FlakyFailure("produces unreliable results", [inner])
    info = plugins.failure_info(group)
    assert info["category"] == "silent_zero" and info["headline"].startswith("[plain]")
    # run_for_pytest after its shrink budget: a new failure (no category of its own), the judge's
    # failure as its context and hypothesis's Flaky (the unchecked replay) as its cause
    try:
        try:
            raise inner
        except ConformanceFailure:
            raise ConformanceFailure(TEXT + "\n  (shrinking stopped at its budget (8 s): the smallest failing case found "
                                     "by then)") from group
    except ConformanceFailure as outer:
        wrapped = outer
    info = plugins.failure_info(wrapped)
    assert info["category"] == "silent_zero" and info["worst_ulps"] == 1e15
    assert "shrinking stopped" in info["note"] and "Flaky" not in info["note"]
    plugins._hide_shrink_budget_flaky(wrapped)
    assert wrapped.__cause__ is None and wrapped.__suppress_context__  # no "unreliable results" printed


def test_real_nondeterminism_is_named_as_such():
    info = plugins.failure_info(AssertionError("plain: a case failed, then passed when checked again (the "
                                               "implementation is not deterministic): Case(...)"))
    assert "nondeterministic" in info["note"]
    info = plugins.failure_info(FlakyFailure("unreliable", [ValueError("x")]))
    assert "Flaky" in info["note"] and info["category"] is None


def test_counts_leave_out_the_suite_checks_and_skips():
    rows = [{"verdict": "passed", "calls_impl": True}, {"verdict": "failed", "calls_impl": True},
            {"verdict": "skipped", "calls_impl": True}, {"verdict": "passed", "calls_impl": False}]
    assert plugins.counts(rows) == {"passed": 1, "failed": 1, "error": 0, "skipped": 1, "called_impl": 2,
                                    "suite_checks": 1}


@pytest.mark.parametrize("nodeid,name", [("conformance/test_traps.py::test_property[large]", "large"),
                                         ("conformance/test_errors.py::test_error_case[nan_reward]", "errors:nan_reward"),
                                         ("conformance/test_cuda.py::test_property_on_cuda[plain]", "cuda:plain"),
                                         ("conformance/test_errors.py::test_every_contract_class_is_exercised",
                                          "test_every_contract_class_is_exercised")])
def test_row_names(nodeid, name):
    assert plugins.row_name(nodeid) == name


def test_format_of_the_worst_error():
    assert plugins.format_ulps(4.5, "float32") == "4.5 ulp(float32)"
    assert plugins.format_ulps(None, None) == "-"
    assert plugins.format_ulps(float("inf"), "float64") == "inf ulp(float64)"


def test_inputs_are_written_as_the_decimal_a_maintainer_types():
    """Issue 25 part 4: a failure's inputs read in decimal, each the shortest that gives back the
    same value in the input's dtype (the repro line keeps the exact hex)."""
    from conformance.compare import decimal, describe_inputs
    from conformance.cases import Case
    from spec.error_model import round_to

    assert decimal(float.fromhex("0x1.2ced32p+126"), "float32") == "1e+38"  # float32's value nearest 1e38
    assert decimal(float.fromhex("0x1.2ced32p+126"), "float64") == "9.999999680285692e+37"  # float64 tells it from 1e38
    assert decimal(65504.0, "float16") == "65504" and decimal(0.1) == "0.1" and decimal(-0.0) == "-0"
    for dtype in ("float32", "float16", "bfloat16", "float64"):
        for x in (1 / 3, -2.5e-7, 1e30 if dtype != "float16" else 1e4, 6.1e-5):
            v = float(round_to([x], dtype)[0])
            assert float(round_to([float(decimal(v, dtype))], dtype)[0]) == v, (dtype, x)
    text = describe_inputs(Case(((float.fromhex("0x1.2ced32p+126"),), (0.0,)), group_size=2))
    assert "[[1e+38], [0]]" in text, text


def test_a_passed_refusal_of_another_class_keeps_its_own_row():
    """Passed rows of one test function merge into one line (`errors:* (3)`), but not a passed
    row that carries a category (`wrong_class`: a refusal of another class, which --strict-errors
    fails): merged, it read as a plain pass (found by a new-user review)."""
    def row(name, category=None):
        return {"name": f"errors:{name}", "nodeid": f"t.py::test_errors[{name}]", "verdict": "passed",
                "skip_reason": None, "calls_impl": True, "category": category, "worst_ulps": None,
                "worst_dtype": None}
    rows = [row("nan_reward"), row("group_size_one"), row("weights_length", "wrong_class"), row("inf_reward")]
    assert plugins.table_rows(rows) == [("errors:* (3)", "passed", "-", "-"),
                                        ("errors:weights_length", "passed", "wrong_class", "-")]


def test_an_exact_zero_failure_shows_the_value_returned():
    """A structural zero returned as a residue (6e-17 where the exact result is 0): in ulps of 0
    (the smallest subnormal's) it read as 4e28 ulp(float32) (found by a new-user review); the
    table shows the value returned. Other categories keep their ulps."""
    from conformance import judge as Jd

    v = Jd.distance(np.array([-5.85147698e-17, 0.5]), np.array([0.0, 0.5]), np.array([0.0, 1e-16]),
                    np.array([0.0, 0.0]), "float32")
    assert v.category == "exact_zero" and v.worst_value == 5.85147698e-17 and v.worst_ulps > 1e20
    row = {"name": "plain", "nodeid": "t.py::test_property[plain]", "verdict": "failed", "skip_reason": None,
           "calls_impl": True, "category": "exact_zero", "worst_ulps": v.worst_ulps, "worst_dtype": "float32",
           "worst_value": v.worst_value}
    assert plugins.table_rows([row]) == [("plain", "failed", "exact_zero", "5.85e-17, not 0")]
    assert plugins.table_rows([{**row, "category": "precision"}])[0][3].endswith("ulp(float32)")


def test_a_failed_row_keeps_everything_its_failure_carries(monkeypatch):
    """The row a failed test leaves (pytest_runtest_logreport) takes each key of failure_info:
    a key the row did not start with was dropped (worst_value was, and the table showed the
    ulps of 0 again)."""
    import types

    from conformance import judge as Jd

    exc = Jd.ConformanceFailure(TEXT)
    exc.category, exc.worst_ulps, exc.worst_dtype, exc.worst_value = "exact_zero", 4e28, "float32", 5.85e-17
    info = plugins.failure_info(exc)
    assert info["worst_value"] == 5.85e-17
    config = types.SimpleNamespace(_gdpo_results={})
    monkeypatch.setitem(plugins._CONFIG, "config", config)
    report = types.SimpleNamespace(nodeid="conformance/test_properties.py::test_property[plain]", when="call",
                                   user_properties=[("gdpo_failure", info)], duration=0.1, skipped=False,
                                   failed=True, passed=False)
    plugins.pytest_runtest_logreport(report)
    (row,) = config._gdpo_results.values()
    assert {k: row[k] for k in info} == info and row["worst_value"] == 5.85e-17


def test_the_float32_hint():
    """Under spec, a grading whose every precision failure is a float32 output within 2 ulps of the
    exact value gets the hint that reads it as float32 arithmetic and names the ways out; not under
    a preset, not where one failure is further off or of another dtype (those are other causes)."""
    from conformance.plugins import precision_hint

    def row(ulps, dtype="float32", category="precision", verdict="failed"):
        return {"verdict": verdict, "category": category, "worst_ulps": ulps, "worst_dtype": dtype}
    rows = [row(1.0), row(1.5), row(None, None, "silent_zero"), row(None, None, None, "passed")]
    hint = precision_hint(rows, "spec")
    assert hint and "1.5 ulp(float32)" in hint and "--convention trl" in hint and "float64" in hint
    assert precision_hint(rows, "trl") is None
    assert precision_hint(rows + [row(7.0)], "spec") is None
    assert precision_hint(rows + [row(1.0, "bfloat16")], "spec") is None
    assert precision_hint([row(None, None, "silent_zero")], "spec") is None
