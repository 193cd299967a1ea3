"""Triton kernels of the fused fast path (see ``_fused``): the same operations,
in the same order, as the plain torch path, so that the results are the same bits.

Imported only by ``_fused`` and only when Triton is importable. With
``TRITON_INTERPRET=1`` in the environment at import time the kernels run in
Triton's interpreter (NumPy on the CPU): that is how the test suite checks the
kernels bit for bit against the plain path on machines without a GPU.

What makes the bits equal (the plain path's rules are in ``_segments``):

* every sum is the canonical pairwise tree of ``_segments.tree_sum`` (adjacent
  pairs, an odd one out carried up). A block of 2**b values aligned to the
  start of its segment is a subtree of it, so a segment is summed as the tree
  of its blocks' trees; positions past the end of the segment are filled with
  -0.0, the exact additive identity of IEEE round-to-nearest (x + -0 == x for
  every x, +0 included), which makes the padded tree the carried one;
* every operation is one correctly rounded float64 operation: the kernels are
  launched with ``enable_fp_fusion=False`` (no multiply-add contraction), and
  the square root and division are the correctly rounded ones (libdevice's
  ``sqrt_rn``/``div_rn`` on the GPU, NumPy's in the interpreter);
* scale factors are built from exponent bits, exactly as ``_segments.scale``.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

#: Exponent field of a float64, and the bit constants of ``_segments.scale``.
EXP_MASK = 0x7FF0000000000000
P_MAX_BITS = (1021 + 1023) << 52
F_FROM_P = 2045 << 52
#: "No non-finite value in this program": larger than any flat index.
NONE_FOUND = (1 << 62)


@triton.jit
def _neg_zero():
    """-0.0 from its bits: a -0.0 literal loses its sign in Triton (measured)."""
    return (tl.full((), 1, tl.int64) << 63).to(tl.float64, bitcast=True)


@triton.jit
def _sqrt(x, INTERP: tl.constexpr):
    if INTERP:
        return tl.sqrt(x)
    else:
        return libdevice.sqrt_rn(x)


@triton.jit
def _div(a, b, INTERP: tl.constexpr):
    if INTERP:
        return a / b
    else:
        return libdevice.div_rn(a, b)


@triton.jit
def _tree_rows(x, ROWS: tl.constexpr, WIDTH: tl.constexpr, LOG: tl.constexpr):
    """Canonical pairwise sum of each row of x (ROWS, WIDTH = 2**LOG): level by
    level, adjacent pairs (the even and odd entries) are added."""
    s = x
    for lvl in tl.static_range(LOG):
        s = tl.reshape(s, (ROWS, WIDTH >> (lvl + 1), 2))
        a, b = tl.split(s)
        s = a + b
    return tl.reshape(s, (ROWS,))


@triton.jit
def _tree_vec(x, WIDTH: tl.constexpr, LOG: tl.constexpr):
    """Canonical pairwise sum of a vector of WIDTH = 2**LOG values, as a (1,)
    tensor (no reduction primitive: it might add an identity of the wrong sign)."""
    return _tree_rows(tl.reshape(x, (1, WIDTH)), 1, WIDTH, LOG)


@triton.jit
def _scale(absmax, min_bits):
    """f = 2**-(E+1) from the leading power of two 2**E of absmax (clamped), exact."""
    bits = absmax.to(tl.int64, bitcast=True) & 0x7FF0000000000000
    bits = tl.minimum(tl.maximum(bits, min_bits), (1021 + 1023) << 52)
    return ((2045 << 52) - bits).to(tl.float64, bitcast=True)


@triton.jit(do_not_specialize=["n_groups", "G", "K", "min_bits", "eps_tiny"])
def eq47_kernel(r_ptr, src_ptr, prm_ptr, c_ptr, nf_ptr, n_groups, G, K, min_bits, eps_tiny,
                GP: tl.constexpr, LOG_GP: tl.constexpr, BG: tl.constexpr, GATHER: tl.constexpr,
                INTERP: tl.constexpr):
    """Eq. 4 and Eq. 7 for BG groups of at most G <= GP = 2**LOG_GP rows of the (N, K) rewards.

    Contiguous groups (GATHER false): group j is rows j*G .. j*G + G - 1.
    Labelled groups (GATHER true): member p of group j is row src[p * n_groups + j],
    a negative entry marking a slot past the group's end (the padded layout of
    ``_groups.GroupLayout``, whose padding is left out here: it adds
    exact zeros there). prm = [eps, w_0, ..., w_{K-1}] (float64). Writes c (N,)
    float64 at each member's row and, per program, the flat index of the first
    non-finite reward it holds (NONE_FOUND if none). K, G and the eps flag are
    run-time values: one compiled kernel serves every K and group size up to GP.
    """
    pid = tl.program_id(0)
    G = G.to(tl.int64)
    K = K.to(tl.int64)
    grp = pid.to(tl.int64) * BG + tl.arange(0, BG).to(tl.int64)
    pos = tl.arange(0, GP).to(tl.int64)
    has = grp < n_groups
    slot_ok = has[:, None] & (pos < G)[None, :]
    if GATHER:
        src = tl.load(src_ptr + pos[None, :] * n_groups + grp[:, None], mask=slot_ok, other=-1)
        valid = slot_ok & (src >= 0)
        row = tl.where(valid, src, 0)
        row0 = tl.load(src_ptr + grp, mask=has, other=0)
    else:
        valid = slot_ok
        row = grp[:, None] * G + pos[None, :]
        row0 = grp * G
    count = tl.sum(valid.to(tl.float64), axis=1)  # sums of ones: exact in any order
    eps = tl.load(prm_ptr)
    first = tl.full((), 1 << 62, tl.int64)
    c = tl.zeros((BG, GP), tl.float64)
    for k in range(K):
        off = row * K + k
        x = tl.load(r_ptr + off, mask=valid, other=0.0).to(tl.float64)
        bad = valid & ((x - x) != 0.0)  # nan and +-inf
        first = tl.minimum(first, tl.min(tl.where(bad, off, 1 << 62)))
        absmax = tl.max(tl.where(valid, tl.abs(x), 0.0), axis=1)
        f = _scale(absmax, min_bits)
        eps_f = f * eps
        x0 = tl.load(r_ptr + row0 * K + k, mask=has, other=0.0).to(tl.float64)
        shift = x0 * f
        d = x * f[:, None]
        d = d - shift[:, None]
        d = tl.where(valid, d, _neg_zero())
        mean = _div(_tree_rows(d, BG, GP, LOG_GP), count, INTERP)
        dev = d - mean[:, None]
        sq = dev * dev
        sq = tl.where(valid, sq, 0.0)
        var = _div(_tree_rows(sq, BG, GP, LOG_GP), count - 1.0, INTERP)
        den = _sqrt(var, INTERP) + eps_f
        den = tl.where((eps_tiny != 0) & (den == 0.0), 1.0, den)
        z = _div(dev, den[:, None], INTERP)
        p = z * tl.load(prm_ptr + 1 + k)
        c = tl.where(k == 0, p, c + p)  # Eq. 7 left to right: ((p0 + p1) + p2) + ...
    tl.store(c_ptr + row, c, mask=valid)
    tl.store(nf_ptr + pid, first)


@triton.jit
def unit_minmax_kernel(c_ptr, starts_ptr, sizes_ptr, lo_ptr, hi_ptr, NBP: tl.constexpr, BLOCK: tl.constexpr):
    """Per (unit, block): the block's minimum and maximum of c."""
    u = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    start = tl.load(starts_ptr + u)
    size = tl.load(sizes_ptr + u)
    offs = b.to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    m = offs < size
    x = tl.load(c_ptr + start + offs, mask=m, other=0.0).to(tl.float64)
    tl.store(lo_ptr + u * NBP + b, tl.min(tl.where(m, x, float("inf"))))
    tl.store(hi_ptr + u * NBP + b, tl.max(tl.where(m, x, float("-inf"))))


