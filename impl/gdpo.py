"""GDPO advantages (arXiv 2601.05242) in torch, under this project's ``spec`` convention.

Three steps, named as in the paper:

* Eq. 4, ``standardize_groups``: z[i,k] = (r[i,k] - mean_g) / (std_g + eps), per
  group g and reward column k, unbiased std (ddof 1), eps *added to the std*;
* Eq. 7, ``combine``: c[i] = sum_k w[k] z[i,k], weights kept in float64;
* Eq. 6, ``whiten``: a[i] = (c[i] - mean_S) / (std_S + eps) over the whitening
  unit S holding sample i, unbiased, statistics over every rank of the group.

Single reward (K = 1) is *not* GRPO: eps is 1e-4 here (GRPO code mostly uses
1e-6) and Eq. 6 adds a second normalisation. With n_g = 2 any two distinct
values standardize to +-0.7071 (magnitudes are lost; a known limit of Eq. 4).

Numerics (see ``_normalize`` and ``_whiten``): float64 throughout, one cast at
the end. Deviations are shift-invariant (the group's or unit's first sample is
subtracted first, then a two-pass mean and deviations), every group column and
unit is scaled by an exact power of two folded into eps, so rewards up to the
float64 limit (``[-1.7e308, 1.7e308]``) compute without overflow. Exact
collapse is not a threshold: equal values give differences of exactly 0, hence
exactly 0. Constant-sum columns (r2 = C - r1) give z2 = -z1 bit for bit and
c = 0 exactly under equal weights. Sums are one fixed pairwise tree per group
column or unit, made of correctly rounded elementwise additions (no atomics,
no library reduction of floats, no BLAS, no fused multiply-add, no scalar
divisors: CUDA turns those into a multiplication by the reciprocal); min and
max are exact; the square root is the correctly rounded one (NumPy's IEEE
sqrt on CPU, where torch's vectorised float64 sqrt is only faithful; CUDA's
own sqrt.rn). So the same input gives the same bits on every run, and the same
bits on CPU and CUDA (the tree depends on a segment's length only, not on the
layout, device or thread count).

Speed (see ``_normalize`` and ``_whiten``): the work is laid out densely, never
as per-group or per-unit Python loops (groups or units so ragged that padding
would exceed 4x the batch are cut into power-of-two size classes, one padded
layout each). Eq. 4 runs on one float64 copy of the
rewards laid out (K, n, G), groups innermost, so every step is a handful of
whole-tensor kernels over long contiguous rows (log2 n tree levels per sum);
labelled groups take one stable sort and one gather into a padded
(K, n_max, G) layout. Eq. 6 works on views (S, m) of the combined values (or a
padded (S, m_max) layout for ragged units), log2 m tree levels per sum. On
CUDA a small call is bound by kernel launches (about 80); ``GDPO_CUDA_GRAPHS=1``
(opt-in, see ``_graphs``) replays local contiguous-groups calls from a CUDA
graph captured once per signature: the same kernels, hence the same bits.

Decisions this module makes (the brief left them open):

* ``rewards`` of shape (N,) is one reward column (K = 1). Python/NumPy
  sequences are accepted; Python floats are read as float64.
* Input dtypes (``rewards``, ``values``) are float16, bfloat16, float32 and float64,
  the formats of the contract; float8 inputs are refused (InputDtypeError; float8 is an
  output format only, and widening it with ``.float()`` is exact). Tensors must be dense
  (strided): sparse and nested ``rewards``, ``values``, ``group_ids``, ``weights`` and
  ``segment_sizes`` are refused naming the argument and its layout.
* ``group_size`` is an integer scalar: a Python int, a NumPy integer or a 0-d integer
  tensor (a CUDA one is read once); bool and floats are refused (GroupError).
* ``process_group=None`` means *local only*; pass ``torch.distributed.group.WORLD``
  (or any group) to whiten across ranks. Groups of Eq. 4 never span ranks: labels are
  local, so a label on two ranks is two groups (not detected). Anything
  else than None or a ProcessGroup is an InputDtypeError; a ProcessGroup while
  torch.distributed is not initialized (or one destroyed) is a DistributedError, raised
  at once on that rank (no agreement can run without a group).
* ``segment_sizes=None`` is one unit of all local rows, and with a process group
  one unit over all ranks; every rank must then pass None. Passing sizes on
  some ranks and None on others is refused (DistributedError).
* With a process group a rank may hold no rows (``rewards`` of shape (0, K),
  empty units); without one, empty ``rewards`` is a ShapeError and empty
  ``values`` gives an empty result (a unit of 0 samples computes nothing).
* Wrong-length ``group_ids`` raise an error that is both a GroupError and a
  ShapeError; wrong-length weights one that is both a WeightError and a
  ShapeError (the contract lists these cases under both headings).
* ``eps`` must be finite and >= 0 (else OutOfRangeError); ``out_dtype`` must be
  float64, float32, float16, bfloat16 or a signed float8 (else InputDtypeError).
* Integer weights are converted exactly; one float64 cannot hold (|w| > 2**53
  and odd, or beyond range) is refused. Weights above 2**990 are scaled by a
  power of two inside Eq. 7; a combined value that still overflows float64 is
  an OutOfRangeError naming the group (float64 is what normalize_rewards returns).
* Reachable cast failures: a whitened value satisfies |a| <= (n-1)/sqrt(n)
  (Samuelson), so casting to float32/bfloat16/float16 cannot fail below
  ~4e9 samples; only float8 outputs can (float8_e4m3fn saturates at 448 without
  an inf, so a unit of more than ~215000 samples with one outlier fails).
  Values that round beyond the dtype's largest finite value raise OutOfRangeError;
  float64 inputs beyond float32 range are *not* an error: whitening bounds them.
* Every output is the float64 result rounded once to ``out_dtype`` (to nearest,
  ties to even). torch's own double -> float16/bfloat16/float8 conversion rounds
  through float32 (twice, and then not always to nearest); impl rounds to odd in
  float32 first, which makes the second rounding the correct one.
* ``GDPO_FUSED=1`` (opt-in, needs Triton): calls on CUDA tensors run Eq. 4/7 and
  Eq. 6 as a few fused Triton kernels with the same bits (see ``impl._fused``;
  ``GDPO_FUSED=interpret`` runs them on CPU tensors too, in Triton's interpreter,
  for tests). Every API, local or across ranks, with contiguous or labelled groups
  (labelled ones in their padded layout), any K, float64/float32/float16/bfloat16
  rewards and any output dtype. Left on the plain path, with the same results:
  labelled groups so ragged that they take the bucketed layout,
  ``group_has_signal`` with labels, groups of more than 512 rows
  (``_fused.MAX_GROUP``), whitening units of more than 2**26 rows
  (``_fused.MAX_UNIT``), and weights of 2**990 or more or large enough for the
  Eq. 7 overflow check. Where Triton or its compiler fails, a warning says so
  once and the plain path runs.
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
  (2 sqrt(n_max) sum|w| >= 2**1023), and refused calls (locating the culprit).

Distributed protocol (``whiten`` / ``gdpo_advantages`` with ``process_group``):
no rank raises before one fixed-shape all-reduce of an int64 (world_size, 65)
table in which each rank records its facts (unit count, sample count, dtype,
device type, eps, weights digest, any refusal of its own input); then every rank
raises the same DistributedError naming the offending ranks, or none does. The
statistics of all units then travel in one more all-reduce (an exact gather)
and are merged in rank order with Chan's formula, identically on every rank:
two collectives per call for any number of units (three only for the reachable
float8 cast check, or for labelled groups with weights so large that Eq. 7 may
overflow). Collective failures (a dead peer, a timeout) are re-raised as
DistributedError. Labelled groups compute Eq. 4/7 between the two collectives
(their layout needs the agreed table): every input problem is refused before,
and an unexpected local exception there (out of memory) still reaches every
rank, as a flag in the second collective: all ranks raise together. Only an
exception after the last collective (applying Eq. 6 to this rank's rows) is
that rank's alone; the other ranks' results are complete and correct.

Autograd: advantages are data. Every function runs under ``torch.no_grad()``:
inputs that require grad are read as values, and results never require grad.
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
from impl import _pipeline
from impl import _problems as _P

__all__ = [
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
def normalize_rewards(rewards, *, group_ids=None, group_size=None, weights=None, eps=DEFAULT_EPS):
    """Eq. 4 then Eq. 7: the combined value c of every sample, float64 (N,), input order.

    rewards: (N, K) or (N,) (K = 1) dense tensor of float16, bfloat16, float32 or
    float64, CPU or CUDA. group_size: contiguous groups of this many rows (>= 2,
    dividing N; an integer scalar); or
    group_ids: one integer label per row, any labels, ragged sizes (each >= 2);
    exactly one of the two. weights: K real numbers (default ones), float64.

    Raises InputDtypeError, ShapeError, NonFiniteError (first bad row, column
    and group), GroupError, WeightError, OutOfRangeError (Eq. 7 overflows float64).
    """
    return _pipeline.normalize_rewards(rewards, group_ids, group_size, weights, eps)


@_opaque_to_dynamo
@torch.no_grad()
def group_has_signal(rewards, *, group_ids=None, group_size=None, weights=None, eps=DEFAULT_EPS):
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
    """
    return _pipeline.group_has_signal(rewards, group_ids, group_size, weights, eps)


