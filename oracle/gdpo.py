"""The exact GDPO reference: Eq. 4, Eq. 7 and Eq. 6, certified and correctly rounded.

Its steps carry the names and keywords of ``impl.gdpo`` (tests/test_same_names.py):
:func:`standardize_groups` (Eq. 4), :func:`combine` (Eq. 7 of given z), :func:`normalize_rewards`
(Eq. 4 + 7), :func:`whiten` (Eq. 6 of given values) and :func:`gdpo_advantages` (all three,
every intermediate stage attached); here also ``unit_ids``, ``convention``, ``token_counts``.

Inputs are taken exactly or refused (:mod:`oracle.inputs`); zeros and collapse are decided on
exact forms (:mod:`oracle.exact`); every output is rounded once to each of float64, float32,
float16 and bfloat16 (``Stage.rounded``) and carries ``cond``, the first-order change of the
output when every input moves by one ulp (:mod:`oracle.condition`; always an upper bound, the
change itself to 2^-19 where ``cond_sharp``), and ``delta``, the error model's bound, which
``allowed(out_dtype)`` turns into the tolerance (spec/gdpo.md sections 7 and 10).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from fractions import Fraction

import numpy as np

from oracle import condition as cn
from oracle import exact as ex
from oracle import inputs as inp
from oracle import whitening as wh
from spec import error_model as em
from spec.constants import FLOAT64_UNIT_ROUNDOFF
from spec.conventions import Convention, get_convention
from spec.errors import GroupError, NonFiniteError, SegmentError, ShapeError, process_state_error


@dataclasses.dataclass
class Stage:
    """One stage's exact results, per output element."""

    float64: np.ndarray
    float32: np.ndarray
    exact_zero: np.ndarray
    #: the first-order change per one ulp of every input: an upper bound on it (at least
    #: 5e-324), the change itself to 2^-19 where ``cond_sharp`` (spec/gdpo.md section 7)
    cond: np.ndarray
    delta: np.ndarray
    #: ``delta`` is in units of u * 2**frame (the combined stage's: huge weights cannot overflow it)
    frame: int = 0
    #: the structural zeros, demanded bit for bit (spec/gdpo.md section 7); other exact zeros
    #: are held to the error bound like any value
    required_zero: np.ndarray = None
    #: the exact values rounded once to float16 and bfloat16 (never through float32), as float64
    float16: np.ndarray = None
    bfloat16: np.ndarray = None
    cond_sharp: np.ndarray = None

    def allowed(self, out_dtype: str = "float64", unit_roundoff: float = FLOAT64_UNIT_ROUNDOFF) -> np.ndarray:
        """Absolute tolerance of a correct implementation's result, per element (any
        output format of ``spec.error_model.FORMATS``)."""
        return em.allowed_error(self.delta, self.float64, out_dtype, unit_roundoff, frame=self.frame)

    def reach(self, unit_roundoff: float = FLOAT64_UNIT_ROUNDOFF) -> np.ndarray:
        """|exact| + the error model's bound: the largest magnitude a correct float64
        result can have before its final cast."""
        return em.reach(self.delta, self.float64, unit_roundoff, frame=self.frame)

    def rounded(self, out_dtype: str) -> np.ndarray:
        """The exact values correctly rounded to ``out_dtype`` (float64, float32, float16,
        bfloat16), as float64; +-inf where the rounding overflows the format."""
        name = str(out_dtype).replace("torch.", "")
        if name not in ex.ROUNDED:
            raise ValueError(f"the oracle certifies roundings to {ex.ROUNDED}, not {out_dtype!r}")
        return getattr(self, name)

    def overflows(self, out_dtype: str) -> np.ndarray:
        """Per element: the exact value does not survive a correct cast to ``out_dtype``
        (its rounding is infinite): the contract refuses it (OutOfRangeError)."""
        return ~np.isfinite(self.rounded(out_dtype)) & np.isfinite(self.float64)


@dataclasses.dataclass
class Result(Stage):
    """Advantages (Eq. 6) with the intermediate stages and the collapse decisions."""

    z: Stage = None
    combined: Stage = None
    group_labels: np.ndarray = None
    group_index: np.ndarray = None
    group_collapsed: np.ndarray = None  # (G, K): column constant within the group
    group_cancelled: np.ndarray = None  # (G,): combined values of the group exactly zero
    unit_labels: np.ndarray = None
    unit_index: np.ndarray = None
    unit_collapsed: np.ndarray = None  # (S,): combined values of the unit exactly equal
    convention: Convention = None


