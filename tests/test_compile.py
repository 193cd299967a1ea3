"""impl's entry points inside a ``torch.compile``d training step.

impl validates its input on the host (``Tensor.item()``, Python loops over labels), which
dynamo cannot trace. Traced, a compiled step that called ``gdpo_advantages`` broke into
seven graphs (four ``Tensor.item()`` breaks among them) and printed dynamo's warnings.
Every public entry point is now opaque to dynamo: the caller's step breaks around the call
(two graphs, before and after it), which runs eagerly and gives the bits an eager call gives. The backend below only
counts graphs (no inductor, no C++ compiler needed).
"""
from __future__ import annotations

import math

import pytest
import torch

from impl import adapters, gdpo
from impl.gdpo import NonFiniteError

R = torch.tensor([[1.0, 0.0], [0.0, 0.5], [1.0, 1.0], [0.0, 0.25],
                  [3.0, 1.0], [2.0, 0.0], [1.0, 1.0], [0.5, 2.0]])

CALLS = {  # name: (entry point, its arguments built from the step's tensor)
    "gdpo_advantages": (gdpo.gdpo_advantages, lambda x: ((x,), dict(group_size=4, segment_sizes=[4, 4]))),
    "normalize_rewards": (gdpo.normalize_rewards, lambda x: ((x,), dict(group_ids=[0, 1, 0, 1, 2, 2, 3, 3]))),
    "group_has_signal": (gdpo.group_has_signal, lambda x: ((x,), dict(group_size=2))),
    "whiten": (gdpo.whiten, lambda x: ((x[:, 0] + x[:, 1],), {})),
    "trl_advantages": (adapters.trl_advantages, lambda x: ((x, 4, [1.0, 0.5]), {})),
    "verl_advantages": (adapters.verl_advantages, lambda x: (
        ({"a": x[:, :1].expand(8, 3), "b": x[:, 1:].expand(8, 3)}, torch.ones(8, 3), list("aabbccdd")), {})),
    "labelled_advantages": (adapters.labelled_advantages,
                            lambda x: (({"a": x[:, 0], "b": x[:, 1]}, ["p", "q"] * 4), {})),
}


def _compiled_step(name: str, graphs: list):
    fn, build = CALLS[name]

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def step(r):
        x = r * 2.0  # work before and after the call: the graphs around it
        args, kwargs = build(x)
        a = fn(*args, **kwargs)
        return a.to(x.dtype) * 3.0 + 1.0

    return step, torch.compile(step, backend=backend)


@pytest.mark.parametrize("name", list(CALLS))
def test_a_compiled_step_breaks_once_around_the_call_and_keeps_the_bits(name):
    from torch._dynamo.utils import counters  # here, not at collection: importing dynamo costs 1.5 s

    torch._dynamo.reset()
    counters.clear()
    graphs: list = []
    step, compiled = _compiled_step(name, graphs)
    got = compiled(R)
    assert torch.equal(got, step(R)), name
    reasons = list(counters["graph_break"])
    # dynamo skips the entry point (and the call to torch.compiler.disable that makes it
    # opaque): the only breaks. Traced, impl broke on Tensor.item() and data-dependent branches.
    assert reasons and all("disable" in reason for reason in reasons), reasons
    assert any(name in reason for reason in reasons), reasons
    assert len(graphs) == 2, len(graphs)  # before and after the call, nothing traced inside it


def test_a_refusal_inside_a_compiled_step_is_impls_own():
    torch._dynamo.reset()
    step, compiled = _compiled_step("gdpo_advantages", [])
    bad = R.clone()
    bad[5, 1] = math.nan
    with pytest.raises(NonFiniteError, match=r"row 5.*column 1"):
        compiled(bad)


def test_entry_points_keep_their_names_signatures_and_docs():
    import inspect

    for fn in (gdpo.gdpo_advantages, gdpo.normalize_rewards, gdpo.group_has_signal, gdpo.whiten,
               adapters.trl_advantages, adapters.verl_advantages, adapters.labelled_advantages):
        assert fn.__doc__ and "eps" in inspect.signature(fn).parameters, fn.__name__


def test_fullgraph_says_it_cannot_hold_the_call():
    """docs/adopting.md: ``fullgraph=True`` cannot hold it; dynamo says so rather than tracing impl."""
    torch._dynamo.reset()
    fn, build = CALLS["gdpo_advantages"]

    def step(r):
        args, kwargs = build(r)
        return fn(*args, **kwargs)

    with pytest.raises(torch._dynamo.exc.Unsupported, match="disable"):
        torch.compile(step, backend=lambda gm, _: gm.forward, fullgraph=True)(R)
