"""Reading a dumped batch for ``gdpo audit`` (formats: docs/audit.md): every refusal names
the file, the array or column, and the row, and is also the spec's class for its kind."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import pickle
import re
import zipfile
from pathlib import Path

import numpy as np

import torch

from oracle.inputs import py
from spec import GDPOError
from spec.errors import GroupError, InputDtypeError, OutOfRangeError, SegmentError, ShapeError, WeightError

#: Rows parsed at a time from a text file, and at most this many of its characters: the batch
#: is held as numpy arrays, never a Python object per cell, so memory follows the batch, not the
#: bytes a row spends.
CHUNK_ROWS, CHUNK_CHARS = 65_536, 4_000_000
#: A text file's line longer than this is refused: a sample is a line of some hundred characters,
#: and a file without line breaks (a link to /dev/zero) would otherwise be read whole.
MAX_LINE = 1 << 20


class AuditInputError(GDPOError):
    """A dumped batch that cannot be read: the message names the file, the array or column, and the row.
    Each refusal is also the spec's class for its kind (spec/errors.py), through the subclasses below."""


class AuditShapeError(AuditInputError, ShapeError):
    """An array of the wrong shape: rewards not (N,) or (N, K), an empty batch, lengths that disagree."""


class AuditDtypeError(AuditInputError, InputDtypeError):
    """Rewards that are not real numbers: bool, complex, text, Python objects."""


class AuditRangeError(AuditInputError, OutOfRangeError):
    """A reward float64 cannot hold exactly (an integer beyond 2**53, a long double)."""


class AuditGroupError(AuditInputError, GroupError):
    """Group labels that are not integers, or no group labels at all."""


class AuditUnitError(AuditInputError, SegmentError):
    """Whitening-unit labels that are not integers."""


class AuditWeightError(AuditInputError, WeightError):
    """Weights that are not real numbers float64 holds exactly."""


class AuditGroupShapeError(AuditShapeError, AuditGroupError):
    """``group_ids`` not one label per sample."""


class AuditUnitShapeError(AuditShapeError, AuditUnitError):
    """``unit_ids`` not one label per sample."""


class AuditWeightShapeError(AuditShapeError, AuditWeightError):
    """Weights not one per reward column."""


@dataclasses.dataclass
class Batch:
    rewards: np.ndarray  # (N, K) float64
    group_ids: np.ndarray  # (N,) int64: the file's integer labels, or codes into group_names
    unit_ids: np.ndarray | None
    weights: np.ndarray | None
    names: list[str]
    source: str
    #: the file's group labels where they are text (verl's uids): group_ids[i] indexes it
    group_names: list[str] | None = None
    #: a text file's line of each row (1-based, as an editor shows it); None for arrays
    lines: np.ndarray | None = None

    def group_label(self, code):
        """A group as the file names it."""
        return self.group_names[py(code)] if self.group_names is not None else py(code)

    def numbers(self, rows) -> list[int]:
        """Rows as the file numbers them: lines (1-based) of a text file, rows (0-based) of an array."""
        return (self.lines[rows] if self.lines is not None else np.asarray(rows)).tolist()

    def places(self, rows, most: int = 6) -> str:
        """Rows named as the file shows them: "line 7", "lines 3, 5, 9" or "rows 0, 4 (0-based)", the
        first ``most``."""
        nums = self.numbers(rows)
        said = ", ".join(map(str, nums[:most])) + (f" and {len(nums) - most:,} more" if len(nums) > most else "")
        if self.lines is not None:
            return f"line{'s' * (len(nums) > 1)} {said}"
        return f"row{'s' * (len(nums) > 1)} {said} (0-based)"


def shown(v, limit: int = 40) -> str:
    """``v`` for a message, abbreviated beyond ``limit`` characters (a 400-digit integer, a
    megabyte of uid) to its ends and its length."""
    return clip(repr(v) if isinstance(v, str) or not isinstance(v, (int, float, np.number)) else str(v), limit)


