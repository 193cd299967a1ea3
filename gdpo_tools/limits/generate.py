"""Known-limit tables of GDPO implementations, measured against the exact oracle.

The command (``gdpo limits``, ``python -m gdpo_tools.limits``: docs/limits.md), the documented
limits (:data:`LIMITS`) that every run checks, and the page; the tables: ``tables.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import math
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from gdpo_tools.limits import tables as T
from gdpo_tools.limits.tables import Table, fmt
import torch
from gdpo_tools.limits import plots as limits_plots
from gdpo_tools import markdown_table, version
from gdpo_tools.progress import Progress

ROOT = Path(__file__).resolve().parents[2]  # the checkout (gdpo_tools/limits/generate.py), or site-packages
DEFAULT_OUT = ROOT / "spec" / "generated" / "known_limits.md"
#: The file written into the output folder; the plots go to its limits/ subfolder.
PAGE = DEFAULT_OUT.name
COMMAND = "python -m gdpo_tools.limits"
ENV_BEGIN = "<!-- environment: begin (machine-dependent; tests/test_limits.py ignores this block) -->"
ENV_END = "<!-- environment: end -->"


# ------------------------------------------------------------------- limits


@dataclasses.dataclass(frozen=True)
class Limit:
    """A documented limit (or guarantee) and the measurement that must still show it."""

    id: str
    text: str
    check: Callable[[object], tuple[bool, str]]  # (still shows, what was measured) of what ``read`` reads
    #: where it starts on an axis real batches have a range on (:data:`REAL`): (axis, value),
    #: ("setting", the training choice that reaches it), or ("guarantee", "") for what holds everywhere
    reach: tuple = ("guarantee", "")
    read: Callable[[dict], object] = lambda facts: facts  # the facts it reads, from every group's


#: What a realistic batch is, for "what this means for your training": rewards from 0/1 up to
#: response lengths in tokens, integer-valued, in groups of up to 16; weights of order one.
#: Per axis: what it measures, the realistic bound, and whether a limit starting at or below
#: ("le") or at or above ("ge") that bound is within reach.
REAL_MAX_REWARD = limits_plots.REAL_MAX_REWARD
REAL_MIN_STD = limits_plots.REAL_MIN_BINARY_STD  # an integer column that varies, in a group of up to 16
REAL = {
    "digits": ("a group column's offset over its std", REAL_MAX_REWARD / REAL_MIN_STD, "le"),
    "std": ("a varying group column's std", REAL_MIN_STD, "ge"),
    "magnitude": ("a reward's magnitude", REAL_MAX_REWARD, "le"),
    "weight": ("a weight's magnitude", 1e3, "le"),
}
#: The offset-over-std ratio of the `[C - d, d]` columns and of the variance table's groups.
_D_STD = float(T.D.std(ddof=1))
_STEPS_STD = float(T._STEPS.std(ddof=1))


def _cd(kind, c):
    """The facts of the `[C - d, d]` ("cd") or constant-sum ("cs") row at C in its own unit."""
    return lambda f: f["cancellation"][(kind, "own", c)]


def _impl_grades(f):
    return [g for (name, _family, _grading), grades in f["peers"].items() if name == "impl64" for g in grades]


def _sharp_cd(f):
    """The `[C - d, d]` rows whose cond is sharp (the first-order change itself)."""
    return [m for (kind, _, _), m in f["cancellation"].items() if kind == "cd" and m["cond_sharp"]]


def _all_cs_own_zero(f):
    return all(m["impl_max"] == 0.0 for (kind, unit, _), m in f["cancellation"].items()
               if kind == "cs" and unit == "own")


def _variances(field, *cells):
    """The ``field`` of the variance table's facts at each (offset, dtype, algorithm)."""
    return lambda f: [f["variance"][cell][field] for cell in cells]


def _worst(f, name, family, grading):
    """The worst err/bound of an implementation over a peer-table family."""
    return max(g.ratio for g in f["peers"][(name, family, grading)])


_F32_PEERS = T.P.FLOAT32_PEERS
_EQUAL_WEIGHTS = "(2^24, -(2^24 + 1)), r2 = r1"

