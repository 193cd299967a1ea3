"""Issue 18's demonstration for the grader: correct float64 codes that subtract a rounded
batch mean at Eq. 6 fail the new demand (a structural zero of c in a unit of whole groups
is exactly 0, spec section 7) and nothing else; with the structural mean they pass again.

Two pairs, each the same code but for that one choice:

* two-pass: ``conformance.controls:rounded_unit_mean`` (the controls' base as it was before
  issue 18, which passed every property) and ``conformance.controls:baseline`` (now with
  the structural mean);
* Welford: the same base with Eq. 6 by Welford's online mean and M2 (``welford_rounded``)
  and with the structural mean where the unit holds whole groups (``welford_structural``).

    PYTHONPATH=.:tests python3 tests/_structural_mean_demo.py [property ...]
    (DEMO_TARGETS=a:b,c:d to grade only those targets)

prints, per target, the properties that reject it (the ``ci`` budget and fixed seeds of
conformance/CONTROLS.md) and whether every failing row is a demanded exact zero.
Not collected by pytest (it takes minutes); the lead's report quotes its output.
"""

from __future__ import annotations

import functools
import math
import os
import re
import sys

import torch

from conformance import controls as C

_ORIGINAL = C._whiten_values


def _welford_values(x: torch.Tensor, eps: float, fl, whole: bool = False, structural: bool = True):
    """Eq. 6 on one unit by Welford's update (float64, the base's frame and eps)."""
    n = x.numel()
    if n == 0 or bool(x.max() == x.min()):
        return torch.zeros_like(x)
    e = C._frame(x, eps)
    xs = C._scale(x, -e)
    if whole and structural:  # Eq. 4 centres every group column: the unit's mean is exactly 0
        mean, m2 = 0.0, float(C._sum(xs * xs))
    else:
        mean, m2 = 0.0, 0.0
        for k, v in enumerate(xs.tolist(), 1):
            delta = v - mean
            mean += delta / k
            m2 += delta * (v - mean)
    den = math.sqrt(m2 / (n - 1)) + C._ldexp(eps, -e)
    return (xs - mean) / den


def _patched(structural: bool, call):
    @functools.wraps(call)
    def run(*args, **kwargs):
        C._whiten_values = functools.partial(_welford_values, structural=structural)
        try:
            return call(*args, **kwargs)
        finally:
            C._whiten_values = _ORIGINAL
    return run


def _make(structural: bool):
    fn = _patched(structural, functools.partial(C._gdpo, C.Flaws()))
    fn.normalize_rewards = C.baseline.normalize_rewards
    fn.whiten = _patched(structural, functools.partial(C._whiten, C.Flaws()))
    return fn


welford_rounded = _make(False)
welford_structural = _make(True)

TARGETS = ("conformance.controls:rounded_unit_mean", "conformance.controls:baseline",
           "_structural_mean_demo:welford_rounded", "_structural_mean_demo:welford_structural")


def main(names: list[str]) -> None:
    from conformance import properties as P
    from conformance import judge as J
    from conformance import report
    from conformance.subject import Subject

    props = [p for p in P.PROPERTIES if not names or p.name in names]
    only = os.environ.get("DEMO_TARGETS")
    for target in (only.split(",") if only else TARGETS):
        rejected, other = [], []
        for prop in props:
            rej, case, first = report.verdict(prop, target)
            if not rej:
                continue
            rejected.append(prop.name)
            try:  # the failing case's report: every row a demanded exact zero?
                check = P.check_dist_values if prop.name.startswith("dist_values") else P.check_values
                check(Subject(target), case)
            except J.ConformanceFailure as exc:
                rows = [r for r in str(exc).splitlines() if re.match(r"^\s+\[\d+\] ", r)]
                if not rows or any("demands 0 bit for bit" not in r for r in rows):
                    other.append(prop.name)
            except Exception:  # noqa: BLE001
                other.append(prop.name)
        if not rejected:
            print(f"{target}: passes every property ({len(props)})", flush=True)
            continue
        print(f"{target}: rejected by {rejected}; "
              f"{'every failing row a demanded exact zero' if not other else 'other failures in ' + str(other)}",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
