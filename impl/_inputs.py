"""Host-side checks of the arguments: each raises a :class:`Problem` ``(code, a, b, c)`` or
returns the normalised argument, and nothing reads the device. :func:`check_call` runs a call's
checks in their one order; the distributed path records its problem and still joins the
agreement, a local call (:func:`check_local`) raises the problem's error at once."""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import numbers
import os
import sys
import warnings

import torch

from impl import _problems as P
from impl._segments import to_device
from spec.errors import flush_modes

_F64 = torch.float64
_U64 = getattr(torch, "uint64", None)  # torch >= 2.3


class Problem(Exception):
    """Internal carrier of a host-side problem code (never escapes the package)."""

    def __init__(self, code: int, a: int = 0, b: int = 0, c: int = 0, detail: str = ""):
        super().__init__(code, a, b, c)
        self.code, self.a, self.b, self.c = code, int(a), int(b), int(c)
        self.detail = detail  # the caller's value as text: this rank's own message only

    def error(self):
        return P.host_error(self.code, self.a, self.b, self.c, self.detail)


def _shown(x, limit: int = 40) -> str:
    """A short repr of the caller's value, for a message."""
    try:
        text = repr(x)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the refusal
        return f"a {type(x).__name__}"
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]  # a complex number's repr: (1+2j)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _np_kind(x):
    """The NumPy dtype kind of a NumPy scalar or array ('b', 'i', 'f', ...), else None."""
    kind = getattr(getattr(x, "dtype", None), "kind", None)
    return kind if isinstance(kind, str) and not isinstance(x, torch.Tensor) else None


def _not_a_number(x) -> tuple[int, int, str]:
    """What ``x`` is instead of a real number: (a P.K_* code, a bool's value, the detail),
    or (0, 0, "") when it may be one (float() decides)."""
    if x is None:
        return P.K_NONE, 0, ""
    if isinstance(x, torch.Tensor):
        return P.K_TENSOR, 0, f"shape {tuple(x.shape)}, dtype {str(x.dtype).replace('torch.', '')}"
    if isinstance(x, bool):
        return P.K_BOOL, int(x), ""
    if isinstance(x, str):  # NumPy's str_ too
        return P.K_STR, 0, _shown(x)
    if isinstance(x, (bytes, bytearray)):
        return P.K_BYTES, 0, _shown(x)
    if isinstance(x, complex):  # NumPy's complex128 too
        return P.K_COMPLEX, 0, _shown(x)
    kind = _np_kind(x)
    if kind is not None:
        if getattr(x, "ndim", 0) != 0:
            return P.K_ARRAY, 0, f"shape {tuple(x.shape)}"
        if kind == "b":
            return P.K_BOOL, int(bool(x)), ""
        if kind == "c":
            return P.K_COMPLEX, 0, _shown(x)
        return (0, 0, "") if kind in "iuf" else (P.K_OTHER, 0, _of_type(x))
    return 0, 0, ""


def _of_type(x) -> str:
    """``x`` for a message: its type and value ("a list ([1.0])")."""
    name = type(x).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name} ({_shown(x)})"


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1  # what the agreement table can carry
_EXACT_INT = 2.0 ** 53  # Python ints from this magnitude on may not be float64s: checked one by one


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _int_shown(x) -> str:
    """A Python int for a message: its digits, or about how large it is (recent Pythons give an
    int of thousands of digits no str())."""
    x = int(x)
    if abs(x) < 10 ** 30:
        return str(x)
    shift = max(abs(x).bit_length() - 64, 0)
    lg = math.log10(abs(x) >> shift) + shift * math.log10(2)
    e = math.floor(lg)
    return f"about {'-' if x < 0 else ''}{10 ** (lg - e):.2f}e+{e}"


def _integral(t: torch.Tensor) -> bool:
    """Has the tensor an integer dtype (not floating, complex or bool)?"""
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def _is_row(x) -> bool:
    """A row of a nested sequence: a list, a tuple, a tensor or array of at least one dimension."""
    if isinstance(x, torch.Tensor) or _np_kind(x) is not None:
        return getattr(x, "ndim", 0) >= 1
    return isinstance(x, collections.abc.Sequence) and not isinstance(x, (str, bytes, bytearray))


