"""The audit: what GDPO does with a batch, per group and per whitening unit.

Two methods, one report. Up to :data:`EXACT_SAMPLES` samples the exact oracle runs on the
whole batch, and every peer convention is computed exactly too. Beyond it that would take
hours (the oracle is rational arithmetic), so the batch is read from impl.gdpo's float64
values, and the oracle is run where a finding needs its certainty: on the groups whose
combined values vanish (exact cancellation is decided exactly), on those whose estimated
condition is anywhere near :data:`ILL_CONDITIONED`, and on :data:`SAMPLED_GROUPS` more spread
evenly through the batch, where it also checks impl.gdpo against the error bound; the Eq. 6
step is checked exactly on up to :data:`SAMPLED_UNITS` units of at most :data:`EXACT_UNIT`
samples. Collapsed columns, groups without signal, eps-dominated stds, groups of two and
float32 range are exact decisions or plain statistics either way. The peers' conventions
are then opt-in (``--peers``): their own float formulas (gdpo_tools.peer_formulas) in
their own dtype, against impl.gdpo.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from gdpo_tools import peer_formulas
from gdpo_tools.audit.findings import (EPS_DOMINATED_FACTOR, ERROR, ILL_CONDITIONED, KINDS, ROUTINE, finding,
                                       peer_difference)
from gdpo_tools.audit.read import Batch, _weights
from impl import gdpo as impl
from oracle import gdpo as oracle
from spec import CONVENTIONS, DEFAULT_EPS, FLOAT32_MAX, GDPOError
from spec.errors import GroupError, NonFiniteError

OK, WARN, MALFORMED, DISAGREE = 0, 1, 2, 3
STATUS = {OK: "ok", WARN: "warnings", MALFORMED: "malformed input", DISAGREE: "IMPLEMENTATION DISAGREES"}
#: Up to this many samples the exact oracle runs on every group, unit and convention.
EXACT_SAMPLES = 20_000
#: impl.gdpo runs on chunks of whole units of about this many samples (its working memory).
CHUNK_SAMPLES = 500_000
#: The report holds a row for every group up to this many groups; beyond, only the groups
#: with warnings (the others are counted): a row per group of a 12M-row batch held gigabytes.
LIST_EVERY_GROUP = 10_000
#: Beyond it, the oracle also checks this many groups spread evenly through the batch.
SAMPLED_GROUPS = 200
#: ... and the Eq. 6 step of this many units (spread evenly) of at most EXACT_UNIT samples.
SAMPLED_UNITS = 4
EXACT_UNIT = 20_000
#: A group is sent to the oracle to decide its conditioning when the estimate (an upper bound
#: up to a small factor) is within this factor of the threshold.
COND_MARGIN = 1e-3
#: A group whose combined values are all below this is sent to the oracle to decide exact
#: cancellation (impl.gdpo gives structural zeros exactly; a near-zero is either a bug or
#: near-cancellation, and the oracle says which).
VANISHING = 1e-8


class Progress:
    """What the audit is doing, on stderr: the stage, how far it is, the time so far and an
    estimate of the time left, from the first seconds. On a terminal one line rewritten in
    place; elsewhere a line every few seconds."""

    def __init__(self, enabled: bool, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.live = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.monotonic()
        self.stage, self.stage_t0, self.last = "", self.t0, 0.0

    def start(self, stage: str) -> None:
        self.stage, self.stage_t0 = stage, time.monotonic()
        self.update(0.0, force=True)

    def update(self, fraction: float, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self.last < (0.5 if self.live else 5.0) and fraction < 1.0:
            return
        self.last = now
        spent = now - self.stage_t0
        left = f", about {spent * (1 - fraction) / fraction:.0f} s left" if 0.0 < fraction < 1.0 and spent > 1 else ""
        line = f"[audit] {self.stage}: {100 * fraction:.0f}% ({now - self.t0:.0f} s in all{left})"
        if self.live:
            self.stream.write("\r" + line.ljust(78))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.enabled:
            line = f"[audit] done in {time.monotonic() - self.t0:.1f} s"
            self.stream.write(("\r" + line.ljust(78) + "\n") if self.live else line + "\n")
            self.stream.flush()


def _refuse_nonfinite(batch: Batch) -> None:
    """A NaN or infinite reward, named as the file names it (the column's name, the row, the
    group label): the specification refuses it, so there is nothing to audit."""
    bad = np.argwhere(~np.isfinite(batch.rewards))
    if bad.size:
        i, k = (int(v) for v in bad[0])
        v = float(batch.rewards[i, k])
        label = batch.group_label(batch.group_ids[i])
        more = f" (and {len(bad) - 1} more non-finite rewards)" if len(bad) > 1 else ""
        shown = "NaN" if v != v else repr(v)
        raise NonFiniteError(f"{batch.source}: column {batch.names[k]!r}, row {i} (group {label!r}) is "
                             f"{shown}{more}: the specification refuses non-finite rewards")


def _refuse_singletons(batch: Batch, labels, first, counts) -> None:
    """A group of one has no unbiased std (spec section 2): named by its label and first row."""
    lonely = np.flatnonzero(counts == 1)
    if lonely.size:
        j = lonely[np.argmin(first[lonely])]
        others = lonely.size - 1
        more = "" if not others else f", as {'does 1 other group' if others == 1 else f'do {others} other groups'}"
        raise GroupError(f"{batch.source}: group {batch.group_label(labels[j])!r} (row {int(first[j])}) has 1 "
                         f"sample{more}; Eq. 4's unbiased std needs at least 2 (drop such groups, or merge them)")


class _Groups:
    """The batch sorted by group: each group's rows, and per group and column the statistics
    the findings read (min, max, std), computed once for the whole batch."""

    def __init__(self, r: np.ndarray, group_ids: np.ndarray):
        # groups in order of first appearance, as the oracle and impl.gdpo.group_has_signal order them
        self._sorted, first, inverse, counts = np.unique(group_ids, return_index=True, return_inverse=True,
                                                         return_counts=True)
        seq = np.argsort(first, kind="stable")
        self._rank = np.empty_like(seq)
        self._rank[seq] = np.arange(seq.size)
        self.labels, self.first, self.counts = self._sorted[seq], first[seq], counts[seq]
        self.index = self._rank[inverse.reshape(-1)]
        self.order = np.argsort(self.index, kind="stable")
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
        rs = r[self.order]
        n = self.counts[:, None].astype(np.float64)
        self.min = np.minimum.reduceat(rs, self.starts, axis=0)
        self.max = np.maximum.reduceat(rs, self.starts, axis=0)
        self.absmax = np.maximum(np.abs(self.min), np.abs(self.max))
        mean = np.add.reduceat(rs, self.starts, axis=0) / n
        dev = rs - np.repeat(mean, self.counts, axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            self.std = np.sqrt(np.add.reduceat(dev * dev, self.starts, axis=0) / (n - 1))
        self.collapsed = self.min == self.max

    def position(self, labels) -> np.ndarray:
        """The index of each of these group labels among the groups."""
        return self._rank[np.searchsorted(self._sorted, labels)]

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
    with np.errstate(over="ignore", invalid="ignore"):
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
        if total >= limit:
            runs.append(np.arange(start, u + 1))
            start, total = u + 1, 0
    if start < len(usizes):
        runs.append(np.arange(start, len(usizes)))
    return runs


def _impl_values(batch: Batch, groups: _Groups, uorder, uinverse, usizes, w, eps, bar):
    """impl.gdpo's combined values c and advantages a (float64, file order) and each group's
    signal, in chunks of whole units of about CHUNK_SAMPLES samples, so that impl's working
    memory does not grow with the batch. A refusal is named by the file's own rows: the
    whole batch is then run once more in file order for impl's message."""
    r, g = batch.rewards, batch.group_ids
    N = r.shape[0]
    c, a = np.empty(N), np.empty(N)
    signal = np.empty(groups.labels.size, bool)
    runs = _chunks(groups, uinverse, usizes, CHUNK_SAMPLES) or [np.arange(len(usizes))]
    ustarts = np.concatenate([[0], np.cumsum(usizes)])
    kw = dict(weights=w.tolist(), eps=eps)
    try:
        for j, run_units in enumerate(runs):
            rows = uorder[ustarts[run_units[0]]:ustarts[run_units[-1] + 1]]  # whole units, by unit
            tr, tg = torch.from_numpy(r[rows]), torch.from_numpy(g[rows])
            c[rows] = impl.normalize_rewards(tr, group_ids=tg, **kw).numpy()
            a[rows] = impl.gdpo_advantages(tr, group_ids=tg, segment_sizes=usizes[run_units].tolist(),
                                           out_dtype=torch.float64, **kw).numpy()
            gc = g[rows]  # group_has_signal orders the groups by first appearance (impl.gdpo's docstring)
            met = gc[np.sort(np.unique(gc, return_index=True)[1])]
            signal[groups.position(met)] = impl.group_has_signal(tr, group_ids=tg, **kw).numpy()
            bar.update((j + 1) / len(runs))
    except GDPOError as e:
        try:  # impl's own refusals (Eq. 7 overflow) in the file's row order
            impl.normalize_rewards(torch.from_numpy(r), group_ids=torch.from_numpy(g), **kw)
        except GDPOError as whole:
            e = whole
        raise type(e)(f"{batch.source}: impl.gdpo refuses the batch: {e}") from e
    return c, a, signal


