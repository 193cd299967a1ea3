"""The audit: what GDPO does with a batch, per group and per whitening unit. Up to
:data:`EXACT_SAMPLES` samples the exact oracle runs everywhere; beyond, impl.gdpo's float64 values
settle each group and the oracle runs where a finding needs it and on a sample of groups and units
(how it checks: docs/audit.md). Peer conventions beyond: their float formulas, against impl.gdpo.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

import numpy as np
import torch

from gdpo_tools import AUDIT_SCHEMA as SCHEMA
from gdpo_tools.audit.findings import EPS_DOMINATED_FACTOR, ERROR, ILL_CONDITIONED, ROUTINE, finding, peer_difference
from gdpo_tools.audit.read import AuditInputError, Batch, _weights, clip, shown
from gdpo_tools.limits.peers import IMPLEMENTATIONS as MIRRORS
from gdpo_tools.progress import Progress
from impl import gdpo as impl
from oracle import gdpo as oracle
from oracle.inputs import index, py
from spec import CONVENTIONS, DEFAULT_EPS, FLOAT32_MAX, GDPOError
from spec.errors import GroupError, NonFiniteError, OutOfRangeError

OK, WARN, NOT_AUDITED, DISAGREE = 0, 1, 2, 3
STATUS = {OK: "ok", WARN: "warnings", NOT_AUDITED: "could not audit", DISAGREE: "IMPLEMENTATION DISAGREES"}
#: Up to this many samples the exact oracle runs on every group, unit and convention.
EXACT_SAMPLES = 20_000
#: impl.gdpo runs on chunks of whole units of about this many samples (its working memory).
CHUNK_SAMPLES = 500_000
#: The report holds a row for every group up to this many groups; beyond, only the groups
#: with warnings (the others are counted), so that its memory does not grow with the batch.
LIST_EVERY_GROUP = 10_000
#: Beyond it, the oracle also checks this many groups, and the Eq. 6 step of this many units
#: of at most EXACT_UNIT samples, spread evenly through the batch.
SAMPLED_GROUPS, SAMPLED_UNITS, EXACT_UNIT = 200, 4, 20_000
#: A group is sent to the oracle to decide its conditioning when the estimate (an upper bound
#: up to a small factor) is within this factor of the threshold.
COND_MARGIN = 1e-3
#: A group whose combined values are all below this is sent to the oracle to decide exact
#: cancellation (impl.gdpo gives structural zeros exactly; a near-zero is either a bug or
#: near-cancellation, and the oracle says which).
VANISHING = 1e-8
#: Two columns that cancel on some rows of a group (r2 = C - r1 there) are reported where,
#: between those rows, their weighted z keep at most this fraction of the signal they carry apart.
PARTIAL_KEEPS = 0.5


def _scored_rewards(batch: Batch, missing: str) -> np.ndarray:
    """The rewards as float64 with NaN where a reward was not scored: a NaN, or a masked entry
    of a NumPy masked array, is one under ``missing="unscored"`` and refused otherwise, as an
    infinite reward always is (spec section 2); named as the file names it."""
    if missing not in ("refuse", "unscored"):
        raise AuditInputError(f"missing must be 'refuse' or 'unscored', not {shown(missing)}")
    for key in ("group_ids", "unit_ids", "weights"):
        if np.ma.is_masked(getattr(batch, key)):
            raise AuditInputError(f"{batch.source}: {key!r} has masked entries; every label and weight must be given")
    r = batch.rewards
    if np.ma.isMaskedArray(r):
        mask = np.ma.getmaskarray(r)
        if missing == "refuse" and mask.any():
            i, k = (int(v) for v in np.argwhere(mask)[0])
            raise AuditInputError(f"{batch.source}: 'rewards' is a masked array with {int(mask.sum()):,} masked "
                                  f"entries ({batch.places([i])}, column {batch.names[k]!r} the first); --missing "
                                  "unscored reads them as rewards not scored")
        r = np.where(mask, np.nan, np.ma.getdata(r))
    r = np.asarray(r, dtype=np.float64)
    bad = np.argwhere(~np.isfinite(r) if missing == "refuse" else np.isinf(r))
    if bad.size:
        i, k = (int(v) for v in bad[0])
        v = float(r[i, k])
        label = batch.group_label(batch.group_ids[i])
        more = f" (and {len(bad) - 1:,} more)" if len(bad) > 1 else ""
        hint = "; --missing unscored reads a NaN as a reward not scored" if missing == "refuse" else ""
        raise NonFiniteError(f"{batch.source}: {batch.places([i])}, column {batch.names[k]!r} (group {shown(label)}) "
                             f"is {'NaN' if v != v else repr(v)}{more}: the specification refuses non-finite "
                             f"rewards{hint}")
    return r


def _refuse_singletons(batch: Batch, groups: "_Groups") -> None:
    """A group of one has no unbiased std (spec section 2): named by its label and first row."""
    labels, first = groups.labels, groups.first
    lonely = np.flatnonzero(groups.counts == 1)
    if lonely.size:
        j = lonely[np.argmin(first[lonely])]
        others = lonely.size - 1
        more = "" if not others else f", as {'does 1 other group' if others == 1 else f'do {others} other groups'}"
        raise GroupError(f"{batch.source}: group {shown(batch.group_label(labels[j]))} ({batch.places([first[j]])}) "
                         f"has 1 sample{more}; Eq. 4's unbiased std needs at least 2 (drop such groups, or merge them)")


class _Groups:
    """The batch sorted by group: each group's rows, and per group and column the statistics
    the findings read (min, max, std), computed once for the whole batch, over the scored
    rewards (a NaN is one not scored: spec section 2)."""

    def __init__(self, r: np.ndarray, group_ids: np.ndarray):
        # groups in order of first appearance, as the oracle and impl.gdpo.group_has_signal order them
        self.labels, self.index = index(group_ids)
        self.counts = np.bincount(self.index, minlength=self.labels.size)
        self.order = np.argsort(self.index, kind="stable")
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
        self.first = self.order[self.starts]  # each group's first row
        self._by_label = np.argsort(self.labels)
        rs = r[self.order]  # a copy: the deviations are computed in it, in place
        nan = np.isnan(rs)
        self.scored = np.add.reduceat(~nan, self.starts, axis=0, dtype=np.int64)
        n = self.scored.astype(np.float64)
        self.min = np.fmin.reduceat(rs, self.starts, axis=0)
        self.max = np.fmax.reduceat(rs, self.starts, axis=0)
        self.absmax = np.nan_to_num(np.fmax(np.abs(self.min), np.abs(self.max)))
        rs[nan] = 0.0
        with np.errstate(invalid="ignore", divide="ignore"):
            rs -= np.repeat(np.add.reduceat(rs, self.starts, axis=0) / n, self.counts, axis=0)
            rs[nan] = 0.0
            self.std = np.sqrt(np.add.reduceat(rs * rs, self.starts, axis=0) / (n - 1))
        self.collapsed = (self.min == self.max) | (self.scored < 2)  # fewer than 2 scored: z = 0 throughout

    def position(self, labels) -> np.ndarray:
        """The index of each of these group labels among the groups."""
        return self._by_label[np.searchsorted(self.labels, labels, sorter=self._by_label)]

    def rows(self, g: int) -> np.ndarray:
        return self.order[self.starts[g]:self.starts[g] + self.counts[g]]

    def reduce_max(self, values: np.ndarray) -> np.ndarray:
        """Per group, the largest of a per-sample array."""
        return np.maximum.reduceat(values[self.order], self.starts)


def _cond_estimate(groups: _Groups, w: np.ndarray, eps: float) -> np.ndarray:
    """Per group, a cheap first-order estimate of how far one ulp of every input moves a
    combined value: a shift of the mean, the sample and the std by an ulp of the largest
    value each, through 1 / (std + eps); it bounds the oracle's cond up to a small factor,
    which COND_MARGIN covers (the oracle decides every group near the threshold)."""
    n = groups.counts[:, None].astype(np.float64)
    spacing = np.spacing(groups.absmax)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # eps 0, a constant column: inf
        per_col = np.abs(w)[None, :] * spacing * (2.0 + 2.0 * n) / (np.nan_to_num(groups.std) + eps)
    return per_col.sum(axis=1)


def _chunks(groups: _Groups, uinverse, usizes, limit: int) -> list[np.ndarray] | None:
    """Unit indices in runs of about ``limit`` samples, each run whole units holding whole
    groups; None where a group spans units (then the batch is one chunk)."""
    gu = uinverse[groups.order]
    if np.any(np.minimum.reduceat(gu, groups.starts) != np.maximum.reduceat(gu, groups.starts)):
        return None
    runs, start, total = [], 0, 0
    for u, size in enumerate(usizes):
        total += int(size)
        if total >= limit or u == len(usizes) - 1:
            runs.append(np.arange(start, u + 1))
            start, total = u + 1, 0
    return runs


def _impl_values(batch: Batch, groups: _Groups, uorder, uinverse, usizes, w, eps, bar, missing="refuse"):
    """impl.gdpo's combined values c and advantages a (float64, file order) and each group's signal,
    in chunks of whole units of about CHUNK_SAMPLES samples (impl's memory does not grow with the
    batch). A refusal is run again on the whole batch, so that impl names the file's own rows."""
    r, g = batch.rewards, batch.group_ids
    N = r.shape[0]
    c, a = np.empty(N), np.empty(N)
    signal = np.empty(groups.labels.size, bool)
    runs = _chunks(groups, uinverse, usizes, CHUNK_SAMPLES) or [np.arange(len(usizes))]
    ustarts = np.concatenate([[0], np.cumsum(usizes)])
    kw = dict(weights=w.tolist(), eps=eps, missing=missing)
    rows = np.arange(N)
    try:
        for j, run_units in enumerate(runs):
            rows = uorder[ustarts[run_units[0]]:ustarts[run_units[-1] + 1]]  # whole units, by unit
            tr, tg = torch.from_numpy(r[rows]), torch.from_numpy(g[rows])
            c[rows] = impl.normalize_rewards(tr, group_ids=tg, **kw).numpy()
            a[rows] = impl.gdpo_advantages(tr, group_ids=tg, segment_sizes=usizes[run_units].tolist(),
                                           out_dtype=torch.float64, **kw).numpy()
            met = index(g[rows])[0]  # group_has_signal orders the groups by first appearance, as index
            signal[groups.position(met)] = impl.group_has_signal(tr, group_ids=tg, **kw).numpy()
            bar.update((j + 1) / len(runs))
    except GDPOError as e:
        try:  # impl's own refusals (Eq. 7 overflow) in the file's row order
            impl.normalize_rewards(torch.from_numpy(r), group_ids=torch.from_numpy(g), **kw)
        except GDPOError as whole:
            e, rows = whole, np.arange(N)
        said = re.sub(r"\brow (\d+)", lambda m: batch.places([rows[int(m[1])]]) if int(m[1]) < rows.size else m[0],
                      str(e))
        raise type(e)(f"{batch.source}: impl.gdpo refuses the batch: {said}") from e
    return c, a, signal