#: Columns of the per-unit statistics (float64, one row of ST_COLS per unit). The
#: apply kernel reads F, SHIFT, MEAN and DEN only, so a row built from the merged
#: statistics of every rank drives it too.
ST_LO, ST_HI, ST_F, ST_EPSF, ST_SHIFT, ST_MEAN, ST_DEN, ST_M2 = range(8)
ST_COLS = 8


@triton.jit(do_not_specialize=["min_bits"])
def unit_scale_kernel(lo_ptr, hi_ptr, c_ptr, starts_ptr, sizes_ptr, whole_ptr, prm_ptr, st_ptr, min_bits,
                      NBP: tl.constexpr, BLOCK: tl.constexpr):
    """Per unit: min, max, the scale f, eps * f and the shift (first value times f; +0 for a
    unit of whole groups that is not collapsed, whose mean, the structural +0, is stored too)."""
    u = tl.program_id(0).to(tl.int64)
    start = tl.load(starts_ptr + u)
    size = tl.load(sizes_ptr + u)
    nb = (size + BLOCK - 1) // BLOCK
    j = tl.arange(0, NBP)
    m = j < nb
    lo = tl.min(tl.load(lo_ptr + u * NBP + j, mask=m, other=float("inf")))
    hi = tl.max(tl.load(hi_ptr + u * NBP + j, mask=m, other=float("-inf")))
    absmax = tl.maximum(hi, -lo)
    f = _scale(absmax, min_bits)
    eps = tl.load(prm_ptr)
    c0 = tl.load(c_ptr + start, mask=size > 0, other=0.0).to(tl.float64)
    whole = tl.load(whole_ptr + u) != 0
    st = st_ptr + u * 8
    tl.store(st + 0, lo)
    tl.store(st + 1, hi)
    tl.store(st + 2, f)
    tl.store(st + 3, f * eps)
    tl.store(st + 4, tl.where(whole & (lo != hi), 0.0, c0 * f))
    tl.store(st + 5, tl.where(lo == hi, _neg_zero(), 0.0))  # a whole unit's mean (others: unit_finish_kernel)


