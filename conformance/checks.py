"""The checks: what each property runs on one case, before the judge decides.

A check asks the oracle for the exact answer (:func:`conformance.judge.oracle_verdict`),
calls the graded code through its :class:`~conformance.subject.Subject` (one process,
or one gloo rank per shard) and hands both to :mod:`conformance.judge`, which alone
decides the verdict:

* :func:`check_values`: Eq. 4, 7, 6 end to end (:func:`conformance.judge.values`);
* :func:`check_certified`: the same where the implementation declares certified rounding:
  the exact value correctly rounded, bit for bit (:func:`conformance.judge.certified_rounding`);
* :func:`check_normalize` / :func:`check_whiten`: the stage functions against the oracle's
  combined stage (Eq. 4 + 7, float64) and ``whiten_units`` (Eq. 6 alone);
* :func:`check_error`: the error contract (spec section 6) per error case
  (:mod:`conformance.error_cases`); under a peer's convention what its own NaN and
  singleton policies compute is graded against them;
* :func:`check_dist_values` / :func:`check_dist_errors`: shards on 1, 2, 4 gloo ranks,
  reassembled for the oracle; every rank returns within a deadline, refusals happen on
  every rank together with the same DistributedError naming the offending rank, twinned
  groups get bitwise-identical advantages.
"""

from __future__ import annotations

import dataclasses

import torch

from conformance import distributed
from conformance import error_cases as EC
from conformance import judge as J
from conformance import strategies as S
from conformance.cases import Case, DistCase, expected, expected_whiten
from conformance.subject import Subject


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
    """Certified rounding (issue 27), for an implementation that declares it
    (``Subject.certifies``): every float32/bfloat16/float16 advantage the exact value correctly
    rounded, float64 faithful (:func:`conformance.judge.certified_rounding`). One that does not
    declare it is graded within the error model only (:func:`check_values`: what a replay with
    such an implementation runs; the property itself is skipped for it)."""
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
