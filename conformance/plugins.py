"""The pytest plugin of the conformance suite: the options that choose the implementation
under test, and what a run keeps, deselects and reports (the implementation itself and
its call shapes: :mod:`conformance.subject`).

Pointing the suite at any implementation, without editing it::

    pytest --impl package.module:function [--convention NAME] [--call-shape gdpo|trl|verl]

from the repository root (a path such as ``conformance/`` may follow). When the
options name anything other than the defaults, only the tests under ``conformance/``
run (the rest test this checkout, not the implementation named): the others are
deselected, so the verdict is the implementation's alone, as ``gdpo check``'s; so are
the suite's self-tests (``SELF_TESTS``: ``conformance/test_controls.py``, every negative
control against every property, and ``conformance/test_suite_meta.py``, the judge's
plumbing), which grade the suite, not the implementation named; the report header and
summary say so. The options are this module's ``pytest_addoption``:
the root ``conftest.py`` registers this module as a pytest plugin, and ``gdpo check``
passes ``-p conformance.plugins`` (pytest registers a plugin once by name, so the
two never add the options twice).

Defaults: ``--impl impl.gdpo:gdpo_advantages --convention spec --call-shape gdpo``.

``--single-process`` (``gdpo check --single-process``) grades an implementation for
one process, one that takes no ``process_group`` (or refuses one): the multi-process
properties (``conformance/test_distributed.py``: ``dist_values_2``, ``dist_values_4``,
``dist_errors_2``, ``dist_errors_4``, which spawn gloo ranks and pass each a process
group) are deselected, not skipped, and the report header and summary say that they
were deselected by the option and so were not graded: the verdict is then the
single-process contract's only (spec sections 1-4, 6, 7), never the distributed
protocol's (section 5). Without it such an implementation fails them ("rank 0
raised ...; the contract computes this batch"). The trl and verl call shapes pass no
process group, and skip those properties with that reason.

A grading run (another implementation named, or ``--gdpo-grade``, which ``gdpo check``
passes so that grading ``impl.gdpo`` deselects the self-tests too) ends with a summary
table, before pytest's failure texts: per property the verdict (passed, failed, skipped and
why), the failure's category (``conformance/verdicts.py``; ``-`` where the judge gives none)
and its worst error in ulps of the dtype judged, then one line, the worst listed output and
the repro line of each failure, and a total that counts only the tests that call the
implementation (the suite's own table checks in ``conformance/test_errors.py`` never do).
``--gdpo-json PATH`` writes the same as JSON (``grading_json``). A failure whose shrinking
stopped at the time budget is printed without hypothesis's ``Flaky`` (see
``_hide_shrink_budget_flaky``).

``--convention`` names a preset of ``spec/conventions.py``; the oracle computes
that convention's mathematics exactly, so a peer is graded against its own
intended formula, at its own precision (``spec/error_model.py``, "A peer's own code");
the error contract is graded under it too (what its NaN and singleton policies compute
against them, every other refusal demanded), the distributed protocol under ``spec`` only.
A clear refusal with an exception class other than ``spec.errors``' passes and is reported
(category ``wrong_class``) unless ``--strict-errors`` asks for the strict error contract.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from pathlib import Path

import pytest

from conformance import findings, profiles, properties, runner

from conformance import judge as J
from conformance.subject import (CALL_SHAPES, DEFAULT_IMPL, ImplSpecError, Subject, parse_domain, resolve_impl,
                                 shape_mismatch)


#: The suite's pytest markers, registered by the plugin itself, so that ``--strict-markers``
#: holds wherever the suite runs (an installed package has no pyproject.toml of ours).
MARKERS = {
    "slow": "the slow tier: deselected by the README's test command (-m \"not slow\"), run by .ci/run after it (-m slow)",
    "cuda": "needs a CUDA device (skipped without one)",
    "distributed": "spawns torch.distributed process groups",
}


def pytest_configure(config):
    """Register the markers and load the hypothesis profile (``conformance.profiles``);
    a bad ``--impl`` is a usage error before collection, not a failure per property.
    Only a spec other than the default is resolved here: ``impl.gdpo`` is this checkout's
    own, and the tests that use it import it themselves."""
    for name, what in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")
    if config.getoption("--strict-errors", default=False):
        import os

        os.environ[J.STRICT_ENV] = "1"  # read by J.strict_errors at each refusal
    loaded = profiles.load()
    runner.DRAW_FIRST = profiles.draws_first(loaded)  # grade: cases drawn first, read by run_for_pytest
    config._gdpo_profile = loaded
    config._gdpo_results = {}
    config._gdpo_start = time.monotonic()
    try:
        parse_domain(config.getoption("--domain", default=None))
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    target = config.getoption("--impl", default=DEFAULT_IMPL)
    if target != DEFAULT_IMPL:
        try:
            fn = resolve_impl(target)
        except ImplSpecError as e:
            raise pytest.UsageError(str(e)) from None
        why = shape_mismatch(fn, config.getoption("--call-shape", default="gdpo"))
        if why is not None:  # else every call raises a TypeError, graded as refusals
            raise pytest.UsageError(f"--impl {target!r}: {why}")


def _subject(config):
    opt = config.getoption
    return Subject(opt("--impl", default=DEFAULT_IMPL), opt("--call-shape", default="gdpo"),
                   opt("--convention", default="spec"), domain=parse_domain(opt("--domain", default=None)))


def grades_another(config) -> bool:
    """Do the options name anything but this checkout's own defaults?"""
    return (config.getoption("--impl", default=DEFAULT_IMPL) != DEFAULT_IMPL
            or config.getoption("--call-shape", default="gdpo") != "gdpo"
            or config.getoption("--convention", default="spec") != "spec")


