"""benchmarks/gpu.py runs only on lent GPU time: its code is exercised here (on the CPU without a
GPU, tiny sizes) so that a run there cannot die of a plain bug, and what makes its figures
unusable is pinned."""

from __future__ import annotations

import os

import torch

from benchmarks import gpu as bench

CUDA = torch.cuda.is_available()


def test_gpu_benchmark_harness_runs(monkeypatch):
    monkeypatch.delenv("GDPO_CUDA_GRAPHS", raising=False)
    res = bench.run(1, "cuda" if CUDA else "cpu", sizes=(256,))
    (case,) = res["cases"]
    assert not [k for k in case if k.endswith("_error")], case
    assert all(v for k, v in case.items() if k.endswith("_same_bits")), case
    assert os.environ.get("GDPO_CUDA_GRAPHS") is None  # the harness leaves the knob as it found it
    assert bench.problems(res) == [], bench.problems(res)
    if CUDA:  # the graphs mode replayed graphs (a failed capture runs eager, unseen otherwise)
        assert case["impl_1u_graphs_paths"].get("graph_replays", 0) > 0, case


def test_gpu_benchmark_flags_unusable_figures():
    """The benchmark exits 1, naming the case, where its figures cannot be used: a raise, bits
    unlike the eager path's, a graphs mode on CUDA that never replayed (its figures would be
    eager's under another name)."""
    good = {"N": 8, "impl_1u_graphs_same_bits": True, "impl_1u_graphs_paths": {"graph_captures": 1, "graph_replays": 50}}
    assert bench.problems({"device": "NVIDIA H200", "cases": [good]}) == []
    bad = {"N": 8, "impl_1u_eager_error": "RuntimeError('x')", "impl_1u_graphs_same_bits": False,
           "impl_1u_graphs_paths": {"graph_fallbacks": 1}}
    found = bench.problems({"device": "NVIDIA H200", "cases": [bad]})
    assert found == ["N=8 impl_1u_eager: raised RuntimeError('x')", "N=8 impl_1u_graphs: bits differ from the eager path",
                     "N=8 impl_1u_graphs: no graph replayed (the capture failed: eager ran)"], found
    # on CPU (the smoke run) there are no graphs to replay
    assert bench.problems({"device": "cpu (smoke run)", "cases": [{"N": 8, "impl_1u_graphs_paths": {}}]}) == []
