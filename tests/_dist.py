"""Real torch.distributed process groups for the tests, with a hard deadline.

``run_group`` spawns ``world_size`` processes (spawn context), each joins a
process group through a temporary ``file://`` rendezvous (never a fixed port,
so pytest-xdist workers can start groups at the same time) with a group
timeout, and runs a list of scenarios in order, catching every exception per
scenario. Each rank writes one record per scenario to its own file as soon as
the scenario returns, so a rank that hangs or dies loses nothing already done.
The parent waits until a deadline, then terminates whatever is still running:
a hang is a test failure (``Run.hung``), never a stuck CI job. A group whose
rendezvous itself fails (nothing under test has run) starts again (``spawn``).

Scenarios are plain data ``(name, kind, kwargs)``; ``kind`` names a function in
``SCENARIOS``; per-rank inputs (values, rewards, sizes, group_ids, weights, and
dtype/eps where not a plain string) are lists indexed by rank.
"""

from __future__ import annotations

import datetime
import os
import pickle
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field

import multiprocessing as mp

COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
    "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "gather", "scatter", "barrier", "send", "recv", "isend", "irecv",
    "monitored_barrier", "batch_isend_irecv",
)


@dataclass
class Run:
    world_size: int
    records: dict = field(default_factory=dict)  # scenario name -> {rank: record}
    exitcodes: list = field(default_factory=list)
    hung: list = field(default_factory=list)  # ranks terminated at the deadline
    wall_s: float = 0.0
    stderr: str = ""

    def by_rank(self, name: str) -> dict:
        recs = self.records.get(name, {})
        missing = [r for r in range(self.world_size) if r not in recs]
        assert not missing, (f"scenario {name!r}: ranks {missing} never reported (hung={self.hung}, "
                             f"exitcodes={self.exitcodes})\n{self.stderr[-3000:]}")
        return recs


# --- scenario functions (run inside the spawned ranks) ------------------------------------


def _tensor(values, dtype, device):
    import torch

    return torch.tensor(values, dtype=getattr(torch, dtype), device=device)


def _mine(x, rank):
    """This rank's entry of a per-rank list; strings and None are the same on every rank."""
    return x if x is None or isinstance(x, str) else x[rank]


def _plain_call(fn):
    return fn()


def _whiten(rank, world, group, device, values, sizes=None, dtype="float64", out_dtype="float64",
            eps=None, stats=False, call=_plain_call):
    import torch

    from impl import _distributed, gdpo

    dt = _mine(dtype, rank)
    v = _tensor(values[rank], dt, device) if dt != "int64" else torch.tensor(values[rank], device=device).long()
    kwargs = {"segment_sizes": _mine(sizes, rank),
              "out_dtype": getattr(torch, out_dtype)}
    if eps is not None:
        kwargs["eps"] = _mine(eps, rank)
    elif stats:
        from spec.constants import DEFAULT_EPS

        kwargs["eps"] = DEFAULT_EPS
    if stats:
        out, st = call(lambda: _distributed.run_distributed(_distributed.P.API_WHITEN, group, values=v, **kwargs))
        return out, torch.stack([st.n, st.e.to(torch.float64), st.shift, st.mean, st.m2, st.lo, st.hi], 1)
    return call(lambda: gdpo.whiten(v, process_group=group, **kwargs)), None


def _gdpo(rank, world, group, device, rewards, sizes=None, group_size=None, group_ids=None, weights=None,
          dtype="float64", out_dtype="float64", missing=None, call=_plain_call, eps=None):
    """``missing`` (one for every rank, or per rank): passed on, and the call's Diagnostics
    come back as the record's stats, [unscored_rows, unscored_rows_all_ranks, mask...].
    ``eps`` (one for every rank): passed on where given (None: impl's default)."""
    import torch

    from impl import gdpo

    r = _tensor(rewards[rank], _mine(dtype, rank), device)
    if r.numel() == 0:  # an empty shard still has K reward columns
        r = r.reshape(0, len(next(row for rows in rewards for row in rows)))
    extra = {} if eps is None else {"eps": eps}
    if missing is not None:
        extra.update(missing=_mine(missing, rank), diagnostics=gdpo.Diagnostics())
    out = call(lambda: gdpo.gdpo_advantages(
        r, group_size=group_size, group_ids=_mine(group_ids, rank), weights=_mine(weights, rank),
        segment_sizes=_mine(sizes, rank), process_group=group,
        out_dtype=getattr(torch, out_dtype), **extra))
    if missing is None:
        return out, None
    d = extra["diagnostics"]
    return out, [d.unscored_rows, d.unscored_rows_all_ranks] + [bool(x) for x in d.unscored.tolist()]


