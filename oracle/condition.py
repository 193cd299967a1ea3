"""The first-order condition of z, c and a, tight where a closed form applies.

``cond`` of an output o is sum_x |d o / dx| ulp(x) over every input x (reward and weight),
ulp(x) = ``math.ulp(x)``. The stage-wise running bound (:mod:`spec.error_model`,
``rounding=False``) drops the stages' cancellations; this module evaluates the Jacobians in
closed form, in power-of-two frames, and adds a bound on its own float64 evaluation error, so
that its result stays an upper bound (:func:`finish`: where it applies, else the stage-wise
bound). spec/gdpo.md section 7 states the Jacobians, where they apply, and the rigour: the
roundings tallied per stage, whose counts (3n + 60 for z, 8M + 4K + 120 for a, 3M + 60 for
:func:`whiten_values`) and underflow ``noise`` (:func:`_noise`) the code charges.
"""

from __future__ import annotations

import math

import numpy as np

#: unit roundoff of float64
U = 2.0 ** -53
#: the largest group column (or whitening unit of :func:`whiten_values`) summed densely
CAP = 4096
#: ``cond_sharp``: the evaluation error bound is at most this fraction of T - E
SHARP = 2.0 ** -20
#: a column (unit) whose largest |z| (|a|) is below this falls back
ZMIN = 2.0 ** -1000
_TINY = 2.0 ** -1022
#: absolute error of a computed O(1) quantity from underflow alone (spec/gdpo.md section 7)
_NOISE = 2.0 ** -1060
#: elements per dense block (rows x columns x groups)
_BLOCK = 1 << 21
_NEG = np.iinfo(np.int64).min // 4

#: False: every cond is the stage-wise bound (:func:`stagewise`)
ENABLED = True


