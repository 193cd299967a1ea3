"""``gdpo audit`` at the size of a real training run: wall time and peak memory.

    python -m benchmarks.audit                       # 10k, 50k, 100k and 1M rows (.npz and .csv)
    python -m benchmarks.audit --rows 12000000 --formats csv   # the 12M-row CSV
    python -m benchmarks.audit --json OUT.json
    python -m benchmarks.audit --rows 200000 --formats jsonl csv --pad 1000   # memory follows the rows


Dumps shaped like a real run: groups of 8 or 16 samples, three components (correctness
0/1, length in tokens 1..4096, format 0/1), one whitening unit per 512 groups. Each audit
runs in its own process (``gdpo audit FILE --json``), so its peak resident memory
(``ru_maxrss``) is its own; the figures are one run each (an audit of a million rows is
one long call, not a micro-benchmark), and the machine's load is printed beside them.
``--pad N`` also audits the same rows with N more characters a line (a completion's text
in .jsonl, spaces in .csv): its peak should stay near the plain file's (issue 45).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

GROUPS_PER_UNIT = 512


def make_batch(rows: int, seed: int = 0):
    """Rewards (rows, 3), group labels and unit labels of a run-shaped dump."""
    rng = np.random.default_rng(seed)
    sizes = rng.choice([8, 16], size=rows // 8 + 1)
    sizes = sizes[:np.searchsorted(np.cumsum(sizes), rows) + 1]
    sizes[-1] -= int(sizes.sum()) - rows
    if sizes[-1] < 2:
        sizes[-2] += sizes[-1]
        sizes = sizes[:-1]
    group = np.repeat(np.arange(len(sizes)), sizes)
    unit = group // GROUPS_PER_UNIT
    p = rng.random(len(sizes))[group]  # per prompt difficulty: some all right, some all wrong
    correct = (rng.random(rows) < np.where(p < 0.2, 0.0, np.where(p > 0.8, 1.0, p))).astype(np.float64)
    length = np.clip(np.round(rng.lognormal(6.0, 0.8, rows)), 1, 4096)
    fmt = (rng.random(rows) < 0.95).astype(np.float64)
    return np.stack([correct, length, fmt], 1), group, unit


def write(path: Path, rewards, group, unit, pad: int = 0) -> None:
    if path.suffix == ".npz":
        np.savez(path, rewards=rewards, group_ids=group, unit_ids=unit,
                 names=np.array(["correct", "length", "format"]))
        return
    if path.suffix == ".jsonl":
        extra = f', "completion": "{"x" * pad}"' if pad else ""
        with path.open("w") as f:
            for g, u, (c, n, m) in zip(group.tolist(), unit.tolist(), rewards.tolist()):
                f.write(f'{{"group": {g}, "unit": {u}, "rewards": {{"correct": {c}, "length": {n}, "format": {m}}}'
                        f'{extra}}}\n')
        return
    if pad:
        with path.open("w") as f:
            f.write("group,unit,correct,length,format\n")
            for g, u, r in zip(group.tolist(), unit.tolist(), rewards.astype(np.int64).tolist()):
                f.write(f"{g},{u},{r[0]},{r[1]},{r[2]}{' ' * pad}\n")
        return
    with path.open("w") as f:
        f.write("group,unit,correct,length,format\n")
        step = 1_000_000
        for lo in range(0, len(group), step):
            hi = lo + step
            block = np.column_stack([group[lo:hi], unit[lo:hi], rewards[lo:hi].astype(np.int64)])
            np.savetxt(f, block, fmt="%d", delimiter=",")


_CHILD = """
import resource, sys, time
from gdpo_tools import audit
t0 = time.perf_counter()
rc = audit.main(sys.argv[1], as_json=True, out=open(sys.argv[2], "w"), progress=False)
wall = time.perf_counter() - t0
print(rc, wall, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def measure(path: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(out)], capture_output=True, text=True,
                          timeout=7200)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"audit of {path} failed: {proc.stderr[-2000:]}")
    rc, wall, rss = proc.stdout.split()
    report = json.loads(out.read_text())
    return {"file": path.name, "bytes": path.stat().st_size, "exit": int(rc), "wall_s": round(float(wall), 1),
            "peak_rss_mb": round(int(rss) / 1024), "groups": report.get("groups_total"),
            "groups_checked_by_oracle": report.get("method", {}).get("groups_checked_by_oracle"),
            "counts": report.get("counts")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.audit", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[10_000, 50_000, 100_000, 1_000_000])
    ap.add_argument("--formats", nargs="+", default=["npz", "csv"], choices=["npz", "csv", "jsonl"])
    ap.add_argument("--pad", type=int, default=0, help="also audit the rows with this many more characters a line")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = ap.parse_args(argv)
    rows_out = []
    with tempfile.TemporaryDirectory(prefix="gdpo-audit-bench-") as tmp:
        for rows in args.rows:
            r, g, u = make_batch(rows)
            for fmt, pad in [(f, p) for f in args.formats for p in ([0, args.pad] if args.pad and f != "npz" else [0])]:
                path = Path(tmp) / f"run_{rows}{'_padded' * bool(pad)}.{fmt}"
                t0 = time.perf_counter()
                write(path, r, g, u, pad)
                made = time.perf_counter() - t0
                res = measure(path, Path(tmp) / "report.json")
                res.update(rows=rows, format=fmt, pad=pad, write_s=round(made, 1), load=os.getloadavg()[0])
                rows_out.append(res)
                print(f"{rows:>10,} rows {fmt:>5} {res['bytes'] / 1e6:8.1f} MB: {res['wall_s']:7.1f} s, "
                      f"peak {res['peak_rss_mb']:6,} MB, exit {res['exit']}, oracle on "
                      f"{res['groups_checked_by_oracle']} of {res['groups']} groups (load {res['load']:.1f})",
                      flush=True)
                path.unlink()
    if args.json:
        args.json.write_text(json.dumps(rows_out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
