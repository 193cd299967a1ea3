"""What the framework integrations share: the version gate, the missing-reward policy and the
call of impl.gdpo on a gathered batch. Imports no framework."""

from __future__ import annotations

import types
from importlib import metadata

import torch

from impl import gdpo

#: "unscored": a NaN reward (a reward function's None) was not scored: left out of its column's
#: Eq. 4 statistics, 0 there; a row with no scored reward gets 0 and is left out of Eq. 6 (TRL's
#: and ms-swift's reading). "refuse": the first NaN stops training (impl.gdpo's NonFiniteError).
MISSING_POLICIES = ("unscored", "refuse")


def check_version(distribution: str, name: str, supported: tuple[str, str], module: str, what: str,
                  version: str | None = None) -> str:
    """The installed version of ``distribution`` (``name`` in messages), or of ``version``, or an
    error naming the supported range."""
    from packaging.version import Version  # a dependency of transformers, hence of both frameworks

    low, high = supported
    if version is None:
        try:
            version = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            raise ImportError(f"{module} needs {name}: pip install '{distribution}>={low},<{high}'") from None
    if not Version(low) <= Version(version) < Version(high):
        raise RuntimeError(f"{module} was tested on {name} >={low},<{high}; {name} {version} is "
                           f"installed. It {what}, which other releases may change: install "
                           f"'{distribution}>={low},<{high}'.")
    return version


def batch_advantages(trainer, rewards: torch.Tensor, group_size: int, policy: str, mode: str) -> torch.Tensor:
    """impl.gdpo's advantages of a batch gathered from every process ((N, K) rewards, contiguous
    groups of ``group_size``, the trainer's ``reward_weights``): (N,) float32 on the rewards' device.
    Groups of one (evaluation with one generation) give 0, as both frameworks' formulas do.

    The count of rows no reward function scored (advantage 0, outside Eq. 6) is appended to the
    trainer's metric ``gdpo/unscored_rows`` (``trainer._metrics[mode]``, logged as the
    frameworks log theirs), so what the policy left out is never silent."""
    if policy not in MISSING_POLICIES:
        raise ValueError(f"gdpo_missing is {policy!r}; expected one of {MISSING_POLICIES}")
    if group_size == 1:
        trainer._metrics[mode]["gdpo/unscored_rows"].append(float(torch.isnan(rewards).all(dim=1).sum()))
        return torch.zeros(rewards.shape[0], dtype=torch.float32, device=rewards.device)
    diagnostics = gdpo.Diagnostics()
    try:
        advantages = gdpo.gdpo_advantages(rewards, group_size=group_size, weights=trainer.reward_weights.tolist(),
                                          missing=policy, diagnostics=diagnostics)
    except gdpo.GDPOError as exc:
        names = ", ".join(f"{k} = {name!r}" for k, name in enumerate(trainer.reward_func_names))
        exc.add_note(f"in {type(trainer).__name__}: rows of the batch gathered from every process "
                     f"({rewards.shape[0]} rows, groups of {group_size}); reward columns: {names}")
        raise
    trainer._metrics[mode]["gdpo/unscored_rows"].append(float(diagnostics.unscored_rows))
    return advantages


def lazy_trainer(module: str, name: str, mixin: type, check, base, doc: str):
    """The ``__getattr__`` of ``module``: its class ``name`` (``mixin`` before the framework's trainer,
    ``base()``) is built on first access, after ``check()`` (the framework's version), so that
    importing the module imports no framework."""
    built = []

    def __getattr__(attr):
        if attr != name:
            raise AttributeError(f"module {module!r} has no attribute {attr!r}")
        if not built:
            check()
            built.append(types.new_class(name, (mixin, base()),
                                         exec_body=lambda ns: ns.update(__doc__=doc, __module__=module)))
        return built[0]
    return __getattr__
