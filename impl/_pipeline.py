"""Orchestration: validation, the one host read, and the distributed protocol.

Local calls (no process group) raise host-side problems at once, compute on the
device, read the facts row once and raise its first problem. Distributed calls
never raise before the agreement: every local problem, including an unexpected
exception, becomes a code in this rank's row of the agreement table.

Collectives per distributed call (independent of the number of units):

1. ``all_reduce(SUM)`` of the int64 (world_size, ROW_WIDTH) agreement table;
   the host reads it (the call's one host synchronisation) and every rank
   raises the same :class:`DistributedError` or none does;
2. ``all_reduce(SUM)`` of the (world_size, S, 7) float64 statistics table, sent
   as its int64 bit pattern: each rank fills its own slice, so the sum is an
   exact gather (x + 0 on the bits), on every backend and device that can
   all-reduce int64 (gloo on CPU and CUDA, NCCL);
3. only when the output dtype's range is below the Samuelson bound sqrt(N) of
   a whitened value (float8 output and more than ~2e5 samples): an int64
   all-reduce of "my values do not survive the cast", so all ranks raise together.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from impl import _problems as P
from impl import _whiten as W
from impl._inputs import (
    Problem,
    check_eps,
    check_out_dtype,
    check_rewards,
    check_segments,
    check_values,
)
from impl._normalize import first_true, group_signal, kind_of, normalize
from impl._segments import take

_F64 = torch.float64
_I64 = torch.int64


# --- helpers -----------------------------------------------------------------


def _facts_row(host: dict[int, int], device_facts: dict[int, torch.Tensor], device) -> torch.Tensor:
    values = [0] * P.ROW_WIDTH
    for col, v in host.items():
        values[col] = int(v)
    row = W.host_to_device(values, _I64, device)
    if device_facts:
        zero = torch.zeros((), dtype=_I64, device=device)
        block = torch.stack([device_facts.get(c, zero).to(_I64).reshape(()) for c in P.DEVICE_FIELDS])
        row[P.DEVICE_FIELDS[0]: P.DEVICE_FIELDS[-1] + 1] = block
    return row


def _value_facts(v64: torch.Tensor, unit: torch.Tensor) -> dict[int, torch.Tensor]:
    n = v64.shape[0]
    bad = first_true(~torch.isfinite(v64))
    facts = {P.NF_VALUE: torch.where(bad < n, bad + 1, 0)}
    if n:
        at = bad.clamp(max=n - 1)
        facts[P.NF_VALUE_KIND] = kind_of(take(v64, at))
        facts[P.NF_VALUE_UNIT] = take(unit, at)
    return facts


def cast_limit(dtype: torch.dtype) -> float:
    """Smallest magnitude that no longer rounds to a finite value of ``dtype``
    (max + half an ulp at max); inf for float64."""
    if dtype == _F64:
        return math.inf
    fi = torch.finfo(dtype)
    return fi.max + math.ldexp(1.0, math.frexp(fi.max)[1] - 1) * fi.eps / 2


def cast_reachable(dtype: torch.dtype, total_rows: int) -> bool:
    """Can a whitened value fail the cast? |a| <= (n-1)/sqrt(n) < sqrt(N)
    (Samuelson's inequality; eps only shrinks a), with a margin for rounding."""
    return math.sqrt(max(total_rows, 0)) * (1.0 + 2.0 ** -20) >= cast_limit(dtype)


def _units_of_one(sizes: list[int]) -> None:
    for j, s in enumerate(sizes):
        if s == 1:
            raise Problem(P.P_UNIT_OF_ONE, j)


def _finish_local(a: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    out = a.to(out_dtype)
    if cast_reachable(out_dtype, a.shape[0]):
        limit = cast_limit(out_dtype)
        bad = first_true(a.abs() >= limit)
        at = int(bad)  # a second host read, only where the cast can fail at all
        if at < a.shape[0]:
            raise P.OutOfRangeError(
                f"whitened value {float(a[at])!r} at row {at} does not survive the cast to "
                f"{P.dtype_name(P.dtype_code(out_dtype))} (largest finite {torch.finfo(out_dtype).max!r}); "
                "choose a wider out_dtype")
    return out


# --- local (single-process) calls ----------------------------------------------


def normalize_local(rewards, group_ids, group_size, weights, eps):
    try:
        eps = check_eps(eps)
        inp = check_rewards(rewards, group_ids, group_size, weights, allow_empty_rows=False)
    except Problem as p:
        raise p.error() from None
    norm = normalize(inp, eps)
    host = {P.PRESENT: 1, P.K: inp.k, P.BY_LABEL: int(inp.labels is not None)}
    row = _facts_row(host, norm.facts, norm.c.device).tolist()  # the one host read
    P.raise_local(row)
    return norm, row


def normalize_rewards(rewards, group_ids, group_size, weights, eps):
    return normalize_local(rewards, group_ids, group_size, weights, eps)[0].c


def group_has_signal(rewards, group_ids, group_size, weights, eps):
    norm, row = normalize_local(rewards, group_ids, group_size, weights, eps)
    return group_signal(norm, row[P.GROUPS])


def whiten_local(values, segment_sizes, eps, out_dtype):
    try:
        eps = check_eps(eps)
        out_dtype = check_out_dtype(out_dtype)
        v = check_values(values)
        sizes, _ = check_segments(segment_sizes, v.shape[0])
        _units_of_one(sizes)
    except Problem as p:
        raise p.error() from None
    v64 = v.to(_F64)
    loc = W.local_table(v64, sizes, eps)
    st = W.merge(loc.table[None])
    a = W.apply(v64, loc.unit, st, eps)
    P.raise_local(_facts_row({P.PRESENT: 1}, _value_facts(v64, loc.unit), v64.device).tolist())
    return _finish_local(a, out_dtype), st


def gdpo_local(rewards, group_ids, group_size, weights, segment_sizes, eps, out_dtype):
    try:
        eps = check_eps(eps)
        out_dtype = check_out_dtype(out_dtype)
        inp = check_rewards(rewards, group_ids, group_size, weights, allow_empty_rows=False)
        sizes, _ = check_segments(segment_sizes, inp.n)
        _units_of_one(sizes)
    except Problem as p:
        raise p.error() from None
    norm = normalize(inp, eps)
    loc = W.local_table(norm.c, sizes, eps)
    st = W.merge(loc.table[None])
    a = W.apply(norm.c, loc.unit, st, eps)
    host = {P.PRESENT: 1, P.K: inp.k, P.BY_LABEL: int(inp.labels is not None)}
    P.raise_local(_facts_row(host, norm.facts, norm.c.device).tolist())  # the one host read
    return _finish_local(a, out_dtype), st


# --- distributed calls ----------------------------------------------------------


def _comm_device(group, data_device: torch.device) -> torch.device:
    if str(dist.get_backend(group)).lower() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return data_device


def _all_reduce(tensor, op, group, api, step, rank):
    try:
        dist.all_reduce(tensor, op=op, group=group)
    except Exception as exc:  # a peer died, timed out or the backend refused
        raise P.DistributedError(
            f"{api}: collective {step} failed on rank {rank} ({type(exc).__name__}: {exc}); "
            "a peer rank may have died or timed out") from exc


def _device_of(x) -> torch.device:
    return x.device if isinstance(x, torch.Tensor) else torch.device("cpu")


def run_distributed(api, group, *, values=None, rewards=None, group_ids=None, group_size=None,
                    weights=None, segment_sizes=None, eps, out_dtype):
    """Whitening (api whiten) or the whole pipeline (api gdpo) across ``group``."""
    name = P.API_NAMES[api]
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    data_device = _device_of(rewards if api == P.API_GDPO else values)
    host = {P.PRESENT: 1, P.API: api}
    device_facts: dict[int, torch.Tensor] = {}
    local_exc = None
    v64 = loc = None
    try:
        eps = check_eps(eps)
        host[P.EPS_BITS] = P.float_bits(eps)
        out_dtype = check_out_dtype(out_dtype)
        host[P.OUT_DTYPE] = P.dtype_code(out_dtype)
        if api == P.API_GDPO:
            inp = check_rewards(rewards, group_ids, group_size, weights, allow_empty_rows=True)
            n, dtype = inp.n, inp.rewards.dtype
            host.update({P.K: inp.k, P.WEIGHTS_FP: P.weights_fingerprint(inp.weights),
                         P.BY_LABEL: int(inp.labels is not None)})
        else:
            v = check_values(values)
            n, dtype = v.shape[0], v.dtype
        host.update({P.ROWS: n, P.DTYPE: P.dtype_code(dtype), P.DEVICE: P.device_code(data_device)})
        sizes, given = check_segments(segment_sizes, n)
        host.update({P.UNITS: len(sizes), P.SEG_NONE: int(not given)})
        for j, s in enumerate(sizes[: P.COUNT_SLOTS]):
            host[P.COUNTS + j] = s
        if api == P.API_GDPO:
            norm = normalize(inp, eps)
            v64 = norm.c
            device_facts.update(norm.facts)
        else:
            v64 = v.to(_F64)
        loc = W.local_table(v64, sizes, eps)
        if api == P.API_WHITEN:
            device_facts.update(_value_facts(v64, loc.unit))
    except Problem as p:
        local_exc = p.error()
        host.update({P.HOST_CODE: p.code, P.HOST_A: p.a, P.HOST_B: p.b, P.HOST_C: p.c})
    except Exception as exc:  # never leave the peers waiting in the agreement
        local_exc = exc
        host.update({P.HOST_CODE: P.P_LOCAL_FAILURE})
    if local_exc is not None:
        device_facts = {}

    comm = _comm_device(group, data_device)
    row = _facts_row(host, device_facts, data_device if local_exc is None else torch.device("cpu"))
    table = torch.zeros(world, P.ROW_WIDTH, dtype=_I64, device=comm)
    table[rank] = row.to(comm)
    _all_reduce(table, dist.ReduceOp.SUM, group, name, 1, rank)
    agreed = table.tolist()  # the call's one host synchronisation
    reasons = P.table_problems(agreed)
    if reasons:
        raise P.DistributedError(P.refusal_message(reasons, agreed)) from local_exc
    units = agreed[0][P.UNITS]
    lonely = [_lonely_unit(j, [r[P.COUNTS + j] for r in agreed])
              for j in range(min(units, P.COUNT_SLOTS)) if sum(r[P.COUNTS + j] for r in agreed) == 1]
    if lonely:
        raise P.DistributedSegmentError(P.refusal_message(lonely, agreed))

    stats = torch.zeros(world, units, W.COLS, dtype=_F64, device=comm)
    stats[rank] = loc.table.to(comm)
    _all_reduce(stats.view(_I64), dist.ReduceOp.SUM, group, name, 2, rank)
    if units > P.COUNT_SLOTS:  # counts of the units the agreement table had no slot for
        counts = stats[:, P.COUNT_SLOTS:, 0].T.tolist()
        reasons = [_lonely_unit(P.COUNT_SLOTS + j, c) for j, c in enumerate(counts) if sum(c) == 1]
        if reasons:
            raise P.DistributedSegmentError(P.refusal_message(reasons, agreed))
    st = W.merge(stats.to(data_device))
    a = W.apply(v64, loc.unit, st, eps)
    out = a.to(out_dtype)
    total = sum(r[P.ROWS] for r in agreed)
    if cast_reachable(out_dtype, total):
        bad = torch.zeros(world, dtype=_I64, device=comm)
        bad[rank] = (a.abs() >= cast_limit(out_dtype)).sum().to(comm)
        _all_reduce(bad, dist.ReduceOp.SUM, group, name, 3, rank)
        counts = bad.tolist()
        if any(counts):
            where = "; ".join(f"rank {r}: {c} value(s)" for r, c in enumerate(counts) if c)
            raise P.DistributedOutOfRangeError(
                f"{name} refused on all {world} ranks: whitened values do not survive the cast to "
                f"{P.dtype_name(P.dtype_code(out_dtype))} (largest finite {torch.finfo(out_dtype).max!r}) "
                f"({where}); choose a wider out_dtype")
    return out, st


def _lonely_unit(j: int, per_rank: list) -> str:
    holder = next(r for r, c in enumerate(per_rank) if c)
    return (f"unit {j} holds a single sample across all ranks (on rank {holder}); "
            "Eq. 6 needs at least 2 (unbiased std)")
