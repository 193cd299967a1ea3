"""The spine of a call (docs/architecture.md, "impl: one call, its stages"): its :class:`Plan`.

:func:`local` plans a local call (labelled groups run phase one, read its row and raise its
refusals here: their layout needs the longest group); :func:`distributed` and :func:`agreed` a
call across ranks, before and after the agreement. :func:`run` runs the device part (eager or a
CUDA graph's replay), the facts row's one host read, the cast and the certificate.

CUDA graphs (``GDPO_CUDA_GRAPHS=1``, small calls bounded by kernel launches): the first local
call of a signature (:attr:`Plan.key`) with contiguous groups on CUDA captures the device part,
later ones copy the rewards in and replay it (the same bits); up to :data:`GRAPH_ELEMENTS`
rewards, :data:`MAX_GRAPHS` signatures (least recently used out); a failed capture stays eager."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import os
import warnings

import torch

from impl import _certify, _eq47
from impl import _problems as P
from impl import _segments as seg_ops
from impl import _whiten as W
from impl._inputs import Problem, check_standardized
from impl._segments import round_to

_F64, _I64 = torch.float64, torch.int64

#: The APIs a plan serves, and the stages each runs.
GDPO, WHITEN, NORMALIZE, STANDARDIZE, SIGNAL = "gdpo", "whiten", "normalize", "standardize", "signal"
STAGES = {GDPO: dict(eq4=True, combined=True, eq6=True, signal=False),
          WHITEN: dict(eq4=False, combined=False, eq6=True, signal=False),
          NORMALIZE: dict(eq4=True, combined=True, eq6=False, signal=False),
          STANDARDIZE: dict(eq4=True, combined=False, eq6=False, signal=False),
          SIGNAL: dict(eq4=True, combined=True, eq6=False, signal=True)}


@dataclasses.dataclass
class Scored:
    """Which rows Eq. 6 takes under ``missing="unscored"``: ``mask`` (N,) True on the scored rows,
    ``unscored`` the count of the others, ``rows`` the scored rows (None: every row) and
    ``sizes`` their count per unit."""

    mask: torch.Tensor
    unscored: int
    rows: torch.Tensor | None
    sizes: list[int]

    def report(self, diagnostics, all_ranks: int | None = None) -> None:
        if diagnostics is not None:
            diagnostics.unscored_rows = self.unscored
            diagnostics.unscored_rows_all_ranks = self.unscored if all_ranks is None else all_ranks
            diagnostics.unscored = ~self.mask

    def scatter(self, a: torch.Tensor, n: int) -> torch.Tensor:
        """This rank's advantages in row order: +0 on the unscored rows."""
        if self.rows is None:
            return a
        return torch.zeros(n, dtype=a.dtype, device=a.device).index_copy_(0, self.rows, a)


def scored(inp, sizes: list[int] | None) -> Scored:
    """The scored rows of ``inp`` per unit of ``sizes`` (one host read of the mask); ``sizes``
    None: every row (missing is "refuse")."""
    r = inp.rewards
    if sizes is None:
        return Scored(torch.ones(inp.n, dtype=torch.bool, device=r.device), 0, None, [])
    mask = (r == r).any(1)  # a row with at least one scored (non-NaN) reward
    host = mask.cpu()
    unscored = inp.n - int(host.sum())
    if unscored == 0:
        return Scored(mask, 0, None, sizes)
    ends = torch.tensor([0] + sizes, dtype=_I64, device="cpu").cumsum(0)
    upto = torch.cat([torch.zeros(1, dtype=_I64, device="cpu"), host.to(_I64).cumsum(0)])
    rows = host.nonzero().view(-1).to(r.device, non_blocking=True)
    return Scored(mask, unscored, rows, (upto[ends[1:]] - upto[ends[:-1]]).tolist())


