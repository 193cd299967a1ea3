"""Implementations for tests/test_native_precision.py: float32 and float64 codes of the peers'
formula, right and deliberately wrong, in the call shapes the grader takes."""

from __future__ import annotations

import numpy as np
import torch

from gdpo_tools.peer_formulas import formula, trl_normalize_then_sum
from impl.gdpo import gdpo_advantages
from spec.errors import GDPOError


def trl_float32(rewards, num_generations, reward_weights):
    """TRL's normalize_then_sum in float32 (eager torch): correct at float32's precision."""
    return trl_normalize_then_sum(rewards, int(num_generations), reward_weights)


def trl_bfloat16_deviations(rewards, num_generations, reward_weights, eps=1e-4):
    """The same, but the deviations rounded to bfloat16 (8 bits) before the divide: wrong by
    far more than float32's own precision."""
    r = rewards.to(torch.float32)
    n, k = r.shape
    grouped = r.view(-1, int(num_generations), k)
    dev = (grouped - grouped.mean(dim=1, keepdim=True)).to(torch.bfloat16).to(torch.float32)
    z = (dev / (grouped.std(dim=1, keepdim=True) + eps)).view(n, k)
    c = (z * reward_weights.to(torch.float32)).sum(dim=1)
    return (c - c.mean()) / (c.std() + eps)


def _groups(rewards, group_ids, group_size):
    n = rewards.shape[0]
    if group_ids is not None:
        return torch.as_tensor(group_ids).numpy()
    return np.arange(n) // int(group_size)


def multireward_float64(rewards, *, group_ids=None, group_size=None, weights=None, segment_sizes=None,
                        process_group=None, eps=None, out_dtype=torch.float64):
    """multireward-grpo's formula (biased std, eps 1e-8 on the std, no Eq. 6) in float64,
    mean then subtract: correct under convention multireward_grpo at float64's precision."""
    r = rewards.detach().to(torch.float64).numpy()
    a = formula("multireward_grpo", r, _groups(rewards, group_ids, group_size), weights=weights,
                dtype=np.float64)
    return torch.from_numpy(np.asarray(a, dtype=np.float64)).to(out_dtype)


multireward_float64.gdpo_convention = "multireward_grpo"
multireward_float64.gdpo_domain = {"out_dtypes": ("float64",), "units": False, "eps": False,
                                   "why": "float64 output, no Eq. 6, the package's eps"}


def multireward_noise_floor(rewards, **kw):
    """The same plus a noise floor: every advantage moved by 1e-12 (far above float64's
    rounding on advantages of order 1, far below what a float32 grading would see)."""
    a = multireward_float64(rewards, **kw)
    return a + torch.where(a >= 0, 1e-12, -1e-12).to(a.dtype)


multireward_noise_floor.gdpo_domain = multireward_float64.gdpo_domain


def plain_value_errors(rewards, **kw):
    """impl.gdpo, but every refusal re-raised as a plain ValueError with the same message:
    a clear refusal of another class than spec.errors'."""
    try:
        return gdpo_advantages(rewards, **kw)
    except GDPOError as e:
        raise ValueError(str(e)) from None


def verl_nan_everywhere(token_level_rewards, response_mask, index, weights=None):
    """A verl-shaped code whose output is NaN on every token, padding included."""
    any_t = next(iter(token_level_rewards.values()))
    return torch.full(any_t.shape, float("nan"), dtype=torch.float32)


def trl_squares_overflow(rewards, num_generations, reward_weights, eps=1e-4):
    """TRL's float32 formula with its std from the mean of squared deviations (as its nanstd):
    a group column of 1e20 has squares beyond FLT_MAX, std inf, z silently 0."""
    r = rewards.to(torch.float32)
    n, k = r.shape
    grouped = r.view(-1, int(num_generations), k)
    m = int(num_generations)
    dev = grouped - grouped.mean(dim=1, keepdim=True)
    std = ((dev * dev).mean(dim=1, keepdim=True) * (m / (m - 1))).sqrt()
    z = (dev / (std + eps)).view(n, k)
    c = (z * reward_weights.to(torch.float32)).sum(dim=1)
    a = (c - c.mean()) / (c.std() + eps)
    return torch.nan_to_num(a, nan=0.0)


def _trl_like(rewards, num_generations, reward_weights, eps=1e-4, ddof=1, clip=None, loo=False, whiten=True):
    """TRL's normalize_then_sum in float32 with one choice changed (for tests/test_findings.py)."""
    r = rewards.to(torch.float32)
    n, k = r.shape
    m = int(num_generations)
    grouped = r.view(-1, m, k)
    base = (grouped.sum(dim=1, keepdim=True) - grouped) / (m - 1) if loo else grouped.mean(dim=1, keepdim=True)
    z = ((grouped - base) / (grouped.std(dim=1, keepdim=True, correction=ddof) + eps))
    c = (z.view(n, k) * reward_weights.to(torch.float32)).sum(dim=1)
    if not whiten:
        return c
    a = (c - c.mean()) / (c.std() + eps)
    return a.clamp(-clip, clip) if clip is not None else a


