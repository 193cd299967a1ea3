"""The certificate's cost (issue 27): impl.gdpo with and without certified rounding, side by side.

    python -m benchmarks.certified [--n 65536] [--k 4] [--batches 8] [--repeats 15] [--family normal|binary]
                                   [--baseline [REV] [--in-process]] [--json PATH]
    python -m benchmarks.certified --fallbacks 600 [--family normal]
    python -m benchmarks.certified --labelled [--batches 4]

Each batch is a fresh float32 reward tensor, of two families: normal rewards, and 0/1 rewards (the
usual correctness and format rewards, where about 3% of rows cancel exactly across columns of
equal variance: c* = 0, decided by the group-exact tier); groups of 8 and of 16, one unit, the
default output dtype float32. For each batch the plain path (``certified="off"``: one
rounding of the float64 result) and the certified path run alternately, ``repeats`` times each;
a batch's figure is the median of each. The ratio is certified / plain of those medians; the
table also gives, per batch, how many samples the float64 bound left to the double-double tier
(and to exact arithmetic).

``--fallbacks SEEDS`` times nothing: it counts, per family and group size, the batches of seeds
0 .. SEEDS-1 whose certificate needed the double-double tier or exact arithmetic (the rare
whole-call fallback, about 23x the call: the mean cost it adds is that share times ~23).

``--baseline [REV] --in-process`` imports REV's impl into this process instead (under another
package name): the three columns then share one process's allocator, caches and threads, none
paying for another process's state.

``--baseline [REV]`` adds a third column: the same call as the git revision REV computed it
(default :data:`FILED`, the last commit before the certificate, whose plain path is the "today's"
of issue 27's cost target). REV is exported with ``git archive`` into a temporary folder and run
in a child process; each repeat times the certified call, the plain call and the child's call in
turns of three calls (each process times its own; the first call of a turn is not counted, and
the order rotates on each repeat), so the three share the machine's state. Each column's
calls are also taken apart by their minor page faults: glibc's allocator hands a call's large
temporaries back as fresh pages in some batches and not others (about 1,000 faults, 2.5-3 ms
a call here, on any revision), so two more columns compare the certified call, then the plain
call, with the baseline's over their fault-free calls alone (fewer than :data:`FAULT_FREE`
faults; "-" where either had none): the second says how much of the first is the plain path's
own cost. Benchmarks are never assertions: the test suite checks only that this runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

import torch

from impl import gdpo


#: the last commit before impl's certificate (15a040e): issue 27's "today's" plain path
FILED = "a52e195"


#: calls per turn; the first of each turn is not counted: it absorbs what the previous turn left
#: behind (another process's OpenMP threads still spinning on a core, a colder cache)
BLOCK = 3


def _faults() -> int:
    """This process's minor page faults so far (fresh pages handed to it by the kernel)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _median_ms(fn, repeats: int, other, third=None) -> tuple[tuple, tuple, tuple | None]:
    """(ms, minor page faults, ms of the fault-free calls or None where none was) medians of
    ``fn`` and ``other`` timed in turns of :data:`BLOCK`
    calls, and of ``third`` (a callable that returns its own (ms, faults): the baseline's child
    process) in the same rotation; each repeat is one turn of each, the rotation starting one
    place later on each repeat. The first call of a turn is not counted: measured on this 2-core
    machine, a call timed right after the child's came out up to twice as slow (the child's
    OpenMP threads spin on after its call), which a fixed order of single calls charged to one
    column. The faults: a call whose large temporaries come back from the allocator as fresh
    pages (about 1,000 faults) took 2.5-3 ms longer here, on either path; the allocator flips
    between the two regimes from batch to batch."""
    def timed(f):
        def run():
            f0 = _faults()
            t0 = time.perf_counter()
            f()
            return (time.perf_counter() - t0) * 1e3, _faults() - f0
        return run
    calls = [timed(fn), timed(other)] + ([third] if third is not None else [])
    got: list[list[tuple[float, float]]] = [[] for _ in calls]
    for i in range(repeats):
        for j in range(len(calls)):
            at = (i + j) % len(calls)
            turn = [calls[at]() for _ in range(BLOCK)]
            got[at].extend(turn[1:])

    def medians(xs):
        clean = [x[0] for x in xs if x[1] < FAULT_FREE]
        return (statistics.median(x[0] for x in xs), statistics.median(x[1] for x in xs),
                statistics.median(clean) if clean else None)
    return medians(got[0]), medians(got[1]), (medians(got[2]) if third is not None else None)


#: a call with fewer minor page faults than this is "fault-free" (the allocator's other regime
#: costs about 1,000 a call): the fault-free medians compare the arithmetic, not that regime
FAULT_FREE = 16


