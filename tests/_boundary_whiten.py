"""Hunted boundary cases of ``whiten`` (Eq. 6 alone), for impl.gdpo.whiten's certified rounding
(tests/test_certified_rounding.py): conformance/boundary.py's hunt, on given values."""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import zlib

import numpy as np

from conformance.boundary import (
    COUNT, TARGETS, TINY_EPS, _collect, _eps_grid, _hunt, _tie_group, _tie_midpoint, certified, offset_from,
)
from conformance.cases import Case, expected_whiten
from spec.error_model import FORMATS


WHITEN_FAMILIES = ("eps_bisect", "exact_tie", "tie_below")


def whiten_generate(family: str, fmt: str, seed: int) -> Case | None:
    """A hunted case of ``whiten`` (Eq. 6 alone on given float64 values, the case's first
    column, units by ``segment_sizes``), noted ``boundary_whiten:<family>:<target>:row<j>:<mid>``:
    ``eps_bisect`` (random values, eps bisected), ``exact_tie`` (values offset + integer deviations
    of std sigma, eps 0: the whitened value is d / sigma = M exactly), ``tie_below`` (the same at
    eps 5e-324); some with a second unit of random values. Verified against the oracle's
    ``whiten``."""
    rng = random.Random(zlib.crc32(f"whiten:{family}:{fmt}:{seed}".encode()))
    extra = [float(np.float32(rng.uniform(-5, 5))) for _ in range(rng.choice((0, 0, 3, 5)))]
    if family == "eps_bisect":
        vals = [float(np.float32(rng.uniform(-3, 3))) for _ in range(rng.randint(3, 12))]
        eps = None
    else:
        below_ = family == "tie_below"
        p = FORMATS[fmt][0]
        mid = _tie_midpoint(fmt, rng, below_, 0 if fmt == "float32" else -2)
        sigma = 1 << (p if fmt == "float32" else p + 2)
        a = int(mid * sigma)
        if a != mid * sigma:
            return None
        d = _tie_group(rng, a, sigma, rng.randint(1, 3))
        off = rng.choice((0.0, 0.0, 1e4))
        scale = -(p if fmt == "float32" else p + 2) if off else rng.choice((0, -(p if fmt == "float32" else p + 2)))
        vals = [off + math.ldexp(float(x), scale) for x in d]
        eps = TINY_EPS if below_ else 0.0
    n1 = len(vals)
    sizes = None if not extra else (n1, len(extra))
    values = vals + extra

    def build(e):
        return Case(rewards=tuple((v,) for v in values), dtype="float64", group_size=None, group_ids=None,
                    segment_sizes=sizes, eps=e, out_dtype=fmt)

    if family == "eps_bisect":
        row = rng.randrange(n1)
        got = _hunt(build, _eps_grid(rng, fmt), row, fmt, rng, stage="whiten")
        if got is None:
            return None
        case, mid = got
    else:
        row = rng.choice((0, 1))  # +M or -M
        mid = mid if row == 0 else -mid
        case = build(eps)
    case = dataclasses.replace(case, note=f"boundary_whiten:{family}:{fmt}:row{row}:{float(mid).hex()}")
    exp = expected_whiten(np.array(values), sizes, case.eps)
    if exp.error is not None or certified(case, row, fmt, "whiten") != float(exp.result.rounded(fmt)[row]):
        return None
    d, _ = offset_from(case, row, mid, stage="whiten")
    return case if abs(d) <= 2 * math.ulp(mid) else None


@functools.lru_cache(maxsize=None)
def whiten_cases(family: str, count: int = COUNT, seed: int = 0) -> tuple:
    """``count`` verified whiten cases of ``family`` per target format, deterministic."""
    return _collect(whiten_generate, family, TARGETS, count, seed)
