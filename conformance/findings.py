"""Findings: a grading's failures, one per cause (docs/grading.md, "Findings"): a :class:`Finding`
is one :func:`key` (the judge's category, the regime, the cause), with its rows, how many cases
failed and the smallest example the judge's reduction reaches; :func:`rank` orders them.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable

import mpmath
import numpy as np

from conformance import formulas, runner
from conformance.cases import Case, DistCase, expected
from conformance.compare import decimal, repro
from conformance.error_cases import CAUSES, DIST_ERROR_BY_NAME, ERROR_BY_NAME
from conformance.judge import ConformanceFailure, cause_line, refusal_words
from conformance.verdicts import ORDINARY, Category, label, ordinary
from spec.conventions import get_convention
from spec.error_model import largest_finite, round_to

#: the regimes, in the order findings are ranked
REGIMES = ("ordinary magnitudes", "bad input", "several ranks", "extreme magnitudes")
#: what one example's reduction may spend, in checks
REDUCE_CALLS = 40
#: bisection steps of a threshold (the binary exponents 13 to 1024 need 7)
BISECT_STEPS = 12


@dataclasses.dataclass
class Failure:
    """One failing case of a grading, with its row's check (to replay a reduced or scaled case)."""

    row: str
    case: object
    exc: ConformanceFailure
    check: Callable


@dataclasses.dataclass
class Finding:
    category: str
    regime: str
    cause: str  # one line: the formula's differences, the cause, or what the judge said
    rows: list
    count: int
    example: object  # the smallest case
    said: str  # what the example returned, in one line
    repro: str
    detail: str  # the judge's full text of the example
    threshold: float | None = None
    input: str = ""  # at extreme magnitudes: "rewards" or "weights"

    def headline(self) -> str:
        if self.regime == "bad input":
            return f"{label(self.category)}: {self.cause}"
        where = self.regime
        if self.threshold is not None:
            where += f", from |{self.input or 'value'}| of about {self.threshold:.3g}"
        return f"{label(self.category)} ({where}): {self.cause}"

    def lines(self, i: int) -> list[str]:
        rows = ", ".join(self.rows[:6]) + (f" and {len(self.rows) - 6} more" if len(self.rows) > 6 else "")
        out = [f"{i}. {self.headline()}", f"   in {rows}: {self.count} case(s); example {describe(self.example)}"]
        out += [f"   {self.said}"] if self.said else []
        return out + ([f"   replay: {self.repro}"] if self.repro else [])

    def as_json(self) -> dict:
        return {"category": str(self.category), "category_label": label(self.category), "regime": self.regime,
                "cause": self.cause, "threshold": self.threshold, "input": self.input or None,
                "properties": self.rows, "count": self.count, "example": describe(self.example),
                "example_case": (self.example[0] if isinstance(self.example, tuple) else self.example).dumps(),
                "said": self.said, "repro": self.repro}


def rank(found: list) -> list:
    return sorted(found, key=lambda f: (REGIMES.index(f.regime), f.category != Category.FORMULA, -f.count))


def regime(f: Failure) -> str:
    case = f.case
    if isinstance(case, DistCase):  # (rewards of 8e300 on a rank are extreme magnitudes, not ranks)
        if case.note.startswith("error:"):
            return "bad input"
        big = any(s.n and not ordinary(s, unscored_ok=True) for s in case.shards)
        return "extreme magnitudes" if big and f.exc.category != Category.FORMULA else "several ranks"
    if isinstance(case, tuple) or case.note.startswith("error:") or case.variant:
        return "bad input"
    if f.exc.category == Category.FORMULA or ordinary(case, unscored_ok=True):
        return "ordinary magnitudes"
    if not case.missing and not all(math.isfinite(v) for row in case.rewards for v in row):
        return "bad input"  # a value case whose reward rounded to inf in its dtype
    return "extreme magnitudes"