def _unreadable_number(x) -> tuple[int, str] | None:
    """(P.K_* code, the value as text) of a rewards / values entry torch cannot read as a number;
    None if it can (a bool or a complex number too: their dtype is refused afterwards)."""
    if _is_int(x):
        try:
            float(x)
        except OverflowError:
            return P.K_BEYOND_FLOAT64, _int_shown(x)
        return None
    what, _, detail = _not_a_number(x)
    if what in (P.K_BOOL, P.K_COMPLEX) or what == P.K_TENSOR and x.dim() == 0:
        return None
    if what:
        return what, detail
    return None if isinstance(x, float) or _np_kind(x) else (P.K_OTHER, _of_type(x))


#: A sequence argument's problems by its type's code: (an entry, a ragged row, its layout, its P.ARG_*).
_ENTRY_PROBLEM = {P.P_REWARDS_TYPE: (P.P_REWARDS_ENTRY, P.P_REWARDS_RAGGED, P.P_REWARDS_LAYOUT, P.ARG_REWARDS),
                  P.P_VALUES_TYPE: (P.P_VALUES_ENTRY, P.P_VALUES_RAGGED, P.P_VALUES_LAYOUT, P.ARG_VALUES)}


def unreadable(x, type_code: int, overflow: bool) -> Problem:
    """Why torch could not read the sequence ``x`` as real numbers: its first unreadable entry,
    its first row of another length, or (found nowhere) what ``x`` is."""
    entry, ragged = _ENTRY_PROBLEM[type_code][:2]
    whole = Problem(type_code, int(overflow), detail="" if overflow else _of_type(x))
    if isinstance(x, (str, bytes, bytearray, collections.abc.Mapping, collections.abc.Set)) \
            or not isinstance(x, collections.abc.Sized) or not _is_row(x):
        return whole
    try:
        rows = list(x)
    except Exception:  # noqa: BLE001 - a broken container: say what it is
        return whole
    width = len(rows[0]) if rows and _is_row(rows[0]) else None
    for i, row in enumerate(rows):
        if width is None:
            bad = (P.K_OTHER, _of_type(row)) if _is_row(row) else _unreadable_number(row)
            if bad:
                return Problem(entry, i, -1, bad[0], detail=bad[1])
            continue
        if not _is_row(row):
            return Problem(ragged, i, -1, width, detail=_of_type(row))
        if len(row) != width:
            return Problem(ragged, i, len(row), width)
        for j, v in enumerate(row):
            bad = _unreadable_number(v)
            if bad:
                return Problem(entry, i, j, bad[0], detail=bad[1])
    return whole


def check_process_state() -> None:
    """Neither flush-to-zero nor denormals-are-zero on in this thread (a subnormal would read as
    0); checked at every call: a library loaded since may have turned either on."""
    ftz, daz = flush_modes()
    if ftz or daz:
        raise Problem(P.P_PROCESS_STATE, int(ftz) + 2 * int(daz))


def check_eps(eps) -> float:
    """eps as a float: a finite real number >= 0 (int, float, NumPy real scalar, 0-d real tensor)."""
    real_tensor = isinstance(eps, torch.Tensor) and eps.dim() == 0 and not (eps.is_complex() or eps.dtype == torch.bool)
    what, value, detail = (0, 0, "") if real_tensor else _not_a_number(eps)
    if not what and not (real_tensor or isinstance(eps, numbers.Real) or _np_kind(eps)):
        what, detail = P.K_OTHER, _of_type(eps)  # a list, a Decimal, ...
    if what:
        raise Problem(P.P_EPS_TYPE, what, value, detail=detail)
    _check_device(eps, P.ARG_EPS)
    try:
        value = float(eps)
    except OverflowError:  # an int beyond float64
        raise Problem(P.P_EPS, P.float_bits(math.inf), 1) from None
    except (TypeError, ValueError, RuntimeError):
        raise Problem(P.P_EPS_TYPE, P.K_OTHER, detail=_of_type(eps)) from None
    if not (math.isfinite(value) and value >= 0.0):
        raise Problem(P.P_EPS, P.float_bits(value))
    return value + 0.0  # -0.0 is 0.0: ranks passing either agree


