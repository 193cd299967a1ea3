"""Findings (conformance/findings.py): a grading lists each cause once, with the regime where it
shows, the rows it showed in and the smallest example; a second defect beside a float32 overflow
is not hidden by it; a threshold is located by bisection over the exponent, not read off a probe
that gives up.

The implementations are TRL's float32 formula graded under the trl convention (correct except where
float32 overflows) and the same with one choice changed (tests/_native_impls.py): each change adds
one formula finding at ordinary magnitudes, and the unchanged formula has none there (the negative
control of the regime's decision).
"""

from __future__ import annotations

import functools
import types
import math

import numpy as np
import pytest

from conformance import findings as F
from conformance import grading, runner
from conformance import judge as J
from conformance.cases import Case, DistCase
from conformance.subject import Subject
from conformance.verdicts import Category


@functools.cache  # each implementation graded once per worker: several tests read its findings
def _findings(fn: str, convention: str = "trl", select: str = "plain,testfloat,range,weights") -> list:
    return grading.grade(Subject(f"_native_impls:{fn}", "trl", convention), select=select).findings


def test_a_float32_overflow_is_found_at_extreme_magnitudes_only():
    found = _findings("trl_float32")
    assert found, "TRL's float32 formula overflows on rewards near FLT_MAX: no finding"
    assert {f.regime for f in found} == {"extreme magnitudes"}, [f.headline() for f in found]
    for f in found:
        assert f.category in ("silent_zero", "non_finite") and f.threshold >= 1e18, f.headline()
    assert max(len(f.rows) for f in found) >= 2, "one cause showing in several properties is one finding"


NAMED = {"trl_clipped": "after Eq. 6: advantages clipped to [-1, 1]", "trl_biased_std": "Eq. 4: biased std (ddof 0)",
         "trl_eps_1e_2": "Eq. 4: eps 0.01; Eq. 6: eps 0.01",
         "trl_leave_one_out": "Eq. 4: leave-one-out baseline (the mean of the group's other members)"}


@pytest.mark.parametrize("fn", sorted(NAMED))
def test_a_second_defect_beside_the_overflow_gets_its_own_finding(fn):
    """Graded under spec at its own precision: the changed choice is one formula finding, naming it
    alone; the overflow stays its own finding at extreme magnitudes."""
    found = _findings(fn, "spec")
    formula = [f for f in found if f.category == "formula"]
    assert [f.cause for f in formula] == [NAMED[fn]], [f.headline() for f in found]
    assert formula[0].regime == "ordinary magnitudes"
    assert any(f.regime == "extreme magnitudes" for f in found), "the overflow is no longer reported"


def test_a_missing_whitening_is_one_finding_with_an_example_that_shows_it():
    """A float32 code without Eq. 6 (found by a new-user review): one formula finding, named by the
    probes, its example a case of more than one group of two (which any scale reproduces alike)."""
    formula = [f for f in _findings("trl_no_whitening", "spec") if f.category == "formula"]
    assert [f.cause for f in formula] == ["Eq. 6: none (no batch whitening)"], formula
    assert formula[0].example.n > 2, F.describe(formula[0].example)


def test_a_formula_only_the_probes_reach_is_still_a_finding():
    """A clip at [-5, 5] shows only on a batch with one outlier among many samples: the probes hold
    one, so the probes' formula becomes the finding, its example that probe; the code without the
    clip (the negative control) has no such finding."""
    from conformance import probes

    subject = Subject("_native_impls:trl_clipped_at_5", "trl", "spec")
    found = F.from_probes(probes.profile(subject), subject)
    assert found is not None and found.cause == "after Eq. 6: advantages clipped to [-5, 5]", found
    assert found.rows == ["probes"] and found.regime == "ordinary magnitudes"
    assert "returned 5," in found.said and "--property plain" in found.repro, found.said
    control = Subject("_native_impls:trl_float32", "trl", "spec")
    assert F.from_probes(probes.profile(control), control) is None


def test_a_defect_at_every_magnitude_is_not_blamed_on_magnitudes():
    """A loop that skips the last group zeroes it at any magnitude, and a code refusing groups of
    two refuses them at any magnitude: neither is a finding "at extreme magnitudes" without a
    threshold (both were, beside their finding at ordinary magnitudes: heldout4). TRL's float32
    formula, the negative control, keeps its overflows at extreme magnitudes, each with its threshold."""
    skipped = _findings("trl_last_group_skipped", "spec")
    assert all(f.threshold for f in skipped if f.regime == "extreme magnitudes"), [f.headline() for f in skipped]
    refused = [f for f in _findings("trl_refuses_pairs", "spec") if f.category == "refused"]
    assert [f.regime for f in refused] == ["ordinary magnitudes"], [f.headline() for f in refused]
    control = _findings("trl_float32", "spec")
    assert control and all(f.regime == "extreme magnitudes" and f.threshold for f in control)


