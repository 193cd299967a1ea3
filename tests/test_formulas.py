"""conformance.diagnosis names the formula an output follows (issue 25, "The formula, diagnosed").

Each code of tests/_formula_impls.py computes one variant of the catalogue (conformance.formulas),
written plainly and without any declaration; the diagnosis must name exactly that variant, from its
outputs alone, on ordinary random cases (ragged groups of several sizes, K = 1..3, weights).
Negative controls: the paper's formula (impl.gdpo, the oracle, textbook codes) is named as
no difference, a code with random noise is no match (the paper's formula the nearest), and
every preset of spec/conventions.py, computed exactly by the oracle, is named as that preset.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conformance import diagnosis as D
from conformance import formulas as F
from conformance.cases import Case
from conformance.formulas import Variant
from oracle import gdpo as oracle
from spec.conventions import CONVENTIONS
from tests import _formula_impls as impls

ROOT = Path(__file__).resolve().parent.parent
SEEDS_K = ((11, 1), (12, 2), (13, 3))


def make_case(seed: int, k: int, out_dtype: str, *, sizes=None, units: str = "", singleton=False, nan=False,
              constant=False) -> Case:
    """Ordinary rewards (two decimals, float32 values) in ragged groups; ``units``: "" one
    unit, "whole" two units of whole groups, "cut" two units whose boundary cuts a group."""
    rng = np.random.default_rng(seed)
    if sizes is None:  # ragged: at least two sizes
        sizes = [int(x) for x in rng.choice([2, 3, 4, 5, 6, 8], size=4)]
        sizes[0] += len(set(sizes)) == 1
    if singleton:
        sizes.append(1)
    labels = np.repeat(np.arange(len(sizes)), sizes)
    r = np.round(rng.normal(size=(labels.size, k)) * 2, 2).astype(np.float32).astype(np.float64)
    if constant:
        r[labels == 0, 0] = 0.5
    if nan:
        r[1, 0] = np.nan
    if nan == "row":  # a sample no reward function scored
        r[2, :] = np.nan
    w = tuple(float(x) for x in np.round(rng.uniform(0.5, 2.0, k), 2)) if (seed % 2 or k > 1) else None
    seg = None
    if units:
        cut = int(np.cumsum(sizes)[1]) - (1 if units == "cut" else 0)
        seg = (cut, labels.size - cut)
    return Case(rewards=tuple(map(tuple, r.tolist())), group_ids=tuple(int(x) for x in labels), weights=w,
                segment_sizes=seg, out_dtype=out_dtype)


def tokens_of(case: Case) -> np.ndarray:
    return (5 * np.arange(case.n) + 2) % 7 + 1


def run(fn, case: Case, tokens=None) -> np.ndarray:
    w = np.ones(case.k) if case.weights is None else np.asarray(case.weights)
    eps = 1e-4 if case.eps is None else case.eps
    return np.asarray(fn(case.rewards_array(), case.labels(), w, case.unit_ids(), eps, tokens))


#: each plain code, the variant it computes, its output dtype, and what its cases need
IMPLS = {
    "paper64": (Variant(), "float64", {}),
    "paper32": (Variant(), "float32", {}),
    "rloo_no_eps6": (Variant(baseline="leave_one_out", whiten_eps=0.0), "float64", {}),
    "rloo32": (Variant(baseline="leave_one_out"), "float32", {}),
    "dr_grpo_no_eq6": (Variant(scale="none", whiten="none"), "float64", {}),
    "dr_grpo32": (Variant(scale="none"), "float32", {}),
    "batch_std": (Variant(scale="batch_std"), "float64", {}),
    "var_eps": (Variant(group_placement="var", whiten_placement="var"), "float64", {}),
    "fixed_eps": (Variant(group_eps=1e-6, whiten_eps=1e-8), "float64", {}),
    "biased32": (Variant(group_ddof=0, whiten_ddof=0), "float32", {}),
    "grpo_weighted_sum": (Variant(weights="before", whiten="none"), "float64", {}),
    "no_eq6_32": (Variant(whiten="none"), "float32", {}),
    "centred_eq6": (Variant(whiten="center"), "float64", {"units": "cut"}),
    "whole_batch": (Variant(whiten_scope="batch"), "float64", {"units": "whole"}),
    "unit_mean_batch_std": (Variant(whiten_scope="unit_mean"), "float64", {"units": "cut"}),
    "per_token": (Variant(whiten="per_token"), "float64", {"tokens": True}),
    "clipped32": (Variant(clip=1.5), "float32", {}),
    "batch_std_clipped32": (Variant(scale="batch_std", clip=1.25), "float32", {}),
    "skip_zero_std": (Variant(group_placement="skip_if_zero", whiten_placement="skip_if_zero"), "float64",
                      {"constant": True}),
    "singleton_zero32": (Variant(singleton="zero"), "float32", {"singleton": True}),
    "singleton_raw": (Variant(singleton="raw"), "float64", {"singleton": True}),
    "nan_skipped": (Variant(nan="nan_aware"), "float64", {"nan": True}),
    "nan_as_zero": (Variant(nan="zero_first"), "float64", {"nan": True}),
    "unscored_left_out": (Variant(nan="nan_aware_unscored"), "float64", {"nan": "row"}),
    "nan_flows_no_eq6": (Variant(nan="propagate", whiten="none"), "float64", {"nan": True}),
}


def graded(name: str):
    """The code's (case, output, tokens) on two ordinary cases, of two of K = 1, 2, 3 (each
    code its own pair, so that every K meets every kind of code across the table)."""
    _, out_dtype, needs = IMPLS[name]
    fn = getattr(impls, name)
    items = []
    i = sorted(IMPLS).index(name)
    for seed, k in (SEEDS_K[i % 3], SEEDS_K[(i + 1) % 3]):
        case = make_case(seed, k, out_dtype, units=needs.get("units", ""), singleton=needs.get("singleton", False),
                         nan=needs.get("nan", False), constant=needs.get("constant", False))
        tokens = tokens_of(case) if needs.get("tokens") else None
        items.append((case, run(fn, case, tokens), tokens))
    return items


def _exercised(expected: Variant) -> Variant:
    """The variant as the cases can show it: a skip of a unit of std 0 needs such a unit,
    which ordinary cases never hold (no eps is all they show)."""
    if expected.whiten_placement == "skip_if_zero":
        return F._with(expected, whiten_placement="std", whiten_eps=0.0).canonical()
    return expected.canonical()


@pytest.mark.parametrize("name", sorted(IMPLS))
def test_each_variant_is_named(name):
    expected = _exercised(IMPLS[name][0])
    d = D.diagnose_many(graded(name))
    assert d.matched, D.describe(d)
    assert d.variant == expected, (D.describe(d), F.differences(expected))
    assert d.ratio <= 1.0
    for case, out, tokens in graded(name):  # each case alone: among what it cannot separate
        one = D.diagnose(case, out, tokens)
        shown = expected if expected.clip is None or np.abs(out).max() >= expected.clip else \
            F._with(expected, clip=None)  # a clip that does not bite on this case
        assert shown in one.matches, (D.describe(one), F.differences(shown))


def test_every_choice_of_the_catalogue_has_a_plain_code():
    """A choice no code computes is a claim no test checks: each is computed by a code of
    tests/_formula_impls.py (named by test_each_variant_is_named) or of tests/paper_impls.py, written
    from the paper alone (named by tests/test_first_contact.py)."""
    import paper_impls

    covered = set()
    for variant, _, _ in IMPLS.values():
        for field in Variant.__dataclass_fields__:
            value = getattr(variant, field)
            if value != getattr(F.PAPER, field):
                covered.add((field, "fitted" if field in ("group_eps", "whiten_eps", "clip") else value))
    for _, differences in paper_impls.EXPECTED.values():
        covered |= {(c.field, c.value) for c in F.CATALOGUE for line in differences if c.words in line}
    missing = [(c.field, c.value) for c in F.CATALOGUE if (c.field, c.value) not in covered]
    assert not missing, missing


@pytest.mark.parametrize("out_dtype", ["float32", "float64"])
def test_the_paper_is_no_difference(out_dtype):
    """Negative control: impl.gdpo and the oracle compute the paper's formula."""
    from impl.gdpo import gdpo_advantages

    for seed, k in SEEDS_K:
        case = make_case(seed, k, out_dtype)
        r = torch.tensor(case.rewards_array(), dtype=torch.float32)
        out = gdpo_advantages(r, group_ids=torch.tensor(case.labels()), weights=case.weights,
                              out_dtype=getattr(torch, out_dtype))
        d = D.diagnose(case, out)
        assert d.no_difference, D.describe(d)
        assert D.describe(d).startswith("formula: no difference from the paper (reproduces the output within")
        exact = oracle.gdpo_advantages(case.rewards_array(), case.labels(), weights=case.weights)
        assert D.diagnose(case, exact.rounded(out_dtype)).no_difference