def trl_clipped(rewards, num_generations, reward_weights):
    """TRL's float32 code, every advantage clipped to [-1, 1]: a second defect beside its overflow."""
    return _trl_like(rewards, num_generations, reward_weights, clip=1.0)


def trl_biased_std(rewards, num_generations, reward_weights):
    """TRL's float32 code with the biased std (ddof 0) at Eq. 4."""
    return _trl_like(rewards, num_generations, reward_weights, ddof=0)


def trl_eps_1e_2(rewards, num_generations, reward_weights):
    """TRL's float32 code with eps 1e-2 at Eq. 4 and Eq. 6."""
    return _trl_like(rewards, num_generations, reward_weights, eps=1e-2)


def trl_leave_one_out(rewards, num_generations, reward_weights):
    """TRL's float32 code with RLOO's leave-one-out baseline at Eq. 4 (a group of two: the other
    sample's reward)."""
    return _trl_like(rewards, num_generations, reward_weights, loo=True)


def trl_no_whitening(rewards, num_generations, reward_weights):
    """TRL's float32 code without Eq. 6 (c returned as it is): a missing whitening, which one group
    of two rewards cannot tell from an Eq. 4 without its division by the std."""
    return _trl_like(rewards, num_generations, reward_weights, whiten=False)


def trl_clipped_at_5(rewards, num_generations, reward_weights):
    """TRL's float32 code clipped to [-5, 5]: |a| > 5 needs a batch of over 25 samples with one
    outlier ((N-1)/sqrt(N) bounds |a|), which the probes hold and few drawn cases do."""
    return _trl_like(rewards, num_generations, reward_weights, clip=5.0)


def impl_float32_rounding(rewards, out_dtype=torch.float32, **kw):
    """impl.gdpo's advantages moved by 3 float32 ulps, on one process or several: within what a
    correct float32 code's rounding gives."""
    a = gdpo_advantages(rewards, out_dtype=torch.float64, **kw)
    return (a * (1 + 3 * 2.0 ** -24)).to(out_dtype)


def trl_eps_5e_4(rewards, num_generations, reward_weights):
    """TRL's float32 code with eps 5e-4 at Eq. 4 and Eq. 6: a value the catalogue does not search."""
    return _trl_like(rewards, num_generations, reward_weights, eps=5e-4)


def trl_bfloat16_inside(rewards, num_generations, reward_weights, eps=1e-4):
    """TRL's formula with Eq. 4 and Eq. 7 in bfloat16 (as autocast would run them) and Eq. 6 in
    float32: float32 outputs, accurate to bfloat16's 8 bits."""
    r = rewards.to(torch.bfloat16)
    n, k = r.shape
    grouped = r.view(-1, int(num_generations), k)
    z = (grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + eps)
    c = (z.view(n, k) * reward_weights.to(torch.bfloat16)).sum(dim=1).to(torch.float32)
    return (c - c.mean()) / (c.std() + eps)


def trl_float32_as_list(rewards, num_generations, reward_weights):
    """TRL's float32 code returning a Python list: on a NaN reward it returns NaNs, raising nothing."""
    return trl_float32(rewards, num_generations, reward_weights).tolist()


def trl_off_by_a_factor(rewards, num_generations, reward_weights):
    """TRL's float32 code with every advantage 0.1% too large: a formula difference, however small."""
    return trl_float32(rewards, num_generations, reward_weights) * 1.001


def rank1_raises_alone(rewards, *, process_group=None, **kwargs):
    """impl.gdpo, but on several ranks rank 1 refuses alone while rank 0 waits for it in all_reduce:
    every multi-process case hangs."""
    import torch.distributed as dist

    if process_group is not None:
        if dist.get_rank(process_group) == 1:
            raise ValueError("rank 1 refuses before the collective")
        dist.all_reduce(torch.zeros(1), group=process_group)
    return gdpo_advantages(rewards, process_group=process_group, **kwargs)



def impl_plain_value_errors(rewards, **kwargs):
    """impl.gdpo with each refusal re-raised as a plain ValueError of the same text: on several
    ranks every rank raises it together, naming the offending rank (another class, a clear refusal)."""
    from spec import GDPOError

    try:
        return gdpo_advantages(rewards, **kwargs)
    except GDPOError as exc:
        raise ValueError(str(exc)) from None


def impl_shard_alone(rewards, *, process_group=None, **kwargs):
    """impl.gdpo on each rank's shard alone: the process group ignored (heldout5 gdpo_shard_whiten)."""
    return gdpo_advantages(rewards, **kwargs)

def impl_without_units(rewards, *, group_ids=None, group_size=None, weights=None, eps=1e-4,
                       out_dtype=torch.float32, process_group=None):
    """impl.gdpo behind a signature without segment_sizes (one whitening unit), Eq. 6 across ranks."""
    return gdpo_advantages(rewards, group_ids=group_ids, group_size=group_size, weights=weights, eps=eps,
                           out_dtype=out_dtype, process_group=process_group)