def test_a_refusal_is_keyed_by_what_it_says():
    """One refusal wherever it shows, by its words up to the first value; two refusals, two findings."""
    def refusal(case, text):
        f = _failure(case, "refused")
        f.exc.args = (f"[plain] Eq. 6 (heldout): raised ValueError: {text}; the contract computes this case",)
        return f

    small, big = Case(((0.0,), (1.0,)), group_size=2), Case(((0.0,), (1e30,)), dtype="float64", group_size=2)
    assert F.key(refusal(small, "group 3 is short")) == F.key(refusal(big, "group 12 is short"))
    assert F.key(refusal(small, "group 3 is short")) != F.key(refusal(small, "bad weights"))
    assert F.key(refusal(small, "bad weights {'a': 5e-324}")) == F.key(refusal(big, "bad weights -1.5e+39, 0"))
    # one refusal on one process and on ranks (heldout8 x03: "weights are all zero" twice)
    ranks = _failure(DistCase((small, small)), "refused")
    ranks.exc.args = ("[dist_values_2] Eq. 6 (x): rank 0 raised ValueError: rank 0: weights are all zero; the "
                      "contract computes this batch",)
    assert F.key(ranks) == F.key(refusal(small, "weights are all zero"))
    assert F.key(refusal(small, "non-finite reward")) != F.key(refusal(small, "non-negative weights"))


def _failure(case, category="silent_zero", limit=math.inf, check=None):
    exc = J.ConformanceFailure("x")
    exc.category = category

    def fails_beyond(c):
        if max(abs(v) for r in c.rewards for v in r) >= limit:
            e = J.ConformanceFailure("[p] y: z")
            e.category = category
            raise e

    return F.Failure("plain", case, exc, check or fails_beyond)


def test_the_regime_of_a_case():
    big = Case(((0.0,), (1e30,)), dtype="float64", group_size=2)
    assert F.regime(_failure(big)) == "extreme magnitudes"
    assert F.regime(_failure(Case(((0.0,), (1.0,)), group_size=2), "precision")) == "ordinary magnitudes"
    assert F.regime(_failure(Case(((0.0,), (1.0,)), group_size=2, note="error:nan_reward"), "accepted")) == "bad input"
    # a value property's case whose reward rounded to inf in its dtype (offsets in float16) is bad input
    inf = Case(((0.0,), (float("inf"),)), dtype="float16", group_size=2)
    assert F.regime(_failure(inf, "accepted")) == "bad input"
    small = Case(((0.0,), (1.0,)), dtype="float64", group_size=2)
    assert F.regime(_failure(DistCase((small, small)))) == "several ranks"
    # rewards of 1e30 on a rank are extreme magnitudes, wherever they are (heldout5: "several ranks"
    # covered rewards of 8e300 and ranked them before the extreme magnitudes)
    assert F.regime(_failure(DistCase((big, small)))) == "extreme magnitudes"
    assert F.key(_failure(DistCase((big, small))))[1:] == ("extreme magnitudes", "")
    # a formula shows at ordinary magnitudes, whatever the case it was found on
    assert F.regime(_failure(big, "formula")) == "ordinary magnitudes"


@pytest.mark.parametrize("limit", [2.0 ** 40, 1e19, 3e37])
def test_a_threshold_is_bisected_to_within_a_factor_two(limit):
    """A check failing from ``limit`` on: the threshold found lies in [limit, 2 limit), whatever
    the case's own magnitude (the probe that gave up after 40 powers of ten said 1e+267)."""
    case = Case(((0.0,), (float(np.float32(1.5e38)),), (1.0,), (-2.0,)), dtype="float32", group_size=2)
    f = _failure(case, limit=limit)
    thr, example = F.threshold(f, case, "rewards")
    assert limit <= thr < 2 * limit, (limit, thr)
    assert max(abs(v) for r in example.rewards for v in r) == thr
    # a failure that stays at ordinary magnitudes has no threshold of this input
    assert F.threshold(_failure(case, limit=0.0), case, "rewards") == (None, case)