def stagewise(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with every cond the stage-wise running bound (this module off),
    for the spec's before/after figures and the tests' fallback comparisons."""
    global ENABLED
    ENABLED = False
    try:
        return fn(*args, **kwargs)
    finally:
        ENABLED = True


def info(shape) -> dict:
    """Per group column (or whitening unit), what the closed form needs, filled by the oracle
    where it applies (``ok``): the frame 2^frame its std ``sigma`` and denominator ``denom``
    are measured in; at a zero std (``collapsed``) also Samuelson's ``cap``."""
    return {"frame": np.zeros(shape, dtype=np.int64), "sigma": np.zeros(shape), "denom": np.ones(shape),
            "ok": np.zeros(shape, bool), "collapsed": np.zeros(shape, bool), "cap": np.full(shape, math.inf)}


def admit(info: dict, at, frame: int, sigma: float, denom: float) -> None:
    """The closed form applies at ``at``: a live std, its sigma and denominator in the frame."""
    info["frame"][at], info["sigma"][at], info["denom"][at] = frame, sigma, denom
    info["ok"][at] = True


def admit_collapsed(info: dict, at, frame: int, h0: float, cap) -> None:
    """A zero std with eps added to it (or to the variance): z = d / h is differentiable at
    d = 0, with h0 = eps (sqrt(eps)) in the frame and theta = 0 (spec/gdpo.md section 7), where h0
    is a normal float there; capped by Samuelson's ``cap``."""
    if 2.0 ** -1022 <= h0 < math.inf:
        admit(info, at, frame, 0.0, h0)
        info["collapsed"][at], info["cap"][at] = True, float(cap)


def ulp_exponent(x: np.ndarray) -> np.ndarray:
    """kappa with ulp(x) = 2^kappa (``math.ulp``: 2^-1074 at 0 and among the subnormals)."""
    x = np.abs(np.asarray(x, dtype=np.float64))
    e = np.frexp(x)[1].astype(np.int64) - 53
    return np.where(x == 0.0, -1074, np.maximum(e, -1074))


def _exp_of(m: np.ndarray) -> np.ndarray:
    return np.frexp(m)[1].astype(np.int64)


def _ldexp(m, e):
    """m 2^e, e clipped to +-3000 (beyond it an O(1) m gives 0 or inf alike)."""
    return np.ldexp(m, np.clip(np.asarray(e, dtype=np.int64), -3000, 3000).astype(np.int32))


def _top(terms):
    """The largest exponent of nonnegative framed terms (m, x) (value m 2^x), _NEG where all are 0."""
    top = _NEG
    for m, x in terms:
        top = np.maximum(top, np.where(np.asarray(m) > 0, np.asarray(x, dtype=np.int64) + _exp_of(m), _NEG))
    return top


def framed_sum(terms):
    """Sum of nonnegative framed terms (m, x) (value m 2^x, any broadcastable shapes) as
    (m, x) with m in [0, 1]-ish: each term is scaled to the largest's exponent first, so
    nothing overflows; a term 2^1074 below the largest flushes (relative error 2^-1073)."""
    top = _top(terms)
    top = np.where(top == _NEG, 0, top)
    s = np.zeros(np.shape(top))
    for m, x in terms:
        s = s + _ldexp(m, np.asarray(x, dtype=np.int64) - top)
    return s, top


def _theta(placement: str, sigma, den, eps: float, frame):
    """theta, 1 - theta and the denominator as significand hm in [1/2, 1) and exponent hx
    (absolute h = hm 2^hx), from the oracle's sigma and denominator in the frame 2^frame."""
    hm, ed = np.frexp(den)
    hx = np.asarray(frame, dtype=np.int64) + ed.astype(np.int64)
    if placement in ("std", "std_if_positive"):
        theta = sigma / den
        om = _ldexp(eps, -hx) / hm  # eps / h <= 1
    elif placement == "var":
        q = sigma / den
        theta = q * q
        om = _ldexp(eps, -2 * hx) / (hm * hm)  # eps / h^2 <= 1
    else:
        theta = np.ones_like(np.asarray(sigma, dtype=np.float64))
        om = np.zeros_like(theta)
    return theta, om, hm, hx


def _dense(y, theta, om, nu, u=None, tau=None, tau_abs=None):
    """Row sums over blocks of B vectors of length n: R_i = sum_j |b_ij| nu_j and
    A_i = sum_j alpha_ij nu_j (its terms in absolute value), with
    b_ij = (delta_ij - 1/n) - theta y_i y_j - u_i tau_j   (n = 2: om (delta_ij - 1/2) - u_i tau_j),
    alpha_ij = |delta_ij - 1/n| + theta |y_i y_j| + |u_i| tau_abs_j."""
    B, n = y.shape
    R = np.zeros((B, n))
    A = np.zeros((B, n))
    inv = 1.0 / n
    gb = max(1, _BLOCK // (n * n))
    rb = n if n * n <= _BLOCK else max(1, _BLOCK // n)
    cols = np.arange(n)
    for g0 in range(0, B, gb):
        gs = slice(g0, g0 + gb)
        for r0 in range(0, n, rb):
            rows = np.arange(r0, min(n, r0 + rb))
            rs = slice(r0, r0 + rows.size)
            base = np.where(rows[:, None] == cols[None, :], 1.0 - inv, -inv)
            if n == 2:
                b = om[gs, None, None] * base  # +-om/2: exact given om
                alpha = np.abs(b)
            else:
                t = theta[gs, None, None] * (y[gs, rs, None] * y[gs, None, :])
                b = base - t
                alpha = np.abs(base) + np.abs(t)
            if u is not None:
                b = b - u[gs, rs, None] * tau[gs, None, :]
                alpha = alpha + np.abs(u[gs, rs, None]) * tau_abs[gs, None, :]
            R[gs, rs] = np.einsum("brn,bn->br", np.abs(b), nu[gs])
            A[gs, rs] = np.einsum("brn,bn->br", alpha, nu[gs])
    return R, A


def _noise(sub, zmax):
    """The absolute error bound per O(1) quantity of a row: 2^-1060 from underflow, plus
    2^-1066 / max |z| where a subnormal z (off by 2^-1075) moves y = z / |z| (at most
    2^-66 when max |z| >= :data:`ZMIN`)."""
    return _NOISE + np.where(sub, 2.0 ** -1066 / np.maximum(zmax, ZMIN), 0.0)


def _unit_vectors(Z):
    """y = Z / |Z| per row (rows of (B, n)), and whether a row holds a subnormal."""
    az = np.abs(Z)
    zmax = az.max(axis=1)
    ez = _exp_of(np.where(zmax > 0, zmax, 1.0))
    zs = np.ldexp(Z, -ez[:, None].astype(np.int32))
    nz = np.sqrt(np.einsum("bn,bn->b", zs, zs))
    y = zs / np.where(nz > 0, nz, 1.0)[:, None]
    sub = ((az > 0) & (az < _TINY)).any(axis=1)
    return y, zmax, sub


def _ulps(X):
    """nu_j = ulp(x_j) / max_j ulp(x_j) (exact powers of two, flushed below 2^-1100) and
    the exponent of that largest ulp, per row."""
    kap = ulp_exponent(X)
    kmax = kap.max(axis=1)
    return _ldexp(1.0, kap - kmax[:, None]), kmax


def _within_cap(T, E, x, cap):
    """Where a zero std's first-order value fl(T + E) 2^x (raised) stays at most Samuelson's
    ``cap`` (spec section 7: one ulp moves such an output by at most the cap; beyond it the
    cap is reported, not sharp). ``cap`` inf: a live std, always."""
    return ~(_ldexp((T + E) * (1 + 2.0 ** -49), x) > cap)


def finish(T, E, x, ok, old):
    """cond = fl(T + E) raised where ``ok``, else ``old``; sharp where ok and
    E <= 2^-20 (T - E) and the value lands among the normal floats. T 2^x and E 2^x
    are the tight value and its error bound."""
    old = np.asarray(old, dtype=np.float64)
    if not ENABLED:
        return old.copy(), np.zeros(old.shape, bool)
    s = T + E
    s = s + s * 2.0 ** -50
    v = _ldexp(s, x)
    v = np.where(np.abs(v) < _TINY, v + 5e-324, v)
    crit = E * (1 + 2.0 ** -40) <= SHARP * (T - E)
    ok = ok & np.isfinite(v)
    sharp = ok & crit & (v >= _TINY)
    # v itself, not min(old, v): v >= the exact change by construction, while the stage-wise
    # bound, rounded to nearest, may lie a few roundings below it where both are tight
    new = np.where(ok, v, old)
    new = np.where(np.isnan(old), old, new)
    return new, sharp & ~np.isnan(old)


def _common(T, x, E, xe):
    """T 2^x and E 2^xe in one exponent, the larger one's (the other may flush: 2^-1073 relative)."""
    x = np.asarray(x, dtype=np.int64)
    top = _top([(T, x), (E, xe)])
    top = np.where(top == _NEG, x, top)
    T, E = _ldexp(T, x - top), _ldexp(E, np.asarray(xe, dtype=np.int64) - top)
    # a flushed E (2^1074 below T) is covered by the 2^-50 raise in finish
    return T, E, top


def whiten_values(v, a64, members, info, placement, eps, old):
    """Eq. 6 alone on given values (the inputs are the values): per unit, the z formula
    (:func:`group_columns` of one column) with the unit's Y, Theta and H. ``info``: per unit
    frame, sigma, denominator (in the frame) and eligibility. Returns (cond, sharp)."""
    column = {key: np.asarray(x)[:, None] for key, x in info.items()}
    zs = group_columns(v[:, None], a64[:, None], members, column, placement, eps, np.zeros((v.size, 1), bool))
    return finish(zs.T[:, 0], zs.E[:, 0], zs.x[:, 0], zs.ok[:, 0], old)


class ZStage:
    """The z-level results, kept per group-size bucket for the later stages."""

    def __init__(self, N, K):
        self.T, self.E = np.zeros((N, K)), np.zeros((N, K))
        self.x, self.ok = np.zeros((N, K), dtype=np.int64), np.zeros((N, K), bool)
        self.buckets: dict[int, dict] = {}


def group_columns(r, z64, members, info, placement, eps, nan_mask) -> ZStage:
    """Tight cond of every eligible group column (``info``: per (group, column) frame,
    sigma, denominator in the frame, and ``ok``: live, no NaN, at least two members)."""
    N, K = r.shape
    out = ZStage(N, K)
    sizes = np.array([m.size for m in members])
    for n in np.unique(sizes):
        n = int(n)
        if n < 2 or n > CAP:
            continue
        gs = np.flatnonzero(sizes == n)
        idx = np.stack([members[g] for g in gs])  # (B, n)
        colok = info["ok"][gs] & ~nan_mask[idx].any(axis=1)  # (B, K)
        Bn = gs.size
        X = np.transpose(r[idx], (0, 2, 1)).reshape(Bn * K, n)
        Z = np.transpose(z64[idx], (0, 2, 1)).reshape(Bn * K, n)
        flat = np.flatnonzero(colok.reshape(-1))

        def at(key):  # an info array at the eligible columns
            return np.asarray(info[key])[gs].reshape(-1)[flat]

        def full(values, fill=0.0):  # (B, K, ...): the eligible columns' values, ``fill`` elsewhere
            whole = np.full((Bn * K,) + np.shape(values)[1:], fill, dtype=np.asarray(values).dtype)
            whole[flat] = values
            return whole.reshape((Bn, K) + np.shape(values)[1:])

        # T and E (T's evaluation error bound, noise included) per one ulp of each input, in one
        # exponent x per row; a zero std (collapsed) has y = 0 and theta = 0 exactly
        theta, om, hm, hx = _theta(placement, at("sigma"), at("denom"), eps, at("frame"))
        nu, kmax = _ulps(X[flat])
        y, zmax, sub = _unit_vectors(Z[flat])
        noise = _noise(sub, zmax)
        R, A = _dense(y, theta, om, nu)
        t = R / hm[:, None]
        e = ((3 * n + 60) * U * A + n * noise[:, None]) / hm[:, None]  # the count of z (spec/gdpo.md section 7)
        x = np.broadcast_to((kmax - hx)[:, None], (flat.size, n))
        # ok where the largest |z| is at least ZMIN, and a zero std's first-order value is at most
        # Samuelson's cap (else the cap, spec section 7: Eq. 7 and Eq. 6 fall back with it)
        ok = ((zmax >= ZMIN) | at("collapsed")) & _within_cap(t, e, x, at("cap")[:, None]).all(axis=1)
        out.T[idx], out.E[idx], out.x[idx] = (np.transpose(full(v), (0, 2, 1)) for v in (t, e, x))
        out.ok[idx] = np.transpose(np.broadcast_to(full(ok, False)[:, :, None], (Bn, K, n)), (0, 2, 1))
        out.buckets[n] = {"groups": gs, "idx": idx, "y": full(y), "nu": full(nu),
                          "theta": full(theta), "om": full(om), "hm": full(hm, 1.0), "hx": full(hx, 0),
                          "kmax": full(kmax, 0), "noise": full(noise)}
    return out


def combined(zs: ZStage, z64, w, old):
    """Tight cond of c: sum_k |w_k| cond(z_ik) + sum_k |z_ik| ulp(w_k), where every
    column of the sample's group is eligible. Returns (cond, sharp, ok per sample)."""
    N, K = z64.shape
    ok = zs.ok.all(axis=1) & np.all(np.isfinite(z64), axis=1)
    mw, xw = np.frexp(np.abs(w))
    xw = xw.astype(np.int64)
    lam = ulp_exponent(w)
    terms = [(mw[None, :] * zs.T, xw[None, :] + zs.x), (np.abs(z64), np.broadcast_to(lam[None, :], (N, K)))]
    T, x = _sum_over_k(terms)
    Ew, xe = _sum_over_k([(mw[None, :] * zs.E, xw[None, :] + zs.x)])
    # z's own bounds times |w_k|; the weights' products and the z's roundings, 2K framed
    # terms: (2K + 8) u T; a subnormal z is off by 2^-1075: times ulp(w_k)
    E, xe = framed_sum([(Ew * (1 + 2.0 ** -40), xe), ((2 * K + 8) * U * T, x),
                        (np.full(N, float(K)), np.full(N, -1070 + int(lam.max()), dtype=np.int64))])
    return (*finish(*_common(T, x, E, xe), ok, old), ok)


def _sum_over_k(terms):
    """Framed sum over the last axis of several (m, x) arrays of shape (N, K)."""
    return framed_sum([(np.asarray(m)[:, k], np.asarray(x)[:, k]) for m, x in terms for k in range(np.shape(m)[-1])])


def whitened(zs: ZStage, cok, z64, a64, w, gidx, members, uidx, uinfo, placement, eps, old):
    """Tight cond of a (per-sample whitening), per eligible unit: not collapsed, groups
    nested, every group eligible at Eq. 7, largest |a| at least :data:`ZMIN`. ``uinfo``:
    per unit frame, sigma, denominator (in the frame) and eligibility. Returns (cond, sharp)."""
    N, K = z64.shape
    S = int(uidx.max()) + 1 if N else 0
    G = len(members)
    # groups: nested in one unit and eligible at Eq. 7
    gunit = np.array([uidx[m[0]] for m in members])
    nested = np.array([bool(np.all(uidx[m] == uidx[m[0]])) for m in members])
    gok = nested & np.array([bool(cok[m].all()) for m in members])
    uok = np.asarray(uinfo["ok"], bool).copy()
    for g in np.flatnonzero(~gok):
        uok[uidx[members[g]]] = False
    amax = np.zeros(S)
    np.maximum.at(amax, uidx, np.where(np.isnan(a64), 0.0, np.abs(a64)))
    ucoll = np.asarray(uinfo["collapsed"], bool)
    uok &= (amax >= ZMIN) | ucoll  # a collapsed unit: a = 0, Y = 0 and Theta = 0 exactly
    usize = np.bincount(uidx, minlength=S)
    if not uok.any():
        return old.copy(), np.zeros(N, bool)
    sel = uok[uidx]
    # Y = a / |a| per unit (scaled by the unit's largest |a|), Theta, 1 - Theta, H
    ea = _exp_of(np.where(amax > 0, amax, 1.0))
    as_ = np.ldexp(np.where(sel, a64, 0.0), -ea[uidx].astype(np.int32))
    na = np.sqrt(np.bincount(uidx, weights=as_ * as_, minlength=S))
    Y = as_ / np.where(na > 0, na, 1.0)[uidx]
    usub = np.zeros(S, bool)
    np.logical_or.at(usub, uidx, (np.abs(a64) > 0) & (np.abs(a64) < _TINY))
    good_u = np.flatnonzero(uok)
    TH = np.zeros(S); HM = np.ones(S); HX = np.zeros(S, dtype=np.int64)
    th, _, m_, x_ = _theta(placement, uinfo["sigma"][good_u], uinfo["denom"][good_u], eps, uinfo["frame"][good_u])
    TH[good_u], HM[good_u], HX[good_u] = th, m_, x_
    u_i = TH[uidx] * Y
    # the weights' term: p_k = sum_{l in U} Y_l z_lk
    p = np.stack([np.bincount(uidx, weights=Y * z64[:, k], minlength=S) for k in range(K)], 1)
    pabs = np.stack([np.bincount(uidx, weights=np.abs(Y * z64[:, k]), minlength=S) for k in range(K)], 1)
    lam = ulp_exponent(w)
    mw, xw = np.frexp(np.abs(w))
    xw = xw.astype(np.int64)
    own_T, own_A, noise_own = np.zeros((N, K)), np.zeros((N, K)), np.zeros((N, K))
    own_x = np.zeros((N, K), dtype=np.int64)
    # per group, framed: Q_g = sum_k F_gk Q_gk, the same in absolute value, and sum_k F_gk n
    (Qm, Qx), (QAm, QAx), (SFm, SFx) = ((np.zeros(G), np.zeros(G, dtype=np.int64)) for _ in range(3))
    gnoise = np.zeros(G)
    for n, bk in zs.buckets.items():
        gs = bk["groups"]
        keep = np.flatnonzero(gok[gs] & uok[gunit[gs]])
        if keep.size == 0:
            continue
        g_ = gs[keep]
        idx = bk["idx"][keep]                      # (B, n)
        y, nu = bk["y"][keep], bk["nu"][keep]      # (B, K, n)
        theta, hm, hx, kmax = bk["theta"][keep], bk["hm"][keep], bk["hx"][keep], bk["kmax"][keep]
        gnoise[g_] = bk["noise"][keep].max(axis=1)
        Yg = Y[idx]                                # (B, n)
        s = np.einsum("bn,bkn->bk", Yg, y)
        sabs = np.einsum("bn,bkn->bk", np.abs(Yg), np.abs(y))
        tau = Yg[:, None, :] - theta[:, :, None] * y * s[:, :, None]
        tau_abs = np.abs(Yg)[:, None, :] + theta[:, :, None] * np.abs(y) * sabs[:, :, None]
        Q = np.einsum("bkn,bkn->bk", np.abs(tau), nu)
        QA = np.einsum("bkn,bkn->bk", tau_abs, nu)
        # F_gk = |w_k| 2^kmax / h_k
        Fm = mw[None, :] / hm
        Fx = xw[None, :] + kmax - hx
        ug = u_i[idx]
        for k in range(K):
            R, A = _dense(y[:, k], theta[:, k], bk["om"][keep][:, k], nu[:, k], ug, tau[:, k], tau_abs[:, k])
            own_T[idx, k] = Fm[:, k, None] * R
            own_A[idx, k] = Fm[:, k, None] * A
            own_x[idx, k] = Fx[:, k, None]
            noise_own[idx, k] = Fm[:, k, None] * n
        Qm[g_], Qx[g_] = framed_sum([(Fm[:, k] * Q[:, k], Fx[:, k]) for k in range(K)])
        QAm[g_], QAx[g_] = framed_sum([(Fm[:, k] * QA[:, k], Fx[:, k]) for k in range(K)])
        SFm[g_], SFx[g_] = framed_sum([(Fm[:, k] * n, Fx[:, k]) for k in range(K)])
    # the other groups of the unit: exclusive sums (prefix + suffix), per unit
    (Xm, Xx), (XAm, XAx) = ((np.zeros(G), np.zeros(G, dtype=np.int64)) for _ in range(2))
    SUm, SUx = np.zeros(S), np.zeros(S, dtype=np.int64)
    for s_ in good_u:
        gl = np.flatnonzero(gunit == s_)
        Xm[gl], Xx[gl] = _exclusive(Qm[gl], Qx[gl])
        XAm[gl], XAx[gl] = _exclusive(QAm[gl], QAx[gl])
        pre, top = _exclusive(np.append(SFm[gl], 0.0), np.append(SFx[gl], 0))
        SUm[s_], SUx[s_] = pre[-1], top[-1]  # the sum of every group of the unit
    wt = np.abs(z64 - u_i[:, None] * p[uidx])
    wtA = np.abs(z64) + np.abs(u_i)[:, None] * pabs[uidx]
    M = usize[uidx]
    unoise = _noise(usub, amax)
    np.maximum.at(unoise, gunit, gnoise)
    eta = unoise[uidx]
    lamN = np.broadcast_to(lam[None, :], (N, K))

    def framed_total(own, others, weights_term):
        """The own group's K terms, the other groups' term and the weights' K terms, summed."""
        return framed_sum([(own[:, k], own_x[:, k]) for k in range(K)] + [others]
                          + [(weights_term[:, k], lamN[:, k]) for k in range(K)])

    T, x = framed_total(own_T, (np.abs(u_i) * Xm[gidx], Xx[gidx]), wt)
    A, xa = framed_total(own_A, (np.abs(u_i) * XAm[gidx], XAx[gidx]), wtA)
    Nz, xn = framed_total(noise_own, (SUm[uidx], SUx[uidx]), np.broadcast_to((M + 2.0)[:, None], (N, K)))
    E, xe = framed_sum([((8 * M + 4 * K + 120) * U * A, xa), (eta * Nz, xn)])  # the count of a
    # times 1 / H, H = hm 2^hx
    T = T / HM[uidx]
    E = E / HM[uidx] * (1 + 2.0 ** -40)
    x, xe = x - HX[uidx], xe - HX[uidx]
    # a collapsed unit whose first-order value exceeds Samuelson's cap: the cap (spec section 7)
    T, E, x = _common(T, x, E, xe)
    bad = np.zeros(S, bool)
    np.logical_or.at(bad, uidx, ~_within_cap(T, E, x, np.asarray(uinfo["cap"])[uidx]))
    return finish(T, E, x, sel & ~bad[uidx], old)


def _exclusive(m, x):
    """For framed nonnegative values (m, x) of a unit's groups: for each group, the sum of
    the others, from prefix and suffix sums (no subtraction), framed at the unit's top."""
    top = int(_top([(m, x)]).max())
    top = 0 if top == _NEG else top
    v = _ldexp(m, x - top)
    pre = np.concatenate([[0.0], np.cumsum(v)[:-1]])
    suf = np.concatenate([np.cumsum(v[::-1])[::-1][1:], [0.0]])
    return pre + suf, np.full(m.size, top, dtype=np.int64)
