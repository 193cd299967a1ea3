"""impl.gdpo inside ms-swift's GRPO trainer (``swift rlhf --rlhf_type grpo --scale_rewards gdpo``).

ms-swift (4.6) computes its GDPO (``scale_rewards='gdpo'``) in a plain if/elif
(``swift.rl_core.advantage.compute_advantages``) called from
``GRPOTrainer._compute_advantages``. :class:`GDPOGRPOTrainer` overrides that method: it lets
ms-swift compute and log as usual (its reward metrics and ``_logs``), then returns
:func:`impl.gdpo.gdpo_advantages` of the same gathered ``(N, K)`` rewards instead, which
ms-swift slices per process and writes into the batch as it does its own. The plugin file
for ``--external_plugins`` makes the trainer factory build this class for ``grpo``::

    pip install 'gdpo-spec[swift]'
    swift rlhf --rlhf_type grpo --scale_rewards gdpo ... \\
        --external_plugins "$(python3 -m impl.integrations.swift)"

``python3 -m impl.integrations.swift`` prints the plugin file's path (:func:`plugin_path`);
the file calls :func:`register`, which sets ``TrainerFactory.TRAINER_MAPPING['grpo']``. It
lives alone in its folder because ms-swift puts a plugin's folder on ``sys.path``: a folder
holding this module (``swift.py``) would hide the real ``swift`` package.

What is decided here:

* ``--scale_rewards gdpo`` is required (the class refuses when built, and at each call, otherwise): loading
  the plugin for another scaling would otherwise compute something else than asked.
  ``--advantage_estimator grpo`` too (rloo and reinforce_plus_plus are not GDPO).
  ms-swift itself turns ``kl_in_reward`` off under gdpo (with its warning).
* A ``None`` reward (NaN) is "not scored" (``gdpo_missing = "unscored"``, the default), as
  ms-swift's nanmean reads it: left out of its column's Eq. 4 statistics, 0 there; a row with
  no scored reward gets 0 and is left out of Eq. 6 (ms-swift keeps such rows, with 0, in its
  batch mean and std). ``gdpo_missing = "refuse"`` on a subclass stops at the first None.
* ``num_generations_eval = 1``: evaluation advantages are 0, as ms-swift's formula gives;
  impl (which refuses groups of one) is not called.
* Multi-turn runs whose number of samples per prompt varies (``dynamic_num_samples``, the
  request-aware path) are refused: that path groups by request, which is not wired here.
* ms-swift versions: only those tested (:data:`SUPPORTED_SWIFT`).

Without the plugin ms-swift is unchanged: nothing is patched at import.
"""

from __future__ import annotations

import sys
from pathlib import Path

from impl.integrations._common import MISSING_POLICIES, batch_advantages, check_version

__all__ = ["GDPOGRPOTrainer", "GDPOSwiftMixin", "SUPPORTED_SWIFT", "check_swift_version", "plugin_path", "register"]

#: The ms-swift releases this integration was tested on: ``low <= version < high``.
SUPPORTED_SWIFT = ("4.6.0", "4.7.0")

#: The name the trainer factory resolves (``module.Class``, imported by ms-swift itself).
TRAINER_PATH = "impl.integrations.swift.GDPOGRPOTrainer"


def plugin_path() -> str:
    """The absolute path of the ``--external_plugins`` file."""
    return str(Path(__file__).resolve().parent / "swift_plugin" / "gdpo_swift_plugin.py")


def check_swift_version(version: str | None = None) -> str:
    """The installed ms-swift version (or ``version``), or a RuntimeError naming the supported range."""
    return check_version("ms-swift", "ms-swift", SUPPORTED_SWIFT, "impl.integrations.swift",
                         "overrides GRPOTrainer._compute_advantages", version)


def register() -> None:
    """Make ms-swift's trainer factory build :class:`GDPOGRPOTrainer` for ``rlhf_type='grpo'``
    (what the plugin file does)."""
    check_swift_version()
    from swift.trainers.trainer_factory import TrainerFactory

    TrainerFactory.TRAINER_MAPPING["grpo"] = TRAINER_PATH


class GDPOSwiftMixin:
    """Put before ms-swift's ``GRPOTrainer`` (or a subclass) in the bases (module docstring)."""

    #: as in impl.integrations.trl: "unscored" (ms-swift's reading of None) or "refuse"
    gdpo_missing = "unscored"

    def __init__(self, *args, **kwargs):
        check_swift_version()
        super().__init__(*args, **kwargs)
        self._gdpo_check_config()

    def _gdpo_check_config(self):
        name = type(self).__name__
        if self.scale_rewards != "gdpo":
            raise ValueError(f"{name} (the gdpo-spec plugin) computes GDPO with impl.gdpo, but scale_rewards is "
                             f"{self.scale_rewards!r}: pass --scale_rewards gdpo, or drop the plugin from "
                             "--external_plugins")
        if self.advantage_estimator != "grpo":
            raise ValueError(f"{name} computes GDPO, but advantage_estimator is {self.advantage_estimator!r}: pass "
                             "--advantage_estimator grpo, or drop the plugin from --external_plugins")
        if self.dynamic_num_samples:
            raise ValueError(f"{name}: the request-aware path (multi-turn, a varying number of samples per prompt) "
                             "is not supported by the gdpo-spec plugin; drop it from --external_plugins")
        if self.gdpo_missing not in MISSING_POLICIES:
            raise ValueError(f"gdpo_missing is {self.gdpo_missing!r}; expected one of {MISSING_POLICIES}")

    def gdpo_advantages(self, rewards_per_func, group_size: int, mode: str = "train"):
        """impl.gdpo's advantages of the whole gathered batch: (N,) float32 on the rewards' device
        (0 for groups of one: evaluation with one generation)."""
        return batch_advantages(self, rewards_per_func, group_size, self.gdpo_missing, mode)

    def _compute_advantages(self, samples, rewards_per_func, batch_encoded_inputs):
        self._gdpo_check_config()
        theirs = super()._compute_advantages(samples, rewards_per_func, batch_encoded_inputs)  # logs as usual
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        ours = self.gdpo_advantages(rewards_per_func, group_size, mode)
        if ours.shape != theirs.shape:
            raise RuntimeError(f"{type(self).__name__}: ms-swift's advantages have shape {tuple(theirs.shape)}, "
                               f"impl's {tuple(ours.shape)}")
        # ms-swift appends these to _logs['advantages'] and slices them per process itself.
        return ours.to(theirs.device)


_TRAINER = None


def _trainer_class():
    global _TRAINER
    if _TRAINER is None:
        check_swift_version()
        from swift.rlhf_trainers.grpo_trainer import GRPOTrainer

        class GDPOGRPOTrainer(GDPOSwiftMixin, GRPOTrainer):
            """ms-swift's ``GRPOTrainer`` whose advantages are impl.gdpo's (see :mod:`impl.integrations.swift`)."""

        GDPOGRPOTrainer.__module__ = __name__
        GDPOGRPOTrainer.__qualname__ = "GDPOGRPOTrainer"
        _TRAINER = GDPOGRPOTrainer
    return _TRAINER


def __getattr__(name):
    if name == "GDPOGRPOTrainer":
        return _trainer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    print(plugin_path())
    sys.exit(0)
