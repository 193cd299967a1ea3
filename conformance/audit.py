"""``gdpo audit``: read a dumped batch and say what GDPO will do with it.

Input formats (the reward components, group labels, optional units and weights):

* ``.npz`` / ``.pt`` (a dict saved with ``torch.save``): arrays ``rewards`` (N, K)
  *or* one array per component ``reward_<name>``; ``group_ids`` (N,); optional
  ``unit_ids`` (N,), ``weights`` (K,), ``names`` (K,);
* ``.jsonl``: one object per sample: ``{"group": g, "unit": u (optional),
  "rewards": {"name": value, ...}}`` (or ``"rewards": [values]``);
* ``.csv``: a header with ``group``, optional ``unit``, and one column per component.

Rewards and weights are real numbers (integers must be exact in float64); labels are
integers (a float label is refused whatever its value, as impl and the oracle refuse
it). Anything else is refused, never reinterpreted: rewards of another shape,
bool, complex, text or object values, arrays of the wrong shape or length (labels
and weights are 1-D), ``rewards`` together with ``reward_<name>`` arrays.
Weights on the command line (``--weights``) override those in the file.

The report, per group and per unit: whether the group reaches training with a
signal, collapsed columns, exact cancellation, near-cancellation with its
conditioning, eps-dominated std, n_g = 2 magnitude loss, float32 range risk; the
implementation's difference from the exact oracle (in units of the spec's error
bound); and how far each peer convention's exact result moves from the spec's.

Exit codes: 0 audited, nothing to warn about (collapsed columns and groups without
signal are reported, but routine); 1 audited, warnings (exact cancellation,
ill-conditioning, eps-dominated std, n_g = 2, float32 range, a collapsed unit); 2 the input is
malformed (the message names the column and row); 3 impl.gdpo disagrees with
the oracle beyond the error model (a bug to report).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
import zipfile
from pathlib import Path

import numpy as np

from spec import CONVENTIONS, DEFAULT_EPS, FLOAT32_MAX, GDPOError
from spec.errors import (GroupError, InputDtypeError, NonFiniteError, OutOfRangeError, SegmentError, ShapeError,
                         WeightError)

#: Diagnostics only (they never change a result): a group column whose std is
#: below this multiple of eps has its Eq. 4 scale set mostly by eps, not the data.
EPS_DOMINATED_FACTOR = 10.0
#: A group whose combined values (Eq. 7) may move by more than this fraction of their
#: scale when every input moves one ulp (the oracle's ``cond``: that first-order change
#: itself where ``cond_sharp``, an upper bound on it elsewhere) is reported as
#: ill-conditioned: ten orders of magnitude above a healthy group's ~1e-16, so its
#: values are set by the inputs' last bits (typical near-cancellation).
ILL_CONDITIONED = 1e-6

OK, WARN, MALFORMED, DISAGREE = 0, 1, 2, 3
#: Group findings that are reported but are no warning (exit code 0): with binary rewards a
#: column constant within a group, or a group all of whose samples scored alike, is routine
#: (Eq. 4 gives such a column z = 0 exactly; dynamic sampling drops a group without signal).
ROUTINE = ("collapsed:", "no signal:")
#: The text report lists every group up to this many, beyond it only groups with warnings
#: (a 100k-row batch printed 12,514 lines); the JSON report always lists every group.
LIST_ALL_GROUPS = 50


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
    rewards: np.ndarray
    group_ids: np.ndarray
    unit_ids: np.ndarray | None
    weights: np.ndarray | None
    names: list[str]
    source: str


# ------------------------------------------------------------------------- reading

_INT64 = 2**63
_KINDS = {"b": "booleans", "c": "complex numbers", "U": "text", "S": "bytes", "O": "Python objects",
          "V": "structured records", "M": "datetimes", "m": "timedeltas"}
_HINTS = {"b": "; save 0/1 as floats if that is meant",
          "c": " (impl.gdpo refuses complex rewards; reading them as real would drop the imaginary part)",
          "U": "; save numbers, not their text", "S": "; save numbers, not their text"}


def _as_array(value, what: str) -> np.ndarray:
    """One entry of a .npz/.pt mapping as a numpy array; refuses what is not a rectangular array."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            raise AuditInputError(f"{what} is a {value.layout} tensor; save it dense (.to_dense())")
        value = value.detach().cpu().resolve_conj().resolve_neg()
        if value.is_floating_point() and value.dtype not in (torch.float16, torch.float32, torch.float64):
            value = value.to(torch.float32)  # bfloat16, float8: widening to float32 is exact
        try:
            return value.numpy()
        except (TypeError, RuntimeError) as e:
            raise AuditInputError(f"{what} is a tensor of dtype {value.dtype}, which numpy cannot hold ({e})") from None
    if isinstance(value, dict):
        raise AuditInputError(f"{what} is a dict (keys {sorted(map(str, value))}), not an array")
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as e:
        raise AuditShapeError(f"{what} is not a rectangular array ({e})") from None


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
        raise range_error(f"{what} {where(ix)}: {arr[ix]} is not exactly a float64 (the nearest is {out[ix]!r})")
    return out


