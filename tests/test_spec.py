"""The specification as data: conventions, error classes, error model, generated document."""

import dataclasses
import math
import os

import numpy as np
import pytest

from gdpo_tools import spec_document as document
from spec import CONVENTIONS, Convention, GDPOError, error_model, get_convention
from spec.errors import ERROR_CLASSES, ERROR_EXAMPLES, EXAMPLE_WORLD, NOT_RAISED, example_ranks
from tests import _dist


def test_document_is_generated_from_code():
    assert document.OUTPUT.read_text() == document.render(), (
        "spec/gdpo.md is stale: run `python -m gdpo_tools.spec_document`")


def test_every_placeholder_is_filled():
    assert "{{" not in document.render()


@pytest.mark.parametrize("name", sorted(CONVENTIONS))
def test_presets_are_distinct_and_valid(name):
    conv = CONVENTIONS[name]
    assert get_convention(name) is conv and conv.name == name
    others = [c for c in CONVENTIONS.values() if c is not conv]
    key = lambda c: {k: v for k, v in dataclasses.asdict(c).items() if k not in ("name", "title", "source", "notes")}
    assert all(key(conv) != key(o) for o in others), f"{name} duplicates another preset's mathematics"


def test_convention_validates_its_fields():
    spec = CONVENTIONS["spec"]
    with pytest.raises(ValueError, match="group_eps_placement='inside'"):
        dataclasses.replace(spec, group_eps_placement="inside")
    with pytest.raises(ValueError, match="whiten_eps"):
        dataclasses.replace(spec, whiten_eps=float("nan"))
    with pytest.raises(ValueError, match="unknown convention"):
        get_convention("grpo")


def test_error_classes_share_one_base():
    for cls in ERROR_CLASSES.values():
        assert issubclass(cls, GDPOError) and issubclass(cls, ValueError) and cls.__doc__


def test_error_model_demands_exact_zeros_and_grows_with_range():
    z = error_model.standardize_groups_stage([0.0, 0.0], 0.0, 0.0, 1e-4, [0.0, 0.0], 2, 1)
    assert np.all(z == 0)
    assert np.all(error_model.allowed_error([0.0], [0.0]) == 0)
    small = error_model.model_dev_perturbation(1.0, 4)
    big = error_model.model_dev_perturbation(1e6, 4)
    assert big / small == pytest.approx(1e6)
    a = error_model.allowed_error([10.0], [1.0], "float32")
    assert a[0] > 0.5 * np.spacing(np.float32(1.0))


def test_convention_rejects_conventions_of_other_type():
    with pytest.raises(ValueError):
        get_convention(None)
    assert isinstance(get_convention(CONVENTIONS["trl"]), Convention)


# ------------------------------------------------------------------ section 6: the error table's examples
#
# Every call spec/gdpo.md section 6 shows (spec/errors.py ERROR_EXAMPLES and NOT_RAISED)
# is run against impl.gdpo: a "raised when" whose example does not raise that class, or
# a "not" example that does, fails here.

_LOCAL = [(name, call) for name, calls in ERROR_EXAMPLES.items() for call in calls if example_ranks(call) == 1]
_LOCAL_NOT = [(name, call, outcome) for name, rows in NOT_RAISED.items() for call, outcome in rows
              if example_ranks(call) == 1]
_RANKED = [(name, call, None) for name, calls in ERROR_EXAMPLES.items() for call in calls
           if example_ranks(call) > 1]
_RANKED += [(name, call, outcome) for name, rows in NOT_RAISED.items() for call, outcome in rows
            if example_ranks(call) > 1]


def example_namespace(gdpo_advantages, whiten, group=None, rank: int = 0) -> dict:
    """The names an example may use (spec/errors.py ERROR_EXAMPLES): ``torch``, the
    implementation's ``gdpo_advantages`` and ``whiten``, ``nan``, ``inf``, and for a ranked
    example its ``group`` and ``rank``."""
    import torch

    return {"torch": torch, "gdpo_advantages": gdpo_advantages, "whiten": whiten, "nan": math.nan,
            "inf": math.inf, "group": group, "rank": rank}


