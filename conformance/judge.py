"""The judge: every verdict of the conformance suite, its category and its explanation. A check
(:mod:`conformance.properties`) hands it a case, the graded code's outcome and the oracle's; this
module alone decides, raising a :class:`ConformanceFailure` that explains itself.
"""

from __future__ import annotations

import inspect
import math
import os
import re
import sys
from fractions import Fraction

import numpy as np
from hypothesis import target
from hypothesis.control import currently_in_test_context

from conformance import boundary
from conformance import error_cases as EC
from conformance.cases import Case, DistCase, expected, hexf, ulp
from conformance.compare import (
    MAX_LISTED, advantage_zero_clause, combined_zero_clause, distance, failure, native_allowed,
    whiten_zero_clause,
)
from conformance.explain import BEYOND_ROUNDING, beyond_any_rounding, explain, formula_difference, overflowed_columns
from conformance.subject import Outcome, Subject
from conformance import verdicts
from conformance.verdicts import Category
from spec import error_model as em
from spec.constants import FLOAT32_MAX
from spec.conventions import get_convention
from spec.errors import DistributedError, GDPOError, OutOfRangeError

#: exceptions of the call shape itself (subject.py), not refusals
_BREACHES = ("CallShapeViolation", "InputModified", "NotATensor")


class ConformanceFailure(AssertionError):
    """A property does not hold for the implementation under test: its ``category``
    (:class:`conformance.verdicts.Category`) and, for a distance, the worst error in ulps of the
    dtype it is judged at (``worst_ulps``, ``worst_dtype``)."""

    category: str | None = None
    worst_ulps: float | None = None
    worst_dtype: str | None = None
    #: category ``formula``: how the formula differs from the paper ("Eq. 4: leave-one-out baseline")
    formula: str | None = None
    #: category ``formula``: the other catalogue variants that reproduce this case's output as well
    formula_alternatives: tuple = ()
    #: category ``precision``: what floating point explains it ("cancellation at Eq. 4 ..."), or None
    cause: str | None = None
    #: ranks that did not return (:func:`hang`): a drawn-first run checks no further case of the row
    hang: bool = False
    #: a distance: what the outputs showed (zeros, a NaN) before a formula or a cause explained them
    observed: str | None = None
    #: a protocol failure where every rank raised alike: what they raised ("raised ValueError: ...")
    raised: str | None = None

    def restated(self, text: str) -> "ConformanceFailure":
        """The same failure (its case, category, worst error, formula, cause) told by ``text``."""
        out = ConformanceFailure(text)
        out.__dict__.update(self.__dict__)
        return out


def fail(prop, equation, subject, case, headline, details=(), category=None, worst_ulps=None,
         worst_dtype=None, formula=None, formula_alternatives=(), cause=None, hang=False, observed=None,
         raised=None):
    exc = ConformanceFailure(failure(prop, equation, subject, case, headline, details, category))
    exc.case = case  # the failing call itself (one of several for the errors property)
    exc.category, exc.worst_ulps, exc.worst_dtype = category, worst_ulps, worst_dtype
    exc.formula, exc.formula_alternatives = formula, tuple(formula_alternatives)
    exc.cause, exc.hang, exc.observed, exc.raised = cause, hang, observed or category, raised
    raise exc


def refusal_words(line: str) -> str:
    """A refusal's words up to its first value, without the ranks that said it (nor whether it
    was a batch of several ranks or one process's case that the contract computes)."""
    line = re.sub(r"\brank \d+:? ", "", line).split("; the contract computes")[0]
    return re.split(r"[-+]?\d|['\"{\[(]", line, maxsplit=1)[0].rstrip()


def cause_line(exc: ConformanceFailure) -> str:
    """The judge's headline, without its prefix: what failed."""
    head = (str(exc).splitlines()[0] if str(exc) else "").split("): ", 1)[-1]
    cause = getattr(exc, "cause", None)
    return f"{head}; {cause}" if cause else head


def _fail_distance(prop, eq, subject, case, headline, v, rows=None, category=None, **kw):
    """Fail with the distance verdict ``v``'s rows, category and worst error."""
    fail(prop, eq, subject, case, headline, v.rows if rows is None else rows, category=category or v.category,
         worst_ulps=v.worst_ulps, worst_dtype=v.judged_dtype, **kw)


def _target(ratio: float, label: str) -> None:
    if currently_in_test_context() and math.isfinite(ratio):
        target(min(ratio, 1e30), label=label)


class _Unjudged(Exception):
    """The oracle returned a NaN tolerance: it cannot judge the case."""


