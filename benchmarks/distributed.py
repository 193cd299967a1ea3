"""Distributed benchmark: impl.gdpo across gloo ranks against the per-unit protocol mirror.

    python -m benchmarks.distributed [--quick] [--rows N] [--out FILE.json]

For 2 and 4 CPU ranks (gloo, spawned processes, file rendezvous, one torch
thread per rank) and 1 and 8 whitening units, every rank holds ``--rows``
samples (K = 4 rewards, groups of 16) and calls, in lockstep:

* ``impl.gdpo.whiten(values, segment_sizes, process_group)`` and the mirror of
  the reviewed implementation's Eq. 6 (``benchmarks.mirrors.per_unit_protocol``:
  four collectives per unit), on the same float64 values;
* ``impl.gdpo.gdpo_advantages(rewards, group_size=16, ..., process_group)``
  (validation, agreement, Eq. 4/7/6).

Figures: wall time per call (median over blocks of calls, each block between
two barriers, measured on rank 0) and collectives per call (counted by wrapping
torch.distributed's collective functions). Ranks share the machine's cores.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import multiprocessing as mp

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce", "reduce_scatter",
               "all_to_all", "gather", "scatter", "barrier", "send", "recv")


def _rank_main(rank, world, init_file, units, rows, blocks, calls, queue):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    counts: dict = {}

    def wrap(name):
        fn = getattr(dist, name)

        def counted(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return fn(*args, **kwargs)

        return counted

    originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
    for name in originals:
        setattr(dist, name, wrap(name))

    from benchmarks.mirrors import per_unit_protocol
    from impl import gdpo

    group = dist.group.WORLD
    gen = torch.Generator().manual_seed(1000 + rank)
    rewards = torch.randn(rows, 4, generator=gen)
    values = torch.randn(rows, generator=gen, dtype=torch.float64) * 3.0 + 100.0
    sizes = [rows // units] * units
    sizes[-1] += rows - sum(sizes)
    cases = {
        "impl_whiten": lambda: gdpo.whiten(values, segment_sizes=sizes, process_group=group),
        "per_unit_protocol": lambda: per_unit_protocol(values, sizes, group=group),
        "impl_gdpo_advantages": lambda: gdpo.gdpo_advantages(rewards, group_size=16, weights=[1.0, 0.5, 2.0, 1.0],
                                                            segment_sizes=sizes, process_group=group),
    }
    out = {}
    barrier = originals["barrier"]
    for name, fn in cases.items():
        fn()  # warm-up
        counts.clear()
        fn()
        per_call = dict(counts)
        times = []
        for _ in range(blocks):
            barrier(group)
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            barrier(group)
            times.append((time.perf_counter() - t) / calls)
        out[name] = {"ms_per_call": statistics.median(times) * 1e3, "collectives_per_call": per_call}
    if rank == 0:
        queue.put(out)
        queue.close()
        queue.join_thread()  # os._exit would kill the queue's feeder thread before it wrote the result
    barrier(group)
    os._exit(0)


def run(world: int, units: int, rows: int, blocks: int, calls: int, deadline_s: float = 600.0) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="gdpo_bench_") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_rank_main, args=(r, world, init_file, units, rows, blocks, calls, queue),
                             daemon=True) for r in range(world)]
        for p in procs:
            p.start()
        try:
            result = queue.get(timeout=deadline_s)
        finally:
            for p in procs:
                p.join(30)
                if p.is_alive():
                    p.terminate()
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.distributed")
    ap.add_argument("--rows", type=int, default=8192, help="samples per rank (default 8192)")
    ap.add_argument("--quick", action="store_true", help="fewer blocks and calls")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch

    blocks, calls = (3, 5) if args.quick else (5, 20)
    env = {"machine": platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__,
           "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"), "rows_per_rank": args.rows,
           "blocks": blocks, "calls_per_block": calls}
    print(json.dumps(env), flush=True)
    rows = []
    for world in (2, 4):
        for units in (1, 8):
            res = run(world, units, args.rows, blocks, calls)
            row = {"world": world, "units": units, **{f"{k}_ms": round(v["ms_per_call"], 3) for k, v in res.items()},
                   **{f"{k}_collectives": sum(v["collectives_per_call"].values()) for k, v in res.items()},
                   "detail": {k: v["collectives_per_call"] for k, v in res.items()}}
            row["impl_whiten_over_per_unit"] = round(row["impl_whiten_ms"] / row["per_unit_protocol_ms"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
