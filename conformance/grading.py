"""``gdpo check``: one grading of one implementation (docs/grading.md): :func:`grade` runs the probes
(:mod:`conformance.probes`: the code's working precision and formula; unless ``--strict`` every case
is judged at that precision), checks every row's cases drawn first (``conformance.runner``) and
groups the failures into findings (:mod:`conformance.findings`); :func:`render` is the first screen,
:func:`as_json` the same for machines (``gdpo check --json``).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import sys
import time
import traceback
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import hypothesis

from conformance import findings as FD
from conformance import judge as J
from conformance import probes, profiles, runner
from conformance.error_cases import ERROR_CASES
from conformance.judge import ConformanceFailure
from conformance.properties import PROPERTIES
from conformance.subject import DEFAULT_IMPL, Subject, parse_domain
from conformance.verdicts import label
from spec.conventions import get_convention

#: the JSON's layout version (``schema``), raised when a key changes meaning
JSON_SCHEMA = 2
#: exit codes: conforming, findings, a usage error (argparse's), an error of the grader itself
EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_GRADER = 0, 1, 2, 3
#: the first screen: at most this many lines, and columns outside the replay lines; a replay line
#: longer than REPLAY_COLUMNS (a case of many rows) is left to --details and the JSON
SCREEN_LINES, SCREEN_COLUMNS, REPLAY_COLUMNS = 60, 160, 480


@dataclasses.dataclass
class Row:
    """One row of the table: a property, or one error case of the contract (``errors:<name>``)."""

    name: str
    verdict: str  # "passed", "failed", "skipped"
    reason: str = ""  # why it was skipped
    cases: int = 0
    failed: int = 0
    digest: str = ""
    categories: tuple = ()
    notes: tuple = ()  # e.g. refusals of another class than spec.errors' (wrong_class)
    seconds: float = 0.0
    unchecked: int = 0  # cases after a hang, not checked (runner.failures)


@dataclasses.dataclass
class Grading:
    subject: Subject
    profile: probes.Profile | None
    rows: list
    findings: list
    seconds: float
    strict: bool = False
    single_process: bool = False

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def graded(self) -> bool:
        """Did any row check a case? (Not where every row was skipped or drew nothing.)"""
        return any(r.cases for r in self.rows)

    @property
    def exit_status(self) -> int:
        return EXIT_FINDINGS if self.findings else EXIT_OK if self.graded else EXIT_USAGE


def _rows_to_run(subject: Subject, select: str | None, single_process: bool):
    """(row name, skip reason or None) for every row of the grading."""
    words = [w.strip() for w in (select or "").split(",") if w.strip()]
    names = {p.name for p in PROPERTIES} | {f"errors:{ec.name}" for ec in ERROR_CASES} | {"errors"}

    def chosen(name: str) -> bool:  # a row's own name, its prefix (errors), else a part of its name
        return not words or any(name == w or name.startswith(w + ":") or (w not in names and w in name)
                                for w in words)
    for prop in PROPERTIES:
        why = subject.unsupported(prop.needs)
        if why is None and single_process and prop.world > 0:
            why = "--single-process: the multi-process properties are not graded"
        if prop.name != "errors":
            if chosen(prop.name):
                yield prop.name, why
            continue
        for ec in ERROR_CASES:
            name = f"errors:{ec.name}"
            if not chosen(name):
                continue
            yield name, why or subject.unasked(ec)


def _check_row(subject: Subject, name: str) -> tuple[Row, list]:
    t0 = time.monotonic()
    cases, check = runner.row_check(name, subject, profiles.GRADE_MAX_EXAMPLES)
    found = list(runner.failures(cases, check, ConformanceFailure))
    failures = [FD.Failure(name, getattr(exc, "case", cases[i]), exc, check) for i, exc in found]
    seen = J.NOTES.get(name.split(":", 1)[0], ())
    notes = tuple(sorted({f"refused with {cls}, not the spec.errors class (such a refusal passes; fails under --strict-errors)"
                          for c, cls in seen if name == f"errors:{c}" or not name.startswith("errors:")}))
    cats = tuple(dict.fromkeys(str(f.exc.category) for f in failures))
    row = Row(name, "failed" if failures else "passed", cases=len(cases), failed=len(failures),
              digest=runner.digest(cases), categories=cats, notes=notes, seconds=time.monotonic() - t0,
              unchecked=runner.unchecked(cases, found))
    return row, failures


def grade(subject: Subject, select: str | None = None, single_process: bool = False,
          strict: bool = False) -> Grading:
    """Grade ``subject``; ``strict``: hold it to the specification's own error model (exact zeros
    bit for bit, the prescribed float64 algorithm's accuracy) instead of its own precision."""
    t0 = time.monotonic()
    profiles.register()  # the drawing's base profile ("ci"); the loaded profile is left as it is
    prof = None
    with warnings.catch_warnings():  # the graded code's: overflow, torch's std of one row; the findings say it
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UserWarning)
        if subject.convention == "spec" and not strict:
            prof = probes.profile(subject)
            subject.precision, subject.profile = prof.precision, prof
        rows, failures = [], []
        for name, why in _rows_to_run(subject, select, single_process):
            row, found = (Row(name, "skipped", reason=why), []) if why else _check_row(subject, name)
            rows.append(row)
            failures += found
        found = FD.findings(failures, subject)
    if not select and not any(f.category == "formula" for f in found):
        found += [f for f in [FD.from_probes(prof, subject)] if f is not None]
    return Grading(subject, prof, rows, found, time.monotonic() - t0, strict, single_process)