def audit(batch: Batch, weights=None, eps: float = DEFAULT_EPS, progress: bool | None = None,
          exact: bool | None = None, peers: bool | None = None, bar: Progress | None = None) -> dict:
    """The report of ``batch`` (see :mod:`gdpo_tools.audit` for its schema). ``exact``: run the
    oracle on every group (default: up to EXACT_SAMPLES samples); ``peers``: compute the peer
    conventions (default: when exact)."""
    r = batch.rewards
    N, K = r.shape
    peers = N <= EXACT_SAMPLES if peers is None else peers  # --exact alone adds no peer passes
    exact = N <= EXACT_SAMPLES if exact is None else exact
    bar = bar or Progress(N > EXACT_SAMPLES if progress is None else progress)
    if weights is not None:
        w = _weights(weights, batch.names, "the weights given (--weights)")
    elif batch.weights is not None:
        w = _weights(batch.weights, batch.names, f"{batch.source}: 'weights'")
    else:
        w = np.ones(K)
    _refuse_nonfinite(batch)
    bar.start("group statistics")
    groups = _Groups(r, batch.group_ids)
    _refuse_singletons(batch, groups.labels, groups.first, groups.counts)
    G = groups.labels.size
    units = batch.unit_ids if batch.unit_ids is not None else np.zeros(N, dtype=np.int64)
    uorder = np.argsort(units, kind="stable")  # whitening units as consecutive segments for impl
    ulabels, uinverse, usizes = np.unique(units, return_inverse=True, return_counts=True)
    uinverse = uinverse.reshape(-1)
    ustarts = np.concatenate([[0], np.cumsum(usizes)[:-1]])  # each unit's first row in uorder
    bar.start("impl.gdpo")
    c, impl_a, signal = _impl_values(batch, groups, uorder, uinverse, usizes, w, eps, bar)
    bar.update(1.0)

    # ---- per group: the decisions that need the oracle, from it (every group, or those that need it)
    cancelled = np.zeros(G, bool)
    cond = _cond_estimate(groups, w, eps)
    cond_sharp = np.zeros(G, bool)
    cond_from = np.full(G, "estimate", dtype=object)
    over = np.full(G, np.nan)  # impl's error over the bound, where the oracle checked it
    unit_collapsed = np.zeros(ulabels.size, bool)
    unit_cond = np.full(ulabels.size, np.nan)
    unit_cond_sharp = np.zeros(ulabels.size, bool)
    unit_over = np.full(ulabels.size, np.nan)
    if exact:
        bar.start("exact oracle, whole batch")
        res = oracle.gdpo_advantages(r, batch.group_ids, weights=w, unit_ids=units, eps=eps)
        cancelled[groups.position(res.group_labels)] = res.group_cancelled
        cond = groups.reduce_max(res.combined.cond)
        cond_sharp = np.minimum.reduceat(res.combined.cond_sharp[groups.order], groups.starts).astype(bool)
        cond_from[:] = "oracle"
        ratio = _over_bound(impl_a, res.float64, res.allowed("float64"), res.required_zero)
        over = groups.reduce_max(ratio)
        unit_collapsed[np.searchsorted(ulabels, res.unit_labels)] = res.unit_collapsed
        unit_cond = np.maximum.reduceat(res.cond[uorder], ustarts)
        unit_cond_sharp = np.minimum.reduceat(res.cond_sharp[uorder],
                                              ustarts).astype(bool)
        unit_over = np.maximum.reduceat(ratio[uorder], ustarts)
        checked = np.arange(G)
        checked_units = np.arange(ulabels.size)
        bar.update(1.0)
    else:
        scale = np.maximum(groups.reduce_max(np.abs(c)), 1.0)
        vanishing = (groups.reduce_max(np.abs(c)) < VANISHING) & ~groups.collapsed.all(axis=1)
        near = cond > COND_MARGIN * ILL_CONDITIONED * scale
        spread = np.unique(np.linspace(0, G - 1, min(G, SAMPLED_GROUPS)).round().astype(np.int64))
        checked = np.union1d(np.flatnonzero(vanishing | near), spread)
        bar.start(f"exact oracle, {checked.size} of {G} groups")
        for lo in range(0, checked.size, 64):  # in chunks, for the progress line
            part = checked[lo:lo + 64]
            rows = np.concatenate([groups.rows(g) for g in part])
            res = oracle.gdpo_advantages(r[rows], batch.group_ids[rows], weights=w, eps=eps)
            cancelled[groups.position(res.group_labels)] = res.group_cancelled
            sub = _Groups(r[rows], batch.group_ids[rows])  # the same groups, in the same order (part ascends)
            cond[part] = sub.reduce_max(res.combined.cond)
            cond_sharp[part] = np.minimum.reduceat(res.combined.cond_sharp[sub.order], sub.starts).astype(bool)
            cond_from[part] = "oracle"
            comb = res.combined
            over[part] = sub.reduce_max(_over_bound(c[rows], comb.float64, comb.allowed("float64"),
                                                    comb.required_zero))
            bar.update(min(1.0, (lo + part.size) / checked.size))
        # units: collapsed where impl's combined values are all equal (exact there: structural
        # zeros are exact in impl.gdpo); Eq. 6 checked exactly on a few units of moderate size
        cu = c[uorder]
        unit_collapsed = np.minimum.reduceat(cu, ustarts) == np.maximum.reduceat(cu, ustarts)
        small = np.flatnonzero(usizes <= EXACT_UNIT)
        checked_units = small[np.unique(np.linspace(0, small.size - 1, min(small.size, SAMPLED_UNITS)).round()
                                        .astype(np.int64))] if small.size else small
        if checked_units.size:
            bar.start(f"exact oracle, Eq. 6 of {checked_units.size} units")
        for j, u in enumerate(checked_units):
            rows = uorder[ustarts[u]:ustarts[u] + usizes[u]]
            st = oracle.whiten(c[rows], eps=eps)
            mine = impl.whiten(torch.from_numpy(c[rows]), segment_sizes=[int(rows.size)], eps=eps,
                               out_dtype=torch.float64).numpy()
            unit_over[u] = float(np.max(_over_bound(mine, st.float64, st.allowed("float64"), st.required_zero)))
            unit_cond[u] = float(st.cond.max())
            unit_cond_sharp[u] = bool(st.cond_sharp.all())
            bar.update((j + 1) / checked_units.size)

    # ---- findings
    bar.start("findings")
    group_rows, counts = [], {}
    keep_all = G <= LIST_EVERY_GROUP
    warned = routine_only = 0
    for gi in range(G):
        found = _group_findings(batch, groups, gi, w, eps, signal[gi], cancelled[gi], cond[gi], cond_sharp[gi],
                                cond_from[gi], over[gi], c)
        for f in found:
            counts[f["code"]] = counts.get(f["code"], 0) + 1
        warns = any(f["severity"] != ROUTINE for f in found)
        warned += warns
        routine_only += bool(found) and not warns
        if not (keep_all or warns):  # beyond LIST_EVERY_GROUP, routine groups are counted, not listed
            continue
        group_rows.append({"group": batch.group_label(groups.labels[gi]), "size": int(groups.counts[gi]),
                           "signal": bool(signal[gi]), "findings": found,
                           "max_cond_combined": float(cond[gi]), "max_cond_combined_sharp": bool(cond_sharp[gi]),
                           "cond_from": str(cond_from[gi]),
                           "impl_error_over_bound": None if np.isnan(over[gi]) else float(over[gi])})
    unit_rows = []
    for ui, label in enumerate(ulabels):
        found = []
        if unit_collapsed[ui]:
            found.append(finding("unit-collapsed", f"every combined value of unit {_py(label)} is exactly equal, so "
                                 "each of its advantages is exactly 0 (Eq. 6 exact collapse)"))
        if not np.isnan(unit_over[ui]) and unit_over[ui] > 1.0:
            found.append(finding("impl-disagrees", f"impl.gdpo's Eq. 6 is {unit_over[ui]:.3g} times the error bound "
                                 "from the exact whitening of its own combined values", over_bound=float(unit_over[ui])))
        for f in found:
            counts[f["code"]] = counts.get(f["code"], 0) + 1
        unit_rows.append({"unit": _py(label), "size": int(usizes[ui]), "collapsed": bool(unit_collapsed[ui]),
                          "findings": found,
                          "max_cond": None if np.isnan(unit_cond[ui]) else float(unit_cond[ui]),
                          "max_cond_sharp": bool(unit_cond_sharp[ui]),
                          "impl_error_over_bound": None if np.isnan(unit_over[ui]) else float(unit_over[ui])})

    # ---- peers
    peer_rows = {}
    if peers:
        bar.start("peer conventions")
        spec_conv = CONVENTIONS["spec"]
        others = [n for n in CONVENTIONS if n != "spec"]
        for j, name in enumerate(others):
            conv = CONVENTIONS[name]
            token = np.ones(N, dtype=np.int64) if conv.whiten == "per_token" else None
            row = {"why": peer_difference(conv, spec_conv),
                   "note": "one token per sample" if token is not None else ""}
            try:
                if exact:
                    pa = oracle.gdpo_advantages(r, batch.group_ids, weights=w, unit_ids=units, convention=name,
                                           token_counts=token).float64
                    ref, row["method"] = res.float64, "exact, against the exact spec result"
                else:
                    with np.errstate(all="ignore"):
                        pa = (peer_formulas.nemo_rl_one_pass(r, batch.group_ids, units, w) if name == "nemo_rl" else
                              peer_formulas.formula(name, r, batch.group_ids, unit_ids=units, weights=w,
                                                    token_counts=token, dtype=np.dtype(conv.native_dtype)))
                    pa = np.asarray(pa, dtype=np.float64)
                    ref, row["method"] = impl_a, f"its float formula in {conv.native_dtype}, against impl.gdpo"
                diff = np.abs(pa - ref)
                row["max_abs_difference"] = None if np.all(np.isnan(diff)) else float(np.nanmax(diff))
            except GDPOError as e:
                row.update(max_abs_difference=None, method="refused", note=f"refused: {e}")
            peer_rows[name] = row
            bar.update((j + 1) / len(others))

    disagree = any(f["severity"] == ERROR for g in group_rows + unit_rows for f in g["findings"])
    warn = any(KINDS[f["code"]].severity != ROUTINE for g in group_rows + unit_rows for f in g["findings"])
    status = DISAGREE if disagree else (WARN if warn else OK)
    checked_over = over[~np.isnan(over)]
    bar.done()
    return {
        "schema": SCHEMA,
        "source": batch.source, "samples": N, "groups_total": G, "units_total": int(ulabels.size),
        "components": batch.names, "weights": w.tolist(), "eps": eps,
        "method": {
            "exact": bool(exact),
            "groups_checked_by_oracle": int(np.size(checked)),
            "units_checked_by_oracle": int(np.size(checked_units)),
            "peers": ("exact" if exact else "float formulas") if peers else "not computed",
            "text": _method_text(exact, int(np.size(checked)), G, int(np.size(checked_units)), ulabels.size),
        },
        "counts": dict(sorted(counts.items())),
        "groups_without_signal": int(np.sum(~signal)),
        "groups_with_warnings": int(warned), "groups_with_routine_findings_only": int(routine_only),
        "groups_listed": "all" if keep_all else "with warnings", "groups": group_rows,
        "units": unit_rows, "peers": peer_rows,
        "impl_vs_oracle": {"max_error_over_bound": float(checked_over.max()) if checked_over.size else None,
                           "groups_checked": int(checked_over.size)},
        "status": status, "status_text": STATUS[status],
    }


