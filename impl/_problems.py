"""Refusals as data: problem codes, the facts row, and the messages built from it.

Every check produces integers, never a string: a problem is ``(code, a, b, c)``
and device-side findings (first non-finite reward, a group of one, ...) are
int64 entries of a fixed-layout *facts row*. Without a process group the row is
read once and the first problem is raised as its own class. With a process
group every rank puts its row into one (world_size, ROW_WIDTH) table, one
all-reduce later every rank holds every rank's row, and the same function
below turns that table into the same message on every rank.
"""

from __future__ import annotations

import hashlib
import math
import re
import struct

import torch

from spec.errors import (
    DistributedError,
    GDPOError,
    GroupError,
    GroupLengthError,
    InputDtypeError,
    NonFiniteError,
    OutOfRangeError,
    SegmentError,
    ShapeError,
    WeightError,
    WeightLengthError,
    process_state_error,
)


# --- error classes for cases the contract files under two headings ----------
# (GroupLengthError and WeightLengthError are the spec's, in spec.errors; imported above)


class DistributedSegmentError(DistributedError, SegmentError):
    """A unit holds one sample across all ranks: raised on every rank together."""


class DistributedOutOfRangeError(DistributedError, OutOfRangeError):
    """A whitened value does not survive the cast on some rank: raised on every rank."""


# --- the facts row -----------------------------------------------------------
#
# Host fields are filled by the host. Device fields are *raw* device values
# (an index, the bits of the value found there, a label), read once and
# interpreted here on the host: the device does no branching to find out
# whether something is wrong, and zeros decode as "nothing wrong".

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
#: Host field: 1 when this row's labels were uint64. They travel as int64 (their bits: equal
#: labels stay equal), and the label fields above are printed as the caller's values from it.
LABELS_UINT64 = 32
#: Host field: how many calls whose process_group was no group this process has made
#: (impl._distributed). Ranks whose numbers differ may be pairing different calls: a rank
#: made a call its peers may have waited for in vain.
UNJOINED = 33
#: Host field: the call's ``missing`` policy (MISSING_CODES: 1 "refuse", 2 "unscored"), which
#: every rank must share; and, under "unscored", this rank's rows with no scored reward.
MISSING, UNSCORED = 34, 35
#: Host field: the certificate's mode (CERTIFIED_CODES), which every rank must share: it decides
#: whether the certificate's statistics ride in collective 2.
CERTIFIED = 36
#: Local sample counts of the first COUNT_SLOTS units ride along with the
#: agreement, so a unit of one is caught there without a second host read.
COUNTS = 37
COUNT_SLOTS = 32
ROW_WIDTH = COUNTS + COUNT_SLOTS

DEVICE_FIELDS = tuple(range(NF_REWARD, SINGLETONS + 1))

API_WHITEN, API_GDPO = 1, 2
API_NAMES = {API_WHITEN: "whiten", API_GDPO: "gdpo_advantages"}

_DTYPE_NAMES = (
    "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
    "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
    "complex128", "complex64", "complex32", "bool", "uint8", "int8", "int16",
    "int32", "int64", "uint16", "uint32", "uint64",
)
_DTYPES = tuple(getattr(torch, n) for n in _DTYPE_NAMES if hasattr(torch, n))


#: dtype -> its code in the facts row (1-based; another dtype: len + 1)
DTYPE_CODES = {d: i + 1 for i, d in enumerate(_DTYPES)}


def dtype_code(dtype) -> int:
    return DTYPE_CODES.get(dtype, len(_DTYPES) + 1)


def dtype_name(code: int) -> str:
    return str(_DTYPES[code - 1]).replace("torch.", "") if 1 <= code <= len(_DTYPES) else "another dtype"


#: The dtypes rewards and values may have (the formats of the contract; float8 is an
#: output format only: widen float8 inputs to float32 first, exactly).
INPUT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
_INPUT_NAMES = "float16, bfloat16, float32 or float64"