LIMITS: tuple[Limit, ...] = (
    Limit("cancellation-naive", "`[C - d, d]` at C = 1e15 (own unit): naive float64 (mean, then deviations) is O(1) "
          "off the exact result; the impl stays within the spec bound.",
          lambda m: (m["naive_err"] >= 0.1 and m["impl_ratio"] <= 1,
                     f"naive err {fmt(m['naive_err'])}, impl err/bound {fmt(m['impl_ratio'])}"),
          reach=("digits", 1e15 / _D_STD), read=_cd("cd", 1e15)),
    Limit("cancellation-conditioning", "The exact result of the float64 `[C - d, d]` inputs is itself O(1) from C = "
          "1e13, where one ulp of every input moves it by more than 1 (own unit; `cond`, that first-order change, is "
          "sharp there): the problem's conditioning, which no implementation removes (the intended decimal inputs "
          "would give exactly 0).",
          lambda m: (m["exact_max"] >= 0.5 and m["cond_max"] >= 1 and m["cond_sharp"],
                     f"exact max abs a {fmt(m['exact_max'])} at 1e13, max cond {fmt(m['cond_max'])} at 1e13 (sharp: "
                     f"{m['cond_sharp']})"),
          reach=("digits", 1e13 / _D_STD), read=_cd("cd", 1e13)),
    Limit("cancellation-naive-within-conditioning", "Naive float64 (mean, then deviations) on `[C - d, d]` errs by "
          "less than the problem's own first-order change (`naive err/cond` below 1) on every row where `cond` is "
          "sharp: an error of the size an ulp of input perturbation explains, which the shift-invariant impl avoids.",
          lambda rows: (bool(rows) and max(m["naive_per_cond"] for m in rows) < 1,
                        f"largest naive err/cond {fmt(max(m['naive_per_cond'] for m in rows))} (sharp rows)"),
          read=_sharp_cd),
    Limit("constant-sum-exact-zero", "Exact constant-sum groups `r2 = C - r1` (own unit): the impl returns exactly 0 "
          "at every C; naive float64 leaves a residue that is O(1) at C = 1e15.",
          lambda v: (v[0] and v[1] >= 0.1,
                     f"impl exactly 0 on every C: {v[0]}, naive max abs a {fmt(v[1])} at 1e15"),
          reach=("digits", 1e15 / _D_STD),
          read=lambda f: (_all_cs_own_zero(f), _cd("cs", 1e15)(f)["naive_max"])),
    Limit("float32-inputs", "Float32 peers cannot hold `[C - d, d]` from C = 1e9: the TRL mirror is O(1) off the "
          "exact result of the float64 inputs although it is accurate on the float32 inputs it holds.",
          lambda m: (m["trl_vs_f64"] >= 0.5 and m["trl_err"] < 1e-3,
                     f"TRL vs exact(f64) {fmt(m['trl_vs_f64'])}, vs exact of its inputs {fmt(m['trl_err'])}"),
          reach=("digits", 1e9 / _D_STD), read=_cd("cd", 1e9)),
    Limit("nemo-one-pass-cancellation", "NeMo-RL's one-pass float32 group variance is O(1) off its own exact result "
          "on `[C - d, d]` at C = 1e3 (own unit).",
          lambda m: (m["peer_worst"] == "nemo_rl" and m["peer_err"] >= 0.5,
                     f"{m['peer_worst']} err {fmt(m['peer_err'])}"),
          reach=("digits", 1e3 / _D_STD), read=_cd("cd", 1e3)),
    Limit("eps-1e-3", "With one column's group std at 1e-3, eps 1e-4 instead of 1e-8 moves advantages by more than "
          "1e-2.",
          lambda m: (m["d4"] > 1e-2, f"max abs da {fmt(m['d4'])}"),
          reach=("std", 1e-3), read=lambda f: f["eps"][1e-3]),
    Limit("eps-mutes", "Below eps (column std 1e-5), eps 1e-4 mutes the column (max abs z < 0.2) while eps 1e-8 keeps "
          "it at full size (max abs z > 1).",
          lambda z: (z[1e-4] < 0.2 and z[1e-8] > 1, f"max abs z {fmt(z[1e-4])} vs {fmt(z[1e-8])}"),
          reach=("std", 1e-5), read=lambda f: f["eps"][1e-5]["z"]),
    Limit("ng2-magnitude", "n_g = 2: gaps 1 and 1e4 give the same advantage (to 1e-3); only a gap near eps is damped.",
          lambda gap: (abs(gap[1e4]["a"] - gap[1.0]["a"]) < 1e-3 and gap[1e-4]["z"] < 0.5,
                       f"a {gap[1.0]['a']:.4f} vs {gap[1e4]['a']:.4f}; z at gap 1e-4 {gap[1e-4]['z']:.4f}"),
          reach=("setting", "two generations per prompt"), read=lambda f: f["pairs"]["gap"]),
    Limit("correlation", "rho = -1 cancels exactly (c = 0: no signal); rho = +1 amplifies the combined std sqrt 2 "
          "times over rho = 0.",
          lambda rho: (rho[-1.0]["c_zero"] and abs(rho[1.0]["std_c"] / rho[0.0]["std_c"] - math.sqrt(2)) < 0.01,
                       f"c exactly 0: {rho[-1.0]['c_zero']}, std ratio "
                       f"{fmt(rho[1.0]['std_c'] / rho[0.0]['std_c'], 3)}"),
          reach=("setting", "two reward components that are exact complements (r2 = 1 - r1)"),
          read=lambda f: f["pairs"]["rho"]),
    Limit("one-pass-float32", "One-pass float32 variance gives std 0 (a silent zero) at offsets 1e3 and 1e4, where "
          "the exact std is 0.0129.",
          lambda v: (v[0] <= 0 and v[1] <= 0, f"variance {fmt(v[0])} and {fmt(v[1])}"),
          reach=("digits", 1e3 / _STEPS_STD),
          read=_variances("var", (1e3, "float32", "one-pass"), (1e4, "float32", "one-pass"))),
    Limit("one-pass-float64", "One-pass float64 variance is off by more than 100% at offset 1e8; the shifted two-pass "
          "stays at the last bits.",
          lambda v: (v[0] > 1 and v[1] < 1e-14, f"{fmt(v[0])} vs {fmt(v[1])}"),
          reach=("digits", 1e8 / _STEPS_STD),
          read=_variances("rel", (1e8, "float64", "one-pass"), (1e8, "float64", "shifted two-pass"))),
    Limit("two-pass-float32-offset", "Float32 two-pass (mean first) loses digits with the offset: at 1e4 it is 100 "
          "times worse than the shifted two-pass.",
          lambda v: (v[0] > 100 * v[1], f"{fmt(v[0])} vs {fmt(v[1])}"),
          reach=("digits", 1e4 / _STEPS_STD),
          read=_variances("rel", (1e4, "float32", "two-pass"), (1e4, "float32", "shifted two-pass"))),
    Limit("float32-reward-overflow", "Float32 peers: rewards `M * [...]` with M = 1e20 give silent zeros (squares "
          "overflow float32), and so do rewards beyond FLT_MAX (TRL's NaN-aware z turns the overflow's NaN into 0).",
          lambda r: (r[("1e+20", "trl")] == "silent zero" and r[("1e+39", "trl")] == "silent zero",
                     f"TRL: {r[('1e+20', 'trl')]}, {r[('1e+39', 'trl')]}"),
          reach=("magnitude", 1e20), read=lambda f: f["ranges"]["rewards"]),
    Limit("naive-float64-overflow", "Naive float64: squares overflow at M = 1e155 and the group silently becomes zero.",
          lambda o: (o == "silent zero", o),
          reach=("magnitude", 1e155), read=lambda f: f["ranges"]["rewards"][("1e+155", "naive_f64")]),
    Limit("impl-reward-range", "impl: correct on every reward magnitude up to DBL_MAX and on both float32 extremes.",
          lambda r: (all(o == "correct" for (case, name), o in r.items() if name == "impl"),
                     ", ".join(sorted({o for (c, n), o in r.items() if n == "impl"}))),
          read=lambda f: f["ranges"]["rewards"]),
    Limit("float32-weights", "Weights `(16777216, -16777217)` on identical columns: float32 peers merge them and "
          "return silent zeros; impl is correct.",
          lambda w: (all(w[(_EQUAL_WEIGHTS, n)] == "silent zero" for n in _F32_PEERS)
                     and w[(_EQUAL_WEIGHTS, "impl")] == "correct",
                     "float32 peers: " + ", ".join(sorted({w[(_EQUAL_WEIGHTS, n)] for n in _F32_PEERS}))),
          reach=("weight", 2.0 ** 24), read=lambda f: f["ranges"]["weights"]),
    Limit("impl-weight-range", "impl: correct with weights up to `(1e39, 1e39)` and `(DBL_MAX, 1)`; `(DBL_MAX, "
          "DBL_MAX)` overflows the combined value and is refused with OutOfRangeError (clear error, not inf).",
          lambda w: (w[("(1e+39, 1e+39)", "impl")] == "correct" and w[("(DBL_MAX, 1)", "impl")] == "correct"
                     and w[("(DBL_MAX, DBL_MAX)", "impl")] == "clear error", w[("(DBL_MAX, DBL_MAX)", "impl")]),
          read=lambda f: f["ranges"]["weights"]),
    Limit("nan-reward", "A NaN reward: impl raises (NonFiniteError) on every case; every peer returns numbers or NaN "
          "without an error.",
          lambda p: (all(g.outcome == "clear error" for g in p[("impl64", "NaN reward", "spec")])
                     and all(g.outcome == "no error" for n in (*_F32_PEERS, "multireward_grpo")
                             for g in p[(n, "NaN reward", "spec")]),
                     "impl: clear error; peers: no error"),
          reach=("setting", "a reward function that fails and returns NaN"), read=lambda f: f["peers"]),
    Limit("float32-offset", "Large-offset groups: the float32 two-pass peers stay within the error bound of their own "
          "algorithm (mean then subtract, float32: table 6a) and exceed the shift-invariant bound of spec (table 6b) "
          "by orders of magnitude; NeMo-RL's one-pass variance exceeds even its own two-pass bound.",
          lambda w: (all(w[n][0] <= 1 for n in ("trl", "verl", "nvlabs", "ms_swift")) and w["nemo_rl"][0] > 1
                     and all(w[n][1] > 100 for n in _F32_PEERS),
                     "worst err/bound own: " + ", ".join(f"{n} {fmt(w[n][0])}" for n in _F32_PEERS)
                     + "; under spec: " + ", ".join(f"{n} {fmt(w[n][1])}" for n in _F32_PEERS)),
          reach=("setting", "rewards with a large common offset (table 6a: offsets 1e3 to 1e6, steps 0.01 to 1)"),
          read=lambda f: {n: [_worst(f, n, "large offset", grading) for grading in ("own", "spec")]
                          for n in _F32_PEERS}),
    Limit("impl-peers", "impl (out float64) is within the spec bound on every case of every family, and refuses the "
          "NaN family.",
          lambda grades: (all(g.outcome in ("correct", "clear error") and g.ratio <= 1 for g in grades),
                          f"worst err/bound {fmt(max(g.ratio for g in grades))}"),
          read=_impl_grades),
)