def audit(batch: Batch, weights=None, eps: float = DEFAULT_EPS, exact: bool | None = None,
          peers: bool | None = None, bar: Progress | None = None, missing: str = "refuse") -> dict:
    """The report of ``batch`` (its schema: docs/audit.md). ``exact``: run the
    oracle on every group (default: up to EXACT_SAMPLES samples); ``peers``: compute the peer
    conventions (default: when exact); ``missing``: "refuse" a NaN reward, or read it as
    "unscored" (impl.gdpo's keyword; a masked entry of a masked array alike)."""
    if isinstance(eps, (int, float)) and not (math.isfinite(eps) and eps >= 0):  # the option, not the file
        raise OutOfRangeError(f"--eps {eps!r}: eps must be finite and >= 0")
    batch = dataclasses.replace(batch, rewards=_scored_rewards(batch, missing))
    r = batch.rewards
    N, K = r.shape
    peers = N <= EXACT_SAMPLES if peers is None else peers  # --exact alone adds no peer passes
    exact = N <= EXACT_SAMPLES if exact is None else exact
    bar = bar or Progress(N > EXACT_SAMPLES)
    if weights is not None:
        w = _weights(weights, batch.names, "--weights")
    else:
        w = np.ones(K) if batch.weights is None else _weights(batch.weights, batch.names, f"{batch.source}: 'weights'")
    bar.start("group statistics")
    groups = _Groups(r, batch.group_ids)
    _refuse_singletons(batch, groups)
    G = groups.labels.size
    units = batch.unit_ids if batch.unit_ids is not None else np.zeros(N, dtype=np.int64)
    uorder = np.argsort(units, kind="stable")  # whitening units as consecutive segments for impl
    ulabels, uinverse, usizes = np.unique(units, return_inverse=True, return_counts=True)
    uinverse = uinverse.reshape(-1)
    ustarts = np.concatenate([[0], np.cumsum(usizes)[:-1]])  # each unit's first row in uorder
    bar.start("impl.gdpo")
    c, impl_a, signal = _impl_values(batch, groups, uorder, uinverse, usizes, w, eps, bar, missing)
    scored = ~np.isnan(r).all(axis=1)  # rows with a scored reward: the rows of Eq. 6
    uscored = np.add.reduceat(scored[uorder], ustarts, dtype=np.int64)
    bar.update(1.0)

    # ---- per group: the decisions that need the oracle, from it (every group, or those that need it)
    cancelled, cond_sharp, cond = np.zeros(G, bool), np.zeros(G, bool), _cond_estimate(groups, w, eps)
    cond_from = np.full(G, "estimate", dtype=object)
    over = np.full(G, np.nan)  # impl's error over the bound, where the oracle checked it
    unit_collapsed, unit_cond_sharp = np.zeros(ulabels.size, bool), np.zeros(ulabels.size, bool)
    unit_cond, unit_over = np.full(ulabels.size, np.nan), np.full(ulabels.size, np.nan)

    def settle(res, sub: _Groups, part: np.ndarray) -> None:
        """The oracle's decisions on the groups ``part`` (``sub``: the groups of its rows)."""
        cancelled[groups.position(res.group_labels)] = res.group_cancelled
        cond[part] = sub.reduce_max(res.combined.cond)
        cond_sharp[part] = np.minimum.reduceat(res.combined.cond_sharp[sub.order], sub.starts).astype(bool)
        cond_from[part] = "oracle"

    if exact:
        bar.start("exact oracle, whole batch")
        res = oracle.gdpo_advantages(r, batch.group_ids, weights=w, unit_ids=units, eps=eps, missing=missing)
        settle(res, groups, np.arange(G))
        ratio = _over_bound(impl_a, res)
        over = groups.reduce_max(ratio)
        unit_collapsed[np.searchsorted(ulabels, res.unit_labels)] = res.unit_collapsed
        unit_cond = np.maximum.reduceat(res.cond[uorder], ustarts)
        unit_cond_sharp = np.minimum.reduceat(res.cond_sharp[uorder], ustarts).astype(bool)
        unit_over = np.maximum.reduceat(ratio[uorder], ustarts)
        checked, checked_units = np.arange(G), np.arange(ulabels.size)
        bar.update(1.0)
    else:
        cmax = groups.reduce_max(np.abs(c))
        vanishing = (cmax < VANISHING) & ~groups.collapsed.all(axis=1)
        near = cond > COND_MARGIN * ILL_CONDITIONED * np.maximum(cmax, 1.0)
        checked = np.union1d(np.flatnonzero(vanishing | near), _spread(G, SAMPLED_GROUPS))
        bar.start(f"exact oracle, {checked.size} of {G} groups")
        for lo in range(0, checked.size, 64):  # in chunks, for the progress line
            part = checked[lo:lo + 64]
            rows = np.concatenate([groups.rows(g) for g in part])
            res = oracle.gdpo_advantages(r[rows], batch.group_ids[rows], weights=w, eps=eps, missing=missing)
            sub = _Groups(r[rows], batch.group_ids[rows])  # the same groups, in the same order (part ascends)
            settle(res, sub, part)
            over[part] = sub.reduce_max(_over_bound(c[rows], res.combined))
            bar.update(min(1.0, (lo + part.size) / checked.size))
        # units: collapsed where impl's combined values of the scored rows are all equal, or
        # fewer than two (exact there: structural zeros are exact in impl.gdpo); Eq. 6 checked
        # exactly on a few units of moderate size, over their scored rows
        cu = np.where(scored, c, np.nan)[uorder]
        unit_collapsed = (np.fmin.reduceat(cu, ustarts) == np.fmax.reduceat(cu, ustarts)) | (uscored < 2)
        small = np.flatnonzero((usizes <= EXACT_UNIT) & (uscored >= 2))
        checked_units = small[_spread(small.size, SAMPLED_UNITS)]
        if checked_units.size:
            bar.start(f"exact oracle, Eq. 6 of {checked_units.size} units")
        for j, u in enumerate(checked_units):
            rows = uorder[ustarts[u]:ustarts[u] + usizes[u]]
            rows = rows[scored[rows]]
            st = oracle.whiten(c[rows], eps=eps)
            mine = impl.whiten(torch.from_numpy(c[rows]), segment_sizes=[int(rows.size)], eps=eps,
                               out_dtype=torch.float64).numpy()
            unit_over[u] = float(np.max(_over_bound(mine, st)))
            unit_cond[u] = float(st.cond.max())
            unit_cond_sharp[u] = bool(st.cond_sharp.all())
            bar.update((j + 1) / checked_units.size)

    # ---- findings
    bar.start("findings")
    group_rows, counts = [], collections.Counter()
    keep_all = G <= LIST_EVERY_GROUP
    warned = routine_only = 0
    partial = _partial_cancellations(r, groups, w, eps)
    for gi in range(G):
        found = _group_findings(batch, groups, gi, w, eps, signal[gi], cancelled[gi], cond[gi], cond_sharp[gi],
                                cond_from[gi], over[gi], c, partial.get(gi, ()))
        counts.update(f["code"] for f in found)
        warns = any(f["severity"] != ROUTINE for f in found)
        warned += warns
        routine_only += bool(found) and not warns
        if not (keep_all or warns):  # beyond LIST_EVERY_GROUP, routine groups are counted, not listed
            continue
        group_rows.append({"group": batch.group_label(groups.labels[gi]), "size": int(groups.counts[gi]),
                           "signal": bool(signal[gi]), "findings": found, "max_cond_combined": float(cond[gi]),
                           "max_cond_combined_sharp": bool(cond_sharp[gi]), "cond_from": str(cond_from[gi]),
                           "impl_error_over_bound": _number(over[gi])})
    unit_rows = []
    for ui, label in enumerate(ulabels):
        found = []
        if unit_collapsed[ui]:
            why = ("has fewer than 2 rows with a scored reward" if uscored[ui] < 2 else
                   "has every combined value exactly equal")
            found.append(finding("unit-collapsed", f"unit {shown(py(label))} {why}, so each of its advantages is "
                                 "exactly 0 (Eq. 6 exact collapse)"))
        if not np.isnan(unit_over[ui]) and unit_over[ui] > 1.0:
            found.append(finding("impl-disagrees", f"impl.gdpo's Eq. 6 is {unit_over[ui]:.3g} times the error bound "
                                 "from the exact whitening of its own combined values", over_bound=float(unit_over[ui])))
        counts.update(f["code"] for f in found)
        unit_rows.append({"unit": py(label), "size": int(usizes[ui]), "collapsed": bool(unit_collapsed[ui]),
                          "findings": found, "max_cond": _number(unit_cond[ui]),
                          "max_cond_sharp": bool(unit_cond_sharp[ui]), "impl_error_over_bound": _number(unit_over[ui])})

    # ---- peers
    peer_rows = {}
    if peers:
        bar.start("peer conventions")
        spec_conv = CONVENTIONS["spec"]
        others = [n for n in CONVENTIONS if n != "spec"]
        for j, name in enumerate(others):
            conv = CONVENTIONS[name]
            token = np.ones(N, dtype=np.int64) if conv.whiten == "per_token" else None
            notes = (["one token per sample"] * (token is not None)
                     + [f"NaN rewards: its rule {conv.nan!r}"] * bool(np.isnan(r).any()))
            row = {"why": peer_difference(conv, spec_conv), "note": "; ".join(notes)}
            try:
                if exact:
                    pa = oracle.gdpo_advantages(r, batch.group_ids, weights=w, unit_ids=units, convention=name,
                                                token_counts=token).float64
                    ref, row["method"] = res.float64, "exact, against the exact spec result"
                else:
                    with np.errstate(all="ignore"):
                        pa = np.asarray(MIRRORS[name].run(r, batch.group_ids, units, w, token), dtype=np.float64)
                    ref, row["method"] = impl_a, f"its float formula in {conv.native_dtype}, against impl.gdpo"
                diff = np.abs(pa - ref)
                row["max_abs_difference"] = None if np.all(np.isnan(diff)) else float(np.nanmax(diff))
            except GDPOError as e:
                row.update(max_abs_difference=None, method="refused", note=f"refused: {clip(str(e))}")
            peer_rows[name] = row
            bar.update((j + 1) / len(others))

    severities = {f["severity"] for g in group_rows + unit_rows for f in g["findings"]}
    status = DISAGREE if ERROR in severities else WARN if severities - {ROUTINE} else OK
    checked_over = over[~np.isnan(over)]
    bar.done()
    return {
        "schema": SCHEMA,
        "source": batch.source, "samples": N, "groups_total": G, "units_total": int(ulabels.size),
        "components": batch.names, "weights": w.tolist(), "eps": eps, "missing": missing,
        "unscored_rewards": int(np.isnan(r).sum()), "rows_without_score": int(np.sum(~scored)),
        "method": {"exact": bool(exact), "groups_checked_by_oracle": int(np.size(checked)),
                   "units_checked_by_oracle": int(np.size(checked_units)),
                   "peers": ("exact" if exact else "float formulas") if peers else "not computed",
                   "text": _method_text(exact, int(np.size(checked)), G, int(np.size(checked_units)), ulabels.size)},
        "counts": dict(sorted(counts.items())),
        "groups_without_signal": int(np.sum(~signal)),
        "groups_with_warnings": int(warned), "groups_with_routine_findings_only": int(routine_only),
        "groups_listed": "all" if keep_all else "with warnings", "groups": group_rows,
        "units": unit_rows, "peers": peer_rows,
        "impl_vs_oracle": {"max_error_over_bound": float(checked_over.max()) if checked_over.size else None,
                           "groups_checked": int(checked_over.size)},
        "status": status, "status_text": STATUS[status],
    }