def oracle_verdict(case, convention: str, token_counts=None):
    """The oracle's Expected (``token_counts``: per sample, for a per-token convention); an oracle
    that crashes or returns a NaN allowance fails loudly, as the oracle's fault, never the
    implementation's (regressions.json pins the cases that found such faults)."""
    try:
        exp = expected(case, convention, token_counts)
        res = exp.result
        if res is not None and np.isnan(res.allowed("float64")).any():
            raise _Unjudged(f"NaN in the oracle's allowed(): {res.allowed('float64').tolist()}")
        return exp
    except Exception as exc:  # noqa: BLE001 - expected() returns a contract refusal, never raises it
        raise ConformanceFailure(f"the oracle itself failed on this case ({type(exc).__name__}: {exc}); "
                                 f"this is not the implementation's fault: report it to the oracle's owner.\n"
                                 f"  case: {case.dumps()}") from exc


def _oracle_refuses(prop, eq, subject, case, out: Outcome, exp) -> bool:
    """Where the oracle refuses the case, the contract's refusal judged; True then."""
    if exp.error is not None:
        refusal(prop, eq, subject, case, out, (type(exp.error),), f"the oracle: {exp.error}")
    return exp.error is not None


# ------------------------------------------------------------------ helpers


def _shards(case) -> tuple:
    return case.shards if isinstance(case, DistCase) else (case,)


def _abs_weights(weights, k_cols: int) -> np.ndarray:
    return np.ones(k_cols) if weights is None else np.abs(np.asarray(weights, dtype=np.float64))


def _may_reach(stage, dtype: str) -> bool:
    """|exact| plus the model's bound reaches ``dtype``'s overflow threshold somewhere."""
    with np.errstate(invalid="ignore", over="ignore"):
        return bool(np.any(stage.reach() >= em.overflow_threshold(dtype)))


def _permission(case, res) -> str | None:
    """Why the contract permits OutOfRangeError on this case (Case or DistCase), or None: a
    reward beyond float32's range (spec section 6; any finite float64 weight is computed), or
    Eq. 7's c or a term of it beyond float64. c may overflow in a correct float64 computation
    where |exact c| plus the bound reaches the threshold (found by the deep profile: w =
    0x1.5555555555555p+1023 times z = 1.5 is the midpoint between DBL_MAX and 2^1024)."""
    shards = _shards(case)
    if any(abs(v) > FLOAT32_MAX for s in shards for row in s.rewards for v in row if math.isfinite(v)):
        return "a reward is beyond float32's range"
    if res is None:
        return None
    if not np.all(np.isfinite(res.combined.float64)) or _may_reach(res.combined, "float64"):
        return "Eq. 7's c overflows float64, or may in a correct float64 computation"
    term = _eq7_term_overflow(shards[0].weights, res)
    if term is not None:
        j, k, mag = term
        return f"the Eq. 7 term w_{k} z_{k} of row {j} exceeds DBL_MAX ({mag:.4g})"
    return None


def _eq7_term_overflow(weights, res):
    """(row, column, |w_k| times the reach of z) of the first Eq. 7 term w_k z_k beyond DBL_MAX,
    exactly or within the model's bound on a correct float64 z; else None. Such a term overflows
    even where c fits (w = [DBL_MAX, -DBL_MAX/2] on equal columns): OutOfRangeError is permitted."""
    z = getattr(res, "z", None)
    if z is None or z.float64.size == 0:
        return None
    w = _abs_weights(weights, z.float64.shape[1])
    if w.shape != (z.float64.shape[1],):
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        zr = z.reach()
        big = w[None, :] * np.where(np.isfinite(zr), zr, 0.0)
    for j, k in zip(*np.nonzero(big >= sys.float_info.max / 2)):  # candidates, then exactly
        if Fraction(float(w[k])) * Fraction(float(zr[j, k])) > Fraction(sys.float_info.max):
            return int(j), int(k), float(big[j, k])
    return None


def _computes_because(case, res, out_dtype: str) -> list[str]:
    """Why the contract computes this case (a refusal was rejected): each permitted
    OutOfRangeError and why it does not apply, or, where one does, that it alone is permitted."""
    perm = _permission(case, res)
    if perm is not None:
        return [f"the contract computes this case or refuses it with OutOfRangeError ({perm}); no other "
                "refusal is permitted"]
    shards = _shards(case)
    top_r = max((abs(v) for s in shards for row in s.rewards for v in row if math.isfinite(v)), default=0.0)
    parts = [f"no reward is beyond float32's range (largest |r| {top_r:.4g})"]
    if getattr(res, "z", None) is not None and res.z.float64.size:
        w = _abs_weights(shards[0].weights, res.z.float64.shape[1])
        with np.errstate(over="ignore", invalid="ignore"):
            terms = w[None, :] * np.abs(res.z.float64)
            reach = res.combined.reach()
        if np.isfinite(terms).any():
            j, k = np.unravel_index(int(np.argmax(np.where(np.isfinite(terms), terms, -1.0))), terms.shape)
            parts.append(f"no Eq. 7 term |w_k z_k| exceeds DBL_MAX (largest {terms[j, k]:.4g}, row {j} column {k})")
        if np.isfinite(reach).any():
            parts.append(f"c stays within float64 (largest |c| plus the model's bound "
                         f"{np.max(reach[np.isfinite(reach)]):.4g})")
        exact = np.abs(res.float64[np.isfinite(res.float64)])
        if out_dtype != "float64" and exact.size:
            parts.append(f"every exact result rounds into {out_dtype} (largest |exact| {exact.max():.4g})")
    return ["refusing is not allowed here: " + "; ".join(parts)]


