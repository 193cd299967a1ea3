"""Refusals as data: problem codes, the facts row, and the messages built from them.

A host problem is ``(code, a, b, c)``; device findings (the first non-finite reward, a group of
one, ...) are raw int64 entries of a fixed-layout *facts row*, interpreted here on the host (zeros
read as "nothing wrong"). A local call reads its row once and raises its first problem; across
ranks every row goes into one (world_size, ROW_WIDTH) table, all-reduced, and the same functions
turn it into the same message on every rank."""

from __future__ import annotations

import hashlib
import math
import re
import struct

import torch

from spec.errors import (DistributedError, GDPOError, GroupError, GroupLengthError, InputDtypeError, NonFiniteError,
                         OutOfRangeError, SegmentError, ShapeError, WeightError, WeightLengthError, process_state_error)


class DistributedSegmentError(DistributedError, SegmentError):
    """A unit holds one sample across all ranks: raised on every rank together."""


class DistributedOutOfRangeError(DistributedError, OutOfRangeError):
    """A whitened value does not survive the cast on some rank: raised on every rank."""


# --- the facts row: host fields, then raw device values (an index, the bits found there, a label) --
PRESENT, API, HOST_CODE, HOST_A, HOST_B, HOST_C = range(6)
UNITS, SEG_NONE, ROWS, DTYPE, OUT_DTYPE, DEVICE, EPS_BITS, K, WEIGHTS_FP = range(6, 15)
NF_REWARD, NF_REWARD_KIND, NF_REWARD_GROUP = 15, 16, 17  # first non-finite flat index, its bits, its label
SINGLETON, SINGLETON_LABEL = 18, 19  # first input row of a group of one (ROWS if none); its label
C_OVERFLOW, C_OVERFLOW_GROUP = 20, 21  # first non-finite c (Eq. 7 overflow): row, its label
NF_VALUE, NF_VALUE_KIND, NF_VALUE_UNIT = 22, 23, 24  # whiten input: first non-finite index, bits, unit
GROUPS, N_MAX, C_OVERFLOW_BITS = 25, 26, 27  # labelled groups: count, longest; the bits of c there
RUNS = 28  # labelled groups: runs of equal labels in input order (== GROUPS: every group contiguous)
SINGLETONS = 29  # labelled groups: how many have one sample (the refusal names the first, counts all)
BY_LABEL, GROUP_SIZE = 30, 31
LABELS_UINT64 = 32  # 1: the labels were uint64, travelling as their int64 bits (printed back as uint64)
UNJOINED = 33  # this process's calls whose process_group was no group (impl._distributed)
MISSING, UNSCORED = 34, 35  # the ``missing`` policy (MISSING_CODES); this rank's rows with no scored reward
CERTIFIED = 36  # the certificate's mode (CERTIFIED_CODES): its statistics ride in collective 2 or not
#: Sample counts of the first COUNT_SLOTS units: a unit of one is caught without a second host read.
COUNTS, COUNT_SLOTS = 37, 32
ROW_WIDTH = COUNTS + COUNT_SLOTS
DEVICE_FIELDS = tuple(range(NF_REWARD, SINGLETONS + 1))

API_WHITEN, API_GDPO = 1, 2
API_NAMES = {API_WHITEN: "whiten", API_GDPO: "gdpo_advantages"}
MISSING_CODES = {"refuse": 1, "unscored": 2}  # spec/gdpo.md section 2
CERTIFIED_CODES = {"narrow": 1, "all": 2, "off": 3}  # impl._certify

_DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                "float8_e5m2fnuz", "float8_e8m0fnu", "complex128", "complex64", "complex32", "bool", "uint8",
                "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64")
_DTYPES = tuple(getattr(torch, n) for n in _DTYPE_NAMES if hasattr(torch, n))
#: dtype -> its code in the facts row (1-based; another dtype: len + 1)
DTYPE_CODES = {d: i + 1 for i, d in enumerate(_DTYPES)}
#: The dtypes rewards and values may have (float8 is an output format only).
INPUT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
_INPUT_NAMES = "float16, bfloat16, float32 or float64"


def dtype_code(dtype) -> int:
    return DTYPE_CODES.get(dtype, len(_DTYPES) + 1)


def dtype_name(code: int) -> str:
    return str(_DTYPES[code - 1]).replace("torch.", "") if 1 <= code <= len(_DTYPES) else "another dtype"