def check_missing(missing) -> str:
    """The ``missing`` policy: exactly "refuse" or "unscored" (a str; nothing else is read as one)."""
    if type(missing) is str and missing in P.MISSING_CODES:
        return missing
    raise Problem(P.P_MISSING, int(isinstance(missing, str)), detail=_shown(missing))


#: What ``certified`` (and ``GDPO_CERTIFIED``, its default) may say: the certificate's mode each names.
CERTIFIED_MODES = {"1": "all", "all": "all", "true": "all", "yes": "all", "on": "all", "0": "off", "off": "off",
                   "false": "off", "no": "off", "narrow": "narrow", "": "narrow"}
_WARNED: set = set()


def check_certified(certified) -> str:
    """The mode ``certified`` names: True "all", False "off", a string as in :data:`CERTIFIED_MODES`;
    None: ``GDPO_CERTIFIED`` (unset, or naming no mode: "narrow", the latter warned once per value)."""
    if certified is None:
        value = os.environ.get("GDPO_CERTIFIED", "")
        mode = CERTIFIED_MODES.get(value.strip().lower())
        if mode is None and value not in _WARNED:
            _WARNED.add(value)
            warnings.warn(f"GDPO_CERTIFIED={value!r} names no mode (1 or all, 0 or off, narrow): the default, "
                          "narrow, is used", RuntimeWarning, stacklevel=3)
        return mode or "narrow"
    if isinstance(certified, bool):
        return "all" if certified else "off"
    if type(certified) is str and certified.strip().lower() in CERTIFIED_MODES:
        return CERTIFIED_MODES[certified.strip().lower()]
    raise Problem(P.P_CERTIFIED, detail=_shown(certified))


def check_out_dtype(out_dtype) -> torch.dtype:
    if not isinstance(out_dtype, torch.dtype):
        raise Problem(P.P_OUT_DTYPE, 0, detail=_not_a_dtype(out_dtype))
    if out_dtype not in P.OUT_DTYPES:
        raise Problem(P.P_OUT_DTYPE, P.dtype_code(out_dtype), detail=str(out_dtype).replace("torch.", ""))
    return out_dtype


def _not_a_dtype(x) -> str:
    """What ``out_dtype`` is instead of a torch.dtype, with the torch.dtype it may have meant."""
    if x is None:
        return "None, not a torch.dtype"
    name = x.removeprefix("torch.") if isinstance(x, str) else None
    np = sys.modules.get("numpy")
    if np is not None and (name is None or not hasattr(torch, name)):
        try:
            name = np.dtype(x).name  # np.float32, np.dtype("float32"), float, "double"
        except Exception:  # noqa: BLE001 - not a NumPy dtype either
            pass
    meant = getattr(torch, name, None) if isinstance(name, str) else None
    hint = f"; pass torch.{name}" if meant in P.OUT_DTYPES else ""
    what = "a NumPy dtype" if np is not None and isinstance(x, np.dtype) else _of_type(x).split(" (")[0]
    return f"{_shown(x)} ({what}, not a torch.dtype{hint})"


def numpy_view(x):
    """``x``, or a contiguous native copy of a NumPy array torch cannot share: negative strides
    (``a[::-1]``), read-only, or the other byte order (``a.astype('>f8')``)."""
    strides, flags = getattr(x, "strides", None), getattr(x, "flags", None)
    if strides is None or flags is None or _np_kind(x) is None:
        return x
    if not getattr(x.dtype, "isnative", True):
        return sys.modules["numpy"].ascontiguousarray(x, dtype=x.dtype.newbyteorder("="))
    if any(s < 0 for s in strides) or not getattr(flags, "writeable", True):
        return sys.modules["numpy"].array(x, copy=True, order="C")
    return x


def read_tensor(x) -> torch.Tensor:
    """``x`` as a tensor, Python floats as float64 (torch would read float32); raises what
    torch.as_tensor raises."""
    if isinstance(x, torch.Tensor):
        return x
    x = numpy_view(x)
    t = torch.as_tensor(x, device="cpu")  # host data, whatever torch's default device
    if t.is_floating_point() and t.dtype != _F64 and not hasattr(x, "dtype"):
        t = torch.as_tensor(x, dtype=_F64, device="cpu")
    return t


