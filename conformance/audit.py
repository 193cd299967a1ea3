"""``gdpo audit``: read a dumped batch and say what GDPO will do with it.

Input formats (the reward components, group labels, optional units and weights):

* ``.npz`` / ``.pt`` (a dict saved with ``torch.save``): arrays ``rewards`` (N, K)
  *or* one array per component ``reward_<name>``; ``group_ids`` (N,); optional
  ``unit_ids`` (N,), ``weights`` (K,), ``names`` (K,);
* ``.jsonl``: one object per sample: ``{"group": g, "unit": u (optional),
  "rewards": {"name": value, ...}}`` (or ``"rewards": [values]``);
* ``.csv``: a header with ``group``, optional ``unit``, and one column per component.

Weights on the command line (``--weights``) override those in the file.

The report, per group and per unit: whether the group reaches training with a
signal, collapsed columns, exact cancellation, near-cancellation with its
conditioning, eps-dominated std, n_g = 2 magnitude loss, float32 range risk; the
implementation's difference from the exact oracle (in units of the spec's error
bound); and how far each peer convention's exact result moves from the spec's.

Exit codes: 0 audited, nothing to warn about; 1 audited, warnings; 2 the input is
malformed (the message names the column and row); 3 impl.gdpo disagrees with
the oracle beyond the error model (a bug to report).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from spec import CONVENTIONS, DEFAULT_EPS, FLOAT32_MAX, GDPOError

#: Diagnostics only (they never change a result): a group column whose std is
#: below this multiple of eps has its Eq. 4 scale set mostly by eps, not the data.
EPS_DOMINATED_FACTOR = 10.0
#: A group whose combined values (Eq. 7) move by more than this fraction of their
#: scale when every input moves one ulp (the oracle's ``cond``) is reported as
#: ill-conditioned: ten orders of magnitude above a healthy group's ~1e-16, so its
#: values are set by the inputs' last bits (typical near-cancellation).
ILL_CONDITIONED = 1e-6

OK, WARN, MALFORMED, DISAGREE = 0, 1, 2, 3


class AuditInputError(GDPOError):
    """A dumped batch that cannot be read: the message names the file, column and row."""


@dataclasses.dataclass
class Batch:
    rewards: np.ndarray
    group_ids: np.ndarray
    unit_ids: np.ndarray | None
    weights: np.ndarray | None
    names: list[str]
    source: str


# ------------------------------------------------------------------------- reading


def _float_column(values, name: str, source: str) -> np.ndarray:
    out = np.empty(len(values))
    for i, v in enumerate(values):
        try:
            out[i] = float(v)
        except (TypeError, ValueError):
            raise AuditInputError(f"{source}: column {name!r}, row {i}: {v!r} is not a number") from None
    return out


def _int_column(values, name: str, source: str) -> np.ndarray:
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        try:
            f = float(v)
            if not f.is_integer():
                raise ValueError
            out[i] = int(f)
        except (TypeError, ValueError, OverflowError):
            raise AuditInputError(f"{source}: column {name!r}, row {i}: {v!r} is not an integer label") from None
    return out


def _from_mapping(data: dict, source: str) -> Batch:
    keys = set(data)
    if "rewards" in keys:
        rewards = np.asarray(data["rewards"], dtype=np.float64)
        if rewards.ndim == 1:
            rewards = rewards[:, None]
        names = [str(n) for n in data["names"]] if "names" in keys else [f"r{k}" for k in range(rewards.shape[1])]
    else:
        comp = sorted(k for k in keys if k.startswith("reward_"))
        if not comp:
            raise AuditInputError(f"{source}: no 'rewards' array and no 'reward_<name>' arrays (found {sorted(keys)})")
        cols = [np.asarray(data[k], dtype=np.float64).reshape(-1) for k in comp]
        if len({c.size for c in cols}) != 1:
            sizes = {k: c.size for k, c in zip(comp, cols)}
            raise AuditInputError(f"{source}: reward arrays differ in length: {sizes}")
        rewards = np.stack(cols, 1)
        names = [k[len("reward_"):] for k in comp]
    if "group_ids" not in keys:
        raise AuditInputError(f"{source}: no 'group_ids' array (found {sorted(keys)})")
    n = rewards.shape[0]

    def labels(key):
        if key not in keys:
            return None
        arr = np.asarray(data[key]).reshape(-1)
        if arr.size != n:
            raise AuditInputError(f"{source}: {key!r} has {arr.size} entries for {n} samples")
        return _int_column(arr.tolist(), key, source)

    weights = None if "weights" not in keys else np.asarray(data["weights"], dtype=np.float64).reshape(-1)
    return Batch(rewards, labels("group_ids"), labels("unit_ids"), weights, names, source)


def _read_csv(path: Path) -> Batch:
    src = str(path)
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or "group" not in reader.fieldnames:
            raise AuditInputError(f"{src}: the header must name a 'group' column (found {reader.fieldnames})")
        rows = list(reader)
    if not rows:
        raise AuditInputError(f"{src}: no rows")
    names = [c for c in reader.fieldnames if c not in ("group", "unit")]
    if not names:
        raise AuditInputError(f"{src}: no reward columns besides 'group'/'unit'")
    for i, row in enumerate(rows):
        if None in row or any(v is None for v in row.values()):
            raise AuditInputError(f"{src}: row {i} has {'more' if None in row else 'fewer'} fields than the header")
    rewards = np.stack([_float_column([r[c] for r in rows], c, src) for c in names], 1)
    group = _int_column([r["group"] for r in rows], "group", src)
    unit = _int_column([r["unit"] for r in rows], "unit", src) if "unit" in reader.fieldnames else None
    return Batch(rewards, group, unit, None, names, src)


def _read_jsonl(path: Path) -> Batch:
    src = str(path)
    recs = []
    with path.open() as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise AuditInputError(f"{src}: row {len(recs)} (line {i + 1}) is not JSON: {e.msg}") from None
    if not recs:
        raise AuditInputError(f"{src}: no records")
    first = recs[0].get("rewards")
    names = list(first) if isinstance(first, dict) else [f"r{k}" for k in range(len(first or []))]
    rows = []
    for i, rec in enumerate(recs):
        if not isinstance(rec, dict) or "group" not in rec or "rewards" not in rec:
            raise AuditInputError(f"{src}: row {i} needs 'group' and 'rewards'")
        rw = rec["rewards"]
        if isinstance(rw, dict):
            if set(rw) != set(names):
                raise AuditInputError(f"{src}: row {i} has reward keys {sorted(rw)}, expected {sorted(names)}")
            rw = [rw[n] for n in names]
        if len(rw) != len(names):
            raise AuditInputError(f"{src}: row {i} has {len(rw)} rewards, expected {len(names)}")
        rows.append(rw)
    rewards = np.stack([_float_column([r[k] for r in rows], names[k], src) for k in range(len(names))], 1)
    group = _int_column([r["group"] for r in recs], "group", src)
    has_unit = ["unit" in r for r in recs]
    if any(has_unit) and not all(has_unit):
        raise AuditInputError(f"{src}: row {has_unit.index(not has_unit[0])} lacks the 'unit' the others have")
    unit = _int_column([r["unit"] for r in recs], "unit", src) if all(has_unit) else None
    return Batch(rewards, group, unit, None, names, src)


def read_batch(path: str | Path) -> Batch:
    path = Path(path)
    if not path.exists():
        raise AuditInputError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return _read_csv(path)
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as data:
                return _from_mapping({k: data[k] for k in data.files}, str(path))
        except (ValueError, OSError) as e:
            raise AuditInputError(f"{path}: not a readable .npz file ({e})") from None
    if suffix == ".pt":
        import torch

        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises many types for a bad file
            raise AuditInputError(f"{path}: not a readable .pt file ({type(e).__name__}: {e})") from None
        if not isinstance(data, dict):
            raise AuditInputError(f"{path}: expected a dict of tensors, got {type(data).__name__}")
        return _from_mapping({k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in data.items()}, str(path))
    raise AuditInputError(f"{path}: unknown format {suffix!r} (expected .npz, .pt, .jsonl or .csv)")


def example_batch() -> Batch:
    """The built-in batch: one group of each kind the audit reports on."""
    C = 1e12
    d = np.array([0.1, 0.2, 0.3, 0.7])
    rows = [
        [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]],  # healthy
        [[1.0, 0.5], [1.0, 0.5], [1.0, 0.5], [1.0, 0.5]],  # fully collapsed: no signal
        np.stack([C - d, C - (C - d)], 1).tolist(),  # exact constant sum: cancels
        np.stack([C - d, d], 1).tolist(),  # near-constant sum: quantization is the signal
        [[0.0, 1.0], [0.0, 1.00001], [1.0, 1.00002], [1.0, 1.00003]],  # second column std ~1e-5
        [[0.0, 3.0], [1.0, 9.0]],  # n_g = 2
    ]
    rewards = np.vstack([np.asarray(r, dtype=np.float64) for r in rows])
    groups = np.concatenate([[g] * len(r) for g, r in enumerate(rows)])
    return Batch(rewards, groups, None, None, ["correctness", "format"], "built-in example")


# ------------------------------------------------------------------------- audit


class _Progress:
    """Stage-by-stage progress on stderr for large batches (the oracle is the slow part)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled = total, 0, enabled

    def step(self, what: str) -> None:
        self.done += 1
        if self.enabled:
            bar = "#" * self.done + "." * (self.total - self.done)
            sys.stderr.write(f"\r  [{bar}] {self.done}/{self.total} {what:<28}")
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def audit(batch: Batch, weights=None, eps: float = DEFAULT_EPS, progress: bool | None = None) -> dict:
    import torch

    from impl import gdpo as impl
    from oracle import gdpo as oracle

    r = batch.rewards
    N, K = r.shape
    w = np.asarray(weights if weights is not None else
                   (batch.weights if batch.weights is not None else np.ones(K)), dtype=np.float64)
    if w.shape != (K,):
        raise AuditInputError(f"{batch.source}: {w.size} weights for {K} reward columns {batch.names}")
    units = batch.unit_ids if batch.unit_ids is not None else np.zeros(N, dtype=np.int64)
    order = np.argsort(units, kind="stable")  # whitening units as consecutive segments for impl
    ulabels, usizes = np.unique(units[order], return_counts=True)
    bar = _Progress(2 + len(CONVENTIONS) - 1, (N > 20_000) if progress is None else progress)
    res = oracle.advantages(r, batch.group_ids, weights=w, unit_ids=units, eps=eps)
    bar.step("exact oracle (spec)")
    exact = res.float64

    got = impl.gdpo_advantages(torch.from_numpy(r[order]), group_ids=torch.from_numpy(batch.group_ids[order]),
                               weights=w.tolist(), segment_sizes=usizes.tolist(), eps=eps,
                               out_dtype=torch.float64).numpy()
    impl_a = np.empty(N)
    impl_a[order] = got
    bar.step("impl.gdpo")
    allowed = res.allowed("float64")
    ratio = np.where(allowed > 0, np.abs(impl_a - exact) / np.where(allowed > 0, allowed, 1.0),
                     np.where(impl_a == exact, 0.0, np.inf))
    signal = impl.group_has_signal(torch.from_numpy(r), group_ids=torch.from_numpy(batch.group_ids),
                                   weights=w.tolist(), eps=eps).numpy()

    groups = []
    warn = False
    for gi, label in enumerate(res.group_labels):
        m = res.group_index == gi
        n = int(m.sum())
        flags = []
        cols = r[m]
        std = cols.std(axis=0, ddof=1) if n > 1 else np.zeros(K)
        collapsed = [batch.names[k] for k in range(K) if res.group_collapsed[gi, k]]
        if collapsed:
            flags.append(f"collapsed: {', '.join(collapsed)}")
        if not signal[gi]:
            flags.append("no signal: every advantage of the group is the unit's constant")
        if res.group_cancelled[gi] and len(collapsed) < K:
            flags.append("exact cancellation: the components cancel to exactly zero")
        cond = float(res.combined.cond[m].max())
        scale = max(float(np.abs(res.combined.float64[m]).max()), 1.0)
        if cond > ILL_CONDITIONED * scale:
            flags.append(f"ill-conditioned: one ulp of input moves a combined value by {cond:.2g}")
        dom = [batch.names[k] for k in range(K) if 0 < std[k] < EPS_DOMINATED_FACTOR * eps]
        if dom:
            flags.append(f"eps-dominated std: {', '.join(dom)}")
        if n == 2:
            flags.append("n_g = 2: magnitudes lost, each varying column is +-0.7071")
        if np.any(np.abs(cols) > FLOAT32_MAX) or np.any(np.abs(np.abs(cols) @ np.abs(w)) > FLOAT32_MAX):
            flags.append("float32 range: rewards or weighted sums beyond float32 (float32 code overflows)")
        warn |= bool(flags)
        groups.append({"group": _py(label), "size": n, "signal": bool(signal[gi]), "flags": flags,
                       "max_cond_combined": cond, "impl_error_over_bound": float(ratio[m].max())})
    unit_rows = []
    for ui, label in enumerate(res.unit_labels):
        m = res.unit_index == ui
        unit_rows.append({"unit": _py(label), "size": int(m.sum()), "collapsed": bool(res.unit_collapsed[ui]),
                          "max_cond": float(res.cond[m].max())})
        warn |= bool(res.unit_collapsed[ui])
    peers = {}
    for name, conv in CONVENTIONS.items():
        if name == "spec":
            continue
        try:
            token = np.ones(N, dtype=np.int64) if conv.whiten == "per_token" else None
            pr = oracle.advantages(r, batch.group_ids, weights=w, unit_ids=units, convention=name,
                                   token_counts=token)
            diff = np.abs(pr.float64 - exact)
            peers[name] = {"max_abs_difference": float(np.nanmax(diff)) if not np.all(np.isnan(diff)) else None,
                           "note": "verl with one token per sample" if token is not None else ""}
        except GDPOError as e:
            peers[name] = {"max_abs_difference": None, "note": f"refused: {e}"}
        bar.step(f"oracle ({name})")
    disagree = bool(np.any(ratio > 1.0) or np.any(impl_a[res.required_zero] != 0))
    status = DISAGREE if disagree else (WARN if warn else OK)
    return {"source": batch.source, "samples": N, "components": batch.names, "weights": w.tolist(), "eps": eps,
            "groups": groups, "units": unit_rows, "peers": peers,
            "impl_vs_oracle": {"max_error_over_bound": float(ratio.max()),
                               "max_abs_error": float(np.max(np.abs(impl_a - exact)))},
            "status": status}