@triton.jit
def _block_diffs(c_ptr, starts_ptr, sizes_ptr, st_ptr, BLOCK: tl.constexpr):
    """This program's block of its unit: (rows, member mask, d = c*f - shift, the
    unit's statistics row), program ids (unit, block)."""
    u = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    m = offs < tl.load(sizes_ptr + u)
    rows = tl.load(starts_ptr + u) + offs
    st = st_ptr + u * 8
    x = tl.load(c_ptr + rows, mask=m, other=0.0).to(tl.float64)
    d = x * tl.load(st + 2)
    d = d - tl.load(st + 4)
    return rows, m, d, st


@triton.jit
def unit_sum_kernel(c_ptr, starts_ptr, sizes_ptr, st_ptr, part_ptr, NBP: tl.constexpr, BLOCK: tl.constexpr,
                    LOG_BLOCK: tl.constexpr, SQUARES: tl.constexpr):
    """Per (unit, block): the tree sum of the block's differences d = c*f - shift,
    or (SQUARES) of the squares of the deviations d - mean."""
    rows, m, d, st = _block_diffs(c_ptr, starts_ptr, sizes_ptr, st_ptr, BLOCK)
    if SQUARES:
        dev = d - tl.load(st + 5)
        v = dev * dev
        v = tl.where(m, v, 0.0)
    else:
        v = tl.where(m, d, _neg_zero())
    slot = tl.program_id(0).to(tl.int64) * NBP + tl.program_id(1)
    tl.store(part_ptr + slot + tl.arange(0, 1), _tree_vec(v, BLOCK, LOG_BLOCK))


@triton.jit
def unit_finish_kernel(part_ptr, sizes_ptr, whole_ptr, st_ptr, NBP: tl.constexpr, LOG_NBP: tl.constexpr,
                       BLOCK: tl.constexpr, SQUARES: tl.constexpr, EPS_TINY: tl.constexpr,
                       INTERP: tl.constexpr):
    """Per unit: the tree of the blocks' sums; then the mean (-0 for a unit whose
    values are all equal, +0 for a unit of whole groups) or, from the squares, std + eps
    in the unit's scale."""
    u = tl.program_id(0).to(tl.int64)
    size = tl.load(sizes_ptr + u)
    nb = (size + BLOCK - 1) // BLOCK
    j = tl.arange(0, NBP)
    st = st_ptr + u * 8
    if SQUARES:
        total = _tree_vec(tl.load(part_ptr + u * NBP + j, mask=j < nb, other=0.0), NBP, LOG_NBP)
        var = _div(total, tl.maximum(size - 1, 1).to(tl.float64), INTERP)
        den = _sqrt(var, INTERP) + tl.load(st + 3)
        if EPS_TINY:
            den = tl.where(den == 0.0, 1.0, den)
        tl.store(st + 6 + tl.arange(0, 1), den)
        tl.store(st + 7 + tl.arange(0, 1), total)  # M2, for the merge across ranks
    else:
        total = _tree_vec(tl.load(part_ptr + u * NBP + j, mask=j < nb, other=_neg_zero()), NBP, LOG_NBP)
        mean = _div(total, tl.maximum(size, 1).to(tl.float64), INTERP)  # an empty unit: no row reads it
        mean = tl.where(tl.load(whole_ptr + u) != 0, 0.0, mean)
        mean = tl.where(tl.load(st + 0) == tl.load(st + 1), _neg_zero(), mean)
        tl.store(st + 5 + tl.arange(0, 1), mean)


