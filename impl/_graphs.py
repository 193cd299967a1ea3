"""Optional CUDA-graph replay of local ``gdpo_advantages`` calls (opt-in).

Set ``GDPO_CUDA_GRAPHS=1`` to enable. At small batch sizes a call is bounded by
kernel launches (about 80 eager kernels, each a few microseconds of host time),
not by the GPU. With graphs, the first call of a *signature* (shape, dtype,
device, group_size, weights, segment_sizes, eps, out_dtype) captures the
device part of the call once; later calls with that signature copy the
rewards into the graph's input, replay it (one launch), copy the result out
and read the facts row (the call's one host synchronisation, as in eager).

Same kernels, same order: the bits are those of the eager path. Only local
calls with contiguous groups on CUDA are graphed, up to ``MAX_ELEMENTS``
rewards (a graph keeps its intermediates, several times the input, on the
device); at most ``MAX_GRAPHS`` signatures are kept (least recently used
first out). A capture that fails leaves that signature to the eager path, for good.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import warnings

import torch

from impl import _facts, _segments

MAX_ELEMENTS = 1 << 22
MAX_GRAPHS = 8

_GRAPHS: collections.OrderedDict = collections.OrderedDict()
_FAILED: set = set()
#: Counters for benchmarks and tests: captures, replays, fallbacks (failed captures).
stats = {"captures": 0, "replays": 0, "fallbacks": 0}


_WARNED: set = set()


def enabled() -> bool:
    value = os.environ.get("GDPO_CUDA_GRAPHS", "")
    if value not in ("", "0", "1") and value not in _WARNED:
        _WARNED.add(value)
        warnings.warn(f"GDPO_CUDA_GRAPHS={value!r} is not 0 or 1: CUDA graphs are off", RuntimeWarning, stacklevel=3)
    return value == "1"


def eligible(inp) -> bool:
    r = inp.rewards
    return (enabled() and r.is_cuda and inp.labels is None and r.numel() <= MAX_ELEMENTS
            and not torch.cuda.is_current_stream_capturing())


def run(key: tuple, inp, device_part):
    """(result, facts) of ``device_part(inp)`` (result: a tensor or a tuple of tensors, each
    cloned; facts: ``_facts.Facts``), replayed from a graph of this signature; None where no
    graph can be had. The facts are 0-d views of the graph's static output, for the caller to
    read at once (the call's one host read), before anything replays this graph again."""
    if key in _FAILED:
        return None
    entry = _GRAPHS.get(key)
    if entry is None:
        entry = _capture(key, inp, device_part)
        if entry is None:
            return None
    _GRAPHS.move_to_end(key)
    graph, static_in, out, cols, facts, _kept = entry
    static_in.copy_(inp.rewards)
    graph.replay()
    stats["replays"] += 1
    result = out.clone() if isinstance(out, torch.Tensor) else tuple(t.clone() for t in out)
    return result, dict(zip(cols, facts.unbind()))


def _capture(key, inp, device_part):
    static_in = torch.empty_like(inp.rewards, memory_format=torch.contiguous_format)
    static_in.copy_(inp.rewards)
    static_inp = dataclasses.replace(inp, rewards=static_in)
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: caches (constants, allocator) filled outside the capture
            for _ in range(2):
                device_part(static_inp)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, found = device_part(static_inp)
            cols, facts = _facts.stacked(found)  # one static tensor: a replay refreshes every fact
    except Exception:  # noqa: BLE001 - any capture failure: this signature stays eager
        _FAILED.add(key)
        stats["fallbacks"] += 1
        return None
    stats["captures"] += 1
    # The graph reads the cached constants it was captured with (eps, weights, unit tables) by
    # address: the entry holds them, so that the cache's eviction never frees memory a replay reads.
    kept = tuple(_segments.cached_constants())
    _GRAPHS[key] = (graph, static_in, out, cols, facts, kept)
    while len(_GRAPHS) > MAX_GRAPHS:
        _GRAPHS.popitem(last=False)
    return _GRAPHS[key]