def _stagewise_up(cond, m, keep=None):
    """The stage-wise condition bound made an upper bound despite its own float64 evaluation:
    times 1 + (m + 2) u, m the roundings along any of its terms, and at least 2^-1074. NaN and
    inf stay, and so does ``keep`` (a zero std's Samuelson cap: a bound on the change itself)."""
    cond = np.asarray(cond, dtype=np.float64)
    up = _floor_cond(cond * (1.0 + (m + 2) * FLOAT64_UNIT_ROUNDOFF))
    return up if keep is None else np.where(keep, cond, up)


def _floor_cond(cond):
    """cond at least 2^-1074 wherever it is not NaN (a change below float64's range still bounds so)."""
    cond = np.asarray(cond, dtype=np.float64)
    return np.where(np.isnan(cond), cond, np.maximum(cond, 5e-324))


def _stage(v: ex.Values, cond, sharp=None, frame=0) -> Stage:
    cond = _floor_cond(cond)
    return Stage(v.rounded["float64"], v.rounded["float32"], v.zero, cond, v.delta, frame, v.required,
                 v.rounded["float16"], v.rounded["bfloat16"], np.zeros(cond.shape, bool) if sharp is None else sharp)


def _roundings(members) -> int:
    """Roundings along any term of a stage-wise bound (``rounding=False``) for groups or units of at
    most n samples: 4n + 40 (tallied in spec/gdpo.md section 7)."""
    return 4 * max((m.size for m in members), default=1) + 40


def _whatever_numpy_is_told(fn):
    """A public step computes the same in any NumPy error state of the caller (every non-finite or
    underflowing value is decided explicitly), and refuses where the thread flushes subnormals.
    Every computation of the oracle runs inside one of these steps: no module of it repeats the
    ``np.errstate``."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        refused = process_state_error()
        if refused is not None:
            raise refused
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)
    return wrapper


# ----------------------------------------------------------------- public steps


def standardize_groups(rewards, group_ids=None, eps=None, convention="spec", *, group_size=None,
                       missing="refuse") -> Stage:
    """Eq. 4 alone: z per sample and reward column (weights ones, no whitening)."""
    return gdpo_advantages(rewards, group_ids, eps=eps, convention=convention, group_size=group_size,
                           missing=missing, _stages_only=True).z


def normalize_rewards(rewards, group_ids=None, weights=None, eps=None, convention="spec", *,
                      group_size=None, missing="refuse") -> Stage:
    """Eq. 4 then Eq. 7: the combined value c per sample."""
    return gdpo_advantages(rewards, group_ids, weights, eps=eps, convention=convention, group_size=group_size,
                           missing=missing, _stages_only=True).combined


@_whatever_numpy_is_told
def combine(z, *, weights=None) -> Stage:
    """Eq. 7 alone: c_j = sum_k w_k z_jk of given floats z (N, K) or (N,) and weights (K,), each
    the exact rational it is: the exact sum, correctly rounded once to each format. ``delta`` is
    the error model's Eq. 7 bound with Δz = 0; no zero is structural here (held to the bound)."""
    v = inp.as_float_matrix(z, "z")
    n, k = v.shape
    if not np.all(np.isfinite(v)):
        i, j = (int(x[0]) for x in np.nonzero(~np.isfinite(v)))
        raise NonFiniteError(f"z[{i}, {j}] (row {i}, reward column {j}) is {v[i, j]!r}; Eq. 7 needs finite values")
    w = inp.as_weights(weights, k)
    wq = [Fraction(x) for x in w.tolist()]
    c = ex.Values(n)
    for j in range(n):
        exact = sum((wk * Fraction(x) for wk, x in zip(wq, v[j].tolist())), Fraction(0))
        c.put(j, ex.round_all_fraction(exact))
        c.zero[j] = exact == 0
    c.delta, frame = em.combine_stage_framed(np.zeros((n, k)), v, w)
    # the first-order change of a sum of products: the sum of |w| ulp(z) + |z| ulp(w)
    dcond, cframe = em.combine_stage_framed(_ulps(v), v, w, d_weights=_ulps(w), rounding=False)
    cond = _stagewise_up(np.ldexp(dcond, cframe), 2 * k + 2)
    return _stage(c, cond, frame=frame)


