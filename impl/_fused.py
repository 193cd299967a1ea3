"""Optional fused fast path: Eq. 4, 7 and 6 in a few Triton kernels.

The plain torch path runs about 80 small kernels per call (every level of every
pairwise tree is one), so on a GPU a small call is bounded by kernel launches
and a large one by the many passes over memory. This path computes the same
thing in a few kernels: Eq. 4 and Eq. 7 in one (the rewards are read once, the
combined values c written once); Eq. 6 of a unit of up to WHOLE_UNIT rows in one
program, of a larger unit in seven (block min/max, the unit's scale, the block
sums of the differences, their tree and the mean, the block sums of the squared
deviations, their tree and std + eps, the output); the facts row in one more. It performs the plain path's operations in the plain path's order (see
``_fused_kernels``), so its results are the plain path's bits; the test suite
checks that on every input it draws (in Triton's interpreter without a GPU,
compiled on a GPU) and runs the conformance suite through it.

Opt-in, with the environment variable ``GDPO_FUSED``:

* unset or ``GDPO_FUSED=0``: off (the plain path);
* ``GDPO_FUSED=1``: calls on CUDA tensors take this path where it applies (below);
* ``GDPO_FUSED=interpret``: CPU tensors too, through Triton's interpreter (slow: for
  the tests of this path on machines without a GPU). Set before the first call.

Where it applies. This is the one list: ``impl.gdpo``'s docstring and
docs/performance.md point here, and tests/test_located_messages.py holds it to the
code. Every API, local or across ranks, with contiguous or labelled groups (labelled
ones in their padded layout), any number K of reward columns,
float64/float32/float16/bfloat16 rewards, any output dtype (narrow ones are rounded
from float64 by ``_segments.round_to``). Left on the plain path, with the same results:

* labelled groups so ragged that they take the bucketed layout (see ``_groups``);
* ``group_has_signal`` with labels;
* groups of more than 512 rows (``MAX_GROUP``);
* whitening units of more than 2**26 rows (``MAX_UNIT``);
* weights of 2**990 or more, or large enough for the Eq. 7 overflow check
  (``_segments.overflow_possible``: 2 sqrt(n_max) sum|w| >= 2**1023);
* calls with ``missing="unscored"`` (Eq. 4/7 over the scored rewards, Eq. 6 over the
  scored rows: ``_eq47._scored``).

Whenever the fused path fails (no Triton, no compiler), a warning says so once and
the plain path runs (``impl._pipeline.guard``: the call's stages again on the plain plan, the
same bits).
"""

from __future__ import annotations

import functools
import itertools
import os
import warnings

import torch

from impl import _problems as P
from impl import _segments as seg_ops
from impl._eq47 import overflow_possible, weight_plan

_F64 = torch.float64
_I64 = torch.int64

MAX_GROUP = 512
#: A unit's block sums are summed by one program: at most MAX_BLOCKS of them, of at
#: most 8192 rows each (the largest unit: MAX_UNIT rows).
MAX_BLOCKS = 1 << 13
MAX_UNIT = MAX_BLOCKS * 8192
#: Units up to this many rows are whitened by one program each (one launch).
WHOLE_UNIT = 8192
_REWARD_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)

#: Counters for benchmarks and tests: Eq. 4/7 computations ("calls") and Eq. 6
#: computations ("whiten") that took this path.
stats = {"calls": 0, "whiten": 0}

_STATE: dict = {}


class FusedFailure(Exception):
    """A failure of the fused path itself (Triton, its compiler, a kernel launch), raised by a
    stage of the fused backend with the original exception as its cause: ``impl._pipeline.guard``
    then turns the fused path off and runs the call's stages on the plain plan. Any other
    exception is the call's own and propagates (it is not retried on the plain path)."""


