"""No rank fails alone (issue 45): each argument of ``gdpo_advantages`` and ``whiten``, wrong on
one rank of 2 and of 4 gloo ranks, is refused on every rank together, with the same message,
within RETURN_S; and the retry that follows, right on every rank, computes the oracle's bits.

Every argument but ``process_group`` is checked inside the ranks' agreement (a rank that is
handed no group has nothing to agree over: tests/test_impl_distributed.py pins what happens
then). A rank whose thread flushes subnormals is one more such argument: its refusal rides in
the agreement as well.

What failed before the fix: a ``diagnostics`` of the wrong type raised a raw TypeError on its
rank alone, before the agreement; the peers waited in the agreement, met that rank's retry
there and returned advantages of two different batches whitened together (cross-step
pairing), and their own retry then waited out the group timeout. Each scenario's retry uses a
batch of its own, so a pairing shows as wrong bits or as a refusal of the retry.

One spawned group per world size runs every scenario in order (tests/_dist.py), so one test
per world checks them all and lists every scenario that failed.
"""

from __future__ import annotations

import functools
import os
import random
import re
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402

from oracle import gdpo as oracle  # noqa: E402

pytestmark = pytest.mark.distributed

GROUP_TIMEOUT_S = 20.0  # a rank left waiting shows as a call slower than RETURN_S, never a hang
DEADLINE_S = 150.0
RETURN_S = 5.0  # every rank returns (raises or computes) within this, per call
WORLDS = [2, 4]
ROWS, K = 4, 2
WEIGHTS, EPS = [1.0, 0.5], 1e-4
LABELS = [5, 7, 5, 7]  # each rank's own groups (labels are local to a rank)
F32 = ("dtype", "float32")

#: (api, argument, wrong value, the refusal every rank raises: a regex, ``{w}`` the wrong rank).
#: A value that is no refusal on its own rank but differs from the peers' is wrong as well.
WRONG = [
    ("gdpo_advantages", "rewards", ("tensor", [[1, 0]] * ROWS, "int64"), r"rank {w}: InputDtypeError: rewards has dtype int64"),
    ("gdpo_advantages", "rewards", "not rewards", r"rank {w}: InputDtypeError: rewards must be a tensor"),
    ("gdpo_advantages", "group_size", 1, r"rank {w}: GroupError: group_size=1"),
    ("gdpo_advantages", "group_size", "2", r"rank {w}: GroupError: group_size must be"),
    ("gdpo_advantages", "group_ids", [5, 5, 5, 7], r"rank {w}: GroupError: group label 7 \(first row 3\) has 1 sample"),
    ("gdpo_advantages", "group_ids", [5, 7, 5], r"rank {w}: GroupLengthError: group_ids has 3 labels"),
    ("gdpo_advantages", "weights", [0.0, 0.0], r"rank {w}: WeightError: all 2 weights are zero"),
    ("gdpo_advantages", "weights", "w", r"rank {w}: WeightError: weights must be"),
    ("gdpo_advantages", "weights", [1.0, 0.25], r"weights differ across ranks"),
    ("gdpo_advantages", "segment_sizes", [3], r"rank {w}: SegmentError: segment_sizes sum to 3"),
    ("gdpo_advantages", "segment_sizes", [2, 2], r"disagree on the number of whitening units"),
    ("gdpo_advantages", "segment_sizes", None, r"segment_sizes is None on some ranks"),
    ("gdpo_advantages", "eps", -1.0, r"rank {w}: OutOfRangeError: eps=-1.0 must be finite"),
    ("gdpo_advantages", "eps", "1e-4", r"rank {w}: InputDtypeError: eps must be a real number"),
    ("gdpo_advantages", "eps", 1e-6, r"eps differs across ranks"),
    ("gdpo_advantages", "out_dtype", "float32", r"rank {w}: InputDtypeError: out_dtype must be one of"),
    ("gdpo_advantages", "out_dtype", ("dtype", "float64"), r"out_dtype differs across ranks"),
    ("gdpo_advantages", "missing", "skip", r"rank {w}: InputDtypeError: missing must be"),
    ("gdpo_advantages", "missing", "unscored", r"the missing policy differs across ranks"),
    ("gdpo_advantages", "diagnostics", "yes", r"rank {w}: InputDtypeError: diagnostics must be an impl.gdpo.Diagnostics"),
    ("gdpo_advantages", "certified", "maybe", r"rank {w}: InputDtypeError: certified must be"),
    ("gdpo_advantages", "certified", "off", r"the certified mode differs across ranks"),
    ("gdpo_advantages", "flush_denormal", True, r"rank {w}: GDPOError: this process computes with flush-to-zero"),
    ("whiten", "values", ("tensor", [1, 2, 3, 4], "int64"), r"rank {w}: InputDtypeError: values has dtype int64"),
    ("whiten", "values", "not values", r"rank {w}: InputDtypeError: values must be a tensor"),
    ("whiten", "segment_sizes", [3], r"rank {w}: SegmentError: segment_sizes sum to 3"),
    ("whiten", "segment_sizes", [2, 2], r"disagree on the number of whitening units"),
    ("whiten", "eps", -1.0, r"rank {w}: OutOfRangeError: eps=-1.0 must be finite"),
    ("whiten", "eps", 1e-6, r"eps differs across ranks"),
    ("whiten", "out_dtype", "float32", r"rank {w}: InputDtypeError: out_dtype must be one of"),
    ("whiten", "certified", "maybe", r"rank {w}: InputDtypeError: certified must be"),
    ("whiten", "certified", "off", r"the certified mode differs across ranks"),
    ("whiten", "flush_denormal", True, r"rank {w}: GDPOError: this process computes with flush-to-zero"),
]