def _py(x):
    return x.item() if hasattr(x, "item") else x


def render(report: dict) -> str:
    lines = [f"GDPO audit of {report['source']}: {report['samples']} samples, components "
             f"{', '.join(report['components'])}, weights {report['weights']}, eps {report['eps']}"]
    lines.append("")
    lines.append(f"{'group':>8} {'size':>5} {'signal':>6}  findings")
    for g in report["groups"]:
        findings = "; ".join(g["flags"]) if g["flags"] else "-"
        lines.append(f"{str(g['group']):>8} {g['size']:>5} {('yes' if g['signal'] else 'NO'):>6}  {findings}")
    lines.append("")
    for u in report["units"]:
        lines.append(f"unit {u['unit']}: {u['size']} samples, one ulp of input moves an advantage by up to "
                     f"{u['max_cond']:.2g}" + (", COLLAPSED (all advantages 0)" if u["collapsed"] else ""))
    iv = report["impl_vs_oracle"]
    lines.append(f"impl.gdpo vs exact oracle: worst error {iv['max_abs_error']:.3g} "
                 f"({iv['max_error_over_bound']:.3g} of the spec's error bound)")
    lines.append("peer conventions, largest change of an advantage against the spec:")
    for name, p in report["peers"].items():
        val = "n/a" if p["max_abs_difference"] is None else f"{p['max_abs_difference']:.3g}"
        lines.append(f"  {name:<17} {val}" + (f"  ({p['note']})" if p["note"] else ""))
    lines.append(f"status: {['ok', 'warnings', 'malformed', 'IMPLEMENTATION DISAGREES'][report['status']]}")
    return "\n".join(lines)


def main(file: str | None, weights=None, as_json: bool = False, eps: float = DEFAULT_EPS, out=None) -> int:
    out = out if out is not None else sys.stdout
    try:
        batch = read_batch(file) if file else example_batch()
        report = audit(batch, weights=weights, eps=eps)
    except GDPOError as e:
        print(f"gdpo audit: {e}", file=sys.stderr)
        return MALFORMED
    print(json.dumps(report, indent=2) if as_json else render(report), file=out)
    return report["status"]