#: Non-strided layouts, by code (0: a dense strided tensor, no problem).
_LAYOUT_NAMES = ("sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "jagged", "_mkldnn")
_LAYOUTS = tuple(getattr(torch, n, None) for n in _LAYOUT_NAMES)
_NESTED_STRIDED = len(_LAYOUTS) + 1
_OTHER_LAYOUT = len(_LAYOUTS) + 2


def layout_code(t: torch.Tensor) -> int:
    """0 for a dense strided tensor; else which layout it has (nested tensors included)."""
    if t.layout == torch.strided:
        return _NESTED_STRIDED if t.is_nested else 0
    return _LAYOUTS.index(t.layout) + 1 if t.layout in _LAYOUTS else _OTHER_LAYOUT


def _layout(arg: str):
    def fmt(a, b, c):
        name = _LAYOUT_NAMES[a - 1] if 1 <= a <= len(_LAYOUTS) else None
        if a == _NESTED_STRIDED or name == "jagged":  # torch reports a nested tensor's layout as strided
            return (f"{arg} is a nested tensor{' (layout torch.jagged)' if name else ''}; impl.gdpo reads "
                    "ordinary dense tensors only, not nested ones: pass one dense tensor")
        return (f"{arg} has layout {'torch.' + name if name else 'other than torch.strided'}; impl.gdpo reads "
                f"dense (strided) tensors only: convert it with {arg}.to_dense()")
    return fmt


def device_code(device: torch.device) -> int:
    return {"cpu": 1, "cuda": 2}.get(device.type, 3)


_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "other than CPU and CUDA (e.g. meta or mps)"}


def float_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def bits_float(b: int) -> float:
    return struct.unpack("<d", struct.pack("<q", int(b)))[0]


def weights_fingerprint(values, names=None) -> int:
    """62-bit digest of the float64 weight bits (equal weights, equal digest). An adapter's
    reward names go in with them, paired and in name order: ranks whose names differ
    differ, ranks whose mappings only list them in another order agree."""
    if names is None:
        blob = struct.pack(f"<{len(values)}d", *values)
    else:
        blob = repr(_named(values, names)).encode()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little") >> 2


def _named(values, names) -> list[tuple[str, str]]:
    """(name, weight) of an adapter's columns, as text, in the order of the names' reprs."""
    return sorted((repr(n), repr(float(w))) for n, w in zip(names, values))


_KINDS = {1: "nan", 2: "inf", 3: "-inf"}


def _group(label: int, by_label: int) -> str:
    return f"group label {label}" if by_label else f"group {label} (contiguous, group_size)"


# --- host-side problem codes: code -> (error class, message(a, b, c)) ---------

P_REWARDS_TYPE = 1
P_REWARDS_DTYPE = 2
P_REWARDS_NDIM = 3
P_REWARDS_EMPTY = 4
P_GROUPS_BOTH = 5
P_GROUPS_NONE = 6
P_GROUP_SIZE_TYPE = 7
P_GROUP_SIZE_SMALL = 8
P_GROUP_SIZE_DIVIDE = 9
P_GROUP_IDS_DTYPE = 10
P_GROUP_IDS_NDIM = 11
P_GROUP_IDS_LENGTH = 12
P_WEIGHTS_TYPE = 13
P_WEIGHTS_LENGTH = 14
P_WEIGHTS_NONFINITE = 15
P_WEIGHTS_ZERO = 16
P_WEIGHTS_INEXACT = 17
P_VALUES_TYPE = 18
P_VALUES_DTYPE = 19
P_VALUES_NDIM = 20
P_SEGMENTS_TYPE = 21
P_SEGMENTS_NEGATIVE = 22
P_SEGMENTS_SUM = 23
P_UNIT_OF_ONE = 24
P_OUT_DTYPE = 25
P_EPS = 26
P_LOCAL_FAILURE = 28
P_GROUP_SIZE_INT64 = 29  # integers beyond int64 cannot travel in the agreement table
P_SEGMENT_INT64 = 30
P_DEVICE = 31  # a: the argument (ARG_*); b: device code
ARG_REWARDS, ARG_VALUES, ARG_GROUP_IDS, ARG_WEIGHTS, ARG_SEGMENTS, ARG_EPS = 1, 2, 3, 4, 5, 6
_ARG_NAMES = {ARG_REWARDS: "rewards", ARG_VALUES: "values", ARG_GROUP_IDS: "group_ids", ARG_WEIGHTS: "weights",
              ARG_SEGMENTS: "segment_sizes", ARG_EPS: "eps"}
