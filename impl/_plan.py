"""The plan of a call: every decision made once, before the arithmetic.

A :class:`Plan` says which stages run, in which layout, on which backend (``eq47``: Eq. 4
and 7, ``eq6b``: Eq. 6, each :data:`PLAIN` or :data:`FUSED`, the latter only where
``impl._fused`` applies), whether a CUDA graph replays the call, which rows Eq. 6 takes
(``scored``, ``missing="unscored"``), which units are whole groups (``whole``) and the dtype
Eq. 6 writes (``write``). The stages read these fields; none asks ``impl._fused`` whether it
applies (this module alone calls its eligibility predicates).

* :func:`local`: a validated local call. Labelled groups run phase one here and read its
  row (the call's one host read; a non-finite reward first where the search is lazy, on CPU),
  raise its refusals, then lay the groups out: their longest group is known only after that
  read, and the layout and the Eq. 4/7 backend are decided together (the fused kernel takes
  one padded layout, neither the contiguous layout of runs nor CPU's buckets).
* :func:`distributed`: a call across ranks, before the agreement (no host read beyond the
  unscored mask's): labelled groups run phase one, their layout pending until :func:`agreed`
  gives this rank's row of the agreement table, with the dtype Eq. 6 writes (the total row
  count is the agreement's).

The plan reads the validated call as data (``_inputs.Call``: the rewards' shape, the facts
row's host fields) and asks each module a decision needs once, in turn: the certificate and
the cast (the output's dtypes), the fused backend, the groups (lazy checks, layout, whole
units), the CUDA graphs.

Under ``missing="unscored"`` the scored rows are read here (one host read of the (N,) mask:
the read the call made later before, now made before its arithmetic).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, TypeVar

import torch

from impl import _certify, _facts, _fused, _graphs
from impl import _groups
from impl import _eq4
from impl import _eq7
from impl import _problems as P
from impl import _whiten as W
from impl._cast import _DIRECT, cast_reachable

_I64 = torch.int64

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Backend:
    """One implementation of the stages; the plain one and the fused one share every signature:
    ``eq4(plan, r, facts) -> z``, ``eq7(plan, z, facts) -> (c, varies)``, ``eq6_stats(plan, c,
    facts) -> loc``, ``eq6_apply(plan, loc, merged, write) -> a``. A finding is put into
    ``facts`` (a dict of 0-d device tensors by column), never raised."""

    name: str
    fused: bool  # its stages run behind :func:`guard` (a failure of theirs: the plain plan)
    eq4: Callable
    eq7: Callable
    eq6_stats: Callable
    eq6_apply: Callable

    def __repr__(self) -> str:
        return self.name.upper()


#: The backends of a stage (``Plan.eq47``, ``Plan.eq6b``).
PLAIN = Backend("plain", False, _eq4.eq4, _eq7.stage, W.eq6_stats, W.eq6_apply)
FUSED = Backend("fused", True, _fused.eq4, _fused.eq7, _fused.eq6_stats, _fused.eq6_apply)

#: The APIs a plan serves.
GDPO, WHITEN, NORMALIZE, STANDARDIZE, SIGNAL = "gdpo", "whiten", "normalize", "standardize", "signal"

#: The stages each API runs (``Plan.eq4``, ``combined`` (Eq. 7), ``eq6``, ``signal``).
STAGES = {GDPO: dict(eq4=True, combined=True, eq6=True, signal=False),
          WHITEN: dict(eq4=False, combined=False, eq6=True, signal=False),
          NORMALIZE: dict(eq4=True, combined=True, eq6=False, signal=False),
          STANDARDIZE: dict(eq4=True, combined=False, eq6=False, signal=False),
          SIGNAL: dict(eq4=True, combined=True, eq6=False, signal=True)}


# --- missing="unscored": rows with no scored reward ----------------------------------------


@dataclasses.dataclass
class _Scored:
    """Which rows Eq. 6 takes under ``missing="unscored"``: ``rows`` (device int64, the scored
    rows in order) and ``sizes`` (scored rows per unit), or rows None when every row is scored
    (the call is then the plain one); ``mask`` (N,) bool, True on the scored rows, and
    ``unscored`` (the count of the others)."""

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


def _scored(inp, sizes: list[int]) -> _Scored:
    """The scored rows of ``inp`` and their count per unit of ``sizes``: one host read of the
    (N,) mask (free on CPU; on CUDA the one more read a call under "unscored" costs)."""
    mask = _eq4.scored_rows(inp.rewards)
    host = mask.cpu()
    unscored = inp.n - int(host.sum())
    if unscored == 0:
        return _Scored(mask, 0, None, sizes)
    ends = torch.tensor([0] + sizes, dtype=_I64).cumsum(0)
    upto = torch.cat([torch.zeros(1, dtype=_I64), host.to(_I64).cumsum(0)])
    scored_sizes = (upto[ends[1:]] - upto[ends[:-1]]).tolist()
    rows = host.nonzero().view(-1).to(inp.rewards.device, non_blocking=True)
    return _Scored(mask, unscored, rows, scored_sizes)


def _no_missing(inp) -> _Scored:
    return _Scored(torch.ones(inp.n, dtype=torch.bool, device=inp.rewards.device), 0, None, [])


def _output(out_dtype: torch.dtype, rows: int, mode: str) -> tuple[torch.dtype | None, bool]:
    """The dtype Eq. 6 writes for ``out_dtype`` outputs of ``rows`` rows in all, and whether
    the certificate decides their rounding under ``mode`` (float8: never). Eq. 6 writes the
    output dtype itself, or float64 (None) where the certificate decides the rounding
    (``impl._certify``: the float64 result and its bound), the cast must be checked first, or
    the dtype is not one the division writes directly."""
    certified = _certify.certifies(mode, out_dtype)
    if certified or out_dtype not in _DIRECT or cast_reachable(out_dtype, rows):
        return None, certified
    return out_dtype, certified


# --- the plan -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Plan:
    """A call's decisions, made once before its arithmetic (see the module's docstring)."""

    api: str  # GDPO, WHITEN, NORMALIZE, STANDARDIZE, SIGNAL
    # the stages this API runs (``STAGES[api]``: fields, the stages read them as data)
    eq4: bool  # Eq. 4 (every API but whiten)
    combined: bool  # Eq. 7 (every API but standardize_groups and whiten)
    eq6: bool  # Eq. 6 (gdpo_advantages, whiten)
    signal: bool  # group_has_signal: ``varies`` is the result
    eps: float
    inp: object | None  # _inputs.Rewards (None: whiten)
    sizes: list[int] | None  # Eq. 6 units of this process's rows (None: an Eq. 4/7 API)
    out_dtype: torch.dtype | None = None  # None: an Eq. 4/7 API (float64 out)
    # the groups' layout
    prep: _groups.Prepared | None = None  # labelled groups: phase one (contiguous: the stage runs it)
    layout: _groups.GroupLayout | None = None  # None: whiten, contiguous groups' stage, or pending (ranks)
    row: list[int] | None = None  # labelled local calls: the facts row read for the layout
    #: labelled local calls the certificate decides: phase one's sort (perm, gid, pos) of the
    #: labels (``impl._groups.Labelled.sorted_rows``), each row's group without a second sort
    sort: tuple | None = None
    whole: object = None  # units of whole groups (host tuple, device bool (S,) or None)
    scored: _Scored | None = None  # "unscored": the rows Eq. 6 takes (GDPO; the others: their report)
    # backends
    eq47: Backend = PLAIN  # FUSED: Eq. 4 and 7 in one kernel (contiguous, or labelled in one padded layout)
    eq6b: Backend = PLAIN  # FUSED: Eq. 6 by the fused whitening kernels
    graph: bool = False  # replay the device part from a CUDA graph (local, contiguous, CUDA)
    lazy: bool = False  # CPU: look for non-finite inputs only when the statistics show one
    # the output
    write: torch.dtype | None = None  # the dtype Eq. 6 writes (None: float64); ranks: set by agreed()
    certify: bool = False  # the certificate decides the rounding (ranks: its statistics ride in collective 2)
    #: the plain Eq. 6 may use c as work space: a local gdpo_advantages call whose c is neither
    #: returned nor read by the certificate (never where ``certify``: it reads c after Eq. 6)
    own: bool = False
    host: dict | None = None  # local calls: the facts row's host fields (labelled groups: ``row``)
    mode: str = "narrow"  # the certificate's mode (ranks: agreed() reads it)

    @property
    def key(self) -> tuple:
        """The CUDA-graph signature of a local call (``impl._graphs``): what its captured device
        part depends on."""
        inp = self.inp
        return (tuple(inp.rewards.shape), inp.rewards.dtype, str(inp.rewards.device), inp.group_size,
                tuple(P.float_bits(w) for w in inp.weights), tuple(self.sizes), P.float_bits(self.eps),
                self.out_dtype, self.write, self.eq47.name, self.eq6b.name, self.certify)


def report(plan: Plan, diagnostics, counts=None) -> None:
    """Fill ``diagnostics`` once a local call succeeded: the rows Eq. 6 left out (none under
    "refuse") and, where the certificate decided the rounding, its tiers' counts."""
    if diagnostics is None:
        return
    (plan.scored or _no_missing(plan.inp)).report(diagnostics)
    if counts is not None:
        diagnostics.certified = counts