_LABEL_ERRORS = {"group_ids": (AuditGroupError, AuditGroupShapeError),
                 "unit_ids": (AuditUnitError, AuditUnitShapeError)}


def _labels(value, n: int, key: str, source: str) -> np.ndarray:
    """One integer label per sample (``group_ids``, ``unit_ids``) from an array."""
    err, shape_err = _LABEL_ERRORS[key]
    what = f"{source}: {key!r}"
    arr = _as_array(value, what)
    if arr.ndim != 1:
        raise shape_err(f"{what} has shape {arr.shape}; expected one label per sample, shape ({n},)")
    if arr.size != n:
        raise shape_err(f"{what} has {arr.size} entries for {n} samples")
    kind = arr.dtype.kind
    if kind == "i":
        return arr.astype(np.int64)
    if kind == "u":
        bad = arr >= _INT64
    elif kind == "f":
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(arr) | (arr != np.floor(arr)) | (arr < -_INT64) | (arr >= _INT64)
        if not bad.any():  # whole numbers, but of a float dtype: refused as impl and the oracle refuse them
            raise err(f"{what} holds floats (dtype {arr.dtype}: {_preview(arr)}); labels must be integers, and "
                      "float labels are refused whatever their values, by impl.gdpo and the oracle as here "
                      "(spec section 6, GroupError); save them with an integer dtype (.astype(np.int64))")
    else:
        raise err(f"{what} holds {_KINDS.get(kind, str(arr.dtype))} (dtype {arr.dtype}); labels must be integers"
                  + (_UID_HINT if kind in "USO" else ""))
    if bad.any():
        i = _first(bad)[0]
        raise err(f"{what} row {i}: {arr[i].item()!r} is not an integer label")
    return arr.astype(np.int64)


def _weights(value, names: list[str], what: str) -> np.ndarray:
    """One real weight per reward column."""
    arr = _as_array(value, what)
    if arr.shape != (len(names),):
        raise AuditWeightShapeError(f"{what} has shape {arr.shape}; expected one weight per reward column "
                                    f"{names}, shape ({len(names)},)")
    return _real(arr, what, lambda ix: f"entry {ix[0]} ({names[ix[0]]!r})", AuditWeightError, AuditWeightError)


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
        rewards = _real(arr, what, lambda ix: f"row {ix[0]}, column {names[ix[1]]!r}")
    else:
        if not comp:
            raise AuditInputError(f"{source}: no 'rewards' array and no 'reward_<name>' arrays (found {sorted(keys)})")
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
        rewards = np.stack([_real(a, f"{source}: {k!r}", lambda ix: f"row {ix[0]}") for k, a in arrs.items()], 1)
        names = [k[len("reward_"):] for k in comp]
    if "group_ids" not in keys:
        raise AuditGroupError(f"{source}: no 'group_ids' array (found {sorted(keys)})")
    n = rewards.shape[0]
    group = _labels(data["group_ids"], n, "group_ids", source)
    unit = _labels(data["unit_ids"], n, "unit_ids", source) if "unit_ids" in keys else None
    weights = _weights(data["weights"], names, f"{source}: 'weights'") if "weights" in keys else None
    return Batch(rewards, group, unit, weights, names, source)