def grading(config) -> bool:
    """A grading run: another implementation named, or ``--gdpo-grade`` (``gdpo check``, which
    grades this checkout's own implementation the same way: the suite's self-tests are no
    grade of it)."""
    return grades_another(config) or bool(config.getoption("--gdpo-grade", default=False))


def single_process(config) -> bool:
    return bool(config.getoption("--single-process", default=False))


def multi_process_properties() -> list[str]:
    """The properties that spawn ranks (deselected by ``--single-process``)."""
    return [p.name for p in properties.PROPERTIES if p.world > 0]


#: The suite's tests of itself (every negative control against every property, the judge's
#: plumbing): they grade the suite, not the implementation named, take most of a run's time,
#: and a failure there is no fault of that implementation; grading another one deselects them.
SELF_TESTS = ("test_controls.py", "test_suite_meta.py")


def pytest_collection_modifyitems(config, items):
    """Grading another implementation (or call shape, or convention): keep the
    conformance suite's tests of that implementation only. The repository's other tests
    never call ``--impl``; run with it, they would only mix this checkout's verdict into
    it; the suite's self-tests (``SELF_TESTS``) grade the suite, not it.
    ``--single-process``: deselect the tests that spawn ranks (marked ``distributed``)."""
    suite = Path(__file__).resolve().parent
    keep, drop, own, multi = [], [], [], []
    for item in items:
        path = Path(str(item.path)).resolve()
        if grading(config) and suite not in path.parents:
            drop.append(item)
        elif grading(config) and path.parent == suite and path.name in SELF_TESTS:
            own.append(item)
        elif single_process(config) and item.get_closest_marker("distributed") is not None:
            multi.append(item)
        else:
            keep.append(item)
    config._gdpo_single_process_deselected = [item.nodeid for item in multi]
    config._gdpo_self_tests_deselected = [item.nodeid for item in own]
    if drop or own or multi:
        config.hook.pytest_deselected(items=drop + own + multi)
        items[:] = keep


def _self_tests() -> str:
    return ", ".join(f"conformance/{name}" for name in SELF_TESTS)


def pytest_report_header(config):
    lines = []
    if grading(config):
        lines.append(f"gdpo conformance: grading {config.getoption('--impl')} (call shape "
                     f"{config.getoption('--call-shape')}, convention {config.getoption('--convention')}); "
                     f"tests outside conformance/ are deselected, and so are the suite's self-tests ({_self_tests()}: "
                     "they grade the suite, not this implementation)")
    if grading(config):
        lines.append("gdpo conformance: " + _subject(config).domain_statement())
    if single_process(config):
        lines.append("gdpo conformance: --single-process: the multi-process properties ("
                     + ", ".join(multi_process_properties()) + ", and every test marked distributed) are "
                     "deselected by this option and so are NOT graded: this verdict does not cover the "
                     "distributed protocol (spec section 5)")
    return lines


