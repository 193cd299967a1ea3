"""The conformance suite's own machinery: hex round trips, pinned examples, oracle limits, strategies.

What is checked here is the judge's plumbing and the suite's data, not an implementation under test.
"""

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import given, seed, settings, strategies as st

from conformance import cases as K
from conformance import error_cases as EC
from conformance import properties as P
from conformance import judge as J
from conformance import runner as R
from conformance import regressions
from conformance import strategies as S
from conformance.judge import distance
from conformance.subject import Subject
from spec.errors import ERROR_CLASSES


@given(case=S.cases(S.Context()))
def test_case_hex_round_trip(case):
    again = K.Case.from_json(json.loads(case.dumps()))
    assert again.dumps() == case.dumps()
    assert np.array_equal(again.rewards_array(), case.rewards_array())
    assert [math.copysign(1, v) for row in again.rewards for v in row] == \
        [math.copysign(1, v) for row in case.rewards for v in row]  # signed zeros survive


@given(case=S.dist_cases(S.Context(), 4))
def test_dist_case_reassembles(case):
    r, g, u, where = case.global_case()
    assert r.shape[0] == sum(s.n for s in case.shards)
    for rank, shard in enumerate(case.shards):
        assert np.array_equal(r[where[rank]], shard.rewards_array()) or shard.n == 0
        # units agree: as many on every rank, or none given on any (one unit over the batch)
        assert (shard.segment_sizes is None) == (case.shards[0].segment_sizes is None)
        assert shard.segment_sizes is None or len(shard.segment_sizes) == len(case.shards[0].segment_sizes)


@given(case=S.cases(S.Context()))
def test_strategies_values_are_exact_in_their_dtype(case):
    r = case.rewards_array()
    assert np.array_equal(S.round_to(r, case.dtype), r), "a generated reward is not a value of its dtype"
    if case.segment_sizes is not None:
        assert sum(case.segment_sizes) == case.n and 1 not in case.segment_sizes


@given(case=S.missing_cases(S.Context()))
def test_missing_cases_are_exact_and_replay(case):
    """The missing property's cases: NaN where unscored, every other reward a value of its dtype,
    and the hex form (NaN as "nan") replays them bit for bit, the option included."""
    r = case.rewards_array()
    scored = ~np.isnan(r)
    assert case.missing == "unscored"
    assert np.array_equal(S.round_to(r[scored], case.dtype), r[scored])
    back = K.Case.from_json(json.loads(case.dumps()))
    assert back.missing == "unscored" and back.dumps() == case.dumps()
    assert np.array_equal(np.isnan(back.rewards_array()), ~scored)


@pytest.mark.parametrize("name", sorted(regressions.EXAMPLES))
def test_pinned_examples_load_and_are_valid(name):
    assert name in P.BY_NAME, f"pinned examples for an unknown property {name}"
    for text in regressions.EXAMPLES[name]:
        case = regressions.load(text)
        assert case.dumps() == regressions.load(case.dumps()).dumps()
        if name.startswith(("errors", "dist_errors")):
            assert case.note.startswith("error:"), f"pinned error example of {name} names no error case"
        else:
            assert K.expected(case).error is None, f"pinned example of {name} is an error case: {text}"


#: Samples of oracle limits the oracle has since fixed, each found failing the oracle by this
#: suite: each must be judged now (no crash, finite allowances) and the controls' correct base
#: must meet it.
FORMER_LIMITS = {
    # eq7_underflow (fixed in the oracle by 8f67ffc): a live weight 2^-1074 beside one near DBL_MAX;
    # the batch's one frame flushed c's bound to 0
    "eq7_underflow": '{"rewards":[["0x1.0p+0","0x1.0p+0"],["0x1.8p+6","0x1.0p+0"],["0x1.38p+6","0x1.0p+0"],'
                     '["0x1.2p+4","0x1.0p+0"]],"dtype":"float64","out_dtype":"float64","group_size":4,'
                     '"weights":["-0x0.0000000000001p-1022","0x1.00000000006bbp+1023"]}',
    # fixed in d768062 (conformance/regressions.json says where each was found)
    "nan_bound_dbl_max_weight": regressions.EXAMPLES["weights"][1],
    "dbl_max_rewards_beside_tiny_weight": regressions.EXAMPLES["range"][3],
    "subnormal_beside_huge_weight": regressions.EXAMPLES["weights"][2],
}


