"""How a call of ``impl.gdpo.gdpo_advantages`` walks through impl's modules.

    python -m benchmarks.call_path [--labels] [--units 2]

Traces one call (Python function calls only, impl's own modules only) and prints the
sequence of modules as the call moves between them, how many times it moves, and how
often it goes back into a module it had already left (a re-entry): a layout where each
step lives in one module reads top to bottom with few re-entries.
"""

from __future__ import annotations

import argparse
import sys

import torch


def trace(fn) -> list[str]:
    """The impl modules of the Python frames called while ``fn()`` runs, in call order."""
    seen: list[str] = []

    def profiler(frame, event, arg):
        if event == "call":
            mod = frame.f_globals.get("__name__", "")
            if mod.startswith("impl"):
                seen.append(mod)

    sys.setprofile(profiler)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def summarize(calls: list[str]) -> dict:
    path = [m for i, m in enumerate(calls) if i == 0 or calls[i - 1] != m]
    left: set[str] = set()
    reentries = 0
    for prev, cur in zip(path, path[1:]):
        left.add(prev)
        if cur in left:
            reentries += 1
    return {"calls": len(calls), "moves": max(len(path) - 1, 0), "reentries": reentries, "path": path,
            "modules": sorted(set(calls))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.call_path", description=__doc__.splitlines()[0])
    ap.add_argument("--labels", action="store_true", help="groups as labels (group_ids) instead of group_size")
    ap.add_argument("--units", type=int, default=2, help="whitening units (default 2)")
    args = ap.parse_args(argv)
    from impl import gdpo

    n, k, size = 64, 3, 8
    r = torch.rand(n, k, generator=torch.Generator().manual_seed(0))
    groups = {"group_ids": torch.arange(n) // size} if args.labels else {"group_size": size}
    segs = [n // args.units] * (args.units - 1) + [n - (n // args.units) * (args.units - 1)]
    call = lambda: gdpo.gdpo_advantages(r, weights=[1.0] * k, segment_sizes=segs, **groups)  # noqa: E731
    call()  # imports and caches first
    s = summarize(trace(call))
    print(f"gdpo_advantages ({'labels' if args.labels else 'group_size'}, {args.units} units): {s['calls']} Python "
          f"calls in impl, {s['moves']} moves between modules, {s['reentries']} re-entries into a module already "
          f"left; modules: {', '.join(s['modules'])}")
    print("path: " + " -> ".join(m.replace("impl.", "") for m in s["path"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