def as_float_tensor(x, type_code: int, dtype_code_: int) -> torch.Tensor:
    """A dense tensor of a P.INPUT_DTYPES dtype for ``x`` (else refused; ``dtype_code_``: the
    dtype's refusal). A Python sequence's numbers are values, ints too (``[[1], [0], [1]]``), read
    as float64 where each is one exactly; a bool or an int beyond 2**53 that float64 cannot hold
    is refused by row and column (spec/errors.py, INPUT_RULES); an integer tensor by its dtype."""
    python = not isinstance(x, torch.Tensor) and not hasattr(x, "dtype")
    try:
        t = read_tensor(x)
    except (OverflowError, TypeError, ValueError, RuntimeError) as exc:
        if python and _is_row(x) and not isinstance(exc, TypeError):  # an int beyond int64 (a float64)
            return _checked(_python_values(x, type_code), type_code, dtype_code_)  # value by value
        raise unreadable(x, type_code, overflow=isinstance(exc, OverflowError)) from None
    if python and (not t.is_floating_point() and not t.is_complex()
                   or t.is_floating_point() and t.numel() and bool(t.abs().amax() >= _EXACT_INT)
                   or _holds_bool(x)):  # torch reads [1.0, True] as floats: the bool is found here
        t = _python_values(x, type_code)  # ints (or bools), or magnitudes where an int may round
    return _checked(t, type_code, dtype_code_)


def _holds_bool(x, tensors: bool = False) -> bool:
    """Is an entry of the Python (nested) sequence ``x`` a bool (Python's or NumPy's; ``tensors``:
    a 0-d bool tensor too)?"""
    bools = (bool, getattr(sys.modules.get("numpy"), "bool_", bool))
    return _is_row(x) and any(isinstance(v, bools) or tensors and isinstance(v, torch.Tensor) and v.dtype == torch.bool
                              for row in x for v in (row if _is_row(row) else (row,)))


def _python_values(x, type_code: int) -> torch.Tensor:
    """A Python (nested) sequence of real numbers as float64, each exactly, or the refusal of
    its first bool or int no float64 equals."""
    entry = _ENTRY_PROBLEM[type_code][0]
    rows = list(x)
    for i, row in enumerate(rows):
        items = list(row) if _is_row(row) else [row]
        for j, v in enumerate(items):
            col = j if _is_row(row) else -1
            if isinstance(v, (bool, getattr(sys.modules.get("numpy"), "bool_", bool))):
                raise Problem(entry, i, col, P.K_OTHER, detail=f"a bool ({bool(v)!r}), not a number here")
            if _is_int(v):
                try:
                    exact = float(v) == v
                except OverflowError:
                    raise Problem(entry, i, col, P.K_BEYOND_FLOAT64, detail=_int_shown(v)) from None
                if not exact:
                    raise Problem(entry, i, col, P.K_INEXACT_INT, detail=_int_shown(v))
            elif not isinstance(v, float) and _np_kind(v) != "f" and not (
                    isinstance(v, torch.Tensor) and v.dim() == 0 and v.is_floating_point()):
                raise unreadable(x, type_code, overflow=False)  # a Fraction, a str: named there
    try:
        return torch.as_tensor(x, dtype=_F64, device="cpu")
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise unreadable(x, type_code, overflow=False) from None


def _checked(x: torch.Tensor, type_code: int, dtype_code_: int) -> torch.Tensor:
    _, _, layout, arg = _ENTRY_PROBLEM[type_code]
    if x.layout != torch.strided or x.is_nested:  # else torch's own error, from deep inside
        raise Problem(layout, P.layout_code(x))
    if x.dtype not in P.INPUT_DTYPES:  # float8 too: most CPU kernels (add, min) do not exist for it
        raise Problem(dtype_code_, P.dtype_code(x.dtype))
    _check_device(x, arg)
    if x.is_neg():  # a lazy negation (torch._neg_view, a conjugate's imaginary part): its values
        x = x.resolve_neg()
    return x


@dataclasses.dataclass
class Rewards:
    """Validated Eq. 4/7 input: float rewards (N, K), group layout, float64 weights."""

    rewards: torch.Tensor  # (N, K), caller's floating dtype, caller's device
    group_size: int | None
    labels: torch.Tensor | None  # int64 (N,) on the rewards' device
    weights: list[float]
    labels_uint64: bool = False  # ``labels`` holds uint64 labels' bits (P.LABELS_UINT64)
    missing: str = "refuse"  # the NaN policy (``check_missing``)
    #: rows and reward columns: fields the plan reads as data (``dataclasses.replace`` sets them)
    n: int = dataclasses.field(init=False)
    k: int = dataclasses.field(init=False)

    def __post_init__(self):
        self.n, self.k = self.rewards.shape


