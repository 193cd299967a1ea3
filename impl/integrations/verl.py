"""verl's ``gdpo`` advantage estimator computed by :mod:`impl.gdpo` once a run opts in by config:
the ``verl.plugins`` entry point wraps verl's estimator (docs/integrations.md, "verl: one config key")."""

from __future__ import annotations

import collections
import functools
import inspect
import logging
import numbers
import sys

__all__ = ["OPT_IN_KEY", "OPT_IN_VALUE", "WHITEN_KEY", "TESTED_VERL", "VerlIntegrationError",
           "compute_gdpo_advantage", "install", "installed"]

_log = logging.getLogger(__name__)

#: ``algorithm.<OPT_IN_KEY>=<OPT_IN_VALUE>`` opts in; ``verl`` (or no key) keeps verl's own.
OPT_IN_KEY, OPT_IN_VALUE, VERL_VALUE = "gdpo_impl", "gdpo_spec", "verl"
#: ``algorithm.<WHITEN_KEY>``: Eq. 6 per ``sample`` (the specification, the default) or per ``token`` (verl's).
WHITEN_KEY, WHITEN_SAMPLE, WHITEN_TOKEN = "gdpo_whiten", "sample", "token"
#: The verl releases this module was tested against (tests/test_integration_verl.py).
TESTED_VERL = ("0.9.1",)
#: What verl 0.9.1's v1 trainer fetches for the advantage step (trainer/ppo/v1/trainer_base.py).
_V1_FIELDS = "uid, response_mask, rm_scores, rollout_log_probs, old_log_probs, ref_log_prob, values"
_CORE_ALGOS = "verl.trainer.ppo.core_algos"


class VerlIntegrationError(ValueError):
    """A verl setting this integration cannot run with; the message names the setting."""


def _setting(config, key):
    get = getattr(config, "get", None)
    return None if get is None else get(key, None)


def _opted_in(config) -> str | None:
    """The Eq. 6 weighting when the config opts in, else None; a value of our keys we do
    not know is refused, never ignored."""
    impl = _setting(config, OPT_IN_KEY)
    whiten = _setting(config, WHITEN_KEY)
    if impl is None or impl == VERL_VALUE:
        if whiten is not None:
            raise VerlIntegrationError(
                f"algorithm.{WHITEN_KEY}={whiten!r} applies only to gdpo-spec's GDPO: add "
                f"+algorithm.{OPT_IN_KEY}={OPT_IN_VALUE} (or drop algorithm.{WHITEN_KEY})")
        return None
    if impl != OPT_IN_VALUE:
        raise VerlIntegrationError(
            f"algorithm.{OPT_IN_KEY} is {impl!r}; expected {OPT_IN_VALUE!r} (GDPO advantages by gdpo-spec's "
            f"impl.gdpo) or {VERL_VALUE!r} (verl's own, the default)")
    whiten = WHITEN_SAMPLE if whiten is None else whiten
    if whiten not in (WHITEN_SAMPLE, WHITEN_TOKEN):
        raise VerlIntegrationError(
            f"algorithm.{WHITEN_KEY} is {whiten!r}; expected {WHITEN_SAMPLE!r} (Eq. 6 per response, the "
            f"specification's, the default) or {WHITEN_TOKEN!r} (per response token, verl's weighting)")
    return whiten


