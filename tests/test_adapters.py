"""Drop-in call shapes (impl/adapters.py) agree with impl.gdpo and with the exact oracle."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from impl import adapters, gdpo
from impl._problems import GroupLengthError
from oracle import gdpo as oracle
from spec.errors import (GDPOError, GroupError, InputDtypeError, NonFiniteError, OutOfRangeError, ShapeError,
                         WeightError)
from tests import _dist


def test_trl_shape_is_gdpo_with_contiguous_groups():
    gen = torch.Generator().manual_seed(0)
    r = torch.randn(32, 3, generator=gen)
    w = [1.0, 0.5, 2.0]
    a = adapters.trl_advantages(r, num_generations=8, reward_weights=w, out_dtype=torch.float64)
    assert torch.equal(a, gdpo.gdpo_advantages(r, group_size=8, weights=w, out_dtype=torch.float64))
    res = oracle.gdpo_advantages(r.numpy().astype(np.float64), group_size=8, weights=w)  # the same keywords as impl
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
    res = oracle.gdpo_advantages(scores.numpy(), [0, 0, 1, 1, 2, 2], weights=[1.0, 0.5])
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
    with pytest.raises(gdpo.ShapeError, match="labels has length 4 but each reward component has 5 samples"):
        adapters.labelled_advantages(r, ["x"] * 4)
    with pytest.raises(gdpo.ShapeError, match="one length"):
        adapters.labelled_advantages({"a": torch.zeros(3), "b": torch.zeros(4)}, [0, 0, 0])


def test_importing_impl_stays_light():
    code = ("import sys, impl.gdpo, impl.adapters; "
            "print(sorted(m for m in ('mpmath', 'hypothesis', 'matplotlib', 'oracle', 'conformance') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


# ------------------------------------------------------------ review of the adapters: components, labels, messages

X = torch.tensor([0.0, 1.0, 0.0, 1.0])
MASK = torch.tensor([[1, 0], [1, 1], [1, 1], [1, 1]])


def _tok(seed=0):
    return torch.rand(4, 2, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("bad", [
    torch.tensor([2 ** 24 + 1, 2 ** 24] * 2, dtype=torch.int64),  # beside float32: stack rounded it to 2**24
    torch.tensor([True, False, True, False]),
    torch.tensor([1, 0, 1, 0], dtype=torch.int32),
    torch.zeros(4, dtype=torch.complex64),
    [1, 0, 1, 0],  # Python ints: int64, as impl.gdpo reads them
], ids=["int64", "bool", "int32", "complex", "int_list"])
def test_labelled_refuses_a_non_float_component_beside_floats_naming_its_key(bad):
    with pytest.raises(InputDtypeError, match=r"rewards\['b'\] has dtype \w+; Eq. 4 needs a real floating"):
        adapters.labelled_advantages({"a": X, "b": bad}, [0, 0, 1, 1], weights={"a": 0.0, "b": 1.0})


@pytest.mark.parametrize("dtypes, widened", [
    ((torch.float16, torch.bfloat16), torch.float32),
    ((torch.float8_e4m3fn, torch.float32), torch.float32),
    ((torch.float8_e5m2, torch.float16), torch.float32),
    ((torch.float32, torch.float64), torch.float64),
    ((torch.bfloat16, torch.bfloat16), torch.bfloat16),
    ((torch.float8_e4m3fn, torch.float8_e4m3fn), torch.float32),  # impl.gdpo reads no float8
    ((torch.float8_e5m2, torch.float8_e5m2), torch.float32),
])
def test_labelled_widens_float_components_exactly(dtypes, widened):
    a = torch.tensor([0.5, 1.0, 0.0, 3.0, 2.0, 0.25]).to(dtypes[0])
    b = torch.tensor([1.0, 0.0, 0.0, 2.0, 0.5, 0.75]).to(dtypes[1])
    got = adapters.labelled_advantages({"a": a, "b": b}, [0, 0, 1, 1, 2, 2], out_dtype=torch.float64)
    want = gdpo.gdpo_advantages(torch.stack([a.to(widened), b.to(widened)], 1), group_ids=[0, 0, 1, 1, 2, 2],
                                out_dtype=torch.float64)
    assert torch.equal(got, want)
    assert torch.equal(torch.stack([a.to(widened), b.to(widened)], 1).double(),
                       torch.stack([a.double(), b.double()], 1))  # the widening is exact


def test_labelled_component_shape_and_device_name_the_key():
    with pytest.raises(ShapeError, match=r"rewards\['a'\] must be 1-D \(N,\).*shape \(4, 1\)"):
        adapters.labelled_advantages({"a": torch.zeros(4, 1)}, [0, 0, 1, 1])
    with pytest.raises(InputDtypeError, match=r"rewards\['b'\] is on a device of type meta"):
        adapters.labelled_advantages({"a": X, "b": torch.zeros(4, device="meta")}, [0, 0, 1, 1])


@pytest.mark.parametrize("component", [[0.0, 1.0, 0.0, 1.0], (0.0, 1.0, 0.0, 1.0), np.array([0.0, 1.0, 0.0, 1.0])],
                         ids=["list", "tuple", "ndarray"])
def test_labelled_accepts_sequences_of_floats_like_impl_gdpo(component):
    got = adapters.labelled_advantages({"acc": component, "fmt": torch.tensor([0.5, 0.0, 1.0, 0.0])}, [0, 0, 1, 1],
                                       out_dtype=torch.float64)
    want = gdpo.gdpo_advantages(torch.tensor([[0.0, 0.5], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]], dtype=torch.float64),
                                group_ids=[0, 0, 1, 1], out_dtype=torch.float64)
    assert torch.equal(got, want)


def test_labelled_reads_python_floats_as_float64():
    x = [1.0, 1.0 + 2.0 ** -40, 0.0, 1.0]  # float32 would collapse the first group
    got = adapters.labelled_advantages({"acc": x}, [0, 0, 1, 1], out_dtype=torch.float64)
    assert torch.equal(got, gdpo.gdpo_advantages(x, group_ids=[0, 0, 1, 1], out_dtype=torch.float64))
    assert got[0] != got[1]


def test_verl_accepts_lists_for_rewards_and_mask():
    tok = [[1.0, 0.0], [0.0, 0.5], [1.0, 0.0], [0.0, 2.0]]
    got = adapters.verl_advantages({"acc": tok}, MASK.tolist(), [0, 0, 1, 1], out_dtype=torch.float64)
    want = adapters.verl_advantages({"acc": torch.tensor(tok, dtype=torch.float64)}, MASK, [0, 0, 1, 1],
                                    out_dtype=torch.float64)
    assert torch.equal(got, want)


@pytest.mark.parametrize("call, cls, needle", [
    (lambda: adapters.verl_advantages({"acc": _tok(), "fmt": _tok(1)}, MASK, [0, 0, 1, 1],
                                      weights={"acc": 1.0, 0: 2.0}),
     WeightError, r"unknown \[0\]"),
    (lambda: adapters.labelled_advantages({"acc": X}, [0, 0, 1, 1], weights={"acc": 1.0, 0: 2.0}),
     WeightError, r"unknown \[0\]"),
    (lambda: adapters.verl_advantages({"acc": torch.zeros(4)}, torch.ones(4), index=[0, 0, 1, 1]),
     ShapeError, r"response_mask must be \(B, T\).*shape \(4,\)"),
    (lambda: adapters.verl_advantages({"acc": torch.zeros(4)}, MASK, index=[0, 0, 1, 1]),
     ShapeError, r"token_level_rewards\['acc'\] has shape \(4,\), response_mask \(4, 2\)"),
    (lambda: adapters.verl_advantages([_tok()], MASK, index=[0, 0, 1, 1]),
     InputDtypeError, "token_level_rewards must be a mapping"),
    (lambda: adapters.verl_advantages({"acc": _tok()}, MASK, index=[[0], [0], [1], [1]]),
     GroupError, r"index\[0\] = \[0\] is unhashable"),
    (lambda: adapters.verl_advantages({"acc": _tok()}, object(), index=[0, 0, 1, 1]),
     InputDtypeError, "response_mask must be a"),
    (lambda: adapters.verl_advantages({"acc": "abcd"}, MASK, index=[0, 0, 1, 1]),
     InputDtypeError, r"token_level_rewards\['acc'\] must be a tensor or a sequence of floats"),
    (lambda: adapters.labelled_advantages({"acc": X}, None), GroupError, "labels must hold one hashable label"),
    (lambda: adapters.labelled_advantages({"acc": X}, 4), GroupError, "labels must hold one hashable label"),
    (lambda: adapters.labelled_advantages({"acc": X}, {0, 1}), GroupError, "in order"),
    (lambda: adapters.labelled_advantages({"acc": X}, "aabb"), GroupError, "got str"),
    (lambda: adapters.labelled_advantages([X], [0, 0, 1, 1]), InputDtypeError, "rewards must be a mapping"),
    (lambda: adapters.labelled_advantages({"acc": X}, [0.0, 0.0, float("nan"), float("nan")]),
     GroupError, r"labels\[2\] is nan"),
    (lambda: adapters.labelled_advantages({"acc": X}, [0, 0, torch.tensor([1, 1]), 1]),
     GroupError, r"labels\[2\] is a 1-D Tensor"),
], ids=["verl_weight_key_types", "labelled_weight_key_types", "verl_1d_mask", "verl_1d_rewards", "verl_list_arg",
        "verl_unhashable_index", "verl_mask_object", "verl_reward_str", "labelled_none", "labelled_int",
        "labelled_set", "labelled_str", "labelled_list_arg", "labelled_nan_label", "labelled_tensor_label"])
def test_malformed_arguments_are_gdpo_errors_naming_what(call, cls, needle):
    with pytest.raises(cls, match=needle) as info:
        call()
    assert isinstance(info.value, GDPOError)


LABELS = [0, 0, 1, 1]


@pytest.mark.parametrize("labels", [
    torch.tensor([0.0, 0.0, 1.0, 1.0]), torch.tensor([True, True, False, False]), list(torch.tensor(LABELS)),
    np.array([0.0, 0.0, 1.0, 1.0]), [0.5, 0.5, 1.5, 1.5], list(np.array(LABELS)), torch.tensor(LABELS),
    np.array(["p", "p", "q", "q"], dtype=object),
], ids=["float_tensor", "bool_tensor", "list_of_0d", "float_ndarray", "float_list", "list_of_np_ints", "int_tensor",
        "object_ndarray"])
def test_tensor_and_array_labels_mean_their_values(labels):
    r = torch.tensor([[1.0, 0.5], [0.0, 0.25], [1.0, 0.0], [0.0, 2.0]])
    want = gdpo.gdpo_advantages(r, group_ids=LABELS, out_dtype=torch.float64)
    got = adapters.labelled_advantages({"a": r[:, 0], "b": r[:, 1]}, labels, out_dtype=torch.float64)
    assert torch.equal(got, want)
    tok = torch.zeros(4, 2, dtype=torch.float64)
    tok[:, 1] = r[:, 0].double()
    got = adapters.verl_advantages({"a": tok}, torch.ones(4, 2), labels, out_dtype=torch.float64)
    assert torch.equal(got[:, 0], gdpo.gdpo_advantages(r[:, 0], group_ids=LABELS, out_dtype=torch.float64))


@pytest.mark.parametrize("junk", [float("nan"), float("inf"), float("-inf"), 1e30])
def test_verl_padding_does_not_matter(junk):
    tok = _tok()
    clean = adapters.verl_advantages({"acc": tok}, MASK, ["a", "a", "b", "b"], out_dtype=torch.float64)
    dirty = tok.clone()
    dirty[0, 1] = junk  # sample 0's padding token
    got = adapters.verl_advantages({"acc": dirty}, MASK, ["a", "a", "b", "b"], out_dtype=torch.float64)
    assert torch.equal(got, clean) and got[0, 1].item() == 0.0


@pytest.mark.parametrize("out_dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16,
                                       torch.float8_e4m3fn, torch.float8_e5m2])
def test_verl_padding_is_positive_zero_in_every_out_dtype(out_dtype):
    tok = torch.tensor([[0.1, 5.0], [0.3, 0.2], [0.9, 0.0], [0.2, 0.1]])  # sample 0 scores 0.1 < 0.5
    adv = adapters.verl_advantages({"acc": tok}, MASK, ["a", "a", "b", "b"], out_dtype=out_dtype)
    assert adv.dtype == out_dtype and adv[0, 0].item() < 0  # sample 0 (padded) has a negative advantage
    assert adv[0, 1].item() == 0.0 and not torch.signbit(adv[0, 1].float())  # +0.0, not a * 0 = -0.0
    scores = torch.where(MASK.bool(), tok.double(), 0.0).sum(1)
    per_sample = gdpo.gdpo_advantages(scores, group_ids=[0, 0, 1, 1], out_dtype=out_dtype)
    assert torch.equal(adv.float(), per_sample.float()[:, None] * MASK)  # the bits, on every response token


@pytest.mark.parametrize("value, kind", [(float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf")])
def test_verl_nonfinite_response_token_names_key_sample_token_and_label(value, kind):
    fmt = _tok(1)
    fmt[2, 1] = value
    fmt[0, 1] = float("nan")  # padding: not the culprit
    with pytest.raises(NonFiniteError) as info:
        adapters.verl_advantages({"acc": _tok(), "fmt": fmt}, MASK, ["a", "a", "b", "b"])
    assert type(info.value) is NonFiniteError
    assert str(info.value) == (f"token_level_rewards['fmt'][2, 1] (sample 2, response token 1, group label 'b') "
                               f"is {kind}")


def test_verl_score_overflow_is_out_of_range_not_an_invented_inf():
    tok = torch.rand(4, 2, dtype=torch.float64)
    tok[1] = 1e308  # two finite token rewards whose sum is beyond float64
    with pytest.raises(OutOfRangeError, match=r"sample 1 under token_level_rewards\['acc'\].*beyond float64 \(inf\)"):
        adapters.verl_advantages({"acc": tok}, MASK, ["a", "a", "b", "b"])


def _defer_mask_checks(monkeypatch):
    """The CUDA path on the CPU: no host read is free, so the mask's values ride impl.gdpo's read."""
    monkeypatch.setattr(adapters, "reads_free", lambda device: False)


def _masked(dtype, *entries):
    m = MASK.to(dtype, copy=True)
    for (i, t), v in entries:
        m[i, t] = v
    return m


@pytest.mark.parametrize("deferred", [False, True], ids=["read_at_once", "through_gdpos_read"])
@pytest.mark.parametrize("mask, where, shown", [
    (_masked(torch.float32, ((3, 1), 0.5)), "[3, 1] (sample 3, token 1)", "0.5"),
    (_masked(torch.int64, ((1, 0), 2)), "[1, 0] (sample 1, token 0)", "2"),
    (_masked(torch.float64, ((2, 1), float("nan"))), "[2, 1] (sample 2, token 1)", "nan"),
    (_masked(torch.float64, ((0, 1), float("-inf"))), "[0, 1] (sample 0, token 1)", "-inf"),  # on padding too
    (_masked(torch.int8, ((0, 1), -1)), "[0, 1] (sample 0, token 1)", "-1"),
    (_masked(torch.uint8, ((2, 0), 255)), "[2, 0] (sample 2, token 0)", "255"),
    (_masked(torch.float16, ((3, 0), 1.5)), "[3, 0] (sample 3, token 0)", "1.5"),
    (_masked(torch.float8_e4m3fn, ((3, 1), 0.5)), "[3, 1] (sample 3, token 1)", "0.5"),
    (_masked(torch.float32, ((2, 0), 3.0), ((1, 1), 0.25)), "[1, 1] (sample 1, token 1)", "0.25"),  # row-major
    ([[1, 0], [1, 2], [1, 1], [1, 1]], "[1, 1] (sample 1, token 1)", "2"),
], ids=["half", "int_two", "nan", "neg_inf_on_padding", "int8_minus_one", "uint8_255", "float16", "float8",
        "first_in_row_major_order", "list"])
def test_verl_mask_entries_other_than_0_and_1_are_refused_naming_the_entry(monkeypatch, deferred, mask, where,
                                                                           shown):
    """Any nonzero used to count as a response token: a mask of 0.5 (a soft mask, a
    weighting, a bug upstream) summed the whole reward silently."""
    if deferred:
        _defer_mask_checks(monkeypatch)
    with pytest.raises(OutOfRangeError) as info:
        adapters.verl_advantages({"acc": _tok(), "fmt": _tok(1)}, mask, ["a", "a", "b", "b"])
    assert type(info.value) is OutOfRangeError
    assert str(info.value) == f"response_mask{where} is {shown}; expected 0 or 1 (or a bool mask)"
    if deferred and not isinstance(mask, list):
        assert isinstance(info.value.__cause__, NonFiniteError)  # found by impl.gdpo's one host read


@pytest.mark.parametrize("deferred", [False, True], ids=["read_at_once", "through_gdpos_read"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.int64, torch.float32, torch.float64,
                                   torch.bfloat16, torch.float8_e5m2])
def test_verl_masks_of_0_and_1_mean_the_bool_mask_in_every_dtype(monkeypatch, deferred, dtype):
    want = adapters.verl_advantages({"acc": _tok()}, MASK.bool(), ["a", "a", "b", "b"], out_dtype=torch.float64)
    if deferred:
        _defer_mask_checks(monkeypatch)
    mask = MASK.to(dtype, copy=True)
    if mask.is_floating_point():
        mask[0, 1] = -0.0  # zero
    got = adapters.verl_advantages({"acc": _tok()}, mask, ["a", "a", "b", "b"], out_dtype=torch.float64)
    assert torch.equal(got, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_mask_values_are_checked_without_another_host_sync():
    import warnings

    tok, index = _tok().cuda(), torch.tensor([0, 0, 1, 1], device="cuda")

    def syncs(mask):
        adapters.verl_advantages({"acc": tok}, mask, index)  # warm-up
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                adapters.verl_advantages({"acc": tok}, mask, index)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return [str(w.message) for w in caught if "synchronizing" in str(w.message)]

    assert len(syncs(MASK.cuda().float())) == len(syncs(MASK.cuda().bool())), syncs(MASK.cuda().float())
    bad = _masked(torch.float32, ((3, 1), 0.5)).cuda()
    with pytest.raises(OutOfRangeError, match=r"^response_mask\[3, 1\] \(sample 3, token 1\) is 0.5; expected 0 or 1"):
        adapters.verl_advantages({"acc": tok}, bad, index)


@pytest.mark.parametrize("labels, name", [([10, 10, 20, 20, 30], "30"), (["x", "x", "y", "y", "z"], "'z'"),
                                          (np.array([10, 10, 20, 20, 30]), "30"),
                                          (torch.tensor([10, 10, 20, 20, 30]), "30"),
                                          ([("q", 1)] * 2 + [("q", 2)] * 2 + [("q", 3)], "('q', 3)")])
def test_group_errors_name_the_callers_label(labels, name):
    with pytest.raises(GroupError) as info:
        adapters.labelled_advantages({"acc": torch.rand(5)}, labels)
    assert type(info.value) is GroupError
    assert str(info.value).startswith(f"group label {name} (first sample 4) has 1 sample"), str(info.value)
    assert isinstance(info.value.__cause__, GroupError)  # impl.gdpo's own refusal, chained
    tok = torch.rand(5, 2)
    with pytest.raises(GroupError, match=rf"group label {re.escape(name)} \(first sample 4\)"):
        adapters.verl_advantages({"acc": tok}, torch.ones(5, 2), labels)


def test_labelled_nonfinite_and_weight_errors_name_the_key():
    fmt = torch.tensor([0.0, 1.0, float("nan"), 2.0])
    with pytest.raises(NonFiniteError) as info:
        adapters.labelled_advantages({"acc": X, "fmt": fmt}, ["x", "x", "y", "y"])
    assert type(info.value) is NonFiniteError
    assert str(info.value) == "rewards['fmt'][2] (sample 2, group label 'y') is nan"
    with pytest.raises(WeightError, match=r"^weights\['fmt'\] is inf$"):
        adapters.labelled_advantages({"acc": X, "fmt": X}, [0, 0, 1, 1], weights={"acc": 1.0, "fmt": float("inf")})
    with pytest.raises(WeightError, match=r"^weights\[1\] \(reward 'fmt'\) is nan$"):
        adapters.verl_advantages({"acc": _tok(), "fmt": _tok(1)}, MASK, [0, 0, 1, 1], weights=[1.0, float("nan")])


@pytest.mark.parametrize("form", [list, torch.tensor, np.array, tuple], ids=["list", "tensor", "ndarray", "tuple"])
@pytest.mark.parametrize("n", [3, 5])
def test_wrong_length_labels_are_a_group_length_error_naming_the_argument(form, n):
    labels = form([0, 0, 1, 1, 1][:n])
    with pytest.raises(GroupLengthError, match=rf"^index has length {n} but response_mask has 4 samples"):
        adapters.verl_advantages({"acc": _tok()}, MASK, labels)
    with pytest.raises(GroupLengthError, match=rf"^labels has length {n} but each reward component has 4 samples"):
        adapters.labelled_advantages({"acc": X}, labels)
    assert issubclass(GroupLengthError, GroupError) and issubclass(GroupLengthError, ShapeError)


def test_two_d_labels_are_a_group_length_error():
    with pytest.raises(GroupLengthError, match=r"^index must be 1-D"):
        adapters.verl_advantages({"acc": _tok()}, MASK, torch.zeros(4, 1, dtype=torch.int64))


@pytest.mark.parametrize("g", [2.0, True, "2", None])
def test_trl_names_num_generations(g):
    with pytest.raises(GroupError, match=r"^num_generations must be a Python int"):
        adapters.trl_advantages(torch.rand(4, 2), g)


@pytest.mark.parametrize("g", [np.int64(2), np.uint8(2), np.array(2), torch.tensor(2),
                               torch.tensor(2, dtype=torch.int32)],
                         ids=["np_int64", "np_uint8", "np_0d", "tensor", "tensor_int32"])
def test_trl_num_generations_takes_every_integer_scalar_group_size_takes(g):
    """Without a process group torch.tensor(2) was refused ("must be a Python int") and np.int64(2)
    accepted; with one, both were accepted (impl.gdpo's group_size rule)."""
    r = torch.rand(4, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    want = adapters.trl_advantages(r, 2, out_dtype=torch.float64)
    assert torch.equal(adapters.trl_advantages(r, g, out_dtype=torch.float64), want)


@pytest.mark.parametrize("g", [2.0, True, "2", None, torch.tensor(2.0), torch.tensor([2]), np.float32(2.0), [2]],
                         ids=["float", "bool", "str", "none", "tensor_float", "tensor_1d", "np_float", "list"])
def test_trl_num_generations_refusal_is_group_sizes_in_trls_name(g):
    """The message is impl.gdpo's group_size one (the rule as it is applied, what was given) with
    TRL's name: it said "must be a Python int" while NumPy integers were accepted."""
    r = torch.rand(4, 2)
    with pytest.raises(GroupError) as info:
        adapters.trl_advantages(r, g)
    if g is None:  # impl.gdpo reads group_size=None as "no groups given"; the adapter names the value
        want = ("num_generations must be a Python int, a NumPy integer or a 0-d integer tensor (not a bool); "
                "got None")
    else:
        with pytest.raises(GroupError) as plain:
            gdpo.gdpo_advantages(r, group_size=g)
        want = str(plain.value).replace("group_size", "num_generations")
    assert str(info.value) == want


@pytest.mark.parametrize("call, needle", [
    (lambda: adapters.trl_advantages(torch.rand(5, 2), 2), r"not a multiple of num_generations=2"),
    (lambda: adapters.trl_advantages(torch.rand(4, 2), 1), r"^num_generations=1: Eq. 4"),
    (lambda: adapters.trl_advantages(torch.rand(4, 2), 2, [1.0]), r"^reward_weights has length 1 but rewards_per_func"),
    (lambda: adapters.trl_advantages(torch.ones(4, 2, dtype=torch.int64), 2), r"^rewards_per_func has dtype int64"),
])
def test_trl_refusals_use_trls_argument_names(call, needle):
    with pytest.raises(GDPOError, match=needle) as info:
        call()
    assert type(info.value) is type(info.value.__cause__)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_labels_and_host_inputs():
    dev = torch.device("cuda")
    r = torch.tensor([[1.0, 0.5], [0.0, 0.25], [1.0, 0.0], [0.0, 2.0]], device=dev)
    want = gdpo.gdpo_advantages(r, group_ids=LABELS, out_dtype=torch.float64)
    for labels in (torch.tensor(LABELS, device=dev), torch.tensor([0.0, 0.0, 1.0, 1.0], device=dev),
                   ["a"] * 2 + ["b"] * 2):
        got = adapters.labelled_advantages({"a": r[:, 0], "b": r[:, 1]}, labels, out_dtype=torch.float64)
        assert got.device.type == "cuda" and torch.equal(got, want)
    got = adapters.labelled_advantages({"a": r[:, 0], "b": r[:, 1].tolist()}, LABELS, out_dtype=torch.float64)
    assert torch.equal(got, want)  # the list lands on the first tensor's device
    with pytest.raises(InputDtypeError, match=r"rewards\['b'\] is on cpu but rewards\['a'\] on cuda"):
        adapters.labelled_advantages({"a": r[:, 0], "b": r[:, 1].cpu()}, LABELS)
    mask = MASK.to(dev)
    tok = _tok().to(dev)
    tok[0, 1] = float("inf")
    got = adapters.verl_advantages({"acc": tok, "f": tok.tolist()}, mask, ["a", "a", "b", "b"])
    assert got.device.type == "cuda" and torch.isfinite(got).all() and got[0, 1].item() == 0.0
    with pytest.raises(InputDtypeError, match=r"token_level_rewards\['acc'\] is on cpu but response_mask on cuda"):
        adapters.verl_advantages({"acc": tok.cpu()}, mask, ["a", "a", "b", "b"])
    tok[1, 1] = float("nan")
    with pytest.raises(NonFiniteError, match=r"^token_level_rewards\['acc'\]\[1, 1\] \(sample 1, response token 1"):
        adapters.verl_advantages({"acc": tok}, mask, ["a", "a", "b", "b"])


# ------------------------------------------------------------ across ranks: nobody is left waiting


def _adapters_rank(rank, world, init_file, out_dir):
    """One gloo rank: the adapters under a process group; each scenario's outcome to a file."""
    import pickle

    import torch.distributed as dist

    _dist.join(rank, world, init_file, 15)
    group = dist.group.WORLD
    tok = torch.rand(4, 2, generator=torch.Generator().manual_seed(rank))
    x = torch.tensor([0.0, 1.0, 2.0, 0.5]) + rank
    scenarios = {
        "verl_short_index": lambda: adapters.verl_advantages(
            {"acc": tok}, torch.ones(4, 2), ["a", "a", "b"] if rank == 1 else ["a", "a", "b", "b"],
            process_group=group),
        "labelled_long_tensor": lambda: adapters.labelled_advantages(
            {"acc": x}, torch.tensor([0, 0, 1, 1, 1] if rank == 0 else [0, 0, 1, 1]), process_group=group),
        "trl_float_generations": lambda: adapters.trl_advantages(torch.rand(4, 2), 2.0 if rank == 0 else 2,
                                                                 process_group=group),
        "trl_scalar_generations": lambda: (  # a 0-d tensor and a NumPy integer: accepted as without a group
            adapters.trl_advantages(x[:, None].double(), torch.tensor(2) if rank == 0 else np.int64(2),
                                    process_group=group, out_dtype=torch.float64),
            adapters.trl_advantages(x[:, None].double(), 2, process_group=group, out_dtype=torch.float64)),
        "trl_none_generations": lambda: adapters.trl_advantages(torch.rand(4, 2), None if rank == 1 else 2,
                                                                process_group=group),
        "labelled_strings": lambda: (
            adapters.labelled_advantages({"acc": x, "fmt": x.flip(0)}, ["p", "p", "q", "q"], process_group=group,
                                         out_dtype=torch.float64),
            gdpo.gdpo_advantages(torch.stack([x, x.flip(0)], 1), group_ids=[0, 0, 1, 1], process_group=group,
                                 out_dtype=torch.float64)),
    }
    out = {}
    for name, call in scenarios.items():
        try:
            out[name] = ("ok", call())
        except Exception as e:  # noqa: BLE001 - recorded for the parent
            out[name] = (type(e).__name__, str(e))
        with open(os.path.join(out_dir, f"{rank}.pkl"), "wb") as f:
            pickle.dump(out, f)
    dist.destroy_process_group()


def _two_ranks(target, tmp_path) -> dict:
    """Run ``target(rank, world, rendezvous, out_dir)`` on 2 spawned gloo ranks; each rank's pickled results."""
    import pickle

    done = _dist.spawn(target, 2, (), str(tmp_path), deadline_s=120)
    outs = {}
    for r in range(2):
        with open(os.path.join(done.out_dir, f"{r}.pkl"), "rb") as f:
            outs[r] = pickle.load(f)
    return outs


@pytest.mark.distributed
def test_wrong_length_labels_under_a_process_group_fail_every_rank_together(tmp_path):
    """A rank whose labels have the wrong length must not raise before impl.gdpo's agreement
    (its peers would wait there until the timeout): every rank raises the same DistributedError."""
    outs = _two_ranks(_adapters_rank, tmp_path)
    # in the adapter's own words: verl has no `rewards` (it once said "index has 3 labels but rewards has N=4 rows")
    for name, culprit in (("verl_short_index", "rank 1: GDPOError: GroupLengthError raised by the caller's adapter "
                                               "before the call: index has length 3 but response_mask has 4 samples"),
                          ("labelled_long_tensor", "rank 0: GDPOError: GroupLengthError raised by the caller's adapter "
                                                   "before the call: labels has length 5 but each reward component "
                                                   "has 4 samples")):
        kinds = [outs[r][name] for r in range(2)]
        assert kinds[0] == kinds[1] and kinds[0][0] == "DistributedError" and culprit in kinds[0][1], kinds
        assert "rewards has N=" not in kinds[0][1], kinds
    kinds = [outs[r]["trl_float_generations"] for r in range(2)]
    assert kinds[0] == kinds[1] and "rank 0: GroupError: num_generations must be a Python int" in kinds[0][1], kinds
    for r in range(2):
        kind, (got, want) = outs[r]["trl_scalar_generations"]
        assert kind == "ok" and torch.equal(got, want)
    kinds = [outs[r]["trl_none_generations"] for r in range(2)]
    assert kinds[0] == kinds[1] and kinds[0][0] == "DistributedError" \
        and "rank 1: GDPOError: GroupError raised by the caller's adapter" in kinds[0][1], kinds
    for r in range(2):
        kind, (got, want) = outs[r]["labelled_strings"]
        assert kind == "ok" and torch.equal(got, want)


def _tensor_arg(values, dtype="float32"):
    return ("tensor", values, dtype)


@pytest.mark.distributed
def test_an_adapters_own_refusal_under_a_process_group_fails_every_rank_together():
    """A refusal by the adapter itself (before impl.gdpo) on one rank must not leave its
    peers waiting in the agreement until the group's timeout: every rank raises the same
    DistributedError naming that rank at once, and that rank chains the adapter's own error."""

    tok = [[1.0, 0.5], [0.0, 0.25], [1.0, 1.0], [0.5, 0.0]]
    mask = [[1, 1], [1, 0], [1, 1], [1, 1]]
    good_verl = {"token_level_rewards": {"acc": _tensor_arg(tok)}, "response_mask": _tensor_arg(mask, "int64"),
                 "index": ["a", "a", "b", "b"]}
    good_lab = {"rewards": {"acc": _tensor_arg([0.0, 1.0, 2.0, 0.5]), "fmt": _tensor_arg([1.0, 0.0, 0.5, 0.5])},
                "labels": ["p", "p", "q", "q"]}
    cases = {  # name: (adapter, rank 1's arguments, rank 1's own refusal class, a word of its message)
        "verl_int_reward": ("verl_advantages", {**good_verl, "token_level_rewards": {
            "acc": _tensor_arg([[1, 0], [0, 0], [1, 1], [0, 1]], "int64")}}, "InputDtypeError", "int64"),
        "verl_1d_mask": ("verl_advantages", {**good_verl, "response_mask": _tensor_arg([1, 1, 1, 1], "int64")},
                         "ShapeError", "response_mask must be (B, T)"),
        "verl_weight_keys": ("verl_advantages", {**good_verl, "weights": {"fmt": 1.0}}, "WeightError", "missing"),
        "verl_mask_half": ("verl_advantages", {**good_verl, "response_mask": _tensor_arg([[1, 1], [1, 0.5], [1, 1],
                                                                                          [1, 1]])},
                           "OutOfRangeError", "response_mask[1, 1] (sample 1, token 1) is 0.5; expected 0 or 1"),
        "labelled_unhashable": ("labelled_advantages", {**good_lab, "labels": ["p", ["p"], "q", "q"]},
                                "GroupError", "unhashable"),
        "labelled_nan_label": ("labelled_advantages", {**good_lab, "labels": [0.5, 0.5, float("nan"), 1.0]},
                               "GroupError", "NaN label"),
        "labelled_int_reward": ("labelled_advantages", {**good_lab, "rewards": {
            "acc": _tensor_arg([0, 1, 2, 0], "int64"), "fmt": _tensor_arg([1.0, 0.0, 0.5, 0.5])}},
            "InputDtypeError", "int64"),
        "labelled_not_a_mapping": ("labelled_advantages", {**good_lab, "rewards": [[0.0, 1.0]]},
                                   "InputDtypeError", "must be a mapping"),
    }
    scenarios = [(name, "adapter", {"adapter": adapter, "args": [good_verl if adapter == "verl_advantages"
                                                                 else good_lab, bad]})
                 for name, (adapter, bad, _, _) in cases.items()]
    scenarios.append(("still_in_step", "adapter", {"adapter": "labelled_advantages", "args": [good_lab, good_lab]}))
    run = _dist.run_group(2, scenarios, group_timeout_s=20.0, deadline_s=120.0)
    assert not run.hung, run.stderr[-3000:]
    for name, (_, _, cls, words) in cases.items():
        recs = run.by_rank(name)
        assert [recs[r]["status"] for r in range(2)] == ["error", "error"], (name, recs)
        assert recs[0]["cls"] == recs[1]["cls"] == "DistributedError", (name, recs[0]["tb"], recs[1]["tb"])
        assert recs[0]["msg"] == recs[1]["msg"], name
        assert f"rank 1: GDPOError: {cls} raised by the caller's adapter before the call: " in recs[0]["msg"], \
            (name, recs[0]["msg"])
        assert words in recs[0]["msg"], (name, recs[0]["msg"])  # rank 1's own words reach rank 0
        assert "rank 0" not in recs[0]["msg"], (name, recs[0]["msg"])
        assert all(recs[r]["seconds"] < 5 for r in range(2)), (name, [recs[r]["seconds"] for r in range(2)])
        assert any(c.startswith(f"{cls}: ") and words in c for c in recs[1]["causes"]), (name, recs[1]["causes"])
    recs = run.by_rank("still_in_step")  # the group is still usable afterwards
    assert recs[0]["status"] == recs[1]["status"] == "ok", recs


def _sample_names_rank(rank, world, init_file, out_dir):
    """One gloo rank: refusals found by impl.gdpo on rank 1 only, through the adapters;
    each scenario's class, message and (on the rank that chains one) cause to a file."""
    import pickle

    import torch.distributed as dist

    _dist.join(rank, world, init_file, 15)
    group = dist.group.WORLD
    bad = rank == 1
    acc = torch.tensor([0.0, 1.0, float("nan") if bad else 2.0, 0.5])
    tok = torch.tensor([[1.0, 0.5], [0.0, 0.25], [float("inf") if bad else 1.0, 1.0], [0.5, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0.5 if bad else 0.0], [1, 1], [1, 1]])
    x = torch.tensor([0.0, 1.0, 2.0, 0.5])
    huge = {"acc": 1.5e308, "fmt": 1.5e308}
    scenarios = {
        # rank 0: the caller's integers; rank 1: strings, numbered by the adapter (q is its group 1)
        "group_of_one": lambda: adapters.labelled_advantages(
            {"acc": x}, ["p", "p", "q", "r"] if bad else [0, 0, 1, 1], process_group=group),
        "labelled_nan": lambda: adapters.labelled_advantages(
            {"acc": acc, "fmt": x}, ["p", "p", "q", "q"], process_group=group),
        "verl_inf": lambda: adapters.verl_advantages(
            {"acc": tok}, torch.ones(4, 2), ["a", "a", "b", "b"], process_group=group),
        # Eq. 7 beyond float64 on rank 1 only (rank 0's two components cancel)
        "eq7_overflow": lambda: adapters.labelled_advantages(
            {"acc": x, "fmt": x if bad else torch.tensor([1.0, 0.0, 0.5, 2.0])}, ["x", "x", "y", "y"],
            weights=huge, process_group=group),
        "verl_mask_through_gdpos_read": lambda: adapters.verl_advantages(
            {"acc": torch.ones(4, 2)}, mask, ["a", "a", "b", "b"], process_group=group),
    }
    out = {}
    for name, call in scenarios.items():
        reads_free = adapters.reads_free
        if name == "verl_mask_through_gdpos_read":  # the CUDA path, on gloo
            adapters.reads_free = lambda device: False
        try:
            call()
            out[name] = ("ok", "", "")
        except Exception as e:  # noqa: BLE001 - recorded for the parent
            cause = e.__cause__
            out[name] = (type(e).__name__, str(e), "" if cause is None else f"{type(cause).__name__}: {cause}")
        finally:
            adapters.reads_free = reads_free
        with open(os.path.join(out_dir, f"{rank}.pkl"), "wb") as f:
            pickle.dump(out, f)
    dist.destroy_process_group()


@pytest.mark.distributed
def test_distributed_errors_name_the_failing_ranks_sample_not_an_internal_group_number(tmp_path):
    """A DistributedError used to name a group by impl.gdpo's label, which for labels other
    than integers is the adapter's own number on that rank ("group label 1"), a number no
    caller passed. Every rank prints the same message, and labels differ by rank: the group
    is named by the failing rank's sample instead, which that rank's caller can look up."""
    outs = _two_ranks(_sample_names_rank, tmp_path)
    want = {
        "group_of_one": r"rank 1: GroupError: the group of labels\[2\] \(sample 2\) has 1 sample, as does 1 other "
                        r"group; Eq. 4 needs",  # q and r: the first named, the other counted
        "labelled_nan": r"rank 1: NonFiniteError: the reward of sample 2 in reward column 0 \(the group of "
                        r"labels\[2\]\) is nan",
        "verl_inf": r"rank 1: NonFiniteError: the score \(sum of response tokens\) of sample 2 in reward column 0 "
                    r"\(the group of index\[2\]\) is inf$",
        "eq7_overflow": r"rank 1: OutOfRangeError: Eq. 7 .* overflows float64 at sample (\d) \(the group of "
                        r"labels\[\1\]\)",
        "verl_mask_through_gdpos_read": r"rank 1: NonFiniteError: the score \(sum of response tokens\) of sample 1 "
                                        r"in reward column 0 \(the group of index\[1\]\) is nan \(a NaN token "
                                        r"reward, or on CUDA a response_mask row 1 with an entry other than 0 and 1 or no "
                                        r"response token",
    }
    for name, pattern in want.items():
        (cls0, msg0, _), (cls1, msg1, cause1) = outs[0][name], outs[1][name]
        assert cls0 == cls1 == "DistributedError" and msg0 == msg1, (name, outs[0][name], outs[1][name])
        assert re.search(pattern, msg0), (name, msg0)
        assert "group label" not in msg0 and "rank 0" not in msg0 and " row 2" not in msg0, (name, msg0)
    causes = {name: outs[1][name][2] for name in want}  # the failing rank chains its own error, in its terms
    assert causes["verl_inf"] == ("NonFiniteError: token_level_rewards['acc'][2, 0] (sample 2, response token 0, "
                                  "group label 'b') is inf")
    assert causes["verl_mask_through_gdpos_read"] == ("OutOfRangeError: response_mask[1, 1] (sample 1, token 1) is "
                                                      "0.5; expected 0 or 1 (or a bool mask)")
    assert outs[0]["verl_inf"][2].startswith("DistributedError: "), outs[0]["verl_inf"]  # nothing of its own


@pytest.mark.parametrize("deferred", [False, True], ids=["read_at_once", "through_gdpos_read"])
@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.float32, torch.float8_e4m3fn])
def test_verl_a_sample_without_a_response_token_is_refused_naming_it(monkeypatch, deferred, dtype):
    """Its score used to be the sum over nothing, a 0 that no reward gave, and its group
    was standardized against that phantom score."""
    if deferred:
        _defer_mask_checks(monkeypatch)
    mask = MASK.to(dtype, copy=True)
    mask[2] = 0
    with pytest.raises(ShapeError) as info:
        adapters.verl_advantages({"acc": _tok(), "fmt": _tok(1)}, mask, ["a", "a", "b", "b"])
    assert str(info.value) == ("response_mask[2] (sample 2) has no response token: its score would be a sum over "
                               "nothing, a 0 that no reward gave; drop the sample or fix the mask")
    if deferred:
        assert isinstance(info.value.__cause__, NonFiniteError)  # found by impl.gdpo's one host read
    value = _masked(torch.float32, ((1, 0), 0.5))
    value[3] = 0  # a bad value is named before an empty row, whatever their order
    with pytest.raises(OutOfRangeError, match=r"^response_mask\[1, 0\]"):
        adapters.verl_advantages({"acc": _tok()}, value, ["a", "a", "b", "b"])