def _method_text(exact: bool, groups: int, G: int, units: int, S: int) -> str:
    if exact:
        return (f"the exact oracle on every group and unit (batches of up to {EXACT_SAMPLES:,} samples, or "
                "--exact)")
    return (f"impl.gdpo's float64 values for every group; the exact oracle on {groups:,} of {G:,} groups (every "
            f"group whose combined values vanish or whose conditioning is near the threshold, and "
            f"{min(G, SAMPLED_GROUPS)} spread through the batch) and on the Eq. 6 step of {units} of {S} units "
            "(--exact: every group, much slower)")


def _spread(n: int, most: int) -> np.ndarray:
    """Up to ``most`` of the indices 0..n-1, spread evenly."""
    return np.unique(np.linspace(0, n - 1, min(n, most)).round().astype(np.int64))


def _over_bound(got, res) -> np.ndarray:
    """Per sample, impl's error in units of the error bound of the oracle's ``res`` (inf: a
    demanded exact zero missed)."""
    exact, allowed, required_zero = res.float64, res.allowed("float64"), res.required_zero
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(allowed > 0, np.abs(got - exact) / np.where(allowed > 0, allowed, 1.0),
                         np.where(got == exact, 0.0, np.inf))
    if required_zero is not None:
        ratio = np.where(required_zero & (got != 0), np.inf, ratio)
    return ratio


