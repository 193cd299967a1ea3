"""Eq. 7 (the weighted combination of the standardized rewards), after Eq. 4.

``eq7`` takes Eq. 4's z in its layout (``_eq4.Z``: the float64 ``(K, P, G)``
parts and the layout that brings a slot back to its row), combines each part
where it lies, and only then brings c (and, if asked, each group's
``group_has_signal``) back to input order: Eq. 7 is elementwise, so where it
runs cannot change a bit, and combining first moves one column instead of K.

Findings are raw facts for the facts row (see ``_problems``): c overflowing on
the way from finite z (weights beyond ~2**1000), never raised here.
"""

from __future__ import annotations

import torch

from impl import _problems as P
from impl import _segments as seg_ops
from impl._facts import first_nonfinite
from impl._stats import overflow_possible, weight_plan

_F64 = torch.float64


def stage(plan, z, facts):
    """The Eq. 7 stage (``impl._plan.PLAIN``): c (N,) and ``varies`` (group_has_signal; else
    None) of :func:`eq7`, its overflow facts put into ``facts``."""
    inp = plan.inp
    c, varies, found = eq7(z, inp.weights, signal=plan.signal, labels=inp.labels)
    facts.update(found)
    return c, varies


def eq7(z, weights: list[float], *, signal: bool = False, labels: torch.Tensor | None = None):
    """c (N,) float64 in input order, ``varies`` (G,) bool by first appearance (``signal``;
    else None) and the overflow facts, from Eq. 4's ``z`` (consumed: combined in place)."""
    cs = [combine(part, weights) for part in z.parts]  # (P, G) each; padding repeats the first member's c
    varies = z.layout.groups([part.amin(0) != part.amax(0) for part in cs]) if signal else None
    c = z.layout.rows(cs)
    facts: dict[int, torch.Tensor] = {}
    if overflow_possible(weights, z.longest):
        facts = overflow_facts(c, labels)
    return c, varies, facts


def overflow_facts(c: torch.Tensor, labels: torch.Tensor | None = None) -> dict[int, torch.Tensor]:
    """Where c (input order) overflowed from finite z: its first non-finite row, the bits
    there and, for labelled groups, that row's label."""
    at, bits = first_nonfinite(c)
    facts = {P.C_OVERFLOW: at, P.C_OVERFLOW_BITS: bits}
    if labels is not None:
        facts[P.C_OVERFLOW_GROUP] = seg_ops.take(labels, at)
    return facts


def combine(z: torch.Tensor, weights: list[float]) -> torch.Tensor:
    """Eq. 7 on z (K, ...): c = sum_k w_k z_k, products rounded one by one and
    summed left to right (no fused multiply-add, no BLAS), so equal weights on z
    and -z cancel to exactly 0 and the result is the same on every device.

    With a weight above 2**990 a product may overflow on the way to a finite c
    (huge terms that cancel); there the sum is also formed with every weight
    scaled by 2**-shift and scaled back, and taken where the plain sum is not
    finite. Only there: scaling the small weights too would push their products
    deeper into the subnormals (found by the deep conformance profile: weights
    2**-1023 and 2**1000, the latter on a collapsed column, lost 11 bits)."""
    scaled, shift = weight_plan(weights)
    if shift:
        plain = _weighted_sum(z, weights, in_place=False)
        rescued = seg_ops.ldexp_scalar(_weighted_sum(z, scaled, in_place=True), shift)
        return torch.where(torch.isfinite(plain), plain, rescued)
    return _weighted_sum(z, weights, in_place=True)


def _weighted_sum(z: torch.Tensor, weights: list[float], *, in_place: bool) -> torch.Tensor:
    k = z.shape[0]
    if any(w != 1.0 for w in weights):
        w = seg_ops.constant(tuple(weights), _F64, z.device).view((k,) + (1,) * (z.dim() - 1))
        z = z.mul_(w) if in_place else z * w
    if k == 1:
        return z[0] if in_place else z[0].clone()
    c = torch.add(z[0], z[1])
    for j in range(2, k):
        c.add_(z[j])
    return c
