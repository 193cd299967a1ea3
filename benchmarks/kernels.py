"""The fused kernels compiled for sm_90 (H100/H200) without a GPU: PTX and resource use.

    python -m benchmarks.kernels        # registers and spills of every launch shape, a Markdown table
    python -m benchmarks.kernels --json # per launch shape: its float64 PTX operations, registers, spills

Compile only in a process where Triton was imported without TRITON_INTERPRET: Triton
fixes at its import whether its library functions (tl.sum, tl.min, ...) are interpreted,
and an interpreted one cannot be compiled. The test suite's processes interpret the
kernels on CPU, so tests/test_impl_fused_ptx.py runs ``--json`` in a clean subprocess.

Triton compiles to PTX and runs the ptxas it ships without a device; cuobjdump (also
shipped) reads the registers and stack frame (spills) from the cubin. Used by
tests/test_impl_fused_ptx.py; the table in benchmarks/RESULTS.md comes from here.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

SM90 = ("cuda", 90, 32)


def _compiled_copy():
    """A private copy of impl/_fused_kernels.py defined for compilation: another test module
    of this process may have set TRITON_INTERPRET=1 (Triton reads it when a kernel is defined)."""
    import importlib.util

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

#: argument types of the kernels' run-time arguments, by name
TYPES = {
    "r_ptr": "*fp32", "src_ptr": "*i64", "prm_ptr": "*fp64", "c_ptr": "*fp64", "nf_ptr": "*i64",
    "starts_ptr": "*i64", "sizes_ptr": "*i64", "whole_ptr": "*i8", "lo_ptr": "*fp64", "hi_ptr": "*fp64", "st_ptr": "*fp64",
    "part_ptr": "*fp64", "out_ptr": "*fp32", "n_groups": "i32", "G": "i32", "K": "i32", "min_bits": "i32",
    "eps_tiny": "i32", "programs": "i32", "n_flat": "i32",
}
#: where a kernel's argument of that name has another type (the facts kernel writes int64 facts)
TYPES_OF = {"facts_kernel": {"out_ptr": "*i64"}}
# Python ints below 2**31 reach a launch as i32 (Triton specializes them), as every size here
# does up to N = 16M rows x K = 4 (n_flat = 2**26): so they are compiled as i32.


def compile_kernel(name: str, constexprs: dict, num_warps: int = 4, fusion: bool = False):
    """One kernel of impl/_fused_kernels.py compiled for sm_90 (Triton's cache makes repeats cheap)."""
    fn = getattr(K, name)
    types = {**TYPES, **TYPES_OF.get(name, {})}
    sig = {a: ("constexpr" if a in constexprs else types[a]) for a in fn.arg_names}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs), target=GPUTarget(*SM90),
                          options={"enable_fp_fusion": fusion, "num_warps": num_warps})


def ptx(name: str, constexprs: dict, num_warps: int = 4, fusion: bool = False) -> str:
    return compile_kernel(name, constexprs, num_warps, fusion).asm["ptx"]


def resources(name: str, constexprs: dict, num_warps: int) -> dict:
    """Registers and stack frame (spills) of one kernel compiled for sm_90, as cuobjdump
    (shipped with Triton) reads them from the cubin."""
    kern = compile_kernel(name, constexprs, num_warps)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        raise FileNotFoundError(f"triton {triton.__version__} ships no cuobjdump at {tool}")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(kern.asm["cubin"])
        out = subprocess.run([tool, "--dump-resource-usage", path], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", out)
    if not found:
        raise RuntimeError(f"cuobjdump gave no resource line: {out[-500:]}")
    return {"registers": int(found.group(1)), "stack": int(found.group(2))}


def launch_shapes():
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


def table() -> str:
    """Markdown: every launch shape of impl._fused with its registers and spills on sm_90."""
    rows = ["| kernel | shape | warps | registers | spill (stack bytes) |", "|---|---|---|---|---|"]
    seen = set()
    for name, cx, warps in launch_shapes():
        key = (name, tuple(sorted(cx.items())), warps)
        if key in seen:
            continue
        seen.add(key)
        r = resources(name, cx, warps)
        shape = ", ".join(f"{k}={v}" for k, v in cx.items() if not k.startswith(("LOG_", "INTERP", "EPS_")))
        rows.append(f"| {name} | {shape} | {warps} | {r['registers']} | {r['stack']} |")
    return "\n".join(rows)


F64_OP = re.compile(r"\b((?:add|sub|mul|div|sqrt|fma|rcp|rsqrt|mad)(?:\.[a-z0-9]+)*\.f64)\b")


def f64_ops(text: str) -> dict:
    """How many of each float64 arithmetic instruction a PTX text holds."""
    counts: dict = {}
    for op in F64_OP.findall(text):
        counts[op] = counts.get(op, 0) + 1
    return counts


def report() -> dict:
    """Every launch shape compiled for sm_90: its float64 PTX operations, registers and
    spills; plus the two controls (the first shape with fp fusion on; an oversized shape)."""
    shapes = []
    for name, cx, warps in launch_shapes():
        shapes.append({"name": name, "constexprs": cx, "warps": warps, "ops": f64_ops(ptx(name, cx, warps)),
                       **resources(name, cx, warps)})
    name, cx, warps = launch_shapes()[0]
    return {"triton": triton.__version__, "shapes": shapes,
            "fusion_on_ops": f64_ops(ptx(name, cx, warps, fusion=True)),
            "oversized": resources("unit_apply_kernel", {"BLOCK": 8192, "INTERP": False}, 1)}


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m benchmarks.kernels",
                                description="Compile every fused kernel for sm_90 (no GPU needed) and print "
                                            "each launch shape's registers and stack (spills).")
    p.add_argument("--json", action="store_true", help="print every shape's PTX float64 operations, registers "
                                                       "and spills, and the controls, as JSON")
    args = p.parse_args(argv)
    os.environ.pop("GDPO_FUSED_BLOCK", None)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("TRITON_INTERPRET is set: Triton's library functions would be interpreted and cannot be "
              "compiled; run without it", flush=True)
        return 2
    if args.json:
        print(json.dumps(report()))
        return 0
    print(f"triton {triton.__version__}, target sm_90, enable_fp_fusion=False")
    print(table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
