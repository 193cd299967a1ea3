"""impl.integrations.trl in a real TRL training step (issue 26): GDPOTrainer's advantages are
impl.gdpo's, bit for bit, on the rewards TRL gathered, unscorable and multi-environment rows
included; TRL's own GRPOTrainer is untouched.

The model is built here, in a second: a word-level tokenizer made with ``tokenizers`` and a
randomly initialised one-layer Llama of width 16; nothing is downloaded."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _frameworks import import_framework  # noqa: E402

HOW = "install it with pip install -e '.[trl]'"
trl = import_framework("trl", HOW)
datasets = import_framework("datasets", HOW)

from impl import gdpo  # noqa: E402
from impl.integrations import trl as gdpo_trl  # noqa: E402

#: the slow tier (`python3 -m pytest -n auto -q -m slow`): the real frameworks, installed by .ci/run
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
WORDS = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(13)]
G = 4  # completions per prompt


#: A chat template of our own that renders tool calls, which TRL requires of environments (the
#: environments here have no tools, and the prompts are plain text, so it is never applied).
TOOL_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }}"
                 "{% for c in m.get('tool_calls', []) %} {{ c['function']['name'] }} "
                 "{{ c['function']['arguments'] | tojson }}{% endfor %} {% endfor %}")


@pytest.fixture(scope="module")
def tiny():
    """(model factory, tokenizer): one-layer Llama of width 16 over a 16-word vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>")
    config = LlamaConfig(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                         pad_token_id=0, eos_token_id=1, bos_token_id=None)

    def model():
        torch.manual_seed(0)
        return LlamaForCausalLM(config)

    return model, tokenizer


def _config(tmp_path, **kw):
    args = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=G,
                max_completion_length=3, max_steps=1, learning_rate=1e-3, report_to="none", use_cpu=True,
                logging_steps=1, save_strategy="no", seed=0, multi_objective_aggregation="normalize_then_sum",
                reward_weights=[0.75, 1.5])
    args.update(kw)
    return trl.GRPOConfig(**args)


def _dataset(n=2, **columns):
    return datasets.Dataset.from_dict({"prompt": [f"w{3 + i} w{4 + i}" for i in range(n)], **columns})


# Rewards by position in TRL's batch (rows of a group are contiguous), so every group has a spread,
# plus a little of the sampled completion; None where a test wants a reward unscored.
def _reward_a(completions, **kw):
    return [float(i % 3) + 0.125 * len(c.split()) for i, c in enumerate(completions)]


def _reward_b(completions, **kw):
    return [float((5 * i) % 7) / 4 for i, _ in enumerate(completions)]


def _with_none(func, rows):
    def reward(completions, **kw):
        return [None if i in rows else r for i, r in enumerate(func(completions, **kw))]
    reward.__name__ = func.__name__ + "_with_none"
    return reward


class _Record:
    """Mixed in before the trainer: what TRL gathered, what reached the batch and the loss."""

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.seen.append((self._seen_rewards, out["advantages"].clone(),
                          list(self._logs["advantages"])[-self._seen_rewards.shape[0]:]))
        self.unscored_metric = list(self._metrics["train"].get("gdpo/unscored_rows", []))
        return out

    def _calculate_rewards(self, *args):
        rewards = super()._calculate_rewards(*args)
        self._seen_rewards = rewards.clone()
        return rewards

    def _compute_loss(self, model, inputs):
        self.loss_advantages.append(inputs["advantages"].clone())
        return super()._compute_loss(model, inputs)


def _train(base, tiny, tmp_path, reward_funcs, dataset=None, environment_factory=None, **kw):
    model, tokenizer = tiny
    cls = type("Recorded", (_Record, base), {})
    trainer = cls(model=model(), reward_funcs=reward_funcs, args=_config(tmp_path, **kw),
                  train_dataset=dataset if dataset is not None else _dataset(), processing_class=tokenizer,
                  environment_factory=environment_factory)
    trainer.seen, trainer.loss_advantages = [], []
    trainer.train()
    assert len(trainer.seen) == 1 and len(trainer.loss_advantages) == 1
    return trainer


