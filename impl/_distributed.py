"""The distributed protocol (spec/gdpo.md section 5): the local spine's stages around the
collectives. A rank never raises before the agreement: every local problem, an unexpected
exception included, becomes a code in its row. Collectives per call, each an ``all_reduce(SUM)``:
1. the int64 (world_size, ROW_WIDTH) agreement table, whose host read is the call's one host
synchronisation; 2. the (world_size, S + 1, 7) float64 statistics as int64 bits (an exact gather),
the extra row a failure flag; 3. only where a float8 cast can fail (more than ~2e5 rows) or Eq. 7
may overflow (labelled groups, huge weights): those findings and the failure flag.
"""

from __future__ import annotations

import contextvars
import itertools

import torch
import torch.distributed as dist

from impl import _certify, _pipeline
from impl import _problems as P
from impl import _whiten as W
from impl._certify import dd as _dd
from impl._pipeline import cast_limit, cast_reachable
from impl._inputs import Problem, _shown, check_call
from impl._eq47 import overflow_possible
from impl._segments import host_to_device
from spec.constants import REFUSAL_WORDS_BYTES as WORDS_BYTES  # a refusing rank's own words, UTF-8, cut beyond

_F64, _I64 = torch.float64, torch.int64
_WORDS_COLS = WORDS_BYTES // 8
#: collective 3's row: Eq. 7 overflow (3 fields), cast count, failure flag, the first value
#: that does not survive the cast (its row on this rank, its float64 bits)
_LATE_COLS, _FAILED = 7, 4
#: The reward names of an adapter's call, digested with the weights (spec/gdpo.md section 5, rule 6).
COLUMN_NAMES: contextvars.ContextVar = contextvars.ContextVar("gdpo_column_names", default=None)
#: This process's calls whose process_group was no group (``_group_of``): every agreement row
#: carries the count, and while the ranks' counts differ every agreement is refused (rule 5).
_UNJOINED = [0]


def _through_stats(plan, device, x: torch.Tensor | None = None):
    """(loc, facts, statistics' table on ``device``) of :func:`impl._pipeline.through_stats` on
    the rewards (whiten: the values ``x``); a rank without rows has empty statistics."""
    x = plan.inp.rewards if x is None else x
    if x.shape[0]:
        dev = _pipeline.through_stats(plan, x, {})
    else:
        c = x.new_empty(0, dtype=_F64)
        dev = _pipeline.Device({}, c=c, loc=W.eq6_stats(plan, c))
    return dev.loc, dev.facts, dev.loc.table(device)


def _device_row(host: dict[int, int], facts: dict, device) -> torch.Tensor:
    """This rank's row of the agreement table on ``device``: host fields, then the device fields
    (0 where ``facts`` has none); no host read."""
    values = [0] * P.ROW_WIDTH
    for col, v in host.items():
        values[col] = int(v)
    row = host_to_device(values, _I64, device)
    if facts:
        zero = torch.zeros((), dtype=_I64, device=device)
        block = torch.stack([facts.get(c, zero).to(_I64).reshape(()) for c in P.DEVICE_FIELDS])
        row[P.DEVICE_FIELDS[0]: P.DEVICE_FIELDS[-1] + 1] = block
    return row


def _comm_device(group, data_device: torch.device) -> torch.device:
    """Where the collectives' tensors live: NCCL's GPU, else CUDA data's device, else the CPU (a
    meta tensor's all-reduce would return without reaching the peers)."""
    if str(dist.get_backend(group)).lower() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return data_device if data_device.type == "cuda" else torch.device("cpu")


def _all_reduce(tensor, op, group, api, step, rank):
    try:
        dist.all_reduce(tensor, op=op, group=group)
    except Exception as exc:  # a peer died, timed out or the backend refused
        raise P.DistributedError(
            f"{api}: collective {step} failed on rank {rank} ({type(exc).__name__}: {exc}); "
            "a peer rank may have died or timed out") from exc


