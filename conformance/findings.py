"""Findings: a grading's failures grouped by root cause, so that one defect is reported once.

A property that fails lists, in a drawn-first run (``conformance/runner.py``), every case that
failed and its category. Five properties of one float32 implementation may fail on one cause
(its squared deviations overflow past about 1.8e19); a second defect (a clip, a wrong eps) fails
cases of ordinary magnitude in another category. A :class:`Finding` is one such cause:

* the **regime** where it shows, decided by the judge from the failing case itself: a bad input
  (an error case of the contract), several ranks, *extreme magnitudes* (the failure goes away when
  the case's rewards, or its weights, are scaled down toward ordinary values: the threshold is
  the smallest magnitude at which it still failed), or *ordinary magnitudes* (it still fails at
  |r| <= 1e4: no overflow explains it);
* the category (``conformance/verdicts.py``);
* the properties where it showed, and the smallest example (the judge's reduction, in decimal).

Findings are keyed on (category, regime, and for a formula its differences from the paper,
``conformance/formulas.py``): a maintainer fixes one per row.
"""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal

import numpy as np

from conformance.cases import Case, DistCase
from conformance.compare import decimal
from conformance.judge import ConformanceFailure
from conformance.verdicts import ORDINARY, label
from spec.error_model import round_to

#: Checks one threshold probe may spend (each a power of ten down).
PROBE_CALLS = 40


def regime(check, case, category) -> tuple[str, float | None]:
    """(regime, threshold) of a failure of ``case`` in ``category`` (:func:`probe`)."""
    return probe(check, case, category)[:2]


def probe(check, case, category) -> tuple[str, float | None, object]:
    """(regime, threshold, example) of a failure of ``case`` in ``category``: ``bad input``,
    ``several ranks``, ``extreme magnitudes`` with the smallest magnitude (a power of ten) that
    still failed and the case scaled down to it, or ``ordinary magnitudes``."""
    if isinstance(case, tuple) or (isinstance(case, Case) and (case.note.startswith("error:") or case.variant)):
        return "bad input", None, case
    if isinstance(case, DistCase):
        return "several ranks", None, case
    if not isinstance(case, Case) or not case.rewards:
        return "ordinary magnitudes", None, case
    if getattr(case, "missing", "") in ("", "refuse") and not all(
            math.isfinite(v) for row in case.rewards for v in row):
        return "bad input", None, case  # a value property's case that rounded to inf in its dtype
    r = max((abs(v) for row in case.rewards for v in row if math.isfinite(v)), default=0.0)
    w = max((abs(v) for v in case.weights or () if math.isfinite(v)), default=1.0)
    if max(r, w) <= ORDINARY:
        return "ordinary magnitudes", None, case
    scale_weights = w > ORDINARY and r <= ORDINARY
    top = w if scale_weights else r
    smallest, example = top, case
    for j in range(1, PROBE_CALLS + 1):
        factor = 10.0 ** -j
        scaled = _scaled(case, j, scale_weights)
        if scaled is None:
            break
        if not _fails(check, scaled, category):
            return "extreme magnitudes", _magnitude(smallest), example
        smallest, example = top * factor, scaled
        if smallest <= ORDINARY:
            return "ordinary magnitudes", None, case
    return "extreme magnitudes", _magnitude(smallest), example


def _magnitude(x: float) -> float:
    """A threshold as a power of ten (down), the way it is read."""
    return 10.0 ** math.floor(math.log10(x)) if x > 0 else x


def _shift(v: float, j: int, dtype: str) -> float:
    """``v`` divided by 10^j in decimal (its shortest decimal in ``dtype``, the exponent moved),
    so that float32's 1e+38 becomes float32's 1e+19, not 1e38's float32 times 1e-19."""
    if v == 0.0 or not math.isfinite(v):
        return v
    return float(Decimal(decimal(v, dtype)).scaleb(-j))


def _scaled(case: Case, j: int, weights: bool) -> Case | None:
    """The case with its rewards (or weights) divided by 10^j, rounded into their dtype; None
    where that loses every value (an underflow) or cannot be held."""
    if weights:
        w = tuple(_shift(float(v), j, "float64") for v in case.weights)
        return dataclasses.replace(case, weights=w) if any(w) else None
    if case.dtype not in ("float64", "float32", "float16", "bfloat16"):
        return None
    vals = np.array([[_shift(v, j, case.dtype) for v in row] for row in case.rewards], dtype=np.float64)
    held = round_to(vals, case.dtype)
    if not np.all(np.isfinite(held)) or not np.any(held):
        return None
    return dataclasses.replace(case, rewards=tuple(tuple(float(v) for v in row) for row in held))


def _fails(check, case, category) -> bool:
    try:
        check(case)
    except ConformanceFailure as exc:
        return exc.category == category
    except Exception:  # noqa: BLE001 - another failure is another finding
        return False
    return False


