"""The implementations the known-limit tables run, and how one output is graded.

Each of :data:`IMPLEMENTATIONS` takes (rewards (N, K) float64, group labels, unit labels or
None, weights or None, token counts or None) and returns its outputs as float64, or raises.
:func:`grade` compares with the oracle under a named convention, in units of the error model's
bound at the implementation's working precision, and classifies what came out.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from gdpo_tools.peer_formulas import formula, trl_normalize_then_sum
from spec.constants import FLOAT32_UNIT_ROUNDOFF
from spec.conventions import get_convention
from spec.errors import GDPOError
import torch
from impl.gdpo import gdpo_advantages
from oracle import gdpo as og


def _tokens(conv, n: int, token_counts):
    """The token counts a convention whitens by: verl's per-token Eq. 6 (one token a sample
    unless given); None for the others."""
    if conv.whiten != "per_token":
        return None
    return np.ones(n, np.int64) if token_counts is None else np.asarray(token_counts, np.int64)


def _formula(convention, one_pass=False):
    """The convention's formula as its code computes it, in its own dtype."""
    conv = get_convention(convention)

    def run(rewards, group_ids, unit_ids=None, weights=None, token_counts=None):
        with np.errstate(all="ignore"):
            return formula(conv, rewards, np.asarray(group_ids), unit_ids=unit_ids, weights=weights,
                           token_counts=_tokens(conv, len(group_ids), token_counts), dtype=conv.native_dtype,
                           one_pass=one_pass)
    return run


def _impl(out_dtype: str):
    """impl.gdpo on one whitening unit (the tables run impl on no other)."""
    def run(rewards, group_ids, unit_ids=None, weights=None, token_counts=None):
        t = torch.from_numpy(np.ascontiguousarray(np.asarray(rewards, dtype=np.float64)))
        out = gdpo_advantages(t, group_ids=[int(x) for x in group_ids], weights=weights,
                              out_dtype=getattr(torch, out_dtype))
        return out.to(torch.float64).numpy()
    return run


def _trl_torch(rewards, group_ids, unit_ids=None, weights=None, token_counts=None):
    """TRL's eager torch code on one unit of contiguous groups of one size (the tables' only cases)."""
    n = int(np.sum(np.asarray(group_ids) == group_ids[0]))
    r = torch.from_numpy(np.ascontiguousarray(np.asarray(rewards, dtype=np.float64)))
    k = r.shape[1]
    w = torch.ones(k) if weights is None else torch.tensor(list(weights), dtype=torch.float64).to(torch.float32)
    return trl_normalize_then_sum(r, n, w).to(torch.float64).numpy()


@dataclasses.dataclass(frozen=True)
class Implementation:
    name: str
    title: str
    convention: str  # the convention it means to compute (graded "under its own convention")
    out_dtype: str  # dtype of its outputs (half an ulp of it is allowed)
    run: Callable

    @property
    def unit_roundoff(self) -> float:
        """Of its working precision: its convention's (spec/conventions.py), for the error bound."""
        return get_convention(self.convention).unit_roundoff

    @property
    def float32_inputs(self) -> bool:
        """Does it see its rewards as float32 (a float32 peer)?"""
        return get_convention(self.convention).native_dtype == "float32"


IMPLEMENTATIONS: dict[str, Implementation] = {
    i.name: i
    for i in (
        Implementation("impl", "impl.gdpo (this project)", "spec", "float32", _impl("float32")),
        Implementation("impl64", "impl.gdpo (this project), out_dtype float64", "spec", "float64", _impl("float64")),
        Implementation("naive_f64", "naive float64 (mean, then deviations)", "spec", "float64", _formula("spec")),
        Implementation("trl", "TRL mirror (float32)", "trl", "float32", _formula("trl")),
        Implementation("trl_torch", "TRL eager torch mirror (float32)", "trl", "float32", _trl_torch),
        Implementation("verl", "verl mirror (float32)", "verl", "float32", _formula("verl")),
        Implementation("nemo_rl", "NeMo-RL mirror (float32, one-pass variance)", "nemo_rl", "float32",
                       _formula("nemo_rl", one_pass=True)),
        Implementation("nvlabs", "NVlabs reference mirror (float32)", "nvlabs", "float32", _formula("nvlabs")),
        Implementation("ms_swift", "ms-swift mirror (float32)", "ms_swift", "float32", _formula("ms_swift")),
        Implementation("multireward_grpo", "multireward-grpo mirror (float64)", "multireward_grpo", "float64",
                       _formula("multireward_grpo")),
    )
}

#: The float32 peers (what users of the frameworks run).
FLOAT32_PEERS = ("trl", "verl", "nemo_rl", "nvlabs", "ms_swift")

#: One implementation per convention preset, for the peer table.
PEER_TABLE = ("impl64", "trl", "verl", "nemo_rl", "nvlabs", "ms_swift", "multireward_grpo")


