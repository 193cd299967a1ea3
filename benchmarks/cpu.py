"""CPU benchmarks: impl.gdpo side by side with what users would otherwise run.

    python -m benchmarks.cpu [--quick] [--n N ...] [--repeats R] [--out FILE.json] [--md FILE.md]

For each size, every implementation runs in the same process on the same data,
taking turns call by call; the figure is the median wall time over repeats
(after one warm-up call each), and
ratios are impl / other (the loop column is loop / impl, a speed-up). The
per-group Python loop (verl's style) is only timed up to N = 65,536 (one call
there takes seconds, so one repeat). N = 16,777,216 is trimmed to fit a run in
about ten minutes on two cores: two repeats, groups of 16 only, ragged labels
only for K = 4.
``--quick``: N <= 65,536 and K = 4 only (about a minute); ``--n``: those N only; ``--repeats``:
that many repeats (default: by N).

"impl, labels" is the same batch given as ``group_ids``: labels in runs of the
group size, in shuffled order (verl's uid layout); "ragged" rows are labelled
groups of sizes 5, 9, 16, 2, 31 and 17 (no mirror takes them).
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

from benchmarks.mirrors import numpy_gdpo, verl_group_loop
from gdpo_tools.peer_formulas import trl_normalize_then_sum
from impl import gdpo

LOOP_LIMIT = 65_536


def _interleaved(fns: dict, repeats: int) -> dict:
    """Median wall time of each function, the functions taking turns (one warm-up
    call each first), so that a burst of load on a shared machine hits them alike."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _median_time(fn, repeats: int, warmup: bool = True) -> float:
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _repeats(n: int) -> int:
    if n >= 16_000_000:
        return 2
    return max(3, min(50, 2_000_000 // max(n, 1)))


def case(n: int, k: int, group: int, units: int, ragged: bool = False, repeats: int | None = None) -> dict:
    gen = torch.Generator().manual_seed(n + k)
    r = torch.randn(n, k, generator=gen)
    w = [1.0 + 0.5 * i for i in range(k)]
    wt = torch.tensor(w)
    seg = [n // units] * units
    seg[-1] += n - sum(seg)
    reps = repeats or _repeats(n)
    row = {"N": n, "K": k, "group": "ragged" if ragged else group, "units": units, "repeats": reps}
    if ragged:
        sizes = np.resize(np.array([5, 9, 16, 2, 31, 1 + group]), n // 8 + 8)
        ids = torch.from_numpy(np.repeat(np.arange(sizes.size), sizes)[:n])
        if int((ids == ids[-1]).sum()) < 2:
            ids[-1] = ids[-3]
        ours = lambda: gdpo.gdpo_advantages(r, group_ids=ids, weights=w, segment_sizes=seg)
    else:
        ours = lambda: gdpo.gdpo_advantages(r, group_size=group, weights=w, segment_sizes=seg)
    if ragged:
        row["impl_s"] = _median_time(ours, reps)
    else:
        rn = r.numpy().astype(np.float64)
        runs = torch.randperm(n // group, generator=gen).repeat_interleave(group)  # verl's uid layout
        timed = _interleaved({"impl_s": ours, "trl_mirror_s": lambda: trl_normalize_then_sum(r, group, wt),
                              "numpy_s": lambda: numpy_gdpo(rn, group, np.array(w), seg),
                              "impl_labels_s": lambda: gdpo.gdpo_advantages(r, group_ids=runs, weights=w,
                                                                            segment_sizes=seg)}, reps)
        row.update(timed)
        if n <= LOOP_LIMIT:
            index = (torch.arange(n) // group).tolist()
            row["verl_loop_s"] = _median_time(lambda: verl_group_loop(r, index, w), 1 if n > 8192 else 3,
                                              warmup=False)  # pure Python: nothing to warm up
        for other in ("trl_mirror", "numpy", "verl_loop"):
            if f"{other}_s" in row:
                row[f"impl_over_{other}"] = row["impl_s"] / row[f"{other}_s"]
    return row


SIZES = [1_024, 8_192, 65_536, 1_048_576, 16_777_216]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cpu")
    p.add_argument("--quick", action="store_true", help="N <= 65,536, K = 4 only")
    p.add_argument("--out", default=None)
    p.add_argument("--md", default=None, help="also write the table as markdown")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    p.add_argument("--n", type=int, nargs="+", default=None, help="these N only")
    p.add_argument("--repeats", type=int, default=None, help="repeats per case (default: by N)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    env = {"machine": platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(env))
    rows = []
    sizes = args.n or (SIZES[:3] if args.quick else SIZES)
    for n in sizes:
        big = n >= 16_000_000  # trimmed: one call there takes seconds
        for k in ((4,) if args.quick else (2, 4, 8)):
            for units in (1, 8):
                for group in ((16,) if big else (8, 16)):
                    rows.append(case(n, k, group, units, repeats=args.repeats))
                    print(json.dumps(rows[-1]), flush=True)
            if not big or k == 4:
                rows.append(case(n, k, 16, 8, ragged=True, repeats=args.repeats))
                print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=2)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(rows) + "\n")
    return 0


def _ms(row, key):
    return f"{row[key] * 1e3:.3f}" if key in row else "-"


def markdown(rows: list[dict]) -> str:
    """The rows as a markdown table: times in ms, ratios impl / other, loop speed-up."""
    lines = ["| N | K | groups | units | impl ms | impl, labels ms | TRL-style f32 ms | numpy f64 ms "
             "| verl loop ms | impl / TRL | impl / numpy | loop / impl |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = (lambda k: f"{r[k]:.2f}" if k in r else "-")
        loop = f"{r['verl_loop_s'] / r['impl_s']:.0f}x" if "verl_loop_s" in r else "-"
        lines.append(f"| {r['N']:,} | {r['K']} | {r['group']} | {r['units']} | {_ms(r, 'impl_s')} "
                     f"| {_ms(r, 'impl_labels_s')} "
                     f"| {_ms(r, 'trl_mirror_s')} | {_ms(r, 'numpy_s')} | {_ms(r, 'verl_loop_s')} "
                     f"| {ratio('impl_over_trl_mirror')} | {ratio('impl_over_numpy')} | {loop} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
