"""Running a property against an implementation: which cases it is checked on, in what order,
and what is reported when one fails.

Two ways, chosen by the loaded profile (``conformance.profiles``):

* **hypothesis's search** (``ci``, ``deep``: the suite's own run, ``pytest conformance/``):
  generation, hill-climbing on the error ratio (``target``) and shrinking, all steered by what
  the graded code returns. It hunts best, but two machines whose arithmetic differs in the last
  bits (a peer's numpy summation under another SIMD width) can be led to different cases.
* **cases drawn first** (``grade``, what ``gdpo check`` loads, and the negative controls):
  the pinned examples the call shape can express, then ``max_examples`` cases drawn by
  hypothesis from the property's strategy with the property's own seed, by a test body that
  records and never fails (:func:`planned_cases`). The list is a function of the strategy, the
  call shape's context, the seed and hypothesis's version alone: never of what the graded code
  returns (``tests/test_machine_independence.py`` proves it, against hypothesis's search as the
  negative control). Every case is then checked in order; what follows a failure is the judge's
  own reduction (:func:`reduce`), a fixed sequence of simplifications each kept only if the case
  still fails in the same category, bounded in calls, not seconds. What stays machine-dependent is
  the graded code's own arithmetic on a given case; the report says so (``docs/grading.md``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, example, given, reject, seed, settings
from hypothesis.errors import UnsatisfiedAssumption

from conformance.profiles import no_local_constants
from conformance import regressions
from conformance import strategies as S
from conformance.cases import Case, DistCase
from conformance.compare import decimal
from conformance.error_cases import error_cases
from conformance.judge import ConformanceFailure
from conformance.verdicts import Category
from conformance.properties import BY_NAME, Property
from conformance.subject import Subject


def property_seed(prop: Property) -> int:
    """The property's own seed: its examples do not move when the suite's code is edited
    (``derandomize`` alone would hash the test's source)."""
    return zlib.crc32(prop.name.encode())


def expressible(case, ctx: S.Context) -> bool:
    """Can this call shape express a pinned example?"""
    shards = case.shards if isinstance(case, DistCase) else (case,)
    for c in shards:
        if c.group_ids is not None and not ctx.labels:
            return False
        if c.segment_sizes is not None and not ctx.units:
            return False
        if c.eps is not None and not ctx.eps:
            return False
        if c.dtype in S.DTYPES and c.dtype not in ctx.input_dtypes:
            return False
        if c.out_dtype not in ctx.out_dtypes:
            return False
        if c.weights is not None and ctx.weights_dtype != "float64" and \
                not np.array_equal(S.round_to(c.weights, ctx.weights_dtype), np.array(c.weights)):
            return False
    return True


# --------------------------------------------------------------- hypothesis's search


def build_test(prop: Property, subject: Subject, config: settings | None = None, record: list | None = None,
               budget_s: float | None = None):
    """The hypothesis test of ``prop`` against ``subject`` (call it to run).

    ``record``, if given, receives every failing case in order (the last one is
    the minimal example hypothesis reports). ``budget_s`` bounds shrinking: once
    that many seconds have passed since the run began and a case has failed, the
    run stops (:class:`ShrinkBudgetSpent`)."""
    ctx = subject.context()
    strategy = prop.strategy(ctx, subject)
    start = time.monotonic()

    def run(case):
        if record and budget_s is not None and time.monotonic() - start > budget_s:
            raise ShrinkBudgetSpent
        if not subject.inside(case):
            reject()  # outside the declared domain: not drawn
        try:
            prop.check(subject, case, prop.name)
        except UnsatisfiedAssumption:
            raise  # a case discarded (outside the declared domain)
        except Exception as exc:
            if record is not None:
                record.append(getattr(exc, "case", case))
            raise

    test = given(case=strategy)(run)
    for text in reversed(prop.examples):
        case = regressions.load(text)
        if expressible(case, ctx):
            test = example(case=case)(test)
    if config is not None:
        test = config(test)
    return test


def control_settings() -> settings:
    """The ci profile (whatever profile is loaded), without shrinking or hill-climbing
    (the target phase can spend thousands of calls on a near miss): a verdict, fast."""
    return settings(settings.get_profile("ci"), phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck), report_multiple_bugs=False, print_blob=False)