def test_noise_is_no_match_and_the_paper_is_nearest():
    """Negative control: an error of 1e-3 that no formula explains."""
    items = []
    for seed, k in SEEDS_K:
        case = make_case(seed, k, "float32")
        out = run(impls.noisy32, case)
        one = D.diagnose(case, out)
        assert not one.matched and one.variant is None, D.describe(one)
        items.append((case, out))
    d = D.diagnose_many(items)
    assert not d.matched and d.variant is None
    assert d.nearest == F.PAPER and d.ratio > 1.0
    line = D.describe(d)
    assert "no variant of the catalogue reproduces the output" in line and "nearest: the paper's formula" in line


def _preset_cases(name):
    conv = CONVENTIONS[name]
    kinds = [{}]
    if conv.singleton != "error":
        kinds.append({"singleton": True})
    if conv.nan not in ("error", "propagate"):  # propagation whitened over the batch: every output NaN
        kinds.append({"nan": True})
    return kinds


@pytest.mark.parametrize("name", sorted(CONVENTIONS))
def test_every_preset_computed_by_the_oracle_is_named(name):
    conv = CONVENTIONS[name]
    for n, kind in enumerate(_preset_cases(name)):
        items = []
        for seed, k in (SEEDS_K[n % 3], SEEDS_K[(n + 1) % 3]):
            case = make_case(seed, k, "float32", **kind)
            tokens = tokens_of(case)
            res = oracle.gdpo_advantages(case.rewards_array(), case.labels(), weights=case.weights,
                                         convention=name,
                                         token_counts=tokens if conv.whiten == "per_token" else None)
            items.append((case, res.float32, tokens))
        d = D.diagnose_many(items)
        assert d.matched and name in d.presets, (kind, D.describe(d))
        assert list(d.differences) == F.differences(d.variant, 1e-4)