def check_rewards(rewards, group_ids, group_size, weights, *, allow_empty_rows: bool,
                  missing: str = "refuse") -> Rewards:
    r = as_float_tensor(rewards, P.P_REWARDS_TYPE, P.P_REWARDS_DTYPE)
    if r.dim() == 1:
        r = r[:, None]  # (N,) is one reward column, K = 1
    elif r.dim() != 2:
        raise Problem(P.P_REWARDS_NDIM, r.dim())
    n, k = r.shape
    if k == 0 or (n == 0 and not allow_empty_rows):
        raise Problem(P.P_REWARDS_EMPTY, n, k)

    if (group_ids is None) == (group_size is None):
        raise Problem(P.P_GROUPS_NONE if group_ids is None else P.P_GROUPS_BOTH)
    labels, unsigned = None, False
    if group_size is not None:
        group_size = _check_group_size(group_size)
        if not _INT64_MIN <= group_size <= _INT64_MAX:
            raise Problem(P.P_GROUP_SIZE_INT64, detail=_int_shown(group_size))
        if group_size < 2:
            raise Problem(P.P_GROUP_SIZE_SMALL, group_size)
        if n % group_size:
            raise Problem(P.P_GROUP_SIZE_DIVIDE, n, group_size)
    else:
        ids = group_ids
        if isinstance(ids, torch.Tensor) and P.layout_code(ids):
            raise Problem(P.P_GROUP_IDS_LAYOUT, P.layout_code(ids))
        _check_device(ids, P.ARG_GROUP_IDS)
        if not isinstance(ids, torch.Tensor):
            if isinstance(ids, (str, bytes, bytearray, collections.abc.Mapping, collections.abc.Set)):
                raise Problem(P.P_GROUP_IDS_DTYPE, 0, detail=_of_type(ids))  # characters, keys, no order
            try:
                ids = torch.as_tensor(numpy_view(ids), device="cpu")
            except (TypeError, ValueError, RuntimeError, OverflowError):
                raise (_label_problem(group_ids) or Problem(P.P_GROUP_IDS_DTYPE, 0, detail=_of_type(group_ids))) \
                    from None
            if ids.dim() == 1 and not hasattr(group_ids, "dtype") and (
                    not _integral(ids) or _holds_bool(group_ids, tensors=True)):  # [1, True]: int64 [1, 1]
                problem = _label_problem(group_ids)  # a Python sequence: its first non-integer label
                if problem is not None:
                    raise problem
        if ids.numel() == 0 and ids.dim() == 1:
            ids = ids.to(torch.int64)  # an empty shard's labels (torch.tensor([]) is float32) hold no label at all
        if not _integral(ids):
            python_floats = ids.is_floating_point() and not hasattr(group_ids, "dtype")  # read as doubles
            raise Problem(P.P_GROUP_IDS_DTYPE, P.dtype_code(torch.float64 if python_floats else ids.dtype))
        if ids.dim() != 1:
            raise Problem(P.P_GROUP_IDS_NDIM, ids.dim())
        if ids.shape[0] != n:
            raise Problem(P.P_GROUP_IDS_LENGTH, ids.shape[0], n)
        unsigned = ids.dtype == _U64
        # uint64: the bits, so that equal labels stay equal (a value cast would saturate or
        # wrap by platform); every other integer dtype converts exactly.
        labels = to_device(ids.view(torch.int64) if unsigned else ids.to(torch.int64), r.device)

    return Rewards(r, group_size, labels, check_weights(weights, k), labels_uint64=unsigned, missing=missing)