P_EPS_TYPE = 32  # a: what eps is instead of a real number
P_REFUSED = 33  # a: 1 + the index of the refusal's class in REFUSAL_CLASSES (0: another exception)
P_WEIGHTS_ITEM = 34  # a: the index; b: what the item is instead of a real number (_ITEM_KINDS); c: a bool's value
P_REWARDS_LAYOUT = 35  # a: layout_code (sparse, nested, ...)
P_VALUES_LAYOUT = 36
P_GROUP_IDS_LAYOUT = 37
P_WEIGHTS_LAYOUT = 38
P_SEGMENTS_LAYOUT = 39
#: a: the row; b: what the label is instead of an int64 (_ITEM_KINDS); c: a bool's value, a float's bits,
#: 1 for an int beyond int64 a uint64 tensor could hold
P_GROUP_IDS_ITEM = 40
P_SEGMENTS_ITEM = 41  # a: the unit; b, c: as P_GROUP_IDS_ITEM's
P_REWARDS_ENTRY = 42  # a: the row; b: the column (-1: a 1-D sequence); c: what the entry is (_ITEM_KINDS)
P_VALUES_ENTRY = 43
P_REWARDS_RAGGED = 44  # a: the row; b: its length (-1: no sequence); c: row 0's length
P_VALUES_RAGGED = 45
#: Eq. 7 alone (impl.gdpo.combine) on given z, local only: its own words for z
P_Z_DTYPE = 46  # a: dtype code
P_Z_NDIM = 47  # a: ndim
P_Z_EMPTY = 48  # a: N, b: K
P_Z_NONFINITE = 49  # a: row, b: column, c: kind (_KINDS)
P_Z_OVERFLOW = 50  # a: row
P_MISSING = 51  # a: 0 (not a str) or 1 (another str); detail: the caller's value
P_CERTIFIED = 52  # detail: the caller's value
P_PROCESS_STATE = 53  # a: 1 flush-to-zero + 2 denormals-are-zero (spec.errors.flush_modes)
P_DIAGNOSTICS = 54  # detail: the caller's value

#: The ``missing`` policies (spec/gdpo.md section 2) and their codes in the agreement row.
MISSING_CODES = {"refuse": 1, "unscored": 2}
#: The certificate's modes (``impl._certify``) and their codes in the agreement row.
CERTIFIED_CODES = {"narrow": 1, "all": 2, "off": 3}

#: The classes an adapter's own refusal is named by in P_REFUSED (most specific first):
#: the agreement carries only the index, so every rank prints the same name.
REFUSAL_CLASSES = (GroupLengthError, WeightLengthError, NonFiniteError, InputDtypeError, ShapeError, GroupError,
                   WeightError, SegmentError, OutOfRangeError, DistributedError, GDPOError)


def refusal_code(exc: BaseException) -> int:
    """P_REFUSED's ``a``: 1 + the index of the first class in REFUSAL_CLASSES ``exc`` is an instance of."""
    return next((i + 1 for i, cls in enumerate(REFUSAL_CLASSES) if isinstance(exc, cls)), 0)


#: What a weight (or group_size) is instead of a real number (an integer): codes of
#: P_WEIGHTS_ITEM's ``b`` and P_GROUP_SIZE_TYPE's ``a``. Strings travel in no agreement,
#: so the value itself is named only in the local message (``detail``).
K_STR, K_BYTES, K_BOOL, K_COMPLEX, K_NONE, K_TENSOR, K_OTHER, K_FLOAT, K_ARRAY = range(1, 10)
#: A Python int that no int64 (a label, a size) or no float64 (a reward, a weight) can hold.
K_BEYOND_INT64, K_BEYOND_FLOAT64 = 10, 11
#: A Python int in a rewards / values sequence that no float64 equals (beyond 2**53, odd bits).
K_INEXACT_INT = 12
_ITEM_KINDS = {K_STR: "a str", K_BYTES: "bytes", K_BOOL: "a bool", K_COMPLEX: "a complex number", K_NONE: "None",
               K_TENSOR: "a tensor", K_OTHER: "not a number", K_FLOAT: "a float", K_ARRAY: "an array",
               K_BEYOND_INT64: "an int beyond int64", K_BEYOND_FLOAT64: "an int beyond float64's range",
               K_INEXACT_INT: "an int that float64 cannot hold exactly"}
#: Said of a K_BEYOND_* int when its value (a local ``detail``) is not at hand.
_BEYOND = {K_BEYOND_INT64: "|x| >= 2**63", K_BEYOND_FLOAT64: "|x| > 1.8e308", K_INEXACT_INT: "|x| > 2**53"}


def _what(kind: int, value: int, detail: str) -> str:
    """``kind`` in words, with the value where the codes carry it (a bool's, a float's
    bits) or the caller's value ``detail`` (the local message only)."""
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


def _weight_item(a: int, b: int, c: int, detail: str = "") -> str:
    return (f"weights[{a}] (reward column {a}) is {_what(b, c, detail)}; weights are real numbers "
            "(ints, floats, NumPy real scalars)" + ("; pass the weights as one (K,) tensor or a list of numbers"
                                                     if b == K_TENSOR else ""))


def _group_size_type(a: int, b: int, c: int, detail: str = "") -> str:
    """a: what group_size is (_ITEM_KINDS); b: a bool's value, a float's bits, a tensor's
    dtype code (c = 0) or dimension count (c = 1), an array's dimension count."""
    if a == K_TENSOR:
        got = f"a {b}-D tensor" if c else f"a tensor of dtype {dtype_name(b)}"
    elif a == K_ARRAY:
        got = f"a {b}-D array"
    else:
        got = _what(a, b, detail)
    return f"group_size must be a Python int, a NumPy integer or a 0-d integer tensor (not a bool); got {got}"