def key(f: Failure, subject=None) -> tuple:
    """What makes two failures one finding: the category, the regime and the cause."""
    cat, reg = str(f.exc.category), regime(f)
    if reg == "bad input":
        note = (f.case[0] if isinstance(f.case, tuple) else f.case).note
        name = (note.split(":")[1] if note.startswith("error:") else "") or "inf_reward"  # a value case: not finite
        ec = ERROR_BY_NAME.get(name) or DIST_ERROR_BY_NAME.get(name)
        return cat, reg, CAUSES.get(name) or (ec.why if ec is not None else name)
    if cat == Category.FORMULA:
        return cat, "ordinary magnitudes", f.exc.formula or ""
    if cat == Category.PRECISION and getattr(f.exc, "cause", None):
        return cat, "", f.exc.cause  # one cause, wherever it shows: its regime is its members' lowest
    if cat in (Category.CALL_SHAPE, Category.POLICY, Category.WRONG_CLASS, Category.PROTOCOL):
        return cat, "", ""  # no magnitude makes these: one finding each
    if cat == Category.REFUSED:  # one refusal, wherever it shows
        return cat, "", refusal_words(cause_line(f.exc))
    if reg == "extreme magnitudes" and isinstance(f.case, DistCase):  # no threshold sought on ranks: what overflows
        zeros = cat == Category.SILENT_ZERO  # (a std turned inf: its squared deviations cross first)
        return cat, reg, mechanism(f.case.batch(), subject, cat, at_threshold=False) if zeros else ""
    if reg == "extreme magnitudes":
        return cat, reg, _large_input(f)
    return cat, reg, ""


def _large_input(f: Failure) -> str:
    """The input whose magnitude makes ``f`` fail: the rewards where they alone are large, the
    weights where they alone are, else the rewards unless the case still fails with its large
    rewards scaled down to about :data:`ORDINARY` (one more check)."""
    case = f.case
    if _top(case, "rewards") <= ORDINARY:
        return "weights"
    if _top(case, "weights") <= ORDINARY:
        return "rewards"
    floor = _scaled(case, -(math.frexp(_top(case, "rewards"))[1] - math.frexp(ORDINARY)[1]), False)
    return "weights" if floor is not None and _fails_alike(f, floor) is not None else "rewards"


def _fails_alike(f: Failure, case) -> ConformanceFailure | None:
    return runner.fails_alike(f.check, case, f.exc)  # never a formula here: those are ordinary


def _still_shows(f: Failure, case) -> bool:
    """Does ``case`` fail as ``f`` does, or show its zeros or non-finite outputs still, whatever
    explains them there (at ordinary magnitudes, a formula)?"""
    try:
        f.check(case)
    except ConformanceFailure as exc:
        return exc.category == f.exc.category or \
            (f.exc.category in (Category.SILENT_ZERO, Category.NON_FINITE) and exc.observed == f.exc.category)
    except Exception:  # noqa: BLE001 - another kind of failure
        return False
    return False


def _scaled(case, e: int, weights: bool):
    """The case with its large rewards (or weights), those beyond :data:`ORDINARY`, times 2^e
    (the others kept: scaling a tiny value of the same batch would move it relative to eps, not
    toward the threshold); None where the dtype cannot hold a scaled value exactly. A DistCase:
    each shard so."""
    if isinstance(case, DistCase):
        shards = [_scaled(s, e, weights) if s.n else s for s in case.shards]
        return None if None in shards else dataclasses.replace(case, shards=tuple(shards))
    def scale(values, dtype):
        v = np.asarray(values, dtype=np.float64)
        s = np.where(np.abs(v) > ORDINARY, np.ldexp(v, e), v)
        ok = np.all(np.isfinite(s[np.isfinite(v)])) and np.array_equal(round_to(s, dtype), s, equal_nan=True)
        return s if ok else None

    if weights:
        w = scale(case.weights, "float64")
        return None if w is None else dataclasses.replace(case, weights=tuple(float(x) for x in w))
    if case.dtype not in ("float64", "float32", "float16", "bfloat16"):
        return None
    r = scale(case.rewards_array(), case.dtype)
    return None if r is None else dataclasses.replace(case, rewards=tuple(tuple(float(v) for v in row) for row in r))