#: Non-strided layouts, by code (0: a dense strided tensor, no problem).
_LAYOUT_NAMES = ("sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "jagged", "_mkldnn")
_LAYOUTS = tuple(getattr(torch, n, None) for n in _LAYOUT_NAMES)
_NESTED_STRIDED, _OTHER_LAYOUT = len(_LAYOUTS) + 1, len(_LAYOUTS) + 2


def layout_code(t: torch.Tensor) -> int:
    """0 for a dense strided tensor; else which layout it has (nested tensors included)."""
    if t.layout == torch.strided:
        return _NESTED_STRIDED if t.is_nested else 0
    return _LAYOUTS.index(t.layout) + 1 if t.layout in _LAYOUTS else _OTHER_LAYOUT


DEVICE_CODES = {"cpu": 1, "cuda": 2}  # the device types impl computes on (3: any other)
_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "other than CPU and CUDA (e.g. meta or mps)"}


def float_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def bits_float(b: int) -> float:
    return struct.unpack("<d", struct.pack("<q", int(b)))[0]


def weights_fingerprint(values, names=None) -> int:
    """62-bit digest of the float64 weight bits; an adapter's reward names go in with them, paired
    and in name order (mappings that only list them in another order agree)."""
    blob = struct.pack(f"<{len(values)}d", *values) if names is None else repr(_named(values, names)).encode()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little") >> 2


def _named(values, names) -> list[tuple[str, str]]:
    """(name, weight) of an adapter's columns, as text, in the order of the names' reprs."""
    return sorted((repr(n), repr(float(w))) for n, w in zip(names, values))


_KINDS = {1: "nan", 2: "inf", 3: "-inf"}

#: What an item is instead of a real number (an integer): the ``K_*`` codes a problem carries
#: (the value itself, a string, is named in the local message only: ``detail``).
K_STR, K_BYTES, K_BOOL, K_COMPLEX, K_NONE, K_TENSOR, K_OTHER, K_FLOAT, K_ARRAY = range(1, 10)
#: A Python int that no int64 (a label, a size) or no float64 (a reward, a weight) can hold, and
#: one in a rewards / values sequence that no float64 equals (beyond 2**53, odd bits).
K_BEYOND_INT64, K_BEYOND_FLOAT64, K_INEXACT_INT = 10, 11, 12
_ITEM_KINDS = {K_STR: "a str", K_BYTES: "bytes", K_BOOL: "a bool", K_COMPLEX: "a complex number", K_NONE: "None",
               K_TENSOR: "a tensor", K_OTHER: "not a number", K_FLOAT: "a float", K_ARRAY: "an array",
               K_BEYOND_INT64: "an int beyond int64", K_BEYOND_FLOAT64: "an int beyond float64's range",
               K_INEXACT_INT: "an int that float64 cannot hold exactly"}
#: Said of a K_BEYOND_* int when its value (a local ``detail``) is not at hand.
_BEYOND = {K_BEYOND_INT64: "|x| >= 2**63", K_BEYOND_FLOAT64: "|x| > 1.8e308", K_INEXACT_INT: "|x| > 2**53"}


def _what(kind: int, value: int, detail: str) -> str:
    """``kind`` in words, with the value the codes carry (a bool's, a float's bits) or ``detail``."""
    what = _ITEM_KINDS.get(kind, "not a number")
    if kind == K_BOOL:
        return f"{what} ({bool(value)})"
    if kind == K_FLOAT:
        return f"{what} ({bits_float(value)!r})"
    if kind == K_OTHER and detail:
        return detail  # its type and value: "a list ([1.0])"
    if kind in _BEYOND:
        return f"{what} ({detail or _BEYOND[kind]})"
    return f"{what} ({detail})" if detail and kind != K_NONE else what


# --- host problems: code -> (error class, its words from a, b, c and the local ``detail``) ---
HOST_PROBLEMS: dict = {}


def _problem(code: int, cls: type, words) -> int:
    """Host problem ``code``: its class and its words, a function of (a, b, c[, detail]) or a
    template of ``{a}``, ``{b}`` and ``{c}``."""
    HOST_PROBLEMS[code] = (cls, words if callable(words) else
                           lambda a, b, c, detail="": words.format(a=a, b=b, c=c))
    return code


def type_words(arg: str):
    def fmt(a, b, c, detail=""):
        if a == 1:  # an int beyond float64, somewhere (the entry is named by P_*_ENTRY where it is found)
            return f"{arg} must be a tensor or a sequence of floats; a value does not fit float64 (a Python int " \
                   "beyond 1.8e308?)"
        return f"{arg} must be a tensor or a sequence of floats" + (f"; got {detail}" if detail else "")
    return fmt