@dataclasses.dataclass(frozen=True)
class Plan:
    """A call's decisions, made once before its arithmetic: stages read its fields, none re-tests a
    condition."""

    api: str  # GDPO, WHITEN, NORMALIZE, STANDARDIZE, SIGNAL
    eq4: bool  # Eq. 4 (every API but whiten)
    combined: bool  # Eq. 7 (every API but standardize_groups and whiten)
    eq6: bool  # Eq. 6 (gdpo_advantages, whiten)
    signal: bool  # group_has_signal: ``varies`` is the result
    eps: float
    inp: object | None  # _inputs.Rewards (None: whiten)
    sizes: list[int] | None  # Eq. 6 units of this process's rows (None: an Eq. 4/7 API)
    out_dtype: torch.dtype | None = None  # None: an Eq. 4/7 API (float64 out)
    mode: str = "off"  # the certificate's mode (ranks: agreed() reads it)
    prep: object = None  # labelled groups: phase one (``_eq47.Prepared``; contiguous: the stage runs it)
    layout: object = None  # labelled groups' ``_eq47.GroupLayout`` (None: contiguous, whiten, or pending)
    row: list[int] | None = None  # labelled groups: the facts row read for the layout
    #: labelled local calls the certificate decides: phase one's sort (perm, gid, pos) of the labels
    sort: tuple | None = None
    whole: object = None  # units of whole groups (host tuple, device bool (S,) or None)
    scored: Scored | None = None  # "unscored": the rows Eq. 6 takes (GDPO; the others: their report)
    graph: bool = False  # replay the device part from a CUDA graph (local, contiguous, CUDA)
    lazy: bool = False  # CPU: look for non-finite inputs only when the statistics show one
    write: torch.dtype | None = None  # the dtype Eq. 6 writes (None: float64); ranks: set by agreed()
    certify: bool = False  # the certificate decides the rounding (ranks: its statistics ride in collective 2)
    #: the plain Eq. 6 may use c as work space: a local gdpo_advantages call whose c is neither
    #: returned nor read by the certificate
    own: bool = False
    host: dict | list | None = None  # local calls: the facts row's host fields (labelled groups: ``row``)

    @property
    def key(self) -> tuple:
        """The CUDA-graph signature of a local call: what its captured device part depends on."""
        inp = self.inp
        return (tuple(inp.rewards.shape), inp.rewards.dtype, str(inp.rewards.device), inp.group_size,
                tuple(P.float_bits(w) for w in inp.weights), tuple(self.sizes), P.float_bits(self.eps),
                self.out_dtype, self.write, self.certify)


def cast_limit(dtype: torch.dtype) -> float:
    """The smallest magnitude that rounds to no finite ``dtype`` (max + ulp(max)/2; float64: inf)."""
    if dtype == _F64:
        return math.inf
    fi = torch.finfo(dtype)
    return fi.max + math.ldexp(1.0, math.frexp(fi.max)[1] - 1) * fi.eps / 2


def cast_reachable(dtype: torch.dtype, total_rows: int) -> bool:
    """Can a whitened value fail the cast? |a| <= (n-1)/sqrt(n) < sqrt(N) (Samuelson; eps only
    shrinks a), with a margin for rounding: only float8 outputs of more than ~2e5 rows."""
    return math.sqrt(max(total_rows, 0)) * (1.0 + 2.0 ** -20) >= cast_limit(dtype)


def _output(out_dtype: torch.dtype, rows: int, mode: str) -> tuple[torch.dtype | None, bool]:
    """(The dtype Eq. 6 writes, None: float64; does the certificate decide the rounding) for
    ``out_dtype`` outputs of ``rows`` rows under ``mode``. Only float32 is written directly (one
    rounding), where neither the certificate nor a cast check reads the float64 result; the
    narrower formats go through ``round_to`` (torch would round twice)."""
    certified = out_dtype in _certify.CERTIFIES[mode]
    if certified or out_dtype != torch.float32 or cast_reachable(out_dtype, rows):
        return None, certified
    return out_dtype, certified


def _whole_contiguous(sizes: list[int], group_size: int) -> tuple[bool, ...]:
    """Per unit: are its start and size multiples of ``group_size`` (whole contiguous groups)?"""
    starts = itertools.accumulate(sizes[:-1], initial=0)
    return tuple(start % group_size == 0 and s % group_size == 0 for start, s in zip(starts, sizes))


def reads_free(device: torch.device) -> bool:
    """Is a host read free on ``device`` (CPU: ``Plan.lazy``, and labels in order skip their sort)?"""
    return device.type == "cpu"


