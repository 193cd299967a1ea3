"""The exact GDPO reference: Eq. 4, Eq. 7 and Eq. 6, certified and correctly rounded.

Steps carry the names and keywords of ``impl.gdpo`` (``group_ids`` or ``group_size``,
``weights``, ``segment_sizes``, ``eps``; here also ``unit_ids``, ``convention``,
``token_counts``), so the exact and the fast version of one step read side by side and a
test can take ``getattr`` of either (tests/test_same_names.py):

* :func:`standardize_groups` (Eq. 4): z per group and reward column,
* :func:`combine` (Eq. 7): c = sum_k w_k z_k of given z, the exact dot product,
* :func:`normalize_rewards` (Eq. 4 + 7): c from the rewards,
* :func:`whiten` (Eq. 6): a per whitening unit,
* :func:`gdpo_advantages`: all three, with every intermediate stage attached.

Old names, kept for their callers (deprecated): ``advantages`` (gdpo_advantages),
``whiten_units(values, unit_ids)`` (whiten), and ``combine(rewards, group_ids, ...)``, which
was Eq. 4 + 7: detected by its second positional argument or its Eq. 4 keywords, it returns
normalize_rewards with a DeprecationWarning.

Inputs are floats taken exactly (or refused, never rounded: :func:`_as_float_matrix`), so
exact rationals; means, deviations and variances are exact, square roots live in exact
quadratic forms (:mod:`oracle.exact`), exact zeros and collapse are decided on those forms,
and every output is rounded once to each of float64, float32, float16 and bfloat16
(``Stage.rounded(out_dtype)``): spec/gdpo.md section 10. Each output also carries

* ``cond``: the first-order change of the output when every input (reward and weight)
  moves by one ulp, from the Jacobians of Eq. 4, 7 and 6 in closed form
  (:mod:`oracle.condition`), always an upper bound; ``cond_sharp`` (per output) says where
  it is that change itself, to within 2^-19; where no closed form applies, the error model's
  running bound with its rounding terms off, or Samuelson's cap at a zero std without a
  first order (spec/gdpo.md section 7, where the cases are listed);
* ``delta``: the error model's running bound (:mod:`spec.error_model`, units of u) for a
  correct float64 implementation; ``allowed(out_dtype)`` turns it into the absolute
  tolerance every comparison uses (spec/gdpo.md section 7).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import math
import numbers
import warnings
from fractions import Fraction

import numpy as np

from spec import error_model as em
from spec.constants import FLOAT64_UNIT_ROUNDOFF
from spec.conventions import Convention, get_convention
from spec.errors import (
    GroupError,
    process_state_error,
    InputDtypeError,
    NonFiniteError,
    OutOfRangeError,
    SegmentError,
    ShapeError,
    WeightError,
)
from oracle import condition as cn
from oracle import exact as ex

START_PREC = 96
MAX_PREC = 1 << 16


@dataclasses.dataclass
class Stage:
    """One stage's exact results, per output element."""

    float64: np.ndarray
    float32: np.ndarray
    exact_zero: np.ndarray
    #: the first-order change per one ulp of every input, an upper bound on it always
    #: (at least 5e-324; inf where none is representable), the change itself (to 2^-19)
    #: where ``cond_sharp``; at a zero std with no first order (eps = 0, skip_if_zero) or one
    #: beyond it, Samuelson's cap instead (module docstring)
    cond: np.ndarray
    delta: np.ndarray
    #: ``delta`` is in units of u * 2**frame (the combined stage is kept in the
    #: weights' frame so that huge weights cannot overflow its bound)
    frame: int = 0
    #: exact zeros the specification demands bit for bit (structural zeros:
    #: collapsed columns, groups cancelled by a pair of columns equal up to shift and
    #: sign, units of such groups); the other exact zeros are held to the error bound
    #: like any value
    required_zero: np.ndarray = None
    #: the exact values correctly rounded to float16 and bfloat16 (each once, from the
    #: exact value: never through float32 or float64), as float64 arrays
    float16: np.ndarray = None
    bfloat16: np.ndarray = None
    #: per element: ``cond`` is the first-order change itself, to 2^-19 relative (the
    #: closed form of :mod:`oracle.condition`, its evaluation error at most 2^-20 of it);
    #: False where ``cond`` is only an upper bound (the fallbacks; module docstring)
    cond_sharp: np.ndarray = None

    def allowed(self, out_dtype: str = "float64", unit_roundoff: float = FLOAT64_UNIT_ROUNDOFF) -> np.ndarray:
        """Absolute tolerance of a correct implementation's result, per element (any
        output format of ``spec.error_model.FORMATS``)."""
        return em.allowed_error(self.delta, self.float64, out_dtype, unit_roundoff, frame=self.frame)

    def reach(self, unit_roundoff: float = FLOAT64_UNIT_ROUNDOFF) -> np.ndarray:
        """|exact| + the error model's bound: the largest magnitude a correct float64
        result can have before its final cast."""
        return em.reach(self.delta, self.float64, unit_roundoff, frame=self.frame)

    def rounded(self, out_dtype: str) -> np.ndarray:
        """The exact values correctly rounded to ``out_dtype`` (float64, float32, float16,
        bfloat16), as float64; +-inf where the rounding overflows the format."""
        name = str(out_dtype).replace("torch.", "")
        if name not in ex.ROUNDED:
            raise ValueError(f"the oracle certifies roundings to {ex.ROUNDED}, not {out_dtype!r}")
        return getattr(self, name)

    def overflows(self, out_dtype: str) -> np.ndarray:
        """Per element: the exact value does not survive a correct cast to ``out_dtype``
        (its rounding is infinite): the contract refuses it (OutOfRangeError)."""
        return ~np.isfinite(self.rounded(out_dtype)) & np.isfinite(self.float64)


@dataclasses.dataclass
class Result(Stage):
    """Advantages (Eq. 6) with the intermediate stages and the collapse decisions."""

    z: Stage = None
    combined: Stage = None
    group_labels: np.ndarray = None
    group_index: np.ndarray = None
    group_collapsed: np.ndarray = None  # (G, K): column constant within the group
    group_cancelled: np.ndarray = None  # (G,): combined values of the group exactly zero
    unit_labels: np.ndarray = None
    unit_index: np.ndarray = None
    unit_collapsed: np.ndarray = None  # (S,): combined values of the unit exactly equal
    convention: Convention = None


