"""The formula, diagnosed: which variant of GDPO an implementation computes.

An output farther from the exact advantages than any rounding explains usually follows another
formula (a leave-one-out baseline, no division by the std, a biased std, another eps, no Eq. 6,
a clip). :func:`diagnose` searches the catalogue (:mod:`conformance.formulas`, each variant in
float64 as it reads; eps enumerated and, at Eq. 6, fitted; a clip read off the output) and names
the variant that reproduces the output within the code's own precision: the running error bound
of ``spec/error_model.py``'s mean-then-subtract model on the variant's own intermediates, at the
output's unit roundoff (float32's for float16 and bfloat16), plus half an ulp, plus the float64
evaluation's bound. Nothing is tuned.

A case cannot tell apart what it does not exercise (a NaN policy needs a NaN reward, ...): those
choices are listed (``Diagnosis.not_exercised``), variants it cannot separate all match
(``Diagnosis.alternatives``). The one named has the fewest differences, then a preset's formula,
standard eps values, the smallest error. :func:`diagnose_many` intersects several cases.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from conformance.formulas import (
    BASELINES, DDOFS, EPS_VALUES, NANS, ORDERS, PAPER, PLACEMENTS, SCALES, SINGLETONS, WHITENS, Variant, _Batch,
    _eq4, _Parts, _unit_stats, _whitened, _with, differences, evaluate, from_convention,
)
from spec import error_model as em
from spec.constants import FLOAT32_UNIT_ROUNDOFF, FLOAT64_UNIT_ROUNDOFF
from spec.conventions import CONVENTIONS

#: how many candidates, nearest first by their relative error, are judged against their own bound
CHECKED = 48


def unit_roundoff_of(out_dtype: str) -> float:
    """The working precision a code returning ``out_dtype`` is held to: float64's for
    float64, else float32's (no code computes in float16 or bfloat16)."""
    return FLOAT64_UNIT_ROUNDOFF if out_dtype == "float64" else FLOAT32_UNIT_ROUNDOFF


def _exact_constant(x: np.ndarray, u: float) -> bool:
    """A constant column whose every partial sum is exact at unit roundoff ``u``: any
    summation order gives n x, and n x / n is x, so a mean-then-subtract code's deviations
    are exactly 0 (z = 0 by any formula that divides them; the model's first-order bound,
    capped by Cauchy-Schwarz at O(1), would otherwise cover every variant of the unit)."""
    if x.size < 2 or not np.all(x == x[0]):
        return False
    dt = np.float32 if u >= FLOAT32_UNIT_ROUNDOFF else np.float64
    sums = x[0] * np.arange(1, x.size + 1, dtype=np.float64)
    with np.errstate(over="ignore"):
        return bool(np.all(sums.astype(dt).astype(np.float64) == sums))


def _combined_bound(b: _Batch, v: Variant, p: _Parts, u: float) -> np.ndarray:
    """Δc (units of u) of the variant's Eq. 4 and 7, kept per batch: every Eq. 6 choice
    shares it."""
    key = (_with(v, whiten="none", whiten_scope="unit", whiten_ddof=1, whiten_placement="std", whiten_eps=None,
                 clip=None), u)
    hit = b.bounds.get(key)
    if hit is not None:
        return hit
    K = p.x.shape[1]
    tau = em.underflow_tau(em.dtype_of(u))  # the working precision's own subnormal spacing, in its u
    dz = np.zeros_like(p.z)
    extra = (b.k + 1) if v.weights == "before" else 0  # the weighted sum's own rounding
    with np.errstate(all="ignore"):
        # what the weighted sum rounds: its terms' magnitudes (a sum that cancels is far smaller)
        terms = np.nan_to_num(np.abs(b.r), posinf=0.0) @ np.abs(b.w) if extra else None
        for m in b.members:
            for k in range(K):
                x = p.x[m, k]
                fin = np.isfinite(x)
                mag = float(np.max(np.abs(x[fin]))) if fin.any() else 0.0
                nn = int(p.n[m[0], k])
                d_dev = em.model_dev_perturbation(mag, max(nn, 1), tau) + (extra * float(np.max(terms[m])) if extra
                                                                           else 0.0)
                z = p.z[m, k]
                if nn >= 2 and _exact_constant(x[fin], u):  # its mean is exact: deviations exactly 0
                    continue
                if nn < 2:  # the policy's z: 0, or r / (1 + eps) rounded twice
                    dz[m, k] = 3.0 * np.abs(z)
                    continue
                if v.scale == "none":
                    dz[m, k] = d_dev * (nn / (nn - 1) if v.baseline == "leave_one_out" else 1.0) + 3.0 * np.abs(z)
                    continue
                dz[m, k] = em.standardize_groups_stage(p.dev[m, k], d_dev, float(p.sigma[m[0], k]),
                                                       float(p.denom[m[0], k]), z, nn, v.group_ddof, cap_u=u, tau=tau)
        if v.nan in ("nan_aware", "nan_aware_unscored"):
            dz = np.where(np.isnan(b.r if v.weights == "after" else p.x), 0.0, dz)  # a skipped reward's z is 0
        dc = em.combine_stage(np.nan_to_num(dz, nan=0.0, posinf=0.0), np.nan_to_num(p.z), p.w, tau=tau)
    b.bounds[key] = dc
    return dc