def dtype_words(arg: str, eq: str):
    return lambda a, b, c: (f"{arg} has dtype {dtype_name(a)}; {eq} needs a real floating dtype ({_INPUT_NAMES})"
                            + (f"; float8 is an output format only: pass {arg}.float() (exact)"
                               if dtype_name(a).startswith("float8") else ""))


def layout_words(arg: str):
    def fmt(a, b, c):
        name = _LAYOUT_NAMES[a - 1] if 1 <= a <= len(_LAYOUTS) else None
        if a == _NESTED_STRIDED or name == "jagged":  # torch reports a nested tensor's layout as strided
            return (f"{arg} is a nested tensor{' (layout torch.jagged)' if name else ''}; impl.gdpo reads "
                    "ordinary dense tensors only, not nested ones: pass one dense tensor")
        return (f"{arg} has layout {'torch.' + name if name else 'other than torch.strided'}; impl.gdpo reads "
                f"dense (strided) tensors only: convert it with {arg}.to_dense()")
    return fmt


def _sequence_words(rule: str, order: str, items: str):
    """P_WEIGHTS_TYPE's and P_SEGMENTS_TYPE's words: a is what was given instead (below; b: a
    tensor's dtype or dimension); ``order``: the order to pass them in, ``items``: whose they are."""
    def fmt(a, b, c, detail=""):
        return rule + {1: f"; got a mapping (pass the {order} order)", 2: "; got a string",
                       3: f"; got {detail or 'a set'}: set-like, so its order is no order of {items}",
                       4: f"; got a tensor of dtype {dtype_name(b)}", 5: f"; got a {b}-D tensor",
                       6: "; got NumPy bools", 7: "; got NumPy complex numbers",
                       8: f"; got {detail or 'an object'}, which is not iterable"}.get(a, "")
    return fmt


def _item_words(arg: str, where: str, rule: str, hint=lambda b, c: ""):
    """An item ``a`` of a sequence of numbers is what ``b`` says instead (``_what``)."""
    return lambda a, b, c, detail="": f"{arg}[{a}] ({where} {a}) is {_what(b, c, detail)}; {rule}{hint(b, c)}"


def _group_ids_type(a: int, b: int, c: int, detail: str = "") -> str:
    """a: the dtype code of a tensor or array of labels, or 0 (``detail``: what was given)."""
    if a:
        name = dtype_name(a)
        hint = (": float labels are refused by their dtype, whatever their values (convert whole-number "
                "labels to an integer dtype)" if name.startswith(("float", "bfloat")) else "")
        return f"group_ids must hold integer labels; got dtype {name}{hint}"
    return ("group_ids must be a 1-D sequence, tensor or array of integer labels; got "
            + (f"{detail}" if detail else "a value torch cannot read as one"))


#: How an entry of ``rewards`` / ``values`` torch could not read is shown: (arg, word for its columns).
_ENTRY_ARGS = {"rewards": "reward column", "values": "column"}


def entry_message(arg: str, a: int, b: int, c: int, detail: str = "", row: str = "row",
                  column: str | None = None) -> str:
    """Entry (row ``a``, column ``b``; -1: a 1-D sequence) of ``arg`` is ``c`` (K_*), not a real
    number. ``row``, ``column``: what an adapter calls them."""
    column = column or _ENTRY_ARGS.get(arg, "column")
    at = f"{arg}[{a}, {b}] ({row} {a}, {column} {b})" if b >= 0 else f"{arg}[{a}] ({row} {a})"
    return f"{at} is {_what(c, 0, detail)}; {arg} must be a tensor or a sequence of real numbers"


def ragged_message(arg: str, a: int, b: int, c: int, detail: str = "", row: str = "row") -> str:
    """Row ``a`` of ``arg`` has ``b`` entries (-1: it is no sequence) where row 0 has ``c``."""
    got = f"is {detail or 'no sequence'}" if b < 0 else f"has {b} entries"
    return (f"{arg}[{a}] ({row} {a}) {got} but {arg}[0] has {c}: the rows of {arg} must be sequences of one "
            "length")


#: The torch dtypes out_dtype may be, by name (those this torch has).
_OUT_NAMES = tuple(n for n in _DTYPE_NAMES[:8] if hasattr(torch, n))
#: Output dtypes whose range is a finite number the final cast can be checked against.
OUT_DTYPES = tuple(getattr(torch, n) for n in _OUT_NAMES)