def cast_overflow(stage, out_dtype: str) -> tuple[bool, bool]:
    """(must, may) refuse: an exact output whose correct rounding to ``out_dtype`` is infinite
    cannot survive the cast (OutOfRangeError, never inf or a saturated value); where a correct
    float64 result may reach the threshold (|exact| + the model's bound), refusing is permitted."""
    must = bool(np.any(stage.overflows(out_dtype)))
    return must, must or _may_reach(stage, out_dtype)


def check_output(prop, equation, subject, case, out: Outcome, n: int, out_dtype: str):
    if out.dtype != out_dtype or out.shape != (n,):
        fail(prop, equation, subject, case,
             f"returned {out.dtype} of shape {out.shape}; the contract returns {out_dtype} of shape ({n},)",
             category=Category.CALL_SHAPE)
    if subject.device != "cpu" and out.device != subject.device.split(":")[0]:
        fail(prop, equation, subject, case, f"returned a tensor on {out.device}, input was on {subject.device}",
             category=Category.CALL_SHAPE)


#: Clear refusals of a class other than spec.errors', per property: {property: {(error case, class)}}.
#: Such a refusal passes (reported as ``wrong_class``) unless the strict error contract is asked for.
NOTES: dict = {}

#: The environment variable that asks for the strict error contract (``gdpo check --strict-errors``):
#: a refusal must then raise the spec.errors class the contract names.
STRICT_ENV = "GDPO_STRICT_ERRORS"


def strict_errors() -> bool:
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def _output_summary(out: Outcome) -> str:
    """What a result returned where the contract refuses looks like (finite? zeros? NaN?)."""
    v = out.values
    if v is None or not v.size:
        return "an empty result"
    counts = (int(np.isnan(v).sum()), int(np.isinf(v).sum()), int((v == 0.0).sum()))
    parts = [f"{c} {what}" for c, what in zip(counts, ("NaN", "infinite", "exactly 0")) if c]
    shape = f" of shape {tuple(v.shape)}" if v.ndim != 1 else ""  # an (N, 1) result, say
    head = f"{v.size} value(s){shape}" + (f" ({', '.join(parts)})" if parts else " (all finite, none 0)")
    shown = ", ".join(f"{x:.6g}" for x in v.reshape(-1)[:6].tolist()) + (", ..." if v.size > 6 else "")
    return head + f": [{shown}]"


def permitted_refusal(prop: str, out: Outcome) -> bool:
    """Where the contract permits a refusal (OutOfRangeError), any clear one passes: another class
    is noted (``wrong_class``, :data:`NOTES`) and fails only under the strict error contract; a
    breach of the call shape or an empty message is no refusal."""
    if out.is_error(OutOfRangeError):
        return True
    if out.error_type == "NonFiniteOutput" or out.error_type in _BREACHES:
        return False
    if strict_errors() or not out.refuses():
        return False
    NOTES.setdefault(prop, set()).add(("a permitted refusal", out.error_type))
    return True


def noted(prop, case, out: Outcome) -> bool:
    """A clear refusal (a message, no crash, no spec.errors class) where the contract names another class:
    noted in :data:`NOTES` (``wrong_class``) and passed, unless the strict error contract is asked for."""
    if out.error_classes or not out.refuses() or strict_errors() or out.error_type in _BREACHES:
        return False
    NOTES.setdefault(prop, set()).add((case.note.split(":")[1] if case.note.startswith("error:") else prop,
                                       out.error_type))
    return True