# ------------------------------------------------------------------ the grading summary
#
# Every test's verdict is collected as it is reported (``pytest_runtest_makereport`` puts what the
# summary needs into the report's ``user_properties``, so it also crosses pytest-xdist's workers):
# the verdict, the failure's category and worst error (``ConformanceFailure.category``,
# ``.worst_ulps``, ``.worst_dtype``; ``-`` where the judge gave none), its first line, first
# listed output and repro line. The summary table comes first in pytest's terminal summary,
# ``--gdpo-json PATH`` writes the same as JSON.

#: The JSON's layout version (``schema``), raised when a key changes meaning.
JSON_SCHEMA = 1

#: test function -> the prefix of its rows' names (``test_property[plain]`` is ``plain``).
_ROW_PREFIX = {"test_property": "", "test_property_on_cuda": "cuda:", "test_error_case": "errors:",
               "test_trl_call_shape": "trl_shape:"}


def row_name(nodeid: str) -> str:
    """The property a test grades, as the summary names it."""
    func = nodeid.rsplit("::", 1)[-1]
    base, _, param = func.partition("[")
    if base in _ROW_PREFIX and param:
        return _ROW_PREFIX[base] + param[:-1]
    return func


def _walk(exc):
    """``exc``, the exceptions of its groups and its causes and contexts, each once, outermost first."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend(getattr(e, "exceptions", ()) or ())
        todo.extend([e.__cause__, e.__context__])


def _is_flaky(e) -> bool:
    try:
        from hypothesis.errors import Flaky
    except ImportError:  # pragma: no cover - hypothesis is the suite's dependency
        return False
    return isinstance(e, Flaky)


def _text_parts(text: str) -> tuple[str, str | None, str | None]:
    """(first line, first listed output or detail, repro command) of a failure's text."""
    lines = text.strip().splitlines() or [""]
    head, detail, repro = lines[0], None, None
    for ln in lines[1:]:
        body = ln.strip()
        if body.startswith("repro: ") and repro is None:
            repro = body[len("repro: "):]
        elif detail is None and ln.startswith("  ") and not body.startswith(("inputs: ", "repro: ", "(")):
            detail = body
    return head, detail, repro


def failure_info(exc: BaseException) -> dict:
    """What the summary says of a failed test's exception (see the section comment above).

    The failure may come wrapped: by hypothesis (an exception group of several distinct
    failures, or a ``Flaky`` whose members are the failures it saw), or re-raised by
    ``run_for_pytest`` once its shrink budget ran out (a ``ConformanceFailure`` with the
    judge's failure as its context, and hypothesis's ``Flaky`` as its cause: the replay of
    the shrunk case ran unchecked, not a second verdict). The outermost failure's text is
    shown, the category and worst error are the first ones any failure in the chain carries."""
    chain = list(_walk(exc))
    found = [e for e in chain if isinstance(e, J.ConformanceFailure)]
    info = {"category": None, "worst_ulps": None, "worst_dtype": None, "worst_value": None, "note": None}
    if found:
        head, detail, repro = _text_parts(str(found[0]))
        info["category"] = next((e.category for e in found if getattr(e, "category", None)), None)
        for e in found:
            if getattr(e, "worst_ulps", None) is not None:
                info["worst_ulps"], info["worst_dtype"] = float(e.worst_ulps), getattr(e, "worst_dtype", None)
                if getattr(e, "worst_value", None) is not None:
                    info["worst_value"] = float(e.worst_value)
                break
        if "(shrinking stopped at its budget" in str(found[0]):
            info["note"] = "shrinking stopped at its budget: the smallest failing case found by then"
        many = re.search(r"\((\d+ of \d+ cases failed \(categories: [^)]*\))", str(found[0]))
        if many:  # a drawn-first run: how many of its cases failed, and in which categories
            info["note"] = many.group(1)
        distinct = {str(e).splitlines()[0] for e in found}
        if len(distinct) > 1 and any(getattr(e, "exceptions", None) and not _is_flaky(e) for e in chain):
            info["note"] = f"{len(distinct)} distinct failures; the first is shown"
    else:
        text = str(exc).strip()
        head, detail, repro = _text_parts(text)
        head = f"{type(exc).__name__}: {head}" if head else type(exc).__name__
        if "not deterministic" in text:
            info["note"] = "nondeterministic: a case failed, then passed when checked again"
        elif _is_flaky(exc):
            info["note"] = ("hypothesis reported Flaky: a case failed, then passed when replayed "
                            "(the implementation or the suite is not deterministic)")
    info.update(headline=head, detail=detail, repro=repro)
    return info


