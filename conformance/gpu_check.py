"""``python -m conformance.gpu_check --out FILE``: the GPU part of the conformance suite.

On a machine with a CUDA device, four parts, the JSON results file written after each (a run cut
short leaves what it did): **cuda**, every single-process property with CUDA tensors (the output
must stay on the device); **bitwise**, CUDA against CPU bits (informational); **nccl_world1**,
the distributed properties at world size 1 over NCCL (it refuses two ranks on one GPU);
**gloo_cuda_2**, them with CUDA tensors over gloo on 2 processes. ``--examples`` per property,
derandomized; parts that would start after ``--deadline`` s are recorded as not run. Exit status
0 when every part that ran passed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import subprocess
import sys
import time
import traceback

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings

from conformance import distributed
from conformance import error_cases as EC
from conformance import properties as P
from conformance import runner as R
from conformance import strategies as S
from conformance.subject import Subject


def _git(*args) -> str | None:
    """Best effort: which code ran (the device copy may have no .git)."""
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() not in ("", "HEAD") else None
    except Exception:  # noqa: BLE001
        return None


def _settings(examples: int):
    return settings(max_examples=examples, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=False, report_multiple_bugs=False)


def _run_property(prop, subject, examples: int) -> dict:
    t0 = time.monotonic()
    why = subject.unsupported(prop.needs)
    if why:
        return {"property": prop.name, "status": "skip", "reason": why, "seconds": 0.0}
    record: list = []
    try:
        R.build_test(prop, subject, _settings(examples), record=record)()
        status, message = "pass", ""
    except Exception as e:  # noqa: BLE001
        status, message = "fail", str(e)[-6000:]
    return {"property": prop.name, "status": status, "examples": examples,
            "seconds": round(time.monotonic() - t0, 2), "message": message,
            "case": record[-1].dumps() if record else None}


def _bitwise(target: str, examples: int, device: str = "cuda") -> dict:
    """CUDA vs CPU bits on the plain and testfloat strategies (informational)."""
    cpu, gpu = Subject(target), Subject(target, device=device)
    stats = {"compared": 0, "identical": 0, "first_difference": None}

    @_settings(examples)
    @given(case=S.cases(S.Context(), kinds=("binary", "plain", "testfloat", "offset"), pairs=("anti_exact",)))
    def run(case):
        a, b = cpu.outcome(cpu.call, case), gpu.outcome(gpu.call, case)
        if a.ok and b.ok:
            stats["compared"] += 1
            if a.values.tobytes() == b.values.tobytes():
                stats["identical"] += 1
            elif stats["first_difference"] is None:
                i = int(np.flatnonzero(a.values != b.values)[0]) if np.any(a.values != b.values) else 0
                stats["first_difference"] = {"case": case.dumps(), "index": i, "cpu": float(a.values[i]).hex(),
                                             "cuda": float(b.values[i]).hex()}

    t0 = time.monotonic()
    run()
    return {"property": "cpu_vs_cuda_bits", "status": "info", "seconds": round(time.monotonic() - t0, 2), **stats}


#: The strategy of each distributed property (its name without the world size), at any world size.
_DIST_CASES = {"dist_values": S.dist_cases, "dist_missing": S.dist_missing_cases, "dist_errors": EC.dist_error_cases}


def _dist_variant(prop, world: int):
    """The distributed property at another world size (same check, same kind of cases)."""
    kind = prop.name.rsplit("_", 1)[0]
    return dataclasses.replace(prop, name=f"{kind}_{world}", world=world,
                               strategy=lambda ctx, subject: _DIST_CASES[kind](ctx, world))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.gpu_check", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="results file (JSON)")
    ap.add_argument("--impl", default="impl.gdpo:gdpo_advantages")
    ap.add_argument("--examples", type=int, default=40)
    ap.add_argument("--deadline", type=float, default=170.0, help="seconds for the whole run")
    ap.add_argument("--dry-run-cpu", action="store_true",
                    help="run every part on the CPU with gloo (checks this script without a GPU)")
    args = ap.parse_args(argv)
    start = time.monotonic()
    results = {"impl": args.impl, "examples_per_property": args.examples, "python": platform.python_version(),
               "commit": _git("rev-parse", "HEAD"), "dirty": _git("status", "--porcelain", "--", "impl", "conformance"),
               "torch": torch.__version__, "cuda_available": torch.cuda.is_available(), "parts": {},
               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if torch.cuda.is_available():
        results.update(device=torch.cuda.get_device_name(0), cuda=torch.version.cuda,
                       nccl=".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None)

    def save():
        results["seconds"] = round(time.monotonic() - start, 1)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)

    dev, nccl = ("cpu", "gloo") if args.dry_run_cpu else ("cuda", "nccl")
    results["dry_run_cpu"] = args.dry_run_cpu
    if not torch.cuda.is_available() and not args.dry_run_cpu:
        results["parts"]["all"] = [{"status": "skip", "reason": "no CUDA device"}]
        save()
        print("no CUDA device: nothing to check")
        return 0

    def ranks(world: int, backend: str):
        """The distributed properties at ``world`` ranks over ``backend``."""
        return [_run_property(_dist_variant(p, world), Subject(args.impl, device=dev, backend=backend),
                              args.examples) for p in P.PROPERTIES if p.world == 2]

    parts = [
        ("cuda", lambda: [_run_property(p, Subject(args.impl, device=dev), args.examples)
                          for p in P.PROPERTIES if p.world == 0]),
        ("bitwise", lambda: [_bitwise(args.impl, args.examples, dev)]),
        ("nccl_world1", lambda: ranks(1, nccl)),
        ("gloo_cuda_2", lambda: ranks(2, "gloo")),
    ]
    ok = True
    for name, fn in parts:
        t0 = time.monotonic()
        if t0 - start > args.deadline:
            results["parts"][name] = [{"status": "not run", "reason": f"past the {args.deadline:g} s deadline"}]
            save()
            continue
        try:
            rows = fn()
        except Exception:  # noqa: BLE001 - a broken part is recorded, the next one still runs
            rows = [{"status": "error", "message": traceback.format_exc()[-6000:]}]
        # each part starts with new ranks, but in a dry run nccl_world1 and gloo_cuda_2 both run on
        # the CPU's one gloo pool: a part that passed leaves it to the next (4 torch imports saved)
        if not (args.dry_run_cpu and name == "nccl_world1" and all(r.get("status") == "pass" for r in rows)):
            distributed.close_all()
        results["parts"][name] = rows
        ok &= all(r.get("status") in ("pass", "skip", "info") for r in rows)
        print(f"{name}: " + ", ".join(f"{r.get('property', '?')} {r['status']}" for r in rows)
              + f" ({time.monotonic() - t0:.1f} s)", flush=True)
        save()
    results["ok"] = ok
    save()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
