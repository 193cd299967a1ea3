"""What the framework integrations share: the version gate, the missing-reward policy and the
call of impl.gdpo on a gathered batch. Imports no framework."""

from __future__ import annotations

from importlib import metadata

import torch

from impl import gdpo

#: "unscored": a NaN reward (a reward function's None) was not scored: left out of its column's
#: Eq. 4 statistics, 0 there; a row with no scored reward gets 0 and is left out of Eq. 6 (TRL's
#: and ms-swift's reading). "refuse": the first NaN stops training (impl.gdpo's NonFiniteError).
MISSING_POLICIES = ("unscored", "refuse")


def check_version(distribution: str, supported: tuple[str, str], module: str, what: str,
                  version: str | None = None) -> str:
    """The installed version of ``distribution`` (or ``version``), or an error naming the range."""
    from packaging.version import Version  # a dependency of transformers, hence of both frameworks

    low, high = supported
    if version is None:
        try:
            version = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            raise ImportError(f"{module} needs {distribution}: pip install '{distribution}>={low},<{high}'") from None
    if not Version(low) <= Version(version) < Version(high):
        raise RuntimeError(f"{module} was tested on {distribution} >={low},<{high}; {distribution} {version} is "
                           f"installed. It {what}, which other releases may change: install "
                           f"'{distribution}>={low},<{high}'.")
    return version


def batch_advantages(trainer, rewards: torch.Tensor, group_size: int, policy: str) -> torch.Tensor:
    """impl.gdpo's advantages of a batch gathered from every process ((N, K) rewards, contiguous
    groups of ``group_size``, the trainer's ``reward_weights``): (N,) float32 on the rewards' device.
    Groups of one (evaluation with one generation) give 0, as both frameworks' formulas do."""
    if policy not in MISSING_POLICIES:
        raise ValueError(f"gdpo_missing is {policy!r}; expected one of {MISSING_POLICIES}")
    if group_size == 1:
        return torch.zeros(rewards.shape[0], dtype=torch.float32, device=rewards.device)
    missing = {} if policy == "refuse" else {"missing": policy}  # "refuse" is impl.gdpo's default
    try:
        return gdpo.gdpo_advantages(rewards, group_size=group_size, weights=trainer.reward_weights.tolist(),
                                    **missing)
    except gdpo.GDPOError as exc:
        names = ", ".join(f"{k} = {name!r}" for k, name in enumerate(trainer.reward_func_names))
        exc.add_note(f"in {type(trainer).__name__}: rows of the batch gathered from every process "
                     f"({rewards.shape[0]} rows, groups of {group_size}); reward columns: {names}")
        raise
