"""The spine of a local call (no process group): its stages in order, on the plan's backends.

:func:`run_local` runs every local API the same way: the inputs stage (``impl._inputs``: host
refusals at once) and the plan (``impl._plan``: every decision, labelled groups' phase one and
its read), then the device part (:func:`device_part`: Eq. 4, Eq. 7, Eq. 6's statistics and its
output; eager, or replayed from a CUDA graph), the facts row's one host read and its first
refusal (contiguous groups: after the whole call is queued), then the cast
(``impl._cast.output``: the range, one rounding) and, where the plan certifies, the certificate
from the cast's output (``impl._certify.stage``: the rows whose rounding the float64 bound leaves
open). :func:`through_stats`, the stages
up to this process's Eq. 6 statistics, serves the distributed protocol too
(``impl._distributed``, which imports this module; never the other way: ``impl.gdpo``
dispatches to both)."""

from __future__ import annotations

import dataclasses
import math

import torch

from impl import _certify, _facts, _graphs, _plan
from impl import _cast
from impl._cast import round_to  # noqa: F401 - impl._pipeline.round_to, as before
from impl import _eq7
from impl import _problems as P
from impl._inputs import (  # Diagnostics: impl._pipeline.Diagnostics, as before (impl.gdpo reads it)
    Diagnostics,  # noqa: F401
    Problem,
    check_gdpo,
    check_normalize,
    check_standardized,
    check_whiten,
)


# --- the spine: a local call's stages, in order ------------------------------------------------


@dataclasses.dataclass
class Device:
    """What the device part of a call leaves; nothing of it read on the host yet."""

    facts: dict  # {column of the facts row: 0-d device tensor} (``_facts.Facts``)
    z: object = None  # Eq. 4 in the plan's layout (its backend's; None after a graph replay)
    c: torch.Tensor | None = None  # Eq. 7: (N,) float64, input order (standardize_groups: z (N, K); whiten: the values)
    varies: torch.Tensor | None = None  # group_has_signal
    loc: object = None  # Eq. 6 statistics of this process's units
    a: torch.Tensor | None = None  # Eq. 6: (N,) in plan.write (None: float64)


def through_stats(plan, x: torch.Tensor, facts: dict) -> Device:
    """Eq. 4, Eq. 7 and this process's Eq. 6 statistics of ``x`` (the rewards; whiten: the values)
    on the plan's backends, findings put into ``facts`` (across ranks the statistics are merged
    before they are applied). No host read unless ``plan.lazy``, no branch on data."""
    dev = Device(facts)
    if plan.eq4:
        dev.z = plan.eq47.eq4(plan, x, facts)  # Eq. 4, in plan.layout
        if not plan.combined:
            dev.c = dev.z.rows()  # standardize_groups: z (N, K)
            return dev
        dev.c, dev.varies = plan.eq47.eq7(plan, dev.z, facts)  # Eq. 7: c (N,), input order
    else:
        dev.c = x  # whiten: the values are c
        if not plan.lazy:
            facts.update(_facts.value_facts(x))
    if plan.eq6:
        dev.loc = plan.eq6b.eq6_stats(plan, dev.c, facts)  # plan.scored's rows; c kept where plan.certify
        if plan.lazy and not plan.eq4 and not dev.loc.finite():  # whiten on CPU: looked for only now
            facts.update(_facts.value_facts(x))
    return dev


def device_part(plan, x: torch.Tensor) -> Device:
    """All of a local call's device work, Eq. 6 from this process's own statistics: what a
    CUDA graph replays (contiguous groups on CUDA)."""
    dev = through_stats(plan, x, {})
    if plan.eq6:
        dev.a = plan.eq6b.eq6_apply(plan, dev.loc, None, plan.write)
    return dev


