"""What a failure means for the maintainer who reads it: its :class:`Category`, set by the judge
(:mod:`conformance.judge`) from what the implementation returned, never from the failure's text,
and, for a distance from the exact value, its worst error in ulps (``failure.worst_ulps``,
``failure.worst_dtype``). The table, the JSON and ``spec/generated/peers.md`` print the categories.

- ``silent_zero``: an output exactly 0 where the exact value is not and the error model does not
  allow 0 (a column or group dropped without a word: a square overflowed to inf, an inf reward);
- ``non_finite``: a NaN or infinity where the exact result is finite (padding tokens included);
- ``precision``: a finite output farther from the exact value than the error model of the
  convention's own algorithm at its own working precision allows;
- ``exact_zero``: a structural zero the convention demands bit for bit is not exactly 0;
- ``refused``: an exception where the contract computes; ``accepted``: a result where it refuses;
- ``wrong_class``: a refusal with another class than ``spec.errors``' (a clear one fails only under
  the strict error contract; a crash such as an ``IndexError``, always);
- ``call_shape``: the output breaks its call shape (dtype, shape, device, an input written to);
- ``policy``: under a peer's convention, another result than its NaN or singleton policy's;
- ``formula``: the output follows another formula (:mod:`conformance.formulas`);
- ``rounding``: a code declaring certified rounding returned a float32/bfloat16/float16 output
  other than the exact value correctly rounded, or a float64 one more than an ulp off;
- ``protocol``: across ranks: a hang, ranks raising differently or not together, a refusal not
  naming the rank, twinned groups whose advantages differ bit for bit.
"""

from __future__ import annotations

import enum
import math

#: Each category's words, by its name (the module docstring says what each means).
CATEGORIES: dict[str, str] = {
    "silent_zero": "silent zero", "non_finite": "non-finite output",
    "precision": "accuracy beyond its own precision", "exact_zero": "structural zero not exact",
    "refused": "refused where the contract computes", "accepted": "bad input accepted silently",
    "wrong_class": "refused with another exception class", "call_shape": "output breaks its call shape",
    "formula": "formula differs from the paper", "policy": "not the convention's own NaN or singleton policy",
    "rounding": "not the certified rounding it declares", "protocol": "breaks the protocol across ranks"}
#: One per failure. A member is its own value as a string (``Category.PRECISION == "precision"``),
#: so the JSON, the table and the peers page carry the plain name.
Category = enum.StrEnum("Category", [(name.upper(), name) for name in CATEGORIES], module=__name__)
#: The categories the graded code's float arithmetic decides on a case (a last bit; an overflow of a
#: sum whose order a SIMD width chooses): the only verdicts two machines may differ on
#: (``docs/grading.md``, "The same cases on any machine").
ARITHMETIC = (Category.PRECISION, Category.NON_FINITE, Category.SILENT_ZERO, Category.EXACT_ZERO,
              Category.ROUNDING)
#: Below this magnitude (rewards and weights) a case is ordinary: no float32 square overflows, so
#: an output off by more than rounding there is another formula or a defect of arithmetic.
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