def describe(case, limit: int = 8) -> str:
    """A case in decimal, short: ``[[1e+20], [0], [0], [1]]`` and what else it sets. Equal rows in
    a row are one entry, ``[0] (x6)``, so the rows that differ show among the first ``limit``
    entries (a case of 8 zeros, then 1e+20, no longer reads as zeros only)."""
    if isinstance(case, tuple):
        case = case[0]
    if isinstance(case, DistCase):
        return f"{case.world} ranks: " + "; ".join(describe(s, limit) for s in case.shards)
    runs: list[list] = []  # rows in order, a run of equal rows as one entry: [text, count]
    for row in case.rewards:
        t = "[" + ", ".join(decimal(v, case.dtype) for v in row) + "]"
        if runs and runs[-1][0] == t:
            runs[-1][1] += 1
        else:
            runs.append([t, 1])
    shown = runs[:limit]
    rest = case.n - sum(c for _, c in shown)
    more = f", ... ({rest} more rows)" if rest else ""
    text = "[" + ", ".join(t if c == 1 else f"{t} (x{c})" for t, c in shown) + more + "]"
    extras = [case.dtype]
    if case.group_ids is not None:
        extras.append(f"group_ids {list(case.group_ids)}")
    elif case.group_size is not None and case.group_size != case.n:
        extras.append(f"groups of {case.group_size}")
    if case.weights is not None:
        extras.append("weights [" + ", ".join(decimal(w) for w in case.weights) + "]")
    if case.segment_sizes is not None:
        extras.append(f"units {list(case.segment_sizes)}")
    if case.eps is not None:
        extras.append(f"eps {decimal(case.eps)}")
    if case.note.startswith("error:"):
        extras.append(case.note)
    return f"`{text}` ({', '.join(extras)})"


def size(case) -> tuple:
    """How big an example reads (rows x columns, then its text): the smaller is shown."""
    if isinstance(case, tuple):
        case = case[0]
    if isinstance(case, DistCase):
        return (sum(s.n for s in case.shards), 0, len(case.dumps()))
    return (case.n * max(case.k, 1), case.k, len(case.dumps()))


def record(prop: str, category, case, check, repro: str | None = None, formula: str | None = None,
           formula_alternatives=()) -> dict:
    """One property's failure of one category, as the plugin carries it (JSON-able). ``repro``:
    the replay line of ``case``; where the example shown is another case (scaled down to the
    threshold), the line replays that example instead. ``formula_alternatives``: the other
    variants of the catalogue that reproduce the case's output as well as ``formula`` does."""
    reg, threshold, example = probe(check, case, category)
    if repro and example is not case and " --case " in repro:
        import shlex

        repro = repro.rsplit(" --case ", 1)[0] + " --case " + shlex.quote(example.dumps())
    return {"category": str(category), "regime": reg, "threshold": threshold, "property": prop,
            "example": describe(example), "size": list(size(example)), "repro": repro, "formula": formula,
            "formula_alternatives": list(formula_alternatives) if formula else []}


def group(records: list[dict]) -> list[dict]:
    """The findings of a grading: its failures' records merged by (category, regime, and for a
    formula the differences diagnosed), each with the properties where it showed, the smallest
    threshold and the smallest example. A formula whose case several variants reproduce alike is
    one guess among them: where another record names one of those variants with fewer alike (its
    case tells more apart), the record joins that formula's finding (one cause, not one finding
    per guess)."""
    named: dict = {}  # formula -> the fewest alternatives any record naming it has
    for r in records:
        if r.get("formula"):
            named[r["formula"]] = min(named.get(r["formula"], 1 << 30), len(r.get("formula_alternatives") or ()))

    def formula_of(r):
        f = r.get("formula")
        if not f:
            return f
        choices = [a for a in (f, *(r.get("formula_alternatives") or ())) if a in named]
        return min(choices, key=lambda a: (named[a], a != f))

    out: dict = {}
    for r in records:
        formula = formula_of(r)
        key = (r["category"], r["regime"], formula)
        alternatives = list(r.get("formula_alternatives") or ()) if formula == r.get("formula") else None
        f = out.setdefault(key, {"category": r["category"], "regime": r["regime"], "threshold": None,
                                 "properties": [], "example": r["example"], "size": r["size"],
                                 "repro": r.get("repro"), "formula": formula, "formula_alternatives": None})
        if alternatives is not None and (f["formula_alternatives"] is None
                                         or len(alternatives) < len(f["formula_alternatives"])):
            f["formula_alternatives"] = alternatives  # the record that tells the most apart
        if r["property"] not in f["properties"]:
            f["properties"].append(r["property"])
        if r["threshold"] is not None and (f["threshold"] is None or r["threshold"] < f["threshold"]):
            f["threshold"] = r["threshold"]
        # the example: the smallest of the records that name the finding's formula themselves
        # (a record that joined it names another guess on its own case), else the smallest
        own = formula == r.get("formula")
        if (own, [-x for x in r["size"]]) > (f.get("_own", False), [-x for x in f["size"]]):
            f["example"], f["size"], f["repro"], f["_own"] = r["example"], r["size"], r.get("repro"), own
    for f in out.values():
        f.pop("_own", None)
        if f["formula_alternatives"] is None:
            f["formula_alternatives"] = []
    return list(out.values())


def cause(f: dict) -> str:
    """The cause in words: the category's label and where it shows, with its threshold."""
    where = f["regime"]
    if f["threshold"] is not None:
        where += f" (from |value| of about {f['threshold']:.0e})"
    formula, alike = f.get("formula"), f.get("formula_alternatives") or ()
    if formula and alike:
        formula += (f"; its cases cannot tell it from {alike[0]}" if len(alike) == 1 else
                    f"; its cases cannot tell it from {len(alike)} other variants, among them {alike[0]} "
                    f"(its replay line lists them)")
    what = label(f["category"]) + (f" ({formula})" if formula else "")
    return f"{what}, at {where}" if f["regime"] != "bad input" else what
