"""GPU benchmarks of impl.gdpo against the TRL-style mirror on the same device.

    python -m benchmarks.gpu [--out results.json] [--repeats 50]

* latency at N = 8,192 (K = 4, groups of 16, one unit and eight units): median
  wall time per call, each call synchronized (the implementation reads one host
  value per call anyway);
* effective bandwidth at N = 1,048,576 and 16,777,216 (K = 4): bytes of the
  minimal traffic (read float32 rewards once, write float32 advantages once)
  over the median time per call;
* host synchronizations per call, counted with torch.cuda.set_sync_debug_mode
  (after a warm-up call);
* each impl figure eager and with GDPO_CUDA_GRAPHS=1 (graph replay, up to
  4M rewards; ``graphs`` says whether the replay or the eager fallback ran).
Medians over repeats; the ratios compare runs made side by side in this process.
Every case is guarded: a failure is reported in its row, the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings

import torch

from benchmarks.mirrors import trl_normalize_then_sum
from impl import _graphs, gdpo


def _time(fn, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def count_syncs(fn) -> int:
    fn()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum(1 for w in caught if "synchroniz" in str(w.message).lower())


def _graphs_mode(on: bool) -> None:
    if on:
        os.environ["GDPO_CUDA_GRAPHS"] = "1"
    else:
        os.environ.pop("GDPO_CUDA_GRAPHS", None)


def run(repeats: int = 50) -> dict:
    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"), "cases": []}
    w = [1.0, 0.5, 2.0, 1.0]
    wt = torch.tensor(w, device=dev)
    for n, reps in ((8192, repeats * 4), (1 << 20, repeats), (1 << 24, max(5, repeats // 5))):
        gen = torch.Generator(device=dev).manual_seed(0)
        r = torch.randn(n, 4, device=dev, generator=gen, dtype=torch.float32)
        traffic = n * 4 * 4 + n * 4
        case = {"N": n, "K": 4, "group_size": 16}
        trl = lambda: trl_normalize_then_sum(r, 16, wt)
        try:
            case["trl_mirror_us"] = _time(trl, reps, 5) * 1e6
            case["trl_mirror_TBps"] = traffic / case["trl_mirror_us"] / 1e6
            case["trl_mirror_host_syncs"] = count_syncs(trl)
        except Exception as exc:  # noqa: BLE001
            case["trl_mirror_error"] = repr(exc)
        for units in (1, 8):
            seg = [n // units] * units
            ours = lambda: gdpo.gdpo_advantages(r, group_size=16, weights=w, segment_sizes=seg)
            for mode in ("eager", "graphs"):
                if mode == "graphs" and n * 4 > _graphs.MAX_ELEMENTS:
                    continue
                tag = f"impl_{units}u_{mode}"
                _graphs_mode(mode == "graphs")
                before = dict(_graphs.stats)
                try:
                    t = _time(ours, reps, 5)
                    case[f"{tag}_us"] = t * 1e6
                    case[f"{tag}_TBps"] = traffic / t / 1e12
                    case[f"{tag}_host_syncs"] = count_syncs(ours)
                    if "trl_mirror_us" in case:
                        case[f"{tag}_over_trl"] = case[f"{tag}_us"] / case["trl_mirror_us"]
                    if mode == "graphs":
                        case[f"{tag}_graphs"] = {k: _graphs.stats[k] - before[k] for k in before}
                except Exception as exc:  # noqa: BLE001
                    case[f"{tag}_error"] = repr(exc)
                finally:
                    _graphs_mode(False)
        res["cases"].append(case)
        print(json.dumps(case), flush=True)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu")
    p.add_argument("--out", default=None)
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 0
    res = run(args.repeats)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
