"""Call shapes of the conformance suite (conformance/plugins.py): the verl per-token shape
grades impl.adapters.verl_advantages and rejects wrong verl-shaped implementations, and
`pytest --impl` works from the repository root with no path.

The wrong implementations are written to a temporary module (importable by name, as
--impl needs), each with exactly one flaw over the vetted adapter, so that a rejection
is the flaw's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from conformance import plugins
from conformance import properties as P
from conformance.cases import Case
from conformance.plugins import CallShapeViolation, Subject

ROOT = Path(__file__).resolve().parents[1]
ADAPTER = "impl.adapters:verl_advantages"

WRONG_VERL = textwrap.dedent('''
    """Wrong verl-shaped GDPO implementations (one flaw each over impl.adapters.verl_advantages)."""
    import torch

    from impl import adapters, gdpo


    def unmasked(token_level_rewards, response_mask, index, weights=None):
        """The advantage broadcast over every token, padding included."""
        adv = adapters.verl_advantages(token_level_rewards, response_mask, index, weights)
        return adv[:, :1].expand(adv.shape).clone()


    def last_token_only(token_level_rewards, response_mask, index, weights=None):
        """The advantage on the last response token only (0 on the others)."""
        adv = adapters.verl_advantages(token_level_rewards, response_mask, index, weights)
        last = response_mask.sum(dim=1) - 1
        out = torch.zeros_like(adv)
        rows = torch.arange(adv.shape[0])
        out[rows, last] = adv[rows, last]
        return out


    def last_token_score(token_level_rewards, response_mask, index, weights=None):
        """The score of a response read from its last response token, not the sum of its tokens."""
        last = response_mask.sum(dim=1) - 1
        rows = torch.arange(response_mask.shape[0])
        moved = {}
        for key, t in token_level_rewards.items():
            m = torch.zeros_like(t)
            m[rows, last] = t[rows, last]
            moved[key] = m
        return adapters.verl_advantages(moved, response_mask, index, weights)


    def token_weighted(token_level_rewards, response_mask, index, weights=None):
        """Eq. 6 weighting each sample by its token count (verl's masked_whiten), under a
        convention that whitens per sample."""
        keys = list(token_level_rewards)
        mask = response_mask.to(torch.float64)
        scores = torch.stack([(token_level_rewards[k].to(torch.float64) * mask).sum(-1) for k in keys], 1)
        ids = {}
        labels = torch.tensor([ids.setdefault(x, len(ids)) for x in list(index)])
        w = None if weights is None else [weights[k] for k in keys]
        c = gdpo.normalize_rewards(scores, group_ids=labels, weights=w)
        n_tok = mask.sum(-1)
        mean = (c * n_tok).sum() / n_tok.sum()
        var = (n_tok * (c - mean) ** 2).sum() / (n_tok.sum() - 1)
        a = (c - mean) / (var.sqrt() + 1e-4)
        return (a[:, None] * mask).to(torch.float32)


    def returns_tuple(token_level_rewards, response_mask, index, weights=None):
        """Correct, returned as verl's estimators do: (advantages, returns)."""
        adv = adapters.verl_advantages(token_level_rewards, response_mask, index, weights)
        return adv, adv
''')


@pytest.fixture(scope="module")
def wrong_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("verl_impls")
    (d / "wrong_verl_impls.py").write_text(WRONG_VERL)
    return d


@pytest.fixture
def wrong(wrong_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(wrong_dir))
    return lambda name: Subject(f"wrong_verl_impls:{name}", "verl", "spec")


def _rejects(prop_name: str, subject: Subject) -> str:
    """Run a property without shrinking; the failure's text (the test fails if it passes)."""
    with pytest.raises(P.ConformanceFailure) as info:
        P.build_test(P.BY_NAME[prop_name], subject, config=P.control_settings())()
    return str(info.value)


# ------------------------------------------------------------ the verl mapping


def test_verl_token_rewards_sum_to_the_rewards_and_vary_lengths():
    gen = np.random.default_rng(3)
    r = np.round(gen.normal(size=(13, 3)) * 8) / 8  # halves exact
    r[0, 1] = 2.0 ** -149  # float32's smallest subnormal: no exact half, stays whole
    lengths = plugins.verl_lengths(13)
    assert sorted(set(lengths.tolist())) == list(range(1, plugins.VERL_TOKENS + 1)) and lengths[0] < plugins.VERL_TOKENS
    tok = plugins.verl_token_rewards(r, lengths, "float32")
    assert np.array_equal(tok.sum(axis=1), r)
    pad = np.arange(plugins.VERL_TOKENS)[None, :] >= lengths[:, None]
    assert not tok[pad].any(), "a reward on a padding token"
    split = (tok[:, 0, :] != 0) & (tok[np.arange(13), lengths - 1, :] != 0) & (lengths[:, None] > 1)
    assert split.sum() >= 5, "the split placement (first and last token) is never used"
    assert tok[0, lengths[0] - 1, 1] == 2.0 ** -149 and tok[0, 0, 1] == 0.0


def test_verl_arguments_are_verls_types():
    case = Case(rewards=((1.0, 0.5), (0.0, 0.25), (1.0, 0.0), (0.0, 1.0)), group_ids=(7, 7, 9, 9),
                weights=(1.0, 0.5))
    kw = Subject(ADAPTER, "verl").verl_arguments(case)
    assert set(kw) == {"token_level_rewards", "response_mask", "index", "weights"}
    assert list(kw["token_level_rewards"]) == ["reward_0", "reward_1"]
    assert all(t.dtype == torch.float32 and t.shape == (4, plugins.VERL_TOKENS)
               for t in kw["token_level_rewards"].values())
    assert kw["response_mask"].dtype == torch.int64 and kw["response_mask"].sum(1).tolist() == [3, 2, 1, 6]
    assert kw["index"].dtype == object and list(kw["index"]) == ["uid7", "uid7", "uid9", "uid9"]
    assert kw["weights"] == {"reward_0": 1.0, "reward_1": 0.5}
    scores = torch.stack([t.double().sum(1) for t in kw["token_level_rewards"].values()], 1)
    assert torch.equal(scores, torch.tensor(case.rewards, dtype=torch.float64))
    three = Subject(ADAPTER, "verl").verl_arguments(Case(rewards=case.rewards, group_ids=case.group_ids,
                                                           weights=(1.0, 0.5, 2.0)))
    assert three["weights"] == {"reward_0": 1.0, "reward_1": 0.5, "reward_2": 2.0}  # not silently dropped


def test_verl_per_sample_names_the_sample_and_token():
    lengths = np.array([2, 3])
    good = torch.zeros(2, plugins.VERL_TOKENS)
    good[0, :2] = 0.5
    good[1, :3] = -0.5
    assert plugins.verl_per_sample(good, lengths).tolist() == [0.5, -0.5]
    bad = good.clone()
    bad[1, 4] = 0.25
    with pytest.raises(CallShapeViolation, match=r"sample 1 has 3 response token\(s\) of 6; its padding token 4"):
        plugins.verl_per_sample(bad, lengths)
    bad = good.clone()
    bad[0, 3] = float("nan")
    with pytest.raises(CallShapeViolation, match="padding token 3 .* carries nan"):
        plugins.verl_per_sample(bad, lengths)
    bad = good.clone()
    bad[1, 0] = 0.0
    with pytest.raises(CallShapeViolation, match="sample 1's 3 response tokens carry different values"):
        plugins.verl_per_sample(bad, lengths)
    with pytest.raises(CallShapeViolation, match=r"returned shape \(2,\); token advantages are \(B, T\) = \(2, 6\)"):
        plugins.verl_per_sample(torch.zeros(2), lengths)


# ------------------------------------------------------------ grading through the verl shape


@pytest.mark.parametrize("prop", ["plain", "cancellation", "collapse", "weights"])
def test_verl_adapter_passes_through_the_verl_shape(prop):
    subject = Subject(ADAPTER, "verl", "spec")
    assert subject.unsupported(P.BY_NAME[prop].needs) is None
    P.build_test(P.BY_NAME[prop], subject)()


@pytest.mark.parametrize("name, needle", [
    ("unmasked", "masked tokens must be exactly 0"),
    ("last_token_only", "response tokens carry different values"),
    ("last_token_score", "advantages outside the error model"),
    ("token_weighted", "advantages outside the error model"),
])
def test_wrong_verl_implementations_are_rejected(wrong, name, needle):
    text = _rejects("plain", wrong(name))
    assert needle in text and f"wrong_verl_impls:{name}" in text and "call shape verl" in text, text


def test_verl_returns_tuple_is_graded_on_its_advantages(wrong):
    P.build_test(P.BY_NAME["plain"], wrong("returns_tuple"), config=P.control_settings())()


def test_verl_shape_states_what_it_skips():
    s = Subject(ADAPTER, "verl", "spec")
    for need, word in (("units", "segment_sizes"), ("eps", "eps"), ("stages", "stage"),
                       ("distributed", "process_group")):
        why = s.unsupported(frozenset({"values", need}))
        assert why and why.startswith("call shape 'verl' cannot express this") and word in why, why
    why = Subject(ADAPTER, "verl", "verl").unsupported(frozenset({"values"}))
    assert why and "per token" in why and "conformance.cases.expected" in why, why
    ctx = s.context()
    assert ctx.labels and not ctx.units and not ctx.eps and ctx.out_dtypes == ("float32",)


# ------------------------------------------------------------ pytest --impl from the root, no path


def _pytest_from_root(*args, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


def test_root_run_with_impl_and_no_path_uses_the_subject(tmp_path):
    (tmp_path / "off_gdpo.py").write_text(
        "from impl import gdpo\n"
        "def advantages(*args, **kwargs):\n"
        "    return gdpo.gdpo_advantages(*args, **kwargs) * 1.001  # off by 0.1%\n")
    sel = "test_property[plain]"  # conformance/test_equations.py only
    good = _pytest_from_root("--impl", "impl.gdpo:gdpo_advantages", "-k", sel)
    assert good.returncode == 0 and "1 passed" in good.stdout, good.stdout[-3000:] + good.stderr[-3000:]
    bad = _pytest_from_root("--impl", "off_gdpo:advantages", "--convention", "spec", "--call-shape", "gdpo",
                            "-k", sel, pythonpath=tmp_path)
    out = bad.stdout + bad.stderr
    assert bad.returncode == 1 and "1 failed" in bad.stdout, out[-3000:]  # 1: tests failed, not a usage error
    assert "of off_gdpo:advantages (call shape gdpo" in out, out[-3000:]


def test_root_run_with_verl_shape_and_no_path(wrong_dir):
    sel = "test_property[plain]"
    good = _pytest_from_root("--impl", ADAPTER, "--call-shape", "verl", "-k", sel)
    assert good.returncode == 0 and "1 passed" in good.stdout, good.stdout[-3000:] + good.stderr[-3000:]
    bad = _pytest_from_root("--impl", "wrong_verl_impls:unmasked", "--call-shape", "verl", "-k", sel,
                            pythonpath=wrong_dir)
    out = bad.stdout + bad.stderr
    assert bad.returncode == 1 and "masked tokens must be exactly 0" in out, out[-3000:]


def test_options_are_registered_once_with_the_plugin_named_twice():
    """`gdpo check` passes -p conformance.plugins while the root conftest loads it too."""
    proc = _pytest_from_root("-p", "conformance.plugins", "--call-shape", "verl", "--impl", ADAPTER,
                             "-k", "test_property[plain]", "conformance/test_equations.py")
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_unknown_call_shape_is_a_usage_error():
    proc = _pytest_from_root("--call-shape", "jax", "--collect-only")
    assert proc.returncode == 4 and "invalid choice: 'jax'" in proc.stderr, proc.stderr[-2000:]