def _label_problem(group_ids) -> Problem | None:
    """The refusal of the first label of a sequence that is no int64 integer; None if none is
    (or ``group_ids`` is no sized sequence)."""
    if not isinstance(group_ids, collections.abc.Sized):
        return None
    try:
        items = list(group_ids)
    except Exception:  # noqa: BLE001 - a broken container: the caller says what it is
        return None
    for i, x in enumerate(items):
        if isinstance(x, torch.Tensor) and x.dim() == 0 and _integral(x):
            x = int(x.item())
        if _is_int(x):
            if not _INT64_MIN <= int(x) <= _INT64_MAX:
                return Problem(P.P_GROUP_IDS_ITEM, i, P.K_BEYOND_INT64, int(0 <= int(x) >> 63 < 2),
                               detail=_int_shown(x))  # c: 1 where a uint64 tensor could hold it
            continue
        return _not_an_int(P.P_GROUP_IDS_ITEM, x, i)
    return None


def _not_an_int(code: int, x, *at: int) -> Problem:
    """``x`` (the argument, or its entry ``at``) is no integer: what it is instead."""
    what, value, detail = _not_a_number(x)
    if what:
        return Problem(code, *at, what, value, detail=detail)
    if isinstance(x, float) or _np_kind(x) == "f":
        return Problem(code, *at, P.K_FLOAT, P.float_bits(x))
    return Problem(code, *at, P.K_OTHER, detail=_of_type(x))


def _check_device(x, arg: int) -> None:
    """A tensor argument (``P.ARG_*``) must hold data impl computes on: CPU or CUDA."""
    if isinstance(x, torch.Tensor) and x.device.type not in ("cpu", "cuda"):
        raise Problem(P.P_DEVICE, arg, P.DEVICE_CODES.get(x.device.type, 3))


def _check_group_size(gs) -> int:
    """An integer scalar (Python int, NumPy integer, 0-d integer tensor or array) as a Python int."""
    if isinstance(gs, torch.Tensor):
        if P.layout_code(gs) or gs.device.type not in ("cpu", "cuda"):
            raise Problem(P.P_GROUP_SIZE_TYPE, P.K_OTHER,
                          detail=f"a tensor of layout {gs.layout} on {gs.device.type}")
        if gs.dim() == 0 and _integral(gs):
            return int(gs.item())  # a host read if it lives on a GPU (pass an int to avoid it)
    elif _is_int(gs) or _np_kind(gs) in ("i", "u") and gs.ndim == 0:  # (a 0-d integer array too)
        return int(gs)
    raise _not_an_int(P.P_GROUP_SIZE_TYPE, gs)


def _host_list(x, type_code: int, layout_code: int, arg: int, text=(str, bytes), integers: bool = False) -> list:
    """A 1-D sequence or tensor argument (weights, segment sizes) as a host list, else refused
    (``_problems._sequence_words``; ``text``: types refused as a string; ``integers``: a float
    tensor too)."""
    if isinstance(x, (collections.abc.Mapping, *text, collections.abc.Set)):
        raise Problem(type_code, 1 if isinstance(x, collections.abc.Mapping)
                      else 3 if isinstance(x, collections.abc.Set) else 2, detail=_of_type(x))
    if isinstance(x, torch.Tensor):
        if P.layout_code(x):
            raise Problem(layout_code, P.layout_code(x))
        _check_device(x, arg)
        if x.dim() != 1:
            raise Problem(type_code, 5, x.dim())
        if x.is_complex() or x.dtype == torch.bool or (integers and x.is_floating_point()):
            raise Problem(type_code, 4, P.dtype_code(x.dtype))
        return x.detach().cpu().tolist()  # a host sync on a GPU (pass a list to avoid it)
    try:
        return list(x)
    except TypeError:
        raise Problem(type_code, 8, detail=_of_type(x)) from None