@pytest.mark.parametrize("make, shown", [
    (lambda t: t.to_sparse(), r"has layout torch.sparse_coo; impl.gdpo reads dense"),
    (lambda t: torch.nested.nested_tensor([t], layout=torch.jagged),
     r"is a nested tensor \(layout torch.jagged\); impl.gdpo reads ordinary dense")])
def test_labelled_refuses_a_component_that_is_not_dense_naming_its_key(make, shown):
    with pytest.raises(InputDtypeError, match=rf"^rewards\['b'\] {shown}"):
        adapters.labelled_advantages({"a": X, "b": make(X)}, [0, 0, 1, 1])


def test_sparse_inputs_to_verl_and_trl_are_refused_in_the_callers_names():
    tok = _tok()
    with pytest.raises(InputDtypeError, match=r"^response_mask has layout torch.sparse_coo; impl.gdpo reads dense"):
        adapters.verl_advantages({"acc": tok}, MASK.to_sparse(), ["a", "a", "b", "b"])
    with pytest.raises(InputDtypeError, match=r"^token_level_rewards\['acc'\] has layout torch.sparse_coo"):
        adapters.verl_advantages({"acc": tok.to_sparse()}, MASK, ["a", "a", "b", "b"])
    with pytest.raises(InputDtypeError, match=r"^rewards_per_func has layout torch.sparse_coo; .* "
                                              r"rewards_per_func.to_dense\(\)$"):
        adapters.trl_advantages(tok.to_sparse(), 2)
    with pytest.raises(InputDtypeError, match=r"^rewards_per_func has dtype float8_e4m3fn; .* "
                                              r"rewards_per_func.float\(\) \(exact\)$"):
        adapters.trl_advantages(tok.to(torch.float8_e4m3fn), 2)


