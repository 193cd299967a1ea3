"""GDPO advantages (arXiv 2601.05242) in torch, under this project's ``spec`` convention.

The steps carry the paper's names and the same keywords as in ``oracle.gdpo`` (the exact
reference): Eq. 4 ``standardize_groups``, Eq. 7 ``combine``, Eq. 4 + 7 ``normalize_rewards``,
Eq. 6 ``whiten``, and all three, ``gdpo_advantages``. spec/gdpo.md says what they compute and
why: the equations (section 1), the decisions (section 2), whitening units (section 4), the
distributed protocol (section 5: all ranks raise together or none does), the error contract
(section 6), the tolerances (section 7) and the certified rounding (section 7a: float32,
bfloat16 and float16 outputs are the exact advantage correctly rounded; ``certified=``).

How (docs/architecture.md, the spine ``impl._pipeline``): float64 inside and one correctly
rounded cast at the end; shift-invariant two-pass statistics scaled by exact powers of two (no
overflow up to float64's limit, exact collapse without a threshold); one fixed pairwise tree per
group column or unit, no atomics, BLAS or fused multiply-add: the same bits on every run, on CPU
and on CUDA. Every function runs under ``torch.no_grad()``: advantages are data.

Inputs (refusals: spec/gdpo.md section 6): float16, bfloat16, float32 or float64 dense
tensors, or Python/NumPy sequences read as float64; ``process_group=None`` is a local call, and
with a group a rank may hold no rows; groups of Eq. 4 never span ranks. Only float8 outputs can
fail their cast (OutOfRangeError): a whitened value is at most (n-1)/sqrt(n).

Host synchronisations on CUDA: one per call (the read of the facts row or the agreement table),
after every kernel of a contiguous-group call is queued (labelled groups read their shape there,
before Eq. 4). More only where stated: weights or segment_sizes given as CUDA tensors (pass
lists), more than 32 units across ranks, the float8 cast check, labelled groups so ragged that
padding would exceed 4x the batch, weights so large that Eq. 7 may overflow float64,
``missing="unscored"`` (the scored rows' mask), and refused calls.

Missing rewards: ``missing="refuse"`` (the default) refuses a NaN reward; ``missing="unscored"``
reads it as one its reward function did not score (spec/gdpo.md section 2).
"""

from __future__ import annotations

import functools

import torch

from spec.constants import DEFAULT_EPS
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
from impl import _certify, _distributed, _inputs, _pipeline
from impl import _problems as _P

__all__ = ["Diagnostics", "standardize_groups", "combine", "normalize_rewards", "whiten", "gdpo_advantages",
           "group_has_signal", "GDPOError", "NonFiniteError", "InputDtypeError", "ShapeError", "GroupError",
           "WeightError", "SegmentError", "OutOfRangeError", "DistributedError"]

#: What a call under ``missing="unscored"`` left out: pass one as ``diagnostics=``.
Diagnostics = _pipeline.Diagnostics


def _opaque_to_dynamo(fn):
    """An entry point torch.compile calls instead of tracing. impl validates on the host
    (``.item()``, Python loops over labels), which dynamo cannot trace: traced, a compiled
    step broke into several graphs around it and printed dynamo's warnings. Opaque, the
    caller's graph breaks around the call, which runs eagerly with the same bits
    (tests/test_compile.py). ``torch.compiler.disable`` is applied only while dynamo
    traces (``is_compiling`` is a flag read): applying it at import would import
    torch._dynamo, and with it Triton, in every process that imports impl (1.5 s)."""
    @functools.wraps(fn)
    def entry(*args, **kwargs):
        if torch.compiler.is_compiling():
            return torch.compiler.disable(fn)(*args, **kwargs)
        return fn(*args, **kwargs)
    return entry

