"""impl.integrations.verl against the real verl (0.9.1), loaded as verl loads it.

verl imports the ``verl.plugins`` entry point that ``pip install -e .`` declares
(pyproject.toml), so ``import verl`` alone must wrap verl's ``gdpo`` estimator; this
module never imports the integration before verl does. Then verl's own
``compute_advantage`` (trainer/ppo/ray_trainer.py) runs on batches shaped as verl's two
trainers shape them: the legacy trainer's (opted in: impl.gdpo's advantages bit for bit;
not opted in: verl's own function with the very same arguments) and the v1 trainer's
(opted in: an error naming ``trainer.use_v1=False``; not opted in: verl's own KeyError).

Without verl the module skips, unless ``GDPO_REQUIRE_INTEGRATIONS=1`` (CI), where a
missing verl fails. Importing verl takes seconds: one import per process (the fixture).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys

import numpy as np
import pytest
import torch

from impl.gdpo import GroupError, InputDtypeError, NonFiniteError, OutOfRangeError, gdpo_advantages, normalize_rewards, whiten

#: the slow tier (`python3 -m pytest -n auto -q -m slow`): the real frameworks, installed by .ci/run
pytestmark = pytest.mark.slow

REQUIRED = os.environ.get("GDPO_REQUIRE_INTEGRATIONS") == "1"
PLUGIN = "impl.integrations.verl"
KEYS = ["accuracy", "format"]
WEIGHTS = [1.0, 0.5]


@pytest.fixture(scope="module")
def verl():
    """verl imported here, first, so that only its plugin loader can import the integration."""
    plugin_before = PLUGIN in sys.modules and "verl" not in sys.modules
    if importlib.util.find_spec("verl") is None:
        if REQUIRED:
            pytest.fail("GDPO_REQUIRE_INTEGRATIONS=1 but verl is not installed; .ci/run installs verl==0.9.1",
                        pytrace=False)
        pytest.skip("verl is not installed; CI installs it (.ci/run)")
    # verl installed but one of its trainer's modules does not import: a failure, never a skip
    fresh = "verl" not in sys.modules
    import verl

    # the plugin waits for verl's core_algos, which `import verl` alone does not import
    lazy = fresh and "verl.trainer.ppo.core_algos" not in sys.modules and PLUGIN in sys.modules
    from verl.trainer.ppo import core_algos, ray_trainer
    from verl.trainer.ppo.v1 import utils as v1_utils
    return {"verl": verl, "core_algos": core_algos, "ray_trainer": ray_trainer, "v1_utils": v1_utils,
            "plugin_before": plugin_before, "fresh": fresh, "lazy": lazy}


def _algorithm(**extra):
    """config.algorithm as Hydra hands it to the trainer: a struct DictConfig."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"_target_": "verl.trainer.config.AlgoConfig", "gamma": 1.0, "lam": 1.0,
                            "adv_estimator": "gdpo", "norm_adv_by_std_in_grpo": True, "use_kl_in_reward": False,
                            "kl_penalty": "kl", "use_pf_ppo": False, "gdpo_reward_keys": KEYS,
                            "gdpo_reward_weights": WEIGHTS, **extra})
    OmegaConf.set_struct(cfg, True)
    return cfg


OPT_IN = {"gdpo_impl": "gdpo_spec"}


def _scores(n_prompts: int, n: int, rng) -> dict:
    return {"accuracy": rng.integers(0, 2, n_prompts * n).astype(np.float64).tolist(),
            "format": rng.choice([0.0, 0.5, 1.0], n_prompts * n).tolist()}


