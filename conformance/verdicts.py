"""What a failure means for the maintainer who reads it: its category, and its worst error.

Every :class:`conformance.judge.ConformanceFailure` carries one :class:`Category`
(``failure.category``) and, where the failure is a distance from the exact value, the
worst error in ulps of the dtype the implementation is judged at (``failure.worst_ulps``,
``failure.worst_dtype``). The summary table of a grading
run (:mod:`conformance.plugins`), its JSON and the generated peers page
(``spec/generated/peers.md``) print them.

A category is decided by the judge from what the implementation returned, never from
the text of the failure:

``silent_zero``
    an output exactly 0 where the exact value is not 0 and the error model does not
    allow 0 (a column or a group dropped without a word: float overflow squared to
    inf, an inf reward turned into 0);
``non_finite``
    a NaN or an infinity returned where the exact result is finite (padding tokens
    included: NaN times a 0 mask is NaN);
``precision``
    a finite output farther from the exact value than the error model of the
    convention's own algorithm at its own working precision allows;
``exact_zero``
    a structural zero the convention demands bit for bit is not exactly 0;
``refused``
    an exception where the contract computes the case;
``accepted``
    a result where the contract refuses the input (bad input accepted silently);
``wrong_class``
    a clear refusal of a bad input with an exception class other than
    ``spec.errors``' (reported, and a failure only under the strict error contract);
``call_shape``
    the output breaks its call shape (dtype, shape, device, an input written to);
``policy``
    under a peer's convention, an input its NaN or singleton policy computes gives
    another result than that policy's;
``formula``
    the output follows a different formula (which equation, how:
    :mod:`conformance.formulas`);
``rounding``
    an implementation that declares certified rounding (``gdpo_certified = True``) returned
    a float32, bfloat16 or float16 output other than the exact value correctly rounded (ties
    to even), or a float64 output more than one ulp from the exact value (not faithful);
    within the error model it may well be (property ``certified``);
``protocol``
    across several ranks: a rank that hangs, ranks that raise different errors or not
    together, a refusal that does not name the offending rank, or twinned groups whose
    advantages differ bit for bit.
"""

from __future__ import annotations

import enum
import math


#: Each category's words, by its name (the module docstring says what each means).
CATEGORIES: dict[str, str] = {
    "silent_zero": "silent zero",
    "non_finite": "non-finite output",
    "precision": "accuracy beyond its own precision",
    "exact_zero": "structural zero not exact",
    "refused": "refused where the contract computes",
    "accepted": "bad input accepted silently",
    "wrong_class": "refused with another exception class",
    "call_shape": "output breaks its call shape",
    "formula": "formula differs from the paper",
    "policy": "not the convention's own NaN or singleton policy",
    "rounding": "not the certified rounding it declares",
    "protocol": "breaks the protocol across ranks",
}
#: What a failure means; the judge (:mod:`conformance.judge`) sets exactly one per failure. A member
#: is its own value as a string (``Category.PRECISION == "precision"``), so JSON, the summary table
#: and the peers page carry the plain name.
Category = enum.StrEnum("Category", [(name.upper(), name) for name in CATEGORIES], module=__name__)


#: The categories decided by the graded code's float arithmetic on a case (a last bit; an overflow
#: of a sum whose order another CPU's SIMD width may choose): the only verdicts that may differ
#: between two machines grading the same cases (``docs/grading.md``, "The same cases on any machine").
ARITHMETIC = (Category.PRECISION, Category.NON_FINITE, Category.SILENT_ZERO, Category.EXACT_ZERO,
              Category.ROUNDING)


#: Below this magnitude (rewards and weights) a case is ordinary: no float32 square overflows, so
#: an output off by more than rounding there is another formula or a defect of arithmetic
#: (the judge's formula diagnosis, the findings' regimes).
ORDINARY = 1e4


def ordinary(case, unscored_ok: bool = False) -> bool:
    """Every reward and weight of ``case`` (one process's call with rows) finite and within
    :data:`ORDINARY`; ``unscored_ok``: a NaN reward of a ``missing="unscored"`` case too."""
    if not getattr(case, "rewards", ()):
        return False
    values = [v for row in case.rewards for v in row] + list(case.weights or ())
    return all((unscored_ok and math.isnan(v) and bool(case.missing)) or (math.isfinite(v) and abs(v) <= ORDINARY)
               for v in values)


def label(category: str | None) -> str:
    """The category's words (``-`` for none)."""
    return CATEGORIES.get(category, category) if category else "-"
