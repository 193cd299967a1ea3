"""impl.gdpo inside TRL's ``GRPOTrainer``: :class:`GDPOMixin` replaces the advantages TRL
computes inline (docs/integrations.md, "TRL"); ``GDPOTrainer`` is built on first access."""

from __future__ import annotations

import logging

from impl.integrations._common import TrainerMixin, check_version, lazy_trainer

__all__ = ["GDPOMixin", "GDPOTrainer", "SUPPORTED_TRL", "check_trl_version"]

#: The TRL releases this integration was tested on: ``low <= version < high``. It reads TRL's
#: private ``_calculate_rewards`` and ``_logs``, which a minor release may change.
SUPPORTED_TRL = ("1.16.0", "1.17.0")

logger = logging.getLogger(__name__)


def check_trl_version(version: str | None = None) -> str:
    """The installed TRL version (or ``version``), or a RuntimeError naming the supported range."""
    return check_version("trl", "TRL", SUPPORTED_TRL, "impl.integrations.trl",
                         "replaces advantages inside GRPOTrainer's private methods", version)


class GDPOMixin(TrainerMixin):
    """Put before TRL's ``GRPOTrainer`` (or a subclass) in the bases.
    ``gdpo_missing``: "unscored" (TRL's reading of a None reward, the default) or "refuse"."""

    def __init__(self, *args, **kwargs):
        check_trl_version()
        super().__init__(*args, **kwargs)
        if self.multi_objective_aggregation != "normalize_then_sum":
            raise ValueError(
                f"{type(self).__name__} computes GDPO (TRL's multi_objective_aggregation='normalize_then_sum') with "
                f"impl.gdpo, but args.multi_objective_aggregation is {self.multi_objective_aggregation!r}: set "
                "GRPOConfig(multi_objective_aggregation='normalize_then_sum'), or use trl.GRPOTrainer")
        self._gdpo_check_missing()
        self._gdpo_rewards = None
        if self.num_generations_eval == 1 and self.args.eval_strategy != "no":
            logger.warning("num_generations_eval=1: evaluation groups have one completion each, so their advantages "
                           "are 0 (as TRL's own formula gives); impl.gdpo is not called for them")

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._gdpo_rewards = rewards  # gathered: (N, K), every process's rows
        return rewards

    def _generate_and_score_completions(self, inputs):
        self._gdpo_rewards = None
        out = super()._generate_and_score_completions(inputs)
        rewards, self._gdpo_rewards = self._gdpo_rewards, None
        if rewards is None:
            raise RuntimeError(f"{type(self).__name__}: TRL computed advantages without calling _calculate_rewards; "
                               "this TRL does not work the way impl.integrations.trl was written for")
        mode, group_size = self._gdpo_mode()
        advantages = self.gdpo_advantages(rewards, group_size, mode)
        n = len(inputs)
        start = self.accelerator.process_index * n
        local = advantages[start:start + n]
        if local.shape != out["advantages"].shape:
            raise RuntimeError(f"{type(self).__name__}: this process's advantages have shape "
                               f"{tuple(out['advantages'].shape)} in TRL but {tuple(local.shape)} here "
                               f"(rows {start}..{start + n - 1} of {advantages.shape[0]} gathered)")
        out["advantages"] = local.to(out["advantages"].device)
        # TRL appended the whole batch's advantages to this bounded deque: replace those entries.
        logged = self._logs["advantages"]
        m = min(advantages.shape[0], len(logged))
        for _ in range(m):
            logged.pop()
        logged.extend(advantages[advantages.shape[0] - m:].tolist())
        return out


__getattr__ = lazy_trainer(__name__, "GDPOTrainer", GDPOMixin, check_trl_version, "trl.GRPOTrainer",
                           "TRL's ``GRPOTrainer`` whose advantages are impl.gdpo's (see :mod:`impl.integrations.trl`).")