def refusal(prop, equation, subject, case, out: Outcome, classes, why: str):
    names = " or ".join(c.__name__ for c in classes)
    if out.ok or out.error_type == "NonFiniteOutput":  # (that: a result, NaN or inf, seen by the call shape)
        said = _output_summary(out) if out.ok else f"non-finite values ({out.message})"
        fail(prop, equation, subject, case, f"returned a result; the contract refuses this case with {names} ({why})",
             [f"returned {said}: the bad input was accepted without a word"], category=Category.ACCEPTED)
    if out.error_type in _BREACHES:  # the grader's own check of the output: no refusal of the code's
        fail(prop, equation, subject, case, f"{out.describe()}; the contract refuses this case with {names} ({why})",
             category=Category.CALL_SHAPE)
    if not out.is_error(*classes):
        if noted(prop, case, out):
            return
        crash = out.message.strip() and not out.refuses()
        hint = "" if out.error_classes or crash else (
            f"; the classes are spec.errors' ({names} is a GDPOError, itself a ValueError): raise them, or "
            "subclass them (the strict error contract, " + STRICT_ENV + "=1 / gdpo check --strict-errors, is on)")
        fail(prop, equation, subject, case,
             f"{'crashed' if crash else 'raised'} {out.error_type}: {out.message!r}"
             f"{' (a crash is no refusal)' if crash else ''}; the contract refuses this case with {names} ({why}){hint}",
             category=Category.WRONG_CLASS)
    if not out.message.strip():
        fail(prop, equation, subject, case, f"raised {out.error_type} with an empty message", category=Category.WRONG_CLASS)


def _refused_where_computed(prop, eq, subject, case, out: Outcome, why: list, who: str = "") -> None:
    """An exception where the contract computes: a non-finite output seen by the call shape (NaN
    on a padding token), another breach of the call shape, or a refusal."""
    category = Category.NON_FINITE if out.error_type == "NonFiniteOutput" else \
        Category.CALL_SHAPE if out.error_type in _BREACHES else Category.REFUSED
    what = "batch" if who else "case"
    untaken = out.untaken()
    hint = f"it takes no {untaken} ({_UNDECLARED[untaken]}): " if untaken in _UNDECLARED else ""
    fail(prop, eq, subject, case, f"{hint}{who}{out.describe()}; the contract computes this {what}", why,
         category=category)


#: what a gdpo-shape code whose signature takes no such keyword declares (docs/grading.md, Declarations)
_UNDECLARED = {"segment_sizes": "declare --domain units=false", "group_ids": "declare --domain labels=false",
               "eps": "declare --domain eps=false", "process_group": "grade it with --single-process"}


def final(prop, eq, subject, case, out, res, what: str, permitted: bool, context=(), zero_why=None,
          because=None) -> None:
    """A final stage's outputs (Eq. 6, cast to out_dtype) against the oracle: a refusal where an
    exact value rounds beyond the output range, else the values within ``allowed(out_dtype)``
    (OutOfRangeError tolerated where ``permitted`` or where the rounding may reach the range)."""
    must, may = cast_overflow(res, case.out_dtype)
    if must:
        refusal(prop, eq, subject, case, out, (OutOfRangeError,),
                f"an exact {what} rounds beyond {case.out_dtype}'s range")
        return
    if not out.ok:
        if (permitted or may) and permitted_refusal(prop, out):
            return
        why = because if because is not None else _computes_because(case, res, case.out_dtype)
        _refused_where_computed(prop, eq, subject, case, out, list(context) + why)
    check_output(prop, eq, subject, case, out, case.n, case.out_dtype)
    conv = subject.judged()
    v = distance(out.values, res.float64, native_allowed(res, case.out_dtype, conv), res.cond, case.out_dtype,
                 rounded=res.rounded(case.out_dtype), zero_why=zero_why, native_dtype=conv.native_dtype)
    _target(v.ratio, f"{prop}: error/allowed")
    if v.ok:
        return
    rows, category = list(v.rows), v.category
    if category in (Category.PRECISION, Category.SILENT_ZERO):
        dropped = overflowed_columns(subject, case, out.values, conv)
        if dropped:
            category = Category.SILENT_ZERO
            rows.append(dropped)
    own = formula_difference(subject, case, out) if conv.name == "spec" else None
    formula, alternatives, cause, observed = None, (), None, category
    if own is not None:
        category, formula = Category.FORMULA, f"convention {subject.own_convention()!r}"
        rows += own
    elif category in (Category.PRECISION, Category.EXACT_ZERO, Category.SILENT_ZERO, Category.NON_FINITE) \
            and what == "advantage":
        category, formula, cause, line, alternatives = explain(subject, case, out, conv, category)
        if line:
            rows.append(line)
    _fail_distance(prop, eq, subject, case, f"{len(v.bad)} of {case.n} {what}s outside the error model"
                   + _precision_note(conv), v, rows, category, formula=formula, formula_alternatives=alternatives,
                   cause=cause, observed=observed)


def _precision_note(conv) -> str:
    """How the error model was evaluated (the convention's algorithm, at its precision)."""
    if conv.algorithm == "shift_invariant":
        return ""
    how = f"{conv.algorithm.replace('_', '-')} deviations"
    roundoff = f"unit roundoff 2^{int(math.log2(conv.unit_roundoff))}"
    if conv.name == "spec":
        return f" of a correct {conv.native_dtype} code ({how}, {roundoff})"
    return f" of convention {conv.name!r}'s own code ({how}, {conv.native_dtype} arithmetic, {roundoff})"