def _steps(rank, world, group, device, steps):
    """Several whiten calls in a row: ``steps[rank]`` lists (values, how), ``how`` "ok",
    "meta" (this rank's values on the meta device), "not_a_group" (process_group="world",
    a call that joins no group), "new_group" (no call: the later ones use a new group of
    every rank), "second_group" (no call: create another group of every rank) or "second"
    (a call on that group). The result: each step's (class name or "ok", message or bits)."""
    import torch
    import torch.distributed as dist

    from impl import gdpo

    out = []
    second = None
    for values, how in steps[rank]:
        if how in ("new_group", "second_group"):
            made = dist.new_group(list(range(world)))
            group, second = (made, second) if how == "new_group" else (group, made)
            out.append([how, ""])
            continue
        v = torch.tensor(values, dtype=torch.float64, device="meta" if how == "meta" else device)
        pg = {"not_a_group": "world", "second": second}.get(how, group)
        try:
            a = gdpo.whiten(v, process_group=pg, out_dtype=torch.float64)
            out.append(["ok", [float(x).hex() for x in a.tolist()]])
        except Exception as exc:  # noqa: BLE001 - every outcome is the result
            out.append([type(exc).__name__, str(exc)])
    return out, None


def _subgroup(rank, world, group, device, members, values):
    """whiten over a new group of ``members`` (global ranks); the others only create it."""
    import torch.distributed as dist

    sub = dist.new_group(members)
    if rank not in members:
        return None, None
    return _whiten(rank, world, sub, device, values)


def _mixed_api(rank, world, group, device, values):
    """Rank 0 calls whiten, the others gdpo_advantages: refused, nobody hangs."""
    if rank == 0:
        return _whiten(rank, world, group, device, values)
    return _gdpo(rank, world, group, device, [[[x] for x in v] for v in values], group_size=2)


def _die(rank, world, group, device, values, victim=1):
    """``victim`` exits before joining the call; the others must fail, not hang."""
    if rank == victim:
        os._exit(3)
    return _whiten(rank, world, group, device, values)


#: Where ``_fail`` makes the victim's local computation raise: module, attribute.
FAIL_AT = {"combine": [("impl._eq47", "combine")],  # labelled groups' Eq. 4/7, after the agreement
           "table": [("impl._whiten", "Local.table")],  # before collective 2
           "apply": [("impl._whiten", "apply_global")],  # after collective 2
           "buffers": [("impl._distributed", "_Buffers.__init__")],  # collectives 2 and 3's buffer (before 1)
           "late_row": [("impl._distributed", "_late_row")]}  # this rank's row of collective 3


def _fail(rank, world, group, device, at, call_kind, victim=1, unreadable=False, **kwargs):
    """``victim``'s local computation raises RuntimeError at ``FAIL_AT[at]`` (``unreadable``:
    an exception whose str() itself raises); the call itself is ``SCENARIOS[call_kind]``.
    Every rank must return (raise or succeed) in time."""
    import importlib

    patched = []
    for mod_name, attr in FAIL_AT[at]:
        owner = importlib.import_module(mod_name)
        *path, leaf = attr.split(".")
        for p in path:
            owner = getattr(owner, p)
        patched.append((owner, leaf, getattr(owner, leaf), attr))
    if rank == victim:
        for owner, leaf, _, attr in patched:
            setattr(owner, leaf, _raiser(f"injected failure in {attr} on rank {rank}", unreadable))
    try:
        return SCENARIOS[call_kind](rank, world, group, device, **kwargs)
    finally:
        for owner, leaf, original, _ in patched:
            setattr(owner, leaf, original)


def _readable(exc) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - e.g. Unreadable below
        return "<unreadable>"


class Unreadable(RuntimeError):
    """An exception whose message cannot be read: str() raises."""

    def __str__(self):
        raise RuntimeError("no message")


def _raiser(msg, unreadable=False):
    def broken(*args, **kwargs):
        raise (Unreadable if unreadable else RuntimeError)(msg)

    return broken


def _built(x, device):
    """Plain data to call arguments: ``("tensor", values, dtype)`` is a tensor on ``device``,
    ``("dtype", name)`` a torch dtype, ``("diagnostics",)`` a fresh impl.gdpo.Diagnostics;
    dicts are rebuilt value by value; anything else (labels, ...) is passed as it is."""
    import torch

    if isinstance(x, tuple) and len(x) == 3 and x[0] == "tensor":
        return torch.tensor(x[1], dtype=getattr(torch, x[2]), device=device)
    if isinstance(x, tuple) and len(x) == 2 and x[0] == "dtype":
        return getattr(torch, x[1])
    if x == ("diagnostics",):
        from impl import gdpo

        return gdpo.Diagnostics()
    if isinstance(x, dict):
        return {k: _built(v, device) for k, v in x.items()}
    return x