def check_weights(weights, k: int) -> list[float]:
    if weights is None:
        return [1.0] * k
    if _np_kind(weights) in ("b", "c"):  # NumPy bools or complex numbers
        raise Problem(P.P_WEIGHTS_TYPE, 6 if _np_kind(weights) == "b" else 7)
    items = _host_list(weights, P.P_WEIGHTS_TYPE, P.P_WEIGHTS_LAYOUT, P.ARG_WEIGHTS)
    if len(items) != k:
        raise Problem(P.P_WEIGHTS_LENGTH, len(items), k)
    out = []
    for i, w in enumerate(items):
        what, value, detail = _not_a_number(w)  # float() would read a str, a 0-d tensor, a bool
        if what:
            raise Problem(P.P_WEIGHTS_ITEM, i, what, value, detail=detail)
        try:
            f = float(w)
        except OverflowError:  # an int beyond float64, Fraction(10**400)
            raise Problem(P.P_WEIGHTS_INEXACT, i, 1, detail=_int_shown(w) if _is_int(w) else _of_type(w)) from None
        except (TypeError, ValueError, ArithmeticError):
            raise Problem(P.P_WEIGHTS_ITEM, i, P.K_OTHER, detail=_of_type(w)) from None
        if math.isnan(f):
            raise Problem(P.P_WEIGHTS_NONFINITE, i, 1)
        if math.isinf(f) and f != w:  # a finite number beyond float64's range: Decimal("1e400")
            raise Problem(P.P_WEIGHTS_INEXACT, i, 1, detail=_of_type(w))
        if math.isinf(f):
            raise Problem(P.P_WEIGHTS_NONFINITE, i, 2 if f > 0 else 3)
        # ints compared as ints (NumPy's int64 == float rounds); Fraction, Decimal compare exactly
        if not (int(f) == int(w) if _is_int(w) else isinstance(w, float) or f == w):
            raise Problem(P.P_WEIGHTS_INEXACT, i)  # e.g. 2**53 + 1, Fraction(2**53 + 1) or Decimal("0.1")
        out.append(f)
    if all(f == 0.0 for f in out):
        raise Problem(P.P_WEIGHTS_ZERO, k)
    return out


