"""Exact zeros of the combined value, decided for many rows at once (the certificate's tier 1a,
its vectorized half).

With rewards that take few values (0/1 correctness, small integer scores), columns of one group
often have exactly equal variances, and a row's deviations cancel across them exactly: c* = 0.
The float64 c is then a rounding residue (about 1e-17), the advantage a* of a unit of whole
groups is exactly +0 (its exact mean is 0), and no float bound can say so. A batch of 0/1
rewards in groups of 8 with 4 columns has about 3% such rows.

Every reward is an integer multiple of a power of two q common to the groups looked at (the
largest power of two dividing every one of their values), so X = x / q are integers, and per
group column

    S1 = sum X,   Q = n sum X**2 - S1**2,   P_i = n X_i - S1,

are exact in int64 when n**2 max|X|**2 < 2**62 (checked; otherwise this tier declines), and
in float64, whatever the order of the sums, where X are small (|X| <= 2**20, groups up to 32
rows, integer weights up to 2**10: every sum below 2**52), which 0/1 and small integer
scores are: there the sums are a matrix product. The
column's std is sqrt(Q / (n**2 (n - 1))) q, the same for columns of equal Q (one group, one n),
so

    c*_i = sum over classes of equal Q of  (q / (n (std + eps))) sum_{k in class} w_k P_ik.

A class whose integer sum sum_k W_k P_ik is 0 (the weights as integers W = w 2**s) contributes
exactly 0; where every class does, c*_i = 0 exactly (where those sums would leave int64, the
classes are split by |w| and the sign of w taken into P: still exact, less often decided).
Where the integers would leave int64 altogether, only the rows of groups whose every column is
constant (z = 0, c* = +0) are decided. This is a sufficient condition (a
coincidence across classes of different variance is left to the row-by-row tier,
:mod:`impl._exact_rows`), decided in integer arithmetic, no rounding anywhere.

Where the groups are a power of two in size and the integers small (:func:`eq4_route`), Eq. 4's
own two-pass is exact at every step, and its statistics give each row's deviations and each
column's sum of squares (the class key) without gathering the groups again
(:func:`zero_rows_eq4`; 0/1 rewards in groups of 8 or 16, the common case).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch


#: int64 headroom: n**2 max|X|**2 must stay below this
_LIMIT = 2.0 ** 62


def _scaled(v: np.ndarray) -> np.ndarray | None:
    """``v`` (float64, finite) as integers X = v / q (int64), q the largest power of two
    dividing every value; None where some |X| reaches 2**53 (not exact in float64 on the way)
    or 1/q overflows. Read on the bits: v = M 2**e with M the significand as an integer, and
    q = 2**min(e + trailing zeros of M) over the nonzero values."""
    bits = v.view(np.int64)
    field = (bits >> 52) & 0x7FF
    sub = (field == 0).astype(np.int64)  # subnormal (or zero): no hidden bit, exponent as for field 1
    M = (bits & ((1 << 52) - 1)) | ((1 - sub) << 52)
    nz = M != 0
    if not nz.any():
        return np.zeros(v.shape, np.int64)
    low = M & -M  # the lowest set bit of M, a power of two below 2**53
    tz = (low.astype(np.float64).view(np.int64) >> 52) - 1023  # its exponent, exact
    qexp = int((field + sub - 1075 + tz + (~nz) * (1 << 20)).min())  # zeros lifted out of the minimum
    if -qexp > 1023:
        return None
    with np.errstate(over="ignore"):  # a value that overflows is refused just below, not warned about
        X = v * 2.0 ** -qexp  # exact: a power of two, and every X an integer
    if not np.abs(X).max() < 2.0 ** 53:
        return None
    return X.astype(np.int64)


def _reduced(v: np.ndarray, qexp: int | None) -> tuple[np.ndarray, float] | None:
    """(X, top): ``v`` as float64 integers X = v / 2**t, 2**t the largest power of two dividing
    every value, and max |X|; where every value is a multiple of 2**qexp (checked) below
    2**53 of them; else None. (A format's quantum is often far below the values' own: 0/1
    rewards in float32 are multiples of 2**-23, and of 1.)"""
    if qexp is None or -qexp > 1023:
        return None
    with np.errstate(over="ignore"):  # a value that overflows is refused just below
        X = v * 2.0 ** -qexp if qexp else v
    top = float(np.abs(X).max(initial=0))
    if not top < 2.0 ** 53:
        return None
    Xi = X.astype(np.int64)
    if not np.array_equal(Xi, X):  # not multiples of 2**qexp
        return None
    low = int(np.bitwise_or.reduce(Xi, axis=None))
    if low == 0:
        return X, 0.0  # every value 0
    t = (low & -low).bit_length() - 1  # the trailing zeros common to every X
    return (X * 2.0 ** -t, top * 2.0 ** -t) if t else (X, top)


def _integers(v: np.ndarray, qexp: int | None) -> np.ndarray | None:
    """``v`` as integers X = v / 2**t (int64; :func:`_reduced`) where every value is known to
    be a multiple of 2**qexp, else by :func:`_scaled`."""
    got = _reduced(v, qexp)
    return got[0].astype(np.int64) if got is not None else _scaled(v)


def _integer_weights(weights: list[float]) -> list[int]:
    """The weights times 2**s as integers (exact: s the largest power of two in their
    denominators)."""
    ratios = [float(w).as_integer_ratio() for w in weights]
    s = max(d.bit_length() - 1 for _, d in ratios)
    return [num << (s - (d.bit_length() - 1)) for num, d in ratios]


def _cancel(P: np.ndarray, Q: np.ndarray, weights: list[float]) -> np.ndarray:
    """(R,) bool: in each row, within every class of columns of equal Q, sum_k w_k P_k = 0
    exactly (a collapsed column, Q = 0, has P = 0; zero weights add nothing). With the weights
    as integers W = w 2**s, the class sums sum_k W_k P_k are exact in int64 where
    K max|W| max|P| < 2**62; otherwise classes are split further by |w|, the sign of w taken
    into P, and each such sum must be 0 (a weaker, still exact, test). Column by column: K**2
    passes over the rows."""
    K = P.shape[1]
    P, Q = np.ascontiguousarray(P.T), np.ascontiguousarray(Q.T)  # (K, R)
    W = _integer_weights(weights)
    wmax = max(abs(x) for x in W)
    if wmax < 1 << 62 and int(np.abs(P).max(initial=0)) * wmax * K < 1 << 62:  # Python ints: no overflow
        terms = [P[k] * W[k] for k in range(K)]  # exact in int64
        key = [0] * K  # one class per equal Q
    else:
        terms = [P[k] * (1 if w > 0 else -1) for k, w in enumerate(weights)]
        key = [abs(w) for w in weights]
    ok = np.ones(P.shape[1], dtype=bool)
    for k in range(K):
        if weights[k] == 0:
            continue
        total = terms[k].copy()
        for j in range(K):
            if j != k and weights[j] != 0 and key[j] == key[k]:
                total += terms[j] * (Q[j] == Q[k])
        ok &= total == 0
    return ok


def _fits(X: np.ndarray, n_max: int) -> bool:
    top = float(np.abs(X).max(initial=0)) * float(n_max)
    return top * top < _LIMIT


def _values(sub: torch.Tensor, quantum) -> tuple[np.ndarray, np.ndarray | None]:
    """The gathered rewards ``sub`` as float64 and as integers (:func:`_integers`, or None),
    their quantum from ``quantum(sub)`` (2**e dividing every value, or None) where given."""
    qexp = quantum(sub) if quantum is not None else None
    v = sub.to("cpu", torch.float64).numpy()
    return v, _integers(v, qexp)


#: integers up to this in magnitude keep every sum of :func:`_cancel_small` below 2**52 (exact
#: in float64 in any order) for groups up to 2**5 rows, integer weights up to 2**10 and up to
#: 2**15 columns (the caller checks those)
_SMALL = 2.0 ** 20
_SUMS: dict = {}


def _small_integers(v: np.ndarray, qexp: int | None) -> np.ndarray | None:
    """``v`` as float64 integers (:func:`_reduced`) small enough for :func:`_cancel_small`
    (|X| <= :data:`_SMALL`); else None."""
    got = _reduced(v, qexp)
    return got[0] if got is not None and got[1] <= _SMALL else None


def _cancel_small(X: np.ndarray, g: int, rg: np.ndarray, at: np.ndarray, W: list[int]) -> np.ndarray:
    """:func:`_cancel` for rows of groups of ``g`` contiguous rows whose rewards are small
    integers X (U, g, K) float64: S1, sum X**2 (a matrix product with a 0/1 matrix), Q, P and
    the class sums are integers below 2**52 (the caller checked), exact in float64 whatever
    the order of the sums. ``rg``: each row's group among the U, ``at``: its place in it."""
    U, _, K = X.shape
    M = _SUMS.get((g, K))
    if M is None:
        M = _SUMS[(g, K)] = np.tile(np.eye(K), (g, 1))
    flat = X.reshape(U, g * K)
    S1 = flat @ M
    Q = g * ((flat * flat) @ M) - S1 * S1
    P = g * X.reshape(U * g, K)[rg * g + at] - S1[rg]
    T = (P * np.array(W, dtype=np.float64)).T.copy()  # (K, R): column k of every row
    Qr = Q[rg].T.copy()
    tot = T.copy()
    for k in range(K):
        for j in range(k + 1, K):
            same = Qr[j] == Qr[k]
            tot[k] += np.where(same, T[j], 0.0)
            tot[j] += np.where(same, T[k], 0.0)
    return ~(tot != 0).any(0)