def clip(text: str, limit: int = 120) -> str:
    """``text`` (a value's, or another library's message) cut to about ``limit`` characters."""
    return text if len(text) <= limit else f"{text[:limit // 2]}...{text[-8:]} ({len(text):,} characters)"


_INT64 = 2**63
_KINDS = {"b": "booleans", "c": "complex numbers", "U": "text", "S": "bytes", "O": "Python objects",
          "V": "structured records", "M": "datetimes", "m": "timedeltas"}
_HINTS = {"b": "; save 0/1 as floats if that is meant",
          "c": " (impl.gdpo refuses complex rewards; reading them as real would drop the imaginary part)",
          "U": "; save numbers, not their text", "S": "; save numbers, not their text"}


def _as_array(value, what: str) -> np.ndarray:
    """One entry of a .npz/.pt mapping as a numpy array; refuses what is not a rectangular array."""
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            raise AuditInputError(f"{what} is a {value.layout} tensor; save it dense (.to_dense())")
        if value.is_meta:
            raise AuditInputError(f"{what} is a meta tensor: a shape {tuple(value.shape)} without values; save the "
                                  "tensor that holds the rewards")
        value = value.detach().cpu().resolve_conj().resolve_neg()
        if value.is_floating_point() and value.dtype not in (torch.float16, torch.float32, torch.float64):
            value = value.to(torch.float32)  # bfloat16, float8: widening to float32 is exact
        try:
            return value.numpy()
        except (TypeError, RuntimeError) as e:
            raise AuditInputError(f"{what} is a tensor of dtype {value.dtype}, which numpy cannot hold "
                                  f"({clip(str(e))})") from None
    if isinstance(value, dict):
        raise AuditInputError(f"{what} is a dict (keys {clip(str(sorted(map(str, value))))}), not an array")
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as e:
        raise AuditShapeError(f"{what} is not a rectangular array ({clip(str(e))})") from None


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def _real(arr: np.ndarray, what: str, where, dtype_error=AuditDtypeError, range_error=AuditRangeError) -> np.ndarray:
    """``arr`` as float64: refuses dtypes that are not real numbers and values float64 cannot hold
    exactly (integers beyond 2**53, long doubles). ``where(index)`` names an element's place."""
    kind = arr.dtype.kind
    if kind not in "iuf":
        raise dtype_error(f"{what} holds {_KINDS.get(kind, str(arr.dtype))} (dtype {arr.dtype}), not real numbers"
                          + _HINTS.get(kind, ""))
    out = arr.astype(np.float64)
    bad = None
    if kind in "iu" and arr.dtype.itemsize > 4:
        with np.errstate(invalid="ignore"):
            fits = out < (float(_INT64) if kind == "i" else 2.0**64)
            bad = ~fits | (np.where(fits, out, 0).astype(arr.dtype) != arr)
    elif kind == "f" and arr.dtype.itemsize > 8:
        with np.errstate(over="ignore", invalid="ignore"):
            bad = (out.astype(arr.dtype) != arr) & ~np.isnan(arr)
    if bad is not None and bad.any():
        ix = _first(bad)
        raise range_error(f"{what} {where(ix)}: {shown(arr[ix])} is not exactly a float64 (the nearest is "
                          f"{float(out[ix])!r})")
    return out


_LABEL_ERRORS = {"group_ids": (AuditGroupError, AuditGroupShapeError),
                 "unit_ids": (AuditUnitError, AuditUnitShapeError)}


