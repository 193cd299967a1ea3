"""CPU benchmarks: impl.gdpo side by side with what users would otherwise run.

    python -m benchmarks.cpu [--quick] [--out FILE.json]

For each size, every implementation runs in the same process on the same data;
the figure is the median wall time over repeats, and ratios are impl / other.
The per-group Python loop (verl's style) is only timed up to N = 65,536: beyond
that one call takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np
import torch

from benchmarks.mirrors import numpy_gdpo, trl_normalize_then_sum, verl_group_loop
from impl import gdpo

LOOP_LIMIT = 65_536


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _repeats(n: int) -> int:
    return max(3, min(50, 2_000_000 // max(n, 1)))


def case(n: int, k: int, group: int, units: int, ragged: bool = False) -> dict:
    gen = torch.Generator().manual_seed(n + k)
    r = torch.randn(n, k, generator=gen)
    w = [1.0 + 0.5 * i for i in range(k)]
    wt = torch.tensor(w)
    seg = [n // units] * units
    seg[-1] += n - sum(seg)
    reps = _repeats(n)
    row = {"N": n, "K": k, "group": "ragged" if ragged else group, "units": units, "repeats": reps}
    if ragged:
        sizes = np.resize(np.array([5, 9, 16, 2, 31, 1 + group]), n // 8 + 8)
        ids = torch.from_numpy(np.repeat(np.arange(sizes.size), sizes)[:n])
        if int((ids == ids[-1]).sum()) < 2:
            ids[-1] = ids[-3]
        ours = lambda: gdpo.gdpo_advantages(r, group_ids=ids, weights=w, segment_sizes=seg)
    else:
        ours = lambda: gdpo.gdpo_advantages(r, group_size=group, weights=w, segment_sizes=seg)
    row["impl_s"] = _median_time(ours, reps)
    if not ragged:
        row["trl_mirror_s"] = _median_time(lambda: trl_normalize_then_sum(r, group, wt), reps)
        rn = r.numpy().astype(np.float64)
        row["numpy_s"] = _median_time(lambda: numpy_gdpo(rn, group, np.array(w), seg), reps)
        if n <= LOOP_LIMIT:
            index = (torch.arange(n) // group).tolist()
            row["verl_loop_s"] = _median_time(lambda: verl_group_loop(r, index, w), 1 if n > 8192 else 3)
        for other in ("trl_mirror", "numpy", "verl_loop"):
            if f"{other}_s" in row:
                row[f"impl_over_{other}"] = row["impl_s"] / row[f"{other}_s"]
    return row


SIZES = [1_024, 8_192, 65_536, 1_048_576, 16_777_216]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cpu")
    p.add_argument("--quick", action="store_true", help="N <= 65,536, K = 4 only")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    env = {"machine": platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(env))
    rows = []
    sizes = SIZES[:3] if args.quick else SIZES
    for n in sizes:
        for k in ((4,) if args.quick else (2, 4, 8)):
            for units in (1, 8):
                for group in (8, 16):
                    rows.append(case(n, k, group, units))
                    print(json.dumps(rows[-1]), flush=True)
            rows.append(case(n, k, 16, 8, ragged=True))
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