def test_former_oracle_limits_are_judged():
    """Every former limit's sample is judged: the oracle gives finite allowances, and the
    controls' correct base conforms."""
    base = Subject("conformance.controls:baseline")
    for name, text in FORMER_LIMITS.items():
        case = regressions.load(text)
        exp = J.oracle_verdict(case, "spec")  # a ConformanceFailure here: the limit is back
        assert exp.error is None and exp.result is not None, f"former limit {name}: the oracle refuses {text}"
        allowed = exp.result.allowed(case.out_dtype)
        assert np.all(np.isfinite(allowed)) and np.all(allowed >= 0), (name, allowed.tolist())
        P.check_values(base, case, f"former limit {name}")


def test_an_oracle_failure_is_a_failure_not_a_discard(monkeypatch):
    """An oracle exception is a ConformanceFailure naming the oracle, in a hypothesis run too
    (never reject(), which would hide it as a discarded example)."""
    case = regressions.load(regressions.EXAMPLES["plain"][0])

    def crash(*args, **kwargs):
        raise ZeroDivisionError("planted oracle crash")

    monkeypatch.setattr(J, "expected", crash)
    with pytest.raises(J.ConformanceFailure, match="the oracle itself failed.*planted oracle crash"):
        J.oracle_verdict(case, "spec")

    @settings(max_examples=3, database=None)
    @given(st.just(case))
    def inside_hypothesis(c):
        J.oracle_verdict(c, "spec")

    with pytest.raises(J.ConformanceFailure, match="the oracle itself failed"):
        inside_hypothesis()


def test_judge_demands_exact_zeros_and_rejects_nan():
    exact = np.array([0.0, 1.0, 0.5])
    allowed = np.array([0.0, 1e-7, 1e-7])
    cond = np.zeros(3)
    assert distance(np.array([-0.0, 1.0, 0.5]), exact, allowed, cond, "float32").ok  # either sign of zero
    assert not distance(np.array([1e-300, 1.0, 0.5]), exact, allowed, cond, "float32").ok
    assert not distance(np.array([0.0, np.nan, 0.5]), exact, allowed, cond, "float32").ok
    assert not distance(np.array([0.0, 1.0 + 2e-7, 0.5]), exact, allowed, cond, "float32").ok
    v = distance(np.array([0.0, 1.0, 0.5 + 5e-8]), exact, allowed, cond, "float32")
    assert v.ok and 0.4 < v.ratio < 0.6


def test_failure_message_explains_itself():
    """A failure names the equation, convention, hex inputs, ulps, the bound and a repro line."""
    case = regressions.load(regressions.EXAMPLES["plain"][0])
    subject = Subject("conformance.controls:biased_std")
    with pytest.raises(J.ConformanceFailure) as info:
        P.check_values(subject, case)
    text = str(info.value)
    for needle in ("Eq. 4, 7, 6", "convention 'spec'", "0x1.0000000000000p+0", "ulp(float64)", "allowed",
                   "repro: python -m conformance.replay --impl conformance.controls:biased_std"):
        assert needle in text, (needle, text)


def test_call_shapes_are_documented_and_enforced():
    from conformance import subject

    said = subject.SHAPE_SIGNATURES  # what a mismatch message tells (docs/grading.md says the same)
    assert "fn(rewards, num_generations, reward_weights)" == said["trl"] and "segment_sizes" in said["gdpo"]
    assert set(said) == set(subject._SHAPE_CALLS)
    why = Subject("conformance.subject:impl_trl_shape", "trl").unsupported(P.BY_NAME["units"].needs)
    assert why and "trl" in why
    with pytest.raises(ValueError):
        Subject(shape="jax")


