"""The fused kernels compiled for an H100/H200 (sm_90) without a GPU: the PTX has the
plain path's roundings.

Triton compiles to PTX and runs ptxas without a device. Bit-for-bit agreement with
the plain path needs every float64 operation to be a single IEEE operation: no
fused multiply-add (``fma``) and no approximate division or root. In PTX the
explicit ``.rn`` forms (``add.rn.f64``, ``mul.rn.f64``, ...) may not be contracted
by ptxas either. Checked here on every kernel, together with a control: the same
kernel compiled with fp fusion on does contain ``fma.rn.f64`` (so the check can fail).
"""

from __future__ import annotations

import collections
import re

import pytest

triton = pytest.importorskip("triton", reason="the fused path needs Triton (pip install triton)")

try:
    from benchmarks.kernels import launch_shapes, ptx, resources
except ImportError as exc:  # pragma: no cover - depends on the Triton release
    pytest.skip(f"triton {triton.__version__}: cannot compile without a GPU here ({exc})", allow_module_level=True)


F64_OP = re.compile(r"\b((?:add|sub|mul|div|sqrt|fma|rcp|rsqrt|mad)(?:\.[a-z0-9]+)*\.f64)\b")


def _f64_ops(ptx: str) -> collections.Counter:
    return collections.Counter(F64_OP.findall(ptx))


SHAPES = launch_shapes()


@pytest.mark.parametrize("name,constexprs,warps", SHAPES, ids=[f"{s[0]}-{i}" for i, s in enumerate(SHAPES)])
def test_kernel_ptx_has_only_ieee_float64_operations(name, constexprs, warps):
    ops = _f64_ops(ptx(name, constexprs, warps))
    bad = {op: n for op, n in ops.items() if not re.fullmatch(r"(add|sub|mul|div|sqrt)\.rn\.f64", op)}
    assert not bad, f"{name}: float64 operations other than add/sub/mul/div/sqrt.rn: {bad} (all: {dict(ops)})"


def test_divisions_and_roots_are_the_correctly_rounded_ones():
    name, constexprs, warps = SHAPES[0]
    ops = _f64_ops(ptx(name, constexprs, warps))
    assert name == "eq47_kernel" and ops["div.rn.f64"] >= 3 and ops["sqrt.rn.f64"] >= 1, dict(ops)


def test_control_fp_fusion_on_contracts_multiply_adds():
    """The launch option the fused path passes (enable_fp_fusion=False) is what keeps the
    products apart: with it on, the Eq. 4/7 kernel's PTX holds fma instructions."""
    name, constexprs, warps = SHAPES[0]
    ops = _f64_ops(ptx(name, constexprs, warps, fusion=True))
    assert ops["fma.rn.f64"] > 0, dict(ops)


def test_launch_shapes_compile_without_register_spills():
    """Every launch shape the fused path uses fits in registers on sm_90 (a spill to local
    memory would cost the bandwidth these kernels exist to save)."""
    spills = {}
    for name, constexprs, warps in SHAPES:
        res = resources(name, constexprs, warps)
        if res["stack"]:
            spills[f"{name} {constexprs} warps {warps}"] = res
    assert not spills, f"kernels that spill registers: {spills}"


def test_control_an_oversized_shape_spills():
    """The check above can fail: 8,192 float64 rows held by one warp (256 a thread) spill."""
    res = resources("unit_apply_kernel", {"BLOCK": 8192, "INTERP": False}, 1)
    assert res["stack"] > 0, res