def _legacy(seed=0, n_prompts=6, n=4, p=8, t=24, scores=None, uids=None):
    """A batch as the legacy trainer (trainer.use_v1=False) hands it to compute_advantage:
    left-padded prompts, right-padded responses, the total score on the last response token,
    each reward key's scores in non_tensor_batch (np.array of compute_score's values)."""
    from verl import DataProto

    rng = np.random.default_rng(seed)
    b = n_prompts * n
    lengths = torch.as_tensor(rng.integers(1, t + 1, b))
    plen = torch.as_tensor(rng.integers(1, p + 1, b))
    response_mask = (torch.arange(t) < lengths[:, None]).to(torch.int64)
    prompt_mask = (torch.arange(p) >= p - plen[:, None]).to(torch.int64)
    scores = scores if scores is not None else _scores(n_prompts, n, rng)
    total = torch.tensor([sum(w * float(scores[k][i] or 0) for k, w in zip(KEYS, WEIGHTS)) for i in range(b)])
    tls = torch.zeros(b, t)
    tls[torch.arange(b), lengths - 1] = total.to(torch.float32)
    uid = np.array(uids if uids is not None else [f"prompt-{i // n}" for i in range(b)], dtype=object)
    non_tensors = {"uid": uid, **{k: np.array(v) for k, v in scores.items()}}
    return DataProto.from_dict(
        tensors={"prompts": torch.as_tensor(rng.integers(5, 100, (b, p))),
                 "responses": torch.as_tensor(rng.integers(5, 100, (b, t))),
                 "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
                 "response_mask": response_mask, "token_level_scores": tls, "token_level_rewards": tls.clone()},
        non_tensors=non_tensors)


def _expected_per_sample(data):
    """impl.gdpo on the same scores: float64 (B, K), one group per uid, Eq. 6 per sample."""
    r = torch.tensor(np.stack([np.asarray(data.non_tensor_batch[k], dtype=np.float64) for k in KEYS], axis=1))
    uids = list(data.non_tensor_batch["uid"])
    ids = torch.tensor([uids.index(u) for u in uids])
    a = gdpo_advantages(r, group_ids=ids, weights=WEIGHTS)
    mask = data.batch["response_mask"].bool()
    return r, ids, mask, torch.where(mask, a[:, None], torch.zeros((), dtype=a.dtype))


def _advantage(verl, data, cfg):
    out = verl["ray_trainer"].compute_advantage(data, adv_estimator=cfg.adv_estimator, config=cfg)
    return out.batch["advantages"], out.batch["returns"]


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_import_verl_loads_the_plugin_through_its_entry_point(verl):
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="verl.plugins") if ep.value == PLUGIN]
    assert eps, ("gdpo-spec's verl.plugins entry point is not installed: `pip install -e .` in this checkout "
                 "declares it (pyproject.toml)")
    assert not verl["plugin_before"], f"{PLUGIN} was imported before verl: this test would prove nothing"
    assert PLUGIN in sys.modules, "import verl did not import the plugin"
    from impl.integrations.verl import installed

    assert installed()
    registered = verl["core_algos"].ADV_ESTIMATOR_REGISTRY["gdpo"]
    assert registered._gdpo_spec_original is verl["core_algos"].compute_gdpo_outcome_advantage
    if verl["fresh"]:  # import verl alone left core_algos (seconds) to whoever needs it
        assert verl["lazy"]
    from impl.integrations.verl import _CoreAlgosFinder

    assert not any(isinstance(f, _CoreAlgosFinder) for f in sys.meta_path)  # used once, then gone


def test_opted_in_legacy_batch_is_impls_bit_for_bit(verl):
    data = _legacy()
    _, _, _, expected = _expected_per_sample(data)
    adv, ret = _advantage(verl, data, _algorithm(**OPT_IN))
    assert ret is adv
    assert _same_bits(adv, expected), (adv - expected).abs().max()
    # negative control: verl's own numbers on the same batch are others (the opt-in took effect)
    own, _ = _advantage(verl, _legacy(), _algorithm())
    assert not torch.equal(own, expected)


def test_token_weighted_option_is_impls_whiten_over_the_tokens(verl):
    data = _legacy(seed=1)
    r, ids, mask, per_sample = _expected_per_sample(data)
    c = normalize_rewards(r, group_ids=ids, weights=WEIGHTS)
    expected = torch.zeros(mask.shape, dtype=torch.float32)
    expected[mask] = whiten(c[:, None].expand(mask.shape)[mask])
    adv, _ = _advantage(verl, data, _algorithm(**OPT_IN, gdpo_whiten="token"))
    assert _same_bits(adv, expected)
    assert not torch.equal(adv, per_sample)  # lengths vary: token weighting moves the numbers


