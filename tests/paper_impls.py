"""Independent GDPO advantage implementations (correct ones and seeded defects).

Method (GDPO, arXiv 2601.05242):
  Eq. 4  z[i,k] = (r[i,k] - mean_g(r[:,k])) / (std_g(r[:,k]) + eps)   (unbiased std)
  Eq. 7  c[i]   = sum_k w[k] * z[i,k]
  Eq. 6  a[i]   = (c[i] - mean(c)) / (std(c) + eps)                   (unbiased std, whole batch)
  eps = 1e-4.

Call shape (TRL): fn(rewards (N, K) float32, num_generations, reward_weights (K,) float32) -> (N,)

Written from the paper alone, without reading this project, as different maintainers would write
them (issue 43's acceptance): tests/test_first_contact.py grades each with `gdpo check --call-shape trl`
and no other option. EXPECTED below is the answer key: each function's working precision and its
differences from the paper, in the words of the formula catalogue (conformance/formulas.py).
Only torch and numpy are needed.
"""

import math
import operator

import numpy as np
import torch

EPS = 1e-4
F32_MAX = 3.4028234663852886e38


# ---------------------------------------------------------------------------
# Correct implementations
# ---------------------------------------------------------------------------

def correct_f32(rewards, num_generations, reward_weights):
    """GDPO in float32, explicit two-pass statistics via view/reshape."""
    r = rewards.to(torch.float32)
    w = reward_weights.to(device=r.device, dtype=torch.float32)
    n, k = r.shape
    g = num_generations
    grouped = r.view(n // g, g, k)

    # Eq. 4 -- pass 1: mean; pass 2: squared deviations
    mu = grouped.sum(dim=1, keepdim=True) / g
    dev = grouped - mu
    sigma = torch.sqrt((dev * dev).sum(dim=1, keepdim=True) / (g - 1))
    z = (dev / (sigma + EPS)).reshape(n, k)

    # Eq. 7
    c = (z * w.unsqueeze(0)).sum(dim=1)

    # Eq. 6
    c_mean = c.sum() / n
    c_dev = c - c_mean
    c_std = torch.sqrt((c_dev * c_dev).sum() / (n - 1))
    return c_dev / (c_std + EPS)


def correct_f64(rewards, num_generations, reward_weights):
    """GDPO computed and returned in float64, with an explicit loop over prompt groups."""
    R = rewards.detach().to(torch.float64)
    W = reward_weights.detach().to(device=R.device, dtype=torch.float64)
    num_rows = R.shape[0]
    Z = torch.empty_like(R)
    for start in range(0, num_rows, num_generations):
        block = R[start:start + num_generations]
        centred = block - block.mean(dim=0)
        spread = block.std(dim=0, unbiased=True)
        Z[start:start + num_generations] = centred / (spread + EPS)
    combined = Z @ W
    return (combined - combined.mean()) / (combined.std(unbiased=True) + EPS)


def correct_f64_out32(rewards, num_generations, reward_weights):
    """Float64 internals using scatter/index ops for group statistics; returns float32."""
    x = rewards.to(torch.float64)
    wts = reward_weights.to(x.device, torch.float64)
    N, K = x.shape
    gid = torch.arange(N, device=x.device) // num_generations
    G = int(gid.max().item()) + 1
    counts = torch.bincount(gid, minlength=G).to(torch.float64)          # (G,)
    idx = gid.unsqueeze(1).expand(N, K)

    sums = torch.zeros(G, K, dtype=torch.float64, device=x.device).scatter_add_(0, idx, x)
    means = sums / counts.unsqueeze(1)
    resid = x - means.index_select(0, gid)
    ss = torch.zeros(G, K, dtype=torch.float64, device=x.device).scatter_add_(0, idx, resid ** 2)
    stds = torch.sqrt(ss / (counts.unsqueeze(1) - 1.0))
    z = resid / (stds.index_select(0, gid) + EPS)

    c = torch.mv(z, wts)
    adv = (c - c.mean()) / (c.std(correction=1) + EPS)
    return adv.to(torch.float32)


def correct_numpy_f32(rewards, num_generations, reward_weights):
    """Numpy float32 implementation; returns a torch float32 tensor."""
    arr = rewards.detach().cpu().numpy().astype(np.float32)
    wv = reward_weights.detach().cpu().numpy().astype(np.float32)
    n_samples, n_rewards = arr.shape
    groups = arr.reshape(-1, num_generations, n_rewards)
    mean_g = groups.mean(axis=1, keepdims=True, dtype=np.float32)
    std_g = groups.std(axis=1, ddof=1, keepdims=True, dtype=np.float32)
    z = ((groups - mean_g) / (std_g + np.float32(EPS))).reshape(n_samples, n_rewards)
    c = (z * wv[None, :]).sum(axis=1, dtype=np.float32)
    a = (c - c.mean(dtype=np.float32)) / (c.std(ddof=1, dtype=np.float32) + np.float32(EPS))
    return torch.from_numpy(a.astype(np.float32))


def correct_validating(rewards, num_generations, reward_weights):
    """Float32 GDPO with strict input validation (ValueError on bad input)."""
    if not isinstance(rewards, torch.Tensor):
        raise ValueError("rewards must be a torch.Tensor")
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape (N, K); got shape {tuple(rewards.shape)}")
    if isinstance(num_generations, bool):
        raise ValueError(f"num_generations must be an integer; got {num_generations!r}")
    try:
        num_generations = operator.index(num_generations)  # accepts int, numpy ints
    except TypeError:
        raise ValueError(f"num_generations must be an integer; got {num_generations!r}") from None
    if num_generations < 2:
        raise ValueError(f"num_generations must be >= 2 to compute a group std; got {num_generations}")
    n, k = rewards.shape
    if n == 0 or k == 0:
        raise ValueError(f"rewards must be non-empty; got shape {(n, k)}")
    if n % num_generations != 0:
        raise ValueError(
            f"number of samples N={n} is not divisible by num_generations={num_generations}")
    r = rewards.to(torch.float32)
    if not torch.isfinite(r).all():
        raise ValueError("rewards contain NaN or inf values")
    w = torch.as_tensor(reward_weights).to(device=r.device, dtype=torch.float32)
    if w.dim() != 1 or w.numel() != k:
        raise ValueError(
            f"expected {k} reward weights (one per reward column); got shape {tuple(w.shape)}")
    if not torch.isfinite(w).all():
        raise ValueError("reward weights contain NaN or inf values")
    if bool((w == 0).all()):
        raise ValueError("all reward weights are zero")

    grp = r.reshape(-1, num_generations, k)
    mean = grp.mean(dim=1, keepdim=True)
    centered = grp - mean
    std = centered.pow(2).sum(dim=1, keepdim=True).div(num_generations - 1).sqrt()
    z = (centered / (std + EPS)).reshape(n, k)
    c = z.matmul(w)
    c_c = c - c.mean()
    return c_c / (c_c.pow(2).sum().div(n - 1).sqrt() + EPS)


# ---------------------------------------------------------------------------
# Single defects
# ---------------------------------------------------------------------------

def no_std_eq4(rewards, num_generations, reward_weights):
    """DEFECT: Eq. 4 only centres (Dr. GRPO style), no division by the group std."""
    r = rewards.float()
    n, k = r.shape
    g = r.view(-1, num_generations, k)
    z = (g - g.mean(dim=1, keepdim=True)).view(n, k)
    c = (z * reward_weights.float()).sum(-1)
    return (c - c.mean()) / (c.std() + EPS)


def clip3(rewards, num_generations, reward_weights):
    """DEFECT: correct GDPO, then advantages clamped to [-3, 3]. float64 inside, float32 out."""
    r = rewards.double()
    w = reward_weights.double()
    out = torch.empty_like(r)
    for s in range(0, r.shape[0], num_generations):
        blk = r[s:s + num_generations]
        out[s:s + num_generations] = (blk - blk.mean(0)) / (blk.std(0) + EPS)
    c = out @ w
    adv = (c - c.mean()) / (c.std() + EPS)
    return adv.clamp(-3.0, 3.0).float()


def no_eq6_clip3(rewards, num_generations, reward_weights):
    """DEFECT: Eq. 6 dropped (a = c), then clamped to [-3, 3]. float32."""
    r = rewards.to(torch.float32)
    k = r.shape[1]
    g = r.reshape(-1, num_generations, k)
    z = (g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + EPS)
    c = z.reshape(-1, k) @ reward_weights.to(torch.float32)
    return torch.clamp(c, min=-3.0, max=3.0)


def no_eq6(rewards, num_generations, reward_weights):
    """DEFECT: Eq. 6 dropped; returns the weighted sum of per-reward z-scores. numpy float64."""
    a = rewards.detach().cpu().numpy().astype(np.float64)
    w = reward_weights.detach().cpu().numpy().astype(np.float64)
    grp = a.reshape(-1, num_generations, a.shape[1])
    z = (grp - grp.mean(axis=1, keepdims=True)) / (grp.std(axis=1, ddof=1, keepdims=True) + EPS)
    c = z.reshape(a.shape) @ w
    return torch.from_numpy(c)  # float64


def eq6_per_group(rewards, num_generations, reward_weights):
    """DEFECT: Eq. 6 normalisation applied within each prompt group, not over the batch."""
    r = rewards.float()
    n, k = r.shape
    g = r.view(n // num_generations, num_generations, k)
    z = (g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + EPS)
    c = (z * reward_weights.float().view(1, 1, k)).sum(-1)            # (G, n_g)
    a = (c - c.mean(1, keepdim=True)) / (c.std(1, keepdim=True) + EPS)
    return a.reshape(n)


def loo_baseline(rewards, num_generations, reward_weights):
    """DEFECT: Eq. 4 baseline is the leave-one-out mean of the other group members.
    The std is still the ordinary unbiased std of the whole group. float64 inside, float32 out."""
    r = rewards.to(torch.float64)
    n, k = r.shape
    m = num_generations
    g = r.view(-1, m, k)
    loo_mean = (g.sum(1, keepdim=True) - g) / (m - 1)
    z = ((g - loo_mean) / (g.std(1, keepdim=True) + EPS)).view(n, k)
    c = z @ reward_weights.to(torch.float64)
    return ((c - c.mean()) / (c.std() + EPS)).to(torch.float32)


def loo_baseline_and_std(rewards, num_generations, reward_weights):
    """DEFECT: Eq. 4 uses, for each row, the mean and the unbiased std of the OTHER
    members of its group (leave-one-out baseline and leave-one-out std).

    Groups of 2: the leave-one-out set has a single member, so its unbiased std is
    undefined (0/0). In that case we fall back to the ordinary unbiased std of the
    whole group (both members); the baseline is still the other member's value.
    Explicit Python loops over groups and rows, float64 inside, float32 out.
    """
    R = rewards.detach().to(torch.float64).cpu()
    W = reward_weights.detach().to(torch.float64).cpu()
    N, K = R.shape
    m = num_generations
    Z = torch.zeros(N, K, dtype=torch.float64)
    for start in range(0, N, m):
        blk = R[start:start + m]
        full_std = blk.std(dim=0, unbiased=True)
        for j in range(m):
            others = torch.cat([blk[:j], blk[j + 1:]], dim=0)
            base = others.mean(dim=0)
            if others.shape[0] >= 2:
                spread = others.std(dim=0, unbiased=True)
            else:  # group of 2 -> fall back to full-group std
                spread = full_std
            Z[start + j] = (blk[j] - base) / (spread + EPS)
    c = Z @ W
    adv = (c - c.mean()) / (c.std(unbiased=True) + EPS)
    return adv.to(torch.float32).to(rewards.device)


def batch_std_eq4(rewards, num_generations, reward_weights):
    """DEFECT: Eq. 4 divides by the column's std over the whole batch (mean is still the group's)."""
    r = rewards.float()
    n, k = r.shape
    g = r.view(-1, num_generations, k)
    centred = (g - g.mean(1, keepdim=True)).view(n, k)
    col_std = r.std(dim=0, unbiased=True)                                 # (K,) whole batch
    z = centred / (col_std + EPS)
    c = z @ reward_weights.float()
    return (c - c.mean()) / (c.std() + EPS)


def grpo_weighted_sum(rewards, num_generations, reward_weights):
    """DEFECT: GRPO on the weighted sum: s = r @ w, group-standardise s, then Eq. 6. numpy float32."""
    r = rewards.detach().cpu().numpy().astype(np.float32)
    w = reward_weights.detach().cpu().numpy().astype(np.float32)
    s = (r * w).sum(axis=1).reshape(-1, num_generations)
    s_z = (s - s.mean(axis=1, keepdims=True)) / (s.std(axis=1, ddof=1, keepdims=True) + np.float32(EPS))
    s_z = s_z.reshape(-1)
    out = (s_z - s_z.mean()) / (s_z.std(ddof=1) + np.float32(EPS))
    return torch.from_numpy(out.astype(np.float32))


def eps_in_sqrt(rewards, num_generations, reward_weights):
    """DEFECT: eps inside the square root at Eq. 4 and Eq. 6: sqrt(var + eps). float32."""
    r = rewards.float()
    n, k = r.shape
    g = r.reshape(-1, num_generations, k)
    var_g = g.var(dim=1, unbiased=True, keepdim=True)
    z = ((g - g.mean(1, keepdim=True)) / torch.sqrt(var_g + EPS)).reshape(n, k)
    c = (z * reward_weights.float()).sum(1)
    return (c - c.mean()) / torch.sqrt(c.var(unbiased=True) + EPS)


def ddof0_eq4(rewards, num_generations, reward_weights):
    """DEFECT: biased (divide by n) std at Eq. 4 only. float64 loop, float64 out."""
    R = rewards.double()
    W = reward_weights.double()
    Z = torch.empty_like(R)
    for s in range(0, R.shape[0], num_generations):
        b = R[s:s + num_generations]
        Z[s:s + num_generations] = (b - b.mean(0)) / (b.std(0, unbiased=False) + EPS)
    c = Z @ W
    return (c - c.mean()) / (c.std(unbiased=True) + EPS)


def ddof0_eq6(rewards, num_generations, reward_weights):
    """DEFECT: biased (divide by N) std at Eq. 6 only. float32."""
    r = rewards.float()
    n, k = r.shape
    g = r.view(-1, num_generations, k)
    z = ((g - g.mean(1, keepdim=True)) / (g.std(1, unbiased=True, keepdim=True) + EPS)).view(n, k)
    c = z @ reward_weights.float()
    return (c - c.mean()) / (c.std(unbiased=False) + EPS)


def ddof0_both(rewards, num_generations, reward_weights):
    """DEFECT: biased std at Eq. 4 and Eq. 6. numpy float64 (np.std default ddof=0), float32 out."""
    x = rewards.detach().cpu().numpy().astype(np.float64)
    w = reward_weights.detach().cpu().numpy().astype(np.float64)
    gx = x.reshape(-1, num_generations, x.shape[1])
    z = (gx - gx.mean(1, keepdims=True)) / (gx.std(1, keepdims=True) + EPS)
    c = z.reshape(x.shape) @ w
    a = (c - c.mean()) / (c.std() + EPS)
    return torch.from_numpy(a).float()


def one_pass_var_f32(rewards, num_generations, reward_weights):
    """DEFECT: variance as E[x^2] - E[x]^2 in float32 (clamped at 0, then rescaled by n/(n-1)
    to stay unbiased) at both Eq. 4 and Eq. 6. Otherwise correct."""
    r = rewards.to(torch.float32)
    n, k = r.shape
    m = num_generations
    g = r.view(-1, m, k)
    ex = g.mean(1, keepdim=True)
    ex2 = (g * g).mean(1, keepdim=True)
    var = torch.clamp(ex2 - ex * ex, min=0.0) * (m / (m - 1))
    z = ((g - ex) / (torch.sqrt(var) + EPS)).view(n, k)
    c = z @ reward_weights.to(torch.float32)
    ec = c.mean()
    ec2 = (c * c).mean()
    vc = torch.clamp(ec2 - ec * ec, min=0.0) * (n / (n - 1))
    return (c - ec) / (torch.sqrt(vc) + EPS)


def one_pass_var_f64_ddof0(rewards, num_generations, reward_weights):
    """DEFECT: one-pass variance E[x^2] - E[x]^2 with ddof 0 (biased) at both equations. float64."""
    r = rewards.to(torch.float64)
    n, k = r.shape
    g = r.view(-1, num_generations, k)
    mu = g.mean(1, keepdim=True)
    var = ((g ** 2).mean(1, keepdim=True) - mu ** 2).clamp_min(0.0)
    z = ((g - mu) / (var.sqrt() + EPS)).view(n, k)
    c = z @ reward_weights.to(torch.float64)
    mc = c.mean()
    vc = ((c ** 2).mean() - mc ** 2).clamp_min(0.0)
    return (c - mc) / (vc.sqrt() + EPS)


def weights_normalized(rewards, num_generations, reward_weights):
    """DEFECT: weights divided by their sum before Eq. 7. float32."""
    r = rewards.float()
    w = reward_weights.float()
    w = w / w.sum()
    n, k = r.shape
    g = r.view(-1, num_generations, k)
    z = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + EPS)).view(n, k)
    c = z @ w
    return (c - c.mean()) / (c.std() + EPS)


