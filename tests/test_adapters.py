"""Drop-in call shapes (impl/adapters.py) agree with impl.gdpo and with the exact oracle."""

import doctest
import subprocess
import sys

import numpy as np
import pytest
import torch

from impl import adapters, gdpo
from oracle import gdpo as oracle


def test_docstring_examples_run():
    assert doctest.testmod(adapters).failed == 0


def test_trl_shape_is_gdpo_with_contiguous_groups():
    gen = torch.Generator().manual_seed(0)
    r = torch.randn(32, 3, generator=gen)
    w = [1.0, 0.5, 2.0]
    a = adapters.trl_advantages(r, num_generations=8, reward_weights=w, out_dtype=torch.float64)
    assert torch.equal(a, gdpo.gdpo_advantages(r, group_size=8, weights=w, out_dtype=torch.float64))
    res = oracle.advantages(r.numpy().astype(np.float64), np.repeat(np.arange(4), 8), weights=w)
    assert np.all(np.abs(a.numpy() - res.float64) <= res.allowed("float64"))


def test_trl_nan_is_refused_not_zeroed():
    r = torch.tensor([[1.0, 0.0], [float("nan"), 1.0], [0.0, 0.0], [1.0, 1.0]])
    with pytest.raises(gdpo.NonFiniteError, match="row 1"):
        adapters.trl_advantages(r, num_generations=2)


def test_verl_shape_sums_tokens_whitens_per_sample_and_masks():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]])
    acc = torch.zeros(6, 4)
    acc[0, 1] = acc[3, 2] = acc[4, 1] = 1.0
    fmt = torch.rand(6, 4, generator=torch.Generator().manual_seed(1))
    index = ["a", "a", "b", "b", "c", "c"]
    adv = adapters.verl_advantages({"acc": acc, "fmt": fmt}, mask, index, weights={"acc": 1.0, "fmt": 0.5},
                                   out_dtype=torch.float64)
    scores = torch.stack([(acc.double() * mask).sum(-1), (fmt.double() * mask).sum(-1)], 1)  # sums in float64
    per_sample = gdpo.gdpo_advantages(scores, group_ids=torch.tensor([0, 0, 1, 1, 2, 2]), weights=[1.0, 0.5],
                                      out_dtype=torch.float64)
    assert torch.equal(adv, per_sample[:, None] * mask)
    res = oracle.advantages(scores.numpy(), [0, 0, 1, 1, 2, 2], weights=[1.0, 0.5])
    assert np.all(np.abs(per_sample.numpy() - res.float64) <= res.allowed("float64"))


def test_verl_errors_name_the_key():
    mask = torch.ones(2, 3)
    with pytest.raises(gdpo.ShapeError, match=r"token_level_rewards\['acc'\] has shape \(2, 2\)"):
        adapters.verl_advantages({"acc": torch.zeros(2, 2)}, mask, [0, 0])
    with pytest.raises(gdpo.InputDtypeError, match="'acc'.*floating"):
        adapters.verl_advantages({"acc": torch.zeros(2, 3, dtype=torch.int64)}, mask, [0, 0])
    with pytest.raises(gdpo.WeightError, match=r"missing \['fmt'\]"):
        adapters.verl_advantages({"acc": torch.rand(2, 3), "fmt": torch.rand(2, 3)}, mask, [0, 0],
                                 weights={"acc": 1.0})


def test_labelled_shape_takes_any_hashable_labels():
    r = {"acc": torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0]), "len": torch.tensor([3.0, 1.0, 2.0, 5.0, 4.0])}
    a = adapters.labelled_advantages(r, ["x", ("y", 1), "x", ("y", 1), "x"], out_dtype=torch.float64)
    b = gdpo.gdpo_advantages(torch.stack([r["acc"], r["len"]], 1), group_ids=torch.tensor([0, 1, 0, 1, 0]),
                             out_dtype=torch.float64)
    assert torch.equal(a, b)
    with pytest.raises(gdpo.ShapeError, match="index has 4 labels for 5 samples"):
        adapters.labelled_advantages(r, ["x"] * 4)
    with pytest.raises(gdpo.ShapeError, match="one length"):
        adapters.labelled_advantages({"a": torch.zeros(3), "b": torch.zeros(4)}, [0, 0, 0])


def test_importing_impl_stays_light():
    code = ("import sys, impl.gdpo, impl.adapters; "
            "print(sorted(m for m in ('mpmath', 'hypothesis', 'matplotlib', 'oracle', 'conformance') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
