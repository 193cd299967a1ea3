"""Eq. 6 exactly: each whitening unit's mean, std and whitened values, certified and correctly
rounded, with the error model's bound and the stage-wise condition estimate of each value.
A unit's exact collapse (every c equal) is decided on c's exact forms; its bounds are evaluated
in frames of its own (:func:`_unit_frame`), where nothing overflows."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np

from oracle import condition as cn
from oracle import exact as ex
from oracle.inputs import members, py
from spec import error_model as em
from spec.conventions import Convention
from spec.errors import SegmentError

#: From this precision on, a whitened value whose interval still straddles a rounding
#: boundary is tested for being exactly that boundary (a tie), on the exact forms.
TIE_TEST_PREC = 4 * ex.START_PREC


def structural_mean(conv: Convention) -> bool:
    """Does the convention demand the structural zero mean of a unit of whole groups (spec
    section 7)? Only ``spec`` does; the peers subtract a rounded batch mean."""
    return conv.collapse == "exact_equality" and conv.whiten == "per_sample" and conv.singleton != "raw"


def units_of_whole_groups(gidx: np.ndarray, uidx: np.ndarray, G: int, S: int) -> np.ndarray:
    """(S,) bool: every group with a member in the unit has all its members in it."""
    lo = np.full(G, S, dtype=np.int64)
    hi = np.full(G, -1, dtype=np.int64)
    np.minimum.at(lo, gidx, uidx)
    np.maximum.at(hi, gidx, uidx)
    cut = lo[gidx] != hi[gidx]  # per sample: its group spans two or more units
    whole = np.ones(S, bool)
    whole[uidx[cut]] = False
    return whole


@dataclasses.dataclass
class _Unit:
    """One unit's exact data: c's forms, which equal the mean (``zero``), the sample weights
    ``tt`` (T in all) and the mean's form."""

    forms: list
    zero: np.ndarray
    tt: np.ndarray
    T: int
    mean: ex.Form
    conv: Convention
    eps: Fraction
    classes: ex.SqrtClasses