def _out_dtype(a: int, b: int, c: int, detail: str = "") -> str:
    """a: the dtype code of a torch.dtype, or 0 for anything that is no torch.dtype (``detail``: what)."""
    rule = "out_dtype must be one of " + ", ".join(f"torch.{n}" for n in _OUT_NAMES)
    if a and a <= len(_DTYPES):
        return f"{rule}; got {dtype_name(a)}"
    return f"{rule}; got {detail or ('a value that is not a torch.dtype' if not a else 'another torch.dtype')}"


#: The classes an adapter's own refusal is named by in P_REFUSED (most specific first):
#: the agreement carries only the index, so every rank prints the same name.
REFUSAL_CLASSES = (GroupLengthError, WeightLengthError, NonFiniteError, InputDtypeError, ShapeError, GroupError,
                   WeightError, SegmentError, OutOfRangeError, DistributedError, GDPOError)


def refusal_code(exc: BaseException) -> int:
    """P_REFUSED's ``a``: 1 + the index of the first class in REFUSAL_CLASSES ``exc`` is an instance of."""
    return next((i + 1 for i, cls in enumerate(REFUSAL_CLASSES) if isinstance(exc, cls)), 0)


def _refused(a: int, b: int, c: int) -> str:
    name = REFUSAL_CLASSES[a - 1].__name__ if 1 <= a <= len(REFUSAL_CLASSES) else "an exception (no GDPOError)"
    return f"{name} raised by the caller's adapter before the call (chained on that rank)"


#: A tensor argument on a device impl does not compute on (P_DEVICE's a; its b: the device code).
ARG_REWARDS, ARG_VALUES, ARG_GROUP_IDS, ARG_WEIGHTS, ARG_SEGMENTS, ARG_EPS = 1, 2, 3, 4, 5, 6
_ARG_NAMES = dict(enumerate(("rewards", "values", "group_ids", "weights", "segment_sizes", "eps"), start=1))
_INTS = "(Python ints, NumPy integers)"

P_REWARDS_TYPE = _problem(1, InputDtypeError, type_words("rewards"))
P_REWARDS_DTYPE = _problem(2, InputDtypeError, dtype_words("rewards", "Eq. 4"))
P_REWARDS_NDIM = _problem(3, ShapeError, "rewards must be (N,) or (N, K); got a {a}-D tensor")
P_REWARDS_EMPTY = _problem(4, ShapeError, "rewards is empty (N={a} rows, K={b} reward columns)")
P_GROUPS_BOTH = _problem(5, GroupError, "pass exactly one of group_ids and group_size, not both")
P_GROUPS_NONE = _problem(6, GroupError, "pass exactly one of group_ids and group_size (got neither)")
#: a: what group_size is instead (K_*), b: a bool's value or a float's bits
P_GROUP_SIZE_TYPE = _problem(7, GroupError, lambda a, b, c, detail="": "group_size must be a Python int, a NumPy "
                             f"integer or a 0-d integer tensor (not a bool); got {_what(a, b, detail)}")
P_GROUP_SIZE_SMALL = _problem(8, GroupError, "group_size={a}: Eq. 4 needs groups of at least 2 samples (unbiased std)")
P_GROUP_SIZE_DIVIDE = _problem(9, GroupError, lambda a, b, c: f"N={a} rows is not a multiple of group_size={b}: "
                               f"the last group would hold {a % b} sample(s)")
P_GROUP_IDS_DTYPE = _problem(10, GroupError, _group_ids_type)
P_GROUP_IDS_NDIM = _problem(11, GroupLengthError, "group_ids must be 1-D (one label per row); got a {a}-D tensor")
P_GROUP_IDS_LENGTH = _problem(12, GroupLengthError, "group_ids has {a} labels but rewards has N={b} rows: the labels "
                              "do not cover the batch")
P_WEIGHTS_TYPE = _problem(13, WeightError, _sequence_words("weights must be a 1-D sequence or tensor of real numbers",
                                                           "weights in reward-column", "columns"))