# ------------------------------------------------------------ the checks' verdicts


def values(prop, eq, subject: Subject, case: Case, out: Outcome, exp) -> None:
    """The advantages of one call (Eq. 4, 7, 6 end to end) against the oracle's ``exp``."""
    if _oracle_refuses(prop, eq, subject, case, out, exp):
        return
    res = exp.result
    final(prop, eq, subject, case, out, res, "advantage", _permission(case, res) is not None,
          [f"exact advantages {res.float64.tolist()}"], zero_why=advantage_zero_clause(res, case.weights))


def certified_rounding(prop, eq, subject: Subject, case: Case, out: Outcome, exp) -> None:
    """An implementation that declares certified rounding (``Subject.certifies``): every float32,
    bfloat16 and float16 output the oracle's correct rounding of the exact value (ties to even,
    either sign of zero), every float64 output faithful (the exact value where it is a float64,
    else one of its two neighbours). OutOfRangeError only where the correct rounding overflows."""
    od = case.out_dtype
    if od not in subject.certified_formats():
        return  # declared for other formats: this one is graded within the error model (the other properties)
    if _oracle_refuses(prop, eq, subject, case, out, exp):
        return
    res = exp.result
    if bool(np.any(res.overflows(od))):
        refusal(prop, eq, subject, case, out, (OutOfRangeError,), f"an exact advantage rounds beyond {od}'s range")
        return
    if not out.ok:
        _refused_where_computed(prop, eq, subject, case, out, _computes_because(case, res, od))
    check_output(prop, eq, subject, case, out, case.n, od)
    obs = np.asarray(out.values, dtype=np.float64)
    want = np.asarray(res.rounded(od), dtype=np.float64)
    if not np.all(np.isfinite(obs)):
        i = int(np.flatnonzero(~np.isfinite(obs))[0])
        fail(prop, eq, subject, case, f"[{i}] returned {float(obs[i])!r}; the exact advantage is finite",
             [f"correctly rounded ({od}): {want.tolist()}"], category=Category.NON_FINITE)
    bad = np.flatnonzero(obs != want).tolist()  # NaN differs, -0.0 == 0.0
    if od == "float64":
        bad = [i for i in bad if not _faithful(case, i, obs[i], want[i])]
    if not bad:
        return
    ulps = {i: float(abs(obs[i] - want[i]) / ulp(want[i], od)) for i in bad}
    rows = []
    for i in bad[:MAX_LISTED]:
        where = _where_exact(case, i, float(obs[i]), od)
        if od == "float64":
            rows.append(f"[{i}] output {float(obs[i])!r} ({hexf(obs[i])}) is not within one ulp of the exact value (faithful "
                        f"rounding): the exact value correctly rounded is {float(want[i])!r} ({hexf(want[i])}), "
                        f"{ulps[i]:.3g} ulp(float64) from the output, and " + where)
        else:
            rows.append(f"[{i}] output {float(obs[i])!r} ({hexf(obs[i])}) is not the correctly rounded exact value "
                        f"{float(want[i])!r} ({hexf(want[i])}) ({od}, ties to even), {ulps[i]:.3g} ulp({od}) away; "
                        + where)
    fam = boundary.parse_note(case.note)
    if fam is not None and _still_hunted(case, fam):
        rows.append(f"hunted boundary case: family {fam[0]!r}, aimed at a midpoint of {fam[1]} next to "
                    f"{fam[3]!r} in row {fam[2]} (conformance/boundary.py)")
    fail(prop, eq, subject, case, f"{len(bad)} of {case.n} advantages not the certified rounding ({od}) the "
         "implementation declares (gdpo_certified)", rows, category=Category.ROUNDING, worst_ulps=max(ulps.values()),
         worst_dtype=od)


def _faithful(case: Case, i: int, obs: float, want: float) -> bool:
    """A float64 output other than the correct rounding ``want`` is faithful where it is the other
    float64 neighbour of the exact value: one ulp away, on the exact value's side of ``want``."""
    if abs(obs - want) > np.spacing(abs(want)) or want == 0.0:
        return False
    d, _ = boundary.offset_from(case, i, float(want))  # exact - RN(exact): 0 where the exact is a float64
    return d != 0 and (d > 0) == (obs > want)


def _still_hunted(case: Case, fam) -> bool:
    """Is the hunted row still next to its midpoint (a reduced case may no longer be)?"""
    try:
        d, _ = boundary.offset_from(case, fam[2], fam[3])
        return abs(d) <= 2 * math.ulp(fam[3])
    except Exception:  # noqa: BLE001
        return False