def _labels(value, n: int, key: str, source: str) -> tuple[np.ndarray, list[str] | None]:
    """One label per sample (``group_ids``, ``unit_ids``) from an array: integers, or, for
    ``group_ids``, text (verl's uids: each distinct text one group), returned as codes and
    the texts they index."""
    err, shape_err = _LABEL_ERRORS[key]
    what = f"{source}: {key!r}"
    arr = _as_array(value, what)
    if arr.ndim != 1:
        raise shape_err(f"{what} has shape {arr.shape}; expected one label per sample, shape ({n},)")
    if arr.size != n:
        raise shape_err(f"{what} has {arr.size} entries for {n} samples")
    kind = arr.dtype.kind
    if kind == "i":
        return arr.astype(np.int64), None
    if kind == "U" and key == "group_ids":
        texts, codes = np.unique(arr, return_inverse=True)
        return codes.astype(np.int64), [str(t) for t in texts]
    if kind == "u":
        bad = arr >= _INT64
    elif kind == "f":
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(arr) | (arr != np.floor(arr)) | (arr < -_INT64) | (arr >= _INT64)
        if not bad.any():  # whole numbers, but of a float dtype: refused as impl and the oracle refuse them
            first = ", ".join(repr(float(x)) for x in arr[:4]) + (", ..." if arr.size > 4 else "")
            raise err(f"{what} holds floats (dtype {arr.dtype}: [{first}]); labels must be integers, and float "
                      f"labels are refused whatever their values, {_AS_IMPL}; save them with an integer dtype "
                      "(.astype(np.int64))")
    else:
        raise err(f"{what} holds {_KINDS.get(kind, str(arr.dtype))} (dtype {arr.dtype}); labels must be integers"
                  + (" or, for groups, str" if key == "group_ids" else ""))
    if bad.any():
        i = _first(bad)[0]
        raise err(f"{what} row {i} (0-based): {shown(arr[i].item())} is not an integer label")
    return arr.astype(np.int64), None


def _weights(value, names: list[str], what: str) -> np.ndarray:
    """One real weight per reward column."""
    arr = _as_array(value, what)
    if arr.shape != (len(names),):
        raise AuditWeightShapeError(f"{what} has shape {arr.shape}; expected one weight per reward column "
                                    f"{names}, shape ({len(names)},)")
    return _real(arr, what, lambda ix: f"entry {ix[0]} (0-based, {names[ix[0]]!r})", AuditWeightError, AuditWeightError)


def _names(value, K: int, source: str) -> list[str]:
    what = f"{source}: 'names'"
    arr = _as_array(value, what)
    if arr.dtype.kind != "U":
        raise AuditInputError(f"{what} holds {_KINDS.get(arr.dtype.kind, str(arr.dtype))} (dtype {arr.dtype}), "
                              "not text")
    if arr.shape != (K,):
        raise AuditShapeError(f"{what} has shape {arr.shape}; expected one name per reward column, shape ({K},)")
    names = [str(n) for n in arr]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise AuditInputError(f"{what} repeats {dup}")
    return names


def _check_samples(shape: tuple, what: str) -> None:
    if shape[0] == 0:
        raise AuditShapeError(f"{what} has shape {shape}: no samples")
    if len(shape) == 2 and shape[1] == 0:
        raise AuditShapeError(f"{what} has shape {shape}: no reward columns")