def _json_type(v) -> str:
    for t, name in ((bool, "boolean"), (dict, "object"), (list, "array"), (str, "string"), (int, "number"),
                    (float, "number")):
        if isinstance(v, t):
            return name
    return "null" if v is None else type(v).__name__


def _parsed(text: str):
    """A CSV cell as a number: an int where it reads as one (exact), else a float; None if neither."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return None


def _float_column(values, name: str, source: str, text: bool = False) -> np.ndarray:
    """Reward values of one column: numbers (JSON) or their text (CSV); an integer must be exact in float64."""
    out = np.empty(len(values))
    for i, v in enumerate(values):
        place = f"{source}: column {name!r}, row {i}"
        x = _parsed(v) if text and isinstance(v, str) else v
        if x is None:
            raise AuditDtypeError(f"{place}: {v!r} is not a number")
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise AuditDtypeError(f"{place}: {v!r} is not a number"
                                  + (f" (a JSON {_json_type(v)})" if not text else ""))
        if isinstance(x, int):
            try:
                f = float(x)
            except OverflowError:
                f = float("inf")
            if f != x:  # int == float compares exactly
                raise AuditRangeError(f"{place}: {v} is not exactly a float64 (the nearest is {f!r})")
            x = f
        out[i] = x
    return out


_UID_HINT = "; map string labels (verl's uids) to integers first, as pandas.factorize does"


def _looks_numeric(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def _preview(arr: np.ndarray) -> str:
    shown = ", ".join(repr(float(x)) for x in arr[:4])
    return f"[{shown}{', ...' if arr.size > 4 else ''}]"


def _int_column(values, name: str, source: str, text: bool = False, err=AuditGroupError) -> np.ndarray:
    """Integer labels of one column: JSON integers or their text (CSV); a float (JSON ``0.0``,
    CSV ``0.0``) is refused whatever its value, as impl.gdpo and the oracle refuse float labels."""
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        x = _parsed(v) if text and isinstance(v, str) else v
        if isinstance(x, float) and x.is_integer():
            raise err(f"{source}: column {name!r}, row {i}: {v!r} is a float, not an integer label; float labels "
                      "are refused whatever their values, by impl.gdpo and the oracle as here (spec section 6, "
                      "GroupError): write the labels as integers")
        if isinstance(x, bool) or not isinstance(x, int) or not -_INT64 <= x < _INT64:
            raise err(f"{source}: column {name!r}, row {i}: {v!r} is not an integer label"
                      + (f" (a JSON {_json_type(v)})" if not text and type(v) not in (int, float) else "")
                      + (_UID_HINT if isinstance(v, str) and not (text and _looks_numeric(v)) else ""))
        out[i] = x
    return out


def _open_text(path: Path, src: str):
    try:
        return path.open(newline="", encoding="utf-8-sig")
    except OSError as e:
        raise AuditInputError(f"{src}: cannot be read ({e.strerror or e})") from None


def _read_csv(path: Path) -> Batch:
    src = str(path)
    with _open_text(path, src) as f:
        reader = csv.DictReader(f)
        try:
            fields = reader.fieldnames
            if not fields or "group" not in fields:
                near = [f for f in fields or [] if f.strip().lower() in ("group", "uid", "index", "prompt_id")]
                raise AuditGroupError(f"{src}: the header must name a 'group' column (found {fields})"
                                      + (f"; rename {near[0]!r} to 'group' (exactly, no spaces)" if near else ""))
            rows = list(reader)
        except UnicodeDecodeError as e:
            raise AuditInputError(f"{src}: not UTF-8 text (byte {e.start}: {e.reason})") from None
        except csv.Error as e:
            raise AuditInputError(f"{src}: not valid CSV at line {reader.line_num}: {e}") from None
    dup = sorted({c for c in fields if fields.count(c) > 1})
    if dup:
        raise AuditInputError(f"{src}: the header names {dup} more than once")
    if not rows:
        raise AuditShapeError(f"{src}: no rows")
    names = [c for c in fields if c not in ("group", "unit")]
    if not names:
        raise AuditShapeError(f"{src}: no reward columns besides 'group'/'unit'")
    for i, row in enumerate(rows):
        if None in row or any(v is None for v in row.values()):
            raise AuditShapeError(f"{src}: row {i} has {'more' if None in row else 'fewer'} fields than the header")
    rewards = np.stack([_float_column([r[c] for r in rows], c, src, text=True) for c in names], 1)
    group = _int_column([r["group"] for r in rows], "group", src, text=True)
    unit = (_int_column([r["unit"] for r in rows], "unit", src, text=True, err=AuditUnitError)
            if "unit" in fields else None)
    return Batch(rewards, group, unit, None, names, src)


def _read_jsonl(path: Path) -> Batch:
    src = str(path)
    recs = []
    with _open_text(path, src) as f:
        try:
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    recs.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise AuditInputError(f"{src}: row {len(recs)} (line {i + 1}) is not JSON: {e.msg}") from None
        except UnicodeDecodeError as e:
            raise AuditInputError(f"{src}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    if not recs:
        raise AuditShapeError(f"{src}: no records")
    for i, rec in enumerate(recs):
        if not isinstance(rec, dict) or "group" not in rec or "rewards" not in rec:
            got = f"an object with keys {sorted(rec)}" if isinstance(rec, dict) else f"a JSON {_json_type(rec)}"
            raise AuditInputError(f"{src}: row {i} needs 'group' and 'rewards' (it is {got})")
        if not isinstance(rec["rewards"], (dict, list)):
            raise AuditDtypeError(f"{src}: row {i}: 'rewards' is a JSON {_json_type(rec['rewards'])}; expected an "
                                  "object {name: value} or an array of values")
    first = recs[0]["rewards"]
    names = list(first) if isinstance(first, dict) else [f"r{k}" for k in range(len(first))]
    if not names:
        raise AuditShapeError(f"{src}: row 0 has no rewards")
    rows = []
    for i, rec in enumerate(recs):
        rw = rec["rewards"]
        if isinstance(rw, dict) != isinstance(first, dict):
            raise AuditInputError(f"{src}: row {i} gives 'rewards' as a JSON {_json_type(rw)}, row 0 as a JSON "
                                  f"{_json_type(first)}")
        if isinstance(rw, dict):
            if set(rw) != set(names):
                raise AuditShapeError(f"{src}: row {i} has reward keys {sorted(rw)}, expected {sorted(names)}")
            rw = [rw[n] for n in names]
        if len(rw) != len(names):
            raise AuditShapeError(f"{src}: row {i} has {len(rw)} rewards, expected {len(names)}")
        rows.append(rw)
    rewards = np.stack([_float_column([r[k] for r in rows], names[k], src) for k in range(len(names))], 1)
    group = _int_column([r["group"] for r in recs], "group", src)
    has_unit = ["unit" in r for r in recs]
    if any(has_unit) and not all(has_unit):
        raise AuditUnitError(f"{src}: row {has_unit.index(False)} has no 'unit' but row {has_unit.index(True)} has "
                             "one; give every row a unit or none")
    unit = _int_column([r["unit"] for r in recs], "unit", src, err=AuditUnitError) if all(has_unit) else None
    return Batch(rewards, group, unit, None, names, src)


def _dtype_error(key: str) -> type:
    """The refusal for an entry ``key`` whose dtype is wrong."""
    if key == "rewards" or key.startswith("reward_"):
        return AuditDtypeError
    return {"group_ids": AuditGroupError, "unit_ids": AuditUnitError, "weights": AuditWeightError}.get(
        key, AuditInputError)


def _read_npz(path: Path) -> Batch:
    try:
        data = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise AuditInputError(f"{path}: not a readable .npz file ({e})") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise AuditInputError(f"{path}: one bare array (np.save), not an archive of named arrays (np.savez)")
    arrays = {}
    with data:
        for k in data.files:
            try:
                arrays[k] = data[k]
            except ValueError as e:
                if "allow_pickle" not in str(e):
                    raise AuditInputError(f"{path}: array {k!r} is not readable ({e})") from None
                raise _dtype_error(k)(f"{path}: {k!r} holds Python objects (dtype object), which audit does not "
                                      "unpickle; save numbers (or str names)") from None
            except Exception as e:  # a damaged member: zlib, zipfile, EOF errors
                raise AuditInputError(f"{path}: array {k!r} is not readable ({type(e).__name__}: {e})") from None
    return _from_mapping(arrays, str(path))


def _read_pt(path: Path) -> Batch:
    import torch

    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad file
        raise AuditInputError(f"{path}: not a readable .pt file ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict):
        raise AuditInputError(f"{path}: expected a dict of tensors, got {type(data).__name__}")
    return _from_mapping(data, str(path))


def read_batch(path: str | Path) -> Batch:
    path = Path(path)
    if not path.exists():
        raise AuditInputError(f"{path}: no such file")
    if path.is_dir():
        raise AuditInputError(f"{path}: a directory, not a file")
    suffix = path.suffix.lower()
    readers = {".csv": _read_csv, ".jsonl": _read_jsonl, ".npz": _read_npz, ".pt": _read_pt}
    if suffix not in readers:
        raise AuditInputError(f"{path}: unknown format {suffix!r} (expected .npz, .pt, .jsonl or .csv)")
    return readers[suffix](path)


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


# ------------------------------------------------------------------------- audit


class _Progress:
    """Stage-by-stage progress on stderr for large batches (the oracle is the slow part)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled = total, 0, enabled

    def step(self, what: str) -> None:
        self.done += 1
        if self.enabled:
            bar = "#" * self.done + "." * (self.total - self.done)
            sys.stderr.write(f"\r  [{bar}] {self.done}/{self.total} {what:<28}")
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def _refuse_nonfinite(batch: Batch) -> None:
    """A NaN or infinite reward, named as the file names it (the column's name, the row, the
    group label): the specification refuses it, so there is nothing to audit."""
    bad = np.argwhere(~np.isfinite(batch.rewards))
    if bad.size:
        i, k = (int(v) for v in bad[0])
        v = float(batch.rewards[i, k])
        label = batch.group_ids[i].item()
        more = f" (and {len(bad) - 1} more non-finite rewards)" if len(bad) > 1 else ""
        shown = "NaN" if v != v else repr(v)
        raise NonFiniteError(f"{batch.source}: column {batch.names[k]!r}, row {i} (group {label!r}) is "
                             f"{shown}{more}: the specification refuses non-finite rewards")


