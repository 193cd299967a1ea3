"""impl gives the oracle's bits, or refuses by name, whatever the caller's process state (issue 45).

A trainer's process is not ours: it may flush subnormals (``torch.set_flush_denormal(True)``, a
library built with fast-math), make NumPy raise on underflow, move torch's default device (meta,
CUDA) or dtype (float64), demand deterministic algorithms, turn anomaly detection on or every
warning into an error. Each mode here is a test of the matrix mode x batch x call: the batches
hold subnormal rewards, subnormal weights, an offset of 1e4 with a small spread, ordinary values
and unscored rewards. Every call must give the oracle's bits (the certified narrow outputs,
float32 and bfloat16), float64 within the error model (spec/gdpo.md section 7), the same bools
as outside the mode (``group_has_signal``) or, where the mode makes the exact result impossible
(flush-to-zero, denormals-are-zero), the GDPOError of ``spec.errors.process_state_error`` that
names the mode and how to leave it. Nothing else: no raw RuntimeError, NotImplementedError,
FloatingPointError, and no warning turned error from inside impl.

Negative controls: the FTZ matrix with impl's check patched out gives silently wrong bits
(:func:`test_without_the_check_flush_to_zero_is_silently_wrong`), and the rule that every
tensor impl creates names its device and dtype finds a call that does not
(:func:`test_the_factory_rule_finds_a_call_without_a_device`).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import math
import pathlib
import warnings

import numpy as np
import pytest
import torch

from impl import _inputs, adapters, gdpo
from oracle import gdpo as oracle
from spec.errors import GDPOError, process_state_error

ROOT = pathlib.Path(__file__).resolve().parent.parent

# --- the batches ----------------------------------------------------------------------------------

#: name -> the call's arguments (plain data). ``values``: whiten's input; the rest gdpo_advantages'.
CASES = {
    # the case: exact [0, 0, -1.2247, 1.2247]; flushed to zero it read [0.866, -0.866, -0.866, 0.866]
    "subnormal_rewards": dict(rewards=[[0.0, 1.0], [1e-310, 0.0], [0.0, 0.0], [3e-310, 1.0]], group_size=2,
                              eps=0.0, values=[0.0, 1e-310, 3e-310, 2e-310]),
    # flushed to zero these weights read "all 2 weights are zero"
    "subnormal_weights": dict(rewards=[[1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [0.0, 3.0]], group_size=2,
                              weights=[1e-310, 0.0], eps=0.0, values=[1e-310, -2e-310, 4e-310, 0.0]),
    "offset_1e4": dict(rewards=[[10000.0, 1.0], [10000.001, 2.0], [10000.002, 0.5], [10000.003, 0.25],
                                [10000.0, 3.0], [10000.004, 1.0]],
                       group_ids=[0, 1, 0, 1, 2, 2], weights=[1.0, 0.5], segment_sizes=[4, 2],
                       values=[10000.0, 10000.001, 10000.002, 10000.003, 10000.0, 10000.004]),
    "ordinary": dict(rewards=[[0.25, 1.0, -3.0], [0.5, 0.0, 2.0], [1.0, 1.0, 0.5], [0.0, 0.0, 7.0],
                              [0.75, 1.0, 1.5], [0.5, 0.0, -1.0], [1.0, 1.0, 0.0], [0.125, 0.0, 2.5]],
                     group_size=4, weights=[1.0, 0.5, 2.0], segment_sizes=[4, 4],
                     values=[0.25, 0.5, 1.0, 0.0, 0.75, 0.5, 1.0, 0.125]),
    "unscored": dict(rewards=[[1.0, math.nan], [0.0, math.nan], [math.nan, math.nan], [math.nan, 0.5],
                              [math.nan, 1.0], [math.nan, 0.0]], group_size=3, missing="unscored",
                     values=[1.0, 0.0, 2.0, 0.5, 1.0, 0.0]),
}


def _labels(case: dict) -> list[int]:
    if "group_ids" in case:
        return case["group_ids"]
    return [i // case["group_size"] for i in range(len(case["rewards"]))]


def _groups(case: dict) -> dict:
    return {"group_ids": case["group_ids"]} if "group_ids" in case else {"group_size": case["group_size"]}


def _eps(case: dict) -> dict:
    return {"eps": case["eps"]} if "eps" in case else {}


def _rewards(case: dict, as_list: bool = False):
    return case["rewards"] if as_list else torch.tensor(case["rewards"], dtype=torch.float64, device="cpu")


# --- the calls: each (impl's call, the oracle's expectation, how they compare) -------------------------


def _gdpo(case, out_dtype, as_list=False):
    return gdpo.gdpo_advantages(_rewards(case, as_list), **_groups(case), weights=case.get("weights"),
                                segment_sizes=case.get("segment_sizes"), out_dtype=out_dtype,
                                missing=case.get("missing", "refuse"), diagnostics=gdpo.Diagnostics(), **_eps(case))


def _on_cuda(case, out_dtype):
    r = _rewards(case).to("cuda")
    return gdpo.gdpo_advantages(r, **_groups(case), weights=case.get("weights"), segment_sizes=case.get("segment_sizes"),
                                out_dtype=out_dtype, missing=case.get("missing", "refuse"), **_eps(case))


def _oracle_gdpo(case):
    return oracle.gdpo_advantages(np.array(case["rewards"], dtype=np.float64), **_groups(case),
                                  weights=case.get("weights"), segment_sizes=case.get("segment_sizes"),
                                  missing=case.get("missing", "refuse"), **_eps(case))


def _weights_by_name(case):
    k = len(case["rewards"][0])
    return {f"r{j}": w for j, w in enumerate(case.get("weights") or [1.0] * k)}


def _labelled(case):
    cols = {f"r{j}": [row[j] for row in case["rewards"]] for j in range(len(case["rewards"][0]))}
    return adapters.labelled_advantages(cols, _labels(case), _weights_by_name(case),
                                        segment_sizes=case.get("segment_sizes"), missing=case.get("missing", "refuse"),
                                        **_eps(case))


def _trl(case):
    return adapters.trl_advantages(_rewards(case), case["group_size"], case.get("weights"),
                                   segment_sizes=case.get("segment_sizes"), missing=case.get("missing", "refuse"),
                                   **_eps(case))


def _verl(case):
    r = _rewards(case)
    tokens = {f"r{j}": torch.stack([r[:, j], torch.zeros_like(r[:, j])], 1) for j in range(r.shape[1])}
    mask = torch.tensor([[1, 0]] * r.shape[0], dtype=torch.int64, device="cpu")  # one response token each
    out = adapters.verl_advantages(tokens, mask, _labels(case), _weights_by_name(case),
                                   segment_sizes=case.get("segment_sizes"), **_eps(case))
    return out[:, 0]


#: call name -> (impl's call of a case, the expectation's kind, which cases it takes)
CALLS = {
    "gdpo_advantages_float32": (lambda c: _gdpo(c, torch.float32), "float32", None),
    "gdpo_advantages_bfloat16": (lambda c: _gdpo(c, torch.bfloat16), "bfloat16", None),
    "gdpo_advantages_float64": (lambda c: _gdpo(c, torch.float64), "float64", None),
    "gdpo_advantages_from_lists": (lambda c: _gdpo(c, torch.float32, as_list=True), "float32", None),
    "gdpo_advantages_on_cuda": (lambda c: _on_cuda(c, torch.float32), "float32", None),
    "whiten_on_cuda": (lambda c: gdpo.whiten(torch.tensor(c["values"], dtype=torch.float64, device="cuda"),
                                             segment_sizes=c.get("segment_sizes"), **_eps(c)), "whiten", None),
    "whiten": (lambda c: gdpo.whiten(torch.tensor(c["values"], dtype=torch.float64, device="cpu"),
                                     segment_sizes=c.get("segment_sizes"), **_eps(c)), "whiten", None),
    "whiten_from_list": (lambda c: gdpo.whiten(c["values"], segment_sizes=c.get("segment_sizes"), **_eps(c)),
                         "whiten", None),
    "normalize_rewards": (lambda c: gdpo.normalize_rewards(_rewards(c), **_groups(c), weights=c.get("weights"),
                                                           missing=c.get("missing", "refuse"), **_eps(c)),
                          "normalize", None),
    "standardize_groups": (lambda c: gdpo.standardize_groups(_rewards(c), **_groups(c),
                                                             missing=c.get("missing", "refuse"), **_eps(c)),
                           "standardize", None),
    "combine": (lambda c: gdpo.combine(torch.tensor(c["values"], dtype=torch.float64, device="cpu")[:, None],
                                       weights=[(c.get("weights") or [1.0])[0]]), "combine", None),
    "group_has_signal": (lambda c: gdpo.group_has_signal(_rewards(c), **_groups(c), weights=c.get("weights"),
                                                         missing=c.get("missing", "refuse"), **_eps(c)),
                         "same", None),
    "labelled_advantages": (_labelled, "float32", None),
    "trl_advantages": (_trl, "float32", lambda c: "group_size" in c),
    "verl_advantages": (_verl, "float32", lambda c: "missing" not in c),
}


@functools.lru_cache(maxsize=None)
def _expected(case_name: str, call_name: str):
    """What the call must give (computed outside every mode): the oracle's rounding (narrow
    formats, bit for bit), its Stage (float64: within the error model), or impl's own result
    outside the mode ("same")."""
    case, kind = CASES[case_name], CALLS[call_name][1]
    if kind in ("float32", "bfloat16"):
        return np.asarray(_oracle_gdpo(case).rounded(kind), dtype=np.float64)
    if kind == "float64":
        return _oracle_gdpo(case)
    if kind == "whiten":
        return np.asarray(oracle.whiten(np.array(case["values"]), segment_sizes=case.get("segment_sizes"),
                                        **_eps(case)).float32, dtype=np.float64)
    if kind == "normalize":
        return oracle.normalize_rewards(np.array(case["rewards"]), **_groups(case), weights=case.get("weights"),
                                        missing=case.get("missing", "refuse"), **_eps(case))
    if kind == "standardize":
        return oracle.standardize_groups(np.array(case["rewards"]), **_groups(case),
                                         missing=case.get("missing", "refuse"), **_eps(case))
    if kind == "combine":
        return oracle.combine(np.array(case["values"])[:, None], weights=[(case.get("weights") or [1.0])[0]])
    return CALLS[call_name][0](case).tolist()


def _hex(xs) -> list[str]:
    return [float(x).hex() for x in xs]


def _check(case_name: str, call_name: str, got: torch.Tensor, want, mode: str) -> None:
    what = f"{call_name} of {case_name} under {mode}"
    kind = CALLS[call_name][1]
    device = "cuda" if call_name.endswith("_on_cuda") else "cpu"  # the caller's data's device, whatever the default
    assert isinstance(got, torch.Tensor) and got.device.type == device, f"{what}: {type(got)} on {got.device}"
    if kind == "same":
        assert got.tolist() == want, f"{what}: {got.tolist()}, outside the mode {want}"
        return
    g = got.detach().to("cpu", torch.float64).numpy().reshape(-1)
    if isinstance(want, np.ndarray):  # a correct rounding: bit for bit (+0 and -0 differ)
        assert _hex(g) == _hex(want), f"{what}: got {_hex(g)}, the oracle's rounding {_hex(want)}"
        return
    exact, allowed = np.asarray(want.float64).reshape(-1), np.asarray(want.allowed("float64")).reshape(-1)
    err = np.abs(g - exact)
    bad = np.flatnonzero(~(err <= allowed))
    assert bad.size == 0, (f"{what}: element {bad[0]}: got {g[bad[0]].hex()}, exact {exact[bad[0]].hex()}, "
                           f"error {err[bad[0]]:.3e} > allowed {allowed[bad[0]]:.3e} (spec/gdpo.md section 7)")


# --- the modes ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _flush_denormal():
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals (torch.set_flush_denormal returned False)")
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


@contextlib.contextmanager
def _numpy_raises():
    old = np.seterr(all="raise")
    try:
        yield
    finally:
        np.seterr(**old)


@contextlib.contextmanager
def _default_device(device: str):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    old = torch.get_default_device()
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(old)


@contextlib.contextmanager
def _default_dtype():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@contextlib.contextmanager
def _deterministic():
    old, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(old, warn_only=warn_only)


@contextlib.contextmanager
def _anomaly():
    old = torch.is_anomaly_enabled()
    torch.autograd.set_detect_anomaly(True)
    try:
        yield
    finally:
        torch.autograd.set_detect_anomaly(old)


@contextlib.contextmanager
def _warnings_raise():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@contextlib.contextmanager
def _all_at_once():
    """Every mode that leaves an exact result possible, together (meta: no CUDA needed)."""
    with _numpy_raises(), _default_device("meta"), _default_dtype(), _deterministic(), _anomaly(), _warnings_raise():
        yield


MODES = {
    "flush_denormal": _flush_denormal,
    "numpy_seterr_raise": _numpy_raises,
    "default_device_meta": lambda: _default_device("meta"),
    "default_device_cuda": lambda: _default_device("cuda"),
    "default_dtype_float64": _default_dtype,
    "deterministic_algorithms": _deterministic,
    "detect_anomaly": _anomaly,
    "warnings_error": _warnings_raise,
    "all_but_flushing": _all_at_once,
}
REFUSING = {"flush_denormal"}  # the modes under which an exact result is impossible


def _state() -> tuple:
    return (torch.get_default_device(), torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled(),
            torch.is_anomaly_enabled(), tuple(sorted(np.geterr().items())), process_state_error() is None)


@pytest.fixture(autouse=True)
def _restored():
    """Every mode left as it was found, whatever a test did (each mode also restores its own)."""
    before = _state()
    old_err, old_device, old_dtype = np.geterr(), torch.get_default_device(), torch.get_default_dtype()
    yield
    torch.set_flush_denormal(False)
    np.seterr(**old_err)
    torch.set_default_device(old_device)
    torch.set_default_dtype(old_dtype)
    torch.use_deterministic_algorithms(before[2])
    torch.autograd.set_detect_anomaly(before[3])
    assert _state() == before, "a mode outlived its test"


MATRIX = [(m, c, k) for m in MODES for c in CASES for k, (_, _, takes) in CALLS.items()
          if takes is None or takes(CASES[c])]


@pytest.mark.parametrize("mode,case_name,call_name", MATRIX, ids=["-".join(t) for t in MATRIX])
def test_the_oracles_bits_or_the_named_refusal(mode, case_name, call_name):
    if call_name.endswith("_on_cuda") and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    want = _expected(case_name, call_name)  # outside the mode
    call = CALLS[call_name][0]
    with MODES[mode]():
        refusal = process_state_error()
        try:
            got = call(CASES[case_name])
        except GDPOError as exc:
            assert mode in REFUSING, f"{call_name} of {case_name} under {mode}: refused: {exc}"
            assert str(refusal) in str(exc) and "torch.set_flush_denormal(False)" in str(exc), str(exc)
            return
    assert mode not in REFUSING, f"{call_name} of {case_name} under {mode}: computed {got.tolist()}, not refused"
    _check(case_name, call_name, got, want, mode)


# --- negative controls ------------------------------------------------------------------------------


def test_without_the_check_flush_to_zero_is_silently_wrong(monkeypatch):
    """The matrix's flush-to-zero row would catch a missing check: with impl's check patched out,
    the issue's batch gives wrong certified bits and its subnormal weights are refused as zero."""
    case = CASES["subnormal_rewards"]
    want = _expected("subnormal_rewards", "gdpo_advantages_float32")
    monkeypatch.setattr(_inputs, "check_process_state", lambda: None)
    with _flush_denormal():
        got = _gdpo(case, torch.float32)
        with pytest.raises(GDPOError, match="all 2 weights are zero"):
            _gdpo(CASES["subnormal_weights"], torch.float32)
    assert _hex(got.double().tolist()) != _hex(want), "the check is not what refuses"
    assert [round(x, 3) for x in got.tolist()] == [0.866, -0.866, -0.866, 0.866]