def check_standardized(z, weights) -> tuple[torch.Tensor, list[float]]:
    """Eq. 7's input: z (N, K) or (N,) finite floats, as a float64 (K, N) copy, and the weights."""
    check_process_state()
    z = as_float_tensor(z, P.P_VALUES_TYPE, P.P_Z_DTYPE)
    if z.dim() == 1:
        z = z[:, None]
    elif z.dim() != 2:
        raise Problem(P.P_Z_NDIM, z.dim())
    n, k = z.shape
    if n == 0 or k == 0:
        raise Problem(P.P_Z_EMPTY, n, k)
    w = check_weights(weights, k)
    zt = torch.empty(k, n, dtype=torch.float64, device=z.device).copy_(z.t())  # exact: every input format
    bad = ~torch.isfinite(zt.t())
    if bool(bad.any()):  # a host read: Eq. 7 alone is a local call
        at = int(torch.argmax(bad.reshape(-1).view(torch.uint8)))
        x = float(z.reshape(-1)[at])
        raise Problem(P.P_Z_NONFINITE, at // k, at % k, 1 if x != x else 2 if x > 0 else 3)
    return zt, w


def check_segments(segment_sizes, n: int) -> tuple[list[int], bool]:
    """This rank's unit sizes as host ints; None is one unit of all local rows."""
    if segment_sizes is None:
        return [n], False
    sizes = _host_list(segment_sizes, P.P_SEGMENTS_TYPE, P.P_SEGMENTS_LAYOUT, P.ARG_SEGMENTS,
                       text=(str, bytes, bytearray), integers=True)
    if not isinstance(segment_sizes, torch.Tensor):
        for j, s in enumerate(sizes):
            if not _is_int(s):
                raise _not_an_int(P.P_SEGMENTS_ITEM, s, j)
        sizes = [int(s) for s in sizes]
    for j, s in enumerate(sizes):
        if not _INT64_MIN <= s <= _INT64_MAX:
            raise Problem(P.P_SEGMENT_INT64, j, detail=_int_shown(s))
        if s < 0:
            raise Problem(P.P_SEGMENTS_NEGATIVE, j, s)
    total = sum(sizes)
    if total != n:
        raise Problem(P.P_SEGMENTS_SUM, total if total <= _INT64_MAX else -1, n)
    return sizes, True


@dataclasses.dataclass
class Diagnostics:
    """What a call left out under ``missing="unscored"`` (spec/gdpo.md section 2), and how its
    rounding was decided: pass one as ``diagnostics=``; a call that returns fills it in.

    ``unscored_rows``: this rank's rows whose every reward is NaN (advantage 0, outside Eq. 6);
    ``unscored_rows_all_ranks``: the same over every rank of the process group (local calls: the
    local count); ``unscored``: (N,) bool, True on those rows; ``certified``: the rows each tier
    of the certificate decided (``impl._certify.Counts``). None before a call."""

    unscored_rows: int = 0
    unscored_rows_all_ranks: int = 0
    unscored: torch.Tensor | None = None
    certified: "_certify.Counts | None" = None  # noqa: F821 - not imported here


@dataclasses.dataclass
class Call:
    """A validated call: its arguments as the checks normalised them (the plan reads fields only)."""

    eps: float
    inp: Rewards | None = None  # gdpo_advantages and the Eq. 4/7 APIs (None: whiten)
    values: torch.Tensor | None = None  # whiten: the values (N,)
    sizes: list[int] | None = None  # gdpo_advantages, whiten: this process's unit sizes
    out_dtype: torch.dtype | None = None  # gdpo_advantages, whiten (None: float64 out)
    host: dict[int, int] = dataclasses.field(default_factory=dict)  # the facts row's host fields
    mode: str = "off"  # the certificate's (gdpo_advantages, whiten: :func:`check_certified`)


def check_call(host: dict[int, int], *, rewards=None, group_ids=None, group_size=None, weights=None,
               values=None, whiten: bool = False, segment_sizes=None, eps, out_dtype=None, missing="refuse",
               diagnostics=None, certified=None, eq6: bool = True, ranks: bool = False, names=None) -> Call:
    """Every host check of a call, in the order that decides which refusal a call with several
    bad arguments gets (process state, diagnostics, eps, out_dtype, missing, certified, rewards,
    groups, weights or values, segment sizes); raises the first :class:`Problem`. Without ``eq6``
    (the Eq. 4/7 APIs): no out_dtype, certified or sizes. ``ranks``: a rank of a call across a
    process group (it may hold no rows; its weights' digest, with an adapter's reward ``names``,
    goes to the agreement). ``host`` (the facts row's host fields) gets what each check read, so
    that a refusing rank still tells the agreement."""
    host[P.PRESENT] = 1
    check_process_state()
    if diagnostics is not None and not isinstance(diagnostics, Diagnostics):
        raise Problem(P.P_DIAGNOSTICS, detail=_shown(diagnostics))
    eps = check_eps(eps)
    if ranks:  # (a local call reads no _problems function here: call_path counts re-entries)
        host[P.EPS_BITS] = P.float_bits(eps)
    if eq6:
        out_dtype = check_out_dtype(out_dtype)
        host[P.OUT_DTYPE] = P.DTYPE_CODES[out_dtype]
    if not whiten:
        missing = check_missing(missing)
    mode = check_certified(certified) if eq6 else "off"
    host[P.CERTIFIED] = P.CERTIFIED_CODES[mode]
    inp = v = None
    if not whiten:
        inp = check_rewards(rewards, group_ids, group_size, weights, allow_empty_rows=ranks, missing=missing)
        data = inp.rewards
        host.update({P.K: inp.k, P.BY_LABEL: int(inp.labels is not None), P.GROUP_SIZE: inp.group_size or 0,
                     P.LABELS_UINT64: int(inp.labels_uint64), P.MISSING: P.MISSING_CODES[inp.missing]})
        if ranks:
            host[P.WEIGHTS_FP] = P.weights_fingerprint(inp.weights, names)
    else:
        data = v = as_float_tensor(values, P.P_VALUES_TYPE, P.P_VALUES_DTYPE)
        if v.dim() != 1:
            raise Problem(P.P_VALUES_NDIM, v.dim())
    n = data.shape[0]
    host.update({P.ROWS: n, P.DTYPE: P.DTYPE_CODES[data.dtype], P.DEVICE: P.DEVICE_CODES[data.device.type]})
    sizes = None
    if eq6:
        sizes, given = check_segments(segment_sizes, n)
        host.update({P.UNITS: len(sizes), P.SEG_NONE: int(not given)})
        host.update({P.COUNTS + j: s for j, s in enumerate(sizes[: P.COUNT_SLOTS])})
    return Call(eps, inp=inp, values=v, sizes=sizes, out_dtype=out_dtype, host=host, mode=mode)


def check_local(**arguments) -> Call:
    """A local call's checks (:func:`check_call`'s, then a unit of one row), raised at once."""
    try:
        call = check_call({}, **arguments)
        for j, s in enumerate(call.sizes or ()):
            if s == 1:
                raise Problem(P.P_UNIT_OF_ONE, j)
    except Problem as p:
        raise p.error() from None
    return call
