"""Seeded case families for the peer table (known limits, table 6).

A case is drawn from ``numpy.random.default_rng([seed, family, index])``, so the fast run
regenerates exactly the cases of the full run it covers (hypothesis strategies shrink and
search, and would not). Rewards are float32 values (what the float32 peers receive), units
contiguous (``segment_sizes`` expresses them), token counts (verl whitens per token) drawn too.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np


@dataclasses.dataclass
class Case:
    rewards: np.ndarray  # (N, K) float64 holding float32 values
    groups: np.ndarray  # (N,) int64 labels
    weights: tuple | None
    tokens: np.ndarray  # (N,) int64 token counts (verl)


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float64)


def _column(rng, kind: str, n: int) -> np.ndarray:
    if kind == "binary":
        v = rng.integers(0, 2, n).astype(np.float64)
    elif kind == "ints":
        v = rng.integers(-3, 11, n).astype(np.float64)
    else:  # uniform
        v = rng.uniform(-1.0, 1.0, n) * rng.choice([1.0, 10.0, 100.0])
    if np.all(v == v[0]):
        v[-1] = v[0] + 1.0
    return f32(v)


def _assemble(rng, blocks, weights) -> Case:
    """The groups ``blocks`` in one whitening unit, with token counts for verl."""
    rewards = np.concatenate(blocks)
    groups = np.repeat(np.arange(len(blocks)), [b.shape[0] for b in blocks]).astype(np.int64)
    tokens = rng.integers(1, 513, rewards.shape[0]).astype(np.int64)
    return Case(rewards, groups, weights, tokens)


def _weights(rng, k: int):
    mode = rng.integers(0, 3)
    if mode == 0:
        return None
    if mode == 1:
        return tuple([float(f32(rng.uniform(0.5, 2.0)))] * k)
    return tuple(float(x) for x in f32(rng.uniform(0.25, 2.0, k)))


def healthy(rng):
    g, n, k = int(rng.integers(2, 5)), int(rng.choice([4, 8])), int(rng.integers(2, 4))
    kinds = rng.choice(["binary", "ints", "uniform"], k)
    blocks = [np.stack([_column(rng, kd, n) for kd in kinds], 1) for _ in range(g)]
    return _assemble(rng, blocks, _weights(rng, k))


def large_offset(rng):
    g, n = int(rng.integers(2, 4)), int(rng.choice([4, 8]))
    offset = float(rng.choice([1e3, 1e4, 1e5, 1e6]))
    step = float(rng.choice([0.01, 0.1, 1.0]))
    blocks = []
    for _ in range(g):
        col = f32(offset + step * rng.integers(0, 5, n))
        if np.all(col == col[0]):
            col[-1] = float(np.nextafter(np.float32(col[0]), np.float32(np.inf)))
        blocks.append(np.stack([col, _column(rng, "binary", n)], 1))
    return _assemble(rng, blocks, _weights(rng, 2))


def _constant_sum_block(rng, n, big):
    """r2 = C - r1 exactly in float32: integer multiples of a power of two below 2^24 of it."""
    r1 = rng.integers(0, big + 1, n)
    if np.all(r1 == r1[0]):
        r1[-1] = (r1[0] + 1) % (big + 1)
    scale = float(rng.choice([1.0, 0.125, 2.0 ** -10]))
    total = big + int(rng.choice([0, 1, 1000, 2 ** 20]))
    return np.stack([r1 * scale, (total - r1) * scale], 1).astype(np.float64)


def constant_sum(rng):
    n = int(rng.choice([4, 8]))
    g = int(rng.integers(1, 4))
    big = int(rng.choice([1, 10, 1000]))
    blocks = [_constant_sum_block(rng, n, big) for _ in range(g)]
    shared = bool(rng.integers(0, 2))
    if shared:
        blocks.append(np.stack([_column(rng, "binary", n), _column(rng, "ints", n)], 1))
    w = float(f32(rng.choice([1.0, 0.5, 3.0])))
    return _assemble(rng, blocks, (w, w))


def near_constant_sum(rng):
    case = constant_sum(rng)
    r = case.rewards.copy()
    first = np.flatnonzero(case.groups == case.groups[0])
    j = int(rng.choice(first))
    r[j, 1] = float(np.nextafter(np.float32(r[j, 1]), np.float32(np.inf)))  # one ulp: real signal
    case.rewards = r
    return case


def collapse(rng):
    n, g = int(rng.choice([2, 4, 8])), int(rng.integers(2, 4))
    whole = bool(rng.integers(0, 3) == 0)  # every column of every group constant: the unit collapses
    blocks = [np.stack([np.full(n, float(f32(rng.choice([0.0, 1.0, 0.3, 1e4]))))
                        if whole or rng.integers(0, 2) == 0 else _column(rng, "binary", n) for _ in range(2)], 1)
              for _ in range(g)]
    return _assemble(rng, blocks, _weights(rng, 2))


def tiny_std(rng):
    n, g = int(rng.choice([4, 8])), int(rng.integers(2, 4))
    s = float(rng.choice([1e-3, 1e-4, 1e-5, 1e-6]))
    base = float(rng.choice([0.0, 0.5, 1.0]))
    blocks = []
    for _ in range(g):
        col = f32(base + s * rng.integers(0, 4, n))
        if np.all(col == col[0]):
            col[-1] = float(f32(col[0] + s))
        blocks.append(np.stack([col, _column(rng, "binary", n)], 1))
    return _assemble(rng, blocks, _weights(rng, 2))


def n_g_2(rng):
    g, k = int(rng.integers(2, 7)), int(rng.integers(1, 4))
    kinds = rng.choice(["binary", "ints", "uniform"], k)
    blocks = [np.stack([_column(rng, kd, 2) for kd in kinds], 1) for _ in range(g)]
    return _assemble(rng, blocks, _weights(rng, k))


def nan_reward(rng):
    case = healthy(rng)
    i = int(rng.integers(0, case.rewards.shape[0]))
    k = int(rng.integers(0, case.rewards.shape[1]))
    case.rewards = case.rewards.copy()
    case.rewards[i, k] = np.nan
    return case


def ragged(rng):
    sizes = [int(x) for x in rng.choice([2, 3, 5, 7], int(rng.integers(2, 5)))]
    k = int(rng.integers(2, 4))
    kinds = rng.choice(["binary", "ints", "uniform"], k)
    blocks = [np.stack([_column(rng, kd, n) for kd in kinds], 1) for n in sizes]
    case = _assemble(rng, blocks, _weights(rng, k))
    perm = rng.permutation(case.rewards.shape[0])  # interleave the groups (labels, not positions)
    case.rewards, case.groups, case.tokens = case.rewards[perm], case.groups[perm], case.tokens[perm]
    return case


FAMILIES = {"healthy": healthy, "large offset": large_offset, "constant-sum": constant_sum,
            "near-constant-sum": near_constant_sum, "collapse": collapse, "tiny std": tiny_std, "n_g = 2": n_g_2,
            "NaN reward": nan_reward, "ragged groups": ragged}


def cases(family: str, count: int, seed: int) -> list[Case]:
    return [FAMILIES[family](np.random.default_rng([seed, zlib.crc32(family.encode()), i])) for i in range(count)]
