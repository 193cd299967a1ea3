"""``gdpo``: the project's command line (example, audit, limits, check, peers).

``gdpo`` (or ``gdpo example``) prints the oracle's exact, certified result for a built-in batch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from gdpo_tools import AUDIT_SCHEMA, version
from oracle.examples import EXAMPLES, grpo_reference
from spec import CONVENTIONS, DEFAULT_EPS, get_convention


#: conformance.subject.CALL_SHAPES, written out so that `gdpo` does not import torch to parse its
#: arguments (tests/test_cli.py asserts the two agree).
CHECK_CALL_SHAPES = ("gdpo", "trl", "verl")


#: ``gdpo audit --help``: the formats in brief; in full, with the findings and the JSON schema, in
#: docs/audit.md.
AUDIT_HELP = """\
What GDPO does with a dumped batch: per group and whitening unit, each finding with a stable code,
a sentence with its numbers and what to do about it.

Formats: .npz or .pt (a dict saved with torch.save): arrays 'rewards' (N, K) or one 'reward_<name>'
(N,) per component, 'group_ids' (N,), optional 'unit_ids' (N,), 'weights' (K,), 'names' (K,);
.jsonl: one object per sample, {"group": g, "unit": u (optional), "rewards": {"name": value, ...}
or [values]}; .csv: a header with 'group', optional 'unit', one column per component.