def impl_without_units_shard_alone(rewards, *, process_group=None, **kwargs):
    """The same, the process group ignored (heldout6 m19: its two all_reduce calls removed)."""
    return impl_without_units(rewards, **kwargs)


def trl_no_eps_f64(rewards, num_generations, reward_weights, eps=1e-4):
    """Eq. 4 without eps, in float64 (heldout6 m09): a constant group column gives NaN."""
    r = rewards.to(torch.float64)
    n, k = r.shape
    x = r.view(-1, int(num_generations), k)
    z = ((x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)).view(n, k)
    c = z @ reward_weights.to(torch.float64)
    return (c - c.mean()) / (c.std() + eps)


def trl_grpo_f64(rewards, num_generations, reward_weights, eps=1e-4):
    """GRPO on the weighted sum, in float64, the sum by a matrix product (heldout6 m11)."""
    g = int(num_generations)
    c = rewards.to(torch.float64) @ reward_weights.to(torch.float64)
    x = c.view(-1, g)
    z = ((x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True) + eps)).reshape(-1)
    return (z - z.mean()) / (z.std() + eps)


def impl_refusing_empty_shards(rewards, *, process_group=None, **kwargs):
    """impl.gdpo refusing a rank with no rows: every rank raises together, naming the first empty
    one, whatever else the batch holds (heldout6 m20)."""
    if process_group is not None:
        import torch.distributed as dist

        n = torch.tensor([rewards.shape[0]])
        sizes = [torch.zeros_like(n) for _ in range(dist.get_world_size(process_group))]
        dist.all_gather(sizes, n, group=process_group)
        empty = [r for r, size in enumerate(sizes) if int(size) == 0]
        if empty:
            raise ValueError(f"rank {empty[0]}: rewards are empty, shape (0, {rewards.shape[1]})")
    return gdpo_advantages(rewards, process_group=process_group, **kwargs)


def impl_labels_length_unchecked(rewards, *, group_ids=None, **kwargs):
    """impl.gdpo without a length check of its labels (heldout6 m17): too many are cut to the
    rows, too few crash on the first row past them."""
    if group_ids is not None:
        ids = [int(group_ids[i]) for i in range(rewards.shape[0])]  # IndexError past the end
        group_ids = torch.tensor(ids)
    return gdpo_advantages(rewards, group_ids=group_ids, **kwargs)


def impl_eq6_first_256(rewards, **kwargs):
    """impl.gdpo's Eq. 4 and 7, then Eq. 6 with the mean and std of the first 256 rows only
    (heldout7 m12: exact on every batch of up to 256 rows)."""
    from impl.gdpo import normalize_rewards

    c = normalize_rewards(rewards, **{k: v for k, v in kwargs.items() if k in ("group_ids", "group_size", "weights",
                                                                            "eps")}).to(torch.float64)
    head = c[:256]
    return ((c - head.mean()) / (head.std() + kwargs.get("eps", 1e-4))).to(kwargs.get("out_dtype", torch.float32))


def impl_ddof0_in_pairs(rewards, *, group_ids=None, group_size=None, weights=None, eps=1e-4, out_dtype=torch.float32):
    """The paper's formula in float64 but the population std in groups of 2 (heldout7 m08)."""
    r = rewards.to(torch.float64).reshape(rewards.shape[0], -1)
    ids = torch.arange(r.shape[0]) // group_size if group_ids is None else torch.as_tensor(group_ids)
    z = torch.zeros_like(r)
    for g in torch.unique(ids):
        m = ids == g
        x = r[m]
        z[m] = (x - x.mean(0)) / (x.std(0, unbiased=int(m.sum()) != 2) + eps)
    w = torch.ones(r.shape[1], dtype=torch.float64) if weights is None else torch.tensor(weights, dtype=torch.float64)
    c = z @ w
    return ((c - c.mean()) / (c.std() + eps)).to(out_dtype)


def trl_last_group_skipped(rewards, num_generations, reward_weights, eps=1e-4):
    """An off-by-one group loop in float64 (heldout4 offbyone_loop): the last group is never
    standardized, its z left 0, at every magnitude."""
    r = rewards.to(torch.float64)
    n, k = r.shape
    g = int(num_generations)
    z = torch.zeros_like(r)
    for s in range(0, n - g, g):
        x = r[s:s + g]
        z[s:s + g] = (x - x.mean(0)) / (x.std(0) + eps)
    c = (z * reward_weights.to(torch.float64)).sum(1)
    return ((c - c.mean()) / (c.std() + eps)).to(torch.float32)



def trl_refuses_pairs(rewards, num_generations, reward_weights):
    """TRL's float32 formula refusing groups of two, at any magnitude."""
    if int(num_generations) < 3:
        raise ValueError(f"groups of {int(num_generations)} are too small")
    return trl_float32(rewards, num_generations, reward_weights)