def _from_mapping(data: dict, source: str) -> Batch:
    odd = [k for k in data if not isinstance(k, str)]
    if odd:
        raise AuditInputError(f"{source}: keys must be array names (strings), found {odd[0]!r}")
    keys = set(data)
    comp = sorted(k for k in keys if k.startswith("reward_"))
    if "rewards" in keys and comp:
        raise AuditInputError(f"{source}: both a 'rewards' array and per-component arrays {comp}; "
                              "give one or the other")
    if "rewards" in keys:
        what = f"{source}: 'rewards'"
        arr = _as_array(data["rewards"], what)
        if arr.ndim not in (1, 2):
            raise AuditShapeError(f"{what} has shape {arr.shape}; expected (N,) or (N, K): one row per sample, "
                                  "one column per reward component")
        if arr.ndim == 1:
            arr = arr[:, None]
        _check_samples(arr.shape, what)
        names = _names(data["names"], arr.shape[1], source) if "names" in keys else [
            f"r{k}" for k in range(arr.shape[1])]
        rewards = _real(arr, what, lambda ix: f"row {ix[0]} (0-based), column {names[ix[1]]!r}")
    else:
        if not comp:
            raise AuditInputError(f"{source}: no 'rewards' array and no 'reward_<name>' arrays "
                                  f"(found {clip(str(sorted(keys)))})")
        if "names" in keys:
            raise AuditInputError(f"{source}: a 'names' array goes with 'rewards'; the arrays {comp} are named "
                                  "by their keys")
        arrs = {k: _as_array(data[k], f"{source}: {k!r}") for k in comp}
        for k, a in arrs.items():
            if a.ndim != 1:
                raise AuditShapeError(f"{source}: {k!r} has shape {a.shape}; expected one value per sample, "
                                      "shape (N,)")
        if len({a.size for a in arrs.values()}) != 1:
            raise AuditShapeError(f"{source}: reward arrays differ in length: { {k: a.size for k, a in arrs.items()} }")
        _check_samples(arrs[comp[0]].shape, f"{source}: {comp[0]!r}")
        rewards = np.stack([_real(a, f"{source}: {k!r}", lambda ix: f"row {ix[0]} (0-based)")
                            for k, a in arrs.items()], 1)
        names = [k[len("reward_"):] for k in comp]
    if "group_ids" not in keys:
        raise AuditGroupError(f"{source}: no 'group_ids' array (found {clip(str(sorted(keys)))})")
    n = rewards.shape[0]
    group, group_names = _labels(data["group_ids"], n, "group_ids", source)
    unit = _labels(data["unit_ids"], n, "unit_ids", source)[0] if "unit_ids" in keys else None
    weights = _weights(data["weights"], names, f"{source}: 'weights'") if "weights" in keys else None
    return Batch(rewards, group, unit, weights, names, source, group_names)


def _json_type(v) -> str:
    for t, name in ((bool, "boolean"), (dict, "object"), (list, "array"), (str, "string"), (int, "number"),
                    (float, "number")):
        if isinstance(v, t):
            return name
    return "null" if v is None else type(v).__name__


def _parsed(text: str):
    """A CSV cell as a number: an int where it reads as one (exact), else a float, an empty cell NaN
    (pandas writes NaN so: a reward not scored); None if neither."""
    if not text.strip():
        return math.nan
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return None


def _float_column(values, name: str, source: str, lines, text: bool) -> np.ndarray:
    """Reward values of one column, cell by cell: numbers (JSON) or their text (CSV); an
    integer must be exact in float64. ``lines``: each value's line in the file."""
    out = np.empty(len(values))
    for i, v in enumerate(values):
        place = f"{source}: line {lines[i]}, column {name!r}"
        x = _parsed(v) if text and isinstance(v, str) else math.nan if v is None else v  # JSON null: NaN
        if x is None or isinstance(x, bool) or not isinstance(x, (int, float)):
            raise AuditDtypeError(f"{place}: {shown(v)} is not a number"
                                  + (f" (a JSON {_json_type(v)})" if not text else ""))
        if isinstance(x, int):
            try:
                f = float(x)
            except OverflowError:
                f = float("inf")
            if f != x:  # int == float compares exactly
                raise AuditRangeError(f"{place}: {shown(x)} is not exactly a float64 (the nearest is {f!r})")
            x = f
        out[i] = x
    return out


#: Why a float label is refused whatever its value (spec section 6, one rule everywhere).
_AS_IMPL = "by impl.gdpo and the oracle as here (spec section 6, GroupError)"


def _int_label(v):
    """``v`` (a JSON value, or a CSV cell's text) as an integer label, or None: an integer
    within int64 (a float, even a whole one, is no label; nor is bool)."""
    x = _parsed(v) if isinstance(v, str) else v
    if isinstance(x, bool) or not isinstance(x, int) or not -_INT64 <= x < _INT64:
        return None
    return x