def test_each_cause_is_keyed_apart():
    """nan and inf rewards are one missing check; weights of the wrong length and all-zero weights
    are two; a precision cause is one finding wherever it shows."""
    nan = Case(((0.0,), (1.0,)), group_size=2, note="error:nan_reward")
    inf = Case(((0.0,), (1.0,)), group_size=2, note="error:inf_reward")
    length = Case(((0.0,), (1.0,)), group_size=2, note="error:weights_length")
    zero = Case(((0.0,), (1.0,)), group_size=2, note="error:weights_all_zero")
    keys = {F.key(_failure(c, "accepted")) for c in (nan, inf)}
    assert len(keys) == 1
    assert len({F.key(_failure(c, "accepted")) for c in (length, zero)}) == 2


def test_an_example_shows_the_rows_that_differ():
    """A finding's example collapses runs of equal rows, so the rows that matter show (a case of
    eight zero rows, then 1e+20, read '[[0], [0], ... (1 more rows)]' before: zeros only)."""
    big = float(np.float32(1e20))  # (a float32 case holds float32 values)
    case = Case(rewards=((0.0,),) * 8 + ((big,),) + ((0.0,),) * 3, group_size=12)
    assert F.describe(case).startswith("[[0] (x8), [1e+20], [0] (x3)]"), F.describe(case)
    assert F.describe(Case(rewards=((1.0,), (0.0,), (2.0,)), group_size=3)).startswith("[[1], [0], [2]]")
    many = Case(rewards=tuple((float(i),) for i in range(12)), group_size=12)
    assert "... 6 more rows" in F.describe(many), F.describe(many)


def test_the_reduction_reaches_the_ends_of_float64():
    """Found by grading multireward-grpo: the power of ten above 1.7e308 is beyond float64, and
    computing it as 10.0 ** 309 raised OverflowError inside the reduction."""
    for v in (1.7976931348623157e308, -1e308, 5e-324, 3e-320):
        simpler = runner._simpler(v, "float64")
        assert simpler and all(x == x and abs(x) != float("inf") for x in simpler), (v, simpler)


def test_the_overflow_named_is_one_that_overflows():
    """At a failure's threshold the cause named is an intermediate beyond the range, not one merely
    near it: with w = 1e38 on groups of two, |w z| is 7.1e37 (verl and ms-swift were told "Eq. 7's
    terms w_k z_k overflow"). verl sums c over the responses' tokens for Eq. 6's mean: that sum is
    beyond the range, just. With w = 5e38 (float64 weights) the terms do overflow, just: 3.5e38,
    where Eq. 6's std is 2.9e38. Under multireward-grpo's convention (ddof 0, no Eq. 6), w = 1.5e308
    on rewards [0, 1] takes no exact intermediate beyond float64's range (|w z| is 1.5e308): a
    failure there is the code's own arithmetic. Where nothing is near the range, the smallest
    intermediate beyond it is named however far (rewards 1e30: Eq. 4's squared deviations, 5e59).
    Of two beyond it, the one whose overflow gives what the code returned: NaN from a sum, zeros
    from a std turned inf."""
    rewards = ((0.0,), (0.0,), (0.0,), (1.0,))
    near = Case(rewards, dtype="float32", group_size=2, weights=(1e38,))
    assert F.mechanism(near, Subject("conformance.peers:verl", "verl", "verl")) == \
        "the sum of c over the batch's tokens (Eq. 6's mean) overflows float32 (beyond 3.4e+38)"
    beyond = Case(rewards, dtype="float32", group_size=2, weights=(5e38,))
    assert F.mechanism(beyond, types.SimpleNamespace(precision="float32", shape="trl")) == \
        "Eq. 7's terms w_k z_k overflow float32 (beyond 3.4e+38)"
    own = Case(((0.0,), (1.0,)), dtype="float64", group_size=2, weights=(1.5e308,))
    assert F.mechanism(own, Subject("conformance.peers:multireward_grpo", "gdpo", "multireward_grpo")) == (
        "the code's own arithmetic overflows float64 (the nearest exact intermediate, Eq. 7's terms w_k z_k, "
        "reaches 1.5e+308)")
    both = Case(((3.4e38,), (-3.4e38,), (3.4e38,)), dtype="float32", group_size=3)  # sum 6.8e38, std 3.9e38
    at = types.SimpleNamespace(precision="float32", shape="trl")
    assert F.mechanism(both, at, Category.NON_FINITE).startswith(
        "a group's sum of the rewards (Eq. 4's mean) overflows float32 in some summation orders")
    assert F.mechanism(both, at, Category.SILENT_ZERO) == "Eq. 4's std overflows float32 (beyond 3.4e+38)"
    far = Case(((0.0,), (1e30,)), dtype="float32", group_size=2)
    assert F.mechanism(far, at) == "the squared deviations of Eq. 4 (its std) overflow float32 (beyond 3.4e+38)"


