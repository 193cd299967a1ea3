"""Time the oracle on the issue's reference batch: 512 groups x 16 samples x 4 rewards, 8 units.

    python -m benchmarks.oracle [--repeats 3]

Prints the median wall time over the repeats (one core, one process).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from oracle import gdpo


def reference_batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    G, n, K, S = 512, 16, 4, 8
    r = rng.normal(size=(G * n, K)) * np.array([1.0, 100.0, 0.01, 5.0]) + np.array([0.0, 1000.0, 0.0, 3.0])
    r[:, 0] = rng.integers(0, 2, size=G * n)  # a binary correctness reward: many collapsed columns
    groups = np.repeat(np.arange(G), n)
    units = np.repeat(np.arange(S), G * n // S)
    return r, groups, units, [1.0, 0.5, 2.0, 1.0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.oracle")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    r, g, u, w = reference_batch()
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        gdpo.gdpo_advantages(r, g, weights=w, unit_ids=u)
        times.append(time.perf_counter() - t)
    print(f"oracle, 512 groups x 16 samples x 4 rewards in 8 units: median {statistics.median(times):.2f} s "
          f"over {args.repeats} runs (min {min(times):.2f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