def _refuse_singletons(batch: Batch) -> None:
    """A group of one has no unbiased std (spec section 2): named by its label and first row."""
    labels, first, counts = np.unique(batch.group_ids, return_index=True, return_counts=True)
    lonely = np.flatnonzero(counts == 1)
    if lonely.size:
        j = lonely[np.argmin(first[lonely])]
        others = lonely.size - 1
        more = "" if not others else f", as {'does 1 other group' if others == 1 else f'do {others} other groups'}"
        raise GroupError(f"{batch.source}: group {_py(labels[j])!r} (row {int(first[j])}) has 1 sample{more}; "
                         "Eq. 4's unbiased std needs at least 2 (drop such groups, or merge them)")


def audit(batch: Batch, weights=None, eps: float = DEFAULT_EPS, progress: bool | None = None) -> dict:
    import torch

    from impl import gdpo as impl
    from oracle import gdpo as oracle

    r = batch.rewards
    N, K = r.shape
    if weights is not None:
        w = _weights(weights, batch.names, "the weights given (--weights)")
    elif batch.weights is not None:
        w = _weights(batch.weights, batch.names, f"{batch.source}: 'weights'")
    else:
        w = np.ones(K)
    _refuse_nonfinite(batch)
    _refuse_singletons(batch)
    try:  # impl's own refusals (Eq. 7 overflow) in the file's row order, before units reorder the rows
        impl.normalize_rewards(torch.from_numpy(r), group_ids=torch.from_numpy(batch.group_ids),
                               weights=w.tolist(), eps=eps)
    except GDPOError as e:
        raise type(e)(f"{batch.source}: impl.gdpo refuses the batch: {e}") from e
    units = batch.unit_ids if batch.unit_ids is not None else np.zeros(N, dtype=np.int64)
    order = np.argsort(units, kind="stable")  # whitening units as consecutive segments for impl
    ulabels, usizes = np.unique(units[order], return_counts=True)
    bar = _Progress(2 + len(CONVENTIONS) - 1, (N > 20_000) if progress is None else progress)
    res = oracle.advantages(r, batch.group_ids, weights=w, unit_ids=units, eps=eps)
    bar.step("exact oracle (spec)")
    exact = res.float64

    got = impl.gdpo_advantages(torch.from_numpy(r[order]), group_ids=torch.from_numpy(batch.group_ids[order]),
                               weights=w.tolist(), segment_sizes=usizes.tolist(), eps=eps,
                               out_dtype=torch.float64).numpy()
    impl_a = np.empty(N)
    impl_a[order] = got
    bar.step("impl.gdpo")
    allowed = res.allowed("float64")
    ratio = np.where(allowed > 0, np.abs(impl_a - exact) / np.where(allowed > 0, allowed, 1.0),
                     np.where(impl_a == exact, 0.0, np.inf))
    signal = impl.group_has_signal(torch.from_numpy(r), group_ids=torch.from_numpy(batch.group_ids),
                                   weights=w.tolist(), eps=eps).numpy()

    groups = []
    warn = False
    for gi, label in enumerate(res.group_labels):
        m = res.group_index == gi
        n = int(m.sum())
        flags = []
        cols = r[m]
        std = cols.std(axis=0, ddof=1) if n > 1 else np.zeros(K)
        collapsed = [batch.names[k] for k in range(K) if res.group_collapsed[gi, k]]
        if collapsed:
            flags.append(f"collapsed: {', '.join(collapsed)}")
        if not signal[gi]:
            flags.append("no signal: every advantage of the group is the unit's constant")
        if res.group_cancelled[gi] and len(collapsed) < K:
            flags.append("exact cancellation: the components cancel to exactly zero")
        cond = float(res.combined.cond[m].max())
        sharp = bool(res.combined.cond_sharp[m].all())  # then cond is the first-order change itself
        scale = max(float(np.abs(res.combined.float64[m]).max()), 1.0)
        if cond > ILL_CONDITIONED * scale:
            flags.append(f"ill-conditioned: one ulp of input moves a combined value by {cond:.2g} "
                         "(first-order change, sharp)" if sharp else
                         f"ill-conditioned: one ulp of input may move a combined value by up to {cond:.2g} "
                         "(a bound)")
        dom = [batch.names[k] for k in range(K) if 0 < std[k] < EPS_DOMINATED_FACTOR * eps]
        if dom:
            flags.append(f"eps-dominated std: {', '.join(dom)}")
        if n == 2:
            flags.append("n_g = 2: magnitudes lost, each varying column is +-0.7071")
        if np.any(np.abs(cols) > FLOAT32_MAX) or np.any(np.abs(np.abs(cols) @ np.abs(w)) > FLOAT32_MAX):
            flags.append("float32 range: rewards or weighted sums beyond float32 (float32 code overflows)")
        warn |= any(not f.startswith(ROUTINE) for f in flags)
        groups.append({"group": _py(label), "size": n, "signal": bool(signal[gi]), "flags": flags,
                       "max_cond_combined": cond, "max_cond_combined_sharp": sharp,
                       "impl_error_over_bound": float(ratio[m].max())})
    unit_rows = []
    for ui, label in enumerate(res.unit_labels):
        m = res.unit_index == ui
        unit_rows.append({"unit": _py(label), "size": int(m.sum()), "collapsed": bool(res.unit_collapsed[ui]),
                          "max_cond": float(res.cond[m].max()), "max_cond_sharp": bool(res.cond_sharp[m].all())})
        warn |= bool(res.unit_collapsed[ui])
    peers = {}
    for name, conv in CONVENTIONS.items():
        if name == "spec":
            continue
        try:
            token = np.ones(N, dtype=np.int64) if conv.whiten == "per_token" else None
            pr = oracle.advantages(r, batch.group_ids, weights=w, unit_ids=units, convention=name,
                                   token_counts=token)
            diff = np.abs(pr.float64 - exact)
            peers[name] = {"max_abs_difference": float(np.nanmax(diff)) if not np.all(np.isnan(diff)) else None,
                           "note": "verl with one token per sample" if token is not None else ""}
        except GDPOError as e:
            peers[name] = {"max_abs_difference": None, "note": f"refused: {e}"}
        bar.step(f"oracle ({name})")
    disagree = bool(np.any(ratio > 1.0) or np.any(impl_a[res.required_zero] != 0))
    status = DISAGREE if disagree else (WARN if warn else OK)
    return {"source": batch.source, "samples": N, "components": batch.names, "weights": w.tolist(), "eps": eps,
            "groups": groups, "units": unit_rows, "peers": peers,
            "impl_vs_oracle": {"max_error_over_bound": float(ratio.max()),
                               "max_abs_error": float(np.max(np.abs(impl_a - exact)))},
            "status": status}