def _hide_shrink_budget_flaky(exc) -> None:
    """``run_for_pytest``'s failure after its shrink budget carries hypothesis's ``Flaky``
    as its cause: hypothesis replayed the shrunk case while the run function no longer
    checked (the budget), and the replay "passed". The case was checked again and failed,
    so the implementation is deterministic there: the Flaky is the budget's, and printing
    its traceback (\"produces unreliable results\") would call deterministic code flaky."""
    if (isinstance(exc, J.ConformanceFailure) and _is_flaky(exc.__cause__)
            and "(shrinking stopped at its budget" in str(exc)):
        exc.__cause__ = None
        exc.__suppress_context__ = True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    if call.excinfo is not None:
        _hide_shrink_budget_flaky(call.excinfo.value)
    report = yield
    if call.when == "setup":
        report.user_properties.append(("gdpo_calls_impl", "subject" in getattr(item, "fixturenames", ())))
    if report.failed and call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception):
        report.user_properties.append(("gdpo_failure", failure_info(call.excinfo.value)))
    if call.when == "call":
        run = _drawn_run(item)
        if run is not None:  # what a drawn-first run checked (the same on any machine)
            report.user_properties.append(("gdpo_cases", run))
    if call.when == "call" and report.passed:
        name = row_name(item.nodeid)
        case = name.split(":", 1)[1] if name.startswith("errors:") else None
        classes = sorted({cls for c, cls in J.NOTES.get("errors", ()) if c == case})
        if classes:  # a clear refusal of another class than spec.errors': passed, and said
            report.user_properties.append(("gdpo_note", {
                "category": "wrong_class",
                "note": f"refused with {', '.join(classes)}, not the spec.errors class the contract names "
                        "(a clear refusal: passes; fails under --strict-errors)"}))
    return report


def _drawn_run(item):
    """The drawn-first run of the property this test ran (``runner.RUNS``), or None."""
    name = row_name(item.nodeid)
    if name.startswith("cuda:"):
        return runner.RUNS.pop((name[len("cuda:"):], "cuda"), None)
    return runner.RUNS.pop((name, "cpu"), None)


def _skip_reason(report) -> str:
    lr = report.longrepr
    reason = lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def pytest_runtest_logreport(report):
    config = _CONFIG.get("config")
    results = getattr(config, "_gdpo_results", None)
    if results is None:
        return
    row = results.setdefault(report.nodeid, {
        "name": row_name(report.nodeid), "nodeid": report.nodeid, "verdict": "passed", "category": None,
        "worst_ulps": None, "worst_dtype": None, "worst_value": None, "headline": None, "detail": None, "repro": None,
        "note": None,
        "skip_reason": None, "seconds": 0.0, "calls_impl": False, "cases": None, "cases_digest": None,
        "failed_cases": None, "findings": []})
    props = dict(report.user_properties)
    if "gdpo_cases" in props:
        row.update(props["gdpo_cases"])
    if "gdpo_calls_impl" in props:
        row["calls_impl"] = bool(props["gdpo_calls_impl"])
    row["seconds"] += float(getattr(report, "duration", 0.0) or 0.0)
    if "gdpo_note" in props and report.passed:
        row.update(props["gdpo_note"])
    if report.skipped:
        row["verdict"], row["skip_reason"] = "skipped", _skip_reason(report)
    elif report.failed:
        row["verdict"] = "failed" if report.when == "call" else "error"
        info = props.get("gdpo_failure")
        if info is None:
            crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
            info = {"headline": getattr(crash, "message", str(report.longrepr)).splitlines()[0]}
        if row["headline"] is None:  # the call's failure, not a teardown's after it
            row.update({k: v for k, v in info.items() if k in row})