def test_without_the_opt_in_verl_runs_its_own_estimator_unchanged(verl):
    original = verl["core_algos"].compute_gdpo_outcome_advantage
    for cfg in (_algorithm(), _algorithm(gdpo_impl="verl")):
        data = _legacy(seed=2)
        adv, _ = _advantage(verl, data, cfg)
        own, _ = original(token_level_rewards=data.batch["token_level_rewards"],
                          response_mask=data.batch["response_mask"], index=data.non_tensor_batch["uid"],
                          config=cfg, non_tensor_batch=data.non_tensor_batch, batch=data.batch)
        assert _same_bits(adv, own)
    # verl's own handling of a lone response (mean 0, std 1) still runs: no refusal of ours
    lone = _legacy(seed=3, uids=[f"p{i // 4}" for i in range(23)] + ["alone"])
    _advantage(verl, lone, _algorithm())


def _v1(seed=0, n_prompts=4, n=4, t=16):
    """A batch as verl's v1 trainer (trainer.use_v1=True) builds it in _compute_advantage:
    only uid, response_mask, rm_scores (and log-probs) were fetched."""
    from verl import DataProto

    rng = np.random.default_rng(seed)
    b = n_prompts * n
    lengths = torch.as_tensor(rng.integers(1, t + 1, b))
    mask = (torch.arange(t) < lengths[:, None]).to(torch.int64)
    rm = torch.zeros(b, t)
    rm[torch.arange(b), lengths - 1] = torch.as_tensor(rng.integers(0, 2, b), dtype=torch.float32)
    data = DataProto.from_dict(tensors={"response_mask": mask, "rm_scores": rm})
    data.batch["token_level_scores"] = data.batch["rm_scores"]
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    data.non_tensor_batch["uid"] = np.array([f"u{i // n}" for i in range(b)], dtype=object)
    return data, [f"u{i // n}_0_{i}" for i in range(b)]


def test_v1_trainer_batch(verl):
    """The v1 trainer's advantage step (compute_advantage_for_multi_trajectories): opted in, an
    error naming the setting to change; not opted in, verl's own KeyError, as without us."""
    run = verl["v1_utils"].compute_advantage_for_multi_trajectories
    data, keys = _v1()
    from impl.integrations.verl import VerlIntegrationError

    with pytest.raises(VerlIntegrationError, match=r"trainer\.use_v1=False"):
        run(data, batch_keys=keys, adv_estimator="gdpo", config=_algorithm(**OPT_IN))
    data, keys = _v1()
    with pytest.raises(KeyError, match="prompts"):
        run(data, batch_keys=keys, adv_estimator="gdpo", config=_algorithm())


