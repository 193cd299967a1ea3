"""Why an output the judge (:mod:`conformance.judge`) found outside the error model is off, for the
finding's key and text: a formula the probes or the catalogue's diagnosis (:mod:`conformance.diagnosis`)
reproduce it with, a cancellation that shifting each group to near 0 removes, a group column whose
squared deviations overflow (its z silently 0), or the convention the code declares it computes.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from conformance import diagnosis
from conformance.cases import Case, DistCase, expected
from conformance.compare import distance, native_allowed
from conformance.subject import Outcome, Subject, verl_lengths
from conformance import verdicts
from conformance.verdicts import Category
from spec import error_model as em
from spec.conventions import differences, get_convention


def explain(subject: Subject, case, out: Outcome, conv, category):
    """Why the advantages of ``case`` are off: ``(category, formula, cause, line, alternatives)``
    (docs/grading.md, "Formula or precision"; a narrower format the probes showed is ``precision``)."""
    prof = getattr(subject, "profile", None)
    u = max(diagnosis.unit_roundoff_of(case.out_dtype), conv.unit_roundoff)
    finite = out.values is not None and bool(np.all(np.isfinite(out.values)))
    ordinary = verdicts.ordinary(case) and finite  # no overflow: another formula or arithmetic
    if prof is not None and prof.formula and out.values is not None:
        if not prof.named and (category == Category.PRECISION or ordinary):
            return Category.FORMULA, prof.formula, None, f"formula: {prof.formula} (as the probes show)", ()
        v = prof.diagnosis.variant
        if prof.named and _reproduced(case, out.values, v, conv, subject.token_counts(case)):
            return (Category.FORMULA, prof.formula, None,
                    f"formula: {prof.formula} (reproduces this case and the probes)", prof.diagnosis.alternatives)
    if prof is not None and prof.narrow and finite and category in (Category.PRECISION, Category.SILENT_ZERO):
        return Category.PRECISION, None, prof.narrow, f"precision: {prof.narrow}", ()
    if category != Category.PRECISION:  # a zero or a NaN: the formula explains it, or it stands
        return category, None, None, "", ()
    line = ""
    if ordinary:
        try:
            d = diagnosis.diagnose(case, out.values, token_counts=subject.token_counts(case), unit_roundoff=u)
        except Exception as exc:  # noqa: BLE001 - no diagnosis is no verdict: the failure stands as it is
            return category, None, None, f"formula: not diagnosed ({type(exc).__name__}: {exc})", ()
        line = diagnosis.describe(d)
        own = conv.name != "spec" and conv.name in d.presets
        if d.matched and not d.no_difference and not own and (  # and it reproduces every probe too
                prof is None or all(diagnosis.reproduces(c, o, d.variant, u) for c, o in prof.outputs)):
            alternatives = tuple("; ".join(a) or "no difference from the paper" for a in d.alternatives)
            if prof is not None and prof.named and prof.formula:  # the probes cannot tell the two apart: theirs
                return Category.FORMULA, prof.formula, None, line, ("; ".join(d.differences),) + alternatives
            return Category.FORMULA, "; ".join(d.differences), None, line, alternatives
    cause = _cancellation(subject, case, conv) if finite else None
    if cause:
        return Category.PRECISION, None, cause, f"precision: {cause}", ()
    if ordinary and beyond_any_rounding(out.values, case, conv, subject.token_counts(case)):
        return Category.FORMULA, BEYOND_ROUNDING, None, f"formula: {BEYOND_ROUNDING}", ()
    return category, None, None, line, ()


#: a formula no variant of the catalogue reproduces, off by more than any arithmetic rounds
BEYOND_ROUNDING = ("off the paper's formula on some inputs, by more than rounding in any arithmetic gives "
                   "(bfloat16's included); no formula of the catalogue reproduces it")


def beyond_any_rounding(values: np.ndarray, case, conv, token_counts=None) -> bool:
    """Are ``values`` outside the error model of ``conv``'s own algorithm even at bfloat16's unit
    roundoff (2^-8, the coarsest arithmetic a code runs in), the case's conditioning included?"""
    try:
        exp = expected(case, conv.name, token_counts)
    except Exception:  # noqa: BLE001 - no verdict on the explanation
        return False
    return exp.error is None and exp.result is not None and \
        _holds_under(values, case, conv, token_counts, 2.0 ** -em.FORMATS["bfloat16"][0]) is None


def _reproduced(case, values, variant, conv, token_counts=None) -> bool:
    """Does the catalogue's ``variant`` reproduce ``values`` within the precision judged at?"""
    try:
        return diagnosis.reproduces(case, values, variant, max(diagnosis.unit_roundoff_of(case.out_dtype),
                                                              conv.unit_roundoff), token_counts)
    except Exception:  # noqa: BLE001 - no verdict on the explanation
        return False