#: The config of this process's session (``pytest_runtest_logreport`` receives no config).
_CONFIG: dict = {}


def pytest_sessionstart(session):
    _CONFIG["config"] = session.config


def graded_rows(config) -> list[dict]:
    """The rows of the tests that ran, in the order they were reported."""
    return list(getattr(config, "_gdpo_results", {}).values())


def counts(rows: list[dict]) -> dict:
    """Verdict counts over the tests that call the implementation (``calls_impl``), a suite
    check that never calls it (``conformance/test_errors.py``'s table checks) apart."""
    graded = [r for r in rows if r["calls_impl"]]
    out = {v: sum(r["verdict"] == v for r in graded) for v in ("passed", "failed", "error", "skipped")}
    out["called_impl"] = sum(r["verdict"] != "skipped" for r in graded)
    out["suite_checks"] = len(rows) - len(graded)
    return out


def worst_cell(row: dict) -> str:
    """The table's worst error of a row: ``4.5 ulp(float32)``; an exact_zero failure's, the value
    returned where 0 is demanded (``5.85e-17, not 0``): its ulps, those of 0, say nothing."""
    if row.get("category") == "exact_zero" and row.get("worst_value") is not None:
        return f"{row['worst_value']:.3g}, not 0"
    return format_ulps(row.get("worst_ulps"), row.get("worst_dtype"))


def format_ulps(ulps, dtype) -> str:
    """``4.5 ulp(float32)``, or ``-``."""
    if ulps is None:
        return "-"
    if not math.isfinite(ulps):
        return f"{ulps} ulp" + (f"({dtype})" if dtype else "")
    return f"{ulps:.3g} ulp" + (f"({dtype})" if dtype else "")


def verdict_cell(row: dict, width: int = 60) -> str:
    if row["verdict"] == "skipped":
        reason = " ".join((row["skip_reason"] or "").split())
        reason = reason if len(reason) <= width else reason[:width - 3] + "..."
        return f"skipped: {reason}"
    if not row["calls_impl"]:
        return f"{row['verdict']} (suite check, never calls it: not counted)"
    return row["verdict"]


def _merge_key(r: dict) -> tuple:
    """What makes two passed or skipped rows one: the verdict, the test function, whether it calls
    the implementation, (skipped) the reason without the row's own name at its end (``call
    shape 'trl' cannot express integer_rewards`` and ``... bool_rewards`` are one reason), and the
    category a passed row carries (``wrong_class``: a refusal of another class), shown on its row."""
    reason = " ".join((r["skip_reason"] or "").split())
    own = r["name"].split(":", 1)[1] if ":" in r["name"] else r["name"]
    if reason.endswith(" " + own):
        reason = reason[:-len(own)] + "these"
    return r["verdict"], r["nodeid"].split("[")[0], r["calls_impl"], reason, r.get("category")


def table_rows(rows: list[dict], list_names: bool = False) -> list[tuple[str, str, str, str]]:
    """(property, verdict, category, worst error) per row of the table (:func:`table_groups`)."""
    return [cells for cells, _ in table_groups(rows, list_names)]


def table_groups(rows: list[dict], list_names: bool = False) -> list[tuple[tuple, list[dict]]]:
    """The table's rows, each ((property, verdict, category, worst error), the grading rows it
    stands for). The rows of one test function that passed, or were skipped for one reason
    (``call shape 'trl' cannot express these``), are merged wherever they stand, at the place of
    the first (``errors:* (22)``), so that the table stays one screen; a failed row is always its
    own. ``list_names``: a merged row that is not every row of its prefix names its members
    (``errors: a, b, c``) instead of counting them (the peers page, which has the width)."""
    groups: dict = {}
    for r in rows:
        if r["verdict"] in ("skipped", "passed"):
            groups.setdefault(_merge_key(r), []).append(r)
    prefixes: dict = {}
    for r in rows:
        if ":" in r["name"]:
            prefixes[r["name"].split(":")[0]] = prefixes.get(r["name"].split(":")[0], 0) + 1
    done: set = set()
    out = []

    def name_of(group: list[dict]) -> str:
        if len(group) == 1:
            return group[0]["name"]
        first = group[0]["name"]
        if ":" not in first:
            return ", ".join(x["name"] for x in group)
        prefix = first.split(":")[0]
        if list_names and len(group) < prefixes[prefix]:
            return prefix + ": " + ", ".join(x["name"].split(":", 1)[1] for x in group)
        return f"{prefix}:* ({len(group)})"

    for r in rows:
        if r["verdict"] not in ("skipped", "passed"):
            out.append(((r["name"], verdict_cell(r), r["category"] or "-",
                         worst_cell(r)), [r]))
            continue
        key = _merge_key(r)
        if key in done:
            continue
        done.add(key)
        group = groups[key]
        if r["verdict"] == "skipped" and len(group) > 1:
            cell = "skipped: " + (key[3] if len(key[3]) <= 60 else key[3][:57] + "...")
        else:
            cell = verdict_cell(r)
        out.append(((name_of(group), cell, key[4] or "-", "-"), group))
    return out