def _drawn(name: str) -> list:
    """The cases property ``name`` checks in the run that grades the controls (conformance/report.py:
    its settings and seed, no local constants: the same in every process), drawn without the oracle."""
    seen = []
    prop = P.BY_NAME[name]
    probe = dataclasses.replace(prop, check=lambda subject, case, name: seen.append(case))
    with R.no_local_constants():
        test = R.build_test(probe, Subject("impl.gdpo:gdpo_advantages"), R.control_settings())
        seed(R.property_seed(prop))(test)()
    return seen


def test_the_large_property_draws_what_its_claim_says():
    """In the run that grades the controls (:func:`_drawn`) every K of 1..8 appears, batches are
    past 64 rows, some with more than 4 units, some labels collide modulo 2^32 and some in float64,
    and the very-large tier appears: a group of more than 64 samples, one of more than 512, none
    beyond 600."""
    seen = _drawn("large")
    assert {c.k for c in seen} == set(range(1, 9)), sorted({c.k for c in seen})
    assert min(c.n for c in seen) > 64 and max(c.n for c in seen) >= 200, sorted({c.n for c in seen})
    assert max(len(c.segment_sizes or ()) for c in seen) > 4
    assert any(c.group_ids is not None and len({g % 2 ** 32 for g in c.group_ids}) < len(set(c.group_ids))
               for c in seen), "no labelled batch with labels equal modulo 2^32"
    assert any(c.group_ids is not None and len({float(g) for g in c.group_ids}) < len(set(c.group_ids))
               for c in seen), "no labelled batch with labels equal in float64"
    biggest = [int(np.unique(c.labels(), return_counts=True)[1].max()) for c in seen]
    assert max(biggest) > 512 and max(biggest) <= S.BIG_GROUP_MAX, sorted(set(biggest))
    assert 0 < sum(b > 64 for b in biggest) <= len(seen) // 3, sorted(biggest)  # a sparse tier
    assert max(c.n for c in seen) <= 1_500, max(c.n for c in seen)


def test_the_errors_property_puts_bad_rewards_in_zero_weight_columns():
    """The contract refuses a non-finite reward in any column, whatever its weight (spec section 6):
    in the run that grades the controls, nan_reward and inf_reward each put the bad value in a
    column of weight 0 at least once (an implementation dropping such columns before validating
    computes there), and elsewhere too."""
    seen = [c for cases in _drawn("errors") for c in (cases if isinstance(cases, tuple) else (cases,))
            if c.note in ("error:nan_reward", "error:inf_reward")]
    def in_zero_weight_column(c) -> bool:
        w = np.ones(c.k) if c.weights is None else np.asarray(c.weights)
        return bool(np.all(w[np.nonzero(~np.isfinite(c.rewards_array()))[1]] == 0.0))

    for name in ("error:nan_reward", "error:inf_reward"):
        where = [in_zero_weight_column(c) for c in seen if c.note == name]
        assert any(where) and not all(where), (name, where)


def test_pinned_error_examples_reach_their_tests():
    """Every pinned example of the errors property names an error case, and the gdpo shape replays
    it (conformance/test_errors.py replays those a call shape expresses)."""
    for text in P.BY_NAME["errors"].examples:
        case = regressions.load(text)
        assert case.note.split(":", 1)[1] in EC.ERROR_BY_NAME, case.note
        assert R.expressible(case, S.Context()), text


def test_every_contract_class_is_exercised():
    """Each class of spec/errors.py is demanded by some error case or property."""
    demanded = {k.__name__ for e in EC.ERROR_CASES for c in e.expect for k in c.__mro__}  # GDPOError: every base
    demanded |= {"DistributedError", "OutOfRangeError"}  # dist_errors_*; the range property's refusal
    assert set(ERROR_CLASSES) <= demanded, sorted(set(ERROR_CLASSES) - demanded)