def _impl(rewards, weights):
    return gdpo.gdpo_advantages(rewards, group_size=G, weights=weights, missing="unscored")


def _check_step(trainer, expected):
    """The batch's advantages are ``expected`` bit for bit; so are the logged ones; the loss saw them."""
    rewards, advantages, logged = trainer.seen[0]
    assert advantages.dtype == torch.float32 and advantages.shape == (rewards.shape[0],)
    assert torch.equal(advantages, expected), (advantages, expected)
    assert logged == expected.tolist()
    # TRL shuffles the generation batch before the loss: the same values, in some order
    assert torch.equal(trainer.loss_advantages[0].sort().values, expected.sort().values)


def test_train_step_advantages_are_impl_bit_for_bit(tiny, tmp_path):
    trainer = _train(gdpo_trl.GDPOTrainer, tiny, tmp_path, [_reward_a, _reward_b])
    rewards = trainer.seen[0][0]
    assert rewards.shape == (8, 2) and not rewards.isnan().any()
    expected = _impl(rewards, [0.75, 1.5])
    assert torch.equal(expected, gdpo.gdpo_advantages(rewards, group_size=G, weights=[0.75, 1.5]))  # no NaN: "refuse"'s bits
    _check_step(trainer, expected)
    assert trainer.unscored_metric == [0.0]


def test_plain_trl_is_unchanged_and_differs_in_bits(tiny, tmp_path):
    """TRL's own GRPOTrainer, in the same process after GDPOTrainer was built, trains on TRL's
    float32 advantages: the same rewards, the same GDPO up to TRL's float32 rounding, other bits
    (so the bit-for-bit check above can fail)."""
    ours = _train(gdpo_trl.GDPOTrainer, tiny, tmp_path / "ours", [_reward_a, _reward_b])
    plain = _train(trl.GRPOTrainer, tiny, tmp_path / "plain", [_reward_a, _reward_b])
    assert torch.equal(plain.seen[0][0], ours.seen[0][0])  # same completions, same rewards
    theirs, mine = plain.seen[0][1], ours.seen[0][1]
    assert plain.seen[0][2] == theirs.tolist()
    assert not torch.equal(theirs, mine)
    # TRL's float32 normalize_then_sum is GDPO with the same eps (1e-4): a few float32 roundings away
    assert (theirs.double() - mine.double()).abs().max() < 64 * 2.0 ** -24 * (1 + mine.abs().max())


def test_refuse_policy_names_the_reward_function(tiny, tmp_path):
    class Refusing(gdpo_trl.GDPOTrainer):
        gdpo_missing = "refuse"

    with pytest.raises(gdpo.NonFiniteError) as info:
        _train(Refusing, tiny, tmp_path, [_reward_a, _with_none(_reward_b, {2})])
    assert "_reward_b_with_none" in "".join(getattr(info.value, "__notes__", []))


def test_unscorable_and_partly_scored_rows(tiny, tmp_path):
    """Row 1 scored by no function (TRL's unscorable completion): advantage 0, out of Eq. 6.
    Row 6 scored by the first function only: left out of the second column's statistics."""
    funcs = [_with_none(_reward_a, {1}), _with_none(_reward_b, {1, 6})]
    trainer = _train(gdpo_trl.GDPOTrainer, tiny, tmp_path, funcs)
    rewards = trainer.seen[0][0]
    assert rewards[1].isnan().all() and rewards[6, 1].isnan() and not rewards[6, 0].isnan()
    expected = _impl(rewards, [0.75, 1.5])
    assert expected[1] == 0 and expected[6] != 0
    _check_step(trainer, expected)
    assert trainer.unscored_metric == [1.0]
    assert trainer.state.log_history[0]["gdpo/unscored_rows"] == 1.0  # TRL logs it with its own metrics


class _EnvA:
    """An environment that owns its reward (TRL gives it a reward column, None for other rows)."""

    def reset(self, **kwargs):
        self.n = len(kwargs["prompt"])
        return None

    def get_reward(self):
        _EnvA.calls = getattr(_EnvA, "calls", 0) + 1
        return float(_EnvA.calls % 3)