def plain(plan: Plan) -> Plan:
    """The same plan on the plain backends (its layout kept: the plain path's bits on any)."""
    return dataclasses.replace(plan, eq47=PLAIN, eq6b=PLAIN, graph=False)


def guard(plan: Plan, fn: Callable[[Plan], T]) -> T:
    """``fn(plan)``; where a fused stage fails (``_fused.FusedFailure``), the fused path goes off
    for this process (warned once) and ``fn`` runs again on the plain plan: the same bits (the
    fused kernels only ever compute the plain path's). The one ``try`` around fused work; any
    other exception is the call's own and propagates as it is."""
    if plan.eq47 is PLAIN and plan.eq6b is PLAIN:
        return fn(plan)
    try:
        return _fused.quiet(fn, plan)
    except _fused.FusedFailure as exc:  # Triton, its compiler, a launch: the plain plan
        _fused.disable(exc.__cause__ or exc)
        return fn(plain(plan))


def _lay_out(prep, inp, api: str, groups: int, longest: int, runs: int):
    """The layout of labelled groups and its Eq. 4/7 backend, decided together: the fused
    kernel runs Eq. 4/7 of one padded layout (c alone: not for standardize_groups or
    group_has_signal, nor under "unscored")."""
    fused = (api in (GDPO, NORMALIZE) and inp.missing == "refuse"
             and _fused.padded_eligible(prep.r, longest, inp.weights))
    layout = _groups.layout(prep, groups, longest, runs, fused=fused, read=_facts.read)
    return layout, FUSED if fused and layout.kind == "padded" else PLAIN


