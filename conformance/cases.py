"""What one conformance example is, how it is written down, and what the oracle says about it.

A :class:`Case` is what one process passes to ``gdpo_advantages``; a :class:`DistCase` is one
Case per rank. Both serialise to JSON with every float in hex, so a found bug is stored and
replayed bit for bit. :func:`expected` is the oracle on the (global) batch, memoised on the exact
inputs since every control and call shape is graded on the same examples.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math

import numpy as np

from oracle import gdpo as oracle
from spec import error_model
from spec.errors import GDPOError

#: output dtypes the suite grades (the oracle certifies a rounding to each: Stage.rounded)
OUT_DTYPES = ("float32", "float64", "float16", "bfloat16")


def hexf(x: float) -> str:
    return float(x).hex()


def unhex(s) -> float:
    return float.fromhex(s) if isinstance(s, str) else float(s)


#: the fields a Case's JSON holds only where set (``width``: only where there are no rows)
_OPTIONAL = ("group_size", "group_ids", "weights", "segment_sizes", "eps", "note", "variant", "width", "missing")


@dataclasses.dataclass(frozen=True)
class Case:
    """One call: rewards (exact float64 values of ``dtype``), groups, weights, units."""

    rewards: tuple  # N rows of K floats (exact values representable in ``dtype``)
    dtype: str = "float32"
    group_size: int | None = None
    group_ids: tuple | None = None
    weights: tuple | None = None  # float64 weights, None: ones
    segment_sizes: tuple | None = None  # None: one unit of every sample
    eps: float | None = None  # None: the implementation's default
    out_dtype: str = "float32"
    note: str = ""  # what the generator meant to build (shown in failures)
    #: a malformed call the data above cannot express (error cases): "float_labels",
    #: "both_groups", "no_groups", "rewards_3d", "empty", "int_out_dtype"
    variant: str = ""
    width: int = 0  # K of an empty shard (no rows to tell it)
    #: "" (the keyword is not passed: the default, a NaN reward refused) or "unscored"
    #: (``missing="unscored"``: a NaN reward is one its reward function did not score)
    missing: str = ""

    # ------------------------------------------------------------ derived
    @property
    def n(self) -> int:
        return len(self.rewards)

    @property
    def k(self) -> int:
        return len(self.rewards[0]) if self.rewards else self.width

    def rewards_array(self) -> np.ndarray:
        if not self.rewards:
            return np.zeros((0, max(self.width, 1)))
        return np.array(self.rewards, dtype=np.float64).reshape(self.n, self.k)

    def labels(self) -> np.ndarray:
        """Group label of every row (group_size becomes consecutive labels)."""
        if self.group_ids is not None:
            return np.array(self.group_ids, dtype=np.int64)
        return np.arange(self.n, dtype=np.int64) // self.group_size

    def unit_ids(self) -> np.ndarray | None:
        if self.segment_sizes is None:
            return None
        return np.repeat(np.arange(len(self.segment_sizes)), self.segment_sizes)

    # ------------------------------------------------------------ hex form
    def to_json(self) -> dict:
        d = {"rewards": [[hexf(v) for v in row] for row in self.rewards], "dtype": self.dtype,
             "out_dtype": self.out_dtype}
        for name in _OPTIONAL:  # in this order: the JSON, and so every digest, is fixed by it
            v = getattr(self, name)
            if (v is not None and v != "") if name != "width" else not self.rewards:
                d[name] = hexf(v) if name == "eps" else [hexf(w) for w in v] if name == "weights" else \
                    list(v) if isinstance(v, tuple) else v
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Case":
        fields = {"rewards": tuple(tuple(unhex(v) for v in row) for row in d["rewards"]),
                  "dtype": d.get("dtype", "float32"), "out_dtype": d.get("out_dtype", "float32")}
        for name in _OPTIONAL:
            v = d.get(name)
            if v is not None:
                fields[name] = unhex(v) if name == "eps" else tuple(unhex(w) for w in v) if name == "weights" \
                    else tuple(v) if isinstance(v, list) else v
        return cls(**fields)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))


@dataclasses.dataclass(frozen=True)
class DistCase:
    """One shard per rank; weights, eps and out_dtype are the same on every rank."""

    shards: tuple  # of Case (each with its own group layout and segment_sizes)
    note: str = ""

    @property
    def world(self) -> int:
        return len(self.shards)

    def to_json(self) -> dict:
        d = {"shards": [s.to_json() for s in self.shards]}
        if self.note:
            d["note"] = self.note
        return d

    @classmethod
    def from_json(cls, d: dict) -> "DistCase":
        return cls(tuple(Case.from_json(s) for s in d["shards"]), d.get("note", ""))

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))

    def global_case(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[slice]]:
        """The batch every rank's shard belongs to: rewards, group labels (made
        unique per rank: groups never span ranks), unit labels, and each rank's rows."""
        rows, groups, units, where = [], [], [], []
        start = 0
        for r, s in enumerate(self.shards):
            if s.n:
                rows.append(s.rewards_array())
                lab = s.labels()
                _, inv = np.unique(lab, return_inverse=True)
                groups.append(inv.reshape(-1) + 1_000_000 * r)
                u = s.unit_ids()
                units.append(np.zeros(s.n, np.int64) if u is None else u)
            where.append(slice(start, start + s.n))
            start += s.n
        k = next((s.k for s in self.shards if s.n), 1)
        if not rows:
            return np.zeros((0, k)), np.zeros(0, np.int64), np.zeros(0, np.int64), where
        return np.concatenate(rows), np.concatenate(groups), np.concatenate(units), where

    def batch(self) -> Case:
        """The global batch as one process's call (its groups per rank, no units), where a question
        takes one Case (what overflows in it)."""
        rewards, groups, _, _ = self.global_case()
        return dataclasses.replace(self.shards[0], rewards=tuple(map(tuple, rewards.tolist())), group_size=None,
                                   group_ids=tuple(groups.tolist()), segment_sizes=None, width=rewards.shape[1])