def _cancellation(subject: Subject, case, conv) -> str | None:
    """Cancellation at Eq. 4, where the same case with each group column shifted by its lower
    median (Eq. 4 is shift-invariant) is within the error model of its own exact values."""
    if not isinstance(case, Case) or not case.rewards or case.dtype not in ("float64", "float32", "float16",
                                                                              "bfloat16"):
        return None
    r, labels = case.rewards_array(), case.labels()
    shifted = r.copy()
    with np.errstate(over="ignore"):  # a difference beyond the range: no such case (refused below)
        for g in np.unique(labels):
            m = labels == g
            shifted[m] = r[m] - np.sort(r[m], axis=0)[(int(m.sum()) - 1) // 2]  # its lower median, a value of it
    shifted = em.round_to(shifted, case.dtype)  # a case of its own, judged against its own exact values
    if np.array_equal(shifted, r) or not np.all(np.isfinite(shifted)) or not np.any(shifted):
        return None  # (all zeros: every group constant, nothing left to tell a grouping from cancellation)
    near = dataclasses.replace(case, rewards=tuple(tuple(float(v) for v in row) for row in shifted))
    again = subject.outcome(subject.call, near)
    if not again.ok or again.values is None or again.values.shape != (near.n,):
        return None
    prof = getattr(subject, "profile", None)
    if _holds_under(again.values, near, conv, subject.token_counts(near)) is None and not (
            prof is not None and prof.named and not prof.diagnosis.no_difference
            and _reproduced(near, again.values, prof.diagnosis.variant, conv)):
        return None
    grows = ("the error grows with the rewards' offset from 0 (the same batch shifted to near 0 is within the "
             "model)")
    if prof is not None and prof.named and prof.diagnosis.variant.weights == "before":
        return f"cancellation in the weighted sum its formula takes before Eq. 4: {grows}"
    return f"cancellation at Eq. 4: {grows}: a one-pass variance E[x^2] - E[x]^2, or a variance of uncentred values"


def _holds_under(values: np.ndarray, case, conv, token_counts=None, unit_roundoff=None):
    """The oracle's result of ``case`` under ``conv`` where ``values`` are within that convention's own
    error model (:func:`native_allowed`); None where it is not or the oracle cannot judge it."""
    try:
        exp = expected(case, conv, token_counts)
    except Exception:  # noqa: BLE001 - no verdict on the explanation
        return None
    if exp.error is not None or exp.result is None:
        return None
    res = exp.result
    out_dtype = (case.shards[0] if isinstance(case, DistCase) else case).out_dtype
    v = distance(values, res.float64, native_allowed(res, out_dtype, conv, unit_roundoff), res.cond, out_dtype,
                 native_dtype=conv.native_dtype)
    return res if v.ok else None


def overflowed_columns(subject: Subject, case, values: np.ndarray, conv) -> str | None:
    """A silent zero hidden in other values: where ``values`` (a DistCase's in global row order)
    are those of the batch with its group columns beyond sqrt(largest finite) / n set to 0 (their
    std inf, their z silently 0), say so."""
    shards = case.shards if isinstance(case, DistCase) else (case,)
    if not isinstance(case, (Case, DistCase)) or not any(s.rewards for s in shards):
        return None
    limit = math.sqrt(em.largest_finite(conv.native_dtype))
    hit, zeroed = [], []
    for rank, shard in enumerate(shards):
        r, labels = shard.rewards_array(), shard.labels()
        z = r.copy()
        for g in np.unique(labels) if shard.rewards else ():
            m = labels == g
            for k in range(r.shape[1]):
                col = r[m, k]
                if np.all(np.isfinite(col)) and np.max(np.abs(col)) > limit / max(int(m.sum()), 1):
                    z[m, k] = 0.0
                    where = f"rank {rank} " if isinstance(case, DistCase) else ""
                    hit.append(f"{where}group {int(g) if float(g).is_integer() else g} column {k}")
        zeroed.append(dataclasses.replace(shard, rewards=tuple(tuple(float(v) for v in row) for row in z)))
    if not hit:
        return None
    alt = dataclasses.replace(case, shards=tuple(zeroed)) if isinstance(case, DistCase) else zeroed[0]
    if _holds_under(values, alt, conv, None if isinstance(case, DistCase) else subject.token_counts(alt)) is None:
        return None
    more = f" and {len(hit) - 4} more" if len(hit) > 4 else ""
    return (f"the output is that of this batch with {', '.join(hit[:4])}{more} set to 0: those columns' squared "
            f"deviations overflow {conv.native_dtype} (|r| > {limit:.3g} / n), their std turns inf and their z "
            f"silently 0, moving every value that depends on them")


def formula_difference(subject: Subject, case, out: Outcome) -> list[str] | None:
    """Where a code declaring its own convention (``Subject.own_convention``) holds under it on this
    case, the lines naming how that formula differs from spec's; else None."""
    own = subject.own_convention()
    if own is None or own == "spec" or not isinstance(case, Case):
        return None
    conv = get_convention(own)
    if conv.whiten == "per_token" and subject.shape != "verl":
        return None
    res = _holds_under(out.values, case, conv, verl_lengths(case.n) if conv.whiten == "per_token" else None)
    if res is None:
        return None
    return [f"the output is within the error model of the implementation's own convention {own!r} (exact "
            f"there {res.float64.tolist()[:6]}{' ...' if case.n > 6 else ''}): a formula difference from spec, "
            f"not an accuracy defect; {own} differs from spec in: " + "; ".join(differences(own))]