class _Labels:
    """One column of labels of a text file, met chunk by chunk: each distinct label gets a
    code in the order met (a Python dict, one entry a label, not a row). :meth:`finish`
    gives the file's integer labels where every label is an integer, else (``text``
    allowed: the group column) the codes and the labels' texts, each distinct text one
    group (verl's uids)."""

    def __init__(self, name: str, source: str, err, text: bool):
        self.name, self.source, self.err, self.text = name, source, err, text
        self.codes: dict = {}
        self.first_line: dict = {}
        self.parts: list[np.ndarray] = []

    def add(self, values, lines) -> None:
        codes, first = self.codes, self.first_line
        out = np.empty(len(values), dtype=np.int64)
        for i, v in enumerate(values):
            if type(v) is not str and type(v) is not int:  # JSON: 1.0 and true hash as 1, so check every row
                self._refuse(v, lines[i])
            c = codes.get(v)
            if c is None:
                c = codes[v] = len(codes)
                first[c] = lines[i]
            out[i] = c
        self.parts.append(out)

    def _refuse(self, v, line: int):
        """Why ``v`` (a JSON value, or a CSV cell's text) on ``line`` is no label."""
        x = _parsed(v) if isinstance(v, str) else v
        what = f"{self.source}: line {line}, column {self.name!r}: {shown(v)}"
        if isinstance(x, float) and x.is_integer():
            raise self.err(f"{what} is a float, not an integer label; float labels are refused whatever their "
                           f"values, {_AS_IMPL}: write the labels as integers")
        if isinstance(v, str) or (isinstance(x, (int, float)) and not isinstance(x, bool)):
            hint = " (a label is an integer, or text that is no number, such as a uid)" if self.text else ""
            raise self.err(f"{what} is not an integer label{hint}")
        allowed = "an integer or text label" if self.text else "an integer label"
        raise self.err(f"{what} is not {allowed} (a JSON {_json_type(v)})")

    def finish(self) -> tuple[np.ndarray, list[str] | None]:
        codes = np.concatenate(self.parts) if self.parts else np.zeros(0, np.int64)
        keys = list(self.codes)
        ints = [_int_label(k) for k in keys]
        if all(x is not None for x in ints):
            return np.asarray(ints, dtype=np.int64)[codes], None
        # a number that is not an integer is no label (a float column taken for the labels?);
        # text that is no number (a uid) makes every label text
        numbers = [not isinstance(k, str) or _parsed(k) is not None for k in keys]
        text = self.text and not all(numbers)
        bad = [j for j, x in enumerate(ints) if x is None and (numbers[j] or not isinstance(keys[j], str) or not text)]
        if bad:
            j = min(bad, key=lambda j: self.first_line[j])
            self._refuse(keys[j], self.first_line[j])
        merged: dict = {}  # each text's group, in the order met (JSON 1 and "1": one text, one group)
        remap = np.array([merged.setdefault(k if isinstance(k, str) else str(x), len(merged))
                          for k, x in zip(keys, ints)], dtype=np.int64)
        return remap[codes], list(merged)


def _float_cells(cells, name: str, source: str, lines, text: bool) -> np.ndarray:
    """One reward column of a chunk as float64, converted in C; where that fails (a cell
    that is no number, a bool), the cell-by-cell check names the line. An integer beyond
    2**53 that float64 cannot hold exactly is refused: only cells that large can be one."""
    try:
        if not text and any(isinstance(v, (bool, str)) or v is None for v in cells):
            raise ValueError
        out = np.array(cells, dtype=np.float64)
        if out.ndim != 1:  # JSON arrays as values: named cell by cell below
            raise ValueError
    except (ValueError, TypeError, OverflowError):
        return _float_column(cells, name, source, lines, text=text)
    with np.errstate(invalid="ignore"):
        big = np.flatnonzero(np.abs(out) >= 2.0**53)
    if big.size:
        _float_column([cells[i] for i in big], name, source, [lines[i] for i in big], text=text)
    return out