_CHILD = r"""
import resource, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
from impl import gdpo
r = g = None
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "batch":  # batch FAMILY N K GROUP SEED
        fam, n, k, g, seed = cmd[1], int(cmd[2]), int(cmd[3]), int(cmd[4]), int(cmd[5])
        gen = torch.Generator().manual_seed(seed)
        r = ((torch.rand(n, k, generator=gen) < 0.5).float() if fam == "binary"
             else torch.randn(n, k, generator=gen, dtype=torch.float32))
        print("ok", flush=True)
    else:  # time one call: ms and minor page faults
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        gdpo.gdpo_advantages(r, group_size=g, out_dtype=torch.float32)
        t = (time.perf_counter() - t0) * 1e3
        print(t, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0, flush=True)
"""


class Baseline:
    """The same call at git revision ``rev``, in a child process over a pipe."""

    def __init__(self, rev: str):
        self.rev = subprocess.run(["git", "rev-parse", "--short", rev], capture_output=True, text=True,
                                  check=True).stdout.strip()
        self._dir = tempfile.TemporaryDirectory(prefix="gdpo-baseline-")
        tar = os.path.join(self._dir.name, "src.tar")
        # impl imports spec, and its certificate's last tier oracle (a revision without oracle/ has none)
        tops = ["impl", "spec"] + (["oracle"] if subprocess.run(["git", "cat-file", "-e", f"{self.rev}:oracle"],
                                                                capture_output=True).returncode == 0 else [])
        subprocess.run(["git", "archive", "-o", tar, self.rev, *tops], check=True)
        with tarfile.open(tar) as t:
            t.extractall(self._dir.name, filter="data")
        env = dict(os.environ, PYTHONPATH=self._dir.name)
        self._p = subprocess.Popen([sys.executable, "-c", _CHILD, str(torch.get_num_threads())], cwd=self._dir.name,
                                   env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def _ask(self, line: str) -> str:
        self._p.stdin.write(line + "\n")
        self._p.stdin.flush()
        got = self._p.stdout.readline()
        if not got:
            raise RuntimeError(f"the baseline {self.rev} stopped")
        return got.strip()

    def batch(self, family: str, n: int, k: int, group_size: int, seed: int) -> None:
        self._ask(f"batch {family} {n} {k} {group_size} {seed}")

    def __call__(self) -> tuple[float, int]:
        t, faults = self._ask("time").split()
        return float(t), int(faults)

    def close(self) -> None:
        self._p.stdin.close()
        self._p.wait(timeout=60)
        self._dir.cleanup()


class InProcess:
    """The same call at git revision ``rev``, in this process: that revision's ``impl`` exported
    with ``git archive`` and imported under another package name (its own ``impl`` imports
    rewritten; ``spec`` is this checkout's, whose constants and error classes it imports). Its
    calls share this process's allocator, caches and threads with the other two columns, so
    none of them pays for another process's state (the child's page-fault regime, its cache
    footprint, its spinning threads), which the child process's column carries."""

    NAME = "gdpo_baseline_impl"

    def __init__(self, rev: str):
        import importlib
        import re
        self.rev = subprocess.run(["git", "rev-parse", "--short", rev], capture_output=True, text=True,
                                  check=True).stdout.strip()
        self._dir = tempfile.TemporaryDirectory(prefix="gdpo-baseline-")
        tar = os.path.join(self._dir.name, "src.tar")
        subprocess.run(["git", "archive", "-o", tar, self.rev, "impl"], check=True)
        with tarfile.open(tar) as t:
            t.extractall(self._dir.name, filter="data")
        root = os.path.join(self._dir.name, self.NAME)
        os.rename(os.path.join(self._dir.name, "impl"), root)
        pattern = re.compile(r"^(\s*)(from|import) impl(\b)", re.M)
        for folder, _, files in os.walk(root):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path) as f:
                        text = f.read()
                    with open(path, "w") as f:
                        f.write(pattern.sub(lambda m: f"{m[1]}{m[2]} {self.NAME}{m[3]}", text))
        sys.path.insert(0, self._dir.name)
        self._gdpo = importlib.import_module(f"{self.NAME}.gdpo")
        self._r = self._g = None

    def batch(self, family: str, n: int, k: int, group_size: int, seed: int) -> None:
        self._r, self._g = rewards(family, n, k, seed), group_size

    def __call__(self) -> tuple[float, int]:
        f0 = _faults()
        t0 = time.perf_counter()
        self._gdpo.gdpo_advantages(self._r, group_size=self._g, out_dtype=torch.float32)
        return (time.perf_counter() - t0) * 1e3, _faults() - f0

    def close(self) -> None:
        sys.path.remove(self._dir.name)
        for name in [m for m in sys.modules if m == self.NAME or m.startswith(self.NAME + ".")]:
            del sys.modules[name]  # (another revision may be imported under the same name later)
        self._dir.cleanup()