def _group_ids_item(a: int, b: int, c: int, detail: str = "") -> str:
    hint = "; labels from 2**63 to 2**64 - 1 may be passed as a uint64 tensor" if b == K_BEYOND_INT64 and c else ""
    return (f"group_ids[{a}] (row {a}) is {_what(b, c, detail)}; group labels are int64 integers (Python ints, "
            f"NumPy integers, or one integer tensor or array){hint}")


def _group_ids_type(a: int, b: int, c: int, detail: str = "") -> str:
    """a: the dtype code of a tensor or array of labels, or 0 (``detail``: what was given)."""
    if a:
        name = dtype_name(a)
        hint = (": float labels are refused by their dtype, whatever their values (convert whole-number "
                "labels to an integer dtype)" if name.startswith(("float", "bfloat")) else "")
        return f"group_ids must hold integer labels; got dtype {name}{hint}"
    return ("group_ids must be a 1-D sequence, tensor or array of integer labels; got "
            + (f"{detail}" if detail else "a value torch cannot read as one"))


def _segments_item(a: int, b: int, c: int, detail: str = "") -> str:
    return (f"segment_sizes[{a}] (unit {a}) is {_what(b, c, detail)}; segment_sizes must be a 1-D sequence or "
            "tensor of non-negative ints (Python ints, NumPy integers)")


def _segments_type(a: int, b: int, c: int, detail: str = "") -> str:
    got = {1: "; got a mapping (pass the sizes in unit order)", 2: "; got a string",
           3: f"; got {detail or 'a set'}: set-like, so its order is no order of units",
           4: f"; got a tensor of dtype {dtype_name(b)}", 5: f"; got a {b}-D tensor", 8: f"; got {detail or 'an object'}, which is not iterable"}.get(a, "")
    return "segment_sizes must be a 1-D sequence or tensor of non-negative ints" + got


#: How an entry of ``rewards`` / ``values`` torch could not read is shown: (arg, word for its columns).
_ENTRY_ARGS = {"rewards": "reward column", "values": "column"}


def entry_message(arg: str, a: int, b: int, c: int, detail: str = "", row: str = "row",
                  column: str | None = None) -> str:
    """An entry of a Python/NumPy sequence ``arg`` torch cannot read as real numbers: a row ``a``,
    column ``b`` (-1: a 1-D sequence), what it is ``c`` (_ITEM_KINDS). ``row``, ``column``: what
    an adapter calls them."""
    column = column or _ENTRY_ARGS.get(arg, "column")
    at = f"{arg}[{a}, {b}] ({row} {a}, {column} {b})" if b >= 0 else f"{arg}[{a}] ({row} {a})"
    return f"{at} is {_what(c, 0, detail)}; {arg} must be a tensor or a sequence of real numbers"


def ragged_message(arg: str, a: int, b: int, c: int, detail: str = "", row: str = "row") -> str:
    """Row ``a`` of ``arg`` has ``b`` entries (-1: it is no sequence) where row 0 has ``c``."""
    got = f"is {detail or 'no sequence'}" if b < 0 else f"has {b} entries"
    return (f"{arg}[{a}] ({row} {a}) {got} but {arg}[0] has {c}: the rows of {arg} must be sequences of one "
            "length")


def _type_message(arg: str):
    def fmt(a, b, c, detail=""):
        if a == 1:  # an int beyond float64, somewhere (the entry is named by P_*_ENTRY where it is found)
            return f"{arg} must be a tensor or a sequence of floats; a value does not fit float64 (a Python int " \
                   "beyond 1.8e308?)"
        return f"{arg} must be a tensor or a sequence of floats" + (f"; got {detail}" if detail else "")
    return fmt