# ---------------------------------------------------------------------------
# Pairs of defects
# ---------------------------------------------------------------------------

def no_std_eq4_and_clip(rewards, num_generations, reward_weights):
    """DEFECTS: Eq. 4 without the std division, and the final advantages clamped to [-3, 3]. float32."""
    r = rewards.float()
    n, k = r.shape
    g = r.view(-1, num_generations, k)
    z = (g - g.mean(1, keepdim=True)).view(n, k)
    c = z @ reward_weights.float()
    a = (c - c.mean()) / (c.std() + EPS)
    return a.clamp(-3.0, 3.0)


def loo_baseline_and_no_eq6(rewards, num_generations, reward_weights):
    """DEFECTS: leave-one-out baseline at Eq. 4 (ordinary group std), and Eq. 6 dropped. float64."""
    x = rewards.double()
    n, k = x.shape
    m = num_generations
    gx = x.view(-1, m, k)
    baseline = (gx.sum(1, keepdim=True) - gx) / (m - 1)
    z = ((gx - baseline) / (gx.std(1, keepdim=True) + EPS)).view(n, k)
    return z @ reward_weights.double()


def eps_in_sqrt_and_ddof0(rewards, num_generations, reward_weights):
    """DEFECTS: sqrt(var + eps) and biased variance (ddof 0), both at Eq. 4 and Eq. 6. numpy float32."""
    r = rewards.detach().cpu().numpy().astype(np.float32)
    w = reward_weights.detach().cpu().numpy().astype(np.float32)
    e = np.float32(EPS)
    gr = r.reshape(-1, num_generations, r.shape[1])
    z = (gr - gr.mean(1, keepdims=True)) / np.sqrt(gr.var(1, keepdims=True) + e)
    c = z.reshape(r.shape) @ w
    a = (c - c.mean()) / np.sqrt(c.var() + e)
    return torch.from_numpy(a.astype(np.float32))