def members(cell: str) -> list[str]:
    """The row names a merged property cell stands for (``errors: a, b`` -> ``errors:a``, ``errors:b``;
    ``offsets, cancellation``; a single name); a counted cell (``cuda:* (14)``) names none."""
    if re.search(r":\* \(\d+\)$", cell):
        return []
    if ": " in cell:
        prefix, names = cell.split(": ", 1)
        return [f"{prefix}:{n}" for n in names.split(", ")]
    return cell.split(", ")


def render_table(rows: list[dict]) -> list[str]:
    head = ("property", "verdict", "category", "worst error")
    body = table_rows(rows)
    widths = [max(len(h), *(len(b[k]) for b in body)) if body else len(h) for k, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [line(head), line(tuple("-" * w for w in widths))] + [line(b) for b in body]


def total_line(config, rows: list[dict]) -> str:
    c = counts(rows)
    impl = config.getoption("--impl", default=DEFAULT_IMPL)
    verdicts = ", ".join(f"{c[v]} {v}" for v in ("passed", "failed", "error") if c[v]) or "none graded"
    parts = [f"{c['called_impl']} propert{'y' if c['called_impl'] == 1 else 'ies'} called {impl}: {verdicts}"]
    if c["skipped"]:
        parts.append(f"{c['skipped']} skipped (not expressible in this call shape or convention, or no device)")
    if c["suite_checks"]:
        parts.append(f"{c['suite_checks']} suite check(s) that never call it, not counted")
    own = getattr(config, "_gdpo_self_tests_deselected", None) or []
    multi = getattr(config, "_gdpo_single_process_deselected", None) or []
    if own:
        parts.append(f"{len(own)} self-test(s) of the suite deselected")
    if multi:
        parts.append(f"{len(multi)} multi-process test(s) deselected by --single-process (not graded)")
    return "gdpo conformance: " + "; ".join(parts)


def _domain_json(config) -> dict:
    try:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in _subject(config).domain().items()}
    except Exception:  # noqa: BLE001 - an implementation that cannot be loaded errored every test already
        return {}


def grading_findings(rows: list[dict]) -> list[dict]:
    """The findings of a grading (``conformance/findings.py``): every failed property's records,
    merged by category and regime."""
    return findings.group([f for r in rows if r["verdict"] == "failed" for f in r.get("findings") or ()])


def render_findings(found: list[dict]) -> list[str]:
    lines = []
    for i, f in enumerate(found, 1):
        lines.append(f"{i}. {f['category']}: {findings.cause(f)} ({', '.join(f['properties'])}): {f['example']}")
    return lines


#: a precision failure within this many float32 ulps of the exact value reads as float32
#: arithmetic inside (a float64 computation rounded once is within half of one: spec/error_model.py)
FLOAT32_ARITHMETIC_ULPS = 2.0