def as_seen_by(impl: Implementation, rewards: np.ndarray) -> np.ndarray:
    """The rewards as ``impl`` holds them (float32 peers round them once)."""
    r = np.asarray(rewards, dtype=np.float64)
    if not impl.float32_inputs:
        return r
    with np.errstate(over="ignore"):
        return r.astype(np.float32).astype(np.float64)


def run(impl: Implementation, rewards, group_ids, unit_ids=None, weights=None, token_counts=None):
    """The implementation's outputs, or the exception it raised (returned, not raised)."""
    try:
        with np.errstate(all="ignore"):
            out = impl.run(rewards, group_ids, unit_ids, weights, token_counts)
        return np.asarray(out, dtype=np.float64)
    except (GDPOError, ValueError, ArithmeticError) as e:
        return e


def oracle(rewards, group_ids, weights=None, token_counts=None, convention="spec", eps=None):
    """The oracle's Result (one whitening unit), or the contract error it raises (returned)."""
    conv = get_convention(convention)
    try:
        with np.errstate(all="ignore"):  # bounds beyond float64 are inf by design
            return og.gdpo_advantages(np.asarray(rewards, dtype=np.float64), np.asarray(group_ids, dtype=np.int64),
                                      weights=None if weights is None else list(weights), eps=eps, convention=conv,
                                      token_counts=_tokens(conv, len(group_ids), token_counts))
    except GDPOError as e:
        return e
    except ArithmeticError as e:  # the oracle itself failed: say so in the table, never guess
        return OracleFailure(f"{type(e).__name__}: {e}")


class OracleFailure(Exception):
    """The oracle could not compute the case (a defect to report, not a verdict on the implementation)."""


@dataclasses.dataclass
class Grade:
    outcome: str  # correct, off, silent zero, NaN, inf, clear error, no error or n/a
    ratio: float  # worst |error| / bound over outputs with a positive bound (0 when none)
    error: float  # worst |error| over finite outputs (nan when none)
    missed_zero: float  # largest |output| where the exact zero is demanded (0: none missed)
    detail: str = ""


def grade(out, res, impl: Implementation) -> Grade:
    """``out`` (array or exception) against ``res`` (oracle Result or exception).

    A *silent zero* is an exact zero output where the exact value is not zero and
    the bound does not cover it, or a whole case (one unit) of zeros whose exact values are
    not all zero and reach float32 resolution of a unit-scale advantage (2^-24):
    what a user sees as "no signal" where the mathematics has one.
    """
    if isinstance(res, OracleFailure):
        return Grade("n/a", 0.0, float("nan"), 0.0, f"oracle failed: {res}")
    if isinstance(out, Exception):
        return Grade("clear error", 0.0, float("nan"), 0.0, type(out).__name__)
    if isinstance(res, Exception):
        o = np.asarray(out)
        tag = "NaN" if np.isnan(o).any() else "inf" if np.isinf(o).any() else "finite"
        return Grade("no error", 0.0, float("nan"), 0.0, f"{tag} outputs where the oracle raises "
                                                         f"{type(res).__name__}")
    obs = np.asarray(out, dtype=np.float64)
    exact = res.float64
    with np.errstate(all="ignore"):
        # a bound the error model cannot evaluate (NaN) is taken as 0: strict, never vacuous
        allowed = np.nan_to_num(res.allowed(impl.out_dtype, impl.unit_roundoff), nan=0.0)
        exact_nan = np.isnan(exact)
        nan_bad = np.isnan(obs) & ~exact_nan
        nan_missing = exact_nan & ~np.isnan(obs)
        live = ~exact_nan & np.isfinite(obs)
        err = np.where(live, np.abs(obs - exact), 0.0)
        demanded = live & (allowed == 0.0) & (exact == 0.0)
        missed = np.where(demanded & (obs != 0.0), np.abs(obs), 0.0)
        bounded = live & (allowed > 0.0)
        ratios = np.where(bounded, err / np.where(bounded, allowed, 1.0), 0.0)
        outside = (bounded & (err > allowed)) | (missed > 0.0)
        zeroed = live & (obs == 0.0) & (exact != 0.0) & outside
        if live.any() and np.all(obs[live] == 0.0) and np.max(np.abs(exact[live])) > FLOAT32_UNIT_ROUNDOFF:
            zeroed |= live & (exact != 0.0)
    ratio = float(ratios.max()) if ratios.size else 0.0
    error = float(err[live].max()) if live.any() else float("nan")
    miss = float(missed.max()) if missed.size else 0.0
    detail = "NaN propagated" if exact_nan.any() and not nan_missing.any() and not nan_bad.any() else ""
    outcome = next(name for name, seen in (("NaN", nan_bad.any()), ("inf", np.isinf(obs).any()),
                                            ("silent zero", zeroed.any()), ("off", outside.any() or nan_missing.any()),
                                            ("correct", True)) if seen)
    return Grade(outcome, ratio, error, miss, detail)
