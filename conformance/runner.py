"""Running a property against an implementation: which cases, in what order, what a failure reports.

Two ways, by the loaded profile (``conformance.profiles``): **hypothesis's search** (``ci``,
``deep``: generation, ``target`` hill-climbing and shrinking, steered by what the graded code
returns, so two machines whose last bits differ can be led to different cases), or **cases drawn
first** (``grade``, ``gdpo check``, the negative controls: docs/grading.md, "The run";
:func:`planned_cases`), every one checked up to a hang (:func:`failures`), a failure then
reduced by the judge (:func:`reduce`), a fixed sequence of simplifications bounded in calls.
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
from conformance.judge import ConformanceFailure, cause_line, refusal_words
from conformance.verdicts import Category
from conformance.properties import BY_NAME, Property
from conformance.subject import Subject


def property_seed(prop: Property) -> int:
    """The property's own seed (``derandomize`` alone would hash the test's source)."""
    return zlib.crc32(prop.name.encode())


def expressible(case, ctx: S.Context) -> bool:
    """Can this call shape express a pinned example?"""
    return all((c.group_ids is None or ctx.labels) and (c.segment_sizes is None or ctx.units)
               and (c.eps is None or ctx.eps) and (c.dtype not in S.DTYPES or c.dtype in ctx.input_dtypes)
               and c.out_dtype in ctx.out_dtypes
               and (c.weights is None or ctx.weights_dtype == "float64"
                    or np.array_equal(S.round_to(c.weights, ctx.weights_dtype), np.array(c.weights)))
               for c in (case.shards if isinstance(case, DistCase) else (case,)))


def build_test(prop: Property, subject: Subject, config: settings | None = None, record: list | None = None,
               budget_s: float | None = None):
    """The hypothesis test of ``prop`` against ``subject`` (call it to run). ``record`` receives
    every failing case in order (the last is the smallest); once a case has failed and
    ``budget_s`` seconds have passed, the run stops (:class:`ShrinkBudgetSpent`)."""
    ctx, start = subject.context(), time.monotonic()

    def run(case):
        if record and budget_s is not None and time.monotonic() - start > budget_s:
            raise ShrinkBudgetSpent
        if not subject.inside(case):
            reject()  # outside the declared domain: not drawn
        try:
            prop.check(subject, case, prop.name)
        except UnsatisfiedAssumption:
            raise
        except Exception as exc:
            if record is not None:
                record.append(getattr(exc, "case", case))
            raise

    test = given(case=prop.strategy(ctx, subject))(run)
    for case in reversed([c for c in map(regressions.load, prop.examples) if expressible(c, ctx)]):
        test = example(case=case)(test)
    return test if config is None else config(test)


def control_settings() -> settings:
    """The ci profile without shrinking or hill-climbing (thousands of calls on a near miss)."""
    return settings(settings.get_profile("ci"), phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck), report_multiple_bugs=False, print_blob=False)


#: Seconds into a search after which, once a case has failed, shrinking stops (hypothesis allows
#: itself five minutes; a case of hundreds of rows can shrink longer): the smallest case is reported.
SHRINK_BUDGET_S = 60.0


class ShrinkBudgetSpent(BaseException):
    """Not an Exception, so hypothesis ends the run at once (no final replay, so no "Flaky")."""


def _search(prop: Property, subject: Subject) -> None:
    record: list = []
    loaded = settings()
    config = None if prop.hill_climb else settings(loaded, phases=[ph for ph in loaded.phases if ph != Phase.target])
    test = build_test(prop, subject, config, record=record, budget_s=SHRINK_BUDGET_S)
    if loaded.derandomize:
        test = seed(property_seed(prop))(test)
    try:
        return test()
    except ShrinkBudgetSpent:
        pass  # the budget ran out: the smallest failing case found is checked again and reported
    try:
        prop.check(subject, record[-1], prop.name)
    except ConformanceFailure as failure:
        raise failure.restated(f"{failure}\n  (shrinking stopped at its budget ({SHRINK_BUDGET_S:g} s): "
                               "the smallest failing case found by then)") from None
    raise AssertionError(f"{prop.name}: a case failed, then passed when checked again (the implementation is "
                         f"not deterministic): {record[-1]!r}"[:2000])


#: Does the loaded profile draw its cases first (set by the plugin from ``conformance.profiles``)?
DRAW_FIRST = False
#: Checks the reduction of one failure may spend (a count: the same reduction on any machine).
REDUCE_CALLS = 120
_DRAWN: dict = {}


def draw(name: str, strategy, max_examples: int | None = None, key: tuple = ()) -> tuple:
    """``max_examples`` (default: the loaded profile's) cases drawn from ``strategy`` with the seed of
    ``name`` by a body that never fails, memoised on ``(name, key, max_examples)``; ``key``: what the
    strategy is a function of (the call shape and its context), so controls and peers share them."""
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
    """A pinned example as the call shape passes it: one unit as no segment_sizes where the code
    takes none (as :func:`conformance.strategies.dist_cases` draws them); in a shape with no
    output dtype (trl, verl), its own output dtype, rewards in the first of its dtypes that holds
    them exactly."""
    ctx = subject.context()
    if not ctx.units:
        case = _one_unit_as_none(case)
    if subject.shape not in ("trl", "verl") or not isinstance(case, Case):
        return case
    changes = {"out_dtype": ctx.out_dtypes[0]}
    if case.dtype in S.DTYPES and case.dtype not in ctx.input_dtypes and case.rewards:
        r = case.rewards_array()
        held = [d for d in ctx.input_dtypes if d in S.DTYPES and np.array_equal(S.round_to(r, d), r, equal_nan=True)]
        if held:
            changes["dtype"] = held[0]
    return dataclasses.replace(case, **changes)


def _one_unit_as_none(case):
    """``case`` with one whitening unit (on every rank) passed as no segment_sizes."""
    shards = case.shards if isinstance(case, DistCase) else (case,)
    if any(s.segment_sizes is not None and len(s.segment_sizes) != 1 for s in shards):
        return case
    shards = tuple(dataclasses.replace(s, segment_sizes=None) for s in shards)
    return dataclasses.replace(case, shards=shards) if isinstance(case, DistCase) else shards[0]


def pinned_cases(prop: Property, subject: Subject, error: str | None = None) -> list:
    """The property's pinned examples the call shape expresses (``error``: of that error case)."""
    ctx = subject.context()
    return [c for c in (adapt(regressions.load(t), subject) for t in prop.examples)
            if expressible(c, ctx) and (error is None or c.note == f"error:{error}")]


def planned_cases(prop: Property, subject: Subject, max_examples: int | None = None) -> list:
    """Every case a drawn-first run checks, in order: the pinned examples, then the drawn ones."""
    return _planned(prop.name, pinned_cases(prop, subject), prop.strategy(subject.context(), subject), subject,
                    max_examples)


def _planned(name: str, pinned: list, strategy, subject: Subject, max_examples: int | None) -> list:
    """The pinned cases inside the declared domain, then the first ``max_examples`` drawn for
    ``name`` inside it (more drawn, up to 8 times as many, so a narrow domain gets as many)."""
    n = settings().max_examples if max_examples is None else max_examples
    key = (repr(subject.context()), subject.shape)
    budget = n
    while True:
        kept = [c for c in draw(name, strategy, budget, key) if subject.inside(c)]
        if len(kept) >= n or budget >= 8 * n:
            return [c for c in pinned if subject.inside(c)] + kept[:n]
        budget *= 2


def row_cases(row: str, subject: Subject, max_examples: int | None = None) -> list:
    """The cases a drawn-first run of the summary row ``row`` (``plain``, ``errors:nan_reward``) checks."""
    if not row.startswith("errors:"):
        return planned_cases(BY_NAME[row], subject, max_examples)
    name = row.split(":", 1)[1]
    pinned = [(c,) for c in pinned_cases(BY_NAME["errors"], subject, name)]
    return _planned(row, pinned, error_cases(subject.context(), subject.shape, names={name}), subject, max_examples)


def row_check(row: str, subject: Subject, max_examples: int | None = None) -> tuple:
    """(the cases a drawn-first run of the row ``row`` checks, its property's check of one case)."""
    prop = BY_NAME[row.split(":", 1)[0]]
    return row_cases(row, subject, max_examples), lambda case: prop.check(subject, case, prop.name)


def case_text(case) -> str:
    """A case's exact JSON (tuples of cases, the errors property's, as a list)."""
    if isinstance(case, tuple):
        return "[" + ",".join(case_text(c) for c in case) + "]"
    return case.dumps()


def digest(cases) -> str:
    """A short digest of a list of cases' exact JSON: two gradings checked the same cases."""
    return hashlib.sha256("".join(case_text(c) + "\n" for c in cases).encode()).hexdigest()[:16]


def failures(cases, check, catch=Exception):
    """``(index, failure)`` of every case ``check`` rejects, in order, up to the first hang (ranks
    that did not return: each hang costs the pool of ranks a restart, and the later cases are not
    checked, :func:`unchecked`); a case discarded by an assumption is passed over, a failure that
    is not a ``catch`` is raised as it is."""
    for i, case in enumerate(cases):
        try:
            check(case)
        except UnsatisfiedAssumption:
            continue
        except catch as exc:
            yield i, exc
            if getattr(exc, "hang", False):
                return


def unchecked(cases, found: list) -> int:
    """How many of ``cases`` :func:`failures` left unchecked (``found``: its list): those after a hang."""
    return len(cases) - found[-1][0] - 1 if found and getattr(found[-1][1], "hang", False) else 0


def grade_cases(subject: Subject, cases, check) -> None:
    """Check every case; raise the first failure, reduced, noting how many failed in which
    categories (a crash that is no ``ConformanceFailure`` is raised as it is)."""
    found = list(failures(cases, check))
    if not found:
        return
    index, exc = found[0]
    if not isinstance(exc, ConformanceFailure):
        raise exc
    reduced, calls = reduce(check, subject, getattr(exc, "case", cases[index]), exc)
    cats = ", ".join(str(c) for c in dict.fromkeys(getattr(e, "category", None) for _, e in found))
    left = unchecked(cases, found)
    note = (f"\n  ({len(found)} of {len(cases)} cases failed (categories: {cats})"
            + (f", the last a hang: the {left} after it not checked" if left else "")
            + f"; the first, case {index}, is shown")
    note += f", reduced by the judge in {calls} checks)" if reduced is not exc else ")"
    raise reduced.restated(f"{reduced}{note}") from None


def fails_alike(check, case, failure: ConformanceFailure) -> ConformanceFailure | None:
    """The failure of ``case`` if it fails as ``failure`` does, else None: in its category and, for
    a formula, the same one no more ambiguously (one group of two rewards cannot tell a missing
    Eq. 6 from an Eq. 4 without its division by the std: it would name one of them as a guess)."""
    try:
        check(case)
    except ConformanceFailure as exc:
        if exc.category != failure.category:
            return None
        if exc.category == Category.REFUSED and refusal_words(cause_line(exc)) != refusal_words(cause_line(failure)):
            return None  # another refusal is another finding
        if exc.category == Category.FORMULA and (
                exc.formula != failure.formula or len(exc.formula_alternatives) > len(failure.formula_alternatives)
                or (exc.worst_ulps or 0.0) < (failure.worst_ulps or 0.0) / 16):
            return None  # an example of a formula keeps its difference as plain as the case it came from
        return exc
    except Exception:  # noqa: BLE001 - another kind of failure is another finding
        return None
    return None


def _valid(case: Case) -> bool:
    """A reduction keeps the case inside the property's domain: at least one row and column,
    groups of two or more samples, units of 0 or 2 or more samples that cover the batch."""
    if case.n == 0 or case.k == 0 or np.unique(case.labels(), return_counts=True)[1].min() < 2:
        return False
    sizes = case.segment_sizes
    return sizes is None or (bool(sizes) and sum(sizes) == case.n and all(s >= 0 and s != 1 for s in sizes))


def _keep_rows(case: Case, keep: np.ndarray) -> Case:
    """The case with only the rows ``keep`` (a boolean mask); labels and units follow the rows."""
    changes = {"rewards": tuple(r for r, k in zip(case.rewards, keep) if k)}
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
        for p in (float(f"1e{math.floor(e)}"), float(f"1e{math.ceil(e)}")):  # inf beyond float64, no raise
            if math.isfinite(p) and (dtype not in S.DTYPES or p <= S.DTYPES[dtype].max):
                out.append(math.copysign(float(S.round_to([p], dtype)[0]) if dtype in S.DTYPES else p, v))
    return [x for x in dict.fromkeys(out) if x != v and math.isfinite(x) and
            (dtype not in S.DTYPES or float(S.round_to([x], dtype)[0]) == x) and _score(x, dtype) < _score(v, dtype)]


def _score(v: float, dtype: str) -> float:
    """How complicated a value reads: 0 < 1 < the length of its shortest decimal in ``dtype``."""
    return 0.0 if v == 0.0 else 1.0 if abs(v) == 1.0 else 2.0 + len(decimal(v, dtype).lstrip("-"))


def reduce(check, subject: Subject, case, failure: ConformanceFailure,
           budget: int | None = None) -> tuple[ConformanceFailure, int]:
    """The failure of the smallest case the judge's reduction reaches from ``case`` (a value case;
    any other is returned as it is), each step kept only where it still fails alike
    (:func:`fails_alike`), and the checks spent (at most ``budget``)."""
    budget = REDUCE_CALLS if budget is None else budget
    if not isinstance(case, Case) or not case.rewards or case.variant or case.note.startswith("error:"):
        return failure, 0
    calls, best, best_exc, progress = 0, case, failure, True
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


def run_for_pytest(prop: Property, subject: Subject) -> None:
    """Run ``prop`` under the loaded profile; skipped with the reason where it cannot be expressed."""
    why = subject.unsupported(prop.needs)
    if why:
        pytest.skip(why)
    if DRAW_FIRST:
        grade_cases(subject, *row_check(prop.name, subject))
    else:
        _search(prop, subject)
