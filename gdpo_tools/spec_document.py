"""Fill the numbers of ``spec/gdpo.md``, the hand-edited specification, from code.

    python -m gdpo_tools.spec_document            # rewrite the values in spec/gdpo.md in place
    python -m gdpo_tools.spec_document --check    # exit 1 where a value there is stale

How the values sit between markers, and what is an error: docs/limits.md.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import numpy as np

from gdpo_tools import markdown_table
from gdpo_tools.peer_formulas import one_pass_variance
from oracle import condition, exact, gdpo, whitening
from oracle.exact import exact_std
from oracle.examples import CORRECTNESS_LENGTH, TWO_GROUP, grpo_reference
from spec import CONVENTIONS, DEFAULT_OUT_DTYPE, FLOAT32_MAX, MIN_GROUP_SIZE
from spec import error_model
from spec.constants import REFUSAL_WORDS_BYTES
from spec.errors import ERROR_CLASSES, ERROR_EXAMPLES, NOT_RAISED, example_ranks

#: The specification document, hand-edited; this module rewrites only its values.
OUTPUT = Path(__file__).resolve().parent.parent / "spec" / "gdpo.md"
#: A value: its name, and the text this module last wrote there.
VALUE = re.compile(r"<!-- value:(?P<name>[\w.]+) -->(?P<text>.*?)<!-- /value -->", re.S)


def _g(x: float, digits: int = 4) -> str:
    return f"{x:.{digits}g}"


def _one_pass_std(values, dtype) -> str:
    v = one_pass_variance(np.array(values, dtype=dtype), np.dtype(dtype))
    return "NaN (negative variance)" if v < 0 else _g(float(np.sqrt(v)))


def _error_rows() -> list[list[str]]:
    """Section 6: each class's docstring, the calls that raise it and those that do not
    (spec/errors.py; tests/test_spec.py runs every call shown against impl.gdpo)."""
    def on_ranks(call):
        ranks = example_ranks(call)
        return f" (on each of {ranks} ranks)" if ranks > 1 else ""

    rows = []
    for name, cls in ERROR_CLASSES.items():
        shown = [f"`{call}`{on_ranks(call)}" for call in ERROR_EXAMPLES.get(name, ())]
        shown += [f"not `{call}`{on_ranks(call)}: " + ("computes" if outcome == "computes" else f"raises {outcome}")
                  for call, outcome in NOT_RAISED.get(name, ())]
        rows.append([f"`{name}`", " ".join((cls.__doc__ or "").split()), "<br>".join(shown) or "any of the below"])
    return rows


def context() -> dict[str, str]:
    spec = CONVENTIONS["spec"]
    ctx: dict[str, str] = {}
    for field in ("group_ddof", "whiten_ddof", "group_eps", "whiten_eps"):
        value = getattr(spec, field)
        ctx[f"spec.{field}"] = repr(value) if isinstance(value, float) else str(value)
    ctx.update(default_out_dtype=DEFAULT_OUT_DTYPE, min_group_size=str(MIN_GROUP_SIZE),
               words_bytes=f"{REFUSAL_WORDS_BYTES:,}", safety=repr(error_model.SAFETY), start_prec=str(exact.START_PREC),
               max_prec=str(exact.MAX_PREC), tie_test_prec=str(whitening.TIE_TEST_PREC))
    sig = [10000.0, 10000.005, 10000.010, 10000.015]
    ctx["signal_relative_spread"] = _g((max(sig) - min(sig)) / max(sig), 2)
    ctx["w_merged"] = repr(float(np.float32(16777217.0)))
    big = np.finfo(np.float64).max
    terms = gdpo.gdpo_advantages(np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]), [0, 0, 0], weights=[big, -big / 2])
    ctx["eq7_term_c"] = f"{float(np.max(np.abs(terms.combined.float64))):.3g}"

    r, g = TWO_GROUP["rewards"], TWO_GROUP["group_ids"]
    res = gdpo.gdpo_advantages(r, g)
    grpo = grpo_reference(r, g)
    ctx["two_group_grpo"] = _g(abs(grpo[0]))
    rows = [[str(i), "AB"[g[i]], *(repr(float(v)) for v in r[i]), *(f"{v:+.6f}" for v in res.z.float64[i]),
             f"{res.combined.float64[i]:+.6f}", f"{res.float64[i]:+.6f}", f"{grpo[i]:+.6f}"] for i in range(r.shape[0])]
    ctx["two_group_table"] = markdown_table(
        ["i", "group", "correctness", "format", "z correctness", "z format", "c (Eq. 7)",
         "a (Eq. 6)", "GRPO"], rows)

    r, g = CORRECTNESS_LENGTH["rewards"], CORRECTNESS_LENGTH["group_ids"]
    a = gdpo.gdpo_advantages(r, g).float64
    grpo = grpo_reference(r, g)
    ctx["cl_gdpo_argmax"], ctx["cl_gdpo_best"] = str(int(np.argmax(a))), f"{a.max():.4f}"
    ctx["cl_grpo_argmax"], ctx["cl_grpo_best"] = str(int(np.argmax(grpo))), f"{grpo.max():.4f}"

    r1 = np.array([[0.0], [1.0], [3.0], [7.0], [1.0], [2.0], [2.0], [9.0]])
    g1 = [0] * 4 + [1] * 4
    ctx["single_reward_vs_grpo"] = _g(float(np.max(np.abs(gdpo.gdpo_advantages(r1, g1).float64
                                                          - grpo_reference(r1, g1)))), 3)
    pair = np.array([[0.0], [1.0]])
    z2 = gdpo.standardize_groups(pair, [0, 0])
    ctx["ng2_z"] = f"{abs(z2.float64[0, 0]):.4f}"

    r8 = np.arange(1.0, 9.0)[:, None]
    per_unit = gdpo.gdpo_advantages(r8, [0] * 8, unit_ids=[0] * 4 + [1] * 4).float64
    merged = gdpo.gdpo_advantages(r8, [0] * 8).float64
    ctx["merge_sign_flips"] = str(int(np.sum(np.sign(per_unit) != np.sign(merged))))

    d = np.array([0.1, 0.2, 0.3, 0.7])
    cd = []
    for C in (1e9, 1e11, 1e13, 1e15):
        rr = np.stack([C - d, d], 1)
        res = gdpo.gdpo_advantages(rr, [0] * 4)
        assert res.cond_sharp.all()  # the section says so: the first-order change itself
        cd.append([_g(float(res.cond.max()), 2), _g(float(np.abs(res.float64).max()), 2),
                   _g(float(condition.stagewise(gdpo.gdpo_advantages, rr, [0] * 4).cond.max()), 2)])
    ctx["cd_cond"], ctx["cd_exact"], ctx["cd_cond_stagewise"] = (", ".join(column) for column in zip(*cd))
    ctx["cd_samuelson"] = _g(3 / 2, 2)  # (n - 1)/sqrt(n), n = 4: the largest |a| of a unit of 4
    # a group of two moves only through eps: z = +-(1/2) d / D, d = r_2 - r_1, D = |d| / sqrt(2) + eps,
    # so |dz/dr_j| = eps / (2 D^2) exactly; cond is that first-order change, sharp
    eps2 = spec.group_eps
    D = 1 / math.sqrt(2) + eps2
    ulps = math.ulp(1.0) + 5e-324  # the oracle's ulp of 0 is the least subnormal
    first_order = eps2 * ulps / (2 * D * D)
    ctx["n2_eps"] = repr(eps2)
    ctx["n2_cond"] = _g(float(z2.cond.max()), 2)
    ctx["n2_first_order"] = _g(first_order, 2)
    ctx["n2_stagewise"] = _g(float(condition.stagewise(gdpo.standardize_groups, pair, [0, 0]).cond.max()), 2)
    # within 2^-19 (and float64's evaluation of first_order, a few ulps) of the first-order change
    assert z2.cond_sharp.all() and np.all(np.abs(z2.cond / first_order - 1) <= 2.0 ** -19 + 1e-15)
    ctx["cond_sharp_bits"] = "2^-19"
    ctx["cond_cap"] = str(condition.CAP)

    for name, values in (("1000", [1000.0, 1000.01, 1000.02, 1000.03]),
                         ("10000", [10000.0, 10000.001, 10000.002, 10000.003])):
        ctx[f"onepass_{name}_f32"] = _one_pass_std(values, np.float32)
        ctx[f"onepass_{name}_f64"] = _one_pass_std(values, np.float64)
        # each row's exact std is of the very inputs that row computes on: the float32 roundings
        # of the decimals for the float32 rows, the float64 ones for the float64 row
        ctx[f"exact_std_{name}"] = _g(exact_std(np.array(values, dtype=np.float32).tolist()), 3)
        ctx[f"exact_std_{name}_f64"] = _g(exact_std(values), 3)

    base = np.array([[0.0, 0.0], [1.0, 1e-3], [2.0, 2e-3], [3.0, 0.5e-3]])
    e4, e8 = (gdpo.gdpo_advantages(base, [0] * 4, eps=eps).float64 for eps in (1e-4, 1e-8))
    ctx["eps_effect"] = _g(float(np.max(np.abs(e4 - e8))), 2) + (
        f" (second column's std {_g(exact_std(base[:, 1]), 2)})")

    fm = FLOAT32_MAX
    zf = gdpo.standardize_groups(np.array([[-fm], [fm]], dtype=np.float32), [0, 0]).float64[:, 0]
    ctx["fltmax_z"] = f"[{zf[0]:+.4f}, {zf[1]:+.4f}]"

    # the final cast: one correct rounding vs torch's float64 -> float32 -> float16
    d = float.fromhex("0x1.25d6db655449ap-25")
    res = gdpo.gdpo_advantages(np.array([[d], [0.0]]), [0, 0])
    twice = error_model.round_to(res.float32[:1], "float16")[0]
    over = error_model.overflow_threshold("float16")
    ctx.update(dr_reward=d.hex(), dr_exact=f"{res.float64[0]:.10f}", dr_twice=f"{float(twice)!r}",
               dr_correct=f"{float(res.float16[0])!r} ({float(res.float16[0]).hex()})",
               f16_max=f"{error_model.largest_finite('float16'):g}", f16_overflow=f"{over:g}",
               f16_overflow_n=f"{over ** 2:.2g}")  # (n-1)/sqrt(n) < sqrt(n)
    # eps = 0 on a unit that cancels in exact arithmetic only (three weighted copies of one column)
    w = [float.fromhex(x) for x in ("0x1.1d0361dd0bf71p-2", "0x1.3b1b0f3282684p-3", "-0x1.ba90e9764d2b3p-2")]
    col = np.array([0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    res0 = gdpo.gdpo_advantages(np.stack([col] * 3, 1), [0, 0, 0, 1, 1, 1], weights=w, eps=0.0)
    assert res0.unit_collapsed.all() and not res0.required_zero.any()
    ctx["eps0_bound"] = f"{float(res0.allowed('float64')[0]):.6f}"
    ctx["eps0_sqrt"] = f"{math.sqrt(5):.6f}"

    # verl's masked_mean divides by mask.sum() + 1e-8: a no-op in float32 for any count >= 1
    assert all(np.float32(t) + np.float32(1e-8) == np.float32(t) for t in (1, 2, 3, 1000, 2**24))
    ctx["f32_half_ulp_1"] = _g(float(np.spacing(np.float32(1.0))) / 2, 2)

    rows = [[f"`{c.name}`", c.title, str(c.group_ddof), f"{c.group_eps!r} ({c.group_eps_placement})", c.whiten,
             f"{c.whiten_eps!r} ({c.whiten_eps_placement})", c.singleton, c.nan, c.native_dtype]
            for c in CONVENTIONS.values()]
    ctx["convention_table"] = markdown_table(["name", "implementation", "Eq. 4 ddof", "Eq. 4 eps (placement)",
                                              "Eq. 6", "Eq. 6 eps (placement)", "n_g = 1", "NaN", "dtype"], rows)
    ctx["provenance_table"] = markdown_table(
        ["name", "read from (package==version, file)", "entry point"],
        [[f"`{c.name}`", f"{c.package}=={c.version}, `{c.read_from}`" if c.package else c.read_from,
          f"`{c.entry_point}`" if c.entry_point else "-"] for c in CONVENTIONS.values() if c.name != "spec"])
    ctx["error_table"] = markdown_table(["class", "raised when", "for example"], _error_rows())
    return ctx


def _written(value: str) -> str:
    """How a value sits between its markers: a table (several lines) apart, with blank lines."""
    return f"\n\n{value}\n\n" if "\n" in value else value


def render(text: str | None = None) -> str:
    """The document (by default the committed one) with every value computed now."""
    text = OUTPUT.read_text() if text is None else text
    ctx = context()
    found = list(VALUE.finditer(text))
    unknown = sorted({m["name"] for m in found} - set(ctx))
    if unknown:
        raise KeyError(f"{OUTPUT.name}: values this module does not compute: {unknown}")
    unshown = sorted(set(ctx) - {m["name"] for m in found})
    if unshown:
        raise KeyError(f"{OUTPUT.name}: values computed here but shown nowhere (a marker was lost?): {unshown}")
    for m in found:
        if "\n" not in ctx[m["name"]] and not text[text.rfind("\n", 0, m.start()) + 1:m.start()].strip():
            raise ValueError(f"{OUTPUT.name}: the value {m['name']} begins a line, which ends a Markdown "
                             "paragraph there (an HTML comment starts a block): move it into the line")
    return VALUE.sub(lambda m: f"<!-- value:{m['name']} -->{_written(ctx[m['name']])}<!-- /value -->", text)


def stale(text: str) -> list[str]:
    """The values of ``text`` that differ from those computed now: 'name: written X, computed Y'."""
    ctx = context()
    return [f"{m['name']}: written {m['text'].strip()!r}, computed {ctx[m['name']]!r}"
            for m in VALUE.finditer(text) if m["name"] in ctx and m["text"] != _written(ctx[m["name"]])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gdpo_tools.spec_document", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where a value in spec/gdpo.md is stale")
    args = parser.parse_args(argv)
    committed = OUTPUT.read_text()
    text = render(committed)
    if args.check:
        if committed != text:
            shown = "".join(f"\n  {line}" for line in stale(committed))
            print(f"{OUTPUT} is stale: run `python -m gdpo_tools.spec_document`{shown}", file=sys.stderr)
            return 1
        return 0
    if text != committed:
        OUTPUT.write_text(text)
    print(f"{OUTPUT}: {len(VALUE.findall(text))} values, " + ("rewritten" if text != committed else "up to date"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
