"""A verl-style GDPO advantage estimator, written for the tests (not imported by the package).

It follows the ``verl`` preset of spec/conventions.py the way verl's outcome-advantage
estimators are organised (per-prompt statistics over a ``uid`` index, then
``masked_whiten`` over the response tokens), in float64 with one final cast:

* the score of a response per reward key is the sum of its response tokens' rewards;
* Eq. 4 per ``uid`` group and key: (s - mean) / (std + 1e-6), unbiased std; a group of
  one sample has mean 0 and std 1 (verl's rule), so z = s / (1 + 1e-6); a NaN score
  propagates;
* Eq. 7: c = sum_k w_k z_k (weights by key name, ones when None), as GDPO combines;
* Eq. 6 token-weighted: every response token carries its sample's c, and the whitening
  statistics run over the response tokens of the batch (mean, unbiased variance over
  T tokens), a = (c - mean) * rsqrt(var + 1e-8), 0 on padding tokens.

Three float64 habits keep it within the error model of a correct implementation:
deviations are taken after subtracting the first member (shift invariance, so a
constant column or unit gives exact zeros); weights beyond 2^990 are scaled down by a
power of two, so that w_k z_k cannot overflow; and Eq. 6 runs with c scaled by the power
of two of its largest magnitude (eps by its square), so that no square overflows or
underflows, a frame raised where eps measured in it would pass 2^960 (c below about
2^-493 with eps 1e-8: eps then dwarfs every square, and squares that underflow there
cannot matter).

``gdpo_advantages`` is the faithful one; the other two are the same code with one flaw
each (negative controls of the per-token grading, tests/test_call_shapes.py). Run the
suite on it from the repository root with ``PYTHONPATH=tests``::

    python3 -m pytest --impl verl_mirror:gdpo_advantages --convention verl --call-shape verl conformance/
"""

from __future__ import annotations

import math

import torch

from spec.errors import NonFiniteError, OutOfRangeError, WeightError

GROUP_EPS = 1e-6  # spec/conventions.py, preset "verl": group_eps, added to the std
WHITEN_EPS = 1e-8  # whiten_eps, added to the variance (rsqrt(var + eps))


def _shifted_stats(x: torch.Tensor, weights: torch.Tensor, ddof: int):
    """Weighted mean and variance of x (n, ...) along dim 0, shift-invariant: deviations
    from the first member first. Returns (deviations from the mean, variance)."""
    d = x - x[:1]
    total = weights.sum()
    shape = (-1,) + (1,) * (x.dim() - 1)
    w = weights.reshape(shape)
    mean = (w * d).sum(0) / total
    dev = d - mean
    var = (w * dev * dev).sum(0) / (total - ddof)
    return dev, var


def _advantages(token_level_rewards, response_mask, index, weights=None, *, token_weighted=True, ddof=1,
                group_eps=GROUP_EPS, whiten_eps=WHITEN_EPS, out_dtype=torch.float32):
    keys = list(token_level_rewards)
    mask = response_mask.to(torch.float64)
    scores = torch.stack([(token_level_rewards[k].to(torch.float64) * mask).sum(-1) for k in keys], dim=1)
    b, _ = scores.shape
    w = [1.0 if weights is None else float(weights[k]) for k in keys]
    # the refusals every convention shares (spec/errors.py); NaN scores propagate (verl)
    if not all(math.isfinite(x) for x in w) or not any(x != 0.0 for x in w):
        raise WeightError(f"weights {w}: every weight finite, not all zero")
    if torch.isinf(scores).any():
        raise NonFiniteError("an infinite reward")
    # the weights' frame: weights beyond 2^990 scaled down by a power of two (exact), so that
    # w_k z_k cannot overflow; smaller ones as they are (scaling them down could underflow)
    e = max(0, math.frexp(max(abs(x) for x in w))[1] - 990)
    w = torch.tensor([math.ldexp(x, -e) for x in w], dtype=torch.float64)
    # Eq. 4 per uid group and reward key
    rows: dict = {}
    for i, label in enumerate(list(index)):
        rows.setdefault(label, []).append(i)
    z = torch.zeros_like(scores)
    for members in rows.values():
        at = torch.tensor(members)
        x = scores[at]
        if len(members) == 1:  # verl: mean 0, std 1 for a prompt with one response
            z[at] = x / (1.0 + group_eps)
            continue
        dev, var = _shifted_stats(x, torch.ones(len(members), dtype=torch.float64), ddof)
        z[at] = dev / (var.sqrt() + group_eps)
    c = (z * w).sum(dim=1)  # Eq. 7, in the weights' frame
    if torch.isinf(c).any():
        raise OutOfRangeError("Eq. 7 beyond float64 even in the weights' frame")
    # Eq. 6 in the frame of the largest c (its squares cannot overflow); eps follows as 2^-2f
    top = float(c.abs().max())
    f = math.frexp(top)[1] if top > 0 else 0
    if whiten_eps > 0:  # raised so that eps 2^-2(e+f) stays below 2^960 (eps < 2^x: e + f >= (x - 960) / 2)
        f = max(f, -((960 - math.frexp(whiten_eps)[1]) // 2) - e)
    for part in (-(f // 2), -(f - f // 2)):  # two steps: 2^-f alone may be beyond float64
        c = c * math.ldexp(1.0, part)
    eps_frame = math.ldexp(whiten_eps, -2 * (e + f))  # below 2^960; 0 where eps is negligible beside c^2
    if token_weighted:  # Eq. 6 over the response tokens, each carrying its sample's c (masked_whiten)
        tok = mask.bool()
        dev, var = _shifted_stats(c[:, None].expand(mask.shape)[tok], torch.ones(int(tok.sum()),
                                                                                  dtype=torch.float64), 1)
        a = torch.zeros_like(mask)
        a[tok] = _scale(dev, var, eps_frame)
        return _cast(a, out_dtype)
    dev, var = _shifted_stats(c, torch.ones(b, dtype=torch.float64), 1)  # one weight per sample
    return _cast(_scale(dev, var, eps_frame)[:, None] * mask, out_dtype)


def _scale(dev: torch.Tensor, var: torch.Tensor, eps: float) -> torch.Tensor:
    """dev * rsqrt(var + eps); a zero deviation stays 0 (a collapsed unit, eps underflowed in the frame)."""
    return torch.where(dev == 0, torch.zeros_like(dev), dev * torch.rsqrt(var + eps))


def _cast(a: torch.Tensor, out_dtype=torch.float32) -> torch.Tensor:
    """The one final cast (verl's float32; float64 for the tests that grade the float64 result)."""
    out = a.to(out_dtype)
    if torch.isinf(out).any():
        raise OutOfRangeError(f"an advantage beyond {out_dtype}")
    return out


def gdpo_advantages(token_level_rewards, response_mask, index, weights=None):
    """verl-shaped GDPO under the ``verl`` convention: (B, T) float32 advantages."""
    return _advantages(token_level_rewards, response_mask, index, weights)


def per_sample_whitening(token_level_rewards, response_mask, index, weights=None):
    """Flaw: Eq. 6 weights every sample by 1, not by its token count."""
    return _advantages(token_level_rewards, response_mask, index, weights, token_weighted=False)


def biased_group_std(token_level_rewards, response_mask, index, weights=None):
    """Flaw: Eq. 4 with the biased (divide by n) group variance."""
    return _advantages(token_level_rewards, response_mask, index, weights, ddof=0)