def _ulps(x: np.ndarray) -> np.ndarray:
    """One ulp of each value, absolute (``math.ulp``: 2^-1074 at 0 and among the subnormals)."""
    return np.ldexp(1.0, cn.ulp_exponent(x).astype(np.int32))


@_whatever_numpy_is_told
def whiten(values, *, segment_sizes=None, unit_ids=None, eps=None, convention="spec", token_counts=None) -> Stage:
    """Eq. 6 alone on given float values (exact rationals), per unit: ``segment_sizes``
    (consecutive counts, as in impl.gdpo) or ``unit_ids`` (a label per sample); neither: one unit."""
    v = inp.as_float_matrix(values, "values")  # first: a ragged list is a ShapeError, named
    unit_ids = inp.units_of(v.shape[0], unit_ids, segment_sizes)
    conv = get_convention(convention)
    if v.shape[1] != 1:
        raise ShapeError(f"values must be a vector, got shape {v.shape}")
    v = v[:, 0]
    if not np.all(np.isfinite(v)):
        i = int(np.flatnonzero(~np.isfinite(v))[0])
        raise NonFiniteError(f"value {i} is {v[i]!r}; whitening needs finite values")
    n = v.size
    unit_ids = inp.as_labels(unit_ids, n, "unit_ids")
    t = inp.token_weights(conv, token_counts, n)
    eps_w, = inp.as_eps(eps, conv.whiten_eps)
    uidx = inp.index(unit_ids)[1]
    units = inp.members(uidx, uidx.max() + 1)
    # the inputs are exact, so every collapse of given values is structural
    c = ex.Values(n, required=True)
    c.forms = [ex.Form(Fraction(x)) for x in v.tolist()]
    c.rounded["float64"], c.cond = v, _ulps(v)
    uinfo = cn.info(len(units))
    a, ucoll = wh.whiten(c, uidx, t, conv, eps_w, ex.SqrtClasses(), uinfo=uinfo)
    sharp = None  # the stage-wise bound, except where the closed form below applies
    capped = ucoll[uidx] if conv.whiten_eps_placement != "skip_if_zero" else None  # skip: a = c
    cond = _stagewise_up(a.cond, _roundings(units), keep=capped)
    if conv.whiten == "per_sample":  # the tight first-order change where a closed form applies
        cond, sharp = cn.whiten_values(v, a.rounded["float64"], units, uinfo, conv.whiten_eps_placement,
                                       float(eps_w), cond)
    return _stage(a, cond, sharp)