def threshold(f: Failure, case: Case, inp: str) -> tuple[float | None, Case]:
    """The smallest magnitude of input ``inp`` (rewards or weights) at which the case still fails
    alike, bisected over the binary exponent down to about :data:`ORDINARY`, and the case scaled
    there; (None, case) where it still fails scaled to ORDINARY (that input is not the cause)."""
    weights = inp == "weights"
    top = _top(case, inp)
    if not top > ORDINARY:
        return None, case
    hi = 0  # scaling by 2^hi fails (the case itself)
    lo = -(math.frexp(top)[1] - math.frexp(ORDINARY)[1])
    floor = _scaled(case, lo, weights)
    if floor is None or _still_shows(f, floor):
        return None, case
    best = case
    for _ in range(BISECT_STEPS):
        if hi - lo <= 1:
            break
        mid = (lo + hi) // 2
        cand = _scaled(case, mid, weights)
        if cand is not None and _fails_alike(f, cand) is not None:
            hi, best = mid, cand
        else:
            lo = mid  # it passes there, or cannot be held there exactly: the threshold is not below
    return math.ldexp(top, hi), best


def describe(case, limit: int = 6) -> str:
    """A case in decimal, short: ``[[1e+20], [0] (x3)] (float32, groups of 4, weights [1, 2])``."""
    if isinstance(case, tuple):
        case = case[0]
    if isinstance(case, DistCase):
        return f"{case.world} ranks: " + "; ".join(describe(s, 3) for s in case.shards)
    rows = ("[" + ", ".join(decimal(v, case.dtype) for v in row) + "]" for row in case.rewards)
    shown = [(t, len(list(run))) for t, run in itertools.groupby(rows)][:limit]
    rest = case.n - sum(c for _, c in shown)
    text = "[" + ", ".join(t if c == 1 else f"{t} (x{c})" for t, c in shown) \
        + (f", ... {rest} more rows" if rest else "") + "]"
    extras = [case.dtype]
    if case.group_ids is not None:
        extras.append(f"group_ids {list(case.group_ids)[:12]}")
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
    return f"{text} ({', '.join(extras)})"


def _said(exc: ConformanceFailure) -> str:
    """What the example's call did, in one line: its first listed output, or its refusal."""
    lines = str(exc).splitlines()
    for ln in lines[1:]:
        body = ln.strip()
        if body.startswith(("inputs:", "repro:", "formula:", "precision:")):
            continue
        return body if len(body) <= 300 else body[:297] + "..."
    return lines[0].split(": ", 1)[-1] if lines else ""


def _repro(exc) -> str:
    return next((ln.strip()[len("repro: "):] for ln in str(exc).splitlines() if ln.strip().startswith("repro: ")), "")


def findings(failures: list, subject) -> list:
    """The grading's findings, ranked."""
    groups: dict = {}
    for f in map(_at_ordinary, failures):
        groups.setdefault(key(f, subject), []).append(f)
    absorbed = _absorbed(groups)
    _join_ambiguous(groups)
    out = []
    for (cat, reg, what), members in groups.items():
        if not reg:
            reg = min((regime(m) for m in members), key=REGIMES.index)
        also = absorbed.get(what, []) if cat == Category.REFUSED else []
        rows = list(dict.fromkeys(m.row for m in members + also))
        first = min(members, key=lambda m: _size(m.case))
        thr, inp = None, what if what in ("rewards", "weights") else ""
        if cat == Category.REFUSED and reg == "extreme magnitudes" and isinstance(first.case, Case):
            inp = _large_input(first)
        if reg == "extreme magnitudes" and isinstance(first.case, Case) and inp:
            thr, inp, first, example = _lowest(members, inp)
            exc = _fails_alike(first, example) or first.exc
            if thr is not None:
                exc, _ = runner.reduce(first.check, subject, example, exc, REDUCE_CALLS)
                example = getattr(exc, "case", example)
            overflow = thr and cat in (Category.NON_FINITE, Category.SILENT_ZERO)
            cause = getattr(exc, "cause", None) or (mechanism(example, subject, cat) if overflow else "") \
                or cause_line(exc)
        else:  # reduced where it is a value case
            exc, _ = runner.reduce(first.check, subject, first.case, first.exc, REDUCE_CALLS)
            example = getattr(exc, "case", first.case)
            cause = what if what and cat != Category.REFUSED else cause_line(exc)
        out.append(Finding(cat, reg, cause, rows, len(members) + len(also), example, _said(exc), _repro(exc),
                           str(exc), thr, inp))
    return rank(_one_per_check(_refile(out)))


