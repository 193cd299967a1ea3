"""Optional fused fast path: local ``gdpo_advantages`` calls in 8 Triton kernels.

The plain torch path runs about 80 small kernels per call (every level of every
pairwise tree is one), so on a GPU a small call is bounded by kernel launches
and a large one by the many passes over memory. This path computes the same
thing in 8 kernels: Eq. 4 and Eq. 7 in one (the rewards are read once, the
combined values c written once), then per whitening unit: block min/max, the
unit's scale, the block sums of the differences, their tree and the mean, the
block sums of the squared deviations, their tree and std + eps, and the
output. It performs the plain path's operations in the plain path's order (see
``_fused_kernels``), so its results are the plain path's bits; the test suite
checks that on every input it draws (in Triton's interpreter without a GPU,
compiled on a GPU) and runs the conformance suite through it.

Opt-in, with the environment variable ``GDPO_FUSED``:

* unset or ``0``: off (the plain path);
* ``1``: local calls on CUDA tensors take this path where it applies (below);
* ``interpret``: CPU tensors too, through Triton's interpreter (slow: for the
  tests of this path on machines without a GPU). Set before ``impl`` is imported.

Where it applies (anything else takes the plain path, with the same results):
local calls (no process group) with contiguous groups (``group_size`` up to
``MAX_GROUP``), any number K of reward columns, float64/float32/float16/
bfloat16 rewards, float64 or float32 output, unit sizes up to ``MAX_UNIT``,
weights below 2**990 and without the Eq. 7 overflow check (see
``_normalize.overflow_possible``). When ``GDPO_FUSED=1`` is set but Triton
cannot be imported, a warning says so once and the plain path runs.
"""

from __future__ import annotations

import math
import os
import warnings

import torch

from impl import _problems as P
from impl import _segments as seg_ops
from impl._normalize import overflow_possible, weight_plan

_F64 = torch.float64
_I64 = torch.int64

MAX_GROUP = 1024
#: A unit's block sums are summed by one program: at most MAX_BLOCKS of them, of at
#: most 8192 rows each (the largest unit: MAX_UNIT rows).
MAX_BLOCKS = 1 << 13
MAX_UNIT = MAX_BLOCKS * 8192
#: Units up to this many rows are whitened by one program each (one launch).
WHOLE_UNIT = 8192
_REWARD_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)

#: Counters for benchmarks and tests: calls that took this path.
stats = {"calls": 0}

_STATE: dict = {}


def mode() -> str:
    """'' (off), '1' (CUDA) or 'interpret' (CUDA and CPU, the latter interpreted)."""
    m = os.environ.get("GDPO_FUSED", "").strip().lower()
    return m if m in ("1", "interpret") else ""


def kernels():
    """The kernel module, or None where Triton is not importable (warned once)."""
    if "kernels" not in _STATE:
        try:
            if mode() == "interpret":
                os.environ.setdefault("TRITON_INTERPRET", "1")
            from impl import _fused_kernels
            _STATE["kernels"] = _fused_kernels
            _STATE["interp"] = os.environ.get("TRITON_INTERPRET", "") not in ("", "0")
        except Exception as exc:  # noqa: BLE001 - no Triton, an old one, no compiler: the plain path
            _STATE["kernels"] = None
            warnings.warn(f"GDPO_FUSED is set but the fused path is unavailable ({type(exc).__name__}: {exc}); "
                          "impl.gdpo uses the plain torch path", RuntimeWarning, stacklevel=3)
    return _STATE["kernels"]


def eligible(inp, sizes: list[int], direct) -> bool:
    """Does this validated local call take the fused path?"""
    m = mode()
    if not m:
        return False
    r = inp.rewards
    if r.device.type != "cuda" and not (m == "interpret" and r.device.type == "cpu"):
        return False
    if inp.labels is not None or inp.group_size > MAX_GROUP or r.dtype not in _REWARD_DTYPES:
        return False
    if direct not in (None, torch.float32) or max(sizes) > MAX_UNIT:
        return False
    if weight_plan(inp.weights)[1] or overflow_possible(inp.weights, inp.group_size):
        return False
    return kernels() is not None


