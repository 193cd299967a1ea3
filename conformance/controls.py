"""Negative controls: deliberately wrong GDPO implementations the suite must reject.

A property that no wrong implementation fails proves nothing (STYLE, convention 3). Every control
is :func:`baseline` with exactly one flaw switched on (:class:`Flaws`), so a rejection is the
flaw's; a flaw that is another formula is a catalogue variant (``Flaws.formula``). ``baseline``
itself is a second, deliberately plain, correct implementation in the ``gdpo`` call shape that
passes every property (``test_controls``): shift-invariant two-pass float64 with exact
power-of-two scaling, exact collapse, the structural zero mean of a unit of whole groups, one
correct rounding into the output dtype, agreement before any data-dependent collective, a gather
of every unit's values; ``missing="unscored"`` as spec section 2 says, across ranks too.

Each control is importable as ``conformance.controls:<name>`` (spawned ranks load it by that name)
with ``normalize_rewards`` and ``whiten`` attributes, so the stage properties grade it too.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers

import torch

from conformance.formulas import PAPER, Variant
from impl._segments import round_to
from spec.constants import FLOAT32_MAX
from spec.errors import (
    DistributedError,
    GDPOError,
    GroupError,
    InputDtypeError,
    NonFiniteError,
    OutOfRangeError,
    SegmentError,
    ShapeError,
    WeightError,
)

_F64 = torch.float64
_CODES = (None, GDPOError, NonFiniteError, InputDtypeError, ShapeError, GroupError, WeightError, SegmentError,
          OutOfRangeError)
#: Eq. 7 weights above 2^990 are scaled down first: |z| < 2^32, so w z stays finite.
_WEIGHT_EXP_CAP = 990


@dataclasses.dataclass(frozen=True)
class Flaws:
    #: the paper's formula, or a catalogue variant; read here: the ddofs, the eps placements, NaN read
    #: as 0 (zero_first), singleton "zero", whiten_scope "batch", nan "nan_aware" (unscored rows kept)
    formula: Variant = PAPER
    one_pass: bool = False  # Eq. 4 variance as (sum x^2 - (sum x)^2 / n) / (n - 1)
    float32_weights: bool = False  # weights rounded to float32 before Eq. 7
    float32_internals: bool = False  # every stage in float32
    naive_centring: bool = False  # mean, then x - mean (not shift-invariant)
    noise_floor: bool = False  # |c| <= 1e-9 * sum_k |w_k z_k| set to 0 ("that is rounding")
    local_statistics: bool = False  # Eq. 6 statistics of this rank's part only
    local_raise: bool = False  # a rank raises its own refusal before the agreement collective
    double_rounding: bool = False  # float16/bfloat16 written through float32 (torch's own float64 cast)
    truncate_bfloat16: bool = False  # bfloat16 written by truncation (rounding toward zero)
    large_batch_float32: bool = False  # beyond 64 rows: float32 internals and ddof 0 (correct up to 64)
    int32_labels: bool = False  # group_ids cast to int32 (wrapping) before grouping
    float64_labels: bool = False  # group_ids cast to float64 before grouping (beyond 2^53 labels merge)
    big_groups_float32: bool = False  # Eq. 4 of a group of more than 64 rows in float32 (correct up to 64)
    zero_weight_unchecked: bool = False  # zero-weight columns dropped before the finiteness check
    refuse_big_weights: bool = False  # a weight beyond float32's range refused (OutOfRangeError)
    base_class_refusals: bool = False  # bad group arguments, eps, out_dtype refused as the base GDPOError
    mutates_rewards: bool = False  # the caller's rewards tensor overwritten (halved) in place
    rounded_unit_mean: bool = False  # Eq. 6 subtracts the rounded mean even in a unit of whole groups


class _Refusal(Exception):
    def __init__(self, cls, msg, argument: bool = False):
        super().__init__(msg)
        self.cls, self.msg = cls, msg
        self.argument = argument  # a refusal of a call argument (groups, eps, out_dtype)

    def flawed(self, fl: "Flaws") -> "_Refusal":
        if fl.base_class_refusals and self.argument:
            self.cls = GDPOError
        return self


# ------------------------------------------------------------------ arithmetic


def _ldexp(x: float, k: int) -> float:
    """math.ldexp that saturates to inf instead of raising OverflowError."""
    try:
        return math.ldexp(x, k)
    except OverflowError:
        return math.copysign(math.inf, x)


def _sum(t: torch.Tensor) -> torch.Tensor:
    """Sequential left-to-right sum: negating the input negates the result bit for bit."""
    return torch.cumsum(t, 0)[-1]


def _scale(x: torch.Tensor, k: int) -> torch.Tensor:
    """x * 2^k, exact for normal results (two representable factors)."""
    h = k // 2
    return x * math.ldexp(1.0, h) * math.ldexp(1.0, k - h)


def _frame(x: torch.Tensor, eps: float) -> int:
    """e with max|x| < 2^e, raised where needed so that eps * 2^-e stays finite."""
    top = float(x.abs().max())
    e = math.frexp(top)[1] if top else 0
    if eps > 0:
        e = max(e, math.frexp(eps)[1] - 1020)
    return e


def _standardize(x: torch.Tensor, eps: float, fl: Flaws) -> torch.Tensor:
    """Eq. 4 on one group column (1-D)."""
    n = x.numel()
    if n < 2 or bool(x.max() == x.min()):
        return torch.zeros_like(x)  # exact collapse (and the singleton_zero flaw)
    e = _frame(x, eps)
    xs = _scale(x, -e)
    if fl.big_groups_float32 and n > 64:  # a "fast path" for long groups: the base's statistics in float32
        xs, fl = xs.to(torch.float32), Flaws()
    d = xs if fl.naive_centring or fl.one_pass else xs - xs[0]  # the base: shifted by a member first
    dev = d - _sum(d) / n
    ss = _sum(xs * xs) - _sum(xs) * _sum(xs) / n if fl.one_pass else _sum(dev * dev)
    var = ss / (n - fl.formula.group_ddof)
    den = _denominator(var, eps, e, fl.formula.group_placement)
    return torch.where(dev == 0, torch.zeros_like(dev), dev / den).to(x.dtype)


def _denominator(var: torch.Tensor, eps: float, e: int, placement: str) -> torch.Tensor:
    """std + eps (or sqrt(var + eps): placement "var"), eps brought into the values' frame 2^e."""
    if placement == "var":
        return torch.sqrt(var + _ldexp(eps, -2 * e))
    return torch.sqrt(var) + _ldexp(eps, -e)


