"""A captured CUDA graph reads the cached constants (eps, weights, unit tables) it was
captured with by address, and the cache (impl._segments.constant) clears itself beyond 256
entries: the graph's entry must keep those tensors alive, or a replay after an eviction reads
freed memory. Checked here on any machine with torch.cuda's capture machinery stubbed (CI
has no GPU); tests/test_impl_cuda.py replays after an eviction on a real GPU."""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from impl import _pipeline, _segments


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
    monkeypatch.setattr(_pipeline, "_GRAPHS", type(_pipeline._GRAPHS)())
    monkeypatch.setattr(_pipeline, "graph_stats", dict(_pipeline.graph_stats))
    read = []

    def device_part(plan, x):  # what the real device part does: reads cached constants
        w = _segments.constant((1.0, 0.5, 123.25), torch.float64, x.device)
        read.append(w)
        return _pipeline.Device({0: torch.zeros((), dtype=torch.int64)}, c=x * 3, a=x * 2)
    monkeypatch.setattr(_pipeline, "device_part", device_part)
    plan = _pipeline.Plan("gdpo", True, True, True, False, 1e-4, _Inp(torch.ones(4, 3)), [4])
    entry = _pipeline._capture(("key",), plan)
    assert entry is not None and _pipeline.graph_stats["captures"] == 1
    captured = read[-1]
    for i in range(300):  # the cache clears past 256 entries
        _segments.constant((float(i), -7.0), torch.float64, torch.device("cpu"))
    assert all(t is not captured for t in _segments.cached_constants())  # evicted from the cache ...
    assert any(t is captured for t in entry[-1])  # ... but held by the graph's entry