@_opaque_to_dynamo
@torch.no_grad()
def whiten(values, *, segment_sizes=None, process_group=None, eps=DEFAULT_EPS, out_dtype=torch.float32):
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
    then runs a local call.
    """
    if process_group is None:
        return _pipeline.whiten_local(values, segment_sizes, eps, out_dtype)[0]
    return _pipeline.run_distributed(_API_WHITEN, process_group, values=values,
                                     segment_sizes=segment_sizes, eps=eps, out_dtype=out_dtype)[0]


@_opaque_to_dynamo
@torch.no_grad()
def gdpo_advantages(rewards, *, group_ids=None, group_size=None, weights=None, segment_sizes=None,
                    process_group=None, eps=DEFAULT_EPS, out_dtype=torch.float32):
    """GDPO advantages: whiten(normalize_rewards(...)) with the same bits, and with
    every refusal (of any rank) raised before any statistics are exchanged.

    Arguments as in :func:`normalize_rewards` and :func:`whiten`.
    ``torch.distributed.group.WORLD`` is None before ``init_process_group``, so passing it
    then runs a local call.
    """
    if process_group is None:
        return _pipeline.gdpo_local(rewards, group_ids, group_size, weights, segment_sizes, eps, out_dtype)[0]
    return _pipeline.run_distributed(_API_GDPO, process_group, rewards=rewards, group_ids=group_ids,
                                     group_size=group_size, weights=weights, segment_sizes=segment_sizes,
                                     eps=eps, out_dtype=out_dtype)[0]
