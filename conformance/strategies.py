"""Hypothesis strategies that hunt the hard cases of GDPO (GDPO_BRIEF section 5).

Each group column is drawn from a kind (:data:`COLUMN_KINDS`: TestFloat-style exponent tables
crossed with significand patterns, binary and small-integer rewards, offsets, ...), or two at
once for cancellation (:data:`PAIR_KINDS`, holding in some groups only); weights by a mode
(:data:`WEIGHT_MODES`). Nothing is capped or discarded for being ill-conditioned: the oracle and
the error model decide what a correct implementation returns. Every strategy takes a
:class:`Context`, what the call shape can express, so the same property runs under every shape.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import struct
import zlib

import numpy as np
import torch
from hypothesis import strategies as st

from conformance.cases import Case, DistCase
from spec.constants import FLOAT32_MAX
from spec.error_model import FORMATS, largest_finite


def cached(factory):
    """Memoise a strategy factory: building strategies inside draws is what makes
    generation slow (hypothesis validates every new strategy object). Keyed on the
    arguments' exact values (:func:`exact_key`), not on ``==``: ``pick((0, 0, 1))``
    must not hand back ``pick((0.0, -0.0, 1.0))``, or what a strategy draws would
    depend on which of the two some earlier test built first."""
    memo: dict = {}

    @functools.wraps(factory)
    def wrapper(*args, **kwargs):
        args = tuple(tuple(a) if isinstance(a, list) else a for a in args)
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}
        key = exact_key((args, tuple(sorted(kwargs.items()))))
        if key not in memo:
            memo[key] = factory(*args, **kwargs)
        return memo[key]

    return wrapper


def exact_key(x):
    """A hashable key equal only for the same values: a float by its bits (0.0 and -0.0
    apart), every value with its type (0, 0.0 and False apart), tuples and frozen
    dataclasses element by element."""
    if isinstance(x, float):
        return type(x), struct.pack("<d", x)
    if isinstance(x, tuple):
        return type(x), tuple(exact_key(v) for v in x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return type(x), tuple(exact_key(getattr(x, f.name)) for f in dataclasses.fields(x))
    return type(x), x


@cached
def pick(values: tuple) -> st.SearchStrategy:
    return st.sampled_from(values)


@cached
def ints(lo: int, hi: int) -> st.SearchStrategy:
    return st.integers(lo, hi)


BOOLS = st.booleans()


@cached
def anyof(*strategies) -> st.SearchStrategy:
    return st.one_of(*strategies)


@dataclasses.dataclass(frozen=True)
class DtypeFacts:
    name: str
    p: int  # significand bits, implicit bit included
    emin: int  # smallest normal exponent (value 2^emin)
    emax: int  # largest exponent
    max: float

    @property
    def sub_min(self) -> int:
        return self.emin - self.p + 1


DTYPES = {name: DtypeFacts(name, *FORMATS[name], largest_finite(name)) for name in FORMATS}


def round_to(values, dtype: str) -> np.ndarray:
    """Round float64 values to ``dtype`` (nearest even), clamped to its finite range first."""
    a = np.asarray(values, dtype=np.float64)
    if dtype == "float64":
        return a.copy()
    top = DTYPES[dtype].max
    a = np.clip(a, -top, top)
    return torch.from_numpy(np.ascontiguousarray(a)).to(getattr(torch, dtype)).to(torch.float64).numpy()


def exponent_table(dtype: str) -> list[int]:
    """TestFloat-style exponents: range ends, the normal boundary, around p, the middle."""
    f = DTYPES[dtype]
    pts = {f.sub_min, f.sub_min + 1, f.emin - 1, f.emin, f.emin + 1, -f.p - 1, -f.p, -f.p + 1,
           -2, -1, 0, 1, 2, f.p - 1, f.p, f.p + 1, f.emax - 1, f.emax}
    if dtype == "float64":
        pts |= {-600, -149, -126, -60, -24, 24, 60, 126, 127, 128, 500, 1000}
    elif f.emax > 60:
        pts |= {-60, -30, 30, 60}
    return sorted(e for e in pts if f.sub_min <= e <= f.emax)


@cached
def significand_patterns(dtype: str) -> st.SearchStrategy:
    """Fraction bits of a p-bit significand: the TestFloat patterns plus random bits."""
    q = DTYPES[dtype].p - 1
    fixed = [0, (1 << q) - 1, 1, 1 << (q - 1), (1 << (q - 1)) | 1, int("01" * (q // 2 + 1), 2) & ((1 << q) - 1),
             (1 << q) - 2]
    return st.one_of(st.sampled_from(fixed), st.integers(0, (1 << q) - 1))


@cached
@st.composite
def testfloat(draw, dtype: str, exponents=None) -> float:
    f = DTYPES[dtype]
    e = draw(st.sampled_from(exponents or exponent_table(dtype)))
    frac = draw(significand_patterns(dtype))
    sign = -1.0 if draw(BOOLS) else 1.0
    v = sign * math.ldexp((1 << (f.p - 1)) + frac, e - (f.p - 1)) if e <= 1023 else sign * f.max
    return float(round_to([v], dtype)[0])


@cached
def plain_floats(dtype: str, lo=-1e3, hi=1e3) -> st.SearchStrategy:
    width = {"float64": 64, "float32": 32, "float16": 16}.get(dtype, 64)
    s = st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False, width=width)
    return s.map(lambda v: float(round_to([v], dtype)[0]))


# ---------------------------------------------------------------- columns per group

COLUMN_KINDS = ("binary", "ints", "plain", "testfloat", "offset", "constant", "runs", "near_constant",
                "huge", "beyond32", "tiny")
PAIR_KINDS = ("anti_exact", "anti_decimal", "shift_exact", "copy", "scaled")

#: Offsets at which naive statistics lose the spread (brief section 5).
OFFSETS = (1e3, 1e4, 1e6, 1e8, 1e11, 1e12, 2.0 ** 52, 2.0 ** 53, 1e15, 1e17, 3e38, 1e300)
SPREADS = (0.5, 0.01, 0.005, 0.001, 1e-5, 1e-9)


@cached
def _values(n, elem):
    return st.lists(elem, min_size=n, max_size=n)


@cached
@st.composite
def column_values(draw, kind: str, dtype: str, n: int) -> list[float]:
    f = DTYPES[dtype]
    if kind == "binary":
        scale = draw(pick((1.0, 1.0, 1.0, -1.0, 0.5, 3.0, 1e4,)))
        bits = draw(_values(n, pick((0.0, 1.0,))))
        return list(round_to([b * scale for b in bits], dtype))
    if kind == "ints":
        return [float(v) for v in draw(_values(n, ints(-3, 10)))]
    if kind == "plain":
        hi = draw(pick((1.0, 100.0, 1e3, min(1e6, f.max),)))
        return draw(_values(n, plain_floats(dtype, -hi, hi)))
    if kind == "testfloat":
        table = exponent_table(dtype)
        i = draw(ints(0, len(table) - 1))
        width = draw(pick((0, 1, 3, len(table),)))
        window = table[i:i + width + 1]
        return draw(_values(n, testfloat(dtype, window)))
    if kind == "offset":
        c = draw(pick(tuple(o for o in OFFSETS if o < f.max)))
        spread = draw(pick(SPREADS + (math.ulp(c) * 3,)))
        steps = draw(_values(n, ints(0, 4)))
        sign = draw(pick((1.0, -1.0,)))
        return list(round_to([sign * (c + s * spread) for s in steps], dtype))
    if kind == "constant":
        v = draw(anyof(testfloat(dtype), plain_floats(dtype), pick((0.0, -0.0, 1.0))))
        return [v] * n
    if kind == "runs":  # few distinct values, mostly one: hypothesis' array fill in miniature
        a = draw(anyof(testfloat(dtype), pick((0.0, 1.0))))
        b = draw(anyof(testfloat(dtype), pick((0.0, 1.0))))
        return draw(_values(n, st.sampled_from([a, a, a, b])))  # runtime values: not memoised
    if kind == "near_constant":  # real signal, ulps apart: must not collapse
        v = draw(anyof(testfloat(dtype), pick((1e4, 1.0, 0.1, 3e38))))
        v = float(round_to([v], dtype)[0])
        steps = draw(_values(n, ints(-1, 2)))
        if all(s == steps[0] for s in steps):
            steps[-1] += 1
        out = []
        for s in steps:
            x = v
            for _ in range(abs(s)):
                x = _next(x, math.copysign(math.inf, s), dtype)
            out.append(x)
        return out
    if kind == "huge":  # around the top of the input dtype (float32 statistics overflow there)
        k = draw(_values(n, ints(0, 3)))
        signs = draw(_values(n, pick((1.0, -1.0,))))
        return list(round_to([s * f.max * (1.0 - j * 2.0 ** -(f.p - 1)) for s, j in zip(signs, k)], dtype))
    if kind == "beyond32":  # float64 values float32 cannot hold: computed, or refused naming the input
        if dtype != "float64":
            return draw(column_values("huge", dtype, n))
        e = draw(pick((128, 200, 500, 664, 1000, 1023,)))
        return draw(_values(n, testfloat(dtype, [e, e - 1, e - 3])))
    if kind == "tiny":  # subnormals and signed zeros
        table = [f.sub_min, f.sub_min + 1, f.sub_min + 3, f.emin - 1, f.emin]
        return draw(_values(n, anyof(testfloat(dtype, tuple(table)), pick((0.0, -0.0)))))
    raise ValueError(kind)


def _next(x: float, toward: float, dtype: str) -> float:
    """The value of ``dtype`` next to ``x`` (one of its values) in the direction of ``toward`` (+-inf)."""
    t = torch.tensor([x], dtype=getattr(torch, dtype))
    return torch.nextafter(t, torch.full_like(t, toward)).item()


@cached
@st.composite
def pair_values(draw, kind: str, dtype: str, n: int, holds: bool) -> tuple[list[float], list[float]]:
    """Two columns of one group; where ``holds`` the pair relation is exact."""
    f = DTYPES[dtype]
    if kind in ("anti_exact", "shift_exact"):
        # integers times 2^e: every value and every C - r1 (r1 + C) is exact
        cbits = min(draw(pick((4, 10, 24, 30, 40, f.p - 1, f.p,))), f.p)
        big = 1 << cbits
        e = draw(pick((0, 0, -10, -30, 20, max(f.sub_min, -1060), 60,)))
        e = max(f.sub_min, min(e, f.emax - cbits - 1))
        lo, hi = {"spread": (0, big), "near_zero": (0, 7), "near_top": (big - 7, big)}[
            draw(pick(("spread", "near_zero", "near_top",)))]
        m = draw(_values(n, ints(lo, hi)))
        r1 = [math.ldexp(v, e) for v in m]
        if kind == "anti_exact":
            r2 = [math.ldexp(big - v, e) for v in m]
        else:
            shift = draw(ints(0, big - max(m)))
            r2 = [math.ldexp(v + shift, e) for v in m]
    elif kind == "anti_decimal":  # the brief's [C - d, d]: not exact in floats, real signal
        c = draw(pick((1e3, 1e9, 1e11, 1e13, 1e15, 2.0 ** 53,)))
        d = draw(_values(n, pick((0.1, 0.2, 0.3, 0.7, 0.0, 1.0,))))
        r1 = list(round_to(d, dtype))
        r2 = list(round_to([c - v for v in r1], dtype))
    elif kind == "copy":
        r1 = draw(column_values(draw(pick(("plain", "testfloat", "offset", "binary",))), dtype, n))
        r2 = list(r1)
    elif kind == "scaled":
        r1 = draw(column_values(draw(pick(("plain", "testfloat", "binary",))), dtype, n))
        s = draw(pick((1, -1, 10, -20,)))
        r2 = list(round_to([math.copysign(min(abs(v) * 2.0 ** s, f.max), v) for v in r1], dtype))
    else:
        raise ValueError(kind)
    r1, r2 = list(round_to(r1, dtype)), list(round_to(r2, dtype))
    if not holds:
        r2 = draw(column_values(draw(pick(("binary", "plain", "offset",))), dtype, n))
    return r1, r2


#: Weight of the second column of a pair relative to the first, for it to cancel.
_PAIR_SIGN = {"anti_exact": 1.0, "anti_decimal": 1.0, "shift_exact": -1.0, "copy": -1.0, "scaled": -1.0}


# ----------------------------------------------------------------- whole batches


@dataclasses.dataclass(frozen=True)
class Context:
    """What the call shape under test can express (see subject.Subject)."""

    labels: bool = True  # ragged groups by label (else contiguous equal groups only)
    units: bool = True  # segment_sizes
    eps: bool = True
    input_dtypes: tuple = ("float32", "float64", "float16", "bfloat16")
    out_dtypes: tuple = ("float32", "float64", "float16", "bfloat16")
    weights_dtype: str = "float64"  # float32 for the TRL shape (reward_weights is a float32 tensor)
    max_n: int = 48


@dataclasses.dataclass
class Batch:
    dtype: str
    blocks: list  # per group: (n_g, K) float64 arrays of exact dtype values
    weights: tuple | None
    note: str


WEIGHT_MODES = ("none", "ones", "equal", "random", "testfloat", "extreme", "signed")
EXTREME_WEIGHTS = (2.0 ** -1074, 2.0 ** -1022, 1e-300, 1e-30, 1e30, FLOAT32_MAX, 1e300, 2.0 ** 1023,
                   1.7976931348623157e308)


@cached
@st.composite
def weight_vector(draw, k: int, modes=WEIGHT_MODES, dtype="float64") -> tuple | None:
    mode = draw(pick(tuple(modes)))
    if mode == "none":
        return None
    if mode == "ones":
        w = [1.0] * k
    elif mode == "equal":
        v = draw(anyof(plain_floats("float64", 1e-3, 1e3), pick((0.5, 3.0, 16777216.0))))
        w = [v] * k
    elif mode == "random":
        w = draw(_values(k, plain_floats("float64", -10.0, 10.0)))
    elif mode == "testfloat":
        w = draw(_values(k, testfloat("float64")))
    elif mode == "extreme":
        w = draw(_values(k, pick(EXTREME_WEIGHTS + (1.0,))))
        signs = draw(_values(k, pick((1.0, -1.0))))
        w = [a * b for a, b in zip(w, signs)]
    else:  # signed: zeros and negatives among ordinary weights
        w = draw(_values(k, pick((0.0, 1.0, -1.0, 2.0, 0.25, -0.5))))
    w = list(round_to(w, dtype)) if dtype != "float64" else [float(x) for x in w]
    if not any(x != 0.0 for x in w):
        w[0] = 1.0
    return tuple(w)


def _pair_weight(draw, w1: float, kind: str, wdtype: str) -> float:
    """Second weight of a pair: cancelling, nearly cancelling, float32-indistinct or free
    (``wdtype``: the dtype weights travel in, float32 for the TRL shape)."""
    target = _PAIR_SIGN[kind] * w1
    how = draw(pick(("cancel", "cancel", "near", "f32", "free",)))
    if how == "cancel":
        return target
    if how == "near":  # real signal 2^-j of the parts: below any "rounding" threshold for large j
        j = draw(pick((20, 30, 40, 52) if wdtype == "float64" else (8, 12, 20)))
        v = target * (1.0 + 2.0 ** -j)
        return v if v != target else math.nextafter(target, math.inf)
    if how == "f32" and wdtype == "float64":  # distinct in float64, equal in float32
        v = math.nextafter(target, math.inf)
        with np.errstate(over="ignore"):
            return v if float(np.float32(v)) == float(np.float32(target)) else target
    return draw(plain_floats("float64", -2.0, 2.0))


_SIZES = st.lists(pick((2, 2, 3, 4, 5, 7, 9)), min_size=1, max_size=8)


@cached
@st.composite
def group_sizes(draw, ctx: Context, equal: bool) -> list[int]:
    if equal:
        n = draw(pick((2, 2, 3, 4, 4, 5, 8, 16,)))
        g = draw(ints(1, max(1, ctx.max_n // n)))
        return [n] * g
    sizes = list(draw(_SIZES))
    while sum(sizes) > ctx.max_n:
        sizes.pop()
    return sizes or [2]


#: Batches of the ``large`` property: N from 65 (past every small-batch special case up to
#: 64 rows) to about 300, groups of up to 64 samples, every K of 1..8, up to 8 units.
LARGE_N = (65, 300)
LARGE_K = (1, 2, 3, 4, 5, 6, 7, 8)
LARGE_UNITS = 8
#: The sparse very-large tier of the ``large`` property: in about one example in ``BIG_EVERY``
#: one or two groups of 65 to 600 samples (past 64, where a size-dependent "fast path" may
#: switch, and past 512, where a fused kernel may hand groups to another path) join
#: the batch: N up to about 1,500. Sparse (about 5 of the ci profile's 40 examples) because
#: the oracle's cost grows with N (1,200 x 2: 0.35-0.5 s on one core; 300 x 2: 0.1 s).
BIG_GROUP_SIZES = (65, 96, 127, 128, 129, 200, 255, 256, 257, 384, 511, 512, 513, 600)
BIG_GROUP_MAX = 600
BIG_EVERY = 8
#: Groups of more rows than this draw a few values per column (a template) and spread them
#: over their rows by a drawn seed, every value of the template on some row: hypothesis draws
#: each value otherwise, and a group of 600 rows would cost thousands of choices per column
#: (hypothesis gives up on an example past 8,192).
DRAWN_ROWS_MAX = 64


_LARGE_SIZES = st.lists(pick((2, 3, 5, 7, 9, 16, 17, 31, 33, 48, 64)), min_size=1, max_size=24)


@cached
@st.composite
def large_group_sizes(draw, ctx: Context, equal: bool) -> list[int]:
    """Group sizes summing to N in ``LARGE_N`` (ctx.max_n, the small batches' cap, does not apply)."""
    lo, hi = LARGE_N
    if equal:
        n = draw(pick((2, 4, 8, 13, 16, 32, 64,)))
        return [n] * draw(ints(-(-lo // n), hi // n))
    sizes = list(draw(_LARGE_SIZES))
    while sum(sizes) > hi:
        sizes.pop()
    while sum(sizes) < lo:  # runtime values: grown until the batch is large
        sizes.append(draw(pick((2, 3, 5, 7, 9, 16, 17, 31, 33, 48, 64,))))
    return sizes  # below lo + 64 <= hi once grown


_BIG_SIZE = st.one_of(pick(BIG_GROUP_SIZES), ints(DRAWN_ROWS_MAX + 1, BIG_GROUP_MAX))


@cached
@st.composite
def row_spread(draw, n: int) -> np.ndarray:
    """For a group of more than ``DRAWN_ROWS_MAX`` rows: which of m template values each row
    takes (every one on some row, the rest by a drawn seed)."""
    m = draw(pick((3, 5, 8, 16, 32)))
    rng = np.random.default_rng(draw(ints(0, 2 ** 32 - 1)))
    idx = np.concatenate([np.arange(m), rng.integers(0, m, n - m)])
    rng.shuffle(idx)
    return idx


@cached
@st.composite
def batches(draw, ctx: Context, kinds=COLUMN_KINDS, pairs=PAIR_KINDS, k_max=8, weight_modes=WEIGHT_MODES,
            dtype=None, large=False) -> Batch:
    dtype = dtype or draw(pick(tuple(ctx.input_dtypes)))
    equal = draw(BOOLS) or not ctx.labels
    sizes = draw(large_group_sizes(ctx, equal) if large else group_sizes(ctx, equal))
    cols: list[list[list[float]]] = []  # per column, per group
    pair_of: dict[int, str] = {}
    note = []
    pool = tuple(x for x in LARGE_K if x <= k_max)
    # large: max(pool) columns drawn, K chosen after them (below)
    k = max(pool) if large else draw(pick(tuple(x for x in (1, 1, 2, 2, 2, 3, 4, 5, 6, 7, 8) if x <= k_max)))
    starts = []  # the first column of each note entry
    entries = []  # what each note entry drew: (kind, None) or (pair kind, share)
    while len(cols) < k:
        starts.append(len(cols))
        if pairs and len(cols) + 1 < k and draw(ints(0, 2)) == 0:  # a pair of columns
            kind = draw(pick(tuple(pairs)))
            share = draw(pick((1.0, 1.0, 0.5, 0.0,)))
            drawn = [draw(pair_values(kind, dtype, n, share == 1.0 or (share > 0 and draw(BOOLS)))) for n in sizes]
            pair_of[len(cols) + 1] = kind
            cols += [[a for a, _ in drawn], [b for _, b in drawn]]
            note.append(f"pair:{kind}")
            entries.append((kind, share))
        else:
            kind = draw(pick(tuple(kinds)))
            cols.append([draw(column_values(kind, dtype, n)) for n in sizes])
            note.append(kind)
            entries.append((kind, None))
    if large:
        # K from the drawn values as well as a draw of its own: hypothesis runs only a few fresh
        # examples in 40 and mutates each several times, copying spans of equal label (column
        # values, never a lone K), so a K drawn alone repeats in runs and misses some of 1..8
        k = pool[(draw(ints(0, len(pool) - 1)) + zlib.crc32(repr(cols).encode())) % len(pool)]
        # the very-large tier (BIG_EVERY), decided the same way
        if big := (draw(ints(0, BIG_EVERY - 1)) + zlib.crc32(b"big" + repr(cols).encode())) % BIG_EVERY == 0:
            sizes, cols = _with_big_groups(draw, dtype, sizes, cols, starts, entries, equal)
        cols = cols[:k]
        pair_of = {j: kind for j, kind in pair_of.items() if j < k}
        note = [(f"{t}(cut)" if t.startswith("pair:") and j + 1 >= k else t) for j, t in zip(starts, note) if j < k]
        if big:
            note.append("big_groups:" + "/".join(str(n) for n in sizes if n > DRAWN_ROWS_MAX))
    weights = draw(weight_vector(k, weight_modes, ctx.weights_dtype))
    if pair_of:
        w = list(weights) if weights is not None else [1.0] * k
        for j, kind in pair_of.items():
            w[j] = _pair_weight(draw, w[j - 1], kind, ctx.weights_dtype)
        w = list(round_to(w, ctx.weights_dtype)) if ctx.weights_dtype != "float64" else w
        if not any(x != 0.0 for x in w):
            w[0] = 1.0
        weights = tuple(w) if (weights is not None or any(x != 1.0 for x in w)) else None
    blocks = [np.array([[cols[c][g][i] for c in range(k)] for i in range(n)], dtype=np.float64)
              for g, n in enumerate(sizes)]
    return Batch(dtype, blocks, weights, ",".join(note))


def _with_big_groups(draw, dtype, sizes, cols, starts, entries, equal):
    """(sizes, cols) with one or two groups of 65 to 600 rows: among the drawn groups, or, for
    contiguous equal groups, instead of them. Each column of a new group is its column's kind
    (a pair's relation as drawn, holding or not), a few values spread over the rows."""
    count = draw(ints(1, 2))
    big = [draw(_BIG_SIZE) for _ in range(count)]
    if equal:
        big = [big[0]] * count
        order = [("new", j) for j in range(count)]
    else:
        order = [("old", g) for g in range(len(sizes))]
        for j in range(count):
            order.insert(draw(ints(0, len(order))), ("new", j))
    spreads = [draw(row_spread(n)) for n in big]
    new: dict[int, list] = {c: [] for c in range(len(cols))}  # per column, per new group
    for c, (kind, share) in zip(starts, entries):
        for spread in spreads:
            m = int(spread.max()) + 1
            if share is None:
                values = draw(column_values(kind, dtype, m))
                new[c].append([values[i] for i in spread])
            else:
                a, b = draw(pair_values(kind, dtype, m, share == 1.0 or (share > 0 and draw(BOOLS))))
                new[c].append([a[i] for i in spread])
                new[c + 1].append([b[i] for i in spread])
    sizes = [sizes[i] if tag == "old" else big[i] for tag, i in order]
    cols = [[col[i] if tag == "old" else new[c][i] for tag, i in order] for c, col in enumerate(cols)]
    return sizes, cols


UNIT_MODES = ("none", "one", "groups", "groups", "free")

#: Output dtypes as drawn: float64 and float32 twice as often as float16 and bfloat16,
#: whose half ulp (2^-11, 2^-8 relative) hides the small errors of wrong algorithms that
#: float64 and float32 outputs expose; the rounding property aims at the narrow ones.
_OUT_WEIGHTS = ("float64", "float32", "float64", "float32", "float16", "bfloat16")


def out_dtype_pool(ctx: Context) -> tuple:
    return tuple(d for d in _OUT_WEIGHTS if d in ctx.out_dtypes) or tuple(ctx.out_dtypes)


@cached
@st.composite
def unit_layout(draw, n: int, group_edges: list[int], modes=UNIT_MODES, max_units=4) -> tuple | None:
    """Consecutive unit sizes summing to n (None: one unit), empty units included;
    no unit of exactly one sample (an error case, tested by ``errors``)."""
    mode = draw(pick(tuple(modes)))
    if mode == "none":
        return None
    if mode == "one" or n < 4:
        return (n,)
    s = draw(ints(2, max_units))
    pool = group_edges if (mode == "groups" and group_edges) else list(range(0, n + 1))
    cuts = sorted(draw(_values(s - 1, pick(tuple(pool)))))
    edges = [0] + cuts + [n]
    sizes = [b - a for a, b in zip(edges, edges[1:])]
    while 1 in sizes:  # merge a unit of one into the nearest non-empty unit (n >= 4: one exists)
        i = sizes.index(1)
        j = min((j for j in range(len(sizes)) if j != i and sizes[j] > 0), key=lambda j: abs(j - i))
        sizes[j] += 1
        sizes[i] = 0
    return tuple(sizes)


#: Label pools (one drawn per labelled case). ``wrap32``: distinct int64 labels in pairs that
#: collide once narrowed to int32 (k and 2^32 + k, -1 and 2^32 - 1, -2^31 and 2^31, ...).
#: ``near64``: distinct int64 labels in pairs that collide once cast to float64 (beyond 2^53
#: float64 skips integers): 2^62 + 4t and 2^62 + 4t + 1, 2^53 + 4t and 2^53 + 4t + 1 (a tie,
#: rounded to the even 2^53 + 4t), -2^63 + 4t and -2^63 + 4t + 1, the three bases in turn.
LABEL_POOLS = ("consecutive", "sparse", "negative", "huge", "wrap32", "near64")
#: The bases of ``near64``'s pairs (float64's spacing there: 1024, 2 and 1024).
_NEAR64_BASES = (2 ** 62, 2 ** 53, -2 ** 63)
_WRAP32_PAIRS = ((0, 2 ** 32), (-1, 2 ** 32 - 1), (-2 ** 31, 2 ** 31), (2 ** 31 - 1, -2 ** 31 - 1),
                 (1, 2 ** 63 - 2 ** 32 + 1), (-2 ** 63, 2 ** 62))


def label_pool(name: str, g: int) -> list[int]:
    """g distinct int64 labels of pool ``name``."""
    if name == "consecutive":
        return list(range(g))
    if name == "sparse":
        return [3 * i + 7 for i in range(g)]
    if name == "negative":
        return [-i - 1 for i in range(g)]
    if name == "huge":
        return [2 ** 40 + i for i in range(g)]
    if name == "wrap32":  # pair j: two labels equal modulo 2^32 (beyond the table: j and j + 2^32 j)
        pairs = list(_WRAP32_PAIRS) + [(j, j + (j << 32)) for j in range(len(_WRAP32_PAIRS) + 10, g + 10)]
        return [x for pair in pairs for x in pair][:g]
    if name == "near64":  # pair q: base + 4t and base + 4t + 1, one float64 (t = q // 3, base q % 3)
        return [_NEAR64_BASES[(j // 2) % 3] + 4 * (j // 6) + j % 2 for j in range(g)]
    raise ValueError(name)


@st.composite
def cases(draw, ctx: Context, kinds=COLUMN_KINDS, pairs=PAIR_KINDS, weight_modes=WEIGHT_MODES, k_max=8,
          eps_values=(None,), unit_modes=UNIT_MODES, dtype=None, large=False) -> Case:
    """A single-process call (unit layouts only where the shape can express them); ``large``:
    the batches of ``LARGE_N`` rows and the very-large tier (``BIG_EVERY``) described above."""
    b = draw(batches(ctx, kinds, pairs, k_max, weight_modes, dtype, large))
    sizes = [blk.shape[0] for blk in b.blocks]
    rows = np.concatenate(b.blocks)
    n = rows.shape[0]
    labels = np.repeat(np.arange(len(sizes)), sizes)
    equal = len(set(sizes)) == 1
    use_labels = ctx.labels and (not equal or draw(BOOLS))
    group_size = group_ids = None
    if use_labels:
        pool = label_pool(draw(pick(LABEL_POOLS)), len(sizes))
        mapping = draw(st.permutations(pool))
        lab = np.array([mapping[i] for i in labels], dtype=np.int64)
        if draw(BOOLS):  # interleave the groups' rows (by a drawn seed in the very-large tier)
            if n > LARGE_N[1]:
                perm = np.random.default_rng(draw(ints(0, 2 ** 32 - 1))).permutation(n).astype(np.int64)
            else:
                perm = np.array(draw(st.permutations(list(range(n)))), dtype=np.int64)
            rows, lab = rows[perm], lab[perm]
        group_ids = tuple(int(x) for x in lab)
    else:
        group_size = sizes[0]
    edges = list(np.cumsum(sizes)[:-1])  # group boundaries (before any interleaving)
    seg = None
    if ctx.units and unit_modes:
        seg = draw(unit_layout(n, [int(e) for e in edges], unit_modes, LARGE_UNITS if large else 4))
    eps = draw(pick(tuple(eps_values))) if ctx.eps else None
    out_pool = out_dtype_pool(ctx)
    if "big_groups:" in b.note:  # few and costly: outputs whose ulp shows a float32 statistic's error
        out_pool = tuple(d for d in out_pool if d in ("float64", "float32")) or out_pool
    out_dtype = draw(pick(out_pool))
    return Case(rewards=tuple(tuple(float(v) for v in row) for row in rows), dtype=b.dtype,
                group_size=group_size, group_ids=group_ids, weights=b.weights, segment_sizes=seg,
                eps=eps, out_dtype=out_dtype, note=b.note)


#: How :func:`missing_cases` leaves rewards unscored (NaN): scattered cells, whole rows (no reward
#: scored), a group column left with 0 or 1 scored members, TRL's multi-environment batches (each
#: group scored by the columns of its environment only, NaN in the others), everything at once,
#: or nothing (the option on finite rewards: the bits of the default).
MISSING_MODES = ("cells", "rows", "few_in_column", "environments", "mixed", "mixed", "all", "none")


def _nan_mask(rng, mode: str, n: int, k: int, labels: np.ndarray) -> np.ndarray:
    """(n, k) bool: the rewards :data:`MISSING_MODES`' ``mode`` leaves unscored."""
    groups = [np.flatnonzero(labels == g) for g in dict.fromkeys(labels.tolist())]
    nan = np.zeros((n, k), bool)
    if mode in ("cells", "mixed"):
        nan |= rng.random((n, k)) < rng.choice((0.1, 0.3, 0.6))
    if mode in ("rows", "mixed"):
        nan[rng.random(n) < rng.choice((0.15, 0.4, 0.8)), :] = True
    if mode in ("few_in_column", "mixed"):
        for idx in groups:
            if rng.random() < 0.5:
                col = int(rng.integers(k))
                keep = idx[rng.permutation(idx.size)[:int(rng.integers(2))]]  # 0 or 1 scored member
                nan[np.setdiff1d(idx, keep), col] = True
    if mode == "environments":  # each group scored by the columns of its environment only
        envs = max(1, min(k, int(rng.integers(1, 4))))
        env_of_col = rng.integers(envs, size=k)
        for idx in groups:
            nan[np.ix_(idx, env_of_col != rng.integers(envs))] = True
    if mode == "all":
        nan[:] = True
    return nan


def _unscored(case: Case, nan: np.ndarray, note: str) -> Case:
    r = case.rewards_array().copy()
    r[nan] = np.nan
    return dataclasses.replace(case, rewards=tuple(tuple(float(v) for v in row) for row in r), missing="unscored",
                               note=note)


def _missing_rng(draw, case) -> tuple:
    """A generator seeded by a draw and the case's digest (the drawn seed alone is often 0 or
    small, so many cases would share one mask pattern), and the mode drawn from it."""
    rng = np.random.default_rng([draw(ints(0, 2 ** 32 - 1)), zlib.crc32(case.dumps().encode())])
    return rng, MISSING_MODES[int(rng.integers(len(MISSING_MODES)))]


@st.composite
def missing_cases(draw, ctx: Context, **kw) -> Case:
    """A :func:`cases` call under ``missing="unscored"`` (spec/gdpo.md section 2), with a
    NaN mask drawn over its rewards by one of :data:`MISSING_MODES`."""
    case = draw(cases(ctx, **kw))
    rng, mode = _missing_rng(draw, case)
    n, k = case.n, case.k
    nan = _nan_mask(rng, mode, n, k, case.labels())
    return _unscored(case, nan, f"{case.note}; unscored: {mode}, {int(nan.sum())} of {n * k} rewards NaN, "
                                f"{int(nan.all(axis=1).sum())} rows unscored")


@st.composite
def dist_missing_cases(draw, ctx: Context, world: int, **kw) -> DistCase:
    """:func:`dist_cases` under ``missing="unscored"`` on every rank, a NaN mask per shard by
    one mode (a twinned group keeps its twin's mask: their advantages must still agree bit
    for bit)."""
    case = draw(dist_cases(ctx, world, **kw))
    rng, mode = _missing_rng(draw, case)
    masks = [_nan_mask(rng, mode, sh.n, sh.k, sh.labels()) if sh.n else np.zeros((0, sh.k), bool)
             for sh in case.shards]
    for ra, oa, rb, ob, n in twins(case):
        masks[rb][ob:ob + n] = masks[ra][oa:oa + n]
    shards = tuple(_unscored(sh, m, sh.note) if sh.n else dataclasses.replace(sh, missing="unscored")
                   for sh, m in zip(case.shards, masks))
    total = sum(int(m.all(axis=1).sum()) for m in masks)
    return DistCase(shards, note=f"{case.note};unscored: {mode}, {total} rows unscored")


@st.composite
def dist_cases(draw, ctx: Context, world: int, kinds=COLUMN_KINDS, pairs=PAIR_KINDS,
               weight_modes=WEIGHT_MODES, k_max=4) -> DistCase:
    """Shards of one batch over ``world`` ranks: each group on one rank, units spanning
    ranks with different counts per rank, empty shards, and one group twinned on two
    ranks of the same unit (their advantages must agree bit for bit). One unit is passed as
    no segment_sizes at all in about half its cases, and always where the domain has no units:
    Eq. 6 over the whole batch across ranks is graded in a code that takes none."""
    small = dataclasses.replace(ctx, max_n=min(ctx.max_n, 12 * world))
    b = draw(batches(small, kinds, pairs, k_max, weight_modes))
    g = len(b.blocks)
    s = draw(ints(1, 3)) if ctx.units else 1
    no_units = not ctx.units or (s == 1 and draw(BOOLS))
    unit_of = list(draw(_values(g, ints(0, s - 1))))
    rank_of = list(draw(_values(g, ints(0, world - 1))))
    if world > 1 and draw(ints(0, 3)) == 0:  # an empty shard (more arise when groups are few)
        empty = draw(ints(0, world - 1))
        rank_of = [r if r != empty else (r + 1) % world for r in rank_of]
    blocks = list(b.blocks)
    twin = None
    if world > 1 and g and draw(BOOLS):
        j = draw(ints(0, g - 1))
        other = (rank_of[j] + draw(ints(1, world - 1))) % world
        blocks.append(blocks[j].copy())
        unit_of.append(unit_of[j])
        rank_of.append(other)
        twin = (j, g)
    # a unit of exactly one sample is an error case; every group has >= 2, so none arises
    shards = []
    placed = {}
    out_dtype = draw(pick(out_dtype_pool(ctx)))
    for r in range(world):
        rows, lab, seg = [], [], []
        for u in range(s):
            mine = [i for i in range(len(blocks)) if rank_of[i] == r and unit_of[i] == u]
            for i in mine:
                placed[i] = (r, sum(x.shape[0] for x in rows))
                rows.append(blocks[i])
                lab += [i] * blocks[i].shape[0]
            seg.append(sum(blocks[i].shape[0] for i in mine))
        arr = np.concatenate(rows) if rows else np.zeros((0, blocks[0].shape[1]))
        shards.append(Case(rewards=tuple(tuple(float(v) for v in row) for row in arr), dtype=b.dtype,
                           group_ids=tuple(lab), weights=b.weights, segment_sizes=None if no_units else tuple(seg),
                           out_dtype=out_dtype, note=b.note, width=arr.shape[1]))
    note = b.note
    if twin is not None:
        (ra, oa), (rb, ob) = placed[twin[0]], placed[twin[1]]
        note += f";twin:{ra}:{oa}:{rb}:{ob}:{blocks[twin[0]].shape[0]}"
    return DistCase(tuple(shards), note=note)


def twins(case: DistCase) -> list[tuple[int, int, int, int, int]]:
    """(rank_a, row_a, rank_b, row_b, n) of groups placed twice (from the case note)."""
    return [tuple(int(x) for x in part.split(":")[1:]) for part in case.note.split(";") if part.startswith("twin:")]
