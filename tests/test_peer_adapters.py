"""conformance/peers.py: each adapter calls the installed peer unchanged and agrees with
the oracle under that peer's own convention on a small hand-checked batch.

Each peer is an optional dependency (``pytest.importorskip``); multireward-grpo is
installed in CI (.ci/run), so its tests run there. The tolerances: on these batches
(binary and small-integer rewards, groups of 2 to 4, condition about 1) every step of
the peer's formula is one correctly rounded operation on values of order 1, so the
peer is within a few units of its own dtype's roundoff of the exact convention value;
each bound below is that count of roundings times u of the peer's dtype.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conformance import peers
from conformance.cases import Case
from conformance.subject import Subject
from oracle.gdpo import gdpo_advantages as exact

U64 = 2.0 ** -53
U32 = 2.0 ** -24

# the hand-checked batch: three groups, two reward columns, one constant column per group
REWARDS = [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [3.0, 2.0], [5.0, 2.0]]
LABELS = [0, 1, 0, 1, 2, 2]
WEIGHTS = [1.0, 2.0]


def _close(observed, expected, roundings: int, u: float):
    """|observed - expected| <= roundings * u * max(1, |expected|) elementwise (values of order 1)."""
    observed = np.asarray(observed, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    bound = roundings * u * np.maximum(1.0, np.abs(expected))
    err = np.abs(observed - expected)
    assert (err <= bound).all(), f"observed {observed.tolist()}, expected {expected.tolist()}, error {err.tolist()}"


# ------------------------------------------------------------------ multireward-grpo
def test_multireward_grpo_hand_checked():
    pytest.importorskip("multireward_grpo")
    r = torch.tensor(REWARDS, dtype=torch.float64)
    out = peers.multireward_grpo(r, group_ids=torch.tensor(LABELS), weights=WEIGHTS, out_dtype=torch.float64)
    # by hand: ddof 0, eps 1e-8 on the std, no Eq. 6. Groups 0 and 1 have column 0 = (1, 0) -> z = +-0.5/(0.5 + 1e-8)
    # or column 1 = (0, 1) -> weight 2; group 2 has column 0 = (3, 5) -> z = -+1/(1 + 1e-8), column 1 constant.
    h = 0.5 / (0.5 + 1e-8)
    by_hand = [-2 * h, -2 * h, 2 * h, 2 * h, -1 / (1 + 1e-8), 1 / (1 + 1e-8)]
    _close(out.tolist(), by_hand, 8, U64)
    ref = exact(np.array(REWARDS), LABELS, weights=WEIGHTS, convention="multireward_grpo")
    _close(out.tolist(), ref.float64, 8, U64)  # mean, deviation, square, mean, sqrt, +eps, divide, weighted sum


def test_multireward_grpo_ragged_groups_are_one_call_per_size():
    """No Eq. 6, so groups are independent: ragged groups equal the groups computed apart."""
    pytest.importorskip("multireward_grpo")
    r = torch.tensor([[0.0], [2.0], [0.0], [1.0], [0.0]], dtype=torch.float64)
    out = peers.multireward_grpo(r, group_ids=torch.tensor([7, 7, 3, 3, 3]), out_dtype=torch.float64)
    ref = exact(r.numpy(), [7, 7, 3, 3, 3], convention="multireward_grpo")
    _close(out.tolist(), ref.float64, 8, U64)


def test_multireward_grpo_output_rounded_once():
    """The float64 result is cast to bfloat16 correctly rounded (torch's own cast rounds twice)."""
    pytest.importorskip("multireward_grpo")
    r = torch.tensor([[6.261583497884814e-38], [0.0], [0.0], [0.0]], dtype=torch.float64)
    out = peers.multireward_grpo(r, group_size=4, out_dtype=torch.bfloat16)
    ref = exact(r.numpy(), [0, 0, 0, 0], convention="multireward_grpo")
    assert out.dtype == torch.bfloat16
    assert float(out[0]) == float(ref.bfloat16[0]) == float.fromhex("0x1.7ep-98")


def test_multireward_grpo_refuses_what_it_cannot_express():
    pytest.importorskip("multireward_grpo")
    r = torch.zeros(4, 1, dtype=torch.float64)
    with pytest.raises(peers.PeerCannotExpress, match="does not divide"):
        peers.multireward_grpo(r, group_size=3)
    with pytest.raises(peers.PeerCannotExpress, match="process_group"):
        peers.multireward_grpo(r, group_size=2, process_group=object())


def test_multireward_grpo_constant_large_column_is_not_zero():
    """A found defect (docs/peers_findings.md): a constant reward of 7.7e8 in a group of 3
    gives every sample +0.92, not 0: the mean's rounding (one ulp, 1.2e-7) is divided by
    its own std plus an eps of 1e-8. Pinned so a change of the peer or of the adapter shows."""
    pytest.importorskip("multireward_grpo")
    r = torch.full((3, 1), 774394481.2666633, dtype=torch.float64)
    out = peers.multireward_grpo(r, group_size=3, out_dtype=torch.float64)
    assert (out.abs() > 0.9).all(), out.tolist()


# ------------------------------------------------------------------ ms-swift
def test_ms_swift_hand_checked():
    pytest.importorskip("swift.rl_core.advantage")
    r = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]], dtype=torch.float32)
    out = peers.ms_swift(r, 2, torch.tensor([1.0, 1.0]))
    # by hand: column 0 of both groups (1, 0) -> z = +-0.7071 (unbiased, eps 1e-8); column 1 constant -> 0;
    # Eq. 6 over the 4 samples (mean 0, unbiased std sqrt(2/3)) -> +-sqrt(3)/2
    _close(out.tolist(), [math.sqrt(3) / 2, -math.sqrt(3) / 2] * 2, 16, U32)
    ref = exact(r.double().numpy(), [0, 0, 1, 1], convention="ms_swift")
    _close(out.tolist(), ref.float32, 16, U32)