def block_size(longest: int) -> int:
    """Rows per program of the whitening kernels (a power of two): at most
    MAX_BLOCKS blocks per unit. ``GDPO_FUSED_BLOCK`` overrides it (for the
    benchmarks' sweep; the results do not depend on it)."""
    want = os.environ.get("GDPO_FUSED_BLOCK", "")
    block = int(want) if want.isdigit() and int(want) >= 1 else (1024 if longest <= (1 << 21) else 2048)
    block = _pow2_at_least(block)
    while -(-longest // block) > MAX_BLOCKS:
        block *= 2
    return block


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def run(inp, sizes: list[int], eps: float, direct):
    """The device part of a fused call: (a, facts columns, facts values (int64 tensor)),
    as ``_pipeline._gdpo_device`` returns them; no host read."""
    K = kernels()
    interp = _STATE["interp"]
    r = inp.rewards.contiguous()
    n, k = r.shape
    g = inp.group_size
    groups = n // g
    device = r.device
    tiny = not eps >= 2.0 ** -52
    min_bits = seg_ops.min_scale_bits(eps)
    prm = seg_ops.constant((eps, *inp.weights), _F64, device)

    gp = max(8, _pow2_at_least(g))  # few widths: one compiled kernel serves groups of 2..8, 9..16, ...
    bg = max(1, 1024 // gp)  # about 1024 rewards of a column per program
    programs = -(-groups // bg)
    c = torch.empty(n, dtype=_F64, device=device)
    nf = torch.empty(programs, dtype=_I64, device=device)
    opts = {"enable_fp_fusion": False}  # no multiply-add contraction: the plain path's roundings
    K.eq47_kernel[(programs,)](r, prm, c, nf, groups, g, k, min_bits, int(tiny), GP=gp, LOG_GP=gp.bit_length() - 1,
                               BG=bg, INTERP=interp, **opts)

    units = len(sizes)
    longest = max(sizes)
    starts = [0]
    for s in sizes[:-1]:
        starts.append(starts[-1] + s)
    starts_t = seg_ops.constant(tuple(starts), _I64, device)
    sizes_t = seg_ops.constant(tuple(sizes), _I64, device)
    a = torch.empty(n, dtype=direct or _F64, device=device)
    if longest <= WHOLE_UNIT and not os.environ.get("GDPO_FUSED_BLOCK"):
        whole = max(256, _pow2_at_least(longest))  # few compiled widths
        K.unit_whole_kernel[(units,)](c, starts_t, sizes_t, prm, a, min_bits, int(tiny), BLOCK=whole,
                                      LOG_BLOCK=whole.bit_length() - 1, INTERP=interp,
                                      **opts, num_warps=4 if whole <= 2048 else 8)
    else:
        _whiten_blocks(K, c, a, starts_t, sizes_t, units, longest, prm, min_bits, tiny, interp, opts)
    facts = torch.empty(2, dtype=_I64, device=device)
    K.facts_kernel[(1,)](nf, programs, r, n * k, facts, CHUNK=1024, **opts)
    stats["calls"] += 1
    return a, (P.NF_REWARD, P.NF_REWARD_KIND), facts


def _whiten_blocks(K, c, a, starts_t, sizes_t, units, longest, prm, min_bits, tiny, interp, opts):
    """Eq. 6 of units of any size: seven kernels, per (unit, block) and per unit."""
    device = c.device
    block = block_size(longest)
    blocks = -(-longest // block)
    nbp = _pow2_at_least(blocks)
    lo = torch.empty(units * nbp, dtype=_F64, device=device)
    hi = torch.empty_like(lo)
    st = torch.empty(units * K.ST_COLS, dtype=_F64, device=device)
    grid = (units, blocks)
    log_block, log_nbp = block.bit_length() - 1, nbp.bit_length() - 1
    wide = {**opts, "num_warps": 4 if block <= 1024 else 8}  # per (unit, block)
    one = {**opts, "num_warps": 4 if nbp <= 1024 else 8}  # per unit, over its blocks
    K.unit_minmax_kernel[grid](c, starts_t, sizes_t, lo, hi, NBP=nbp, BLOCK=block, **wide)
    K.unit_scale_kernel[(units,)](lo, hi, c, starts_t, sizes_t, prm, st, min_bits, NBP=nbp, BLOCK=block, **one)
    part = lo  # the minima are no longer needed: the block sums go there
    for squares in (False, True):
        K.unit_sum_kernel[grid](c, starts_t, sizes_t, st, part, NBP=nbp, BLOCK=block, LOG_BLOCK=log_block,
                                SQUARES=squares, **wide)
        K.unit_finish_kernel[(units,)](part, sizes_t, st, NBP=nbp, LOG_NBP=log_nbp, BLOCK=block, SQUARES=squares,
                                       EPS_TINY=tiny, INTERP=interp, **one)
    K.unit_apply_kernel[grid](c, starts_t, sizes_t, st, a, BLOCK=block, INTERP=interp, **wide)