@_whatever_numpy_is_told
def gdpo_advantages(rewards, group_ids=None, weights=None, unit_ids=None, eps=None, convention="spec",
                    token_counts=None, *, group_size=None, segment_sizes=None, missing="refuse",
                    _stages_only=False) -> Result:
    """Exact GDPO advantages of ``rewards`` (N, K) grouped by ``group_ids`` or ``group_size``.

    ``unit_ids`` (a label per sample) or ``segment_sizes`` (consecutive counts) give the
    whitening units (neither: one unit); ``eps`` overrides both eps of the convention;
    ``token_counts`` is required by per-token conventions (verl); ``missing``: "refuse" or
    "unscored" (:func:`oracle.inputs.with_missing`; a unit of one row is still refused).
    """
    conv = inp.with_missing(get_convention(convention), missing)
    r = inp.as_float_matrix(rewards)
    N, K = r.shape
    gl, gidx = inp.index(inp.as_labels(inp.groups_of(N, group_ids, group_size), N, "group_ids"))
    w = inp.as_weights(weights, K)
    uid = inp.as_labels(inp.units_of(N, unit_ids, segment_sizes), N, "unit_ids")
    t = None if _stages_only else inp.token_weights(conv, token_counts, N)
    nan_in = np.isnan(r)  # before a NaN policy replaces any (cond falls back on such columns)
    r = inp.check_finite(r, gl, gidx, conv)
    eps_g, eps_w = inp.as_eps(eps, conv.group_eps, conv.whiten_eps)
    wq = [Fraction(x) for x in w.tolist()]
    classes = ex.SqrtClasses()
    G = gl.size
    # c's bounds are kept per sample in a frame of its own (Δc_j = delta_j 2^frame_j,
    # spec.error_model.combine_stage_framed), so that huge weights cannot overflow them
    z, c = ex.Values((N, K)), ex.Values(N)
    collapsed, cancelled = np.zeros((G, K), bool), np.zeros(G, bool)
    groups = inp.members(gidx, G)
    colinfo = cn.info((G, K))
    for g, idx in enumerate(groups):
        cols = [_column(r[idx, k], conv, eps_g, classes, gl[g]) for k in range(K)]
        collapsed[g] = [not col.nan and col.collapsed for col in cols]
        _group_numbers(idx, cols, r, wq, w, conv, eps_g, classes, z, c, colinfo, g)
        cancelled[g] = bool(np.all(c.zero[idx]))
        if conv.algorithm == "shift_invariant":  # a code subtracting a rounded mean reproduces no zero bit
            z.required[idx] = collapsed[g]         # for bit (a constant column's mean leaves a residue):
            c.required[idx] = _structural_zero(cols, wq, cancelled[g])  # its zeros are held to its bound
    # the tight first-order change (oracle.condition) where a closed form applies; the
    # stage-wise bound (raised for its own rounding) where none does
    ccond_abs = np.ldexp(c.cond, c.cond_frame)
    z64 = z.rounded["float64"]
    zc = cn.group_columns(r, z64, groups, colinfo, conv.group_eps_placement, float(eps_g), nan_in)
    m_z = _roundings(groups)
    zcond, zsharp = cn.finish(zc.T, zc.E, zc.x, zc.ok, _stagewise_up(z.cond, m_z, keep=collapsed[gidx]))
    m_c = m_z + 2 * K + 8
    ccond, csharp, cok = cn.combined(zc, z64, w, _stagewise_up(ccond_abs, m_c))
    zstage = _stage(z, zcond, zsharp)
    cstage = _stage(c, ccond, csharp, frame=c.frame)
    ul, uidx = inp.index(uid)
    if _stages_only:
        a, ucoll = cstage, np.zeros(ul.size, bool)
    else:
        uinfo = cn.info(ul.size)
        if missing == "unscored":  # the metadata rule holds whatever is scored: a unit of one row is refused
            rows = np.bincount(uidx, minlength=ul.size)
            if conv.whiten != "none" and np.any(rows == 1):
                s = int(np.flatnonzero(rows == 1)[0])
                raise SegmentError(f"whitening unit {inp.py(ul[s])!r} has 1 sample(s); "
                                   "the unbiased std of Eq. 6 needs at least 2")
        whole = wh.units_of_whole_groups(gidx, uidx, G, ul.size) if wh.structural_mean(conv) else None
        scored = None  # every row takes part in Eq. 6, except the unscored ones (no closed form then)
        if conv.nan == "nan_aware_unscored" and nan_in.all(axis=1).any():
            scored, uinfo = ~nan_in.all(axis=1), None
        av, ucoll = wh.whiten(c, uidx, t, conv, eps_w, classes, ul, uinfo, whole, scored)
        capped = ucoll[uidx] if conv.whiten_eps_placement != "skip_if_zero" else None  # skip: a = c
        acond = _stagewise_up(av.cond, m_c + _roundings(inp.members(uidx, ul.size)), keep=capped)
        asharp = np.zeros(N, bool)  # per token, or unscored rows left out of Eq. 6: the stage-wise bound
        if conv.whiten == "none":  # a = c
            acond, asharp = ccond.copy(), csharp.copy()
        elif conv.whiten == "per_sample" and uinfo is not None:
            acond, asharp = cn.whitened(zc, cok, z64, av.rounded["float64"], w, gidx, groups, uidx, uinfo,
                                        conv.whiten_eps_placement, float(eps_w), acond)
        a = _stage(av, acond, asharp)
    return Result(**vars(a), z=zstage, combined=cstage, group_labels=gl, group_index=gidx,
                  group_collapsed=collapsed, group_cancelled=cancelled, unit_labels=ul, unit_index=uidx,
                  unit_collapsed=ucoll, convention=conv)


# --------------------------------------------------------------- Eq. 4 per column