def local(call, api: str, *, report: bool = False) -> Plan:
    """The plan of a validated local call (``impl._inputs.Call``) of ``api``. ``report``: an Eq. 4/7
    API's caller asked for diagnostics (under "unscored": its scored rows are read)."""
    eps, sizes, out_dtype, stages = call.eps, call.sizes, call.out_dtype, STAGES[api]
    if api == WHITEN:
        v = call.values
        write, certify = _output(out_dtype, v.shape[0], call.mode)
        return Plan(api, **stages, eps=eps, inp=None, sizes=sizes, out_dtype=out_dtype, mode=call.mode, write=write,
                    lazy=reads_free(v.device), certify=certify, host=call.host)
    inp = call.inp
    gdpo, unscored = api == GDPO, inp.missing == "unscored"
    write, certify = _output(out_dtype, inp.n, call.mode) if gdpo else (None, False)
    certify = certify and not unscored  # "unscored": one rounding, uncertified
    lazy = reads_free(inp.rewards.device)
    read_scored = unscored and (gdpo or report)  # "unscored": the one more read, before the arithmetic
    common = dict(**stages, eps=eps, inp=inp, sizes=sizes, out_dtype=out_dtype, mode=call.mode,
                  write=write, certify=certify, own=gdpo and not certify)
    if inp.labels is None:
        graph = gdpo and not unscored and _graphable(inp)
        return Plan(api, **common, whole=_whole_contiguous(sizes, inp.group_size) if gdpo else None,
                    lazy=lazy, graph=graph, host=call.host,
                    scored=scored(inp, sizes if gdpo else [inp.n]) if read_scored else None)
    prep = _eq47.prepare(inp, lazy=lazy)
    row = read_row(call.host, prep.facts)  # the one host read
    if prep.lazy and P.row_problems(row):  # a refusal: a non-finite reward is reported first
        row = read_row(row, _eq47.rewards_nonfinite_facts(inp, prep.r))
    P.raise_local(row)
    layout = _eq47.layout(prep, row[P.GROUPS], row[P.N_MAX], row[P.RUNS], reads_free=lazy)
    whole = _eq47.whole_units(inp, sizes, prep.labelled) if gdpo else None  # after the layout's sort
    return Plan(api, **common, prep=prep, layout=layout, row=row, whole=whole, lazy=prep.lazy,
                scored=scored(inp, sizes if gdpo else [inp.n]) if read_scored else None,
                sort=prep.labelled.sorted_rows() if certify else None)


def distributed(call, api: str) -> Plan:
    """The plan of a call across ranks before the agreement: no host read but the unscored mask's;
    labelled groups run phase one, their layout pending (:func:`agreed`)."""
    inp, sizes = call.inp, call.sizes
    n = inp.n if api == GDPO else call.values.shape[0]
    certify = _output(call.out_dtype, n, call.mode)[1]  # (the dtype Eq. 6 writes: agreed(), from every rank's rows)
    common = dict(**STAGES[api], eps=call.eps, sizes=sizes, out_dtype=call.out_dtype, mode=call.mode)
    if api == WHITEN:
        return Plan(api, **common, inp=None, certify=certify)
    unscored = inp.missing == "unscored"
    common.update(inp=inp, scored=scored(inp, sizes) if unscored else None, certify=certify and not unscored)
    if inp.labels is None or n == 0:
        return Plan(api, **common, whole=_whole_contiguous(sizes, inp.group_size) if n else None)
    return Plan(api, **common, prep=_eq47.prepare(inp, lazy=False))


def agreed(plan: Plan, table: list[list[int]], rank: int) -> Plan:
    """The plan once the agreement is read: the dtype Eq. 6 writes (every rank's rows), and labelled
    groups' layout and whole units (this rank's row)."""
    plan = dataclasses.replace(plan, write=_output(plan.out_dtype, sum(r[P.ROWS] for r in table), plan.mode)[0])
    if plan.prep is None:
        return plan
    mine = table[rank]
    layout = _eq47.layout(plan.prep, mine[P.GROUPS], mine[P.N_MAX], mine[P.RUNS],
                          reads_free=reads_free(plan.prep.r.device))
    whole = _eq47.whole_units(plan.inp, plan.sizes, plan.prep.labelled)
    return dataclasses.replace(plan, layout=layout, whole=whole, row=mine)


def stacked(facts: dict) -> tuple[tuple[int, ...], torch.Tensor]:
    """The columns of ``facts`` in order and their values as one int64 device tensor (no host read)."""
    cols = tuple(sorted(facts))
    return cols, torch.stack([facts[c].to(_I64).reshape(()) for c in cols])