@triton.jit
def unit_apply_kernel(c_ptr, starts_ptr, sizes_ptr, st_ptr, out_ptr, BLOCK: tl.constexpr, INTERP: tl.constexpr):
    """Per (unit, block): a = ((c*f - shift) - mean) / den, written in the output dtype."""
    rows, m, d, st = _block_diffs(c_ptr, starts_ptr, sizes_ptr, st_ptr, BLOCK)
    dev = d - tl.load(st + 5)
    a = _div(dev, tl.load(st + 6), INTERP)
    tl.store(out_ptr + rows, a.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def unit_whole_kernel(c_ptr, starts_ptr, sizes_ptr, whole_ptr, prm_ptr, out_ptr, min_bits, eps_tiny,
                      BLOCK: tl.constexpr, LOG_BLOCK: tl.constexpr, INTERP: tl.constexpr):
    """Eq. 6 of a whole unit (at most BLOCK rows) in one program: the block kernels'
    operations in the same order, with the unit held in registers (one launch
    instead of seven, for small batches). A unit of whole groups (``whole_ptr``) is
    centred on its structural mean +0, as in the block kernels."""
    u = tl.program_id(0).to(tl.int64)
    start = tl.load(starts_ptr + u)
    size = tl.load(sizes_ptr + u)
    offs = tl.arange(0, BLOCK).to(tl.int64)
    m = offs < size
    x = tl.load(c_ptr + start + offs, mask=m, other=0.0).to(tl.float64)
    lo = tl.min(tl.where(m, x, float("inf")))
    hi = tl.max(tl.where(m, x, float("-inf")))
    f = _scale(tl.maximum(hi, -lo), min_bits)
    eps_f = f * tl.load(prm_ptr)
    whole = tl.load(whole_ptr + u) != 0
    shift = tl.load(c_ptr + start, mask=size > 0, other=0.0).to(tl.float64) * f
    shift = tl.where(whole & (lo != hi), 0.0, shift)
    d = x * f
    d = d - shift
    d = tl.where(m, d, _neg_zero())
    mean = _div(_tree_vec(d, BLOCK, LOG_BLOCK), tl.maximum(size, 1).to(tl.float64), INTERP)
    mean = tl.where(whole, 0.0, mean)
    mean = tl.where(lo == hi, _neg_zero(), mean)
    dev = d - mean
    sq = dev * dev
    sq = tl.where(m, sq, 0.0)
    var = _div(_tree_vec(sq, BLOCK, LOG_BLOCK), tl.maximum(size - 1, 1).to(tl.float64), INTERP)
    den = _sqrt(var, INTERP) + eps_f
    den = tl.where((eps_tiny != 0) & (den == 0.0), 1.0, den)
    a = _div(dev, den, INTERP)
    tl.store(out_ptr + start + offs, a.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def facts_kernel(nf_ptr, programs, r_ptr, n_flat, out_ptr, CHUNK: tl.constexpr):
    """The facts of the call: [first non-finite flat index (0 if none), the float64
    bits of the reward there], from eq47_kernel's per-program findings."""
    first = tl.full((), 1 << 62, tl.int64)
    for s in range(0, programs, CHUNK):
        j = s + tl.arange(0, CHUNK)
        first = tl.minimum(first, tl.min(tl.load(nf_ptr + j, mask=j < programs, other=1 << 62)))
    at = tl.where(first >= n_flat, 0, first)
    value = tl.load(r_ptr + at).to(tl.float64)
    tl.store(out_ptr, at)
    tl.store(out_ptr + 1, value.to(tl.int64, bitcast=True))
