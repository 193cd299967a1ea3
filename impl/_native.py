"""CPU loops in C (``impl/_native.c``), built on first use: the certificate's full-length passes
and the tree sums of Eq. 4 and Eq. 6.

On CPU the certificate's cost is its passes over data a call touched a millisecond before,
each paying a cold read (``benchmarks/cache_decay.py``): tier 0's test of every output row
(five torch passes), the rewards' magnitudes (NumPy, block by block) and, on 0/1 rewards, the
exact zeros among the rows tier 0 leaves (NumPy on a few thousand rows). Here each is one loop.
The canonical pairwise tree sum (``impl._segments.tree_sum``) is one loop too: torch dispatches
three operations a level, sixteen levels for a unit of 65,536 rows, most of them on a handful
of values (about a third of a plain call at N = 65,536, K = 4 on 2 cores, measured).
The first call that needs them compiles ``_native.c`` with the C compiler (``$CC``, else ``cc``)
into a cache folder (``$GDPO_NATIVE_DIR``, else ``$XDG_CACHE_HOME/gdpo-spec`` or
``~/.cache/gdpo-spec``; where that cannot be written, a folder of this user's in the system's
temporary folder), under a name that hashes the source, the compiler and the flags, with its
sha256 beside it, and loads it with ctypes; later processes load it. The folder is opened
without following a link and used through that descriptor; a folder or a library that is not
this user's (or root's), or that others may write, is never used; a library whose bytes are not
those of its digest (cut short by a crash: the loader would die of SIGBUS) is built again.

Where there is no compiler, or the build or the load fails, or ``GDPO_NATIVE=0`` was in the
environment when impl was imported, the same tests and sums run in torch and NumPy: the same
verdicts and values (tests/test_native.py), hence the same bits, only slower. :func:`status`
says which, and why. Nothing here decides a result the fallback would not: the C loops are
IEEE double operations in the order the fallback's docstrings give (built without fast-math
and without contraction into fused multiply-adds)."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np
import torch

SOURCE = Path(__file__).with_name("_native.c")
FLAGS = ("-O3", "-std=c99", "-fPIC", "-shared", "-fno-fast-math", "-ffp-contract=off")
ABI = 2

_LOCK = [threading.Lock()]
_STATE: dict = {"lib": None, "tried": False, "reason": "not needed yet", "path": None}
_ON = [os.environ.get("GDPO_NATIVE", "1").strip().lower() not in ("0", "off", "false", "no")]
_OFF = [0]  # how many disabled() scopes are open


def _after_fork_in_child() -> None:
    # a fork while another thread held the lock (building) would leave the child waiting on it
    _LOCK[0] = threading.Lock()
    if _STATE["lib"] is None:
        _STATE["tried"] = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _cache_dirs() -> list[Path]:
    env = os.environ.get("GDPO_NATIVE_DIR")
    if env:
        return [Path(env)]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [Path(base) / "gdpo-spec", Path(tempfile.gettempdir()) / f"gdpo-spec-{os.getuid()}"]


def _trusted(st: os.stat_result) -> str | None:
    """None where a folder or file of this stat is this user's (or root's) and no one else may
    write it; else why not."""
    if st.st_uid not in (os.getuid(), 0) or st.st_mode & 0o022:
        return f"not this user's alone (owner {st.st_uid}, mode {oct(st.st_mode & 0o777)})"
    return None


def _compile(cc: list[str], source: bytes, where: str, name: str, dfd: int) -> str | None:
    """Build ``name`` (and its digest beside it, ``name.sha256``) in the folder open as ``dfd``
    (``where``: a path to that very folder); None, or why it failed (OSError raised as is). The
    file is written whole (fsync) before its name is given to it (atomic), its digest after."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=where)
    os.close(fd)
    src = tmp + ".c"
    with open(src, "wb") as f:
        f.write(source)
    try:
        run = dict(capture_output=True, text=True, timeout=120, pass_fds=(dfd,))  # (where: the same fd there)
        done = subprocess.run([*cc, *FLAGS, "-o", tmp, src], **run)
        if done.returncode != 0:  # (no ifuncs for the per-CPU clones, say: the baseline build)
            done = subprocess.run([*cc, *FLAGS, "-DGDPO_NO_CLONES", "-o", tmp, src], **run)
    except FileNotFoundError:
        os.unlink(tmp)
        return f"no C compiler ({' '.join(cc)!r} not found; set CC)"
    except subprocess.TimeoutExpired:
        os.unlink(tmp)
        return f"{' '.join(cc)} took over 120 s"
    finally:
        with contextlib.suppress(OSError):
            os.unlink(src)
    if done.returncode != 0:
        os.unlink(tmp)
        return f"{' '.join(cc)} failed (exit {done.returncode}): {done.stderr.strip()[:500]}"
    with open(tmp, "rb+") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
        os.fsync(f.fileno())
    side = tmp + ".sha256"
    with open(side, "w") as f:
        f.write(digest)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(where, name))  # atomic: a process beside this one reads a whole file
    os.replace(side, os.path.join(where, name + ".sha256"))
    with contextlib.suppress(OSError):
        os.fsync(dfd)
    return None