def precision_hint(rows: list[dict], convention: str) -> str | None:
    """Under ``spec``, where every precision failure of a grading is a float32 output within
    :data:`FLOAT32_ARITHMETIC_ULPS` ulps of the exact value: what that reads as, and the two ways
    out; else None."""
    if convention != "spec":
        return None
    prec = [r for r in rows if r["verdict"] == "failed" and r.get("category") == "precision"]
    if not prec or any(r.get("worst_dtype") != "float32" or r.get("worst_ulps") is None
                       or not r["worst_ulps"] <= FLOAT32_ARITHMETIC_ULPS for r in prec):
        return None
    worst = max(r["worst_ulps"] for r in prec)
    return (f"hint: every precision failure is within {worst:.3g} ulp(float32) of the exact value, the mark of "
            "float32 arithmetic inside; the spec convention allows about half an ulp on ordinary inputs (a float64 "
            "computation rounded once, spec/error_model.py). Compute in float64 and round once, or grade the code "
            "under the preset of the code it follows (--convention trl, verl, ...: gdpo check --help lists them)")


def machine_line(rows: list[dict]) -> str:
    """What of a drawn-first grading holds on any machine, and what may not."""
    from conformance.verdicts import ARITHMETIC

    line = ("gdpo conformance: the cases checked were drawn first from each property's seed: the same on any "
            "machine, whatever the code returns (per property in --json: cases, cases_digest)")
    moved = sorted({r["name"] for r in rows if r["verdict"] == "failed" and r["category"] in ARITHMETIC})
    if moved:
        line += (f"; {len(moved)} failure(s) of arithmetic ({', '.join(moved)}) rest on this machine's float "
                 "arithmetic of the graded code on those cases, which may differ on a CPU of another SIMD width")
    return line


def peer_of(convention: str) -> dict | None:
    """The preset's provenance (package, version, entry point) and the installed version, or None."""
    from spec import get_convention

    try:
        conv = get_convention(convention)
    except Exception:  # noqa: BLE001 - an unknown convention errored every test already
        return None
    if not getattr(conv, "package", ""):
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version(conv.package)
    except PackageNotFoundError:
        installed = None
    return {"package": conv.package, "version": conv.version, "entry_point": conv.entry_point,
            "read_from": conv.read_from, "installed_version": installed}


def grading_json(config, rows: list[dict], exitstatus) -> dict:
    import hypothesis

    opt = config.getoption
    convention = opt("--convention", default="spec")
    return {
        "schema": JSON_SCHEMA,
        "impl": opt("--impl", default=DEFAULT_IMPL),
        "convention": convention,
        "call_shape": opt("--call-shape", default="gdpo"),
        "single_process": single_process(config),
        "peer": peer_of(convention),
        "profile": getattr(config, "_gdpo_profile", None),
        "draws_first": runner.DRAW_FIRST,
        "hypothesis": hypothesis.__version__,
        "python": sys.version.split()[0],
        "torch": getattr(sys.modules.get("torch"), "__version__", None),
        "exit_status": int(exitstatus),
        "seconds": round(time.monotonic() - getattr(config, "_gdpo_start", time.monotonic()), 3),
        "counts": counts(rows),
        "domain": _domain_json(config),
        "findings": grading_findings(rows),
        "hint": precision_hint(rows, config.getoption("--convention")),
        "self_tests_deselected": list(getattr(config, "_gdpo_self_tests_deselected", None) or []),
        "multi_process_deselected": list(getattr(config, "_gdpo_single_process_deselected", None) or []),
        "properties": [{**r, "category_label": None if r["category"] is None else _label(r["category"]),
                        "seconds": round(r["seconds"], 3)} for r in rows],
    }