def _int_repr(vals: list[float]) -> tuple[list[int], int]:
    """Integers M and exponent E with vals[j] == M[j] * 2**E exactly."""
    pairs = [v.as_integer_ratio() for v in vals]
    exps = [-(d.bit_length() - 1) for _, d in pairs]  # denominators are powers of two
    E = min(exps)
    return [n << (e - E) for (n, _), e in zip(pairs, exps)], E


@dataclasses.dataclass
class _Column:
    """Exact Eq. 4 for one group column of ``n`` valid (non-NaN) members: z_j = (D_j f) inv,
    inv = 1 / denominator (an exact form), D_j the integer deviations; the column's range is
    rho 2^E (kept as an integer: it may exceed float64), V its exact variance. ``raw``: a
    singleton kept as z = r / (1 + eps); ``nan``: a NaN propagates through the column."""

    n: int
    valid: np.ndarray = None
    D: list = ()
    f: Fraction = Fraction(0)
    inv: ex.Form = dataclasses.field(default_factory=ex.Form)
    V: Fraction = Fraction(0)
    rho: int = 0
    E: int = 0
    collapsed: bool = True
    nan: bool = False
    raw: bool = None


def _column(vals: np.ndarray, conv: Convention, eps_g: Fraction, classes: ex.SqrtClasses, label) -> _Column:
    valid = ~np.isnan(vals)
    if not valid.all() and conv.nan == "propagate":
        return _Column(vals.size, nan=True)
    use = vals[valid].tolist()
    n = len(use)
    if n < 2 and conv.group_ddof == 1 or n == 0:
        # nanstd of fewer than two values is NaN, later replaced by 0
        rule = "zero" if conv.nan in ("nan_aware", "nan_aware_unscored") and vals.size >= 2 else conv.singleton
        if rule == "error":
            raise GroupError(f"group {inp.py(label)!r} has {vals.size} sample(s); the unbiased std of Eq. 4 needs "
                             "at least 2")
        if rule == "raw" and n == 1:  # mean 0, std 1: z = r / (1 + eps)
            M, E = _int_repr(use)
            return _Column(n, valid, M, ex.pow2(E), ex.Form(1 / (1 + eps_g)), E=E, collapsed=M[0] == 0, raw=True)
        return _Column(n, valid, [0] * n)
    M, E = _int_repr(use)
    S = sum(M)
    D = [n * m - S for m in M]
    scale = ex.pow2(E)
    ss = sum(d * d for d in D)
    V = Fraction(ss, n * n * (n - conv.group_ddof)) * scale * scale
    inv = ex.Form() if ss == 0 else _inverse_denominator(V, eps_g, conv.group_eps_placement, classes)
    return _Column(n, valid, D, scale / n, inv, V, max(M) - min(M), E, collapsed=ss == 0)


def _inverse_denominator(V: Fraction, eps: Fraction, placement: str, classes: ex.SqrtClasses) -> ex.Form:
    """Exact form of 1 / D for D = sqrt(V) + eps, sqrt(V + eps) or sqrt(V) (V > 0)."""
    if placement in ("std", "std_if_positive"):
        sq = classes.sqrt(V)
        if not sq.terms:
            return ex.Form(1 / (sq.q0 + eps))
        den = V - eps * eps  # nonzero: V is not a rational square, eps^2 is
        (cid, p), = sq.terms.items()
        return ex.Form(-eps / den, {cid: p / den})
    if placement == "var":
        W = V + eps
        return classes.sqrt(W).scaled(1 / W)
    return classes.sqrt(V).scaled(1 / V)  # skip_if_zero: no eps


def _valid_pos(col: _Column, jj: int):
    """Position of group member jj among the column's valid (non-NaN) entries."""
    if not col.valid[jj]:
        return None
    return jj if col.valid.all() else int(col.valid[:jj].sum())