def run_distributed(api, group, *, values=None, rewards=None, group_ids=None, group_size=None,
                    weights=None, segment_sizes=None, eps, out_dtype, refused: Exception | None = None,
                    missing="refuse", diagnostics=None, certified=None):
    """whiten or gdpo_advantages (``api``) across ``group``: (output, the merged statistics), every
    argument but ``group`` checked inside the agreement. ``refused``: an adapter's refusal of
    this rank's input: the rank computes nothing and joins the agreement refused (P_REFUSED)."""
    name = P.API_NAMES[api]
    world, rank = _group_of(api, group, refused)
    missed = _UNJOINED[0]  # this process's calls that joined no group, in every agreement row
    data = rewards if api == P.API_GDPO else values
    data_device = data.device if isinstance(data, torch.Tensor) else torch.device("cpu")
    host = {P.PRESENT: 1, P.API: api, P.UNJOINED: missed}
    comm = _comm_device(group, data_device)
    device_facts: dict[int, torch.Tensor] = {}
    local_exc = loc = inp = sizes = buf = plan = None
    try:
        if refused is not None:
            raise Problem(P.P_REFUSED, P.refusal_code(refused))
        call = check_call(host, rewards=rewards, group_ids=group_ids, group_size=group_size, weights=weights,
                          values=values, whiten=api == P.API_WHITEN, segment_sizes=segment_sizes, eps=eps,
                          out_dtype=out_dtype, missing=missing, diagnostics=diagnostics, certified=certified,
                          ranks=True, names=COLUMN_NAMES.get())
        inp, v, sizes, eps, out_dtype = call.inp, call.values, call.sizes, call.eps, call.out_dtype
        plan = _pipeline.distributed(call, _pipeline.WHITEN if inp is None else _pipeline.GDPO)
        if plan.scored is not None:
            host[P.UNSCORED] = plan.scored.unscored
        if plan.prep is not None:  # labelled groups: phase one's facts (Eq. 4/7 after the agreement)
            device_facts.update(plan.prep.facts)
        else:  # contiguous groups and whiten: all local work before the agreement
            loc, facts, mine = _through_stats(plan, data_device, v)
            device_facts.update(facts)
        if v is not None and v.shape[0]:  # the unit of the first non-finite value
            ends = host_to_device(list(itertools.accumulate(sizes)), _I64, data_device)
            device_facts[P.NF_VALUE_UNIT] = torch.searchsorted(ends, device_facts[P.NF_VALUE], right=True)
        # Collectives 2 and 3's buffer now: after the agreement a failing rank allocates nothing.
        buf = _Buffers(world, len(sizes), comm, row_counts=plan.scored is not None, certified=plan.certify)
        if plan.scored is not None:
            buf.row_counts[rank] = torch.tensor(sizes[P.COUNT_SLOTS:], dtype=_F64, device="cpu").to(comm)
        if loc is not None:
            buf.stats[rank, :len(sizes)] = mine.to(comm)
    except Problem as p:
        local_exc = p.error() if refused is None else refused
        host.update({P.HOST_CODE: p.code, P.HOST_A: p.a, P.HOST_B: p.b, P.HOST_C: p.c})
    except Exception as exc:  # never leave the peers waiting in the agreement
        local_exc = exc
        host.update({P.HOST_CODE: P.P_LOCAL_FAILURE})

    # The agreement table and the buffer a refusal's words travel in, allocated before joining.
    flat = torch.zeros(world * (P.ROW_WIDTH + _WORDS_COLS), dtype=_I64, device=comm)
    table = flat[: world * P.ROW_WIDTH].view(world, P.ROW_WIDTH)
    words_buf = flat[world * P.ROW_WIDTH:].view(world, _WORDS_COLS)
    told = local_exc  # the exception this rank's row describes
    try:
        table[rank] = _device_row(host, {} if local_exc else device_facts,
                                 data_device if local_exc is None else torch.device("cpu")).to(comm)
    except Exception as exc:  # noqa: BLE001 - e.g. a host field beyond int64: still join, refused
        local_exc = local_exc or exc
        told = exc
        table[rank] = _device_row({P.PRESENT: 1, P.API: api, P.UNJOINED: missed, P.HOST_CODE: P.P_LOCAL_FAILURE}, {},
                                 torch.device("cpu")).to(comm)
    _all_reduce(table, dist.ReduceOp.SUM, group, name, 1, rank)
    agreed = table.tolist()  # the call's one host synchronisation
    reasons = P.table_problems(agreed)
    if reasons:
        weights_differ = P.weights_disagree(agreed)
        # one more collective, the same decision on every rank: only with every rank in this call
        in_step = all(r[P.PRESENT] == 1 for r in agreed) and len({r[P.UNJOINED] for r in agreed}) == 1
        if in_step and (weights_differ or any(row[P.HOST_CODE] for row in agreed)):
            if agreed[rank][P.HOST_CODE]:
                words = _own_words(told, group, words_buf, rank)
            else:  # a healthy rank speaks only to show its weights
                words = _own_words(None, group, words_buf, rank, text=_weights_text(inp) if weights_differ else None)
            reasons = P.table_problems(agreed, words)
        raise P.DistributedError(_refusal(reasons, agreed, group)) from local_exc
    units = agreed[0][P.UNITS]
    _refuse_lonely(0, [[r[P.COUNTS + j] for r in agreed] for j in range(min(units, P.COUNT_SLOTS))], agreed, group)

    # After the agreement every rank still answers: a local failure (only labelled groups
    # compute here) becomes a flag in this rank's part of collective 2, or of collective 3.
    labelled = api == P.API_GDPO and any(r[P.BY_LABEL] for r in agreed)
    longest = max((r[P.N_MAX] if r[P.BY_LABEL] else r[P.GROUP_SIZE]) for r in agreed)
    check_overflow = labelled and overflow_possible(inp.weights, longest)  # same on every rank
    reachable = cast_reachable(out_dtype, sum(r[P.ROWS] for r in agreed))
    late = reachable or check_overflow  # collective 3 runs: the same decision on every rank
    failure, overflow_row = None, {}
    try:
        plan = _pipeline.agreed(plan, agreed, rank)  # labelled groups: their layout (it needs G and n_max)
        if plan.prep is not None:  # labelled groups compute Eq. 4/7 now
            loc, overflow_row, mine = _through_stats(plan, data_device)
            buf.stats[rank, :units] = mine.to(comm)
    except Exception as exc:  # noqa: BLE001 - reported to the peers, raised here
        failure = exc
        buf.bits[rank, units, 0] = 1  # "my statistics are missing": a flag, not data
    dd_rows = None
    if buf.dd is not None and failure is None:  # the certificate's statistics (impl._certify)
        try:
            gdpo = api == P.API_GDPO
            dd_rows = _dd.rows(inp, eps) if gdpo else _dd.values(v, eps)
            buf.dd[rank] = (_dd.unsafe_table(sizes, data_device) if dd_rows is None else
                            _dd.table(*dd_rows, sizes, plan.whole if gdpo else None)).to(comm)
        except Exception as exc:  # noqa: BLE001 - reported to the peers, raised here
            failure = exc
            buf.bits[rank, units, 0] = 1

    _all_reduce(buf.bits, dist.ReduceOp.SUM, group, name, 2, rank)
    # flags, counts beyond the slots: one host read (where collective 3 runs, it carries the flag)
    if ((labelled or buf.dd is not None) and not late) or units > P.COUNT_SLOTS:
        failed, counts = _flags_and_counts(buf, units)
        _refuse_failed(failed, agreed, failure, group, words_buf)
        _refuse_lonely(P.COUNT_SLOTS, counts, agreed, group)

    a = st = None
    if failure is None:
        try:
            st = W.merge(buf.stats[:, :units].to(data_device))
            a = W.eq6_apply(plan, loc, st, plan.write)
            if late:
                _late_row(buf.late[rank], overflow_row if check_overflow else {}, a if reachable else None,
                          out_dtype)
        except Exception as exc:  # noqa: BLE001
            if not late:
                raise  # after the last collective: this rank's own output fails; the peers' are complete
            failure = exc
    if late:
        if failure is not None:
            buf.late[rank, _FAILED] = 1
        _late_checks(name, group, world, rank, agreed, buf.late, out_dtype, failure, words_buf)
    counts = _certify.Counts()
    if buf.dd is not None and a.dtype == _F64 and dd_rows is not None:
        out = _dd.finish(_dd.merged(buf.dd.to(data_device), eps), *dd_rows, sizes, eps, out_dtype, counts, a)
    else:  # uncertified (or this rank's inputs left the dd path's range): its plain result
        out = _pipeline.output(a, out_dtype, checked=True)  # the range: collective 3, where it can fail
        counts["uncertified"] += a.shape[0]
    if api == P.API_GDPO:
        (plan.scored or _pipeline.scored(inp, None)).report(diagnostics, sum(r[P.UNSCORED] for r in agreed))
        if diagnostics is not None:
            diagnostics.certified = counts
    return out, st