def _column(values, key: str, n: int, index):
    """One reward key's scores as n finite float64 (NumPy), or a refusal naming key, sample, uid."""
    import numpy as np

    from impl.gdpo import InputDtypeError, NonFiniteError, ShapeError

    where = f"non_tensor_batch[{key!r}]"
    arr = np.asarray(values)
    if arr.shape != (n,):
        raise ShapeError(f"{where} has shape {arr.shape}; expected ({n},), one score per response "
                         f"(response_mask has {n} rows)")
    if arr.dtype == object or arr.dtype.kind in "iu":  # mixed numbers (np.array of compute_score's), ints
        items = arr.tolist()  # Python numbers: ints compared exactly
        for i, x in enumerate(items):
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
                raise InputDtypeError(f"{where}[{i}] (sample {i}, uid {index[i]!r}) is {x!r} "
                                      f"({type(x).__name__}); a reward score is a real number")
            if isinstance(x, numbers.Integral) and abs(int(x)) > 2 ** 53:
                raise InputDtypeError(f"{where}[{i}] (sample {i}, uid {index[i]!r}) is {x}, an integer "
                                      "no float64 holds exactly")
        arr = np.array([float(x) for x in items], dtype=np.float64)
    if arr.dtype.kind != "f":
        raise InputDtypeError(f"{where} has dtype {arr.dtype}; reward scores are real numbers (a bool is not "
                              "a score: return 1.0 and 0.0 from compute_score)")
    out = arr.astype(np.float64)
    bad = np.nonzero(~np.isfinite(out))[0]
    if bad.size:
        i = int(bad[0])
        raise NonFiniteError(f"{where}[{i}] (sample {i}, uid {index[i]!r}) is {out[i]}: a score that is "
                             "NaN or infinite cannot be standardized")
    return out


def _reward_keys(config, non_tensor_batch, batch) -> list:
    """algorithm.gdpo_reward_keys, each present in non_tensor_batch (where verl's gdpo reads them)."""
    keys = _setting(config, "gdpo_reward_keys")
    if not keys:
        raise VerlIntegrationError(
            "algorithm.gdpo_reward_keys is not set: GDPO needs the reward keys your compute_score returns in its "
            "dict, e.g. +algorithm.gdpo_reward_keys=[accuracy,format]")
    if isinstance(keys, str):
        raise VerlIntegrationError(f"algorithm.gdpo_reward_keys is the string {keys!r}; write a list: "
                                   f"+algorithm.gdpo_reward_keys=[{keys}]")
    keys = list(keys)
    have = [] if non_tensor_batch is None else list(non_tensor_batch.keys())
    missing = [k for k in keys if k not in have]
    if missing:
        if batch is not None and "prompts" not in batch.keys():  # (a TensorDict refuses `key in td`)
            raise VerlIntegrationError(
                f"the advantage step's batch holds no per-reward scores (non_tensor_batch holds {have}; "
                f"algorithm.gdpo_reward_keys={keys}): verl's v1 trainer (trainer.use_v1=True, verl's default) "
                f"fetches only {_V1_FIELDS} for the advantage step, so per-reward GDPO cannot run there "
                "(verl's own gdpo fails there too, with KeyError: 'prompts'). Set trainer.use_v1=False (the "
                "legacy trainer)")
        raise VerlIntegrationError(
            f"algorithm.gdpo_reward_keys names {missing}, not in non_tensor_batch (it holds {have}): each key must "
            "be one your compute_score returns in its dict")
    return keys


def _rewards(config, keys: list, non_tensor_batch, n: int, index):
    """((n, K) float64 NumPy scores, weights or None)."""
    import numpy as np

    scores = np.stack([_column(non_tensor_batch[k], k, n, index) for k in keys], axis=1)
    weights = _setting(config, "gdpo_reward_weights")
    if weights is not None:
        try:
            weights = [float(w) for w in weights]
        except (TypeError, ValueError):
            raise VerlIntegrationError(f"algorithm.gdpo_reward_weights is {weights!r}; expected one number per "
                                       "reward key") from None
        if len(weights) != len(keys):
            raise VerlIntegrationError(
                f"algorithm.gdpo_reward_weights has {len(weights)} weights but algorithm.gdpo_reward_keys "
                f"{len(keys)} keys ({keys}): one weight per key")
    return scores, weights