Exit codes: 0 audited, routine findings only; 1 warnings; 2 could not audit (the message names the
file, the column and the line or row); 3 impl.gdpo disagrees with the exact oracle (a bug to report).
Formats, findings, exit codes and the JSON schema in full: docs/audit.md."""


def _fmt(x: float) -> str:
    return f"{x:+.10f}" if x == x else "nan"


def run_example(name: str) -> int:
    from oracle import gdpo

    ex = EXAMPLES[name]
    r, g, cols = ex["rewards"], ex["group_ids"], ex["columns"]
    conv = get_convention("spec")
    res, grpo = gdpo.gdpo_advantages(r, g), grpo_reference(r, g)
    print(f"GDPO advantages of the built-in example {name!r}, exact and certified")
    print(f"convention {conv.name!r}: unbiased std, eps {conv.group_eps!r} added to the std "
          f"(Eq. 4 and Eq. 6), one whitening unit")
    head = ["i", "group"] + list(cols) + [f"z[{c}]" for c in cols] + ["c (Eq.7)", "a (Eq.6) float64",
                                                                     "a float32", "cond", "GRPO"]
    rows = [[str(i), str(g[i]), *(repr(float(v)) for v in r[i]), *(_fmt(v) for v in res.z.float64[i]),
             _fmt(res.combined.float64[i]), repr(float(res.float64[i])), repr(float(np.float32(res.float32[i]))),
             f"{res.cond[i]:.1e}", _fmt(grpo[i])] for i in range(r.shape[0])]
    widths = [max(len(h), *(len(row[j]) for row in rows)) for j, h in enumerate(head)]
    for row in [head, *rows]:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))
    print("a is the exact value correctly rounded; cond: how far a one-ulp change of every input "
          "moves a (first order).")
    print("GRPO: plain GRPO's advantage, for comparison (the rewards summed, then standardized per group, "
          "unbiased std + 1e-6; float64). GDPO standardizes each reward before the sum: rows GRPO scores alike can differ.")
    return 0


def check_impl_spec(impl: str | None, call_shape: str | None = None) -> str | None:
    """Why ``--impl`` names no callable, or none the call shape can call (one line), or None:
    resolved here, before the suite starts, on the path the suite's pytest will have (the
    working directory and this checkout's root first), so a bad spec or a function of
    another call shape stops at once instead of failing every property."""
    from conformance.subject import DEFAULT_IMPL, ImplSpecError, resolve_impl, shape_mismatch

    saved = list(sys.path)
    sys.path[:0] = [os.getcwd(), str(Path(__file__).resolve().parent.parent)]
    try:
        fn = resolve_impl(DEFAULT_IMPL if impl is None else impl)
    except ImplSpecError as e:
        return str(e)
    finally:
        sys.path[:] = saved
    why = shape_mismatch(fn, call_shape or "gdpo")
    return None if why is None else f"--impl {impl or DEFAULT_IMPL!r}: {why}"


def run_check(a: argparse.Namespace) -> int:
    """``gdpo check``: the grading (``conformance.grading``) in this process; its exit code (0
    conforms, 1 findings, 3 the grader's own error), or 2 (a usage error, as argparse's) where
    ``--impl`` names no callable of the call shape, the convention is unknown or a declaration is
    malformed. ``--deep`` and ``--self-tests`` run the suite under pytest instead (hypothesis's long
    hunt; the suite's self-tests), with pytest's report."""
    why = check_impl_spec(a.impl, a.call_shape)
    try:
        if why is None and a.convention is not None:
            get_convention(a.convention)
        if why is None and a.domain:
            from conformance.subject import Subject, parse_domain

            sys.path[:0] = [os.getcwd()]
            Subject(a.impl or "impl.gdpo:gdpo_advantages", a.call_shape or "gdpo",
                    domain=parse_domain(a.domain)).context()
    except ValueError as e:
        why = str(e)
    if why is not None:
        from conformance.grading import refuse

        return refuse(a.impl, a.json_path, 2, why)
    if a.strict_errors:
        os.environ["GDPO_STRICT_ERRORS"] = "1"  # conformance.judge.STRICT_ENV
    if a.deep or a.self_tests:
        return _pytest_check(a)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the user's package, graded from their repository
    from conformance import grading

    return grading.main(a.impl, a.call_shape, a.convention, a.select, a.single_process, a.json_path, a.details,
                        a.strict, a.domain)


def pytest_command(a: argparse.Namespace) -> list[str]:
    """The suite under pytest: ``--deep`` (hypothesis's long hunt, with an example database), or
    ``--self-tests``: the suite's tests of itself, its negative controls (they grade the suite, so
    they take no implementation)."""
    import conformance
    from conformance import plugins

    here = Path(conformance.__file__).resolve().parent
    paths = [str(here / name) for name in plugins.SELF_TESTS] if a.self_tests else [str(here)]
    cmd = [sys.executable, "-m", "pytest", *paths, "-q", "-p", "no:cacheprovider", "-p", "_hypothesis_pytestplugin",
           "-p", "conformance.plugins", "--rootdir", str(here.parent)]
    graded = () if a.self_tests else (("--impl", a.impl), ("--convention", a.convention),
                                       ("--call-shape", a.call_shape), *(("--domain", item) for item in a.domain))
    for flag, value in (*graded, ("-k", _pytest_k(a.select))):
        if value is not None:
            cmd += [flag, value]
    flags = (("--single-process", a.single_process), ("--gdpo-strict", a.strict), ("--strict-errors", a.strict_errors))
    cmd += [flag for flag, on in flags if on]
    cmd += [] if a.self_tests else [f"--ignore={here / name}" for name in plugins.SELF_TESTS]
    return cmd + (["--tb=short"] if a.details else ["--tb=line"])


def _pytest_k(select: str | None) -> str | None:
    """``-k WORDS`` (comma-separated row names, ``errors:CASE``) as a pytest ``-k`` expression: the
    words joined by ``or``, an error row by its case (the test ``test_error_case[CASE]``)."""
    if select is None:
        return None
    words = [w.strip() for w in select.split(",") if w.strip()]
    return " or ".join(w.split(":", 1)[1] if w.startswith("errors:") else w for w in words)


def _pytest_check(a: argparse.Namespace) -> int:
    from conformance import profiles

    if a.json_path is not None:
        from conformance.grading import refuse

        return refuse(a.impl, a.json_path, 2, "--json is written by a grading, not under --deep or --self-tests "
                      "(pytest's report instead)")
    cmd = pytest_command(a)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", profiles.ENV: "deep" if a.deep else "ci"}
    print(f"running ({profiles.ENV}={env[profiles.ENV]}): " + " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=env)


def _weight(text: str) -> float:
    """A --weights value; a file's name there means the file came after --weights."""
    try:
        return float(text)
    except ValueError:
        hint = ": it names a file; give the file before --weights" if Path(text).exists() else ""
        raise argparse.ArgumentTypeError(f"invalid weight {text!r}{hint}") from None


def main(argv: list[str] | None = None) -> int:
    """The ``gdpo`` command. A reader that stops early (``gdpo check | head``) ends it quietly with
    the shell's status for a closed pipe (141), not a traceback."""
    try:
        return _command(argv)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # for the interpreter's last flush
        return 141


def build_parser() -> argparse.ArgumentParser:
    """The ``gdpo`` command's parser (but ``limits`` and ``peers``, which parse their own)."""
    parser = argparse.ArgumentParser(prog="gdpo", description="GDPO numerical reference")
    ours = version("gdpo-spec", "unknown (not installed)")  # a checkout that was never installed: unknown
    parser.add_argument("--version", action="version", version=f"%(prog)s {ours}")
    sub = parser.add_subparsers(dest="command")
    p_ex = sub.add_parser("example", help="exact result for a built-in example batch (the default)")
    p_ex.add_argument("name", nargs="?", default="two_group", choices=sorted(EXAMPLES),
                      help="two_group (the default): two groups of 2 that GRPO scores alike and GDPO "
                           "does not; correctness_length: one group of 4 where the raw sum ranks a long "
                           "wrong answer first")
    p_au = sub.add_parser("audit", help="what GDPO does with a dumped batch (.npz, .pt, .jsonl, .csv)",
                          # the file first: after --weights it would be read as one more weight
                          usage="gdpo audit [file] [--weights W [W ...]] [--eps EPS] [--missing {refuse,unscored}] "
                                "[--json] [--exact] [--peers]",
                          description=AUDIT_HELP,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    p_au.add_argument("file", nargs="?", help="the batch (default: a built-in example batch)")
    p_au.add_argument("--json", action="store_true", help="machine-readable report")
    p_au.add_argument("--weights", type=_weight, nargs="+", metavar="W",
                      help="one weight per reward component (give the file before --weights)")
    p_au.add_argument("--eps", type=float, default=None, help="eps of Eq. 4 and Eq. 6 (default: the spec's)")
    p_au.add_argument("--missing", choices=("refuse", "unscored"), default="refuse",
                      help="a NaN reward (or a masked one): refused (the default), or a reward its function did not "
                           "score, as impl.gdpo's missing=\"unscored\" reads it (spec/gdpo.md section 2)")
    p_au.add_argument("--exact", action="store_true", default=None,
                      help="the exact oracle on every group, also beyond 20,000 samples (slow: minutes per 100,000; "
                           "with --peers, each peer convention exactly too)")
    p_au.add_argument("--peers", action="store_true", default=None,
                      help="compute the peer conventions, also beyond 20,000 samples (their float formulas)")
    # limits and peers: listed here for gdpo --help; _command hands them to their own parsers
    sub.add_parser("limits", add_help=False,
                          help="measure the known-limit tables and plots into --out DIR (see gdpo limits --help)")
    p_ck = sub.add_parser("check", help="run the conformance suite against impl.gdpo or another implementation",
                          description="Grade a GDPO implementation against the specification: at its own precision, "
                                      "its formula named where it differs from the paper's, one finding per cause. "
                                      "Exit codes: 0 conforms, 1 findings, 2 a usage error or nothing graded, 3 the "
                                      "grader's own error. In full: docs/grading.md.")
    p_ck.add_argument("--impl", default=None, help="package.module:function to grade (default impl.gdpo)")
    p_ck.add_argument("--convention", default=None,
                      help="convention the implementation means: spec (the default), or a peer's preset: "
                           f"{', '.join(c for c in CONVENTIONS if c != 'spec')} (docs/grading.md)")
    p_ck.add_argument("--call-shape", default=None, choices=CHECK_CALL_SHAPES,
                      help="how to call it: gdpo (impl.gdpo's signature, the default), trl (rewards, "
                           "num_generations, reward_weights) or verl (docs/grading.md, 'Call shapes')")
    p_ck.add_argument("-k", dest="select", default=None,
                      help="only the rows whose names contain one of these comma-separated words (plain, errors:nan)")
    p_ck.add_argument("--single-process", action="store_true",
                      help="the implementation runs in one process (no process_group): deselect the multi-process "
                           "properties, reported as not graded")
    p_ck.add_argument("--json", dest="json_path", default=None, metavar="PATH",
                      help="also write the grading as JSON to PATH (the findings, each with its example and repro "
                           "line; per property: verdict, reason, cases, failed, categories, notes, seconds); "
                           "-: to standard output, the screen to standard error")
    p_ck.add_argument("--details", action="store_true",
                      help="print each finding's full text after the summary table (default: the table, and one "
                           "line, the worst output and a repro line per failure)")
    p_ck.add_argument("--deep", action="store_true",
                      help="the long hunt: hypothesis profile 'deep' (10,000 examples per property, a minute of "
                           "shrinking, an example database in .hypothesis/) instead of 'grade'")
    p_ck.add_argument("--self-tests", action="store_true",
                      help="run the suite's self-tests instead, its negative controls (conformance/test_controls.py: "
                           "they grade the suite, not the implementation; minutes)")
    p_ck.add_argument("--domain", action="append", default=[], metavar="KEY=VALUE",
                      help="declare your implementation's domain without changing it (repeatable; docs/grading.md): "
                           "limits min_columns, max_columns, group_sizes (4,8 or 4+), max_abs_reward, max_abs_weight, "
                           "equal_groups=true, input_dtypes, out_dtypes, labels=false, units=false, eps=false; "
                           "what it does on purpose: validated=CASE,... (checks made before the call), "
                           "int_rewards=true, certified=true. The search stays inside it and the report states it")
    p_ck.add_argument("--strict-errors", action="store_true",
                      help="the strict error contract: a refusal must raise the spec.errors class it names (default: "
                           "a clear refusal of another class passes, reported as wrong_class)")
    p_ck.add_argument("--strict", action="store_true",
                      help="hold the code to the specification's own error model (the prescribed float64 algorithm: "
                           "exact collapse and structural zeros bit for bit) instead of its own precision")
    sub.add_parser("peers", help="grade every installed peer and write the generated peers page "
                                        "(spec/generated/peers.md; see gdpo peers --help)", add_help=False)
    return parser


def _command(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["limits"], ["peers"]):  # its own parser takes every option, --help included
        own = {"limits": "gdpo_tools.limits.generate", "peers": "gdpo_tools.peers_report"}[argv[0]]
        return importlib.import_module(own).main(argv[1:], prog=f"gdpo {argv[0]}")

    args = build_parser().parse_args(argv)
    if args.command == "check":
        return run_check(args)
    if args.command == "audit":
        try:
            from gdpo_tools import audit
        except Exception as e:  # noqa: BLE001 -- a broken install is "could not audit" (exit 2), not "warnings"
            said = f"could not audit: importing it failed ({type(e).__name__}: {e})"
            if args.json:  # gdpo_tools.audit.report.error_json's fields
                print(json.dumps({"schema": AUDIT_SCHEMA, "source": args.file, "status": 2,
                                  "status_text": "could not audit", "error": {
                                      "code": "internal-error", "class": type(e).__name__, "spec_classes": [],
                                      "message": said}}))
            print(f"gdpo audit: {said}", file=sys.stderr)
            return 2
        return audit.main(args.file, weights=args.weights, as_json=args.json, exact=args.exact, peers=args.peers,
                          eps=DEFAULT_EPS if args.eps is None else args.eps, missing=args.missing)
    if args.command in (None, "example"):
        return run_example(getattr(args, "name", "two_group"))
    raise AssertionError(f"unknown command {args.command!r}")  # argparse refuses any other


if __name__ == "__main__":
    raise SystemExit(main())
