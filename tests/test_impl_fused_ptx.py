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
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError as exc:  # pragma: no cover - depends on the Triton release
    pytest.skip(f"triton {triton.__version__} has no ASTSource/GPUTarget ({exc})", allow_module_level=True)


def _compiled_copy():
    """A private copy of impl/_fused_kernels.py defined for compilation: another test module
    of this process may have set TRITON_INTERPRET=1 (Triton reads it when a kernel is defined)."""
    import importlib.util
    import os

    import impl

    path = os.path.join(os.path.dirname(impl.__file__), "_fused_kernels.py")
    saved = os.environ.pop("TRITON_INTERPRET", None)
    try:
        spec = importlib.util.spec_from_file_location("_fused_kernels_for_ptx", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved
    return mod


K = _compiled_copy()

SM90 = ("cuda", 90, 32)

#: argument types of the kernels' run-time arguments, by name
TYPES = {
    "r_ptr": "*fp32", "src_ptr": "*i64", "prm_ptr": "*fp64", "c_ptr": "*fp64", "nf_ptr": "*i64",
    "starts_ptr": "*i64", "sizes_ptr": "*i64", "lo_ptr": "*fp64", "hi_ptr": "*fp64", "st_ptr": "*fp64",
    "part_ptr": "*fp64", "out_ptr": "*fp32", "n_groups": "i64", "G": "i64", "K": "i64", "min_bits": "i64",
    "eps_tiny": "i64", "programs": "i64", "n_flat": "i64",
}

#: (kernel name, its constexpr values): one representative compilation each
KERNELS = [
    ("eq47_kernel", {"GP": 16, "LOG_GP": 4, "BG": 64, "GATHER": False, "INTERP": False}),
    ("eq47_kernel", {"GP": 32, "LOG_GP": 5, "BG": 32, "GATHER": True, "INTERP": False}),
    ("unit_minmax_kernel", {"NBP": 256, "BLOCK": 1024}),
    ("unit_scale_kernel", {"NBP": 256, "BLOCK": 1024}),
    ("unit_sum_kernel", {"NBP": 256, "BLOCK": 1024, "LOG_BLOCK": 10, "SQUARES": False}),
    ("unit_sum_kernel", {"NBP": 256, "BLOCK": 1024, "LOG_BLOCK": 10, "SQUARES": True}),
    ("unit_finish_kernel", {"NBP": 256, "LOG_NBP": 8, "BLOCK": 1024, "SQUARES": False, "EPS_TINY": False,
                            "INTERP": False}),
    ("unit_finish_kernel", {"NBP": 256, "LOG_NBP": 8, "BLOCK": 1024, "SQUARES": True, "EPS_TINY": True,
                            "INTERP": False}),
    ("unit_apply_kernel", {"BLOCK": 1024, "INTERP": False}),
    ("unit_whole_kernel", {"BLOCK": 1024, "LOG_BLOCK": 10, "INTERP": False}),
    ("facts_kernel", {"CHUNK": 1024}),
]

F64_OP = re.compile(r"\b((?:add|sub|mul|div|sqrt|fma|rcp|rsqrt|mad)(?:\.[a-z0-9]+)*\.f64)\b")


def _ptx(name: str, constexprs: dict, fusion: bool) -> str:
    fn = getattr(K, name)
    sig = {a: ("constexpr" if a in constexprs else TYPES[a]) for a in fn.arg_names}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget(*SM90), options={"enable_fp_fusion": fusion}).asm["ptx"]


def _f64_ops(ptx: str) -> collections.Counter:
    return collections.Counter(F64_OP.findall(ptx))


@pytest.mark.parametrize("name,constexprs", KERNELS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(KERNELS)])
def test_kernel_ptx_has_only_ieee_float64_operations(name, constexprs):
    ops = _f64_ops(_ptx(name, constexprs, fusion=False))
    bad = {op: n for op, n in ops.items() if not re.fullmatch(r"(add|sub|mul|div|sqrt)\.rn\.f64", op)}
    assert not bad, f"{name}: float64 operations other than add/sub/mul/div/sqrt.rn: {bad} (all: {dict(ops)})"