def _allowance(b: _Batch, v: Variant, p: _Parts, a: np.ndarray, u: float) -> np.ndarray:
    """Per output: how far a correct code of this variant, computing at unit roundoff
    ``u`` (mean then subtract) and rounding once to the output dtype, may be from the
    variant's exact value (spec/error_model.py's stages on the float64 intermediates)."""
    dc = _combined_bound(b, v, p, u)
    tau = em.underflow_tau(em.dtype_of(u))
    with np.errstate(all="ignore"):
        if v.whiten == "none":
            delta = dc
        else:
            ui, S, t, tt, T, mean, dev, ss = _unit_stats(b, v, p.c)
            delta = np.zeros(b.n)
            for s in range(S):
                m = np.flatnonzero(ui == s)
                if not m.size:
                    continue
                cu = p.c[m]
                if v.whiten == "center":
                    dm = float(np.sum(tt[m] * dc[m]) / T[s]) + (m.size + 1) * (float(np.max(np.abs(cu))) + tau)
                    delta[m] = dc[m] + dm + np.abs(dev[m]) + tau
                    continue
                var = ss[s] / (T[s] - v.whiten_ddof)
                sigma = math.sqrt(var) if var >= 0 else 0.0
                eps = b.eps if v.whiten_eps is None else v.whiten_eps
                if v.whiten_placement == "skip_if_zero" and sigma == 0.0:
                    delta[m] = dc[m]
                    continue
                denom = {"std": sigma + eps, "var": math.sqrt(var + eps)}.get(v.whiten_placement, sigma)
                delta[m] = em.whiten_stage(dc[m], cu, float(mean[s]), a[m] if v.clip is None else
                                           _whitened(b, _with(v, clip=None), p.c)[m],
                                           sigma, denom, v.whiten_ddof, t=t[m], unit_roundoff=u, tau=tau)
        if v.clip is not None:
            delta = np.where(np.abs(a) >= v.clip, 0.0, delta)
        delta = np.where(np.isfinite(delta), delta, np.inf)
        tol = em.allowed_error(delta, np.nan_to_num(a), b.out_dtype, u) + em.computed_bound(delta)
    return tol


def _ulps(err: np.ndarray, a: np.ndarray, o: np.ndarray, out_dtype: str) -> float:
    """The worst error in ulps of ``out_dtype`` at the output's largest magnitude (an ulp at a
    value near 0 measures no formula)."""
    with np.errstate(all="ignore"):
        mags = np.concatenate([np.abs(a[np.isfinite(a)]), np.abs(o[np.isfinite(o)]), [0.0]])
        ulp = 2.0 * float(em.half_ulp(np.array([mags.max()]), out_dtype)[0])
        q = err[~np.isnan(err)] / ulp
    return float(q.max()) if q.size else 0.0


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """What :func:`diagnose` found: the variant that reproduces the output (None: none does; then
    ``nearest``), its differences from the paper, its worst error in ulps and over its bound
    (``ratio`` <= 1: a match); ``alternatives``: the differences of the other matches;
    ``presets``: the conventions whose formula it is on this case."""

    variant: Variant | None
    differences: tuple
    residual_ulps: float
    ratio: float
    out_dtype: str
    nearest: Variant
    alternatives: tuple = ()
    presets: tuple = ()
    not_exercised: tuple = ()
    cases: int = 1
    #: every matching variant, the named one first
    matches: tuple = ()

    @property
    def matched(self) -> bool:
        return self.variant is not None

    @property
    def no_difference(self) -> bool:
        return self.matched and not self.differences