def whiten(c: ex.Values, uidx, t, conv, eps_w, classes, labels=None, uinfo=None, whole=None, scored=None):
    """Eq. 6 per unit: the whitened values (an :class:`oracle.exact.Values`) and which units
    collapsed. ``whole`` (S,) marks the units of whole groups, whose mean is structurally zero
    where :func:`structural_mean`: there a structural zero of c is a required zero of a.
    ``scored`` (N,): the rows scored under nan="nan_aware_unscored" (spec/gdpo.md section 2,
    "Missing rewards"; the zeros it sets are required too). c's bounds are ``cond *
    2^cond_frame`` and ``delta * 2^frame`` per sample; each unit's are evaluated in frames of its
    own. ``uinfo`` (:func:`oracle.condition.info`) receives what the closed form of the
    condition needs, where it applies."""
    N = len(c.forms)
    a = ex.Values(N)
    S = int(uidx.max()) + 1 if N else 0
    ucoll = np.zeros(S, bool)
    floor = ex.eps_floor(eps_w, conv.whiten_eps_placement)
    c64, nan = c.rounded["float64"], c.nan
    for s, idx in enumerate(members(uidx, S)):
        label = labels[s] if labels is not None else s
        if scored is not None:
            few = np.count_nonzero(scored[idx]) < 2
            left_out = idx if few else idx[~scored[idx]]
            a.zero[left_out], a.required[left_out] = True, whole is not None
            ucoll[s] = few
            if few:
                continue
            idx = idx[scored[idx]]
        if conv.whiten == "none":  # a = c; the unit still collapses where every c is equal
            _unchanged(c, idx, classes, a)
            ucoll[s] = idx.size > 0 and not nan[idx].any() and all(
                c.forms[j].minus(c.forms[idx[0]]).is_zero() for j in idx[1:])
            continue
        uforms = [c.forms[j] for j in idx]
        c_top = _top_exponent(uforms, nan[idx], c64[idx], classes)
        # the error model's frame, and the condition estimate's
        (frame, cs, dmodel_s), (cframe, ccs, dcond_s) = (
            _unit_frame(c_top, uforms, nan[idx], c64[idx], d[idx], f[idx], floor, classes)
            for d, f in ((c.delta, c.frame), (c.cond, c.cond_frame)))
        if nan[idx].any():  # convention nan="propagate": the unit's statistics are NaN
            a.put(idx, np.nan)
            a.cond[idx] = a.delta[idx] = np.nan
            continue
        tt = np.ones(idx.size, dtype=np.int64) if t is None else t[idx]
        T = int(tt.sum())
        if T - conv.whiten_ddof <= 0:
            raise SegmentError(f"whitening unit {py(label)!r} has {idx.size} sample(s) ({T} weight); "
                               "the unbiased std of Eq. 6 needs at least 2")
        mean = ex.Form()
        for f, tj in zip(uforms, tt.tolist()):
            mean.add_scaled(f, Fraction(tj))
        mean = mean.scaled(Fraction(1, T))
        if mean.support() > max((f.support() for f in uforms), default=0):
            zero = np.zeros(idx.size, bool)
        else:
            zero = np.array([f.minus(mean).is_zero() for f in uforms])
        coll = ucoll[s] = bool(zero.all())
        if coll:
            if conv.whiten_eps_placement == "skip_if_zero":  # the step is skipped: a = c
                _unchanged(c, idx, classes, a)
                continue
            # demanded bit for bit only when every c is a structural zero; else held to the
            # bound at std 0 (a correct code whitens its rounding noise: spec section 7)
            a.zero[idx], a.required[idx] = True, c.required[idx].all()
            var = (ex.ZERO, ex.ZERO)
        else:
            var = _unit_numbers(_Unit(uforms, zero, tt, T, mean, conv, eps_w, classes), idx, a, label)
            if whole is not None and whole[s] and t is None and mean.is_zero():
                # a unit of whole groups: Eq. 4 centres every group column, so the unit's mean
                # is exactly 0 by structure, and a structural zero of c whitens to exactly 0
                a.required[idx] = c.required[idx]
        vals64 = a.rounded["float64"][idx]
        ttf = tt.astype(np.float64)
        m_s, s_s, den_s = _scaled_unit_terms(mean, var, eps_w, conv, frame, classes)
        a.delta[idx] = em.whiten_stage(dmodel_s, cs, m_s, vals64, s_s, den_s, conv.whiten_ddof, ttf,
                                       tau=math.ldexp(em.underflow_tau(conv.native_dtype), -frame),
                                       unit_roundoff=conv.unit_roundoff)
        a.delta[idx[a.required[idx]]] = 0.0  # the structural zeros: demanded bit for bit
        m_s, s_s, den_s = _scaled_unit_terms(mean, var, eps_w, conv, cframe, classes)
        if not coll and not s_s >= 2.0 ** -1022:
            # a live unit whose std is not a normal float in the condition frame: Cauchy-Schwarz,
            # |dsigma| <= sqrt(T/(T - ddof)) max |d dev|, |dh| <= |dsigma|, so |da_j| <= (|d dev_j|
            # + |a_j| sqrt(T/(T - ddof)) max |d dev|) / h, d dev_j <= dc_j + sum t dc / T; inf
            # where the denominator itself is not a normal float there
            dd = dcond_s + float(np.sum(ttf * dcond_s) / T)
            ds = math.sqrt(T / (T - conv.whiten_ddof)) * (1 + 2.0 ** -50) * float(np.max(dd))
            a.cond[idx] = (dd + np.abs(vals64) * ds) / den_s * (1 + 2.0 ** -48) \
                if den_s >= 2.0 ** -1022 else math.inf
            a.cond[idx] = np.where(np.isnan(a.cond[idx]), math.inf, a.cond[idx])
        else:
            a.cond[idx] = em.whiten_stage(dcond_s, ccs, m_s, vals64, s_s, den_s, conv.whiten_ddof, ttf,
                                          rounding=False)
        if uinfo is not None and t is None and not coll and s_s >= 2.0 ** -1022 and 2.0 ** -1022 <= den_s < math.inf:
            cn.admit(uinfo, s, cframe, s_s, den_s)
        elif uinfo is not None and t is None and coll:  # a zero std: the first order at eps > 0
            cn.admit_collapsed(uinfo, s, cframe, ex.collapsed_denominator(eps_w, conv.whiten_eps_placement, cframe),
                               em.samuelson(idx.size, conv.whiten_ddof))
    return a, ucoll


def _unchanged(c: ex.Values, idx, classes, a: ex.Values) -> None:
    """A step that leaves values unchanged (a = c): their rounding certified like any
    other, their bounds c's own."""
    for j in idx:
        if c.nan[j]:
            a.put(j, np.nan)
        else:
            a.put(j, ex.round_form(c.forms[j], classes))
            a.zero[j] = c.forms[j].is_zero()
    a.cond[idx] = np.ldexp(c.cond[idx], c.cond_frame[idx])
    a.delta[idx] = np.ldexp(c.delta[idx], c.frame[idx])