def _group_findings(batch, groups, gi, w, eps, signal, cancelled, cond, sharp, cond_from, over, c,
                    partial) -> list[dict]:
    names, K = batch.names, len(batch.names)
    n = int(groups.counts[gi])
    rows = groups.rows(gi)
    found = []
    unscored = np.isnan(batch.rewards[rows])
    if unscored.any():
        said = [f"{names[k]} ({batch.places(rows[unscored[:, k]])})" for k in range(K) if unscored[:, k].any()]
        found.append(finding("unscored", f"{int(unscored.sum())} reward(s) not scored: {'; '.join(said)}; each has "
                             "z = 0 and is left out of its column's mean and std", count=int(unscored.sum())))
    collapsed = [names[k] for k in range(K) if groups.collapsed[gi, k]]
    if collapsed:
        found.append(finding("collapsed-column", f"{_list(collapsed)} constant within the group"
                             f"{' (over its scored rows)' if unscored.any() else ''}: Eq. 4 gives "
                             f"{'it' if len(collapsed) == 1 else 'them'} z = 0 exactly", columns=collapsed))
    if not signal:
        found.append(finding("no-signal", "every sample of the group gets the same advantage (every column "
                             "collapsed or cancelling): it teaches nothing"))
    if cancelled and len(collapsed) < K:
        varying = [names[k] for k in range(K) if not groups.collapsed[gi, k]]
        found.append(finding("exact-cancellation", f"{_list(varying)} vary but cancel exactly: every combined value "
                             "(Eq. 7) of the group is exactly 0", columns=varying))
    for k, l, members, keeps in () if cancelled else partial:
        mirror = f"C - {names[k]}" if w[k] * w[l] > 0 else f"{names[k]} - C"
        C = batch.rewards[members[0], k] + np.sign(w[k] * w[l]) * batch.rewards[members[0], l]
        kept = f"{100 * keeps:.2g}%" if keeps >= 1e-4 else "less than 0.01%"
        found.append(finding("partial-cancellation", f"columns {names[k]} and {names[l]} cancel on {members.size} of "
                             f"{n} rows, {batch.places(members)}, where {names[l]} = {mirror} (C = {C:.6g}): "
                             f"between them their weighted z keep {kept} of the signal they carry apart",
                             columns=[names[k], names[l]], rows=batch.numbers(members), keeps=float(keeps)))
    scale = max(float(np.abs(c[rows]).max()), 1.0)
    if cond > ILL_CONDITIONED * scale and cond_from == "oracle":
        how = "at first order" if sharp else "at most (a bound)"
        found.append(finding("ill-conditioned", f"one ulp of change in the rewards moves a combined value by "
                             f"{cond:.2g} {how}, {cond / 1e-16:.1g} times a healthy group's 1e-16",
                             cond=float(cond), sharp=bool(sharp)))
    std = groups.std[gi]
    dom = [k for k in range(K) if 0 < std[k] < EPS_DOMINATED_FACTOR * eps]
    if dom:
        parts = [f"{names[k]} (std {std[k]:.2g}: z shrinks by {100 * eps / (std[k] + eps):.0f}%)" for k in dom]
        found.append(finding("eps-dominated", f"std within the group below {EPS_DOMINATED_FACTOR:g} x eps ({eps:g}): "
                             f"{', '.join(parts)}", columns=[names[k] for k in dom],
                             std=[float(std[k]) for k in dom]))
    if n == 2:
        found.append(finding("two-samples", "n_g = 2: any two distinct values standardize to +-0.7071, so how far "
                             "apart they are is lost"))
    big = max(float(groups.absmax[gi].max()), float(np.max(np.nan_to_num(np.abs(batch.rewards[rows])) @ np.abs(w))))
    if big > FLOAT32_MAX:
        found.append(finding("float32-range", f"a reward or weighted sum reaches {big:.3g}, beyond float32's "
                             f"{FLOAT32_MAX:.3g}", value=big))
    if not np.isnan(over) and over > 1.0:
        found.append(finding("impl-disagrees", "impl.gdpo misses a demanded exact zero" if over == np.inf else
                             f"impl.gdpo is {over:.3g} times the error bound away from the exact value",
                             over_bound=float(over)))
    return found