def _refusal(reasons: list[str], agreed, group) -> str:
    """The message every rank raises; a subgroup's ranks are also given as global ranks."""
    try:
        ranks = [dist.get_global_rank(group, r) for r in range(len(agreed))]
    except Exception:  # noqa: BLE001 - an older torch, or a group without a mapping: its own ranks only
        ranks = None
    return P.refusal_message(reasons, agreed, ranks)


def _group_of(api, group, refused=None) -> tuple[int, int]:
    """(world size, this rank) of ``group``, or the refusal of one that is no usable group, raised
    at once (no agreement can run without it), chained on an adapter's ``refused``."""
    pg_type = getattr(dist, "ProcessGroup", None) if dist.is_available() else None
    name, shown = P.API_NAMES[api], f"{type(group).__name__} {_shown(group, 60)}"
    if type(group) is int and group == getattr(getattr(dist, "GroupMember", None), "NON_GROUP_MEMBER", None):
        raise P.DistributedError(
            f"{name}: process_group is GroupMember.NON_GROUP_MEMBER ({shown}): this rank is not a member of the "
            "group torch.distributed.new_group made; call it only on the group's ranks") from refused
    if pg_type is None or not isinstance(group, pg_type):
        _UNJOINED[0] += 1  # the peers wait for this call: their next agreement must not pair with ours
        raise P.InputDtypeError(
            f"{name}: process_group must be a torch.distributed ProcessGroup (e.g. torch.distributed.group.WORLD "
            f"after init_process_group), or None for a local call; got {shown}") from refused
    if not dist.is_initialized():
        raise P.DistributedError(
            f"{name}: process_group is a ProcessGroup but torch.distributed is not initialized (call "
            "init_process_group first; was the group destroyed?)") from refused
    try:
        world, rank = dist.get_world_size(group), dist.get_rank(group)
    except Exception as exc:  # e.g. a group destroyed, or one that belongs to no initialized world
        raise P.DistributedError(f"{name}: process_group ({shown}) cannot be used on this rank: "
                                 f"{type(exc).__name__}: {exc}") from (refused or exc)
    if world < 1 or not 0 <= rank < world:
        raise P.DistributedError(f"{name}: process_group ({shown}) cannot be used on this rank: this rank is not "
                                 "a member of it")
    return world, rank