def test_a_case_that_cannot_separate_says_so():
    """Equal group sizes make the leave-one-out factor n/(n-1) common to every group, which
    an Eq. 6 without eps divides out: the case cannot tell; a ragged case can."""
    equal = make_case(5, 2, "float64", sizes=[4, 4, 4])
    out = run(impls.rloo_no_eps6, equal)
    d = D.diagnose(equal, out)
    loo = Variant(baseline="leave_one_out", whiten_eps=0.0)
    assert d.matched and d.alternatives and loo in d.matches and d.variant != loo
    assert "cannot separate" in D.describe(d)
    ragged = make_case(6, 2, "float64")
    both = D.diagnose_many([(equal, out), (ragged, run(impls.rloo_no_eps6, ragged))])
    assert both.variant == loo, D.describe(both)


def test_a_clip_that_does_not_bite_needs_another_case():
    quiet = make_case(7, 1, "float32", sizes=[3, 3])  # |a| < 1.5 everywhere on 6 samples of one unit
    out = run(impls.clipped32, quiet)
    assert np.abs(out).max() < 1.5
    assert D.diagnose(quiet, out).no_difference
    assert any("clip" in line for line in D.diagnose(quiet, out).not_exercised)
    loud = make_case(11, 1, "float32")
    louder = run(impls.clipped32, loud)
    assert np.abs(louder).max() == 1.5
    d = D.diagnose_many([(quiet, out), (loud, louder)])
    assert d.variant == Variant(clip=1.5), D.describe(d)


def test_describe_reads_as_one_line():
    case = make_case(12, 2, "float32")
    d = D.diagnose(case, run(impls.rloo32, case))
    line = D.describe(d)
    assert line.startswith("formula: Eq. 4: leave-one-out baseline") and "ulp(float32)" in line and "\n" not in line
    assert re.search(r"within [0-9.]+ ulp\(float32\)", line)


def test_bad_arguments_are_named():
    case = make_case(12, 2, "float32")
    with pytest.raises(ValueError, match="output: 3 values for a case of"):
        D.diagnose(case, np.zeros(3))
    with pytest.raises(ValueError, match="token_counts: 2 counts for"):
        D.diagnose(case, np.zeros(case.n), token_counts=[1, 2])
    with pytest.raises(ValueError, match="no cases"):
        D.diagnose_many([])


def test_the_catalogue_in_the_docs_is_generated():
    text = (ROOT / "docs" / "grading.md").read_text()
    assert F.catalogue_markdown() in text, "docs/grading.md: run python -m conformance.formulas --write"

#: the negative controls that compute another formula (conformance.controls, ``Flaws.formula``), and
#: what their cases need to show it
FORMULA_CONTROLS = {"biased_std": {}, "eps_in_sqrt": {}, "nan_to_zero": {"nan": True},
                    "singleton_zero": {"singleton": True}, "merged_units": {"units": "whole"},
                    "unscored_rows_whitened": {"nan": "row"}}


@pytest.mark.parametrize("name", sorted(FORMULA_CONTROLS))
def test_a_formula_control_is_named_as_its_variant(name):
    """A control whose flaw is another formula says which as a variant of the catalogue, and the
    diagnosis names that variant from its outputs: one catalogue, read by both."""
    from conformance import controls as C

    fn = C.CONTROLS[name].fn
    flaws = fn.args[0]  # a control is functools.partial(controls._gdpo, Flaws(...))
    kw = {"missing": "unscored"} if FORMULA_CONTROLS[name].get("nan") == "row" else {}
    items = []
    for seed, k in SEEDS_K[:2]:
        case = make_case(seed, k, "float64", **FORMULA_CONTROLS[name])
        out = fn(torch.tensor(case.rewards_array()), group_ids=torch.tensor(case.labels()), weights=case.weights,
                 segment_sizes=case.segment_sizes, out_dtype=torch.float64, **kw)
        items.append((case, out))
    d = D.diagnose_many(items)
    assert d.variant == flaws.formula.canonical(), D.describe(d)