def verdict_line(g: Grading) -> str:
    s = g.subject
    what = f"gdpo check {s.target} (call shape {s.shape}, convention {s.convention})"
    if g.ok and not g.graded:
        return f"{what}: nothing graded: no row checked a case (see the table); this is no verdict"
    if g.ok:
        graded = sum(r.verdict != "skipped" for r in g.rows)
        return f"{what}: conforms: no finding on the {graded} properties graded"
    by = collections.Counter(f.regime for f in g.findings)
    parts = [f"{n} at {k}" if k.endswith("magnitudes") else f"{n} on {k}" for k, n in
             sorted(by.items(), key=lambda kv: FD.REGIMES.index(kv[0]))]
    return f"{what}: {len(g.findings)} finding{'s' if len(g.findings) > 1 else ''} ({', '.join(parts)})"


def _clip(line: str, width: int = SCREEN_COLUMNS) -> str:
    return line if len(line) <= width else line[:width - 3] + "..."


def table(g: Grading) -> list[str]:
    """The compact table: one line per graded row (failed first), the passed ones merged, each
    note said once under it with the rows it holds for, the skipped rows merged by reason."""
    graded = sorted((r for r in g.rows if r.verdict != "skipped"), key=lambda r: r.verdict != "failed")
    passed = [r for r in graded if r.verdict == "passed"]
    out = [_clip(f"{r.name:<28} {r.verdict:<7} {r.cases:>5} {r.failed:>6}  "
                 + "; ".join(x for x in (", ".join(r.categories), _hung(r)) if x))
           for r in graded if r not in passed]
    if out:  # a header over the rows that did not pass, none over nothing
        out.insert(0, f"{'property':<28} {'verdict':<7} {'cases':>5} {'failed':>6}  categories / notes")
    if passed:
        out.append(_clip(f"passed ({len(passed)}): {', '.join(r.name for r in passed)}"))
    noted: dict = {}
    for r in graded:
        for note in r.notes:
            noted.setdefault(note, []).append(r.name)
    errors = sum(r.name.startswith("errors:") for r in graded)
    for note, names in noted.items():
        out += _noted(f"{note}, in {len(names)} row(s):", names, errors)
    skipped = collections.Counter(r.reason.split(": ", 1)[0] if r.reason.startswith("call shape") else r.reason
                                  for r in g.rows if r.verdict == "skipped")
    if skipped:
        out.append(_clip(f"not graded ({sum(skipped.values())}): " +
                         "; ".join(f"{why} ({n})" for why, n in skipped.items())))
    return out