def _where_exact(case: Case, i: int, observed: float, od: str) -> str:
    """Where the exact value lies, for a certified-rounding verdict (mpmath, convention spec)."""
    try:
        if od == "float64":
            return f"the exact value is {boundary.mpmath.nstr(boundary.exact_values(case, 200)[i], 25)}"
        return boundary.midpoint_report(case, i, observed, od)
    except Exception as exc:  # noqa: BLE001 - no clause is no verdict: the failure stands
        return f"(where the exact value lies: not evaluated, {type(exc).__name__}: {exc})"


def normalized(prop, eq, subject: Subject, case: Case, out: Outcome, exp) -> None:
    """normalize_rewards' float64 c (Eq. 4 + 7) against the oracle's combined stage."""
    if _oracle_refuses(prop, eq, subject, case, out, exp):
        return
    res = exp.result
    stage = res.combined
    if not out.ok:
        if _permission(case, res) is not None and permitted_refusal(prop, out):
            return  # c, a term of it, or a reward is beyond what the contract must compute: its OutOfRangeError
        _refused_where_computed(prop, eq, subject, case, out, _computes_because(case, res, "float64"))
    check_output(prop, eq, subject, case, out, case.n, "float64")
    # spec 7: a structural zero of c (the oracle's required_zero: collapsed columns, a pair of columns
    # cancelling exactly) must be exactly 0; other exact cancellations (four columns, say) are held to
    # the error bound like every value (found by the deep profile: +-2^-53 there is within it)
    required = stage.required_zero if stage.required_zero is not None else res.group_cancelled[res.group_index]
    conv = subject.judged()
    v = distance(out.values, stage.float64, native_allowed(stage, "float64", conv), stage.cond, "float64",
                 must_be_zero=required, zero_why=combined_zero_clause(res, case.weights),
                 native_dtype=conv.native_dtype)
    _target(v.ratio, f"{prop}: error/allowed")
    if not v.ok:
        _fail_distance(prop, eq, subject, case, f"{len(v.bad)} of {case.n} combined values outside the error model", v)


def whitened(prop, eq, subject: Subject, case: Case, out: Outcome, exp) -> None:
    """whiten's output (Eq. 6 alone, on given values) against the oracle's ``whiten``."""
    if _oracle_refuses(prop, eq, subject, case, out, exp):
        return
    top = float(np.max(np.abs(exp.result.float64))) if exp.result.float64.size else 0.0
    final(prop, eq, subject, case, out, exp.result, "whitened value", False, zero_why=whiten_zero_clause(case),
          because=[f"refusing is not allowed here: the values are finite and every exact whitened value "
                   f"rounds into {case.out_dtype} (largest |exact| {top:.4g})"])


def policy(prop, eq, subject: Subject, case: Case, out: Outcome, exp) -> None:
    """An input the convention computes by its own policy (NaN, singleton): the output must be the
    convention's, NaN exactly where its exact result is NaN, each other value within the error
    model of the convention's code; a refusal is better than the convention and passes."""
    if exp.error is not None or not out.ok:
        return  # the convention refuses it too, or the implementation refuses it (spec's answer)
    conv = subject.judged()
    res = exp.result
    check_output(prop, eq, subject, case, out, case.n, case.out_dtype)
    obs = np.asarray(out.values, dtype=np.float64)
    want_nan = np.isnan(res.float64)
    wrong = np.flatnonzero(want_nan != np.isnan(obs))
    if wrong.size:
        i = int(wrong[0])
        fail(prop, eq, subject, case,
             f"{wrong.size} of {case.n} outputs differ from the policy in being NaN: [{i}] returned {obs[i]!r}, "
             f"the convention gives {res.float64[i]!r}",
             [f"exact under the convention: {res.float64.tolist()}"], category=Category.POLICY)
    live = ~want_nan
    with np.errstate(invalid="ignore"):
        allowed = np.where(live, np.nan_to_num(native_allowed(res, case.out_dtype, conv), nan=0.0), 0.0)
    v = distance(np.where(live, obs, 0.0), np.where(live, res.float64, 0.0), allowed,
                 np.nan_to_num(res.cond, nan=0.0), case.out_dtype, native_dtype=conv.native_dtype)
    if not v.ok:
        _fail_distance(prop, eq, subject, case, f"{len(v.bad)} of {case.n} advantages outside the error model of the "
                       "convention's policy", v,
                       category=Category.POLICY if v.category == Category.PRECISION else v.category)


