"""The verl integration (impl/integrations/verl.py) on batches shaped like a real run.

    python -m benchmarks.verl_integration     # in an environment with verl 0.9.1 and this package installed

Legacy-trainer batches (what verl's ``compute_advantage`` gets with ``trainer.use_v1=False``):
prompts of 8 or 16 responses, response lengths log-normal around 600 tokens (16 to T),
accuracy 0/1 (each prompt its own rate) and format 0, 0.5 or 1. Printed:

* how far apart the two Eq. 6 weightings put a response's advantage (``gdpo_whiten=sample``,
  the default, and ``token``, verl's weighting), and each from verl's own ``gdpo``, on
  1024 responses, three seeds, with accuracy independent of length and with shorter
  answers more often right;
* the time of one ``compute_advantage`` call (median of 5) for verl's own, ``sample``, ``token``;
* the plugin's import cost in a fresh process (after torch and numpy, which verl imports).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import torch

KEYS = ["accuracy", "format"]


def batch(n_prompts: int, n: int, t: int, seed: int, shorter_right: bool):
    from verl import DataProto

    rng = np.random.default_rng(seed)
    b = n_prompts * n
    lengths = np.clip(rng.lognormal(np.log(600), 0.7, b), 16, t).astype(np.int64)
    p_acc = rng.uniform(0.1, 0.9, n_prompts).repeat(n)
    if shorter_right:
        p_acc = np.clip(p_acc + 0.3 * (np.median(lengths) - lengths) / lengths.std(), 0.02, 0.98)
    acc = (rng.uniform(size=b) < p_acc).astype(np.float64)
    fmt = rng.choice([0.0, 0.5, 1.0], b, p=[0.1, 0.2, 0.7])
    length = torch.as_tensor(lengths)
    response_mask = (torch.arange(t) < length[:, None]).to(torch.int64)
    p = 64
    scores = torch.zeros(b, t)
    scores[torch.arange(b), length - 1] = torch.as_tensor(acc + fmt, dtype=torch.float32)
    return DataProto.from_dict(
        tensors={"prompts": torch.zeros(b, p, dtype=torch.int64),
                 "attention_mask": torch.cat([torch.ones(b, p, dtype=torch.int64), response_mask], 1),
                 "response_mask": response_mask, "token_level_rewards": scores},
        non_tensors={"uid": np.array([f"p{i // n}" for i in range(b)], dtype=object), "accuracy": acc,
                     "format": fmt})


def config(**extra):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"adv_estimator": "gdpo", "norm_adv_by_std_in_grpo": True, "gdpo_reward_keys": KEYS,
                            **extra})
    OmegaConf.set_struct(cfg, True)
    return cfg


MODES = {"verl": {}, "sample": {"gdpo_impl": "gdpo_spec"}, "token": {"gdpo_impl": "gdpo_spec", "gdpo_whiten": "token"}}


def advantages(data, cfg):
    from verl.trainer.ppo.ray_trainer import compute_advantage

    return compute_advantage(data, adv_estimator="gdpo", config=cfg).batch["advantages"]


def per_response(a, data):
    mask = data.batch["response_mask"]
    return a[torch.arange(a.shape[0]), mask.argmax(1)].double()


def main() -> None:
    import verl  # noqa: F401 - loads the plugin through its entry point

    print(f"load average {os.getloadavg()[0]:.1f}; torch threads {torch.get_num_threads()}")
    for shorter_right in (False, True):
        for seed in range(3):
            data = batch(128, 8, 4096, seed, shorter_right)
            v = {k: per_response(advantages(data, config(**m)), data) for k, m in MODES.items()}
            d = (v["sample"] - v["token"]).abs()
            print(f"shorter answers more often right={shorter_right} seed={seed}, 1024 responses: "
                  f"|sample - token| max {d.max():.4f} mean {d.mean():.4f}; |sample - verl| max "
                  f"{(v['sample'] - v['verl']).abs().max():.4f}; |token - verl| max "
                  f"{(v['token'] - v['verl']).abs().max():.2e}")
    for n_prompts, n, t in [(64, 8, 1024), (128, 8, 4096), (256, 16, 2048)]:
        data = batch(n_prompts, n, t, 0, False)
        for mode, extra in MODES.items():
            cfg = config(**extra)
            advantages(data, cfg)
            times = []
            for _ in range(5):
                start = time.perf_counter()
                advantages(data, cfg)
                times.append(time.perf_counter() - start)
            print(f"B={n_prompts * n} T={t} {mode}: {1e3 * sorted(times)[2]:.1f} ms per compute_advantage")
    code = ("import time, torch, numpy\nt = time.perf_counter()\nimport impl.integrations.verl\n"
            "print(round(1e3 * (time.perf_counter() - t)))")
    ms = [int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
          for _ in range(5)]
    print(f"import impl.integrations.verl (after torch, numpy): {sorted(ms)[2]} ms median of 5 ({ms})")


if __name__ == "__main__":
    main()