def check_limits(facts: dict) -> list[tuple[Limit, bool, str]]:
    """(limit, still shows, what was measured) of each of :data:`LIMITS`."""
    out = []
    for lim in LIMITS:
        try:
            ok, measured = lim.check(lim.read(facts))
        except (KeyError, ValueError, ZeroDivisionError) as e:  # its case did not run or changed shape
            ok, measured = False, f"not measured ({type(e).__name__}: {e})"
        out.append((lim, bool(ok), measured))
    return out


def limits_table(results) -> Table:
    rows = [[lim.id, lim.text, measured, "yes" if ok else "**NO: stale, fix the code or this entry**"]
            for lim, ok, measured in results]
    return Table(
        "limits", "Documented limits",
        "Each entry is checked against the tables below every time they are generated; "
        "`tests/test_limits.py` fails when one stops reproducing, so a fix cannot leave a stale entry behind "
        "(delete or rewrite the entry in `LIMITS`, `gdpo_tools/limits/generate.py`, together with the fix).",
        ["id", "limit", "measured", "still reproduces"], rows)


def reach_verdict(lim: Limit) -> tuple[str, str, str]:
    """(where the limit starts, what it means for a realistic batch, its kind: "real",
    "setting", "constructed" or "guarantee")."""
    axis, at = lim.reach
    if axis == "guarantee":
        return "-", "holds for every batch (a guarantee of impl.gdpo, not a limit)", "guarantee"
    if axis == "setting":
        return at, "reached when the run has this (a setting, or rewards of that kind)", "setting"
    what, bound, side = REAL[axis]
    real = at <= bound if side == "le" else at >= bound
    where = f"{what} {fmt(at)}"
    if real:
        return where, f"**within reach**: real rewards go to {fmt(bound)} there", "real"
    if axis == "std":
        return where, (f"not with integer rewards (their varying columns have std >= {fmt(bound)}); continuous "
                       "scores can go there"), "constructed"
    return where, f"constructed inputs only: real batches stay {'below' if side == 'le' else 'above'} {fmt(bound)}", \
        "constructed"


