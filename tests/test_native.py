"""impl._native: the certificate's CPU loops in C give the verdicts of their torch and NumPy
fallbacks, on data that tells the tests' conditions apart, and a machine without a compiler
gets the same bits.

Each loop is compared with the code it replaces (impl._native.disabled() runs that code) on
batches built to reach every branch: rows passing the fast test, rows failing only the
magnitude condition (P), only the margin (A), NaN, zeros, subnormals, every row failing (also
in a last, partial block: the loop's index buffer has exactly one place per row), lengths
around the C loop's block and word sizes. The negative controls show the data can tell a loop
that drops a condition."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from impl import _certify, _exact_zeros, _native, gdpo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_built_here():
    """Where the machine has a C compiler (this project's machines do), the library loads."""
    st = _native.status()
    if shutil.which(os.environ.get("CC") or "cc") is None:
        assert not st["loaded"] and "compiler" in st["reason"]
    else:
        assert st["loaded"], st["reason"]


# --- the rewards' magnitudes -----------------------------------------------------------------------

def _reward_cases():
    g = np.random.default_rng(7)
    for dtype, itype, width in ((torch.float32, torch.int32, 32), (torch.float16, torch.int16, 16),
                                (torch.bfloat16, torch.int16, 16)):
        for n in (1, 2, 7, 8, 9, 63, 64, 65, 1000, 65536 + 3):
            bits = g.integers(0, 2 ** width, size=n, dtype=np.uint64)
            yield dtype, torch.from_numpy(bits.astype(np.int64)).to(itype).view(dtype)
        special = [0.0, -0.0, 1.0, -2.5, math.inf, -math.inf, math.nan, torch.finfo(dtype).tiny / 4,
                   -torch.finfo(dtype).tiny, torch.finfo(dtype).max]
        yield dtype, torch.tensor(special, dtype=dtype)
        yield dtype, torch.zeros(5, dtype=dtype)  # every reward 0: lo wraps to the top
        yield dtype, torch.tensor([-0.0, 0.0, -0.0], dtype=dtype)
        yield dtype, torch.randn(333, 4).to(dtype)
        yield dtype, (torch.rand(4096, 4) < 0.5).to(dtype)


@pytest.mark.parametrize("smallest_only", [False, True])
def test_scan_matches_numpy(smallest_only):
    assert _native.lib() is not None, _native.status()["reason"]
    for dtype, r in _reward_cases():
        got = _certify._magnitude_bits_np(r, smallest_only)
        with _native.disabled():
            want = _certify._magnitude_bits_np(r, smallest_only)
        assert got == want, (dtype, r.shape, got, want)


def _scan_variant(r, keep_sign=False, wrap=True):
    """A deliberately wrong scan (the sign bit kept in the largest, or a zero not wrapped to the
    top in the smallest), in NumPy, as (lo, hi) of :func:`impl._certify._magnitude_bits_np`."""
    width = 8 * r.element_size()
    u = r.view(torch.int32 if width == 32 else torch.int16).numpy().astype(np.int64) & (2 ** width - 1)
    m = u & (2 ** (width - 1) - 1)
    hi = int(u.max() if keep_sign else m.max())
    nz = m if not wrap else np.where(m == 0, 2 ** (width - 1), m)
    lo = int(nz.min())
    return (None if lo == 2 ** (width - 1) else lo), hi


def test_scan_control_tells_sign_and_zero():
    """Negative control: the cases tell the right scan from one that kept the sign bit or did not
    wrap a zero (each differs from the fallback on some case)."""
    told = {"sign": False, "wrap": False}
    for dtype, r in _reward_cases():
        with _native.disabled():
            lo, hi, _ = _certify._magnitude_bits_np(r)
        assert _scan_variant(r) == (lo, hi)  # the variant's frame is right where nothing is dropped
        told["sign"] |= _scan_variant(r, keep_sign=True) != (lo, hi)
        told["wrap"] |= _scan_variant(r, wrap=False) != (lo, hi)
    assert all(told.values()), told


# --- tier 0's test --------------------------------------------------------------------------------

def _tier0_cases():
    g = torch.Generator().manual_seed(3)
    f32 = torch.float32
    for n in (1, 7, 8, 9, 1023, 1024, 1025, 4096 + 5):
        yield "normal", torch.randn(n, dtype=torch.float64, generator=g)
    # near float32 rounding boundaries: midpoints between neighbours, a few float64 steps off
    base = torch.randn(3000, generator=g).to(f32)
    mid = (base.to(torch.float64) + torch.nextafter(base, torch.full_like(base, math.inf)).to(torch.float64)) / 2
    steps = torch.randint(-40, 41, (3000,), generator=g).to(torch.float64)
    yield "midpoints", mid + steps * torch.finfo(torch.float64).eps * mid.abs()
    sp = torch.tensor([0.0, -0.0, math.nan, math.inf, -math.inf, 5e-324, -1e-310, 1e-300, 2.0 ** -126,
                       2.0 ** -149, 3.4e38, -1.0, 1.0, 0.5], dtype=torch.float64)
    yield "special", sp
    yield "small", torch.randn(2000, dtype=torch.float64, generator=g) * 1e-30
    yield "zeros", torch.zeros(1025, dtype=torch.float64)  # every row fails, a partial last block
    yield "mixed", torch.where(torch.rand(5000, generator=g) < 0.03, 0.0,
                               torch.randn(5000, dtype=torch.float64, generator=g))


#: (alpha, beta) of tier 0's bound: tight, loose (most rows fail), the magnitude condition
#: deciding (alpha large against small rows), and none certifiable
_BOUNDS = [(1e-17, 4e-16), (1e-9, 1e-12), (1e-35, 1e-16), (0.0, 0.0), (1e-6, 0.2)]


def _left(a, alpha, beta):
    y = a.to(torch.float32)
    got = _certify.bits_left(a, alpha, beta, torch.float32, y)
    return None if got is None else got.tolist()


def test_tier0_matches_torch():
    assert _native.lib() is not None, _native.status()["reason"]
    seen = set()
    for name, a in _tier0_cases():
        for alpha, beta in _BOUNDS:
            got = _left(a, alpha, beta)
            with _native.disabled():
                want = _left(a, alpha, beta)
            assert got == want, (name, a.shape, alpha, beta)
            seen.add("none" if want is None else "all" if len(want) == a.numel() else "some")
    assert seen == {"none", "all", "some"}


def _verdicts(a, s, A, P, top):
    """Which rows pass v > top, v > A, p2 > P (NumPy, the fallback's arithmetic)."""
    y = a.to(torch.float32).to(torch.float64).numpy()
    an = a.numpy()
    r = np.abs(an - y)
    p2 = (an.view(np.int64) & 0x7FF0000000000000).view(np.float64)
    v = p2 - s * r
    return v > top, v > A, p2 > P


def test_tier0_control_each_condition_matters():
    """Negative control: the cases include rows the magnitude condition alone fails and rows the
    margin alone fails, so a loop that dropped either (P or A set to -inf) answers otherwise."""
    buf = torch.empty(1 << 16, dtype=torch.int64)
    told_p = told_a = False
    for name, a in _tier0_cases():
        for alpha, beta in _BOUNDS:
            h = 2.0 ** -24
            grow = 1 + 2.0 ** -40
            k1, k2 = (h - 2 * beta) / grow, (h / 2 - 2 * beta) / grow
            if not (k1 > 0 and k2 > 0):
                continue
            s = grow / k1
            A, P = alpha * s * grow, alpha / k2 * grow
            top = max(A, P)
            y = a.to(torch.float32)
            right = _native.tier0_left(a, y, s, A, P, top, buf)
            no_p = _native.tier0_left(a, y, s, A, -math.inf, A, buf)
            no_a = _native.tier0_left(a, y, s, -math.inf, P, P, buf)
            key = (lambda t: None if t is None else t.tolist())
            told_p |= key(right) != key(no_p)
            told_a |= key(right) != key(no_a)
    assert told_p and told_a


# --- the exact zeros' loop --------------------------------------------------------------------------

@pytest.mark.parametrize("g", [2, 8, 16, 32])
def test_zero_rows_match_numpy(g):
    assert _native.lib() is not None, _native.status()["reason"]
    from impl import _eq4
    gen = torch.Generator().manual_seed(g)
    for K, weights in ((4, [1.0, 1.0, 1.0, 1.0]), (3, [1.0, -2.0, 0.5]), (1, [1.0]), (5, [1, 1, 2, 2, 3])):
        r = torch.randint(0, 3, (g * 64, K), generator=gen).float()
        r[: g * 4] = 1.0  # constant groups
        z = _eq4_z(r, g, weights)
        rows = torch.arange(r.shape[0], dtype=torch.int64)
        got = _exact_zeros.zero_rows_eq4(rows, r, g, list(weights), z.stats)
        with _native.disabled():
            want = _exact_zeros.zero_rows_eq4(rows, r, g, list(weights), z.stats)
        assert torch.equal(got, want), (g, K)
        assert bool((~want).any())
        if K > 1:
            assert bool(want.any())  # the data holds both verdicts: the loop is tested on each


def _eq4_z(r, g, weights):
    """Eq. 4's statistics of contiguous groups, as the certificate's stage gets them."""
    from impl import _plan
    from impl._inputs import check_normalize
    from impl import _pipeline
    call = check_normalize(r, None, g, weights, 1e-4, "refuse", None)
    plan = _plan.local(call, _plan.NORMALIZE)
    dev = _pipeline.through_stats(plan, r, {})
    assert dev.z.stats is not None
    return dev.z


# --- the whole call: the same bits with and without the loops ------------------------------------

def _batches():
    g = torch.Generator().manual_seed(11)
    yield torch.randn(4096, 4, generator=g), 8
    yield (torch.rand(4096, 4, generator=g) < 0.5).float(), 8
    yield (torch.rand(4096, 3, generator=g) < 0.5).float(), 16
    yield torch.randint(0, 3, (4096, 4), generator=g).float() * 0.25, 4  # (exact zeros of 0, 1/4, 1/2)
    yield (torch.rand(4098, 2, generator=g) < 0.5).float(), 6  # (not the Eq. 4 route: groups of 6)
    yield torch.randn(4096, 2, generator=g) * 1e-3 + 1e4, 4
    yield torch.randint(0, 5, (2048, 4), generator=g).to(torch.bfloat16), 8


def test_same_bits_with_and_without():
    for r, gs in _batches():
        for out in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            d1, d2 = gdpo.Diagnostics(), gdpo.Diagnostics()
            got = gdpo.gdpo_advantages(r, group_size=gs, out_dtype=out, diagnostics=d1)
            with _native.disabled():
                want = gdpo.gdpo_advantages(r, group_size=gs, out_dtype=out, diagnostics=d2)
            assert torch.equal(got.view(torch.uint8) if got.dtype != torch.float64 else got.view(torch.int64),
                               want.view(torch.uint8) if want.dtype != torch.float64 else want.view(torch.int64))
            assert d1.certified == d2.certified, (gs, out, d1.certified, d2.certified)  # the same tiers decided


_CHILD = """
import hashlib, sys, torch
from impl import _native, gdpo
g = torch.Generator().manual_seed(5)
h = hashlib.sha256()
for r in (torch.randn(4096, 4, generator=g), (torch.rand(4096, 4, generator=g) < 0.5).float()):
    h.update(gdpo.gdpo_advantages(r, group_size=8).numpy().tobytes())
st = _native.status()
print(h.hexdigest(), st["loaded"], st["reason"].replace(chr(10), " "))
"""


def _child(env_extra):
    env = dict(os.environ, PYTHONPATH=ROOT, **env_extra)
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    digest, loaded, reason = done.stdout.strip().split(" ", 2)
    return digest, loaded == "True", reason


def test_no_compiler_same_bits(tmp_path):
    """A machine without a C compiler (CC names none, an empty cache) runs the fallback: the
    same bits, and status says why; GDPO_NATIVE=0 the same; with the compiler, the library
    builds into the given folder."""
    built = _child({"GDPO_NATIVE_DIR": str(tmp_path / "built")})
    none = _child({"CC": str(tmp_path / "no-such-cc"), "GDPO_NATIVE_DIR": str(tmp_path / "none")})
    off = _child({"GDPO_NATIVE": "0", "GDPO_NATIVE_DIR": str(tmp_path / "off")})
    assert built[1] and list((tmp_path / "built").glob("gdpo_native_*.so"))
    assert not none[1] and "no C compiler" in none[2]
    assert not off[1] and "GDPO_NATIVE=0" in off[2]
    assert built[0] == none[0] == off[0]


def test_foreign_folder_never_loaded(tmp_path):
    """A cache folder others may write is not used (a library put there is never loaded)."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    digest, loaded, reason = _child({"GDPO_NATIVE_DIR": str(folder)})
    assert not loaded and "not this user's alone" in reason
    assert not list(folder.glob("*.so"))


def test_tier0_writes_no_place_beyond_the_rows():
    """The loop writes at most one index per row: sentinels after a buffer of exactly n places
    stay as they were, every row failing, n not a multiple of the loop's words or blocks (the
    loop once wrote up to seven places past the rows of a last, partial word)."""
    for n in (1, 5, 1023, 1025, 2049):
        a = torch.zeros(n, dtype=torch.float64)  # p2 = 0: every row fails
        store = torch.full((n + 16,), -7, dtype=torch.int64)
        got = _native.tier0_left(a, a.to(torch.float32), 1.0, 0.0, 0.0, 0.0, store[:n])
        assert got.tolist() == list(range(n))
        assert bool((store[n:] == -7).all()), n


@pytest.mark.parametrize("n,k,g", [(64, 4, 8), (48, 3, 16), (40, 1, 8), (7, 2, 7), (9, 4, 1), (8 * 13, 5, 8),
                                   (16 * 9 + 0, 2, 16), (1024 * 3, 4, 1024)])
def test_gather_matches_torch(n, k, g):
    """Eq. 4's contiguous layout from the C loop: the same values as torch's strided copy, and the
    rewards' magnitudes as the scan reads them (group counts not a multiple of the loop's eight)."""
    gen = torch.Generator().manual_seed(n + k + g)
    r = torch.randn(n, k, generator=gen) * torch.tensor([1e-30, 1.0, 1e30, 3.0, 0.0][:k] if k <= 5 else 1.0)
    r[0, 0] = -0.0
    x = torch.full((k, g, n // g), math.nan, dtype=torch.float64)
    got = _native.gather(r, g, x)
    want = r.view(n // g, g, k).permute(2, 1, 0).to(torch.float64)
    assert got == _native.scan(r)
    assert torch.equal(x, want)


def test_gather_declines_what_it_cannot_lay_out():
    """Shapes and dtypes the loop does not take leave x untouched (the caller's torch copy)."""
    r = torch.randn(12, 2)
    x = torch.zeros(2, 4, 3, dtype=torch.float64)
    assert _native.gather(r, 5, x) is None  # 12 rows are not groups of 5
    assert _native.gather(r.to(torch.float64), 4, x) is None
    assert _native.gather(r.t(), 4, torch.zeros(12, 4, 1, dtype=torch.float64)) is None  # not contiguous
    assert _native.gather(r, 4, torch.zeros(2, 3, 4, dtype=torch.float64)) is None  # not (K, g, G)
    assert bool((x == 0).all())


def test_eq4_takes_the_scan_from_its_copy(monkeypatch):
    """The certificate reads the rewards' magnitudes from Eq. 4's copy where the loop made it (no
    second read of the rewards), and decides as it does reading them itself."""
    calls = []
    real = _native.scan
    monkeypatch.setattr(_native, "scan", lambda r: calls.append(r.shape) or real(r))
    r = torch.randn(4096, 4)
    d1 = gdpo.Diagnostics()
    got = gdpo.gdpo_advantages(r, group_size=8, diagnostics=d1)
    assert calls == []
    with _native.disabled():
        want = gdpo.gdpo_advantages(r, group_size=8)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_a_compiler_without_clones_builds_the_baseline(tmp_path):
    """A compiler that cannot build the per-CPU clones (no ifuncs: musl, say; here a wrapper that
    refuses without -DGDPO_NO_CLONES) gets the baseline build: loaded, the same bits."""
    real = shutil.which(os.environ.get("CC") or "cc")
    assert real is not None
    cc = tmp_path / "cc-no-ifunc"
    cc.write_text(f'#!/bin/sh\ncase "$*" in *-DGDPO_NO_CLONES*) exec {real} "$@";; esac\n'
                  'echo "ifunc is not supported on this target" >&2; exit 1\n')
    cc.chmod(0o755)
    base = _child({"GDPO_NATIVE_DIR": str(tmp_path / "built")})
    plain = _child({"CC": str(cc), "GDPO_NATIVE_DIR": str(tmp_path / "plain")})
    assert plain[1], plain[2]
    assert plain[0] == base[0]


def test_a_failing_build_is_a_fallback_not_an_error(monkeypatch):
    """Whatever goes wrong building or loading (here: the build raises), calls run the fallback
    and status says why; the state is restored afterwards."""
    for key in ("lib", "tried", "reason", "path"):
        monkeypatch.setitem(_native._STATE, key, {"tried": False, "lib": None}.get(key, _native._STATE[key]))

    def boom(cc, source):
        raise AttributeError("module 'os' has no attribute 'getuid'")
    monkeypatch.setattr(_native, "_build", boom)
    st = _native.status()
    assert not st["loaded"] and "AttributeError" in st["reason"]
    r = torch.randn(256, 4)
    got = gdpo.gdpo_advantages(r, group_size=8)
    with _native.disabled():
        want = gdpo.gdpo_advantages(r, group_size=8)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_a_damaged_library_in_the_cache_is_built_again(tmp_path):
    """A file of the library's name that does not load (garbage: a disk fault, a copy cut short)
    is built again, once, not left to slow every later process down."""
    folder = tmp_path / "cache"
    first = _child({"GDPO_NATIVE_DIR": str(folder)})
    (so,) = folder.glob("gdpo_native_*.so")
    so.write_bytes(b"not a library")
    again = _child({"GDPO_NATIVE_DIR": str(folder)})
    assert again[1], again[2]
    assert again[0] == first[0] and so.read_bytes()[:4] == b"\x7fELF"


def test_tier0_verdicts_agree_at_the_boundary():
    """Where v = p2 - s r sits exactly on A when rounded twice, the C loop and the fallback agree
    (both round twice: torch's sub with alpha fused the two into one rounding on AVX2 CPUs, and
    the fallback passed a row the C loop did not; found by a review). The case is built so that
    A equals the twice-rounded v."""
    a = 1.2368105065960997
    h, grow = 2.0 ** -24, 1 + 2.0 ** -40
    s = grow / (h / grow)
    r = abs(a - float(torch.tensor(a, dtype=torch.float64).to(torch.float32)))
    v = 1.0 - s * r  # two roundings
    alpha = v / (s * grow)
    for _ in range(200):
        A = alpha * s * grow
        if A == v:
            break
        alpha = math.nextafter(alpha, math.inf if A < v else -math.inf)
    assert alpha * s * grow == v
    at = torch.ones(64, dtype=torch.float64)
    at[0] = a
    got = _certify.bits_left(at, alpha, 0.0, torch.float32)
    with _native.disabled():
        want = _certify.bits_left(at, alpha, 0.0, torch.float32)
    assert got is not None and want is not None and got.tolist() == want.tolist() == [0]


def test_empty_and_misaligned():
    """No rows: both answer 'every row passes'; a misaligned float32 view is not handed to C."""
    e = torch.zeros(0, dtype=torch.float64)
    assert _certify.bits_left(e, 1e-17, 1e-16, torch.float32) is None
    with _native.disabled():
        assert _certify.bits_left(e, 1e-17, 1e-16, torch.float32) is None
    odd = torch.frombuffer(bytearray(4 * 64 + 1), dtype=torch.float32, offset=1, count=64)
    assert odd.data_ptr() % 4 != 0 and odd.is_contiguous()
    assert not _native._cpu_flat(odd, torch.float32)
    x = torch.zeros(1, 8, 8, dtype=torch.float64)
    assert _native.gather(odd.view(64, 1), 8, x) is None


def test_disabled_scopes_overlap():
    """Scopes of disabled() that overlap (enter A, enter B, leave A, leave B) leave the loops on."""
    a, b = _native.disabled(), _native.disabled()
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    assert not _native.status()["on"]
    b.__exit__(None, None, None)
    assert _native.status()["on"] and _native.status()["loaded"]


def test_cc_with_arguments(tmp_path):
    """CC may carry arguments ('ccache gcc', 'gcc -m64'): split as a shell would."""
    real = shutil.which("cc")
    got = _child({"CC": f"{real} -O2", "GDPO_NATIVE_DIR": str(tmp_path / "args")})
    assert got[1], got[2]


def test_a_library_cut_short_is_built_again(tmp_path):
    """A library cut short (a crash before its bytes reached the disk; the loader would die of
    SIGBUS mapping it) fails its digest and is built again."""
    folder = tmp_path / "cache"
    first = _child({"GDPO_NATIVE_DIR": str(folder)})
    (so,) = folder.glob("gdpo_native_*.so")
    whole = so.read_bytes()
    so.write_bytes(whole[:12288])
    again = _child({"GDPO_NATIVE_DIR": str(folder)})
    assert again[1], again[2]
    assert again[0] == first[0] and len(so.read_bytes()) == len(whole)


def test_a_linked_cache_folder_is_not_followed(tmp_path):
    """The cache folder is opened without following a link (a link in a shared temporary folder
    can be pointed elsewhere between a check and a load): refused, the reason said, same bits."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    digest, loaded, reason = _child({"GDPO_NATIVE_DIR": str(link)})
    assert not loaded and str(link) in reason
    assert digest == _child({"GDPO_NATIVE_DIR": str(real)})[0]


# --- the zeros among the rows tier 0 left ------------------------------------------------------------

def _zeros_case(seed, n=2048, k=4, g=8):
    """A binary batch's a (float64), its float32 rounding, tier 0's bound and the rows it left."""
    from impl import _plan, _pipeline
    from impl._inputs import check_gdpo
    gen = torch.Generator().manual_seed(seed)
    r = (torch.rand(n, k, generator=gen) < 0.5).float()
    call = check_gdpo(r, None, g, None, None, 1e-4, torch.float32, "refuse", None)
    plan = _plan.local(call, _plan.GDPO)
    dev = _pipeline.device_part(plan, r)
    return r, dev.a.clone(), dev.a.to(torch.float32)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_zeros_left_match_the_passes(seed):
    """The loop over the rows tier 0 left (zeros of a certain sign, then c* = 0 exactly) leaves
    the rows, writes the outputs and counts the zeros the two passes it stands for do
    (impl._certify._tier0_loc's, then _exact_zeros'), on 0/1 rewards whose rows reach each rule:
    exact zeros, rows near zero that are not, rows whose zero's sign is certain (a tiny a: y = 0
    with a of either sign), a row far from zero, a NaN."""
    r, a, y = _zeros_case(seed)
    n = a.numel()
    a[5], a[6], a[7] = 1e-300, -1e-300, math.nan  # y = +-0, a far below the bound... and a NaN
    a[9] = 2.0 ** -60  # y != 0: not a zero
    y = a.to(torch.float32)
    W = _exact_zeros.weight_column((1.0,) * r.shape[1])
    left = torch.arange(n, dtype=torch.int64)
    for alpha, beta in ((1e-15, 1e-16), (1e-310, 1e-17), (0.0, 0.0), (1e-13, 2.0 ** -30)):
        near = alpha / (1 - beta) * (1 + 2.0 ** -30)
        prm = (alpha, beta, 3.4028235677973366e38, near)
        y1 = y.clone()
        got = _native.zeros_left(left.clone(), a, y1, prm, r, 8, W)
        assert got is not None
        rest, zeros = got
        # the passes: the sign-certain zeros, then the exact zeros on what is left
        an, yn = a.numpy(), y.numpy()
        B = alpha + beta * np.abs(an)
        Bg = B * (1 + 2.0 ** -40)
        sign = (yn == 0) & (an != 0) & (np.abs(an) > Bg) & (np.abs(an) + Bg < prm[2])
        cand = np.flatnonzero(~sign & (np.abs(an) <= near))
        with _native.disabled():
            from impl import _eq4
            z = _eq4_z(r, 8, [1.0] * r.shape[1])
            ok = _exact_zeros.zero_rows_eq4(torch.from_numpy(cand), r, 8, [1.0] * r.shape[1], z.stats).numpy()
        exact = cand[ok]
        want_rest = np.setdiff1d(np.flatnonzero(~sign), exact)
        assert rest.tolist() == want_rest.tolist(), (alpha, beta)
        assert zeros == exact.size and exact.size > 20
        y2 = y.clone()
        y2[torch.from_numpy(exact)] = 0.0
        assert torch.equal(y1.view(torch.int32), y2.view(torch.int32))
        assert sign.any() == (alpha < 1e-300)  # the data reaches the sign rule where the bound lets it


def test_zeros_left_decline_what_they_cannot_read():
    r, a, y = _zeros_case(3, n=64)
    W = _exact_zeros.weight_column((1.0,) * 4)
    left = torch.arange(64, dtype=torch.int64)
    prm = (1e-15, 0.0, 3e38, 1e-15)
    assert _native.zeros_left(left, a, y, prm, r, 7, W) is None  # 64 rows are not groups of 7
    assert _native.zeros_left(left, a, y, prm, r.double(), 8, W) is None
    assert _native.zeros_left(torch.tensor([64]), a, y, prm, r, 8, W) is None  # a row outside the batch
    assert _native.zeros_left(left, a, y.double(), prm, r, 8, W) is None


# --- the tree sum ----------------------------------------------------------------------------------

def _tree_data(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen, dtype=torch.float64)
    x *= 10.0 ** torch.randint(-12, 13, shape, generator=gen).to(torch.float64)  # every order rounds apart
    flat = x.view(-1)
    flat[::17] = -0.0
    if flat.numel() > 40:
        flat[3], flat[29] = 5e-324, -1e-310
    return x


@pytest.mark.parametrize("shape", [(3, 1, 5), (2, 7), (1, 65537), (4, 8, 300), (2, 33, 1), (5, 2, 513), (3, 100),
                                   (1, 3, 1), (0, 4, 2)])
def test_tree_sum_matches_torch(shape):
    """The C tree gives the torch levels' sums to the bit (one column or many, a partial block of
    columns, odd lengths at every level, squares, strided views, kept buffers), where a sum
    from left to right differs (the data tells the order apart)."""
    from impl import _segments
    x = _tree_data(shape, sum(shape))
    views = [x]
    if x.dim() == 3 and x.shape[2] > 1:
        views.append(x[:, :, ::2])  # a strided last axis
    if x.shape[0] > 1:
        views.append(x.transpose(0, 1).contiguous().transpose(0, 1))  # another order of the strides
    told = False
    for v in views:
        for squares in (False, True):
            got = _native.tree_sum(v, squares)
            assert got is not None
            with _native.disabled():
                want = _segments.tree_sum(v, squares=squares)
                n = max(v.numel(), 1)
                bufs = (torch.empty(n, dtype=torch.float64), torch.empty(n, dtype=torch.float64))
                kept = _segments.tree_sum(v, bufs, squares=squares).clone()
            assert got.shape == want.shape
            assert torch.equal(got.view(torch.int64), want.view(torch.int64)), (shape, squares)
            assert torch.equal(_segments.tree_sum(v, bufs, squares=squares).view(torch.int64), kept.view(torch.int64))
            if v.numel() and v.shape[1] > 3:  # (three values: the tree is the order from the left)
                seq = (v * v if squares else v).cumsum(1)[:, -1:]
                told |= not torch.equal(seq.view(torch.int64), want.view(torch.int64))
    assert told or shape[1] <= 3 or shape[0] == 0


def test_tree_sum_of_infinities_and_nan():
    """Infinities and NaN reach the sums as in the torch levels (inf - inf: NaN)."""
    from impl import _segments
    x = torch.tensor([[1.0, math.inf, 2.0, -math.inf, 3.0], [math.nan, 1.0, 0.0, -0.0, 2.0],
                      [math.inf, 1.0, 1e308, 1e308, -0.0]], dtype=torch.float64)
    for squares in (False, True):
        got = _native.tree_sum(x, squares)
        with _native.disabled():
            want = _segments.tree_sum(x, squares=squares)
        assert got.isnan().tolist() == want.isnan().tolist()
        assert got[~got.isnan()].tolist() == want[~want.isnan()].tolist()


def test_tree_sum_over_its_own_buffers_falls_back_to_fresh_ones():
    """A tensor that lies in the buffers it would be summed into gets fresh ones (its values
    are read, never overwritten first), the C loop and the torch levels alike."""
    from impl import _segments
    bufs = (torch.empty(4096, dtype=torch.float64), torch.empty(4096, dtype=torch.float64))
    x = bufs[0][:3 * 40].view(3, 40)
    x.copy_(_tree_data((3, 40), 7))
    with _native.disabled():
        want = _segments.tree_sum(x.clone(), squares=True)
        off = _segments.tree_sum(x, bufs, squares=True).clone()  # the torch levels too
    got = _segments.tree_sum(x, bufs, squares=True)
    assert torch.equal(got.view(torch.int64), want.view(torch.int64))
    assert torch.equal(off.view(torch.int64), want.view(torch.int64))


def test_lazily_negated_tensors_are_read_as_their_values():
    """A tensor carrying torch's lazy negation (its bits are the values' negatives) is never
    handed to C as it lies: the rewards are read as their values at the inputs stage (the same
    advantages as the negation resolved, the library on or off), and the loops refuse such a
    tensor where one reaches them (the caller's torch passes then)."""
    from impl import _segments
    g = torch.Generator().manual_seed(0)
    r0 = torch.randint(-1, 2, (4096, 2), generator=g).to(torch.float32)
    r = torch._neg_view(r0)
    assert r.is_neg()
    want = gdpo.gdpo_advantages(r.resolve_neg(), group_size=8)
    for native in (True, False):
        with contextlib.ExitStack() as stack:
            if not native:
                stack.enter_context(_native.disabled())
            got = gdpo.gdpo_advantages(r, group_size=8)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), native
    x = torch._neg_view(_tree_data((3, 40, 2), 3))
    assert _native.tree_sum(x, False) is None
    assert _native.gather(r, 8, torch.empty(2, 8, 512, dtype=torch.float64)) is None
    with _native.disabled():
        want = _segments.tree_sum(x.resolve_neg())
    assert torch.equal(_segments.tree_sum(x).view(torch.int64), want.view(torch.int64))


def test_tree_sum_never_writes_over_what_it_reads():
    """Buffers that meet x (another view of one allocation, not the same storage object), or
    out and work that meet each other, are not used as given: the sums are the torch levels'."""
    from impl import _segments
    base = np.zeros(8192)
    b0, b1 = torch.from_numpy(base[:4096]), torch.from_numpy(base[4096:])
    x = torch.from_numpy(base[4000:4400]).view(4, 100)  # across both buffers
    x.copy_(_tree_data((4, 100), 5))
    with _native.disabled():
        want = _segments.tree_sum(x.clone(), squares=True)
    got = _segments.tree_sum(x, (b0, b1), squares=True)
    assert torch.equal(got.view(torch.int64), want.view(torch.int64))
    y = _tree_data((2, 16, 600), 6)  # B > 256: several blocks of columns
    buf = torch.empty(20000, dtype=torch.float64)
    with _native.disabled():
        want = _segments.tree_sum(y)
    got = _native.tree_sum(y, False, out=buf, work=buf)
    assert torch.equal(got.view(torch.int64), want.view(torch.int64))