def _py(x):
    return x.item() if hasattr(x, "item") else x


def render(report: dict) -> str:
    lines = [f"GDPO audit of {report['source']}: {report['samples']} samples, components "
             f"{', '.join(report['components'])}, weights {report['weights']}, eps {report['eps']}"]
    groups = report["groups"]
    warned = [g for g in groups if any(not f.startswith(ROUTINE) for f in g["flags"])]
    routine = sum(1 for g in groups if g["flags"]) - len(warned)
    lines.append(f"groups: {len(groups)}; with warnings {len(warned)}; with routine findings only {routine}; "
                 f"without signal {sum(1 for g in groups if not g['signal'])}")
    shown = groups if len(groups) <= LIST_ALL_GROUPS else warned
    lines.append("")
    lines.append(f"{'group':>8} {'size':>5} {'signal':>6}  findings")
    for g in shown:
        findings = "; ".join(g["flags"]) if g["flags"] else "-"
        lines.append(f"{str(g['group']):>8} {g['size']:>5} {('yes' if g['signal'] else 'NO'):>6}  {findings}")
    if len(shown) < len(groups):
        lines.append(f"({len(groups) - len(shown)} groups without warnings not listed: more than {LIST_ALL_GROUPS} "
                     "groups; --json lists every group)")
    lines.append("")
    for u in report["units"]:
        moves = ("moves an advantage by {:.2g} (first-order change, sharp)" if u.get("max_cond_sharp") else
                 "may move an advantage by up to {:.2g} (a bound)").format(u["max_cond"])
        lines.append(f"unit {u['unit']}: {u['size']} samples, one ulp of input {moves}"
                     + (", COLLAPSED (all advantages 0)" if u["collapsed"] else ""))
    iv = report["impl_vs_oracle"]
    lines.append(f"impl.gdpo vs exact oracle: worst error {iv['max_abs_error']:.3g} "
                 f"({iv['max_error_over_bound']:.3g} of the spec's error bound)")
    lines.append("peer conventions, largest change of an advantage against the spec:")
    for name, p in report["peers"].items():
        val = "n/a" if p["max_abs_difference"] is None else f"{p['max_abs_difference']:.3g}"
        lines.append(f"  {name:<17} {val}" + (f"  ({p['note']})" if p["note"] else ""))
    lines.append(f"status: {['ok', 'warnings', 'malformed', 'IMPLEMENTATION DISAGREES'][report['status']]}")
    return "\n".join(lines)


def main(file: str | None, weights=None, as_json: bool = False, eps: float = DEFAULT_EPS, out=None) -> int:
    out = out if out is not None else sys.stdout
    batch = None
    try:
        batch = read_batch(file) if file else example_batch()
        report = audit(batch, weights=weights, eps=eps)
    except GDPOError as e:
        said = str(e)
        if batch is not None and not said.startswith(f"{batch.source}:"):  # every refusal names the file
            said = f"{batch.source}: {said}"
        print(f"gdpo audit: {said}", file=sys.stderr)
        return MALFORMED
    print(json.dumps(_strict_json(report), indent=2, allow_nan=False) if as_json else render(report), file=out)
    return report["status"]


def _strict_json(x):
    """The report with every non-finite float as the string "inf", "-inf" or "nan": JSON has no
    such numbers, and json.dumps would write Infinity, which strict parsers refuse."""
    if isinstance(x, dict):
        return {k: _strict_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict_json(v) for v in x]
    if isinstance(x, float) and x != x:
        return "nan"
    if isinstance(x, float) and x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return x

