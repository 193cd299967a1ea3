"""The exchange of a refusing rank's own words (impl._distributed._own_words), in one process:
what is cut, how it decodes, and that a failed exchange leaves the refusal as the table tells it.
(Across real gloo ranks: tests/test_impl_distributed.py and tests/test_adapters.py.)"""

from __future__ import annotations

import math

import pytest
import torch

from impl import _distributed
from impl import _problems as P
from spec.constants import REFUSAL_WORDS_BYTES
from spec.errors import GDPOError


def _exchange(monkeypatch, texts: dict[int, str], world: int = 3):
    """Every rank's buffer summed, as the all-reduce would: run _own_words once per rank."""
    bufs = []

    def fake_all_reduce(buf, op=None, group=None):
        bufs.append(buf.clone())

    monkeypatch.setattr(_distributed.dist, "all_reduce", fake_all_reduce)
    for r in range(world):
        _distributed._own_words(_Said(texts[r]) if r in texts else None, None,
                             torch.zeros(world, _distributed._WORDS_COLS, dtype=torch.int64), r)
    total = sum(bufs)
    monkeypatch.setattr(_distributed.dist, "all_reduce", lambda buf, op=None, group=None: buf.copy_(total))
    return _distributed._own_words(None, None, torch.zeros(world, _distributed._WORDS_COLS, dtype=torch.int64), 0)


class _Said(GDPOError):
    """A refusal whose message is the words themselves."""


def test_each_refusing_ranks_words_arrive_whole(monkeypatch):
    said = {1: "GroupError: labels[2] is ['p'] (unhashable list) — naïve ✓", 2: "RuntimeError: boom"}
    assert _exchange(monkeypatch, said) == said  # rank 0 said nothing: absent, not ""


def test_long_words_are_cut_to_the_budget_and_still_decode(monkeypatch):
    long = "é" * REFUSAL_WORDS_BYTES  # two bytes each: a cut may fall inside one
    got = _exchange(monkeypatch, {1: long}, world=2)[1]
    assert got.endswith("...") and len(got.encode("utf-8")) <= REFUSAL_WORDS_BYTES
    assert got.startswith("é" * 100) and "\ufffd" not in got  # cut between characters


def test_a_failed_exchange_leaves_the_refusal_as_the_table_tells_it(monkeypatch):
    def broken(*_a, **_k):
        raise RuntimeError("peer gone")

    monkeypatch.setattr(_distributed.dist, "all_reduce", broken)
    assert _distributed._own_words(_Said("mine"), None, torch.zeros(2, _distributed._WORDS_COLS, dtype=torch.int64), 0) == {}


def test_words_of_an_exception_whose_message_cannot_be_read():
    from tests._dist import Unreadable

    assert _distributed._words_of(Unreadable("x")) == "Unreadable: (its message could not be read)"


def test_a_rank_whose_exception_cannot_be_printed_still_joins_and_stays_in_step():
    """The refusing rank computed its words outside any guard: an exception whose str()
    raised made it leave before the words' all-reduce, which then met its next call's
    agreement (gloo aborted the process: "collective mismatch"). Before and after the
    agreement; then a healthy call on the same group must succeed on every rank."""
    from tests._dist import run_group

    rewards = [[[0.1], [0.5], [0.3], [0.9]]] * 2
    labels = [[0, 0, 1, 1]] * 2
    scenarios = [
        ("before", "fail", {"at": "table", "call_kind": "gdpo", "unreadable": True, "rewards": rewards,
                            "group_size": 2}),
        ("healthy_1", "gdpo", {"rewards": rewards, "group_size": 2}),
        ("after", "fail", {"at": "combine", "call_kind": "gdpo", "unreadable": True, "rewards": rewards,
                           "group_ids": labels}),
        ("healthy_2", "gdpo", {"rewards": rewards, "group_size": 2}),
    ]
    run = run_group(2, scenarios, group_timeout_s=20.0, deadline_s=120.0)
    assert not run.hung, run.stderr[-3000:]
    for name in ("before", "after"):
        recs = run.by_rank(name)
        assert [recs[r]["cls"] for r in range(2)] == ["DistributedError"] * 2, (name, recs)
        assert recs[0]["msg"] == recs[1]["msg"], name
        assert "Unreadable: (its message could not be read)" in recs[0]["msg"], recs[0]["msg"]
    for name in ("healthy_1", "healthy_2"):
        recs = run.by_rank(name)
        assert [recs[r]["status"] for r in range(2)] == ["ok", "ok"], (name, recs)


