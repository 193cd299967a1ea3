"""How long an operation takes right after the process has done something else for a while.

    python -m benchmarks.cache_decay [--repeats 100]

One thread. For each gap (microseconds of pure Python between two runs of the same work), the
median time of three float64 additions of 65,536 values in a row (torch, each into the same
output) and of one NumPy addition and sum of the same arrays, each after its own gap. In a call
of ``impl.gdpo`` the passes over memory are separated by Python work of a few hundred
microseconds to a few milliseconds, so their cost is the one after a gap, not the one of a warm
loop (gap 0): the figures say how much of a call's time that alone explains on a machine
(benchmarks/RESULTS.md, issue 27's cost).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

GAPS_US = (0, 500, 1000, 2000, 5000)


def _spin(us: float) -> None:
    t = time.perf_counter()
    while (time.perf_counter() - t) * 1e6 < us:
        pass


def run(repeats: int = 100, n: int = 65536) -> list[dict]:
    torch.set_num_threads(1)
    a = torch.randn(n, dtype=torch.float64)
    b = torch.randn(n, dtype=torch.float64)
    out = torch.empty_like(a)
    an, bn, on = a.numpy(), b.numpy(), out.numpy()
    rows = []
    for gap in GAPS_US:
        t = {"torch add 1st": [], "torch add 2nd": [], "torch add 3rd": [], "numpy add": [], "numpy sum": []}
        for _ in range(repeats):
            _spin(gap)
            t0 = time.perf_counter()
            torch.add(a, b, out=out)
            t1 = time.perf_counter()
            torch.add(a, b, out=out)
            t2 = time.perf_counter()
            torch.add(a, b, out=out)
            t3 = time.perf_counter()
            t["torch add 1st"].append(t1 - t0)
            t["torch add 2nd"].append(t2 - t1)
            t["torch add 3rd"].append(t3 - t2)
            _spin(gap)
            t0 = time.perf_counter()
            np.add(an, bn, out=on)
            t["numpy add"].append(time.perf_counter() - t0)
            _spin(gap)
            t0 = time.perf_counter()
            an.sum()
            t["numpy sum"].append(time.perf_counter() - t0)
        rows.append({"gap_us": gap, **{k: statistics.median(v) * 1e6 for k, v in t.items()}})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cache_decay")
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args(argv)
    rows = run(args.repeats)
    keys = [k for k in rows[0] if k != "gap_us"]
    print("| gap (us of Python) | " + " | ".join(f"{k} (us)" for k in keys) + " |")
    print("|---:|" + "---:|" * len(keys))
    for r in rows:
        print(f"| {r['gap_us']} | " + " | ".join(f"{r[k]:.1f}" for k in keys) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