class _Buffers:
    """One int64 allocation for collectives 2 and 3: ``late`` (world, 7) for 3; for 2 ``stats``
    (world, units + 1, 7) float64 (``bits``: its int64 view; the extra row: the failure flag),
    then under ``missing="unscored"`` ``row_counts`` (world, units - COUNT_SLOTS) of the units
    with no count slot (the statistics count scored rows), then the certificate's ``dd``."""

    def __init__(self, world: int, units: int, device: torch.device, row_counts: bool, certified: bool):
        extra = max(units - P.COUNT_SLOTS, 0) if row_counts else 0
        extra_rows = -(-extra // W.COLS)
        dd_rows = -(-(units * _dd.DDC) // W.COLS) if certified else 0
        rows = units + 1 + extra_rows + dd_rows
        flat = torch.zeros(world * _LATE_COLS + world * rows * W.COLS, dtype=_I64, device=device)
        self.late = flat[: world * _LATE_COLS].view(world, _LATE_COLS)
        self.bits = flat[world * _LATE_COLS:].view(world, rows, W.COLS)
        self.stats = self.bits.view(_F64)
        self.row_counts = self.stats[:, units + 1:].reshape(world, -1)[:, :extra] if row_counts else None
        start = units + 1 + extra_rows
        self.dd = (self.stats[:, start:].reshape(world, -1)[:, : units * _dd.DDC]
                   .view(world, units, _dd.DDC) if certified else None)


def _flags_and_counts(buf: _Buffers, units: int) -> tuple[list[int], list[list[int]]]:
    """Collective 2's failure flag per rank, and the row counts (per unit, per rank) of the units
    with no count slot, in one host read."""
    extra = max(units - P.COUNT_SLOTS, 0)
    counts = buf.row_counts if buf.row_counts is not None else buf.stats[:, P.COUNT_SLOTS:units, 0]
    host = torch.cat([buf.bits[:, units, 0:1].to(_F64), counts], 1).tolist()
    return [int(r[0]) for r in host], [[int(r[1 + j]) for r in host] for j in range(extra)]


def _refuse_failed(failed: list[int], agreed, failure, group, words_buf) -> None:
    ranks = [r for r, f in enumerate(failed) if f]
    if ranks:
        rank = dist.get_rank(group)
        words = _own_words(failure if failed[rank] else None, group, words_buf, rank)
        said = "".join(f"; rank {r}: {words[r]}" for r in ranks if r in words)
        raise P.DistributedError(_refusal([
            f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: the local computation raised an "
            f"unexpected exception after the agreement (chained on that rank){said}"], agreed, group)) from failure


def _words_of(exc) -> str:
    """What a refusing rank tells its peers: its GDPOError's message, else the exception's type
    and message. Never raises (a broken __str__ is named by type)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not keep this rank from the exchange
        text = "(its message could not be read)"
    return text if isinstance(exc, P.GDPOError) else f"{type(exc).__name__}: {text}"


def _words_row(text: str | None) -> torch.Tensor | None:
    """``text`` as WORDS_BYTES of UTF-8 in int64s (cut between characters, with '...')."""
    if not text:
        return None
    raw = text.encode("utf-8", "replace")
    if len(raw) > WORDS_BYTES:
        raw = raw[: WORDS_BYTES - 3].decode("utf-8", "ignore").encode("utf-8") + b"..."  # whole characters
    return torch.frombuffer(bytearray(raw.ljust(WORDS_BYTES, b"\0")), dtype=torch.uint8).view(_I64)


def _weights_text(inp) -> str | None:
    """This rank's weights as it tells them (never raises: the rank must still join)."""
    try:
        return P.weights_words(inp.weights, COLUMN_NAMES.get())
    except Exception:  # noqa: BLE001 - the refusal then shows the digest
        return None


def _own_words(exc, group, words_buf: torch.Tensor, rank: int, text: str | None = None) -> dict[int, str]:
    """One more collective on the refusal path, which every rank joins: {rank: its own words}
    (:func:`_words_of`; a rank without an exception may say ``text``, its weights), or {} if
    the exchange fails."""
    try:
        mine = _words_row(_words_of(exc) if exc is not None else text)
        if mine is not None:
            words_buf[rank].copy_(mine)
    except Exception:  # noqa: BLE001 - this rank's words are lost; it still joins
        pass
    try:
        dist.all_reduce(words_buf, op=dist.ReduceOp.SUM, group=group)
        rows = words_buf.cpu()
    except Exception:  # noqa: BLE001 - the refusal stands without the words
        return {}
    said = [bytes(row.view(torch.uint8).tolist()).rstrip(b"\0").decode("utf-8", "replace") for row in rows]
    return {r: words for r, words in enumerate(said) if words}


def _refuse_lonely(first: int, counts: list[list[int]], agreed, group) -> None:
    """Refuse the units (``first`` + j, ``counts[j]`` their row counts per rank) of one row across ranks."""
    reasons = [f"unit {first + j} holds a single sample across all ranks (on rank "
               f"{next(r for r, x in enumerate(c) if x)}); Eq. 6 needs at least 2 (unbiased std)"
               for j, c in enumerate(counts) if sum(c) == 1]
    if reasons:
        raise P.DistributedSegmentError(_refusal(reasons, agreed, group))


def _late_row(mine: torch.Tensor, overflow_row: dict, a, out_dtype) -> None:
    """This rank's row of collective 3 (see _LATE_COLS)."""
    fields = (P.C_OVERFLOW, P.C_OVERFLOW_BITS, P.C_OVERFLOW_GROUP)
    if overflow_row:
        zero = torch.zeros((), dtype=_I64, device=mine.device)
        mine[:3] = torch.stack([overflow_row[f].to(mine.device, _I64).reshape(()) if f in overflow_row else zero
                                for f in fields])
    if a is not None:
        beyond = a.abs() >= cast_limit(out_dtype)
        mine[3] = beyond.sum().to(mine.device)
        if a.shape[0]:
            at = torch.argmax(beyond.view(torch.uint8))  # the first such row (0 when none: unread then)
            mine[5] = at.to(mine.device)
            mine[6] = a[at].view(_I64).to(mine.device)


def _late_checks(name, group, world, rank, agreed, late, out_dtype, failure, words_buf):
    """Collective 3 (every rank's :func:`_late_row`), so that all ranks raise together."""
    _all_reduce(late, dist.ReduceOp.SUM, group, name, 3, rank)
    late = late.tolist()
    _refuse_failed([row[_FAILED] for row in late], agreed, failure, group, words_buf)
    reasons = []
    for r, (at, bits, label, *_) in enumerate(late):
        row = list(agreed[r])
        row[P.C_OVERFLOW], row[P.C_OVERFLOW_BITS], row[P.C_OVERFLOW_GROUP] = at, bits, label
        reasons += [f"rank {r}: {cls.__name__}: {msg}" for cls, msg in P.row_problems(row)]
    if reasons:
        raise P.DistributedError(_refusal(reasons, agreed, group))
    if any(row[3] for row in late):
        where = "; ".join(f"rank {r}: {row[3]} value(s), the first {P.bits_float(row[6])!r} at its row {row[5]}"
                          for r, row in enumerate(late) if row[3])
        raise P.DistributedOutOfRangeError(
            f"{name} refused on all {world} ranks: whitened values do not survive the cast to "
            f"{P.dtype_name(P.dtype_code(out_dtype))} (largest finite {torch.finfo(out_dtype).max!r}) "
            f"({where}); choose a wider out_dtype")