#: torch's functions that create a tensor on the default device (torch.utils._device), and frombuffer
_FACTORIES = {"arange", "as_tensor", "asarray", "empty", "empty_strided", "eye", "full", "linspace", "logspace",
              "ones", "rand", "randint", "randn", "randperm", "range", "scalar_tensor", "tensor", "zeros",
              "frombuffer"}


#: what each factory must name where it is not both: frombuffer is always on the CPU; as_tensor and
#: asarray read the caller's data, whose dtype is the data's (impl reads Python floats as float64 itself)
_NEEDS = {"frombuffer": {"dtype"}, "as_tensor": {"device"}, "asarray": {"device"}}


def _factories_without(source: str, path: str = "<source>") -> list[str]:
    """Calls ``torch.<factory>(...)`` in ``source`` that do not name both ``device=`` and ``dtype=``
    (but see :data:`_NEEDS`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _FACTORIES \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch":
            named = {k.arg for k in node.keywords}
            need = _NEEDS.get(node.func.attr, {"device", "dtype"})
            if need - named:
                found.append(f"{path}:{node.lineno}: torch.{node.func.attr} without {sorted(need - named)}")
    return found


def test_every_tensor_impl_creates_names_its_device_and_dtype():
    """Under torch.set_default_device("meta") every call used to raise NotImplementedError (a buffer
    made on the meta device), and a default float64 dtype changes what an unnamed one holds."""
    found = [f for path in sorted((ROOT / "impl").rglob("*.py"))
             for f in _factories_without(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, "\n".join(found)


def test_the_factory_rule_finds_a_call_without_a_device():
    assert _factories_without("torch.tensor(sizes, dtype=torch.int64)") != []
    assert _factories_without("torch.arange(n, device=d)") != []
    assert _factories_without("torch.as_tensor(labels)") != []
    assert _factories_without("torch.zeros(3, dtype=torch.float64, device=x.device)") == []
