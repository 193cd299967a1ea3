"""What the framework integrations share: the version gate, the missing-reward policy and the
call of impl.gdpo on a gathered batch. Imports no framework."""

from __future__ import annotations

import importlib
import types
from importlib import metadata

import torch

from impl import gdpo

#: impl.gdpo's ``missing`` policies a trainer's ``gdpo_missing`` may name (docs/integrations.md).
MISSING_POLICIES = ("unscored", "refuse")


def check_version(distribution: str, name: str, supported: tuple[str, str], module: str, what: str,
                  version: str | None = None, install: str | None = None) -> str:
    """The installed version of ``distribution`` (``name`` in messages), or of ``version``, or an
    error naming the supported range and how to install it (``install``: where a plain pip install
    of the range is not the way)."""
    from packaging.version import Version  # a dependency of transformers, hence of both frameworks

    low, high = supported
    if version is None:
        try:
            version = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            raise ImportError(f"{module} needs {name}: "
                              + (install or f"pip install '{distribution}>={low},<{high}'")) from None
    if not Version(low) <= Version(version) < Version(high):
        raise RuntimeError(f"{module} was tested on {name} >={low},<{high}; {name} {version} is "
                           f"installed. It {what}, which other releases may change: install "
                           f"'{distribution}>={low},<{high}'.")
    return version


class TrainerMixin:
    """What the trainers' mixins share: the missing-reward policy and impl.gdpo on the batch
    gathered from every process."""

    gdpo_missing = "unscored"  # one of MISSING_POLICIES

    def _gdpo_check_missing(self):
        if self.gdpo_missing not in MISSING_POLICIES:
            raise ValueError(f"gdpo_missing is {self.gdpo_missing!r}; expected one of {MISSING_POLICIES}")

    def _gdpo_mode(self) -> tuple[str, int]:
        """("train" or "eval", the group size of that mode)."""
        mode = "train" if self.model.training else "eval"
        return mode, self.num_generations if mode == "train" else self.num_generations_eval

    def gdpo_advantages(self, rewards: torch.Tensor, group_size: int, mode: str = "train") -> torch.Tensor:
        """impl.gdpo's (N,) float32 advantages of the (N, K) rewards gathered from every process,
        contiguous groups of ``group_size`` (of one: 0, as both frameworks give), the trainer's
        ``reward_weights``. The rows no reward function scored are counted in the trainer's metric
        ``gdpo/unscored_rows``, so that what the policy left out is never silent."""
        self._gdpo_check_missing()
        if group_size == 1:
            self._metrics[mode]["gdpo/unscored_rows"].append(float(torch.isnan(rewards).all(dim=1).sum()))
            return torch.zeros(rewards.shape[0], dtype=torch.float32, device=rewards.device)
        diagnostics = gdpo.Diagnostics()
        try:
            advantages = gdpo.gdpo_advantages(rewards, group_size=group_size, weights=self.reward_weights.tolist(),
                                              missing=self.gdpo_missing, diagnostics=diagnostics)
        except gdpo.GDPOError as exc:
            names = ", ".join(f"{k} = {name!r}" for k, name in enumerate(self.reward_func_names))
            exc.add_note(f"in {type(self).__name__}: rows of the batch gathered from every process "
                         f"({rewards.shape[0]} rows, groups of {group_size}); reward columns: {names}")
            raise
        self._metrics[mode]["gdpo/unscored_rows"].append(float(diagnostics.unscored_rows))
        return advantages


def lazy_trainer(module: str, name: str, mixin: type, check, base: str, doc: str):
    """The ``__getattr__`` of ``module``: its class ``name`` (``mixin`` before the framework's
    trainer ``base``, "module.Class") is built on first access, after ``check()``: importing the
    module imports no framework."""
    built = []

    def __getattr__(attr):
        if attr != name:
            raise AttributeError(f"module {module!r} has no attribute {attr!r}")
        if not built:
            check()
            where, _, cls = base.rpartition(".")
            built.append(types.new_class(name, (mixin, getattr(importlib.import_module(where), cls)),
                                         exec_body=lambda ns: ns.update(__doc__=doc, __module__=module)))
        return built[0]
    return __getattr__
