"""The audit's two outputs: the text a person reads (a summary by finding, what to do, the
groups with warnings, the terms defined) and strict JSON for machines, a refusal included."""

from __future__ import annotations

import json
import math
import os
import sys
import traceback

from gdpo_tools.audit.findings import KINDS, ROUTINE, TERMS
from gdpo_tools.audit.read import clip, example_batch, read_batch
from gdpo_tools.audit.run import NOT_AUDITED, SCHEMA, STATUS, Progress, audit
from spec import DEFAULT_EPS, GDPOError
from spec.errors import ERROR_CLASSES

#: The text report lists every group up to this many, beyond it only groups with warnings.
LIST_ALL_GROUPS = 50


def render(report: dict) -> str:
    """The text report."""
    groups = report["groups"]
    groups_total = f"{report['groups_total']:,} group" + ("" if report["groups_total"] == 1 else "s")
    lines = [f"GDPO audit of {report['source']}: {report['samples']:,} samples in {groups_total} "
             f"and {report['units_total']} whitening unit(s); components {', '.join(report['components'])}; "
             f"weights {report['weights']}; eps {report['eps']}",
             f"checked with: {report['method']['text']}"]
    lines.append(f"groups: {report['groups_total']:,}; with warnings {report['groups_with_warnings']:,}; with routine "
                 f"findings only {report['groups_with_routine_findings_only']:,}; without signal "
                 f"{report['groups_without_signal']:,}")
    used = []
    if report["counts"]:
        lines += ["", "findings (code, how many, what it means, what to do):"]
        for code in sorted(report["counts"], key=list(KINDS).index):
            kind = KINDS[code]
            lines.append(f"  {code} ({kind.severity}): {report['counts'][code]:,} {kind.scope}(s): {kind.title}")
            lines.append(f"      what to do: {kind.advice}")
            used += [t for t in kind.terms if t not in used]
    shown = groups if len(groups) <= LIST_ALL_GROUPS else [
        g for g in groups if any(f["severity"] != ROUTINE for f in g["findings"])]
    if shown:
        lines += ["", f"{'group':>8} {'size':>5} {'signal':>6}  findings"]
        for g in shown:
            said = "; ".join(f"[{f['code']}] {f['message']}" for f in g["findings"]) or "-"
            lines.append(f"{clip(str(g['group']), 40):>8} {g['size']:>5} {('yes' if g['signal'] else 'NO'):>6}  {said}")
    if len(shown) < report["groups_total"]:
        where = ("--json lists them" if report["groups_listed"] == "all" else
                 "counted in the findings above; --json lists only the groups with warnings too")
        lines.append(f"({report['groups_total'] - len(shown):,} groups without warnings not listed: more than "
                     f"{LIST_ALL_GROUPS} groups; {where})")
    lines.append("")
    for u in report["units"][:LIST_ALL_GROUPS]:
        moves = ("not checked by the oracle" if u["max_cond"] is None else
                 ("one ulp of input moves an advantage by {:.2g} (first order)" if u["max_cond_sharp"] else
                  "one ulp of input may move an advantage by up to {:.2g} (a bound)").format(u["max_cond"]))
        said = "; ".join(f"[{f['code']}] {f['message']}" for f in u["findings"])
        lines.append(f"unit {u['unit']}: {u['size']:,} samples, {moves}" + (f"; {said}" if said else ""))
    if len(report["units"]) > LIST_ALL_GROUPS:
        lines.append(f"({len(report['units']) - LIST_ALL_GROUPS} more units: --json lists them)")
    iv = report["impl_vs_oracle"]
    if iv["max_error_over_bound"] is not None:
        lines.append(f"impl.gdpo against the exact oracle: worst error {iv['max_error_over_bound']:.3g} of the "
                     f"spec's error bound, over {iv['groups_checked']:,} groups checked")
        used += [] if "error bound" in used else ["error bound"]
    if report["peers"]:
        lines.append("peer conventions, largest change of an advantage against the spec (a convention "
                     "difference, not a defect):")
        for name, p in report["peers"].items():
            val = "n/a" if p["max_abs_difference"] is None else f"{p['max_abs_difference']:.3g}"
            lines.append(f"  {name:<17} {val:>9}  {p['why']}" + (f"; {p['note']}" if p["note"] else ""))
    else:
        lines.append("peer conventions: not computed (batches over 20,000 samples; --peers computes them from their "
                     "float formulas)")
    if used:
        lines += ["", "terms:"] + [f"  {t}: {TERMS[t]}" for t in used]
    lines.append(f"status: {report['status_text']} (exit {report['status']})")
    return "\n".join(lines)


def error_json(source: str | None, e: BaseException, message: str) -> dict:
    """Why the batch could not be audited, as JSON: the same exit code as the text's; the code
    says whose fault ("malformed-input": the file's; "internal-error": the audit's), the classes
    are for a program to test."""
    spec_classes = [name for name, cls in ERROR_CLASSES.items() if isinstance(e, cls)]
    return {"schema": SCHEMA, "source": source, "status": NOT_AUDITED, "status_text": STATUS[NOT_AUDITED],
            "error": {"code": "malformed-input" if isinstance(e, GDPOError) else "internal-error",
                      "class": type(e).__name__, "spec_classes": spec_classes, "message": message}}


def main(file: str | None, weights=None, as_json: bool = False, eps: float = DEFAULT_EPS, out=None,
         exact: bool | None = None, peers: bool | None = None, missing: str = "refuse") -> int:
    """``gdpo audit``: the report of ``file`` (None: the built-in example) on ``out``; the exit
    code. Whatever fails, malformed input or the audit itself (MemoryError included), exits
    NOT_AUDITED with one line naming it (and a JSON error object under ``as_json``), never
    with a code that says the batch was audited."""
    out = out if out is not None else sys.stdout
    batch = None
    try:
        bar = Progress(_big(file))
        if file:
            bar.start(f"reading {file}")
            batch = read_batch(file, progress=bar.update)
        else:
            batch = example_batch()
        report = audit(batch, weights=weights, eps=eps, exact=exact, peers=peers, bar=bar, missing=missing)
        text = json.dumps(_strict_json(report), indent=2, allow_nan=False) if as_json else render(report)
    except Exception as e:  # noqa: BLE001 -- the exit code must say "not audited", whatever failed
        source = batch.source if batch is not None else (str(file) if file else "built-in example")
        if isinstance(e, GDPOError):
            said = str(e)
        else:
            traceback.print_exc(file=sys.stderr)  # for the bug report
            said = (f"gdpo audit failed, an internal error ({type(e).__name__}: {clip(str(e)) or 'no message'}); "
                    "report it with the traceback above")
        if not said.startswith(f"{source}:"):  # every message names the file
            said = f"{source}: {said}"
        if as_json:
            print(json.dumps(error_json(source, e, said), indent=2), file=out)
        print(f"gdpo audit: {said}", file=sys.stderr)
        return NOT_AUDITED
    print(text, file=out)
    return report["status"]


def _big(file) -> bool:
    """Show progress for files over 2 MB (tens of thousands of rows and up)."""
    try:
        return bool(file) and os.path.getsize(file) > 2_000_000
    except OSError:
        return False


def _strict_json(x):
    """The report with every non-finite float as the string "inf", "-inf" or "nan": JSON has no
    such numbers, and json.dumps would write Infinity, which strict parsers refuse."""
    if isinstance(x, dict):
        return {k: _strict_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict_json(v) for v in x]
    return str(x) if isinstance(x, float) and not math.isfinite(x) else x