def test_refusals_name_the_setting_or_the_sample(verl):
    from impl.integrations.verl import VerlIntegrationError

    data = _legacy()
    cases = [
        (_algorithm(gdpo_impl="vetted"), VerlIntegrationError, r"algorithm\.gdpo_impl is 'vetted'"),
        (_algorithm(gdpo_whiten="token"), VerlIntegrationError, r"gdpo_impl=gdpo_spec"),
        (_algorithm(**OPT_IN, gdpo_whiten="tokens"), VerlIntegrationError, r"algorithm\.gdpo_whiten is 'tokens'"),
        (_algorithm(**{**OPT_IN, "gdpo_reward_keys": ["accuracy", "fmt"]}), VerlIntegrationError,
         r"names \['fmt'\], not in non_tensor_batch"),
        (_algorithm(**{**OPT_IN, "gdpo_reward_keys": None}), VerlIntegrationError, r"gdpo_reward_keys is not set"),
        (_algorithm(**{**OPT_IN, "gdpo_reward_keys": "accuracy"}), VerlIntegrationError, r"write a list"),
        (_algorithm(**{**OPT_IN, "gdpo_reward_weights": [1.0]}), VerlIntegrationError,
         r"gdpo_reward_weights has 1 weights"),
        (_algorithm(**{**OPT_IN, "norm_adv_by_std_in_grpo": False}), VerlIntegrationError,
         r"norm_adv_by_std_in_grpo=False"),
    ]
    for cfg, cls, match in cases:
        with pytest.raises(cls, match=match):
            _advantage(verl, data, cfg)
    lone = _legacy(uids=[f"p{i // 4}" for i in range(23)] + ["alone"])
    with pytest.raises(GroupError, match=r"uid 'alone' \(sample 23\) has 1 response.*rollout\.n"):
        _advantage(verl, lone, _algorithm(**OPT_IN))
    scores = _scores(6, 4, np.random.default_rng(0))
    scores["format"][5] = float("nan")
    with pytest.raises(NonFiniteError, match=r"non_tensor_batch\['format'\]\[5\] \(sample 5, uid 'prompt-1'\)"):
        _advantage(verl, _legacy(scores=scores), _algorithm(**OPT_IN))
    scores["format"][5] = None  # compute_score's dict without a value: np.array makes an object array
    with pytest.raises(InputDtypeError, match=r"non_tensor_batch\['format'\]\[5\] .* is None"):
        _advantage(verl, _legacy(scores=scores), _algorithm(**OPT_IN))
    for bad in (2, 0.5):  # a mask entry other than 0 and 1, integer or float
        data = _legacy()
        mask = data.batch["response_mask"].to(torch.float64 if bad == 0.5 else torch.int64)
        mask[3, 0] = bad
        data.batch["response_mask"] = mask
        with pytest.raises(OutOfRangeError, match=rf"response_mask\[3, 0\] \(sample 3, token 0\) is {bad}"):
            _advantage(verl, data, _algorithm(**OPT_IN))
    scores["format"] = [True, False] * 12
    with pytest.raises(InputDtypeError, match=r"non_tensor_batch\['format'\] has dtype bool"):
        _advantage(verl, _legacy(scores=scores), _algorithm(**OPT_IN))


def test_integer_scores_are_read_exactly(verl):
    """compute_score returning ints (np.array of them is int64) computes as the same floats."""
    floats = _scores(6, 4, np.random.default_rng(4))
    ints = {"accuracy": [int(x) for x in floats["accuracy"]], "format": [int(2 * x) for x in floats["format"]]}
    floats["format"] = [float(x) for x in ints["format"]]
    a, _ = _advantage(verl, _legacy(seed=4, scores=ints), _algorithm(**OPT_IN))
    b, _ = _advantage(verl, _legacy(seed=4, scores=floats), _algorithm(**OPT_IN))
    assert _same_bits(a, b)


def test_an_untested_verl_is_refused_only_when_opted_in(verl, monkeypatch):
    monkeypatch.setattr(verl["verl"], "__version__", "0.10.0")
    from impl.integrations.verl import VerlIntegrationError

    with pytest.raises(VerlIntegrationError, match=r"tested on verl 0\.9\.1 only; this is verl 0\.10\.0"):
        _advantage(verl, _legacy(), _algorithm(**OPT_IN))
    _advantage(verl, _legacy(), _algorithm())


def test_a_plugin_that_fails_to_load_logs_an_error(verl, monkeypatch, caplog):
    """verl logs a plugin's failure at debug level only; the plugin logs its own as an error."""
    from impl.integrations import verl as plugin

    monkeypatch.setattr(verl["core_algos"], "ADV_ESTIMATOR_REGISTRY", {})
    with caplog.at_level(logging.ERROR), pytest.raises(plugin.VerlIntegrationError, match="no 'gdpo'"):
        plugin._load_as_plugin()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name == PLUGIN]
    assert errors and "failed to load" in errors[0].getMessage(), caplog.records


def test_a_failure_when_core_algos_is_imported_is_logged_not_raised(verl, caplog):
    """The wrapping runs inside verl's import of core_algos: it must never break that import."""
    import types

    from impl.integrations.verl import _InstallingLoader

    class Stub:
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            module.ADV_ESTIMATOR_REGISTRY = {}  # a verl without a gdpo estimator

    module = types.ModuleType("stub_core_algos")
    with caplog.at_level(logging.ERROR):
        _InstallingLoader(Stub()).exec_module(module)
    assert module.ADV_ESTIMATOR_REGISTRY == {}
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name == PLUGIN]
    assert errors and "failed to load" in errors[0].getMessage(), caplog.records