def _reward_names_rank(rank, world, init_file, out_dir):
    """One gloo rank: the adapters' reward mappings name different components, or the same
    ones in another order, on rank 1; each scenario's class and message (or hex bits)."""
    import pickle

    import torch.distributed as dist

    _dist.join(rank, world, init_file, 15)
    group = dist.group.WORLD
    bad = rank == 1
    x = torch.tensor([0.0, 1.0, 2.0, 0.5]) + rank
    y = torch.tensor([1.0, 0.0, 0.5, 3.0]) * (rank + 1)
    labels = ["p", "p", "q", "q"]
    mask = torch.ones(4, 2)
    scenarios = {
        "labelled_other_names": lambda: adapters.labelled_advantages(
            {"acc": x, "len" if bad else "fmt": y}, labels, process_group=group),
        "verl_other_names": lambda: adapters.verl_advantages(
            {"acc": x[:, None].expand(4, 2), "len" if bad else "fmt": y[:, None].expand(4, 2)}, mask, labels,
            process_group=group),
        "labelled_other_order": lambda: adapters.labelled_advantages(
            {"len": y, "acc": x} if bad else {"acc": x, "len": y}, labels, weights={"acc": 1.0, "len": 0.5},
            process_group=group),
        "labelled_same_order": lambda: adapters.labelled_advantages(
            {"acc": x, "len": y}, labels, weights={"acc": 1.0, "len": 0.5}, process_group=group),
        "labelled_other_weights": lambda: adapters.labelled_advantages(
            {"acc": x, "len": y}, labels, weights={"acc": 1.0, "len": 0.25 if bad else 0.5}, process_group=group),
    }
    out = {}
    for name, call in scenarios.items():
        try:
            out[name] = ("ok", [float(v).hex() for v in call().reshape(-1).tolist()])
        except Exception as e:  # noqa: BLE001 - recorded for the parent
            out[name] = (type(e).__name__, str(e))
    with open(os.path.join(out_dir, f"{rank}.pkl"), "wb") as f:
        pickle.dump(out, f)
    dist.destroy_process_group()