def training_table(results) -> Table:
    verdicts = [(lim.id, *reach_verdict(lim)) for lim, _ok, _measured in results]
    kinds = [kind for *_, kind in verdicts]
    real, setting = ([i for i, *_, kind in verdicts if kind == k] for k in ("real", "setting"))
    intro = (f"A realistic batch, here: rewards from 0/1 up to response lengths of {REAL_MAX_REWARD:,.0f} tokens, "
             f"integer-valued (so a column that varies within a group of up to 16 has std >= {fmt(REAL_MIN_STD)}), "
             "weights of order one. Of the "
             f"{len(results)} documented limits, {len(real)} can be reached by such a batch with no special setting "
             f"({', '.join(real) or 'none'}), {len(setting)} when the run has a particular setting or kind of reward "
             f"({', '.join(setting)}), "
             f"{kinds.count('constructed')} only by constructed inputs (or continuous scores with a tiny spread), "
             f"and {kinds.count('guarantee')} are guarantees. impl.gdpo computes the constructed cases correctly "
             "too (the impl-* rows); the float32 peers do not. Where each starts comes from the case the entry is "
             "measured on.")
    return Table("training", "What this means for your training", intro,
                 ["limit", "where it starts", "a realistic batch"], [row[:3] for row in verdicts])


# ----------------------------------------------------------------- rendering


