"""The error contract's cases, as data: how to break a valid call, and what the contract says.

An :class:`ErrorCase` (one process) or :class:`DistErrorCase` (one rank of several) names a
refusal of the contract (spec section 6), the classes it allows and how to build it from a valid
case (OpInfo's ErrorInput); :func:`error_cases` and :func:`dist_error_cases` draw them.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable

from hypothesis import strategies as st

from conformance import strategies as S
from conformance.cases import Case, DistCase
from spec.errors import (
    GroupError,
    InputDtypeError,
    NonFiniteError,
    OutOfRangeError,
    SegmentError,
    ShapeError,
    WeightError,
)


@dataclasses.dataclass(frozen=True)
class ErrorCase:
    """One refusal of the contract (OpInfo's ErrorInput): how to break a valid call,
    which classes the contract allows, and whether the oracle refuses it too."""
    name: str
    expect: tuple
    why: str
    build: Callable  # (draw, case) -> case
    #: call shapes that can express it (subject.py says how the verl shape does)
    shapes: tuple = ("gdpo", "trl")
    oracle: bool = False  # cross-check: the oracle refuses the same batch with one of ``expect``
    needs: tuple = ()  # what of the call it breaks (labels, units, eps): a domain without it is not asked


def _cell(draw, case: Case):
    return draw(st.integers(0, case.n - 1)), draw(st.integers(0, case.k - 1))


def _set(case: Case, i: int, k: int, value: float) -> Case:
    rows = [list(r) for r in case.rewards]
    rows[i][k] = value
    return dataclasses.replace(case, rewards=tuple(tuple(r) for r in rows))


def _zero_weight(draw, case: Case, k: int) -> Case:
    """The case with column k weighted 0 (+0 or -0) and some other column not (a copy of
    column k appended, weight 1, where k is the only column): the contract refuses a
    non-finite reward in any column, whatever its weight (spec section 6), so an
    implementation that drops zero-weight columns before validating fails here."""
    if case.k == 1:
        case = dataclasses.replace(case, rewards=tuple(r + (r[0],) for r in case.rewards))
    w = list(case.weights) if case.weights is not None else [1.0] * case.k
    w += [1.0] * (case.k - len(w))
    w[k] = draw(st.sampled_from([0.0, -0.0]))
    if not any(v != 0.0 for j, v in enumerate(w) if j != k):
        w[(k + 1) % case.k] = 1.0
    return _weights(case, w)


def _nonfinite(values):
    """Build: one reward of ``values`` in a random cell, in every other case in a column of
    weight 0."""
    def build(draw, case: Case) -> Case:
        i, k = _cell(draw, case)
        if draw(st.booleans()):
            case = _zero_weight(draw, case, k)
        return _set(case, i, k, draw(st.sampled_from(values)))
    return build


def _labels(case: Case) -> Case:
    """The same case with group_ids (labels) instead of group_size."""
    if case.group_ids is not None:
        return case
    return dataclasses.replace(case, group_ids=tuple(int(x) for x in case.labels()), group_size=None)


def _add_singleton(draw, case: Case) -> Case:
    c = _labels(case)
    row = tuple(draw(st.sampled_from([0.0, 1.0])) for _ in range(c.k))
    at = draw(st.integers(0, c.n))
    rows = c.rewards[:at] + (row,) + c.rewards[at:]
    labels = c.group_ids[:at] + (max(c.group_ids) + 1,) + c.group_ids[at:]
    seg = c.segment_sizes
    if seg is not None:  # the new row joins the unit it lands in (not a unit of one)
        u = next((u for u, (s, end) in enumerate(zip(seg, itertools.accumulate(seg))) if s > 0 and at <= end),
                 len(seg) - 1)
        seg = seg[:u] + (seg[u] + 1,) + seg[u + 1:]
    return dataclasses.replace(c, rewards=rows, group_ids=labels, segment_sizes=seg)


def _drop_last_row(draw, case: Case) -> Case:
    c = case if case.group_size is not None else dataclasses.replace(case, group_ids=None, group_size=2)
    n = c.n - 1 if c.n % c.group_size == 0 else c.n
    rows = c.rewards[:n] if n else c.rewards[:1]
    if len(rows) % c.group_size == 0:
        rows = rows + (rows[0],)
    return dataclasses.replace(c, rewards=rows, segment_sizes=None)


def _unit_of_one(draw, case: Case) -> Case:
    at = draw(st.integers(0, case.n - 1))
    return dataclasses.replace(case, segment_sizes=(at, 1, case.n - at - 1))


def _weights(case: Case, w) -> Case:
    return dataclasses.replace(case, weights=tuple(w))


#: Every call shape (conformance.subject.CALL_SHAPES).
ALL_SHAPES = ("gdpo", "trl", "verl")

ERROR_CASES = (
    ErrorCase("nan_reward", (NonFiniteError,), "a NaN reward (in any column, a zero-weight one too)",
              _nonfinite([math.nan]), shapes=ALL_SHAPES, oracle=True),
    ErrorCase("inf_reward", (NonFiniteError,), "an infinite reward (in any column, a zero-weight one too)",
              _nonfinite([math.inf, -math.inf]), shapes=ALL_SHAPES, oracle=True),
    ErrorCase("integer_rewards", (InputDtypeError,), "an integer tensor where floats are required",
              lambda d, c: dataclasses.replace(c, rewards=tuple(tuple(float(round(v)) for v in r) for r in c.rewards),
                                               dtype=d(st.sampled_from(["int64", "int32"]))), shapes=("gdpo", "verl")),
    ErrorCase("bool_rewards", (InputDtypeError,), "a bool tensor where floats are required",
              lambda d, c: dataclasses.replace(c, dtype="bool"), shapes=("gdpo", "verl")),
    ErrorCase("complex_rewards", (InputDtypeError,), "a complex tensor where real floats are required",
              lambda d, c: dataclasses.replace(c, dtype="complex64"), shapes=("gdpo", "verl")),
    ErrorCase("group_of_one", (GroupError,), "a group of one sample has no unbiased std",
              _add_singleton, shapes=("gdpo", "verl"), oracle=True, needs=("labels",)),
    ErrorCase("group_size_one", (GroupError,), "group_size 1: groups of one sample",
              lambda d, c: dataclasses.replace(c, group_ids=None, group_size=1, segment_sizes=None), shapes=ALL_SHAPES,
              oracle=True),
    ErrorCase("group_size_not_dividing", (GroupError,), "N not a multiple of group_size", _drop_last_row),
    ErrorCase("labels_length", (ShapeError, GroupError), "group labels of the wrong length (group_ids; verl: index)",
              lambda d, c: dataclasses.replace(_labels(c), group_ids=_labels(c).group_ids[:-1]
                                               if d(st.booleans()) else _labels(c).group_ids + (0,)),
              shapes=("gdpo", "verl"), needs=("labels",)),
    ErrorCase("float_labels", (GroupError, InputDtypeError), "float group labels",
              lambda d, c: dataclasses.replace(_labels(c), variant="float_labels"), shapes=("gdpo",),
              needs=("labels",)),
    ErrorCase("both_group_arguments", (GroupError,), "group_ids and group_size together",
              lambda d, c: dataclasses.replace(c, variant="both_groups"), shapes=("gdpo",)),
    ErrorCase("no_group_argument", (GroupError,), "neither group_ids nor group_size",
              lambda d, c: dataclasses.replace(c, variant="no_groups"), shapes=("gdpo",)),
    ErrorCase("weights_all_zero", (WeightError,), "all-zero weights would make every advantage zero",
              lambda d, c: _weights(c, [d(st.sampled_from([0.0, -0.0])) for _ in range(c.k)]), shapes=ALL_SHAPES,
              oracle=True),
    ErrorCase("weight_nonfinite", (WeightError,), "a NaN or infinite weight",
              lambda d, c: _weights(c, [d(st.sampled_from([math.nan, math.inf, -math.inf])) if j == 0 else 1.0
                                        for j in range(c.k)][::d(st.sampled_from([1, -1]))]), shapes=ALL_SHAPES,
              oracle=True),
    ErrorCase("weights_length", (WeightError, ShapeError), "one weight per reward column",
              lambda d, c: _weights(c, [1.0] * (c.k + d(st.sampled_from([1, 2])))), shapes=ALL_SHAPES, oracle=True),
    ErrorCase("segments_negative", (SegmentError,), "a negative unit size",
              lambda d, c: dataclasses.replace(c, segment_sizes=(c.n + 1, -1)), shapes=("gdpo",), needs=("units",)),
    ErrorCase("segments_sum", (SegmentError,), "unit sizes that do not sum to the local sample count",
              lambda d, c: dataclasses.replace(c, segment_sizes=(c.n + d(st.sampled_from([1, -1, 5])),)),
              shapes=("gdpo",), needs=("units",)),
    ErrorCase("unit_of_one", (SegmentError,), "a whitening unit of one sample has no unbiased std",
              _unit_of_one, shapes=("gdpo",), oracle=True, needs=("units",)),
    ErrorCase("empty_batch", (ShapeError,), "no samples", lambda d, c: dataclasses.replace(c, variant="empty"),
              shapes=("gdpo", "verl")),
    ErrorCase("rewards_3d", (ShapeError,), "rewards must be (N, K) or (N,) (verl: token rewards (B, T))",
              lambda d, c: dataclasses.replace(c, variant="rewards_3d"), shapes=("gdpo", "verl")),
    ErrorCase("eps_invalid", (OutOfRangeError,), "eps must be finite and >= 0",
              lambda d, c: dataclasses.replace(c, eps=d(st.sampled_from([-1e-4, math.nan, math.inf]))),
              shapes=("gdpo",), needs=("eps",)),
    ErrorCase("out_dtype_integer", (InputDtypeError,), "an integer output dtype",
              lambda d, c: dataclasses.replace(c, variant="int_out_dtype"), shapes=("gdpo",)),
)
ERROR_BY_NAME = {e.name: e for e in ERROR_CASES}

#: One cause per check an implementation makes or misses (a grading's findings are one per cause,
#: conformance/findings.py): error cases that one check refuses share a cause, the others are their own.
CAUSES = {"nan_reward": "non-finite rewards", "inf_reward": "non-finite rewards",
          "integer_rewards": "integer or bool rewards", "bool_rewards": "integer or bool rewards",
          "group_of_one": "groups of one sample", "group_size_one": "groups of one sample",
          "both_group_arguments": "the group arguments", "no_group_argument": "the group arguments",
          "segments_negative": "the unit sizes", "segments_sum": "the unit sizes"}


@st.composite
def error_cases(draw, ctx: S.Context, shape: str, names=None) -> tuple:
    """One valid base call, broken in every way the contract lists (or those ``names``):
    a tuple of cases, each noted ``error:<name>``."""
    pool = [e for e in ERROR_CASES if shape in e.shapes and (names is None or e.name in names)
            and all(getattr(ctx, need) for need in e.needs)]
    base = draw(S.cases(ctx, kinds=("binary", "ints", "plain"), pairs=(), weight_modes=("none", "ones", "random"),
                        k_max=3, dtype="float32" if shape == "trl" and "float32" in ctx.input_dtypes else None))
    return tuple(dataclasses.replace(ec.build(draw, base), note=f"error:{ec.name}") for ec in pool)


#: Error cases a convention may compute by its own policy (graded by :func:`conformance.judge.policy`, against
#: the oracle under that convention) instead of refusing: the field of ``spec.conventions.Convention``
#: that says so, and the value that means "refuse".
POLICY_CASES = {"nan_reward": ("nan", "error"), "group_of_one": ("singleton", "error"),
                "group_size_one": ("singleton", "error")}
#: Error cases whose input has a value under every convention: integer and bool rewards are exact
#: floats. A peer that computes them must return the convention's result on those values (a peer
#: that refuses them passes too); accepting them is not a defect of the formula.
VALUE_CASES = ("integer_rewards", "bool_rewards")
#: Error cases that are this project's choices, not defects of a peer's formula: graded under spec only
#: (float labels: any hashable is a label to a peer; the two group arguments and the output dtype are the
#: gdpo shape's own, which an adapter of a peer supplies; an empty batch has an empty answer, which
#: refusing is this project's choice).
SPEC_ONLY_CASES = ("float_labels", "both_group_arguments", "no_group_argument", "out_dtype_integer",
                    "empty_batch")


@dataclasses.dataclass(frozen=True)
class DistErrorCase:
    name: str
    why: str
    build: Callable  # (draw, DistCase, offender) -> DistCase
    names_offender: bool = True
    min_world: int = 1  # cross-rank disagreements need two ranks to disagree
    units: bool = False  # breaks the whitening units: not asked of a domain without them


def _shard(case: DistCase, r: int, **changes) -> DistCase:
    shards = list(case.shards)
    shards[r] = dataclasses.replace(shards[r], **changes)
    return DistCase(tuple(shards), case.note)


def _nonempty(case: DistCase, r: int) -> int:
    """Rank ``r``, or the first rank with rows where ``r`` has none (a batch has rows)."""
    return next(q for q in [r, *range(case.world)] if case.shards[q].n)


def _d_nonfinite(value):
    def build(draw, case, r):
        return _shard(case, r, rewards=_set(case.shards[r], *_cell(draw, case.shards[r]), value).rewards)
    return build


def _d_singleton(draw, case, r):
    s = case.shards[r]
    row = (1.0,) * s.k
    seg = None if s.segment_sizes is None else s.segment_sizes[:-1] + (s.segment_sizes[-1] + 1,)
    return _shard(case, r, rewards=s.rewards + (row,), group_ids=s.group_ids + (10 ** 6,), segment_sizes=seg)


def _d_segments_none(draw, case, r):
    shards = [dataclasses.replace(s, segment_sizes=s.segment_sizes + (0,)) if len(s.segment_sizes) < 2 else s
              for s in case.shards]
    shards[r] = dataclasses.replace(shards[r], segment_sizes=None)
    return DistCase(tuple(shards), case.note)


def _d_unit_of_one(draw, case, r):
    shards = []
    for q, s in enumerate(case.shards):
        seg = list(s.segment_sizes)
        if q == r:
            seg[-1] -= 1
            seg.append(1)
        else:
            seg.append(0)
        shards.append(dataclasses.replace(s, segment_sizes=tuple(seg)))
    return DistCase(tuple(shards), case.note)


def _d_segments_sum(draw, case, r):
    seg = list(case.shards[r].segment_sizes)
    seg[0] += draw(st.sampled_from([1, 3]))
    return _shard(case, r, segment_sizes=tuple(seg))


DIST_ERROR_CASES = (
    DistErrorCase("nan_on_one_rank", "a NaN reward on one rank", _d_nonfinite(math.nan)),
    DistErrorCase("inf_on_one_rank", "an infinite reward on one rank", _d_nonfinite(-math.inf)),
    DistErrorCase("group_of_one_on_one_rank", "a group of one sample on one rank", _d_singleton),
    DistErrorCase("segments_sum_on_one_rank", "unit sizes not summing to the rank's samples", _d_segments_sum,
                  units=True),
    # disagreements: no rank's input is wrong on its own, so naming one rank is not asked
    DistErrorCase("unit_count_mismatch", "ranks disagree on the number of units",
                  lambda d, c, r: _shard(c, r, segment_sizes=c.shards[r].segment_sizes + (0,)), min_world=2,
                  units=True, names_offender=False),
    DistErrorCase("segments_none_on_one_rank", "segment metadata missing on one rank, several units elsewhere",
                  _d_segments_none, min_world=2, units=True, names_offender=False),
    DistErrorCase("integer_rewards_on_one_rank", "an integer tensor on one rank",
                  lambda d, c, r: _shard(c, r, dtype="int64",
                                         rewards=tuple(tuple(float(round(v)) for v in row)
                                                       for row in c.shards[r].rewards))),
    DistErrorCase("unit_of_one_across_ranks", "a whitening unit holding one sample over all ranks",
                  _d_unit_of_one, names_offender=False, units=True),
)
DIST_ERROR_BY_NAME = {e.name: e for e in DIST_ERROR_CASES}


@st.composite
def dist_error_cases(draw, ctx: S.Context, world: int) -> DistCase:
    ec = draw(st.sampled_from([e for e in DIST_ERROR_CASES if world >= e.min_world and (ctx.units or not e.units)]))
    base = draw(S.dist_cases(ctx, world, kinds=("binary", "ints", "plain"), pairs=(),
                             weight_modes=("none", "ones", "random"), k_max=3))
    if ec.units:  # its unit sizes are what it breaks: one unit given as sizes
        base = DistCase(tuple(dataclasses.replace(s, segment_sizes=s.segment_sizes or (s.n,)) for s in base.shards),
                        base.note)
    r = _nonempty(base, draw(st.integers(0, world - 1)))
    case = ec.build(draw, base, r)
    return DistCase(case.shards, note=f"error:{ec.name}:{r}")