def _load(where: str, name: str, dfd: int) -> tuple[ctypes.CDLL | None, str | None]:
    """The library ``name`` in the folder open as ``dfd`` (``where``: a path through it): opened
    without following a link, this user's (or root's) and no one else's to write, its bytes those
    its digest names (a file cut short would crash the loader), then loaded (in a folder no one
    else may write, the file checked is the file loaded)."""
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0), dir_fd=dfd)
    except FileNotFoundError:
        return None, "missing"
    except OSError as e:
        return None, f"could not open {name}: {e}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, f"{name}: not a regular file"
        if why := _trusted(st):
            return None, f"{name}: {why}"
        with os.fdopen(os.dup(fd), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        try:
            sfd = os.open(name + ".sha256", os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0), dir_fd=dfd)
            with os.fdopen(sfd) as f:
                want = f.read().strip()
        except OSError:
            want = None
        if digest != want:
            return None, f"{name} does not match its digest (damaged, or cut short)"
        try:
            # through the checked folder's descriptor (a name of its own per source: a loader that
            # knows a name loaded before hands that library back, so never /proc/self/fd/<file>)
            lib = ctypes.CDLL(os.path.join(where, name))
            if lib.gdpo_native_abi() != ABI:
                return None, f"{name} answers another interface version"
            _declare(lib)
        except (OSError, AttributeError) as e:  # not a library, or not this one's symbols
            return None, f"could not load {name}: {e}"
        return lib, None
    finally:
        os.close(fd)


def _build(cc: str, source: bytes) -> tuple[ctypes.CDLL | None, str, str | None]:
    import shlex
    ccv = shlex.split(cc) or ["cc"]  # ("ccache gcc", "gcc -m64")
    key = hashlib.sha256(source + "\0".join((*ccv, *FLAGS, platform.machine())).encode()).hexdigest()[:16]
    name = f"gdpo_native_{key}.so"
    why = "no cache folder could be written"
    for folder in _cache_dirs():
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            # the folder is opened once, without following a link, and checked and used through
            # that descriptor: a name swapped for another folder between the check and the load
            # (another user's, in a shared temporary folder) is never read
            dfd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
        except OSError as e:
            why = f"{folder}: {e}"
            continue
        try:
            if why_not := _trusted(os.fstat(dfd)):
                why = f"{folder} is {why_not}"
                continue
            where = f"/proc/self/fd/{dfd}" if os.path.isdir("/proc/self/fd") else str(folder)
            lib, failed = _load(where, name, dfd)
            if lib is None:  # not built yet, or damaged (not this build's): built now, once
                if failed := _compile(ccv, source, where, name, dfd):
                    return None, failed, None
                lib, failed = _load(where, name, dfd)
            if lib is None:
                return None, failed, None
            return lib, "loaded", str(folder / name)
        except OSError as e:
            why = f"{folder}: {e}"
            continue
        finally:
            os.close(dfd)
    return None, why, None


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
    for name in ("gdpo_scan_u32", "gdpo_scan_u16"):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [p, i64, p], None
    lib.gdpo_tier0_f32.argtypes = [p, p, i64, f64, f64, f64, f64, p]
    lib.gdpo_tier0_f32.restype = i64
    lib.gdpo_zeros_left_f32.argtypes = [p, i64, p, p, p, p, i64, i64, i64, p, p]
    lib.gdpo_zeros_left_f32.restype = i64
    lib.gdpo_gather_f32.argtypes, lib.gdpo_gather_f32.restype = [p, i64, i64, i64, p, p], None
    lib.gdpo_tree_sum_f64.argtypes = [p, i64, i64, i64, i64, i64, i64, ctypes.c_int, p, p]
    lib.gdpo_tree_sum_f64.restype = ctypes.c_int
    lib.gdpo_zero_rows_f32.argtypes = [p, i64, p, i64, i64, i64, p, p]
    lib.gdpo_zero_rows_f32.restype = ctypes.c_int


