"""Comparing an output with the oracle, and failures that explain themselves.

The tolerance of every output is the oracle's ``allowed(out_dtype)``: the spec's
error model (``spec/error_model.py``) evaluated on the exact intermediate values,
never a picked rtol. Where the specification demands an exact zero (a collapsed
group column or unit, a group whose combined values cancel exactly; spec section
7) the output must be exactly zero, either sign.

A failure prints the equation, the convention, the inputs in hex, observed and
exact values, the error in ulps of the output dtype, the allowed bound, the
condition estimate, and a one-line repro. The error/allowed ratio has as many digits
as it takes to read above 1 (1.00003, never 1), and an error and allowance equal to
four digits are printed to 17 digits and in hex; a float16/bfloat16 output equal to
the exact value rounded through float32 first is named as rounded twice, beside the
correctly rounded value. A demanded exact zero is stated as such, with the clause of
the specification that demands it (a collapsed column or unit, two columns equal up
to shift and sign cancelling), never as a distance in ulps at 0; a refusal the
contract does not permit says why it computes the case. The repro line
(``python -m conformance.replay ...``, :mod:`conformance.replay`) replays the case
under the property that found it and prints the same report.
"""

from __future__ import annotations

import math
import shlex

import numpy as np

from conformance.cases import DistCase, ulp
from spec.error_model import round_to


def bound_row(i, obs, exact, err, allowed, ratio, cond, out_dtype, rounded) -> str:
    """One output outside its bound, with as many digits as it takes to see that it is."""
    obs, exact, err, allowed, ratio, cond = (float(x) for x in (obs, exact, err, allowed, ratio, cond))
    u = ulp(exact, out_dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        ulps = err / u if u else math.inf
    p = _digits(ratio)
    if f"{err:.3e}" == f"{allowed:.3e}":  # equal to four digits: show the bits
        e_txt, a_txt = f"{err:.17g} ({hx(err)})", f"{allowed:.17g} ({hx(allowed)})"
    else:
        e_txt, a_txt = f"{err:.3e}", f"{allowed:.3e}"
    # err > allowed, both doubles: err / allowed >= 1 + 2^-52 / m > 1 + 2^-53 never rounds to 1
    in_ulps = f" = {ulps:.{p}g} ulp({out_dtype})" if exact != 0.0 else ""  # no ulp scale at an exact 0
    text = (f"[{i}] observed {hx(obs)} ({obs:.9g}), exact {hx(exact)} ({exact:.17g}), "
            f"error {e_txt}{in_ulps}, allowed {a_txt} (error/allowed {ratio:.{p}g}), cond {cond:.2e}")
    twice = _rounded_twice(exact, out_dtype)
    if rounded is not None and twice is not None and obs == twice and obs != rounded and math.isfinite(obs):
        text += (f"; rounded twice? {obs!r} ({hx(obs)}) is the exact value rounded to float64, then float32, "
                 f"then {out_dtype}; the correctly rounded {out_dtype} value is {rounded!r} ({hx(rounded)})")
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


def hx(x: float) -> str:
    x = float(x)
    return x.hex() if math.isfinite(x) else repr(x)


def decimal(x: float, dtype: str = "float64") -> str:
    """``x`` (a value ``dtype`` holds) as the shortest decimal that reads back to it in ``dtype``
    (float32's 0x1.2ced32p+126 is ``1e+38``: ``torch.tensor(1e38, dtype=torch.float32)`` is that
    value), the way a maintainer types it; the repro line keeps the exact hex."""
    x = float(x)
    if x == 0.0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    if not math.isfinite(x):
        return repr(x)
    if dtype not in ("float64", "float32", "float16", "bfloat16"):
        return repr(x)
    if x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    for digits in range(1, 18):
        text = f"{x:.{digits}g}"
        if float(round_to([float(text)], dtype)[0]) == x:
            return text
    return x.hex()


def describe_inputs(case) -> str:
    if isinstance(case, tuple):  # the errors property: one base call broken every way
        return f"{len(case)} broken calls, e.g. " + describe_inputs(case[0])
    if isinstance(case, DistCase):
        return "\n".join(f"    rank {r}: {describe_inputs(s)}" for r, s in enumerate(case.shards))
    parts = [f"rewards ({case.dtype}, {case.n}x{case.k}) " + _matrix(case.rewards, case.dtype)]
    parts.append(f"group_size {case.group_size}" if case.group_size is not None
                 else f"group_ids {list(case.group_ids) if case.group_ids is not None else None}")
    parts.append("weights " + ("ones" if case.weights is None else "[" + ", ".join(decimal(w) for w in case.weights) + "]"))
    parts.append(f"segment_sizes {list(case.segment_sizes) if case.segment_sizes is not None else None}")
    parts.append(f"eps {'default' if case.eps is None else decimal(case.eps)}")
    parts.append(f"out {case.out_dtype}")
    if case.variant:
        parts.append(f"variant {case.variant}")
    if case.note:
        parts.append(f"built as {case.note}")
    return "; ".join(parts)


def _matrix(rows, dtype: str = "float64") -> str:
    shown = [("[" + ", ".join(decimal(v, dtype) for v in row) + "]") for row in rows[:16]]
    more = f", ... ({len(rows) - 16} more rows)" if len(rows) > 16 else ""
    return "[" + ", ".join(shown) + more + "]"


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
    from conformance.verdicts import label

    what = f" [{label(category)}]" if category else ""
    lines = [f"[{prop}]{what} {equation} of {subject.target} (call shape {subject.shape}, convention "
             f"{subject.convention!r}): {headline}"]
    lines += [f"  {d}" for d in details]
    lines.append("  inputs: " + describe_inputs(case).lstrip())
    lines.append("  repro: " + repro(subject, case, prop))
    return "\n".join(lines)