def _not_exercised(b: _Batch, token_counts) -> tuple:
    return tuple(what for unseen, what in (
        (not b.has_nan, "NaN policy (no NaN reward)"),
        (b.has_nan and not b.unscored, "unscored samples left out of Eq. 6 (no sample with every reward NaN)"),
        (not b.has_singleton, "singleton policy (no group of one)"),
        (not b.constant_column, "collapse handling at Eq. 4 (no constant group column)"),
        (b.S < 2, "whitening scope (one unit)"), (token_counts is None, "token weighting (no token counts)"))
        if unseen)


def _eq4_variants(b: _Batch, o_nan: bool = False):
    """The Eq. 4 and 7 variants this case exercises (a choice it cannot show keeps the paper's)."""
    eps_list = [None] + [e for e in EPS_VALUES if e != b.eps]
    nans = NANS[:1]
    if b.has_nan:  # a NaN output is propagation's; nan_aware_unscored differs only where a row is all NaN
        nans = ("propagate",) if o_nan else tuple(x for x in NANS[1:4] if b.unscored or x != "nan_aware_unscored")
    singles = SINGLETONS[1:] if b.has_singleton else SINGLETONS[:1]
    orders = ORDERS if (b.k > 1 or np.any(b.w != 1.0)) else ORDERS[:1]
    places = PLACEMENTS if b.constant_column else PLACEMENTS[:2]
    out = []
    for nan, single, order, base in itertools.product(nans, singles, orders, BASELINES):
        out.append(Variant(baseline=base, scale="none", singleton=single, nan=nan, weights=order))
        out += [Variant(baseline=base, scale=scale, group_ddof=ddof, group_placement=place, group_eps=eps,
                        singleton=single, nan=nan, weights=order)
                for scale, ddof, place in itertools.product(SCALES, DDOFS, places)
                for eps in (eps_list if place != "skip_if_zero" else [0.0])]
    return out


def _snap(x: float) -> list:
    """A fitted eps as the values a code would write: 0, and 1 and 2 significant digits."""
    if not (x > 0 and math.isfinite(x)):
        return [0.0]
    e = math.floor(math.log10(x))
    return [float(f"{round(x / 10 ** e, digits - 1)}e{e}") for digits in (1, 2)]


class _Search:
    def __init__(self, b: _Batch, o: np.ndarray):
        self.o = o
        top = _largest(o)
        self.scale = top if 0 < top < math.inf else 1.0
        self.nan_o = np.isnan(o)
        self.any_nan = bool(self.nan_o.any())
        self.found: dict = {}  # canonical variant -> rough relative error
        #: a relative error that rounding alone may well explain (64 ulps of the output's scale)
        self.near = 64.0 * 2.0 * em.half_ulp(np.array([1.0]), b.out_dtype)[0]

    def rough(self, a: np.ndarray) -> float:
        with np.errstate(all="ignore"):
            err = np.abs(self.o - a)
            if self.any_nan:
                if not np.array_equal(np.isnan(a), self.nan_o):
                    return math.inf
                err = np.where(self.nan_o, 0.0, err)
            e = float(err.max()) if err.size else 0.0  # a NaN of the variant alone: NaN, not finite
        return e / self.scale if math.isfinite(e) else math.inf

    def add(self, v: Variant, a: np.ndarray) -> float:
        v = v.canonical()
        e = self.rough(a)
        if e < self.found.get(v, math.inf):
            self.found[v] = e
        return e


#: at Eq. 6 a (ddof, eps) whose scale 1/D is off the fitted one by more than this (relative)
#: is not evaluated, unless none is nearer: its outputs are off by as much, far beyond rounding
SCALE_SLACK = 1e-3


