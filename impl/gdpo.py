"""GDPO advantages (arXiv 2601.05242) in torch, under this project's ``spec`` convention: Eq. 4
``standardize_groups``, Eq. 7 ``combine``, Eq. 4 + 7 ``normalize_rewards``, Eq. 6 ``whiten``, all
three ``gdpo_advantages`` (``oracle.gdpo``'s names and keywords). What they compute, refuse and
guarantee: spec/gdpo.md; how: docs/architecture.md. Every function runs under ``torch.no_grad()``.

Host synchronisations on CUDA: one per call (the facts row or the agreement table). More only for
weights or segment_sizes given as CUDA tensors, more than 32 units across ranks, the float8 cast
check, labelled groups padded beyond 4x the batch, weights that may overflow Eq. 7,
``missing="unscored"`` (the scored rows' mask), and refused calls.
"""

from __future__ import annotations

import functools

import torch

from spec.constants import DEFAULT_EPS
from spec.errors import (DistributedError, GDPOError, GroupError, InputDtypeError, NonFiniteError,
                         OutOfRangeError, SegmentError, ShapeError, WeightError)
from impl import _certify, _distributed, _inputs, _pipeline
from impl import _problems as _P

__all__ = ["Diagnostics", "standardize_groups", "combine", "normalize_rewards", "whiten", "gdpo_advantages",
           "group_has_signal", "GDPOError", "NonFiniteError", "InputDtypeError", "ShapeError", "GroupError",
           "WeightError", "SegmentError", "OutOfRangeError", "DistributedError"]

Diagnostics = _inputs.Diagnostics


def _opaque_to_dynamo(fn):
    """An entry point torch.compile calls instead of tracing (docs/adopting.md), disabled only while
    dynamo traces: ``torch.compiler.disable`` at import would import torch._dynamo and Triton in
    every process that imports impl (1.5 s)."""
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
    """Eq. 4 alone: z (N, K) float64, input order: ``combine(standardize_groups(r, ...), weights=w)``
    is ``normalize_rewards(r, ..., weights=w)`` bit for bit. Arguments and refusals as in
    :func:`normalize_rewards` (no weights)."""
    call = _inputs.check_local(rewards=rewards, group_ids=group_ids, group_size=group_size, eps=eps,
                               missing=missing, diagnostics=diagnostics, eq6=False)
    return _pipeline.run(call, _pipeline.STANDARDIZE, diagnostics)


@_opaque_to_dynamo
@torch.no_grad()
def combine(z, *, weights=None):
    """Eq. 7 alone: c = sum_k w_k z_k, float64 (N,), by normalize_rewards' arithmetic (products
    rounded one by one, summed left to right). z: (N, K) or (N,) finite floats; weights: K real
    numbers (default ones). Raises InputDtypeError, ShapeError, NonFiniteError (first bad row and
    column), WeightError, OutOfRangeError (the sum overflows float64)."""
    return _pipeline.combine(z, weights)


@_opaque_to_dynamo
@torch.no_grad()
def normalize_rewards(rewards, *, group_ids=None, group_size=None, weights=None, eps=DEFAULT_EPS,
                      missing="refuse", diagnostics=None):
    """Eq. 4 then Eq. 7: the combined value c of every sample, float64 (N,), input order.

    rewards: (N, K) or (N,) (K = 1), float16, bfloat16, float32 or float64, CPU or CUDA, or a
    Python/NumPy sequence (read as float64). Exactly one of group_size (contiguous groups of this
    many rows, >= 2, dividing N) and group_ids (one integer label per row, ragged groups of >= 2).
    weights: K real numbers (default ones), float64.

    missing (spec/gdpo.md section 2): "refuse" (the default) refuses a NaN reward; "unscored"
    leaves it out of its group column's Eq. 4 statistics (z = 0 there; c = 0 for a row with no
    scored reward). An infinity is refused under both. diagnostics: a :class:`Diagnostics`.

    Raises InputDtypeError, ShapeError, NonFiniteError (first bad row, column and group),
    GroupError, WeightError, OutOfRangeError (Eq. 7 overflows float64)."""
    call = _inputs.check_local(rewards=rewards, group_ids=group_ids, group_size=group_size, weights=weights,
                               eps=eps, missing=missing, diagnostics=diagnostics, eq6=False)
    return _pipeline.run(call, _pipeline.NORMALIZE, diagnostics)


@_opaque_to_dynamo
@torch.no_grad()
def group_has_signal(rewards, *, group_ids=None, group_size=None, weights=None, eps=DEFAULT_EPS,
                     missing="refuse", diagnostics=None):
    """(G,) bool: does each group carry a training signal, i.e. are its combined values c (the
    float64 tensor normalize_rewards returns) not all equal (min != max)? Eq. 4 centres every
    column, so exactly "all equal" is "all zero": Eq. 6 maps the group to the unit mean and it
    gives no gradient difference. A tolerance would drop real signal (c may be tiny and real)
    and could disagree with the advantages of the same c. Groups by first appearance
    (group_ids) or contiguous (group_size); arguments as in :func:`normalize_rewards`."""
    call = _inputs.check_local(rewards=rewards, group_ids=group_ids, group_size=group_size, weights=weights,
                               eps=eps, missing=missing, diagnostics=diagnostics, eq6=False)
    return _pipeline.run(call, _pipeline.SIGNAL, diagnostics)


@_opaque_to_dynamo
@torch.no_grad()
def whiten(values, *, segment_sizes=None, process_group=None, eps=DEFAULT_EPS, out_dtype=torch.float32,
           certified=None):
    """Eq. 6 per whitening unit: a = (v - mean_S) / (std_S + eps), unbiased, float64 inside, cast
    once to ``out_dtype``.

    values: (N,) as rewards in :func:`normalize_rewards`. segment_sizes: this rank's sample counts
    per consecutive unit (non-negative ints summing to N); None: one unit of all rows (of all
    ranks with a process group). A unit of equal values gives 0, an empty one computes nothing,
    one of a single sample (across ranks) is a SegmentError. process_group: whiten each unit
    across its ranks (spec/gdpo.md section 5); None, or ``torch.distributed.group.WORLD`` before
    ``init_process_group``: local. certified: as in :func:`gdpo_advantages`."""
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
    """GDPO advantages: whiten(normalize_rewards(...)) with the same bits, every refusal (of any
    rank) raised before any statistics are exchanged. Arguments as in :func:`normalize_rewards`
    and :func:`whiten`.

    ``missing="unscored"``: a row with no scored reward gets advantage 0 and no part in Eq. 6
    (spec/gdpo.md section 2; costs no CUDA graph, one more host read). certified (section 7a):
    None (``GDPO_CERTIFIED``, else "narrow"), "narrow", "all" (or True) or "off" (or False).
    Every rank must pass the same ``missing`` and ``certified``."""
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