#: Seconds into a property's run under hypothesis's search after which, once a case has failed,
#: shrinking stops (hypothesis allows itself five minutes of shrinking; a case of several hundred
#: rows can shrink for longer). The smallest failing case found by then is reported.
SHRINK_BUDGET_S = 60.0


class ShrinkBudgetSpent(BaseException):
    """Raised by a property's run function once its shrink budget is spent. Not an Exception,
    so hypothesis ends the run at once (no more shrinking, no final replay, so no "Flaky" for
    a deterministic implementation); the caller reports the smallest failing case recorded."""


def _search(prop: Property, subject: Subject) -> None:
    record: list = []
    config = None
    if not prop.hill_climb:
        loaded = settings()  # the loaded profile
        config = settings(loaded, phases=[ph for ph in loaded.phases if ph != Phase.target])
    test = build_test(prop, subject, config, record=record, budget_s=SHRINK_BUDGET_S)
    if settings().derandomize:
        test = seed(property_seed(prop))(test)
    try:
        test()
    except ShrinkBudgetSpent:  # the budget ran out while shrinking: report the smallest case found
        _smallest_found(prop, subject, record)


def _smallest_found(prop: Property, subject: Subject, record: list) -> None:
    """Raise the failure of the last (smallest) failing case found before the budget ran out."""
    try:
        prop.check(subject, record[-1], prop.name)
    except ConformanceFailure as failure:
        raise failure.restated(f"{failure}\n  (shrinking stopped at its budget ({SHRINK_BUDGET_S:g} s): "
                               "the smallest failing case found by then)") from None
    raise AssertionError(f"{prop.name}: a case failed, then passed when checked again (the implementation is "
                         f"not deterministic): {record[-1]!r}"[:2000])


# --------------------------------------------------------------- cases drawn first

#: Does the loaded profile draw its cases first (set by the plugin from ``conformance.profiles``)?
DRAW_FIRST = False
#: Checks the reduction of one failure may spend (a count: the same reduction on any machine).
REDUCE_CALLS = 120
_DRAWN: dict = {}


def draw(name: str, strategy, max_examples: int | None = None, key: tuple = ()) -> tuple:
    """``max_examples`` (default: the loaded profile's) cases drawn from ``strategy`` with the seed of
    the property ``name``, by a body that records and never fails: nothing the graded code returns
    can change them. Memoised on ``(name, key, max_examples)``, ``key`` being what the strategy is a
    function of (a property's strategy: the call shape and its context, never the convention): the
    negative controls, and peers of one call shape, share them."""
    n = settings().max_examples if max_examples is None else max_examples
    memo = (name, key, n)
    if memo not in _DRAWN:
        out: list = []

        def record(case):
            out.append(case)

        config = settings(settings.get_profile("ci"), max_examples=n, phases=[Phase.generate],
                          suppress_health_check=list(HealthCheck), database=None, print_blob=False)
        test = seed(zlib.crc32(name.encode()))(config(given(case=strategy)(record)))
        with no_local_constants():
            test()
        _DRAWN[memo] = tuple(out)
    return _DRAWN[memo]


def adapt(case, subject: Subject):
    """A pinned example as the call shape passes it: a shape that passes no output dtype (trl, verl)
    gets its own, and rewards its dtypes cannot carry go in the first one that holds them exactly."""
    if subject.shape not in ("trl", "verl") or not isinstance(case, Case):
        return case
    ctx = subject.context()
    changes = {"out_dtype": ctx.out_dtypes[0]}
    if case.dtype in S.DTYPES and case.dtype not in ctx.input_dtypes and case.rewards:
        r = case.rewards_array()
        held = [d for d in ctx.input_dtypes if d in S.DTYPES and np.array_equal(S.round_to(r, d), r, equal_nan=True)]
        if held:
            changes["dtype"] = held[0]
    return dataclasses.replace(case, **changes)