def _read_text(path: Path, progress, read) -> Batch:
    """A .csv or .jsonl file: ``read(lines, src, progress)`` parses its :class:`_Lines` into a
    :class:`_Rows` and names its columns; bytes that are not UTF-8 are refused."""
    src = str(path)
    try:
        f = path.open(newline="", encoding="utf-8-sig")
    except OSError as e:
        raise AuditInputError(f"{src}: cannot be read ({e.strerror or e})") from None
    with f:
        try:
            rows, names, empty = read(_Lines(f, src, path.stat().st_size), src, progress)
        except UnicodeDecodeError as e:
            raise AuditInputError(f"{src}: not UTF-8 text ({e.reason})") from None
    return (rows or _Rows(src, False)).batch(names, empty)


class _Lines:
    """A text file's lines, each at most MAX_LINE characters, counting them (line numbers as
    an editor shows them) and the characters read of the file's ``size`` (the reading progress)."""

    def __init__(self, f, src: str, size: int):
        self.f, self.src, self.size, self.read, self.number = f, src, max(size, 1), 0, 0

    def __iter__(self):
        while True:
            line = self.f.readline(MAX_LINE + 2)  # room for the line break
            if not line:
                return
            self.number += 1
            self.read += len(line)
            if len(line.rstrip("\r\n")) > MAX_LINE:
                raise AuditInputError(f"{self.src}: line {self.number} is longer than {MAX_LINE:,} characters, the "
                                      "limit of a line (one sample a line); is it the batch's text file?")
            yield line


def _in_chunks(items, lines: _Lines, progress):
    """``items`` (rows of a text file) in lists of at most CHUNK_ROWS rows or CHUNK_CHARS characters;
    ``progress(fraction read)`` once each is done with (None: no calls)."""
    items = iter(items)
    while True:
        start, chunk = lines.read, []
        for item in items:
            chunk.append(item)
            if len(chunk) == CHUNK_ROWS or lines.read - start >= CHUNK_CHARS:
                break
        if not chunk:
            return
        yield chunk
        if progress is not None:
            progress(lines.read / lines.size)


class _Rows:
    """The rows of a text file, met chunk by chunk: the reward columns as float64 parts, the
    group (and unit) labels, each row's line."""

    def __init__(self, src: str, units: bool):
        self.src, self.parts, self.starts = src, [], []
        self.groups = _Labels("group", src, AuditGroupError, text=True)
        self.units = _Labels("unit", src, AuditUnitError, text=False) if units else None

    def add(self, at, columns, names, text: bool, groups, units) -> None:
        self.parts.append(np.stack([_float_cells(col, name, self.src, at, text=text)
                                    for col, name in zip(columns, names)], 1))
        self.groups.add(groups, at)
        if self.units is not None:
            self.units.add(units, at)
        self.starts.append(np.asarray(at, np.int64))

    def batch(self, names: list[str], empty: str) -> Batch:
        if not self.parts:
            raise AuditShapeError(f"{self.src}: {empty}")
        group, group_names = self.groups.finish()
        unit = self.units.finish()[0] if self.units is not None else None
        return Batch(np.concatenate(self.parts), group, unit, None, names, self.src, group_names,
                     np.concatenate(self.starts))


def _csv_rows(lines: _Lines, src: str, progress):
    reader = csv.reader(lines)

    def numbered():  # each row with the line it starts on (a quoted cell may hold line breaks)
        end = reader.line_num
        for row in reader:
            yield end + 1, row
            end = reader.line_num

    try:
        fields = next(reader, None)
        if not fields or "group" not in fields:
            near = [f for f in fields or [] if f.strip().lower() in ("group", "uid", "index", "prompt_id")]
            raise AuditGroupError(f"{src}: the header must name a 'group' column (found {shown(fields, 120)})"
                                  + (f"; rename {near[0]!r} to 'group' (exactly, no spaces)" if near else ""))
        blank = [i + 1 for i, c in enumerate(fields) if not c.strip() or c.startswith("Unnamed: ")]
        if blank:
            raise AuditShapeError(f"{src}: column {blank[0]} of the header has no name ({shown(fields, 120)}): "
                                  "a pandas index? write the file with to_csv(..., index=False)")
        dup = sorted({c for c in fields if fields.count(c) > 1})
        if dup:
            raise AuditInputError(f"{src}: the header names {dup} more than once")
        names = [c for c in fields if c not in ("group", "unit")]
        if not names:
            raise AuditShapeError(f"{src}: no reward columns besides 'group'/'unit'")
        rows = _Rows(src, "unit" in fields)
        for chunk in _in_chunks(numbered(), lines, progress):
            at = [n for n, _ in chunk]
            for n, row in chunk:
                if len(row) != len(fields):
                    raise AuditShapeError(f"{src}: line {n} has {len(row)} fields, the header {len(fields)}")
            by_col = dict(zip(fields, zip(*(row for _, row in chunk))))
            rows.add(at, [by_col[c] for c in names], names, True, by_col["group"], by_col.get("unit"))
    except csv.Error as e:
        raise AuditInputError(f"{src}: not valid CSV at line {reader.line_num}: {e}") from None
    return rows, names, "no rows"


