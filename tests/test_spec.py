"""The specification as data: conventions, error classes, error model, generated document."""

import dataclasses

import numpy as np
import pytest

from oracle import document
from spec import CONVENTIONS, Convention, GDPOError, error_model, get_convention
from spec.errors import ERROR_CLASSES


def test_document_is_generated_from_code():
    assert document.OUTPUT.read_text() == document.render(), (
        "spec/gdpo.md is stale: run `python -m oracle.document`")


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
    z = error_model.group_stage([0.0, 0.0], 0.0, 0.0, 1e-4, [0.0, 0.0], 2, 1)
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
