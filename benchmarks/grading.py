"""Time one full grading run of one implementation (``gdpo check``), and check that the
grading profile still rejects every negative control.

    python -m benchmarks.grading [--repeats 3] [--out benchmarks/grading.json]
    python -m benchmarks.grading --controls [--out benchmarks/grading_controls.json]
    python -m benchmarks.grading --peers [--python trl=VENV/bin/python ...] [--out benchmarks/grading_peers.json]

The first form runs, ``--repeats`` times each, the runs of issue 20 part 5 (``gdpo check
--single-process`` of ``impl.gdpo`` and of the multireward-grpo peer where it is installed)
as subprocesses, one at a time, and prints the median wall time and the pytest time of each
(the wall time includes starting Python, importing torch and collecting the suite). The
second runs ``gdpo check --impl conformance.controls:NAME`` for every negative control
(without ``--single-process``: two controls are rejected by the multi-process properties
only) and fails unless every one is rejected. The third grades each published peer through its
real entry point (``gdpo peers``' command for it), each in the interpreter that has it
installed. All are figures, not tests: the machine is shared, so the numbers go into
``benchmarks/RESULTS.md`` with the load they ran under.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = {
    "impl.gdpo": ["--single-process"],
    "multireward_grpo": ["--impl", "conformance.peers:multireward_grpo", "--convention", "multireward_grpo",
                         "--single-process"],
}


def grade(args: list[str], timeout: float = 900.0, python: str = sys.executable) -> dict:
    """One ``gdpo check`` run by ``python``: its wall time, exit code and JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "grading.json")
        t0 = time.monotonic()
        proc = subprocess.run([python, "-m", "gdpo_tools.cli", "check", *args, "--json", path],
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


def timings(repeats: int, runs: dict | None = None, pythons: dict | None = None) -> dict:
    """``repeats`` gradings of each of ``runs`` ({name: gdpo check arguments}, default :data:`RUNS`),
    one at a time, each by its interpreter in ``pythons`` (default: this one)."""
    out = {}
    pythons = pythons or {}
    for name, args in (runs or RUNS).items():
        python = pythons.get(name, sys.executable)
        if name == "multireward_grpo" and python == sys.executable \
                and importlib.util.find_spec("multireward_grpo") is None:
            print(f"{name}: not installed here, skipped", flush=True)
            continue
        runs_ = []
        for i in range(repeats):
            load = _load()
            r = grade(args, python=python)
            g = r["grading"] or {}
            runs_.append({"wall_s": r["wall_s"], "pytest_s": g.get("seconds"), "rc": r["rc"],
                          "counts": g.get("counts"), "load_before": round(load, 2)})
            print(f"{name} run {i + 1}: {r['wall_s']:.1f} s wall, pytest {g.get('seconds')} s, rc {r['rc']}, "
                  f"load {load:.2f}" + ("" if g else f"\n{r['tail']}"), flush=True)
        out[name] = {"args": args, "python": python, "profile": (runs_ and (r["grading"] or {}).get("profile")),
                     "runs": runs_, "median_wall_s": statistics.median(x["wall_s"] for x in runs_)}
        print(f"{name}: median {out[name]['median_wall_s']:.1f} s wall over {repeats}", flush=True)
    return out


def peer_runs() -> dict:
    """{peer: its ``gdpo check`` arguments}: each published peer through its real entry point, as
    ``gdpo peers`` grades it (``gdpo_tools/peers_report.py``)."""
    from gdpo_tools import peers_report

    return {conv.name: peers_report.check_args(conv.name) for conv in peers_report.peers()}


def control_names() -> list[str]:
    """The negative controls' names (read in a subprocess: benchmarks import no grader module)."""
    proc = subprocess.run([sys.executable, "-c", "from conformance import controls; print(*controls.CONTROLS)"],
                          capture_output=True, text=True, check=True)
    return proc.stdout.split()


def controls() -> dict:
    out = {}
    for name in control_names():
        r = grade(["--impl", f"conformance.controls:{name}"])
        g = r["grading"] or {}
        failed = [p["name"] for p in g.get("properties", []) if p["verdict"] in ("failed", "error")]
        out[name] = {"rejected": r["rc"] == 1 and bool(failed), "rc": r["rc"], "failed": failed,
                     "wall_s": r["wall_s"]}
        print(f"{name:>30}: {'rejected' if out[name]['rejected'] else 'NOT REJECTED'} ({len(failed)} failed: "
              f"{', '.join(failed[:6])}{'...' if len(failed) > 6 else ''}) {r['wall_s']:.0f} s", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.grading", description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--controls", action="store_true", help="grade every negative control instead")
    ap.add_argument("--peers", action="store_true",
                    help="time one grading of each published peer through its real entry point instead")
    ap.add_argument("--python", action="append", default=[], metavar="PEER=PATH",
                    help="the interpreter that has PEER installed (repeatable; default: this one)")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    result = {"python": sys.version.split()[0], "cpus": os.cpu_count(),
              "env_profile": os.environ.get("GDPO_HYPOTHESIS_PROFILE")}
    if args.controls:
        result["controls"] = controls()
        ok = all(v["rejected"] for v in result["controls"].values())
    elif args.peers:
        pythons = dict(p.split("=", 1) for p in args.python)
        result["peers"] = timings(args.repeats, peer_runs(), pythons)
        ok = all(len(v["runs"]) == args.repeats and all(r["counts"] for r in v["runs"]) for v in result["peers"].values())
    else:
        result["timings"] = timings(args.repeats)
        ok = True
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