def _scaled_unit_terms(mean, var, eps_w, conv, frame: int, classes):
    """A unit's mean, std and denominator in the frame 2^frame (q = 2^-frame): c, the mean and
    the std scale by q, an eps added to the std by q, one added to the variance by q^2. The
    denominator comes from the exact variance and eps in mpmath (unbounded exponents: eps q^2
    alone may be beyond float64 where sqrt(eps) q is not, :func:`oracle.exact.eps_floor`)."""
    q = ex.pow2(-frame)
    m_s = ex.round_mpf(ex.iv_form(mean.scaled(q), classes, 80)[0], "float64")
    var_s = ex.iv_scale_rational(var, q * q, 80)
    s_s = ex.round_mpf(ex.iv_sqrt(var_s, 80)[0], "float64")
    placement = conv.whiten_eps_placement
    if placement in ("std", "std_if_positive"):
        return m_s, s_s, s_s + float(eps_w * q)  # at most 2^960 (eps_floor)
    if placement == "var":  # sqrt(var q^2 + eps q^2): eps q^2 itself may be beyond float64
        w = ex.iv_add(var_s, ex.iv_rational(eps_w * q * q, 80), 80)
        return m_s, s_s, ex.round_mpf(ex.iv_sqrt(w, 80)[0], "float64")
    return m_s, s_s, s_s


def _unit_numbers(u: _Unit, idx, a: ex.Values, label):
    """Certified a for one non-collapsed unit, written into ``a`` at ``idx``; returns the
    variance interval. Rational a is rounded exactly (:func:`_rational_unit`); an interval that
    keeps straddling a rounding boundary is tested for an exact tie on the forms
    (:func:`_whitened_equals`): an irrational a is no midpoint, so raising the precision
    separates it."""
    a.zero[idx] = u.zero
    var = _rational_unit(u, idx, a)
    if var is not None:
        return var
    tested: set = set()  # (p, boundary) pairs found not to be a tie
    ties: dict[int, tuple] = {}
    variance: list = []  # the variance form, built at the first tie test
    ddof, placement = u.conv.whiten_ddof, u.conv.whiten_eps_placement
    for prec in ex.PRECISIONS:
        m_iv = ex.iv_form(u.mean, u.classes, prec)
        devs = [None if z else ex.iv_sub(ex.iv_form(f, u.classes, prec), m_iv, prec) for f, z in zip(u.forms, u.zero)]
        ss = (ex.ZERO, ex.ZERO)
        for d, tj in zip(devs, u.tt.tolist()):
            if d is not None:
                ss = ex.iv_add(ss, ex.iv_scale_rational(ex.iv_square(d, prec), Fraction(tj), prec), prec)
        var = ex.iv_scale_rational(ss, Fraction(1, u.T - ddof), prec)
        if placement in ("std", "std_if_positive"):
            den = ex.iv_add(ex.iv_sqrt(var, prec), ex.iv_rational(u.eps, prec), prec)
        elif placement == "var":
            den = ex.iv_sqrt(ex.iv_add(var, ex.iv_rational(u.eps, prec), prec), prec)
        else:
            den = ex.iv_sqrt(var, prec)
        if ex.iv_contains_zero(den):  # without eps (skip_if_zero) a nonzero std may still touch zero
            continue
        for p, d in enumerate(devs):
            if d is None:
                continue
            if p in ties:
                a.put(idx[p], ties[p])
                continue
            iv = ex.iv_div(d, den, prec)
            every = ex.round_all(iv)
            if every is None and prec >= TIE_TEST_PREC:
                for m in ex.boundaries(iv):
                    if (p, m) in tested:
                        continue
                    if _whitened_equals(m, u.forms[p].minus(u.mean), u, variance):
                        every = ties[p] = ex.round_all_fraction(m)
                        break
                    tested.add((p, m))
            if every is None:
                break
            a.put(idx[p], every)
        else:
            return var
    raise ex.CertificationError(f"could not certify unit {py(label)!r} within {ex.MAX_PREC} bits")


def _rational_unit(u: _Unit, idx, a: ex.Values):
    """Eq. 6 of a unit in exact rationals, where it is rational: every c rational and the
    denominator a rational (the variance, or variance + eps, a rational square). Writes the
    values into ``a`` and returns the variance as a point interval, or None."""
    if not u.mean.is_rational() or not all(f.is_rational() for f in u.forms):
        return None
    devs = [f.q0 - u.mean.q0 for f in u.forms]
    var = sum((Fraction(tj) * d * d for d, tj in zip(devs, u.tt.tolist())), Fraction(0)) / (u.T - u.conv.whiten_ddof)
    placement = u.conv.whiten_eps_placement
    root = u.classes.sqrt(var + u.eps if placement == "var" else var)
    if not root.is_rational():
        return None
    den = root.q0 + u.eps if placement in ("std", "std_if_positive") else root.q0  # > 0: a live unit
    for p, (d, z) in enumerate(zip(devs, u.zero)):
        a.put(idx[p], 0.0 if z else ex.round_all_fraction(d / den))
    return ex.iv_rational(var, ex.START_PREC)