def local(call, api: str, *, report: bool = False) -> Plan:
    """The plan of a validated local call (``_inputs.check_*``'s :class:`Call`) of ``api``.
    ``report``: an Eq. 4/7 API's caller asked for diagnostics (under "unscored" its scored
    rows are read for them). Labelled groups: phase one, its row read and its refusals
    raised here (see the module's docstring)."""
    eps, sizes, out_dtype, stages = call.eps, call.sizes, call.out_dtype, STAGES[api]
    if api == WHITEN:
        v = call.values
        write, certify = _output(out_dtype, v.shape[0], call.mode)
        fused = bool(v.shape[0]) and _fused.whiten_eligible(v.device, sizes, write)
        lazy = _groups.lazy_checks(v.device) and not fused  # the fused kernels look at every value anyway
        return Plan(api, **stages, eps=eps, inp=None, sizes=sizes, out_dtype=out_dtype, write=write,
                    eq6b=FUSED if fused else PLAIN, lazy=lazy, certify=certify, host=call.host)
    inp = call.inp
    gdpo, unscored = api == GDPO, inp.missing == "unscored"
    write, certify = _output(out_dtype, inp.n, call.mode) if gdpo else (None, False)
    certify = certify and not unscored  # "unscored": one rounding, uncertified
    eq47 = eq6b = PLAIN
    if gdpo and not unscored:  # "unscored": the plain path (impl._fused lists it)
        eq6b = FUSED if _fused.whiten_eligible(inp.rewards.device, sizes, write) else PLAIN
        if eq6b is FUSED and _fused.eq47_eligible(inp):  # contiguous groups: the whole call fused
            eq47 = FUSED
    elif api in (NORMALIZE, SIGNAL) and _fused.eq47_eligible(inp):  # contiguous groups
        eq47 = FUSED
    lazy = _groups.lazy_checks(inp.rewards.device)
    # "unscored": the scored rows, the one more read, before the arithmetic (labelled: after the row's refusals)
    read_scored, scored_units = unscored and (gdpo or report), sizes if gdpo else [inp.n]
    common = dict(**stages, eps=eps, inp=inp, sizes=sizes, out_dtype=out_dtype, eq6b=eq6b, write=write,
                  certify=certify, own=gdpo and not certify)
    if inp.labels is None:
        layout = _groups.contiguous(inp.n, inp.group_size)
        whole = _groups.whole_units(inp, sizes) if gdpo else None
        graph = gdpo and not unscored and _graphs.eligible(inp)
        return Plan(api, **common, layout=layout, whole=whole, eq47=eq47, lazy=lazy, graph=graph,
                    scored=_scored(inp, scored_units) if read_scored else None, host=call.host)
    prep = _groups.prepare(inp, lazy=lazy)
    row = _facts.read_row(call.host, prep.facts)  # the one host read
    if prep.lazy and P.row_problems(row):  # a refusal: a non-finite reward is reported first
        row = _facts.read_row(row, _facts.rewards_nonfinite_facts(inp, prep.r))
    P.raise_local(row)
    layout, eq47 = _lay_out(prep, inp, api, row[P.GROUPS], row[P.N_MAX], row[P.RUNS])
    whole = _groups.whole_units(inp, sizes, prep.labelled) if gdpo else None  # after the layout's sort
    sort = prep.labelled.sorted_rows() if certify else None
    return Plan(api, **common, prep=prep, layout=layout, row=row, whole=whole, eq47=eq47, lazy=prep.lazy,
                scored=_scored(inp, scored_units) if read_scored else None, sort=sort)