def _group_numbers(idx, cols, r, wq, w, conv, eps_g, classes, z: ex.Values, c: ex.Values, info, g):
    """Certified z and c of group ``g`` (rows ``idx``), their error model and stage-wise
    condition; ``info`` (:func:`oracle.condition.info`, per group and column) receives each
    live column's frame, sigma and denominator in that frame, for :mod:`oracle.condition`."""
    n, K = idx.size, len(cols)
    # exact forms of c_j; a NaN column (nan="propagate") makes every c of the group NaN
    nan_rows = any(col.nan for col in cols)
    c.nan[idx] = nan_rows
    weighted = [col.inv.scaled(wq[k] * col.f) for k, col in enumerate(cols)]
    for jj, j in enumerate(() if nan_rows else idx):
        form = ex.Form()
        for k, col in enumerate(cols):
            pos = _valid_pos(col, jj)
            if pos is None or col.collapsed and not col.raw:
                continue
            form.add_scaled(weighted[k], Fraction(col.D[pos]))
        c.forms[j] = form
        c.zero[j] = form.is_zero()
    # certified numbers, each correctly rounded once to every format
    for k, col in enumerate(cols):
        _certify_column(col, idx, k, classes, z)
    for j in idx:
        c.put(j, np.nan if c.nan[j] else ex.round_form(c.forms[j], classes))
    # error model and condition, in a frame scaled so nothing overflows
    dz_model, dz_cond = np.zeros((n, K)), np.zeros((n, K))
    zs = z.rounded["float64"][idx]
    tau = em.underflow_tau(conv.native_dtype)  # the code's own subnormal spacing, in its own u
    for k, col in enumerate(cols):
        if col.nan:
            dz_model[:, k] = dz_cond[:, k] = np.nan
            continue
        vals = r[idx, k]
        e = _frame(col, vals)
        if not col.raw:  # z = r / (1 + eps) is not measured in the frame: no eps to scale
            e = max(e, ex.eps_floor(eps_g, conv.group_eps_placement))
        sel = col.valid
        scale = col.f * ex.pow2(-e)  # int / int true division is correctly rounded, even for huge ints
        dev = np.array([d * scale.numerator / scale.denominator for d in col.D], dtype=np.float64)
        sigma = ex.float_sqrt(col.V * ex.pow2(-2 * e))
        denom = _scaled_denominator(col, conv, eps_g, e, sigma)
        rho = float(Fraction(col.rho) * ex.pow2(col.E - e))
        if col.rho and rho == 0.0:  # flushed in a frame lifted by a huge eps: a range, not a collapse
            rho = 5e-324
        if conv.algorithm == "mean_then_subtract" and col.n:  # r - mean(r): rounding scales with the magnitude
            rho = max(rho, float(np.max(np.abs(np.ldexp(vals[sel], -e)))))
        d_model = em.model_dev_perturbation(rho, col.n, tau=math.ldexp(tau, -e))
        # one ulp of each input in the frame (a subnormal's is the absolute 2^-1074 whatever the frame)
        ulps = np.maximum(np.spacing(np.abs(np.ldexp(vals[sel], -e))), np.ldexp(5e-324, -e))
        d_cond = ulps + (ulps.mean() if ulps.size else 0.0)
        if col.raw:
            dz_model[sel, k] = em.standardize_groups_stage(dev, 0.0, 1.0, denom, zs[sel, k], 1, 0)
            dz_cond[sel, k] = np.ldexp(ulps, e) / denom  # ulps are measured in the frame 2^e
            continue
        if col.n == 0:
            continue
        cap_u = conv.unit_roundoff if (conv.algorithm == "mean_then_subtract"
                                       and conv.group_eps_placement in ("std", "var")) else None
        dz_model[sel, k] = em.standardize_groups_stage(dev, d_model, sigma, denom, zs[sel, k], col.n, conv.group_ddof,
                                                       cap_u=cap_u, tau=tau)
        # at a zero std the condition sees the denominator a perturbed column has as it un-collapses
        # (eps, sqrt(eps); 0 without eps: then Samuelson's cap), not the collapse rule's placeholder 1
        h0 = ex.collapsed_denominator(eps_g, conv.group_eps_placement, e)
        dz_cond[sel, k] = em.standardize_groups_stage(dev, d_cond, sigma, h0 if col.collapsed else denom, zs[sel, k],
                                                      col.n, conv.group_ddof, rounding=False)
        if not col.collapsed and col.n == n and col.V > 0 and sigma > 0.0 and 0.0 < denom < math.inf:
            cn.admit(info, (g, k), e, sigma, denom)
        elif col.collapsed and col.n == n >= 2 and col.V == 0:  # z = d / h is differentiable at d = 0 (eps > 0)
            cn.admit_collapsed(info, (g, k), e, h0, em.samuelson(n, conv.group_ddof))
    z.delta[idx] = dz_model
    # a change of z flushed to 0 would be multiplied by a weight at Eq. 7 (1e300 times 0)
    z.cond[idx] = dz_cond = _floor_cond(dz_cond)
    c.delta[idx], c.frame[idx] = em.combine_stage_framed(dz_model, zs, w, tau=tau)
    c.cond[idx], c.cond_frame[idx] = em.combine_stage_framed(dz_cond, zs, w, d_weights=_ulps(w), rounding=False)