def _whiten_values(x: torch.Tensor, eps: float, fl: Flaws, whole: bool = False) -> torch.Tensor:
    """Eq. 6 on one unit's values (1-D), eps in the same frame as x. ``whole``: the unit
    holds whole groups, so its exact mean is 0 (Eq. 4 centres every group column) and that
    structural mean is used, not a rounded one (spec section 7)."""
    n = x.numel()
    if n == 0 or bool(x.max() == x.min()):
        return torch.zeros_like(x)
    e = _frame(x, eps)
    xs = _scale(x, -e)
    dev = xs if whole and not fl.rounded_unit_mean else xs - _sum(xs) / n
    var = _sum(dev * dev) / (n - fl.formula.whiten_ddof)
    return dev / _denominator(var, eps, e, fl.formula.whiten_placement)


# ------------------------------------------------------------------ validation


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _as_float(x, what: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x, dtype=_F64) if not hasattr(x, "dtype") else torch.as_tensor(x)
    if not x.is_floating_point() or x.is_complex():
        raise _Refusal(InputDtypeError, f"{what} has dtype {x.dtype}; a real floating dtype is required")
    return x


def _check_eps_out(eps, out_dtype):
    try:
        eps = float(eps)
    except (TypeError, ValueError):
        raise _Refusal(OutOfRangeError, f"eps={eps!r} is not a number", True) from None
    if not (math.isfinite(eps) and eps >= 0):
        raise _Refusal(OutOfRangeError, f"eps={eps!r} must be finite and >= 0", True)
    if not (isinstance(out_dtype, torch.dtype) and out_dtype.is_floating_point):
        raise _Refusal(InputDtypeError, f"out_dtype {out_dtype!r} is not a floating dtype", True)
    return eps


