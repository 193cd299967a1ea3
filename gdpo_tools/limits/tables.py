"""The known-limit tables, measured against the exact oracle.

Every builder takes ``(fast, seed, progress)`` and returns its tables (with the cases they ran)
and the facts the plots and the documented limits read. A row depends only on its own case and
the seed, so ``--fast`` produces a subset of the full run's rows, identical cell for cell.
"""

from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np
import torch

from gdpo_tools.limits import families as fam
from gdpo_tools.limits import peers as P
from gdpo_tools.peer_formulas import one_pass_variance, two_pass_variance
from oracle.exact import exact_std
from impl import gdpo
from spec.constants import FLOAT32_MAX
import mpmath
from conformance import boundary
from conformance.cases import expected

DBL_MAX = float(np.finfo(np.float64).max)


@dataclasses.dataclass
class Table:
    id: str
    title: str
    intro: str  # markdown: what the table shows and the cases it ran
    head: list
    rows: list
    keys: int = 1  # leading columns that identify a row


def fmt(x, digits: int = 2) -> str:
    """Few significant digits, so that platform noise in the last bits cannot flip a cell."""
    if x is None:
        return "-"
    x = float(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0.0:
        return "0"
    return f"{x:.{digits}g}"


def fmt_c(c: float) -> str:
    return f"{c:.0e}"


def _max_abs(x) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(np.max(np.abs(x))) if x.size else 0.0


def _err(out, exact) -> float:
    with np.errstate(invalid="ignore"):
        return _max_abs(np.asarray(out) - np.asarray(exact))


def _ratio(err: np.ndarray, allowed: np.ndarray) -> float:
    err = np.asarray(err, dtype=np.float64)
    allowed = np.asarray(allowed, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(allowed > 0, err / np.where(allowed > 0, allowed, 1.0), np.where(err > 0, np.inf, 0.0))
    return float(np.max(r)) if r.size else 0.0


# ---------------------------------------------------------------- 1. cancellation

D = np.array([0.1, 0.2, 0.3, 0.7])
HEALTHY = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
CS_FULL = tuple(10.0 ** e for e in range(3, 17))
CS_FAST = (1e3, 1e9, 1e11, 1e13, 1e15, 1e16)


def cancellation_case(c: float, kind: str, unit: str):
    """``[C - d, d]`` (kind "cd") or the exact constant sum ``[C - d, C - fl(C - d)]`` ("cs")."""
    r1 = c - D
    r2 = D.copy() if kind == "cd" else c - r1  # Sterbenz: c - r1 is exact in float64
    r = np.stack([r1, r2], 1)
    g = np.zeros(4, np.int64)
    if unit == "shared":
        r = np.concatenate([r, HEALTHY])
        g = np.repeat([0, 1], 4)
    return r, g


def measure_cancellation(r, g) -> dict:
    res = P.oracle(r, g)
    out = P.run(P.IMPLEMENTATIONS["impl64"], r, g)
    naive = P.run(P.IMPLEMENTATIONS["naive_f64"], r, g)
    grp = g == 0  # the cancellation group's rows (the shared unit adds a healthy group)
    m = {
        "exact_max": _max_abs(res.float64[grp]),
        "cond_max": float(np.max(res.cond[grp])),
        "cond_sharp": bool(np.all(res.cond_sharp[grp])),  # cond is the first-order change itself, not a bound
        "impl_err": _err(out, res.float64),
        "impl_ratio": _ratio(np.abs(out - res.float64), res.allowed("float64")),
        "impl_max": _max_abs(out[grp]),
        "naive_err": _err(naive, res.float64),
        "naive_max": _max_abs(naive[grp]),
        "collapsed": int(res.group_collapsed[0].sum()),
    }
    m["naive_per_cond"] = m["naive_err"] / m["cond_max"] if m["cond_max"] > 0 else math.nan
    worst, who, own_max = -1.0, "", 0.0
    for name in P.FLOAT32_PEERS:
        p = P.IMPLEMENTATIONS[name]
        seen = P.as_seen_by(p, r)
        own = P.oracle(seen, g, convention=p.convention)
        o = P.run(p, seen, g)
        e = _err(o, own.float64)
        own_max = max(own_max, _max_abs(own.float64[grp]))
        if name == "trl":
            m["trl_err"] = e
            m["trl_vs_f64"] = _err(o, res.float64)
        if e > worst or math.isnan(e):
            worst, who = e, name
    m["peer_err"], m["peer_worst"], m["peer_exact_max"] = worst, who, own_max
    return m


def build_cancellation(fast: bool, seed: int, progress) -> tuple[list[Table], dict]:
    cs = CS_FAST if fast else CS_FULL
    facts: dict = {}
    step = progress("1 cancellation", 4 * len(cs))
    rows_cd, rows_cs = [], []
    for kind in ("cd", "cs"):
        for unit in ("own", "shared"):
            for c in cs:
                m = measure_cancellation(*cancellation_case(c, kind, unit))
                facts[(kind, unit, c)] = m
                step()
                if kind == "cd":
                    rows_cd.append([fmt_c(c), unit, fmt(m["exact_max"]), fmt(m["cond_max"]), fmt(m["impl_err"]),
                                    fmt(m["impl_ratio"]), fmt(m["naive_err"]), fmt(m["naive_per_cond"]),
                                    fmt(m["trl_err"]), f"{fmt(m['peer_err'])} ({m['peer_worst']})",
                                    fmt(m["trl_vs_f64"])])
                else:
                    rows_cs.append([fmt_c(c), unit, str(m["collapsed"]), fmt(m["exact_max"]), fmt(m["impl_max"]),
                                    fmt(m["naive_max"]), fmt(m["peer_exact_max"]),
                                    f"{fmt(m['peer_err'])} ({m['peer_worst']})"])
    cases = ", ".join(fmt_c(c) for c in cs)
    common = (
        f"Cases: C in {{{cases}}}; the group is 4 samples with d = 0.1, 0.2, 0.3, 0.7, two reward columns, "
        "equal weights, eps 1e-4. Unit `own`: the group is whitened alone; `shared`: it shares its unit with "
        "the healthy group `[[1,0],[0,0],[1,1],[0,1]]`. Errors are the largest absolute error over the unit's "
        "outputs against the oracle's correctly rounded float64 result. `impl` is `impl.gdpo` with "
        "`out_dtype=float64` (its own error, not the final cast's half ulp). `max abs a` and `cond` are over "
        "the cancellation group's rows; errors over every output of the unit. `err/bound` divides by the spec "
        "error model's bound (`Result.allowed`): at most 1 means within the model. The float32 peers "
        "(TRL, verl, NeMo-RL one-pass, NVlabs, ms-swift mirrors) are graded against the oracle under their own "
        "convention on the float32 rounding of the inputs they hold; the worst one is named.")
    t_cd = Table(
        "cancellation_cd", "1a. Cancellation: `[C - d, d]` groups",
        "The intended decimal inputs `r1 = C - d`, `r2 = d` sum to C exactly, so with equal weights the exact "
        "GDPO result of the *intended* inputs is exactly 0 everywhere. The float64 inputs are not those "
        "decimals: `fl(C - d) + d != C`, and the exact result of the quantized inputs grows to O(1) once ulp(C) "
        "is comparable to the spread (column `exact max abs a`). That growth is the problem's own "
        "conditioning: `cond` is the first-order change of an output when every input moves by one ulp, sharp "
        "(`cond_sharp`, to 2^-19: spec section 7) on every row but C = 1e16, where `C - d` rounds to one "
        "constant and the collapsed column leaves only the stage-wise upper bound. So an algorithm that "
        "perturbs its inputs by an ulp of their magnitude may be that far off. The naive "
        "algorithm (mean, then deviations) does about that: its error grows with C like the conditioning "
        "and stays below it (`naive err/cond` below 1 on every row) and reaches O(1) at C = 1e15. The impl "
        "subtracts one member of the "
        "group first, so its rounding is measured against the group's range, not C: its error stays at the "
        "last bits and within the spec bound (`err/bound <= 1`) on every row. The implementation error and "
        "the conditioning are separated column by column: `impl err` and `naive f64 err` are algorithms, "
        "`exact max abs a` and `max cond` are the problem. `TRL f32 err`: the float32 TRL mirror against the "
        "exact result of the float32 inputs it holds (mean-then-subtract in float32 at an offset C: large "
        "while float32 still resolves d, tiny once `C - d` rounds to a constant in float32). "
        "`TRL - exact(f64)`: how far the float32 TRL "
        "mirror is from the exact "
        "result of the float64 inputs (its own error plus the float32 rounding of the inputs).\n\n" + common,
        ["C", "unit", "exact max abs a", "max cond", "impl err", "impl err/bound", "naive f64 err",
         "naive err/cond", "TRL f32 err", "f32 peers worst err", "TRL - exact(f64)"], rows_cd, keys=2)
    t_cs = Table(
        "cancellation_cs", "1b. Cancellation: exact constant-sum groups `r2 = C - r1`",
        "Here `r1 = fl(C - d)` and `r2 = C - r1` computed exactly (Sterbenz), so the float64 inputs sum to C "
        "exactly and the exact result is 0 (the oracle decides it: column `exact max abs a`); in the own unit "
        "the zero is structural and the spec demands it bit for bit. `collapsed`: how many of the two columns "
        "are constant in the group (at C = 1e16 both round to constants). The float32 peers hold the float32 "
        "rounding of these inputs, which no longer sum to a constant: `f32 inputs: exact max abs a` is the "
        "exact result of what they hold, `f32 peers worst err` their error against it.\n\n" + common,
        ["C", "unit", "collapsed", "exact max abs a", "impl max abs a", "naive f64 max abs a",
         "f32 inputs: exact max abs a", "f32 peers worst err"], rows_cs, keys=2)
    return [t_cd, t_cs], facts


# ---------------------------------------------------------------------- 2. eps

EPS_VALUES = (1e-4, 1e-6, 1e-8)
STD_FULL = (1e-1, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 1e-5, 1e-6, 1e-7)
STD_FAST = (1e-2, 1e-3, 1e-5)
_PATTERN = np.array([0.0, 1.0, 3.0, 2.0, 2.0, 0.0, 1.0, 3.0])
_GROUP_B = np.array([[0, 3], [1, 1], [1, 4], [0, 1], [1, 5], [0, 9], [0, 2], [1, 6]], dtype=np.float64)


def eps_case(s: float):
    col2 = 1.0 + s * _PATTERN / float(np.std(_PATTERN, ddof=1))
    a = np.stack([np.array([1, 0, 1, 1, 0, 0, 1, 0], dtype=np.float64), col2], 1)
    return np.concatenate([a, _GROUP_B]), np.repeat([0, 1], 8)


def eps_effect(s: float):
    """The exact results of :func:`eps_case` under each eps, and the largest change of an
    advantage from eps 1e-4 and from 1e-6 against 1e-8."""
    r, g = eps_case(s)
    res = {e: P.oracle(r, g, eps=e) for e in EPS_VALUES}
    return res, _err(res[1e-4].float64, res[1e-8].float64), _err(res[1e-6].float64, res[1e-8].float64)


def build_eps(fast: bool, seed: int, progress) -> tuple[list[Table], dict]:
    stds = STD_FAST if fast else STD_FULL
    step = progress("2 eps", len(stds))
    facts, rows = {}, []
    for s in stds:
        res, d4, d6 = eps_effect(s)
        zmax = {e: _max_abs(res[e].z.float64[:8, 1]) for e in EPS_VALUES}
        facts[s] = {"std": exact_std(eps_case(s)[0][:8, 1]), "d4": d4, "d6": d6, "z": zmax}
        rows.append([fmt(s), fmt(facts[s]["std"]), *(fmt(zmax[e], 3) for e in EPS_VALUES), fmt(d4), fmt(d6)])
        step()
    t = Table(
        "eps", "2. eps: 1e-4 vs 1e-6 vs 1e-8 as a group column's std shrinks",
        "Exact results (oracle, eps given to both Eq. 4 and Eq. 6). Cases: a unit of two groups of 8 with two "
        "reward columns; in group A the first column is binary and the second is `1 + s * p / std(p)`, "
        "`p = [0, 1, 3, 2, 2, 0, 1, 3]`, so its std is s; group B is healthy (`[[0,3],[1,1],[1,4],[0,1],[1,5],"
        "[0,9],[0,2],[1,6]]`). `max abs z` is the largest standardized value of group A's second column under "
        "each eps (a column of full spread gives about 1.25 here); `max abs da` is the largest change of any "
        "advantage against eps 1e-8. Where the std falls below eps, eps = 1e-4 mutes the column (z shrinks "
        "like s / eps) while 1e-8 still blows it up to full size: the choice of eps decides whether a "
        "near-constant column is noise or signal.",
        ["target std s", "exact std", "max abs z (eps 1e-4)", "max abs z (1e-6)", "max abs z (1e-8)",
         "max abs da (1e-4 vs 1e-8)", "max abs da (1e-6 vs 1e-8)"], rows)
    return [t], facts


# --------------------------------------------------------- 3. n_g = 2 and correlation

GAPS_FULL = (1e-6, 1e-4, 1e-2, 1.0, 1e2, 1e4, 1e8)
GAPS_FAST = (1e-4, 1.0, 1e4)
RHO_FULL = (-1.0, -0.9, -0.5, 0.0, 0.5, 0.9, 1.0)
RHO_FAST = (-1.0, 0.0, 1.0)
_X = np.array([1, 1, 1, 1, -1, -1, -1, -1], dtype=np.float64)
_Y = np.array([1, 1, -1, -1, 1, 1, -1, -1], dtype=np.float64)
_Z = np.array([1, -1, 1, -1, 1, -1, 1, -1], dtype=np.float64)


def build_pairs_and_rho(fast: bool, seed: int, progress) -> tuple[list[Table], dict]:
    gaps, rhos = (GAPS_FAST, RHO_FAST) if fast else (GAPS_FULL, RHO_FULL)
    step = progress("3 n_g = 2, correlation", len(gaps) + len(rhos))
    facts = {"gap": {}, "rho": {}}
    rows = []
    for gap in gaps:
        r = np.array([[0.0], [gap], [0.0], [1.0]])
        res = P.oracle(r, np.array([0, 0, 1, 1]))
        z, a, a_ref = float(res.z.float64[1, 0]), float(res.float64[1]), float(res.float64[3])
        facts["gap"][gap] = {"z": z, "a": a, "a_ref": a_ref}
        rows.append([fmt(gap), f"{z:.4f}", f"{a:.4f}", f"{a_ref:.4f}"])
        step()
    t_gap = Table(
        "ng2", "3a. n_g = 2: magnitudes are lost",
        "Cases: one reward column; a group `[0, gap]` whitened in one unit with the reference group `[0, 1]` "
        "(exact results, eps 1e-4). Any two distinct values standardize to +-(gap/sqrt 2)/(gap/sqrt 2 + eps), "
        "+-0.7071 once the gap is well above eps: a gap of 1e8 and a gap of 1 give the same advantage, and "
        "only a gap near or below eps is damped. Within a group of two only the sign survives.",
        ["gap", "z of the larger member", "its advantage a", "a of the reference [0, 1]"], rows)
    rows = []
    for rho in rhos:
        block_a = np.stack([_X, rho * _X + math.sqrt(max(0.0, 1.0 - rho * rho)) * _Y], 1)
        res = P.oracle(np.concatenate([block_a, np.stack([_X, _Z], 1)]), np.repeat([0, 1], 8))  # B: uncorrelated
        c = res.combined.float64
        s_a, s_b = float(np.std(c[:8], ddof=1)), float(np.std(c[8:], ddof=1))
        amax, bmax = _max_abs(res.float64[:8]), _max_abs(res.float64[8:])
        corr = float(np.corrcoef(block_a[:, 0], block_a[:, 1])[0, 1])
        facts["rho"][rho] = {"std_c": s_a, "std_ref": s_b, "a": amax, "a_ref": bmax,
                             "c_zero": bool(np.all(res.combined.exact_zero[:8]))}
        rows.append([f"{rho:+.1f}", f"{corr:+.3f}", fmt(s_a, 3), fmt(s_b, 3), fmt(s_a / s_b, 3), fmt(amax, 3),
                     fmt(bmax, 3)])
        step()
    t_rho = Table(
        "correlation", "3b. Correlated components: amplification and attenuation",
        "Cases: two groups of 8, two reward columns, equal weights, one unit. Group A: `r1 = x`, "
        "`r2 = rho x + sqrt(1 - rho^2) y` with orthogonal centred +-1 patterns x, y; group B (reference): two "
        "uncorrelated +-1 patterns. Eq. 7 adds standardized columns, so the group's combined std is "
        "sqrt(2 + 2 rho) (times the eps damping): correlated components double-count one signal "
        "(rho = +1: sqrt 2 times the reference), anti-correlated ones cancel (rho = -1: exactly zero, the "
        "group carries no signal at all). Eq. 6 then hands that difference on to the advantages.",
        ["rho", "sample corr of the inputs", "std of c, group A", "std of c, reference", "ratio",
         "max abs a, group A", "max abs a, reference"], rows)
    return [t_gap, t_rho], facts


# ------------------------------------------------------------ 4. variance algorithms

OFFSETS_FULL = tuple(10.0 ** e for e in range(0, 9))
OFFSETS_FAST = (1.0, 1e3, 1e4, 1e8)
_STEPS = np.array([0.0, 0.01, 0.02, 0.03])
VARIANCE_ALGORITHMS = {"one-pass": one_pass_variance, "two-pass": two_pass_variance,
                       "shifted two-pass": lambda x, dt: two_pass_variance(x - x[0], dt)}


def variance_case(offset: float, dt: np.dtype) -> tuple[float, dict]:
    """The exact std of ``offset + _STEPS`` rounded to ``dt``, and each algorithm's variance of it."""
    x = (offset + _STEPS).astype(dt)
    with np.errstate(all="ignore"):
        return exact_std(x.astype(np.float64)), {name: alg(x, dt) for name, alg in VARIANCE_ALGORITHMS.items()}


def _variance_cell(var, exact: float) -> tuple[str, float]:
    var = float(var)
    if math.isnan(var) or var < 0:
        return f"NaN (variance {fmt(var)})", math.inf
    std = math.sqrt(var)
    if exact == 0.0:
        return ("0 (exact 0)" if std == 0.0 else f"{fmt(std)} (exact 0)"), (0.0 if std == 0.0 else math.inf)
    with mpmath.workprec(120):
        rel = float(abs(mpmath.mpf(std) - mpmath.mpf(exact)) / mpmath.mpf(exact))
    if std == 0.0:
        return "0: silent zero", rel
    return fmt(rel), rel


def build_variance(fast: bool, seed: int, progress) -> tuple[list[Table], dict]:
    offsets = OFFSETS_FAST if fast else OFFSETS_FULL
    step = progress("4 variance algorithms", len(offsets))
    facts, rows = {}, []
    for off in offsets:
        row = [fmt_c(off)]
        for dname in ("float64", "float32"):
            ex, variances = variance_case(off, np.dtype(dname))
            row.append(fmt(ex, 3))
            for aname, var in variances.items():
                cell, rel = _variance_cell(var, ex)
                facts[(off, dname, aname)] = {"var": float(var), "exact_std": ex, "rel": rel}
                row.append(cell)
        rows.append(row)
        step()
    head = ["offset"]
    for dname in ("float64", "float32"):
        head.append(f"exact std ({dname} inputs)")
        head += [f"{a} {dname}" for a in VARIANCE_ALGORITHMS]
    t = Table(
        "variance", "4. Variance algorithms against offset",
        "Cases: the group `offset + [0, 0.01, 0.02, 0.03]` rounded to the dtype (so the exact std is that of "
        "the rounded inputs, 0.0129 while they stay distinct), offsets 1e0 to 1e8. Cells: relative error of "
        "the computed std against the exact std (exact rational variance, square root at 120 bits). "
        "One-pass: `(sum x^2 / n - (sum x / n)^2) * n / (n - 1)` (NeMo-RL's form); two-pass: mean, then "
        "squared deviations; shifted two-pass: subtract the first member, then two-pass (this project's "
        "algorithm). A negative one-pass variance is shown as NaN (its square root); a zero std where the "
        "exact one is not is a silent zero (the group is then treated as collapsed).",
        head, rows)
    return [t], facts


# ------------------------------------------------------------------- 5. ranges

RANGE_IMPLS = ("impl", "naive_f64", "trl", "trl_torch", "verl", "nemo_rl", "nvlabs", "ms_swift",
               "multireward_grpo")
REWARD_MAGNITUDES_FULL = (1.0, 1e18, 1e19, 1e20, 1e30, 1e38, FLOAT32_MAX, 1e39, 1e100, 1e154, 1e155, 1e300,
                          DBL_MAX)
REWARD_MAGNITUDES_FAST = (1.0, 1e20, FLOAT32_MAX, 1e39, 1e155, DBL_MAX)
WEIGHT_SCALES_FULL = (5e-324, 1e-300, 1e-50, 1e-40, 1e-30, 1.0, 1e30, FLOAT32_MAX, 1e39, 1e300, DBL_MAX)
WEIGHT_SCALES_FAST = (1e-50, 1.0, 1e39, DBL_MAX)
_SHORT = {"silent zero": "silent 0", "clear error": "error"}  # the table's words for two outcomes


def _magnitude(x: float) -> str:
    return {FLOAT32_MAX: "FLT_MAX", DBL_MAX: "DBL_MAX"}.get(x) or fmt(x, 3)


_W_REWARDS = np.array([[1, 0], [0, 1], [1, 1], [0, 0], [0, 2], [1, 0], [1, 3], [0, 1]], dtype=np.float64)
_TWO_GROUPS = np.repeat([0, 1], 4)


def range_outcome(name: str, r, g, weights) -> tuple[str, object]:
    """What ``name`` makes of the case: an outcome class, graded against the oracle under its own
    convention on the inputs it holds (or on the float64 inputs where it cannot hold them)."""
    impl = P.IMPLEMENTATIONS[name]
    seen = P.as_seen_by(impl, r)
    with np.errstate(over="ignore"):
        w_seen = None if weights is None else tuple(
            float(np.float32(x)) if impl.float32_inputs else float(x) for x in weights)
    res = P.oracle(seen if np.all(np.isfinite(seen)) else r, g, weights=weights, convention=impl.convention)
    gr = P.grade(P.run(impl, seen, g, None, w_seen), res, impl)
    cell = _SHORT.get(gr.outcome, gr.outcome)
    if gr.outcome in ("clear error", "n/a") and gr.detail:
        cell += f" ({gr.detail})"
    return cell, gr


def build_ranges(fast: bool, seed: int, progress) -> tuple[list[Table], dict]:
    mags = REWARD_MAGNITUDES_FAST if fast else REWARD_MAGNITUDES_FULL
    scales = WEIGHT_SCALES_FAST if fast else WEIGHT_SCALES_FULL
    fm = FLOAT32_MAX
    reward_cases = {_magnitude(m): (np.concatenate([np.array([-1.0, -0.5, 0.5, 1.0]) * m,
                                                    np.array([0.0, 0.25, 0.5, 1.0]) * m])[:, None], _TWO_GROUPS, None)
                    for m in mags}
    reward_cases.update({
        "[-FLT_MAX, FLT_MAX] + [0, 1]": (np.array([[-fm], [fm], [0.0], [1.0]]), np.repeat([0, 1], 2), None),
        "[FLT_MAX]*10 + [-FLT_MAX]": (np.array([fm] * 10 + [-fm])[:, None], np.zeros(11, np.int64), None)})
    weight_cases = {}
    for w in scales:
        lab = _magnitude(w)
        weight_cases[f"({lab}, 1)"] = (_W_REWARDS, _TWO_GROUPS, (w, 1.0))
        weight_cases[f"({lab}, {lab})"] = (_W_REWARDS, _TWO_GROUPS, (w, w))
    equal_columns = np.array([[0.0], [1.0], [3.0], [1.0], [2.0], [0.0], [5.0], [1.0]]).repeat(2, 1)
    weight_cases["(2^24, -(2^24 + 1)), r2 = r1"] = (equal_columns, _TWO_GROUPS, (16777216.0, -16777217.0))
    step = progress("5 ranges", (len(reward_cases) + len(weight_cases)) * len(RANGE_IMPLS))
    facts = {"rewards": {}, "weights": {}}

    def outcome_rows(cases, kind):
        rows = []
        for label, (r, g, w) in cases.items():
            row = [label]
            for name in RANGE_IMPLS:
                cell, gr = range_outcome(name, r, g, w)
                facts[kind][(label, name)] = gr.outcome
                row.append(cell)
                step()
            rows.append(row)
        return rows

    rows_r, rows_w = outcome_rows(reward_cases, "rewards"), outcome_rows(weight_cases, "weights")
    head = ["case"] + list(RANGE_IMPLS)
    legend = (
        "Outcomes: `correct` (within the spec error model of the oracle's result at the implementation's "
        "working precision), `off` (finite but outside it), `silent 0` (an exact zero where the exact result "
        "is not), `NaN`, `inf`, `error` (a GDPOError/ValueError naming the input, class shown), `no error` "
        "(numbers where the oracle refuses). Each implementation is graded under its own convention on the "
        "inputs it holds (the float32 peers round rewards and weights to float32 once); where that rounding "
        "overflows, against the exact result of the float64 inputs. Implementations: "
        + ", ".join(f"`{n}` = {P.IMPLEMENTATIONS[n].title}" for n in RANGE_IMPLS) + ".")
    t_r = Table(
        "ranges_rewards", "5a. Ranges: reward magnitude",
        "Cases: one reward column, one unit of two groups, `M * [-1, -0.5, 0.5, 1]` and "
        "`M * [0, 0.25, 0.5, 1]` (float64 inputs), for M on the ladder below; then two float32 extremes "
        "(`[-FLT_MAX, FLT_MAX]` with a `[0, 1]` group, and `[FLT_MAX]*10 + [-FLT_MAX]` alone). "
        "impl returns float32 (its default).\n\n" + legend, head, rows_r)
    t_w = Table(
        "ranges_weights", "5b. Ranges: weights",
        "Cases: two reward columns, two groups of 4 (`[[1,0],[0,1],[1,1],[0,0]]`, `[[0,2],[1,0],[1,3],[0,1]]`), "
        "weights `(w, 1)` and `(w, w)` for w on the ladder below; then the float32-indistinct pair "
        "`(16777216, -16777217)` on identical columns (the exact combined value is `-z`, nonzero; float32 "
        "merges the weights and cancels it).\n\n" + legend, head, rows_w)
    equal_weights = [f"({_magnitude(w)}, {_magnitude(w)})" for w in scales if w >= 1]
    summary = [[name, *_largest_correct(facts["rewards"], name, map(_magnitude, mags)),
                *_largest_correct(facts["weights"], name, equal_weights)] for name in RANGE_IMPLS]
    if fast:  # the summary reads the whole ladder: only the full run has it
        return [t_r, t_w], facts
    t_s = Table(
        "ranges_summary", "5c. Ranges: largest magnitude handled",
        "From 5a and 5b: the largest reward magnitude M (5a ladder) and the largest equal weights `(w, w)` "
        "(5b ladder, w >= 1) up to which the implementation is correct on every rung, and what happens on "
        "the next rung.",
        ["implementation", "largest M correct", "next M: outcome", "largest (w, w) correct",
         "next w: outcome"], summary)
    return [t_r, t_w, t_s], facts


def _largest_correct(outcomes: dict, name: str, ladder) -> list[str]:
    best, nxt = "none", "-"
    for label in ladder:
        o = outcomes[(label, name)]
        if o == "correct":
            best = label
        else:
            nxt = f"{label}: {_SHORT.get(o, o)}"
            break
    return [best, nxt]


# --------------------------------------------------------------------- 6. peers

PEER_CASES = 64


def build_peers(fast: bool, seed: int, progress) -> tuple[list[Table], dict]:
    families = tuple(fam.FAMILIES)  # cheap enough that the fast subset runs every family too
    step = progress("6 peers", len(families) * PEER_CASES)
    facts: dict = {}
    for family in families:
        for case in fam.cases(family, PEER_CASES, seed):
            spec_res = P.oracle(case.rewards, case.groups, weights=case.weights, token_counts=case.tokens)
            for name in P.PEER_TABLE:
                impl = P.IMPLEMENTATIONS[name]
                seen = P.as_seen_by(impl, case.rewards)
                out = P.run(impl, seen, case.groups, weights=case.weights, token_counts=case.tokens)
                own = spec_res if impl.convention == "spec" else P.oracle(
                    seen, case.groups, weights=case.weights, token_counts=case.tokens, convention=impl.convention)
                for grading, res in (("own", own), ("spec", spec_res)):
                    gr = P.grade(out, res, impl)
                    facts.setdefault((name, family, grading), []).append(gr)
            step()
    tables = []
    for grading, title, graded in (
            ("own", "6a. Peers graded under their own convention",
             " Graded against the oracle under the implementation's own convention, on the inputs it "
             "holds: this is its implementation error alone."),
            ("spec", "6b. Peers graded under this project's `spec` convention",
             " Graded against the oracle under `spec` (eps 1e-4 added to the std at Eq. 4 and Eq. 6, "
             "unbiased, per-sample whitening, NaN refused): convention differences and "
             "implementation error together.")):
        rows = [[f"{name} ({P.IMPLEMENTATIONS[name].convention})",
                 *(_peer_cell(facts[(name, f, grading)]) for f in families)] for name in P.PEER_TABLE]
        intro = (
            f"Cases: {PEER_CASES} seeded cases per family (`gdpo_tools/limits/families.py`, seed shown in the "
            "header), float32 reward values, one or several groups per unit. Each implementation runs its "
            "convention's formula in its own dtype (float32 mirrors; `impl64` is `impl.gdpo` with float64 "
            "output; `multireward_grpo` float64, its native dtype). Cell: the worst |error| / bound over the "
            "family, the bound being the error model of the graded convention's algorithm at the implementation's "
            "working precision (`Result.allowed(out_dtype, unit_roundoff)`: under a peer's convention its "
            "mean-then-subtract code, under spec the shift-invariant one), so at most 1 means as accurate as a "
            "correct code of that algorithm in that precision; `[abs e]` the worst absolute error; then the number of "
            "cases per outcome other than correct/off (`clear error`: a GDPOError raised; `no error`: numbers "
            "where the graded convention refuses the input; `NaN propagated`: NaN outputs exactly where the "
            "graded convention propagates a NaN reward, which is correct under it; `demanded 0 missed by x`: "
            "a structural exact zero returned as x)." + graded)
        tables.append(Table(f"peers_{grading}", title, intro, ["implementation (convention)", *families], rows))
    rows = []
    for name in P.PEER_TABLE:
        for grading in ("own", "spec"):
            bad = []
            for f in families:
                counts = collections.Counter(g.outcome for g in facts[(name, f, grading)])
                tags = [f"{k} {v}" for k, v in counts.items() if k in ("silent zero", "NaN", "inf")]
                if tags:
                    bad.append(f"{f}: " + ", ".join(tags))
            rows.append([name, grading, "; ".join(bad) if bad else "none"])
    tables.append(Table(
        "peers_outcomes", "6c. Peers: cases ending in silent zeros, NaN or inf",
        f"From 6a and 6b: per family, how many of the {PEER_CASES} cases end with an exact zero where the graded "
        "result is not zero (`silent zero`), with a NaN where the graded result has none, or with an inf. "
        "Under the implementation's own convention a NaN that the convention itself propagates is correct, "
        "not counted.",
        ["implementation", "graded under", "families with silent zero / NaN / inf"], rows, keys=2))
    return tables, facts


def _peer_cell(grades) -> str:
    ratios = [g.ratio for g in grades
              if g.outcome in ("correct", "off", "silent zero") and not math.isnan(g.error)]
    errors = [g.error for g in grades if not math.isnan(g.error)]
    parts = ([fmt(max(ratios))] if ratios else []) + ([f"[{fmt(max(errors))}]"] if errors else [])
    tags = [f"{k} {v}" for k, v in collections.Counter(g.outcome for g in grades).items()
            if k not in ("correct", "off")]
    propagated = sum(1 for g in grades if g.detail == "NaN propagated")
    if propagated:
        tags.append(f"NaN propagated {propagated}")
    missed = max((g.missed_zero for g in grades), default=0.0)
    if missed > 0:
        tags.append(f"demanded 0 missed by {fmt(missed)}")
    return " ".join(parts + ([", ".join(tags)] if tags else [])) or "-"


# --------------------------------------------------------- 7. certified rounding

#: cases per family, the same in the fast and the full run (a fast row is the full run's row)
CERT_COUNT = 3
CERT_DTYPES = ("float32", "bfloat16", "float16", "float64")
_TIERS = ("float64", "group_exact", "double_double", "exact", "uncertified")


def build_certified(fast: bool, seed: int, progress) -> tuple[list[Table], dict]:
    """Which tier decided each output of impl.gdpo (``certified="all"``: float64 outputs too),
    and whether every output is the oracle's rounding."""
    ordinary = [f for f in fam.FAMILIES if f != "NaN reward"]
    hunted = {f: list(boundary.cases(f, None, 1))
              for f in (("eps_bisect", "cancellation", "tie_below") if fast else boundary.FAMILIES)}
    step = progress("7 certified rounding", len(ordinary) + len(hunted))
    facts, rows = {}, []

    def row(name, kind, calls):
        """``calls``: per case, (the rewards tensor, impl's keywords, the oracle's Result)."""
        for od in CERT_DTYPES:
            tot = dict.fromkeys(("n", *_TIERS, "wrong"), 0)
            for rewards, kw, res in calls:
                d = gdpo.Diagnostics()
                out = gdpo.gdpo_advantages(rewards, out_dtype=getattr(torch, od), diagnostics=d, certified="all",
                                           **kw).double().numpy()
                want = res.rounded(od)
                tot["n"] += out.size
                for f in _TIERS:
                    tot[f] += getattr(d.certified, f)
                if od == "float64":
                    tot["wrong"] += int(np.sum(np.abs(out - want) > np.spacing(np.abs(want))))
                else:
                    tot["wrong"] += int(np.sum(out != want))
            facts[(name, od)] = tot
            n = max(tot["n"], 1)
            rows.append([name, kind, od, str(tot["n"]), *(f"{100 * tot[f] / n:.1f}%" for f in _TIERS[:4]),
                         str(tot["uncertified"]), str(tot["wrong"])])
        step()

    def listed(x):
        return None if x is None else list(x)

    for name in ordinary:
        row(name, "ordinary", [(torch.tensor(c.rewards), dict(group_ids=torch.tensor(c.groups),
                                                             weights=listed(c.weights)),
                                P.oracle(c.rewards, c.groups, weights=c.weights))
                               for c in fam.cases(name, CERT_COUNT, seed)])
    for name, cs in hunted.items():
        calls = []
        for c in cs:
            kw = dict(group_size=c.group_size, weights=listed(c.weights), segment_sizes=listed(c.segment_sizes))
            if c.group_ids is not None:
                kw["group_ids"] = torch.tensor(c.group_ids)
            if c.eps is not None:
                kw["eps"] = c.eps
            calls.append((torch.tensor(c.rewards, dtype=getattr(torch, c.dtype)), kw, expected(c).result))
        row(name, "hunted", calls)
    t = Table(
        "certified", "7. Certified rounding: which tier decided each output",
        "`impl.gdpo` certifies the rounding of every output (spec section 7a; float64 outputs under "
        "`certified=\"all\"`, as here): the float64 result where its run-time bound leaves no rounding boundary "
        "in reach, else the row's group in exact integer arithmetic (group-exact), else a double-double "
        "recomputation, else exact arithmetic. Per input family and output dtype: the samples, the share each "
        "tier decided, the samples "
        "left uncertified (only across ranks: none in these local calls) and the outputs that differ from the "
        "oracle's correct rounding (float64: more than one ulp). Ordinary families: the peer table's seeded "
        f"families ({CERT_COUNT} cases each); hunted families: `conformance/boundary.py`, one case per target "
        "format (the fast run: three families), cases whose exact value lies on a rounding midpoint of float32, bfloat16 or float16, or within two float64 ulps of one). A "
        "float64 output is faithful, not unique: the float64 tier cannot certify it (its bound spans more "
        "than an ulp), so float64 outputs come from double-double.",
        ["family", "kind", "out dtype", "samples", "float64", "group-exact", "double-double", "exact", "uncertified",
         "not the correct rounding"], rows, keys=3)
    return [t], facts


BUILDERS = {"cancellation": build_cancellation, "eps": build_eps, "pairs": build_pairs_and_rho,
            "variance": build_variance, "ranges": build_ranges, "peers": build_peers, "certified": build_certified}