@_opaque_to_dynamo
@torch.no_grad()
def standardize_groups(rewards, *, group_ids=None, group_size=None, eps=DEFAULT_EPS, missing="refuse",
                       diagnostics=None):
    """Eq. 4 alone: z (N, K) float64, input order, the very z normalize_rewards combines
    (``combine(standardize_groups(r, ...), weights=w)`` is ``normalize_rewards(r, ..., weights=w)``
    bit for bit).

    Arguments and refusals as in :func:`normalize_rewards` (no weights: Eq. 7 is not applied).
    """
    call = _inputs.check_local(rewards=rewards, group_ids=group_ids, group_size=group_size, eps=eps,
                               missing=missing, diagnostics=diagnostics, eq6=False)
    return _pipeline.run(call, _pipeline.STANDARDIZE, diagnostics)


@_opaque_to_dynamo
@torch.no_grad()
def combine(z, *, weights=None):
    """Eq. 7 alone: c = sum_k w_k z_k, float64 (N,), by normalize_rewards' arithmetic (products
    rounded one by one and summed left to right, weights in float64).

    z: (N, K) or (N,) finite floats (the output of :func:`standardize_groups`); weights: K real
    numbers (default ones). Raises InputDtypeError, ShapeError, NonFiniteError (first bad row and
    column), WeightError, OutOfRangeError (the sum overflows float64).
    """
    return _pipeline.combine(z, weights)


@_opaque_to_dynamo
@torch.no_grad()
def normalize_rewards(rewards, *, group_ids=None, group_size=None, weights=None, eps=DEFAULT_EPS,
                      missing="refuse", diagnostics=None):
    """Eq. 4 then Eq. 7: the combined value c of every sample, float64 (N,), input order.

    rewards: (N, K) or (N,) (K = 1) dense tensor of float16, bfloat16, float32 or
    float64, CPU or CUDA. group_size: contiguous groups of this many rows (>= 2,
    dividing N; an integer scalar); or
    group_ids: one integer label per row, any labels, ragged sizes (each >= 2);
    exactly one of the two. weights: K real numbers (default ones), float64.

    missing: what a NaN reward is (spec/gdpo.md section 2). "refuse" (the default): an
    error (NonFiniteError). "unscored": its reward function did not score that sample: it is
    left out of its group column's Eq. 4 statistics and its z is 0 there; a group column
    with fewer than two scored rewards has z = 0 throughout; a row with no scored reward
    has c = 0 (and, in gdpo_advantages, advantage 0 and no part in Eq. 6). An infinity is
    refused under both. diagnostics: an :class:`Diagnostics` the call fills in (how many
    rows had no scored reward, and which).

    Raises InputDtypeError (also a ``missing`` other than those two), ShapeError,
    NonFiniteError (first bad row, column and group), GroupError, WeightError,
    OutOfRangeError (Eq. 7 overflows float64).
    """
    call = _inputs.check_local(rewards=rewards, group_ids=group_ids, group_size=group_size, weights=weights,
                               eps=eps, missing=missing, diagnostics=diagnostics, eq6=False)
    return _pipeline.run(call, _pipeline.NORMALIZE, diagnostics)


@_opaque_to_dynamo
@torch.no_grad()
def group_has_signal(rewards, *, group_ids=None, group_size=None, weights=None, eps=DEFAULT_EPS,
                     missing="refuse", diagnostics=None):
    """(G,) bool: does each group carry a training signal? True iff the group's
    combined values c (exactly the float64 tensor normalize_rewards returns,
    computed by the same code) are not all equal, i.e. min != max.

    Why min != max: Eq. 4 centres every reward column of a group, so in exact
    arithmetic the c of a group sum to zero, and "all equal" means "all zero":
    Eq. 6 then maps the whole group to the unit mean, it contributes no
    gradient difference between its samples, and a dynamic-sampling filter may
    drop it. Any tolerance instead of exact equality would also drop real
    signal (c can be arbitrarily small and still real), and any other predicate
    could disagree with the advantages computed from the same c.

    Groups are ordered by first appearance (group_ids) or contiguously (group_size).
    ``missing`` and ``diagnostics`` as in :func:`normalize_rewards` (an unscored row's c is 0).
    """
    call = _inputs.check_local(rewards=rewards, group_ids=group_ids, group_size=group_size, weights=weights,
                               eps=eps, missing=missing, diagnostics=diagnostics, eq6=False)
    return _pipeline.run(call, _pipeline.SIGNAL, diagnostics)


