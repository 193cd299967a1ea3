"""Time ``gdpo check`` as a maintainer runs it, and check that it still rejects every negative control.

    python -m benchmarks.grading [--repeats 3] [--out benchmarks/grading.json]
    python -m benchmarks.grading --controls [--out benchmarks/grading_controls.json]
    python -m benchmarks.grading --peers [--python ms_swift=VENV/bin/python ...] [--out benchmarks/grading_peers.json]

The first form runs, ``--repeats`` times each and one at a time, the default gradings of
:data:`RUNS` (code written from the paper, tests/paper_impls.py, through the trl shape with no
option; ``impl.gdpo``) as subprocesses, and prints the median wall time of each (starting Python
and importing torch included). The second runs ``gdpo check --strict --impl
conformance.controls:NAME`` for every negative control and fails unless every one is rejected. The
third grades each published peer as ``gdpo peers`` does, each in the interpreter that has it. All
are figures, not tests: they go into ``benchmarks/RESULTS.md`` with the load they ran under.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = {
    "correct_f32 (trl shape)": ["--impl", "paper_impls:correct_f32", "--call-shape", "trl"],
    "correct_f64 (trl shape)": ["--impl", "paper_impls:correct_f64", "--call-shape", "trl"],
    "no_std_eq4 (trl shape)": ["--impl", "paper_impls:no_std_eq4", "--call-shape", "trl"],
    "impl.gdpo": ["--single-process"],
}


def grade(args: list[str], timeout: float = 900.0, python: str = sys.executable) -> dict:
    """One ``gdpo check`` run by ``python`` from the repository root (tests/ importable): its wall
    time, exit code and JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "grading.json")
        t0 = time.monotonic()
        proc = subprocess.run([python, "-m", "gdpo_tools.cli", "check", *args, "--json", path], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
        wall = time.monotonic() - t0
        data = json.loads(Path(path).read_text()) if Path(path).exists() else None
    return {"wall_s": round(wall, 2), "rc": proc.returncode, "grading": data,
            "tail": "" if data else (proc.stdout[-1500:] + proc.stderr[-1500:])}


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def timings(repeats: int, runs: dict, pythons: dict | None = None) -> dict:
    """``repeats`` gradings of each of ``runs`` ({name: gdpo check arguments}), one at a time."""
    out = {}
    for name, args in runs.items():
        python = (pythons or {}).get(name, sys.executable)
        done = []
        for i in range(repeats):
            load = _load()
            r = grade(args, python=python)
            g = r["grading"] or {}
            done.append({"wall_s": r["wall_s"], "grading_s": g.get("seconds"), "rc": r["rc"],
                         "findings": len(g.get("findings") or ()), "load_before": round(load, 2)})
            print(f"{name} run {i + 1}: {r['wall_s']:.1f} s wall ({g.get('seconds')} s grading), rc {r['rc']}, "
                  f"load {load:.2f}" + ("" if g else f"\n{r['tail']}"), flush=True)
        out[name] = {"args": args, "python": python, "runs": done,
                     "median_wall_s": statistics.median(x["wall_s"] for x in done)}
        print(f"{name}: median {out[name]['median_wall_s']:.1f} s wall over {repeats}", flush=True)
    return out


def peer_runs() -> dict:
    """{peer: its ``gdpo check`` arguments}, as ``gdpo peers`` grades it."""
    from gdpo_tools import peers_report

    return {conv.name: peers_report.check_args(conv.name) for conv in peers_report.peers()}


def controls() -> dict:
    names = subprocess.run([sys.executable, "-c", "from conformance import controls; print(*controls.CONTROLS)"],
                           capture_output=True, text=True, check=True, cwd=ROOT).stdout.split()
    out = {}
    for name in names:
        r = grade(["--strict", "--impl", f"conformance.controls:{name}"])
        found = (r["grading"] or {}).get("findings") or []
        out[name] = {"rejected": r["rc"] == 1 and bool(found), "rc": r["rc"], "wall_s": r["wall_s"],
                     "findings": [f"{f['category']}: {f['cause'][:80]}" for f in found]}
        print(f"{name:>30}: {'rejected' if out[name]['rejected'] else 'NOT REJECTED'} ({len(found)} findings) "
              f"{r['wall_s']:.0f} s", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.grading", description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--controls", action="store_true", help="grade every negative control instead (--strict)")
    ap.add_argument("--peers", action="store_true", help="time one grading of each published peer instead")
    ap.add_argument("--python", action="append", default=[], metavar="PEER=PATH",
                    help="the interpreter that has PEER installed (repeatable; default: this one)")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    result = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    ok = True
    if args.controls:
        result["controls"] = controls()
        ok = all(v["rejected"] for v in result["controls"].values())
    elif args.peers:
        result["peers"] = timings(args.repeats, peer_runs(), dict(p.split("=", 1) for p in args.python))
    else:
        result["timings"] = timings(args.repeats, RUNS)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