def _batch(tag: str, rank: int) -> list[list[float]]:
    rng = random.Random(f"{tag}/{rank}")
    return [[round(rng.uniform(-2.0, 2.0), 6) for _ in range(K)] for _ in range(ROWS)]


def _args(api: str, arg: str, tag: str, rank: int) -> dict:
    """A right call of ``api`` on ``rank`` (labelled groups where ``arg`` is group_ids), every
    argument given, on a batch of its own (``tag``)."""
    rows = _batch(tag, rank)
    common = {"segment_sizes": [ROWS], "eps": EPS, "out_dtype": F32, "certified": "narrow"}
    if api == "whiten":
        return {"values": ("tensor", [r[0] for r in rows], "float64"), **common}
    groups = {"group_ids": LABELS} if arg == "group_ids" else {"group_size": 2}
    return {"rewards": ("tensor", rows, "float64"), **groups, "weights": WEIGHTS, "missing": "refuse",
            "diagnostics": ("diagnostics",), **common}


def _name(i: int, api: str, arg: str, value) -> str:
    return f"{i:02d}_{api}_{arg}_{re.sub(r'[^0-9a-zA-Z.-]+', '_', repr(value))[:24]}"


def scenarios(world: int) -> list:
    """One per WRONG entry: the wrong call (on rank i % world), then the retry."""
    out = []
    for i, (api, arg, value, _) in enumerate(WRONG):
        wrong = i % world
        name = _name(i, api, arg, value)
        first = [_args(api, arg, name + "/wrong", r) for r in range(world)]
        first[wrong][arg] = value
        retry = [_args(api, arg, name + "/retry", r) for r in range(world)]
        out.append((name, "calls", {"api": api, "calls": [first, retry]}))
    return out


@functools.lru_cache(maxsize=None)
def _run(world: int):
    return _dist.run_group(world, scenarios(world), group_timeout_s=GROUP_TIMEOUT_S, deadline_s=DEADLINE_S)


def _oracle_bits(api: str, arg: str, name: str, world: int) -> list[str]:
    """The retry's exact advantages over every rank's rows, correctly rounded to float32."""
    rows = [row for r in range(world) for row in _batch(name + "/retry", r)]
    if api == "whiten":
        res = oracle.whiten(np.array([row[0] for row in rows]), eps=EPS)
    elif arg == "group_ids":  # a rank's labels are its own: label + 100 * rank across ranks
        ids = [lab + 100 * r for r in range(world) for lab in LABELS]
        res = oracle.gdpo_advantages(np.array(rows), group_ids=ids, weights=WEIGHTS, eps=EPS)
    else:
        res = oracle.gdpo_advantages(np.array(rows), group_size=2, weights=WEIGHTS, eps=EPS)
    return [float(x).hex() for x in np.asarray(res.float32, dtype=np.float64)]


@pytest.mark.parametrize("world", WORLDS)
def test_an_argument_wrong_on_one_rank_is_refused_on_every_rank_then_the_retry_computes(world):
    run = _run(world)
    assert not run.hung, f"ranks {run.hung} hung and were terminated\n{run.stderr[-3000:]}"
    failures = []
    for i, (api, arg, value, pattern) in enumerate(WRONG):
        name, wrong = _name(i, api, arg, value), i % world
        recs = run.by_rank(name)
        first = {r: recs[r]["result"][0] if recs[r]["status"] == "ok" else ["harness", recs[r]["msg"], 0.0]
                 for r in range(world)}
        said = {r: f"rank {r}: {cls}: {msg[:300]} ({s:.2f} s)" for r, (cls, msg, s) in first.items()}
        if {cls for cls, _, _ in first.values()} != {"DistributedError"}:
            failures.append(f"{name} (wrong on rank {wrong}): not a DistributedError on every rank: {said}")
        elif len({msg for _, msg, _ in first.values()}) != 1:
            failures.append(f"{name}: the ranks' messages differ: {said}")
        elif not re.search(pattern.format(w=wrong), first[0][1]):
            failures.append(f"{name}: {first[0][1]!r} does not match {pattern.format(w=wrong)!r}")
        slow = [r for r, (_, _, s) in first.items() if s >= RETURN_S]
        if slow:
            failures.append(f"{name}: ranks {slow} took {RETURN_S} s or more to return: {said}")
        want = _oracle_bits(api, arg, name, world)
        retry = [recs[r]["result"][1] if recs[r]["status"] == "ok" else ["harness", recs[r]["msg"], 0.0]
                 for r in range(world)]
        got = [h for r in range(world) for h in (retry[r][1] if retry[r][0] == "ok" else [])]
        if any(cls != "ok" for cls, _, _ in retry) or got != want:
            failures.append(f"{name}: the retry is not the oracle's float32 bits of its own batch: "
                            + "; ".join(f"rank {r}: {cls}: {str(v)[:200]}" for r, (cls, v, _) in enumerate(retry))
                            + f"; the oracle's: {want}")
    print(f"\n[world {world}] {len(WRONG)} wrong arguments and their retries in {run.wall_s:.1f} s")
    assert not failures, f"{len(failures)} of {len(WRONG)} scenarios failed:\n" + "\n".join(failures)