def _check_segments(segment_sizes, n: int, local_unit_of_one: bool):
    if segment_sizes is None:
        return [n], False
    sizes = segment_sizes.tolist() if isinstance(segment_sizes, torch.Tensor) else list(segment_sizes)
    if not all(_is_int(s) for s in sizes):
        raise _Refusal(SegmentError, "segment_sizes must be ints")
    if any(s < 0 for s in sizes):
        raise _Refusal(SegmentError, f"segment_sizes {sizes} has a negative size")
    if sum(sizes) != n:
        raise _Refusal(SegmentError, f"segment_sizes sum to {sum(sizes)}, not the {n} local samples")
    if local_unit_of_one and any(s == 1 for s in sizes):
        raise _Refusal(SegmentError, f"unit {sizes.index(1)} holds one sample")
    return [int(s) for s in sizes], True


def _prepare(rewards, group_ids, group_size, weights, fl: Flaws, allow_empty: bool, missing: str = "refuse"):
    """(x, groups, weights, scored): x (N, K) float64 (float32 with the flaw), NaN where not scored;
    each group's row indices, in first-appearance order; under missing="unscored" the rows with a
    scored reward (else None)."""
    if type(missing) is not str or missing not in ("refuse", "unscored"):
        raise _Refusal(InputDtypeError, f"missing must be 'refuse' or 'unscored', got {missing!r}", True)
    x = _as_float(rewards, "rewards")
    if x.dim() == 1:
        x = x[:, None]
    if x.dim() != 2:
        raise _Refusal(ShapeError, f"rewards must be (N, K), got {tuple(x.shape)}")
    n, k = x.shape
    if k == 0 or (n == 0 and not allow_empty):
        raise _Refusal(ShapeError, f"rewards is empty {tuple(x.shape)}")
    if (group_ids is None) == (group_size is None):
        raise _Refusal(GroupError, "pass exactly one of group_ids and group_size", True)
    if group_size is not None:
        if not _is_int(group_size) or group_size < 2 or n % group_size:
            raise _Refusal(GroupError, f"group_size={group_size!r} does not split N={n} into groups of >= 2")
        labels = [i // group_size for i in range(n)]
    else:
        ids = group_ids if isinstance(group_ids, torch.Tensor) else torch.as_tensor(group_ids)
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise _Refusal(GroupError, f"group_ids must be integer labels, got {ids.dtype}")
        if ids.dim() != 1 or ids.shape[0] != n:
            raise _Refusal(ShapeError, f"group_ids has shape {tuple(ids.shape)} for N={n} rows")
        if fl.int32_labels:
            ids = ids.to(torch.int32)  # wraps modulo 2^32: k and 2^32 + k become one group
        if fl.float64_labels:
            ids = ids.to(_F64)  # rounds beyond 2^53: 2^62 and 2^62 + 1 become one group
        labels = ids.tolist()
    if weights is None:
        w = [1.0] * k
    else:
        w = [float(v) for v in (weights.tolist() if isinstance(weights, torch.Tensor) else weights)]
        if len(w) != k:
            raise _Refusal(WeightError, f"weights has length {len(w)}, rewards has K={k}")
        if not all(math.isfinite(v) for v in w):
            raise _Refusal(WeightError, "weights must be finite")
        if not any(v != 0.0 for v in w):
            raise _Refusal(WeightError, "all weights are zero")
        if fl.refuse_big_weights and any(abs(v) > FLOAT32_MAX for v in w):
            raise _Refusal(OutOfRangeError, "a weight is beyond float32's range")
    x = x.to(torch.float32 if fl.float32_internals else _F64)
    if fl.zero_weight_unchecked and any(v == 0.0 for v in w):  # "they contribute nothing": gone, unchecked
        live = [j for j, v in enumerate(w) if v != 0.0]
        x, w = x[:, live], [w[j] for j in live]
    if fl.formula.nan == "zero_first":
        x = torch.where(torch.isnan(x), torch.zeros_like(x), x)
    bad = torch.isinf(x) if missing == "unscored" else ~torch.isfinite(x)  # unscored: a NaN is data
    if n and bool(bad.any()):
        i = int(torch.nonzero(bad)[0, 0])
        raise _Refusal(NonFiniteError, f"reward row {i} is not finite")
    order: dict = {}
    for i, lab in enumerate(labels):
        order.setdefault(lab, []).append(i)
    groups = [torch.tensor(v, dtype=torch.int64, device=x.device) for v in order.values()]
    if fl.formula.singleton != "zero":
        for lab, v in order.items():
            if len(v) < 2:
                raise _Refusal(GroupError, f"group {lab} has 1 sample")
    if fl.float32_weights:
        w = [float(torch.tensor(v, dtype=torch.float32)) for v in w]
    scored = None
    if missing == "unscored":
        scored = torch.ones(n, dtype=torch.bool) if fl.formula.nan == "nan_aware" else ~torch.isnan(x).all(1)
    return x, groups, w, scored


# ---------------------------------------------------------------- Eq. 4 and 7


def _combine(prep, eps: float, fl: Flaws, frame: int | None = None) -> tuple[torch.Tensor, int]:
    """c of :func:`_prepare`'s ``prep`` in a frame 2^-shift (shift > 0 only for weights above
    2^990; ``frame``: that shift, agreed across ranks, whose combined values share one frame)."""
    r, groups, weights, _ = prep
    n, k = r.shape
    z = torch.zeros_like(r)
    for idx in groups:
        for col in range(k):
            x = r[idx, col]
            scored = ~torch.isnan(x)  # missing="unscored": the column's scored members only, z = 0 elsewhere
            if bool(scored.all()):
                z[idx, col] = _standardize(x, eps, fl)
            else:
                z[idx[scored], col] = _standardize(x[scored], eps, fl)  # fewer than two: zeros
    nonzero = [math.frexp(w)[1] for w in weights if w != 0.0 and math.isfinite(w)]
    # the plain sum first; the weights are scaled down only when it overflows (scaling them
    # all would push a small weight's products into the subnormals)
    for shift in (0, max(0, max(nonzero, default=0) - _WEIGHT_EXP_CAP)) if frame is None else (frame,):
        c = torch.zeros(n, dtype=r.dtype, device=r.device)
        parts = torch.zeros_like(c)
        for col, w in enumerate(weights):
            term = z[:, col] * math.ldexp(w, -shift)
            c = c + term
            parts = parts + term.abs()
        if bool(torch.isfinite(c).all()):
            break
    if fl.noise_floor:
        c = torch.where(c.abs() <= 1e-9 * parts, torch.zeros_like(c), c)
    return c, shift


# ------------------------------------------------------------------------ Eq. 6


def _truncate(x: torch.Tensor, out_dtype) -> torch.Tensor:
    """float64 -> bfloat16 rounded toward zero (the flaw: drop the low bits)."""
    y = x.to(torch.float32)
    bits = y.view(torch.int32)
    bits = torch.where(y.to(_F64).abs() > x.abs(), bits - 1, bits)  # float32 truncation
    return (bits & ~0xFFFF).view(torch.float32).to(out_dtype)  # then bfloat16's: exact


def _round(a: torch.Tensor, out_dtype, fl: Flaws) -> torch.Tensor:
    """One correct rounding of float64 values into ``out_dtype`` (nearest even; float16 and
    bfloat16 through float32 rounded to odd: impl's ``round_to``, as torch's own cast rounds twice)."""
    if out_dtype in (torch.float16, torch.bfloat16) and a.dtype == _F64:
        if fl.truncate_bfloat16 and out_dtype == torch.bfloat16:
            return _truncate(a, out_dtype)
        if fl.double_rounding:
            return a.to(torch.float32).to(out_dtype)  # nearest even twice: a tie made by the first
    return round_to(a, out_dtype)


def _cast(a: torch.Tensor, out_dtype, fl: Flaws) -> torch.Tensor:
    out = _round(a, out_dtype, fl)
    if not bool(torch.isfinite(out).all()):
        raise _Refusal(OutOfRangeError, "a whitened value does not survive the cast to the output dtype")
    return out


def _whole_units(groups: list | None, sizes: list) -> list:
    """Per unit: does every group with a member in it have all its members in it?"""
    if groups is None:
        return [False] * len(sizes)
    unit = [j for j, s in enumerate(sizes) for _ in range(s)]
    spanned = [{unit[i] for i in idx.tolist()} for idx in groups]
    cut = set().union(*(units for units in spanned if len(units) > 1))
    return [j not in cut for j in range(len(sizes))]


def _whiten_local(c: torch.Tensor, sizes: list, eps: float, fl: Flaws, groups=None, scored=None) -> torch.Tensor:
    """``scored`` (missing="unscored"): the rows Eq. 6 takes; the others get 0."""
    if fl.formula.whiten_scope == "batch":
        sizes = [c.numel()]
    a = torch.zeros_like(c)
    start = 0
    for s, whole in zip(sizes, _whole_units(groups, sizes)):
        rows = slice(start, start + s) if scored is None else start + torch.nonzero(scored[start:start + s]).view(-1)
        a[rows] = _whiten_values(c[rows], eps, fl, whole)
        start += s
    return a


def _agree(group, problem: _Refusal | None, sizes, given: bool, n: int, fl: Flaws):
    """One process: its refusal raised. Several: one fixed-shape all-reduce of every rank's
    facts; all raise together or none does."""
    if group is None or (problem is not None and fl.local_raise):
        if problem is not None:
            raise problem.cls(problem.msg)
        return None
    import torch.distributed as dist

    world, me = dist.get_world_size(group), dist.get_rank(group)
    table = torch.zeros(world, 5, dtype=torch.int64)
    code = 0 if problem is None else _CODES.index(problem.cls) if problem.cls in _CODES else 1
    table[me] = torch.tensor([1, code, len(sizes) if sizes else 0, int(given), n])
    dist.all_reduce(table, group=group)
    rows = table.tolist()
    reasons = [f"rank {r}: {_CODES[row[1]].__name__}" for r, row in enumerate(rows) if row[1]]
    healthy = [row for row in rows if not row[1]]
    if len({row[2] for row in healthy}) > 1 or (len({row[3] for row in healthy}) > 1
                                                 and max(row[2] for row in healthy) > 1):
        reasons.append("ranks disagree on the whitening units (" + ", ".join(
            f"rank {r}: {row[2] if row[3] else 'None'}" for r, row in enumerate(rows) if not row[1]) + ")")
    if reasons:
        raise DistributedError("refused on every rank: " + "; ".join(reasons))
    return rows


def _whiten_distributed(group, c: torch.Tensor, sizes: list, eps: float, fl: Flaws, rows,
                        groups=None, scored=None) -> torch.Tensor:
    """``scored`` (missing="unscored"): this rank's rows Eq. 6 takes; the unit-of-one check
    reads the row counts, the gather only the scored rows' values, the others get 0."""
    import torch.distributed as dist

    world, me = dist.get_world_size(group), dist.get_rank(group)
    if fl.formula.whiten_scope == "batch":
        sizes = [c.numel()]
    s = len(sizes)
    counts = torch.zeros(world, 2 * s, dtype=torch.int64)  # the sizes, then "my part cuts a group"
    counts[me] = torch.tensor(sizes + [int(not w) for w in _whole_units(groups, sizes)], dtype=torch.int64)
    dist.all_reduce(counts, group=group)
    whole = [not x for x in counts[:, s:].sum(0).tolist()]  # groups never span ranks
    counts = counts[:, :s]
    totals = counts.sum(0).tolist()
    if any(t == 1 for t in totals):
        raise DistributedError(f"refused on every rank: unit {totals.index(1)} holds one sample across ranks")
    if fl.local_statistics:
        return _whiten_local(c, sizes, eps, fl, scored=scored)
    every = c
    if scored is not None:  # the scored rows' counts per unit and rank, then their values only
        kept = torch.zeros(world, s, dtype=torch.int64)
        kept[me] = torch.tensor([int(part.sum()) for part in torch.split(scored, sizes)], dtype=torch.int64)
        dist.all_reduce(kept, group=group)
        counts, c = kept, c[scored]
    width = max(row[4] for row in rows)
    buf = torch.zeros(world, max(width, 1), dtype=_F64)
    buf[me, :c.numel()] = c.to(_F64)
    dist.all_reduce(buf, group=group)  # an exact gather: x + 0 + ... + 0
    cnt = counts.tolist()
    by_unit = [torch.split(buf[r, :sum(cnt[r])], cnt[r]) for r in range(world)]  # each rank's values, by unit
    a = torch.zeros_like(c)
    start = 0
    for u in range(s):
        unit_a = _whiten_values(torch.cat([by_unit[r][u] for r in range(world)]).to(c.dtype), eps, fl, whole[u])
        before = sum(cnt[r][u] for r in range(me))
        a[start:start + cnt[me][u]] = unit_a[before:before + cnt[me][u]]
        start += cnt[me][u]
    if scored is not None:
        return torch.zeros_like(every).index_put_((torch.nonzero(scored).view(-1),), a)
    return a


# ---------------------------------------------------------------------- the API


def _sized(fl: Flaws, x) -> Flaws:
    """The large_batch_float32 flaw: a call of more than 64 rows computed in float32 with ddof 0."""
    try:
        n = len(x)
    except TypeError:
        return fl
    if fl.large_batch_float32 and n > 64:
        return dataclasses.replace(fl, float32_internals=True,
                                   formula=dataclasses.replace(fl.formula, group_ddof=0, whiten_ddof=0))
    return fl


def _gdpo(fl: Flaws, rewards, *, group_ids=None, group_size=None, weights=None, segment_sizes=None,
          process_group=None, eps=1e-4, out_dtype=torch.float32, missing="refuse"):
    fl = _sized(fl, rewards)
    distributed = process_group is not None
    problem, prep, sizes, given = None, None, None, False
    try:
        eps = _check_eps_out(eps, out_dtype)
        prep = _prepare(rewards, group_ids, group_size, weights, fl, allow_empty=distributed, missing=missing)
        sizes, given = _check_segments(segment_sizes, prep[0].shape[0], local_unit_of_one=not distributed)
    except _Refusal as r:
        problem = r.flawed(fl)
    rows = _agree(process_group, problem, sizes, given, prep[0].shape[0] if prep is not None else 0, fl)
    groups, scored = prep[1], prep[3]
    c, shift = _combine(prep, eps, fl)
    if not distributed:
        if fl.mutates_rewards and isinstance(rewards, torch.Tensor):
            rewards.mul_(0.5)
        return _cast(_whiten_local(c, sizes, _ldexp(eps, -shift), fl, groups, scored), out_dtype, fl)
    import torch.distributed as dist

    shifts = torch.tensor([shift], dtype=torch.int64)  # one frame for every rank's c (found by the
    dist.all_reduce(shifts, op=dist.ReduceOp.MAX, group=process_group)  # deep search: ranks used their own)
    if int(shifts) != shift:
        c, shift = _combine(prep, eps, fl, frame=int(shifts))
    a = _whiten_distributed(process_group, c, sizes, _ldexp(eps, -shift), fl, rows, groups, scored)
    return _cast(a, out_dtype, fl)


def _normalize_rewards(fl: Flaws, rewards, *, group_ids=None, group_size=None, weights=None, eps=1e-4,
                       missing="refuse"):
    fl = _sized(fl, rewards)
    try:
        eps = _check_eps_out(eps, torch.float64)
        prep = _prepare(rewards, group_ids, group_size, weights, fl, allow_empty=False, missing=missing)
    except _Refusal as r:
        r = r.flawed(fl)
        raise r.cls(r.msg) from None
    c, shift = _combine(prep, eps, fl)
    c = _scale(c.to(_F64), shift) if shift else c.to(_F64)
    if not bool(torch.isfinite(c).all()):
        raise OutOfRangeError("Eq. 7 overflows float64: scale the weights down")
    return c


def _whiten(fl: Flaws, values, *, segment_sizes=None, process_group=None, eps=1e-4, out_dtype=torch.float32):
    fl = _sized(fl, values)
    distributed = process_group is not None
    problem, v, sizes, given = None, None, None, False
    try:
        eps = _check_eps_out(eps, out_dtype)
        v = _as_float(values, "values")
        if v.dim() != 1:
            raise _Refusal(ShapeError, "values must be 1-D")
        v = v.to(torch.float32 if fl.float32_internals else _F64)
        if not bool(torch.isfinite(v).all()):
            raise _Refusal(NonFiniteError, "values must be finite")
        sizes, given = _check_segments(segment_sizes, v.numel(), local_unit_of_one=not distributed)
    except _Refusal as r:
        problem = r.flawed(fl)
    rows = _agree(process_group, problem, sizes, given, v.numel() if v is not None else 0, fl)
    if not distributed:
        return _cast(_whiten_local(v, sizes, eps, fl), out_dtype, fl)
    return _cast(_whiten_distributed(process_group, v, sizes, eps, fl, rows), out_dtype, fl)


def _make(name: str, fl: Flaws, doc: str, **declared):
    fn = functools.partial(_gdpo, fl)
    fn.__name__ = fn.__qualname__ = name  # type: ignore[attr-defined]
    fn.__doc__ = doc
    fn.normalize_rewards = functools.partial(_normalize_rewards, fl)  # type: ignore[attr-defined]
    fn.whiten = functools.partial(_whiten, fl)  # type: ignore[attr-defined]
    fn.flaw = doc  # type: ignore[attr-defined]
    for key, value in declared.items():  # declarations (gdpo_certified): on the stages too
        setattr(fn, key, value)
        setattr(fn.whiten, key, value)
    return fn


@dataclasses.dataclass(frozen=True)
class Control:
    name: str
    flaw: str  # one line, for the table
    fn: object

    @property
    def target(self) -> str:
        return f"conformance.controls:{self.name}"


def _formula(**choices) -> Flaws:
    """The base computing a variant of the catalogue (conformance.formulas) instead of the paper's."""
    return Flaws(formula=Variant(**choices))


_SPECS = (
    ("one_pass_variance", Flaws(one_pass=True), "Eq. 4 variance one-pass: (sum x^2 - (sum x)^2/n)/(n-1), float64"),
    ("float32_weights", Flaws(float32_weights=True), "weights rounded to float32 before Eq. 7"),
    ("float32_internals", Flaws(float32_internals=True), "every stage computed in float32"),
    ("naive_centring", Flaws(naive_centring=True), "float64 mean, then x - mean (not shift-invariant)"),
    ("noise_floor", Flaws(noise_floor=True), "|c| <= 1e-9 sum_k |w_k z_k| treated as rounding and set to 0"),
    ("merged_units", _formula(whiten_scope="batch"), "Eq. 6 over the whole batch: segment_sizes ignored"),
    ("rank_local_statistics", Flaws(local_statistics=True), "Eq. 6 statistics of each rank's part, no reduction"),
    ("local_raise", Flaws(local_raise=True), "a rank raises its own refusal before the agreement collective"),
    ("eps_in_sqrt", _formula(group_placement="var", whiten_placement="var"),
     "sqrt(var + eps) instead of std + eps (Eq. 4 and Eq. 6)"),
    ("biased_std", _formula(group_ddof=0, whiten_ddof=0), "biased std (ddof 0) at Eq. 4 and Eq. 6"),
    ("nan_to_zero", _formula(nan="zero_first"), "NaN rewards silently replaced by 0"),
    ("singleton_zero", _formula(singleton="zero"), "a group of one sample gives z = 0 instead of a GroupError"),
    ("double_rounding", Flaws(double_rounding=True), "float16/bfloat16 output rounded twice, float64 -> float32 -> "
     "format, nearest even each time (what torch's float64 `.to(float16)` does)"),
    ("truncated_bfloat16", Flaws(truncate_bfloat16=True), "bfloat16 output rounded toward zero (low bits dropped)"),
    ("large_batch_float32", Flaws(large_batch_float32=True), "correct up to 64 rows; beyond, float32 internals "
     "and biased std (ddof 0)"),
    ("int32_labels", Flaws(int32_labels=True), "group_ids cast to int32 (wrapping) before grouping: k and "
     "2^32 + k share a group"),
    ("labels_through_float64", Flaws(float64_labels=True), "group_ids cast to float64 before grouping: labels "
     "beyond 2^53 closer than float64's spacing (2^62 and 2^62 + 1) share a group"),
    ("big_groups_float32", Flaws(big_groups_float32=True), "Eq. 4 statistics of a group of more than 64 rows in "
     "float32 (a size-dependent fast path; correct up to 64)"),
    ("zero_weight_columns_unchecked", Flaws(zero_weight_unchecked=True), "columns of weight 0 dropped before "
     "validation: a NaN or infinite reward there is never refused"),
    ("refuses_big_weights", Flaws(refuse_big_weights=True), "a weight beyond float32's range refused "
     "(OutOfRangeError): the contract computes it in float64"),
    ("base_class_refusals", Flaws(base_class_refusals=True), "bad group arguments, eps and out_dtype refused as "
     "the base GDPOError, not the class the contract names"),
    ("mutates_rewards", Flaws(mutates_rewards=True), "correct advantages, but the caller's rewards tensor is "
     "overwritten in place"),
    ("rounded_unit_mean", Flaws(rounded_unit_mean=True), "Eq. 6 subtracts the unit's rounded float64 mean even "
     "where the unit holds whole groups (its structural mean is 0): a group without signal gets rounding noise"),
    ("unscored_rows_whitened", _formula(nan="nan_aware"), "missing=\"unscored\": a row with no scored reward "
     "kept in Eq. 6's statistics (its c = 0 counted with the scored rows) instead of left out"),
    ("claims_certified_rounding", Flaws(), "the correct base (float64, one rounding into the output dtype) declaring "
     "certified rounding (gdpo_certified = True) without certifying it: off by one ulp next to a midpoint",
     {"gdpo_certified": True}),
)

baseline = _make("baseline", Flaws(), "none: the correct base every control differs from by one flaw")
CONTROLS: dict[str, Control] = {}
for _name, _fl, _doc, *_declared in _SPECS:
    globals()[_name] = _make(_name, _fl, _doc, **(_declared[0] if _declared else {}))
    CONTROLS[_name] = Control(_name, _doc, globals()[_name])
BASELINE = Control("baseline", baseline.flaw, baseline)
