"""impl.gdpo inside ms-swift's GRPO trainer: :class:`GDPOGRPOTrainer`, its plugin file and
:func:`register` (docs/integrations.md, "ms-swift")."""

from __future__ import annotations

import sys
from pathlib import Path

from impl.integrations._common import TrainerMixin, check_version, lazy_trainer

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
    low, high = SUPPORTED_SWIFT
    return check_version("ms-swift", "ms-swift", SUPPORTED_SWIFT, "impl.integrations.swift",
                         "overrides GRPOTrainer._compute_advantages", version,
                         install=f"in an environment without TRL 1.x, the [swift] extra (what ms-swift's trainers "
                                 f"import), then pip install --no-deps 'ms-swift>={low},<{high}' "
                                 f"(docs/integrations.md#ms-swift; ms-swift's own dependencies miss some)")


def register() -> None:
    """Make ms-swift's trainer factory build :class:`GDPOGRPOTrainer` for ``rlhf_type='grpo'``
    (what the plugin file does)."""
    check_swift_version()
    from swift.trainers.trainer_factory import TrainerFactory

    TrainerFactory.TRAINER_MAPPING["grpo"] = TRAINER_PATH


class GDPOSwiftMixin(TrainerMixin):
    """Put before ms-swift's ``GRPOTrainer`` (or a subclass) in the bases.
    ``gdpo_missing``: "unscored" (ms-swift's reading of None, the default) or "refuse"."""

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
        self._gdpo_check_missing()

    def _compute_advantages(self, samples, rewards_per_func, batch_encoded_inputs):
        self._gdpo_check_config()
        theirs = super()._compute_advantages(samples, rewards_per_func, batch_encoded_inputs)  # logs as usual
        mode, group_size = self._gdpo_mode()
        ours = self.gdpo_advantages(rewards_per_func, group_size, mode)
        if ours.shape != theirs.shape:
            raise RuntimeError(f"{type(self).__name__}: ms-swift's advantages have shape {tuple(theirs.shape)}, "
                               f"impl's {tuple(ours.shape)}")
        return ours.to(theirs.device)  # ms-swift logs them and slices them per process


__getattr__ = lazy_trainer(__name__, "GDPOGRPOTrainer", GDPOSwiftMixin, check_swift_version,
                           "swift.rlhf_trainers.grpo_trainer.GRPOTrainer",
                           "ms-swift's ``GRPOTrainer`` whose advantages are impl.gdpo's (see "
                           ":mod:`impl.integrations.swift`).")


if __name__ == "__main__":
    print(plugin_path())
    sys.exit(0)
