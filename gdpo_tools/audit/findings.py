"""What ``gdpo audit`` can find, each with a stable code, a severity (``routine`` exits 0,
``warning`` 1, ``error`` 3), a sentence in plain words and what to do about it; and the terms
the report uses, defined where they first appear. The codes are the JSON report's interface: a
new finding gets a new code, and a code is never reused for another meaning.
"""

from __future__ import annotations

import dataclasses

#: Diagnostics only (they never change a result): a group column whose std is below this
#: multiple of eps has its Eq. 4 scale set mostly by eps, not by the data.
EPS_DOMINATED_FACTOR = 10.0
#: A group whose combined values (Eq. 7) may move by more than this fraction of their scale
#: when every input moves one ulp (the oracle's ``cond``) is ill-conditioned: ten orders of
#: magnitude above a healthy group's ~1e-16, so its values are set by the inputs' last bits.
ILL_CONDITIONED = 1e-6

ROUTINE, WARNING, ERROR = "routine", "warning", "error"


@dataclasses.dataclass(frozen=True)
class Kind:
    code: str
    severity: str
    scope: str  # "group", "unit" or "batch"
    title: str
    advice: str
    terms: tuple = ()  # the glossary entries its sentence uses


KINDS = {k.code: k for k in (
    Kind("collapsed-column", ROUTINE, "group", "a reward column is constant within the group",
         "nothing to do: routine with binary rewards (every generation scored alike on that component); "
         "Eq. 4 gives such a column z = 0 exactly, so it adds nothing to the group's advantages",
         ("collapsed", "group")),
    Kind("unscored", ROUTINE, "group", "rewards not scored (NaN, with --missing unscored)",
         "nothing to do where a reward function did not score some samples: each such reward has z = 0 and is "
         "left out of its column's statistics, as impl.gdpo's missing=\"unscored\" computes", ()),
    Kind("no-signal", ROUTINE, "group", "the group gives training no signal",
         "nothing to do, or drop the group before training (dynamic sampling; impl.gdpo.group_has_signal "
         "makes the same decision as this report)", ("group",)),
    Kind("exact-cancellation", WARNING, "group", "the reward columns cancel exactly",
         "check the reward functions: columns that are copies of each other up to shift and sign (r2 = C - r1) "
         "carry one signal counted with opposite signs; drop one of them or change the weights",
         ("structural zero",)),
    Kind("partial-cancellation", WARNING, "group", "two reward columns cancel on some rows of the group",
         "check the reward functions: on those rows one column mirrors the other (r2 = C - r1), so their weighted "
         "z cancel and those rows differ only in the other columns; drop one of them or change the weights",
         ("group",)),
    Kind("ill-conditioned", WARNING, "group", "the combined values are set by the rewards' last bits",
         "subtract a large common offset from the rewards before training, or check whether two columns nearly "
         "cancel (r2 close to C - r1), or, with eps 0, whether a column is constant within the group (any eps > 0 "
         "damps it): the advantages of this group are rounding of the inputs, not signal",
         ("ulp", "cond")),
    Kind("eps-dominated", WARNING, "group", "eps, not the data, sets a column's scale",
         "rescale that reward so that its std within a group is well above eps, or set a smaller eps (--eps "
         "here, the eps argument in training)", ("eps",)),
    Kind("two-samples", WARNING, "group", "a group of two samples loses magnitudes",
         "use at least 3 samples per prompt where how much better one answer is than another matters",
         ("n_g",)),
    Kind("float32-range", WARNING, "group", "rewards beyond float32's range",
         "rescale the rewards: float32 code (every peer) overflows there and returns zeros or NaN; impl.gdpo "
         "computes in float64, but its float32 output must fit too", ()),
    Kind("unit-collapsed", WARNING, "unit", "every advantage of the whitening unit is 0",
         "the whole training batch carries no signal: check the reward functions, or whether every group of the "
         "batch was without signal", ("unit",)),
    Kind("impl-disagrees", ERROR, "group", "impl.gdpo disagrees with the exact result",
         "a bug of impl.gdpo: report it with this file and this output", ("error bound",)),
)}

#: The terms the report uses, defined once (the text report prints those its findings use).
TERMS = {
    "group": "the samples of one prompt (the file's group label); Eq. 4 standardizes each reward column "
             "within its group",
    "n_g": "the number of samples in a group",
    "unit": "a whitening unit: the samples one Eq. 6 normalization runs over (one optimizer batch); the "
            "whole file unless it has a unit column",
    "collapsed": "every value of a column (or every combined value of a unit) exactly equal: the "
                 "specification then gives exactly 0, with no tolerance",
    "structural zero": "a value that is exactly 0 in exact arithmetic because of the batch's structure "
                       "(collapsed columns, or columns equal up to shift and sign that cancel), demanded "
                       "bit for bit of an implementation",
    "ulp": "unit in the last place: the gap between a float64 value and the next one (2.2e-16 at 1.0)",
    "cond": "how far a value moves, at most (first order), when every input changes by one ulp; a "
            "healthy group's is about 1e-16, as large as the values' own rounding",
    "eps": "the constant added to each std (Eq. 4, Eq. 6) so that a tiny std cannot blow values up; "
           "1e-4 in the specification",
    "error bound": "the largest error the specification's error model allows a correct float64 "
                   "implementation (spec/gdpo.md section 7)",
}

_PLACEMENT = {"std": "added to the std", "var": "added to the variance", "std_if_positive": "added to a positive std",
              "skip_if_zero": "none (a zero std skips the division)"}


def peer_difference(conv, spec) -> str:
    """Why a peer convention's advantages differ from the specification's, in words, from
    the presets themselves (spec/conventions.py): only the choices that differ."""
    said = []
    if conv.group_ddof != spec.group_ddof:
        said.append("biased std (divide by n)" if conv.group_ddof == 0 else f"ddof {conv.group_ddof}")
    if (conv.group_eps, conv.group_eps_placement) != (spec.group_eps, spec.group_eps_placement):
        said.append(f"Eq. 4 eps {conv.group_eps:g} {_PLACEMENT[conv.group_eps_placement]}")
    if conv.whiten != spec.whiten:
        said.append({"none": "no Eq. 6", "per_token": "Eq. 6 token-weighted"}.get(conv.whiten, f"Eq. 6 {conv.whiten}"))
    if conv.whiten != "none" and (conv.whiten_eps, conv.whiten_eps_placement) != (spec.whiten_eps,
                                                                                spec.whiten_eps_placement):
        said.append("Eq. 6 without eps, a zero std skipping the division" if conv.whiten_eps == 0 else
                    f"Eq. 6 eps {conv.whiten_eps:g} {_PLACEMENT[conv.whiten_eps_placement]}")
    if conv.whiten != "none" and conv.whiten_ddof != spec.whiten_ddof:
        said.append(f"Eq. 6 ddof {conv.whiten_ddof}")
    formula = ", ".join(said) or "the same formula"
    return formula + (f" (its code computes in {conv.native_dtype})" if conv.native_dtype != "float64" else "")


def finding(code: str, message: str, **facts) -> dict:
    """One finding of the report: its code, severity, the sentence, the advice, and facts
    (numbers, column names) for machines."""
    kind = KINDS[code]
    return {"code": code, "severity": kind.severity, "message": message, "advice": kind.advice, **facts}