def _search(b: _Batch, o: np.ndarray) -> _Search:
    """Every exercised variant's float64 advantages, each with its relative distance from
    the output. Eq. 4 and 7 are enumerated; for each, Eq. 6 per sample or per token is
    ``dev / D`` per unit, so the least-squares scale 1/D of the output is fitted first and
    only the (ddof, placement, eps) whose D comes near it are evaluated; a clip is read off
    the output where the fitted values exceed its largest magnitude."""
    s = _Search(b, o)
    eq4 = [(v, _eq4(b, v)) for v in _eq4_variants(b, bool(np.isnan(o).any()))]
    scopes = ("unit",) + (("batch", "unit_mean") if b.S > 1 else ()) + (("group",) if b.G > 1 else ())
    kinds = WHITENS if b.t is not None else WHITENS[:1]
    clip_at = _clip_at(o)
    top = clip_at[0] if clip_at else math.inf
    keep = np.isfinite(o) & (np.abs(o) < top) if clip_at else np.isfinite(o)
    beyond = top * (1.0 + 2.0 ** -20) if clip_at else math.inf
    screened = []
    for v4, p in eq4:
        reach = float(np.max(np.abs(p.c[np.isfinite(p.c)]), initial=0.0))
        for clip in [None] + (clip_at if reach > beyond else []):
            vn = _with(v4, whiten="none", clip=clip)
            s.add(vn, _whitened(b, vn, p.c))
        for scope in scopes:
            vc = _with(v4, whiten="center", whiten_scope=scope)
            stats = _unit_stats(b, vc, p.c)
            for clip in [None] + (clip_at if float(np.nanmax(np.abs(stats[6]), initial=0.0)) > beyond else []):
                s.add(_with(vc, clip=clip), _whitened(b, _with(vc, clip=clip), p.c, stats))
            for kind in kinds:
                vw = _with(v4, whiten=kind, whiten_scope=scope)
                stats = _unit_stats(b, vw, p.c)
                ui, S, dev = stats[0], stats[1], stats[6]
                sel = keep if (np.bincount(ui, keep & (dev != 0), S) > 0).all() else np.isfinite(o)
                with np.errstate(all="ignore"):  # per unit, the least-squares alpha of o = alpha dev
                    alpha = (np.bincount(ui, np.where(sel, dev * o, 0.0), S)
                             / np.bincount(ui, np.where(sel, dev * dev, 0.0), S))
                    guess = np.where(np.isfinite(alpha[ui]), alpha[ui] * dev, 0.0)
                    clips = clip_at if float(np.max(np.abs(guess), initial=0.0)) > beyond else []
                    fit = s.rough(np.clip(guess, -top, top) if clips else guess)
                screened.append((fit, vw, p, stats, alpha, clips))
    if not screened:
        return s
    best = min(f for f, *_ in screened)
    for fit, vw, p, stats, alpha, clips in screened:
        if not fit <= max(100.0 * best, 1e-5):
            continue
        ui, S, t, tt, T, mean, dev, ss = stats
        standard = [None] + [e for e in EPS_VALUES if e != b.eps]
        trials = []  # (mismatch of the scale, ddof, placement, eps)
        for ddof in DDOFS:
            with np.errstate(all="ignore"):
                var = ss / (T - ddof)
                for place in PLACEMENTS[:2]:
                    for eps in standard:
                        e = b.eps if eps is None else eps
                        D = np.sqrt(var) + e if place == "std" else np.sqrt(var + e)
                        off = np.abs(D * alpha - 1.0)
                        off = off[np.isfinite(off)]
                        trials.append((float(off.max()) if off.size else math.inf, ddof, place, eps))
            if np.any(ss == 0.0):  # a unit of std 0: passed through, or not
                v = _with(vw, whiten_ddof=ddof, whiten_placement="skip_if_zero", whiten_eps=0.0)
                s.add(v, _whitened(b, v, p.c, stats))
        nearest = min(t[0] for t in trials)
        closest = math.inf
        for off, ddof, place, eps in trials:
            if off <= max(SCALE_SLACK, 10.0 * nearest):
                for clip in [None] + clips:
                    v = _with(vw, whiten_ddof=ddof, whiten_placement=place, whiten_eps=eps, clip=clip)
                    closest = min(closest, s.add(v, _whitened(b, v, p.c, stats)))
        if closest <= s.near:
            continue  # a fitted eps only where no standard one comes near (one unit: any scale has one)
        for ddof in DDOFS:
            with np.errstate(all="ignore"):
                var = ss / (T - ddof)
                D = 1.0 / alpha
                fits = {"std": D - np.sqrt(var), "var": D * D - var}
            for place in PLACEMENTS[:2]:
                fitted = []
                for e in fits[place][np.isfinite(fits[place])][:4]:
                    fitted += [x for x in _snap(float(e)) if x not in standard + fitted]
                for eps in fitted:
                    for clip in [None] + clips:
                        v = _with(vw, whiten_ddof=ddof, whiten_placement=place, whiten_eps=eps, clip=clip)
                        s.add(v, _whitened(b, v, p.c, stats))
    return s