def lib() -> ctypes.CDLL | None:
    """The loaded library, built on the first call that needs it; None where it cannot be had
    (:func:`status` says why) or is turned off."""
    if not _ON[0] or _OFF[0]:
        return None
    if _STATE["tried"]:
        return _STATE["lib"]
    with _LOCK[0]:
        if not _STATE["tried"]:
            try:
                got, reason, path = _build(os.environ.get("CC") or "cc", SOURCE.read_bytes())
            except Exception as e:  # (an optional speed-up: never a failed call; e.g. no os.getuid on Windows)
                got, reason, path = None, f"could not build or load: {type(e).__name__}: {e}", None
            _STATE.update(lib=got, reason=reason, path=path, tried=True)
    return _STATE["lib"]


def status() -> dict:
    """{"on": whether it is used, "loaded", "path" of the library, "reason"} (building it first
    where it was not tried yet)."""
    got = lib()
    on = _ON[0] and not _OFF[0]
    return {"on": on, "loaded": got is not None, "path": _STATE["path"],
            "reason": _STATE["reason"] if on else "turned off (GDPO_NATIVE=0 or impl._native.disabled)"}


@contextlib.contextmanager
def disabled():
    """The torch and NumPy passes for the calls inside (tests and benchmarks; scopes may nest or
    overlap: the loops are back once every scope has closed)."""
    _OFF[0] += 1
    try:
        yield
    finally:
        _OFF[0] -= 1


def _cpu_flat(t: torch.Tensor, dtype) -> bool:
    """A contiguous CPU tensor of ``dtype`` whose data is aligned for it (C reads it as such)."""
    return (t.device.type == "cpu" and t.layout == torch.strided and t.dtype == dtype and t.is_contiguous()
            and not t.is_neg() and not t.is_conj() and t.data_ptr() % t.element_size() == 0)


def scan(r: torch.Tensor) -> tuple[int, int, int] | None:
    """(min w, max v, OR) of ``impl._native.c``'s scan over the bits of the narrow-format rewards
    ``r`` (CPU), or None where the library is not at hand."""
    got = lib()
    if got is None or r.device.type != "cpu" or r.dtype not in _SCANS:
        return None
    itype, fn = _SCANS[r.dtype]
    u = r.detach().contiguous().view(itype)
    if not _cpu_flat(u, itype):  # (misaligned)
        return None
    out = np.zeros(3, dtype=np.uint64)
    getattr(got, fn)(u.data_ptr(), u.numel(), out.ctypes.data)
    return int(out[0]), int(out[1]), int(out[2])