def read_row(host, facts: dict) -> list[int]:
    """The facts row of a local call: host fields as given (a dict, or a row read before), device
    fields in one host read (none without facts)."""
    row = list(host) if isinstance(host, list) else [0] * P.ROW_WIDTH
    for col, v in (() if isinstance(host, list) else host.items()):
        row[col] = int(v)
    if facts:
        cols, values = stacked(facts)
        for col, v in zip(cols, values.tolist()):
            row[col] = v
    return row


def value_facts(v: torch.Tensor) -> dict:
    """Raw facts of Eq. 6 input (N,): the first non-finite value and its bits."""
    if v.shape[0] == 0:
        return {}
    at, bits = seg_ops.first_nonfinite(v)
    return {P.NF_VALUE: at, P.NF_VALUE_KIND: bits}


@dataclasses.dataclass
class Device:
    """What the device part of a call leaves; nothing of it read on the host yet."""

    facts: dict  # {column of the facts row: 0-d device tensor}
    c: torch.Tensor | None = None  # Eq. 7: (N,) float64, input order (standardize_groups: z (N, K); whiten: the values)
    varies: torch.Tensor | None = None  # group_has_signal
    loc: object = None  # Eq. 6 statistics of this process's units
    a: torch.Tensor | None = None  # Eq. 6: (N,) in plan.write (None: float64)


def through_stats(plan: Plan, x: torch.Tensor, facts: dict) -> Device:
    """Eq. 4, Eq. 7 and this process's Eq. 6 statistics of ``x`` (the rewards; whiten: the values);
    findings go into ``facts`` (0-d device tensors by column), never raised; no host read unless
    ``plan.lazy``."""
    dev = Device(facts)
    if plan.eq4:  # Eq. 4, then Eq. 7: c (N,), input order (standardize_groups: z (N, K))
        dev.c, dev.varies = _eq47.eq47(plan, facts)
    else:
        dev.c = x  # whiten: the values are c
        if not plan.lazy:
            facts.update(value_facts(x))
    if plan.eq6:
        dev.loc = W.eq6_stats(plan, dev.c)  # plan.scored's rows; c kept where plan.certify
        if plan.lazy and not plan.eq4 and not dev.loc.finite():  # whiten on CPU: looked for only now
            facts.update(value_facts(x))
    return dev


def device_part(plan: Plan, x: torch.Tensor) -> Device:
    """All of a local call's device work (what a CUDA graph replays)."""
    dev = through_stats(plan, x, {})
    if plan.eq6:
        dev.a = W.eq6_apply(plan, dev.loc, None, plan.write)
    return dev


def run(call, api: str, diagnostics=None):
    """One validated local call of ``api``, its stages in order (docs/architecture.md)."""
    plan = local(call, api, report=diagnostics is not None)
    x = call.values if call.inp is None else call.inp.rewards
    dev = _replayed(plan, x) if plan.graph else device_part(plan, x)
    if dev.facts:  # (none found: nothing to refuse; on CPU, found only where a statistic showed one)
        row = read_row(plan.host if plan.row is None else plan.row, dev.facts)  # the one host read
        if plan.inp is None and P.row_problems(row):  # whiten: the unit of the first bad value
            ends = list(itertools.accumulate(plan.sizes))
            row[P.NF_VALUE_UNIT] = next((j for j, end in enumerate(ends) if row[P.NF_VALUE] < end), len(ends) - 1)
        P.raise_local(row)
    counts = None
    if not plan.eq6:
        out = dev.varies if plan.signal else dev.c  # normalize_rewards, standardize_groups, group_has_signal
    else:
        out = output(dev.a, plan.out_dtype)  # the range (float8), then one rounding (float64: a)
        if plan.certify:  # the rows whose rounding the float64 bound leaves open: the exact advantage's
            out, counts = _certify.stage(plan, dev, out)
    if diagnostics is not None:  # only once the call succeeded: the rows Eq. 6 left out, the tiers' counts
        (plan.scored or scored(plan.inp, None)).report(diagnostics)
        if counts is not None:
            diagnostics.certified = counts
    return out