def _groups_of(rows: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray]:
    """(ug, rg): the groups of ``rows`` (groups of g contiguous rows), each once, ascending,
    and each row's place among them."""
    grp = rows // g
    if grp.size > 1 and not np.all(grp[1:] >= grp[:-1]):
        return np.unique(grp, return_inverse=True)
    first = np.ones(grp.size, dtype=bool)  # the rows come ascending (indices of a mask)
    np.not_equal(grp[1:], grp[:-1], out=first[1:])
    return grp[first], np.cumsum(first) - 1


def zero_rows_contiguous(rows: torch.Tensor, rewards: torch.Tensor, g: int, weights: list[float],
                         quantum=None, known: tuple[int, float] | None = None) -> torch.Tensor:
    """(R,) bool: c* = 0 exactly for each of ``rows`` (decided by the sufficient condition of
    the module's docstring; False: not decided here), groups of ``g`` contiguous rows; on the
    host, in NumPy's int64 (small integers: in float64, exact). ``quantum``: (rewards) -> e
    with 2**e dividing every one, or None (then read on the values' bits). ``known``: (e, top)
    of the whole batch, 2**e dividing every reward and none above top in magnitude
    (``impl._certify.batch_quantum``): where top / 2**e is small, the values divided by 2**e
    are the integers of the float64 path as they are, with no pass to find them."""
    R = rows.shape[0]
    device = rewards.device
    if R == 0:
        return torch.zeros(0, dtype=torch.bool, device=device)
    rl = rows.cpu().numpy()
    ug, rg = _groups_of(rl, g)
    N, K = rewards.shape
    sub = rewards.detach().view(N // g, g, K).index_select(0, torch.from_numpy(ug).to(device))
    qexp = quantum(sub) if quantum is not None else None
    v = sub.to("cpu", torch.float64).numpy()
    W = _integer_weights(weights)
    if known is not None and known[1] <= math.ldexp(_SMALL, known[0]):
        got = (v * 2.0 ** -known[0] if known[0] else v), math.ldexp(known[1], -known[0])  # exact: integers
    else:
        got = _reduced(v, qexp)  # (read once: the float64 path, else the int64 one)
    if got is not None and got[1] <= _SMALL and g <= 32 and K <= 1 << 15 and max(abs(x) for x in W) <= 1 << 10:
        return torch.from_numpy(_cancel_small(got[0], g, rg, rl % g, W)).to(device)
    X = got[0].astype(np.int64) if got is not None else _scaled(v)
    if X is None or not _fits(X, g):  # beyond int64: the groups whose every column is constant
        return torch.from_numpy((v.max(1) == v.min(1)).all(-1)[rg]).to(device)
    Xt = torch.from_numpy(X)  # torch's reduction over the middle axis is the faster here
    S1 = Xt.sum(1).numpy()  # (U, K)
    Q = g * (Xt * Xt).sum(1).numpy() - S1 * S1
    P = g * X[rg, rl % g] - S1[rg]  # (R, K)
    return torch.from_numpy(_cancel(P, Q[rg], weights)).to(device)


def eq4_route(g: int, weights: list[float], known: tuple[int, float] | None) -> bool:
    """Can :func:`zero_rows_eq4` decide rows of groups of ``g`` contiguous rows from Eq. 4's own
    statistics, every reward a multiple of 2**e and none above top in magnitude (``known``)?
    Where g is a power of two and the rewards are small integers after 2**e, every step of
    Eq. 4's two-pass is exact (below), and so are the class sums."""
    if known is None or g < 2 or g & (g - 1) or not math.isfinite(known[1]):
        return False
    return _eq4_route(int(g), tuple(float(w) for w in weights), int(known[0]), float(known[1]))


@functools.lru_cache(maxsize=256)
def _eq4_route(g: int, weights: tuple, e: int, top: float) -> bool:
    # a column's f is at least 1 / (2 top) (|x f| < 4, 2**e <= every nonzero |x| <= top) and at
    # most 2**-e where it holds a nonzero value: Eq. 4's squares (multiples of (2**e f / g)**2)
    # stay normal, and so do m2 / f and the keys m2 / f / f
    if not (-200 <= e and top <= 2.0 ** 200):
        return False
    X = math.ldexp(top, -e)  # the largest |reward| / 2**e, an integer
    W = max(abs(x) for x in _integer_weights(list(weights)))
    if W.bit_length() > 53:  # weights far apart (1e-300 and 2): their integers are huge
        return False
    # Eq. 4's scaled values (the group column's power of two f) are integers times 2**e f / g:
    # the differences and the mean's partial sums at most 2 g X of them, the deviations 2 g X,
    # the sum of squares 4 g**3 X**2; the class sums here K W 2 g X (of 2**e / g)
    return 4.0 * g ** 3 * X * X <= 2.0 ** 53 and len(weights) * W * 2.0 * g * X <= 2.0 ** 53


def zero_rows_eq4(rows: torch.Tensor, rewards: torch.Tensor, g: int, weights: list[float],
                  stats: tuple) -> torch.Tensor:
    """(R,) bool: c* = 0 exactly for each of ``rows`` (the module's sufficient condition), groups
    of ``g`` contiguous rows, from Eq. 4's own two-pass statistics ``stats`` = (f, shift, mean,
    m2), (K, 1, G) each (``impl._eq4.Z.stats``), where :func:`eq4_route` holds: no group is
    gathered again.

    There every reward is an integer multiple of 2**e below 2**53 of it, g a power of two, so
    Eq. 4's scaled differences d = x f - shift, their sum, the mean (a division by g), the
    deviations d - mean and their squares and sum m2 are all exact in float64 (each a multiple
    of 2**e f / g or its square, within 2**53 of it: the caller checked). So the row's deviation
    recomputed here, x f - shift - mean, is the exact one, m2 / f**2 is the column's exact sum of
    squared deviations (equal exactly where the variances are: the class key), and w_k times the
    unscaled deviation, with the weights as integers, is an exact integer multiple of 2**e / g.
    Each row's class sums sum_j [key_j == key_k] W_j dev_j / f_j come from one (K, K, R) product,
    exact (the caller bounded them below 2**53)."""
    K = rewards.shape[1]
    device = rewards.device
    if rows.shape[0] == 0:
        return torch.zeros(0, dtype=torch.bool, device=device)
    if device.type == "cpu":  # NumPy: 3-4x torch's time on arrays this small
        rn = rows.numpy()
        grp = rn // g
        f, shift, mean, m2 = (t.view(K, -1).numpy().take(grp, axis=1) for t in stats)  # (K, R) each
        r = rewards.detach()
        x = (r.numpy()[rn].astype(np.float64) if r.dtype in (torch.float32, torch.float16)
             else r.index_select(0, rows).to(torch.float64).numpy()).T  # (K, R) (NumPy has no bfloat16)
        W = weight_column(tuple(weights))
    else:
        x = rewards.detach().index_select(0, rows).to(torch.float64)  # (R, K)
        grp = torch.div(rows, g, rounding_mode="floor")
        f, shift, mean, m2 = (t.view(K, -1).index_select(1, grp) for t in stats)
        x = x.t()
        W = torch.tensor(_integer_weights(weights), dtype=torch.float64, device=device).view(K, 1)
    key = m2 / f / f  # exact: f a power of two (a column of zeros: f may be near 2**1021, key 0)
    T = (x * f - shift - mean) / f * W  # W_k times the exact deviation
    tot = ((key[:, None, :] == key[None, :, :]) * T[None, :, :]).sum(1)  # (K, R): its class's sum
    ok = (tot == 0).all(0)
    return torch.from_numpy(ok) if device.type == "cpu" else ok


@functools.lru_cache(maxsize=64)
def weight_column(weights: tuple) -> np.ndarray:
    """:func:`_integer_weights` as a (K, 1) float64 column (read only; memoized)."""
    W = np.array(_integer_weights(list(weights)), dtype=np.float64).reshape(len(weights), 1)
    W.flags.writeable = False
    return W


def zero_rows_labelled(rows: torch.Tensor, gid: torch.Tensor, G: int, rewards: torch.Tensor, weights: list[float],
                       quantum=None, sort=None) -> torch.Tensor:
    """:func:`zero_rows_contiguous` for labelled groups: ``gid`` (N,) each row's group (0..G-1).
    ``sort``: (perm, sorted gid, ...) of phase one's sort of the labels (sorted row -> input
    row, its group, ascending), where at hand (CPU): the rows of the groups asked about are read
    off it (:func:`_members_sorted`) instead of found by a pass over every row's group."""
    R = rows.shape[0]
    device = rewards.device
    if R == 0:
        return torch.zeros(0, dtype=torch.bool, device=device)
    if sort is not None and device.type == "cpu" and gid.device.type == "cpu":
        members, n, rg, at = _members_sorted(rows.numpy(), gid.numpy(), sort[0].numpy(), sort[1].numpy())
        order = None  # grouped already
        members = torch.from_numpy(members)
    else:
        ug, row_group = torch.unique(gid.index_select(0, rows), return_inverse=True)
        sel = torch.zeros(G, dtype=torch.bool, device=gid.device)
        sel[ug] = True
        members = sel.index_select(0, gid).nonzero().view(-1)  # every row of those groups, sorted
        mg = torch.searchsorted(ug, gid.index_select(0, members)).cpu().numpy()
        n = np.bincount(mg, minlength=ug.numel()).astype(np.int64)  # every group holds its row
        order = np.argsort(mg, kind="stable")
        rg = row_group.cpu().numpy()
        at = np.searchsorted(members.cpu().numpy(), rows.cpu().numpy())  # the rows among the members
    v, X = _values(rewards.detach().index_select(0, members.to(rewards.device)), quantum)
    starts = np.concatenate([[0], np.cumsum(n)[:-1]])
    if X is None or not _fits(X, int(n.max())):  # beyond int64: the groups whose every column is constant
        vs = v if order is None else v[order]
        flat = (np.maximum.reduceat(vs, starts, axis=0) == np.minimum.reduceat(vs, starts, axis=0)).all(-1)
        return torch.from_numpy(flat[rg]).to(device)
    Xs = X if order is None else X[order]
    S1 = np.add.reduceat(Xs, starts, axis=0)
    Q = n[:, None] * np.add.reduceat(Xs * Xs, starts, axis=0) - S1 * S1
    P = n[rg][:, None] * X[at] - S1[rg]
    return torch.from_numpy(_cancel(P, Q[rg], weights)).to(device)


def _members_sorted(rows: np.ndarray, gid: np.ndarray, perm: np.ndarray, sgid: np.ndarray):
    """(members, n, rg, at) of the groups of ``rows`` (input rows, each row's group ``gid``), from
    the labels' sort (``perm``: sorted row -> input row, ``sgid``: its group, ascending): every
    row of those groups, group by group (members), each group's size (n), each row's group among
    them (rg) and place among the members (at). Each group's rows are one run of the sort, found
    by binary search: no pass over every row."""
    ug, rg = np.unique(gid[rows], return_inverse=True)
    lo = np.searchsorted(sgid, ug, "left")
    n = np.searchsorted(sgid, ug, "right") - lo
    mg = np.repeat(np.arange(ug.size), n)
    offs = np.cumsum(n) - n
    members = perm[np.arange(int(n.sum())) - offs[mg] + lo[mg]]
    where = np.empty(gid.size, dtype=np.int64)  # a map of the rows
    where[members] = np.arange(members.size)  # (rows lie among the members: only those entries are read)
    return members, n.astype(np.int64), rg, where[rows]
