"""The formula, diagnosed: which variant of GDPO an implementation computes.

Where an implementation's finite outputs on ordinary inputs are farther from the exact
advantages than any rounding explains, the difference is usually not an accident of float
arithmetic but another formula: a leave-one-out baseline, no division by the std, a
biased std, another eps, no Eq. 6, clipped advantages. :func:`diagnose` searches the
catalogue of such variants (:mod:`conformance.formulas`) and names the one that reproduces
the output within the implementation's own precision, as its differences from the paper
equation by equation ("Eq. 4: leave-one-out baseline; Eq. 6: no eps"). No declaration is
needed. eps values are enumerated (the call's, 0 and the values peers use) and, at Eq. 6,
also fitted from the output; a clip value is read off the output. Each variant is computed in
float64 numpy (:func:`conformance.formulas.evaluate`), exactly as it reads.

"Within its own precision": the running error bound of ``spec/error_model.py`` (the
mean-then-subtract model every peer is held to, its deviations' perturbation taken from
each group column's magnitude), evaluated on the variant's own intermediate values, at the
unit roundoff of the output dtype (float32's for float32, float16 and bfloat16 outputs,
which no code computes in), plus half an ulp of the output dtype (``allowed_error``), plus
the float64 evaluation's own bound. Nothing is tuned.

What a case does not exercise it cannot tell apart: a NaN policy needs a NaN reward, a
singleton policy a group of one, collapse handling a constant group column or unit, the
whitening scope several units, token weighting the token counts, a clip a value beyond
it. Such choices are not searched on that case and the diagnosis lists them
(``Diagnosis.not_exercised``); variants the case cannot separate (an eps of 1e-8 and none
at all, on values of order one) all match, and the diagnosis lists the others
(``Diagnosis.alternatives``): ambiguity is data, not a guess. :func:`diagnose_many`
intersects several cases. Where several variants match, the one named has the fewest
differences; among those, a peer preset's formula, standard eps values and the smallest
error come first.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from conformance.formulas import (
    BASELINES, DDOFS, EPS_VALUES, NANS, ORDERS, PAPER, PLACEMENTS, SCALES, SINGLETONS, WHITENS, Variant, _Batch,
    _eq4, _Parts, _unit_stats, _whitened, _with, differences, evaluate, from_convention,
)
from spec import error_model as em
from spec.constants import FLOAT32_UNIT_ROUNDOFF, FLOAT64_UNIT_ROUNDOFF
from spec.conventions import CONVENTIONS

#: how many candidates, best first by their relative error, are checked against their
#: own error bound (the rest are farther from the output than the last one checked)
CHECKED = 48


# ------------------------------------------------------------------ the error bound


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
        for m in b.members:
            for k in range(K):
                x = p.x[m, k]
                fin = np.isfinite(x)
                mag = float(np.max(np.abs(x[fin]))) if fin.any() else 0.0
                nn = int(p.n[m[0], k])
                d_dev = em.model_dev_perturbation(mag, max(nn, 1), tau) + extra * mag
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
    """The worst error in ulps of ``out_dtype`` at the output's largest magnitude (its
    values are rounded relative to the values they came from, not to themselves: an ulp at
    a value near 0 measures no formula)."""
    with np.errstate(all="ignore"):
        mags = np.concatenate([np.abs(a[np.isfinite(a)]), np.abs(o[np.isfinite(o)]), [0.0]])
        ulp = 2.0 * float(em.half_ulp(np.array([mags.max()]), out_dtype)[0])
        q = err[~np.isnan(err)] / ulp
    return float(q.max()) if q.size else 0.0


# ------------------------------------------------------------------ the search


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """What :func:`diagnose` found: the variant that reproduces the output (None where
    none does), its differences from the paper, its worst error in ulps of the output
    dtype and as a fraction of its error bound (``ratio`` <= 1: within its own
    precision); where none matches, the nearest and its differences. ``alternatives``:
    the differences of the other variants that reproduce the output as well (the case
    cannot separate them); ``presets``: the conventions whose formula is the named one on
    this case; ``not_exercised``: the choices this case cannot tell apart at all."""

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
    out = []
    if not b.has_nan:
        out.append("NaN policy (no NaN reward)")
    elif not b.unscored:
        out.append("unscored samples left out of Eq. 6 (no sample with every reward NaN)")
    if not b.has_singleton:
        out.append("singleton policy (no group of one)")
    if not b.constant_column:
        out.append("collapse handling at Eq. 4 (no constant group column)")
    if b.S < 2:
        out.append("whitening scope (one unit)")
    if token_counts is None:
        out.append("token weighting (no token counts)")
    return tuple(out)


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
    for nan in nans:
        for single in singles:
            for order in orders:
                for base in BASELINES:
                    out.append(Variant(baseline=base, scale="none", singleton=single, nan=nan, weights=order))
                    for scale in SCALES:
                        for ddof in DDOFS:
                            for place in places:
                                for eps in (eps_list if place != "skip_if_zero" else [0.0]):
                                    out.append(Variant(baseline=base, scale=scale, group_ddof=ddof,
                                                       group_placement=place, group_eps=eps, singleton=single,
                                                       nan=nan, weights=order))
    return out


def _snap(x: float) -> list:
    """A fitted eps as the values a code would write: 0, and 1 and 2 significant digits."""
    if not (x > 0 and math.isfinite(x)):
        return [0.0]
    out = []
    for digits in (1, 2):
        e = math.floor(math.log10(x))
        out.append(float(f"{round(x / 10 ** e, digits - 1)}e{e}"))
    return out


def _fit_scale(o: np.ndarray, dev: np.ndarray, ui: np.ndarray, S: int, keep: np.ndarray):
    """Per unit the least-squares alpha of o = alpha dev over the ``keep`` samples."""
    with np.errstate(all="ignore"):
        num = np.bincount(ui, np.where(keep, dev * o, 0.0), S)
        den = np.bincount(ui, np.where(keep, dev * dev, 0.0), S)
        return num / den


class _Search:
    def __init__(self, b: _Batch, o: np.ndarray):
        self.o = o
        fin = np.isfinite(o)
        self.scale = float(np.max(np.abs(o[fin]))) if fin.any() else 1.0
        self.scale = self.scale if self.scale > 0 else 1.0
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
    scopes = ("unit",) + (("batch",) if b.S > 1 else ()) + (("group",) if b.G > 1 else ())
    kinds = WHITENS if b.t is not None else WHITENS[:1]
    top = _largest(o)
    # a clip explains the values it reaches, never the formula: fewer than half may sit on it
    on_top = int(np.sum(np.abs(o) == top)) if math.isfinite(top) else b.n
    clip_at = [top] if math.isfinite(top) and top > 0 and 2 * on_top < b.n else []
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
                alpha = _fit_scale(o, dev, ui, S, sel)
                with np.errstate(all="ignore"):
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
        if b.S < 2 and x.whiten_scope == "batch":
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
    """A variant judged on one case or several: its worst error over its allowance
    (``ratio``), the root mean square of that quotient (``rms``: what the nearest of no
    match is chosen by, which noise moves less than a maximum), its worst error in ulps."""

    variant: Variant
    lines: list
    ratio: float
    rms: float
    ulps: float
    bites: bool
    presets: tuple = ()


def _judge(b: _Batch, v: Variant, o: np.ndarray, u: float):
    """``(row, widest)``: ``v`` judged on output ``o`` of batch ``b`` (``row.bites``: the
    clip changes a value beyond its rounding; a clip that does not is, on this case, the
    unclipped variant); ``widest``: its largest allowance."""
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


def _as_output(output, n: int) -> np.ndarray:
    o = output.detach().to("cpu").double().numpy() if hasattr(output, "detach") else np.asarray(output, np.float64)
    o = np.asarray(o, dtype=np.float64).reshape(-1)
    if o.shape != (n,):
        raise ValueError(f"output: {o.size} values for a case of {n} samples")
    return o


def _checked(b: _Batch, o: np.ndarray, u: float, s: _Search, token_counts) -> list:
    """The candidates nearest by relative error, judged against their own bounds."""
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
        alts, seen = [], {tuple(first.lines)}
        for r in matches[1:]:
            if tuple(r.lines) not in seen:
                seen.add(tuple(r.lines))
                alts.append(tuple(r.lines))
        return Diagnosis(first.variant, tuple(first.lines), first.ulps, first.ratio, out_dtype, first.variant,
                         tuple(alts), first.presets, not_exercised, cases, tuple(r.variant for r in matches))
    best = min(r.rms for r in rows)  # the nearest: the simplest of those within twice the smallest rms error
    first = min([r for r in rows if r.rms <= 2.0 * best] or rows, key=_preference)
    return Diagnosis(None, tuple(first.lines), first.ulps, first.ratio, out_dtype, first.variant, (),
                     first.presets, not_exercised, cases)


def _searched(b: _Batch, o: np.ndarray, u: float, token_counts) -> list:
    """The search's candidates (the paper's always among them), the nearest judged (:func:`_checked`)."""
    s = _search(b, o)
    s.add(PAPER, evaluate(b, PAPER))
    return _checked(b, o, u, s, token_counts)


def diagnose(case, output, token_counts=None, unit_roundoff: float | None = None) -> Diagnosis:
    """Which variant of the catalogue ``output`` (the implementation's advantages of
    ``case``, a ``conformance.cases.Case``; an array or tensor of N values) follows.

    ``token_counts``: the samples' token counts where the call passed them (Eq. 6 may be
    token-weighted); ``unit_roundoff``: the implementation's working precision (default:
    float32's for a float32, float16 or bfloat16 output, float64's for float64)."""
    b = _Batch.of_case(case, token_counts)
    o = _as_output(output, b.n)
    u = unit_roundoff_of(b.out_dtype) if unit_roundoff is None else float(unit_roundoff)
    rows = _searched(b, o, u, token_counts)
    return _verdict(rows, b.out_dtype, not_exercised=_not_exercised(b, token_counts), top=_largest(o))


#: the cases :func:`diagnose_many` searches at most: a variant that reproduces every case is among the
#: matches of each one alone, so the first cases' searches find it; the rest only confirm or separate
SEARCHED = 4


def diagnose_many(cases_and_outputs, unit_roundoff: float | None = None) -> Diagnosis:
    """One diagnosis of several cases of one implementation: the variants that reproduce
    every output. Items are ``(case, output)`` or ``(case, output, token_counts)``. The cases
    are searched in order (:func:`_search`, the costly step); after each, what matched it and
    its nearest are judged on every case, and the search stops once a variant reproduces them
    all (a later case then only confirms or separates). Where one case cannot separate two
    variants (a clip that does not bite there, equal group sizes), another may."""
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
        seen_tops: dict = {}  # a clip's value is the largest output of every case where it bites
        for _, o, _, _ in done:
            t = _largest(o)
            if math.isfinite(t) and t > 0 and 2 * int(np.sum(np.abs(o) == t)) < o.size:
                seen_tops[t] = seen_tops.get(t, 0) + 1
        tops = list(seen_tops)
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
        line = f"formula: {what} (reproduces the output{on} within {ulps}"
        named = [p for p in d.presets if p != "spec"]
        if named and d.differences:
            line += f"; preset {', '.join(named)}"
        line += ")"
        if d.alternatives:
            shown = " | ".join("; ".join(a) or "no difference from the paper" for a in d.alternatives[:3])
            more = f" and {len(d.alternatives) - 3} more" if len(d.alternatives) > 3 else ""
            line += f"; this case cannot separate it from: {shown}{more}"
        return line
    nearest = "; ".join(d.differences) if d.differences else "the paper's formula"
    return (f"formula: no variant of the catalogue reproduces the output{on}; nearest: {nearest} "
            f"(off by {ulps}, {d.ratio:.3g} x its error bound)")
