"""Built-in example batches, named, shared by the CLI, the tests and the spec document."""

from __future__ import annotations

import numpy as np

#: The brief's two-group example: in group A one reward varies, in group B both do.
#: GRPO (sum, then standardize) cannot tell them apart; GDPO keeps B twice as strong.
TWO_GROUP = {
    "rewards": np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]),
    "group_ids": np.array([0, 0, 1, 1]),
    "columns": ("correctness", "format"),
}

#: correctness = [1, 1, 0, 0] and length = [0, 100, 200, 300] in one group: the
#: raw sum ranks the long wrong answer first; GDPO gives its best advantage to a
#: correct response.
CORRECTNESS_LENGTH = {
    "rewards": np.array([[1.0, 0.0], [1.0, 100.0], [0.0, 200.0], [0.0, 300.0]]),
    "group_ids": np.array([0, 0, 0, 0]),
    "columns": ("correctness", "length"),
}

EXAMPLES = {"two_group": TWO_GROUP, "correctness_length": CORRECTNESS_LENGTH}


def grpo_reference(rewards: np.ndarray, group_ids: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Plain float64 GRPO (sum the rewards, standardize per group) for comparison tables."""
    s = rewards.sum(axis=1)
    out = np.empty_like(s)
    for g in np.unique(group_ids):
        m = group_ids == g
        out[m] = (s[m] - s[m].mean()) / (s[m].std(ddof=1) + eps)
    return out