def eq6_per_group_and_weights_normalized(rewards, num_generations, reward_weights):
    """DEFECTS: weights divided by their sum before Eq. 7, and Eq. 6 applied per prompt group.
    Explicit loop over groups, float32."""
    r = rewards.to(torch.float32)
    w = reward_weights.to(torch.float32)
    w = w / w.sum()
    out = torch.empty(r.shape[0], dtype=torch.float32, device=r.device)
    for s in range(0, r.shape[0], num_generations):
        b = r[s:s + num_generations]
        z = (b - b.mean(0)) / (b.std(0) + EPS)
        c = z @ w
        out[s:s + num_generations] = (c - c.mean()) / (c.std() + EPS)
    return out


def batch_std_and_grpo_sum(rewards, num_generations, reward_weights):
    """DEFECTS: GRPO on the weighted sum (s = r @ w, standardised as one column instead of
    per reward), AND that standardisation divides by the std of s over the whole batch rather
    than the group's std (the mean subtracted is still the group mean). Then Eq. 6. float32."""
    r = rewards.float()
    s = r @ reward_weights.float()                                      # (N,)
    sg = s.view(-1, num_generations)
    centred = (sg - sg.mean(1, keepdim=True)).reshape(-1)
    z = centred / (s.std(unbiased=True) + EPS)
    return (z - z.mean()) / (z.std() + EPS)