def _noted(head: str, names: list, errors: int) -> list[str]:
    """A note's line and the rows it holds for (the error rows as one word where it holds for all
    ``errors`` of them), on a second line where one is too short, clipped at a row's name."""
    errs = [n.split(":", 1)[1] for n in names if n.startswith("errors:")]
    parts = [", ".join(n for n in names if not n.startswith("errors:"))]
    parts.append("" if not errs else f"all {len(errs)} errors:* rows" if len(errs) == errors
                 else "errors: " + ", ".join(errs))
    rows = "; ".join(p for p in parts if p)
    if len(head) + 1 + len(rows) <= SCREEN_COLUMNS:
        return [f"{head} {rows}"]
    more = " ... (--json: each row's notes)"
    rows = "  " + rows
    return [head, rows if len(rows) <= SCREEN_COLUMNS else rows[:SCREEN_COLUMNS - len(more)].rsplit(",", 1)[0] + more]


def _hung(r: Row) -> str:
    """A row that stopped at a hang: how many of its cases were not checked."""
    return f"the ranks hung: the last {r.unchecked} case(s) not checked" if r.unchecked else ""


def _screen_line(line: str, f) -> str:
    """A finding's line on the first screen: clipped, but a replay line whole (to copy), unless
    it is longer than three screen lines."""
    if not line.lstrip().startswith("replay:"):
        return _clip(line)
    if len(line) <= REPLAY_COLUMNS:
        return line
    return (f"   replay: too long for this screen ({len(f.repro):,} characters): gdpo check --details prints it; "
            "--json has it as repro")


def render(g: Grading, details: bool = False) -> str:
    """The first screen (at most :data:`SCREEN_LINES` lines, :data:`SCREEN_COLUMNS` columns outside
    the replay lines); ``details``: every finding's full text after it."""
    s = g.subject
    how = (_clip(g.profile.statement()) if g.profile is not None
           else "held to the specification's own error model (--strict): the prescribed float64 algorithm, "
                "exact collapse and structural zeros bit for bit" if g.strict
           else f"judged under convention {s.convention!r} at its own precision")
    lines = [verdict_line(g), how, _clip(s.domain_statement()), ""]
    shown = FD.rank(g.findings)
    budget = SCREEN_LINES - len(lines) - len(table(g)) - 4
    if shown:
        lines.append("findings, worst first:")
        for i, f in enumerate(shown, 1):
            block = f.lines(i)
            if len(block) > budget:
                lines.append(f"... {len(shown) - i + 1} more finding(s): gdpo check --details lists every one")
                break
            lines += [_screen_line(x, f) for x in block]
            budget -= len(block)
        lines += [_clip(x) for x in _domain_hint(shown, s.domain())] + [""]
    lines += table(g)
    lines.append(f"{g.seconds:.0f} s; the cases were drawn first from each property's seed: the same on any machine "
                 "(--json: cases_digest)")
    if details:
        for i, f in enumerate(shown, 1):
            lines += ["", f"--- finding {i}: {label(f.category)} ---", f.detail]
    return "\n".join(lines)


def _domain_hint(shown: list, domain: dict) -> list[str]:
    """Where every finding is at extreme magnitudes: the magnitudes they start from, and how to
    declare a range that stays below them (a float32 code that is right on every ordinary batch)."""
    if not shown or any(f.regime != "extreme magnitudes" for f in shown):
        return []
    starts = {f.input: min(g.threshold for g in shown if g.input == f.input and g.threshold)
              for f in shown if f.threshold}
    where = ", ".join(f"|{inp}| from about {v:.3g}" for inp, v in sorted(starts.items()))
    todo = " ".join(f"--domain max_abs_{k}=1e6" for k in ("reward", "weight") if f"max_abs_{k}" not in domain)
    return [f"every finding is at extreme magnitudes{f' ({where})' if where else ''}.",
            f"if your rewards and weights stay far below, declare their range: {todo or 'a narrower max_abs_*'} "
            "(docs/grading.md, Declarations)"]