P_WEIGHTS_LENGTH = _problem(14, WeightLengthError, "weights has length {a} but rewards has K={b} reward columns")
P_WEIGHTS_NONFINITE = _problem(15, WeightError, lambda a, b, c: f"weights[{a}] (reward column {a}) is {_KINDS[b]}")
P_WEIGHTS_ZERO = _problem(16, WeightError, "all {a} weights are zero: Eq. 7 would discard every reward")
P_WEIGHTS_INEXACT = _problem(17, WeightError, lambda a, b, c, detail="": f"weights[{a}] (reward column {a}) is " + (
    f"{detail or 'a number'}, beyond float64's range (|w| <= 1.797e308)" if b else
    "a number float64 cannot hold exactly"))
P_VALUES_TYPE = _problem(18, InputDtypeError, type_words("values"))
P_VALUES_DTYPE = _problem(19, InputDtypeError, dtype_words("values", "Eq. 6"))
P_VALUES_NDIM = _problem(20, ShapeError, "values must be 1-D (N,); got a {a}-D tensor")
P_SEGMENTS_TYPE = _problem(21, SegmentError, _sequence_words(
    "segment_sizes must be a 1-D sequence or tensor of non-negative ints", "sizes in unit", "units"))
P_SEGMENTS_NEGATIVE = _problem(22, SegmentError, "segment_sizes[{a}] (unit {a}) is {b} < 0")
P_SEGMENTS_SUM = _problem(23, SegmentError, lambda a, b, c: f"segment_sizes sum to "
                          f"{a if a >= 0 else 'more than 2**63 - 1'} but this rank holds {b} samples")
P_UNIT_OF_ONE = _problem(24, SegmentError, "unit {a} holds a single sample; Eq. 6 needs at least 2 (unbiased std)")
P_OUT_DTYPE = _problem(25, InputDtypeError, _out_dtype)
P_EPS = _problem(26, OutOfRangeError, lambda a, b, c, detail="": "eps is an int beyond float64's range "
                 "(|eps| > 1.8e308); eps must be finite and >= 0" if b else f"eps={bits_float(a)!r} must be finite "
                 "and >= 0")
P_LOCAL_FAILURE = _problem(28, GDPOError, "the local computation raised an unexpected exception (chained on that rank)")
#: integers beyond int64 cannot travel in the agreement table
P_GROUP_SIZE_INT64 = _problem(29, GroupError, lambda a, b, c, detail="": "group_size is beyond int64 (|group_size| "
                              ">= 2**63)" + (f": got {detail}" if detail else ""))
P_SEGMENT_INT64 = _problem(30, SegmentError, lambda a, b, c, detail="": f"segment_sizes[{a}] (unit {a}) is beyond "
                           "int64 (|size| >= 2**63)" + (f": got {detail}" if detail else ""))
P_DEVICE = _problem(31, InputDtypeError, lambda a, b, c: f"{_ARG_NAMES.get(a, 'an argument')} is on a device of "
                    f"type {_DEVICE_NAMES.get(b, b)}; impl.gdpo computes on CPU or CUDA tensors (float64 inside)")
#: a: what eps is instead (K_*), b: a bool's value
P_EPS_TYPE = _problem(32, InputDtypeError, lambda a, b, c, detail="": "eps must be a real number (an int, a float, a "
                      f"NumPy real scalar or a 0-d real tensor); got {_what(a, b, detail)}")
P_REFUSED = _problem(33, GDPOError, _refused)  # a: refusal_code of the adapter's refusal
P_WEIGHTS_ITEM = _problem(34, WeightError, _item_words(
    "weights", "reward column", "weights are real numbers (ints, floats, NumPy real scalars)",
    lambda b, c: "; pass the weights as one (K,) tensor or a list of numbers" if b == K_TENSOR else ""))
P_REWARDS_LAYOUT = _problem(35, InputDtypeError, layout_words("rewards"))
P_VALUES_LAYOUT = _problem(36, InputDtypeError, layout_words("values"))
P_GROUP_IDS_LAYOUT = _problem(37, GroupError, layout_words("group_ids"))
P_WEIGHTS_LAYOUT = _problem(38, WeightError, layout_words("weights"))
P_SEGMENTS_LAYOUT = _problem(39, SegmentError, layout_words("segment_sizes"))
#: b: what the label is instead (K_*); c: a bool's value, a float's bits, 1 for an int beyond int64
#: that a uint64 tensor could hold
P_GROUP_IDS_ITEM = _problem(40, GroupError, _item_words(
    "group_ids", "row", "group labels are int64 integers (Python ints, NumPy integers, or one integer tensor or "
    "array)", lambda b, c: "; labels from 2**63 to 2**64 - 1 may be passed as a uint64 tensor"
    if b == K_BEYOND_INT64 and c else ""))
