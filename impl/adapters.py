"""Drop-in call shapes of the frameworks users already run, pure tensors in and out.

Each adapter translates a framework's arguments into one call of
:func:`impl.gdpo.gdpo_advantages`, so every number comes from the same vetted code
path (float64 inside, exact collapse, segmented whitening across ranks). None of
them imports the framework it imitates.

* :func:`trl_advantages`: TRL's ``normalize_then_sum`` shape.

  >>> import torch
  >>> from impl.adapters import trl_advantages
  >>> r = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
  >>> trl_advantages(r, num_generations=2, reward_weights=[1.0, 1.0]).tolist()  # doctest: +ELLIPSIS
  [0.547680..., -0.547680..., 1.095360..., -1.095360...]

  TRL turns a NaN reward (an unscorable completion) into a zero advantage; this
  specification refuses it (``NonFiniteError`` naming row and column) instead of
  training on a made-up number. Drop or re-score such completions first.

* :func:`verl_advantages`: verl's shape: token-level rewards per key, a response
  mask, and ``index`` labels for the prompt groups. The score of a response is the
  sum of its token-level rewards (as verl's outcome rewards are placed on the last
  token); Eq. 6 is **per sample** here, whereas verl's ``masked_whiten`` weights each
  sample by its token count. The result is broadcast over the response tokens.

  >>> from impl.adapters import verl_advantages
  >>> mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]])
  >>> acc = torch.zeros(4, 3); acc[[0, 2], [1, 0]] = 1.0
  >>> adv = verl_advantages({"acc": acc}, mask, index=["p0", "p0", "p1", "p1"])
  >>> adv.shape, bool((adv[mask == 0] == 0).all())
  (torch.Size([4, 3]), True)

* :func:`labelled_advantages`: rewards per component as a mapping of name to (N,)
  tensors, and one label per sample (any hashable labels, ragged groups).
"""

from __future__ import annotations

from typing import Hashable, Mapping, Sequence

import torch

from impl.gdpo import InputDtypeError, ShapeError, WeightError, gdpo_advantages
from spec.constants import DEFAULT_EPS


def trl_advantages(rewards_per_func: torch.Tensor, num_generations: int, reward_weights=None, *,
                   segment_sizes=None, process_group=None, eps: float = DEFAULT_EPS,
                   out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """TRL's shape: (N, K) rewards, contiguous groups of ``num_generations``, weights (K,)."""
    return gdpo_advantages(rewards_per_func, group_size=num_generations, weights=reward_weights,
                           segment_sizes=segment_sizes, process_group=process_group, eps=eps, out_dtype=out_dtype)


def _labels_to_ids(labels: Sequence[Hashable] | torch.Tensor, n: int, device) -> torch.Tensor:
    if isinstance(labels, torch.Tensor) and not labels.is_floating_point() and labels.dtype != torch.bool:
        return labels
    labels = list(labels)
    if len(labels) != n:
        raise ShapeError(f"index has {len(labels)} labels for {n} samples")
    ids: dict = {}
    return torch.tensor([ids.setdefault(x, len(ids)) for x in labels], dtype=torch.int64, device=device)


def _weights_in_order(weights, names: list[str]):
    """Weights by name, in the order of the reward columns; a missing name is an error, never 0."""
    if weights is None:
        return None
    if not isinstance(weights, Mapping):
        return list(weights)
    missing = [k for k in names if k not in weights]
    extra = [k for k in weights if k not in names]
    if missing or extra:
        raise WeightError(f"weights name {sorted(weights)} but the reward keys are {names}"
                          f" (missing {missing}, unknown {extra})")
    return [weights[k] for k in names]


def verl_advantages(token_level_rewards: Mapping[str, torch.Tensor], response_mask: torch.Tensor,
                    index: Sequence[Hashable] | torch.Tensor, weights: Mapping[str, float] | None = None, *,
                    segment_sizes=None, process_group=None, eps: float = DEFAULT_EPS,
                    out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """verl's shape: {key: (B, T) token-level rewards}, (B, T) mask, (B,) group labels -> (B, T)."""
    if not token_level_rewards:
        raise ShapeError("token_level_rewards is empty: GDPO needs at least one reward key")
    keys = list(token_level_rewards)
    mask = response_mask.to(torch.bool)
    cols = []
    for key in keys:
        t = token_level_rewards[key]
        if t.shape != mask.shape:
            raise ShapeError(f"token_level_rewards[{key!r}] has shape {tuple(t.shape)}, "
                             f"response_mask {tuple(mask.shape)}")
        if not t.is_floating_point():
            raise InputDtypeError(f"token_level_rewards[{key!r}] has dtype {t.dtype}; rewards must be floating")
        cols.append((t.to(torch.float64) * mask).sum(dim=-1))
    scores = torch.stack(cols, dim=1)
    w = _weights_in_order(weights, keys)
    ids = _labels_to_ids(index, scores.shape[0], scores.device)
    a = gdpo_advantages(scores, group_ids=ids, weights=w, segment_sizes=segment_sizes,
                        process_group=process_group, eps=eps, out_dtype=out_dtype)
    return a.unsqueeze(-1) * mask.to(a.dtype)


def labelled_advantages(rewards: Mapping[str, torch.Tensor], labels: Sequence[Hashable] | torch.Tensor,
                        weights: Mapping[str, float] | None = None, *, segment_sizes=None, process_group=None,
                        eps: float = DEFAULT_EPS, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """{name: (N,) rewards}, one label per sample -> (N,) advantages (columns in mapping order)."""
    if not rewards:
        raise ShapeError("rewards is empty: GDPO needs at least one reward component")
    names = list(rewards)
    lengths = {k: tuple(v.shape) for k, v in rewards.items()}
    if len(set(lengths.values())) != 1 or len(next(iter(lengths.values()))) != 1:
        raise ShapeError(f"every reward component must be a (N,) tensor of one length; got {lengths}")
    r = torch.stack([rewards[k] for k in names], dim=1)
    w = _weights_in_order(weights, names)
    ids = _labels_to_ids(labels, r.shape[0], r.device)
    return gdpo_advantages(r, group_ids=ids, weights=w, segment_sizes=segment_sizes,
                           process_group=process_group, eps=eps, out_dtype=out_dtype)
