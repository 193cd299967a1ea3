"""An output against the oracle's exact values and allowances (:func:`distance`: spec section 7's
exact zeros, each naming the clause that demands it), and the failure texts: the equation, the
convention, the inputs, observed and exact values, ulps, the bound and a repro line.
"""

from __future__ import annotations

import dataclasses
import math
import shlex

import numpy as np

from conformance.cases import Case, DistCase, hexf, ulp
from conformance.verdicts import Category, label
from spec import error_model as em
from spec.error_model import FORMATS, round_to

#: outputs listed in a failure, at most
MAX_LISTED = 6


def bound_row(i, obs, exact, err, allowed, ratio, cond, out_dtype, rounded) -> str:
    """One output outside its bound, with as many digits as it takes to see that it is."""
    obs, exact, err, allowed, ratio, cond = (float(x) for x in (obs, exact, err, allowed, ratio, cond))
    u = ulp(exact, out_dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        ulps = err / u if u else math.inf
    p = _digits(ratio)
    if f"{err:.3e}" == f"{allowed:.3e}":  # equal to four digits: show the bits
        e_txt, a_txt = f"{err:.17g} ({hexf(err)})", f"{allowed:.17g} ({hexf(allowed)})"
    else:
        e_txt, a_txt = f"{err:.3e}", f"{allowed:.3e}"
    # err > allowed, both doubles: err / allowed >= 1 + 2^-52 / m > 1 + 2^-53 never rounds to 1
    in_ulps = f" = {ulps:.{p}g} ulp({out_dtype})" if exact != 0.0 else ""  # no ulp scale at an exact 0
    text = (f"[{i}] observed {hexf(obs)} ({obs:.9g}), exact {hexf(exact)} ({exact:.17g}), "
            f"error {e_txt}{in_ulps}, allowed {a_txt} (error/allowed {ratio:.{p}g}), cond {cond:.2e}")
    twice = _rounded_twice(exact, out_dtype)
    if rounded is not None and twice is not None and obs == twice and obs != rounded and math.isfinite(obs):
        text += (f"; rounded twice? {obs!r} ({hexf(obs)}) is the exact value rounded to float64, then float32, "
                 f"then {out_dtype}; the correctly rounded {out_dtype} value is {rounded!r} ({hexf(rounded)})")
    return text


def _digits(ratio: float) -> int:
    """Significant digits (3 at least) that show a ratio as it is against 1: a ratio above 1
    never reads as 1 (1.00003 is 1.00003, not 1)."""
    if not math.isfinite(ratio) or ratio == 1.0:
        return 3
    for p in range(3, 18):
        shown = float(f"{ratio:.{p}g}")
        if (shown > 1.0) == (ratio > 1.0) and shown != 1.0:
            return p
    return 17


def _rounded_twice(x: float, out_dtype: str) -> float | None:
    """float64 ``x`` rounded to float32, then to ``out_dtype`` (float16/bfloat16), each
    nearest even (what torch's float64 ``.to(float16)`` does); None for other formats."""
    if out_dtype not in ("float16", "bfloat16") or not math.isfinite(x):
        return None
    return float(round_to(round_to([x], "float32"), out_dtype)[0])


def decimal(x: float, dtype: str = "float64") -> str:
    """``x`` (a value ``dtype`` holds) as the shortest decimal that reads back to it in ``dtype``
    (float32's 0x1.2ced32p+126 is ``1e+38``: ``torch.tensor(1e38, dtype=torch.float32)`` is that
    value), the way a maintainer types it; the repro line keeps the exact hex."""
    x = float(x)
    if x == 0.0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    if not math.isfinite(x) or dtype not in FORMATS:  # an integer, bool or complex tensor's value too
        return repr(x)
    if x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    for digits in range(1, 18):
        text = f"{x:.{digits}g}"
        if float(round_to([float(text)], dtype)[0]) == x:
            return text
    return x.hex()


def describe_inputs(case, shape: str = "gdpo") -> str:
    """The call's inputs in the argument names of its call shape (``trl``, ``verl`` or ``gdpo``)."""
    if isinstance(case, tuple):  # the errors property: one base call broken every way
        return f"{len(case)} broken calls, e.g. " + describe_inputs(case[0], shape)
    if isinstance(case, DistCase):
        return "\n".join(f"    rank {r}: {describe_inputs(s, shape)}" for r, s in enumerate(case.shards))
    shown = ", ".join("[" + ", ".join(decimal(v, case.dtype) for v in row) + "]" for row in case.rewards[:16])
    more = f", ... ({case.n - 16} more rows)" if case.n > 16 else ""
    rewards = f"({case.dtype}, {case.n}x{case.k}) [{shown}{more}]"
    weights = "ones" if case.weights is None else "[" + ", ".join(decimal(w) for w in case.weights) + "]"
    groups = (f"group_size {case.group_size}" if case.group_size is not None
              else f"group_ids {list(case.group_ids) if case.group_ids is not None else None}")
    if shape == "trl":
        parts = [f"rewards_per_func {rewards}", f"num_generations {case.group_size}", f"reward_weights {weights}"]
    elif shape == "verl":
        index = (f"uid labels in runs of {case.group_size}" if case.group_size is not None
                 else f"'uid' + {list(case.group_ids) if case.group_ids is not None else None}")
        parts = [f"scores {rewards}, each spread over its response tokens (token_level_rewards)",
                 f"index {index}", f"weights {weights}"]
    else:
        parts = [f"rewards {rewards}", groups, f"weights {weights}",
                 f"segment_sizes {list(case.segment_sizes) if case.segment_sizes is not None else None}",
                 f"eps {'default' if case.eps is None else decimal(case.eps)}",
                 f"out {'int64' if case.variant == 'int_out_dtype' else case.out_dtype}"]
    if case.variant:
        parts.append(f"variant {case.variant}")
    if case.note:
        parts.append(f"built as {case.note}")
    return "; ".join(parts)


def repro(subject, case, prop: str | None = None) -> str:
    """The command line that replays ``case`` under the check of property ``prop`` (None: the
    check main() picks by the case's kind, which is not the failing one for a stage or error property)."""
    where = ""
    if getattr(subject, "device", "cpu") != "cpu":
        where += f" --device {shlex.quote(subject.device)}"
    if getattr(subject, "backend", "gloo") != "gloo":
        where += f" --backend {shlex.quote(subject.backend)}"
    if getattr(subject, "precision", None):
        where += f" --precision {subject.precision}"
    return (f"python -m conformance.replay --impl {shlex.quote(subject.target)} --convention {subject.convention} "
            f"--call-shape {subject.shape}{where}" + (f" --property {shlex.quote(prop)}" if prop else "") +
            f" --case {shlex.quote(case.dumps())}")


def failure(prop: str, equation: str, subject, case, headline: str, details=(), category=None) -> str:
    what = f" [{label(category)}]" if category else ""
    lines = [f"[{prop}]{what} {equation} of {subject.target} (call shape {subject.shape}, convention "
             f"{subject.convention!r}): {headline}"]
    lines += [f"  {d}" for d in details]
    lines.append("  inputs: " + describe_inputs(case, getattr(subject, "shape", "gdpo")).lstrip())
    lines.append("  repro: " + repro(subject, case, prop))
    return "\n".join(lines)


def _group_zero_clause(res, weights, g: int) -> str:
    """The clause of spec section 7 that makes group ``g``'s combined values a structural zero."""
    label = res.group_labels[g].item() if hasattr(res.group_labels[g], "item") else res.group_labels[g]
    k_cols = res.group_collapsed.shape[1]
    w = [1.0] * k_cols if weights is None else [float(x) for x in weights]
    live = [k for k in range(k_cols) if w[k] != 0.0 and not res.group_collapsed[g, k]]
    if not live:
        return (f"every reward column with a nonzero weight is constant in group {label!r} (a collapsed column "
                f"gives z = 0 exactly, spec sections 2 and 7)")
    if len(live) == 2:
        i, j = live
        return (f"columns {i} and {j} of group {label!r} are equal up to shift and sign and carry weights of "
                f"equal magnitude ({w[i]!r}, {w[j]!r}), so Eq. 7 cancels them exactly (structural "
                f"cancellation, spec section 7: bit for bit only where both columns' arithmetic mirrors "
                f"itself: the same row subtracted in every column, sums in an order fixed by position (no "
                f"sorting by value, no atomic adds), each product w z rounded on its own (no fused multiply-add))")
    return f"group {label!r}'s combined value is a structural zero (spec section 7)"


def combined_zero_clause(res, weights):
    """zero_why for c (normalize_rewards): row -> its group's clause."""
    return lambda i: _group_zero_clause(res, weights, int(res.group_index[i]))


def advantage_zero_clause(res, weights):
    """zero_why for the advantages: a collapsed unit made only of structural zeros of c."""
    def why(i: int) -> str:
        if res.unit_index is None or res.group_index is None:
            return ""
        u = int(res.unit_index[i])
        label = res.unit_labels[u].item() if hasattr(res.unit_labels[u], "item") else res.unit_labels[u]
        if (res.unit_collapsed is None or not res.unit_collapsed[u]) and res.required_zero is not None \
                and res.required_zero[i]:
            clause = _group_zero_clause(res, weights, int(res.group_index[i]))
            return (f"whitening unit {label!r} holds whole groups, so its mean is exactly 0 (Eq. 4 centres every "
                    f"group column), and this sample's c is a structural zero ({clause}), so Eq. 6 gives exactly "
                    f"0 (spec section 7: a code that subtracts a rounded batch mean returns rounding noise here)")
        if res.unit_collapsed is None or not res.unit_collapsed[u]:
            return ""
        groups = sorted({int(g) for g in res.group_index[res.unit_index == u]})
        clauses = [_group_zero_clause(res, weights, g) for g in groups[:2]]
        more = f" (and {len(groups) - 2} more groups alike)" if len(groups) > 2 else ""
        return (f"whitening unit {label!r} is collapsed: each of its combined values c is a structural zero ("
                + "; ".join(clauses) + more + "), so Eq. 6 gives exactly 0")
    return why


def whiten_zero_clause(case: Case):
    units = case.unit_ids()

    def why(i: int) -> str:
        u = 0 if units is None else int(units[i])
        return (f"whitening unit {u}'s given values are all equal (a collapsed unit gives a = 0 exactly, "
                f"spec section 2)")
    return why


@dataclasses.dataclass
class Verdict:
    """Comparison of one output vector with one oracle stage."""

    bad: list  # indices outside the bound (or not exactly zero where demanded)
    ratio: float  # max error / allowed over outputs with allowed > 0 (for hypothesis.target)
    rows: list  # per listed index: text
    #: what the failure means (conformance.verdicts): non_finite, silent_zero, exact_zero or precision
    category: str | None = None
    #: the worst error among the bad outputs, in ulps of ``judged_dtype`` (inf: a non-finite output)
    worst_ulps: float | None = None
    judged_dtype: str | None = None

    @property
    def ok(self) -> bool:
        return not self.bad


def judged_dtype(out_dtype: str, native_dtype: str = "float64") -> str:
    """The dtype whose ulps measure an error: the output's where it is narrower than the
    working precision, else the working precision's (a float32 code returning float64)."""
    return out_dtype if FORMATS[out_dtype][0] <= FORMATS[native_dtype][0] else native_dtype


def distance(observed: np.ndarray, exact: np.ndarray, allowed: np.ndarray, cond: np.ndarray, out_dtype: str,
             must_be_zero: np.ndarray | None = None, rounded: np.ndarray | None = None,
             zero_why=None, native_dtype: str = "float64") -> Verdict:
    """Outputs vs the exact values under the per-output bound. ``rounded``: the exact values
    correctly rounded into ``out_dtype``, named where an output looks rounded twice;
    ``zero_why(i)``: the clause of the specification that demands output ``i``'s exact zero."""
    obs = np.asarray(observed, dtype=np.float64)
    exact = np.asarray(exact, dtype=np.float64)
    allowed = np.asarray(allowed, dtype=np.float64)
    zero = (allowed == 0.0) & (exact == 0.0)
    if must_be_zero is not None:
        zero = zero | np.asarray(must_be_zero, bool)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(obs - exact)
        bad_zero = zero & (obs != 0.0)
        bad_bound = ~zero & ~(err <= allowed)  # NaN fails
        ratios = np.where(~zero & (allowed > 0), err / np.where(allowed > 0, allowed, 1.0), 0.0)
    bad = np.flatnonzero(bad_zero | bad_bound)
    finite = ratios[np.isfinite(ratios)]
    ratio = float(finite.max()) if finite.size else 0.0
    if np.any(~np.isfinite(obs)) or bad_zero.any():
        ratio = max(ratio, 1e300)
    order = sorted(bad.tolist(), key=lambda i: -(ratios[i] if np.isfinite(ratios[i]) else math.inf))
    rows = []
    said: dict = {}  # clause -> the first row that stated it
    for i in order[:MAX_LISTED]:
        if zero[i]:
            clause = (zero_why(i) if zero_why is not None else None) or \
                "the error model gives it no allowance (spec section 7: the exact value is demanded)"
            stated = f"as for [{said[clause]}]" if clause in said else clause
            said.setdefault(clause, i)
            rows.append(f"[{i}] returned {hexf(obs[i])} ({float(obs[i]):.9g}); the exact result is exactly 0, "
                        f"and {stated}: the specification demands 0 bit for bit (either sign), cond {cond[i]:.2e}")
            continue
        row = bound_row(i, obs[i], exact[i], err[i], allowed[i], ratios[i], cond[i], out_dtype,
                        None if rounded is None else float(np.asarray(rounded, dtype=np.float64)[i]))
        why = zero_why(i) if zero_why is not None and exact[i] == 0.0 and not np.isfinite(obs[i]) else ""
        rows.append(row + (f"; the exact result is 0 because {why}" if why else ""))  # (eps 0: not 0/0)
    category = worst = None
    in_dtype = judged_dtype(out_dtype, native_dtype)
    if bad.size:
        if np.any(~np.isfinite(obs[bad])):  # NaN or inf returned (an exact beyond float64 is refused, never inf)
            category = Category.NON_FINITE
        elif np.any((obs[bad] == 0.0) & (exact[bad] != 0.0) & ~zero[bad]):
            category = Category.SILENT_ZERO
        elif np.all(zero[bad]):
            category = Category.EXACT_ZERO
        else:
            category = Category.PRECISION
        with np.errstate(over="ignore", invalid="ignore"):
            ulps = [err[i] / ulp(exact[i], in_dtype) for i in bad.tolist()]
        fin = [u for u in ulps if np.isfinite(u)]
        worst = math.inf if len(fin) < len(ulps) else float(max(fin))
    return Verdict(bad.tolist(), ratio, rows, category, worst, in_dtype)


def native_allowed(stage, out_dtype: str, conv, unit_roundoff: float | None = None) -> np.ndarray:
    """The allowance of a code of convention ``conv``: the running bound of its algorithm at its
    unit roundoff (or at ``unit_roundoff``), under a peer's convention at least the backward
    error, and a float16 or bfloat16 output's second rounding through float32 (torch's float64
    cast: spec section 7)."""
    u = unit_roundoff or conv.unit_roundoff
    allowed = stage.allowed(out_dtype, u)
    if conv.algorithm == "shift_invariant":  # the specification's own algorithm: one rounding (--strict)
        return allowed
    with np.errstate(over="ignore", invalid="ignore"):
        backward = em.SAFETY * np.nan_to_num(stage.cond, nan=0.0) * (u / 2.0 ** -53)
        twice = em.through_float32(stage.reach(u), out_dtype)
    return np.where(allowed > 0.0, np.maximum(allowed, backward) + twice, allowed)
