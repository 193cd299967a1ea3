"""The facts row: what a call found on the device, in one shape, and its read to the host.

A finding that refuses the input is never raised where it is found: each stage leaves it as
a raw int64 0-d device tensor under its column of the facts row (``_problems``: ``NF_REWARD``,
``GROUPS``, ``C_OVERFLOW``, ...). Every stage, the fused kernels and the CUDA-graph replay
hand them over in that one shape, :data:`Facts`; the row is then read in one host read
(:func:`read_row`, a local call) or written into the agreement table (:func:`device_row`,
a distributed call), and ``_problems`` says which problem it shows first.
"""

from __future__ import annotations

import torch

from impl import _problems as P
from impl import _segments as seg_ops
from impl._segments import host_to_device

_F64 = torch.float64
_I64 = torch.int64

#: The facts of a call found on the device: {column of the facts row: 0-d device tensor}.
Facts = dict[int, torch.Tensor]


# --- finders: device-side, no branch, no host read ------------------------------------------


def first_nonfinite(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(index, float64 bits of the value there) of the first non-finite entry of
    a 1-D tensor; index 0 and a finite value when there is none. No branch."""
    at = torch.argmax(torch.ne(x - x, 0).view(torch.uint8))  # x - x is nan exactly for nan and +-inf
    return at, seg_ops.take(x, at).to(_F64).view(_I64)


def first_infinite(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`first_nonfinite` for ``missing="unscored"``, where a NaN is data: the first
    infinite entry of a 1-D tensor (index 0 and the bits of +0.0 when there is none)."""
    inf = torch.isinf(x)
    at = torch.argmax(inf.view(torch.uint8))
    return at, torch.where(seg_ops.take(inf, at), seg_ops.take(x, at).to(_F64), 0.0).view(_I64)


def value_facts(v: torch.Tensor) -> Facts:
    """Raw facts of Eq. 6 input (N,): the first non-finite value and its bits."""
    if v.shape[0] == 0:
        return {}
    at, bits = first_nonfinite(v)
    return {P.NF_VALUE: at, P.NF_VALUE_KIND: bits}


def rewards_nonfinite_facts(inp, r: torch.Tensor) -> Facts:
    """The first non-finite reward of ``r`` (N, K) (under ``missing="unscored"`` the first
    infinite one), its bits and, for labelled groups, its group's label."""
    at, bits = (first_infinite if inp.missing == "unscored" else first_nonfinite)(r.view(-1))
    facts = {P.NF_REWARD: at, P.NF_REWARD_KIND: bits}
    if inp.labels is not None:
        facts[P.NF_REWARD_GROUP] = seg_ops.take(inp.labels, torch.div(at, r.shape[1], rounding_mode="floor"))
    return facts


# --- host fields ------------------------------------------------------------------------------


def unit_of(sizes: list[int], at: int) -> int:
    """The unit holding row ``at`` (host, from the sizes)."""
    end = 0
    for j, s in enumerate(sizes):
        end += s
        if at < end:
            return j
    return max(len(sizes) - 1, 0)


# --- the row ----------------------------------------------------------------------------------


def read(t: torch.Tensor) -> list[int]:
    """A small device tensor on the host: on CUDA, a host synchronisation."""
    return t.tolist()


def stacked(facts: Facts) -> tuple[tuple[int, ...], torch.Tensor]:
    """The columns of ``facts`` in order and their values as one int64 (len,) device tensor
    (one kernel; no host read)."""
    cols = tuple(sorted(facts))
    return cols, torch.stack([facts[c].to(_I64).reshape(()) for c in cols])


def read_row(host, facts: Facts) -> list[int]:
    """The facts row of a local call: host fields as given (a dict, or a row read
    before), device fields read in one host read (none when there are none)."""
    if isinstance(host, list):
        row = list(host)
    else:
        row = [0] * P.ROW_WIDTH
        for col, v in host.items():
            row[col] = int(v)
    if facts:
        cols, values = stacked(facts)
        for col, v in zip(cols, read(values)):
            row[col] = v
    return row


def device_row(host: dict[int, int], facts: Facts, device) -> torch.Tensor:
    """This rank's row of the agreement table on ``device`` (no host read): host fields,
    then the device fields (``P.DEVICE_FIELDS``, 0 where ``facts`` has none)."""
    values = [0] * P.ROW_WIDTH
    for col, v in host.items():
        values[col] = int(v)
    row = host_to_device(values, _I64, device)
    if facts:
        zero = torch.zeros((), dtype=_I64, device=device)
        block = torch.stack([facts.get(c, zero).to(_I64).reshape(()) for c in P.DEVICE_FIELDS])
        row[P.DEVICE_FIELDS[0]: P.DEVICE_FIELDS[-1] + 1] = block
    return row


def settle(plan, facts: Facts) -> None:
    """The facts row of a local call read (the call's one host read: everything at once for
    contiguous groups and whiten; labelled groups read their row in the plan and again only
    where Eq. 4/7 found something), and its first problem raised."""
    if plan.row is not None:  # labelled groups: phase one's row was read (and refused) in the plan
        if facts:
            P.raise_local(read_row(plan.row, facts))
        return
    row = read_row(plan.host, facts)
    if plan.inp is None and P.row_problems(row):  # whiten: the unit of the first bad value
        row[P.NF_VALUE_UNIT] = unit_of(plan.sizes, row[P.NF_VALUE])
    P.raise_local(row)