def _groups(index, n: int):
    """verl's uid labels as group ids (first appearance); a prompt with one response is refused."""
    from impl.gdpo import GroupError, ShapeError

    if index is None:
        raise GroupError("the batch has no 'uid' in non_tensor_batch, so verl passed no index: GDPO's Eq. 4 "
                         "standardizes each reward within the responses of one prompt (one uid)")
    labels = index.tolist() if hasattr(index, "tolist") else list(index)
    if len(labels) != n:
        raise ShapeError(f"index (uid) has {len(labels)} labels but response_mask {n} rows: one uid per response")
    ids, gid = {}, []
    for i, u in enumerate(labels):
        try:
            gid.append(ids.setdefault(u, len(ids)))
        except TypeError:
            raise GroupError(f"uid of sample {i} is {u!r}, unhashable: a uid names a prompt") from None
    counts = collections.Counter(gid)
    lone = [i for i, g in enumerate(gid) if counts[g] == 1]  # a lone group's only sample: its first
    if lone:
        i = lone[0]
        raise GroupError(f"uid {labels[i]!r} (sample {i}) has 1 response ({len(lone)} such uids): GDPO's Eq. 4 "
                         "needs at least 2 responses per prompt (actor_rollout_ref.rollout.n >= 2); verl's own "
                         "gdpo gives a lone response mean 0 and std 1, the specification refuses it")
    return gid


def compute_gdpo_advantage(token_level_rewards, response_mask, index, *, config, non_tensor_batch=None,
                           batch=None, whiten: str = WHITEN_SAMPLE):
    """verl's GDPO estimator by impl.gdpo: ``(advantages, returns)``, one (B, T) float32 tensor
    twice, each response's advantage on its response tokens, +0.0 on padding. ``whiten="sample"``
    (the specification's): :func:`impl.gdpo.gdpo_advantages` of the (B, K) scores, one group per
    uid; ``"token"`` (verl's weighting): :func:`impl.gdpo.whiten` over the response tokens, each
    carrying its response's :func:`impl.gdpo.normalize_rewards` value."""
    import torch

    from impl.adapters import _mask_error, _not_zero_one, _on_response_tokens
    from impl.gdpo import ShapeError, gdpo_advantages, normalize_rewards
    from impl.gdpo import whiten as whiten_values

    if response_mask.dim() != 2:
        raise ShapeError(f"response_mask must be (B, T); got shape {tuple(response_mask.shape)}")
    bad = _not_zero_one(response_mask)
    error = None if bad is None else _mask_error(response_mask, bad, expected="0 or 1")
    if error is not None:
        raise error
    mask = response_mask.to(torch.bool)
    n = mask.shape[0]
    if _setting(config, "norm_adv_by_std_in_grpo") is False:
        raise VerlIntegrationError(
            "algorithm.norm_adv_by_std_in_grpo=False asks for advantages not divided by the group std, but "
            "GDPO's Eq. 4 divides every reward by its group's std (verl's own gdpo ignores this setting); drop it")
    keys = _reward_keys(config, non_tensor_batch, batch)  # the v1 trainer's batch refused first
    groups = _groups(index, n)  # then the uids: the scores' refusals name a sample's uid
    scores, weights = _rewards(config, keys, non_tensor_batch, n, index)
    device = token_level_rewards.device
    r = torch.from_numpy(scores).to(device)
    gid = torch.tensor(groups, dtype=torch.int64, device=device)
    mask = mask.to(device)
    if whiten == WHITEN_SAMPLE:
        adv = _on_response_tokens(gdpo_advantages(r, group_ids=gid, weights=weights, out_dtype=torch.float32), mask)
    elif whiten == WHITEN_TOKEN:
        c = normalize_rewards(r, group_ids=gid, weights=weights)
        per_token = whiten_values(c.unsqueeze(-1).expand(mask.shape)[mask], out_dtype=torch.float32)
        adv = torch.zeros(mask.shape, dtype=torch.float32, device=device)
        adv[mask] = per_token
    else:
        raise VerlIntegrationError(f"whiten is {whiten!r}; expected {WHITEN_SAMPLE!r} or {WHITEN_TOKEN!r}")
    return adv, adv


_announced = False  # the opt-in is logged once per process