def _adapter(rank, world, group, device, adapter, args):
    """``impl.adapters.<adapter>(**args[rank], process_group=group)``: per-rank arguments as
    plain data (see ``_built``), so that one rank can pass what the adapter itself refuses."""
    from impl import adapters

    kwargs = {k: _built(v, device) for k, v in args[rank].items()}
    return getattr(adapters, adapter)(process_group=group, **kwargs), None


def _calls(rank, world, group, device, api, calls):
    """``impl.gdpo.<api>(**calls[i][rank], process_group=group)`` for each call in turn, each
    rank's arguments as plain data (see ``_built``); the key ``"flush_denormal"`` (True) runs
    that rank's call under ``torch.set_flush_denormal(True)``. The result: each call's (class
    name or "ok", message or the output's float64 hex, seconds it took on this rank)."""
    import torch

    from impl import gdpo

    out = []
    for per_rank in calls:
        kwargs = {k: _built(v, device) for k, v in per_rank[rank].items()}
        flush = kwargs.pop("flush_denormal", False)
        t0 = time.monotonic()
        try:
            if flush:
                torch.set_flush_denormal(True)
            try:
                a = getattr(gdpo, api)(process_group=group, **kwargs)
            finally:
                torch.set_flush_denormal(False)
            out.append(["ok", [float(x).hex() for x in a.double().tolist()], time.monotonic() - t0])
        except Exception as exc:  # noqa: BLE001 - every outcome is the result
            out.append([type(exc).__name__, str(exc), time.monotonic() - t0])
    return out, None


SCENARIOS = {"whiten": _whiten, "gdpo": _gdpo, "mixed_api": _mixed_api, "die": _die, "fail": _fail,
             "adapter": _adapter, "steps": _steps, "subgroup": _subgroup, "calls": _calls}


# --- the rank process ------------------------------------------------------------------------


class _Counter:
    def __init__(self, dist):
        self.counts: dict[str, int] = {}
        for name in COLLECTIVES:
            fn = getattr(dist, name, None)
            if fn is not None:
                setattr(dist, name, self._wrap(name, fn))

    def _wrap(self, name, fn):
        def counted(*args, **kwargs):
            self.counts[name] = self.counts.get(name, 0) + 1
            return fn(*args, **kwargs)

        return counted


def _count_syncs(fn, seen: list):
    """Run ``fn`` under torch.cuda.set_sync_debug_mode("warn"); append to ``seen``
    the synchronizing CUDA operations it performs."""
    import warnings

    import torch

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    seen.extend(str(w.message) for w in caught if "called a synchronizing CUDA operation" in str(w.message))
    return out


def _plain(t):
    """A tensor as exact float64 hex strings (+0 and -0 differ)."""
    if t is None or isinstance(t, list):  # None, or a result already plain (steps)
        return t
    import torch

    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
            "hex": [float(x).hex() for x in t.detach().to("cpu", torch.float64).reshape(-1).tolist()]}


def _rank_main(rank, world, init_file, out_dir, scenarios, timeout_s, backend, device):
    import torch
    import torch.distributed as dist

    if device == "cuda":
        torch.cuda.set_device(0)
    join(rank, world, init_file, timeout_s, backend)
    counter = _Counter(dist)
    for i, (name, kind, kwargs) in enumerate(scenarios):
        counter.counts = {}
        t0 = time.monotonic()
        rec = {"rank": rank, "name": name}
        kwargs = dict(kwargs)
        count_syncs = kwargs.pop("count_syncs", False)
        try:
            if count_syncs:  # warm up once, then count the host syncs of the impl call alone
                SCENARIOS[kind](rank, world, dist.group.WORLD, device, **kwargs)
                counter.counts = {}
                t0 = time.monotonic()
                seen: list = []
                out, stats = SCENARIOS[kind](rank, world, dist.group.WORLD, device,
                                             call=lambda fn: _count_syncs(fn, seen), **kwargs)
                rec["syncs"] = seen
            else:
                out, stats = SCENARIOS[kind](rank, world, dist.group.WORLD, device, **kwargs)
            rec.update(status="ok", result=_plain(out), stats=_plain(stats))
        except BaseException as exc:  # noqa: BLE001 - every outcome is reported
            causes, cause = [], exc.__cause__ or exc.__context__
            while cause is not None and len(causes) < 8:  # the chain, whatever the traceback's length
                causes.append(f"{type(cause).__name__}: {_readable(cause)}")
                cause = cause.__cause__ or cause.__context__
            rec.update(status="error", cls=type(exc).__name__, mro=[c.__name__ for c in type(exc).__mro__],
                       msg=str(exc), tb=traceback.format_exc()[-2000:], causes=causes)
        rec.update(seconds=time.monotonic() - t0, collectives=dict(counter.counts))
        tmp = os.path.join(out_dir, f".r{rank}_{i}.tmp")
        with open(tmp, "wb") as f:
            pickle.dump(rec, f)
        os.replace(tmp, os.path.join(out_dir, f"r{rank}_{i}.pkl"))
    # No destroy_process_group(): with a dead peer its teardown can block; the records are
    # on disk, so leave at once.
    sys.stderr.flush()
    os._exit(0)