@pytest.mark.distributed
def test_reward_names_are_agreed_across_ranks(tmp_path):
    """Found by review: the adapters took columns in mapping order and the agreement compared
    K and the weights only. Ranks whose mappings named different components computed column
    by column ("fmt" on rank 0 with "len" on rank 1); ranks whose mappings listed the same
    components in another order were refused as if their weights differed."""
    outs = _two_ranks(_reward_names_rank, tmp_path)
    for name in ("labelled_other_names", "verl_other_names"):
        for r in range(2):
            cls, msg = outs[r][name]
            assert cls == "DistributedError", (name, r, outs[r][name])
            assert msg.endswith("refused on all 2 ranks: reward names or weights differ across ranks (rank 0: "
                                "{'acc': 1.0, 'fmt': 1.0}; rank 1: {'acc': 1.0, 'len': 1.0})"), (name, msg)
    for r in range(2):  # another order, the same names and weights: the same call, bit for bit (K = 2)
        assert outs[r]["labelled_other_order"][0] == "ok", outs[r]["labelled_other_order"]
        assert outs[r]["labelled_other_order"] == outs[r]["labelled_same_order"]
        cls, msg = outs[r]["labelled_other_weights"]
        assert cls == "DistributedError" and msg.endswith(
            "reward names or weights differ across ranks (rank 0: {'acc': 1.0, 'len': 0.5}; rank 1: {'acc': 1.0, "
            "'len': 0.25})"), msg  # no word of signed zeros where no weight is zero
