"""impl.integrations.swift against the installed ms-swift (issue 26): the plugin file loaded by
ms-swift's own ``--external_plugins`` loader makes its trainer factory build GDPOGRPOTrainer,
whose ``_compute_advantages`` returns impl.gdpo's advantages bit for bit (ms-swift's own
method runs first, for its logs); without the plugin ms-swift is unchanged.

The cases of tests/test_integration_swift.py, which runs them where ms-swift imports: in its
own process, or under the interpreter ``GDPO_SWIFT_PYTHON`` names (ms-swift 4.6.0 needs TRL
< 1.0, so CI gives it an environment of its own)."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _frameworks import import_framework  # noqa: E402

swift_grpo = import_framework("swift.rlhf_trainers.grpo_trainer", "see tests/test_integration_swift.py")

from swift.trainers.trainer_factory import TrainerFactory  # noqa: E402
from swift.utils import import_external_file  # noqa: E402

from impl import gdpo  # noqa: E402
from impl.integrations import swift as gdpo_swift  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
G = 4
WEIGHTS = [0.75, 1.5]


@pytest.fixture(scope="module")
def plugged():
    """The trainer class ms-swift's factory builds for grpo once the plugin file, whose path
    ``python3 -m impl.integrations.swift`` prints, is loaded by ms-swift's own loader (as
    ``--external_plugins`` does). The factory's table is restored afterwards."""
    path = Path(subprocess.run([sys.executable, "-m", "impl.integrations.swift"], cwd=ROOT, capture_output=True,
                               text=True, check=True, timeout=120).stdout.strip())
    assert path == Path(gdpo_swift.plugin_path()) and path.is_file()
    assert sorted(p.name for p in path.parent.glob("*.py")) == ["__init__.py", path.name]  # nothing to shadow
    saved = TrainerFactory.TRAINER_MAPPING["grpo"]
    assert saved == "swift.rlhf_trainers.GRPOTrainer"  # ms-swift's own, before the plugin
    try:
        import_external_file(str(path))
        assert TrainerFactory.TRAINER_MAPPING["grpo"] == "impl.integrations.swift.GDPOGRPOTrainer"
        cls = TrainerFactory.get_trainer_cls(types.SimpleNamespace(rlhf_type="grpo"))
        assert cls.__name__ == "GDPOGRPOTrainer" and issubclass(cls, swift_grpo.GRPOTrainer)
        yield cls
    finally:
        TrainerFactory.TRAINER_MAPPING["grpo"] = saved


def _instance(cls, training=True, **kw):
    """An instance carrying the state ``_compute_advantages`` reads (what ms-swift's __init__
    sets from its arguments); building a whole ms-swift trainer needs a registered model."""
    self = cls.__new__(cls)
    state = dict(model=types.SimpleNamespace(training=training), num_generations=G, num_generations_eval=G,
                 scale_rewards="gdpo", advantage_estimator="grpo", kl_in_reward=False, beta=0.04,
                 dynamic_num_samples=False, reward_weights=torch.tensor(WEIGHTS),
                 reward_func_names=["acc", "fmt"],
                 _metrics={"train": collections.defaultdict(list), "eval": collections.defaultdict(list)},
                 _logs={"rewards": collections.defaultdict(list)})
    state.update(kw)
    for k, v in state.items():
        setattr(self, k, v)
    return self


def _rewards(n_groups=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 5, (n_groups * G, 2), generator=g).float() / 4


def test_factory_builds_impls_advantages_bit_for_bit(plugged):
    rewards = _rewards()
    trainer = _instance(plugged)
    ours = trainer._compute_advantages([], rewards, [])
    expected = gdpo.gdpo_advantages(rewards, group_size=G, weights=WEIGHTS)
    assert torch.equal(ours, expected)
    # ms-swift's own method ran first: its metrics and reward logs are there
    assert trainer._metrics["train"]["reward"] and trainer._logs["rewards"]["acc"] == rewards[:, 0].tolist()
    # negative control: ms-swift's own gdpo gives other bits on the same rewards
    theirs = swift_grpo.GRPOTrainer._compute_advantages(_instance(plugged), [], rewards, [])
    assert not torch.equal(theirs, ours)


def test_unscored_rewards(plugged):
    rewards = _rewards()
    rewards[1] = float("nan")  # scored by no function: 0, out of Eq. 6
    rewards[6, 1] = float("nan")  # scored by the first only
    rewards[8:12, 0] = float("nan")  # a group the first function did not score (another task)
    ours = _instance(plugged)._compute_advantages([], rewards, [])
    expected = gdpo.gdpo_advantages(rewards, group_size=G, weights=WEIGHTS, missing="unscored")
    assert torch.equal(ours, expected) and ours[1] == 0 and not ours.isnan().any()


def test_eval_with_one_generation_gives_zero(plugged):
    rewards = _rewards()
    trainer = _instance(plugged, training=False, num_generations_eval=1)
    assert torch.equal(trainer._compute_advantages([], rewards, []), torch.zeros(rewards.shape[0]))


@pytest.mark.parametrize("setting, value, words", [
    ("scale_rewards", "group", "--scale_rewards gdpo"),
    ("advantage_estimator", "rloo", "--advantage_estimator grpo"),
    ("dynamic_num_samples", True, "request-aware path"),
])
def test_refuses_what_is_not_gdpo(plugged, setting, value, words):
    with pytest.raises(ValueError, match=words):
        _instance(plugged, **{setting: value})._compute_advantages([], _rewards(), [])


def test_refuses_untested_versions():
    import swift

    assert gdpo_swift.check_swift_version() == swift.__version__
    for version in ("4.5.9", "4.7.0", "5.0.0"):
        with pytest.raises(RuntimeError, match=r"tested on ms-swift >=4\.6\.0,<4\.7\.0; ms-swift " + version):
            gdpo_swift.check_swift_version(version)


def test_without_the_plugin_nothing_changes():
    """A fresh interpreter: importing impl.integrations.swift imports no ms-swift; building the
    class leaves ms-swift's GRPOTrainer and the factory's table as they were."""
    code = textwrap.dedent("""
        import sys
        import impl.integrations.swift as m
        assert "swift" not in sys.modules, "importing impl.integrations.swift imported swift"
        from swift.trainers.trainer_factory import TrainerFactory
        import swift.rlhf_trainers.grpo_trainer as g
        before = dict(vars(g.GRPOTrainer)), dict(TrainerFactory.TRAINER_MAPPING)
        cls = m.GDPOGRPOTrainer
        assert (dict(vars(g.GRPOTrainer)), dict(TrainerFactory.TRAINER_MAPPING)) == before
        assert TrainerFactory.TRAINER_MAPPING["grpo"] == "swift.rlhf_trainers.GRPOTrainer"
        m.register()
        assert TrainerFactory.TRAINER_MAPPING["grpo"] == "impl.integrations.swift.GDPOGRPOTrainer"
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_readme_lines_name_what_exists():
    """The README's ms-swift lines: the extra, the install, the plugin's path command."""
    text = (ROOT / "README.md").read_text()
    assert "pip install -e '.[swift]' && pip install --no-deps ms-swift==" + swift_version() in text
    assert '--rlhf_type grpo --scale_rewards gdpo' in text
    assert '--external_plugins "$(python3 -m impl.integrations.swift)"' in text


def swift_version():
    import swift

    return swift.__version__
