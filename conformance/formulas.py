"""The formula, diagnosed: which variant of GDPO an implementation computes.

Where an implementation's finite outputs on ordinary inputs are farther from the exact
advantages than any rounding explains, the difference is usually not an accident of float
arithmetic but another formula: a leave-one-out baseline, no division by the std, a
biased std, another eps, no Eq. 6, clipped advantages. :func:`diagnose` searches a
catalogue of such variants and names the one that reproduces the output within the
implementation's own precision, as its differences from the paper equation by equation
("Eq. 4: leave-one-out baseline; Eq. 6: no eps"). No declaration is needed.

The catalogue (:data:`CATALOGUE`, one :class:`Choice` per way to differ) holds every
choice the presets of ``spec/conventions.py`` encode (ddof, eps value and placement, the
NaN and singleton policies, collapse handling, the whitening scope, token weighting, no
Eq. 6) and the published GRPO-family variants (RLOO's leave-one-out baseline, Dr. GRPO's
missing division by the std, a batch-level std, weights applied before normalisation,
i.e. GRPO on the weighted sum, clipped advantages), alone and combined: a
:class:`Variant` is one value per choice. eps values are enumerated (the call's, 0 and the
values peers use) and, at Eq. 6, also fitted from the output; a clip value is read off the
output. Each variant is computed in float64 numpy (:func:`evaluate`), exactly as it reads.

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

from spec import error_model as em
from spec.constants import DEFAULT_EPS, FLOAT32_UNIT_ROUNDOFF, FLOAT64_UNIT_ROUNDOFF
from spec.conventions import CONVENTIONS, Convention

#: eps values searched at Eq. 4 and Eq. 6 besides the call's own (None in a Variant):
#: none, and the values the peers use (spec/conventions.py) and their neighbours
EPS_VALUES: tuple = (0.0, 1e-8, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2)

#: how many candidates, best first by their relative error, are checked against their
#: own error bound (the rest are farther from the output than the last one checked)
CHECKED = 48


# ------------------------------------------------------------------ the catalogue


@dataclasses.dataclass(frozen=True)
class Variant:
    """One formula: a value per choice. The defaults are the paper's (``spec``); an eps
    of None is the eps the call passes (1e-4 where it passes none)."""

    baseline: str = "mean"          # Eq. 4: "mean", "leave_one_out"
    scale: str = "group_std"        # Eq. 4: "group_std", "loo_std", "batch_std", "none"
    group_ddof: int = 1
    group_placement: str = "std"    # "std" (std + eps), "var" (sqrt(var + eps)), "skip_if_zero"
    group_eps: float | None = None
    singleton: str = "error"        # a group of one: "error", "zero", "raw"
    nan: str = "error"              # "error", "zero_first", "nan_aware", "nan_aware_unscored", "propagate"
    weights: str = "after"          # Eq. 7: "after" (GDPO), "before" (GRPO on the weighted sum),
    #                                 "normalized" (w / sum w, then GDPO's Eq. 7)
    whiten: str = "per_sample"      # Eq. 6: "per_sample", "per_token", "center", "none"
    whiten_scope: str = "unit"      # "unit" (per training batch), "batch" (the whole call), "group" (per prompt group)
    whiten_ddof: int = 1
    whiten_placement: str = "std"
    whiten_eps: float | None = None
    clip: float | None = None       # advantages clipped to [-clip, clip]

    def canonical(self) -> "Variant":
        """The same formula with the choices it does not use set to the paper's (no std:
        no ddof or eps; no Eq. 6: no Eq. 6 choices; ``skip_if_zero`` has no eps)."""
        v, ch = self, {}
        if v.scale == "none":
            ch.update(group_ddof=1, group_placement="std", group_eps=None)
        elif v.group_placement == "skip_if_zero":
            ch.update(group_eps=0.0)
        elif v.group_placement == "var" and v.group_eps == 0.0:  # sqrt(var + 0) is the std
            ch.update(group_placement="std")
        if v.whiten in ("none", "center"):
            ch.update(whiten_ddof=1, whiten_placement="std", whiten_eps=None)
            if v.whiten == "none":
                ch.update(whiten_scope="unit")
        if v.whiten == "center" and v.whiten_scope == "group":  # c is centred in each group already
            ch.update(whiten="none", whiten_scope="unit")
        if (v.whiten == "per_sample" and v.whiten_scope == "group" and v.scale == "none" and v.baseline == "mean"
                and v.weights == "after" and v.singleton == "error"):
            # c = sum_k w_k (r_k - mean_g r_k) is the weighted sum's deviation, whitened within its group: GRPO
            # on the weighted sum, the one formula written two ways
            ch = {"weights": "before", "scale": "group_std", "group_ddof": v.whiten_ddof,
                  "group_placement": v.whiten_placement, "group_eps": v.whiten_eps, "whiten": "none",
                  "whiten_scope": "unit", "whiten_ddof": 1, "whiten_placement": "std", "whiten_eps": None}
            return _with(v, **ch).canonical()
        elif v.whiten_placement == "skip_if_zero":
            ch.update(whiten_eps=0.0)
        elif v.whiten_placement == "var" and v.whiten_eps == 0.0:
            ch.update(whiten_placement="std")
        ch = {k: x for k, x in ch.items() if getattr(v, k) != x or (x is None) != (getattr(v, k) is None)}
        return _with(v, **ch) if ch else v


PAPER = Variant()


def _with(v: Variant, **changes) -> Variant:
    """``dataclasses.replace`` without its checks (the search makes thousands)."""
    d = dict(v.__dict__)
    d.update(changes)
    return Variant(**d)


@dataclasses.dataclass(frozen=True)
class Choice:
    """One way to differ from the paper: the field of :class:`Variant` and its value
    (``"fitted"`` for an eps or clip value found from the output), the words a
    diagnosis uses, who computes it, and what a case needs to exercise it."""

    equation: str
    field: str
    value: object
    words: str
    who: str
    needs: str = ""


CATALOGUE: tuple[Choice, ...] = (
    Choice("NaN rewards", "nan", "zero_first", "replaced by 0 before Eq. 4", "nvlabs", "a NaN reward"),
    Choice("NaN rewards", "nan", "nan_aware", "left out of the group statistics, their z 0", "ms_swift",
           "a NaN reward"),
    Choice("NaN rewards", "nan", "nan_aware_unscored",
           "left out of the group statistics, their z 0; a sample with every reward NaN left out of Eq. 6, "
           "advantage 0", "trl", "a NaN reward"),
    Choice("NaN rewards", "nan", "propagate", "flow through the formula (NaN advantages)", "verl, nemo_rl",
           "a NaN reward"),
    Choice("Eq. 4", "baseline", "leave_one_out", "leave-one-out baseline (the mean of the group's other members)",
           "RLOO"),
    Choice("Eq. 4", "scale", "none", "no division by the std", "Dr. GRPO"),
    Choice("Eq. 4", "scale", "loo_std", "leave-one-out std (each row's std over the group's other members; "
           "a group of two: the group's std)", "-"),
    Choice("Eq. 4", "scale", "batch_std", "divides by the std of the column over the whole batch, not the group's",
           "TRL scale_rewards='batch'"),
    Choice("Eq. 4", "group_ddof", 0, "biased std (ddof 0)", "multireward_grpo"),
    Choice("Eq. 4", "group_placement", "var", "eps added to the variance: sqrt(var + eps)", "-"),
    Choice("Eq. 4", "group_placement", "skip_if_zero", "no eps; a column of std 0 left undivided", "-",
           "a constant group column"),
    Choice("Eq. 4", "group_eps", "fitted", "eps other than the call's: 0 (no eps) or a value, enumerated",
           "verl, nemo_rl, ms_swift, multireward_grpo"),
    Choice("Eq. 4", "singleton", "zero", "a group of one gives z = 0", "trl, nemo_rl, ms_swift, multireward_grpo",
           "a group of one"),
    Choice("Eq. 4", "singleton", "raw", "a group of one gives z = r / (1 + eps) (mean 0, std 1)", "verl",
           "a group of one"),
    Choice("Eq. 7", "weights", "before", "weights applied to the rewards before Eq. 4 (GRPO on the weighted sum)",
           "GRPO", "K >= 2 or a weight other than 1"),
    Choice("Eq. 7", "weights", "normalized", "weights normalized to sum 1 (w / sum w)", "-",
           "K >= 2 or a weight other than 1"),
    Choice("Eq. 6", "whiten", "none", "none (no batch whitening)", "GRPO, multireward_grpo"),
    Choice("Eq. 6", "whiten", "center", "centred only, no division by the std", "Dr. GRPO"),
    Choice("Eq. 6", "whiten", "per_token", "each sample weighted by its token count", "verl", "token counts"),
    Choice("Eq. 6", "whiten_scope", "batch", "over the whole batch, not per unit", "trl, nvlabs",
           "several whitening units"),
    Choice("Eq. 6", "whiten_scope", "group", "within each prompt group, not over the batch", "-",
           "two groups or more"),
    Choice("Eq. 6", "whiten_ddof", 0, "biased std (ddof 0)", "-"),
    Choice("Eq. 6", "whiten_placement", "var", "eps added to the variance: sqrt(var + eps)", "verl"),
    Choice("Eq. 6", "whiten_placement", "skip_if_zero", "no eps; a unit of std 0 passed through unchanged",
           "nemo_rl", "a unit whose combined values are all equal"),
    Choice("Eq. 6", "whiten_eps", "fitted", "eps other than the call's: 0 (no eps) or a value, enumerated "
           "and fitted from the output", "verl, nemo_rl, ms_swift"),
    Choice("after Eq. 6", "clip", "fitted", "advantages clipped to [-C, C], C read off the output", "PPO-style codes",
           "an advantage beyond C"),
)


def _eps_words(placement: str, eps, paper_eps: float | None, what: str) -> str | None:
    if placement == "skip_if_zero":
        return f"no eps; a {what} of std 0 left undivided" if what == "column" else \
            f"no eps; a {what} of std 0 passed through unchanged"
    e = eps
    if placement == "std":
        if e is None:
            return None
        if paper_eps is not None and e == paper_eps:
            return None
        return "no eps" if e == 0.0 else f"eps {e:g}"
    shown = "the call's eps" if e is None else f"{e:g}"
    return f"eps added to the variance: sqrt(var + {shown})"


def differences(variant: Variant, paper_eps: float | None = None) -> list[str]:
    """How ``variant`` differs from the paper, one line per choice, each naming its
    equation (empty: the paper's formula). ``paper_eps``: the eps the call passed (an
    eps equal to it is the paper's)."""
    v = variant.canonical()
    words = {(c.field, c.value): c.words for c in CATALOGUE}
    out = []
    if v.nan != "error":
        out.append(f"NaN rewards: {words[('nan', v.nan)]}")
    on = " (on the weighted sum)" if v.weights == "before" else ""
    if v.weights != "after":
        out.append(f"Eq. 7: {words[('weights', v.weights)]}")
    for field in ("baseline", "scale"):
        if getattr(v, field) != getattr(PAPER, field):
            out.append(f"Eq. 4{on}: {words[(field, getattr(v, field))]}")
    if v.scale != "none":
        if v.group_ddof != 1:
            out.append(f"Eq. 4{on}: {words[('group_ddof', 0)]}")
        eps = _eps_words(v.group_placement, v.group_eps, paper_eps, "column")
        if eps:
            out.append(f"Eq. 4{on}: {eps}")
    if v.singleton != "error":
        out.append(f"Eq. 4{on}: {words[('singleton', v.singleton)]}")
    if v.whiten != "per_sample":
        out.append(f"Eq. 6: {words[('whiten', v.whiten)]}")
    if v.whiten != "none" and v.whiten_scope != "unit":
        out.append(f"Eq. 6: {words[('whiten_scope', v.whiten_scope)]}")
    if v.whiten not in ("none", "center"):
        if v.whiten_ddof != 1:
            out.append(f"Eq. 6: {words[('whiten_ddof', 0)]}")
        eps = _eps_words(v.whiten_placement, v.whiten_eps, paper_eps, "unit")
        if eps:
            out.append(f"Eq. 6: {eps}")
    if v.clip is not None:
        out.append(f"after Eq. 6: advantages clipped to [-{v.clip:g}, {v.clip:g}]")
    return out


def from_convention(convention: "str | Convention", faithful: bool = False) -> Variant:
    """A preset's formula as a :class:`Variant` (``std_if_positive`` is ``std`` in exact
    arithmetic: a deviation of a constant column is 0 whatever divides it; ``faithful`` keeps it
    and the preset's own eps, for evaluating the formula as its code computes it)."""
    c = CONVENTIONS[convention] if isinstance(convention, str) else convention
    spec = c.name == "spec" and not faithful
    keep = ("std_if_positive",) if faithful else ()
    gp = "std" if c.group_eps_placement == "std_if_positive" and not keep else c.group_eps_placement
    wp = "std" if c.whiten_eps_placement == "std_if_positive" and not keep else c.whiten_eps_placement
    return Variant(group_ddof=c.group_ddof, group_placement=gp, group_eps=None if spec else c.group_eps,
                   singleton=c.singleton, nan=c.nan, whiten=c.whiten,
                   whiten_scope="unit" if spec or faithful else "batch", whiten_ddof=c.whiten_ddof,
                   whiten_placement=wp, whiten_eps=None if spec else c.whiten_eps).canonical()


#: the options of each structural choice, as the search enumerates them (the paper's first)
NANS = ("error", "zero_first", "nan_aware", "nan_aware_unscored", "propagate")
SINGLETONS = ("error", "zero", "raw")
ORDERS = ("after", "before", "normalized")
BASELINES = ("mean", "leave_one_out")
SCALES = ("group_std", "loo_std", "batch_std")  # and "none" (no ddof, eps or placement)
DDOFS = (1, 0)
PLACEMENTS = ("std", "var", "skip_if_zero")
WHITENS = ("per_sample", "per_token")  # and "center" (per scope) and "none"
SCOPES = ("unit", "batch", "group")


def catalogue_size() -> int:
    """The number of structural variants: every choice combined where it applies, each
    eps and clip counted once however many values it takes."""
    eq4 = len(NANS) * len(SINGLETONS) * len(ORDERS) * len(BASELINES) * (1 + len(SCALES) * len(DDOFS) * len(PLACEMENTS))
    eq6 = 1 + len(SCOPES) + len(WHITENS) * len(SCOPES) * len(DDOFS) * len(PLACEMENTS)
    return eq4 * eq6 * 2


# ------------------------------------------------------------------ evaluation


class _Batch:
    """A case, prepared once: rewards, group and unit indices, weights, eps, and the dtype the
    variant is evaluated in (float64 for the diagnosis; float32 mirrors a float32 code)."""

    def __init__(self, case, token_counts=None, dtype="float64"):
        if not hasattr(case, "rewards_array") or not hasattr(case, "labels"):
            raise TypeError(f"a conformance.cases.Case (one process's call) is diagnosed, not {type(case).__name__}")
        if not case.rewards:
            raise ValueError("an empty case has no output to diagnose")
        self._setup(case.rewards_array(), case.labels(), case.unit_ids(), case.weights,
                    DEFAULT_EPS if case.eps is None else float(case.eps), case.out_dtype, token_counts, dtype)

    @classmethod
    def of(cls, rewards, labels, units=None, weights=None, eps=DEFAULT_EPS, token_counts=None, dtype="float64"):
        """A batch of arrays (rewards (N, K) or (N,), a label per row, a unit per row or None)."""
        b = cls.__new__(cls)
        r = np.asarray(rewards, dtype=np.float64)
        b._setup(r[:, None] if r.ndim == 1 else r, np.asarray(labels), units, weights, float(eps), dtype,
                 token_counts, dtype)
        return b

    def _setup(self, r, labels, units, weights, eps, out_dtype, token_counts, dtype):
        self.dt = np.dtype(dtype)
        self.r = r.astype(self.dt)
        self.n, self.k = r.shape
        _, gi = np.unique(labels, return_inverse=True)
        self.gi = gi.reshape(-1)
        self.G = int(self.gi.max()) + 1 if self.n else 0
        if units is None:
            self.ui, self.S = np.zeros(self.n, np.int64), 1
        else:
            _, ui = np.unique(np.asarray(units), return_inverse=True)
            self.ui, self.S = ui.reshape(-1), int(ui.max()) + 1
        self.w = (np.ones(self.k) if weights is None else np.asarray(weights, dtype=np.float64)).astype(self.dt)
        self.eps = eps
        self.out_dtype = out_dtype
        self.t = None if token_counts is None else np.asarray(token_counts, dtype=np.float64).astype(self.dt)
        if self.t is not None and self.t.shape != (self.n,):
            raise ValueError(f"token_counts: {self.t.shape[0]} counts for {self.n} samples")
        self.size = np.bincount(self.gi, minlength=self.G)
        order = np.argsort(self.gi, kind="stable")
        self.members = np.split(order, np.cumsum(self.size)[:-1])
        self.has_nan = bool(np.isnan(r).any())
        self.unscored = bool(np.isnan(r).all(axis=1).any())  # a sample no reward function scored
        self.has_singleton = bool((self.size == 1).any())
        fin = np.where(np.isfinite(r), r, 0.0)
        self.bounds: dict = {}  # (Eq. 4 and 7 of a variant, u) -> its Δc
        self.constant_column = any(np.all(fin[m] == fin[m][:1], axis=0).any() for m in self.members if m.size > 1)

    def gsum(self, values: np.ndarray, index: np.ndarray, count: int) -> np.ndarray:
        """Per index, the sum of ``values`` in the batch's dtype: float64 by ``np.bincount``, a
        narrower dtype by NumPy's own (pairwise) sum of each index's rows in it, as a code of that
        dtype sums a group (``x[group].sum()``)."""
        if self.dt == np.float64:
            return np.bincount(index, values, count)
        order = np.argsort(index, kind="stable")
        parts = np.split(values.astype(self.dt)[order], np.cumsum(np.bincount(index, minlength=count))[:-1])
        return np.array([p.sum(dtype=self.dt) for p in parts], dtype=self.dt)


@dataclasses.dataclass
class _Parts:
    """A variant's float64 values, and what its error bound reads."""

    x: np.ndarray      # the input of Eq. 4 (rewards, or their weighted sum)
    w: np.ndarray      # the weights of Eq. 7 (ones where applied before)
    z: np.ndarray
    dev: np.ndarray    # the numerator of Eq. 4 (deviation from the baseline)
    sigma: np.ndarray  # per row and column: the std divided by
    denom: np.ndarray
    n: np.ndarray      # per row and column: the group's count
    c: np.ndarray


def _eq4(b: _Batch, v: Variant) -> _Parts:
    """Eq. 4 and 7 of ``v`` as the formula reads (mean, deviations, std), in the batch's dtype."""
    dt, r = b.dt, b.r
    if v.nan == "zero_first":
        r = np.where(np.isnan(r), dt.type(0), r)
    w = b.w
    if v.weights == "before":
        r = (r * w).sum(axis=1, keepdims=True, dtype=dt)
        w = np.ones(1, dt)
    elif v.weights == "normalized":
        with np.errstate(all="ignore"):
            w = w / w.sum(dtype=dt)
    aware = v.nan in ("nan_aware", "nan_aware_unscored")
    ok = ~np.isnan(r) if aware else np.ones(r.shape, bool)
    x = np.where(ok, r, dt.type(0)) if aware else r
    gi, G, K = b.gi, b.G, r.shape[1]
    eps = dt.type(b.eps if v.group_eps is None else v.group_eps)
    with np.errstate(all="ignore"):
        n = np.stack([np.bincount(gi, ok[:, k], G) for k in range(K)], axis=1).astype(dt)
        mean = np.stack([b.gsum(x[:, k], gi, G) for k in range(K)], axis=1) / n
        dev = np.where(ok, x - mean[gi], dt.type(0))
        var = np.stack([b.gsum(dev[:, k] * dev[:, k], gi, G) for k in range(K)], axis=1) / (n - dt.type(v.group_ddof))
        if v.scale == "batch_std":
            nb = ok.sum(axis=0).astype(dt)
            db = np.where(ok, x - x.sum(axis=0, dtype=dt) / nb, dt.type(0))
            var_row = np.broadcast_to((db * db).sum(axis=0, dtype=dt) / (nb - dt.type(v.group_ddof)), r.shape)
        elif v.scale == "loo_std":
            var_row = _loo_var(x, ok, gi, G, n, v.group_ddof, var[gi]).astype(dt)
        else:
            var_row = var[gi]
        sigma = np.sqrt(var_row)
        nrow = n[gi]
        num = dev * (nrow / (nrow - dt.type(1))) if v.baseline == "leave_one_out" else dev
        if v.scale == "none":
            denom = np.ones(r.shape, dt)
        elif v.group_placement == "std":
            denom = sigma + eps
        elif v.group_placement == "std_if_positive":  # a peer's code: eps only where the std is positive
            denom = np.where(sigma > 0, sigma + eps, dt.type(1))
        elif v.group_placement == "var":
            denom = np.sqrt(var_row + eps)
        else:  # skip_if_zero
            denom = np.where(sigma > 0, sigma, dt.type(1))
        z = num / denom
        few = nrow < 2
        if few.any():
            raw = (b.size[gi] == 1)[:, None] & few & (v.singleton == "raw")
            z = np.where(few, np.where(raw, x / (dt.type(1) + eps), dt.type(0)), z)
            if v.singleton == "error":  # the paper has no z of a group of one: no output to reproduce
                z = np.where((b.size[gi] == 1)[:, None], dt.type(np.nan), z)
        if aware:
            z = np.where(ok, np.nan_to_num(z, nan=0.0), dt.type(0))
        c = (z * w).sum(axis=1, dtype=dt)
    return _Parts(x, w, z, num, np.asarray(sigma), denom, nrow, c)


def _loo_var(x, ok, gi, G, n, ddof, group_var):
    """Per row and column: the variance of the group's other members about their own mean,
    two-pass over those members (a constant rest gives exactly 0), divided by n - 1 - ddof; where
    fewer than 2 + ddof others remain (a group of two), the group's variance."""
    var = np.array(group_var, dtype=np.float64, copy=True)
    for g in range(G):
        rows = np.flatnonzero(gi == g)
        for k in range(x.shape[1]):
            m = rows[ok[rows, k]]
            if m.size - 1 - ddof < 1:
                continue
            xs = x[m, k]
            others = ~np.eye(m.size, dtype=bool)
            mean = (xs[None, :] * others).sum(axis=1) / (m.size - 1)
            dev = np.where(others, xs[None, :] - mean[:, None], 0.0)
            var[m, k] = (dev * dev).sum(axis=1) / (m.size - 1 - ddof)
    return var


def _scored(b: _Batch, v: Variant) -> np.ndarray:
    if v.nan == "nan_aware_unscored":
        return ~np.all(np.isnan(b.r), axis=1)
    return np.ones(b.n, bool)


def _unit_stats(b: _Batch, v: Variant, c: np.ndarray):
    """Per sample: unit index, weight t, and the unit's T, mean and sum of t dev^2."""
    dt = b.dt
    ui, S = {"unit": (b.ui, b.S), "group": (b.gi, b.G)}.get(v.whiten_scope, (np.zeros(b.n, np.int64), 1))
    t = b.t if (v.whiten == "per_token" and b.t is not None) else np.ones(b.n, dt)
    tt = t * _scored(b, v).astype(dt)
    with np.errstate(all="ignore"):
        cc = np.where(tt > 0, c, dt.type(0))
        T = b.gsum(tt, ui, S)
        mean = b.gsum(tt * cc, ui, S) / T
        dev = c - mean[ui]
        d = np.where(tt > 0, dev, dt.type(0))
        ss = b.gsum(tt * d * d, ui, S)
    return ui, S, t, tt, T, mean, dev, ss


def _whitened(b: _Batch, v: Variant, c: np.ndarray, stats=None) -> np.ndarray:
    """Eq. 6 of ``v`` and its clip, in the batch's dtype."""
    dt = b.dt
    if v.whiten == "none":
        a = c.copy()
    else:
        ui, S, t, tt, T, mean, dev, ss = stats if stats is not None else _unit_stats(b, v, c)
        eps = dt.type(b.eps if v.whiten_eps is None else v.whiten_eps)
        with np.errstate(all="ignore"):
            if v.whiten == "center":
                a = dev
            else:
                var = (ss / (T - dt.type(v.whiten_ddof)))[ui]
                std = np.sqrt(var)
                if v.whiten_placement == "std":
                    a = dev / (std + eps)
                elif v.whiten_placement == "var":
                    a = dev / np.sqrt(var + eps)
                else:
                    a = np.where(std == 0, c, dev / np.where(std == 0, dt.type(1), std))
        if v.nan == "nan_aware_unscored":
            scored = _scored(b, v)
            enough = np.bincount(ui, scored, S)[ui] >= 2
            a = np.where(scored & enough, a, dt.type(0))
    if v.clip is not None:
        a = np.clip(a, -v.clip, v.clip)
    return a


def evaluate(case, variant: Variant, token_counts=None, dtype="float64") -> np.ndarray:
    """``variant``'s advantages of ``case`` (a ``conformance.cases.Case``), as the formula reads
    (mean, deviations, std; Eq. 7; Eq. 6; the clip), computed in ``dtype``: float64 for the
    exact-enough value a diagnosis compares with, float32 for what a float32 code of it returns."""
    b = case if isinstance(case, _Batch) else _Batch(case, token_counts, dtype)
    return _whitened(b, variant, _eq4(b, variant).c)


def evaluate_arrays(rewards, labels, variant: Variant, units=None, weights=None, eps=DEFAULT_EPS,
                    token_counts=None, dtype="float64") -> np.ndarray:
    """:func:`evaluate` of arrays: rewards (N, K) or (N,), a group label and a unit label (or
    None: one unit) per row (the peers' formulas, gdpo_tools/peer_formulas.py)."""
    b = _Batch.of(rewards, labels, units, weights, eps, token_counts, dtype)
    return _whitened(b, variant, _eq4(b, variant).c)


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
    def ambiguous(self) -> bool:
        return bool(self.alternatives)

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
    def __init__(self, b: _Batch, o: np.ndarray, u: float):
        self.b, self.o, self.u = b, o, u
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


def _search(b: _Batch, o: np.ndarray, u: float) -> _Search:
    """Every exercised variant's float64 advantages, each with its relative distance from
    the output. Eq. 4 and 7 are enumerated; for each, Eq. 6 per sample or per token is
    ``dev / D`` per unit, so the least-squares scale 1/D of the output is fitted first and
    only the (ddof, placement, eps) whose D comes near it are evaluated; a clip is read off
    the output where the fitted values exceed its largest magnitude."""
    s = _Search(b, o, u)
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


def _clip_unseen(top: float) -> str:
    return f"a clip at {top:.6g} or beyond (no advantage beyond it)"


def _verdict(rows: list, out_dtype: str, cases: int = 1, not_exercised=(), top: float = math.inf) -> Diagnosis:
    matches = sorted((r for r in rows if r.ratio <= 1.0), key=_preference)
    if matches:
        first = matches[0]
        if first.variant.clip is None and math.isfinite(top):
            not_exercised = tuple(not_exercised) + (_clip_unseen(top),)
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


def _one(case, output, token_counts, unit_roundoff):
    b = _Batch(case, token_counts)
    o = _as_output(output, b.n)
    u = unit_roundoff_of(b.out_dtype) if unit_roundoff is None else float(unit_roundoff)
    s = _search(b, o, u)
    s.add(PAPER, evaluate(b, PAPER))
    return b, o, u, _checked(b, o, u, s, token_counts)


def diagnose(case, output, token_counts=None, unit_roundoff: float | None = None) -> Diagnosis:
    """Which variant of the catalogue ``output`` (the implementation's advantages of
    ``case``, a ``conformance.cases.Case``; an array or tensor of N values) follows.

    ``token_counts``: the samples' token counts where the call passed them (Eq. 6 may be
    token-weighted); ``unit_roundoff``: the implementation's working precision (default:
    float32's for a float32, float16 or bfloat16 output, float64's for float64)."""
    b, o, _, rows = _one(case, output, token_counts, unit_roundoff)
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
        b = _Batch(case, tokens)
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
        s = _search(b, o, u)
        s.add(PAPER, evaluate(b, PAPER))
        found = _checked(b, o, u, s, tokens)
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
    b = _Batch(case, token_counts)
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


# ------------------------------------------------------------------ the catalogue, for the docs

_MARK = "<!-- the formula catalogue: generated by `python -m conformance.formulas --write`; do not edit -->"
_END = "<!-- end of the formula catalogue -->"


def catalogue_markdown() -> str:
    """The catalogue as the Markdown table docs/grading.md shows (between its markers)."""
    rows = [_MARK, "", "| equation | difference from the paper | who computes it | a case shows it with |",
            "|---|---|---|---|"]
    for c in CATALOGUE:
        rows.append(f"| {c.equation} | {c.words} | {c.who} | {c.needs or 'any ordinary case'} |")
    rows += ["", f"Combined, {catalogue_size():,} structural variants; eps values searched: the call's, "
             f"{', '.join(f'{e:g}' for e in EPS_VALUES)}, and at Eq. 6 fitted from the output.", "", _END]
    return "\n".join(rows)


def _write_docs(path) -> bool:
    """Put the generated catalogue between the markers of ``path``; True if it changed."""
    from pathlib import Path

    page = Path(path)
    text = page.read_text()
    if _MARK not in text or _END not in text:
        raise SystemExit(f"{path}: no catalogue markers ({_MARK!r} ... {_END!r})")
    head, rest = text.split(_MARK, 1)
    _, tail = rest.split(_END, 1)
    new = head + catalogue_markdown() + tail
    if new != text:
        page.write_text(new)
    return new != text


if __name__ == "__main__":  # pragma: no cover - a maintenance command
    import sys
    from pathlib import Path

    doc = Path(__file__).resolve().parent.parent / "docs" / "grading.md"
    if "--write" in sys.argv[1:]:
        print(f"{doc}: {'rewritten' if _write_docs(doc) else 'up to date'}")
    else:
        print(catalogue_markdown())