def render_table(t: Table) -> str:
    return f"<!-- table:{t.id} keys={t.keys} -->\n" + markdown_table(t.head, t.rows)


def render_section(t: Table, group: str | None) -> str:
    rerun = (f"Rerun: `{COMMAND} --only {group}` (prints this group; add `--seed N` for other peer cases)."
             if group else f"Rerun: `{COMMAND}` (the entries read the fast subset's cases, so `--fast` checks "
                           "them too).")
    return "\n".join([f"### {t.title}", "", t.intro, "", rerun, "", render_table(t)])


def environment(seed: int, fast: bool, wall: float) -> list[list[str]]:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), cpu)
    except OSError:
        pass

    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    try:
        if checkout_generated_dir() is None:
            raise OSError("an installed package: no commit of ours to name")
        commit = (git("rev-parse", "--short", "HEAD") or "unknown") + (
            " (uncommitted changes)" if git("status", "--porcelain") else "")
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return [
        ["generated", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")],
        ["command", f"`{COMMAND}{' --fast' if fast else ''} --seed {seed}`"],
        ["wall time", f"{wall:.0f} s"],
        ["commit", commit],
        ["python", platform.python_version()],
        ["numpy / torch / mpmath / gmpy2 / matplotlib",
         " / ".join(version(m) for m in ("numpy", "torch", "mpmath", "gmpy2", "matplotlib"))],
        ["platform", f"{platform.system()} {platform.machine()}, {cpu}, torch threads {torch.get_num_threads()}"],
        ["device", "CPU (every implementation runs on the CPU here)"],
    ]


def generate(fast: bool, seed: int, progress: Progress, only=None, plots_dir: Path | None = None) -> tuple:
    """(tables by group name, check_limits' results, the plots written, wall seconds)."""
    t0 = time.monotonic()
    built = {name: build(fast, seed, progress) for name, build in T.BUILDERS.items() if not only or name in only}
    limits = check_limits({name: facts for name, (_, facts) in built.items()}) if not only else []
    plots = []
    if plots_dir is not None and not only:
        grid = [10.0 ** e for e in ([3, 6, 9, 11, 13, 15, 16] if fast else [x / 4 for x in range(12, 65)])]
        step = progress("plots", 3)
        for name, axis in (("cancellation", grid), ("variance", [10.0 ** (x / 4) for x in range(0, 33)]),
                           ("eps", [10.0 ** (-x / 4) for x in range(4, 30)])):
            plots.append(getattr(limits_plots, name)(axis, plots_dir / f"{name}.png"))
            step()
    progress.done()
    return {name: tables for name, (tables, _) in built.items()}, limits, plots, time.monotonic() - t0


_GROUP_TITLES = dict(zip(T.BUILDERS, ("1. Cancellation", "2. eps", "3. n_g = 2 and correlated components",
                                      "4. Variance algorithms", "5. Ranges", "6. Peers", "7. Certified rounding")))
_PLOT_CAPTIONS = {  # each drawn into {name}.png
    "cancellation": "Error against C for `[C - d, d]` and exact constant-sum groups (own unit)",
    "eps": "Largest change of an advantage when eps moves, against the column's std",
    "variance": "Relative error of the std against offset, per algorithm and dtype"}


def render(groups: dict, limits: list, plots: list, seed: int, fast: bool, wall: float, out: Path) -> str:
    plots_rel = {p.name: p for p in plots}
    lines = [
        "# Known limits, measured",
        "",
        f"<!-- generated by `{COMMAND}` (gdpo_tools/limits/generate.py); do not edit by hand. -->",
        "",
        "Every number below is measured by the command that wrote this file: the exact oracle (`oracle/`) gives "
        "the reference, the spec error model (`spec/error_model.py`) the tolerance, and each implementation "
        "runs as it ships (`impl.gdpo`) or as a faithful mirror of a peer's published formula "
        "(`gdpo_tools/peer_formulas.py`, `gdpo_tools/limits/peers.py`). Regenerate with "
        f"`{COMMAND}` or `gdpo limits` (well under a minute on two cores; `--fast` for the subset CI checks, "
        "`--seed N` for other peer cases). `tests/test_limits.py` regenerates the fast subset "
        "and fails when a committed row disagrees with it or a documented limit stops reproducing.",
        "",
        f"Seed: {seed}. Numbers carry two or three significant digits so that platform noise in the last "
        "bits cannot flip a cell.",
        "",
        ENV_BEGIN,
        "| | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in environment(seed, fast, wall)),
        ENV_END,
        "",
        render_section(training_table(limits), None).replace("### ", "## ", 1),
        "",
        render_section(limits_table(limits), None).replace("### ", "## ", 1),
    ]
    for name, tables in groups.items():
        lines += ["", f"## {_GROUP_TITLES[name]}", ""]
        rel = plots_rel.get(f"{name}.png")
        if name in _PLOT_CAPTIONS and rel is not None:
            caption = _PLOT_CAPTIONS[name]
            if rel.resolve().is_relative_to(out.parent.resolve()):
                rel = rel.resolve().relative_to(out.resolve().parent)
            lines += [f"![{caption}]({rel.as_posix()})", "", f"*{caption}.*", ""]
        for t in tables:
            lines += [render_section(t, name), ""]
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------- CLI


def checkout_generated_dir() -> Path | None:
    """This source checkout's spec/generated/ folder, or None where the package runs installed
    (a wheel's files sit in site-packages, beside no pyproject.toml of ours)."""
    project = ROOT / "pyproject.toml"
    try:
        ours = project.is_file() and 'name = "gdpo-spec"' in project.read_text()
    except OSError:
        ours = False
    return DEFAULT_OUT.parent if ours and DEFAULT_OUT.is_file() else None


def main(argv: list[str] | None = None, prog: str = "python -m gdpo_tools.limits") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="the small deterministic subset CI regenerates")
    parser.add_argument("--seed", type=int, default=0, help="seed of the peer-table cases (default 0)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help=f"folder to write {PAGE} into (its plots go to DIR/limits/); default, in a "
                             "source checkout only: the checkout's spec/generated/")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--only", choices=sorted(T.BUILDERS), action="append",
                        help="print this table group to stdout instead of writing the file (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)
    progress = Progress(enabled=not args.quiet, tool="limits")
    if args.only:
        for name, tables in generate(args.fast, args.seed, progress, only=set(args.only))[0].items():
            for t in tables:
                print(render_section(t, name) + "\n")
        return 0
    folder = args.out if args.out is not None else checkout_generated_dir()
    if folder is None:
        parser.error("give --out DIR: outside a source checkout there is no spec/generated/ folder of ours to "
                     "rewrite (the installed package's own files are never written)")
    if folder.exists() and not folder.is_dir():
        parser.error(f"--out {folder}: not a folder (it is written as {folder}/{PAGE} and {folder}/limits/)")
    if not args.no_plots and importlib.util.find_spec("matplotlib") is None:
        parser.error("the plots need matplotlib: pip install 'gdpo-spec[limits]', or pass --no-plots")
    out = folder / PAGE
    plots_dir = None if args.no_plots else folder / "limits"
    groups, limits, plots, wall = generate(args.fast, args.seed, progress, plots_dir=plots_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(groups, limits, plots, args.seed, args.fast, wall, out))
    print(f"wrote {out}" + "".join(f" and {p}" for p in plots) + f" in {wall:.0f} s", file=sys.stderr)
    stale = [lim.id for lim, ok, _ in limits if not ok]
    if stale:
        print(f"documented limits that no longer reproduce: {', '.join(stale)} (edit LIMITS in "
              "gdpo_tools/limits/generate.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