def _partial_cancellations(r, groups: _Groups, w, eps) -> dict:
    """Per group, the pairs of columns k, l that cancel on some of its rows: on those rows
    r_k + s r_l is one value C (r_l = C - r_k for weights of one sign, s = 1; r_l = r_k - C
    for weights of opposite signs, s = -1) and r_k takes at least 3 values there (two values
    lie on every such line: binary rewards would always qualify). Between those rows Eq. 4
    and 7 move the pair's w_k z_k + w_l z_l by | |w_k|/sd_k - |w_l|/sd_l | |dr_k| (sd: the
    group's std + eps), a fraction ``keeps`` of the (|w_k|/sd_k + |w_l|/sd_l) |dr_k| the two
    carry apart; reported where it is at most PARTIAL_KEEPS. {group: [(k, l, rows, keeps)]}"""
    found: dict = {}
    K = r.shape[1]
    sd = groups.std + eps
    for k in range(K):
        for l in range(k + 1, K):
            if w[k] == 0 or w[l] == 0:
                continue
            with np.errstate(invalid="ignore", divide="ignore"):  # eps 0, a constant column: inf, nan
                a, b = abs(w[k]) / sd[:, k], abs(w[l]) / sd[:, l]
                keeps = np.abs(a - b) / (a + b)
            near = (keeps <= PARTIAL_KEEPS) & ~groups.collapsed[:, k] & ~groups.collapsed[:, l]
            rows = np.flatnonzero(near[groups.index])
            t = r[rows, k] + np.sign(w[k] * w[l]) * r[rows, l]
            rows, t = rows[~np.isnan(t)], t[~np.isnan(t)]
            if not rows.size:
                continue
            g, rk = groups.index[rows], r[rows, k]
            order = np.lexsort((rk, t, g))
            rows, t, g, rk = rows[order], t[order], g[order], rk[order]
            run = np.r_[True, (g[1:] != g[:-1]) | (t[1:] != t[:-1])]  # rows of one group and one C
            starts = np.flatnonzero(run)
            values = np.add.reduceat(run | np.r_[True, rk[1:] != rk[:-1]], starts, dtype=np.int64)
            for j in np.flatnonzero(values >= 3):
                members = np.sort(rows[starts[j]:starts[j + 1] if j + 1 < starts.size else rows.size])
                gi = int(g[starts[j]])
                pairs = found.setdefault(gi, [])
                if pairs and pairs[-1][:2] == (k, l):  # the largest run of a pair in a group
                    if pairs[-1][2].size >= members.size:
                        continue
                    pairs.pop()
                pairs.append((k, l, members, float(keeps[gi])))
    return found


def _list(names: list[str]) -> str:
    return ("column " if len(names) == 1 else "columns ") + ", ".join(names)


def _number(x) -> float | None:
    """A measurement for the report: None where it was not made (NaN)."""
    return None if np.isnan(x) else float(x)