def output(a: torch.Tensor, dtype: torch.dtype, checked: bool = False) -> torch.Tensor:
    """``a`` rounded once to ``dtype``, refused where a value does not survive the cast (unless
    ``checked``: across ranks, collective 3 did)."""
    if not checked and cast_reachable(dtype, a.shape[0]):
        limit = cast_limit(dtype)
        at = int(torch.argmax((a.abs() >= limit).view(torch.uint8)))  # a second host read, only here
        if a.shape[0] and abs(float(a[at])) >= limit:
            raise P.OutOfRangeError(
                f"whitened value {float(a[at])!r} at row {at} does not survive the cast to "
                f"{P.dtype_name(P.dtype_code(dtype))} (largest finite {torch.finfo(dtype).max!r}); "
                "choose a wider out_dtype")
    return a.to(dtype) if a.dtype == dtype or dtype in (_F64, torch.float32) else round_to(a, dtype)


def combine(z, weights):
    """Eq. 7 alone on given z (N, K): c (N,) float64, by normalize_rewards' Eq. 7 arithmetic."""
    try:
        zt, w = check_standardized(z, weights)
    except Problem as p:
        raise p.error() from None
    c = _eq47.combine(zt, w)
    at, bits = seg_ops.first_nonfinite(c)
    if not math.isfinite(P.bits_float(int(bits))):  # the one host read; z is finite: an overflow
        raise P.host_error(P.P_Z_OVERFLOW, int(at))
    return c


# --- CUDA graphs (GDPO_CUDA_GRAPHS=1) -----------------------------------------------------------

GRAPH_ELEMENTS = 1 << 22
MAX_GRAPHS = 8
_GRAPHS: collections.OrderedDict = collections.OrderedDict()
_FAILED: set = set()
_WARNED: set = set()
#: Counters for benchmarks and tests: captures, replays, fallbacks (failed captures).
graph_stats = {"captures": 0, "replays": 0, "fallbacks": 0}


def _graphable(inp) -> bool:
    """Is a local call of contiguous groups on these rewards replayed from a CUDA graph?"""
    value = os.environ.get("GDPO_CUDA_GRAPHS", "")
    if value not in ("", "0", "1") and value not in _WARNED:
        _WARNED.add(value)
        warnings.warn(f"GDPO_CUDA_GRAPHS={value!r} is not 0 or 1: CUDA graphs are off", RuntimeWarning, stacklevel=4)
    r = inp.rewards
    return (value == "1" and r.is_cuda and inp.labels is None and r.numel() <= GRAPH_ELEMENTS
            and not torch.cuda.is_current_stream_capturing())


def _replayed(plan: Plan, x: torch.Tensor) -> Device:
    """:func:`device_part` replayed from the CUDA graph of the plan's signature (eager where none
    can be had): a, the facts and, where the certificate reads it, c."""
    key = plan.key
    entry = None if key in _FAILED else _GRAPHS.get(key) or _capture(key, plan)
    if entry is None:
        return device_part(plan, x)
    _GRAPHS.move_to_end(key)
    graph, static_in, out, cols, facts, _kept = entry
    static_in.copy_(x)
    graph.replay()
    graph_stats["replays"] += 1
    return Device(dict(zip(cols, facts.unbind())), c=out[1].clone() if plan.certify else None, a=out[0].clone())


def _capture(key: tuple, plan: Plan):
    """The graph entry of ``plan``'s device part on a static copy of its rewards; None where the
    capture fails (the signature then stays eager)."""
    static_in = plan.inp.rewards.clone(memory_format=torch.contiguous_format)
    static = dataclasses.replace(plan, inp=dataclasses.replace(plan.inp, rewards=static_in))
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: caches (constants, allocator) filled outside the capture
            for _ in range(2):
                device_part(static, static_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            dev = device_part(static, static_in)
            cols, facts = stacked(dev.facts)  # one static tensor: a replay refreshes every fact
    except Exception:  # noqa: BLE001 - any capture failure: this signature stays eager
        _FAILED.add(key)
        graph_stats["fallbacks"] += 1
        return None
    graph_stats["captures"] += 1
    # The graph reads the cached constants it was captured with (eps, weights, unit tables) by
    # address: the entry holds them, so that the cache's eviction never frees memory a replay reads.
    _GRAPHS[key] = (graph, static_in, (dev.a, dev.c), cols, facts, tuple(seg_ops.cached_constants()))
    while len(_GRAPHS) > MAX_GRAPHS:
        _GRAPHS.popitem(last=False)
    return _GRAPHS[key]