def loads(text: str):
    """A :class:`Case` or :class:`DistCase` from its hex JSON (``dumps``)."""
    data = json.loads(text)
    return DistCase.from_json(data) if "shards" in data else Case.from_json(data)


# ---------------------------------------------------------------- the judge


@dataclasses.dataclass
class Expected:
    """The oracle's verdict: a result, or the contract error it raises."""

    result: object = None  # oracle.gdpo.Result
    error: GDPOError | None = None


@functools.lru_cache(maxsize=4096)
def _oracle_cached(rewards_b, shape, groups_b, weights, units_b, eps, convention, tokens_b, missing):
    def array(b):
        return None if b is None else np.frombuffer(b, dtype=np.int64)
    try:
        return Expected(result=oracle.gdpo_advantages(
            np.frombuffer(rewards_b, dtype=np.float64).reshape(shape), array(groups_b),
            weights=None if weights is None else list(weights), unit_ids=array(units_b), eps=eps,
            convention=convention, token_counts=array(tokens_b), missing=missing))
    except GDPOError as e:
        return Expected(error=e)


def _bytes(a, dtype=np.int64):
    return None if a is None else np.ascontiguousarray(a, dtype=dtype).tobytes()


def expected(case, convention: str = "spec", token_counts=None) -> Expected:
    """The oracle's verdict on a Case (one process) or a DistCase (global batch). ``token_counts``
    (a Case only: what the call shape gave the implementation) weights Eq. 6 by each sample's
    token count: a per-token convention (verl) needs them, a per-sample one refuses them."""
    if isinstance(case, DistCase):
        if token_counts is not None:
            raise ValueError("token counts of a distributed case: no call shape passes them")
        rewards, groups, units, _ = case.global_case()
        first = case.shards[0]
        if rewards.shape[0] == 0:
            return Expected(result=None)
    else:
        rewards, groups, units, first = case.rewards_array(), case.labels(), case.unit_ids(), case
    rewards = np.ascontiguousarray(rewards, dtype=np.float64)
    w = None if first.weights is None else tuple(float(x) for x in first.weights)
    return _oracle_cached(rewards.tobytes(), rewards.shape, _bytes(groups), w, _bytes(units),
                          None if first.eps is None else float(first.eps), convention, _bytes(token_counts),
                          first.missing or "refuse")


@functools.lru_cache(maxsize=1024)
def _whiten_cached(values_b, segment_sizes, eps, convention):
    values = np.frombuffer(values_b, dtype=np.float64)
    sizes = None if segment_sizes is None else list(segment_sizes)
    try:
        return Expected(result=oracle.whiten(values, segment_sizes=sizes, eps=eps, convention=convention))
    except GDPOError as e:
        return Expected(error=e)


def expected_whiten(values, segment_sizes, eps, convention="spec") -> Expected:
    v = np.ascontiguousarray(values, dtype=np.float64)
    sizes = None if segment_sizes is None else tuple(int(s) for s in segment_sizes)  # the oracle takes them too
    return _whiten_cached(v.tobytes(), sizes, None if eps is None else float(eps), convention)


def ulp(x: float, dtype: str) -> float:
    """Spacing of ``dtype`` at |x| (the smallest subnormal at 0; the top binade's beyond
    the format's range): twice the error model's half ulp, but a whole one everywhere."""
    p, emin, _ = error_model.FORMATS[dtype]
    mag = float(error_model.round_to([abs(float(x))], dtype)[0])
    mag = min(mag, error_model.largest_finite(dtype))
    e = max(math.frexp(mag)[1] - 1, emin) if mag else emin
    return math.ldexp(1.0, e - p + 1)