# --- differing weights, in each rank's words (decided from the agreed table) --------------------------

def _rows(*weights, host=None):
    """Agreed-table rows of the whole pipeline, one per rank, K = 2, with these weights'
    fingerprints; ``host``: {rank: host code}."""
    table = []
    for r, w in enumerate(weights):
        row = [0] * P.ROW_WIDTH
        row[P.PRESENT], row[P.API], row[P.UNJOINED], row[P.K] = 1, P.API_GDPO, 1, 2
        row[P.WEIGHTS_FP] = P.weights_fingerprint(w)
        if host and r in host:
            row[P.HOST_CODE], row[P.K], row[P.WEIGHTS_FP] = host[r], 0, 0  # a host refusal fills neither
        table.append(row)
    return table


def test_weights_are_shown_even_beside_another_ranks_host_refusal():
    """Rank 0 refused on the host (so its K and fingerprint are 0): the weights of ranks 1 and 2
    still differ, so they are exchanged and shown (they were shown by digest)."""
    table = _rows([1.0, 1.0], [1.0, 1.0], [1.0, 2.0], host={0: P.P_LOCAL_FAILURE})
    assert P.weights_disagree(table)
    words = {0: "RuntimeError: boom", 1: P.weights_words([1.0, 1.0]), 2: P.weights_words([1.0, 2.0])}
    text = "; ".join(P.table_problems(table, words))
    assert "weights differ across ranks (rank 1: [1.0, 1.0]; rank 2: [1.0, 2.0]" in text, text
    assert "digest" not in text, text


def test_weights_cut_alike_by_the_words_budget_fall_back_to_digests():
    """Words are cut at WORDS_BYTES: two different weight lists that read alike once cut must not
    be shown as one (the digests tell them apart)."""
    a, b = [1 / 3] * 120, [1 / 3] * 119 + [0.5]
    table = _rows(a, b)
    assert P.weights_disagree(table)
    cut = P.weights_words(a)[:100] + "..."
    text = "; ".join(P.table_problems(table, {0: cut, 1: cut}))
    assert "rank 0: digest" in text and "rank 1: digest" in text, text


def test_weights_of_a_rank_with_a_problem_of_its_own_are_not_compared():
    """A rank refused for a NaN reward (a device fact, no host code) is not among the ranks whose
    weights are compared, by the decision or by the message: no exchange for nothing."""
    table = _rows([1.0, 1.0], [1.0, 1.0], [1.0, 2.0])
    table[2][P.NF_REWARD_KIND] = P.float_bits(math.nan)  # rank 2: a NaN reward (its float64 bits)
    assert not P.weights_disagree(table)
    assert not any("weights differ" in x for x in P.table_problems(table))


@pytest.mark.parametrize("a, b, signed", [([1.0, 0.0], [1.0, -0.0], True), ([1.0, 1.0], [1.0, 2.0], False),
                                          ([10.0, 0.05], [10.0, 0.5], False), ([-0.0, 3.0], [1.0, 3.0], True)])
def test_the_signed_zero_remark_only_where_a_weight_is_zero(a, b, signed):
    """Found by review: every weights refusal ended "compared bit for bit: -0.0 and 0.0
    differ", as if a signed zero were the cause of [1, 1] against [1, 2]."""
    words = {0: P.weights_words(a), 1: P.weights_words(b)}
    text = "; ".join(P.table_problems(_rows(a, b), words))
    assert text.startswith(f"weights differ across ranks (rank 0: {words[0]}; rank 1: {words[1]}"), text
    assert ("compared bit for bit: -0.0 and 0.0 differ" in text) == signed, text


def test_an_adapters_names_travel_with_its_weights_in_name_order():
    """Same names and weights in another mapping order: one digest. Other names: another."""
    same = P.weights_fingerprint([1.0, 0.5], ["acc", "len"]) == P.weights_fingerprint([0.5, 1.0], ["len", "acc"])
    assert same and P.weights_fingerprint([1.0, 0.5], ["acc", "len"]) != P.weights_fingerprint([1.0, 0.5],
                                                                                                ["acc", "fmt"])
    assert P.weights_words([0.5, 1.0], ["len", "acc"]) == "{'acc': 1.0, 'len': 0.5}"
