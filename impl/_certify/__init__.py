"""The certificate (spec/gdpo.md section 7a): the driver of its tiers (:data:`TIERS`, the table
in docs/architecture.md), :class:`Counts` of the rows each decided, and the local call's stage.
The correctly rounded exact value is a function of the inputs alone: the same bits whatever the
layout (ranks, shards, device); across ranks the double-double statistics ride in the protocol's
second collective (``dd``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from impl._certify import tiers
from impl._certify.bounds import NARROW
from impl._problems import N_MAX

TIERS = (tiers.float64, tiers.group_exact, tiers.double_double, tiers.exact)
#: The output formats the certificate covers (float8 is rounded once, uncertified).
FORMATS = (torch.float64, *NARROW)
#: The output formats each mode certifies.
CERTIFIES = {"narrow": tuple(NARROW), "all": FORMATS, "off": ()}


def declared(mode: str):
    """What impl declares under ``mode`` (``gdpo_certified``): True, the narrow formats' names, or False."""
    return True if mode == "all" else False if mode == "off" else ("float32", "bfloat16", "float16")


class Counts(dict):
    """How many rows each tier decided, by the tier's name (and "uncertified"): ``counts["float64"]``,
    or ``counts.float64``."""

    NAMES = tuple(t.__name__ for t in TIERS) + ("uncertified",)

    def __init__(self):
        super().__init__((name, 0) for name in self.NAMES)

    def __getattr__(self, name: str) -> int:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclasses.dataclass
class Context:
    """What the tiers read of a local call: a few tensors, and what they derive (``memo``)."""

    a: torch.Tensor  # (N,) float64: the plain path's result
    c: torch.Tensor  # (N,) float64: the values Eq. 6 whitened (whiten: the values)
    out_dtype: torch.dtype
    eps: float
    sizes: list[int]  # the units of Eq. 6
    whole: np.ndarray  # (S,) bool: units of whole groups (their exact mean is 0)
    table: np.ndarray  # (S, 7) float64: Eq. 6's statistics of each unit (``impl._whiten.Local.table``)
    inp: object = None  # the validated rewards (``impl._inputs.Rewards``); None: whiten
    n_max: int = 0  # the longest group
    sort: tuple | None = None  # labelled groups: phase one's sort (perm, gid, pos), where at hand
    units: object = None  # per unit: the bounds (``bounds.Units``), once tier 0 made them
    memo: dict = dataclasses.field(default_factory=dict)


def certify(ctx: Context, y: torch.Tensor) -> tuple[torch.Tensor, Counts]:
    """The certified output of ``ctx`` from ``y``, its plain rounding (this call's own tensor, or
    float64: a itself), and the tiers' counts."""
    counts, left = Counts(), None
    n = ctx.a.shape[0]
    for tier in TIERS:
        if n == 0 or left is not None and left.numel() == 0:
            break
        before = n if left is None else left.numel()
        y, left = tier(ctx, y, left)
        counts[tier.__name__] += before - left.numel()
    counts["uncertified"] = 0 if left is None else left.numel()
    return y, counts


def stage(plan, dev, y: torch.Tensor) -> tuple[torch.Tensor, Counts]:
    """The certify stage of a local call: its output in ``plan.out_dtype`` from ``y`` (a rounded
    once), reading the device part's a, c and Eq. 6 statistics (recomputed from c, the same bits,
    where a CUDA graph kept none). On CUDA two device reads: these numbers, and tier 0's verdict."""
    c, inp = dev.c.to(torch.float64), plan.inp
    tp = getattr(dev.loc, "tp", None)  # the Eq. 6 statistics, in a view or padded layout
    if tp is not None:  # as impl._whiten.Local.table lays them out, but the count
        table = torch.cat([(1023 - (tp.f.view(torch.int64) >> 52)).to(torch.float64), tp.shift, tp.mean, tp.m2,
                           tp.lo.to(torch.float64), tp.hi.to(torch.float64)], 1)
    else:  # buckets, a CUDA graph's replay: the statistics again, the same bits
        from impl import _whiten  # (a stage this one reads; it never reads the certificate)
        table = _whiten.local_stats(c, plan.sizes, plan.eps, whole=plan.whole).table(c.device)[:, 1:]
    S, whole = len(plan.sizes), plan.whole  # one read from the device: the table, whole, magnitudes
    mags = c.device.type != "cpu" and inp is not None and inp.rewards.dtype in NARROW
    reads = [table.reshape(-1)]
    if isinstance(whole, torch.Tensor):
        reads.append(whole.reshape(-1).to(torch.float64))
    if mags:
        reads.append(tiers.magnitude_reads(inp.rewards))
    host = torch.cat(reads).cpu().numpy()
    table = np.column_stack([np.array(plan.sizes, dtype=np.float64), host[:6 * S].reshape(S, 6)])  # the count first
    whole = host[6 * S:7 * S] != 0 if isinstance(whole, torch.Tensor) else np.array(whole or [False] * S, dtype=bool)
    n_max = 0 if inp is None else inp.group_size if plan.row is None else int(plan.row[N_MAX])
    ctx = Context(dev.a, c, plan.out_dtype, plan.eps, plan.sizes, whole, table, inp, n_max, plan.sort)
    if mags:
        ctx.memo["magnitudes"] = host[-3:].tolist()
    return certify(ctx, y)