def _two_pass_f64(case: DistCase) -> dict:
    """A correct float64 code across ranks (heldout6 m22): each group's two-pass std, whose
    squared deviations overflow to inf beyond sqrt(largest float64) (its z then 0), then Eq. 6
    over the global batch; each rank's rows as an Outcome."""
    from conformance.subject import Outcome
    c = []
    for s in case.shards:
        r, lab = s.rewards_array(), s.labels()
        z = np.zeros_like(r)
        with np.errstate(over="ignore"):
            for g in np.unique(lab):
                x = r[lab == g]
                d = x - x.mean(axis=0)
                z[lab == g] = d / (np.sqrt((d * d).sum(axis=0) / (len(x) - 1)) + 1e-4)
        c.append(z.sum(axis=1))
    allc = np.concatenate(c)
    a = (allc - allc.mean()) / (allc.std(ddof=1) + 1e-4)
    ends = np.cumsum([0] + [s.n for s in case.shards])
    return {r: Outcome(True, a[ends[r]:ends[r + 1]], "float64", (s.n,)) for r, s in enumerate(case.shards)}


def test_an_overflow_on_several_ranks_is_named_as_on_one():
    """heldout6 m22, a correct float64 code across ranks: a group column on rank 0 beyond
    sqrt(largest float64) has its z silently 0, and Eq. 6 carries that into every row. It was told
    "accuracy beyond its own precision" with no cause. It is the silent zero one process shows:
    the zeroed column named in the failure, and the finding keyed by what overflows, as a
    one-process finding of that overflow is (so the two join)."""
    from conformance.cases import expected
    big = Case(((1e200,), (-1e200,), (0.0,), (1.0,)), dtype="float64", out_dtype="float64", group_size=2)
    small = Case(((0.0,), (3.0,)), dtype="float64", out_dtype="float64", group_size=2)
    case, subject = DistCase((big, small)), Subject("_native_impls:impl_float32_rounding", "gdpo", "spec")
    subject.precision = "float64"
    with pytest.raises(J.ConformanceFailure) as info:
        J.dist_values("dist_values_2", "Eq. 6", subject, case, _two_pass_f64(case), expected(case), ())
    e = info.value
    assert e.category == "silent_zero", str(e)
    assert "rank 0 group 0 column 0 set to 0" in str(e), str(e)
    assert F.key(F.Failure("dist_values_2", case, e, None), subject)[2] == \
        "the squared deviations of Eq. 4 (its std) overflow float64 (beyond 1.8e+308)"
    cause = "the squared deviations of Eq. 4 (its std) overflow float64 (beyond 1.8e+308)"
    one = F.Finding("silent_zero", "extreme magnitudes", cause, ["range"], 3, big, "", "", "", 1e154, "rewards")
    ranks = F.Finding("silent_zero", "extreme magnitudes", cause, ["dist_values_2"], 2, case, "", "", "")
    assert [(f.rows, f.count) for f in F._refile([one, ranks])] == [(["range", "dist_values_2"], 5)]
    # the same code where nothing overflows passes
    fits = DistCase((Case(((1e100,), (-1e100,), (0.0,), (1.0,)), dtype="float64", out_dtype="float64",
                          group_size=2), small))
    J.dist_values("dist_values_2", "Eq. 6", subject, fits, _two_pass_f64(fits), expected(fits), ())


def test_a_reduced_refusal_keeps_its_words():
    """heldout8 x03: the reduction of a case refused "advantages overflow float64" reached one the
    code refuses "Eq. 7's weighted sum overflows", so one refusal was shown as another's second
    finding with the same words. A smaller case refused in other words is no example of it."""
    def check(case):
        words = "advantages overflow float64" if case.rewards[0][0] else "Eq. 7's weighted sum overflows"
        e = J.ConformanceFailure(f"[eps] Eq. 6 (x): raised ValueError: {words}; the contract computes this case")
        e.category = "refused"
        raise e

    big, other = Case(((1.0,), (0.0,)), group_size=2), Case(((0.0,), (0.0,)), group_size=2)
    with pytest.raises(J.ConformanceFailure) as info:
        check(big)
    assert runner.fails_alike(check, other, info.value) is None
    assert runner.fails_alike(check, Case(((2.0,), (0.0,)), group_size=2), info.value) is not None