def _replayed(plan, x: torch.Tensor) -> Device:
    """:func:`device_part` replayed from the CUDA graph of the plan's signature (``impl._graphs``),
    or run eagerly where no graph can be had. A replay keeps a, the facts and, where the
    certificate reads it, c (Eq. 6 left it intact: ``plan.own`` is false there)."""
    def part(inp):
        dev = device_part(dataclasses.replace(plan, inp=inp), inp.rewards)
        return ((dev.a, dev.c) if plan.certify else (dev.a,)), dev.facts

    got = _graphs.run(plan.key, plan.inp, part)
    if got is None:
        return device_part(plan, x)
    out, facts = got
    return Device(facts, c=out[1] if plan.certify else None, a=out[0])


def run_local(plan, call, diagnostics=None):
    """One local call, its stages in order: the device part (eager, or a graph replay), the
    facts row's one host read and its first refusal, then the cast and the certificate. The
    plan made every decision; nothing here tests a device or a layout, nor a backend but for
    whether its stages run behind the plan's guard (fused ones: a failure of theirs reruns the
    device part on the plain plan). Nothing calls back into the spine or the plan."""
    x = call.values if call.inp is None else call.inp.rewards

    def part(p):  # eager, or a graph replay (not on the plain plan a fused failure falls back to)
        return (_replayed if p.graph else device_part)(p, x)
    dev = _plan.guard(plan, part) if plan.eq47.fused or plan.eq6b.fused else part(plan)
    _facts.settle(plan, dev.facts)
    counts = None
    if not plan.eq6:
        out = dev.varies if plan.signal else dev.c  # normalize_rewards, standardize_groups, group_has_signal
    else:
        out = _cast.output(dev.a, plan.out_dtype)  # the range (float8), then one rounding (float64: a)
        if plan.certify:  # the rows whose rounding the float64 bound leaves open: the exact advantage's
            out, counts = _certify.stage(plan, call, dev, out)
    if diagnostics is not None:
        _plan.report(plan, diagnostics, counts)  # only once the call succeeded
    return out


# --- the local entries --------------------------------------------------------------------------


def gdpo_local(rewards, group_ids, group_size, weights, segment_sizes, eps, out_dtype, missing="refuse",
               diagnostics=None, certified=None):
    call = check_gdpo(rewards, group_ids, group_size, weights, segment_sizes, eps, out_dtype, missing, diagnostics,
                      certified)
    return run_local(_plan.local(call, _plan.GDPO), call, diagnostics)  # labelled: phase one's refusals


def whiten_local(values, segment_sizes, eps, out_dtype, certified=None):
    call = check_whiten(values, segment_sizes, eps, out_dtype, certified)
    return run_local(_plan.local(call, _plan.WHITEN), call)


def normalize_rewards(rewards, group_ids, group_size, weights, eps, missing="refuse", diagnostics=None):
    call = check_normalize(rewards, group_ids, group_size, weights, eps, missing, diagnostics)
    return run_local(_plan.local(call, _plan.NORMALIZE, report=diagnostics is not None), call, diagnostics)


def standardize_groups(rewards, group_ids, group_size, eps, missing="refuse", diagnostics=None):
    """Eq. 4 alone: z (N, K) float64, by the arithmetic normalize_rewards runs before Eq. 7."""
    call = check_normalize(rewards, group_ids, group_size, None, eps, missing, diagnostics)
    return run_local(_plan.local(call, _plan.STANDARDIZE, report=diagnostics is not None), call, diagnostics)


def group_has_signal(rewards, group_ids, group_size, weights, eps, missing="refuse", diagnostics=None):
    call = check_normalize(rewards, group_ids, group_size, weights, eps, missing, diagnostics)
    return run_local(_plan.local(call, _plan.SIGNAL, report=diagnostics is not None), call, diagnostics)


def combine(z, weights):
    """Eq. 7 alone on given z (N, K): c (N,) float64, by normalize_rewards' Eq. 7 arithmetic."""
    try:
        zt, w = check_standardized(z, weights)
    except Problem as p:
        raise p.error() from None
    c = _eq7.combine(zt, w)
    at, bits = _facts.first_nonfinite(c)
    if not math.isfinite(P.bits_float(int(bits))):  # the one host read; z is finite: an overflow
        raise P.host_error(P.P_Z_OVERFLOW, int(at))
    return c