class _EnvB:
    def reset(self, **kwargs):
        return None

    def get_reward(self):
        _EnvB.calls = getattr(_EnvB, "calls", 0) + 1
        return 0.5 * (_EnvB.calls % 4)


def test_multi_environment_rows(tiny, tmp_path, monkeypatch):
    """TRL's multi-environment mode: two environments, each with its own reward column, NaN on
    the other environment's rows; plus one reward function scoring every row."""
    data = _dataset(2, environment=["a", "b"])
    monkeypatch.setattr(tiny[1], "chat_template", TOOL_TEMPLATE, raising=False)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    trainer = _train(gdpo_trl.GDPOTrainer, tiny, tmp_path, [_reward_a], dataset=data,
                     reward_weights=[0.75], environment_factory={"a": _EnvA, "b": _EnvB})
    assert trainer.reward_func_names[1:] == ["_EnvA", "_EnvB"]
    rewards = trainer.seen[0][0]
    assert rewards.shape == (8, 3)
    nan = rewards.isnan()
    # each group is one environment: the other environment's column is NaN on all its rows
    assert sorted(nan[:, 1:].view(2, G, 2).all(dim=1).flatten().tolist()) == [False, False, True, True]
    expected = _impl(rewards, [0.75, 1.0, 1.0])
    assert not expected.isnan().any()
    _check_step(trainer, expected)


def test_eval_with_one_generation_gives_zero(tiny, tmp_path, caplog):
    """num_generations_eval=1: groups of one, advantage 0 (TRL's formula gives 0 too), said once."""
    model, tokenizer = tiny
    with caplog.at_level("WARNING", logger="impl.integrations.trl"):
        trainer = gdpo_trl.GDPOTrainer(
            model=model(), reward_funcs=[_reward_a, _reward_b], processing_class=tokenizer,
            args=_config(tmp_path, num_generations_eval=1, eval_strategy="steps", eval_steps=1,
                         per_device_eval_batch_size=2),
            train_dataset=_dataset(), eval_dataset=_dataset())
    assert any("num_generations_eval=1" in r.message for r in caplog.records)
    trainer.model.eval()
    out = trainer._generate_and_score_completions(trainer.eval_dataset.select(range(2)).to_list())
    assert torch.equal(out["advantages"], torch.zeros(2))


def test_refuses_sum_then_normalize(tiny, tmp_path):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="multi_objective_aggregation='normalize_then_sum'"):
        gdpo_trl.GDPOTrainer(model=model(), reward_funcs=[_reward_a], processing_class=tokenizer,
                             args=_config(tmp_path, multi_objective_aggregation="sum_then_normalize",
                                          reward_weights=None), train_dataset=_dataset())


def test_refuses_untested_trl_versions():
    assert gdpo_trl.check_trl_version() == trl.__version__
    for version in ("1.15.2", "1.17.0", "2.0.0", "1.16.0rc1"):
        with pytest.raises(RuntimeError, match=r"tested on TRL >=1\.16\.0,<1\.17\.0; TRL " + version.replace(".", r"\.")):
            gdpo_trl.check_trl_version(version)
    assert gdpo_trl.check_trl_version("1.16.3") == "1.16.3"


