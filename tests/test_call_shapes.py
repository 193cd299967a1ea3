"""Call shapes of the conformance suite (conformance/subject.py): the verl per-token shape
grades impl.adapters.verl_advantages (values and the error contract) and rejects wrong
verl-shaped implementations; under the per-token convention verl it grades values with the
shape's token counts (a faithful verl-style implementation, tests/verl_mirror.py, passes;
its one-flaw variants and the per-sample adapter fail); `pytest --impl` works from the
repository root with no path.

The wrong implementations are written to a temporary module (importable by name, as
--impl needs), each with exactly one flaw over the vetted adapter, so that a rejection
is the flaw's.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from hypothesis import given

from conformance import subject as shapes
from conformance import properties as P
from conformance import judge as J
from conformance import error_cases as EC
from conformance import runner as R
from conformance import regressions
from conformance.cases import Case, expected
from conformance.subject import CallShapeViolation, Subject
from spec.errors import NonFiniteError, ShapeError

ROOT = Path(__file__).resolve().parents[1]
ADAPTER = "impl.adapters:verl_advantages"
MIRROR = "verl_mirror:gdpo_advantages"  # tests/verl_mirror.py

WRONG_VERL = textwrap.dedent('''
    """Wrong verl-shaped GDPO implementations (one flaw each over impl.adapters.verl_advantages)."""
    import torch

    from impl import adapters, gdpo


    def unmasked(token_level_rewards, response_mask, index, weights=None):
        """The advantage broadcast over every token, padding included."""
        adv = adapters.verl_advantages(token_level_rewards, response_mask, index, weights)
        return adv[:, :1].expand(adv.shape).clone()


    def last_token_only(token_level_rewards, response_mask, index, weights=None):
        """The advantage on the last response token only (0 on the others)."""
        adv = adapters.verl_advantages(token_level_rewards, response_mask, index, weights)
        last = response_mask.sum(dim=1) - 1
        out = torch.zeros_like(adv)
        rows = torch.arange(adv.shape[0])
        out[rows, last] = adv[rows, last]
        return out


    def last_token_score(token_level_rewards, response_mask, index, weights=None):
        """The score of a response read from its last response token, not the sum of its tokens."""
        last = response_mask.sum(dim=1) - 1
        rows = torch.arange(response_mask.shape[0])
        moved = {}
        for key, t in token_level_rewards.items():
            m = torch.zeros_like(t)
            m[rows, last] = t[rows, last]
            moved[key] = m
        return adapters.verl_advantages(moved, response_mask, index, weights)


    def token_weighted(token_level_rewards, response_mask, index, weights=None):
        """Eq. 6 weighting each sample by its token count (verl's masked_whiten), under a
        convention that whitens per sample."""
        keys = list(token_level_rewards)
        mask = response_mask.to(torch.float64)
        scores = torch.stack([(token_level_rewards[k].to(torch.float64) * mask).sum(-1) for k in keys], 1)
        ids = {}
        labels = torch.tensor([ids.setdefault(x, len(ids)) for x in list(index)])
        w = None if weights is None else [weights[k] for k in keys]
        c = gdpo.normalize_rewards(scores, group_ids=labels, weights=w)
        n_tok = mask.sum(-1)
        mean = (c * n_tok).sum() / n_tok.sum()
        var = (n_tok * (c - mean) ** 2).sum() / (n_tok.sum() - 1)
        a = (c - mean) / (var.sqrt() + 1e-4)
        return (a[:, None] * mask).to(torch.float32)


    def last_column_score(token_level_rewards, response_mask, index, weights=None):
        """The score read from the last token column (T - 1), not summed over the response."""
        last = {k: torch.zeros_like(t) for k, t in token_level_rewards.items()}
        for k, t in token_level_rewards.items():
            last[k][:, -1] = t[:, -1]
        return adapters.verl_advantages(last, response_mask, index, weights)


    def sorted_key_weights(token_level_rewards, response_mask, index, weights=None):
        """The weights taken in sorted key order, the rewards in the dict's order."""
        if weights is not None and set(weights) == set(token_level_rewards):
            weights = dict(zip(token_level_rewards, [weights[k] for k in sorted(weights)]))
        return adapters.verl_advantages(token_level_rewards, response_mask, index, weights)


    def scatter_float32(token_level_rewards, response_mask, index, weights=None):
        """Correct, in float32: each score the masked sum of its token rewards, the groups from
        index by index_add, each weight paired with its reward by key."""
        keys = list(token_level_rewards)
        mask = response_mask.to(torch.float32)
        r = torch.stack([(token_level_rewards[k].to(torch.float32) * mask).sum(-1) for k in keys], 1)
        w = torch.tensor([1.0 if weights is None else float(weights[k]) for k in keys])
        ids = {}
        gid = torch.tensor([ids.setdefault(u, len(ids)) for u in list(index)], dtype=torch.long)
        cnt = torch.zeros(len(ids)).index_add_(0, gid, torch.ones(len(gid)))[:, None]
        mean = torch.zeros(len(ids), len(keys)).index_add_(0, gid, r) / cnt
        d = r - mean[gid]
        var = torch.zeros(len(ids), len(keys)).index_add_(0, gid, d * d) / (cnt - 1)
        c = (d / (var.sqrt()[gid] + 1e-4) * w).sum(-1)
        a = (c - c.mean()) / (c.std() + 1e-4)
        return a[:, None] * mask


    def returns_tuple(token_level_rewards, response_mask, index, weights=None):
        """Correct, returned as verl's estimators do: (advantages, returns)."""
        adv = adapters.verl_advantages(token_level_rewards, response_mask, index, weights)
        return adv, adv


    def nan_to_zero(token_level_rewards, response_mask, index, weights=None):
        """A NaN token reward silently becomes 0 (TRL's habit); infinities are kept."""
        clean = {k: torch.nan_to_num(t, nan=0.0, posinf=float("inf"), neginf=float("-inf"))
                 for k, t in token_level_rewards.items()}
        return adapters.verl_advantages(clean, response_mask, index, weights)
''')


@pytest.fixture(scope="module")
def wrong_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("verl_impls")
    (d / "wrong_verl_impls.py").write_text(WRONG_VERL)
    return d


@pytest.fixture
def wrong(wrong_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(wrong_dir))
    return lambda name: Subject(f"wrong_verl_impls:{name}", "verl", "spec")


@pytest.fixture
def mirror(monkeypatch):
    """Subjects of tests/verl_mirror.py (importable by name, as --impl needs)."""
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    return lambda name="gdpo_advantages", convention="verl": Subject(f"verl_mirror:{name}", "verl", convention)


def _rejects(prop_name: str, subject: Subject) -> str:
    """Run a property without shrinking; the failure's text (the test fails if it passes)."""
    with pytest.raises(J.ConformanceFailure) as info:
        R.build_test(P.BY_NAME[prop_name], subject, config=R.control_settings())()
    return str(info.value)


def _error_contract(subject: Subject, names) -> None:
    """The error-contract cases ``names`` against ``subject`` (raises ConformanceFailure)."""
    @R.control_settings()
    @given(cases=EC.error_cases(subject.context(), subject.shape, names=set(names)))
    def run(cases):
        P.check_error(subject, cases)

    run()


# ------------------------------------------------------------ the verl mapping


def test_verl_token_rewards_sum_to_the_rewards_and_vary_lengths():
    gen = np.random.default_rng(3)
    r = np.round(gen.normal(size=(13, 3)) * 8) / 8  # halves exact
    r[0, 1] = 2.0 ** -149  # float32's smallest subnormal: no exact half, stays whole
    lengths = shapes.verl_lengths(13)
    assert sorted(set(lengths.tolist())) == list(range(1, shapes.VERL_TOKENS + 1)) and lengths[0] < shapes.VERL_TOKENS
    tok = shapes.verl_token_rewards(r, lengths, "float32")
    assert np.array_equal(tok.sum(axis=1), r)
    pad = np.arange(shapes.VERL_TOKENS)[None, :] >= lengths[:, None]
    assert not tok[pad].any(), "a reward on a padding token"
    split = (tok[:, 0, :] != 0) & (tok[np.arange(13), lengths - 1, :] != 0) & (lengths[:, None] > 1)
    assert split.sum() >= 5, "the split placement (first and last token) is never used"
    assert tok[0, lengths[0] - 1, 1] == 2.0 ** -149 and tok[0, 0, 1] == 0.0


def test_verl_arguments_are_verls_types():
    case = Case(rewards=((1.0, 0.5), (0.0, 0.25), (1.0, 0.0), (0.0, 1.0)), group_ids=(7, 7, 9, 9),
                weights=(1.0, 0.5))
    kw = Subject(ADAPTER, "verl").verl_arguments(case)
    assert set(kw) == {"token_level_rewards", "response_mask", "index", "weights"}
    assert list(kw["token_level_rewards"]) == ["format", "accuracy"]  # dict order is not sorted order
    assert all(t.dtype == torch.float32 and t.shape == (4, shapes.VERL_TOKENS)
               for t in kw["token_level_rewards"].values())
    assert kw["response_mask"].dtype == torch.int64 and kw["response_mask"].sum(1).tolist() == [3, 2, 1, 6]
    assert kw["index"].dtype == object and list(kw["index"]) == ["uid7", "uid7", "uid9", "uid9"]
    assert kw["weights"] == {"format": 1.0, "accuracy": 0.5}
    scores = torch.stack([t.double().sum(1) for t in kw["token_level_rewards"].values()], 1)
    assert torch.equal(scores, torch.tensor(case.rewards, dtype=torch.float64))
    three = Subject(ADAPTER, "verl").verl_arguments(Case(rewards=case.rewards, group_ids=case.group_ids,
                                                           weights=(1.0, 0.5, 2.0)))
    assert three["weights"] == {"format": 1.0, "accuracy": 0.5, "length": 2.0}  # not silently dropped


def test_verl_per_sample_names_the_sample_and_token():
    lengths = np.array([2, 3])
    good = torch.zeros(2, shapes.VERL_TOKENS)
    good[0, :2] = 0.5
    good[1, :3] = -0.5
    assert shapes.verl_per_sample(good, lengths).tolist() == [0.5, -0.5]
    bad = good.clone()
    bad[1, 4] = 0.25
    with pytest.raises(CallShapeViolation, match=r"sample 1 has 3 response token\(s\) of 6; its padding token 4"):
        shapes.verl_per_sample(bad, lengths)
    bad = good.clone()
    bad[0, 3] = float("nan")
    with pytest.raises(CallShapeViolation, match="padding token 3 .* carries nan"):
        shapes.verl_per_sample(bad, lengths)
    bad = good.clone()
    bad[1, 0] = 0.0
    with pytest.raises(CallShapeViolation, match="sample 1's 3 response tokens carry different values"):
        shapes.verl_per_sample(bad, lengths)
    with pytest.raises(CallShapeViolation, match=r"returned shape \(2,\); token advantages are \(B, T\) = \(2, 6\)"):
        shapes.verl_per_sample(torch.zeros(2), lengths)



def test_the_graders_checks_of_a_call_are_told_as_what_it_returned():
    """The call shape's own checks raise in the grader, not in the code: "raised
    CallShapeViolation: ..." read as if the graded function had raised it."""
    lengths = np.array([2, 3])
    bad = torch.zeros(2, 6)
    bad[1, 4] = 0.25
    with pytest.raises(CallShapeViolation) as info:
        shapes.verl_per_sample(bad, lengths)
    said = shapes.Outcome.from_exception(info.value).describe()
    assert said.startswith("returned an output that breaks call shape 'verl': sample 1 has 3 response token(s) of 6; "
                           "its padding token 4 (response_mask 0) carries 0.25"), said
    bad[1, 4] = float("nan")
    with pytest.raises(shapes.NonFiniteOutput) as info:
        shapes.verl_per_sample(bad, lengths)
    said = shapes.Outcome.from_exception(info.value).describe()
    assert said.startswith("returned non-finite values (call shape 'verl': sample 1"), said
    rewards = torch.ones(2, 1)
    with pytest.raises(shapes.InputModified) as info:
        shapes._unchanged(lambda: rewards.mul_(2), {"rewards": rewards})
    said = shapes.Outcome.from_exception(info.value).describe()
    assert said.startswith("modified its input rewards in place"), said
    said = shapes.Outcome.from_output((torch.zeros(2),)).describe()
    assert said == "returned tuple, not a tensor (the call shape reads a tensor)", said


# ------------------------------------------------------------ grading through the verl shape


@pytest.mark.parametrize("prop", ["plain", "cancellation", "collapse", "weights"])
def test_verl_adapter_passes_through_the_verl_shape(prop):
    subject = Subject(ADAPTER, "verl", "spec")
    assert subject.unsupported(P.BY_NAME[prop].needs) is None
    R.build_test(P.BY_NAME[prop], subject)()


@pytest.mark.parametrize("name, needle", [
    ("unmasked", "masked tokens must be exactly 0"),
    ("last_token_only", "response tokens carry different values"),
    ("last_token_score", "advantages outside the error model"),
    ("token_weighted", "advantages outside the error model"),
])
def test_wrong_verl_implementations_are_rejected(wrong, name, needle):
    text = _rejects("plain", wrong(name))
    assert needle in text and f"wrong_verl_impls:{name}" in text and "call shape verl" in text, text


def test_weights_paired_by_sorted_keys_are_an_eq7_formula_finding(wrong):
    """The verl shape's reward keys are not in sorted order, so weights taken in sorted key order
    land on other rewards (Eq. 7); a correct float32 code pairing them by key passes (but for
    float32's overflows at extreme magnitudes)."""
    from conformance import grading

    keys = list(Subject(ADAPTER, "verl").verl_arguments(Case(rewards=((0.0,) * 8, (1.0,) * 8), group_size=2))[
        "token_level_rewards"])
    assert len(set(keys)) == 8 and all(keys[:k] != sorted(keys[:k]) for k in range(2, 9)), keys
    g = grading.grade(wrong("sorted_key_weights"), "weights", single_process=True)
    assert [f.category for f in g.findings][:1] == ["formula"] and "Eq. 7" in g.findings[0].cause, g.findings
    assert "are the weights paired with the rewards by key, not by sorted key or position?" in g.findings[0].cause
    g = grading.grade(wrong("scatter_float32"), "plain,weights", single_process=True)
    assert g.subject.precision == "float32" and g.profile.formula is None and g.profile.named, g.profile
    assert all(f.regime == "extreme magnitudes" and f.category != "formula" for f in g.findings), g.findings


@pytest.mark.parametrize("name", ["last_column_score", "last_token_score"])
def test_a_score_not_summed_over_the_response_is_named_so(wrong, name):
    """A verl code scoring a response by one token: moving each reward to its response's first
    token moves its advantages. That is named, not the rows or groups (whose hint, for verl, is
    index's uids: no num_generations here), which break only as a consequence."""
    from conformance import probes

    prof = probes.profile(wrong(name))
    formula = prof.formula or ""
    assert formula.startswith("Scores (before Eq. 4): a response's score is not the sum of its token rewards"), formula
    assert "num_generations" not in formula and "rows of a group" not in formula, formula


def test_the_groups_hint_is_the_call_shapes_own():
    """A code treating one row of a group apart breaks the rows relation; the hint asks how the
    call shape gives the groups."""
    from conformance import formulas, probes

    case = probes.probe_cases(Subject(ADAPTER, "verl").context())[0]

    def call(c):
        a = formulas.evaluate(c, formulas.PAPER)
        a[8] *= 1.5  # the first row of group 2, whatever it holds
        return a
    hints = {shape: " ".join(probes.broken_relations(call, case, call(case), lambda c: np.full(c.n, 1e-6), shape))
             for shape in ("trl", "gdpo", "verl")}
    assert "rows of a group are not treated alike (are the groups the samples sharing a uid of index?)" in \
        hints["verl"] and "num_generations" not in hints["verl"], hints
    assert "contiguous blocks of num_generations rows" in hints["trl"], hints
    assert "contiguous blocks of group_size rows" in hints["gdpo"], hints


def test_verl_returns_tuple_is_graded_on_its_advantages(wrong):
    R.build_test(P.BY_NAME["plain"], wrong("returns_tuple"), config=R.control_settings())()


def test_verl_shape_states_what_it_skips():
    s = Subject(ADAPTER, "verl", "spec")
    for need, word in (("units", "segment_sizes"), ("eps", "eps"), ("stages", "stage"),
                       ("distributed", "process_group")):
        why = s.unsupported(frozenset({"values", need}))
        assert why and why.startswith("call shape 'verl' cannot express this") and word in why, why
    assert Subject(ADAPTER, "verl", "verl").unsupported(frozenset({"values"})) is None  # token counts passed
    for shape in ("gdpo", "trl"):
        why = Subject(ADAPTER, shape, "verl").unsupported(frozenset({"values"}))
        assert why and "per token" in why and "passes no token counts" in why, why
    # the error contract is graded under a peer's convention too (its NaN/singleton policies against
    # the convention, every other refusal demanded); the distributed protocol stays spec's
    assert Subject(ADAPTER, "verl", "verl").unsupported(P.BY_NAME["errors"].needs) is None
    why = Subject(ADAPTER, "verl", "verl").unsupported(P.BY_NAME["dist_errors_2"].needs)
    assert why and "convention 'spec'" in why, why
    ctx = s.context()
    assert ctx.labels and not ctx.units and not ctx.eps and ctx.out_dtypes == ("float32",)


# ------------------------------------------------------------ the error contract through the verl shape

#: What a verl-shaped call cannot express (no group_size, index labels of any hashable type,
#: one index argument, no eps, units or output dtype arguments).
VERL_INEXPRESSIBLE = {"group_size_not_dividing", "float_labels", "both_group_arguments", "no_group_argument",
                      "segments_negative", "segments_sum", "unit_of_one", "eps_invalid", "out_dtype_integer"}


def test_verl_error_cases_are_those_the_shape_expresses():
    verl = {e.name for e in EC.ERROR_CASES if "verl" in e.shapes}
    assert verl == {e.name for e in EC.ERROR_CASES} - VERL_INEXPRESSIBLE, sorted(verl)
    assert {"nan_reward", "inf_reward", "group_of_one", "group_size_one", "weights_all_zero", "weight_nonfinite",
            "weights_length"} <= verl


def test_verl_error_cases_reach_the_call():
    """Each error case's breakage arrives in the verl arguments (not dropped by the mapping)."""
    s = Subject(ADAPTER, "verl", "spec")
    base = Case(rewards=((1.0, 0.5), (0.0, 0.25), (1.0, 0.0), (0.0, 1.0)), group_size=2)
    nan = s.verl_arguments(EC._set(base, 1, 0, float("nan")))  # sample 1 (2 tokens), column 0: on its first token
    assert torch.isnan(nan["token_level_rewards"]["format"][1, 0]) and \
        nan["response_mask"][1, 0] == 1, nan["token_level_rewards"]["format"]
    assert torch.isnan((nan["token_level_rewards"]["format"] * nan["response_mask"]).sum(1)).tolist() == \
        [False, True, False, False]
    inf = s.verl_arguments(EC._set(base, 0, 0, float("-inf")))  # sample 0 (3 tokens): on its last token
    assert inf["token_level_rewards"]["format"][0].tolist()[:3] == [0.0, 0.0, float("-inf")]
    singleton = Case(rewards=base.rewards + ((1.0, 1.0),), group_ids=(0, 0, 1, 1, 2))  # group_of_one
    assert list(s.verl_arguments(singleton)["index"]) == ["uid0", "uid0", "uid1", "uid1", "uid2"]
    assert s.verl_arguments(dataclasses.replace(base, group_size=1))["index"].tolist() == ["uid0", "uid1", "uid2",
                                                                                           "uid3"]
    assert len(s.verl_arguments(dataclasses.replace(EC._labels(base), group_ids=(0, 0, 1)))["index"]) == 3
    assert s.verl_arguments(dataclasses.replace(base, weights=(0.0, -0.0)))["weights"] == \
        {"format": 0.0, "accuracy": -0.0}
    ints = s.verl_arguments(dataclasses.replace(base, rewards=((1.0, 0.0), (0.0, 2.0), (1.0, 0.0), (0.0, 1.0)),
                                                dtype="int32"))
    assert all(t.dtype == torch.int32 for t in ints["token_level_rewards"].values())
    assert s.verl_arguments(dataclasses.replace(base, dtype="bool"))["token_level_rewards"]["accuracy"].dtype == \
        torch.bool
    assert s.verl_arguments(dataclasses.replace(base, dtype="complex64"))["token_level_rewards"][
        "format"].dtype == torch.complex64
    empty = s.verl_arguments(dataclasses.replace(base, variant="empty"))
    assert empty["response_mask"].shape == (0, shapes.VERL_TOKENS) and len(empty["index"]) == 0
    assert all(t.shape == (0, shapes.VERL_TOKENS) for t in empty["token_level_rewards"].values())
    three = s.verl_arguments(dataclasses.replace(base, variant="rewards_3d"))
    assert all(t.shape == (4, shapes.VERL_TOKENS, 1) for t in three["token_level_rewards"].values())
    with pytest.raises(ValueError, match="cannot express a malformed call"):
        s.verl_arguments(dataclasses.replace(base, variant="no_groups"))


def test_verl_adapter_meets_the_error_contract():
    subject = Subject(ADAPTER, "verl", "spec")
    assert subject.unsupported(P.BY_NAME["errors"].needs) is None
    R.build_test(P.BY_NAME["errors"], subject)()


def test_verl_nan_zeroing_is_rejected(wrong):
    """A verl-shaped implementation that trains on a made-up 0 for a NaN reward fails the
    contract on that case, and only there."""
    subject = wrong("nan_to_zero")
    with pytest.raises(J.ConformanceFailure) as info:
        _error_contract(subject, {"nan_reward"})
    text = str(info.value)
    assert "error contract (nan_reward)" in text and "returned a result" in text and "NonFiniteError" in text, text
    others = {e.name for e in EC.ERROR_CASES if "verl" in e.shapes} - {"nan_reward"}
    _error_contract(subject, others)  # the flaw is the NaN, nothing else


def test_verl_error_cases_are_refused_by_the_adapters_classes():
    """The refusal the suite sees for each verl case is the class the contract names."""
    s = Subject(ADAPTER, "verl", "spec")
    base = Case(rewards=((1.0, 0.5), (0.0, 0.25), (1.0, 0.0), (0.0, 1.0)), group_size=2)
    cases = {"nan_reward": (EC._set(base, 2, 1, float("nan")), NonFiniteError),
             "labels_length": (dataclasses.replace(EC._labels(base), group_ids=(0, 0, 1, 1, 1)), ShapeError),
             "empty_batch": (dataclasses.replace(base, variant="empty"), ShapeError),
             "rewards_3d": (dataclasses.replace(base, variant="rewards_3d"), ShapeError)}
    for name, (case, cls) in cases.items():
        out = s.outcome(s.call, case)
        assert out.is_error(cls) and out.message, (name, out.describe())
        assert any(issubclass(cls, c) for c in EC.ERROR_BY_NAME[name].expect), (name, cls)


# ------------------------------------------------------------ per-token convention (verl) through the verl shape

#: The value properties the verl shape runs (the others need units, eps, stages or ranks).
VERL_VALUE_PROPERTIES = [p.name for p in P.PROPERTIES if p.needs == frozenset({"values"})]


def test_token_counts_reach_the_oracle():
    case = Case(rewards=((1.0, 0.5), (0.0, 0.25), (1.0, 0.0), (0.0, 1.0), (2.0, 0.0)), group_ids=(1, 1, 2, 2, 2))
    tc = Subject(ADAPTER, "verl", "verl").token_counts(case)
    assert tc.tolist() == shapes.verl_lengths(5).tolist() == [3, 2, 1, 6, 5]
    assert Subject(ADAPTER, "verl", "spec").token_counts(case) is None  # per sample: none
    assert Subject(ADAPTER, "gdpo", "verl").token_counts(case) is None  # the gdpo shape passes none
    from oracle import gdpo as og
    direct = og.gdpo_advantages(case.rewards_array(), case.labels(), convention="verl", token_counts=tc)
    got = expected(case, "verl", tc).result
    assert np.array_equal(got.float64, direct.float64) and np.array_equal(got.allowed("float32"),
                                                                           direct.allowed("float32"))
    ones = expected(case, "verl", np.ones(5, np.int64)).result
    assert not np.allclose(got.float64, ones.float64), "token counts change nothing: the test cannot tell"
    assert isinstance(expected(case, "verl").error, ShapeError)  # per token without counts: refused


@pytest.mark.parametrize("prop", VERL_VALUE_PROPERTIES)
def test_verl_mirror_passes_under_the_verl_convention(mirror, prop):
    subject = mirror()
    assert subject.unsupported(P.BY_NAME[prop].needs) is None
    R.build_test(P.BY_NAME[prop], subject)()


@pytest.mark.parametrize("name, convention", [
    ("gdpo_advantages", "spec"),  # right for verl, wrong for spec: eps 1e-6 / 1e-8 under the root, per token
    ("per_sample_whitening", "verl"),  # Eq. 6 ignoring the token counts
    ("biased_group_std", "verl"),  # Eq. 4 dividing by n
])
def test_wrong_convention_implementations_are_rejected(mirror, name, convention):
    text = _rejects("plain", mirror(name, convention))
    assert "advantages outside the error model" in text and f"convention {convention!r}" in text, text


def test_per_sample_adapter_is_rejected_under_the_verl_convention():
    text = _rejects("plain", Subject(ADAPTER, "verl", "verl"))
    assert "advantages outside the error model" in text and "convention 'verl'" in text, text


def test_root_run_under_the_verl_convention():
    """`pytest --impl M:F --convention verl --call-shape verl` from the root grades values."""
    # conformance/test_equations.py: plain, testfloat, rounding; stage_normalize skips, and so does
    # certified (the mirror does not declare certified rounding)
    sel = "test_property"
    good = _pytest_from_root("--impl", MIRROR, "--convention", "verl", "--call-shape", "verl", "-k", sel,
                             "conformance/test_equations.py", pythonpath=ROOT / "tests")
    assert good.returncode == 0 and "3 passed, 2 skipped" in good.stdout and "per token" not in good.stdout, \
        good.stdout[-3000:] + good.stderr[-3000:]
    bad = _pytest_from_root("--impl", MIRROR, "--convention", "spec", "--call-shape", "verl", "-k",
                            "test_property[plain]", "conformance/test_equations.py", pythonpath=ROOT / "tests")
    out = bad.stdout + bad.stderr
    assert bad.returncode == 1 and "advantages outside the error model" in out, out[-3000:]


#: The former oracle limit eq6_eps_frame's sample: two column pairs cancelling under weights
#: w, -w, so every c is exactly 0 without being a structural zero; the unit's variance is 0
#: and its Eq. 6 denominator is sqrt(eps) alone, so eps's scaling into the unit's frame
#: decides the whole bound.
EPS_FRAME_SAMPLE = (
    '{"rewards":[["0x1.0p+0","0x1.0p+0","0x1.4p+2","0x1.4p+2"],["0x1.0p+1","0x1.0p+1","0x1.0p+0","0x1.0p+0"],'
    '["0x1.0p+2","0x1.0p+2","0x0.0p+0","0x0.0p+0"],["0x0.0p+0","0x0.0p+0","0x1.8p+1","0x1.8p+1"]],'
    '"dtype":"float32","out_dtype":"float32","group_size":2,"weights":["0x1.0p+1","-0x1.0p+1","0x1.8p+1",'
    '"-0x1.8p+1"]}')


def _verl_scaled(case: Case, k: int, whiten_eps: float | None = None):
    """The oracle's Result under convention verl (its own token counts) with the weights
    multiplied by 2^k (exact: c scales by 2^k, exactly) and Eq. 6's eps replaced."""
    from oracle import gdpo as og
    from spec.conventions import CONVENTIONS

    conv = CONVENTIONS["verl"]
    if whiten_eps is not None:
        conv = dataclasses.replace(conv, whiten_eps=whiten_eps)
    w = [math.ldexp(x, k) for x in case.weights]
    assert all(math.ldexp(x, -k) == y for x, y in zip(w, case.weights)), "the scaled weights are not exact"
    return og.gdpo_advantages(case.rewards_array(), case.labels(), weights=w, convention=conv,
                         token_counts=shapes.verl_lengths(case.n))


def test_eq6_bound_under_a_variance_eps_is_scale_invariant():
    """Convention verl adds eps to the variance of Eq. 6: a = (c - m) / sqrt(var + eps). The
    error model (spec/error_model.py) is homogeneous: Δa is unchanged when c, Δc and the
    denominator scale together, i.e. c -> 2^k c with eps -> 4^k eps. The oracle evaluates each
    unit's bound in a frame 2^f of its own, where eps must scale by 2^-2f (it scaled by 2^-f,
    too tight for f > 0: the former oracle limit eq6_eps_frame, whose sample is used here).
    Scaling the weights by 2^k scales c and Δc by 2^k exactly (rewards would not: Eq. 4
    normalises them away), so the sample's bound must not move, over 2^120 of scales (float32's
    range: verl's code is judged at its own precision, whose underflow term is absolute)."""
    from spec.conventions import CONVENTIONS

    case = regressions.load(EPS_FRAME_SAMPLE)
    eps = CONVENTIONS["verl"].whiten_eps  # 1e-8
    base = _verl_scaled(case, 0, eps)
    assert np.all(base.combined.float64 == 0.0) and not base.combined.required_zero.any()
    assert np.all(base.delta > 0.0) and np.all(np.isfinite(base.delta))
    # verl computes in float32: its bound's underflow term is float32's absolute 2^-149, which
    # no scaling moves, so the invariance holds while c stays far inside float32's range
    for k in (-60, -30, -7, 9, 30, 60):  # eps 4^k stays a normal float64, exactly
        res = _verl_scaled(case, k, math.ldexp(eps, 2 * k))
        assert np.array_equal(res.float64, base.float64)  # the same exact problem
        np.testing.assert_allclose(res.delta, base.delta, rtol=1e-12, err_msg=f"c scaled by 2^{k}")
        np.testing.assert_allclose(res.allowed("float32"), base.allowed("float32"), rtol=1e-12,
                                   err_msg=f"c scaled by 2^{k}")


def test_eq6_bound_under_verls_own_eps_follows_the_model():
    """With verl's own eps (1e-8) fixed and c scaled by 2^k, the sample's unit has variance 0
    and a = 0, so the model reads Δa_j = (Δc_j + Σ t Δc / T) / sqrt(eps) + 3 τ, capped at the
    normalisation bound (error_model.noise_cap): Δc, and so Δa, scales like 2^k (Eq. 7's
    underflow term τ, float32's here, is negligible down to 2^-60) until the cap, and at 2^600 it is the cap.
    A frame eps scaled by 2^-f would make it scale like 2^(k/2)."""
    from spec import error_model as em

    case = regressions.load(EPS_FRAME_SAMPLE)
    base = _verl_scaled(case, 0)
    t = shapes.verl_lengths(case.n).astype(np.float64)
    from spec.conventions import CONVENTIONS

    # the cap in units of the convention's own unit roundoff (verl computes in float32)
    cap = em.noise_cap(float(t.sum()), 1, t, case.n, base.float64, CONVENTIONS["verl"].unit_roundoff)
    # in float32 this sample's noise is already within a factor 4 of the normalisation bound:
    # scaled down, Δa follows 2^k (while c stays inside float32's range, whose underflow term is
    # absolute); scaled up by 2^10 or more, it is the cap
    assert np.all(base.delta < cap) and np.all(base.delta > cap * 2.0 ** -4)
    for k in (-60, -40, -10):
        res = _verl_scaled(case, k)
        np.testing.assert_allclose(res.delta, np.ldexp(base.delta, k), rtol=1e-12, err_msg=f"c scaled by 2^{k}")
    for k in (10, 40, 600):
        assert np.array_equal(_verl_scaled(case, k).delta, cap), k


#: Weights at the bottom of the subnormals put a unit's frame at 2^-1074 or so (clamped
#: to 2^-900), where eps 2^-2f, about 2^1774, is beyond float64 while the denominator
#: sqrt(eps) 2^-f is not: the oracle once crashed there (OverflowError).
SUBNORMAL_FRAME_CASES = [
    Case(rewards=((1.0, 0.5), (0.0, 0.25), (1.0, 0.0), (0.0, 1.0)), group_size=2, weights=(2.0 ** -1074, 0.0)),
    Case(rewards=((1.0, 0.5), (0.0, 0.25), (1.0, 0.0), (0.0, 1.0)), group_size=2,
         weights=(2.0 ** -1074, 2.0 ** -1074)),
    Case(rewards=((1.0, 0.5), (0.0, 0.25), (1.0, 0.0), (0.0, 1.0)), group_size=2, weights=(1.0, 2.0 ** -1074)),
    Case(rewards=((1.0, 0.5), (0.0, 0.25), (1.0, 0.0), (0.0, 1.0), (3.0, -2.0), (0.5, 0.5)), group_size=3,
         weights=(2.0 ** -1000, -(2.0 ** -1000))),
    Case(rewards=((1.0, 0.5), (0.0, 0.25), (1.0, 0.0), (0.0, 1.0)), group_size=2,
         weights=(2.0 ** -1022, 2.0 ** 1000)),
]


@pytest.mark.parametrize("case", SUBNORMAL_FRAME_CASES + ["sample"], ids=lambda c: "sample" if c == "sample" else
                         f"w={c.weights}")
def test_verl_oracle_bounds_units_in_subnormal_frames(mirror, case):
    """No overflow in the oracle at the bottom of the subnormals under convention verl: the
    bound is finite and positive where a is not demanded exactly, and the verl mirror
    (tests/verl_mirror.py) is graded, and passes."""
    if case == "sample":  # the sample's weights times 2^-1074: (2^-1073, -2^-1073, 3 2^-1074, -3 2^-1074)
        sample = regressions.load(EPS_FRAME_SAMPLE)
        case = dataclasses.replace(sample, weights=tuple(math.ldexp(w, -1074) for w in sample.weights))
        res = _verl_scaled(case, 0)
        base = _verl_scaled(sample, 0)
        assert np.all(res.delta >= np.ldexp(base.delta, -1074))  # τ only adds to the scaled bound
    tc = shapes.verl_lengths(case.n)
    res = J.oracle_verdict(case, "verl", tc).result
    for stage in (res, res.combined):
        live = ~stage.required_zero
        assert np.all(np.isfinite(stage.delta)) and np.all(stage.delta[live] > 0.0), stage.delta
        assert np.all(np.isfinite(stage.allowed("float32"))), stage.allowed("float32")
    P.check_values(mirror(), case)


@pytest.mark.parametrize("convention", ["verl", "spec"])
@pytest.mark.parametrize("eps", [1e100, 1e300])
def test_oracle_bounds_a_huge_eps_beside_tiny_c(convention, eps):
    """An eps far beyond a unit's c (c down to 2^-1074, eps up to 1e300): the unit's frame is
    lifted so that eps's share of the denominator stays finite (oracle/exact.py eps_floor);
    the bound is finite and positive, never an OverflowError."""
    from oracle import gdpo as og

    r = np.array([[1.0, 0.5], [0.0, 0.25], [1.0, 0.0], [0.0, 1.0]])
    tc = np.array([3, 2, 1, 6]) if convention == "verl" else None
    for w in ((2.0 ** -1074, 0.0), (1.0, 0.0), (1e300, -1e300)):
        res = og.gdpo_advantages(r, [0, 0, 1, 1], weights=w, eps=eps, convention=convention, token_counts=tc)
        assert np.all(np.isfinite(res.delta)) and np.all(res.delta > 0.0), (w, res.delta)
        assert np.all(np.isfinite(res.allowed("float64"))), (w, res.allowed("float64"))


def test_oracle_bounds_an_eq4_variance_eps_in_a_subnormal_frame():
    """Eq. 4 with eps added to the variance (a custom convention): a column whose range is
    subnormal has its frame at 2^-900, where eps 2^1800 alone is beyond float64; the
    denominator sqrt(V + eps) comes from the exact rationals, never an OverflowError."""
    from oracle import gdpo as og
    from spec.conventions import CONVENTIONS

    conv = dataclasses.replace(CONVENTIONS["verl"], group_eps_placement="var")
    for r in ([[2.0 ** -1074], [0.0], [2.0 ** -1073], [0.0]], [[1.0], [0.0], [3.0], [0.0]]):
        res = og.gdpo_advantages(np.array(r), [0, 0, 1, 1], convention=conv, token_counts=[1, 2, 3, 4])
        for stage in (res.z, res):
            assert np.all(np.isfinite(stage.delta)) and np.all(stage.delta > 0.0), (r, stage.delta)


# ------------------------------------------------------------ pytest --impl from the root, no path


def _pytest_from_root(*args, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


def test_root_run_with_impl_and_no_path_uses_the_subject(tmp_path):
    (tmp_path / "off_gdpo.py").write_text(
        "from impl import gdpo\n"
        "def advantages(*args, **kwargs):\n"
        "    return gdpo.gdpo_advantages(*args, **kwargs) * 1.001  # off by 0.1%\n")
    sel = "test_property[plain]"  # conformance/test_equations.py only
    good = _pytest_from_root("--impl", "impl.gdpo:gdpo_advantages", "-k", sel)
    assert good.returncode == 0 and "1 passed" in good.stdout, good.stdout[-3000:] + good.stderr[-3000:]
    bad = _pytest_from_root("--impl", "off_gdpo:advantages", "--convention", "spec", "--call-shape", "gdpo",
                            "-k", sel, pythonpath=tmp_path)
    out = bad.stdout + bad.stderr
    assert bad.returncode == 1 and "1 failed" in bad.stdout, out[-3000:]  # 1: tests failed, not a usage error
    assert "of off_gdpo:advantages (call shape gdpo" in out, out[-3000:]


def test_root_run_with_verl_shape_and_no_path(wrong_dir):
    sel = "test_property[plain]"
    good = _pytest_from_root("--impl", ADAPTER, "--call-shape", "verl", "-k", sel)
    assert good.returncode == 0 and "1 passed" in good.stdout, good.stdout[-3000:] + good.stderr[-3000:]
    bad = _pytest_from_root("--impl", "wrong_verl_impls:unmasked", "--call-shape", "verl", "-k", sel,
                            pythonpath=wrong_dir)
    out = bad.stdout + bad.stderr
    assert bad.returncode == 1 and "masked tokens must be exactly 0" in out, out[-3000:]


def test_options_are_registered_once_with_the_plugin_named_twice():
    """`gdpo check` passes -p conformance.plugins while the root conftest loads it too."""
    proc = _pytest_from_root("-p", "conformance.plugins", "--call-shape", "verl", "--impl", ADAPTER,
                             "-k", "test_property[plain]", "conformance/test_equations.py")
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_unknown_call_shape_is_a_usage_error():
    proc = _pytest_from_root("--call-shape", "jax", "--collect-only")
    assert proc.returncode == 4 and "invalid choice: 'jax'" in proc.stderr, proc.stderr[-2000:]


def test_root_run_grading_another_implementation_runs_the_conformance_suite_only():
    """From the root with no path, `pytest --impl X` must not mix this checkout's own
    tests (which never call X) into X's verdict: they are deselected, as in `gdpo check`."""
    mine = _pytest_from_root("--collect-only")
    theirs = _pytest_from_root("--impl", "conformance.subject:impl_trl_shape", "--call-shape", "trl",
                               "--collect-only")
    assert mine.returncode == 0 and theirs.returncode == 0, theirs.stdout[-2000:] + theirs.stderr[-2000:]
    own = [line for line in mine.stdout.splitlines() if line.startswith("tests/")]
    kept = [line for line in theirs.stdout.splitlines() if "::" in line]
    assert own, "the checkout's own tests were not collected by a plain run"
    assert kept and all(line.startswith("conformance/") for line in kept), kept[:5]
    assert f"({len(own)} deselected)" in theirs.stdout or "deselected" in theirs.stdout


def test_a_findings_inputs_are_named_in_its_call_shapes_arguments():
    """--details printed `group_size 2; weights ones; segment_sizes None; eps default` for a TRL
    code, which takes num_generations and reward_weights and no segment sizes or eps."""
    from conformance.cases import loads
    from conformance.compare import describe_inputs

    case = loads('{"rewards":[["0x0.0p+0"],["0x1.0p+0"],["0x0.0p+0"],["0x1.8p+0"]],"dtype":"float32",'
                 '"out_dtype":"float32","group_size":2}')
    assert describe_inputs(case, "trl") == ("rewards_per_func (float32, 4x1) [[0], [1], [0], [1.5]]; "
                                            "num_generations 2; reward_weights ones")
    assert describe_inputs(case, "verl") == ("scores (float32, 4x1) [[0], [1], [0], [1.5]], each spread over its "
                                             "response tokens (token_level_rewards); index uid labels in runs of "
                                             "2; weights ones")
    assert describe_inputs(case) == ("rewards (float32, 4x1) [[0], [1], [0], [1.5]]; group_size 2; weights ones; "
                                     "segment_sizes None; eps default; out float32")
    import dataclasses  # the out_dtype=torch.int64 error case (heldout7: it read "out float64")

    assert "; out int64; variant int_out_dtype" in describe_inputs(dataclasses.replace(case, variant="int_out_dtype"))
