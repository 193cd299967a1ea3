"""The published GDPO implementations, called unchanged, in the grader's call shapes.

Each adapter imports the installed peer (an optional heavy dependency, so inside the adapter),
calls its real entry point once and only moves arrays in and out: the numbers are the peer's own.
Its provenance is its preset's (``spec.conventions``: ``package``, ``version``, ``entry_point``);
it declares the convention its peer computes (``gdpo_convention``) and, where it narrows the call
shape, its domain (``gdpo_domain``). What a peer cannot express (ragged groups for a (P, m, R) API,
several ranks) is refused with :class:`PeerCannotExpress`, never approximated.
``spec/generated/peers.md`` (``gdpo peers``) is what grading them gives.
"""

from __future__ import annotations

import numpy as np
import torch

from impl._segments import round_to


class PeerCannotExpress(ValueError):
    """The peer's API has no way to take this call (not a refusal by the peer itself)."""


def _group_blocks(peer: str, n: int, group_ids, group_size):
    """The samples of each group as (P, m) index arrays, one per distinct group size (in order of
    first appearance), for a (P, m, ...) API without Eq. 6 (independent groups)."""
    if (group_ids is None) == (group_size is None):
        raise PeerCannotExpress(f"{peer}: pass exactly one of group_ids and group_size")
    if group_size is not None:
        m = int(group_size)
        if m < 1 or n % m:
            raise PeerCannotExpress(f"{peer}: takes (P, m) groups; group_size {m} does not divide N = {n}")
        return [np.arange(n).reshape(n // m, m)]
    labels = torch.as_tensor(group_ids).detach().to("cpu").numpy()
    if labels.shape != (n,):
        raise PeerCannotExpress(f"{peer}: group_ids has shape {labels.shape}, expected ({n},)")
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    members = [np.flatnonzero(inverse == g) for g in np.argsort(first, kind="stable")]
    by_size: dict = {}
    for idx in members:
        by_size.setdefault(len(idx), []).append(idx)
    return [np.stack(groups) for groups in by_size.values()]


def multireward_grpo(rewards, *, group_ids=None, group_size=None, weights=None, segment_sizes=None,
                     process_group=None, eps=None, out_dtype=torch.float32):
    """multireward-grpo's ``compute_advantage_batch(rewards_pmr, w, mode="na", eps)`` in the gdpo
    shape: one call per group size (no Eq. 6), its float64 result cast once to ``out_dtype``."""
    from multireward_grpo.advantage import EPS, compute_advantage_batch

    if process_group is not None:
        raise PeerCannotExpress("multireward-grpo: computes on one process (no process_group)")
    r = rewards.detach().to("cpu")  # as numpy in the caller's dtype, bfloat16 (no numpy dtype) widened
    r = (r.to(torch.float64) if r.dtype == torch.bfloat16 else r).numpy()
    if r.ndim != 2:
        raise PeerCannotExpress(f"multireward-grpo: takes (N, K) rewards here, got shape {r.shape}")
    n, k = r.shape
    w = np.ones(k) if weights is None else np.asarray(weights, dtype=np.float64)
    adv = np.empty(n, dtype=np.float64)
    for idx in _group_blocks("multireward-grpo", n, group_ids, group_size):
        out = compute_advantage_batch(r[idx], w, mode="na", eps=EPS if eps is None else eps)
        adv[idx.reshape(-1)] = np.asarray(out).reshape(-1)
    return round_to(torch.from_numpy(adv), out_dtype)  # once: torch's own cast rounds twice, through float32


multireward_grpo.gdpo_domain = {
    "out_dtypes": ("float64",),
    "units": False,
    "why": "multireward-grpo returns float64 (a narrower output would be this adapter's cast, not the peer's) "
           "and has no Eq. 6 (no whitening units to pass)",
}


def ms_swift(rewards_per_func, num_generations, reward_weights):
    """ms-swift's ``compute_advantages(..., scale_rewards="gdpo")`` in the trl shape (TRL's argument
    names; its eps, 1e-8, is no argument); the advantages of the tuple it returns."""
    from swift.rl_core.advantage import compute_advantages

    advantages, _ = compute_advantages(rewards_per_func, reward_weights, int(num_generations),
                                       scale_rewards="gdpo")
    return advantages


def verl(token_level_rewards, response_mask, index, weights=None):
    """verl's ``compute_gdpo_outcome_advantage`` in the verl shape, with the keyword arguments verl's
    ``ray_trainer.compute_advantage`` builds for ``adv_estimator=gdpo``: an ``AlgoConfig`` naming
    the reward keys and weights, each sample's score per key (its token rewards summed over the
    response) in ``non_tensor_batch``, ``prompts`` and ``attention_mask`` in ``batch``, the summed
    token rewards. Returns verl's ``(advantages, returns)``."""
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.core_algos import compute_gdpo_outcome_advantage

    names = list(token_level_rewards)
    mask = response_mask
    on = mask.bool() if mask.shape == next(iter(token_level_rewards.values()), mask).shape else mask.bool()[..., None]
    # each score in the dtype of its token rewards (verl itself casts compute_score's values to float32)
    scores = {name: torch.where(on, t, torch.zeros((), dtype=t.dtype)).sum(dim=1).cpu().numpy()
              for name, t in token_level_rewards.items()}
    prompts = torch.zeros((mask.shape[0], 2), dtype=torch.int64, device=mask.device)  # two prompt tokens
    attention = torch.cat([torch.ones_like(prompts), mask.to(torch.int64)], dim=1)
    total = sum(t for t in token_level_rewards.values()) if names else torch.zeros(mask.shape)
    config = AlgoConfig(adv_estimator="gdpo", gdpo_reward_keys=names,
                        gdpo_reward_weights=None if weights is None else [float(w) for w in weights.values()])
    non_tensor_batch = {"uid": index, **scores}
    batch = {"prompts": prompts, "attention_mask": attention, "response_mask": mask,
             "token_level_rewards": total}
    return compute_gdpo_outcome_advantage(token_level_rewards=total, response_mask=mask, index=index,
                                          config=config, non_tensor_batch=non_tensor_batch, batch=batch)


class _OneProcess:
    """The ``accelerator`` of a single CPU process: TRL gathers across processes, here one."""

    device = torch.device("cpu")
    process_index = 0
    num_processes = 1
    is_main_process = True

    def gather(self, t):
        return t


def trl(rewards_per_func, num_generations, reward_weights):
    """TRL's real ``GRPOTrainer._generate_and_score_completions`` (``multi_objective_aggregation=
    "normalize_then_sum"``: TRL's Eq. 4, 7 and 6 are lines of that method), run unchanged on a
    trainer made without ``__init__`` holding only what it reads: one-token prompts and
    completions, reward functions returning the case's columns, ``beta = 0``, one process."""
    import collections
    import types

    from trl.trainer.grpo_trainer import GRPOTrainer

    n, k = rewards_per_func.shape
    columns = [rewards_per_func[:, j].tolist() for j in range(k)]

    def reward_function(j):
        def reward(prompts, completions, **kwargs):
            return columns[j]
        reward.__name__ = f"reward_{j}"
        return reward

    def generate(prompts):  # prompt ids, completion ids, tool mask, completions, logps, extra, images, tool images
        return [[1]] * len(prompts), [[2]] * len(prompts), None, ["c"] * len(prompts), None, {}, None, None

    trainer = GRPOTrainer.__new__(GRPOTrainer)
    trainer.__dict__.update(
        environment_factories=None, environments=None, tools=None, accelerator=_OneProcess(),
        model=types.SimpleNamespace(training=True, is_gradient_checkpointing=False),
        _tokenizer=types.SimpleNamespace(pad_token_id=0), pad_to_multiple_of=None,
        mask_truncated_completions=False, use_vllm=False, _generate=generate,
        reward_funcs=[reward_function(j) for j in range(k)], reward_processing_classes=[None] * k,
        reward_func_names=[f"reward_{j}" for j in range(k)], reward_weights=reward_weights,
        num_generations=int(num_generations), num_generations_eval=int(num_generations),
        multi_objective_aggregation="normalize_then_sum", scale_rewards="group", beta=0.0, num_iterations=1,
        state=types.SimpleNamespace(global_step=0), _log_completion_extra=None, _log_metric=None,
        _metrics={"train": collections.defaultdict(list), "eval": collections.defaultdict(list)},
        _logs={"prompt": [], "completion": [], "advantages": [], "images": [],
               "rewards": collections.defaultdict(list), "extra": collections.defaultdict(list)},
        _pending_extra_logs={}, _pending_metrics={}, log_multimodal=False,
        args=types.SimpleNamespace(per_device_train_batch_size=n, per_device_eval_batch_size=n,
                                   steps_per_generation=1, gradient_accumulation_steps=1,
                                   gradient_checkpointing=False, gradient_checkpointing_kwargs=None, report_to=[]),
    )
    out = GRPOTrainer._generate_and_score_completions(trainer, [{"prompt": "p"} for _ in range(n)])
    return out["advantages"]


for _adapter in (multireward_grpo, ms_swift, verl, trl):  # each computes its own preset
    _adapter.gdpo_convention = _adapter.__name__