def _at_ordinary(f: Failure) -> Failure:
    """A multi-process case off by more than its precision at extreme magnitudes (no threshold is
    sought on ranks) that still fails so with its large rewards and weights scaled below
    :data:`ORDINARY`: that case's failure, on several ranks (heldout8 m08, a wrong divisor of
    Eq. 6 shown only beside a reward of 3e38, was told to declare a range below it)."""
    if not isinstance(f.case, DistCase) or f.exc.category != Category.PRECISION or regime(f) != "extreme magnitudes":
        return f
    floor = f.case
    for inp in ("rewards", "weights"):
        if floor is not None and _top(floor, inp) > ORDINARY:
            e = math.frexp(ORDINARY)[1] - 1 - math.frexp(_top(floor, inp))[1]  # (below ORDINARY's binade)
            floor = _scaled(floor, e, inp == "weights")
    if floor is None or floor == f.case:
        return f
    try:
        f.check(floor)
    except ConformanceFailure as exc:  # (there, a formula the judge names at ordinary magnitudes)
        if exc.category in (Category.PRECISION, Category.FORMULA):
            return Failure(f.row, floor, exc, f.check)
    except Exception:  # noqa: BLE001 - another kind of failure: the case keeps its own
        pass
    return f


#: of one missed check's symptoms, the finding that leads (the others join it)
_WORST_FIRST = (Category.ACCEPTED, Category.PROTOCOL, Category.WRONG_CLASS)


def _one_per_check(found: list) -> list:
    """Bad input of one cause that shows two ways (labels too long accepted, too short crashing:
    one missing length check) is one finding, led by the worse, the other said beside it."""
    kept, by_cause = [], {}
    for f in sorted(found, key=lambda f: _WORST_FIRST.index(f.category) if f.category in _WORST_FIRST else -1):
        lead = by_cause.get(f.cause) if f.regime == "bad input" and f.category in _WORST_FIRST else None
        if lead is None:
            kept.append(f)
            if f.regime == "bad input" and f.category in _WORST_FIRST:
                by_cause.setdefault(f.cause, f)
            continue
        lead.rows, lead.count = list(dict.fromkeys(lead.rows + f.rows)), lead.count + f.count
        lead.said += f"; in {f.count} other case(s), {label(f.category)}: {f.said}"
    return kept


def _absorbed(groups: dict) -> dict:
    """Protocol failures whose every rank raised a refusal the code also makes where the contract
    computes (an empty shard refused, naming that rank, not the one the case broke): taken out of
    ``groups``, by the refusal they join. One cause, one finding."""
    refusals = {what for (cat, _, what) in groups if cat == Category.REFUSED}
    out: dict = {}
    for k in [k for k in groups if k[0] == Category.PROTOCOL]:
        said = {refusal_words(m.exc.raised) if getattr(m.exc, "raised", None) else None for m in groups[k]}
        if len(said) == 1 and (what := said.pop()) in refusals:
            out.setdefault(what, []).extend(groups.pop(k))
    return out


def _join_ambiguous(groups: dict) -> None:
    """A formula named on cases that cannot tell it from another formula found (every case is
    reproduced by that one too: its members list it among their alternatives) joins that one,
    where some case of that one tells them apart (heldout8 m11: units whose means are all 0 make
    Eq. 6 over the whole batch and the mean per unit alike)."""
    named = [k for k in groups if k[0] == Category.FORMULA]
    into = {}
    for k in named:
        also = set.intersection(*(set(getattr(m.exc, "formula_alternatives", ())) for m in groups[k]))
        told = [j for j in named if j != k and j[2] in also
                and any(k[2] not in getattr(m.exc, "formula_alternatives", ()) for m in groups[j])]
        if told:
            into[k] = told[0]
    for k in into:
        j, seen = into[k], {k}
        while j in into and j not in seen:  # (a chain: to its end)
            seen.add(j)
            j = into[j]
        if j not in seen:
            groups[j].extend(groups.pop(k))


