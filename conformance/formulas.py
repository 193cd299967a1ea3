"""The formula catalogue: every variant of GDPO the grader names, and its evaluator.

:data:`CATALOGUE` holds one :class:`Choice` per way to differ from the paper: every choice the
presets of ``spec/conventions.py`` encode and the published GRPO-family variants (RLOO, Dr. GRPO,
a batch-level std, weights before normalisation, clipping); a :class:`Variant` is one value per
choice, and :func:`differences` says how it differs, equation by equation. :func:`evaluate`
computes a variant as it reads: in float64 for a diagnosis (:mod:`conformance.diagnosis`), in
float32 as a float32 code of it does (``gdpo_tools/peer_formulas.py``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spec.constants import DEFAULT_EPS
from spec.conventions import CONVENTIONS, Convention

#: eps values searched at Eq. 4 and Eq. 6 besides the call's own (None in a Variant):
#: none, and the values the peers use (spec/conventions.py) and their neighbours
EPS_VALUES: tuple = (0.0, 1e-8, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2)


# ------------------------------------------------------------------ the catalogue


@dataclasses.dataclass(frozen=True)
class Variant:
    """One formula: a value per choice. The defaults are the paper's (``spec``); an eps
    of None is the eps the call passes (1e-4 where it passes none)."""

    baseline: str = "mean"          # Eq. 4: "mean", "leave_one_out"
    scale: str = "group_std"        # Eq. 4: "group_std", "loo_std", "batch_std", "none"
    group_ddof: int = 1
    group_variance: str = "two_pass"  # or "one_pass": (sum x^2 / n - mean^2) n / (n - ddof), as NeMo-RL's code
    group_placement: str = "std"    # "std" (std + eps), "var" (sqrt(var + eps)), "skip_if_zero"
    group_eps: float | None = None
    singleton: str = "error"        # a group of one: "error", "zero", "raw"
    nan: str = "error"              # "error", "zero_first", "nan_aware", "nan_aware_unscored", "propagate"
    weights: str = "after"          # Eq. 7: "after" (GDPO), "before" (GRPO on the weighted sum),
    #                                 "normalized" (w / sum w, then GDPO's Eq. 7)
    whiten: str = "per_sample"      # Eq. 6: "per_sample", "per_token", "center", "none"
    #: "unit" (per training batch), "batch" (the whole call), "group" (per prompt group), "unit_mean" (the mean
    #: per unit, the std of the whole call)
    whiten_scope: str = "unit"
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
        if v.whiten == "center" and v.whiten_scope == "unit_mean":  # no std: centred per unit
            ch.update(whiten_scope="unit")
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
    Choice("Eq. 6", "whiten_scope", "unit_mean", "the mean per unit, the std of the whole batch", "-",
           "several whitening units"),
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
        return f"no eps; a {what} of std 0 " + ("left undivided" if what == "column" else "passed through unchanged")
    if placement != "std":
        shown = "the call's eps" if eps is None else f"{eps:g}"
        return f"eps added to the variance: sqrt(var + {shown})"
    if eps is None or (paper_eps is not None and eps == paper_eps):
        return None
    return "no eps" if eps == 0.0 else f"eps {eps:g}"


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
    variant is evaluated in."""

    @classmethod
    def of_case(cls, case, token_counts=None, dtype="float64") -> "_Batch":
        if not hasattr(case, "rewards_array") or not hasattr(case, "labels"):
            raise TypeError(f"a conformance.cases.Case (one process's call) is diagnosed, not {type(case).__name__}")
        if not case.rewards:
            raise ValueError("an empty case has no output to diagnose")
        return cls(case.rewards_array(), case.labels(), case.unit_ids(), case.weights,
                   DEFAULT_EPS if case.eps is None else float(case.eps), case.out_dtype, token_counts, dtype)

    def __init__(self, r, labels, units, weights, eps, out_dtype, token_counts, dtype):
        """``r`` (N, K) float64, a group label per row, a unit label per row (None: one unit)."""
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
        self.eps, self.out_dtype = eps, out_dtype
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
        narrower dtype by NumPy's pairwise sum of each index's rows, as a code sums ``x[group]``."""
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
        if v.group_variance == "one_pass":
            sq = np.stack([b.gsum(x[:, k] * x[:, k], gi, G) for k in range(K)], axis=1) / n
            var = (sq - mean * mean) * (n / (n - dt.type(v.group_ddof)))
        else:
            var = (np.stack([b.gsum(dev[:, k] * dev[:, k], gi, G) for k in range(K)], axis=1)
                   / (n - dt.type(v.group_ddof)))
        if v.scale == "batch_std":
            nb = ok.sum(axis=0).astype(dt)
            db = np.where(ok, x - x.sum(axis=0, dtype=dt) / nb, dt.type(0))
            var_row = np.broadcast_to((db * db).sum(axis=0, dtype=dt) / (nb - dt.type(v.group_ddof)), r.shape)
        elif v.scale == "loo_std":
            var_row = _loo_var(x, ok, gi, G, v.group_ddof, var[gi]).astype(dt)
        else:
            var_row = var[gi]
        sigma = np.sqrt(var_row)
        if v.group_variance == "one_pass":  # a NaN std (a negative variance) read as 0, inf as the largest finite
            sigma = np.nan_to_num(sigma, nan=0.0)
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


def _loo_var(x, ok, gi, G, ddof, group_var):
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
    ui, S = {"unit": (b.ui, b.S), "group": (b.gi, b.G), "unit_mean": (b.ui, b.S)}.get(
        v.whiten_scope, (np.zeros(b.n, np.int64), 1))
    t = b.t if (v.whiten == "per_token" and b.t is not None) else np.ones(b.n, dt)
    tt = t * _scored(b, v).astype(dt)
    with np.errstate(all="ignore"):
        cc = np.where(tt > 0, c, dt.type(0))
        T = b.gsum(tt, ui, S)
        mean = b.gsum(tt * cc, ui, S) / T
        dev = c - mean[ui]
        d = np.where(tt > 0, dev, dt.type(0))
        ss = b.gsum(tt * d * d, ui, S)
    if v.whiten_scope == "unit_mean":  # every unit's std that of the whole batch
        *_, whole_T, _, _, whole_ss = _unit_stats(b, dataclasses.replace(v, whiten_scope="batch"), c)
        T, ss = np.full(S, whole_T[0], dtype=dt), np.full(S, whole_ss[0], dtype=dt)
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
    """``variant``'s advantages of ``case`` (a ``conformance.cases.Case``) as the formula reads
    (mean, deviations, std; Eq. 7; Eq. 6; the clip), computed in ``dtype``."""
    b = case if isinstance(case, _Batch) else _Batch.of_case(case, token_counts, dtype)
    return _whitened(b, variant, _eq4(b, variant).c)


def evaluate_arrays(rewards, labels, variant: Variant, units=None, weights=None, eps=DEFAULT_EPS,
                    token_counts=None, dtype="float64") -> np.ndarray:
    """:func:`evaluate` of arrays: rewards (N, K) or (N,), a group and a unit label (None: one
    unit) per row."""
    r = np.asarray(rewards, dtype=np.float64)
    return evaluate(_Batch(r[:, None] if r.ndim == 1 else r, np.asarray(labels), units, weights, float(eps), dtype,
                           token_counts, dtype), variant)


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


if __name__ == "__main__":  # pragma: no cover - a maintenance command: the table between the markers of grading.md
    import sys
    from pathlib import Path

    page = Path(__file__).resolve().parent.parent / "docs" / "grading.md"
    if "--write" not in sys.argv[1:]:
        print(catalogue_markdown())
        sys.exit(0)
    text = page.read_text()
    if _MARK not in text or _END not in text:
        raise SystemExit(f"{page}: no catalogue markers ({_MARK!r} ... {_END!r})")
    head, rest = text.split(_MARK, 1)
    new = head + catalogue_markdown() + rest.split(_END, 1)[1]
    if new != text:
        page.write_text(new)
    print(f"{page}: {'rewritten' if new != text else 'up to date'}")