def _namespace(group=None, rank=0):
    from impl.gdpo import gdpo_advantages, whiten

    return example_namespace(gdpo_advantages, whiten, group, rank)


def test_every_error_class_has_an_example():
    assert set(ERROR_EXAMPLES) == set(ERROR_CLASSES)
    assert set(NOT_RAISED) <= set(ERROR_CLASSES)
    for name, calls in ERROR_EXAMPLES.items():
        assert calls or name == "GDPOError", f"{name} has no example in spec/errors.py ERROR_EXAMPLES"
    for name, rows in NOT_RAISED.items():
        for call, outcome in rows:
            assert outcome == "computes" or outcome in ERROR_CLASSES, (name, call, outcome)


def test_the_document_shows_every_example():
    section = document.render().split("## 6.", 1)[1].split("## 7.", 1)[0]
    for calls in ERROR_EXAMPLES.values():
        for call in calls:
            assert f"`{call}`" in section, call
    for rows in NOT_RAISED.values():
        for call, outcome in rows:
            assert f"not `{call}`" in section and outcome in section, call


@pytest.mark.parametrize("name,call", _LOCAL, ids=[f"{n}-{i}" for i, (n, _) in enumerate(_LOCAL)])
def test_error_example_raises_its_class(name, call):
    with pytest.raises(ERROR_CLASSES[name]):
        eval(call, _namespace())


@pytest.mark.parametrize("name,call,outcome", _LOCAL_NOT, ids=[f"not-{n}-{i}" for i, (n, *_) in enumerate(_LOCAL_NOT)])
def test_not_raised_example_does_what_the_table_says(name, call, outcome):
    if outcome == "computes":
        out = eval(call, _namespace())
        assert out.shape[0] >= 1
        return
    with pytest.raises(ERROR_CLASSES[outcome]) as info:
        eval(call, _namespace())
    assert not isinstance(info.value, ERROR_CLASSES[name]), f"{call} raised {info.type.__name__}, a {name}"


def _ranked_rank(rank, world, init_file, out_dir, calls):
    """One gloo rank: each call evaluated with ``group`` this group; what it raised, to a file."""
    import json

    import torch.distributed as dist

    from impl.gdpo import gdpo_advantages, whiten

    _dist.join(rank, world, init_file, 60)
    ns = example_namespace(gdpo_advantages, whiten, dist.group.WORLD, rank)
    results = []
    for call in calls:
        try:
            eval(call, ns)
            results.append(["computes"])
        except Exception as e:  # noqa: BLE001 - recorded for the parent
            results.append([n for n, c in ERROR_CLASSES.items() if isinstance(e, c)] or [type(e).__name__])
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(results, f)
    os._exit(0)


@pytest.mark.skipif(not _RANKED, reason="no ranked example")
def test_ranked_error_examples_raise_on_every_rank(tmp_path):
    """The examples naming ``group`` on every rank of a gloo group of EXAMPLE_WORLD ranks."""
    import json

    done = _dist.spawn(_ranked_rank, EXAMPLE_WORLD, ([c for _, c, _ in _RANKED],), str(tmp_path), deadline_s=300)
    assert done.exitcodes == [0] * EXAMPLE_WORLD and not done.hung, done
    per_rank = [json.loads(open(os.path.join(done.out_dir, f"{r}.json")).read()) for r in range(EXAMPLE_WORLD)]
    for i, (name, call, outcome) in enumerate(_RANKED):
        for rank in range(EXAMPLE_WORLD):
            got = per_rank[rank][i]
            if outcome is None:
                assert name in got, f"rank {rank}: {call} gave {got}, not {name}"
            else:
                assert outcome in got and name not in got, f"rank {rank}: {call} gave {got}, not only {outcome}"