def pinned_cases(prop: Property, subject: Subject, error: str | None = None) -> list:
    """The property's pinned examples (``conformance/regressions.json``) the call shape can express
    (``error``: only those of that error case)."""
    ctx = subject.context()
    return [c for c in (adapt(regressions.load(t), subject) for t in prop.examples)
            if expressible(c, ctx) and (error is None or c.note == f"error:{error}")]


def planned_cases(prop: Property, subject: Subject, max_examples: int | None = None) -> list:
    """Every case a drawn-first run checks, in order: the pinned examples, then the drawn ones;
    those outside the declared domain (``Subject.inside``) left out."""
    return _planned(prop.name, pinned_cases(prop, subject), prop.strategy(subject.context(), subject), subject,
                    max_examples)


def _planned(name: str, pinned: list, strategy, subject: Subject, max_examples: int | None) -> list:
    """The pinned cases inside the declared domain, then the first ``max_examples`` cases drawn
    for ``name`` inside it: where the domain leaves out some, more are drawn (twice as many, up to
    8 times), so that a narrow domain is graded on as many cases as a wide one."""
    n = settings().max_examples if max_examples is None else max_examples
    key = (repr(subject.context()), subject.shape)
    budget = n
    while True:
        kept = [c for c in draw(name, strategy, budget, key) if subject.inside(c)]
        if len(kept) >= n or budget >= 8 * n:
            return [c for c in pinned if subject.inside(c)] + kept[:n]
        budget *= 2


def row_cases(row: str, subject: Subject, max_examples: int | None = None) -> list:
    """The cases a drawn-first run of the summary row ``row`` (``plain``, ``errors:nan_reward``) checks;
    an error case's row (``conformance/test_errors.py``): its pinned examples the call shape can
    express, then the cases drawn for it."""
    if not row.startswith("errors:"):
        return planned_cases(BY_NAME[row], subject, max_examples)
    name = row.split(":", 1)[1]
    pinned = [(c,) for c in pinned_cases(BY_NAME["errors"], subject, name)]
    return _planned(row, pinned, error_cases(subject.context(), subject.shape, names={name}), subject, max_examples)


def case_text(case) -> str:
    """A case's exact JSON (tuples of cases, the errors property's, as a list)."""
    if isinstance(case, tuple):
        return "[" + ",".join(case_text(c) for c in case) + "]"
    return case.dumps()