def _jsonl_rows(lines: _Lines, src: str, progress):
    names = first = first_line = rows = None
    numbered = ((i + 1, line) for i, line in enumerate(lines) if line.strip())
    for chunk in _in_chunks(numbered, lines, progress):
        recs, at = [], []
        for n, line in chunk:
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise AuditInputError(f"{src}: line {n} is not JSON: {e.msg} (column {e.colno})") from None
            at.append(n)
        if first is None:
            _check_record(recs[0], at[0], src)
            first, first_line = recs[0]["rewards"], at[0]
            names = list(first) if isinstance(first, dict) else [f"r{k}" for k in range(len(first))]
            if not names:
                raise AuditShapeError(f"{src}: line {first_line} has no rewards")
            rows = _Rows(src, "unit" in recs[0])
        values = []
        for n, rec in zip(at, recs):
            values.append(_record_rewards(rec, n, src, names, first, first_line))
            if ("unit" in rec) != (rows.units is not None):
                has, hasnt = (first_line, n) if rows.units is not None else (n, first_line)
                raise AuditUnitError(f"{src}: line {hasnt} has no 'unit' but line {has} has one; give every "
                                     "row a unit or none")
        rows.add(at, list(zip(*values)), names, False, [rec["group"] for rec in recs],
                 [rec.get("unit") for rec in recs])
    return rows, names, "no records"


def _check_record(rec, line: int, src: str) -> None:
    if not isinstance(rec, dict) or "group" not in rec or "rewards" not in rec:
        got = f"an object with keys {shown(sorted(rec), 80)}" if isinstance(rec, dict) else f"a JSON {_json_type(rec)}"
        raise AuditInputError(f"{src}: line {line} needs 'group' and 'rewards' (it is {got})")
    if not isinstance(rec["rewards"], (dict, list)):
        raise AuditDtypeError(f"{src}: line {line}: 'rewards' is a JSON {_json_type(rec['rewards'])}; expected an "
                              "object {name: value} or an array of values")


def _record_rewards(rec, line: int, src: str, names: list[str], first, first_line: int) -> list:
    _check_record(rec, line, src)
    rw = rec["rewards"]
    if isinstance(rw, dict) != isinstance(first, dict):
        raise AuditInputError(f"{src}: line {line} gives 'rewards' as a JSON {_json_type(rw)}, line {first_line} as "
                              f"a JSON {_json_type(first)}")
    if isinstance(rw, dict):
        if set(rw) != set(names):
            raise AuditShapeError(f"{src}: line {line} has reward keys {shown(sorted(rw), 80)}, expected "
                                  f"{shown(sorted(names), 80)}")
        rw = [rw[n] for n in names]
    if len(rw) != len(names):
        raise AuditShapeError(f"{src}: line {line} has {len(rw)} rewards, expected {len(names)}")
    return rw