SCHEMA = "gdpo-audit/2"


def _method_text(exact: bool, groups: int, G: int, units: int, S: int) -> str:
    if exact:
        return (f"the exact oracle on every group and unit (batches of up to {EXACT_SAMPLES:,} samples, or "
                "--exact)")
    return (f"impl.gdpo's float64 values for every group; the exact oracle on {groups:,} of {G:,} groups (every "
            f"group whose combined values vanish or whose conditioning is near the threshold, and "
            f"{min(G, SAMPLED_GROUPS)} spread through the batch) and on the Eq. 6 step of {units} of {S} units "
            "(--exact: every group, much slower)")


def _over_bound(got, exact, allowed, required_zero) -> np.ndarray:
    """Per sample, impl's error in units of the error bound (inf: a demanded exact zero missed)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(allowed > 0, np.abs(got - exact) / np.where(allowed > 0, allowed, 1.0),
                         np.where(got == exact, 0.0, np.inf))
    if required_zero is not None:
        ratio = np.where(required_zero & (got != 0), np.inf, ratio)
    return ratio


def _group_findings(batch, groups, gi, w, eps, signal, cancelled, cond, sharp, cond_from, over, c) -> list[dict]:
    names, K = batch.names, len(batch.names)
    n = int(groups.counts[gi])
    found = []
    collapsed = [names[k] for k in range(K) if groups.collapsed[gi, k]]
    if collapsed:
        found.append(finding("collapsed-column", f"{_list(collapsed)} constant within the group: Eq. 4 gives "
                             f"{'it' if len(collapsed) == 1 else 'them'} z = 0 exactly", columns=collapsed))
    if not signal:
        found.append(finding("no-signal", "every sample of the group gets the same advantage (every column "
                             "collapsed or cancelling): it teaches nothing"))
    if cancelled and len(collapsed) < K:
        varying = [names[k] for k in range(K) if not groups.collapsed[gi, k]]
        found.append(finding("exact-cancellation", f"{_list(varying)} vary but cancel exactly: every combined value "
                             "(Eq. 7) of the group is exactly 0", columns=varying))
    rows = groups.rows(gi)
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
    big = max(float(groups.absmax[gi].max()), float(np.max(np.abs(batch.rewards[rows]) @ np.abs(w))))
    if big > FLOAT32_MAX:
        found.append(finding("float32-range", f"a reward or weighted sum reaches {big:.3g}, beyond float32's "
                             f"{FLOAT32_MAX:.3g}", value=big))
    if not np.isnan(over) and over > 1.0:
        found.append(finding("impl-disagrees", "impl.gdpo misses a demanded exact zero" if over == np.inf else
                             f"impl.gdpo is {over:.3g} times the error bound away from the exact value",
                             over_bound=float(over)))
    return found


def _list(names: list[str]) -> str:
    return ("column " if len(names) == 1 else "columns ") + ", ".join(names)


def _py(x):
    return x.item() if hasattr(x, "item") else x