FAMILIES = ("normal", "binary")


def rewards(family: str, n: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if family == "binary":
        return (torch.rand(n, k, generator=gen) < 0.5).float()
    return torch.randn(n, k, generator=gen, dtype=torch.float32)


def ragged_labels(n: int, g: int, seed: int) -> torch.Tensor:
    """Labels of ragged groups of about ``g`` rows (g - 2 to g + 2, at least 2), each one run of
    rows (verl's layout with groups of unequal sizes), the last group taking what is left."""
    gen = torch.Generator().manual_seed(seed)
    sizes, total = [], 0
    for x in torch.randint(max(g - 2, 2), g + 3, (n // max(g - 2, 2) + 2,), generator=gen).tolist():
        if total + x > n - 2:
            sizes.append(n - total)
            break
        sizes.append(x)
        total += x
    return torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))


def run(n: int = 65536, k: int = 4, batches: int = 8, repeats: int = 15, out_dtype=torch.float32,
        families=FAMILIES, baseline: Baseline | None = None, labelled: bool = False) -> list[dict]:
    """``labelled``: ragged labelled groups of about 8 and 16 rows (:func:`ragged_labels`), not
    contiguous groups of 8 and 16 (no baseline: its child times contiguous groups)."""
    assert not (labelled and baseline is not None), "the baseline's child times contiguous groups"
    rows = []
    # the default's certificate (narrow formats); a float64 output is certified only in mode "all"
    mode = "all" if out_dtype == torch.float64 else "narrow"
    for family, group_size in ((f, g) for f in families for g in (8, 16)):
        for seed in range(batches):
            r = rewards(family, n, k, seed)
            groups = {"group_ids": ragged_labels(n, group_size, seed)} if labelled else {"group_size": group_size}

            def certified():
                return gdpo.gdpo_advantages(r, out_dtype=out_dtype, certified=mode, **groups)

            def plain():
                return gdpo.gdpo_advantages(r, out_dtype=out_dtype, certified="off", **groups)

            d = gdpo.Diagnostics()
            gdpo.gdpo_advantages(r, out_dtype=out_dtype, diagnostics=d, certified=mode, **groups)
            if baseline is not None:
                assert out_dtype == torch.float32, "the baseline's child times float32 outputs"
                baseline.batch(family, n, k, group_size, seed)
            (t_cert, f_cert, c_cert), (t_plain, f_plain, c_plain), base = _median_ms(certified, repeats, plain, baseline)
            c = d.certified
            row = {"family": family, "n": n, "k": k, "group_size": group_size, "seed": seed, "labelled": labelled,
                   "out_dtype": str(out_dtype),
                   "plain_ms": round(t_plain, 3), "certified_ms": round(t_cert, 3),
                   "ratio": round(t_cert / t_plain, 3), "plain_faults": f_plain, "certified_faults": f_cert,
                   "float64": c.float64, "group_exact": c.group_exact,
                   "double_double": c.double_double, "exact": c.exact, "uncertified": c.uncertified}
            if base is not None:
                t_base, f_base, c_base = base
                row.update(baseline=baseline.rev, baseline_ms=round(t_base, 3), ratio_baseline=round(t_cert / t_base, 3),
                           baseline_faults=f_base,
                           ratio_baseline_fault_free=None if c_cert is None or c_base is None else round(c_cert / c_base, 3),
                           plain_ratio_baseline_fault_free=(None if c_plain is None or c_base is None
                                                            else round(c_plain / c_base, 3)))
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    base = any("baseline_ms" in r for r in rows)
    extra = (f" {rows[0]['baseline']} ms | certified / {rows[0]['baseline']} | the same, fault-free calls |"
             f" plain / {rows[0]['baseline']}, fault-free calls |" if base else "")
    lines = ["| rewards | N | K | group | batch | plain ms | certified ms | ratio |" + extra
             + " page faults a call (plain, certified" + (", baseline" if base else "") + ") |"
             + " group-exact samples | dd samples | exact samples |",
             "|---|---|---|---|---|---|---|---|" + ("---|---|---|---|" if base else "") + "---|---|---|---|"]

    def clean(x):
        return "-" if x is None else f"{x:.2f}"
    for r in rows:
        more = (f" {r['baseline_ms']:.2f} | {r['ratio_baseline']:.2f} | {clean(r.get('ratio_baseline_fault_free'))} |"
                f" {clean(r.get('plain_ratio_baseline_fault_free'))} |") if base else ""
        faults = ", ".join(f"{r[k]:g}" for k in ("plain_faults", "certified_faults", "baseline_faults") if k in r)
        group = f"~{r['group_size']} (labels)" if r.get("labelled") else str(r["group_size"])
        lines.append(f"| {r.get('family', 'normal')} | {r['n']:,} | {r['k']} | {group} | {r['seed']} | "
                     f"{r['plain_ms']:.2f} | {r['certified_ms']:.2f} | {r['ratio']:.2f} |{more} {faults} | "
                     f"{r['group_exact']} | {r['double_double']} | {r['exact']} |")
    for fam in dict.fromkeys(r.get("family", "normal") for r in rows):
        for g in sorted({r["group_size"] for r in rows}):
            sel = [r for r in rows if r["group_size"] == g and r.get("family", "normal") == fam]
            if not sel:
                continue
            ratios = [r["ratio"] for r in sel]
            more = ""
            if base:
                rb = [r["ratio_baseline"] for r in sel]
                rc = [r["ratio_baseline_fault_free"] for r in sel if r.get("ratio_baseline_fault_free") is not None]
                rp = [r["plain_ratio_baseline_fault_free"] for r in sel
                      if r.get("plain_ratio_baseline_fault_free") is not None]
                more = (f" {statistics.median(r['baseline_ms'] for r in sel):.2f} | "
                        f"{statistics.median(rb):.2f} (mean {statistics.mean(rb):.2f}) | "
                        + (f"{statistics.median(rc):.2f} ({len(rc)} of {len(sel)} batches) |" if rc else "- |")
                        + (f" {statistics.median(rp):.2f} ({len(rp)} of {len(sel)} batches) |" if rp else " - |"))
            lines.append(f"| median, {fam}, groups of {g} | | | | | {statistics.median(r['plain_ms'] for r in sel):.2f} | "
                         f"{statistics.median(r['certified_ms'] for r in sel):.2f} | "
                         f"{statistics.median(ratios):.2f} (mean {statistics.mean(ratios):.2f}) |{more} | | | |")
    return "\n".join(lines)


def fallbacks(seeds: int, n: int = 65536, k: int = 4, families=FAMILIES) -> list[dict]:
    """Per family and group size: how many of the batches of seeds 0 .. seeds-1 left samples to
    the double-double tier or to exact arithmetic (certified float32 output), and which."""
    out = []
    for family, group_size in ((f, g) for f in families for g in (8, 16)):
        hit = []
        for seed in range(seeds):
            d = gdpo.Diagnostics()
            gdpo.gdpo_advantages(rewards(family, n, k, seed), group_size=group_size, diagnostics=d, certified="narrow")
            c = d.certified
            if c.double_double or c.exact or c.uncertified:
                hit.append(seed)
        out.append({"family": family, "group_size": group_size, "batches": seeds, "fallback_batches": len(hit),
                    "seeds": hit})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--family", choices=FAMILIES, action="append", help="default: both")
    ap.add_argument("--baseline", nargs="?", const=FILED, default=None, metavar="REV",
                    help=f"also time the call at git revision REV (default {FILED}) in a child process")
    ap.add_argument("--in-process", action="store_true",
                    help="run the baseline's call in this process (its impl imported under another name), "
                         "not in a child process")
    ap.add_argument("--json", default=None)
    ap.add_argument("--labelled", action="store_true",
                    help="ragged labelled groups of about 8 and 16 rows (group_ids), not contiguous groups")
    ap.add_argument("--fallbacks", type=int, default=None, metavar="SEEDS",
                    help="count the batches of seeds 0..SEEDS-1 that fall back to double-double (no timing)")
    a = ap.parse_args(argv)
    if a.fallbacks is not None:
        got = fallbacks(a.fallbacks, a.n, a.k, tuple(a.family or FAMILIES))
        print("| rewards | group | batches | to double-double or exact | seeds |\n|---|---|---|---|---|")
        for r in got:
            print(f"| {r['family']} | {r['group_size']} | {r['batches']} | {r['fallback_batches']} | "
                  f"{', '.join(map(str, r['seeds'])) or '-'} |")
        return 0
    base = (InProcess if a.in_process else Baseline)(a.baseline) if a.baseline else None
    try:
        rows = run(a.n, a.k, a.batches, a.repeats, families=tuple(a.family or FAMILIES), baseline=base,
                   labelled=a.labelled)
    finally:
        if base is not None:
            base.close()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"threads": torch.get_num_threads(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