_STANDARD_EPS = frozenset(EPS_VALUES)


def _preference(row: "_Row"):
    """Fewest differences; a preset's formula; standard eps values; no Eq. 6 before a
    centring one (over whole groups the combined values' mean is 0: the two agree); the
    smallest error."""
    v = row.variant
    odd = sum(1 for e in (v.group_eps, v.whiten_eps) if e is not None and e not in _STANDARD_EPS)
    return (len(row.lines), 0 if row.presets else 1, odd, v.whiten == "center", row.rms)


def _presets_of(b: _Batch, v: Variant, token_counts) -> tuple:
    """The conventions whose formula is ``v`` on this case (choices the case does not
    exercise taken as the paper's)."""
    def key(x: Variant):
        x = x.canonical()
        repl = {}
        if not b.has_nan:
            repl["nan"] = "error"
        if not b.has_singleton:
            repl["singleton"] = "error"
        if b.has_nan and x.nan == "nan_aware_unscored" and not b.unscored:
            repl["nan"] = "nan_aware"
        if b.S < 2 and x.whiten_scope in ("batch", "unit_mean"):
            repl["whiten_scope"] = "unit"
        if token_counts is None and x.whiten == "per_token":
            repl["whiten"] = "per_sample"
        if x.group_placement == "skip_if_zero" and not b.constant_column:
            repl.update(group_placement="std", group_eps=0.0)
        if x.whiten_placement == "skip_if_zero":
            repl.update(whiten_placement="std", whiten_eps=0.0)
        x = _with(x, **repl).canonical()
        return _with(x, group_eps=b.eps if x.group_eps is None else x.group_eps,
                                   whiten_eps=b.eps if x.whiten_eps is None else x.whiten_eps)
    kv = key(v)
    return tuple(name for name in CONVENTIONS if key(from_convention(name)) == kv)


@dataclasses.dataclass
class _Row:
    """A variant judged on one case or several: its worst error over its allowance (``ratio``),
    that quotient's root mean square (``rms``, which noise moves less), its worst error in ulps."""

    variant: Variant
    lines: list
    ratio: float
    rms: float
    ulps: float
    bites: bool
    presets: tuple = ()


def _judge(b: _Batch, v: Variant, o: np.ndarray, u: float):
    """``(row, widest)``: ``v`` judged on output ``o`` of batch ``b`` (``row.bites``: its clip moves
    a value beyond rounding), and its largest allowance."""
    p = _eq4(b, v)
    a = _whitened(b, v, p.c)
    bites = False
    lines = differences(v, b.eps)
    with np.errstate(all="ignore"):
        if v.clip is not None:
            vf = _with(v, clip=None)
            free = _whitened(b, vf, p.c)
            bites = bool(np.any(np.abs(free - a) > _allowance(b, vf, p, free, u)))
        if not np.array_equal(np.isnan(a), np.isnan(o)):
            return _Row(v, lines, math.inf, math.inf, math.inf, bites), 0.0
        tol = _allowance(b, v, p, a, u)
        err = np.abs(np.where(np.isnan(o), 0.0, o - a))
        r = np.where(err == 0.0, 0.0, err / tol)
    ratio = float(np.max(r)) if r.size else 0.0
    rms = float(np.sqrt(np.mean(r * r))) if r.size else 0.0
    widest = float(np.max(np.where(np.isfinite(tol), tol, 0.0))) if tol.size else 0.0
    fix = (lambda x: x if math.isfinite(x) else math.inf)
    return _Row(v, lines, fix(ratio), fix(rms), _ulps(err, a, o, b.out_dtype), bites), widest


def _largest(o: np.ndarray) -> float:
    fin = o[np.isfinite(o)]
    return float(np.max(np.abs(fin))) if fin.size else math.inf