def _refile(found: list) -> list:
    """A zero or non-finite output at extreme magnitudes that no threshold ties to a magnitude (it
    still fails scaled to ordinary ones, or cannot be scaled) joins the finding of its category at
    ordinary magnitudes, else the formula's: the same defect, not a second one (a loop that skips
    the last group zeroes it at any magnitude)."""
    kept = []
    for f in found:
        into = None
        if f.regime == "extreme magnitudes" and f.threshold is None and isinstance(f.example, Case) and \
                f.category in (Category.SILENT_ZERO, Category.NON_FINITE):  # (ranks': no threshold sought)
            into = next((g for g in found if g.regime == "ordinary magnitudes" and g.category == f.category),
                        next((g for g in found if g.category == Category.FORMULA), None))
        elif isinstance(f.example, DistCase) and f.regime == "extreme magnitudes":  # an overflow one process shows
            into = next((g for g in found if isinstance(g.example, Case) and g.category == f.category
                         and g.cause == f.cause), None)
        if into is None:
            kept.append(f)
        else:
            into.rows, into.count = list(dict.fromkeys(into.rows + f.rows)), into.count + f.count
    return kept


def _lowest(members: list, what: str, tries: int = 4):
    """(threshold, input, failure, example) of the lowest threshold among the first ``tries``
    failures by magnitude whose threshold can be located (not 1e30 beside 1e-30: inexact)."""
    one = [m for m in members if isinstance(m.case, Case)] or members  # (no threshold is sought on ranks)
    best = (None, "", one[0], one[0].case)
    for m in sorted(one, key=lambda m: (_top(m.case, what), _size(m.case)))[:tries]:
        for inp in (what, "weights" if what == "rewards" else "rewards"):
            thr, example = threshold(m, m.case, inp)
            if thr is not None:
                if best[0] is None or thr < best[0]:
                    best = (thr, inp, m, example)
                break
    return best


def _top(case, inp: str) -> float:
    if isinstance(case, DistCase):
        return max((_top(s, inp) for s in case.shards if s.n), default=0.0)
    values = (case.weights or ()) if inp == "weights" else [v for row in case.rewards for v in row]
    return max((abs(v) for v in values if math.isfinite(v)), default=0.0)