def distributed(api: str, eps: float, out_dtype, sizes: list[int], mode: str, *, inp=None, values=None) -> Plan:
    """The plan of a call across ranks before the agreement, from its checked arguments
    (``run_distributed`` checks them in its own order). No host read but the unscored mask's;
    labelled groups run phase one, their layout pending (:func:`agreed`)."""
    device = (inp.rewards if api == GDPO else values).device
    n = inp.n if api == GDPO else values.shape[0]
    fused = n > 0 and _fused.whiten_eligible(device, sizes, None)
    certify = _output(out_dtype, n, mode)[1]  # (the dtype Eq. 6 writes: agreed(), from every rank's rows)
    common = dict(**STAGES[api], eps=eps, sizes=sizes, out_dtype=out_dtype, mode=mode)
    if api == WHITEN:
        return Plan(api, **common, inp=None, eq6b=FUSED if fused else PLAIN, certify=certify)
    scored = None
    if inp.missing == "unscored":  # Eq. 6 takes the scored rows (the plain path: impl._fused lists it)
        scored = _scored(inp, sizes)
        fused = False
    eq47 = FUSED if fused and _fused.eq47_eligible(inp) else PLAIN  # contiguous groups only
    if inp.labels is None or n == 0:  # contiguous groups: Eq. 6 fused only after a fused Eq. 4/7
        fused = eq47 is FUSED
    common.update(inp=inp, scored=scored, eq47=eq47, eq6b=FUSED if fused else PLAIN,
                  certify=certify and scored is None and inp.missing == "refuse")
    if inp.labels is None or n == 0:
        return Plan(api, **common, layout=_groups.contiguous(n, inp.group_size) if n else None,
                    whole=_groups.whole_units(inp, sizes))
    return Plan(api, **common, prep=_groups.prepare(inp, lazy=False))


def agreed(plan: Plan, table: list[list[int]], rank: int) -> Plan:
    """The plan once the agreement is read: the dtype Eq. 6 writes (the total row count is
    every rank's), and labelled groups' layout from this rank's row (its Eq. 4/7 backend
    with it) and their whole units."""
    plan = dataclasses.replace(plan, write=_output(plan.out_dtype, sum(r[P.ROWS] for r in table), plan.mode)[0])
    if plan.prep is None:
        return plan
    mine = table[rank]
    layout, eq47 = _lay_out(plan.prep, plan.inp, plan.api, mine[P.GROUPS], mine[P.N_MAX], mine[P.RUNS])
    whole = _groups.whole_units(plan.inp, plan.sizes, plan.prep.labelled)
    return dataclasses.replace(plan, layout=layout, eq47=eq47, whole=whole, row=mine)