def _clip_at(o: np.ndarray) -> list:
    """[the largest |o|] where fewer than half the outputs sit on it, else []: a clip explains the
    values it reaches, never the formula."""
    top = _largest(o)
    return [top] if math.isfinite(top) and top > 0 and 2 * int(np.sum(np.abs(o) == top)) < o.size else []


def _as_output(output, n: int) -> np.ndarray:
    o = output.detach().to("cpu").double().numpy() if hasattr(output, "detach") else np.asarray(output, np.float64)
    o = np.asarray(o, dtype=np.float64).reshape(-1)
    if o.shape != (n,):
        raise ValueError(f"output: {o.size} values for a case of {n} samples")
    return o


def _searched(b: _Batch, o: np.ndarray, u: float, token_counts) -> list:
    """The search's candidates nearest by relative error (the paper's always among them), judged
    against their own bounds."""
    s = _search(b, o)
    s.add(PAPER, evaluate(b, PAPER))
    ranked = sorted(s.found.items(), key=lambda kv: kv[1])[:CHECKED]
    if PAPER not in dict(ranked):  # always judged: the nearest of no match is often the paper
        ranked.append((PAPER, 0.0))
    rows = []
    widest = 0.0  # the largest allowance seen, relative to the output's scale
    for i, (v, rough) in enumerate(ranked):
        if i >= 8 and rough > 4.0 * widest and v != PAPER:
            continue  # farther from the output, everywhere, than any allowance judged so far
        row, wide = _judge(b, v, o, u)
        widest = max(widest, wide / s.scale)
        if v.clip is not None and not row.bites:
            continue  # the unclipped variant, already among the candidates
        row.presets = _presets_of(b, v, token_counts)
        rows.append(row)
    return rows


def _verdict(rows: list, out_dtype: str, cases: int = 1, not_exercised=(), top: float = math.inf) -> Diagnosis:
    matches = sorted((r for r in rows if r.ratio <= 1.0), key=_preference)
    if matches:
        first = matches[0]
        if first.variant.clip is None and math.isfinite(top):
            not_exercised = tuple(not_exercised) + (f"a clip at {top:.6g} or beyond (no advantage beyond it)",)
        alts = [x for x in dict.fromkeys(tuple(r.lines) for r in matches[1:]) if x != tuple(first.lines)]
        return Diagnosis(first.variant, tuple(first.lines), first.ulps, first.ratio, out_dtype, first.variant,
                         tuple(alts), first.presets, not_exercised, cases, tuple(r.variant for r in matches))
    best = min(r.rms for r in rows)  # the nearest: the simplest of those within twice the smallest rms error
    first = min([r for r in rows if r.rms <= 2.0 * best] or rows, key=_preference)
    return Diagnosis(None, tuple(first.lines), first.ulps, first.ratio, out_dtype, first.variant, (),
                     first.presets, not_exercised, cases)


def diagnose(case, output, token_counts=None, unit_roundoff: float | None = None) -> Diagnosis:
    """Which variant of the catalogue ``output`` (N advantages of ``case``, array or tensor) follows;
    ``token_counts`` where the call passed them, ``unit_roundoff`` the code's working precision
    (default :func:`unit_roundoff_of` the output dtype)."""
    b = _Batch.of_case(case, token_counts)
    o = _as_output(output, b.n)
    u = unit_roundoff_of(b.out_dtype) if unit_roundoff is None else float(unit_roundoff)
    return _verdict(_searched(b, o, u, token_counts), b.out_dtype, not_exercised=_not_exercised(b, token_counts),
                    top=_largest(o))


#: the cases :func:`diagnose_many` searches at most: a variant that reproduces every case is among the
#: matches of each one alone, so the first cases' searches find it; the rest only confirm or separate
SEARCHED = 4


