"""The certificate's cost (issue 27): impl.gdpo with and without certified rounding, side by side.

    python -m benchmarks.certified [--n 65536] [--k 4] [--batches 8] [--repeats 15] [--family normal|binary]
                                   [--json PATH]

Each batch is a fresh float32 reward tensor, of two families: normal rewards, and 0/1 rewards (the
usual correctness and format rewards, where about 3% of rows cancel exactly across columns of
equal variance: c* = 0, decided by the group-exact tier); groups of 8 and of 16, one unit, the
default output dtype float32. For each batch the plain path (``impl._certify.disabled()``: one
rounding of the float64 result) and the certified path run alternately, ``repeats`` times each;
a batch's figure is the median of each. The ratio is certified / plain of those medians; the
table also gives, per batch, how many samples the float64 bound left to the double-double tier
(and to exact arithmetic). Benchmarks are never assertions: the test suite checks only that this
runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from impl import _certify, gdpo


def _median_ms(fn, repeats: int, other) -> tuple[float, float]:
    a, b = [], []
    fn(), other()  # warm
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        a.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        other()
        b.append(time.perf_counter() - t0)
    return statistics.median(a) * 1e3, statistics.median(b) * 1e3


FAMILIES = ("normal", "binary")


def rewards(family: str, n: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if family == "binary":
        return (torch.rand(n, k, generator=gen) < 0.5).float()
    return torch.randn(n, k, generator=gen, dtype=torch.float32)


def run(n: int = 65536, k: int = 4, batches: int = 8, repeats: int = 15, out_dtype=torch.float32,
        families=FAMILIES) -> list[dict]:
    rows = []
    for family, group_size in ((f, g) for f in families for g in (8, 16)):
        for seed in range(batches):
            r = rewards(family, n, k, seed)

            def certified():
                with _certify.enabled_here():
                    return gdpo.gdpo_advantages(r, group_size=group_size, out_dtype=out_dtype)

            def plain():
                with _certify.disabled():
                    return gdpo.gdpo_advantages(r, group_size=group_size, out_dtype=out_dtype)

            d = gdpo.Diagnostics()
            with _certify.enabled_here():
                gdpo.gdpo_advantages(r, group_size=group_size, out_dtype=out_dtype, diagnostics=d)
            t_cert, t_plain = _median_ms(certified, repeats, plain)
            c = d.certified
            rows.append({"family": family, "n": n, "k": k, "group_size": group_size, "seed": seed,
                         "out_dtype": str(out_dtype),
                         "plain_ms": round(t_plain, 3), "certified_ms": round(t_cert, 3),
                         "ratio": round(t_cert / t_plain, 3), "float64": c.float64, "group_exact": c.group_exact,
                         "double_double": c.double_double, "exact": c.exact, "uncertified": c.uncertified})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| rewards | N | K | group | batch | plain ms | certified ms | ratio | group-exact samples | dd samples "
             "| exact samples |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.get('family', 'normal')} | {r['n']:,} | {r['k']} | {r['group_size']} | {r['seed']} | "
                     f"{r['plain_ms']:.2f} | {r['certified_ms']:.2f} | {r['ratio']:.2f} | {r['group_exact']} | "
                     f"{r['double_double']} | {r['exact']} |")
    for fam in dict.fromkeys(r.get("family", "normal") for r in rows):
        for g in sorted({r["group_size"] for r in rows}):
            sel = [r for r in rows if r["group_size"] == g and r.get("family", "normal") == fam]
            if not sel:
                continue
            ratios = [r["ratio"] for r in sel]
            lines.append(f"| median, {fam}, groups of {g} | | | | | {statistics.median(r['plain_ms'] for r in sel):.2f} | "
                         f"{statistics.median(r['certified_ms'] for r in sel):.2f} | "
                         f"{statistics.median(ratios):.2f} (mean {statistics.mean(ratios):.2f}) | | | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--family", choices=FAMILIES, action="append", help="default: both")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    rows = run(a.n, a.k, a.batches, a.repeats, families=tuple(a.family or FAMILIES))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"threads": torch.get_num_threads(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