def test_ms_swift_nan_reward_is_skipped():
    """ms-swift 4.6.0 skips a NaN reward (nanmean/nanstd, then nan_to_num): the ms_swift
    preset's nan policy is nan_aware, as the oracle computes it."""
    pytest.importorskip("swift.rl_core.advantage")
    r = torch.tensor([[1.0, float("nan")], [0.0, 2.0], [1.0, 1.0], [0.0, 3.0], [0.0, 0.0], [1.0, 5.0]])
    out = peers.ms_swift(r, 3, torch.tensor([1.0, 1.0]))
    assert torch.isfinite(out).all(), out.tolist()
    ref = exact(r.double().numpy(), [0, 0, 0, 1, 1, 1], convention="ms_swift")
    _close(out.tolist(), ref.float32, 16, U32)


def test_ms_swift_group_of_one_is_zero():
    pytest.importorskip("swift.rl_core.advantage")
    out = peers.ms_swift(torch.tensor([[1.0, 3.0], [0.0, 2.0]]), 1, torch.tensor([1.0, 1.0]))
    assert out.tolist() == [0.0, 0.0]


# ------------------------------------------------------------------ verl
def test_verl_hand_checked():
    pytest.importorskip("verl.trainer.ppo.core_algos")
    subject = Subject("conformance.peers:verl", shape="verl", convention="verl")
    case = Case(rewards=tuple(map(tuple, REWARDS)), dtype="float32", group_ids=tuple(LABELS),
                weights=tuple(WEIGHTS))
    out = subject.call(case)  # the verl shape's own checks: one value per sample, 0 on padding
    ref = exact(np.array(REWARDS), LABELS, weights=WEIGHTS, convention="verl", token_counts=subject.token_counts(case))
    # group std, eps, divide, weight, token-weighted mean and variance over 6 samples, rsqrt, multiply
    _close(out.tolist(), ref.float32, 32, U32)


# ------------------------------------------------------------------ TRL
def test_trl_hand_checked():
    """TRL's trainer method, driven without a model, on the ms-swift batch: eps 1e-4 at both
    equations, so the result is sqrt(3)/2 shrunk by the eps (the oracle's trl convention)."""
    pytest.importorskip("trl.trainer.grpo_trainer")
    r = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]], dtype=torch.float32)
    out = peers.trl(r, 2, torch.tensor([1.0, 1.0]))
    ref = exact(r.double().numpy(), [0, 0, 1, 1], convention="trl")
    _close(out.tolist(), ref.float32, 16, U32)
    assert abs(float(out[0]) - math.sqrt(3) / 2) > 1e-5  # the 1e-4 eps shows at this size


def test_trl_nan_reward_is_skipped():
    pytest.importorskip("trl.trainer.grpo_trainer")
    r = torch.tensor([[1.0, float("nan")], [0.0, 2.0], [1.0, 1.0], [0.0, 3.0], [0.0, 0.0], [1.0, 5.0]])
    out = peers.trl(r, 3, torch.tensor([1.0, 1.0]))
    ref = exact(r.double().numpy(), [0, 0, 0, 1, 1, 1], convention="trl")
    _close(out.tolist(), ref.float32, 16, U32)
