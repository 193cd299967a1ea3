"""Declarations a maintainer needs (issue 25 part 3, issue 43 part 5): ``fn.gdpo_domain`` and
``gdpo check --domain KEY=VALUE`` accept min_columns, max_columns, group_sizes, equal_groups,
max_abs_reward, max_abs_weight, input_dtypes and out_dtypes; the search stays inside the domain, so
a refusal outside it is never asked for, and the report states the declaration. ``validated`` names
the error cases a framework checks before the function is called, ``int_rewards`` integer rewards
computed as their values. The negative controls: the same implementations graded without the
declaration fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # _domain_impls, also when this file runs alone

from conformance import profiles
from conformance import properties as P
from conformance import judge as J
from conformance import runner as R
from conformance.subject import Subject, parse_domain

ROOT = Path(__file__).resolve().parent.parent


def _grade(subject: Subject, name: str = "plain", n: int = profiles.GRADE_MAX_EXAMPLES):
    prop = P.BY_NAME[name]
    cases = R.planned_cases(prop, subject, n)
    try:
        R.grade_cases(subject, cases, lambda c: prop.check(subject, c, name))
    except J.ConformanceFailure as e:
        return cases, e
    return cases, None


class _Undeclared(Subject):
    """The same function with its own gdpo_domain ignored."""

    def domain(self):
        return dict(self.declared)


def test_a_declared_minimum_of_columns_keeps_the_search_inside_it():
    subject = Subject("_domain_impls:needs_two_columns")
    cases, failure = _grade(subject)
    assert failure is None, failure
    assert cases and all(c.k >= 2 for c in cases)
    assert "min_columns=2" in subject.domain_statement()
    _, failure = _grade(_Undeclared("_domain_impls:needs_two_columns"))  # the negative control
    assert failure is not None and failure.category == "refused", failure


def test_gdpo_check_domain_declares_without_changing_the_code():
    declared = ["max_abs_reward=1e6", "group_sizes=4+"]
    subject = Subject("_domain_impls:bounded_rewards", domain=parse_domain(declared))
    for name, n in (("plain", profiles.GRADE_MAX_EXAMPLES), ("range", 8)):  # range: few of its cases are inside
        cases, failure = _grade(subject, name, n)
        assert failure is None, (name, failure)
        # more are drawn where the domain leaves some out (up to 8 times): plain keeps its full count;
        # range hunts huge values, most of them outside this domain, and keeps what is inside
        assert len(cases) >= (profiles.GRADE_MAX_EXAMPLES if name == "plain" else 1), (name, len(cases))
        for c in cases:
            assert max(abs(v) for r in c.rewards for v in r) <= 1e6
    _, failure = _grade(Subject("_domain_impls:bounded_rewards"), "range")
    assert failure is not None and failure.category == "refused", failure


def test_parse_domain_reads_every_key_and_refuses_unknown_ones():
    d = parse_domain(["min_columns=2", "max_columns=4", "group_sizes=4,8", "max_abs_reward=1e6",
                      "max_abs_weight=10", "input_dtypes=float32,float64", "out_dtypes=float32"])
    assert d == {"min_columns": 2, "max_columns": 4, "group_sizes": (4, 8), "max_abs_reward": 1e6,
                 "max_abs_weight": 10.0, "input_dtypes": ("float32", "float64"), "out_dtypes": ("float32",)}
    assert parse_domain(["group_sizes=4+"]) == {"group_sizes": 4}
    assert parse_domain(["certified=true"]) == {"certified": True}
    narrow = parse_domain(["certified=float32,bfloat16,float16"])
    assert narrow == {"certified": ("float32", "bfloat16", "float16")}
    assert Subject("impl.gdpo:gdpo_advantages", domain=narrow).certified_formats() == {"float32", "bfloat16", "float16"}
    for bad in (["nope=1"], ["min_columns"], ["labels=maybe"], ["certified=float8"], ["certified=,"]):
        with pytest.raises(ValueError):
            parse_domain(bad)


def test_the_domain_reaches_the_report_and_json(tmp_path):
    out = tmp_path / "g.json"
    proc = subprocess.run([sys.executable, "-m", "gdpo_tools.cli", "check", "--impl", "_domain_impls:bounded_rewards",
                           "--domain", "max_abs_reward=1e6", "--domain", "group_sizes=4+", "--single-process",
                           "-k", "plain", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "tests")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "declared domain max_abs_reward=1000000.0, group_sizes=4" in proc.stdout, proc.stdout[-3000:]
    assert json.loads(out.read_text())["domain"] == {"max_abs_reward": 1e6, "group_sizes": 4}


def _grading(target: str, shape: str = "gdpo", select: str = "plain", **domain):
    from conformance import grading

    return grading.grade(Subject(target, shape, "spec", domain=domain), select=select)


def test_equal_groups_only():
    g = _grading("_domain_impls:equal_groups_only", equal_groups=True)
    assert g.findings == [] and "equal_groups=True" in g.subject.domain_statement()
    undeclared = _grading("_domain_impls:equal_groups_only")  # the negative control
    assert [f.category for f in undeclared.findings] == ["refused"], [f.headline() for f in undeclared.findings]


def test_checks_made_before_the_call_are_validated_elsewhere():
    names = ("weights_all_zero", "weight_nonfinite", "weights_length")
    g = _grading("paper_impls:correct_f32", "trl", "errors", validated=names)
    rows = {r.name: r for r in g.rows}
    for name in names:
        assert rows[f"errors:{name}"].verdict == "skipped" and "validated elsewhere" in rows[f"errors:{name}"].reason
    assert not any("weight" in f.cause for f in g.findings), [f.headline() for f in g.findings]
    undeclared = _grading("paper_impls:correct_f32", "trl", "errors")  # the negative control
    assert sum("weight" in f.cause for f in undeclared.findings) == 3


def test_integer_rewards_accepted_are_graded_as_their_values():
    g = _grading("_domain_impls:integer_rewards_computed", select="errors:integer_rewards,errors:bool_rewards",
                 int_rewards=True)
    assert g.findings == [] and all(r.verdict == "passed" for r in g.rows if r.verdict != "skipped"), g.rows
    undeclared = _grading("_domain_impls:integer_rewards_computed", select="errors:integer_rewards")
    assert [f.category for f in undeclared.findings] == ["accepted"]


def test_float64_through_the_trl_shape():
    """A float64 code graded through the trl shape, float64 rewards declared: graded at float64."""
    g = _grading("_domain_impls:trl_float64", "trl", "plain", input_dtypes=("float64",))
    assert g.profile.precision == "float64", g.profile.statement()
    assert {f.regime for f in g.findings} <= {"extreme magnitudes"}, [f.headline() for f in g.findings]  # 1e308
    from conformance import runner

    assert {c.dtype for c in runner.planned_cases(P.BY_NAME["plain"], g.subject)} == {"float64"}


def test_a_declaration_that_leaves_nothing_to_draw_says_so():
    from gdpo_tools import cli

    assert cli.main(["check", "--impl", "_domain_impls:trl_float64", "--call-shape", "trl", "-k", "plain",
                     "--domain", "input_dtypes=int8"]) == 2
    with pytest.raises(ValueError, match="leave nothing to draw"):
        Subject("_domain_impls:trl_float64", "trl", domain={"input_dtypes": ("int8",)}).context()
