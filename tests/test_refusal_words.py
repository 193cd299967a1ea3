"""The exchange of a refusing rank's own words (impl._pipeline._own_words), in one process:
what is cut, how it decodes, and that a failed exchange leaves the refusal as the table tells it.
(Across real gloo ranks: tests/test_impl_distributed.py and tests/test_adapters.py.)"""

from __future__ import annotations

import torch

from impl import _pipeline
from spec.constants import REFUSAL_WORDS_BYTES


def _exchange(monkeypatch, texts: dict[int, str], world: int = 3):
    """Every rank's buffer summed, as the all-reduce would: run _own_words once per rank."""
    bufs = {}

    def fake_all_reduce(buf, op=None, group=None):
        bufs[len(bufs)] = buf.clone()

    monkeypatch.setattr(_pipeline.dist, "all_reduce", fake_all_reduce)
    for r in range(world):
        _pipeline._own_words(texts.get(r), None, torch.device("cpu"), world, r, "gdpo_advantages")
    total = sum(bufs.values())
    monkeypatch.setattr(_pipeline.dist, "all_reduce", lambda buf, op=None, group=None: buf.copy_(total))
    return _pipeline._own_words(texts.get(0), None, torch.device("cpu"), world, 0, "gdpo_advantages")


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

    monkeypatch.setattr(_pipeline.dist, "all_reduce", broken)
    assert _pipeline._own_words("mine", None, torch.device("cpu"), 2, 0, "whiten") == {}