def _entry(rank, world, init_file, out_dir, scenarios, timeout_s, backend, device):
    sys.stderr = open(os.path.join(out_dir, f"stderr{rank}.log"), "w", buffering=1)
    _rank_main(rank, world, init_file, out_dir, scenarios, timeout_s, backend, device)


# --- joining and spawning, retried when the rendezvous itself fails ------------------------

#: A rank's exit code when init_process_group itself failed: nothing under test ran yet.
JOIN_FAILED = 75
#: Attempts at a group whose rendezvous fails (gloo's TCP mesh times out now and then on a
#: loaded 2-core machine: "Gloo connectFullMesh failed ... Connect timeout").
JOIN_TRIES = 3


def join(rank: int, world: int, init_file: str, timeout_s: float, backend: str = "gloo") -> None:
    """init_process_group through ``init_file``; if that fails, print why and leave with
    JOIN_FAILED so that ``spawn`` starts the whole group again on a fresh rendezvous."""
    import torch.distributed as dist

    try:
        dist.init_process_group(backend, init_method="file://" + init_file, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
    except Exception:  # noqa: BLE001 - the parent retries; the traceback goes to this rank's stderr
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(JOIN_FAILED)


@dataclass
class Spawned:
    out_dir: str  # the last attempt's: what its ranks wrote
    exitcodes: list
    hung: list  # ranks terminated at the deadline
    wall_s: float
    joins_failed: int  # attempts given up because a rank could not join


def spawn(target, world_size: int, args: tuple, workdir: str, deadline_s: float) -> Spawned:
    """Run ``target(rank, world_size, init_file, out_dir, *args)`` on ``world_size`` spawned
    processes until all exit or ``deadline_s`` passes (the rest are terminated: ``hung``).
    ``target`` joins through :func:`join`; when a rank leaves with JOIN_FAILED, the others are
    stopped and the group starts again in a fresh folder, up to JOIN_TRIES times."""
    ctx = mp.get_context("spawn")
    t0 = time.monotonic()
    for attempt in range(JOIN_TRIES):
        out_dir = os.path.join(workdir, f"attempt{attempt}")
        os.makedirs(out_dir)
        init_file = os.path.join(out_dir, "rendezvous")
        procs = [ctx.Process(target=target, daemon=True, args=(r, world_size, init_file, out_dir, *args))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        end = time.monotonic() + deadline_s
        while time.monotonic() < end and any(p.is_alive() for p in procs):
            if any(p.exitcode == JOIN_FAILED for p in procs):
                break
            time.sleep(0.05)
        join_failed = any(p.exitcode == JOIN_FAILED for p in procs)
        retry = join_failed and attempt + 1 < JOIN_TRIES
        hung = [] if join_failed else [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        if not retry:
            return Spawned(out_dir, [p.exitcode for p in procs], hung, time.monotonic() - t0, attempt)
    raise AssertionError("unreachable")


def run_group(world_size: int, scenarios: list, *, group_timeout_s: float = 20.0, deadline_s: float = 90.0,
              backend: str = "gloo", device: str = "cpu") -> Run:
    tmp = tempfile.mkdtemp(prefix="gdpo_dist_")
    try:
        done = spawn(_entry, world_size, (scenarios, group_timeout_s, backend, device), tmp, deadline_s)
        run = Run(world_size, exitcodes=done.exitcodes, hung=done.hung, wall_s=done.wall_s)
        for fname in sorted(os.listdir(done.out_dir)):
            if fname.endswith(".pkl"):
                with open(os.path.join(done.out_dir, fname), "rb") as f:
                    rec = pickle.load(f)
                run.records.setdefault(rec["name"], {})[rec["rank"]] = rec
        for r in range(world_size):
            log = os.path.join(done.out_dir, f"stderr{r}.log")
            if os.path.exists(log):
                with open(log) as f:
                    text = f.read().strip()
                if text:
                    run.stderr += f"--- rank {r} stderr ---\n{text}\n"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return run