def gather(r: torch.Tensor, g: int, x: torch.Tensor) -> tuple[int, int, int] | None:
    """Eq. 4's layout of groups of ``g`` contiguous rows: x (K, g, G) float64 filled with the
    float32 rewards ``r`` (n, K) (``x[k, p, q] = r[q g + p, k]``), and :func:`scan` of r from the
    same read; None (x untouched) where the library is not at hand or the tensors are not plain
    CPU ones of those shapes."""
    got = lib()
    if got is None or not (_cpu_flat(r, torch.float32) and _cpu_flat(x, torch.float64)) or r.dim() != 2:
        return None
    n, k = r.shape
    if g < 1 or n % g or tuple(x.shape) != (k, g, n // g):
        return None
    out = np.zeros(3, dtype=np.uint64)
    got.gdpo_gather_f32(r.data_ptr(), n, k, g, x.data_ptr(), out.ctypes.data)
    return int(out[0]), int(out[1]), int(out[2])


#: The C loops run on one thread: they take tensors of at most this many elements, or any where
#: torch itself runs at most 4 threads (:func:`serial`); beyond, torch's passes, whose threads win
#: on large batches of a many-core machine. Measured on 2 cores: the layout copy of contiguous
#: groups (4 columns, groups of 8) C 0.20 / 4.6 / 18 ms at N = 65,536 / 1M / 4M, torch's strided
#: copy 0.54 / 12.5 / 121 ms on one thread, 0.31 / 5.7 / 64 on two.
SERIAL_MAX = 1 << 20


def serial(numel: int) -> bool:
    """Should a tensor of ``numel`` elements take a one-thread C loop (see :data:`SERIAL_MAX`)?"""
    return numel <= SERIAL_MAX or torch.get_num_threads() <= 4


#: impl._native.c's columns per block of the tree sum
TREE_CHUNK = 256


def tree_sum(x: torch.Tensor, squares: bool, out: torch.Tensor | None = None,
             work: torch.Tensor | None = None) -> torch.Tensor | None:
    """``impl._segments.tree_sum`` of a float64 CPU tensor x (A, m) or (A, m, B), m >= 1, any
    strides, in one C loop (the same additions, the same bits): (A, 1) or (A, 1, B), written into
    ``out`` (a contiguous float64 tensor of at least A B elements, or None: a new one), the
    levels kept in ``work`` (float64, or None: a new one; too small: a new one); None where the
    library is not at hand or x is not such a tensor."""
    got = lib()
    if got is None or x.device.type != "cpu" or x.dtype != torch.float64 or x.dim() not in (2, 3) or x.shape[1] < 1:
        return None
    if x.layout != torch.strided or x.is_neg() or x.data_ptr() % 8:  # (a lazy negation: C reads the raw bits)
        return None
    A, m = x.shape[0], x.shape[1]
    B = x.shape[2] if x.dim() == 3 else 1
    sa, sm = x.stride(0), x.stride(1)
    sb = x.stride(2) if x.dim() == 3 else 1
    shape = (A, 1, B) if x.dim() == 3 else (A, 1)
    if A * B == 0:
        return torch.empty(shape, dtype=torch.float64)
    need = ((m + 1) // 2) * min(B, TREE_CHUNK)
    if work is None or not _cpu_flat(work, torch.float64) or work.numel() < need:
        work = torch.empty(need, dtype=torch.float64)
    if out is None or not _cpu_flat(out, torch.float64) or out.numel() < A * B or overlaps(out, work):
        out = torch.empty(A * B, dtype=torch.float64)
    if overlaps(x, out) or overlaps(x, work):  # the loop would write over x while reading it
        return None
    if got.gdpo_tree_sum_f64(x.data_ptr(), A, m, B, sa, sm, sb, int(bool(squares)), out.data_ptr(),
                             work.data_ptr()) != 0:
        return None
    return out[: A * B].view(shape)


def overlaps(x: torch.Tensor, t: torch.Tensor) -> bool:
    """May x's elements and t's share memory: do their address ranges meet (first element to
    last, whatever the strides between)?"""
    if x.numel() == 0 or t.numel() == 0:
        return False
    (xlo, xhi), (tlo, thi) = _span(x), _span(t)
    return xlo < thi and tlo < xhi


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The addresses of t's first element and one past its last (strides are never negative)."""
    lo = t.data_ptr()
    return lo, lo + t.element_size() * (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())))


_SCANS = {torch.float32: (torch.int32, "gdpo_scan_u32"), torch.float16: (torch.int16, "gdpo_scan_u16"),
          torch.bfloat16: (torch.int16, "gdpo_scan_u16")}