def _whitened_equals(m: Fraction, dev: ex.Form, u: _Unit, variance: list) -> bool:
    """Is a = dev / den exactly the rational m (den = s + eps, sqrt(s^2 + eps) or s, with
    s^2 = sum t dev^2 / (T - ddof))? Decided on exact forms: a = m exactly when
    dev - m eps = m s (std), dev = m sqrt(s^2 + eps) (var) or dev = m s (no eps), i.e. when
    the two sides have one sign and equal squares. The variance form is built once per
    unit (kept in ``variance``)."""
    if m == 0:
        return dev.is_zero()
    if not variance:  # sum t (c - m)^2 = sum t c^2 - T m^2: each c has its group's few classes only
        acc = u.mean.times(u.mean, u.classes).scaled(Fraction(-u.T))
        for f, tj in zip(u.forms, u.tt.tolist()):
            acc.add_scaled(f.times(f, u.classes), Fraction(tj))
        variance.append(acc.scaled(Fraction(1, u.T - u.conv.whiten_ddof)))
    var = variance[0]
    placement = u.conv.whiten_eps_placement
    lhs = dev
    rhs2 = var.scaled(m * m)
    if placement in ("std", "std_if_positive"):
        lhs = dev.minus(ex.Form(m * u.eps))
    elif placement == "var":
        rhs2 = ex.Form(var.q0 + u.eps, dict(var.terms)).scaled(m * m)
    if lhs.is_zero() or not lhs.times(lhs, u.classes) == rhs2:
        return False
    return _form_sign(lhs, u.classes) == (1 if m > 0 else -1)


def _form_sign(form: ex.Form, classes: ex.SqrtClasses) -> int:
    """The sign of a nonzero form (its interval excludes zero at some precision)."""
    if form.is_rational():
        return 1 if form.q0 > 0 else -1
    for prec in ex.PRECISIONS:
        iv = ex.iv_form(form, classes, prec)
        if not ex.iv_contains_zero(iv):
            return 1 if ex.libmp.mpf_sign(iv[0]) > 0 else -1
    raise ex.CertificationError(f"could not certify the sign of {form!r} within {ex.MAX_PREC} bits")


def _top_exponent(forms, nan, values: np.ndarray, classes):
    """The largest binary exponent (|c| < 2^e) over one unit's exact c, None when all are
    exactly zero; from the exact form where the float64 rounded to 0 or overflowed."""
    tops = []
    for j in np.flatnonzero(~nan):
        if values[j] != 0.0 and math.isfinite(values[j]):
            tops.append(math.frexp(values[j])[1])
        elif not forms[j].is_zero():
            tops.append(max(int(exp) + int(bc) for _, man, exp, bc in ex.iv_form(forms[j], classes, 80) if man))
    return max(tops, default=None)


def _unit_frame(c_top, forms, nan, values: np.ndarray, delta: np.ndarray, dframe: np.ndarray, floor: int,
                classes):
    """The power-of-two frame 2^e of one unit's Eq. 6 bound, and c and Δc in it: its largest exact
    |c| (``c_top``) brought to [1/2, 1), raised where a sample's Δc (``delta * 2^dframe``) would
    exceed 2^960 in it, at least ``floor`` (:func:`oracle.exact.eps_floor`: eps in it stays
    finite). c in the frame comes from its exact form where its float64 overflowed there or is
    subnormal (rounded to 0 or to fewer bits); a Δc 2^1024 above the unit's largest c is inf (no bound)."""
    live = ~nan & (delta != 0.0) & np.isfinite(delta)
    top = int((dframe[live] + np.frexp(delta[live])[1]).max()) if live.any() else None
    if c_top is None:
        e = top if top is not None else 0
    else:
        e = c_top if top is None else max(c_top, top - 960)
    e = max(e, floor)
    scaled = np.ldexp(values, -e)
    d_scaled = np.ldexp(delta, np.clip(dframe - e, -2200, 2200).astype(np.int32))
    for j in np.flatnonzero(~nan & (~np.isfinite(scaled) | (np.abs(values) < 2.0 ** -1022))):
        if not forms[j].is_zero():
            scaled[j] = ex.round_mpf(ex.iv_form(forms[j].scaled(ex.pow2(-e)), classes, 80)[0], "float64")
    return e, scaled, d_scaled