def _own_failures(fn):
    """A stage of the fused backend whose every failure is a :class:`FusedFailure`."""
    @functools.wraps(fn)
    def stage(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except FusedFailure:
            raise
        except Exception as exc:  # noqa: BLE001 - the fused path's own failure: named as such
            raise FusedFailure(f"{type(exc).__name__}: {exc}") from exc
    return stage


def mode() -> str:
    """'' (off), '1' (CUDA) or 'interpret' (CUDA and CPU, the latter interpreted)."""
    m = os.environ.get("GDPO_FUSED", "").strip().lower()
    if m not in ("", "0", "1", "interpret") and _STATE.get("warned_value") != m:
        _STATE["warned_value"] = m
        warnings.warn(f"GDPO_FUSED={m!r} is not one of 0, 1, interpret: the fused path is off",
                      RuntimeWarning, stacklevel=3)
    return m if m in ("1", "interpret") else ""


def disable(exc: BaseException) -> None:
    """Turn the fused path off for this process after a failure of its own (warned once)."""
    if _STATE.get("kernels") is not None:
        warnings.warn(f"the fused path failed ({type(exc).__name__}: {exc}) and is off for this process; "
                      "impl.gdpo uses the plain torch path", RuntimeWarning, stacklevel=3)
    _STATE["kernels"] = None


def _interpreter_ready() -> None:
    """Set TRITON_INTERPRET=1 for GDPO_FUSED=interpret, or say why it is too late:
    Triton decides at its own import whether its library functions (``tl.sum``, ...)
    are interpreted, so a Triton imported earlier (``torch._dynamo`` imports it, for
    one) would fail inside the first kernel with an error that names neither cause."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import sys

    if "triton.language" in sys.modules:
        tl = sys.modules["triton.language"]
        if type(getattr(tl, "sum", None)).__name__ == "JITFunction":
            raise RuntimeError("GDPO_FUSED=interpret needs TRITON_INTERPRET=1 in the environment before "
                               "anything imports triton (here it was imported first, perhaps by torch._dynamo)")


def kernels():
    """The kernel module, or None where Triton is not importable (warned once)."""
    if "kernels" not in _STATE:
        try:
            if mode() == "interpret":
                _interpreter_ready()
            from impl import _fused_kernels
            _STATE["kernels"] = _fused_kernels
            _STATE["interp"] = os.environ.get("TRITON_INTERPRET", "") not in ("", "0")
        except Exception as exc:  # noqa: BLE001 - no Triton, an old one, no compiler: the plain path
            _STATE["kernels"] = None
            warnings.warn(f"GDPO_FUSED is set but the fused path is unavailable ({type(exc).__name__}: {exc}); "
                          "impl.gdpo uses the plain torch path", RuntimeWarning, stacklevel=3)
    return _STATE["kernels"]


def on(device: torch.device) -> bool:
    m = mode()
    return bool(m) and (device.type == "cuda" or (m == "interpret" and device.type == "cpu"))


def padded_eligible(r: torch.Tensor, width: int, weights: list[float]) -> bool:
    """Can Eq. 4/7 of groups of up to ``width`` rows of the rewards ``r`` run fused?"""
    if not on(r.device) or width > MAX_GROUP or r.dtype not in _REWARD_DTYPES:
        return False
    if weight_plan(weights)[1] or overflow_possible(weights, width):
        return False
    return kernels() is not None


def eq47_eligible(inp) -> bool:
    """Can Eq. 4/7 of these validated rewards (contiguous groups) run fused?"""
    return (inp.labels is None and inp.n > 0 and inp.missing == "refuse"
            and padded_eligible(inp.rewards, inp.group_size, inp.weights))


def whiten_eligible(device: torch.device, sizes: list[int], direct) -> bool:
    """Can Eq. 6 of units of these sizes, written in ``direct`` (None: float64), run fused?"""
    if not on(device) or direct not in (None, torch.float32) or max(sizes, default=0) > MAX_UNIT:
        return False
    return kernels() is not None


def block_size(longest: int) -> int:
    """Rows per program of the whitening kernels (a power of two): at most
    MAX_BLOCKS blocks per unit. ``GDPO_FUSED_BLOCK`` overrides it (for the
    benchmarks' sweep and the tests; the results do not depend on it)."""
    want = os.environ.get("GDPO_FUSED_BLOCK", "")
    block = _pow2_at_least(int(want)) if want.isdigit() and int(want) >= 1 else 2048
    while -(-longest // block) > MAX_BLOCKS:
        block *= 2
    return block


# Launch shapes. Chosen from the register use ptxas reports for sm_90 (no GPU needed;
# tests/test_impl_fused_ptx.py keeps them free of spills): the pairwise trees spill at
# 1024 rows per program whatever the warp count, not at 2048 with 8 warps (42 registers
# for the block sums); Eq. 4/7 over 1024 rewards of a column per program took 250
# registers, over 256 about 60. Groups wider than 512 rows spill at every shape tried,
# so they take the plain path. Speed itself is for a GPU run to measure.

#: Padded group width -> (rewards of a column per program, num_warps): each the
#: spill-free shape with the fewest registers found by ptxas for sm_90 (56-138, compiled with the
#: argument types a launch passes: benchmarks/kernels.py).
_EQ47_SHAPES = {8: (256, 8), 16: (256, 8), 32: (256, 8), 64: (256, 8), 128: (128, 4), 256: (256, 2),
                512: (512, 2)}


def eq47_config(width: int) -> tuple[int, int, int]:
    """(GP, BG, num_warps) of the Eq. 4/7 kernel for groups of up to ``width`` rows."""
    gp = max(8, _pow2_at_least(width))  # few widths: one compiled kernel serves groups of 2..8, 9..16, ...
    tile, warps = _EQ47_SHAPES[gp]
    return gp, tile // gp, warps


def block_warps(block: int) -> int:
    """num_warps of the per-(unit, block) kernels."""
    return 8 if block <= 2048 else 16


def whole_config(longest: int) -> tuple[int, int]:
    """(BLOCK, num_warps) of the one-program-per-unit kernel (units up to WHOLE_UNIT rows)."""
    width = max(2048, _pow2_at_least(longest))
    return width, 8 if width <= 2048 else 16


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


_OPTS = {"enable_fp_fusion": False}  # no multiply-add contraction: the plain path's roundings


def _eq47_launch(r, source, groups: int, width: int, weights: list[float], eps: float):
    """c (N,) float64 and the per-program first non-finite flat index."""
    K = kernels()
    r = _exact_f64(r)
    n, k = r.shape
    device = r.device
    prm = seg_ops.constant((eps, *weights), _F64, device)
    gp, bg, warps = eq47_config(width)
    programs = -(-groups // bg)
    c = torch.empty(n, dtype=_F64, device=device)
    nf = torch.empty(programs, dtype=_I64, device=device)
    K.eq47_kernel[(programs,)](r, source if source is not None else nf, prm, c, nf, groups, width, k,
                               seg_ops.min_scale_bits(eps), int(not eps >= 2.0 ** -52), GP=gp,
                               LOG_GP=gp.bit_length() - 1, BG=bg, GATHER=source is not None,
                               INTERP=_STATE["interp"], **_OPTS, num_warps=warps)
    stats["calls"] += 1
    return c, nf, programs


def eq47_padded(r: torch.Tensor, source: torch.Tensor, groups: int, width: int, weights: list[float],
                eps: float) -> torch.Tensor:
    """Eq. 4 and Eq. 7 of labelled groups from the padded layout's ``source`` (slot ->
    input row, negative for padding): c (N,) float64 in input row order."""
    c, _, _ = _eq47_launch(r.contiguous(), source, groups, width, weights, eps)
    return c


def _exact_f64(x: torch.Tensor) -> torch.Tensor:
    """float16/bfloat16 input as float64 (torch's conversion, exact): Triton's
    loads of these formats were measured to flush subnormals to zero (the
    interpreter: bfloat16 2**-133 read as 0). float32 and float64 go in as they are."""
    return x if x.dtype in (torch.float32, _F64) else x.to(_F64)


class Units:
    """Whitening units over a (N,) tensor: consecutive rows of the given sizes; ``whole``
    marks the units made of whole groups (``_whiten.local_stats``: a host tuple, an (S,)
    bool tensor or None), centred on their structural mean 0."""

    def __init__(self, v: torch.Tensor, sizes: list[int], whole=None):
        v = _exact_f64(v)
        self.v, self.sizes = v, sizes
        device = v.device
        #: every unit whole, known on the host: the pass for the mean is skipped
        self.all_whole = isinstance(whole, tuple) and all(whole)
        if whole is None or isinstance(whole, tuple):
            self.whole_t = seg_ops.constant(tuple(int(bool(w)) for w in (whole or (0,) * len(sizes))),
                                            torch.int8, device)
        else:
            self.whole_t = whole.to(device=device, dtype=torch.int8)
        self.starts_t = seg_ops.constant((0, *itertools.accumulate(sizes[:-1])), _I64, device)
        self.sizes_t = seg_ops.constant(tuple(sizes), _I64, device)
        self.longest = max(sizes)
        self.block = block_size(self.longest)
        self.blocks = -(-self.longest // self.block)
        self.nbp = max(256, _pow2_at_least(self.blocks))  # few compiled widths (the tree of 256 sums is cheap)
        self.wide = {**_OPTS, "num_warps": block_warps(self.block)}  # per (unit, block)
        self.one = {**_OPTS, "num_warps": 8}  # per unit, over its block sums


def whiten(v: torch.Tensor, sizes: list[int], eps: float, direct, whole=None) -> torch.Tensor:
    """Eq. 6 of this process's units of v (no process group), in ``direct`` (None: float64)."""
    K = kernels()
    u = Units(v, sizes, whole)
    a = torch.empty(v.shape[0], dtype=direct or _F64, device=v.device)
    prm = seg_ops.constant((eps,), _F64, v.device)
    if u.longest <= WHOLE_UNIT and not os.environ.get("GDPO_FUSED_BLOCK"):
        whole, warps = whole_config(u.longest)
        K.unit_whole_kernel[(len(sizes),)](v, u.starts_t, u.sizes_t, u.whole_t, prm, a, seg_ops.min_scale_bits(eps),
                                           int(not eps >= 2.0 ** -52), BLOCK=whole, LOG_BLOCK=whole.bit_length() - 1,
                                           INTERP=_STATE["interp"], **_OPTS, num_warps=warps)
    else:
        _apply(u, _unit_stats(u, eps), a)
    stats["whiten"] += 1  # counted once its kernels launched: a failed compile is no fused call
    return a


def _unit_stats(u: Units, eps: float) -> torch.Tensor:
    """The (S, ST_COLS) statistics of each unit from this process's rows (flat)."""
    K = kernels()
    device = u.v.device
    units = len(u.sizes)
    tiny = not eps >= 2.0 ** -52
    interp = _STATE["interp"]
    prm = seg_ops.constant((eps,), _F64, device)
    lo = torch.empty(units * u.nbp, dtype=_F64, device=device)
    hi = torch.empty_like(lo)
    st = torch.empty(units * K.ST_COLS, dtype=_F64, device=device)
    grid = (units, u.blocks)
    log_block, log_nbp = u.block.bit_length() - 1, u.nbp.bit_length() - 1
    K.unit_minmax_kernel[grid](u.v, u.starts_t, u.sizes_t, lo, hi, NBP=u.nbp, BLOCK=u.block, **u.wide)
    K.unit_scale_kernel[(units,)](lo, hi, u.v, u.starts_t, u.sizes_t, u.whole_t, prm, st,
                                  seg_ops.min_scale_bits(eps), NBP=u.nbp, BLOCK=u.block, **u.one)
    part = lo  # the minima are no longer needed: the block sums go there
    for squares in ((True,) if u.all_whole else (False, True)):  # all whole: the mean is the structural 0
        K.unit_sum_kernel[grid](u.v, u.starts_t, u.sizes_t, st, part, NBP=u.nbp, BLOCK=u.block, LOG_BLOCK=log_block,
                                SQUARES=squares, **u.wide)
        K.unit_finish_kernel[(units,)](part, u.sizes_t, u.whole_t, st, NBP=u.nbp, LOG_NBP=log_nbp, BLOCK=u.block,
                                       SQUARES=squares, EPS_TINY=tiny, INTERP=interp, **u.one)
    return st


def _apply(u: Units, st: torch.Tensor, a: torch.Tensor) -> None:
    kernels().unit_apply_kernel[(len(u.sizes), u.blocks)](u.v, u.starts_t, u.sizes_t, st, a, BLOCK=u.block,
                                                          INTERP=_STATE["interp"], **u.wide)


class Local:
    """This rank's whitening statistics for the distributed protocol (what
    ``_whiten.Local`` offers it): the table to merge, then the application of
    the merged statistics by the fused apply kernel."""

    def __init__(self, v: torch.Tensor, sizes: list[int], eps: float, whole=None):
        self.v, self.units = v, Units(v, sizes, whole)
        self.eps = eps
        self._st = None

    @property
    def st(self) -> torch.Tensor:
        """The unit statistics, computed on first use (counted then)."""
        if self._st is None:
            self._st = _unit_stats(self.units, self.eps).view(len(self.units.sizes), kernels().ST_COLS)
            stats["whiten"] += 1
        return self._st

    @_own_failures
    def table(self, device) -> torch.Tensor:
        """(S, 7) float64: count, e, shift, mean_d, M2, min, max (empty units as in ``_whiten``)."""
        from impl._whiten import stats_table

        K, st = kernels(), self.st
        columns = (st[:, c] for c in (K.ST_SHIFT, K.ST_MEAN, K.ST_M2, K.ST_LO, K.ST_HI))
        return stats_table(self.units.sizes, st[:, K.ST_F].contiguous(), *columns, st.device).to(device)

    def apply(self, f: torch.Tensor, shift: torch.Tensor, mean: torch.Tensor, den: torch.Tensor,
              direct) -> torch.Tensor:
        """a = ((v * f - shift) - mean) / den per unit, from the merged statistics."""
        zero = torch.zeros_like(f)
        st = torch.stack([zero, zero, f, zero, shift, mean, den, zero], 1).contiguous()
        a = torch.empty(self.units.v.shape[0], dtype=direct or _F64, device=f.device)
        _apply(self.units, st, a)
        return a


# --- the fused backend (impl._pipeline.FUSED): the stages' plain signatures -----------------------
# A stage receives the call's plan (impl._pipeline.Plan) and reads its fields; its failures are
# FusedFailure, which impl._pipeline.guard alone catches, rerunning the stages on the plain plan.


def quiet(fn, plan):
    """``fn(plan)``; under Triton's interpreter with NumPy's warnings off (its masked-off lanes
    divide 0 by 0, results unused)."""
    if _STATE.get("interp"):
        import numpy as np

        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return fn(plan)
    return fn(plan)


@_own_failures
def eq47(plan, r: torch.Tensor, facts):
    """Eq. 4 and Eq. 7 in one kernel (the rewards read once): (c, varies), c (N,) float64
    in input order and, for group_has_signal (contiguous groups), ``varies``; the non-finite
    reward's facts put into ``facts``. Contiguous groups, or labelled ones in their one padded
    layout (the plan's)."""
    inp = plan.inp
    varies = None
    if plan.prep is None:  # contiguous groups: the facts kernel finds the first non-finite reward
        r = _exact_f64(inp.rewards.contiguous())
        c, nf, programs = _eq47_launch(r, None, inp.n // inp.group_size, inp.group_size, inp.weights, plan.eps)
        found = torch.empty(2, dtype=_I64, device=r.device)  # its flat index (0 if none), the bits there
        kernels().facts_kernel[(1,)](nf, programs, r, r.numel(), found, CHUNK=1024, **_OPTS)
        facts.update({P.NF_REWARD: found[0], P.NF_REWARD_KIND: found[1]})
        if plan.signal:
            g = inp.group_size
            cg = c.view(inp.n // g, g)
            varies = cg.amin(1) != cg.amax(1)
        return c, varies
    part = plan.layout.parts[0]
    r = r.contiguous()
    c = eq47_padded(r, part.source, part.count, plan.row[P.N_MAX], inp.weights, plan.eps)
    if plan.lazy and not bool(torch.isfinite(r).all()):  # lazy: CPU, where a read is free
        from impl._eq47 import rewards_nonfinite_facts

        facts.update(rewards_nonfinite_facts(inp, r))
    return c, varies


@_own_failures
def eq6_stats(plan, c: torch.Tensor, facts) -> "Local":
    """This process's Eq. 6 statistics of c (N,) (every row: the fused backend never runs under
    "unscored"), computed only when asked for (``Local.table``): a local call's apply runs the
    one-program whitening instead."""
    return Local(c.contiguous(), plan.sizes, plan.eps, plan.whole)


@_own_failures
def eq6_apply(plan, loc: "Local", merged, write) -> torch.Tensor:
    """Eq. 6 in ``write`` (None: float64): from this process's own statistics (``merged`` None:
    the whitening kernels, statistics and output in one pass over each unit) or from the merged
    statistics of every rank (the apply kernel)."""
    if merged is None:
        return whiten(loc.v, plan.sizes, plan.eps, write, plan.whole)
    from impl._whiten import global_terms

    return loc.apply(*global_terms(merged, plan.eps), write)