#: The torch dtypes out_dtype may be, by name (those this torch has).
_OUT_NAMES = tuple(n for n in ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
                               "float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, n))


def _out_dtype(a: int, b: int, c: int, detail: str = "") -> str:
    """a: the dtype code of a torch.dtype, or 0 for anything that is no torch.dtype (``detail``: what)."""
    rule = "out_dtype must be one of " + ", ".join(f"torch.{n}" for n in _OUT_NAMES)
    if a and a <= len(_DTYPES):
        return f"{rule}; got {dtype_name(a)}"
    return f"{rule}; got {detail or ('a value that is not a torch.dtype' if not a else 'another torch.dtype')}"


def _refused(a: int, b: int, c: int) -> str:
    name = REFUSAL_CLASSES[a - 1].__name__ if 1 <= a <= len(REFUSAL_CLASSES) else "an exception (no GDPOError)"
    return f"{name} raised by the caller's adapter before the call (chained on that rank)"


HOST_PROBLEMS = {
    P_REWARDS_TYPE: (InputDtypeError, _type_message("rewards")),
    P_REWARDS_DTYPE: (InputDtypeError, lambda a, b, c:
                      f"rewards has dtype {dtype_name(a)}; Eq. 4 needs a real floating dtype "
                      f"({_INPUT_NAMES})" + _float8_hint("rewards", a)),
    P_REWARDS_NDIM: (ShapeError, lambda a, b, c:
                     f"rewards must be (N,) or (N, K); got a {a}-D tensor"),
    P_REWARDS_EMPTY: (ShapeError, lambda a, b, c:
                      f"rewards is empty (N={a} rows, K={b} reward columns)"),
    P_GROUPS_BOTH: (GroupError, lambda a, b, c: "pass exactly one of group_ids and group_size, not both"),
    P_GROUPS_NONE: (GroupError, lambda a, b, c: "pass exactly one of group_ids and group_size (got neither)"),
    P_GROUP_SIZE_TYPE: (GroupError, _group_size_type),
    P_GROUP_SIZE_SMALL: (GroupError, lambda a, b, c:
                         f"group_size={a}: Eq. 4 needs groups of at least 2 samples (unbiased std)"),
    P_GROUP_SIZE_DIVIDE: (GroupError, lambda a, b, c:
                          f"N={a} rows is not a multiple of group_size={b}: the last group would hold "
                          f"{a % b} sample(s)"),
    P_GROUP_IDS_DTYPE: (GroupError, _group_ids_type),
    P_GROUP_IDS_NDIM: (GroupLengthError, lambda a, b, c:
                       f"group_ids must be 1-D (one label per row); got a {a}-D tensor"),
    P_GROUP_IDS_LENGTH: (GroupLengthError, lambda a, b, c:
                         f"group_ids has {a} labels but rewards has N={b} rows: the labels do not "
                         "cover the batch"),
    P_WEIGHTS_TYPE: (WeightError, lambda a, b, c, detail="":
                     "weights must be a 1-D sequence or tensor of real numbers"
                     + {1: "; got a mapping (pass the weights in reward-column order)", 2: "; got a string",
                        3: f"; got {detail or 'a set'}: set-like, so its order is no order of columns",
                        4: f"; got a tensor of dtype {dtype_name(b)}",
                        5: f"; got a {b}-D tensor", 6: "; got NumPy bools",
                        7: "; got NumPy complex numbers",
                        8: f"; got {detail or 'an object'}, which is not iterable"}.get(a, "")),
    P_WEIGHTS_LENGTH: (WeightLengthError, lambda a, b, c:
                       f"weights has length {a} but rewards has K={b} reward columns"),
    P_WEIGHTS_NONFINITE: (WeightError, lambda a, b, c: f"weights[{a}] (reward column {a}) is {_KINDS[b]}"),
    P_WEIGHTS_ZERO: (WeightError, lambda a, b, c: f"all {a} weights are zero: Eq. 7 would discard every reward"),
    P_WEIGHTS_INEXACT: (WeightError, lambda a, b, c, detail="":
                        f"weights[{a}] (reward column {a}) is " + (
                            f"{detail or 'a number'}, beyond float64's range (|w| <= 1.797e308)" if b else
                            "a number float64 cannot hold exactly")),
    P_VALUES_TYPE: (InputDtypeError, _type_message("values")),
    P_VALUES_DTYPE: (InputDtypeError, lambda a, b, c:
                     f"values has dtype {dtype_name(a)}; Eq. 6 needs a real floating dtype ({_INPUT_NAMES})"
                     + _float8_hint("values", a)),
    P_VALUES_NDIM: (ShapeError, lambda a, b, c: f"values must be 1-D (N,); got a {a}-D tensor"),
    P_SEGMENTS_TYPE: (SegmentError, _segments_type),
    P_SEGMENTS_NEGATIVE: (SegmentError, lambda a, b, c: f"segment_sizes[{a}] (unit {a}) is {b} < 0"),
    P_SEGMENTS_SUM: (SegmentError, lambda a, b, c:
                     f"segment_sizes sum to {a if a >= 0 else 'more than 2**63 - 1'} but this rank "
                     f"holds {b} samples"),
    P_UNIT_OF_ONE: (SegmentError, lambda a, b, c:
                    f"unit {a} holds a single sample; Eq. 6 needs at least 2 (unbiased std)"),
    P_OUT_DTYPE: (InputDtypeError, _out_dtype),
    P_EPS: (OutOfRangeError, lambda a, b, c, detail="":
            "eps is an int beyond float64's range (|eps| > 1.8e308); eps must be finite and >= 0" if b else
            f"eps={bits_float(a)!r} must be finite and >= 0"),
    P_EPS_TYPE: (InputDtypeError, lambda a, b, c:
                 "eps must be a real number (an int, a float, a NumPy real scalar or a 0-d real tensor); got "
                 + {1: "None", 2: "a bool", 3: "a string", 4: "a complex number",
                    5: "a sequence or an array of more than 0 dimensions"}.get(a, "another type")),
    P_LOCAL_FAILURE: (GDPOError, lambda a, b, c:
                      "the local computation raised an unexpected exception (chained on that rank)"),
    P_GROUP_SIZE_INT64: (GroupError, lambda a, b, c, detail="":
                         "group_size is beyond int64 (|group_size| >= 2**63)" + (f": got {detail}" if detail else "")),
    P_DEVICE: (InputDtypeError, lambda a, b, c:
               f"{_ARG_NAMES.get(a, 'an argument')} is on a device of type {_DEVICE_NAMES.get(b, b)}; "
               "impl.gdpo computes on CPU or CUDA tensors (float64 inside)"),
    P_SEGMENT_INT64: (SegmentError, lambda a, b, c, detail="":
                      f"segment_sizes[{a}] (unit {a}) is beyond int64 (|size| >= 2**63)"
                      + (f": got {detail}" if detail else "")),
    P_REFUSED: (GDPOError, _refused),
    P_WEIGHTS_ITEM: (WeightError, _weight_item),
    P_REWARDS_LAYOUT: (InputDtypeError, _layout("rewards")),
    P_VALUES_LAYOUT: (InputDtypeError, _layout("values")),
    P_GROUP_IDS_LAYOUT: (GroupError, _layout("group_ids")),
    P_WEIGHTS_LAYOUT: (WeightError, _layout("weights")),
    P_SEGMENTS_LAYOUT: (SegmentError, _layout("segment_sizes")),
    P_GROUP_IDS_ITEM: (GroupError, _group_ids_item),
    P_SEGMENTS_ITEM: (SegmentError, _segments_item),
    P_REWARDS_ENTRY: (InputDtypeError, lambda a, b, c, detail="": entry_message("rewards", a, b, c, detail)),
    P_VALUES_ENTRY: (InputDtypeError, lambda a, b, c, detail="": entry_message("values", a, b, c, detail)),
    P_REWARDS_RAGGED: (InputDtypeError, lambda a, b, c, detail="": ragged_message("rewards", a, b, c, detail)),
    P_VALUES_RAGGED: (InputDtypeError, lambda a, b, c, detail="": ragged_message("values", a, b, c, detail)),
    P_Z_DTYPE: (InputDtypeError, lambda a, b, c:
                f"z has dtype {dtype_name(a)}; Eq. 7 needs a real floating dtype ({_INPUT_NAMES})"
                + _float8_hint("z", a)),
    P_Z_NDIM: (ShapeError, lambda a, b, c: f"z must be (N,) or (N, K); got a {a}-D tensor"),
    P_Z_EMPTY: (ShapeError, lambda a, b, c: f"z is empty (N={a} rows, K={b} reward columns)"),
    P_Z_NONFINITE: (NonFiniteError, lambda a, b, c: f"z[{a}, {b}] (row {a}, reward column {b}) is {_KINDS[c]}"),
    P_MISSING: (InputDtypeError, lambda a, b, c, detail="":
                "missing must be 'refuse' (a NaN reward is refused, the default) or 'unscored' (a NaN reward "
                f"is one its reward function did not score); got {detail or 'another value'}"),
    P_CERTIFIED: (InputDtypeError, lambda a, b, c, detail="":
                  "certified must be None (GDPO_CERTIFIED, else 'narrow'), 'narrow' (float32, bfloat16 and float16 "
                  "outputs certified), 'all' or True (float64 too), or 'off' or False (the plain path); got "
                  f"{detail or 'another value'}"),
    P_PROCESS_STATE: (GDPOError, lambda a, b, c: str(process_state_error((bool(a & 1), bool(a & 2))))),
    P_DIAGNOSTICS: (InputDtypeError, lambda a, b, c, detail="":
                    f"diagnostics must be an impl.gdpo.Diagnostics (or None); got {detail or 'another value'}"),
    P_Z_OVERFLOW: (OutOfRangeError, lambda a, b, c:
                   f"Eq. 7 (sum of weights x standardized rewards) overflows float64 at row {a}; "
                   "the weights are too large, scale them down"),
}


def _float8_hint(arg: str, code: int) -> str:
    if not dtype_name(code).startswith("float8"):
        return ""
    return f"; float8 is an output format only: pass {arg}.float() (exact)"


# --- process_group: checked before any agreement (without a usable group there is none) ---


def process_group_error(api: int, group, shown: str, reason: str = "") -> GDPOError:
    """The refusal of a ``process_group`` that names no usable group: raised at once on the
    rank that passed it (no collective can carry it). ``shown``: the caller's value as text."""
    name = API_NAMES.get(api, "GDPO")
    if reason == "type":
        return InputDtypeError(
            f"{name}: process_group must be a torch.distributed ProcessGroup (e.g. torch.distributed.group.WORLD "
            f"after init_process_group), or None for a local call; got {shown}")
    if reason == "non_member":
        return DistributedError(
            f"{name}: process_group is GroupMember.NON_GROUP_MEMBER ({shown}): this rank is not a member of the "
            "group torch.distributed.new_group made; call it only on the group's ranks")
    if reason == "uninitialized":
        return DistributedError(
            f"{name}: process_group is a ProcessGroup but torch.distributed is not initialized (call "
            "init_process_group first; was the group destroyed?)")
    return DistributedError(f"{name}: process_group ({shown}) cannot be used on this rank: {reason}")


def host_error(code: int, a: int = 0, b: int = 0, c: int = 0, detail: str = "") -> GDPOError:
    """The error of a host problem. ``detail`` (the caller's value, as text) is named in
    this local message only: the agreement carries integers (every rank's message is built
    from them, and a rank's own error, with its detail, is chained on that rank)."""
    cls, fmt = HOST_PROBLEMS[code]
    return cls(fmt(a, b, c, detail) if detail else fmt(a, b, c))


def _and_others(others: int) -> str:
    """The other groups of one, counted (the first is named)."""
    if others <= 0:
        return ""
    return ", as does 1 other group" if others == 1 else f", as do {others} other groups"


def _kind(bits: int) -> int:
    """0 for a finite value, else 1 nan, 2 +inf, 3 -inf (from float64 bits)."""
    x = bits_float(bits)
    if x != x:
        return 1
    if x in (math.inf, -math.inf):
        return 2 if x > 0 else 3
    return 0


def _label(row, col: int) -> int:
    """The caller's label in ``row[col]``: uint64 labels travel as their int64 bits."""
    return row[col] % (1 << 64) if row[LABELS_UINT64] else row[col]


def _group_of(row, at: int, label_col: int) -> str:
    if row[BY_LABEL]:
        return _group(_label(row, label_col), 1)
    return _group(at // max(row[GROUP_SIZE], 1), 0)


def _in_own_words(row, said: str) -> str:
    """A host refusal told in the refusing rank's own words: an adapter's refusal (its
    class and message), an unexpected exception (its type and message), or impl's own
    message with the caller's values the codes cannot carry."""
    if row[HOST_CODE] == P_REFUSED:
        return _refused(row[HOST_A], 0, 0).replace(" (chained on that rank)", "") + f": {said}"
    if row[HOST_CODE] == P_LOCAL_FAILURE:
        return f"the local computation raised {said} (chained on that rank)"
    return said


def row_problems(row) -> list[tuple[type, str]]:
    """Problems recorded in one facts row, most fundamental first."""
    out = []
    if row[HOST_CODE]:
        cls, fmt = HOST_PROBLEMS[row[HOST_CODE]]
        return [(cls, fmt(row[HOST_A], row[HOST_B], row[HOST_C]))]
    k = max(row[K], 1)
    kind = _kind(row[NF_REWARD_KIND])
    if kind:
        flat = row[NF_REWARD]
        out.append((NonFiniteError,
                    f"rewards[{flat // k}, {flat % k}] (row {flat // k}, reward column {flat % k}, "
                    f"{_group_of(row, flat // k, NF_REWARD_GROUP)}) is {_KINDS[kind]}"
                    + ("; missing='unscored' reads a NaN reward as not scored, never an infinity"
                       if row[MISSING] == MISSING_CODES["unscored"] else "")))
    if row[BY_LABEL] and row[SINGLETON] < row[ROWS]:
        out.append((GroupError,
                    f"group label {_label(row, SINGLETON_LABEL)} (first row {row[SINGLETON]}) has 1 sample"
                    f"{_and_others(row[SINGLETONS] - 1)}; Eq. 4 needs at least 2 (unbiased std)"))
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


def _by_value(values: dict[int, object]) -> str:
    groups: dict[object, list[int]] = {}
    for rank, v in values.items():
        groups.setdefault(v, []).append(rank)
    return "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {v}"
                     for v, r in groups.items())


def _weighed(table: list[list[int]]) -> list[int]:
    """The ranks whose weights a refusal compares: those with no problem of their own (all
    of them if every rank has one), as :func:`table_problems` considers them."""
    healthy = [r for r, row in enumerate(table) if not row_problems(row)]
    return healthy if healthy else list(range(len(table)))


def weights_disagree(table: list[list[int]]) -> bool:
    """The whole pipeline on the ranks compared (:func:`_weighed`), one K among them, no host
    refusal among them (their weights were read), and different weights: the refusal then
    shows each of their weights, sent in their own words. The same decision on every rank:
    it reads the agreed table only."""
    ranks = _weighed(table)
    rows = [table[r] for r in ranks]
    if len({row[API] for row in table}) != 1 or table[0][API] != API_GDPO or len({row[K] for row in rows}) != 1:
        return False
    if any(row[HOST_CODE] for row in rows):
        return False
    return len({row[WEIGHTS_FP] for row in rows}) > 1


def weights_words(values, names=None) -> str:
    """How a rank states its weights to its peers: the float64 values, shortest round-trip;
    an adapter's as {name: weight}, in the order :func:`weights_fingerprint` reads them."""
    if names is not None:
        return "{" + ", ".join(f"{n}: {w}" for n, w in _named(values, names)) + "}"
    return "[" + ", ".join(repr(float(x)) for x in values) + "]"


def table_problems(table: list[list[int]], words: dict[int, str] | None = None) -> list[str]:
    """Reasons to refuse, from the agreed (world_size, ROW_WIDTH) table; the
    same list on every rank because every rank holds the same table. ``words``:
    the own messages of the ranks that refused before the agreement (exchanged on
    the refusal path, the same on every rank), in place of what their codes say."""
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
    healthy = []
    for r, row in enumerate(table):
        probs = row_problems(row)
        if probs and row[HOST_CODE] and words and r in words:
            probs = [(probs[0][0], _in_own_words(row, words[r]))]
        for cls, msg in probs:
            reasons.append(f"rank {r}: {cls.__name__}: {msg}")
        if not probs:
            healthy.append(r)
    consider = healthy if healthy else list(range(world))

    def differ(col, fmt):
        vals = {r: table[r][col] for r in consider}
        if len(set(vals.values())) > 1:
            reasons.append(fmt(vals))

    apis = {r: table[r][API] for r in consider}
    if len(set(apis.values())) > 1:  # nothing else is comparable between different calls
        reasons.append("ranks call different functions ("
                       + _by_value({r: API_NAMES.get(x, "?") for r, x in apis.items()}) + ")")
        return reasons
    none = {r: table[r][SEG_NONE] for r in consider}
    if len(set(none.values())) > 1:
        reasons.append("segment_sizes is None on some ranks but given on others ("
                       + _by_value({r: "None (one unit)" if x else "segment_sizes given" for r, x in none.items()})
                       + ")")
    else:
        differ(UNITS, lambda v: "ranks disagree on the number of whitening units ("
               + _by_value({r: f"{x} units" for r, x in v.items()}) + ")")
    differ(DTYPE, lambda v: "input dtypes differ across ranks ("
           + _by_value({r: dtype_name(x) for r, x in v.items()}) + ")")
    differ(OUT_DTYPE, lambda v: "out_dtype differs across ranks ("
           + _by_value({r: dtype_name(x) for r, x in v.items()}) + ")")
    differ(DEVICE, lambda v: "device types differ across ranks ("
           + _by_value({r: _DEVICE_NAMES.get(x, "?") for r, x in v.items()}) + ")")
    differ(EPS_BITS, lambda v: "eps differs across ranks ("
           + _by_value({r: repr(bits_float(x)) for r, x in v.items()}) + ")")
    differ(MISSING, lambda v: "the missing policy differs across ranks ("
           + _by_value({r: repr(next((n for n, c in MISSING_CODES.items() if c == x), "?"))
                        for r, x in v.items()}) + ")")
    differ(CERTIFIED, lambda v: "the certified mode differs across ranks ("
           + _by_value({r: repr(next((n for n, c in CERTIFIED_CODES.items() if c == x), "?"))
                        for r, x in v.items()}) + ")")
    differ(K, lambda v: "the number of reward columns K differs across ranks ("
           + _by_value({r: f"K={x}" for r, x in v.items()}) + ")")
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
    """The message every rank raises: built from the agreed table only (rank 0's
    function name), so it is the same string on every rank."""
    apis = {row[API] for row in table}
    api = API_NAMES.get(table[0][API], "GDPO") if len(apis) == 1 else "impl.gdpo"  # ranks called different ones
    where = f"all {len(table)} ranks"
    if global_ranks is not None and list(global_ranks) != list(range(len(table))):
        shown = ", ".join(map(str, global_ranks[:16])) + (", ..." if len(global_ranks) > 16 else "")
        where += f" of the process group (ranks below are its own; global ranks {shown})"
    return f"{api} refused on {where}: " + "; ".join(reasons)