def mechanism(case: Case, subject, category=Category.NON_FINITE, at_threshold: bool = True) -> str:
    """What overflows the code's working precision on ``case`` (failing at its threshold; a case
    no threshold was sought for: ``at_threshold`` False): of the exact intermediates of Eq. 4, 7
    and 6 (under the convention judged), the one that crossed the largest finite value at this
    magnitude: the smallest beyond it within a factor 16 (one far beyond it crossed at a lower
    magnitude, where the code did not fail). Where none did but one comes within a factor 16
    below, the code's own arithmetic overflows, and the nearest is named; else the smallest beyond
    the range, however far (a code whose formula is not the paper's); "" where none is. Of those
    at this magnitude, first those whose overflow gives what the code returned (``category``):
    zeros from a std turned inf (squared deviations, a std), NaN or inf from the others. With no
    threshold, the largest beyond the range of those that give what the code returned (the first
    to cross as the inputs grow), else as above. A sum whose terms of one sign add up beyond the
    range while the sum does not overflows in some summation orders. Exact: mpmath numbers,
    beyond float64's range."""
    conv = subject.judged() if hasattr(subject, "judged") else get_convention("spec")
    dtype = getattr(subject, "precision", None) or conv.native_dtype
    big = max(_top(case, "rewards"), _top(case, "weights"))
    for wider in ("float32", "float64"):  # inputs far beyond its range: the code computes wider than it returns
        if big > 2.0 ** 16 * largest_finite(dtype) and largest_finite(wider) > largest_finite(dtype):
            dtype = wider
    top = mpmath.mpf(largest_finite(dtype))
    wide = np.vectorize(lambda v: mpmath.mpf(float(v)), otypes=[object])
    r, labels = wide(case.rewards_array()), case.labels()
    found = []  # (value, what, its verb, in some orders only, its overflow gives zeros), in a code's order

    def stats(x, names, ddof, tokens=None):  # a sum, its parts of one sign, the squared deviations, the std
        t = np.ones(x.shape[0], dtype=object) if tokens is None else wide(tokens)
        total, n = (t[:, None] * x).sum(axis=0), t.sum()
        squares = (t[:, None] * (x - total / n) ** 2).sum(axis=0)
        found.extend([(max(abs(v) for v in total), names[0], "overflows", False, False),
                      (max(_one_sign(t[:, None] * x)), names[0], "overflows", True, False),
                      (max(squares), names[1], "overflow", False, True),  # a std turned inf: zeros
                      (max(mpmath.sqrt(q / max(n - ddof, 1)) for q in squares), names[2], "overflows", False, True)])

    for g in np.unique(labels):
        x = r[labels == g]
        stats(x, ("a group's sum of the rewards (Eq. 4's mean)", "the squared deviations of Eq. 4 (its std)",
                  "Eq. 4's std"), conv.group_ddof)
        found.append((max((x * x).sum(axis=0)), "the squares of the rewards (sum x^2: a one-pass variance)",
                      "overflow", False, False))
    tokens = subject.token_counts(case) if hasattr(subject, "token_counts") else None  # verl: Eq. 6 over tokens
    exp = expected(case, conv.name, tokens)
    if exp.result is not None:
        w = wide(np.ones(case.k) if case.weights is None else np.asarray(case.weights, dtype=np.float64))
        wz = wide(exp.result.z.float64) * w
        found += [(max(abs(v) for v in wz.reshape(-1)), "Eq. 7's terms w_k z_k", "overflow", False, False),
                  (max(abs(v) for v in wz.sum(axis=1)), "Eq. 7's sum c = sum_k w_k z_k", "overflows", False, False),
                  (max(_one_sign(wz.T)), "Eq. 7's sum c = sum_k w_k z_k", "overflows", True, False)]
        if conv.whiten != "none":
            over = "the batch" if tokens is None else "the batch's tokens"
            stats(wz.sum(axis=1)[:, None], (f"the sum of c over {over} (Eq. 6's mean)",
                                            "the squared deviations of Eq. 6 (its std)", "Eq. 6's std"),
                  conv.whiten_ddof, tokens)
    unlike = lambda f: f[4] != (category == Category.SILENT_ZERO)  # noqa: E731 - gives another symptom
    far = [f for f in found if top < f[0]]  # at a threshold: crossed long before the code failed, no symptom to read
    if not at_threshold:  # of those that give the symptom seen, the one that crossed first as the inputs grew
        far = [max((f for f in far if not unlike(f)), key=lambda f: f[0])] if any(not unlike(f) for f in far) else []
    crossed = [f for f in far if f[0] <= 16 * top or not at_threshold]
    near = [f for f in found if top / 16 <= f[0] <= top]
    if crossed or not near:
        if not crossed and not far:
            return ""
        value, what, verb, orders, _ = (min(crossed, key=lambda f: (unlike(f), f[0])) if crossed
                                        else min(far, key=lambda f: f[0]))
        if orders:
            return (f"{what} {verb} {dtype} in some summation orders (its terms of one sign add up to "
                    f"{float(value):.3g}, beyond {float(top):.3g})")
        return f"{what} {verb} {dtype} (beyond {float(top):.3g})"
    value, what, *_ = max(near, key=lambda f: (not unlike(f), f[0]))
    return (f"the code's own arithmetic overflows {dtype} (the nearest exact intermediate, {what}, "
            f"reaches {float(value):.3g})")


def _one_sign(x: np.ndarray) -> np.ndarray:
    """The larger of a sum's parts of one sign, along axis 0: what a partial sum reaches in the
    worst order."""
    return np.maximum(np.where(x > 0, x, 0).sum(axis=0), np.where(x < 0, -x, 0).sum(axis=0))


def from_probes(prof, subject) -> "Finding | None":
    """The probes' formula as a finding, where no drawn case showed it (a clip that only the
    probes' outlier reaches): its example is the probe the code is farthest from the paper on."""
    if prof is None or not prof.formula or not prof.outputs:
        return None
    case, out = max(prof.outputs, key=lambda co: float(np.max(np.abs(co[1] - formulas.evaluate(co[0], formulas.PAPER)))))
    paper = formulas.evaluate(case, formulas.PAPER)
    i = int(np.argmax(np.abs(out - paper)))
    said = f"[{i}] returned {out[i]:.9g}, the paper's formula gives {paper[i]:.9g} (a probe, conformance/probes.py)"
    return Finding(Category.FORMULA, "ordinary magnitudes", prof.formula, ["probes"], 1, case, said,
                   repro(subject, case, "plain"), said)


def _size(case) -> tuple:
    case = case[0] if isinstance(case, tuple) else case
    rows = sum(s.n for s in case.shards) if isinstance(case, DistCase) else case.n * max(case.k, 1)
    return rows, len(case.dumps())