P_SEGMENTS_ITEM = _problem(41, SegmentError, _item_words(
    "segment_sizes", "unit", f"segment_sizes must be a 1-D sequence or tensor of non-negative ints {_INTS}"))
#: a: the row; b: the column (-1: a 1-D sequence); c: what the entry is (K_*)
P_REWARDS_ENTRY = _problem(42, InputDtypeError, lambda a, b, c, detail="": entry_message("rewards", a, b, c, detail))
P_VALUES_ENTRY = _problem(43, InputDtypeError, lambda a, b, c, detail="": entry_message("values", a, b, c, detail))
#: a: the row; b: its length (-1: no sequence); c: row 0's length
P_REWARDS_RAGGED = _problem(44, InputDtypeError, lambda a, b, c, detail="": ragged_message("rewards", a, b, c, detail))
P_VALUES_RAGGED = _problem(45, InputDtypeError, lambda a, b, c, detail="": ragged_message("values", a, b, c, detail))
# Eq. 7 alone (impl.gdpo.combine) on given z, local only: its own words for z
P_Z_DTYPE = _problem(46, InputDtypeError, dtype_words("z", "Eq. 7"))
P_Z_NDIM = _problem(47, ShapeError, "z must be (N,) or (N, K); got a {a}-D tensor")
P_Z_EMPTY = _problem(48, ShapeError, "z is empty (N={a} rows, K={b} reward columns)")
P_Z_NONFINITE = _problem(49, NonFiniteError, lambda a, b, c: f"z[{a}, {b}] (row {a}, reward column {b}) is {_KINDS[c]}")
P_Z_OVERFLOW = _problem(50, OutOfRangeError, "Eq. 7 (sum of weights x standardized rewards) overflows float64 at "
                        "row {a}; the weights are too large, scale them down")
P_MISSING = _problem(51, InputDtypeError, lambda a, b, c, detail="": "missing must be 'refuse' (a NaN reward is "
                     "refused, the default) or 'unscored' (a NaN reward is one its reward function did not score); "
                     f"got {detail or 'another value'}")
P_CERTIFIED = _problem(52, InputDtypeError, lambda a, b, c, detail="": "certified must be None (GDPO_CERTIFIED, else "
                       "'narrow'), 'narrow' (float32, bfloat16 and float16 outputs certified), 'all' or True (float64 "
                       f"too), or 'off' or False (the plain path); got {detail or 'another value'}")
#: a: 1 flush-to-zero + 2 denormals-are-zero (spec.errors.flush_modes)
P_PROCESS_STATE = _problem(53, GDPOError, lambda a, b, c: str(process_state_error((bool(a & 1), bool(a & 2)))))
P_DIAGNOSTICS = _problem(54, InputDtypeError, lambda a, b, c, detail="": "diagnostics must be an "
                         f"impl.gdpo.Diagnostics (or None); got {detail or 'another value'}")


def host_error(code: int, a: int = 0, b: int = 0, c: int = 0, detail: str = "") -> GDPOError:
    """The error of a host problem; ``detail`` (the caller's value, as text) is named in this
    local message only (the agreement carries integers)."""
    cls, fmt = HOST_PROBLEMS[code]
    return cls(fmt(a, b, c, detail) if detail else fmt(a, b, c))


# --- the facts row's problems ------------------------------------------------------------------
def _kind(bits: int) -> int:
    """0 for a finite value, else 1 nan, 2 +inf, 3 -inf (from float64 bits)."""
    x = bits_float(bits)
    return 1 if x != x else 0 if math.isfinite(x) else 2 if x > 0 else 3


def _label(row, col: int) -> int:
    """The caller's label in ``row[col]``: uint64 labels travel as their int64 bits."""
    return row[col] % (1 << 64) if row[LABELS_UINT64] else row[col]


def _group_of(row, at: int, label_col: int) -> str:
    if row[BY_LABEL]:
        return f"group label {_label(row, label_col)}"
    return f"group {at // max(row[GROUP_SIZE], 1)} (contiguous, group_size)"