def _label(category):
    from conformance.verdicts import label

    return label(category)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """In a grading run (``gdpo check``, ``--impl``/``--convention``/``--call-shape`` named, or
    ``--gdpo-json``): the summary table first (before pytest's failure texts), one line, the worst
    output and the repro line per failure, and the total; then pytest's own summary, then what
    was deselected; ``--gdpo-json`` is written last."""
    rows = graded_rows(config)
    tr = terminalreporter
    path = config.getoption("--gdpo-json", default=None)
    if rows and (grading(config) or path) and not getattr(config, "workerinput", None):
        tr.section("gdpo conformance summary", sep="=")
        found = grading_findings(rows)
        if found:
            tr.write_line("findings (one per cause; the per-property table follows):")
            for ln in render_findings(found):
                tr.write_line(ln)
            hint = precision_hint(rows, config.getoption("--convention"))
            if hint:
                tr.write_line(hint)
            tr.write_line("")
        for ln in render_table(rows):
            tr.write_line(ln)
        used = sorted({r["category"] for r in rows if r["category"]})
        if used:
            tr.write_line("categories: " + "; ".join(f"{c}: {_label(c)}" for c in used))
        failed = [r for r in rows if r["verdict"] in ("failed", "error")]
        if failed:
            tr.write_line("")
            tr.write_line("failures (the full texts: gdpo check --details, or pytest --tb=short):")
        for r in failed:
            tr.write_line(f"* {r['name']}: {r['headline']}")
            if r.get("detail"):
                detail = r["detail"]
                tr.write_line(f"    {detail if len(detail) <= 400 else detail[:397] + '...'}")
            if r.get("note"):
                tr.write_line(f"    ({r['note']})")
            if r.get("repro"):
                tr.write_line(f"    repro: {r['repro']}")
        tr.write_line(total_line(config, rows))
        tr.write_line("gdpo conformance: " + _subject(config).domain_statement())
        if runner.DRAW_FIRST:
            tr.write_line(machine_line(rows))
    try:
        return (yield)
    finally:
        _deselection_summary(tr, config)
        if path:
            Path(path).write_text(json.dumps(grading_json(config, rows, exitstatus), indent=1) + "\n")
            tr.write_line(f"gdpo conformance: the grading as JSON in {path}")


def _deselection_summary(terminalreporter, config):
    if grading(config):
        own = getattr(config, "_gdpo_self_tests_deselected", None)
        count = "the" if own is None else f"{len(own)}"  # None: collected elsewhere (pytest-xdist's workers)
        terminalreporter.write_line(
            f"gdpo conformance: {count} self-test(s) of the suite ({_self_tests()}) deselected: they grade the "
            f"suite, not {config.getoption('--impl')}")
    if not single_process(config):
        return
    gone = getattr(config, "_gdpo_single_process_deselected", None)
    if gone is None:  # collected elsewhere (pytest-xdist's workers): name the properties
        terminalreporter.write_line("gdpo conformance: the multi-process properties (" +
                                    ", ".join(multi_process_properties()) +
                                    ") were deselected by --single-process, not graded")
        return
    terminalreporter.write_line(
        f"gdpo conformance: {len(gone)} multi-process test(s) deselected by --single-process, "
        "not graded" + (": " + ", ".join(gone) if gone else ""))


def pytest_addoption(parser):
    """The suite's options (this module is a pytest plugin: see the module docstring)."""
    group = parser.getgroup("gdpo-conformance", "GDPO conformance suite")
    group.addoption("--impl", default=DEFAULT_IMPL,
                    help=f"implementation under test, package.module:function (default {DEFAULT_IMPL})")
    group.addoption("--convention", default="spec",
                    help="convention the implementation claims (a preset of spec/conventions.py; default spec)")
    group.addoption("--call-shape", default="gdpo", choices=CALL_SHAPES,
                    help="how to call it: gdpo (impl.gdpo's signature), trl (rewards, num_generations, "
                         "reward_weights) or verl (token_level_rewards, response_mask, index, weights -> "
                         "(B, T)); see conformance/plugins.py")
    group.addoption("--strict-errors", action="store_true", default=False,
                    help="the strict error contract: a refusal must raise the spec.errors class the contract "
                         "names (without it a clear refusal of another class passes, reported as wrong_class)")
    group.addoption("--domain", action="append", default=[], metavar="KEY=VALUE",
                    help="declare the implementation's domain without changing it (over its gdpo_domain): "
                         "min_columns, max_columns, group_sizes (4,8 or 4+), max_abs_reward, max_abs_weight, "
                         "input_dtypes, out_dtypes, labels, units, eps; the search stays inside it")
    group.addoption("--single-process", action="store_true", default=False,
                    help="grade an implementation for one process (no process_group): deselect the "
                         "multi-process properties (conformance/test_distributed.py), reported as not graded")
    group.addoption("--gdpo-grade", action="store_true", default=False,
                    help="a grading run (what gdpo check passes): the suite's self-tests and the tests outside "
                         "conformance/ are deselected also for the default implementation")
    group.addoption("--gdpo-json", default=None, metavar="PATH",
                    help="write the grading (per property: verdict, category, worst error, first line, repro "
                         "line, skip reason, seconds; the implementation, convention, call shape and peer) "
                         "as JSON to PATH")