def test_import_patches_nothing():
    """Importing impl.integrations.trl imports no TRL, and building GDPOTrainer leaves TRL's
    GRPOTrainer as it was (a fresh interpreter, so nothing was imported before)."""
    code = textwrap.dedent("""
        import sys
        import impl.integrations.trl as m
        assert "trl" not in sys.modules, "importing impl.integrations.trl imported trl"
        import trl, trl.trainer.grpo_trainer as g
        before = dict(vars(trl.GRPOTrainer)), dict(vars(g))
        cls = m.GDPOTrainer
        assert issubclass(cls, trl.GRPOTrainer) and cls.__mro__[1] is m.GDPOMixin
        assert (dict(vars(trl.GRPOTrainer)), dict(vars(g))) == before
        import pickle; assert pickle.loads(pickle.dumps(cls)) is cls
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_two_processes_keep_their_slices(tmp_path):
    """A real two-process step (torch.distributed.run, gloo on CPU): TRL gathers both ranks'
    rows (an unscorable one on each), every rank computes impl's advantages of the whole batch
    and keeps its own rows, and logs the whole batch. Each rank reports in a file of its own."""
    import json

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GDPO_REPORT_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "tests/_trl_two_ranks.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if out.returncode:  # (shown whole under "Captured stderr": the assertion's text is cut short)
        print(out.stdout[-4000:], out.stderr, sep="\n", file=sys.stderr)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank, r in enumerate(reports):
        assert (r["rank"], r["world"], r["gathered"], r["local"]) == (rank, 2, [8, 2], 4), r
        assert r["slice"] and r["log"] and r["unscored"] == 2, r


def test_each_process_keeps_its_slice():
    """Under two processes TRL gathers both processes' rows and keeps rows [i*n, (i+1)*n) on
    process i (its process_slice); the mixin keeps the same rows of impl's advantages, and logs
    the whole batch. TRL's own method is stood in for here (one process cannot gather two)."""
    n, gathered = 4, torch.tensor([[0.0, 1.0], [1.0, 0.5], [2.0, 0.0], [0.5, 0.25]] * 2) * torch.arange(1, 9)[:, None]

    class TRLStandIn:
        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            return gathered

        def _generate_and_score_completions(self, inputs):
            self._calculate_rewards(inputs, None, None, None)
            self._logs["advantages"].extend([9.0] * gathered.shape[0])
            return {"advantages": torch.full((len(inputs),), 9.0)}

    class Trainer(gdpo_trl.GDPOMixin, TRLStandIn):
        pass

    import collections
    import types

    expected = gdpo.gdpo_advantages(gathered, group_size=G, weights=[1.0, 2.0], missing="unscored")
    for rank in (0, 1):
        t = Trainer.__new__(Trainer)
        t.accelerator = types.SimpleNamespace(process_index=rank)
        t.model = types.SimpleNamespace(training=True)
        t.num_generations, t.reward_weights, t.reward_func_names = G, torch.tensor([1.0, 2.0]), ["a", "b"]
        t._logs = {"advantages": collections.deque([7.0], maxlen=16)}
        t._metrics = {"train": collections.defaultdict(list)}
        out = t._generate_and_score_completions([{}] * n)
        assert torch.equal(out["advantages"], expected[rank * n:(rank + 1) * n])
        assert list(t._logs["advantages"]) == [7.0] + expected.tolist()


def test_readme_lines_name_what_exists():
    """The README's TRL lines import what this module has and set the setting it requires."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("from impl.integrations.trl import"):].splitlines()[:3]
    namespace = {}
    exec(block[0].split("#")[0], namespace)
    assert namespace["GDPOTrainer"] is gdpo_trl.GDPOTrainer
    assert 'multi_objective_aggregation="normalize_then_sum"' in block[1]
    assert block[2].split("#")[0].strip().startswith("trainer = GDPOTrainer(")


def test_trl_mirror_computes_trls_std():
    """The known-limit tables' and benchmarks' TRL (``gdpo_tools.peer_formulas``) takes the std as
    TRL's own ``nanstd`` does, bit for bit: NaN-aware, and infinite where float32 squares overflow
    (``Tensor.std``, a control, stays finite there: the tables once said TRL held up to 1e38)."""
    from gdpo_tools.peer_formulas import _trl_nanstd
    from trl.trainer.utils import nanstd

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, 3, generator=g) * torch.tensor([1.0, 1e4, 3e19])
    x[5, 2, 1] = torch.nan
    grouped = _trl_nanstd(x, dim=1)
    assert torch.equal(grouped.view(torch.int32), nanstd(x, dim=1, keepdim=True).view(torch.int32))
    assert torch.equal(_trl_nanstd(x[:, 0, 0]).reshape(()), nanstd(x[:, 0, 0]))
    assert grouped[:, :, 2].isinf().all() and x.std(dim=1)[:, 2].isfinite().all()