def test_divisions_and_roots_are_the_correctly_rounded_ones():
    ops = _f64_ops(_ptx(*KERNELS[0], fusion=False))
    assert ops["div.rn.f64"] >= 3 and ops["sqrt.rn.f64"] >= 1, dict(ops)  # mean, variance, z; std


def test_control_fp_fusion_on_contracts_multiply_adds():
    """The launch option the fused path passes (enable_fp_fusion=False) is what keeps the
    products apart: with it on, the Eq. 4/7 kernel's PTX holds fma instructions."""
    ops = _f64_ops(_ptx(*KERNELS[0], fusion=True))
    assert ops["fma.rn.f64"] > 0, dict(ops)


def _resources(name: str, constexprs: dict, num_warps: int) -> dict:
    """Registers and stack frame (spills) of one kernel compiled for sm_90, as cuobjdump
    (shipped with Triton) reads them from the cubin."""
    import os
    import subprocess
    import tempfile

    fn = getattr(K, name)
    sig = {a: ("constexpr" if a in constexprs else TYPES[a]) for a in fn.arg_names}
    kern = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs), target=GPUTarget(*SM90),
                          options={"enable_fp_fusion": False, "num_warps": num_warps})
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        pytest.skip(f"triton {triton.__version__} ships no cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(kern.asm["cubin"])
        out = subprocess.run([tool, "--dump-resource-usage", path], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", out)
    assert found, out[-500:]
    return {"registers": int(found.group(1)), "stack": int(found.group(2))}


def _launch_shapes():
    """The launch shapes impl._fused uses, for group widths and unit sizes that cover its branches."""
    from impl import _fused

    shapes = []
    for width in (2, 9, 17, 33, 65, 129, 257, _fused.MAX_GROUP):
        gp, bg, warps = _fused.eq47_config(width)
        for gather in (False, True):
            shapes.append(("eq47_kernel", {"GP": gp, "LOG_GP": gp.bit_length() - 1, "BG": bg, "GATHER": gather,
                                           "INTERP": False}, warps))
    for longest in (100, 3000, _fused.WHOLE_UNIT):
        width, warps = _fused.whole_config(longest)
        shapes.append(("unit_whole_kernel", {"BLOCK": width, "LOG_BLOCK": width.bit_length() - 1, "INTERP": False},
                       warps))
    for longest in (1 << 20, 1 << 24, _fused.MAX_UNIT):
        block = _fused.block_size(longest)
        nbp = max(256, 1 << max(0, (-(-longest // block) - 1).bit_length()))
        w = _fused.block_warps(block)
        common = {"NBP": nbp, "BLOCK": block}
        shapes += [("unit_minmax_kernel", common, w), ("unit_scale_kernel", common, 8),
                   ("unit_apply_kernel", {"BLOCK": block, "INTERP": False}, w)]
        for sq in (False, True):
            shapes.append(("unit_sum_kernel", {**common, "LOG_BLOCK": block.bit_length() - 1, "SQUARES": sq}, w))
            shapes.append(("unit_finish_kernel", {**common, "LOG_NBP": nbp.bit_length() - 1, "SQUARES": sq,
                                                  "EPS_TINY": False, "INTERP": False}, 8))
    shapes.append(("facts_kernel", {"CHUNK": 1024}, 4))
    return shapes


def test_launch_shapes_compile_without_register_spills(monkeypatch):
    """Every launch shape the fused path uses fits in registers on sm_90 (a spill to local
    memory would cost the bandwidth these kernels exist to save)."""
    monkeypatch.delenv("GDPO_FUSED_BLOCK", raising=False)
    spills = {}
    for name, constexprs, warps in _launch_shapes():
        res = _resources(name, constexprs, warps)
        if res["stack"]:
            spills[f"{name} {constexprs} warps {warps}"] = res
    assert not spills, f"kernels that spill registers: {spills}"


def test_control_an_oversized_shape_spills():
    """The check above can fail: 8,192 float64 rows held by one warp (256 a thread) spill."""
    res = _resources("unit_apply_kernel", {"BLOCK": 8192, "INTERP": False}, 1)
    assert res["stack"] > 0, res