def as_json(g: Grading) -> dict:
    s = g.subject
    prof = g.profile
    return {
        "schema": JSON_SCHEMA, "impl": s.target, "call_shape": s.shape, "convention": s.convention,
        "strict": g.strict, "single_process": g.single_process,
        "precision": None if prof is None else prof.precision,
        "probes": None if prof is None else {"statement": prof.statement(), "formula": prof.formula,
                                              "named": prof.named, "failed": prof.failed},
        "domain": {k: list(v) if isinstance(v, tuple) else v for k, v in s.domain().items()},
        "peer": _peer(s.convention),
        "verdict": verdict_line(g),
        "exit_status": g.exit_status,
        "findings": [f.as_json() for f in FD.rank(g.findings)],
        "properties": [dataclasses.asdict(r) | {"seconds": round(r.seconds, 3)} for r in g.rows],
        "hypothesis": hypothesis.__version__, "python": sys.version.split()[0],
        "torch": getattr(sys.modules.get("torch"), "__version__", None), "seconds": round(g.seconds, 1),
    }


def _peer(convention: str) -> dict | None:
    """A peer preset's provenance (package, version, entry point) and the version installed here."""
    conv = get_convention(convention)
    if not conv.package:
        return None
    try:
        installed = version(conv.package)
    except PackageNotFoundError:
        installed = None
    return {"package": conv.package, "version": conv.version, "entry_point": conv.entry_point,
            "installed_version": installed}


def refuse(impl: str | None, json_path: str | None, status: int, error: str) -> int:
    """A run that graded nothing (a usage error, 2; the grader's own, 3): the error on standard
    error and, under ``--json``, a JSON with ``exit_status`` and ``error`` in place of a grading, so
    that a JSON left by an earlier run is never read as this one's. Returns ``status``."""
    print(f"gdpo check: error: {error}", file=sys.stderr)
    said = json.dumps({"schema": JSON_SCHEMA, "impl": impl or DEFAULT_IMPL, "exit_status": status, "verdict": None,
                       "error": error}, indent=1)
    if json_path == "-":
        print(said)
    elif json_path:
        try:
            Path(json_path).write_text(said + "\n")
        except OSError:  # the folder itself was the usage error
            pass
    return status


def main(impl: str | None, call_shape: str | None, convention: str | None, select: str | None = None,
         single_process: bool = False, json_path: str | None = None, details: bool = False,
         strict: bool = False, domain=()) -> int:
    """``gdpo check``: grade, print the first screen, write the JSON; the exit code (see the constants)."""
    subject = Subject(impl or DEFAULT_IMPL, call_shape or "gdpo", convention or "spec", domain=parse_domain(domain))
    try:  # usage errors, before anything runs
        subject.context()  # a declared domain that leaves nothing to draw
        if not any(True for _ in _rows_to_run(subject, select, False)):
            rows = ", ".join(p.name for p in PROPERTIES)
            raise ValueError(f"-k {select!r} names no row of the grading; the rows: {rows} (errors:CASE each)")
        if json_path and json_path != "-" and not os.access(Path(json_path).resolve().parent, os.W_OK):
            raise ValueError(f"--json {json_path!r}: its folder does not exist or cannot be written")
    except ValueError as e:
        return refuse(impl, json_path, EXIT_USAGE, str(e))
    try:
        g = grade(subject, select, single_process, strict)
    except Exception as e:  # noqa: BLE001 - the grader's own error is never a failure of the graded code
        traceback.print_exc()
        return refuse(impl, json_path, EXIT_GRADER, f"the grader itself failed (this is not a verdict on the "
                      f"implementation; please report it with the traceback above): {type(e).__name__}: {e}")
    print(render(g, details), file=sys.stderr if json_path == "-" else sys.stdout)
    if json_path == "-":  # the JSON on standard output, the screen on standard error
        print(json.dumps(as_json(g), indent=1, default=str))
    elif json_path:
        try:
            Path(json_path).write_text(json.dumps(as_json(g), indent=1, default=str) + "\n")
        except OSError as e:
            return refuse(impl, None, EXIT_USAGE, f"--json {json_path!r} could not be written ({e.strerror})")
    return g.exit_status