# ---------------------------------------------------------------------------
# Deliberate limits
# ---------------------------------------------------------------------------

def refuses_beyond_f32(rewards, num_generations, reward_weights):
    """Correct GDPO in float64, but refuses rewards whose magnitude exceeds the float32 range
    (this includes +-inf)."""
    r = torch.as_tensor(rewards).to(torch.float64)
    if bool((r.abs() > F32_MAX).any()):
        raise ValueError("reward magnitude beyond float32 range (|r| > 3.4028234663852886e38)")
    w = torch.as_tensor(reward_weights).to(device=r.device, dtype=torch.float64)
    n, k = r.shape
    g = r.reshape(-1, num_generations, k)
    z = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + EPS)).reshape(n, k)
    c = z @ w
    return (c - c.mean()) / (c.std() + EPS)


def int_rewards_ok(rewards, num_generations, reward_weights):
    """Correct GDPO; accepts integer/bool reward (and weight) tensors by converting them.
    float64 inside (so large int64 rewards are not rounded to float32 early), float32 out."""
    r = torch.as_tensor(rewards)
    if not torch.is_floating_point(r):  # int / bool rewards: convert instead of failing
        r = r.to(torch.float64)
    r = r.to(torch.float64)  # float inputs also go to float64
    w = torch.as_tensor(reward_weights).to(device=r.device, dtype=torch.float64)
    n, k = r.shape
    gsz = num_generations
    blocks = r.view(n // gsz, gsz, k)
    mu = blocks.mean(dim=1, keepdim=True)
    sd = (blocks - mu).pow(2).sum(dim=1, keepdim=True).div(gsz - 1).sqrt()
    z = ((blocks - mu) / (sd + EPS)).view(n, k)
    c = (z * w).sum(dim=1)
    cm = c.mean()
    cs = (c - cm).pow(2).sum().div(n - 1).sqrt()
    return ((c - cm) / (cs + EPS)).to(torch.float32)


#: name -> (the precision it computes in, as gdpo check tells it; its differences from the paper)
EXPECTED = {
    'correct_f32': ('float32', ()),
    'correct_f64': ('float64', ()),
    'correct_f64_out32': ('float32', ()),
    'correct_numpy_f32': ('float32', ()),
    'correct_validating': ('float32', ()),
    'refuses_beyond_f32': ('float64', ()),
    'int_rewards_ok': ('float32', ()),
    'one_pass_var_f32': ('float32', ()),
    'no_std_eq4': ('float32', ('Eq. 4: no division by the std',)),
    'clip3': ('float32', ('after Eq. 6: advantages clipped to [-3, 3]',)),
    'no_eq6_clip3': ('float32', ('Eq. 6: none (no batch whitening)', 'after Eq. 6: advantages clipped to [-3, 3]')),
    'no_eq6': ('float64', ('Eq. 6: none (no batch whitening)',)),
    'eq6_per_group': ('float32', ('Eq. 6: within each prompt group, not over the batch',)),
    'loo_baseline': ('float32', ("Eq. 4: leave-one-out baseline (the mean of the group's other members)",)),
    'loo_baseline_and_std': ('float32', ("Eq. 4: leave-one-out baseline (the mean of the group's other members)", "Eq. 4: leave-one-out std (each row's std over the group's other members; a group of two: the group's std)")),
    'batch_std_eq4': ('float32', ("Eq. 4: divides by the std of the column over the whole batch, not the group's",)),
    'grpo_weighted_sum': ('float32', ('Eq. 7: weights applied to the rewards before Eq. 4 (GRPO on the weighted sum)',)),
    'eps_in_sqrt': ('float32', ("Eq. 4: eps added to the variance: sqrt(var + the call's eps)", "Eq. 6: eps added to the variance: sqrt(var + the call's eps)")),
    'ddof0_eq4': ('float64', ('Eq. 4: biased std (ddof 0)',)),
    'ddof0_eq6': ('float32', ('Eq. 6: biased std (ddof 0)',)),
    'ddof0_both': ('float32', ('Eq. 4: biased std (ddof 0)', 'Eq. 6: biased std (ddof 0)')),
    'one_pass_var_f64_ddof0': ('float64', ('Eq. 4: biased std (ddof 0)', 'Eq. 6: biased std (ddof 0)')),
    'weights_normalized': ('float32', ('Eq. 7: weights normalized to sum 1 (w / sum w)',)),
    'no_std_eq4_and_clip': ('float32', ('Eq. 4: no division by the std', 'after Eq. 6: advantages clipped to [-3, 3]')),
    'loo_baseline_and_no_eq6': ('float64', ("Eq. 4: leave-one-out baseline (the mean of the group's other members)", 'Eq. 6: none (no batch whitening)')),
    'eps_in_sqrt_and_ddof0': ('float32', ('Eq. 4: biased std (ddof 0)', "Eq. 4: eps added to the variance: sqrt(var + the call's eps)", 'Eq. 6: biased std (ddof 0)', "Eq. 6: eps added to the variance: sqrt(var + the call's eps)")),
    'eq6_per_group_and_weights_normalized': ('float32', ('Eq. 7: weights normalized to sum 1 (w / sum w)', 'Eq. 6: within each prompt group, not over the batch')),
    'batch_std_and_grpo_sum': ('float32', ('Eq. 7: weights applied to the rewards before Eq. 4 (GRPO on the weighted sum)', "Eq. 4 (on the weighted sum): divides by the std of the column over the whole batch, not the group's")),
}