def row_problems(row) -> list[tuple[type, str]]:
    """Problems recorded in one facts row, most fundamental first."""
    if row[HOST_CODE]:
        cls, fmt = HOST_PROBLEMS[row[HOST_CODE]]
        return [(cls, fmt(row[HOST_A], row[HOST_B], row[HOST_C]))]
    out = []
    k, kind = max(row[K], 1), _kind(row[NF_REWARD_KIND])
    if kind:
        i, j = divmod(row[NF_REWARD], k)
        out.append((NonFiniteError,
                    f"rewards[{i}, {j}] (row {i}, reward column {j}, {_group_of(row, i, NF_REWARD_GROUP)}) is "
                    f"{_KINDS[kind]}" + ("; missing='unscored' reads a NaN reward as not scored, never an infinity"
                                         if row[MISSING] == MISSING_CODES["unscored"] else "")))
    if row[BY_LABEL] and row[SINGLETON] < row[ROWS]:
        others = row[SINGLETONS] - 1
        out.append((GroupError,
                    f"group label {_label(row, SINGLETON_LABEL)} (first row {row[SINGLETON]}) has 1 sample"
                    + ("" if others <= 0 else ", as does 1 other group" if others == 1 else
                       f", as do {others} other groups") + "; Eq. 4 needs at least 2 (unbiased std)"))
    if _kind(row[C_OVERFLOW_BITS]) and not out:
        out.append((OutOfRangeError,
                    f"Eq. 7 (sum of weights x standardized rewards) overflows float64 at row "
                    f"{row[C_OVERFLOW]} ({_group_of(row, row[C_OVERFLOW], C_OVERFLOW_GROUP)}); "
                    "the weights are too large, scale them down"))
    kind = _kind(row[NF_VALUE_KIND])
    if kind and not out:
        out.append((NonFiniteError, f"values[{row[NF_VALUE]}] (unit {row[NF_VALUE_UNIT]}) is {_KINDS[kind]}"))
    return out


def raise_local(row) -> None:
    problems = row_problems(row)
    if problems:
        cls, msg = problems[0]
        raise cls(msg)


# --- the agreed table's problems ---------------------------------------------------------------
def _by_value(values: dict[int, object]) -> str:
    groups: dict[object, list[int]] = {}
    for rank, v in values.items():
        groups.setdefault(v, []).append(rank)
    return "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {v}"
                     for v, r in groups.items())


def _healthy(table: list[list[int]]) -> list[int]:
    """The ranks a refusal compares: those with no problem of their own (else all)."""
    return [r for r, row in enumerate(table) if not row_problems(row)] or list(range(len(table)))


def weights_disagree(table: list[list[int]]) -> bool:
    """gdpo_advantages on every rank and, among the ranks compared (:func:`_healthy`), one K, no
    host refusal and different weights: the refusal then shows each rank's weights in its words."""
    rows = [table[r] for r in _healthy(table)]
    if len({row[API] for row in table}) != 1 or table[0][API] != API_GDPO or len({row[K] for row in rows}) != 1:
        return False
    return not any(row[HOST_CODE] for row in rows) and len({row[WEIGHTS_FP] for row in rows}) > 1


def weights_words(values, names=None) -> str:
    """A rank's weights as its peers read them: shortest round-trip floats; an adapter's as
    {name: weight} in :func:`weights_fingerprint`'s order."""
    if names is not None:
        return "{" + ", ".join(f"{n}: {w}" for n, w in _named(values, names)) + "}"
    return "[" + ", ".join(repr(float(x)) for x in values) + "]"


def _code_name(codes: dict[str, int]):
    return lambda x: repr(next((n for n, c in codes.items() if c == x), "?"))


#: What every rank must share, beyond the function and the units: (column, what differs, how a value reads).
_SHARED = ((DTYPE, "input dtypes differ", dtype_name), (OUT_DTYPE, "out_dtype differs", dtype_name),
           (DEVICE, "device types differ", lambda x: _DEVICE_NAMES.get(x, "?")),
           (EPS_BITS, "eps differs", lambda x: repr(bits_float(x))),
           (MISSING, "the missing policy differs", _code_name(MISSING_CODES)),
           (CERTIFIED, "the certified mode differs", _code_name(CERTIFIED_CODES)),
           (K, "the number of reward columns K differs", lambda x: f"K={x}"))


