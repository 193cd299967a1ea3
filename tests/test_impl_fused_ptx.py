"""The fused kernels compiled for an H100/H200 (sm_90) without a GPU: the PTX has the
plain path's roundings.

Triton compiles to PTX and runs ptxas without a device. Bit-for-bit agreement with
the plain path needs every float64 operation to be a single IEEE operation: no
fused multiply-add (``fma``) and no approximate division or root. In PTX the
explicit ``.rn`` forms (``add.rn.f64``, ``mul.rn.f64``, ...) may not be contracted
by ptxas either. Checked here on every kernel, together with a control: the same
kernel compiled with fp fusion on does contain ``fma.rn.f64`` (so the check can fail).

The compiling runs in a subprocess (``python -m benchmarks.kernels --json``) without
TRITON_INTERPRET: this process interprets the kernels on CPU (conftest.py), and Triton
fixes at its import whether its library functions are interpreted; an interpreted
``tl.sum`` cannot be compiled. (In-process compiling passed only from a warm Triton cache.)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton", reason="the fused path needs Triton (pip install triton)")

try:
    from benchmarks.kernels import launch_shapes
except ImportError as exc:  # pragma: no cover - depends on the Triton release
    pytest.skip(f"triton {triton.__version__}: cannot compile without a GPU here ({exc})", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(__file__))
import _once  # noqa: E402


def _compile(folder: Path) -> None:
    """Every launch shape compiled for sm_90 in a clean process (no TRITON_INTERPRET), its
    report written to ``folder``/report.json."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "GDPO_FUSED_BLOCK")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-m", "benchmarks.kernels", "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"compiling the kernels for sm_90 failed:\n{done.stderr[-3000:]}"
    (folder / "report.json").write_text(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    """The compiled kernels' report, compiled once per test run (tests/_once.py: pytest-xdist
    workers that each get some of these tests share one compilation)."""
    return json.loads((_once.once_per_run(tmp_path_factory, "fused_ptx", _compile) / "report.json").read_text())


SHAPES = launch_shapes()


def _shape(report: dict, i: int) -> dict:
    entry = report["shapes"][i]
    assert (entry["name"], entry["constexprs"], entry["warps"]) == tuple(SHAPES[i]), "shape lists differ"
    return entry


@pytest.mark.parametrize("i", range(len(SHAPES)), ids=[f"{s[0]}-{i}" for i, s in enumerate(SHAPES)])
def test_kernel_ptx_has_only_ieee_float64_operations(i, report):
    entry = _shape(report, i)
    ops = entry["ops"]
    bad = {op: n for op, n in ops.items() if not re.fullmatch(r"(add|sub|mul|div|sqrt)\.rn\.f64", op)}
    assert not bad, f"{entry['name']}: float64 operations other than add/sub/mul/div/sqrt.rn: {bad} (all: {ops})"


def test_divisions_and_roots_are_the_correctly_rounded_ones(report):
    entry = _shape(report, 0)
    ops = entry["ops"]
    assert entry["name"] == "eq47_kernel" and ops.get("div.rn.f64", 0) >= 3 and ops.get("sqrt.rn.f64", 0) >= 1, ops


def test_control_fp_fusion_on_contracts_multiply_adds(report):
    """The launch option the fused path passes (enable_fp_fusion=False) is what keeps the
    products apart: with it on, the Eq. 4/7 kernel's PTX holds fma instructions."""
    ops = report["fusion_on_ops"]
    assert ops.get("fma.rn.f64", 0) > 0, ops


def test_launch_shapes_compile_without_register_spills(report):
    """Every launch shape the fused path uses fits in registers on sm_90 (a spill to local
    memory would cost the bandwidth these kernels exist to save)."""
    spills = {f"{e['name']} {e['constexprs']} warps {e['warps']}": e for e in report["shapes"] if e["stack"]}
    assert not spills, f"kernels that spill registers: {spills}"


def test_control_an_oversized_shape_spills(report):
    """The check above can fail: 8,192 float64 rows held by one warp (256 a thread) spill."""
    res = report["oversized"]
    assert res["stack"] > 0, res