def test_a_threshold_is_sought_on_one_process_cases_only():
    """heldout8 x03: a refusal shown at extreme magnitudes on one process and on ranks too stopped
    the grader with no verdict (AttributeError: 'DistCase' object has no attribute 'weights')."""
    big = Case(((0.0,), (1.0,)), dtype="float64", group_size=2, weights=(1e300,))
    small = Case(((0.0,), (1.0,)), dtype="float64", group_size=2)
    members = [_failure(DistCase((small, small)), "refused"), _failure(big, "refused")]
    _, _, first, example = F._lowest(members, "weights")
    assert first is members[1] and isinstance(example, Case)


def test_a_case_off_on_ranks_beside_a_huge_reward_is_shown_at_ordinary_ones():
    """heldout8 m08 (Eq. 6 divided by N - world size) failed only on multi-process cases holding a
    reward of 3e38: one finding "at extreme magnitudes" advising a declared range below it, which
    would have hidden the defect. Scaled below 1e4 the case still fails: it is shown so, on
    several ranks. A failure that goes away scaled down keeps its case."""
    def check(always):
        def run(case):
            if always or F._top(case, "rewards") > 1e4:
                e = J.ConformanceFailure("[dist_values_2] Eq. 6 (x): 2 of 4 advantages outside the error model")
                e.category = "precision"
                raise e
        return run

    shard = Case(((0.0,), (float(np.float32(3e38)),), (1.0,), (2.0,)), dtype="float32", group_size=2)
    case = DistCase((shard, shard))
    for always in (True, False):
        f = F.Failure("dist_values_2", case, J.ConformanceFailure("x"), check(always))
        f.exc.category = "precision"
        g = F._at_ordinary(f)
        assert F.regime(g) == ("several ranks" if always else "extreme magnitudes"), g.case
        assert (F._top(g.case, "rewards") < 1e4) is always


def test_a_formula_its_cases_cannot_tell_from_another_joins_it():
    """heldout8 m11 (each unit centred on its mean, divided by the whole batch's std): units whose
    means are all 0 cannot tell that from Eq. 6 over the whole batch, and it came out as a second
    formula finding by that name. Where every case of a formula lists another formula found among
    its alternatives, and that one has a case that tells them apart, the two are one finding."""
    batch, unit_mean = "Eq. 6: over the whole batch, not per unit", "Eq. 6: the mean per unit, the std of the whole batch"

    def member(formula, alternatives):
        f = _failure(Case(((0.0,), (1.0,)), group_size=2), "formula")
        f.exc.formula, f.exc.formula_alternatives = formula, alternatives
        return f

    groups = {("formula", "ordinary magnitudes", batch): [member(batch, (unit_mean,))],
              ("formula", "ordinary magnitudes", unit_mean): [member(unit_mean, ()), member(unit_mean, (batch,))]}
    F._join_ambiguous(groups)
    assert list(groups) == [("formula", "ordinary magnitudes", unit_mean)] and len(groups[list(groups)[0]]) == 3
    # told apart nowhere: two findings stay, each naming what its cases show
    groups = {("formula", "", batch): [member(batch, (unit_mean,))], ("formula", "", unit_mean): [member(unit_mean, (batch,))]}
    F._join_ambiguous(groups)
    assert len(groups) == 2


def test_copies_of_one_shard_cannot_name_the_shard_alone():
    """heldout8 m08 divides Eq. 6's squared deviations by N - world size: on ranks holding copies of
    one shard that is each shard's own GDPO, and it was named "Eq. 6: over each rank's shard
    alone" though the code gathers. There the formula says it cannot tell the two; where a code's
    other cases tell (different shards), the finding is that one alone."""
    from conformance.cases import expected
    from conformance.subject import Outcome
    one = Case(((0.0,), (1.0,), (5.0,), (2.0,)), dtype="float64", out_dtype="float64", group_size=2)
    other = Case(((3.0,), (1.0,), (0.0,), (7.0,)), dtype="float64", out_dtype="float64", group_size=2)
    subject = Subject("_native_impls:impl_float32_rounding", "gdpo", "spec")
    subject.precision = "float64"
    found = []
    for case in (DistCase((one, one)), DistCase((one, other))):
        alone = {r: Outcome(True, expected(s).result.float64, "float64", (s.n,)) for r, s in enumerate(case.shards)}
        with pytest.raises(J.ConformanceFailure) as info:
            J.dist_values("dist_values_2", "Eq. 6", subject, case, alone, expected(case), ())
        found.append(F.Failure("dist_values_2", case, info.value, None))
    assert [f.exc.formula for f in found] == [J.SHARDS_ALONE_OR_DIVISOR, J.SHARDS_ALONE]
    groups = {F.key(f): [f] for f in found}
    F._join_ambiguous(groups)
    assert list(groups) == [F.key(found[1])] and len(groups[F.key(found[1])]) == 2