def table_problems(table: list[list[int]], words: dict[int, str] | None = None) -> list[str]:
    """Reasons to refuse, from the agreed (world_size, ROW_WIDTH) table: the same on every rank.
    ``words``: the refusing ranks' own messages (exchanged on the refusal path), in place of what
    their codes say."""
    world = len(table)
    reasons = []
    missing = [r for r in range(world) if table[r][PRESENT] != 1]
    if missing:
        reasons.append(f"ranks {missing} did not fill their row of the agreement table")
    seqs = {r: table[r][UNJOINED] for r in range(world)}
    if len(set(seqs.values())) > 1:  # different calls may meet here: nothing else in the rows is comparable
        reasons.append("ranks may be meeting calls of different steps: calls whose process_group was not a "
                       "ProcessGroup, each of which raised on its rank alone (" + _by_value(seqs) + "); a peer "
                       "that waited for such a call meets a later call of that rank instead, so while these "
                       "counts differ every call on a process group is refused on every rank; end the run "
                       "when a rank raises (or make every rank make the same calls)")
        return reasons
    for r, row in enumerate(table):
        probs = row_problems(row)
        if probs and row[HOST_CODE] and words and r in words:
            said = words[r]
            if row[HOST_CODE] == P_REFUSED:  # an adapter's refusal: its class and message
                said = _refused(row[HOST_A], 0, 0).replace(" (chained on that rank)", "") + f": {said}"
            elif row[HOST_CODE] == P_LOCAL_FAILURE:  # an unexpected exception: its type and message
                said = f"the local computation raised {said} (chained on that rank)"
            probs = [(probs[0][0], said)]  # else impl's own message, with the values the codes cannot carry
        reasons += [f"rank {r}: {cls.__name__}: {msg}" for cls, msg in probs]
    consider = _healthy(table)

    def differ(col, said) -> bool:
        vals = {r: table[r][col] for r in consider}
        if len(set(vals.values())) > 1:
            reasons.append(said(vals))
        return len(set(vals.values())) > 1

    if differ(API, lambda v: "ranks call different functions ("
              + _by_value({r: API_NAMES.get(x, "?") for r, x in v.items()}) + ")"):
        return reasons  # nothing else is comparable between different calls
    if not differ(SEG_NONE, lambda v: "segment_sizes is None on some ranks but given on others ("
                  + _by_value({r: "None (one unit)" if x else "segment_sizes given" for r, x in v.items()}) + ")"):
        differ(UNITS, lambda v: "ranks disagree on the number of whitening units ("
               + _by_value({r: f"{x} units" for r, x in v.items()}) + ")")
    for col, what, show in _SHARED:
        differ(col, lambda v: f"{what} across ranks (" + _by_value({r: show(x) for r, x in v.items()}) + ")")
    if len({table[r][K] for r in consider}) == 1:  # with different K the weights differ anyway
        said = words or {}
        fps = {r: table[r][WEIGHTS_FP] for r in consider}
        if all(r in said and not table[r][HOST_CODE] for r in consider) \
                and len({said[r] for r in consider}) == len(set(fps.values())):  # each rank's weights, in its words
            # (words cut at WORDS_BYTES could make different weights read alike: then the digests)
            named = any(said[r].startswith("{") for r in consider)  # an adapter's {name: weight}
            differ(WEIGHTS_FP, lambda v: ("reward names or weights" if named else "weights")
                   + " differ across ranks (" + _by_value({r: said[r] for r in v})
                   + ("" if not any(_signed_zero(said[r]) for r in v) else
                      "; compared bit for bit: -0.0 and 0.0 differ") + ")")
        else:
            differ(WEIGHTS_FP, lambda v: "weights (or an adapter's reward names) differ across ranks ("
                   + _by_value({r: f"digest {x:#x}" for r, x in v.items()})
                   + "; the digest of the float64 bits of the K weights, and of the names an adapter "
                   "passes: -0.0 and 0.0 differ)")
    return reasons


def _signed_zero(words: str) -> bool:
    """Do a rank's stated weights hold a zero (whose sign the comparison reads)?"""
    return bool(re.search(r"(?<![\d.e])-?0\.0(?![\d])", words))


def refusal_message(reasons: list[str], table: list[list[int]], global_ranks: list[int] | None = None) -> str:
    """The message every rank raises, from the agreed table only (rank 0's function name)."""
    apis = {row[API] for row in table}
    api = API_NAMES.get(table[0][API], "GDPO") if len(apis) == 1 else "impl.gdpo"  # ranks called different ones
    where = f"all {len(table)} ranks"
    if global_ranks is not None and list(global_ranks) != list(range(len(table))):
        shown = ", ".join(map(str, global_ranks[:16])) + (", ..." if len(global_ranks) > 16 else "")
        where += f" of the process group (ranks below are its own; global ranks {shown})"
    return f"{api} refused on {where}: " + "; ".join(reasons)
