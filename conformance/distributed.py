"""A pool of spawned ranks that runs many distributed examples per process group.

Spawning a group costs seconds, an example milliseconds: each worker spawns one pool of
``POOL_WORLD`` gloo ranks, lazily (rendezvous through a fresh file, never a fixed port), and
reuses it: world 4 is the default group, world 2 the subgroup of global ranks [2, 3] (so mixing
global and group ranks is caught), world 1 that of rank [1]. A rank not back ``GRACE`` s after
the first (or ``DEADLINE`` s after the start) is a hang: the pool is killed and respawned.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import queue
import shutil
import tempfile
import time
import traceback
from datetime import timedelta

from conformance.cases import loads
from conformance.subject import DEADLINE, Outcome, Subject

#: Global ranks of the pool and the subgroups it serves, by world size.
POOL_WORLD = 4
SUBGROUPS = {4: None, 2: (2, 3), 1: (1,)}
#: Seconds: spawn and rendezvous; one job; how long the others may lag the first rank back.
SPAWN_DEADLINE = float(os.environ.get("GDPO_CONFORMANCE_SPAWN_DEADLINE", "180"))
GRACE = float(os.environ.get("GDPO_CONFORMANCE_GRACE", "3"))
#: Timeout of the process groups themselves (a stuck collective raises after it).
GROUP_TIMEOUT = 30
#: Attempts at starting a pool whose ranks fail to join.
JOIN_TRIES = 3


@dataclasses.dataclass
class JobResult:
    outcomes: dict  # group rank -> Outcome
    hung: list  # group ranks that did not return in time


def _rank_main(rank: int, world: int, init_file: str, device: str, backend: str, jobs, results):
    """One rank: join the group, build the subgroups, then serve jobs until None."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        if device == "cuda":
            torch.cuda.set_device(0)
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=GROUP_TIMEOUT))
        groups = {world: dist.group.WORLD}
        if world == POOL_WORLD:
            for size, ranks in SUBGROUPS.items():
                if ranks is not None:
                    groups[size] = dist.new_group(list(ranks), timeout=timedelta(seconds=GROUP_TIMEOUT),
                                                  backend=backend)
        dist.barrier()
        results.put(("ready", rank, None))
    except Exception:  # noqa: BLE001
        results.put(("spawn_failed", rank, traceback.format_exc()))
        return
    while True:
        job = jobs.get()
        if job is None:
            break
        job_id, size, payload = job
        try:
            key = (payload["target"], payload["shape"], payload["convention"], device)
            if key not in _SUBJECTS:
                _SUBJECTS[key] = Subject(*key)
            subject = _SUBJECTS[key]
            outcome = subject.outcome(subject.call, loads(payload["case"]), process_group=groups[size])
        except BaseException as e:  # noqa: BLE001 - reported, never lost
            outcome = Outcome.from_exception(e)
            outcome.message = traceback.format_exc()[-2000:]
        results.put(("done", rank, (job_id, outcome)))
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass


def payload(subject, case) -> dict:
    """What one rank needs to make its call: the subject by name, its shard as hex JSON."""
    return {"target": subject.target, "shape": subject.shape, "convention": subject.convention,
            "case": case.dumps()}


#: a spawned rank's subjects, by (target, shape, convention, device)
_SUBJECTS: dict = {}


class Pool:
    def __init__(self, world: int = POOL_WORLD, device: str = "cpu", backend: str = "gloo"):
        self.world, self.device, self.backend = world, device, backend
        self.procs, self.jobs, self.results, self.tmp, self.next_id = [], [], None, None, 0

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Spawn the ranks and wait until every one has joined. A rank that fails to join (gloo's
        TCP mesh times out now and then on a loaded machine; nothing of the subject has run)
        starts the pool again, up to JOIN_TRIES times."""
        for attempt in range(JOIN_TRIES):
            failed = self._spawn()
            if failed is None:
                return
            self.kill()
            if attempt + 1 == JOIN_TRIES:
                raise RuntimeError(failed)

    def _spawn(self) -> str | None:
        """One attempt at starting the pool: None, or why a rank could not join."""
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.tmp = tempfile.mkdtemp(prefix="gdpo-conformance-")
        init_file = os.path.join(self.tmp, "rendezvous")  # fresh: a stale file breaks rendezvous
        self.results = ctx.Queue()
        self.jobs = [ctx.Queue() for _ in range(self.world)]
        self.procs = [ctx.Process(target=_rank_main, daemon=True,
                                  args=(r, self.world, init_file, self.device, self.backend, self.jobs[r],
                                        self.results))
                      for r in range(self.world)]
        for p in self.procs:
            p.start()
        ready = set()
        end = time.monotonic() + SPAWN_DEADLINE
        while len(ready) < self.world:
            left = end - time.monotonic()
            try:
                kind, rank, info = self.results.get(timeout=max(left, 0.01))
            except queue.Empty:
                self.kill()
                raise RuntimeError(f"the {self.world}-rank gloo pool did not start within {SPAWN_DEADLINE} s")
            if kind == "spawn_failed":
                return f"rank {rank} of the pool failed to start:\n{info}"
            ready.add(rank)
        return None

    @property
    def alive(self) -> bool:
        return bool(self.procs) and all(p.is_alive() for p in self.procs)

    def kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self.procs = []
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def close(self) -> None:
        if self.alive:
            for q in self.jobs:
                q.put(None)
            for p in self.procs:
                p.join(timeout=5)
        self.kill()

    # --------------------------------------------------------------------- jobs
    def run(self, size: int, payloads: list) -> JobResult:
        """Run one job on the subgroup of ``size`` ranks; payloads[group_rank]."""
        if not self.alive:
            self.kill()
            self.start()
        members = (SUBGROUPS[size] or tuple(range(POOL_WORLD))) if self.world == POOL_WORLD else tuple(range(size))
        self.next_id += 1
        job_id = self.next_id
        t0 = time.monotonic()
        for gr, global_rank in enumerate(members):
            self.jobs[global_rank].put((job_id, size, payloads[gr]))
        outcomes = {}
        first_back = None
        while len(outcomes) < len(members):
            limit = t0 + DEADLINE if first_back is None else min(t0 + DEADLINE, first_back + GRACE)
            try:
                kind, rank, info = self.results.get(timeout=max(limit - time.monotonic(), 0.01))
            except queue.Empty:
                break
            if kind != "done" or info[0] != job_id:
                continue  # a late answer of an abandoned job
            outcomes[members.index(rank)] = info[1]
            if first_back is None:
                first_back = time.monotonic()
        hung = [gr for gr in range(len(members)) if gr not in outcomes]
        if hung:
            self.kill()  # ranks stuck in a collective cannot be reused
        return JobResult(outcomes, hung)


_POOLS: dict = {}


def pool(device: str = "cpu", backend: str = "gloo", world: int = POOL_WORLD) -> Pool:
    key = (device, backend, world)
    if key not in _POOLS:
        _POOLS[key] = Pool(world, device, backend)
    return _POOLS[key]


@atexit.register
def close_all() -> None:
    for p in list(_POOLS.values()):
        try:
            p.close()
        except Exception:  # noqa: BLE001
            pass
    _POOLS.clear()