@_opaque_to_dynamo
@torch.no_grad()
def whiten(values, *, segment_sizes=None, process_group=None, eps=DEFAULT_EPS, out_dtype=torch.float32,
           certified=None):
    """Eq. 6 per whitening unit: a = (v - mean_S) / (std_S + eps), unbiased, float64
    inside, cast once to ``out_dtype``.

    values: (N,) dense tensor of float16, bfloat16, float32 or float64. segment_sizes: this rank's
    sample counts per consecutive unit (non-negative ints summing to N); None is
    one unit over all local rows (and over all ranks with a process group).
    A unit whose values are all exactly equal (across ranks) gives 0; a unit of
    exactly one sample (across ranks) is a SegmentError; an empty unit computes
    nothing. process_group: whiten each unit across the group's ranks (see the
    module docstring for the protocol); None: local only.
    ``torch.distributed.group.WORLD`` is None before ``init_process_group``, so passing it
    then runs a local call. certified: the rounding's certificate, as in :func:`gdpo_advantages`.
    """
    if process_group is None:
        call = _inputs.check_local(values=values, whiten=True, segment_sizes=segment_sizes, eps=eps,
                                   out_dtype=out_dtype, certified=certified)
        return _pipeline.run(call, _pipeline.WHITEN)
    return _distributed.run_distributed(_P.API_WHITEN, process_group, values=values, segment_sizes=segment_sizes,
                                        eps=eps, out_dtype=out_dtype, certified=certified)[0]


@_opaque_to_dynamo
@torch.no_grad()
def gdpo_advantages(rewards, *, group_ids=None, group_size=None, weights=None, segment_sizes=None,
                    process_group=None, eps=DEFAULT_EPS, out_dtype=torch.float32, missing="refuse",
                    diagnostics=None, certified=None):
    """GDPO advantages: whiten(normalize_rewards(...)) with the same bits, and with
    every refusal (of any rank) raised before any statistics are exchanged.

    Arguments as in :func:`normalize_rewards` and :func:`whiten`. Under
    ``missing="unscored"`` a row with no scored reward gets advantage exactly 0 and is
    left out of its unit's Eq. 6 statistics (count and moments, across ranks too); a unit
    with fewer than two scored rows gives 0 throughout, while a unit of one row is still a
    SegmentError. Every rank must pass the same ``missing``; ``diagnostics`` then also
    counts the unscored rows of all ranks. Costs: no CUDA graph and one more host read (the
    scored rows), the same collectives.
    ``torch.distributed.group.WORLD`` is None before ``init_process_group``, so passing it
    then runs a local call. certified: None (``GDPO_CERTIFIED``, else "narrow"), "narrow", "all"
    (or True) or "off" (or False); every rank must pass the same (module docstring).
    """
    if process_group is None:
        call = _inputs.check_local(rewards=rewards, group_ids=group_ids, group_size=group_size, weights=weights,
                                   segment_sizes=segment_sizes, eps=eps, out_dtype=out_dtype, missing=missing,
                                   diagnostics=diagnostics, certified=certified)
        return _pipeline.run(call, _pipeline.GDPO, diagnostics)
    return _distributed.run_distributed(_P.API_GDPO, process_group, rewards=rewards, group_ids=group_ids,
                                        group_size=group_size, weights=weights, segment_sizes=segment_sizes,
                                        eps=eps, out_dtype=out_dtype, missing=missing, diagnostics=diagnostics,
                                        certified=certified)[0]


# What impl declares certified (the conformance property ``certified`` grades those formats bit
# for bit on hunted boundary cases): the default mode's, GDPO_CERTIFIED as it is at import.
gdpo_advantages.gdpo_certified = whiten.gdpo_certified = _certify.declared(_inputs.check_certified(None))
