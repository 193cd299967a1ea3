"""``python -m conformance.report``: regenerate conformance/CONTROLS.md.

For every negative control (``conformance/controls.py``) and every property
(``conformance/properties.py``) it runs the property under the ``ci`` profile's
budget with a fixed seed per property and no shrinking (the verdict matrix, which
``test_controls`` recomputes and compares), then shrinks the first rejecting
property's counterexample for the table (bounded in time; the last failing case
before the bound is shown).

``--check`` only computes the matrix and exits 1 if it differs from the committed
table (what ``test_controls`` does, property by property).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import pathlib
import re
import sys
import time
import zlib

import hypothesis
import hypothesis.errors
from hypothesis import Phase, seed, settings, HealthCheck

from conformance import controls as C
from conformance import profiles
from conformance import properties as P
from conformance.compare import describe_inputs
from conformance.subject import Subject

TABLE = pathlib.Path(__file__).with_name("CONTROLS.md")
SHRINK_BUDGET_S = 30.0


def property_seed(prop: P.Property) -> int:
    return zlib.crc32(prop.name.encode())


@contextlib.contextmanager
def _no_local_constants():
    """Hypothesis (6.1xx) mixes into generation the literal constants of every local module
    imported so far in the process, so a verdict depended on what ran before it (the table
    differed between the report, a single test and the whole suite). Verdicts run with that
    pool empty; generation then depends on the seed and the hypothesis version alone. (An
    internal of hypothesis: where it is missing, nothing is changed.)"""
    try:
        from hypothesis.internal.conjecture import providers as hp

        original, cache = hp._get_local_constants, hp.CONSTANTS_CACHE.cache
        empty = hp.Constants(integers=hp.SortedSet(), floats=hp.SortedSet(key=hp.float_to_int),
                             bytes=hp.SortedSet(), strings=hp.SortedSet())
    except (ImportError, AttributeError):
        yield
        return
    cache.clear()
    hp._get_local_constants = lambda: empty
    try:
        yield
    finally:
        hp._get_local_constants = original
        cache.clear()


def verdict(prop: P.Property, target: str, shrink: bool = False, budget_s: float = SHRINK_BUDGET_S):
    """(rejected?, minimal failing case or None, first line of the failure)."""
    with _no_local_constants():
        return _verdict(prop, target, shrink, budget_s)


def _verdict(prop: P.Property, target: str, shrink: bool, budget_s: float):
    subject = Subject(target)
    if subject.unsupported(prop.needs):
        return None, None, "skipped"
    record: list = []
    config = P.control_settings()
    if shrink:  # the verdict's run, then shrinking
        config = settings(config, phases=list(config.phases) + [Phase.shrink])
    test = P.build_test(prop, subject, config, record=record, budget_s=budget_s if shrink else None)
    test = seed(property_seed(prop))(test)
    try:
        test()
    except P.ShrinkBudgetSpent:
        return True, record[-1], "(shrinking stopped at the time budget)"
    except Exception as e:  # noqa: BLE001 - any failure is a rejection
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if shrink and isinstance(e, hypothesis.errors.Flaky) and record:
            first = "(shrinking stopped at the time budget)"  # the replay passed unchecked
        return True, (record[-1] if record else None), first
    if shrink and record:  # the shrink budget ran out: the check passed on the replay
        return True, record[-1], "(shrinking stopped at the time budget)"
    return False, None, ""


def matrix(controls=None, props=None, progress=None) -> dict:
    """{property name: sorted list of rejected control names}."""
    controls = controls if controls is not None else list(C.CONTROLS.values())
    props = props if props is not None else list(P.PROPERTIES)
    out = {}
    for prop in props:
        rejected = []
        for ctl in controls:
            t0 = time.monotonic()
            ok, _, _ = verdict(prop, ctl.target)
            if ok:
                rejected.append(ctl.name)
            if progress:
                progress(f"{prop.name:>16} x {ctl.name:<22} {'rejected' if ok else 'passes':>8} "
                         f"{time.monotonic() - t0:6.1f} s")
        out[prop.name] = sorted(rejected)
    return out


def read_matrix(text: str | None = None) -> tuple[dict, str]:
    """The committed matrix and the hypothesis version it was computed with."""
    text = TABLE.read_text() if text is None else text
    version = re.search(r"hypothesis (\d+(?:\.\d+)*)", text)  # not the sentence's full stop
    body = text.split("<!-- matrix -->")[1].split("<!-- /matrix -->")[0]
    lines = [ln for ln in body.strip().splitlines() if ln.startswith("|")]
    header = [h.strip() for h in lines[0].strip("|").split("|")]
    names = header[1:]
    out = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        out[cells[0].strip("`")] = sorted(n.strip("`") for n, c in zip(names, cells[1:]) if c == "x")
    return out, version.group(1) if version else ""


def render(mat: dict, examples: dict) -> str:
    ctl_names = list(C.CONTROLS)
    lines = [
        "# Negative controls",
        "",
        "<!-- Generated by `python -m conformance.report`; do not edit. -->",
        "",
        "Each control is `conformance/controls.py:baseline` with exactly one flaw; the base itself passes",
        "every property (`conformance/test_controls.py`), so each rejection below is the flaw's.",
        f"Verdicts: the `ci` profile's budget ({settings.get_profile('ci').max_examples} examples), a fixed seed per",
        f"property, no shrinking, hypothesis {hypothesis.__version__}. `test_controls` recomputes every row",
        "and compares it with this table (exactly with this hypothesis version; with another one it only",
        "requires every control to be rejected and every property to reject something).",
        "",
        "## Which property rejects which control",
        "",
        "<!-- matrix -->",
        "| property | " + " | ".join(f"`{n}`" for n in ctl_names) + " |",
        "|---|" + "---|" * len(ctl_names),
    ]
    for prop in P.PROPERTIES:
        rej = set(mat.get(prop.name, ()))
        lines.append(f"| `{prop.name}` | " + " | ".join("x" if n in rej else "." for n in ctl_names) + " |")
    lines += ["<!-- /matrix -->", "", "## Controls, and the smallest example found", "",
              "| control | flaw | rejected by | minimal example (shrunk, first rejecting property) |",
              "|---|---|---|---|"]
    for ctl in C.CONTROLS.values():
        by = [p for p, rej in mat.items() if ctl.name in rej]
        ex = examples.get(ctl.name, "")
        lines.append(f"| `{ctl.name}` | {ctl.flaw} | {', '.join(f'`{p}`' for p in by) or '**none**'} | {ex} |")
    lines += ["", "## Properties", "", "| property | equation | what must hold |", "|---|---|---|"]
    for prop in P.PROPERTIES:
        lines.append(f"| `{prop.name}` | {prop.equation} | {prop.claim} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def main(argv=None) -> int:
    profiles.load()
    ap = argparse.ArgumentParser(prog="python -m conformance.report", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed table, write nothing")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    say = None if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    mat = matrix(progress=say)
    if args.check:
        committed, version = read_matrix()
        if committed != mat:
            print("CONTROLS.md is stale: regenerate it with python -m conformance.report")
            return 1
        print("CONTROLS.md is up to date")
        return 0
    examples = {}
    for ctl in C.CONTROLS.values():
        first = next((p for p in P.PROPERTIES if ctl.name in mat[p.name]), None)
        if first is None:
            continue
        t0 = time.monotonic()
        _, case, headline = verdict(first, ctl.target, shrink=True)
        if say:
            say(f"shrunk {ctl.name} on {first.name} in {time.monotonic() - t0:.1f} s")
        if case is not None:
            examples[ctl.name] = _cell(f"`{first.name}`: {headline.split(': ', 1)[-1]}; "
                                       f"{describe_inputs(case).strip()}")
    TABLE.write_text(render(mat, examples))
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