def _certify_column(col: _Column, idx, k: int, classes, z: ex.Values) -> None:
    """z of one group column, each correctly rounded: an exact rational where inv is rational
    (a tie included), else the integer D_j times one interval of f inv (Ziv's loop)."""
    if col.nan:
        z.put((idx, k), np.nan)
        return
    live = []
    for jj, j in enumerate(idx):
        pos = _valid_pos(col, jj)
        if pos is None or col.D[pos] == 0 or (col.collapsed and not col.raw):
            z.put((j, k), 0.0)
            z.zero[j, k] = True
        elif col.inv.is_rational():
            z.put((j, k), ex.round_all_fraction(col.D[pos] * col.f * col.inv.q0))
        else:
            live.append((j, col.D[pos]))
    for prec in ex.PRECISIONS:
        if not live:
            return
        inv_iv = ex.iv_scale_rational(ex.iv_form(col.inv, classes, prec), col.f, prec)
        every = [ex.round_all(ex.iv_scale_rational(inv_iv, Fraction(d), prec)) for _, d in live]
        if None not in every:
            for (j, _), v in zip(live, every):
                z.put((j, k), v)
            return
    raise ex.CertificationError(f"could not certify group members {idx[:4].tolist()}... within {ex.MAX_PREC} bits")


def _frame(col: _Column, vals: np.ndarray) -> int:
    """Power-of-two exponent that brings the column's spread (or its ulps) to O(1)."""
    if col.rho:
        e = col.rho.bit_length() + col.E
    else:
        ref = max((math.ulp(float(v)) for v in vals), default=1.0)  # math.ulp(DBL_MAX) is finite
        e = math.frexp(ref)[1]
    # clamped so that the spread stays representable and eps * 2^-e finite for eps below 2^60
    # (the caller raises the frame to eps_floor for larger eps)
    return min(max(e, -900), 1000)


def _scaled_denominator(col: _Column, conv: Convention, eps: Fraction, e: int, sigma: float) -> float:
    if col.raw:  # z = r / (1 + eps): r is measured in the frame, 1 + eps is not
        return float(1 + eps)
    p = conv.group_eps_placement
    if p in ("std", "std_if_positive"):  # eps 2^-e is at most 2^960: the frame is at least eps_floor's
        # the std's sign from the exact variance: in a frame lifted by a huge eps, sigma may flush to 0
        return sigma + float(eps * ex.pow2(-e)) if col.V > 0 or p == "std" else 1.0
    if p == "var":  # sqrt(V + eps) in the frame, from the exact rationals: eps 2^-2e alone may be beyond float64
        return ex.float_sqrt((col.V + eps) * ex.pow2(-2 * e))
    return sigma if sigma > 0 else 1.0


def _structural_zero(cols, wq, cancelled: bool) -> bool:
    """Is the group's exact zero combination reproduced bit for bit by the prescribed algorithm?
    Where no column contributes, or exactly two contribute with weights of equal magnitude,
    cancel, and are equal up to shift and sign (spec/gdpo.md section 7, "Exact zeros": at
    eps = 0 exact cancellation alone does not say so)."""
    if any(col.nan for col in cols):
        return False
    live = [k for k, col in enumerate(cols) if wq[k] != 0 and (col.raw or not col.collapsed)]
    if not live:
        return True
    if not (cancelled and len(live) == 2 and abs(wq[live[0]]) == abs(wq[live[1]])):
        return False
    a, b = cols[live[0]], cols[live[1]]
    if bool(a.raw) != bool(b.raw) or not np.array_equal(a.valid, b.valid):
        return False
    # the exact deviations D_j f (a raw singleton's value itself) equal up to one sign
    pairs = [(da * a.f, db * b.f) for da, db in zip(a.D, b.D)]
    if any((x == 0) != (y == 0) for x, y in pairs):
        return False
    return {1 if x == y else -1 if x == -y else 0 for x, y in pairs if x != 0} in ({1}, {-1}, set())
