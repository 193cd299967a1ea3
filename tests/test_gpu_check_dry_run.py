"""conformance/gpu_check.py runs only on lent GPU time, once: its plumbing is exercised here
on the CPU (``--dry-run-cpu``: every part with CPU tensors, gloo for NCCL), so that a run there
cannot die of a plain bug."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

#: the slow tier (`python3 -m pytest -n auto -q -m slow`, run by .ci/run after the fast suite)
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.distributed
def test_every_part_runs_and_passes_on_the_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    env = {k: v for k, v in os.environ.items() if k != "GDPO_CUDA_GRAPHS"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-m", "conformance.gpu_check", "--out", str(out), "--dry-run-cpu",
                           "--examples", "3"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["ok"] is True and res["dry_run_cpu"] is True
    assert set(res["parts"]) == {"cuda", "bitwise", "nccl_world1", "gloo_cuda_2"}, res["parts"]
    for name, rows in res["parts"].items():
        # the one skip allowed: the certified property, while impl's certified rounding is opt-in
        # (GDPO_CERTIFIED unset: impl does not declare it)
        assert rows and all(r["status"] in ("pass", "info") or (
            r["status"] == "skip" and "does not declare certified rounding" in r.get("reason", ""))
            for r in rows), (name, rows)
