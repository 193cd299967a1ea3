"""The spine holds (issue 27 part 5, issue 44, docs/architecture.md): a local call runs its
stages once each, in order, whatever the route (contiguous or labelled groups, certified or
not), and the call's trace through impl's modules stays short.

The stages are wrapped where the spine finds them (``impl._eq47.eq47``, ``impl._whiten.eq6_stats``
and ``eq6_apply``, and the cast and certify stages ``impl._pipeline.run`` calls), so a route that ran a stage
twice (a recompute for the certificate), skipped one or ran them out of order fails here."""

from __future__ import annotations

import collections
import os
import sys

import pytest
import torch

from impl import _certify, _eq47, _pipeline, _whiten, gdpo

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "impl") + os.sep
#: leaf modules the stages call and that call no stage back
LIBRARY = {"_segments", "_problems"}


#: the design's section 1.1 calls: contiguous groups of 4, K = 3; ragged labelled groups
ARGS = {"local": (torch.arange(48.).remainder(7).view(16, 3), {"group_size": 4}),
        "labelled": (torch.arange(30.).remainder(5).view(10, 3), {"group_ids": [7, 7, 3, 3, 3, 9, 9, 9, 9, 7]})}
CALLS = {name: (lambda r=r, kw=kw: gdpo.gdpo_advantages(r, **kw)) for name, (r, kw) in ARGS.items()}


def _recorded(monkeypatch) -> list[str]:
    ran = []

    def wrap(name, fn):
        def stage(*args, **kwargs):
            ran.append(name)
            return fn(*args, **kwargs)
        return stage

    monkeypatch.setattr(_eq47, "eq47", wrap("eq47", _eq47.eq47))
    monkeypatch.setattr(_whiten, "eq6_stats", wrap("eq6_stats", _whiten.eq6_stats))
    monkeypatch.setattr(_whiten, "eq6_apply", wrap("eq6_apply", _whiten.eq6_apply))
    monkeypatch.setattr(_certify, "stage", wrap("certify", _certify.stage))
    monkeypatch.setattr(_pipeline, "output", wrap("cast", _pipeline.output))
    return ran


@pytest.mark.parametrize("certified", [True, False])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_each_stage_runs_once_in_order(monkeypatch, call, certified):
    monkeypatch.delenv("GDPO_CUDA_GRAPHS", raising=False)
    want = CALLS[call]()
    ran = _recorded(monkeypatch)
    monkeypatch.setenv("GDPO_CERTIFIED", "narrow" if certified else "off")
    got = CALLS[call]()
    # the cast rounds once; the certificate then decides the rows whose rounding that leaves open
    assert ran == ["eq47", "eq6_stats", "eq6_apply", "cast"] + (["certify"] if certified else []), ran
    assert torch.equal(got, want)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_the_certificate_reads_c_as_eq7_left_it(monkeypatch, call):
    """Where the certificate decides the rounding it reads c after Eq. 6: the plan must keep Eq. 6
    off c's buffer there (``plan.own`` false). A wrong ``own`` changes no output the bit corpus
    sees (the certificate reads c only for the samples tier 0 leaves), so it is checked here: c
    as the certificate gets it is normalize_rewards' c, bit for bit."""
    monkeypatch.delenv("GDPO_CUDA_GRAPHS", raising=False)
    seen = []
    stage = _certify.stage
    monkeypatch.setattr(_certify, "stage", lambda plan, dev, y: seen.append(dev.c.clone()) or stage(plan, dev, y))
    r, kw = ARGS[call]
    monkeypatch.setenv("GDPO_CERTIFIED", "narrow")
    CALLS[call]()
    want = gdpo.normalize_rewards(r, **kw)
    assert len(seen) == 1 and torch.equal(seen[0].view(torch.int64), want.view(torch.int64))


def _stays(fn) -> list[str]:
    """The impl modules a call passes through, calls only, the library modules transparent
    (docs/design/spine.md section 1.1's count): one entry per stay."""
    stack, seq = [], []

    def mod(frame):
        f = frame.f_code.co_filename
        m = f[len(ROOT):-3].split(os.sep)[0] if f.startswith(ROOT) and f.endswith(".py") else None
        return None if m in LIBRARY else m  # (a package, impl._certify, is one stage)

    def local(frame, event, arg):
        if event == "return":
            stack.pop()
        return local

    def tracer(frame, event, arg):
        stack.append(mod(frame))
        if stack[-1]:
            seq.append(stack[-1])
        return local

    fn()  # warm-up: constant caches, lazy imports
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return [m for i, m in enumerate(seq) if i == 0 or seq[i - 1] != m]


#: stays of the two calls (calls only, library transparent), ceilings: a route that comes back
#: into the spine (a callback, a recompute for the certificate, a decision asked during the
#: arithmetic) adds stays. The spine landed at 39 and 45; its stages split over _plan, _pipeline,
#: _graphs, _cast, _facts, _groups, _eq4 and _eq7 reached 18 and 22 (issue 27); one spine module
#: and one module for Eq. 4/7 and the groups' layout (issue 44): 7 and 11. Labelled groups add
#: the plan's phase one and the row's read before the layout.
MOST = {"local": 7, "labelled": 11}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_the_trace_stays_short(monkeypatch, call):
    monkeypatch.delenv("GDPO_CUDA_GRAPHS", raising=False)
    monkeypatch.setenv("GDPO_CERTIFIED", "narrow")
    stays = _stays(CALLS[call])
    assert len(stays) <= MOST[call], (len(stays), stays)
    # the entry, the inputs stage, then the spine (the plan; labelled groups: phase one, its row's
    # read, the layout), which runs the stages in order: Eq. 4/7, Eq. 6, then the cast (the
    # spine's) and the certificate; nothing calls back into the spine during the arithmetic
    assert stays[:3] == ["gdpo", "_inputs", "_pipeline"], stays
    assert stays[-4:] == ["_eq47", "_whiten", "_pipeline", "_certify"], stays
    assert collections.Counter(stays)["_pipeline"] <= (2 if call == "local" else 4), stays