def _read_npz(path: Path) -> Batch:
    with open(path, "rb") as f:
        head = f.read(6)
    if not head.startswith((b"PK", b"\x93NUMPY")):  # else NumPy's words are about pickles
        raise AuditInputError(f"{path}: not a readable .npz file (not a zip archive: np.savez writes one)")
    try:
        data = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise AuditInputError(f"{path}: not a readable .npz file ({clip(str(e))})") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise AuditInputError(f"{path}: one bare array (np.save), not an archive of named arrays (np.savez)")
    arrays = {}
    with data:
        for k in data.files:
            try:
                arrays[k] = data[k]
            except ValueError as e:
                if "allow_pickle" not in str(e):
                    raise AuditInputError(f"{path}: array {k!r} is not readable ({clip(str(e))})") from None
                wrong = AuditDtypeError if k == "rewards" or k.startswith("reward_") else {
                    "group_ids": AuditGroupError, "unit_ids": AuditUnitError, "weights": AuditWeightError}.get(
                    k, AuditInputError)
                raise wrong(f"{path}: {k!r} holds Python objects (dtype object), which audit does not "
                                      "unpickle; save numbers (or str names)") from None
            except Exception as e:  # a damaged member: zlib, zipfile, EOF errors
                raise AuditInputError(f"{path}: array {k!r} is not readable ({type(e).__name__}: "
                                      f"{clip(str(e))})") from None
    return _from_mapping(arrays, str(path))


def _read_pt(path: Path) -> Batch:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # torch's page of advice, which ends: load it unsafely
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if found:
            raise AuditInputError(f"{path}: refused: it holds a Python object ({clip(found[1])}) that only an "
                                  "unsafe load would build (one that can run code); save a dict of tensors") from None
        found = re.search(r"WeightsUnpickler error:\s*(.+)", str(e))
        raise AuditInputError(f"{path}: not a readable .pt file ({clip(found[1] if found else 'no pickle')})"
                              ) from None
    except Exception as e:  # torch raises many types for a bad file
        said = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().split("\n")[0]
        raise AuditInputError(f"{path}: not a readable .pt file ({type(e).__name__}: {clip(said)})") from None
    if not isinstance(data, dict):
        raise AuditInputError(f"{path}: expected a dict of tensors, got {type(data).__name__}")
    return _from_mapping(data, str(path))


def read_batch(path: str | Path, progress=None) -> Batch:
    """The batch in ``path`` (.csv, .jsonl, .npz, .pt); ``progress(fraction)`` is called as a
    text file is read."""
    path = Path(path)
    if not path.exists():
        raise AuditInputError(f"{path}: no such file")
    if path.is_dir():
        raise AuditInputError(f"{path}: a directory, not a file")
    suffix = path.suffix.lower()
    if suffix in (".csv", ".jsonl"):
        return _read_text(path, progress, _csv_rows if suffix == ".csv" else _jsonl_rows)
    if suffix not in (".npz", ".pt"):
        raise AuditInputError(f"{path}: unknown format {suffix!r} (expected .npz, .pt, .jsonl or .csv)")
    return (_read_npz if suffix == ".npz" else _read_pt)(path)


def example_batch() -> Batch:
    """The built-in batch: one group of each kind the audit reports on."""
    C = 1e12
    d = np.array([0.1, 0.2, 0.3, 0.7])
    rows = [
        [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]],  # healthy
        [[1.0, 0.5], [1.0, 0.5], [1.0, 0.5], [1.0, 0.5]],  # fully collapsed: no signal
        np.stack([C - d, C - (C - d)], 1).tolist(),  # exact constant sum: cancels
        np.stack([C - d, d], 1).tolist(),  # near-constant sum: quantization is the signal
        [[0.0, 1.0], [0.0, 1.00001], [1.0, 1.00002], [1.0, 1.00003]],  # second column std ~1e-5
        [[0.0, 3.0], [1.0, 9.0]],  # n_g = 2
    ]
    rewards = np.vstack([np.asarray(r, dtype=np.float64) for r in rows])
    groups = np.concatenate([[g] * len(r) for g, r in enumerate(rows)])
    return Batch(rewards, groups, None, None, ["correctness", "format"], "built-in example")


