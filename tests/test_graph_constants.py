"""A captured CUDA graph reads the cached constants (eps, weights, unit tables) it was
captured with by address, and the cache (impl._segments.constant) clears itself beyond 256
entries: the graph's entry must keep those tensors alive, or a replay after an eviction reads
freed memory. Checked here on any machine with torch.cuda's capture machinery stubbed (CI
has no GPU); tests/test_impl_cuda.py replays after an eviction on a real GPU."""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from impl import _graphs, _segments


@dataclasses.dataclass
class _Inp:
    rewards: torch.Tensor


class _Stream:
    def wait_stream(self, other):
        pass


class _Graph:
    def replay(self):
        pass


def test_a_captured_graph_keeps_the_constants_it_read(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", _Stream)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    monkeypatch.setattr(_graphs, "_GRAPHS", type(_graphs._GRAPHS)())
    monkeypatch.setattr(_graphs, "stats", dict(_graphs.stats))
    read = []

    def device_part(inp):  # what the real device part does: reads cached constants
        w = _segments.constant((1.0, 0.5, 123.25), torch.float64, inp.rewards.device)
        read.append(w)
        return inp.rewards * 2, {0: torch.zeros((), dtype=torch.int64)}  # (a, facts), as the spine's graphed part (impl._pipeline._replayed)

    entry = _graphs._capture(("key",), _Inp(torch.ones(4, 3)), device_part)
    assert entry is not None and _graphs.stats["captures"] == 1
    captured = read[-1]
    for i in range(300):  # the cache clears past 256 entries
        _segments.constant((float(i), -7.0), torch.float64, torch.device("cpu"))
    assert all(t is not captured for t in _segments.cached_constants())  # evicted from the cache ...
    assert any(t is captured for t in entry[-1])  # ... but held by the graph's entry