def error_route(convention: str, name: str) -> str:
    """How one error case is judged under ``convention``, by :mod:`conformance.error_cases`' tables:
    ``"skip"``, ``"policy"`` (:func:`policy`) or ``"refuse"`` (the contract's refusal: :func:`refusal`)."""
    if convention == "spec":
        return "refuse"
    if name in EC.SPEC_ONLY_CASES:
        return "skip"
    rule = EC.POLICY_CASES.get(name)
    if (rule is not None and getattr(get_convention(convention), rule[0]) != rule[1]) or name in EC.VALUE_CASES:
        return "policy"
    return "refuse"


def error_case(prop, subject: Subject, case: Case, out: Outcome) -> None:
    """One case of the error contract that must be refused (spec section 6), by :func:`refusal`; a
    call the peer's API cannot take (its adapter's ``PeerCannotExpress``) is not graded."""
    name = case.note.split(":", 1)[1]
    if out.error_type == "PeerCannotExpress" and subject.convention != "spec":
        return
    ec = EC.ERROR_BY_NAME[name]
    refusal(prop, f"error contract ({name})", subject, case, out, ec.expect, ec.why)


def policy_equation(subject: Subject, name: str) -> str:
    conv = subject.judged()
    return f"{name} under convention {conv.name!r}'s policy (nan={conv.nan!r}, singleton={conv.singleton!r})"


# --------------------------------------------------------------- several ranks


def hang(prop, eq, subject, case: DistCase, job, grace: float, deadline: float) -> None:
    """A rank that did not return within the deadline: a hang, whatever the others did."""
    if job.hung:
        fail(prop, eq, subject, case,
             f"rank(s) {job.hung} of {case.world} did not return within the deadline "
             f"({grace:g} s after the first rank, {deadline:g} s in all): a hang (on a loaded machine, allow "
             "more seconds with GDPO_CONFORMANCE_GRACE and GDPO_CONFORMANCE_DEADLINE)",
             [f"rank {r}: {o.describe()}" for r, o in sorted(job.outcomes.items())], category=Category.PROTOCOL,
             hang=True)


def _single_process_hint(subject, outs: dict) -> list[str]:
    """A line for a failure where every rank raised something other than a DistributedError, from
    a code whose signature takes no process_group: one for one process only, which --single-process
    grades as such."""
    try:
        params = inspect.signature(subject.fn).parameters
        takes = "process_group" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())
    except (TypeError, ValueError):
        takes = False
    if outs and not takes and all(not o.ok and not o.is_error(DistributedError) for o in outs.values()):
        return ["every rank raised: if the implementation runs in one process only (no process_group), grade "
                "it with --single-process (gdpo check --single-process, or pytest --single-process), which "
                "deselects the multi-process properties and reports them as not graded"]
    return []


def all_refuse(prop, eq, subject, case: DistCase, outs: dict, why: str, offender=None, plain=()):
    """Every rank raises the same DistributedError (world 1: also the plain class)."""
    world = case.world
    details = [f"rank {r}: {o.describe()}" for r, o in sorted(outs.items())]
    if world > 1:
        details += _single_process_hint(subject, outs)
    allowed = (DistributedError,) + (tuple(plain) if world == 1 else ())
    for r, o in sorted(outs.items()):
        if (o.ok or not o.is_error(*allowed)) and not noted(prop, case, o):
            fail(prop, eq, subject, case,
                 f"rank {r} {o.describe()}; every rank must raise DistributedError together ({why})", details,
                 category=Category.ACCEPTED if o.ok else Category.PROTOCOL)
    if len({(o.error_type, o.message) for o in outs.values()}) > 1:
        fail(prop, eq, subject, case, f"ranks raised different errors; the contract wants the same "
                                      f"DistributedError on every rank ({why})",
             ["the ranks raised different errors (the same on every rank, naming the rank, is the contract)"]
             + details, category=Category.PROTOCOL)
    if offender is not None and world > 1 and not re.search(rf"\branks?\b[^;.]*?\b{offender}\b", outs[0].message):
        fail(prop, eq, subject, case, f"the DistributedError does not name the offending rank {offender}",
             [f"the error does not name rank {offender}, whose input is refused"] + details,
             category=Category.PROTOCOL, raised=f"raised {outs[0].error_type}: {outs[0].message}")


def dist_errors(prop, eq, subject, case: DistCase, outs: dict) -> None:
    """A refusal on one rank: every rank raises the same DistributedError naming it."""
    _, name, offender = case.note.split(":")
    ec = EC.DIST_ERROR_BY_NAME[name]
    all_refuse(prop, eq, subject, case, outs, ec.why, int(offender) if ec.names_offender else None, (GDPOError,))


#: the formula of ranks whitening their own shards; on copies of one shard, what it cannot be told from
SHARDS_ALONE = "Eq. 6: over each rank's shard alone, not the batch across ranks (no all_reduce?)"
SHARDS_ALONE_OR_DIVISOR = ("Eq. 6 across ranks: over each rank's shard alone, or the batch's squared deviations "
                           "divided by other than N - 1 (ranks holding copies of one shard cannot tell)")


