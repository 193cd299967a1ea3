"""The specification as data: conventions, error classes, error model, generated document."""

import dataclasses
import math

import numpy as np
import pytest

from gdpo_tools import spec_document as document
from spec import CONVENTIONS, Convention, GDPOError, error_model, get_convention
from spec.errors import ERROR_CLASSES, ERROR_EXAMPLES, EXAMPLE_WORLD, NOT_RAISED, example_ranks


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


_RANKS_SCRIPT = '''
import json, sys
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp

from spec.errors import ERROR_CLASSES
from tests.test_spec import example_namespace


def rank_main(rank, world, init, calls, out):
    from impl.gdpo import gdpo_advantages, whiten

    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    ns = example_namespace(gdpo_advantages, whiten, dist.group.WORLD, rank)
    results = []
    for call in calls:
        try:
            eval(call, ns)
            results.append(["computes"])
        except Exception as e:
            results.append([n for n, c in ERROR_CLASSES.items() if isinstance(e, c)] or [type(e).__name__])
    with open(f"{out}.{rank}", "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    world, init, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    calls = json.loads(sys.stdin.read())
    mp.spawn(rank_main, (world, init, calls, out), nprocs=world)
'''


@pytest.mark.skipif(not _RANKED, reason="no ranked example")
def test_ranked_error_examples_raise_on_every_rank(tmp_path):
    """The examples naming ``group`` on every rank of a gloo group of EXAMPLE_WORLD ranks."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    script = tmp_path / "ranks.py"
    script.write_text(_RANKS_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(script), str(EXAMPLE_WORLD), str(tmp_path / "init"),
                           str(tmp_path / "out")], input=json.dumps([c for _, c, _ in _RANKED]),
                          capture_output=True, text=True, timeout=300, env=env, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    per_rank = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(EXAMPLE_WORLD)]
    for i, (name, call, outcome) in enumerate(_RANKED):
        for rank in range(EXAMPLE_WORLD):
            got = per_rank[rank][i]
            if outcome is None:
                assert name in got, f"rank {rank}: {call} gave {got}, not {name}"
            else:
                assert outcome in got and name not in got, f"rank {rank}: {call} gave {got}, not only {outcome}"
