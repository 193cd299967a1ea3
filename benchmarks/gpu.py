"""GPU benchmarks of impl.gdpo against the TRL-style mirror on the same device.

    python -m benchmarks.gpu [--out results.json] [--repeats 50]
    python -m benchmarks.gpu --smoke        # the same code on CPU, tiny sizes (no timing claims)

* latency at N = 8,192 (K = 4, groups of 16, one unit and eight units): median
  wall time per call, each call synchronized (the implementation reads one host
  value per call anyway);
* effective bandwidth at N = 1,048,576 and 16,777,216 (K = 4): bytes of the
  minimal traffic (read float32 rewards once, write float32 advantages once)
  over the median time per call;
* host synchronizations per call, counted with torch.cuda.set_sync_debug_mode
  (after a warm-up call);
* each impl figure in two modes: ``eager`` and ``graphs`` (GDPO_CUDA_GRAPHS=1,
  graph replay up to 4M rewards). The graphs mode's output is compared bit for
  bit with the eager path's (``*_same_bits``), and the counters say whether a
  graph replayed.
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

from gdpo_tools.peer_formulas import trl_normalize_then_sum
from impl import _pipeline, gdpo


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


_MODES = {"eager": {}, "graphs": {"GDPO_CUDA_GRAPHS": "1"}}
_KNOBS = ("GDPO_CUDA_GRAPHS",)


def _set_mode(env: dict) -> None:
    for k in _KNOBS:
        os.environ.pop(k, None)
    os.environ.update(env)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int64)


def _counters() -> dict:
    return {f"graph_{k}": v for k, v in _pipeline.graph_stats.items()}


def problems(res: dict) -> list[str]:
    """What makes a run's figures unusable: a measurement that raised, results whose bits
    differ from the eager path's, a graphs mode on CUDA that never replayed a graph (its
    capture failed: eager ran)."""
    out = []
    cuda = not str(res.get("device", "")).startswith("cpu")
    for case in res["cases"]:
        where = f"N={case['N']}"
        for key, value in case.items():
            if key.endswith("_error"):
                out.append(f"{where} {key[:-6]}: raised {value}")
            elif key.endswith("_same_bits") and value is not True:
                out.append(f"{where} {key[:-10]}: bits differ from the eager path")
            elif key.endswith("_paths"):
                tag = key[:-6]
                if cuda and "graphs" in tag and not value.get("graph_replays"):
                    out.append(f"{where} {tag}: no graph replayed (the capture failed: eager ran)")
    return out


def _measure(case, tag, fn, reps, traffic, reference, timer, syncs):
    before = _counters()
    try:
        t = timer(fn, reps, 5)
        case[f"{tag}_us"] = t * 1e6
        case[f"{tag}_TBps"] = traffic / t / 1e12
        case[f"{tag}_host_syncs"] = syncs(fn)
        if "trl_mirror_us" in case:
            case[f"{tag}_over_trl"] = case[f"{tag}_us"] / case["trl_mirror_us"]
        if reference is not None:
            case[f"{tag}_same_bits"] = bool(torch.equal(_bits(fn()), _bits(reference)))
        case[f"{tag}_paths"] = {k: v - before[k] for k, v in _counters().items() if v != before[k]}
    except Exception as exc:  # noqa: BLE001
        case[f"{tag}_error"] = repr(exc)


def run(repeats: int = 50, device: str = "cuda", sizes=(8192, 1 << 20, 1 << 24), out: str | None = None) -> dict:
    """Every case, side by side; with ``out``, the JSON is rewritten after each case, so a
    run cut short by its time limit still leaves what it measured."""
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    timer = _time if cuda else _time_cpu
    syncs = count_syncs if cuda else (lambda fn: None)
    res = {"device": torch.cuda.get_device_name() if cuda else "cpu (smoke run)",
           "torch": torch.__version__, "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
           "cases": []}
    w = [1.0, 0.5, 2.0, 1.0]
    wt = torch.tensor(w, device=dev)
    for n in sizes:
        reps = repeats * 4 if n <= 8192 else (repeats if n <= (1 << 20) else max(5, repeats // 5))
        gen = torch.Generator(device=dev).manual_seed(0)
        r = torch.randn(n, 4, device=dev, generator=gen, dtype=torch.float32)
        traffic = n * 4 * 4 + n * 4
        case = {"N": n, "K": 4, "group_size": 16}
        trl = lambda: trl_normalize_then_sum(r, 16, wt)
        try:
            case["trl_mirror_us"] = timer(trl, reps, 5) * 1e6
            case["trl_mirror_TBps"] = traffic / case["trl_mirror_us"] / 1e6
            case["trl_mirror_host_syncs"] = syncs(trl)
        except Exception as exc:  # noqa: BLE001
            case["trl_mirror_error"] = repr(exc)
        for units in (1, 8):
            seg = [n // units] * units
            ours = lambda: gdpo.gdpo_advantages(r, group_size=16, weights=w, segment_sizes=seg)
            _set_mode({})
            reference = ours()
            for mode, env in _MODES.items():
                if "graphs" in mode and (not cuda or n * 4 > _pipeline.GRAPH_ELEMENTS):
                    continue
                _set_mode(env)
                try:
                    _measure(case, f"impl_{units}u_{mode}", ours, reps, traffic, reference, timer, syncs)
                finally:
                    _set_mode({})
        res["cases"].append(case)
        print(json.dumps(case), flush=True)
        if out:
            _write(res, out)
    return res


def _write(res: dict, out: str) -> None:
    with open(out, "w") as f:
        json.dump(res, f, indent=2)


def _time_cpu(fn, repeats: int, warmup: int) -> float:
    fn()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu")
    p.add_argument("--out", default=None)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--smoke", action="store_true",
                   help="run the harness on CPU at tiny sizes: checks the code, not speed")
    args = p.parse_args(argv)
    if args.smoke:
        res = run(1, "cpu", sizes=(256, 4096), out=args.out)
    elif not torch.cuda.is_available():
        print("no CUDA device: nothing to measure (--smoke runs the harness on CPU)")
        return 0
    else:
        res = run(args.repeats, out=args.out)
    res["problems"] = problems(res)
    if args.out:
        _write(res, args.out)
    for line in res["problems"]:
        print(f"PROBLEM: {line}", flush=True)
    return 1 if res["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