def tier0_left(a: torch.Tensor, y: torch.Tensor, s: float, A: float, P: float, top: float,
               buf: torch.Tensor) -> torch.Tensor | None | bool:
    """The rows of 1-D float64 ``a`` (CPU) that tier 0's test leaves, its float32 rounding ``y``
    given, as ascending int64 indices (a tensor of their own); None where every row passes;
    False where the library is not at hand or the tensors are not plain CPU ones. ``buf``: an
    int64 work buffer of a's length."""
    got = lib()
    if got is None or not (_cpu_flat(a, torch.float64) and _cpu_flat(y, torch.float32) and
                           _cpu_flat(buf, torch.int64)) or not (a.dim() == y.dim() == 1 and
                                                                  a.numel() == y.numel() <= buf.numel()):
        return False
    m = got.gdpo_tier0_f32(a.data_ptr(), y.data_ptr(), a.numel(), s, A, P, top, buf.data_ptr())
    return None if m == 0 else buf[:m].clone()


def zeros_left(left: torch.Tensor, a: torch.Tensor, y: torch.Tensor, prm: tuple[float, float, float, float],
               rewards: torch.Tensor, g: int, W: np.ndarray) -> tuple[torch.Tensor, int] | None:
    """The zeros among the rows tier 0 left (``left``, ascending int64 indices of 1-D float64
    ``a`` and its float32 rounding ``y``) in one unit of whole groups, in one loop
    (``impl._native.c``: ``impl._certify._tier0_loc``'s zeros of a certain sign, then
    ``impl._certify._exact_zeros``' test, where ``impl._exact_zeros.zero_rows_eq4``'s route
    holds): ``prm`` = (alpha, beta, th, near), the float32 rewards (N, K) in groups of ``g``
    contiguous rows, the integer weights ``W`` (K, 1). The exact zeros get y = +0 (``y`` is
    written). Returns (the rows still left, a view of ``left``, whose buffer is compacted in
    place; how many were exact zeros), or None where the library is not at hand or the tensors
    are not plain CPU ones of those shapes (nothing written)."""
    got = lib()
    if got is None or not (_cpu_flat(left, torch.int64) and _cpu_flat(a, torch.float64) and
                           _cpu_flat(y, torch.float32) and _cpu_flat(rewards, torch.float32)):
        return None
    if not (left.dim() == a.dim() == y.dim() == 1 and rewards.dim() == 2 and a.numel() == y.numel() ==
            rewards.shape[0] and 0 < rewards.shape[1] <= 64 and W.shape[0] == rewards.shape[1] and g >= 1):
        return None
    Wc = np.ascontiguousarray(W, dtype=np.float64)
    pr = np.array(prm, dtype=np.float64)
    zeros = np.zeros(1, dtype=np.int64)
    m = got.gdpo_zeros_left_f32(left.data_ptr(), left.numel(), a.data_ptr(), y.data_ptr(), pr.ctypes.data,
                                rewards.data_ptr(), rewards.shape[0], rewards.shape[1], g, Wc.ctypes.data,
                                zeros.ctypes.data)
    if m < 0:
        return None
    return left[:m], int(zeros[0])


def zero_rows(rows: torch.Tensor, rewards: torch.Tensor, g: int, W: np.ndarray) -> torch.Tensor | None:
    """``impl._exact_zeros.zero_rows_eq4``'s verdicts (R,) bool from ``impl._native.c``'s loop, for
    the ascending int64 ``rows`` of float32 rewards (N, K) on CPU in groups of ``g`` contiguous
    rows, the integer weights ``W`` (K, 1) float64, where that function's route holds (the loop
    reads the groups' rewards, not Eq. 4's statistics: the same values, each step exact); None
    where the library is not at hand or the tensors are not plain CPU ones of those shapes (the
    caller's NumPy then)."""
    got = lib()
    if got is None or not (_cpu_flat(rows, torch.int64) and _cpu_flat(rewards, torch.float32)) or rewards.dim() != 2:
        return None
    N, K = rewards.shape
    if not (0 < K <= 64 and g >= 1 and N % g == 0 and W.shape[0] == K and rows.dim() == 1):
        return None
    Wc = np.ascontiguousarray(W, dtype=np.float64)
    ok = torch.empty(rows.shape[0], dtype=torch.bool)
    if got.gdpo_zero_rows_f32(rows.data_ptr(), rows.shape[0], rewards.data_ptr(), N, K, g, Wc.ctypes.data,
                              ok.data_ptr()) != 0:
        return None
    return ok
