"""Probes: what the graded code computes, told from a few fixed batches before any case is drawn
(docs/grading.md, "Precision and formula"): :func:`probe_cases` the batches, :func:`profile` the
working precision and formula they show, :func:`relations` the paper's exact relations tested.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from conformance import formulas
from conformance.diagnosis import Diagnosis, diagnose_many, reproduces
from conformance.cases import Case, expected
from spec.constants import FLOAT32_UNIT_ROUNDOFF, FLOAT64_UNIT_ROUNDOFF
from spec.conventions import get_convention
from spec.error_model import round_to

#: the first probe: 4 groups of 4, three columns (binary, small integers, a column of std about
#: 1e-3 with a constant group of zeros, exact in any arithmetic), weights 1, 1/2, 2
_MAIN = (
    (1, 3, 0), (0, 1, 2 ** -10), (0, 4, 2 ** -9), (1, 1, 3 * 2 ** -10),
    (1, 5, 2 ** -8), (1, 9, 0), (1, 2, 2 ** -9), (0, 6, 2 ** -9),
    (0, 5, 0), (0, 3, 0), (0, 5, 0), (0, 8, 0),
    (0, 9, 3 * 2 ** -8), (1, 7, 0), (0, 9, 0), (0, 3, 2 ** -8),
)
_MAIN_WEIGHTS = (1.0, 0.5, 2.0)
#: groups of 2: five pairs, two columns
_PAIRS = ((1, .5), (0, .25), (0, 2), (1, 3), (0, 1), (0, 1.5), (1, 0), (1, .125), (1, 4), (0, 1))
#: groups of 8: two groups, two columns
_EIGHTS = ((1, .25), (0, 0), (1, .75), (1, .5), (0, 1), (0, .25), (1, 0), (0, .5),
           (0, 3), (0, 1), (0, 2), (1, 2), (0, 0), (0, 1), (0, 3), (0, 2))
#: an outlier: one group [1, 0, 0, 0] among nine constant groups (|a| = 5.4 at one row)
_OUTLIER = ((1,), (0,), (0,), (0,)) + ((0,),) * 12 + ((1,),) * 12 + ((2,),) * 12
#: groups of 12: one outlier, |z| = 11 / sqrt(12) = 3.2 at Eq. 4, where no group of 8 or fewer
#: reaches 3 ((G - 1) / sqrt(G) is the largest |z| of a group of G); beside a group of two ones
#: (|z| = 2.1), so that Eq. 6 cannot undo what a clip of z does (it would, on one group alone)
_BIG_GROUPS = ((1,),) + ((0,),) * 11 + ((1,),) * 2 + ((0,),) * 10
#: groups of 128, the same shape: |z| = 127 / sqrt(128) = 11.2 at Eq. 4 and |a| = 11.2 after Eq. 6,
#: beyond a clip at 10 (PPO-style codes clamp advantages there)
_HUGE_GROUPS = ((1,),) + ((0,),) * 127 + ((1,),) * 2 + ((0,),) * 126


#: 64 groups of 16, two columns of small integers that differ from group to group: a batch as
#: trainers see them, where Eq. 6 over only a part of it (its first rows, a micro-batch) is off
_BATCH_1024 = tuple(((i * 7 + i // 16) % 5, (i * 3 + i // 32) % 4) for i in range(1024))


def _case(rows, group_size, weights, ctx, scale=1.0) -> Case:
    dtype = "float32" if "float32" in ctx.input_dtypes else ctx.input_dtypes[0]
    out = "float64" if "float64" in ctx.out_dtypes and ctx.eps else ctx.out_dtypes[0]
    rewards = tuple(tuple(float(v) * scale for v in row) for row in rows)
    return Case(rewards=rewards, dtype=dtype, group_size=group_size,
                weights=None if weights is None else tuple(float(w) for w in weights), out_dtype=out,
                note="probe")


def probe_cases(ctx) -> list[Case]:
    """The probes, as the call shape's context (:class:`conformance.strategies.Context`) expresses
    them: every value and weight is exact in float32 (the trl shape's reward_weights)."""
    return [  # (the order of PROBE_WORDS; the first four are searched, the rest confirm: diagnosis.SEARCHED)
        _case(_MAIN, 4, _MAIN_WEIGHTS, ctx),
        _case(_OUTLIER, 4, None, ctx),                                    # a clip bites here
        _case(_MAIN, 4, _MAIN_WEIGHTS, ctx, scale=2.0 ** -8),           # eps dominant at Eq. 4
        _case(_MAIN, 4, tuple(w * 2.0 ** -12 for w in _MAIN_WEIGHTS), ctx),  # eps dominant at Eq. 6
        _case(_MAIN, 4, (-1.0, 0.5, -2.0), ctx),                          # weights summing to -2.5
        _case(_PAIRS, 2, (1.0, 1.0), ctx),
        _case(_EIGHTS, 8, (1.0, 0.25), ctx),
        _case(_BIG_GROUPS, 12, None, ctx),                                 # a clip of z bites here
        _case(_HUGE_GROUPS, 128, None, ctx),                               # and a clip at 10 here
        _case(_BATCH_1024, 16, (1.0, 0.5), ctx),                           # Eq. 6 over a part of the batch
    ] + ([_case(_MAIN, 4, _MAIN_WEIGHTS, ctx, scale=2.0 ** -30)]  # a std floored or replaced below 1e-6
         if _case(_MAIN, 4, None, ctx).dtype != "float16" else [])  # (float16 holds no 2^-40)


# ------------------------------------------------------------------ relations


@dataclasses.dataclass(frozen=True)
class Relation:
    """A transformation of a batch whose effect on the paper's advantages is known exactly:
    the transformed batch's advantages are ``sign`` times the first's, rows permuted by ``perm``
    (row i of the new batch is row ``perm[i]`` of the old), up to the exact effect of eps
    (taken from the oracle, so only the code's own difference remains)."""

    name: str
    stage: str
    words: str  # what is done, for the report
    case: Case
    perm: np.ndarray
    sign: float = 1.0


def _replace_rows(case: Case, rows) -> Case:
    return dataclasses.replace(case, rewards=tuple(tuple(float(v) for v in r) for r in rows))


def relations(case: Case, shape: str = "gdpo") -> list[Relation]:
    """The relations tested on ``case`` (a probe of 4 groups of 4 and three columns) in call shape
    ``shape`` (verl: and moving each reward to its response's first token)."""
    r = case.rewards_array()
    n = r.shape[0]
    ident = np.arange(n)
    g1 = slice(4, 8)
    shifted = r.copy()
    shifted[g1, 1] += 8.0
    scaled = r.copy()
    scaled[g1, 1] *= 4.0
    rows_perm = ident.copy()
    rows_perm[8:12] = rows_perm[8:12][::-1]
    groups_perm = np.concatenate([ident[12:16], ident[4:12], ident[0:4]])
    w = case.weights
    split = np.concatenate([r, r[:, 1:2]], axis=1)
    tokens = [Relation("tokens", "Scores (before Eq. 4)", "moving each reward to its response's first token",
                       dataclasses.replace(case, variant="first_token"), ident)] if shape == "verl" else []
    return tokens + [
        Relation("shift", "Eq. 4", "adding 8 to column 1 of group 1", _replace_rows(case, shifted), ident),
        Relation("scale", "Eq. 4", "multiplying column 1 of group 1 by 4", _replace_rows(case, scaled), ident),
        Relation("rows", "Eq. 4", "reversing the rows of group 2", _replace_rows(case, r[rows_perm]), rows_perm),
        Relation("groups", "Eq. 4 or 6", "swapping groups 0 and 3", _replace_rows(case, r[groups_perm]), groups_perm),
        Relation("negate", "Eq. 7", "negating every weight",
                 dataclasses.replace(case, weights=tuple(-x for x in w)), ident, -1.0),
        Relation("split", "Eq. 7", "splitting column 1 into two copies of half its weight",
                 dataclasses.replace(_replace_rows(case, split), weights=(w[0], w[1] / 2, w[2], w[1] / 2)), ident),
    ]


#: what each broken relation says of the code ("scale": by how much it moves the advantages)
_BROKEN = {"tokens": "a response's score is not the sum of its token rewards",
           "shift": "the baseline is not the group's own mean",
           "scale": ("the group std or eps enters otherwise than std + eps", "no division by the group's own std"),
           "rows": "the rows of a group are not treated alike",
           "groups": "the groups are not treated alike",
           "negate": "the advantages are not odd in the weights (normalised or absolute weights?)",
           "split": "c is not the sum of w_k z_k"}
#: per call shape, what a broken "rows" or "groups" relation asks: how that shape gives the groups
_GROUPS_ASKED = {"trl": "are the groups the contiguous blocks of num_generations rows?",
                 "gdpo": "are the groups the contiguous blocks of group_size rows?",
                 "verl": "are the groups the samples sharing a uid of index?"}


def _paper(case: Case) -> np.ndarray | None:
    exp = expected(case, "spec")
    return None if exp.error is not None or exp.result is None else np.asarray(exp.result.float64)


def broken_relations(call, case: Case, out: np.ndarray, allowed, shape: str = "gdpo") -> list[str]:
    """A line for each relation of :func:`relations` that the code (``call(case) -> array or None``,
    called in ``shape``) breaks on ``case``: its response differs from the paper's, on some row, by
    more than both batches' allowances there (``allowed(case) -> array``: the error model at the
    code's precision)."""
    base = _paper(case)
    found = []  # (the largest difference from the paper's response, the paper's own response, relation)
    for rel in relations(case, shape):
        got, paper = call(rel.case), _paper(rel.case)
        if got is None or paper is None or base is None:
            continue
        code = got - rel.sign * out[rel.perm]
        exact = paper - rel.sign * base[rel.perm]
        diff = np.abs(code - exact)
        if np.any(diff > allowed(case)[rel.perm] + allowed(rel.case)):
            found.append((float(np.max(diff)), float(np.max(np.abs(exact))), rel))
    found.sort(key=lambda f: -f[0])
    # a relation moved no more than eps moves the paper's is secondary beside one moved by O(1)
    found = [f for f in found if f[0] > 0.1 or found[0][0] <= 0.1]
    # Eq. 4's relations presume the ones before them: the groups (rows, groups), then the baseline
    # (shift), then the std (scale). Where a premise breaks, what follows from it says nothing more.
    # The verl shape's scores come first of all: where moving a reward within its response moves the
    # advantages, every other relation (it moves rows, so their token layout) says nothing more.
    names = {rel.name for _, _, rel in found}
    after = names - {"tokens"} if "tokens" in names else {"shift", "scale"} if names & {"rows", "groups"} \
        else {"scale"} if "shift" in names else set()
    lines = []
    for off, paper, rel in found:
        if rel.name not in after:
            what = _BROKEN[rel.name] if rel.name != "scale" else _BROKEN["scale"][off > 0.1]
            if rel.name == "split" and shape == "verl":  # its rewards and weights are two dicts
                what += " (are the weights paired with the rewards by key, not by sorted key or position?)"
            if rel.name in ("rows", "groups"):
                asked = _GROUPS_ASKED.get(shape, _GROUPS_ASKED["gdpo"])
                if rel.name == "groups":  # (each part of the batch whitened alone breaks it too)
                    asked = asked[:-1] + ", and is Eq. 6 over the whole batch?"
                what += f" ({asked})"
            own = f"the paper's changes by {paper:.2g}" if paper else "the paper's does not change"
            lines.append(f"{rel.stage}: {what} ({rel.words} moves the advantages by {off:.2g}; {own})")
    return lines


def whitening_lines(case: Case, out: np.ndarray, tol: float) -> list[str]:
    """Eq. 6's own relation on one output: mean 0 and std 1 (up to eps) over the batch; where it
    fails, whether it holds within each prompt group instead (``tol``: the error model's typical
    allowance of one advantage)."""
    paper = _paper(case)
    if paper is None:
        return []
    n = out.size
    mean, std = float(out.mean()), float(out.std(ddof=1))
    want = float(paper.std(ddof=1))
    if abs(mean) <= tol and abs(std - want) <= tol * math.sqrt(n):
        return []
    labels = case.labels()
    per = [(float(out[labels == g].mean()), float(out[labels == g].std(ddof=1))) for g in np.unique(labels)]
    if all(abs(m) <= tol for m, _ in per) and all(abs(s - 1.0) <= 1e-2 for _, s in per if s > 0):
        return ["Eq. 6: the advantages have mean 0 and std 1 within each prompt group, not over the batch"]
    return [f"Eq. 6: over the batch the advantages have mean {mean:.3g} and std {std:.4g}; the paper's have "
            f"mean 0 and std {want:.4g}"]


# ------------------------------------------------------------------ the profile


@dataclasses.dataclass
class Profile:
    """What the probes tell about the graded code (see the module docstring)."""

    precision: str  # "float64" or "float32": the working precision every case is judged at
    how: str  # one line: how the precision was told
    diagnosis: Diagnosis | None = None  # the formula the probes show (None: not diagnosed)
    lines: tuple = ()  # where no variant reproduces the probes: what breaks, stage by stage
    failed: str = ""  # why the probes told nothing (a refusal, a non-finite output), or ""
    outputs: tuple = ()  # (case, advantages) of every probe and transformed probe
    narrow: str = ""  # where the probes show arithmetic narrower than float32: that, in words

    @property
    def formula(self) -> str | None:
        """The formula's differences from the paper, one line (None: the paper's, or not told)."""
        d = self.diagnosis
        if d is None or self.narrow:
            return None
        if d.matched:
            return "; ".join(d.differences) or None
        return "; ".join(self.lines) or "no variant of the catalogue reproduces the probes"

    @property
    def named(self) -> bool:
        return self.diagnosis is not None and self.diagnosis.matched

    def statement(self) -> str:
        """One line for the report: the precision, and the formula the probes show."""
        if self.failed:
            return self.how
        if self.narrow:
            return f"{self.narrow}: graded at float32 precision"
        if self.formula is None:
            return f"{self.how}; formula: the paper's on every probe"
        return f"{self.how}; formula: {self.formula}" + ("" if self.named else " (no catalogued variant)")


def _values(subject, case: Case):
    """The code's advantages of ``case`` as float64, or None where it refuses or returns
    something other than finite values; and the outcome."""
    out = subject.outcome(subject.call, case)
    if not _shaped(out, case) or not np.all(np.isfinite(out.values)):
        return None, out
    return np.asarray(out.values, dtype=np.float64), out


def _shaped(out, case: Case) -> bool:
    """Did the call return one advantage per row (whatever their values)?"""
    return out.ok and out.values is not None and out.values.shape == (case.n,)


def _relative_residual(pairs, variant, factor: bool = False) -> float:
    """The largest error of the outputs from ``variant``'s float64 values, relative to each
    output's scale; ``factor``: from those values times the factor that fits each probe best."""
    worst = 0.0
    for case, o in pairs:
        a = formulas.evaluate(case, variant)
        scale = max(float(np.max(np.abs(a))), 1e-300)
        if factor and np.any(a):
            a = a * (float(a @ o) / float(a @ a))
        worst = max(worst, float(np.max(np.abs(o - a))) / scale)
    return worst


#: a probe reproduced this closely (relative to its scale) was computed in float64: a float32
#: computation errs by at least one float32 rounding of a square root, about 2^-25 relative
FLOAT64_RESIDUAL = 2.0 ** -40
#: no variant reproduces the probes, yet none is off the paper's by more than this (relative to its
#: scale), and not by a factor: the code computes in bfloat16 or float16 inside (bfloat16 errs by
#: 2^-9 an operation, in either direction). A formula difference is off by far more on some probe
#: (0.28 to 2.9 on the held-out codes, where a code with bfloat16 intermediates was off by 0.0036),
#: or by a factor (a scale of 1.001: off by 0.001, by 3e-16 once each probe's best factor is taken)
NARROW_RESIDUAL = 2.0 ** -6


def _narrow_format(outs) -> str:
    """The narrow format (bfloat16, float16) every advantage of the probes is a value of, where one
    is: the mark of a code computing in it and returning it widened; "" otherwise."""
    for fmt in ("bfloat16", "float16"):
        if all(np.array_equal(round_to(o, fmt), o) for o in outs):
            return fmt
    return ""


def profile(subject) -> Profile:
    """The probes' verdict on ``subject`` (:class:`conformance.subject.Subject`)."""
    ctx = subject.context()
    cases = [c for c in probe_cases(ctx) if subject.inside(c)]
    if not cases:
        return Profile("float32", "the probes lie outside the declared domain: graded at float32 precision",
                       failed="outside the declared domain")
    outs, returned, kept, words, non_finite = [], set(), [], [], 0
    for i, case in enumerate(cases):
        values, out = _values(subject, case)
        if values is None and _shaped(out, case):  # NaN or inf where it computes: the others can tell
            non_finite += 1
            continue
        if values is None:
            return Profile("float32", "graded at float32 precision (the probes could not tell: "
                           f"{' '.join(out.describe().split())[:100]})", failed=out.describe())
        kept.append(case)
        words.append(PROBE_WORDS[i] if i < len(PROBE_WORDS) else f"probe {i}")
        outs.append(values)
        returned.add(out.dtype)
    if not kept:
        return Profile("float32", "graded at float32 precision (the probes could not tell: every probe gave "
                       "non-finite advantages)", failed="non-finite advantages on every probe")
    first_kept = kept[0] is cases[0]
    cases = kept
    as_out = "float64" if returned == {"float64"} else cases[0].out_dtype
    pairs = [(dataclasses.replace(c, out_dtype=as_out), o) for c, o in zip(cases, outs)]
    if first_kept and cases[0].k == 3 and cases[0].n == 16:
        for rel in relations(cases[0], subject.shape):
            values, _ = _values(subject, rel.case)
            if values is not None:
                pairs.append((dataclasses.replace(rel.case, out_dtype=as_out), values))
    d = diagnose_many(pairs, unit_roundoff=FLOAT32_UNIT_ROUNDOFF)
    precision = "float32"
    if d.matched and as_out == "float64" and _relative_residual(pairs, d.variant) <= FLOAT64_RESIDUAL:
        precision = "float64"
        d = diagnose_many(pairs, unit_roundoff=FLOAT64_UNIT_ROUNDOFF)
    how = f"returns {as_out}" if as_out != "float64" else f"computes in {precision}" if d.matched else \
        "returns float64 (its precision not told: no variant of the formula reproduces the probes)"
    left = f" ({non_finite} of {non_finite + len(kept)} probes gave NaN or inf advantages: told by the rest)" \
        if non_finite else ""
    prof = Profile(precision, f"{how}: graded at {precision} precision{left}", d, outputs=tuple(pairs))
    if not d.matched:
        narrow, off = _narrow_format(outs), _relative_residual(pairs, formulas.PAPER)
        if narrow:
            prof.narrow = (f"computes in {narrow}: every advantage of the probes is a {narrow} value, off the "
                           f"paper's by up to {off:.2g} of its scale")
        elif off <= NARROW_RESIDUAL and _relative_residual(pairs, formulas.PAPER, factor=True) > off / 2 and 2 * sum(
                _off_paper(c, o) for c, o in pairs[:len(cases)]) > len(cases):  # narrow arithmetic errs on most
            prof.narrow = (f"computes in bfloat16 or float16 inside: off the paper's by up to {off:.2g} of its "
                           "scale, as such arithmetic errs")
        else:
            call = (lambda c: _values(subject, c)[0])
            if first_kept:
                prof.lines = tuple(broken_relations(call, cases[0], outs[0], _allowed, subject.shape)) \
                    + tuple(whitening_lines(cases[0], outs[0], float(np.median(_allowed(cases[0])))))
            if not prof.lines:  # the first probe keeps every relation: which probes the code is off on
                prof.lines = tuple(_off_lines(pairs[:len(cases)], words))
    return prof


#: what each probe of :func:`probe_cases` exercises, in its order, for the report
PROBE_WORDS = ("4 groups of 4, three columns", "one outlier among 10 groups (|a| = 5.4)",
               "the same scaled by 2^-8 (group stds about 1e-5, eps dominant at Eq. 4)",
               "tiny weights (eps dominant at Eq. 6)", "weights summing to -2.5", "5 groups of 2", "2 groups of 8",
               "2 groups of 12, one outlier (|z| = 3.2 at Eq. 4)",
               "2 groups of 128, one outlier (|z| = 11.2 at Eq. 4, |a| = 11.2)",
               "64 groups of 16 (1,024 rows)",
               "the first scaled by 2^-30 (group stds below 3e-9)")


def _off_paper(case: Case, o: np.ndarray) -> bool:
    """Is the output off the paper's, as the diagnosis judges at float32 precision?"""
    return not reproduces(case, o, formulas.PAPER, FLOAT32_UNIT_ROUNDOFF)


def _off_lines(pairs, words) -> list[str]:
    """Which probes (``words``: what each is) the code is off the paper on, and by how much, where the
    relations do not say."""
    off, fine = [], []
    for (case, o), name in zip(pairs, words):
        if _off_paper(case, o):
            off.append(f"{name} (off by {float(np.max(np.abs(o - formulas.evaluate(case, formulas.PAPER)))):.2g})")
        else:
            fine.append(name)
    return ["off the paper's formula on " + ", ".join(off) + "; it holds on " + (", ".join(fine) if fine else "no probe")]


def _allowed(case: Case) -> np.ndarray:
    """Per advantage: the error model of a correct mean-then-subtract float32 code (the widest precision a
    code is graded at; the probes could not tell this one's)."""
    conv = dataclasses.replace(get_convention("spec"), algorithm="mean_then_subtract", native_dtype="float32")
    exp = expected(case, conv)
    if exp.result is None:
        return np.zeros(case.n)
    return np.asarray(exp.result.allowed(case.out_dtype, conv.unit_roundoff))
