"""GDPO advantages (arXiv 2601.05242) in torch, under this project's ``spec`` convention.

The steps carry the paper's names and the same keywords as in ``oracle.gdpo`` (the exact
reference): Eq. 4 ``standardize_groups``, Eq. 7 ``combine``, Eq. 4 + 7 ``normalize_rewards``,
Eq. 6 ``whiten``, and all three, ``gdpo_advantages``. What they compute and why is in
spec/gdpo.md: the equations (section 1), the decisions and their reasons (section 2; K = 1
is not GRPO, n_g = 2 loses magnitudes), whitening units (section 4), the distributed
protocol (section 5: one fixed-shape agreement all-reduce before any data-dependent
collective, the statistics in one more; all ranks raise together or none does), the error
contract (section 6) and the tolerances this module is held to (section 7).

Certified rounding (``impl._certify``, spec/gdpo.md section 7a): every float32, bfloat16 and
float16 output is the exact advantage correctly rounded (``certified="narrow"``, the default);
``certified="all"`` adds float64 outputs within one ulp of it, ``certified="off"`` is the plain
path; the default is ``GDPO_CERTIFIED``, read at each call that passes none. A run-time bound
certifies the float64 result's rounding, and the samples it cannot are recomputed from their
groups exactly, in double-double, then exactly. ``Diagnostics.certified`` counts each tier.

How (see ``_groups``, ``_eq4``, ``_eq7``, ``_whiten``, ``_segments``): float64 inside and one correctly
rounded cast at the end (to odd in float32 first, so float16, bfloat16 and float8 are
rounded once); shift-invariant two-pass statistics scaled by exact powers of two, so
rewards up to float64's limit compute without overflow and exact collapse needs no
threshold; one fixed pairwise tree per group column or unit, no atomics, BLAS or fused
multiply-add, the correctly rounded sqrt: the same bits on every run, on CPU and on CUDA.
Dense layouts, never per-group Python loops. Every function runs under
``torch.no_grad()``: advantages are data.

Inputs (refusals: spec/gdpo.md section 6): float16, bfloat16, float32 or float64 dense
tensors, or Python/NumPy sequences read as float64 (float8 is an output format only);
``group_size`` an integer scalar (a 0-d integer tensor too); ``process_group=None`` a local
call, and with a group a rank may hold no rows; ``segment_sizes=None`` one unit (over all
ranks with a group; None on some ranks only is refused). Groups of Eq. 4 never span ranks.
A whitened value is at most (n-1)/sqrt(n) (Samuelson), so only float8 outputs can fail
their cast (OutOfRangeError).

Opt-ins and costs:

* ``GDPO_FUSED=1`` (opt-in, needs Triton): calls on CUDA tensors run Eq. 4/7 and
  Eq. 6 as a few fused Triton kernels with the same bits. Which calls take it, and
  which stay on the plain path, is listed once, in ``impl._fused``'s docstring.
* Host synchronisations on CUDA: one per call (the read of the facts row / the
  agreement table), whatever the number of groups or units; host lists (labels,
  sizes) are copied pinned and non-blocking, and small constants (counts,
  weights) are kept on the device. With contiguous groups the read comes last,
  after every kernel of the call is queued; labelled groups read G and n_max
  (the padded layout's shape) in the same read, before Eq. 4. Extra reads only
  where stated: weights or segment_sizes given as CUDA tensors (one read each;
  pass lists), more than 32 units across ranks (their counts are read after
  the statistics gather), the float8 cast check, labelled groups so ragged
  that padding would exceed 4x the batch (the bucket sizes), labelled groups
  with weights so large that Eq. 7 may overflow float64
  (2 sqrt(n_max) sum|w| >= 2**1023), ``missing="unscored"`` (the scored rows' mask,
  on every call with the option; it also takes the plain path), and refused calls
  (locating the culprit).

Missing rewards: ``missing="refuse"`` (the default) refuses a NaN reward;
``missing="unscored"`` reads it as one its reward function did not score (spec/gdpo.md
section 2), and :class:`Diagnostics` counts the rows with no scored reward.
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
from impl import _distributed, _inputs, _pipeline
from impl import _problems as _P

__all__ = [
    "Diagnostics",
    "standardize_groups",
    "combine",
    "normalize_rewards",
    "whiten",
    "gdpo_advantages",
    "group_has_signal",
    "GDPOError",
    "NonFiniteError",
    "InputDtypeError",
    "ShapeError",
    "GroupError",
    "WeightError",
    "SegmentError",
    "OutOfRangeError",
    "DistributedError",
]

_API_WHITEN = _P.API_WHITEN

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
_API_GDPO = _P.API_GDPO



@_opaque_to_dynamo
@torch.no_grad()
def standardize_groups(rewards, *, group_ids=None, group_size=None, eps=DEFAULT_EPS, missing="refuse",
                       diagnostics=None):
    """Eq. 4 alone: z (N, K) float64, input order, the very z normalize_rewards combines
    (``combine(standardize_groups(r, ...), weights=w)`` is ``normalize_rewards(r, ..., weights=w)``
    bit for bit).

    Arguments and refusals as in :func:`normalize_rewards` (no weights: Eq. 7 is not applied).
    """
    call = _inputs.check_normalize(rewards, group_ids, group_size, None, eps, missing, diagnostics)
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
    call = _inputs.check_normalize(rewards, group_ids, group_size, weights, eps, missing, diagnostics)
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
    call = _inputs.check_normalize(rewards, group_ids, group_size, weights, eps, missing, diagnostics)
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
        return _pipeline.run(_inputs.check_whiten(values, segment_sizes, eps, out_dtype, certified), _pipeline.WHITEN)
    return _distributed.run_distributed(_API_WHITEN, process_group, values=values, segment_sizes=segment_sizes,
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
    counts the unscored rows of all ranks. Costs: the plain path (no ``GDPO_FUSED``, no
    CUDA graph) and one more host read (the scored rows), the same collectives.
    ``torch.distributed.group.WORLD`` is None before ``init_process_group``, so passing it
    then runs a local call. certified: None (``GDPO_CERTIFIED``, else "narrow"), "narrow", "all"
    (or True) or "off" (or False); every rank must pass the same (module docstring).
    """
    if process_group is None:
        call = _inputs.check_gdpo(rewards, group_ids, group_size, weights, segment_sizes, eps, out_dtype, missing,
                                  diagnostics, certified)
        return _pipeline.run(call, _pipeline.GDPO, diagnostics)
    return _distributed.run_distributed(_API_GDPO, process_group, rewards=rewards, group_ids=group_ids,
                                        group_size=group_size, weights=weights, segment_sizes=segment_sizes,
                                        eps=eps, out_dtype=out_dtype, missing=missing, diagnostics=diagnostics,
                                        certified=certified)[0]


# What impl declares certified (the conformance property ``certified`` grades those formats bit
# for bit on hunted boundary cases, conformance/boundary.py): the default mode's, GDPO_CERTIFIED
# as it is at import.
from impl import _certify, _inputs  # noqa: E402

gdpo_advantages.gdpo_certified = whiten.gdpo_certified = _certify.declared(_inputs.check_certified(None))