def _wrap(original):
    """verl's registered gdpo, unchanged unless the config opts in."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def gdpo_estimator(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)  # verl's own error for verl's own call
        a = bound.arguments
        whiten = _opted_in(a.get("config"))
        if whiten is None:
            return original(*args, **kwargs)
        version = getattr(sys.modules.get("verl"), "__version__", None)
        if version not in TESTED_VERL:
            raise VerlIntegrationError(
                f"algorithm.{OPT_IN_KEY}={OPT_IN_VALUE}: gdpo-spec's verl integration is tested on verl "
                f"{', '.join(TESTED_VERL)} only; this is verl {version}. Install verl=={TESTED_VERL[-1]}, or drop "
                f"+algorithm.{OPT_IN_KEY} to run verl's own gdpo")
        global _announced
        if not _announced:
            _announced = True
            _log.warning("gdpo-spec: GDPO advantages by impl.gdpo (algorithm.%s=%s, Eq. 6 per %s)", OPT_IN_KEY,
                         OPT_IN_VALUE, whiten)
        return compute_gdpo_advantage(a["token_level_rewards"], a["response_mask"], a.get("index"),
                                      config=a.get("config"), non_tensor_batch=a.get("non_tensor_batch"),
                                      batch=a.get("batch"), whiten=whiten)

    # verl's signature and docstring (inspect follows __wrapped__), but our name where it is shown
    gdpo_estimator.__module__, gdpo_estimator.__qualname__ = __name__, "gdpo_estimator"
    gdpo_estimator._gdpo_spec_original = original
    return gdpo_estimator


def installed() -> bool:
    """Whether verl's registry holds this module's gdpo wrapper (in this process)."""
    core_algos = sys.modules.get(_CORE_ALGOS)
    fn = None if core_algos is None else core_algos.ADV_ESTIMATOR_REGISTRY.get("gdpo")
    return getattr(fn, "_gdpo_spec_original", None) is not None


def install(core_algos=None) -> bool:
    """Wrap verl's registered ``gdpo`` estimator (idempotent: False when already wrapped).
    ``core_algos``: verl.trainer.ppo.core_algos (imported when not given)."""
    if core_algos is None:
        from verl.trainer.ppo import core_algos
    registry = core_algos.ADV_ESTIMATOR_REGISTRY
    current = registry.get("gdpo")
    if current is None:
        raise VerlIntegrationError(f"verl registers no 'gdpo' advantage estimator (it has {sorted(registry)}); "
                                   f"gdpo-spec's verl integration is tested on verl {', '.join(TESTED_VERL)}")
    if getattr(current, "_gdpo_spec_original", None) is not None:
        return False
    registry["gdpo"] = _wrap(current)
    version = getattr(sys.modules.get("verl"), "__version__", None)
    if version not in TESTED_VERL:
        _log.error("gdpo-spec: verl %s is not a version its verl integration was tested on (%s); "
                   "algorithm.%s=%s will be refused", version, ", ".join(TESTED_VERL), OPT_IN_KEY, OPT_IN_VALUE)
    return True


def _log_failure() -> None:
    _log.error("gdpo-spec: its verl plugin (impl.integrations.verl) failed to load, so algorithm.%s=%s cannot "
               "take effect in this process (verl's own gdpo would run)", OPT_IN_KEY, OPT_IN_VALUE, exc_info=True)


class _InstallingLoader:
    """core_algos' own loader; once it has run the module, :func:`install` on it. A failure
    of ours is logged, never raised: verl must import whatever happens to this plugin."""

    def __init__(self, inner):
        self._inner = inner

    def exec_module(self, module):
        self._inner.exec_module(module)
        try:
            install(module)
        except Exception:  # noqa: BLE001 - logged as an error; verl's import goes on
            _log_failure()

    def __getattr__(self, name):  # create_module, get_source, ...: the real loader's
        return getattr(self._inner, name)


class _CoreAlgosFinder:
    """Finds verl.trainer.ppo.core_algos as the other finders do, with an installing loader."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _CORE_ALGOS:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = None if find is None else find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _InstallingLoader(spec.loader)
                return spec
        return None


def _load_as_plugin() -> None:
    """What verl's plugin loader runs in every verl process: the wrapping now where core_algos is
    imported, else at its import (a finder: many processes never import it, and it costs
    seconds). verl logs a plugin's failure at debug level only: logged here as an error."""
    try:
        core_algos = sys.modules.get(_CORE_ALGOS)
        if core_algos is not None:
            install(core_algos)
        elif not any(isinstance(f, _CoreAlgosFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _CoreAlgosFinder())
    except Exception:
        _log_failure()
        raise


_load_as_plugin()