def _copies(case: DistCase) -> bool:
    """Do the ranks with rows hold copies of one shard (its rows and its grouping), two or more?"""
    held = [(s.rewards, tuple(np.unique(s.labels(), return_inverse=True)[1].ravel())) for s in case.shards if s.n]
    return len(held) > 1 and all(h == held[0] for h in held)


def _shards_alone(case: DistCase, outs: dict, conv, out_dtype: str) -> str | None:
    """The formula where every rank returned its own shard's GDPO, as if it were the whole batch
    (on copies of one shard, what it cannot be told from: heldout8 m08, N - world size)."""
    for r, o in outs.items():
        exp = expected(case.shards[r], conv.name) if case.shards[r].n else None
        if exp is not None and (exp.result is None or not distance(
                o.values, exp.result.float64, native_allowed(exp.result, out_dtype, conv), exp.result.cond,
                out_dtype, native_dtype=conv.native_dtype).ok):
            return None
    return SHARDS_ALONE_OR_DIVISOR if _copies(case) else SHARDS_ALONE


def dist_values(prop, eq, subject, case: DistCase, outs: dict, exp, twins) -> None:
    """The shards' advantages, reassembled in global row order, against the oracle on the global
    batch; refusals on every rank together; twinned groups (``twins``: the same group in the same
    unit on two ranks) bitwise equal."""
    if exp.error is not None:
        all_refuse(prop, eq, subject, case, outs, f"the oracle on the global batch: {exp.error}",
                   plain=(type(exp.error),))
        return
    res = exp.result
    out_dtype = case.shards[0].out_dtype
    must, may = cast_overflow(res, out_dtype)
    if must or any(not o.ok for o in outs.values()) and (_permission(case, res) is not None or may):
        # the contract's OutOfRangeError, raised on every rank together
        all_refuse(prop, eq, subject, case, outs, "inputs beyond float32 range, an Eq. 7 (or a term of it) "
                   "beyond float64 or advantages beyond the output dtype's range", plain=(OutOfRangeError,))
        return
    where = case.global_case()[3]
    observed = np.full(res.float64.shape, np.nan)
    for r, o in sorted(outs.items()):
        shard = case.shards[r]
        if not o.ok:
            _refused_where_computed(
                prop, eq, subject, case, o,
                [f"rank {q}: {p.describe()}" for q, p in sorted(outs.items())]
                + _computes_because(case, res, out_dtype) + _single_process_hint(subject, outs), who=f"rank {r} ")
        if o.dtype != out_dtype or o.shape != (shard.n,):
            fail(prop, eq, subject, case, f"rank {r} returned {o.dtype} {o.shape}; wanted {out_dtype} ({shard.n},)",
                 category=Category.CALL_SHAPE)
        observed[where[r]] = o.values
    conv = subject.judged()
    v = distance(observed, res.float64, native_allowed(res, out_dtype, conv), res.cond, out_dtype,
                 rounded=res.rounded(out_dtype), zero_why=advantage_zero_clause(res, case.shards[0].weights),
                 native_dtype=conv.native_dtype)
    _target(v.ratio, f"{prop}: error/allowed")
    if not v.ok:
        alone = _shards_alone(case, outs, conv, out_dtype)
        rows, category = list(v.rows), Category.FORMULA if alone else v.category
        dropped = overflowed_columns(subject, case, observed, conv) \
            if category in (Category.PRECISION, Category.SILENT_ZERO) else None
        if dropped:
            category = Category.SILENT_ZERO
            rows.append(dropped)
        elif category == Category.PRECISION and all(verdicts.ordinary(s) for s in case.shards if s.n) and \
                beyond_any_rounding(observed, case, conv):
            category, alone = Category.FORMULA, BEYOND_ROUNDING
        _fail_distance(prop, eq, subject, case, f"{len(v.bad)} of {observed.size} advantages (global rows, rank "
                       "order) outside the error model" + _precision_note(conv), v, rows, category=category,
                       formula=alone, formula_alternatives=(SHARDS_ALONE,) if alone == SHARDS_ALONE_OR_DIVISOR else ())
    for ra, oa, rb, ob, n in twins:
        a, b = outs[ra].values[oa:oa + n], outs[rb].values[ob:ob + n]
        if a.tobytes() != b.tobytes():
            fail(prop, eq, subject, case,
                 f"the same group in the same unit on ranks {ra} and {rb} got different advantages "
                 f"({a.tolist()} vs {b.tolist()}): the ranks' statistics are not bitwise identical",
                 category=Category.PROTOCOL)
