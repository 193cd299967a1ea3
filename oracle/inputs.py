"""The oracle's inputs, taken exactly or refused, checked as impl.gdpo checks them (spec/gdpo.md
section 6). The oracle never rounds an input: a rounded input would decide zeros and collapse
for another one."""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import numbers
from fractions import Fraction

import numpy as np

from spec.conventions import Convention
from spec.errors import GroupError, InputDtypeError, NonFiniteError, OutOfRangeError, SegmentError, ShapeError, \
    WeightError

#: The ``missing`` policies, as in impl.gdpo (spec/gdpo.md section 2).
MISSING = ("refuse", "unscored")


def as_float_matrix(rewards, what: str = "rewards") -> np.ndarray:
    """The inputs as a float64 matrix, every value exactly as given, or a refusal (spec/gdpo.md
    section 10; a Fraction float64 cannot hold is refused like an int beyond 2^53)."""
    if hasattr(rewards, "detach") and hasattr(rewards, "cpu"):
        t = rewards.detach()  # a torch tensor, without importing torch
        name = str(t.dtype).replace("torch.", "")
        if "strided" not in str(getattr(t, "layout", "strided")):
            raise InputDtypeError(f"{what} is a {str(t.layout).replace('torch.', '')} tensor; the oracle "
                                  "takes dense tensors")
        if not t.is_floating_point() or "float8" in name:
            raise InputDtypeError(f"{what} must be a floating array (float64, float32, float16 or bfloat16), "
                                  f"got dtype {name}")
        arr = t.cpu().double().numpy()  # exact: every value of these formats is a float64
    elif isinstance(rewards, np.ndarray) and rewards.dtype.kind != "O":
        arr = rewards
        if arr.dtype.kind != "f":
            raise InputDtypeError(f"{what} must be a floating array, got dtype {arr.dtype}")
        if arr.dtype.itemsize > 8:  # longdouble: exact only where the values are float64s
            arr64 = arr.astype(np.float64)
            bad = np.argwhere((arr64.astype(arr.dtype) != arr) & ~np.isnan(arr))
            if bad.size:
                raise InputDtypeError(f"{what} {_where(bad[0], arr.ndim)} is {arr[tuple(bad[0])]!r} "
                                      f"({arr.dtype}), which float64 cannot hold exactly; the oracle takes "
                                      "its inputs exactly or refuses them")
            arr = arr64
    else:
        arr = _exact_sequence(rewards, what)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise ShapeError(f"{what} must be (N, K) or (N,), got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ShapeError(f"{what} is empty (shape {arr.shape})")
    return arr.astype(np.float64)  # exact: every float16/32 value is a float64


def _where(pos, ndim: int) -> str:
    pos = [int(v) for v in pos]
    return f"row {pos[0]}, column {pos[1]}" if ndim == 2 else f"row {pos[0]}" if ndim == 1 else f"at {pos}"


def _exact_sequence(x, what: str) -> np.ndarray:
    """A (nested) sequence or object array of numbers as float64, each value exactly."""
    try:
        obj = np.asarray(x, dtype=object)
    except ValueError as e:
        raise ShapeError(f"{what} must be (N, K) or (N,): {e}") from None
    out = np.empty(obj.shape, dtype=np.float64)
    for pos, v in np.ndenumerate(obj):
        f = _exact_float(v)
        if f is None:
            if isinstance(v, (list, tuple)) or getattr(v, "ndim", 0):
                raise ShapeError(f"{what} must be (N, K) or (N,): rows of unequal length "
                                 f"({what} {_where(pos, obj.ndim)} is a sequence)")
            name = type(v).__name__
            bad = f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
            kind = ("a number float64 cannot hold exactly" if _is_real_number(v)
                    else "not a real number")
            raise InputDtypeError(f"{what} {_where(pos, obj.ndim)} is {shown(v)} ({bad}), {kind}; "
                                  "the oracle takes its inputs exactly or refuses them")
        out[pos] = f
    return out


def _is_real_number(v) -> bool:
    if isinstance(v, (bool, np.bool_, str, bytes, complex, np.complexfloating)):
        return False
    if hasattr(v, "detach") or getattr(v, "ndim", 0):
        return False  # a tensor, an array: never one number here
    try:
        float(v)
    except OverflowError:
        return True  # an int (or Fraction) beyond float64's range: a number, not a float64
    except (TypeError, ValueError, ArithmeticError):
        return False
    return True


def _exact_float(v):
    """``v`` as the float64 equal to it, or None (not a real number, or not a float64)."""
    if type(v) is float:
        return v
    if hasattr(v, "detach") and getattr(v, "ndim", None) == 0 and v.is_floating_point() \
            and "float8" not in str(v.dtype):
        return float(v.detach().cpu().double().item())  # a 0-d real tensor (as impl takes it): exact in float64
    if not _is_real_number(v):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    # Python compares a float with an int, Fraction or Decimal exactly
    return f if f == v or math.isnan(f) else None


def shown(v, limit: int = 40) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_labels(labels, n: int, what: str) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ShapeError(f"{what} must be a length-{n} vector of integer labels, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise InputDtypeError(f"{what} must hold integers, got dtype {arr.dtype}")
    return arr


def py(x):
    """A label or value as plain Python (so messages read ``group 3``, not ``np.int64(3)``)."""
    return x.item() if hasattr(x, "item") else x


def index(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Labels in order of first appearance, and each sample's position among them."""
    uniq, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return uniq[order], rank[inverse.reshape(-1)]


def members(index: np.ndarray, count: int) -> list[np.ndarray]:
    """The rows of each of ``count`` groups (or units), given each row's position ``index``."""
    order = np.argsort(index, kind="stable")
    bounds = np.searchsorted(index[order], np.arange(count + 1))
    return [order[bounds[i]:bounds[i + 1]] for i in range(count)]


def as_weights(weights, k: int) -> np.ndarray:
    """The weights as float64, each exactly as given, or a WeightError (as impl.gdpo)."""
    if weights is None:
        return np.ones(k)
    if isinstance(weights, (str, bytes, set, frozenset, collections.abc.Mapping)):
        raise WeightError(f"weights must be a 1-D sequence or tensor of real numbers, got {shown(weights)}")
    if hasattr(weights, "detach") and hasattr(weights, "cpu"):
        t = weights.detach().cpu()
        if t.dim() != 1 or t.is_complex() or "bool" in str(t.dtype):
            raise WeightError(f"weights must be a 1-D tensor of real numbers, got shape {tuple(t.shape)}, "
                              f"dtype {str(t.dtype).replace('torch.', '')}")
        items = (t.double() if t.is_floating_point() else t).tolist()  # floats exactly, ints as ints
    elif isinstance(weights, np.ndarray):
        if weights.dtype.kind not in "fiuO":
            raise WeightError(f"weights must be real numbers, got dtype {weights.dtype}")
        if weights.ndim != 1:
            raise WeightError(f"weights must have one entry per reward column ({k}), got shape {weights.shape}")
        items = list(weights)
    else:
        try:
            items = list(weights)
        except TypeError:
            raise WeightError(f"weights must be a 1-D sequence of real numbers, got {shown(weights)}") from None
    if len(items) != k:
        raise WeightError(f"weights must have one entry per reward column ({k}), got {len(items)}")
    out = np.empty(k)
    for i, v in enumerate(items):
        if not _is_real_number(v):
            raise WeightError(f"weights[{i}] (reward column {i}) is {shown(v)}, not a real number")
        f = _exact_float(v)
        if f is None:
            try:
                float(v)
                why = "a number float64 cannot hold exactly"
            except OverflowError:
                why = "beyond float64's range (|w| > 1.8e308)"
            raise WeightError(f"weights[{i}] (reward column {i}) is {why}: {shown(v)}")
        if not math.isfinite(f):
            raise WeightError(f"weight of column {i} is {f!r}; weights must be finite")
        out[i] = f
    if not np.any(out != 0):
        raise WeightError("all weights are zero: every advantage would be silently zero")
    return out


def as_eps(eps, *defaults: float) -> list[Fraction]:
    """A caller's eps as the exact rational of its float64, once per equation (None: each
    equation's ``defaults``, the convention's), or the contract's refusal, as impl.gdpo:
    InputDtypeError for what is not a real number, OutOfRangeError for NaN, an infinity or a
    negative eps."""
    if eps is None:
        return [Fraction(d) for d in defaults]
    if hasattr(eps, "detach") and hasattr(eps, "cpu"):
        t = eps.detach().cpu()
        if t.dim() != 0 or t.is_complex() or "bool" in str(t.dtype):
            raise InputDtypeError("eps must be a real number (an int, a float, a NumPy real scalar or a 0-d real "
                                  f"tensor); got a tensor of shape {tuple(t.shape)}, dtype "
                                  f"{str(t.dtype).replace('torch.', '')}")
        eps = t.item()
    if isinstance(eps, np.ndarray) and eps.ndim == 0 and eps.dtype.kind in "iuf":
        eps = eps[()]  # a 0-d NumPy array: its scalar, as impl takes it
    if isinstance(eps, (bool, np.bool_)) or getattr(eps, "ndim", 0) or not isinstance(eps, numbers.Real):
        raise InputDtypeError("eps must be a real number (an int, a float, a NumPy real scalar or a 0-d real "
                              f"tensor); got {shown(eps)} (a {type(eps).__name__})")
    try:
        value = float(eps)
    except OverflowError:
        raise OutOfRangeError("eps is an int beyond float64's range (|eps| > 1.8e308); eps must be finite "
                              "and >= 0") from None
    if not (math.isfinite(value) and value >= 0.0):
        raise OutOfRangeError(f"eps={value!r} must be finite and >= 0")
    return [Fraction(value + 0.0)] * len(defaults)


def check_finite(r: np.ndarray, group_labels: np.ndarray, gidx: np.ndarray, conv: Convention) -> np.ndarray:
    """Apply the convention's NaN rule; infinities are refused by every convention."""
    inf, nan = np.isinf(r), np.isnan(r)
    if inf.any() or (nan.any() and conv.nan == "error"):
        i, k = (int(v) for v in np.argwhere(inf if inf.any() else nan)[0])
        what = (f"{float(r[i, k])!r}: the oracle computes finite rewards only" if inf.any()
                else f"NaN (convention {conv.name!r} refuses non-finite rewards)")
        group = py(group_labels[gidx[i]])
        raise NonFiniteError(f"reward row {i}, column {k} (group {group!r}) is {what}")
    return np.where(nan, 0.0, r) if conv.nan == "zero_first" else r


def groups_of(n: int, group_ids, group_size) -> np.ndarray:
    """Eq. 4's groups as one label per sample, from exactly one of ``group_ids`` (labels) and
    ``group_size`` (contiguous groups of that many samples, as in impl.gdpo)."""
    if (group_ids is None) == (group_size is None):
        raise GroupError("pass exactly one of group_ids and group_size"
                         + (", not both" if group_ids is not None else " (got neither)"))
    if group_ids is not None:
        return group_ids
    if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral):
        raise GroupError(f"group_size must be an integer, got {shown(group_size)}")
    group_size = int(group_size)
    if group_size < 1 or n % group_size:
        raise GroupError(f"N={n} samples is not a positive multiple of group_size={group_size}")
    return np.repeat(np.arange(n // group_size, dtype=np.int64), group_size)


def units_of(n: int, unit_ids, segment_sizes):
    """Eq. 6's units as one label per sample, from ``unit_ids`` or ``segment_sizes``
    (consecutive counts, as in impl.gdpo; empty units hold no sample); neither: one unit."""
    if segment_sizes is None:
        return np.zeros(n, dtype=np.int64) if unit_ids is None else unit_ids
    if unit_ids is not None:
        raise SegmentError("pass at most one of unit_ids and segment_sizes")
    sizes = list(segment_sizes.tolist() if hasattr(segment_sizes, "tolist") else segment_sizes)
    if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 0 for s in sizes):
        raise SegmentError(f"segment_sizes must be non-negative integers, got {shown(sizes)}")
    if sum(sizes) != n:
        raise SegmentError(f"segment_sizes sum to {sum(sizes)} but there are {n} samples")
    return np.repeat(np.arange(len(sizes), dtype=np.int64), [int(s) for s in sizes])


def with_missing(conv: Convention, missing) -> Convention:
    """The convention a call computes: ``missing="refuse"`` keeps the convention's own NaN rule;
    ``missing="unscored"`` reads a NaN reward as not scored (``nan="nan_aware_unscored"``,
    spec/conventions.py), every other choice the convention's."""
    if type(missing) is not str or missing not in MISSING:
        raise InputDtypeError("missing must be 'refuse' (a NaN reward is refused, the default) or 'unscored' "
                              f"(a NaN reward is one its reward function did not score); got {shown(missing)}")
    return conv if missing == "refuse" else dataclasses.replace(conv, nan="nan_aware_unscored")


def token_weights(conv: Convention, token_counts, n: int):
    if conv.whiten != "per_token":
        if token_counts is not None:
            raise ShapeError(f"token_counts given but convention {conv.name!r} whitens per sample")
        return None
    if token_counts is None:
        raise ShapeError(f"convention {conv.name!r} whitens per token: token_counts is required")
    t = as_labels(token_counts, n, "token_counts")
    if np.any(t <= 0):
        raise ShapeError(f"token_counts must be positive; sample {int(np.flatnonzero(t <= 0)[0])} is not")
    return t