def diagnose_many(cases_and_outputs, unit_roundoff: float | None = None) -> Diagnosis:
    """One diagnosis of several ``(case, output[, token_counts])`` of one code: the variants that
    reproduce every output. Cases are searched in order (the costly step), what matched each and
    its nearest judged on every case, until a variant reproduces them all."""
    done = []
    for item in cases_and_outputs:
        case, output, tokens = (tuple(item) + (None,))[:3]
        b = _Batch.of_case(case, tokens)
        u = unit_roundoff_of(b.out_dtype) if unit_roundoff is None else float(unit_roundoff)
        done.append((b, _as_output(output, b.n), u, tokens))
    if not done:
        raise ValueError("diagnose_many: no cases")

    def judged(v, stop):
        worst = _Row(v, differences(v, done[0][0].eps), 0.0, 0.0, 0.0, False)
        for b, o, u, tokens in done:
            row, _ = _judge(b, v, o, u)
            worst.ratio, worst.rms = max(worst.ratio, row.ratio), max(worst.rms, row.rms)
            worst.ulps, worst.bites = max(worst.ulps, row.ulps), worst.bites or row.bites
            if stop and worst.ratio > 1.0:
                return worst, False  # fails a case: no match (its errors so far are a lower bound)
        presets = set.intersection(*[set(_presets_of(b, v, t)) for b, _, _, t in done])
        worst.presets = tuple(p for p in CONVENTIONS if p in presets)
        return worst, True

    candidates: dict = {PAPER: None}
    rows, partial, seen = [], [], set()
    for b, o, u, tokens in done[:SEARCHED]:
        found = _searched(b, o, u, tokens)
        near = sorted(found, key=lambda r: r.rms)[:4]
        for r in [r for r in found if r.ratio <= 1.0] + near:
            candidates.setdefault(r.variant, None)
        for v in [v for v in candidates if v not in seen]:
            seen.add(v)
            row, whole = judged(v, stop=True)
            if v.clip is not None and whole and not row.bites:
                continue
            (rows if whole else partial).append(row)
        if any(r.ratio <= 1.0 for r in rows):
            break
    if not any(r.ratio <= 1.0 for r in rows):  # a clip biting only on a case not searched: the nearest, clipped
        tops = list(dict.fromkeys(t for _, o, _, _ in done for t in _clip_at(o)))  # a case's largest output
        for r in [r for r in partial if r.variant.clip is None]:
            for t in tops:
                v = _with(r.variant, clip=t)
                if v not in seen:
                    seen.add(v)
                    row, whole = judged(v, stop=True)
                    if whole and row.bites:
                        rows.append(row)
    if not any(r.ratio <= 1.0 for r in rows):  # no match: the nearest, judged on every case
        partial.sort(key=lambda r: r.rms)
        rows += [judged(r.variant, stop=False)[0] for r in partial[:8]
                 if r.variant.clip is None or r.bites]
        if not any(r.variant == PAPER for r in rows):
            rows.append(judged(PAPER, stop=False)[0])
    unseen = [_not_exercised(b, t) for b, _, _, t in done]
    common = tuple(x for x in unseen[0] if all(x in other for other in unseen[1:]))
    return _verdict(rows, done[0][0].out_dtype, cases=len(done), not_exercised=common,
                    top=max(_largest(o) for _, o, _, _ in done))


def reproduces(case, output, variant: Variant, unit_roundoff: float, token_counts=None) -> bool:
    """Does ``variant`` reproduce ``output`` (the code's advantages of ``case``) within the error
    model of a code of that variant computing at ``unit_roundoff``?"""
    b = _Batch.of_case(case, token_counts)
    row, _ = _judge(b, variant, _as_output(output, b.n), float(unit_roundoff))
    return row.ratio <= 1.0


def describe(diagnosis: Diagnosis) -> str:
    """One line for a report: ``formula: Eq. 4: leave-one-out baseline; Eq. 6: no eps
    (reproduces the output within 3 ulp(float32))``."""
    d = diagnosis
    ulps = f"{d.residual_ulps:.3g} ulp({d.out_dtype})"
    on = f" on {d.cases} cases" if d.cases > 1 else ""
    if d.matched:
        what = "; ".join(d.differences) if d.differences else "no difference from the paper"
        named = [p for p in d.presets if p != "spec"]
        line = f"formula: {what} (reproduces the output{on} within {ulps}" \
            + (f"; preset {', '.join(named)}" if named and d.differences else "") + ")"
        if d.alternatives:
            shown = " | ".join("; ".join(a) or "no difference from the paper" for a in d.alternatives[:3])
            more = f" and {len(d.alternatives) - 3} more" if len(d.alternatives) > 3 else ""
            line += f"; this case cannot separate it from: {shown}{more}"
        return line
    nearest = "; ".join(d.differences) if d.differences else "the paper's formula"
    return (f"formula: no variant of the catalogue reproduces the output{on}; nearest: {nearest} "
            f"(off by {ulps}, {d.ratio:.3g} x its error bound)")
