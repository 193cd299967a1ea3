"""The properties of the conformance suite, as data (:class:`Property`: what to hunt, what must
hold, what the call shape must express, pinned examples), and the checks they run: the oracle's
verdict and the graded code's outcome handed to :mod:`conformance.judge`; :mod:`conformance.runner`
runs them.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Callable

import torch

from conformance import boundary as B
from conformance import distributed
from conformance import error_cases as EC
from conformance import judge as J
from conformance import regressions
from conformance import strategies as S
from conformance.cases import Case, DistCase, expected, expected_whiten
from conformance.error_cases import dist_error_cases, error_cases
from conformance.subject import Subject


# ------------------------------------------------------------------ the checks


def check_values(subject: Subject, case: Case, prop: str = "values") -> None:
    exp = J.oracle_verdict(case, subject.judged(), subject.token_counts(case))
    out = subject.outcome(subject.call, case)
    J.values(prop, "Eq. 4, 7, 6 (advantages)", subject, as_returned(subject, case, out), out, exp)


def as_returned(subject: Subject, case: Case, out) -> Case:
    """The case judged at the dtype the code returned, where its call shape passes no output dtype
    (trl, verl: float32 or float64 are both the code's own choice)."""
    if subject.shape in ("trl", "verl") and out.ok and out.dtype in ("float32", "float64"):
        return dataclasses.replace(case, out_dtype=out.dtype)
    return case


def check_certified(subject: Subject, case: Case, prop: str = "certified") -> None:
    """Certified rounding (:func:`conformance.judge.certified_rounding`) where the implementation
    declares it; else the error model only (what a replay runs; the property skips such a code)."""
    if not subject.certifies() or subject.convention != "spec":
        check_values(subject, case, prop)
        return
    exp = J.oracle_verdict(case, subject.judged())
    out = subject.outcome(subject.call, case)
    J.certified_rounding(prop, "Eq. 4, 7, 6 and the final cast (certified rounding)", subject, case, out, exp)


def check_normalize(subject: Subject, case: Case, prop: str = "stage_normalize") -> None:
    exp = J.oracle_verdict(dataclasses.replace(case, segment_sizes=None), subject.judged())
    out = subject.outcome(subject.call_normalize, case)
    J.normalized(prop, "Eq. 4 + 7 (normalize_rewards, float64 c)", subject, case, out, exp)


def check_whiten(subject: Subject, case: Case, prop: str = "stage_whiten") -> None:
    values = case.rewards_array()[:, 0]
    try:
        exp = expected_whiten(values, case.segment_sizes, case.eps, subject.judged())
    except Exception as exc:  # noqa: BLE001
        raise J.ConformanceFailure(f"the oracle failed on whiten({values.tolist()}): {exc!r}") from exc
    out = subject.outcome(subject.call_whiten, case)
    J.whitened(prop, "Eq. 6 (whiten)", subject, case, out, exp)


def _held(subject: Subject, case: Case) -> Case:
    """An integer or bool case judged on the values its tensor holds (bool: 0 and 1)."""
    if case.dtype not in ("bool", "int64", "int32"):
        return case
    held = subject.tensor(case).to("cpu").to(torch.float64).numpy()
    return dataclasses.replace(case, rewards=tuple(tuple(float(v) for v in row) for row in held))


def check_error(subject: Subject, cases, prop: str = "errors") -> None:
    """Each case of the error contract (a tuple of cases, each noted ``error:<name>``), routed by
    :func:`conformance.judge.error_route`."""
    for case in (cases if isinstance(cases, tuple) else (cases,)):
        name = case.note.split(":", 1)[1]
        route = J.error_route(subject.convention, name)
        if name in subject.validated():
            continue  # declared: checked by the framework before the function is called
        if name in ("integer_rewards", "bool_rewards") and subject.takes_integers():
            check_values(subject, _held(subject, case), prop)  # declared: computed as their values
            continue
        if route == "skip":
            continue
        if route == "policy":
            judged = _held(subject, case)
            exp = expected(judged, subject.judged(), subject.token_counts(judged))  # NaN where NaN propagates
            out = subject.outcome(subject.call, judged)
            J.policy(prop, J.policy_equation(subject, name), subject, as_returned(subject, judged, out), out, exp)
            continue
        ec = EC.ERROR_BY_NAME[name]
        if subject.convention == "spec" and ec.oracle and not case.variant:
            exp = expected(case, subject.convention, subject.token_counts(case))  # the spec's own judge refuses it too
            said = repr(exp.error) if exp.error is not None else "it computes the case"
            assert exp.error is not None and isinstance(exp.error, ec.expect), (
                f"suite bug: error case {name} expects {ec.expect} but the oracle says {said}: {case.dumps()}")
        J.error_case(prop, subject, case, subject.outcome(subject.call, case))


def _dist_outcomes(prop, eq, subject, case: DistCase):
    if subject.device == "cpu" and subject.backend == "gloo":
        pool = distributed.pool()  # one 4-rank pool serves world sizes 4, 2 and 1
    else:
        pool = distributed.pool(subject.device, subject.backend, world=case.world)
    job = pool.run(case.world, [distributed.payload(subject, s) for s in case.shards])
    J.hang(prop, eq, subject, case, job, distributed.GRACE, distributed.DEADLINE)
    return job.outcomes


def check_dist_values(subject: Subject, case: DistCase, prop: str = "dist_values") -> None:
    eq = f"Eq. 4, 7, 6 across {case.world} gloo rank(s)"
    exp = J.oracle_verdict(case, subject.judged())
    outs = _dist_outcomes(prop, eq, subject, case)
    J.dist_values(prop, eq, subject, case, outs, exp, S.twins(case))


def check_dist_errors(subject: Subject, case: DistCase, prop: str = "dist_errors") -> None:
    name = case.note.split(":")[1]
    eq = f"distributed error contract ({name}, {case.world} rank(s))"
    J.dist_errors(prop, eq, subject, case, _dist_outcomes(prop, eq, subject, case))


# ------------------------------------------------------------------ registry


@dataclasses.dataclass(frozen=True)
class Property:
    name: str
    section: str  # the spec section the test module covers
    equation: str
    claim: str  # one line: what must hold
    strategy: Callable  # (Context, Subject) -> SearchStrategy
    check: Callable  # (Subject, case) -> None, raises ConformanceFailure
    needs: frozenset = frozenset({"values"})
    world: int = 0  # > 0: spawned gloo ranks
    #: hypothesis's target phase (hill-climbing on the error ratio). Off where a case is costly
    #: to draw: grading a mean-then-subtract code, it climbed `large` for over 15 minutes.
    hill_climb: bool = True

    @property
    def examples(self) -> tuple:
        return regressions.EXAMPLES.get(self.name, ())


def _boundary(ctx, subject):
    """Hunted boundary cases (conformance/boundary.py) the call shape can express, aimed at the
    narrow output formats it takes, sometimes with float64 output (graded as faithful)."""
    fams = tuple(f for f in B.FAMILIES if (ctx.labels and ctx.units) or f not in ("ragged_units", "tie_collapsed"))
    targets = tuple(t for t in B.TARGETS if t in ctx.out_dtypes) or B.TARGETS
    return B.strategy(fams, targets, tuple(d for d in ctx.out_dtypes if d == "float64"))


def _values(**kw):
    return lambda ctx, subject: S.cases(ctx, **kw)


PROPERTIES = (
    Property("plain", "equations", "Eq. 4, 7, 6", "RL-like rewards (binary, small integers, bounded floats), "
             "ragged and equal groups, unit layouts, every dtype: each advantage within the error model",
             _values(kinds=("binary", "ints", "plain", "runs"), pairs=(),
                     weight_modes=("none", "ones", "equal", "random", "signed")), check_values),
    Property("testfloat", "equations", "Eq. 4, 7, 6", "TestFloat-style values (exponent table x significand "
             "patterns), subnormals, signed zeros: within the error model",
             _values(kinds=("testfloat", "constant", "runs", "tiny"), pairs=("copy", "scaled"),
                     weight_modes=("none", "testfloat", "random")), check_values),
    Property("rounding", "equations", "Eq. 6 + final cast", "an advantage just off a rounding midpoint of the "
             "output format (float16, its subnormals, bfloat16, float32): one correct rounding of the float64 "
             "result, within half an ulp of the format; rounding through float32 first, or toward zero, misses by "
             "more than the bound", lambda ctx, subject: B.near_midpoint_cases(ctx), check_values),
    Property("certified", "equations", "Eq. 4, 7, 6 + final cast", "an implementation that declares certified "
             "rounding (gdpo_certified = True): on hunted boundary cases (exact advantages on a rounding midpoint "
             "of float32, bfloat16 or float16, or within two float64 ulps of one: eps or a reward bisected, exact "
             "ties at eps 0, a hair below a tie at eps 5e-324, Eq. 7 weights, ragged units, near cancellation, "
             "large offsets) every float32/bfloat16/float16 advantage is the exact value correctly rounded (ties "
             "to even), float64 within one ulp (faithful); one that does not declare it is skipped (graded within "
             "the error model only)", _boundary, check_certified,
             frozenset({"values", "certified", "eps", "units"})),
    Property("offsets", "traps", "Eq. 4", "small spread on a large offset (1e3 to 1e300, 2^53): the "
             "shift-invariant bound, measured against the range, not the magnitude",
             _values(kinds=("offset", "near_constant", "plain"), pairs=("anti_decimal",)), check_values),
    Property("cancellation", "traps", "Eq. 7, 6", "constant-sum (r2 = C - r1 exact, C up to 2^53), shifted and "
             "copied columns under equal, nearly equal and float32-indistinct weights: exact zeros where the "
             "cancellation is exact, real signal where it is not",
             _values(kinds=("binary", "constant", "plain"), pairs=("anti_exact", "shift_exact", "copy",
                                                                   "anti_decimal"),
                     weight_modes=("none", "ones", "equal", "random"),
                     unit_modes=("none", "groups", "groups")), check_values),
    Property("collapse", "decisions", "Eq. 4, 6", "constant columns at any magnitude, runs of equal values, "
             "units combining to a constant: exactly 0; near-collapse (ulps apart) is real signal",
             _values(kinds=("constant", "runs", "near_constant", "binary", "tiny"),
                     pairs=("anti_exact", "shift_exact", "copy"), weight_modes=("none", "ones", "equal"),
                     unit_modes=("none", "groups", "groups")), check_values),
    Property("range", "traps", "Eq. 4, 7, 6", "rewards near FLT_MAX (float32 statistics overflow), float64 "
             "rewards beyond float32 range, extreme weights: computed, or OutOfRangeError only beyond float32 "
             "(rewards) or float64 (Eq. 7, or one of its terms w_k z_k)",
             _values(kinds=("huge", "beyond32", "testfloat", "plain"), pairs=(),
                     weight_modes=("none", "extreme", "testfloat")), check_values),
    Property("weights", "decisions", "Eq. 7", "weights from 2^-1074 to 2^1023, negative and zero weights, "
             "weights float32 cannot tell apart: float64 weights",
             _values(kinds=("binary", "plain", "ints"), pairs=("copy", "anti_exact"),
                     weight_modes=("extreme", "testfloat", "random", "signed")), check_values),
    Property("eps", "decisions", "Eq. 4, 6", "eps from 0 to DBL_MAX (added to the std at both equations)",
             _values(kinds=("binary", "plain", "offset", "testfloat"), pairs=("anti_exact",),
                     eps_values=(0.0, 1e-12, 1e-8, 1e-6, 1e-4, 1e-2, 1.0, 100.0, 2.0 ** 60, 1e300,
                                 sys.float_info.max)), check_values,
             frozenset({"values", "eps"})),
    Property("missing", "decisions", "Eq. 4, 6", "missing=\"unscored\" (spec section 2): NaN rewards left "
             "out of their group column's statistics (z = 0 there, 0 throughout a column of fewer than two "
             "scored), rows with no scored reward advantage exactly 0 and out of Eq. 6; scattered NaN, whole "
             "rows, TRL's multi-environment batches, everything or nothing unscored",
             lambda ctx, subject: S.missing_cases(ctx, kinds=("binary", "ints", "plain", "runs", "constant"),
                                                  pairs=("anti_exact", "copy"),
                                                  weight_modes=("none", "ones", "random", "signed"),
                                                  unit_modes=("none", "groups", "free")),
             check_values, frozenset({"values", "missing"})),
    Property("units", "units", "Eq. 6", "several whitening units, empty units, units cutting through groups: "
             "each unit whitened on its own",
             _values(kinds=("binary", "plain", "ints", "constant"), pairs=("anti_exact",),
                     unit_modes=("groups", "free")), check_values, frozenset({"values", "units"})),
    Property("large", "traps", "Eq. 4, 7, 6", "batches of 65 to 300 rows, every K of 1 to 8, groups of up "
             "to 64 samples, up to 8 units, labels colliding modulo 2^32 or in float64; in about one example in 8 "
             "also one or two groups of 65 to 600 samples (N up to about 1,500): no special-casing by size, "
             "groups up to 600 samples",
             _values(kinds=("binary", "ints", "plain", "runs", "offset", "testfloat", "constant"),
                     pairs=("anti_exact", "copy"), weight_modes=("none", "ones", "equal", "random", "signed"),
                     large=True), check_values, hill_climb=False),
    Property("stage_normalize", "equations", "Eq. 4 + 7", "normalize_rewards returns c in float64 within the "
             "error model, exactly 0 for exactly cancelling groups",
             _values(pairs=("anti_exact", "shift_exact", "copy"), unit_modes=()), check_normalize,
             frozenset({"values", "stages"})),
    Property("stage_whiten", "units", "Eq. 6", "whiten on given values per unit: within the error model, a "
             "constant unit exactly 0",
             _values(kinds=("plain", "testfloat", "constant", "runs", "near_constant", "huge"), pairs=(), k_max=1,
                     unit_modes=("none", "groups", "free")), check_whiten, frozenset({"values", "stages"})),
    Property("errors", "errors", "contract", "every refusal of the contract raises its GDPOError subclass "
             "(a clear refusal of another class is noted, and fails only under the strict error contract); under "
             "a peer's convention, what its NaN and singleton policies compute is graded against them, and every "
             "other bad input must be refused",
             lambda ctx, subject: error_cases(ctx, subject.shape), check_error,
             frozenset({"errors"})),
    Property("dist_values_2", "distributed", "Eq. 6 across ranks", "2 gloo ranks (a subgroup): shards "
             "reassembled equal the oracle; twinned groups bitwise equal; every rank returns",
             lambda ctx, subject: S.dist_cases(ctx, 2), check_dist_values,
             frozenset({"values", "distributed", "labels"}), world=2),
    Property("dist_values_4", "distributed", "Eq. 6 across ranks", "4 gloo ranks: the same, with empty shards",
             lambda ctx, subject: S.dist_cases(ctx, 4), check_dist_values,
             frozenset({"values", "distributed", "labels"}), world=4),
    Property("dist_missing_2", "distributed", "Eq. 6 across ranks", "missing=\"unscored\" on 2 gloo ranks: "
             "rows with no scored reward out of every rank's statistics (advantage 0), units of fewer than two "
             "scored rows 0 throughout, the rest as the oracle on the global batch",
             lambda ctx, subject: S.dist_missing_cases(ctx, 2), check_dist_values,
             frozenset({"values", "distributed", "missing", "labels"}), world=2),
    Property("dist_errors_2", "distributed", "protocol", "a refusal on one of 2 ranks: every rank raises the "
             "same DistributedError naming it, within the deadline (no hang)",
             lambda ctx, subject: dist_error_cases(ctx, 2), check_dist_errors,
             frozenset({"spec_convention", "distributed", "labels"}), world=2),
    Property("dist_errors_4", "distributed", "protocol", "the same on 4 ranks",
             lambda ctx, subject: dist_error_cases(ctx, 4), check_dist_errors,
             frozenset({"spec_convention", "distributed", "labels"}), world=4),
)
BY_NAME = {p.name: p for p in PROPERTIES}
CHECKS = {"values": check_values, "errors": check_error, "dist_values": check_dist_values,
          "dist_errors": check_dist_errors, **{p.name: p.check for p in PROPERTIES}}


def of_section(section: str) -> list:
    return [p for p in PROPERTIES if p.section == section]