def _stagewise_up(cond, m, keep=None):
    """The stage-wise condition bound made an upper bound on the change it bounds despite
    its own float64 evaluation (rounded to nearest, flushed among the subnormals): times
    1 + (m + 2) u, m the roundings along any of its terms (module docstring, ``cond``), and
    at least 2^-1074 (a final flush loses at most 2^-1075). NaN and inf stay, and so does
    ``keep`` (a zero std's cond, Samuelson's cap: a bound on the change itself, not a
    first-order quantity evaluated in float64)."""
    cond = np.asarray(cond, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        up = np.maximum(cond * (1.0 + (m + 2) * FLOAT64_UNIT_ROUNDOFF), 5e-324)
    if keep is not None:
        up = np.where(keep, cond, up)
    return np.where(np.isnan(cond), cond, up)


def _floor_cond(cond):
    """cond at least 2^-1074 wherever it is not NaN: a first-order change below float64's
    range still bounds as 5e-324 (an upper bound stays one)."""
    cond = np.asarray(cond, dtype=np.float64)
    return np.where(np.isnan(cond), cond, np.maximum(cond, 5e-324))


def _stage(rounded: dict, zero, cond, delta, frame=0, required_zero=None, sharp=None) -> Stage:
    """A Stage from a {format: values} dict of certified roundings."""
    cond = _floor_cond(cond)
    return Stage(rounded["float64"], rounded["float32"], zero, cond, delta, frame, required_zero,
                 float16=rounded["float16"], bfloat16=rounded["bfloat16"],
                 cond_sharp=np.zeros(np.shape(cond), bool) if sharp is None else sharp)


def _rounded_arrays(shape) -> dict:
    return {fmt: np.zeros(shape) for fmt in ex.ROUNDED}


# ------------------------------------------------------------------ input checks


def _as_float_matrix(rewards, what: str = "rewards") -> np.ndarray:
    """The inputs as a float64 matrix, every value exactly as given, or a refusal: the oracle
    never rounds an input (a rounded input would decide zeros and collapse for another one).

    Tensors of a floating dtype (float64, float32, float16, bfloat16: each a float64 exactly)
    and NumPy floating arrays are read whole; an extended-precision array (longdouble) and a
    sequence of numbers are read value by value, and a value float64 cannot hold exactly (an
    int beyond 2^53, a longdouble's extra bits, a Fraction or Decimal that is no float) is
    refused with InputDtypeError naming its row and column, like an integer, bool, complex
    or float8 dtype."""
    if hasattr(rewards, "detach") and hasattr(rewards, "cpu") and not isinstance(rewards, np.ndarray):
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
            raise InputDtypeError(f"{what} {_where(pos, obj.ndim)} is {_shown(v)} ({bad}), {kind}; "
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
    if math.isnan(f):
        return f
    return f if f == v else None  # Python compares a float with an int, Fraction or Decimal exactly


def _shown(v, limit: int = 40) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _as_labels(labels, n: int, what: str) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ShapeError(f"{what} must be a length-{n} vector of integer labels, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise InputDtypeError(f"{what} must hold integers, got dtype {arr.dtype}")
    return arr


def _py(x):
    """A label or value as plain Python (so messages read ``group 3``, not ``np.int64(3)``)."""
    return x.item() if hasattr(x, "item") else x


def _index(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Labels in order of first appearance, and each sample's position among them."""
    uniq, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return uniq[order], rank[inverse.reshape(-1)]


def _as_weights(weights, k: int) -> np.ndarray:
    """The weights as float64, each exactly as given, or a WeightError (as impl.gdpo: a
    sequence or tensor of real numbers, one per reward column, finite, not all zero, each
    one a number float64 holds exactly)."""
    if weights is None:
        return np.ones(k)
    if isinstance(weights, (str, bytes, dict, set, frozenset)) or _is_mapping(weights):
        raise WeightError(f"weights must be a 1-D sequence or tensor of real numbers, got {_shown(weights)}")
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
            raise WeightError(f"weights must be a 1-D sequence of real numbers, got {_shown(weights)}") from None
    if len(items) != k:
        raise WeightError(f"weights must have one entry per reward column ({k}), got {len(items)}")
    out = np.empty(k)
    for i, v in enumerate(items):
        if not _is_real_number(v):
            raise WeightError(f"weights[{i}] (reward column {i}) is {_shown(v)}, not a real number")
        f = _exact_float(v)
        if f is None:
            try:
                float(v)
                why = "a number float64 cannot hold exactly"
            except OverflowError:
                why = "beyond float64's range (|w| > 1.8e308)"
            raise WeightError(f"weights[{i}] (reward column {i}) is {why}: {_shown(v)}")
        if not math.isfinite(f):
            raise WeightError(f"weight of column {i} is {f!r}; weights must be finite")
        out[i] = f
    if not np.any(out != 0):
        raise WeightError("all weights are zero: every advantage would be silently zero")
    return out


def _is_mapping(x) -> bool:
    return isinstance(x, collections.abc.Mapping)


def _as_eps(eps):
    """A caller's eps as a float64 (None: the convention's), or the contract's refusal, as
    impl.gdpo: InputDtypeError for what is not a real number (a str, a bool, a complex
    number, a sequence), OutOfRangeError for NaN, an infinity or a negative eps."""
    if eps is None:
        return None
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
                              f"tensor); got {_shown(eps)} (a {type(eps).__name__})")
    try:
        value = float(eps)
    except OverflowError:
        raise OutOfRangeError("eps is an int beyond float64's range (|eps| > 1.8e308); eps must be finite "
                              "and >= 0") from None
    if not (math.isfinite(value) and value >= 0.0):
        raise OutOfRangeError(f"eps={value!r} must be finite and >= 0")
    return value + 0.0


def _check_finite(r: np.ndarray, group_labels: np.ndarray, gidx: np.ndarray, conv: Convention) -> np.ndarray:
    """Apply the convention's NaN rule; infinities are refused by every convention."""
    inf = np.argwhere(np.isinf(r))
    if inf.size:
        i, k = (int(v) for v in inf[0])
        raise NonFiniteError(
            f"reward row {i}, column {k} (group {_py(group_labels[gidx[i]])!r}) is {float(r[i, k])!r}: "
            "the oracle computes finite rewards only"
        )
    nan = np.isnan(r)
    if nan.any():
        if conv.nan == "error":
            i, k = (int(v) for v in np.argwhere(nan)[0])
            raise NonFiniteError(
                f"reward row {i}, column {k} (group {_py(group_labels[gidx[i]])!r}) is NaN "
                f"(convention {conv.name!r} refuses non-finite rewards)"
            )
        if conv.nan == "zero_first":
            r = np.where(nan, 0.0, r)
    return r


# --------------------------------------------------------------- Eq. 4 per column


def _int_repr(vals: list[float]) -> tuple[list[int], int]:
    """Integers M and exponent E with vals[j] == M[j] * 2**E exactly."""
    pairs = [v.as_integer_ratio() for v in vals]
    exps = [-(d.bit_length() - 1) for _, d in pairs]  # denominators are powers of two
    E = min(exps)
    return [n << (e - E) for (n, _), e in zip(pairs, exps)], E


class _Column:
    """Exact Eq. 4 for one group column: z_j = (D_j * f) * inv, inv = 1/denominator."""

    __slots__ = ("n", "D", "f", "inv", "collapsed", "nan", "valid", "raw", "V", "rho", "E")

    def inverse_interval(self, classes, prec):
        return ex.iv_form(self.inv, classes, prec)


def _column(vals: np.ndarray, conv: Convention, eps_g: Fraction, classes: ex.SqrtClasses, label, k) -> _Column:
    col = _Column()
    col.raw = None
    col.nan = False
    valid = ~np.isnan(vals)
    if not valid.all() and conv.nan == "propagate":
        col.nan = True
        col.n = vals.size
        return col
    col.valid = valid
    use = vals[valid].tolist()
    n = len(use)
    col.n = n
    if n < 2 and conv.group_ddof == 1 or n == 0:
        if conv.nan in ("nan_aware", "nan_aware_unscored") and vals.size >= 2:
            n_rule = "zero"  # nanstd of fewer than two values is NaN, later replaced by 0
        else:
            n_rule = conv.singleton
        if n_rule == "error":
            raise GroupError(
                f"group {_py(label)!r} has {vals.size} sample(s); the unbiased std of Eq. 4 needs at least 2"
            )
        col.collapsed = True
        col.D = [0] * n
        col.f = Fraction(0)
        col.inv = ex.Form()
        col.V = Fraction(0)
        col.rho = 0
        col.E = 0
        if n_rule == "raw" and n == 1:  # mean 0, std 1: z = r / (1 + eps)
            M, E = _int_repr(use)
            col.D = M
            col.E = E
            col.f = Fraction(2) ** E if E >= 0 else Fraction(1, 2 ** -E)
            col.inv = ex.Form(1 / (1 + eps_g))
            col.collapsed = M[0] == 0
            col.raw = True
        return col
    M, E = _int_repr(use)
    S = sum(M)
    D = [n * m - S for m in M]
    col.D = D
    col.E = E
    scale = Fraction(2) ** E if E >= 0 else Fraction(1, 2 ** -E)
    col.f = scale / n
    col.rho = max(M) - min(M)  # the range is rho * 2^E (kept as an integer: it may exceed float64)
    ss = sum(d * d for d in D)
    V = Fraction(ss, n * n * (n - conv.group_ddof)) * scale * scale
    col.V = V
    col.collapsed = ss == 0
    if col.collapsed:
        col.inv = ex.Form()
        return col
    col.inv = _inverse_denominator(V, eps_g, conv.group_eps_placement, classes)
    return col


def _inverse_denominator(V: Fraction, eps: Fraction, placement: str, classes: ex.SqrtClasses) -> ex.Form:
    """Exact form of 1 / D for D = sqrt(V) + eps, sqrt(V + eps) or sqrt(V) (V > 0)."""
    if placement in ("std", "std_if_positive"):
        sq = classes.sqrt(V)
        if not sq.terms:
            return ex.Form(1 / (sq.q0 + eps))
        den = V - eps * eps  # nonzero: V is not a rational square, eps^2 is
        (cid, p), = sq.terms.items()
        return ex.Form(-eps / den, {cid: p / den})
    if placement == "var":
        W = V + eps
        return classes.sqrt(W).scaled(1 / W)
    return classes.sqrt(V).scaled(1 / V)  # skip_if_zero: no eps


def _interval_of_z(col: _Column, j: int, scaled_inv_iv, prec):
    """z_j = D_j * (f * inv): an integer times a precomputed interval."""
    return ex.iv_scale_int(scaled_inv_iv, col.D[j], prec)


# ----------------------------------------------------------------- public steps


def _group_labels(n: int, group_ids, group_size) -> np.ndarray:
    """Eq. 4's groups as one label per sample, from exactly one of ``group_ids`` (labels) and
    ``group_size`` (contiguous groups of that many samples, as in impl.gdpo)."""
    if (group_ids is None) == (group_size is None):
        raise GroupError("pass exactly one of group_ids and group_size"
                         + (", not both" if group_ids is not None else " (got neither)"))
    if group_ids is not None:
        return group_ids
    if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral):
        raise GroupError(f"group_size must be an integer, got {_shown(group_size)}")
    group_size = int(group_size)
    if group_size < 1 or n % group_size:
        raise GroupError(f"N={n} samples is not a positive multiple of group_size={group_size}")
    return np.repeat(np.arange(n // group_size, dtype=np.int64), group_size)


def _unit_labels(n: int, unit_ids, segment_sizes):
    """Eq. 6's units as one label per sample (None: one unit), from ``unit_ids`` or
    ``segment_sizes`` (consecutive counts, as in impl.gdpo; empty units hold no sample)."""
    if segment_sizes is None:
        return unit_ids
    if unit_ids is not None:
        raise SegmentError("pass at most one of unit_ids and segment_sizes")
    sizes = list(segment_sizes.tolist() if hasattr(segment_sizes, "tolist") else segment_sizes)
    if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 0 for s in sizes):
        raise SegmentError(f"segment_sizes must be non-negative integers, got {_shown(sizes)}")
    if sum(sizes) != n:
        raise SegmentError(f"segment_sizes sum to {sum(sizes)} but there are {n} samples")
    return np.repeat(np.arange(len(sizes), dtype=np.int64), [int(s) for s in sizes])


#: The ``missing`` policies, as in impl.gdpo (spec/gdpo.md section 2).
MISSING = ("refuse", "unscored")


def _whatever_numpy_is_told(fn):
    """The oracle's public steps compute the same in any NumPy error state of the caller's process
    (``np.seterr(all="raise")`` turned an expected underflow of the error bound into a
    FloatingPointError): every non-finite or underflowing value it meets is decided explicitly.
    Where the thread flushes subnormals, they refuse (spec.errors.process_state_error)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        refused = process_state_error()
        if refused is not None:
            raise refused
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)
    return wrapper


def _with_missing(conv: Convention, missing) -> Convention:
    """The convention a call computes: ``missing="refuse"`` keeps the convention's own NaN
    rule (``spec``: a NaN reward is refused); ``missing="unscored"`` reads a NaN reward as
    one its reward function did not score (``nan="nan_aware_unscored"``: left out of its
    group column's Eq. 4 statistics with z = 0 there, a column with fewer than two scored
    members z = 0 throughout, a row with no scored reward advantage 0 and out of Eq. 6, a
    unit with fewer than two scored rows 0 throughout), every other choice the convention's."""
    if type(missing) is not str or missing not in MISSING:
        raise InputDtypeError("missing must be 'refuse' (a NaN reward is refused, the default) or 'unscored' "
                              f"(a NaN reward is one its reward function did not score); got {_shown(missing)}")
    return conv if missing == "refuse" else dataclasses.replace(conv, nan="nan_aware_unscored")


@_whatever_numpy_is_told
def standardize_groups(rewards, group_ids=None, eps=None, convention="spec", *, group_size=None,
                       missing="refuse") -> Stage:
    """Eq. 4 alone: z per sample and reward column (weights ones, no whitening)."""
    r = _as_float_matrix(rewards)
    res = gdpo_advantages(r, _group_labels(r.shape[0], group_ids, group_size), weights=None, unit_ids=None,
                          eps=eps, convention=convention, missing=missing, _stages_only=True)
    return res.z


@_whatever_numpy_is_told
def normalize_rewards(rewards, group_ids=None, weights=None, eps=None, convention="spec", *,
                      group_size=None, missing="refuse") -> Stage:
    """Eq. 4 then Eq. 7: the combined value c per sample (before 2026-12: ``combine``)."""
    r = _as_float_matrix(rewards)
    res = gdpo_advantages(r, _group_labels(r.shape[0], group_ids, group_size), weights=weights, unit_ids=None,
                          eps=eps, convention=convention, missing=missing, _stages_only=True)
    return res.combined


_OLD_COMBINE = ("group_ids", "group_size", "eps", "convention")


@_whatever_numpy_is_told
def combine(z, *old_args, weights=None, **old_kwargs) -> Stage:
    """Eq. 7 alone: c_j = sum_k w_k z_jk of given floats z (N, K) or (N,) and weights (K,),
    each taken as the exact rational it is: the exact sum, correctly rounded once to each format.

    ``delta`` is the error model's Eq. 7 bound (``spec.error_model.combine_stage_framed`` with
    Δz = 0: the inputs are exact) for a correct float64 implementation; ``cond`` the first-order
    change when every z and weight moves by one ulp. No zero is structural here
    (``required_zero`` all False): an exact zero is held to the bound like any value.

    Deprecated: ``combine(rewards, group_ids, weights=...)`` (and any call naming
    ``group_ids``, ``group_size``, ``eps`` or ``convention``) was Eq. 4 + 7; it still
    returns :func:`normalize_rewards`, with a DeprecationWarning.
    """
    if old_args or set(old_kwargs) & set(_OLD_COMBINE):
        unknown = set(old_kwargs) - set(_OLD_COMBINE)
        if unknown:
            raise TypeError(f"combine() got unexpected keyword arguments {sorted(unknown)}")
        warnings.warn("oracle.gdpo.combine(rewards, group_ids, ...) is Eq. 4 + 7: call normalize_rewards; "
                      "combine(z, weights=...) is Eq. 7 alone", DeprecationWarning, stacklevel=2)
        return normalize_rewards(z, *old_args, weights=weights, **old_kwargs)
    if old_kwargs:
        raise TypeError(f"combine() got unexpected keyword arguments {sorted(old_kwargs)}")
    v = _as_float_matrix(z, "z")
    n, k = v.shape
    if not np.all(np.isfinite(v)):
        i, j = (int(x[0]) for x in np.nonzero(~np.isfinite(v)))
        raise NonFiniteError(f"z[{i}, {j}] (row {i}, reward column {j}) is {v[i, j]!r}; Eq. 7 needs finite values")
    w = _as_weights(weights, k)
    wq = [Fraction(x) for x in w.tolist()]
    rounded = _rounded_arrays(n)
    zero = np.zeros(n, bool)
    for j in range(n):
        c = sum((wk * Fraction(x) for wk, x in zip(wq, v[j].tolist())), Fraction(0))
        _put(rounded, j, ex.round_all_fraction(c))
        zero[j] = c == 0
    delta, frame = em.combine_stage_framed(np.zeros((n, k)), v, w)
    # one ulp of every input, absolute (np.spacing(DBL_MAX) is inf): the first-order change
    # of a sum of products is the sum of |w| ulp(z) + |z| ulp(w), evaluated here in float64
    mz, xz = np.frexp(np.abs(v))
    mw, xw = np.frexp(np.abs(w))
    dcond, cframe = em.combine_stage_framed(np.maximum(np.ldexp(np.spacing(mz), xz), 5e-324), v, w,
                                            d_weights=np.maximum(np.ldexp(np.spacing(mw), xw), 5e-324),
                                            rounding=False)
    with np.errstate(over="ignore"):
        cond = _stagewise_up(np.ldexp(dcond, cframe), 2 * k + 2)
    return _stage(rounded, zero, cond, delta, frame=frame, required_zero=np.zeros(n, bool))


@_whatever_numpy_is_told
def whiten(values, *, segment_sizes=None, unit_ids=None, eps=None, convention="spec", token_counts=None) -> Stage:
    """Eq. 6 alone on given float values (exact rationals), per unit: ``segment_sizes``
    (consecutive counts, as in impl.gdpo) or ``unit_ids`` (a label per sample); neither: one unit."""
    return whiten_units(values, _unit_labels(np.shape(values)[0] if np.ndim(values) else 0, unit_ids,
                                             segment_sizes), eps=eps, convention=convention,
                        token_counts=token_counts)


@_whatever_numpy_is_told
def whiten_units(values, unit_ids=None, eps=None, convention="spec", token_counts=None) -> Stage:
    """Eq. 6 by unit labels: the old name of :func:`whiten` (deprecated; kept for its callers)."""
    conv = get_convention(convention)
    v = _as_float_matrix(values, "values")
    if v.shape[1] != 1:
        raise ShapeError(f"values must be a vector, got shape {v.shape}")
    v = v[:, 0]
    if not np.all(np.isfinite(v)):
        i = int(np.flatnonzero(~np.isfinite(v))[0])
        raise NonFiniteError(f"value {i} is {v[i]!r}; whitening needs finite values")
    n = v.size
    unit_ids = np.zeros(n, dtype=np.int64) if unit_ids is None else _as_labels(unit_ids, n, "unit_ids")
    t = _token_weights(conv, token_counts, n)
    eps = _as_eps(eps)
    eps_w = Fraction(conv.whiten_eps if eps is None else eps)
    forms = [ex.Form(Fraction(x)) for x in v.tolist()]
    classes = ex.SqrtClasses()
    uidx = _index(unit_ids)[1]
    # the inputs are exact: only the algorithm's rounding (model) and one ulp (cond) move them
    mv, xv = np.frexp(np.abs(v))  # one ulp of each value, absolute (np.spacing(DBL_MAX) is inf)
    cond = np.maximum(np.ldexp(np.spacing(mv), xv), 5e-324)
    zeros = np.zeros(n, dtype=np.int64)
    # equal input floats are equal bit for bit, so every collapse of given values is structural
    uinfo = _unit_info(int(uidx.max()) + 1)
    ar, azero, acond, adelta, ucoll, areq = _whiten(forms, np.zeros(n, bool), v, cond, zeros, np.zeros(n), zeros,
                                                uidx, t, conv, eps_w, classes, np.ones(n, bool), uinfo=uinfo)
    sharp = np.zeros(n, bool)
    capped = ucoll[uidx] if conv.whiten_eps_placement != "skip_if_zero" else None  # skip: a = c
    acond = _stagewise_up(acond, _m_whiten(_members(uidx, uidx.max() + 1)), keep=capped)
    if conv.whiten == "per_sample":  # the tight first-order change where a closed form applies
        acond, sharp = cn.whiten_values(v, ar["float64"], _members(uidx, uidx.max() + 1), uinfo,
                                        conv.whiten_eps_placement, float(eps_w), acond)
    return _stage(ar, azero, acond, adelta, required_zero=areq, sharp=sharp)


def _token_weights(conv: Convention, token_counts, n: int):
    if conv.whiten != "per_token":
        if token_counts is not None:
            raise ShapeError(f"token_counts given but convention {conv.name!r} whitens per sample")
        return None
    if token_counts is None:
        raise ShapeError(f"convention {conv.name!r} whitens per token: token_counts is required")
    t = _as_labels(token_counts, n, "token_counts")
    if np.any(t <= 0):
        raise ShapeError(f"token_counts must be positive; sample {int(np.flatnonzero(t <= 0)[0])} is not")
    return t


@_whatever_numpy_is_told
def gdpo_advantages(rewards, group_ids=None, weights=None, unit_ids=None, eps=None, convention="spec",
                    token_counts=None, *, group_size=None, segment_sizes=None, missing="refuse",
                    _stages_only=False) -> Result:
    """Exact GDPO advantages of ``rewards`` (N, K) grouped by ``group_ids`` or ``group_size``.

    ``unit_ids`` (a label per sample) or ``segment_sizes`` (consecutive counts) give the
    whitening units (neither: one unit); ``eps`` overrides both eps of the convention
    (None: the convention's own, 1e-4 for ``spec``); ``token_counts`` is required by
    per-token conventions (verl). ``missing``: "refuse" (the convention's own NaN rule;
    ``spec`` refuses a NaN) or "unscored" (a NaN reward was not scored: :func:`_with_missing`;
    a unit of one row is still a SegmentError, whatever is scored in it).
    """
    conv = _with_missing(get_convention(convention), missing)
    r = _as_float_matrix(rewards)
    N, K = r.shape
    gl, gidx = _index(_as_labels(_group_labels(N, group_ids, group_size), N, "group_ids"))
    w = _as_weights(weights, K)
    unit_ids = _unit_labels(N, unit_ids, segment_sizes)
    uid = np.zeros(N, dtype=np.int64) if unit_ids is None else _as_labels(unit_ids, N, "unit_ids")
    t = None if _stages_only else _token_weights(conv, token_counts, N)
    nan_in = np.isnan(r)  # before a NaN policy replaces any (cond falls back on such columns)
    r = _check_finite(r, gl, gidx, conv)
    eps = _as_eps(eps)
    eps_g = Fraction(conv.group_eps if eps is None else eps)
    eps_w = Fraction(conv.whiten_eps if eps is None else eps)
    wq = [Fraction(x) for x in w.tolist()]
    classes = ex.SqrtClasses()

    G = gl.size
    zr = _rounded_arrays((N, K)); zzero = np.zeros((N, K), bool)
    zcond = np.zeros((N, K)); zdelta = np.zeros((N, K))
    cr = _rounded_arrays(N); czero = np.zeros(N, bool)
    ccond = np.zeros(N); cdelta = np.zeros(N)
    cforms: list = [None] * N
    cnan = np.zeros(N, bool)
    collapsed = np.zeros((G, K), bool)
    cancelled = np.zeros(G, bool)
    zreq = np.zeros((N, K), bool)
    creq = np.zeros(N, bool)
    # c's sensitivities are kept per sample in a frame of their own (Δc_j = cdelta_j 2^cframe_j,
    # spec.error_model.combine_stage_framed): one frame for the batch, the largest weight's,
    # flushed the bound of a sample whose live weights are 2^1074 below it to zero
    cframe = np.zeros(N, dtype=np.int64); ccframe = np.zeros(N, dtype=np.int64)
    mw, xw = np.frexp(np.abs(w))  # one ulp of each weight, absolute (np.spacing(DBL_MAX) is inf)
    dws = np.maximum(np.ldexp(np.spacing(mw), xw), 5e-324)
    members = _members(gidx, G)
    colinfo = {"frame": np.zeros((G, K), dtype=np.int64), "sigma": np.zeros((G, K)), "denom": np.ones((G, K)),
               "ok": np.zeros((G, K), bool), "collapsed": np.zeros((G, K), bool), "cap": np.full((G, K), math.inf)}
    for g in range(G):
        idx = members[g]
        cols = [_column(r[idx, k], conv, eps_g, classes, gl[g], k) for k in range(K)]
        collapsed[g] = [c.nan is False and c.collapsed for c in cols]
        _group_numbers(idx, cols, r, wq, w, dws, conv, eps_g, classes,
                       zr, zzero, zcond, zdelta, cr, czero, ccond, cdelta, cframe, ccframe, cforms, cnan,
                       info=(g, colinfo))
        cancelled[g] = bool(np.all(czero[idx]))
        if conv.algorithm == "shift_invariant":  # a code subtracting a rounded mean reproduces no zero bit
            zreq[idx] = collapsed[g]               # for bit (a constant column's mean leaves a residue):
            creq[idx] = _structural_zero(cols, wq, cancelled[g])  # its zeros are held to its bound

    # ccond/cdelta hold c's sensitivities in per-sample frames (2^ccframe, 2^cframe) so they cannot overflow
    with np.errstate(over="ignore"):
        ccond_abs = np.ldexp(ccond, ccframe)
    # the tight first-order change (oracle.condition) where a closed form applies; the
    # stage-wise bound above (raised for its own rounding) where none does
    zc = cn.group_columns(r, zr["float64"], members, colinfo, conv.group_eps_placement, float(eps_g), nan_in)
    m_z = _m_group(members)
    m_c = m_z + 2 * K + 8
    zcond_t, zsharp = cn.finish(zc.T, zc.E, zc.x, zc.ok, _stagewise_up(zcond, m_z, keep=collapsed[gidx]))
    ccond_t, csharp, cok = cn.combined(zc, zr["float64"], w, _stagewise_up(ccond_abs, m_c))
    zstage = _stage(zr, zzero, zcond_t, zdelta, required_zero=zreq, sharp=zsharp)
    cstage = _stage(cr, czero, ccond_t, cdelta, frame=cframe, required_zero=creq, sharp=csharp)
    ul, uidx = _index(uid)
    if _stages_only:
        a = cstage
        ucoll = np.zeros(ul.size, bool)
    else:
        uinfo = _unit_info(ul.size)
        if missing == "unscored":  # the metadata rule holds whatever is scored: a unit of one row is refused
            rows = np.bincount(uidx, minlength=ul.size)
            if conv.whiten != "none" and np.any(rows == 1):
                s = int(np.flatnonzero(rows == 1)[0])
                raise SegmentError(f"whitening unit {_py(ul[s])!r} has 1 sample(s); "
                                   "the unbiased std of Eq. 6 needs at least 2")
        if conv.nan == "nan_aware_unscored" and nan_in.all(axis=1).any():
            ar, azero, acond, adelta, ucoll, areq = _whiten_scored(
                nan_in.all(axis=1), cforms, cnan, cr["float64"], ccond, ccframe, cdelta, cframe,
                uidx, t, conv, eps_w, classes, creq, ul,
                whole=_units_of_whole_groups(gidx, uidx, G, ul.size) if _structural_mean(conv) else None)
            uinfo = None
        else:
            ar, azero, acond, adelta, ucoll, areq = _whiten(
                cforms, cnan, cr["float64"], ccond, ccframe, cdelta, cframe,
                uidx, t, conv, eps_w, classes, creq, labels=ul, uinfo=uinfo,
                whole=_units_of_whole_groups(gidx, uidx, G, ul.size) if _structural_mean(conv) else None)
        capped = ucoll[uidx] if conv.whiten_eps_placement != "skip_if_zero" else None  # skip: a = c
        acond = _stagewise_up(acond, m_c + _m_whiten(_members(uidx, ul.size)), keep=capped)
        if conv.whiten == "none":  # a = c
            acond, asharp = ccond_t.copy(), csharp.copy()
        elif uinfo is None:  # unscored samples left out of Eq. 6: the stage-wise bound
            asharp = np.zeros(N, bool)
        elif conv.whiten == "per_sample":
            acond, asharp = cn.whitened(zc, cok, zr["float64"], ar["float64"], w, gidx, members, uidx, uinfo,
                                        conv.whiten_eps_placement, float(eps_w), acond)
        else:  # per token: the stage-wise bound
            asharp = np.zeros(N, bool)
        a = _stage(ar, azero, acond, adelta, required_zero=areq, sharp=asharp)
    return Result(a.float64, a.float32, a.exact_zero, a.cond, a.delta, a.frame, a.required_zero,
                  float16=a.float16, bfloat16=a.bfloat16, cond_sharp=a.cond_sharp, z=zstage, combined=cstage,
                  group_labels=gl, group_index=gidx, group_collapsed=collapsed, group_cancelled=cancelled,
                  unit_labels=ul, unit_index=uidx, unit_collapsed=ucoll, convention=conv)


#: The old name of :func:`gdpo_advantages` (deprecated; kept for its callers).
advantages = gdpo_advantages


def _scaled_values(forms, nan, values: np.ndarray, e: int, classes) -> np.ndarray:
    """values * 2^-e as floats; where a value overflowed float64 or was subnormal there (rounded
    to 0 or to fewer bits), from its exact form."""
    with np.errstate(over="ignore"):
        out = np.ldexp(values, -e)
    redo = ~nan & (~np.isfinite(out) | (np.abs(values) < 2.0 ** -1022))
    for j in np.flatnonzero(redo):
        if forms[j].is_zero():
            continue
        out[j] = ex.round_mpf(ex.iv_form(forms[j].scaled(_pow2(-e)), classes, 80)[0], "float64")
    return out


def _top_exponent(forms, nan, values: np.ndarray, classes):
    """The largest binary exponent (|c| < 2^e) over one unit's exact c, None when all are
    exactly zero; from the exact form where the float64 rounded to 0 or overflowed."""
    e = None
    for j in np.flatnonzero(~nan):
        x = values[j]
        if x != 0.0 and math.isfinite(x):
            ej = math.frexp(x)[1]
        elif forms[j].is_zero():
            continue
        else:
            ej = max(int(exp) + int(bc) for _, man, exp, bc in ex.iv_form(forms[j], classes, 80) if man)
        e = ej if e is None else max(e, ej)
    return e


def _unit_frame(c_top, nan, delta: np.ndarray, dframe: np.ndarray, floor: int = -900) -> int:
    """The power-of-two frame of one unit's Eq. 6 bound: its largest exact |c| (``c_top``)
    brought to [1/2, 1), raised where a sample's Δc (``delta * 2^dframe``) would exceed 2^960
    in it (values 2^1000 below that Δc are negligible beside it; the condition estimate gets a
    frame of its own, so that its sizes never flush the model's); clamped below at ``floor``
    (:func:`_eps_floor`) so that eps measured in it, and so the denominator, stays finite."""
    live = ~nan & (delta != 0.0) & np.isfinite(delta)
    top = int((dframe[live] + np.frexp(delta[live])[1]).max()) if live.any() else None
    if c_top is None:
        e = top if top is not None else 0
    else:
        e = c_top if top is None else max(c_top, top - 960)
    return max(e, floor)


def _eps_floor(eps: Fraction, placement: str) -> int:
    """The lowest frame 2^f of an Eq. 6 bound, or of an Eq. 4 bound (group column): -900,
    raised where eps's share of the denominator (eps 2^-f added to the std; sqrt(eps) 2^-f,
    eps 2^-2f added to the variance) would exceed 2^960 in it; with eps = 1e-8 or 1e-4 it
    never is (eps below 2^60 added to the std, below 2^120 to the variance).

    Eq. 6: where the floor lifts the frame above a unit's largest |c|, the denominator
    there is at least 2^959, and a c, deviation or product below 2^-1074 there may flush
    to 0: such a term enters Δa divided by that denominator, or times an |a_j| (below
    2^-2000 where its deviation flushed), far below the model's own underflow term 3 τ.

    Eq. 4: where it lifts a column's frame (:func:`_frame`, above the column's range), the
    denominator there is again at least 2^959 and every deviation below 1, so |z| < 2^-959;
    a deviation, std, τ 2^-f or input ulp that flushes to 0 there enters Δz divided by that
    denominator (or times |z|): below 2^-2000. A range that flushes is kept at 2^-1074 there
    (an upper bound), so that the model never takes a live column for a collapsed one."""
    if eps <= 0 or placement == "skip_if_zero":
        return -900
    x = math.frexp(float(eps))[1]  # eps < 2^x (eps is a float: exact)
    top = -(-x // 2) if placement == "var" else x  # sqrt(eps) < 2^ceil(x/2)
    return max(-900, top - 960)


def _m_group(members) -> int:
    """Roundings along any term of Eq. 4's stage-wise bound (:func:`spec.error_model.group_stage`,
    ``rounding=False``) for groups of at most n samples: the mean of the ulps n, d_dev n + 1, a
    deviation 1, their products and sum 2n, the std's product and quotient 4 (sigma within 2),
    z times it and the sum and quotient by the denominator (within 3) 6: 3n + 12; counted as
    4n + 40."""
    return 4 * max((m.size for m in members), default=1) + 40


def _m_whiten(members) -> int:
    """Roundings added along any term by Eq. 6's stage-wise bound (:func:`spec.error_model.
    whiten_stage`, ``rounding=False``) for units of at most M samples (token weights add one
    product each): d_mean M + 1, d_dev2 1, a deviation |c - mean| 3, products and the sum
    2M + 1, the std's product and quotient 4, the final terms 6: 3M + 16; counted as 4M + 40."""
    return 4 * max((m.size for m in members), default=1) + 40


def _members(index: np.ndarray, count: int) -> list[np.ndarray]:
    order = np.argsort(index, kind="stable")
    bounds = np.searchsorted(index[order], np.arange(count + 1))
    return [order[bounds[i]:bounds[i + 1]] for i in range(count)]


def _frame(col: _Column, vals: np.ndarray) -> int:
    """Power-of-two exponent that brings the column's spread (or its ulps) to O(1)."""
    if col.rho:
        e = col.rho.bit_length() + col.E
    else:
        ref = max((math.ulp(float(v)) for v in vals), default=1.0)  # math.ulp(DBL_MAX) is finite
        e = math.frexp(ref)[1]
    # clamped so that the spread stays representable and eps * 2^-e finite for eps below 2^60
    # (the caller raises the frame to _eps_floor for larger eps)
    return min(max(e, -900), 1000)


def _group_numbers(idx, cols, r, wq, w, dws, conv, eps_g, classes,
                   zr, zzero, zcond, zdelta, cr, czero, ccond, cdelta, cframe, ccframe, cforms, cnan, info=None):
    """Certified z and c of one group, their error model and stage-wise condition; ``info``
    (group index, dict of (G, K) arrays) receives each live column's frame, sigma and
    denominator in that frame, for :mod:`oracle.condition`."""
    n = idx.size
    z64 = zr["float64"]
    K = len(cols)
    # exact forms of c_j
    weighted = [col.inv.scaled(wq[k] * col.f) if not col.nan else None for k, col in enumerate(cols)]
    nan_rows = np.zeros(n, bool)
    for k, col in enumerate(cols):
        if col.nan:
            nan_rows[:] = True
    for jj, j in enumerate(idx):
        if nan_rows[jj]:
            cforms[j] = None
            cnan[j] = True
            continue
        form = ex.Form()
        for k, col in enumerate(cols):
            pos = _valid_pos(col, jj)
            if pos is None or col.collapsed and not col.raw:
                continue
            form.add_scaled(weighted[k], Fraction(col.D[pos]))
        cforms[j] = form
        czero[j] = form.is_zero()
    # certified numbers, precision raised until every value of the group rounds uniquely
    prec = START_PREC
    while True:
        ok = True
        for k, col in enumerate(cols):
            if col.nan:
                _put(zr, (idx, k), np.nan)
                continue
            inv_iv = None if col.inv.is_rational() else \
                ex.iv_scale_rational(col.inverse_interval(classes, prec), col.f, prec)
            for jj, j in enumerate(idx):
                pos = _valid_pos(col, jj)
                if pos is None or col.D[pos] == 0 or (col.collapsed and not col.raw):
                    _put(zr, (j, k), 0.0)
                    zzero[j, k] = True
                    continue
                if col.inv.is_rational():  # z is rational: rounded exactly (a tie included)
                    _put(zr, (j, k), ex.round_all_fraction(col.D[pos] * col.f * col.inv.q0))
                    continue
                iv = _interval_of_z(col, pos, inv_iv, prec)
                every = ex.round_all(iv)
                if every is None:
                    ok = False
                    break
                _put(zr, (j, k), every)
            if not ok:
                break
        if ok:
            for jj, j in enumerate(idx):
                if cnan[j]:
                    _put(cr, j, np.nan)
                    continue
                if czero[j]:
                    _put(cr, j, 0.0)
                    continue
                if cforms[j].is_rational():
                    _put(cr, j, ex.round_all_fraction(cforms[j].q0))
                    continue
                iv = ex.iv_form(cforms[j], classes, prec)
                every = ex.round_all(iv)
                if every is None:
                    ok = False
                    break
                _put(cr, j, every)
        if ok:
            break
        prec *= 2
        if prec > MAX_PREC:
            raise ex.CertificationError(f"could not certify group members {idx[:4].tolist()}... "
                                        f"within {MAX_PREC} bits")
    # error model and condition, in a frame scaled so nothing overflows
    dz_model = np.zeros((n, K)); dz_cond = np.zeros((n, K))
    zs = z64[idx]
    for k, col in enumerate(cols):
        if col.nan:
            dz_model[:, k] = dz_cond[:, k] = np.nan
            continue
        vals = r[idx, k]
        e = _frame(col, vals)
        if not col.raw:  # z = r / (1 + eps) is not measured in the frame: no eps to scale
            e = max(e, _eps_floor(eps_g, conv.group_eps_placement))
        sel = np.array([_valid_pos(col, jj) is not None for jj in range(n)])
        g = col.f * _pow2(-e)  # int / int true division is correctly rounded, even for huge ints
        dev = np.array([d * g.numerator / g.denominator for d in col.D]) if col.D else np.zeros(0)
        sigma = _float_sqrt(col.V * _pow2(-2 * e))
        denom = _scaled_denominator(col, conv, eps_g, e, sigma)
        nv = int(sel.sum())
        rho = float(Fraction(col.rho) * _pow2(col.E - e))
        if col.rho and rho == 0.0:  # flushed in a frame lifted by a huge eps: a range, not a collapse
            rho = 5e-324
        if conv.algorithm == "mean_then_subtract" and nv:  # r - mean(r): rounding scales with the magnitude
            rho = max(rho, float(np.max(np.abs(np.ldexp(vals[sel], -e)))))
        tau = em.underflow_tau(conv.native_dtype)  # the code's own subnormal spacing, in its own u
        d_model = em.model_dev_perturbation(rho, nv, tau=math.ldexp(tau, -e))
        # one ulp of each input, measured in the frame (spacing(DBL_MAX) itself is inf);
        # a subnormal's ulp is the absolute 2^-1074 whatever the frame
        ulps = np.maximum(np.spacing(np.abs(np.ldexp(vals[sel], -e))), np.ldexp(5e-324, -e))
        d_cond = ulps + (ulps.mean() if ulps.size else 0.0)
        if col.raw:
            dz_model[sel, k] = em.group_stage(dev, 0.0, 1.0, denom, zs[sel, k], 1, 0)
            dz_cond[sel, k] = np.ldexp(ulps, e) / denom  # ulps are measured in the frame 2^e
            continue
        if nv == 0:
            continue
        cap_u = conv.unit_roundoff if (conv.algorithm == "mean_then_subtract"
                                       and conv.group_eps_placement in ("std", "var")) else None
        dz_model[sel, k] = em.group_stage(dev, d_model, sigma, denom, zs[sel, k], nv, conv.group_ddof, cap_u=cap_u,
                                          tau=tau)
        # at a zero std the stage-wise condition sees the denominator a perturbed column has as it
        # un-collapses: eps (std, std_if_positive) or none, 0 (skip_if_zero, or eps = 0): then
        # Samuelson's cap (not the placeholder 1 the collapse rule divides by)
        cdenom = _collapsed_denominator(eps_g, conv.group_eps_placement, e) if col.collapsed else denom
        dz_cond[sel, k] = em.group_stage(dev, d_cond, sigma, cdenom, zs[sel, k], nv, conv.group_ddof,
                                         rounding=False)
        if info is not None and not col.collapsed and nv == n and col.V > 0 and sigma > 0.0 \
                and 0.0 < denom < math.inf:
            g, arrays = info
            arrays["frame"][g, k], arrays["sigma"][g, k], arrays["denom"][g, k] = e, sigma, denom
            arrays["ok"][g, k] = True
        elif info is not None and col.collapsed and nv == n >= 2 and col.V == 0:
            # a zero std with eps > 0 added to it (or to the variance): z = d / h is differentiable
            # at d = 0, with h0 = eps (sqrt(eps)) and theta = 0 (oracle.condition)
            h0 = _collapsed_denominator(eps_g, conv.group_eps_placement, e)
            if 2.0 ** -1022 <= h0 < math.inf:
                g, arrays = info
                arrays["frame"][g, k], arrays["sigma"][g, k], arrays["denom"][g, k] = e, 0.0, h0
                arrays["ok"][g, k] = arrays["collapsed"][g, k] = True
                arrays["cap"][g, k] = float(em.samuelson(n, conv.group_ddof))
    zdelta[idx] = dz_model
    # dz_cond is absolute (z is dimensionless): a change below 2^-1074 flushed to 0 there would
    # be multiplied by a weight at Eq. 7 (1e300 times 0); 5e-324 bounds it
    dz_cond = _floor_cond(dz_cond)
    zcond[idx] = dz_cond
    cdelta[idx], cframe[idx] = em.combine_stage_framed(dz_model, zs, w, tau=em.underflow_tau(conv.native_dtype))
    ccond[idx], ccframe[idx] = em.combine_stage_framed(dz_cond, zs, w, d_weights=dws, rounding=False)


def _put(arrays: dict, at, values) -> None:
    """Store one certified value per format (a tuple in ``ex.ROUNDED`` order, or one
    value for every format) at index ``at`` of each format's array."""
    for i, fmt in enumerate(ex.ROUNDED):
        arrays[fmt][at] = values[i] if isinstance(values, tuple) else values


def _valid_pos(col: _Column, jj: int):
    """Position of group member jj among the column's valid (non-NaN) entries."""
    if col.nan:
        return None
    valid = col.valid
    if valid.all():
        return jj
    if not valid[jj]:
        return None
    return int(valid[:jj].sum())


def _pow2(e: int) -> Fraction:
    return Fraction(2) ** e if e >= 0 else Fraction(1, 2 ** -e)


def _collapsed_denominator(eps: Fraction, placement: str, e: int) -> float:
    """The denominator at a zero std measured in the frame 2^e, where its first order exists:
    eps 2^-e ("std", "std_if_positive": a perturbed std is positive) or sqrt(eps) 2^-e ("var");
    0 (no closed form: Samuelson's cap) for "skip_if_zero" or eps = 0."""
    if eps <= 0:
        return 0.0
    if placement in ("std", "std_if_positive"):
        return float(eps * _pow2(-e))
    if placement == "var":
        return _float_sqrt(eps * _pow2(-2 * e))
    return 0.0


def _float_sqrt(v: Fraction) -> float:
    if v == 0:
        return 0.0
    from mpmath import libmp
    x = libmp.from_rational(v.numerator, v.denominator, 80, libmp.round_nearest)
    return ex.round_mpf(libmp.mpf_sqrt(x, 80, libmp.round_nearest), "float64")


def _scaled_denominator(col: _Column, conv: Convention, eps: Fraction, e: int, sigma: float) -> float:
    if col.raw:  # z = r / (1 + eps): r is measured in the frame, 1 + eps is not
        return float(1 + eps)
    p = conv.group_eps_placement
    if p in ("std", "std_if_positive"):  # eps 2^-e is at most 2^960: the frame is at least _eps_floor's
        # the std's sign from the exact variance: in a frame lifted by a huge eps, sigma may flush to 0
        return sigma + float(eps * _pow2(-e)) if col.V > 0 or p == "std" else 1.0
    if p == "var":  # sqrt(V + eps) in the frame, from the exact rationals: eps 2^-2e alone may be beyond float64
        return _float_sqrt((col.V + eps) * _pow2(-2 * e))
    return sigma if sigma > 0 else 1.0


# ----------------------------------------------------------------------- Eq. 6


def _unit_info(S: int) -> dict:
    """Per whitening unit, for :mod:`oracle.condition`: the condition estimate's frame, the
    std and denominator measured in it, and whether the unit is live (whitened per sample,
    no NaN, not collapsed)."""
    return {"frame": np.zeros(S, dtype=np.int64), "sigma": np.zeros(S), "denom": np.ones(S),
            "ok": np.zeros(S, bool), "collapsed": np.zeros(S, bool), "cap": np.full(S, math.inf)}


def _whiten_scored(unscored, cforms, cnan, c64, ccond, ccframe, cdelta, cframe, uidx, t, conv, eps_w, classes,
                   creq, ul, whole=None):
    """Eq. 6 of convention nan="nan_aware_unscored" (TRL): a sample whose every reward is NaN
    is left out of its unit's statistics and gets advantage 0 (exactly, bound 0); a unit left
    with fewer than two scored samples gets 0 throughout (the NaN std of one value, then
    nan_to_num). The other samples are whitened among themselves (:func:`_whiten`).

    ``whole`` (S,): the units made of whole groups, where the convention demands the
    structural zero mean (spec's, under ``missing="unscored"``): the scored rows of a whole
    group still sum to exactly 0 (each column is centred over its scored members, and a row
    not scored in it has z = 0 there), so a structural zero of c whitens to a required 0; and
    every advantage this function sets to 0 (unscored rows, units of fewer than two scored
    rows) is then a required zero too."""
    N = len(cforms)
    counts = np.bincount(uidx[~unscored], minlength=ul.size)
    keep = np.flatnonzero(~unscored & (counts[uidx] >= 2))
    ar = _rounded_arrays(N); azero = np.ones(N, bool)
    acond = np.zeros(N); adelta = np.zeros(N)
    areq = np.ones(N, bool) if whole is not None else np.zeros(N, bool)
    areq[keep] = False
    ucoll = counts < 2
    if keep.size:
        kept_units, sub_uidx = np.unique(uidx[keep], return_inverse=True)
        sub_t = None if t is None else t[keep]
        sub = _whiten([cforms[j] for j in keep], cnan[keep], c64[keep], ccond[keep], ccframe[keep], cdelta[keep],
                      cframe[keep], sub_uidx.reshape(-1), sub_t, conv, eps_w, classes, creq[keep],
                      labels=ul[kept_units], whole=None if whole is None else whole[kept_units])
        for fmt in ar:
            ar[fmt][keep] = sub[0][fmt]
        azero[keep], acond[keep], adelta[keep], areq[keep] = sub[1], sub[2], sub[3], sub[5]
        ucoll[kept_units] = sub[4]
    return ar, azero, acond, adelta, ucoll, areq


def _structural_mean(conv: Convention) -> bool:
    """Does the convention demand the structural zero mean of a unit of whole groups (spec
    section 7)? Only ``spec``'s exact collapse does: Eq. 4 centres every group column (no raw
    singleton), Eq. 6 weighs samples alike. The peers' float codes test collapse their own
    way (``collapse``) and subtract a rounded batch mean; they are graded by the formula."""
    return (conv.collapse == "exact_equality" and conv.whiten == "per_sample" and conv.singleton != "raw")


def _units_of_whole_groups(gidx: np.ndarray, uidx: np.ndarray, G: int, S: int) -> np.ndarray:
    """(S,) bool: every group with a member in the unit has all its members in it."""
    if gidx.size == 0:
        return np.zeros(S, bool)
    lo = np.full(G, S, dtype=np.int64)
    hi = np.full(G, -1, dtype=np.int64)
    np.minimum.at(lo, gidx, uidx)
    np.maximum.at(hi, gidx, uidx)
    cut = lo[gidx] != hi[gidx]  # per sample: its group spans two or more units
    whole = np.ones(S, bool)
    whole[uidx[cut]] = False
    return whole


def _whiten(forms, nan, c64, dcond, cond_frame, dmodel, model_frame, uidx, t, conv, eps_w, classes, creq,
            labels=None, uinfo=None, whole=None):
    """Eq. 6 per unit. ``whole`` (S,) marks the units made of whole groups, whose mean is
    structurally zero where the convention demands it (:func:`_structural_mean`): there a
    structural zero of c is a required zero of a (spec section 7). ``c64`` is c (float64, inf where it overflowed), its condition and
    model deltas are ``dcond * 2^cond_frame`` and ``dmodel * 2^model_frame`` per sample.
    Each unit's error model is evaluated in a frame of its own (:func:`_unit_frame`),
    where nothing overflows (a is dimensionless; eps scales with the frame like what it is
    added to: like c when added to the std, like c^2 when added to the variance)."""
    N = len(forms)
    ar = _rounded_arrays(N); azero = np.zeros(N, bool)
    acond = np.zeros(N); adelta = np.zeros(N)
    S = int(uidx.max()) + 1 if N else 0
    ucoll = np.zeros(S, bool)
    areq = np.zeros(N, bool)
    members = _members(uidx, S)
    floor = _eps_floor(eps_w, conv.whiten_eps_placement)
    cs = np.zeros(N); dcond_s = np.zeros(N); dmodel_s = np.zeros(N)  # each unit in its own frame
    for s in range(S):
        idx = members[s]
        label = labels[s] if labels is not None else s
        if conv.whiten == "none":
            ok = idx[~nan[idx]]
            _pass_through(forms, ok, classes, ar, azero)
            _put(ar, idx[nan[idx]], np.nan)
            with np.errstate(over="ignore"):
                acond[idx] = np.ldexp(dcond[idx], cond_frame[idx])
                adelta[idx] = np.ldexp(dmodel[idx], model_frame[idx])
            # no Eq. 6, but the unit's combined values may still be all exactly equal (the
            # field says so under every convention; it read False here, found by review)
            ucoll[s] = idx.size > 0 and not nan[idx].any() and all(
                forms[j].minus(forms[idx[0]]).is_zero() for j in idx[1:])
            continue
        uforms = [forms[j] for j in idx]
        c_top = _top_exponent(uforms, nan[idx], c64[idx], classes)
        frame = _unit_frame(c_top, nan[idx], dmodel[idx], model_frame[idx], floor)  # the error model's
        cframe = _unit_frame(c_top, nan[idx], dcond[idx], cond_frame[idx], floor)  # the condition estimate's
        cs[idx] = _scaled_values(uforms, nan[idx], c64[idx], frame, classes)
        ccs = _scaled_values(uforms, nan[idx], c64[idx], cframe, classes)
        with np.errstate(over="ignore"):  # a delta 2^1024 above the unit's largest c: no bound (inf)
            dcond_s[idx] = np.ldexp(dcond[idx], np.clip(cond_frame[idx] - cframe, -2200, 2200).astype(np.int32))
            dmodel_s[idx] = np.ldexp(dmodel[idx], np.clip(model_frame[idx] - frame, -2200, 2200).astype(np.int32))
        if nan[idx].any():  # convention nan="propagate": the unit's statistics are NaN
            _put(ar, idx, np.nan)
            acond[idx] = adelta[idx] = np.nan
            continue
        tt = np.ones(idx.size, dtype=np.int64) if t is None else t[idx]
        T = int(tt.sum())
        if T - conv.whiten_ddof <= 0:
            raise SegmentError(
                f"whitening unit {_py(label)!r} has {idx.size} sample(s) ({T} weight); "
                "the unbiased std of Eq. 6 needs at least 2"
            )
        mean = ex.Form()
        for j, tj in zip(idx, tt.tolist()):
            mean.add_scaled(forms[j], Fraction(tj))
        mean = mean.scaled(Fraction(1, T))
        k_support = max((forms[j].support() for j in idx), default=0)
        if mean.support() > k_support:
            zero = np.zeros(idx.size, bool)
        else:
            zero = np.array([forms[j].minus(mean).is_zero() for j in idx])
        coll = bool(zero.all())
        ucoll[s] = coll
        if coll:
            if conv.whiten_eps_placement == "skip_if_zero":  # the step is skipped: a = c
                _pass_through(forms, idx, classes, ar, azero)
                with np.errstate(over="ignore"):
                    acond[idx] = np.ldexp(dcond[idx], cond_frame[idx])
                    adelta[idx] = np.ldexp(dmodel[idx], model_frame[idx])
                continue
            azero[idx] = True
            areq[idx] = creq[idx].all()  # equal bit for bit only when every c is a structural zero
            # equal in exact arithmetic only: a correct float64 code whitens its rounding
            # noise, which eps keeps small; the bound below (std 0) says how small. A structural
            # zero is demanded bit for bit (delta 0, below), but one ulp of input still
            # un-collapses the unit: its cond is the same as any zero std's (spec section 7)
            var = (ex.ZERO, ex.ZERO)
            vals64 = np.zeros(idx.size)
        else:
            vals64, var = _whiten_unit_numbers(forms, idx, zero, tt, T, mean, conv, eps_w, classes, label,
                                               ar, azero)
            if whole is not None and whole[s] and t is None and mean.is_zero():
                # a unit of whole groups: Eq. 4 centres every group column, so the unit's mean
                # is exactly 0 by structure, and a structural zero of c whitens to exactly 0
                areq[idx] = creq[idx]
        # error model in the frame (c * frame); eps scales with it
        ttf = tt.astype(np.float64)
        m_s, s_s, den_s = _scaled_unit_terms(mean, var, eps_w, conv, frame, classes)
        adelta[idx] = em.whiten_stage(dmodel_s[idx], cs[idx], m_s, vals64, s_s, den_s, conv.whiten_ddof, ttf,
                                      tau=math.ldexp(em.underflow_tau(conv.native_dtype), -frame),
                                      unit_roundoff=conv.unit_roundoff)
        if coll and areq[idx[0]]:
            adelta[idx] = 0.0  # the structural zero: demanded bit for bit
        elif areq[idx].any():
            adelta[idx[areq[idx]]] = 0.0  # structural zeros in a unit of whole groups
        m_s, s_s, den_s = _scaled_unit_terms(mean, var, eps_w, conv, cframe, classes)
        if not coll and not s_s >= 2.0 ** -1022:
            # a live unit whose std is not a normal float in the condition frame (its spread of
            # c below float64's range there, or flushed): the stage-wise formula would take it
            # for a zero std and cap it. Cauchy-Schwarz instead: |dsigma| <= sqrt(T/(T - ddof))
            # max |d dev|, |dh| <= |dsigma|, so |da_j| <= (|d dev_j| + |a_j| sqrt(T/(T - ddof))
            # max |d dev|) / h, d dev_j <= dc_j + sum t dc / T; no bound (inf) where the
            # denominator itself is not a normal float there (no eps: it is that std)
            dd = dcond_s[idx] + float(np.sum(ttf * dcond_s[idx]) / T)
            with np.errstate(over="ignore", invalid="ignore"):
                ds = math.sqrt(T / (T - conv.whiten_ddof)) * (1 + 2.0 ** -50) * float(np.max(dd))
                acond[idx] = (dd + np.abs(vals64) * ds) / den_s * (1 + 2.0 ** -48) \
                    if den_s >= 2.0 ** -1022 else math.inf
            acond[idx] = np.where(np.isnan(acond[idx]), math.inf, acond[idx])
        else:
            acond[idx] = em.whiten_stage(dcond_s[idx], ccs, m_s, vals64, s_s, den_s, conv.whiten_ddof, ttf,
                                         rounding=False)
        if uinfo is not None and not coll and t is None and s_s >= 2.0 ** -1022 and 2.0 ** -1022 <= den_s < math.inf:
            uinfo["frame"][s], uinfo["sigma"][s], uinfo["denom"][s] = cframe, s_s, den_s
            uinfo["ok"][s] = True
        elif uinfo is not None and coll and t is None:  # a zero std: the first order at eps > 0
            h0 = _collapsed_denominator(eps_w, conv.whiten_eps_placement, cframe)
            if 2.0 ** -1022 <= h0 < math.inf:
                uinfo["frame"][s], uinfo["sigma"][s], uinfo["denom"][s] = cframe, 0.0, h0
                uinfo["ok"][s] = uinfo["collapsed"][s] = True
                uinfo["cap"][s] = float(em.samuelson(idx.size, conv.whiten_ddof))
    return ar, azero, acond, adelta, ucoll, areq


def _scaled_unit_terms(mean, var, eps_w, conv, frame: int, classes):
    """A unit's mean, std and denominator measured in the frame 2^frame: with q = 2^-frame,
    c, the mean and the std scale by q, so an eps added to the std scales by q and one added
    to the variance by q^2 (then the bound is invariant under c -> 2^k c, eps -> 4^k eps, as
    the exact a is). The denominator comes from the exact variance and eps in mpmath, whose
    exponents are unbounded: eps q^2 alone may be far beyond float64 (q up to 2^900) while
    the denominator, sqrt(eps) q at most 2^960 or so (:func:`_eps_floor`), is not."""
    q = _pow2(-frame)
    m_s = ex.round_mpf(ex.iv_form(mean.scaled(q), classes, 80)[0], "float64")
    var_s = ex.iv_scale_rational(var, q * q, 80)
    s_iv = ex.iv_sqrt(var_s, 80)
    s_s = ex.round_mpf(s_iv[0], "float64")
    return m_s, s_s, _scaled_whiten_denominator(s_s, var_s, eps_w, q, conv.whiten_eps_placement)


def _whiten_unit_numbers(forms, idx, zero, tt, T, mean, conv, eps_w, classes, label, ar, azero):
    """Certified a for one non-collapsed unit; returns a (float64) and the variance interval.

    Where every c of the unit is rational and so is the denominator (a rational square
    root), each a is an exact rational, rounded exactly. Otherwise a value interval that
    keeps straddling a rounding boundary (a midpoint between two floats) is tested for an
    exact tie on the forms (:func:`_whitened_equals`): a rational a there is rounded exactly
    too; an irrational one is no midpoint, so raising the precision separates it."""
    exact = _whiten_rational(forms, idx, zero, tt, T, mean, conv, eps_w, classes)
    if exact is not None:
        vals, var = exact
        for fmt in ex.ROUNDED:
            ar[fmt][idx] = vals[fmt]
        azero[idx] = zero
        return vals["float64"], var
    tie_state: dict = {}
    ties: dict[int, tuple] = {}
    prec = START_PREC
    while True:
        m_iv = ex.iv_form(mean, classes, prec)
        devs = [None if z else ex.iv_sub(ex.iv_form(forms[j], classes, prec), m_iv, prec)
                for j, z in zip(idx, zero)]
        ss = (ex.ZERO, ex.ZERO)
        for d, tj in zip(devs, tt.tolist()):
            if d is not None:
                ss = ex.iv_add(ss, ex.iv_scale_rational(ex.iv_square(d, prec), Fraction(tj), prec), prec)
        var = ex.iv_scale_rational(ss, Fraction(1, T - conv.whiten_ddof), prec)
        den = _denominator_interval(var, eps_w, conv.whiten_eps_placement, prec)
        # without eps (skip_if_zero) a nonzero std may still touch zero at low precision
        ok = not ex.iv_contains_zero(den)
        vals = _rounded_arrays(idx.size)
        for p, d in enumerate(devs):
            if d is None or not ok:
                continue
            if p in ties:
                _put(vals, p, ties[p])
                continue
            iv = ex.iv_div(d, den, prec)
            every = ex.round_all(iv)
            if every is None and prec >= TIE_TEST_PREC:
                for m in ex.boundaries(iv):
                    if (p, m) in tie_state.setdefault("no", set()):
                        continue  # tested once: not this boundary
                    if _whitened_equals(m, forms[idx[p]].minus(mean), forms, idx, zero, tt, T, mean, conv,
                                        eps_w, classes, tie_state):
                        every = ties[p] = ex.round_all_fraction(m)
                        break
                    tie_state["no"].add((p, m))
            if every is None:
                ok = False
                break
            _put(vals, p, every)
        if ok:
            break
        prec *= 2
        if prec > MAX_PREC:
            raise ex.CertificationError(f"could not certify unit {_py(label)!r} within {MAX_PREC} bits")
    for fmt in ex.ROUNDED:
        ar[fmt][idx] = vals[fmt]
    azero[idx] = zero
    return vals["float64"], var


def _whiten_rational(forms, idx, zero, tt, T, mean, conv, eps_w, classes):
    """Eq. 6 of a unit in exact rationals, where it is rational: every c rational and the
    denominator a rational (the variance, or variance + eps, a rational square). Returns
    ({format: values}, the variance as a point interval), or None."""
    if not mean.is_rational() or not all(forms[j].is_rational() for j in idx):
        return None
    devs = [forms[j].q0 - mean.q0 for j in idx]
    var = sum((Fraction(tj) * d * d for d, tj in zip(devs, tt.tolist())), Fraction(0)) / (T - conv.whiten_ddof)
    placement = conv.whiten_eps_placement
    root = classes.sqrt(var + eps_w if placement == "var" else var)
    if not root.is_rational():
        return None
    den = root.q0 + eps_w if placement in ("std", "std_if_positive") else root.q0
    if den == 0:
        return None
    vals = _rounded_arrays(idx.size)
    for p, (d, z) in enumerate(zip(devs, zero)):
        _put(vals, p, 0.0 if z else ex.round_all_fraction(d / den))
    return vals, ex.iv_rational(var, START_PREC)


#: From this precision on, a whitened value whose interval still straddles a rounding
#: boundary is tested for being exactly that boundary (a tie), on the exact forms.
TIE_TEST_PREC = 4 * START_PREC


def _whitened_equals(m: Fraction, dev: ex.Form, forms, idx, zero, tt, T, mean, conv, eps_w, classes,
                     state: dict) -> bool:
    """Is a = dev / den exactly the rational m (den = s + eps, sqrt(s^2 + eps) or s, with
    s^2 = sum t dev^2 / (T - ddof))? Decided on exact forms: a = m exactly when
    dev - m eps = m s (std), dev = m sqrt(s^2 + eps) (var) or dev = m s (no eps), i.e. when
    the two sides have one sign and equal squares. The variance form is built once per
    unit (``state``)."""
    if m == 0:
        return dev.is_zero()
    var = state.get("var")
    if var is None:  # sum t (c - m)^2 = sum t c^2 - T m^2: each c has its group's few classes only
        acc = mean.times(mean, classes).scaled(Fraction(-T))
        for j, tj in zip(idx, tt.tolist()):
            acc.add_scaled(forms[j].times(forms[j], classes), Fraction(tj))
        var = state["var"] = acc.scaled(Fraction(1, T - conv.whiten_ddof))
    placement = conv.whiten_eps_placement
    lhs = dev
    rhs2 = var.scaled(m * m)
    if placement in ("std", "std_if_positive"):
        lhs = dev.minus(ex.Form(m * eps_w))
    elif placement == "var":
        rhs2 = ex.Form(var.q0 + eps_w, dict(var.terms)).scaled(m * m)
    if lhs.is_zero() or not lhs.times(lhs, classes) == rhs2:
        return False
    return _form_sign(lhs, classes) == (1 if m > 0 else -1)


def _form_sign(form: ex.Form, classes: ex.SqrtClasses) -> int:
    """The sign of a nonzero form (its interval excludes zero at some precision)."""
    if form.is_rational():
        return 1 if form.q0 > 0 else -1
    prec = START_PREC
    while prec <= MAX_PREC:
        iv = ex.iv_form(form, classes, prec)
        if not ex.iv_contains_zero(iv):
            return 1 if ex.libmp.mpf_sign(iv[0]) > 0 else -1
        prec *= 2
    raise ex.CertificationError(f"could not certify the sign of {form!r} within {MAX_PREC} bits")


def _structural_zero(cols, wq, cancelled: bool) -> bool:
    """Is the group's exact zero combination reproduced bit for bit by the prescribed algorithm?

    Yes when no column contributes (all collapsed or zero weight), or when exactly two
    contribute with weights of equal magnitude, cancel, and are equal up to shift and sign
    (spec 7): their exact deviations from the group mean are equal up to one sign, so the
    shift-invariant algorithm rounds both columns alike. Exact cancellation alone does not
    say so at eps = 0 (or without eps): z is then scale-invariant, and any two affinely
    related columns (r2 = k r1 + b, k != 0) cancel exactly while a correct float64 code
    rounds them differently; that zero is held to the error bound.
    """
    if any(col.nan for col in cols):
        return False
    live = [k for k, col in enumerate(cols) if wq[k] != 0 and (col.raw or not col.collapsed)]
    if not live:
        return True
    if not (cancelled and len(live) == 2 and abs(wq[live[0]]) == abs(wq[live[1]])):
        return False
    return _equal_up_to_shift_and_sign(cols[live[0]], cols[live[1]])


def _equal_up_to_shift_and_sign(a: _Column, b: _Column) -> bool:
    """Do two group columns have the same valid members and exact deviations (D_j f, the
    value itself for a raw singleton column) equal up to one sign? With eps > 0 two live
    columns that cancel with weights of equal magnitude always do (z is not scale-invariant
    there: z_a = +-z_b forces dev_b = +-dev_a); at eps = 0 only this check tells."""
    if bool(a.raw) != bool(b.raw) or a.n != b.n or len(a.D) != len(b.D):
        return False
    if not np.array_equal(a.valid, b.valid):
        return False
    sign = 0
    for da, db in zip(a.D, b.D):
        x, y = da * a.f, db * b.f  # exact rationals
        if x == 0 or y == 0:
            if x != y:
                return False
            continue
        s = 1 if x == y else -1 if x == -y else 0
        if s == 0 or sign not in (0, s):
            return False
        sign = s
    return True


def _round_form(form: ex.Form, classes: ex.SqrtClasses) -> tuple[float, ...]:
    """Certified roundings of an exact form to every format of ``ex.ROUNDED`` (Ziv loop)."""
    if form.is_zero():
        return (0.0,) * len(ex.ROUNDED)
    if form.is_rational():
        return ex.round_all_fraction(form.q0)
    prec = START_PREC
    while prec <= MAX_PREC:
        every = ex.round_all(ex.iv_form(form, classes, prec))
        if every is not None:
            return every
        prec *= 2
    raise ex.CertificationError(f"could not certify {form!r} within {MAX_PREC} bits")


def _pass_through(forms, idx, classes, ar, azero):
    """A step that leaves values unchanged: certify their rounding like any other."""
    for j in idx:
        _put(ar, j, _round_form(forms[j], classes))
        azero[j] = forms[j].is_zero()


def _denominator_interval(var, eps: Fraction, placement: str, prec: int):
    if placement in ("std", "std_if_positive"):
        return ex.iv_add(ex.iv_sqrt(var, prec), ex.iv_rational(eps, prec), prec)
    if placement == "var":
        return ex.iv_sqrt(ex.iv_add(var, ex.iv_rational(eps, prec), prec), prec)
    return ex.iv_sqrt(var, prec)


def _scaled_whiten_denominator(s: float, var_s, eps: Fraction, q: Fraction, placement: str) -> float:
    """Eq. 6's denominator in the frame q = 2^-f: ``s`` the std there (float64), ``var_s`` the
    variance there (an interval), ``eps`` the convention's (absolute)."""
    if placement in ("std", "std_if_positive"):
        return s + float(eps * q)  # at most 2^960 (_eps_floor)
    if placement == "var":  # sqrt(var q^2 + eps q^2): eps q^2 itself may be beyond float64
        w = ex.iv_add(var_s, ex.iv_rational(eps * q * q, 80), 80)
        return ex.round_mpf(ex.iv_sqrt(w, 80)[0], "float64")
    return s