def digest(cases) -> str:
    """A short digest of a list of cases (their exact JSON): what ``gdpo check --json`` and the
    peers page record, so that two gradings can be shown to have checked the same cases."""
    h = hashlib.sha256()
    for c in cases:
        h.update(case_text(c).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def failures(cases, check, catch=Exception):
    """``(index, failure)`` of every case ``check`` rejects, in order (a case discarded by an
    assumption is passed over; a failure that is not a ``catch`` is raised as it is)."""
    for i, case in enumerate(cases):
        try:
            check(case)
        except UnsatisfiedAssumption:
            continue
        except catch as exc:
            yield i, exc


def grade(prop: Property, subject: Subject) -> None:
    """Check ``prop`` on its planned cases (:func:`grade_cases`)."""
    grade_cases(subject, planned_cases(prop, subject), lambda case: prop.check(subject, case, prop.name))


def grade_cases(subject: Subject, cases, check) -> None:
    """Check every case (a failure does not end the run: the others are judged too); raise the
    first failure, reduced, noting how many of the cases failed and in which categories (a failure
    that is no ``ConformanceFailure``, a crash of the judge or of the graded code outside a call, is
    raised as it is)."""
    found = list(failures(cases, check))
    if not found:
        return
    index, exc = found[0]
    if not isinstance(exc, ConformanceFailure):
        raise exc
    reduced, calls = reduce(check, subject, getattr(exc, "case", cases[index]), exc)
    cats = ", ".join(str(c) for c in dict.fromkeys(getattr(e, "category", None) for _, e in found))
    note = (f"\n  ({len(found)} of {len(cases)} cases failed (categories: {cats}); the first, "
            f"case {index}, is shown")
    note += f", reduced by the judge in {calls} checks)" if reduced is not exc else ")"
    raise reduced.restated(f"{reduced}{note}") from None


# --------------------------------------------------------------- reduction


def fails_alike(check, case, failure: ConformanceFailure) -> ConformanceFailure | None:
    """The failure of ``case`` if it fails as ``failure`` does, else None: in its category and,
    for a formula, naming the same formula, no more ambiguously (a smaller case that several
    variants of the catalogue reproduce alike would name one of them as a guess: one group of
    two rewards cannot tell a missing Eq. 6 from an Eq. 4 without its division by the std)."""
    try:
        check(case)
    except ConformanceFailure as exc:
        if exc.category != failure.category:
            return None
        if exc.category == Category.FORMULA and (
                getattr(exc, "formula", None) != getattr(failure, "formula", None)
                or len(getattr(exc, "formula_alternatives", ())) > len(getattr(failure, "formula_alternatives", ()))
                or (exc.worst_ulps or 0.0) < (failure.worst_ulps or 0.0) / 16):
            return None  # an example of a formula keeps its difference as plain as the case it came from
        return exc
    except Exception:  # noqa: BLE001 - another kind of failure is another finding
        return None
    return None


def _valid(case: Case) -> bool:
    """A reduction keeps the case inside the property's domain: at least one row and column,
    groups of two or more samples, units of 0 or 2 or more samples that cover the batch."""
    if case.n == 0 or case.k == 0:
        return False
    _, counts = np.unique(case.labels(), return_counts=True)
    if counts.min() < 2:
        return False
    if case.segment_sizes is not None:
        sizes = case.segment_sizes
        if sum(sizes) != case.n or any(s == 1 or s < 0 for s in sizes) or not sizes:
            return False
    return True


def _keep_rows(case: Case, keep: np.ndarray) -> Case:
    """The case with only the rows ``keep`` (a boolean mask); labels and units follow the rows."""
    rows = tuple(r for r, k in zip(case.rewards, keep) if k)
    changes = {"rewards": rows}
    if case.group_ids is not None:
        changes["group_ids"] = tuple(g for g, k in zip(case.group_ids, keep) if k)
    elif case.group_size is not None:
        labels = case.labels()[keep]
        _, sizes = np.unique(labels, return_counts=True)
        if len(set(sizes.tolist())) != 1:
            changes["group_ids"] = tuple(int(x) for x in labels)
            changes["group_size"] = None
        else:
            changes["group_size"] = int(sizes[0]) if len(sizes) else case.group_size
    if case.segment_sizes is not None:
        units = case.unit_ids()[keep]
        changes["segment_sizes"] = tuple(int((units == u).sum()) for u in range(len(case.segment_sizes)))
    return dataclasses.replace(case, **changes)


def _candidates(case: Case):
    """Simpler cases to try, most drastic first: fewer groups, no units, fewer columns, smaller
    groups, no weights or eps, then simpler values (0, 1, a power of ten)."""
    labels = case.labels()
    groups = list(dict.fromkeys(labels.tolist()))
    chunk = len(groups) // 2
    while chunk >= 1:  # drop runs of whole groups (halves first)
        for start in range(0, len(groups), chunk):
            gone = set(groups[start:start + chunk])
            if len(gone) < len(groups):
                yield _keep_rows(case, ~np.isin(labels, list(gone)))
        chunk //= 2
    if case.segment_sizes is not None:
        yield dataclasses.replace(case, segment_sizes=None)
        nonzero = tuple(s for s in case.segment_sizes if s)
        if nonzero != case.segment_sizes:
            yield dataclasses.replace(case, segment_sizes=nonzero)
    if case.k > 1:
        for k in range(case.k):
            yield dataclasses.replace(
                case, rewards=tuple(r[:k] + r[k + 1:] for r in case.rewards),
                weights=None if case.weights is None else case.weights[:k] + case.weights[k + 1:])
    uniq, counts = np.unique(labels, return_counts=True)
    if counts.max() > 2:  # every group halved (its first members kept), then one member shorter
        for keep_of in (lambda c: max(2, c // 2), lambda c: c - 1):
            keep = np.ones(case.n, bool)
            for g, c in zip(uniq, counts):
                if c > 2:
                    keep[np.flatnonzero(labels == g)[keep_of(c):]] = False
            yield _keep_rows(case, keep)
    if case.weights is not None:
        yield dataclasses.replace(case, weights=None)
    if case.eps is not None:
        yield dataclasses.replace(case, eps=None)
    values = list(dict.fromkeys(v for r in case.rewards for v in r))
    for v in values:  # every occurrence of one value at once: runs and copies stay runs and copies
        for simpler in _simpler(v, case.dtype):
            yield dataclasses.replace(case, rewards=tuple(tuple(simpler if x == v else x for x in r)
                                                          for r in case.rewards))
    if case.weights is not None:
        for k, w in enumerate(case.weights):
            for simpler in _simpler(w, "float64"):
                yield dataclasses.replace(case, weights=case.weights[:k] + (simpler,) + case.weights[k + 1:])


def _simpler(v: float, dtype: str) -> list:
    """Values simpler than ``v`` that ``dtype`` holds exactly: 0, +-1, then the power of ten
    nearest it (in ``dtype``)."""
    if not math.isfinite(v) or v == 0.0:
        return []
    out = [0.0, math.copysign(1.0, v)]
    if abs(v) > 1e-300:
        e = math.log10(abs(v))
        for p in (float(f"1e{math.floor(e)}"), float(f"1e{math.ceil(e)}")):  # the powers of ten around it (inf
            # beyond float64, where 10.0 ** 309 would raise)
            if math.isfinite(p) and (dtype not in S.DTYPES or p <= S.DTYPES[dtype].max):
                out.append(math.copysign(float(S.round_to([p], dtype)[0]) if dtype in S.DTYPES else p, v))
    return [x for x in dict.fromkeys(out) if x != v and math.isfinite(x) and
            (dtype not in S.DTYPES or float(S.round_to([x], dtype)[0]) == x) and _score(x, dtype) < _score(v, dtype)]


def _score(v: float, dtype: str = "float64") -> float:
    """How complicated a value reads: 0 < 1 < the length of its shortest decimal in ``dtype``."""
    if v == 0.0:
        return 0.0
    if abs(v) == 1.0:
        return 1.0
    return 2.0 + len(decimal(v, dtype).lstrip("-"))


def reduce(check, subject: Subject, case, failure: ConformanceFailure,
           budget: int | None = None) -> tuple[ConformanceFailure, int]:
    """The failure of the smallest case the judge's reduction reaches from ``case`` (a
    :class:`Case` of values; an error case, a malformed call or a multi-rank case is returned as it
    is), each step kept only where the case still fails in ``failure``'s category, and the checks
    spent (at most ``budget``). ``check``: the property's check of one case."""
    budget = REDUCE_CALLS if budget is None else budget
    if not isinstance(case, Case) or not case.rewards or case.variant or case.note.startswith("error:"):
        return failure, 0
    calls, best, best_exc = 0, case, failure
    progress = True
    while progress and calls < budget:
        progress = False
        for cand in _candidates(best):
            if calls >= budget:
                break
            if not _valid(cand) or not expressible(cand, subject.context()) or not subject.inside(cand):
                continue
            calls += 1
            exc = fails_alike(check, cand, failure)
            if exc is not None:
                best, best_exc, progress = cand, exc, True
                break
    return best_exc, calls


# --------------------------------------------------------------- pytest


def run_for_pytest(prop: Property, subject: Subject) -> None:
    """Run ``prop`` against the implementation under test, under the loaded profile (cases drawn
    first, or hypothesis's search); a property the call shape or convention cannot express is
    skipped with the reason."""
    why = subject.unsupported(prop.needs)
    if why:
        pytest.skip(why)
    if DRAW_FIRST:
        grade(prop, subject)
    else:
        _search(prop, subject)
